// Collectives on several simulated chips: the values every chip ends with
// (reduced in FP32 in group order, rounded once) and the simulated time the
// fabric model gives for the group's placement.
#include <gtest/gtest.h>

#include <numeric>

#include "arch/system.h"
#include "num/convert.h"
#include "runtime/system.h"
#include "util/error.h"

namespace tern::runtime {
namespace {

using fabric::Op;

std::vector<int> iota(int n, int from = 0) {
  std::vector<int> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

// Chip c's buffer: distinct, exactly representable values.
std::vector<float> values_of(int chip, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(chip) * 0.25f + static_cast<float>(i % 97) - 40;
  return v;
}

Nanoseconds fabric_time(const System& s, Op op, std::int64_t bytes, const std::vector<int>& g) {
  return fabric::best(s.network(), fabric::Collective{op, Bytes(bytes), s.placement(g)}).time;
}

class Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Collectives, AllReduceGivesTheSumAndTheFabricTime) {
  const int p = GetParam();
  System s(arch::load_system("trn3-ultraserver-gen1"), 16);
  const std::size_t n = 1024;
  for (int c = 0; c < p; ++c) s.write(c, "g", values_of(c, n));
  s.all_reduce("g", {iota(p)});
  std::vector<float> want(n, 0);
  for (int c = 0; c < p; ++c) {
    const auto v = values_of(c, n);
    for (std::size_t i = 0; i < n; ++i) want[i] += v[i];
  }
  for (int c = 0; c < p; ++c) EXPECT_EQ(s.read(c, "g"), want) << "chip " << c;
  const Nanoseconds t = fabric_time(s, Op::all_reduce, 4 * n, iota(p));
  for (int c = 0; c < p; ++c) EXPECT_DOUBLE_EQ(s.clock(c).value(), t.value());
  EXPECT_EQ(s.clock(p < 16 ? p : 0).value(), p < 16 ? 0 : t.value());  // outsiders wait
}

TEST_P(Collectives, GatherScatterAndAllToAllMoveTheBlocks) {
  const int p = GetParam();
  System s(arch::load_system("trn2-48xl"), 16);  // a 4 x 4 torus
  const std::size_t k = 8;
  const auto g = iota(p);
  for (int c = 0; c < p; ++c)
    s.write(c, "x", values_of(c, k * static_cast<std::size_t>(p)), num::FormatId::bf16);
  s.all_to_all("x", "y", {g});
  for (int j = 0; j < p; ++j) {
    const auto y = s.read(j, "y");
    for (int i = 0; i < p; ++i) {
      const auto x = s.read(i, "x");
      for (std::size_t e = 0; e < k; ++e)
        EXPECT_EQ(y[static_cast<std::size_t>(i) * k + e], x[static_cast<std::size_t>(j) * k + e]);
    }
  }
  s.all_gather("x", "all", {g});
  const auto all = s.read(p - 1, "all");
  ASSERT_EQ(all.size(), k * p * p);
  EXPECT_EQ(std::vector<float>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k * p)),
            s.read(0, "x"));
  s.reduce_scatter("x", "part", {g});
  for (int r = 0; r < p; ++r) {
    const auto part = s.read(r, "part");
    ASSERT_EQ(part.size(), k);
    for (std::size_t e = 0; e < k; ++e) {
      float sum = 0;  // FP32 in group order, one BF16 rounding
      for (int c = 0; c < p; ++c) sum += s.read(c, "x")[static_cast<std::size_t>(r) * k + e];
      EXPECT_EQ(part[e], num::round_to(num::format(num::FormatId::bf16), sum));
    }
  }
  // Each collective's time is the fabric's for its size and placement,
  // one after another on the same chips.
  const std::int64_t in_bytes = 2 * static_cast<std::int64_t>(k) * p;
  const double want = (fabric_time(s, Op::all_to_all, in_bytes, g) +
                       fabric_time(s, Op::all_gather, in_bytes * p, g) +
                       fabric_time(s, Op::reduce_scatter, in_bytes, g))
                          .value();
  EXPECT_DOUBLE_EQ(s.clock(0).value(), want);
}

INSTANTIATE_TEST_SUITE_P(Chips, Collectives, ::testing::Values(2, 4, 16));

TEST(Collectives, HandComputedAllReduceOnOneSwitch) {
  // 16 Trn3 chips on the in-server NeuronSwitch: 256 GB/s both ways = 128
  // one way, 1.9 us per step. 4 MiB fp32 all-reduce, direct (the cheapest):
  // 2 (alpha + 15/16 n / B).
  System s(arch::load_system("trn3-ultraserver-gen1"), 16);
  const std::size_t n = 1 << 20;
  for (int c = 0; c < 16; ++c) s.write(c, "g", std::vector<float>(n, 1.0f));
  s.all_reduce("g", {iota(16)});
  const double bytes = 4.0 * n;
  EXPECT_DOUBLE_EQ(s.clock(3).value(), 2 * (1900 + 15.0 / 16 * bytes / 128));
  EXPECT_EQ(s.events().back().algorithm, fabric::Algorithm::direct);
  EXPECT_EQ(s.read(5, "g")[7], 16.0f);
}

TEST(Collectives, ClocksSynchronizeAndGroupsRunSideBySide) {
  System s(arch::load_system("dgx-a100"), 16);  // 2 nodes of 8
  for (int c = 0; c < 16; ++c) s.write(c, "g", std::vector<float>(256, static_cast<float>(c)));
  s.advance(0, Nanoseconds(5000));
  // Two groups across the nodes, {0, 8} and {1, 9}: one GPU per node, over
  // InfiniBand.
  s.all_reduce("g", {{0, 8}, {1, 9}}, ReduceOp::max);
  EXPECT_EQ(s.placement({0, 8}).span, (std::vector<int>{1, 2}));
  const double t = fabric_time(s, Op::all_reduce, 1024, {0, 8}).value();
  EXPECT_DOUBLE_EQ(s.clock(8).value(), 5000 + t);  // waited for chip 0
  EXPECT_DOUBLE_EQ(s.clock(9).value(), t);
  EXPECT_EQ(s.read(0, "g")[0], 8.0f);
  EXPECT_EQ(s.read(1, "g")[0], 9.0f);
  s.send_recv(2, "g", 10, "from2");
  EXPECT_EQ(s.read(10, "from2")[0], 2.0f);
  // 1 KiB over one InfiniBand NIC share: 9.6 us + 1024 B / 25 GB/s.
  EXPECT_DOUBLE_EQ(s.clock(10).value(), 9600 + 1024 / 25.0);
}

TEST(Collectives, AsyncCollectivesOverlapComputeOnTheCollectiveEngines) {
  System s(arch::load_system("trn3-ultraserver-gen1"), 16);
  const std::size_t n = 1 << 20;  // 4 MiB fp32
  for (int c = 0; c < 4; ++c) s.write(c, "g", std::vector<float>(n, 1.0f));
  const auto g = iota(4);
  const double t = fabric_time(s, Op::all_reduce, 4 * n, g).value();
  const Handle h = s.all_reduce("g", {g}, ReduceOp::sum, Launch::async);
  EXPECT_THROW(s.read(0, "g"), Error);  // not waited for: the hardware would race
  // Compute shorter than the transfer on chip 0, longer on chip 1.
  s.advance(0, Nanoseconds(t / 4));
  s.advance(1, Nanoseconds(2 * t));
  s.wait(h);
  EXPECT_DOUBLE_EQ(s.clock(0).value(), t);      // waited for the transfer
  EXPECT_DOUBLE_EQ(s.clock(1).value(), 2 * t);  // fully hidden
  EXPECT_EQ(s.read(0, "g")[0], 4.0f);
  // Two async collectives on the same chips queue on their engines; the
  // second may not read what the first has yet to deliver.
  for (int c : {2, 3}) s.write(c, "h", std::vector<float>(n, 2.0f));
  const Handle a = s.all_reduce("g", {{2, 3}}, ReduceOp::sum, Launch::async);
  EXPECT_THROW(s.all_reduce("g", {{2, 3}}, ReduceOp::sum, Launch::async), Error);
  const Handle b = s.all_reduce("h", {{2, 3}}, ReduceOp::sum, Launch::async);
  const double t2 = fabric_time(s, Op::all_reduce, 4 * n, {2, 3}).value();
  s.wait(b, 2);
  EXPECT_DOUBLE_EQ(s.clock(2).value(), t + 2 * t2);
  EXPECT_THROW(s.wait(b, 2), Error);  // waited already
  s.wait(a);
  s.wait(b, 3);
  EXPECT_DOUBLE_EQ(s.clock(3).value(), t + 2 * t2);
  EXPECT_THROW(s.wait(12345), Error);
  // The timeline: one process per chip, compute and collectives on their
  // own tracks, the collective's span as long as the fabric's time.
  const auto j = profile::chrome_trace(s.trace());
  int collectives_on_chip0 = 0, compute_on_chip1 = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    if (e["pid"] == 0 && e["cat"] == "collectives") {
      ++collectives_on_chip0;
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), t / 1e3);
      EXPECT_EQ(e["name"], "all-reduce");
    }
    if (e["pid"] == 1 && e["cat"] == "compute") ++compute_on_chip1;
  }
  EXPECT_EQ(collectives_on_chip0, 1);
  EXPECT_EQ(compute_on_chip1, 1);
}

TEST(Collectives, BadGroupsAndBuffersAreErrors) {
  System s(arch::load_system("dgx-a100"), 16);
  for (int c = 0; c < 16; ++c) s.write(c, "g", std::vector<float>(4, 1.0f));
  s.write(3, "odd", std::vector<float>(5, 1.0f));
  EXPECT_THROW(s.all_reduce("g", {{0, 1, 8}}), NotSupported);  // 2 in one node, 1 in the other
  EXPECT_THROW(s.all_reduce("g", {{0, 1}, {1, 2}}), Error);    // chip 1 twice
  EXPECT_THROW(s.all_reduce("g", {{0, 16}}), Error);           // no chip 16
  EXPECT_THROW(s.all_reduce("nope", {{0, 1}}), Error);
  s.write(4, "odd", std::vector<float>(4, 1.0f));
  EXPECT_THROW(s.all_reduce("odd", {{3, 4}}), Error);  // 5 vs 4 elements
  // Nothing moved and no clock changed for a failed call, even when only a
  // later group is bad.
  EXPECT_THROW(s.all_reduce("g", {{0, 1}, {2, 3, 8}}), NotSupported);
  EXPECT_EQ(s.read(0, "g")[0], 1.0f);
  EXPECT_EQ(s.clock(0).value(), 0);
  EXPECT_THROW(s.reduce_scatter("odd", "o", {{3, 2}}), Error);  // 5 elements, 2 blocks
  EXPECT_NO_THROW(s.reduce_scatter("odd", "o", {{3}}));         // a group of one: a copy
  EXPECT_EQ(s.read(3, "o").size(), 5u);
  EXPECT_THROW(s.write(0, "e4m3", std::vector<float>(4, 1.0f), num::FormatId::e4m3), NotSupported);
}

}  // namespace
}  // namespace tern::runtime
