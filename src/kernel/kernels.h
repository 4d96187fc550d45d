// Built-in kernels written with the builder. Each validates its shapes and
// dtypes and says clearly what it does not support.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "arch/chip.h"
#include "isa/program.h"
#include "num/mx.h"

namespace tern::kernel {

// A chain applied to each output tile while it is evacuated from PSUM, in
// this order: y = act(scale * acc + bias[n]) + residual[m, n], then the cast
// to the output dtype. All arithmetic in FP32 on the Scalar (scale, act) and
// Vector (bias, residual) engines.
struct Epilogue {
  float scale = 1.0f;
  bool bias = false;  // HBM "bias" [1, N] (bias_dtype), added to every row
  isa::ActFunc act = isa::ActFunc::identity;
  bool residual = false;  // HBM "residual" [M, N] (residual_dtype)
  // The HBM dtypes of "bias" and "residual" (any float type: the DMA
  // converts them to the FP32 tiles the chain adds).
  isa::DType bias_dtype = isa::DType::fp32, residual_dtype = isa::DType::fp32;
  // Quantization for delayed / current FP8 scaling, after the chain: `amax`
  // writes max |y| of each output tile's rows to HBM "amax" [M, ceil(N /
  // tile columns)] fp32 (the tensor's amax is the max of all entries; tiles
  // are 512 columns wide on trn1-3); `qscale` multiplies by HBM "qscale"
  // [1, 1] fp32 (e.g. fp8_max / amax) before the cast to the output dtype
  // (FP8 outputs saturate, as the engines' output conversion does).
  bool amax = false;
  bool qscale = false;
  // `dequant`: per-tensor FP8 inputs: the accumulator is multiplied by HBM
  // "dequant_a" and "dequant_b" [1, 1] fp32 (1 / s_a, 1 / s_b: the
  // operands' quantization scales, fp8_scale_kernel's inv_scale) first,
  // before `scale` and the rest of the chain.
  bool dequant = false;
  // `mxfp8`: also emit the output MX-quantized for the next matmul, which
  // contracts over N: HBM "c_q" [N/4, M] fp8_e4m3_x4 and "c_scale" [N/32,
  // M] E8M0 (blocks of 32 along N, Trainium3 scales; mx_quantize_kernel's
  // layout of C^T, i.e. the next matmul's `at` operand with
  // mx_prequantized), quantized from the output rounded to BF16. N a
  // multiple of 128; trn3.
  bool mxfp8 = false;
  bool any() const {
    return scale != 1.0f || bias || act != isa::ActFunc::identity || residual || amax || qscale ||
           dequant || mxfp8;
  }
};

// "scale=0.5,bias,gelu,residual,amax,qscale" -> Epilogue (functions: any
// activation name).
Epilogue parse_epilogue(const std::string& text);
std::string to_string(const Epilogue& e);
// The chain split into the steps separate kernels would run, one HBM round
// trip each: [scale+bias], [act] (or [scale+act] without a bias), [residual],
// [amax+qscale].
std::vector<Epilogue> unfused_steps(const Epilogue& e);

struct MatmulSpec {
  std::int64_t m = 512, n = 512, k = 512;
  isa::DType in = isa::DType::bf16;   // dtype of both inputs (of A when in_b is set)
  isa::DType out = isa::DType::fp32;  // dtype of C
  int cores = 1;                      // physical cores; M blocks are spread over them
  int lnc = 1;                        // 2: the cores pair up into logical cores (v3+)
  Epilogue epilogue{};                // fused into the PSUM evacuation
  // Layouts in HBM: A as A^T [K, M] ("at", NKI's lhsT, no transpose needed)
  // or, with trans_a = false, as A [M, K] ("a"); B as [K, N] ("b") or, with
  // trans_b, as B^T [N, K] ("bt"). The other layouts load through the DMA
  // transpose (2-byte dtypes: bf16, fp16).
  bool trans_a = true, trans_b = false;
  // Batched matmul (attention's per-head products): `batch` independent
  // products, operands stacked along their first dim ([batch * K, M] etc.,
  // "c" [batch * M, N]); the epilogue's bias is shared, its residual is
  // [batch * M, N]. (batch, M block) units are spread over the cores.
  std::int64_t batch = 1;
  // MX (x4 inputs): the operands come from HBM already quantized, in
  // mx_quantize_kernel's layout ("at_q" [K/4, M] x4 + "at_scale" [K/32, M]
  // uint8, "b_q" [K/4, N] + "b_scale" [K/32, N]), as weights stored in MX
  // and activations quantized by the kernel that produced them would be.
  // MXFP4 (fp4_e2m1_x4: two bytes per x4 element) needs it: QuantizeMX
  // writes MXFP8 only.
  bool mx_prequantized = false;
  // B's dtype when it differs from A's, in the same family: FP8 E4M3 with
  // E5M2 (fp8-hybrid's gradient products), or MX x4 formats with
  // mx_prequantized (MXFP4 weights with MXFP8 activations).
  std::optional<isa::DType> in_b = std::nullopt;
};

// C[M, N] = A[M, K] @ B[K, N] with A given transposed in HBM ("at", [K, M],
// like NKI's lhsT), "b" [K, N], output "c" [M, N]. Any M, N, K >= 1.
// With in = fp8_e4m3_x4 / fp8_e5m2_x4 (MXFP8, trn3): "at" and "b" are
// BF16 in HBM and are quantized on chip by quantize_mx (groups of 32 along
// K, Trainium3 scales), then multiplied by the MX matmul; K must be a
// multiple of 128.
// Tiles: contraction 128, stationary 128, moving 512 (one PSUM bank of FP32);
// A^T blocks stay in SBUF while B tiles stream, double-buffered.
isa::Program matmul_kernel(const arch::ChipSpec& chip, const MatmulSpec& spec);

// The epilogue chain as a standalone memory-bound kernel: "y" [M, N] =
// chain("x" [M, N]) with the same "bias" / "residual" tensors and order as the
// fused version (the unfused baseline of the benchmarks).
isa::Program epilogue_kernel(const arch::ChipSpec& chip, std::int64_t m, std::int64_t n,
                             const Epilogue& e, isa::DType out = isa::DType::fp32);

// RMSNorm forward over the last dim, rows spread over `cores` (128 per tile):
//   h = x (+ residual), rstd = 1 / sqrt(mean(h^2) + eps), y = (h * gamma) * rstd.
// HBM inputs "x" [R, D] (dtype), "gamma" [1, D] (dtype), and with `residual`
// "residual" [R, D] (dtype); outputs "y" [R, D] (dtype), "rstd" [R, 1] fp32
// (for the backward pass) and with `residual` "h" [R, D] (dtype, the new
// residual stream). FP32 arithmetic; dtype fp32, bf16 or fp16.
struct RmsNormSpec {
  std::int64_t rows = 4096, dim = 4096;
  isa::DType dtype = isa::DType::bf16;
  float eps = 1e-6f;
  bool residual = false;
  int cores = 1;
  // Forward only, a quantized output (the next matmul's FP8 input): y in
  // `out` (default: dtype; FP8 saturates), times HBM "qscale" [1, 1] fp32
  // before the cast, and HBM "amax" [R, 1] fp32 = max |y| per row before
  // the scale (delayed scaling's amax is the max of the rows).
  std::optional<isa::DType> out;
  bool qscale = false, amax = false;
  // Also y MX-quantized along D for the next matmul: HBM "y_q" [D/4, R]
  // fp8_e4m3_x4 and "y_scale" [D/32, R] (the matmul's mxfp8 epilogue
  // layout; from y in `out`, rounded to BF16). D a multiple of 128, trn3.
  bool mxfp8 = false;
  isa::DType out_dtype() const { return out ? *out : dtype; }
};
isa::Program rmsnorm_kernel(const arch::ChipSpec& chip, const RmsNormSpec& spec);

// LayerNorm forward over the last dim (the same spec; eps as given, e.g.
// PyTorch's 1e-5): h = x (+ residual), mean and population variance of h
// from the Vector engine's bn_stats / bn_aggr (chunks of bn_stats_fmax),
// rstd = 1 / sqrt(var + eps), y = ((h - mean) * gamma) * rstd + beta (in
// FP32, one rounding into y).
// HBM inputs "x" [R, D], "gamma", "beta" [1, D] (dtype), with `residual`
// "residual" [R, D]; outputs "y" [R, D] (dtype), "mean" and "rstd" [R, 1]
// fp32 (for the backward pass), with `residual` "h" [R, D].
isa::Program layernorm_kernel(const arch::ChipSpec& chip, const RmsNormSpec& spec);

// RMSNorm backward for y = (h * gamma) * rstd, rows spread over `cores`:
//   gg = dy * gamma, dot[r] = sum_j gg * h,
//   dh = gg * rstd - h * (dot * rstd^3 / D),
//   dgamma_parts[c, j] = sum over core c's rows of dy * (h * rstd).
// HBM inputs "dy", "h" [R, D] (dtype), "gamma" [1, D] (dtype), "rstd"
// [R, 1] fp32 (the forward's output); outputs "dh" [R, D] (dtype) and
// "dgamma_parts" [cores, D] fp32: dgamma is the sum of its rows (each core
// reduces its rows on the Tensor engine; the cross-core sum is left to the
// caller, as a gradient all-reduce would be).
isa::Program rmsnorm_backward_kernel(const arch::ChipSpec& chip, const RmsNormSpec& spec);

// LayerNorm backward for y = ((h - mean) * rstd) * gamma + beta:
//   xhat = (h - mean) * rstd, gg = dy * gamma,
//   dh = rstd * gg - rstd / D * (sum(gg) + xhat * sum(gg * xhat)),
//   dgamma_parts[c] = sum over core c's rows of dy * xhat, dbeta_parts[c] of dy.
// HBM inputs "dy", "h" [R, D] (dtype), "gamma" [1, D], "mean", "rstd"
// [R, 1] fp32 (the forward's outputs); outputs "dh" [R, D] (dtype),
// "dgamma_parts" and "dbeta_parts" [cores, D] fp32 (sum the rows). D <=
// 2048 on trn3 (both accumulate in PSUM).
isa::Program layernorm_backward_kernel(const arch::ChipSpec& chip, const RmsNormSpec& spec);

// One fused AdamW step (PyTorch's torch.optim.AdamW, decoupled weight decay)
// over parameters laid out [R, C] (rows on partitions; any flattening of the
// model's tensors), all state FP32:
//   p <- p * (1 - lr * wd)
//   m <- beta1 * m + (1 - beta1) * g
//   v <- beta2 * v + (1 - beta2) * g * g
//   p <- p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// HBM inputs "param", "m", "v" (fp32) and "grad" (fp32 or bf16); outputs
// "param_out", "m_out", "v_out" (fp32) and "param_bf16" (the bf16 copy the
// next forward pass uses). Rows are spread over `cores`.
struct AdamWSpec {
  std::int64_t rows = 4096, cols = 4096;
  isa::DType grad = isa::DType::bf16;
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
  std::int64_t step = 1;  // t, from 1
  int cores = 1;
  // true: lr and step are not built in; HBM input "scalars" [1, 5] fp32
  // holds the step's adamw_scalars (decay, 1 - beta1, 1 - beta2, sqrt(bc2),
  // -step_size), so one program serves every step of a schedule (beta1,
  // beta2 and eps stay built in).
  bool runtime_scalars = false;
  // Multi-tensor form (one launch updates many tensors, as PyTorch's fused
  // / foreach AdamW): shapes [rows, cols] of each; the HBM names get
  // ".<i>" appended ("param.0", "grad.0", ...). Empty: one [rows, cols].
  std::vector<std::pair<std::int64_t, std::int64_t>> tensors;
};
isa::Program adamw_kernel(const arch::ChipSpec& chip, const AdamWSpec& spec);
// The FP32 scalars of one step, formed in double as PyTorch does on the host.
struct AdamWScalars {
  float decay, one_m_b1, one_m_b2, bc2_sqrt, neg_step_size;
};
AdamWScalars adamw_scalars(const AdamWSpec& spec);

// Softmax over the last dim of [rows, dim], rows spread over `cores`.
// Forward: HBM "x" -> "y" = exp(x - max) / sum (trn3: the Vector
// engine's fast exponential; FP32 arithmetic, the result cast to dtype).
// Backward: "dy", "y" -> "dx" = y * (dy - sum_j dy * y). dtype fp32, bf16
// or fp16; a row (3 buffers of it) must fit SBUF.
struct SoftmaxSpec {
  std::int64_t rows = 4096, dim = 4096;
  isa::DType dtype = isa::DType::bf16;
  int cores = 1;
};
isa::Program softmax_kernel(const arch::ChipSpec& chip, const SoftmaxSpec& spec);
isa::Program softmax_backward_kernel(const arch::ChipSpec& chip, const SoftmaxSpec& spec);

// Cross-entropy loss fused with softmax and its gradient, in one kernel:
// HBM "logits" [T, V] (dtype), "targets" [T, 1] int32 (< V; negative:
// ignored; a target >= V reads and writes another row: not checked on
// chip) ->
//   "loss" [T, 1] fp32 = logsumexp(x) - x[target] (per token),
//   "dlogits" [T, V] (dtype) = grad_scale * (softmax(x) - onehot(target)).
// A negative target (PyTorch's ignore_index) gives loss 0 and zero
// gradient. grad_scale NaN means 1 / T (the gradient of the mean loss).
// The vocabulary is processed in chunks of `chunk` columns (any V): pass 1
// keeps a running max and sum (online softmax), pass 2 recomputes the
// exponentials and writes the gradient; the target's logit and its -1 come
// by indirect DMA (gather, scatter-add). 128 x V < 2^24 (the flat index is
// formed in FP32). trn3 (the Vector exponential).
struct CrossEntropySpec {
  std::int64_t rows = 4096, vocab = 50304;
  isa::DType dtype = isa::DType::bf16;
  float grad_scale = std::numeric_limits<float>::quiet_NaN();
  // Read grad_scale from HBM "grad_scale" [1, 1] fp32 instead (a value
  // known only at run time, e.g. dloss / valid tokens: cross_entropy_scale).
  // It must be >= 0: ln(grad_scale) is folded into the exponential (not
  // checked on chip; the graph lowering refuses losses of unknown sign).
  bool grad_scale_input = false;
  std::int64_t chunk = 2048;
  int cores = 1;
};
isa::Program cross_entropy_kernel(const arch::ChipSpec& chip, const CrossEntropySpec& spec);

// The mean over valid tokens around cross_entropy_kernel (one core):
// cross_entropy_scale: "targets" [T, 1] int32, "dloss" [1, 1] fp32 ->
// "grad_scale" [1, 1] = dloss / max(valid, 1) and "inv_valid" [1, 1] = 1 / valid
// (valid: targets >= 0); cross_entropy_mean: "loss" [T, 1] fp32 and
// "inv_valid" -> "mean" [1, 1] = (sum of loss, partition order) * inv_valid.
// No valid token gives inv_valid = inf and a NaN mean, as PyTorch's NaN.
isa::Program cross_entropy_scale_kernel(const arch::ChipSpec& chip, std::int64_t rows);
isa::Program cross_entropy_mean_kernel(const arch::ChipSpec& chip, std::int64_t rows);

// Elementwise arithmetic over [rows, cols] (any flattening): "out" =
// a + b, a - b, a * b (HBM "a", "b") or alpha * a (HBM "a"), all of dtype
// fp32, bf16 or fp16, FP32 arithmetic rounded once to the dtype. Tiles of
// 128 x 2048 alternate between the Vector and GpSimd (and for `scale` the
// Scalar) engines; tiles are dealt over `cores`.
// Also activations, "out" = f(a) (gelu, gelu_tanh, silu, relu, on the
// Scalar engine), and their gradients, "out" = b * f'(a) with a = x and b =
// dy ("gelu_backward", ...: f'(x) in FP32, one rounding at the end).
enum class ElementwiseOp {
  add,
  sub,
  mul,
  scale,
  gelu,
  gelu_tanh,
  silu,
  relu,
  gelu_backward,
  gelu_tanh_backward,
  silu_backward,
  relu_backward,
};
// The activation of an activation op or of its backward (identity otherwise).
isa::ActFunc activation_of(ElementwiseOp op);
bool is_unary(ElementwiseOp op);
ElementwiseOp parse_elementwise_op(const std::string& s);
std::string to_string(ElementwiseOp op);
struct ElementwiseSpec {
  std::int64_t rows = 4096, cols = 4096;
  ElementwiseOp op = ElementwiseOp::add;
  isa::DType dtype = isa::DType::bf16;
  float alpha = 1.0f;  // the factor of `scale`
  // add / sub / mul: "b" is one row [1, cols], the same for every row of
  // "a" (a bias), read by a broadcast DMA instead of a [rows, cols] copy.
  bool b_row = false;
  int cores = 1;
};
isa::Program elementwise_kernel(const arch::ChipSpec& chip, const ElementwiseSpec& spec);

// Reductions of HBM "x" [rows, cols] (fp32, bf16, fp16) in FP32: sum, max or
// the sum of squares (for gradient norms). Per row: "out" [rows, 1]; with
// `all`, one partial per core: "out" [cores, 1] (row tiles dealt
// round-robin; the caller combines the partials, as an all-reduce would).
enum class ReduceOp { sum, max, sumsq };
ReduceOp parse_reduce_op(const std::string& s);
struct ReduceSpec {
  std::int64_t rows = 4096, cols = 4096;
  ReduceOp op = ReduceOp::sum;
  isa::DType dtype = isa::DType::bf16;
  bool all = false;
  int cores = 1;
};
isa::Program reduce_kernel(const arch::ChipSpec& chip, const ReduceSpec& spec);

// Sum of k row blocks: "x" [k x rows, cols] (in) -> "y" [rows, cols] (out)
// = x[0] + x[1] + ... + x[k-1], added in that order in FP32 on the Vector
// engine and rounded once to `out` (fp32, bf16, fp16). For a sum over a few
// leading axes (a bias or position-embedding gradient over a small batch),
// where x^T @ ones would use k of the Tensor engine's 128 rows.
struct BlockSumSpec {
  std::int64_t k = 2, rows = 128, cols = 512;
  isa::DType in = isa::DType::bf16, out = isa::DType::bf16;
  int cores = 1;
};
isa::Program block_sum_kernel(const arch::ChipSpec& chip, const BlockSumSpec& spec);

// Column sums: "x" [rows, cols] (in) -> "y" [1, cols] (out) = sum over the
// rows, in FP32 on the Tensor engine (a ones column as the stationary
// operand, x streaming as the moving one, 128 rows a matmul accumulated in
// PSUM in row order), rounded once to `out`. Each core takes a slice of the
// columns, so no partial sums cross cores. A bias gradient.
struct ColumnSumSpec {
  std::int64_t rows = 4096, cols = 768;
  isa::DType in = isa::DType::bf16, out = isa::DType::fp32;
  int cores = 1;
};
isa::Program column_sum_kernel(const arch::ChipSpec& chip, const ColumnSumSpec& spec);
// Whether a core's slice of `cols` columns over `cores` fits the PSUM banks
// (FP32 sums, one bank per output tile's columns): where column_sum_kernel
// applies.
bool column_sum_fits(const arch::ChipSpec& chip, std::int64_t cols, int cores);

// Gradient clipping by global norm (torch.nn.utils.clip_grad_norm_):
// from "sumsq_parts" [1, parts] fp32 (the sums of squares of every
// gradient, e.g. reduce_kernel's partials over all parameters),
//   norm = sqrt(sum), coef = min(max_norm / (norm + 1e-6), 1),
// "grad_out" = coef * "grad" [rows, cols] (dtype) and "norm" [1, 1] fp32.
struct ClipSpec {
  std::int64_t rows = 4096, cols = 4096;
  isa::DType dtype = isa::DType::fp32;
  std::int64_t parts = 1;
  float max_norm = 1.0f;
  int cores = 1;
};
isa::Program clip_kernel(const arch::ChipSpec& chip, const ClipSpec& spec);

// Gated linear unit (SwiGLU with silu, GeGLU with gelu or gelu_tanh) over
// [rows, cols] (dtype fp32, bf16 or fp16, FP32 arithmetic):
//   forward:  HBM "gate", "up" -> "out" = act(gate) * up;
//   backward: "dout", "gate", "up" -> "dup" = dout * act(gate),
//             "dgate" = (dout * up) * act'(gate) (the Scalar engine's
//             derivative functions silu_dx / gelu_dx / gelu_tanh_dx).
struct GluSpec {
  std::int64_t rows = 4096, cols = 11008;
  isa::ActFunc act = isa::ActFunc::silu;
  isa::DType dtype = isa::DType::bf16;
  int cores = 1;
};
isa::Program glu_kernel(const arch::ChipSpec& chip, const GluSpec& spec);
isa::Program glu_backward_kernel(const arch::ChipSpec& chip, const GluSpec& spec);

// Cast "x" [rows, cols] (in) to "y" (out), any of fp32, bf16, fp16,
// fp8_e4m3, fp8_e5m2 (FP8 needs trn2+; casts to FP8 saturate, as the
// engines' output conversion does). With `scaled`: y = cast(x * scale),
// "scale" [1, 1] fp32 from HBM, which makes it the per-tensor FP8
// quantization of delayed or current scaling (scale = fp8_max / amax) and
// its dequantization (x fp8, scale = 1 / that, out bf16 / fp32). With
// `amax`: "amax" [cores, 1] fp32, each core's max |x| (the amax history
// entry of delayed scaling; the max over cores is the tensor's).
struct CastSpec {
  std::int64_t rows = 4096, cols = 4096;
  isa::DType in = isa::DType::bf16, out = isa::DType::fp8_e4m3;
  bool scaled = true, amax = true;
  int cores = 1;
};
isa::Program cast_kernel(const arch::ChipSpec& chip, const CastSpec& spec);

// Per-tensor FP8 current scaling: "x" [rows, cols] (fp32, bf16, fp16) ->
// "scale" [1, 1] fp32 s = fp8_max / amax (FP32 division, at most the largest
// float; amax = max |x|; amax 0 or Inf gives s = 1) and "inv_scale" [1, 1] =
// 1 / s: the scale of
// cast_kernel's scaled cast and the matmul epilogue's dequant factor. One
// core: the tensor's amax must be whole before the division (the cores of
// a kernel do not synchronize).
struct Fp8ScaleSpec {
  std::int64_t rows = 4096, cols = 4096;
  isa::DType in = isa::DType::bf16, fp8 = isa::DType::fp8_e4m3;
};
isa::Program fp8_scale_kernel(const arch::ChipSpec& chip, const Fp8ScaleSpec& spec);

// MX block quantization on chip (trn3): "x" [K, cols] bf16 in blocks of 32
// along K -> "q" [K/4, cols] x4-packed elements (element (k4, c) holds rows
// 4 k4 .. 4 k4 + 3; MXFP4: row 4 k4 + j in bits 4j .. 4j + 3) and
// "q_scale" [K/32, cols] E8M0 codes (uint8): the operand layout of the MX
// matmul. Bytes equal tern::num::mx_quantize under `policy` (numerics.md
// section 3). MXFP8 with the trn3 policy runs on QuantizeMX; the other
// policies and MXFP4 (QuantizeMX writes only MXFP8 with Trainium3 scales)
// run a software path: block amax from the BF16 bits on GpSimd, the cross-
// partition max and the scale broadcast on the Tensor engine, scales with
// integer ALU ops, elements by one exact multiply and one rounding
// (MXFP4: rounded on the FP32 bits, packed four to an element).
// `software` forces that path for trn3 MXFP8 too (a cross-check). K a
// multiple of 128 (QuantizeMX works on groups of 32 partitions x 4 values).
struct MxQuantizeSpec {
  std::int64_t k = 4096, cols = 4096;
  isa::DType elem = isa::DType::fp8_e4m3_x4;
  num::ScalePolicy policy = num::ScalePolicy::trn3;
  bool software = false;
  // x given transposed, as [cols, K] (K contiguous): the tiles load by DMA
  // transposes, so a [tokens, features] activation quantizes along its
  // features without a transpose pass first. The outputs are the same.
  bool trans = false;
  int cores = 1;
};
isa::Program mx_quantize_kernel(const arch::ChipSpec& chip, const MxQuantizeSpec& spec);

// MX dequantization on chip (trn3): "q" [K/4, cols] x4 (MXFP8 E4M3 / E5M2
// or MXFP4) and "q_scale" [K/32, cols] E8M0 in mx_quantize_kernel's layout
// -> "x" [K, cols] in `out` (fp32 exact but for -0, which comes back +0;
// bf16 rounds). The engines cannot
// read x4 data, so the Tensor engine does it: each 128 rows of a K block
// are the MX matmul of an MXFP8 identity slice with the block.
struct MxDequantizeSpec {
  std::int64_t k = 4096, cols = 4096;
  isa::DType elem = isa::DType::fp8_e4m3_x4;
  isa::DType out = isa::DType::bf16;
  int cores = 1;
};
isa::Program mx_dequantize_kernel(const arch::ChipSpec& chip, const MxDequantizeSpec& spec);

// out[R, C] = a + b (all of dtype `dt`), tiled 128 rows x up to 2048 columns.
isa::Program add_kernel(const arch::ChipSpec& chip, std::int64_t rows, std::int64_t cols,
                        isa::DType dt);

// Data movement for shape ops (transposes that keep the last dim, slices,
// pads, concatenation, broadcasts): "out" [rows, cols] (dtype) assembled by
// DMA through SBUF from inputs "in0", "in1", ... (flat, dtype), row by row:
// each run gives `rows` consecutive output rows from out_row0, taking
// `len` elements of input `input` at element in0 + i * in_stride (row i of
// the run) into output columns [col0, col0 + len); what no run covers is
// zero. Runs move in chunks of up to 128 rows (one DMA in, one out).
struct CopyRun {
  int input = 0;
  std::int64_t out_row0 = 0, rows = 1, in0 = 0, in_stride = 0, col0 = 0, len = 0;
};
// Elementwise chains in one pass: "out" = ops applied in order to "in0"
// (FP32, rounded once to dtype at the end); each step is an op of
// ElementwiseOp (binary ones take input `operand`, "in<operand>"; backward
// ones take the running value as dy and input `operand` as x).
struct ChainStep {
  ElementwiseOp op = ElementwiseOp::add;
  int operand = 1;
  float alpha = 1.0f;
};
struct ElementwiseChainSpec {
  std::int64_t rows = 1, cols = 1;
  isa::DType dtype = isa::DType::bf16, out = isa::DType::bf16;
  int inputs = 1;
  std::vector<isa::DType> input_dtypes;  // per input (empty: all `dtype`)
  std::vector<ChainStep> steps;
  int cores = 1;
};
isa::Program elementwise_chain_kernel(const arch::ChipSpec& chip, const ElementwiseChainSpec& spec);

struct LayoutCopySpec {
  std::vector<std::int64_t> input_elements;  // size of each input
  std::int64_t rows = 1, cols = 1;
  isa::DType dtype = isa::DType::bf16;
  std::vector<CopyRun> runs;
  int cores = 1;
};
isa::Program layout_copy_kernel(const arch::ChipSpec& chip, const LayoutCopySpec& spec);

// out[C, R] = in[R, C]^T through the Tensor engine, 128 x 128 blocks.
// With `batch`: `batch` matrices stacked, "in" [batch * rows, cols] ->
// "out" [batch * cols, rows], the matrices dealt over `cores`. With a
// StridedSource, "in" is [1, elements] and matrix m is read through a view
// of it: row r, column c at offset + (m / inner) * outer_stride +
// (m % inner) * inner_stride + r * row_stride + c (e.g. one head's q of a
// fused qkv projection output [B, S, 3D]).
struct StridedSource {
  std::int64_t elements = 0, offset = 0, row_stride = 0;
  std::int64_t inner = 1, inner_stride = 0, outer_stride = 0;
};
isa::Program transpose_kernel(const arch::ChipSpec& chip, std::int64_t rows, std::int64_t cols,
                              isa::DType dt, std::int64_t batch = 1, int cores = 1,
                              const StridedSource* source = nullptr);

// Embedding lookup and its backward, on indirect DMA (dma_gather /
// dma_scatter). Token ids are int32; dtype fp32, bf16 or fp16; any
// T, V, D >= 1 (V, T < 2^31).
struct EmbeddingSpec {
  std::int64_t tokens = 4096, vocab = 32000, dim = 1024;
  isa::DType dtype = isa::DType::bf16;  // table and out (forward); dout (backward)
  int cores = 1;
};
// out[t, :] = table[ids[t], :]. HBM inputs "ids" [T, 1] int32 and "table"
// [V, D] (dtype); output "out" [T, D] (dtype), the rows' bytes unchanged.
// 128-token tiles are dealt round-robin over the cores; rows wider than
// 8 KiB move in column chunks. An id outside [0, V) stops the run with an
// error naming the gather and the id (oob=error).
isa::Program embedding_kernel(const arch::ChipSpec& chip, const EmbeddingSpec& spec);
// dtable = zeros [V, D] fp32, then dtable[ids[t], :] += dout[t, :] for
// t = 0..T-1 in order (FP32 adds, one rounding each: duplicate ids sum in
// token order, bit-exact and deterministic). HBM inputs "ids" [T, 1] int32
// and "dout" [T, D] (dtype); output "dtable" [V, D] fp32 (zero-initialized
// by the kernel, as torch's embedding backward: not accumulated onto an
// existing gradient). The columns are split over the cores (at least 64
// each); each core zeroes its columns, then scatter-adds every 128-token
// tile into them, one scatter after the other.
isa::Program embedding_backward_kernel(const arch::ChipSpec& chip, const EmbeddingSpec& spec);

// Attention (FlashAttention-2 style, see attention.cpp, attention_forward.cpp,
// attention_backward.cpp and docs/kernels.md).
// HBM layouts (like NKI's flash attention; "q" and "k" pre-transposed so that
// the head dim is the matmul contraction on partitions without a transpose):
//   q [B, Hq, D, Sq], k [B, Hkv, D, Sk], v [B, Hkv, Sk, D]  (dtype)
//   o [B, Hq, Sq, D] (dtype), lse [B, Hq, Sq] float32 (natural log of the
//   row sums of exp(scale * q.k), masked entries excluded)
// GQA: query head h reads kv head h / (Hq / Hkv). Causal masking is
// top-left aligned like torch's is_causal: query i sees keys j <= i.
// dtype bf16 or fp16: the P^T and dS^T of the matmuls (and the backward's
// other transposes) are 2-byte DMA transposes. float32: those transposes run
// on the Tensor engine instead (nc_transpose: exact, into PSUM, copied out by
// the Vector engine), the matmuls in FP32 at a quarter of the BF16 rate
// ([tensor.rate] fp32 = 0.25), the softmax statistics in FP32 as always:
// results agree with FP64 to ~1e-5 relative, at ~3.2x (forward) and ~3.6x
// (backward) the BF16 time; SBUF holds K and V of seq_k <= 10240 (forward)
// and a kv head's working set of seq ~4 K (backward) at D = 128.
struct AttentionSpec {
  std::int64_t batch = 1, q_heads = 8, kv_heads = 8;
  std::int64_t seq_q = 4096, seq_k = 0;  // seq_k 0: equal to seq_q
  std::int64_t head_dim = 128;           // 64 or 128
  bool causal = true;
  float scale = 0.0f;                   // 0: 1 / sqrt(head_dim)
  isa::DType dtype = isa::DType::bf16;  // bf16, fp16 or fp32
  int cores = 1;
  // o_width > 0: o (the forward's output, the backward's input) is [B, Sq,
  // o_width] with head h in columns [h D, (h + 1) D): the layout of the
  // merged heads the output projection reads. do_width: the same for the
  // backward's "do".
  std::int64_t o_width = 0, do_width = 0;
  // Backward only. qkv_width > 0: instead of dq, dk, dv the kernel writes
  // one output "dqkv" [B, S, qkv_width] (S = seq_q = seq_k), the gradient of
  // a fused qkv projection: row (b, s) holds dq of head h in columns
  // [q_col + h D, q_col + (h + 1) D), dk of kv head g at k_col + g D, dv at
  // v_col + g D, each transposed on its way out (by DMA; fp32: on the Tensor
  // engine, then stored by DMA). Columns outside those ranges are not written.
  std::int64_t qkv_width = 0, q_col = 0, k_col = 0, v_col = 0;
  std::int64_t kv_len() const { return seq_k > 0 ? seq_k : seq_q; }
  float softmax_scale() const;
};

// O = softmax(scale * Q K^T + mask) V per head with the online softmax; also
// writes lse for the backward pass. (batch, head, 128-query tile) units are
// spread over the cores.
isa::Program flash_attention_kernel(const arch::ChipSpec& chip, const AttentionSpec& spec);

// The FlashAttention-2 backward: inputs q, k, v, o, "do" (layouts above) and
// lse; outputs dq [B, Hq, D, Sq], dk [B, Hkv, D, Sk], dv [B, Hkv, Sk, D]
// (dtype; accumulated in FP32), or "dqkv" (AttentionSpec::qkv_width). (batch, kv head) units are
// spread over the cores; every query head of a GQA group runs on its kv head's core.
isa::Program flash_attention_backward_kernel(const arch::ChipSpec& chip, const AttentionSpec& spec);

// Rotary position embedding (rotate-half convention of Llama / HF) on "x"
// [B, H, S, D] (dtype) with tables "cos", "sin" [S, D/2] float32:
//   out[..., :D/2] = x1 * cos - x2 * sin, out[..., D/2:] = x2 * cos + x1 * sin
// (x1 = x[..., :D/2], x2 = x[..., D/2:]); `backward` rotates by -theta (sin
// negated), the gradient of the forward. Output "y" (dtype); FP32 arithmetic.
struct RopeSpec {
  std::int64_t batch = 1, heads = 8, seq = 4096, head_dim = 128;
  isa::DType dtype = isa::DType::bf16;
  bool backward = false;
  int cores = 1;
};
isa::Program rope_kernel(const arch::ChipSpec& chip, const RopeSpec& spec);

}  // namespace tern::kernel
