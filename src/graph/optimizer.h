// The optimizer step in the graph: add_adamw appends one AdamW op per
// trained param to a training-step graph (after add_backward), with FP32
// master weights and moments as inputs and their updates carried back into
// them (Graph::carry), so one compiled program is the whole training step
// (forward, backward, optimizer) and reruns step after step.
//
// For a param %p of dtype bf16 (fp32 masters, as mixed-precision training
// keeps them):
//   inputs   %p.master (fp32; start: p's values), %p.adam_m, %p.adam_v
//            (fp32; start: zeros), and one %adamw.scalars [5] fp32 per graph
//            (the step's scalars: runtime::adamw_scalars(lr, wd, ...));
//   outputs  %p.next (bf16, carried into %p), %p.master.next,
//            %p.adam_m.next, %p.adam_v.next (carried into their inputs).
// An fp32 param is its own master (no %p.master).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "graph/ir.h"

namespace tern::graph {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // torch.optim.AdamW's defaults
  // Weight-decay groups as GPT-2 / nanoGPT train: params of rank >= 2
  // (matrices, embeddings) read %adamw.scalars, the others (biases, norm
  // weights) %adamw.scalars_no_decay, fed with weight decay 0.
  bool no_decay_group = false;
};

// What a runtime must write before the first step.
struct OptimizerInputs {
  std::string scalars;                        // "adamw.scalars"
  std::string scalars_no_decay;               // "" or "adamw.scalars_no_decay"
  std::map<std::string, std::string> master;  // master input -> the param it starts from
  std::vector<std::string> zeros;             // moments: start at 0
};

// `grads`: param -> its gradient (add_backward's result).
OptimizerInputs add_adamw(Graph& g, const std::map<int, int>& grads, const AdamWConfig& c = {});

}  // namespace tern::graph
