// Reverse-mode autodiff over the graph IR: appends the backward pass to the
// graph, op by op in reverse order, using the backward ops of ops.h (which
// the kernel library implements: norm, softmax, attention, embedding,
// activation backward) and matmuls / reductions for the rest.
#pragma once

#include <map>
#include <vector>

#include "graph/ir.h"

namespace tern::graph {

// Adds to g the gradient of the scalar `loss` (shape []) with respect to
// each value of `wrt` (typically the params). Returns value id -> gradient
// value id (same shape and dtype as the value; a value the loss does not
// depend on gets a zero tensor). Gradients are named "grad.<name>" (unless
// one gradient value serves two of them, or is a graph input).
// Throws tern::Error for a non-scalar loss, NotSupported for an op it
// cannot differentiate (the backward ops themselves; the lse output of
// attention; rope's cos and sin; a transposed batched matmul operand
// against a shared matrix).
std::map<int, int> add_backward(Graph& g, int loss, const std::vector<int>& wrt);
// The same from given output gradients (a vector-Jacobian product): `seeds`
// maps values (graph outputs of a pipeline stage, say) to their gradients,
// same shape and dtype (inputs of the graph, typically). Throws tern::Error
// for a seed of another shape or dtype.
std::map<int, int> add_backward(Graph& g, const std::map<int, int>& seeds,
                                const std::vector<int>& wrt);

}  // namespace tern::graph
