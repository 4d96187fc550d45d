#include "lower/lower.h"

#include "lower/lowerer.h"

namespace tern::graph::detail {

[[noreturn]] void Lowerer::unsupported(int n, const std::string& why) const {
  throw NotSupported(fmt::format("lowering {} %{}{} (not lowered yet)", op_name(node(n).op),
                                 val(out(n)).name, why.empty() ? "" : ": " + why));
}

// The group's nodes other than views.
std::vector<int> Lowerer::real_nodes(const KernelGroup& k) const {
  std::vector<int> r;
  for (int n : k.nodes)
    if (node(n).op != Op::reshape) r.push_back(n);
  return r;
}

// [rows, last dim] of a value.
std::pair<std::int64_t, std::int64_t> Lowerer::rows_cols(int v) const {
  const Shape& s = val(v).shape;
  const std::int64_t c = s.empty() ? 1 : s.back();
  return {elements(s) / c, c};
}

std::vector<Launch> Lowerer::lower(const KernelGroup& k, int gi) {
  const std::vector<int> nodes = real_nodes(k);
  if (nodes.empty()) return {};  // a view
  Launch l;
  l.group = gi, l.kernel = k.kernel, l.detail = k.detail;
  const Op first = node(nodes[0]).op;
  if (first == Op::cross_entropy || first == Op::cross_entropy_backward) {
    return cross_entropy(nodes, l);
  } else if (const int a = attention_node(nodes); a >= 0) {
    return attention(a, l);  // with the head views the fusion put beside it
  } else if (k.kernel == "flash_attention") {
    return attention_pattern(nodes, l);
  } else if (nodes.size() == 1 && first == Op::cast) {
    const int n = nodes[0];
    const auto [rows, cols] = rows_cols(out(n));
    kernel::CastSpec c;
    c.rows = rows, c.cols = cols, c.in = val(node(n).inputs[0]).dtype;
    c.out = val(out(n)).dtype, c.scaled = false, c.amax = false, c.cores = cores_;
    l.detail = fmt::format("{} -> {}", isa::name(c.in), isa::name(c.out));
    l.program = kernel::cast_kernel(chip_, c);
    l.inputs = {{"x", node(n).inputs[0]}};
    l.outputs = {{"y", out(n)}};
  } else if (nodes.size() == 1 && (first == Op::embedding || first == Op::embedding_backward)) {
    return embedding(nodes[0], l);
  } else if (nodes.size() == 1 &&
             (first == Op::rmsnorm_backward || first == Op::layernorm_backward)) {
    return norm_backward(nodes[0], l);
  } else if (nodes.size() == 1 && first == Op::rope) {
    rope(nodes[0], l);
  } else if (nodes.size() == 1 && first == Op::transpose && swaps_last_two(node(nodes[0]))) {
    const Shape& is = val(node(nodes[0]).inputs[0]).shape;
    const std::size_t r = is.size();
    return {transpose_launch(l, node(nodes[0]).inputs[0], {}, {}, out(nodes[0]),
                             elements(is) / (is[r - 1] * is[r - 2]), is[r - 2], is[r - 1],
                             val(out(nodes[0])).dtype)};
  } else if (k.kernel == "glu" || k.kernel == "glu_backward") {
    glu(nodes, l);
  } else if (k.kernel == "elementwise" && nodes.size() > 1) {
    chain(nodes, l);
  } else if (nodes.size() == 1 && (first == Op::add || first == Op::sub || first == Op::mul) &&
             (val(node(nodes[0]).inputs[0]).shape != val(out(nodes[0])).shape ||
              val(node(nodes[0]).inputs[1]).shape != val(out(nodes[0])).shape)) {
    return broadcast_elementwise(nodes[0], l);
  } else if (nodes.size() == 1 &&
             (first == Op::transpose || first == Op::slice || first == Op::pad ||
              first == Op::concat || first == Op::broadcast)) {
    layout(nodes[0], l);
  } else if (nodes.size() == 1 && first == Op::sum) {
    return sum(nodes[0], l);
  } else if (k.kernel == "reduce" && nodes.size() == 2 && first == Op::mul) {
    return sum(nodes[1], l, /*squares=*/true);  // fusion.h: a sum of squares
  } else if (first == Op::adamw) {
    adamw(nodes, l);
  } else if (k.kernel == "matmul") {
    return matmul(nodes, l);
  } else if (k.kernel == "rmsnorm" || k.kernel == "layernorm") {
    norm(nodes, l);
  } else if (nodes.size() == 1 && (first == Op::softmax || first == Op::softmax_backward)) {
    softmax(nodes[0], l);
  } else if (nodes.size() == 1 &&
             (first == Op::add || first == Op::sub || first == Op::mul || first == Op::scale ||
              act_func(first) != isa::ActFunc::identity || first == Op::act_backward)) {
    elementwise(nodes[0], l);
  } else {
    unsupported(nodes[0], nodes.size() > 1 ? fmt::format("the {} kernel", k.kernel) : "");
  }
  return {l};
}

}  // namespace tern::graph::detail

namespace tern::graph {

using detail::Lowerer;

namespace {

// Every bound value has the kernel tensor's dtype and size: a mismatch
// (e.g. gamma in fp32 beside bf16 activations) is refused here rather than
// failing at run time or reinterpreting bytes.
void check_bindings(const Graph& g, const Launch& l) {
  auto check = [&](const Binding& b) {
    if (b.value < 0) return;
    const Value& v = g.value(b.value);
    const isa::HbmTensor& t = l.program.tensor(b.tensor);
    if (t.dtype != v.dtype)
      throw NotSupported(fmt::format("lowering the {} kernel: %{} is {}, its tensor {} is {}",
                                     l.kernel, v.name, isa::name(v.dtype), b.tensor,
                                     isa::name(t.dtype)));
    if (t.elements() != elements(v.shape))
      throw Error(fmt::format("lowering the {} kernel: %{} has {} elements, its tensor {} {}",
                              l.kernel, v.name, elements(v.shape), b.tensor, t.elements()));
  };
  for (const Binding& b : l.inputs) check(b);
  for (const Binding& b : l.outputs) check(b);
}

}  // namespace

Executable compile(const Graph& g, const arch::ChipSpec& chip, const CompileOptions& opt) {
  Executable e{g, fuse(g), {}, {}, chip.name, {}, {}};
  e.plan = plan_memory(e.graph, e.fusion);
  if (opt.cores < 0 || opt.cores > chip.cores)
    throw Error(
        fmt::format("compile: cores {}: 0 (all) to {} ({})", opt.cores, chip.cores, chip.name));
  const int cores = opt.cores > 0 ? opt.cores : chip.cores;
  if (cores > chip.cores)
    throw Error(fmt::format("compile: {} cores asked, {} has {}", cores, chip.name, chip.cores));
  if (opt.lnc != 1 && opt.lnc != 2)
    throw Error(fmt::format("compile: lnc must be 1 or 2, got {}", opt.lnc));
  if (opt.lnc == 2 && (chip.core_version < 3 || cores % 2 != 0))
    throw NotSupported(
        fmt::format("lnc 2 on {} with {} cores (NeuronCore-v3+ and an even core "
                    "count)",
                    chip.name, cores));
  Lowerer lw(e.graph, e.fusion, chip, cores, opt.lnc, opt.fuse_mx);
  e.plan.temps_counted = true;
  for (std::size_t i = 0; i < e.fusion.groups.size(); ++i) {
    try {
      std::vector<Launch> ls = lw.lower(e.fusion.groups[i], static_cast<int>(i));
      for (const Launch& l : ls) check_bindings(e.graph, l);
      lw.commit();
      for (Launch& l : ls) e.launches.push_back(std::move(l));
    } catch (const NotSupported& err) {
      if (!opt.partial) throw;
      e.unlowered.emplace_back(static_cast<int>(i), err.what());
      lw.rollback();
    }
  }
  e.scaling = lw.sites;
  // The buffers launches pass on outside the plan: live from their writer's
  // group to their last reader's; their peak joins the plan's total.
  struct Temp {
    std::int64_t bytes = 0;
    int first = 0, last = 0;
  };
  std::map<std::string, Temp> temps;
  for (const Launch& l : e.launches) {
    for (const Binding& b : l.outputs)
      if (b.value < 0 && b.state.empty())
        temps[b.temp] = {l.program.tensor(b.tensor).bytes(), l.group, l.group};
    for (const Binding& b : l.inputs)
      if (b.value < 0 && b.state.empty())
        if (auto it = temps.find(b.temp); it != temps.end()) it->second.last = l.group;
  }
  std::vector<std::int64_t> live(e.fusion.groups.size() + 1, 0);
  for (const auto& [name, t] : temps)
    for (int gi = t.first; gi <= t.last; ++gi) live[static_cast<std::size_t>(gi)] += t.bytes;
  e.plan.temp_peak = *std::max_element(live.begin(), live.end());
  return e;
}

}  // namespace tern::graph

namespace tern::graph {

std::string CompileOptions::key() const {
  return fmt::format("cores={} lnc={} partial={} fuse_mx={}", cores, lnc, partial, fuse_mx);
}

std::shared_ptr<const Executable> CompileCache::get(const Graph& g, const arch::ChipSpec& chip,
                                                    const CompileOptions& opt) {
  // The chip by name and by the text of the arch file it was loaded from
  // (an edited file under the same name is another chip).
  const std::string key =
      fmt::format("{}\n{}\n{}\n{}", opt.key(), chip.name, chip.source_text, print(g));
  if (const auto it = cache_.find(key); it != cache_.end()) {
    ++hits_;
    return it->second;
  }
  ++misses_;
  auto e = std::make_shared<const Executable>(compile(g, chip, opt));
  cache_.emplace(key, e);
  return e;
}

}  // namespace tern::graph
