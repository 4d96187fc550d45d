#include "kernel/reference.h"

#include <cmath>

namespace tern::kernel {

std::vector<float> matmul_reference(const std::vector<float>& at, const std::vector<float>& b,
                                    std::int64_t m, std::int64_t n, std::int64_t k,
                                    bool fp32_products) {
  std::vector<float> c(static_cast<std::size_t>(m * n), 0.0f);
  for (std::int64_t i = 0; i < m; ++i) {
    float* row = c.data() + i * n;
    for (std::int64_t kk = 0; kk < k; ++kk) {
      const float a = at[static_cast<std::size_t>(kk * m + i)];
      const float* br = b.data() + kk * n;
      if (fp32_products) {
        for (std::int64_t j = 0; j < n; ++j) {
          const float p = a * br[j];
          row[j] = row[j] + p;
        }
      } else {
        for (std::int64_t j = 0; j < n; ++j) row[j] = std::fma(a, br[j], row[j]);
      }
    }
  }
  return c;
}

}  // namespace tern::kernel
