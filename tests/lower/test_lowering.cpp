// Compiled graphs on the simulated chip against the float64 reference
// interpreter: lowering to kernels, the HBM arena laid out by the memory
// plan, and reruns of one executable. bf16 values: each kernel rounds its
// outputs to bf16 (8 significant bits), so results agree to about 2^-7
// relative to the tensor's largest magnitude after a few kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "arch/chip.h"
#include "common/graph_values.h"
#include "graph/autocast.h"
#include "graph/autodiff.h"
#include "graph/eval.h"
#include "graph/models.h"
#include "graph/recompute.h"
#include "lower/lower.h"
#include "num/convert.h"
#include "runtime/device.h"
#include "util/error.h"

namespace tern::graph {
namespace {

// Runs a model's training step (its loss and the gradients of every param)
// on the chip and checks it against the interpreter: loss within 1 %,
// each gradient within 2 % of its largest magnitude (bf16 between kernels;
// measured 0.3 to 1 %).
// Runs a compiled training step on the chip and compares the loss (relative
// tolerance loss_rel) and every gradient (max_rel_error <= grad_rel) with the
// float64 interpreter.
void expect_matches_interpreter(const Model& m, const std::map<int, int>& grads,
                                const Executable& exe, const arch::ChipSpec& chip,
                                const std::map<std::string, std::vector<float>>& feeds,
                                double loss_rel, double grad_rel) {
  runtime::Device dev(chip);
  const runtime::StepResult r = dev.run(exe, feeds);
  std::map<std::string, HostData> hf;
  for (const auto& [k, v] : feeds) hf[k] = HostData(v.begin(), v.end());
  const auto want = evaluate(m.graph, hf);
  const double lw = want[static_cast<std::size_t>(m.loss)][0];
  EXPECT_NEAR(r.outputs.at("loss")[0], lw, loss_rel * lw);
  for (const auto& [p, d] : grads) {
    SCOPED_TRACE(m.graph.value(d).name);
    EXPECT_LE(max_rel_error(r.outputs.at(m.graph.value(d).name), want[static_cast<std::size_t>(d)]),
              grad_rel);
  }
}

void check_training_step(Model& m, const std::map<std::string, std::vector<float>>& feeds) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  const auto grads = add_backward(m.graph, m.loss, m.params);
  for (const auto& [p, d] : grads) m.graph.mark_output(d);
  const Executable exe = compile(m.graph, chip, {2});
  EXPECT_TRUE(exe.unlowered.empty());
  // Norm statistics and attention's transposed q / k live between
  // launches; lowering adds their peak to the plan.
  EXPECT_TRUE(exe.plan.temps_counted);
  EXPECT_GT(exe.plan.temp_peak, 0);
  EXPECT_EQ(exe.plan.total(), exe.plan.arena_bytes + exe.plan.temp_peak);
  expect_matches_interpreter(m, grads, exe, chip, feeds, 0.01, 0.02);
}

TEST(Runtime, CompiledGraphMatchesTheInterpreter) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  Graph g("net");
  const std::int64_t M = 130, D = 96, F = 200;
  const int x = g.input("x", {M, D}, DType::bf16);
  const int w1 = g.param("w1", {D, F}, DType::bf16), b1 = g.param("b1", {F}, DType::bf16);
  const int gm = g.param("gamma", {F}, DType::bf16), bt = g.param("beta", {F}, DType::bf16);
  const int w2 = g.param("w2", {F, D}, DType::bf16);
  const int h = g.act(Op::gelu, g.add(g.matmul(x, w1), b1));  // matmul + bias + gelu
  const int n = g.layernorm(h, gm, bt);
  const int y = g.add(g.matmul(n, w2), x);  // matmul + residual
  const int s = g.softmax(y);
  const int a = g.act(Op::silu, y);
  const int q = g.rmsnorm(g.add(a, s), g.param("g2", {D}, DType::bf16));  // residual add + norm
  for (int o : {s, a, q}) g.mark_output(o);

  const Executable exe = compile(g, chip, {2});
  ASSERT_EQ(exe.launches.size(), 6u);
  EXPECT_EQ(exe.launches[0].detail, "bias,gelu");
  runtime::Device dev(chip);
  std::mt19937 rng(3);
  for (int step = 0; step < 2; ++step) {  // one executable, two steps with other data
    std::map<std::string, std::vector<float>> feeds{
        {"x", bf16_normal(M * D, rng, 1.0f)}, {"w1", bf16_normal(D * F, rng, 0.1f)},
        {"b1", bf16_normal(F, rng, 0.1f)},    {"gamma", bf16_normal(F, rng, 1.0f)},
        {"beta", bf16_normal(F, rng, 0.1f)},  {"w2", bf16_normal(F * D, rng, 0.1f)},
        {"g2", bf16_normal(D, rng, 1.0f)}};
    const runtime::StepResult r = dev.run(exe, feeds);
    std::map<std::string, HostData> hf;
    for (const auto& [k, v] : feeds) hf[k] = HostData(v.begin(), v.end());
    const auto want = evaluate(g, hf);
    for (int o : {s, a, q}) {
      SCOPED_TRACE(g.value(o).name);
      EXPECT_LE(max_rel_error(r.outputs.at(g.value(o).name), want[static_cast<std::size_t>(o)]),
                2.0 / 128);
    }
    EXPECT_GT(r.time_ns, 0);
    EXPECT_EQ(r.kernel_ns.size(), exe.launches.size());
  }
}

// A training step on the chip: an MLP classifier's loss and every
// gradient (matmul + bias epilogue, GELU and its backward, cross-entropy
// forward and backward with ignored tokens, bias gradients as column sums,
// weight gradients as matmuls with a transposed operand).
TEST(Runtime, MlpTrainingStepMatchesTheInterpreter) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  Graph g("mlp");
  const std::int64_t T = 200, D = 96, F = 128, V = 40;
  const int x = g.input("x", {T, D}, DType::bf16);
  const int t = g.input("targets", {T}, DType::int32);
  const int w1 = g.param("w1", {D, F}, DType::bf16), b1 = g.param("b1", {F}, DType::bf16);
  const int w2 = g.param("w2", {F, V}, DType::bf16);
  const int a = g.act(Op::gelu, g.add(g.matmul(x, w1), b1));
  const int loss = g.cross_entropy(g.matmul(a, w2), t);
  g.mark_output(loss);
  const auto grads = add_backward(g, loss, {w1, b1, w2});
  for (const auto& [p, d] : grads) g.mark_output(d);
  const Executable exe = compile(g, chip, {2});
  std::mt19937 rng(5);
  std::map<std::string, std::vector<float>> feeds{{"x", bf16_normal(T * D, rng, 1.0f)},
                                                  {"w1", bf16_normal(D * F, rng, 0.1f)},
                                                  {"b1", bf16_normal(F, rng, 0.1f)},
                                                  {"w2", bf16_normal(F * V, rng, 0.2f)}};
  std::vector<float> tg(T);
  for (std::int64_t i = 0; i < T; ++i)
    tg[static_cast<std::size_t>(i)] = i % 7 == 3 ? -100.0f : static_cast<float>((i * 13) % V);
  feeds["targets"] = tg;
  runtime::Device dev(chip);
  const runtime::StepResult r = dev.run(exe, feeds);
  std::map<std::string, HostData> hf;
  for (const auto& [k, v] : feeds) hf[k] = HostData(v.begin(), v.end());
  const auto want = evaluate(g, hf);
  EXPECT_NEAR(r.outputs.at(g.value(loss).name)[0], want[static_cast<std::size_t>(loss)][0],
              1e-2 * want[static_cast<std::size_t>(loss)][0]);
  for (const auto& [p, d] : grads) {
    SCOPED_TRACE(g.value(d).name);
    EXPECT_LE(max_rel_error(r.outputs.at(g.value(d).name), want[static_cast<std::size_t>(d)]),
              3.0 / 128);
  }
}

// Shape ops as DMA row copies: exact, since no value changes.
TEST(Runtime, ShapeOpsMoveDataExactly) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  Graph g("shapes");
  const std::int64_t B = 2, S = 300, H = 3, D = 8;  // runs of 300 rows: packed bands
  const int qkv = g.input("qkv", {B, S, 3 * H * D}, DType::bf16);
  const int pos = g.input("pos", {S, H * D}, DType::bf16);
  const int q = g.slice(qkv, 2, H * D, 2 * H * D);                          // [B, S, H*D]
  const int heads = g.transpose(g.reshape(q, {B, S, H, D}), {0, 2, 1, 3});  // [B, H, S, D]
  const int rows = g.slice(heads, 2, 7, 140);                               // leading-axis slice
  // Back to [B, S, H, D]: runs of H whole rows a constant step apart (groups).
  const int back = g.transpose(heads, {0, 2, 1, 3});
  const int padded =
      g.add1(Op::pad, {q},
             {{"axis", std::int64_t{2}}, {"before", std::int64_t{3}}, {"after", std::int64_t{5}}});
  const int padrows =
      g.add1(Op::pad, {pos},
             {{"axis", std::int64_t{0}}, {"before", std::int64_t{2}}, {"after", std::int64_t{1}}});
  const int cat = g.concat({q, g.broadcast(pos, {B, S, H * D})}, 2);
  const int cat0 = g.concat({pos, pos}, 0);
  for (int o : {heads, rows, back, padded, padrows, cat, cat0}) g.mark_output(o);
  const Executable exe = compile(g, chip, {2});
  std::mt19937 rng(9);
  std::map<std::string, std::vector<float>> feeds{
      {"qkv", bf16_normal(B * S * 3 * H * D, rng, 1.0f)},
      {"pos", bf16_normal(S * H * D, rng, 1.0f)}};
  runtime::Device dev(chip);
  const runtime::StepResult r = dev.run(exe, feeds);
  std::map<std::string, HostData> hf;
  for (const auto& [k, v] : feeds) hf[k] = HostData(v.begin(), v.end());
  const auto want = evaluate(g, hf);
  for (int o : {heads, rows, back, padded, padrows, cat, cat0}) {
    SCOPED_TRACE(g.value(o).name);
    const auto& got = r.outputs.at(g.value(o).name);
    const auto& w = want[static_cast<std::size_t>(o)];
    ASSERT_EQ(got.size(), w.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < w.size(); ++i) bad += got[i] != w[i];
    EXPECT_EQ(bad, 0u);
  }
}

// add / sub / mul with one broadcast row (a bias): the elementwise kernel
// reads the row by a broadcast DMA, so there is no broadcast copy; row - x
// and other broadcasts still copy first. Exact against the host: one FP32
// op, rounded once to BF16.
TEST(Runtime, BroadcastRowsNeedNoCopy) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  Graph g("bias");
  const std::int64_t B = 2, S = 200, C = 300;
  const int x = g.input("x", {B, S, C}, DType::bf16);
  const int bias = g.input("bias", {C}, DType::bf16);
  const int pos = g.input("pos", {S, C}, DType::bf16);
  const std::vector<int> outs{g.add(x, bias), g.add(bias, x), g.sub(x, bias),
                              g.mul(bias, x), g.sub(bias, x), g.add(x, pos)};
  for (int o : outs) g.mark_output(o);
  const Executable exe = compile(g, chip, {2});
  int copies = 0;
  for (const Launch& l : exe.launches) copies += l.kernel == "copy";
  EXPECT_EQ(copies, 2);  // bias - x and x + pos
  std::mt19937 rng(4);
  std::map<std::string, std::vector<float>> feeds{{"x", bf16_normal(B * S * C, rng, 1.0f)},
                                                  {"bias", bf16_normal(C, rng, 1.0f)},
                                                  {"pos", bf16_normal(S * C, rng, 1.0f)}};
  runtime::Device dev(chip);
  const runtime::StepResult r = dev.run(exe, feeds);
  const auto& xv = feeds["x"];
  const auto& bv = feeds["bias"];
  const auto& pv = feeds["pos"];
  const auto bf = [](float v) { return num::round_to(num::format(num::FormatId::bf16), v); };
  for (std::size_t k = 0; k < outs.size(); ++k) {
    SCOPED_TRACE(g.value(outs[k]).name);
    const auto& got = r.outputs.at(g.value(outs[k]).name);
    ASSERT_EQ(got.size(), xv.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < xv.size(); ++i) {
      const float a = xv[i], b = bv[i % C], p = pv[i % (S * C)];
      const float want = k == 0 || k == 1 ? a + b
                         : k == 2         ? a - b
                         : k == 3         ? b * a
                         : k == 4         ? b - a
                                          : a + p;
      bad += got[i] != bf(want);
    }
    EXPECT_EQ(bad, 0u);
  }
}

// Sums, each lowered its own way: over a few leading rows (k <= 32) by
// Vector adds of the blocks in order, over many by x^T @ ones on the Tensor
// engine, a total over the cores' row tiles then their partials in core
// order, and a total of x * x as the reduce kernel's sum of squares (the
// square never stored). FP32 results, exact against FP32 sums in the
// kernels' order where it is simple (blocks), else within FP32 rounding.
TEST(Runtime, SumsLowerByShape) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  Graph g("sums");
  const std::int64_t K = 3, R = 300, C = 256;
  const int few = g.input("few", {K, R, C}, DType::fp32);
  const int many = g.input("many", {200, C}, DType::bf16);
  const int big = g.input("big", {1024, 96}, DType::fp32);
  const int blocks = g.sum(few, {0});                      // [R, C]
  const int cols = g.sum(g.cast(many, DType::fp32), {0});  // [C]
  const int total = g.sum(big, {});                        // []
  const int sumsq = g.sum(g.mul(big, big), {});            // []
  for (int o : {blocks, cols, total, sumsq}) g.mark_output(o);
  const Executable exe = compile(g, chip, {4});
  std::vector<std::string> details;
  for (const Launch& l : exe.launches) details.push_back(l.kernel + ": " + l.detail);
  auto has = [&](const std::string& d) {
    return std::find(details.begin(), details.end(), d) != details.end();
  };
  EXPECT_TRUE(has("reduce: 3 blocks added (Vector)"));
  EXPECT_TRUE(has("reduce: column sums on the Tensor engine"));
  EXPECT_TRUE(has("reduce: total over 4 cores"));
  EXPECT_TRUE(has("reduce: the cores' partials, in core order"));
  EXPECT_EQ(exe.fusion.groups.size(), 5u);  // cast, three sums, and x * x with its sum
  std::mt19937 rng(3);
  std::map<std::string, std::vector<float>> feeds{{"few", bf16_normal(K * R * C, rng, 1.0f)},
                                                  {"many", bf16_normal(200 * C, rng, 1.0f)},
                                                  {"big", bf16_normal(1024 * 96, rng, 1.0f)}};
  runtime::Device dev(chip);
  const runtime::StepResult r = dev.run(exe, feeds);
  // Blocks: ((x0 + x1) + x2) in FP32, bit for bit.
  const std::vector<float>& got = r.outputs.at(g.value(blocks).name);
  const std::vector<float>& x = feeds["few"];
  std::size_t bad = 0;
  for (std::int64_t i = 0; i < R * C; ++i) {
    float want = x[static_cast<std::size_t>(i)];
    for (std::int64_t k = 1; k < K; ++k) want += x[static_cast<std::size_t>(k * R * C + i)];
    bad += got[static_cast<std::size_t>(i)] != want;
  }
  EXPECT_EQ(bad, 0u);
  std::map<std::string, HostData> hf;
  for (const auto& [k, v] : feeds) hf[k] = HostData(v.begin(), v.end());
  const auto want = evaluate(g, hf);
  for (int o : {cols, total, sumsq}) {
    SCOPED_TRACE(g.value(o).name);
    EXPECT_LE(max_rel_error(r.outputs.at(g.value(o).name), want[static_cast<std::size_t>(o)]),
              1e-5);
  }
}

// A GPT-2 training step (2 layers, every op of the model lowered: embedding
// and its scatter-add backward, broadcast position add, LayerNorm forward
// and backward, qkv slices and head transposes, flash attention forward and
// backward, fused epilogues and chains, cross-entropy) on the chip against
// the float64 interpreter: the loss and every parameter gradient.
TEST(Runtime, Gpt2TrainingStepMatchesTheInterpreter) {
  Gpt2Config c;
  c.layers = 2, c.dim = 128, c.heads = 2, c.vocab = 97, c.seq = 64, c.batch = 2;
  Model m = gpt2(c);
  std::mt19937 rng(21);
  check_training_step(m, gpt2_feeds(m.graph, m.params, c.batch * c.seq, c.vocab, rng));
}

// The same GPT-2 step all in FP32 (Gpt2Config::dtype: weights, activations,
// matmuls at the FP32 rate, flash attention forward and backward with its
// transposes on the Tensor engine): the lowering picks the flash kernels in
// FP32, and the loss and every gradient agree with the float64 interpreter
// to about FP32 rounding: loss within 1e-6, gradients within 1e-5 of their
// largest magnitude (measured: loss 8e-8, gradients 2.5e-7 to 1.1e-6).
TEST(Runtime, Fp32Gpt2TrainingStepMatchesTheInterpreter) {
  Gpt2Config c;
  c.layers = 2, c.dim = 128, c.heads = 2, c.vocab = 97, c.seq = 64, c.batch = 2;
  c.dtype = DType::fp32;
  Model m = gpt2(c);
  const arch::ChipSpec chip = arch::load_chip("trn3");
  const auto grads = add_backward(m.graph, m.loss, m.params);
  for (const auto& [p, d] : grads) m.graph.mark_output(d);
  const Executable exe = compile(m.graph, chip, {2});
  EXPECT_TRUE(exe.unlowered.empty());
  int fwd = 0, bwd = 0;
  for (const Launch& l : exe.launches) {
    for (const auto& t : l.program.tensors) {
      if (l.kernel.starts_with("flash_attention") && t.name != "lse") {
        EXPECT_EQ(t.dtype, DType::fp32) << l.kernel << " " << t.name;
      }
    }
    fwd += l.kernel == "flash_attention", bwd += l.kernel == "flash_attention_backward";
  }
  EXPECT_EQ(fwd, c.layers);
  EXPECT_EQ(bwd, c.layers);
  std::mt19937 rng(21);
  const auto feeds = gpt2_feeds(m.graph, m.params, c.batch * c.seq, c.vocab, rng);
  expect_matches_interpreter(m, grads, exe, chip, feeds, 1e-6, 1e-5);
}

// A Llama training step (RMSNorm, RoPE, GQA flash attention, SwiGLU, untied
// head) on the chip against the interpreter.
TEST(Runtime, LlamaTrainingStepMatchesTheInterpreter) {
  LlamaConfig c;
  c.layers = 2, c.dim = 256, c.heads = 4, c.kv_heads = 2, c.ffn = 384, c.vocab = 101;
  c.seq = 64, c.batch = 2;
  Model m = llama(c);
  std::mt19937 rng(33);
  std::map<std::string, std::vector<float>> feeds;
  for (int p : m.params) {
    const Value& v = m.graph.value(p);
    const auto n = static_cast<std::size_t>(elements(v.shape));
    const bool norm = v.name.find("norm") != std::string::npos;
    feeds[v.name] = norm ? std::vector<float>(n, 1.0f) : bf16_normal(n, rng, 0.05f);
  }
  const std::int64_t hd = c.dim / c.heads;
  std::vector<float> cs(static_cast<std::size_t>(c.seq * hd / 2)), sn(cs.size());
  for (std::int64_t p = 0; p < c.seq; ++p)
    for (std::int64_t i = 0; i < hd / 2; ++i) {
      const double th = static_cast<double>(p) *
                        std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
      cs[static_cast<std::size_t>(p * hd / 2 + i)] = static_cast<float>(std::cos(th));
      sn[static_cast<std::size_t>(p * hd / 2 + i)] = static_cast<float>(std::sin(th));
    }
  feeds["cos"] = cs, feeds["sin"] = sn;
  feeds["ids"] = tokens(rng, c.batch * c.seq, c.vocab);
  feeds["targets"] = tokens(rng, c.batch * c.seq, c.vocab);
  check_training_step(m, feeds);
}

// An FP32 GPT-2 under autocast: matmult (bf16 matmuls and attention, the
// rest FP32) and all (everything bf16 but norms, softmax, cross-entropy,
// embedding): the training step on the chip against the interpreter.
TEST(Runtime, AutocastGpt2TrainingStep) {
  for (const char* mode : {"matmult", "all"}) {
    SCOPED_TRACE(mode);
    Gpt2Config c;
    c.layers = 1, c.dim = 128, c.heads = 2, c.vocab = 97, c.seq = 64, c.batch = 2;
    c.dtype = DType::fp32;
    Model m = gpt2(c);
    Model a{autocast(m.graph, parse_autocast(mode, "bf16")), -1, {}};
    a.loss = a.graph.find("loss");
    for (int p : m.params) a.params.push_back(a.graph.find(m.graph.value(p).name));
    EXPECT_EQ(a.graph.value(a.loss).dtype, DType::fp32);
    int bf16_matmuls = 0, fp32_norm_inputs = 0;
    for (const Node& n : a.graph.nodes()) {
      bf16_matmuls += n.op == Op::matmul && a.graph.value(n.outputs[0]).dtype == DType::bf16;
      fp32_norm_inputs += n.op == Op::layernorm && a.graph.value(n.inputs[0]).dtype == DType::fp32;
    }
    EXPECT_EQ(bf16_matmuls, 5);  // c_attn, attn c_proj, c_fc, mlp c_proj, the head
    EXPECT_EQ(fp32_norm_inputs, 3);
    std::mt19937 rng(8);
    check_training_step(a, gpt2_feeds(a.graph, a.params, c.batch * c.seq, c.vocab, rng));
  }
  EXPECT_THROW(parse_autocast("matmult", "fp8_e5m2"), Error);  // E4M3 is the FP8 type
  EXPECT_THROW(parse_autocast("most", "bf16"), Error);
}

// Selective recomputation: the same training step, bit for bit, with less
// HBM for activations.
TEST(Runtime, SelectiveRecomputeGivesTheSameBitsInLessMemory) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  Gpt2Config c;
  c.layers = 2, c.dim = 128, c.heads = 2, c.vocab = 97, c.seq = 64, c.batch = 2;
  Model m = gpt2(c);
  const auto grads = add_backward(m.graph, m.loss, m.params);
  for (const auto& [p, d] : grads) m.graph.mark_output(d);
  const Graph r = recompute(m.graph, m.loss, "selective");
  EXPECT_GT(r.nodes().size(), m.graph.nodes().size());
  const Executable e0 = compile(m.graph, chip, {2}), e1 = compile(r, chip, {2});
  EXPECT_LT(e1.plan.transient_peak, e0.plan.transient_peak);
  std::mt19937 rng(12);
  std::map<std::string, std::vector<float>> feeds;
  for (int p : m.params)
    feeds[m.graph.value(p).name] =
        bf16_normal(static_cast<std::size_t>(elements(m.graph.value(p).shape)), rng, 0.05f);
  feeds["ids"] = tokens(rng, c.batch * c.seq, c.vocab);
  feeds["targets"] = tokens(rng, c.batch * c.seq, c.vocab);
  runtime::Device dev(chip);
  const auto a = dev.run(e0, feeds), b = dev.run(e1, feeds);
  ASSERT_EQ(a.outputs.size(), b.outputs.size());
  for (const auto& [name, v] : a.outputs) {
    SCOPED_TRACE(name);
    EXPECT_EQ(v, b.outputs.at(name));
  }
  EXPECT_THROW(recompute(m.graph, m.loss, "everything"), Error);
}

// GLU forward and backward kernels through the fusion patterns.
TEST(Runtime, GluForwardAndBackward) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  Graph g("glu");
  const std::int64_t R = 140, F = 96;
  const int gate = g.input("gate", {R, F}, DType::bf16), up = g.input("up", {R, F}, DType::bf16);
  const int dy = g.input("dy", {R, F}, DType::bf16);
  const int y = g.mul(g.act(Op::silu, gate), up);
  // The backward as autodiff writes it, with act(gate) recomputed so that
  // the pattern stands alone: dgate = silu'(gate) * (dy * up), dup = dy * silu(gate).
  const int dgate =
      g.add1(Op::act_backward, {g.mul(dy, up), gate}, {{"func", std::string("silu")}});
  const int dup = g.mul(dy, g.act(Op::silu, gate));
  for (int o : {y, dgate, dup}) g.mark_output(o);
  const Executable exe = compile(g, chip, {2});
  std::vector<std::string> kernels;
  for (const Launch& l : exe.launches) kernels.push_back(l.kernel);
  EXPECT_EQ(kernels, (std::vector<std::string>{"glu", "glu_backward"}));
  std::mt19937 rng(4);
  std::map<std::string, std::vector<float>> feeds{{"gate", bf16_normal(R * F, rng, 2.0f)},
                                                  {"up", bf16_normal(R * F, rng, 1.0f)},
                                                  {"dy", bf16_normal(R * F, rng, 1.0f)}};
  runtime::Device dev(chip);
  const runtime::StepResult r = dev.run(exe, feeds);
  std::map<std::string, HostData> hf;
  for (const auto& [k, v] : feeds) hf[k] = HostData(v.begin(), v.end());
  const auto want = evaluate(g, hf);
  for (int o : {y, dgate, dup}) {
    SCOPED_TRACE(g.value(o).name);
    EXPECT_LE(max_rel_error(r.outputs.at(g.value(o).name), want[static_cast<std::size_t>(o)]),
              2.0 / 128);
  }
}

// Runs g on the chip and checks `outs` against the interpreter (relative
// to each tensor's largest magnitude).
void check_graph(const Graph& g, const std::map<std::string, std::vector<float>>& feeds,
                 const std::vector<int>& outs, double tol) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  const Executable exe = compile(g, chip, {2});
  runtime::Device dev(chip);
  const runtime::StepResult r = dev.run(exe, feeds);
  std::map<std::string, HostData> hf;
  for (const auto& [k, v] : feeds) hf[k] = HostData(v.begin(), v.end());
  const auto want = evaluate(g, hf);
  for (int o : outs) {
    SCOPED_TRACE(g.value(o).name);
    EXPECT_LE(max_rel_error(r.outputs.at(g.value(o).name), want[static_cast<std::size_t>(o)]), tol);
  }
}

// Regressions found in review.
TEST(Runtime, NormWithCastRunsBeforeReadersOfItsResidualSum) {
  Graph g("n");
  const int x = g.input("x", {130, 64}, DType::bf16), r = g.input("r", {130, 64}, DType::bf16);
  const int h = g.add(x, r);
  const int y = g.rmsnorm(h, g.param("g", {64}, DType::bf16));
  const int z = g.scale(h, 2.0);  // reads the sum before the cast below
  const int yc = g.cast(y, DType::bf16);
  g.mark_output(z), g.mark_output(yc);
  std::mt19937 rng(1);
  check_graph(g,
              {{"x", bf16_normal(130 * 64, rng, 1.0f)},
               {"r", bf16_normal(130 * 64, rng, 1.0f)},
               {"g", bf16_normal(64, rng, 1.0f)}},
              {z, yc}, 2.0 / 128);
}

TEST(Runtime, ChainsReadingTheirFirstInputTwiceAndTheAttentionPattern) {
  Graph g("c");
  const int x = g.input("x", {130, 64}, DType::bf16), y = g.input("y", {130, 64}, DType::bf16);
  const int u = g.mul(g.add(x, y), x);  // a chain whose second op reads in0 again
  const int q = g.input("q", {1, 2, 128, 64}, DType::bf16);
  const int k = g.input("k", {1, 2, 128, 64}, DType::bf16),
            v = g.input("v", {1, 2, 128, 64}, DType::bf16);
  const int o = g.matmul(g.softmax(g.scale(g.matmul(q, k, false, true), 0.125)), v);
  g.mark_output(u), g.mark_output(o);
  std::mt19937 rng(2);
  const std::size_t n = 2 * 128 * 64;
  check_graph(g,
              {{"x", bf16_normal(130 * 64, rng, 1.0f)},
               {"y", bf16_normal(130 * 64, rng, 1.0f)},
               {"q", bf16_normal(n, rng, 1.0f)},
               {"k", bf16_normal(n, rng, 1.0f)},
               {"v", bf16_normal(n, rng, 1.0f)}},
              {u, o}, 2.0 / 128);
}

TEST(Runtime, CrossEntropyEdges) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  // Every token ignored: NaN loss, zero gradients (as PyTorch).
  Graph g("ce");
  const int l = g.param("logits", {16, 10}, DType::bf16);
  const int t = g.input("targets", {16}, DType::int32);
  const int loss = g.cross_entropy(l, t);
  g.mark_output(loss);
  const auto grads = add_backward(g, loss, {l});
  g.mark_output(grads.at(l));
  std::mt19937 rng(3);
  runtime::Device dev(chip);
  const auto r = dev.run(compile(g, chip), {{"logits", bf16_normal(160, rng, 1.0f)},
                                            {"targets", std::vector<float>(16, -100.0f)}});
  EXPECT_TRUE(std::isnan(r.outputs.at(g.value(loss).name)[0]));
  for (float d : r.outputs.at(g.value(grads.at(l)).name)) EXPECT_EQ(d, 0.0f);
  // A loss gradient of unknown sign is refused.
  Graph h("neg");
  const int l2 = h.param("logits", {16, 10}, DType::bf16);
  const int t2 = h.input("targets", {16}, DType::int32);
  const int neg = h.scale(h.cross_entropy(l2, t2), -1.0);
  h.mark_output(add_backward(h, neg, {l2}).at(l2));
  EXPECT_THROW(compile(h, chip), NotSupported);
}

TEST(Runtime, SaysWhatItCannotLowerYet) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  Graph g("perm");
  const int q = g.input("q", {2, 3, 4}, DType::bf16);
  g.mark_output(g.transpose(q, {2, 0, 1}));
  try {
    compile(g, chip);
    ADD_FAILURE() << "compiled";
  } catch (const NotSupported& e) {
    EXPECT_NE(
        std::string(e.what()).find("lowering transpose %t0: a transpose that moves the last dim"),
        std::string::npos)
        << e.what();
  }
  // With `partial`, the rest compiles and the report says what is missing.
  CompileOptions po;
  po.partial = true;
  const Executable ex = compile(g, chip, po);
  ASSERT_EQ(ex.unlowered.size(), 1u);
  EXPECT_TRUE(ex.launches.empty());
  runtime::Device d(chip);  // ... and it does not run
  EXPECT_THROW(d.run(ex, {{"q", std::vector<float>(24, 1.0f)}}), Error);
  // A kernel that takes another dtype than the value is refused at compile.
  Graph mix("mix");
  const int xm = mix.input("x", {4, 8}, DType::bf16);
  mix.mark_output(mix.rmsnorm(xm, mix.param("g", {8}, DType::fp32)));
  try {
    compile(mix, chip);
    ADD_FAILURE() << "compiled";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("%g is float32, its tensor gamma is bfloat16"),
              std::string::npos)
        << e.what();
  }
  // A missing feed is an error naming the value.
  Graph h("m");
  const int x = h.input("x", {4, 8}, DType::bf16);
  h.mark_output(h.act(Op::relu, x));
  runtime::Device dev(chip);
  EXPECT_THROW(dev.run(compile(h, chip), {}), Error);
}

}  // namespace
}  // namespace tern::graph
