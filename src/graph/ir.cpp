#include "graph/ir.h"

#include <algorithm>
#include <array>
#include <cctype>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/ops.h"
#include "util/error.h"

namespace tern::graph {

namespace {

constexpr std::array<std::string_view, static_cast<std::size_t>(Op::count_)> kNames = {
    "input",
    "param",
    "full",
    "matmul",
    "add",
    "sub",
    "mul",
    "scale",
    "gelu",
    "gelu_tanh",
    "silu",
    "relu",
    "act_backward",
    "rmsnorm",
    "rmsnorm_backward",
    "layernorm",
    "layernorm_backward",
    "softmax",
    "softmax_backward",
    "cross_entropy",
    "cross_entropy_backward",
    "embedding",
    "embedding_backward",
    "rope",
    "attention",
    "attention_backward",
    "reshape",
    "transpose",
    "slice",
    "pad",
    "concat",
    "cast",
    "sum",
    "broadcast",
    "adamw"};

bool valid_name(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.') return false;
  return true;
}

}  // namespace

std::string shape_string(const Shape& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

std::int64_t elements(const Shape& s) {
  std::int64_t n = 1;
  for (std::int64_t d : s) n *= d;
  return n;
}

std::string_view op_name(Op op) {
  return kNames[static_cast<std::size_t>(op)];
}

Op parse_op(std::string_view name) {
  for (std::size_t i = 0; i < kNames.size(); ++i)
    if (kNames[i] == name) return static_cast<Op>(i);
  throw Error(fmt::format("unknown op '{}'; known: {}", name, fmt::join(kNames, ", ")));
}

const Value& Graph::value(int id) const {
  if (id < 0 || id >= static_cast<int>(values_.size()))
    throw Error(fmt::format("graph {}: no value #{}", name_, id));
  return values_[static_cast<std::size_t>(id)];
}

const Node& Graph::node(int id) const {
  if (id < 0 || id >= static_cast<int>(nodes_.size()))
    throw Error(fmt::format("graph {}: no node #{}", name_, id));
  return nodes_[static_cast<std::size_t>(id)];
}

int Graph::find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

std::string Graph::fresh_name() {
  for (;;) {
    std::string n = fmt::format("t{}", counter_++);
    if (find(n) < 0) return n;
  }
}

int Graph::new_value(std::string name, Shape shape, DType dtype, int node, int index) {
  if (name.empty()) name = fresh_name();
  if (!valid_name(name))
    throw Error(
        fmt::format("graph {}: bad value name '{}' (letters, digits, '_', '.')", name_, name));
  if (find(name) >= 0) throw Error(fmt::format("graph {}: %{} is defined twice", name_, name));
  for (std::int64_t d : shape)
    if (d < 1)
      throw Error(fmt::format("graph {}: %{} has shape {} (dims must be >= 1)", name_, name,
                              shape_string(shape)));
  const int id = static_cast<int>(values_.size());
  values_.push_back({name, std::move(shape), dtype, node, index});
  by_name_.emplace(values_.back().name, id);
  return id;
}

int Graph::input(const std::string& name, Shape shape, DType dtype) {
  const int n = static_cast<int>(nodes_.size());
  const int v = new_value(name, std::move(shape), dtype, n, 0);
  nodes_.push_back({Op::input, {}, {v}, {}});
  return v;
}

int Graph::param(const std::string& name, Shape shape, DType dtype) {
  const int n = static_cast<int>(nodes_.size());
  const int v = new_value(name, std::move(shape), dtype, n, 0);
  nodes_.push_back({Op::param, {}, {v}, {}});
  return v;
}

int Graph::copy_leaf(const Graph& from, int v) {
  const Value& val = from.value(v);
  switch (from.node(val.node).op) {
    case Op::input:
      return input(val.name, val.shape, val.dtype);
    case Op::param:
      return param(val.name, val.shape, val.dtype);
    default:
      throw Error(fmt::format("graph {}: %{} is not an input or param", from.name(), val.name));
  }
}

std::vector<int> Graph::add(Op op, std::vector<int> inputs, Attrs attrs,
                            std::vector<std::string> names) {
  if (op == Op::input || op == Op::param)
    throw Error(
        fmt::format("graph {}: {} nodes are made by Graph::{}", name_, op_name(op), op_name(op)));
  std::vector<const Value*> in;
  for (int i : inputs) in.push_back(&value(i));
  std::vector<OutType> outs;
  try {
    outs = infer(op, in, attrs);
  } catch (const Error& e) {
    std::vector<std::string> args;
    for (const Value* v : in) args.push_back("%" + v->name);
    throw Error(
        fmt::format("graph {}: {} {}: {}", name_, op_name(op), fmt::join(args, ", "), e.what()));
  }
  if (!names.empty() && names.size() != outs.size())
    throw Error(fmt::format("graph {}: {} gives {} outputs, {} names given", name_, op_name(op),
                            outs.size(), names.size()));
  const int n = static_cast<int>(nodes_.size());
  Node node{op, std::move(inputs), {}, std::move(attrs)};
  for (std::size_t i = 0; i < outs.size(); ++i)
    node.outputs.push_back(new_value(names.empty() ? std::string{} : names[i],
                                     std::move(outs[i].shape), outs[i].dtype, n,
                                     static_cast<int>(i)));
  nodes_.push_back(std::move(node));
  return nodes_.back().outputs;
}

int Graph::add1(Op op, std::vector<int> inputs, Attrs attrs, std::string name) {
  std::vector<std::string> names;
  if (!name.empty()) names.push_back(std::move(name));
  const std::vector<int> out = add(op, std::move(inputs), std::move(attrs), std::move(names));
  if (out.size() != 1)
    throw Error(fmt::format("graph {}: {} has {} outputs", name_, op_name(op), out.size()));
  return out[0];
}

void Graph::mark_output(int v) {
  value(v);
  outputs_.push_back(v);
}

void Graph::carry(int out, int in) {
  const Value &o = value(out), &i = value(in);
  const Op op = node(i.node).op;
  if (op != Op::input && op != Op::param)
    throw Error(fmt::format("graph {}: carry %{} -> %{}: %{} is not an input or param", name_,
                            o.name, i.name, i.name));
  if (o.shape != i.shape || o.dtype != i.dtype)
    throw Error(fmt::format("graph {}: carry %{} -> %{}: {} {} does not fit {} {}", name_, o.name,
                            i.name, shape_string(o.shape), isa::name(o.dtype),
                            shape_string(i.shape), isa::name(i.dtype)));
  for (const auto& [a, b] : carries_)
    if (b == in) throw Error(fmt::format("graph {}: %{} is carried into twice", name_, i.name));
  if (std::find(outputs_.begin(), outputs_.end(), out) == outputs_.end()) mark_output(out);
  carries_.emplace_back(out, in);
}

std::vector<int> Graph::adamw(int master, int grad, int m, int v, int scalars, double beta1,
                              double beta2, double eps, DType param_dtype) {
  return add(Op::adamw, {master, grad, m, v, scalars},
             {{"beta1", beta1},
              {"beta2", beta2},
              {"eps", eps},
              {"dtype", std::string(isa::name(param_dtype))}});
}

void Graph::hoist(const std::vector<int>& nodes) {
  const std::size_t n = nodes_.size();
  std::vector<char> moving(n, 0), placed(n, 0);
  for (int k : nodes) {
    node(k);  // throws for an unknown node
    moving[static_cast<std::size_t>(k)] = 1;
  }
  std::vector<int> order;
  order.reserve(n);
  auto ready = [&](int k) {
    for (int v : node(k).inputs)
      if (!placed[static_cast<std::size_t>(value(v).node)]) return false;
    return true;
  };
  std::vector<int> pending(nodes.begin(), nodes.end());
  auto place = [&](int k) {
    order.push_back(k);
    placed[static_cast<std::size_t>(k)] = 1;
  };
  // Places every pending node whose inputs exist, until none does.
  auto drain = [&] {
    for (bool again = true; again;) {
      again = false;
      for (std::size_t i = 0; i < pending.size(); ++i)
        if (pending[i] >= 0 && ready(pending[i])) {
          place(pending[i]);
          pending[i] = -1;
          again = true;
        }
    }
  };
  drain();
  for (std::size_t k = 0; k < n; ++k) {
    if (moving[k]) continue;
    place(static_cast<int>(k));
    drain();
  }
  if (order.size() != n) throw Error(fmt::format("graph {}: hoist left nodes behind", name_));
  std::vector<Node> reordered;
  reordered.reserve(n);
  std::vector<int> at(n);
  for (std::size_t i = 0; i < n; ++i) {
    at[static_cast<std::size_t>(order[i])] = static_cast<int>(i);
    reordered.push_back(std::move(nodes_[static_cast<std::size_t>(order[i])]));
  }
  nodes_ = std::move(reordered);
  for (Value& v : values_) v.node = at[static_cast<std::size_t>(v.node)];
}

void Graph::rename(int v, const std::string& name) {
  const std::string old = value(v).name;
  if (old == name) return;
  if (!valid_name(name))
    throw Error(
        fmt::format("graph {}: bad value name '{}' (letters, digits, '_', '.')", name_, name));
  if (find(name) >= 0) throw Error(fmt::format("graph {}: %{} is defined twice", name_, name));
  by_name_.erase(by_name_.find(old));
  values_[static_cast<std::size_t>(v)].name = name;
  by_name_.emplace(name, v);
}

int Graph::matmul(int a, int b, bool trans_a, bool trans_b) {
  Attrs at;
  if (trans_a) at["trans_a"] = std::int64_t{1};
  if (trans_b) at["trans_b"] = std::int64_t{1};
  return add1(Op::matmul, {a, b}, std::move(at));
}

int Graph::rmsnorm(int x, int gamma, double eps) {
  return add1(Op::rmsnorm, {x, gamma}, {{"eps", eps}});
}

int Graph::layernorm(int x, int gamma, int beta, double eps) {
  return add1(Op::layernorm, {x, gamma, beta}, {{"eps", eps}});
}

int Graph::cross_entropy(int logits, int targets, std::int64_t ignore_index) {
  return add1(Op::cross_entropy, {logits, targets}, {{"ignore_index", ignore_index}});
}

std::vector<int> Graph::attention(int q, int k, int v, bool causal, double softmax_scale) {
  return add(Op::attention, {q, k, v},
             {{"causal", std::int64_t{causal ? 1 : 0}}, {"scale", softmax_scale}});
}

int Graph::reshape(int x, Shape shape) {
  return add1(Op::reshape, {x}, {{"shape", std::move(shape)}});
}

int Graph::transpose(int x, std::vector<std::int64_t> perm) {
  return add1(Op::transpose, {x}, {{"perm", std::move(perm)}});
}

int Graph::slice(int x, std::int64_t axis, std::int64_t start, std::int64_t end) {
  return add1(Op::slice, {x}, {{"axis", axis}, {"start", start}, {"end", end}});
}

int Graph::concat(std::vector<int> xs, std::int64_t axis) {
  return add1(Op::concat, std::move(xs), {{"axis", axis}});
}

int Graph::cast(int x, DType to) {
  return add1(Op::cast, {x}, {{"dtype", std::string(isa::name(to))}});
}

int Graph::full(Shape shape, double value, DType dtype) {
  return add1(
      Op::full, {},
      {{"shape", std::move(shape)}, {"value", value}, {"dtype", std::string(isa::name(dtype))}});
}

int Graph::sum(int x, std::vector<std::int64_t> axes, bool keepdims) {
  Attrs a{{"axes", std::move(axes)}};
  if (keepdims) a["keepdims"] = std::int64_t{1};
  return add1(Op::sum, {x}, std::move(a));
}

int Graph::broadcast(int x, Shape shape) {
  return add1(Op::broadcast, {x}, {{"shape", std::move(shape)}});
}

std::int64_t attr_int(const Attrs& a, const std::string& key, std::int64_t fallback) {
  const auto it = a.find(key);
  if (it == a.end()) return fallback;
  if (const auto* v = std::get_if<std::int64_t>(&it->second)) return *v;
  throw Error(fmt::format("attribute '{}' must be an integer", key));
}

double attr_real(const Attrs& a, const std::string& key, double fallback) {
  const auto it = a.find(key);
  if (it == a.end()) return fallback;
  if (const auto* v = std::get_if<double>(&it->second)) return *v;
  if (const auto* v = std::get_if<std::int64_t>(&it->second)) return static_cast<double>(*v);
  throw Error(fmt::format("attribute '{}' must be a number", key));
}

std::vector<std::int64_t> attr_ints(const Attrs& a, const std::string& key) {
  const auto it = a.find(key);
  if (it == a.end()) return {};
  if (const auto* v = std::get_if<std::vector<std::int64_t>>(&it->second)) return *v;
  throw Error(fmt::format("attribute '{}' must be a list of integers", key));
}

std::string attr_string(const Attrs& a, const std::string& key, const std::string& fallback) {
  const auto it = a.find(key);
  if (it == a.end()) return fallback;
  if (const auto* v = std::get_if<std::string>(&it->second)) return *v;
  throw Error(fmt::format("attribute '{}' must be a name", key));
}

}  // namespace tern::graph
