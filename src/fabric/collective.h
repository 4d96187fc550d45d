// Collective operations and their cost on a Network: the alpha-beta time
// formulas of the classic algorithms (Thakur, Rabenseifner & Gropp 2005;
// nccl-tests' bus-bandwidth accounting), the choice a collective library
// makes between them, and overlap with compute. docs/plan.md states every
// formula; tests/fabric check them on hand-computed cases.
//
// Sizes: all-reduce n = the buffer each rank holds; all-gather n = the
// gathered result each rank ends with; reduce-scatter n = the input each
// rank holds; all-to-all n = the bytes each rank holds and redistributes;
// send/recv n = the message.
#pragma once

#include <string_view>
#include <vector>

#include "fabric/network.h"

namespace tern::fabric {

enum class Op { all_reduce, all_gather, reduce_scatter, all_to_all, send_recv };
enum class Algorithm { ring, tree, halving_doubling, direct, hierarchical };

std::string_view op_name(Op op);
std::string_view algorithm_name(Algorithm a);
inline constexpr Algorithm kAlgorithms[] = {Algorithm::ring, Algorithm::tree,
                                            Algorithm::halving_doubling, Algorithm::direct,
                                            Algorithm::hierarchical};

// Where a group's ranks lie: span[i] ranks at network level i (innermost
// first), so the group has prod(span) ranks and, at every level, its ranks
// sit in distinct level-(i-1) blocks. E.g. tensor parallel 8 inside a node of
// 8 = {8, 1}; data parallel over 16 nodes, one rank per node = {1, 16}.
// Shorter than the network's levels: the rest are 1.
struct Group {
  std::vector<int> span;
  int size() const;
};

// The placement of a group given as chip ids (chip c at level i's
// coordinate (c / P_i) mod L_i, P_i the product of the inner levels'
// sizes). Throws NotSupported when the members do not spread evenly over
// the levels' blocks, Error for a chip off the network.
Group placement(const Network& net, const std::vector<int>& chips);

struct Collective {
  Op op = Op::all_reduce;
  Bytes bytes;
  Group group;
};

struct Cost {
  Algorithm algorithm = Algorithm::ring;
  Nanoseconds time;
};

// Time of `c` on `net` with algorithm `a`. Throws NotSupported when the
// algorithm does not apply (e.g. halving-doubling on a ring topology or a
// non-power-of-two group) and Error when the group does not fit the network.
Nanoseconds time(const Network& net, const Collective& c, Algorithm a);
// The fastest applicable algorithm (ties keep kAlgorithms order), as a
// collective library's tuner would pick it for this size and placement.
Cost best(const Network& net, const Collective& c);

// The part of `comm` not hidden behind `window` of compute when a fraction
// `overlap` (0..1) of the window can run communication alongside.
Nanoseconds exposed(Nanoseconds comm, Nanoseconds window, double overlap);

}  // namespace tern::fabric
