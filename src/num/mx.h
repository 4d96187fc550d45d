// OCP Microscaling (MX) block quantization: blocks of 32 elements share one
// E8M0 scale X; value_i = X * P_i. The scale is a policy (they give
// different bits; see docs/reference/numerics.md section 3 and
// docs/numerics.md):
//   ocp-floor  k = floor(log2 amax) - emax_elem, elements saturate (OCP 6.3)
//   rceil      k = ceil(log2(amax / max_elem)), never saturates (NVIDIA, MXFP8 recipe)
//   trn3       k = floor(log2 amax) - (emax_elem - 1) for FP8; FP4 as ocp-floor
//              (Trainium3 QuantizeMX); not defined for MXFP6/MXINT8
// floor(log2 amax) comes from the exponent bits, never from a float log2.
// Edge cases: all-zero block -> scale 0x00 and zero elements; k < -127 ->
// clamped to -127 (elements may flush); k > 127, or a NaN/Inf in the block
// -> NaN scale 0xFF and zero element codes (the whole block reads as NaN).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "num/convert.h"
#include "num/format.h"

namespace tern::num {

constexpr std::size_t kMxBlock = 32;

enum class ScalePolicy : std::uint8_t { ocp_floor, rceil, trn3 };

struct MxFormat {
  std::string name;  // "mxfp8-e4m3", ...
  FormatId element;  // element format
  int emax_elem;     // exponent of the element's largest power of two (OCP table)
};

enum class MxId : std::uint8_t { mxfp8_e4m3, mxfp8_e5m2, mxfp6_e3m2, mxfp6_e2m3, mxfp4, mxint8 };

const MxFormat& mx_format(MxId id);
std::span<const MxFormat> mx_formats();
// By name ("mxfp8-e4m3", "mxfp8_e4m3", "mxfp4", ...). Throws tern::Error.
const MxFormat& parse_mx_format(std::string_view name);
ScalePolicy parse_scale_policy(std::string_view name);
std::string_view policy_name(ScalePolicy p);

// The shared scale exponent k (X = 2^k) of one block under `policy`, or
// nullopt-like sentinel kMxNanScale when the block holds NaN/Inf or k > 127.
constexpr int kMxNanScale = 1 << 20;
int mx_scale_exponent(const MxFormat& f, ScalePolicy policy, std::span<const float> block);

// A policy reduced to integers (what a kernel needs to compute scales from
// the exponent and fraction bits of amax): k = floor(log2 amax) - offset,
// plus 1 under rceil when amax's 23-bit fraction exceeds max_frac (that of
// the element's largest finite value). Throws NotSupported for trn3 with
// MXFP6/MXINT8.
struct MxScaleRule {
  int offset = 0;
  bool rceil = false;
  std::uint32_t max_frac = 0;
};
MxScaleRule mx_scale_rule(const MxFormat& f, ScalePolicy policy);

// E8M0 code of a scale exponent from mx_scale_exponent (clamped at -127).
std::uint8_t mx_scale_code(int k);

// Quantizes `in` (size a multiple of 32; blocks are consecutive runs of 32)
// into one element code per byte and one E8M0 scale per block. Elements are
// encoded from the exact value x * 2^-k in one rounding (RNE or stochastic
// per opt; opt.overflow is ignored: elements always saturate). Throws
// tern::Error on sizes; NotSupported for trn3 with MXFP6/MXINT8.
void mx_quantize(const MxFormat& f, ScalePolicy policy, std::span<const float> in,
                 std::span<std::uint8_t> elements, std::span<std::uint8_t> scales,
                 const CastOptions& opt = {}, std::uint64_t index_base = 0);

// Quantizes a [rows][cols] FP32 tile (row-major) whose block c holds the
// rows x w values of columns [c w, (c + 1) w), w = 32 / rows: Trainium3's
// QuantizeMX shape (8 partitions x 4 values). Codes land in the tile's own
// layout (one byte per value, [rows][cols]), one E8M0 scale per block. The
// bits equal mx_quantize on the blocks gathered in order (row by row inside
// a block), including stochastic rounding's index (index_base + the value's
// position in that order). Throws tern::Error on shapes.
void mx_quantize_tile(const MxFormat& f, ScalePolicy policy, std::span<const float> in,
                      std::size_t rows, std::span<std::uint8_t> elements,
                      std::span<std::uint8_t> scales, const CastOptions& opt = {},
                      std::uint64_t index_base = 0);

// v * 2^e rounded to FP32 as std::ldexp does: a multiplication by the power
// of two when 2^e is a normal float (the exact product rounded once: the
// same bits), std::ldexp beyond (a fifth of an MX step's time was ldexp).
inline float times_pow2(float v, int e) {
  if (e >= -126 && e <= 127)
    return v * std::bit_cast<float>(static_cast<std::uint32_t>(e + 127) << 23);
  return std::ldexp(v, e);
}

// value_i = 2^k * P_i, rounded once to FP32; NaN scale gives NaN.
void mx_dequantize(const MxFormat& f, std::span<const std::uint8_t> elements,
                   std::span<const std::uint8_t> scales, std::span<float> out);

}  // namespace tern::num
