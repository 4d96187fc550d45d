#include "graph/autocast.h"

#include <map>
#include <set>

#include <fmt/format.h>

#include "util/error.h"

namespace tern::graph {

namespace {

// Ops that keep their inputs' precision under "all".
bool keeps_precision(Op op) {
  switch (op) {
    case Op::rmsnorm:
    case Op::layernorm:
    case Op::rmsnorm_backward:
    case Op::layernorm_backward:
    case Op::softmax:
    case Op::softmax_backward:
    case Op::cross_entropy:
    case Op::cross_entropy_backward:
    case Op::embedding:
    case Op::embedding_backward:
      return true;
    default:
      return false;
  }
}

// Ops that move data and compute nothing: they follow their input.
bool moves_data(Op op) {
  return op == Op::reshape || op == Op::transpose || op == Op::slice || op == Op::pad ||
         op == Op::concat || op == Op::broadcast || op == Op::cast;
}

bool is_float_value(const Value& v) {
  return isa::is_float(v.dtype) && !isa::is_x4(v.dtype);
}

}  // namespace

AutocastOptions parse_autocast(const std::string& mode, const std::string& type) {
  AutocastOptions o;
  if (mode != "none" && mode != "matmult" && mode != "all")
    throw Error(fmt::format("autocast '{}': expected none, matmult or all", mode));
  o.mode = mode;
  o.type = isa::parse_dtype(type);
  if (isa::is_fp8(o.type))
    throw NotSupported(fmt::format(
        "autocast to {}: FP8 needs per-tensor scales (the fp8-hybrid recipe), not a plain cast",
        isa::name(o.type)));
  if (o.type != DType::bf16 && o.type != DType::fp16)
    throw Error(fmt::format("autocast type {}: expected bf16 or fp16", isa::name(o.type)));
  return o;
}

Graph autocast(const Graph& g, const AutocastOptions& opt) {
  if (opt.mode == "none") return g;
  Graph out(g.name());
  std::vector<int> map(g.values().size(), -1);
  std::map<std::pair<int, DType>, int> casts;  // (new value, dtype) -> its cast
  // Inserted casts are named "<value>.ac_<dtype>" at once (a fresh "t<N>"
  // name could be one that a later node of g brings).
  auto named_cast = [&](int v, DType d, const std::string& name) {
    const int c = out.cast(v, d);
    std::string n = name;
    for (int k = 1; out.find(n) >= 0; ++k) n = fmt::format("{}{}", name, k);
    out.rename(c, n);
    return c;
  };
  auto as = [&](int v, DType d) {
    const Value& nv = out.value(v);
    if (!is_float_value(nv) || nv.dtype == d) return v;
    const auto key = std::make_pair(v, d);
    if (const auto it = casts.find(key); it != casts.end()) return it->second;
    const int c = named_cast(v, d, fmt::format("{}.ac_{}", nv.name, isa::name(d)));
    casts[key] = c;
    return c;
  };
  std::set<int> outputs(g.outputs().begin(), g.outputs().end());
  for (const Node& n : g.nodes()) {
    if (n.op == Op::input || n.op == Op::param) {
      map[static_cast<std::size_t>(n.outputs[0])] = out.copy_leaf(g, n.outputs[0]);
      continue;
    }
    std::vector<int> ins;
    for (int v : n.inputs) ins.push_back(map[static_cast<std::size_t>(v)]);
    const bool low = opt.mode == "all" ? !keeps_precision(n.op) && !moves_data(n.op)
                                       : n.op == Op::matmul || n.op == Op::attention;
    if (!moves_data(n.op) && n.op != Op::full) {
      for (std::size_t i = 0; i < ins.size(); ++i) {
        // Under "all", the ops kept high take their inputs back up.
        const DType want = low ? opt.type : g.value(n.inputs[i]).dtype;
        if (n.op == Op::attention_backward && i == 5) continue;  // lse stays fp32
        ins[i] = as(ins[i], want);
      }
    }
    std::vector<std::string> names;
    for (int v : n.outputs) names.push_back(g.value(v).name);
    const std::vector<int> res = out.add(n.op, ins, n.attrs, names);
    for (std::size_t i = 0; i < res.size(); ++i) {
      const Value& was = g.value(n.outputs[i]);
      int r = res[i];
      // matmult casts results back to what the graph was written in; a
      // graph output keeps its dtype under both modes.
      const bool back = opt.mode == "matmult" || outputs.contains(n.outputs[i]);
      if (back && is_float_value(out.value(r)) && out.value(r).dtype != was.dtype) {
        out.rename(r, fmt::format("{}.ac_{}", was.name, isa::name(out.value(r).dtype)));
        r = named_cast(r, was.dtype, was.name);
      }
      map[static_cast<std::size_t>(n.outputs[i])] = r;
    }
  }
  for (int o : g.outputs()) out.mark_output(map[static_cast<std::size_t>(o)]);
  return out;
}

}  // namespace tern::graph
