// Casts, per-tensor scaled FP8 quantization / dequantization with amax
// capture (delayed scaling), and MX block quantization.
#include <algorithm>
#include <cmath>
#include <limits>
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

bool castable(DType d) {
  return d == DType::fp32 || d == DType::bf16 || d == DType::fp16 || d == DType::fp8_e4m3 ||
         d == DType::fp8_e5m2;
}

constexpr std::int64_t kWidth = kRowTileColumns;

// The shape checks of the MX kernels: K rows in QuantizeMX's groups (32
// partitions x 4 values), columns and cores >= 1.
void check_mx_shape(const char* name, std::int64_t k, std::int64_t cols, int cores) {
  if (k < 1 || cols < 1 || k % kMxRowMultiple != 0)
    throw Error(
        fmt::format("{}: K = {} must be a positive multiple of {} (QuantizeMX works on "
                    "32 partitions x 4 values), columns {} >= 1",
                    name, k, kMxRowMultiple, cols));
  if (cores < 1) throw Error(fmt::format("{}: cores must be >= 1, got {}", name, cores));
}
constexpr int kBufs = 4;

}  // namespace

isa::Program cast_kernel(const arch::ChipSpec& chip, const CastSpec& s) {
  if (s.rows < 1 || s.cols < 1)
    throw Error(fmt::format("cast: shape [{}, {}] must be >= 1", s.rows, s.cols));
  if (s.cores < 1) throw Error(fmt::format("cast: cores must be >= 1, got {}", s.cores));
  for (DType d : {s.in, s.out})
    if (!castable(d))
      throw NotSupported(
          fmt::format("cast of {} (fp32, bf16, fp16, fp8_e4m3, fp8_e5m2 are)", isa::name(d)));
  for (DType d : {s.in, s.out})
    if (!isa::supported_by(d, chip.core_version))
      throw NotSupported(
          fmt::format("cast with {} on {} ({})", isa::name(d), chip.name, chip.core_generation));
  Builder b(chip, s.cores);
  const Tensor x = b.hbm("x", {s.rows, s.cols}, s.in, isa::TensorKind::input);
  Tensor scale_h, amax_h;
  if (s.scaled) scale_h = b.hbm("scale", {1, 1}, DType::fp32, isa::TensorKind::input);
  const Tensor y = b.hbm("y", {s.rows, s.cols}, s.out, isa::TensorKind::output);
  if (s.amax) amax_h = b.hbm("amax", {s.cores, 1}, DType::fp32, isa::TensorKind::output);
  const std::int64_t P = chip.sbuf_partitions;
  const int pp = static_cast<int>(std::min(P, s.rows));
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    Tensor sc, acc;
    if (s.scaled) {  // the scale on every partition (partition stride 0)
      sc = b.sbuf(pp, 1, DType::fp32);
      b.dma_copy(sc, bias_rows(scale_h, pp, 0, 1));
    }
    Tensor tx[kBufs], ty[kBufs], col[kBufs];
    for (int i = 0; i < kBufs; ++i) {
      tx[i] = b.sbuf(static_cast<int>(P), kWidth, s.in);
      ty[i] = b.sbuf(static_cast<int>(P), kWidth, s.out);
      col[i] = b.sbuf(static_cast<int>(P), 1, DType::fp32);
    }
    if (s.amax) {
      acc = b.sbuf(pp, 1, DType::fp32);
      b.memset(acc, 0.0f, Engine::gpsimd);
    }
    std::int64_t u = 0;
    int i = 0, k = 0;
    for (std::int64_t r0 = 0; r0 < s.rows; r0 += P) {
      const int n = static_cast<int>(std::min(P, s.rows - r0));
      for (std::int64_t c0 = 0; c0 < s.cols; c0 += kWidth, ++u) {
        if (u % s.cores != core) continue;
        const std::int64_t w = std::min(kWidth, s.cols - c0);
        const Tensor vx = tx[i].tile(0, n, 0, w), vy = ty[i].tile(0, n, 0, w);
        b.dma_copy(vx, x.tile(static_cast<int>(r0), n, c0, w));
        // amax (Vector): max |x| of the tile, then into the core's column.
        if (s.amax) {
          const Tensor c = col[i].tile(0, n, 0, 1);
          b.tensor_reduce(c, vx, AluOp::abs_max);
          b.tensor_scalar(c, c, AluOp::abs_max, 0.0f);  // |x| also for 1-column tiles
          b.tensor_tensor(acc.tile(0, n, 0, 1), acc.tile(0, n, 0, 1), c, AluOp::max,
                          Engine::gpsimd);
        }
        // The cast (times the scale), alternating GpSimd and Scalar.
        const Engine e = k++ % 2 == 0 ? Engine::gpsimd : Engine::scalar;
        if (s.scaled)
          b.tensor_scalar(vy, vx, AluOp::multiply, sc.tile(0, n, 0, 1), AluOp::bypass, 0.0f,
                          nullptr, e);
        else
          b.tensor_copy(vy, vx, e);
        b.dma_copy(y.tile(static_cast<int>(r0), n, c0, w), vy, -1, false, e);
        i = (i + 1) % kBufs;
      }
    }
    if (s.amax) {
      const Tensor total = b.sbuf(1, 1, DType::fp32);
      b.partition_reduce(total, acc, AluOp::max);
      b.dma_copy(amax_h.tile(core, 1, 0, 1), total, -1, false, Engine::gpsimd);
    }
  }
  return b.finish();
}

isa::Program fp8_scale_kernel(const arch::ChipSpec& chip, const Fp8ScaleSpec& s) {
  if (s.rows < 1 || s.cols < 1)
    throw Error(fmt::format("fp8_scale: shape [{}, {}] must be >= 1", s.rows, s.cols));
  if (!castable(s.in) || isa::is_fp8(s.in))
    throw NotSupported(fmt::format("fp8_scale of {} (fp32, bf16, fp16 are)", isa::name(s.in)));
  if (!isa::is_fp8(s.fp8))
    throw Error(fmt::format("fp8_scale: the target must be fp8_e4m3 or fp8_e5m2, got {}",
                            isa::name(s.fp8)));
  if (!isa::supported_by(s.fp8, chip.core_version))
    throw NotSupported(
        fmt::format("{} on {} ({})", isa::name(s.fp8), chip.name, chip.core_generation));
  Builder b(chip, 1);
  const Tensor x = b.hbm("x", {s.rows, s.cols}, s.in, isa::TensorKind::input);
  const Tensor scale_h = b.hbm("scale", {1, 1}, DType::fp32, isa::TensorKind::output);
  const Tensor inv_h = b.hbm("inv_scale", {1, 1}, DType::fp32, isa::TensorKind::output);
  const std::int64_t P = chip.sbuf_partitions;
  const int pp = static_cast<int>(std::min(P, s.rows));
  Tensor tx[kBufs], col[kBufs];
  for (int i = 0; i < kBufs; ++i) {
    tx[i] = b.sbuf(static_cast<int>(P), kWidth, s.in);
    col[i] = b.sbuf(static_cast<int>(P), 1, DType::fp32);
  }
  const Tensor acc = b.sbuf(pp, 1, DType::fp32);
  b.memset(acc, 0.0f, Engine::gpsimd);
  int i = 0;
  for (std::int64_t r0 = 0; r0 < s.rows; r0 += P) {
    const int n = static_cast<int>(std::min(P, s.rows - r0));
    for (std::int64_t c0 = 0; c0 < s.cols; c0 += kWidth, i = (i + 1) % kBufs) {
      const std::int64_t w = std::min(kWidth, s.cols - c0);
      const Tensor vx = tx[i].tile(0, n, 0, w), c = col[i].tile(0, n, 0, 1);
      b.dma_copy(vx, x.tile(static_cast<int>(r0), n, c0, w));
      b.tensor_reduce(c, vx, AluOp::abs_max);
      b.tensor_scalar(c, c, AluOp::abs_max, 0.0f);  // |x| also for 1-column tiles
      b.tensor_tensor(acc.tile(0, n, 0, 1), acc.tile(0, n, 0, 1), c, AluOp::max, Engine::gpsimd);
    }
  }
  // s = fp8_max / amax where 0 < amax <= FLT_MAX, else 1; then 1 / s.
  const Tensor amax = b.sbuf(1, 1, DType::fp32), ok = b.sbuf(1, 1, DType::fp32);
  const Tensor fin = b.sbuf(1, 1, DType::fp32), num = b.sbuf(1, 1, DType::fp32);
  const Tensor one = b.sbuf(1, 1, DType::fp32), raw = b.sbuf(1, 1, DType::fp32);
  const Tensor sc = b.sbuf(1, 1, DType::fp32), inv = b.sbuf(1, 1, DType::fp32);
  b.partition_reduce(amax, acc, AluOp::max);
  b.tensor_scalar(ok, amax, AluOp::is_gt, 0.0f);
  b.tensor_scalar(fin, amax, AluOp::is_le, std::numeric_limits<float>::max());
  b.tensor_tensor(ok, ok, fin, AluOp::multiply);
  b.memset(num, static_cast<float>(isa::format_of(s.fp8)->max_finite()));
  b.memset(one, 1.0f);
  b.tensor_tensor(raw, num, amax, AluOp::divide);
  b.select(sc, ok, raw, one);
  // A tiny amax overflows the quotient to Inf (0 * Inf = NaN): clamp.
  b.tensor_scalar(sc, sc, AluOp::min, std::numeric_limits<float>::max());
  b.tensor_tensor(inv, one, sc, AluOp::divide);
  b.dma_copy(scale_h, sc);
  b.dma_copy(inv_h, inv);
  return b.finish();
}

isa::Program mx_quantize_kernel(const arch::ChipSpec& chip, const MxQuantizeSpec& s) {
  if (chip.core_version < 4)
    throw NotSupported(
        fmt::format("MX quantization on {}: QuantizeMX is NeuronCore-v4 (trn3)", chip.name));
  if (!isa::is_x4(s.elem))
    throw NotSupported(fmt::format(
        "MX quantization to {} (fp8_e4m3_x4, fp8_e5m2_x4, fp4_e2m1_x4 are)", isa::name(s.elem)));
  check_mx_shape("mx_quantize", s.k, s.cols, s.cores);
  Builder b(chip, s.cores);
  const Tensor x = b.hbm(
      "x",
      s.trans ? std::vector<std::int64_t>{s.cols, s.k} : std::vector<std::int64_t>{s.k, s.cols},
      DType::bf16, isa::TensorKind::input);
  const Tensor q = b.hbm("q", {s.k / 4, s.cols}, s.elem, isa::TensorKind::output);
  const Tensor qs = b.hbm("q_scale", {s.k / 32, s.cols}, DType::uint8, isa::TensorKind::output);
  // QuantizeMX: MXFP8 with Trainium3 scales; everything else in software.
  if (s.software || s.policy != num::ScalePolicy::trn3 || s.elem == DType::fp4_e2m1_x4) {
    mx_quantize_software(b, chip, s, x, q, qs);
    return b.finish();
  }
  const std::int64_t P = chip.sbuf_partitions, TKL = 4 * P;
  const std::int64_t TC = 512;  // columns per tile at most: 4 KiB of BF16 per partition
  const auto per_core = mx_tiles(s.k, s.cols, TKL, TC, s.cores, kBufs);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    Tensor src[kBufs], il[kBufs], dq[kBufs], ds[kBufs];
    for (int i = 0; i < kBufs; ++i) {
      src[i] = b.sbuf(static_cast<int>(P), 4 * TC, DType::bf16);
      il[i] = b.sbuf(static_cast<int>(P), 4 * TC, DType::bf16);
      dq[i] = b.sbuf(static_cast<int>(P), TC, s.elem);
      ds[i] = b.sbuf(static_cast<int>(P / 8), TC, DType::uint8);
    }
    int i = 0, n = 0;
    for (const MxTile& t : per_core[static_cast<std::size_t>(core)]) {
      const auto [k0, c0, nc, parts] = t;
      // Partition p holds rows k0 + 4p + j; QuantizeMX reads them in the
      // x4 order the MX matmul contracts over, interleaved by the Scalar
      // and GpSimd engines in turn so that the Vector engine only quantizes.
      const Tensor v = src[i].tile(0, parts, 0, 4 * nc);
      load_mx_source(b, v, x, s.trans, k0, c0, parts, nc);
      const Tensor xs = il[i].tile(0, parts, 0, 4 * nc);
      mx_interleave(b, xs, v, nc, n % 2 == 0 ? Engine::scalar : Engine::gpsimd);
      ++n;
      const Tensor oq = dq[i].tile(0, parts, 0, nc), os = ds[i].tile(0, parts / 8, 0, nc);
      b.quantize_mx(oq, os, xs);
      b.dma_copy(q.tile(static_cast<int>(k0 / 4), parts, c0, nc), oq, -1, false, Engine::vector);
      b.dma_copy(qs.tile(static_cast<int>(k0 / 32), parts / 8, c0, nc), os, -1, false,
                 Engine::vector);
      i = (i + 1) % kBufs;
    }
  }
  return b.finish();
}

}  // namespace tern::kernel

namespace tern::kernel {

isa::Program mx_dequantize_kernel(const arch::ChipSpec& chip, const MxDequantizeSpec& s) {
  if (chip.core_version < 4)
    throw NotSupported(
        fmt::format("MX dequantization on {}: the MX matmul is NeuronCore-v4 (trn3)", chip.name));
  if (!isa::is_x4(s.elem))
    throw NotSupported(
        fmt::format("MX dequantization of {} (fp8_e4m3_x4, fp8_e5m2_x4, "
                    "fp4_e2m1_x4 are)",
                    isa::name(s.elem)));
  if (s.out != DType::fp32 && s.out != DType::bf16)
    throw NotSupported(fmt::format("MX dequantization to {} (fp32, bf16 are)", isa::name(s.out)));
  check_mx_shape("mx_dequantize", s.k, s.cols, s.cores);
  Builder b(chip, s.cores);
  const Tensor q = b.hbm("q", {s.k / 4, s.cols}, s.elem, isa::TensorKind::input);
  const Tensor qs = b.hbm("q_scale", {s.k / 32, s.cols}, DType::uint8, isa::TensorKind::input);
  const Tensor x = b.hbm("x", {s.k, s.cols}, s.out, isa::TensorKind::output);
  const std::int64_t P = chip.tensor.rows, TKL = 4 * P, TM = chip.tensor.stationary_fmax;
  const std::int64_t TN = output_tile_columns(chip), blocks = TKL / TM;
  const int pp = static_cast<int>(P);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    // The engines cannot read x4 data, the MX matmul can: X rows m0 .. m0 +
    // TM of a K block are I[:, m0 .. m0 + TM]^T X for the [TKL, TKL]
    // identity I, quantized once per core into MXFP8 (0 and 1 are exact;
    // the product and the FP32 sum of zeros are too). I[k, m] = (k == m0 +
    // m) in QuantizeMX's source layout (partition p, element 4c + j holds
    // row 4p + j of column c): 4p + (i & 3) - (i >> 2) - m0 == 0, i = 4c + j.
    const Tensor ii = b.sbuf(pp, 4 * TM, DType::int32), jj = b.sbuf(pp, 4 * TM, DType::int32);
    const Tensor cc = b.sbuf(pp, 4 * TM, DType::int32), src = b.sbuf(pp, 4 * TM, DType::bf16);
    b.iota(ii, 0.0f, 0.0f, 1.0f);
    b.tensor_scalar(jj, ii, AluOp::bitwise_and, 3.0f, AluOp::bypass, 0.0f, Engine::gpsimd);
    b.tensor_scalar(cc, ii, AluOp::shift_right, 2.0f, AluOp::bypass, 0.0f, Engine::gpsimd);
    b.tensor_tensor(jj, jj, cc, AluOp::subtract, Engine::gpsimd);
    std::vector<Tensor> idq, ids;
    for (std::int64_t mb = 0; mb < blocks; ++mb) {
      b.iota(cc, static_cast<float>(-mb * TM), 4.0f, 0.0f);
      b.tensor_tensor(cc, cc, jj, AluOp::add, Engine::gpsimd);
      b.tensor_scalar(src, cc, AluOp::is_equal, 0.0f, AluOp::bypass, 0.0f, Engine::gpsimd);
      idq.push_back(b.sbuf(pp, TM, DType::fp8_e4m3_x4));
      ids.push_back(b.sbuf(pp / 8, TM, DType::uint8));
      b.quantize_mx(idq.back(), ids.back(), src);
    }
    constexpr int kLoad = 3, kOut = 4;
    Tensor dq[kLoad], dsc[kLoad], ps[kOut], out[kOut];
    for (int i = 0; i < kLoad; ++i) {
      dq[i] = b.sbuf(pp, TN, s.elem);
      dsc[i] = b.sbuf(pp / 8, TN, DType::uint8);
    }
    for (int i = 0; i < kOut; ++i) {
      ps[i] = b.psum(static_cast<int>(TM), TN, DType::fp32);
      out[i] = b.sbuf(static_cast<int>(TM), TN, s.out);
    }
    int li = 0, oi = 0;
    std::int64_t u = 0;
    for (std::int64_t k0 = 0; k0 < s.k; k0 += TKL) {
      const int parts = static_cast<int>(std::min(TKL, s.k - k0) / 4);
      for (std::int64_t c0 = 0; c0 < s.cols; c0 += TN, ++u) {
        if (u % s.cores != core) continue;
        const std::int64_t nc = std::min(TN, s.cols - c0);
        const Tensor vq = dq[li].tile(0, parts, 0, nc), vs = dsc[li].tile(0, parts / 8, 0, nc);
        li = (li + 1) % kLoad;
        b.dma_copy(vq, q.tile(static_cast<int>(k0 / 4), parts, c0, nc));
        b.dma_copy(vs, qs.tile(static_cast<int>(k0 / 32), parts / 8, c0, nc));
        for (std::int64_t mb = 0; mb * TM < 4 * parts; ++mb) {
          const int tm = static_cast<int>(std::min(TM, 4 * parts - mb * TM));
          const Tensor p = ps[oi].tile(0, tm, 0, nc), o = out[oi].tile(0, tm, 0, nc);
          b.matmul_mx(p, idq[static_cast<std::size_t>(mb)].tile(0, parts, 0, tm),
                      ids[static_cast<std::size_t>(mb)].tile(0, parts / 8, 0, tm), vq, vs, false);
          const Engine e = oi % 2 ? Engine::scalar : Engine::vector;
          b.tensor_copy(o, p, e);
          b.dma_copy(x.tile(static_cast<int>(k0 + mb * TM), tm, c0, nc), o, -1, false, e);
          oi = (oi + 1) % kOut;
        }
      }
    }
  }
  return b.finish();
}

}  // namespace tern::kernel
