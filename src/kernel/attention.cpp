// Attention kernels: FlashAttention-2 forward and backward, and RoPE.
//
// Forward (Dao, "FlashAttention-2", 2023, Algorithm 1), per 128-query tile:
// for each step of up to 1024 keys (two PSUM banks of FP32 scores),
//   S = Q (scale K)^T                   Tensor: stationary Q^T [D, 128], moving K'^T [D, 512] x 2
//   m' = max(m, rowmax(S))              Scalar BF16 copy, Vector tensor_reduce, GpSimd max
//   P = exp(S - m'), r = rowsum(P)      Vector exponential (v4; Scalar activation before)
//   alpha = exp(m - m')                 Scalar
//   l = alpha l + r                     GpSimd
//   P^T                                 DMA transposes (SBUF -> SBUF, 128 x 128)
//   O = alpha O + P V                   Tensor (stationary P^T, moving V), GpSimd, Vector
// then O / l and lse = m + ln l. The stages of consecutive steps are
// software-pipelined (the scores of step i + 6, the copy of i + 6, the max of
// i + 5 and the exp of i + 4 are issued before the P V of step i), so the
// engines overlap; docs/kernels.md has the measured figures and limits.
//
// Backward (Algorithm 2 of the same paper, with P recomputed from lse), per
// kv head (all query heads of its GQA group on one core), per 512-key block,
// per 128-query tile:
//   S = (scale Q) K^T, dP = dO V^T      Tensor
//   P = exp(S - lse)                    Vector exponential
//   dS = P * (dP - Dsum)                Scalar (dP - Dsum), GpSimd (product)
//   dV^T += dO^T P, dK^T += (scale Q)^T dS   Tensor, accumulated in PSUM over the queries
//   dQ^T += K^T dS^T                    DMA transposes of dS, Tensor, Vector accumulates
// with Dsum = rowsum(dO * O) computed once per query head.
//
// FP32 data: the DMA transpose moves 2-byte types only, so each transpose
// above (P^T, dS^T, and the backward's K, V^T, Q', dO^T and transposed
// stores) runs on the Tensor engine into PSUM instead (pe_transposes), the
// Vector engine copying it out; the matmuls then run at the FP32 rate.
#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>
#include <vector>

#include <fmt/format.h>

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

float AttentionSpec::softmax_scale() const {
  return scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

namespace {

// Added to masked scores through an identity matmul: exp(s + kMaskNeg - m)
// is exactly 0 in FP32. -2^60 is exact in BF16; FP16 tops out at 65504, so
// the FP16 mask is -2^15 (exp(-32768) is 0 as well).
float mask_value(DType dt) {
  return dt == DType::fp16 ? -32768.0f : -1.152921504606846976e18f;  // -2^60
}

constexpr std::int64_t kTq = 128;  // queries per tile (output partitions)
constexpr std::int64_t kKb = 512;  // keys per matmul (one PSUM bank of FP32)
// Keys per forward step: two banks of scores share one max, one rescale of
// O and one O update, halving those per-step costs (Vector / Scalar bound).
constexpr std::int64_t kStep = 2 * kKb;

void check_attention(const arch::ChipSpec& chip, const AttentionSpec& s, const char* what) {
  auto bad = [&](const std::string& m) { throw Error(fmt::format("{}: {}", what, m)); };
  // The tiling below is written for the NeuronCore geometry of trn1-3.
  if (chip.tensor.stationary_fmax != kTq || chip.sbuf_partitions != kTq ||
      std::min<std::int64_t>(chip.tensor.moving_fmax, chip.psum_bank_bytes().value() / 4) != kKb)
    throw NotSupported(
        fmt::format("{} on {}: the kernel's tiles assume 128 partitions and 512-column PSUM banks",
                    what, chip.name));
  if (s.batch < 1) bad(fmt::format("batch must be >= 1, got {}", s.batch));
  if (s.q_heads < 1) bad(fmt::format("q_heads must be >= 1, got {}", s.q_heads));
  if (s.kv_heads < 1) bad(fmt::format("kv_heads must be >= 1, got {}", s.kv_heads));
  if (s.q_heads % s.kv_heads != 0)
    bad(fmt::format("q_heads ({}) must be a multiple of kv_heads ({})", s.q_heads, s.kv_heads));
  if (s.seq_q < 1) bad(fmt::format("seq_q must be >= 1, got {}", s.seq_q));
  if (s.seq_k < 0) bad(fmt::format("seq_k must be >= 1 (0: equal to seq_q), got {}", s.seq_k));
  if (s.cores < 1 || s.cores > chip.cores)
    bad(fmt::format("cores must be in 1..{} on {}, got {}", chip.cores, chip.name, s.cores));
  if (!std::isfinite(s.scale)) bad(fmt::format("scale must be finite, got {}", s.scale));
  if (s.head_dim < 1) bad(fmt::format("head_dim must be >= 1, got {}", s.head_dim));
  for (const auto& [w, name] : {std::pair{s.o_width, "o_width"}, {s.do_width, "do_width"}})
    if (w != 0 && w < s.q_heads * s.head_dim)
      bad(fmt::format("{} {} is narrower than the {} heads of {} it holds (0: [B, H, S, D])", name,
                      w, s.q_heads, s.head_dim));
  if (s.head_dim != 64 && s.head_dim != 128)
    throw NotSupported(fmt::format("{} with head_dim {} (64 and 128 are)", what, s.head_dim));
  if (s.dtype != DType::bf16 && s.dtype != DType::fp16 && s.dtype != DType::fp32)
    throw NotSupported(
        fmt::format("{} with {} (bf16, fp16 and fp32 are)", what, isa::name(s.dtype)));
}

// Transposes of 4-byte data (fp32; the DMA transpose moves 2-byte types
// only) on the Tensor engine (NKI's nc_transpose: exact, into PSUM): chunk
// j of n, src(j) [p, f] -> dst(j) [f, p] (SBUF). The transposes fill `ps`
// (PSUM FP32 columns, starting on a bank) side by side `pitch` columns
// apart; then `engine` copies them out, one instruction per run of equally
// shaped, evenly spaced chunks within a bank.
void pe_transposes(Builder& b, int n, const std::function<Tensor(int)>& src,
                   const std::function<Tensor(int)>& dst, const Tensor& ps, std::int64_t pitch,
                   std::int64_t bank_cols, Engine engine) {
  const int per_fill = static_cast<int>(ps.cols() / pitch);
  const int per_bank = static_cast<int>(bank_cols / pitch);
  for (int j0 = 0; j0 < n; j0 += per_fill) {
    const int j1 = std::min(n, j0 + per_fill);
    for (int j = j0; j < j1; ++j) {
      const Tensor s = src(j);
      b.transpose(ps.tile(0, static_cast<int>(s.cols()), (j - j0) * pitch, s.rows()), s);
    }
    for (int j = j0; j < j1;) {
      const Tensor d = dst(j);
      const int bank = (j - j0) / per_bank;
      std::int64_t step = 0;  // bytes from one chunk's destination to the next
      int e = j + 1;
      for (; e < j1 && (e - j0) / per_bank == bank; ++e) {
        const Tensor x = dst(e);
        const std::int64_t gap = x.ap.offset - dst(e - 1).ap.offset;
        if (x.rows() != d.rows() || x.cols() != d.cols() ||
            x.ap.start_partition != d.ap.start_partition || gap <= 0 || (e > j + 1 && gap != step))
          break;
        step = gap;
      }
      const Tensor p = ps.tile(0, d.rows(), (j - j0) * pitch, d.cols());
      if (e == j + 1) {
        b.tensor_copy(d, p, engine);
      } else {
        const std::int64_t cnt = e - j, esz = isa::size_bytes(d.dtype());
        b.tensor_copy(d.with_dims({{step / esz, cnt}, {1, d.cols()}}),
                      p.with_dims({{pitch, cnt}, {1, d.cols()}}), engine);
      }
      j = e;
    }
  }
}

// An HBM view with `rows` partitions (row stride `row_stride` elements)
// starting `offset` elements into `t`, and the given free dims.
Tensor hbm_view(const Tensor& t, std::int64_t offset, int rows, std::int64_t row_stride,
                std::vector<isa::Dim> free) {
  Tensor v = t;
  v.ap.offset += offset * isa::size_bytes(t.dtype());
  v.ap.dims = {{row_stride, rows}};
  v.ap.dims.insert(v.ap.dims.end(), free.begin(), free.end());
  v.ap.partitions = rows;
  return v;
}

// Loads rows [r0, r0 + n) of the row-major [*, D] HBM tensor `src` into the
// SBUF tile `dst` [128, ceil(n / 128) * D] so that row r0 + 128 t + p lands in
// partition p, columns [t D, (t + 1) D) (whole tiles in one transfer).
// Loads n rows of `d` elements, the first at element `offset` of the HBM
// tensor `src` and each `stride` elements after the one before, into the
// SBUF tile `dst` [128, ceil(n / 128) * d] (row 128 t + p in partition p,
// columns [t d, (t + 1) d); whole tiles in one transfer).
void load_row_tiles_at(Builder& b, const Tensor& dst, const Tensor& src, std::int64_t offset,
                       std::int64_t stride, std::int64_t n, std::int64_t d) {
  const std::int64_t full = n / kTq, rest = n % kTq;
  if (full > 0)
    b.dma_copy(
        dst.tile(0, static_cast<int>(kTq), 0, full * d),
        hbm_view(src, offset, static_cast<int>(kTq), stride, {{kTq * stride, full}, {1, d}}));
  if (rest > 0)
    b.dma_copy(
        dst.tile(0, static_cast<int>(rest), full * d, d),
        hbm_view(src, offset + full * kTq * stride, static_cast<int>(rest), stride, {{1, d}}));
}

// Where row r of head `head` (b * heads + h) of o or dO starts: [B, H, S, D]
// packed (width 0) or [B, S, width] with head h at columns h D.
struct HeadRows {
  std::int64_t heads, seq, dim, width;
  std::int64_t at(std::int64_t head, std::int64_t r) const {
    return width ? ((head / heads) * seq + r) * width + (head % heads) * dim
                 : (head * seq + r) * dim;
  }
  std::int64_t stride() const { return width ? width : dim; }
};

void load_row_tiles(Builder& b, const Tensor& dst, const Tensor& src, std::int64_t r0,
                    std::int64_t n, std::int64_t d) {
  load_row_tiles_at(b, dst, src, r0 * d, d, n, d);
}

// The reverse of load_row_tiles_at: the SBUF tile `src` [128, ceil(n / 128)
// * d] (row 128 t + p in partition p, columns [t d, (t + 1) d)) to n rows of
// the HBM tensor `dst` from element `offset`, `stride` elements apart.
void store_row_tiles_at(Builder& b, const Tensor& dst, std::int64_t offset, std::int64_t stride,
                        const Tensor& src, std::int64_t n, std::int64_t d) {
  const std::int64_t full = n / kTq, rest = n % kTq;
  if (full > 0)
    b.dma_copy(hbm_view(dst, offset, static_cast<int>(kTq), stride, {{kTq * stride, full}, {1, d}}),
               src.tile(0, static_cast<int>(kTq), 0, full * d), -1, false, Engine::gpsimd);
  if (rest > 0)
    b.dma_copy(
        hbm_view(dst, offset + full * kTq * stride, static_cast<int>(rest), stride, {{1, d}}),
        src.tile(0, static_cast<int>(rest), full * d, d), -1, false, Engine::gpsimd);
}

// Splits weighted units into `parts` contiguous ranges of about equal weight
// (contiguous keeps the units of one kv head together); returns the
// boundaries (parts + 1 entries).
std::vector<std::size_t> balance(const std::vector<double>& w, int parts) {
  double total = 0;
  for (double x : w) total += x;
  std::vector<std::size_t> cut(static_cast<std::size_t>(parts) + 1, w.size());
  cut[0] = 0;
  double acc = 0;
  int c = 1;
  for (std::size_t i = 0; i < w.size() && c < parts; ++i) {
    // Unit i goes to the part its midpoint falls in.
    const double mid = acc + w[i] / 2;
    while (c < parts && mid >= total * c / parts) cut[static_cast<std::size_t>(c++)] = i;
    acc += w[i];
  }
  for (int j = c; j < parts; ++j) cut[static_cast<std::size_t>(j)] = w.size();
  return cut;
}

// Identity (for the mask matmul) and the causal mask tile (0 where key c <=
// query p, the mask value elsewhere), both [128, 128] of the kernel dtype.
std::pair<Tensor, Tensor> mask_tiles(Builder& b, DType dt) {
  const Tensor ident = b.sbuf(static_cast<int>(kTq), kTq, dt);
  const Tensor mask = b.sbuf(static_cast<int>(kTq), kTq, dt);
  b.memset(ident, 1.0f, Engine::gpsimd);
  b.memset(mask, 0.0f, Engine::gpsimd);
  // affine_select keeps src where (offset + p * per_partition + i * per_element) cmp 0.
  b.affine_select(ident, ident, 0.0f, 1.0f, -1.0f, AluOp::is_equal, 0.0f);
  b.affine_select(mask, mask, 0.0f, 1.0f, -1.0f, AluOp::is_ge, mask_value(dt));
  return {ident, mask};
}

}  // namespace

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

isa::Program rope_kernel(const arch::ChipSpec& chip, const RopeSpec& s) {
  auto bad = [&](const std::string& m) { throw Error(fmt::format("rope: {}", m)); };
  if (s.batch < 1) bad(fmt::format("batch must be >= 1, got {}", s.batch));
  if (s.heads < 1) bad(fmt::format("heads must be >= 1, got {}", s.heads));
  if (s.seq < 1) bad(fmt::format("seq must be >= 1, got {}", s.seq));
  if (s.head_dim < 2 || s.head_dim % 2 != 0)
    bad(fmt::format("head_dim must be even and >= 2, got {}", s.head_dim));
  if (s.cores < 1 || s.cores > chip.cores)
    bad(fmt::format("cores must be in 1..{} on {}, got {}", chip.cores, chip.name, s.cores));
  if (s.dtype != DType::bf16 && s.dtype != DType::fp16 && s.dtype != DType::fp32)
    throw NotSupported(fmt::format("rope with {} (fp32, bf16, fp16 are)", isa::name(s.dtype)));
  const std::int64_t BH = s.batch * s.heads, S = s.seq, D = s.head_dim, H2 = D / 2;
  Builder b(chip, s.cores);
  const Tensor x = b.hbm("x", {s.batch, s.heads, S, D}, s.dtype, isa::TensorKind::input);
  const Tensor cs = b.hbm("cos", {S, H2}, DType::fp32, isa::TensorKind::input);
  const Tensor sn = b.hbm("sin", {S, H2}, DType::fp32, isa::TensorKind::input);
  const Tensor y = b.hbm("y", {s.batch, s.heads, S, D}, s.dtype, isa::TensorKind::output);
  // Units: 128 positions (partitions) x up to `nb` heads (free dim), so one
  // instruction covers nb * D / 2 elements per partition and the cos / sin
  // rows of the positions are loaded once per unit.
  const std::int64_t nb = std::max<std::int64_t>(1, std::min<std::int64_t>(BH, 2048 / D));
  struct Unit {
    std::int64_t s0, ts, h0, nh;
  };
  std::vector<Unit> units;
  for (std::int64_t s0 = 0; s0 < S; s0 += kTq)
    for (std::int64_t h0 = 0; h0 < BH; h0 += nb)
      units.push_back({s0, std::min(kTq, S - s0), h0, std::min(nb, BH - h0)});
  const std::int64_t F = nb * D;
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    constexpr int kBuf = 3;
    std::vector<Tensor> xin, yout, cos_t, sin_t, t1, t2;
    for (int i = 0; i < kBuf; ++i) {
      xin.push_back(b.sbuf(static_cast<int>(kTq), F, s.dtype));
      yout.push_back(b.sbuf(static_cast<int>(kTq), F, s.dtype));
      cos_t.push_back(b.sbuf(static_cast<int>(kTq), H2, DType::fp32));
      sin_t.push_back(b.sbuf(static_cast<int>(kTq), H2, DType::fp32));
      t1.push_back(b.sbuf(static_cast<int>(kTq), F / 2, DType::fp32));
      t2.push_back(b.sbuf(static_cast<int>(kTq), F / 2, DType::fp32));
    }
    int slot = 0;
    for (std::size_t ui = static_cast<std::size_t>(core); ui < units.size();
         ui += static_cast<std::size_t>(s.cores), slot = (slot + 1) % kBuf) {
      const Unit& u = units[ui];
      const int ts = static_cast<int>(u.ts);
      const std::size_t k = static_cast<std::size_t>(slot);
      // x rows (head h, position s) -> partition s - s0, columns [(h - h0) D, +D).
      const Tensor xv = hbm_view(x, (u.h0 * S + u.s0) * D, ts, D, {{S * D, u.nh}, {1, D}});
      const Tensor yv = hbm_view(y, (u.h0 * S + u.s0) * D, ts, D, {{S * D, u.nh}, {1, D}});
      const Tensor xs = xin[k].tile(0, ts, 0, u.nh * D);
      b.dma_copy(xs, xv);
      b.dma_copy(cos_t[k].tile(0, ts, 0, H2), cs.tile(static_cast<int>(u.s0), ts, 0, H2));
      b.dma_copy(sin_t[k].tile(0, ts, 0, H2), sn.tile(static_cast<int>(u.s0), ts, 0, H2));
      // Halves of every head, and the tables broadcast over the heads (stride 0).
      auto half = [&](const Tensor& t, int which) {
        return t.tile(0, ts, 0, u.nh * D).with_dims({{D, u.nh}, {1, H2}}, which * H2);
      };
      auto table = [&](const Tensor& t) {
        return t.tile(0, ts, 0, H2).with_dims({{0, u.nh}, {1, H2}});
      };
      auto tmp = [&](const Tensor& t) {
        return t.tile(0, ts, 0, u.nh * H2).with_dims({{H2, u.nh}, {1, H2}});
      };
      const Tensor x1 = half(xs, 0), x2 = half(xs, 1);
      const Tensor c = table(cos_t[k]), sv = table(sin_t[k]);
      const Tensor a = tmp(t1[k]), bb = tmp(t2[k]);
      const Tensor y1 = half(yout[k], 0), y2 = half(yout[k], 1);
      // Forward: y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin; backward
      // (rotation by -theta): y1 = x1 cos + x2 sin, y2 = x2 cos - x1 sin.
      // Each product and the sum rounded to FP32, the sum to dtype.
      const AluOp first = s.backward ? AluOp::add : AluOp::subtract;
      const AluOp second = s.backward ? AluOp::subtract : AluOp::add;
      b.tensor_tensor(a, x1, c, AluOp::multiply, Engine::vector);
      b.tensor_tensor(bb, x2, sv, AluOp::multiply, Engine::gpsimd);
      b.tensor_tensor(y1, a, bb, first, Engine::vector);
      b.tensor_tensor(a, x2, c, AluOp::multiply, Engine::gpsimd);
      b.tensor_tensor(bb, x1, sv, AluOp::multiply, Engine::vector);
      b.tensor_tensor(y2, a, bb, second, Engine::gpsimd);
      b.dma_copy(yv, yout[k].tile(0, ts, 0, u.nh * D), -1, false, Engine::gpsimd);
    }
  }
  return b.finish();
}

}  // namespace tern::kernel
