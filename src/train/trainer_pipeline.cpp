// Pipeline (1F1B) and tensor-parallel timelines and the sequence-parallel
// shards of a micro-batch.
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

double Trainer::pieces_timeline(std::int64_t r, std::int64_t stage, std::size_t lo, std::size_t hi,
                                bool forward, std::size_t i,
                                const std::vector<std::vector<double>>& f,
                                const std::vector<std::vector<double>>& b) {
  // Megatron's f and g: a layer's shard pieces (one a tp rank) are followed
  // by a blocking all-reduce of their outputs (forward) or input gradients
  // (backward). A replicated piece runs on every tp chip of the stage.
  const auto T = static_cast<std::size_t>(c_.tp);
  std::vector<int> group;
  for (std::size_t t = 0; t < T; ++t)
    group.push_back(chip_of(r, stage, static_cast<std::int64_t>(t)));
  const std::string step = fmt::format("{} {}", forward ? "forward" : "backward", i);
  double reduces = 0;
  // The collective on value's full size: all-reduce; with sequence
  // parallelism, a reduce-scatter into a sequence-parallel piece's input or
  // an all-gather out of one.
  enum class Kind { all_reduce, reduce_scatter, all_gather };
  auto collective = [&](const std::string& value, Kind kind) {
    const auto n = static_cast<std::size_t>(boundary_elements_.at(value));
    const num::FormatId fm = system_format(boundary_dtype_.at(value));
    const std::vector<float> buf(kind == Kind::all_gather ? n / T : n, 0.0f);
    for (int c : group) system_->write(c, "tp.partial", buf, fm);
    if (kind == Kind::all_reduce) system_->all_reduce("tp.partial", {group});
    if (kind == Kind::reduce_scatter) system_->reduce_scatter("tp.partial", "tp.out", {group});
    if (kind == Kind::all_gather) system_->all_gather("tp.partial", "tp.out", {group});
    reduces += system_->events().back().duration.value();
  };
  auto all_reduce = [&](const std::string& value) { collective(value, Kind::all_reduce); };
  // Whether the piece reading (or writing) `value` is sequence parallel.
  auto sp_reads = [&](const std::string& value) {
    for (const Stage& sg : stages_)
      if (std::find(sg.ins.begin(), sg.ins.end(), value) != sg.ins.end()) return sg.sp;
    return false;
  };
  auto sp_writes = [&](const std::string& value) {
    for (const Stage& sg : stages_)
      if (std::find(sg.outs.begin(), sg.outs.end(), value) != sg.outs.end()) return sg.sp;
    return false;
  };
  auto run = [&](std::size_t k, bool fwd) {
    const double t = fwd ? f[k][i] : b[k][i];
    if (stages_[k].tp < 0) {
      for (int c : group) system_->advance(c, Nanoseconds(t), step);
      return false;
    }
    system_->advance(group[static_cast<std::size_t>(stages_[k].tp)], Nanoseconds(t), step);
    return true;
  };
  if (forward) {
    for (std::size_t k = lo; k < hi; ++k) {
      if (!stages_[k].fwd) continue;  // the last piece: its forward runs with its backward
      if (!run(k, true) || stages_[k].tp != c_.tp - 1) continue;
      if (stages_[k].sp) {  // its outputs whole for the pieces that are not
        for (const std::string& out : stages_[k].outs)
          if (!sp_reads(out)) collective(out, Kind::all_gather);
      } else {
        const std::string& out = stages_[k].outs[0];
        sp_reads(out) ? collective(out, Kind::reduce_scatter) : all_reduce(out);
      }
    }
  } else {
    for (std::size_t k = hi; k-- > lo;) {
      if (!run(k, false) || stages_[k].tp != 0) continue;
      if (stages_[k].sp) {
        for (const std::string& in : stages_[k].ins)
          if (!sp_writes(in)) collective(in, Kind::all_gather);
      } else {
        const std::string& in = stages_[k].ins[0];
        sp_writes(in) ? collective(in, Kind::reduce_scatter) : all_reduce(in);
      }
    }
  }
  return reduces;
}

void Trainer::pipeline_timeline(std::int64_t r, const std::vector<std::vector<double>>& f,
                                const std::vector<std::vector<double>>& b, double& p2p,
                                double& reduces) {
  // 1F1B (PipeDream-Flush, Narayanan et al. 2021): stage s runs
  // min(P - s - 1, m) forwards, then alternates one forward and one
  // backward, then the remaining backwards; the last stage runs each
  // micro-batch's backward (its forward included) as soon as its input
  // arrives. Each stage's output goes to the next stage, each backward's
  // input gradient to the previous one, by send/recv on the collective
  // engines (tp rank t to tp rank t) while compute goes on; a stage waits
  // only for what it reads. The transfers here are timed from their sizes;
  // the values went from program to program on the host. pp 1: each
  // micro-batch's forward and backward on the one stage.
  const auto P = static_cast<std::size_t>(c_.pp), M = static_cast<std::size_t>(c_.accum);
  const auto T = static_cast<std::size_t>(c_.tp);
  struct Op {
    bool forward;
    std::size_t i;
  };
  std::vector<std::vector<Op>> ops(P);
  for (std::size_t s = 0; s < P; ++s) {
    if (s + 1 == P) {
      for (std::size_t i = 0; i < M; ++i) ops[s].push_back({false, i});
      continue;
    }
    const std::size_t w = std::min(P - 1 - s, M);
    for (std::size_t i = 0; i < w; ++i) ops[s].push_back({true, i});
    for (std::size_t k = 0; k < M; ++k) {
      if (w + k < M) ops[s].push_back({true, w + k});
      ops[s].push_back({false, k});
    }
  }
  struct Sent {
    std::vector<runtime::Handle> h;  // one a tp rank
    double arrives = -1;             // < 0: not sent yet; else the last to arrive
  };
  std::vector<std::vector<Sent>> act(P, std::vector<Sent>(M)), grad = act;
  std::vector<std::size_t> at(P, 0);
  auto chip = [&](std::size_t s, std::size_t t = 0) {
    return chip_of(r, static_cast<std::int64_t>(s), static_cast<std::int64_t>(t));
  };
  auto dependency = [&](std::size_t s, const Op& op) -> const Sent* {
    if (op.forward) return s > 0 ? &act[s - 1][op.i] : nullptr;
    if (s + 1 < P) return &grad[s + 1][op.i];
    return s > 0 ? &act[s - 1][op.i] : nullptr;
  };
  for (;;) {
    // The stage whose next op can start first (ties: the lower stage).
    std::size_t best = P;
    double best_start = 0;
    for (std::size_t s = 0; s < P; ++s) {
      if (at[s] == ops[s].size()) continue;
      const Sent* dep = dependency(s, ops[s][at[s]]);
      if (dep && dep->arrives < 0) continue;
      const double start = std::max(system_->clock(chip(s)).value(), dep ? dep->arrives : 0.0);
      if (best == P || start < best_start) best = s, best_start = start;
    }
    if (best == P) break;
    const std::size_t s = best;
    const Op op = ops[s][at[s]++];
    if (const Sent* dep = dependency(s, op))
      for (std::size_t t = 0; t < T; ++t) system_->wait(dep->h[t], chip(s, t));
    const auto [lo, hi] = stage_pieces_[s];
    if (op.forward || s + 1 < P) {
      reduces += pieces_timeline(r, static_cast<std::int64_t>(s), lo, hi, op.forward, op.i, f, b);
    } else {  // the last stage: forward and backward of each micro-batch
      reduces += pieces_timeline(r, static_cast<std::int64_t>(s), lo, hi, true, op.i, f, b);
      reduces += pieces_timeline(r, static_cast<std::int64_t>(s), lo, hi, false, op.i, f, b);
    }
    // What it sends: a forward's output on, a backward's input gradient back.
    const bool sends = op.forward ? s + 1 < P : s > 0;
    if (!sends) continue;
    const std::size_t into = op.forward ? s + 1 : s;  // the stage whose input crosses
    std::int64_t n = 0;
    isa::DType dt = isa::DType::fp32;
    for (const std::string& v : stage_inputs_[into])
      n += boundary_elements_.at(v), dt = boundary_dtype_.at(v);
    const std::vector<float> zeros(static_cast<std::size_t>(n), 0.0f);
    const std::string from = op.forward ? "activation" : "activation gradient";
    Sent& out = (op.forward ? act[s] : grad[s])[op.i];
    for (std::size_t t = 0; t < T; ++t) {
      system_->write(chip(s, t), from, zeros, system_format(dt));
      const int to = op.forward ? chip(s + 1, t) : chip(s - 1, t);
      out.h.push_back(system_->send_recv(chip(s, t), from, to, fmt::format("{} {}", from, op.i),
                                         runtime::Launch::async));
      const runtime::CollectiveEvent& e = system_->events().back();
      out.arrives = std::max(out.arrives, (e.start + e.duration).value());
      if (t == 0) p2p += e.duration.value();
    }
  }
}

std::vector<float> Trainer::seq_shard(const std::vector<float>& x, std::size_t t) const {
  const auto B = static_cast<std::size_t>(c_.batch), S = static_cast<std::size_t>(c_.seq);
  const auto n = S / static_cast<std::size_t>(c_.tp), row = x.size() / (B * S);
  std::vector<float> out;
  out.reserve(B * n * row);
  for (std::size_t q = 0; q < B; ++q) {
    const auto at = x.begin() + static_cast<std::ptrdiff_t>((q * S + t * n) * row);
    out.insert(out.end(), at, at + static_cast<std::ptrdiff_t>(n * row));
  }
  return out;
}

std::vector<float> Trainer::seq_assemble(const std::vector<std::vector<float>>& parts) const {
  const auto B = static_cast<std::size_t>(c_.batch), S = static_cast<std::size_t>(c_.seq);
  const auto n = S / parts.size(), row = parts[0].size() / (B * n);
  std::vector<float> out(B * S * row);
  for (std::size_t t = 0; t < parts.size(); ++t)
    for (std::size_t q = 0; q < B; ++q)
      std::copy_n(parts[t].begin() + static_cast<std::ptrdiff_t>(q * n * row), n * row,
                  out.begin() + static_cast<std::ptrdiff_t>((q * S + t * n) * row));
  return out;
}

void Trainer::tensor_parallel_micro_batch(
    Replica& rep, const std::map<std::string, std::vector<float>>& all,
    const std::function<runtime::StepOptions(std::size_t)>& opts,
    std::vector<std::vector<double>>& f, std::vector<std::vector<double>>& b,
    std::vector<double>& losses) {
  // Forward: each piece in order; a layer's shard pieces (one a tp rank)
  // read the same input and their partial outputs are all-reduced: summed
  // in FP32 in rank order and rounded once to the value's dtype. The last
  // piece runs the forward, the loss and its backward. Backward: in
  // reverse, each piece from the gradients of its outputs; the shards'
  // input gradients all-reduced the same way. Replicated pieces run once
  // (every rank would compute the same); pieces_timeline() times them on
  // every rank's chip.
  const std::size_t P = stages_.size();
  const auto T = static_cast<std::size_t>(c_.tp);
  std::map<std::string, std::vector<float>> vals, grads;
  auto reduce = [this](std::vector<std::vector<float>> parts, const std::string& name) {
    std::vector<float> sum = std::move(parts[0]);
    for (std::size_t t = 1; t < parts.size(); ++t)
      for (std::size_t e = 0; e < sum.size(); ++e) sum[e] += parts[t][e];
    const num::Format& fm = *isa::format_of(boundary_dtype_.at(name));
    for (float& e : sum) e = num::round_to(fm, e);
    return sum;
  };
  auto feeds_of = [&](std::size_t st, bool backward) {
    const Stage& sg = stages_[st];
    auto feeds = inputs_of(backward ? *sg.bwd : *sg.fwd, all);
    for (const std::string& in : sg.ins) feeds[in] = vals.at(in);
    if (backward)
      for (const std::string& out : sg.outs)
        if (sg.dys.contains(out)) feeds[sg.dys.at(out)] = grads.at(out);
    return feeds;
  };
  // A sequence-parallel group [st, st + T): rank t's piece on its
  // positions of every boundary value; the outputs (forward) or input
  // gradients (backward) put back together. (Host values stay whole: a
  // reduce-scatter gives each rank its positions of what the all-reduce
  // gives all, the same sums.)
  auto sp_group = [&](std::size_t st, bool backward) {
    const Stage& sg = stages_[st];
    std::map<std::string, std::vector<std::vector<float>>> parts;
    for (std::size_t t = 0; t < T; ++t) {
      auto feeds = inputs_of(backward ? *sg.bwd : *sg.fwd, all);
      for (const std::string& in : sg.ins) feeds[in] = seq_shard(vals.at(in), t);
      if (backward)
        for (const std::string& out : sg.outs) feeds[sg.dys.at(out)] = seq_shard(grads.at(out), t);
      auto& s = backward ? rep.bwd[st + t] : rep.fwd[st + t];
      runtime::StepResult res = s->step(feeds, opts(st + t));
      (backward ? b : f)[st + t].push_back(res.time_ns);
      for (const std::string& v : backward ? sg.ins : sg.outs)
        parts[v].push_back(res.outputs.at(backward ? sg.dxs.at(v) : v));  // two may share one
    }
    for (auto& [v, p] : parts) (backward ? grads : vals)[v] = seq_assemble(p);
  };
  for (std::size_t st = 0; st + 1 < P;) {
    if (stages_[st].tp < 0) {
      runtime::StepResult res = rep.fwd[st]->step(feeds_of(st, false), opts(st));
      f[st].push_back(res.time_ns);
      for (const std::string& out : stages_[st].outs) vals[out] = std::move(res.outputs.at(out));
      ++st;
      continue;
    }
    if (stages_[st].sp) {
      sp_group(st, false);
      st += T;
      continue;
    }
    std::vector<std::vector<float>> parts;
    for (std::size_t t = 0; t < T; ++t) {
      runtime::StepResult res = rep.fwd[st + t]->step(feeds_of(st + t, false), opts(st + t));
      f[st + t].push_back(res.time_ns);
      parts.push_back(std::move(res.outputs.at(stages_[st + t].outs[0])));
    }
    vals[stages_[st].outs[0]] = reduce(std::move(parts), stages_[st].outs[0]);
    st += T;
  }
  {
    runtime::StepResult res = rep.bwd[P - 1]->step(feeds_of(P - 1, true), opts(P - 1));
    b[P - 1].push_back(res.time_ns);
    losses.push_back(res.outputs.at("loss")[0]);
    for (const std::string& in : stages_[P - 1].ins)
      grads[in] = res.outputs.at(stages_[P - 1].dxs.at(in));  // two inputs may share one
  }
  for (std::size_t st = P - 1; st-- > 0;) {
    if (stages_[st].tp < 0) {
      runtime::StepResult res = rep.bwd[st]->step(feeds_of(st, true), opts(st));
      b[st].push_back(res.time_ns);
      for (const std::string& in : stages_[st].ins)
        grads[in] = res.outputs.at(stages_[st].dxs.at(in));
      continue;
    }
    const std::size_t first = st + 1 - T;  // the group's pieces [first, st]
    if (stages_[st].sp) {
      sp_group(first, true);
      st = first;
      continue;
    }
    std::vector<std::vector<float>> parts;
    for (std::size_t t = 0; t < T; ++t) {
      runtime::StepResult res =
          rep.bwd[first + t]->step(feeds_of(first + t, true), opts(first + t));
      b[first + t].push_back(res.time_ns);
      const std::string& in = stages_[first + t].ins[0];
      parts.push_back(std::move(res.outputs.at(stages_[first + t].dxs.at(in))));
    }
    grads[stages_[first].ins[0]] = reduce(std::move(parts), stages_[first].ins[0]);
    st = first;
  }
}

}  // namespace tern::train
