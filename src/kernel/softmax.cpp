// Softmax forward and backward over the last dim, and the cross-entropy loss
// fused with its gradient.
#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "kernel/builder.h"
#include "kernel/detail.h"
#include "kernel/kernels.h"
#include "util/error.h"

namespace tern::kernel {

using isa::AluOp;
using isa::DType;
using isa::Engine;
using namespace detail;

namespace {

// Columns [0, half) go to the Scalar engine and [half, D) to GpSimd: two
// engines share a per-element pass whose other work keeps Vector busy.
std::int64_t split(std::int64_t d) {
  return d / 2;
}

}  // namespace

isa::Program softmax_kernel(const arch::ChipSpec& chip, const SoftmaxSpec& s) {
  check_rows("softmax", s.rows, s.dim, s.dtype, s.cores);
  if (chip.core_version < 4)
    throw NotSupported("softmax on " + chip.name +
                       ": the kernel uses the NeuronCore-v4 Vector exponential (trn3)");
  Builder b(chip, s.cores);
  const std::int64_t R = s.rows, D = s.dim, P = chip.sbuf_partitions;
  const Tensor x = b.hbm("x", {R, D}, s.dtype, isa::TensorKind::input);
  const Tensor y = b.hbm("y", {R, D}, s.dtype, isa::TensorKind::output);
  const int esz = isa::size_bytes(s.dtype);
  // Buffers: x (then y, in place) in the dtype, up to 6 so loads run ahead
  // while earlier tiles' stores drain; exp(x - max) in FP32, 2 (only the
  // engines read it, no DMA latency in between).
  auto need = [&](int xb) { return xb * (D * esz + 8) + 2 * D * 4; };
  int xb = 6;
  while (xb > 2 && need(xb) > sbuf_budget(chip)) --xb;
  check_sbuf(chip, "softmax", D, s.dtype, need(xb));
  const std::int64_t tiles = ceil_div(R, P), half = split(D);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    std::vector<Tensor> xs, es, mx, sum;
    for (int i = 0; i < xb; ++i) {
      xs.push_back(b.sbuf(static_cast<int>(P), D, s.dtype));
      mx.push_back(b.sbuf(static_cast<int>(P), 1, DType::fp32));
      sum.push_back(b.sbuf(static_cast<int>(P), 1, DType::fp32));
    }
    for (int i = 0; i < 2; ++i) es.push_back(b.sbuf(static_cast<int>(P), D, DType::fp32));
    int i = 0, j = 0;
    for (std::int64_t t = core; t < tiles; t += s.cores, i = (i + 1) % xb, j ^= 1) {
      const int r0 = static_cast<int>(t * P), n = static_cast<int>(std::min(P, R - t * P));
      const Tensor xt = xs[i].tile(0, n, 0, D), et = es[j].tile(0, n, 0, D);
      const Tensor m = mx[i].tile(0, n, 0, 1), sm = sum[i].tile(0, n, 0, 1);
      b.dma_copy(xt, x.tile(r0, n, 0, D));
      // Vector: the row max, e = exp(x - max) with its row sums (the v4 fast
      // exponential), 1 / sum. Scalar and GpSimd: y = e * (1 / sum), cast.
      b.tensor_reduce(m, xt, AluOp::max);
      b.exponential(et, xt, &m, &sm);
      b.reciprocal(sm, sm);
      if (half > 0) {
        b.tensor_scalar(xt.tile(0, n, 0, half), et.tile(0, n, 0, half), AluOp::multiply, sm,
                        AluOp::bypass, 0.0f, nullptr, Engine::scalar);
        b.dma_copy(y.tile(r0, n, 0, half), xt.tile(0, n, 0, half), -1, false, Engine::scalar);
      }
      b.tensor_scalar(xt.tile(0, n, half, D - half), et.tile(0, n, half, D - half), AluOp::multiply,
                      sm, AluOp::bypass, 0.0f, nullptr, Engine::gpsimd);
      b.dma_copy(y.tile(r0, n, half, D - half), xt.tile(0, n, half, D - half), -1, false,
                 Engine::gpsimd);
    }
  }
  return b.finish();
}

isa::Program softmax_backward_kernel(const arch::ChipSpec& chip, const SoftmaxSpec& s) {
  check_rows("softmax_backward", s.rows, s.dim, s.dtype, s.cores);
  Builder b(chip, s.cores);
  const std::int64_t R = s.rows, D = s.dim, P = chip.sbuf_partitions;
  const Tensor dy = b.hbm("dy", {R, D}, s.dtype, isa::TensorKind::input);
  const Tensor y = b.hbm("y", {R, D}, s.dtype, isa::TensorKind::input);
  const Tensor dx = b.hbm("dx", {R, D}, s.dtype, isa::TensorKind::output);
  const int esz = isa::size_bytes(s.dtype);
  // Buffers: dy (then dx, in place) and y in the dtype for the loads, the
  // compute and the stores in flight (4, or 3 when a row is long); dy * y
  // in FP32 (2); dy - dot in FP32 (3: written one stage before it is read).
  auto need = [&](int io) { return io * (2 * D * esz + 8) + 2 * D * 4 + 3 * D * 4; };
  int io = 4;
  while (io > 3 && need(io) > sbuf_budget(chip)) --io;
  check_sbuf(chip, "softmax_backward", D, s.dtype, need(io));
  // dx = y * (dy - dot), dot = sum_j dy * y (the Jacobian-vector product of
  // softmax). Per element: dy * y (1 cycle, both 16-bit: GpSimd), its row
  // sum (Scalar's accumulator, 1), dy - dot (1), (dy - dot) * y (2: an FP32
  // operand). Balanced over the three engines at 5/3 cycles each: Scalar
  // also subtracts on the first 2/3 of the columns, Vector on the rest;
  // GpSimd multiplies the first third, Vector the rest.
  const std::int64_t sub_s = D * 2 / 3, mul_g = D / 3;
  const std::int64_t tiles = ceil_div(R, P);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    std::vector<Tensor> dys, ys, prod, diff, dot;
    for (int i = 0; i < io; ++i) {
      dys.push_back(b.sbuf(static_cast<int>(P), D, s.dtype));
      ys.push_back(b.sbuf(static_cast<int>(P), D, s.dtype));
      dot.push_back(b.sbuf(static_cast<int>(P), 1, DType::fp32));
    }
    for (int i = 0; i < 2; ++i) prod.push_back(b.sbuf(static_cast<int>(P), D, DType::fp32));
    for (int i = 0; i < 3; ++i) diff.push_back(b.sbuf(static_cast<int>(P), D, DType::fp32));
    std::vector<std::int64_t> mine;
    for (std::int64_t t = core; t < tiles; t += s.cores) mine.push_back(t);
    struct View {
      int r0, n;
      Tensor dy, y, p, df, d;
    };
    auto view = [&](std::size_t k) {
      const int r0 = static_cast<int>(mine[k] * P),
                n = static_cast<int>(std::min(P, R - mine[k] * P));
      auto T = [&](const Tensor& t) { return t.tile(0, n, 0, t.cols()); };
      return View{r0,
                  n,
                  T(dys[k % static_cast<std::size_t>(io)]),
                  T(ys[k % static_cast<std::size_t>(io)]),
                  T(prod[k % 2]),
                  T(diff[k % 3]),
                  T(dot[k % static_cast<std::size_t>(io)])};
    };
    auto cols = [](const Tensor& t, std::int64_t c0, std::int64_t c1) {
      return t.tile(0, t.rows(), c0, c1 - c0);
    };
    auto load = [&](std::size_t k) {
      const View v = view(k);
      b.dma_copy(v.dy, dy.tile(v.r0, v.n, 0, D));
      b.dma_copy(v.y, y.tile(v.r0, v.n, 0, D));
    };
    auto stage1 = [&](std::size_t k) {  // GpSimd dy * y; Scalar: dot, dy - dot (2/3)
      const View v = view(k);
      b.tensor_tensor(v.p, v.dy, v.y, AluOp::multiply, Engine::gpsimd);
      b.activation(v.p, isa::ActFunc::identity, v.p, nullptr, 1.0f, &v.d);
      if (sub_s > 0)
        b.tensor_scalar(cols(v.df, 0, sub_s), cols(v.dy, 0, sub_s), AluOp::subtract, v.d,
                        AluOp::bypass, 0.0f, nullptr, Engine::scalar);
    };
    auto stage2 = [&](std::size_t k) {  // Vector: dy - dot (1/3); the products; stores
      const View v = view(k);
      b.tensor_scalar(cols(v.df, sub_s, D), cols(v.dy, sub_s, D), AluOp::subtract, v.d);
      if (mul_g > 0) {
        b.tensor_tensor(cols(v.dy, 0, mul_g), cols(v.df, 0, mul_g), cols(v.y, 0, mul_g),
                        AluOp::multiply, Engine::gpsimd);
        b.dma_copy(dx.tile(v.r0, v.n, 0, mul_g), cols(v.dy, 0, mul_g), -1, false, Engine::gpsimd);
      }
      b.tensor_tensor(cols(v.dy, mul_g, D), cols(v.df, mul_g, D), cols(v.y, mul_g, D),
                      AluOp::multiply, Engine::vector);
      b.dma_copy(dx.tile(v.r0, v.n, mul_g, D - mul_g), cols(v.dy, mul_g, D), -1, false,
                 Engine::vector);
    };
    // Software pipeline: iteration i loads tile i + 1, runs stage 1 of tile
    // i and stage 2 of tile i - 1 (each engine runs in order).
    const std::size_t n = mine.size();
    if (n > 0) load(0);
    for (std::size_t i = 0; i < n + 1; ++i) {
      if (i + 1 < n) load(i + 1);
      if (i < n) stage1(i);
      if (i >= 1) stage2(i - 1);
    }
  }
  return b.finish();
}

}  // namespace tern::kernel

namespace tern::kernel {

isa::Program cross_entropy_kernel(const arch::ChipSpec& chip, const CrossEntropySpec& s) {
  check_rows("cross_entropy", s.rows, s.vocab, s.dtype, s.cores);
  if (chip.core_version < 4)
    throw NotSupported("cross_entropy on " + chip.name +
                       ": the kernel uses the NeuronCore-v4 Vector exponential (trn3)");
  if (s.chunk < 1) throw Error(fmt::format("cross_entropy: chunk must be >= 1, got {}", s.chunk));
  if (static_cast<std::int64_t>(chip.sbuf_partitions) * s.vocab >= (1LL << 24))
    throw NotSupported(fmt::format(
        "cross_entropy with V = {}: the flat index p * V + target is formed in FP32, exact "
        "only while {} x V < 2^24 (V <= {})",
        s.vocab, chip.sbuf_partitions, ((1LL << 24) - 1) / chip.sbuf_partitions));
  const float gs = std::isnan(s.grad_scale) ? 1.0f / static_cast<float>(s.rows) : s.grad_scale;
  if (!s.grad_scale_input && (!(gs >= 0.0f) || std::isinf(gs)))
    throw Error(fmt::format("cross_entropy: grad_scale must be finite and >= 0, got {}", gs));
  Builder b(chip, s.cores);
  const std::int64_t T = s.rows, V = s.vocab, P = chip.sbuf_partitions;
  const std::int64_t C = std::min(V, s.chunk), chunks = ceil_div(V, C);
  const Tensor logits = b.hbm("logits", {T, V}, s.dtype, isa::TensorKind::input);
  const Tensor targets = b.hbm("targets", {T, 1}, DType::int32, isa::TensorKind::input);
  const Tensor loss = b.hbm("loss", {T, 1}, DType::fp32, isa::TensorKind::output);
  const Tensor dlogits = b.hbm("dlogits", {T, V}, s.dtype, isa::TensorKind::output);
  Tensor gs_hbm;
  if (s.grad_scale_input) gs_hbm = b.hbm("grad_scale", {1, 1}, DType::fp32, isa::TensorKind::input);
  const int esz = isa::size_bytes(s.dtype);
  // Separate buffers for the two passes, so pass 1 of the next row tile
  // (Vector) runs while pass 2 of this one (Scalar) still reads its chunks.
  constexpr int kBuf = 3;
  const std::int64_t need = kBuf * C * (2 * esz + 4 + esz) + 64 * 4;
  check_sbuf(chip, "cross_entropy", C, s.dtype, need);
  const std::int64_t tiles = ceil_div(T, P);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    const int pp = static_cast<int>(P);
    Tensor xs[kBuf], x2[kBuf], gs_[kBuf], pe[kBuf];
    for (int i = 0; i < kBuf; ++i) {
      xs[i] = b.sbuf(pp, C, s.dtype);
      x2[i] = b.sbuf(pp, C, s.dtype);
      gs_[i] = b.sbuf(pp, C, s.dtype);
      pe[i] = b.sbuf(pp, C, DType::fp32);
    }
    // [P, 1] columns of one row tile.
    enum Col {
      tg,
      valid,
      gsv,
      lngsv,
      m,
      cm,
      mnew,
      corr,
      sum,
      sc,
      lse,
      bias,
      picked,
      neg,
      pos,
      kCols
    };
    Tensor cols[2][kCols], idx[2];
    for (auto& set : cols)
      for (auto& c : set) c = b.sbuf(pp, 1, DType::fp32);
    for (auto& t : idx) t = b.sbuf(pp, 1, DType::int32);
    Tensor gs_col;  // grad_scale on every partition
    if (s.grad_scale_input) {
      gs_col = b.sbuf(pp, 1, DType::fp32);
      b.dma_copy(gs_col, bias_rows(gs_hbm, pp, 0, 1));
    }
    int buf = 0, buf2 = 0, parity = 0;
    for (std::int64_t t = core; t < tiles; t += s.cores, parity ^= 1) {
      const int r0 = static_cast<int>(t * P), n = static_cast<int>(std::min(P, T - t * P));
      auto col = [&](Col c) { return cols[parity][c].tile(0, n, 0, 1); };
      const Tensor ix = idx[parity].tile(0, n, 0, 1);
      b.dma_copy(col(tg), targets.tile(r0, n, 0, 1));
      // Rows with a negative target (PyTorch's ignore_index) have loss 0 and
      // a zero gradient: valid = (target >= 0), gsv = grad_scale * valid and
      // ln(gsv) (-inf for an ignored row) is folded into the exponential.
      b.tensor_scalar(col(valid), col(tg), AluOp::is_ge, 0.0f);
      if (s.grad_scale_input)
        b.tensor_tensor(col(gsv), col(valid), gs_col.tile(0, n, 0, 1), AluOp::multiply);
      else
        b.tensor_scalar(col(gsv), col(valid), AluOp::multiply, gs);
      const Tensor gsv_c = col(gsv);
      b.activation(col(lngsv), isa::ActFunc::log, gsv_c);
      // The target's element of this tile's rows in the flat [n * V] view:
      // p * V + max(target, 0) (exact in FP32: below 128 * V < 2^24), as an
      // int32 index for the indirect DMAs. The target's logit is gathered
      // (one element per row), its gradient fixed by a scatter-add below.
      b.iota(col(pos), 0.0f, static_cast<float>(V), 0.0f);
      b.tensor_scalar(col(neg), col(tg), AluOp::max, 0.0f, AluOp::bypass, 0.0f, Engine::gpsimd);
      b.tensor_tensor(col(pos), col(pos), col(neg), AluOp::add, Engine::gpsimd);
      b.tensor_copy(ix, col(pos), Engine::gpsimd);
      // The tile's rows as a flat [n * V, 1] HBM table (row stride 1).
      Tensor flat_x = logits, flat_g = dlogits;
      for (Tensor* f : {&flat_x, &flat_g}) {
        f->ap.offset += static_cast<std::int64_t>(r0) * V * esz;
        f->ap.dims = {{1, static_cast<std::int64_t>(n) * V}, {1, 1}};
        f->ap.partitions = static_cast<int>(static_cast<std::int64_t>(n) * V);
      }
      b.dma_gather(col(picked), flat_x, ix);
      // Pass 1 (Vector): the running max m and the running sum S of
      // exp(x - m) over the column chunks (online softmax: S is rescaled by
      // exp(m_old - m_new) when the max grows).
      for (std::int64_t c = 0; c < chunks; ++c, buf = (buf + 1) % kBuf) {
        const std::int64_t c0 = c * C, w = std::min(C, V - c0);
        const Tensor xc = xs[buf].tile(0, n, 0, w);
        b.dma_copy(xc, logits.tile(r0, n, c0, w));
        const Tensor junk = pe[buf].tile(0, n, 0, w);
        if (c == 0) {
          b.tensor_reduce(col(m), xc, AluOp::max);
          const Tensor mc = col(m), sm = col(sum);
          b.exponential(junk, xc, &mc, &sm);
          continue;
        }
        b.tensor_reduce(col(cm), xc, AluOp::max);
        b.tensor_tensor(col(mnew), col(m), col(cm), AluOp::max);
        const Tensor mn = col(mnew), scc = col(sc);
        b.exponential(col(corr), col(m), &mn);
        b.exponential(junk, xc, &mn, &scc);
        b.tensor_tensor(col(sum), col(sum), col(corr), AluOp::multiply);
        b.tensor_tensor(col(sum), col(sum), col(sc), AluOp::add);
        b.tensor_copy(col(m), col(mnew));
      }
      // lse = m + ln(S); bias = ln(gsv) - lse.
      b.activation(col(lse), isa::ActFunc::log, col(sum));
      b.tensor_tensor(col(lse), col(m), col(lse), AluOp::add);
      b.tensor_tensor(col(bias), col(lngsv), col(lse), AluOp::subtract);
      // Pass 2 (Scalar, one instruction per chunk): dlogits = gsv * exp(x -
      // lse) in the output dtype, stored; then the target's element gets
      // -gsv added by a scatter-add DMA (FP32 add, one rounding).
      for (std::int64_t c = 0; c < chunks; ++c, buf2 = (buf2 + 1) % kBuf) {
        const std::int64_t c0 = c * C, w = std::min(C, V - c0);
        const Tensor xc = x2[buf2].tile(0, n, 0, w), g = gs_[buf2].tile(0, n, 0, w);
        b.dma_copy(xc, logits.tile(r0, n, c0, w));
        const Tensor bc = col(bias);
        b.activation(g, isa::ActFunc::exp, xc, &bc);
        b.dma_copy(dlogits.tile(r0, n, c0, w), g, -1, false, Engine::scalar);
      }
      // GpSimd (otherwise idle) finishes the tile, so Vector's stream moves
      // on to the next tile's pass 1 while the scatter waits for the stores.
      b.tensor_scalar(col(neg), gsv_c, AluOp::multiply, -1.0f, AluOp::bypass, 0.0f, Engine::gpsimd);
      b.dma_scatter(flat_g, col(neg), ix, -1, true, Engine::gpsimd);
      // loss = (lse - picked) * valid.
      b.tensor_tensor(col(lse), col(lse), col(picked), AluOp::subtract, Engine::gpsimd);
      b.tensor_tensor(col(lse), col(lse), col(valid), AluOp::multiply, Engine::gpsimd);
      b.dma_copy(loss.tile(r0, n, 0, 1), col(lse), -1, false, Engine::gpsimd);
    }
  }
  return b.finish();
}

}  // namespace tern::kernel
