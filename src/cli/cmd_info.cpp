// `tern info`: what a chip or system is, as a table or JSON.
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "arch/chip.h"
#include "arch/system.h"
#include "cli/commands.h"
#include "cli/table.h"

namespace tern::cli {

namespace {

using nlohmann::json;

std::string tflops(FlopRate r) {
  return fmt::format("{:.1f} TFLOPS", r.value() / 1e12);
}
std::string gib(Bytes b) {
  const double g = static_cast<double>(b.value()) / kGiB;
  return g >= 1 ? fmt::format("{:g} GiB", g)
                : fmt::format("{:g} MiB", static_cast<double>(b.value()) / kMiB);
}
std::string gbps(Bandwidth b) {
  return fmt::format("{:g} GB/s", b.value());
}

// Display order of tensor input types.
constexpr const char* kDtypes[] = {"fp32", "tf32",  "bf16",  "fp16",
                                   "fp8",  "mxfp8", "mxfp4", "sparse"};

json chip_json(const arch::ChipSpec& c) {
  json peaks = json::object();
  for (const char* d : kDtypes) {
    if (!c.supports(d)) continue;
    peaks[d] = {{"rate_vs_bf16", c.tensor.rate.at(d)},
                {"per_core_tflops", c.tensor_peak_per_core(d).value() / 1e12},
                {"per_chip_tflops", c.tensor_peak_per_chip(d).value() / 1e12}};
  }
  auto engine = [](const arch::EngineSpec& e) {
    return json{{"clock_ghz", e.clock.value()},
                {"lanes", e.lanes},
                {"fp32_peak_per_core_tflops", e.fp32_peak().value() / 1e12}};
  };
  json j = {
      {"name", c.name},
      {"display_name", c.display_name},
      {"source", c.source.string()},
      {"core_generation", c.core_generation},
      {"core_version", c.core_version},
      {"cores", c.cores},
      {"collective_cores", c.collective_cores},
      {"engines",
       {{"tensor",
         {{"clock_ghz", c.tensor.clock.value()},
          {"rows", c.tensor.rows},
          {"cols", c.tensor.cols},
          {"stationary_fmax", c.tensor.stationary_fmax},
          {"moving_fmax", c.tensor.moving_fmax}}},
        {"vector", engine(c.vector)},
        {"scalar", engine(c.scalar)},
        {"gpsimd", engine(c.gpsimd)}}},
      {"sbuf",
       {{"bytes_per_core", c.sbuf_bytes().value()},
        {"partitions", c.sbuf_partitions},
        {"bytes_per_partition", c.sbuf_partition_bytes.value()}}},
      {"psum",
       {{"bytes_per_core", c.psum_bytes().value()},
        {"partitions", c.psum_partitions},
        {"bytes_per_partition", c.psum_partition_bytes.value()},
        {"banks", c.psum_banks},
        {"bank_bytes_per_partition", c.psum_bank_bytes().value()}}},
      {"hbm",
       {{"bytes", c.hbm_capacity.value()},
        {"gib", static_cast<double>(c.hbm_capacity.value()) / kGiB},
        {"bandwidth_gbps", c.hbm_bandwidth.value()},
        {"bytes_per_core", c.hbm_per_core().value()}}},
      {"dma",
       {{"engines_per_core", c.dma.engines_per_core},
        {"queues_per_engine", c.dma.queues_per_engine},
        {"engine_bandwidth_gbps", c.dma.engine_bandwidth.value()},
        {"bandwidth_per_core_gbps", c.dma_bandwidth_per_core().value()},
        {"chip_bandwidth_gbps", c.dma.chip_bandwidth.value()},
        {"fixed_cost_ns", c.dma.fixed_cost.value()},
        {"descriptor_gen_ns", c.dma.descriptor_gen.value()},
        {"dge_instances", c.dma.dge_instances}}},
      {"tensor_peak", peaks},
      {"fabric",
       {{"neuronlink", c.neuronlink_version},
        {"bandwidth_gbps_per_chip", c.neuronlink_bandwidth.value()}}},
      {"published", c.published},
  };
  return j;
}

std::string chip_text(const arch::ChipSpec& c) {
  std::string out = fmt::format("{} ({}): {} x {}   [{}]\n\n", c.display_name, c.name, c.cores,
                                c.core_generation, c.source.string());
  Table eng({"engine", "clock", "width", "FP32 peak / core"});
  eng.add({"Tensor", fmt::format("{:g} GHz", c.tensor.clock.value()),
           fmt::format("{} x {} PEs", c.tensor.rows, c.tensor.cols),
           c.supports("fp32") ? tflops(c.tensor_peak_per_core("fp32")) : "-"});
  eng.add({"Vector", fmt::format("{:g} GHz", c.vector.clock.value()),
           fmt::format("{} lanes", c.vector.lanes), tflops(c.vector.fp32_peak())});
  eng.add({"Scalar", fmt::format("{:g} GHz", c.scalar.clock.value()),
           fmt::format("{} lanes", c.scalar.lanes), tflops(c.scalar.fp32_peak())});
  eng.add({"GpSimd", fmt::format("{:g} GHz", c.gpsimd.clock.value()),
           fmt::format("{} x {}-bit cores", c.gpsimd_cores, c.gpsimd_width_bits),
           tflops(c.gpsimd.fp32_peak())});
  out += eng.render() + "\n";

  Table mem({"memory", "size", "geometry / bandwidth"});
  mem.set_align_right({false, true, false});
  mem.add({"SBUF / core", gib(c.sbuf_bytes()),
           fmt::format("{} partitions x {} KiB", c.sbuf_partitions,
                       c.sbuf_partition_bytes.value() / kKiB)});
  mem.add({"PSUM / core", gib(c.psum_bytes()),
           fmt::format("{} partitions x {} banks x {} KiB", c.psum_partitions, c.psum_banks,
                       c.psum_bank_bytes().value() / kKiB)});
  mem.add({"HBM / chip", gib(c.hbm_capacity),
           fmt::format("{}, {} per core", gbps(c.hbm_bandwidth), gib(c.hbm_per_core()))});
  mem.add({"DMA / core", "",
           fmt::format("{} engines x {} = {} ({} queues each, {:g} ns fixed cost)",
                       c.dma.engines_per_core, gbps(c.dma.engine_bandwidth),
                       gbps(c.dma_bandwidth_per_core()), c.dma.queues_per_engine,
                       c.dma.fixed_cost.value())});
  mem.add({"DMA / chip", "", gbps(c.dma.chip_bandwidth)});
  out += mem.render() + "\n";

  Table pk({"tensor peak", "rate", "per core", "per chip", "published (chip)"});
  for (const char* d : kDtypes) {
    if (!c.supports(d)) continue;
    const double chip = c.tensor_peak_per_chip(d).value() / 1e12;
    std::string pub = "";
    const auto it = c.published.find(std::string(d) + "_tflops");
    if (it != c.published.end()) {
      pub = fmt::format("{:g} ({:+.1f} %)", it->second, 100.0 * (chip / it->second - 1.0));
    }
    pk.add({d, fmt::format("{:g}x", c.tensor.rate.at(d)), tflops(c.tensor_peak_per_core(d)),
            tflops(c.tensor_peak_per_chip(d)), pub});
  }
  out += pk.render() + "\n";
  out += fmt::format("Fabric: NeuronLink-{} {} per chip; {} collective cores\n",
                     c.neuronlink_version, gbps(c.neuronlink_bandwidth), c.collective_cores);
  return out;
}

json system_json(const arch::SystemSpec& s) {
  json levels = json::array();
  for (const auto& l : s.fabric) {
    levels.push_back({{"name", l.name},
                      {"topology", arch::topology_name(l.topology)},
                      {"dims", l.dims},
                      {"size", l.size()},
                      {"bandwidth_gbps_per_chip_one_way", l.bandwidth_per_chip.value()},
                      {"latency_ns", l.latency.value()},
                      {"efficiency", l.efficiency}});
  }
  json j = {{"name", s.name},
            {"display_name", s.display_name},
            {"source", s.source.string()},
            {"chips", s.chips},
            {"device", s.device.name},
            {"fabric", levels},
            {"hbm_bytes", s.hbm_capacity().value()},
            {"hbm_bandwidth_gbps", s.hbm_bandwidth().value()},
            {"published", s.published}};
  if (s.chip) j["chip"] = chip_json(*s.chip);
  j["collective_algorithms"] = s.collective_algorithms;
  json peaks = json::object();
  for (const auto& [d, rate] : s.device.peak) peaks[d] = rate.value() * s.chips / 1e15;
  j["tensor_peak_pflops"] = peaks;
  if (s.scale_out) {
    j["scale_out"] = {
        {"name", s.scale_out->name},
        {"bandwidth_gbps_per_instance_one_way", s.scale_out->bandwidth_per_instance.value()},
        {"instance_chips", s.scale_out->instance_chips},
        {"latency_ns", s.scale_out->latency.value()}};
  }
  if (s.cross_rack_direct) j["cross_rack_direct_gbps"] = s.cross_rack_direct->value();
  return j;
}

std::string system_text(const arch::SystemSpec& s) {
  std::string out = fmt::format("{} ({}): {} x {}   [{}]\n\n", s.display_name, s.name, s.chips,
                                s.device.name, s.source.string());
  Table fab({"fabric level", "topology", "chips", "GB/s per chip (one way)", "latency"});
  fab.set_align_right({false, false, true, true, true});
  for (const auto& l : s.fabric) {
    std::string topo(arch::topology_name(l.topology));
    if (l.topology == arch::Topology::torus2d) topo += fmt::format(" {}x{}", l.dims[0], l.dims[1]);
    fab.add({l.name, topo, std::to_string(l.size()),
             fmt::format("{:g}", l.bandwidth_per_chip.value()),
             fmt::format("{:g} ns", l.latency.value())});
  }
  out += fab.render() + "\n";
  Table tot({"system total", "value"});
  for (const char* d : {"bf16", "fp8", "mxfp8", "mxfp4"}) {
    if (s.device.peak.count(d)) {
      tot.add({fmt::format("{} peak", d),
               fmt::format("{:.1f} PFLOPS", s.tensor_peak(d).value() / 1e15)});
    }
  }
  tot.add(
      {"HBM", fmt::format("{:.1f} TB ({})", static_cast<double>(s.hbm_capacity().value()) / 1e12,
                          gib(s.hbm_capacity()))});
  tot.add({"HBM bandwidth", fmt::format("{:.1f} TB/s", s.hbm_bandwidth().value() / 1e3)});
  if (s.scale_out) {
    tot.add({"scale-out", fmt::format("{} {} per instance of {} chips (one way), {:g} ns",
                                      s.scale_out->name, gbps(s.scale_out->bandwidth_per_instance),
                                      s.scale_out->instance_chips, s.scale_out->latency.value())});
  }
  if (s.cross_rack_direct) tot.add({"cross-rack direct", gbps(*s.cross_rack_direct) + " per chip"});
  tot.add(
      {"collective algorithms", s.collective_algorithms.empty()
                                    ? std::string("all")
                                    : fmt::format("{}", fmt::join(s.collective_algorithms, ", "))});
  out += tot.render();
  return s.chip ? out + "\nChip:\n" + chip_text(*s.chip) : out;
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Describe a chip or system (from data/arch/*.toml)");
  struct Opts {
    std::string arch = "trn3";
    std::string system;
    bool json = false;
    bool list = false;
  };
  auto opts = std::make_shared<Opts>();
  cmd->add_option("--arch", opts->arch, "Chip name (see --list) or path to a chip .toml")
      ->capture_default_str();
  cmd->add_option("--system", opts->system, "System name (see --list) or path to a system .toml");
  cmd->add_flag("--json", opts->json, "Print JSON instead of tables");
  cmd->add_flag("--list", opts->list, "List the chip and system descriptions");
  cmd->callback([opts] {
    if (opts->list) {
      json j = {{"data_dir", arch::data_dir().string()},
                {"chips", json::array()},
                {"systems", json::array()}};
      Table t({"kind", "name", "description"});
      t.set_align_right({false, false, false});
      for (const auto& n : arch::list_chips()) {
        const auto c = arch::load_chip(n);
        j["chips"].push_back({{"name", n}, {"display_name", c.display_name}});
        t.add({"chip", n, fmt::format("{}, {} x {}", c.display_name, c.cores, c.core_generation)});
      }
      for (const auto& n : arch::list_systems()) {
        const auto s = arch::load_system(n);
        j["systems"].push_back({{"name", n}, {"display_name", s.display_name}, {"chips", s.chips}});
        t.add({"system", n, fmt::format("{}, {} x {}", s.display_name, s.chips, s.device.name)});
      }
      std::fputs(opts->json ? (j.dump(2) + "\n").c_str() : t.render().c_str(), stdout);
      return;
    }
    if (!opts->system.empty()) {
      const auto s = arch::load_system(opts->system);
      std::fputs(opts->json ? (system_json(s).dump(2) + "\n").c_str() : system_text(s).c_str(),
                 stdout);
      return;
    }
    const auto c = arch::load_chip(opts->arch);
    std::fputs(opts->json ? (chip_json(c).dump(2) + "\n").c_str() : chip_text(c).c_str(), stdout);
  });
}

}  // namespace tern::cli
