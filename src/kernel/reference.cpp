#include "kernel/reference.h"

#include <cmath>

#include "num/mx.h"

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

std::vector<float> mx_roundtrip_columns(const std::vector<float>& v, std::int64_t k, std::int64_t c,
                                        bool e5m2) {
  const num::MxFormat& f = num::mx_format(e5m2 ? num::MxId::mxfp8_e5m2 : num::MxId::mxfp8_e4m3);
  std::vector<float> col(static_cast<std::size_t>(k)), deq(col.size()), out(v.size());
  std::vector<std::uint8_t> el(col.size()), sc(col.size() / num::kMxBlock);
  for (std::int64_t j = 0; j < c; ++j) {
    for (std::int64_t i = 0; i < k; ++i) col[i] = v[static_cast<std::size_t>(i * c + j)];
    num::mx_quantize(f, num::ScalePolicy::trn3, col, el, sc);
    num::mx_dequantize(f, el, sc, deq);
    for (std::int64_t i = 0; i < k; ++i) out[static_cast<std::size_t>(i * c + j)] = deq[i];
  }
  return out;
}

}  // namespace tern::kernel
