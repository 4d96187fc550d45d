// The reference interpreter: every op of a graph evaluated on the host in
// float64 with the textbook formula (no rounding to the values' dtypes:
// casts are the identity). It is the ground truth for autodiff (finite
// differences) and for checking compiled programs, not a fast path.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "graph/ir.h"

namespace tern::graph {

// Row-major values of one tensor.
using HostData = std::vector<double>;

// Evaluates g with `feeds` (one entry per input and param, by name, holding
// elements(shape) values; ids as exact integers). Returns every value's
// data, indexed by value id. Throws tern::Error naming a missing or
// mis-sized feed, an out-of-range id, or an op it cannot evaluate.
// With `scaling`: matmuls with delayed FP8 scaling (graph/quant.h) use its
// scales, record their operands' amax, and the state updates at the end
// (one evaluate is one training step); without, they are an error.
// With `monitor`: each quantized matmul operand's health (QuantStats,
// graph/quant.h) by site "<matmul output>.a" / ".b".
class DelayedScaling;
struct QuantStats;
std::vector<HostData> evaluate(const Graph& g, const std::map<std::string, HostData>& feeds,
                               DelayedScaling* scaling = nullptr,
                               std::map<std::string, QuantStats>* monitor = nullptr);

}  // namespace tern::graph
