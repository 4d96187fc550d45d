// Autodiff against central finite differences of the float64 reference
// interpreter, op by op: loss = sum(f(params) * R) for a fixed random R,
// every parameter element perturbed by +-h (h = 1e-6 relative); the
// gradients must agree to 1e-6 relative to the largest gradient entry.
// Also the interpreter's own values on hand-computable cases.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numbers>
#include <random>

#include "graph/autodiff.h"
#include "graph/eval.h"
#include "util/error.h"

namespace tern::graph {
namespace {

using Feeds = std::map<std::string, HostData>;

HostData randn(std::size_t n, std::mt19937& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  HostData v(n);
  for (double& x : v) x = d(rng);
  return v;
}

// Builds loss = sum(y * R) on top of `y`, adds the backward pass and checks
// every gradient of `params` against finite differences.
void check_grads(Graph& g, int y, const std::vector<int>& params, Feeds feeds, double tol = 1e-6) {
  std::mt19937 rng(99);
  const Shape ys = g.value(y).shape;
  const int r = g.input("R", ys, g.value(y).dtype);
  feeds["R"] = randn(static_cast<std::size_t>(elements(ys)), rng);
  const int loss = g.sum(g.mul(y, r), {});
  const auto grads = add_backward(g, loss, params);
  const auto vals = evaluate(g, feeds);
  for (int p : params) {
    const std::string name = g.value(p).name;
    SCOPED_TRACE("d loss / d %" + name);
    const HostData& got = vals[static_cast<std::size_t>(grads.at(p))];
    HostData& x = feeds[name];
    ASSERT_EQ(got.size(), x.size());
    double scale = 1e-12, worst = 0;
    std::size_t worst_at = 0;
    std::vector<double> fd(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double x0 = x[i], h = 1e-6 * std::max(1.0, std::abs(x0));
      x[i] = x0 + h;
      const double lp = evaluate(g, feeds)[static_cast<std::size_t>(loss)][0];
      x[i] = x0 - h;
      const double lm = evaluate(g, feeds)[static_cast<std::size_t>(loss)][0];
      x[i] = x0;
      fd[i] = (lp - lm) / (2 * h);
      scale = std::max(scale, std::abs(fd[i]));
    }
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double e = std::abs(got[i] - fd[i]);
      if (e > worst) worst = e, worst_at = i;
    }
    EXPECT_LE(worst / scale, tol) << "element " << worst_at << ": autodiff " << got[worst_at]
                                  << ", finite differences " << fd[worst_at];
  }
}

TEST(Autodiff, MatmulAllLayoutsAndBatches) {
  std::mt19937 rng(1);
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      SCOPED_TRACE(testing::Message() << "trans_a " << ta << " trans_b " << tb);
      Graph g;
      const int a = g.param("a", ta ? Shape{4, 3} : Shape{3, 4}, DType::fp32);
      const int b = g.param("b", tb ? Shape{5, 4} : Shape{4, 5}, DType::fp32);
      check_grads(g, g.matmul(a, b, ta, tb), {a, b},
                  {{"a", randn(12, rng)}, {"b", randn(20, rng)}});
    }
  {  // batched activations against a shared weight (a linear layer)
    Graph g;
    const int a = g.param("a", {2, 3, 4}, DType::fp32);
    const int b = g.param("b", {5, 4}, DType::fp32);
    check_grads(g, g.matmul(a, b, false, true), {a, b},
                {{"a", randn(24, rng)}, {"b", randn(20, rng)}});
  }
  for (int ta = 0; ta < 2; ++ta) {  // batched both (attention-style bmm)
    Graph g;
    const int a = g.param("a", {2, 3, 4}, DType::fp32);
    const int b = g.param("b", {2, 4, 3}, DType::fp32);
    check_grads(g, g.matmul(a, b, ta, ta), {a, b}, {{"a", randn(24, rng)}, {"b", randn(24, rng)}});
  }
}

TEST(Autodiff, ElementwiseWithBroadcasting) {
  std::mt19937 rng(2);
  for (Op op : {Op::add, Op::sub, Op::mul}) {
    SCOPED_TRACE(std::string(op_name(op)));
    Graph g;
    const int x = g.param("x", {3, 4}, DType::fp32), bias = g.param("bias", {4}, DType::fp32);
    const int col = g.param("col", {3, 1}, DType::fp32);
    const int y = g.add1(op, {g.add1(op, {x, bias}), col});
    check_grads(g, y, {x, bias, col},
                {{"x", randn(12, rng)}, {"bias", randn(4, rng)}, {"col", randn(3, rng)}});
  }
  Graph g;
  const int x = g.param("x", {3, 4}, DType::fp32);
  check_grads(g, g.scale(x, -2.5), {x}, {{"x", randn(12, rng)}});
}

TEST(Autodiff, Activations) {
  std::mt19937 rng(3);
  for (Op f : {Op::gelu, Op::gelu_tanh, Op::silu, Op::relu}) {
    SCOPED_TRACE(std::string(op_name(f)));
    Graph g;
    const int x = g.param("x", {5, 7}, DType::fp32);
    HostData xv = randn(35, rng, 2.0);
    for (double& v : xv)  // relu's kink at 0 has no derivative: stay clear of it
      if (std::abs(v) < 1e-3) v = 0.5;
    check_grads(g, g.act(f, x), {x}, {{"x", xv}});
  }
}

TEST(Autodiff, NormsAndSoftmax) {
  std::mt19937 rng(4);
  {
    Graph g;
    const int x = g.param("x", {3, 8}, DType::fp32), gm = g.param("gamma", {8}, DType::fp32);
    check_grads(g, g.rmsnorm(x, gm, 1e-5), {x, gm},
                {{"x", randn(24, rng)}, {"gamma", randn(8, rng)}});
  }
  {
    Graph g;
    const int x = g.param("x", {2, 3, 8}, DType::fp32), gm = g.param("gamma", {8}, DType::fp32);
    const int bt = g.param("beta", {8}, DType::fp32);
    check_grads(g, g.layernorm(x, gm, bt), {x, gm, bt},
                {{"x", randn(48, rng)}, {"gamma", randn(8, rng)}, {"beta", randn(8, rng)}});
  }
  {
    Graph g;
    const int x = g.param("x", {4, 6}, DType::fp32);
    check_grads(g, g.softmax(x), {x}, {{"x", randn(24, rng, 2.0)}});
  }
}

// Norm nodes without an eps attribute (as add_op or a parsed text may
// give them) use the ops' default eps, forward and backward.
TEST(Autodiff, NormsWithoutEpsAttribute) {
  std::mt19937 rng(11);
  for (Op op : {Op::rmsnorm, Op::layernorm}) {
    SCOPED_TRACE(std::string(op_name(op)));
    Graph g;
    const int x = g.param("x", {3, 8}, DType::fp32), gm = g.param("gamma", {8}, DType::fp32);
    const int bt = g.param("beta", {8}, DType::fp32);
    std::vector<int> in{x, gm}, ps{x, gm};
    if (op == Op::layernorm) in.push_back(bt), ps.push_back(bt);
    check_grads(g, g.add1(op, in), ps,
                {{"x", randn(24, rng, 1e-3)}, {"gamma", randn(8, rng)}, {"beta", randn(8, rng)}});
  }
}

TEST(Autodiff, CrossEntropyWithIgnoredTokens) {
  std::mt19937 rng(5);
  Graph g;
  const int x = g.param("logits", {5, 7}, DType::fp32);
  const int t = g.input("targets", {5}, DType::int32);
  const int loss = g.cross_entropy(x, t, -1);
  // loss is already a scalar: its own gradient, through sum(loss * R).
  check_grads(g, loss, {x}, {{"logits", randn(35, rng, 2.0)}, {"targets", {3, -1, 0, 6, 2}}});
}

TEST(Autodiff, EmbeddingRopeAttention) {
  std::mt19937 rng(6);
  {
    Graph g;
    const int tab = g.param("table", {6, 4}, DType::fp32);
    const int ids = g.input("ids", {2, 3}, DType::int32);
    check_grads(g, g.embedding(tab, ids), {tab},
                {{"table", randn(24, rng)}, {"ids", {1, 5, 1, 0, 1, 3}}});
  }
  {
    Graph g;
    const int x = g.param("x", {1, 2, 3, 4}, DType::fp32);
    const int c = g.input("cos", {3, 2}, DType::fp32), s = g.input("sin", {3, 2}, DType::fp32);
    HostData cv(6), sv(6);
    for (int i = 0; i < 6; ++i) cv[i] = std::cos(0.3 * i), sv[i] = std::sin(0.3 * i);
    check_grads(g, g.rope(x, c, s), {x}, {{"x", randn(24, rng)}, {"cos", cv}, {"sin", sv}});
  }
  for (int causal = 0; causal < 2; ++causal) {
    SCOPED_TRACE(causal ? "causal GQA" : "full GQA");
    Graph g;
    const int q = g.param("q", {1, 4, 5, 3}, DType::fp32);
    const int k = g.param("k", {1, 2, 5, 3}, DType::fp32),
              v = g.param("v", {1, 2, 5, 3}, DType::fp32);
    const int o = g.attention(q, k, v, causal, 0.7)[0];
    check_grads(g, o, {q, k, v},
                {{"q", randn(60, rng)}, {"k", randn(30, rng)}, {"v", randn(30, rng)}});
  }
}

TEST(Autodiff, ShapeOps) {
  std::mt19937 rng(7);
  Graph g;
  const int x = g.param("x", {2, 3, 4}, DType::fp32), y = g.param("y", {2, 2, 4}, DType::fp32);
  int h = g.transpose(g.reshape(x, {6, 4}), {1, 0});  // [4, 6]
  h = g.slice(h, 1, 1, 5);                            // [4, 4]
  h = g.add1(Op::pad, {h},
             {{"axis", std::int64_t{0}},
              {"before", std::int64_t{1}},
              {"after", std::int64_t{2}}});                             // [7, 4]
  h = g.concat({g.reshape(h, {7, 1, 4}), g.reshape(y, {4, 1, 4})}, 0);  // [11, 1, 4]
  h = g.broadcast(h, {11, 3, 4});
  h = g.cast(g.sum(h, {1}, true), DType::fp32);  // [11, 1, 4]
  h = g.sum(h, {0});                             // [1, 4]
  check_grads(g, h, {x, y}, {{"x", randn(24, rng)}, {"y", randn(16, rng)}});
}

// A whole GPT-2-style block with a loss, every parameter at once.
TEST(Autodiff, Gpt2BlockEndToEnd) {
  std::mt19937 rng(8);
  const std::int64_t B = 1, S = 4, D = 8, H = 2, V = 5, F = 16;
  Graph g("gpt2_block");
  Feeds f;
  auto param = [&](const std::string& n, Shape s, double sc = 0.5) {
    f[n] = randn(static_cast<std::size_t>(elements(s)), rng, sc);
    return g.param(n, std::move(s), DType::fp32);
  };
  const int wte = param("wte", {V, D}), wpe = param("wpe", {S, D});
  const int ln1g = param("ln1.g", {D}), ln1b = param("ln1.b", {D});
  const int wqkv = param("attn.wqkv", {D, 3 * D}), wo = param("attn.wo", {D, D});
  const int ln2g = param("ln2.g", {D}), ln2b = param("ln2.b", {D});
  const int w1 = param("mlp.w1", {D, F}), b1 = param("mlp.b1", {F});
  const int w2 = param("mlp.w2", {F, D});
  const int ids = g.input("ids", {B, S}, DType::int32),
            tgt = g.input("targets", {B, S}, DType::int32);
  f["ids"] = {1, 4, 0, 2};
  f["targets"] = {4, 0, 2, 3};
  int x = g.add(g.embedding(wte, ids), wpe);                   // [B, S, D]
  const int qkv = g.matmul(g.layernorm(x, ln1g, ln1b), wqkv);  // [B, S, 3D]
  auto heads = [&](int part) {
    const int t = g.reshape(g.slice(qkv, 2, part * D, (part + 1) * D), {B, S, H, D / H});
    return g.transpose(t, {0, 2, 1, 3});  // [B, H, S, D/H]
  };
  const int o = g.attention(heads(0), heads(1), heads(2), true, 1.0 / std::sqrt(D / H))[0];
  x = g.add(x, g.matmul(g.reshape(g.transpose(o, {0, 2, 1, 3}), {B, S, D}), wo));
  const int h = g.act(Op::gelu, g.add(g.matmul(g.layernorm(x, ln2g, ln2b), w1), b1));
  x = g.add(x, g.matmul(h, w2));
  const int logits = g.matmul(x, wte, false, true);  // tied embedding
  const int loss = g.cross_entropy(logits, tgt);
  check_grads(g, loss, {wte, wpe, ln1g, ln1b, wqkv, wo, ln2g, ln2b, w1, b1, w2}, f);
}

TEST(Autodiff, Errors) {
  Graph g;
  const int x = g.param("x", {3}, DType::fp32);
  EXPECT_THROW(add_backward(g, x, {x}), Error);  // not a scalar
  Graph g2;
  const int q = g2.param("q", {1, 1, 2, 2}, DType::fp32);
  const auto ol = g2.attention(q, q, q, true, 1.0);
  const int l2 = g2.sum(ol[1], {});
  EXPECT_THROW(add_backward(g2, l2, {q}), NotSupported);
  // rope differentiates x only: cos / sin on the path refuse, not zeros.
  Graph g3;
  const int x3 = g3.param("x", {1, 1, 2, 4}, DType::fp32);
  const int c3 = g3.param("cos", {2, 2}, DType::fp32), s3 = g3.param("sin", {2, 2}, DType::fp32);
  const int l3 = g3.sum(g3.rope(x3, c3, s3), {});
  EXPECT_THROW(add_backward(g3, l3, {x3, c3}), NotSupported);
  EXPECT_NO_THROW(add_backward(g3, l3, {x3}));
}

TEST(Evaluate, HandComputedValues) {
  Graph g;
  const int x = g.input("x", {1, 2}, DType::fp32);
  const int t = g.input("t", {1}, DType::int32);
  const int s = g.softmax(x), ce = g.cross_entropy(x, t);
  const auto v = evaluate(g, {{"x", {0.0, std::log(3.0)}}, {"t", {1}}});
  EXPECT_NEAR(v[static_cast<std::size_t>(s)][0], 0.25, 1e-15);
  EXPECT_NEAR(v[static_cast<std::size_t>(s)][1], 0.75, 1e-15);
  EXPECT_NEAR(v[static_cast<std::size_t>(ce)][0], -std::log(0.75), 1e-15);
  EXPECT_THROW(evaluate(g, {{"x", {0.0}}, {"t", {1}}}), Error);       // mis-sized feed
  EXPECT_THROW(evaluate(g, {{"x", {0.0, 1.0}}, {"t", {2}}}), Error);  // target out of range
  EXPECT_THROW(evaluate(g, {{"x", {0.0, 1.0}}}), Error);              // missing feed
}

}  // namespace
}  // namespace tern::graph
