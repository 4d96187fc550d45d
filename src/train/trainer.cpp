// The training loop: construction, steps, numeric health and recovery,
// monitors, validation and sampling (train/trainer.h).
#include "train/trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numbers>
#include <numeric>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

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
#include "util/error.h"
#include "util/file.h"

#include "train/trainer_detail.h"

namespace tern::train {

using namespace detail;

double learning_rate(const TrainConfig& c, std::int64_t step) {
  if (step <= c.warmup) return c.lr * static_cast<double>(step) / static_cast<double>(c.warmup);
  if (step >= c.steps) return c.min_lr;
  const double t = static_cast<double>(step - c.warmup) /
                   static_cast<double>(std::max<std::int64_t>(1, c.steps - c.warmup));
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(std::numbers::pi * t));
}

Trainer::Trainer(const TrainConfig& c, runtime::Comm* comm) : c_(c), comm_(comm) {
  train::validate(c_);
  if (!comm_) own_comm_ = runtime::single_process(), comm_ = own_comm_.get();
  if (c_.zero == 1 && c_.dp == 1) {
    c_.zero = 0;
    notes_.push_back("zero 1 with dp 1 shards nothing: the optimizer runs unsharded");
  }
  if (comm_->size() > c_.dp)
    throw Error(fmt::format("{} processes for dp {}: each process needs at least one replica",
                            comm_->size(), c_.dp));
  first_ = runtime::block_first(c_.dp, comm_->size(), comm_->rank());
  last_ = runtime::block_first(c_.dp, comm_->size(), comm_->rank() + 1);
  // The chips' clocks and fabric (a single chip too: its timeline).
  system_ =
      std::make_unique<runtime::System>(system_for(c_), static_cast<int>(c_.dp * c_.pp * c_.tp));
  std::vector<std::uint16_t> train_tokens;
  if (!c_.data.empty()) {
    // A `tern data` directory: its tokenizer and shards.
    const std::filesystem::path dir = c_.data;
    tok_ = load_tokenizer(dir / "tokenizer.json");
    train_tokens = read_shard(dir / "train.bin");
    val_tokens_ = read_shard(dir / "val.bin");
    for (const auto* t : {&train_tokens, &val_tokens_})
      for (std::uint16_t x : *t)
        if (x >= tok_->vocab())
          throw Error(fmt::format("{}: token {} is past the tokenizer's vocabulary of {}", c_.data,
                                  x, tok_->vocab()));
  } else {
    const std::string text = read_file(corpus_path(c_.text));
    auto ct = std::make_unique<CharTokenizer>(CharTokenizer::from_text(text));
    const auto tokens = ct->encode(text);
    tok_ = std::move(ct);
    const auto n_train =
        static_cast<std::size_t>(static_cast<double>(tokens.size()) * (1.0 - c_.val_fraction));
    train_tokens.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n_train));
    val_tokens_.assign(tokens.begin() + static_cast<std::ptrdiff_t>(n_train), tokens.end());
  }
  train_ = std::make_unique<BatchLoader>(std::move(train_tokens), static_cast<int>(c_.batch),
                                         static_cast<int>(c_.seq), c_.seed);
  try {  // the held-out part must hold a batch: found now, not at the first validation
    BatchLoader(val_tokens_, static_cast<int>(c_.batch), static_cast<int>(c_.seq), c_.seed, false);
  } catch (const Error& e) {
    throw Error(fmt::format("validation data ({}): {}",
                            c_.data.empty()
                                ? fmt::format("the last {} of {}", c_.val_fraction, c_.text)
                                : c_.data + "/val.bin",
                            e.what()));
  }
  if (c_.model == "llama") {
    // RoPE tables: angle(pos, i) = pos * 10000^(-2i / head_dim) (Llama).
    const std::int64_t hd = c_.dim / c_.heads, half = hd / 2;
    for (std::int64_t p = 0; p < c_.seq; ++p)
      for (std::int64_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(p) *
                         std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
        rope_cos_.push_back(static_cast<float>(std::cos(a)));
        rope_sin_.push_back(static_cast<float>(std::sin(a)));
      }
  }
  recipe_ = c_.recipe;
  if (!c_.resume.empty()) {
    restore(c_.resume);
  } else {
    build();
    init_weights();
  }
}

Trainer::~Trainer() = default;

const graph::Executable& Trainer::executable() const {
  return *grad_exe_;
}
const graph::Executable& Trainer::update_executable() const {
  return *shards_.front().update;
}

void Trainer::zero_accumulators() {
  for (Replica& rep : replicas_)
    for (std::size_t st = 0; st < stages_.size(); ++st)
      for (std::size_t i : stages_[st].params) rep.bwd[st]->fill(acc_names_[i], 0.0f);
}

void Trainer::init_weights() {
  // GPT-2's initialization: weights normal(0, init_std), norm weights 1,
  // biases 0; masters start as the weights, moments at 0. The grad
  // program's copy rounds them to the params' dtype.
  std::mt19937_64 rng(c_.seed);
  std::normal_distribution<float> normal(0.0f, c_.init_std);
  const graph::Graph& g = grad_exe_->graph;
  for (const std::string& name : param_names_) {
    const graph::Value& v = g.value(g.find(name));
    std::vector<float> x(static_cast<std::size_t>(graph::elements(v.shape)), 0.0f);
    if (is_norm_weight(name))
      std::fill(x.begin(), x.end(), 1.0f);
    else if (v.shape.size() > 1)
      for (float& e : x) e = normal(rng);
    weights_[name] = rounded(static_cast<std::size_t>(&name - param_names_.data()), x);
  }
  std::map<std::string, std::vector<float>> state;
  for (const auto& [master, param] : master_of_) state[master] = weights_.at(param);
  for (const std::string& z : moment_names_)
    state[z].assign(weights_.at(param_of_state(z)).size(), 0.0f);
  set_optimizer_state(state);
  push_weights();
}

std::map<std::string, std::vector<float>> Trainer::model_inputs(const Batch& b) const {
  std::map<std::string, std::vector<float>> f{
      {"ids", std::vector<float>(b.ids.begin(), b.ids.end())},
      {"targets", std::vector<float>(b.targets.begin(), b.targets.end())}};
  if (c_.model == "llama") f["cos"] = rope_cos_, f["sin"] = rope_sin_;
  return f;
}

std::vector<float> Trainer::param(const std::string& name) const {
  const auto it = weights_.find(name);
  if (it == weights_.end()) throw Error(fmt::format("the model has no param {}", name));
  return it->second;
}

double Trainer::flops_per_step() const {
  const double per_token =
      6.0 * static_cast<double>(params_) + 12.0 * static_cast<double>(c_.layers * c_.dim * c_.seq);
  return per_token * static_cast<double>(c_.batch * c_.seq * c_.accum * c_.dp);
}

double Trainer::validate(int batches) {
  if (batches < 1) throw Error(fmt::format("validate: batches must be >= 1, got {}", batches));
  for (const std::string& p : param_names_) eval_->write(p, weights_.at(p));
  BatchLoader val(val_tokens_, static_cast<int>(c_.batch), static_cast<int>(c_.seq), c_.seed,
                  /*shuffle=*/false);
  double sum = 0;
  for (int i = 0; i < batches; ++i) {
    const runtime::StepResult r = eval_->step(model_inputs(val.next()));
    sum += r.outputs.at("loss")[0];
  }
  return sum / batches;
}

StepMetrics Trainer::step() {
  return run_step(nullptr);
}

Batch Trainer::checked(const Batch& b) const {
  const auto n = static_cast<std::size_t>(c_.batch * c_.seq);
  if (b.ids.size() != n || b.targets.size() != n)
    throw Error(fmt::format("a batch needs {} x {} = {} ids and targets, got {} and {}", c_.batch,
                            c_.seq, n, b.ids.size(), b.targets.size()));
  for (const auto* v : {&b.ids, &b.targets})
    for (std::int32_t t : *v)
      if (t < 0 || t >= tok_->vocab())
        throw Error(fmt::format("{} holds token {}, outside the vocabulary [0, {})",
                                v == &b.ids ? "ids" : "targets", t, tok_->vocab()));
  return b;
}

StepMetrics Trainer::step(const std::vector<Batch>& micro) {
  if (static_cast<std::int64_t>(micro.size()) != c_.accum * c_.dp)
    throw Error(fmt::format("step: {} micro-batches given, accum x dp is {} x {}", micro.size(),
                            c_.accum, c_.dp));
  for (const Batch& b : micro) checked(b);
  return run_step(&micro);
}

void Trainer::set_param(const std::string& name, const std::vector<float>& values) {
  if (std::find(param_names_.begin(), param_names_.end(), name) == param_names_.end())
    throw Error(fmt::format("the model has no param {}", name));
  const auto i = static_cast<std::size_t>(
      std::find(param_names_.begin(), param_names_.end(), name) - param_names_.begin());
  weights_[name] = rounded(i, values);  // checks the size
  for (Shard& sh : shards_) {
    if (!sh.session) continue;
    for (std::size_t k : sh.params)
      if (param_names_[k] == name) {
        sh.session->write(name, weights_[name]);
        for (const auto& [master, p] : master_of_)
          if (p == name) sh.session->write(master, weights_[name]);
      }
  }
  push_weights();
}

std::vector<float> Trainer::logits(const Batch& b) {
  checked(b);
  if (!logits_) {
    graph::Graph f = eval_exe_->graph;
    f.mark_output(f.find("logits"));
    const arch::ChipSpec chip = arch::load_chip(c_.arch);
    graph::CompileOptions o;
    o.cores = c_.cores;
    logits_exe_ = std::make_shared<const graph::Executable>(graph::compile(f, chip, o));
    logits_ = std::make_unique<runtime::Session>(chip, logits_exe_);
  }
  for (const std::string& p : param_names_) logits_->write(p, weights_.at(p));
  return logits_->step(model_inputs(b)).outputs.at("logits");
}

std::string Trainer::sample(const std::string& prompt, int tokens, double temperature,
                            std::uint64_t seed) {
  if (tokens < 0 || !(temperature >= 0) || !std::isfinite(temperature))
    throw Error(fmt::format("sample: tokens and temperature must be >= 0, got {} and {}", tokens,
                            temperature));
  std::vector<std::uint16_t> ctx = tok_->encode(prompt.empty() ? std::string(1, '\n') : prompt);
  std::mt19937_64 rng(seed);
  const auto seq = static_cast<std::size_t>(c_.seq),
             vocab = static_cast<std::size_t>(tok_->vocab());
  std::vector<std::uint16_t> out;
  for (int n = 0; n < tokens; ++n) {
    const std::size_t from = ctx.size() > seq ? ctx.size() - seq : 0, len = ctx.size() - from;
    Batch b;
    b.ids.assign(static_cast<std::size_t>(c_.batch) * seq, 0);
    for (std::size_t i = 0; i < len; ++i) b.ids[i] = ctx[from + i];
    b.targets = b.ids;
    const std::vector<float> l = logits(b);
    const float* row = l.data() + (len - 1) * vocab;  // the last position of sequence 0
    std::size_t pick = static_cast<std::size_t>(std::max_element(row, row + vocab) - row);
    if (temperature > 0) {
      // Inverse CDF with a 53-bit uniform (not std::discrete_distribution:
      // its draws differ between standard libraries).
      std::vector<double> p(vocab);
      double total = 0;
      for (std::size_t v = 0; v < vocab; ++v)
        total += p[v] = std::exp((static_cast<double>(row[v]) - row[pick]) / temperature);
      double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
      for (pick = 0; pick + 1 < vocab && u >= p[pick]; ++pick) u -= p[pick];
    }
    ctx.push_back(static_cast<std::uint16_t>(pick));
    out.push_back(static_cast<std::uint16_t>(pick));
  }
  return tok_->decode(out);
}

StepMetrics Trainer::run_step(const std::vector<Batch>* given) {
  given_ = given;
  const std::int64_t s = step_ + 1;
  const auto t0 = std::chrono::steady_clock::now();
  const LoaderState start = train_->state();
  int retries = 0;
  std::vector<std::string> actions;
  for (;;) {
    int fails_left = 0;
    try {
      StepMetrics m = attempt(s, start, fails_left);
      if (fails_left < 0) {  // a policy redid the step (fallback): again
        actions.insert(actions.end(), m.actions.begin(), m.actions.end());
        continue;
      }
      m.retries = retries;
      actions.insert(actions.end(), m.actions.begin(), m.actions.end());
      m.actions = actions;
      m.wall_ms = ms_since(t0);
      return m;
    } catch (const InjectedFault& e) {
      // The grad program failed: nothing was updated, the accumulators are
      // reset and the step's batches drawn again.
      zero_accumulators();
      train_->restore(start);
      if (retries < c_.retries) {
        ++retries;
        actions.push_back(
            fmt::format("step {} failed ({}); retry {} of {}", s, e.what(), retries, c_.retries));
        continue;
      }
      if (c_.ckpt_every == 0 || list_checkpoints(c_.ckpt_dir).empty())
        throw Error(
            fmt::format("step {} failed {} times ({}) and there is no checkpoint to roll "
                        "back to",
                        s, retries + 1, e.what()));
      std::vector<std::string> notes;
      auto good = latest_good(c_.ckpt_dir, notes, step_);
      if (!good)
        throw Error(fmt::format("step {} failed and no checkpoint in {} loads", s, c_.ckpt_dir));
      restore_checkpoint(good->second);
      actions.insert(actions.end(), notes.begin(), notes.end());
      actions.push_back(fmt::format("step {} failed {} times ({}); rolled back to {} (step {})", s,
                                    retries + 1, e.what(), good->first.string(), step_));
      StepMetrics m;
      m.step = s, m.updated = false, m.retries = retries, m.actions = actions;
      m.wall_ms = ms_since(t0);
      return m;
    }
  }
}

StepMetrics Trainer::attempt(std::int64_t s, const LoaderState& start, int& redo) {
  StepMetrics m;
  m.step = s;
  m.lr = learning_rate(c_, s);
  redo = 0;
  raise_injected_failure(s);
  const std::vector<Batch> batches = step_batches(s, start);
  inject_nans(s, m);
  if (c_.monitor_every > 0 && s % c_.monitor_every == 0) monitor(batches[0], m);
  double loss = 0;
  const runtime::StepResult r = run_replicas(s, batches, m, loss);
  const auto micro = static_cast<double>(c_.accum * c_.dp);
  m.loss = loss / micro;
  double sumsq = 0;
  for (const std::string& n : sumsq_names_) sumsq += r.outputs.at(n)[0];
  // The accumulators hold the sum of accum x dp micro-batch means.
  m.grad_norm = std::sqrt(sumsq) / micro;
  std::map<std::int64_t, std::int64_t> bad_by_layer;
  if (!healthy(s, sumsq, m, bad_by_layer)) {
    unhealthy(s, start, m, bad_by_layer, redo);
    return m;
  }
  watch_spikes(s, m);
  update(m);
  step_ = s;
  return m;
}

void Trainer::raise_injected_failure(std::int64_t s) {
  for (const Fault& f : c_.faults)
    if (f.kind == Fault::Kind::fail && f.step == s && fails_done_[s] < f.count) {
      ++fails_done_[s];
      throw InjectedFault(fmt::format("injected device fault {} of {}", fails_done_[s], f.count));
    }
}

std::vector<Batch> Trainer::step_batches(std::int64_t s, const LoaderState& start) {
  // A step whose batches were found bad (rollback) draws them and takes the
  // next ones instead. dp replicas take accum each, replica r the r-th
  // block, in the loader's order.
  const std::int64_t micro = c_.accum * c_.dp;
  train_->restore(start);
  if (skip_batches_.contains(s))
    for (std::int64_t i = 0; i < micro; ++i) train_->next();
  std::vector<Batch> batches;
  for (std::int64_t i = 0; i < micro; ++i)
    batches.push_back(given_ ? (*given_)[static_cast<std::size_t>(i)] : train_->next());
  return batches;
}

void Trainer::inject_nans(std::int64_t s, StepMetrics& m) {
  for (const Fault& f : c_.faults)
    if (f.kind == Fault::Kind::nan && f.step == s && !nans_done_.contains(s)) {
      nans_done_.insert(s);
      const std::string p = f.param.empty() ? layer_prefix(c_, c_.layers - 1) +
                                                  (c_.model == "llama" ? "w_down" : "mlp.c_proj.w")
                                            : f.param;
      const auto it = std::find(param_names_.begin(), param_names_.end(), p);
      if (it == param_names_.end())
        throw Error(fmt::format("fault nan@{}:{}: the model has no param {}", s, p, p));
      if (first_ == 0) {  // replica 0's gradient (a NaN reaches the reduced sum)
        runtime::Session& h = holder(static_cast<std::size_t>(it - param_names_.begin()));
        std::vector<float> acc = h.read(p + ".grad_acc");
        acc[0] = std::nanf("");
        h.write(p + ".grad_acc", acc);
      }
      m.actions.push_back(fmt::format("injected a NaN into the gradient of {} at step {}", p, s));
    }
}

bool Trainer::healthy(std::int64_t s, double& sumsq, StepMetrics& m,
                      std::map<std::int64_t, std::int64_t>& bad_by_layer) {
  // A non-finite sum (a NaN or Inf element, or squares past FP32's range)
  // sends the host to the accumulators: it counts the non-finite elements
  // by layer and sums the squares again in double.
  const auto micro = static_cast<double>(c_.accum * c_.dp);
  std::map<std::size_t, std::vector<float>> with_bad;  // accumulators holding NaN/Inf
  if (!std::isfinite(sumsq)) {
    double host = 0;
    for (std::size_t i = 0; i < acc_names_.size(); ++i) {
      std::vector<float> x = reduced_.at(acc_names_[i]);
      std::int64_t n = 0;
      for (float e : x)
        if (std::isfinite(e))
          host += static_cast<double>(e) * e;
        else
          ++n;
      if (n) bad_by_layer[layer_of(c_, param_names_[i])] += n, with_bad[i] = std::move(x);
      m.nonfinite += n;
    }
    sumsq = host;
    m.grad_norm = std::sqrt(sumsq) / micro;
  }
  const bool bad = !std::isfinite(m.loss) ||
                   static_cast<double>(m.nonfinite) > c_.nan_rate * static_cast<double>(params_) ||
                   (m.nonfinite > 0 && c_.nan_rate == 0);
  if (!bad && m.nonfinite > 0) {
    // Tolerated (under nan_rate): those elements do not update (zeroed).
    for (auto& [i, x] : with_bad) {
      for (float& e : x)
        if (!std::isfinite(e)) e = 0.0f;
      reduced_[acc_names_[i]] = x;
    }
    m.actions.push_back(
        fmt::format("step {}: {} non-finite gradient elements tolerated (nan_rate "
                    "{}): zeroed",
                    s, m.nonfinite, c_.nan_rate));
  }
  return !bad;
}

void Trainer::unhealthy(std::int64_t s, const LoaderState& start, StepMetrics& m,
                        const std::map<std::int64_t, std::int64_t>& bad_by_layer, int& redo) {
  const std::string why = fmt::format(
      "step {}: {} non-finite gradient elements ({:.2e} of {}), loss {}", s, m.nonfinite,
      static_cast<double>(m.nonfinite) / static_cast<double>(params_), params_, m.loss);
  zero_accumulators();
  std::string policy = c_.nan_policy;
  // The offending layer: the last one with bad gradients (a fault in layer
  // L's backward reaches the layers below it, not above); a bad loss points
  // at the forward pass: no single layer.
  std::int64_t layer = -1;
  if (std::isfinite(m.loss) && !bad_by_layer.empty()) layer = bad_by_layer.rbegin()->first;
  if (policy == "fallback-layer" && (layer < 0 || bf16_layers_.contains(layer)))
    policy = "fallback-global";
  if (policy == "fallback-global" && (recipe_ == "bf16" || recipe_ == "fp32")) {
    m.actions.push_back(why +
                        fmt::format("; the recipe is already {}: skipped the update", recipe_));
    policy = "done";
  }
  if (policy == "stop") throw Error(why + " (nan_policy stop)");
  if (policy == "skip") m.actions.push_back(why + "; skipped the update");
  if (policy == "fallback-layer" || policy == "fallback-global") {
    if (policy == "fallback-layer") {
      bf16_layers_.insert(layer);
      m.actions.push_back(why + fmt::format("; layer {} falls back to bf16, step redone", layer));
    } else {
      m.actions.push_back(why +
                          fmt::format("; recipe {} falls back to bf16, step redone", recipe_));
      recipe_ = "bf16";
    }
    rebuild();
    train_->restore(start);
    redo = -1;
    return;
  }
  if (policy == "rollback") {
    if (skip_batches_.contains(s))  // the batch was skipped already: not the batch's fault
      throw Error(why +
                  "; again after a rollback that skipped the step's batch (nan_policy "
                  "rollback cannot help: try fallback-global or a lower lr)");
    std::vector<std::string> notes;
    auto good = latest_good(c_.ckpt_dir, notes, step_);
    if (!good) throw Error(why + fmt::format("; no checkpoint in {} to roll back to", c_.ckpt_dir));
    skip_batches_.insert(s);
    restore_checkpoint(good->second);
    m.actions.insert(m.actions.end(), notes.begin(), notes.end());
    m.actions.push_back(why + fmt::format("; rolled back to {} (step {}), the batch skipped",
                                          good->first.string(), step_));
    m.updated = false;
    return;
  }
  m.updated = false;
  step_ = s;
}

void Trainer::watch_spikes(std::int64_t s, StepMetrics& m) {
  // The norm's z-score against the last spike_window steps.
  if (c_.spike_z > 0 &&
      static_cast<std::int64_t>(norms_.size()) >= std::min<std::int64_t>(10, c_.spike_window)) {
    const double n = static_cast<double>(norms_.size());
    const double mean = std::accumulate(norms_.begin(), norms_.end(), 0.0) / n;
    double var = 0;
    for (double x : norms_) var += (x - mean) * (x - mean);
    const double sd = std::sqrt(var / n);
    if (sd > 0 && (m.grad_norm - mean) / sd > c_.spike_z) {
      m.spike = true;
      m.actions.push_back(
          fmt::format("step {}: gradient norm spike {:.4g} (z = {:.1f} over the "
                      "last {} steps)",
                      s, m.grad_norm, (m.grad_norm - mean) / sd, norms_.size()));
    }
  }
  norms_.push_back(m.grad_norm);
  while (static_cast<std::int64_t>(norms_.size()) > c_.spike_window) norms_.pop_front();
}

void Trainer::update(StepMetrics& m) {
  // Clipping (torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6), at
  // most 1) and the mean over micro-batches, folded into the scalars.
  const auto micro = static_cast<double>(c_.accum * c_.dp);
  if (c_.clip > 0 && m.grad_norm > c_.clip) m.clip_scale = c_.clip / (m.grad_norm + 1e-6);
  const double g = m.clip_scale / micro;
  ++opt_step_;
  auto scalars = [&](double wd) {
    std::vector<float> k = runtime::adamw_scalars(m.lr, wd, c_.beta1, c_.beta2, opt_step_);
    if (g != 1.0) {
      k[1] = static_cast<float>(static_cast<double>(k[1]) * g);
      k[2] = static_cast<float>(static_cast<double>(k[2]) * g * g);
    }
    return k;
  };
  const std::map<std::string, std::vector<float>> k{{"adamw.scalars", scalars(c_.weight_decay)},
                                                    {"adamw.scalars_no_decay", scalars(0.0)}};
  if (keep_grads_) {
    grads_.clear();
    for (std::size_t i = 0; i < acc_names_.size(); ++i) {
      std::vector<float> x = reduced_.at(acc_names_[i]);
      for (float& e : x) e = static_cast<float>(static_cast<double>(e) / micro);
      grads_[param_names_[i]] = std::move(x);
    }
  }
  m.sim_ns += run_update(k, m);
  zero_accumulators();
  push_weights();
}

// The step's first micro-batch through the graph interpreter (float64,
// quantizing exactly as the chip), with the current weights and scales,
// before the chip runs it: a fallback applies to this step on.
void Trainer::monitor(const Batch& b, StepMetrics& m) {
  const graph::Graph& g = *grad_graph_;
  std::map<std::string, graph::HostData> feeds;
  for (const auto& [name, x] : model_inputs(b)) feeds[name] = graph::HostData(x.begin(), x.end());
  for (const std::string& p : param_names_) {
    const std::vector<float>& x = weights_.at(p);
    feeds[p] = graph::HostData(x.begin(), x.end());
  }
  for (const std::string& a : acc_names_)
    feeds[a] =
        graph::HostData(static_cast<std::size_t>(graph::elements(g.value(g.find(a)).shape)), 0.0);
  graph::DelayedScaling scaling =
      replicas_.front().bwd.front()->kept_state().scaling;  // a copy: the run's stays
  graph::evaluate(g, feeds, &scaling, &m.monitors);
  if (m.monitors.empty()) return;
  std::set<std::int64_t> layers;
  bool global = false;
  for (const auto& [site, st] : m.monitors) {
    const double pct =
        st.elements ? 100.0 * static_cast<double>(st.saturated) / static_cast<double>(st.elements)
                    : 0.0;
    if (pct <= c_.overflow_pct) continue;
    // The layer: a layer prefix in the matmul's operands' names.
    std::int64_t layer = -1;
    const graph::Node& n = g.node(g.value(g.find(site.substr(0, site.size() - 2))).node);
    for (int v : n.inputs)
      for (std::int64_t l = 0; l < c_.layers && layer < 0; ++l)
        if (g.value(v).name.find(layer_prefix(c_, l)) != std::string::npos) layer = l;
    std::string act = "warning only";
    if (c_.overflow_policy == "fallback-layer" && layer >= 0 && !bf16_layers_.contains(layer)) {
      layers.insert(layer);
      act = fmt::format("layer {} falls back to bf16 (this step on)", layer);
    } else if (c_.overflow_policy != "warn" && recipe_ != "bf16") {
      global = true;
      act = "the recipe falls back to bf16 (this step on)";
    }
    m.actions.push_back(
        fmt::format("step {}: matmul operand {} saturates {:.2f} % of {} elements "
                    "(> {} %); {}",
                    m.step, site, pct, st.elements, c_.overflow_pct, act));
  }
  if (layers.empty() && !global) return;
  bf16_layers_.insert(layers.begin(), layers.end());
  if (global) recipe_ = "bf16";
  rebuild();
}

// Recompiles for the current recipe and bf16 layers, keeping every state:
// weights, masters, moments, gradient accumulators, scaling state.
void Trainer::rebuild() {
  // The accumulators are zero here (a fallback comes before a step's
  // micro-batches or after its bad gradients were dropped).
  const runtime::KeptState kept = replicas_.front().bwd.front()->kept_state();
  const std::map<std::string, std::vector<float>> state = optimizer_state();
  build();
  set_optimizer_state(state);
  for (Replica& rep : replicas_)
    for (auto& b : rep.bwd) b->restore_kept_state(kept);
  push_weights();
}

}  // namespace tern::train
