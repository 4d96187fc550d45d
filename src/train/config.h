// What `tern train` trains and how: the model, the data, the
// optimizer, the precision recipe, the numeric-health policies, checkpoints
// and the faults injected for tests. Every field has a default (the README's
// main job); a TOML file (`tern train --config FILE`) sets any of them by
// the names below, command-line flags override the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tern::train {

// A fault injected on purpose (tests of the policies and of recovery).
struct Fault {
  enum class Kind : std::uint8_t {
    nan,   // a NaN in one gradient element of `param` (default: the last layer's
           // MLP output weights) at step `step`
    fail,  // the step's simulation fails `count` times (a device error)
    kill,  // the process kills itself (SIGKILL) after step `step`
  };
  Kind kind = Kind::nan;
  std::int64_t step = 0;
  int count = 1;
  std::string param;
};
// "nan@STEP[:PARAM]", "fail@STEP[xCOUNT]", "kill@STEP". Throws tern::Error
// naming the spec and the forms.
Fault parse_fault(const std::string& spec);

struct TrainConfig {
  // Data: a text file, char tokenizer; the last val_fraction held out.
  std::string text = "data/tinyshakespeare.txt";
  double val_fraction = 0.1;
  // Or token shards: a `tern data` directory (train.bin, val.bin,
  // tokenizer.json: char or GPT-2 BPE); text and val_fraction then unused.
  std::string data;
  // Model: "gpt2" (LayerNorm, GELU, learned positions, tied head) or "llama"
  // (RMSNorm, RoPE, SwiGLU, GQA with kv_heads; ffn 0: 8/3 dim rounded up to
  // a multiple of 64). Head dim = dim / heads must be 64 or 128.
  std::string model = "gpt2";
  std::int64_t layers = 2, dim = 128, heads = 2, kv_heads = 0, ffn = 0;
  std::int64_t batch = 8, seq = 128;  // micro-batch x sequence
  std::int64_t accum = 1;             // micro-batches a step (global batch = batch x accum)
  // Precision: fp32 (reference), bf16, fp8-hybrid, mxfp8, mxfp4 (graph/autocast.h);
  // mx_policy: the MX scale rule (trn3: the chip's QuantizeMX and compiler default).
  std::string recipe = "mxfp8", mx_policy = "trn3";
  bool stochastic_rounding = false;  // engine output casts round stochastically
  std::string arch = "trn3";
  int cores = 0;  // NeuronCores a kernel uses (0: all)
  // Layout over several simulated chips (docs/multichip.md): dp data-
  // parallel replicas, each running `accum` micro-batches a step (global
  // batch = batch x accum x dp); zero 1 shards the optimizer state over
  // them (ZeRO-1); tp: Megatron tensor parallel over that many chips
  // (GPT-2); pp: a 1F1B pipeline of that many stages (docs/multichip.md).
  // system: the system file whose fabric joins the chips ("": the smallest
  // system of `arch` holding dp x tp x pp chips). threads: host threads
  // simulating this process's chips (0: one per chip, at most the host's
  // cores); results do not depend on it, nor on the number of MPI ranks.
  std::int64_t dp = 1, tp = 1, pp = 1;
  int zero = 0;
  // tp > 1: Megatron-LM sequence parallelism (Korthikanti et al. 2022):
  // the LayerNorms, bias and residual adds between the tensor-parallel
  // blocks run on 1 / tp of the sequence on each rank, the all-reduces
  // become reduce-scatters and all-gathers (docs/multichip.md).
  bool sp = false;
  // dp > 1 with zero 0, pp 1 and tp 1: the gradients are all-reduced in
  // buckets of this many MiB (FP32), each launched as soon as its last
  // gradient is final in the last micro-batch's backward, overlapping the
  // rest of it (PyTorch DDP's bucket_cap_mb, default 25). 0: one bucket
  // after the backward. Other layouts reduce after the backward.
  double bucket_mb = 25;
  std::string system;
  int threads = 0;
  // AdamW; weight decay on matrices and embeddings only (not biases and
  // norm weights), as GPT-2 / nanoGPT; clip: the global gradient norm's
  // ceiling (0: no clipping).
  double lr = 3e-3, min_lr = 3e-4, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, clip = 1.0;
  std::int64_t warmup = 30, steps = 1000;  // schedule length (cosine to min_lr at `steps`)
  std::uint64_t seed = 1337;               // weights, batch order, rounding streams
  float init_std = 0.02f;                  // GPT-2's initialization
  // Numeric health: a step whose gradients hold more than nan_rate NaN/Inf
  // elements (a fraction of all; 0: any) or whose loss is not finite
  // triggers nan_policy: skip (no update), fallback-layer (that layer's
  // matmuls to bf16, the step redone), fallback-global (the whole recipe to
  // bf16), rollback (to the last checkpoint, the batch skipped), stop.
  // A gradient norm more than spike_z standard deviations above the mean of
  // the last spike_window steps is logged as a spike (0: off).
  std::string nan_policy = "skip";
  double nan_rate = 0.0, spike_z = 6.0;
  std::int64_t spike_window = 50;
  int retries = 2;  // a failed step is retried this often, then rolled back
  // Monitors: every monitor_every steps (0: never) the step's first
  // micro-batch is replayed in the graph interpreter, which quantizes
  // exactly as the chip, counting per matmul operand the saturated,
  // underflowed and non-finite elements and the scales' range. An operand
  // saturating more than overflow_pct % of its elements triggers
  // overflow_policy: warn, fallback-layer (its layer's matmuls to bf16,
  // this step on), fallback-global.
  std::int64_t monitor_every = 0;
  double overflow_pct = 1.0;
  std::string overflow_policy = "warn";
  // Checkpoints: every ckpt_every steps (0: none) into ckpt_dir, the last
  // keep_last kept; resume: a checkpoint file or a directory (its newest
  // good checkpoint).
  std::string ckpt_dir;
  std::int64_t ckpt_every = 0;
  int keep_last = 3;
  std::string resume;
  std::vector<Fault> faults;
};

// Throws tern::Error naming the field and what is wrong.
void validate(const TrainConfig& c);
// Sets the fields a TOML file names; unknown keys and wrong types are
// errors naming the file and the key.
void load_config_file(TrainConfig& c, const std::string& path);
// The config as JSON (checkpoints and --json output) and back.
nlohmann::json to_json(const TrainConfig& c);
TrainConfig config_from_json(const nlohmann::json& j);

}  // namespace tern::train
