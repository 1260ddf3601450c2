// The context-parallel ring (executor/src/ring_attention.h) over real Gloo groups of 2 and 4
// members (threads of this process on 127.0.0.1, one c10d::HashStore, as comm_test.cpp): each
// member's output and its q, k, v gradients must equal its rows of flash_attention's on the whole
// sequence, with grouped-query K/V and several query blocks per chunk, and with a value head width
// other than the query/key one and an explicit softmax scale; and the saved tensors must
// be flash attention's (this rank's q, k, v, out and the fp32 log-sum-exp), nothing received.
#include <exception>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

// LibTorch first: its glog defines CHECK, which must give way to Catch's.
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>
#undef CHECK
#include <catch2/catch.hpp>

#include "attention.h"
#include "comm.h"
#include "phase_clock.h"
#include "ring_attention.h"

namespace {
using dplan::executor::cp_chunks;
using dplan::executor::flash_attention;
using dplan::executor::Group;
using dplan::executor::GroupOptions;
using dplan::executor::PhaseClock;
using dplan::executor::ring_attention;
using dplan::executor::ring_attention_saved;

struct Result {
  at::Tensor out, dq, dk, dv, dsinks;
  std::vector<at::Tensor> saved;
  double ring_comm_s = 0;
};

// Every member runs the ring on its chunks of the same q, k, v and output gradient.
std::vector<Result> run_ring(int members, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& dout, int64_t block, int64_t window, const at::Tensor& sinks = {},
                             const dplan::executor::AttentionDropout& dropout = {}, double scale = 0) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  GroupOptions options;
  options.gloo_address = "127.0.0.1";
  options.timeout = std::chrono::milliseconds(60000);
  std::vector<int> ranks;
  for (int r = 0; r < members; ++r) ranks.push_back(r);
  std::vector<Result> results(members);
  std::vector<std::exception_ptr> failure(members);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < members; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        Group g = Group::create(store, "cp" + std::to_string(members), ranks, rank, options);
        PhaseClock clock;
        clock.start_step();
        at::Tensor ql = cp_chunks(q, 2, members, rank).detach().requires_grad_(true);
        at::Tensor kl = cp_chunks(k, 2, members, rank).detach().requires_grad_(true);
        at::Tensor vl = cp_chunks(v, 2, members, rank).detach().requires_grad_(true);
        at::Tensor sl = sinks.defined() ? sinks.detach().clone().requires_grad_(true) : at::Tensor();
        Result& res = results[rank];
        res.out = ring_attention(ql, kl, vl, g, &clock, window, sl, dropout, block, scale);
        res.saved = ring_attention_saved(res.out);
        res.out.backward(cp_chunks(dout, 1, members, rank));
        res.dq = ql.grad();
        res.dk = kl.grad();
        res.dv = vl.grad();
        if (sl.defined()) res.dsinks = sl.grad();
        res.ring_comm_s = clock.end_step()[static_cast<int>(dplan::executor::Phase::cp_comm)];
      } catch (...) {
        failure[rank] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& f : failure)
    if (f) std::rethrow_exception(f);
  return results;
}

void check_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  INFO(what << ": max |difference| " << (got - want).abs().max().item<double>());
  CHECK(got.sizes() == want.sizes());
  CHECK(at::allclose(got, want, 1e-5, 1e-6));
}

// One ring of `members` against one-process flash attention on the whole sequence: every member's
// output and dq, dk, dv (and the sinks' gradient summed over cp) within 1e-5, and what each saves:
// flash attention's set for its tokens, K/V at kv-head width, V at its own width.
struct RingCase {
  int members, window, heads, kv_heads, block;
  int64_t d, dv;
  double scale;
  bool with_sinks;
  uint64_t seed;
};
void check_ring(const RingCase& c) {
  INFO("cp " << c.members << " window " << c.window << " heads " << c.heads << " kv_heads " << c.kv_heads << " block "
             << c.block << " d " << c.d << " dv " << c.dv << " scale " << c.scale << " sinks " << c.with_sinks);
  at::manual_seed(c.seed);
  const int64_t b = 2, s = 8 * c.members;  // chunks of 4 tokens: several query blocks of 3
  at::Tensor q = at::randn({b, c.heads, s, c.d}).requires_grad_(true);
  at::Tensor k = at::randn({b, c.kv_heads, s, c.d}).requires_grad_(true);
  at::Tensor v = at::randn({b, c.kv_heads, s, c.dv}).requires_grad_(true);
  at::Tensor sinks = c.with_sinks ? at::randn({c.heads}).requires_grad_(true) : at::Tensor();
  at::Tensor dout = at::randn({b, s, c.heads * c.dv});
  at::Tensor want = flash_attention(q, k, v, c.block, 0.0, c.window, sinks, c.scale);
  want.backward(dout);
  const std::vector<Result> got = run_ring(c.members, q, k, v, dout, c.block, c.window, sinks, {}, c.scale);
  at::Tensor dsinks = at::zeros({c.heads});
  for (int r = 0; r < c.members; ++r) {
    INFO("member " << r);
    check_close(got[r].out, cp_chunks(want.detach(), 1, c.members, r), "output");
    check_close(got[r].dq, cp_chunks(q.grad(), 2, c.members, r), "dq");
    check_close(got[r].dk, cp_chunks(k.grad(), 2, c.members, r), "dk");
    check_close(got[r].dv, cp_chunks(v.grad(), 2, c.members, r), "dv");
    REQUIRE(got[r].saved.size() == (c.with_sinks ? 6u : 5u));
    CHECK(got[r].saved[1].sizes() == at::IntArrayRef({b, c.kv_heads, s / c.members, c.d}));
    CHECK(got[r].saved[2].sizes() == at::IntArrayRef({b, c.kv_heads, s / c.members, c.dv}));
    CHECK(got[r].saved[3].data_ptr() == got[r].out.data_ptr());
    CHECK(got[r].saved[4].scalar_type() == at::kFloat);
    CHECK(got[r].ring_comm_s > 0);
    if (c.with_sinks) dsinks += got[r].dsinks;
  }
  if (c.with_sinks) check_close(dsinks, sinks.grad(), "dsinks");
}

}  // namespace

TEST_CASE("ring attention over 2 and 4 members equals flash attention on the whole sequence", "[executor][cp]") {
  // Sliding windows of 3 (inside a 4-token chunk), 6 (across one chunk boundary) and 9 (past a
  // whole chunk): key chunks wholly beyond it are skipped, partial ones masked by true position.
  for (auto [members, window] : std::vector<std::pair<int, int>>{{2, 0}, {4, 0}, {2, 3}, {4, 6}, {4, 9}})
    for (auto [heads, kv_heads, block] : std::vector<std::tuple<int, int, int>>{{4, 4, 64}, {4, 2, 3}})
      check_ring({members, window, heads, kv_heads, block, 8, 8, 0.0, false,
                  static_cast<uint64_t>(members * 10 + kv_heads + 100 * window)});
}

// DeepSeek's multi-head latent attention: V (and the context) of head width dv != d, K and V
// travelling the ring together all the same, and the scores scaled by other than 1 / sqrt(d).
// And gpt-oss's attention sinks with a window (dv == d), their gradient summed over cp.
TEST_CASE("ring attention with sinks, windows, dv != d and an explicit scale equals flash attention on the whole sequence",
          "[executor][cp]") {
  for (auto [members, window, scale, with_sinks, dv] : std::vector<std::tuple<int, int, double, bool, int64_t>>{
           {2, 0, 0.23, false, 8}, {4, 0, 0.0, false, 8}, {4, 6, 0.23, false, 8}, {2, 6, 0.23, true, 8},
           {2, 6, 0.0, true, 12}})
    check_ring({members, window, 4, 2, 3, 12, dv, scale, with_sinks, static_cast<uint64_t>(members * 10 + window + 300)});
}

TEST_CASE("ring attention with attention dropout: masks replay from the seed, backward is the dropped forward's gradient",
          "[executor][cp]") {
  const int members = 2;
  const int64_t b = 1, heads = 2, kv_heads = 2, s = 8 * members, d = 8;
  at::manual_seed(5);
  at::Tensor q = at::randn({b, heads, s, d}), k = at::randn({b, kv_heads, s, d}), v = at::randn({b, kv_heads, s, d});
  at::Tensor dout = at::randn({b, s, heads * d}), u = at::randn({b, heads, s, d});
  const dplan::executor::AttentionDropout drop{0.3, 1234};
  // f(q) = <out, dout> summed over the members, and its gradient along u from the members' dq.
  auto f = [&](const at::Tensor& qq) {
    double total = 0;
    const std::vector<Result> got = run_ring(members, qq, k, v, dout, 3, 0, {}, drop);
    for (int r = 0; r < members; ++r) total += (got[r].out * cp_chunks(dout, 1, members, r)).sum().item<double>();
    return total;
  };
  const std::vector<Result> got = run_ring(members, q, k, v, dout, 3, 0, {}, drop);
  const std::vector<Result> again = run_ring(members, q, k, v, dout, 3, 0, {}, drop);
  const std::vector<Result> undropped = run_ring(members, q, k, v, dout, 3, 0);
  double along_u = 0;
  for (int r = 0; r < members; ++r) {
    CHECK(at::equal(got[r].out, again[r].out));       // the same masks from the same seed
    CHECK(at::equal(got[r].dq, again[r].dq));
    CHECK_FALSE(at::allclose(got[r].out, undropped[r].out));  // and they drop something
    along_u += (got[r].dq * cp_chunks(u, 2, members, r)).sum().item<double>();
  }
  const double eps = 1e-2, numeric = (f(q + eps * u) - f(q - eps * u)) / (2 * eps);
  INFO("directional derivative: backward " << along_u << ", central difference " << numeric);
  CHECK(std::abs(along_u - numeric) <= 1e-2 * std::abs(numeric));
}

TEST_CASE("cp_chunks gives rank i chunks i and 2cp-1-i and refuses a length 2cp does not divide", "[executor][cp]") {
  at::Tensor positions = at::arange(16);
  CHECK(at::equal(cp_chunks(positions, 0, 4, 1), at::tensor({2, 3, 12, 13}, positions.options())));
  CHECK(at::equal(cp_chunks(positions, 0, 2, 0), at::tensor({0, 1, 2, 3, 12, 13, 14, 15}, positions.options())));
  CHECK(at::equal(cp_chunks(positions, 0, 1, 0), positions));
  CHECK_THROWS(cp_chunks(at::arange(12), 0, 4, 0));
}
