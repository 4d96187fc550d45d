// Weights and optimizer state: shards, the update, checkpoints.
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

runtime::Session& Trainer::holder(std::size_t i) {
  return *replicas_.front().bwd[stage_of_[i]];
}

int Trainer::reporter(const Shard& sh) const {
  const std::int64_t r = sh.chips.front() / (c_.pp * c_.tp);
  for (int q = 0; q < comm_->size(); ++q)
    if (r < runtime::block_first(c_.dp, comm_->size(), q + 1)) return q;
  return comm_->size() - 1;
}

Nanoseconds Trainer::max_clock() const {
  Nanoseconds t(0);
  for (int chip = 0; chip < system_->chips(); ++chip) t = std::max(t, system_->clock(chip));
  return t;
}

// The param a master or moment belongs to (add_adamw names them
// "<param>.master", "<param>.m", "<param>.v").
std::string Trainer::param_of_state(const std::string& state) const {
  if (const auto it = master_of_.find(state); it != master_of_.end()) return it->second;
  for (const std::string& p : param_names_)
    if (state.size() > p.size() && state.starts_with(p) && state[p.size()] == '.' &&
        state.find('.', p.size() + 1) == std::string::npos)
      return p;
  throw Error(fmt::format("optimizer state {} belongs to no param (a tern bug)", state));
}

void Trainer::set_optimizer_state(const std::map<std::string, std::vector<float>>& state) {
  auto part = [this](const Shard& sh, std::size_t i, const std::vector<float>& full) {
    return sh.tp >= 0 && sliced(i) ? slice(i, sh.tp, full) : full;
  };
  for (Shard& sh : shards_) {
    if (!sh.session) continue;
    for (std::size_t i : sh.params)
      sh.session->write(param_names_[i], part(sh, i, weights_.at(param_names_[i])));
    for (const std::string& n : sh.state) {
      const auto it = state.find(n);
      if (it == state.end()) throw Error(fmt::format("no optimizer state {} to restore", n));
      sh.session->write(n, part(sh, param_index(param_of_state(n)), it->second));
    }
  }
}

std::size_t Trainer::param_index(const std::string& name) const {
  const auto it = std::find(param_names_.begin(), param_names_.end(), name);
  if (it == param_names_.end()) throw Error(fmt::format("the model has no param {}", name));
  return static_cast<std::size_t>(it - param_names_.begin());
}

std::map<std::string, std::vector<float>> Trainer::optimizer_state() {
  // This process's shards, then every process's (zero 1 under MPI: each
  // holds its replicas' shards).
  std::vector<std::uint8_t> mine;
  auto put_str = [&mine](const std::string& x) {
    const std::uint64_t n = x.size();
    mine.insert(mine.end(), reinterpret_cast<const std::uint8_t*>(&n),
                reinterpret_cast<const std::uint8_t*>(&n) + sizeof n);
    mine.insert(mine.end(), x.begin(), x.end());
  };
  for (std::size_t k = 0; k < shards_.size(); ++k) {
    const Shard& sh = shards_[k];
    if (reporter(sh) != comm_->rank()) continue;
    for (const std::string& n : sh.state) {
      const std::vector<float> x = sh.session->read(n);
      put_str(std::to_string(k));
      put_str(n);
      put_str(std::string(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float)));
    }
  }
  std::map<std::string, std::vector<std::vector<float>>> parts;  // by shard
  for (const std::vector<std::uint8_t>& blob : comm_->all_gather(mine)) {
    std::size_t at = 0;
    auto get_str = [&]() {
      std::uint64_t n = 0;
      if (at + sizeof n > blob.size())
        throw Error("a rank sent a short optimizer state (a tern bug)");
      std::memcpy(&n, blob.data() + at, sizeof n);
      at += sizeof n;
      if (at + n > blob.size()) throw Error("a rank sent a short optimizer state (a tern bug)");
      std::string x(reinterpret_cast<const char*>(blob.data() + at), n);
      at += n;
      return x;
    };
    while (at < blob.size()) {
      const std::size_t k = std::stoul(get_str());
      const std::string name = get_str(), bytes = get_str();
      std::vector<float> x(bytes.size() / sizeof(float));
      std::memcpy(x.data(), bytes.data(), bytes.size());
      parts[name].resize(shards_.size());
      parts[name][k] = std::move(x);
    }
  }
  // A tp rank's slices make up the whole; otherwise the first shard's copy.
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, by_shard] : parts) {
    const std::size_t i = param_index(param_of_state(name));
    if (c_.tp > 1 && sliced(i)) {
      std::vector<std::vector<float>> by_rank(static_cast<std::size_t>(c_.tp));
      for (std::size_t k = 0; k < by_shard.size(); ++k)
        if (!by_shard[k].empty()) by_rank[static_cast<std::size_t>(shards_[k].tp)] = by_shard[k];
      out[name] = assemble(i, by_rank);
      continue;
    }
    for (auto& x : by_shard)
      if (!x.empty()) {
        out[name] = std::move(x);
        break;
      }
  }
  return out;
}

void Trainer::push_weights() {
  for (Replica& rep : replicas_)
    for (std::size_t st = 0; st < stages_.size(); ++st)
      for (std::size_t i : stages_[st].params) {
        const std::vector<float>& full = weights_.at(param_names_[i]);
        const std::vector<float> w =
            stages_[st].tp >= 0 && sliced(i) ? slice(i, stages_[st].tp, full) : full;
        if (rep.fwd[st]) rep.fwd[st]->write(param_names_[i], w);
        rep.bwd[st]->write(param_names_[i], w);
      }
}

double Trainer::run_update(const std::map<std::string, std::vector<float>>& scalars,
                           StepMetrics& m) {
  const Nanoseconds t0 = max_clock();
  // Every shard this process holds is updated here (each holder keeps its
  // copy of the state); its reporter sends the time and the new weights.
  std::vector<std::uint8_t> mine;
  for (Shard& sh : shards_) {
    if (!sh.session) continue;
    std::map<std::string, std::vector<float>> feeds;
    for (const auto& [name, x] : scalars)
      if (sh.update->graph.find(name) >= 0) feeds[name] = x;
    for (std::size_t i : sh.params)
      feeds[acc_names_[i]] = sh.tp >= 0 && sliced(i) ? slice(i, sh.tp, reduced_.at(acc_names_[i]))
                                                     : reduced_.at(acc_names_[i]);
    const runtime::StepResult r = sh.session->step(feeds);
    if (reporter(sh) != comm_->rank()) continue;
    put(mine, &r.time_ns, sizeof(double));
    for (std::size_t i : sh.params) {
      const std::vector<float> w = sh.session->read(param_names_[i]);
      put(mine, w.data(), w.size() * sizeof(float));
    }
  }
  const std::vector<std::vector<std::uint8_t>> all = comm_->all_gather(mine);
  std::vector<Reader> readers;
  for (const auto& p : all) readers.push_back(Reader{p});
  std::int64_t block = 0;
  for (const Shard& sh : shards_) block = std::max(block, sh.elements);
  const graph::Graph& g = grad_exe_->graph;
  const num::FormatId wf = system_format(g.value(g.find(param_names_[0])).dtype);
  std::map<std::size_t, std::vector<std::vector<float>>> slices;  // tp > 1
  for (const Shard& sh : shards_) {
    Reader& rd = readers[static_cast<std::size_t>(reporter(sh))];
    double ns = 0;
    rd.get(&ns, sizeof ns);
    std::vector<float> w(static_cast<std::size_t>(block), 0.0f);
    rd.get(w.data(), static_cast<std::size_t>(sh.elements) * sizeof(float));
    for (int chip : sh.chips) system_->advance(chip, Nanoseconds(ns), "update");
    if (c_.zero == 1) {
      system_->write(sh.chips.front(), "weights", w, wf);
      continue;
    }
    std::size_t at = 0;
    for (std::size_t i : sh.params) {
      const bool part = sh.tp >= 0 && sliced(i);
      const auto e = static_cast<std::size_t>(part ? acc_sizes_[i] / c_.tp : acc_sizes_[i]);
      std::vector<float> x(w.begin() + static_cast<std::ptrdiff_t>(at),
                           w.begin() + static_cast<std::ptrdiff_t>(at + e));
      at += e;
      if (part) {
        slices[i].resize(static_cast<std::size_t>(c_.tp));
        slices[i][static_cast<std::size_t>(sh.tp)] = std::move(x);
      } else if (sh.tp <= 0) {  // a replicated param: every tp rank's copy is the same
        weights_[param_names_[i]] = std::move(x);
      }
    }
  }
  for (auto& [i, parts] : slices) weights_[param_names_[i]] = assemble(i, parts);
  if (c_.zero == 1) {
    // The updated shards all-gathered on the fabric (padded to the largest,
    // in the params' dtype): every replica's weights.
    std::vector<int> group;
    for (const Shard& sh : shards_) group.push_back(sh.chips.front());
    system_->all_gather("weights", "all_weights", {group});
    const double d = system_->events().back().duration.value();
    m.comm_ns += d, m.exposed_comm_ns += d;
    const std::vector<float> gathered = system_->read(0, "all_weights");
    for (std::size_t k = 0; k < shards_.size(); ++k) {
      std::size_t at = k * static_cast<std::size_t>(block);
      for (std::size_t i : shards_[k].params) {
        const auto e = static_cast<std::size_t>(acc_sizes_[i]);
        weights_[param_names_[i]].assign(gathered.begin() + static_cast<std::ptrdiff_t>(at),
                                         gathered.begin() + static_cast<std::ptrdiff_t>(at + e));
        at += e;
      }
    }
  }
  return (max_clock() - t0).value();
}

// ------------------------------------------------------------ checkpoints

std::string Trainer::save_checkpoint() {
  if (c_.ckpt_dir.empty()) throw Error("save_checkpoint: no ckpt_dir configured");
  Checkpoint ck;
  for (const std::string& p : param_names_) ck.tensors["param/" + p] = weights_.at(p);
  for (auto& [name, x] : optimizer_state()) ck.tensors["param/" + name] = std::move(x);
  const runtime::KeptState kept = replicas_.front().bwd.front()->kept_state();
  for (const auto& [name, bytes] : kept.buffers) {
    std::vector<float> x(bytes.size() / 4);
    if (bytes.size() % 4) throw Error(fmt::format("kept buffer {} is not FP32", name));
    std::memcpy(x.data(), bytes.data(), bytes.size());
    ck.tensors["kept/" + name] = std::move(x);
  }
  nlohmann::json scaling = nlohmann::json::object();
  for (const auto& [name, site] : kept.scaling.state())
    scaling[name] = {{"scale", site.scale},   {"history", site.history},
                     {"length", site.length}, {"pending", site.pending},
                     {"amax", site.amax},     {"fp8", std::string(isa::name(site.fp8))}};
  const LoaderState ls = train_->state();
  ck.meta = {{"step", step_},
             {"opt_step", opt_step_},
             {"config", to_json(c_)},
             {"recipe", recipe_},
             {"bf16_layers", bf16_layers_},
             {"skip_batches", skip_batches_},
             {"norms", std::vector<double>(norms_.begin(), norms_.end())},
             {"loader",
              {{"seed", ls.seed},
               {"epoch", ls.epoch},
               {"next", ls.next},
               {"windows", ls.windows},
               {"shuffle", ls.shuffle}}},
             {"scaling", scaling}};
  const std::filesystem::path file = checkpoint_path(c_.ckpt_dir, step_);
  // Every rank holds the same state: the first writes it; the others wait
  // until it is there (a rollback on any rank may read it next).
  if (comm_->rank() == 0) {
    train::save_checkpoint(file, ck);
    prune_checkpoints(c_.ckpt_dir, c_.keep_last);
  }
  comm_->barrier();
  return file.string();
}

void Trainer::restore(const std::string& where) {
  try {
    restore_from(where);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("--resume {}: the checkpoint's metadata is not what tern writes ({})",
                            where, e.what()));
  }
}

void Trainer::restore_from(const std::string& where) {
  std::filesystem::path file = where;
  Checkpoint ck;
  if (std::filesystem::is_directory(where)) {
    auto good = latest_good(where, notes_);
    if (!good) throw Error(fmt::format("--resume {}: no checkpoint there loads", where));
    file = good->first;
    ck = std::move(good->second);
  } else {
    ck = load_checkpoint(where);
  }
  // The model, the data and its order must be the checkpoint's.
  const TrainConfig was = config_from_json(ck.meta.at("config"));
  // The data's order depends on the micro-batches a step (accum x dp), not
  // on how they are spread over chips and processes.
  if (was.accum * was.dp != c_.accum * c_.dp)
    throw Error(
        fmt::format("--resume {}: the checkpoint took accum x dp = {} x {} micro-batches a step, "
                    "this run {} x {} (the data's order must match)",
                    file.string(), was.accum, was.dp, c_.accum, c_.dp));
  for (const char* key : {"model", "layers", "dim", "heads", "kv_heads", "ffn", "batch", "seq",
                          "seed", "text", "data", "val_fraction"}) {
    const nlohmann::json a = to_json(was).at(key), b = to_json(c_).at(key);
    if (a != b)
      throw Error(
          fmt::format("--resume {}: the checkpoint has {} = {}, this run {} (the model and "
                      "its data must match)",
                      file.string(), key, a.dump(), b.dump()));
  }
  if ((was.recipe == "fp32") != (c_.recipe == "fp32"))
    throw Error(
        fmt::format("--resume {}: recipe {} cannot continue as {} (FP32 params have no "
                    "separate master weights; the others do)",
                    file.string(), was.recipe, c_.recipe));
  if (was.recipe == c_.recipe) {  // fallbacks carry over
    recipe_ = ck.meta.at("recipe").get<std::string>();
    bf16_layers_ = ck.meta.at("bf16_layers").get<std::set<std::int64_t>>();
  } else {
    notes_.push_back(
        fmt::format("recipe {} of the checkpoint changes to {}", was.recipe, c_.recipe));
  }
  build();
  restore_checkpoint(ck);
  notes_.push_back(fmt::format("resumed from {} (step {})", file.string(), step_));
}

void Trainer::restore_checkpoint(const Checkpoint& ck) {
  const nlohmann::json& meta = ck.meta;
  // Weights and optimizer state, whatever layout wrote them: each process
  // takes what its shards hold.
  std::map<std::string, std::vector<float>> state;
  for (const auto& [name, x] : ck.tensors) {
    if (!name.starts_with("param/")) continue;
    const std::string n = name.substr(6);
    if (std::find(param_names_.begin(), param_names_.end(), n) != param_names_.end()) {
      const auto i = static_cast<std::size_t>(
          std::find(param_names_.begin(), param_names_.end(), n) - param_names_.begin());
      weights_[n] = rounded(i, x);  // checks the size
    } else {
      state[n] = x;
    }
  }
  for (const std::string& p : param_names_)
    if (!weights_.contains(p))
      throw Error(fmt::format("the checkpoint has no weights for param {}", p));
  set_optimizer_state(state);
  runtime::KeptState kept;
  for (const auto& [name, x] : ck.tensors)
    if (name.starts_with("kept/")) {
      std::vector<std::uint8_t> b(x.size() * 4);
      std::memcpy(b.data(), x.data(), b.size());
      kept.buffers[name.substr(5)] = std::move(b);
    }
  std::map<std::string, graph::DelayedScaling::Site> sites;
  for (const auto& [name, j] : meta.at("scaling").items()) {
    graph::DelayedScaling::Site s;
    s.scale = j.at("scale"), s.history = j.at("history").get<std::vector<float>>();
    s.length = j.at("length"), s.pending = j.at("pending"), s.amax = j.at("amax");
    s.fp8 = isa::parse_dtype(j.at("fp8").get<std::string>());
    sites[name] = std::move(s);
  }
  kept.scaling.restore(std::move(sites));
  for (Replica& rep : replicas_)
    for (auto& b : rep.bwd) b->restore_kept_state(kept);
  zero_accumulators();
  step_ = meta.at("step"), opt_step_ = meta.at("opt_step");
  // A CRC-valid file can still hold a state tern never writes.
  if (step_ < 0 || opt_step_ < 0 || opt_step_ > step_)
    throw Error(fmt::format(
        "checkpoint: step {} / optimizer step {} is not a state tern writes (0 <= optimizer "
        "step <= step)",
        step_, opt_step_));
  const auto& n = meta.at("norms");
  norms_.assign(n.begin(), n.end());
  for (std::int64_t s : meta.at("skip_batches").get<std::set<std::int64_t>>())
    skip_batches_.insert(s);
  const auto& l = meta.at("loader");
  LoaderState ls;
  ls.seed = l.at("seed"), ls.epoch = l.at("epoch"), ls.next = l.at("next");
  ls.windows = l.at("windows"), ls.shuffle = l.at("shuffle");
  train_->restore(ls);
  push_weights();
}

}  // namespace tern::train
