// The fused epilogue chain: parsing, PSUM evacuation, the standalone kernel.
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

Epilogue parse_epilogue(const std::string& text) {
  Epilogue e;
  std::size_t at = 0;
  while (at <= text.size() && !text.empty()) {
    const std::size_t comma = text.find(',', at);
    const std::string item =
        text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (item == "bias") {
      e.bias = true;
    } else if (item == "amax") {
      e.amax = true;
    } else if (item == "qscale") {
      e.qscale = true;
    } else if (item == "dequant") {
      e.dequant = true;
    } else if (item == "mxfp8") {
      e.mxfp8 = true;
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
            fmt::format("epilogue step '{}': expected scale=<x>, bias, residual, amax, qscale, "
                        "dequant, mxfp8 or an activation (gelu, gelu_tanh, silu, relu, ...)",
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
  if (e.dequant) add("dequant");
  if (e.scale != 1.0f) add(fmt::format("scale={}", e.scale));
  if (e.bias) add("bias");
  if (e.act != isa::ActFunc::identity) add(std::string(isa::act_name(e.act)));
  if (e.residual) add("residual");
  if (e.amax) add("amax");
  if (e.qscale) add("qscale");
  if (e.mxfp8) add("mxfp8");
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
  if (e.dequant) {  // with the first step, or alone
    if (steps.empty()) steps.emplace_back();
    steps.front().dequant = true;
  }
  if (e.residual) steps.push_back({1.0f, false, isa::ActFunc::identity, true});
  if (e.amax || e.qscale) {
    Epilogue q;
    q.amax = e.amax, q.qscale = e.qscale;
    steps.push_back(q);
  }
  return steps;
}

namespace detail {

// The output tile o [tm, tn] MX-quantized along its columns (the next
// matmul's contraction): four Tensor-engine transposes of the stride-4
// column sets j = 0..3 give T_j[p, m] = o[m, 4p + j]; copied interleaved
// (src[p, 4m + j] = T_j[p, m], BF16) they are QuantizeMX's source layout,
// whose x4 [tn/4, tm] and scales [tn/32, tm] are stored to the tile's place
// in "c_q" / "c_scale".
void alloc_mx_tiles(Builder& b, std::vector<EvacTiles>& slots, std::int64_t tm, std::int64_t tn) {
  const int parts = static_cast<int>(tn / 4);  // partitions of the transposed tile
  const Tensor ps[2] = {b.psum(parts, 4 * tm, DType::fp32), b.psum(parts, 4 * tm, DType::fp32)};
  for (std::size_t i = 0; i < slots.size(); ++i) {
    auto& t = slots[i];
    t.mx_ps = ps[i % 2];
    t.mx_src = b.sbuf(parts, 4 * tm, DType::bf16);
    t.mx_q = b.sbuf(parts, tm, DType::fp8_e4m3_x4);
    t.mx_s = b.sbuf(parts / 8, tm, DType::uint8);
  }
}

void mx_output(Builder& b, const Tensor& o, const EvacTiles& t, const QuantTile& q) {
  const std::int64_t tm = o.rows(), quarter = o.cols() / 4;
  const int parts = static_cast<int>(quarter);
  for (std::int64_t j = 0; j < 4; ++j) {
    const Tensor tp = t.mx_ps.tile(0, parts, j * tm, tm);
    b.transpose(tp, o.with_dims({{4, quarter}}, j));
    const Tensor dst = t.mx_src.tile(0, parts, 0, 4 * tm).with_dims({{4, tm}}, j);
    b.tensor_copy(dst, tp, j % 2 ? Engine::scalar : Engine::vector);
  }
  const Tensor xq = t.mx_q.tile(0, parts, 0, tm), xs = t.mx_s.tile(0, parts / 8, 0, tm);
  b.quantize_mx(xq, xs, t.mx_src.tile(0, parts, 0, 4 * tm));
  b.dma_copy(q.mx_q_hbm, xq, -1, false, Engine::vector);
  b.dma_copy(q.mx_s_hbm, xs, -1, false, Engine::vector);
}

// Applies the epilogue to tile `src` ([tm, tn], PSUM or SBUF) and writes the
// result, cast, into `o`; returns the engine of the last step (it triggers
// the store). `bias` is the broadcast [tm, tn] bias view, `residual_hbm` the
// residual tile in HBM.
Engine evacuate(Builder& b, const Epilogue& e, const Tensor& src, const Tensor& o,
                const EvacTiles& tiles, const Tensor* bias, const Tensor* residual_hbm,
                Engine plain, const QuantTile* quant) {
  if (!e.any()) {
    b.tensor_copy(o, src, plain);
    return plain;
  }
  const int tm = src.rows();
  const std::int64_t tn = src.cols();
  const Tensor t32 = tiles.t32.tile(0, tm, 0, tn);
  // With a bias the scale and the activation are separate steps around it;
  // without, one Scalar activation computes act(scale * x).
  enum class Step { dequant, scale, scale_act, add_bias, act, add_residual };
  std::vector<Step> steps;
  if (e.dequant) steps.push_back(Step::dequant);
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
  const bool quantize = e.amax || e.qscale;
  Tensor x = src;
  Engine last = plain;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Tensor dst = i + 1 == steps.size() && !quantize ? o : t32;
    switch (steps[i]) {
      case Step::dequant: {
        const Tensor sa = quant->qscale.tile(0, tm, 1, 1), sb = quant->qscale.tile(0, tm, 2, 1);
        b.tensor_scalar(dst, x, isa::AluOp::multiply, sa, isa::AluOp::multiply, 0.0f, &sb,
                        Engine::vector);
        last = Engine::vector;
        break;
      }
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
  if (steps.empty() && !quantize) {  // only the mxfp8 step: a plain evacuation first
    b.tensor_copy(o, src, plain);
    x = o;
  }
  if (quantize) {
    if (e.amax) {  // max |y| per row of the tile (Vector), stored to its HBM column
      const Tensor col = tiles.amax.tile(0, tm, 0, 1);
      b.tensor_reduce(col, x, isa::AluOp::abs_max);
      b.tensor_scalar(col, col, isa::AluOp::abs_max, 0.0f);  // |y| also for 1-column tiles
      b.dma_copy(quant->amax_hbm, col, -1, false, Engine::vector);
    }
    if (e.qscale)
      b.tensor_scalar(o, x, isa::AluOp::multiply, quant->qscale.tile(0, tm, 0, 1),
                      isa::AluOp::bypass, 0.0f, nullptr, Engine::scalar);
    else
      b.tensor_copy(o, x, Engine::scalar);
    last = Engine::scalar;
  }
  if (e.mxfp8) mx_output(b, o, tiles, *quant);
  return last;
}

EpilogueIo epilogue_io(Builder& b, const Epilogue& e, std::int64_t m, std::int64_t n,
                       std::int64_t tn) {
  EpilogueIo io;
  if (e.bias) io.bias = b.hbm("bias", {1, n}, e.bias_dtype, isa::TensorKind::input);
  if (e.residual) io.residual = b.hbm("residual", {m, n}, e.residual_dtype, isa::TensorKind::input);
  if (e.qscale) io.qscale = b.hbm("qscale", {1, 1}, DType::fp32, isa::TensorKind::input);
  if (e.dequant) {
    io.dequant_a = b.hbm("dequant_a", {1, 1}, DType::fp32, isa::TensorKind::input);
    io.dequant_b = b.hbm("dequant_b", {1, 1}, DType::fp32, isa::TensorKind::input);
  }
  if (e.amax) io.amax = b.hbm("amax", {m, (n + tn - 1) / tn}, DType::fp32, isa::TensorKind::output);
  if (e.mxfp8) {
    io.mx_q = b.hbm("c_q", {n / 4, m}, DType::fp8_e4m3_x4, isa::TensorKind::output);
    io.mx_s = b.hbm("c_scale", {n / 32, m}, DType::uint8, isa::TensorKind::output);
  }
  return io;
}

QuantTile quant_tile(const Epilogue& e, const EpilogueIo& io, const Tensor& qscale, int r0, int tm,
                     std::int64_t n0, std::int64_t tn, std::int64_t tile_cols) {
  QuantTile q{qscale, {}, {}, {}};
  if (e.amax) q.amax_hbm = io.amax.tile(r0, tm, n0 / tile_cols, 1);
  if (e.mxfp8) {
    q.mx_q_hbm = io.mx_q.tile(static_cast<int>(n0 / 4), static_cast<int>(tn / 4), r0, tm);
    q.mx_s_hbm = io.mx_s.tile(static_cast<int>(n0 / 32), static_cast<int>(tn / 32), r0, tm);
  }
  return q;
}

void check_mxfp8(const arch::ChipSpec& chip, const Epilogue& e, std::int64_t n) {
  if (!e.mxfp8) return;
  if (!isa::supported_by(DType::fp8_e4m3_x4, chip.core_version))
    throw NotSupported(
        fmt::format("the mxfp8 epilogue step on {} (MX is NeuronCore-v4)", chip.name));
  if (n % kMxRowMultiple != 0)
    throw NotSupported(fmt::format(
        "the mxfp8 epilogue step with N = {}: N must be a multiple of {} (QuantizeMX groups 32 "
        "partitions of 4 values)",
        n, kMxRowMultiple));
}

Tensor load_qscale(Builder& b, const Epilogue& e, const EpilogueIo& io, int rows) {
  if (!e.qscale && !e.dequant) return Tensor{};
  const Tensor t = b.sbuf(rows, 3, DType::fp32);
  if (e.qscale) b.dma_copy(t.tile(0, rows, 0, 1), bias_rows(io.qscale, rows, 0, 1));
  if (e.dequant) {
    b.dma_copy(t.tile(0, rows, 1, 1), bias_rows(io.dequant_a, rows, 0, 1));
    b.dma_copy(t.tile(0, rows, 2, 1), bias_rows(io.dequant_b, rows, 0, 1));
  }
  return t;
}

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
      if (e.amax) t.amax = b.sbuf(rows, 1, DType::fp32);
    }
    if (e.mxfp8) alloc_mx_tiles(b, o.evac, tm, tn);
    if (e.bias)
      for (auto& t : o.bias) t = b.sbuf(rows, tn, DType::fp32);
  }
  return o;
}

// SBUF bytes per partition output_slots adds for the epilogue.
std::int64_t epilogue_sbuf_bytes(const Epilogue& e, std::int64_t tm, std::int64_t tn) {
  if (!e.any()) return 0;
  // mxfp8, per slot on tn / 4 partitions: a BF16 source of 4 tm values, its
  // x4 elements (4 bytes each) and one scale byte per 8 partitions.
  const std::int64_t mx = e.mxfp8 ? OutputSlots::kOut * (4 * tm * 2 + tm * 4 + tm) : 0;
  return (OutputSlots::kOut * (e.residual ? 2 : 1) + (e.bias ? 2 : 0)) * tn * 4 +
         OutputSlots::kOut * 4 + 4 + mx;
}

// The [rows, n] HBM bias row seen by every partition (row stride 0).
void check_output(const arch::ChipSpec& chip, const char* name, DType out) {
  const bool fp8 = out == DType::fp8_e4m3 || out == DType::fp8_e5m2;
  if (out != DType::fp32 && out != DType::bf16 && !fp8)
    throw NotSupported(fmt::format("{} with {} output (fp32, bf16, fp8_e4m3, fp8_e5m2 are)", name,
                                   isa::name(out)));
  if (!isa::supported_by(out, chip.core_version))
    throw NotSupported(fmt::format("{} with {} output on {} ({})", name, isa::name(out), chip.name,
                                   chip.core_generation));
}

std::int64_t output_tile_columns(const arch::ChipSpec& chip) {
  return std::min<std::int64_t>(chip.tensor.moving_fmax, chip.psum_bank_bytes().value() / 4);
}

Tensor bias_rows(const Tensor& bias, int rows, std::int64_t n0, std::int64_t n) {
  Tensor v = bias;
  v.ap.offset += n0 * isa::size_bytes(bias.dtype());
  v.ap.dims = {{0, rows}, {1, n}};
  v.ap.partitions = rows;
  return v;
}

}  // namespace detail

isa::Program epilogue_kernel(const arch::ChipSpec& chip, std::int64_t m, std::int64_t n,
                             const Epilogue& e, DType out) {
  if (m < 1 || n < 1) throw Error(fmt::format("epilogue: shape [{}, {}] must be >= 1", m, n));
  check_output(chip, "epilogue", out);
  if (e.mxfp8)
    throw NotSupported("the mxfp8 step in the standalone epilogue kernel (the matmul has it)");
  Builder b(chip);
  const Tensor x = b.hbm("x", {m, n}, DType::fp32, isa::TensorKind::input);
  const Tensor y = b.hbm("y", {m, n}, out, isa::TensorKind::output);
  // The same tile shape as the matmul's output tiles, double-buffered.
  const std::int64_t TP = chip.sbuf_partitions;
  const std::int64_t TF = output_tile_columns(chip);
  const EpilogueIo io = epilogue_io(b, e, m, n, TF);
  const Tensor& bias_h = io.bias;
  const Tensor& residual_h = io.residual;
  const Tensor qs = load_qscale(b, e, io, static_cast<int>(std::min(TP, m)));
  constexpr int kBuf = 2;
  Tensor xs[kBuf], os[kBuf], biases[kBuf];
  EvacTiles tiles[kBuf];
  for (int i = 0; i < kBuf; ++i) {
    xs[i] = b.sbuf(static_cast<int>(TP), TF, DType::fp32);
    os[i] = b.sbuf(static_cast<int>(TP), TF, out);
    tiles[i].t32 = b.sbuf(static_cast<int>(TP), TF, DType::fp32);
    if (e.residual) tiles[i].residual = b.sbuf(static_cast<int>(TP), TF, DType::fp32);
    if (e.amax) tiles[i].amax = b.sbuf(static_cast<int>(TP), 1, DType::fp32);
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
      const QuantTile qt = quant_tile(e, io, qs, static_cast<int>(r0), tr, c0, tc, TF);
      const Engine last =
          evacuate(b, e, vx, vo, tiles[i], &biases[cb], &res_h, Engine::vector, &qt);
      b.dma_copy(y.tile(static_cast<int>(r0), tr, c0, tc), vo, -1, false, last);
    }
  }
  return b.finish();
}

}  // namespace tern::kernel
