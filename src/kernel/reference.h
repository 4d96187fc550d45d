// Host references for checking simulated kernels (used by `tern bench`).
#pragma once

#include <cstdint>
#include <vector>

namespace tern::kernel {

// C[M, N] = A^T[K, M]^T @ B[K, N], summed over k in order with one FP32
// rounding per step (FMA) for inputs of <= 11-bit significands, or the
// product rounded first for FP32 inputs: the Tensor engine's arithmetic
// (numerics.md section 4), written as the plain triple loop.
std::vector<float> matmul_reference(const std::vector<float>& at, const std::vector<float>& b,
                                    std::int64_t m, std::int64_t n, std::int64_t k,
                                    bool fp32_products);

}  // namespace tern::kernel
