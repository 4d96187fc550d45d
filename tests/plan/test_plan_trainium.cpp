// The planner on Trainium: ranks are NeuronCores (trn1) or logical cores
// (LNC on trn2 / trn3), as Neuron's TP / PP / DP degrees count them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "arch/system.h"
#include "plan/estimate.h"
#include "plan/request.h"
#include "util/error.h"

namespace tern::plan {
namespace {

Training batch(std::int64_t global, int micro) {
  Training t;
  t.global_batch = global;
  t.micro_batch = micro;
  return t;
}

TEST(PlanTrainium, RanksCountNeuronCoresAndLogicalCores) {
  const auto trn1 = arch::load_system("trn1-32xl");
  const auto trn2 = arch::load_system("trn2-48xl");
  EXPECT_EQ(trn1.ranks_per_chip(), 2);   // two NeuronCore-v2, no LNC
  EXPECT_EQ(trn2.ranks_per_chip(), 4);   // eight NeuronCore-v3 at the default LNC=2
  EXPECT_EQ(trn2.ranks_per_chip(1), 8);  // LNC=1: every physical core
  EXPECT_EQ(arch::load_system("dgx-a100").ranks_per_chip(), 1);
  EXPECT_THROW(trn1.ranks_per_chip(2), NotSupported);
  EXPECT_THROW(arch::load_system("dgx-a100").ranks_per_chip(2), NotSupported);
  // 512 trn1 chips = 32 trn1.32xlarge = 1024 NeuronCores: --tp 32 --dp 32.
  const Planner p(trn1, load_model("llama3-8b"), batch(1024, 1), 512);
  EXPECT_EQ(p.ranks(), 1024);
  Layout l;
  l.tp = 32, l.dp = 32, l.zero = 1, l.sp = true;
  const Estimate e = p.estimate(l);
  EXPECT_GT(e.time.step.value(), 0);
  EXPECT_TRUE(e.memory.fits);
  l.dp = 16;  // 512 ranks: half the cores
  EXPECT_THROW(p.estimate(l), Error);
}

TEST(PlanTrainium, EachRankGetsItsShareOfTheChip) {
  const auto s = arch::load_system("trn2-48xl");
  const ComputeModel chip = ComputeModel::of(s, 1), core = ComputeModel::of(s, 4);
  EXPECT_DOUBLE_EQ(core.peak("bf16").value() * 4, chip.peak("bf16").value());
  EXPECT_DOUBLE_EQ(core.device().hbm_bandwidth.value() * 4, chip.device().hbm_bandwidth.value());
  EXPECT_EQ(core.device().hbm_capacity.value() * 4, chip.device().hbm_capacity.value());
  // The tables time whole chips splitting M over the cores: one core's
  // [1024, 4096, 4096] GEMM is the chip's [4096, 4096, 4096].
  EXPECT_DOUBLE_EQ(core.gemm_efficiency(1024, 4096, 4096, "bf16"),
                   chip.gemm_efficiency(4096, 4096, 4096, "bf16"));
  EXPECT_DOUBLE_EQ(core.gemm(1024, 4096, 4096, "bf16").value(),
                   chip.gemm(4096, 4096, 4096, "bf16").value());
}

TEST(PlanTrainium, CoresOfAChipShareItsLinksAndTalkThroughHbm) {
  const auto s = arch::load_system("trn1-32xl");
  const fabric::Network chips = fabric::Network::of(s, 512);
  const fabric::Network ranks = rank_network(s, 512, 2);
  ASSERT_EQ(chips.levels().size(), 2u);  // torus of 16, EFA over 32 instances
  ASSERT_EQ(ranks.levels().size(), 3u);
  EXPECT_EQ(ranks.chips(), 1024);
  const fabric::Level& on_chip = ranks.levels()[0];
  EXPECT_EQ(on_chip.size(), 2);
  // 820 GB/s of HBM, every byte read and written once, two cores: 205 GB/s each.
  EXPECT_DOUBLE_EQ(on_chip.bandwidth.value(), s.chip->hbm_bandwidth.value() / 4);
  // One DMA: its fixed cost (1.3 us) and descriptor generation (none on trn1).
  EXPECT_DOUBLE_EQ(on_chip.latency.value(), 1300);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(ranks.levels()[i + 1].size(), chips.levels()[i].size());
    EXPECT_DOUBLE_EQ(ranks.levels()[i + 1].bandwidth.value(),
                     chips.levels()[i].bandwidth.value() / 2);
    EXPECT_DOUBLE_EQ(ranks.levels()[i + 1].latency.value(), chips.levels()[i].latency.value());
  }
  // A GPU system is unchanged.
  EXPECT_EQ(rank_network(arch::load_system("dgx-a100"), 8, 1).levels().size(), 1u);
}

TEST(PlanTrainium, LncOfARequestIsReadAndChecked) {
  Request r;
  apply(nlohmann::json::parse(R"({"system": {"name": "trn2-48xl", "chips": 16, "lnc": 1}})"),
        "test", r);
  EXPECT_EQ(r.lnc, 1);
  const Planner p(arch::load_system(r.system), load_model("llama3-8b"), batch(128, 1), r.chips,
                  r.lnc);
  EXPECT_EQ(p.ranks(), 128);
  EXPECT_EQ(p.lnc(), 1);
}

}  // namespace
}  // namespace tern::plan
