// Building the programs: the model graph, autocast, its pipeline stages or
// tensor-parallel pieces, the replicas' sessions and the optimizer shards.
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

namespace {

// Adds to a grad graph the FP32 accumulators of `ps` (value ids): each
// gradient is added into "<param>.grad_acc", carried to the next step.
// Each accumulation is scheduled as soon as its gradient exists (not after
// the whole backward), so the gradients become final in the order the
// backward computes them: data parallelism's buckets overlap the rest.
void add_accumulators(graph::Graph& g, const std::map<int, int>& grads,
                      const std::vector<int>& ps) {
  std::vector<int> early;
  for (int p : ps) {
    const graph::Value pv = g.value(p);
    const int acc = g.input(pv.name + ".grad_acc", pv.shape, isa::DType::fp32);
    early.push_back(g.value(acc).node);
    int gr = grads.at(p);
    if (g.value(gr).dtype != isa::DType::fp32) {
      gr = g.cast(gr, isa::DType::fp32);
      early.push_back(g.value(gr).node);
    }
    const int next = g.add(acc, gr);
    early.push_back(g.value(next).node);
    g.rename(next, pv.name + ".grad_acc.next");
    g.mark_output(next);
    g.carry(next, acc);
  }
  g.hoist(early);
}

}  // namespace

// What every program of a build is made from: the chip, the compiler's
// options, the forward pass after autocast and the autocast options
// (applied again to the tensor-parallel shards).
struct Trainer::BuildContext {
  arch::ChipSpec chip;
  graph::CompileOptions o;
  graph::Graph fwd;
  graph::AutocastOptions ao;
  isa::DType param_dtype = isa::DType::fp32;
  std::shared_ptr<const graph::Executable> compile(const graph::Graph& g) const {
    return std::make_shared<const graph::Executable>(graph::compile(g, chip, o));
  }
};

void Trainer::build() {
  const graph::Model m = make_model(c_, tok_->vocab());
  param_names_.clear();
  for (int p : m.params) param_names_.push_back(m.graph.value(p).name);
  BuildContext b{arch::load_chip(c_.arch), {}, m.graph, {}, m.graph.value(m.params.front()).dtype};
  b.o.cores = c_.cores;
  if (recipe_ != "fp32") {
    b.ao = graph::recipe(recipe_, c_.mx_policy);
    for (std::int64_t l : bf16_layers_) b.ao.keep_high.push_back(layer_prefix(c_, l));
    b.fwd = graph::autocast(m.graph, b.ao);
  }
  build_grad(b);
  boundary_dtype_.clear(), boundary_elements_.clear();
  for (const graph::Value& v : b.fwd.values())
    boundary_dtype_[v.name] = v.dtype, boundary_elements_[v.name] = graph::elements(v.shape);
  stage_pieces_.assign(static_cast<std::size_t>(c_.pp), {0, 0});
  stage_inputs_.assign(static_cast<std::size_t>(c_.pp), {});
  stages_.assign(static_cast<std::size_t>(c_.pp), Stage{});
  stage_of_.assign(param_names_.size(), 0);
  if (c_.tp > 1) {
    build_pieces(b);
  } else if (c_.pp == 1) {
    stages_[0].out = "loss";
    stages_[0].bwd = grad_exe_;
    for (std::size_t i = 0; i < param_names_.size(); ++i) stages_[0].params.push_back(i);
  } else {
    build_stages(b);
  }
  for (std::size_t st = stages_.size(); st-- > 0;)
    for (std::size_t i : stages_[st].params) stage_of_[i] = st;
  if (c_.tp == 1)
    for (std::size_t st = 0; st < static_cast<std::size_t>(c_.pp); ++st) {
      stage_pieces_[st] = {st, st + 1};
      if (!stages_[st].in.empty()) stage_inputs_[st] = {stages_[st].in};
    }
  // This process's replicas: a session per stage program.
  replicas_.clear();
  for (std::int64_t r = first_; r < last_; ++r) {
    Replica rep;
    for (const Stage& sg : stages_) {
      rep.fwd.push_back(sg.fwd ? std::make_unique<runtime::Session>(b.chip, sg.fwd) : nullptr);
      rep.bwd.push_back(std::make_unique<runtime::Session>(b.chip, sg.bwd));
    }
    replicas_.push_back(std::move(rep));
  }
  partition_shards();
  build_shard_programs(b);
  // eval: the forward pass alone, for validation and sampling.
  eval_exe_ = b.compile(b.fwd);
  eval_ = std::make_unique<runtime::Session>(b.chip, eval_exe_);
  logits_.reset();
  zero_accumulators();
}

void Trainer::build_grad(const BuildContext& b) {
  // grad: forward + backward, gradients summed into FP32 accumulators.
  graph::Graph g = b.fwd;
  std::vector<int> params;
  for (const std::string& n : param_names_) params.push_back(g.find(n));
  const auto grads = graph::add_backward(g, g.find("loss"), params);
  acc_names_.clear(), sumsq_names_.clear(), acc_sizes_.clear();
  params_ = 0;
  add_accumulators(g, grads, params);
  param_shapes_.clear(), param_dtypes_.clear();
  for (int p : params) {
    const graph::Value& pv = g.value(p);
    param_shapes_.push_back(pv.shape), param_dtypes_.push_back(pv.dtype);
    params_ += graph::elements(pv.shape);
    acc_names_.push_back(pv.name + ".grad_acc");
    acc_sizes_.push_back(graph::elements(pv.shape));
    sumsq_names_.push_back(pv.name + ".grad_sumsq");
  }
  // The sums of squares after every other node, so that the program with
  // them (one chip) and without (dp or pp > 1: the norm of the reduced sum
  // runs in its own program) launch the same kernels in the same order
  // before them: the same stochastic-rounding streams (runtime/device.h).
  if (one_chip())
    for (std::size_t i = 0; i < acc_names_.size(); ++i) {
      const int next = g.find(param_names_[i] + ".grad_acc.next");
      const int sq = g.sum(g.mul(next, next), {});
      g.rename(sq, sumsq_names_[i]);
      g.mark_output(sq);
    }
  grad_graph_ = std::make_unique<graph::Graph>(g);
  grad_exe_ = b.compile(g);
}

Trainer::Stage Trainer::make_piece(const BuildContext& b, const graph::Graph& part,
                                   std::vector<std::string> ins, std::vector<std::string> outs,
                                   int rank) const {
  Stage sg;
  sg.tp = rank, sg.ins = std::move(ins), sg.outs = std::move(outs);
  const bool last = sg.outs == std::vector<std::string>{"loss"};
  if (!last) sg.fwd = b.compile(part);
  // Its backward: the params' and the inputs' gradients from the loss (the
  // last piece) or from the gradients of its outputs, fed as inputs.
  graph::Graph g = part;
  std::vector<int> ps;
  for (std::size_t i = 0; i < param_names_.size(); ++i)
    if (const int v = g.find(param_names_[i]); v >= 0) ps.push_back(v), sg.params.push_back(i);
  std::vector<int> wrt = ps;
  for (const std::string& in : sg.ins) wrt.push_back(g.find(in));
  std::map<int, int> gr;
  if (last) {
    gr = graph::add_backward(g, g.find("loss"), wrt);
  } else {
    std::map<int, int> seeds;
    for (const std::string& out : sg.outs) {
      const graph::Value& y = g.value(g.find(out));
      sg.dys[out] = "grad_in." + out;
      seeds[g.find(out)] = g.input(sg.dys[out], y.shape, y.dtype);
    }
    gr = graph::add_backward(g, seeds, wrt);
  }
  for (const std::string& in : sg.ins) {
    const int dx = gr.at(g.find(in));
    g.mark_output(dx);
    sg.dxs[in] = g.value(dx).name;
  }
  add_accumulators(g, gr, ps);
  sg.bwd = b.compile(g);
  return sg;
}

void Trainer::build_stages(const BuildContext& b) {
  // The pipeline stages: cut from the forward pass at layer boundaries.
  for (std::int64_t st = 0; st < c_.pp; ++st) {
    const bool last = st == c_.pp - 1;
    const std::int64_t lo =
        runtime::block_first(c_.layers, static_cast<int>(c_.pp), static_cast<int>(st));
    const std::int64_t hi =
        runtime::block_first(c_.layers, static_cast<int>(c_.pp), static_cast<int>(st + 1));
    const std::string in = st > 0 ? layer_prefix(c_, lo - 1) + "out" : "";
    const std::string out = last ? "loss" : layer_prefix(c_, hi - 1) + "out";
    const std::vector<std::string> ins = in.empty() ? std::vector<std::string>{} : std::vector{in};
    Stage sg = make_piece(b, graph::extract(b.fwd, ins, {out}, fmt::format("stage{}", st)), ins,
                          {out}, -1);
    sg.in = in, sg.out = out;
    if (!last) sg.dy = sg.dys.at(out);
    if (!in.empty()) sg.dx = sg.dxs.at(in);
    stages_[static_cast<std::size_t>(st)] = std::move(sg);
  }
}

void Trainer::build_pieces(const BuildContext& b) {
  // Tensor parallel: replicated pieces cut from the forward pass between
  // the all-reduces, and each layer's attention and MLP shards.
  stages_.clear();
  graph::Gpt2Config gc;
  gc.layers = c_.layers, gc.dim = c_.dim, gc.heads = c_.heads, gc.vocab = tok_->vocab();
  gc.seq = c_.seq, gc.batch = c_.batch, gc.dtype = b.param_dtype;
  auto replicated = [&](std::vector<std::string> ins, std::vector<std::string> outs) {
    const std::string name = fmt::format("tp.piece{}", stages_.size());
    stages_.push_back(make_piece(b, graph::extract(b.fwd, ins, outs, name), ins, outs, -1));
  };
  // Sequence parallel: the piece cut from the model of seq / tp positions,
  // one a tp rank (the same programs).
  graph::Graph fwd_sp;
  if (c_.sp) {
    TrainConfig cs = c_;
    cs.seq = c_.seq / c_.tp;
    fwd_sp = make_model(cs, tok_->vocab()).graph;
    if (recipe_ != "fp32") fwd_sp = graph::autocast(fwd_sp, b.ao);
  }
  auto between = [&](std::vector<std::string> ins, std::vector<std::string> outs) {
    if (!c_.sp) return replicated(std::move(ins), std::move(outs));
    const std::string name = fmt::format("sp.piece{}", stages_.size());
    stages_.push_back(make_piece(b, graph::extract(fwd_sp, ins, outs, name), ins, outs, 0));
    stages_.back().sp = true;
    for (int t = 1; t < c_.tp; ++t) {
      Stage copy = stages_.back();
      copy.tp = t;
      stages_.push_back(std::move(copy));
    }
  };
  auto sharded = [&](std::int64_t l, bool attention) {
    const std::string p = layer_prefix(c_, l);
    graph::Graph sh = attention ? graph::gpt2_attention_shard(gc, l, static_cast<int>(c_.tp))
                                : graph::gpt2_mlp_shard(gc, l, static_cast<int>(c_.tp));
    if (recipe_ != "fp32") sh = graph::autocast(sh, b.ao);
    for (int t = 0; t < c_.tp; ++t)
      stages_.push_back(make_piece(b, sh, {p + (attention ? "ln_1" : "ln_2")},
                                   {p + (attention ? "attn.proj" : "mlp.proj")}, t));
  };
  std::vector<std::size_t> piece_stage;  // by piece
  auto mark = [&](std::int64_t l) {
    std::size_t st = 0;  // the pipeline stage of layer l
    while (runtime::block_first(c_.layers, static_cast<int>(c_.pp), static_cast<int>(st + 1)) <= l)
      ++st;
    while (piece_stage.size() < stages_.size()) piece_stage.push_back(st);
  };
  for (std::int64_t l = 0; l < c_.layers; ++l) {
    const std::string p = layer_prefix(c_, l);
    if (l == 0)
      replicated({}, {"embed", p + "ln_1"});
    else
      between({layer_prefix(c_, l - 1) + "mlp.proj", layer_prefix(c_, l - 1) + "resid_attn"},
              {layer_prefix(c_, l - 1) + "out", p + "ln_1"});
    sharded(l, true);
    between({p + "attn.proj", l == 0 ? "embed" : layer_prefix(c_, l - 1) + "out"},
            {p + "resid_attn", p + "ln_2"});
    sharded(l, false);
    mark(l);
  }
  const std::string p = layer_prefix(c_, c_.layers - 1);
  replicated({p + "mlp.proj", p + "resid_attn"}, {"loss"});
  mark(c_.layers - 1);
  // Each pipeline stage's pieces, and what crosses into it.
  for (std::size_t k = 0; k < stages_.size(); ++k) {
    auto& [lo, hi] = stage_pieces_[piece_stage[k]];
    if (hi == 0) lo = k, stage_inputs_[piece_stage[k]] = stages_[k].ins;
    hi = k + 1;
  }
}

void Trainer::partition_shards() {
  // The optimizer's shards: zero 1, dp of them (whole params in order, each
  // about 1 / dp of the elements); pp > 1, one per stage, run by the
  // stage's chips; else one of everything, run by every chip.
  shards_.clear();
  if (c_.tp > 1) {
    // Each tp rank of each pipeline stage updates its slices of the stage's
    // params and (redundantly, as Megatron does) the replicated ones.
    for (std::int64_t st = 0; st < c_.pp; ++st)
      for (std::int64_t t = 0; t < c_.tp; ++t) {
        Shard sh;
        sh.tp = static_cast<int>(t);
        const auto [lo, hi] = stage_pieces_[static_cast<std::size_t>(st)];
        std::set<std::size_t> ps;
        for (std::size_t k = lo; k < hi; ++k)
          if (stages_[k].tp < 0 || stages_[k].tp == t)
            ps.insert(stages_[k].params.begin(), stages_[k].params.end());
        sh.params.assign(ps.begin(), ps.end());
        for (std::size_t i : sh.params)
          sh.elements += sliced(i) ? acc_sizes_[i] / c_.tp : acc_sizes_[i];
        for (std::int64_t r = 0; r < c_.dp; ++r) sh.chips.push_back(chip_of(r, st, t));
        shards_.push_back(std::move(sh));
      }
  } else if (c_.pp > 1) {
    for (std::int64_t st = 0; st < c_.pp; ++st) {
      Shard sh;
      sh.params = stages_[static_cast<std::size_t>(st)].params;
      for (std::size_t i : sh.params) sh.elements += acc_sizes_[i];
      for (std::int64_t r = 0; r < c_.dp; ++r) sh.chips.push_back(chip_of(r, st));
      shards_.push_back(std::move(sh));
    }
  } else if (c_.zero == 0) {
    Shard sh;
    sh.params = stages_[0].params;
    sh.elements = params_;
    sh.chips.resize(static_cast<std::size_t>(c_.dp * c_.pp * c_.tp));
    std::iota(sh.chips.begin(), sh.chips.end(), 0);
    shards_.push_back(std::move(sh));
  } else {
    zero_shards();
  }
}

void Trainer::zero_shards() {
  const std::int64_t nshards = c_.dp;
  const std::size_t n = param_names_.size();
  if (nshards > static_cast<std::int64_t>(n))
    throw Error(fmt::format("not supported: zero 1 over {} replicas with only {} param tensors",
                            nshards, n));
  shards_.resize(static_cast<std::size_t>(nshards));
  // Param i goes to the next shard once the elements before it reach that
  // shard's share (nshards x done / total), or when the params left are
  // only just enough to give every later shard one.
  std::int64_t c = 0, done = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto left = static_cast<std::int64_t>(n - i);
    const std::int64_t want = nshards * done / params_;
    if (c + 1 < nshards && !shards_[static_cast<std::size_t>(c)].params.empty() &&
        (want > c || left <= nshards - 1 - c))
      ++c;
    Shard& sh = shards_[static_cast<std::size_t>(c)];
    sh.params.push_back(i);
    sh.elements += acc_sizes_[i];
    done += acc_sizes_[i];
  }
  for (std::size_t k = 0; k < shards_.size(); ++k) shards_[k].chips = {static_cast<int>(k)};
}

void Trainer::build_shard_programs(const BuildContext& b) {
  master_of_.clear(), moment_names_.clear();
  for (std::size_t k = 0; k < shards_.size(); ++k) {
    Shard& sh = shards_[k];
    auto shape_in = [&](std::size_t i) {  // a tp rank holds its slice
      graph::Shape s = param_shapes_[i];
      if (sh.tp >= 0 && sliced(i)) (row_split(param_names_[i]) ? s.front() : s.back()) /= c_.tp;
      return s;
    };
    // update: AdamW over the shard's accumulated gradients.
    graph::Graph u(shards_.size() > 1 ? fmt::format("update.{}", k) : "update");
    std::map<int, int> ug;
    for (std::size_t i : sh.params) {
      const int up = u.param(param_names_[i], shape_in(i), param_dtypes_[i]);
      ug[up] = u.input(acc_names_[i], shape_in(i), isa::DType::fp32);
    }
    graph::AdamWConfig ac;
    ac.beta1 = c_.beta1, ac.beta2 = c_.beta2, ac.no_decay_group = true;
    const graph::OptimizerInputs oi = graph::add_adamw(u, ug, ac);
    sh.state.clear();
    for (const auto& [master, p] : oi.master) master_of_[master] = p, sh.state.push_back(master);
    for (const std::string& z : oi.zeros) {
      sh.state.push_back(z);
      if (std::find(moment_names_.begin(), moment_names_.end(), z) == moment_names_.end())
        moment_names_.push_back(z);  // a tied param's moments are in two stages' shards
    }
    sh.update = b.compile(u);
    sh.norm.reset();
    if (!one_chip()) {
      // The norm of the reduced gradients, on every chip (zero 1, pp > 1:
      // of its shard): the sums of squares the grad program computes for a
      // single chip.
      graph::Graph ng(fmt::format("grad_norm.{}", k));
      for (std::size_t i : sh.params) {
        const int x = ng.input(acc_names_[i], shape_in(i), isa::DType::fp32);
        const int sq = ng.sum(ng.mul(x, x), {});
        ng.rename(sq, sumsq_names_[i]);
        ng.mark_output(sq);
      }
      sh.norm = b.compile(ng);
    }
    sh.session.reset(), sh.norm_session.reset();
    if (local_shard(sh)) {
      sh.session = std::make_unique<runtime::Session>(b.chip, sh.update);
      if (sh.norm) sh.norm_session = std::make_unique<runtime::Session>(b.chip, sh.norm);
    }
  }
}

bool Trainer::sliced(std::size_t i) const {
  return c_.tp > 1 && tp_split(param_names_[i]);
}

std::vector<float> Trainer::slice(std::size_t i, int t, const std::vector<float>& full) const {
  const graph::Shape& sh = param_shapes_[i];
  const auto T = c_.tp;
  std::vector<float> out;
  if (row_split(param_names_[i])) {
    const std::int64_t cols = sh.back(), rows = sh.front() / T;
    const auto b = full.begin() + static_cast<std::ptrdiff_t>(t * rows * cols);
    out.assign(b, b + static_cast<std::ptrdiff_t>(rows * cols));
    return out;
  }
  const std::int64_t cols = sh.back(), rows = graph::elements(sh) / cols;
  const std::int64_t g = column_groups(param_names_[i]), w = cols / g / T;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t k = 0; k < g; ++k) {
      const auto b = full.begin() + static_cast<std::ptrdiff_t>(r * cols + k * (cols / g) + t * w);
      out.insert(out.end(), b, b + static_cast<std::ptrdiff_t>(w));
    }
  return out;
}

std::vector<float> Trainer::assemble(std::size_t i,
                                     const std::vector<std::vector<float>>& parts) const {
  const graph::Shape& sh = param_shapes_[i];
  const auto T = c_.tp;
  std::vector<float> full(static_cast<std::size_t>(graph::elements(sh)));
  if (row_split(param_names_[i])) {
    for (std::int64_t t = 0; t < T; ++t)
      std::copy(parts[static_cast<std::size_t>(t)].begin(),
                parts[static_cast<std::size_t>(t)].end(),
                full.begin() + static_cast<std::ptrdiff_t>(t * (graph::elements(sh) / T)));
    return full;
  }
  const std::int64_t cols = sh.back(), rows = graph::elements(sh) / cols;
  const std::int64_t g = column_groups(param_names_[i]), w = cols / g / T;
  for (std::int64_t t = 0; t < T; ++t) {
    const std::vector<float>& p = parts[static_cast<std::size_t>(t)];
    std::size_t at = 0;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t k = 0; k < g; ++k, at += static_cast<std::size_t>(w))
        std::copy(p.begin() + static_cast<std::ptrdiff_t>(at),
                  p.begin() + static_cast<std::ptrdiff_t>(at) + static_cast<std::ptrdiff_t>(w),
                  full.begin() + static_cast<std::ptrdiff_t>(r * cols + k * (cols / g) + t * w));
  }
  return full;
}

std::vector<float> Trainer::rounded(std::size_t i, const std::vector<float>& values) const {
  if (static_cast<std::int64_t>(values.size()) != graph::elements(param_shapes_[i]))
    throw Error(fmt::format("param {} has {} elements, got {}", param_names_[i],
                            graph::elements(param_shapes_[i]), values.size()));
  std::vector<float> out(values.size());
  const num::Format& f = *isa::format_of(param_dtypes_[i]);
  for (std::size_t k = 0; k < values.size(); ++k) out[k] = num::round_to(f, values[k]);
  return out;
}

}  // namespace tern::train
