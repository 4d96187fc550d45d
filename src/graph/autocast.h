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
// through the casts.
//
// Recipes (numerics.md section 5) are "all" to BF16 plus quantized matmul
// operands (quant.h) on every linear layer (a matmul whose second operand
// is a matrix) except the LM head (a matmul whose result reaches
// cross_entropy through reshapes and casts), which stays BF16 with the
// embeddings, norms, softmax and the loss:
//   bf16        no quantization;
//   fp8-hybrid  E4M3 activations and weights, E5M2 gradients, per-tensor
//               current scaling;
//   mxfp8       MXFP8 E4M3 for all (gradients too), blocks of 32 along the
//               contraction dim, `policy` scales (rceil by default);
//   mxfp4       weights (params) MXFP4, activations and gradients MXFP8.
// --autocast-type fp8_e4m3 with matmult / all: the matmuls' operands (and
// gradients) per-tensor E4M3 with current scaling, the rest BF16.
// Per-tensor FP8 takes current scaling by default, or delayed scaling
// (set_fp8_scaling; an amax history across steps, quant.h).
#pragma once

#include <string>
#include <vector>

#include "graph/ir.h"
#include "graph/quant.h"

namespace tern::graph {

struct AutocastOptions {
  std::string mode = "none";   // none, matmult, all
  DType type = DType::bf16;    // bf16 or fp16: what ops compute in
  std::string recipe;          // "" or the recipe's name
  MatmulQuant quant;           // the linear layers' operands (none: plain casts)
  bool mxfp4_weights = false;  // mxfp4: params as MXFP4, the rest as `quant`
  // Matmuls with a param operand whose name starts with one of these stay
  // unquantized (the trainer's per-layer fallback to bf16: "h.3.").
  std::vector<std::string> keep_high;
};

// Parses "none|matmult|all" and "bf16|fp16|fp8_e4m3" (errors name the
// choices).
AutocastOptions parse_autocast(const std::string& mode, const std::string& type);
// A recipe by name ("bf16", "fp8-hybrid", "mxfp8", "mxfp4") with an MX scale
// policy ("rceil", "trn3", "ocp-floor").
AutocastOptions recipe(const std::string& name, const std::string& mx_policy = "rceil");
// "current" or "delayed" scaling of the per-tensor FP8 operands (fp8-hybrid,
// fp8_e4m3) with an amax history of `history` steps. Throws for a bad
// name, a history < 1, or delayed scaling without per-tensor FP8.
void set_fp8_scaling(AutocastOptions& o, const std::string& scaling, std::int64_t history = 1024);
// The list of recipe names, for help texts and errors.
inline constexpr const char* kRecipes = "bf16, fp8-hybrid, mxfp8, mxfp4";

// The rewritten graph (a copy; `g` is unchanged). Value names are kept;
// a graph output whose dtype changed keeps its name on the cast back.
Graph autocast(const Graph& g, const AutocastOptions& opt);

}  // namespace tern::graph
