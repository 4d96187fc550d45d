#include "graph/autodiff.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "graph/quant.h"
#include "util/error.h"

namespace tern::graph {

namespace {

// Sums g (broadcast from `shape`) back to `shape`.
int unbroadcast(Graph& g, int grad, const Shape& shape) {
  const Shape gs = g.value(grad).shape;
  if (gs == shape) return grad;
  const std::size_t off = gs.size() - shape.size();
  std::vector<std::int64_t> axes;
  bool leading = true;  // only the extra leading dims are summed away
  for (std::size_t i = 0; i < gs.size(); ++i)
    if (i < off || (shape[i - off] == 1 && gs[i] != 1)) {
      axes.push_back(static_cast<std::int64_t>(i));
      leading = leading && i < off;
    }
  if (leading) return g.sum(grad, axes, false);
  const int s = g.sum(grad, axes, true);
  return g.value(s).shape == shape ? s : g.reshape(s, shape);
}

class Backward {
 public:
  explicit Backward(Graph& g) : g_(g) {}

  // Accumulates `d` into the gradient of value v.
  void acc(int v, int d) {
    const auto it = grad_.find(v);
    if (it == grad_.end())
      grad_[v] = d;
    else
      it->second = g_.add(it->second, d);
  }

  void node(const Node& n, const std::set<int>& needed) {
    // The gradient of each output (absent: no path to the loss).
    std::vector<int> dy;
    bool any = false;
    for (int o : n.outputs) {
      const auto it = grad_.find(o);
      dy.push_back(it == grad_.end() ? -1 : it->second);
      any = any || it != grad_.end();
    }
    if (!any) return;
    auto need = [&](std::size_t i) { return needed.contains(n.inputs[i]); };
    auto in = [&](std::size_t i) { return n.inputs[i]; };
    auto shp = [&](int v) { return g_.value(v).shape; };
    const int d = dy[0];
    // Ops whose only differentiable input is the first: nothing to build
    // when that input needs no gradient.
    switch (n.op) {
      case Op::scale:
      case Op::gelu:
      case Op::gelu_tanh:
      case Op::silu:
      case Op::relu:
      case Op::softmax:
      case Op::cross_entropy:
      case Op::rope:
      case Op::reshape:
      case Op::transpose:
      case Op::slice:
      case Op::pad:
      case Op::cast:
      case Op::sum:
      case Op::broadcast:
        if (!need(0)) return;
        break;
      default:
        break;
    }
    switch (n.op) {
      case Op::input:
      case Op::param:
      case Op::full:
        return;
      case Op::matmul: {
        const bool ta = attr_int(n.attrs, "trans_a", 0) != 0,
                   tb = attr_int(n.attrs, "trans_b", 0) != 0;
        const int a = in(0), b = in(1);
        const std::size_t ra = shp(a).size(), rb = shp(b).size();
        if (ta && ra > 2 && rb == 2)
          throw NotSupported(
              "the gradient of a transposed batched matmul operand against a shared matrix");
        // Quantized operands (quant.h): each backward matmul quantizes its
        // operands again from the high-precision values, the incoming
        // gradient in quant_grad's format.
        const MatmulQuant q = matmul_quant(n.attrs);
        auto mm = [&](int x, const OperandQuant& qx, int y, const OperandQuant& qy, bool tx,
                      bool ty) {
          Attrs at;
          if (tx) at["trans_a"] = std::int64_t{1};
          if (ty) at["trans_b"] = std::int64_t{1};
          MatmulQuant bq;
          bq.a = qx, bq.b = qy, bq.policy = q.policy, bq.delayed = q.delayed;
          bq.history = q.history;
          set_matmul_quant(at, bq);
          return g_.add1(Op::matmul, {x, y}, std::move(at));
        };
        const OperandQuant &qa = q.a, &qb = q.b, &qd = q.grad;
        if (need(0)) {
          // dA' = dC B'^T; dA = dA' or its transpose.
          const int da = !ta ? mm(d, qd, b, qb, false, !tb) : mm(b, qb, d, qd, tb, true);
          acc(a, da);
        }
        if (need(1)) {
          int db;
          if (rb > 2 || ra == 2) {
            // dB' = A'^T dC; dB = dB' or its transpose.
            db = !tb ? mm(a, qa, d, qd, !ta, false) : mm(d, qd, a, qa, true, ta);
          } else {  // shared B: fold A's batch dims into rows
            const std::int64_t k = shp(a).back(), nn = shp(d).back();
            const int a2 = g_.reshape(a, {-1, k}), d2 = g_.reshape(d, {-1, nn});
            db = !tb ? mm(a2, qa, d2, qd, true, false) : mm(d2, qd, a2, qa, true, false);
          }
          acc(b, db);
        }
        return;
      }
      case Op::add:
      case Op::sub:
        if (need(0)) acc(in(0), unbroadcast(g_, d, shp(in(0))));
        if (need(1)) {
          const int db = unbroadcast(g_, d, shp(in(1)));
          acc(in(1), n.op == Op::add ? db : g_.scale(db, -1.0));
        }
        return;
      case Op::mul:
        if (need(0)) acc(in(0), unbroadcast(g_, g_.mul(d, in(1)), shp(in(0))));
        if (need(1)) acc(in(1), unbroadcast(g_, g_.mul(d, in(0)), shp(in(1))));
        return;
      case Op::scale:
        acc(in(0), g_.scale(d, attr_real(n.attrs, "value", 1.0)));
        return;
      case Op::gelu:
      case Op::gelu_tanh:
      case Op::silu:
      case Op::relu:
        acc(in(0), g_.add1(Op::act_backward, {d, in(0)}, {{"func", std::string(op_name(n.op))}}));
        return;
      case Op::rmsnorm:
      case Op::layernorm: {
        Attrs at;  // eps when given; absent, the backward op has the forward's default
        if (auto it = n.attrs.find("eps"); it != n.attrs.end()) at[it->first] = it->second;
        const auto r = g_.add(n.op == Op::rmsnorm ? Op::rmsnorm_backward : Op::layernorm_backward,
                              {d, in(0), in(1)}, at);
        for (std::size_t i = 0; i < r.size(); ++i)
          if (need(i)) acc(in(i), r[i]);
        return;
      }
      case Op::softmax:
        acc(in(0), g_.add1(Op::softmax_backward, {d, n.outputs[0]}));
        return;
      case Op::cross_entropy: {
        Attrs at;
        if (auto it = n.attrs.find("ignore_index"); it != n.attrs.end()) at[it->first] = it->second;
        acc(in(0), g_.add1(Op::cross_entropy_backward, {d, in(0), in(1)}, at));
        return;
      }
      case Op::embedding:
        if (need(0))
          acc(in(0), g_.add1(Op::embedding_backward, {d, in(1)}, {{"vocab", shp(in(0))[0]}}));
        return;
      case Op::rope:
        // Only x's gradient is built; a zero one for cos / sin would be wrong.
        if (need(1) || need(2))
          throw NotSupported(fmt::format("the gradient of rope %{} with respect to cos and sin",
                                         g_.value(n.outputs[0]).name));
        acc(in(0), g_.add1(Op::rope, {d, in(1), in(2)},
                           {{"inverse", std::int64_t{attr_int(n.attrs, "inverse", 0) ? 0 : 1}}}));
        return;
      case Op::attention: {
        if (dy[1] >= 0) throw NotSupported("the gradient through attention's lse output");
        const auto r = g_.add(Op::attention_backward,
                              {d, in(0), in(1), in(2), n.outputs[0], n.outputs[1]}, n.attrs);
        for (std::size_t i = 0; i < 3; ++i)
          if (need(i)) acc(in(i), r[i]);
        return;
      }
      case Op::reshape:
        acc(in(0), g_.reshape(d, shp(in(0))));
        return;
      case Op::transpose: {
        const auto perm = attr_ints(n.attrs, "perm");
        std::vector<std::int64_t> inv(perm.size());
        for (std::size_t i = 0; i < perm.size(); ++i)
          inv[static_cast<std::size_t>(perm[i])] = static_cast<std::int64_t>(i);
        acc(in(0), g_.transpose(d, inv));
        return;
      }
      case Op::slice: {
        const Shape s = shp(in(0));
        const std::int64_t ax = attr_int(n.attrs, "axis", 0);
        const auto a = static_cast<std::size_t>((ax + static_cast<std::int64_t>(s.size())) %
                                                static_cast<std::int64_t>(s.size()));
        const std::int64_t b = attr_int(n.attrs, "start", 0), e = attr_int(n.attrs, "end", s[a]);
        acc(in(0), g_.add1(Op::pad, {d}, {{"axis", ax}, {"before", b}, {"after", s[a] - e}}));
        return;
      }
      case Op::pad: {
        const std::int64_t ax = attr_int(n.attrs, "axis", 0), b = attr_int(n.attrs, "before", 0);
        const Shape s = shp(in(0));
        const auto a = static_cast<std::size_t>((ax + static_cast<std::int64_t>(s.size())) %
                                                static_cast<std::int64_t>(s.size()));
        acc(in(0), g_.slice(d, ax, b, b + s[a]));
        return;
      }
      case Op::concat: {
        const std::int64_t ax = attr_int(n.attrs, "axis", 0);
        std::int64_t at = 0;
        for (std::size_t i = 0; i < n.inputs.size(); ++i) {
          const Shape s = shp(in(i));
          const auto a = static_cast<std::size_t>((ax + static_cast<std::int64_t>(s.size())) %
                                                  static_cast<std::int64_t>(s.size()));
          if (need(i)) acc(in(i), g_.slice(d, ax, at, at + s[a]));
          at += s[a];
        }
        return;
      }
      case Op::cast:
        acc(in(0), g_.cast(d, g_.value(in(0)).dtype));
        return;
      case Op::sum: {
        const Shape s = shp(in(0));
        Shape kept = s;
        std::vector<std::int64_t> axes = attr_ints(n.attrs, "axes");
        if (axes.empty())
          for (std::size_t i = 0; i < s.size(); ++i) axes.push_back(static_cast<std::int64_t>(i));
        for (std::int64_t a : axes)
          kept[static_cast<std::size_t>((a + static_cast<std::int64_t>(s.size())) %
                                        static_cast<std::int64_t>(s.size()))] = 1;
        const int k = shp(d) == kept ? d : g_.reshape(d, kept);
        acc(in(0), kept == s ? k : g_.broadcast(k, s));
        return;
      }
      case Op::broadcast:
        acc(in(0), unbroadcast(g_, d, shp(in(0))));
        return;
      case Op::act_backward:
      case Op::rmsnorm_backward:
      case Op::layernorm_backward:
      case Op::softmax_backward:
      case Op::cross_entropy_backward:
      case Op::embedding_backward:
      case Op::attention_backward:
        throw NotSupported(
            fmt::format("differentiating {} (no second derivatives)", op_name(n.op)));
      case Op::adamw:
        throw NotSupported("differentiating adamw (an optimizer step is not differentiable)");
      case Op::count_:
        break;
    }
  }

  std::map<int, int> grad_;

 private:
  Graph& g_;
};

}  // namespace

std::map<int, int> add_backward(Graph& g, int loss, const std::vector<int>& wrt) {
  if (!g.value(loss).shape.empty())
    throw Error(fmt::format("autodiff: the loss %{} must be a scalar [], got {}",
                            g.value(loss).name, shape_string(g.value(loss).shape)));
  return add_backward(g, std::map<int, int>{{loss, g.full({}, 1.0, g.value(loss).dtype)}}, wrt);
}

std::map<int, int> add_backward(Graph& g, const std::map<int, int>& seeds,
                                const std::vector<int>& wrt) {
  for (const auto& [y, dy] : seeds)
    if (g.value(y).shape != g.value(dy).shape || g.value(y).dtype != g.value(dy).dtype)
      throw Error(fmt::format("autodiff: the gradient %{} of %{} must be {} {}, got {} {}",
                              g.value(dy).name, g.value(y).name, isa::name(g.value(y).dtype),
                              shape_string(g.value(y).shape), isa::name(g.value(dy).dtype),
                              shape_string(g.value(dy).shape)));
  // Values on a path from some wrt value to the loss: only their gradients
  // are built.
  const std::size_t nodes = g.nodes().size();
  std::set<int> from_wrt(wrt.begin(), wrt.end());
  for (std::size_t i = 0; i < nodes; ++i) {
    const Node& n = g.nodes()[i];
    if (std::any_of(n.inputs.begin(), n.inputs.end(), [&](int v) { return from_wrt.contains(v); }))
      from_wrt.insert(n.outputs.begin(), n.outputs.end());
  }
  std::set<int> to_loss;
  for (const auto& [y, dy] : seeds) to_loss.insert(y);
  for (std::size_t i = nodes; i-- > 0;) {
    const Node& n = g.nodes()[i];
    if (std::any_of(n.outputs.begin(), n.outputs.end(), [&](int v) { return to_loss.contains(v); }))
      to_loss.insert(n.inputs.begin(), n.inputs.end());
  }
  std::set<int> needed;
  for (int v : from_wrt)
    if (to_loss.contains(v)) needed.insert(v);

  Backward bw(g);
  for (const auto& [y, dy] : seeds) bw.grad_[y] = dy;
  for (std::size_t i = nodes; i-- > 0;) {
    const Node n = g.nodes()[i];  // a copy: g.nodes() grows below
    if (std::none_of(n.outputs.begin(), n.outputs.end(), [&](int v) { return needed.contains(v); }))
      continue;
    try {
      bw.node(n, needed);
    } catch (const NotSupported&) {
      throw;
    } catch (const Error& e) {
      throw Error(fmt::format("autodiff of {} %{}: {}", op_name(n.op), g.value(n.outputs[0]).name,
                              e.what()));
    }
  }
  // Gradients of named activations read "grad.<name>" too (when the value
  // is not already named, and the name is free).
  auto automatic = [](const std::string& n) {
    return n.size() > 1 && n[0] == 't' &&
           std::all_of(n.begin() + 1, n.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  for (const auto& [v, gr] : bw.grad_) {
    const std::string& vn = g.value(v).name;
    if (!automatic(vn) && automatic(g.value(gr).name) && g.find("grad." + vn) < 0 &&
        std::find(wrt.begin(), wrt.end(), v) == wrt.end())
      g.rename(gr, "grad." + vn);
  }
  std::map<int, int> out;
  for (int v : wrt) {
    const Value val = g.value(v);
    const auto it = bw.grad_.find(v);
    int gr = it != bw.grad_.end() ? it->second : g.full(val.shape, 0.0, val.dtype);
    // Named "grad.<name>" unless it is another value under its own name
    // (a wrt value whose gradient is a graph input, or one gradient for two
    // values).
    const std::string name = "grad." + val.name;
    const Node& prod = g.node(g.value(gr).node);
    const bool own = prod.op != Op::input && prod.op != Op::param &&
                     std::count_if(wrt.begin(), wrt.end(), [&](int w) {
                       const auto gw = bw.grad_.find(w);
                       return gw != bw.grad_.end() && gw->second == gr;
                     }) <= 1;
    if (own && g.find(name) < 0) g.rename(gr, name);
    out[v] = gr;
  }
  return out;
}

}  // namespace tern::graph
