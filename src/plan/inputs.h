// What a plan is asked about: a model's shape, how it is trained, and the
// parallel layout. Plain data; validate() says what is wrong with it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tern::plan {

// A decoder-only transformer (GPT / Llama style), optionally MoE.
struct Model {
  std::string name = "model";
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;  // 0: equal to heads (no GQA)
  int ffn = 0;       // 0: 4 x hidden
  int vocab = 0;
  int seq = 0;
  int experts = 0;                // 0 or 1: dense MLP
  int top_k = 1;                  // experts per token (MoE)
  bool gated_mlp = false;         // SwiGLU (Llama): three ffn matrices instead of two
  bool tied_embeddings = false;   // the output projection reuses the input embedding
  bool learned_positions = true;  // GPT: a [seq, hidden] position table; Llama: RoPE
  bool biases = true;  // GPT: linear biases and LayerNorm (weight + bias); Llama: none, RMSNorm

  int kv() const { return kv_heads > 0 ? kv_heads : heads; }
  int ffn_dim() const { return ffn > 0 ? ffn : 4 * hidden; }
  int head_dim() const { return hidden / heads; }
  bool moe() const { return experts > 1; }
};

enum class Recompute { none, selective, full };
std::string_view recompute_name(Recompute r);

struct Training {
  std::int64_t global_batch = 0;  // sequences per optimizer step
  int micro_batch = 1;            // sequences per micro-batch per pipeline
  double tokens = 0;              // tokens to train (0: no time-to-train)
  std::string recipe = "bf16";    // GEMM precision: bf16, fp8, mxfp8
  // "flash": attention never writes its scores to HBM (FlashAttention);
  // "unfused": scores and probabilities go through HBM (Megatron 2021-22).
  std::string attention = "flash";
  double dp_overlap = 1.0;         // fraction of the last backward that can hide DP traffic
  double tp_overlap = 0.0;         // fraction of TP traffic hidden behind GEMMs
  int grad_bytes = 2;              // bytes per gradient element in the DP reduction
  double price_per_chip_hour = 0;  // USD; 0: no cost
  double hbm_reserve = 0.05;       // HBM kept free (allocator, workspace), fraction
};

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  int vpp = 1;      // interleaved pipeline: model chunks per device
  int ep = 1;       // expert parallel, carved out of dp
  int cp = 1;       // context parallel (sequence split across chips)
  bool sp = false;  // Megatron sequence parallelism (with tp > 1)
  int zero = 0;     // ZeRO stage 0-3
  Recompute recompute = Recompute::none;
  int micro_batch = 0;  // sequences per micro-batch; 0: the training's
  // Rank order, innermost first: which groups get the fast inner levels.
  // A permutation of tp, cp, dp, pp; "tp-cp-dp-pp" (Megatron) by default.
  std::vector<std::string> order = {"tp", "cp", "dp", "pp"};

  // Ranks: chips, or on Trainium (logical) NeuronCores.
  std::int64_t ranks() const { return std::int64_t{dp} * tp * pp * cp; }
};

// Everything wrong with the combination, as one message ("" when valid):
// TP not dividing heads, layers not dividing into stages, a batch that does
// not split into micro-batches, and so on. `ranks` is what the user has
// (chips x ranks per chip).
std::string validate(const Model& m, const Training& t, const Layout& l, int ranks);
// The model alone (shape fields positive and consistent); "" when valid.
std::string validate(const Model& m);
// The training settings alone; "" when valid.
std::string validate(const Training& t);

}  // namespace tern::plan
