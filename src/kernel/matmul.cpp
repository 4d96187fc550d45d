// Matmul kernels: the regular (bf16 / fp32 / fp8) and the MX (trn3) paths.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "isa/instruction.h"
#include "kernel/builder.h"
#include "kernel/detail.h"
#include "kernel/kernels.h"
#include "util/error.h"

namespace tern::kernel {

using isa::DType;
using isa::Engine;
using namespace detail;

namespace {

isa::Program mx_matmul_kernel(const arch::ChipSpec& chip, const MatmulSpec& s) {
  if (chip.core_version < 4) {
    throw NotSupported(fmt::format("MX matmul on {} ({}): MXFP8 needs NeuronCore-v4", chip.name,
                                   chip.core_generation));
  }
  // BF16 operands quantized on chip, or operands already in MX form in HBM
  // (mx_quantize_kernel's layout: x4 data [K/4, C], E8M0 scales [K/32, C]).
  const bool pre = s.mx_prequantized;
  // quantize_mx reads 32-partition multiples (128 K rows): on chip, a last
  // K tile of K % 128 rows (a whole number of 32-element MX blocks) is
  // zero-padded to 128 in SBUF; the padding's blocks quantize to zeros and
  // add exact zeros to the FP32 sums. Quantized operands in HBM cannot be.
  if (s.k % 32 != 0 || (pre && s.k % 128 != 0)) {
    throw NotSupported(
        fmt::format("MX matmul with K = {}: K must be a multiple of {}", s.k, pre ? 128 : 32));
  }
  Builder b(chip, s.cores, s.lnc);
  const Tensor at = pre ? b.hbm("at_q", {s.k / 4, s.m}, s.in, isa::TensorKind::input)
                        : b.hbm("at", {s.k, s.m}, DType::bf16, isa::TensorKind::input);
  const Tensor at_s =
      pre ? b.hbm("at_scale", {s.k / 32, s.m}, DType::uint8, isa::TensorKind::input) : Tensor{};
  const DType inb = s.in_b.value_or(s.in);
  const Tensor bt = pre ? b.hbm("b_q", {s.k / 4, s.n}, inb, isa::TensorKind::input)
                        : b.hbm("b", {s.k, s.n}, DType::bf16, isa::TensorKind::input);
  const Tensor bt_s =
      pre ? b.hbm("b_scale", {s.k / 32, s.n}, DType::uint8, isa::TensorKind::input) : Tensor{};
  const Tensor ct = b.hbm("c", {s.m, s.n}, s.out, isa::TensorKind::output);
  const Epilogue& ep = s.epilogue;
  const std::int64_t P = chip.tensor.rows;  // packed partitions per instruction
  const std::int64_t TKL = 4 * P;           // logical contraction per instruction
  const std::int64_t TM = chip.tensor.stationary_fmax;
  const std::int64_t TN = output_tile_columns(chip);
  const EpilogueIo io = epilogue_io(b, ep, s.m, s.n, TN);
  const Tensor& bias_h = io.bias;
  const Tensor& residual_h = io.residual;
  const std::int64_t KT = ceil_div(s.k, TKL);
  // Packed partitions of K tile kt as loaded (`real`) and as quantized and
  // multiplied (a multiple of 32: the zero-padded tail).
  auto real_parts = [&](std::int64_t kt) {
    return static_cast<int>(std::min(TKL, s.k - kt * TKL) / 4);
  };
  auto padded_parts = [&](std::int64_t kt) {
    constexpr int G = isa::kQuantizeMxPartitions;
    return (real_parts(kt) + G - 1) / G * G;
  };
  const std::int64_t budget = chip.sbuf_partition_bytes.value();
  // Per partition: a block of BM columns of A quantized (4 B x BM per k
  // tile, + 1 B scales), two sets of one B column tile (4 B x TN, +
  // scales), staging and outputs. A block is as many of a core's M tiles
  // as fit (all of them when K is short); B is quantized (or loaded) again
  // for every block.
  auto need = [&](std::int64_t bm) {
    return KT * (5 * bm + 2 * 5 * TN) + 4 * (4 * TM * 2 + 4 * TN * 2) + 4 * TN * 4 +
           epilogue_sbuf_bytes(ep, TM, TN);
  };
  if (need(TM) > budget) {
    throw NotSupported(
        fmt::format("MX matmul with K = {}: one quantized A tile and two B tiles ({} bytes per "
                    "partition) do not fit SBUF (budget {})",
                    s.k, need(TM), budget));
  }
  std::int64_t block_tiles = ceil_div(s.m, TM);
  while (block_tiles > 1 && need(block_tiles * TM) > budget) --block_tiles;
  // Cores split C by M tiles (core, core + cores, ...), every core then
  // quantizing all of B, or by N tiles, every core quantizing all of A:
  // whichever leaves the busiest core fewer columns to quantize (its share
  // of the split operand and all of the other), on a tie the one with less
  // work in all. Cores without a tile do nothing.
  const std::int64_t mtiles = ceil_div(s.m, TM), ntiles = ceil_div(s.n, TN);
  const std::int64_t cm = std::min<std::int64_t>(s.cores, mtiles);
  const std::int64_t cn = std::min<std::int64_t>(s.cores, ntiles);
  const std::int64_t core_m = ceil_div(mtiles, cm) * TM + s.n;  // busiest core, split by M
  const std::int64_t core_n = s.m + ceil_div(ntiles, cn) * TN;  // split by N
  const bool split_n = core_n < core_m || (core_n == core_m && cn * s.m + s.n < s.m + cm * s.n);
  for (int core = 0; core < s.cores; ++core) {
    // This core's tiles: its share of the split dimension, all of the other.
    const std::int64_t n_first = split_n ? core * TN : 0, n_step = split_n ? TN * s.cores : TN;
    const std::int64_t m_first = split_n ? 0 : core * TM, m_step = split_n ? TM : TM * s.cores;
    if (n_first >= s.n || m_first >= s.m) continue;  // nothing for this core
    b.set_core(core);
    // This core's M tiles, in blocks of at most block_tiles.
    std::vector<std::int64_t> m_tiles;
    for (std::int64_t m0 = m_first; m0 < s.m; m0 += m_step) m_tiles.push_back(m0);
    const std::int64_t BM = std::min<std::int64_t>(block_tiles, std::ssize(m_tiles)) * TM;
    std::vector<Tensor> aq(KT), as(KT), bq[2], bs[2];
    for (std::int64_t kt = 0; kt < KT; ++kt) {
      const int parts = padded_parts(kt);
      aq[kt] = b.sbuf(parts, BM, s.in);
      as[kt] = b.sbuf(parts / 8, BM, DType::uint8);
      for (int i = 0; i < 2; ++i) {
        bq[i].push_back(b.sbuf(parts, TN, inb));
        bs[i].push_back(b.sbuf(parts / 8, TN, DType::uint8));
      }
    }
    // Staging for the BF16 sources: enough buffers that DMA latency hides
    // behind quantization.
    constexpr int kStage = 4;
    std::vector<Tensor> a_src, b_src;
    for (int i = 0; i < kStage; ++i) {
      a_src.push_back(b.sbuf(static_cast<int>(P), 4 * TM, DType::bf16));
      b_src.push_back(b.sbuf(static_cast<int>(P), 4 * TN, DType::bf16));
    }

    OutputSlots slots = output_slots(b, ep, s.out, TM, TN);
    auto& [ps, outs, evac_tiles, bias_sets] = slots;
    constexpr int kPsum = OutputSlots::kPsum, kOut = OutputSlots::kOut;
    const Tensor qscale = load_qscale(b, ep, io, static_cast<int>(std::min(TM, s.m)));
    int si = 0, pi = 0, oi = 0, set = 0;
    // Loads columns [c0, c0 + nc) of a BF16 [K, C] HBM tensor K tile by K
    // tile through the staging buffers and quantizes them into columns
    // [q0, q0 + nc) of the x4 tiles q and their scales qs.
    auto quantize_columns = [&](const Tensor& hbm, const Tensor& hbm_scale,
                                std::vector<Tensor>& stage, std::int64_t c0, std::int64_t nc,
                                std::vector<Tensor>& q, std::vector<Tensor>& qs, std::int64_t q0) {
      for (std::int64_t kt = 0; kt < KT; ++kt) {
        const int parts = padded_parts(kt), real = real_parts(kt);
        if (pre) {  // already quantized: two plain loads
          b.dma_copy(q[kt].tile(0, parts, q0, nc),
                     hbm.tile(static_cast<int>(kt * TKL / 4), parts, c0, nc));
          b.dma_copy(qs[kt].tile(0, parts / 8, q0, nc),
                     hbm_scale.tile(static_cast<int>(kt * TKL / 32), parts / 8, c0, nc));
          continue;
        }
        const Tensor src = stage[si].tile(0, parts, 0, 4 * nc);
        si = (si + 1) % kStage;
        if (real < parts) b.memset(src, 0.0f, Engine::gpsimd);  // the tail's zero padding
        b.dma_copy(src.tile(0, real, 0, 4 * nc),
                   mx_source_view(hbm, hbm.cols(), kt * TKL, c0, real, nc));
        b.quantize_mx(q[kt].tile(0, parts, q0, nc), qs[kt].tile(0, parts / 8, q0, nc),
                      mx_interleaved(src, nc));
      }
    };
    // A's columns are quantized once per block, just before the block's
    // first N tile uses them; B column tiles one step ahead of the matmuls
    // that use them (double-buffered), so quantization overlaps the Tensor
    // engine.
    auto prepare_b = [&](std::int64_t n0, int which) {
      quantize_columns(bt, bt_s, b_src, n0, std::min(TN, s.n - n0), bq[which], bs[which], 0);
    };
    for (std::size_t t0 = 0; t0 < m_tiles.size(); t0 += static_cast<std::size_t>(BM / TM)) {
      const std::size_t t1 = std::min(m_tiles.size(), t0 + static_cast<std::size_t>(BM / TM));
      prepare_b(n_first, set);
      for (std::int64_t n0 = n_first; n0 < s.n; n0 += n_step) {
        const std::int64_t tn = std::min(TN, s.n - n0);
        auto& q = bq[set];
        auto& qs = bs[set];
        if (n0 + n_step < s.n) prepare_b(n0 + n_step, set ^ 1);
        const Tensor* bias = nullptr;
        if (ep.bias) {
          const int rows = static_cast<int>(std::min(TM, s.m));
          b.dma_copy(bias_sets[set].tile(0, rows, 0, tn), bias_rows(bias_h, rows, n0, tn));
          bias = &bias_sets[set];
        }
        set ^= 1;
        for (std::size_t t = t0; t < t1; ++t) {
          const std::int64_t m0 = m_tiles[t], a0 = static_cast<std::int64_t>(t - t0) * TM;
          const int tm = static_cast<int>(std::min(TM, s.m - m0));
          if (n0 == n_first) quantize_columns(at, at_s, a_src, m0, tm, aq, as, a0);
          const Tensor p = ps[pi].tile(0, tm, 0, tn);
          pi = (pi + 1) % kPsum;
          for (std::int64_t kt = 0; kt < KT; ++kt) {
            const int parts = padded_parts(kt);
            b.matmul_mx(p, aq[kt].tile(0, parts, a0, tm), as[kt].tile(0, parts / 8, a0, tm),
                        q[kt].tile(0, parts, 0, tn), qs[kt].tile(0, parts / 8, 0, tn), kt > 0);
          }
          const Tensor o = outs[oi].tile(0, tm, 0, tn);
          const Tensor res_h =
              ep.residual ? residual_h.tile(static_cast<int>(m0), tm, n0, tn) : Tensor{};
          const QuantTile qt = quant_tile(ep, io, qscale, static_cast<int>(m0), tm, n0, tn, TN);
          const Engine evac = evacuate(b, ep, p, o, evac_tiles[static_cast<std::size_t>(oi)], bias,
                                       &res_h, oi % 2 ? Engine::scalar : Engine::vector, &qt);
          oi = (oi + 1) % kOut;
          b.dma_copy(ct.tile(static_cast<int>(m0), tm, n0, tn), o, -1, false, evac);
        }
      }
    }
  }
  return b.finish();
}

}  // namespace

// K too long for the resident layout (every K tile of an A block and of a
// B column tile in SBUF at once, e.g. the tied LM head's input gradient
// with K = vocab): stream K instead. Each (M tile, N tile) step walks the K
// tiles through a ring of buffers, accumulating in one PSUM tile, then
// evacuates through the epilogue; A tiles are reloaded for every N tile
// (N / 512 times the traffic of A), the price of any K length fitting.
void streamed_matmul(Builder& b, const arch::ChipSpec& chip, const MatmulSpec& s,
                     const EpilogueIo& io, const Tensor& at, const Tensor& bt, const Tensor& ct) {
  const DType inb = s.in_b.value_or(s.in);
  const Epilogue& ep = s.epilogue;
  const std::int64_t TK = chip.tensor.rows, TM = chip.tensor.stationary_fmax;
  const std::int64_t TN = output_tile_columns(chip);
  const std::int64_t NB = s.batch, KT = ceil_div(s.k, TK);
  constexpr int kRing = 6;
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    std::vector<Tensor> ar, br;
    for (int i = 0; i < kRing; ++i) {
      ar.push_back(b.sbuf(static_cast<int>(TK), TM, s.in));
      br.push_back(b.sbuf(static_cast<int>(TK), TN, inb));
    }
    OutputSlots slots = output_slots(b, ep, s.out, TM, TN);
    auto& [ps, outs, evac_tiles, bias_sets] = slots;
    const Tensor qscale = load_qscale(b, ep, io, static_cast<int>(std::min(TM, NB * s.m)));
    int ri = 0, pi = 0, oi = 0, bs = 0;
    // (batch, M tile) units round-robin over the cores, all N tiles each.
    const std::int64_t MT = ceil_div(s.m, TM);
    for (std::int64_t u = core; u < NB * MT; u += s.cores) {
      const std::int64_t bi = u / MT, m0 = (u % MT) * TM;
      const int tm = static_cast<int>(std::min(TM, s.m - m0));
      for (std::int64_t n0 = 0; n0 < s.n; n0 += TN, bs ^= 1) {
        const std::int64_t tn = std::min(TN, s.n - n0);
        if (ep.bias) b.dma_copy(bias_sets[bs].tile(0, tm, 0, tn), bias_rows(io.bias, tm, n0, tn));
        const Tensor p = ps[static_cast<std::size_t>(pi)].tile(0, tm, 0, tn);
        pi = (pi + 1) % OutputSlots::kPsum;
        for (std::int64_t kt = 0; kt < KT; ++kt, ri = (ri + 1) % kRing) {
          const int tk = static_cast<int>(std::min(TK, s.k - kt * TK));
          const Tensor a_t = ar[static_cast<std::size_t>(ri)].tile(0, tk, 0, tm);
          const Tensor b_t = br[static_cast<std::size_t>(ri)].tile(0, tk, 0, tn);
          if (s.trans_a)
            b.dma_copy(a_t, at.tile(static_cast<int>(bi * s.k + kt * TK), tk, m0, tm));
          else
            b.dma_transpose(a_t, at.tile(static_cast<int>(bi * s.m + m0), tm, kt * TK, tk));
          if (s.trans_b)
            b.dma_transpose(
                b_t, bt.tile(static_cast<int>(bi * s.n + n0), static_cast<int>(tn), kt * TK, tk));
          else
            b.dma_copy(b_t, bt.tile(static_cast<int>(bi * s.k + kt * TK), tk, n0, tn));
          b.matmul(p, a_t, b_t, kt > 0);
        }
        const Tensor o = outs[static_cast<std::size_t>(oi)].tile(0, tm, 0, tn);
        const int r0 = static_cast<int>(bi * s.m + m0);
        const Tensor res_h = ep.residual ? io.residual.tile(r0, tm, n0, tn) : Tensor{};
        const QuantTile qt = quant_tile(ep, io, qscale, r0, tm, n0, tn, TN);
        const Engine evac =
            evacuate(b, ep, p, o, evac_tiles[static_cast<std::size_t>(oi)], &bias_sets[bs], &res_h,
                     oi % 2 ? Engine::scalar : Engine::vector, &qt);
        oi = (oi + 1) % OutputSlots::kOut;
        b.dma_copy(ct.tile(r0, tm, n0, tn), o, -1, false, evac);
      }
    }
  }
}

isa::Program matmul_kernel(const arch::ChipSpec& chip, const MatmulSpec& s) {
  if (s.m < 1 || s.n < 1 || s.k < 1) {
    throw Error(fmt::format("matmul: M, N, K must be >= 1, got {} x {} x {}", s.m, s.n, s.k));
  }
  check_output(chip, "matmul", s.out);
  check_mxfp8(chip, s.epilogue, s.n);
  if (s.batch < 1) throw Error(fmt::format("matmul: batch must be >= 1, got {}", s.batch));
  const bool mx =
      s.in == DType::fp8_e4m3_x4 || s.in == DType::fp8_e5m2_x4 || s.in == DType::fp4_e2m1_x4;
  // QuantizeMX writes MXFP8 only: MXFP4 operands arrive quantized (weights
  // quantized once, on the host or by the framework).
  if (s.in == DType::fp4_e2m1_x4 && !s.mx_prequantized)
    throw NotSupported(
        "MXFP4 matmul with BF16 operands: on-chip quantization (QuantizeMX) "
        "writes MXFP8; give MXFP4 operands quantized (mx_prequantized)");
  if (mx && (!s.trans_a || s.trans_b || s.batch != 1))
    throw NotSupported(
        "MX matmul with A as [M, K], B as [N, K] or a batch (A^T [K, M] and B [K, "
        "N], one matrix, are)");
  if (s.in_b) {
    const DType ib = *s.in_b;
    const bool x4 = isa::is_x4(s.in) && isa::is_x4(ib) && s.mx_prequantized;
    if (!x4 && !(isa::is_fp8(s.in) && isa::is_fp8(ib)) && ib != s.in)
      throw NotSupported(fmt::format(
          "matmul with {} x {} operands (mixed dtypes: FP8 E4M3 / E5M2, or prequantized MX x4)",
          isa::name(s.in), isa::name(ib)));
  }
  if (s.mx_prequantized && !mx)
    throw Error(
        fmt::format("matmul: mx_prequantized needs MX inputs (fp8_e4m3_x4 / "
                    "fp8_e5m2_x4), got {}",
                    isa::name(s.in)));
  if (mx) return mx_matmul_kernel(chip, s);
  const bool ok_in = s.in == DType::bf16 || s.in == DType::fp16 || s.in == DType::fp32 ||
                     s.in == DType::tf32 || isa::is_fp8(s.in);
  if (!ok_in) {
    throw NotSupported(fmt::format(
        "matmul with {} inputs (bf16, fp16, fp32, tf32, fp8 and MXFP8 x4 are)", isa::name(s.in)));
  }
  // Operands in the other layout go through the DMA transpose (2-byte types).
  if ((!s.trans_a || s.trans_b) && isa::size_bytes(s.in) != 2)
    throw NotSupported(
        fmt::format("matmul with A as [M, K] or B as [N, K] at {}: the transposing load is the DMA "
                    "transpose, which moves 2-byte types (bf16, fp16)",
                    isa::name(s.in)));
  Builder b(chip, s.cores, s.lnc);
  const std::int64_t NB = s.batch;
  // Batched operands are stacked along their first dim ([batch * rows, cols]).
  const Tensor at = s.trans_a ? b.hbm("at", {NB * s.k, s.m}, s.in, isa::TensorKind::input)
                              : b.hbm("a", {NB * s.m, s.k}, s.in, isa::TensorKind::input);
  const DType inb = s.in_b.value_or(s.in);
  const Tensor bt = s.trans_b ? b.hbm("bt", {NB * s.n, s.k}, inb, isa::TensorKind::input)
                              : b.hbm("b", {NB * s.k, s.n}, inb, isa::TensorKind::input);
  const Tensor ct = b.hbm("c", {NB * s.m, s.n}, s.out, isa::TensorKind::output);
  const Epilogue& ep = s.epilogue;
  const std::int64_t TK = chip.tensor.rows;             // contraction
  const std::int64_t TM = chip.tensor.stationary_fmax;  // output partitions
  const std::int64_t TN = output_tile_columns(chip);
  const EpilogueIo io = epilogue_io(b, ep, NB * s.m, s.n, TN);
  const Tensor& bias_h = io.bias;
  const Tensor& residual_h = io.residual;
  const std::int64_t KT = ceil_div(s.k, TK);
  const int esz = isa::size_bytes(s.in);
  // SBUF per partition: two A^T blocks (2 x KT x BM) + two B sets (2 x KT x TN) + outputs.
  const std::int64_t budget = chip.sbuf_partition_bytes.value() * 3 / 4;
  std::int64_t BM = std::min<std::int64_t>(4 * TM, ceil_div(s.m, TM) * TM);
  // Epilogue scratch: kOut fp32 tiles (+ kOut residual tiles) and two bias rows.
  const std::int64_t epi = epilogue_sbuf_bytes(ep, TM, TN);
  auto need = [&](std::int64_t bm) { return KT * (2 * bm + 2 * TN) * esz + 4 * TN * 4 + epi; };
  while (BM > TM && need(BM) > budget) BM -= TM;
  if (need(BM) > budget) {
    streamed_matmul(b, chip, s, io, at, bt, ct);
    return b.finish();
  }
  // Blocks of equal size (M = 768: two of 384, not 512 + 256).
  const std::int64_t mtiles = ceil_div(s.m, TM);
  BM = ceil_div(mtiles, ceil_div(mtiles, BM / TM)) * TM;
  const std::int64_t MB = ceil_div(s.m, BM);
  // Work units (batch, M block, N group) are dealt round-robin over the
  // cores; with fewer (batch, M block) pairs than cores, the N tiles split
  // into groups too, so that every core gets a share (e.g. a weight
  // gradient [768, 3072]: 2 M blocks x 4 N groups on 8 cores).
  const std::int64_t NT = ceil_div(s.n, TN);
  const std::int64_t NG = std::min(NT, ceil_div(s.cores, NB * MB));
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    // K tiles are allocated in pairs side by side ([TK, 2 x width]) so that
    // an FP8 pair can feed one double-row matmul; a_sets[s][kt] is the half.
    std::vector<Tensor> a_sets[2], b_sets[2];
    for (auto& set : a_sets) set.resize(static_cast<std::size_t>(KT));
    for (auto& set : b_sets) set.resize(static_cast<std::size_t>(KT));
    for (std::int64_t kt = 0; kt < KT; kt += 2) {
      const int rows = static_cast<int>(std::min(TK, s.k - kt * TK));
      const bool pair = kt + 1 < KT;
      for (auto* sets : {a_sets, b_sets}) {
        const std::int64_t w = sets == a_sets ? BM : TN;
        for (int set = 0; set < 2; ++set) {
          const Tensor t = b.sbuf(rows, (pair ? 2 : 1) * w, sets == a_sets ? s.in : inb);
          sets[set][kt] = t.tile(0, rows, 0, w);
          if (pair)
            sets[set][kt + 1] =
                t.tile(0, static_cast<int>(std::min(TK, s.k - (kt + 1) * TK)), w, w);
        }
      }
    }
    // Double row (FP8, v3+): a pair of full K tiles in one instruction.
    const bool double_row = isa::is_fp8(s.in) && chip.core_version >= 3;
    auto pair_view = [](const Tensor& first, std::int64_t width, std::int64_t c0, std::int64_t n) {
      return first.with_dims({{width, 2}, {1, n}}, c0);
    };
    OutputSlots slots = output_slots(b, ep, s.out, TM, TN);
    auto& [ps, outs, evac_tiles, bias_sets] = slots;
    constexpr int kPsum = OutputSlots::kPsum, kOut = OutputSlots::kOut;
    const Tensor qscale = load_qscale(b, ep, io, static_cast<int>(std::min(TM, NB * s.m)));
    // Steps (M block, N tile) in order; the loads of step i + 1 are issued
    // before the compute of step i, so the sync engine never blocks a
    // prefetch behind a store (software pipelining, double-buffered).
    struct Step {
      std::int64_t bi, mb, n0;
      int a_set, b_set;
    };
    std::vector<Step> steps;
    for (std::int64_t u = core; u < NB * MB * NG; u += s.cores) {
      const std::int64_t bi = u / (MB * NG), mb = u / NG % MB, g = u % NG;
      for (std::int64_t nt = g * NT / NG; nt < (g + 1) * NT / NG; ++nt) {
        const std::int64_t n0 = nt * TN;
        const bool new_a = !steps.empty() && (steps.back().mb != mb || steps.back().bi != bi);
        const int a_set = steps.empty() ? 0 : steps.back().a_set ^ (new_a ? 1 : 0);
        steps.push_back({bi, mb, n0, a_set, static_cast<int>(steps.size() % 2)});
      }
    }
    auto load = [&](std::size_t i) {
      const Step& st = steps[i];
      const std::int64_t m0 = st.mb * BM, bm = std::min(BM, s.m - m0);
      if (i == 0 || steps[i - 1].mb != st.mb || steps[i - 1].bi != st.bi) {
        for (std::int64_t kt = 0; kt < KT; ++kt) {
          const int tk = static_cast<int>(std::min(TK, s.k - kt * TK));
          const Tensor dst = a_sets[st.a_set][kt].tile(0, tk, 0, bm);
          if (s.trans_a)
            b.dma_copy(dst, at.tile(static_cast<int>(st.bi * s.k + kt * TK), tk, m0, bm));
          else
            b.dma_transpose(dst, at.tile(static_cast<int>(st.bi * s.m + m0), static_cast<int>(bm),
                                         kt * TK, tk));
        }
      }
      const std::int64_t tn = std::min(TN, s.n - st.n0);
      for (std::int64_t kt = 0; kt < KT; ++kt) {
        const int tk = static_cast<int>(std::min(TK, s.k - kt * TK));
        const Tensor dst = b_sets[st.b_set][kt].tile(0, tk, 0, tn);
        if (s.trans_b)
          b.dma_transpose(dst, bt.tile(static_cast<int>(st.bi * s.n + st.n0), static_cast<int>(tn),
                                       kt * TK, tk));
        else
          b.dma_copy(dst, bt.tile(static_cast<int>(st.bi * s.k + kt * TK), tk, st.n0, tn));
      }
      if (ep.bias) {
        const int rows = static_cast<int>(std::min(TM, s.m));
        b.dma_copy(bias_sets[st.b_set].tile(0, rows, 0, tn), bias_rows(bias_h, rows, st.n0, tn));
      }
    };
    int pi = 0, oi = 0;
    if (!steps.empty()) load(0);
    for (std::size_t i = 0; i < steps.size(); ++i) {
      if (i + 1 < steps.size()) load(i + 1);
      const Step& st = steps[i];
      const std::int64_t m0 = st.mb * BM, bm = std::min(BM, s.m - m0);
      const std::int64_t tn = std::min(TN, s.n - st.n0);
      for (std::int64_t mi = 0; mi * TM < bm; ++mi) {
        const int tm = static_cast<int>(std::min(TM, bm - mi * TM));
        const Tensor p = ps[pi].tile(0, tm, 0, tn);
        pi = (pi + 1) % kPsum;
        for (std::int64_t kt = 0; kt < KT; ++kt) {
          const int tk = static_cast<int>(std::min(TK, s.k - kt * TK));
          if (double_row && kt + 1 < KT && s.k - (kt + 1) * TK >= TK) {
            b.matmul(p, pair_view(a_sets[st.a_set][kt], BM, mi * TM, tm),
                     pair_view(b_sets[st.b_set][kt], TN, 0, tn), kt > 0, isa::PerfMode::double_row);
            ++kt;
            continue;
          }
          b.matmul(p, a_sets[st.a_set][kt].tile(0, tk, mi * TM, tm),
                   b_sets[st.b_set][kt].tile(0, tk, 0, tn), kt > 0);
        }
        const Tensor o = outs[oi].tile(0, tm, 0, tn);
        const int r0 = static_cast<int>(st.bi * s.m + m0 + mi * TM);
        const Tensor res_h = ep.residual ? residual_h.tile(r0, tm, st.n0, tn) : Tensor{};
        // Alternate the PSUM evacuation between Vector and Scalar; the epilogue
        // (if any) runs in the evacuation.
        const QuantTile qt = quant_tile(ep, io, qscale, r0, tm, st.n0, tn, TN);
        const Engine evac =
            evacuate(b, ep, p, o, evac_tiles[static_cast<std::size_t>(oi)], &bias_sets[st.b_set],
                     &res_h, oi % 2 ? Engine::scalar : Engine::vector, &qt);
        oi = (oi + 1) % kOut;
        // The evacuating engine triggers the store, so no load waits behind it.
        b.dma_copy(ct.tile(r0, tm, st.n0, tn), o, -1, false, evac);
      }
    }
  }
  return b.finish();
}

}  // namespace tern::kernel
