// The tiles and transfers the attention kernels share: their geometry,
// argument checks, transposes and row-tile loads and stores (private to
// src/kernel; the kernels are declared in kernel/kernels.h).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "kernel/builder.h"
#include "kernel/kernels.h"

namespace tern::kernel::detail::attn {

// Added to masked scores through an identity matmul: exp(s + kMaskNeg - m)
// is exactly 0 in FP32. -2^60 is exact in BF16; FP16 tops out at 65504, so
// the FP16 mask is -2^15 (exp(-32768) is 0 as well).
inline float mask_value(isa::DType dt) {
  return dt == isa::DType::fp16 ? -32768.0f : -1.152921504606846976e18f;  // -2^60
}

constexpr std::int64_t kTq = 128;  // queries per tile (output partitions)
constexpr std::int64_t kKb = 512;  // keys per matmul (one PSUM bank of FP32)
// Keys per forward step: two banks of scores share one max, one rescale of
// O and one O update, halving those per-step costs (Vector / Scalar bound).
constexpr std::int64_t kStep = 2 * kKb;

void check_attention(const arch::ChipSpec& chip, const AttentionSpec& s, const char* what);

// Transposes of 4-byte data (fp32; the DMA transpose moves 2-byte types
// only) on the Tensor engine (NKI's nc_transpose: exact, into PSUM): chunk
// j of n, src(j) [p, f] -> dst(j) [f, p] (SBUF). The transposes fill `ps`
// (PSUM FP32 columns, starting on a bank) side by side `pitch` columns
// apart; then `engine` copies them out, one instruction per run of equally
// shaped, evenly spaced chunks within a bank.
void pe_transposes(Builder& b, int n, const std::function<Tensor(int)>& src,
                   const std::function<Tensor(int)>& dst, const Tensor& ps, std::int64_t pitch,
                   std::int64_t bank_cols, isa::Engine engine);

// An HBM view with `rows` partitions (row stride `row_stride` elements)
// starting `offset` elements into `t`, and the given free dims.
Tensor hbm_view(const Tensor& t, std::int64_t offset, int rows, std::int64_t row_stride,
                std::vector<isa::Dim> free);

// Loads n rows of `d` elements, the first at element `offset` of the HBM
// tensor `src` and each `stride` elements after the one before, into the
// SBUF tile `dst` [128, ceil(n / 128) * d] (row 128 t + p in partition p,
// columns [t d, (t + 1) d); whole tiles in one transfer).
void load_row_tiles_at(Builder& b, const Tensor& dst, const Tensor& src, std::int64_t offset,
                       std::int64_t stride, std::int64_t n, std::int64_t d);

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

// Loads rows [r0, r0 + n) of the row-major [*, D] HBM tensor `src` into the
// SBUF tile `dst` [128, ceil(n / 128) * D] so that row r0 + 128 t + p lands in
// partition p, columns [t D, (t + 1) D) (whole tiles in one transfer).
inline void load_row_tiles(Builder& b, const Tensor& dst, const Tensor& src, std::int64_t r0,
                           std::int64_t n, std::int64_t d) {
  load_row_tiles_at(b, dst, src, r0 * d, d, n, d);
}

// The reverse of load_row_tiles_at: the SBUF tile `src` [128, ceil(n / 128)
// * d] (row 128 t + p in partition p, columns [t d, (t + 1) d)) to n rows of
// the HBM tensor `dst` from element `offset`, `stride` elements apart.
void store_row_tiles_at(Builder& b, const Tensor& dst, std::int64_t offset, std::int64_t stride,
                        const Tensor& src, std::int64_t n, std::int64_t d);

// Splits weighted units into `parts` contiguous ranges of about equal weight
// (contiguous keeps the units of one kv head together); returns the
// boundaries (parts + 1 entries).
std::vector<std::size_t> balance(const std::vector<double>& w, int parts);

// Identity (for the mask matmul) and the causal mask tile (0 where key c <=
// query p, the mask value elsewhere), both [128, 128] of the kernel dtype.
std::pair<Tensor, Tensor> mask_tiles(Builder& b, isa::DType dt);

}  // namespace tern::kernel::detail::attn
