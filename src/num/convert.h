// FP32 <-> every format, bit-exact.
//
// Rounding (see docs/numerics.md for the exact algorithms):
//  - nearest_even: IEEE round-to-nearest, ties to even, done once on the
//    exact FP32 value (no double rounding), subnormals kept.
//  - stochastic: round up with probability (dropped part / quantum), driven
//    by a 32-bit random word per element: round up iff r < threshold, where
//    threshold = dropped bits scaled to 32 bits. Exactly unbiased whenever
//    at most 32 bits are dropped; below that the bias is < 2^-32 quantum.
//    The word for element i of a stream is sr_random(seed, i), so results
//    are reproducible and independent of how the work is split.
// Overflow (|value| beyond max finite after rounding, or +-Inf input):
//  - saturate: +-max finite (NaN stays NaN);
//  - non_saturating: +-Inf where the format has Inf, else NaN where it has
//    NaN, else +-max finite (FP6/FP4/MXINT8 always clamp).
// NaN input: the format's canonical NaN (sign kept); formats without NaN
// (FP6, FP4, MXINT8) encode +0 and the cast counts it in CastStats::nan.
#pragma once

#include <cstdint>
#include <span>

#include "num/format.h"

namespace tern::num {

enum class Rounding : std::uint8_t { nearest_even, stochastic };
enum class Overflow : std::uint8_t { saturate, non_saturating };

struct CastOptions {
  Rounding rounding = Rounding::nearest_even;
  Overflow overflow = Overflow::non_saturating;
  std::uint64_t seed = 0;  // stochastic rounding stream seed
};

// What happened to the values of one cast (for numeric health monitors).
struct CastStats {
  std::uint64_t overflow = 0;   // finite inputs beyond max finite (saturated or sent to Inf/NaN)
  std::uint64_t underflow = 0;  // nonzero finite inputs that became zero
  std::uint64_t nan = 0;        // NaN inputs
  std::uint64_t inf = 0;        // +-Inf inputs
  CastStats& operator+=(const CastStats& o) {
    overflow += o.overflow;
    underflow += o.underflow;
    nan += o.nan;
    inf += o.inf;
    return *this;
  }
};

// The random word stochastic rounding uses for element `index` of the
// stream `seed` (counter-based, see docs/numerics.md).
std::uint32_t sr_random(std::uint64_t seed, std::uint64_t index);

// Encodes x * 2^-scale_exp (exactly, before the single rounding) into `f`.
// `random` is used only by stochastic rounding. Returns the code in the low
// f.bits bits. scale_exp = 0 is a plain cast; MX quantization uses the
// block scale exponent so that no intermediate FP32 rounding happens.
std::uint32_t encode(const Format& f, float x, Rounding rounding = Rounding::nearest_even,
                     Overflow overflow = Overflow::non_saturating, std::uint32_t random = 0,
                     int scale_exp = 0, CastStats* stats = nullptr);

// The exact value of `code` (low f.bits bits used) as FP32. Every code of
// every format is exactly representable in FP32.
float decode(const Format& f, std::uint32_t code);

// x rounded to the nearest value of `f` and back to FP32.
inline float round_to(const Format& f, float x, Rounding r = Rounding::nearest_even,
                      Overflow o = Overflow::non_saturating, std::uint32_t random = 0) {
  return decode(f, encode(f, x, r, o, random));
}

// Array casts (vectorized; results identical to the scalar functions above,
// element i using sr_random(opt.seed, index_base + i)). The code container
// must be at least as wide as the format: uint8 for <= 8 bits, uint16 for
// <= 16 bits, uint32 for TF32/FP32. Throws tern::Error on a size mismatch
// or a too-narrow container.
CastStats encode_array(const Format& f, std::span<const float> in, std::span<std::uint8_t> out,
                       const CastOptions& opt = {}, std::uint64_t index_base = 0);
CastStats encode_array(const Format& f, std::span<const float> in, std::span<std::uint16_t> out,
                       const CastOptions& opt = {}, std::uint64_t index_base = 0);
CastStats encode_array(const Format& f, std::span<const float> in, std::span<std::uint32_t> out,
                       const CastOptions& opt = {}, std::uint64_t index_base = 0);

// encode_array without the counts (the simulator's row writes, which
// report none: counting was a fifth of an encode).
void encode_codes(const Format& f, std::span<const float> in, std::span<std::uint8_t> out,
                  const CastOptions& opt = {}, std::uint64_t index_base = 0);
void encode_codes(const Format& f, std::span<const float> in, std::span<std::uint16_t> out,
                  const CastOptions& opt = {}, std::uint64_t index_base = 0);
void encode_codes(const Format& f, std::span<const float> in, std::span<std::uint32_t> out,
                  const CastOptions& opt = {}, std::uint64_t index_base = 0);

void decode_array(const Format& f, std::span<const std::uint8_t> in, std::span<float> out);
void decode_array(const Format& f, std::span<const std::uint16_t> in, std::span<float> out);
void decode_array(const Format& f, std::span<const std::uint32_t> in, std::span<float> out);

// In-place round trip FP32 -> f -> FP32 (what an engine's output cast does).
CastStats round_array(const Format& f, std::span<float> data, const CastOptions& opt = {},
                      std::uint64_t index_base = 0);

}  // namespace tern::num
