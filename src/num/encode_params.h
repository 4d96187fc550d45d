// Private to num: the integer description of a target format that both the
// scalar reference encoder (convert.cpp) and the vectorized one
// (convert_simd.cpp) run on, so the two cannot drift apart.
#pragma once

#include <bit>
#include <cstdint>

#include "num/convert.h"
#include "num/format.h"

namespace tern::num::detail {

struct EncodeParams {
  std::int32_t m = 0;           // target mantissa (fraction) bits
  std::int32_t T = 0;           // biased FP32 exponent of the target's smallest normal: emin + 127
  std::int32_t exp_limit = 0;   // exponents above this surely overflow; clamp keeps shifts in range
  std::int32_t max_code = 0;    // largest finite magnitude code
  std::int32_t ovf_code = 0;    // magnitude code for overflow / Inf under the chosen mode
  std::int32_t nan_code = 0;    // magnitude code for NaN (0 when the format has no NaN)
  std::int32_t sign_shift = 0;  // position of the sign bit
  std::uint32_t code_mask = 0;
  bool nan_has_sign = false;     // NaN keeps the input's sign (formats that have NaN)
  bool twos_complement = false;  // MXINT8: sign-magnitude result converted to two's complement
};

inline EncodeParams make_params(const Format& f, Overflow ovf) {
  EncodeParams p;
  p.m = f.man_bits;
  // MXINT8 k/64 is exactly the magnitude set of an E1M6 float with bias 1
  // (subnormals k/64 below 1, then 1 + j/64), so it shares the float path.
  const int bias = f.encoding == Encoding::int_fixed ? 1 : f.bias;
  const int exp_bits = f.encoding == Encoding::int_fixed ? 1 : f.exp_bits;
  p.T = 127 + 1 - bias;
  p.exp_limit = p.T + (1 << exp_bits) + 1;
  p.max_code = static_cast<std::int32_t>(f.max_finite_code());
  const std::int64_t inf = f.inf_code(), nan = f.nan_code();
  if (ovf == Overflow::saturate) {
    p.ovf_code = p.max_code;
  } else {
    p.ovf_code = static_cast<std::int32_t>(inf >= 0 ? inf : nan >= 0 ? nan : p.max_code);
  }
  p.nan_code = static_cast<std::int32_t>(nan >= 0 ? nan : 0);
  p.nan_has_sign = nan >= 0;
  p.sign_shift = f.bits - 1;
  p.code_mask = f.code_mask();
  p.twos_complement = f.encoding == Encoding::int_fixed;
  return p;
}

// Nonzero finite FP32 magnitude bits -> biased exponent and 24-bit
// significand with its leading one, normalizing FP32 subnormals (whose
// exponent then goes below 1).
inline void split_fp32(std::uint32_t a, int& efe, std::uint32_t& sig) {
  efe = static_cast<int>(a >> 23);
  sig = a & 0x7FFFFFu;
  if (efe == 0) {
    const int lz = std::countl_zero(sig) - 8;
    sig <<= lz;
    efe = 1 - lz;
  } else {
    sig |= 0x800000u;
  }
}

// MurmurHash3's 32-bit finalizer (a bijection with good avalanche).
constexpr std::uint32_t fmix32(std::uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

// One SplitMix64 step from state `x` (Steele, Lea, Flood 2014).
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Key of a stochastic-rounding stream: (low word, high word mixed with the
// high half of the element index).
struct SrKey {
  std::uint32_t lo, hi;
};
constexpr SrKey sr_key(std::uint64_t seed, std::uint32_t index_hi) {
  const std::uint64_t k = splitmix64(seed);
  return {static_cast<std::uint32_t>(k),
          static_cast<std::uint32_t>(k >> 32) + index_hi * 0x9E3779B9u};
}
constexpr std::uint32_t sr_word(SrKey key, std::uint32_t index_lo) {
  return fmix32(fmix32(index_lo ^ key.lo) ^ key.hi);
}

// Vectorized encoder (convert_simd.cpp). Encodes n floats; element i uses
// scale exponent block_k[i / block] (block_k may be null: all zero) and, for
// stochastic rounding, sr_word(sr_key(seed, hi(index_base+i)), lo(index_base+i)).
// `out` points to n codes of OutT.
template <typename OutT>
void encode_simd(const EncodeParams& p, const float* in, OutT* out, std::size_t n,
                 const std::int32_t* block_k, std::size_t block, bool stochastic,
                 std::uint64_t seed, std::uint64_t index_base, CastStats* stats);

// out[i] = max over rows r of |in[r * cols + i]|'s FP32 bits (sign cleared).
void abs_max_columns(const float* in, std::size_t rows, std::size_t cols, std::uint32_t* out);

}  // namespace tern::num::detail
