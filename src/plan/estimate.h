// The planner's analytical model of one training step of a Model on N chips
// of a system with a given Layout: time and memory per chip, broken down,
// with throughput, MFU / HFU and time and cost to train. docs/plan.md gives
// every formula and its source; nothing here runs the simulator.
#pragma once

#include <optional>
#include <string>

#include "arch/system.h"
#include "fabric/collective.h"
#include "plan/compute.h"
#include "plan/inputs.h"

namespace tern::plan {

// One optimizer step, on the slowest pipeline stage.
struct StepTime {
  Nanoseconds forward, backward, recompute;  // compute of all micro-batches
  Nanoseconds tp_comm;     // tensor-parallel all-reduce (or gather / scatter), exposed
  Nanoseconds cp_comm;     // context-parallel K/V gathers and their gradients
  Nanoseconds ep_comm;     // expert-parallel all-to-all (dispatch, combine)
  Nanoseconds pp_p2p;      // stage-to-stage activations and gradients
  Nanoseconds pp_bubble;   // pipeline fill and drain: (p-1)/v micro-batch slots
  Nanoseconds dp_exposed;  // gradient (ZeRO: and parameter) traffic not hidden
  Nanoseconds optimizer;   // the Adam update of this chip's shard
  Nanoseconds step;        // the sum
  Nanoseconds dp_total;    // all DP traffic, hidden or not
  std::string tp_algorithm, dp_algorithm;
};

struct MemoryUse {
  Bytes weights, grads, optimizer;  // model state (ZeRO shards it)
  Bytes activations;                // in-flight micro-batches' saved tensors
  Bytes logits;                     // FP32 logits and their gradient (last stage)
  Bytes total;                      // the sum
  Bytes usable;                     // HBM less the reserve
  bool fits = false;
};

struct Estimate {
  Layout layout;
  StepTime time;
  MemoryUse memory;
  std::int64_t micro_batches = 0;  // per pipeline per step
  double tokens_per_step = 0;
  double tokens_per_s = 0;
  double model_flops_per_token = 0;  // 6 N + 12 L h s (N: see Planner::flop_params)
  double mfu = 0, hfu = 0;           // of the recipe's dense peak
  double mfu_bf16 = 0;               // of the BF16 peak
  double days_to_train = 0, chip_hours = 0, cost_usd = 0;  // when tokens > 0
};

class Planner {
 public:
  // Throws Error for an unknown system, a bad model or training section, a
  // chip count the system cannot form, or a recipe the device lacks.
  // Layouts count ranks: chips x system.ranks_per_chip(lnc) (Trainium:
  // NeuronCores, logical cores under LNC; lnc 0: the chip's default).
  Planner(const arch::SystemSpec& system, Model model, Training training, int chips, int lnc = 0);

  // Throws Error naming what is wrong when validate() fails or a group does
  // not map onto the fabric.
  Estimate estimate(const Layout& layout) const;
  // The same without validation or exceptions, for search; nullopt (and
  // the reason in `why`) when the layout's groups cannot be placed on the
  // fabric or a collective has no algorithm in the system's library.
  std::optional<Estimate> evaluate(const Layout& layout, std::string* why = nullptr) const;

  const Model& model() const { return model_; }
  const Training& training() const { return training_; }
  const arch::SystemSpec& system() const { return system_; }
  const fabric::Network& network() const { return net_; }
  const ComputeModel& compute() const { return compute_; }
  int chips() const { return chips_; }
  int lnc() const { return lnc_; }
  int ranks_per_chip() const { return compute_.ranks_per_chip(); }
  // What a layout's dp x tp x pp x cp must equal.
  int ranks() const { return chips_ * ranks_per_chip(); }

  // Parameter counts: all, and those a token's FLOPs touch (MoE: top_k
  // experts; no embedding tables, but the output projection).
  double params() const { return params_; }
  double flop_params() const { return flop_params_; }

 private:
  std::optional<Estimate> evaluate_or_throw(const Layout& layout, std::string* why) const;
  arch::SystemSpec system_;
  Model model_;
  Training training_;
  int chips_;
  int lnc_;
  fabric::Network net_;
  ComputeModel compute_;
  std::string dtype_;
  double params_ = 0, flop_params_ = 0;
  double layer_params_ = 0, expert_params_ = 0, embed_params_ = 0, output_params_ = 0;
};

// The network of `chips` chips of `s` as its ranks see it (fabric::Network::
// with_ranks_per_chip): on Trainium the innermost level joins the chip's
// (logical) cores, whose transfers are DMAs through the shared HBM: each
// byte read and written once, HBM bandwidth / (2 x ranks per chip) per rank,
// one DMA's fixed cost (plus descriptor generation) per step.
fabric::Network rank_network(const arch::SystemSpec& s, int chips, int ranks_per_chip);

// Where the ranks of one layout dimension ("tp", "cp", "dp", "pp", "ep") lie
// on the network's levels (see fabric::Group); nullopt when the order puts
// them across levels irregularly.
std::optional<fabric::Group> group_of(const Layout& l, std::string_view dim,
                                      const fabric::Network& net);

}  // namespace tern::plan
