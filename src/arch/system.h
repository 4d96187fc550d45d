// A system: N chips of one type plus the fabric between them
// (data/arch/systems/<name>.toml). Fabric levels go from the innermost
// (fastest) outwards; the product of level sizes is the chip count.
//
// Trainium systems name a chip file (data/arch/<chip>.toml); GPU systems,
// which tern does not simulate, describe their device inline ([device]) with
// the figures a planner needs. Link bandwidths are stored one way (what one
// chip can send per second); files say how their source counted
// (`bandwidth_counts`), and bidirectional figures are halved on load.
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
  std::vector<int> dims;         // torus2d: two dims; ring/switched: one (size)
  Bandwidth bandwidth_per_chip;  // one way: bytes/ns one chip sends at this level
  Nanoseconds latency;           // one step: link + switch + software start
  double efficiency = 1;         // payload share of the bandwidth a collective gets
  int size() const;
};

// The network between instances (EFA, InfiniBand): every instance's chips
// share its NICs.
struct ScaleOut {
  std::string name;
  Bandwidth bandwidth_per_instance;  // one way
  int instance_chips = 0;            // chips sharing that bandwidth
  Nanoseconds latency;
  Bandwidth bandwidth_per_chip() const {
    return bandwidth_per_instance / static_cast<double>(instance_chips);
  }
};

// What the planner needs of one chip: dense tensor peaks by dtype, HBM, and
// (GPUs) efficiency parameters from public microbenchmarks.
struct DeviceSpec {
  std::string name;
  bool trainium = true;
  Bytes hbm_capacity;
  Bandwidth hbm_bandwidth;
  std::map<std::string, FlopRate, std::less<>> peak;  // dense, per chip
  // Fractions of peak: large GEMMs and bandwidth-bound kernels. GPUs only
  // (Trainium targets take theirs from tables of `tern bench` runs).
  double gemm_efficiency = 0;
  double memory_efficiency = 0;
  // The dense peak for `dtype`; throws NotSupported naming the device.
  FlopRate peak_for(std::string_view dtype) const;
};

struct SystemSpec {
  std::filesystem::path source;
  std::string name, display_name;
  std::optional<ChipSpec> chip;  // Trainium systems only
  DeviceSpec device;
  int chips = 0;
  std::vector<FabricLevel> fabric;
  std::optional<ScaleOut> scale_out;
  std::optional<Bandwidth> cross_rack_direct;
  std::map<std::string, double, std::less<>> published;
  // The collective algorithms the system's library offers (NCCL, Neuron
  // collectives); empty: all of fabric::kAlgorithms.
  std::vector<std::string> collective_algorithms;

  // ---- derived
  // `lnc` value for one rank per chip made of all its cores, as tern's
  // trainer runs a replica (not a Neuron configuration).
  static constexpr int kWholeChip = -1;
  // The logical-core degree `lnc` asks for (0: the chip's default;
  // kWholeChip: all cores), checked: NotSupported when the chip does not
  // offer it (trn1: only 1; GPUs: 1).
  int lnc_or_default(int lnc) const;
  // Ranks one chip holds at that degree: Neuron's parallel degrees count
  // NeuronCores, logical ones under LNC (cores / lnc); a GPU is one rank.
  int ranks_per_chip(int lnc = 0) const;
  Bytes hbm_capacity() const { return device.hbm_capacity * chips; }
  Bandwidth hbm_bandwidth() const { return device.hbm_bandwidth * static_cast<double>(chips); }
  FlopRate tensor_peak(std::string_view dtype) const {
    return device.peak_for(dtype) * static_cast<double>(chips);
  }
};

std::string_view topology_name(Topology t);

SystemSpec load_system_file(const std::filesystem::path& file);
SystemSpec load_system(std::string_view name_or_path);
// The smallest system (data/arch/systems) made of `chip` chips that holds
// `chips` of them; nullopt when none does.
std::optional<SystemSpec> smallest_system(std::string_view chip, std::int64_t chips);

}  // namespace tern::arch
