// Chip descriptions load and the derived figures follow from them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "arch/chip.h"
#include "util/error.h"

namespace tern::arch {
namespace {

TEST(Chip, Trn3Acceptance) {
  const ChipSpec c = load_chip("trn3");
  EXPECT_EQ(c.cores, 8);
  EXPECT_EQ(c.sbuf_bytes().value(), 32 * kMiB);
  EXPECT_EQ(c.psum_bytes().value(), 2 * kMiB);
  EXPECT_EQ(c.psum_bank_bytes().value(), 2 * kKiB);
  EXPECT_EQ(c.hbm_capacity.value(), 144 * kGiB);
  EXPECT_EQ(c.hbm_per_core().value(), 18 * kGiB);
  // 8 cores x 128 x 128 PEs x 2 FLOP x 2.4 GHz x 4 = 2516.58 TFLOPS, within 1 % of 2517.
  const double mxfp8 = c.tensor_peak_per_chip("mxfp8").value();
  EXPECT_DOUBLE_EQ(mxfp8, 8.0 * 128 * 128 * 2 * 2.4e9 * 4);
  EXPECT_LT(std::fabs(mxfp8 / 2517e12 - 1.0), 0.01);
  EXPECT_DOUBLE_EQ(c.tensor_peak_per_core("fp32").value(), 128.0 * 128 * 2 * 2.4e9 / 4);
  // 16 engines at the sustained 33 B/ns of the DMA bandwidth guide (the
  // 38.4 GB/s per engine of the DMA overview is the theoretical rate).
  EXPECT_DOUBLE_EQ(c.dma_bandwidth_per_core().value(), 16 * 33.0);
  EXPECT_DOUBLE_EQ(c.vector.fp32_peak().value(), 128 * 8 * 1.2e9);
}

TEST(Chip, PerCorePeaksMatchPublishedPerCoreFigures) {
  // Neuron docs per-core figures (hardware.md section 2), within 1 % (their rounding).
  struct Row {
    const char* chip;
    const char* dtype;
    double tflops;
  };
  const Row rows[] = {{"trn1", "bf16", 92},   {"trn1", "fp32", 23},   {"trn2", "bf16", 79},
                      {"trn2", "fp8", 158},   {"trn2", "fp32", 20},   {"trn3", "bf16", 79},
                      {"trn3", "mxfp8", 315}, {"trn3", "mxfp4", 315}, {"trn3", "fp32", 20}};
  for (const Row& r : rows) {
    const double got = load_chip(r.chip).tensor_peak_per_core(r.dtype).value() / 1e12;
    // Published per-core figures are whole TFLOPS: allow their rounding or 1 %.
    EXPECT_NEAR(got, r.tflops, std::max(0.5, 0.01 * r.tflops)) << r.chip << " " << r.dtype;
  }
}

TEST(Chip, MissingTensorTypeIsNotSupported) {
  EXPECT_THROW(load_chip("trn2").tensor_peak_per_core("mxfp8"), NotSupported);
  EXPECT_FALSE(load_chip("trn1").supports("mxfp4"));
}

TEST(Chip, EveryDescriptionLoads) {
  const auto names = list_chips();
  EXPECT_EQ(names, (std::vector<std::string>{"trn1", "trn2", "trn3"}));
  for (const auto& n : names) {
    const ChipSpec c = load_chip(n);
    EXPECT_EQ(c.name, n);
    EXPECT_GT(c.sbuf_bytes().value(), 0);
  }
}

TEST(Chip, UnknownNameListsTheKnownOnes) {
  try {
    load_chip("trn9");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown chip 'trn9'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("trn3"), std::string::npos);
  }
}

}  // namespace
}  // namespace tern::arch
