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

namespace detail {

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

}  // namespace detail

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

}  // namespace tern::kernel
