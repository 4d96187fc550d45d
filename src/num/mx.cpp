#include "num/mx.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "num/encode_params.h"
#include "util/error.h"

namespace tern::num {

namespace {

const std::array<MxFormat, 6>& mx_table() {
  // emax_elem per the OCP MX v1.0 element table (numerics.md section 3).
  static const std::array<MxFormat, 6> t = {
      MxFormat{"mxfp8-e4m3", FormatId::e4m3, 8}, MxFormat{"mxfp8-e5m2", FormatId::e5m2, 15},
      MxFormat{"mxfp6-e3m2", FormatId::e3m2, 4}, MxFormat{"mxfp6-e2m3", FormatId::e2m3, 2},
      MxFormat{"mxfp4", FormatId::e2m1, 2},      MxFormat{"mxint8", FormatId::mxint8, 0},
  };
  return t;
}

// Unbiased exponent and 23-bit fraction of a positive finite FP32 value.
void exponent_and_fraction(std::uint32_t a, int& e, std::uint32_t& frac) {
  std::uint32_t sig;
  detail::split_fp32(a, e, sig);
  e -= 127;
  frac = sig & 0x7FFFFFu;
}

}  // namespace

const MxFormat& mx_format(MxId id) {
  return mx_table()[static_cast<std::size_t>(id)];
}
std::span<const MxFormat> mx_formats() {
  return mx_table();
}

const MxFormat& parse_mx_format(std::string_view name) {
  std::string n(name);
  std::replace(n.begin(), n.end(), '_', '-');
  for (const MxFormat& f : mx_table()) {
    if (f.name == n) return f;
  }
  if (n == "mxfp8") return mx_format(MxId::mxfp8_e4m3);
  if (n == "mxfp6") return mx_format(MxId::mxfp6_e3m2);
  std::vector<std::string_view> names;
  for (const MxFormat& f : mx_table()) names.push_back(f.name);
  throw Error(fmt::format("unknown MX format '{}'; known: {}", name, fmt::join(names, ", ")));
}

ScalePolicy parse_scale_policy(std::string_view name) {
  if (name == "ocp-floor" || name == "ocp_floor" || name == "floor") return ScalePolicy::ocp_floor;
  if (name == "rceil") return ScalePolicy::rceil;
  if (name == "trn3") return ScalePolicy::trn3;
  throw Error(fmt::format("unknown MX scale policy '{}'; known: ocp-floor, rceil, trn3", name));
}

std::string_view policy_name(ScalePolicy p) {
  switch (p) {
    case ScalePolicy::ocp_floor:
      return "ocp-floor";
    case ScalePolicy::rceil:
      return "rceil";
    case ScalePolicy::trn3:
      return "trn3";
  }
  return "?";
}

namespace {

using ScaleRule = MxScaleRule;

}  // namespace

MxScaleRule mx_scale_rule(const MxFormat& f, ScalePolicy policy) {
  MxScaleRule r;
  switch (policy) {
    case ScalePolicy::ocp_floor:
      r.offset = f.emax_elem;
      break;
    case ScalePolicy::rceil: {
      // Smallest k with amax <= max_elem * 2^k, compared exactly on the bits.
      int me;
      exponent_and_fraction(
          std::bit_cast<std::uint32_t>(static_cast<float>(format(f.element).max_finite())), me,
          r.max_frac);
      r.offset = me;
      r.rceil = true;
      break;
    }
    case ScalePolicy::trn3:
      if (f.element == FormatId::e4m3 || f.element == FormatId::e5m2) {
        r.offset = f.emax_elem - 1;
      } else if (f.element == FormatId::e2m1) {
        r.offset = f.emax_elem;
      } else {
        throw NotSupported(fmt::format(
            "the trn3 scale policy for {} (Trainium3 quantizes only to MXFP8 and MXFP4)", f.name));
      }
      break;
  }
  return r;
}

namespace {

// k for a block whose largest magnitude has FP32 bits `amax`.
int block_exponent(const ScaleRule& r, std::uint32_t amax) {
  if (amax >= 0x7F800000u) return kMxNanScale;  // NaN or Inf anywhere: the block is NaN
  if (amax == 0) return -127;                   // all zero: the smallest scale, 0x00
  int e;
  std::uint32_t frac;
  exponent_and_fraction(amax, e, frac);
  const int k = e - r.offset + ((r.rceil && frac > r.max_frac) ? 1 : 0);
  if (k > 127) return kMxNanScale;
  return std::max(k, -127);
}

std::uint32_t block_amax(const float* x) {
  std::uint32_t amax = 0;
  for (std::size_t i = 0; i < kMxBlock; ++i) {
    std::uint32_t b;
    std::memcpy(&b, x + i, sizeof b);
    amax = std::max(amax, b & 0x7FFFFFFFu);
  }
  return amax;
}

}  // namespace

int mx_scale_exponent(const MxFormat& f, ScalePolicy policy, std::span<const float> block) {
  if (block.size() != kMxBlock) {
    throw Error(fmt::format("{}: a block has {} values, got {}", f.name, kMxBlock, block.size()));
  }
  return block_exponent(mx_scale_rule(f, policy), block_amax(block.data()));
}

std::uint8_t mx_scale_code(int k) {
  if (k == kMxNanScale) return 0xFF;
  return static_cast<std::uint8_t>(std::clamp(k, -127, 127) + 127);
}

void mx_quantize(const MxFormat& f, ScalePolicy policy, std::span<const float> in,
                 std::span<std::uint8_t> elements, std::span<std::uint8_t> scales,
                 const CastOptions& opt, std::uint64_t index_base) {
  if (in.size() % kMxBlock != 0) {
    throw Error(fmt::format("{}: {} values is not a whole number of {}-element blocks", f.name,
                            in.size(), kMxBlock));
  }
  const std::size_t nblocks = in.size() / kMxBlock;
  if (elements.size() != in.size() || scales.size() != nblocks) {
    throw Error(fmt::format("{}: {} values need {} element codes and {} scales, got {} and {}",
                            f.name, in.size(), in.size(), nblocks, elements.size(), scales.size()));
  }
  const ScaleRule rule = mx_scale_rule(f, policy);
  std::vector<std::int32_t> ks(nblocks);
  for (std::size_t b = 0; b < nblocks; ++b) {
    const int k = block_exponent(rule, block_amax(in.data() + b * kMxBlock));
    scales[b] = mx_scale_code(k);
    ks[b] = k == kMxNanScale ? 0 : k;
  }
  const auto params = detail::make_params(format(f.element), Overflow::saturate);
  detail::encode_simd<std::uint8_t>(params, in.data(), elements.data(), in.size(), ks.data(),
                                    kMxBlock, opt.rounding == Rounding::stochastic, opt.seed,
                                    index_base, nullptr);
  for (std::size_t b = 0; b < nblocks; ++b) {
    if (scales[b] == 0xFF) std::fill_n(elements.begin() + b * kMxBlock, kMxBlock, 0);
  }
}

namespace {

// The tile's blocks gathered one after the other, quantized, and scattered
// back: the order stochastic rounding numbers values by.
void quantize_tile_gathered(const MxFormat& f, ScalePolicy policy, const float* in,
                            std::size_t rows, std::size_t cols, std::uint8_t* elements,
                            std::span<std::uint8_t> scales, const CastOptions& opt,
                            std::uint64_t index_base) {
  const std::size_t w = kMxBlock / rows, nb = cols / w;
  std::vector<float> blocks(rows * cols);
  for (std::size_t c = 0; c < nb; ++c)
    for (std::size_t r = 0; r < rows; ++r)
      std::memcpy(&blocks[c * kMxBlock + r * w], in + r * cols + c * w, w * sizeof(float));
  std::vector<std::uint8_t> codes(blocks.size());
  mx_quantize(f, policy, blocks, codes, scales, opt, index_base);
  for (std::size_t c = 0; c < nb; ++c)
    for (std::size_t r = 0; r < rows; ++r)
      std::memcpy(elements + r * cols + c * w, &codes[c * kMxBlock + r * w], w);
}

}  // namespace

void mx_quantize_tile(const MxFormat& f, ScalePolicy policy, std::span<const float> in,
                      std::size_t rows, std::span<std::uint8_t> elements,
                      std::span<std::uint8_t> scales, const CastOptions& opt,
                      std::uint64_t index_base) {
  if (rows == 0 || kMxBlock % rows != 0 || in.size() % kMxBlock != 0) {
    throw Error(
        fmt::format("{}: a tile of {} values in {} rows is not whole {}-value blocks of "
                    "{} rows",
                    f.name, in.size(), rows, kMxBlock, rows));
  }
  const std::size_t cols = in.size() / rows, w = kMxBlock / rows, nb = cols / w;
  if (elements.size() != in.size() || scales.size() != nb) {
    throw Error(fmt::format("{}: {} values need {} element codes and {} scales, got {} and {}",
                            f.name, in.size(), in.size(), nb, elements.size(), scales.size()));
  }
  if (opt.rounding == Rounding::stochastic) {
    quantize_tile_gathered(f, policy, in.data(), rows, cols, elements.data(), scales, opt,
                           index_base);
    return;
  }
  // Round to nearest even depends on the value and its block's scale alone:
  // each row encodes in place with the blocks' exponents.
  std::vector<std::uint32_t> amax(cols);
  detail::abs_max_columns(in.data(), rows, cols, amax.data());
  const ScaleRule rule = mx_scale_rule(f, policy);
  // Each value's exponent (a block is shorter than a vector).
  std::vector<std::int32_t> ks(cols);
  for (std::size_t c = 0; c < nb; ++c) {
    const std::uint32_t m = *std::max_element(amax.begin() + c * w, amax.begin() + (c + 1) * w);
    const int k = block_exponent(rule, m);
    scales[c] = mx_scale_code(k);
    std::fill_n(ks.begin() + c * w, w, k == kMxNanScale ? 0 : k);
  }
  const auto params = detail::make_params(format(f.element), Overflow::saturate);
  for (std::size_t r = 0; r < rows; ++r) {
    detail::encode_simd<std::uint8_t>(params, in.data() + r * cols, elements.data() + r * cols,
                                      cols, ks.data(), 1, false, opt.seed, 0, nullptr);
  }
  for (std::size_t c = 0; c < nb; ++c) {
    if (scales[c] != 0xFF) continue;
    for (std::size_t r = 0; r < rows; ++r) std::fill_n(elements.begin() + r * cols + c * w, w, 0);
  }
}

void mx_dequantize(const MxFormat& f, std::span<const std::uint8_t> elements,
                   std::span<const std::uint8_t> scales, std::span<float> out) {
  if (elements.size() % kMxBlock != 0 || scales.size() != elements.size() / kMxBlock ||
      out.size() != elements.size()) {
    throw Error(
        fmt::format("{}: dequantize needs 32 element codes per scale and one output per "
                    "element, got {} codes, {} scales, {} outputs",
                    f.name, elements.size(), scales.size(), out.size()));
  }
  const Format& ef = format(f.element);
  std::array<float, 256> lut;
  for (std::uint32_t c = 0; c < 256; ++c) lut[c] = decode(ef, c);
  for (std::size_t b = 0; b < scales.size(); ++b) {
    const std::uint8_t s = scales[b];
    for (std::size_t j = 0; j < kMxBlock; ++j) {
      const std::size_t i = b * kMxBlock + j;
      out[i] = s == 0xFF ? std::numeric_limits<float>::quiet_NaN()
                         : times_pow2(lut[elements[i] & ef.code_mask()], int(s) - 127);
    }
  }
}

}  // namespace tern::num
