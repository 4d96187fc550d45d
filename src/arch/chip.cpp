#include "arch/chip.h"

#include <dlfcn.h>

#include <unistd.h>
#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "arch/toml_reader.h"
#include "util/error.h"
#include "util/file.h"

#ifndef TERN_SOURCE_DATA_DIR
#define TERN_SOURCE_DATA_DIR ""
#endif

namespace tern::arch {

using detail::TomlReader;

FlopRate ChipSpec::tensor_peak_per_core(std::string_view dtype) const {
  const auto it = tensor.rate.find(dtype);
  if (it == tensor.rate.end()) {
    throw NotSupported(fmt::format("{} has no {} tensor-engine rate", name, dtype));
  }
  // rows x cols PEs, each one MAC (2 FLOP) per cycle at the BF16 rate.
  return flop_rate(static_cast<double>(tensor.rows) * tensor.cols * 2.0 * it->second, tensor.clock);
}

namespace {

constexpr std::int64_t kBig = std::int64_t{1} << 40;

EngineSpec read_engine(const TomlReader& r, const std::string& t) {
  EngineSpec e;
  e.clock = gigahertz(r.number(t + ".clock_ghz", 0));
  e.lanes = static_cast<int>(r.integer(t + ".lanes", 1, 4096));
  e.fp32_flops_per_lane_cycle = r.number(t + ".fp32_flops_per_lane_cycle", 0);
  return e;
}

// The [costs] performance-mode keys (all optional: a chip without them has
// no performance mode).
void read_perf_modes(const TomlReader& r, CostSpec& c) {
  if (r.has("costs.perf_mode_dtypes")) {
    const toml::node* n = r.table("costs").get("perf_mode_dtypes");
    const toml::array* arr = n ? n->as_array() : nullptr;
    if (!arr || arr->empty()) r.fail("costs.perf_mode_dtypes", "a list of data type names", n);
    for (std::size_t i = 0; i < arr->size(); ++i)
      c.perf_mode_dtypes.push_back(r.string(fmt::format("costs.perf_mode_dtypes[{}]", i)));
  }
  auto speedup = [&](const char* key) {
    return r.has(key) ? static_cast<int>(r.integer(key, 1, 64)) : 1;
  };
  c.vector_perf_copy_speedup = speedup("costs.vector_perf_copy_speedup");
  c.vector_perf_speedup = speedup("costs.vector_perf_speedup");
  c.scalar_perf_speedup = speedup("costs.scalar_perf_speedup");
  c.quantize_mx_speedup = speedup("costs.quantize_mx_speedup");
  c.vector_perf_shares_gpsimd_bus = r.has("costs.vector_perf_shares_gpsimd_bus") &&
                                    r.boolean("costs.vector_perf_shares_gpsimd_bus");
}

}  // namespace

ChipSpec load_chip_file(const std::filesystem::path& file) {
  const TomlReader r(file);
  const auto& root = r.root();
  r.check_keys("", root,
               {"schema", "chip", "hbm", "sbuf", "psum", "tensor", "vector", "scalar", "gpsimd",
                "dma", "costs", "sequencer", "neuronlink", "published"});
  r.integer("schema", 1, 1);
  r.check_keys("chip", r.table("chip"),
               {"name", "display_name", "core_generation", "core_version", "cores",
                "collective_cores", "max_lnc", "default_lnc"});
  r.check_keys("hbm", r.table("hbm"), {"capacity_gib", "bandwidth_gbps"});
  r.check_keys("sbuf", r.table("sbuf"), {"partitions", "partition_kib", "min_align_bytes"});
  r.check_keys("psum", r.table("psum"),
               {"partitions", "partition_kib", "banks", "min_align_bytes"});
  r.check_keys("tensor", r.table("tensor"),
               {"clock_ghz", "rows", "cols", "stationary_fmax", "moving_fmax",
                "moving_fmax_v4_fp32", "moving_fmax_v4_bf16", "rate"});
  r.check_keys("tensor.rate", r.table("tensor.rate"),
               {"bf16", "fp16", "tf32", "fp32", "fp8", "mxfp8", "mxfp4", "sparse"});
  r.check_keys("vector", r.table("vector"),
               {"clock_ghz", "lanes", "fp32_flops_per_lane_cycle", "bn_stats_fmax", "transpose_max",
                "select8_min_elements", "select8_max_elements", "shuffle_partitions"});
  r.check_keys("scalar", r.table("scalar"), {"clock_ghz", "lanes", "fp32_flops_per_lane_cycle"});
  r.check_keys(
      "gpsimd", r.table("gpsimd"),
      {"clock_ghz", "lanes", "fp32_flops_per_lane_cycle", "simd_cores", "simd_width_bits"});
  r.check_keys(
      "dma", r.table("dma"),
      {"engines_per_core", "queues_per_engine", "engine_bandwidth_gbps", "chip_bandwidth_gbps",
       "fixed_cost_ns", "descriptor_gen_ns", "dge_instances", "overhead_bound_bytes_per_partition",
       "efficient_bytes_per_partition", "saturating_bytes_per_partition", "priority_classes"});
  r.check_keys(
      "costs", r.table("costs"),
      {"min_ii_cycles", "access_start_cycles", "static_overhead_cycles", "gpsimd_fixed_cycles",
       "stride_penalty_bytes", "strided_slowdown", "load_stationary_speedup", "fast_exp_speedup",
       "tensor_tensor_cycles_per_element", "reciprocal_cycles_per_element",
       "bn_aggr_cycles_per_3_elements", "bf16_reduce_speedup", "memset_zero_16bit_speedup",
       "perf_mode_dtypes", "vector_perf_copy_speedup", "vector_perf_speedup",
       "vector_perf_shares_gpsimd_bus", "scalar_perf_speedup", "quantize_mx_speedup"});
  r.check_keys("neuronlink", r.table("neuronlink"), {"version", "bandwidth_gbps"});
  r.check_keys("sequencer", r.table("sequencer"), {"registers", "op_cycles", "sync_clock_ghz"});

  ChipSpec c;
  c.source = file;
  c.source_text = read_file(file);
  c.name = r.string("chip.name");
  c.display_name = r.string("chip.display_name");
  c.core_generation = r.string("chip.core_generation");
  c.core_version = static_cast<int>(r.integer("chip.core_version", 1, 100));
  c.cores = static_cast<int>(r.integer("chip.cores", 1, 4096));
  c.collective_cores = static_cast<int>(r.integer("chip.collective_cores", 0, 4096));
  c.max_lnc = static_cast<int>(r.integer("chip.max_lnc", 1, c.cores));
  c.default_lnc = static_cast<int>(r.integer("chip.default_lnc", 1, c.max_lnc));
  if (c.cores % c.max_lnc != 0 || c.max_lnc % c.default_lnc != 0) {
    throw Error(fmt::format("{}: chip.max_lnc {} and chip.default_lnc {} must divide cores {}",
                            file.string(), c.max_lnc, c.default_lnc, c.cores));
  }

  c.hbm_capacity = gibibytes(r.number("hbm.capacity_gib", 0));
  c.hbm_bandwidth = gigabytes_per_second(r.number("hbm.bandwidth_gbps", 0));

  c.sbuf_partitions = static_cast<int>(r.integer("sbuf.partitions", 1, 1024));
  c.sbuf_partition_bytes = Bytes(r.integer("sbuf.partition_kib", 1, 1 << 20) * kKiB);
  c.psum_partitions = static_cast<int>(r.integer("psum.partitions", 1, 1024));
  c.psum_partition_bytes = Bytes(r.integer("psum.partition_kib", 1, 1 << 20) * kKiB);
  c.psum_banks = static_cast<int>(r.integer("psum.banks", 1, 1024));
  c.sbuf_min_align = Bytes(r.integer("sbuf.min_align_bytes", 1, 4096));
  c.psum_min_align = Bytes(r.integer("psum.min_align_bytes", 1, 4096));
  if (c.psum_partition_bytes.value() % c.psum_banks != 0) {
    throw Error(fmt::format("{}: key 'psum.banks': {} banks do not divide a {} KiB partition",
                            file.string(), c.psum_banks, c.psum_partition_bytes.value() / kKiB));
  }
  if (c.psum_partitions != c.sbuf_partitions) {
    throw Error(
        fmt::format("{}: key 'psum.partitions': expected the SBUF partition count {}, "
                    "got {}",
                    file.string(), c.sbuf_partitions, c.psum_partitions));
  }

  c.tensor.clock = gigahertz(r.number("tensor.clock_ghz", 0));
  c.tensor.rows = static_cast<int>(r.integer("tensor.rows", 1, c.sbuf_partitions));
  c.tensor.cols = static_cast<int>(r.integer("tensor.cols", 1, 4096));
  c.tensor.stationary_fmax = static_cast<int>(r.integer("tensor.stationary_fmax", 1, 4096));
  c.tensor.moving_fmax = static_cast<int>(r.integer("tensor.moving_fmax", 1, 1 << 16));
  for (const auto& [k, v] : r.table("tensor.rate")) {
    c.tensor.rate[std::string(k.str())] = r.number("tensor.rate." + std::string(k.str()), 0);
  }
  if (!c.supports("bf16")) r.fail("tensor.rate.bf16", "a number > 0", nullptr);

  c.vector = read_engine(r, "vector");
  c.bn_stats_fmax = static_cast<int>(r.integer("vector.bn_stats_fmax", 1, 1 << 16));
  c.vector_transpose_max = static_cast<int>(r.integer("vector.transpose_max", 1, 1024));
  c.select8_min = static_cast<int>(r.integer("vector.select8_min_elements", 8, 1 << 20));
  c.select8_max =
      static_cast<int>(r.integer("vector.select8_max_elements", c.select8_min, 1 << 20));
  c.shuffle_partitions = static_cast<int>(r.integer("vector.shuffle_partitions", 1, 1024));
  c.scalar = read_engine(r, "scalar");
  c.gpsimd.clock = gigahertz(r.number("gpsimd.clock_ghz", 0));
  c.gpsimd.lanes = static_cast<int>(r.integer("gpsimd.lanes", 1, 4096));
  c.gpsimd_cores = static_cast<int>(r.integer("gpsimd.simd_cores", 1, 1024));
  c.gpsimd_width_bits = static_cast<int>(r.integer("gpsimd.simd_width_bits", 8, 1 << 16));
  // GpSimd FP32 throughput: cores x (width / 32) lanes unless stated.
  c.gpsimd.fp32_flops_per_lane_cycle =
      r.has("gpsimd.fp32_flops_per_lane_cycle")
          ? r.number("gpsimd.fp32_flops_per_lane_cycle", 0)
          : static_cast<double>(c.gpsimd_cores) * (c.gpsimd_width_bits / 32) / c.gpsimd.lanes;

  c.dma.engines_per_core = static_cast<int>(r.integer("dma.engines_per_core", 1, 1024));
  c.dma.queues_per_engine = static_cast<int>(r.integer("dma.queues_per_engine", 1, 1024));
  c.dma.engine_bandwidth = gigabytes_per_second(r.number("dma.engine_bandwidth_gbps", 0));
  c.dma.chip_bandwidth = gigabytes_per_second(r.number("dma.chip_bandwidth_gbps", 0));
  c.dma.fixed_cost = Nanoseconds(r.number("dma.fixed_cost_ns", 0, false));
  c.dma.descriptor_gen = Nanoseconds(r.number("dma.descriptor_gen_ns", 0, false));
  c.dma.dge_instances = static_cast<int>(r.integer("dma.dge_instances", 0, 64));
  c.dma.overhead_bound_per_partition =
      Bytes(r.integer("dma.overhead_bound_bytes_per_partition", 1, kBig));
  c.dma.efficient_per_partition = Bytes(r.integer("dma.efficient_bytes_per_partition", 1, kBig));
  c.dma.saturating_per_partition = Bytes(r.integer("dma.saturating_bytes_per_partition", 1, kBig));
  c.dma.priority_classes = static_cast<int>(r.integer("dma.priority_classes", 1, 16));

  c.costs.min_ii = Cycles(r.integer("costs.min_ii_cycles", 0, 1 << 20));
  c.costs.access_start = Cycles(r.integer("costs.access_start_cycles", 0, 1 << 20));
  c.costs.static_overhead = Cycles(r.integer("costs.static_overhead_cycles", 0, 1 << 20));
  c.costs.gpsimd_fixed = Cycles(r.integer("costs.gpsimd_fixed_cycles", 0, 1 << 20));
  c.costs.stride_penalty = Bytes(r.integer("costs.stride_penalty_bytes", 1, 1 << 20));
  c.costs.strided_slowdown = static_cast<int>(r.integer("costs.strided_slowdown", 1, 64));
  c.costs.load_stationary_speedup =
      static_cast<int>(r.integer("costs.load_stationary_speedup", 1, 64));
  auto factor = [&](const char* key) { return static_cast<int>(r.integer(key, 1, 64)); };
  c.costs.tensor_tensor_cycles = factor("costs.tensor_tensor_cycles_per_element");
  c.costs.reciprocal_cycles = factor("costs.reciprocal_cycles_per_element");
  c.costs.bn_aggr_cycles_per_3 = factor("costs.bn_aggr_cycles_per_3_elements");
  c.costs.bf16_reduce_speedup = factor("costs.bf16_reduce_speedup");
  c.costs.memset_zero_16bit_speedup = factor("costs.memset_zero_16bit_speedup");
  c.costs.fast_exp_speedup = r.has("costs.fast_exp_speedup")
                                 ? static_cast<int>(r.integer("costs.fast_exp_speedup", 1, 64))
                                 : 0;
  read_perf_modes(r, c.costs);

  c.sequencer.registers = static_cast<int>(r.integer("sequencer.registers", 1, 4096));
  c.sequencer.op_cycles = Cycles(r.integer("sequencer.op_cycles", 0, 1 << 20));
  c.sequencer.sync_clock = gigahertz(r.number("sequencer.sync_clock_ghz", 0));
  c.neuronlink_version = r.string("neuronlink.version");
  c.neuronlink_bandwidth = gigabytes_per_second(r.number("neuronlink.bandwidth_gbps", 0));

  if (r.has("published")) {
    for (const auto& [k, v] : r.table("published")) {
      c.published[std::string(k.str())] = r.number("published." + std::string(k.str()), 0);
    }
  }
  return c;
}

namespace {
// The file this code was loaded from: the tern executable, or the Python
// module tern/_core*.so when the library runs inside python3 (where
// /proc/self/exe is the interpreter).
std::filesystem::path own_binary() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_binary), &info) != 0 && info.dli_fname != nullptr &&
      info.dli_fname[0] == '/')
    return info.dli_fname;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : exe;
}
}  // namespace

std::filesystem::path data_dir() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("TERN_DATA_DIR"); env && *env) return fs::path(env);
  // Up from the binary's folder: the build tree (build/tern -> data/ in the
  // source tree is compiled in below), an install prefix (bin/tern or
  // lib/python3/dist-packages/tern/_core.so -> share/tern/data).
  std::error_code ec;
  fs::path dir = own_binary().parent_path();
  for (int up = 0; up < 5 && !dir.empty(); ++up, dir = dir.parent_path()) {
    for (const fs::path& cand : {dir / "share" / "tern" / "data", dir / "data"})
      if (fs::is_regular_file(cand / "arch" / "trn3.toml", ec)) return cand;
    if (dir == dir.root_path()) break;
  }
  return fs::path(TERN_SOURCE_DATA_DIR);
}

namespace {
std::vector<std::string> list_toml(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && e.path().extension() == ".toml") {
      names.push_back(e.path().stem().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}
}  // namespace

std::vector<std::string> list_chips() {
  return list_toml(data_dir() / "arch");
}
std::vector<std::string> list_systems() {
  return list_toml(data_dir() / "arch" / "systems");
}

ChipSpec load_chip(std::string_view name_or_path) {
  const std::string s(name_or_path);
  if (s.find('/') != std::string::npos || s.ends_with(".toml")) return load_chip_file(s);
  const auto file = data_dir() / "arch" / (s + ".toml");
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    const auto names = list_chips();
    const std::string known = fmt::format("{}", fmt::join(names, ", "));
    throw Error(fmt::format("unknown chip '{}' (known: {}; looked in {})", s,
                            known.empty() ? "none" : known, (data_dir() / "arch").string()));
  }
  return load_chip_file(file);
}

}  // namespace tern::arch
