#include "runtime/device.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "kernel/kernels.h"
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

std::vector<std::pair<std::string, double>> StepResult::by_kernel() const {
  std::map<std::string, double> m;
  for (const LaunchEvent& e : events) m[e.kernel] += e.ns;
  std::vector<std::pair<std::string, double>> v(m.begin(), m.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return v;
}

Session::Session(arch::ChipSpec chip, std::shared_ptr<const graph::Executable> exe)
    : chip_(std::move(chip)), exe_(std::move(exe)), sim_(chip_) {
  if (exe_->arch != chip_.name)
    throw Error(fmt::format("the executable was compiled for {}, the device is {}", exe_->arch,
                            chip_.name));
  if (!exe_->unlowered.empty())
    throw Error(
        fmt::format("the executable has {} groups not lowered (compiled with partial, "
                    "for estimates): it cannot run; first: {}",
                    exe_->unlowered.size(), exe_->unlowered.front().second));
  // Where each value's bytes live: its root (reshapes and views alias) at
  // its offset.
  update_scaling();  // every site's scale and inverse at 1
  root_ = graph::storage_roots(exe_->graph, exe_->fusion);
  for (const graph::Buffer& b : exe_->plan.buffers) offset_[b.value] = b.offset;
  arena_.resize(static_cast<std::size_t>(exe_->plan.arena_bytes));
}

namespace {

std::vector<std::uint8_t> f32_bytes(const std::vector<float>& x) {
  std::vector<std::uint8_t> b(x.size() * 4);
  std::memcpy(b.data(), x.data(), b.size());
  return b;
}

}  // namespace

// Delayed scaling: the amaxes the step's casts wrote join the histories
// (graph::DelayedScaling, as the interpreter keeps them), and the next
// step's scales and their inverses are written to the kept buffers.
void Session::update_scaling() {
  for (const graph::ScalingSite& site : exe_->scaling) {
    const auto it = state_.find(site.name + ".amax");
    if (it == state_.end()) continue;  // not run yet
    float amax = 0.0f;
    for (std::size_t i = 0; i + 4 <= it->second.size(); i += 4) {
      float a;
      std::memcpy(&a, it->second.data() + i, 4);
      amax = std::isnan(a) || std::isnan(amax) ? std::nanf("") : std::max(amax, a);
    }
    scaling_.record(site.name, site.fp8, amax, site.history);
  }
  scaling_.update();
  for (const graph::ScalingSite& site : exe_->scaling) {
    const float sc = scaling_.scale(site.name);
    state_[site.name + ".scale"] = f32_bytes({sc});
    state_[site.name + ".inv"] = f32_bytes({1.0f / sc});
    state_.erase(site.name + ".amax");
  }
}

std::pair<std::uint8_t*, std::size_t> Session::bytes_of(int v) {
  const auto [p, n] = std::as_const(*this).bytes_of(v);
  return {const_cast<std::uint8_t*>(p), n};
}

std::pair<const std::uint8_t*, std::size_t> Session::bytes_of(int v) const {
  const int r = root_[static_cast<std::size_t>(v)];
  const auto it = offset_.find(r);
  if (it == offset_.end()) return {nullptr, 0};
  const graph::Value& val = exe_->graph.value(r);
  return {arena_.data() + it->second,
          static_cast<std::size_t>(graph::elements(val.shape) * isa::size_bytes(val.dtype))};
}

int Session::leaf(const std::string& name) const {
  const graph::Graph& g = exe_->graph;
  const int v = g.find(name);
  if (v < 0 || !graph::is_leaf(g.node(g.value(v).node).op) ||
      g.node(g.value(v).node).op == graph::Op::full)
    throw Error(fmt::format("graph {} has no input or param %{}", g.name(), name));
  return v;
}

void Session::write(const std::string& name, const std::vector<float>& x) {
  const int v = leaf(name);
  const graph::Value& val = exe_->graph.value(v);
  const std::int64_t count = graph::elements(val.shape);
  if (static_cast<std::int64_t>(x.size()) != count)
    throw Error(fmt::format("feed %{} {} needs {} values, got {}", val.name,
                            graph::shape_string(val.shape), count, x.size()));
  written_.insert(v);
  const auto [p, n] = bytes_of(v);
  if (!p) return;  // nothing reads it
  sim::encode_row(val.dtype, x.data(), offsets(count, isa::size_bytes(val.dtype)), p, {}, 0);
}

void Session::fill(const std::string& name, float value) {
  const graph::Value& val = exe_->graph.value(leaf(name));
  write(name, std::vector<float>(static_cast<std::size_t>(graph::elements(val.shape)), value));
}

std::vector<float> Session::read(const std::string& name) const {
  const graph::Graph& g = exe_->graph;
  const int v = g.find(name);
  if (v < 0) throw Error(fmt::format("graph {} has no value %{}", g.name(), name));
  // Other values' bytes may have been reused by later buffers of the step.
  const graph::Op op = g.node(g.value(v).node).op;
  const bool kept = op == graph::Op::input || op == graph::Op::param ||
                    std::find(g.outputs().begin(), g.outputs().end(), v) != g.outputs().end();
  if (!kept)
    throw Error(
        fmt::format("%{} is not kept in device memory (only inputs, params and graph "
                    "outputs can be read)",
                    name));
  const graph::Value& val = g.value(v);
  const auto [p, n] = bytes_of(v);
  if (!p)
    throw Error(
        fmt::format("%{} is not kept in device memory (only inputs, params and graph "
                    "outputs can be read)",
                    name));
  std::vector<float> x(static_cast<std::size_t>(graph::elements(val.shape)));
  sim::decode_row(val.dtype, p, offsets(graph::elements(val.shape), isa::size_bytes(val.dtype)),
                  x.data());
  return x;
}

std::span<std::uint8_t> Session::input_bytes(
    const graph::Launch& l, const graph::Binding& b,
    std::map<std::string, std::vector<std::uint8_t>>& temps) {
  if (!b.state.empty()) {
    const auto it = state_.find(b.state);
    if (it == state_.end())
      throw Error(
          fmt::format("launch {} ({}): kept buffer {} has no value", l.group, l.kernel, b.state));
    return it->second;
  }
  if (b.value < 0) {
    const auto it = temps.find(b.temp);
    if (it == temps.end())
      throw Error(fmt::format("launch {} ({}): buffer {} read before it is written", l.group,
                              l.kernel, b.temp));
    return it->second;
  }
  const auto [p, n] = bytes_of(b.value);
  if (!p)
    throw Error(fmt::format("launch {} ({}): input %{} has no memory", l.group, l.kernel,
                            exe_->graph.value(b.value).name));
  return {p, n};
}

// Where an output lands: its value's bytes, or a kept buffer or temp made
// the tensor's size; empty for a value nothing reads (it keeps the
// program's own memory).
std::span<std::uint8_t> Session::output_bytes(
    const graph::Binding& b, std::int64_t size,
    std::map<std::string, std::vector<std::uint8_t>>& temps) {
  if (!b.state.empty() || b.value < 0) {
    std::vector<std::uint8_t>& v = b.state.empty() ? temps[b.temp] : state_[b.state];
    v.resize(static_cast<std::size_t>(size));
    return v;
  }
  const auto [p, n] = bytes_of(b.value);
  if (p && static_cast<std::int64_t>(n) != size)
    throw Error(fmt::format("output {} has {} bytes, %{} needs {}", b.tensor, size,
                            exe_->graph.value(b.value).name, n));
  return {p, p ? n : 0};
}

namespace {

// One tensor of a launch and the session bytes it runs on.
struct Place {
  std::string tensor;
  std::span<std::uint8_t> in, out;  // what it reads from / leaves its result in
  bool writes = false;              // the kernel writes it
  bool copy = false;                // copied in / out instead of bound
  bool snapshot = false;            // an input another tensor overwrites: runs on a copy
};

bool overlap(std::span<std::uint8_t> a, std::span<std::uint8_t> b) {
  return !a.empty() && !b.empty() && a.data() < b.data() + b.size() &&
         b.data() < a.data() + a.size();
}

// The bytes a place binds: its result's, else its input's.
std::span<std::uint8_t> home(const Place& p) {
  return p.out.empty() ? p.in : p.out;
}

// Distinct tensors on overlapping bytes, one of them written by the kernel,
// would see each other's writes (an update the memory plan put in place,
// as AdamW's): the input the other overwrites runs on a snapshot of its
// bytes; two written tensors, the later is copied out.
void separate(std::vector<Place>& places) {
  auto apart = [](const Place& p) { return p.copy || p.snapshot; };
  for (std::size_t a = 0; a < places.size(); ++a)
    for (std::size_t b = a + 1; b < places.size(); ++b) {
      Place &x = places[a], &y = places[b];
      if (apart(x) || apart(y) || !(x.writes || y.writes) || !overlap(home(x), home(y))) continue;
      if (x.writes && y.writes)
        y.copy = true;
      else
        (x.writes ? y : x).snapshot = true;
    }
}

}  // namespace

sim::RunStats Session::run_launch(std::size_t index, const sim::Options& so,
                                  std::map<std::string, std::vector<std::uint8_t>>& temps,
                                  LaunchTraffic& traffic) {
  const graph::Launch& l = exe_->launches[index];
  const isa::Program& prog = l.program;
  // The executable's own program (no copy); its rule checks ran on the
  // first step.
  sim_.load_shared(std::shared_ptr<const isa::Program>(exe_, &prog), steps_ > 0);
  if (kernel_writes_.size() <= index) {
    kernel_writes_.resize(exe_->launches.size());
    constants_.resize(exe_->launches.size());
  }
  if (kernel_writes_[index].empty()) {
    kernel_writes_[index] = isa::written_tensors(prog);
    for (const auto& [tensor, value] : l.constants) {
      const isa::HbmTensor& t = prog.tensor(tensor);
      const std::vector<float> x(static_cast<std::size_t>(t.elements()), value);
      std::vector<std::uint8_t>& bytes = constants_[index][tensor];
      bytes.resize(static_cast<std::size_t>(t.bytes()));
      sim::encode_row(t.dtype, x.data(), offsets(t.elements(), isa::size_bytes(t.dtype)),
                      bytes.data(), {}, 0);
    }
  }
  std::map<std::string, Place> by_tensor;
  auto place = [&](const std::string& tensor) -> Place& {
    Place& p = by_tensor[tensor];
    if (p.tensor.empty()) {
      p.tensor = tensor;
      const auto& ts = prog.tensors;
      const auto it = std::find_if(ts.begin(), ts.end(), [&](auto& t) { return t.name == tensor; });
      if (it == ts.end()) prog.tensor(tensor);  // throws naming it
      p.writes = kernel_writes_[index][static_cast<std::size_t>(it - ts.begin())];
    }
    return p;
  };
  for (auto& [tensor, bytes] : constants_[index]) place(tensor).in = bytes;
  for (const graph::Binding& b : l.inputs) place(b.tensor).in = input_bytes(l, b, temps);
  for (const graph::Binding& b : l.outputs)
    place(b.tensor).out = output_bytes(b, prog.tensor(b.tensor).bytes(), temps);
  std::vector<Place> places;
  for (auto& [t, p] : by_tensor) places.push_back(std::move(p));
  // A kernel that writes a tensor it reads from another value's bytes: run
  // in place on the result's bytes seeded with the input (a constant, a
  // kept input, a value the graph reads again must stay as it is).
  for (Place& p : places)
    if (p.writes && !p.in.empty() && p.out.data() != p.in.data()) {
      if (p.out.empty()) {
        p.copy = true;
      } else if (p.out.size() == p.in.size() && !overlap(p.in, p.out)) {
        std::memcpy(p.out.data(), p.in.data(), p.in.size());
        p.in = p.out;
        ++traffic.device_copies;
      } else {
        p.copy = true;
      }
    }
  separate(places);
  for (Place& p : places) {
    if (p.snapshot) {
      std::vector<std::uint8_t>& copy = snapshots_[p.tensor];
      copy.assign(p.in.begin(), p.in.end());
      p.in = copy;
      ++traffic.device_copies;
    }
    if (p.copy) {
      if (!p.in.empty()) sim_.write_bytes(p.tensor, p.in);
      ++traffic.copied, traffic.copied_bytes += static_cast<std::int64_t>(p.in.size());
    } else if (!home(p).empty()) {
      sim_.bind(p.tensor, home(p), !p.in.empty());
      ++traffic.bound;
    }
  }
  const sim::RunStats st = sim_.run(so);
  for (const Place& p : places)
    if (p.copy && !p.out.empty()) {
      const std::vector<std::uint8_t> got = sim_.read_bytes(p.tensor);
      std::memcpy(p.out.data(), got.data(), p.out.size());
      traffic.copied_bytes += static_cast<std::int64_t>(got.size());
    }
  return st;
}

StepResult Session::step(const std::map<std::string, std::vector<float>>& feeds,
                         const StepOptions& options) {
  // Every feed checked before any is written: a bad one changes nothing.
  for (const auto& [name, x] : feeds) {
    const graph::Value& val = exe_->graph.value(leaf(name));
    if (static_cast<std::int64_t>(x.size()) != graph::elements(val.shape))
      throw Error(fmt::format("feed %{} {} needs {} values, got {}", val.name,
                              graph::shape_string(val.shape), graph::elements(val.shape),
                              x.size()));
  }
  for (const auto& [name, x] : feeds) write(name, x);
  const graph::Graph& g = exe_->graph;
  for (const graph::Node& n : g.nodes())
    if ((n.op == graph::Op::input || n.op == graph::Op::param) && !written_.contains(n.outputs[0]))
      throw Error(fmt::format("no value fed for %{}", g.value(n.outputs[0]).name));
  // Constants every step: the plan may let other values reuse their bytes.
  for (const graph::Node& n : g.nodes())
    if (n.op == graph::Op::full) {
      const graph::Value& v = g.value(n.outputs[0]);
      const auto [p, bytes] = bytes_of(n.outputs[0]);
      if (!p) continue;
      const std::int64_t count = graph::elements(v.shape);
      const std::vector<float> x(static_cast<std::size_t>(count),
                                 static_cast<float>(graph::attr_real(n.attrs, "value", 0.0)));
      sim::encode_row(v.dtype, x.data(), offsets(count, isa::size_bytes(v.dtype)), p, {}, 0);
    }
  StepResult r;
  // Buffers outside the graph's values that launches pass on (by name).
  std::map<std::string, std::vector<std::uint8_t>> temps;
  for (std::size_t i = 0; i < exe_->launches.size(); ++i) {
    const graph::Launch& l = exe_->launches[i];
    sim::Options so;
    so.stochastic_rounding = options.stochastic_rounding;
    // splitmix64 of (seed, launch): independent streams per launch.
    std::uint64_t z = options.seed + 0x9e3779b97f4a7c15ull * (r.events.size() + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    so.seed = z ^ (z >> 31);
    const sim::RunStats st = run_launch(i, so, temps, r.traffic);
    r.events.push_back({l.group, l.kernel, l.detail, r.time_ns, st.latency_ns});
    r.kernel_ns.push_back(st.latency_ns);
    r.time_ns += st.latency_ns;
  }
  for (int o : g.outputs()) r.outputs[g.value(o).name] = read(g.value(o).name);
  // The carries, after the outputs are read: the next step's weights and
  // optimizer state (through a copy: a carried output may share bytes with
  // another input's value only when the plan says so).
  // All sources first, then the destinations: carries may swap values.
  std::vector<std::pair<int, std::vector<std::uint8_t>>> moved;
  for (const auto& [out, in] : g.carries()) {
    const auto [src, n] = bytes_of(out);
    const auto [dst, m] = bytes_of(in);
    if (src && dst && n == m && src != dst) moved.emplace_back(in, std::vector(src, src + n));
  }
  for (const auto& [in, bytes] : moved) std::memcpy(bytes_of(in).first, bytes.data(), bytes.size());
  update_scaling();
  ++steps_;
  return r;
}

StepResult Device::run(const graph::Executable& exe,
                       const std::map<std::string, std::vector<float>>& feeds) {
  // A one-step session over a copy-free view of the executable.
  Session s(chip_, std::shared_ptr<const graph::Executable>(&exe, [](const graph::Executable*) {}));
  return s.step(feeds);
}

std::vector<float> adamw_scalars(double lr, double weight_decay, double beta1, double beta2,
                                 std::int64_t step) {
  if (step < 1) throw Error(fmt::format("adamw step must be >= 1, got {}", step));
  kernel::AdamWSpec s;
  s.lr = static_cast<float>(lr), s.weight_decay = static_cast<float>(weight_decay);
  s.beta1 = static_cast<float>(beta1), s.beta2 = static_cast<float>(beta2), s.step = step;
  const kernel::AdamWScalars k = kernel::adamw_scalars(s);
  return {k.decay, k.one_m_b1, k.one_m_b2, k.bc2_sqrt, k.neg_step_size};
}

}  // namespace tern::runtime
