// Helpers the trainer's files share (private to src/train).
#pragma once

#include <fmt/format.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numbers>
#include <numeric>
#include <random>
#include <thread>
#include "arch/chip.h"
#include "graph/autocast.h"
#include "graph/autodiff.h"
#include "graph/eval.h"
#include "graph/models.h"
#include "graph/optimizer.h"
#include "graph/partition.h"
#include "isa/dtype.h"
#include "lower/lower.h"
#include "num/convert.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/system.h"
#include "train/checkpoint.h"
#include "train/shard.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/file.h"

namespace tern::train::detail {

// The text file to train on: as given (relative to the working directory),
// except the built-in default's corpus, which is found in tern's data
// directory when the working directory has no data/ of its own.
inline std::filesystem::path corpus_path(const std::string& text) {
  const std::filesystem::path given(text);
  if (text == TrainConfig{}.text && !std::filesystem::exists(given))
    return arch::data_dir() / given.filename();
  return given;
}

inline std::int64_t llama_ffn(const TrainConfig& c) {
  if (c.ffn > 0) return c.ffn;
  const std::int64_t f = (8 * c.dim + 2) / 3;  // 8/3 dim, as Llama's SwiGLU
  return (f + 63) / 64 * 64;
}

inline graph::Model make_model(const TrainConfig& c, int vocab) {
  const isa::DType dt = c.recipe == "fp32" ? isa::DType::fp32 : isa::DType::bf16;
  if (c.model == "llama") {
    graph::LlamaConfig lc;
    lc.layers = c.layers, lc.dim = c.dim, lc.heads = c.heads;
    lc.kv_heads = c.kv_heads > 0 ? c.kv_heads : c.heads;
    lc.ffn = llama_ffn(c), lc.vocab = vocab, lc.seq = c.seq, lc.batch = c.batch, lc.dtype = dt;
    return graph::llama(lc);
  }
  graph::Gpt2Config gc;
  gc.layers = c.layers, gc.dim = c.dim, gc.heads = c.heads, gc.vocab = vocab;
  gc.seq = c.seq, gc.batch = c.batch, gc.dtype = dt;
  return graph::gpt2(gc);
}

inline std::string layer_prefix(const TrainConfig& c, std::int64_t layer) {
  return fmt::format("{}{}.", c.model == "llama" ? "layers." : "h.", layer);
}

// The layer a param belongs to, or -1 (embeddings, final norm, head).
inline std::int64_t layer_of(const TrainConfig& c, const std::string& name) {
  for (std::int64_t l = 0; l < c.layers; ++l)
    if (name.starts_with(layer_prefix(c, l))) return l;
  return -1;
}

// Norm weights start at 1 (LayerNorm / RMSNorm gains), other vectors
// (biases) at 0, matrices normal(0, init_std).
inline bool is_norm_weight(const std::string& name) {
  return (name.find("ln_") != std::string::npos && name.ends_with(".w")) || name.ends_with("norm");
}

// Independent streams for stochastic rounding: (seed, step, micro-batch).
inline std::uint64_t stream_seed(std::uint64_t seed, std::int64_t step, std::int64_t micro) {
  return seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(step) * 1000003ull +
         static_cast<std::uint64_t>(micro);
}

// An injected device fault: what a retry handles.
struct InjectedFault : Error {
  using Error::Error;
};

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The system whose fabric joins a dp-chip run: c.system, or the smallest
// system of c.arch's chip that holds them.
inline arch::SystemSpec system_for(const TrainConfig& c) {
  const std::int64_t chips = c.dp * c.tp * c.pp;
  if (!c.system.empty()) {
    arch::SystemSpec s = arch::load_system(c.system);
    if (!s.chip)
      throw Error(fmt::format("not supported: training on {} ({} chips are not simulated)",
                              c.system, s.device.name));
    if (s.chip->name != c.arch)
      throw Error(fmt::format("system {} is made of {} chips, but arch is {}", c.system,
                              s.chip->name, c.arch));
    return s;
  }
  std::optional<arch::SystemSpec> best = arch::smallest_system(c.arch, chips);
  if (!best)
    throw Error(fmt::format("no system of {} chips holds {} (dp x tp x pp); name one with system",
                            c.arch, chips));
  return *best;
}

// Megatron's split of a GPT-2 layer: c_attn (q | k | v, each by heads) and
// c_fc by columns, the projections after them by rows.
inline bool row_split(const std::string& n) {
  return n.ends_with("attn.c_proj.w") || n.ends_with("mlp.c_proj.w");
}
inline bool tp_split(const std::string& n) {
  return row_split(n) || n.ends_with("attn.c_attn.w") || n.ends_with("attn.c_attn.b") ||
         n.ends_with("mlp.c_fc.w") || n.ends_with("mlp.c_fc.b");
}
inline std::int64_t column_groups(const std::string& n) {
  return n.find("attn.c_attn.") != std::string::npos ? 3 : 1;  // q, k, v
}

inline void put(std::vector<std::uint8_t>& out, const void* p, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}

// Reads back what put() wrote, in order; errors name a short message.
struct Reader {
  const std::vector<std::uint8_t>& in;
  std::size_t at = 0;
  void get(void* p, std::size_t n) {
    if (at + n > in.size()) throw Error("a rank sent a short replica message (a tern bug)");
    std::memcpy(p, in.data() + at, n);
    at += n;
  }
};

// The program's share of a batch's inputs (a stage reads some of them).
inline std::map<std::string, std::vector<float>> inputs_of(
    const graph::Executable& e, const std::map<std::string, std::vector<float>>& all) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [k, v] : all)
    if (e.graph.find(k) >= 0) out[k] = v;
  return out;
}

inline num::FormatId system_format(isa::DType d) {
  return d == isa::DType::fp32   ? num::FormatId::fp32
         : d == isa::DType::fp16 ? num::FormatId::fp16
                                 : num::FormatId::bf16;
}

}  // namespace tern::train::detail
