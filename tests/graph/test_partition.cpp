// Pipeline stages cut from a model (graph/partition.h) and their backward
// from given output gradients (add_backward with seeds): chained on the
// chip, they compute what the whole program computes. In FP32 the loss bit
// for bit and the gradients to rounding; under bf16 and mxfp8 the stage
// programs fuse the ops next to the boundary differently from the whole
// program, so the loss agrees to 1e-4 (bf16) and 5e-4 (mxfp8: an MX
// block's scale can flip; measured 3e-4) and the gradients to the
// tolerances below.
#include <gtest/gtest.h>

#include <random>

#include "arch/chip.h"
#include "common/graph_values.h"
#include "graph/autocast.h"
#include "graph/autodiff.h"
#include "graph/models.h"
#include "graph/partition.h"
#include "lower/lower.h"
#include "runtime/device.h"
#include "util/error.h"

namespace tern::graph {
namespace {

std::map<std::string, std::vector<float>> only(const Graph& g,
                                               const std::map<std::string, std::vector<float>>& f) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [k, v] : f)
    if (g.find(k) >= 0 && g.node(g.value(g.find(k)).node).op != Op::reshape) out[k] = v;
  return out;
}

TEST(Partition, StagesChainToTheWholeModel) {
  for (const char* rec : {"fp32", "bf16", "mxfp8"}) {
    SCOPED_TRACE(rec);
    const arch::ChipSpec chip = arch::load_chip("trn3");
    Gpt2Config c;
    c.layers = 2, c.dim = 128, c.heads = 2, c.vocab = 97, c.seq = 64, c.batch = 2;
    c.dtype = DType::fp32;
    const Model m0 = gpt2(c);
    const Graph fwd =
        std::string(rec) == "fp32" ? m0.graph : autocast(m0.graph, recipe(rec, "trn3"));
    std::mt19937 rng(5);
    std::vector<int> ps;
    for (int p : m0.params) ps.push_back(fwd.find(m0.graph.value(p).name));
    const auto feeds = gpt2_feeds(fwd, ps, c.batch * c.seq, c.vocab, rng);

    // The whole program: loss and gradients.
    Graph whole = fwd;
    const auto grads = add_backward(whole, whole.find("loss"), ps);
    for (const auto& [p, d] : grads) whole.mark_output(d);
    runtime::Device dev(chip);
    const runtime::StepResult w = dev.run(compile(whole, chip, {2}), feeds);

    // Stage 0: embedding and layer 0 -> h.0.out; stage 1: layer 1, head, loss.
    const Graph s0 = extract(fwd, {}, {"h.0.out"}, "stage0");
    const Graph s1 = extract(fwd, {"h.0.out"}, {"loss"}, "stage1");
    EXPECT_GE(s0.find("wte"), 0);
    EXPECT_GE(s1.find("wte"), 0);  // tied: the head reads it too
    EXPECT_LT(s1.find("ids"), 0);
    const runtime::StepResult f0 = dev.run(compile(s0, chip, {2}), only(s0, feeds));
    auto feeds1 = only(s1, feeds);
    feeds1["h.0.out"] = f0.outputs.at("h.0.out");
    // Backward of stage 1 from its loss, of stage 0 from the gradient of its
    // output.
    Graph b1 = s1;
    std::vector<int> wrt1;
    for (int p : ps)
      if (b1.find(fwd.value(p).name) >= 0) wrt1.push_back(b1.find(fwd.value(p).name));
    wrt1.push_back(b1.find("h.0.out"));
    const auto g1 = add_backward(b1, b1.find("loss"), wrt1);
    for (const auto& [p, d] : g1) b1.mark_output(d);
    const runtime::StepResult r1 = dev.run(compile(b1, chip, {2}), feeds1);
    const bool fp32 = std::string(rec) == "fp32";
    std::printf("DEBUG %s w %.9g r1 %.9g\n", rec, w.outputs.at("loss")[0],
                r1.outputs.at("loss")[0]);
    if (fp32)
      EXPECT_EQ(r1.outputs.at("loss")[0], w.outputs.at("loss")[0]);  // bit for bit
    else  // the grad programs fuse the boundary's neighbours differently
      EXPECT_NEAR(r1.outputs.at("loss")[0], w.outputs.at("loss")[0],
                  (std::string(rec) == "bf16" ? 1e-4 : 5e-4) * w.outputs.at("loss")[0]);

    Graph b0 = s0;
    const int y = b0.find("h.0.out");
    const int dy = b0.input("grad.in.h.0.out", b0.value(y).shape, b0.value(y).dtype);
    std::vector<int> wrt0;
    for (int p : ps)
      if (b0.find(fwd.value(p).name) >= 0) wrt0.push_back(b0.find(fwd.value(p).name));
    const auto g0 = add_backward(b0, {{y, dy}}, wrt0);
    for (const auto& [p, d] : g0) b0.mark_output(d);
    auto feeds0 = only(b0, feeds);
    feeds0["grad.in.h.0.out"] = r1.outputs.at(b1.value(g1.at(b1.find("h.0.out"))).name);
    const runtime::StepResult r0 = dev.run(compile(b0, chip, {2}), feeds0);

    for (int p : ps) {
      const std::string n = fwd.value(p).name;
      SCOPED_TRACE(n);
      std::vector<float> got(static_cast<std::size_t>(elements(fwd.value(p).shape)), 0.0f);
      for (const auto* side : {&g0, &g1}) {
        const Graph& bg = side == &g0 ? b0 : b1;
        const int v = bg.find(n);
        if (v < 0 || !side->contains(v)) continue;
        const std::vector<float>& x =
            (side == &g0 ? r0 : r1).outputs.at(bg.value(side->at(v)).name);
        for (std::size_t i = 0; i < got.size(); ++i) got[i] += x[i];
      }
      const std::vector<float>& want = w.outputs.at(whole.value(grads.at(p)).name);
      const HostData wd(want.begin(), want.end());
      // fp32: rounding; bf16: a bf16 ulp or two of the largest element; mxfp8:
      // the MX blocks of another rounding of the boundary's gradient.
      EXPECT_LE(max_rel_error(got, wd), fp32 ? 1e-5 : std::string(rec) == "bf16" ? 0.02 : 0.15);
    }
    // A seed must match its value.
    Graph bad = s0;
    const int wrong = bad.input("wrong", {1}, DType::fp32);
    EXPECT_THROW(add_backward(bad, {{bad.find("h.0.out"), wrong}}, {}), Error);
    EXPECT_THROW(extract(fwd, {"nope"}, {"loss"}, "x"), Error);
  }
}

}  // namespace
}  // namespace tern::graph
