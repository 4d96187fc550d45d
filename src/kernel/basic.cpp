// Small utility kernels: elementwise add, transpose.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kernel/builder.h"
#include "kernel/detail.h"
#include "kernel/kernels.h"
#include "util/error.h"

namespace tern::kernel {

using isa::DType;
using isa::Engine;
using namespace detail;

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
                              DType dt, std::int64_t batch, int cores,
                              const StridedSource* source) {
  if (rows < 1 || cols < 1 || batch < 1)
    throw Error(fmt::format("transpose: shape {} x [{}, {}] must be >= 1", batch, rows, cols));
  if (cores < 1 || cores > chip.cores)
    throw Error(fmt::format("transpose: cores must be 1..{}, got {}", chip.cores, cores));
  if (dt != DType::fp32 && dt != DType::bf16 && dt != DType::fp16) {
    throw NotSupported(fmt::format("transpose of {} (fp32, bf16, fp16 are)", isa::name(dt)));
  }
  if (source) {  // every matrix's last element inside the source
    const StridedSource& v = *source;
    const std::int64_t m = batch - 1;
    const std::int64_t last = v.offset + (m / v.inner) * v.outer_stride +
                              (m % v.inner) * v.inner_stride + (rows - 1) * v.row_stride + cols;
    if (v.inner < 1 || v.row_stride < cols || v.offset < 0 || last > v.elements)
      throw Error(
          fmt::format("transpose: the strided source ({} elements, offset {}, row stride "
                      "{}) does not hold {} x [{}, {}]",
                      v.elements, v.offset, v.row_stride, batch, rows, cols));
  }
  Builder b(chip, cores);
  const Tensor in = source ? b.hbm("in", {1, source->elements}, dt, isa::TensorKind::input)
                           : b.hbm("in", {batch * rows, cols}, dt, isa::TensorKind::input);
  // Rows [r0, r0 + tr) and columns [c0, c0 + tc) of matrix m.
  auto block = [&](std::int64_t m, std::int64_t r0, int tr, std::int64_t c0, int tc) {
    if (!source) return in.tile(static_cast<int>(m * rows + r0), tr, c0, tc);
    const StridedSource& v = *source;
    Tensor t = in;
    t.ap.offset += (v.offset + (m / v.inner) * v.outer_stride + (m % v.inner) * v.inner_stride +
                    r0 * v.row_stride + c0) *
                   isa::size_bytes(dt);
    t.ap.dims = {{v.row_stride, tr}, {1, tc}};
    t.ap.partitions = tr;
    return t;
  };
  const Tensor out = b.hbm("out", {batch * cols, rows}, dt, isa::TensorKind::output);
  const std::int64_t T = std::min<std::int64_t>(chip.tensor.rows, chip.tensor.cols);
  for (int core = 0; core < cores; ++core) {
    b.set_core(core);
    Tensor src[2] = {b.sbuf(static_cast<int>(T), T, dt), b.sbuf(static_cast<int>(T), T, dt)};
    Tensor dst[2] = {b.sbuf(static_cast<int>(T), T, dt), b.sbuf(static_cast<int>(T), T, dt)};
    Tensor ps[2] = {b.psum(static_cast<int>(T), T, DType::fp32),
                    b.psum(static_cast<int>(T), T, DType::fp32)};
    int i = 0;
    for (std::int64_t m = core; m < batch; m += cores)
      for (std::int64_t r0 = 0; r0 < rows; r0 += T) {
        const int tr = static_cast<int>(std::min(T, rows - r0));
        for (std::int64_t c0 = 0; c0 < cols; c0 += T, i ^= 1) {
          const int tc = static_cast<int>(std::min(T, cols - c0));
          b.dma_copy(src[i].tile(0, tr, 0, tc), block(m, r0, tr, c0, tc));
          b.transpose(ps[i].tile(0, tc, 0, tr), src[i].tile(0, tr, 0, tc));
          b.tensor_copy(dst[i].tile(0, tc, 0, tr), ps[i].tile(0, tc, 0, tr));
          b.dma_copy(out.tile(static_cast<int>(m * cols + c0), tc, r0, tr),
                     dst[i].tile(0, tc, 0, tr));
        }
      }
  }
  return b.finish();
}

}  // namespace tern::kernel
