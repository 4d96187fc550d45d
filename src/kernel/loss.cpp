// The mean over valid tokens around the fused cross-entropy kernel: the
// scale of the gradient before it, the mean loss after it (kernels.h).
#include <algorithm>

#include <fmt/format.h>

#include "kernel/builder.h"
#include "kernel/detail.h"
#include "kernel/kernels.h"
#include "util/error.h"

namespace tern::kernel {

using isa::AluOp;
using isa::DType;
using isa::Engine;

namespace {

// acc [P, 1] = the sum over row tiles of f(column tile) (f writes into its
// argument's tile); returns the [1, 1] total (partition order).
template <typename F>
Tensor column_total(Builder& b, const arch::ChipSpec& chip, std::int64_t rows, const Tensor& src,
                    DType load_dtype, F f) {
  const int P = chip.sbuf_partitions, pp = static_cast<int>(std::min<std::int64_t>(P, rows));
  const Tensor acc = b.sbuf(pp, 1, DType::fp32), col = b.sbuf(pp, 1, load_dtype);
  const Tensor v = b.sbuf(pp, 1, DType::fp32);
  b.memset(acc, 0.0f);
  for (std::int64_t r0 = 0; r0 < rows; r0 += P) {
    const int n = static_cast<int>(std::min<std::int64_t>(P, rows - r0));
    b.dma_copy(col.tile(0, n, 0, 1), src.tile(static_cast<int>(r0), n, 0, 1));
    f(v.tile(0, n, 0, 1), col.tile(0, n, 0, 1));
    b.tensor_tensor(acc.tile(0, n, 0, 1), acc.tile(0, n, 0, 1), v.tile(0, n, 0, 1), AluOp::add);
  }
  const Tensor total = b.sbuf(1, 1, DType::fp32);
  b.partition_reduce(total, acc, AluOp::add);
  return total;
}

void check(const char* name, std::int64_t rows) {
  if (rows < 1) throw Error(fmt::format("{}: rows must be >= 1, got {}", name, rows));
  if (rows >= (std::int64_t{1} << 24))
    throw NotSupported(
        fmt::format("{} with {} rows: the count is FP32, exact below 2^24", name, rows));
}

}  // namespace

isa::Program cross_entropy_scale_kernel(const arch::ChipSpec& chip, std::int64_t rows) {
  check("cross_entropy_scale", rows);
  Builder b(chip, 1);
  const Tensor targets = b.hbm("targets", {rows, 1}, DType::int32, isa::TensorKind::input);
  const Tensor dloss = b.hbm("dloss", {1, 1}, DType::fp32, isa::TensorKind::input);
  const Tensor gs = b.hbm("grad_scale", {1, 1}, DType::fp32, isa::TensorKind::output);
  const Tensor inv = b.hbm("inv_valid", {1, 1}, DType::fp32, isa::TensorKind::output);
  const Tensor valid = column_total(
      b, chip, rows, targets, DType::int32,
      [&](const Tensor& v, const Tensor& t) { b.tensor_scalar(v, t, AluOp::is_ge, 0.0f); });
  const Tensor iv = b.sbuf(1, 1, DType::fp32), d = b.sbuf(1, 1, DType::fp32),
               g = b.sbuf(1, 1, DType::fp32);
  b.reciprocal(iv, valid);
  // The gradient scale uses 1 / max(valid, 1): with every token ignored it
  // stays finite (their rows get 0, as PyTorch's), while the mean loss
  // reads 1 / valid = inf and comes out NaN, as PyTorch's.
  const Tensor v1 = b.sbuf(1, 1, DType::fp32), iv1 = b.sbuf(1, 1, DType::fp32);
  b.tensor_scalar(v1, valid, AluOp::max, 1.0f);
  b.reciprocal(iv1, v1);
  b.dma_copy(d, dloss);
  b.tensor_tensor(g, d, iv1, AluOp::multiply);
  b.dma_copy(gs, g);
  b.dma_copy(inv, iv);
  return b.finish();
}

isa::Program cross_entropy_mean_kernel(const arch::ChipSpec& chip, std::int64_t rows) {
  check("cross_entropy_mean", rows);
  Builder b(chip, 1);
  const Tensor loss = b.hbm("loss", {rows, 1}, DType::fp32, isa::TensorKind::input);
  const Tensor inv = b.hbm("inv_valid", {1, 1}, DType::fp32, isa::TensorKind::input);
  const Tensor mean = b.hbm("mean", {1, 1}, DType::fp32, isa::TensorKind::output);
  const Tensor total = column_total(b, chip, rows, loss, DType::fp32,
                                    [&](const Tensor& v, const Tensor& l) { b.tensor_copy(v, l); });
  const Tensor iv = b.sbuf(1, 1, DType::fp32), m = b.sbuf(1, 1, DType::fp32);
  b.dma_copy(iv, inv);
  b.tensor_tensor(m, total, iv, AluOp::multiply);
  b.dma_copy(mean, m);
  return b.finish();
}

}  // namespace tern::kernel
