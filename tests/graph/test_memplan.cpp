// HBM planning: lifetimes, reuse and the fit check on hand-computable graphs.
#include <gtest/gtest.h>

#include "common/expect_error.h"
#include "graph/autodiff.h"
#include "graph/memplan.h"
#include "graph/models.h"
#include "util/error.h"

namespace tern::graph {
namespace {

// x -> t1 -> t2 -> t3 (transposes run alone): t3 reuses t1's memory.
TEST(MemoryPlan, ReusesMemoryOfDeadValues) {
  Graph g("chain");
  const int x = g.input("x", {64, 64}, DType::fp32);  // 16 KiB
  const int t1 = g.transpose(x, {1, 0}), t2 = g.transpose(t1, {1, 0});
  const int t3 = g.transpose(t2, {1, 0});
  g.mark_output(t3);
  const FusionReport f = fuse(g);
  ASSERT_EQ(f.groups.size(), 3u);
  const MemoryPlan p = plan_memory(g, f);
  const std::int64_t S = 64 * 64 * 4;
  EXPECT_EQ(p.persistent_bytes, S);
  EXPECT_EQ(p.arena_bytes, 3 * S);  // x, then t1 / t3 sharing one slot, t2
  EXPECT_EQ(p.transient_peak, 2 * S);
  std::map<int, Buffer> by;
  for (const Buffer& b : p.buffers) by[b.value] = b;
  EXPECT_EQ(by[t1].offset, S);
  EXPECT_EQ(by[t2].offset, 2 * S);
  EXPECT_EQ(by[t3].offset, S);
  EXPECT_EQ(by[t1].first, 0);
  EXPECT_EQ(by[t1].last, 1);
  EXPECT_EQ(by[t3].last, 2);
}

// Fused intermediates take no HBM; reshapes alias their input.
TEST(MemoryPlan, FusedIntermediatesAndViewsTakeNoMemory) {
  Graph g("fused");
  const int x = g.input("x", {128, 256}, DType::bf16), w = g.param("w", {256, 256}, DType::bf16);
  const int b = g.param("b", {256}, DType::bf16);
  const int y = g.act(Op::gelu, g.add(g.matmul(x, w), b));
  g.mark_output(g.reshape(y, {256, 128}));
  const MemoryPlan p = plan_memory(g, fuse(g));
  EXPECT_EQ(p.buffers.size(), 4u);  // x, w, b, y
  EXPECT_EQ(p.arena_bytes, (128 * 256 + 256 * 256 + 256 + 128 * 256) * 2);
}

TEST(MemoryPlan, TooBigForTheChipNamesTheLargestTensors) {
  Gpt2Config c;
  c.layers = 48, c.dim = 6144, c.heads = 48, c.seq = 2048, c.batch = 16;
  Model m = gpt2(c);
  for (const auto& [p, d] : add_backward(m.graph, m.loss, m.params)) m.graph.mark_output(d);
  const MemoryPlan p = plan_memory(m.graph, fuse(m.graph), {12});
  test_util::expect_error(
      [&] { check_fits(m.graph, p, std::int64_t{144} << 30, "trn3 (144 GiB)"); },
      {"does not fit trn3 (144 GiB)", "largest tensors: %"});
  // GPT-2 small with batch 4 x 1024 fits easily.
  Model s = gpt2({});
  for (const auto& [p2, d] : add_backward(s.graph, s.loss, s.params)) s.graph.mark_output(d);
  const MemoryPlan ps = plan_memory(s.graph, fuse(s.graph), {12});
  EXPECT_NO_THROW(check_fits(s.graph, ps, std::int64_t{144} << 30, "trn3"));
  EXPECT_EQ(ps.param_elements, 124475904);  // GPT-2 small, vocab padded to 50304
}

}  // namespace
}  // namespace tern::graph
