// The vectorized array casts give exactly the scalar reference's codes and
// counts, for every format, rounding and overflow mode, any length and any
// position in the stochastic-rounding stream.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "num/convert.h"
#include "num/format.h"
#include "util/error.h"

namespace tern::num {
namespace {

std::vector<float> inputs() {
  std::vector<float> xs;
  for (std::uint32_t c = 0; c < 65536; ++c) xs.push_back(std::bit_cast<float>(c << 16));
  std::mt19937 rng(5);
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t r = rng();
    xs.push_back(i % 2 ? std::bit_cast<float>(r)
                       : std::ldexp(1.0f + (r >> 9) * 0x1p-23f, static_cast<int>(r % 40) - 20));
  }
  return xs;
}

template <typename T>
void check(const Format& f, const std::vector<float>& xs, const CastOptions& opt,
           std::uint64_t base) {
  std::vector<T> out(xs.size());
  const CastStats got = encode_array(f, xs, std::span<T>(out), opt, base);
  CastStats want;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::uint32_t r =
        opt.rounding == Rounding::stochastic ? sr_random(opt.seed, base + i) : 0;
    const std::uint32_t code = encode(f, xs[i], opt.rounding, opt.overflow, r, 0, &want);
    if (code != out[i] && bad++ < 5) {
      ADD_FAILURE() << f.name << " x=" << xs[i] << " i=" << i << " scalar 0x" << std::hex << code
                    << " array 0x" << +out[i];
    }
  }
  EXPECT_EQ(bad, 0u);
  std::vector<T> codes(xs.size());  // the same codes without the counts
  encode_codes(f, xs, std::span<T>(codes), opt, base);
  EXPECT_TRUE(codes == out);
  EXPECT_EQ(got.overflow, want.overflow);
  EXPECT_EQ(got.underflow, want.underflow);
  EXPECT_EQ(got.nan, want.nan);
  EXPECT_EQ(got.inf, want.inf);
}

TEST(ArrayCast, MatchesScalarEverywhere) {
  const auto xs = inputs();
  std::vector<Format> fmts(builtin_formats().begin(), builtin_formats().end());
  fmts.push_back(cfp8(4, 3, 11));
  for (const Format& f : fmts) {
    for (Rounding r : {Rounding::nearest_even, Rounding::stochastic}) {
      for (Overflow o : {Overflow::non_saturating, Overflow::saturate}) {
        SCOPED_TRACE(f.name + (r == Rounding::stochastic ? " sr" : " rne") +
                     (o == Overflow::saturate ? " sat" : " nonsat"));
        const CastOptions opt{r, o, 42};
        if (f.bits <= 8) check<std::uint8_t>(f, xs, opt, 0);
        if (f.bits <= 16) check<std::uint16_t>(f, xs, opt, 7);
        check<std::uint32_t>(f, xs, opt, 3);
      }
    }
  }
}

TEST(ArrayCast, OddLengthsAndStreamPositions) {
  const Format& f = format(FormatId::e4m3);
  std::vector<float> xs(77);
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = 300.5f + static_cast<float>(i) * 0.37f;
  const CastOptions opt{Rounding::stochastic, Overflow::saturate, 9};
  for (std::size_t n : {0u, 1u, 3u, 15u, 16u, 17u, 31u, 33u, 77u}) {
    const std::vector<float> part(xs.begin(), xs.begin() + static_cast<long>(n));
    // Crossing 2^32 in the element index changes the high key word.
    for (std::uint64_t base :
         {std::uint64_t{0}, (std::uint64_t{1} << 32) - 5, std::uint64_t{1} << 40}) {
      check<std::uint8_t>(f, part, opt, base);
    }
  }
}

TEST(ArrayCast, SplittingAStreamGivesTheSameBits) {
  const Format& f = format(FormatId::bf16);
  std::vector<float> xs(1000);
  std::mt19937 rng(1);
  for (float& x : xs)
    x = std::bit_cast<float>(static_cast<std::uint32_t>((rng() & 0x3FFFFFFFu) | 0x3F000000u));
  const CastOptions opt{Rounding::stochastic, Overflow::non_saturating, 5};
  std::vector<std::uint16_t> whole(xs.size()), parts(xs.size());
  encode_array(f, xs, std::span<std::uint16_t>(whole), opt, 0);
  for (std::size_t at = 0; at < xs.size(); at += 333) {
    const std::size_t n = std::min<std::size_t>(333, xs.size() - at);
    encode_array(f, std::span<const float>(xs).subspan(at, n),
                 std::span<std::uint16_t>(parts).subspan(at, n), opt, at);
  }
  EXPECT_EQ(whole, parts);
}

TEST(ArrayCast, RoundArrayIsEncodeThenDecode) {
  const Format& f = format(FormatId::e5m2);
  std::vector<float> xs = {1.0f,     1.1f,  -3.7f,
                           70000.0f, 1e-9f, std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> r = xs;
  const CastStats st = round_array(f, r);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const float want = decode(f, encode(f, xs[i]));
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(r[i]));
    else
      EXPECT_EQ(r[i], want);
  }
  EXPECT_EQ(st.overflow, 1u);
  EXPECT_EQ(st.underflow, 1u);
  EXPECT_EQ(st.nan, 1u);
}

TEST(ArrayCast, SizeErrors) {
  std::vector<float> in(4);
  std::vector<std::uint8_t> out8(3);
  EXPECT_THROW(encode_array(format(FormatId::e4m3), in, std::span<std::uint8_t>(out8)), Error);
  std::vector<std::uint8_t> out4(4);
  EXPECT_THROW(encode_array(format(FormatId::bf16), in, std::span<std::uint8_t>(out4)), Error);
}

}  // namespace
}  // namespace tern::num
