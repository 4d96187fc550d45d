// The builder inserts exactly the semaphore waits that RAW, WAR and WAW
// hazards need between engines and DMA queues.
#include <gtest/gtest.h>

#include "arch/chip.h"
#include "kernel/builder.h"
#include "sim/simulator.h"

namespace tern {
namespace {

using isa::DType;
using isa::Engine;

TEST(Builder, LoadComputeStoreIsOrdered) {
  const auto chip = arch::load_chip("trn3");
  kernel::Builder b(chip);
  const auto in = b.hbm("in", {128, 64}, DType::fp32, isa::TensorKind::input);
  const auto out = b.hbm("out", {128, 64}, DType::fp32, isa::TensorKind::output);
  const auto t = b.sbuf(128, 64, DType::fp32);
  const auto u = b.sbuf(128, 64, DType::fp32);
  b.dma_copy(t, in, 0);                               // queue 0 -> semaphore 4
  b.tensor_scalar(u, t, isa::AluOp::multiply, 2.0f);  // RAW on t: waits queue 0
  b.dma_copy(out, u, 1);                              // RAW on u: waits vector (sem 1)
  b.dma_copy(t, in, 2);                               // WAR on t: waits vector's read
  const isa::Program p = b.finish();
  const auto& sync = p.cores[0].streams[static_cast<int>(Engine::sync)];
  const auto& vec = p.cores[0].streams[static_cast<int>(Engine::vector)];
  ASSERT_EQ(vec.size(), 1u);
  EXPECT_EQ(vec[0].waits, (std::vector<isa::SemWait>{{4, 1}}));
  EXPECT_EQ(vec[0].signals, (std::vector<int>{1}));
  ASSERT_EQ(sync.size(), 3u);
  EXPECT_TRUE(sync[0].waits.empty());
  EXPECT_EQ(sync[1].waits, (std::vector<isa::SemWait>{{1, 1}}));
  // WAR on t against the vector op is already covered (the sync engine waited
  // for it); the WAW against the first load on another queue is explicit.
  EXPECT_EQ(sync[2].waits, (std::vector<isa::SemWait>{{4, 1}}));
  // And it computes the right thing.
  sim::Simulator s(chip);
  s.load(p);
  std::vector<float> x(128 * 64);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  s.write("in", x);
  s.run();
  const auto y = s.read("out");
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], 2.0f * x[i]);
}

TEST(Builder, IndependentWorkGetsNoWaits) {
  const auto chip = arch::load_chip("trn3");
  kernel::Builder b(chip);
  const auto a = b.sbuf(128, 64, DType::fp32);
  const auto c = b.sbuf(128, 64, DType::fp32);
  b.memset(a, 1.0f, Engine::vector);
  b.memset(c, 2.0f, Engine::gpsimd);                          // different tile: no wait
  b.tensor_tensor(c, a, c, isa::AluOp::add, Engine::vector);  // RAW on c from gpsimd
  const isa::Program p = b.finish();
  EXPECT_TRUE(p.cores[0].streams[static_cast<int>(Engine::gpsimd)][0].waits.empty());
  EXPECT_EQ(p.cores[0].streams[static_cast<int>(Engine::vector)][1].waits,
            (std::vector<isa::SemWait>{{static_cast<int>(Engine::gpsimd), 1}}));
}

TEST(Builder, MatmulAccountsTheWeightLoadToTheMultiply) {
  const auto chip = arch::load_chip("trn3");
  kernel::Builder b(chip);
  const auto w = b.sbuf(128, 128, DType::bf16);
  const auto x = b.sbuf(128, 512, DType::bf16);
  const auto o = b.psum(128, 512);
  b.memset(w, 1.0f);
  b.memset(x, 1.0f);
  b.matmul(o, w, x, false);
  b.memset(w, 3.0f);  // WAR on the stationary: must wait for the multiply
  const isa::Program p = b.finish();
  const auto& t = p.cores[0].streams[static_cast<int>(Engine::tensor)];
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].op, isa::Opcode::load_stationary);
  EXPECT_TRUE(t[0].signals.empty());
  EXPECT_EQ(t[0].waits, (std::vector<isa::SemWait>{{1, 2}}));  // both memsets
  EXPECT_EQ(t[1].signals, (std::vector<int>{0}));
  EXPECT_EQ(p.cores[0].streams[1][2].waits, (std::vector<isa::SemWait>{{0, 1}}));
}

// Two iterations of load -> compute -> store, the tiles freed after each:
// the second load's start time in ns.
double second_load_start(bool rotating, std::int64_t& second_offset) {
  const auto chip = arch::load_chip("trn1");
  kernel::Builder b(chip);
  b.set_rotating_allocation(rotating);
  const auto in = b.hbm("in", {256, 512}, DType::fp32, isa::TensorKind::input);
  const auto out = b.hbm("out", {256, 512}, DType::fp32, isa::TensorKind::output);
  for (int i = 0; i < 2; ++i) {
    const auto t = b.sbuf(128, 512, DType::fp32);
    if (i == 1) second_offset = t.ap.offset;
    b.dma_copy(t, in.tile(128 * i, 128, 0, 512), 2 * i);
    b.tensor_scalar(t, t, isa::AluOp::multiply, 2.0f);
    // The store is triggered by the Vector engine, so it does not hold up
    // the next load in the Sync engine's stream.
    b.dma_copy(out.tile(128 * i, 128, 0, 512), t, 2 * i + 1, false, Engine::vector);
    b.release(t);
  }
  sim::Simulator s(chip);
  s.load(b.finish());
  sim::Options o;
  o.mode = sim::Mode::timing;
  o.trace = true;
  const auto st = s.run(o);
  for (const auto& e : st.events)
    if (e.track == "dma q2") return e.start_ns;
  return -1;
}

TEST(Builder, RotatingAllocationReusesFreedMemoryLast) {
  // First fit puts the second iteration's tile where the first one was, so
  // its load waits for the first iteration's store (WAR); next fit places
  // it after the first (2 KiB a partition on) and the load starts at once.
  std::int64_t first_fit = -1, next_fit = -1;
  EXPECT_GT(second_load_start(false, first_fit), 0.0);
  EXPECT_EQ(first_fit, 0);
  EXPECT_EQ(second_load_start(true, next_fit), 0.0);
  EXPECT_EQ(next_fit, 2048);
  // When nothing is left after the last tile, next fit wraps to the start.
  const auto chip = arch::load_chip("trn1");
  kernel::Builder b(chip);
  b.set_rotating_allocation(true);
  const std::int64_t cap = chip.sbuf_partition_bytes.value();
  const auto a = b.sbuf(128, cap / 4 / 2, DType::fp32);  // the first half
  const auto c = b.sbuf(128, cap / 4 / 2, DType::fp32);  // the second half
  EXPECT_EQ(c.ap.offset, cap / 2);
  b.release(a);
  EXPECT_EQ(b.sbuf(128, 16, DType::fp32).ap.offset, 0);
}

}  // namespace
}  // namespace tern
