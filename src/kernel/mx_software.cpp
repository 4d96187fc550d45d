// MX block quantization without QuantizeMX: the OCP-floor and rceil scale
// policies (the hardware instruction has only Trainium3's) and MXFP4
// (QuantizeMX writes only MXFP8), built from ALU ops so that the bytes equal
// tern::num::mx_quantize.
//
// Per tile of `parts` partitions (x4 rows) x nc columns, partition p holding
// rows 4p .. 4p + 3 of each column (QuantizeMX's source layout), a block is
// 8 partitions x 4 values:
//   1. |x| as the BF16 bits & 0x7FFF on the Scalar engine (integers keep
//      NaN / Inf above every finite value, as the host's amax does), then the
//      max of each 4 on GpSimd.
//   2. Tensor: transpose 128-column chunks, so the 8 partitions of a block
//      become 8 neighbouring columns; Vector: a max tree over them.
//   3. Scales in that transposed layout [columns, blocks] with integer ops
//      on the amax bits (exponent field E, fraction f; numerics.md section
//      3): code = max(E - offset (+1 if rceil and f > f_max), 0), 255 when
//      E = 255; the multiplier 2^-k as FP32 bits (254 - code) << 23.
//   4. Tensor: scale codes transposed back for the store; multiplier and
//      NaN flag broadcast to the block's 8 partitions by one matmul each
//      (stationary = the value repeated 8x along the free dim, moving = I).
//   5. Vector: x * 2^-k (exact) rounded once into the element type
//      (saturating); elements of NaN blocks set to 0.
//      MXFP4 rounds on the FP32 bits of |y| = |x| * 2^-k instead (the
//      engines have no E2M1 type): 1 <= |y|: ((bits + lsb + 0x1FFFFF) >> 22) - 252 is the
//      RNE code, saturated at 7 (6.0); |y| < 1: round(2|y|) (0, 0.5, 1.0);
//      the sign bit as bit 3; four codes packed into one 16-bit element.
#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "kernel/builder.h"
#include "kernel/detail.h"
#include "kernel/kernels.h"
#include "util/error.h"

namespace tern::kernel::detail {

using isa::AluOp;
using isa::DType;
using isa::Engine;

namespace {

// The same bytes of a contiguous [P, n] tile as [P, n * size(from) / size(to)].
Tensor bytes_as(const Tensor& t, DType to) {
  Tensor r = t;
  r.ap.dtype = to;
  const std::int64_t n = t.cols() * isa::size_bytes(t.dtype()) / isa::size_bytes(to);
  r.ap.dims = {{1, n}};
  return r;
}

// Elements i of every group of `group` in a [P, groups * group] tile.
Tensor lane(const Tensor& t, std::int64_t groups, std::int64_t group, std::int64_t i) {
  return t.with_dims({{group, groups}}, i);
}

}  // namespace

Tensor mx_source_view(const Tensor& x, std::int64_t cols, std::int64_t k0, std::int64_t c0,
                      int parts, std::int64_t nc) {
  Tensor view = x;
  view.ap.offset += (k0 * cols + c0) * isa::size_bytes(x.dtype());
  view.ap.dims = {{4 * cols, parts}, {cols, 4}, {1, nc}};
  view.ap.partitions = parts;
  return view;
}

Tensor load_mx_source(Builder& b, const Tensor& staged, const Tensor& x, bool trans,
                      std::int64_t k0, std::int64_t c0, int parts, std::int64_t nc) {
  if (!trans) {
    b.dma_copy(staged, mx_source_view(x, x.cols(), k0, c0, parts, nc));
    return mx_interleaved(staged, nc);
  }
  const std::int64_t k = x.cols();
  for (int j = 0; j < 4; ++j) {
    Tensor src = x;  // rows c0 .. c0 + nc, elements k0 + j + 4p
    src.ap.offset += (c0 * k + k0 + j) * isa::size_bytes(x.dtype());
    src.ap.dims = {{k, nc}, {4, parts}};
    src.ap.partitions = static_cast<int>(nc);
    b.dma_transpose(staged.tile(0, parts, j * nc, nc), src);
  }
  return mx_interleaved(staged, nc);
}

std::vector<std::vector<MxTile>> mx_tiles(std::int64_t k, std::int64_t cols, std::int64_t tkl,
                                          std::int64_t width, int cores, int per_core) {
  const std::int64_t kt = (k + tkl - 1) / tkl;
  auto step = [&](std::int64_t ct) {  // column width of ct tiles, a multiple of 32
    return std::min(cols, ((cols + ct - 1) / ct + 31) / 32 * 32);
  };
  std::int64_t ct = (cols + width - 1) / width;
  while (kt * ct < std::int64_t{per_core} * cores && step(ct + 1) >= 64 && step(ct + 1) < step(ct))
    ++ct;
  const std::int64_t w = step(ct);
  std::vector<MxTile> all;
  for (std::int64_t k0 = 0; k0 < k; k0 += tkl)
    for (std::int64_t c0 = 0; c0 < cols; c0 += w)
      all.push_back({k0, c0, std::min(w, cols - c0), static_cast<int>(std::min(tkl, k - k0) / 4)});
  std::vector<std::size_t> order(all.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto area = [&](std::size_t i) { return all[i].nc * all[i].parts; };
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return area(a) > area(b); });
  std::vector<std::int64_t> load(static_cast<std::size_t>(cores), 0);
  std::vector<std::vector<std::size_t>> mine(static_cast<std::size_t>(cores));
  for (std::size_t i : order) {
    const auto c =
        static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[c] += area(i);
    mine[c].push_back(i);
  }
  std::vector<std::vector<MxTile>> out(static_cast<std::size_t>(cores));
  for (std::size_t c = 0; c < mine.size(); ++c) {
    std::sort(mine[c].begin(), mine[c].end());
    for (std::size_t i : mine[c]) out[c].push_back(all[i]);
  }
  return out;
}

Tensor mx_interleaved(const Tensor& staged, std::int64_t nc) {
  return staged.with_dims({{1, nc}, {nc, 4}});
}

void mx_interleave(Builder& b, const Tensor& dst, const Tensor& staged, std::int64_t nc,
                   Engine engine) {
  // j outer, c inner: the destination steps 4 elements (8 B), the source 1.
  b.tensor_copy(dst.with_dims({{1, 4}, {4, nc}}), staged.with_dims({{nc, 4}, {1, nc}}), engine);
}

void mx_quantize_software(Builder& b, const arch::ChipSpec& chip, const MxQuantizeSpec& s,
                          const Tensor& x, const Tensor& q, const Tensor& qs) {
  const num::MxFormat& f = num::mx_format(s.elem == DType::fp8_e4m3_x4   ? num::MxId::mxfp8_e4m3
                                          : s.elem == DType::fp8_e5m2_x4 ? num::MxId::mxfp8_e5m2
                                                                         : num::MxId::mxfp4);
  const num::MxScaleRule rule = num::mx_scale_rule(f, s.policy);
  const bool fp4 = s.elem == DType::fp4_e2m1_x4;
  // The element type the Vector engine rounds into (MXFP4: FP32, rounded
  // by the integer steps).
  const DType elem = s.elem == DType::fp8_e5m2_x4 ? DType::fp8_e5m2 : DType::fp8_e4m3;
  const int P = chip.sbuf_partitions;
  const std::int64_t TKL = 4 * P, kChunk = P;         // columns per transpose chunk
  const std::int64_t TC = output_tile_columns(chip);  // columns per tile: one PSUM bank
  const std::int64_t kChunks = (TC + kChunk - 1) / kChunk;
  const int kGroups = P / 8;
  const std::int64_t TW = kChunks * kGroups;  // transposed scale columns per tile
  const float frac_max = static_cast<float>(rule.max_frac >> 16);  // BF16 keeps 7 fraction bits
  constexpr int kLoad = 4, kPs = 2, kPerCore = 3;
  const auto per_core = mx_tiles(s.k, s.cols, TKL, TC, s.cores, kPerCore);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    // I [P, P] FP32 for the broadcasting matmuls, and a zero to copy from.
    const Tensor ident = b.sbuf(P, P, DType::fp32), zero = b.sbuf(P, 1, DType::fp32);
    b.iota(ident, 0.0f, -1.0f, 1.0f);
    b.tensor_scalar(ident, ident, AluOp::is_equal, 0.0f, AluOp::bypass, 0.0f, Engine::gpsimd);
    b.memset(zero, 0.0f, Engine::gpsimd);
    // Per slot (tiles in flight): the loaded tile, its output and the
    // temporaries of steps 1-3; MXFP4's FP32 temporaries in two sets.
    struct Slot {
      Tensor src, out, sc, ab, m2, m4, t8, t4, t2, am, ex, code, mi, nan, tmp;
    };
    Slot slots[kLoad];
    for (Slot& sl : slots) {
      sl.src = b.sbuf(P, 4 * TC, DType::bf16);
      sl.out = b.sbuf(P, TC, s.elem);
      sl.sc = b.sbuf(kGroups, TC, DType::uint8);
      sl.ab = b.sbuf(P, 4 * TC, DType::uint16), sl.m2 = b.sbuf(P, 2 * TC, DType::uint16);
      sl.m4 = b.sbuf(P, TC, DType::fp32), sl.t8 = b.sbuf(P, kChunks * P, DType::fp32);
      sl.t4 = b.sbuf(P, TW * 4, DType::fp32), sl.t2 = b.sbuf(P, TW * 2, DType::fp32);
      sl.am = b.sbuf(P, TW, DType::int32), sl.ex = b.sbuf(P, TW, DType::int32);
      sl.code = b.sbuf(P, TW, DType::fp32), sl.mi = b.sbuf(P, TW, DType::int32);
      sl.nan = b.sbuf(P, TW, DType::fp32), sl.tmp = b.sbuf(P, TW, DType::int32);
    }
    struct Fp4Set {
      Tensor sign, a, t1, t2, t3, pred;
    };
    Fp4Set fsets[2];
    if (fp4)
      for (Fp4Set& fs : fsets) {
        fs.sign = b.sbuf(P, 4 * TC, DType::uint8), fs.a = b.sbuf(P, 4 * TC, DType::fp32);
        fs.t1 = b.sbuf(P, 4 * TC, DType::int32), fs.t2 = b.sbuf(P, 4 * TC, DType::int32);
        fs.t3 = b.sbuf(P, 4 * TC, DType::int32), fs.pred = b.sbuf(P, 4 * TC, DType::uint8);
      }
    Tensor psT[kPs], psS[kPs], psM[kPs], psN[kPs];
    for (int i = 0; i < kPs; ++i) {
      psT[i] = b.psum(P, kChunks * kChunk, DType::fp32);
      psS[i] = b.psum(kGroups, TC, DType::fp32);
      psM[i] = b.psum(P, TC, DType::fp32);
      psN[i] = b.psum(P, TC, DType::fp32);
    }
    // The tiles of this core, run as a three-stage software pipeline (load
    // and step 1 of tile t + 2, steps 2-3 of tile t + 1, steps 4-5 of tile
    // t): each stage is a chain across engines, and each engine runs its
    // stream in order, so the stages of one iteration must not depend on
    // each other.
    const std::vector<MxTile>& tiles = per_core[static_cast<std::size_t>(core)];
    auto stage_a1 = [&](std::size_t t) {
      const auto [k0, c0, nc, parts] = tiles[t];
      const Slot& sl = slots[t % kLoad];
      const Tensor v = sl.src.tile(0, parts, 0, 4 * nc);
      const Tensor &ab = sl.ab, &m2 = sl.m2, &m4 = sl.m4;
      load_mx_source(b, v, x, s.trans, k0, c0, parts, nc);
      // 1. |x| bits, max of each 4 (GpSimd).
      const Tensor abv = ab.tile(0, parts, 0, 4 * nc), m2v = m2.tile(0, parts, 0, 2 * nc);
      const Tensor m4v = m4.tile(0, parts, 0, nc);
      b.tensor_scalar(abv, bytes_as(v, DType::uint16), AluOp::bitwise_and, 0x7FFF, AluOp::bypass,
                      0.0f, Engine::scalar);
      // abv is j-major ([4][nc]): rows j = 0, 1 against 2, 3, then the halves.
      b.tensor_tensor(m2v, abv.with_dims({{2 * nc, 2}, {1, nc}}),
                      abv.with_dims({{2 * nc, 2}, {1, nc}}, nc), AluOp::max, Engine::gpsimd);
      b.tensor_tensor(m4v, m2v.tile(0, parts, 0, nc), m2v.tile(0, parts, nc, nc), AluOp::max,
                      Engine::gpsimd);
    };
    auto stage_a2 = [&](std::size_t t) {
      const auto [k0, c0, nc, parts] = tiles[t];
      const int G = parts / 8;
      const Slot& sl = slots[t % kLoad];
      const Tensor pT = psT[t % kPs];
      const std::int64_t chunks = (nc + kChunk - 1) / kChunk;
      const Tensor m4v = sl.m4.tile(0, parts, 0, nc);
      const Tensor &t8 = sl.t8, &t4 = sl.t4, &t2 = sl.t2;
      const Tensor &am = sl.am, &ex = sl.ex, &code = sl.code, &mi = sl.mi, &nan = sl.nan;
      const Tensor& tmp = sl.tmp;
      // 2. Per chunk: transpose, max over each block's 8 partitions.
      b.memset(am, 0.0f, Engine::gpsimd);  // blocks a short tile lacks stay defined
      // Full chunks (128 columns) share one copy and one max tree; a short
      // last chunk gets its own.
      const std::int64_t full = nc / kChunk;
      for (std::int64_t ch = 0; ch < chunks; ++ch)
        b.transpose(
            pT.tile(0, static_cast<int>(std::min(kChunk, nc - ch * kChunk)), ch * kChunk, parts),
            m4v.tile(0, parts, ch * kChunk, std::min(kChunk, nc - ch * kChunk)));
      auto tree = [&](std::int64_t ch0, std::int64_t n, int w) {
        // pT columns [ch * 128, ch * 128 + parts) of chunks ch0 .. ch0 + n.
        const Tensor tt = t8.tile(0, w, 0, n * parts);
        b.tensor_copy(tt, pT.tile(0, w, 0, 1).with_dims({{kChunk, n}, {1, parts}}, ch0 * kChunk),
                      Engine::scalar);  // one tensor_tensor input may be PSUM
        const std::int64_t g = n * G;
        const Tensor t4v = t4.tile(0, w, 0, 4 * g), t2v = t2.tile(0, w, 0, 2 * g);
        b.tensor_tensor(t4v, tt.with_dims({{8, g}, {1, 4}}), tt.with_dims({{8, g}, {1, 4}}, 4),
                        AluOp::max);
        b.tensor_tensor(t2v, t4v.with_dims({{4, g}, {1, 2}}), t4v.with_dims({{4, g}, {1, 2}}, 2),
                        AluOp::max);
        b.tensor_tensor(am.tile(0, w, 0, 1).with_dims({{kGroups, n}, {1, G}}, ch0 * kGroups),
                        t2v.with_dims({{2 * G, n}, {2, G}}), t2v.with_dims({{2 * G, n}, {2, G}}, 1),
                        AluOp::max);
      };
      if (full > 0) tree(0, full, static_cast<int>(kChunk));
      if (chunks > full) tree(full, 1, static_cast<int>(nc - full * kChunk));
      // 3. Scale codes, multipliers and NaN flags, [columns, blocks].
      b.tensor_scalar(ex, am, AluOp::shift_right, 7.0f, AluOp::bypass, 0.0f, Engine::gpsimd);
      if (rule.rceil) {
        b.tensor_scalar(tmp, am, AluOp::bitwise_and, 0x7F, AluOp::is_gt, frac_max, Engine::gpsimd);
        b.tensor_tensor(tmp, ex, tmp, AluOp::add, Engine::gpsimd);
        b.tensor_scalar(tmp, tmp, AluOp::subtract, static_cast<float>(rule.offset), AluOp::max,
                        0.0f, Engine::gpsimd);
      } else {
        b.tensor_scalar(tmp, ex, AluOp::subtract, static_cast<float>(rule.offset), AluOp::max, 0.0f,
                        Engine::gpsimd);
      }
      b.tensor_scalar(ex, ex, AluOp::is_equal, 255.0f, AluOp::multiply, 255.0f, Engine::gpsimd);
      b.tensor_tensor(code, tmp, ex, AluOp::max, Engine::gpsimd);
      b.tensor_scalar(mi, code, AluOp::multiply, -1.0f, AluOp::add, 254.0f, Engine::scalar);
      // A NaN block's code 255 would give 2^128 (Inf): any finite value
      // keeps the broadcast matmul finite (its elements are zeroed).
      b.tensor_scalar(mi, mi, AluOp::max, 1.0f, AluOp::shift_left, 23.0f, Engine::gpsimd);
      b.tensor_scalar(nan, code, AluOp::is_equal, 255.0f, AluOp::bypass, 0.0f, Engine::scalar);
    };
    auto stage_b = [&](std::size_t t) {
      const auto [k0, c0, nc, parts] = tiles[t];
      const int G = parts / 8;
      const std::int64_t chunks = (nc + kChunk - 1) / kChunk;
      const Slot& sl = slots[t % kLoad];
      const Fp4Set& fs = fsets[t % 2];
      const Tensor v = sl.src.tile(0, parts, 0, 4 * nc);
      const Tensor &code = sl.code, &mi = sl.mi, &nan = sl.nan;
      const Tensor pS = psS[t % kPs], pM = psM[t % kPs], pN = psN[t % kPs];
      // 4. Codes back to [blocks, columns]; multiplier and flag broadcast.
      const Tensor mf = bytes_as(mi, DType::fp32);
      for (std::int64_t ch = 0; ch < chunks; ++ch) {
        const int w = static_cast<int>(std::min(kChunk, nc - ch * kChunk));
        const std::int64_t g0 = ch * kGroups;
        b.transpose(pS.tile(0, G, ch * kChunk, w), code.tile(0, w, g0, G));
        const Tensor id = ident.tile(0, w, 0, w);
        b.matmul(pM.tile(0, parts, ch * kChunk, w),
                 mf.tile(0, w, 0, 1).with_dims({{1, G}, {0, 8}}, g0), id, false);
        b.matmul(pN.tile(0, parts, ch * kChunk, w),
                 nan.tile(0, w, 0, 1).with_dims({{1, G}, {0, 8}}, g0), id, false);
      }
      const Tensor scv = sl.sc.tile(0, G, 0, nc);
      b.tensor_copy(scv, pS.tile(0, G, 0, nc), Engine::scalar);
      b.dma_copy(qs.tile(static_cast<int>(k0 / 32), G, c0, nc), scv, -1, false, Engine::scalar);
      // 5. Elements.
      const Tensor mult = pM.tile(0, parts, 0, nc).with_dims({{1, nc}, {0, 4}});
      const Tensor o = sl.out.tile(0, parts, 0, nc);
      if (!fp4) {
        // j outer, c inner: the source is read contiguously (j-major) and
        // the FP8 output written with a 4-byte stride, so no operand pays
        // the strided rate (the x4 order as the inner loop would stride the
        // source by nc elements).
        const Tensor e = bytes_as(o, elem).with_dims({{1, 4}, {4, nc}});
        const Tensor mj = pM.tile(0, parts, 0, nc).with_dims({{0, 4}, {1, nc}});
        b.tensor_tensor(e, v.with_dims({{nc, 4}, {1, nc}}), mj, AluOp::multiply);
        b.copy_predicated(e, pN.tile(0, parts, 0, nc).with_dims({{0, 4}, {1, nc}}),
                          zero.tile(0, parts, 0, 1).with_dims({{0, 4}, {0, nc}}));
      } else {
        const Tensor sg = fs.sign.tile(0, parts, 0, 4 * nc), av = fs.a.tile(0, parts, 0, 4 * nc);
        const Tensor ai = bytes_as(av, DType::int32), lsb = fs.t1.tile(0, parts, 0, 4 * nc);
        const Tensor n = fs.t2.tile(0, parts, 0, 4 * nc), sub = fs.t3.tile(0, parts, 0, 4 * nc);
        const Tensor pr = fs.pred.tile(0, parts, 0, 4 * nc);
        // |y| = |x| * 2^-k from step 1's |x| bits; the sign from x's bits.
        const Tensor ax = bytes_as(sl.ab.tile(0, parts, 0, 4 * nc), DType::bf16);
        b.tensor_tensor(av.with_dims({{4, nc}, {1, 4}}), mx_interleaved(ax, nc), mult,
                        AluOp::multiply);
        b.tensor_scalar(sg, mx_interleaved(bytes_as(v, DType::uint16), nc), AluOp::shift_right,
                        15.0f, AluOp::shift_left, 3.0f, Engine::scalar);
        b.tensor_scalar(lsb, ai, AluOp::shift_right, 22.0f, AluOp::bitwise_and, 1.0f,
                        Engine::gpsimd);
        b.tensor_tensor(n, ai, lsb, AluOp::add, Engine::gpsimd);
        b.tensor_scalar(n, n, AluOp::add, 0x1FFFFF, AluOp::shift_right, 22.0f, Engine::scalar);
        b.tensor_scalar(n, n, AluOp::subtract, 252.0f, AluOp::min, 7.0f, Engine::scalar);
        b.tensor_scalar(sub, av, AluOp::multiply, 2.0f, AluOp::bypass, 0.0f, Engine::scalar);
        b.tensor_scalar(pr, av, AluOp::is_lt, 1.0f, AluOp::bypass, 0.0f, Engine::gpsimd);
        b.select(n, pr, sub, n);
        b.tensor_tensor(n, n, sg, AluOp::bitwise_or);
        // Pack: element c = code 4c | code 4c+1 << 4 | ... << 12.
        const Tensor pk = bytes_as(o, DType::uint16);
        for (int j = 1; j < 4; ++j)
          b.tensor_scalar(lane(sub, nc, 4, j), lane(n, nc, 4, j), AluOp::shift_left,
                          static_cast<float>(4 * j), AluOp::bypass, 0.0f,
                          j == 2 ? Engine::scalar : Engine::vector);
        b.tensor_tensor(pk, lane(n, nc, 4, 0), lane(sub, nc, 4, 1), AluOp::bitwise_or);
        b.tensor_tensor(pk, pk, lane(sub, nc, 4, 2), AluOp::bitwise_or, Engine::gpsimd);
        b.tensor_tensor(pk, pk, lane(sub, nc, 4, 3), AluOp::bitwise_or);
        b.copy_predicated(pk, pN.tile(0, parts, 0, nc),
                          zero.tile(0, parts, 0, 1).with_dims({{0, nc}}));
      }
      b.dma_copy(q.tile(static_cast<int>(k0 / 4), parts, c0, nc), o, -1, false, Engine::vector);
    };
    const std::size_t nt = tiles.size();
    for (std::size_t t = 0; t < nt + 2; ++t) {
      if (t < nt) stage_a1(t);
      if (t >= 1 && t - 1 < nt) stage_a2(t - 1);
      if (t >= 2) stage_b(t - 2);
    }
  }
}

}  // namespace tern::kernel::detail
