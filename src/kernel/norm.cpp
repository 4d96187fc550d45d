// Normalization kernels: RMSNorm and LayerNorm, forward and backward.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kernel/builder.h"
#include "kernel/detail.h"
#include "kernel/kernels.h"
#include "util/error.h"

namespace tern::kernel {

using isa::DType;
using isa::Engine;
using namespace detail;

namespace {

// The checks every norm kernel makes of its spec.
void check_norm(const char* name, const RmsNormSpec& s) {
  check_rows(name, s.rows, s.dim, s.dtype, s.cores);
  if (s.out || s.qscale || s.amax || s.mxfp8) {
    if (std::string(name).find("backward") != std::string::npos)
      throw NotSupported(fmt::format("{} with a quantized output (forward only)", name));
    const DType o = s.out_dtype();
    if (o != DType::fp32 && o != DType::bf16 && o != DType::fp16 && o != DType::fp8_e4m3 &&
        o != DType::fp8_e5m2)
      throw NotSupported(fmt::format("{} with {} output (fp32, bf16, fp16, fp8_e4m3, fp8_e5m2 are)",
                                     name, isa::name(o)));
  }
  if (!(s.eps >= 0.0f)) throw Error(fmt::format("{}: eps must be >= 0, got {}", name, s.eps));
}

// The backward kernels' checks: the forward's, and no fused residual.
void check_norm_backward(const char* name, const RmsNormSpec& s) {
  check_norm(name, s);
  if (s.residual)
    throw NotSupported(
        fmt::format("{} with a fused residual (dh is the residual's gradient too)", name));
}

void check_fits(const arch::ChipSpec& chip, const char* name, const RmsNormSpec& s,
                std::int64_t need) {
  if (s.mxfp8) {
    check_mxfp8(chip, Epilogue{.mxfp8 = true}, s.dim);
    if (isa::is_fp8(s.out_dtype()))
      throw NotSupported(fmt::format("{}: the mxfp8 output from an FP8 y", name));
  }
  if (!isa::supported_by(s.out_dtype(), chip.core_version))
    throw NotSupported(fmt::format("{} with {} output on {} ({})", name, isa::name(s.out_dtype()),
                                   chip.name, chip.core_generation));
  check_sbuf(chip, name, s.dim, s.dtype, need);
}

// h = x + residual for the [n, D] tile `hx` (rows r0.. of the HBM tensors),
// in the input dtype (what the residual stream holds), into `hx`, using
// `staging` for the residual (the columns split between GpSimd and Vector
// unless Vector runs in its performance mode);
// h is stored to `h_hbm`.
void add_residual(const arch::ChipSpec& chip, Builder& b, const Tensor& hx, const Tensor& staging,
                  const Tensor& res_hbm, const Tensor& h_hbm, int r0) {
  const int n = hx.rows();
  // In the Vector performance mode Vector alone beats sharing its bus.
  const std::int64_t D = hx.cols(), half = vector_fast(chip, hx.dtype()) ? 0 : D / 2;
  b.dma_copy(staging, res_hbm.tile(r0, n, 0, D));
  if (half > 0)
    b.tensor_tensor(hx.tile(0, n, 0, half), hx.tile(0, n, 0, half), staging.tile(0, n, 0, half),
                    isa::AluOp::add, Engine::gpsimd);
  b.tensor_tensor(hx.tile(0, n, half, D - half), hx.tile(0, n, half, D - half),
                  staging.tile(0, n, half, D - half), isa::AluOp::add, Engine::vector);
  b.dma_copy(h_hbm.tile(r0, n, 0, D), hx, -1, false, Engine::vector);
}

// Column sums over a core's rows on the Tensor engine: [1, D] FP32 in PSUM
// (one bank per `tn` columns), (+)= stationary^T [n, 1] @ moving [n, D] per
// tile, then stored as row `core` of an HBM [cores, D] tensor (zeros for a
// core without rows).
class ColumnSums {
 public:
  ColumnSums(Builder& b, std::int64_t d, std::int64_t tn) : d_(d), tn_(tn) {
    for (std::int64_t c0 = 0; c0 < d; c0 += tn) banks_.push_back(b.psum(1, tn, DType::fp32));
  }
  // PSUM banks `accumulators` sums of D columns need; throws "not supported"
  // naming the kernel when they exceed the chip's.
  static void check(const arch::ChipSpec& chip, const char* name, const char* what, std::int64_t d,
                    std::int64_t tn, int accumulators) {
    if (accumulators * ceil_div(d, tn) > chip.psum_banks)
      throw NotSupported(
          fmt::format("{} with D = {}: {} accumulate{} in PSUM, which holds {} columns{}", name, d,
                      what, accumulators == 1 ? "s" : "", chip.psum_banks / accumulators * tn,
                      accumulators == 1 ? "" : " of each"));
  }
  void add(Builder& b, const Tensor& stationary, const Tensor& moving, bool accumulate) {
    for (std::size_t c = 0; c < banks_.size(); ++c) {
      const std::int64_t c0 = static_cast<std::int64_t>(c) * tn_, w = std::min(tn_, d_ - c0);
      b.matmul(banks_[c].tile(0, 1, 0, w), stationary, moving.tile(0, moving.rows(), c0, w),
               accumulate);
    }
  }
  void store(Builder& b, const Tensor& parts_hbm, int core, bool any_rows, Engine engine) {
    const Tensor out = b.sbuf(1, d_, DType::fp32);
    for (std::size_t c = 0; c < banks_.size() && any_rows; ++c) {
      const std::int64_t c0 = static_cast<std::int64_t>(c) * tn_, w = std::min(tn_, d_ - c0);
      b.tensor_copy(out.tile(0, 1, c0, w), banks_[c].tile(0, 1, 0, w), engine);
    }
    if (!any_rows) b.memset(out, 0.0f, engine == Engine::scalar ? Engine::gpsimd : engine);
    b.dma_copy(parts_hbm.tile(core, 1, 0, d_), out, -1, false, engine);
  }

 private:
  std::int64_t d_, tn_;
  std::vector<Tensor> banks_;
};

// The mxfp8 output of a norm's row tile: yo [n, D] in 512-column chunks
// through the matmul epilogue's mxfp8 step (slots alternate).
struct NormMx {
  Tensor q_hbm, s_hbm;
  std::int64_t width = 0;  // columns per chunk: a matmul output tile's
  std::vector<EvacTiles> slots;
  int next = 0;
  // The current core's two slots (none without the mxfp8 output).
  void start_core(Builder& b, std::int64_t partitions) {
    if (width == 0) return;
    slots.assign(2, EvacTiles{});
    alloc_mx_tiles(b, slots, partitions, width);
  }
};
NormMx norm_mx_outputs(const arch::ChipSpec& chip, Builder& b, const RmsNormSpec& s) {
  NormMx m;
  if (!s.mxfp8) return m;
  m.width = output_tile_columns(chip);
  m.q_hbm = b.hbm("y_q", {s.dim / 4, s.rows}, DType::fp8_e4m3_x4, isa::TensorKind::output);
  m.s_hbm = b.hbm("y_scale", {s.dim / 32, s.rows}, DType::uint8, isa::TensorKind::output);
  return m;
}
// SBUF bytes per partition of the mxfp8 output's two slots (as the matmul
// epilogue's, 128-row tiles).
std::int64_t norm_mx_bytes(const arch::ChipSpec& chip, const RmsNormSpec& s) {
  if (!s.mxfp8) return 0;
  const std::int64_t tm = chip.sbuf_partitions;
  return 2 * (4 * tm * 2 + tm * 4 + tm);
}

void norm_mx_tile(Builder& b, NormMx& m, const Tensor& yo, int r0) {
  const int n = yo.rows();
  for (std::int64_t c0 = 0; c0 < yo.cols(); c0 += m.width) {
    const std::int64_t w = std::min(m.width, yo.cols() - c0);
    QuantTile q{Tensor{}, Tensor{},
                m.q_hbm.tile(static_cast<int>(c0 / 4), static_cast<int>(w / 4), r0, n),
                m.s_hbm.tile(static_cast<int>(c0 / 32), static_cast<int>(w / 32), r0, n)};
    mx_output(b, yo.tile(0, n, c0, w), m.slots[static_cast<std::size_t>(m.next)], q);
    m.next ^= 1;
  }
}

// Writes a norm's output tile: y32 [n, D] FP32 (the unrounded y), with
// `amax` its per-row max |y| to "amax" rows r0.. (Vector) and with `qscale`
// times the scale column, cast into yo and stored (from `e`).
void store_norm_output(Builder& b, const RmsNormSpec& s, const Tensor& y32, const Tensor& yo,
                       const Tensor& y_hbm, const Tensor& amax_hbm, const Tensor& amax_col,
                       const Tensor& qscale, int r0, Engine e) {
  const int n = y32.rows();
  if (s.amax) {
    const Tensor c = amax_col.tile(0, n, 0, 1);
    b.tensor_reduce(c, y32, isa::AluOp::abs_max);
    b.tensor_scalar(c, c, isa::AluOp::abs_max, 0.0f);  // |y| also for D = 1
    b.dma_copy(amax_hbm.tile(r0, n, 0, 1), c, -1, false, Engine::vector);
  }
  if (s.qscale)
    b.tensor_scalar(yo, y32, isa::AluOp::multiply, qscale.tile(0, n, 0, 1), isa::AluOp::bypass,
                    0.0f, nullptr, e);
  else
    b.tensor_copy(yo, y32, e);
  b.dma_copy(y_hbm.tile(r0, n, 0, y32.cols()), yo, -1, false, e);
}

}  // namespace

isa::Program rmsnorm_kernel(const arch::ChipSpec& chip, const RmsNormSpec& s) {
  check_norm("rmsnorm", s);
  Builder b(chip, s.cores);
  const std::int64_t R = s.rows, D = s.dim;
  const Tensor x = b.hbm("x", {R, D}, s.dtype, isa::TensorKind::input);
  const Tensor gamma = b.hbm("gamma", {1, D}, s.dtype, isa::TensorKind::input);
  Tensor res, h;
  if (s.residual) res = b.hbm("residual", {R, D}, s.dtype, isa::TensorKind::input);
  const Tensor y = b.hbm("y", {R, D}, s.out_dtype(), isa::TensorKind::output);
  const Tensor rstd_h = b.hbm("rstd", {R, 1}, DType::fp32, isa::TensorKind::output);
  Tensor qscale_h, amax_h;
  if (s.qscale) qscale_h = b.hbm("qscale", {1, 1}, DType::fp32, isa::TensorKind::input);
  if (s.amax) amax_h = b.hbm("amax", {R, 1}, DType::fp32, isa::TensorKind::output);
  const bool quant = s.qscale || s.amax;
  NormMx mx = norm_mx_outputs(chip, b, s);
  if (s.residual) h = b.hbm("h", {R, D}, s.dtype, isa::TensorKind::output);
  const std::int64_t P = chip.sbuf_partitions;
  const int esz = isa::size_bytes(s.dtype);
  // Per partition: gamma, and per buffer x (residual) and the squares in the
  // dtype, y in the output dtype, one FP32 row (h * gamma) and small columns
  // (plus the mxfp8 output's tiles).
  // Three buffers when they fit (a load, a compute and a store in flight),
  // else two.
  constexpr int kMaxBuf = 3;
  const int osz = isa::size_bytes(s.out_dtype());
  auto need = [&](int bufs) {
    return D * esz + bufs * (D * esz * (s.residual ? 3 : 2) + D * osz + D * 4 + 16 + 4) +
           norm_mx_bytes(chip, s);
  };
  const int bufs = need(kMaxBuf) <= sbuf_budget(chip) ? kMaxBuf : 2;
  check_fits(chip, "rmsnorm", s, need(bufs));
  const std::int64_t tiles = ceil_div(R, P);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    mx.start_core(b, P);
    const int gp = static_cast<int>(std::min(P, R));
    const Tensor g = b.sbuf(gp, D, s.dtype);
    b.dma_copy(g, bias_rows(gamma, gp, 0, D));
    const Tensor eps = b.sbuf(gp, 1, DType::fp32);
    b.memset(eps, s.eps, Engine::gpsimd);
    Tensor qs, amax_col[kMaxBuf];
    if (s.qscale) {
      qs = b.sbuf(gp, 1, DType::fp32);
      b.dma_copy(qs, bias_rows(qscale_h, gp, 0, 1));
    }
    for (int i = 0; s.amax && i < bufs; ++i)
      amax_col[i] = b.sbuf(static_cast<int>(P), 1, DType::fp32);
    Tensor xs[kMaxBuf], rs[kMaxBuf], ys[kMaxBuf], sq[kMaxBuf], y32[kMaxBuf], ss[kMaxBuf],
        rstd[kMaxBuf];
    for (int i = 0; i < bufs; ++i) {
      xs[i] = b.sbuf(static_cast<int>(P), D, s.dtype);
      if (s.residual) rs[i] = b.sbuf(static_cast<int>(P), D, s.dtype);
      ys[i] = b.sbuf(static_cast<int>(P), D, s.out_dtype());
      sq[i] = b.sbuf(static_cast<int>(P), D, s.dtype);  // only the row sums are used
      y32[i] = b.sbuf(static_cast<int>(P), D, DType::fp32);
      ss[i] = b.sbuf(static_cast<int>(P), 1, DType::fp32);
      rstd[i] = b.sbuf(static_cast<int>(P), 1, DType::fp32);
    }
    int i = 0;
    for (std::int64_t t = core; t < tiles; t += s.cores, i = (i + 1) % bufs) {
      const int r0 = static_cast<int>(t * P), n = static_cast<int>(std::min(P, R - t * P));
      const Tensor hx = xs[i].tile(0, n, 0, D);
      b.dma_copy(hx, x.tile(r0, n, 0, D));
      if (s.residual) add_residual(chip, b, hx, rs[i].tile(0, n, 0, D), res, h, r0);
      // Three engines, one pass each, pipelined across tiles:
      //   Scalar: the sum of squares (its row accumulator), then
      //           rstd = rsqrt(sum / D + eps) in one more instruction;
      //   Vector: t = h * gamma (exact in FP32 for bf16 / fp16 inputs);
      //   GpSimd: y = t * rstd (a per-partition column operand), cast.
      const Tensor sum = ss[i].tile(0, n, 0, 1), rs_col = rstd[i].tile(0, n, 0, 1);
      b.activation(sq[i].tile(0, n, 0, D), isa::ActFunc::square, hx, nullptr, 1.0f, &sum);
      const Tensor eps_n = eps.tile(0, n, 0, 1);
      b.activation(rs_col, isa::ActFunc::rsqrt, sum, &eps_n, 1.0f / static_cast<float>(D));
      b.dma_copy(rstd_h.tile(r0, n, 0, 1), rs_col, -1, false, Engine::scalar);
      const Tensor tf = y32[i].tile(0, n, 0, D), yo = ys[i].tile(0, n, 0, D);
      if (quant) {  // y in FP32 first (amax, scale), then the cast
        b.tensor_tensor(tf, hx, g.tile(0, n, 0, D), isa::AluOp::multiply, Engine::vector);
        b.tensor_scalar(tf, tf, isa::AluOp::multiply, rs_col, isa::AluOp::bypass, 0.0f, nullptr,
                        Engine::gpsimd);
        store_norm_output(b, s, tf, yo, y, amax_h, amax_col[i], qs, r0, Engine::gpsimd);
      } else {
        // In column halves, so GpSimd starts on a tile's first half while
        // Vector computes its second (a shorter pipeline fill and drain).
        const std::int64_t halves = D >= 2 * chip.costs.min_ii.value() ? 2 : 1;
        for (std::int64_t hf = 0; hf < halves; ++hf) {
          const std::int64_t c0 = D * hf / halves, w = D * (hf + 1) / halves - c0;
          b.tensor_tensor(tf.tile(0, n, c0, w), hx.tile(0, n, c0, w), g.tile(0, n, c0, w),
                          isa::AluOp::multiply, Engine::vector);
        }
        for (std::int64_t hf = 0; hf < halves; ++hf) {
          const std::int64_t c0 = D * hf / halves, w = D * (hf + 1) / halves - c0;
          b.tensor_scalar(yo.tile(0, n, c0, w), tf.tile(0, n, c0, w), isa::AluOp::multiply, rs_col,
                          isa::AluOp::bypass, 0.0f, nullptr, Engine::gpsimd);
        }
        b.dma_copy(y.tile(r0, n, 0, D), yo, -1, false, Engine::gpsimd);
      }
      if (s.mxfp8) norm_mx_tile(b, mx, yo, r0);
    }
  }
  return b.finish();
}

isa::Program layernorm_kernel(const arch::ChipSpec& chip, const RmsNormSpec& s) {
  check_norm("layernorm", s);
  Builder b(chip, s.cores);
  const std::int64_t R = s.rows, D = s.dim;
  const Tensor x = b.hbm("x", {R, D}, s.dtype, isa::TensorKind::input);
  const Tensor gamma = b.hbm("gamma", {1, D}, s.dtype, isa::TensorKind::input);
  const Tensor beta = b.hbm("beta", {1, D}, s.dtype, isa::TensorKind::input);
  Tensor res, h;
  if (s.residual) res = b.hbm("residual", {R, D}, s.dtype, isa::TensorKind::input);
  const Tensor y = b.hbm("y", {R, D}, s.out_dtype(), isa::TensorKind::output);
  const Tensor mean_h = b.hbm("mean", {R, 1}, DType::fp32, isa::TensorKind::output);
  const Tensor rstd_h = b.hbm("rstd", {R, 1}, DType::fp32, isa::TensorKind::output);
  if (s.residual) h = b.hbm("h", {R, D}, s.dtype, isa::TensorKind::output);
  Tensor qscale_h, amax_h;
  if (s.qscale) qscale_h = b.hbm("qscale", {1, 1}, DType::fp32, isa::TensorKind::input);
  if (s.amax) amax_h = b.hbm("amax", {R, 1}, DType::fp32, isa::TensorKind::output);
  const bool quant = s.qscale || s.amax;
  NormMx mx = norm_mx_outputs(chip, b, s);
  const std::int64_t P = chip.sbuf_partitions, FB = chip.bn_stats_fmax;
  const std::int64_t chunks = ceil_div(D, FB);
  const int esz = isa::size_bytes(s.dtype);
  // Per partition: gamma, beta, and per buffer x (residual), y in the dtype,
  // one FP32 row, bn_stats output (6 per chunk) and small columns.
  // Three buffers when they fit (stage 1 runs a tile ahead), else two.
  constexpr int kMaxBuf = 3;
  const int osz = isa::size_bytes(s.out_dtype());
  auto need = [&](int bufs) {
    return 2 * D * esz +
           bufs * (D * esz * (s.residual ? 2 : 1) + D * osz + D * 4 + chunks * 24 + 16 + 4) +
           norm_mx_bytes(chip, s);
  };
  const int kBuf = need(kMaxBuf) <= sbuf_budget(chip) ? kMaxBuf : 2;
  check_fits(chip, "layernorm", s, need(kBuf));
  const std::int64_t tiles = ceil_div(R, P);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    mx.start_core(b, P);
    const int gp = static_cast<int>(std::min(P, R));
    const Tensor g = b.sbuf(gp, D, s.dtype), bt = b.sbuf(gp, D, s.dtype);
    b.dma_copy(g, bias_rows(gamma, gp, 0, D));
    b.dma_copy(bt, bias_rows(beta, gp, 0, D));
    const Tensor eps = b.sbuf(gp, 1, DType::fp32);
    b.memset(eps, s.eps, Engine::gpsimd);
    Tensor qs;
    if (s.qscale) {
      qs = b.sbuf(gp, 1, DType::fp32);
      b.dma_copy(qs, bias_rows(qscale_h, gp, 0, 1));
    }
    struct Bufs {
      Tensor x, r, y, u, stats, mv, rstd, amax;
    };
    Bufs bu[kMaxBuf];
    for (int bi = 0; bi < kBuf; ++bi) {
      Bufs& t = bu[bi];
      t.x = b.sbuf(static_cast<int>(P), D, s.dtype);
      if (s.residual) t.r = b.sbuf(static_cast<int>(P), D, s.dtype);
      t.y = b.sbuf(static_cast<int>(P), D, s.out_dtype());
      if (s.amax) t.amax = b.sbuf(static_cast<int>(P), 1, DType::fp32);
      t.u = b.sbuf(static_cast<int>(P), D, DType::fp32);
      t.stats = b.sbuf(static_cast<int>(P), 6 * chunks, DType::fp32);
      t.mv = b.sbuf(static_cast<int>(P), 2, DType::fp32);
      t.rstd = b.sbuf(static_cast<int>(P), 1, DType::fp32);
    }
    std::vector<std::int64_t> mine;
    for (std::int64_t t = core; t < tiles; t += s.cores) mine.push_back(t);
    auto rows_of = [&](std::size_t k) {
      return std::pair<int, int>{static_cast<int>(mine[k] * P),
                                 static_cast<int>(std::min(P, R - mine[k] * P))};
    };
    // Stage 1 (load, statistics on Vector, rstd on Scalar, t = (h - mean) *
    // gamma on Vector: one scalar_tensor_tensor, N cycles for BF16 h and
    // gamma) runs one tile ahead of stage 2 (y = t * rstd + beta on GpSimd,
    // 2N), so no engine's in-order stream waits for another within a tile:
    // Vector and GpSimd carry 2 cycles per element each.
    auto stage1 = [&](std::size_t k) {
      const auto [r0, n] = rows_of(k);
      const Bufs& v = bu[k % static_cast<std::size_t>(kBuf)];
      const Tensor hx = v.x.tile(0, n, 0, D);
      b.dma_copy(hx, x.tile(r0, n, 0, D));
      if (s.residual) add_residual(chip, b, hx, v.r.tile(0, n, 0, D), res, h, r0);
      // mean and variance: bn_stats per chunk, then bn_aggr (Vector).
      for (std::int64_t c = 0; c < chunks; ++c) {
        const std::int64_t c0 = c * FB, w = std::min(FB, D - c0);
        b.bn_stats(v.stats.tile(0, n, 6 * c, 6), hx.tile(0, n, c0, w));
      }
      const Tensor mv = v.mv.tile(0, n, 0, 2), mean = v.mv.tile(0, n, 0, 1),
                   var = v.mv.tile(0, n, 1, 1), rstd = v.rstd.tile(0, n, 0, 1);
      b.bn_aggr(mv, v.stats.tile(0, n, 0, 6 * chunks));
      b.dma_copy(mean_h.tile(r0, n, 0, 1), mean, -1, false, Engine::vector);
      // rstd = rsqrt(var + eps) (Scalar).
      const Tensor eps_n = eps.tile(0, n, 0, 1);
      b.activation(rstd, isa::ActFunc::rsqrt, var, &eps_n);
      b.dma_copy(rstd_h.tile(r0, n, 0, 1), rstd, -1, false, Engine::scalar);
      b.scalar_tensor_tensor(v.u.tile(0, n, 0, D), hx, isa::AluOp::subtract, 0.0f, &mean,
                             isa::AluOp::multiply, g.tile(0, n, 0, D));
    };
    auto stage2 = [&](std::size_t k) {
      const auto [r0, n] = rows_of(k);
      const Bufs& v = bu[k % static_cast<std::size_t>(kBuf)];
      const Tensor u = v.u.tile(0, n, 0, D), yo = v.y.tile(0, n, 0, D),
                   rstd = v.rstd.tile(0, n, 0, 1);
      // y in FP32 first with a quantized output (amax, scale), then the cast.
      b.scalar_tensor_tensor(quant ? u : yo, u, isa::AluOp::multiply, 0.0f, &rstd, isa::AluOp::add,
                             bt.tile(0, n, 0, D), false, false, Engine::gpsimd);
      if (quant)
        store_norm_output(b, s, u, yo, y, amax_h, v.amax, qs, r0, Engine::gpsimd);
      else
        b.dma_copy(y.tile(r0, n, 0, D), yo, -1, false, Engine::gpsimd);
      if (s.mxfp8) norm_mx_tile(b, mx, yo, r0);
    };
    if (!mine.empty()) stage1(0);
    for (std::size_t k = 0; k < mine.size(); ++k) {
      if (k + 1 < mine.size()) stage1(k + 1);
      stage2(k);
    }
  }
  return b.finish();
}

isa::Program rmsnorm_backward_kernel(const arch::ChipSpec& chip, const RmsNormSpec& s) {
  check_norm_backward("rmsnorm backward", s);
  Builder b(chip, s.cores);
  const std::int64_t R = s.rows, D = s.dim;
  const Tensor dy_h = b.hbm("dy", {R, D}, s.dtype, isa::TensorKind::input);
  const Tensor h_h = b.hbm("h", {R, D}, s.dtype, isa::TensorKind::input);
  const Tensor gamma = b.hbm("gamma", {1, D}, s.dtype, isa::TensorKind::input);
  const Tensor rstd_h = b.hbm("rstd", {R, 1}, DType::fp32, isa::TensorKind::input);
  const Tensor dh_h = b.hbm("dh", {R, D}, s.dtype, isa::TensorKind::output);
  const Tensor dg_h = b.hbm("dgamma_parts", {s.cores, D}, DType::fp32, isa::TensorKind::output);
  const std::int64_t P = chip.sbuf_partitions;
  const int esz = isa::size_bytes(s.dtype);
  // dgamma accumulates on the Tensor engine in PSUM.
  const std::int64_t TN = output_tile_columns(chip);
  ColumnSums::check(chip, "rmsnorm backward", "dgamma", D, TN, 1);
  // Per partition: gamma, and per buffer dy, h and dh in the dtype and two
  // FP32 rows; three buffers when they fit (three tiles are in flight).
  constexpr int kMaxBuf = 3;
  auto need = [&](int bufs) { return D * esz + bufs * (3 * D * esz + 2 * D * 4 + 64); };
  const int kBuf = need(kMaxBuf) <= sbuf_budget(chip) ? kMaxBuf : 2;
  check_fits(chip, "rmsnorm backward", s, need(kBuf));
  const std::int64_t tiles = ceil_div(R, P);
  const float neg_inv_d = -1.0f / static_cast<float>(D);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    const int gp = static_cast<int>(std::min(P, R));
    const Tensor g = b.sbuf(gp, D, s.dtype);
    b.dma_copy(g, bias_rows(gamma, gp, 0, D));
    // dgamma: rstd^T @ (dy * h) per tile, accumulated in PSUM over the
    // core's tiles (the Tensor engine is otherwise idle here).
    ColumnSums dg(b, D, TN);
    struct Bufs {
      Tensor dy, h, dh, gg, c, rs, dot, coef;
    };
    std::vector<Bufs> bu(static_cast<std::size_t>(kBuf));
    for (auto& x : bu) {
      x.dy = b.sbuf(static_cast<int>(P), D, s.dtype);
      x.h = b.sbuf(static_cast<int>(P), D, s.dtype);
      x.dh = b.sbuf(static_cast<int>(P), D, s.dtype);
      x.gg = b.sbuf(static_cast<int>(P), D, DType::fp32);
      x.c = b.sbuf(static_cast<int>(P), D, DType::fp32);
      x.rs = b.sbuf(static_cast<int>(P), 1, DType::fp32);
      x.dot = b.sbuf(static_cast<int>(P), 1, DType::fp32);
      x.coef = b.sbuf(static_cast<int>(P), 1, DType::fp32);
    }
    std::vector<std::int64_t> mine;
    for (std::int64_t t = core; t < tiles; t += s.cores) mine.push_back(t);
    struct View {
      int r0, n;
      Tensor dy, h, dh, gg, c, rs, dot, coef;
    };
    auto view = [&](std::size_t k) {
      const Bufs& x = bu[k % bu.size()];
      const int r0 = static_cast<int>(mine[k] * P),
                n = static_cast<int>(std::min(P, R - mine[k] * P));
      auto T = [&](const Tensor& v) { return v.tile(0, n, 0, v.cols()); };
      return View{r0, n, T(x.dy), T(x.h), T(x.dh), T(x.gg), T(x.c), T(x.rs), T(x.dot), T(x.coef)};
    };
    // Three pipeline stages, each engine 3 cycles per element:
    //   A (Vector): gg = dy * gamma (exact in FP32 for bf16 / fp16), c = gg * h;
    //   B: dot = sum(c) (Scalar's accumulator), coef = ((dot * rstd) *
    //      rstd) * rstd * (-1 / D) (Scalar); dy * h (GpSimd, exact) and
    //      dgamma (+)= rstd^T (dy * h) (Tensor);
    //   C: a = gg * rstd and c = h * coef (Scalar), dh = a + c (GpSimd).
    // Iteration i issues A of tile i + 2, B of tile i + 1 and C of tile i, so
    // no engine's in-order stream waits for another within a tile.
    auto stage_a = [&](std::size_t k) {
      const View v = view(k);
      b.dma_copy(v.dy, dy_h.tile(v.r0, v.n, 0, D));
      b.dma_copy(v.h, h_h.tile(v.r0, v.n, 0, D));
      b.dma_copy(v.rs, rstd_h.tile(v.r0, v.n, 0, 1));
      b.tensor_tensor(v.gg, v.dy, g.tile(0, v.n, 0, D), isa::AluOp::multiply);
      b.tensor_tensor(v.c, v.gg, v.h, isa::AluOp::multiply);
    };
    auto stage_b = [&](std::size_t k) {
      const View v = view(k);
      b.activation(v.dh, isa::ActFunc::identity, v.c, nullptr, 1.0f, &v.dot);  // dh: scratch
      b.tensor_scalar(v.coef, v.dot, isa::AluOp::multiply, v.rs, isa::AluOp::multiply, 0.0f, &v.rs,
                      Engine::scalar);
      b.tensor_scalar(v.coef, v.coef, isa::AluOp::multiply, v.rs, isa::AluOp::multiply, neg_inv_d,
                      nullptr, Engine::scalar);
      // dgamma here, off stage C's tail: c = dy * h (GpSimd, exact), then
      // rstd^T c on the Tensor engine.
      b.tensor_tensor(v.c, v.dy, v.h, isa::AluOp::multiply, Engine::gpsimd);
      dg.add(b, v.rs, v.c, k > 0);
    };
    auto stage_c = [&](std::size_t k) {
      const View v = view(k);
      b.tensor_scalar(v.gg, v.gg, isa::AluOp::multiply, v.rs, isa::AluOp::bypass, 0.0f, nullptr,
                      Engine::scalar);
      b.tensor_scalar(v.c, v.h, isa::AluOp::multiply, v.coef, isa::AluOp::bypass, 0.0f, nullptr,
                      Engine::scalar);
      b.tensor_tensor(v.dh, v.gg, v.c, isa::AluOp::add, Engine::gpsimd);
      b.dma_copy(dh_h.tile(v.r0, v.n, 0, D), v.dh, -1, false, Engine::gpsimd);
    };
    // With two buffers only two tiles may be in flight: A and B of tile i,
    // C of tile i - 1 (a third tile would overwrite what C still reads).
    const std::size_t n = mine.size();
    const std::size_t depth = kBuf == 3 ? 2 : 1;
    for (std::size_t it = 0; it < n + depth; ++it) {
      if (it < n) stage_a(it);
      if (depth == 2 && it >= 1 && it - 1 < n) stage_b(it - 1);
      if (depth == 1 && it < n) stage_b(it);
      if (it >= depth && it - depth < n) stage_c(it - depth);
    }
    dg.store(b, dg_h, core, !mine.empty(), Engine::vector);
  }
  return b.finish();
}

isa::Program layernorm_backward_kernel(const arch::ChipSpec& chip, const RmsNormSpec& s) {
  check_norm_backward("layernorm backward", s);
  Builder b(chip, s.cores);
  const std::int64_t R = s.rows, D = s.dim;
  const Tensor dy_h = b.hbm("dy", {R, D}, s.dtype, isa::TensorKind::input);
  const Tensor h_h = b.hbm("h", {R, D}, s.dtype, isa::TensorKind::input);
  const Tensor gamma = b.hbm("gamma", {1, D}, s.dtype, isa::TensorKind::input);
  const Tensor mean_h = b.hbm("mean", {R, 1}, DType::fp32, isa::TensorKind::input);
  const Tensor rstd_h = b.hbm("rstd", {R, 1}, DType::fp32, isa::TensorKind::input);
  const Tensor dh_h = b.hbm("dh", {R, D}, s.dtype, isa::TensorKind::output);
  const Tensor dg_h = b.hbm("dgamma_parts", {s.cores, D}, DType::fp32, isa::TensorKind::output);
  const Tensor db_h = b.hbm("dbeta_parts", {s.cores, D}, DType::fp32, isa::TensorKind::output);
  const std::int64_t P = chip.sbuf_partitions;
  const int esz = isa::size_bytes(s.dtype);
  // dgamma and dbeta accumulate on the Tensor engine in PSUM.
  const std::int64_t TN = output_tile_columns(chip);
  ColumnSums::check(chip, "layernorm backward", "dgamma and dbeta", D, TN, 2);
  // Per buffer dy, h, dh in the dtype and four FP32 rows. Four buffers when
  // they fit (a four-stage pipeline keeps four tiles in flight), else two
  // (two stages).
  auto need = [&](int bufs) { return D * esz + 8 + bufs * (3 * D * esz + 4 * D * 4 + 64); };
  const int kBuf = need(4) <= sbuf_budget(chip) ? 4 : 2;
  check_fits(chip, "layernorm backward", s, need(kBuf));
  const std::int64_t tiles = ceil_div(R, P);
  const float neg_inv_d = -1.0f / static_cast<float>(D);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    const int gp = static_cast<int>(std::min(P, R));
    const Tensor g = b.sbuf(gp, D, s.dtype);
    b.dma_copy(g, bias_rows(gamma, gp, 0, D));
    // Column sums over rows as matmuls with a ones column: dgamma = 1^T
    // (dy * xhat), dbeta = 1^T dy, accumulated in PSUM over the core's tiles.
    const Tensor ones32 = b.sbuf(static_cast<int>(P), 1, DType::fp32);
    const Tensor ones = b.sbuf(static_cast<int>(P), 1, s.dtype);
    b.memset(ones32, 1.0f, Engine::gpsimd);
    b.memset(ones, 1.0f, Engine::gpsimd);
    ColumnSums dg(b, D, TN), db(b, D, TN);
    struct Bufs {
      Tensor dy, h, dh, gg, xh, a, c, mean, rs, s1, s2, coef1, coef2;
    };
    std::vector<Bufs> bu(static_cast<std::size_t>(kBuf));
    for (auto& x : bu) {
      x.dy = b.sbuf(static_cast<int>(P), D, s.dtype);
      x.h = b.sbuf(static_cast<int>(P), D, s.dtype);
      x.dh = b.sbuf(static_cast<int>(P), D, s.dtype);
      x.gg = b.sbuf(static_cast<int>(P), D, DType::fp32);
      x.xh = b.sbuf(static_cast<int>(P), D, DType::fp32);
      x.a = b.sbuf(static_cast<int>(P), D, DType::fp32);
      x.c = b.sbuf(static_cast<int>(P), D, DType::fp32);
      for (Tensor* col : {&x.mean, &x.rs, &x.s1, &x.s2, &x.coef1, &x.coef2})
        *col = b.sbuf(static_cast<int>(P), 1, DType::fp32);
    }
    std::vector<std::int64_t> mine;
    for (std::int64_t t = core; t < tiles; t += s.cores) mine.push_back(t);
    struct View {
      int r0, n;
      Tensor dy, h, dh, gg, xh, a, c, mean, rs, s1, s2, coef1, coef2;
    };
    auto view = [&](std::size_t k) {
      const Bufs& x = bu[k % bu.size()];
      const int r0 = static_cast<int>(mine[k] * P),
                n = static_cast<int>(std::min(P, R - mine[k] * P));
      auto T = [&](const Tensor& v) { return v.tile(0, n, 0, v.cols()); };
      return View{r0,     n,         T(x.dy), T(x.h),  T(x.dh), T(x.gg),    T(x.xh),   T(x.a),
                  T(x.c), T(x.mean), T(x.rs), T(x.s1), T(x.s2), T(x.coef1), T(x.coef2)};
    };
    // Four stages, 4 engine-cycles per element on each of Scalar, Vector and
    // GpSimd:
    //   A: loads; xhat = (h - mean) * rstd (Scalar); gg = dy * gamma (Vector)
    //   B: s1 = sum(gg) (Scalar's accumulator); c = gg * xhat (Vector)
    //   C: dy * xhat (GpSimd) and dgamma / dbeta (Tensor); s2 = sum(c)
    //      (Scalar's accumulator); coef1 = s1 * rstd * (-1/D), coef2 = s2 *
    //      rstd * (-1/D) (Scalar)
    //   D: a = gg * rstd + coef1 (Scalar), c = xhat * coef2 (Vector),
    //      dh = a + c (GpSimd).
    auto stage_a = [&](std::size_t k) {
      const View v = view(k);
      b.dma_copy(v.dy, dy_h.tile(v.r0, v.n, 0, D));
      b.dma_copy(v.h, h_h.tile(v.r0, v.n, 0, D));
      b.dma_copy(v.mean, mean_h.tile(v.r0, v.n, 0, 1));
      b.dma_copy(v.rs, rstd_h.tile(v.r0, v.n, 0, 1));
      b.tensor_scalar(v.xh, v.h, isa::AluOp::subtract, v.mean, isa::AluOp::multiply, 0.0f, &v.rs,
                      Engine::scalar);
      b.tensor_tensor(v.gg, v.dy, g.tile(0, v.n, 0, D), isa::AluOp::multiply);
    };
    auto stage_b = [&](std::size_t k) {
      const View v = view(k);
      b.activation(v.dh, isa::ActFunc::identity, v.gg, nullptr, 1.0f, &v.s1);  // dh: scratch
      b.tensor_tensor(v.c, v.gg, v.xh, isa::AluOp::multiply);
    };
    auto stage_c = [&](std::size_t k) {
      const View v = view(k);
      // dgamma (+)= 1^T (dy * xhat), dbeta (+)= 1^T dy, off stage D's tail.
      b.tensor_tensor(v.a, v.dy, v.xh, isa::AluOp::multiply, Engine::gpsimd);
      dg.add(b, ones32.tile(0, v.n, 0, 1), v.a, k > 0);
      db.add(b, ones.tile(0, v.n, 0, 1), v.dy, k > 0);
      b.activation(v.c, isa::ActFunc::identity, v.c, nullptr, 1.0f, &v.s2);
      b.tensor_scalar(v.coef1, v.s1, isa::AluOp::multiply, v.rs, isa::AluOp::multiply, neg_inv_d,
                      nullptr, Engine::scalar);
      b.tensor_scalar(v.coef2, v.s2, isa::AluOp::multiply, v.rs, isa::AluOp::multiply, neg_inv_d,
                      nullptr, Engine::scalar);
    };
    auto stage_d = [&](std::size_t k) {
      const View v = view(k);
      b.tensor_scalar(v.gg, v.gg, isa::AluOp::multiply, v.rs, isa::AluOp::add, 0.0f, &v.coef1,
                      Engine::scalar);
      b.tensor_scalar(v.c, v.xh, isa::AluOp::multiply, v.coef2, isa::AluOp::bypass, 0.0f, nullptr,
                      Engine::vector);
      b.tensor_tensor(v.dh, v.gg, v.c, isa::AluOp::add, Engine::gpsimd);
      b.dma_copy(dh_h.tile(v.r0, v.n, 0, D), v.dh, -1, false, Engine::gpsimd);
    };
    // Iteration i issues A of tile i + 3, B of i + 2, C of i + 1 and D of i
    // (with two buffers: A, B, C of tile i + 1 and D of i), so no engine's
    // in-order stream waits for another within a tile.
    const std::size_t n = mine.size();
    const std::size_t depth = kBuf == 4 ? 3 : 1;
    for (std::size_t it = 0; it < n + depth; ++it) {
      if (depth == 3) {
        if (it < n) stage_a(it);
        if (it >= 1 && it - 1 < n) stage_b(it - 1);
        if (it >= 2 && it - 2 < n) stage_c(it - 2);
      } else if (it < n) {
        stage_a(it), stage_b(it), stage_c(it);
      }
      if (it >= depth && it - depth < n) stage_d(it - depth);
    }
    dg.store(b, dg_h, core, !mine.empty(), Engine::vector);
    db.store(b, db_h, core, !mine.empty(), Engine::scalar);
  }
  return b.finish();
}

}  // namespace tern::kernel
