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
  for (const auto& [r, c] : s.tensors)
    if (r < 1 || c < 1) throw Error(fmt::format("adamw: tensor shape [{}, {}] must be >= 1", r, c));
  Builder b(chip, s.cores);
  // One set of HBM tensors per updated tensor: names as documented, with
  // ".<i>" appended in the multi-tensor form.
  struct Set {
    Tensor p, g, m, v, po, mo, vo, pb;
  };
  std::vector<Set> sets;
  std::vector<std::pair<std::int64_t, std::int64_t>> shapes = s.tensors;
  if (shapes.empty()) shapes.emplace_back(s.rows, s.cols);
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const auto [R, C] = shapes[i];
    const std::string x = s.tensors.empty() ? "" : fmt::format(".{}", i);
    auto in = [&](const char* n, DType d) {
      return b.hbm(n + x, {R, C}, d, isa::TensorKind::input);
    };
    auto out = [&](const char* n, DType d) {
      return b.hbm(n + x, {R, C}, d, isa::TensorKind::output);
    };
    sets.push_back({in("param", DType::fp32), in("grad", s.grad), in("m", DType::fp32),
                    in("v", DType::fp32), out("param_out", DType::fp32), out("m_out", DType::fp32),
                    out("v_out", DType::fp32), out("param_bf16", DType::bf16)});
  }
  // The step's scalars as columns of a [P, 5] tile (decay, 1 - beta1,
  // 1 - beta2, sqrt(bc2), -step_size): from HBM "scalars" [1, 5] when they
  // change from step to step (runtime_scalars), else memset from the spec.
  const Tensor sc_h =
      s.runtime_scalars ? b.hbm("scalars", {1, 5}, DType::fp32, isa::TensorKind::input) : Tensor{};
  const AdamWScalars ks = adamw_scalars(s);
  // Tiles of [128, F]: 4 KiB per partition per fp32 tensor, 6 buffers (a
  // tile is in flight through four pipeline stages; see bench/README.md).
  const std::int64_t P = chip.sbuf_partitions, F = 1024;
  constexpr int kBuf = 6;
  struct Bufs {
    Tensor p, g, m, v, a, c, pb;
  };
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    const Tensor sc = b.sbuf(static_cast<int>(P), 5, DType::fp32);
    if (s.runtime_scalars) {
      b.dma_copy(sc, bias_rows(sc_h, static_cast<int>(P), 0, 5));
    } else {
      const float v[5] = {ks.decay, ks.one_m_b1, ks.one_m_b2, ks.bc2_sqrt, ks.neg_step_size};
      for (int i = 0; i < 5; ++i) b.memset(sc.tile(0, static_cast<int>(P), i, 1), v[i]);
    }
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
      std::size_t set;
      int r0, n;
      std::int64_t c0, w;
    };
    // Tiles of every tensor, dealt round-robin over the cores.
    std::vector<Work> work;
    std::int64_t u = 0;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const auto [R, C] = shapes[i];
      for (std::int64_t rt = 0; rt < ceil_div(R, P); ++rt)
        for (std::int64_t ct = 0; ct < ceil_div(C, F); ++ct, ++u)
          if (u % s.cores == core)
            work.push_back({i, static_cast<int>(rt * P), static_cast<int>(std::min(P, R - rt * P)),
                            ct * F, std::min(F, C - ct * F)});
    }
    struct View {
      Tensor p, g, m, v, a, c, pb;
    };
    // Column i of the scalars for tile k's rows.
    auto col = [&](std::size_t k, int i) { return sc.tile(0, work[k].n, i, 1); };
    auto view = [&](std::size_t k) {
      const Work& wk = work[k];
      const Bufs& x = bu[k % kBuf];
      auto T = [&](const Tensor& t) { return t.tile(0, wk.n, 0, wk.w); };
      return View{T(x.p), T(x.g), T(x.m), T(x.v), T(x.a), T(x.c), T(x.pb)};
    };
    // Tile k's view of one of its set's HBM tensors (a member pointer).
    auto hbm = [&](std::size_t k, Tensor Set::*t) {
      return (sets[work[k].set].*t).tile(work[k].r0, work[k].n, work[k].c0, work[k].w);
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
      b.dma_copy(x.p, hbm(k, &Set::p), kQp);
      b.dma_copy(x.g, hbm(k, &Set::g), kQg);
      b.dma_copy(x.m, hbm(k, &Set::m), kQm);
      b.dma_copy(x.v, hbm(k, &Set::v), kQv);
      b.tensor_scalar(x.p, x.p, isa::AluOp::multiply, col(k, 0), isa::AluOp::bypass, 0.0f, nullptr,
                      Engine::scalar);  // p *= 1 - lr * wd
      b.activation(x.m, isa::ActFunc::identity, x.m, nullptr, s.beta1);
      b.activation(x.v, isa::ActFunc::identity, x.v, nullptr, s.beta2);
      b.tensor_scalar(x.a, x.g, isa::AluOp::multiply, col(k, 1));
      b.tensor_tensor(x.m, x.m, x.a, isa::AluOp::add);  // m = beta1 m + (1 - beta1) g
      b.dma_copy(hbm(k, &Set::mo), x.m, kQmo, false, Engine::vector);
      b.tensor_tensor(x.c, x.g, x.g, isa::AluOp::multiply, Engine::gpsimd);
      b.tensor_scalar(x.c, x.c, isa::AluOp::multiply, col(k, 2), isa::AluOp::bypass, 0.0f, nullptr,
                      Engine::gpsimd);
      b.tensor_tensor(x.v, x.v, x.c, isa::AluOp::add, Engine::gpsimd);  // v = b2 v + (1-b2) g^2
      b.dma_copy(hbm(k, &Set::vo), x.v, kQvo, false, Engine::gpsimd);
    };
    // The rest of the chain, in three stages so that no engine waits in
    // order for another within one tile: sqrt(v) -> denom -> m / denom
    // (Scalar, Vector), then * -step_size and p + a (Scalar, GpSimd), then
    // the bf16 copy (Scalar) and the stores.
    auto phase2 = [&](std::size_t k) {
      const View x = view(k);
      b.activation(x.a, isa::ActFunc::sqrt, x.v);
      // denom = sqrt(v) / sqrt(bc2) + eps; then m / denom * -step_size.
      b.tensor_scalar(x.a, x.a, isa::AluOp::divide, col(k, 3), isa::AluOp::add, s.eps);
      b.tensor_tensor(x.a, x.m, x.a, isa::AluOp::divide);
    };
    auto phase3 = [&](std::size_t k) {
      const View x = view(k);
      b.tensor_scalar(x.a, x.a, isa::AluOp::multiply, col(k, 4), isa::AluOp::bypass, 0.0f, nullptr,
                      Engine::scalar);
      b.tensor_tensor(x.p, x.p, x.a, isa::AluOp::add, Engine::gpsimd);
      b.dma_copy(hbm(k, &Set::po), x.p, kQpo, false, Engine::gpsimd);
    };
    auto phase4 = [&](std::size_t k) {
      const View x = view(k);
      b.tensor_copy(x.pb, x.p, Engine::scalar);
      b.dma_copy(hbm(k, &Set::pb), x.pb, kQpb, false, Engine::scalar);
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
