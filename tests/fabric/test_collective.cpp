// Collective times against hand-computed alpha-beta formulas
// (src/fabric/collective.h states them; docs/plan.md derives them).
#include <gtest/gtest.h>

#include "arch/system.h"
#include "fabric/collective.h"
#include "util/error.h"

namespace tern::fabric {
namespace {

using arch::Topology;

Level level(Topology t, std::vector<int> dims, double gbps, double latency_ns) {
  return Level{"l", t, std::move(dims), gigabytes_per_second(gbps), Nanoseconds(latency_ns)};
}

double t(const Network& net, Op op, std::int64_t n, std::vector<int> span, Algorithm a) {
  return time(net, Collective{op, Bytes(n), Group{std::move(span)}}, a).value();
}

// One switch of 8 chips, 100 GB/s (100 bytes/ns) each way, 1 us per step.
const Network kSwitch8({level(Topology::switched, {8}, 100, 1000)});

TEST(Collective, RingOnOneSwitch) {
  // all-reduce: 2 (p-1) alpha + 2 (p-1)/p n/B = 14 us + 14 us.
  EXPECT_DOUBLE_EQ(t(kSwitch8, Op::all_reduce, 800000, {8}, Algorithm::ring), 28000);
  // all-gather and reduce-scatter: half of that.
  EXPECT_DOUBLE_EQ(t(kSwitch8, Op::all_gather, 800000, {8}, Algorithm::ring), 14000);
  EXPECT_DOUBLE_EQ(t(kSwitch8, Op::reduce_scatter, 800000, {8}, Algorithm::ring), 14000);
  // all-to-all by pairwise exchange through the switch: 7 steps of n/8.
  EXPECT_DOUBLE_EQ(t(kSwitch8, Op::all_to_all, 800000, {8}, Algorithm::ring), 14000);
}

TEST(Collective, OtherAlgorithmsOnOneSwitch) {
  // tree: 2 ceil(log2 p) alpha + 2 n/B.
  EXPECT_DOUBLE_EQ(t(kSwitch8, Op::all_reduce, 800000, {8}, Algorithm::tree), 6000 + 16000);
  // halving-doubling: 2 log2 p alpha + 2 (p-1)/p n/B.
  EXPECT_DOUBLE_EQ(t(kSwitch8, Op::all_reduce, 800000, {8}, Algorithm::halving_doubling),
                   6000 + 14000);
  // Bruck all-to-all: log2 p alpha + log2 p / 2 n/B.
  EXPECT_DOUBLE_EQ(t(kSwitch8, Op::all_to_all, 800000, {8}, Algorithm::halving_doubling),
                   3000 + 12000);
  // direct: one step, (p-1)/p n/B; all-reduce twice.
  EXPECT_DOUBLE_EQ(t(kSwitch8, Op::all_gather, 800000, {8}, Algorithm::direct), 1000 + 7000);
  EXPECT_DOUBLE_EQ(t(kSwitch8, Op::all_reduce, 800000, {8}, Algorithm::direct), 16000);
  // send/recv: alpha + n/B.
  EXPECT_DOUBLE_EQ(t(kSwitch8, Op::send_recv, 800000, {2}, Algorithm::direct), 9000);
  EXPECT_THROW(t(kSwitch8, Op::all_gather, 800000, {8}, Algorithm::tree), NotSupported);
  EXPECT_THROW(t(kSwitch8, Op::all_reduce, 800000, {8}, Algorithm::hierarchical), NotSupported);
  EXPECT_THROW(t(kSwitch8, Op::all_reduce, 800000, {9}, Algorithm::ring), Error);  // 9 > 8
}

TEST(Collective, BestPicksTheFastestAndSmallMessagesPreferFewSteps) {
  const Cost c = best(kSwitch8, Collective{Op::all_reduce, Bytes(800000), Group{{8}}});
  EXPECT_EQ(c.algorithm, Algorithm::direct);
  EXPECT_DOUBLE_EQ(c.time.value(), 16000);
  // A group of one costs nothing.
  EXPECT_DOUBLE_EQ(
      best(kSwitch8, Collective{Op::all_reduce, Bytes(800000), Group{{1}}}).time.value(), 0);
}

// Two levels: 8 chips per node at 100 GB/s, 4 nodes at 10 GB/s per chip.
const Network kTwo({level(Topology::switched, {8}, 100, 1000),
                    level(Topology::switched, {4}, 10, 5000)});

TEST(Collective, HierarchicalBeatsAFlatRingAcrossNodes) {
  const std::int64_t n = 3200000;
  // Flat ring: slowest step and link: 2*31*5 us + 2*31/32 * 3.2 MB / 10.
  EXPECT_DOUBLE_EQ(t(kTwo, Op::all_reduce, n, {8, 4}, Algorithm::ring), 310000 + 620000);
  // Hierarchical: reduce-scatter in the node (direct: 1 us + 7/8 n/100 =
  // 29 us), all-reduce of n/8 across 4 nodes (direct: 2 (5 us + 3/4 *
  // 400 kB / 10) = 70 us), all-gather in the node (29 us).
  EXPECT_DOUBLE_EQ(t(kTwo, Op::all_reduce, n, {8, 4}, Algorithm::hierarchical), 128000);
  // Direct across both: the inter-node links carry 8*3 of 32 shares.
  EXPECT_DOUBLE_EQ(t(kTwo, Op::all_reduce, n, {8, 4}, Algorithm::direct), 2 * (5000 + 240000));
  const Cost c = best(kTwo, Collective{Op::all_reduce, Bytes(n), Group{{8, 4}}});
  EXPECT_EQ(c.algorithm, Algorithm::hierarchical);
  // A group with one rank per node uses only the slow level.
  EXPECT_DOUBLE_EQ(t(kTwo, Op::all_gather, 400000, {1, 4}, Algorithm::ring), 15000 + 30000);
}

TEST(Collective, RingAndTorusTopologies) {
  // Ring of 4: all-to-all over min(k, p-k) hops: 3 alpha + (1+2+1) n/(p B).
  const Network ring({level(Topology::ring, {4}, 100, 1000)});
  EXPECT_DOUBLE_EQ(t(ring, Op::all_to_all, 400000, {4}, Algorithm::ring), 3000 + 4000);
  EXPECT_THROW(t(ring, Op::all_reduce, 400000, {4}, Algorithm::direct), NotSupported);
  // A 4 x 4 torus: a Hamiltonian ring has half the chip's bandwidth:
  // 2*15 alpha + 2*15/16 * 1.6 MB / 50 = 30 us + 60 us.
  const Network torus({level(Topology::torus2d, {4, 4}, 100, 1000)});
  EXPECT_DOUBLE_EQ(t(torus, Op::all_reduce, 1600000, {16}, Algorithm::ring), 90000);
  // 2D: reduce-scatter on x (3 us + 3/4 * 1.6 MB / 100 = 15 us), all-reduce
  // of n/4 on y (6 us + 6 us), all-gather on x (15 us).
  EXPECT_DOUBLE_EQ(t(torus, Op::all_reduce, 1600000, {16}, Algorithm::hierarchical), 42000);
  // A neighbour message gets one of four links: alpha + n / (B/4).
  EXPECT_DOUBLE_EQ(t(torus, Op::send_recv, 800000, {2}, Algorithm::direct), 1000 + 32000);
}

TEST(Collective, Exposed) {
  EXPECT_DOUBLE_EQ(exposed(Nanoseconds(100), Nanoseconds(80), 0.5).value(), 60);
  EXPECT_DOUBLE_EQ(exposed(Nanoseconds(100), Nanoseconds(300), 1).value(), 0);
  EXPECT_THROW(exposed(Nanoseconds(1), Nanoseconds(1), 1.5), Error);
}

TEST(Network, FromSystemFiles) {
  const auto a100 = arch::load_system("dgx-a100");
  // NCCL on A100 offers ring and tree only: the others are not chosen, and
  // asking for one by name says why.
  {
    const Network net = Network::of(a100, 8);
    const Collective c{Op::all_reduce, Bytes(1 << 20), Group{{8}}};
    EXPECT_THROW(time(net, c, Algorithm::direct), NotSupported);
    const Cost b = best(net, c);
    EXPECT_TRUE(b.algorithm == Algorithm::ring || b.algorithm == Algorithm::tree);
    EXPECT_EQ(placement(net, {0, 2, 4, 6}).span, (std::vector<int>{4}));
    EXPECT_THROW(placement(net, {0, 9}), Error);
  }
  const Network one = Network::of(a100, 8);
  ASSERT_EQ(one.levels().size(), 1u);
  const Network cluster = Network::of(a100, 32);
  ASSERT_EQ(cluster.levels().size(), 2u);
  EXPECT_EQ(cluster.levels()[1].size(), 4);
  EXPECT_DOUBLE_EQ(cluster.levels()[1].bandwidth.value(), 25);  // 200 GB/s per 8 GPUs
  EXPECT_EQ(Network::of(a100, 4).chips(), 4);
  EXPECT_THROW(Network::of(a100, 12), Error);
  // A whole torus row of a trn2.48xlarge is a ring with half the links.
  const Network row = Network::of(arch::load_system("trn2-48xl"), 4);
  EXPECT_EQ(row.levels()[0].topology, Topology::ring);
  EXPECT_DOUBLE_EQ(row.levels()[0].bandwidth.value(), 256);
  // 32 trn1.32xlarge over EFA: 800 Gbps per 16-chip instance, 6.25 GB/s a chip.
  const Network trn1 = Network::of(arch::load_system("trn1-32xl"), 512);
  ASSERT_EQ(trn1.levels().size(), 2u);
  EXPECT_EQ(trn1.levels()[1].size(), 32);
  EXPECT_DOUBLE_EQ(trn1.levels()[1].bandwidth.value(), 6.25);
  EXPECT_THROW(Network::of(arch::load_system("trn1-32xl"), 24), Error);  // not whole instances
}

}  // namespace
}  // namespace tern::fabric
