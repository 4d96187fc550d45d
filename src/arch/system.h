// A system: N chips of one type plus the fabric between them
// (data/arch/systems/<name>.toml). Fabric levels go from the innermost
// (fastest) outwards; the product of level sizes is the chip count.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "arch/chip.h"

namespace tern::arch {

enum class Topology { torus2d, ring, switched };

struct FabricLevel {
  std::string name;
  Topology topology = Topology::switched;
  std::vector<int> dims;  // torus2d: two dims; ring/switched: one (size)
  Bandwidth bandwidth_per_chip;
  int size() const;
};

struct ScaleOut {
  std::string name;
  Bandwidth bandwidth_per_instance;
};

struct SystemSpec {
  std::filesystem::path source;
  std::string name, display_name;
  ChipSpec chip;
  int chips = 0;
  std::vector<FabricLevel> fabric;
  std::optional<ScaleOut> scale_out;
  std::optional<Bandwidth> cross_rack_direct;
  std::map<std::string, double, std::less<>> published;

  // ---- derived
  Bytes hbm_capacity() const { return chip.hbm_capacity * chips; }
  Bandwidth hbm_bandwidth() const { return chip.hbm_bandwidth * static_cast<double>(chips); }
  FlopRate tensor_peak(std::string_view dtype) const {
    return chip.tensor_peak_per_chip(dtype) * static_cast<double>(chips);
  }
};

std::string_view topology_name(Topology t);

SystemSpec load_system_file(const std::filesystem::path& file);
SystemSpec load_system(std::string_view name_or_path);

}  // namespace tern::arch
