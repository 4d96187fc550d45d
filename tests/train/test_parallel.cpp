// Data-parallel training over simulated chips: dp replicas, each
// on its own chip, all-reduce their FP32 gradient accumulators in replica
// order, so a step is bit-identical to one chip accumulating the same
// micro-batches (accum = dp); the all-reduce takes the fabric's time; a
// distributed run's checkpoints resume on another layout.
#include <cstring>
#include <tuple>

#include <fmt/format.h>
#include <filesystem>

#include <gtest/gtest.h>

#include "agreement.h"
#include "fabric/collective.h"
#include "lower/lower.h"
#include "runtime/system.h"
#include "train/trainer.h"
#include "util/error.h"

namespace tern::train {
namespace {

TrainConfig tiny(const std::string& recipe) {
  TrainConfig c;
  c.text = TERN_DATA_DIR "/tinyshakespeare.txt";
  c.layers = 1, c.dim = 128, c.heads = 2, c.batch = 4, c.seq = 64;
  c.recipe = recipe, c.cores = 2;
  c.lr = 3e-3, c.min_lr = 3e-4, c.warmup = 2, c.steps = 12;
  return c;
}

struct Trace {
  std::vector<double> loss, norm;
  std::map<std::string, std::vector<float>> params;
};

Trace train(const TrainConfig& c, int steps) {
  Trainer t(c);
  Trace r;
  for (int i = 0; i < steps; ++i) {
    const StepMetrics m = t.step();
    r.loss.push_back(m.loss), r.norm.push_back(m.grad_norm);
  }
  for (const std::string& p : t.param_names()) r.params[p] = t.param(p);
  return r;
}

void expect_same(const Trace& a, const Trace& b) {
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.norm, b.norm);
  ASSERT_EQ(a.params.size(), b.params.size());
  for (const auto& [name, x] : a.params) {
    const std::vector<float>& y = b.params.at(name);
    ASSERT_EQ(x.size(), y.size()) << name;
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << name;
  }
}

void expect_close(const Trace& a, const Trace& b, double tol) {
  ASSERT_EQ(a.loss.size(), b.loss.size());
  for (std::size_t i = 0; i < a.loss.size(); ++i)
    EXPECT_NEAR(b.loss[i], a.loss[i], tol * a.loss[i]) << "step " << i + 1;
}

TEST(DataParallel, BitIdenticalToOneChipAccumulating) {
  // Clipping is active (norms ~3 > clip 1), stochastic rounding on: the
  // norm, the rounding streams and the reduction order all have to match.
  for (const char* recipe : {"mxfp8", "bf16"}) {
    SCOPED_TRACE(recipe);
    TrainConfig one = tiny(recipe);
    one.accum = 4, one.stochastic_rounding = true;
    TrainConfig dp = tiny(recipe);
    dp.dp = 4, dp.stochastic_rounding = true;
    const Trace a = train(one, 3);
    const Trace b = train(dp, 3);
    expect_same(a, b);
    EXPECT_GT(a.norm.front(), 1.0);  // clipped
    TrainConfig serial = dp;
    serial.threads = 1;  // the host thread count does not matter
    expect_same(b, train(serial, 3));
  }
}

TEST(DataParallel, ShardedOptimizerIsBitIdentical) {
  // ZeRO-1: replica r updates shard r (whole params, about 1 / dp of the
  // elements), the gradients reduce-scattered and the weights all-gathered:
  // the same elementwise AdamW on the same sums, so the same bits.
  TrainConfig one = tiny("mxfp8");
  one.accum = 4;
  TrainConfig z = tiny("mxfp8");
  z.dp = 4, z.zero = 1;
  expect_same(train(one, 3), train(z, 3));
  Trainer t(z);
  const StepMetrics m = t.step();
  const auto& ev = t.system()->events();
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].op, fabric::Op::reduce_scatter);  // the gradients
  EXPECT_EQ(ev[1].op, fabric::Op::all_gather);      // the shards' sums of squares
  EXPECT_EQ(ev[2].op, fabric::Op::all_gather);      // the weights
  double comm = 0;
  for (const auto& e : ev) comm += e.duration.value();
  EXPECT_DOUBLE_EQ(m.comm_ns, comm);
  // Each chip's update program holds only its shard's optimizer state.
  TrainConfig z0 = tiny("mxfp8");
  z0.dp = 4;
  Trainer full(z0);
  EXPECT_LT(t.update_executable().plan.total(), full.update_executable().plan.total() / 2);
}

TEST(DataParallel, AccumulatingReplicasAgreeWithinRounding) {
  // dp 2 x accum 2 sums (g0 + g1) + (g2 + g3), one chip ((g0 + g1) + g2) +
  // g3: FP32 rounding apart, no more.
  TrainConfig one = tiny("bf16");
  one.accum = 4;
  TrainConfig dp = tiny("bf16");
  dp.dp = 2, dp.accum = 2;
  const Trace a = train(one, 4), b = train(dp, 4);
  expect_close(a, b, 5e-4);
  EXPECT_EQ(a.loss.front(), b.loss.front());  // same weights, same batches: the same forward
}

TEST(DataParallel, AllReduceTakesTheFabricsTime) {
  TrainConfig c = tiny("bf16");
  c.dp = 4, c.system = "trn3-ultraserver-gen1";
  Trainer t(c);
  const StepMetrics m = t.step();
  const runtime::System& s = *t.system();
  ASSERT_EQ(s.chips(), 4);
  ASSERT_EQ(s.events().size(), 1u);
  const runtime::CollectiveEvent& e = s.events().front();
  EXPECT_EQ(e.op, fabric::Op::all_reduce);
  EXPECT_EQ(e.bytes.value(), t.parameters() * 4);  // one FP32 bucket of every gradient
  const fabric::Cost want = fabric::best(
      s.network(), fabric::Collective{fabric::Op::all_reduce, e.bytes, s.placement({0, 1, 2, 3})});
  EXPECT_EQ(e.duration.value(), want.time.value());
  EXPECT_EQ(m.comm_ns, want.time.value());
  EXPECT_EQ(m.exposed_comm_ns, m.comm_ns);  // after the backward pass: nothing overlaps
  // The step on every chip: its grad program, the all-reduce, the norm of
  // the sum, the update, one after another. Without the all-reduce that is
  // the single chip's work, the sums of squares moved from the grad program
  // into the norm program.
  TrainConfig single = tiny("bf16");
  Trainer one(single);
  const double one_chip = one.step().sim_ns;
  for (int chip = 0; chip < 4; ++chip) {
    std::vector<std::string> names;
    double end = 0, compute = 0;
    for (const profile::Span& sp : s.trace())
      if (sp.process == chip) {
        names.push_back(sp.name);
        EXPECT_EQ(sp.start_ns, end) << sp.name;  // back to back
        end = sp.start_ns + sp.dur_ns;
        if (sp.track == "compute") compute += sp.dur_ns;
      }
    ASSERT_EQ(names.size(), 4u);
    EXPECT_EQ(names[0], "grad");
    EXPECT_EQ(names[2], "grad norm");
    EXPECT_EQ(names[3], "update");
    EXPECT_DOUBLE_EQ(end, m.sim_ns);
    EXPECT_DOUBLE_EQ(compute + m.comm_ns, m.sim_ns);
    EXPECT_NEAR(compute, one_chip, 0.05 * one_chip);
  }
  for (int chip = 0; chip < 4; ++chip) EXPECT_EQ(s.clock(chip).value(), s.clock(0).value());
}

// Buckets (bucket_mb) are all-reduced while the last backward still runs,
// each launched when its last gradient is final (accumulations are
// scheduled as soon as their gradient exists). The values are the same bits
// as one bucket after the backward; only the timeline changes: what is
// exposed is the part of the last all-reduce past the end of the backward.
TEST(DataParallel, BucketsOverlapTheBackward) {
  TrainConfig c = tiny("bf16");
  c.dp = 2, c.layers = 2, c.system = "trn3-ultraserver-gen1";
  TrainConfig after = c;
  c.bucket_mb = 0.05, after.bucket_mb = 0;
  expect_same(train(c, 2), train(after, 2));

  Trainer t(c), u(after);
  const StepMetrics m = t.step(), n = u.step();
  const runtime::System& s = *t.system();
  ASSERT_GT(s.events().size(), 3u);
  double grad_end = 0, last_end = 0, comm = 0;
  for (const profile::Span& sp : s.trace())
    if (sp.process == 0 && sp.name == "grad")
      grad_end = std::max(grad_end, sp.start_ns + sp.dur_ns);
  for (const runtime::CollectiveEvent& e : s.events()) {
    last_end = std::max(last_end, (e.start + e.duration).value());
    comm += e.duration.value();
  }
  EXPECT_LT(s.events().front().start.value(), grad_end);  // the first bucket overlaps
  EXPECT_DOUBLE_EQ(m.comm_ns, comm);
  EXPECT_DOUBLE_EQ(m.exposed_comm_ns, std::max(0.0, last_end - grad_end));
  EXPECT_LT(m.exposed_comm_ns, m.comm_ns);
  EXPECT_EQ(n.exposed_comm_ns, n.comm_ns);  // one bucket after the backward
  // The same compute either way: the steps differ by the exposed time.
  EXPECT_NEAR(n.sim_ns - m.sim_ns, n.exposed_comm_ns - m.exposed_comm_ns, 1e-6 * n.sim_ns);
}

TEST(DataParallel, CheckpointsResumeOnAnotherLayout) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "tern_test_dp_resume";
  std::filesystem::remove_all(dir);
  TrainConfig dp = tiny("mxfp8");
  dp.dp = 2, dp.zero = 1, dp.ckpt_dir = dir.string(), dp.ckpt_every = 2;
  Trace whole;
  {
    Trainer t(dp);
    for (int i = 0; i < 4; ++i) {
      whole.loss.push_back(t.step().loss);
      if (t.steps_done() % 2 == 0) t.save_checkpoint();
    }
  }
  // Step 2's checkpoint continues on one chip (accum 2: the same
  // micro-batches a step), on two chips with one host thread, and on two
  // with the optimizer state sharded.
  for (int layout = 0; layout < 3; ++layout) {
    SCOPED_TRACE(layout);
    TrainConfig c = tiny("mxfp8");
    if (layout == 0)
      c.accum = 2;
    else if (layout == 1)
      c.dp = 2, c.threads = 1;
    else
      c.dp = 2, c.zero = 1;
    c.resume = (dir / "step-00000002.ckpt").string();
    Trainer t(c);
    ASSERT_EQ(t.steps_done(), 2);
    EXPECT_EQ(t.step().loss, whole.loss[2]);
    EXPECT_EQ(t.step().loss, whole.loss[3]);
  }
  // Another number of micro-batches a step would change the data's order.
  TrainConfig other = tiny("mxfp8");
  other.resume = (dir / "step-00000002.ckpt").string();
  try {
    Trainer t(other);
    ADD_FAILURE() << "resumed with accum x dp 1 x 1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("accum x dp = 1 x 2"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// Two layers, 4 micro-batches a step: one chip, and dp 1 / 2 / 4 with
// `field` (pp or tp) 2 over the same micro-batches; the losses of `steps`
// steps agree within tol (a fraction of the loss).
void expect_agrees(const char* recipe, std::int64_t TrainConfig::*field, int steps, double tol) {
  SCOPED_TRACE(recipe);
  TrainConfig one = tiny(recipe);
  one.layers = 2, one.accum = 4;
  const Trace a = train(one, steps);
  // CI: the field alone and with dp 2; the benchmark adds dp 4.
  std::vector<std::pair<int, int>> layouts = {{1, 4}, {2, 2}};
  if (full_agreement()) layouts.emplace_back(4, 1);
  for (const auto& [dp, accum] : layouts) {
    SCOPED_TRACE(fmt::format("dp {}", dp));
    TrainConfig c = one;
    c.dp = dp, c.*field = 2, c.accum = accum;
    expect_close(a, train(c, steps), tol);
  }
}

// Pipeline parallel: stage s runs layers [s L / pp, (s + 1) L / pp), its
// backward recomputing its forward; 1F1B over the micro-batches.
TEST(PipelineParallel, SameLossesAsOneChipWithinTolerance) {
  // FP32: the stages compute what the whole program does up to FP32
  // rounding (the boundary's two gradient paths add in another order);
  // bf16 and mxfp8: the stage programs fuse the ops beside the boundary
  // differently (measured: 4e-5 and 1e-4 of the loss over 4 steps).
  for (const char* recipe : {"fp32", "bf16", "mxfp8"})
    expect_agrees(recipe, &TrainConfig::pp, 4, std::string(recipe) == "fp32" ? 1e-6 : 5e-4);
  // Eight chips: dp 2 x pp 4 of a 4-layer model (the benchmark).
  if (!full_agreement()) return;
  TrainConfig one = tiny("bf16");
  one.layers = 4, one.accum = 4;
  TrainConfig c = one;
  c.dp = 2, c.pp = 4, c.accum = 2;
  expect_close(train(one, 3), train(c, 3), 5e-4);
}

TEST(PipelineParallel, OneForwardOneBackwardSchedule) {
  TrainConfig c = tiny("bf16");
  c.layers = 2, c.pp = 2, c.accum = 4;
  Trainer t(c);
  const StepMetrics m = t.step();
  const runtime::System& s = *t.system();
  ASSERT_EQ(s.chips(), 2);
  std::vector<std::string> stage0, stage1;
  double end = 0;
  for (const profile::Span& sp : s.trace()) {
    if (sp.track != "compute") continue;
    (sp.process == 0 ? stage0 : stage1).push_back(sp.name);
    end = std::max(end, sp.start_ns + sp.dur_ns);
  }
  // Stage 0: one forward of warm-up, then forward and backward in turn.
  EXPECT_EQ(stage0, (std::vector<std::string>{"forward 0", "forward 1", "backward 0", "forward 2",
                                              "backward 1", "forward 3", "backward 2", "backward 3",
                                              "grad norm", "update"}));
  // The last stage: each micro-batch's forward and backward in one program.
  EXPECT_EQ(stage1, (std::vector<std::string>{"backward 0", "backward 1", "backward 2",
                                              "backward 3", "grad norm", "update"}));
  EXPECT_DOUBLE_EQ(end, m.sim_ns);
  // Activations forward and their gradients back: 2 x (pp - 1) x accum
  // transfers, then the tied embedding's gradient all-reduce between the
  // first and the last stage, and the stages' sums of squares.
  std::size_t p2p = 0, reduce = 0, gather = 0;
  for (const auto& e : s.events()) {
    p2p += e.op == fabric::Op::send_recv;
    reduce += e.op == fabric::Op::all_reduce;
    gather += e.op == fabric::Op::all_gather;
  }
  EXPECT_EQ(p2p, 8u);
  EXPECT_EQ(reduce, 1u);
  EXPECT_EQ(gather, 1u);
  EXPECT_GT(m.comm_ns, 0);
}

// A run on `layout` chips (field = 2) checkpoints at step 2; the same
// layout continues bit for bit, one chip (field = 1) within 5e-4.
void expect_resumes_on_one_chip(std::int64_t TrainConfig::*field, const std::string& tag) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / tag;
  std::filesystem::remove_all(dir);
  TrainConfig run = tiny("bf16");
  run.layers = 2, run.*field = 2, run.accum = 2, run.ckpt_dir = dir.string(), run.ckpt_every = 2;
  std::vector<double> whole;
  {
    Trainer t(run);
    for (int i = 0; i < 4; ++i) {
      whole.push_back(t.step().loss);
      if (t.steps_done() == 2) t.save_checkpoint();
    }
  }
  for (std::int64_t p : {2, 1}) {
    SCOPED_TRACE(p);
    TrainConfig c = run;
    c.*field = p, c.ckpt_every = 0, c.resume = (dir / "step-00000002.ckpt").string();
    Trainer t(c);
    for (int i = 2; i < 4; ++i) {
      const double l = t.step().loss;
      if (p == 2)
        EXPECT_EQ(l, whole[static_cast<std::size_t>(i)]);
      else
        EXPECT_NEAR(l, whole[static_cast<std::size_t>(i)], 5e-4 * l);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(PipelineParallel, CheckpointsResumeOnAnotherLayout) {
  expect_resumes_on_one_chip(&TrainConfig::pp, "tern_test_pp_resume");
}

// Tensor parallel (Megatron-LM): each layer's attention heads and MLP
// columns split over tp chips, their outputs and input gradients
// all-reduced; the rest replicated.
TEST(TensorParallel, SameLossesAsOneChipWithinTolerance) {
  // FP32: the partial sums round differently (measured 1e-7 of the loss);
  // bf16: each rank's partial rounds to bf16 before the sum (1e-4).
  for (const char* recipe : {"fp32", "bf16"})
    expect_agrees(recipe, &TrainConfig::tp, 3, std::string(recipe) == "fp32" ? 1e-6 : 5e-4);
  // mxfp8 with the default model's width: K = dim / tp = 64 in the
  // row-parallel projections (the MX matmul zero-pads it to 128); the MX
  // blocks of partial sums: 2e-3 over 3 steps.
  TrainConfig one = tiny("mxfp8");
  one.layers = 2, one.accum = 2;
  TrainConfig c = one;
  c.tp = 2;
  expect_close(train(one, 3), train(c, 3), 2e-3);
}

TEST(TensorParallel, WithPipelineStages) {
  // tp 2 x pp 2, and dp 2 x tp 2 x pp 2 = 8 chips: the same pieces, each
  // stage's on its own tp chips.
  for (const char* recipe : {"fp32", "bf16"}) {
    SCOPED_TRACE(recipe);
    TrainConfig one = tiny(recipe);
    one.layers = 2, one.accum = 4;
    const Trace a = train(one, 3);
    std::vector<std::pair<int, int>> layouts = {{1, 4}};
    if (full_agreement()) layouts.emplace_back(2, 2);  // 8 chips: the benchmark
    for (const auto& [dp, accum] : layouts) {
      TrainConfig c = one;
      c.dp = dp, c.tp = 2, c.pp = 2, c.accum = accum;
      expect_close(a, train(c, 3), std::string(recipe) == "fp32" ? 1e-6 : 5e-4);
    }
  }
  // 1F1B over the stages: chip 0 (stage 0, tp rank 0) runs one warm-up
  // forward, then forward and backward in turn; a stage's pieces and its
  // all-reduces make up each op.
  TrainConfig c = tiny("bf16");
  c.layers = 2, c.tp = 2, c.pp = 2, c.accum = 4;
  Trainer t(c);
  const StepMetrics m = t.step();
  const runtime::System& s = *t.system();
  ASSERT_EQ(s.chips(), 4);
  std::vector<std::string> order;
  for (const profile::Span& sp : s.trace())
    if (sp.process == 0 && sp.track == "compute" && (order.empty() || order.back() != sp.name))
      order.push_back(sp.name);
  EXPECT_EQ(order, (std::vector<std::string>{"forward 0", "forward 1", "backward 0", "forward 2",
                                             "backward 1", "forward 3", "backward 2", "backward 3",
                                             "grad norm", "update"}));
  std::size_t p2p = 0;
  for (const auto& e : s.events()) p2p += e.op == fabric::Op::send_recv;
  EXPECT_EQ(p2p, 2u * 2u * 4u);  // each tp rank: an activation on, a gradient back, per micro-batch
  double end = 0;
  for (int chip = 0; chip < 4; ++chip) end = std::max(end, s.clock(chip).value());
  EXPECT_DOUBLE_EQ(end, m.sim_ns);
}

TEST(TensorParallel, AllReducesOnTheTimeline) {
  TrainConfig c = tiny("bf16");
  c.layers = 2, c.tp = 2, c.accum = 2;
  Trainer t(c);
  const StepMetrics m = t.step();
  const runtime::System& s = *t.system();
  ASSERT_EQ(s.chips(), 2);
  // Per layer and micro-batch: after the attention and the MLP forward,
  // and after their backward: 4 x 2 layers x 2 micro-batches; then the
  // ranks' sums of squares.
  std::size_t reduce = 0, gather = 0;
  double comm = 0;
  for (const auto& e : s.events()) {
    reduce += e.op == fabric::Op::all_reduce;
    gather += e.op == fabric::Op::all_gather;
    comm += e.duration.value();
    EXPECT_EQ(e.chips, (std::vector<int>{0, 1}));
  }
  EXPECT_EQ(reduce, 16u);
  EXPECT_EQ(gather, 1u);
  EXPECT_DOUBLE_EQ(m.comm_ns, comm);
  EXPECT_DOUBLE_EQ(s.clock(0).value(), s.clock(1).value());
  EXPECT_DOUBLE_EQ(s.clock(0).value(), m.sim_ns);
}

// Sequence parallelism: the pieces between the tensor-parallel blocks run
// on seq / tp positions a rank. Row-wise, they give the same values (fp32
// to 1e-6 of tp alone); the norms' and biases' gradients are summed over
// the ranks' positions. Each all-reduce into or out of them becomes a
// reduce-scatter or an all-gather.
TEST(TensorParallel, SequenceParallel) {
  // CI: bf16 (the recipe where rounding could differ); the benchmark adds fp32.
  std::vector<const char*> recipes = {"bf16"};
  if (full_agreement()) recipes.insert(recipes.begin(), "fp32");
  for (const char* recipe : recipes) {
    SCOPED_TRACE(recipe);
    TrainConfig c = tiny(recipe);
    c.layers = 2, c.tp = 2;
    TrainConfig sp = c;
    sp.sp = true;
    TrainConfig one = tiny(recipe);
    one.layers = 2;
    const double tol = std::string(recipe) == "fp32" ? 1e-6 : 5e-4;
    const Trace a = train(sp, 3);
    expect_close(train(c, 3), a, tol);
    expect_close(train(one, 3), a, tol);
  }
  TrainConfig c = tiny("bf16");
  c.layers = 2, c.tp = 2, c.sp = true;
  Trainer t(c);
  const StepMetrics m = t.step();
  const runtime::System& s = *t.system();
  // Forward, 2 layers: reduce-scatters out of the attention and the first
  // MLP (3), all-gathers into the blocks and the head (4), the last MLP's
  // all-reduce into the head (1); the backward mirrors them; then the
  // norm's all-gather.
  std::map<fabric::Op, int> n;
  double comm = 0;
  for (const auto& e : s.events()) ++n[e.op], comm += e.duration.value();
  EXPECT_EQ(n[fabric::Op::reduce_scatter], 6);
  EXPECT_EQ(n[fabric::Op::all_gather], 9);
  EXPECT_EQ(n[fabric::Op::all_reduce], 2);
  EXPECT_DOUBLE_EQ(m.comm_ns, comm);
  EXPECT_DOUBLE_EQ(s.clock(0).value(), s.clock(1).value());
  c.seq = 63;
  EXPECT_THROW(Trainer{c}, Error);  // tp 2 does not divide seq 63
}

TEST(TensorParallel, CheckpointsResumeOnAnotherLayout) {
  // The checkpoint holds whole tensors, not a rank's slices.
  expect_resumes_on_one_chip(&TrainConfig::tp, "tern_test_tp_resume");
}

TEST(DataParallel, UnsupportedLayoutsSaySo) {
  auto message = [](TrainConfig c) {
    try {
      Trainer t(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  TrainConfig c = tiny("fp8-hybrid");
  c.dp = 2;
  EXPECT_NE(message(c).find("not supported: dp, tp or pp > 1 with recipe fp8-hybrid"),
            std::string::npos);
  c = tiny("bf16"), c.pp = 2;  // one layer
  EXPECT_NE(message(c).find("pp 2 is more pipeline stages than the 1 layers"), std::string::npos);
  c = tiny("bf16"), c.layers = 2, c.pp = 2, c.dp = 2, c.zero = 1;
  EXPECT_NE(message(c).find("not supported: zero 1 with pp > 1"), std::string::npos);
  c = tiny("bf16"), c.model = "llama", c.tp = 2;
  EXPECT_NE(message(c).find("not supported: tensor parallel training (tp > 1) of the llama"),
            std::string::npos);
  c = tiny("bf16"), c.tp = 4;  // 2 heads
  EXPECT_NE(message(c).find("tp 4 does not divide heads 2"), std::string::npos);
  c = tiny("bf16"), c.zero = 2;
  EXPECT_NE(message(c).find("ZeRO-2/3 are not supported"), std::string::npos);
  c = tiny("bf16"), c.dp = 2, c.system = "trn2-48xl";
  EXPECT_NE(message(c).find("made of trn2 chips, but arch is trn3"), std::string::npos);
  c = tiny("bf16"), c.dp = 2, c.system = "dgx-a100";
  EXPECT_NE(message(c).find("not supported: training on dgx-a100"), std::string::npos);
  c = tiny("bf16"), c.dp = 1000;
  EXPECT_NE(message(c).find("no system of trn3 chips holds 1000"), std::string::npos);
}

}  // namespace
}  // namespace tern::train
