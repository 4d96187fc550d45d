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

// The fp32 scratch and staging tiles one output slot needs for the epilogue.
struct EvacTiles {
  Tensor t32, residual;
};

// Applies the epilogue to tile `src` ([tm, tn], PSUM or SBUF) and writes the
// result, cast, into `o`; returns the engine of the last step (it triggers
// the store). `bias` is the broadcast [tm, tn] bias view, `residual_hbm` the
// residual tile in HBM; without an epilogue `plain` copies.
isa::Engine evacuate(Builder& b, const Epilogue& e, const Tensor& src, const Tensor& o,
                     const EvacTiles& tiles, const Tensor* bias, const Tensor* residual_hbm,
                     isa::Engine plain);

// The HBM inputs the epilogue reads: "bias" [1, N] and "residual" [M, N]
// (fp32), declared only when used.
std::pair<Tensor, Tensor> epilogue_inputs(Builder& b, const Epilogue& e, std::int64_t m,
                                          std::int64_t n);

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
std::int64_t epilogue_sbuf_bytes(const Epilogue& e, std::int64_t tn);

// The [rows, n] HBM bias row seen by every partition (row stride 0).
Tensor bias_rows(const Tensor& bias, int rows, std::int64_t n0, std::int64_t n);

}  // namespace tern::kernel::detail

namespace tern::kernel::detail {

// SBUF bytes per partition a row-wise kernel may plan for (a quarter stays
// free for the compiler's and runtime's own tiles).
inline std::int64_t sbuf_budget(const arch::ChipSpec& chip) {
  return chip.sbuf_partition_bytes.value() * 3 / 4;
}

// The checks of a row-wise kernel over [rows, dim] tensors of `dt` (fp32,
// bf16 or fp16) spread over `cores`; throws naming the kernel.
void check_rows(const char* name, std::int64_t rows, std::int64_t dim, isa::DType dt, int cores);

// Throws "not supported" when `need` bytes per partition exceed the budget.
void check_sbuf(const arch::ChipSpec& chip, const char* name, std::int64_t dim, isa::DType dt,
                std::int64_t need);

}  // namespace tern::kernel::detail
