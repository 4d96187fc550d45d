#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <numbers>
#include <random>

#include <fmt/format.h>

#include "arch/chip.h"
#include "graph/autocast.h"
#include "graph/autodiff.h"
#include "graph/lower.h"
#include "graph/models.h"
#include "graph/optimizer.h"
#include "runtime/device.h"
#include "util/error.h"
#include "util/file.h"

namespace tern::train {

double learning_rate(const TrainConfig& c, std::int64_t step) {
  if (step <= c.warmup) return c.lr * static_cast<double>(step) / static_cast<double>(c.warmup);
  if (step >= c.steps) return c.min_lr;
  const double t = static_cast<double>(step - c.warmup) /
                   static_cast<double>(std::max<std::int64_t>(1, c.steps - c.warmup));
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(std::numbers::pi * t));
}

Trainer::Trainer(const TrainConfig& c) : c_(c), tok_(CharTokenizer::from_text(read_file(c.text))) {
  if (c.warmup < 0 || c.steps < 1 || !(c.lr > 0) || c.min_lr < 0 || c.min_lr > c.lr)
    throw Error(
        fmt::format("train: need steps >= 1, warmup >= 0 and 0 <= min_lr <= lr, got "
                    "steps {}, warmup {}, lr {}, min_lr {}",
                    c.steps, c.warmup, c.lr, c.min_lr));
  const std::string text = read_file(c.text);
  const auto tokens = tok_.encode(text);
  const auto n_train =
      static_cast<std::size_t>(static_cast<double>(tokens.size()) * (1.0 - c.val_fraction));
  val_tokens_.assign(tokens.begin() + static_cast<std::ptrdiff_t>(n_train), tokens.end());
  train_ = std::make_unique<BatchLoader>(
      std::vector<std::uint16_t>(tokens.begin(),
                                 tokens.begin() + static_cast<std::ptrdiff_t>(n_train)),
      static_cast<int>(c.batch), static_cast<int>(c.seq), c.seed);

  graph::Gpt2Config mc;
  mc.layers = c.layers, mc.dim = c.dim, mc.heads = c.heads, mc.vocab = tok_.vocab();
  mc.seq = c.seq, mc.batch = c.batch;
  const graph::Model m = graph::gpt2(mc);
  for (int p : m.params) param_names_.push_back(m.graph.value(p).name);
  graph::Model a{graph::autocast(m.graph, graph::recipe(c.recipe)), -1, {}};
  a.loss = a.graph.find("loss");
  for (int p : m.params) a.params.push_back(a.graph.find(m.graph.value(p).name));
  const auto grads = graph::add_backward(a.graph, a.loss, a.params);
  graph::AdamWConfig ac;
  ac.beta1 = c.beta1, ac.beta2 = c.beta2, ac.no_decay_group = true;  // no decay: biases, norms
  const graph::OptimizerInputs oi = graph::add_adamw(a.graph, grads, ac);
  const arch::ChipSpec chip = arch::load_chip(c.arch);
  graph::CompileOptions o;
  o.cores = c.cores;
  exe_ = std::make_shared<const graph::Executable>(graph::compile(a.graph, chip, o));
  session_ = std::make_unique<runtime::Session>(chip, exe_);
  // The forward pass alone, under the same recipe, for validation.
  graph::Graph eval = graph::autocast(m.graph, graph::recipe(c.recipe));
  eval_exe_ = std::make_shared<const graph::Executable>(graph::compile(eval, chip, o));
  eval_ = std::make_unique<runtime::Session>(chip, eval_exe_);

  // GPT-2's initialization: weights normal(0, init_std), LayerNorm weights
  // 1, biases 0; masters start as the weights, moments at 0.
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> normal(0.0f, c.init_std);
  for (int p : a.params) {
    const graph::Value& v = a.graph.value(p);
    const auto n = static_cast<std::size_t>(graph::elements(v.shape));
    params_ += static_cast<std::int64_t>(n);
    std::vector<float> x(n, 0.0f);
    const bool bias = v.shape.size() == 1;
    if (v.name.find("ln_") != std::string::npos && v.name.back() == 'w')
      std::fill(x.begin(), x.end(), 1.0f);
    else if (!bias)
      for (float& e : x) e = normal(rng);
    session_->write(v.name, x);
  }
  for (const auto& [master, param] : oi.master) session_->write(master, session_->read(param));
  for (const std::string& z : oi.zeros) session_->fill(z, 0.0f);
}

Trainer::~Trainer() = default;

const graph::Executable& Trainer::executable() const {
  return *exe_;
}

double Trainer::validate(int batches) {
  if (batches < 1) throw Error(fmt::format("validate: batches must be >= 1, got {}", batches));
  for (const std::string& p : param_names_) eval_->write(p, session_->read(p));
  BatchLoader val(val_tokens_, static_cast<int>(c_.batch), static_cast<int>(c_.seq), c_.seed,
                  /*shuffle=*/false);
  double sum = 0;
  for (int i = 0; i < batches; ++i) {
    const Batch b = val.next();
    const runtime::StepResult r =
        eval_->step({{"ids", std::vector<float>(b.ids.begin(), b.ids.end())},
                     {"targets", std::vector<float>(b.targets.begin(), b.targets.end())}});
    sum += r.outputs.at("loss")[0];
  }
  return sum / batches;
}

StepMetrics Trainer::step() {
  StepMetrics m;
  m.step = ++step_;
  m.lr = learning_rate(c_, m.step);
  const Batch b = train_->next();
  const auto t0 = std::chrono::steady_clock::now();
  const runtime::StepResult r = session_->step(
      {{"ids", std::vector<float>(b.ids.begin(), b.ids.end())},
       {"targets", std::vector<float>(b.targets.begin(), b.targets.end())},
       {"adamw.scalars", runtime::adamw_scalars(m.lr, c_.weight_decay, c_.beta1, c_.beta2, m.step)},
       {"adamw.scalars_no_decay", runtime::adamw_scalars(m.lr, 0.0, c_.beta1, c_.beta2, m.step)}});
  m.wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  m.loss = r.outputs.at("loss")[0];
  m.sim_ns = r.time_ns;
  return m;
}

}  // namespace tern::train
