#include <gtest/gtest.h>

#include <cmath>

#include "arch/system.h"
#include "util/error.h"

namespace tern::arch {
namespace {

TEST(System, EveryDescriptionLoadsAndAddsUp) {
  const auto names = list_systems();
  EXPECT_EQ(names.size(), 9u);
  for (const auto& n : names) {
    const SystemSpec s = load_system(n);
    int product = 1;
    for (const auto& l : s.fabric) product *= l.size();
    EXPECT_EQ(product, s.chips) << n;
  }
}

TEST(System, Trn3UltraServerGen2Totals) {
  const SystemSpec s = load_system("trn3-ultraserver-gen2");
  EXPECT_EQ(s.chips, 144);
  ASSERT_TRUE(s.chip.has_value());
  EXPECT_EQ(s.chip->name, "trn3");
  EXPECT_TRUE(s.device.trainium);
  ASSERT_EQ(s.fabric.size(), 2u);
  EXPECT_EQ(s.fabric[0].size(), 4);
  EXPECT_EQ(s.fabric[1].size(), 36);
  EXPECT_EQ(s.fabric[1].topology, Topology::switched);
  // Published: 362 MXFP8 PFLOPS, ~20.7 TB HBM, 705.6 TB/s.
  EXPECT_LT(std::fabs(s.tensor_peak("mxfp8").value() / 362e15 - 1), 0.01);
  // 144 chips x 144 GiB. The published "~20.7 TB" is 144 x 144 GB (decimal):
  // the same count with GB for GiB (docs/arch.md notes the discrepancy).
  EXPECT_EQ(s.hbm_capacity().value(), 144 * 144 * kGiB);
  EXPECT_LT(std::fabs(144.0 * 144e9 / 20.7e12 - 1), 0.01);
  EXPECT_DOUBLE_EQ(s.hbm_bandwidth().value(), 144 * 4900.0);
  EXPECT_DOUBLE_EQ(s.hbm_bandwidth().value() / 1000, 705.6);
}

TEST(System, Trn2UltraServerIsTorusTimesRing) {
  const SystemSpec s = load_system("trn2-ultraserver");
  ASSERT_EQ(s.fabric.size(), 2u);
  EXPECT_EQ(s.fabric[0].topology, Topology::torus2d);
  EXPECT_EQ(s.fabric[0].dims, (std::vector<int>{4, 4}));
  EXPECT_EQ(s.fabric[1].topology, Topology::ring);
  // 256 GB/s per chip, counted both ways: 128 each way.
  EXPECT_DOUBLE_EQ(s.fabric[1].bandwidth_per_chip.value(), 128);
  EXPECT_DOUBLE_EQ(s.fabric[1].latency.value(), 1900);
  ASSERT_TRUE(s.scale_out.has_value());
  EXPECT_DOUBLE_EQ(s.scale_out->bandwidth_per_instance.value(), 400);
  EXPECT_EQ(s.scale_out->instance_chips, 16);
  EXPECT_DOUBLE_EQ(s.scale_out->bandwidth_per_chip().value(), 25);
}

TEST(System, GpuSystemsDescribeTheirDevice) {
  const SystemSpec s = load_system("dgx-a100");
  EXPECT_FALSE(s.chip.has_value());
  EXPECT_FALSE(s.device.trainium);
  EXPECT_EQ(s.chips, 8);
  EXPECT_DOUBLE_EQ(s.device.peak_for("bf16").value(), 312e12);
  EXPECT_THROW(s.device.peak_for("fp8"), NotSupported);
  EXPECT_EQ(s.device.hbm_capacity, gibibytes(80));
  EXPECT_DOUBLE_EQ(s.device.gemm_efficiency, 0.859);
  EXPECT_DOUBLE_EQ(s.fabric[0].bandwidth_per_chip.value(), 300);    // 600 both ways
  EXPECT_DOUBLE_EQ(s.scale_out->bandwidth_per_chip().value(), 25);  // 8 x 200 Gb/s per 8 GPUs
  const SystemSpec g = load_system("gb300-nvl72");
  EXPECT_DOUBLE_EQ(g.tensor_peak("bf16").value(), 180e15);  // the rack's dense BF16
}

}  // namespace
}  // namespace tern::arch
