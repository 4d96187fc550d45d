// Encoding FP32 -> every format checked against GNU MPFR: all BF16 values,
// every boundary (each representable value, each midpoint, their FP32
// neighbours, overflow thresholds, FP32 subnormals) and
// $TERN_ORACLE_SAMPLES (default 10^7) random FP32 values per format, in
// both overflow modes; stochastic rounding must give one of MPFR's two
// directed roundings.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "num/convert.h"
#include "num/format.h"
#include "oracle.h"

namespace tern::num {
namespace {

using oracle::Dir;

std::size_t sample_count() {
  if (const char* s = std::getenv("TERN_ORACLE_SAMPLES")) return std::strtoull(s, nullptr, 10);
  return 10'000'000;
}

// What MPFR says the code must be.
class Expect {
 public:
  explicit Expect(const Format& f) : f_(f) {
    if (f.encoding == Encoding::e8m0 || f.encoding == Encoding::int_fixed) return;
    // value -> magnitude code, for every finite non-negative code.
    for (std::uint32_t c = 0; c <= (f.code_mask() >> 1); ++c) {
      const float v = decode(f, c);
      if (std::isfinite(v)) by_value_.emplace(static_cast<double>(v), c);
    }
  }

  std::uint32_t code(float x, Overflow ovf, Dir dir) const {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
    const bool neg = bits >> 31;
    const std::uint32_t sign = neg ? f_.sign_bit() : 0u;
    const std::int64_t ovf_mag = ovf == Overflow::saturate ? f_.max_finite_code()
                                 : f_.inf_code() >= 0      ? f_.inf_code()
                                 : f_.nan_code() >= 0      ? f_.nan_code()
                                                           : f_.max_finite_code();
    if (f_.encoding == Encoding::e8m0) return e8m0(x, ovf, dir);
    if (std::isnan(x)) {
      return f_.has_nan() ? static_cast<std::uint32_t>(f_.nan_code()) | sign : 0u;
    }
    if (f_.encoding == Encoding::int_fixed) {
      double r = std::isinf(x) ? (neg ? -1e9 : 1e9) : oracle::round_fixed(x, f_.man_bits);
      if (dir != Dir::nearest_even && std::isfinite(x)) {
        const double q = std::ldexp(static_cast<double>(x), f_.man_bits);
        r = std::ldexp(dir == Dir::down ? std::floor(q) : std::ceil(q), -f_.man_bits);
      }
      double k = std::ldexp(r, f_.man_bits);
      k = std::clamp(k, -127.0, 127.0);
      return static_cast<std::uint32_t>(static_cast<std::int32_t>(k)) & f_.code_mask();
    }
    if (std::isinf(x)) return static_cast<std::uint32_t>(ovf_mag) | sign;
    const double r = oracle::round_float(x, f_.man_bits, f_.emin(), dir);
    const double mag = std::fabs(r);
    if (mag > f_.max_finite()) return static_cast<std::uint32_t>(ovf_mag) | sign;
    const auto it = by_value_.find(mag);
    if (it == by_value_.end()) {
      ADD_FAILURE() << "oracle value " << r << " is not a value of " << f_.name;
      return 0xFFFFFFFF;
    }
    return it->second | sign;
  }

 private:
  std::uint32_t e8m0(float x, Overflow ovf, Dir dir) const {
    if (std::isnan(x)) return 0xFF;
    if (x == 0) return 0x00;
    if (x < 0) return 0xFF;
    const std::uint32_t over = ovf == Overflow::saturate ? 0xFE : 0xFF;
    if (std::isinf(x)) return over;
    double r;
    if (dir == Dir::nearest_even) {
      r = oracle::round_pow2(x);
    } else {
      int e;
      const double m = std::frexp(static_cast<double>(x), &e);  // x = m 2^e, m in [0.5, 1)
      r = (dir == Dir::down || m == 0.5) ? std::ldexp(1.0, e - 1) : std::ldexp(1.0, e);
    }
    if (r > std::ldexp(1.0, 127)) return over;
    if (r < std::ldexp(1.0, -127)) return 0x00;
    return static_cast<std::uint32_t>(std::ilogb(r) + 127);
  }

  const Format& f_;
  std::unordered_map<double, std::uint32_t> by_value_;
};

// Every representable value, midpoint and their FP32 neighbours.
std::vector<float> boundary_values(const Format& f) {
  std::vector<double> vals;
  if (f.encoding == Encoding::e8m0) {
    for (int e = -127; e <= 127; ++e) vals.push_back(std::ldexp(1.0, e));
    vals.push_back(std::ldexp(1.0, 128));  // just past the top
  } else {
    for (std::uint32_t c = 0; c <= (f.code_mask() >> 1); ++c) {
      const double v = decode(f, c);
      if (std::isfinite(v) && v >= 0) vals.push_back(v);
    }
    std::sort(vals.begin(), vals.end());
    vals.erase(std::unique(vals.begin(), vals.end()), vals.end());
    // The next value past max finite in an unbounded format: max + ulp.
    const double top = vals.back();
    const double ulp = f.encoding == Encoding::int_fixed
                           ? std::ldexp(1.0, -f.man_bits)
                           : std::ldexp(1.0, std::ilogb(top) - f.man_bits);
    vals.push_back(top + ulp);
    vals.push_back(top + 2 * ulp);
  }
  std::vector<double> cands;
  for (std::size_t i = 0; i < vals.size(); ++i) {
    cands.push_back(vals[i]);
    if (i + 1 < vals.size()) cands.push_back((vals[i] + vals[i + 1]) / 2);
  }
  cands.push_back(f.min_subnormal() / 2);
  cands.push_back(f.min_subnormal() / 4);
  std::vector<float> out;
  const float inf = std::numeric_limits<float>::infinity();
  for (double c : cands) {
    const float v = static_cast<float>(c);
    if (!std::isfinite(v)) continue;
    float lo = v, hi = v;
    out.push_back(v);
    for (int k = 0; k < 3; ++k) {
      lo = std::nextafter(lo, -inf);
      hi = std::nextafter(hi, inf);
      out.push_back(lo);
      out.push_back(hi);
    }
  }
  for (float s : {0.0f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::max(), inf, std::numeric_limits<float>::quiet_NaN(),
                  3.0e-39f, 1e-30f, 1e30f}) {
    out.push_back(s);
  }
  const std::size_t n = out.size();
  for (std::size_t i = 0; i < n; ++i) out.push_back(-out[i]);
  return out;
}

// Random FP32 values: half uniform bit patterns, half spread over the
// format's binades (and three beyond each end) with random fractions.
std::vector<float> random_values(const Format& f, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> out(n);
  const int lo = f.encoding == Encoding::int_fixed ? -f.man_bits - 3
                 : f.encoding == Encoding::e8m0    ? -130
                                                   : f.emin() - f.man_bits - 3;
  const int hi = std::min(127, std::ilogb(f.max_finite()) + 3);
  std::uniform_int_distribution<int> exp(lo, hi);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = rng();
    if (i % 2 == 0) {
      out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(r));
    } else {
      const float m = 1.0f + static_cast<float>(r >> 41) * 0x1p-23f;  // 23 random fraction bits
      float v = std::ldexp(m, exp(rng));
      out[i] = (r & 1) ? -v : v;
    }
  }
  return out;
}

class EncodeOracle : public ::testing::TestWithParam<std::string> {
 protected:
  // Checks RNE in both overflow modes, and (every `sr_stride`-th value) that
  // stochastic rounding lands on one of the two directed roundings.
  void check(const std::vector<float>& xs, std::size_t sr_stride) {
    const Format f = parse_format(GetParam());
    const Expect expect(f);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const float x = xs[i];
      for (Overflow o : {Overflow::non_saturating, Overflow::saturate}) {
        const std::uint32_t want = expect.code(x, o, Dir::nearest_even);
        const std::uint32_t got = encode(f, x, Rounding::nearest_even, o);
        if (want != got && bad++ < 10) {
          ADD_FAILURE() << f.name << " RNE " << (o == Overflow::saturate ? "sat" : "nonsat")
                        << " x=" << x << " (0x" << std::hex << std::bit_cast<std::uint32_t>(x)
                        << ") want 0x" << want << " got 0x" << got << std::dec;
        }
      }
      if (i % sr_stride == 0) {
        const std::uint32_t r = sr_random(1234, i);
        const std::uint32_t got = encode(f, x, Rounding::stochastic, Overflow::saturate, r);
        const std::uint32_t dn = expect.code(x, Overflow::saturate, Dir::down);
        const std::uint32_t up = expect.code(x, Overflow::saturate, Dir::up);
        if (got != dn && got != up && bad++ < 10) {
          ADD_FAILURE() << f.name << " SR x=" << x << " got 0x" << std::hex << got << " not in {0x"
                        << dn << ", 0x" << up << "}" << std::dec;
        }
      }
    }
    EXPECT_EQ(bad, 0u) << "mismatches against MPFR";
  }
};

TEST_P(EncodeOracle, AllBf16Values) {
  std::vector<float> xs(65536);
  for (std::uint32_t c = 0; c < 65536; ++c) xs[c] = std::bit_cast<float>(c << 16);
  check(xs, 1);
}

TEST_P(EncodeOracle, Boundaries) {
  const Format f = parse_format(GetParam());
  const auto xs = boundary_values(f);
  ASSERT_GT(xs.size(), 100u);
  check(xs, 1);
}

TEST_P(EncodeOracle, RandomValues) {
  const Format f = parse_format(GetParam());
  const std::size_t n = sample_count();
  constexpr std::size_t kChunk = 1 << 20;
  for (std::size_t done = 0; done < n; done += kChunk) {
    check(random_values(f, std::min(kChunk, n - done), 77 + done), 8);
    if (HasFailure()) break;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, EncodeOracle,
                         ::testing::Values("tf32", "bf16", "fp16", "e4m3", "e5m2", "e4m3-legacy",
                                           "e3m4", "cfp8-e4m3-b10", "cfp8-e5m2-b13", "e3m2", "e2m3",
                                           "e2m1", "e8m0", "mxint8"),
                         [](const auto& param_info) {
                           std::string s = param_info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

}  // namespace
}  // namespace tern::num
