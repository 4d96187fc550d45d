#include "fabric/network.h"

#include <fmt/format.h>

#include "fabric/collective.h"
#include "util/error.h"

namespace tern::fabric {

int Level::size() const {
  int n = 1;
  for (int d : dims) n *= d;
  return n;
}

Network::Network(std::vector<Level> levels) : levels_(std::move(levels)) {
  if (levels_.empty()) throw Error("network: no levels");
  for (const auto& l : levels_) {
    if (l.size() < 1 || l.bandwidth.value() <= 0 || l.latency.value() < 0) {
      throw Error(
          fmt::format("network level '{}': size, bandwidth and latency must be positive", l.name));
    }
  }
}

int Network::chips() const {
  int n = 1;
  for (const auto& l : levels_) n *= l.size();
  return n;
}

Network Network::with_ranks_per_chip(const Level& on_chip) const {
  const int r = on_chip.size();
  if (r == 1) return *this;
  std::vector<Level> levels{on_chip};
  for (Level l : levels_) {
    l.bandwidth = l.bandwidth / static_cast<double>(r);
    levels.push_back(std::move(l));
  }
  Network out(std::move(levels));
  out.set_algorithms(algorithms_);
  return out;
}

namespace {

unsigned algorithm_mask(const arch::SystemSpec& s) {
  if (s.collective_algorithms.empty()) return ~0u;
  unsigned mask = 0;
  for (const auto& name : s.collective_algorithms) {
    for (unsigned i = 0; i < std::size(kAlgorithms); ++i) {
      if (algorithm_name(kAlgorithms[i]) == name) mask |= 1u << i;
    }
  }
  return mask;
}

}  // namespace

Network Network::of(const arch::SystemSpec& s, int chips) {
  Network net = build(s, chips);
  net.set_algorithms(algorithm_mask(s));
  return net;
}

Network Network::build(const arch::SystemSpec& s, int chips) {
  if (chips < 1) throw Error(fmt::format("{}: chip count must be positive, got {}", s.name, chips));
  std::vector<Level> levels;
  for (const auto& f : s.fabric) {
    // A link's payload share (protocol overhead) scales its bandwidth.
    levels.push_back({f.name, f.topology, f.dims, f.bandwidth_per_chip * f.efficiency, f.latency});
  }
  if (chips >= s.chips) {
    if (chips % s.chips != 0) {
      const std::int64_t lo = chips / s.chips * s.chips, hi = lo + s.chips;
      throw Error(fmt::format(
          "{} holds {} chips; {} chips is not a whole number of systems (try {})", s.name, s.chips,
          chips, hi <= INT32_MAX ? fmt::format("{} or {}", lo, hi) : fmt::format("{}", lo)));
    }
    if (chips > s.chips) {
      if (!s.scale_out) {
        throw Error(
            fmt::format("{} has no scale-out network in its file, so it cannot grow "
                        "beyond {} chips (asked for {})",
                        s.name, s.chips, chips));
      }
      levels.push_back({s.scale_out->name,
                        arch::Topology::switched,
                        {chips / s.chips},
                        s.scale_out->bandwidth_per_chip(),
                        s.scale_out->latency});
    }
    return Network(std::move(levels));
  }
  // Part of one system: whole inner levels, then a part of one level. A
  // torus may only be cut along whole rows; a part of a ring or switch keeps
  // its per-chip bandwidth.
  std::vector<Level> part;
  int left = chips;
  for (auto& l : levels) {
    if (left == 1) break;
    const int n = l.size();
    if (left % n == 0) {
      part.push_back(l);
      left /= n;
      continue;
    }
    // A switch serves any part of its ports; a ring or torus only divisors.
    if (left > n || (n % left != 0 && l.topology != arch::Topology::switched)) break;
    if (l.topology == arch::Topology::torus2d) {
      if (left % l.dims[0] != 0) break;
      l.dims = {l.dims[0], left / l.dims[0]};
      // One row of a torus is a ring with half the chip's links.
      if (l.dims[1] == 1)
        l = Level{l.name, arch::Topology::ring, {l.dims[0]}, l.bandwidth / 2.0, l.latency};
    } else {
      l.dims = {left};
    }
    part.push_back(l);
    left = 1;
  }
  if (left != 1) {
    throw Error(
        fmt::format("{} chips is not a part of {} that fills whole fabric levels "
                    "(levels of {})",
                    chips, s.name, [&] {
                      std::string out;
                      for (const auto& l : s.fabric)
                        out += (out.empty() ? "" : " x ") + std::to_string(l.size());
                      return out;
                    }()));
  }
  if (part.empty()) part.push_back(levels.front()), part.back().dims = {1};
  return Network(std::move(part));
}

}  // namespace tern::fabric
