// What each graph op takes and gives: arity and the shape / dtype rule.
#pragma once

#include <vector>

#include "graph/ir.h"

namespace tern::graph {

struct OutType {
  Shape shape;
  DType dtype = DType::fp32;
  bool operator==(const OutType&) const = default;
};

// Inputs an op takes: [min, max] (max -1: any number).
struct Arity {
  int min = 0, max = 0;
};
Arity op_arity(Op op);
int op_outputs(Op op);

// The output types of `op` on inputs `in` with `attrs`. Throws tern::Error
// with the reason (the caller adds which node it is).
std::vector<OutType> infer(Op op, const std::vector<const Value*>& in, const Attrs& attrs);

// Whether a transpose node swaps its last two dims and nothing else (a
// matmul layout flag, a per-matrix transpose).
bool swaps_last_two(const Node& transpose);

// The shape a and b broadcast to (NumPy rules); throws tern::Error.
Shape broadcast_shapes(const Shape& a, const Shape& b);

}  // namespace tern::graph
