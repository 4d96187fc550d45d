// The Tensor engine's arithmetic on the host (numerics.md section 4):
// acc[m][n] <- acc[m][n] + sum_k w[k][m] * x[k][n], accumulated in FP32 with
// round-to-nearest-even in contraction order k = 0..K-1 onto the PSUM value.
// For inputs of <= 11-bit significands each step is one rounding of the
// exact product-sum (FMA semantics); for FP32 inputs the product is rounded
// to FP32 first, then added. Vectorized over n; the order over k is kept, so
// results are bit-exact and independent of the host's vector width.
#pragma once

#include <cstddef>

namespace tern::sim {

// w: [k][m] contiguous; x: [k][n] with row stride ldx; acc: [m][n] with
// row stride ldacc (floats).
// Output rows are spread over up to `threads` host threads (small products
// stay on one); the bits are the same for any thread count.
void matmul_accumulate(const float* w, const float* x, std::ptrdiff_t ldx, float* acc,
                       std::ptrdiff_t ldacc, int k, int m, int n, bool fp32_products,
                       int threads = 1);

}  // namespace tern::sim
