// Test data for compiled graphs: BF16 normal values, token ids, and the
// error measure the runtime tests use.
#pragma once

#include <cmath>
#include <map>
#include <random>
#include <string>
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

// Feeds for a GPT-2 graph (graph/models.h): its params (LayerNorm weights
// 1, LayerNorm biases N(0, 0.02), the rest N(0, 0.05), in BF16) and a
// batch of `n` token ids and targets below `vocab`.
inline std::map<std::string, std::vector<float>> gpt2_feeds(const Graph& g,
                                                            const std::vector<int>& params,
                                                            std::int64_t n, std::int64_t vocab,
                                                            std::mt19937& rng) {
  std::map<std::string, std::vector<float>> feeds;
  for (int p : params) {
    const Value& v = g.value(p);
    const auto count = static_cast<std::size_t>(elements(v.shape));
    const bool ln = v.name.find("ln_") != std::string::npos;
    feeds[v.name] = ln && v.name.back() == 'w' ? std::vector<float>(count, 1.0f)
                                               : bf16_normal(count, rng, ln ? 0.02f : 0.05f);
  }
  feeds["ids"] = tokens(rng, n, vocab);
  feeds["targets"] = tokens(rng, n, vocab);
  return feeds;
}

}  // namespace tern::graph
