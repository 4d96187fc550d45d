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

// RMSNorm forward as rmsnorm_kernel computes it (one FP32 rounding per step:
// the sum of squares in column order, rsqrt(sum * (1/D) + eps), then
// y = round((h * gamma) * rstd)): returns y, fills rstd [R] and, with a
// residual, h = round(x + residual). `round` rounds to the tensors' dtype.
struct RmsNormResult {
  std::vector<float> y, rstd, h;
};
RmsNormResult rmsnorm_reference(const std::vector<float>& x, const std::vector<float>& gamma,
                                const std::vector<float>* residual, std::int64_t rows,
                                std::int64_t dim, float eps, float (*round)(float));

// LayerNorm forward as layernorm_kernel computes it: statistics by
// isa::bn_stats_row over chunks of `chunk` columns and isa::bn_aggr_row,
// rstd = rsqrt(var + eps), y = round(((h - mean) * rstd) * gamma + beta).
struct LayerNormResult {
  std::vector<float> y, mean, rstd, h;
};
LayerNormResult layernorm_reference(const std::vector<float>& x, const std::vector<float>& gamma,
                                    const std::vector<float>& beta,
                                    const std::vector<float>* residual, std::int64_t rows,
                                    std::int64_t dim, float eps, std::int64_t chunk,
                                    float (*round)(float));

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
