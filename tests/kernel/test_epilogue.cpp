// Fused matmul epilogues (scale, bias, activation, residual in the PSUM
// evacuation): bit for bit against the host reference and against the
// unfused chain of separate kernels, an independent FP64 check, and the
// time saved by fusing.
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

std::vector<float> normal(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> rounded(std::vector<float> v, DType dt) {
  if (dt != DType::fp32) num::round_array(*isa::format_of(dt), v);
  return v;
}

using testing_helpers::mismatches;

struct Case {
  const char* epilogue;
  std::int64_t m, n, k;
  DType in, out;
  const char* chip;
};

struct Inputs {
  std::vector<float> at, b, bias, residual;
};

Inputs make_inputs(const Case& c, const kernel::Epilogue& e) {
  Inputs x;
  x.at = rounded(normal(static_cast<std::size_t>(c.k * c.m), 1),
                 isa::is_x4(c.in) ? DType::bf16 : c.in);
  x.b = rounded(normal(static_cast<std::size_t>(c.k * c.n), 2),
                isa::is_x4(c.in) ? DType::bf16 : c.in);
  if (e.bias) x.bias = normal(static_cast<std::size_t>(c.n), 3);
  if (e.residual) x.residual = normal(static_cast<std::size_t>(c.m * c.n), 4);
  return x;
}

std::vector<float> run_fused(const arch::ChipSpec& chip, const Case& c, const kernel::Epilogue& e,
                             const Inputs& x, double* latency_ns = nullptr) {
  kernel::MatmulSpec spec;
  spec.m = c.m, spec.n = c.n, spec.k = c.k, spec.in = c.in, spec.out = c.out, spec.epilogue = e;
  sim::Simulator s(chip);
  s.load(kernel::matmul_kernel(chip, spec));
  s.write("at", x.at);
  s.write("b", x.b);
  if (e.bias) s.write("bias", x.bias);
  if (e.residual) s.write("residual", x.residual);
  const sim::RunStats st = s.run();
  if (latency_ns) *latency_ns = st.latency_ns;
  return s.read("c");
}

class FusedEpilogue : public ::testing::TestWithParam<Case> {};

TEST_P(FusedEpilogue, BitExactAgainstHostReference) {
  const Case c = GetParam();
  const auto chip = arch::load_chip(c.chip);
  const kernel::Epilogue e = kernel::parse_epilogue(c.epilogue);
  const Inputs x = make_inputs(c, e);
  const auto got = run_fused(chip, c, e, x);
  const bool mx = isa::is_x4(c.in);
  auto want = mx ? kernel::matmul_reference(
                       kernel::mx_roundtrip_columns(x.at, c.k, c.m, c.in == DType::fp8_e5m2_x4),
                       kernel::mx_roundtrip_columns(x.b, c.k, c.n, c.in == DType::fp8_e5m2_x4), c.m,
                       c.n, c.k, false)
                 : kernel::matmul_reference(x.at, x.b, c.m, c.n, c.k, c.in == DType::fp32);
  kernel::epilogue_reference(want, x.bias, x.residual, e, c.m, c.n);
  EXPECT_EQ(mismatches(got, rounded(want, c.out)), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Chains, FusedEpilogue,
    ::testing::Values(Case{"bias,gelu", 200, 600, 300, DType::bf16, DType::fp32, "trn3"},
                      Case{"scale=0.125,bias,gelu_tanh,residual", 130, 520, 256, DType::bf16,
                           DType::bf16, "trn3"},
                      Case{"silu", 128, 512, 128, DType::fp16, DType::fp32, "trn2"},
                      Case{"scale=2,relu", 77, 45, 130, DType::fp32, DType::bf16, "trn1"},
                      Case{"residual", 64, 100, 200, DType::fp8_e4m3, DType::fp32, "trn3"},
                      Case{"bias,relu", 1, 1, 1, DType::bf16, DType::fp32, "trn3"},
                      Case{"bias,gelu", 256, 300, 256, DType::fp8_e4m3_x4, DType::bf16, "trn3"}));

// The fused kernel computes what the chain of separate kernels computes:
// matmul to FP32 in HBM, then one memory-bound kernel per epilogue step.
TEST(FusedEpilogue, SameBitsAsTheUnfusedChainAndFaster) {
  const auto chip = arch::load_chip("trn3");
  const Case c{"bias,gelu", 512, 512, 512, DType::bf16, DType::bf16, "trn3"};
  const kernel::Epilogue e = kernel::parse_epilogue(c.epilogue);
  const Inputs x = make_inputs(c, e);
  double fused_ns = 0;
  const auto fused = run_fused(chip, c, e, x, &fused_ns);

  Case plain = c;
  plain.out = DType::fp32;
  double chain_ns = 0;
  auto y = run_fused(chip, plain, {}, x, &chain_ns);
  const auto steps = kernel::unfused_steps(e);
  ASSERT_EQ(steps.size(), 2u);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const kernel::Epilogue& step = steps[i];
    const DType out = i + 1 == steps.size() ? c.out : DType::fp32;
    sim::Simulator s(chip);
    s.load(kernel::epilogue_kernel(chip, c.m, c.n, step, out));
    s.write("x", y);
    if (step.bias) s.write("bias", x.bias);
    chain_ns += s.run().latency_ns;
    y = s.read("y");
  }
  EXPECT_EQ(mismatches(fused, y), 0u);
  // Fusing saves the FP32 round trips through HBM and the extra launches.
  EXPECT_LT(fused_ns, chain_ns);
}

// An independent check in FP64 (erf GELU): the fused result is within the
// FP32 evaluation error of the exact chain.
TEST(FusedEpilogue, CloseToFp64Chain) {
  const auto chip = arch::load_chip("trn3");
  const Case c{"scale=0.5,bias,gelu,residual", 64, 96, 128, DType::bf16, DType::fp32, "trn3"};
  const kernel::Epilogue e = kernel::parse_epilogue(c.epilogue);
  const Inputs x = make_inputs(c, e);
  const auto got = run_fused(chip, c, e, x);
  for (std::int64_t i = 0; i < c.m; ++i)
    for (std::int64_t j = 0; j < c.n; ++j) {
      double acc = 0;
      for (std::int64_t k = 0; k < c.k; ++k)
        acc += static_cast<double>(x.at[k * c.m + i]) * static_cast<double>(x.b[k * c.n + j]);
      const double t = 0.5 * acc + x.bias[j];
      const double want = 0.5 * t * (1.0 + std::erf(t / std::sqrt(2.0))) + x.residual[i * c.n + j];
      ASSERT_NEAR(got[i * c.n + j], want, 1e-4 * (1.0 + std::fabs(want))) << i << "," << j;
    }
}

TEST(FusedEpilogue, ParsesAndNamesChains) {
  const kernel::Epilogue e = kernel::parse_epilogue("scale=0.5,bias,gelu_tanh,residual");
  EXPECT_EQ(e.scale, 0.5f);
  EXPECT_TRUE(e.bias);
  EXPECT_TRUE(e.residual);
  EXPECT_EQ(e.act, isa::ActFunc::gelu_tanh);
  EXPECT_EQ(kernel::to_string(e), "scale=0.5,bias,gelu_tanh,residual");
  EXPECT_EQ(kernel::to_string(kernel::parse_epilogue("")), "none");
  const auto steps = kernel::unfused_steps(e);
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(kernel::to_string(steps[0]), "scale=0.5,bias");
  EXPECT_EQ(kernel::to_string(steps[1]), "gelu_tanh");
  EXPECT_EQ(kernel::to_string(steps[2]), "residual");
  EXPECT_EQ(kernel::to_string(kernel::unfused_steps(kernel::parse_epilogue("scale=2,silu"))[0]),
            "scale=2,silu");
  EXPECT_THROW(kernel::parse_epilogue("bias,frobnicate"), Error);
  EXPECT_THROW(kernel::parse_epilogue("scale=abc"), Error);
}

}  // namespace
}  // namespace tern
