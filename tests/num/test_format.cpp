// Format properties: the table of docs/reference/numerics.md section 1.
#include <gtest/gtest.h>

#include <cmath>

#include "common/expect_error.h"
#include "num/format.h"
#include "util/error.h"

namespace tern::num {
namespace {

struct Row {
  const char* name;
  int bits;
  double max_finite, min_subnormal;
  bool inf, nan;
};

TEST(Format, PropertiesMatchNumericsTable) {
  const Row rows[] = {
      {"e4m3", 8, 448, 0x1p-9, false, true},
      {"e5m2", 8, 57344, 0x1p-16, true, true},
      {"e4m3-legacy", 8, 240, 0x1p-9, true, true},
      {"e3m4", 8, 15.5, 0x1p-6, true, true},
      {"e3m2", 6, 28, 0.0625, false, false},
      {"e2m3", 6, 7.5, 0.125, false, false},
      {"e2m1", 4, 6, 0.5, false, false},
      {"e8m0", 8, 0x1p127, 0x1p-127, false, true},
      {"mxint8", 8, 127.0 / 64, 1.0 / 64, false, false},
      {"fp16", 16, 65504, 0x1p-24, true, true},
      {"bf16", 16, 0x1.fep127, 0x1p-133, true, true},
      {"tf32", 19, 0x1.ffcp127, 0x1p-136, true, true},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    const Format f = parse_format(r.name);
    EXPECT_EQ(f.bits, r.bits);
    EXPECT_EQ(f.max_finite(), r.max_finite);
    EXPECT_EQ(f.min_subnormal(), r.min_subnormal);
    EXPECT_EQ(f.has_inf(), r.inf);
    EXPECT_EQ(f.has_nan(), r.nan);
  }
}

TEST(Format, NanAndInfCodes) {
  EXPECT_EQ(parse_format("e4m3").nan_code(), 0x7F);
  EXPECT_EQ(parse_format("e5m2").inf_code(), 0x7C);
  EXPECT_EQ(parse_format("e5m2").nan_code(), 0x7E);
  EXPECT_EQ(parse_format("e4m3-legacy").inf_code(), 0x78);
  EXPECT_EQ(parse_format("bf16").nan_code(), 0x7FC0);
  EXPECT_EQ(parse_format("e8m0").nan_code(), 0xFF);
  EXPECT_EQ(parse_format("e2m1").nan_code(), -1);
  EXPECT_EQ(parse_format("e2m1").inf_code(), -1);
}

TEST(Format, AliasesResolve) {
  EXPECT_EQ(parse_format("float8_e4m3fn").name, "e4m3");
  EXPECT_EQ(parse_format("float8_e4m3").name, "e4m3-legacy");
  EXPECT_EQ(parse_format("bfloat16").name, "bf16");
  EXPECT_EQ(parse_format("fp4").name, "e2m1");
  EXPECT_EQ(parse_format("float8_e8m0fnu").name, "e8m0");
  for (const Format& f : builtin_formats()) EXPECT_EQ(parse_format(f.name).name, f.name);
}

TEST(Format, ConfigurableBias) {
  const Format f = parse_format("cfp8-e4m3-b10");
  EXPECT_EQ(f.bias, 10);
  EXPECT_EQ(f.max_finite(), 30.0);  // 1.875 * 2^(14 - 10)
  EXPECT_EQ(f.min_subnormal(), std::ldexp(1.0, 1 - 10 - 3));
  EXPECT_TRUE(f.has_inf());
  EXPECT_EQ(cfp8(5, 2, 15).max_finite(), 57344.0);
}

TEST(Format, BadNamesAreClearErrors) {
  test_util::expect_error([] { parse_format("e9m9"); }, {"unknown number format 'e9m9'", "e4m3"});
  EXPECT_THROW(parse_format("cfp8-e4m3"), Error);
  EXPECT_THROW(parse_format("cfp8-e4m4-b7"), Error);
  EXPECT_THROW(parse_format("cfp8-e4m3-b200"), Error);
  EXPECT_THROW(parse_format("cfp8-e4m3-b7x"), Error);
}

}  // namespace
}  // namespace tern::num
