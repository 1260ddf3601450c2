// rms_norm and swiglu (executor/src/fused_ops.h) against the eager ATen formulas
// (x * rsqrt(mean(x^2, -1) + eps) * w; silu(g) * u) differentiated by autograd in fp64 from the
// same inputs:
//  - output and every gradient for a random upstream gradient agree within 1e-5
//    (|x - ref| <= 1e-5 + 1e-5 |ref|) for fp32 [2, 16, 64] inputs;
//  - what the graph keeps for backward is exactly x, weight and an fp32 rstd per row (rms_norm),
//    and exactly gate and up (swiglu): no other tensor of the output's size;
//  - bf16 inputs give bf16 results within 2e-2 of the eager fp32 ones from the same values, with
//    fp32 statistics.
#include <cstdint>
#include <vector>

// LibTorch first: its glog defines CHECK, which must give way to Catch's.
#include <torch/torch.h>
#undef CHECK
#include <catch2/catch.hpp>

#include "fused_ops.h"

namespace {
using dplan::executor::rms_norm;
using dplan::executor::rms_norm_saved;
using dplan::executor::swiglu;
using dplan::executor::swiglu_saved;

constexpr double kTolerance = 1e-5;
constexpr double kEps = 1e-5;
constexpr int64_t kB = 2, kS = 16, kH = 64;

// Largest |x - ref| / (tol + tol |ref|): at most 1 when within tolerance.
double worst(const at::Tensor& x, const at::Tensor& ref, double tol = kTolerance) {
  at::Tensor r = ref.to(at::kDouble);
  return ((x.to(at::kDouble) - r).abs() / (tol + tol * r.abs())).max().item<double>();
}
double max_abs_diff(const at::Tensor& x, const at::Tensor& ref) {
  return (x.to(at::kDouble) - ref.to(at::kDouble)).abs().max().item<double>();
}

#define CHECK_CLOSE_TOL(x, ref, tol)                    \
  do {                                                  \
    const double max_abs = max_abs_diff(x, ref);        \
    const double worst_ratio = worst(x, ref, tol);      \
    INFO(#x);                                           \
    CAPTURE(max_abs, worst_ratio);                      \
    CHECK(worst_ratio <= 1.0);                          \
  } while (0)
#define CHECK_CLOSE(x, ref) CHECK_CLOSE_TOL(x, ref, kTolerance)

at::Tensor eager_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * w;
}
at::Tensor eager_swiglu(const at::Tensor& g, const at::Tensor& u) { return at::silu(g) * u; }

int64_t saved_bytes(const std::vector<at::Tensor>& saved) {
  int64_t bytes = 0;
  for (const auto& t : saved) bytes += t.numel() * int64_t(t.element_size());
  return bytes;
}

TEST_CASE("rms_norm matches the eager formula, forward and gradients", "[fused_ops]") {
  torch::manual_seed(1234);
  at::Tensor x0 = torch::randn({kB, kS, kH});
  at::Tensor w0 = 1 + 0.5 * torch::randn({kH});
  at::Tensor dy = torch::randn({kB, kS, kH});

  at::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  at::Tensor y = rms_norm(x, w, kEps);
  REQUIRE(y.sizes() == x.sizes());
  REQUIRE(y.scalar_type() == at::kFloat);
  const at::Tensor dy_copy = dy.clone();
  y.backward(dy);

  at::Tensor rx = x0.to(at::kDouble).requires_grad_(), rw = w0.to(at::kDouble).requires_grad_();
  at::Tensor ry = eager_rms_norm(rx, rw, kEps);
  ry.backward(dy.to(at::kDouble));

  REQUIRE(w.grad().sizes() == w.sizes());
  CHECK_CLOSE(y, ry);
  CHECK_CLOSE(x.grad(), rx.grad());
  CHECK_CLOSE(w.grad(), rw.grad());
  // The caller's upstream gradient is left alone.
  CHECK(dy.equal(dy_copy));
}

TEST_CASE("rms_norm gives gradients only to inputs that need them", "[fused_ops]") {
  torch::manual_seed(3);
  at::Tensor x0 = torch::randn({kB, kS, kH});
  at::Tensor w0 = torch::randn({kH});
  SECTION("weight frozen") {
    at::Tensor x = x0.clone().requires_grad_();
    rms_norm(x, w0, kEps).sum().backward();
    at::Tensor rx = x0.to(at::kDouble).requires_grad_();
    eager_rms_norm(rx, w0.to(at::kDouble), kEps).sum().backward();
    CHECK_CLOSE(x.grad(), rx.grad());
  }
  SECTION("input frozen") {
    at::Tensor w = w0.clone().requires_grad_();
    rms_norm(x0, w, kEps).sum().backward();
    at::Tensor rw = w0.to(at::kDouble).requires_grad_();
    eager_rms_norm(x0.to(at::kDouble), rw, kEps).sum().backward();
    CHECK_CLOSE(w.grad(), rw.grad());
  }
}

TEST_CASE("swiglu matches the eager formula, forward and gradients", "[fused_ops]") {
  torch::manual_seed(4321);
  at::Tensor g0 = 3 * torch::randn({kB, kS, kH});  // reaches silu's curved and flat regions
  at::Tensor u0 = torch::randn({kB, kS, kH});
  at::Tensor dy = torch::randn({kB, kS, kH});

  at::Tensor g = g0.clone().requires_grad_(), u = u0.clone().requires_grad_();
  at::Tensor y = swiglu(g, u);
  REQUIRE(y.sizes() == g.sizes());
  REQUIRE(y.scalar_type() == at::kFloat);
  y.backward(dy);

  at::Tensor rg = g0.to(at::kDouble).requires_grad_(), ru = u0.to(at::kDouble).requires_grad_();
  at::Tensor ry = eager_swiglu(rg, ru);
  ry.backward(dy.to(at::kDouble));

  CHECK_CLOSE(y, ry);
  CHECK_CLOSE(g.grad(), rg.grad());
  CHECK_CLOSE(u.grad(), ru.grad());
}

TEST_CASE("clamped swiglu (gpt-oss) matches transformers' eager formula, forward and gradients", "[fused_ops]") {
  torch::manual_seed(4322);
  const double limit = 2.0, alpha = 1.702;
  // Wide enough that both clamps cut: gate above the limit, up outside [-limit, limit].
  at::Tensor g0 = 3 * torch::randn({kB, kS, kH}), u0 = 3 * torch::randn({kB, kS, kH}), dy = torch::randn({kB, kS, kH});
  REQUIRE((g0 > limit).any().item<bool>());
  REQUIRE((u0.abs() > limit).any().item<bool>());
  at::Tensor g = g0.clone().requires_grad_(), u = u0.clone().requires_grad_();
  at::Tensor y = swiglu(g, u, limit, alpha);
  CHECK(swiglu_saved(y).size() == 2);  // gate and up only, as the plain one
  y.backward(dy);
  // GptOssExperts._apply_gate, differentiated by autograd in fp64.
  at::Tensor rg = g0.to(at::kDouble).requires_grad_(), ru = u0.to(at::kDouble).requires_grad_();
  at::Tensor cg = rg.clamp_max(limit);
  at::Tensor ry = (ru.clamp(-limit, limit) + 1) * (cg * at::sigmoid(cg * alpha));
  ry.backward(dy.to(at::kDouble));
  CHECK_CLOSE(y, ry);
  CHECK_CLOSE(g.grad(), rg.grad());
  CHECK_CLOSE(u.grad(), ru.grad());
}

TEST_CASE("swiglu takes gate and up as halves of a fused projection", "[fused_ops]") {
  torch::manual_seed(9);
  at::Tensor h0 = torch::randn({kB, kS, 2 * kH});
  at::Tensor dy = torch::randn({kB, kS, kH});

  at::Tensor h = h0.clone().requires_grad_();
  auto parts = h.chunk(2, -1);
  REQUIRE_FALSE(parts[0].is_contiguous());
  at::Tensor y = swiglu(parts[0], parts[1]);
  // The halves are kept as views of the projection's output: no copy, nothing added.
  const std::vector<at::Tensor> saved = swiglu_saved(y);
  REQUIRE(saved.size() == 2);
  CHECK(saved[0].storage().is_alias_of(h.storage()));
  CHECK(saved[1].storage().is_alias_of(h.storage()));
  y.backward(dy);

  at::Tensor rh = h0.to(at::kDouble).requires_grad_();
  auto rparts = rh.chunk(2, -1);
  at::Tensor ry = eager_swiglu(rparts[0], rparts[1]);
  ry.backward(dy.to(at::kDouble));
  CHECK_CLOSE(y, ry);
  CHECK_CLOSE(h.grad(), rh.grad());
}

TEST_CASE("rms_norm keeps only x, weight and an fp32 rstd per row", "[fused_ops]") {
  torch::manual_seed(7);
  at::Tensor x = torch::randn({kB, kS, kH}).requires_grad_();
  at::Tensor w = torch::randn({kH}).requires_grad_();
  at::Tensor y = rms_norm(x, w, kEps);
  REQUIRE(y.grad_fn());

  const std::vector<at::Tensor> saved = rms_norm_saved(y);
  REQUIRE(saved.size() == 3);
  // The inputs themselves, not copies.
  CHECK(saved[0].data_ptr() == x.data_ptr());
  CHECK(saved[1].data_ptr() == w.data_ptr());
  CHECK(saved[2].scalar_type() == at::kFloat);
  CHECK(saved[2].numel() == kB * kS);
  // No normalised x (or any other tensor of the output's size) besides x itself.
  int64_t full_size = 0;
  for (const auto& t : saved) full_size += t.numel() == y.numel();
  CHECK(full_size == 1);
  CHECK(saved_bytes(saved) == 4 * (x.numel() + w.numel() + kB * kS));

  // backward reads exactly what was saved.
  at::Tensor rstd = at::rsqrt(x.detach().pow(2).mean(-1, true) + kEps);
  CHECK_CLOSE(saved[2].reshape(rstd.sizes()), rstd);

  CHECK(rms_norm_saved(y * 2).empty());
  CHECK(rms_norm_saved(x).empty());
  CHECK(rms_norm_saved(swiglu(x, x)).empty());
}

TEST_CASE("swiglu keeps only gate and up", "[fused_ops]") {
  torch::manual_seed(8);
  at::Tensor g = torch::randn({kB, kS, kH}).requires_grad_();
  at::Tensor u = torch::randn({kB, kS, kH}).requires_grad_();
  at::Tensor y = swiglu(g, u);
  REQUIRE(y.grad_fn());

  const std::vector<at::Tensor> saved = swiglu_saved(y);
  REQUIRE(saved.size() == 2);
  CHECK(saved[0].data_ptr() == g.data_ptr());
  CHECK(saved[1].data_ptr() == u.data_ptr());
  // No silu(gate), sigmoid(gate) or output kept.
  CHECK(saved_bytes(saved) == 4 * (g.numel() + u.numel()));

  CHECK(swiglu_saved(y * 2).empty());
  CHECK(swiglu_saved(g).empty());
  CHECK(swiglu_saved(rms_norm(g, torch::ones({kH}), kEps)).empty());
}

TEST_CASE("rms_norm and swiglu in bf16 keep fp32 statistics and return bf16", "[fused_ops]") {
  torch::manual_seed(5);
  const double bf16_tolerance = 2e-2;
  SECTION("rms_norm") {
    at::Tensor x = torch::randn({kB, kS, kH}).to(at::kBFloat16).requires_grad_();
    at::Tensor w = (1 + 0.5 * torch::randn({kH})).to(at::kBFloat16).requires_grad_();
    at::Tensor dy = torch::randn({kB, kS, kH}).to(at::kBFloat16);
    at::Tensor y = rms_norm(x, w, kEps);
    CHECK(y.scalar_type() == at::kBFloat16);
    const std::vector<at::Tensor> saved = rms_norm_saved(y);
    REQUIRE(saved.size() == 3);
    CHECK(saved[2].scalar_type() == at::kFloat);
    CHECK(saved_bytes(saved) == 2 * (x.numel() + w.numel()) + 4 * kB * kS);
    y.backward(dy);
    CHECK(x.grad().scalar_type() == at::kBFloat16);
    CHECK(w.grad().scalar_type() == at::kBFloat16);

    // fp32 from the same bf16-rounded values; what remains is bf16 rounding of results.
    at::Tensor fx = x.detach().to(at::kFloat).requires_grad_(), fw = w.detach().to(at::kFloat).requires_grad_();
    at::Tensor fy = eager_rms_norm(fx, fw, kEps);
    fy.backward(dy.to(at::kFloat));
    CHECK_CLOSE_TOL(y, fy, bf16_tolerance);
    CHECK_CLOSE_TOL(x.grad(), fx.grad(), bf16_tolerance);
    CHECK_CLOSE_TOL(w.grad(), fw.grad(), bf16_tolerance);
  }
  SECTION("swiglu") {
    at::Tensor g = (3 * torch::randn({kB, kS, kH})).to(at::kBFloat16).requires_grad_();
    at::Tensor u = torch::randn({kB, kS, kH}).to(at::kBFloat16).requires_grad_();
    at::Tensor dy = torch::randn({kB, kS, kH}).to(at::kBFloat16);
    at::Tensor y = swiglu(g, u);
    CHECK(y.scalar_type() == at::kBFloat16);
    CHECK(saved_bytes(swiglu_saved(y)) == 2 * (g.numel() + u.numel()));
    y.backward(dy);
    CHECK(g.grad().scalar_type() == at::kBFloat16);
    CHECK(u.grad().scalar_type() == at::kBFloat16);

    at::Tensor fg = g.detach().to(at::kFloat).requires_grad_(), fu = u.detach().to(at::kFloat).requires_grad_();
    at::Tensor fy = eager_swiglu(fg, fu);
    fy.backward(dy.to(at::kFloat));
    CHECK_CLOSE_TOL(y, fy, bf16_tolerance);
    CHECK_CLOSE_TOL(g.grad(), fg.grad(), bf16_tolerance);
    CHECK_CLOSE_TOL(u.grad(), fu.grad(), bf16_tolerance);
  }
}

TEST_CASE("rms_norm and swiglu reject mismatched shapes", "[fused_ops]") {
  at::Tensor x = torch::randn({2, 3, 8});
  CHECK_THROWS(rms_norm(x, torch::ones({7}), kEps));
  CHECK_THROWS(rms_norm(x, torch::ones({2, 8}), kEps));
  CHECK_THROWS(swiglu(x, torch::randn({2, 3, 4})));
  CHECK_THROWS(swiglu(x, x.to(at::kBFloat16)));
}

}  // namespace
