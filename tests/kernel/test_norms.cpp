// RMSNorm forward (with and without the fused residual add): bit for bit
// against the host reference, odd shapes, several cores; bad input.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "arch/chip.h"
#include "common/run_kernel.h"
#include "kernel/kernels.h"
#include "kernel/reference.h"
#include "num/convert.h"
#include "sim/simulator.h"
#include "util/error.h"

namespace tern {
namespace {

using isa::DType;

std::vector<float> normal(std::size_t n, std::uint32_t seed, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

float to_bf16(float x) {
  return num::round_to(*isa::format_of(DType::bf16), x);
}
float to_fp16(float x) {
  return num::round_to(*isa::format_of(DType::fp16), x);
}
float to_fp32(float x) {
  return x;
}

using testing_helpers::mismatches;

struct Case {
  std::int64_t rows, dim;
  DType dt;
  bool residual;
  int cores;
  const char* chip;
};

kernel::RmsNormSpec spec_of(const Case& c, float eps = 1e-6f) {
  kernel::RmsNormSpec s;
  s.rows = c.rows, s.dim = c.dim, s.dtype = c.dt, s.residual = c.residual, s.cores = c.cores,
  s.eps = eps;
  return s;
}

// Rounds to the case's dtype.
using Round = float (*)(float);
Round rounder(DType dt) {
  return dt == DType::bf16 ? to_bf16 : dt == DType::fp16 ? to_fp16 : to_fp32;
}

class RmsNorm : public ::testing::TestWithParam<Case> {};

TEST_P(RmsNorm, BitExactAgainstHostReference) {
  const Case c = GetParam();
  const auto chip = arch::load_chip(c.chip);
  const kernel::RmsNormSpec spec = spec_of(c);
  const Round round = rounder(c.dt);
  auto x = normal(static_cast<std::size_t>(c.rows * c.dim), 1, 0.5f);
  auto res = normal(static_cast<std::size_t>(c.rows * c.dim), 2);
  for (float& v : x) v = round(v);
  for (float& v : res) v = round(v);
  auto gamma = normal(static_cast<std::size_t>(c.dim), 3, 1.0f);
  for (float& v : gamma) v = round(v);
  sim::Simulator s(chip);
  s.load(kernel::rmsnorm_kernel(chip, spec));
  s.write("x", x);
  s.write("gamma", gamma);
  if (c.residual) s.write("residual", res);
  s.run();
  const auto want = kernel::rmsnorm_reference(x, gamma, c.residual ? &res : nullptr, c.rows, c.dim,
                                              spec.eps, round);
  EXPECT_EQ(mismatches(s.read("y"), want.y, "y"), 0u);
  EXPECT_EQ(mismatches(s.read("rstd"), want.rstd, "rstd"), 0u);
  if (c.residual) {
    EXPECT_EQ(mismatches(s.read("h"), want.h, "h"), 0u);
  }
  // And close to the FP64 definition.
  for (std::int64_t i = 0; i < c.rows; i += 37) {
    double ss = 0;
    for (std::int64_t j = 0; j < c.dim; ++j) {
      const double h = want.h.empty() ? x[i * c.dim + j] : want.h[i * c.dim + j];
      ss += h * h;
    }
    EXPECT_NEAR(want.rstd[i], 1.0 / std::sqrt(ss / c.dim + spec.eps), 1e-5 * want.rstd[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNorm,
                         ::testing::Values(Case{256, 512, DType::bf16, false, 1, "trn3"},
                                           Case{300, 1000, DType::bf16, true, 2, "trn3"},
                                           Case{1, 1, DType::fp32, false, 1, "trn3"},
                                           Case{129, 77, DType::fp16, true, 1, "trn2"},
                                           Case{200, 384, DType::fp32, false, 2, "trn1"},
                                           Case{700, 256, DType::bf16, true, 3, "trn2"}));

class LayerNorm : public ::testing::TestWithParam<Case> {};

TEST_P(LayerNorm, BitExactAgainstHostReferenceAndCloseToFp64) {
  const Case c = GetParam();
  const auto chip = arch::load_chip(c.chip);
  const kernel::RmsNormSpec spec = spec_of(c, 1e-5f);
  const Round round = rounder(c.dt);
  auto x = normal(static_cast<std::size_t>(c.rows * c.dim), 21, 0.7f);
  auto res = normal(static_cast<std::size_t>(c.rows * c.dim), 22);
  auto gamma = normal(static_cast<std::size_t>(c.dim), 23, 1.0f);
  auto beta = normal(static_cast<std::size_t>(c.dim), 24);
  for (auto* v : {&x, &res, &gamma, &beta})
    for (float& e : *v) e = round(e);
  std::vector<std::pair<std::string, const std::vector<float>*>> in = {
      {"x", &x}, {"gamma", &gamma}, {"beta", &beta}};
  if (c.residual) in.emplace_back("residual", &res);
  const auto sp = testing_helpers::run_kernel(chip, kernel::layernorm_kernel(chip, spec), in);
  const auto want = kernel::layernorm_reference(x, gamma, beta, c.residual ? &res : nullptr, c.rows,
                                                c.dim, spec.eps, chip.bn_stats_fmax, round);
  const auto y = sp->read("y");
  EXPECT_EQ(mismatches(y, want.y, "y"), 0u);
  EXPECT_EQ(mismatches(sp->read("mean"), want.mean, "mean"), 0u);
  EXPECT_EQ(mismatches(sp->read("rstd"), want.rstd, "rstd"), 0u);
  if (c.residual) {
    EXPECT_EQ(mismatches(sp->read("h"), want.h, "h"), 0u);
  }
  // Against the FP64 definition (torch.nn.functional.layer_norm).
  const auto D = static_cast<std::size_t>(c.dim);
  const double tol = c.dt == DType::fp32 ? 1e-4 : 1e-2;
  for (std::size_t r = 0; r < static_cast<std::size_t>(c.rows); r += 31) {
    const float* hr = (c.residual ? want.h.data() : x.data()) + r * D;
    double mean = 0, var = 0;
    for (std::size_t j = 0; j < D; ++j) mean += hr[j];
    mean /= static_cast<double>(D);
    for (std::size_t j = 0; j < D; ++j) var += (hr[j] - mean) * (hr[j] - mean);
    var /= static_cast<double>(D);
    for (std::size_t j = 0; j < D; ++j) {
      const double w = (hr[j] - mean) / std::sqrt(var + 1e-5) * gamma[j] + beta[j];
      ASSERT_NEAR(y[r * D + j], w, tol * (1 + std::fabs(w))) << r << "," << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LayerNorm,
                         ::testing::Values(Case{256, 512, DType::bf16, false, 1, "trn3"},
                                           Case{300, 1000, DType::bf16, true, 2, "trn3"},
                                           Case{1, 1, DType::fp32, false, 1, "trn3"},
                                           Case{129, 77, DType::fp16, true, 1, "trn2"},
                                           Case{200, 1300, DType::fp32, false, 2, "trn1"}));

class RmsNormBackward : public ::testing::TestWithParam<Case> {};

TEST_P(RmsNormBackward, BitExactAgainstHostReferenceAndCloseToFp64) {
  const Case c = GetParam();
  const auto chip = arch::load_chip(c.chip);
  const kernel::RmsNormSpec spec = spec_of(c);
  const Round round = rounder(c.dt);
  auto dy = normal(static_cast<std::size_t>(c.rows * c.dim), 11);
  auto h = normal(static_cast<std::size_t>(c.rows * c.dim), 12, 0.3f);
  auto gamma = normal(static_cast<std::size_t>(c.dim), 13, 1.0f);
  for (auto* v : {&dy, &h, &gamma})
    for (float& x : *v) x = round(x);
  std::vector<float> rstd(static_cast<std::size_t>(c.rows));
  for (std::int64_t r = 0; r < c.rows; ++r) {
    double ss = 0;
    for (std::int64_t j = 0; j < c.dim; ++j) ss += double(h[r * c.dim + j]) * h[r * c.dim + j];
    rstd[r] = static_cast<float>(1.0 / std::sqrt(ss / c.dim + 1e-6));
  }
  const auto sp =
      testing_helpers::run_kernel(chip, kernel::rmsnorm_backward_kernel(chip, spec),
                                  {{"dy", &dy}, {"h", &h}, {"gamma", &gamma}, {"rstd", &rstd}});
  const sim::Simulator& s = *sp;
  const auto want = kernel::rmsnorm_backward_reference(dy, h, gamma, rstd, c.rows, c.dim, c.cores,
                                                       chip.sbuf_partitions, round);
  const auto dh = s.read("dh"), parts = s.read("dgamma_parts");
  EXPECT_EQ(mismatches(dh, want.dh, "dh"), 0u);
  EXPECT_EQ(mismatches(parts, want.dgamma_parts, "dgamma_parts"), 0u);
  // The analytic gradient in FP64 (what autograd computes).
  const auto D = static_cast<std::size_t>(c.dim);
  const double tol = c.dt == DType::fp32 ? 1e-4 : 1e-2;
  for (std::size_t r = 0; r < static_cast<std::size_t>(c.rows); r += 29) {
    double dot = 0;
    for (std::size_t j = 0; j < D; ++j) dot += double(dy[r * D + j]) * gamma[j] * h[r * D + j];
    const double t = rstd[r];
    for (std::size_t j = 0; j < D; j += 7) {
      const double w = t * dy[r * D + j] * gamma[j] - h[r * D + j] * dot * t * t * t / c.dim;
      ASSERT_NEAR(dh[r * D + j], w, tol * (1 + std::fabs(w))) << r << "," << j;
    }
  }
  for (std::size_t j = 0; j < D; j += 5) {
    double w = 0, got = 0;
    for (std::size_t r = 0; r < static_cast<std::size_t>(c.rows); ++r)
      w += double(dy[r * D + j]) * h[r * D + j] * rstd[r];
    for (int k = 0; k < c.cores; ++k) got += parts[k * D + j];
    ASSERT_NEAR(got, w, 1e-4 * (1 + std::fabs(w))) << j;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormBackward,
                         ::testing::Values(Case{256, 512, DType::bf16, false, 1, "trn3"},
                                           Case{300, 1000, DType::bf16, false, 2, "trn3"},
                                           Case{1, 1, DType::fp32, false, 1, "trn3"},
                                           Case{129, 77, DType::fp16, false, 1, "trn2"},
                                           Case{700, 256, DType::fp32, false, 3, "trn2"},
                                           Case{100, 64, DType::bf16, false, 2, "trn3"}));

TEST(RmsNorm, RejectsBadInput) {
  const auto chip = arch::load_chip("trn3");
  kernel::RmsNormSpec s;
  s.rows = 0;
  EXPECT_THROW(kernel::rmsnorm_kernel(chip, s), Error);
  s.rows = 128;
  s.dtype = DType::fp8_e4m3;
  EXPECT_THROW(kernel::rmsnorm_kernel(chip, s), NotSupported);
  s.dtype = DType::bf16;
  s.dim = 1 << 20;
  try {
    kernel::rmsnorm_kernel(chip, s);
    ADD_FAILURE() << "no error";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("a row does not fit SBUF"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tern
