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
  // Work in super tiles of 512 x 512 (4 x 4 Tensor-engine blocks of 128):
  // four loads with 512-column rows, sixteen transposes into four PSUM
  // banks, four stores with 512-column rows. Narrow 128-column transfers
  // would spend most of their time on the per-row DMA overhead
  // (hardware.md: efficient from 2 KiB per partition). Super tiles
  // (matrix, row band, column band) are dealt round-robin over the cores,
  // so one big matrix uses every core too.
  const std::int64_t T = std::min<std::int64_t>(chip.tensor.rows, chip.tensor.cols);
  const std::int64_t S = std::min<std::int64_t>(4 * T, output_tile_columns(chip));
  const std::int64_t B = S / T;  // blocks per super tile side
  struct Unit {
    std::int64_t m, r0, c0;
  };
  std::vector<Unit> units;
  for (std::int64_t m = 0; m < batch; ++m)
    for (std::int64_t r0 = 0; r0 < rows; r0 += S)
      for (std::int64_t c0 = 0; c0 < cols; c0 += S) units.push_back({m, r0, c0});
  constexpr int kSets = 3, kPsum = 4;
  for (int core = 0; core < cores; ++core) {
    b.set_core(core);
    std::vector<Tensor> src[kSets], dst[kSets], ps;
    for (int k = 0; k < kSets; ++k)
      for (std::int64_t i = 0; i < B; ++i) {
        src[k].push_back(b.sbuf(static_cast<int>(T), S, dt));
        dst[k].push_back(b.sbuf(static_cast<int>(T), S, dt));
      }
    for (int k = 0; k < kPsum; ++k) ps.push_back(b.psum(static_cast<int>(T), S, DType::fp32));
    int set = 0, pi = 0, ei = 0;
    for (std::size_t u = static_cast<std::size_t>(core); u < units.size();
         u += static_cast<std::size_t>(cores), set = (set + 1) % kSets) {
      const auto [m, r0, c0] = units[u];
      const std::int64_t nr = std::min(S, rows - r0), nc = std::min(S, cols - c0);
      for (std::int64_t i = 0; i * T < nr; ++i) {
        const int tr = static_cast<int>(std::min(T, nr - i * T));
        b.dma_copy(src[set][static_cast<std::size_t>(i)].tile(0, tr, 0, nc),
                   block(m, r0 + i * T, tr, c0, static_cast<int>(nc)));
      }
      for (std::int64_t j = 0; j * T < nc; ++j, pi = (pi + 1) % kPsum) {
        const int tc = static_cast<int>(std::min(T, nc - j * T));
        const Tensor& p = ps[static_cast<std::size_t>(pi)];
        for (std::int64_t i = 0; i * T < nr; ++i) {
          const int tr = static_cast<int>(std::min(T, nr - i * T));
          b.transpose(p.tile(0, tc, i * T, tr),
                      src[set][static_cast<std::size_t>(i)].tile(0, tr, j * T, tc));
        }
        // PSUM -> SBUF on the Vector and Scalar engines in turn; the store
        // follows the copy.
        const Engine e = ei++ % 2 == 0 ? Engine::vector : Engine::scalar;
        const Tensor d = dst[set][static_cast<std::size_t>(j)].tile(0, tc, 0, nr);
        b.tensor_copy(d, p.tile(0, tc, 0, nr), e);
        b.dma_copy(out.tile(static_cast<int>(m * cols + c0 + j * T), tc, r0, nr), d, -1, false, e);
      }
    }
  }
  return b.finish();
}

}  // namespace tern::kernel
