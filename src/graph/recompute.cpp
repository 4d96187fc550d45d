#include "graph/recompute.h"

#include <functional>
#include <map>
#include <set>

#include <fmt/format.h>

#include "util/error.h"

namespace tern::graph {

namespace {

bool cheap(Op op) {
  switch (op) {
    case Op::gelu:
    case Op::gelu_tanh:
    case Op::silu:
    case Op::relu:
    case Op::layernorm:
    case Op::rmsnorm:
    case Op::add:
    case Op::sub:
    case Op::mul:
    case Op::scale:
    case Op::cast:
    case Op::reshape:
      return true;
    default:
      return false;
  }
}

}  // namespace

Graph recompute(const Graph& g, int loss, const std::string& policy) {
  if (policy == "none") return g;
  if (policy != "selective")
    throw Error(fmt::format("recompute '{}': expected none or selective", policy));
  const int fwd_end = g.value(loss).node;
  const int nodes = static_cast<int>(g.nodes().size());
  // Forward values the backward reads, and values any reader outside the
  // forward keeps alive anyway.
  std::set<int> read_by_backward;
  for (int i = fwd_end + 1; i < nodes; ++i)
    for (int v : g.node(i).inputs) read_by_backward.insert(v);
  for (int v : g.outputs()) read_by_backward.insert(v);
  // Recomputed: cheap forward ops whose inputs are leaves, kept for the
  // backward anyway, or recomputed themselves.
  std::set<int> re;
  for (int i = 0; i <= fwd_end; ++i) {
    const Node& n = g.node(i);
    if (!cheap(n.op) || n.outputs.size() != 1 || n.outputs[0] == loss) continue;
    bool ok = true;
    for (int v : n.inputs) {
      const Op p = g.node(g.value(v).node).op;
      ok = ok && (is_leaf(p) || read_by_backward.contains(v) || re.contains(v));
    }
    if (ok) re.insert(n.outputs[0]);
  }
  // Only those the backward reads are worth it (or feed one that is).
  std::set<int> wanted;
  std::function<void(int)> want = [&](int v) {
    if (!re.contains(v) || !wanted.insert(v).second) return;
    for (int in : g.node(g.value(v).node).inputs) want(in);
  };
  for (int i = fwd_end + 1; i < nodes; ++i)
    for (int v : g.node(i).inputs) want(v);
  Graph out(g.name());
  std::vector<int> map(g.values().size(), -1);
  std::map<int, int> clone;  // old value -> its recomputed copy
  std::function<int(int)> copy_of = [&](int v) -> int {
    if (!wanted.contains(v)) return map[static_cast<std::size_t>(v)];
    if (const auto it = clone.find(v); it != clone.end()) return it->second;
    const Node& n = g.node(g.value(v).node);
    std::vector<int> ins;
    for (int in : n.inputs) ins.push_back(copy_of(in));
    const int c = out.add1(n.op, ins, n.attrs, g.value(v).name + ".re");
    clone[v] = c;
    return c;
  };
  for (int i = 0; i < nodes; ++i) {
    const Node& n = g.node(i);
    if (n.op == Op::input || n.op == Op::param) {
      map[static_cast<std::size_t>(n.outputs[0])] = out.copy_leaf(g, n.outputs[0]);
      continue;
    }
    std::vector<int> ins;
    for (int v : n.inputs)
      ins.push_back(i > fwd_end ? copy_of(v) : map[static_cast<std::size_t>(v)]);
    std::vector<std::string> names;
    for (int v : n.outputs) names.push_back(g.value(v).name);
    const std::vector<int> res = out.add(n.op, ins, n.attrs, names);
    for (std::size_t k = 0; k < res.size(); ++k)
      map[static_cast<std::size_t>(n.outputs[k])] = res[k];
  }
  for (int o : g.outputs()) out.mark_output(map[static_cast<std::size_t>(o)]);
  return out;
}

}  // namespace tern::graph
