// Transformer models as graphs: GPT-2 (LayerNorm, GELU-tanh, learned
// positions, fused qkv projection with biases, tied embeddings; as in
// HF / llm.c) and Llama (RMSNorm, RoPE, SwiGLU, GQA, no biases, untied
// head). The graph holds the forward pass and the mean cross-entropy loss;
// add_backward (autodiff.h) adds the training step's gradients.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/ir.h"

namespace tern::graph {

struct Gpt2Config {
  std::int64_t layers = 12, dim = 768, heads = 12, vocab = 50304, seq = 1024, batch = 4;
  DType dtype = DType::bf16;  // activations and weights in matmuls
};

struct LlamaConfig {
  std::int64_t layers = 16, dim = 2048, heads = 32, kv_heads = 8, ffn = 8192, vocab = 32000;
  std::int64_t seq = 1024, batch = 4;
  double norm_eps = 1e-5;
  DType dtype = DType::bf16;
};

struct Model {
  Graph graph;
  int loss = -1;            // scalar value id
  std::vector<int> params;  // value ids, in definition order
};

// Inputs "ids" and "targets" [batch, seq] int32 (Llama also "cos", "sin"
// [seq, head_dim / 2] fp32); params named like HF ("h.0.attn.c_attn.w").
// Throws tern::Error for inconsistent sizes (dim % heads, heads % kv_heads).
Model gpt2(const Gpt2Config& c);
Model llama(const LlamaConfig& c);

// A tensor-parallel rank's share of GPT-2 layer `layer` (Megatron-LM,
// Shoeybi et al. 2019), of tp ranks: the attention from its input
// "h.<l>.ln_1" [B, S, D] through heads / tp heads (columns of c_attn.w
// [D, 3 D / tp], q | k | v of its heads, and c_attn.b) to the partial sum
// "h.<l>.attn.proj" [B, S, D] of its rows of c_proj.w [D / tp, D] (the bias
// comes after the all-reduce); the MLP from "h.<l>.ln_2" through its
// columns of c_fc [D, 4 D / tp] to "h.<l>.mlp.proj", its rows of
// mlp.c_proj.w [4 D / tp, D]. The full model names the same values
// (gpt2()). Throws tern::Error when tp does not divide the heads or 4 D.
Graph gpt2_attention_shard(const Gpt2Config& c, std::int64_t layer, int tp);
Graph gpt2_mlp_shard(const Gpt2Config& c, std::int64_t layer, int tp);

}  // namespace tern::graph
