// Elementwise arithmetic, reductions and gradient clipping by global norm.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernel/builder.h"
#include "kernel/detail.h"
#include "kernel/kernels.h"
#include "util/error.h"

namespace tern::kernel {

using isa::AluOp;
using isa::DType;
using isa::Engine;
using namespace detail;

namespace {

// Work units of a [R, C] tensor: tiles of up to 128 rows x `width` columns,
// dealt round-robin over the cores (unit u goes to core u % cores).
struct Unit {
  int r0, n;
  std::int64_t c0, w;
};
std::vector<Unit> units(std::int64_t rows, std::int64_t cols, std::int64_t partitions,
                        std::int64_t width) {
  std::vector<Unit> u;
  for (std::int64_t r0 = 0; r0 < rows; r0 += partitions)
    for (std::int64_t c0 = 0; c0 < cols; c0 += width)
      u.push_back({static_cast<int>(r0), static_cast<int>(std::min(partitions, rows - r0)), c0,
                   std::min(width, cols - c0)});
  return u;
}

constexpr std::int64_t kWidth = kRowTileColumns;
constexpr int kBufs = 4;

}  // namespace

namespace {
constexpr std::array<const char*, 12> kOpNames = {
    "add",           "sub",          "mul",  "scale",         "gelu",
    "gelu_tanh",     "silu",         "relu", "gelu_backward", "gelu_tanh_backward",
    "silu_backward", "relu_backward"};
}  // namespace

ElementwiseOp parse_elementwise_op(const std::string& s) {
  for (std::size_t i = 0; i < kOpNames.size(); ++i)
    if (s == kOpNames[i]) return static_cast<ElementwiseOp>(i);
  throw Error(fmt::format("elementwise op '{}': expected {}", s, fmt::join(kOpNames, ", ")));
}

std::string to_string(ElementwiseOp op) {
  return kOpNames[static_cast<std::size_t>(op)];
}

isa::ActFunc activation_of(ElementwiseOp op) {
  switch (op) {
    case ElementwiseOp::gelu:
    case ElementwiseOp::gelu_backward:
      return isa::ActFunc::gelu;
    case ElementwiseOp::gelu_tanh:
    case ElementwiseOp::gelu_tanh_backward:
      return isa::ActFunc::gelu_tanh;
    case ElementwiseOp::silu:
    case ElementwiseOp::silu_backward:
      return isa::ActFunc::silu;
    case ElementwiseOp::relu:
    case ElementwiseOp::relu_backward:
      return isa::ActFunc::relu;
    default:
      return isa::ActFunc::identity;
  }
}

bool is_unary(ElementwiseOp op) {
  return op == ElementwiseOp::scale || op == ElementwiseOp::gelu ||
         op == ElementwiseOp::gelu_tanh || op == ElementwiseOp::silu || op == ElementwiseOp::relu;
}

ReduceOp parse_reduce_op(const std::string& s) {
  if (s == "sum") return ReduceOp::sum;
  if (s == "max") return ReduceOp::max;
  if (s == "sumsq") return ReduceOp::sumsq;
  throw Error(fmt::format("reduce op '{}': expected sum, max or sumsq", s));
}

isa::Program elementwise_kernel(const arch::ChipSpec& chip, const ElementwiseSpec& s) {
  check_rows("elementwise", s.rows, s.cols, s.dtype, s.cores);
  const bool binary = !is_unary(s.op);
  const isa::ActFunc act = activation_of(s.op);
  const bool grad = binary && act != isa::ActFunc::identity;
  // f' on the Scalar engine's table (relu's as a comparison).
  const isa::ActFunc dact = act == isa::ActFunc::gelu        ? isa::ActFunc::gelu_dx
                            : act == isa::ActFunc::gelu_tanh ? isa::ActFunc::gelu_tanh_dx
                            : act == isa::ActFunc::silu      ? isa::ActFunc::silu_dx
                                                             : isa::ActFunc::identity;
  if (s.b_row && (!binary || grad))
    throw NotSupported(
        fmt::format("elementwise: a broadcast row operand with {}", to_string(s.op)));
  Builder b(chip, s.cores);
  const Tensor a = b.hbm("a", {s.rows, s.cols}, s.dtype, isa::TensorKind::input);
  Tensor bb;
  if (binary) bb = b.hbm("b", {s.b_row ? 1 : s.rows, s.cols}, s.dtype, isa::TensorKind::input);
  const Tensor out = b.hbm("out", {s.rows, s.cols}, s.dtype, isa::TensorKind::output);
  const std::int64_t P = chip.sbuf_partitions;
  const auto work = units(s.rows, s.cols, P, kWidth);
  const AluOp op = s.op == ElementwiseOp::add   ? AluOp::add
                   : s.op == ElementwiseOp::sub ? AluOp::subtract
                                                : AluOp::multiply;
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    Tensor ta[kBufs], tb[kBufs], td[kBufs];
    for (int i = 0; i < kBufs; ++i) {
      ta[i] = b.sbuf(static_cast<int>(P), kWidth, s.dtype);
      if (binary) tb[i] = b.sbuf(static_cast<int>(P), kWidth, s.dtype);
      if (grad) td[i] = b.sbuf(static_cast<int>(P), kWidth, DType::fp32);
    }
    int i = 0, k = 0;
    for (std::size_t u = static_cast<std::size_t>(core); u < work.size();
         u += static_cast<std::size_t>(s.cores), i = (i + 1) % kBufs, ++k) {
      const Unit& w = work[u];
      const Tensor va = ta[i].tile(0, w.n, 0, w.w);
      b.dma_copy(va, a.tile(w.r0, w.n, w.c0, w.w));
      // The result overwrites a's tile; tiles alternate between the Vector
      // and GpSimd engines (and the Scalar engine joins for `scale`), each
      // storing what it computed.
      // In the Vector performance mode (16-bit data) Vector alone is
      // faster than Vector and GpSimd sharing their bus.
      const bool fast = detail::vector_fast(chip, s.dtype);
      const Engine e = k % 2 == 0 || (fast && !grad) ? Engine::vector : Engine::gpsimd;
      if (grad) {
        // f'(x) in FP32 on the Scalar engine, then dy * f'(x), rounded once.
        const Tensor vb = tb[i].tile(0, w.n, 0, w.w), vd = td[i].tile(0, w.n, 0, w.w);
        b.dma_copy(vb, bb.tile(w.r0, w.n, w.c0, w.w));
        if (act == isa::ActFunc::relu)
          b.tensor_scalar(vd, va, AluOp::is_gt, 0.0f, AluOp::bypass, 0.0f, Engine::scalar);
        else
          b.activation(vd, dact, va);
        b.tensor_tensor(va, vd, vb, AluOp::multiply, e);
        b.dma_copy(out.tile(w.r0, w.n, w.c0, w.w), va, -1, false, e);
      } else if (binary) {
        const Tensor vb = tb[i].tile(0, w.n, 0, w.w);
        b.dma_copy(vb,
                   s.b_row ? detail::bias_rows(bb, w.n, w.c0, w.w) : bb.tile(w.r0, w.n, w.c0, w.w));
        b.tensor_tensor(va, va, vb, op, e);
        b.dma_copy(out.tile(w.r0, w.n, w.c0, w.w), va, -1, false, e);
      } else if (act != isa::ActFunc::identity) {
        b.activation(va, act, va);
        b.dma_copy(out.tile(w.r0, w.n, w.c0, w.w), va, -1, false, Engine::scalar);
      } else {
        const Engine es = k % 3 == 0   ? Engine::vector
                          : k % 3 == 1 ? (fast ? Engine::vector : Engine::gpsimd)
                                       : Engine::scalar;
        b.tensor_scalar(va, va, AluOp::multiply, s.alpha, AluOp::bypass, 0.0f, es);
        b.dma_copy(out.tile(w.r0, w.n, w.c0, w.w), va, -1, false, es);
      }
    }
  }
  return b.finish();
}

isa::Program elementwise_chain_kernel(const arch::ChipSpec& chip, const ElementwiseChainSpec& s) {
  check_rows("elementwise_chain", s.rows, s.cols, s.dtype, s.cores);
  if (s.inputs < 1 || s.steps.empty())
    throw Error("elementwise_chain: needs at least one input and one step");
  Builder b(chip, s.cores);
  std::vector<Tensor> in;
  if (!s.input_dtypes.empty() && static_cast<int>(s.input_dtypes.size()) != s.inputs)
    throw Error(fmt::format("elementwise_chain: {} input dtypes for {} inputs",
                            s.input_dtypes.size(), s.inputs));
  for (int i = 0; i < s.inputs; ++i)
    in.push_back(
        b.hbm(fmt::format("in{}", i), {s.rows, s.cols},
              s.input_dtypes.empty() ? s.dtype : s.input_dtypes[static_cast<std::size_t>(i)],
              isa::TensorKind::input));
  const Tensor out = b.hbm("out", {s.rows, s.cols}, s.out, isa::TensorKind::output);
  for (const ChainStep& st : s.steps)
    if (!is_unary(st.op) && (st.operand < 0 || st.operand >= s.inputs))
      throw Error(fmt::format("elementwise_chain: step {} reads input {} of {}", to_string(st.op),
                              st.operand, s.inputs));
  const std::int64_t P = chip.sbuf_partitions, W = kWidth / 2;  // FP32 tiles
  const auto work = units(s.rows, s.cols, P, W);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    constexpr int kB = 2;
    Tensor acc[kB], opnd[kB], tmp[kB], res[kB];
    for (int i = 0; i < kB; ++i) {
      acc[i] = b.sbuf(static_cast<int>(P), W, DType::fp32);
      opnd[i] = b.sbuf(static_cast<int>(P), W, DType::fp32);  // any input dtype, by DMA
      tmp[i] = b.sbuf(static_cast<int>(P), W, DType::fp32);
      res[i] = b.sbuf(static_cast<int>(P), W, s.out);
    }
    int i = 0;
    for (std::size_t u = static_cast<std::size_t>(core); u < work.size();
         u += static_cast<std::size_t>(s.cores), i = (i + 1) % kB) {
      const Unit& w = work[u];
      const Tensor a = acc[i].tile(0, w.n, 0, w.w), o = opnd[i].tile(0, w.n, 0, w.w);
      const Tensor t = tmp[i].tile(0, w.n, 0, w.w);
      b.dma_copy(a, in[0].tile(w.r0, w.n, w.c0, w.w));  // DMA casts to FP32
      for (const ChainStep& st : s.steps) {
        const isa::ActFunc f = activation_of(st.op);
        if (!is_unary(st.op))
          b.dma_copy(o, in[static_cast<std::size_t>(st.operand)].tile(w.r0, w.n, w.c0, w.w));
        switch (st.op) {
          case ElementwiseOp::add:
          case ElementwiseOp::sub:
          case ElementwiseOp::mul:
            b.tensor_tensor(a, a, o,
                            st.op == ElementwiseOp::add   ? AluOp::add
                            : st.op == ElementwiseOp::sub ? AluOp::subtract
                                                          : AluOp::multiply);
            break;
          case ElementwiseOp::scale:
            b.tensor_scalar(a, a, AluOp::multiply, st.alpha, AluOp::bypass, 0.0f, Engine::gpsimd);
            break;
          case ElementwiseOp::gelu:
          case ElementwiseOp::gelu_tanh:
          case ElementwiseOp::silu:
          case ElementwiseOp::relu:
            b.activation(a, f, a);
            break;
          default: {  // backward: running value is dy, the operand x
            if (f == isa::ActFunc::relu)
              b.tensor_scalar(t, o, AluOp::is_gt, 0.0f, AluOp::bypass, 0.0f, Engine::scalar);
            else
              b.activation(t,
                           f == isa::ActFunc::gelu        ? isa::ActFunc::gelu_dx
                           : f == isa::ActFunc::gelu_tanh ? isa::ActFunc::gelu_tanh_dx
                                                          : isa::ActFunc::silu_dx,
                           o);
            b.tensor_tensor(a, a, t, AluOp::multiply);
            break;
          }
        }
      }
      const Tensor r = res[i].tile(0, w.n, 0, w.w);
      b.tensor_copy(r, a, Engine::scalar);
      b.dma_copy(out.tile(w.r0, w.n, w.c0, w.w), r, -1, false, Engine::scalar);
    }
  }
  return b.finish();
}

isa::Program reduce_kernel(const arch::ChipSpec& chip, const ReduceSpec& s) {
  check_rows("reduce", s.rows, s.cols, s.dtype, s.cores);
  Builder b(chip, s.cores);
  const Tensor x = b.hbm("x", {s.rows, s.cols}, s.dtype, isa::TensorKind::input);
  const std::int64_t P = chip.sbuf_partitions;
  const Tensor out = s.all ? b.hbm("out", {s.cores, 1}, DType::fp32, isa::TensorKind::output)
                           : b.hbm("out", {s.rows, 1}, DType::fp32, isa::TensorKind::output);
  // Whole rows per tile (the row result is one column); columns in chunks.
  const std::int64_t width = std::min(s.cols, kWidth);
  const std::int64_t row_tiles = ceil_div(s.rows, P), chunks = ceil_div(s.cols, width);
  const AluOp combine = s.op == ReduceOp::max ? AluOp::max : AluOp::add;
  const int pp = static_cast<int>(std::min(P, s.rows));
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    // Loads run up to 8 chunks ahead (the DMA's fixed latency is long next
    // to a chunk's compute); the squares need only a few.
    constexpr int kLoads = 8;
    Tensor tx[kLoads], sq[kBufs], parts[2], rowv[2];
    for (auto& t : tx) t = b.sbuf(static_cast<int>(P), width, s.dtype);
    for (auto& t : sq) t = b.sbuf(static_cast<int>(P), width, DType::fp32);  // squares
    for (auto& t : parts) t = b.sbuf(static_cast<int>(P), chunks, DType::fp32);
    for (auto& t : rowv) t = b.sbuf(static_cast<int>(P), 1, DType::fp32);
    Tensor acc;
    if (s.all) {
      acc = b.sbuf(pp, 1, DType::fp32);
      b.memset(acc, s.op == ReduceOp::max ? -INFINITY : 0.0f);
    }
    // A row tile's result: its chunk partials (columns of `parts`) combined
    // in order by one Vector reduce, then stored or added to the core's
    // accumulator. Issued one row tile late, so the engines never wait in
    // order for the chunks of the tile they are finishing.
    auto finish = [&](int r0, int n, int j) {
      const Tensor pr = parts[j].tile(0, n, 0, chunks);
      const Tensor row = chunks == 1 ? pr : rowv[j].tile(0, n, 0, 1);
      if (chunks > 1) b.tensor_reduce(row, pr, combine);
      if (s.all)
        b.tensor_tensor(acc.tile(0, n, 0, 1), acc.tile(0, n, 0, 1), row, combine);
      else
        b.dma_copy(out.tile(r0, n, 0, 1), row, -1, false, Engine::vector);
    };
    int i = 0, j = 0, flip = 0, prev_r0 = -1, prev_n = 0;
    for (std::int64_t t = core; t < row_tiles; t += s.cores, j ^= 1) {
      const int r0 = static_cast<int>(t * P), n = static_cast<int>(std::min(P, s.rows - t * P));
      for (std::int64_t c = 0; c < chunks; ++c, i = (i + 1) % kLoads) {
        const std::int64_t c0 = c * width, w = std::min(width, s.cols - c0);
        const Tensor vx = tx[i].tile(0, n, 0, w), sqt = sq[i % kBufs].tile(0, n, 0, w);
        b.dma_copy(vx, x.tile(r0, n, c0, w));
        const Tensor dst = parts[j].tile(0, n, c, 1);
        // Sum of squares: alternate chunks between the Scalar engine (x^2
        // with its row accumulator) and GpSimd + Vector (x * x, then the row
        // sum): the same FP32 values and order, two engines' worth of rate.
        if (s.op == ReduceOp::sumsq && ++flip % 2 == 1) {
          b.activation(sqt, isa::ActFunc::square, vx, nullptr, 1.0f, &dst);
        } else if (s.op == ReduceOp::sumsq) {
          b.tensor_tensor(sqt, vx, vx, AluOp::multiply, Engine::gpsimd);
          b.tensor_reduce(dst, sqt, AluOp::add);
        } else {
          b.tensor_reduce(dst, vx, combine);
        }
      }
      if (prev_r0 >= 0) finish(prev_r0, prev_n, j ^ 1);
      prev_r0 = r0, prev_n = n;
    }
    if (prev_r0 >= 0) finish(prev_r0, prev_n, j ^ 1);
    if (s.all) {
      // The core's partial: the partitions combined in order (GpSimd).
      const Tensor total = b.sbuf(1, 1, DType::fp32);
      b.partition_reduce(total, acc, combine);
      b.dma_copy(out.tile(core, 1, 0, 1), total, -1, false, Engine::gpsimd);
    }
  }
  return b.finish();
}

isa::Program block_sum_kernel(const arch::ChipSpec& chip, const BlockSumSpec& s) {
  check_rows("block_sum", s.rows, s.cols, s.in, s.cores);
  check_rows("block_sum", s.rows, s.cols, s.out, s.cores);
  if (s.k < 1) throw Error(fmt::format("block_sum: k must be >= 1, got {}", s.k));
  Builder b(chip, s.cores);
  const Tensor x = b.hbm("x", {s.k * s.rows, s.cols}, s.in, isa::TensorKind::input);
  const Tensor y = b.hbm("y", {s.rows, s.cols}, s.out, isa::TensorKind::output);
  const std::int64_t P = chip.sbuf_partitions;
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    Tensor tx[kBufs], acc[2], ty[2];
    for (auto& t : tx) t = b.sbuf(static_cast<int>(P), kWidth, s.in);
    for (auto& t : acc) t = b.sbuf(static_cast<int>(P), kWidth, DType::fp32);
    for (auto& t : ty) t = b.sbuf(static_cast<int>(P), kWidth, s.out);
    std::int64_t u = 0;
    int i = 0, a = 0;
    for (std::int64_t r0 = 0; r0 < s.rows; r0 += P) {
      const int n = static_cast<int>(std::min(P, s.rows - r0));
      for (std::int64_t c0 = 0; c0 < s.cols; c0 += kWidth, ++u) {
        if (u % s.cores != core) continue;  // tiles round-robin over the cores
        const std::int64_t w = std::min(kWidth, s.cols - c0);
        const Tensor va = acc[a].tile(0, n, 0, w), vy = ty[a].tile(0, n, 0, w);
        for (std::int64_t j = 0; j < s.k; ++j, i = (i + 1) % kBufs) {
          const Tensor vx = tx[i].tile(0, n, 0, w);
          b.dma_copy(vx, x.tile(static_cast<int>(j * s.rows + r0), n, c0, w));
          if (j == 0)
            b.tensor_copy(va, vx, Engine::gpsimd);
          else
            b.tensor_tensor(va, va, vx, AluOp::add);
        }
        b.tensor_copy(vy, va, Engine::scalar);
        b.dma_copy(y.tile(static_cast<int>(r0), n, c0, w), vy, -1, false, Engine::scalar);
        a ^= 1;
      }
    }
  }
  return b.finish();
}

bool column_sum_fits(const arch::ChipSpec& chip, std::int64_t cols, int cores) {
  return cores >= 1 &&
         ceil_div(ceil_div(cols, cores), output_tile_columns(chip)) <= chip.psum_banks;
}

isa::Program column_sum_kernel(const arch::ChipSpec& chip, const ColumnSumSpec& s) {
  check_rows("column_sum", s.rows, s.cols, s.in, s.cores);
  check_rows("column_sum", 1, s.cols, s.out, s.cores);
  Builder b(chip, s.cores);
  const Tensor x = b.hbm("x", {s.rows, s.cols}, s.in, isa::TensorKind::input);
  const Tensor y = b.hbm("y", {1, s.cols}, s.out, isa::TensorKind::output);
  const std::int64_t P = chip.sbuf_partitions, bank = output_tile_columns(chip);
  // Columns per core: FP32 sums in whole PSUM banks (column_sum_fits).
  const std::int64_t per = ceil_div(s.cols, s.cores);
  if (!column_sum_fits(chip, s.cols, s.cores))
    throw NotSupported(
        fmt::format("column_sum of {} columns on {} cores: {} a core need more "
                    "than the {} PSUM banks",
                    s.cols, s.cores, per, chip.psum_banks));
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    const std::int64_t c0 = core * per, w = std::min(per, s.cols - c0);
    if (w <= 0) continue;
    const Tensor ones = b.sbuf(static_cast<int>(P), 1, s.in);
    b.memset(ones, 1.0f, Engine::gpsimd);
    std::vector<Tensor> acc;
    for (std::int64_t j = 0; j < w; j += bank) acc.push_back(b.psum(1, bank, DType::fp32));
    // g whole 128-row tiles per DMA (partition p holds row t * 128 + p of
    // each), twice the bytes per partition at which DMA saturates, so the
    // loads are not each a DMA's fixed latency; the last partial tile alone.
    const std::int64_t esz = isa::size_bytes(s.in);
    const std::int64_t g =
        std::max<std::int64_t>(1, 2 * chip.dma.saturating_per_partition.value() / (w * esz));
    Tensor tx[kBufs];
    for (auto& t : tx) t = b.sbuf(static_cast<int>(P), g * w, s.in);
    int i = 0;
    bool first = true;
    for (std::int64_t r0 = 0; r0 < s.rows; i = (i + 1) % kBufs) {
      const std::int64_t full = (s.rows - r0) / P, m = full > 0 ? std::min(g, full) : 1;
      const int n = static_cast<int>(full > 0 ? P : s.rows - r0);
      const Tensor t = tx[i].tile(0, n, 0, m * w);
      Tensor src = x.tile(static_cast<int>(r0), n, c0, w);
      src.ap.dims = {{s.cols, n}, {P * s.cols, m}, {1, w}};
      b.dma_copy(t, src);
      for (std::int64_t q = 0; q < m; ++q)
        for (std::size_t j = 0; j < acc.size(); ++j) {
          const std::int64_t j0 = static_cast<std::int64_t>(j) * bank, wj = std::min(bank, w - j0);
          b.matmul(acc[j].tile(0, 1, 0, wj), ones.tile(0, n, 0, 1), t.tile(0, n, q * w + j0, wj),
                   !first);
          first = first && j + 1 < acc.size();
        }
      r0 += m * n;
    }
    const Tensor out = b.sbuf(1, w, s.out);
    for (std::size_t j = 0; j < acc.size(); ++j) {
      const std::int64_t j0 = static_cast<std::int64_t>(j) * bank, wj = std::min(bank, w - j0);
      b.tensor_copy(out.tile(0, 1, j0, wj), acc[j].tile(0, 1, 0, wj));
    }
    b.dma_copy(y.tile(0, 1, c0, w), out, -1, false, Engine::vector);
  }
  return b.finish();
}

isa::Program clip_kernel(const arch::ChipSpec& chip, const ClipSpec& s) {
  check_rows("clip_by_global_norm", s.rows, s.cols, s.dtype, s.cores);
  if (s.parts < 1) throw Error(fmt::format("clip_by_global_norm: parts must be >= 1"));
  if (!(s.max_norm > 0.0f))
    throw Error(fmt::format("clip_by_global_norm: max_norm must be > 0, got {}", s.max_norm));
  Builder b(chip, s.cores);
  const Tensor g = b.hbm("grad", {s.rows, s.cols}, s.dtype, isa::TensorKind::input);
  const Tensor parts = b.hbm("sumsq_parts", {1, s.parts}, DType::fp32, isa::TensorKind::input);
  const Tensor out = b.hbm("grad_out", {s.rows, s.cols}, s.dtype, isa::TensorKind::output);
  const Tensor norm_h = b.hbm("norm", {1, 1}, DType::fp32, isa::TensorKind::output);
  const std::int64_t P = chip.sbuf_partitions;
  const int pp = static_cast<int>(std::min(P, s.rows));
  const auto work = units(s.rows, s.cols, P, kWidth);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    // Every partition computes the same coefficient from the partial sums
    // (loaded with partition stride 0), as torch.nn.utils.clip_grad_norm_:
    //   norm = sqrt(sum), coef = min(max_norm / (norm + 1e-6), 1).
    const Tensor pv = b.sbuf(pp, s.parts, DType::fp32);
    b.dma_copy(pv, bias_rows(parts, pp, 0, s.parts));
    const Tensor sum = b.sbuf(pp, 1, DType::fp32), coef = b.sbuf(pp, 1, DType::fp32);
    b.tensor_reduce(sum, pv, AluOp::add);
    b.activation(sum, isa::ActFunc::sqrt, sum);
    if (core == 0) b.dma_copy(norm_h, sum.tile(0, 1, 0, 1), -1, false, Engine::scalar);
    b.tensor_scalar(coef, sum, AluOp::add, 1e-6f);
    b.reciprocal(coef, coef);
    b.tensor_scalar(coef, coef, AluOp::multiply, s.max_norm, AluOp::min, 1.0f);
    Tensor tg[kBufs];
    for (auto& t : tg) t = b.sbuf(static_cast<int>(P), kWidth, s.dtype);
    int i = 0, k = 0;
    for (std::size_t u = static_cast<std::size_t>(core); u < work.size();
         u += static_cast<std::size_t>(s.cores), i = (i + 1) % kBufs, ++k) {
      const Unit& w = work[u];
      const Tensor v = tg[i].tile(0, w.n, 0, w.w);
      b.dma_copy(v, g.tile(w.r0, w.n, w.c0, w.w));
      const Engine e = k % 3 == 0 ? Engine::vector : k % 3 == 1 ? Engine::gpsimd : Engine::scalar;
      b.tensor_scalar(v, v, AluOp::multiply, coef.tile(0, w.n, 0, 1), AluOp::bypass, 0.0f, nullptr,
                      e);
      b.dma_copy(out.tile(w.r0, w.n, w.c0, w.w), v, -1, false, e);
    }
  }
  return b.finish();
}

}  // namespace tern::kernel
