#include "sim/codec.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "sim/codec_simd.h"
#include "util/error.h"

namespace tern::sim {

using isa::DType;

namespace {

template <typename T>
T load(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
void store(std::uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

// Decode tables for the 8- and 16-bit float types, built once.
const float* table(DType d) {
  static const auto tables = [] {
    std::array<std::vector<float>, static_cast<std::size_t>(DType::count_)> t;
    for (DType x :
         {DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2, DType::fp8_e4m3_legacy, DType::e8m0}) {
      const num::Format& f = *isa::format_of(x);
      auto& v = t[static_cast<std::size_t>(x)];
      v.resize(std::size_t{1} << f.bits);
      for (std::uint32_t c = 0; c < v.size(); ++c) v[c] = num::decode(f, c);
    }
    return t;
  }();
  return tables[static_cast<std::size_t>(d)].data();
}

template <typename I>
I to_int(float x) {
  if (std::isnan(x)) return 0;
  const double r = std::nearbyint(static_cast<double>(x));
  if (r <= static_cast<double>(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (r >= static_cast<double>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return static_cast<I>(r);
}

}  // namespace

namespace {
// One contiguous run of n elements at p: the common case, kept tight so the
// compiler vectorizes it.
bool decode_run(DType d, const std::uint8_t* p, std::size_t n, float* out) {
  switch (d) {
    case DType::fp32:
    case DType::tf32:
      std::memcpy(out, p, n * 4);
      return true;
    case DType::bf16:
      decode_bf16_run(p, n, out);
      return true;
    case DType::fp16: {
      const float* t = table(d);
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = t[h];
      }
      return true;
    }
    case DType::fp8_e4m3:
    case DType::fp8_e5m2:
    case DType::fp8_e4m3_legacy:
    case DType::e8m0: {
      const float* t = table(d);
      for (std::size_t i = 0; i < n; ++i) out[i] = t[p[i]];
      return true;
    }
    default:
      return false;
  }
}
}  // namespace

bool decode_columns(DType d, const std::uint8_t* p, std::size_t per, std::size_t cols,
                    std::int64_t stride, float* out) {
  if (cols == 4 && (d == DType::bf16 || d == DType::fp32 || d == DType::tf32)) {
    decode_4_columns(d == DType::bf16, p, per, stride, out);
    return true;
  }
  // Run by run, then interleaved (on this thread's scratch row).
  thread_local std::vector<float> scratch_row;
  scratch_row.resize(per * cols);
  float* scratch = scratch_row.data();
  for (std::size_t j = 0; j < cols; ++j) {
    const std::uint8_t* run = p + static_cast<std::int64_t>(j) * stride;
    if (!decode_run(d, run, per, scratch + j * per)) return false;
  }
  for (std::size_t i = 0; i < per; ++i)
    for (std::size_t j = 0; j < cols; ++j) out[i * cols + j] = scratch[j * per + i];
  return true;
}

bool is_run(std::span<const std::int64_t> offs, int sz) {
  for (std::size_t i = 1; i < offs.size(); ++i)
    if (offs[i] - offs[i - 1] != sz) return false;
  return true;
}

void decode_row(DType d, const std::uint8_t* base, std::span<const std::int64_t> offs, float* out,
                int run) {
  const std::size_t n = offs.size();
  if (isa::is_x4(d)) {
    throw NotSupported(
        fmt::format("reading {} element by element (x4-packed types are read only by "
                    "the MX matmul)",
                    isa::name(d)));
  }
  const int sz = isa::size_bytes(d);
  if (n > 0 && (run < 0 ? is_run(offs, sz) : run == 1) &&
      decode_run(d, base + offs.front(), n, out)) {
    return;
  }
  switch (d) {
    case DType::fp32:
    case DType::tf32:  // stored as FP32 bit patterns with the low 13 bits zero
      for (std::size_t i = 0; i < n; ++i) out[i] = load<float>(base + offs[i]);
      return;
    case DType::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        out[i] = std::bit_cast<float>(std::uint32_t{load<std::uint16_t>(base + offs[i])} << 16);
      }
      return;
    case DType::fp16: {
      const float* t = table(d);
      for (std::size_t i = 0; i < n; ++i) out[i] = t[load<std::uint16_t>(base + offs[i])];
      return;
    }
    case DType::fp8_e4m3:
    case DType::fp8_e5m2:
    case DType::fp8_e4m3_legacy:
    case DType::e8m0: {
      const float* t = table(d);
      for (std::size_t i = 0; i < n; ++i) out[i] = t[base[offs[i]]];
      return;
    }
    case DType::int8:
      for (std::size_t i = 0; i < n; ++i)
        out[i] = static_cast<float>(load<std::int8_t>(base + offs[i]));
      return;
    case DType::uint8:
      for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(base[offs[i]]);
      return;
    case DType::int16:
      for (std::size_t i = 0; i < n; ++i)
        out[i] = static_cast<float>(load<std::int16_t>(base + offs[i]));
      return;
    case DType::uint16:
      for (std::size_t i = 0; i < n; ++i)
        out[i] = static_cast<float>(load<std::uint16_t>(base + offs[i]));
      return;
    case DType::int32:
      for (std::size_t i = 0; i < n; ++i)
        out[i] = static_cast<float>(load<std::int32_t>(base + offs[i]));
      return;
    case DType::uint32:
      for (std::size_t i = 0; i < n; ++i)
        out[i] = static_cast<float>(load<std::uint32_t>(base + offs[i]));
      return;
    default:
      return;
  }
}

void encode_row(DType d, const float* in, std::span<const std::int64_t> offs, std::uint8_t* base,
                const num::CastOptions& opt, std::uint64_t index_base, int run_hint) {
  const std::size_t n = offs.size();
  const bool run = n > 0 && (run_hint < 0 ? is_run(offs, isa::size_bytes(d)) : run_hint == 1);
  if (isa::is_x4(d)) {
    throw NotSupported(fmt::format(
        "writing {} element by element (quantize_mx writes x4-packed types)", isa::name(d)));
  }
  if (d == DType::fp32) {
    if (run) {
      std::memcpy(base + offs[0], in, n * 4);
      return;
    }
    for (std::size_t i = 0; i < n; ++i) store(base + offs[i], in[i]);
    return;
  }
  if (isa::is_float(d)) {
    num::CastOptions o = opt;
    o.overflow = (isa::is_fp8(d) || d == DType::e8m0) ? num::Overflow::saturate
                                                      : num::Overflow::non_saturating;
    const num::Format& f = *isa::format_of(d);
    if (run && f.bits <= 16) {  // straight into the row
      std::uint8_t* p = base + offs[0];
      if (f.bits <= 8) {
        num::encode_codes(f, std::span<const float>(in, n), std::span<std::uint8_t>(p, n), o,
                          index_base);
      } else {
        num::encode_codes(f, std::span<const float>(in, n),
                          std::span<std::uint16_t>(reinterpret_cast<std::uint16_t*>(p), n), o,
                          index_base);
      }
      return;
    }
    constexpr std::size_t kChunk = 1024;
    std::uint32_t codes[kChunk];
    for (std::size_t at = 0; at < n; at += kChunk) {
      const std::size_t m = std::min(kChunk, n - at);
      num::encode_codes(f, std::span<const float>(in + at, m), std::span<std::uint32_t>(codes, m),
                        o, index_base + at);
      // The store loop per element size, chosen once (a switch per
      // element was a twentieth of a training step); a run is one block.
      const std::int64_t* ofs = offs.data() + at;
      switch (d) {
        case DType::tf32:
          for (std::size_t i = 0; i < m; ++i) store(base + ofs[i], codes[i] << 13);
          break;
        case DType::bf16:
        case DType::fp16:
          if (run) {
            std::uint8_t* p = base + ofs[0];
            for (std::size_t i = 0; i < m; ++i)
              store(p + 2 * i, static_cast<std::uint16_t>(codes[i]));
          } else {
            for (std::size_t i = 0; i < m; ++i)
              store(base + ofs[i], static_cast<std::uint16_t>(codes[i]));
          }
          break;
        default:
          if (run) {
            std::uint8_t* p = base + ofs[0];
            for (std::size_t i = 0; i < m; ++i) p[i] = static_cast<std::uint8_t>(codes[i]);
          } else {
            for (std::size_t i = 0; i < m; ++i) base[ofs[i]] = static_cast<std::uint8_t>(codes[i]);
          }
          break;
      }
    }
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    std::uint8_t* p = base + offs[i];
    switch (d) {
      case DType::int8:
        store(p, to_int<std::int8_t>(in[i]));
        break;
      case DType::uint8:
        store(p, to_int<std::uint8_t>(in[i]));
        break;
      case DType::int16:
        store(p, to_int<std::int16_t>(in[i]));
        break;
      case DType::uint16:
        store(p, to_int<std::uint16_t>(in[i]));
        break;
      case DType::int32:
        store(p, to_int<std::int32_t>(in[i]));
        break;
      case DType::uint32:
        store(p, to_int<std::uint32_t>(in[i]));
        break;
      default:
        break;
    }
  }
}

}  // namespace tern::sim
