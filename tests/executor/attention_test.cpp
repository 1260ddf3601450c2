// flash_attention (executor/src/attention.h) against the naive softmax(q k^T / sqrt(d) + causal
// mask) v differentiated by autograd, computed in fp64 from the same inputs:
//  - output and the gradients of q, k, v for a random upstream gradient agree within 1e-5
//    (|x - ref| <= 1e-5 + 1e-5 |ref|) for multi-head, grouped-query, a sequence that is not a
//    multiple of the block, a block that covers the whole sequence, a value head width dv other
//    than q's and k's d (DeepSeek's multi-head latent attention) and an explicit softmax scale; where this machine's fp32
//    GEMMs round more coarsely than that (a BLAS or oneDNN build that computes fp32 products
//    through bf16 pieces on some CPUs), within 4x the error of the naive attention itself run in
//    fp32 on the same inputs, so the bound follows the machine's arithmetic, not the algorithm;
//  - what the graph keeps for backward is exactly q, k, v (K/V at kv-head width), the returned
//    output and an fp32 log-sum-exp: no s x s tensor;
//  - q, k, v as strided views into a fused QKV projection (as gpt.cpp makes them) send the right
//    gradients into it, and the [b, s, heads * d] context feeds at::linear.
#include <functional>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

// LibTorch first: its glog defines CHECK, which must give way to Catch's.
#include <torch/torch.h>
#undef CHECK
#include <catch2/catch.hpp>
#include <torch/version.h>

#include "attention.h"

namespace {
using dplan::executor::flash_attention;
using dplan::executor::flash_attention_saved;

constexpr double kTolerance = 1e-5;

// Naive causal attention, GQA by repeating each kv head over its heads / kv_heads query heads;
// window > 0: query i sees keys i - window + 1 .. i only (transformers' sliding_window_overlay).
// sinks [heads], defined: one more logit per head in each softmax, dropped after it (gpt-oss's
// eager_attention_forward). v's head width dv may differ from q's and k's d (the context is
// [b, s, heads * dv]); scale 0: the scores are q k^T / sqrt(d), else q k^T * scale.
at::Tensor naive_attention(const at::Tensor& q, const at::Tensor& k_in, const at::Tensor& v_in, int64_t window = 0,
                           const at::Tensor& sinks = {}, double scale = 0) {
  const int64_t b = q.size(0), heads = q.size(1), s = q.size(2), d = q.size(3), dv = v_in.size(3);
  at::Tensor k = k_in.repeat_interleave(heads / k_in.size(1), 1);
  at::Tensor v = v_in.repeat_interleave(heads / v_in.size(1), 1);
  at::Tensor scores = scale > 0 ? at::matmul(q, k.transpose(-2, -1)) * scale
                                : at::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(d));
  at::Tensor future = at::ones({s, s}, q.options().dtype(at::kBool)).triu(1);
  if (window > 0) future.logical_or_(at::ones({s, s}, future.options()).tril(-window));
  scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  if (sinks.defined()) {
    at::Tensor column = sinks.view({1, heads, 1, 1}).expand({b, heads, s, 1});
    at::Tensor probs = at::softmax(at::cat({scores, column}, -1), -1).narrow(-1, 0, s);
    return at::matmul(probs, v).transpose(1, 2).reshape({b, s, heads * dv});
  }
  at::Tensor probs = at::softmax(scores, -1);
  return at::matmul(probs, v).transpose(1, 2).reshape({b, s, heads * dv});
}

// Largest |x - ref| / (tol + tol |ref|): at most 1 when within tolerance.
double worst(const at::Tensor& x, const at::Tensor& ref, double tol = kTolerance) {
  at::Tensor r = ref.to(at::kDouble);
  return ((x.to(at::kDouble) - r).abs() / (tol + tol * r.abs())).max().item<double>();
}
double max_abs_diff(const at::Tensor& x, const at::Tensor& ref) {
  return (x.to(at::kDouble) - ref.to(at::kDouble)).abs().max().item<double>();
}

#define CHECK_CLOSE(x, ref)                        \
  do {                                             \
    const double max_abs = max_abs_diff(x, ref);   \
    CAPTURE(max_abs);                              \
    CHECK(worst(x, ref) <= 1.0);                   \
  } while (0)

// The tolerance for a result of flash attention whose naive fp32 counterpart is `fp32`: 1e-5, or
// 4x the naive fp32 computation's own error where this machine's GEMMs make that larger, and never
// under 2e-4 with PyTorch 2.x: its CPU GEMMs do not round alike from call to call under load (the
// grouped-query case measured 7.1e-5 on the flash path in 1 run of 20 under ctest -j2, while the
// naive path stayed near 1e-6). A wrong scale, mask or grouping errs by 1e-2 and more.
double fp32_tolerance(const at::Tensor& fp32, const at::Tensor& ref) {
  const double floor = TORCH_VERSION_MAJOR >= 2 ? 2e-4 : kTolerance;
  return std::max(floor, 4 * worst(fp32, ref, 1.0));
}

#define CHECK_CLOSE_AS_FP32(x, fp32, ref)                 \
  do {                                                    \
    const double max_abs = max_abs_diff(x, ref);          \
    const double tolerance = fp32_tolerance(fp32, ref);   \
    CAPTURE(max_abs, tolerance);                          \
    CHECK(worst(x, ref, tolerance) <= 1.0);               \
  } while (0)

// dv: the value head width, 0 for d; scale: flash_attention's (0: 1 / sqrt(d)).
struct Case {
  int64_t b, heads, kv_heads, s, d, block, window = 0, dv = 0;
  double scale = 0;
};

void check_against_naive(const Case& c) {
  const int64_t dv = c.dv > 0 ? c.dv : c.d;
  CAPTURE(c.b, c.heads, c.kv_heads, c.s, c.d, dv, c.block, c.window, c.scale);
  torch::manual_seed(1234);
  at::Tensor q = torch::randn({c.b, c.heads, c.s, c.d});
  at::Tensor k = torch::randn({c.b, c.kv_heads, c.s, c.d});
  at::Tensor v = torch::randn({c.b, c.kv_heads, c.s, dv});
  at::Tensor dout = torch::randn({c.b, c.s, c.heads * dv});

  at::Tensor fq = q.clone().requires_grad_(), fk = k.clone().requires_grad_(), fv = v.clone().requires_grad_();
  at::Tensor out = flash_attention(fq, fk, fv, c.block, 0.0, c.window, {}, c.scale);
  REQUIRE(out.sizes() == at::IntArrayRef{c.b, c.s, c.heads * dv});
  REQUIRE(out.is_contiguous());
  REQUIRE(out.scalar_type() == at::kFloat);
  out.backward(dout);

  at::Tensor rq = q.to(at::kDouble).requires_grad_(), rk = k.to(at::kDouble).requires_grad_(),
             rv = v.to(at::kDouble).requires_grad_();
  at::Tensor ref = naive_attention(rq, rk, rv, c.window, {}, c.scale);
  ref.backward(dout.to(at::kDouble));

  // The same naive attention in fp32: how closely this machine's fp32 arithmetic can get.
  at::Tensor nq = q.clone().requires_grad_(), nk = k.clone().requires_grad_(), nv = v.clone().requires_grad_();
  at::Tensor naive = naive_attention(nq, nk, nv, c.window, {}, c.scale);
  naive.backward(dout);

  REQUIRE(fq.grad().sizes() == q.sizes());
  REQUIRE(fk.grad().sizes() == k.sizes());  // at kv-head width, summed over each group
  REQUIRE(fv.grad().sizes() == v.sizes());  // and at the value head width
  CHECK_CLOSE_AS_FP32(out, naive, ref);
  CHECK_CLOSE_AS_FP32(fq.grad(), nq.grad(), rq.grad());
  CHECK_CLOSE_AS_FP32(fk.grad(), nk.grad(), rk.grad());
  CHECK_CLOSE_AS_FP32(fv.grad(), nv.grad(), rv.grad());
}

TEST_CASE("flash attention matches naive attention, multi-head", "[attention]") {
  check_against_naive({2, 4, 4, 128, 16, 64});
}

TEST_CASE("flash attention matches naive attention, grouped-query", "[attention]") {
  SECTION("2 query heads per kv head") { check_against_naive({2, 4, 2, 128, 16, 64}); }
  SECTION("one kv head (multi-query)") { check_against_naive({2, 4, 1, 128, 16, 64}); }
}

TEST_CASE("flash attention matches naive attention, partial last block", "[attention]") {
  SECTION("s = 100, block 32") { check_against_naive({2, 4, 4, 100, 16, 32}); }
  SECTION("s = 100, block 32, grouped-query") { check_against_naive({2, 4, 2, 100, 16, 32}); }
  SECTION("block of one query") { check_against_naive({1, 2, 1, 17, 8, 1}); }
}

TEST_CASE("flash attention matches naive attention under a sliding window", "[attention]") {
  SECTION("window 1: each query its own key") { check_against_naive({1, 2, 2, 40, 8, 16, 1}); }
  SECTION("window inside a query block") { check_against_naive({2, 4, 2, 100, 16, 32, 7}); }
  SECTION("window across query blocks") { check_against_naive({2, 4, 2, 100, 16, 32, 45}); }
  SECTION("window as long as the sequence") { check_against_naive({2, 4, 4, 64, 16, 16, 64}); }
}

// DeepSeek's multi-head latent attention: q, k of head width d, v (and the context) of dv != d.
TEST_CASE("flash attention with a value head width other than the query/key one matches naive attention",
          "[attention]") {
  SECTION("multi-head, d 24, dv 16") { check_against_naive({2, 4, 4, 64, 24, 32, 0, 16}); }
  SECTION("grouped-query, partial last block, d 24, dv 16") { check_against_naive({2, 4, 2, 100, 24, 32, 0, 16}); }
  SECTION("grouped-query under a window across query blocks, d 24, dv 16") {
    check_against_naive({2, 4, 2, 100, 24, 32, 45, 16});
  }
  SECTION("multi-query, dv wider than d") { check_against_naive({1, 4, 1, 70, 8, 16, 0, 20}); }
  SECTION("block of one query, window 3") { check_against_naive({1, 2, 1, 17, 12, 1, 3, 4}); }
}

// DeepSeek's yarn mscale: the scores scaled by other than 1 / sqrt(d).
TEST_CASE("flash attention with an explicit softmax scale matches naive attention so scaled", "[attention]") {
  SECTION("multi-head, scale 0.4") { check_against_naive({2, 4, 4, 64, 16, 32, 0, 0, 0.4}); }
  SECTION("grouped-query, window, dv != d, scale 0.11") { check_against_naive({2, 4, 2, 100, 24, 32, 7, 16, 0.11}); }

  // 0 stands for 1 / sqrt(d): that scale given explicitly gives the very same output and gradients.
  const int64_t b = 1, heads = 4, kv = 2, s = 40, d = 16;
  torch::manual_seed(21);
  at::Tensor q = torch::randn({b, heads, s, d}), k = torch::randn({b, kv, s, d}), v = torch::randn({b, kv, s, d});
  at::Tensor dout = torch::randn({b, s, heads * d});
  std::vector<at::Tensor> results;
  for (double scale : {0.0, 1.0 / std::sqrt(double(d)), 0.4}) {
    at::Tensor fq = q.clone().requires_grad_(), fk = k.clone().requires_grad_(), fv = v.clone().requires_grad_();
    at::Tensor out = flash_attention(fq, fk, fv, 16, 0.0, 0, {}, scale);
    out.backward(dout);
    results.insert(results.end(), {out.detach(), fq.grad(), fk.grad(), fv.grad()});
  }
  for (int i = 0; i < 4; ++i) {
    CHECK(at::equal(results[i], results[4 + i]));
    CHECK_FALSE(at::allclose(results[i], results[8 + i]));  // and another scale is used
  }
}

// gpt-oss's attention sinks (dv == d), and with DeepSeek's widths and scale.
TEST_CASE("flash attention with attention sinks matches the naive softmax with a sink column, dv != d and scaled too",
          "[attention]") {
  const int64_t b = 2, heads = 4, kv = 2, s = 50, d = 24;
  for (auto [window, scale, dv] : std::vector<std::tuple<int64_t, double, int64_t>>{
           {0, 0.0, d}, {9, 0.0, d}, {0, 0.0, 16}, {9, 0.0, 16}, {9, 0.13, 16}}) {
    CAPTURE(window, scale, dv);
    torch::manual_seed(98);
    at::Tensor q = torch::randn({b, heads, s, d}), k = torch::randn({b, kv, s, d}), v = torch::randn({b, kv, s, dv});
    at::Tensor sinks = torch::randn({heads}) * 2, dout = torch::randn({b, s, heads * dv});
    at::Tensor fq = q.clone().requires_grad_(), fk = k.clone().requires_grad_(), fv = v.clone().requires_grad_(),
               fs = sinks.clone().requires_grad_();
    at::Tensor out = flash_attention(fq, fk, fv, 16, 0.0, window, fs, scale);
    REQUIRE(out.sizes() == at::IntArrayRef{b, s, heads * dv});
    CHECK(flash_attention_saved(out).size() == 6);  // q, k, v, out, lse and the sinks
    out.backward(dout);
    at::Tensor rq = q.to(at::kDouble).requires_grad_(), rk = k.to(at::kDouble).requires_grad_(),
               rv = v.to(at::kDouble).requires_grad_(), rs = sinks.to(at::kDouble).requires_grad_();
    at::Tensor ref = naive_attention(rq, rk, rv, window, rs, scale);
    ref.backward(dout.to(at::kDouble));
    // 1e-4: PyTorch 2's CPU GEMMs round differently from call to call (fp32_tolerance); a wrong
    // width, scale or sink term errs by 1e-2 and more.
    CHECK(worst(out, ref, 1e-4) <= 1.0);
    CHECK(worst(fq.grad(), rq.grad(), 1e-4) <= 1.0);
    CHECK(worst(fk.grad(), rk.grad(), 1e-4) <= 1.0);
    CHECK(worst(fv.grad(), rv.grad(), 1e-4) <= 1.0);
    CHECK(worst(fs.grad(), rs.grad(), 1e-4) <= 1.0);
  }
}

TEST_CASE("flash attention with dv != d keeps q, k, v, the output and the log-sum-exp at their own widths",
          "[attention]") {
  const int64_t b = 2, heads = 4, kv = 2, s = 48, d = 24, dv = 16;
  torch::manual_seed(8);
  at::Tensor q = torch::randn({b, heads, s, d}).requires_grad_();
  at::Tensor k = torch::randn({b, kv, s, d}).requires_grad_();
  at::Tensor v = torch::randn({b, kv, s, dv}).requires_grad_();
  at::Tensor out = flash_attention(q, k, v, 16);
  const std::vector<at::Tensor> saved = flash_attention_saved(out);
  REQUIRE(saved.size() == 5);
  CHECK(saved[0].data_ptr() == q.data_ptr());
  CHECK(saved[1].sizes() == at::IntArrayRef{b, kv, s, d});
  CHECK(saved[2].sizes() == at::IntArrayRef{b, kv, s, dv});
  CHECK(saved[2].data_ptr() == v.data_ptr());
  CHECK(saved[3].data_ptr() == out.data_ptr());
  CHECK(saved[3].sizes() == at::IntArrayRef{b, s, heads * dv});
  CHECK(saved[4].sizes() == at::IntArrayRef{b, heads, s});
  int64_t bytes = 0;
  for (const auto& t : saved) bytes += t.numel() * int64_t(t.element_size());
  CHECK(bytes == 4 * (q.numel() + k.numel() + v.numel() + out.numel() + b * heads * s));
}

TEST_CASE("flash attention matches naive attention, one block covers the sequence", "[attention]") {
  SECTION("block > s") { check_against_naive({2, 4, 2, 100, 16, 256}); }
  SECTION("block == s") { check_against_naive({2, 4, 4, 64, 16, 64}); }
}

TEST_CASE("flash attention keeps only q, k, v, the output and the log-sum-exp", "[attention]") {
  const int64_t b = 2, heads = 4, kv = 2, s = 96, d = 16;
  torch::manual_seed(7);
  at::Tensor q = torch::randn({b, heads, s, d}).requires_grad_();
  at::Tensor k = torch::randn({b, kv, s, d}).requires_grad_();
  at::Tensor v = torch::randn({b, kv, s, d}).requires_grad_();
  at::Tensor out = flash_attention(q, k, v, 32);
  REQUIRE(out.grad_fn());

  const std::vector<at::Tensor> saved = flash_attention_saved(out);
  REQUIRE(saved.size() == 5);
  // Contiguous inputs are kept as they are, not copied; K/V at kv-head width.
  CHECK(saved[0].data_ptr() == q.data_ptr());
  CHECK(saved[1].data_ptr() == k.data_ptr());
  CHECK(saved[2].data_ptr() == v.data_ptr());
  CHECK(saved[1].sizes() == at::IntArrayRef{b, kv, s, d});
  // The output saved is the one returned: a projection saving its input shares it.
  CHECK(saved[3].data_ptr() == out.data_ptr());
  CHECK(saved[4].scalar_type() == at::kFloat);
  CHECK(saved[4].sizes() == at::IntArrayRef{b, heads, s});
  int64_t bytes = 0;
  for (const auto& t : saved) bytes += t.numel() * int64_t(t.element_size());
  CHECK(bytes == 4 * (q.numel() + k.numel() + v.numel() + out.numel() + b * heads * s));

  CHECK(flash_attention_saved(out * 2).empty());
  CHECK(flash_attention_saved(q).empty());
}

TEST_CASE("flash attention takes q, k, v as views into a fused QKV projection", "[attention]") {
  const int64_t b = 2, heads = 4, kv = 2, s = 80, d = 8, width = (heads + 2 * kv) * d;
  torch::manual_seed(11);
  at::Tensor qkv0 = torch::randn({b, s, width});
  at::Tensor dout = torch::randn({b, s, heads * d});
  // As gpt.cpp splits its fused projection: strided [b, heads, s, d] views.
  auto split = [&](const at::Tensor& qkv) {
    auto parts = qkv.split_with_sizes({heads * d, kv * d, kv * d}, -1);
    return std::vector<at::Tensor>{parts[0].view({b, s, heads, d}).transpose(1, 2),
                                   parts[1].view({b, s, kv, d}).transpose(1, 2),
                                   parts[2].view({b, s, kv, d}).transpose(1, 2)};
  };

  at::Tensor qkv = qkv0.clone().requires_grad_();
  auto views = split(qkv);
  REQUIRE_FALSE(views[0].is_contiguous());
  at::Tensor out = flash_attention(views[0], views[1], views[2], 32);
  // The saved q, k, v are compact copies, not the fused tensor.
  const std::vector<at::Tensor> saved = flash_attention_saved(out);
  REQUIRE(saved.size() == 5);
  for (int i = 0; i < 3; ++i) {
    CHECK(saved[i].is_contiguous());
    CHECK_FALSE(saved[i].storage().is_alias_of(qkv.storage()));
  }
  out.backward(dout);

  at::Tensor rqkv = qkv0.to(at::kDouble).requires_grad_();
  auto rviews = split(rqkv);
  at::Tensor ref = naive_attention(rviews[0], rviews[1], rviews[2]);
  ref.backward(dout.to(at::kDouble));
  CHECK_CLOSE(out, ref);
  CHECK_CLOSE(qkv.grad(), rqkv.grad());
}

TEST_CASE("flash attention's context feeds an output projection", "[attention]") {
  const int64_t b = 2, heads = 4, kv = 4, s = 40, d = 8, e = 24;
  torch::manual_seed(3);
  at::Tensor q = torch::randn({b, heads, s, d}).requires_grad_();
  at::Tensor k = torch::randn({b, kv, s, d}).requires_grad_();
  at::Tensor v = torch::randn({b, kv, s, d}).requires_grad_();
  at::Tensor w = torch::randn({e, heads * d}).requires_grad_();
  at::Tensor y = at::linear(flash_attention(q, k, v), w);
  REQUIRE(y.sizes() == at::IntArrayRef{b, s, e});
  y.sum().backward();

  at::Tensor rq = q.detach().to(at::kDouble).requires_grad_(), rk = k.detach().to(at::kDouble).requires_grad_(),
             rv = v.detach().to(at::kDouble).requires_grad_(), rw = w.detach().to(at::kDouble).requires_grad_();
  at::Tensor ry = at::linear(naive_attention(rq, rk, rv), rw);
  ry.sum().backward();
  CHECK_CLOSE(y, ry);
  CHECK_CLOSE(w.grad(), rw.grad());
  CHECK_CLOSE(q.grad(), rq.grad());
  CHECK_CLOSE(k.grad(), rk.grad());
}

TEST_CASE("flash attention in bf16 keeps fp32 statistics and returns bf16", "[attention]") {
  const int64_t b = 1, heads = 4, kv = 2, s = 70, d = 16;
  torch::manual_seed(5);
  at::Tensor q = torch::randn({b, heads, s, d}).to(at::kBFloat16).requires_grad_();
  at::Tensor k = torch::randn({b, kv, s, d}).to(at::kBFloat16).requires_grad_();
  at::Tensor v = torch::randn({b, kv, s, d}).to(at::kBFloat16).requires_grad_();
  at::Tensor dout = torch::randn({b, s, heads * d}).to(at::kBFloat16);
  at::Tensor out = flash_attention(q, k, v, 32);
  CHECK(out.scalar_type() == at::kBFloat16);
  const std::vector<at::Tensor> saved = flash_attention_saved(out);
  REQUIRE(saved.size() == 5);
  CHECK(saved[4].scalar_type() == at::kFloat);
  out.backward(dout);
  CHECK(q.grad().scalar_type() == at::kBFloat16);

  // The reference sees the same bf16-rounded values; what remains is bf16 rounding of results.
  at::Tensor rq = q.detach().to(at::kDouble).requires_grad_(), rk = k.detach().to(at::kDouble).requires_grad_(),
             rv = v.detach().to(at::kDouble).requires_grad_();
  at::Tensor ref = naive_attention(rq, rk, rv);
  ref.backward(dout.to(at::kDouble));
  const double bf16_tolerance = 2e-2;
  CHECK(worst(out, ref, bf16_tolerance) <= 1.0);
  CHECK(worst(q.grad(), rq.grad(), bf16_tolerance) <= 1.0);
  CHECK(worst(k.grad(), rk.grad(), bf16_tolerance) <= 1.0);
  CHECK(worst(v.grad(), rv.grad(), bf16_tolerance) <= 1.0);
}

TEST_CASE("flash attention rejects mismatched shapes", "[attention]") {
  at::Tensor q = torch::randn({1, 3, 8, 4});
  CHECK_THROWS(flash_attention(q, torch::randn({1, 2, 8, 4}), torch::randn({1, 2, 8, 4})));  // 3 % 2 != 0
  CHECK_THROWS(flash_attention(q, torch::randn({1, 3, 9, 4}), torch::randn({1, 3, 9, 4})));  // lengths differ
  CHECK_THROWS(flash_attention(q, q, q, 0));
  // v may be narrower or wider than q and k, but not of another length, batch or head count.
  CHECK_NOTHROW(flash_attention(q, torch::randn({1, 3, 8, 4}), torch::randn({1, 3, 8, 6})));
  CHECK_THROWS(flash_attention(q, torch::randn({1, 3, 8, 4}), torch::randn({1, 3, 9, 6})));
  CHECK_THROWS(flash_attention(q, torch::randn({1, 3, 8, 4}), torch::randn({1, 1, 8, 6})));
  CHECK_THROWS(flash_attention(q, torch::randn({1, 3, 8, 5}), torch::randn({1, 3, 8, 4})));  // k's d is not q's
  CHECK_THROWS(flash_attention(q, q, q, 64, 0.0, 0, {}, -0.5));  // the scale: 0 (1 / sqrt(d)) or positive
}

// f's autograd gradients {dq, dk, dv} at a few elements of q, k and v against central differences
// (f redraws the same dropout masks at every call).
void check_central_differences(const std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>& f,
                               const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const std::vector<at::Tensor>& grads) {
  const double eps = 1e-2;
  for (int which = 0; which < 3; ++which) {
    at::Tensor x = which == 0 ? q : which == 1 ? k : v;
    for (int64_t i : {0L, 7L, 23L, 41L}) {
      at::Tensor flat = x.view({-1});
      const float keep = flat[i].item<float>();
      flat[i] = keep + eps;
      const double up = (which == 0 ? f(x, k, v) : which == 1 ? f(q, x, v) : f(q, k, x)).item<double>();
      flat[i] = keep - eps;
      const double down = (which == 0 ? f(x, k, v) : which == 1 ? f(q, x, v) : f(q, k, x)).item<double>();
      flat[i] = keep;
      const double numeric = (up - down) / (2 * eps), analytic = grads[which].view({-1})[i].item<double>();
      INFO("tensor " << which << " element " << i << ": numeric " << numeric << ", autograd " << analytic);
      CHECK(std::abs(numeric - analytic) <= 2e-3 + 1e-2 * std::abs(analytic));
    }
  }
}

}  // namespace

TEST_CASE("flash attention's dropout: backward is the gradient of the dropped forward, and the masks replay",
          "[attention]") {
  const int64_t b = 1, heads = 4, kv = 2, s = 12, d = 4, block = 5;
  torch::manual_seed(3);
  at::Tensor q = torch::randn({b, heads, s, d}), k = torch::randn({b, kv, s, d}), v = torch::randn({b, kv, s, d});
  at::Tensor w = torch::randn({b, s, heads * d});
  // With the generator reset before each call, the forward draws the same seed, so the function of
  // (q, k, v) is fixed: its autograd gradient must match central differences.
  auto f = [&](const at::Tensor& qq, const at::Tensor& kk, const at::Tensor& vv) {
    torch::manual_seed(99);
    return (flash_attention(qq, kk, vv, block, 0.3) * w).sum();
  };
  at::Tensor qg = q.clone().requires_grad_(), kg = k.clone().requires_grad_(), vg = v.clone().requires_grad_();
  f(qg, kg, vg).backward();
  const at::Tensor plain = flash_attention(q, k, v, block);
  torch::manual_seed(99);
  const at::Tensor dropped = flash_attention(q, k, v, block, 0.3);
  CHECK(!at::allclose(plain, dropped));  // the masks are applied
  torch::manual_seed(99);
  CHECK(at::equal(dropped, flash_attention(q, k, v, block, 0.3)));  // and replay from the same state
  check_central_differences(f, q, k, v, {qg.grad(), kg.grad(), vg.grad()});
}

TEST_CASE("flash attention's dropout with dv != d and an explicit scale: backward is the dropped forward's gradient",
          "[attention]") {
  const int64_t b = 1, heads = 4, kv = 2, s = 12, d = 6, dv = 4, block = 5;
  const double scale = 0.7;
  torch::manual_seed(4);
  at::Tensor q = torch::randn({b, heads, s, d}), k = torch::randn({b, kv, s, d}), v = torch::randn({b, kv, s, dv});
  at::Tensor w = torch::randn({b, s, heads * dv});
  auto f = [&](const at::Tensor& qq, const at::Tensor& kk, const at::Tensor& vv) {
    torch::manual_seed(99);
    return (flash_attention(qq, kk, vv, block, 0.3, 0, {}, scale) * w).sum();
  };
  at::Tensor qg = q.clone().requires_grad_(), kg = k.clone().requires_grad_(), vg = v.clone().requires_grad_();
  f(qg, kg, vg).backward();
  CHECK(vg.grad().sizes() == v.sizes());
  check_central_differences(f, q, k, v, {qg.grad(), kg.grad(), vg.grad()});
}
