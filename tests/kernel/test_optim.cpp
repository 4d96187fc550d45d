// The fused AdamW step: bit for bit against the host reference (fp32 and
// bf16 gradients, odd shapes, several cores and steps), close to an FP64
// evaluation of PyTorch's formula, and bad hyperparameters refused.
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

using testing_helpers::mismatches;

struct Case {
  std::int64_t rows, cols;
  DType grad;
  std::int64_t step;
  int cores;
};

class AdamW : public ::testing::TestWithParam<Case> {};

TEST_P(AdamW, BitExactAgainstHostReferenceAndCloseToFp64) {
  const Case c = GetParam();
  const auto chip = arch::load_chip("trn3");
  kernel::AdamWSpec spec;
  spec.rows = c.rows, spec.cols = c.cols, spec.grad = c.grad, spec.step = c.step,
  spec.cores = c.cores, spec.lr = 3e-4f, spec.weight_decay = 0.1f;
  const auto n = static_cast<std::size_t>(c.rows * c.cols);
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> p(n), g(n), m(n), v(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = d(rng);
    g[i] = 0.01f * d(rng);
    m[i] = 0.001f * d(rng);
    v[i] = 1e-5f * std::fabs(d(rng));
  }
  if (c.grad == DType::bf16) num::round_array(*isa::format_of(DType::bf16), g);
  const auto sp = testing_helpers::run_kernel(chip, kernel::adamw_kernel(chip, spec),
                                              {{"param", &p}, {"grad", &g}, {"m", &m}, {"v", &v}});
  const sim::Simulator& s = *sp;
  std::vector<float> rp = p, rm = m, rv = v;
  const auto pb = kernel::adamw_reference(rp, g, rm, rv, spec);
  EXPECT_EQ(mismatches(s.read("param_out"), rp, "param"), 0u);
  EXPECT_EQ(mismatches(s.read("m_out"), rm, "m"), 0u);
  EXPECT_EQ(mismatches(s.read("v_out"), rv, "v"), 0u);
  EXPECT_EQ(mismatches(s.read("param_bf16"), pb, "param_bf16"), 0u);
  // PyTorch's AdamW in FP64.
  const double b1 = spec.beta1, b2 = spec.beta2, lr = spec.lr, t = static_cast<double>(c.step);
  for (std::size_t i = 0; i < n; i += 97) {
    const double mm = b1 * m[i] + (1 - b1) * g[i];
    const double vv = b2 * v[i] + (1 - b2) * static_cast<double>(g[i]) * g[i];
    const double denom = std::sqrt(vv) / std::sqrt(1 - std::pow(b2, t)) + spec.eps;
    const double want =
        p[i] * (1 - lr * spec.weight_decay) - lr / (1 - std::pow(b1, t)) * mm / denom;
    ASSERT_NEAR(rp[i], want, 1e-6 * (1 + std::fabs(want))) << i;
    // FP32 rounding of the two terms (they may cancel).
    ASSERT_NEAR(rm[i], mm, 1e-6 * (b1 * std::fabs(m[i]) + (1 - b1) * std::fabs(g[i]))) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AdamW,
                         ::testing::Values(Case{128, 2048, DType::fp32, 1, 1},
                                           Case{300, 2500, DType::bf16, 10, 2},
                                           Case{1, 1, DType::fp32, 1000, 1},
                                           Case{129, 77, DType::bf16, 3, 3}));

// The multi-tensor form with the step's scalars from HBM: one launch
// updates tensors of several shapes, each bit for bit as its own
// single-tensor step with lr and step built in.
TEST(AdamW, MultiTensorWithRuntimeScalars) {
  const auto chip = arch::load_chip("trn3");
  kernel::AdamWSpec spec;
  spec.grad = DType::bf16, spec.step = 7, spec.lr = 2e-3f, spec.weight_decay = 0.1f;
  spec.cores = 3, spec.runtime_scalars = true;
  spec.tensors = {{130, 700}, {1, 768}, {128, 1030}};
  sim::Simulator sim(chip);
  sim.load(kernel::adamw_kernel(chip, spec));
  const kernel::AdamWScalars k = kernel::adamw_scalars(spec);
  sim.write("scalars",
            std::vector<float>{k.decay, k.one_m_b1, k.one_m_b2, k.bc2_sqrt, k.neg_step_size});
  std::mt19937 rng(9);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<std::vector<float>> p, g, m, v;
  for (std::size_t i = 0; i < spec.tensors.size(); ++i) {
    const auto n = static_cast<std::size_t>(spec.tensors[i].first * spec.tensors[i].second);
    p.emplace_back(n), g.emplace_back(n), m.emplace_back(n), v.emplace_back(n);
    for (std::size_t j = 0; j < n; ++j)
      p[i][j] = d(rng), g[i][j] = 0.01f * d(rng), m[i][j] = 0.001f * d(rng),
      v[i][j] = 1e-5f * std::fabs(d(rng));
    num::round_array(*isa::format_of(DType::bf16), g[i]);
    const std::string x = "." + std::to_string(i);
    sim.write("param" + x, p[i]), sim.write("grad" + x, g[i]), sim.write("m" + x, m[i]);
    sim.write("v" + x, v[i]);
  }
  sim.run();
  for (std::size_t i = 0; i < spec.tensors.size(); ++i) {
    kernel::AdamWSpec one = spec;
    one.tensors.clear(), one.runtime_scalars = false;
    one.rows = spec.tensors[i].first, one.cols = spec.tensors[i].second;
    std::vector<float> rp = p[i], rm = m[i], rv = v[i];
    const auto pb = kernel::adamw_reference(rp, g[i], rm, rv, one);
    const std::string x = "." + std::to_string(i);
    EXPECT_EQ(mismatches(sim.read("param_out" + x), rp, "param"), 0u) << i;
    EXPECT_EQ(mismatches(sim.read("m_out" + x), rm, "m"), 0u) << i;
    EXPECT_EQ(mismatches(sim.read("v_out" + x), rv, "v"), 0u) << i;
    EXPECT_EQ(mismatches(sim.read("param_bf16" + x), pb, "param_bf16"), 0u) << i;
  }
}

TEST(AdamW, RejectsBadHyperparameters) {
  const auto chip = arch::load_chip("trn3");
  kernel::AdamWSpec s;
  s.step = 0;
  EXPECT_THROW(kernel::adamw_kernel(chip, s), Error);
  s.step = 1;
  s.beta2 = 1.0f;
  EXPECT_THROW(kernel::adamw_kernel(chip, s), Error);
  s.beta2 = 0.999f;
  s.eps = 0.0f;
  EXPECT_THROW(kernel::adamw_kernel(chip, s), Error);
  s.eps = 1e-8f;
  s.grad = DType::fp8_e4m3;
  EXPECT_THROW(kernel::adamw_kernel(chip, s), NotSupported);
}

}  // namespace
}  // namespace tern
