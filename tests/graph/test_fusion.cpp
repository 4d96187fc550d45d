// Fusion: the patterns of fusion.h on small graphs, and the fusion rate of
// a 12-layer GPT-2-small training step with every unfused op named with its
// reason. Issue 6 asks a rate >= 0.6; with the patterns the kernels run
// today it is 0.560 (438 of 782 ops; docs/graph.md lists the rest: mostly
// output views for the head merge and the backward's head transposes and
// pads). The floor below guards what is there.
#include <gtest/gtest.h>

#include <iostream>
#include <set>

#include "graph/autodiff.h"
#include "graph/fusion.h"
#include "graph/models.h"

namespace tern::graph {
namespace {

TEST(Fusion, Gpt2SmallTrainingStep) {
  Model m = gpt2({});
  const auto grads = add_backward(m.graph, m.loss, m.params);
  for (const auto& [p, d] : grads) m.graph.mark_output(d);
  const FusionReport r = fuse(m.graph);
  if (std::getenv("TERN_SHOW_FUSION")) std::cout << fusion_table(m.graph, r);
  EXPECT_GE(r.rate(), 0.55) << fusion_table(m.graph, r);
  EXPECT_EQ(r.ops, 782);
  for (std::size_t n = 0; n < m.graph.nodes().size(); ++n) {
    if (r.group_of[n] < 0) continue;
    if (r.groups[static_cast<std::size_t>(r.group_of[n])].nodes.size() == 1) {
      EXPECT_FALSE(r.alone[n].empty()) << "node " << n;
    }
  }
}

// Attention reads q, k, v of the fused qkv projection through head views:
// the slices, reshapes and transposes join the attention group, count as
// fused, and name their source and column; attention itself stays alone.
TEST(Fusion, AttentionHeadViews) {
  Gpt2Config c;
  c.layers = 2, c.dim = 128, c.heads = 2, c.vocab = 97, c.seq = 64, c.batch = 2;
  Model m = gpt2(c);
  for (const auto& [p, d] : add_backward(m.graph, m.loss, m.params)) m.graph.mark_output(d);
  const FusionReport r = fuse(m.graph);
  ASSERT_EQ(r.views.size(), 6u);  // q, k, v of two layers
  std::set<std::int64_t> cols;
  for (const auto& [v, hv] : r.views) {
    EXPECT_EQ(m.graph.value(hv.source).shape, (Shape{2, 64, 384}));
    EXPECT_EQ(hv.heads, 2);
    EXPECT_EQ(hv.head_dim, 64);
    cols.insert(hv.col0);
  }
  EXPECT_EQ(cols, (std::set<std::int64_t>{0, 128, 256}));
  for (std::size_t n = 0; n < m.graph.nodes().size(); ++n) {
    const Op op = m.graph.nodes()[n].op;
    const KernelGroup& g = r.groups[static_cast<std::size_t>(r.group_of[n])];
    if (op == Op::attention) {
      EXPECT_EQ(g.nodes.size(), 10u);  // 3 x (slice, reshape, transpose) + attention
      EXPECT_FALSE(r.alone[n].empty());
    }
    if (r.alias.contains(m.graph.nodes()[n].outputs[0])) {
      EXPECT_TRUE(r.alone[n].empty());
    }
  }
}

// Each pattern on a small graph: what lands in one kernel.
TEST(Fusion, Patterns) {
  Graph g("p");
  const int x = g.input("x", {4, 8}, DType::bf16), w = g.param("w", {8, 8}, DType::bf16);
  const int b = g.param("b", {8}, DType::bf16), r = g.input("r", {4, 8}, DType::bf16);
  // matmul + bias + gelu + residual: one kernel.
  const int y = g.add(g.act(Op::gelu, g.add(g.matmul(x, w), b)), r);
  // attention pattern: matmul(q, k^T) -> scale -> softmax -> matmul(., v).
  const int q = g.input("q", {2, 4, 8}, DType::bf16), k = g.input("k", {2, 4, 8}, DType::bf16);
  const int v = g.input("v", {2, 4, 8}, DType::bf16);
  const int o = g.matmul(g.softmax(g.scale(g.matmul(q, k, false, true), 0.35)), v);
  // GLU: silu(a) * u; norm with the residual add before it and a cast after.
  const int glu = g.mul(g.act(Op::silu, x), r);
  const int h = g.add(y, glu);
  const int n = g.cast(g.rmsnorm(h, g.param("gn", {8}, DType::bf16)), DType::fp8_e4m3);
  // An elementwise chain.
  const int e = g.scale(g.sub(g.mul(x, r), r), 2.0);
  for (int out : {o, n, h, e}) g.mark_output(out);
  const FusionReport f = fuse(g);
  auto group_of = [&](int value) {
    return f.groups[static_cast<std::size_t>(
        f.group_of[static_cast<std::size_t>(g.value(value).node)])];
  };
  EXPECT_EQ(group_of(y).kernel, "matmul");
  EXPECT_EQ(group_of(y).nodes.size(), 4u);
  EXPECT_EQ(group_of(y).detail, "bias, gelu, residual");
  EXPECT_EQ(group_of(o).kernel, "flash_attention");
  EXPECT_EQ(group_of(o).nodes.size(), 4u);
  EXPECT_EQ(group_of(glu).kernel, "glu");
  EXPECT_EQ(group_of(n).kernel, "rmsnorm");
  EXPECT_EQ(group_of(n).detail, "residual add, cast");
  EXPECT_EQ(group_of(e).kernel, "elementwise");
  EXPECT_EQ(group_of(e).nodes.size(), 3u);
  EXPECT_EQ(f.ops, 16);
  EXPECT_EQ(f.fused, 16);
}

// A matmul whose output another kernel also reads keeps its epilogue out.
TEST(Fusion, SharedIntermediatesStayOut) {
  Graph g("s");
  const int x = g.input("x", {4, 8}, DType::bf16), w = g.param("w", {8, 8}, DType::bf16);
  const int m = g.matmul(x, w);
  const int a = g.act(Op::relu, m);
  g.mark_output(a);
  g.mark_output(m);  // m leaves the kernel: relu cannot be its epilogue
  const FusionReport f = fuse(g);
  EXPECT_EQ(f.fused, 0);
  EXPECT_EQ(f.groups.size(), 2u);
  EXPECT_NE(f.alone[static_cast<std::size_t>(g.value(m).node)].find("epilogue"), std::string::npos);
}

}  // namespace
}  // namespace tern::graph
