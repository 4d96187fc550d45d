#include "kernel/reference.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "isa/dtype.h"
#include "isa/instruction.h"
#include "kernel/detail.h"
#include "num/convert.h"
#include "num/mx.h"
#include "util/error.h"

namespace tern::kernel {

std::vector<float> matmul_reference(const std::vector<float>& at, const std::vector<float>& b,
                                    std::int64_t m, std::int64_t n, std::int64_t k,
                                    bool fp32_products) {
  std::vector<float> c(static_cast<std::size_t>(m * n), 0.0f);
  for (std::int64_t i = 0; i < m; ++i) {
    float* row = c.data() + i * n;
    for (std::int64_t kk = 0; kk < k; ++kk) {
      const float a = at[static_cast<std::size_t>(kk * m + i)];
      const float* br = b.data() + kk * n;
      if (fp32_products) {
        for (std::int64_t j = 0; j < n; ++j) {
          const float p = a * br[j];
          row[j] = row[j] + p;
        }
      } else {
        for (std::int64_t j = 0; j < n; ++j) row[j] = std::fma(a, br[j], row[j]);
      }
    }
  }
  return c;
}

std::vector<float> mx_roundtrip_columns(const std::vector<float>& v, std::int64_t k, std::int64_t c,
                                        bool e5m2) {
  const num::MxFormat& f = num::mx_format(e5m2 ? num::MxId::mxfp8_e5m2 : num::MxId::mxfp8_e4m3);
  std::vector<float> col(static_cast<std::size_t>(k)), deq(col.size()), out(v.size());
  std::vector<std::uint8_t> el(col.size()), sc(col.size() / num::kMxBlock);
  for (std::int64_t j = 0; j < c; ++j) {
    for (std::int64_t i = 0; i < k; ++i) col[i] = v[static_cast<std::size_t>(i * c + j)];
    num::mx_quantize(f, num::ScalePolicy::trn3, col, el, sc);
    num::mx_dequantize(f, el, sc, deq);
    for (std::int64_t i = 0; i < k; ++i) out[static_cast<std::size_t>(i * c + j)] = deq[i];
  }
  return out;
}

void epilogue_reference(std::vector<float>& c, const std::vector<float>& bias,
                        const std::vector<float>& residual, const Epilogue& e, std::int64_t m,
                        std::int64_t n) {
  const auto size = static_cast<std::size_t>(m * n);
  if (c.size() != size || (e.bias && bias.size() != static_cast<std::size_t>(n)) ||
      (e.residual && residual.size() != size)) {
    throw Error("epilogue_reference: sizes do not match the [M, N] shape");
  }
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      float& x = c[static_cast<std::size_t>(i * n + j)];
      if (e.bias) {
        if (e.scale != 1.0f) x = x * e.scale;
        x = x + bias[static_cast<std::size_t>(j)];
        if (e.act != isa::ActFunc::identity) x = isa::apply_act(e.act, x * 1.0f + 0.0f);
      } else if (e.scale != 1.0f || e.act != isa::ActFunc::identity) {
        x = isa::apply_act(e.act, x * e.scale + 0.0f);  // one Scalar-engine activation
      }
      if (e.residual) x = x + residual[static_cast<std::size_t>(i * n + j)];
    }
  }
}

std::vector<float> epilogue_quant_reference(std::vector<float>& y, float qscale, const Epilogue& e,
                                            std::int64_t m, std::int64_t n, std::int64_t tn) {
  if (y.size() != static_cast<std::size_t>(m * n) || tn < 1)
    throw Error("epilogue_quant_reference: sizes do not match the [M, N] shape");
  const std::int64_t tiles = (n + tn - 1) / tn;
  std::vector<float> amax;
  if (e.amax) {
    amax.resize(static_cast<std::size_t>(m * tiles));
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t t = 0; t < tiles; ++t) {
        const float* row = y.data() + i * n + t * tn;
        const std::int64_t w = std::min(tn, n - t * tn);
        float a = row[0];
        for (std::int64_t j = 1; j < w; ++j) a = isa::apply_alu(isa::AluOp::abs_max, a, row[j]);
        amax[static_cast<std::size_t>(i * tiles + t)] =
            isa::apply_alu(isa::AluOp::abs_max, a, 0.0f);
      }
  }
  if (e.qscale)
    for (float& v : y) v = v * qscale;
  return amax;
}

void round_output(std::vector<float>& y, isa::DType out) {
  if (out == isa::DType::fp32) return;
  num::round_array(*isa::format_of(out), y,
                   {num::Rounding::nearest_even,
                    isa::is_fp8(out) ? num::Overflow::saturate : num::Overflow::non_saturating, 0});
}

namespace {
// Applies a NormQuant to the unrounded [rows, dim] y in place (amax, scale,
// cast); without one, rounds with `round`.
std::vector<float> finish_norm_output(std::vector<float>& y, std::int64_t rows, std::int64_t dim,
                                      float (*round)(float), const NormQuant* q) {
  std::vector<float> amax;
  if (!q) {
    for (float& v : y) v = round(v);
    return amax;
  }
  if (q->amax) {
    for (std::int64_t i = 0; i < rows; ++i) {
      const float* row = y.data() + i * dim;
      float a = row[0];
      for (std::int64_t j = 1; j < dim; ++j) a = isa::apply_alu(isa::AluOp::abs_max, a, row[j]);
      amax.push_back(isa::apply_alu(isa::AluOp::abs_max, a, 0.0f));
    }
  }
  if (q->qscale)
    for (float& v : y) v = v * q->scale;
  round_output(y, q->out);
  return amax;
}
}  // namespace

RmsNormResult rmsnorm_reference(const std::vector<float>& x, const std::vector<float>& gamma,
                                const std::vector<float>* residual, std::int64_t rows,
                                std::int64_t dim, float eps, float (*round)(float),
                                const NormQuant* quant) {
  const auto size = static_cast<std::size_t>(rows * dim);
  if (x.size() != size || gamma.size() != static_cast<std::size_t>(dim) ||
      (residual && residual->size() != size)) {
    throw Error("rmsnorm_reference: sizes do not match the [R, D] shape");
  }
  RmsNormResult r;
  r.y.resize(size);
  r.rstd.resize(static_cast<std::size_t>(rows));
  std::vector<float> h = x;
  if (residual) {
    for (std::size_t i = 0; i < size; ++i) h[i] = round(x[i] + (*residual)[i]);
    r.h = h;
  }
  const float inv_d = 1.0f / static_cast<float>(dim);
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* row = h.data() + i * dim;
    float sum = 0.0f;
    for (std::int64_t j = 0; j < dim; ++j) sum += row[j] * row[j];
    const float rstd = 1.0f / std::sqrt(sum * inv_d + eps);
    r.rstd[static_cast<std::size_t>(i)] = rstd;
    for (std::int64_t j = 0; j < dim; ++j) {
      const float t = row[j] * gamma[static_cast<std::size_t>(j)];
      r.y[static_cast<std::size_t>(i * dim + j)] = t * rstd;
    }
  }
  r.amax = finish_norm_output(r.y, rows, dim, round, quant);
  return r;
}

std::vector<float> adamw_reference(std::vector<float>& param, const std::vector<float>& grad,
                                   std::vector<float>& m, std::vector<float>& v,
                                   const AdamWSpec& spec) {
  const std::size_t n = param.size();
  if (grad.size() != n || m.size() != n || v.size() != n)
    throw Error("adamw_reference: param, grad, m and v differ in size");
  const AdamWScalars k = adamw_scalars(spec);
  const num::Format& bf16 = *isa::format_of(isa::DType::bf16);
  std::vector<float> pb(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float g = grad[i];
    float p = param[i] * k.decay + 0.0f;  // a Scalar-engine activation: x * scale + 0
    float mm = m[i] * spec.beta1 + 0.0f;
    mm = mm + g * k.one_m_b1;
    float vv = v[i] * spec.beta2 + 0.0f;
    vv = vv + (g * g) * k.one_m_b2;
    float a = std::sqrt(vv * 1.0f + 0.0f);
    a = a / k.bc2_sqrt + spec.eps;
    a = mm / a;
    a = a * k.neg_step_size;
    p = p + a;
    param[i] = p;
    m[i] = mm;
    v[i] = vv;
    pb[i] = num::round_to(bf16, p);
  }
  return pb;
}

RmsNormGrads rmsnorm_backward_reference(const std::vector<float>& dy, const std::vector<float>& h,
                                        const std::vector<float>& gamma,
                                        const std::vector<float>& rstd, std::int64_t rows,
                                        std::int64_t dim, int cores, int partitions,
                                        float (*round)(float)) {
  const auto size = static_cast<std::size_t>(rows * dim);
  if (dy.size() != size || h.size() != size || gamma.size() != static_cast<std::size_t>(dim) ||
      rstd.size() != static_cast<std::size_t>(rows) || cores < 1 || partitions < 1) {
    throw Error("rmsnorm_backward_reference: sizes do not match the [R, D] shape");
  }
  RmsNormGrads g;
  g.dh.resize(size);
  g.dgamma_parts.assign(static_cast<std::size_t>(cores * dim), 0.0f);
  const float neg_inv_d = -1.0f / static_cast<float>(dim);
  const auto D = static_cast<std::size_t>(dim);
  const std::int64_t tiles = (rows + partitions - 1) / partitions;
  for (std::int64_t t = 0; t < tiles; ++t) {
    const auto core = static_cast<std::size_t>(t % cores);
    for (std::int64_t r = t * partitions; r < std::min(rows, (t + 1) * partitions); ++r) {
      const std::size_t row = static_cast<std::size_t>(r) * D;
      const float rs = rstd[static_cast<std::size_t>(r)];
      float dot = 0.0f;
      for (std::size_t j = 0; j < D; ++j) dot = dot + (dy[row + j] * gamma[j]) * h[row + j];
      float coef = (dot * rs) * rs;
      coef = (coef * rs) * neg_inv_d;
      float* dg = g.dgamma_parts.data() + core * D;
      for (std::size_t j = 0; j < D; ++j) {
        const float gg = dy[row + j] * gamma[j];
        g.dh[row + j] = round(gg * rs + h[row + j] * coef);
        dg[j] = dg[j] + rs * (dy[row + j] * h[row + j]);
      }
    }
  }
  return g;
}

LayerNormResult layernorm_reference(const std::vector<float>& x, const std::vector<float>& gamma,
                                    const std::vector<float>& beta,
                                    const std::vector<float>* residual, std::int64_t rows,
                                    std::int64_t dim, float eps, std::int64_t chunk,
                                    float (*round)(float), const NormQuant* quant) {
  const auto size = static_cast<std::size_t>(rows * dim), D = static_cast<std::size_t>(dim);
  if (x.size() != size || gamma.size() != D || beta.size() != D ||
      (residual && residual->size() != size) || chunk < 1) {
    throw Error("layernorm_reference: sizes do not match the [R, D] shape");
  }
  LayerNormResult r;
  r.y.resize(size);
  r.mean.resize(static_cast<std::size_t>(rows));
  r.rstd.resize(static_cast<std::size_t>(rows));
  std::vector<float> h = x;
  if (residual) {
    for (std::size_t i = 0; i < size; ++i) h[i] = round(x[i] + (*residual)[i]);
    r.h = h;
  }
  const auto C = static_cast<std::size_t>(chunk);
  std::vector<float> stats(6 * ((D + C - 1) / C));
  for (std::size_t i = 0; i < static_cast<std::size_t>(rows); ++i) {
    const float* row = h.data() + i * D;
    for (std::size_t c0 = 0, k = 0; c0 < D; c0 += C, ++k)
      isa::bn_stats_row(row + c0, std::min(C, D - c0), stats.data() + 6 * k);
    float mv[2];
    isa::bn_aggr_row(stats.data(), stats.size() / 3, mv);
    const float rstd = isa::apply_act(isa::ActFunc::rsqrt, mv[1] * 1.0f + eps);
    r.mean[i] = mv[0];
    r.rstd[i] = rstd;
    for (std::size_t j = 0; j < D; ++j) {
      const float t = (row[j] - mv[0]) * gamma[j];
      r.y[i * D + j] = t * rstd + beta[j];
    }
  }
  r.amax = finish_norm_output(r.y, rows, dim, round, quant);
  return r;
}

std::vector<float> softmax_reference(const std::vector<float>& x, std::int64_t rows,
                                     std::int64_t dim, float (*round)(float)) {
  if (x.size() != static_cast<std::size_t>(rows * dim))
    throw Error("softmax_reference: sizes do not match the [R, D] shape");
  std::vector<float> y(x.size()), e(static_cast<std::size_t>(dim));
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* row = x.data() + i * dim;
    float m = row[0];
    for (std::int64_t j = 1; j < dim; ++j) m = isa::apply_alu(isa::AluOp::max, m, row[j]);
    float s = 0.0f;
    for (std::int64_t j = 0; j < dim; ++j)
      s += e[static_cast<std::size_t>(j)] = std::exp(row[j] - m);
    const float r = 1.0f / s;
    for (std::int64_t j = 0; j < dim; ++j)
      y[static_cast<std::size_t>(i * dim + j)] = round(e[static_cast<std::size_t>(j)] * r);
  }
  return y;
}

std::vector<float> softmax_backward_reference(const std::vector<float>& dy,
                                              const std::vector<float>& y, std::int64_t rows,
                                              std::int64_t dim, float (*round)(float)) {
  if (dy.size() != static_cast<std::size_t>(rows * dim) || y.size() != dy.size())
    throw Error("softmax_backward_reference: sizes do not match the [R, D] shape");
  std::vector<float> dx(dy.size());
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* g = dy.data() + i * dim;
    const float* p = y.data() + i * dim;
    float dot = 0.0f;
    for (std::int64_t j = 0; j < dim; ++j) dot += g[j] * p[j];
    for (std::int64_t j = 0; j < dim; ++j)
      dx[static_cast<std::size_t>(i * dim + j)] = round((g[j] - dot) * p[j]);
  }
  return dx;
}

CrossEntropyResult cross_entropy_reference(const std::vector<float>& logits,
                                           const std::vector<float>& targets, std::int64_t rows,
                                           std::int64_t vocab, std::int64_t chunk, float grad_scale,
                                           float (*round)(float)) {
  if (logits.size() != static_cast<std::size_t>(rows * vocab) ||
      targets.size() != static_cast<std::size_t>(rows))
    throw Error("cross_entropy_reference: sizes do not match [T, V] and [T]");
  using isa::ActFunc;
  const std::int64_t C = std::min(vocab, chunk);
  CrossEntropyResult r;
  r.loss.resize(static_cast<std::size_t>(rows));
  r.dlogits.resize(logits.size());
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* x = logits.data() + i * vocab;
    const float tg = targets[static_cast<std::size_t>(i)];
    const float valid = tg >= 0.0f ? 1.0f : 0.0f, gsv = valid * grad_scale;
    const float lngsv = isa::apply_act(ActFunc::log, gsv);
    // Pass 1: online max and sum, chunk by chunk.
    float m = 0.0f, sum = 0.0f;
    for (std::int64_t c0 = 0; c0 < vocab; c0 += C) {
      const std::int64_t w = std::min(C, vocab - c0);
      float cm = x[c0];
      for (std::int64_t j = 1; j < w; ++j) cm = isa::apply_alu(isa::AluOp::max, cm, x[c0 + j]);
      const float mn = c0 == 0 ? cm : isa::apply_alu(isa::AluOp::max, m, cm);
      float sc = 0.0f;
      for (std::int64_t j = 0; j < w; ++j) sc += std::exp(x[c0 + j] - mn);
      if (c0 == 0) {
        sum = sc;
      } else {
        const float corr = std::exp(m - mn);
        sum = sum * corr;
        sum = sum + sc;
      }
      m = mn;
    }
    const float lse = m + isa::apply_act(ActFunc::log, sum);
    const float bias = lngsv - lse;
    // Pass 2: gsv * exp(x - lse) in the output dtype; then the target's
    // element gets -gsv added by the scatter-add DMA (FP32 add of the stored
    // value, one rounding). The target's logit comes from a gather (the
    // index is clamped at 0, so an ignored row reads its first logit).
    float* g = r.dlogits.data() + i * vocab;
    for (std::int64_t j = 0; j < vocab; ++j)
      g[j] = round(isa::apply_act(ActFunc::exp, x[j] * 1.0f + bias));
    if (!(tg < static_cast<float>(vocab)) || tg != std::floor(tg))
      throw Error("cross_entropy_reference: a target is not an integer below V");
    const auto at = static_cast<std::int64_t>(std::max(tg, 0.0f));
    g[at] = round(g[at] + -gsv);
    const float picked = x[at];
    r.loss[static_cast<std::size_t>(i)] = (lse - picked) * valid;
  }
  return r;
}

std::vector<float> elementwise_reference(const std::vector<float>& a, const std::vector<float>& b,
                                         const ElementwiseSpec& s, float (*round)(float)) {
  std::vector<float> out(a.size());
  const auto cols = static_cast<std::size_t>(s.cols);
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::size_t j = s.b_row ? i % cols : i;  // b's element for a[i]
    switch (s.op) {
      case ElementwiseOp::add:
        out[i] = round(a[i] + b[j]);
        break;
      case ElementwiseOp::sub:
        out[i] = round(a[i] - b[j]);
        break;
      case ElementwiseOp::mul:
        out[i] = round(a[i] * b[j]);
        break;
      case ElementwiseOp::scale:
        out[i] = round(a[i] * s.alpha);
        break;
      case ElementwiseOp::gelu:
      case ElementwiseOp::gelu_tanh:
      case ElementwiseOp::silu:
      case ElementwiseOp::relu:
        out[i] = round(isa::apply_act(activation_of(s.op), a[i]));
        break;
      case ElementwiseOp::gelu_backward:
      case ElementwiseOp::gelu_tanh_backward:
      case ElementwiseOp::silu_backward:
      case ElementwiseOp::relu_backward: {
        const isa::ActFunc f = activation_of(s.op);
        const float d = f == isa::ActFunc::relu   ? (a[i] > 0.0f ? 1.0f : 0.0f)
                        : f == isa::ActFunc::gelu ? isa::apply_act(isa::ActFunc::gelu_dx, a[i])
                        : f == isa::ActFunc::silu
                            ? isa::apply_act(isa::ActFunc::silu_dx, a[i])
                            : isa::apply_act(isa::ActFunc::gelu_tanh_dx, a[i]);
        out[i] = round(d * b[i]);
        break;
      }
    }
  }
  return out;
}

std::vector<float> reduce_reference(const std::vector<float>& x, const ReduceSpec& s,
                                    int partitions) {
  if (x.size() != static_cast<std::size_t>(s.rows * s.cols))
    throw Error("reduce_reference: sizes do not match the [R, C] shape");
  const std::int64_t width = std::min(s.cols, detail::kRowTileColumns);
  auto combine = [&](float a, float b) {
    return isa::apply_alu(s.op == ReduceOp::max ? isa::AluOp::max : isa::AluOp::add, a, b);
  };
  std::vector<float> rows(static_cast<std::size_t>(s.rows));
  for (std::int64_t r = 0; r < s.rows; ++r) {
    const float* v = x.data() + r * s.cols;
    float row = 0.0f;
    for (std::int64_t c0 = 0; c0 < s.cols; c0 += width) {
      const std::int64_t w = std::min(width, s.cols - c0);
      float part;
      if (s.op == ReduceOp::sumsq) {
        part = 0.0f;
        for (std::int64_t j = 0; j < w; ++j)
          part += isa::apply_act(isa::ActFunc::square, v[c0 + j]);
      } else {
        part = v[c0];
        for (std::int64_t j = 1; j < w; ++j) part = combine(part, v[c0 + j]);
      }
      row = c0 == 0 ? part : combine(row, part);
    }
    rows[static_cast<std::size_t>(r)] = row;
  }
  if (!s.all) return rows;
  const std::int64_t P = partitions, pp = std::min<std::int64_t>(P, s.rows);
  std::vector<float> out(static_cast<std::size_t>(s.cores));
  for (int core = 0; core < s.cores; ++core) {
    std::vector<float> acc(static_cast<std::size_t>(pp), s.op == ReduceOp::max ? -INFINITY : 0.0f);
    for (std::int64_t t = core; t * P < s.rows; t += s.cores)
      for (std::int64_t p = 0; p < P && t * P + p < s.rows; ++p)
        acc[static_cast<std::size_t>(p)] =
            combine(acc[static_cast<std::size_t>(p)], rows[static_cast<std::size_t>(t * P + p)]);
    float total = acc[0];
    for (std::size_t p = 1; p < acc.size(); ++p) total = combine(total, acc[p]);
    out[static_cast<std::size_t>(core)] = total;
  }
  return out;
}

ClipResult clip_reference(const std::vector<float>& grad, const std::vector<float>& parts,
                          const ClipSpec& s, float (*round)(float)) {
  float sum = parts.at(0);
  for (std::size_t i = 1; i < parts.size(); ++i) sum = sum + parts[i];
  const float norm = isa::apply_act(isa::ActFunc::sqrt, sum);
  float coef = norm + 1e-6f;
  coef = 1.0f / coef;
  coef = isa::apply_alu(isa::AluOp::min, coef * s.max_norm, 1.0f);
  ClipResult r;
  r.norm = {norm};
  r.grad.resize(grad.size());
  for (std::size_t i = 0; i < grad.size(); ++i) r.grad[i] = round(grad[i] * coef);
  return r;
}

std::vector<float> glu_reference(const std::vector<float>& gate, const std::vector<float>& up,
                                 isa::ActFunc act, float (*round)(float)) {
  std::vector<float> out(gate.size());
  for (std::size_t i = 0; i < gate.size(); ++i)
    out[i] = round(isa::apply_act(act, gate[i]) * up[i]);
  return out;
}

GluGrads glu_backward_reference(const std::vector<float>& dout, const std::vector<float>& gate,
                                const std::vector<float>& up, isa::ActFunc act,
                                float (*round)(float)) {
  const isa::ActFunc dact = act == isa::ActFunc::silu   ? isa::ActFunc::silu_dx
                            : act == isa::ActFunc::gelu ? isa::ActFunc::gelu_dx
                                                        : isa::ActFunc::gelu_tanh_dx;
  GluGrads r;
  r.dgate.resize(gate.size());
  r.dup.resize(gate.size());
  for (std::size_t i = 0; i < gate.size(); ++i) {
    r.dup[i] = round(dout[i] * isa::apply_act(act, gate[i]));
    const float t = dout[i] * up[i];
    r.dgate[i] = round(t * isa::apply_act(dact, gate[i]));
  }
  return r;
}

LayerNormGrads layernorm_backward_reference(
    const std::vector<float>& dy, const std::vector<float>& h, const std::vector<float>& gamma,
    const std::vector<float>& mean, const std::vector<float>& rstd, std::int64_t rows,
    std::int64_t dim, int cores, int partitions, float (*round)(float)) {
  const auto size = static_cast<std::size_t>(rows * dim), D = static_cast<std::size_t>(dim);
  if (dy.size() != size || h.size() != size || gamma.size() != D ||
      mean.size() != static_cast<std::size_t>(rows) ||
      rstd.size() != static_cast<std::size_t>(rows) || cores < 1 || partitions < 1)
    throw Error("layernorm_backward_reference: sizes do not match the [R, D] shape");
  LayerNormGrads g;
  g.dh.resize(size);
  g.dgamma_parts.assign(static_cast<std::size_t>(cores) * D, 0.0f);
  g.dbeta_parts.assign(static_cast<std::size_t>(cores) * D, 0.0f);
  const float neg_inv_d = -1.0f / static_cast<float>(dim);
  const std::int64_t tiles = (rows + partitions - 1) / partitions;
  std::vector<float> xh(D), gg(D);
  for (std::int64_t t = 0; t < tiles; ++t) {
    const auto core = static_cast<std::size_t>(t % cores);
    for (std::int64_t r = t * partitions; r < std::min(rows, (t + 1) * partitions); ++r) {
      const std::size_t row = static_cast<std::size_t>(r) * D;
      const float mu = mean[static_cast<std::size_t>(r)], rs = rstd[static_cast<std::size_t>(r)];
      float s1 = 0.0f, s2 = 0.0f;
      for (std::size_t j = 0; j < D; ++j) {
        xh[j] = (h[row + j] - mu) * rs;
        gg[j] = dy[row + j] * gamma[j];
        s1 += gg[j];
        const float c = gg[j] * xh[j];
        s2 = j == 0 ? c : s2 + c;
      }
      const float coef1 = (s1 * rs) * neg_inv_d, coef2 = (s2 * rs) * neg_inv_d;
      float* dg = g.dgamma_parts.data() + core * D;
      float* db = g.dbeta_parts.data() + core * D;
      for (std::size_t j = 0; j < D; ++j) {
        g.dh[row + j] = round((gg[j] * rs + coef1) + xh[j] * coef2);
        dg[j] = dg[j] + dy[row + j] * xh[j];
        db[j] = db[j] + dy[row + j];
      }
    }
  }
  return g;
}

CastResult cast_reference(const std::vector<float>& x, float scale, const CastSpec& s,
                          int partitions) {
  if (x.size() != static_cast<std::size_t>(s.rows * s.cols))
    throw Error("cast_reference: sizes do not match the [R, C] shape");
  const num::Format* f = s.out == isa::DType::fp32 ? nullptr : isa::format_of(s.out);
  const num::Overflow o =
      isa::is_fp8(s.out) ? num::Overflow::saturate : num::Overflow::non_saturating;
  CastResult r;
  r.y.resize(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float v = s.scaled ? x[i] * scale : x[i];
    r.y[i] = f ? num::round_to(*f, v, num::Rounding::nearest_even, o) : v;
  }
  if (!s.amax) return r;
  // Per core: per partition the max over its units, then over partitions.
  const std::int64_t P = partitions, W = detail::kRowTileColumns,
                     pp = std::min<std::int64_t>(P, s.rows);
  std::vector<std::vector<float>> acc(static_cast<std::size_t>(s.cores),
                                      std::vector<float>(static_cast<std::size_t>(pp), 0.0f));
  std::int64_t u = 0;
  for (std::int64_t r0 = 0; r0 < s.rows; r0 += P)
    for (std::int64_t c0 = 0; c0 < s.cols; c0 += W, ++u) {
      auto& a = acc[static_cast<std::size_t>(u % s.cores)];
      for (std::int64_t p = 0; p < P && r0 + p < s.rows; ++p) {
        const float* row = x.data() + (r0 + p) * s.cols + c0;
        const std::int64_t w = std::min(W, s.cols - c0);
        float m = row[0];
        for (std::int64_t j = 1; j < w; ++j) m = isa::apply_alu(isa::AluOp::abs_max, m, row[j]);
        m = isa::apply_alu(isa::AluOp::abs_max, m, 0.0f);
        a[static_cast<std::size_t>(p)] =
            isa::apply_alu(isa::AluOp::max, a[static_cast<std::size_t>(p)], m);
      }
    }
  for (const auto& a : acc) {
    float m = a[0];
    for (std::size_t p = 1; p < a.size(); ++p) m = isa::apply_alu(isa::AluOp::max, m, a[p]);
    r.amax.push_back(m);
  }
  return r;
}

namespace {
std::int64_t checked_id(float v, std::int64_t t, std::int64_t vocab) {
  const auto id = static_cast<std::int64_t>(v);
  if (static_cast<float>(id) != v || id < 0 || id >= vocab)
    throw Error(
        fmt::format("embedding reference: ids[{}] = {} is not a row of [0, {})", t, v, vocab));
  return id;
}
}  // namespace

std::vector<float> embedding_reference(const std::vector<float>& ids,
                                       const std::vector<float>& table, std::int64_t tokens,
                                       std::int64_t vocab, std::int64_t dim) {
  std::vector<float> out(static_cast<std::size_t>(tokens * dim));
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t id = checked_id(ids[static_cast<std::size_t>(t)], t, vocab);
    std::copy_n(table.begin() + id * dim, dim, out.begin() + t * dim);
  }
  return out;
}

std::vector<float> embedding_backward_reference(const std::vector<float>& ids,
                                                const std::vector<float>& dout, std::int64_t tokens,
                                                std::int64_t vocab, std::int64_t dim) {
  std::vector<float> d(static_cast<std::size_t>(vocab * dim), 0.0f);
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t id = checked_id(ids[static_cast<std::size_t>(t)], t, vocab);
    for (std::int64_t j = 0; j < dim; ++j)
      d[static_cast<std::size_t>(id * dim + j)] += dout[static_cast<std::size_t>(t * dim + j)];
  }
  return d;
}

namespace {
// P [Sq, Sk] = softmax(scale q k^T + mask) of one head in FP64, with lse.
void attention_probs(const std::vector<float>& q, const std::vector<float>& k,
                     const AttentionSpec& s, std::int64_t bh, std::int64_t bkv,
                     std::vector<double>& p, std::vector<double>* lse) {
  const std::int64_t Sq = s.seq_q, Sk = s.kv_len(), D = s.head_dim;
  const double scale = s.softmax_scale();
  p.assign(static_cast<std::size_t>(Sq * Sk), 0.0);
  for (std::int64_t i = 0; i < Sq; ++i) {
    const std::int64_t kend = s.causal ? std::min(Sk, i + 1) : Sk;
    double m = -INFINITY;
    for (std::int64_t j = 0; j < kend; ++j) {
      double acc = 0;
      for (std::int64_t d = 0; d < D; ++d)
        acc += static_cast<double>(q[static_cast<std::size_t>((bh * D + d) * Sq + i)]) *
               k[static_cast<std::size_t>((bkv * D + d) * Sk + j)];
      p[static_cast<std::size_t>(i * Sk + j)] = acc * scale;
      m = std::max(m, acc * scale);
    }
    double l = 0;
    for (std::int64_t j = 0; j < kend; ++j) {
      double& x = p[static_cast<std::size_t>(i * Sk + j)];
      x = std::exp(x - m);
      l += x;
    }
    for (std::int64_t j = 0; j < kend; ++j) p[static_cast<std::size_t>(i * Sk + j)] /= l;
    if (lse) (*lse)[static_cast<std::size_t>(bh * Sq + i)] = m + std::log(l);
  }
}
}  // namespace

AttentionResult attention_reference_f64(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, const AttentionSpec& s) {
  const std::int64_t B = s.batch, Hq = s.q_heads, Hkv = s.kv_heads, Sq = s.seq_q, Sk = s.kv_len(),
                     D = s.head_dim, G = Hq / Hkv;
  AttentionResult r;
  r.o.assign(static_cast<std::size_t>(B * Hq * Sq * D), 0.0);
  r.lse.assign(static_cast<std::size_t>(B * Hq * Sq), 0.0);
  std::vector<double> p;
  for (std::int64_t bi = 0; bi < B; ++bi)
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t bh = bi * Hq + h, bkv = bi * Hkv + h / G;
      attention_probs(q, k, s, bh, bkv, p, &r.lse);
      for (std::int64_t i = 0; i < Sq; ++i)
        for (std::int64_t j = 0; j < Sk; ++j) {
          const double w = p[static_cast<std::size_t>(i * Sk + j)];
          if (w == 0) continue;
          for (std::int64_t d = 0; d < D; ++d)
            r.o[static_cast<std::size_t>((bh * Sq + i) * D + d)] +=
                w * v[static_cast<std::size_t>((bkv * Sk + j) * D + d)];
        }
    }
  return r;
}

AttentionGrads attention_backward_reference_f64(const std::vector<float>& q,
                                                const std::vector<float>& k,
                                                const std::vector<float>& v,
                                                const std::vector<float>& dout,
                                                const AttentionSpec& s) {
  const std::int64_t B = s.batch, Hq = s.q_heads, Hkv = s.kv_heads, Sq = s.seq_q, Sk = s.kv_len(),
                     D = s.head_dim, G = Hq / Hkv;
  const double scale = s.softmax_scale();
  AttentionGrads g;
  g.dq.assign(q.size(), 0.0);
  g.dk.assign(k.size(), 0.0);
  g.dv.assign(v.size(), 0.0);
  std::vector<double> p, dp(static_cast<std::size_t>(Sk));
  for (std::int64_t bi = 0; bi < B; ++bi)
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t bh = bi * Hq + h, bkv = bi * Hkv + h / G;
      attention_probs(q, k, s, bh, bkv, p, nullptr);
      for (std::int64_t i = 0; i < Sq; ++i) {
        auto dO = [&](std::int64_t d) {
          return static_cast<double>(dout[static_cast<std::size_t>((bh * Sq + i) * D + d)]);
        };
        // dP = dO V^T, dS = P (dP - sum_j P dP) (the softmax Jacobian).
        double dot = 0;
        for (std::int64_t j = 0; j < Sk; ++j) {
          double acc = 0;
          for (std::int64_t d = 0; d < D; ++d)
            acc += dO(d) * v[static_cast<std::size_t>((bkv * Sk + j) * D + d)];
          dp[static_cast<std::size_t>(j)] = acc;
          dot += p[static_cast<std::size_t>(i * Sk + j)] * acc;
        }
        for (std::int64_t j = 0; j < Sk; ++j) {
          const double pij = p[static_cast<std::size_t>(i * Sk + j)];
          if (pij == 0) continue;
          const double ds = pij * (dp[static_cast<std::size_t>(j)] - dot) * scale;
          for (std::int64_t d = 0; d < D; ++d) {
            g.dv[static_cast<std::size_t>((bkv * Sk + j) * D + d)] += pij * dO(d);
            g.dq[static_cast<std::size_t>((bh * D + d) * Sq + i)] +=
                ds * k[static_cast<std::size_t>((bkv * D + d) * Sk + j)];
            g.dk[static_cast<std::size_t>((bkv * D + d) * Sk + j)] +=
                ds * q[static_cast<std::size_t>((bh * D + d) * Sq + i)];
          }
        }
      }
    }
  return g;
}

std::vector<float> rope_reference(const std::vector<float>& x, const std::vector<float>& cos,
                                  const std::vector<float>& sin, const RopeSpec& s,
                                  float (*round)(float)) {
  const std::int64_t BH = s.batch * s.heads, S = s.seq, D = s.head_dim, H2 = D / 2;
  std::vector<float> y(x.size());
  for (std::int64_t r = 0; r < BH * S; ++r) {
    const std::int64_t pos = r % S;
    for (std::int64_t j = 0; j < H2; ++j) {
      const float x1 = x[static_cast<std::size_t>(r * D + j)];
      const float x2 = x[static_cast<std::size_t>(r * D + H2 + j)];
      const float c = cos[static_cast<std::size_t>(pos * H2 + j)];
      const float sn = sin[static_cast<std::size_t>(pos * H2 + j)];
      const float a = x1 * c, b = x2 * sn, e = x2 * c, f = x1 * sn;
      y[static_cast<std::size_t>(r * D + j)] = round(s.backward ? a + b : a - b);
      y[static_cast<std::size_t>(r * D + H2 + j)] = round(s.backward ? e - f : e + f);
    }
  }
  return y;
}

}  // namespace tern::kernel
