// `tern plan search`: every valid layout of a model on a chip count,
// evaluated by the Planner, the ones that do not fit HBM pruned, the best k
// kept by step time (or cost, which ranks the same at a fixed chip count).
#pragma once

#include <cstdint>
#include <vector>

#include "plan/estimate.h"

namespace tern::plan {

struct SearchOptions {
  int top = 10;
  std::vector<int> micro_batches = {1, 2, 4, 8};  // tried where they divide the batch
  int max_vpp = 8;                                // interleaving depths tried (divisors)
};

struct SearchResult {
  std::vector<Estimate> best;  // fastest first
  std::int64_t evaluated = 0;  // layouts the model was evaluated on
  std::int64_t fitting = 0;    // of those, the ones that fit HBM
};

SearchResult search(const Planner& planner, const SearchOptions& opt = {});

}  // namespace tern::plan
