// MX block quantization: the worked examples and every edge case of
// docs/reference/numerics.md section 3, the exact scale rules, and the
// elements against MPFR.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "num/convert.h"
#include "num/mx.h"
#include "oracle.h"
#include "util/error.h"

namespace tern::num {
namespace {

struct Block {
  std::vector<std::uint8_t> el;
  std::uint8_t scale;
  std::vector<float> deq;
};

Block quantize(MxId id, ScalePolicy p, std::vector<float> xs, const CastOptions& opt = {}) {
  xs.resize(kMxBlock, 0.0f);
  Block b{std::vector<std::uint8_t>(kMxBlock), 0, std::vector<float>(kMxBlock)};
  mx_quantize(mx_format(id), p, xs, b.el, std::span<std::uint8_t>(&b.scale, 1), opt);
  mx_dequantize(mx_format(id), b.el, std::span<const std::uint8_t>(&b.scale, 1), b.deq);
  return b;
}

float elem(const Block& b, MxId id, std::size_t i) {
  return decode(format(mx_format(id).element), b.el[i]);
}

TEST(Mx, WorkedExamplesE4m3) {
  // amax 485: ocp-floor X=1 (485 clamps to 448); rceil X=2 (242.5 -> 240); trn3 X=2 (240).
  auto b = quantize(MxId::mxfp8_e4m3, ScalePolicy::ocp_floor, {485});
  EXPECT_EQ(b.scale, 127);
  EXPECT_EQ(elem(b, MxId::mxfp8_e4m3, 0), 448.0f);
  b = quantize(MxId::mxfp8_e4m3, ScalePolicy::rceil, {485});
  EXPECT_EQ(b.scale, 128);
  EXPECT_EQ(elem(b, MxId::mxfp8_e4m3, 0), 240.0f);
  EXPECT_EQ(b.deq[0], 480.0f);
  b = quantize(MxId::mxfp8_e4m3, ScalePolicy::trn3, {485});
  EXPECT_EQ(b.scale, 128);
  EXPECT_EQ(elem(b, MxId::mxfp8_e4m3, 0), 240.0f);
  // amax 300: ocp-floor X=1 (288); rceil X=1 (288); trn3 X=2 (144).
  b = quantize(MxId::mxfp8_e4m3, ScalePolicy::ocp_floor, {300});
  EXPECT_EQ(b.scale, 127);
  EXPECT_EQ(elem(b, MxId::mxfp8_e4m3, 0), 288.0f);
  b = quantize(MxId::mxfp8_e4m3, ScalePolicy::rceil, {300});
  EXPECT_EQ(b.scale, 127);
  EXPECT_EQ(elem(b, MxId::mxfp8_e4m3, 0), 288.0f);
  b = quantize(MxId::mxfp8_e4m3, ScalePolicy::trn3, {300});
  EXPECT_EQ(b.scale, 128);
  EXPECT_EQ(elem(b, MxId::mxfp8_e4m3, 0), 144.0f);
}

TEST(Mx, PolicyOffsetsPerElementFormat) {
  // amax = 1.0 (exponent 0): k = -emax (ocp), rceil from max_elem, trn3 -(emax - 1).
  const std::vector<float> one = {1.0f};
  EXPECT_EQ(quantize(MxId::mxfp8_e5m2, ScalePolicy::ocp_floor, one).scale, 127 - 15);
  EXPECT_EQ(quantize(MxId::mxfp8_e5m2, ScalePolicy::trn3, one).scale, 127 - 14);
  EXPECT_EQ(quantize(MxId::mxfp8_e4m3, ScalePolicy::trn3, one).scale, 127 - 7);
  EXPECT_EQ(quantize(MxId::mxfp4, ScalePolicy::trn3, one).scale, 127 - 2);
  EXPECT_EQ(quantize(MxId::mxfp4, ScalePolicy::ocp_floor, one).scale, 127 - 2);
  EXPECT_EQ(quantize(MxId::mxfp6_e3m2, ScalePolicy::ocp_floor, one).scale, 127 - 4);
  EXPECT_EQ(quantize(MxId::mxfp6_e2m3, ScalePolicy::ocp_floor, one).scale, 127 - 2);
  EXPECT_EQ(quantize(MxId::mxint8, ScalePolicy::ocp_floor, one).scale, 127);
  // rceil: 1/6 -> ceil(log2) = -2 for FP4 (max 6); 1/448 -> -8 for E4M3.
  EXPECT_EQ(quantize(MxId::mxfp4, ScalePolicy::rceil, one).scale, 127 - 2);
  EXPECT_EQ(quantize(MxId::mxfp8_e4m3, ScalePolicy::rceil, one).scale, 127 - 8);
  EXPECT_THROW(quantize(MxId::mxfp6_e3m2, ScalePolicy::trn3, one), NotSupported);
  EXPECT_THROW(quantize(MxId::mxint8, ScalePolicy::trn3, one), NotSupported);
}

TEST(Mx, ScaleExponentComesFromTheBitsNotAFloatLog) {
  // Just below a power of two: floor(log2) = 8, a float log2 rounds to 9.
  const float below = std::nextafter(512.0f, 0.0f);
  auto b = quantize(MxId::mxfp8_e4m3, ScalePolicy::ocp_floor, {below});
  EXPECT_EQ(b.scale, 127);
  EXPECT_EQ(elem(b, MxId::mxfp8_e4m3, 0), 448.0f);  // clamped
  // rceil is exact at the threshold: amax == 448 keeps X = 1, one ulp more doubles it.
  EXPECT_EQ(quantize(MxId::mxfp8_e4m3, ScalePolicy::rceil, {448.0f}).scale, 127);
  EXPECT_EQ(quantize(MxId::mxfp8_e4m3, ScalePolicy::rceil, {std::nextafter(448.0f, 1e9f)}).scale,
            128);
}

TEST(Mx, AllZeroBlock) {
  auto b = quantize(MxId::mxfp8_e4m3, ScalePolicy::rceil, {0.0f, -0.0f});
  EXPECT_EQ(b.scale, 0x00);
  for (std::size_t i = 0; i < kMxBlock; ++i) EXPECT_EQ(b.deq[i], 0.0f);
}

TEST(Mx, ScaleUnderflowClampsAndElementsMayFlush) {
  // amax 2^-140: the ideal scale 2^-148 is below 2^-127, so X = 2^-127.
  auto b = quantize(MxId::mxfp8_e4m3, ScalePolicy::ocp_floor, {0x1p-140f, 0x1p-120f * 0.0f});
  EXPECT_EQ(b.scale, 0x00);
  EXPECT_EQ(elem(b, MxId::mxfp8_e4m3, 0), 0.0f);  // 2^-13 flushes below E4M3's 2^-9
  // An FP32-subnormal block that still fits: MXINT8 amax 1.5 * 2^-127.
  b = quantize(MxId::mxint8, ScalePolicy::ocp_floor, {0x1.8p-127f, -0x1p-127f});
  EXPECT_EQ(b.scale, 0x00);
  EXPECT_EQ(elem(b, MxId::mxint8, 0), 1.5f);
  EXPECT_EQ(elem(b, MxId::mxint8, 1), -1.0f);
  EXPECT_EQ(b.deq[0], 0x1.8p-127f);
}

TEST(Mx, ScaleOverflowGivesNanScale) {
  // MXINT8 rceil of FLT_MAX needs 2^128.
  auto b = quantize(MxId::mxint8, ScalePolicy::rceil, {std::numeric_limits<float>::max(), 1.0f});
  EXPECT_EQ(b.scale, 0xFF);
  for (std::size_t i = 0; i < kMxBlock; ++i) {
    EXPECT_EQ(b.el[i], 0);
    EXPECT_TRUE(std::isnan(b.deq[i]));
  }
  // The largest finite scale is 2^127 (0xFE).
  b = quantize(MxId::mxint8, ScalePolicy::ocp_floor, {std::numeric_limits<float>::max()});
  EXPECT_EQ(b.scale, 0xFE);
}

TEST(Mx, NanOrInfMakesTheWholeBlockNan) {
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    for (ScalePolicy p : {ScalePolicy::ocp_floor, ScalePolicy::rceil, ScalePolicy::trn3}) {
      auto b = quantize(MxId::mxfp8_e5m2, p, {1.0f, bad, 2.0f});
      EXPECT_EQ(b.scale, 0xFF);
      for (float d : b.deq) EXPECT_TRUE(std::isnan(d));
    }
  }
}

TEST(Mx, ElementsMatchMpfrAndDequantizeExactly) {
  std::mt19937 rng(11);
  std::lognormal_distribution<float> mag(0.0f, 3.0f);
  for (const MxFormat& mf : mx_formats()) {
    const Format& ef = format(mf.element);
    for (ScalePolicy p : {ScalePolicy::ocp_floor, ScalePolicy::rceil, ScalePolicy::trn3}) {
      const bool fp6_or_int = mf.element != FormatId::e4m3 && mf.element != FormatId::e5m2 &&
                              mf.element != FormatId::e2m1;
      if (p == ScalePolicy::trn3 && fp6_or_int) continue;
      constexpr std::size_t kBlocks = 200;
      std::vector<float> xs(kBlocks * kMxBlock);
      for (float& x : xs) x = (rng() & 1 ? -1.0f : 1.0f) * mag(rng);
      std::vector<std::uint8_t> el(xs.size()), sc(kBlocks);
      mx_quantize(mf, p, xs, el, sc);
      std::vector<float> deq(xs.size());
      mx_dequantize(mf, el, sc, deq);
      for (std::size_t i = 0; i < xs.size(); ++i) {
        const int k = static_cast<int>(sc[i / kMxBlock]) - 127;
        ASSERT_EQ(
            k, mx_scale_exponent(
                   mf, p, std::span<const float>(xs).subspan(i / kMxBlock * kMxBlock, kMxBlock)));
        // The scaled value x * 2^-k is exact in FP32 here (normal range).
        const float scaled = std::ldexp(xs[i], -k);
        double want;
        if (ef.encoding == Encoding::int_fixed) {
          want = std::clamp(oracle::round_fixed(scaled, ef.man_bits), -ef.max_finite(),
                            ef.max_finite());
        } else {
          want = oracle::round_float(scaled, ef.man_bits, ef.emin(), oracle::Dir::nearest_even);
          want = std::clamp(want, -ef.max_finite(), ef.max_finite());
        }
        ASSERT_EQ(static_cast<double>(decode(ef, el[i])), want) << mf.name << " x=" << xs[i];
        ASSERT_EQ(static_cast<double>(deq[i]), std::ldexp(want, k));
        // The scalar encoder with the block's exponent gives the same code.
        ASSERT_EQ(el[i], encode(ef, xs[i], Rounding::nearest_even, Overflow::saturate, 0, k));
      }
    }
  }
}

TEST(Mx, StochasticElementsAreReproducibleAndBracketed) {
  std::vector<float> xs(kMxBlock);
  for (std::size_t i = 0; i < kMxBlock; ++i) xs[i] = 0.1f + 0.37f * static_cast<float>(i);
  const CastOptions opt{Rounding::stochastic, Overflow::saturate, 3};
  const Block a = quantize(MxId::mxfp4, ScalePolicy::rceil, xs, opt);
  const Block b = quantize(MxId::mxfp4, ScalePolicy::rceil, xs, opt);
  EXPECT_EQ(a.el, b.el);
  const int k = static_cast<int>(a.scale) - 127;
  for (std::size_t i = 0; i < kMxBlock; ++i) {
    const float s = std::ldexp(xs[i], -k);
    const double dn = oracle::round_float(s, 1, 0, oracle::Dir::down);
    const double up = oracle::round_float(s, 1, 0, oracle::Dir::up);
    const double got = elem(a, MxId::mxfp4, i);
    EXPECT_TRUE(got == dn || got == std::min(up, 6.0)) << xs[i];
  }
}

// A tile quantized in place gives the codes and scales of its blocks
// gathered one after the other (rows within a block), for every block
// shape, policy, rounding and a tile with NaN, Inf, zero and tiny blocks.
TEST(Mx, TileEqualsGatheredBlocks) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const MxId id : {MxId::mxfp8_e4m3, MxId::mxfp8_e5m2, MxId::mxfp4})
    for (const ScalePolicy p : {ScalePolicy::ocp_floor, ScalePolicy::rceil, ScalePolicy::trn3})
      for (const Rounding r : {Rounding::nearest_even, Rounding::stochastic})
        for (const std::size_t rows : {1, 2, 8, 32})
          for (const std::size_t nb : {1, 3, 17, 96}) {
            const std::size_t w = kMxBlock / rows, cols = w * nb;
            std::vector<float> x(rows * cols);
            for (auto& v : x) v = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 30) - 15);
            auto at = [&](std::size_t b, std::size_t i) -> float& {
              return x[(i / w) * cols + (b % nb) * w + i % w];
            };
            // Special blocks where the tile has room for them (block 0 first).
            if (nb > 3)
              for (std::size_t i = 0; i < kMxBlock; ++i) at(3, i) = 1e-40f * static_cast<float>(i);
            if (nb > 2)
              for (std::size_t i = 0; i < kMxBlock; ++i) at(2, i) = 0.0f;
            if (nb > 1) at(1, 3) = -inf;
            at(0, 5) = nan;
            std::vector<float> blocks(x.size());
            for (std::size_t b = 0; b < nb; ++b)
              for (std::size_t i = 0; i < kMxBlock; ++i) blocks[b * kMxBlock + i] = at(b, i);
            const CastOptions opt{r, Overflow::saturate, 9};
            std::vector<std::uint8_t> want(x.size()), want_sc(nb), got(x.size()), got_sc(nb);
            mx_quantize(mx_format(id), p, blocks, want, want_sc, opt, 1000);
            mx_quantize_tile(mx_format(id), p, x, rows, got, got_sc, opt, 1000);
            SCOPED_TRACE(::testing::Message() << mx_format(id).name << " " << policy_name(p)
                                              << " rows " << rows << " blocks " << nb);
            ASSERT_EQ(got_sc, want_sc);
            for (std::size_t b = 0; b < nb; ++b)
              for (std::size_t i = 0; i < kMxBlock; ++i)
                ASSERT_EQ(got[(i / w) * cols + b * w + i % w], want[b * kMxBlock + i])
                    << b << " " << i;
          }
}

TEST(Mx, TileShapeErrors) {
  const MxFormat& f = mx_format(MxId::mxfp8_e4m3);
  std::vector<float> x(64);
  std::vector<std::uint8_t> el(64), sc(2), sc1(1);
  EXPECT_THROW(mx_quantize_tile(f, ScalePolicy::trn3, x, 3, el, sc), Error);  // 32 % 3
  EXPECT_THROW(mx_quantize_tile(f, ScalePolicy::trn3, x, 0, el, sc), Error);
  EXPECT_THROW(mx_quantize_tile(f, ScalePolicy::trn3, x, 8, el, sc1), Error);
  EXPECT_THROW(mx_quantize_tile(f, ScalePolicy::trn3, std::span<const float>(x.data(), 40), 8,
                                std::span<std::uint8_t>(el.data(), 40), sc1),
               Error);
  EXPECT_NO_THROW(mx_quantize_tile(f, ScalePolicy::trn3, x, 8, el, sc));
}

TEST(Mx, BadSizesAndNames) {
  std::vector<float> xs(33);
  std::vector<std::uint8_t> el(33), sc(1);
  EXPECT_THROW(mx_quantize(mx_format(MxId::mxfp4), ScalePolicy::rceil, xs, el, sc), Error);
  EXPECT_THROW(parse_mx_format("mxfp9"), Error);
  EXPECT_THROW(parse_scale_policy("round-up"), Error);
  EXPECT_EQ(parse_mx_format("mxfp8_e5m2").name, "mxfp8-e5m2");
}

}  // namespace
}  // namespace tern::num

namespace tern::num {
namespace {

// times_pow2 (the MX dequantization's scaling) gives std::ldexp's bits for
// every element value of every MX element format (all codes) and every
// scale exponent E8M0 encodes, and for float edge cases (subnormal results,
// overflow, zeros, NaN, Inf).
TEST(Mx, TimesPow2IsLdexpBitForBit) {
  std::vector<float> values;
  for (FormatId id : {FormatId::e4m3, FormatId::e5m2, FormatId::e3m2, FormatId::e2m3,
                      FormatId::e2m1, FormatId::mxint8})
    for (std::uint32_t c = 0; c <= format(id).code_mask(); ++c)
      values.push_back(decode(format(id), c));
  for (float v : {1e-45f, 1.17549435e-38f, 3.4e38f, -0.0f, std::numeric_limits<float>::infinity()})
    values.push_back(v);
  for (float v : values)
    for (int e = -127; e <= 127; ++e) {
      const float want = std::ldexp(v, e), got = times_pow2(v, e);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << v << " " << e;
      } else {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(want))
            << v << " * 2^" << e;
      }
    }
}

}  // namespace
}  // namespace tern::num
