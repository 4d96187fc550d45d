// Lowering of matmul groups: layouts of both operands, batches, the fused
// epilogue chain, FP8 / MX operands.
#include "lower/lowerer.h"

namespace tern::graph::detail {

// Attention: the kernels read q and k as [B, H, D, S] (NKI's layout), so
// both go through batched Tensor-engine transposes first; the backward
// transposes dq and dk back.
Launch Lowerer::transpose_launch(const Launch& base, int value, const std::string& in_temp,
                                 const std::string& out_temp, int out_value, std::int64_t batch,
                                 std::int64_t rows, std::int64_t cols, DType dt) {
  Launch l = base;
  l.kernel = "transpose", l.detail = fmt::format("{} x [{}, {}]", batch, rows, cols);
  l.program = kernel::transpose_kernel(chip_, rows, cols, dt, batch, cores_);
  l.inputs = {{"in", value, in_temp}};
  l.outputs = {{"out", out_value, out_temp}};
  return l;
}

// A cast of a temporary into a value (kernel::cast_kernel, unscaled).
Launch Lowerer::cast_launch(const Launch& base, const std::string& in_temp, int value,
                            std::int64_t rows, std::int64_t cols, DType from) {
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

std::vector<Launch> Lowerer::matmul(const std::vector<int>& nodes, Launch& l) {
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

// Operand v with K leading ([K, cols]): v itself when k_major, else v
// ([cols, K]) transposed into a temporary by a launch appended to ls.
Lowerer::Operand Lowerer::kmajor(std::vector<Launch>& ls, const Launch& l, int v, bool k_major,
                                 std::int64_t cols, std::int64_t k, DType dt, const char* name) {
  if (k_major) return Operand{v, {}};
  const std::string t = tmp(l, name);
  ls.push_back(transpose_launch(l, v, {}, t, -1, 1, cols, k, dt));
  return Operand{-1, t};
}

Lowerer::MxOperand Lowerer::mx_operand(std::vector<Launch>& ls, const Launch& l, int v, bool trans,
                                       std::int64_t k, std::int64_t cols, DType elem,
                                       num::ScalePolicy policy) {
  const std::string key = fmt::format("mx.v{}.{}.{}.{}", v, trans ? "t" : "n", isa::name(elem),
                                      num::policy_name(policy));
  if (const auto it = mx_quantized_.find(key); it != mx_quantized_.end()) return it->second;
  kernel::MxQuantizeSpec qs;
  qs.k = k, qs.cols = cols, qs.elem = elem, qs.policy = policy, qs.trans = trans;
  qs.cores = cores_;
  Launch ql = l;
  ql.kernel = "mx_quantize";
  ql.detail =
      fmt::format("%{} {}{} {} scales", val(v).name, isa::name(elem),
                  trans ? " along its last dim (transposing load)" : "", num::policy_name(policy));
  ql.program = kernel::mx_quantize_kernel(chip_, qs);
  ql.inputs = {{"x", v}};
  ql.outputs = {{"q", -1, key + ".q"}, {"q_scale", -1, key + ".s"}};
  ls.push_back(std::move(ql));
  const MxOperand o{Operand{-1, key + ".q"}, Operand{-1, key + ".s"}, l.group};
  mx_quantized_.emplace(key, o);
  pending_mx_.push_back(key);
  return o;
}

// Quantized operands (quant.h): A^T [K, M] and B [K, N] in BF16 (transposed
// first where the graph holds A [M, K] or B [N, K]), then
//   MX: the MX matmul quantizes on chip (QuantizeMX: MXFP8 with trn3
//       scales), or mx_quantize launches (other policies, MXFP4) write the
//       x4 operands for a prequantized MX matmul;
//   per-tensor FP8: fp8_scale (amax -> s, 1 / s) and a scaled cast per
//       operand, the FP8 matmul with the dequant epilogue.
std::vector<Launch> Lowerer::quantized_matmul(int m, const MatmulQuant& q, int a, bool ta, int b,
                                              bool tb, kernel::MatmulSpec s, Launch l) {
  if (q.a.kind != q.b.kind)
    unsupported(m, fmt::format("operands quantized as '{}' and '{}'", q.a.name, q.b.name));
  if (val(a).dtype != DType::bf16 || val(b).dtype != DType::bf16)
    unsupported(m, fmt::format("quantized operands of {} and {} (bf16 are)",
                               isa::name(val(a).dtype), isa::name(val(b).dtype)));
  std::vector<Launch> ls;
  std::vector<Binding> rest(l.inputs.begin() + 2, l.inputs.end());  // bias, residual
  l.inputs.clear();
  const bool mx = q.a.kind == QuantKind::mx;
  auto x4 = [](const OperandQuant& o) {
    return o.mx == num::MxId::mxfp4        ? DType::fp4_e2m1_x4
           : o.mx == num::MxId::mxfp8_e5m2 ? DType::fp8_e5m2_x4
                                           : DType::fp8_e4m3_x4;
  };
  // Quantized once per step and shared: the MX operands in HBM (K whole
  // 128-row tiles, 32 partitions x 4 values: the prequantized matmul cannot
  // pad K).
  if (mx && fuse_mx_ && s.k % 128 == 0) {
    s.in = x4(q.a);
    if (x4(q.b) != s.in) s.in_b = x4(q.b);
    const MxOperand aq = mx_operand(ls, l, a, !ta, s.k, s.m, s.in, q.policy);
    const MxOperand bq = mx_operand(ls, l, b, tb, s.k, s.n, s.in_b.value_or(s.in), q.policy);
    s.trans_a = true, s.trans_b = false, s.mx_prequantized = true;
    l.inputs = {aq.q.as("at_q"), aq.scale.as("at_scale"), bq.q.as("b_q"), bq.scale.as("b_scale")};
    auto from = [&](const MxOperand& o) {
      return o.group == l.group ? std::string("here") : fmt::format("in g{}", o.group);
    };
    const std::string where = fmt::format("; quantized: a {}, b {}", from(aq), from(bq));
    l.inputs.insert(l.inputs.end(), rest.begin(), rest.end());
    l.detail = fmt::format("{} x {}{}{}", q.a.name, q.b.name,
                           s.epilogue.any() ? ", " + kernel::to_string(s.epilogue) : "", where);
    l.program = kernel::matmul_kernel(chip_, s);
    ls.push_back(std::move(l));
    return ls;
  }
  const Operand at = kmajor(ls, l, a, ta, s.m, s.k, DType::bf16, "aT"),
                bk = kmajor(ls, l, b, !tb, s.n, s.k, DType::bf16, "bK");
  s.trans_a = true, s.trans_b = false;
  if (mx) {
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

}  // namespace tern::graph::detail
