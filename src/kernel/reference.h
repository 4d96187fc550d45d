// Host references for checking simulated kernels (used by `tern bench`).
#pragma once

#include <cstdint>
#include <vector>

#include "kernel/kernels.h"

namespace tern::kernel {

// C[M, N] = A^T[K, M]^T @ B[K, N], summed over k in order with one FP32
// rounding per step (FMA) for inputs of <= 11-bit significands, or the
// product rounded first for FP32 inputs: the Tensor engine's arithmetic
// (numerics.md section 4), written as the plain triple loop.
std::vector<float> matmul_reference(const std::vector<float>& at, const std::vector<float>& b,
                                    std::int64_t m, std::int64_t n, std::int64_t k,
                                    bool fp32_products);

// Each column of the row-major [K, C] matrix `v` quantized in blocks of 32
// consecutive rows to MX elements of `elem` with Trainium3 scales (as
// quantize_mx does), then dequantized: the values the MX matmul multiplies.
std::vector<float> mx_roundtrip_columns(const std::vector<float>& v, std::int64_t k, std::int64_t c,
                                        bool e5m2);

// Applies the epilogue to the FP32 [M, N] matrix `c` in place, one FP32
// rounding per step in the order the kernels use: scale (with the
// activation when there is no bias), + bias[n], activation, + residual[m, n].
// `bias` has N values (or none), `residual` M x N (or none).
void epilogue_reference(std::vector<float>& c, const std::vector<float>& bias,
                        const std::vector<float>& residual, const Epilogue& e, std::int64_t m,
                        std::int64_t n);

// The epilogue's quantization steps after epilogue_reference: returns the
// "amax" output [m, ceil(n / tn)] (max |y| per row of each `tn`-column
// tile), then multiplies y by qscale when the epilogue has it. The caller
// casts y to the output dtype (saturating for FP8: `round_output`).
std::vector<float> epilogue_quant_reference(std::vector<float>& y, float qscale, const Epilogue& e,
                                            std::int64_t m, std::int64_t n, std::int64_t tn);
// Rounds to the output dtype as the engines' output conversion does (FP8
// saturates).
void round_output(std::vector<float>& y, isa::DType out);

// RMSNorm forward as rmsnorm_kernel computes it (one FP32 rounding per step:
// the sum of squares in column order, rsqrt(sum * (1/D) + eps), then
// y = round((h * gamma) * rstd)): returns y, fills rstd [R] and, with a
// residual, h = round(x + residual). `round` rounds to the tensors' dtype.
struct RmsNormResult {
  std::vector<float> y, rstd, h, amax;
};
// A norm's quantized output (RmsNormSpec::out, qscale, amax): y in FP32,
// amax[r] = max |y| of row r, y times `scale` when qscale, then the cast to
// `out` (FP8 saturating).
struct NormQuant {
  isa::DType out = isa::DType::fp32;
  bool qscale = false, amax = false;
  float scale = 1.0f;
};
RmsNormResult rmsnorm_reference(const std::vector<float>& x, const std::vector<float>& gamma,
                                const std::vector<float>* residual, std::int64_t rows,
                                std::int64_t dim, float eps, float (*round)(float),
                                const NormQuant* quant = nullptr);

// LayerNorm forward as layernorm_kernel computes it: statistics by
// isa::bn_stats_row over chunks of `chunk` columns and isa::bn_aggr_row,
// rstd = rsqrt(var + eps), y = round(((h - mean) * gamma) * rstd + beta).
struct LayerNormResult {
  std::vector<float> y, mean, rstd, h, amax;
};
LayerNormResult layernorm_reference(const std::vector<float>& x, const std::vector<float>& gamma,
                                    const std::vector<float>& beta,
                                    const std::vector<float>* residual, std::int64_t rows,
                                    std::int64_t dim, float eps, std::int64_t chunk,
                                    float (*round)(float), const NormQuant* quant = nullptr);

// RMSNorm backward as rmsnorm_backward_kernel computes it: dh, and
// dgamma_parts [cores, D]: per core (tiles of `partitions` rows dealt
// round-robin) the sum of rstd * (dy * h) over its rows in order.
struct RmsNormGrads {
  std::vector<float> dh, dgamma_parts;
};
RmsNormGrads rmsnorm_backward_reference(const std::vector<float>& dy, const std::vector<float>& h,
                                        const std::vector<float>& gamma,
                                        const std::vector<float>& rstd, std::int64_t rows,
                                        std::int64_t dim, int cores, int partitions,
                                        float (*round)(float));

// One AdamW step as adamw_kernel computes it, element by element (FP32, one
// rounding per instruction); the vectors are updated in place and the bf16
// copy of the parameters returned.
std::vector<float> adamw_reference(std::vector<float>& param, const std::vector<float>& grad,
                                   std::vector<float>& m, std::vector<float>& v,
                                   const AdamWSpec& spec);

// Softmax forward as softmax_kernel computes it: m = row max,
// e = exp(x - m) (FP32), s = the sum of e in column order, y = round(e * (1/s)).
std::vector<float> softmax_reference(const std::vector<float>& x, std::int64_t rows,
                                     std::int64_t dim, float (*round)(float));
// Softmax backward as softmax_backward_kernel computes it: dot = sum of
// dy * y in column order, dx = round((dy - dot) * y).
std::vector<float> softmax_backward_reference(const std::vector<float>& dy,
                                              const std::vector<float>& y, std::int64_t rows,
                                              std::int64_t dim, float (*round)(float));

// Cross-entropy forward + gradient as cross_entropy_kernel computes it
// (online max / sum over chunks of `chunk` columns, then the second pass).
struct CrossEntropyResult {
  std::vector<float> loss, dlogits;
};
CrossEntropyResult cross_entropy_reference(const std::vector<float>& logits,
                                           const std::vector<float>& targets, std::int64_t rows,
                                           std::int64_t vocab, std::int64_t chunk, float grad_scale,
                                           float (*round)(float));

// elementwise_kernel's arithmetic: one FP32 operation, rounded.
std::vector<float> elementwise_reference(const std::vector<float>& a, const std::vector<float>& b,
                                         const ElementwiseSpec& spec, float (*round)(float));
// reduce_kernel's result: per row, or per core in its order (row tiles of
// `partitions` dealt round-robin, partitions combined in order).
std::vector<float> reduce_reference(const std::vector<float>& x, const ReduceSpec& spec,
                                    int partitions);
// clip_kernel's outputs: grad_out (rounded) and the norm.
struct ClipResult {
  std::vector<float> grad, norm;
};
ClipResult clip_reference(const std::vector<float>& grad, const std::vector<float>& parts,
                          const ClipSpec& spec, float (*round)(float));

// glu_kernel / glu_backward_kernel's arithmetic (one FP32 rounding per step).
std::vector<float> glu_reference(const std::vector<float>& gate, const std::vector<float>& up,
                                 isa::ActFunc act, float (*round)(float));
struct GluGrads {
  std::vector<float> dgate, dup;
};
GluGrads glu_backward_reference(const std::vector<float>& dout, const std::vector<float>& gate,
                                const std::vector<float>& up, isa::ActFunc act,
                                float (*round)(float));

// LayerNorm backward as layernorm_backward_kernel computes it (per core,
// tiles of `partitions` rows dealt round-robin; column sums in row order).
struct LayerNormGrads {
  std::vector<float> dh, dgamma_parts, dbeta_parts;
};
LayerNormGrads layernorm_backward_reference(
    const std::vector<float>& dy, const std::vector<float>& h, const std::vector<float>& gamma,
    const std::vector<float>& mean, const std::vector<float>& rstd, std::int64_t rows,
    std::int64_t dim, int cores, int partitions, float (*round)(float));

// cast_kernel's outputs: y = cast(x (* scale)) and the per-core amax, with
// the kernel's tiling (128 x 2048 units dealt round-robin over the cores).
struct CastResult {
  std::vector<float> y, amax;
};
CastResult cast_reference(const std::vector<float>& x, float scale, const CastSpec& spec,
                          int partitions);

// out [T, D] = table [V, D] rows at ids (given as exact integer values);
// throws tern::Error naming an id outside [0, V).
std::vector<float> embedding_reference(const std::vector<float>& ids,
                                       const std::vector<float>& table, std::int64_t tokens,
                                       std::int64_t vocab, std::int64_t dim);
// dtable [V, D] = 0, then dtable[ids[t]] += dout[t] for t in order, FP32.
std::vector<float> embedding_backward_reference(const std::vector<float>& ids,
                                                const std::vector<float>& dout, std::int64_t tokens,
                                                std::int64_t vocab, std::int64_t dim);

// Attention in FP64 from the (already rounded) inputs in the layouts of
// flash_attention_kernel: the exact math the kernels approximate (tolerance
// checks, not bit-exact). Forward: o [B, Hq, Sq, D] and lse [B, Hq, Sq].
struct AttentionResult {
  std::vector<double> o, lse;
};
AttentionResult attention_reference_f64(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, const AttentionSpec& spec);
// Backward from dO: dq [B, Hq, D, Sq], dk [B, Hkv, D, Sk], dv [B, Hkv, Sk, D].
struct AttentionGrads {
  std::vector<double> dq, dk, dv;
};
AttentionGrads attention_backward_reference_f64(const std::vector<float>& q,
                                                const std::vector<float>& k,
                                                const std::vector<float>& v,
                                                const std::vector<float>& dout,
                                                const AttentionSpec& spec);

// RoPE as rope_kernel computes it (bit-exact): each product rounded to FP32,
// the difference / sum rounded to FP32 then by `round` to the dtype.
std::vector<float> rope_reference(const std::vector<float>& x, const std::vector<float>& cos,
                                  const std::vector<float>& sin, const RopeSpec& spec,
                                  float (*round)(float));

}  // namespace tern::kernel
