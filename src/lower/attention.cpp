// Lowering of attention groups: flash attention forward and backward, the
// head transposes they need, RoPE.
#include "lower/lowerer.h"

namespace tern::graph::detail {

// The attention or attention_backward node of a group whose other nodes
// are head views (fusion.h HeadView), or -1.
int Lowerer::attention_node(const std::vector<int>& nodes) const {
  int a = -1;
  for (int n : nodes)
    if (node(n).op == Op::attention || node(n).op == Op::attention_backward) a = n;
  for (int n : nodes)
    if (n != a && !f_.alias.contains(out(n)) && !f_.absorbed.contains(n)) return -1;
  return a;
}

// q or k of attention as [B * H, D, S] in a temporary: transposed from the
// value, or straight from the projection output when it is a head view.
Launch Lowerer::head_transpose(const Launch& base, int t, const std::string& out_temp) {
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
Binding Lowerer::head_rows(const Launch& base, int t, const std::string& temp,
                           std::vector<Launch>& ls) {
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

kernel::AttentionSpec Lowerer::attention_spec(const Node& n, int q, int k) const {
  const Shape &qs = val(q).shape, &ks = val(k).shape;
  kernel::AttentionSpec s;
  s.batch = qs[0], s.q_heads = qs[1], s.kv_heads = ks[1], s.seq_q = qs[2], s.seq_k = ks[2];
  s.head_dim = qs[3], s.causal = attr_int(n.attrs, "causal", 1) != 0;
  s.scale =
      static_cast<float>(attr_real(n.attrs, "scale", 1.0 / std::sqrt(static_cast<double>(qs[3]))));
  s.dtype = val(q).dtype, s.cores = cores_;
  return s;
}

std::vector<Launch> Lowerer::attention(int n, const Launch& base) {
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
  ls.push_back(transpose_launch(base, -1, dqt, {}, N.outputs[0], qs[0] * qs[1], qs[3], qs[2], dt));
  ls.push_back(transpose_launch(base, -1, dkt, {}, N.outputs[1], ks[0] * ks[1], ks[3], ks[2], dt));
  return ls;
}

// The matmul(q, k^T) [-> scale] -> softmax -> matmul(., v) pattern as
// non-causal flash attention: q, k, v [..., S, D] with rank 4 [B, H, ..]
// or 3 [B * H, ..]; lse is kept in a temporary nobody reads.
std::vector<Launch> Lowerer::attention_pattern(const std::vector<int>& nodes, const Launch& base) {
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

void Lowerer::rope(int n, Launch& l) {
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

}  // namespace tern::graph::detail
