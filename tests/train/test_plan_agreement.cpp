// The planner against the simulator: the simulated
// step time of data-, pipeline- and tensor-parallel training agrees with
// `tern plan`'s prediction for the same model and layout within 15 %.
// CI runs one layout of each kind (dp, pp, tp); every layout, whose table
// is in docs/multichip.md, runs as a benchmark (bench/README.md):
//   TERN_FULL_AGREEMENT=1 build/tests/train/test_plan_agreement
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <gtest/gtest.h>

#include "agreement.h"
#include "arch/system.h"
#include "plan/estimate.h"
#include "train/trainer.h"

namespace tern::train {
namespace {

struct Case {
  std::int64_t dp, accum, pp = 1, tp = 1;
  bool overlap = false;  // DP buckets during the last backward (bucket_mb 25)
  bool sp = false;       // sequence parallelism (tp > 1)
};

TEST(PlanAgreement, StepTimeWithin15Percent) {
  // A GPT-2-style model big enough that its GEMMs are the planner's kind of
  // work (M = 1024 tokens, K and N >= 1024), small enough to simulate.
  TrainConfig c;
  c.text = TERN_DATA_DIR "/tinyshakespeare.txt";
  c.layers = 2, c.dim = 1024, c.heads = 8, c.batch = 1, c.seq = 1024;
  c.recipe = "bf16", c.system = "trn3-ultraserver-gen1";
  const arch::SystemSpec sys = arch::load_system(c.system);

  plan::Model pm;
  pm.name = "gpt2-2x1024", pm.layers = 2, pm.hidden = 1024, pm.heads = 8, pm.seq = 1024;
  pm.vocab = 65;  // TinyShakespeare's characters
  pm.tied_embeddings = true;
  std::printf(
      "| dp | tp | pp | accum | overlap | sp | simulated step (ms) | planned step (ms) | error | "
      "sim comm (ms) | sim exposed (ms) | planned DP exposed (ms) |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const std::vector<Case> all = {Case{1, 1},
                                 Case{2, 1},
                                 Case{4, 1},
                                 Case{2, 2},
                                 Case{1, 4, 2},
                                 Case{2, 2, 2},
                                 Case{1, 1, 1, 2},
                                 Case{2, 1, 1, 2},
                                 Case{2, 1, 1, 1, true},
                                 Case{4, 1, 1, 1, true},
                                 Case{1, 1, 1, 2, false, true}};
  const std::vector<Case> ci = {Case{2, 1}, Case{1, 4, 2}, Case{1, 1, 1, 2}};
  for (const Case& k : full_agreement() ? all : ci) {
    SCOPED_TRACE(k.dp);
    TrainConfig t = c;
    t.dp = k.dp, t.accum = k.accum, t.pp = k.pp, t.tp = k.tp;
    t.bucket_mb = k.overlap ? 25 : 0;
    t.sp = k.sp;
    Trainer tr(t);
    const StepMetrics m = tr.step();

    // The trainer's choices, told to the planner: FP32 gradients reduced
    // (grad_bytes 4); the all-reduce after the backward (no overlap), or
    // in buckets during the last backward (overlap 1: the planner hides
    // the DP traffic behind that backward).
    plan::Training pt;
    pt.global_batch = k.dp * k.accum, pt.micro_batch = 1, pt.recipe = "bf16";
    pt.grad_bytes = 4, pt.dp_overlap = k.overlap ? 1 : 0;
    plan::Layout l;
    l.dp = static_cast<int>(k.dp), l.pp = static_cast<int>(k.pp), l.tp = static_cast<int>(k.tp);
    l.sp = k.sp;
    // The trainer's pipeline stages and tensor-parallel pieces recompute
    // their forward in the backward.
    if (k.pp > 1 || k.tp > 1) l.recompute = plan::Recompute::full;
    // The trainer's ranks are whole chips (each replica runs on all cores).
    const plan::Planner planner(sys, pm, pt, static_cast<int>(k.dp * k.pp * k.tp),
                                arch::SystemSpec::kWholeChip);
    const plan::Estimate e = planner.estimate(l);
    const double sim = m.sim_ns, planned = e.time.step.value();
    const double err = (planned - sim) / sim;
    std::printf(
        "| %lld | %lld | %lld | %lld | %s | %s | %.3f | %.3f | %+.1f %% | %.3f | %.3f | %.3f |\n",
        static_cast<long long>(k.dp), static_cast<long long>(k.tp), static_cast<long long>(k.pp),
        static_cast<long long>(k.accum), k.overlap ? "yes" : "no", k.sp ? "yes" : "no", sim / 1e6,
        planned / 1e6, 100 * err, m.comm_ns / 1e6, m.exposed_comm_ns / 1e6,
        e.time.dp_exposed.value() / 1e6);
    EXPECT_LT(std::abs(err), 0.15) << "simulated " << sim << " ns, planned " << planned;
    // Data parallel alone: the one collective is the same formula on the
    // same fabric. (With stages the simulated comm also holds the
    // send/recv, the tied embedding's all-reduce and the norm's gather.)
    if (k.pp == 1 && k.tp == 1 && !k.overlap) {
      EXPECT_NEAR(m.comm_ns, e.time.dp_exposed.value(), 0.02 * m.comm_ns + 1);
    }
  }
}

}  // namespace
}  // namespace tern::train
