// Rotary position embedding (RoPE) on [B, H, S, D] rows.
#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kernel/attention_tiles.h"
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
using namespace detail::attn;

isa::Program rope_kernel(const arch::ChipSpec& chip, const RopeSpec& s) {
  auto bad = [&](const std::string& m) { throw Error(fmt::format("rope: {}", m)); };
  if (s.batch < 1) bad(fmt::format("batch must be >= 1, got {}", s.batch));
  if (s.heads < 1) bad(fmt::format("heads must be >= 1, got {}", s.heads));
  if (s.seq < 1) bad(fmt::format("seq must be >= 1, got {}", s.seq));
  if (s.head_dim < 2 || s.head_dim % 2 != 0)
    bad(fmt::format("head_dim must be even and >= 2, got {}", s.head_dim));
  if (s.cores < 1 || s.cores > chip.cores)
    bad(fmt::format("cores must be in 1..{} on {}, got {}", chip.cores, chip.name, s.cores));
  if (s.dtype != DType::bf16 && s.dtype != DType::fp16 && s.dtype != DType::fp32)
    throw NotSupported(fmt::format("rope with {} (fp32, bf16, fp16 are)", isa::name(s.dtype)));
  const std::int64_t BH = s.batch * s.heads, S = s.seq, D = s.head_dim, H2 = D / 2;
  Builder b(chip, s.cores);
  const Tensor x = b.hbm("x", {s.batch, s.heads, S, D}, s.dtype, isa::TensorKind::input);
  const Tensor cs = b.hbm("cos", {S, H2}, DType::fp32, isa::TensorKind::input);
  const Tensor sn = b.hbm("sin", {S, H2}, DType::fp32, isa::TensorKind::input);
  const Tensor y = b.hbm("y", {s.batch, s.heads, S, D}, s.dtype, isa::TensorKind::output);
  // Units: 128 positions (partitions) x up to `nb` heads (free dim), so one
  // instruction covers nb * D / 2 elements per partition and the cos / sin
  // rows of the positions are loaded once per unit.
  const std::int64_t nb = std::max<std::int64_t>(1, std::min<std::int64_t>(BH, 2048 / D));
  struct Unit {
    std::int64_t s0, ts, h0, nh;
  };
  std::vector<Unit> units;
  for (std::int64_t s0 = 0; s0 < S; s0 += kTq)
    for (std::int64_t h0 = 0; h0 < BH; h0 += nb)
      units.push_back({s0, std::min(kTq, S - s0), h0, std::min(nb, BH - h0)});
  const std::int64_t F = nb * D;
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    constexpr int kBuf = 3;
    std::vector<Tensor> xin, yout, cos_t, sin_t, t1, t2;
    for (int i = 0; i < kBuf; ++i) {
      xin.push_back(b.sbuf(static_cast<int>(kTq), F, s.dtype));
      yout.push_back(b.sbuf(static_cast<int>(kTq), F, s.dtype));
      cos_t.push_back(b.sbuf(static_cast<int>(kTq), H2, DType::fp32));
      sin_t.push_back(b.sbuf(static_cast<int>(kTq), H2, DType::fp32));
      t1.push_back(b.sbuf(static_cast<int>(kTq), F / 2, DType::fp32));
      t2.push_back(b.sbuf(static_cast<int>(kTq), F / 2, DType::fp32));
    }
    int slot = 0;
    for (std::size_t ui = static_cast<std::size_t>(core); ui < units.size();
         ui += static_cast<std::size_t>(s.cores), slot = (slot + 1) % kBuf) {
      const Unit& u = units[ui];
      const int ts = static_cast<int>(u.ts);
      const std::size_t k = static_cast<std::size_t>(slot);
      // x rows (head h, position s) -> partition s - s0, columns [(h - h0) D, +D).
      const Tensor xv = hbm_view(x, (u.h0 * S + u.s0) * D, ts, D, {{S * D, u.nh}, {1, D}});
      const Tensor yv = hbm_view(y, (u.h0 * S + u.s0) * D, ts, D, {{S * D, u.nh}, {1, D}});
      const Tensor xs = xin[k].tile(0, ts, 0, u.nh * D);
      b.dma_copy(xs, xv);
      b.dma_copy(cos_t[k].tile(0, ts, 0, H2), cs.tile(static_cast<int>(u.s0), ts, 0, H2));
      b.dma_copy(sin_t[k].tile(0, ts, 0, H2), sn.tile(static_cast<int>(u.s0), ts, 0, H2));
      // Halves of every head, and the tables broadcast over the heads (stride 0).
      auto half = [&](const Tensor& t, int which) {
        return t.tile(0, ts, 0, u.nh * D).with_dims({{D, u.nh}, {1, H2}}, which * H2);
      };
      auto table = [&](const Tensor& t) {
        return t.tile(0, ts, 0, H2).with_dims({{0, u.nh}, {1, H2}});
      };
      auto tmp = [&](const Tensor& t) {
        return t.tile(0, ts, 0, u.nh * H2).with_dims({{H2, u.nh}, {1, H2}});
      };
      const Tensor x1 = half(xs, 0), x2 = half(xs, 1);
      const Tensor c = table(cos_t[k]), sv = table(sin_t[k]);
      const Tensor a = tmp(t1[k]), bb = tmp(t2[k]);
      const Tensor y1 = half(yout[k], 0), y2 = half(yout[k], 1);
      // Forward: y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin; backward
      // (rotation by -theta): y1 = x1 cos + x2 sin, y2 = x2 cos - x1 sin.
      // Each product and the sum rounded to FP32, the sum to dtype.
      const AluOp first = s.backward ? AluOp::add : AluOp::subtract;
      const AluOp second = s.backward ? AluOp::subtract : AluOp::add;
      b.tensor_tensor(a, x1, c, AluOp::multiply, Engine::vector);
      b.tensor_tensor(bb, x2, sv, AluOp::multiply, Engine::gpsimd);
      b.tensor_tensor(y1, a, bb, first, Engine::vector);
      b.tensor_tensor(a, x2, c, AluOp::multiply, Engine::gpsimd);
      b.tensor_tensor(bb, x1, sv, AluOp::multiply, Engine::vector);
      b.tensor_tensor(y2, a, bb, second, Engine::gpsimd);
      b.dma_copy(yv, yout[k].tile(0, ts, 0, u.nh * D), -1, false, Engine::gpsimd);
    }
  }
  return b.finish();
}

}  // namespace tern::kernel
