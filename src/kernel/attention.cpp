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

float AttentionSpec::softmax_scale() const {
  return scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

namespace detail::attn {

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

Tensor hbm_view(const Tensor& t, std::int64_t offset, int rows, std::int64_t row_stride,
                std::vector<isa::Dim> free) {
  Tensor v = t;
  v.ap.offset += offset * isa::size_bytes(t.dtype());
  v.ap.dims = {{row_stride, rows}};
  v.ap.dims.insert(v.ap.dims.end(), free.begin(), free.end());
  v.ap.partitions = rows;
  return v;
}

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

}  // namespace detail::attn

}  // namespace tern::kernel
