#include "fused_ops.h"

#include <torch/torch.h>

namespace dplan::executor {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// fp32 for 16-bit types, the type itself otherwise.
at::ScalarType compute_type(at::ScalarType t) {
  return (t == at::kHalf || t == at::kBFloat16) ? at::kFloat : t;
}

struct RmsNorm : torch::autograd::Function<RmsNorm> {
  // Function::apply runs this with autograd off: nothing below is recorded.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(-1),
                "rms_norm: weight must be [x.size(-1)]");
    const at::ScalarType ct = compute_type(x.scalar_type());
    at::Tensor xf = x.to(ct);
    at::Tensor rstd = xf.pow(2).mean(-1, /*keepdim=*/true).add_(eps).rsqrt_();  // [..., 1]
    at::Tensor y = (xf * rstd).mul_(weight.to(ct)).to(x.scalar_type());
    ctx->save_for_backward({x, weight, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    at::NoGradGuard no_grad;
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &rstd = saved[2];
    const at::ScalarType ct = rstd.scalar_type();
    at::Tensor dy = grad[0].to(ct);
    at::Tensor xhat = x.to(ct) * rstd;  // recomputed, not stored
    at::Tensor dx, dweight;
    if (ctx->needs_input_grad(1)) {
      dweight = (dy * xhat).reshape({-1, x.size(-1)}).sum(0).to(weight.scalar_type());
    }
    if (ctx->needs_input_grad(0)) {
      at::Tensor g = dy * weight.to(ct);  // not in place: dy may be the caller's gradient
      at::Tensor proj = (g * xhat).mean(-1, /*keepdim=*/true);
      dx = g.sub_(xhat.mul_(proj)).mul_(rstd).to(x.scalar_type());
    }
    return {dx, dweight, at::Tensor()};
  }
};

struct SwiGlu : torch::autograd::Function<SwiGlu> {
  // Function::apply runs this with autograd off: nothing below is recorded.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up, double limit,
                            double alpha) {
    TORCH_CHECK(gate.sizes() == up.sizes(), "swiglu: gate and up differ in shape");
    TORCH_CHECK(gate.scalar_type() == up.scalar_type(), "swiglu: gate and up differ in dtype");
    const at::ScalarType ct = compute_type(gate.scalar_type());
    at::Tensor out;
    if (limit > 0) {
      at::Tensor g = gate.to(ct).clamp_max(limit);
      out = at::sigmoid(g * alpha).mul_(g).mul_(up.to(ct).clamp(-limit, limit).add_(1)).to(gate.scalar_type());
    } else {
      out = at::silu(gate.to(ct)).mul_(up.to(ct)).to(gate.scalar_type());
    }
    ctx->saved_data["limit"] = limit;
    ctx->saved_data["alpha"] = alpha;
    ctx->save_for_backward({gate, up});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    at::NoGradGuard no_grad;
    const variable_list saved = ctx->get_saved_variables();
    const at::ScalarType ct = compute_type(saved[0].scalar_type());
    const double limit = ctx->saved_data["limit"].toDouble(), alpha = ctx->saved_data["alpha"].toDouble();
    at::Tensor g = saved[0].to(ct), u = saved[1].to(ct), dy = grad[0].to(ct);
    // Clamped: g = min(gate, limit) and u = clamp(up) + 1 (gradients through where the clamps pass
    // the input, bounds included, as ATen's clamp), and silu at alpha: g * sigmoid(alpha g).
    at::Tensor gate_passes, up_passes;
    if (limit > 0) {
      gate_passes = g <= limit;
      up_passes = (u >= -limit).logical_and_(u <= limit);
      g = g.clamp_max(limit);
      u = u.clamp(-limit, limit).add_(1);
    }
    at::Tensor s = at::sigmoid(g * alpha);  // recomputed, not stored
    at::Tensor dgate, dup;
    if (ctx->needs_input_grad(1)) {
      at::Tensor d = dy * g * s;  // dy * silu_alpha(g)
      if (up_passes.defined()) d.mul_(up_passes);
      dup = d.to(saved[1].scalar_type());
    }
    if (ctx->needs_input_grad(0)) {
      // d (g sigmoid(alpha g)) / dg = s * (1 + alpha g (1 - s))
      at::Tensor dsilu = (1 - s).mul_(g).mul_(alpha).add_(1).mul_(s);
      at::Tensor d = dsilu.mul_(dy).mul_(u);
      if (gate_passes.defined()) d.mul_(gate_passes);
      dgate = d.to(saved[0].scalar_type());
    }
    return {dgate, dup, at::Tensor(), at::Tensor()};
  }
};

template <class F>
std::vector<at::Tensor> saved_of(const at::Tensor& out) {
  auto* node = dynamic_cast<torch::autograd::CppNode<F>*>(out.grad_fn().get());
  if (node == nullptr) return {};
  return node->ctx_.get_saved_variables();
}
}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return RmsNorm::apply(x, weight, eps);
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up, double limit, double alpha) {
  return SwiGlu::apply(gate, up, limit, alpha);
}

std::vector<at::Tensor> rms_norm_saved(const at::Tensor& out) { return saved_of<RmsNorm>(out); }
std::vector<at::Tensor> swiglu_saved(const at::Tensor& out) { return saved_of<SwiGlu>(out); }

}  // namespace dplan::executor
