// Softmax and the fused cross-entropy: values against FP64 (the bit-exact
// checks are in test_registry.cpp), PyTorch's ignore_index convention.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "arch/chip.h"
#include "common/run_kernel.h"
#include "kernel/kernels.h"

namespace tern {
namespace {

using isa::DType;
using testing_helpers::run_kernel;

TEST(CrossEntropy, MatchesFp64AndIgnoresNegativeTargets) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  kernel::CrossEntropySpec s;
  s.rows = 150, s.vocab = 300, s.dtype = DType::fp32, s.chunk = 128, s.cores = 2;
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> x(static_cast<std::size_t>(s.rows * s.vocab)), tg(150);
  for (float& v : x) v = d(rng);
  for (std::size_t i = 0; i < tg.size(); ++i)
    tg[i] = i % 7 == 3 ? -100.0f : static_cast<float>((i * 37) % 300);
  auto sim =
      run_kernel(chip, kernel::cross_entropy_kernel(chip, s), {{"logits", &x}, {"targets", &tg}});
  const auto loss = sim->read("loss"), g = sim->read("dlogits");
  const double gs = 1.0 / 150.0;
  for (std::int64_t i = 0; i < s.rows; ++i) {
    const float* row = x.data() + i * s.vocab;
    double m = row[0], sum = 0;
    for (std::int64_t j = 0; j < s.vocab; ++j) m = std::max(m, double(row[j]));
    for (std::int64_t j = 0; j < s.vocab; ++j) sum += std::exp(row[j] - m);
    const double lse = m + std::log(sum);
    const float t = tg[static_cast<std::size_t>(i)];
    if (t < 0) {
      EXPECT_EQ(loss[static_cast<std::size_t>(i)], 0.0f) << i;
      for (std::int64_t j = 0; j < s.vocab; ++j)
        ASSERT_EQ(g[static_cast<std::size_t>(i * s.vocab + j)], 0.0f) << i << "," << j;
      continue;
    }
    const double want = lse - row[static_cast<std::int64_t>(t)];
    EXPECT_NEAR(loss[static_cast<std::size_t>(i)], want, 1e-5 * (1 + want)) << i;
    for (std::int64_t j = 0; j < s.vocab; ++j) {
      const double p = std::exp(row[j] - lse) - (j == static_cast<std::int64_t>(t) ? 1.0 : 0.0);
      ASSERT_NEAR(g[static_cast<std::size_t>(i * s.vocab + j)], gs * p, 1e-6 * gs) << i << "," << j;
    }
  }
}

TEST(Softmax, ForwardRowsSumToOneAndBackwardMatchesFp64) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  kernel::SoftmaxSpec s;
  s.rows = 131, s.dim = 517, s.dtype = DType::fp32, s.cores = 2;
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 4.0f);
  std::vector<float> x(static_cast<std::size_t>(s.rows * s.dim)), dy(x.size());
  for (float& v : x) v = d(rng);
  for (float& v : dy) v = d(rng);
  const auto y = run_kernel(chip, kernel::softmax_kernel(chip, s), {{"x", &x}})->read("y");
  const auto dx =
      run_kernel(chip, kernel::softmax_backward_kernel(chip, s), {{"dy", &dy}, {"y", &y}})
          ->read("dx");
  for (std::int64_t i = 0; i < s.rows; ++i) {
    double m = -INFINITY, sum = 0, dot = 0;
    for (std::int64_t j = 0; j < s.dim; ++j) m = std::max(m, double(x[std::size_t(i * s.dim + j)]));
    for (std::int64_t j = 0; j < s.dim; ++j) sum += std::exp(x[std::size_t(i * s.dim + j)] - m);
    for (std::int64_t j = 0; j < s.dim; ++j) {
      const std::size_t k = std::size_t(i * s.dim + j);
      const double p = std::exp(x[k] - m) / sum;
      // FP32: exp of an argument of magnitude up to ~30 carries ~30 x 2^-24.
      ASSERT_NEAR(y[k], p, 1e-5 * p + 1e-12) << i << "," << j;
      dot += double(dy[k]) * p;
    }
    for (std::int64_t j = 0; j < s.dim; ++j) {
      const std::size_t k = std::size_t(i * s.dim + j);
      const double p = std::exp(x[k] - m) / sum, want = p * (dy[k] - dot);
      ASSERT_NEAR(dx[k], want, 2e-5 * (std::fabs(want) + p)) << i << "," << j;
    }
  }
}

}  // namespace
}  // namespace tern
