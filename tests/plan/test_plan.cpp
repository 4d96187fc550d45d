// The planner's memory formulas against the published per-parameter and
// per-layer figures (training.md: Rajbhandari et al., Korthikanti et al.),
// rank placement, validation errors and search invariants.
#include <gtest/gtest.h>

#include <tuple>

#include "arch/system.h"
#include "plan/estimate.h"
#include "plan/request.h"
#include "plan/search.h"
#include "util/error.h"

namespace tern::plan {
namespace {

// GPT-3 175B as in Korthikanti et al. 2022 (a = 96, h = 12288, s = 2048).
Model gpt3() {
  return load_model("gpt3-175b");
}

Training training(std::int64_t batch, int micro) {
  Training t;
  t.global_batch = batch;
  t.micro_batch = micro;
  t.attention = "unfused";
  return t;
}

Planner a100(const Model& m, const Training& t, int chips) {
  return Planner(arch::load_system("dgx-a100"), m, t, chips);
}

TEST(PlanMemory, ModelStatePerParameterFollowsZero) {
  // 16 B per parameter; ZeRO-1 4 + 12/d; ZeRO-2 2 + 14/d; ZeRO-3 16/d.
  const Model m = gpt3();
  const Planner p = a100(m, training(64, 1), 64);
  for (int zero = 0; zero <= 3; ++zero) {
    Layout l;
    l.tp = 8, l.pp = 8, l.dp = 1, l.zero = zero;
    // dp = 1: every stage equals the baseline of 16 bytes per parameter.
    const auto one = p.estimate(l).memory;
    const double P = static_cast<double>(one.weights.value()) / 2;
    EXPECT_NEAR(static_cast<double>((one.weights + one.grads + one.optimizer).value()), 16 * P, 16);
  }
  const Planner p8 = a100(m, training(64, 1), 512);
  const double d = 8;
  const double per_param[] = {16, 4 + 12 / d, 2 + 14 / d, 16 / d};
  Layout base;
  base.tp = 8, base.pp = 8, base.dp = 8;
  const double P = static_cast<double>(p8.estimate(base).memory.weights.value()) / 2;
  for (int zero = 0; zero <= 3; ++zero) {
    Layout l = base;
    l.zero = zero;
    const auto mem = p8.estimate(l).memory;
    EXPECT_NEAR(static_cast<double>((mem.weights + mem.grads + mem.optimizer).value()) / P,
                per_param[zero], 1e-6)
        << "ZeRO-" << zero;
  }
}

TEST(PlanMemory, ActivationsPerLayerMatchKorthikanti) {
  Model m = gpt3();
  m.layers = 8;  // small, one stage
  const double s = 2048, b = 1, h = 12288, a = 96;
  const Planner p = a100(m, training(1, 1), 8);
  Layout l;
  l.tp = 1, l.pp = 1, l.dp = 8;
  // dp 8 needs a batch of 8: use a planner with it.
  const Planner p8 = a100(m, training(8, 1), 8);
  // No parallelism, no recompute: s b h (34 + 5 a s / h) per layer.
  auto act = p8.estimate(l).memory.activations.value();
  EXPECT_NEAR(static_cast<double>(act), 8 * s * b * h * (34 + 5 * a * s / h), 8);
  // Tensor parallel t = 8 with sequence parallel and selective recompute:
  // 34 s b h / t per layer.
  Layout tsp;
  tsp.tp = 8, tsp.dp = 1, tsp.sp = true, tsp.recompute = Recompute::selective;
  act = p.estimate(tsp).memory.activations.value();
  EXPECT_NEAR(static_cast<double>(act), 8 * 34 * s * b * h / 8, 8);
  // Tensor parallel without sequence parallel: s b h (10 + 24/t + 5 a s/(h t)).
  Layout tp;
  tp.tp = 8, tp.dp = 1;
  act = p.estimate(tp).memory.activations.value();
  EXPECT_NEAR(static_cast<double>(act), 8 * s * b * h * (10 + 24.0 / 8 + 5 * a * s / (h * 8)), 8);
}

TEST(PlanMemory, ParameterCountMatchesMegatronEq2) {
  // Narayanan et al. Eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)).
  const Model m = gpt3();
  const Planner p = a100(m, training(64, 1), 64);
  const double l = 96, h = 12288, V = 51200, s = 2048;
  const double eq2 = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
  // tern also counts a separate output projection (V h) and the final norm.
  EXPECT_NEAR(p.params(), eq2 + V * h + 2 * h, 1);
}

TEST(PlanPlacement, GroupsLandOnTheFabricLevels) {
  const auto net = fabric::Network::of(arch::load_system("dgx-a100"), 64);  // 8 x 8
  Layout l;
  l.tp = 8, l.pp = 2, l.dp = 4;
  EXPECT_EQ(group_of(l, "tp", net)->span, (std::vector<int>{8, 1}));
  EXPECT_EQ(group_of(l, "dp", net)->span, (std::vector<int>{1, 4}));
  EXPECT_EQ(group_of(l, "pp", net)->span, (std::vector<int>{1, 2}));
  l.order = {"dp", "tp", "cp", "pp"};
  EXPECT_EQ(group_of(l, "dp", net)->span, (std::vector<int>{4, 1}));
  EXPECT_EQ(group_of(l, "tp", net)->span, (std::vector<int>{2, 4}));
}

TEST(PlanPlacement, StrideFormulaAgreesWithTheMemberListPlacement) {
  // group_of counts spans from a stride (fast, for search); fabric::placement
  // from the member chips (runtime::System). They must agree.
  const auto net = fabric::Network::of(arch::load_system("trn3-ultraserver-gen1"), 1024);
  for (auto [tp, cp, pp] : {std::tuple{8, 1, 4}, {4, 2, 8}, {16, 1, 2}, {2, 4, 16}, {1, 1, 64}}) {
    Layout l;
    l.tp = tp, l.cp = cp, l.pp = pp, l.dp = 1024 / (tp * cp * pp);
    std::int64_t stride = 1;
    for (const auto& d : l.order) {
      const int size = d == "tp" ? l.tp : d == "cp" ? l.cp : d == "dp" ? l.dp : l.pp;
      std::vector<int> members;
      for (int i = 0; i < size; ++i) members.push_back(static_cast<int>(i * stride));
      EXPECT_EQ(group_of(l, d, net)->span, fabric::placement(net, members).span)
          << d << " of tp" << tp << " cp" << cp << " pp" << pp;
      stride *= size;
    }
  }
}

TEST(PlanErrors, BadLayoutsAreRejectedWithTheReason) {
  const Model m = load_model("llama3-70b");
  Training t;
  t.global_batch = 1024;
  const Planner p(arch::load_system("trn3-ultraserver-gen2"), m, t, 144);
  const auto message = [&](Layout l) {
    try {
      p.estimate(l);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Layout l;
  l.tp = 3, l.dp = 48;
  EXPECT_NE(message(l).find("tp 3 does not divide heads 64"), std::string::npos) << message(l);
  l = Layout{};
  l.tp = 8, l.pp = 4, l.dp = 8;  // 144 chips hold 576 logical cores (LNC=2)
  EXPECT_NE(message(l).find("= 256 ranks but 576 are given"), std::string::npos) << message(l);
  l = Layout{};
  l.tp = 8, l.pp = 3, l.dp = 6;
  EXPECT_NE(message(l).find("pp 3 x vpp 1 does not divide layers 80"), std::string::npos);
  EXPECT_THROW(Planner(arch::load_system("dgx-a100"), m, Training{1024, 1, 0, "mxfp8"}, 8),
               NotSupported);
  EXPECT_THROW(arch::load_system("no-such-system"), Error);
  EXPECT_THROW(Planner(arch::load_system("dgx-a100"), m, t, 12), Error);  // not whole nodes
  EXPECT_THROW(search(p, SearchOptions{0}), Error);
  // A part of a switched level: 32 of a Gen2 UltraServer's 36 servers.
  EXPECT_EQ(fabric::Network::of(arch::load_system("trn3-ultraserver-gen2"), 128).chips(), 128);
}

TEST(PlanSearch, ListsOnlyFittingLayoutsFastestFirst) {
  const Model m = load_model("llama3-70b");
  Training t;
  t.global_batch = 1024;
  const Planner p(arch::load_system("trn3-ultraserver-gen1"), m, t, 1024);
  const SearchResult r = search(p, SearchOptions{5});
  ASSERT_EQ(r.best.size(), 5u);
  EXPECT_GT(r.evaluated, 10000);
  for (std::size_t i = 0; i < r.best.size(); ++i) {
    EXPECT_TRUE(r.best[i].memory.fits);
    EXPECT_LE(r.best[i].memory.total, r.best[i].memory.usable);
    EXPECT_EQ(r.best[i].layout.ranks(), p.ranks());  // 1024 chips x 4 logical cores
    if (i > 0) {
      EXPECT_LE(r.best[i - 1].time.step, r.best[i].time.step);
    }
    // Every listed layout is valid and estimates the same through the
    // checked path.
    EXPECT_DOUBLE_EQ(p.estimate(r.best[i].layout).time.step.value(), r.best[i].time.step.value());
  }
  EXPECT_GT(r.best[0].mfu, 0.2);
  EXPECT_LT(r.best[0].mfu, 1.0);
  // One row per plan: no two listed layouts share step time and memory;
  // the layouts that do are named beside the simplest of them (here: the
  // recompute modes that change nothing under fused attention).
  ASSERT_EQ(r.alternatives.size(), r.best.size());
  std::size_t named = 0;
  for (std::size_t i = 0; i < r.best.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j)
      EXPECT_FALSE(r.best[i].time.step == r.best[j].time.step &&
                   r.best[i].memory.total == r.best[j].memory.total)
          << i << " and " << j;
    for (const Layout& l : r.alternatives[i]) {
      ++named;
      const Estimate e = p.estimate(l);
      EXPECT_EQ(e.time.step, r.best[i].time.step);
      EXPECT_EQ(e.memory.total, r.best[i].memory.total);
      EXPECT_LE(static_cast<int>(r.best[i].layout.recompute), static_cast<int>(l.recompute));
    }
  }
  EXPECT_GT(named, 0u);
}

TEST(PlanStep, BubbleAndDataParallelFollowTheFormulas) {
  const Model m = gpt3();
  // 1F1B: bubble = (p - 1) / v micro-batch slots; doubling v halves it.
  const Planner p = a100(m, training(64, 1), 64);
  Layout l;
  l.tp = 8, l.pp = 8, l.dp = 1, l.recompute = Recompute::full;
  const auto e1 = p.estimate(l);
  l.vpp = 2;
  const auto e2 = p.estimate(l);
  const double slot1 = (e1.time.step - e1.time.pp_bubble - e1.time.optimizer).value() / 64;
  EXPECT_NEAR(e1.time.pp_bubble.value(), 7 * slot1, 1e-6 * slot1);
  EXPECT_LT(e2.time.pp_bubble, e1.time.pp_bubble);
  EXPECT_DOUBLE_EQ(e1.time.dp_total.value(), 0);  // dp = 1
}

TEST(PlanStep, TensorParallelTrafficIsTheFabricsFormula) {
  // 2 layers, h 1024, s 512, b 1 on one DGX A100 with tp 8: each layer
  // all-reduces n = s b h 2 B twice forward and twice backward. NCCL offers
  // ring and tree; NVLink gives 300 GB/s x 0.783 one way, 3.4 us per step.
  Model m;
  m.layers = 2, m.hidden = 1024, m.heads = 8, m.vocab = 1024, m.seq = 512;
  const Planner p = a100(m, training(1, 1), 8);
  Layout l;
  l.tp = 8, l.dp = 1;
  const auto e = p.estimate(l);
  const double n = 512 * 1024 * 2, B = 300 * 0.783, alpha = 3400;
  const double ring = 2 * 7 * alpha + 2 * 7.0 / 8 * n / B;
  const double tree = 2 * 3 * alpha + 2 * n / B;
  EXPECT_LT(tree, ring);
  EXPECT_NEAR(e.time.tp_comm.value(), 2 * 2 * 2 * std::min(ring, tree), 1e-6);
  EXPECT_EQ(e.time.tp_algorithm, "tree");
  // Full recompute repeats the forward pair.
  l.recompute = Recompute::full;
  EXPECT_NEAR(p.estimate(l).time.tp_comm.value(), 2 * 3 * 2 * tree, 1e-6);
  // Sequence parallel: two all-gathers and two reduce-scatters per layer and
  // pass (NCCL: ring), (p-1) alpha + (p-1)/p n/B each.
  l.recompute = Recompute::none;
  l.sp = true;
  const double gather = 7 * alpha + 7.0 / 8 * n / B;
  EXPECT_NEAR(p.estimate(l).time.tp_comm.value(), 2 * 2 * 2 * (gather + gather), 1e-6);
}

TEST(PlanStep, PipelineMessagesCrossTheSlowestBoundary) {
  // 16 A100s = 2 nodes; tp 2, pp 8: stages 0-3 on one node, 4-7 on the
  // other. The boundary between them is InfiniBand (25 GB/s per GPU, 9.6
  // us), and it paces the pipeline: one send and one receive of s b h 2 / t
  // bytes per micro-batch.
  Model m;
  m.layers = 8, m.hidden = 1024, m.heads = 8, m.vocab = 1024, m.seq = 512;
  const Planner p = a100(m, training(4, 1), 16);
  Layout l;
  l.tp = 2, l.pp = 8, l.dp = 1;
  const auto e = p.estimate(l);
  const double n = 512 * 1024 * 2 / 2.0;
  EXPECT_NEAR(e.time.pp_p2p.value(), 4 * 2 * (9600 + n / 25), 1e-6);
}

TEST(PlanMemory, OneStageHoldsTheEmbeddingAndTheOutputLayer) {
  const Model m = load_model("llama3-8b");
  Training t;
  t.global_batch = 8;
  const Planner p(arch::load_system("p5"), m, t, 8);
  Layout l;
  l.dp = 8;
  const auto mem = p.estimate(l).memory;
  EXPECT_NEAR(static_cast<double>(mem.weights.value()), 2 * p.params(), 2);
  EXPECT_NEAR(static_cast<double>(mem.optimizer.value()), 12 * p.params(), 12);
}

}  // namespace
}  // namespace tern::plan

namespace tern::plan {
namespace {

// A bandwidth-bound kernel costs the table's fixed latency plus its bytes
// at the achieved bandwidth: kernels x latency + bytes / (HBM x efficiency).
// GPUs model no latency.
TEST(PlanCompute, BandwidthBoundKernelsPayTheirLatency) {
  const ComputeModel trn = ComputeModel::of(arch::load_system("trn3-ultraserver-gen1"));
  const double lat = trn.kernel_latency().value();
  EXPECT_GT(lat, 1000.0);  // two DMAs' fixed cost at least (data/arch/trn3.toml: 1.3 us each)
  EXPECT_DOUBLE_EQ(trn.memory(0, 3).value(), 3 * lat);
  const double bytes = 1 << 20;
  EXPECT_DOUBLE_EQ(trn.memory(bytes, 2).value() - trn.memory(bytes).value(), 2 * lat);
  const ComputeModel gpu = ComputeModel::of(arch::load_system("dgx-a100"));
  EXPECT_DOUBLE_EQ(gpu.kernel_latency().value(), 0.0);
  EXPECT_DOUBLE_EQ(gpu.memory(bytes, 5).value(), gpu.memory(bytes).value());
}

}  // namespace
}  // namespace tern::plan
