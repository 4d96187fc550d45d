// Scalar reference conversions and the array entry points. The scalar
// encoder is the readable statement of tern's rounding; the vectorized one
// in convert_simd.cpp must match it bit for bit (tests/num/test_array.cpp),
// and this one matches MPFR (tests/num/test_encode_oracle.cpp).
#include "num/convert.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "num/encode_params.h"
#include "util/error.h"

namespace tern::num {

using detail::EncodeParams;

std::uint32_t sr_random(std::uint64_t seed, std::uint64_t index) {
  return detail::sr_word(detail::sr_key(seed, static_cast<std::uint32_t>(index >> 32)),
                         static_cast<std::uint32_t>(index));
}

namespace {

// Whether to round the kept part up, given `s` dropped low bits of `sig`.
bool round_up(std::uint32_t sig, std::int64_t s, std::uint64_t q, Rounding r,
              std::uint32_t random) {
  if (s == 0) return false;
  const std::uint64_t rem = s >= 32 ? sig : (sig & ((std::uint64_t{1} << s) - 1));
  if (r == Rounding::nearest_even) {
    if (s >= 25) return false;  // sig < 2^24 <= half quantum
    const std::uint64_t half = std::uint64_t{1} << (s - 1);
    return rem > half || (rem == half && (q & 1u));
  }
  // Stochastic: P(up) = rem / 2^s, realized as random < rem * 2^(32 - s).
  const std::uint64_t thr = s <= 32 ? (rem << (32 - s)) : (s - 32 >= 32 ? 0 : rem >> (s - 32));
  return random < thr;
}

std::uint32_t encode_e8m0(float x, Rounding r, Overflow ovf, std::uint32_t random, int scale_exp,
                          CastStats* stats) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t a = bits & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {
    if (stats) ++stats->nan;
    return 0xFF;
  }
  if (a == 0) return 0x00;      // no zero in E8M0: the smallest scale, 2^-127
  if (bits >> 31) return 0xFF;  // negative: not representable, NaN
  if (a == 0x7F800000u) {
    if (stats) ++stats->inf;
    return ovf == Overflow::saturate ? 0xFE : 0xFF;
  }
  int e;
  std::uint32_t sig;
  detail::split_fp32(a, e, sig);
  const std::int64_t efe = std::int64_t{e} - scale_exp;
  // m = 0: keep only the leading one; 23 bits are dropped.
  const bool up = round_up(sig, 23, 1, r, random);
  const std::int64_t code = std::max<std::int64_t>(0, efe + (up ? 1 : 0));
  if (code > 0xFE) {
    if (stats) ++stats->overflow;
    return ovf == Overflow::saturate ? 0xFE : 0xFF;
  }
  return static_cast<std::uint32_t>(code);
}

std::uint32_t encode_with(const EncodeParams& p, float x, Rounding r, std::uint32_t random,
                          int scale_exp, CastStats* stats) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t sign = bits >> 31;
  const std::uint32_t a = bits & 0x7FFFFFFFu;
  std::int64_t mag;
  bool signed_result = true;
  if (a > 0x7F800000u) {
    if (stats) ++stats->nan;
    mag = p.nan_code;
    signed_result = p.nan_has_sign;
  } else if (a == 0x7F800000u) {
    if (stats) ++stats->inf;
    mag = p.ovf_code;
  } else if (a == 0) {
    mag = 0;
  } else {
    int e;
    std::uint32_t sig;
    detail::split_fp32(a, e, sig);
    const std::int64_t efe = std::min<std::int64_t>(std::int64_t{e} - scale_exp, p.exp_limit);
    // Dropped bits: the target quantum is 2^(max(E, emin) - m).
    const std::int64_t s = 23 - p.m + std::max<std::int64_t>(0, p.T - efe);
    std::uint64_t q = s >= 32 ? 0 : (sig >> s);
    if (round_up(sig, s, q, r, random)) ++q;
    // Biased target exponent field and significand add up with the carry
    // of a rounding overflow propagating into the exponent.
    mag = ((std::max<std::int64_t>(efe, p.T) - p.T) << p.m) + static_cast<std::int64_t>(q);
    if (mag > p.max_code) {
      if (stats) ++stats->overflow;
      mag = p.ovf_code;
    } else if (mag == 0 && stats) {
      ++stats->underflow;
    }
  }
  if (p.twos_complement) {
    const std::int64_t v = (sign && signed_result) ? -mag : mag;
    return static_cast<std::uint32_t>(v) & p.code_mask;
  }
  return static_cast<std::uint32_t>(mag) | ((sign && signed_result) ? (1u << p.sign_shift) : 0u);
}

}  // namespace

std::uint32_t encode(const Format& f, float x, Rounding rounding, Overflow overflow,
                     std::uint32_t random, int scale_exp, CastStats* stats) {
  if (f.encoding == Encoding::e8m0) {
    return encode_e8m0(x, rounding, overflow, random, scale_exp, stats);
  }
  if (f.bits == 32 && scale_exp == 0) {  // FP32 -> FP32 is the identity
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
    if (stats) {
      const std::uint32_t a = bits & 0x7FFFFFFFu;
      stats->nan += a > 0x7F800000u;
      stats->inf += a == 0x7F800000u;
    }
    return bits;
  }
  return encode_with(detail::make_params(f, overflow), x, rounding, random, scale_exp, stats);
}

float decode(const Format& f, std::uint32_t code) {
  code &= f.code_mask();
  switch (f.encoding) {
    case Encoding::e8m0:
      if (code == 0xFF) return std::numeric_limits<float>::quiet_NaN();
      return std::ldexp(1.0f, static_cast<int>(code) - f.bias);
    case Encoding::int_fixed: {
      // Sign-extend the two's complement code.
      const std::int32_t k = static_cast<std::int32_t>(code << (32 - f.bits)) >> (32 - f.bits);
      return std::ldexp(static_cast<float>(k), -f.man_bits);
    }
    default:
      break;
  }
  if (f.bits == 32) return std::bit_cast<float>(code);
  const std::uint32_t sign = code >> (f.bits - 1);
  const std::uint32_t mag = code & (f.code_mask() >> 1);
  const std::uint32_t exp_all = (1u << f.exp_bits) - 1u;
  const std::uint32_t e = mag >> f.man_bits;
  const std::uint32_t man = mag & ((1u << f.man_bits) - 1u);
  float v;
  if (f.encoding == Encoding::ieee && e == exp_all) {
    v = man == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (f.encoding == Encoding::nan_only && mag == (f.code_mask() >> 1)) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<float>(man), f.emin() - f.man_bits);
  } else {
    v = std::ldexp(static_cast<float>((1u << f.man_bits) | man),
                   static_cast<int>(e) - f.bias - f.man_bits);
  }
  return sign ? -v : v;
}

// ---------------------------------------------------------------- arrays

namespace {

template <typename OutT>
CastStats encode_array_impl(const Format& f, std::span<const float> in, std::span<OutT> out,
                            const CastOptions& opt, std::uint64_t index_base, bool count = true) {
  if (in.size() != out.size()) {
    throw Error(fmt::format("encode_array: {} inputs but {} outputs", in.size(), out.size()));
  }
  if (f.bits > static_cast<int>(8 * sizeof(OutT))) {
    throw Error(fmt::format("encode_array: {} codes are {} bits, the output holds only {}", f.name,
                            f.bits, 8 * sizeof(OutT)));
  }
  CastStats st;
  const bool sr = opt.rounding == Rounding::stochastic;
  if (f.encoding == Encoding::e8m0 || f.bits == 32) {
    // Scales and identity casts are rare and cheap: the scalar path.
    for (std::size_t i = 0; i < in.size(); ++i) {
      const std::uint32_t r = sr ? sr_random(opt.seed, index_base + i) : 0;
      out[i] = static_cast<OutT>(encode(f, in[i], opt.rounding, opt.overflow, r, 0, &st));
    }
    return st;
  }
  detail::encode_simd<OutT>(detail::make_params(f, opt.overflow), in.data(), out.data(), in.size(),
                            nullptr, in.size(), sr, opt.seed, index_base, count ? &st : nullptr);
  return st;
}

template <typename InT>
void decode_array_impl(const Format& f, std::span<const InT> in, std::span<float> out) {
  if (in.size() != out.size()) {
    throw Error(fmt::format("decode_array: {} codes but {} outputs", in.size(), out.size()));
  }
  const std::size_t n = in.size();
  if (f.encoding == Encoding::ieee && f.exp_bits == 8 && f.bits < 32) {
    // BF16 and TF32 are FP32 with the low mantissa bits cut: a shift.
    const int sh = 32 - f.bits;
    for (std::size_t i = 0; i < n; ++i) {
      out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(in[i]) << sh);
    }
    return;
  }
  if (f.bits == 32) {
    for (std::size_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(std::uint32_t(in[i]));
    return;
  }
  if (f.bits <= 8 || (f.bits <= 16 && n >= 4096)) {
    // Table lookup; the table is exact by construction from decode().
    std::vector<float> lut(std::size_t{1} << f.bits);
    for (std::size_t c = 0; c < lut.size(); ++c) lut[c] = decode(f, static_cast<std::uint32_t>(c));
    const std::uint32_t mask = f.code_mask();
    for (std::size_t i = 0; i < n; ++i) out[i] = lut[static_cast<std::uint32_t>(in[i]) & mask];
    return;
  }
  for (std::size_t i = 0; i < n; ++i) out[i] = decode(f, in[i]);
}

}  // namespace

void encode_codes(const Format& f, std::span<const float> in, std::span<std::uint8_t> out,
                  const CastOptions& opt, std::uint64_t index_base) {
  encode_array_impl(f, in, out, opt, index_base, false);
}
void encode_codes(const Format& f, std::span<const float> in, std::span<std::uint16_t> out,
                  const CastOptions& opt, std::uint64_t index_base) {
  encode_array_impl(f, in, out, opt, index_base, false);
}
void encode_codes(const Format& f, std::span<const float> in, std::span<std::uint32_t> out,
                  const CastOptions& opt, std::uint64_t index_base) {
  encode_array_impl(f, in, out, opt, index_base, false);
}
CastStats encode_array(const Format& f, std::span<const float> in, std::span<std::uint8_t> out,
                       const CastOptions& opt, std::uint64_t index_base) {
  return encode_array_impl(f, in, out, opt, index_base);
}
CastStats encode_array(const Format& f, std::span<const float> in, std::span<std::uint16_t> out,
                       const CastOptions& opt, std::uint64_t index_base) {
  return encode_array_impl(f, in, out, opt, index_base);
}
CastStats encode_array(const Format& f, std::span<const float> in, std::span<std::uint32_t> out,
                       const CastOptions& opt, std::uint64_t index_base) {
  return encode_array_impl(f, in, out, opt, index_base);
}

void decode_array(const Format& f, std::span<const std::uint8_t> in, std::span<float> out) {
  decode_array_impl(f, in, out);
}
void decode_array(const Format& f, std::span<const std::uint16_t> in, std::span<float> out) {
  decode_array_impl(f, in, out);
}
void decode_array(const Format& f, std::span<const std::uint32_t> in, std::span<float> out) {
  decode_array_impl(f, in, out);
}

CastStats round_array(const Format& f, std::span<float> data, const CastOptions& opt,
                      std::uint64_t index_base) {
  CastStats st;
  if (f.bits == 32) {  // identity: only count the specials
    for (float x : data) {
      const std::uint32_t a = std::bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu;
      st.nan += a > 0x7F800000u;
      st.inf += a == 0x7F800000u;
    }
    return st;
  }
  constexpr std::size_t kChunk = 2048;
  std::uint32_t codes[kChunk];
  for (std::size_t i = 0; i < data.size(); i += kChunk) {
    const std::size_t n = std::min(kChunk, data.size() - i);
    st += encode_array(f, data.subspan(i, n), std::span<std::uint32_t>(codes, n), opt,
                       index_base + i);
    decode_array(f, std::span<const std::uint32_t>(codes, n), data.subspan(i, n));
  }
  return st;
}

}  // namespace tern::num
