// Operator fusion: partitions a graph's ops into the kernels that will run
// them (the kernel library's generators), the way the Neuron compiler fuses
// "GEMM + activation, softmax, attention". Patterns, in priority order:
//   - attention: matmul(q, k^T) [-> scale] -> softmax -> matmul(., v)
//     becomes flash attention; attention / attention_backward ops are that
//     kernel already;
//   - matmul + epilogue chain (scale, bias [N], activation, residual, cast,
//     in the epilogue's order), transposes of its operands absorbed as
//     layout flags;
//   - norm with the residual add before it (the kernel writes the sum too)
//     and a cast after it (quantized output);
//   - GLU: mul(act(gate), up) and its backward (two muls + act_backward);
//   - cross_entropy with its backward (one pass gives loss and dlogits);
//   - chains of elementwise ops into one pass;
//   - reshapes are views: absorbed by the kernel that reads them.
// Every other op runs as its own kernel; the report says why.
#pragma once

#include <string>
#include <vector>

#include "graph/ir.h"

namespace tern::graph {

struct KernelGroup {
  std::string kernel;      // kernel library name: "matmul", "rmsnorm", "flash_attention", ...
  std::string detail;      // e.g. "epilogue bias,gelu,residual"
  std::vector<int> nodes;  // graph nodes it runs, in graph order
  int last() const { return nodes.back(); }
};

struct FusionReport {
  std::vector<KernelGroup> groups;  // in execution order
  std::vector<int> group_of;        // node -> group index (-1: leaves and constants)
  std::vector<std::string> alone;   // node -> why it runs alone ("" when fused)
  int ops = 0;                      // ops counted (all but input / param / full)
  int fused = 0;                    // of them, in a group with another op
  double rate() const { return ops ? static_cast<double>(fused) / ops : 0.0; }
};

FusionReport fuse(const Graph& g);

// A readable table: each op, the kernel it landed in, and the reason for
// each unfused op; then the fusion rate.
std::string fusion_table(const Graph& g, const FusionReport& r);

}  // namespace tern::graph
