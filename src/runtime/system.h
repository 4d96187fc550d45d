// A multi-chip system: N simulated chips of a system description, each with
// its own named HBM buffers and simulated clock, and the fabric between
// them (src/fabric). Collectives move the real bytes between chips and take
// the time the fabric model gives for their group's placement.
//
// Semantics (docs/multichip.md):
// - Reductions (sum, max, min) decode every participant's elements to FP32,
//   combine them in group order (the order the group lists its chips), and
//   round once to the buffer's dtype (round to nearest even). The result is
//   the same whatever the algorithm, thread or process count.
// - A collective starts when its last participant is ready (the latest of
//   their clocks) and ends fabric::best() later on every participant: it
//   synchronizes their simulated clocks.
// - Groups (replica groups) must place regularly on the fabric's levels
//   (every level-block holds the same number of members), else NotSupported.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "arch/system.h"
#include "fabric/collective.h"
#include "num/format.h"
#include "util/units.h"

namespace tern::runtime {

enum class ReduceOp { sum, max, min };

// One collective as it ran: for traces and tests.
struct CollectiveEvent {
  fabric::Op op = fabric::Op::all_reduce;
  fabric::Algorithm algorithm = fabric::Algorithm::ring;
  std::vector<int> chips;  // the group, in group order
  Bytes bytes;             // the fabric's n (collective.h)
  Nanoseconds start, duration;
};

class System {
 public:
  // `chips` of `spec` (a part of it, or whole systems over scale-out; see
  // fabric::Network::of).
  System(const arch::SystemSpec& spec, int chips);

  int chips() const { return static_cast<int>(chips_.size()); }
  const fabric::Network& network() const { return net_; }
  const arch::SystemSpec& spec() const { return spec_; }

  // Host <-> chip: a named buffer of `values` stored in `dtype` (fp32, bf16
  // or fp16), rounded to nearest even. Reads decode to FP32. Errors name the
  // chip and the buffer.
  void write(int chip, const std::string& name, std::span<const float> values,
             num::FormatId dtype = num::FormatId::fp32);
  std::vector<float> read(int chip, const std::string& name) const;
  num::FormatId dtype(int chip, const std::string& name) const;

  Nanoseconds clock(int chip) const;
  // Compute on one chip: its clock moves on by `t`.
  void advance(int chip, Nanoseconds t);

  // Collectives over `groups` (each a list of chip ids; every chip at most
  // once over all groups). Groups run at the same time; each takes its own
  // fabric time. Buffers named `in` must exist on every member with the
  // same dtype and size; `out` is created or replaced.
  //   all_reduce: in -> in, every member gets the reduction.
  //   all_gather: member i's `in` (k elements) lands at [i k, (i+1) k) of
  //     every member's `out` (p k elements).
  //   reduce_scatter: member i's `out` is block i (k = size / p elements) of
  //     the reduction of everyone's `in`.
  //   all_to_all: block j of member i's `in` becomes block i of member j's
  //     `out` (p blocks each).
  void all_reduce(const std::string& in, const std::vector<std::vector<int>>& groups,
                  ReduceOp op = ReduceOp::sum);
  void all_gather(const std::string& in, const std::string& out,
                  const std::vector<std::vector<int>>& groups);
  void reduce_scatter(const std::string& in, const std::string& out,
                      const std::vector<std::vector<int>>& groups, ReduceOp op = ReduceOp::sum);
  void all_to_all(const std::string& in, const std::string& out,
                  const std::vector<std::vector<int>>& groups);
  // Point to point: `in` on `from` arrives as `out` on `to`.
  void send_recv(int from, const std::string& in, int to, const std::string& out);

  // Where a group's members lie on the fabric levels (fabric::Group span).
  fabric::Group placement(const std::vector<int>& group) const;

  const std::vector<CollectiveEvent>& events() const { return events_; }

 private:
  struct Buffer {
    num::FormatId dtype = num::FormatId::fp32;
    std::size_t count = 0;
    std::vector<std::uint8_t> bytes;
  };
  struct Chip {
    std::map<std::string, Buffer> buffers;
    Nanoseconds clock;
  };
  const Buffer& buffer(int chip, const std::string& name) const;
  void check_groups(const std::vector<std::vector<int>>& groups, const char* what) const;
  // Times one group's collective and moves its members' clocks.
  void account(fabric::Op op, const std::vector<int>& group, Bytes n);
  std::vector<float> decode(const Buffer& b) const;
  Buffer encode(std::span<const float> values, num::FormatId dtype) const;

  arch::SystemSpec spec_;
  fabric::Network net_;
  std::vector<Chip> chips_;
  std::vector<CollectiveEvent> events_;
};

}  // namespace tern::runtime
