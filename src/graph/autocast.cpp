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

// The LM heads: matmuls whose result reaches cross_entropy through
// reshapes, transposes and casts.
std::vector<bool> lm_heads(const Graph& g) {
  std::vector<std::vector<int>> users(g.values().size());
  for (std::size_t i = 0; i < g.nodes().size(); ++i)
    for (int v : g.nodes()[i].inputs)
      users[static_cast<std::size_t>(v)].push_back(static_cast<int>(i));
  std::vector<bool> head(g.nodes().size(), false);
  for (std::size_t i = 0; i < g.nodes().size(); ++i) {
    if (g.nodes()[i].op != Op::matmul) continue;
    std::vector<int> frontier{g.nodes()[i].outputs[0]};
    while (!frontier.empty() && !head[i]) {
      const int v = frontier.back();
      frontier.pop_back();
      for (int u : users[static_cast<std::size_t>(v)]) {
        const Op op = g.nodes()[static_cast<std::size_t>(u)].op;
        if (op == Op::cross_entropy) head[i] = true;
        if (op == Op::reshape || op == Op::transpose || op == Op::cast)
          frontier.push_back(g.nodes()[static_cast<std::size_t>(u)].outputs[0]);
      }
    }
  }
  return head;
}

}  // namespace

AutocastOptions parse_autocast(const std::string& mode, const std::string& type) {
  AutocastOptions o;
  if (mode != "none" && mode != "matmult" && mode != "all")
    throw Error(fmt::format("autocast '{}': expected none, matmult or all (or a recipe: {})", mode,
                            kRecipes));
  o.mode = mode;
  o.type = isa::parse_dtype(type);
  if (o.type == DType::fp8_e4m3) {
    // Per-tensor E4M3 operands with current scaling; the rest in BF16.
    o.type = DType::bf16;
    o.quant.a = o.quant.b = o.quant.grad = parse_operand_quant("fp8_e4m3");
    return o;
  }
  if (o.type != DType::bf16 && o.type != DType::fp16)
    throw Error(
        fmt::format("autocast type {}: expected bf16, fp16 or fp8_e4m3", isa::name(o.type)));
  return o;
}

AutocastOptions recipe(const std::string& name, const std::string& mx_policy) {
  AutocastOptions o;
  o.mode = "all", o.type = DType::bf16, o.recipe = name;
  o.quant.policy = num::parse_scale_policy(mx_policy);
  if (name == "bf16") return o;
  if (name == "fp8-hybrid") {
    o.quant.a = o.quant.b = parse_operand_quant("fp8_e4m3");
    o.quant.grad = parse_operand_quant("fp8_e5m2");
  } else if (name == "mxfp8" || name == "mxfp4") {
    o.quant.a = o.quant.b = o.quant.grad = parse_operand_quant("mxfp8_e4m3");
    o.mxfp4_weights = name == "mxfp4";
  } else {
    throw Error(fmt::format("unknown precision recipe '{}' (recipes: {})", name, kRecipes));
  }
  return o;
}

void set_fp8_scaling(AutocastOptions& o, const std::string& scaling, std::int64_t history) {
  if (scaling != "current" && scaling != "delayed")
    throw Error(fmt::format("FP8 scaling '{}': expected current or delayed", scaling));
  if (history < 1) throw Error(fmt::format("amax history must be >= 1, got {}", history));
  const bool fp8 = o.quant.a.kind == QuantKind::fp8_tensor;
  if (scaling == "delayed" && !fp8)
    throw Error(
        "delayed scaling is for per-tensor FP8 operands (the fp8-hybrid recipe or autocast type "
        "fp8_e4m3); MX blocks carry their own scales");
  o.quant.delayed = scaling == "delayed", o.quant.history = history;
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
    // (The cast's own fresh name may be `name` itself: then it is free.
    // Appending digits to an automatic "t<N>" name would make another
    // automatic name, so the suffix is ".<k>".)
    for (int k = 1; out.find(n) >= 0 && out.find(n) != c; ++k) n = fmt::format("{}.{}", name, k);
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
  const std::vector<bool> head = lm_heads(g);
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
        if (n.op == Op::rope && i > 0) continue;                 // cos / sin tables stay fp32
        ins[i] = as(ins[i], want);
      }
    }
    std::vector<std::string> names;
    for (int v : n.outputs) names.push_back(g.value(v).name);
    Attrs attrs = n.attrs;
    const std::size_t ni = static_cast<std::size_t>(&n - g.nodes().data());
    auto is_param = [&](int v) { return g.node(g.value(v).node).op == Op::param; };
    auto kept_high = [&] {
      for (int v : n.inputs)
        if (is_param(v))
          for (const std::string& p : opt.keep_high)
            if (g.value(v).name.starts_with(p)) return true;
      return false;
    };
    if (opt.quant.any() && n.op == Op::matmul && g.value(n.inputs[1]).shape.size() == 2 &&
        !head[ni] && !kept_high()) {
      MatmulQuant q = opt.quant;
      if (opt.mxfp4_weights) {
        const OperandQuant w = parse_operand_quant("mxfp4");
        if (is_param(n.inputs[0])) q.a = w;
        if (is_param(n.inputs[1])) q.b = w;
      }
      set_matmul_quant(attrs, q);
    }
    const std::vector<int> res = out.add(n.op, ins, attrs, names);
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
