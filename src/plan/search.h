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
  // Fastest first, one per distinct plan: layouts with the same step time
  // and memory (e.g. a recompute mode that changes nothing with fused
  // attention) are one entry, the first of them in `best`, the others in
  // `alternatives` at the same index.
  std::vector<Estimate> best;
  std::vector<std::vector<Layout>> alternatives;
  std::int64_t evaluated = 0;  // layouts the model was evaluated on
  std::int64_t fitting = 0;    // of those, the ones that fit HBM
};

SearchResult search(const Planner& planner, const SearchOptions& opt = {});

}  // namespace tern::plan
