// The reference interpreter (float64). Formulas: the op contracts in
// ops.cpp; norms and softmax over the last axis; attention per (batch,
// head) with query head h reading kv head h / (Hq / Hkv).
#include "graph/eval.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <set>

#include <fmt/format.h>

#include "graph/ops.h"
#include "graph/quant.h"
#include "util/error.h"

namespace tern::graph {

namespace {

using Index = std::vector<std::int64_t>;

std::vector<std::int64_t> strides(const Shape& s) {
  std::vector<std::int64_t> st(s.size(), 1);
  for (std::size_t i = s.size(); i-- > 1;) st[i - 1] = st[i] * s[i];
  return st;
}

// For each element of `out`, the flat index into a tensor of shape `in`
// broadcast to it.
std::vector<std::int64_t> broadcast_map(const Shape& in, const Shape& out) {
  const std::size_t r = out.size(), off = r - in.size();
  std::vector<std::int64_t> st(r, 0);
  const auto ins = strides(in);
  for (std::size_t i = 0; i < in.size(); ++i) st[off + i] = in[i] == 1 ? 0 : ins[i];
  const std::int64_t n = elements(out);
  std::vector<std::int64_t> map(static_cast<std::size_t>(n));
  Index idx(r, 0);
  for (std::int64_t f = 0; f < n; ++f) {
    std::int64_t at = 0;
    for (std::size_t i = 0; i < r; ++i) at += idx[i] * st[i];
    map[static_cast<std::size_t>(f)] = at;
    for (std::size_t i = r; i-- > 0;) {
      if (++idx[i] < out[i]) break;
      idx[i] = 0;
    }
  }
  return map;
}

double gelu(double x) {
  return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2));
}
double gelu_tanh(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}
double silu(double x) {
  return x / (1.0 + std::exp(-x));
}

double act(Op f, double x) {
  switch (f) {
    case Op::gelu:
      return gelu(x);
    case Op::gelu_tanh:
      return gelu_tanh(x);
    case Op::silu:
      return silu(x);
    default:
      return x > 0 ? x : 0.0;
  }
}

double act_dx(Op f, double x) {
  switch (f) {
    case Op::gelu: {
      const double pdf = std::exp(-0.5 * x * x) / std::sqrt(2.0 * std::numbers::pi);
      return 0.5 * (1.0 + std::erf(x / std::numbers::sqrt2)) + x * pdf;
    }
    case Op::gelu_tanh: {
      const double c = std::sqrt(2.0 / std::numbers::pi);
      const double u = c * (x + 0.044715 * x * x * x), t = std::tanh(u);
      return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
    }
    case Op::silu: {
      const double s = 1.0 / (1.0 + std::exp(-x));
      return s * (1.0 + x * (1.0 - s));
    }
    default:
      return x > 0 ? 1.0 : 0.0;
  }
}

// C[b] (M x N) = op(A[b]) op(B[b or shared]) with op = transpose when asked.
void matmul(const HostData& a, const Shape& as, const HostData& b, const Shape& bs, bool ta,
            bool tb, HostData& c) {
  const std::size_t r = as.size(), rb = bs.size();
  const std::int64_t M = as[r - (ta ? 1 : 2)], K = as[r - (ta ? 2 : 1)];
  const std::int64_t N = bs[rb - (tb ? 2 : 1)];
  const std::int64_t batch = elements(Shape(as.begin(), as.end() - 2));
  const bool shared = rb == 2;
  c.assign(static_cast<std::size_t>(batch * M * N), 0.0);
  for (std::int64_t q = 0; q < batch; ++q) {
    const double* A = a.data() + q * M * K;
    const double* B = b.data() + (shared ? 0 : q * K * N);
    double* C = c.data() + q * M * N;
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t k = 0; k < K; ++k) {
        const double av = ta ? A[k * M + i] : A[i * K + k];
        for (std::int64_t j = 0; j < N; ++j)
          C[i * N + j] += av * (tb ? B[j * K + k] : B[k * N + j]);
      }
  }
}

std::int64_t id_at(const HostData& ids, std::size_t i, std::int64_t limit, const char* what) {
  const double d = ids[i];
  const auto v = static_cast<std::int64_t>(d);
  if (static_cast<double>(v) != d || v < 0 || v >= limit)
    throw Error(fmt::format("{}: id {} at position {} is not in [0, {})", what, d, i, limit));
  return v;
}

}  // namespace

std::vector<HostData> evaluate(const Graph& g, const std::map<std::string, HostData>& feeds,
                               DelayedScaling* scaling,
                               std::map<std::string, QuantStats>* monitor) {
  std::vector<HostData> val(g.values().size());
  for (std::size_t ni = 0; ni < g.nodes().size(); ++ni) {
    const Node& n = g.nodes()[ni];
    auto in = [&](std::size_t i) -> const HostData& {
      return val[static_cast<std::size_t>(n.inputs[i])];
    };
    auto iv = [&](std::size_t i) -> const Value& { return g.value(n.inputs[i]); };
    auto out = [&](std::size_t i) -> HostData& {
      return val[static_cast<std::size_t>(n.outputs[i])];
    };
    const Value& o0 = g.value(n.outputs[0]);
    const std::int64_t total = elements(o0.shape);
    const auto N = static_cast<std::size_t>(total);
    try {
      switch (n.op) {
        case Op::input:
        case Op::param: {
          const auto it = feeds.find(o0.name);
          if (it == feeds.end()) throw Error(fmt::format("no value fed for %{}", o0.name));
          if (it->second.size() != N)
            throw Error(fmt::format("%{} {} needs {} values, {} fed", o0.name,
                                    shape_string(o0.shape), N, it->second.size()));
          out(0) = it->second;
          break;
        }
        case Op::full:
          out(0).assign(N, attr_real(n.attrs, "value", 0.0));
          break;
        case Op::matmul: {
          const bool ta = attr_int(n.attrs, "trans_a", 0) != 0,
                     tb = attr_int(n.attrs, "trans_b", 0) != 0;
          const MatmulQuant q = matmul_quant(n.attrs);
          if (!q.any()) {
            matmul(in(0), iv(0).shape, in(1), iv(1).shape, ta, tb, out(0));
            break;
          }
          // The operands as the Tensor engine sees them (quant.h).
          HostData a = in(0), b = in(1);
          auto quantize = [&](HostData& x, int i, bool k_last, const OperandQuant& oq) {
            const std::string site =
                fmt::format("{}.{}", g.value(n.outputs[0]).name, i == 0 ? "a" : "b");
            const bool delayed = q.delayed && oq.kind == QuantKind::fp8_tensor;
            if (delayed && !scaling)
              throw Error(
                  fmt::format("matmul %{}: delayed FP8 scaling needs its state (evaluate "
                              "with a DelayedScaling)",
                              g.value(n.outputs[0]).name));
            const std::optional<float> s =
                delayed ? std::optional<float>(scaling->scale(site)) : std::nullopt;
            const float amax = fake_quantize(x, iv(static_cast<std::size_t>(i)).shape, k_last, oq,
                                             q.policy, iv(static_cast<std::size_t>(i)).dtype, s,
                                             monitor ? &(*monitor)[site] : nullptr);
            if (delayed) scaling->record(site, oq.fp8, amax, q.history);
          };
          quantize(a, 0, !ta, q.a);
          quantize(b, 1, tb, q.b);
          matmul(a, iv(0).shape, b, iv(1).shape, ta, tb, out(0));
          break;
        }
        case Op::add:
        case Op::sub:
        case Op::mul: {
          const auto ma = broadcast_map(iv(0).shape, o0.shape),
                     mb = broadcast_map(iv(1).shape, o0.shape);
          out(0).resize(N);
          for (std::size_t i = 0; i < N; ++i) {
            const double x = in(0)[static_cast<std::size_t>(ma[i])],
                         y = in(1)[static_cast<std::size_t>(mb[i])];
            out(0)[i] = n.op == Op::add ? x + y : n.op == Op::sub ? x - y : x * y;
          }
          break;
        }
        case Op::scale: {
          const double c = attr_real(n.attrs, "value", 1.0);
          out(0).resize(N);
          for (std::size_t i = 0; i < N; ++i) out(0)[i] = in(0)[i] * c;
          break;
        }
        case Op::gelu:
        case Op::gelu_tanh:
        case Op::silu:
        case Op::relu:
          out(0).resize(N);
          for (std::size_t i = 0; i < N; ++i) out(0)[i] = act(n.op, in(0)[i]);
          break;
        case Op::act_backward: {
          const Op f = parse_op(attr_string(n.attrs, "func", ""));
          out(0).resize(N);
          for (std::size_t i = 0; i < N; ++i) out(0)[i] = in(0)[i] * act_dx(f, in(1)[i]);
          break;
        }
        case Op::rmsnorm:
        case Op::layernorm:
        case Op::rmsnorm_backward:
        case Op::layernorm_backward: {
          const bool ln = n.op == Op::layernorm || n.op == Op::layernorm_backward;
          const bool bwd = n.op == Op::rmsnorm_backward || n.op == Op::layernorm_backward;
          const double eps = attr_real(n.attrs, "eps", ln ? 1e-5 : 1e-6);
          const HostData& x = bwd ? in(1) : in(0);
          const HostData& gm = bwd ? in(2) : in(1);
          const Shape& xs = bwd ? iv(1).shape : iv(0).shape;
          const auto D = static_cast<std::size_t>(xs.back());
          const std::size_t rows = static_cast<std::size_t>(elements(xs)) / D;
          out(0).assign(rows * D, 0.0);
          if (bwd)
            for (std::size_t k = 1; k < n.outputs.size(); ++k) out(k).assign(D, 0.0);
          std::vector<double> xh(D);
          for (std::size_t r = 0; r < rows; ++r) {
            const double* xr = x.data() + r * D;
            double mean = 0, ms = 0;
            if (ln) {
              for (std::size_t j = 0; j < D; ++j) mean += xr[j];
              mean /= static_cast<double>(D);
            }
            for (std::size_t j = 0; j < D; ++j) ms += (xr[j] - mean) * (xr[j] - mean);
            const double rstd = 1.0 / std::sqrt(ms / static_cast<double>(D) + eps);
            for (std::size_t j = 0; j < D; ++j) xh[j] = (xr[j] - mean) * rstd;
            if (!bwd) {
              for (std::size_t j = 0; j < D; ++j)
                out(0)[r * D + j] = xh[j] * gm[j] + (ln ? in(2)[j] : 0.0);
              continue;
            }
            const double* dy = in(0).data() + r * D;
            double m1 = 0, m2 = 0;  // mean(g dy), mean(g dy xh)
            for (std::size_t j = 0; j < D; ++j) {
              m1 += gm[j] * dy[j];
              m2 += gm[j] * dy[j] * xh[j];
            }
            m1 /= static_cast<double>(D), m2 /= static_cast<double>(D);
            for (std::size_t j = 0; j < D; ++j) {
              out(0)[r * D + j] = rstd * (gm[j] * dy[j] - (ln ? m1 : 0.0) - xh[j] * m2);
              out(1)[j] += dy[j] * xh[j];
              if (ln) out(2)[j] += dy[j];
            }
          }
          break;
        }
        case Op::softmax:
        case Op::softmax_backward: {
          const auto D = static_cast<std::size_t>(o0.shape.back());
          out(0).resize(N);
          for (std::size_t r = 0; r < N / D; ++r) {
            if (n.op == Op::softmax) {
              const double* x = in(0).data() + r * D;
              const double mx = *std::max_element(x, x + D);
              double s = 0;
              for (std::size_t j = 0; j < D; ++j) s += std::exp(x[j] - mx);
              for (std::size_t j = 0; j < D; ++j) out(0)[r * D + j] = std::exp(x[j] - mx) / s;
            } else {
              const double *dy = in(0).data() + r * D, *y = in(1).data() + r * D;
              double s = 0;
              for (std::size_t j = 0; j < D; ++j) s += dy[j] * y[j];
              for (std::size_t j = 0; j < D; ++j) out(0)[r * D + j] = y[j] * (dy[j] - s);
            }
          }
          break;
        }
        case Op::cross_entropy:
        case Op::cross_entropy_backward: {
          const bool bwd = n.op == Op::cross_entropy_backward;
          const HostData& l = in(bwd ? 1 : 0);
          const HostData& t = in(bwd ? 2 : 1);
          const std::int64_t V = iv(bwd ? 1 : 0).shape.back();
          const std::int64_t ign = attr_int(n.attrs, "ignore_index", -100);
          const std::size_t T = t.size();
          std::size_t valid = 0;
          for (double x : t) valid += static_cast<std::int64_t>(x) != ign;
          double loss = 0;
          if (bwd) out(0).assign(T * static_cast<std::size_t>(V), 0.0);
          for (std::size_t r = 0; r < T; ++r) {
            if (static_cast<std::int64_t>(t[r]) == ign) continue;
            const std::int64_t y = id_at(t, r, V, "cross_entropy targets");
            const double* x = l.data() + r * static_cast<std::size_t>(V);
            const double mx = *std::max_element(x, x + V);
            double s = 0;
            for (std::int64_t j = 0; j < V; ++j) s += std::exp(x[j] - mx);
            loss += std::log(s) + mx - x[y];
            if (bwd) {
              const double c = in(0)[0] / static_cast<double>(valid);
              for (std::int64_t j = 0; j < V; ++j)
                out(0)[r * static_cast<std::size_t>(V) + static_cast<std::size_t>(j)] =
                    c * (std::exp(x[j] - mx) / s - (j == y ? 1.0 : 0.0));
            }
          }
          if (!bwd)
            out(0).assign(1, valid ? loss / static_cast<double>(valid)
                                   : std::numeric_limits<double>::quiet_NaN());
          break;
        }
        case Op::embedding: {
          const auto D = static_cast<std::size_t>(iv(0).shape[1]);
          const std::int64_t V = iv(0).shape[0];
          out(0).resize(N);
          for (std::size_t r = 0; r < in(1).size(); ++r) {
            const auto id = static_cast<std::size_t>(id_at(in(1), r, V, "embedding ids"));
            std::copy_n(in(0).begin() + static_cast<std::ptrdiff_t>(id * D), D,
                        out(0).begin() + static_cast<std::ptrdiff_t>(r * D));
          }
          break;
        }
        case Op::embedding_backward: {
          const auto D = static_cast<std::size_t>(o0.shape[1]);
          out(0).assign(N, 0.0);
          for (std::size_t r = 0; r < in(1).size(); ++r) {
            const auto id = static_cast<std::size_t>(id_at(in(1), r, o0.shape[0], "embedding ids"));
            for (std::size_t j = 0; j < D; ++j) out(0)[id * D + j] += in(0)[r * D + j];
          }
          break;
        }
        case Op::adamw: {
          const double b1 = attr_real(n.attrs, "beta1", 0.9),
                       b2 = attr_real(n.attrs, "beta2", 0.999);
          const double eps = attr_real(n.attrs, "eps", 1e-8);
          const HostData& sc = in(4);  // decay, 1 - b1, 1 - b2, sqrt(bc2), -step
          for (std::size_t o = 0; o < 4; ++o) out(o).resize(N);
          for (std::size_t i = 0; i < N; ++i) {
            const double gr = in(1)[i];
            const double m = b1 * in(2)[i] + sc[1] * gr, v = b2 * in(3)[i] + sc[2] * gr * gr;
            const double p = in(0)[i] * sc[0] + sc[4] * m / (std::sqrt(v) / sc[3] + eps);
            out(0)[i] = p, out(1)[i] = m, out(2)[i] = v, out(3)[i] = p;
          }
          break;
        }
        case Op::rope: {
          const Shape& s = o0.shape;
          const auto S = static_cast<std::size_t>(s[2]), H = static_cast<std::size_t>(s[3] / 2);
          const double sg = attr_int(n.attrs, "inverse", 0) ? -1.0 : 1.0;
          out(0).resize(N);
          for (std::size_t r = 0; r < N / (2 * H); ++r) {
            const std::size_t p = r % S;
            const double* x = in(0).data() + r * 2 * H;
            double* y = out(0).data() + r * 2 * H;
            for (std::size_t j = 0; j < H; ++j) {
              const double c = in(1)[p * H + j], sn = sg * in(2)[p * H + j];
              y[j] = x[j] * c - x[j + H] * sn;
              y[j + H] = x[j + H] * c + x[j] * sn;
            }
          }
          break;
        }
        case Op::attention:
        case Op::attention_backward: {
          const bool bwd = n.op == Op::attention_backward;
          const std::size_t qi = bwd ? 1 : 0;
          const Shape &qs = iv(qi).shape, &ks = iv(qi + 1).shape;
          const auto B = static_cast<std::size_t>(qs[0]), Hq = static_cast<std::size_t>(qs[1]);
          const auto S = static_cast<std::size_t>(qs[2]), D = static_cast<std::size_t>(qs[3]);
          const auto Hk = static_cast<std::size_t>(ks[1]), Sk = static_cast<std::size_t>(ks[2]);
          const bool causal = attr_int(n.attrs, "causal", 1) != 0;
          const double sc = attr_real(n.attrs, "scale", 1.0 / std::sqrt(static_cast<double>(D)));
          const HostData &q = in(qi), &k = in(qi + 1), &v = in(qi + 2);
          if (!bwd) {
            out(0).assign(B * Hq * S * D, 0.0);
            out(1).assign(B * Hq * S, 0.0);
          } else {
            out(0).assign(q.size(), 0.0), out(1).assign(k.size(), 0.0),
                out(2).assign(v.size(), 0.0);
          }
          std::vector<double> p(Sk);
          for (std::size_t b = 0; b < B; ++b)
            for (std::size_t h = 0; h < Hq; ++h) {
              const std::size_t kh = h / (Hq / Hk);
              const double* Q = q.data() + (b * Hq + h) * S * D;
              const std::size_t ko = (b * Hk + kh) * Sk * D;
              for (std::size_t i = 0; i < S; ++i) {
                double mx = -std::numeric_limits<double>::infinity();
                for (std::size_t j = 0; j < Sk; ++j) {
                  if (causal && j > i) {
                    p[j] = -std::numeric_limits<double>::infinity();
                    continue;
                  }
                  double s = 0;
                  for (std::size_t d = 0; d < D; ++d) s += Q[i * D + d] * k[ko + j * D + d];
                  p[j] = sc * s;
                  mx = std::max(mx, p[j]);
                }
                double z = 0;
                for (std::size_t j = 0; j < Sk; ++j) z += std::exp(p[j] - mx);
                for (std::size_t j = 0; j < Sk; ++j) p[j] = std::exp(p[j] - mx) / z;
                const std::size_t oi = ((b * Hq + h) * S + i) * D;
                if (!bwd) {
                  for (std::size_t j = 0; j < Sk; ++j)
                    for (std::size_t d = 0; d < D; ++d) out(0)[oi + d] += p[j] * v[ko + j * D + d];
                  out(1)[(b * Hq + h) * S + i] = mx + std::log(z);
                  continue;
                }
                // dP = do V^T; dS = P (dP - sum(do * o)); dq = sc dS K;
                // dk += sc dS^T q; dv += P^T do.
                const double* dO = in(0).data() + oi;
                const double* O = in(4).data() + oi;
                double delta = 0;
                for (std::size_t d = 0; d < D; ++d) delta += dO[d] * O[d];
                for (std::size_t j = 0; j < Sk; ++j) {
                  if (p[j] == 0.0) continue;
                  double dp = 0;
                  for (std::size_t d = 0; d < D; ++d) dp += dO[d] * v[ko + j * D + d];
                  const double ds = p[j] * (dp - delta);
                  for (std::size_t d = 0; d < D; ++d) {
                    out(0)[oi + d] += sc * ds * k[ko + j * D + d];
                    out(1)[ko + j * D + d] += sc * ds * Q[i * D + d];
                    out(2)[ko + j * D + d] += p[j] * dO[d];
                  }
                }
              }
            }
          break;
        }
        case Op::reshape:
        case Op::cast:
          out(0) = in(0);
          break;
        case Op::transpose: {
          const std::vector<std::int64_t> perm = attr_ints(n.attrs, "perm");
          const auto is = strides(iv(0).shape);
          const std::size_t r = perm.size();
          out(0).resize(N);
          Index idx(r, 0);
          for (std::size_t f = 0; f < N; ++f) {
            std::int64_t at = 0;
            for (std::size_t i = 0; i < r; ++i)
              at += idx[i] * is[static_cast<std::size_t>(perm[i])];
            out(0)[f] = in(0)[static_cast<std::size_t>(at)];
            for (std::size_t i = r; i-- > 0;) {
              if (++idx[i] < o0.shape[i]) break;
              idx[i] = 0;
            }
          }
          break;
        }
        case Op::slice:
        case Op::pad:
        case Op::concat: {
          // Copies each input into its range along `axis` of the output
          // (slice: the output's range of the input).
          const Shape& os = o0.shape;
          const auto ax = static_cast<std::size_t>(
              (attr_int(n.attrs, "axis", 0) + static_cast<std::int64_t>(os.size())) %
              static_cast<std::int64_t>(os.size()));
          const std::int64_t outer = elements(Shape(os.begin(), os.begin() + ax));
          const std::int64_t inner = elements(Shape(os.begin() + ax + 1, os.end()));
          out(0).assign(N, 0.0);
          if (n.op == Op::slice) {
            const std::int64_t a = iv(0).shape[ax], b0 = attr_int(n.attrs, "start", 0);
            for (std::int64_t o = 0; o < outer; ++o)
              for (std::int64_t j = 0; j < os[ax]; ++j)
                for (std::int64_t e = 0; e < inner; ++e)
                  out(0)[static_cast<std::size_t>((o * os[ax] + j) * inner + e)] =
                      in(0)[static_cast<std::size_t>((o * a + b0 + j) * inner + e)];
            break;
          }
          std::int64_t at = n.op == Op::pad ? attr_int(n.attrs, "before", 0) : 0;
          for (std::size_t k = 0; k < n.inputs.size(); ++k) {
            const std::int64_t a = iv(k).shape[ax];
            for (std::int64_t o = 0; o < outer; ++o)
              for (std::int64_t j = 0; j < a; ++j)
                for (std::int64_t e = 0; e < inner; ++e)
                  out(0)[static_cast<std::size_t>((o * os[ax] + at + j) * inner + e)] =
                      in(k)[static_cast<std::size_t>((o * a + j) * inner + e)];
            at += a;
          }
          break;
        }
        case Op::sum: {
          const Shape& is = iv(0).shape;
          std::vector<std::int64_t> axes = attr_ints(n.attrs, "axes");
          std::set<std::size_t> red;
          for (std::int64_t a : axes)
            red.insert(static_cast<std::size_t>((a + static_cast<std::int64_t>(is.size())) %
                                                static_cast<std::int64_t>(is.size())));
          if (axes.empty())
            for (std::size_t i = 0; i < is.size(); ++i) red.insert(i);
          Shape kept = is;  // the input shape with reduced dims set to 1
          for (std::size_t i : red) kept[i] = 1;
          const auto map = broadcast_map(kept, is);
          out(0).assign(static_cast<std::size_t>(elements(kept)), 0.0);
          for (std::size_t i = 0; i < in(0).size(); ++i)
            out(0)[static_cast<std::size_t>(map[i])] += in(0)[i];
          break;
        }
        case Op::broadcast: {
          const auto map = broadcast_map(iv(0).shape, o0.shape);
          out(0).resize(N);
          for (std::size_t i = 0; i < N; ++i) out(0)[i] = in(0)[static_cast<std::size_t>(map[i])];
          break;
        }
        case Op::count_:
          throw Error("bad op");
      }
    } catch (const Error& e) {
      throw Error(fmt::format("evaluating {} %{}: {}", op_name(n.op), o0.name, e.what()));
    }
  }
  if (scaling) scaling->update();
  return val;
}

}  // namespace tern::graph
