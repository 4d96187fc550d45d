#include "graph/memplan.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

#include "util/error.h"

namespace tern::graph {

namespace {

constexpr std::int64_t kAlign = 64;

std::int64_t value_bytes(const Value& v) {
  return (elements(v.shape) * isa::size_bytes(v.dtype) + kAlign - 1) / kAlign * kAlign;
}

}  // namespace

std::string bytes_string(std::int64_t b) {
  const double d = static_cast<double>(b);
  if (b >= (std::int64_t{1} << 30)) return fmt::format("{:.2f} GiB", d / (1 << 30));
  if (b >= (1 << 20)) return fmt::format("{:.2f} MiB", d / (1 << 20));
  if (b >= (1 << 10)) return fmt::format("{:.2f} KiB", d / (1 << 10));
  return fmt::format("{} B", b);
}

std::vector<int> storage_roots(const Graph& g, const FusionReport& f) {
  // AdamW's carried results update their inputs in place (the kernel loads
  // each tile before it stores it) when nothing reads the input after the
  // AdamW kernel: they take the input's bytes (no second copy of the
  // weights and moments, and no copy after the step).
  std::map<int, int> in_place;  // out -> in
  if (!g.carries().empty()) {
    std::vector<int> last_read(g.values().size(), -1);
    for (std::size_t n = 0; n < g.nodes().size(); ++n)
      for (int v : g.nodes()[n].inputs)
        last_read[static_cast<std::size_t>(v)] =
            std::max(last_read[static_cast<std::size_t>(v)], f.group_of[n]);
    // Not in place when the old value is still wanted after the step (a
    // graph output, the source of another carry) or read through a view
    // (whose readers the check above does not see).
    std::set<int> kept(g.outputs().begin(), g.outputs().end());
    for (const auto& [out, in] : g.carries()) kept.insert(out);
    std::set<int> viewed;
    for (const Node& n : g.nodes())
      if (n.op == Op::reshape) viewed.insert(n.inputs[0]);
    for (const auto& [v, target] : f.alias) viewed.insert(target);
    for (const auto& [out, in] : g.carries()) {
      const int prod = g.value(out).node;
      if (g.node(prod).op != Op::adamw || kept.contains(in) || viewed.contains(in)) continue;
      if (last_read[static_cast<std::size_t>(in)] <= f.group_of[static_cast<std::size_t>(prod)])
        in_place[out] = in;
    }
  }
  std::vector<int> root(g.values().size());
  for (std::size_t v = 0; v < root.size(); ++v) {
    const Node& n = g.node(g.values()[v].node);
    if (const auto it = f.alias.find(static_cast<int>(v)); it != f.alias.end())
      root[v] = root[static_cast<std::size_t>(it->second)];
    else if (const auto st = f.stored_in.find(static_cast<int>(v)); st != f.stored_in.end())
      root[v] = st->second;  // a transpose's result: its own root
    else if (const auto ip = in_place.find(static_cast<int>(v)); ip != in_place.end())
      root[v] = root[static_cast<std::size_t>(ip->second)];
    else if (n.op == Op::reshape)
      root[v] = root[static_cast<std::size_t>(n.inputs[0])];
    else
      root[v] = static_cast<int>(v);
  }
  return root;
}

MemoryPlan plan_memory(const Graph& g, const FusionReport& f, const PlanOptions& opt) {
  MemoryPlan p;
  const int kernels = static_cast<int>(f.groups.size());
  const std::vector<int> root = storage_roots(g, f);
  // Lifetimes in kernel indices; -1 first: not materialized (yet).
  std::map<int, Buffer> bufs;
  auto group_of = [&](int node) { return f.group_of[static_cast<std::size_t>(node)]; };
  for (std::size_t v = 0; v < g.values().size(); ++v) {
    const Value& val = g.values()[v];
    const Node& n = g.node(val.node);
    if (n.op == Op::input || n.op == Op::param) {
      bufs[static_cast<int>(v)] = {static_cast<int>(v), value_bytes(val), 0, 0, kernels - 1, true};
      if (n.op == Op::param) p.param_elements += elements(val.shape);
    }
  }
  for (std::size_t ni = 0; ni < g.nodes().size(); ++ni) {
    const Node& n = g.nodes()[ni];
    const int gr = group_of(static_cast<int>(ni));
    for (int in : n.inputs) {
      const int r = root[static_cast<std::size_t>(in)];
      const int pg = group_of(g.value(r).node);
      if (pg == gr && pg >= 0) continue;  // stays on chip inside the kernel
      auto it = bufs.find(r);
      if (it == bufs.end()) {
        const Value& rv = g.value(r);
        it = bufs.emplace(r, Buffer{r, value_bytes(rv), 0, std::max(pg, 0), gr, false}).first;
      }
      it->second.last = std::max(it->second.last, gr);
    }
  }
  for (int o : g.outputs()) {
    const int r = root[static_cast<std::size_t>(o)];
    auto it = bufs.find(r);
    if (it == bufs.end())
      it = bufs.emplace(r, Buffer{r, value_bytes(g.value(r)), 0,
                                  std::max(group_of(g.value(r).node), 0), kernels - 1, false})
               .first;
    it->second.last = kernels - 1;
  }
  for (const auto& [v, b] : bufs)
    if (b.first > b.last)
      throw Error(
          fmt::format("plan_memory: %{} is read by kernel {} before kernel {} writes it "
                      "(a fusion scheduling error)",
                      g.value(v).name, b.last, b.first));
  // Persistent buffers first, in definition order; then greedy by size.
  std::vector<Buffer> pers, trans;
  for (auto& [v, b] : bufs) (b.persistent ? pers : trans).push_back(b);
  std::int64_t at = 0;
  for (Buffer& b : pers) {
    b.offset = at;
    at += b.bytes;
  }
  p.persistent_bytes = at;
  std::stable_sort(trans.begin(), trans.end(),
                   [](const Buffer& a, const Buffer& b) { return a.bytes > b.bytes; });
  std::vector<Buffer> placed;
  std::int64_t span = 0;
  for (Buffer& b : trans) {
    // Conflicting placed buffers, by offset; take the first gap that fits.
    std::vector<const Buffer*> live;
    for (const Buffer& q : placed)
      if (q.first <= b.last && b.first <= q.last) live.push_back(&q);
    std::sort(live.begin(), live.end(),
              [](const Buffer* x, const Buffer* y) { return x->offset < y->offset; });
    std::int64_t off = 0;
    for (const Buffer* q : live) {
      if (off + b.bytes <= q->offset) break;
      off = std::max(off, q->offset + q->bytes);
    }
    b.offset = off;
    span = std::max(span, off + b.bytes);
    placed.push_back(b);
  }
  // The true peak: the most bytes live at any one kernel.
  std::vector<std::int64_t> live_at(static_cast<std::size_t>(std::max(kernels, 1)), 0);
  for (const Buffer& b : placed)
    for (int k = b.first; k <= b.last; ++k) live_at[static_cast<std::size_t>(k)] += b.bytes;
  p.transient_peak = *std::max_element(live_at.begin(), live_at.end());
  for (Buffer& b : placed) b.offset += p.persistent_bytes;
  p.arena_bytes = p.persistent_bytes + span;
  p.optimizer_bytes = p.param_elements * opt.optimizer_bytes_per_param;
  p.buffers = std::move(pers);
  p.buffers.insert(p.buffers.end(), placed.begin(), placed.end());
  return p;
}

void check_fits(const Graph& g, const MemoryPlan& plan, std::int64_t capacity,
                const std::string& where) {
  if (plan.total() <= capacity) return;
  std::vector<Buffer> b = plan.buffers;
  std::sort(b.begin(), b.end(), [](const Buffer& x, const Buffer& y) { return x.bytes > y.bytes; });
  std::string big;
  for (std::size_t i = 0; i < std::min<std::size_t>(5, b.size()); ++i) {
    const Value& v = g.value(b[i].value);
    big += fmt::format("{}%{} {} {} ({})", i ? ", " : "", v.name, shape_string(v.shape),
                       isa::name(v.dtype), bytes_string(b[i].bytes));
  }
  throw Error(
      fmt::format("graph {} does not fit {}: it needs {} (params and inputs {}, activations and "
                  "temporaries {}, optimizer state {}); largest tensors: {}",
                  g.name(), where, bytes_string(plan.total()), bytes_string(plan.persistent_bytes),
                  bytes_string(plan.arena_bytes - plan.persistent_bytes),
                  bytes_string(plan.optimizer_bytes), big));
}

std::string plan_table(const Graph& g, const MemoryPlan& plan, int top) {
  std::string out;
  out += fmt::format("HBM plan: {} in all\n", bytes_string(plan.total()));
  out += fmt::format("  params and inputs        {:>12}  ({} parameters)\n",
                     bytes_string(plan.persistent_bytes), plan.param_elements);
  out += fmt::format("  activations, temporaries {:>12}  (peak live {})\n",
                     bytes_string(plan.arena_bytes - plan.persistent_bytes),
                     bytes_string(plan.transient_peak));
  if (plan.optimizer_bytes)
    out += fmt::format("  optimizer state          {:>12}\n", bytes_string(plan.optimizer_bytes));
  if (plan.temps_counted)
    out += fmt::format("  between launches (peak)  {:>12}\n", bytes_string(plan.temp_peak));
  else
    out += "  (buffers between launches are counted after lowering: --estimate)\n";
  std::vector<Buffer> b = plan.buffers;
  std::sort(b.begin(), b.end(), [](const Buffer& x, const Buffer& y) { return x.bytes > y.bytes; });
  out += fmt::format("  largest tensors:\n");
  for (std::size_t i = 0; i < std::min<std::size_t>(static_cast<std::size_t>(top), b.size()); ++i) {
    const Value& v = g.value(b[i].value);
    out += fmt::format("    %{:<28} {:<22} {:<9} {:>11}  kernels {}..{}{}\n", v.name,
                       shape_string(v.shape), isa::name(v.dtype), bytes_string(b[i].bytes),
                       b[i].first, b[i].last, b[i].persistent ? " (persistent)" : "");
  }
  return out;
}

}  // namespace tern::graph
