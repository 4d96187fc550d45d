// Test data for compiled graphs: BF16 normal values, token ids, and the
// error measure the runtime tests use.
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "graph/eval.h"
#include "isa/dtype.h"
#include "num/convert.h"

namespace tern::graph {

inline std::vector<float> bf16_normal(std::size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = num::round_to(*isa::format_of(DType::bf16), d(rng));
  return v;
}

inline double max_rel_error(const std::vector<float>& got, const HostData& want) {
  double err = 0, scale = 1e-30;
  for (std::size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

// Token ids (or targets) in [0, vocab) for a [batch, seq] input.
inline std::vector<float> tokens(std::mt19937& rng, std::int64_t n, std::int64_t vocab) {
  std::uniform_int_distribution<int> tok(0, static_cast<int>(vocab) - 1);
  std::vector<float> t(static_cast<std::size_t>(n));
  for (float& x : t) x = static_cast<float>(tok(rng));
  return t;
}

}  // namespace tern::graph
