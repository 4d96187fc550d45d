// Activation recomputation: forward values the backward pass reads are
// recomputed just before their first backward reader instead of being kept
// in HBM from the forward pass to the backward pass. "selective" recomputes
// the cheap ops (activations, norms, elementwise ops, reshapes) whose
// inputs the backward keeps anyway or that are themselves recomputed, as
// Megatron's selective recomputation does for the cheap parts of a layer;
// matmuls and attention are never recomputed.
#pragma once

#include <string>

#include "graph/ir.h"

namespace tern::graph {

// policy: "none" or "selective". `loss` marks the end of the forward pass
// (nodes after it are the backward pass, as add_backward appends them).
// Returns the rewritten graph (a copy): value names are kept, recomputed
// copies are named "<name>.re". Results are bit-identical: the copies run
// the same kernels on the same inputs.
Graph recompute(const Graph& g, int loss, const std::string& policy);

}  // namespace tern::graph
