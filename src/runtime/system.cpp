#include "runtime/system.h"

#include <algorithm>
#include <set>

#include <fmt/ranges.h>

#include <fmt/format.h>

#include "num/convert.h"
#include "util/error.h"

namespace tern::runtime {

System::System(const arch::SystemSpec& spec, int chips)
    : spec_(spec),
      net_(fabric::Network::of(spec, chips)),
      chips_(static_cast<std::size_t>(chips)) {}

System::Buffer System::encode(std::span<const float> values, num::FormatId dtype) const {
  if (dtype != num::FormatId::fp32 && dtype != num::FormatId::bf16 &&
      dtype != num::FormatId::fp16) {
    throw NotSupported(fmt::format("collective buffers in {} (fp32, bf16 and fp16 are supported)",
                                   num::format(dtype).name));
  }
  Buffer b;
  b.dtype = dtype;
  b.count = values.size();
  std::vector<std::uint32_t> codes(values.size());
  num::encode_array(num::format(dtype), values, std::span<std::uint32_t>(codes));
  const std::size_t width = static_cast<std::size_t>(num::format(dtype).bits / 8);
  b.bytes.resize(values.size() * width);
  for (std::size_t i = 0; i < codes.size(); ++i) {
    for (std::size_t k = 0; k < width; ++k) b.bytes[i * width + k] = (codes[i] >> (8 * k)) & 0xff;
  }
  return b;
}

std::vector<float> System::decode(const Buffer& b) const {
  const std::size_t width = static_cast<std::size_t>(num::format(b.dtype).bits / 8);
  std::vector<std::uint32_t> codes(b.count, 0);
  for (std::size_t i = 0; i < b.count; ++i) {
    for (std::size_t k = 0; k < width; ++k)
      codes[i] |= std::uint32_t{b.bytes[i * width + k]} << (8 * k);
  }
  std::vector<float> out(b.count);
  num::decode_array(num::format(b.dtype), std::span<const std::uint32_t>(codes), out);
  return out;
}

void System::write(int chip, const std::string& name, std::span<const float> values,
                   num::FormatId dtype) {
  if (chip < 0 || chip >= chips()) {
    throw Error(fmt::format("chip {} does not exist (the system has {})", chip, chips()));
  }
  chips_[static_cast<std::size_t>(chip)].buffers[name] = encode(values, dtype);
}

const System::Buffer& System::buffer(int chip, const std::string& name) const {
  if (chip < 0 || chip >= chips()) {
    throw Error(fmt::format("chip {} does not exist (the system has {})", chip, chips()));
  }
  const auto& bufs = chips_[static_cast<std::size_t>(chip)].buffers;
  const auto it = bufs.find(name);
  if (it == bufs.end()) throw Error(fmt::format("chip {} has no buffer '{}'", chip, name));
  return it->second;
}

void System::check_settled(int chip, const std::string& name) const {
  for (const auto& [h, p] : pending_) {
    const auto it = p.deliveries.find(chip);
    if (it == p.deliveries.end()) continue;
    for (const Delivery& d : it->second) {
      if (d.name == name) {
        throw Error(
            fmt::format("chip {}: buffer '{}' is the output of collective #{}, not waited "
                        "for (reading it would race with the transfer)",
                        chip, name, h));
      }
    }
  }
}

std::vector<float> System::read(int chip, const std::string& name) const {
  check_settled(chip, name);
  return decode(buffer(chip, name));
}

num::FormatId System::dtype(int chip, const std::string& name) const {
  return buffer(chip, name).dtype;
}

Nanoseconds System::clock(int chip) const {
  if (chip < 0 || chip >= chips()) throw Error(fmt::format("chip {} does not exist", chip));
  return chips_[static_cast<std::size_t>(chip)].clock;
}

void System::advance(int chip, Nanoseconds t, const std::string& name) {
  if (chip < 0 || chip >= chips()) throw Error(fmt::format("chip {} does not exist", chip));
  if (!(t.value() >= 0)) throw Error("advance: negative time");
  Chip& c = chips_[static_cast<std::size_t>(chip)];
  trace_.push_back(
      {chip, fmt::format("chip {}", chip), "compute", name, c.clock.value(), t.value()});
  c.clock += t;
}

fabric::Group System::placement(const std::vector<int>& group) const {
  return fabric::placement(net_, group);
}

void System::check_inputs(const std::string& in, const std::vector<std::vector<int>>& groups,
                          const char* what, bool blocks) const {
  check_groups(groups, what);
  for (const auto& g : groups) {
    const Buffer& first = buffer(g[0], in);
    for (int c : g) {
      check_settled(c, in);
      const Buffer& b = buffer(c, in);
      if (b.dtype != first.dtype || b.count != first.count) {
        throw Error(fmt::format("{} '{}': chip {} holds {} x {} but chip {} holds {} x {}", what,
                                in, c, b.count, num::format(b.dtype).name, g[0], first.count,
                                num::format(first.dtype).name));
      }
    }
    if (blocks && first.count % g.size() != 0) {
      throw Error(fmt::format("{} '{}': {} elements do not split into {} blocks", what, in,
                              first.count, g.size()));
    }
  }
}

void System::check_groups(const std::vector<std::vector<int>>& groups, const char* what) const {
  std::set<int> seen;
  if (groups.empty()) throw Error(fmt::format("{}: no replica groups", what));
  for (const auto& g : groups) {
    if (g.empty()) throw Error(fmt::format("{}: an empty replica group", what));
    for (int c : g) {
      if (c < 0 || c >= chips()) {
        throw Error(
            fmt::format("{}: chip {} does not exist (the system has {})", what, c, chips()));
      }
      if (!seen.insert(c).second) {
        throw Error(
            fmt::format("{}: chip {} is in more than one place of the replica groups", what, c));
      }
    }
    placement(g);  // irregular groups fail before anything moves
  }
}

Handle System::begin() {
  const Handle h = next_handle_++;
  pending_[h];
  return h;
}

void System::account(Handle h, fabric::Op op, const std::vector<int>& group, Bytes n,
                     std::vector<Delivery> out) {
  Nanoseconds start(0);
  for (int c : group) {
    const Chip& chip = chips_[static_cast<std::size_t>(c)];
    start = std::max({start, chip.clock, chip.engine_free});
  }
  fabric::Cost cost{fabric::Algorithm::direct, Nanoseconds(0)};
  if (group.size() > 1) cost = fabric::best(net_, fabric::Collective{op, n, placement(group)});
  Pending& p = pending_.at(h);
  for (int c : group) {
    chips_[static_cast<std::size_t>(c)].engine_free = start + cost.time;
    p.end[c] = start + cost.time;
    p.deliveries[c];
  }
  for (Delivery& d : out) p.deliveries[d.chip].push_back(std::move(d));
  events_.push_back({op, cost.algorithm, group, n, start, cost.time});
  for (int c : group) {
    trace_.push_back({c, fmt::format("chip {}", c), "collectives", std::string(fabric::op_name(op)),
                      start.value(), cost.time.value(),
                      nlohmann::json{{"algorithm", fabric::algorithm_name(cost.algorithm)},
                                     {"bytes", n.value()},
                                     {"group", group},
                                     {"handle", h}}});
  }
}

Handle System::finish(Handle h, Launch how) {
  if (how == Launch::sync) wait(h);
  return h;
}

void System::wait(Handle h, int chip) {
  const auto it = pending_.find(h);
  if (it == pending_.end()) throw Error(fmt::format("wait: no collective #{} pending", h));
  Pending& p = it->second;
  const auto end = p.end.find(chip);
  if (end == p.end.end()) {
    throw Error(fmt::format("wait: chip {} is not in collective #{} (or waited already)", chip, h));
  }
  Chip& c = chips_[static_cast<std::size_t>(chip)];
  c.clock = std::max(c.clock, end->second);
  for (Delivery& d : p.deliveries[chip]) c.buffers[d.name] = std::move(d.buffer);
  p.deliveries.erase(chip);
  p.end.erase(end);
  if (p.end.empty()) pending_.erase(it);
}

void System::wait(Handle h) {
  const auto it = pending_.find(h);
  if (it == pending_.end()) throw Error(fmt::format("wait: no collective #{} pending", h));
  std::vector<int> members;
  for (const auto& [c, t] : it->second.end) members.push_back(c);
  for (int c : members) wait(h, c);
}

namespace {

float combine(ReduceOp op, float a, float b) {
  switch (op) {
    case ReduceOp::sum:
      return a + b;
    case ReduceOp::max:
      return std::max(a, b);
    case ReduceOp::min:
      return std::min(a, b);
  }
  return a;
}

}  // namespace

// Every member's `in` decoded to FP32 and combined in group order.
std::vector<float> System::reduce(const std::string& in, const std::vector<int>& g,
                                  ReduceOp op) const {
  std::vector<float> acc = decode(buffer(g[0], in));
  for (std::size_t k = 1; k < g.size(); ++k) {
    const std::vector<float> v = decode(buffer(g[k], in));
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = combine(op, acc[i], v[i]);
  }
  return acc;
}

Handle System::all_reduce(const std::string& in, const std::vector<std::vector<int>>& groups,
                          ReduceOp op, Launch how) {
  check_inputs(in, groups, "all-reduce", false);
  const Handle h = begin();
  for (const auto& g : groups) {
    const Buffer& first = buffer(g[0], in);
    const std::vector<float> acc = reduce(in, g, op);
    const Buffer result = encode(acc, first.dtype);
    const Bytes n(static_cast<std::int64_t>(result.bytes.size()));
    std::vector<Delivery> out;
    for (int c : g) out.push_back({c, in, result});
    account(h, fabric::Op::all_reduce, g, n, std::move(out));
  }
  return finish(h, how);
}

Handle System::all_gather(const std::string& in, const std::string& out,
                          const std::vector<std::vector<int>>& groups, Launch how) {
  check_inputs(in, groups, "all-gather", false);
  const Handle h = begin();
  for (const auto& g : groups) {
    const Buffer& first = buffer(g[0], in);
    Buffer result{first.dtype, first.count * g.size(), {}};
    for (int c : g) {
      const Buffer& b = buffer(c, in);
      result.bytes.insert(result.bytes.end(), b.bytes.begin(), b.bytes.end());
    }
    const Bytes n(static_cast<std::int64_t>(result.bytes.size()));
    std::vector<Delivery> d;
    for (int c : g) d.push_back({c, out, result});
    account(h, fabric::Op::all_gather, g, n, std::move(d));
  }
  return finish(h, how);
}

Handle System::reduce_scatter(const std::string& in, const std::string& out,
                              const std::vector<std::vector<int>>& groups, ReduceOp op,
                              Launch how) {
  check_inputs(in, groups, "reduce-scatter", true);
  const Handle h = begin();
  for (const auto& g : groups) {
    const Buffer& first = buffer(g[0], in);
    const std::size_t p = g.size();
    const std::vector<float> acc = reduce(in, g, op);
    const Bytes n(static_cast<std::int64_t>(first.bytes.size()));
    const std::size_t k = first.count / p;
    const num::FormatId dt = first.dtype;
    std::vector<Delivery> d;
    for (std::size_t r = 0; r < p; ++r) {
      d.push_back({g[r], out, encode(std::span<const float>(acc).subspan(r * k, k), dt)});
    }
    account(h, fabric::Op::reduce_scatter, g, n, std::move(d));
  }
  return finish(h, how);
}

Handle System::all_to_all(const std::string& in, const std::string& out,
                          const std::vector<std::vector<int>>& groups, Launch how) {
  check_inputs(in, groups, "all-to-all", true);
  const Handle h = begin();
  for (const auto& g : groups) {
    const std::size_t p = g.size();
    const Buffer& first = buffer(g[0], in);
    const std::size_t width = static_cast<std::size_t>(num::format(first.dtype).bits / 8);
    const std::size_t block = first.count / p * width;
    std::vector<Buffer> results(p, Buffer{first.dtype, first.count, {}});
    for (std::size_t j = 0; j < p; ++j) {
      for (std::size_t i = 0; i < p; ++i) {
        const auto& src = buffer(g[i], in).bytes;
        results[j].bytes.insert(results[j].bytes.end(),
                                src.begin() + static_cast<std::ptrdiff_t>(j * block),
                                src.begin() + static_cast<std::ptrdiff_t>((j + 1) * block));
      }
    }
    const Bytes n(static_cast<std::int64_t>(first.bytes.size()));
    std::vector<Delivery> d;
    for (std::size_t j = 0; j < p; ++j) d.push_back({g[j], out, std::move(results[j])});
    account(h, fabric::Op::all_to_all, g, n, std::move(d));
  }
  return finish(h, how);
}

Handle System::send_recv(int from, const std::string& in, int to, const std::string& out,
                         Launch how) {
  check_inputs(in, {{from}}, "send/recv", false);
  check_groups({{from, to}}, "send/recv");
  const Handle h = begin();
  Buffer b = buffer(from, in);
  const Bytes n(static_cast<std::int64_t>(b.bytes.size()));
  account(h, fabric::Op::send_recv, {from, to}, n, {{to, out, std::move(b)}});
  return finish(h, how);
}

}  // namespace tern::runtime
