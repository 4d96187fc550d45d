// Lowering of elementwise chains, reductions, softmax, cross-entropy, GLU,
// embeddings and the AdamW step.
#include "lower/lowerer.h"

namespace tern::graph::detail {

// Forward and / or backward: scale = dloss / valid, the fused kernel, the
// mean of the per-token losses.
std::vector<Launch> Lowerer::cross_entropy(const std::vector<int>& nodes, const Launch& base) {
  int fwd = -1, bwd = -1;
  for (int n : nodes) (node(n).op == Op::cross_entropy ? fwd : bwd) = n;
  const Node& any = node(fwd >= 0 ? fwd : bwd);
  const int logits = fwd >= 0 ? node(fwd).inputs[0] : node(bwd).inputs[1];
  const int targets = fwd >= 0 ? node(fwd).inputs[1] : node(bwd).inputs[2];
  if (attr_int(any.attrs, "ignore_index", -100) >= 0)
    unsupported(fwd >= 0 ? fwd : bwd, "ignore_index >= 0 (the kernel ignores negative targets)");
  // The kernel folds ln(dloss / valid) into its exponential: dloss must be
  // positive, which holds for the autodiff seed (full 1) scaled by
  // positive factors (e.g. 1 / accumulation steps).
  if (bwd >= 0) {
    int v = node(bwd).inputs[0];
    for (;;) {
      const Node& p = node(val(v).node);
      if (p.op == Op::full && attr_real(p.attrs, "value", 0.0) > 0) break;
      if (p.op == Op::scale && attr_real(p.attrs, "value", 0.0) > 0) {
        v = p.inputs[0];
        continue;
      }
      unsupported(bwd, "a loss gradient not known to be positive");
    }
  }
  const auto [rows, vocab] = rows_cols(logits);
  std::vector<Launch> ls(fwd >= 0 ? 3 : 2, base);
  ls[0].program = kernel::cross_entropy_scale_kernel(chip_, rows);
  ls[0].inputs = {{"targets", targets, {}}};
  if (bwd >= 0)
    ls[0].inputs.push_back({"dloss", node(bwd).inputs[0], {}});
  else
    ls[0].constants = {{"dloss", 1.0f}};
  const std::string gs = tmp(base, "gs"), inv = tmp(base, "inv"), lt = tmp(base, "loss");
  ls[0].outputs = {{"grad_scale", -1, gs}, {"inv_valid", -1, inv}};
  kernel::CrossEntropySpec s;
  s.rows = rows, s.vocab = vocab, s.dtype = val(logits).dtype, s.cores = cores_;
  s.grad_scale_input = true;
  ls[1].program = kernel::cross_entropy_kernel(chip_, s);
  ls[1].inputs = {{"logits", logits, {}}, {"targets", targets, {}}, {"grad_scale", -1, gs}};
  ls[1].outputs = {{"loss", -1, lt}};
  if (bwd >= 0) ls[1].outputs.push_back({"dlogits", out(bwd), {}});
  if (fwd >= 0) {
    ls[2].program = kernel::cross_entropy_mean_kernel(chip_, rows);
    ls[2].inputs = {{"loss", -1, lt}, {"inv_valid", -1, inv}};
    ls[2].outputs = {{"mean", out(fwd), {}}};
  }
  return ls;
}

std::vector<Launch> Lowerer::embedding(int n, const Launch& base) {
  const Node& N = node(n);
  Launch l = base;
  kernel::EmbeddingSpec s;
  s.cores = cores_;
  if (N.op == Op::embedding) {
    const Shape& ts = val(N.inputs[0]).shape;
    s.vocab = ts[0], s.dim = ts[1], s.tokens = elements(val(N.inputs[1]).shape);
    s.dtype = val(N.inputs[0]).dtype;
    l.program = kernel::embedding_kernel(chip_, s);
    l.inputs = {{"ids", N.inputs[1]}, {"table", N.inputs[0]}};
    l.outputs = {{"out", out(n)}};
    return {l};
  }
  const Shape& os = val(out(n)).shape;
  s.vocab = os[0], s.dim = os[1], s.tokens = elements(val(N.inputs[1]).shape);
  s.dtype = val(N.inputs[0]).dtype;
  l.program = kernel::embedding_backward_kernel(chip_, s);
  l.inputs = {{"ids", N.inputs[1]}, {"dout", N.inputs[0]}};
  if (val(out(n)).dtype == DType::fp32) {
    l.outputs = {{"dtable", out(n)}};
    return {l};
  }
  const std::string t = tmp(base, "dtable");
  l.outputs = {{"dtable", -1, t}};
  return {l, cast_launch(base, t, out(n), os[0], os[1], DType::fp32)};
}

// GLU: act(gate) * up in one pass; its backward (the two muls and the
// act_backward) recomputes act(gate) from gate.
void Lowerer::glu(const std::vector<int>& nodes, Launch& l) {
  int act = -1, mul = -1, ab = -1, m1 = -1, m2 = -1;
  for (int n : nodes) {
    const Op op = node(n).op;
    if (act_func(op) != isa::ActFunc::identity) act = n;
    if (op == Op::act_backward) ab = n;
    if (op == Op::mul) (mul < 0 ? mul : m2) = n;
  }
  kernel::GluSpec s;
  s.cores = cores_;
  if (ab < 0) {  // forward
    const int gate = node(act).inputs[0];
    const int up = node(mul).inputs[0] == out(act) ? node(mul).inputs[1] : node(mul).inputs[0];
    const auto [rows, cols] = rows_cols(gate);
    s.rows = rows, s.cols = cols, s.act = act_func(node(act).op), s.dtype = val(gate).dtype;
    l.program = kernel::glu_kernel(chip_, s);
    l.inputs = {{"gate", gate}, {"up", up}};
    l.outputs = {{"out", out(mul)}};
    return;
  }
  // m1 = dy * up feeds act_backward; m2 = dy * act(gate).
  m1 = node(ab).inputs[0] == out(mul) ? mul : m2;
  m2 = m1 == mul ? m2 : mul;
  const int gate = node(ab).inputs[1];
  const Node& M1 = node(m1);
  const Node& M2 = node(m2);
  int dy = -1;
  for (int a : M1.inputs)
    for (int b2 : M2.inputs)
      if (a == b2) dy = a;
  if (dy < 0) unsupported(ab, "a GLU backward whose muls share no gradient");
  const int up = M1.inputs[0] == dy ? M1.inputs[1] : M1.inputs[0];
  const auto [rows, cols] = rows_cols(gate);
  s.rows = rows, s.cols = cols, s.dtype = val(gate).dtype;
  s.act = act_func(parse_op(attr_string(node(ab).attrs, "func", "")));
  l.program = kernel::glu_backward_kernel(chip_, s);
  l.inputs = {{"dout", dy}, {"gate", gate}, {"up", up}};
  l.outputs = {{"dgate", out(ab)}, {"dup", out(m2)}};
}

// A fused elementwise chain: one pass of elementwise_chain_kernel. The
// running value enters each op as its first operand (sub with the running
// value second becomes scale -1, add).
void Lowerer::chain(const std::vector<int>& nodes, Launch& l) {
  kernel::ElementwiseChainSpec s;
  const int first = nodes[0];
  const Shape& os = val(out(first)).shape;
  const auto [rows, cols] = rows_cols(out(first));
  s.rows = rows, s.cols = cols, s.cores = cores_;
  std::vector<int> inputs;
  auto input = [&](int v) {
    if (val(v).shape != os) unsupported(first, "a chain with a broadcast operand");
    if (std::find(nodes.begin(), nodes.end(), val(v).node) != nodes.end())
      unsupported(first, "a chain that reads one of its own results twice");
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i] == v) return static_cast<int>(i);
    inputs.push_back(v);
    return static_cast<int>(inputs.size() - 1);
  };
  int running = -1;
  for (int n : nodes) {
    const Node& N = node(n);
    if (running < 0) {  // the first op: its first operand is the start value
      input(N.inputs[0]);
      s.dtype = val(N.inputs[0]).dtype;
      running = N.inputs[0];
    }
    const bool first_op = n == first;
    const int other = N.inputs.size() > 1 ? (N.inputs[0] == running && !first_op ? N.inputs[1]
                                             : first_op                          ? N.inputs[1]
                                                                                 : N.inputs[0])
                                          : -1;
    switch (N.op) {
      case Op::add:
      case Op::mul:
        s.steps.push_back(
            {N.op == Op::add ? kernel::ElementwiseOp::add : kernel::ElementwiseOp::mul,
             input(other), 1.0f});
        break;
      case Op::sub:
        if (first_op || N.inputs[0] == running) {
          s.steps.push_back({kernel::ElementwiseOp::sub, input(N.inputs[1]), 1.0f});
        } else {
          s.steps.push_back({kernel::ElementwiseOp::scale, 0, -1.0f});
          s.steps.push_back({kernel::ElementwiseOp::add, input(N.inputs[0]), 1.0f});
        }
        break;
      case Op::scale:
        s.steps.push_back({kernel::ElementwiseOp::scale, 0,
                           static_cast<float>(attr_real(N.attrs, "value", 1.0))});
        break;
      case Op::cast:
        break;  // the output dtype
      default:
        if (act_func(N.op) == isa::ActFunc::identity) unsupported(n, "in an elementwise chain");
        s.steps.push_back({kernel::parse_elementwise_op(std::string(op_name(N.op))), 0, 1.0f});
        break;
    }
    running = out(n);
  }
  if (s.steps.empty()) unsupported(first, "a chain of casts");
  s.out = val(running).dtype;
  s.inputs = static_cast<int>(inputs.size());
  for (int v : inputs) s.input_dtypes.push_back(val(v).dtype);
  for (std::size_t i = 0; i < inputs.size(); ++i)
    l.inputs.emplace_back(fmt::format("in{}", i), inputs[i]);
  l.outputs = {{"out", running}};
  l.detail = fmt::format("{} ops in one pass", nodes.size());
  l.program = kernel::elementwise_chain_kernel(chip_, s);
}

// Sums over the leading axes: x^T @ ones on the Tensor engine, or for a
// few rows (k <= kBlockSumRows) Vector adds of the k blocks; over all axes
// (fp32): the reduce kernel, its row tiles spread over the cores, then
// the cores' partials combined in core order.
// squares: n sums x * x, the mul fused (x is the mul's operand).
std::vector<Launch> Lowerer::sum(int n, Launch& l, bool squares) {
  const Node& N = node(n);
  const int x = squares ? node(val(N.inputs[0]).node).inputs[0] : N.inputs[0];
  const Shape& xs = val(x).shape;
  const Shape& os = val(out(n)).shape;
  const DType dt = val(out(n)).dtype;
  const std::int64_t P = chip_.sbuf_partitions;
  if (os.empty()) {
    if (dt != DType::fp32) unsupported(n, "a total in a dtype other than fp32");
    const auto [rows, cols] = rows_cols(x);
    kernel::ReduceSpec s;
    s.rows = rows, s.cols = cols, s.dtype = val(x).dtype, s.all = true;
    if (squares) s.op = kernel::ReduceOp::sumsq;
    s.cores = static_cast<int>(std::min<std::int64_t>(cores_, (rows + P - 1) / P));
    l.program = kernel::reduce_kernel(chip_, s);
    l.inputs = {{"x", x, {}}};
    if (s.cores == 1) {
      l.outputs = {{"out", out(n), {}}};
      return {l};
    }
    const std::string parts = tmp(l, "parts");
    l.outputs = {{"out", -1, parts}};
    l.detail = fmt::format("total over {} cores", s.cores);
    Launch c = l;
    kernel::ReduceSpec t;
    t.rows = s.cores, t.cols = 1, t.dtype = DType::fp32, t.all = true, t.cores = 1;
    c.program = kernel::reduce_kernel(chip_, t);
    c.inputs = {{"x", -1, parts}};
    c.outputs = {{"out", out(n), {}}};
    c.detail = "the cores' partials, in core order";
    return {l, c};
  }
  // The reduced axes must be a leading prefix: then x is [R, rest] row-major.
  std::vector<std::int64_t> axes = attr_ints(N.attrs, "axes");
  for (std::int64_t& a : axes)
    if (a < 0) a += static_cast<std::int64_t>(xs.size());
  std::sort(axes.begin(), axes.end());
  for (std::size_t i = 0; i < axes.size(); ++i)
    if (axes[i] != static_cast<std::int64_t>(i))
      unsupported(n, "a sum other than over the leading axes or all");
  const std::int64_t rest = elements(os), k = elements(xs) / rest;
  if (k <= kBlockSumRows) {
    // Each block is `rest` contiguous elements: viewed as [P, rest / P]
    // where that divides, so that every partition works.
    kernel::BlockSumSpec s;
    s.k = k, s.in = val(N.inputs[0]).dtype, s.out = dt, s.cores = cores_;
    if (rest % P == 0)
      s.rows = P, s.cols = rest / P;
    else
      std::tie(s.rows, s.cols) = rows_cols(out(n));
    l.program = kernel::block_sum_kernel(chip_, s);
    l.inputs = {{"x", N.inputs[0], {}}};
    l.outputs = {{"y", out(n), {}}};
    l.detail = fmt::format("{} blocks added (Vector)", k);
    return {l};
  }
  // Column sums on the Tensor engine, each core a slice of the columns (a
  // ones column stationary, x streaming past it); where a core's slice
  // needs more PSUM banks than there are, x^T @ ones.
  if (kernel::column_sum_fits(chip_, rest, cores_)) {
    kernel::ColumnSumSpec s;
    s.rows = k, s.cols = rest, s.in = val(N.inputs[0]).dtype, s.out = dt, s.cores = cores_;
    l.program = kernel::column_sum_kernel(chip_, s);
    l.inputs = {{"x", N.inputs[0], {}}};
    l.outputs = {{"y", out(n), {}}};
    l.detail = "column sums on the Tensor engine";
    return {l};
  }
  // x^T @ ones: x [R, rest] is the stationary operand in its natural
  // layout (NKI's lhsT), so each matmul fills 128 PE columns with output
  // rows and streams a single column; ones @ x would stream x past one
  // PE column (8x the Tensor-engine time at 512 columns).
  kernel::MatmulSpec s;
  s.m = rest, s.n = 1, s.k = k, s.in = val(N.inputs[0]).dtype, s.out = dt;
  s.trans_a = true, s.trans_b = false, s.cores = cores_;
  l.program = kernel::matmul_kernel(chip_, s);
  l.constants = {{"b", 1.0f}};
  l.inputs = {{"at", N.inputs[0], {}}};
  l.outputs = {{"c", out(n), {}}};
  l.detail = "column sums as x^T @ ones";
  return {l};
}

// AdamW steps (one, or the multi-tensor group) as one launch; each tensor
// as [128, n / 128] when it splits so (all partitions busy), else
// [rows, last dim].
void Lowerer::adamw(const std::vector<int>& nodes, Launch& l) {
  const Node& f = node(nodes[0]);
  kernel::AdamWSpec s;
  s.beta1 = static_cast<float>(attr_real(f.attrs, "beta1", 0.9));
  s.beta2 = static_cast<float>(attr_real(f.attrs, "beta2", 0.999));
  s.eps = static_cast<float>(attr_real(f.attrs, "eps", 1e-8));
  s.grad = val(f.inputs[1]).dtype, s.runtime_scalars = true, s.cores = cores_;
  const bool bf16 = isa::parse_dtype(attr_string(f.attrs, "dtype", "bf16")) == DType::bf16;
  const std::int64_t P = chip_.sbuf_partitions;
  l.inputs = {{"scalars", f.inputs[4]}};
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = node(nodes[i]);
    const std::int64_t e = elements(val(n.inputs[0]).shape);
    s.tensors.push_back(e % P == 0 ? std::pair{P, e / P} : rows_cols(n.inputs[0]));
    const std::string x = fmt::format(".{}", i);
    for (const auto& [t, v] : {std::pair{"param", n.inputs[0]},
                               {"grad", n.inputs[1]},
                               {"m", n.inputs[2]},
                               {"v", n.inputs[3]}})
      l.inputs.push_back({t + x, v});
    for (const auto& [t, v] :
         {std::pair{"param_out", n.outputs[0]}, {"m_out", n.outputs[1]}, {"v_out", n.outputs[2]}})
      l.outputs.push_back({t + x, v});
    l.outputs.push_back({(bf16 ? "param_bf16" : "param_out") + x, n.outputs[3]});
  }
  l.detail = fmt::format("{} tensor{}", nodes.size(), nodes.size() == 1 ? "" : "s");
  l.program = kernel::adamw_kernel(chip_, s);
}

void Lowerer::softmax(int n, Launch& l) {
  const Node& N = node(n);
  const auto [rows, dim] = rows_cols(out(n));
  kernel::SoftmaxSpec s;
  s.rows = rows, s.dim = dim, s.dtype = val(out(n)).dtype, s.cores = cores_;
  if (N.op == Op::softmax) {
    l.inputs = {{"x", N.inputs[0]}};
    l.outputs = {{"y", out(n)}};
    l.program = kernel::softmax_kernel(chip_, s);
  } else {
    l.inputs = {{"dy", N.inputs[0]}, {"y", N.inputs[1]}};
    l.outputs = {{"dx", out(n)}};
    l.program = kernel::softmax_backward_kernel(chip_, s);
  }
}

// `row`: which operand of add / sub / mul is one broadcast row (-1: none).
void Lowerer::elementwise_with(int n, Launch& l, bool broadcast_ok, int row) {
  const Node& N = node(n);
  const auto [rows, cols] = rows_cols(out(n));
  kernel::ElementwiseSpec s;
  s.rows = rows, s.cols = cols, s.dtype = val(out(n)).dtype, s.cores = cores_;
  for (int v : N.inputs)
    if (!broadcast_ok && val(v).shape != val(out(n)).shape) unsupported(n, "broadcasting operands");
  switch (N.op) {
    case Op::add:
    case Op::sub:
    case Op::mul:
      s.op = N.op == Op::add   ? kernel::ElementwiseOp::add
             : N.op == Op::sub ? kernel::ElementwiseOp::sub
                               : kernel::ElementwiseOp::mul;
      l.inputs = {{"a", N.inputs[0]}, {"b", N.inputs[1]}};
      if (row >= 0) {  // the row is b (add and mul commute)
        s.b_row = true;
        l.inputs = {{"a", N.inputs[static_cast<std::size_t>(1 - row)]},
                    {"b", N.inputs[static_cast<std::size_t>(row)]}};
      }
      break;
    case Op::scale:
      s.op = kernel::ElementwiseOp::scale;
      s.alpha = static_cast<float>(attr_real(N.attrs, "value", 1.0));
      l.inputs = {{"a", N.inputs[0]}};
      break;
    case Op::act_backward:
      s.op = kernel::parse_elementwise_op(attr_string(N.attrs, "func", "") + "_backward");
      l.inputs = {{"a", N.inputs[1]}, {"b", N.inputs[0]}};  // a = x, b = dy
      break;
    default:
      s.op = kernel::parse_elementwise_op(std::string(op_name(N.op)));
      l.inputs = {{"a", N.inputs[0]}};
      break;
  }
  l.outputs = {{"out", out(n)}};
  l.detail = kernel::to_string(s.op);
  l.program = kernel::elementwise_kernel(chip_, s);
}

}  // namespace tern::graph::detail
