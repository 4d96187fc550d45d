#include "kernel/kernels.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "kernel/builder.h"
#include "util/error.h"

namespace tern::kernel {

using isa::DType;
using isa::Engine;

namespace {
std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}
}  // namespace

isa::Program matmul_kernel(const arch::ChipSpec& chip, const MatmulSpec& s) {
  if (s.m < 1 || s.n < 1 || s.k < 1) {
    throw Error(fmt::format("matmul: M, N, K must be >= 1, got {} x {} x {}", s.m, s.n, s.k));
  }
  const bool ok_in = s.in == DType::bf16 || s.in == DType::fp16 || s.in == DType::fp32 ||
                     s.in == DType::tf32 || isa::is_fp8(s.in);
  if (!ok_in) {
    throw NotSupported(
        fmt::format("matmul with {} inputs (bf16, fp16, fp32, tf32 and fp8 are)", isa::name(s.in)));
  }
  if (s.out != DType::fp32 && s.out != DType::bf16) {
    throw NotSupported(fmt::format("matmul with {} output (fp32 and bf16 are)", isa::name(s.out)));
  }
  Builder b(chip, s.cores);
  const Tensor at = b.hbm("at", {s.k, s.m}, s.in, isa::TensorKind::input);
  const Tensor bt = b.hbm("b", {s.k, s.n}, s.in, isa::TensorKind::input);
  const Tensor ct = b.hbm("c", {s.m, s.n}, s.out, isa::TensorKind::output);

  const std::int64_t TK = chip.tensor.rows;             // contraction
  const std::int64_t TM = chip.tensor.stationary_fmax;  // output partitions
  const std::int64_t bank_fp32 = chip.psum_bank_bytes().value() / 4;
  const std::int64_t TN = std::min<std::int64_t>(chip.tensor.moving_fmax, bank_fp32);
  const std::int64_t KT = ceil_div(s.k, TK);
  const int esz = isa::size_bytes(s.in);
  // SBUF per partition: A^T block (KT x BM) + two B sets (2 x KT x TN) + outputs.
  const std::int64_t budget = chip.sbuf_partition_bytes.value() * 3 / 4;
  std::int64_t BM = std::min<std::int64_t>(4 * TM, ceil_div(s.m, TM) * TM);
  auto need = [&](std::int64_t bm) { return KT * (bm + 2 * TN) * esz + 4 * TN * 4; };
  while (BM > TM && need(BM) > budget) BM -= TM;
  if (need(BM) > budget) {
    throw NotSupported(
        fmt::format("matmul with K = {} at {}: the K dimension does not fit SBUF "
                    "in one pass ({} bytes per partition needed, budget {})",
                    s.k, isa::name(s.in), need(BM), budget));
  }
  const std::int64_t MB = ceil_div(s.m, BM);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    std::vector<Tensor> a_tiles(static_cast<std::size_t>(KT));
    std::vector<Tensor> b_sets[2];
    for (auto& set : b_sets) set.resize(static_cast<std::size_t>(KT));
    for (std::int64_t kt = 0; kt < KT; ++kt) {
      a_tiles[kt] = b.sbuf(static_cast<int>(std::min(TK, s.k - kt * TK)), BM, s.in);
      for (auto& set : b_sets)
        set[kt] = b.sbuf(static_cast<int>(std::min(TK, s.k - kt * TK)), TN, s.in);
    }
    constexpr int kPsum = 4, kOut = 4;
    std::vector<Tensor> ps, outs;
    for (int i = 0; i < kPsum; ++i) ps.push_back(b.psum(static_cast<int>(TM), TN, DType::fp32));
    for (int i = 0; i < kOut; ++i) outs.push_back(b.sbuf(static_cast<int>(TM), TN, s.out));
    int pi = 0, oi = 0, set = 0;
    for (std::int64_t mb = core; mb < MB; mb += s.cores) {
      const std::int64_t m0 = mb * BM, bm = std::min(BM, s.m - m0);
      for (std::int64_t kt = 0; kt < KT; ++kt) {
        const int tk = static_cast<int>(std::min(TK, s.k - kt * TK));
        b.dma_copy(a_tiles[kt].tile(0, tk, 0, bm), at.tile(static_cast<int>(kt * TK), tk, m0, bm));
      }
      for (std::int64_t n0 = 0; n0 < s.n; n0 += TN) {
        const std::int64_t tn = std::min(TN, s.n - n0);
        auto& bs = b_sets[set];
        set ^= 1;
        for (std::int64_t kt = 0; kt < KT; ++kt) {
          const int tk = static_cast<int>(std::min(TK, s.k - kt * TK));
          b.dma_copy(bs[kt].tile(0, tk, 0, tn), bt.tile(static_cast<int>(kt * TK), tk, n0, tn));
        }
        for (std::int64_t mi = 0; mi * TM < bm; ++mi) {
          const int tm = static_cast<int>(std::min(TM, bm - mi * TM));
          const Tensor p = ps[pi].tile(0, tm, 0, tn);
          pi = (pi + 1) % kPsum;
          for (std::int64_t kt = 0; kt < KT; ++kt) {
            const int tk = static_cast<int>(std::min(TK, s.k - kt * TK));
            b.matmul(p, a_tiles[kt].tile(0, tk, mi * TM, tm), bs[kt].tile(0, tk, 0, tn), kt > 0);
          }
          const Tensor o = outs[oi].tile(0, tm, 0, tn);
          // Alternate the PSUM evacuation between Vector and Scalar.
          b.tensor_copy(o, p, oi % 2 ? Engine::scalar : Engine::vector);
          oi = (oi + 1) % kOut;
          b.dma_copy(ct.tile(static_cast<int>(m0 + mi * TM), tm, n0, tn), o);
        }
      }
    }
  }
  return b.finish();
}

isa::Program add_kernel(const arch::ChipSpec& chip, std::int64_t rows, std::int64_t cols,
                        DType dt) {
  if (rows < 1 || cols < 1)
    throw Error(fmt::format("add: shape [{}, {}] must be >= 1", rows, cols));
  Builder b(chip);
  const Tensor a = b.hbm("a", {rows, cols}, dt, isa::TensorKind::input);
  const Tensor x = b.hbm("b", {rows, cols}, dt, isa::TensorKind::input);
  const Tensor out = b.hbm("out", {rows, cols}, dt, isa::TensorKind::output);
  const std::int64_t TP = chip.sbuf_partitions, TF = 2048;
  Tensor ta[2] = {b.sbuf(static_cast<int>(TP), TF, dt), b.sbuf(static_cast<int>(TP), TF, dt)};
  Tensor tb[2] = {b.sbuf(static_cast<int>(TP), TF, dt), b.sbuf(static_cast<int>(TP), TF, dt)};
  Tensor to[2] = {b.sbuf(static_cast<int>(TP), TF, dt), b.sbuf(static_cast<int>(TP), TF, dt)};
  int i = 0;
  for (std::int64_t r0 = 0; r0 < rows; r0 += TP) {
    const int tr = static_cast<int>(std::min(TP, rows - r0));
    for (std::int64_t c0 = 0; c0 < cols; c0 += TF, i ^= 1) {
      const std::int64_t tc = std::min(TF, cols - c0);
      const Tensor va = ta[i].tile(0, tr, 0, tc), vb = tb[i].tile(0, tr, 0, tc),
                   vo = to[i].tile(0, tr, 0, tc);
      b.dma_copy(va, a.tile(static_cast<int>(r0), tr, c0, tc));
      b.dma_copy(vb, x.tile(static_cast<int>(r0), tr, c0, tc));
      b.tensor_tensor(vo, va, vb, isa::AluOp::add);
      b.dma_copy(out.tile(static_cast<int>(r0), tr, c0, tc), vo);
    }
  }
  return b.finish();
}

isa::Program transpose_kernel(const arch::ChipSpec& chip, std::int64_t rows, std::int64_t cols,
                              DType dt) {
  if (rows < 1 || cols < 1)
    throw Error(fmt::format("transpose: shape [{}, {}] must be >= 1", rows, cols));
  if (dt != DType::fp32 && dt != DType::bf16 && dt != DType::fp16) {
    throw NotSupported(fmt::format("transpose of {} (fp32, bf16, fp16 are)", isa::name(dt)));
  }
  Builder b(chip);
  const Tensor in = b.hbm("in", {rows, cols}, dt, isa::TensorKind::input);
  const Tensor out = b.hbm("out", {cols, rows}, dt, isa::TensorKind::output);
  const std::int64_t T = std::min<std::int64_t>(chip.tensor.rows, chip.tensor.cols);
  Tensor src[2] = {b.sbuf(static_cast<int>(T), T, dt), b.sbuf(static_cast<int>(T), T, dt)};
  Tensor dst[2] = {b.sbuf(static_cast<int>(T), T, dt), b.sbuf(static_cast<int>(T), T, dt)};
  Tensor ps[2] = {b.psum(static_cast<int>(T), T, DType::fp32),
                  b.psum(static_cast<int>(T), T, DType::fp32)};
  int i = 0;
  for (std::int64_t r0 = 0; r0 < rows; r0 += T) {
    const int tr = static_cast<int>(std::min(T, rows - r0));
    for (std::int64_t c0 = 0; c0 < cols; c0 += T, i ^= 1) {
      const int tc = static_cast<int>(std::min(T, cols - c0));
      b.dma_copy(src[i].tile(0, tr, 0, tc), in.tile(static_cast<int>(r0), tr, c0, tc));
      b.transpose(ps[i].tile(0, tc, 0, tr), src[i].tile(0, tr, 0, tc));
      b.tensor_copy(dst[i].tile(0, tc, 0, tr), ps[i].tile(0, tc, 0, tr));
      b.dma_copy(out.tile(static_cast<int>(c0), tc, r0, tr), dst[i].tile(0, tc, 0, tr));
    }
  }
  return b.finish();
}

}  // namespace tern::kernel
