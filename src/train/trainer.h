// The training loop (issue 7, first part): a GPT-2-style model on char-level
// text, its whole training step (forward, backward, AdamW) compiled once
// for a simulated chip under a precision recipe and run step after step by
// a runtime Session, with warmup + cosine learning-rate schedule.
// Not yet (issue 7): Llama models from a config, gradient clipping and
// accumulation, monitors and fallback policies, checkpoints, `tern sample`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "train/loader.h"
#include "train/tokenizer.h"

namespace tern::graph {
struct Executable;
}
namespace tern::runtime {
class Session;
}

namespace tern::train {

struct TrainConfig {
  std::string text = "data/tinyshakespeare.txt";  // the corpus (char tokenizer)
  double val_fraction = 0.1;                      // held out, the text's last part
  std::int64_t layers = 2, dim = 128, heads = 2;  // GPT-2 style (head dim 64 or 128)
  std::int64_t batch = 8, seq = 128;
  std::string recipe = "mxfp8";  // bf16, fp8-hybrid, mxfp8, mxfp4 (graph/autocast.h)
  std::string arch = "trn3";
  int cores = 0;  // per kernel (0: all)
  // AdamW; weight decay on matrices and embeddings only (not biases and
  // LayerNorm weights), as GPT-2 / nanoGPT.
  double lr = 1e-3, min_lr = 1e-4, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95;
  std::int64_t warmup = 10, steps = 100;  // schedule length (cosine to min_lr at `steps`)
  std::uint64_t seed = 1337;              // weights and batch order
  float init_std = 0.02f;                 // GPT-2's initialization
};

// The learning rate of step `step` (from 1): linear warmup over `warmup`
// steps to lr, then cosine decay to min_lr at `steps` (and min_lr after).
double learning_rate(const TrainConfig& c, std::int64_t step);

struct StepMetrics {
  std::int64_t step = 0;
  double loss = 0, lr = 0;
  double sim_ns = 0;   // the step's simulated time on the chip
  double wall_ms = 0;  // host time of the simulation
};

class Trainer {
 public:
  // Reads and tokenizes the text, builds and compiles the step, initializes
  // the weights (normal(0, init_std); LayerNorm weights 1, biases 0) and
  // the optimizer state. Throws tern::Error naming what is wrong.
  explicit Trainer(const TrainConfig& c);
  ~Trainer();
  StepMetrics step();
  // The mean loss over the first `batches` batches of the held-out text
  // (the same batches every time, in order), with the current weights: a
  // forward-only program under the same recipe, its own Session, the
  // weights copied over from the training Session.
  double validate(int batches);
  const TrainConfig& config() const { return c_; }
  const CharTokenizer& tokenizer() const { return tok_; }
  const graph::Executable& executable() const;
  std::int64_t parameters() const { return params_; }

 private:
  TrainConfig c_;
  CharTokenizer tok_;
  std::unique_ptr<BatchLoader> train_;
  std::vector<std::uint16_t> val_tokens_;
  std::vector<std::string> param_names_;
  std::shared_ptr<const graph::Executable> eval_exe_;
  std::unique_ptr<runtime::Session> eval_;
  std::shared_ptr<const graph::Executable> exe_;
  std::unique_ptr<runtime::Session> session_;
  std::int64_t step_ = 0, params_ = 0;
};

}  // namespace tern::train
