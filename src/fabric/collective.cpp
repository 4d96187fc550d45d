#include "fabric/collective.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "util/error.h"

namespace tern::fabric {

using arch::Topology;

std::string_view op_name(Op op) {
  switch (op) {
    case Op::all_reduce:
      return "all-reduce";
    case Op::all_gather:
      return "all-gather";
    case Op::reduce_scatter:
      return "reduce-scatter";
    case Op::all_to_all:
      return "all-to-all";
    case Op::send_recv:
      return "send/recv";
  }
  return "?";
}

std::string_view algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::ring:
      return "ring";
    case Algorithm::tree:
      return "tree";
    case Algorithm::halving_doubling:
      return "halving-doubling";
    case Algorithm::direct:
      return "direct";
    case Algorithm::hierarchical:
      return "hierarchical";
  }
  return "?";
}

int Group::size() const {
  int n = 1;
  for (int s : span) n *= s;
  return n;
}

namespace {

// One network level as a group sees it: its ranks there, their topology,
// per-chip one-way bandwidth and step latency.
struct Seg {
  Topology topo = Topology::switched;
  int p = 1;
  std::vector<int> dims;  // torus2d: {x, y} when the group holds the whole torus
  Bandwidth bw;
  Nanoseconds alpha;
  // Links a chip has at this level: a point-to-point message gets one.
  int links() const { return topo == Topology::torus2d ? 4 : topo == Topology::ring ? 2 : 1; }
};

std::vector<Seg> segments(const Network& net, const Group& g) {
  const auto& lv = net.levels();
  if (g.span.size() > lv.size()) {
    throw Error(fmt::format("collective group spans {} levels but the network has {}",
                            g.span.size(), lv.size()));
  }
  std::vector<Seg> out;
  for (std::size_t i = 0; i < g.span.size(); ++i) {
    const int s = g.span[i];
    const Level& l = lv[i];
    if (s < 1 || s > l.size()) {
      throw Error(fmt::format("collective group: {} ranks at level '{}' of {} chips do not fit", s,
                              l.name, l.size()));
    }
    if (s == 1) continue;
    Seg seg{l.topology, s, {}, l.bandwidth, l.latency};
    if (l.topology == Topology::torus2d) {
      if (s == l.size()) {
        seg.dims = l.dims;
      } else {
        // Part of a torus: a ring along one dimension's links (half the chip's).
        seg.topo = Topology::ring;
        seg.bw = l.bandwidth / 2.0;
      }
    }
    out.push_back(std::move(seg));
  }
  return out;
}

double ceil_log2(int p) {
  return std::ceil(std::log2(static_cast<double>(p)));
}
bool pow2(int p) {
  return p > 0 && (p & (p - 1)) == 0;
}
double nbytes(Bytes n) {
  return static_cast<double>(n.value());
}

// Internally an algorithm that does not apply returns NaN and leaves its
// reason here, so that choosing among algorithms (the planner's search does
// it millions of times) throws nothing; time() turns it into NotSupported.
thread_local std::string_view g_why;

Nanoseconds unsupported(Algorithm, Op, std::string_view why) {
  g_why = why;
  return Nanoseconds(std::numeric_limits<double>::quiet_NaN());
}

Nanoseconds time_segs(const std::vector<Seg>& segs, Op op, Bytes n, Algorithm a, unsigned mask);

// The ring algorithms on one ring of p ranks with step latency alpha and
// per-chip bandwidth bw (Thakur et al. 2005; nccl-tests):
//   all-reduce      2 (p-1) alpha + 2 (p-1)/p n/B
//   all-gather, reduce-scatter  (p-1) alpha + (p-1)/p n/B
Nanoseconds ring_formula(Op op, int p, double n, Bandwidth bw, Nanoseconds alpha) {
  const double steps = op == Op::all_reduce ? 2.0 * (p - 1) : (p - 1);
  return Nanoseconds(steps * alpha.value() + steps / p * n / bw.value());
}

// Pairwise-exchange all-to-all on a bidirectional ring of p: step k sends
// n/p to the rank k away, min(k, p-k) hops each, both directions in use:
//   (p-1) alpha + sum_{k=1}^{p-1} min(k, p-k) n / (p B)
Nanoseconds ring_all_to_all(int p, double n, Bandwidth bw, Nanoseconds alpha) {
  double hops = 0;
  for (int k = 1; k < p; ++k) hops += std::min(k, p - k);
  return Nanoseconds((p - 1) * alpha.value() + hops * n / (p * bw.value()));
}

Nanoseconds ring(const std::vector<Seg>& segs, Op op, double n) {
  int p = 1;
  double alpha = 0, bw = std::numeric_limits<double>::infinity();
  bool switched = true;
  for (const auto& s : segs) {
    p *= s.p;
    alpha = std::max(alpha, s.alpha.value());
    // A ring through a whole torus (Hamiltonian, both directions) uses two
    // of each chip's four links: half its bandwidth.
    const double b = s.topo == Topology::torus2d ? s.bw.value() / 2 : s.bw.value();
    bw = std::min(bw, b);
    switched = switched && s.topo == Topology::switched;
  }
  if (op == Op::all_to_all) {
    if (segs.size() == 1 && segs[0].topo == Topology::ring) {
      return ring_all_to_all(p, n, Bandwidth(bw), Nanoseconds(alpha));
    }
    if (!switched) {
      return unsupported(Algorithm::ring, op,
                         "a torus all-to-all goes dimension by dimension (hierarchical)");
    }
    // Pairwise exchange through a switch: p-1 steps of n/p.
    return Nanoseconds((p - 1) * alpha + (p - 1.0) / p * n / bw);
  }
  return ring_formula(op, p, n, Bandwidth(bw), Nanoseconds(alpha));
}

bool switched_only(const std::vector<Seg>& segs) {
  for (const auto& s : segs) {
    if (s.topo != Topology::switched) return false;
  }
  return true;
}
constexpr std::string_view kNeedsSwitch =
    "needs a switched fabric (partners are not neighbours on a ring or torus)";

// Slowest latency and bandwidth over the levels a group spans.
std::pair<double, double> worst(const std::vector<Seg>& segs) {
  double alpha = 0, bw = std::numeric_limits<double>::infinity();
  for (const auto& s : segs) {
    alpha = std::max(alpha, s.alpha.value());
    bw = std::min(bw, s.bw.value());
  }
  return {alpha, bw};
}

// Double binary tree (NCCL): reduce up and broadcast down, pipelined, each
// rank sending n twice: 2 ceil(log2 p) alpha + 2 n / B.
Nanoseconds tree(const std::vector<Seg>& segs, Op op, double n, int p) {
  if (op != Op::all_reduce) return unsupported(Algorithm::tree, op, "trees serve all-reduce only");
  if (!switched_only(segs)) return unsupported(Algorithm::tree, op, kNeedsSwitch);
  const auto [alpha, bw] = worst(segs);
  return Nanoseconds(2 * ceil_log2(p) * alpha + 2 * n / bw);
}

// Recursive halving / doubling (Rabenseifner), p a power of two:
//   all-reduce 2 log2 p alpha + 2 (p-1)/p n/B; gather or scatter half.
// All-to-all by Bruck's algorithm: log2 p alpha + log2 p / 2 n/B.
Nanoseconds halving_doubling(const std::vector<Seg>& segs, Op op, double n, int p) {
  if (!switched_only(segs)) return unsupported(Algorithm::halving_doubling, op, kNeedsSwitch);
  if (!pow2(p)) {
    return unsupported(Algorithm::halving_doubling, op, "the group size is not a power of two");
  }
  const auto [alpha, bw] = worst(segs);
  const double lg = std::log2(static_cast<double>(p));
  switch (op) {
    case Op::all_reduce:
      return Nanoseconds(2 * lg * alpha + 2.0 * (p - 1) / p * n / bw);
    case Op::all_gather:
    case Op::reduce_scatter:
      return Nanoseconds(lg * alpha + (p - 1.0) / p * n / bw);
    case Op::all_to_all:
      return Nanoseconds(lg * alpha + lg / 2 * n / bw);
    case Op::send_recv:
      break;
  }
  return unsupported(Algorithm::halving_doubling, op, "not a group operation");
}

// Every rank sends to every other at once through the switches. The bytes a
// rank sends through level j go to ranks in its level-(j+1) block but not its
// level-j block: prod(span[<j]) (span[j] - 1) of the p ranks, n/p each:
//   gather / scatter / all-to-all  max alpha + max_j that / B_j
//   all-reduce  twice that (reduce-scatter then all-gather).
Nanoseconds direct(const std::vector<Seg>& segs, Op op, double n, int p) {
  if (!switched_only(segs)) return unsupported(Algorithm::direct, op, kNeedsSwitch);
  double alpha = 0, t = 0, inner = 1;
  for (const auto& s : segs) {
    alpha = std::max(alpha, s.alpha.value());
    t = std::max(t, inner * (s.p - 1) * n / p / s.bw.value());
    inner *= s.p;
  }
  const Nanoseconds one(alpha + t);
  return op == Op::all_reduce ? one * 2.0 : one;
}

// Inner level first, then the rest on the inner level's share, then back:
//   all-reduce  RS_inner(n) + AR_rest(n / p0) + AG_inner(n)
//   all-gather  AG_rest(n / p0) + AG_inner(n)
//   reduce-scatter  RS_inner(n) + RS_rest(n / p0)
//   all-to-all  A2A_inner(n) + A2A_rest(n)   (two-phase)
// each part with its own best algorithm. A whole 2D torus splits into its x
// and y rings the same way; two such all-reduces on halves of the data run
// at once in opposite dimension orders, so each ring has the chip's full
// bandwidth.
Nanoseconds hierarchical(const std::vector<Seg>& segs, Op op, Bytes n, unsigned mask) {
  std::vector<Seg> inner, rest;
  if (segs.size() == 1 && segs[0].topo == Topology::torus2d) {
    const Seg& t = segs[0];
    inner = {Seg{Topology::ring, t.dims[0], {}, t.bw, t.alpha}};
    rest = {Seg{Topology::ring, t.dims[1], {}, t.bw, t.alpha}};
  } else if (segs.size() >= 2) {
    inner = {segs[0]};
    rest.assign(segs.begin() + 1, segs.end());
  } else {
    return unsupported(Algorithm::hierarchical, op, "the group lies in one level");
  }
  const auto best_of = [mask](const std::vector<Seg>& s, Op o, Bytes b) {
    Nanoseconds t(std::numeric_limits<double>::infinity());
    for (unsigned i = 0; i < std::size(kAlgorithms); ++i) {
      if (!(mask >> i & 1u)) continue;
      const Nanoseconds x = time_segs(s, o, b, kAlgorithms[i], mask);
      if (x < t) t = x;  // NaN (not applicable) never compares less
    }
    return t;
  };
  const int p0 = inner[0].p;
  const Bytes share(n.value() / p0);
  switch (op) {
    case Op::all_reduce:
      return best_of(inner, Op::reduce_scatter, n) + best_of(rest, Op::all_reduce, share) +
             best_of(inner, Op::all_gather, n);
    case Op::all_gather:
      return best_of(rest, Op::all_gather, share) + best_of(inner, Op::all_gather, n);
    case Op::reduce_scatter:
      return best_of(inner, Op::reduce_scatter, n) + best_of(rest, Op::reduce_scatter, share);
    case Op::all_to_all:
      return best_of(inner, Op::all_to_all, n) + best_of(rest, Op::all_to_all, n);
    case Op::send_recv:
      break;
  }
  return unsupported(Algorithm::hierarchical, op, "not a group operation");
}

Nanoseconds time_segs(const std::vector<Seg>& segs, Op op, Bytes n, Algorithm a, unsigned mask) {
  int p = 1;
  for (const auto& s : segs) p *= s.p;
  if (op == Op::send_recv) {
    if (a != Algorithm::direct) return unsupported(a, op, "a message goes directly");
    if (p != 2) throw Error(fmt::format("send/recv needs a group of 2 ranks, got {}", p));
    // One link of the outermost level the pair crosses: alpha + n / B_link.
    const Seg& s = segs.back();
    return Nanoseconds(s.alpha.value() + nbytes(n) / (s.bw.value() / s.links()));
  }
  if (p == 1) return Nanoseconds(0);
  switch (a) {
    case Algorithm::ring:
      return ring(segs, op, nbytes(n));
    case Algorithm::tree:
      return tree(segs, op, nbytes(n), p);
    case Algorithm::halving_doubling:
      return halving_doubling(segs, op, nbytes(n), p);
    case Algorithm::direct:
      return direct(segs, op, nbytes(n), p);
    case Algorithm::hierarchical:
      return hierarchical(segs, op, n, mask);
  }
  return unsupported(a, op, "unknown algorithm");
}

}  // namespace

Nanoseconds time(const Network& net, const Collective& c, Algorithm a) {
  if (c.bytes.value() < 0) throw Error(fmt::format("{}: negative size", op_name(c.op)));
  const auto index = static_cast<unsigned>(
      std::find(std::begin(kAlgorithms), std::end(kAlgorithms), a) - std::begin(kAlgorithms));
  if (c.op != Op::send_recv && !(net.algorithms() >> index & 1u)) {
    throw NotSupported(fmt::format("{} {}: the system's collective library does not offer it",
                                   algorithm_name(a), op_name(c.op)));
  }
  const Nanoseconds t = time_segs(segments(net, c.group), c.op, c.bytes, a, net.algorithms());
  if (std::isinf(t.value())) g_why = "no algorithm of the library serves a part of the group";
  if (!std::isfinite(t.value())) {
    throw NotSupported(fmt::format("{} {}: {}", algorithm_name(a), op_name(c.op), g_why));
  }
  return t;
}

Cost best(const Network& net, const Collective& c) {
  const auto segs = segments(net, c.group);
  if (c.bytes.value() < 0) throw Error(fmt::format("{}: negative size", op_name(c.op)));
  Cost out{Algorithm::ring, Nanoseconds(std::numeric_limits<double>::infinity())};
  const unsigned mask = net.algorithms();
  for (unsigned i = 0; i < std::size(kAlgorithms); ++i) {
    if (!(mask >> i & 1u)) continue;
    const Algorithm a = kAlgorithms[i];
    // send/recv goes directly whatever the library's collective algorithms.
    const Nanoseconds t = time_segs(segs, c.op, c.bytes, a, mask);
    // NaN (not applicable) never compares less; neither does infinity (a
    // hierarchical split whose part has no algorithm).
    if (t < out.time) out = {a, t};
  }
  if (c.op == Op::send_recv)
    out = {Algorithm::direct, time_segs(segs, c.op, c.bytes, Algorithm::direct, mask)};
  if (!std::isfinite(out.time.value())) {
    throw NotSupported(fmt::format("{} on this group: no algorithm applies", op_name(c.op)));
  }
  return out;
}

Group placement(const Network& net, const std::vector<int>& group) {
  // Chip c sits at level i's coordinate (c / P_i) mod L_i. A group's span at
  // level i: how many level-i coordinates its members take inside each
  // block of the outer levels, the same in every block (else irregular).
  Group g;
  for (int c : group) {
    if (c < 0 || c >= net.chips()) {
      throw Error(fmt::format("chip {} is not on the network ({} chips)", c, net.chips()));
    }
  }
  std::int64_t P = 1, product = 1;
  for (const auto& lv : net.levels()) {
    const std::int64_t L = lv.size();
    std::map<std::int64_t, std::set<std::int64_t>> by_outer;
    for (int c : group) by_outer[c / (P * L)].insert((c / P) % L);
    std::size_t span = 0;
    for (const auto& [outer, coords] : by_outer) {
      if (span != 0 && coords.size() != span) {
        throw NotSupported(fmt::format("replica group [{}] is irregular on level '{}'",
                                       fmt::join(group, ", "), lv.name));
      }
      span = coords.size();
    }
    g.span.push_back(static_cast<int>(span));
    product *= static_cast<std::int64_t>(span);
    P *= L;
  }
  if (product != static_cast<std::int64_t>(group.size())) {
    throw NotSupported(fmt::format("replica group [{}] does not place regularly on the fabric",
                                   fmt::join(group, ", ")));
  }
  return g;
}

Nanoseconds exposed(Nanoseconds comm, Nanoseconds window, double overlap) {
  if (overlap < 0 || overlap > 1)
    throw Error(fmt::format("overlap must be in [0, 1], got {}", overlap));
  return Nanoseconds(std::max(0.0, comm.value() - overlap * window.value()));
}

}  // namespace tern::fabric
