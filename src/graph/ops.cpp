// The graph ops' shape and dtype rules. Each case states the op's contract:
// inputs (with their shapes), attributes (defaults), outputs.
#include "graph/ops.h"

#include <algorithm>
#include <numeric>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/quant.h"
#include "util/error.h"

namespace tern::graph {

namespace {

bool is_int(DType d) {
  return d == DType::int32 || d == DType::int16 || d == DType::int8 || d == DType::uint32 ||
         d == DType::uint16 || d == DType::uint8;
}

std::string desc(const Value& v) {
  return fmt::format("%{} {} {}", v.name, shape_string(v.shape), isa::name(v.dtype));
}

void need_float(const Value& v) {
  if (!isa::is_float(v.dtype) || isa::is_x4(v.dtype))
    throw Error(fmt::format("{} must be a float tensor", desc(v)));
}
void need_same_dtype(const Value& a, const Value& b) {
  if (a.dtype != b.dtype) throw Error(fmt::format("dtypes differ: {} and {}", desc(a), desc(b)));
}
void need_rank(const Value& v, std::size_t lo, std::size_t hi, const char* what) {
  if (v.shape.size() < lo || v.shape.size() > hi)
    throw Error(fmt::format("{} must be {} (rank {}..{}), got {}", desc(v), what, lo, hi,
                            shape_string(v.shape)));
}
void need_shape(const Value& v, const Shape& want, const char* what) {
  if (v.shape != want)
    throw Error(fmt::format("{} must be {} {}, got {}", desc(v), what, shape_string(want),
                            shape_string(v.shape)));
}
void need_ids(const Value& v) {
  if (!is_int(v.dtype)) throw Error(fmt::format("{} must be an integer tensor (ids)", desc(v)));
}
// Normalizes a possibly negative axis against rank r.
std::int64_t axis_of(std::int64_t axis, std::size_t r) {
  const auto rank = static_cast<std::int64_t>(r);
  if (axis < -rank || axis >= rank)
    throw Error(fmt::format("axis {} is out of range for rank {}", axis, rank));
  return axis < 0 ? axis + rank : axis;
}

}  // namespace

bool swaps_last_two(const Node& n) {
  const auto p = attr_ints(n.attrs, "perm");
  const std::size_t r = p.size();
  if (r < 2) return false;
  for (std::size_t i = 0; i + 2 < r; ++i)
    if (p[i] != static_cast<std::int64_t>(i)) return false;
  return p[r - 2] == static_cast<std::int64_t>(r - 1) &&
         p[r - 1] == static_cast<std::int64_t>(r - 2);
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::int64_t x = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    const std::int64_t y = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    if (x != y && x != 1 && y != 1)
      throw Error(
          fmt::format("shapes {} and {} do not broadcast", shape_string(a), shape_string(b)));
    out[i] = x == 1 ? y : x;
  }
  return out;
}

Arity op_arity(Op op) {
  switch (op) {
    case Op::input:
    case Op::param:
    case Op::full:
      return {0, 0};
    case Op::matmul:
    case Op::add:
    case Op::sub:
    case Op::mul:
    case Op::act_backward:
    case Op::rmsnorm:
    case Op::softmax_backward:
    case Op::cross_entropy:
    case Op::embedding:
    case Op::embedding_backward:
      return {2, 2};
    case Op::scale:
    case Op::gelu:
    case Op::gelu_tanh:
    case Op::silu:
    case Op::relu:
    case Op::softmax:
    case Op::reshape:
    case Op::transpose:
    case Op::slice:
    case Op::pad:
    case Op::cast:
    case Op::sum:
    case Op::broadcast:
      return {1, 1};
    case Op::rmsnorm_backward:
    case Op::layernorm:
    case Op::layernorm_backward:
    case Op::cross_entropy_backward:
    case Op::rope:
    case Op::attention:
      return {3, 3};
    case Op::attention_backward:
      return {6, 6};
    case Op::concat:
      return {1, -1};
    case Op::adamw:
      return {5, 5};
    case Op::count_:
      break;
  }
  return {0, 0};
}

int op_outputs(Op op) {
  switch (op) {
    case Op::rmsnorm_backward:
    case Op::attention:
      return 2;
    case Op::layernorm_backward:
    case Op::attention_backward:
      return 3;
    default:
      return 1;
  }
}

std::vector<OutType> infer(Op op, const std::vector<const Value*>& in, const Attrs& attrs) {
  const Arity ar = op_arity(op);
  const int n = static_cast<int>(in.size());
  if (n < ar.min || (ar.max >= 0 && n > ar.max))
    throw Error(fmt::format("takes {} inputs, got {}",
                            ar.max < 0         ? fmt::format("at least {}", ar.min)
                            : ar.min == ar.max ? fmt::format("{}", ar.min)
                                               : fmt::format("{} to {}", ar.min, ar.max),
                            n));
  auto at = [&](int i) -> const Value& { return *in[static_cast<std::size_t>(i)]; };
  switch (op) {
    case Op::input:
    case Op::param:
      throw Error("leaves are not inferred");
    // full(; shape, value, dtype): a constant.
    case Op::full: {
      const Shape s = attr_ints(attrs, "shape");
      if (!attrs.contains("value")) throw Error("needs the attribute 'value'");
      attr_real(attrs, "value", 0.0);
      return {{s, isa::parse_dtype(attr_string(attrs, "dtype", "float32"))}};
    }
    // matmul(a, b; trans_a = 0, trans_b = 0): a [..., M, K] (trans_a: [..., K, M]),
    // b [K, N] (trans_b: [N, K]) or with a's batch dims -> [..., M, N], a's dtype.
    case Op::matmul: {
      const Value &a = at(0), &b = at(1);
      need_float(a), need_float(b), need_same_dtype(a, b);
      need_rank(a, 2, 6, "a matrix or a batch of them");
      need_rank(b, 2, a.shape.size(), "a matrix or a batch like a");
      const bool ta = attr_int(attrs, "trans_a", 0) != 0, tb = attr_int(attrs, "trans_b", 0) != 0;
      const std::size_t r = a.shape.size();
      const std::int64_t m = a.shape[r - (ta ? 1 : 2)], ka = a.shape[r - (ta ? 2 : 1)];
      const std::size_t rb = b.shape.size();
      const std::int64_t kb = b.shape[rb - (tb ? 1 : 2)], nn = b.shape[rb - (tb ? 2 : 1)];
      if (ka != kb)
        throw Error(fmt::format("contraction dims differ: {} (K = {}) and {} (K = {})", desc(a), ka,
                                desc(b), kb));
      if (rb > 2 && (rb != r || !std::equal(a.shape.begin(), a.shape.end() - 2, b.shape.begin())))
        throw Error(fmt::format("batch dims differ: {} and {}", desc(a), desc(b)));
      const MatmulQuant q = matmul_quant(attrs);  // names the bad format or policy
      for (const OperandQuant* o : {&q.a, &q.b, &q.grad})
        if (o->kind == QuantKind::mx && ka % static_cast<std::int64_t>(num::kMxBlock) != 0)
          throw Error(fmt::format("{} operands need K to be a multiple of {}, got K = {}", o->name,
                                  num::kMxBlock, ka));
      Shape out(a.shape.begin(), a.shape.end() - 2);
      out.push_back(m), out.push_back(nn);
      return {{out, a.dtype}};
    }
    // Elementwise with NumPy broadcasting; both operands of one dtype.
    case Op::add:
    case Op::sub:
    case Op::mul:
      need_float(at(0)), need_same_dtype(at(0), at(1));
      return {{broadcast_shapes(at(0).shape, at(1).shape), at(0).dtype}};
    // scale(x; value): x * value.
    case Op::scale:
      need_float(at(0));
      if (!attrs.contains("value")) throw Error("needs the attribute 'value'");
      attr_real(attrs, "value", 0.0);
      return {{at(0).shape, at(0).dtype}};
    case Op::gelu:
    case Op::gelu_tanh:
    case Op::silu:
    case Op::relu:
    case Op::softmax:  // over the last axis
      need_float(at(0));
      return {{at(0).shape, at(0).dtype}};
    // act_backward(dy, x; func): dy * func'(x).
    case Op::act_backward: {
      const std::string f = attr_string(attrs, "func", "");
      const Op fo = parse_op(f);
      if (fo != Op::gelu && fo != Op::gelu_tanh && fo != Op::silu && fo != Op::relu)
        throw Error(fmt::format("func '{}' is not an activation (gelu, gelu_tanh, silu, relu)", f));
      need_float(at(0)), need_float(at(1)), need_shape(at(0), at(1).shape, "shaped like x");
      return {{at(1).shape, at(0).dtype}};
    }
    // rmsnorm(x [..., D], gamma [D]; eps = 1e-6) over the last axis.
    // layernorm(x, gamma [D], beta [D]; eps = 1e-5).
    case Op::rmsnorm:
    case Op::layernorm: {
      const Value& x = at(0);
      need_float(x), need_rank(x, 1, 6, "a tensor");
      const Shape d{x.shape.back()};
      need_shape(at(1), d, "gamma");
      if (op == Op::layernorm) need_shape(at(2), d, "beta");
      return {{x.shape, x.dtype}};
    }
    // rmsnorm_backward(dy, x, gamma) -> dx, dgamma; layernorm_backward(dy,
    // x, gamma) -> dx, dgamma, dbeta (parameter gradients in gamma's dtype).
    case Op::rmsnorm_backward:
    case Op::layernorm_backward: {
      const Value &dy = at(0), &x = at(1), &g = at(2);
      need_rank(x, 1, 6, "a tensor");
      need_float(dy), need_shape(dy, x.shape, "shaped like x");
      need_shape(g, Shape{x.shape.back()}, "gamma");
      std::vector<OutType> out{{x.shape, dy.dtype}, {g.shape, g.dtype}};
      if (op == Op::layernorm_backward) out.push_back({g.shape, g.dtype});
      return out;
    }
    // softmax_backward(dy, y): y * (dy - sum(dy * y)) over the last axis.
    case Op::softmax_backward:
      need_shape(at(0), at(1).shape, "shaped like y");
      return {{at(1).shape, at(0).dtype}};
    // cross_entropy(logits [..., V], targets [...] ids; ignore_index = -100):
    // mean over the tokens with target != ignore_index of -log softmax, [] fp32.
    case Op::cross_entropy: {
      const Value &l = at(0), &t = at(1);
      need_float(l), need_rank(l, 1, 6, "logits"), need_ids(t);
      need_shape(t, Shape(l.shape.begin(), l.shape.end() - 1), "targets");
      return {{Shape{}, DType::fp32}};
    }
    // cross_entropy_backward(dloss [], logits, targets) -> dlogits.
    case Op::cross_entropy_backward: {
      need_shape(at(0), Shape{}, "a scalar");
      const Value &l = at(1), &t = at(2);
      need_float(l), need_rank(l, 1, 6, "logits");
      need_ids(t), need_shape(t, Shape(l.shape.begin(), l.shape.end() - 1), "targets");
      return {{l.shape, l.dtype}};
    }
    // embedding(table [V, D], ids [...]) -> [..., D].
    case Op::embedding: {
      const Value &tab = at(0), &ids = at(1);
      need_float(tab), need_rank(tab, 2, 2, "a [V, D] table"), need_ids(ids);
      Shape out = ids.shape;
      out.push_back(tab.shape[1]);
      return {{out, tab.dtype}};
    }
    // embedding_backward(dy [..., D], ids [...]; vocab) -> dtable [vocab, D].
    case Op::embedding_backward: {
      const Value &dy = at(0), &ids = at(1);
      need_float(dy), need_ids(ids);
      const std::int64_t v = attr_int(attrs, "vocab", 0);
      if (v < 1) throw Error("needs the attribute 'vocab' >= 1");
      Shape want = ids.shape;
      want.push_back(dy.shape.empty() ? 0 : dy.shape.back());
      need_shape(dy, want, "ids' shape + [D]");
      return {{Shape{v, dy.shape.back()}, dy.dtype}};
    }
    // adamw(master, grad, m, v [any shape; master, m, v fp32], scalars [5]
    // fp32; beta1, beta2, eps, dtype = bf16) -> master', m', v' (fp32),
    // param (dtype): torch.optim.AdamW with the step's scalars (decay =
    // 1 - lr wd, 1 - beta1, 1 - beta2, sqrt(1 - beta2^t), -lr / (1 - beta1^t),
    // kernel::adamw_scalars) as a runtime input, so one program serves every
    // step of a learning-rate schedule:
    //   m' = beta1 m + (1 - beta1) g, v' = beta2 v + (1 - beta2) g^2,
    //   master' = master decay + (-step) m' / (sqrt(v') / sqrt(bc2) + eps),
    //   param = master' in dtype (what the next forward pass reads).
    case Op::adamw: {
      const Value &p = at(0), &g = at(1);
      for (int i : {0, 2, 3})
        if (at(i).dtype != DType::fp32)
          throw Error(fmt::format("{}: master weights and moments are fp32", desc(at(i))));
      need_float(g);
      need_shape(g, p.shape, "the master weights' shape");
      need_shape(at(2), p.shape, "the master weights' shape");
      need_shape(at(3), p.shape, "the master weights' shape");
      need_shape(at(4), Shape{5}, "[5] (the step's scalars)");
      if (at(4).dtype != DType::fp32) throw Error(fmt::format("{}: scalars are fp32", desc(at(4))));
      const double b1 = attr_real(attrs, "beta1", 0.9), b2 = attr_real(attrs, "beta2", 0.999);
      if (!(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1) || !(attr_real(attrs, "eps", 1e-8) > 0))
        throw Error("needs betas in [0, 1) and eps > 0");
      const DType pd = isa::parse_dtype(attr_string(attrs, "dtype", "bf16"));
      if (pd != DType::bf16 && pd != DType::fp32)
        throw Error(fmt::format("the param copy is bf16 or fp32, got {}", isa::name(pd)));
      return {
          {p.shape, DType::fp32}, {p.shape, DType::fp32}, {p.shape, DType::fp32}, {p.shape, pd}};
    }
    // rope(x [B, H, S, D], cos [S, D/2], sin [S, D/2]; inverse = 0):
    // rotate-half; inverse rotates by -theta (the gradient).
    case Op::rope: {
      const Value& x = at(0);
      need_float(x), need_rank(x, 4, 4, "[B, H, S, D]");
      if (x.shape[3] % 2 != 0) throw Error(fmt::format("{}: head dim must be even", desc(x)));
      const Shape t{x.shape[2], x.shape[3] / 2};
      need_shape(at(1), t, "cos"), need_shape(at(2), t, "sin");
      return {{x.shape, x.dtype}};
    }
    // attention(q [B, Hq, S, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, D];
    // causal = 1, scale = 1/sqrt(D)) -> o [B, Hq, S, D], lse [B, Hq, S] fp32.
    case Op::attention: {
      const Value &q = at(0), &k = at(1), &v = at(2);
      need_float(q), need_rank(q, 4, 4, "[B, Hq, S, D]"), need_rank(k, 4, 4, "[B, Hkv, Sk, D]");
      need_same_dtype(q, k), need_same_dtype(q, v), need_shape(v, k.shape, "shaped like k");
      if (k.shape[0] != q.shape[0] || k.shape[3] != q.shape[3] || q.shape[1] % k.shape[1] != 0)
        throw Error(
            fmt::format("q {} and k {} need the same batch and head dim, and q heads a "
                        "multiple of kv heads",
                        shape_string(q.shape), shape_string(k.shape)));
      return {{q.shape, q.dtype}, {Shape{q.shape[0], q.shape[1], q.shape[2]}, DType::fp32}};
    }
    // attention_backward(do, q, k, v, o, lse; causal, scale) -> dq, dk, dv.
    case Op::attention_backward: {
      const Value &dout = at(0), &q = at(1), &k = at(2), &v = at(3), &o = at(4), &lse = at(5);
      need_rank(q, 4, 4, "[B, Hq, S, D]"), need_rank(k, 4, 4, "[B, Hkv, Sk, D]");
      need_shape(v, k.shape, "shaped like k");
      need_shape(dout, q.shape, "shaped like q"), need_shape(o, q.shape, "shaped like q");
      need_shape(lse, Shape{q.shape[0], q.shape[1], q.shape[2]}, "[B, Hq, S]");
      return {{q.shape, q.dtype}, {k.shape, k.dtype}, {v.shape, v.dtype}};
    }
    // reshape(x; shape, one entry may be -1).
    case Op::reshape: {
      Shape s = attr_ints(attrs, "shape");
      std::int64_t known = 1;
      int infer_at = -1;
      for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i] == -1) {
          if (infer_at >= 0) throw Error("reshape: at most one -1");
          infer_at = static_cast<int>(i);
        } else if (s[i] < 1) {
          throw Error(fmt::format("reshape: bad dim {} in {}", s[i], shape_string(s)));
        } else {
          known *= s[i];
        }
      }
      const std::int64_t total = elements(at(0).shape);
      if (infer_at >= 0) {
        if (total % known != 0)
          throw Error(fmt::format("cannot reshape {} to {}", desc(at(0)), shape_string(s)));
        s[static_cast<std::size_t>(infer_at)] = total / known;
      }
      if (elements(s) != total)
        throw Error(fmt::format("cannot reshape {} ({} elements) to {}", desc(at(0)), total,
                                shape_string(s)));
      return {{s, at(0).dtype}};
    }
    // transpose(x; perm): out dim i = x dim perm[i].
    case Op::transpose: {
      const std::vector<std::int64_t> perm = attr_ints(attrs, "perm");
      const Shape& s = at(0).shape;
      std::set<std::int64_t> seen(perm.begin(), perm.end());
      if (perm.size() != s.size() || seen.size() != s.size() ||
          (!seen.empty() &&
           (*seen.begin() != 0 || *seen.rbegin() != static_cast<std::int64_t>(s.size()) - 1)))
        throw Error(
            fmt::format("perm {} is not a permutation of {} dims", shape_string(perm), s.size()));
      Shape out;
      for (std::int64_t p : perm) out.push_back(s[static_cast<std::size_t>(p)]);
      return {{out, at(0).dtype}};
    }
    // slice(x; axis, start, end): [start, end) along axis.
    // pad(x; axis, before, after): zeros around x along axis.
    case Op::slice:
    case Op::pad: {
      Shape s = at(0).shape;
      const auto ax = static_cast<std::size_t>(axis_of(attr_int(attrs, "axis", 0), s.size()));
      if (op == Op::slice) {
        const std::int64_t b = attr_int(attrs, "start", 0), e = attr_int(attrs, "end", s[ax]);
        if (b < 0 || e > s[ax] || b >= e)
          throw Error(
              fmt::format("slice [{}, {}) is out of range of dim {} = {}", b, e, ax, s[ax]));
        s[ax] = e - b;
      } else {
        const std::int64_t b = attr_int(attrs, "before", 0), e = attr_int(attrs, "after", 0);
        if (b < 0 || e < 0) throw Error("pad: before and after must be >= 0");
        s[ax] += b + e;
      }
      return {{s, at(0).dtype}};
    }
    // concat(x0, x1, ...; axis).
    case Op::concat: {
      Shape s = at(0).shape;
      const auto ax = static_cast<std::size_t>(axis_of(attr_int(attrs, "axis", 0), s.size()));
      for (int i = 1; i < n; ++i) {
        const Value& v = at(i);
        need_same_dtype(at(0), v);
        Shape t = v.shape;
        if (t.size() != s.size())
          throw Error(fmt::format("concat: {} and {} differ in rank", desc(at(0)), desc(v)));
        t[ax] = s[ax];
        if (t != s)
          throw Error(
              fmt::format("concat along {}: {} and {} differ elsewhere", ax, desc(at(0)), desc(v)));
        s[ax] += v.shape[ax];
      }
      return {{s, at(0).dtype}};
    }
    // cast(x; dtype).
    case Op::cast: {
      const DType to = isa::parse_dtype(attr_string(attrs, "dtype", ""));
      if (isa::is_x4(to)) throw NotSupported("cast to an x4-packed MX type (use the MX recipes)");
      return {{at(0).shape, to}};
    }
    // sum(x; axes = all, keepdims = 0).
    case Op::sum: {
      const Shape& s = at(0).shape;
      std::vector<std::int64_t> axes = attr_ints(attrs, "axes");
      if (axes.empty())
        for (std::size_t i = 0; i < s.size(); ++i) axes.push_back(static_cast<std::int64_t>(i));
      std::set<std::int64_t> red;
      for (std::int64_t a : axes) red.insert(axis_of(a, s.size()));
      const bool keep = attr_int(attrs, "keepdims", 0) != 0;
      Shape out;
      for (std::size_t i = 0; i < s.size(); ++i) {
        if (!red.contains(static_cast<std::int64_t>(i)))
          out.push_back(s[i]);
        else if (keep)
          out.push_back(1);
      }
      return {{out, at(0).dtype}};
    }
    // broadcast(x; shape): NumPy broadcasting of x to shape.
    case Op::broadcast: {
      const Shape s = attr_ints(attrs, "shape");
      if (broadcast_shapes(at(0).shape, s) != s)
        throw Error(fmt::format("{} does not broadcast to {}", desc(at(0)), shape_string(s)));
      return {{s, at(0).dtype}};
    }
    case Op::count_:
      break;
  }
  throw Error("unknown op");
}

}  // namespace tern::graph
