// Fusion: the patterns of fusion.h on small graphs, and the fusion rate of
// a 12-layer GPT-2-small training step with every unfused op named with its
// reason. The goal is a rate >= 0.6; with the patterns the kernels run
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
  EXPECT_GE(r.rate(), 0.6) << fusion_table(m.graph, r);
  EXPECT_EQ(r.qkv_grads.size(), 12u);
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
// fused, and name their source and column. The forward writes o straight
// into its head merge (the transpose joins it: stored_in) and the backward
// reads dO through a head view of its gradient.
TEST(Fusion, AttentionHeadViews) {
  Gpt2Config c;
  c.layers = 2, c.dim = 128, c.heads = 2, c.vocab = 97, c.seq = 64, c.batch = 2;
  Model m = gpt2(c);
  for (const auto& [p, d] : add_backward(m.graph, m.loss, m.params)) m.graph.mark_output(d);
  const FusionReport r = fuse(m.graph);
  ASSERT_EQ(r.views.size(), 8u);  // q, k, v and dO of two layers
  std::set<std::int64_t> cols;
  int grad_views = 0;
  for (const auto& [v, hv] : r.views) {
    EXPECT_EQ(hv.heads, 2);
    EXPECT_EQ(hv.head_dim, 64);
    if (m.graph.value(hv.source).shape == Shape{2, 64, 128}) {  // dO: [B, S, H D]
      ++grad_views;
      EXPECT_EQ(hv.col0, 0);
      continue;
    }
    EXPECT_EQ(m.graph.value(hv.source).shape, (Shape{2, 64, 384}));
    cols.insert(hv.col0);
  }
  EXPECT_EQ(grad_views, 2);
  EXPECT_EQ(cols, (std::set<std::int64_t>{0, 128, 256}));
  ASSERT_EQ(r.stored_in.size(), 2u);
  for (const auto& [o, buf] : r.stored_in) {
    const Node& t = m.graph.node(m.graph.value(buf).node);
    EXPECT_EQ(t.op, Op::transpose);
    EXPECT_EQ(t.inputs[0], o);
    EXPECT_EQ(m.graph.node(m.graph.value(o).node).op, Op::attention);
  }
  for (std::size_t n = 0; n < m.graph.nodes().size(); ++n) {
    const Op op = m.graph.nodes()[n].op;
    const KernelGroup& g = r.groups[static_cast<std::size_t>(r.group_of[n])];
    if (op == Op::attention) {
      // 3 x (slice, reshape, transpose) + attention + o's transpose
      EXPECT_EQ(g.nodes.size(), 11u);
      EXPECT_TRUE(r.alone[n].empty());
    }
    if (r.alias.contains(m.graph.nodes()[n].outputs[0])) {
      EXPECT_TRUE(r.alone[n].empty());
    }
  }
  // The backward writes dq, dk, dv into the qkv gradient: its 3 x (transpose,
  // reshape, pad) and the 2 adds join it (and 3 x 3 head views of q, k, v,
  // and the reshape + transpose of do); all counted as fused.
  ASSERT_EQ(r.qkv_grads.size(), 2u);
  for (const auto& [a, qv] : r.qkv_grads) {
    EXPECT_EQ(m.graph.node(a).op, Op::attention_backward);
    EXPECT_EQ(m.graph.value(qv.dest).shape, (Shape{2, 64, 384}));
    EXPECT_EQ(qv.width, 384);
    EXPECT_EQ(qv.col[0], 0);
    EXPECT_EQ(qv.col[1], 128);
    EXPECT_EQ(qv.col[2], 256);
    const KernelGroup& g = r.groups[static_cast<std::size_t>(r.group_of[a])];
    int pads = 0, adds = 0;
    for (int n : g.nodes) {
      pads += m.graph.node(n).op == Op::pad, adds += m.graph.node(n).op == Op::add;
      EXPECT_TRUE(r.alone[static_cast<std::size_t>(n)].empty()) << n;
    }
    EXPECT_EQ(pads, 3);
    EXPECT_EQ(adds, 2);
    EXPECT_EQ(g.last(), m.graph.value(qv.dest).node);
  }
}

// The qkv gradient merge needs the pads to tile the gradient: with a gap (a
// column range nobody writes) it does not apply.
TEST(Fusion, QkvGradientMergeNeedsTiledColumns) {
  auto build = [](std::int64_t gap) {
    Graph g("m");
    const int q = g.input("q", {1, 2, 128, 64}, DType::bf16);
    const int k = g.input("k", {1, 2, 128, 64}, DType::bf16);
    const int v = g.input("v", {1, 2, 128, 64}, DType::bf16);
    const auto outs = g.attention(q, k, v, true, 0.125);
    const int dout = g.input("do", {1, 2, 128, 64}, DType::bf16);
    const auto grads = g.add(Op::attention_backward, {dout, q, k, v, outs[0], outs[1]},
                             {{"causal", std::int64_t{1}}, {"scale", 0.125}});
    const std::int64_t W = 3 * 128 + gap;
    std::vector<int> parts;
    for (std::int64_t i = 0; i < 3; ++i) {
      const int h =
          g.reshape(g.transpose(grads[static_cast<std::size_t>(i)], {0, 2, 1, 3}), {1, 128, 128});
      parts.push_back(g.add1(Op::pad, {h},
                             {{"axis", std::int64_t{2}},
                              {"before", gap + i * 128},
                              {"after", W - gap - (i + 1) * 128}}));
    }
    g.mark_output(g.add(g.add(parts[0], parts[1]), parts[2]));
    return fuse(g).qkv_grads.size();
  };
  EXPECT_EQ(build(0), 1u);
  EXPECT_EQ(build(64), 0u);
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
