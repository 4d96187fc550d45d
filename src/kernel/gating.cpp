// Gated linear units (SwiGLU, GeGLU): out = act(gate) * up, and backward.
#include <algorithm>
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

namespace {

constexpr std::int64_t kWidth = kRowTileColumns;
constexpr int kBufs = 3;

void check_glu(const char* name, const GluSpec& s) {
  check_rows(name, s.rows, s.cols, s.dtype, s.cores);
  if (s.act != ActFunc::silu && s.act != ActFunc::gelu && s.act != ActFunc::gelu_tanh)
    throw NotSupported(fmt::format("{} with activation {} (silu, gelu, gelu_tanh are)", name,
                                   isa::act_name(s.act)));
}

ActFunc derivative(ActFunc f) {
  return f == ActFunc::silu   ? ActFunc::silu_dx
         : f == ActFunc::gelu ? ActFunc::gelu_dx
                              : ActFunc::gelu_tanh_dx;
}

// The [R, C] tiles (128 rows x kWidth columns) of core `core`, in order.
template <typename F>
void for_tiles(const GluSpec& s, std::int64_t partitions, int core, F&& f) {
  std::int64_t u = 0;
  for (std::int64_t r0 = 0; r0 < s.rows; r0 += partitions)
    for (std::int64_t c0 = 0; c0 < s.cols; c0 += kWidth, ++u)
      if (u % s.cores == core)
        f(static_cast<int>(r0), static_cast<int>(std::min(partitions, s.rows - r0)), c0,
          std::min(kWidth, s.cols - c0));
}

}  // namespace

isa::Program glu_kernel(const arch::ChipSpec& chip, const GluSpec& s) {
  check_glu("glu", s);
  Builder b(chip, s.cores);
  const Tensor gate = b.hbm("gate", {s.rows, s.cols}, s.dtype, isa::TensorKind::input);
  const Tensor up = b.hbm("up", {s.rows, s.cols}, s.dtype, isa::TensorKind::input);
  const Tensor out = b.hbm("out", {s.rows, s.cols}, s.dtype, isa::TensorKind::output);
  const std::int64_t P = chip.sbuf_partitions;
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    Tensor tg[kBufs], tu[kBufs], ta[kBufs];
    for (int i = 0; i < kBufs; ++i) {
      tg[i] = b.sbuf(static_cast<int>(P), kWidth, s.dtype);
      tu[i] = b.sbuf(static_cast<int>(P), kWidth, s.dtype);
      ta[i] = b.sbuf(static_cast<int>(P), kWidth, DType::fp32);
    }
    int i = 0, k = 0;
    for_tiles(s, P, core, [&](int r0, int n, std::int64_t c0, std::int64_t w) {
      const Tensor g = tg[i].tile(0, n, 0, w), u = tu[i].tile(0, n, 0, w),
                   a = ta[i].tile(0, n, 0, w);
      b.dma_copy(g, gate.tile(r0, n, c0, w));
      b.dma_copy(u, up.tile(r0, n, c0, w));
      // Scalar: act(gate) in FP32; Vector or GpSimd (alternating tiles):
      // out = act(gate) * up, cast, into the gate's tile.
      b.activation(a, s.act, g);
      const Engine e = k++ % 2 == 0 ? Engine::vector : Engine::gpsimd;
      b.tensor_tensor(g, a, u, AluOp::multiply, e);
      b.dma_copy(out.tile(r0, n, c0, w), g, -1, false, e);
      i = (i + 1) % kBufs;
    });
  }
  return b.finish();
}

isa::Program glu_backward_kernel(const arch::ChipSpec& chip, const GluSpec& s) {
  check_glu("glu_backward", s);
  Builder b(chip, s.cores);
  const Tensor dout = b.hbm("dout", {s.rows, s.cols}, s.dtype, isa::TensorKind::input);
  const Tensor gate = b.hbm("gate", {s.rows, s.cols}, s.dtype, isa::TensorKind::input);
  const Tensor up = b.hbm("up", {s.rows, s.cols}, s.dtype, isa::TensorKind::input);
  const Tensor dgate = b.hbm("dgate", {s.rows, s.cols}, s.dtype, isa::TensorKind::output);
  const Tensor dup = b.hbm("dup", {s.rows, s.cols}, s.dtype, isa::TensorKind::output);
  const std::int64_t P = chip.sbuf_partitions;
  const ActFunc dact = derivative(s.act);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    Tensor td[kBufs], tg[kBufs], tu[kBufs], ta[kBufs], tda[kBufs], tt[kBufs];
    for (int i = 0; i < kBufs; ++i) {
      td[i] = b.sbuf(static_cast<int>(P), kWidth, s.dtype);
      tg[i] = b.sbuf(static_cast<int>(P), kWidth, s.dtype);
      tu[i] = b.sbuf(static_cast<int>(P), kWidth, s.dtype);
      ta[i] = b.sbuf(static_cast<int>(P), kWidth, DType::fp32);
      tda[i] = b.sbuf(static_cast<int>(P), kWidth, DType::fp32);
      tt[i] = b.sbuf(static_cast<int>(P), kWidth, DType::fp32);
    }
    int i = 0;
    for_tiles(s, P, core, [&](int r0, int n, std::int64_t c0, std::int64_t w) {
      const Tensor d = td[i].tile(0, n, 0, w), g = tg[i].tile(0, n, 0, w),
                   u = tu[i].tile(0, n, 0, w), a = ta[i].tile(0, n, 0, w),
                   da = tda[i].tile(0, n, 0, w), t = tt[i].tile(0, n, 0, w);
      b.dma_copy(d, dout.tile(r0, n, c0, w));
      b.dma_copy(g, gate.tile(r0, n, c0, w));
      b.dma_copy(u, up.tile(r0, n, c0, w));
      // Scalar: act(gate) and act'(gate) (FP32).
      // Vector: dup = dout * act(gate), cast, into up's tile once t is made;
      // GpSimd: t = dout * up, then dgate = t * act'(gate), cast, into the
      // gate's tile.
      b.activation(a, s.act, g);
      b.activation(da, dact, g);
      b.tensor_tensor(t, d, u, AluOp::multiply, Engine::gpsimd);
      b.tensor_tensor(u, d, a, AluOp::multiply, Engine::vector);
      b.dma_copy(dup.tile(r0, n, c0, w), u, -1, false, Engine::vector);
      b.tensor_tensor(g, t, da, AluOp::multiply, Engine::gpsimd);
      b.dma_copy(dgate.tile(r0, n, c0, w), g, -1, false, Engine::gpsimd);
      i = (i + 1) % kBufs;
    });
  }
  return b.finish();
}

}  // namespace tern::kernel
