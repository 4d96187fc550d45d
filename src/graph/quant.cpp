#include "graph/quant.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "isa/dtype.h"
#include "num/convert.h"
#include "util/error.h"

namespace tern::graph {

OperandQuant parse_operand_quant(const std::string& name) {
  OperandQuant q;
  q.name = name;
  if (name.empty()) return q;
  if (name == "fp8_e4m3" || name == "fp8_e5m2") {
    q.kind = QuantKind::fp8_tensor;
    q.fp8 = name == "fp8_e4m3" ? DType::fp8_e4m3 : DType::fp8_e5m2;
    return q;
  }
  if (name == "mxfp8_e4m3" || name == "mxfp8_e5m2" || name == "mxfp4") {
    q.kind = QuantKind::mx;
    q.mx = name == "mxfp8_e4m3"   ? num::MxId::mxfp8_e4m3
           : name == "mxfp8_e5m2" ? num::MxId::mxfp8_e5m2
                                  : num::MxId::mxfp4;
    return q;
  }
  throw Error(fmt::format(
      "unknown operand quantization '{}' (fp8_e4m3, fp8_e5m2, mxfp8_e4m3, mxfp8_e5m2, mxfp4)",
      name));
}

MatmulQuant matmul_quant(const Attrs& attrs) {
  MatmulQuant q;
  q.a = parse_operand_quant(attr_string(attrs, "quant_a", ""));
  q.b = parse_operand_quant(attr_string(attrs, "quant_b", ""));
  q.grad = parse_operand_quant(attr_string(attrs, "quant_grad", ""));
  q.policy = num::parse_scale_policy(attr_string(attrs, "quant_policy", "rceil"));
  const std::string sc = attr_string(attrs, "quant_scaling", "current");
  if (sc != "current" && sc != "delayed")
    throw Error(fmt::format("quant_scaling '{}': expected current or delayed", sc));
  q.delayed = sc == "delayed";
  q.history = attr_int(attrs, "quant_history", 1024);
  if (q.history < 1) throw Error(fmt::format("quant_history must be >= 1, got {}", q.history));
  return q;
}

void set_matmul_quant(Attrs& attrs, const MatmulQuant& q) {
  for (const auto& [key, o] :
       {std::pair{"quant_a", &q.a}, {"quant_b", &q.b}, {"quant_grad", &q.grad}})
    if (o->kind != QuantKind::none) attrs[key] = o->name;
  const bool mx =
      q.a.kind == QuantKind::mx || q.b.kind == QuantKind::mx || q.grad.kind == QuantKind::mx;
  if (mx) attrs["quant_policy"] = std::string(num::policy_name(q.policy));
  const bool fp8 = q.a.kind == QuantKind::fp8_tensor || q.b.kind == QuantKind::fp8_tensor ||
                   q.grad.kind == QuantKind::fp8_tensor;
  if (fp8 && q.delayed) {
    attrs["quant_scaling"] = std::string("delayed");
    attrs["quant_history"] = q.history;
  }
}

float DelayedScaling::scale(const std::string& site) const {
  const auto it = sites_.find(site);
  return it == sites_.end() ? 1.0f : it->second.scale;
}

void DelayedScaling::record(const std::string& site, DType fp8, float amax, std::int64_t history) {
  Site& s = sites_[site];
  s.length = history, s.pending = true, s.fp8 = fp8;
  s.amax = std::isnan(amax) || std::isnan(s.amax) ? std::nanf("") : std::max(s.amax, amax);
}

void DelayedScaling::update() {
  for (auto& [name, s] : sites_) {
    if (!s.pending) continue;
    s.history.push_back(s.amax);
    const auto excess = static_cast<std::int64_t>(s.history.size()) - s.length;
    if (excess > 0) s.history.erase(s.history.begin(), s.history.begin() + excess);
    float m = 0.0f;
    bool nan = false;
    for (float a : s.history) nan = nan || std::isnan(a), m = std::max(m, a);
    if (!nan && m > 0.0f && std::isfinite(m)) s.scale = fp8_scale(s.fp8, m);
    s.pending = false, s.amax = 0.0f;
  }
}

float fp8_scale(DType fp8, float amax) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
  // A tiny amax (E4M3 below ~1.3e-36) would overflow the quotient to Inf,
  // and 0 * Inf is NaN: clamp to the largest float, as Transformer Engine.
  return std::min(static_cast<float>(isa::format_of(fp8)->max_finite()) / amax,
                  std::numeric_limits<float>::max());
}

void QuantStats::merge(const QuantStats& o) {
  elements += o.elements, nonfinite += o.nonfinite, saturated += o.saturated;
  underflow += o.underflow;
  scale_min = std::min(scale_min, o.scale_min), scale_max = std::max(scale_max, o.scale_max);
}

float fake_quantize(std::vector<double>& x, const Shape& shape, bool k_last, const OperandQuant& q,
                    num::ScalePolicy policy, DType dtype, std::optional<float> scale,
                    QuantStats* stats) {
  if (q.kind == QuantKind::none) return 0.0f;
  // Health counts of one element quantized from `in` (after rounding to the
  // operand's dtype) to `out` at scale `s` in format f: saturated when
  // in * s rounds past f's largest value (|in * s| beyond max + ulp(max) / 2,
  // where round-to-nearest would leave the finite range and the cast clamps).
  auto count = [stats](float in, double out, double s, const num::Format& f) {
    if (!stats) return;
    ++stats->elements;
    if (!std::isfinite(in)) {
      ++stats->nonfinite;
      return;
    }
    const double max = f.max_finite();
    const double edge =
        max + 0.5 * std::ldexp(1.0, static_cast<int>(std::floor(std::log2(max))) - f.man_bits);
    // At the edge itself round-to-nearest-even picks max when max's last
    // mantissa bit is even (E4M3's 448), else the next binade (clamped).
    const double y = std::fabs(static_cast<double>(in) * s);
    if (y > edge || (y == edge && (f.max_finite_code() & 1u))) ++stats->saturated;
    if (in != 0.0f && out == 0.0) ++stats->underflow;
  };
  const num::Format& hi = *isa::format_of(dtype);
  auto rounded = [&](double v) { return num::round_to(hi, static_cast<float>(v)); };
  if (q.kind == QuantKind::fp8_tensor) {
    float amax = 0.0f;  // NaN wins (then the scale is 1)
    for (double v : x) {
      const float a = std::fabs(rounded(v));
      amax = std::isnan(a) || std::isnan(amax) ? std::nanf("") : std::max(amax, a);
    }
    const float s = scale ? *scale : fp8_scale(q.fp8, amax);
    const num::Format& f = *isa::format_of(q.fp8);
    for (double& v : x) {
      const float in = rounded(v);
      const float y = in * s;  // FP32, as the engine scales
      v = static_cast<double>(
              num::round_to(f, y, num::Rounding::nearest_even, num::Overflow::saturate)) /
          static_cast<double>(s);
      count(in, v, s, f);
    }
    if (stats)
      stats->scale_min = std::min<double>(stats->scale_min, s),
      stats->scale_max = std::max<double>(stats->scale_max, s);
    return amax;
  }
  const num::MxFormat& f = num::mx_format(q.mx);
  const std::size_t r = shape.size();
  if (r < (k_last ? 1u : 2u))
    throw Error(fmt::format("{} quantization of a rank-{} operand", q.name, r));
  const std::int64_t K = shape[k_last ? r - 1 : r - 2];
  if (K < 1 || K % static_cast<std::int64_t>(num::kMxBlock) != 0)
    throw Error(
        fmt::format("{} quantization needs the contraction dim to be a multiple of {}, got {}",
                    q.name, num::kMxBlock, K));
  // Vectors along K: contiguous rows, or columns of each [K, C] matrix.
  const std::int64_t C = k_last ? 1 : shape[r - 1];
  const std::int64_t vectors = elements(shape) / K;
  std::vector<float> in(static_cast<std::size_t>(K)), out(in.size());
  std::vector<std::uint8_t> codes(in.size()), scales(in.size() / num::kMxBlock);
  for (std::int64_t v = 0; v < vectors; ++v) {
    // Vector v: matrix v / C, column v % C (k_last: row v).
    const std::int64_t base = k_last ? v * K : (v / C) * K * C + v % C;
    const std::int64_t step = k_last ? 1 : C;
    for (std::int64_t k = 0; k < K; ++k)
      in[static_cast<std::size_t>(k)] = rounded(x[static_cast<std::size_t>(base + k * step)]);
    num::mx_quantize(f, policy, in, codes, scales);
    num::mx_dequantize(f, codes, scales, out);
    for (std::int64_t k = 0; k < K; ++k)
      x[static_cast<std::size_t>(base + k * step)] = out[static_cast<std::size_t>(k)];
    if (stats) {
      for (std::int64_t k = 0; k < K; ++k) {
        // The block's scale 2^X (E8M0 code - 127); elements are x / 2^X.
        const int code = scales[static_cast<std::size_t>(k) / num::kMxBlock];
        const double two_x = std::ldexp(1.0, code - 127);
        count(in[static_cast<std::size_t>(k)], out[static_cast<std::size_t>(k)], 1.0 / two_x,
              num::format(f.element));
        // The scale range of blocks holding a nonzero value (an all-zero
        // block's scale says nothing).
        if (k % static_cast<std::int64_t>(num::kMxBlock) != 0 || code == 0xff) continue;
        const auto b0 = in.begin() + static_cast<std::ptrdiff_t>(k);
        if (std::any_of(b0, b0 + static_cast<std::ptrdiff_t>(num::kMxBlock),
                        [](float e) { return e != 0.0f; }))
          stats->scale_min = std::min(stats->scale_min, two_x),
          stats->scale_max = std::max(stats->scale_max, two_x);
      }
    }
  }
  return 0.0f;
}

}  // namespace tern::graph
