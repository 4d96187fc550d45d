#include "isa/select_ops.h"

#include <algorithm>
#include <cmath>

namespace tern::isa {

void max8_row(const float* x, std::size_t n, float out[8]) {
  // A partial sort of at most 8 kept values: NaN compares as the largest
  // (the Vector engine's max passes NaN through).
  auto greater = [](float a, float b) { return std::isnan(a) ? !std::isnan(b) : a > b; };
  std::size_t have = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i];
    if (have == 8 && !greater(v, out[7])) continue;
    std::size_t k = have < 8 ? have++ : 7;
    while (k > 0 && greater(v, out[k - 1])) {
      out[k] = out[k - 1];
      --k;
    }
    out[k] = v;
  }
}

void find_index8_row(const float* x, std::size_t n, const float vals[8], float out[8]) {
  for (int j = 0; j < 8; ++j) {
    out[j] = kNotFound;
    for (std::size_t i = 0; i < n; ++i) {
      if (x[i] == vals[j]) {
        out[j] = static_cast<float>(i);
        break;
      }
    }
  }
}

void match_replace8_row(float* x, std::size_t n, const float vals[8], float imm, float idx[8]) {
  for (int j = 0; j < 8; ++j) {
    idx[j] = 0.0f;
    for (std::size_t i = 0; i < n; ++i) {
      if (x[i] == vals[j]) {
        x[i] = imm;
        idx[j] = static_cast<float>(i);
        break;
      }
    }
  }
}

void scan_row(const float* d0, const float* d1, std::size_t n, float init, AluOp op0, AluOp op1,
              bool reverse0, bool reverse1, float* out) {
  float r = init;
  for (std::size_t i = 0; i < n; ++i) {
    const float t = reverse0 ? apply_alu(op0, r, d0[i]) : apply_alu(op0, d0[i], r);
    r = reverse1 ? apply_alu(op1, d1[i], t) : apply_alu(op1, t, d1[i]);
    out[i] = r;
  }
}

void nonzero_row(const float* x, std::size_t n, float offset, float pad, float* dst) {
  std::size_t k = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (x[i] != 0.0f) dst[k++] = offset + static_cast<float>(i);
  std::fill(dst + k, dst + n, pad);
  dst[n] = static_cast<float>(k);
}

void sequence_bounds_row(const float* ids, std::size_t n, float* dst) {
  float* start = dst;
  float* end = dst + n;
  for (std::size_t i = 0; i < n; ++i) {
    const bool run = i > 0 && ids[i] == ids[i - 1];
    start[i] = ids[i] == 0.0f ? static_cast<float>(n) : run ? start[i - 1] : static_cast<float>(i);
  }
  for (std::size_t j = n; j-- > 0;) {
    const bool run = j + 1 < n && ids[j] == ids[j + 1];
    end[j] = ids[j] == 0.0f ? -1.0f : run ? end[j + 1] : static_cast<float>(j + 1);
  }
}

}  // namespace tern::isa
