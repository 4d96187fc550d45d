#include "num/format.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <array>
#include <cmath>
#include <cstdio>
#include <vector>

#include "util/error.h"

namespace tern::num {

std::uint32_t Format::max_finite_code() const {
  const std::uint32_t exp_all = (1u << exp_bits) - 1u;
  const std::uint32_t man_all = (1u << man_bits) - 1u;
  switch (encoding) {
    case Encoding::ieee:
      return ((exp_all - 1u) << man_bits) | man_all;
    case Encoding::nan_only:
      return (exp_all << man_bits) | (man_all - 1u);
    case Encoding::finite:
      return (exp_all << man_bits) | man_all;
    case Encoding::e8m0:
      return 0xFEu;
    case Encoding::int_fixed:
      // The OCP reference library leaves -2^(bits-1) unused: the range is symmetric.
      return (1u << (bits - 1)) - 1u;
  }
  return 0;
}

std::int64_t Format::nan_code() const {
  switch (encoding) {
    case Encoding::ieee:  // quiet NaN: exponent all ones, top mantissa bit set
      return (static_cast<std::int64_t>((1u << exp_bits) - 1u) << man_bits) |
             (std::int64_t{1} << (man_bits - 1));
    case Encoding::nan_only:
      return ((1u << exp_bits) - 1u) << man_bits | ((1u << man_bits) - 1u);
    case Encoding::e8m0:
      return 0xFF;
    default:
      return -1;
  }
}

std::int64_t Format::inf_code() const {
  if (encoding != Encoding::ieee) return -1;
  return static_cast<std::int64_t>((1u << exp_bits) - 1u) << man_bits;
}

double Format::max_finite() const {
  const std::uint32_t c = max_finite_code();
  switch (encoding) {
    case Encoding::e8m0:
      return std::ldexp(1.0, static_cast<int>(c) - bias);
    case Encoding::int_fixed:
      return std::ldexp(static_cast<double>(c), -man_bits);
    default: {
      const int e = static_cast<int>(c >> man_bits);
      const double frac = static_cast<double>(c & ((1u << man_bits) - 1u));
      return std::ldexp(1.0 + std::ldexp(frac, -man_bits), e - bias);
    }
  }
}

double Format::min_normal() const {
  if (encoding == Encoding::e8m0) return std::ldexp(1.0, -bias);
  if (encoding == Encoding::int_fixed) return std::ldexp(1.0, -man_bits);
  return std::ldexp(1.0, emin());
}

double Format::min_subnormal() const {
  if (encoding == Encoding::e8m0 || encoding == Encoding::int_fixed) return min_normal();
  return std::ldexp(1.0, emin() - man_bits);
}

namespace {

Format make(std::string name, std::string desc, int bits, int e, int m, int bias, Encoding enc) {
  return Format{std::move(name), std::move(desc), bits, e, m, bias, enc};
}

const std::array<Format, 13>& table() {
  static const std::array<Format, 13> t = {
      make("fp32", "IEEE binary32", 32, 8, 23, 127, Encoding::ieee),
      make("tf32", "TensorFloat-32 (19 bits: FP32 range, 10-bit mantissa)", 19, 8, 10, 127,
           Encoding::ieee),
      make("bf16", "bfloat16 (FP32 range, 7-bit mantissa)", 16, 8, 7, 127, Encoding::ieee),
      make("fp16", "IEEE binary16", 16, 5, 10, 15, Encoding::ieee),
      make("e4m3", "OCP FP8 E4M3 (float8_e4m3fn): no Inf, NaN S.1111.111", 8, 4, 3, 7,
           Encoding::nan_only),
      make("e5m2", "OCP FP8 E5M2 (float8_e5m2): IEEE-like", 8, 5, 2, 15, Encoding::ieee),
      make("e4m3-legacy", "IEEE-like FP8 E4M3, max 240 (Trn1/Trn2 fp8_e4m3)", 8, 4, 3, 7,
           Encoding::ieee),
      make("e3m4", "FP8 E3M4, IEEE-like (Trn1 cFP8)", 8, 3, 4, 3, Encoding::ieee),
      make("e3m2", "OCP FP6 E3M2: no Inf/NaN", 6, 3, 2, 3, Encoding::finite),
      make("e2m3", "OCP FP6 E2M3: no Inf/NaN", 6, 2, 3, 1, Encoding::finite),
      make("e2m1", "OCP FP4 E2M1: no Inf/NaN", 4, 2, 1, 1, Encoding::finite),
      make("e8m0", "OCP MX scale E8M0 (float8_e8m0fnu): 2^(code-127), 0xFF NaN, no zero", 8, 8, 0,
           127, Encoding::e8m0),
      make("mxint8", "OCP MXINT8 element: two's complement k/64, |k| <= 127", 8, 0, 6, 0,
           Encoding::int_fixed),
  };
  return t;
}

struct Alias {
  std::string_view alias;
  FormatId id;
};
constexpr Alias kAliases[] = {
    {"float32", FormatId::fp32},
    {"f32", FormatId::fp32},
    {"tfloat32", FormatId::tf32},
    {"bfloat16", FormatId::bf16},
    {"float16", FormatId::fp16},
    {"half", FormatId::fp16},
    {"float8_e4m3fn", FormatId::e4m3},
    {"fp8_e4m3fn", FormatId::e4m3},
    {"e4m3fn", FormatId::e4m3},
    {"float8_e5m2", FormatId::e5m2},
    {"fp8_e5m2", FormatId::e5m2},
    {"float8_e4m3", FormatId::e4m3_legacy},
    {"fp8_e4m3", FormatId::e4m3_legacy},
    {"float8_e3m4", FormatId::e3m4},
    {"fp6_e3m2", FormatId::e3m2},
    {"float6_e3m2fn", FormatId::e3m2},
    {"fp6_e2m3", FormatId::e2m3},
    {"float6_e2m3fn", FormatId::e2m3},
    {"fp4", FormatId::e2m1},
    {"fp4_e2m1", FormatId::e2m1},
    {"float4_e2m1fn", FormatId::e2m1},
    {"float8_e8m0fnu", FormatId::e8m0},
};

}  // namespace

const Format& format(FormatId id) {
  return table()[static_cast<std::size_t>(id)];
}

std::span<const Format> builtin_formats() {
  return table();
}

Format cfp8(int exp_bits, int man_bits, int bias) {
  if (exp_bits < 2 || man_bits < 1 || exp_bits + man_bits != 7) {
    throw Error(fmt::format(
        "cfp8: exponent and mantissa widths must be >= 2 and >= 1 and add up to 7, got e{}m{}",
        exp_bits, man_bits));
  }
  // The result must stay inside FP32's range for tern's exact conversions.
  const int max_exp = (1 << exp_bits) - 2 - bias;
  const int min_exp = 1 - bias - man_bits;
  if (max_exp > 127 || min_exp < -126) {
    throw Error(
        fmt::format("cfp8: bias {} puts e{}m{} outside the FP32 range", bias, exp_bits, man_bits));
  }
  return make(
      fmt::format("cfp8-e{}m{}-b{}", exp_bits, man_bits, bias),
      fmt::format("configurable-bias FP8 E{}M{}, bias {}, IEEE-like", exp_bits, man_bits, bias), 8,
      exp_bits, man_bits, bias, Encoding::ieee);
}

std::string format_names() {
  std::vector<std::string_view> names;
  for (const Format& f : table()) names.push_back(f.name);
  return fmt::format("{}, cfp8-e<E>m<M>-b<bias>", fmt::join(names, ", "));
}

Format parse_format(std::string_view name) {
  for (const Format& f : table()) {
    if (f.name == name) return f;
  }
  for (const Alias& a : kAliases) {
    if (a.alias == name) return format(a.id);
  }
  if (name.starts_with("cfp8-")) {
    int e = 0, m = 0, b = 0;
    char tail = 0;
    const std::string s(name);
    if (std::sscanf(s.c_str(), "cfp8-e%dm%d-b%d%c", &e, &m, &b, &tail) == 3) {
      return cfp8(e, m, b);
    }
    throw Error(
        fmt::format("malformed cfp8 format '{}': expected cfp8-e<E>m<M>-b<bias>, "
                    "e.g. cfp8-e4m3-b10",
                    name));
  }
  throw Error(fmt::format("unknown number format '{}'; known: {}", name, format_names()));
}

}  // namespace tern::num
