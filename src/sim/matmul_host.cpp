#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "sim/matmul_host.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include <omp.h>

#include "sim/matmul_host.h"

HWY_BEFORE_NAMESPACE();
namespace tern::sim {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One step acc + w * x with the rounding the Tensor engine defines.
template <bool kFp32, class V>
HWY_INLINE V Step(V w, V x, V acc) {
  if constexpr (kFp32) {
    return hn::Add(acc, hn::Mul(w, x));  // product rounded, then the sum
  } else {
    return hn::MulAdd(w, x, acc);  // one rounding (callers ensure a fused target)
  }
}

// An MR x (NV vectors) block of outputs: acc[m][n] += sum over k in order
// of w[k][m] x[k][n]. Every output keeps its own k order, so the block
// shape changes only speed.
template <bool kFp32, int MR, int NV, class D>
HWY_INLINE void Block(D d, const float* w, std::ptrdiff_t ldw, const float* x, std::ptrdiff_t ldx,
                      float* acc, std::ptrdiff_t lda, int K) {
  const std::ptrdiff_t L = static_cast<std::ptrdiff_t>(hn::Lanes(d));
  using V = hn::Vec<D>;
  V c[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) c[r][v] = hn::LoadU(d, acc + r * lda + v * L);
  for (int k = 0; k < K; ++k) {
    const float* xr = x + static_cast<std::ptrdiff_t>(k) * ldx;
    const float* wr = w + static_cast<std::ptrdiff_t>(k) * ldw;
    V xv[NV];
    for (int v = 0; v < NV; ++v) xv[v] = hn::LoadU(d, xr + v * L);
    for (int r = 0; r < MR; ++r) {
      const V wv = hn::Set(d, wr[r]);
      for (int v = 0; v < NV; ++v) c[r][v] = Step<kFp32>(wv, xv[v], c[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) hn::StoreU(c[r][v], d, acc + r * lda + v * L);
}

template <bool kFp32>
void Kernel(const float* w, std::ptrdiff_t ldw, const float* x, std::ptrdiff_t ldx, float* acc,
            std::ptrdiff_t lda, int K, int M, int N) {
  const hn::ScalableTag<float> d;
  const int L = static_cast<int>(hn::Lanes(d));
  int m = 0;
  for (; m + 4 <= M; m += 4) {
    float* a0 = acc + static_cast<std::ptrdiff_t>(m) * lda;
    int n = 0;
    // 4 x 4 vectors: 16 accumulators, for targets with 32 vector registers
    // (16-lane AVX-512); 4 x 2 elsewhere.
    if (L >= 16)
      for (; n + 4 * L <= N; n += 4 * L)
        Block<kFp32, 4, 4>(d, w + m, ldw, x + n, ldx, a0 + n, lda, K);
    for (; n + 2 * L <= N; n += 2 * L)
      Block<kFp32, 4, 2>(d, w + m, ldw, x + n, ldx, a0 + n, lda, K);
    for (; n + L <= N; n += L) Block<kFp32, 4, 1>(d, w + m, ldw, x + n, ldx, a0 + n, lda, K);
    for (int r = 0; r < 4; ++r) {
      float* ar = acc + static_cast<std::ptrdiff_t>(m + r) * lda;
      for (int nn = n; nn < N; ++nn) {
        float c = ar[nn];
        for (int k = 0; k < K; ++k) {
          const float wk = w[static_cast<std::ptrdiff_t>(k) * ldw + m + r];
          const float xk = x[static_cast<std::ptrdiff_t>(k) * ldx + nn];
          c = kFp32 ? c + wk * xk : std::fma(wk, xk, c);
        }
        ar[nn] = c;
      }
    }
  }
  for (; m < M; ++m) {
    float* ar = acc + static_cast<std::ptrdiff_t>(m) * lda;
    int n = 0;
    for (; n + L <= N; n += L) {
      auto c = hn::LoadU(d, ar + n);
      for (int k = 0; k < K; ++k) {
        c = Step<kFp32>(hn::Set(d, w[static_cast<std::ptrdiff_t>(k) * ldw + m]),
                        hn::LoadU(d, x + static_cast<std::ptrdiff_t>(k) * ldx + n), c);
      }
      hn::StoreU(c, d, ar + n);
    }
    for (; n < N; ++n) {
      float c = ar[n];
      for (int k = 0; k < K; ++k) {
        const float wk = w[static_cast<std::ptrdiff_t>(k) * ldw + m];
        const float xk = x[static_cast<std::ptrdiff_t>(k) * ldx + n];
        c = kFp32 ? c + wk * xk : std::fma(wk, xk, c);
      }
      ar[n] = c;
    }
  }
}

void MatmulAccumulate(const float* w, std::ptrdiff_t ldw, const float* x, std::ptrdiff_t ldx,
                      float* acc, std::ptrdiff_t lda, int k, int m, int n, bool fp32) {
  if (fp32) {
    Kernel<true>(w, ldw, x, ldx, acc, lda, k, m, n);
    return;
  }
#if HWY_NATIVE_FMA
  Kernel<false>(w, ldw, x, ldx, acc, lda, k, m, n);
#else
  // No fused multiply-add on this target: the exact scalar path.
  for (int mm = 0; mm < m; ++mm)
    for (int nn = 0; nn < n; ++nn) {
      float c = acc[static_cast<std::ptrdiff_t>(mm) * lda + nn];
      for (int kk = 0; kk < k; ++kk)
        c = std::fma(w[static_cast<std::ptrdiff_t>(kk) * ldw + mm],
                     x[static_cast<std::ptrdiff_t>(kk) * ldx + nn], c);
      acc[static_cast<std::ptrdiff_t>(mm) * lda + nn] = c;
    }
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace tern::sim
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tern::sim {
HWY_EXPORT(MatmulAccumulate);
void matmul_accumulate(const float* w, const float* x, std::ptrdiff_t ldx, float* acc,
                       std::ptrdiff_t lda, int k, int m, int n, bool fp32, int threads) {
  // Output rows are independent: split them over threads. Each row's sum
  // keeps its contraction order, so the bits do not depend on the split.
  // A thread per 2^20 multiply-adds (tens of microseconds): a smaller
  // product costs less than waking the pool's threads.
  const long long work = static_cast<long long>(k) * m * n;
  const int t = std::max(1, std::min({threads, m, static_cast<int>(work >> 20) + 1}));
  if (t == 1 || omp_in_parallel()) {
    HWY_DYNAMIC_DISPATCH(MatmulAccumulate)(w, m, x, ldx, acc, lda, k, m, n, fp32);
    return;
  }
  // OpenMP's pool: its threads persist between calls (a thread started per
  // call cost more than the arithmetic of a small product).
  const int chunk = (m + t - 1) / t;
#pragma omp parallel for num_threads(t) schedule(static, 1)
  for (int part = 0; part < t; ++part) {
    const int m0 = part * chunk, rows = std::min(chunk, m - m0);
    if (rows <= 0) continue;
    HWY_DYNAMIC_DISPATCH(MatmulAccumulate)
    (w + m0, m, x, ldx, acc + static_cast<std::ptrdiff_t>(m0) * lda, lda, k, rows, n, fp32);
  }
}
}  // namespace tern::sim
#endif
