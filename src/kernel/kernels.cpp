#include "kernel/kernels.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kernel/builder.h"
#include "util/error.h"

namespace tern::kernel {

using isa::DType;
using isa::Engine;

namespace {
std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}
}  // namespace

Epilogue parse_epilogue(const std::string& text) {
  Epilogue e;
  std::size_t at = 0;
  while (at <= text.size() && !text.empty()) {
    const std::size_t comma = text.find(',', at);
    const std::string item =
        text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (item == "bias") {
      e.bias = true;
    } else if (item == "residual") {
      e.residual = true;
    } else if (item.rfind("scale=", 0) == 0) {
      try {
        e.scale = std::stof(item.substr(6));
      } catch (const std::exception&) {
        throw Error(fmt::format("epilogue '{}': expected scale=<number>", item));
      }
    } else if (!item.empty()) {
      try {
        e.act = isa::parse_act(item);
      } catch (const Error&) {
        throw Error(
            fmt::format("epilogue step '{}': expected scale=<x>, bias, residual or an activation "
                        "(gelu, gelu_tanh, silu, relu, ...)",
                        item));
      }
    }
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return e;
}

std::string to_string(const Epilogue& e) {
  std::string s;
  auto add = [&](const std::string& x) { s += (s.empty() ? "" : ",") + x; };
  if (e.scale != 1.0f) add(fmt::format("scale={}", e.scale));
  if (e.bias) add("bias");
  if (e.act != isa::ActFunc::identity) add(std::string(isa::act_name(e.act)));
  if (e.residual) add("residual");
  return s.empty() ? "none" : s;
}

std::vector<Epilogue> unfused_steps(const Epilogue& e) {
  std::vector<Epilogue> steps;
  const bool act = e.act != isa::ActFunc::identity;
  if (e.bias) {
    steps.push_back({e.scale, true, isa::ActFunc::identity, false});
    if (act) steps.push_back({1.0f, false, e.act, false});
  } else if (e.scale != 1.0f || act) {
    steps.push_back({e.scale, false, e.act, false});
  }
  if (e.residual) steps.push_back({1.0f, false, isa::ActFunc::identity, true});
  return steps;
}

namespace {

// The fp32 scratch and staging tiles one output slot needs for the epilogue.
struct EvacTiles {
  Tensor t32, residual;
};

// Applies the epilogue to tile `src` ([tm, tn], PSUM or SBUF) and writes the
// result, cast, into `o`; returns the engine of the last step (it triggers
// the store). `bias` is the broadcast [tm, tn] bias view, `residual_hbm` the
// residual tile in HBM.
Engine evacuate(Builder& b, const Epilogue& e, const Tensor& src, const Tensor& o,
                const EvacTiles& tiles, const Tensor* bias, const Tensor* residual_hbm,
                Engine plain) {
  if (!e.any()) {
    b.tensor_copy(o, src, plain);
    return plain;
  }
  const int tm = src.rows();
  const std::int64_t tn = src.cols();
  const Tensor t32 = tiles.t32.tile(0, tm, 0, tn);
  // With a bias the scale and the activation are separate steps around it;
  // without, one Scalar activation computes act(scale * x).
  enum class Step { scale, scale_act, add_bias, act, add_residual };
  std::vector<Step> steps;
  if (e.bias) {
    if (e.scale != 1.0f) steps.push_back(Step::scale);
    steps.push_back(Step::add_bias);
    if (e.act != isa::ActFunc::identity) steps.push_back(Step::act);
  } else if (e.scale != 1.0f || e.act != isa::ActFunc::identity) {
    steps.push_back(Step::scale_act);
  }
  Tensor res;
  if (e.residual) {
    res = tiles.residual.tile(0, tm, 0, tn);
    b.dma_copy(res, *residual_hbm);
    steps.push_back(Step::add_residual);
  }
  Tensor x = src;
  Engine last = plain;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Tensor dst = i + 1 == steps.size() ? o : t32;
    switch (steps[i]) {
      case Step::scale:
        b.tensor_scalar(dst, x, isa::AluOp::multiply, e.scale, isa::AluOp::bypass, 0.0f,
                        Engine::vector);
        last = Engine::vector;
        break;
      case Step::scale_act:
        b.activation(dst, e.act, x, nullptr, e.scale);
        last = Engine::scalar;
        break;
      case Step::add_bias:
        b.tensor_tensor(dst, x, bias->tile(0, tm, 0, tn), isa::AluOp::add, Engine::vector);
        last = Engine::vector;
        break;
      case Step::act:
        b.activation(dst, e.act, x);
        last = Engine::scalar;
        break;
      case Step::add_residual:
        b.tensor_tensor(dst, x, res, isa::AluOp::add, Engine::vector);
        last = Engine::vector;
        break;
    }
    x = dst;
  }
  return last;
}

// The HBM inputs the epilogue reads: "bias" [1, N] and "residual" [M, N]
// (fp32), declared only when used.
std::pair<Tensor, Tensor> epilogue_inputs(Builder& b, const Epilogue& e, std::int64_t m,
                                          std::int64_t n) {
  Tensor bias, residual;
  if (e.bias) bias = b.hbm("bias", {1, n}, DType::fp32, isa::TensorKind::input);
  if (e.residual) residual = b.hbm("residual", {m, n}, DType::fp32, isa::TensorKind::input);
  return {bias, residual};
}

// A matmul's output side: PSUM tiles, output tiles and, with an epilogue,
// its FP32 scratch per output slot and two bias rows (double-buffered).
struct OutputSlots {
  static constexpr int kPsum = 4, kOut = 4;
  std::vector<Tensor> ps, outs;
  std::vector<EvacTiles> evac;
  Tensor bias[2];
};
OutputSlots output_slots(Builder& b, const Epilogue& e, DType out, std::int64_t tm,
                         std::int64_t tn) {
  OutputSlots o;
  const int rows = static_cast<int>(tm);
  for (int i = 0; i < OutputSlots::kPsum; ++i) o.ps.push_back(b.psum(rows, tn, DType::fp32));
  for (int i = 0; i < OutputSlots::kOut; ++i) o.outs.push_back(b.sbuf(rows, tn, out));
  o.evac.resize(OutputSlots::kOut);
  if (e.any()) {
    for (auto& t : o.evac) {
      t.t32 = b.sbuf(rows, tn, DType::fp32);
      if (e.residual) t.residual = b.sbuf(rows, tn, DType::fp32);
    }
    if (e.bias)
      for (auto& t : o.bias) t = b.sbuf(rows, tn, DType::fp32);
  }
  return o;
}

// SBUF bytes per partition output_slots adds for the epilogue.
std::int64_t epilogue_sbuf_bytes(const Epilogue& e, std::int64_t tn) {
  if (!e.any()) return 0;
  return (OutputSlots::kOut * (e.residual ? 2 : 1) + (e.bias ? 2 : 0)) * tn * 4;
}

// The [rows, n] HBM bias row seen by every partition (row stride 0).
Tensor bias_rows(const Tensor& bias, int rows, std::int64_t n0, std::int64_t n) {
  Tensor v = bias;
  v.ap.offset += n0 * isa::size_bytes(bias.dtype());
  v.ap.dims = {{0, rows}, {1, n}};
  v.ap.partitions = rows;
  return v;
}

}  // namespace

namespace {

// HBM view of a [K, C] row-major tensor as MX source rows: partition p of
// the result holds, for each column c, the 4 values of rows k0 + 4p + j.
Tensor interleave4(const Tensor& t, std::int64_t k0, int parts, std::int64_t c0, std::int64_t nc) {
  const std::int64_t cols = t.cols();
  Tensor v = t;
  v.ap.offset += (k0 * cols + c0) * isa::size_bytes(t.dtype());
  v.ap.dims = {{4 * cols, parts}, {1, nc}, {cols, 4}};
  v.ap.partitions = parts;
  return v;
}

isa::Program mx_matmul_kernel(const arch::ChipSpec& chip, const MatmulSpec& s) {
  if (chip.core_version < 4) {
    throw NotSupported(fmt::format("MX matmul on {} ({}): MXFP8 needs NeuronCore-v4", chip.name,
                                   chip.core_generation));
  }
  if (s.k % 128 != 0) {
    throw NotSupported(fmt::format("MX matmul with K = {}: K must be a multiple of 128", s.k));
  }
  Builder b(chip, s.cores, s.lnc);
  const Tensor at = b.hbm("at", {s.k, s.m}, DType::bf16, isa::TensorKind::input);
  const Tensor bt = b.hbm("b", {s.k, s.n}, DType::bf16, isa::TensorKind::input);
  const Tensor ct = b.hbm("c", {s.m, s.n}, s.out, isa::TensorKind::output);
  const Epilogue& ep = s.epilogue;
  const auto [bias_h, residual_h] = epilogue_inputs(b, ep, s.m, s.n);
  const std::int64_t P = chip.tensor.rows;  // packed partitions per instruction
  const std::int64_t TKL = 4 * P;           // logical contraction per instruction
  const std::int64_t TM = chip.tensor.stationary_fmax;
  const std::int64_t TN =
      std::min<std::int64_t>(chip.tensor.moving_fmax, chip.psum_bank_bytes().value() / 4);
  const std::int64_t KT = ceil_div(s.k, TKL);
  const std::int64_t budget = chip.sbuf_partition_bytes.value();
  // Per partition: all of A quantized (4 B x M per k tile, + 1 B scales), two
  // sets of one B column tile (4 B x TN, + scales), staging and outputs.
  const std::int64_t need = KT * (5 * s.m + 2 * 5 * TN) + 4 * (4 * TM * 2 + 4 * TN * 2) +
                            4 * TN * 4 + epilogue_sbuf_bytes(ep, TN);
  if (need > budget) {
    throw NotSupported(
        fmt::format("MX matmul with M = {}, K = {}: the quantized A ({} bytes per partition) "
                    "does not fit SBUF in one pass (budget {})",
                    s.m, s.k, need, budget));
  }
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    // This core's rows of C: M tiles core, core + cores, ...
    std::vector<Tensor> aq(KT), as(KT), bq[2], bs[2];
    for (std::int64_t kt = 0; kt < KT; ++kt) {
      const int parts = static_cast<int>(std::min(TKL, s.k - kt * TKL) / 4);
      aq[kt] = b.sbuf(parts, s.m, s.in);
      as[kt] = b.sbuf(parts / 8, s.m, DType::uint8);
      for (int i = 0; i < 2; ++i) {
        bq[i].push_back(b.sbuf(parts, TN, s.in));
        bs[i].push_back(b.sbuf(parts / 8, TN, DType::uint8));
      }
    }
    // Staging for the BF16 sources: enough buffers that DMA latency hides
    // behind quantization.
    constexpr int kStage = 4;
    std::vector<Tensor> a_src, b_src;
    for (int i = 0; i < kStage; ++i) {
      a_src.push_back(b.sbuf(static_cast<int>(P), 4 * TM, DType::bf16));
      b_src.push_back(b.sbuf(static_cast<int>(P), 4 * TN, DType::bf16));
    }

    OutputSlots slots = output_slots(b, ep, s.out, TM, TN);
    auto& [ps, outs, evac_tiles, bias_sets] = slots;
    constexpr int kPsum = OutputSlots::kPsum, kOut = OutputSlots::kOut;
    int si = 0, pi = 0, oi = 0, set = 0;
    // Loads columns [c0, c0 + nc) of a BF16 [K, C] HBM tensor K tile by K
    // tile through the staging buffers and quantizes them into columns
    // [q0, q0 + nc) of the x4 tiles q and their scales qs.
    auto quantize_columns = [&](const Tensor& hbm, std::vector<Tensor>& stage, std::int64_t c0,
                                std::int64_t nc, std::vector<Tensor>& q, std::vector<Tensor>& qs,
                                std::int64_t q0) {
      for (std::int64_t kt = 0; kt < KT; ++kt) {
        const int parts = static_cast<int>(std::min(TKL, s.k - kt * TKL) / 4);
        const Tensor src = stage[si].tile(0, parts, 0, 4 * nc);
        si = (si + 1) % kStage;
        b.dma_copy(src, interleave4(hbm, kt * TKL, parts, c0, nc));
        b.quantize_mx(q[kt].tile(0, parts, q0, nc), qs[kt].tile(0, parts / 8, q0, nc), src);
      }
    };
    // A's columns are quantized once, just before the first N tile uses them;
    // B column tiles one step ahead of the matmuls that use them
    // (double-buffered), so quantization overlaps the Tensor engine.
    auto prepare_a = [&](std::int64_t m0) {
      quantize_columns(at, a_src, m0, std::min(TM, s.m - m0), aq, as, m0);
    };
    auto prepare_b = [&](std::int64_t n0, int which) {
      quantize_columns(bt, b_src, n0, std::min(TN, s.n - n0), bq[which], bs[which], 0);
    };
    prepare_b(0, 0);
    for (std::int64_t n0 = 0; n0 < s.n; n0 += TN) {
      const std::int64_t tn = std::min(TN, s.n - n0);
      auto& q = bq[set];
      auto& qs = bs[set];
      if (n0 + TN < s.n) prepare_b(n0 + TN, set ^ 1);
      const Tensor* bias = nullptr;
      if (ep.bias) {
        const int rows = static_cast<int>(std::min(TM, s.m));
        b.dma_copy(bias_sets[set].tile(0, rows, 0, tn), bias_rows(bias_h, rows, n0, tn));
        bias = &bias_sets[set];
      }
      set ^= 1;
      for (std::int64_t m0 = core * TM; m0 < s.m; m0 += TM * s.cores) {
        if (n0 == 0) prepare_a(m0);
        const int tm = static_cast<int>(std::min(TM, s.m - m0));
        const Tensor p = ps[pi].tile(0, tm, 0, tn);
        pi = (pi + 1) % kPsum;
        for (std::int64_t kt = 0; kt < KT; ++kt) {
          const int parts = static_cast<int>(std::min(TKL, s.k - kt * TKL) / 4);
          b.matmul_mx(p, aq[kt].tile(0, parts, m0, tm), as[kt].tile(0, parts / 8, m0, tm),
                      q[kt].tile(0, parts, 0, tn), qs[kt].tile(0, parts / 8, 0, tn), kt > 0);
        }
        const Tensor o = outs[oi].tile(0, tm, 0, tn);
        const Tensor res_h =
            ep.residual ? residual_h.tile(static_cast<int>(m0), tm, n0, tn) : Tensor{};
        const Engine evac = evacuate(b, ep, p, o, evac_tiles[static_cast<std::size_t>(oi)], bias,
                                     &res_h, oi % 2 ? Engine::scalar : Engine::vector);
        oi = (oi + 1) % kOut;
        b.dma_copy(ct.tile(static_cast<int>(m0), tm, n0, tn), o, -1, false, evac);
      }
    }
  }
  return b.finish();
}

}  // namespace

isa::Program matmul_kernel(const arch::ChipSpec& chip, const MatmulSpec& s) {
  if (s.m < 1 || s.n < 1 || s.k < 1) {
    throw Error(fmt::format("matmul: M, N, K must be >= 1, got {} x {} x {}", s.m, s.n, s.k));
  }
  if (s.out != DType::fp32 && s.out != DType::bf16) {
    throw NotSupported(fmt::format("matmul with {} output (fp32 and bf16 are)", isa::name(s.out)));
  }
  if (s.in == DType::fp8_e4m3_x4 || s.in == DType::fp8_e5m2_x4) return mx_matmul_kernel(chip, s);
  const bool ok_in = s.in == DType::bf16 || s.in == DType::fp16 || s.in == DType::fp32 ||
                     s.in == DType::tf32 || isa::is_fp8(s.in);
  if (!ok_in) {
    throw NotSupported(fmt::format(
        "matmul with {} inputs (bf16, fp16, fp32, tf32, fp8 and MXFP8 x4 are)", isa::name(s.in)));
  }
  Builder b(chip, s.cores, s.lnc);
  const Tensor at = b.hbm("at", {s.k, s.m}, s.in, isa::TensorKind::input);
  const Tensor bt = b.hbm("b", {s.k, s.n}, s.in, isa::TensorKind::input);
  const Tensor ct = b.hbm("c", {s.m, s.n}, s.out, isa::TensorKind::output);
  const Epilogue& ep = s.epilogue;
  const auto [bias_h, residual_h] = epilogue_inputs(b, ep, s.m, s.n);

  const std::int64_t TK = chip.tensor.rows;             // contraction
  const std::int64_t TM = chip.tensor.stationary_fmax;  // output partitions
  const std::int64_t bank_fp32 = chip.psum_bank_bytes().value() / 4;
  const std::int64_t TN = std::min<std::int64_t>(chip.tensor.moving_fmax, bank_fp32);
  const std::int64_t KT = ceil_div(s.k, TK);
  const int esz = isa::size_bytes(s.in);
  // SBUF per partition: two A^T blocks (2 x KT x BM) + two B sets (2 x KT x TN) + outputs.
  const std::int64_t budget = chip.sbuf_partition_bytes.value() * 3 / 4;
  std::int64_t BM = std::min<std::int64_t>(4 * TM, ceil_div(s.m, TM) * TM);
  // Epilogue scratch: kOut fp32 tiles (+ kOut residual tiles) and two bias rows.
  const std::int64_t epi = epilogue_sbuf_bytes(ep, TN);
  auto need = [&](std::int64_t bm) { return KT * (2 * bm + 2 * TN) * esz + 4 * TN * 4 + epi; };
  while (BM > TM && need(BM) > budget) BM -= TM;
  if (need(BM) > budget) {
    throw NotSupported(
        fmt::format("matmul with K = {} at {}: the K dimension does not fit SBUF "
                    "in one pass ({} bytes per partition needed, budget {})",
                    s.k, isa::name(s.in), need(BM), budget));
  }
  const std::int64_t MB = ceil_div(s.m, BM);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    // K tiles are allocated in pairs side by side ([TK, 2 x width]) so that
    // an FP8 pair can feed one double-row matmul; a_sets[s][kt] is the half.
    std::vector<Tensor> a_sets[2], b_sets[2];
    for (auto& set : a_sets) set.resize(static_cast<std::size_t>(KT));
    for (auto& set : b_sets) set.resize(static_cast<std::size_t>(KT));
    for (std::int64_t kt = 0; kt < KT; kt += 2) {
      const int rows = static_cast<int>(std::min(TK, s.k - kt * TK));
      const bool pair = kt + 1 < KT;
      for (auto* sets : {a_sets, b_sets}) {
        const std::int64_t w = sets == a_sets ? BM : TN;
        for (int set = 0; set < 2; ++set) {
          const Tensor t = b.sbuf(rows, (pair ? 2 : 1) * w, s.in);
          sets[set][kt] = t.tile(0, rows, 0, w);
          if (pair)
            sets[set][kt + 1] =
                t.tile(0, static_cast<int>(std::min(TK, s.k - (kt + 1) * TK)), w, w);
        }
      }
    }
    // Double row (FP8, v3+): a pair of full K tiles in one instruction.
    const bool double_row = isa::is_fp8(s.in) && chip.core_version >= 3;
    auto pair_view = [](const Tensor& first, std::int64_t width, std::int64_t c0, std::int64_t n) {
      return first.with_dims({{width, 2}, {1, n}}, c0);
    };
    OutputSlots slots = output_slots(b, ep, s.out, TM, TN);
    auto& [ps, outs, evac_tiles, bias_sets] = slots;
    constexpr int kPsum = OutputSlots::kPsum, kOut = OutputSlots::kOut;
    // Steps (M block, N tile) in order; the loads of step i + 1 are issued
    // before the compute of step i, so the sync engine never blocks a
    // prefetch behind a store (software pipelining, double-buffered).
    struct Step {
      std::int64_t mb, n0;
      int a_set, b_set;
    };
    std::vector<Step> steps;
    for (std::int64_t mb = core; mb < MB; mb += s.cores) {
      for (std::int64_t n0 = 0; n0 < s.n; n0 += TN) {
        const int a_set = steps.empty() ? 0 : steps.back().a_set ^ (steps.back().mb != mb ? 1 : 0);
        steps.push_back({mb, n0, a_set, static_cast<int>(steps.size() % 2)});
      }
    }
    auto load = [&](std::size_t i) {
      const Step& st = steps[i];
      const std::int64_t m0 = st.mb * BM, bm = std::min(BM, s.m - m0);
      if (i == 0 || steps[i - 1].mb != st.mb) {
        for (std::int64_t kt = 0; kt < KT; ++kt) {
          const int tk = static_cast<int>(std::min(TK, s.k - kt * TK));
          b.dma_copy(a_sets[st.a_set][kt].tile(0, tk, 0, bm),
                     at.tile(static_cast<int>(kt * TK), tk, m0, bm));
        }
      }
      const std::int64_t tn = std::min(TN, s.n - st.n0);
      for (std::int64_t kt = 0; kt < KT; ++kt) {
        const int tk = static_cast<int>(std::min(TK, s.k - kt * TK));
        b.dma_copy(b_sets[st.b_set][kt].tile(0, tk, 0, tn),
                   bt.tile(static_cast<int>(kt * TK), tk, st.n0, tn));
      }
      if (ep.bias) {
        const int rows = static_cast<int>(std::min(TM, s.m));
        b.dma_copy(bias_sets[st.b_set].tile(0, rows, 0, tn), bias_rows(bias_h, rows, st.n0, tn));
      }
    };
    int pi = 0, oi = 0;
    if (!steps.empty()) load(0);
    for (std::size_t i = 0; i < steps.size(); ++i) {
      if (i + 1 < steps.size()) load(i + 1);
      const Step& st = steps[i];
      const std::int64_t m0 = st.mb * BM, bm = std::min(BM, s.m - m0);
      const std::int64_t tn = std::min(TN, s.n - st.n0);
      for (std::int64_t mi = 0; mi * TM < bm; ++mi) {
        const int tm = static_cast<int>(std::min(TM, bm - mi * TM));
        const Tensor p = ps[pi].tile(0, tm, 0, tn);
        pi = (pi + 1) % kPsum;
        for (std::int64_t kt = 0; kt < KT; ++kt) {
          const int tk = static_cast<int>(std::min(TK, s.k - kt * TK));
          if (double_row && kt + 1 < KT && s.k - (kt + 1) * TK >= TK) {
            b.matmul(p, pair_view(a_sets[st.a_set][kt], BM, mi * TM, tm),
                     pair_view(b_sets[st.b_set][kt], TN, 0, tn), kt > 0, isa::PerfMode::double_row);
            ++kt;
            continue;
          }
          b.matmul(p, a_sets[st.a_set][kt].tile(0, tk, mi * TM, tm),
                   b_sets[st.b_set][kt].tile(0, tk, 0, tn), kt > 0);
        }
        const Tensor o = outs[oi].tile(0, tm, 0, tn);
        const int r0 = static_cast<int>(m0 + mi * TM);
        const Tensor res_h = ep.residual ? residual_h.tile(r0, tm, st.n0, tn) : Tensor{};
        // Alternate the PSUM evacuation between Vector and Scalar; the epilogue
        // (if any) runs in the evacuation.
        const Engine evac =
            evacuate(b, ep, p, o, evac_tiles[static_cast<std::size_t>(oi)], &bias_sets[st.b_set],
                     &res_h, oi % 2 ? Engine::scalar : Engine::vector);
        oi = (oi + 1) % kOut;
        // The evacuating engine triggers the store, so no load waits behind it.
        b.dma_copy(ct.tile(r0, tm, st.n0, tn), o, -1, false, evac);
      }
    }
  }
  return b.finish();
}

isa::Program epilogue_kernel(const arch::ChipSpec& chip, std::int64_t m, std::int64_t n,
                             const Epilogue& e, DType out) {
  if (m < 1 || n < 1) throw Error(fmt::format("epilogue: shape [{}, {}] must be >= 1", m, n));
  if (out != DType::fp32 && out != DType::bf16) {
    throw NotSupported(fmt::format("epilogue with {} output (fp32 and bf16 are)", isa::name(out)));
  }
  Builder b(chip);
  const Tensor x = b.hbm("x", {m, n}, DType::fp32, isa::TensorKind::input);
  const Tensor y = b.hbm("y", {m, n}, out, isa::TensorKind::output);
  const auto [bias_h, residual_h] = epilogue_inputs(b, e, m, n);
  // The same tile shape as the matmul's output tiles, double-buffered.
  const std::int64_t TP = chip.sbuf_partitions;
  const std::int64_t TF =
      std::min<std::int64_t>(chip.tensor.moving_fmax, chip.psum_bank_bytes().value() / 4);
  constexpr int kBuf = 2;
  Tensor xs[kBuf], os[kBuf], biases[kBuf];
  EvacTiles tiles[kBuf];
  for (int i = 0; i < kBuf; ++i) {
    xs[i] = b.sbuf(static_cast<int>(TP), TF, DType::fp32);
    os[i] = b.sbuf(static_cast<int>(TP), TF, out);
    tiles[i].t32 = b.sbuf(static_cast<int>(TP), TF, DType::fp32);
    if (e.residual) tiles[i].residual = b.sbuf(static_cast<int>(TP), TF, DType::fp32);
    if (e.bias) biases[i] = b.sbuf(static_cast<int>(TP), TF, DType::fp32);
  }
  int i = 0, cb = 0;
  for (std::int64_t c0 = 0; c0 < n; c0 += TF, cb ^= 1) {
    const std::int64_t tc = std::min(TF, n - c0);
    // The bias columns, once per column tile (double-buffered).
    const int br = static_cast<int>(std::min(TP, m));
    if (e.bias) b.dma_copy(biases[cb].tile(0, br, 0, tc), bias_rows(bias_h, br, c0, tc));
    for (std::int64_t r0 = 0; r0 < m; r0 += TP, i = (i + 1) % kBuf) {
      const int tr = static_cast<int>(std::min(TP, m - r0));
      const Tensor vx = xs[i].tile(0, tr, 0, tc), vo = os[i].tile(0, tr, 0, tc);
      b.dma_copy(vx, x.tile(static_cast<int>(r0), tr, c0, tc));
      const Tensor res_h =
          e.residual ? residual_h.tile(static_cast<int>(r0), tr, c0, tc) : Tensor{};
      const Engine last = evacuate(b, e, vx, vo, tiles[i], &biases[cb], &res_h, Engine::vector);
      b.dma_copy(y.tile(static_cast<int>(r0), tr, c0, tc), vo, -1, false, last);
    }
  }
  return b.finish();
}

namespace {

// The checks every norm kernel makes of its spec.
void check_norm(const char* name, const RmsNormSpec& s) {
  if (s.rows < 1 || s.dim < 1)
    throw Error(fmt::format("{}: shape [{}, {}] must be >= 1", name, s.rows, s.dim));
  if (s.dtype != DType::fp32 && s.dtype != DType::bf16 && s.dtype != DType::fp16)
    throw NotSupported(fmt::format("{} of {} (fp32, bf16, fp16 are)", name, isa::name(s.dtype)));
  if (!(s.eps >= 0.0f)) throw Error(fmt::format("{}: eps must be >= 0, got {}", name, s.eps));
}

// SBUF bytes per partition a norm kernel may plan for (a quarter stays free
// for the compiler's and runtime's own tiles).
std::int64_t norm_budget(const arch::ChipSpec& chip) {
  return chip.sbuf_partition_bytes.value() * 3 / 4;
}

// Throws "not supported" when a row of the norm does not fit SBUF.
void check_fits(const arch::ChipSpec& chip, const char* name, const RmsNormSpec& s,
                std::int64_t need) {
  if (need > norm_budget(chip)) {
    throw NotSupported(fmt::format(
        "{} with D = {} at {}: a row does not fit SBUF ({} bytes per partition needed, budget {})",
        name, s.dim, isa::name(s.dtype), need, norm_budget(chip)));
  }
}

// h = x + residual for the [n, D] tile `hx` (rows r0.. of the HBM tensors),
// in the input dtype (what the residual stream holds), into `hx`, using
// `staging` for the residual; the columns split between GpSimd and Vector;
// h is stored to `h_hbm`.
void add_residual(Builder& b, const Tensor& hx, const Tensor& staging, const Tensor& res_hbm,
                  const Tensor& h_hbm, int r0) {
  const int n = hx.rows();
  const std::int64_t D = hx.cols(), half = D / 2;
  b.dma_copy(staging, res_hbm.tile(r0, n, 0, D));
  if (half > 0)
    b.tensor_tensor(hx.tile(0, n, 0, half), hx.tile(0, n, 0, half), staging.tile(0, n, 0, half),
                    isa::AluOp::add, Engine::gpsimd);
  b.tensor_tensor(hx.tile(0, n, half, D - half), hx.tile(0, n, half, D - half),
                  staging.tile(0, n, half, D - half), isa::AluOp::add, Engine::vector);
  b.dma_copy(h_hbm.tile(r0, n, 0, D), hx, -1, false, Engine::vector);
}

}  // namespace

isa::Program rmsnorm_kernel(const arch::ChipSpec& chip, const RmsNormSpec& s) {
  check_norm("rmsnorm", s);
  Builder b(chip, s.cores);
  const std::int64_t R = s.rows, D = s.dim;
  const Tensor x = b.hbm("x", {R, D}, s.dtype, isa::TensorKind::input);
  const Tensor gamma = b.hbm("gamma", {1, D}, s.dtype, isa::TensorKind::input);
  Tensor res, h;
  if (s.residual) res = b.hbm("residual", {R, D}, s.dtype, isa::TensorKind::input);
  const Tensor y = b.hbm("y", {R, D}, s.dtype, isa::TensorKind::output);
  const Tensor rstd_h = b.hbm("rstd", {R, 1}, DType::fp32, isa::TensorKind::output);
  if (s.residual) h = b.hbm("h", {R, D}, s.dtype, isa::TensorKind::output);
  const std::int64_t P = chip.sbuf_partitions;
  const int esz = isa::size_bytes(s.dtype);
  // Per partition: gamma, and per buffer x (residual), y and the squares in
  // the dtype, one FP32 row (h * gamma) and small columns.
  // Three buffers when they fit (a load, a compute and a store in flight),
  // else two.
  constexpr int kMaxBuf = 3;
  auto need = [&](int bufs) {
    return D * esz + bufs * (D * esz * (s.residual ? 4 : 3) + D * 4 + 16);
  };
  const int bufs = need(kMaxBuf) <= norm_budget(chip) ? kMaxBuf : 2;
  check_fits(chip, "rmsnorm", s, need(bufs));
  const std::int64_t tiles = ceil_div(R, P);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    const int gp = static_cast<int>(std::min(P, R));
    const Tensor g = b.sbuf(gp, D, s.dtype);
    b.dma_copy(g, bias_rows(gamma, gp, 0, D));
    const Tensor eps = b.sbuf(gp, 1, DType::fp32);
    b.memset(eps, s.eps, Engine::gpsimd);
    Tensor xs[kMaxBuf], rs[kMaxBuf], ys[kMaxBuf], sq[kMaxBuf], y32[kMaxBuf], ss[kMaxBuf],
        rstd[kMaxBuf];
    for (int i = 0; i < bufs; ++i) {
      xs[i] = b.sbuf(static_cast<int>(P), D, s.dtype);
      if (s.residual) rs[i] = b.sbuf(static_cast<int>(P), D, s.dtype);
      ys[i] = b.sbuf(static_cast<int>(P), D, s.dtype);
      sq[i] = b.sbuf(static_cast<int>(P), D, s.dtype);  // only the row sums are used
      y32[i] = b.sbuf(static_cast<int>(P), D, DType::fp32);
      ss[i] = b.sbuf(static_cast<int>(P), 1, DType::fp32);
      rstd[i] = b.sbuf(static_cast<int>(P), 1, DType::fp32);
    }
    int i = 0;
    for (std::int64_t t = core; t < tiles; t += s.cores, i = (i + 1) % bufs) {
      const int r0 = static_cast<int>(t * P), n = static_cast<int>(std::min(P, R - t * P));
      const Tensor hx = xs[i].tile(0, n, 0, D);
      b.dma_copy(hx, x.tile(r0, n, 0, D));
      if (s.residual) add_residual(b, hx, rs[i].tile(0, n, 0, D), res, h, r0);
      // Three engines, one pass each, pipelined across tiles:
      //   Scalar: the sum of squares (its row accumulator), then
      //           rstd = rsqrt(sum / D + eps) in one more instruction;
      //   Vector: t = h * gamma (exact in FP32 for bf16 / fp16 inputs);
      //   GpSimd: y = t * rstd (a per-partition column operand), cast.
      const Tensor sum = ss[i].tile(0, n, 0, 1), rs_col = rstd[i].tile(0, n, 0, 1);
      b.activation(sq[i].tile(0, n, 0, D), isa::ActFunc::square, hx, nullptr, 1.0f, &sum);
      const Tensor eps_n = eps.tile(0, n, 0, 1);
      b.activation(rs_col, isa::ActFunc::rsqrt, sum, &eps_n, 1.0f / static_cast<float>(D));
      b.dma_copy(rstd_h.tile(r0, n, 0, 1), rs_col, -1, false, Engine::scalar);
      const Tensor tf = y32[i].tile(0, n, 0, D), yo = ys[i].tile(0, n, 0, D);
      b.tensor_tensor(tf, hx, g.tile(0, n, 0, D), isa::AluOp::multiply, Engine::vector);
      b.tensor_scalar(yo, tf, isa::AluOp::multiply, rs_col, isa::AluOp::bypass, 0.0f, nullptr,
                      Engine::gpsimd);
      b.dma_copy(y.tile(r0, n, 0, D), yo, -1, false, Engine::gpsimd);
    }
  }
  return b.finish();
}

isa::Program layernorm_kernel(const arch::ChipSpec& chip, const RmsNormSpec& s) {
  check_norm("layernorm", s);
  Builder b(chip, s.cores);
  const std::int64_t R = s.rows, D = s.dim;
  const Tensor x = b.hbm("x", {R, D}, s.dtype, isa::TensorKind::input);
  const Tensor gamma = b.hbm("gamma", {1, D}, s.dtype, isa::TensorKind::input);
  const Tensor beta = b.hbm("beta", {1, D}, s.dtype, isa::TensorKind::input);
  Tensor res, h;
  if (s.residual) res = b.hbm("residual", {R, D}, s.dtype, isa::TensorKind::input);
  const Tensor y = b.hbm("y", {R, D}, s.dtype, isa::TensorKind::output);
  const Tensor mean_h = b.hbm("mean", {R, 1}, DType::fp32, isa::TensorKind::output);
  const Tensor rstd_h = b.hbm("rstd", {R, 1}, DType::fp32, isa::TensorKind::output);
  if (s.residual) h = b.hbm("h", {R, D}, s.dtype, isa::TensorKind::output);
  const std::int64_t P = chip.sbuf_partitions, FB = chip.bn_stats_fmax;
  const std::int64_t chunks = ceil_div(D, FB);
  const int esz = isa::size_bytes(s.dtype);
  // Per partition: gamma, beta, and per buffer x (residual), y in the dtype,
  // one FP32 row, bn_stats output (6 per chunk) and small columns.
  constexpr int kBuf = 2;
  const std::int64_t need =
      2 * D * esz + kBuf * (D * esz * (s.residual ? 3 : 2) + D * 4 + chunks * 24 + 16);
  check_fits(chip, "layernorm", s, need);
  const std::int64_t tiles = ceil_div(R, P);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    const int gp = static_cast<int>(std::min(P, R));
    const Tensor g = b.sbuf(gp, D, s.dtype), bt = b.sbuf(gp, D, s.dtype);
    b.dma_copy(g, bias_rows(gamma, gp, 0, D));
    b.dma_copy(bt, bias_rows(beta, gp, 0, D));
    const Tensor eps = b.sbuf(gp, 1, DType::fp32);
    b.memset(eps, s.eps, Engine::gpsimd);
    struct Bufs {
      Tensor x, r, y, u, stats, mv, rstd;
    };
    Bufs bu[kBuf];
    for (auto& t : bu) {
      t.x = b.sbuf(static_cast<int>(P), D, s.dtype);
      if (s.residual) t.r = b.sbuf(static_cast<int>(P), D, s.dtype);
      t.y = b.sbuf(static_cast<int>(P), D, s.dtype);
      t.u = b.sbuf(static_cast<int>(P), D, DType::fp32);
      t.stats = b.sbuf(static_cast<int>(P), 6 * chunks, DType::fp32);
      t.mv = b.sbuf(static_cast<int>(P), 2, DType::fp32);
      t.rstd = b.sbuf(static_cast<int>(P), 1, DType::fp32);
    }
    int i = 0;
    for (std::int64_t t = core; t < tiles; t += s.cores, i = (i + 1) % kBuf) {
      const int r0 = static_cast<int>(t * P), n = static_cast<int>(std::min(P, R - t * P));
      const Bufs& v = bu[i];
      const Tensor hx = v.x.tile(0, n, 0, D);
      b.dma_copy(hx, x.tile(r0, n, 0, D));
      if (s.residual) add_residual(b, hx, v.r.tile(0, n, 0, D), res, h, r0);
      // mean and variance: bn_stats per chunk, then bn_aggr (Vector).
      for (std::int64_t c = 0; c < chunks; ++c) {
        const std::int64_t c0 = c * FB, w = std::min(FB, D - c0);
        b.bn_stats(v.stats.tile(0, n, 6 * c, 6), hx.tile(0, n, c0, w));
      }
      const Tensor mv = v.mv.tile(0, n, 0, 2), mean = v.mv.tile(0, n, 0, 1),
                   var = v.mv.tile(0, n, 1, 1), rstd = v.rstd.tile(0, n, 0, 1);
      b.bn_aggr(mv, v.stats.tile(0, n, 0, 6 * chunks));
      b.dma_copy(mean_h.tile(r0, n, 0, 1), mean, -1, false, Engine::vector);
      // rstd = rsqrt(var + eps) on the Scalar engine.
      const Tensor eps_n = eps.tile(0, n, 0, 1);
      b.activation(rstd, isa::ActFunc::rsqrt, var, &eps_n);
      b.dma_copy(rstd_h.tile(r0, n, 0, 1), rstd, -1, false, Engine::scalar);
      // u = (h - mean) * rstd (Scalar, column operands); y = u * gamma + beta
      // (Vector, then GpSimd with the cast).
      const Tensor u = v.u.tile(0, n, 0, D), yo = v.y.tile(0, n, 0, D);
      b.tensor_scalar(u, hx, isa::AluOp::subtract, mean, isa::AluOp::multiply, 0.0f, &rstd,
                      Engine::scalar);
      b.tensor_tensor(u, u, g.tile(0, n, 0, D), isa::AluOp::multiply, Engine::vector);
      b.tensor_tensor(yo, u, bt.tile(0, n, 0, D), isa::AluOp::add, Engine::gpsimd);
      b.dma_copy(y.tile(r0, n, 0, D), yo, -1, false, Engine::gpsimd);
    }
  }
  return b.finish();
}

isa::Program rmsnorm_backward_kernel(const arch::ChipSpec& chip, const RmsNormSpec& s) {
  check_norm("rmsnorm backward", s);
  if (s.residual)
    throw NotSupported(
        "rmsnorm backward with a fused residual (dh is the residual's gradient too)");
  Builder b(chip, s.cores);
  const std::int64_t R = s.rows, D = s.dim;
  const Tensor dy_h = b.hbm("dy", {R, D}, s.dtype, isa::TensorKind::input);
  const Tensor h_h = b.hbm("h", {R, D}, s.dtype, isa::TensorKind::input);
  const Tensor gamma = b.hbm("gamma", {1, D}, s.dtype, isa::TensorKind::input);
  const Tensor rstd_h = b.hbm("rstd", {R, 1}, DType::fp32, isa::TensorKind::input);
  const Tensor dh_h = b.hbm("dh", {R, D}, s.dtype, isa::TensorKind::output);
  const Tensor dg_h = b.hbm("dgamma_parts", {s.cores, D}, DType::fp32, isa::TensorKind::output);
  const std::int64_t P = chip.sbuf_partitions;
  const int esz = isa::size_bytes(s.dtype);
  // PSUM columns per matmul (one bank of FP32).
  const std::int64_t TN =
      std::min<std::int64_t>(chip.tensor.moving_fmax, chip.psum_bank_bytes().value() / 4);
  // dgamma accumulates on the Tensor engine in PSUM ([1, D] FP32 on one
  // partition, one bank per TN columns).
  if (ceil_div(D, TN) > chip.psum_banks) {
    throw NotSupported(fmt::format(
        "rmsnorm backward with D = {}: dgamma accumulates in PSUM, which holds {} columns", D,
        chip.psum_banks * TN));
  }
  // Per partition: gamma, and per buffer dy, h and dh in the dtype and three
  // FP32 rows.
  constexpr int kBuf = 2;
  const std::int64_t need = D * esz + kBuf * (3 * D * esz + 3 * D * 4 + 64);
  check_fits(chip, "rmsnorm backward", s, need);
  const std::int64_t tiles = ceil_div(R, P);
  const float neg_inv_d = -1.0f / static_cast<float>(D);
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    const int gp = static_cast<int>(std::min(P, R));
    const Tensor g = b.sbuf(gp, D, s.dtype);
    b.dma_copy(g, bias_rows(gamma, gp, 0, D));
    // dgamma: rstd^T @ (dy * h) per tile, accumulated in PSUM over the
    // core's tiles (the Tensor engine is otherwise idle here).
    std::vector<Tensor> dg;
    for (std::int64_t c0 = 0; c0 < D; c0 += TN) dg.push_back(b.psum(1, TN, DType::fp32));
    struct Bufs {
      Tensor dy, h, dh, gg, a, c, t, dot, coef;
    };
    Bufs bu[kBuf];
    for (auto& x : bu) {
      x.dy = b.sbuf(static_cast<int>(P), D, s.dtype);
      x.h = b.sbuf(static_cast<int>(P), D, s.dtype);
      x.dh = b.sbuf(static_cast<int>(P), D, s.dtype);
      x.gg = b.sbuf(static_cast<int>(P), D, DType::fp32);
      x.a = b.sbuf(static_cast<int>(P), D, DType::fp32);
      x.c = b.sbuf(static_cast<int>(P), D, DType::fp32);
      x.t = b.sbuf(static_cast<int>(P), 1, DType::fp32);
      x.dot = b.sbuf(static_cast<int>(P), 1, DType::fp32);
      x.coef = b.sbuf(static_cast<int>(P), 1, DType::fp32);
    }
    // Software pipeline over this core's tiles (each engine runs in order):
    // phase 1 of tile k + 1 (loads, gg and the row dot products) is issued
    // before phase 2 of tile k (dh and the dgamma accumulation).
    std::vector<std::int64_t> mine;
    for (std::int64_t t = core; t < tiles; t += s.cores) mine.push_back(t);
    struct View {
      int r0, n;
      Tensor dy, h, dh, gg, a, c, rs, dot, coef;
    };
    auto view = [&](std::size_t k) {
      const Bufs& x = bu[k % kBuf];
      const int r0 = static_cast<int>(mine[k] * P),
                n = static_cast<int>(std::min(P, R - mine[k] * P));
      auto T = [&](const Tensor& v) { return v.tile(0, n, 0, v.cols()); };
      return View{r0,     n,      T(x.dy), T(x.h),   T(x.dh),  T(x.gg),
                  T(x.a), T(x.c), T(x.t),  T(x.dot), T(x.coef)};
    };
    auto phase1 = [&](std::size_t k) {
      const View v = view(k);
      b.dma_copy(v.dy, dy_h.tile(v.r0, v.n, 0, D));
      b.dma_copy(v.h, h_h.tile(v.r0, v.n, 0, D));
      b.dma_copy(v.rs, rstd_h.tile(v.r0, v.n, 0, 1));
      // gg = dy * gamma (exact in FP32 for bf16 / fp16), dot = sum(gg * h).
      b.tensor_tensor(v.gg, v.dy, g.tile(0, v.n, 0, D), isa::AluOp::multiply);
      b.tensor_tensor(v.c, v.gg, v.h, isa::AluOp::multiply);
      b.tensor_reduce(v.dot, v.c, isa::AluOp::add);
      // coef = ((dot * rstd) * rstd) * rstd * (-1 / D).
      b.tensor_scalar(v.coef, v.dot, isa::AluOp::multiply, v.rs, isa::AluOp::multiply, 0.0f, &v.rs,
                      Engine::gpsimd);
      b.tensor_scalar(v.coef, v.coef, isa::AluOp::multiply, v.rs, isa::AluOp::multiply, neg_inv_d,
                      nullptr, Engine::gpsimd);
    };
    auto phase2 = [&](std::size_t k) {
      const View v = view(k);
      // dh = gg * rstd + h * coef.
      b.tensor_scalar(v.a, v.gg, isa::AluOp::multiply, v.rs, isa::AluOp::bypass, 0.0f, nullptr,
                      Engine::scalar);
      b.tensor_scalar(v.c, v.h, isa::AluOp::multiply, v.coef, isa::AluOp::bypass, 0.0f, nullptr,
                      Engine::scalar);
      b.tensor_tensor(v.dh, v.a, v.c, isa::AluOp::add, Engine::gpsimd);
      b.dma_copy(dh_h.tile(v.r0, v.n, 0, D), v.dh, -1, false, Engine::gpsimd);
      // dgamma (+)= rstd^T @ (dy * h); dy * h is exact in FP32 for bf16 / fp16.
      b.tensor_tensor(v.gg, v.dy, v.h, isa::AluOp::multiply, Engine::gpsimd);
      for (std::size_t c = 0; c < dg.size(); ++c) {
        const std::int64_t c0 = static_cast<std::int64_t>(c) * TN, w = std::min(TN, D - c0);
        b.matmul(dg[c].tile(0, 1, 0, w), v.rs, v.gg.tile(0, v.n, c0, w), k > 0);
      }
    };
    if (!mine.empty()) phase1(0);
    for (std::size_t k = 0; k < mine.size(); ++k) {
      if (k + 1 < mine.size()) phase1(k + 1);
      phase2(k);
    }
    const Tensor out = b.sbuf(1, D, DType::fp32);
    for (std::size_t c = 0; c < dg.size() && !mine.empty(); ++c) {
      const std::int64_t c0 = static_cast<std::int64_t>(c) * TN, w = std::min(TN, D - c0);
      b.tensor_copy(out.tile(0, 1, c0, w), dg[c].tile(0, 1, 0, w));
    }
    if (mine.empty()) b.memset(out, 0.0f);  // a core without rows contributes zeros
    b.dma_copy(dg_h.tile(core, 1, 0, D), out, -1, false, Engine::vector);
  }
  return b.finish();
}

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
  // Tiles of [128, F]: 4 KiB per partition per fp32 tensor, 4 buffers (measured
  // best of F = 512-2048 and 2-8 buffers on trn3; see bench/README.md).
  const std::int64_t P = chip.sbuf_partitions, F = 1024;
  constexpr int kBuf = 4;
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
    // The tiles of this core, then a software pipeline over them: each
    // engine runs its instructions in order, so the first phase of tile
    // k + 1 (loads and the updates that need only this tile's inputs) is
    // issued before the second phase of tile k (the chain through sqrt(v)).
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
    auto phase1 = [&](std::size_t k) {
      const View x = view(k);
      b.dma_copy(x.p, hbm(k, p_h));
      b.dma_copy(x.g, hbm(k, g_h));
      b.dma_copy(x.m, hbm(k, m_h));
      b.dma_copy(x.v, hbm(k, v_h));
      b.activation(x.p, isa::ActFunc::identity, x.p, nullptr, decay);  // p *= 1 - lr * wd
      b.activation(x.m, isa::ActFunc::identity, x.m, nullptr, s.beta1);
      b.activation(x.v, isa::ActFunc::identity, x.v, nullptr, s.beta2);
      b.tensor_scalar(x.a, x.g, isa::AluOp::multiply, one_m_b1);
      b.tensor_tensor(x.m, x.m, x.a, isa::AluOp::add);  // m = beta1 m + (1 - beta1) g
      b.dma_copy(hbm(k, mo_h), x.m, -1, false, Engine::vector);
      b.tensor_tensor(x.c, x.g, x.g, isa::AluOp::multiply, Engine::gpsimd);
      b.tensor_scalar(x.c, x.c, isa::AluOp::multiply, one_m_b2, isa::AluOp::bypass, 0.0f,
                      Engine::gpsimd);
      b.tensor_tensor(x.v, x.v, x.c, isa::AluOp::add, Engine::gpsimd);  // v = b2 v + (1-b2) g^2
      b.dma_copy(hbm(k, vo_h), x.v, -1, false, Engine::gpsimd);
    };
    auto phase2 = [&](std::size_t k) {
      const View x = view(k);
      b.activation(x.a, isa::ActFunc::sqrt, x.v);
      // denom = sqrt(v) / sqrt(bc2) + eps; then m / denom * -step_size.
      b.tensor_scalar(x.a, x.a, isa::AluOp::divide, bc2_sqrt, isa::AluOp::add, s.eps);
      b.tensor_tensor(x.a, x.m, x.a, isa::AluOp::divide);
      b.tensor_scalar(x.a, x.a, isa::AluOp::multiply, neg_step, isa::AluOp::bypass, 0.0f,
                      Engine::scalar);
      b.tensor_tensor(x.p, x.p, x.a, isa::AluOp::add, Engine::gpsimd);
      b.dma_copy(hbm(k, po_h), x.p, -1, false, Engine::gpsimd);
      b.tensor_copy(x.pb, x.p, Engine::scalar);
      b.dma_copy(hbm(k, pb_h), x.pb, -1, false, Engine::scalar);
    };
    if (!work.empty()) phase1(0);
    for (std::size_t k = 0; k < work.size(); ++k) {
      if (k + 1 < work.size()) phase1(k + 1);
      phase2(k);
    }
  }
  return b.finish();
}

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
                              DType dt) {
  if (rows < 1 || cols < 1)
    throw Error(fmt::format("transpose: shape [{}, {}] must be >= 1", rows, cols));
  if (dt != DType::fp32 && dt != DType::bf16 && dt != DType::fp16) {
    throw NotSupported(fmt::format("transpose of {} (fp32, bf16, fp16 are)", isa::name(dt)));
  }
  Builder b(chip);
  const Tensor in = b.hbm("in", {rows, cols}, dt, isa::TensorKind::input);
  const Tensor out = b.hbm("out", {cols, rows}, dt, isa::TensorKind::output);
  const std::int64_t T = std::min<std::int64_t>(chip.tensor.rows, chip.tensor.cols);
  Tensor src[2] = {b.sbuf(static_cast<int>(T), T, dt), b.sbuf(static_cast<int>(T), T, dt)};
  Tensor dst[2] = {b.sbuf(static_cast<int>(T), T, dt), b.sbuf(static_cast<int>(T), T, dt)};
  Tensor ps[2] = {b.psum(static_cast<int>(T), T, DType::fp32),
                  b.psum(static_cast<int>(T), T, DType::fp32)};
  int i = 0;
  for (std::int64_t r0 = 0; r0 < rows; r0 += T) {
    const int tr = static_cast<int>(std::min(T, rows - r0));
    for (std::int64_t c0 = 0; c0 < cols; c0 += T, i ^= 1) {
      const int tc = static_cast<int>(std::min(T, cols - c0));
      b.dma_copy(src[i].tile(0, tr, 0, tc), in.tile(static_cast<int>(r0), tr, c0, tc));
      b.transpose(ps[i].tile(0, tc, 0, tr), src[i].tile(0, tr, 0, tc));
      b.tensor_copy(dst[i].tile(0, tc, 0, tr), ps[i].tile(0, tc, 0, tr));
      b.dma_copy(out.tile(static_cast<int>(c0), tc, r0, tr), dst[i].tile(0, tc, 0, tr));
    }
  }
  return b.finish();
}

}  // namespace tern::kernel
