// Highway kernels for codec.cpp's hottest reads (the MX matmul kernels'
// BF16 operands): see codec_simd.h.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "sim/codec_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <bit>
#include <cstring>

#include "sim/codec_simd.h"

HWY_BEFORE_NAMESPACE();
namespace tern::sim {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes of FP32 from as many BF16 codes at p: the code in the high half.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadBf16(DF df, const std::uint8_t* p) {
  const hn::Rebind<std::uint16_t, DF> d16;
  const hn::RebindToUnsigned<DF> d32;
  const auto h = hn::LoadU(d16, reinterpret_cast<const std::uint16_t*>(p));
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(d32, h)));
}

float ScalarBf16(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return std::bit_cast<float>(std::uint32_t{h} << 16);
}

void DecodeBf16Run(const std::uint8_t* p, std::size_t n, float* out) {
  const hn::ScalableTag<float> df;
  const std::size_t L = hn::Lanes(df);
  std::size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(LoadBf16(df, p + 2 * i), df, out + i);
  for (; i < n; ++i) out[i] = ScalarBf16(p + 2 * i);
}

void Decode4Columns(bool bf16, const std::uint8_t* p, std::size_t per, std::int64_t stride,
                    float* out) {
  const hn::ScalableTag<float> df;
  const std::size_t L = hn::Lanes(df);
  const std::uint8_t* r[4] = {p, p + stride, p + 2 * stride, p + 3 * stride};
  const std::size_t sz = bf16 ? 2 : 4;
  auto load = [&](int j, std::size_t i) {
    return bf16 ? LoadBf16(df, r[j] + sz * i)
                : hn::LoadU(df, reinterpret_cast<const float*>(r[j] + sz * i));
  };
  std::size_t i = 0;
  for (; i + L <= per; i += L)
    hn::StoreInterleaved4(load(0, i), load(1, i), load(2, i), load(3, i), df, out + 4 * i);
  for (; i < per; ++i)
    for (int j = 0; j < 4; ++j) {
      if (bf16) {
        out[4 * i + static_cast<std::size_t>(j)] = ScalarBf16(r[j] + sz * i);
      } else {
        std::memcpy(out + 4 * i + static_cast<std::size_t>(j), r[j] + sz * i, 4);
      }
    }
}

void DecodeMx8Row(const std::uint8_t* codes, const std::uint8_t* scales, std::size_t F,
                  const float* table, float* out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<std::uint8_t, decltype(du)> d8;
  const std::size_t L = hn::Lanes(df);
  const auto byte = hn::Set(du, 0xFFu);
  std::size_t f = 0;
  for (; f + L <= F; f += L) {
    const auto x = hn::LoadU(du, reinterpret_cast<const std::uint32_t*>(codes + 4 * f));
    const auto row = hn::ShiftLeft<8>(hn::PromoteTo(du, hn::LoadU(d8, scales + f)));
    auto at = [&](auto v) { return hn::BitCast(di, hn::Or(row, hn::And(v, byte))); };
    hn::StoreU(hn::GatherIndex(df, table, at(x)), df, out + f);
    hn::StoreU(hn::GatherIndex(df, table, at(hn::ShiftRight<8>(x))), df, out + F + f);
    hn::StoreU(hn::GatherIndex(df, table, at(hn::ShiftRight<16>(x))), df, out + 2 * F + f);
    hn::StoreU(hn::GatherIndex(df, table, at(hn::ShiftRight<24>(x))), df, out + 3 * F + f);
  }
  for (; f < F; ++f)
    for (std::size_t j = 0; j < 4; ++j)
      out[j * F + f] = table[std::size_t{scales[f]} * 256 + codes[4 * f + j]];
}

}  // namespace HWY_NAMESPACE
}  // namespace tern::sim
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tern::sim {
HWY_EXPORT(DecodeBf16Run);
HWY_EXPORT(Decode4Columns);
HWY_EXPORT(DecodeMx8Row);
void decode_mx8_row(const std::uint8_t* codes, const std::uint8_t* scales, std::size_t F,
                    const float* table, float* out) {
  HWY_DYNAMIC_DISPATCH(DecodeMx8Row)(codes, scales, F, table, out);
}
void decode_bf16_run(const std::uint8_t* p, std::size_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(DecodeBf16Run)(p, n, out);
}
void decode_4_columns(bool bf16, const std::uint8_t* p, std::size_t per, std::int64_t stride,
                      float* out) {
  HWY_DYNAMIC_DISPATCH(Decode4Columns)(bf16, p, per, stride, out);
}
}  // namespace tern::sim
#endif
