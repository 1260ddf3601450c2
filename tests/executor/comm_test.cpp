// The collectives of executor/src/comm.h over a real two-member Gloo group (two threads of this
// process on 127.0.0.1, one c10d::HashStore), in both forms comm.h describes: the one-tensor
// reduce-scatter and all-gather that LibTorch 2.x's Gloo has, and the 1.13 forms (all-reduce and
// slice; list all-gather) that GroupOptions::legacy_gloo_collectives forces. Each form, fp32 and
// bf16, must give exactly the sums and concatenations computed here, and leave its input alone
// where comm.h says it does. Under 1.13 the default is the legacy form; under 2.x the one-tensor
// form, and a silent fall back to the legacy one fails the first case. Last, the address rank 0's
// rendezvous store listens on (place.h).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

// LibTorch first: its glog defines CHECK, which must give way to Catch's.
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>
#include <torch/version.h>
#undef CHECK
#include <catch2/catch.hpp>

#include "comm.h"
#include "place.h"

namespace {
using dplan::executor::Group;
using dplan::executor::GroupOptions;

// Runs body(group) on two members at once; rethrows the first member's failure.
template <typename Body>
void on_two_members(bool legacy, const std::string& name, Body body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  GroupOptions options;
  options.gloo_address = "127.0.0.1";
  options.timeout = std::chrono::milliseconds(30000);
  options.legacy_gloo_collectives = legacy;
  std::exception_ptr failure[2];
  std::vector<std::thread> members;
  for (int rank = 0; rank < 2; ++rank) {
    members.emplace_back([&, rank] {
      try {
        Group g = Group::create(store, name, {0, 1}, rank, options);
        body(g);
      } catch (...) {
        failure[rank] = std::current_exception();
      }
    });
  }
  for (auto& m : members) m.join();
  for (auto& f : failure)
    if (f) std::rethrow_exception(f);
}

// Member r's input: distinct small integers, exact in bf16 and in any order of summation.
at::Tensor input_of(int rank, at::ScalarType dtype) {
  return (at::arange(24, at::kFloat).view({4, 6}) + 100 * rank).to(dtype);
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && at::equal(a, b);
}

}  // namespace

TEST_CASE("comm: one-tensor collectives under LibTorch 2.x, the 1.13 forms under 1.13 or when asked",
          "[comm]") {
  const bool legacy = GENERATE(false, true);
  INFO((legacy ? "legacy forms" : "default forms"));
  const bool expect_one_tensor = !legacy && TORCH_VERSION_MAJOR >= 2;
  bool seen[2] = {!expect_one_tensor, !expect_one_tensor};
  on_two_members(legacy, legacy ? "which-legacy" : "which", [&](Group& g) {
    at::Tensor t = input_of(g.rank(), at::kFloat);
    (void)g.reduce_scatter(t, 0);  // a Gloo that refuses the one-tensor form would turn it off here
    seen[g.rank()] = g.one_tensor_collectives();
  });
  CHECK(seen[0] == expect_one_tensor);
  CHECK(seen[1] == expect_one_tensor);
}

TEST_CASE("comm: all-gather and reduce-scatter along a dimension, both forms, fp32 and bf16", "[comm]") {
  const bool legacy = GENERATE(false, true);
  const at::ScalarType dtype = GENERATE(at::kFloat, at::kBFloat16);
  INFO((legacy ? "legacy forms" : "default forms") << ", " << c10::toString(dtype));
  const at::Tensor both[2] = {input_of(0, dtype), input_of(1, dtype)};
  const at::Tensor sum = (both[0].to(at::kFloat) + both[1].to(at::kFloat)).to(dtype);
  bool ok[2][4] = {};
  on_two_members(legacy, "dims", [&](Group& g) {
    const int r = g.rank();
    at::Tensor mine = both[r].clone();
    ok[r][0] = same(g.all_gather(mine, 0), at::cat({both[0], both[1]}, 0));
    ok[r][1] = same(g.all_gather(mine, 1), at::cat({both[0], both[1]}, 1));
    ok[r][2] = same(g.reduce_scatter(mine, 1), sum.chunk(2, 1)[r]);
    ok[r][3] = same(mine, both[r]);  // reduce_scatter leaves its input alone
  });
  for (int r = 0; r < 2; ++r) {
    INFO("member " << r);
    CHECK(ok[r][0]);
    CHECK(ok[r][1]);
    CHECK(ok[r][2]);
    CHECK(ok[r][3]);
  }
}

TEST_CASE("comm: the flat forms of ZeRO's buckets, in place and not, both forms, fp32 and bf16", "[comm]") {
  const bool legacy = GENERATE(false, true);
  const at::ScalarType dtype = GENERATE(at::kFloat, at::kBFloat16);
  INFO((legacy ? "legacy forms" : "default forms") << ", " << c10::toString(dtype));
  const at::Tensor both[2] = {input_of(0, dtype).view(-1), input_of(1, dtype).view(-1)};
  const at::Tensor sum = (both[0].to(at::kFloat) + both[1].to(at::kFloat)).to(dtype);
  bool ok[2][3] = {};
  on_two_members(legacy, "flat", [&](Group& g) {
    const int r = g.rank();
    const int64_t n = both[r].numel() / 2;
    // Reduce-scatter: the sum's slice r into shard.
    at::Tensor flat = both[r].clone(), shard = at::empty({n}, flat.options());
    g.reduce_scatter_async(flat, shard).wait();
    ok[r][0] = same(shard, sum.narrow(0, r * n, n));
    // All-gather with the shard in place as this member's slice of the output.
    at::Tensor out = at::zeros({2 * n}, flat.options());
    out.narrow(0, r * n, n).copy_(shard);
    at::Tensor in_place = out.narrow(0, r * n, n);
    g.all_gather_async(out, in_place).wait();
    ok[r][1] = same(out, sum);
    // And from a separate shard.
    at::Tensor separate = at::zeros({2 * n}, flat.options());
    g.all_gather_async(separate, both[r].narrow(0, 0, n)).wait();
    ok[r][2] = same(separate, at::cat({both[0].narrow(0, 0, n), both[1].narrow(0, 0, n)}));
  });
  for (int r = 0; r < 2; ++r) {
    INFO("member " << r);
    CHECK(ok[r][0]);
    CHECK(ok[r][1]);
    CHECK(ok[r][2]);
  }
}

TEST_CASE("comm: all-to-all with uneven split sizes (the MoE dispatcher's), fp32 and bf16", "[comm]") {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    on_two_members(false, std::string("a2a-") + c10::toString(dtype), [&](Group& g) {
      // Member 0 sends 1 row to itself and 3 to member 1; member 1 sends 2 to member 0 and 0 to itself.
      const std::vector<std::vector<int64_t>> send = {{1, 3}, {2, 0}};
      const int r = g.rank();
      at::Tensor in = input_of(r, dtype).narrow(0, 0, send[r][0] + send[r][1]);
      std::vector<int64_t> recv = {send[0][r], send[1][r]};
      at::Tensor out = g.all_to_all(in, send[r], recv);
      at::Tensor from0 = input_of(0, dtype).narrow(0, r == 0 ? 0 : 1, send[0][r]);
      at::Tensor from1 = input_of(1, dtype).narrow(0, r == 0 ? 0 : 2, send[1][r]);
      CHECK(same(out, at::cat({from0, from1}, 0)));
    });
  }
}

namespace {
// The local addresses (hex, as /proc/net/tcp and tcp6 write them) that listen on `port`.
std::vector<std::string> listening_addresses(int port) {
  char suffix[8];
  std::snprintf(suffix, sizeof suffix, ":%04X", port);
  std::vector<std::string> found;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the heading
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      if (state == "0A" && local.size() > 5 && local.substr(local.size() - 5) == suffix)
        found.push_back(local.substr(0, local.size() - 5));
    }
  }
  return found;
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(fd);
  return ntohs(a.sin_port);
}
}  // namespace

TEST_CASE("store: rank 0's TCPStore listens on MASTER_ADDR alone under LibTorch 2.x, on every interface under 1.13",
          "[store]") {
  dplan::executor::Place place;
  place.world = 2;
  place.master_addr = "127.0.0.1";
  place.master_port = free_port();
  const auto store = dplan::executor::connect_store(place, true, std::chrono::seconds(5));
  const std::vector<std::string> addresses = listening_addresses(place.master_port);
  INFO("port " << place.master_port);
  REQUIRE(addresses.size() == 1);
#if TORCH_VERSION_MAJOR >= 2
  CHECK(addresses[0] == "0100007F");  // 127.0.0.1
#else
  CHECK(addresses[0] != "0100007F");  // the wildcard address, v4 or v6
#endif
}
