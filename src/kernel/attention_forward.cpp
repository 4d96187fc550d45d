// FlashAttention-2 forward: the algorithm and its tiling are described at
// the top of attention.cpp.
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

isa::Program flash_attention_kernel(const arch::ChipSpec& chip, const AttentionSpec& spec) {
  check_attention(chip, spec, "flash_attention");
  if (spec.qkv_width != 0)
    throw Error("flash_attention: qkv_width is an option of the backward kernel");
  const std::int64_t B = spec.batch, Hq = spec.q_heads, Hkv = spec.kv_heads, Sq = spec.seq_q,
                     Sk = spec.kv_len(), D = spec.head_dim, G = Hq / Hkv;
  const DType dt = spec.dtype;
  const float scale = spec.softmax_scale();
  const bool fast_exp = chip.core_version >= 4;  // Vector exponential (4x the Scalar rate)
  // FP32: P^T by Tensor-engine transposes (DMA transposes move 2-byte types).
  const bool pe_t = isa::size_bytes(dt) == 4;
  const std::int64_t nkt = ceil_div(Sk, kTq);
  {
    // K^T and V of two kv heads (the current one and the next, prefetched),
    // and the rings below (FP32: P, P^T, Q, O twice the bytes).
    const std::int64_t need = 2 * (Sk + nkt * D) * isa::size_bytes(dt) + (pe_t ? 96 : 64) * 1024;
    if (need > chip.sbuf_partition_bytes.value())
      throw NotSupported(fmt::format(
          "flash_attention with seq_k {}: K and V of two heads ({} bytes per partition) do "
          "not fit SBUF",
          Sk, need));
  }

  Builder b(chip, spec.cores);
  const Tensor q = b.hbm("q", {B, Hq, D, Sq}, dt, isa::TensorKind::input);
  const Tensor k = b.hbm("k", {B, Hkv, D, Sk}, dt, isa::TensorKind::input);
  const Tensor v = b.hbm("v", {B, Hkv, Sk, D}, dt, isa::TensorKind::input);
  const HeadRows orow{Hq, Sq, D, spec.o_width};
  const Tensor o = spec.o_width ? b.hbm("o", {B, Sq, spec.o_width}, dt, isa::TensorKind::output)
                                : b.hbm("o", {B, Hq, Sq, D}, dt, isa::TensorKind::output);
  const Tensor lse = b.hbm("lse", {B, Hq, Sq}, DType::fp32, isa::TensorKind::output);

  // Units: (batch, query head, query tile) in kv-head order, weighted by the
  // keys they attend to (+ a per-block overhead).
  struct Unit {
    std::int64_t bi, h, kv, q0, tq, kend;
  };
  std::vector<Unit> units;
  std::vector<double> weight;
  for (std::int64_t bi = 0; bi < B; ++bi)
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t q0 = 0; q0 < Sq; q0 += kTq) {
        const std::int64_t tq = std::min(kTq, Sq - q0);
        const std::int64_t kend = spec.causal ? std::min(Sk, q0 + tq) : Sk;
        units.push_back({bi, h, bi * Hkv + h / G, q0, tq, kend});
        weight.push_back(static_cast<double>(kend + 256 * ceil_div(kend, kStep)));
      }
  const auto cut = balance(weight, spec.cores);

  for (int core = 0; core < spec.cores; ++core) {
    b.set_core(core);
    const std::vector<Unit> mine(units.begin() + static_cast<std::ptrdiff_t>(cut[core]),
                                 units.begin() + static_cast<std::ptrdiff_t>(cut[core + 1]));
    if (mine.empty()) continue;
    struct Step {
      std::size_t u;
      std::int64_t k0, kb;
      bool first, last, diag;
    };
    std::vector<Step> steps;
    for (std::size_t u = 0; u < mine.size(); ++u) {
      const Unit& x = mine[u];
      for (std::int64_t k0 = 0; k0 < x.kend; k0 += kStep) {
        const std::int64_t kb = std::min(kStep, x.kend - k0);
        const bool diag = spec.causal && x.q0 < Sk && x.q0 >= k0 && x.q0 < k0 + kb;
        steps.push_back({u, k0, kb, k0 == 0, k0 + kb >= x.kend, diag});
      }
    }
    const auto [ident, mask] =
        spec.causal ? mask_tiles(b, dt) : std::pair<Tensor, Tensor>{Tensor{}, Tensor{}};

    // K^T [D, Sk] and V as [128, nkt * D] (key 128 t + p in partition p), two sets.
    Tensor kT[2], vt[2];
    for (int i = 0; i < 2; ++i) {
      kT[i] = b.sbuf(static_cast<int>(D), Sk, dt);
      vt[i] = b.sbuf(static_cast<int>(kTq), nkt * D, dt);
    }
    std::vector<int> kvset(mine.size());
    // K^T and V in chunks of one step's keys, so the first step's matmuls
    // wait only for the first chunk.
    auto load_kv = [&](std::size_t u) {
      const std::int64_t kv = mine[u].kv;
      for (std::int64_t k0 = 0; k0 < Sk; k0 += kStep) {
        const std::int64_t kc = std::min(kStep, Sk - k0);
        b.dma_copy(kT[kvset[u]].tile(0, static_cast<int>(D), k0, kc),
                   k.tile(static_cast<int>(kv * D), static_cast<int>(D), k0, kc));
        load_row_tiles(
            b, vt[kvset[u]].tile(0, static_cast<int>(kTq), k0 / kTq * D, ceil_div(kc, kTq) * D), v,
            kv * Sk + k0, kc, D);
      }
    };
    for (std::size_t u = 1; u < mine.size(); ++u)
      kvset[u] = kvset[u - 1] ^ (mine[u].kv != mine[u - 1].kv ? 1 : 0);

    // Rings (the builder orders reuse; the sizes only set how far the stages
    // of consecutive blocks can run apart).
    // Scores / softmax of step i + lead are issued before the P V of step i
    // (the softmax chain and the DMA transposes' ~1.5 us latency hide behind
    // the matmuls of the steps in between). PSUM: kS = 3 steps of scores
    // (2 banks each) + kO = 2 banks of O use all 8 banks; the leads were
    // chosen by measurement (bench/README.md).
    constexpr int kLeadQ = 10, kLeadA = 6, kLeadB = 4;
    constexpr int kS = 3, kP = kLeadB + 2, kO = 2, kCol = 16, kU = kLeadQ + 2;
    // Stage A of block i + kLeadA rewrites the scores stage B of block
    // i + kLeadB still has to read unless the ring is longer than the gap.
    static_assert(kS > kLeadA - kLeadB && kP > kLeadB + 1 && kLeadA >= kLeadB + 2);
    std::vector<Tensor> s_ps, p_sb, pt_sb, o_ps, m_c, mx_c, r2_c, nm_c, a_c, r_c, qs, oacc, l_c,
        o_out, lse_c, rl_c;
    std::vector<Tensor> s_bf;
    for (int i = 0; i < kS; ++i) {
      s_ps.push_back(b.psum(static_cast<int>(kTq), kStep));
      s_bf.push_back(b.sbuf(static_cast<int>(kTq), kStep, DType::bf16));
    }
    for (int i = 0; i < kP; ++i) {
      p_sb.push_back(b.sbuf(static_cast<int>(kTq), kStep, dt));
      pt_sb.push_back(b.sbuf(static_cast<int>(kTq), kStep, dt));  // kStep / 128 tiles [keys, tq]
    }
    for (int i = 0; i < kO; ++i) o_ps.push_back(b.psum(static_cast<int>(kTq), D));
    for (int i = 0; i < kCol; ++i) {
      m_c.push_back(b.sbuf(static_cast<int>(kTq), 1, DType::fp32));
      mx_c.push_back(b.sbuf(static_cast<int>(kTq), 1, DType::fp32));
      r2_c.push_back(b.sbuf(static_cast<int>(kTq), 1, DType::fp32));
      nm_c.push_back(b.sbuf(static_cast<int>(kTq), 1, DType::fp32));
      a_c.push_back(b.sbuf(static_cast<int>(kTq), 1, DType::fp32));
      r_c.push_back(b.sbuf(static_cast<int>(kTq), 1, DType::fp32));
    }
    for (int i = 0; i < kU; ++i) {
      qs.push_back(b.sbuf(static_cast<int>(D), kTq, dt));
      oacc.push_back(b.sbuf(static_cast<int>(kTq), D, DType::fp32));
      l_c.push_back(b.sbuf(static_cast<int>(kTq), 1, DType::fp32));
      o_out.push_back(b.sbuf(static_cast<int>(kTq), D, dt));
      lse_c.push_back(b.sbuf(static_cast<int>(kTq), 1, DType::fp32));
      rl_c.push_back(b.sbuf(static_cast<int>(kTq), 1, DType::fp32));
    }
    const int n = static_cast<int>(steps.size());
    auto ring = [](int i, int size) { return static_cast<std::size_t>(i % size); };

    // Stage Q (a unit's first block, well ahead of its scores): load the
    // query tile (only the score matmul waits for it).
    auto stage_q = [&](int i) {
      const Step& st = steps[static_cast<std::size_t>(i)];
      const Unit& x = mine[st.u];
      const int tq = static_cast<int>(x.tq);
      if (st.first)
        b.dma_copy(qs[st.u % kU].tile(0, static_cast<int>(D), 0, tq),
                   q.tile(static_cast<int>((x.bi * Hq + x.h) * D), static_cast<int>(D), x.q0, tq));
    };
    // Stage A: the scores (and the mask on the diagonal block).
    auto stage_a = [&](int i) {
      const Step& st = steps[static_cast<std::size_t>(i)];
      const Unit& x = mine[st.u];
      const int tq = static_cast<int>(x.tq);
      const std::size_t us = st.u % kU;
      const Tensor s = s_ps[ring(i, kS)].tile(0, tq, 0, st.kb);
      for (std::int64_t c0 = 0; c0 < st.kb; c0 += kKb) {
        const std::int64_t w = std::min(kKb, st.kb - c0);
        b.matmul(s.tile(0, tq, c0, w), qs[us].tile(0, static_cast<int>(D), 0, tq),
                 kT[kvset[st.u]].tile(0, static_cast<int>(D), st.k0 + c0, w), false);
      }
      if (st.diag) {
        // Keys q0 + c > query q0 + p get the mask value: + I^T mask.
        const std::int64_t c0 = x.q0 - st.k0, w = st.kb - c0;
        b.matmul(s.tile(0, tq, c0, w), ident.tile(0, tq, 0, tq), mask.tile(0, tq, 0, w), true);
      }
    };
    // Stage B, in three parts issued one block apart so that no engine's
    // in-order stream holds the next block's work behind this block's chain
    // (copy -> reduce -> max -> exp): B1 the Scalar engine's BF16 copy of
    // the scores, B2 the row max, B3 the exp, the rescale factors and the
    // transposes of P.
    //
    // The row max comes from the BF16 copy (the Vector engine reduces BF16
    // at twice the FP32 rate): m only has to be close to the max for
    // exp(s - m) to stay in range; softmax and lse = m + ln l are exact for
    // any m. The exp reads the FP32 scores.
    auto stage_b1 = [&](int i) {
      const Step& st = steps[static_cast<std::size_t>(i)];
      const int tq = static_cast<int>(mine[st.u].tq);
      const Tensor s = s_ps[ring(i, kS)].tile(0, tq, 0, st.kb);
      const Tensor sc = s_bf[ring(i, kS)].tile(0, tq, 0, st.kb);
      for (std::int64_t c0 = 0; c0 < st.kb; c0 += kKb) {  // one PSUM bank per instruction
        const std::int64_t w = std::min(kKb, st.kb - c0);
        b.tensor_copy(sc.tile(0, tq, c0, w), s.tile(0, tq, c0, w), Engine::scalar);
      }
    };
    auto stage_b2 = [&](int i) {
      const Step& st = steps[static_cast<std::size_t>(i)];
      const int tq = static_cast<int>(mine[st.u].tq);
      const Tensor m = m_c[ring(i, kCol)].tile(0, tq, 0, 1);
      const Tensor mprev = m_c[ring(i + kCol - 1, kCol)].tile(0, tq, 0, 1);
      const Tensor sc = s_bf[ring(i, kS)].tile(0, tq, 0, st.kb);
      if (st.first) {
        b.tensor_reduce(m, sc, AluOp::max);
      } else {
        const Tensor mx = mx_c[ring(i, kCol)].tile(0, tq, 0, 1);
        b.tensor_reduce(mx, sc, AluOp::max);
        b.tensor_tensor(m, mprev, mx, AluOp::max, Engine::gpsimd);
      }
    };
    auto stage_b3 = [&](int i) {
      const Step& st = steps[static_cast<std::size_t>(i)];
      const Unit& x = mine[st.u];
      const int tq = static_cast<int>(x.tq);
      const Tensor s = s_ps[ring(i, kS)].tile(0, tq, 0, st.kb);
      const Tensor m = m_c[ring(i, kCol)].tile(0, tq, 0, 1);
      const Tensor mprev = m_c[ring(i + kCol - 1, kCol)].tile(0, tq, 0, 1);
      const Tensor alpha = a_c[ring(i, kCol)].tile(0, tq, 0, 1);
      const Tensor l = l_c[st.u % kU].tile(0, tq, 0, 1);
      const Tensor r = st.first ? l : r_c[ring(i, kCol)].tile(0, tq, 0, 1);
      const Tensor p = p_sb[ring(i, kP)].tile(0, tq, 0, st.kb);
      const Tensor negm = nm_c[ring(i, kCol)].tile(0, tq, 0, 1);
      if (!fast_exp)
        b.tensor_scalar(negm, m, AluOp::multiply, -1.0f, AluOp::bypass, 0.0f, Engine::gpsimd);
      // exp per PSUM bank; the second bank's row sums go to r2.
      const Tensor r2 = r2_c[ring(i, kCol)].tile(0, tq, 0, 1);
      for (std::int64_t c0 = 0; c0 < st.kb; c0 += kKb) {
        const std::int64_t w = std::min(kKb, st.kb - c0);
        const Tensor& rs = c0 == 0 ? r : r2;
        if (fast_exp)
          b.exponential(p.tile(0, tq, c0, w), s.tile(0, tq, c0, w), &m, &rs);
        else
          b.activation(p.tile(0, tq, c0, w), ActFunc::exp, s.tile(0, tq, c0, w), &negm, 1.0f, &rs);
      }
      if (!st.first) {
        // alpha = exp(m_prev - m): the rescale of the running sums.
        b.activation(alpha, ActFunc::exp, m, &mprev, -1.0f);
        b.tensor_scalar(l, l, AluOp::multiply, alpha, AluOp::add, 0.0f, &r, Engine::gpsimd);
      }
      if (st.kb > kKb) b.tensor_tensor(l, l, r2, AluOp::add, Engine::gpsimd);
      const Tensor& pt = pt_sb[ring(i, kP)];
      auto kw_of = [&](std::int64_t c0) { return static_cast<int>(std::min(kTq, st.kb - c0)); };
      if (pe_t) {
        // Through the step's score banks (the exp above was their last reader).
        pe_transposes(
            b, static_cast<int>(ceil_div(st.kb, kTq)),
            [&](int j) { return p.tile(0, tq, j * kTq, kw_of(j * kTq)); },
            [&](int j) { return pt.tile(0, kw_of(j * kTq), j * kTq, tq); }, s_ps[ring(i, kS)], kTq,
            kKb, Engine::vector);
        return;
      }
      for (std::int64_t c0 = 0; c0 < st.kb; c0 += kTq) {
        const int kw = kw_of(c0);
        b.dma_transpose(pt.tile(0, kw, c0, tq), p.tile(0, tq, c0, kw));
      }
    };
    // Stage C: O = alpha O + P V; at the unit's last block O / l, lse, stores.
    auto stage_c = [&](int i) {
      const Step& st = steps[static_cast<std::size_t>(i)];
      const Unit& x = mine[st.u];
      const int tq = static_cast<int>(x.tq);
      const std::size_t us = st.u % kU;
      const Tensor ops = o_ps[ring(i, kO)].tile(0, tq, 0, D);
      const Tensor& pt = pt_sb[ring(i, kP)];
      const Tensor& vv = vt[kvset[st.u]];
      for (std::int64_t c0 = 0; c0 < st.kb; c0 += kTq) {
        const int kw = static_cast<int>(std::min(kTq, st.kb - c0));
        b.matmul(ops, pt.tile(0, kw, c0, tq), vv.tile(0, kw, (st.k0 + c0) / kTq * D, D), c0 > 0);
      }
      const Tensor oa = oacc[us].tile(0, tq, 0, D);
      if (st.first) {
        b.tensor_copy(oa, ops, Engine::scalar);
      } else {
        b.tensor_scalar(oa, oa, AluOp::multiply, a_c[ring(i, kCol)].tile(0, tq, 0, 1),
                        AluOp::bypass, 0.0f, nullptr, Engine::gpsimd);
        b.tensor_tensor(oa, oa, ops, AluOp::add);
      }
      if (st.last) {
        const Tensor l = l_c[us].tile(0, tq, 0, 1);
        const Tensor rl = rl_c[us].tile(0, tq, 0, 1);
        const Tensor out = o_out[us].tile(0, tq, 0, D);
        const Tensor ls = lse_c[us].tile(0, tq, 0, 1);
        b.reciprocal(rl, l);
        b.tensor_scalar(out, oa, AluOp::multiply, rl, AluOp::bypass, 0.0f, nullptr, Engine::gpsimd);
        b.dma_copy(hbm_view(o, orow.at(x.bi * Hq + x.h, x.q0), tq, orow.stride(), {{1, D}}), out,
                   -1, false, Engine::gpsimd);
        // lse = m + ln(l), in the scaled domain the backward recomputes P in.
        b.activation(ls, ActFunc::log, l);
        b.tensor_tensor(ls, ls, m_c[ring(i, kCol)].tile(0, tq, 0, 1), AluOp::add, Engine::gpsimd);
        b.dma_copy(hbm_view(lse, (x.bi * Hq + x.h) * Sq + x.q0, tq, 1, {{1, 1}}), ls, -1, false,
                   Engine::gpsimd);
      }
    };
    // The pipeline runs over the steps of one kv head (a segment) and drains
    // at its end, so the next kv head's K and V (prefetched into the other
    // set when the segment starts) never overwrite a set still in use.
    std::vector<int> seg{0};
    for (int i = 1; i < n; ++i)
      if (mine[steps[static_cast<std::size_t>(i)].u].kv !=
          mine[steps[static_cast<std::size_t>(i - 1)].u].kv)
        seg.push_back(i);
    seg.push_back(n);
    for (std::size_t sg = 0; sg + 1 < seg.size(); ++sg) {
      const int s0 = seg[sg], s1 = seg[sg + 1];
      if (sg == 0) load_kv(steps[0].u);
      if (s1 < n) load_kv(steps[static_cast<std::size_t>(s1)].u);
      // The softmax scale folded into this kv head's K^T once (rounded to
      // the dtype, like NKI's scaling of Q), so the exp needs no scale. Its
      // K^T was prefetched during the previous segment.
      const Tensor& kts = kT[kvset[steps[static_cast<std::size_t>(s0)].u]];
      for (std::int64_t k0 = 0; k0 < Sk; k0 += kStep) {
        const Tensor c = kts.tile(0, static_cast<int>(D), k0, std::min(kStep, Sk - k0));
        b.tensor_scalar(c, c, AluOp::multiply, scale, AluOp::bypass, 0.0f, Engine::gpsimd);
      }
      for (int i = s0 - kLeadQ; i < s1; ++i) {
        if (i + kLeadQ >= s0 && i + kLeadQ < s1) stage_q(i + kLeadQ);
        if (i + kLeadA >= s0 && i + kLeadA < s1) stage_a(i + kLeadA);
        if (i + kLeadB + 2 >= s0 && i + kLeadB + 2 < s1) stage_b1(i + kLeadB + 2);
        if (i + kLeadB + 1 >= s0 && i + kLeadB + 1 < s1) stage_b2(i + kLeadB + 1);
        if (i + kLeadB >= s0 && i + kLeadB < s1) stage_b3(i + kLeadB);
        if (i >= s0) stage_c(i);
      }
    }
  }
  return b.finish();
}

}  // namespace tern::kernel
