// Autocast: the precision policy of a graph, as the Neuron compiler's
// --auto-cast none|matmult|all with --auto-cast-type. A pass that rewrites
// a graph written in FP32 (master precision) so that chosen ops compute in
// `type`: each op gets a compute dtype and its float inputs a cast to it
// (one cast per value and dtype, reused), graph outputs are cast back to
// their original dtype (the loss and gradients stay FP32).
//   matmult: matmul and attention compute in `type`, their outputs are
//            cast back, everything else stays as written;
//   all:     every op computes in `type` except norms, softmax,
//            cross-entropy and embedding (and their backward ops), which
//            stay in the original precision (training.md: keep them high).
// Run it on the forward graph, then add_backward: the gradients flow
// through the casts. FP8 types need per-tensor scales (the fp8 recipes) and
// are not supported here.
#pragma once

#include <string>

#include "graph/ir.h"

namespace tern::graph {

struct AutocastOptions {
  std::string mode = "none";  // none, matmult, all
  DType type = DType::bf16;   // bf16 or fp16
};

// Parses "none|matmult|all" and "bf16|fp16|..." (errors name the choices;
// FP8 types: NotSupported).
AutocastOptions parse_autocast(const std::string& mode, const std::string& type);

// The rewritten graph (a copy; `g` is unchanged). Value names are kept;
// a graph output whose dtype changed keeps its name on the cast back.
Graph autocast(const Graph& g, const AutocastOptions& opt);

}  // namespace tern::graph
