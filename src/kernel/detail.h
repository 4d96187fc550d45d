// Internal helpers shared by the built-in kernels (not a public interface).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kernel/builder.h"
#include "kernel/kernels.h"

namespace tern::kernel::detail {

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// The fp32 scratch and staging tiles one output slot needs for the epilogue
// (amax: its [rows, 1] column).
struct EvacTiles {
  Tensor t32, residual, amax;
  Tensor mx_ps, mx_src, mx_q, mx_s;  // the mxfp8 step's transposes and QuantizeMX
};

// A tile's quantization operands: the scalar columns in SBUF [rows, 3]
// (load_qscale: qscale, then the two dequant factors) and
// the tile's [rows, 1] slice of the HBM "amax" output.
struct QuantTile {
  Tensor qscale, amax_hbm;
  Tensor mx_q_hbm, mx_s_hbm;  // the tile's [tn/4, tm] / [tn/32, tm] places in c_q / c_scale
};

// Applies the epilogue to tile `src` ([tm, tn], PSUM or SBUF) and writes the
// result, cast, into `o`; returns the engine of the last step (it triggers
// the store). `bias` is the broadcast [tm, tn] bias view, `residual_hbm` the
// residual tile in HBM; without an epilogue `plain` copies.
isa::Engine evacuate(Builder& b, const Epilogue& e, const Tensor& src, const Tensor& o,
                     const EvacTiles& tiles, const Tensor* bias, const Tensor* residual_hbm,
                     isa::Engine plain, const QuantTile* quant = nullptr);

// The HBM tensors of the epilogue, declared only when used: inputs "bias"
// [1, N], "residual" [M, N], "qscale" [1, 1] (fp32) and the output "amax"
// [M, ceil(N / tn)] fp32 for output tiles `tn` columns wide.
struct EpilogueIo {
  Tensor bias, residual, qscale, dequant_a, dequant_b, amax, mx_q, mx_s;
};
EpilogueIo epilogue_io(Builder& b, const Epilogue& e, std::int64_t m, std::int64_t n,
                       std::int64_t tn);
// The quantization operands of output tile rows [r0, r0 + tm), columns
// [n0, n0 + tn) (tiles `tile_cols` wide).
QuantTile quant_tile(const Epilogue& e, const EpilogueIo& io, const Tensor& qscale, int r0, int tm,
                     std::int64_t n0, std::int64_t tn, std::int64_t tile_cols);
// The mxfp8 step: tile o [tm <= 128, tn <= 512, tn % 128 == 0]
// MX-quantized along its columns into q.mx_q_hbm / q.mx_s_hbm, using the
// slot's mx_* tiles (see Epilogue::mxfp8).
void mx_output(Builder& b, const Tensor& o, const EvacTiles& t, const QuantTile& q);
// Allocates the mx_* tiles of `slots` (two PSUM banks shared in turn).
void alloc_mx_tiles(Builder& b, std::vector<EvacTiles>& slots, std::int64_t tm, std::int64_t tn);
// Throws "not supported" when the mxfp8 step cannot run (N % 128, chip).
void check_mxfp8(const arch::ChipSpec& chip, const Epilogue& e, std::int64_t n);
// The scalar columns broadcast to `rows` partitions: [rows, 3] = qscale,
// dequant[0], dequant[1] (those the epilogue has; an empty view without).
Tensor load_qscale(Builder& b, const Epilogue& e, const EpilogueIo& io, int rows);
// Throws "not supported" for output dtypes other than fp32, bf16 and (v3+)
// FP8 E4M3 / E5M2.
void check_output(const arch::ChipSpec& chip, const char* name, isa::DType out);
// Columns of a matmul output tile: one PSUM bank of FP32 (and the moving
// size limit).
std::int64_t output_tile_columns(const arch::ChipSpec& chip);

// A matmul's output side: PSUM tiles, output tiles and, with an epilogue,
// its FP32 scratch per output slot and two bias rows (double-buffered).
struct OutputSlots {
  static constexpr int kPsum = 4, kOut = 4;
  std::vector<Tensor> ps, outs;
  std::vector<EvacTiles> evac;
  Tensor bias[2];
};
OutputSlots output_slots(Builder& b, const Epilogue& e, isa::DType out, std::int64_t tm,
                         std::int64_t tn);

// SBUF bytes per partition output_slots adds for the epilogue.
std::int64_t epilogue_sbuf_bytes(const Epilogue& e, std::int64_t tm, std::int64_t tn);

// MX quantization on chip works on 32-partition groups of 4 values (the
// QuantizeMX rule): MX rows come in multiples of 128.
constexpr std::int64_t kMxRowMultiple = 32 * 4;

// The view of x [K, cols] that MX quantization loads for rows k0 .. k0 +
// 4 parts and columns c0 .. c0 + nc: partition p holds rows k0 + 4p + j,
// j = 0..3, each as nc contiguous columns (element j * nc + c is
// x[k0 + 4p + j, c0 + c]). Four contiguous runs per partition, so four DMA
// descriptors; the x4 order (element 4c + j) would cost one per element.
Tensor mx_source_view(const Tensor& x, std::int64_t cols, std::int64_t k0, std::int64_t c0,
                      int parts, std::int64_t nc);
// Loads rows k0 .. k0 + 4 parts, columns c0 .. c0 + nc of the [K, cols]
// operand into `staged` (a [parts, 4 nc] BF16 tile) and returns the view
// QuantizeMX reads (x4 order: element 4c + j is row k0 + 4p + j of column
// c). `x` is the operand as stored: [K, cols], loaded in mx_source_view's
// j-major layout (four descriptors a partition), or with `trans` its
// transpose [cols, K] (K contiguous, e.g. activations [tokens, features]),
// which four DMA transposes bring in, one per j (the nc rows' elements
// k0 + 4p + j onto partitions p), so no transpose pass is needed before
// quantizing along K. Both write the j-major layout (the four transposes
// write disjoint ranges, so they run in parallel).
Tensor load_mx_source(Builder& b, const Tensor& staged, const Tensor& x, bool trans,
                      std::int64_t k0, std::int64_t c0, int parts, std::int64_t nc);
// The tiles of an MX quantization of [k, cols] and the core each runs on:
// K tiles of `tkl` rows (parts = rows / 4 partitions), columns split into
// equal widths (multiples of 32, at most `width`) and, while there are
// fewer than `per_core` tiles a core, narrower, so that every core has
// work; tiles go largest first to the least-loaded core, and each core's
// list is in K-major order. Balancing the columns instead of cutting fixed
// widths keeps a [K, 768] operand from leaving half the cores idle.
struct MxTile {
  std::int64_t k0, c0, nc;
  int parts;
};
std::vector<std::vector<MxTile>> mx_tiles(std::int64_t k, std::int64_t cols, std::int64_t tkl,
                                          std::int64_t width, int cores, int per_core);
// The SBUF tile mx_source_view filled, read in the x4 order the MX matmul
// contracts over: element 4c + j of the view is value j of column c.
Tensor mx_interleaved(const Tensor& staged, std::int64_t nc);
// Copies the j-major `staged` tile ([parts, 4 nc]) into `dst` in the x4
// order (element 4c + j), on `engine`, so that QuantizeMX reads a
// contiguous source. Reading mx_interleaved's view directly strides by nc
// elements (>= 16 B) and halves the Vector engine's rate; this copy writes
// with an 8-byte stride and reads contiguously, so it runs at the full
// rate on another engine (the NKI MX matmul guide's strided tensor_copy
// into the MX layout).
void mx_interleave(Builder& b, const Tensor& dst, const Tensor& staged, std::int64_t nc,
                   isa::Engine engine);
// MX quantization x -> q, q_scale without QuantizeMX (every policy, MXFP8
// and MXFP4; mx_software.cpp), all cores of `b`.
void mx_quantize_software(Builder& b, const arch::ChipSpec& chip, const MxQuantizeSpec& s,
                          const Tensor& x, const Tensor& q, const Tensor& qs);

// Columns per tile of the elementwise-style kernels (elementwise, reduce,
// clip, cast, GLU): 4 KiB rows of BF16, where DMA reaches its efficiency
// (data/arch: saturating_bytes_per_partition). The host references chunk
// the same way.
constexpr std::int64_t kRowTileColumns = 2048;

// The [rows, n] HBM bias row seen by every partition (row stride 0).
Tensor bias_rows(const Tensor& bias, int rows, std::int64_t n0, std::int64_t n);

}  // namespace tern::kernel::detail

namespace tern::kernel::detail {

// SBUF bytes per partition a row-wise kernel may plan for (a quarter stays
// free for the compiler's and runtime's own tiles).
inline std::int64_t sbuf_budget(const arch::ChipSpec& chip) {
  return chip.sbuf_partition_bytes.value() * 3 / 4;
}

// Whether Vector instructions on `dt` data run in the chip's performance
// mode (data/arch [costs] perf_mode_dtypes). The mode takes the SBUF bus
// Vector shares with GpSimd, so a kernel keeps such work on Vector (and
// Scalar) instead of dealing tiles to GpSimd.
bool vector_fast(const arch::ChipSpec& chip, isa::DType dt);

// The checks of a row-wise kernel over [rows, dim] tensors of `dt` (fp32,
// bf16 or fp16) spread over `cores`; throws naming the kernel.
void check_rows(const char* name, std::int64_t rows, std::int64_t dim, isa::DType dt, int cores);

// Throws "not supported" when `need` bytes per partition exceed the budget.
void check_sbuf(const arch::ChipSpec& chip, const char* name, std::int64_t dim, isa::DType dt,
                std::int64_t need);

}  // namespace tern::kernel::detail
