// Stochastic rounding: reproducible from the seed, unbiased in expectation
// (checked statistically with fixed seeds), exact values untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "num/convert.h"
#include "num/format.h"

namespace tern::num {
namespace {

struct Moments {
  double mean, p_up;
};

// n samples of SR(x) through the array path (element i uses word i).
Moments sample(const Format& f, float x, std::uint64_t seed, std::size_t n, double lo, double hi) {
  std::vector<float> v(n, x);
  const CastOptions opt{Rounding::stochastic, Overflow::saturate, seed};
  round_array(f, v, opt);
  double sum = 0;
  std::size_t ups = 0;
  for (float y : v) {
    EXPECT_TRUE(y == lo || y == hi) << y;
    sum += y;
    ups += y == hi;
  }
  return {sum / static_cast<double>(n), static_cast<double>(ups) / static_cast<double>(n)};
}

TEST(StochasticRounding, UnbiasedAcrossFormatsAndRanges) {
  struct Case {
    FormatId f;
    float x;
    double lo, hi;
  };
  const Case cases[] = {
      {FormatId::bf16, 1.0f + 0x1p-9f, 1.0, 1.0 + 0x1p-7},          // p = 1/4
      {FormatId::bf16, -3.0f - 0x1p-7f, -3.0, -3.0 - 0x1p-6},       // p = 1/2 (a tie)
      {FormatId::e4m3, 300.5f, 288.0, 320.0},                       // p = 12.5/32
      {FormatId::e4m3, 0x1.4p-10f, 0.0, 0x1p-9},                    // subnormal, p = 0.625
      {FormatId::e5m2, 60000.0f, 57344.0, 57344.0},                 // saturating overflow side
      {FormatId::e2m1, 2.4f, 2.0, 3.0},                             // p = 0.4
      {FormatId::fp16, 0x1.0008p-20f, 0x1p-20, 0x1p-20 + 0x1p-24},  // fp16 subnormal
      {FormatId::mxint8, 0.3f, 19.0 / 64, 20.0 / 64},               // fixed point
  };
  constexpr std::size_t kN = 1 << 18;
  for (const Case& c : cases) {
    const Format& f = format(c.f);
    SCOPED_TRACE(f.name + " x=" + std::to_string(c.x));
    double lo = c.lo, hi = c.hi;
    if (lo > hi) std::swap(lo, hi);
    // Expected value: x itself, unless saturation caps it.
    const double want = std::min(static_cast<double>(c.x), f.max_finite());
    const double p = hi == lo ? 0 : (want - lo) / (hi - lo);
    const Moments m = sample(f, c.x, 2024, kN, lo, hi);
    const double sigma = (hi - lo) * std::sqrt(p * (1 - p) / kN);
    EXPECT_NEAR(m.mean, want, 5 * sigma + 1e-12);
    if (hi != lo) {
      EXPECT_NEAR(m.p_up, p, 5 * std::sqrt(p * (1 - p) / kN) + 1e-12);
    }
  }
}

TEST(StochasticRounding, ReproducibleFromSeed) {
  const Format& f = format(FormatId::e4m3);
  std::vector<float> a(4096, 300.5f), b(4096, 300.5f), c(4096, 300.5f);
  round_array(f, a, {Rounding::stochastic, Overflow::saturate, 7});
  round_array(f, b, {Rounding::stochastic, Overflow::saturate, 7});
  round_array(f, c, {Rounding::stochastic, Overflow::saturate, 8});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(sr_random(7, 123), sr_random(7, 123));
  EXPECT_NE(sr_random(7, 123), sr_random(8, 123));
}

TEST(StochasticRounding, RepresentableValuesStayExact) {
  for (const Format& f : builtin_formats()) {
    if (f.encoding == Encoding::e8m0) continue;
    const std::uint32_t n = f.bits <= 8 ? (1u << f.bits) : 4096u;
    for (std::uint32_t c = 0; c < n; ++c) {
      const float v = decode(f, c);
      // MXINT8's -128/64 decodes but is outside the encodable symmetric range.
      if (!std::isfinite(v) || std::fabs(v) > f.max_finite()) continue;
      for (std::uint32_t r : {0u, 1u, 0x80000000u, 0xFFFFFFFFu}) {
        EXPECT_EQ(decode(f, encode(f, v, Rounding::stochastic, Overflow::saturate, r)), v)
            << f.name << " code " << c;
      }
    }
  }
}

TEST(StochasticRounding, RandomWordsAreUniform) {
  // Each bit of sr_random over consecutive indices is 1 half the time.
  constexpr std::size_t kN = 1 << 18;
  std::size_t ones[32] = {};
  for (std::size_t i = 0; i < kN; ++i) {
    const std::uint32_t r = sr_random(99, i);
    for (int b = 0; b < 32; ++b) ones[b] += (r >> b) & 1u;
  }
  const double sigma = std::sqrt(kN * 0.25);
  for (int b = 0; b < 32; ++b) EXPECT_NEAR(static_cast<double>(ones[b]), kN / 2.0, 5 * sigma) << b;
}

}  // namespace
}  // namespace tern::num
