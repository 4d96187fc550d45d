// The network a collective runs on: the fabric levels of a system, from the
// innermost (fastest) outwards, plus the scale-out network when a cluster
// holds several systems. Built from arch::SystemSpec; knows nothing of
// chips' compute.
#pragma once

#include <string>
#include <vector>

#include "arch/system.h"
#include "util/units.h"

namespace tern::fabric {

struct Level {
  std::string name;
  arch::Topology topology = arch::Topology::switched;
  std::vector<int> dims;  // torus2d: {x, y}; ring / switched: {size}
  Bandwidth bandwidth;    // per chip, one way, at this level
  Nanoseconds latency;    // one algorithm step at this level
  int size() const;
};

class Network {
 public:
  // `chips` of system `s`: a divisor of s.chips that fills whole inner levels
  // (a part of one system), or a multiple of s.chips (that many systems over
  // s.scale_out, which must exist). Errors name the system and the count.
  static Network of(const arch::SystemSpec& s, int chips);
  // A network from explicit levels (tests, what-if studies).
  explicit Network(std::vector<Level> levels);
  // The same chips seen by `on_chip.size()` ranks per chip (Trainium's
  // NeuronCores, or logical cores under LNC): `on_chip` becomes the
  // innermost level and every chip-level bandwidth is shared by the chip's
  // ranks (divided by their count: in a training step they all communicate
  // at once). A size of 1 returns the network unchanged.
  Network with_ranks_per_chip(const Level& on_chip) const;

  const std::vector<Level>& levels() const { return levels_; }
  // The product of the level sizes: chips, or ranks after with_ranks_per_chip.
  int chips() const;
  // Bit i set: the collective library offers fabric::kAlgorithms[i]. All by
  // default; a system file's [collectives] narrows it.
  unsigned algorithms() const { return algorithms_; }
  void set_algorithms(unsigned mask) { algorithms_ = mask; }

 private:
  static Network build(const arch::SystemSpec& s, int chips);
  std::vector<Level> levels_;
  unsigned algorithms_ = ~0u;
};

}  // namespace tern::fabric
