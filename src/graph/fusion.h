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
//   - attention_backward with the head merges and the sum of its dq, dk, dv
//     into a fused qkv projection's gradient (QkvGradView);
//   - attention's o written straight into its head merge [B, S, H, D] (and
//     read from there by the backward), dO read from the head split of its
//     gradient;
//   - reshapes are views: absorbed by the kernel that reads them; so are the
//     head split chains (slice, reshape, transpose) of attention's q, k, v,
//     which the attention kernels read through strided views (HeadView).
// Every other op runs as its own kernel; the report says why.
#pragma once

#include <cstdint>
#include <map>
#include <set>
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

// q, k or v of attention given as transpose([0, 2, 1, 3]) of reshape([B, S,
// H, D]) of X [B, S, W] (or of a slice of X's last dim from col0): no
// kernel computes it; the attention kernels read X through a strided view.
struct HeadView {
  int source = -1;  // X
  std::int64_t col0 = 0, batch = 0, seq = 0, heads = 0, head_dim = 0, width = 0;
};

// attention_backward whose dq, dk and dv reach the rest of the graph only as
// zero-padded head merges (transpose [0, 2, 1, 3] -> reshape [B, S, H D] ->
// pad of the last dim) summed by adds into G [B, S, width], the pads' column
// ranges tiling [0, width): the gradient of a fused qkv projection. The
// kernel writes G itself (kernel::AttentionSpec::qkv_width); no transpose,
// pad or add runs.
struct QkvGradView {
  int dest = -1;                        // G
  std::int64_t width = 0, col[3] = {};  // dq's, dk's, dv's first column
};

struct FusionReport {
  std::vector<KernelGroup> groups;       // in execution order
  std::vector<int> group_of;             // node -> group index (-1: leaves and constants)
  std::vector<std::string> alone;        // node -> why it runs alone ("" when fused)
  std::map<int, HeadView> views;         // by the transpose's output value
  std::map<int, int> alias;              // a view chain's values -> the value they read
  std::map<int, QkvGradView> qkv_grads;  // by the attention_backward node
  // Attention's o written straight into its head merge: o -> the value of
  // transpose(o, [0, 2, 1, 3]) whose [B, S, H, D] buffer holds it (the
  // kernels read and write it with AttentionSpec::o_width).
  std::map<int, int> stored_in;
  // Nodes an attention kernel absorbs into its own reads and writes (the
  // qkv gradient merges, o's transposes) besides the head views in `alias`.
  std::set<int> absorbed;
  int ops = 0;    // ops counted (all but input / param / full)
  int fused = 0;  // of them, in a group with another op
  double rate() const { return ops ? static_cast<double>(fused) / ops : 0.0; }
};

FusionReport fuse(const Graph& g);

// A readable table: each op, the kernel it landed in, and the reason for
// each unfused op; then the fusion rate.
std::string fusion_table(const Graph& g, const FusionReport& r);

}  // namespace tern::graph
