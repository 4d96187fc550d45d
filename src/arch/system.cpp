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
  r.check_keys("", r.root(), {"schema", "system", "fabric", "scale_out", "published"});
  r.integer("schema", 1, 1);
  r.check_keys("system", r.table("system"),
               {"name", "display_name", "chip", "chips", "cross_rack_direct_gbps"});
  SystemSpec s;
  s.source = file;
  s.name = r.string("system.name");
  s.display_name = r.string("system.display_name");
  const std::string chip = r.string("system.chip");
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
    r.check_keys(key, t, {"name", "topology", "dims", "size", "bandwidth_gbps_per_chip"});
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
    l.bandwidth_per_chip = gigabytes_per_second(r.number(key + ".bandwidth_gbps_per_chip", 0));
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
    r.check_keys("scale_out", r.table("scale_out"), {"name", "bandwidth_gbps_per_instance"});
    s.scale_out =
        ScaleOut{r.string("scale_out.name"),
                 gigabytes_per_second(r.number("scale_out.bandwidth_gbps_per_instance", 0))};
  }
  if (r.has("published")) {
    for (const auto& [k, v] : r.table("published")) {
      s.published[std::string(k.str())] = r.number("published." + std::string(k.str()), 0);
    }
  }
  // The chip file sits beside the system folder (data/arch/<chip>.toml).
  const auto sibling = file.parent_path().parent_path() / (chip + ".toml");
  std::error_code ec;
  s.chip =
      std::filesystem::is_regular_file(sibling, ec) ? load_chip_file(sibling) : load_chip(chip);
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

}  // namespace tern::arch
