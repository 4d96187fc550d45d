// Number formats of Trainium-class hardware, described as data.
//
// A Format says how a code of `bits` bits maps to a real number. All
// formats tern needs are sign-magnitude binary floats (possibly without Inf
// or NaN), the E8M0 power-of-two scale, or the MXINT8 fixed-point element;
// see docs/numerics.md and docs/reference/numerics.md section 1.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace tern::num {

// How the all-ones exponent field (and the rest) is interpreted.
enum class Encoding : std::uint8_t {
  ieee,       // exponent all ones: mantissa 0 is Inf, otherwise NaN (FP32..FP16, E5M2, legacy E4M3,
              // E3M4)
  nan_only,   // no Inf; only S.1..1.1..1 is NaN (OCP E4M3 "e4m3fn")
  finite,     // every code is a finite number (FP6 E3M2/E2M3, FP4 E2M1)
  e8m0,       // unsigned 2^(code - 127); 0xFF is NaN; no zero (MX scale)
  int_fixed,  // two's complement integer k, value k * 2^-man_bits (MXINT8: k/64, |k| <= 127)
};

struct Format {
  std::string name;         // canonical name, accepted by parse_format()
  std::string description;  // one line for tables
  int bits = 0;             // storage width of one code
  int exp_bits = 0;         // exponent field width (0 for int_fixed)
  int man_bits = 0;         // mantissa field width (fraction bits for int_fixed)
  int bias = 0;             // exponent bias
  Encoding encoding = Encoding::ieee;

  bool has_inf() const { return encoding == Encoding::ieee; }
  bool has_nan() const {
    return encoding == Encoding::ieee || encoding == Encoding::nan_only ||
           encoding == Encoding::e8m0;
  }
  bool has_sign() const { return encoding != Encoding::e8m0; }
  bool has_subnormals() const {
    return encoding != Encoding::e8m0 && encoding != Encoding::int_fixed;
  }
  std::uint32_t code_mask() const { return bits >= 32 ? 0xFFFFFFFFu : ((1u << bits) - 1u); }
  std::uint32_t sign_bit() const { return has_sign() ? (1u << (bits - 1)) : 0u; }
  // Unbiased exponent of the smallest normal number (1 - bias).
  int emin() const { return 1 - bias; }
  // Largest finite magnitude code (sign bit clear).
  std::uint32_t max_finite_code() const;
  // Canonical NaN magnitude code, or -1 when the format has no NaN.
  std::int64_t nan_code() const;
  // Inf magnitude code, or -1 when the format has no Inf.
  std::int64_t inf_code() const;
  double max_finite() const;
  double min_normal() const;     // smallest positive normal (E8M0: 2^-127)
  double min_subnormal() const;  // smallest positive value
};

enum class FormatId : std::uint8_t {
  fp32,
  tf32,
  bf16,
  fp16,
  e4m3,         // OCP FP8 E4M3 ("float8_e4m3fn"), Trn3
  e5m2,         // OCP FP8 E5M2
  e4m3_legacy,  // IEEE-like FP8 E4M3 with max 240 (Trn1/Trn2 "fp8_e4m3")
  e3m4,         // Trn1 cFP8 E3M4
  e3m2,         // OCP FP6 E3M2
  e2m3,         // OCP FP6 E2M3
  e2m1,         // OCP FP4 E2M1
  e8m0,         // OCP MX scale
  mxint8,       // OCP MXINT8 element
};

const Format& format(FormatId id);
// Every built-in format, in FormatId order.
std::span<const Format> builtin_formats();

// A configurable-bias FP8 ("cFP8" of NeuronCore-v3): IEEE-like encoding with
// the given field widths (exp_bits + man_bits == 7) and exponent bias.
// Named "cfp8-e<E>m<M>-b<bias>". Throws tern::Error on impossible fields.
Format cfp8(int exp_bits, int man_bits, int bias);

// Looks a format up by canonical name or alias (e.g. "float8_e4m3fn",
// "fp4"), or parses "cfp8-e4m3-b10". Throws tern::Error listing the names
// when unknown.
Format parse_format(std::string_view name);

// Comma-separated canonical names, for messages and --help.
std::string format_names();

}  // namespace tern::num
