// The training loop: the learning-rate schedule, and short runs of a small
// GPT on TinyShakespeare on the simulated trn3: the loss falls, and two runs
// of one config give the same losses bit for bit.
#include <filesystem>

#include <gtest/gtest.h>

#include "lower/lower.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/file.h"

namespace tern::train {
namespace {

TEST(Trainer, WarmupThenCosine) {
  TrainConfig c;
  c.lr = 1e-3, c.min_lr = 1e-4, c.warmup = 10, c.steps = 110;
  EXPECT_DOUBLE_EQ(learning_rate(c, 1), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 10), 1e-3);
  EXPECT_NEAR(learning_rate(c, 60), 0.5 * (1e-3 + 1e-4), 1e-15);  // half way down the cosine
  EXPECT_DOUBLE_EQ(learning_rate(c, 110), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 500), 1e-4);
}

TrainConfig tiny(const std::string& recipe) {
  TrainConfig c;
  c.text = TERN_DATA_DIR "/tinyshakespeare.txt";
  c.layers = 1, c.dim = 128, c.heads = 2, c.batch = 4, c.seq = 64;
  c.recipe = recipe, c.cores = 2, c.mx_policy = "trn3";
  c.lr = 3e-3, c.min_lr = 3e-4, c.warmup = 2, c.steps = 12;
  return c;
}

TEST(Trainer, LossFallsAndRunsRepeat) {
  for (const char* recipe : {"bf16", "mxfp8"}) {
    SCOPED_TRACE(recipe);
    Trainer a(tiny(recipe)), b(tiny(recipe));
    EXPECT_EQ(a.tokenizer().vocab(), 65);
    EXPECT_TRUE(a.executable().unlowered.empty());
    std::vector<double> la, lb;
    for (int i = 0; i < 12; ++i) la.push_back(a.step().loss), lb.push_back(b.step().loss);
    EXPECT_EQ(la, lb);                   // deterministic, bit for bit
    EXPECT_NEAR(la.front(), 4.17, 0.1);  // ln 65 at initialization
    EXPECT_LT(la.back(), la.front() - 0.5) << la.back();
    // Validation: the same batches each time, the same number for the twin
    // run, and below the untrained loss (what was learned carries over to
    // held-out text).
    const double v = a.validate(2);
    EXPECT_EQ(v, a.validate(2));
    EXPECT_EQ(v, b.validate(2));
    EXPECT_LT(v, la.front() - 0.3);
  }
}

TEST(Trainer, BadConfigs) {
  TrainConfig c = tiny("bf16");
  c.text = "/nonexistent.txt";
  EXPECT_THROW(Trainer{c}, Error);
  c = tiny("bf16");
  c.recipe = "fp4";
  EXPECT_THROW(Trainer{c}, Error);
  c = tiny("bf16");
  c.min_lr = 1.0;
  EXPECT_THROW(Trainer{c}, Error);
}

std::vector<StepMetrics> run(Trainer& t, int steps) {
  std::vector<StepMetrics> out;
  while (t.steps_done() < steps) out.push_back(t.step());
  return out;
}

std::vector<double> losses(const std::vector<StepMetrics>& ms) {
  std::vector<double> l;
  for (const StepMetrics& m : ms)
    if (m.updated) l.push_back(m.loss);
  return l;
}

std::string fresh_dir(const std::string& name) {
  const auto d =
      std::filesystem::temp_directory_path() / ("tern_train_" + name + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d.string();
}

bool has_action(const StepMetrics& m, const std::string& text) {
  for (const std::string& a : m.actions)
    if (a.find(text) != std::string::npos) return true;
  return false;
}

// Resuming from a checkpoint continues bit for bit: weights, moments,
// masters, the data position and the schedule all come back.
TEST(Trainer, ResumeIsBitExact) {
  TrainConfig c = tiny("mxfp8");
  c.steps = 8, c.ckpt_dir = fresh_dir("resume"), c.ckpt_every = 4;
  Trainer a(c);
  std::vector<double> la;
  while (a.steps_done() < 8) {
    la.push_back(a.step().loss);
    if (a.steps_done() % 4 == 0) a.save_checkpoint();
  }
  TrainConfig r = c;
  r.resume = checkpoint_path(c.ckpt_dir, 4).string();
  Trainer b(r);
  EXPECT_EQ(b.steps_done(), 4);
  std::vector<double> lb;
  while (b.steps_done() < 8) lb.push_back(b.step().loss);
  EXPECT_EQ(lb, std::vector<double>(la.begin() + 4, la.end()));
  EXPECT_EQ(b.param("h.0.mlp.c_fc.w"), a.param("h.0.mlp.c_fc.w"));
  // A truncated newest checkpoint: the directory resumes from the one before.
  const std::string newest = checkpoint_path(c.ckpt_dir, 8).string();
  const std::string bytes = read_file(newest);
  write_file_atomic(newest, bytes.substr(0, bytes.size() / 2));
  r.resume = c.ckpt_dir;
  Trainer d(r);
  EXPECT_EQ(d.steps_done(), 4);
  ASSERT_GE(d.notes().size(), 2u);
  EXPECT_NE(d.notes()[0].find("truncated"), std::string::npos) << d.notes()[0];
  // Another model cannot resume it, nor the fp32 recipe (no masters).
  r.recipe = "fp32";
  EXPECT_THROW(Trainer{r}, Error);
  r.recipe = c.recipe, r.layers = 2;
  EXPECT_THROW(Trainer{r}, Error);
  std::filesystem::remove_all(c.ckpt_dir);
}

TEST(Trainer, NanPolicies) {
  TrainConfig c = tiny("mxfp8");
  c.steps = 5;
  c.faults = {parse_fault("nan@3")};
  {  // skip: no update at step 3, training goes on
    Trainer t(c);
    const auto ms = run(t, 5);
    ASSERT_EQ(ms.size(), 5u);
    EXPECT_FALSE(ms[2].updated);
    EXPECT_EQ(ms[2].nonfinite, 1);
    EXPECT_TRUE(has_action(ms[2], "skipped the update")) << ms[2].actions.back();
    EXPECT_TRUE(ms[3].updated && std::isfinite(ms[4].loss));
  }
  {  // fallback-layer: the last layer goes to bf16, the step is redone
    c.nan_policy = "fallback-layer";
    Trainer t(c);
    const auto ms = run(t, 5);
    EXPECT_TRUE(ms[2].updated);
    EXPECT_TRUE(has_action(ms[2], "layer 0 falls back to bf16"));
    EXPECT_EQ(t.bf16_layers(), std::set<std::int64_t>{0});
    EXPECT_EQ(t.recipe(), "mxfp8");
  }
  {  // fallback-global: the whole recipe to bf16
    c.nan_policy = "fallback-global";
    Trainer t(c);
    const auto ms = run(t, 5);
    EXPECT_TRUE(ms[2].updated);
    EXPECT_TRUE(has_action(ms[2], "falls back to bf16"));
    EXPECT_EQ(t.recipe(), "bf16");
    EXPECT_TRUE(std::isfinite(ms[4].loss));
  }
  {  // tolerated below nan_rate: the bad elements are zeroed, the run goes on
    c.nan_policy = "skip", c.nan_rate = 1e-3;
    Trainer t(c);
    const auto ms = run(t, 5);
    EXPECT_TRUE(ms[2].updated);
    EXPECT_EQ(ms[2].nonfinite, 1);
    EXPECT_TRUE(std::isfinite(ms[2].grad_norm));
    EXPECT_TRUE(has_action(ms[2], "tolerated"));
    EXPECT_TRUE(std::isfinite(ms[4].loss) && std::isfinite(ms[4].grad_norm));
    c.nan_rate = 0;
  }
  {  // stop
    c.nan_policy = "stop";
    Trainer t(c);
    t.step(), t.step();
    try {
      t.step();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("step 3: 1 non-finite"), std::string::npos) << e.what();
    }
  }
  {  // rollback: back to the step-2 checkpoint, step 3's batch skipped
    c.nan_policy = "rollback", c.ckpt_dir = fresh_dir("rollback"), c.ckpt_every = 2;
    Trainer t(c);
    std::vector<StepMetrics> ms;
    while (t.steps_done() < 5) {
      ms.push_back(t.step());
      if (t.steps_done() % 2 == 0 && ms.back().updated) t.save_checkpoint();
    }
    ASSERT_EQ(ms.size(), 6u);  // steps 1, 2, 3 (rolled back to 2), 3, 4, 5
    EXPECT_FALSE(ms[2].updated);
    EXPECT_TRUE(has_action(ms[2], "rolled back to"));
    EXPECT_EQ(ms[3].step, 3);
    EXPECT_TRUE(ms[3].updated);
    std::filesystem::remove_all(c.ckpt_dir);
  }
  {  // rollback cannot help a fault that is not the batch's: an error, not a loop
    c.nan_policy = "rollback", c.ckpt_dir = fresh_dir("rollback2"), c.ckpt_every = 2;
    c.faults.clear();
    Trainer t(c);
    t.step(), t.step();
    std::vector<float> w = t.param("h.0.mlp.c_fc.w");
    w[0] = std::nanf("");
    t.set_param("h.0.mlp.c_fc.w", w);
    t.save_checkpoint();             // the checkpoint holds the NaN weight
    EXPECT_FALSE(t.step().updated);  // rolled back
    try {
      t.step();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("again after a rollback"), std::string::npos)
          << e.what();
    }
    std::filesystem::remove_all(c.ckpt_dir);
  }
}

// A failed step is retried from the same batch: the run is the same as one
// without the fault; past the retries it rolls back to the checkpoint.
TEST(Trainer, RetriesThenRollback) {
  TrainConfig c = tiny("bf16");
  c.steps = 4;
  Trainer plain(c);
  const auto want = losses(run(plain, 4));
  c.faults = {parse_fault("fail@3x2")}, c.retries = 2;
  Trainer t(c);
  const auto ms = run(t, 4);
  EXPECT_EQ(losses(ms), want);
  EXPECT_EQ(ms[2].retries, 2);
  c.faults = {parse_fault("fail@3x3")}, c.ckpt_dir = fresh_dir("retry"), c.ckpt_every = 2;
  Trainer r(c);
  std::vector<StepMetrics> rs;
  while (r.steps_done() < 4) {
    rs.push_back(r.step());
    if (r.steps_done() % 2 == 0 && rs.back().updated) r.save_checkpoint();
  }
  ASSERT_EQ(rs.size(), 5u);
  EXPECT_TRUE(has_action(rs[2], "rolled back to"));
  EXPECT_EQ(losses(rs), want);  // the fault was transient: the same run
  c.ckpt_every = 0, c.ckpt_dir.clear();
  Trainer n(c);
  n.step(), n.step();
  EXPECT_THROW(n.step(), Error);  // nothing to roll back to
  std::filesystem::remove_all(c.ckpt_dir);
}

// Accumulation over micro-batches sees the same windows as one big batch;
// clipping scales the update by clip / norm.
TEST(Trainer, AccumulationAndClipping) {
  TrainConfig big = tiny("bf16");
  TrainConfig acc = big;
  acc.batch = 2, acc.accum = 2;
  Trainer a(big), b(acc);
  const StepMetrics ma = a.step(), mb = b.step();
  EXPECT_NEAR(mb.loss, ma.loss, 2e-3 * ma.loss);
  EXPECT_NEAR(mb.grad_norm, ma.grad_norm, 2e-2 * ma.grad_norm);
  EXPECT_DOUBLE_EQ(ma.clip_scale, 1.0 / (ma.grad_norm + 1e-6));  // norm ~3 at init > clip 1
  TrainConfig clip = tiny("bf16");
  clip.clip = 0.5;
  Trainer c(clip);
  const StepMetrics mc = c.step();
  EXPECT_DOUBLE_EQ(mc.clip_scale, 0.5 / (mc.grad_norm + 1e-6));
}

// Monitors replay the step in the interpreter: every quantized operand of
// forward and backward is counted; a NaN in the weights shows up there.
TEST(Trainer, MonitorsCountEveryQuantizedOperand) {
  TrainConfig c = tiny("mxfp8");
  c.monitor_every = 2;
  Trainer t(c);
  const StepMetrics a = t.step(), b = t.step();
  EXPECT_TRUE(a.monitors.empty());
  // 1 layer: 4 forward matmuls (qkv, proj, fc, proj) x 2 operands, and
  // their backward (dgrad and wgrad, 2 operands each): 24 sites.
  ASSERT_EQ(b.monitors.size(), 24u);
  for (const auto& [site, st] : b.monitors) {
    EXPECT_GT(st.elements, 0) << site;
    EXPECT_EQ(st.nonfinite, 0) << site;
    EXPECT_LE(st.scale_min, st.scale_max) << site;
  }
  std::vector<float> w = t.param("h.0.mlp.c_fc.w");
  w[5] = std::nanf("");
  t.set_param("h.0.mlp.c_fc.w", w);
  t.step();
  const StepMetrics d = t.step();  // step 4: monitored; the NaN reached the operands
  std::int64_t nonfinite = 0;
  for (const auto& [site, st] : d.monitors) nonfinite += st.nonfinite;
  EXPECT_GT(nonfinite, 0);
}

// Stochastic rounding: another run than round-to-nearest, the same one
// again with the same seed, another with another seed.
TEST(Trainer, StochasticRoundingIsSeeded) {
  TrainConfig c = tiny("bf16");
  c.steps = 3;
  Trainer rne(c);
  c.stochastic_rounding = true;
  Trainer a(c), b(c);
  c.seed = 7;
  Trainer other(c);
  const auto lr = losses(run(rne, 3)), la = losses(run(a, 3)), lb = losses(run(b, 3));
  EXPECT_EQ(la, lb);
  EXPECT_NE(la, lr);
  EXPECT_NE(losses(run(other, 3)), la);
  EXPECT_NEAR(la.back(), lr.back(), 0.05);
}

TEST(Trainer, LlamaTrains) {
  TrainConfig c = tiny("mxfp8");
  c.model = "llama";
  Trainer t(c);
  const auto ms = run(t, 12);
  EXPECT_NEAR(ms.front().loss, 4.17, 0.1);
  EXPECT_LT(ms.back().loss, ms.front().loss - 0.4) << ms.back().loss;
}

}  // namespace
}  // namespace tern::train
