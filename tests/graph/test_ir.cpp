// The graph IR: builders infer shapes, bad graphs give errors naming the op
// and values, and the text form parses back to the same text.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "common/expect_error.h"
#include "graph/autodiff.h"
#include "graph/text.h"
#include "util/error.h"

namespace tern::graph {
namespace {

using tern::test_util::expect_error;

Graph llama_block() {
  Graph g("llama_block");
  const std::int64_t B = 2, S = 16, D = 64, Hq = 4, Hkv = 2, hd = 16, F = 128;
  const int x = g.input("x", {B, S, D}, DType::bf16);
  const int cs = g.input("cos", {S, hd / 2}, DType::fp32),
            sn = g.input("sin", {S, hd / 2}, DType::fp32);
  const int n1 = g.param("norm1", {D}, DType::bf16);
  const int wq = g.param("wq", {D, Hq * hd}, DType::bf16),
            wk = g.param("wk", {D, Hkv * hd}, DType::bf16);
  const int wv = g.param("wv", {D, Hkv * hd}, DType::bf16),
            wo = g.param("wo", {Hq * hd, D}, DType::bf16);
  const int n2 = g.param("norm2", {D}, DType::bf16);
  const int wg = g.param("w_gate", {D, F}, DType::bf16), wu = g.param("w_up", {D, F}, DType::bf16);
  const int wd = g.param("w_down", {F, D}, DType::bf16);
  const int h = g.rmsnorm(x, n1);
  auto heads = [&](int w, std::int64_t n) {
    return g.transpose(g.reshape(g.matmul(h, w), {B, S, n, hd}), {0, 2, 1, 3});
  };
  const int q = g.rope(heads(wq, Hq), cs, sn), k = g.rope(heads(wk, Hkv), cs, sn);
  const int o = g.attention(q, k, heads(wv, Hkv), true, 0.25)[0];
  const int x2 = g.add(x, g.matmul(g.reshape(g.transpose(o, {0, 2, 1, 3}), {B, S, Hq * hd}), wo));
  const int h2 = g.rmsnorm(x2, n2);
  const int ff = g.mul(g.act(Op::silu, g.matmul(h2, wg)), g.matmul(h2, wu));
  const int y = g.add(x2, g.matmul(ff, wd));
  const int loss = g.cast(g.sum(g.cast(y, DType::fp32), {}), DType::fp32);
  g.mark_output(loss);
  const auto grads = add_backward(g, loss, {n1, wq, wk, wv, wo, n2, wg, wu, wd});
  for (const auto& [p, d] : grads) g.mark_output(d);
  return g;
}

TEST(GraphIr, BuildersInferShapes) {
  Graph g = llama_block();
  const Value& wq = g.value(g.find("grad.wq"));
  EXPECT_EQ(wq.shape, (Shape{64, 64}));
  EXPECT_EQ(wq.dtype, DType::bf16);
  EXPECT_EQ(g.value(g.find("x")).shape, (Shape{2, 16, 64}));
  EXPECT_EQ(g.outputs().size(), 10u);
}

TEST(GraphIr, TextRoundTrip) {
  const Graph g = llama_block();
  const std::string text = print(g);
  const Graph back = parse(text, "llama.tgraph");
  EXPECT_EQ(print(back), text);
  EXPECT_EQ(back.nodes().size(), g.nodes().size());
  // Attribute kinds survive: a real that prints like an integer, lists, names.
  Graph h("attrs");
  const int x = h.input("x", {2, 3}, DType::fp32);
  h.mark_output(h.scale(h.transpose(x, {1, 0}), 2.0));
  h.mark_output(h.cast(x, DType::bf16));
  h.mark_output(h.rmsnorm(x, h.param("g", {3}, DType::fp32), 1e-6));
  const std::string t2 = print(h);
  EXPECT_NE(t2.find("value = 2.0"), std::string::npos) << t2;
  EXPECT_NE(t2.find("eps = 1e-06"), std::string::npos) << t2;
  EXPECT_EQ(print(parse(t2)), t2);
  // Non-finite reals (a mask's -inf, inf, NaN) read back as reals.
  Graph f("nonfinite");
  for (double v : {-INFINITY, INFINITY, NAN}) f.mark_output(f.full({2}, v, DType::fp32));
  const std::string t3 = print(f);
  EXPECT_NE(t3.find("value = inf"), std::string::npos) << t3;
  EXPECT_NE(t3.find("value = nan"), std::string::npos) << t3;
  EXPECT_EQ(print(parse(t3)), t3);
}

TEST(GraphIr, SaveAndLoad) {
  const Graph g = llama_block();
  const auto path = std::filesystem::temp_directory_path() / "tern_test_graph.tgraph";
  save(g, path.string());
  EXPECT_EQ(print(load(path.string())), print(g));
  std::filesystem::remove(path);
  expect_error([] { load("/nonexistent/x.tgraph"); }, {"cannot read", "/nonexistent/x.tgraph"});
}

TEST(GraphIr, ShapeErrorsNameTheOpAndValues) {
  Graph g("m");
  const int a = g.input("a", {4, 8}, DType::bf16), b = g.param("w", {16, 4}, DType::bf16);
  expect_error([&] { g.matmul(a, b); },
               {"graph m", "matmul %a, %w", "contraction dims differ", "K = 8", "K = 16"});
  const int c = g.param("c", {4, 8}, DType::fp32);
  expect_error([&] { g.add(a, c); }, {"add %a, %c", "dtypes differ"});
  expect_error([&] { g.reshape(a, {5, 7}); }, {"reshape %a", "cannot reshape"});
  expect_error([&] { g.add1(Op::softmax, {a, a}); }, {"softmax", "takes 1 inputs, got 2"});
  expect_error([&] { g.input("a", {2}, DType::fp32); }, {"%a is defined twice"});
  expect_error([&] { g.input("bad name", {2}, DType::fp32); }, {"bad value name"});
  expect_error([&] { g.input("z", {0, 2}, DType::fp32); }, {"dims must be >= 1"});
  const int ids = g.input("ids", {4}, DType::fp32);
  expect_error([&] { g.embedding(g.param("tab", {10, 8}, DType::fp32), ids); }, {"integer tensor"});
}

TEST(GraphIr, ParseErrorsNameTheLine) {
  const std::string head = "graph t {\n  %x = input : [2, 3] float32\n";
  expect_error([&] { parse(head + "  %y = matmal %x, %x : [2, 2] float32\n}\n", "f.tgraph"); },
               {"f.tgraph:3:", "unknown op 'matmal'"});
  expect_error([&] { parse(head + "  %y = add %x, %q : [2, 3] float32\n}\n", "f.tgraph"); },
               {"f.tgraph:3:", "%q is used before it is defined"});
  expect_error([&] { parse(head + "  %y = softmax %x : [2, 4] float32\n}\n", "f.tgraph"); },
               {"f.tgraph:3:", "the text says [2, 4] float32", "softmax gives [2, 3] float32"});
  expect_error([&] { parse(head + "  %y = matmul %x, %x : [2, 2] float32\n}\n", "f.tgraph"); },
               {"f.tgraph:3:", "contraction dims differ"});
  expect_error([&] { parse(head, "f.tgraph"); }, {"not closed"});
  expect_error([&] { parse("%x = input : [2] float32\n", "f.tgraph"); },
               {"f.tgraph:1:", "expected 'graph NAME {'"});
  expect_error(
      [&] { parse(head + "  %y = scale %x {value = 2.0 : [2, 3] float32\n}\n", "f.tgraph"); },
      {"f.tgraph:3:", "expected '}'"});
  expect_error([&] { parse(head + "  output %nope\n}\n", "f.tgraph"); },
               {"f.tgraph:3:", "output %nope is not defined"});
  expect_error(
      [&] { parse(head + "  %y = cast %x {dtype = float9} : [2, 3] float32\n}\n", "f.tgraph"); },
      {"f.tgraph:3:", "float9"});
  // Comments and blank lines are fine.
  const Graph g =
      parse("# a comment\ngraph t {\n\n  %x = input : [2] float32  # x\n  output %x\n}\n");
  EXPECT_EQ(g.outputs().size(), 1u);
}

// hoist() moves nodes to just after the producers of their inputs (leaves
// to the front), keeps the others in order and the value ids as they were;
// the graph still prints and parses back (topological order holds).
TEST(GraphIr, HoistSchedulesNodesAsEarlyAsTheirInputs) {
  Graph g("h");
  const int a = g.input("a", {4, 8}, DType::fp32);
  const int b = g.mul(a, a);
  const int c = g.add(b, b);
  const int d = g.scale(c, 2.0);
  const int late = g.input("late", {4, 8}, DType::fp32);
  const int e = g.add(b, late);  // needs b and the late input only
  g.mark_output(d), g.mark_output(e);
  g.hoist({g.value(late).node, g.value(e).node});
  std::vector<int> at(g.values().size());
  for (std::size_t v = 0; v < g.values().size(); ++v) at[v] = g.values()[v].node;
  EXPECT_EQ(at[static_cast<std::size_t>(late)], 0);  // a leaf: first
  EXPECT_EQ(at[static_cast<std::size_t>(a)], 1);
  EXPECT_EQ(at[static_cast<std::size_t>(b)], 2);
  EXPECT_EQ(at[static_cast<std::size_t>(e)], 3);  // right after b
  EXPECT_EQ(at[static_cast<std::size_t>(c)], 4);
  EXPECT_EQ(at[static_cast<std::size_t>(d)], 5);
  for (std::size_t v = 0; v < g.values().size(); ++v)
    EXPECT_EQ(g.node(at[v]).outputs[static_cast<std::size_t>(g.values()[v].index)],
              static_cast<int>(v));
  const std::string text = print(g);
  EXPECT_EQ(print(parse(text)), text);
  EXPECT_THROW(g.hoist({99}), Error);
}

}  // namespace
}  // namespace tern::graph
