#include "runtime/device.h"

#include <cstring>

#include <fmt/format.h>

#include "sim/codec.h"
#include "util/error.h"

namespace tern::runtime {

namespace {

std::vector<std::int64_t> offsets(std::int64_t n, int size) {
  std::vector<std::int64_t> o(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) o[static_cast<std::size_t>(i)] = i * size;
  return o;
}

}  // namespace

Device::Device(arch::ChipSpec chip) : chip_(chip), sim_(std::move(chip)) {}

StepResult Device::run(const graph::Executable& exe,
                       const std::map<std::string, std::vector<float>>& feeds) {
  if (exe.arch != chip_.name)
    throw Error(
        fmt::format("the executable was compiled for {}, the device is {}", exe.arch, chip_.name));
  if (!exe.unlowered.empty())
    throw Error(
        fmt::format("the executable has {} groups not lowered (compiled with partial, "
                    "for estimates): it cannot run; first: {}",
                    exe.unlowered.size(), exe.unlowered.front().second));
  const graph::Graph& g = exe.graph;
  // Where each value's bytes live: its root (reshapes and views alias) at
  // its offset.
  const std::vector<int> root = graph::storage_roots(g, exe.fusion);
  std::map<int, std::int64_t> offset;
  for (const graph::Buffer& b : exe.plan.buffers) offset[b.value] = b.offset;
  std::vector<std::uint8_t> arena(static_cast<std::size_t>(exe.plan.arena_bytes));
  auto bytes_of = [&](int v) -> std::pair<std::uint8_t*, std::size_t> {
    const int r = root[static_cast<std::size_t>(v)];
    const auto it = offset.find(r);
    if (it == offset.end()) return {nullptr, 0};
    const graph::Value& val = g.value(r);
    return {arena.data() + it->second,
            static_cast<std::size_t>(graph::elements(val.shape) * isa::size_bytes(val.dtype))};
  };
  auto encode = [&](int v, const std::vector<float>& x) {
    const graph::Value& val = g.value(v);
    const auto [p, n] = bytes_of(v);
    if (!p) return;  // nothing reads it
    const std::int64_t count = graph::elements(val.shape);
    if (static_cast<std::int64_t>(x.size()) != count)
      throw Error(fmt::format("feed %{} {} needs {} values, got {}", val.name,
                              graph::shape_string(val.shape), count, x.size()));
    sim::encode_row(val.dtype, x.data(), offsets(count, isa::size_bytes(val.dtype)), p, {}, 0);
  };
  for (const graph::Node& n : g.nodes()) {
    const graph::Value& v = g.value(n.outputs[0]);
    if (n.op == graph::Op::input || n.op == graph::Op::param) {
      const auto it = feeds.find(v.name);
      if (it == feeds.end()) throw Error(fmt::format("no value fed for %{}", v.name));
      encode(n.outputs[0], it->second);
    } else if (n.op == graph::Op::full) {
      encode(n.outputs[0],
             std::vector<float>(static_cast<std::size_t>(graph::elements(v.shape)),
                                static_cast<float>(graph::attr_real(n.attrs, "value", 0.0))));
    }
  }
  StepResult r;
  // Buffers outside the graph's values that launches pass on (by name).
  std::map<std::string, std::vector<std::uint8_t>> temps;

  for (const graph::Launch& l : exe.launches) {
    sim_.load(l.program);
    for (const auto& [tensor, value] : l.constants) {
      const isa::HbmTensor& t = l.program.tensor(tensor);
      sim_.write(tensor, std::vector<float>(static_cast<std::size_t>(t.elements()), value));
    }
    for (const graph::Binding& b : l.inputs) {
      if (b.value < 0) {
        const auto it = temps.find(b.temp);
        if (it == temps.end())
          throw Error(fmt::format("launch {} ({}): buffer {} read before it is written", l.group,
                                  l.kernel, b.temp));
        sim_.write_bytes(b.tensor, it->second);
        continue;
      }
      const auto [p, n] = bytes_of(b.value);
      if (!p)
        throw Error(fmt::format("launch {} ({}): input %{} has no memory", l.group, l.kernel,
                                g.value(b.value).name));
      sim_.write_bytes(b.tensor, std::span<const std::uint8_t>(p, n));
    }
    const sim::RunStats st = sim_.run({});
    r.kernel_ns.push_back(st.latency_ns);
    r.time_ns += st.latency_ns;
    for (const graph::Binding& b : l.outputs) {
      if (b.value < 0) {
        temps[b.temp] = sim_.read_bytes(b.tensor);
        continue;
      }
      const auto [p, n] = bytes_of(b.value);
      if (!p) continue;  // an output nothing reads
      const std::vector<std::uint8_t> got = sim_.read_bytes(b.tensor);
      if (got.size() != n)
        throw Error(fmt::format("launch {} ({}): output {} has {} bytes, %{} needs {}", l.group,
                                l.kernel, b.tensor, got.size(), g.value(b.value).name, n));
      std::memcpy(p, got.data(), n);
    }
  }
  for (int o : g.outputs()) {
    const graph::Value& v = g.value(o);
    const auto [p, n] = bytes_of(o);
    std::vector<float> x(static_cast<std::size_t>(graph::elements(v.shape)));
    if (p)
      sim::decode_row(v.dtype, p, offsets(graph::elements(v.shape), isa::size_bytes(v.dtype)),
                      x.data());
    r.outputs[v.name] = std::move(x);
  }
  return r;
}

}  // namespace tern::runtime
