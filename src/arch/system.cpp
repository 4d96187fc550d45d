#include "arch/system.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "arch/toml_reader.h"
#include "util/error.h"

namespace tern::arch {

using detail::TomlReader;

int FabricLevel::size() const {
  int n = 1;
  for (int d : dims) n *= d;
  return n;
}

FlopRate DeviceSpec::peak_for(std::string_view dtype) const {
  const auto it = peak.find(dtype);
  if (it == peak.end()) {
    std::vector<std::string> known;
    for (const auto& [k, v] : peak) known.push_back(k);
    throw NotSupported(
        fmt::format("{} has no {} peak (it has: {})", name, dtype, fmt::join(known, ", ")));
  }
  return it->second;
}

int SystemSpec::lnc_or_default(int lnc) const {
  const int most = chip ? chip->max_lnc : 1;
  if (lnc == 0) return chip ? chip->default_lnc : 1;
  if (lnc == kWholeChip) return chip ? chip->cores : 1;
  if (lnc < 1 || lnc > most || (chip && chip->cores % lnc != 0)) {
    throw NotSupported(fmt::format("lnc {} on {}: its {} offer{} lnc 1{}", lnc, name,
                                   chip ? chip->name + " chips" : device.name, chip ? "" : "s",
                                   most > 1 ? fmt::format(" to {}", most) : ""));
  }
  return lnc;
}

int SystemSpec::ranks_per_chip(int lnc) const {
  return chip ? chip->cores / lnc_or_default(lnc) : (lnc_or_default(lnc), 1);
}

namespace {

// A bandwidth as its source counted it, stored one way.
Bandwidth one_way(const TomlReader& r, const std::string& table, const std::string& key) {
  const double v = r.number(table + "." + key, 0);
  const std::string counts = r.string(table + ".bandwidth_counts");
  if (counts == "bidirectional") return gigabytes_per_second(v / 2);
  if (counts == "one-way") return gigabytes_per_second(v);
  r.fail(table + ".bandwidth_counts", "\"bidirectional\" or \"one-way\"",
         r.root().at_path(table + ".bandwidth_counts").node());
}

DeviceSpec trainium_device(const ChipSpec& c) {
  DeviceSpec d;
  d.name = c.display_name;
  d.trainium = true;
  d.hbm_capacity = c.hbm_capacity;
  d.hbm_bandwidth = c.hbm_bandwidth;
  for (const auto& [dtype, rate] : c.tensor.rate) {
    if (dtype != "sparse") d.peak[dtype] = c.tensor_peak_per_chip(dtype);
  }
  return d;
}

DeviceSpec gpu_device(const TomlReader& r) {
  r.check_keys("device", r.table("device"),
               {"name", "hbm_gib", "hbm_bandwidth_gbps", "peak_tflops", "gemm_efficiency",
                "memory_efficiency"});
  DeviceSpec d;
  d.name = r.string("device.name");
  d.trainium = false;
  d.hbm_capacity = gibibytes(r.number("device.hbm_gib", 0));
  d.hbm_bandwidth = gigabytes_per_second(r.number("device.hbm_bandwidth_gbps", 0));
  for (const auto& [k, v] : r.table("device.peak_tflops")) {
    const std::string dtype(k.str());
    d.peak[dtype] = FlopRate(r.number("device.peak_tflops." + dtype, 0) * 1e12);
  }
  if (d.peak.empty()) r.fail("device.peak_tflops", "one or more dtype = TFLOPS entries", nullptr);
  d.gemm_efficiency = r.number("device.gemm_efficiency", 0);
  d.memory_efficiency = r.number("device.memory_efficiency", 0);
  for (const char* k : {"gemm_efficiency", "memory_efficiency"}) {
    const double e = r.number(std::string("device.") + k, 0);
    if (e > 1)
      r.fail(std::string("device.") + k, "a fraction in (0, 1]",
             r.root().at_path(std::string("device.") + k).node());
  }
  return d;
}

}  // namespace

std::string_view topology_name(Topology t) {
  switch (t) {
    case Topology::torus2d:
      return "torus2d";
    case Topology::ring:
      return "ring";
    case Topology::switched:
      return "switched";
  }
  return "?";
}

SystemSpec load_system_file(const std::filesystem::path& file) {
  const TomlReader r(file);
  r.check_keys("", r.root(),
               {"schema", "system", "device", "fabric", "scale_out", "published", "collectives"});
  r.integer("schema", 1, 1);
  r.check_keys("system", r.table("system"),
               {"name", "display_name", "chip", "chips", "cross_rack_direct_gbps"});
  SystemSpec s;
  s.source = file;
  s.name = r.string("system.name");
  s.display_name = r.string("system.display_name");
  const bool gpu = r.has("device");
  if (gpu == r.has("system.chip")) {
    throw Error(
        fmt::format("{}: a system names either a chip (system.chip) or describes its "
                    "device ([device]), not {}",
                    file.string(), gpu ? "both" : "neither"));
  }
  const std::string chip = gpu ? "" : r.string("system.chip");
  s.chips = static_cast<int>(r.integer("system.chips", 1, 1 << 24));
  if (r.has("system.cross_rack_direct_gbps")) {
    s.cross_rack_direct = gigabytes_per_second(r.number("system.cross_rack_direct_gbps", 0));
  }
  const toml::node* fab = r.root().get("fabric");
  if (!fab || !fab->is_array_of_tables() || fab->as_array()->empty()) {
    r.fail("fabric", "one or more [[fabric]] tables", fab);
  }
  const auto& levels = *fab->as_array();
  for (std::size_t i = 0; i < levels.size(); ++i) {
    const std::string key = fmt::format("fabric[{}]", i);
    const auto& t = *levels[i].as_table();
    r.check_keys(key, t,
                 {"name", "topology", "dims", "size", "bandwidth_gbps_per_chip", "bandwidth_counts",
                  "latency_ns", "efficiency"});
    FabricLevel l;
    l.name = r.string(key + ".name");
    const std::string topo = r.string(key + ".topology");
    if (topo == "torus2d") {
      l.topology = Topology::torus2d;
      const toml::node* d = t.get("dims");
      const toml::array* arr = d ? d->as_array() : nullptr;
      if (!arr || arr->size() != 2) r.fail(key + ".dims", "two positive integers [x, y]", d);
      for (std::size_t j = 0; j < 2; ++j) {
        l.dims.push_back(static_cast<int>(r.integer(fmt::format("{}.dims[{}]", key, j), 1, 4096)));
      }
    } else if (topo == "ring" || topo == "switched") {
      l.topology = topo == "ring" ? Topology::ring : Topology::switched;
      l.dims.push_back(static_cast<int>(r.integer(key + ".size", 1, 1 << 24)));
    } else {
      r.fail(key + ".topology", "one of torus2d, ring, switched", t.get("topology"));
    }
    l.bandwidth_per_chip = one_way(r, key, "bandwidth_gbps_per_chip");
    l.latency = Nanoseconds(r.number(key + ".latency_ns", 0, false));
    if (r.has(key + ".efficiency")) {
      l.efficiency = r.number(key + ".efficiency", 0);
      if (l.efficiency > 1)
        r.fail(key + ".efficiency", "a fraction in (0, 1]", t.get("efficiency"));
    }
    s.fabric.push_back(std::move(l));
  }
  int product = 1;
  for (const auto& l : s.fabric) product *= l.size();
  if (product != s.chips) {
    throw Error(
        fmt::format("{}: key 'fabric': the fabric levels hold {} chips but "
                    "system.chips is {}",
                    file.string(), product, s.chips));
  }
  if (r.has("scale_out")) {
    r.check_keys("scale_out", r.table("scale_out"),
                 {"name", "bandwidth_gbps_per_instance", "bandwidth_counts", "instance_chips",
                  "latency_ns"});
    ScaleOut o;
    o.name = r.string("scale_out.name");
    o.bandwidth_per_instance = one_way(r, "scale_out", "bandwidth_gbps_per_instance");
    o.instance_chips = static_cast<int>(r.integer("scale_out.instance_chips", 1, s.chips));
    if (s.chips % o.instance_chips != 0) {
      r.fail("scale_out.instance_chips", fmt::format("a divisor of system.chips ({})", s.chips),
             r.table("scale_out").get("instance_chips"));
    }
    o.latency = Nanoseconds(r.number("scale_out.latency_ns", 0, false));
    s.scale_out = o;
  }
  if (r.has("collectives")) {
    r.check_keys("collectives", r.table("collectives"), {"algorithms"});
    const toml::node* n = r.table("collectives").get("algorithms");
    const toml::array* arr = n ? n->as_array() : nullptr;
    if (!arr || arr->empty()) r.fail("collectives.algorithms", "a list of algorithm names", n);
    for (std::size_t i = 0; i < arr->size(); ++i) {
      const std::string a = r.string(fmt::format("collectives.algorithms[{}]", i));
      if (a != "ring" && a != "tree" && a != "halving-doubling" && a != "direct" &&
          a != "hierarchical") {
        r.fail(fmt::format("collectives.algorithms[{}]", i),
               "ring, tree, halving-doubling, direct or hierarchical", arr->get(i));
      }
      s.collective_algorithms.push_back(a);
    }
  }
  if (r.has("published")) {
    for (const auto& [k, v] : r.table("published")) {
      s.published[std::string(k.str())] = r.number("published." + std::string(k.str()), 0);
    }
  }
  if (gpu) {
    s.device = gpu_device(r);
    return s;
  }
  // The chip file sits beside the system folder (data/arch/<chip>.toml).
  const auto sibling = file.parent_path().parent_path() / (chip + ".toml");
  std::error_code ec;
  s.chip =
      std::filesystem::is_regular_file(sibling, ec) ? load_chip_file(sibling) : load_chip(chip);
  s.device = trainium_device(*s.chip);
  return s;
}

SystemSpec load_system(std::string_view name_or_path) {
  const std::string s(name_or_path);
  if (s.find('/') != std::string::npos || s.ends_with(".toml")) return load_system_file(s);
  const auto file = data_dir() / "arch" / "systems" / (s + ".toml");
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    const auto names = list_systems();
    const std::string known = fmt::format("{}", fmt::join(names, ", "));
    throw Error(fmt::format("unknown system '{}' (known: {})", s, known.empty() ? "none" : known));
  }
  return load_system_file(file);
}

std::optional<SystemSpec> smallest_system(std::string_view chip, std::int64_t chips) {
  std::optional<SystemSpec> best;
  for (const std::string& name : list_systems()) {
    SystemSpec s = load_system(name);
    if (s.chip && s.chip->name == chip && s.chips >= chips && (!best || s.chips < best->chips))
      best = std::move(s);
  }
  return best;
}

}  // namespace tern::arch
