// Greedy pattern fusion over the graph in node order (fusion.h lists the
// patterns). A group runs at the position of its last node, so a group is
// valid when every value it produces that leaves it is read only by later
// nodes; intermediates a kernel keeps on chip must have one reader, inside
// the group, and must not be graph outputs.
#include "graph/fusion.h"

#include "graph/ops.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "util/error.h"

namespace tern::graph {

namespace {

bool is_act(Op op) {
  return op == Op::gelu || op == Op::gelu_tanh || op == Op::silu || op == Op::relu;
}
bool is_elementwise(Op op) {
  return op == Op::add || op == Op::sub || op == Op::mul || op == Op::scale || is_act(op) ||
         op == Op::cast;
}
class Fuser {
 public:
  explicit Fuser(const Graph& g) : g_(g), group_(g.nodes().size(), -1) {
    users_.resize(g.values().size());
    for (std::size_t i = 0; i < g.nodes().size(); ++i)
      for (int v : g.nodes()[i].inputs)
        users_[static_cast<std::size_t>(v)].push_back(static_cast<int>(i));
    for (int v : g.outputs()) outputs_.insert(v);
  }

  const Node& node(int i) const { return g_.nodes()[static_cast<std::size_t>(i)]; }
  int producer(int v) const { return g_.value(v).node; }
  const std::vector<int>& users(int v) const { return users_[static_cast<std::size_t>(v)]; }
  bool free(int n) const { return group_[static_cast<std::size_t>(n)] < 0; }
  // v's only reader is a node (and v is not a graph output): it can stay on chip.
  int sole_user(int v) const {
    if (outputs_.contains(v) || users(v).size() != 1) return -1;
    return users(v)[0];
  }
  int out(int n) const { return node(n).outputs[0]; }

  int make(std::string kernel, std::string detail, std::vector<int> nodes) {
    std::sort(nodes.begin(), nodes.end());
    const int id = static_cast<int>(groups_.size());
    for (int n : nodes) group_[static_cast<std::size_t>(n)] = id;
    groups_.push_back({std::move(kernel), std::move(detail), std::move(nodes)});
    return id;
  }

  // Values made in `nodes` and read outside are read only after the last node.
  bool escapes_ok(const std::vector<int>& nodes) const {
    const int last = *std::max_element(nodes.begin(), nodes.end());
    const std::set<int> in(nodes.begin(), nodes.end());
    for (int n : nodes)
      for (int v : node(n).outputs)
        for (int u : users(v))
          if (!in.contains(u) && u < last) return false;
    return true;
  }

  void attention_pattern() {
    for (int m = 0; m < static_cast<int>(g_.nodes().size()); ++m) {
      if (node(m).op != Op::matmul || !free(m) || attr_int(node(m).attrs, "trans_b", 0) == 0 ||
          attr_int(node(m).attrs, "trans_a", 0) != 0)
        continue;
      std::vector<int> nodes{m};
      int at = sole_user(out(m));
      if (at >= 0 && node(at).op == Op::scale && free(at))
        nodes.push_back(at), at = sole_user(out(at));
      if (at < 0 || node(at).op != Op::softmax || !free(at)) continue;
      nodes.push_back(at);
      const int pv = sole_user(out(at));
      if (pv < 0 || node(pv).op != Op::matmul || !free(pv) || node(pv).inputs[0] != out(at) ||
          attr_int(node(pv).attrs, "trans_a", 0) || attr_int(node(pv).attrs, "trans_b", 0))
        continue;
      nodes.push_back(pv);
      make("flash_attention", "from matmul, softmax, matmul", nodes);
    }
  }

  void glu_backward() {
    for (int ab = 0; ab < static_cast<int>(g_.nodes().size()); ++ab) {
      const Node& n = node(ab);
      if (n.op != Op::act_backward || !free(ab)) continue;
      const int m1 = producer(n.inputs[0]);
      if (node(m1).op != Op::mul || !free(m1) || sole_user(out(m1)) != ab) continue;
      const std::string func = attr_string(n.attrs, "func", "");
      if (func == "relu") continue;  // glu_backward_kernel has no ReGLU
      // The forward act(g) and the mul(d, act(g)) beside m1 (same d).
      for (int d : node(m1).inputs)
        for (int m2 : users(d)) {
          if (m2 == m1 || node(m2).op != Op::mul || !free(m2) || !free(ab)) continue;
          for (int y : node(m2).inputs) {
            const Node& a = node(producer(y));
            if (y != d && is_act(a.op) && std::string(op_name(a.op)) == func &&
                a.inputs[0] == n.inputs[1] && escapes_ok({m1, m2, ab})) {
              // The kernel recomputes act(gate): an act read only here joins.
              std::vector<int> nodes{m1, m2, ab};
              if (sole_user(y) == m2 && free(producer(y))) nodes.push_back(producer(y));
              make("glu_backward", func, nodes);
              break;
            }
          }
        }
    }
  }

  void glu() {
    for (int m = 0; m < static_cast<int>(g_.nodes().size()); ++m) {
      if (node(m).op != Op::mul || !free(m)) continue;
      for (int v : node(m).inputs) {
        const int a = producer(v);
        if (a >= 0 &&
            (node(a).op == Op::silu || node(a).op == Op::gelu || node(a).op == Op::gelu_tanh) &&
            free(a) && sole_user(v) == m && free(m) &&
            g_.value(node(m).inputs[0]).shape == g_.value(node(m).inputs[1]).shape) {
          make("glu", std::string(op_name(node(a).op)), {a, m});
        }
      }
    }
  }

  void cross_entropy() {
    for (int c = 0; c < static_cast<int>(g_.nodes().size()); ++c) {
      if (node(c).op != Op::cross_entropy || !free(c)) continue;
      for (int b : users(node(c).inputs[0]))
        if (node(b).op == Op::cross_entropy_backward && free(b) &&
            node(b).inputs[2] == node(c).inputs[1] && escapes_ok({c, b})) {
          make("cross_entropy", "forward and backward in one pass", {c, b});
          break;
        }
    }
  }

  void norms() {
    for (int n = 0; n < static_cast<int>(g_.nodes().size()); ++n) {
      const Op op = node(n).op;
      if ((op != Op::rmsnorm && op != Op::layernorm) || !free(n)) continue;
      std::vector<int> nodes{n};
      std::vector<std::string> what;
      const int p = producer(node(n).inputs[0]);
      if (p >= 0 && node(p).op == Op::add && free(p) &&
          g_.value(node(p).inputs[0]).shape == g_.value(node(p).inputs[1]).shape) {
        nodes.push_back(p);
        if (escapes_ok(nodes))
          what.push_back("residual add");
        else
          nodes.pop_back();
      }
      if (const int c = sole_user(out(n)); c >= 0 && node(c).op == Op::cast && free(c)) {
        // The group then runs at the cast: the residual sum's readers must
        // still come after it.
        nodes.push_back(c);
        if (escapes_ok(nodes))
          what.push_back("cast");
        else
          nodes.pop_back();
      }
      make(std::string(op_name(op)), fmt::format("{}", fmt::join(what, ", ")), nodes);
    }
  }

  void matmuls() {
    for (int m = 0; m < static_cast<int>(g_.nodes().size()); ++m) {
      if (node(m).op != Op::matmul || !free(m)) continue;
      std::vector<int> nodes{m};
      std::vector<std::string> what;
      for (int v : node(m).inputs) {
        const int t = producer(v);
        if (node(t).op == Op::transpose && free(t) && swaps_last_two(node(t)) &&
            sole_user(v) == m && g_.value(v).shape.size() == 2)
          nodes.push_back(t), what.push_back("transposed operand");
      }
      // The epilogue, in its order: scale, bias, activation, residual, cast.
      int stage = -1, v = out(m);
      for (;;) {
        const int c = sole_user(v);
        if (c < 0 || !free(c)) break;
        const Node& cn = node(c);
        int s = -1;
        std::string name;
        if (cn.op == Op::scale) {
          s = 0, name = "scale";
        } else if (cn.op == Op::add) {
          const int other = cn.inputs[0] == v ? cn.inputs[1] : cn.inputs[0];
          const Shape& os = g_.value(other).shape;
          const Shape& vs = g_.value(v).shape;
          if (os.size() == 1 && os[0] == vs.back())
            s = 1, name = "bias";
          else if (os == vs)
            s = 3, name = "residual";
        } else if (is_act(cn.op)) {
          s = 2, name = std::string(op_name(cn.op));
        } else if (cn.op == Op::cast) {
          s = 4, name = "cast";
        }
        if (s <= stage) break;
        stage = s;
        nodes.push_back(c);
        what.push_back(name);
        v = out(c);
      }
      make("matmul", what.empty() ? "" : fmt::format("{}", fmt::join(what, ", ")), nodes);
    }
  }

  // A total of x * x (a gradient norm's sum of squares): the reduce kernel
  // squares as it reads, x * x never goes to HBM.
  void sum_of_squares() {
    for (int t = 0; t < static_cast<int>(g_.nodes().size()); ++t) {
      if (node(t).op != Op::sum || !free(t) || !g_.value(out(t)).shape.empty() ||
          g_.value(out(t)).dtype != DType::fp32)
        continue;
      const int m = producer(node(t).inputs[0]);
      if (m < 0 || node(m).op != Op::mul || !free(m) || node(m).inputs[0] != node(m).inputs[1] ||
          sole_user(out(m)) != t)
        continue;
      make("reduce", "sum of squares", {m, t});
    }
  }

  void elementwise() {
    for (int e = 0; e < static_cast<int>(g_.nodes().size()); ++e) {
      // Every operand shaped like the result: the chain kernel does not
      // broadcast.
      auto same_shapes = [&](int n) {
        for (int in : node(n).inputs)
          if (g_.value(in).shape != g_.value(out(n)).shape) return false;
        return true;
      };
      if (!is_elementwise(node(e).op) || !free(e) || !same_shapes(e)) continue;
      std::vector<int> nodes{e};
      int v = out(e);
      for (;;) {
        const int c = sole_user(v);
        if (c < 0 || !free(c) || !is_elementwise(node(c).op) || !same_shapes(c)) break;
        nodes.push_back(c);
        v = out(c);
      }
      if (nodes.size() > 1)
        make("elementwise", fmt::format("{} ops in one pass", nodes.size()), nodes);
    }
  }

  // fusion.h QkvGradView.
  void attention_grad_merge() {
    for (int a = 0; a < static_cast<int>(g_.nodes().size()); ++a) {
      if (node(a).op != Op::attention_backward || !free(a)) continue;
      std::vector<int> members{a};
      std::set<int> parts;  // pad outputs and partial sums still to add up
      QkvGradView view;
      std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
      bool ok = true;
      for (std::size_t i = 0; i < 3 && ok; ++i) {
        const Shape& hs = g_.value(node(a).outputs[i]).shape;  // [B, H, S, D]
        const int t = sole_user(node(a).outputs[i]);
        ok = t >= 0 && free(t) && node(t).op == Op::transpose &&
             attr_ints(node(t).attrs, "perm") == std::vector<std::int64_t>{0, 2, 1, 3};
        const int r = ok ? sole_user(out(t)) : -1;
        ok = ok && r >= 0 && free(r) && node(r).op == Op::reshape &&
             g_.value(out(r)).shape == Shape{hs[0], hs[2], hs[1] * hs[3]};
        const int p = ok ? sole_user(out(r)) : -1;
        ok = ok && p >= 0 && free(p) && node(p).op == Op::pad;
        if (!ok) break;
        const std::int64_t ax = attr_int(node(p).attrs, "axis", 0);
        const std::int64_t w = g_.value(out(p)).shape[2];
        ok = (ax == 2 || ax == -1) && (view.width == 0 || view.width == w);
        view.width = w, view.col[i] = attr_int(node(p).attrs, "before", 0);
        ranges.emplace_back(view.col[i], view.col[i] + hs[1] * hs[3]);
        members.insert(members.end(), {t, r, p});
        parts.insert(out(p));
      }
      // Adds of two parts, each read only there, until one value is left.
      while (ok && parts.size() > 1) {
        ok = false;
        for (int v : parts) {
          const int u = sole_user(v);
          if (u < 0 || !free(u) || node(u).op != Op::add) continue;
          const int other = node(u).inputs[node(u).inputs[0] == v ? 1 : 0];
          if (other == v || !parts.contains(other) || sole_user(other) != u) continue;
          parts.erase(v), parts.erase(other), parts.insert(out(u));
          members.push_back(u);
          ok = true;
          break;
        }
      }
      if (!ok) continue;
      std::sort(ranges.begin(), ranges.end());
      std::int64_t at = 0;
      for (const auto& [b, e] : ranges) ok = ok && b == at, at = e;
      if (!ok || at != view.width || !escapes_ok(members)) continue;
      view.dest = *parts.begin();
      make("flash_attention_backward", "dq, dk, dv into the qkv gradient", members);
      qkv_grads_[a] = view;
      for (int n : members)
        if (n != a) absorbed_.insert(n);
    }
  }

  // Every AdamW step of the graph with the same hyperparameters, scalars
  // and dtypes in one multi-tensor kernel (kernel::AdamWSpec::tensors), as
  // PyTorch's fused AdamW; it runs where the last of them is.
  void optimizer() {
    std::map<std::string, std::vector<int>> sets;
    for (int n = 0; n < static_cast<int>(g_.nodes().size()); ++n) {
      const Node& x = node(n);
      if (x.op != Op::adamw || !free(n)) continue;
      const std::string key =
          fmt::format("{} {} {} {} {} %{}", attr_real(x.attrs, "beta1", 0.9),
                      attr_real(x.attrs, "beta2", 0.999), attr_real(x.attrs, "eps", 1e-8),
                      attr_string(x.attrs, "dtype", "bf16"), isa::name(g_.value(x.inputs[1]).dtype),
                      x.inputs[4]);
      sets[key].push_back(n);
    }
    for (auto& [key, nodes] : sets)
      if (nodes.size() > 1 && escapes_ok(nodes))
        make("adamw", fmt::format("{} tensors", nodes.size()), nodes);
  }

  // Everything left runs alone; then reshapes join the kernel that reads them.
  void rest() {
    for (int n = 0; n < static_cast<int>(g_.nodes().size()); ++n) {
      if (!free(n) || is_leaf(node(n).op)) continue;
      make(kernel_of(node(n).op), "", {n});
    }
    // A reshape moves no data: every reader reads its input's bytes. It
    // joins the group of its first reader (a chain of reshapes, the last
    // one's group).
    for (int n = static_cast<int>(g_.nodes().size()); n-- > 0;) {
      if (node(n).op != Op::reshape) continue;
      const auto& us = users(out(n));
      const int gr = group_[static_cast<std::size_t>(n)];
      if (us.empty() || groups_[static_cast<std::size_t>(gr)].nodes.size() != 1) continue;
      const int u = *std::min_element(us.begin(), us.end());
      const int target = group_[static_cast<std::size_t>(u)];
      if (target < 0) continue;
      auto& tn = groups_[static_cast<std::size_t>(target)].nodes;
      tn.insert(std::upper_bound(tn.begin(), tn.end(), n), n);
      groups_[static_cast<std::size_t>(gr)].nodes.clear();
      group_[static_cast<std::size_t>(n)] = target;
    }
  }

  // Head split chains read only by attention: views (fusion.h HeadView),
  // moved into the group of their first attention reader.
  void attention_views() {
    for (int a = 0; a < static_cast<int>(g_.nodes().size()); ++a) {
      const Op op = node(a).op;
      if (op != Op::attention && op != Op::attention_backward) continue;
      const int base = op == Op::attention_backward ? 1 : 0;
      for (int r = 0; r < 3; ++r) try_view(node(a).inputs[static_cast<std::size_t>(base + r)]);
      if (op == Op::attention_backward) try_view(node(a).inputs[0], true);  // dO
    }
  }
  // q, k, v (the inputs at base .. base + 2 of attention ops), or with
  // `grad_out` the dO of attention_backward (input 0, from column 0).
  void try_view(int t, bool grad_out = false) {
    if (views_.contains(t) || outputs_.contains(t)) return;
    const int tn = producer(t);
    if (node(tn).op != Op::transpose ||
        attr_ints(node(tn).attrs, "perm") != std::vector<std::int64_t>{0, 2, 1, 3})
      return;
    int first = -1;
    for (int u : users(t)) {
      const Node& un = node(u);
      const int base = un.op == Op::attention_backward ? 1 : 0;
      if (un.op != Op::attention && un.op != Op::attention_backward) return;
      for (std::size_t i = 0; i < un.inputs.size(); ++i) {
        const int at = static_cast<int>(i);
        const bool ok = grad_out ? base == 1 && at == 0 : at >= base && at <= base + 2;
        if (un.inputs[i] == t && !ok) return;
      }
      if (first < 0 || u < first) first = u;
    }
    const int rv = node(tn).inputs[0], rn = producer(rv);
    if (node(rn).op != Op::reshape || sole_user(rv) != tn) return;
    const Shape& hs = g_.value(rv).shape;  // [B, S, H, D]
    int x = node(rn).inputs[0];
    const Shape& xs = g_.value(x).shape;
    if (hs.size() != 4 || xs.size() != 3 || xs[0] != hs[0] || xs[1] != hs[1] ||
        xs[2] != hs[2] * hs[3])
      return;
    std::vector<int> chain{tn, rn};
    std::int64_t col0 = 0;
    const int sn = producer(x);
    if (node(sn).op == Op::slice && sole_user(x) == rn) {
      const Shape& ss = g_.value(node(sn).inputs[0]).shape;
      const std::int64_t ax = attr_int(node(sn).attrs, "axis", 0);
      if (ss.size() == 3 && (ax == 2 || ax == -1)) {
        col0 = attr_int(node(sn).attrs, "start", 0);
        x = node(sn).inputs[0];
        chain.push_back(sn);
      }
    }
    if (grad_out && col0 != 0) return;  // the kernel reads dO from column 0
    const Shape& src = g_.value(x).shape;
    views_[t] = {x, col0, hs[0], hs[1], hs[2], hs[3], src[2]};
    for (int n : chain) alias_[out(n)] = x;
    // Into the first reader's group.
    const int target = group_[static_cast<std::size_t>(first)];
    for (int n : chain) {
      auto& from = groups_[static_cast<std::size_t>(group_[static_cast<std::size_t>(n)])].nodes;
      from.erase(std::remove(from.begin(), from.end(), n), from.end());
      auto& to = groups_[static_cast<std::size_t>(target)].nodes;
      to.insert(std::upper_bound(to.begin(), to.end(), n), n);
      group_[static_cast<std::size_t>(n)] = target;
    }
  }

  // Attention's o read only by one transpose [0, 2, 1, 3] and by
  // attention_backward (as its o): the kernel writes the transpose's
  // [B, S, H, D] buffer itself, the backward reads o there (fusion.h
  // stored_in). Runs after attention_views (the transpose joins the group
  // that already has the head views).
  void attention_outputs() {
    for (int a = 0; a < static_cast<int>(g_.nodes().size()); ++a) {
      if (node(a).op != Op::attention) continue;
      const int o = node(a).outputs[0];
      if (outputs_.contains(o)) continue;
      int t = -1;
      bool ok = true;
      for (int u : users(o)) {
        const Node& un = node(u);
        if (un.op == Op::transpose && t < 0 &&
            attr_ints(un.attrs, "perm") == std::vector<std::int64_t>{0, 2, 1, 3})
          t = u;
        else if (un.op != Op::attention_backward || un.inputs[4] != o ||
                 std::count(un.inputs.begin(), un.inputs.end(), o) != 1)
          ok = false;
      }
      const int ga = group_[static_cast<std::size_t>(a)];
      if (!ok || t < 0 ||
          groups_[static_cast<std::size_t>(group_[static_cast<std::size_t>(t)])].nodes.size() != 1)
        continue;
      std::vector<int> merged = groups_[static_cast<std::size_t>(ga)].nodes;
      merged.push_back(t);
      if (!escapes_ok(merged)) continue;
      auto& from = groups_[static_cast<std::size_t>(group_[static_cast<std::size_t>(t)])].nodes;
      from.clear();
      auto& to = groups_[static_cast<std::size_t>(ga)].nodes;
      to.insert(std::upper_bound(to.begin(), to.end(), t), t);
      group_[static_cast<std::size_t>(t)] = ga;
      stored_in_[o] = out(t);
      absorbed_.insert(t);
    }
  }

  static std::string kernel_of(Op op) {
    switch (op) {
      case Op::attention:
        return "flash_attention";
      case Op::attention_backward:
        return "flash_attention_backward";
      case Op::reshape:
        return "view";
      case Op::slice:
      case Op::pad:
      case Op::concat:
      case Op::broadcast:
        return "copy";
      case Op::sum:
        return "reduce";
      case Op::act_backward:
        return "act_backward";
      default:
        return is_elementwise(op) && op != Op::cast ? "elementwise" : std::string(op_name(op));
    }
  }

  static std::string reason(const Graph& g, const Node& n) {
    switch (n.op) {
      case Op::matmul:
        return "no epilogue op follows that the matmul's output feeds alone";
      case Op::attention:
      case Op::attention_backward:
        return "one op is the whole flash-attention kernel";
      case Op::transpose:
        return "a layout change its reader cannot absorb: runs as a transpose";
      case Op::reshape:
        return "a view that only graph outputs read: no kernel, no data moves";
      case Op::slice:
      case Op::pad:
      case Op::concat:
      case Op::broadcast:
        return "data movement: DMA copies";
      case Op::sum:
        return "a reduction kernel (nothing before it to fuse with)";
      case Op::embedding:
      case Op::embedding_backward:
        return "gather / scatter-add by DMA: nothing to fuse with";
      case Op::rope:
        return "the rope kernel (not fused into the q / k projection)";
      case Op::adamw:
        return "the only tensor of its optimizer step (one multi-tensor kernel runs them all)";
      case Op::rmsnorm_backward:
      case Op::layernorm_backward:
      case Op::softmax_backward:
      case Op::act_backward:
        return "its own backward kernel";
      case Op::softmax:
        return "no cross-entropy or attention pattern around it";
      case Op::cross_entropy:
      case Op::cross_entropy_backward:
        return "forward or backward without its pair";
      case Op::cast:
        return "its producer has other readers";
      default:
        if (is_elementwise(n.op))
          return g.outputs().empty() ? "no neighbouring elementwise op"
                                     : "no neighbouring elementwise op with a single reader";
        return "no pattern applies";
    }
  }

  FusionReport finish() {
    FusionReport r;
    std::vector<int> order;
    for (std::size_t i = 0; i < groups_.size(); ++i)
      if (!groups_[i].nodes.empty()) order.push_back(static_cast<int>(i));
    std::sort(order.begin(), order.end(), [&](int a, int b) {
      return groups_[static_cast<std::size_t>(a)].last() <
             groups_[static_cast<std::size_t>(b)].last();
    });
    r.group_of.assign(g_.nodes().size(), -1);
    r.alone.assign(g_.nodes().size(), "");
    for (int gi : order) {
      const int id = static_cast<int>(r.groups.size());
      r.groups.push_back(groups_[static_cast<std::size_t>(gi)]);
      for (int n : r.groups.back().nodes) r.group_of[static_cast<std::size_t>(n)] = id;
    }
    // A view (a reshape, a head view's slice / reshape / transpose) counts
    // as fused when a kernel absorbs it; any other op when its kernel runs at
    // least one more op that is not a view (attention beside its head views
    // still runs alone in the flash kernel).
    auto is_view = [&](int m) {
      return node(m).op == Op::reshape || alias_.contains(node(m).outputs[0]);
    };
    for (std::size_t n = 0; n < g_.nodes().size(); ++n) {
      const Op op = node(static_cast<int>(n)).op;
      if (is_leaf(op)) continue;
      ++r.ops;
      const KernelGroup& gr = r.groups[static_cast<std::size_t>(r.group_of[n])];
      const auto real =
          std::count_if(gr.nodes.begin(), gr.nodes.end(), [&](int m) { return !is_view(m); });
      if (is_view(static_cast<int>(n)) ? gr.nodes.size() >= 2 : real >= 2)
        ++r.fused;
      else
        r.alone[n] = reason(g_, node(static_cast<int>(n)));
    }
    return r;
  }

 private:
  const Graph& g_;
  std::vector<int> group_;
  std::vector<std::vector<int>> users_;
  std::set<int> outputs_;
  std::vector<KernelGroup> groups_;
  std::map<int, HeadView> views_;
  std::map<int, int> alias_;
  std::map<int, QkvGradView> qkv_grads_;
  std::map<int, int> stored_in_;
  std::set<int> absorbed_;

 public:
  const std::map<int, HeadView>& views() const { return views_; }
  const std::map<int, int>& aliases() const { return alias_; }
  const std::map<int, QkvGradView>& qkv_grads() const { return qkv_grads_; }
  const std::map<int, int>& stored_in() const { return stored_in_; }
  const std::set<int>& absorbed() const { return absorbed_; }
};

}  // namespace

FusionReport fuse(const Graph& g) {
  Fuser f(g);
  f.attention_pattern();
  f.attention_grad_merge();
  f.glu_backward();
  f.glu();
  f.cross_entropy();
  f.norms();
  f.matmuls();
  f.sum_of_squares();
  f.elementwise();
  f.optimizer();
  f.rest();
  f.attention_views();
  f.attention_outputs();
  FusionReport r = f.finish();
  r.views = f.views();
  r.alias = f.aliases();
  r.qkv_grads = f.qkv_grads();
  r.stored_in = f.stored_in();
  r.absorbed = f.absorbed();
  return r;
}

std::string fusion_table(const Graph& g, const FusionReport& r) {
  std::string out = fmt::format("{:<5} {:<24} {:<26} {}\n", "#", "kernel", "ops", "note");
  for (std::size_t i = 0; i < r.groups.size(); ++i) {
    const KernelGroup& k = r.groups[i];
    std::vector<std::string> ops;
    for (int n : k.nodes)
      ops.push_back(fmt::format("{} %{}", op_name(g.nodes()[static_cast<std::size_t>(n)].op),
                                g.value(g.nodes()[static_cast<std::size_t>(n)].outputs[0]).name));
    auto note = [&](std::size_t j) {
      const std::string& why = r.alone[static_cast<std::size_t>(k.nodes[j])];
      if (!why.empty()) return "unfused: " + why;
      return j == 0 ? k.detail : std::string{};
    };
    out += fmt::format("{:<5} {:<24} {:<26} {}\n", i, k.kernel, ops[0], note(0));
    for (std::size_t j = 1; j < ops.size(); ++j)
      out += fmt::format("{:<5} {:<24} {:<26} {}\n", "", "", ops[j], note(j));
  }
  out += fmt::format("fusion rate {:.3f} ({} of {} ops in a kernel with others; {} kernels)\n",
                     r.rate(), r.fused, r.ops, r.groups.size());
  return out;
}

}  // namespace tern::graph
