// Optimizer kernels: the fused AdamW step.
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

AdamWScalars adamw_scalars(const AdamWSpec& s) {
  const double b1 = s.beta1, b2 = s.beta2, t = static_cast<double>(s.step);
  const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
  return {static_cast<float>(1.0 - static_cast<double>(s.lr) * s.weight_decay),
          static_cast<float>(1.0 - b1), static_cast<float>(1.0 - b2),
          static_cast<float>(std::sqrt(bc2)), static_cast<float>(-static_cast<double>(s.lr) / bc1)};
}

isa::Program adamw_kernel(const arch::ChipSpec& chip, const AdamWSpec& s) {
  if (s.rows < 1 || s.cols < 1)
    throw Error(fmt::format("adamw: shape [{}, {}] must be >= 1", s.rows, s.cols));
  if (s.grad != DType::fp32 && s.grad != DType::bf16)
    throw NotSupported(fmt::format("adamw with {} gradients (fp32, bf16 are)", isa::name(s.grad)));
  if (s.step < 1) throw Error(fmt::format("adamw: step must be >= 1, got {}", s.step));
  if (!(s.beta1 >= 0.0f && s.beta1 < 1.0f && s.beta2 >= 0.0f && s.beta2 < 1.0f))
    throw Error(fmt::format("adamw: betas must be in [0, 1), got {}, {}", s.beta1, s.beta2));
  if (!(s.lr >= 0.0f) || !(s.eps > 0.0f) || !(s.weight_decay >= 0.0f))
    throw Error("adamw: lr and weight_decay must be >= 0 and eps > 0");
  Builder b(chip, s.cores);
  const std::int64_t R = s.rows, C = s.cols;
  const Tensor p_h = b.hbm("param", {R, C}, DType::fp32, isa::TensorKind::input);
  const Tensor g_h = b.hbm("grad", {R, C}, s.grad, isa::TensorKind::input);
  const Tensor m_h = b.hbm("m", {R, C}, DType::fp32, isa::TensorKind::input);
  const Tensor v_h = b.hbm("v", {R, C}, DType::fp32, isa::TensorKind::input);
  const Tensor po_h = b.hbm("param_out", {R, C}, DType::fp32, isa::TensorKind::output);
  const Tensor mo_h = b.hbm("m_out", {R, C}, DType::fp32, isa::TensorKind::output);
  const Tensor vo_h = b.hbm("v_out", {R, C}, DType::fp32, isa::TensorKind::output);
  const Tensor pb_h = b.hbm("param_bf16", {R, C}, DType::bf16, isa::TensorKind::output);
  const AdamWScalars ks = adamw_scalars(s);
  const float decay = ks.decay, one_m_b1 = ks.one_m_b1, one_m_b2 = ks.one_m_b2,
              bc2_sqrt = ks.bc2_sqrt, neg_step = ks.neg_step_size;
  // Tiles of [128, F]: 4 KiB per partition per fp32 tensor, 6 buffers (a
  // tile is in flight through four pipeline stages; see bench/README.md).
  const std::int64_t P = chip.sbuf_partitions, F = 1024;
  constexpr int kBuf = 6;
  struct Bufs {
    Tensor p, g, m, v, a, c, pb;
  };
  const std::int64_t row_tiles = ceil_div(R, P), col_tiles = ceil_div(C, F);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    Bufs bu[kBuf];
    for (auto& x : bu) {
      x.p = b.sbuf(static_cast<int>(P), F, DType::fp32);
      x.g = b.sbuf(static_cast<int>(P), F, s.grad);
      x.m = b.sbuf(static_cast<int>(P), F, DType::fp32);
      x.v = b.sbuf(static_cast<int>(P), F, DType::fp32);
      x.a = b.sbuf(static_cast<int>(P), F, DType::fp32);
      x.c = b.sbuf(static_cast<int>(P), F, DType::fp32);
      x.pb = b.sbuf(static_cast<int>(P), F, DType::bf16);
    }
    // The tiles of this core, then a software pipeline over them (below).
    // Phase 1: loads and the updates that need only this tile's inputs.
    struct Work {
      int r0, n;
      std::int64_t c0, w;
    };
    std::vector<Work> work;
    for (std::int64_t rt = core; rt < row_tiles; rt += s.cores)
      for (std::int64_t ct = 0; ct < col_tiles; ++ct)
        work.push_back({static_cast<int>(rt * P), static_cast<int>(std::min(P, R - rt * P)), ct * F,
                        std::min(F, C - ct * F)});
    struct View {
      Tensor p, g, m, v, a, c, pb;
    };
    auto view = [&](std::size_t k) {
      const Work& wk = work[k];
      const Bufs& x = bu[k % kBuf];
      auto T = [&](const Tensor& t) { return t.tile(0, wk.n, 0, wk.w); };
      return View{T(x.p), T(x.g), T(x.m), T(x.v), T(x.a), T(x.c), T(x.pb)};
    };
    auto hbm = [&](std::size_t k, const Tensor& t) {
      return t.tile(work[k].r0, work[k].n, work[k].c0, work[k].w);
    };
    // One DMA queue per role: a queue completes in order, so a store sharing
    // a queue with the next tiles' loads would wait for them (and the loads
    // that reuse its buffer for it).
    constexpr int kQp = 0, kQg = 2, kQm = 4, kQv = 6, kQmo = 8, kQvo = 10, kQpo = 12, kQpb = 14;
    if (chip.dma.queues_per_engine <= kQpb)
      throw NotSupported(fmt::format("adamw on {}: it uses DMA queues 0..{}, the chip has {}",
                                     chip.name, kQpb, chip.dma.queues_per_engine));
    auto phase1 = [&](std::size_t k) {
      const View x = view(k);
      b.dma_copy(x.p, hbm(k, p_h), kQp);
      b.dma_copy(x.g, hbm(k, g_h), kQg);
      b.dma_copy(x.m, hbm(k, m_h), kQm);
      b.dma_copy(x.v, hbm(k, v_h), kQv);
      b.activation(x.p, isa::ActFunc::identity, x.p, nullptr, decay);  // p *= 1 - lr * wd
      b.activation(x.m, isa::ActFunc::identity, x.m, nullptr, s.beta1);
      b.activation(x.v, isa::ActFunc::identity, x.v, nullptr, s.beta2);
      b.tensor_scalar(x.a, x.g, isa::AluOp::multiply, one_m_b1);
      b.tensor_tensor(x.m, x.m, x.a, isa::AluOp::add);  // m = beta1 m + (1 - beta1) g
      b.dma_copy(hbm(k, mo_h), x.m, kQmo, false, Engine::vector);
      b.tensor_tensor(x.c, x.g, x.g, isa::AluOp::multiply, Engine::gpsimd);
      b.tensor_scalar(x.c, x.c, isa::AluOp::multiply, one_m_b2, isa::AluOp::bypass, 0.0f,
                      Engine::gpsimd);
      b.tensor_tensor(x.v, x.v, x.c, isa::AluOp::add, Engine::gpsimd);  // v = b2 v + (1-b2) g^2
      b.dma_copy(hbm(k, vo_h), x.v, kQvo, false, Engine::gpsimd);
    };
    // The rest of the chain, in three stages so that no engine waits in
    // order for another within one tile: sqrt(v) -> denom -> m / denom
    // (Scalar, Vector), then * -step_size and p + a (Scalar, GpSimd), then
    // the bf16 copy (Scalar) and the stores.
    auto phase2 = [&](std::size_t k) {
      const View x = view(k);
      b.activation(x.a, isa::ActFunc::sqrt, x.v);
      // denom = sqrt(v) / sqrt(bc2) + eps; then m / denom * -step_size.
      b.tensor_scalar(x.a, x.a, isa::AluOp::divide, bc2_sqrt, isa::AluOp::add, s.eps);
      b.tensor_tensor(x.a, x.m, x.a, isa::AluOp::divide);
    };
    auto phase3 = [&](std::size_t k) {
      const View x = view(k);
      b.tensor_scalar(x.a, x.a, isa::AluOp::multiply, neg_step, isa::AluOp::bypass, 0.0f,
                      Engine::scalar);
      b.tensor_tensor(x.p, x.p, x.a, isa::AluOp::add, Engine::gpsimd);
      b.dma_copy(hbm(k, po_h), x.p, kQpo, false, Engine::gpsimd);
    };
    auto phase4 = [&](std::size_t k) {
      const View x = view(k);
      b.tensor_copy(x.pb, x.p, Engine::scalar);
      b.dma_copy(hbm(k, pb_h), x.pb, kQpb, false, Engine::scalar);
    };
    // A software pipeline: iteration i issues phase 1 of tile i, phase 2 of
    // tile i - 1, phase 3 of tile i - 2 and phase 4 of tile i - 3 (each
    // engine runs its instructions in order).
    const std::size_t n = work.size();
    for (std::size_t i = 0; i < n + 3; ++i) {
      if (i < n) phase1(i);
      if (i >= 1 && i - 1 < n) phase2(i - 1);
      if (i >= 2 && i - 2 < n) phase3(i - 2);
      if (i >= 3 && i - 3 < n) phase4(i - 3);
    }
  }
  return b.finish();
}

}  // namespace tern::kernel
