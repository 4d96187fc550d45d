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

}  // namespace
}  // namespace tern
