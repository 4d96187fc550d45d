// The text form of a graph (.tgraph files), one node per line:
//
//   graph block {
//     %x = input : [4, 8] bfloat16
//     %w = param : [8, 16] bfloat16
//     %h = matmul %x, %w {trans_b = 1} : [4, 16] bfloat16
//     %dx, %dg = rmsnorm_backward %dy, %x, %g {eps = 1e-06} : [4, 8] float32, [8] float32
//     output %h, %dx
//   }
//
// Every result carries its type after ':'; the parser infers it again and
// rejects a mismatch. Attribute values: integers, reals (with '.' or an
// exponent), names, and integer lists [1, 2]. '#' starts a comment.
// print(parse(text)) == text for printed graphs (tests/graph).
#pragma once

#include <string>
#include <string_view>

#include "graph/ir.h"

namespace tern::graph {

std::string print(const Graph& g);
// Throws tern::Error "<source>:<line>: <what>" on any error.
Graph parse(std::string_view text, const std::string& source = "<text>");
Graph load(const std::string& path);
// Writes atomically (temporary file + rename).
void save(const Graph& g, const std::string& path);

}  // namespace tern::graph
