// One step's micro-batches on every replica and the gradient sync: DDP
// buckets overlapping the backward, ZeRO-1 shards, tied embeddings, MPI.
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
#include "sim/simulator.h"
#include "train/checkpoint.h"
#include "train/shard.h"
#include "util/error.h"
#include "util/file.h"

#include "train/trainer_detail.h"

namespace tern::train {

using namespace detail;

namespace {

// The time of the collective the system ran last.
double last_collective(const runtime::System& sys) {
  return sys.events().back().duration.value();
}

// Elements [at, at + e) of a flat buffer; `at` moves past them.
std::vector<float> take(const std::vector<float>& flat, std::size_t& at, std::size_t e) {
  std::vector<float> x(flat.begin() + static_cast<std::ptrdiff_t>(at),
                       flat.begin() + static_cast<std::ptrdiff_t>(at + e));
  at += e;
  return x;
}

}  // namespace

struct Trainer::ReplicaRun {
  std::vector<double> losses;
  std::vector<std::vector<double>> f, b;
  runtime::StepResult last;
  std::exception_ptr error;
};

runtime::StepResult Trainer::run_replicas(std::int64_t s, const std::vector<Batch>& batches,
                                          StepMetrics& m, double& loss) {
  const std::size_t P = stages_.size();
  const std::vector<ReplicaRun> ran = run_micro_batches(s, batches);
  reduced_.clear();
  if (c_.dp == 1 && P == 1) {  // one chip: the grad program's accumulators and norm
    for (double l : ran[0].losses) loss += l;
    double ns = 0;
    for (double t : ran[0].b[0]) ns += t;
    m.sim_ns += ns;
    system_->advance(0, Nanoseconds(ns), "grad");
    for (const std::string& a : acc_names_) reduced_[a] = replicas_[0].bwd[0]->read(a);
    return ran[0].last;
  }
  // Data parallel with one stage and zero 0 overlaps the reduction with the
  // last micro-batch's backward: buckets of gradients (in the order they
  // become final, c.bucket_mb each, as PyTorch DDP) are all-reduced as soon
  // as their last gradient is written. Every replica runs the same program,
  // so the times are this process's first replica's.
  const bool overlap =
      c_.dp > 1 && P == 1 && c_.tp == 1 && c_.zero == 0 && c_.bucket_mb > 0 && c_.accum > 0;
  const Nanoseconds t0 = max_clock();
  Accumulators accs = gather_accumulators(ran, overlap, m, loss);
  // ... a param in two stages (GPT-2's tied embedding, pp > 1): its two
  // gradients all-reduced between the first and the last stage's chips ...
  if (P > 1 && c_.tp == 1) reduce_tied(accs, m);
  // ... and the data-parallel reduction on the simulated chips: FP32, in
  // replica order, one bucket of every gradient of a stage (runtime::
  // System): an all-reduce, or (zero 1) a reduce-scatter that leaves each
  // replica its shard, the bucket laid out shard by shard, each padded to
  // the largest.
  if (c_.tp > 1)
    reduce_tensor_parallel(accs, m);
  else if (c_.zero == 1)
    reduce_zero(accs, m);
  else if (overlap)
    reduce_buckets(accs, gradient_ready(ran[0]), ran[0].b[0].back(), m);
  else
    reduce_stages(accs, m);
  runtime::StepResult norm = gradient_norm(m);
  m.sim_ns += (max_clock() - t0).value();
  return norm;
}

std::vector<Trainer::ReplicaRun> Trainer::run_micro_batches(std::int64_t s,
                                                            const std::vector<Batch>& batches) {
  const std::size_t n = replicas_.size();
  std::vector<ReplicaRun> ran(n);
  auto run = [&](std::size_t k) {
    try {
      replica_micro_batches(k, s, batches, ran[k]);
    } catch (...) {
      ran[k].error = std::current_exception();
    }
  };
  // Replicas are independent until the reduction: host threads take them
  // in turn (each has its own Sessions; results do not depend on the count),
  // each simulating on its share of the host's threads.
  const auto host = static_cast<std::size_t>(sim::host_threads());
  const std::size_t threads =
      std::min<std::size_t>(n, c_.threads > 0 ? static_cast<std::size_t>(c_.threads) : host);
  if (threads <= 1) {
    for (std::size_t k = 0; k < n; ++k) run(k);
  } else {
    std::atomic<std::size_t> next{0};
    std::vector<std::thread> pool;
    for (std::size_t t = 0; t < threads; ++t)
      pool.emplace_back([&] {
        sim::set_host_threads(static_cast<int>(std::max<std::size_t>(1, host / threads)));
        for (std::size_t k; (k = next++) < n;) run(k);
      });
    for (std::thread& t : pool) t.join();
  }
  for (const ReplicaRun& x : ran)
    if (x.error) std::rethrow_exception(x.error);
  return ran;
}

void Trainer::replica_micro_batches(std::size_t k, std::int64_t s,
                                    const std::vector<Batch>& batches, ReplicaRun& out) {
  const std::size_t P = stages_.size(), A = static_cast<std::size_t>(c_.accum);
  Replica& rep = replicas_[k];
  out.f.assign(P, {}), out.b.assign(P, {});
  const std::int64_t r = first_ + static_cast<std::int64_t>(k);
  for (std::size_t i = 0; i < A; ++i) {
    const std::int64_t j = r * c_.accum + static_cast<std::int64_t>(i);
    const auto all = model_inputs(batches[static_cast<std::size_t>(j)]);
    // Every stage of micro-batch j rounds with the streams of (seed, step,
    // j), salted by the stage.
    auto opts = [&](std::size_t st) {
      return runtime::StepOptions{c_.stochastic_rounding,
                                  stream_seed(c_.seed, s, j) + st * 0x632be59bd9b4e019ull};
    };
    if (c_.tp > 1) {
      tensor_parallel_micro_batch(rep, all, opts, out.f, out.b, out.losses);
      continue;
    }
    // Forward stage by stage (each stage's output is the next one's
    // input), then the last stage's backward (its forward and the loss
    // with it) and each earlier stage's from the gradient of its output.
    std::vector<std::vector<float>> x(P);  // each stage's input
    for (std::size_t st = 0; st + 1 < P; ++st) {
      auto feeds = inputs_of(*stages_[st].fwd, all);
      if (st > 0) feeds[stages_[st].in] = x[st];
      runtime::StepResult res = rep.fwd[st]->step(feeds, opts(st));
      out.f[st].push_back(res.time_ns);
      x[st + 1] = std::move(res.outputs.at(stages_[st].out));
    }
    std::vector<float> dy;
    for (std::size_t st = P; st-- > 0;) {
      auto feeds = inputs_of(*stages_[st].bwd, all);
      if (st > 0) feeds[stages_[st].in] = x[st];
      if (st + 1 < P) feeds[stages_[st].dy] = std::move(dy);
      runtime::StepResult res = rep.bwd[st]->step(feeds, opts(st));
      out.b[st].push_back(res.time_ns);
      if (st + 1 == P) out.losses.push_back(res.outputs.at("loss")[0]);
      if (st > 0) dy = std::move(res.outputs.at(stages_[st].dx));
      if (st == 0) out.last = std::move(res);
    }
  }
}

std::vector<double> Trainer::gradient_ready(const ReplicaRun& first) const {
  std::vector<double> ready(param_names_.size(), -1.0);  // ns into the last program
  const graph::Executable& ex = *stages_[0].bwd;
  std::map<std::string, std::size_t> of;
  for (std::size_t i = 0; i < param_names_.size(); ++i) of[acc_names_[i] + ".next"] = i;
  const auto& ev = first.last.events;
  for (std::size_t j = 0; j < ev.size() && j < ex.launches.size(); ++j)
    for (const graph::Binding& o : ex.launches[j].outputs)
      if (o.value >= 0)
        if (auto it = of.find(ex.graph.value(o.value).name); it != of.end())
          ready[it->second] = std::max(ready[it->second], ev[j].start_ns + ev[j].ns);
  // A gradient no launch is seen writing is taken as final at the end.
  for (double& t : ready)
    if (t < 0) t = first.b[0].back();
  return ready;
}

Trainer::Accumulators Trainer::gather_accumulators(const std::vector<ReplicaRun>& ran, bool overlap,
                                                   StepMetrics& m, double& loss) {
  const std::size_t n = replicas_.size(), P = stages_.size();
  const auto A = static_cast<std::size_t>(c_.accum);
  // Every rank gets every replica's losses, program times and accumulators
  // (per stage; MPI moves the real bytes between processes) ...
  std::vector<std::uint8_t> mine;
  for (std::size_t k = 0; k < n; ++k) {
    put(mine, ran[k].losses.data(), A * sizeof(double));
    for (std::size_t st = 0; st < P; ++st) {
      if (st + 1 < P) put(mine, ran[k].f[st].data(), A * sizeof(double));
      put(mine, ran[k].b[st].data(), A * sizeof(double));
      for (std::size_t i : stages_[st].params) {
        const std::vector<float> x = replicas_[k].bwd[st]->read(acc_names_[i]);
        put(mine, x.data(), x.size() * sizeof(float));
      }
    }
  }
  const std::vector<std::vector<std::uint8_t>> all = comm_->all_gather(mine);
  Accumulators accs(static_cast<std::size_t>(c_.dp));
  std::vector<double> losses;
  for (int q = 0; q < comm_->size(); ++q) {
    Reader rd{all[static_cast<std::size_t>(q)]};
    for (std::int64_t r = runtime::block_first(c_.dp, comm_->size(), q);
         r < runtime::block_first(c_.dp, comm_->size(), q + 1); ++r) {
      std::vector<double> l(A);
      rd.get(l.data(), A * sizeof(double));
      losses.insert(losses.end(), l.begin(), l.end());
      std::vector<std::vector<double>> f(P, std::vector<double>(A)), b = f;
      auto& acc = accs[static_cast<std::size_t>(r)];
      acc.resize(P);
      for (std::size_t st = 0; st < P; ++st) {
        if (st + 1 < P) rd.get(f[st].data(), A * sizeof(double));
        rd.get(b[st].data(), A * sizeof(double));
        for (std::size_t i : stages_[st].params) {
          std::vector<float> x(static_cast<std::size_t>(
              stages_[st].tp >= 0 && sliced(i) ? acc_sizes_[i] / c_.tp : acc_sizes_[i]));
          rd.get(x.data(), x.size() * sizeof(float));
          acc[st].push_back(std::move(x));
        }
      }
      replica_timeline(r, f, b, overlap, m);
    }
  }
  for (double l : losses) loss += l;  // in global micro-batch order, as one chip would
  return accs;
}

void Trainer::replica_timeline(std::int64_t r, const std::vector<std::vector<double>>& f,
                               const std::vector<std::vector<double>>& b, bool overlap,
                               StepMetrics& m) {
  if (stages_.size() == 1) {
    double ns = 0;
    for (double t : b[0]) ns += t;
    // Overlapped: the last micro-batch's program is advanced bucket by
    // bucket (reduce_buckets).
    if (overlap) ns -= b[0].back();
    if (ns > 0) system_->advance(chip_of(r, 0), Nanoseconds(ns), "grad");
    return;
  }
  // Send/recv on the collective engines: in comm, not exposed (a stage
  // waiting for its input shows as the pipeline's bubble); the tp
  // all-reduces block: exposed.
  double p2p = 0, reduces = 0;
  pipeline_timeline(r, f, b, p2p, reduces);
  if (r == 0) m.comm_ns += p2p + reduces, m.exposed_comm_ns += reduces;
}

std::size_t Trainer::position(std::size_t st, std::size_t i) const {
  const auto& ps = stages_[st].params;
  return static_cast<std::size_t>(std::find(ps.begin(), ps.end(), i) - ps.begin());
}

void Trainer::exposed_collective(StepMetrics& m) const {
  const double d = last_collective(*system_);
  m.comm_ns += d;
  m.exposed_comm_ns += d;  // nothing overlaps it: it follows the backward pass
}

void Trainer::reduce_tied(Accumulators& accs, StepMetrics& m) {
  const std::size_t P = stages_.size();
  std::vector<std::size_t> tied;
  for (std::size_t i : stages_.back().params)
    if (stage_of_[i] != P - 1) tied.push_back(i);
  if (tied.empty()) return;
  std::vector<std::vector<int>> groups;
  for (std::int64_t r = 0; r < c_.dp; ++r) {
    for (std::size_t st : {std::size_t{0}, P - 1}) {
      std::vector<float> buf;
      for (std::size_t i : tied) {
        const auto& x = accs[static_cast<std::size_t>(r)][st][position(st, i)];
        buf.insert(buf.end(), x.begin(), x.end());
      }
      system_->write(chip_of(r, static_cast<std::int64_t>(st)), "tied", buf);
    }
    groups.push_back({chip_of(r, 0), chip_of(r, c_.pp - 1)});
  }
  system_->all_reduce("tied", groups);
  exposed_collective(m);
  for (std::int64_t r = 0; r < c_.dp; ++r) {
    const std::vector<float> sum = system_->read(chip_of(r, 0), "tied");
    std::size_t at = 0;
    for (std::size_t i : tied) {
      std::vector<float> x = take(sum, at, static_cast<std::size_t>(acc_sizes_[i]));
      accs[static_cast<std::size_t>(r)][P - 1][position(P - 1, i)] = x;
      accs[static_cast<std::size_t>(r)][0][position(0, i)] = std::move(x);
    }
  }
}

std::vector<std::vector<float>> Trainer::whole_accumulators(const Accumulators& accs,
                                                            std::int64_t r) const {
  // A replica's ranks' slices side by side, a replicated param's pieces
  // summed (FP32, in order: the tied embedding's two uses).
  std::vector<std::vector<float>> fr(param_names_.size());
  std::vector<std::vector<std::vector<float>>> parts(param_names_.size());
  for (std::size_t st = 0; st < stages_.size(); ++st)
    for (std::size_t i : stages_[st].params) {
      const auto& x = accs[static_cast<std::size_t>(r)][st][position(st, i)];
      if (stages_[st].tp >= 0 && sliced(i)) {
        parts[i].resize(static_cast<std::size_t>(c_.tp));
        parts[i][static_cast<std::size_t>(stages_[st].tp)] = x;
      } else if (fr[i].empty()) {
        fr[i] = x;
      } else {
        for (std::size_t e = 0; e < x.size(); ++e) fr[i][e] += x[e];
      }
    }
  for (std::size_t i = 0; i < param_names_.size(); ++i)
    if (sliced(i)) fr[i] = assemble(i, parts[i]);
  return fr;
}

void Trainer::time_tied_tensor_parallel(StepMetrics& m) {
  // A param on two stages (the tied embedding, pp > 1): its two gradients
  // all-reduced between the first and the last stage's chips (summed by
  // whole_accumulators; here timed).
  std::int64_t tied_n = 0;
  for (std::size_t i = 0; i < param_names_.size(); ++i)
    if (stage_of_[i] == stage_pieces_[0].first)
      for (std::size_t k = stage_pieces_.back().first; k < stage_pieces_.back().second; ++k)
        if (std::find(stages_[k].params.begin(), stages_[k].params.end(), i) !=
            stages_[k].params.end()) {
          tied_n += acc_sizes_[i];
          break;
        }
  if (tied_n == 0) return;
  std::vector<std::vector<int>> groups;
  const std::vector<float> buf(static_cast<std::size_t>(tied_n), 0.0f);
  for (std::int64_t r = 0; r < c_.dp; ++r)
    for (std::int64_t t = 0; t < c_.tp; ++t) {
      groups.push_back({chip_of(r, 0, t), chip_of(r, c_.pp - 1, t)});
      for (int ch : groups.back()) system_->write(ch, "tied", buf);
    }
  system_->all_reduce("tied", groups);
  exposed_collective(m);
}

void Trainer::reduce_tensor_parallel(const Accumulators& accs, StepMetrics& m) {
  std::vector<std::vector<std::vector<float>>> full(static_cast<std::size_t>(c_.dp));
  for (std::int64_t r = 0; r < c_.dp; ++r)
    full[static_cast<std::size_t>(r)] = whole_accumulators(accs, r);
  if (c_.pp > 1) time_tied_tensor_parallel(m);
  // Then the data-parallel all-reduce of each optimizer shard's bucket (a
  // tp rank's slices of a stage's params and the replicated ones) over its
  // replicas; the shards' collectives run side by side on disjoint chips,
  // so the step waits for the longest.
  std::map<std::size_t, std::vector<std::vector<float>>> slices;
  double side = 0;
  for (std::size_t k = 0; k < shards_.size(); ++k) {
    const Shard& sh = shards_[k];
    const std::string name = fmt::format("grads.{}", k);
    std::vector<float> sum;
    for (std::int64_t r = 0; r < c_.dp; ++r) {
      std::vector<float> flat;
      for (std::size_t i : sh.params) {
        const auto& x = full[static_cast<std::size_t>(r)][i];
        const std::vector<float> y = sliced(i) ? slice(i, sh.tp, x) : x;
        flat.insert(flat.end(), y.begin(), y.end());
      }
      if (c_.dp == 1)
        sum = std::move(flat);
      else
        system_->write(sh.chips[static_cast<std::size_t>(r)], name, flat);
    }
    if (c_.dp > 1) {
      system_->all_reduce(name, {sh.chips});
      side = std::max(side, last_collective(*system_));
      sum = system_->read(sh.chips.front(), name);
    }
    std::size_t at = 0;
    for (std::size_t i : sh.params) {
      const auto e = static_cast<std::size_t>(sliced(i) ? acc_sizes_[i] / c_.tp : acc_sizes_[i]);
      std::vector<float> x = take(sum, at, e);
      if (sliced(i)) {
        slices[i].resize(static_cast<std::size_t>(c_.tp));
        slices[i][static_cast<std::size_t>(sh.tp)] = std::move(x);
      } else if (!reduced_.contains(acc_names_[i])) {
        reduced_[acc_names_[i]] = std::move(x);
      }
    }
  }
  m.comm_ns += side, m.exposed_comm_ns += side;
  for (auto& [i, parts] : slices) reduced_[acc_names_[i]] = assemble(i, parts);
}

void Trainer::reduce_zero(const Accumulators& accs, StepMetrics& m) {
  std::int64_t block = 0;
  for (const Shard& sh : shards_) block = std::max(block, sh.elements);
  std::vector<int> group;
  for (std::int64_t r = 0; r < c_.dp; ++r) {
    std::vector<float> flat(static_cast<std::size_t>(block) * shards_.size(), 0.0f);
    for (std::size_t k = 0; k < shards_.size(); ++k) {
      std::size_t at = k * static_cast<std::size_t>(block);
      for (std::size_t i : shards_[k].params) {
        const auto& x = accs[static_cast<std::size_t>(r)][0][i];
        std::copy(x.begin(), x.end(), flat.begin() + static_cast<std::ptrdiff_t>(at));
        at += x.size();
      }
    }
    system_->write(chip_of(r, 0), "grads", flat);
    group.push_back(chip_of(r, 0));
  }
  system_->reduce_scatter("grads", "grad_shard", {group});
  exposed_collective(m);
  for (std::size_t k = 0; k < shards_.size(); ++k) {
    const std::vector<float> x = system_->read(shards_[k].chips.front(), "grad_shard");
    std::size_t at = 0;
    for (std::size_t i : shards_[k].params)
      reduced_[acc_names_[i]] = take(x, at, static_cast<std::size_t>(acc_sizes_[i]));
  }
}

std::vector<std::vector<std::size_t>> Trainer::gradient_buckets(
    const std::vector<double>& ready) const {
  // In the order the gradients become final, each closed at bucket_mb MiB
  // of FP32 (a larger param is a bucket of its own).
  std::vector<std::size_t> order(param_names_.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t x, std::size_t y) { return ready[x] < ready[y]; });
  const double cap = c_.bucket_mb * 1024 * 1024;
  std::vector<std::vector<std::size_t>> buckets(1);
  double bytes = 0;
  for (std::size_t i : order) {
    if (!buckets.back().empty() && bytes + 4.0 * static_cast<double>(acc_sizes_[i]) > cap)
      buckets.emplace_back(), bytes = 0;
    buckets.back().push_back(i);
    bytes += 4.0 * static_cast<double>(acc_sizes_[i]);
  }
  return buckets;
}

void Trainer::reduce_buckets(const Accumulators& accs, const std::vector<double>& ready,
                             double program, StepMetrics& m) {
  const std::vector<std::vector<std::size_t>> buckets = gradient_buckets(ready);
  std::vector<int> group;
  for (std::int64_t r = 0; r < c_.dp; ++r) group.push_back(chip_of(r, 0));
  std::vector<runtime::Handle> handles;
  double done = 0;  // ns of the last program advanced on every replica's chip
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    double at = 0;
    for (std::size_t i : buckets[k]) at = std::max(at, ready[i]);
    at = std::min(at, program);
    const std::string name = fmt::format("grads.{}", k);
    for (std::int64_t r = 0; r < c_.dp; ++r) {
      if (at > done) system_->advance(chip_of(r, 0), Nanoseconds(at - done), "grad");
      std::vector<float> flat;
      for (std::size_t i : buckets[k]) {
        const auto& x = accs[static_cast<std::size_t>(r)][0][position(0, i)];
        flat.insert(flat.end(), x.begin(), x.end());
      }
      system_->write(chip_of(r, 0), name, flat);
    }
    done = std::max(done, at);
    handles.push_back(
        system_->all_reduce(name, {group}, runtime::ReduceOp::sum, runtime::Launch::async));
    m.comm_ns += last_collective(*system_);
  }
  for (std::int64_t r = 0; r < c_.dp; ++r)
    if (program > done) system_->advance(chip_of(r, 0), Nanoseconds(program - done), "grad");
  const Nanoseconds computed = max_clock();
  for (runtime::Handle h : handles) system_->wait(h);
  m.exposed_comm_ns += (max_clock() - computed).value();
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    const std::vector<float> sum = system_->read(group.front(), fmt::format("grads.{}", k));
    std::size_t at = 0;
    for (std::size_t i : buckets[k])
      reduced_[acc_names_[i]] = take(sum, at, static_cast<std::size_t>(acc_sizes_[i]));
  }
}

void Trainer::reduce_stages(const Accumulators& accs, StepMetrics& m) {
  double side = 0;  // the stages' all-reduces run side by side on disjoint chips
  for (std::size_t st = 0; st < stages_.size(); ++st) {
    std::vector<float> sum;
    if (c_.dp > 1) {
      std::vector<int> group;
      const std::string name = fmt::format("grads.{}", st);
      for (std::int64_t r = 0; r < c_.dp; ++r) {
        std::vector<float> flat;
        for (const auto& x : accs[static_cast<std::size_t>(r)][st])
          flat.insert(flat.end(), x.begin(), x.end());
        system_->write(chip_of(r, static_cast<std::int64_t>(st)), name, flat);
        group.push_back(chip_of(r, static_cast<std::int64_t>(st)));
      }
      system_->all_reduce(name, {group});
      side = std::max(side, last_collective(*system_));
      sum = system_->read(group.front(), name);
    } else {
      for (const auto& x : accs[0][st]) sum.insert(sum.end(), x.begin(), x.end());
    }
    std::size_t at = 0;
    for (std::size_t i : stages_[st].params) {
      std::vector<float> x = take(sum, at, static_cast<std::size_t>(acc_sizes_[i]));
      if (stage_of_[i] == st) reduced_[acc_names_[i]] = std::move(x);
    }
  }
  m.comm_ns += side, m.exposed_comm_ns += side;
}

runtime::StepResult Trainer::gradient_norm(StepMetrics& m) {
  // Each shard's chips of their copy of its sum, the shards' sums of
  // squares then all-gathered (between a replica's stages, or over the
  // replicas for zero 1). The host adds the per-param sums in param order,
  // as for one chip.
  std::vector<std::uint8_t> part;
  for (Shard& sh : shards_) {
    if (reporter(sh) != comm_->rank()) continue;
    std::map<std::string, std::vector<float>> feeds;
    for (std::size_t i : sh.params)
      feeds[acc_names_[i]] = sh.tp >= 0 && sliced(i) ? slice(i, sh.tp, reduced_.at(acc_names_[i]))
                                                     : reduced_.at(acc_names_[i]);
    const runtime::StepResult r = sh.norm_session->step(feeds);
    put(part, &r.time_ns, sizeof(double));
    for (std::size_t i : sh.params) put(part, r.outputs.at(sumsq_names_[i]).data(), 4);
  }
  const std::vector<std::vector<std::uint8_t>> parts = comm_->all_gather(part);
  std::size_t most = 0;
  for (const Shard& sh : shards_) most = std::max(most, sh.params.size());
  runtime::StepResult norm;
  std::vector<Reader> readers;
  for (const auto& p : parts) readers.push_back(Reader{p});
  for (const Shard& sh : shards_) {
    Reader& rd = readers[static_cast<std::size_t>(reporter(sh))];
    double ns = 0;
    rd.get(&ns, sizeof ns);
    std::vector<float> sums(most, 0.0f);
    for (std::size_t j = 0; j < sh.params.size(); ++j) {
      rd.get(&sums[j], 4);
      const std::size_t i = sh.params[j];
      const auto [it, fresh] =
          norm.outputs.try_emplace(sumsq_names_[i], std::vector<float>{sums[j]});
      if (!fresh && sh.tp > 0 && sliced(i)) it->second[0] += sums[j];  // the slices' sums
    }
    for (int chip : sh.chips) {
      system_->advance(chip, Nanoseconds(ns), "grad norm");
      if (shards_.size() > 1) system_->write(chip, "sumsq", sums);
    }
  }
  if (shards_.size() > 1) {
    system_->all_gather("sumsq", "sumsqs", sumsq_groups());
    exposed_collective(m);
  }
  return norm;
}

std::vector<std::vector<int>> Trainer::sumsq_groups() const {
  std::vector<std::vector<int>> groups;
  if (c_.zero == 1) {
    groups.emplace_back();
    for (std::int64_t r = 0; r < c_.dp; ++r) groups.back().push_back(chip_of(r, 0));
    return groups;
  }
  for (std::int64_t r = 0; r < c_.dp; ++r) {
    groups.emplace_back();
    for (std::int64_t st = 0; st < c_.pp; ++st)
      for (std::int64_t t = 0; t < c_.tp; ++t) groups.back().push_back(chip_of(r, st, t));
  }
  return groups;
}

}  // namespace tern::train
