// Vectorized FP32 -> format encoder (Highway, runtime dispatch to the best
// SIMD target). Lane-for-lane the same integer algorithm as encode_with()
// in convert.cpp; tests/num/test_array.cpp checks them against each other.
// Written by hand because no library offers exact casts to these formats
// with subnormals, both overflow modes and seeded stochastic rounding
// (Highway 1.0's own BF16 demotion truncates).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "num/convert_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>

#include "num/encode_params.h"

HWY_BEFORE_NAMESPACE();
namespace tern::num::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DI = hn::ScalableTag<std::int32_t>;
using DU = hn::RebindToUnsigned<DI>;
using DF = hn::RebindToFloat<DI>;
using VI = hn::Vec<DI>;

struct Counts {
  std::size_t overflow = 0, underflow = 0, nan = 0, inf = 0;
};

// Fmix32 on every lane (see encode_params.h).
HWY_INLINE hn::Vec<DU> Fmix(hn::Vec<DU> h) {
  const DU du;
  h = hn::Xor(h, hn::ShiftRight<16>(h));
  h = hn::Mul(h, hn::Set(du, 0x85EBCA6Bu));
  h = hn::Xor(h, hn::ShiftRight<13>(h));
  h = hn::Mul(h, hn::Set(du, 0xC2B2AE35u));
  return hn::Xor(h, hn::ShiftRight<16>(h));
}

// Unsigned a < b on 32-bit lanes via the sign-flip trick.
HWY_INLINE hn::Mask<DI> LtU(hn::Vec<DU> a, hn::Vec<DU> b) {
  const DI di;
  const DU du;
  const auto flip = hn::Set(du, 0x80000000u);
  return hn::Lt(hn::BitCast(di, hn::Xor(a, flip)), hn::BitCast(di, hn::Xor(b, flip)));
}

template <bool kStochastic, bool kStats>
HWY_INLINE VI EncodeVec(const EncodeParams& p, VI bits, VI k, hn::Vec<DU> random, Counts& c) {
  const DI di;
  const DU du;
  const DF df;
  const VI a = hn::And(bits, hn::Set(di, 0x7FFFFFFF));
  const auto inf_bits = hn::Set(di, 0x7F800000);
  const auto is_nan = hn::Gt(a, inf_bits);
  const auto is_inf = hn::Eq(a, inf_bits);
  const auto is_zero = hn::Eq(a, hn::Zero(di));
  // Normalize FP32 subnormals exactly by scaling with 2^24.
  const auto sub = hn::Eq(hn::ShiftRight<23>(a), hn::Zero(di));
  const VI scaled = hn::BitCast(di, hn::Mul(hn::BitCast(df, a), hn::Set(df, 16777216.0f)));
  const VI a2 = hn::IfThenElse(sub, scaled, a);
  VI efe = hn::Sub(hn::ShiftRight<23>(a2), hn::IfThenElseZero(sub, hn::Set(di, 24)));
  efe = hn::Min(hn::Sub(efe, k), hn::Set(di, p.exp_limit));
  const VI sig = hn::Or(hn::And(a2, hn::Set(di, 0x7FFFFF)), hn::Set(di, 0x800000));
  const VI T = hn::Set(di, p.T);
  const VI s = hn::Add(hn::Set(di, 23 - p.m), hn::Max(hn::Zero(di), hn::Sub(T, efe)));
  const VI sc = hn::Min(s, hn::Set(di, 30));
  VI q = sig >> sc;
  const VI rem = hn::Sub(sig, q << sc);
  hn::Mask<DI> up;
  if constexpr (kStochastic) {
    // threshold = rem * 2^(32 - s), or rem / 2^(s - 32) once s > 32.
    const VI lo_shift = hn::Max(hn::Sub(hn::Set(di, 31), s), hn::Zero(di));
    const auto thr_lo = hn::ShiftLeft<1>(hn::BitCast(du, rem << lo_shift));
    const VI hi_shift =
        hn::Min(hn::Max(hn::Sub(s, hn::Set(di, 32)), hn::Zero(di)), hn::Set(di, 31));
    const auto thr_hi = hn::BitCast(du, sig >> hi_shift);
    const auto thr = hn::IfThenElse(hn::RebindMask(du, hn::Lt(s, hn::Set(di, 32))), thr_lo, thr_hi);
    up = LtU(random, thr);
  } else {
    (void)random;
    const VI rem2 = hn::ShiftLeft<1>(rem);
    const VI full = hn::Set(di, 1) << sc;
    const VI one = hn::Set(di, 1);
    up = hn::Or(hn::Gt(rem2, full), hn::And(hn::Eq(rem2, full), hn::Eq(hn::And(q, one), one)));
  }
  q = hn::Sub(q, hn::VecFromMask(di, up));  // mask lanes are -1
  const VI ebits = hn::Sub(hn::Max(efe, T), T) << hn::Set(di, p.m);
  VI code = hn::IfThenZeroElse(is_zero, hn::Add(ebits, q));
  const auto special = hn::Or(is_nan, is_inf);
  const auto ovf = hn::Gt(code, hn::Set(di, p.max_code));
  if constexpr (kStats) {
    c.overflow += hn::CountTrue(di, hn::AndNot(special, ovf));
    c.underflow +=
        hn::CountTrue(di, hn::AndNot(hn::Or(special, is_zero), hn::Eq(code, hn::Zero(di))));
    c.nan += hn::CountTrue(di, is_nan);
    c.inf += hn::CountTrue(di, is_inf);
  }
  code = hn::IfThenElse(hn::Or(ovf, is_inf), hn::Set(di, p.ovf_code), code);
  code = hn::IfThenElse(is_nan, hn::Set(di, p.nan_code), code);
  auto negative = hn::Lt(bits, hn::Zero(di));
  if (!p.nan_has_sign) negative = hn::AndNot(is_nan, negative);
  if (p.twos_complement) {
    code = hn::IfThenElse(negative, hn::Neg(code), code);
    return hn::And(code, hn::Set(di, static_cast<std::int32_t>(p.code_mask)));
  }
  return hn::Or(code, hn::IfThenElseZero(negative, hn::Set(di, 1 << p.sign_shift)));
}

template <typename OutT>
HWY_INLINE void StoreCodes(VI code, OutT* out) {
  if constexpr (sizeof(OutT) == 4) {
    const DU du;
    hn::StoreU(hn::BitCast(du, code), du, out);
  } else {
    const hn::Rebind<OutT, DI> dn;
    hn::StoreU(hn::DemoteTo(dn, code), dn, out);
  }
}

template <typename OutT, bool kStochastic, bool kStats>
void EncodeLoop(const EncodeParams& p, const float* in, OutT* out, std::size_t n,
                const std::int32_t* block_k, std::size_t block, std::uint64_t seed,
                std::uint64_t index_base, Counts& c) {
  const DI di;
  const DU du;
  const std::size_t N = hn::Lanes(di);
  HWY_ALIGN std::int32_t tail_in[hn::MaxLanes(di)];
  HWY_ALIGN OutT tail_out[hn::MaxLanes(di)];
  std::size_t i = 0;
  while (i < n) {
    // A run shares one block scale and one high index word.
    const std::size_t b = i / block;
    std::size_t run_end = std::min(n, (b + 1) * block);
    const std::uint64_t gi = index_base + i;
    const std::uint64_t next_hi = ((gi >> 32) + 1) << 32;
    if (next_hi - index_base < run_end) run_end = static_cast<std::size_t>(next_hi - index_base);
    const VI k = hn::Set(di, block_k ? block_k[b] : 0);
    const SrKey key = sr_key(seed, static_cast<std::uint32_t>(gi >> 32));
    const auto klo = hn::Set(du, key.lo);
    const auto khi = hn::Set(du, key.hi);
    auto random_for = [&](std::size_t at) {
      if constexpr (kStochastic) {
        const auto idx = hn::Iota(du, static_cast<std::uint32_t>(index_base + at));
        return Fmix(hn::Xor(Fmix(hn::Xor(idx, klo)), khi));
      } else {
        (void)at;
        return hn::Zero(du);
      }
    };
    for (; i + N <= run_end; i += N) {
      const VI bits = hn::BitCast(di, hn::LoadU(hn::RebindToFloat<DI>(), in + i));
      StoreCodes(EncodeVec<kStochastic, kStats>(p, bits, k, random_for(i), c), out + i);
    }
    if (i < run_end) {
      const std::size_t rest = run_end - i;
      std::memset(tail_in, 0, sizeof(tail_in));
      std::memcpy(tail_in, in + i, rest * sizeof(float));
      Counts tc;
      const VI code =
          EncodeVec<kStochastic, kStats>(p, hn::Load(di, tail_in), k, random_for(i), tc);
      StoreCodes(code, tail_out);
      std::memcpy(out + i, tail_out, rest * sizeof(OutT));
      // Padding lanes are zeros: they add nothing to the counts.
      c.overflow += tc.overflow;
      c.underflow += tc.underflow;
      c.nan += tc.nan;
      c.inf += tc.inf;
      i = run_end;
    }
  }
}

// Round to nearest even with a scale exponent per value (block 1): MX
// tiles encoded row by row, where a block is shorter than a vector.
template <typename OutT, bool kStats>
void EncodeLaneK(const EncodeParams& p, const float* in, OutT* out, std::size_t n,
                 const std::int32_t* k, Counts& c) {
  const DI di;
  const std::size_t N = hn::Lanes(di);
  const auto none = hn::Zero(hn::RebindToUnsigned<DI>());
  std::size_t i = 0;
  for (; i + N <= n; i += N) {
    const VI bits = hn::BitCast(di, hn::LoadU(hn::RebindToFloat<DI>(), in + i));
    StoreCodes(EncodeVec<false, kStats>(p, bits, hn::LoadU(di, k + i), none, c), out + i);
  }
  if (i < n) {
    HWY_ALIGN std::int32_t tail_in[hn::MaxLanes(di)] = {};
    HWY_ALIGN std::int32_t tail_k[hn::MaxLanes(di)] = {};
    HWY_ALIGN OutT tail_out[hn::MaxLanes(di)];
    std::memcpy(tail_in, in + i, (n - i) * sizeof(float));
    std::memcpy(tail_k, k + i, (n - i) * sizeof(std::int32_t));
    // Zero padding counts nothing.
    StoreCodes(EncodeVec<false, kStats>(p, hn::Load(di, tail_in), hn::Load(di, tail_k), none, c),
               tail_out);
    std::memcpy(out + i, tail_out, (n - i) * sizeof(OutT));
  }
}

// FP32 -> BF16 with RNE, the most common cast: BF16 shares FP32's exponent
// range, so rounding the dropped 16 bits (ties to even) is the whole job,
// FP32 subnormals included. Same results as EncodeVec (tested).
template <typename OutT, bool kStats>
void Bf16RneLoop(const EncodeParams& p, const float* in, OutT* out, std::size_t n, Counts& c) {
  const DI di;
  const DU du;
  const std::size_t N = hn::Lanes(di);
  const auto inf_bits = hn::Set(di, 0x7F800000);
  const auto rounder = hn::Set(du, 0x7FFFu);
  const auto one = hn::Set(du, 1u);
  const auto ovf_code = hn::Set(di, p.ovf_code);
  const auto nan_code = hn::Set(di, p.nan_code);
  auto one_vec = [&](VI bits, Counts& cc) {
    const auto ub = hn::BitCast(du, bits);
    const VI a = hn::And(bits, hn::Set(di, 0x7FFFFFFF));
    const auto is_nan = hn::Gt(a, inf_bits);
    const VI sign = hn::BitCast(di, hn::ShiftRight<16>(hn::And(ub, hn::Set(du, 0x80000000u))));
    const auto lsb = hn::And(hn::ShiftRight<16>(ub), one);
    const VI r = hn::BitCast(di, hn::ShiftRight<16>(hn::Add(hn::Add(ub, rounder), lsb)));
    const VI mag = hn::And(r, hn::Set(di, 0x7FFF));
    const auto ovf = hn::Eq(mag, hn::Set(di, 0x7F80));  // rounded up to Inf, or Inf input
    if constexpr (kStats) {
      const auto is_inf = hn::Eq(a, inf_bits);
      cc.overflow += hn::CountTrue(di, hn::AndNot(is_inf, hn::AndNot(is_nan, ovf)));
      cc.underflow += hn::CountTrue(
          di, hn::AndNot(hn::Or(is_nan, hn::Eq(a, hn::Zero(di))), hn::Eq(mag, hn::Zero(di))));
      cc.nan += hn::CountTrue(di, is_nan);
      cc.inf += hn::CountTrue(di, is_inf);
    }
    VI code = hn::IfThenElse(ovf, hn::Or(sign, ovf_code), r);
    return hn::IfThenElse(is_nan, hn::Or(sign, nan_code), code);
  };
  std::size_t i = 0;
  for (; i + N <= n; i += N) {
    StoreCodes(one_vec(hn::BitCast(di, hn::LoadU(hn::RebindToFloat<DI>(), in + i)), c), out + i);
  }
  if (i < n) {
    HWY_ALIGN std::int32_t tail_in[hn::MaxLanes(di)] = {};
    HWY_ALIGN OutT tail_out[hn::MaxLanes(di)];
    std::memcpy(tail_in, in + i, (n - i) * sizeof(float));
    StoreCodes(one_vec(hn::Load(di, tail_in), c), tail_out);  // zero padding counts nothing
    std::memcpy(out + i, tail_out, (n - i) * sizeof(OutT));
  }
}

template <typename OutT>
void EncodeImpl(const EncodeParams& p, const float* in, OutT* out, std::size_t n,
                const std::int32_t* block_k, std::size_t block, bool stochastic, std::uint64_t seed,
                std::uint64_t index_base, CastStats* stats) {
  Counts c;
  if (block == 0) block = n == 0 ? 1 : n;
  const bool bf16 = p.m == 7 && p.T == 1 && !p.twos_complement && sizeof(OutT) >= 2;
  if (block == 1 && block_k != nullptr && !stochastic) {
    if (stats)
      EncodeLaneK<OutT, true>(p, in, out, n, block_k, c);
    else
      EncodeLaneK<OutT, false>(p, in, out, n, block_k, c);
  } else if (bf16 && !stochastic && block_k == nullptr) {
    if (stats)
      Bf16RneLoop<OutT, true>(p, in, out, n, c);
    else
      Bf16RneLoop<OutT, false>(p, in, out, n, c);
  } else if (stochastic) {
    if (stats)
      EncodeLoop<OutT, true, true>(p, in, out, n, block_k, block, seed, index_base, c);
    else
      EncodeLoop<OutT, true, false>(p, in, out, n, block_k, block, seed, index_base, c);
  } else {
    if (stats)
      EncodeLoop<OutT, false, true>(p, in, out, n, block_k, block, seed, index_base, c);
    else
      EncodeLoop<OutT, false, false>(p, in, out, n, block_k, block, seed, index_base, c);
  }
  if (stats) {
    stats->overflow += c.overflow;
    stats->underflow += c.underflow;
    stats->nan += c.nan;
    stats->inf += c.inf;
  }
}

void Encode8(const EncodeParams& p, const float* in, std::uint8_t* out, std::size_t n,
             const std::int32_t* k, std::size_t block, bool sr, std::uint64_t seed,
             std::uint64_t base, CastStats* st) {
  EncodeImpl(p, in, out, n, k, block, sr, seed, base, st);
}
void Encode16(const EncodeParams& p, const float* in, std::uint16_t* out, std::size_t n,
              const std::int32_t* k, std::size_t block, bool sr, std::uint64_t seed,
              std::uint64_t base, CastStats* st) {
  EncodeImpl(p, in, out, n, k, block, sr, seed, base, st);
}
void Encode32(const EncodeParams& p, const float* in, std::uint32_t* out, std::size_t n,
              const std::int32_t* k, std::size_t block, bool sr, std::uint64_t seed,
              std::uint64_t base, CastStats* st) {
  EncodeImpl(p, in, out, n, k, block, sr, seed, base, st);
}

// out[i] = the largest |in[r * cols + i]| over the rows, as FP32 bits
// (NaN and Inf bits above every finite value).
void AbsMaxColumns(const float* in, std::size_t rows, std::size_t cols, std::uint32_t* out) {
  const DU du;
  const std::size_t N = hn::Lanes(du);
  const auto mask = hn::Set(du, 0x7FFFFFFFu);
  std::size_t i = 0;
  for (; i + N <= cols; i += N) {
    auto m = hn::Zero(du);
    for (std::size_t r = 0; r < rows; ++r) {
      const auto b = hn::BitCast(du, hn::LoadU(hn::RebindToFloat<DU>(), in + r * cols + i));
      m = hn::Max(m, hn::And(b, mask));
    }
    hn::StoreU(m, du, out + i);
  }
  for (; i < cols; ++i) {
    std::uint32_t m = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      std::uint32_t b;
      std::memcpy(&b, in + r * cols + i, sizeof b);
      m = std::max(m, b & 0x7FFFFFFFu);
    }
    out[i] = m;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace tern::num::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tern::num::detail {

HWY_EXPORT(Encode8);
HWY_EXPORT(Encode16);
HWY_EXPORT(Encode32);
HWY_EXPORT(AbsMaxColumns);

void abs_max_columns(const float* in, std::size_t rows, std::size_t cols, std::uint32_t* out) {
  HWY_DYNAMIC_DISPATCH(AbsMaxColumns)(in, rows, cols, out);
}

template <>
void encode_simd<std::uint8_t>(const EncodeParams& p, const float* in, std::uint8_t* out,
                               std::size_t n, const std::int32_t* k, std::size_t block, bool sr,
                               std::uint64_t seed, std::uint64_t base, CastStats* st) {
  HWY_DYNAMIC_DISPATCH(Encode8)(p, in, out, n, k, block, sr, seed, base, st);
}
template <>
void encode_simd<std::uint16_t>(const EncodeParams& p, const float* in, std::uint16_t* out,
                                std::size_t n, const std::int32_t* k, std::size_t block, bool sr,
                                std::uint64_t seed, std::uint64_t base, CastStats* st) {
  HWY_DYNAMIC_DISPATCH(Encode16)(p, in, out, n, k, block, sr, seed, base, st);
}
template <>
void encode_simd<std::uint32_t>(const EncodeParams& p, const float* in, std::uint32_t* out,
                                std::size_t n, const std::int32_t* k, std::size_t block, bool sr,
                                std::uint64_t seed, std::uint64_t base, CastStats* st) {
  HWY_DYNAMIC_DISPATCH(Encode32)(p, in, out, n, k, block, sr, seed, base, st);
}

}  // namespace tern::num::detail
#endif
