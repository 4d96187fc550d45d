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
// - A collective runs on the members' collective engines. It starts when
//   its last participant has reached the call (the latest of their clocks)
//   and their engines are free, and lasts fabric::best() for its size and
//   placement. A blocking call (Launch::sync) waits for it on every member,
//   which synchronizes their simulated clocks. Launch::async returns at
//   once: compute (advance) overlaps the transfer, and wait() later moves
//   each member's clock to the end if it is not there yet. Until a member
//   waits, its output buffer is not readable (the hardware would race).
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
#include "profile/profile.h"
#include "util/units.h"

namespace tern::runtime {

enum class ReduceOp { sum, max, min };
enum class Launch { sync, async };
using Handle = std::int64_t;  // an async collective, for wait()

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
  // Compute on one chip: its clock moves on by `t` (a span `name` on its
  // compute track).
  void advance(int chip, Nanoseconds t, const std::string& name = "compute");

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
  Handle all_reduce(const std::string& in, const std::vector<std::vector<int>>& groups,
                    ReduceOp op = ReduceOp::sum, Launch how = Launch::sync);
  Handle all_gather(const std::string& in, const std::string& out,
                    const std::vector<std::vector<int>>& groups, Launch how = Launch::sync);
  Handle reduce_scatter(const std::string& in, const std::string& out,
                        const std::vector<std::vector<int>>& groups, ReduceOp op = ReduceOp::sum,
                        Launch how = Launch::sync);
  Handle all_to_all(const std::string& in, const std::string& out,
                    const std::vector<std::vector<int>>& groups, Launch how = Launch::sync);
  // Point to point: `in` on `from` arrives as `out` on `to`.
  Handle send_recv(int from, const std::string& in, int to, const std::string& out,
                   Launch how = Launch::sync);
  // Waits for an async collective on one member (its clock moves to the
  // collective's end if earlier; its outputs become readable), or on all.
  // Errors name an unknown handle or a chip outside it.
  void wait(Handle h, int chip);
  void wait(Handle h);

  // Where a group's members lie on the fabric levels (fabric::Group span).
  fabric::Group placement(const std::vector<int>& group) const;

  const std::vector<CollectiveEvent>& events() const { return events_; }
  // The timeline: one process per chip, its compute and its collectives
  // (on their own track), for profile::write_trace().
  const std::vector<profile::Span>& trace() const { return trace_; }

 private:
  struct Buffer {
    num::FormatId dtype = num::FormatId::fp32;
    std::size_t count = 0;
    std::vector<std::uint8_t> bytes;
  };
  struct Chip {
    std::map<std::string, Buffer> buffers;
    Nanoseconds clock;
    Nanoseconds engine_free;  // when its collective engines are next free
  };
  // Outputs a collective delivers to one chip when it waits.
  struct Delivery {
    int chip = 0;
    std::string name;
    Buffer buffer;
  };
  struct Pending {
    std::map<int, Nanoseconds> end;                   // per member
    std::map<int, std::vector<Delivery>> deliveries;  // per member, until it waits
  };
  const Buffer& buffer(int chip, const std::string& name) const;
  void check_groups(const std::vector<std::vector<int>>& groups, const char* what) const;
  // Throws when `name` on `chip` awaits a collective's delivery.
  void check_settled(int chip, const std::string& name) const;
  // Every member holds `in` with one dtype and size (split into group-size
  // blocks when `blocks`): checked before anything moves.
  void check_inputs(const std::string& in, const std::vector<std::vector<int>>& groups,
                    const char* what, bool blocks) const;
  // Times one group's collective on its members' engines and files its
  // outputs under `h`.
  void account(Handle h, fabric::Op op, const std::vector<int>& group, Bytes n,
               std::vector<Delivery> out);
  Handle begin();
  Handle finish(Handle h, Launch how);
  std::vector<float> decode(const Buffer& b) const;
  std::vector<float> reduce(const std::string& in, const std::vector<int>& group,
                            ReduceOp op) const;
  Buffer encode(std::span<const float> values, num::FormatId dtype) const;

  arch::SystemSpec spec_;
  fabric::Network net_;
  std::vector<Chip> chips_;
  std::vector<CollectiveEvent> events_;
  std::vector<profile::Span> trace_;
  std::map<Handle, Pending> pending_;
  Handle next_handle_ = 1;
};

}  // namespace tern::runtime
