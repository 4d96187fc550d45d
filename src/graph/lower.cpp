#include "graph/lower.h"

#include "graph/ops.h"
#include "graph/quant.h"
#include "graph/text.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <tuple>

#include <fmt/format.h>

#include "kernel/kernels.h"
#include "util/error.h"
#include "util/file.h"

namespace tern::graph {

namespace {

isa::ActFunc act_func(Op op) {
  switch (op) {
    case Op::gelu:
      return isa::ActFunc::gelu;
    case Op::gelu_tanh:
      return isa::ActFunc::gelu_tanh;
    case Op::silu:
      return isa::ActFunc::silu;
    case Op::relu:
      return isa::ActFunc::relu;
    default:
      return isa::ActFunc::identity;
  }
}

class Lowerer {
 public:
  std::vector<ScalingSite> sites;  // delayed FP8 scaling sites met so far

  Lowerer(const Graph& g, const FusionReport& f, const arch::ChipSpec& chip, int cores, int lnc)
      : g_(g), f_(f), chip_(chip), cores_(cores), lnc_(lnc) {}

  const Node& node(int n) const { return g_.node(n); }
  const Value& val(int v) const { return g_.value(v); }
  int out(int n) const { return node(n).outputs[0]; }

  [[noreturn]] void unsupported(int n, const std::string& why = {}) const {
    throw NotSupported(fmt::format("lowering {} %{}{} (not lowered yet)", op_name(node(n).op),
                                   val(out(n)).name, why.empty() ? "" : ": " + why));
  }

  // The group's nodes other than views.
  std::vector<int> real_nodes(const KernelGroup& k) const {
    std::vector<int> r;
    for (int n : k.nodes)
      if (node(n).op != Op::reshape) r.push_back(n);
    return r;
  }

  // [rows, last dim] of a value.
  std::pair<std::int64_t, std::int64_t> rows_cols(int v) const {
    const Shape& s = val(v).shape;
    const std::int64_t c = s.empty() ? 1 : s.back();
    return {elements(s) / c, c};
  }

  std::vector<Launch> lower(const KernelGroup& k, int gi) {
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

  // Forward and / or backward: scale = dloss / valid, the fused kernel, the
  // mean of the per-token losses.
  std::vector<Launch> cross_entropy(const std::vector<int>& nodes, const Launch& base) {
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
  static std::string tmp(const Launch& l, const std::string& name) {
    return fmt::format("g{}.{}", l.group, name);
  }
  static std::string stat(int norm_node, const char* what) {
    return fmt::format("norm{}.{}", norm_node, what);
  }

  // The attention or attention_backward node of a group whose other nodes
  // are head views (fusion.h HeadView), or -1.
  int attention_node(const std::vector<int>& nodes) const {
    int a = -1;
    for (int n : nodes)
      if (node(n).op == Op::attention || node(n).op == Op::attention_backward) a = n;
    for (int n : nodes)
      if (n != a && !f_.alias.contains(out(n)) && !f_.absorbed.contains(n)) return -1;
    return a;
  }

  // Attention: the kernels read q and k as [B, H, D, S] (NKI's layout), so
  // both go through batched Tensor-engine transposes first; the backward
  // transposes dq and dk back.
  Launch transpose_launch(const Launch& base, int value, const std::string& in_temp,
                          const std::string& out_temp, int out_value, std::int64_t batch,
                          std::int64_t rows, std::int64_t cols, DType dt) {
    Launch l = base;
    l.kernel = "transpose", l.detail = fmt::format("{} x [{}, {}]", batch, rows, cols);
    l.program = kernel::transpose_kernel(chip_, rows, cols, dt, batch, cores_);
    l.inputs = {{"in", value, in_temp}};
    l.outputs = {{"out", out_value, out_temp}};
    return l;
  }
  // q or k of attention as [B * H, D, S] in a temporary: transposed from the
  // value, or straight from the projection output when it is a head view.
  Launch head_transpose(const Launch& base, int t, const std::string& out_temp) {
    const auto it = f_.views.find(t);
    if (it == f_.views.end()) {
      const Shape& ts = val(t).shape;
      return transpose_launch(base, t, {}, out_temp, -1, ts[0] * ts[1], ts[2], ts[3], val(t).dtype);
    }
    const HeadView& v = it->second;
    kernel::StridedSource src;
    src.elements = elements(val(v.source).shape), src.offset = v.col0, src.row_stride = v.width;
    src.inner = v.heads, src.inner_stride = v.head_dim, src.outer_stride = v.seq * v.width;
    Launch l = base;
    l.kernel = "transpose", l.detail = "head view";
    l.program = kernel::transpose_kernel(chip_, v.seq, v.head_dim, val(t).dtype, v.batch * v.heads,
                                         cores_, &src);
    l.inputs = {{"in", v.source}};
    l.outputs = {{"out", -1, out_temp}};
    return l;
  }
  // v of attention as [B, H, S, D]: the value itself, or a head view copied
  // out of the projection output into `temp` (launch appended to ls).
  Binding head_rows(const Launch& base, int t, const std::string& temp, std::vector<Launch>& ls) {
    const auto it = f_.views.find(t);
    if (it == f_.views.end()) return Binding("v", t);
    const HeadView& v = it->second;
    kernel::LayoutCopySpec c;
    c.rows = v.batch * v.heads * v.seq, c.cols = v.head_dim, c.dtype = val(t).dtype;
    c.cores = cores_, c.input_elements = {elements(val(v.source).shape)};
    for (std::int64_t b = 0; b < v.batch; ++b)
      for (std::int64_t h = 0; h < v.heads; ++h)
        c.runs.push_back({0, (b * v.heads + h) * v.seq, v.seq,
                          b * v.seq * v.width + v.col0 + h * v.head_dim, v.width, 0, v.head_dim});
    Launch l = base;
    l.kernel = "copy", l.detail = "head view";
    l.program = kernel::layout_copy_kernel(chip_, c);
    l.inputs = {{"in0", v.source}};
    l.outputs = {{"out", -1, temp}};
    ls.push_back(std::move(l));
    return Binding("v", -1, temp);
  }
  kernel::AttentionSpec attention_spec(const Node& n, int q, int k) const {
    const Shape &qs = val(q).shape, &ks = val(k).shape;
    kernel::AttentionSpec s;
    s.batch = qs[0], s.q_heads = qs[1], s.kv_heads = ks[1], s.seq_q = qs[2], s.seq_k = ks[2];
    s.head_dim = qs[3], s.causal = attr_int(n.attrs, "causal", 1) != 0;
    s.scale = static_cast<float>(
        attr_real(n.attrs, "scale", 1.0 / std::sqrt(static_cast<double>(qs[3]))));
    s.dtype = val(q).dtype, s.cores = cores_;
    return s;
  }
  std::vector<Launch> attention(int n, const Launch& base) {
    const Node& N = node(n);
    const bool bwd = N.op == Op::attention_backward;
    const int q = N.inputs[bwd ? 1 : 0], k = N.inputs[bwd ? 2 : 1], v = N.inputs[bwd ? 3 : 2];
    const Shape &qs = val(q).shape, &ks = val(k).shape;
    kernel::AttentionSpec s = attention_spec(N, q, k);
    const DType dt = val(q).dtype;
    // o in its head merge's buffer, dO read from its gradient's head split.
    const int o = bwd ? N.inputs[4] : N.outputs[0];
    int o_at = o, do_at = bwd ? N.inputs[0] : -1;
    if (const auto it = f_.stored_in.find(o); it != f_.stored_in.end())
      o_at = it->second, s.o_width = s.q_heads * s.head_dim;
    if (bwd)
      if (const auto it = f_.views.find(do_at); it != f_.views.end())
        do_at = it->second.source, s.do_width = it->second.width;
    std::vector<Launch> ls;
    const std::string qt = tmp(base, "qT"), kt = tmp(base, "kT");
    ls.push_back(head_transpose(base, q, qt));
    ls.push_back(head_transpose(base, k, kt));
    const Binding vb = head_rows(base, v, tmp(base, "v"), ls);
    Launch l = base;
    if (!bwd) {
      l.program = kernel::flash_attention_kernel(chip_, s);
      l.inputs = {{"q", -1, qt}, {"k", -1, kt}, vb};
      l.outputs = {{"o", o_at}, {"lse", N.outputs[1]}};
      ls.push_back(std::move(l));
      return ls;
    }
    l.inputs = {{"q", -1, qt}, {"k", -1, kt}, vb, {"o", o_at}, {"do", do_at}, {"lse", N.inputs[5]}};
    if (const auto it = f_.qkv_grads.find(n); it != f_.qkv_grads.end()) {
      kernel::AttentionSpec m = s;
      m.qkv_width = it->second.width;
      m.q_col = it->second.col[0], m.k_col = it->second.col[1], m.v_col = it->second.col[2];
      l.detail = "dq, dk, dv into the qkv gradient";
      l.program = kernel::flash_attention_backward_kernel(chip_, m);
      l.outputs = {{"dqkv", it->second.dest}};
      ls.push_back(std::move(l));
      return ls;
    }
    const std::string dqt = tmp(base, "dqT"), dkt = tmp(base, "dkT");
    l.program = kernel::flash_attention_backward_kernel(chip_, s);
    l.outputs = {{"dq", -1, dqt}, {"dk", -1, dkt}, {"dv", N.outputs[2]}};
    ls.push_back(std::move(l));
    ls.push_back(
        transpose_launch(base, -1, dqt, {}, N.outputs[0], qs[0] * qs[1], qs[3], qs[2], dt));
    ls.push_back(
        transpose_launch(base, -1, dkt, {}, N.outputs[1], ks[0] * ks[1], ks[3], ks[2], dt));
    return ls;
  }

  // The matmul(q, k^T) [-> scale] -> softmax -> matmul(., v) pattern as
  // non-causal flash attention: q, k, v [..., S, D] with rank 4 [B, H, ..]
  // or 3 [B * H, ..]; lse is kept in a temporary nobody reads.
  std::vector<Launch> attention_pattern(const std::vector<int>& nodes, const Launch& base) {
    int m1 = -1, m2 = -1, sc = -1;
    for (int n : nodes) {
      if (node(n).op == Op::matmul) (m1 < 0 ? m1 : m2) = n;
      if (node(n).op == Op::scale) sc = n;
    }
    const int q = node(m1).inputs[0], k = node(m1).inputs[1], v = node(m2).inputs[1];
    const Shape &qs = val(q).shape, &ks = val(k).shape;
    if (qs.size() < 3 || qs.size() > 4 || val(v).shape != ks)
      unsupported(m1, "an attention pattern other than [B, H, S, D] or [B * H, S, D]");
    const bool r4 = qs.size() == 4;
    kernel::AttentionSpec s;
    s.batch = r4 ? qs[0] : 1, s.q_heads = r4 ? qs[1] : qs[0], s.kv_heads = s.q_heads;
    s.seq_q = qs[qs.size() - 2], s.seq_k = ks[ks.size() - 2], s.head_dim = qs.back();
    s.causal = false, s.dtype = val(q).dtype, s.cores = cores_;
    s.scale = sc >= 0 ? static_cast<float>(attr_real(node(sc).attrs, "value", 1.0)) : 1.0f;
    const std::string qt = tmp(base, "qT"), kt = tmp(base, "kT");
    const std::int64_t bh = s.batch * s.q_heads;
    std::vector<Launch> ls{
        transpose_launch(base, q, {}, qt, -1, bh, s.seq_q, s.head_dim, s.dtype),
        transpose_launch(base, k, {}, kt, -1, bh, s.kv_len(), s.head_dim, s.dtype)};
    Launch l = base;
    l.program = kernel::flash_attention_kernel(chip_, s);
    l.inputs = {{"q", -1, qt}, {"k", -1, kt}, {"v", v}};
    l.outputs = {{"o", out(m2)}, {"lse", -1, tmp(base, "lse")}};
    ls.push_back(std::move(l));
    return ls;
  }

  void rope(int n, Launch& l) {
    const Node& N = node(n);
    const Shape& xs = val(N.inputs[0]).shape;
    kernel::RopeSpec s;
    s.batch = xs[0], s.heads = xs[1], s.seq = xs[2], s.head_dim = xs[3];
    s.dtype = val(N.inputs[0]).dtype, s.backward = attr_int(N.attrs, "inverse", 0) != 0;
    s.cores = cores_;
    if (val(N.inputs[1]).dtype != DType::fp32 || val(N.inputs[2]).dtype != DType::fp32)
      unsupported(n, "cos / sin tables other than float32");
    l.program = kernel::rope_kernel(chip_, s);
    l.inputs = {{"x", N.inputs[0]}, {"cos", N.inputs[1]}, {"sin", N.inputs[2]}};
    l.outputs = {{"y", out(n)}};
  }

  // A cast of a temporary into a value (kernel::cast_kernel, unscaled).
  Launch cast_launch(const Launch& base, const std::string& in_temp, int value, std::int64_t rows,
                     std::int64_t cols, DType from) {
    Launch l = base;
    kernel::CastSpec c;
    c.rows = rows, c.cols = cols, c.in = from, c.out = val(value).dtype, c.scaled = false;
    c.amax = false, c.cores = cores_;
    l.kernel = "cast", l.detail = fmt::format("{} -> {}", isa::name(from), isa::name(c.out));
    l.program = kernel::cast_kernel(chip_, c);
    l.inputs = {{"x", -1, in_temp}};
    l.outputs = {{"y", value}};
    return l;
  }

  std::vector<Launch> embedding(int n, const Launch& base) {
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

  // Norm backward: the kernel reads the forward's statistics (kept by the
  // forward launch) and gives per-core partial parameter gradients, summed
  // by ones @ parts on the Tensor engine.
  std::vector<Launch> norm_backward(int n, const Launch& base) {
    const Node& N = node(n);
    const bool ln = N.op == Op::layernorm_backward;
    int fwd = -1;
    for (std::size_t i = 0; i < g_.nodes().size(); ++i) {
      const Node& f = g_.nodes()[i];
      if (static_cast<int>(i) < n && f.op == (ln ? Op::layernorm : Op::rmsnorm) &&
          f.inputs[0] == N.inputs[1] && f.inputs[1] == N.inputs[2])
        fwd = static_cast<int>(i);
    }
    if (fwd < 0) unsupported(n, "without its forward norm in the graph (its statistics)");
    const auto [rows, dim] = rows_cols(N.inputs[1]);
    kernel::RmsNormSpec s;
    s.rows = rows, s.dim = dim, s.cores = cores_, s.dtype = val(N.inputs[1]).dtype;
    s.eps = static_cast<float>(attr_real(N.attrs, "eps", ln ? 1e-5 : 1e-6));
    Launch l = base;
    l.program = ln ? kernel::layernorm_backward_kernel(chip_, s)
                   : kernel::rmsnorm_backward_kernel(chip_, s);
    l.inputs = {{"dy", N.inputs[0]},
                {"h", N.inputs[1]},
                {"gamma", N.inputs[2]},
                {"rstd", -1, stat(fwd, "rstd")}};
    if (ln) l.inputs.emplace_back("mean", -1, stat(fwd, "mean"));
    const std::string dg = tmp(base, "dgamma"), db = tmp(base, "dbeta");
    l.outputs = {{"dh", N.outputs[0]}, {"dgamma_parts", -1, dg}};
    if (ln) l.outputs.emplace_back("dbeta_parts", -1, db);
    std::vector<Launch> ls{l};
    auto colsum = [&](const std::string& parts, int value) {
      Launch c = base;
      kernel::MatmulSpec m;
      m.m = 1, m.n = dim, m.k = cores_, m.in = DType::fp32, m.out = val(value).dtype;
      m.trans_a = true, m.trans_b = false, m.cores = 1;
      c.kernel = "matmul", c.detail = "sum of per-core partials";
      c.program = kernel::matmul_kernel(chip_, m);
      c.constants = {{"at", 1.0f}};
      c.inputs = {{"b", -1, parts}};
      c.outputs = {{"c", value}};
      ls.push_back(std::move(c));
    };
    colsum(dg, N.outputs[1]);
    if (ln) colsum(db, N.outputs[2]);
    return ls;
  }

  // GLU: act(gate) * up in one pass; its backward (the two muls and the
  // act_backward) recomputes act(gate) from gate.
  void glu(const std::vector<int>& nodes, Launch& l) {
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

  // add / sub / mul with a broadcast operand. One row of the last dim's
  // size (a bias) is read by the kernel's broadcast DMA (add and mul either
  // way round, sub when it is subtracted); any other broadcast is first
  // copied to the full shape (a layout copy into a temporary), then one pass.
  std::vector<Launch> broadcast_elementwise(int n, const Launch& base) {
    const Node& N = node(n);
    const Shape& os = val(out(n)).shape;
    Launch e = base;
    for (std::size_t i = 0; i < 2; ++i) {
      const Shape& is = val(N.inputs[i]).shape;
      const bool row = !is.empty() && is.back() == os.back() && elements(is) == os.back() &&
                       val(N.inputs[1 - i]).shape == os;
      if (row && (i == 1 || N.op != Op::sub)) {
        elementwise_with(n, e, true, static_cast<int>(i));
        return {e};
      }
    }
    elementwise_with(n, e, true);
    std::vector<Launch> ls;
    for (std::size_t i = 0; i < 2; ++i) {
      if (val(N.inputs[i]).shape == os) continue;
      const std::string t = tmp(base, fmt::format("bcast{}", i));
      Launch c = base;
      c.kernel = "copy", c.detail = "broadcast";
      c.program = kernel::layout_copy_kernel(chip_, broadcast_spec(N.inputs[i], os));
      c.inputs = {{"in0", N.inputs[i]}};
      c.outputs = {{"out", -1, t}};
      ls.push_back(std::move(c));
      e.inputs[i] = Binding(e.inputs[i].tensor, -1, t);
    }
    ls.push_back(std::move(e));
    return ls;
  }
  kernel::LayoutCopySpec broadcast_spec(int v, const Shape& os) const {
    const Shape& is = val(v).shape;
    const std::size_t r = os.size(), off = r - is.size();
    const std::int64_t C = os.back();
    if (is.empty() || is.back() != C)
      throw NotSupported(fmt::format("lowering a broadcast of %{} {} to {} along the last dim",
                                     val(v).name, shape_string(is), shape_string(os)));
    std::vector<std::int64_t> st(is.size(), 1);
    for (std::size_t i = is.size(); i-- > 1;) st[i - 1] = st[i] * is[i];
    kernel::LayoutCopySpec s;
    s.rows = elements(os) / C, s.cols = C, s.dtype = val(v).dtype, s.cores = cores_;
    s.input_elements = {elements(is)};
    std::vector<std::int64_t> o(r - 1, 0);
    for (std::int64_t row = 0; row < s.rows; ++row) {
      std::int64_t at = 0;
      for (std::size_t k = off; k + 1 < r; ++k)
        if (is[k - off] != 1) at += o[k] * st[k - off];
      kernel::CopyRun* last = s.runs.empty() ? nullptr : &s.runs.back();
      if (last && last->out_row0 + last->rows == row &&
          (last->rows == 1 ||
           at - (last->in0 + (last->rows - 1) * last->in_stride) == last->in_stride) &&
          at >= last->in0 + (last->rows - 1) * last->in_stride) {
        if (last->rows == 1) last->in_stride = at - last->in0;
        ++last->rows;
      } else {
        s.runs.push_back({0, row, 1, at, 0, 0, C});
      }
      for (std::size_t k = o.size(); k-- > 0;) {
        if (++o[k] < os[k]) break;
        o[k] = 0;
      }
    }
    return s;
  }

  // A fused elementwise chain: one pass of elementwise_chain_kernel. The
  // running value enters each op as its first operand (sub with the running
  // value second becomes scale -1, add).
  void chain(const std::vector<int>& nodes, Launch& l) {
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

  // Shape ops as row copies (kernel::layout_copy_kernel): for every output
  // row (a multi-index over the leading dims), the input segments it takes;
  // rows whose segments continue at a constant input stride merge into one
  // run.
  void layout(int n, Launch& l) {
    const Node& N = node(n);
    const Shape& os = val(out(n)).shape;
    const std::size_t r = os.size();
    for (int v : N.inputs)
      if (val(v).shape.empty() || r == 0) unsupported(n, "a shape op on a scalar []");
    const std::int64_t C = os.back(), R = elements(os) / C;
    std::vector<std::vector<std::int64_t>> st;  // row-major strides of each input
    for (int v : N.inputs) {
      const Shape& is = val(v).shape;
      std::vector<std::int64_t> t(is.size(), 1);
      for (std::size_t i = is.size(); i-- > 1;) t[i - 1] = t[i] * is[i];
      st.push_back(t);
    }
    const auto axis = [&](std::int64_t a) {
      return static_cast<std::size_t>((a + static_cast<std::int64_t>(r)) %
                                      static_cast<std::int64_t>(r));
    };
    struct Seg {
      int input;
      std::int64_t in0, col0, len;
    };
    // The segments of output row `o` (its leading multi-index).
    auto segments = [&](const std::vector<std::int64_t>& o, std::vector<Seg>& out_segs) {
      out_segs.clear();
      const Shape& is0 = val(N.inputs[0]).shape;
      switch (N.op) {
        case Op::transpose: {
          const auto perm = attr_ints(N.attrs, "perm");
          if (perm.back() != static_cast<std::int64_t>(r - 1))
            unsupported(n, "a transpose that moves the last dim");
          std::int64_t at = 0;
          for (std::size_t k = 0; k + 1 < r; ++k)
            at += o[k] * st[0][static_cast<std::size_t>(perm[k])];
          out_segs.push_back({0, at, 0, C});
          return;
        }
        case Op::slice:
        case Op::pad: {
          const std::size_t a = axis(attr_int(N.attrs, "axis", 0));
          const std::int64_t shift =
              N.op == Op::slice ? attr_int(N.attrs, "start", 0) : -attr_int(N.attrs, "before", 0);
          std::int64_t at = 0;
          for (std::size_t k = 0; k + 1 < r; ++k) {
            const std::int64_t i = o[k] + (k == a ? shift : 0);
            if (i < 0 || i >= is0[k]) return;  // a pad row: zeros
            at += i * st[0][k];
          }
          if (a == r - 1) {
            if (N.op == Op::slice)
              out_segs.push_back({0, at + shift, 0, C});
            else
              out_segs.push_back({0, at, -shift, is0.back()});
          } else {
            out_segs.push_back({0, at, 0, C});
          }
          return;
        }
        case Op::concat: {
          const std::size_t a = axis(attr_int(N.attrs, "axis", 0));
          std::int64_t base = 0;
          for (std::size_t k = 0; k < N.inputs.size(); ++k) {
            const Shape& is = val(N.inputs[k]).shape;
            if (a == r - 1) {
              std::int64_t at = 0;
              for (std::size_t d = 0; d + 1 < r; ++d) at += o[d] * st[k][d];
              out_segs.push_back({static_cast<int>(k), at, base, is.back()});
            } else if (o[a] >= base && o[a] < base + is[a]) {
              std::int64_t at = 0;
              for (std::size_t d = 0; d + 1 < r; ++d)
                at += (d == a ? o[d] - base : o[d]) * st[k][d];
              out_segs.push_back({static_cast<int>(k), at, 0, C});
            }
            base += is[a];
          }
          return;
        }
        default: {  // broadcast: the input aligned to the right, dims of 1 repeat
          const std::size_t off = r - is0.size();
          if (is0.back() != C) unsupported(n, "a broadcast of the last dim");
          std::int64_t at = 0;
          for (std::size_t k = off; k + 1 < r; ++k)
            if (is0[k - off] != 1) at += o[k] * st[0][k - off];
          out_segs.push_back({0, at, 0, C});
          return;
        }
      }
    };
    kernel::LayoutCopySpec s;
    s.rows = R, s.cols = C, s.dtype = val(out(n)).dtype, s.cores = cores_;
    for (int v : N.inputs) {
      s.input_elements.push_back(elements(val(v).shape));
      l.inputs.emplace_back(fmt::format("in{}", l.inputs.size()), v);
    }
    std::vector<std::int64_t> o(r - 1, 0);
    std::vector<Seg> segs;
    // Open runs by (input, col0, len): extended while the stride holds.
    std::map<std::tuple<int, std::int64_t, std::int64_t>, std::size_t> open;
    for (std::int64_t row = 0; row < R; ++row) {
      segments(o, segs);
      std::map<std::tuple<int, std::int64_t, std::int64_t>, std::size_t> next;
      for (const Seg& g : segs) {
        const auto key = std::make_tuple(g.input, g.col0, g.len);
        const auto it = open.find(key);
        if (it != open.end()) {
          kernel::CopyRun& run = s.runs[it->second];
          const std::int64_t stride = g.in0 - (run.in0 + (run.rows - 1) * run.in_stride);
          if (run.out_row0 + run.rows == row && (run.rows == 1 || stride == run.in_stride) &&
              stride >= 0) {
            if (run.rows == 1) run.in_stride = stride;
            ++run.rows;
            next[key] = it->second;
            continue;
          }
        }
        s.runs.push_back({g.input, row, 1, g.in0, 0, g.col0, g.len});
        next[key] = s.runs.size() - 1;
      }
      open = std::move(next);
      for (std::size_t k = o.size(); k-- > 0;) {  // next leading multi-index
        if (++o[k] < os[k]) break;
        o[k] = 0;
      }
    }
    l.outputs = {{"out", out(n)}};
    l.detail = fmt::format("{} runs", s.runs.size());
    l.program = kernel::layout_copy_kernel(chip_, s);
  }

  // Sums over the leading axes: x^T @ ones on the Tensor engine, or for a
  // few rows (k <= kBlockSumRows) Vector adds of the k blocks; over all axes
  // (fp32): the reduce kernel, its row tiles spread over the cores, then
  // the cores' partials combined in core order.
  // squares: n sums x * x, the mul fused (x is the mul's operand).
  std::vector<Launch> sum(int n, Launch& l, bool squares = false) {
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
  // Up to this many rows a leading-axes sum adds blocks on the Vector engine:
  // x^T @ ones would stream each 128-row output tile through k of the PE
  // array's 128 rows, paying a matmul's fixed cost per tile for k MACs.
  static constexpr std::int64_t kBlockSumRows = 32;

  std::vector<Launch> matmul(const std::vector<int>& nodes, Launch& l) {
    int m = -1;
    for (int n : nodes)
      if (node(n).op == Op::matmul) m = n;
    const Node& mn = node(m);
    int a = mn.inputs[0], b = mn.inputs[1];
    bool ta = attr_int(mn.attrs, "trans_a", 0) != 0, tb = attr_int(mn.attrs, "trans_b", 0) != 0;
    // Transposes the fusion absorbed become layout flags.
    auto absorbed = [&](int v) {
      const int p = val(v).node;
      return std::find(nodes.begin(), nodes.end(), p) != nodes.end() && node(p).op == Op::transpose;
    };
    if (absorbed(a)) a = node(val(a).node).inputs[0], ta = !ta;
    if (absorbed(b)) b = node(val(b).node).inputs[0], tb = !tb;
    const Shape &as = val(a).shape, &bs = val(b).shape;
    if (bs.size() != 2) unsupported(m, "a batched second operand");
    if (ta && as.size() != 2) unsupported(m, "a transposed batched first operand");
    kernel::MatmulSpec s;
    s.k = ta ? as[0] : as.back();
    s.m = ta ? as[1] : elements(as) / as.back();
    s.n = tb ? bs[0] : bs[1];
    s.in = val(a).dtype;
    s.trans_a = ta, s.trans_b = tb, s.cores = cores_, s.lnc = lnc_;
    l.inputs = {{ta ? "at" : "a", a}, {tb ? "bt" : "b", b}};
    int last = out(m);
    for (int n : nodes) {
      if (n <= m) continue;
      const Node& e = node(n);
      if (e.op == Op::scale) {
        s.epilogue.scale = static_cast<float>(attr_real(e.attrs, "value", 1.0));
      } else if (e.op == Op::add) {
        const int other = e.inputs[0] == last ? e.inputs[1] : e.inputs[0];
        if (val(other).shape.size() == 1) {
          s.epilogue.bias = true, s.epilogue.bias_dtype = val(other).dtype;
          l.inputs.push_back({"bias", other});
        } else {
          s.epilogue.residual = true, s.epilogue.residual_dtype = val(other).dtype;
          l.inputs.push_back({"residual", other});
        }
      } else if (act_func(e.op) != isa::ActFunc::identity) {
        s.epilogue.act = act_func(e.op);
      } else if (e.op != Op::cast) {
        unsupported(n, "in a matmul epilogue");
      }
      last = out(n);
    }
    s.out = val(last).dtype;
    l.outputs = {{"c", last}};
    l.detail = s.epilogue.any() ? kernel::to_string(s.epilogue) : "";
    const MatmulQuant q = matmul_quant(mn.attrs);
    if (q.any()) return quantized_matmul(m, q, a, ta, b, tb, s, l);
    if (isa::size_bytes(s.in) != 2 && (!ta || tb)) {
      // The DMA transpose moves 2-byte types: transpose FP32 operands with
      // the Tensor engine first.
      std::vector<Launch> ls;
      const Operand at = kmajor(ls, l, a, ta, s.m, s.k, s.in, "aT");
      const Operand bk = kmajor(ls, l, b, !tb, s.n, s.k, s.in, "bK");
      s.trans_a = true, s.trans_b = false;
      l.inputs[0] = at.as("at"), l.inputs[1] = bk.as("b");
      l.program = kernel::matmul_kernel(chip_, s);
      ls.push_back(std::move(l));
      return ls;
    }
    l.program = kernel::matmul_kernel(chip_, s);
    return {l};
  }

  // A matmul operand in HBM: a graph value or a temporary.
  struct Operand {
    int value = -1;
    std::string temp = {}, state = {};  // state: a buffer the runtime keeps across steps
    Binding as(const std::string& tensor) const {
      return state.empty() ? Binding(tensor, value, temp) : Binding::kept(tensor, state);
    }
  };
  // Operand v with K leading ([K, cols]): v itself when k_major, else v
  // ([cols, K]) transposed into a temporary by a launch appended to ls.
  Operand kmajor(std::vector<Launch>& ls, const Launch& l, int v, bool k_major, std::int64_t cols,
                 std::int64_t k, DType dt, const char* name) {
    if (k_major) return Operand{v, {}};
    const std::string t = tmp(l, name);
    ls.push_back(transpose_launch(l, v, {}, t, -1, 1, cols, k, dt));
    return Operand{-1, t};
  }

  // Quantized operands (quant.h): A^T [K, M] and B [K, N] in BF16 (transposed
  // first where the graph holds A [M, K] or B [N, K]), then
  //   MX: the MX matmul quantizes on chip (QuantizeMX: MXFP8 with trn3
  //       scales), or mx_quantize launches (other policies, MXFP4) write the
  //       x4 operands for a prequantized MX matmul;
  //   per-tensor FP8: fp8_scale (amax -> s, 1 / s) and a scaled cast per
  //       operand, the FP8 matmul with the dequant epilogue.
  std::vector<Launch> quantized_matmul(int m, const MatmulQuant& q, int a, bool ta, int b, bool tb,
                                       kernel::MatmulSpec s, Launch l) {
    if (q.a.kind != q.b.kind)
      unsupported(m, fmt::format("operands quantized as '{}' and '{}'", q.a.name, q.b.name));
    if (val(a).dtype != DType::bf16 || val(b).dtype != DType::bf16)
      unsupported(m, fmt::format("quantized operands of {} and {} (bf16 are)",
                                 isa::name(val(a).dtype), isa::name(val(b).dtype)));
    std::vector<Launch> ls;
    const Operand at = kmajor(ls, l, a, ta, s.m, s.k, DType::bf16, "aT"),
                  bk = kmajor(ls, l, b, !tb, s.n, s.k, DType::bf16, "bK");
    s.trans_a = true, s.trans_b = false;
    std::vector<Binding> rest(l.inputs.begin() + 2, l.inputs.end());  // bias, residual
    l.inputs.clear();
    if (q.a.kind == QuantKind::mx) {
      auto x4 = [](const OperandQuant& o) {
        return o.mx == num::MxId::mxfp4        ? DType::fp4_e2m1_x4
               : o.mx == num::MxId::mxfp8_e5m2 ? DType::fp8_e5m2_x4
                                               : DType::fp8_e4m3_x4;
      };
      s.in = x4(q.a);
      if (x4(q.b) != s.in) s.in_b = x4(q.b);
      const bool on_chip =
          q.policy == num::ScalePolicy::trn3 && q.a == q.b && q.a.mx != num::MxId::mxfp4;
      if (on_chip) {
        l.inputs = {at.as("at"), bk.as("b")};
      } else {
        auto quantize = [&](const Operand& x, std::int64_t cols, DType elem, const char* name) {
          kernel::MxQuantizeSpec qs;
          qs.k = s.k, qs.cols = cols, qs.elem = elem, qs.policy = q.policy, qs.cores = cores_;
          Launch ql = l;
          ql.kernel = "mx_quantize";
          ql.detail = fmt::format("{} {} scales", isa::name(elem), num::policy_name(q.policy));
          ql.program = kernel::mx_quantize_kernel(chip_, qs);
          ql.inputs = {x.as("x")};
          ql.outputs = {{"q", -1, tmp(l, std::string(name) + "_q")},
                        {"q_scale", -1, tmp(l, std::string(name) + "_s")}};
          ls.push_back(std::move(ql));
          return std::make_pair(Operand{-1, tmp(l, std::string(name) + "_q")},
                                Operand{-1, tmp(l, std::string(name) + "_s")});
        };
        const auto [aq, as] = quantize(at, s.m, s.in, "a");
        const auto [bq, bs] = quantize(bk, s.n, s.in_b.value_or(s.in), "b");
        s.mx_prequantized = true;
        l.inputs = {aq.as("at_q"), as.as("at_scale"), bq.as("b_q"), bs.as("b_scale")};
      }
    } else {
      auto quantize = [&](const Operand& x, std::int64_t cols, DType fp8, const char* name) {
        const std::string y = tmp(l, std::string(name) + "_fp8");
        // The scale: from this step's amax (an fp8_scale launch), or with
        // delayed scaling from the steps before (kept by the runtime, which
        // gets this step's amax from the cast for the next steps).
        Binding scale("scale", -1);
        Operand inv;
        const std::string site = fmt::format("{}.{}", val(out(m)).name, name);
        if (q.delayed) {
          sites.push_back({site, fp8, q.history, cores_});
          scale = Binding::kept("scale", site + ".scale");
          inv = Operand{-1, {}, site + ".inv"};
        } else {
          const std::string sc = tmp(l, std::string(name) + "_scale");
          inv = Operand{-1, tmp(l, std::string(name) + "_inv")};
          Launch sl = l;
          sl.kernel = "fp8_scale", sl.detail = fmt::format("{} current scaling", isa::name(fp8));
          sl.program = kernel::fp8_scale_kernel(chip_, {s.k, cols, DType::bf16, fp8});
          sl.inputs = {x.as("x")};
          sl.outputs = {{"scale", -1, sc}, {"inv_scale", -1, inv.temp}};
          ls.push_back(std::move(sl));
          scale = Binding("scale", -1, sc);
        }
        kernel::CastSpec c;
        c.rows = s.k, c.cols = cols, c.in = DType::bf16, c.out = fp8, c.scaled = true;
        c.amax = q.delayed, c.cores = cores_;
        Launch cl = l;
        cl.kernel = "cast";
        cl.detail =
            fmt::format("bf16 -> {} {}", isa::name(fp8), q.delayed ? "delayed scaling" : "scaled");
        cl.program = kernel::cast_kernel(chip_, c);
        cl.inputs = {x.as("x"), scale};
        cl.outputs = {{"y", -1, y}};
        if (q.delayed) cl.outputs.push_back(Binding::kept("amax", site + ".amax"));
        ls.push_back(std::move(cl));
        return std::make_pair(Operand{-1, y}, inv);
      };
      const auto [aq, ainv] = quantize(at, s.m, q.a.fp8, "a");
      const auto [bq, binv] = quantize(bk, s.n, q.b.fp8, "b");
      s.in = q.a.fp8;
      if (q.b.fp8 != s.in) s.in_b = q.b.fp8;
      s.epilogue.dequant = true;
      l.inputs = {aq.as("at"), bq.as("b"), ainv.as("dequant_a"), binv.as("dequant_b")};
    }
    l.inputs.insert(l.inputs.end(), rest.begin(), rest.end());
    l.detail = fmt::format("{} x {}{}", q.a.name, q.b.name,
                           s.epilogue.any() ? ", " + kernel::to_string(s.epilogue) : "");
    l.program = kernel::matmul_kernel(chip_, s);
    ls.push_back(std::move(l));
    return ls;
  }

  // AdamW steps (one, or the multi-tensor group) as one launch; each tensor
  // as [128, n / 128] when it splits so (all partitions busy), else
  // [rows, last dim].
  void adamw(const std::vector<int>& nodes, Launch& l) {
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

  void norm(const std::vector<int>& nodes, Launch& l) {
    int nn = -1, add = -1, cast = -1;
    for (int n : nodes) {
      const Op op = node(n).op;
      if (op == Op::rmsnorm || op == Op::layernorm) nn = n;
      if (op == Op::add) add = n;
      if (op == Op::cast) cast = n;
    }
    const Node& N = node(nn);
    const auto [rows, dim] = rows_cols(N.inputs[0]);
    kernel::RmsNormSpec s;
    s.rows = rows, s.dim = dim, s.cores = cores_;
    s.eps = static_cast<float>(attr_real(N.attrs, "eps", N.op == Op::layernorm ? 1e-5 : 1e-6));
    s.dtype = val(N.inputs[0]).dtype;
    if (add >= 0) {
      s.residual = true;
      l.inputs = {{"x", node(add).inputs[0]}, {"residual", node(add).inputs[1]}};
      l.outputs.push_back({"h", out(add)});
    } else {
      l.inputs = {{"x", N.inputs[0]}};
    }
    l.inputs.push_back({"gamma", N.inputs[1]});
    if (N.op == Op::layernorm) l.inputs.push_back({"beta", N.inputs[2]});
    const int y = cast >= 0 ? out(cast) : out(nn);
    if (cast >= 0) s.out = val(y).dtype;
    l.outputs.push_back({"y", y});
    l.outputs.emplace_back("rstd", -1, stat(nn, "rstd"));  // for the backward
    if (N.op == Op::layernorm) l.outputs.emplace_back("mean", -1, stat(nn, "mean"));
    l.program =
        N.op == Op::rmsnorm ? kernel::rmsnorm_kernel(chip_, s) : kernel::layernorm_kernel(chip_, s);
  }

  void softmax(int n, Launch& l) {
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

  void elementwise(int n, Launch& l) { elementwise_with(n, l, false); }
  // `row`: which operand of add / sub / mul is one broadcast row (-1: none).
  void elementwise_with(int n, Launch& l, bool broadcast_ok, int row = -1) {
    const Node& N = node(n);
    const auto [rows, cols] = rows_cols(out(n));
    kernel::ElementwiseSpec s;
    s.rows = rows, s.cols = cols, s.dtype = val(out(n)).dtype, s.cores = cores_;
    for (int v : N.inputs)
      if (!broadcast_ok && val(v).shape != val(out(n)).shape)
        unsupported(n, "broadcasting operands");
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

 private:
  const Graph& g_;
  const FusionReport& f_;
  const arch::ChipSpec& chip_;
  int cores_;
  int lnc_;  // CompileOptions::lnc: the matmuls pair cores into logical ones
};

}  // namespace

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
  Lowerer lw(e.graph, e.fusion, chip, cores, opt.lnc);
  e.plan.temps_counted = true;
  for (std::size_t i = 0; i < e.fusion.groups.size(); ++i) {
    try {
      std::vector<Launch> ls = lw.lower(e.fusion.groups[i], static_cast<int>(i));
      for (const Launch& l : ls) check_bindings(e.graph, l);
      for (Launch& l : ls) e.launches.push_back(std::move(l));
    } catch (const NotSupported& err) {
      if (!opt.partial) throw;
      e.unlowered.emplace_back(static_cast<int>(i), err.what());
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
  return fmt::format("cores={} lnc={} partial={}", cores, lnc, partial);
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
