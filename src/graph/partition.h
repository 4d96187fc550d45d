// Parts of a graph: what a pipeline stage runs.
#pragma once

#include <string>
#include <vector>

#include "graph/ir.h"

namespace tern::graph {

// The part of `g` that computes the values named `outputs` when the values
// named `cut` are given: those become inputs of the same name, shape and
// dtype; the inputs, params and constants the part reads come along under
// their names; every node keeps its attributes and output names, in g's
// order (so a stage of a model computes exactly what the whole model
// computes there). Throws tern::Error naming a value g lacks.
Graph extract(const Graph& g, const std::vector<std::string>& cut,
              const std::vector<std::string>& outputs, const std::string& name);

}  // namespace tern::graph
