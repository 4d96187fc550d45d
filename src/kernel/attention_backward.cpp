// FlashAttention-2 backward (P recomputed from lse): the algorithm and its
// tiling are described at the top of attention.cpp.
#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kernel/attention_tiles.h"
#include "kernel/builder.h"
#include "kernel/detail.h"
#include "kernel/kernels.h"
#include "util/error.h"

namespace tern::kernel {

using isa::ActFunc;
using isa::AluOp;
using isa::DType;
using isa::Engine;
using namespace detail;
using namespace detail::attn;

isa::Program flash_attention_backward_kernel(const arch::ChipSpec& chip,
                                             const AttentionSpec& spec) {
  check_attention(chip, spec, "flash_attention_backward");
  const std::int64_t B = spec.batch, Hq = spec.q_heads, Hkv = spec.kv_heads, Sq = spec.seq_q,
                     Sk = spec.kv_len(), D = spec.head_dim, G = Hq / Hkv;
  const DType dt = spec.dtype;
  const int esz = isa::size_bytes(dt);
  const float scale = spec.softmax_scale();
  const bool fast_exp = chip.core_version >= 4;
  const std::int64_t nkt = ceil_div(Sk, kTq), nqt = ceil_div(Sq, kTq);
  const int Di = static_cast<int>(D);
  // SBUF per partition: the kv side (K^T, K, V^T, FP32 dK^T and dV^T
  // accumulators, their dtype copies) once; the query side (scaled Q^T and
  // Q, dO^T, dO, O, FP32 dQ^T, lse and Dsum columns) per buffered head.
  // FP32 (pe_t): the transposes run on the Tensor engine through a PSUM
  // bank; V's rows (and at the end dv's) are staged in the dK^T output tile,
  // widened to [128, max(Sk, nkt D)].
  const bool pe_t = esz == 4;
  const std::int64_t kvout_cols = pe_t ? std::max(Sk, nkt * D) : Sk;
  const std::int64_t kv_bytes =
      2 * (Sk * esz) + kvout_cols * esz + nkt * D * esz + 2 * Sk * 4 + Sk * esz;
  const std::int64_t q_bytes = 2 * Sq * esz + 3 * nqt * D * esz + Sq * 4 + 2 * nqt * 4;
  const std::int64_t rings = 16 * kKb * esz + 4 * D * 4 + 4096;
  const std::int64_t budget = chip.sbuf_partition_bytes.value();
  int qsets = 2;
  if (kv_bytes + 2 * q_bytes + rings > budget) qsets = 1;
  if (kv_bytes + q_bytes + rings > budget)
    throw NotSupported(fmt::format(
        "flash_attention_backward with seq_q {}, seq_k {}, head_dim {}: the per-head working "
        "set ({} bytes per partition) does not fit SBUF ({})",
        Sq, Sk, D, kv_bytes + q_bytes + rings, budget));

  Builder b(chip, spec.cores);
  const Tensor q = b.hbm("q", {B, Hq, D, Sq}, dt, isa::TensorKind::input);
  const Tensor k = b.hbm("k", {B, Hkv, D, Sk}, dt, isa::TensorKind::input);
  const Tensor v = b.hbm("v", {B, Hkv, Sk, D}, dt, isa::TensorKind::input);
  const HeadRows orow{Hq, Sq, D, spec.o_width}, drow{Hq, Sq, D, spec.do_width};
  const Tensor o = spec.o_width ? b.hbm("o", {B, Sq, spec.o_width}, dt, isa::TensorKind::input)
                                : b.hbm("o", {B, Hq, Sq, D}, dt, isa::TensorKind::input);
  const Tensor dout = spec.do_width
                          ? b.hbm("do", {B, Sq, spec.do_width}, dt, isa::TensorKind::input)
                          : b.hbm("do", {B, Hq, Sq, D}, dt, isa::TensorKind::input);
  const Tensor lse = b.hbm("lse", {B, Hq, Sq}, DType::fp32, isa::TensorKind::input);
  const std::int64_t W = spec.qkv_width;
  const bool merged = W > 0;
  if (merged) {
    auto in_range = [&](std::int64_t c0, std::int64_t heads) {
      return c0 >= 0 && c0 + heads * D <= W;
    };
    if (Sq != Sk || !in_range(spec.q_col, Hq) || !in_range(spec.k_col, Hkv) ||
        !in_range(spec.v_col, Hkv))
      throw Error(fmt::format(
          "flash_attention_backward: the qkv gradient [B, {}, {}] does not hold dq (columns "
          "from {}), dk (from {}) and dv (from {}) of {} / {} heads of {} with seq_k {}",
          Sq, W, spec.q_col, spec.k_col, spec.v_col, Hq, Hkv, D, Sk));
  }
  const Tensor dq = merged ? b.hbm("dqkv", {B * Sq, W}, dt, isa::TensorKind::output)
                           : b.hbm("dq", {B, Hq, D, Sq}, dt, isa::TensorKind::output);
  const Tensor dk = merged ? dq : b.hbm("dk", {B, Hkv, D, Sk}, dt, isa::TensorKind::output);
  const Tensor dv = merged ? dq : b.hbm("dv", {B, Hkv, Sk, D}, dt, isa::TensorKind::output);
  Tensor tp_ps;  // pe_t: the transposes' PSUM bank (per core)
  // `src` [D, S] (SBUF, [D, S0 >= S]) to `rows` [128, ceil(S / 128) D] (key
  // or query 128 t + p in partition p) by Tensor-engine transposes.
  auto pe_rows = [&](const Tensor& rows, const Tensor& src, std::int64_t S) {
    auto n_of = [&](int j) { return static_cast<int>(std::min(kTq, S - j * kTq)); };
    pe_transposes(
        b, static_cast<int>(ceil_div(S, kTq)),
        [&](int j) { return src.tile(0, Di, j * kTq, n_of(j)); },
        [&](int j) { return rows.tile(0, n_of(j), j * D, D); }, tp_ps, D, kKb, Engine::vector);
  };
  // The reverse: `rows` to `dst` [D, S].
  auto pe_cols = [&](const Tensor& dst, const Tensor& rows, std::int64_t S) {
    auto n_of = [&](int j) { return static_cast<int>(std::min(kTq, S - j * kTq)); };
    pe_transposes(
        b, static_cast<int>(ceil_div(S, kTq)),
        [&](int j) { return rows.tile(0, n_of(j), j * D, D); },
        [&](int j) { return dst.tile(0, Di, j * kTq, n_of(j)); }, tp_ps, kTq, kKb, Engine::vector);
  };
  // Writes head `head` (global: b * heads + h) of a gradient held as [D, S]
  // in SBUF: [D, S] rows as they are, or transposed by DMA in 128-row
  // pieces into the merged [B, S, W] output from column `col0` + h D (FP32:
  // transposed on the Tensor engine into `rows`, a free [128, ceil(S / 128)
  // D] tile, and stored from there).
  auto store_t = [&](const Tensor& dst, std::int64_t head, std::int64_t heads, std::int64_t col0,
                     std::int64_t S, const Tensor& src, const Tensor& rows) {
    if (!merged) {
      b.dma_copy(dst.tile(static_cast<int>(head * D), Di, 0, S), src, -1, false, Engine::gpsimd);
      return;
    }
    const std::int64_t bi = head / heads, h = head % heads;
    if (pe_t) {
      pe_rows(rows, src, S);
      store_row_tiles_at(b, dst, bi * S * W + col0 + h * D, W, rows, S, D);
      return;
    }
    for (std::int64_t s0 = 0; s0 < S; s0 += kTq) {
      const int n = static_cast<int>(std::min(kTq, S - s0));
      b.dma_transpose(hbm_view(dst, (bi * S + s0) * W + col0 + h * D, n, W, {{1, D}}),
                      src.tile(0, Di, s0, n));
    }
  };

  // Units: (batch, kv head), each with all its query heads (dK, dV sum over
  // them on one core, and dQ of a query head stays on one core).
  std::vector<std::int64_t> units;
  for (std::int64_t u = 0; u < B * Hkv; ++u) units.push_back(u);
  const auto cut = balance(std::vector<double>(units.size(), 1.0), spec.cores);

  for (int core = 0; core < spec.cores; ++core) {
    b.set_core(core);
    if (cut[core] == cut[core + 1]) continue;
    struct Step {
      std::int64_t kv, h;  // global kv head (b * Hkv + g) and query head (b * Hq + h)
      int head;            // index of the head on this core (query-side buffer set)
      std::int64_t k0, kw, q0, tq;
      bool first_unit, first_head, first_block, last_block, last_head, last_unit;
      std::int64_t block_kw;  // widest key range of the block (its first step)
    };
    std::vector<Step> steps;
    int head = 0;
    for (std::size_t ui = cut[core]; ui < cut[core + 1]; ++ui) {
      const std::int64_t kv = units[ui], bi = kv / Hkv, g = kv % Hkv;
      const std::size_t unit_first = steps.size();
      for (std::int64_t j = 0; j < G; ++j, ++head) {
        const std::int64_t h = bi * Hq + g * G + j;
        const std::size_t head_first = steps.size();
        for (std::int64_t k0 = 0; k0 < Sk; k0 += kKb) {
          const std::int64_t kb = std::min(kKb, Sk - k0);
          const std::size_t block_first = steps.size();
          // Query tiles that see a key of the block, widest key range first
          // (the first matmul into the dK / dV accumulators writes it all).
          for (std::int64_t qt = nqt - 1; qt >= 0; --qt) {
            const std::int64_t q0 = qt * kTq, tq = std::min(kTq, Sq - q0);
            const std::int64_t kw = spec.causal ? std::min(kb, q0 + tq - k0) : kb;
            if (kw <= 0) continue;
            steps.push_back(
                {kv, h, head, k0, kw, q0, tq, false, false, false, false, false, false, 0});
          }
          if (steps.size() == block_first) continue;
          steps[block_first].first_block = true;
          steps.back().last_block = true;
          for (std::size_t s = block_first; s < steps.size(); ++s)
            steps[s].block_kw = steps[block_first].kw;
        }
        steps[head_first].first_head = true;
        steps.back().last_head = true;
      }
      steps[unit_first].first_unit = true;
      steps.back().last_unit = true;
    }
    const auto [ident, mask] =
        spec.causal ? mask_tiles(b, dt) : std::pair<Tensor, Tensor>{Tensor{}, Tensor{}};

    // kv side
    const Tensor kT = b.sbuf(Di, Sk, dt), kr = b.sbuf(static_cast<int>(kTq), nkt * D, dt),
                 vT = b.sbuf(Di, Sk, dt), dkacc = b.sbuf(Di, Sk, DType::fp32),
                 dvacc = b.sbuf(Di, Sk, DType::fp32),
                 kvout_t = b.sbuf(pe_t ? static_cast<int>(kTq) : Di, kvout_cols, dt),
                 kvout = pe_t ? kvout_t.tile(0, Di, 0, Sk) : kvout_t;
    // pe_t: V's rows (the source of V^T), later dv's rows on their way out.
    const Tensor vrow = pe_t ? kvout_t.tile(0, static_cast<int>(kTq), 0, nkt * D) : Tensor{};
    if (pe_t) tp_ps = b.psum(static_cast<int>(kTq), kKb);
    // query side, per buffered head
    struct QSet {
      Tensor qsT, qs, doT, dor, ot, dqacc, lse, nds;
    };
    std::vector<QSet> qset;
    for (int i = 0; i < qsets; ++i) {
      qset.push_back({b.sbuf(Di, Sq, dt), b.sbuf(static_cast<int>(kTq), nqt * D, dt),
                      b.sbuf(Di, Sq, dt), b.sbuf(static_cast<int>(kTq), nqt * D, dt),
                      b.sbuf(static_cast<int>(kTq), nqt * D, dt), b.sbuf(Di, Sq, DType::fp32),
                      b.sbuf(static_cast<int>(kTq), nqt, DType::fp32),
                      b.sbuf(static_cast<int>(kTq), nqt, DType::fp32)});
    }
    const Tensor prod = b.sbuf(static_cast<int>(kTq), D, DType::fp32);

    auto setup_kv = [&](std::int64_t kv) {
      b.dma_copy(kT, k.tile(static_cast<int>(kv * D), Di, 0, Sk));
      if (pe_t) {
        load_row_tiles(b, vrow, v, kv * Sk, Sk, D);
        pe_rows(kr, kT, Sk);
        pe_cols(vT, vrow, Sk);
      }
      for (std::int64_t t = 0; t < nkt && !pe_t; ++t) {
        const int kw = static_cast<int>(std::min(kTq, Sk - t * kTq));
        b.dma_transpose(kr.tile(0, kw, t * D, D),
                        k.tile(static_cast<int>(kv * D), Di, t * kTq, kw));
        b.dma_transpose(vT.tile(0, Di, t * kTq, kw),
                        v.tile(static_cast<int>(kv * Sk + t * kTq), kw, 0, D));
      }
      b.memset(dkacc, 0.0f, Engine::gpsimd);
      b.memset(dvacc, 0.0f, Engine::gpsimd);
    };
    // A query head's side in two parts: the HBM loads, and (once they have
    // had time to arrive) the on-chip work, so that a prefetch never parks an
    // engine's in-order stream on a load in flight.
    auto setup_head_loads = [&](const QSet& qs, std::int64_t h) {
      b.dma_copy(qs.qsT, q.tile(static_cast<int>(h * D), Di, 0, Sq));
      load_row_tiles_at(b, qs.dor, dout, drow.at(h, 0), drow.stride(), Sq, D);
      load_row_tiles_at(b, qs.ot, o, orow.at(h, 0), orow.stride(), Sq, D);
      const std::int64_t full = Sq / kTq, rest = Sq % kTq;
      if (full > 0)
        b.dma_copy(qs.lse.tile(0, static_cast<int>(kTq), 0, full),
                   hbm_view(lse, h * Sq, static_cast<int>(kTq), 1, {{kTq, full}}));
      if (rest > 0)
        b.dma_copy(qs.lse.tile(0, static_cast<int>(rest), full, 1),
                   hbm_view(lse, h * Sq + full * kTq, static_cast<int>(rest), 1, {{1, 1}}));
      for (std::int64_t t = 0; t < nqt && !pe_t; ++t) {
        const int tq = static_cast<int>(std::min(kTq, Sq - t * kTq));
        // dO^T by 128 x D transposes (pe_t: in setup_head_compute).
        b.dma_transpose(qs.doT.tile(0, Di, t * kTq, tq),
                        hbm_view(dout, drow.at(h, t * kTq), tq, drow.stride(), {{1, D}}));
      }
    };
    auto setup_head_compute = [&](const QSet& qs) {
      // The softmax scale folded into Q (as in the forward pass).
      b.tensor_scalar(qs.qsT, qs.qsT, AluOp::multiply, scale, AluOp::bypass, 0.0f, Engine::gpsimd);
      const std::int64_t full = Sq / kTq, rest = Sq % kTq;
      if (!fast_exp) {  // the activation's bias is -lse
        if (full > 0)
          b.tensor_scalar(qs.lse.tile(0, static_cast<int>(kTq), 0, full),
                          qs.lse.tile(0, static_cast<int>(kTq), 0, full), AluOp::multiply, -1.0f,
                          AluOp::bypass, 0.0f, Engine::gpsimd);
        if (rest > 0)
          b.tensor_scalar(qs.lse.tile(0, static_cast<int>(rest), full, 1),
                          qs.lse.tile(0, static_cast<int>(rest), full, 1), AluOp::multiply, -1.0f,
                          AluOp::bypass, 0.0f, Engine::gpsimd);
      }
      if (pe_t) {
        pe_rows(qs.qs, qs.qsT, Sq);
        pe_cols(qs.doT, qs.dor, Sq);
      }
      for (std::int64_t t = 0; t < nqt; ++t) {
        const int tq = static_cast<int>(std::min(kTq, Sq - t * kTq));
        // Q (scaled) with queries on partitions by 128 x D transposes.
        if (!pe_t) b.dma_transpose(qs.qs.tile(0, tq, t * D, D), qs.qsT.tile(0, Di, t * kTq, tq));
        // -Dsum = -rowsum(dO * O): the bias of dP - Dsum.
        b.tensor_tensor(prod.tile(0, tq, 0, D), qs.dor.tile(0, tq, t * D, D),
                        qs.ot.tile(0, tq, t * D, D), AluOp::multiply, Engine::gpsimd);
        b.tensor_reduce(qs.nds.tile(0, tq, t, 1), prod.tile(0, tq, 0, D), AluOp::add, true);
      }
    };

    constexpr int kRing = 4;
    std::vector<Tensor> s_ps, dp_ps, p_sb, t_sb, ds_sb, dst_sb;
    for (int i = 0; i < 2; ++i) {
      s_ps.push_back(b.psum(static_cast<int>(kTq), kKb));
      dp_ps.push_back(b.psum(static_cast<int>(kTq), kKb));
    }
    const Tensor dv_ps = b.psum(Di, kKb), dk_ps = b.psum(Di, kKb), dq_ps = b.psum(Di, kKb);
    for (int i = 0; i < kRing; ++i) {
      p_sb.push_back(b.sbuf(static_cast<int>(kTq), kKb, dt));
      t_sb.push_back(b.sbuf(static_cast<int>(kTq), kKb, dt));
      ds_sb.push_back(b.sbuf(static_cast<int>(kTq), kKb, dt));
      dst_sb.push_back(b.sbuf(static_cast<int>(kTq), kKb, dt));
    }
    const int n = static_cast<int>(steps.size());
    auto ring = [](int i, int size) { return static_cast<std::size_t>(i % size); };
    auto qsetof = [&](const Step& st) -> const QSet& {
      return qset[static_cast<std::size_t>(st.head % qsets)];
    };

    auto stage_a = [&](int i) {
      const Step& st = steps[static_cast<std::size_t>(i)];
      const QSet& qs = qsetof(st);
      const int tq = static_cast<int>(st.tq);
      const Tensor s = s_ps[ring(i, 2)].tile(0, tq, 0, st.kw);
      b.matmul(s, qs.qsT.tile(0, Di, st.q0, tq), kT.tile(0, Di, st.k0, st.kw), false);
      if (spec.causal && st.q0 >= st.k0 && st.q0 < st.k0 + st.kw) {
        const std::int64_t c0 = st.q0 - st.k0, w = st.kw - c0;
        b.matmul(s.tile(0, tq, c0, w), ident.tile(0, tq, 0, tq), mask.tile(0, tq, 0, w), true);
      }
      b.matmul(dp_ps[ring(i, 2)].tile(0, tq, 0, st.kw), qs.doT.tile(0, Di, st.q0, tq),
               vT.tile(0, Di, st.k0, st.kw), false);
    };
    auto stage_b = [&](int i) {
      const Step& st = steps[static_cast<std::size_t>(i)];
      const QSet& qs = qsetof(st);
      const int tq = static_cast<int>(st.tq);
      const std::int64_t qt = st.q0 / kTq;
      const Tensor s = s_ps[ring(i, 2)].tile(0, tq, 0, st.kw);
      const Tensor dp = dp_ps[ring(i, 2)].tile(0, tq, 0, st.kw);
      const Tensor p = p_sb[ring(i, kRing)].tile(0, tq, 0, st.kw);
      const Tensor t = t_sb[ring(i, kRing)].tile(0, tq, 0, st.kw);
      const Tensor ds = ds_sb[ring(i, kRing)].tile(0, tq, 0, st.kw);
      const Tensor lcol = qs.lse.tile(0, tq, qt, 1), dcol = qs.nds.tile(0, tq, qt, 1);
      if (fast_exp)
        b.exponential(p, s, &lcol);
      else
        b.activation(p, ActFunc::exp, s, &lcol);
      b.activation(t, ActFunc::identity, dp, &dcol);
      b.tensor_tensor(ds, t, p, AluOp::multiply, Engine::gpsimd);
      const Tensor& dst = dst_sb[ring(i, kRing)];
      auto kw_of = [&](std::int64_t c0) { return static_cast<int>(std::min(kTq, st.kw - c0)); };
      if (pe_t) {
        pe_transposes(
            b, static_cast<int>(ceil_div(st.kw, kTq)),
            [&](int j) { return ds.tile(0, tq, j * kTq, kw_of(j * kTq)); },
            [&](int j) { return dst.tile(0, kw_of(j * kTq), j * kTq, tq); }, tp_ps, kTq, kKb,
            Engine::vector);
        return;
      }
      for (std::int64_t c0 = 0; c0 < st.kw; c0 += kTq) {
        const int kw = kw_of(c0);
        b.dma_transpose(dst.tile(0, kw, c0, tq), ds.tile(0, tq, c0, kw));
      }
    };
    auto stage_c = [&](int i) {
      const Step& st = steps[static_cast<std::size_t>(i)];
      const QSet& qs = qsetof(st);
      const int tq = static_cast<int>(st.tq);
      const std::int64_t qt = st.q0 / kTq;
      const Tensor p = p_sb[ring(i, kRing)].tile(0, tq, 0, st.kw);
      const Tensor ds = ds_sb[ring(i, kRing)].tile(0, tq, 0, st.kw);
      b.matmul(dv_ps.tile(0, Di, 0, st.kw), qs.dor.tile(0, tq, qt * D, D), p, !st.first_block);
      b.matmul(dk_ps.tile(0, Di, 0, st.kw), qs.qs.tile(0, tq, qt * D, D), ds, !st.first_block);
      if (st.last_block) {
        const Tensor dva = dvacc.tile(0, Di, st.k0, st.block_kw);
        const Tensor dka = dkacc.tile(0, Di, st.k0, st.block_kw);
        b.tensor_tensor(dva, dva, dv_ps.tile(0, Di, 0, st.block_kw), AluOp::add);
        b.tensor_tensor(dka, dka, dk_ps.tile(0, Di, 0, st.block_kw), AluOp::add);
      }
    };
    auto stage_d = [&](int i) {
      const Step& st = steps[static_cast<std::size_t>(i)];
      const QSet& qs = qsetof(st);
      const int tq = static_cast<int>(st.tq);
      const Tensor dqp = dq_ps.tile(0, Di, static_cast<std::int64_t>(ring(i, 4)) * kTq, tq);
      const Tensor& dst = dst_sb[ring(i, kRing)];
      for (std::int64_t c0 = 0; c0 < st.kw; c0 += kTq) {
        const int kw = static_cast<int>(std::min(kTq, st.kw - c0));
        b.matmul(dqp, kr.tile(0, kw, (st.k0 + c0) / kTq * D, D), dst.tile(0, kw, c0, tq), c0 > 0);
      }
      const Tensor acc = qs.dqacc.tile(0, Di, st.q0, tq);
      if (st.k0 == 0)
        b.tensor_copy(acc, dqp, Engine::scalar);
      else
        b.tensor_tensor(acc, acc, dqp, AluOp::add);
      if (st.last_head) {
        // dQ = scale dS K (the scale of S = scale Q K^T), cast, stored as [D, Sq].
        const Tensor out = qs.qsT;  // free once the head's matmuls are done
        b.tensor_scalar(out, qs.dqacc, AluOp::multiply, scale, AluOp::bypass, 0.0f, Engine::gpsimd);
        store_t(dq, st.h, Hq, spec.q_col, Sq, out, qs.qs);  // Q' rows are free too
      }
      if (st.last_unit) {
        b.tensor_copy(kvout, dkacc, Engine::gpsimd);
        store_t(dk, st.kv, Hkv, spec.k_col, Sk, kvout, kr);  // and K's rows
        const Tensor dvo = kT;  // K^T is free once the unit's matmuls are done
        b.tensor_copy(dvo, dvacc, Engine::gpsimd);
        if (pe_t) {
          const std::int64_t bi = st.kv / Hkv, g = st.kv % Hkv;
          pe_rows(vrow, dvo, Sk);
          if (merged)
            store_row_tiles_at(b, dv, bi * Sk * W + spec.v_col + g * D, W, vrow, Sk, D);
          else
            store_row_tiles_at(b, dv, st.kv * Sk * D, D, vrow, Sk, D);
        }
        for (std::int64_t t = 0; t < nkt && !pe_t; ++t) {
          const int kw = static_cast<int>(std::min(kTq, Sk - t * kTq));
          const std::int64_t bi = st.kv / Hkv, g = st.kv % Hkv;
          b.dma_transpose(
              merged ? hbm_view(dv, (bi * Sk + t * kTq) * W + spec.v_col + g * D, kw, W, {{1, D}})
                     : dv.tile(static_cast<int>(st.kv * Sk + t * kTq), kw, 0, D),
              dvo.tile(0, Di, t * kTq, kw));
        }
      }
    };
    // The pipeline runs over the steps of one query head (a segment) and
    // drains at its end; the next head's query side is loaded into the other
    // set when a segment starts (the set of the head before, done by then).
    constexpr int kLeadA = 3, kLeadB = 2, kLeadC = 1;
    std::vector<int> seg;
    for (int i = 0; i < n; ++i)
      if (steps[static_cast<std::size_t>(i)].first_head) seg.push_back(i);
    seg.push_back(n);
    for (std::size_t sg = 0; sg + 1 < seg.size(); ++sg) {
      const int s0 = seg[sg], s1 = seg[sg + 1];
      const Step& st0 = steps[static_cast<std::size_t>(s0)];
      if (st0.first_unit) setup_kv(st0.kv);
      if (qsets == 1 || sg == 0) {
        setup_head_loads(qsetof(st0), st0.h);
        setup_head_compute(qsetof(st0));
      }
      const bool prefetch = qsets == 2 && s1 < n;
      const Step* next = prefetch ? &steps[static_cast<std::size_t>(s1)] : nullptr;
      if (prefetch) setup_head_loads(qsetof(*next), next->h);
      // The prefetched head's on-chip setup a few steps later (its loads in
      // flight meanwhile).
      const int compute_at = std::min(s1 - 1, s0 + 6);
      for (int i = s0 - kLeadA; i < s1; ++i) {
        if (prefetch && i == compute_at) setup_head_compute(qsetof(*next));
        if (i + kLeadA >= s0 && i + kLeadA < s1) stage_a(i + kLeadA);
        if (i + kLeadB >= s0 && i + kLeadB < s1) stage_b(i + kLeadB);
        if (i + kLeadC >= s0 && i + kLeadC < s1) stage_c(i + kLeadC);
        if (i >= s0) stage_d(i);
      }
    }
  }
  return b.finish();
}

}  // namespace tern::kernel
