// The graph IR: tensors (values with a shape and a dtype) produced by
// operations (nodes), in SSA form and topological order (a node only uses
// values defined before it). A Graph is what users build (C++ here, Python
// through tern.graph), what autodiff extends with the backward pass, and
// what the compiler lowers to kernels. Its text form (text.h) parses back.
//
// Shapes are row-major, outermost first; every op's output shapes and
// dtypes are inferred when the node is added (ops.h), so a Graph is always
// well-typed: bad input throws tern::Error naming the op and the values.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "isa/dtype.h"

namespace tern::graph {

using isa::DType;
using Shape = std::vector<std::int64_t>;

std::string shape_string(const Shape& s);  // "[8, 128, 768]"
std::int64_t elements(const Shape& s);

// Every operation (ops.cpp documents each one's inputs, attributes, outputs
// and shape rule; docs/graph.md lists them).
enum class Op : std::uint8_t {
  input,  // a tensor fed at run time (activations, token ids, targets)
  param,  // a trained parameter
  full,   // a constant tensor filled with one value
  matmul,
  add,
  sub,
  mul,
  scale,
  gelu,
  gelu_tanh,
  silu,
  relu,
  act_backward,
  rmsnorm,
  rmsnorm_backward,
  layernorm,
  layernorm_backward,
  softmax,
  softmax_backward,
  cross_entropy,
  cross_entropy_backward,
  embedding,
  embedding_backward,
  rope,
  attention,
  attention_backward,
  reshape,
  transpose,
  slice,
  pad,
  concat,
  cast,
  sum,
  broadcast,
  adamw,
  count_,
};
std::string_view op_name(Op op);
// input, param and full: nodes without operands.
inline bool is_leaf(Op op) {
  return op == Op::input || op == Op::param || op == Op::full;
}
// Throws tern::Error "unknown op 'x'" (with the known names) for bad names.
Op parse_op(std::string_view name);

// Attribute values: integers, reals, strings and integer lists.
using Attr = std::variant<std::int64_t, double, std::string, std::vector<std::int64_t>>;
using Attrs = std::map<std::string, Attr>;

struct Value {
  std::string name;  // unique in the graph, without the '%'
  Shape shape;
  DType dtype = DType::fp32;
  int node = -1;  // producer
  int index = 0;  // which of the producer's outputs
};

struct Node {
  Op op = Op::input;
  std::vector<int> inputs;   // value ids
  std::vector<int> outputs;  // value ids
  Attrs attrs;
};

class Graph {
 public:
  explicit Graph(std::string name = "main") : name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const Value& value(int id) const;
  const Node& node(int id) const;
  // The graph's results (loss, gradients, ...), in order.
  const std::vector<int>& outputs() const { return outputs_; }
  // Value id by name (without '%'); -1 when absent.
  int find(std::string_view name) const;

  // Leaves.
  int input(const std::string& name, Shape shape, DType dtype);
  int param(const std::string& name, Shape shape, DType dtype);
  // The same input or param as value v of graph `from` (for passes that
  // rebuild a graph node by node).
  int copy_leaf(const Graph& from, int v);
  // Adds a node; infers its outputs (names: `names`, or fresh "t<N>").
  // Throws tern::Error naming the op and its operands when they do not fit.
  std::vector<int> add(Op op, std::vector<int> inputs, Attrs attrs = {},
                       std::vector<std::string> names = {});
  int add1(Op op, std::vector<int> inputs, Attrs attrs = {}, std::string name = {});
  void mark_output(int value);
  // Training state carried from step to step: after a step, the value of
  // graph output `out` becomes the input or param `in` (same shape and
  // dtype) for the next one (the runtime copies it on the device).
  void carry(int out, int in);
  const std::vector<std::pair<int, int>>& carries() const { return carries_; }
  // Gives value v another unique name (throws when taken or invalid).
  void rename(int v, const std::string& name);
  // Schedules `nodes` as early as their inputs allow: each moves to just
  // after the last producer of its inputs (in the given order among
  // themselves, leaves first), every other node keeps its place. Value ids
  // do not change. Used to accumulate each gradient as soon as it exists.
  void hoist(const std::vector<int>& nodes);

  // Builders, one per op (see ops.cpp for the semantics).
  int matmul(int a, int b, bool trans_a = false, bool trans_b = false);
  int add(int a, int b) { return add1(Op::add, {a, b}); }
  int sub(int a, int b) { return add1(Op::sub, {a, b}); }
  int mul(int a, int b) { return add1(Op::mul, {a, b}); }
  int scale(int x, double c) { return add1(Op::scale, {x}, {{"value", c}}); }
  int act(Op func, int x) { return add1(func, {x}); }
  int rmsnorm(int x, int gamma, double eps = 1e-6);
  int layernorm(int x, int gamma, int beta, double eps = 1e-5);
  int softmax(int x) { return add1(Op::softmax, {x}); }
  // Mean cross-entropy over the tokens whose target != ignore_index.
  int cross_entropy(int logits, int targets, std::int64_t ignore_index = -100);
  int embedding(int table, int ids) { return add1(Op::embedding, {table, ids}); }
  int rope(int x, int cos, int sin) { return add1(Op::rope, {x, cos, sin}); }
  // Returns {o, lse}.
  std::vector<int> attention(int q, int k, int v, bool causal, double softmax_scale);
  int reshape(int x, Shape shape);
  int transpose(int x, std::vector<std::int64_t> perm);
  int slice(int x, std::int64_t axis, std::int64_t start, std::int64_t end);
  int concat(std::vector<int> xs, std::int64_t axis);
  int cast(int x, DType to);
  int full(Shape shape, double value, DType dtype);
  int sum(int x, std::vector<std::int64_t> axes, bool keepdims = false);
  int broadcast(int x, Shape shape);
  // One AdamW step (ops.cpp): {master', m', v', param} of FP32 master
  // weights, a gradient, moments m, v and the step's scalars [5].
  std::vector<int> adamw(int master, int grad, int m, int v, int scalars, double beta1,
                         double beta2, double eps, DType param_dtype);

  std::string fresh_name();

 private:
  int new_value(std::string name, Shape shape, DType dtype, int node, int index);

  std::string name_;
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<int> outputs_;
  std::vector<std::pair<int, int>> carries_;
  std::map<std::string, int, std::less<>> by_name_;
  int counter_ = 0;
};

// Attribute access: the value of `key`, or `fallback` when absent; a value
// of the wrong kind throws tern::Error ("attribute 'axis' must be an
// integer"). Integers read as reals where a real is asked for.
std::int64_t attr_int(const Attrs& a, const std::string& key, std::int64_t fallback);
double attr_real(const Attrs& a, const std::string& key, double fallback);
std::vector<std::int64_t> attr_ints(const Attrs& a, const std::string& key);  // {} when absent
std::string attr_string(const Attrs& a, const std::string& key, const std::string& fallback);

}  // namespace tern::graph
