#include "plan/compute.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "arch/chip.h"
#include "util/error.h"

namespace tern::plan {

namespace {

double number(const toml::table& t, std::string_view key, const std::string& where) {
  const auto v = t[key].value<double>();
  if (!v || !(*v > 0) || *v > 1) {
    throw Error(fmt::format("{}: key '{}': expected an efficiency in (0, 1]", where, key));
  }
  return *v;
}

}  // namespace

ComputeModel ComputeModel::of(const arch::SystemSpec& s, int ranks_per_chip) {
  if (ranks_per_chip < 1) throw Error(fmt::format("{} ranks per chip", ranks_per_chip));
  ComputeModel c;
  c.device_ = s.device;
  c.ranks_per_chip_ = ranks_per_chip;
  const double r = ranks_per_chip;
  c.device_.hbm_capacity = Bytes(static_cast<std::int64_t>(
      std::floor(static_cast<double>(s.device.hbm_capacity.value()) / r)));
  c.device_.hbm_bandwidth = s.device.hbm_bandwidth / r;
  for (auto& [dtype, rate] : c.device_.peak) rate = rate / r;
  if (!s.device.trainium) {
    c.memory_eff_ = s.device.memory_efficiency;
    c.attention_eff_ = c.attention_bwd_eff_ = s.device.gemm_efficiency;
    c.source_ = s.source.string();
    return c;
  }
  const auto file = arch::data_dir() / "plan" / "efficiency" / (s.chip->name + ".toml");
  c.source_ = file.string();
  toml::table t;
  try {
    t = toml::parse_file(file.string());
  } catch (const toml::parse_error& e) {
    throw Error(fmt::format("{}: {} (regenerate it with scripts/plan_efficiency.py)", file.string(),
                            e.description()));
  }
  c.memory_eff_ = number(t, "memory_efficiency", file.string());
  c.attention_eff_ = number(t, "attention_efficiency", file.string());
  c.attention_bwd_eff_ = number(t, "attention_backward_efficiency", file.string());
  const auto lat = t["kernel_latency_ns"].value<double>();
  if (!lat || !(*lat >= 0) || *lat > 1e6) {
    throw Error(
        fmt::format("{}: key 'kernel_latency_ns': expected a time in [0, 1e6] ns "
                    "(regenerate the file with scripts/plan_efficiency.py)",
                    file.string()));
  }
  c.kernel_latency_ns_ = *lat;
  const toml::array* g = t["gemm"].as_array();
  if (!g || g->empty()) throw Error(fmt::format("{}: no [[gemm]] entries", file.string()));
  for (const auto& e : *g) {
    const toml::table* row = e.as_table();
    const auto dtype = row ? (*row)["dtype"].value<std::string>() : std::nullopt;
    if (!dtype) throw Error(fmt::format("{}: a [[gemm]] entry without a dtype", file.string()));
    GemmPoint p{*dtype, (*row)["m"].value<double>().value_or(0),
                (*row)["k"].value<double>().value_or(0), (*row)["n"].value<double>().value_or(0),
                number(*row, "efficiency", file.string())};
    if (p.m <= 0 || p.k <= 0 || p.n <= 0) {
      throw Error(fmt::format("{}: a [[gemm]] entry needs positive m, k and n", file.string()));
    }
    p.lm = std::log2(p.m), p.lk = std::log2(p.k), p.ln = std::log2(p.n);
    c.gemms_.push_back(p);
  }
  return c;
}

FlopRate ComputeModel::peak(const std::string& dtype) const {
  return device_.peak_for(dtype);
}

double ComputeModel::gemm_efficiency(double m, double k, double n, const std::string& dtype) const {
  if (gemms_.empty()) return device_.gemm_efficiency;
  // The nearest measured shape of this dtype (else BF16's): sum of |log2|
  // ratios over m, k and n, sizes beyond the table clamped to its edge.
  const GemmPoint* bestp = nullptr;
  double best = std::numeric_limits<double>::infinity();
  const double lm = std::log2(m * ranks_per_chip_), lk = std::log2(k), ln = std::log2(n);
  for (int pass = 0; pass < 2 && !bestp; ++pass) {
    const std::string_view want = pass == 0 ? std::string_view(dtype) : "bf16";
    for (const auto& p : gemms_) {
      if (p.dtype != want) continue;
      const double d = std::fabs(lm - p.lm) + std::fabs(lk - p.lk) + std::fabs(ln - p.ln);
      if (d < best) best = d, bestp = &p;
    }
  }
  return bestp ? bestp->efficiency : device_.gemm_efficiency;
}

Nanoseconds ComputeModel::gemm(double m, double k, double n, const std::string& dtype) const {
  if (m <= 0 || k <= 0 || n <= 0) return Nanoseconds(0);
  const double flops = 2 * m * k * n;
  return Nanoseconds(flops / (peak(dtype).value() * gemm_efficiency(m, k, n, dtype)) * 1e9);
}

Nanoseconds ComputeModel::attention(double flops, double seq, double head_dim, bool fused,
                                    bool backward) const {
  if (fused) {
    const double eff = backward ? attention_bwd_eff_ : attention_eff_;
    return Nanoseconds(flops / (peak("bf16").value() * eff) * 1e9);
  }
  // Unfused: batched GEMMs [seq, d] x [d, seq] and [seq, seq] x [seq, d].
  const double eff = 0.5 * (gemm_efficiency(seq, head_dim, seq, "bf16") +
                            gemm_efficiency(seq, seq, head_dim, "bf16"));
  return Nanoseconds(flops / (peak("bf16").value() * eff) * 1e9);
}

Nanoseconds ComputeModel::memory(double bytes, double kernels) const {
  return Nanoseconds(kernels * kernel_latency_ns_ +
                     bytes / (device_.hbm_bandwidth.value() * memory_eff_));
}

}  // namespace tern::plan
