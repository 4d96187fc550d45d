// tern train: trains a small GPT-style model on char-level text on a
// simulated chip (issue 7, first part: the loop; checkpoints, monitors and
// validation come next).
#include <cstdio>
#include <memory>
#include <string>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "graph/lower.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/file.h"

namespace tern::cli {

namespace {

struct Eval {
  std::int64_t every = 0;  // steps between validations (0: only at the end)
  int batches = 4;
  std::string metrics;  // a JSONL file of every step's metrics ("" none)
};

void run(const train::TrainConfig& c, bool json, const Eval& ev) {
  if (!json && ::isatty(2))  // a progress line for people at a terminal
    std::fprintf(stderr, "compiling the training step (%s, %s)...\r", c.recipe.c_str(),
                 c.arch.c_str());
  train::Trainer t(c);
  const graph::Executable& e = t.executable();
  if (!json)
    std::printf(
        "model: GPT, %lld layers, dim %lld, %lld heads, vocab %d (char), %lld parameters; "
        "batch %lld x %lld; recipe %s on %s; %zu kernels a step, fusion rate %.3f\n",
        static_cast<long long>(c.layers), static_cast<long long>(c.dim),
        static_cast<long long>(c.heads), t.tokenizer().vocab(),
        static_cast<long long>(t.parameters()), static_cast<long long>(c.batch),
        static_cast<long long>(c.seq), c.recipe.c_str(), c.arch.c_str(), e.launches.size(),
        e.fusion.rate());
  const double tokens = static_cast<double>(c.batch * c.seq);
  // The metrics file is rewritten atomically after every step (a reader
  // never sees half a line; a killed run leaves the steps done so far).
  std::string metrics;
  auto record = [&](const nlohmann::json& j) {
    if (json) std::printf("%s\n", j.dump().c_str());
    if (!ev.metrics.empty()) {
      metrics += j.dump() + "\n";
      write_file_atomic(ev.metrics, metrics);
    }
  };
  double first = 0, last = 0;
  for (std::int64_t s = 1; s <= c.steps; ++s) {
    const train::StepMetrics m = t.step();
    if (s == 1) first = m.loss;
    last = m.loss;
    record({{"step", m.step},
            {"loss", m.loss},
            {"lr", m.lr},
            {"wall_ms", m.wall_ms},
            {"sim_ns", m.sim_ns},
            {"tokens_per_s", tokens / (m.wall_ms / 1e3)}});
    if (!json) {
      std::printf(
          "step %4lld/%lld | loss %.4f | lr %.2e | %7.1f ms | %7.0f tok/s | simulated "
          "%.3f ms/step\n",
          static_cast<long long>(m.step), static_cast<long long>(c.steps), m.loss, m.lr, m.wall_ms,
          tokens / (m.wall_ms / 1e3), m.sim_ns / 1e6);
    }
    if ((ev.every > 0 && s % ev.every == 0) || s == c.steps) {
      const double v = t.validate(ev.batches);
      record({{"step", s}, {"val_loss", v}});
      if (!json)
        std::printf("step %4lld/%lld | val loss %.4f (%d batches of held-out text)\n",
                    static_cast<long long>(s), static_cast<long long>(c.steps), v, ev.batches);
    }
    std::fflush(stdout);
  }
  if (!json)
    std::printf("loss %.4f -> %.4f over %lld steps\n", first, last,
                static_cast<long long>(c.steps));
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto c = std::make_shared<train::TrainConfig>();
  auto json = std::make_shared<bool>(false);
  auto ev = std::make_shared<Eval>();
  CLI::App* cmd = app.add_subcommand(
      "train", "Train a GPT-style model on char-level text on a simulated chip (docs/train.md)");
  cmd->add_option("--text", c->text, "Training text (char tokenizer)")->capture_default_str();
  cmd->add_option("--layers", c->layers, "Transformer layers")->capture_default_str();
  cmd->add_option("--dim", c->dim, "Model width (head dim dim / heads: 64 or 128)")
      ->capture_default_str();
  cmd->add_option("--heads", c->heads, "Attention heads")->capture_default_str();
  cmd->add_option("--batch", c->batch, "Sequences a step")->capture_default_str();
  cmd->add_option("--seq", c->seq, "Tokens a sequence")->capture_default_str();
  cmd->add_option("--recipe", c->recipe, "Precision: bf16, fp8-hybrid, mxfp8, mxfp4")
      ->capture_default_str();
  cmd->add_option("--arch", c->arch, "Chip")->capture_default_str();
  cmd->add_option("--cores", c->cores, "NeuronCores a kernel uses (0: all)")->capture_default_str();
  cmd->add_option("--steps", c->steps, "Optimizer steps (the schedule's length)")
      ->capture_default_str();
  cmd->add_option("--lr", c->lr, "Peak learning rate (AdamW)")->capture_default_str();
  cmd->add_option("--min-lr", c->min_lr, "Final learning rate of the cosine decay")
      ->capture_default_str();
  cmd->add_option("--warmup", c->warmup, "Linear warmup steps")->capture_default_str();
  cmd->add_option("--weight-decay", c->weight_decay, "AdamW weight decay")->capture_default_str();
  cmd->add_option("--seed", c->seed, "Weights and batch order")->capture_default_str();
  cmd->add_option("--eval-every", ev->every, "Validation loss every N steps (0: at the end only)")
      ->capture_default_str();
  cmd->add_option("--eval-batches", ev->batches, "Held-out batches a validation averages")
      ->capture_default_str();
  cmd->add_option("--metrics", ev->metrics,
                  "Write every step's metrics (and validation losses) to this JSONL file");
  cmd->add_flag("--json", *json, "One JSON line a step");
  cmd->callback([c, json, ev] { run(*c, *json, *ev); });
}

}  // namespace tern::cli
