// Every code of every format of 8 bits or fewer decodes to the value its
// definition gives (an independent formula here, per numerics.md section 1),
// the 16/19-bit formats are checked exhaustively against the hardware's own
// conversions, and the array decoder agrees with the scalar one.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "num/convert.h"
#include "num/format.h"

namespace tern::num {
namespace {

enum class Kind { ieee, fn, finite };
struct Spec {
  const char* name;
  int e, m, bias;
  Kind kind;
};

// The definition: (-1)^S 2^(E - bias) (1 + M / 2^m), subnormal at E = 0.
double defined_value(const Spec& s, std::uint32_t code) {
  const int bits = 1 + s.e + s.m;
  const bool neg = (code >> (bits - 1)) & 1u;
  const std::uint32_t E = (code >> s.m) & ((1u << s.e) - 1u);
  const std::uint32_t M = code & ((1u << s.m) - 1u);
  const std::uint32_t eall = (1u << s.e) - 1u, mall = (1u << s.m) - 1u;
  double v;
  if (s.kind == Kind::ieee && E == eall) {
    v = M == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (s.kind == Kind::fn && E == eall && M == mall) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (E == 0) {
    v = std::ldexp(static_cast<double>(M), 1 - s.bias - s.m);
  } else {
    v = std::ldexp(1.0 + std::ldexp(static_cast<double>(M), -s.m), static_cast<int>(E) - s.bias);
  }
  return neg ? -v : v;
}

void expect_same(double want, float got, std::uint32_t code) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << "code 0x" << std::hex << code;
  } else {
    EXPECT_EQ(static_cast<double>(got), want) << "code 0x" << std::hex << code;
    EXPECT_EQ(std::signbit(got), std::signbit(want)) << "code 0x" << std::hex << code;
  }
}

TEST(Decode, EveryCodeOfSmallFloatFormats) {
  const Spec specs[] = {
      {"e4m3", 4, 3, 7, Kind::fn},
      {"e5m2", 5, 2, 15, Kind::ieee},
      {"e4m3-legacy", 4, 3, 7, Kind::ieee},
      {"e3m4", 3, 4, 3, Kind::ieee},
      {"cfp8-e4m3-b11", 4, 3, 11, Kind::ieee},
      {"cfp8-e3m4-b1", 3, 4, 1, Kind::ieee},
      {"e3m2", 3, 2, 3, Kind::finite},
      {"e2m3", 2, 3, 1, Kind::finite},
      {"e2m1", 2, 1, 1, Kind::finite},
  };
  for (const Spec& s : specs) {
    SCOPED_TRACE(s.name);
    const Format f = parse_format(s.name);
    const std::uint32_t n = 1u << f.bits;
    std::vector<std::uint8_t> codes(n);
    std::vector<float> arr(n);
    for (std::uint32_t c = 0; c < n; ++c) codes[c] = static_cast<std::uint8_t>(c);
    decode_array(f, codes, arr);
    for (std::uint32_t c = 0; c < n; ++c) {
      expect_same(defined_value(s, c), decode(f, c), c);
      expect_same(defined_value(s, c), arr[c], c);
    }
  }
}

TEST(Decode, E2M1ValueList) {
  const Format& f = format(FormatId::e2m1);
  const float want[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (std::uint32_t c = 0; c < 8; ++c) {
    EXPECT_EQ(decode(f, c), want[c]);
    EXPECT_EQ(decode(f, c | 8u), -want[c]);
  }
}

TEST(Decode, GoldenCodes) {
  EXPECT_EQ(decode(format(FormatId::e4m3), 0x7E), 448.0f);
  EXPECT_EQ(decode(format(FormatId::e4m3), 0x01), 0x1p-9f);
  EXPECT_TRUE(std::isnan(decode(format(FormatId::e4m3), 0xFF)));
  EXPECT_EQ(decode(format(FormatId::e4m3), 0x78), 256.0f);               // a number in OCP E4M3 ...
  EXPECT_TRUE(std::isinf(decode(format(FormatId::e4m3_legacy), 0x78)));  // ... Inf in legacy
  EXPECT_EQ(decode(format(FormatId::e4m3_legacy), 0x77), 240.0f);
  EXPECT_EQ(decode(format(FormatId::e5m2), 0x7B), 57344.0f);
  EXPECT_EQ(decode(format(FormatId::e3m4), 0x6F), 15.5f);
  EXPECT_EQ(decode(format(FormatId::e3m2), 0x1F), 28.0f);
  EXPECT_EQ(decode(format(FormatId::e2m3), 0x1F), 7.5f);
}

TEST(Decode, EveryE8m0Code) {
  const Format& f = format(FormatId::e8m0);
  for (std::uint32_t c = 0; c < 255; ++c) {
    EXPECT_EQ(static_cast<double>(decode(f, c)), std::ldexp(1.0, static_cast<int>(c) - 127));
  }
  EXPECT_TRUE(std::isnan(decode(f, 0xFF)));
  EXPECT_EQ(decode(f, 0x7F), 1.0f);
}

TEST(Decode, EveryMxint8Code) {
  const Format& f = format(FormatId::mxint8);
  for (std::uint32_t c = 0; c < 256; ++c) {
    const int k = c < 128 ? static_cast<int>(c) : static_cast<int>(c) - 256;
    EXPECT_EQ(decode(f, c), static_cast<float>(k) / 64.0f) << c;
  }
}

TEST(Decode, EveryBf16Fp16AndTf32Code) {
  for (std::uint32_t c = 0; c < 65536; ++c) {
    const float want = std::bit_cast<float>(c << 16);
    const float got = decode(format(FormatId::bf16), c);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got) & (std::isnan(want) ? 0xFF800000u : ~0u),
              std::bit_cast<std::uint32_t>(want) & (std::isnan(want) ? 0xFF800000u : ~0u));
    // GCC's _Float16 is the IEEE binary16 reference.
    const _Float16 h = std::bit_cast<_Float16>(static_cast<std::uint16_t>(c));
    const float hw = static_cast<float>(h);
    const float hg = decode(format(FormatId::fp16), c);
    if (std::isnan(hw)) {
      ASSERT_TRUE(std::isnan(hg));
    } else {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(hg), std::bit_cast<std::uint32_t>(hw)) << c;
    }
  }
  for (std::uint32_t c = 0; c < (1u << 19); ++c) {
    const float want = std::bit_cast<float>(c << 13);
    const float got = decode(format(FormatId::tf32), c);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got));
    } else {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(want)) << c;
    }
  }
}

TEST(Decode, ArrayMatchesScalarFor16BitFormats) {
  for (FormatId id : {FormatId::bf16, FormatId::fp16}) {
    const Format& f = format(id);
    std::vector<std::uint16_t> codes(65536);
    for (std::uint32_t c = 0; c < 65536; ++c) codes[c] = static_cast<std::uint16_t>(c);
    std::vector<float> out(codes.size());
    decode_array(f, codes, out);
    for (std::uint32_t c = 0; c < 65536; ++c) {
      const float s = decode(f, c);
      if (std::isnan(s))
        ASSERT_TRUE(std::isnan(out[c]));
      else
        ASSERT_EQ(std::bit_cast<std::uint32_t>(out[c]), std::bit_cast<std::uint32_t>(s));
    }
  }
}

}  // namespace
}  // namespace tern::num
