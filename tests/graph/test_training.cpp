// The whole training step as one program: forward, backward and the AdamW
// step (graph/optimizer.h), run step after step by a runtime Session that
// keeps weights and optimizer state on the device (carries), against the
// interpreter running the same graph with the carries applied on the host.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "arch/chip.h"
#include "common/expect_error.h"
#include "common/graph_values.h"
#include "graph/autodiff.h"
#include "graph/eval.h"
#include "graph/models.h"
#include "graph/optimizer.h"
#include "graph/text.h"
#include "lower/lower.h"
#include "runtime/device.h"
#include "util/error.h"

namespace tern::graph {
namespace {

TEST(Training, AdamWStepsOnTheChipFollowTheInterpreter) {
  Gpt2Config c;
  c.layers = 1, c.dim = 128, c.heads = 2, c.vocab = 97, c.seq = 64, c.batch = 2;
  Model m = gpt2(c);
  const auto grads = add_backward(m.graph, m.loss, m.params);
  const OptimizerInputs oi = add_adamw(m.graph, grads);
  EXPECT_EQ(m.graph.carries().size(), 4 * m.params.size());  // bf16: weights, master, m, v
  // The text form keeps the carries.
  EXPECT_EQ(print(parse(print(m.graph))), print(m.graph));

  const arch::ChipSpec chip = arch::load_chip("trn3");
  const auto exe = std::make_shared<const Executable>(compile(m.graph, chip, {2}));
  int adamw_launches = 0;
  for (const Launch& l : exe->launches) adamw_launches += l.kernel == "adamw";
  EXPECT_EQ(adamw_launches, 1);  // every param in one multi-tensor kernel
  runtime::Session s(chip, exe);

  std::mt19937 rng(8);
  std::map<std::string, HostData> host;  // the interpreter's inputs
  auto put = [&](const std::string& name, const std::vector<float>& x) {
    s.write(name, x);
    host[name] = HostData(x.begin(), x.end());
  };
  // One batch, over and over: the loss must fall.
  for (const auto& [name, x] : gpt2_feeds(m.graph, m.params, c.batch * c.seq, c.vocab, rng))
    put(name, x);
  for (const auto& [master, param] : oi.master) put(master, s.read(param));
  for (const std::string& z : oi.zeros)
    put(z, std::vector<float>(
               static_cast<std::size_t>(elements(m.graph.value(m.graph.find(z)).shape)), 0.0f));
  std::map<std::string, HostData> start_weights;
  for (int p : m.params) start_weights[m.graph.value(p).name] = host[m.graph.value(p).name];

  std::vector<double> chip_loss, host_loss;
  for (int step = 1; step <= 4; ++step) {
    const auto sc = runtime::adamw_scalars(1e-2, 0.1, 0.9, 0.999, step);
    put(oi.scalars, sc);
    const runtime::StepResult r = s.step();
    chip_loss.push_back(r.outputs.at("loss")[0]);
    const auto want = evaluate(m.graph, host);
    host_loss.push_back(want[static_cast<std::size_t>(m.loss)][0]);
    for (const auto& [out, in] : m.graph.carries())
      host[m.graph.value(in).name] = want[static_cast<std::size_t>(out)];
    EXPECT_FALSE(r.events.empty());
    EXPECT_EQ(r.by_kernel().size() > 5, true);
    // Every launch ran on its tensors where the session keeps them: no
    // copy in or out of a kernel's HBM tensors.
    EXPECT_EQ(r.traffic.copied, 0) << "step " << step;
    EXPECT_EQ(r.traffic.copied_bytes, 0) << "step " << step;
    EXPECT_GE(r.traffic.bound, 2 * static_cast<std::int64_t>(exe->launches.size()));
    // Only AdamW's in-place update snapshots what it overwrites: a param,
    // its m and v (the master is written by the same tensor it is read by).
    EXPECT_LE(r.traffic.device_copies, 3 * static_cast<std::int64_t>(m.params.size()));
  }
  EXPECT_EQ(s.steps(), 4);
  for (std::size_t i = 0; i < chip_loss.size(); ++i)
    EXPECT_NEAR(chip_loss[i], host_loss[i], 0.01 * host_loss[i]) << "step " << i + 1;
  EXPECT_LT(chip_loss.back(), chip_loss.front() - 0.05);  // it learns
  // The updates after four steps (master - start), the chip's against the
  // host's in rel_l2. Adam's first steps move every weight by about lr
  // sign(g) whatever |g| is, so a weight whose gradient is below the chip's
  // BF16 noise may step the other way: the updates agree to ~10 %, not to
  // the BF16 rounding (measured: 0.014 to 0.12 over the params).
  for (int p : m.params) {
    const std::string n = m.graph.value(p).name;
    const auto got = s.read(n + ".master");
    const HostData& want = host[n + ".master"];
    const HostData& start = start_weights.at(n);
    // The key bias's exact gradient is 0 (a constant added to every key
    // shifts each query's scores alike, which softmax ignores): Adam turns
    // the rounding noise of both sides into +-lr steps, so its columns
    // [D, 2D) of c_attn.b are left out.
    const bool kbias = n == "h.0.attn.c_attn.b";
    double e = 0, w = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      if (kbias && i >= static_cast<std::size_t>(c.dim) && i < static_cast<std::size_t>(2 * c.dim))
        continue;
      const double du = got[i] - want[i], u = want[i] - start[i];
      e += du * du, w += u * u;
    }
    EXPECT_LE(std::sqrt(e / w), 0.2) << n;
  }
  // Reading what the device does not keep, writing what is not an input.
  EXPECT_THROW(s.write("loss", {1.0f}), Error);
  EXPECT_THROW(s.write("ids", {1.0f}), Error);
}

// examples/graphs/mlp.tgraph, all FP32 (its params are their own masters;
// its matmuls' transposed operands go through Tensor-engine transposes):
// three AdamW steps on the chip against the interpreter.
TEST(Training, Fp32MlpExampleTrains) {
  Graph g = load(TERN_EXAMPLES_DIR "/graphs/mlp.tgraph");
  std::vector<int> params;
  for (const Node& n : g.nodes())
    if (n.op == Op::param) params.push_back(n.outputs[0]);
  const int loss = g.find("loss");
  const auto grads = add_backward(g, loss, params);
  const OptimizerInputs oi = add_adamw(g, grads);
  EXPECT_TRUE(oi.master.empty());  // fp32 params: no separate masters
  const arch::ChipSpec chip = arch::load_chip("trn3");
  runtime::Session s(chip, std::make_shared<const Executable>(compile(g, chip, {2})));
  std::mt19937 rng(3);
  std::map<std::string, HostData> host;
  auto put = [&](const std::string& name, const std::vector<float>& x) {
    s.write(name, x);
    host[name] = HostData(x.begin(), x.end());
  };
  for (int p : params) {
    const auto n = static_cast<std::size_t>(elements(g.value(p).shape));
    std::normal_distribution<float> d(0.0f, 0.2f);
    std::vector<float> x(n);
    for (float& v : x) v = d(rng);
    put(g.value(p).name, x);
  }
  for (const std::string& z : oi.zeros)
    put(z, std::vector<float>(static_cast<std::size_t>(elements(g.value(g.find(z)).shape)), 0.0f));
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(32 * 64);
  for (float& v : x) v = d(rng);
  put("x", x), put("targets", tokens(rng, 32, 10));
  for (int step = 1; step <= 3; ++step) {
    put(oi.scalars, runtime::adamw_scalars(1e-2, 0.0, 0.9, 0.999, step));
    const auto r = s.step();
    const auto want = evaluate(g, host);
    EXPECT_NEAR(r.outputs.at("loss")[0], want[static_cast<std::size_t>(loss)][0], 1e-4)
        << "step " << step;
    for (const auto& [out, in] : g.carries())
      host[g.value(in).name] = want[static_cast<std::size_t>(out)];
  }
  for (int p : params)
    EXPECT_LE(max_rel_error(s.read(g.value(p).name), host[g.value(p).name]), 1e-3)
        << g.value(p).name;
}

// The compile cache returns the executable it has for the same graph,
// chip and options; LNC 2 (paired cores in the matmuls) gives the same
// bits as LNC 1.
TEST(Training, CompileCacheAndLogicalCores) {
  Gpt2Config c;
  c.layers = 1, c.dim = 128, c.heads = 2, c.vocab = 97, c.seq = 64, c.batch = 2;
  Model m = gpt2(c);
  for (const auto& [p, d] : add_backward(m.graph, m.loss, m.params)) m.graph.mark_output(d);
  const arch::ChipSpec chip = arch::load_chip("trn3");
  CompileCache cache;
  CompileOptions o1, o2;
  o1.cores = 4, o2.cores = 4, o2.lnc = 2;
  const auto e1 = cache.get(m.graph, chip, o1);
  EXPECT_EQ(cache.get(m.graph, chip, o1), e1);  // the same object
  const auto e2 = cache.get(m.graph, chip, o2);
  EXPECT_NE(e2, e1);
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(cache.misses(), 2);
  Graph other = m.graph;
  other.mark_output(other.scale(other.find("loss"), 2.0));
  EXPECT_NE(cache.get(other, chip, o1), e1);
  std::mt19937 rng(2);
  const auto feeds = gpt2_feeds(m.graph, m.params, c.batch * c.seq, c.vocab, rng);
  runtime::Device dev(chip);
  const auto r1 = dev.run(*e1, feeds), r2 = dev.run(*e2, feeds);
  EXPECT_EQ(r1.outputs, r2.outputs);
  o2.lnc = 3;
  EXPECT_THROW(compile(m.graph, chip, o2), Error);
  o2.lnc = 2, o2.cores = 2;  // trn1's two NeuronCore-v2 cannot pair
  EXPECT_THROW(compile(m.graph, arch::load_chip("trn1"), o2), NotSupported);
}

// Carries apply together (a swap works); reads are limited to what the
// device keeps; a bad feed changes nothing; a param that is also a graph
// output is not updated in place (the output is the value before the step).
TEST(Training, SessionSemantics) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  Graph g("swap");
  const int a = g.param("a", {128, 4}, DType::fp32), b = g.param("b", {128, 4}, DType::fp32);
  const int na = g.scale(b, 1.0), nb = g.scale(a, 1.0);
  const int mid = g.scale(a, 3.0), sum = g.add(mid, b);
  g.mark_output(sum);
  g.carry(na, a), g.carry(nb, b);
  runtime::Session s(chip, std::make_shared<const Executable>(compile(g, chip, {1})));
  s.fill("a", 1.0f), s.fill("b", 2.0f);
  s.step();
  EXPECT_EQ(s.read("a"), std::vector<float>(512, 2.0f));
  EXPECT_EQ(s.read("b"), std::vector<float>(512, 1.0f));
  EXPECT_THROW(s.read(g.value(mid).name), Error);  // an intermediate
  EXPECT_THROW(s.step({{"a", std::vector<float>(512, 9.0f)}, {"b", {1.0f}}}), Error);
  EXPECT_EQ(s.read("a"), std::vector<float>(512, 2.0f));  // the bad feed changed nothing

  Graph h("p_out");
  const int p = h.param("p", {128, 8}, DType::fp32);
  const int loss = h.cross_entropy(h.matmul(h.input("x", {4, 128}, DType::fp32), p),
                                   h.input("t", {4}, DType::int32));
  h.mark_output(loss);
  h.mark_output(p);  // the weights before the step
  const auto grads = add_backward(h, loss, {p});
  add_adamw(h, grads);
  runtime::Session t(chip, std::make_shared<const Executable>(compile(h, chip, {1})));
  t.fill("p", 0.5f), t.fill("p.adam_m", 0.0f), t.fill("p.adam_v", 0.0f);
  t.fill("x", 1.0f), t.write("t", {0.0f, 1.0f, 2.0f, 3.0f});
  t.write("adamw.scalars", runtime::adamw_scalars(0.1, 0.0, 0.9, 0.999, 1));
  const auto r = t.step();
  EXPECT_EQ(r.outputs.at("p"), std::vector<float>(1024, 0.5f));
  EXPECT_NE(t.read("p"), std::vector<float>(1024, 0.5f));  // updated for the next step
}

// Weight-decay groups: biases and norm weights read the no-decay scalars;
// fusion makes one multi-tensor kernel a group.
TEST(Training, WeightDecayGroups) {
  Gpt2Config c;
  c.layers = 1, c.dim = 128, c.heads = 2, c.vocab = 97, c.seq = 64, c.batch = 2;
  Model m = gpt2(c);
  const auto grads = add_backward(m.graph, m.loss, m.params);
  AdamWConfig ac;
  ac.no_decay_group = true;
  const OptimizerInputs oi = add_adamw(m.graph, grads, ac);
  ASSERT_EQ(oi.scalars_no_decay, "adamw.scalars_no_decay");
  const int nd = m.graph.find(oi.scalars_no_decay);
  int decayed = 0, not_decayed = 0;
  for (const Node& n : m.graph.nodes())
    if (n.op == Op::adamw) {
      const bool matrix = m.graph.value(n.inputs[0]).shape.size() >= 2;
      EXPECT_EQ(n.inputs[4] == nd, !matrix) << m.graph.value(n.outputs[3]).name;
      (matrix ? decayed : not_decayed) += 1;
    }
  EXPECT_EQ(decayed, 6);       // wte, wpe, c_attn.w, attn c_proj.w, c_fc.w, mlp c_proj.w
  EXPECT_EQ(not_decayed, 10);  // 4 biases, 3 LayerNorms' weights and biases
  const Executable e = compile(m.graph, arch::load_chip("trn3"), {2});
  int launches = 0;
  for (const Launch& l : e.launches) launches += l.kernel == "adamw";
  EXPECT_EQ(launches, 2);
}

TEST(Training, CarryErrors) {
  Graph g("c");
  const int x = g.param("x", {4}, DType::fp32), y = g.input("y", {4}, DType::bf16);
  const int z = g.scale(x, 2.0);
  EXPECT_THROW(g.carry(z, y), Error);  // dtype
  EXPECT_THROW(g.carry(x, z), Error);  // not an input or param
  g.carry(z, x);
  EXPECT_THROW(g.carry(z, x), Error);  // carried twice
  EXPECT_THROW(parse("graph g {\n  %a = input : [2] float32\n  carry %b -> %a\n}\n"), Error);
  // Missing inputs name themselves.
  const arch::ChipSpec chip = arch::load_chip("trn3");
  Graph h("h");
  h.mark_output(h.scale(h.input("a", {128, 4}, DType::bf16), 2.0));
  runtime::Session s(chip, std::make_shared<const Executable>(compile(h, chip, {1})));
  test_util::expect_error([&] { s.step(); }, "no value fed for %a");
}

}  // namespace
}  // namespace tern::graph
