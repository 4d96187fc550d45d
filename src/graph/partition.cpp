#include "graph/partition.h"

#include <map>
#include <set>

#include <fmt/format.h>

#include "util/error.h"

namespace tern::graph {

Graph extract(const Graph& g, const std::vector<std::string>& cut,
              const std::vector<std::string>& outputs, const std::string& name) {
  auto id = [&g](const std::string& n) {
    const int v = g.find(n);
    if (v < 0) throw Error(fmt::format("graph {}: no value %{} to cut at", g.name(), n));
    return v;
  };
  std::set<int> given;
  for (const std::string& n : cut) given.insert(id(n));
  // The nodes the outputs need, walking back from them to the cut.
  std::vector<bool> needed(g.nodes().size(), false);
  std::vector<int> stack;
  for (const std::string& n : outputs) stack.push_back(id(n));
  while (!stack.empty()) {
    const int v = stack.back();
    stack.pop_back();
    if (given.contains(v)) continue;
    const int p = g.value(v).node;
    if (needed[static_cast<std::size_t>(p)]) continue;
    needed[static_cast<std::size_t>(p)] = true;
    for (int in : g.node(p).inputs) stack.push_back(in);
  }
  Graph r(name);
  std::map<int, int> to;  // g's value -> r's
  for (int v : given) {
    const Value& val = g.value(v);
    to[v] = r.input(val.name, val.shape, val.dtype);
  }
  for (std::size_t i = 0; i < g.nodes().size(); ++i) {
    if (!needed[i]) continue;
    const Node& n = g.nodes()[i];
    if (n.op == Op::input || n.op == Op::param) {
      to[n.outputs[0]] = r.copy_leaf(g, n.outputs[0]);
      continue;
    }
    std::vector<int> ins;
    for (int v : n.inputs) ins.push_back(to.at(v));
    std::vector<std::string> names;
    for (int v : n.outputs) names.push_back(g.value(v).name);
    const std::vector<int> outs = r.add(n.op, ins, n.attrs, names);
    for (std::size_t k = 0; k < outs.size(); ++k) to[n.outputs[k]] = outs[k];
  }
  for (const std::string& n : outputs) r.mark_output(to.at(id(n)));
  return r;
}

}  // namespace tern::graph
