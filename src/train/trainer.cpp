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
#include "lower/lower.h"
#include "graph/models.h"
#include "graph/optimizer.h"
#include "graph/partition.h"
#include "isa/dtype.h"
#include "num/convert.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/system.h"
#include "train/checkpoint.h"
#include "train/shard.h"
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

namespace {
// The text file to train on: as given (relative to the working directory),
// except the built-in default's corpus, which is found in tern's data
// directory when the working directory has no data/ of its own.
std::filesystem::path corpus_path(const std::string& text) {
  const std::filesystem::path given(text);
  if (text == TrainConfig{}.text && !std::filesystem::exists(given))
    return arch::data_dir() / given.filename();
  return given;
}
}  // namespace

namespace {

std::int64_t llama_ffn(const TrainConfig& c) {
  if (c.ffn > 0) return c.ffn;
  const std::int64_t f = (8 * c.dim + 2) / 3;  // 8/3 dim, as Llama's SwiGLU
  return (f + 63) / 64 * 64;
}

graph::Model make_model(const TrainConfig& c, int vocab) {
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

std::string layer_prefix(const TrainConfig& c, std::int64_t layer) {
  return fmt::format("{}{}.", c.model == "llama" ? "layers." : "h.", layer);
}

// The layer a param belongs to, or -1 (embeddings, final norm, head).
std::int64_t layer_of(const TrainConfig& c, const std::string& name) {
  for (std::int64_t l = 0; l < c.layers; ++l)
    if (name.starts_with(layer_prefix(c, l))) return l;
  return -1;
}

// Norm weights start at 1 (LayerNorm / RMSNorm gains), other vectors
// (biases) at 0, matrices normal(0, init_std).
bool is_norm_weight(const std::string& name) {
  return (name.find("ln_") != std::string::npos && name.ends_with(".w")) || name.ends_with("norm");
}

// Independent streams for stochastic rounding: (seed, step, micro-batch).
std::uint64_t stream_seed(std::uint64_t seed, std::int64_t step, std::int64_t micro) {
  return seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(step) * 1000003ull +
         static_cast<std::uint64_t>(micro);
}

// An injected device fault: what a retry handles.
struct InjectedFault : Error {
  using Error::Error;
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

namespace {

// The system whose fabric joins a dp-chip run: c.system, or the smallest
// system of c.arch's chip that holds them.
arch::SystemSpec system_for(const TrainConfig& c) {
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

}  // namespace

namespace {

// Megatron's split of a GPT-2 layer: c_attn (q | k | v, each by heads) and
// c_fc by columns, the projections after them by rows.
bool row_split(const std::string& n) {
  return n.ends_with("attn.c_proj.w") || n.ends_with("mlp.c_proj.w");
}
bool tp_split(const std::string& n) {
  return row_split(n) || n.ends_with("attn.c_attn.w") || n.ends_with("attn.c_attn.b") ||
         n.ends_with("mlp.c_fc.w") || n.ends_with("mlp.c_fc.b");
}
std::int64_t column_groups(const std::string& n) {
  return n.find("attn.c_attn.") != std::string::npos ? 3 : 1;  // q, k, v
}

}  // namespace

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

void Trainer::build() {
  const graph::Model m = make_model(c_, tok_->vocab());
  param_names_.clear();
  for (int p : m.params) param_names_.push_back(m.graph.value(p).name);
  graph::Graph fwd = m.graph;
  if (recipe_ != "fp32") {
    graph::AutocastOptions ao = graph::recipe(recipe_, c_.mx_policy);
    for (std::int64_t l : bf16_layers_) ao.keep_high.push_back(layer_prefix(c_, l));
    fwd = graph::autocast(m.graph, ao);
  }
  const arch::ChipSpec chip = arch::load_chip(c_.arch);
  graph::CompileOptions o;
  o.cores = c_.cores;

  // Adds to a grad graph the FP32 accumulators of `ps` (value ids): each
  // gradient is added into "<param>.grad_acc", carried to the next step.
  // Each accumulation is scheduled as soon as its gradient exists (not
  // after the whole backward), so the gradients become final in the order
  // the backward computes them: data parallelism's buckets overlap the rest.
  auto accumulate = [](graph::Graph& g, const std::map<int, int>& grads,
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
  };

  // grad: forward + backward, gradients summed into FP32 accumulators.
  graph::Graph g = fwd;
  std::vector<int> params;
  for (const std::string& n : param_names_) params.push_back(g.find(n));
  const auto grads = graph::add_backward(g, g.find("loss"), params);
  acc_names_.clear(), sumsq_names_.clear(), acc_sizes_.clear();
  params_ = 0;
  accumulate(g, grads, params);
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
  const bool one_chip = c_.dp == 1 && c_.pp == 1 && c_.tp == 1;
  if (one_chip)
    for (std::size_t i = 0; i < acc_names_.size(); ++i) {
      const int next = g.find(param_names_[i] + ".grad_acc.next");
      const int sq = g.sum(g.mul(next, next), {});
      g.rename(sq, sumsq_names_[i]);
      g.mark_output(sq);
    }
  grad_graph_ = std::make_unique<graph::Graph>(g);
  grad_exe_ = std::make_shared<const graph::Executable>(graph::compile(g, chip, o));

  boundary_dtype_.clear(), boundary_elements_.clear();
  for (const graph::Value& v : fwd.values())
    boundary_dtype_[v.name] = v.dtype, boundary_elements_[v.name] = graph::elements(v.shape);
  auto stage_of_layer = [this](std::int64_t l) {
    std::int64_t st = 0;
    while (runtime::block_first(c_.layers, static_cast<int>(c_.pp), static_cast<int>(st + 1)) <= l)
      ++st;
    return static_cast<std::size_t>(st);
  };
  stage_pieces_.assign(static_cast<std::size_t>(c_.pp), {0, 0});
  stage_inputs_.assign(static_cast<std::size_t>(c_.pp), {});

  // The pipeline stages: cut from the forward pass at layer boundaries.
  stages_.assign(static_cast<std::size_t>(c_.pp), Stage{});
  stage_of_.assign(param_names_.size(), 0);
  if (c_.tp > 1) {
    // Tensor parallel: replicated pieces cut from the forward pass between
    // the all-reduces, and each layer's attention and MLP shards.
    stages_.clear();
    graph::Gpt2Config gc;
    gc.layers = c_.layers, gc.dim = c_.dim, gc.heads = c_.heads, gc.vocab = tok_->vocab();
    gc.seq = c_.seq, gc.batch = c_.batch;
    gc.dtype = m.graph.value(m.params.front()).dtype;
    graph::AutocastOptions ao;
    if (recipe_ != "fp32") {
      ao = graph::recipe(recipe_, c_.mx_policy);
      for (std::int64_t l : bf16_layers_) ao.keep_high.push_back(layer_prefix(c_, l));
    }
    auto piece = [&](graph::Graph part, std::vector<std::string> ins, std::vector<std::string> outs,
                     int rank) {
      Stage sg;
      sg.tp = rank, sg.ins = std::move(ins), sg.outs = std::move(outs);
      const bool last = sg.outs == std::vector<std::string>{"loss"};
      if (!last) sg.fwd = std::make_shared<const graph::Executable>(graph::compile(part, chip, o));
      graph::Graph b = part;
      std::vector<int> ps;
      for (std::size_t i = 0; i < param_names_.size(); ++i)
        if (const int v = b.find(param_names_[i]); v >= 0) ps.push_back(v), sg.params.push_back(i);
      std::vector<int> wrt = ps;
      for (const std::string& in : sg.ins) wrt.push_back(b.find(in));
      std::map<int, int> gr;
      if (last) {
        gr = graph::add_backward(b, b.find("loss"), wrt);
      } else {
        std::map<int, int> seeds;
        for (const std::string& out : sg.outs) {
          const graph::Value& y = b.value(b.find(out));
          sg.dys[out] = "grad_in." + out;
          seeds[b.find(out)] = b.input(sg.dys[out], y.shape, y.dtype);
        }
        gr = graph::add_backward(b, seeds, wrt);
      }
      for (const std::string& in : sg.ins) {
        const int dx = gr.at(b.find(in));
        b.mark_output(dx);
        sg.dxs[in] = b.value(dx).name;
      }
      accumulate(b, gr, ps);
      sg.bwd = std::make_shared<const graph::Executable>(graph::compile(b, chip, o));
      stages_.push_back(std::move(sg));
    };
    auto replicated = [&](std::vector<std::string> ins, std::vector<std::string> outs) {
      piece(graph::extract(fwd, ins, outs, fmt::format("tp.piece{}", stages_.size())), ins, outs,
            -1);
    };
    // Sequence parallel: the piece cut from the model of seq / tp positions,
    // one a tp rank (the same programs).
    graph::Graph fwd_sp;
    if (c_.sp) {
      TrainConfig cs = c_;
      cs.seq = c_.seq / c_.tp;
      fwd_sp = make_model(cs, tok_->vocab()).graph;
      if (recipe_ != "fp32") fwd_sp = graph::autocast(fwd_sp, ao);
    }
    auto between = [&](std::vector<std::string> ins, std::vector<std::string> outs) {
      if (!c_.sp) return replicated(std::move(ins), std::move(outs));
      piece(graph::extract(fwd_sp, ins, outs, fmt::format("sp.piece{}", stages_.size())), ins, outs,
            0);
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
      if (recipe_ != "fp32") sh = graph::autocast(sh, ao);
      for (int t = 0; t < c_.tp; ++t)
        piece(sh, {p + (attention ? "ln_1" : "ln_2")}, {p + (attention ? "attn.proj" : "mlp.proj")},
              t);
    };
    std::vector<std::size_t> piece_stage;  // by piece
    auto mark = [&](std::int64_t l) {
      while (piece_stage.size() < stages_.size()) piece_stage.push_back(stage_of_layer(l));
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
  } else if (c_.pp == 1) {
    stages_[0].out = "loss";
    stages_[0].bwd = grad_exe_;
    for (std::size_t i = 0; i < param_names_.size(); ++i) stages_[0].params.push_back(i);
  }
  for (std::int64_t st = 0; c_.tp == 1 && c_.pp > 1 && st < c_.pp; ++st) {
    Stage& sg = stages_[static_cast<std::size_t>(st)];
    const bool last = st == c_.pp - 1;
    const std::int64_t lo =
        runtime::block_first(c_.layers, static_cast<int>(c_.pp), static_cast<int>(st));
    const std::int64_t hi =
        runtime::block_first(c_.layers, static_cast<int>(c_.pp), static_cast<int>(st + 1));
    if (st > 0) sg.in = layer_prefix(c_, lo - 1) + "out";
    sg.out = last ? "loss" : layer_prefix(c_, hi - 1) + "out";
    const graph::Graph part =
        graph::extract(fwd, sg.in.empty() ? std::vector<std::string>{} : std::vector{sg.in},
                       {sg.out}, fmt::format("stage{}", st));
    if (!last) sg.fwd = std::make_shared<const graph::Executable>(graph::compile(part, chip, o));
    graph::Graph b = part;
    std::vector<int> ps;
    for (std::size_t i = 0; i < param_names_.size(); ++i)
      if (const int v = b.find(param_names_[i]); v >= 0) {
        ps.push_back(v);
        sg.params.push_back(i);
      }
    std::vector<int> wrt = ps;
    if (!sg.in.empty()) wrt.push_back(b.find(sg.in));
    std::map<int, int> gr;
    if (last) {
      gr = graph::add_backward(b, b.find("loss"), wrt);
    } else {
      const graph::Value& y = b.value(b.find(sg.out));
      sg.dy = "grad_in." + sg.out;
      const int dy = b.input(sg.dy, y.shape, y.dtype);
      gr = graph::add_backward(b, {{b.find(sg.out), dy}}, wrt);
    }
    if (!sg.in.empty()) {
      const int dx = gr.at(b.find(sg.in));
      b.mark_output(dx);
      sg.dx = b.value(dx).name;
    }
    accumulate(b, gr, ps);
    sg.bwd = std::make_shared<const graph::Executable>(graph::compile(b, chip, o));
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
      rep.fwd.push_back(sg.fwd ? std::make_unique<runtime::Session>(chip, sg.fwd) : nullptr);
      rep.bwd.push_back(std::make_unique<runtime::Session>(chip, sg.bwd));
    }
    replicas_.push_back(std::move(rep));
  }
  // The optimizer's shards: zero 1, dp of them (whole params in order, each
  // about 1 / dp of the elements); pp > 1, one per stage, run by the
  // stage's chips; else one of everything, run by every chip.
  shards_.clear();
  std::vector<int> all_chips(static_cast<std::size_t>(c_.dp * c_.pp * c_.tp));
  std::iota(all_chips.begin(), all_chips.end(), 0);
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
    sh.chips = all_chips;
    shards_.push_back(std::move(sh));
  } else {
    const std::int64_t nshards = c_.dp;
    if (nshards > static_cast<std::int64_t>(params.size()))
      throw Error(fmt::format("not supported: zero 1 over {} replicas with only {} param tensors",
                              nshards, params.size()));
    shards_.resize(static_cast<std::size_t>(nshards));
    // Param i goes to the next shard once the elements before it reach that
    // shard's share (nshards x done / total), or when the params left are
    // only just enough to give every later shard one.
    std::int64_t c = 0, done = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto left = static_cast<std::int64_t>(params.size() - i);
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
  master_of_.clear(), moment_names_.clear();
  for (std::size_t k = 0; k < shards_.size(); ++k) {
    Shard& sh = shards_[k];
    // update: AdamW over the shard's accumulated gradients.
    graph::Graph u(shards_.size() > 1 ? fmt::format("update.{}", k) : "update");
    std::map<int, int> ug;
    auto shape_in = [&](std::size_t i) {  // a tp rank holds its slice
      graph::Shape sh_ = param_shapes_[i];
      if (sh.tp >= 0 && sliced(i)) (row_split(param_names_[i]) ? sh_.front() : sh_.back()) /= c_.tp;
      return sh_;
    };
    for (std::size_t i : sh.params) {
      const graph::Value& pv = g.value(params[i]);
      const int up = u.param(pv.name, shape_in(i), pv.dtype);
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
    sh.update = std::make_shared<const graph::Executable>(graph::compile(u, chip, o));
    if (!one_chip) {
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
      sh.norm = std::make_shared<const graph::Executable>(graph::compile(ng, chip, o));
    }
    sh.session.reset(), sh.norm_session.reset();
    if (local_shard(sh)) {
      sh.session = std::make_unique<runtime::Session>(chip, sh.update);
      if (sh.norm) sh.norm_session = std::make_unique<runtime::Session>(chip, sh.norm);
    }
  }

  // eval: the forward pass alone, for validation and sampling.
  eval_exe_ = std::make_shared<const graph::Executable>(graph::compile(fwd, chip, o));
  eval_ = std::make_unique<runtime::Session>(chip, eval_exe_);
  logits_.reset();
  zero_accumulators();
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
  for (const Fault& f : c_.faults)
    if (f.kind == Fault::Kind::fail && f.step == s && fails_done_[s] < f.count) {
      ++fails_done_[s];
      throw InjectedFault(fmt::format("injected device fault {} of {}", fails_done_[s], f.count));
    }
  // The batches: a step whose batches were found bad (rollback) draws them
  // and takes the next ones instead. dp replicas take accum each, replica r
  // the r-th block, in the loader's order.
  const std::int64_t micro = c_.accum * c_.dp;
  train_->restore(start);
  if (skip_batches_.contains(s))
    for (std::int64_t i = 0; i < micro; ++i) train_->next();
  std::vector<Batch> batches;
  for (std::int64_t i = 0; i < micro; ++i)
    batches.push_back(given_ ? (*given_)[static_cast<std::size_t>(i)] : train_->next());
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
  if (c_.monitor_every > 0 && s % c_.monitor_every == 0) monitor(batches[0], m);
  double loss = 0;
  const runtime::StepResult r = run_replicas(s, batches, m, loss);
  m.loss = loss / static_cast<double>(micro);
  double sumsq = 0;
  for (const std::string& n : sumsq_names_) sumsq += r.outputs.at(n)[0];
  // The accumulators hold the sum of accum x dp micro-batch means.
  m.grad_norm = std::sqrt(sumsq) / static_cast<double>(micro);

  // Numeric health: a non-finite sum (a NaN or Inf element, or squares
  // past FP32's range) sends the host to the accumulators: it counts the
  // non-finite elements by layer and sums the squares again in double.
  std::map<std::int64_t, std::int64_t> bad_by_layer;
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
    m.grad_norm = std::sqrt(sumsq) / static_cast<double>(micro);
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
  if (bad) {
    const std::string why = fmt::format(
        "step {}: {} non-finite gradient elements ({:.2e} of {}), loss {}", s, m.nonfinite,
        static_cast<double>(m.nonfinite) / static_cast<double>(params_), params_, m.loss);
    zero_accumulators();
    std::string policy = c_.nan_policy;
    // The offending layer: the last one with bad gradients (a fault in
    // layer L's backward reaches the layers below it, not above); a bad
    // loss points at the forward pass: no single layer.
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
      return m;
    }
    if (policy == "rollback") {
      if (skip_batches_.contains(s))  // the batch was skipped already: not the batch's fault
        throw Error(why +
                    "; again after a rollback that skipped the step's batch (nan_policy "
                    "rollback cannot help: try fallback-global or a lower lr)");
      std::vector<std::string> notes;
      auto good = latest_good(c_.ckpt_dir, notes, step_);
      if (!good)
        throw Error(why + fmt::format("; no checkpoint in {} to roll back to", c_.ckpt_dir));
      skip_batches_.insert(s);
      restore_checkpoint(good->second);
      m.actions.insert(m.actions.end(), notes.begin(), notes.end());
      m.actions.push_back(why + fmt::format("; rolled back to {} (step {}), the batch skipped",
                                            good->first.string(), step_));
      m.updated = false;
      return m;
    }
    m.updated = false;
    step_ = s;
    return m;
  }

  // Spikes: the norm's z-score against the last spike_window steps.
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

  // Clipping (torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6),
  // at most 1) and the mean over micro-batches, folded into the scalars.
  if (c_.clip > 0 && m.grad_norm > c_.clip) m.clip_scale = c_.clip / (m.grad_norm + 1e-6);
  const double g = m.clip_scale / static_cast<double>(micro);
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
      for (float& e : x)
        e = static_cast<float>(static_cast<double>(e) / static_cast<double>(micro));
      grads_[param_names_[i]] = std::move(x);
    }
  }
  m.sim_ns += run_update(k, m);
  zero_accumulators();
  push_weights();
  step_ = s;
  return m;
}

namespace {

void put(std::vector<std::uint8_t>& out, const void* p, std::size_t n) {
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

}  // namespace

namespace {

// The program's share of a batch's inputs (a stage reads some of them).
std::map<std::string, std::vector<float>> inputs_of(
    const graph::Executable& e, const std::map<std::string, std::vector<float>>& all) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [k, v] : all)
    if (e.graph.find(k) >= 0) out[k] = v;
  return out;
}

num::FormatId system_format(isa::DType d) {
  return d == isa::DType::fp32   ? num::FormatId::fp32
         : d == isa::DType::fp16 ? num::FormatId::fp16
                                 : num::FormatId::bf16;
}

}  // namespace

runtime::StepResult Trainer::run_replicas(std::int64_t s, const std::vector<Batch>& batches,
                                          StepMetrics& m, double& loss) {
  const std::size_t n = replicas_.size(), P = stages_.size();
  const auto A = static_cast<std::size_t>(c_.accum);
  struct Ran {
    std::vector<double> losses;             // per micro-batch
    std::vector<std::vector<double>> f, b;  // [stage][micro-batch] program times
    runtime::StepResult last;
    std::exception_ptr error;
  };
  std::vector<Ran> ran(n);
  // One replica's micro-batches through its stages: forward stage by stage
  // (each stage's output is the next one's input), then the last stage's
  // backward (its forward and the loss with it) and each earlier stage's
  // from the gradient of its output. Every stage of micro-batch j rounds
  // with the streams of (seed, step, j), salted by the stage.
  auto run = [&](std::size_t k) {
    try {
      Ran& out = ran[k];
      Replica& rep = replicas_[k];
      out.f.assign(P, {}), out.b.assign(P, {});
      const std::int64_t r = first_ + static_cast<std::int64_t>(k);
      for (std::size_t i = 0; i < A; ++i) {
        const std::int64_t j = r * c_.accum + static_cast<std::int64_t>(i);
        const auto all = model_inputs(batches[static_cast<std::size_t>(j)]);
        auto opts = [&](std::size_t st) {
          return runtime::StepOptions{c_.stochastic_rounding,
                                      stream_seed(c_.seed, s, j) + st * 0x632be59bd9b4e019ull};
        };
        if (c_.tp > 1) {
          tensor_parallel_micro_batch(rep, all, opts, out.f, out.b, out.losses);
          continue;
        }
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
    } catch (...) {
      ran[k].error = std::current_exception();
    }
  };
  // Replicas are independent until the reduction: host threads take them
  // in turn (each has its own Sessions; results do not depend on the count).
  const std::size_t threads =
      std::min<std::size_t>(n, c_.threads > 0 ? static_cast<std::size_t>(c_.threads)
                                              : std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) {
    for (std::size_t k = 0; k < n; ++k) run(k);
  } else {
    std::atomic<std::size_t> next{0};
    std::vector<std::thread> pool;
    for (std::size_t t = 0; t < threads; ++t)
      pool.emplace_back([&] {
        for (std::size_t k; (k = next++) < n;) run(k);
      });
    for (std::thread& t : pool) t.join();
  }
  for (const Ran& x : ran)
    if (x.error) std::rethrow_exception(x.error);
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
      c_.dp > 1 && P == 1 && c_.tp == 1 && c_.zero == 0 && c_.bucket_mb > 0 && A > 0;
  std::vector<double> ready(param_names_.size(), -1.0);  // ns into the last program
  if (overlap) {
    const graph::Executable& ex = *stages_[0].bwd;
    std::map<std::string, std::size_t> of;
    for (std::size_t i = 0; i < param_names_.size(); ++i) of[acc_names_[i] + ".next"] = i;
    const auto& ev = ran[0].last.events;
    for (std::size_t j = 0; j < ev.size() && j < ex.launches.size(); ++j)
      for (const graph::Binding& o : ex.launches[j].outputs)
        if (o.value >= 0)
          if (auto it = of.find(ex.graph.value(o.value).name); it != of.end())
            ready[it->second] = std::max(ready[it->second], ev[j].start_ns + ev[j].ns);
    // A gradient no launch is seen writing is taken as final at the end.
    for (double& t : ready)
      if (t < 0) t = ran[0].b[0].back();
  }

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
  // accs[r][st][p]: replica r's accumulator of stage st's p-th param.
  std::vector<std::vector<std::vector<std::vector<float>>>> accs(static_cast<std::size_t>(c_.dp));
  const Nanoseconds t0 = max_clock();
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
      if (P == 1) {
        double ns = 0;
        for (double t : b[0]) ns += t;
        // Overlapped: the last micro-batch's program is advanced bucket by
        // bucket below.
        if (overlap) ns -= b[0].back();
        if (ns > 0) system_->advance(chip_of(r, 0), Nanoseconds(ns), "grad");
      } else {
        // Send/recv on the collective engines: in comm, not exposed (a
        // stage waiting for its input shows as the pipeline's bubble); the
        // tp all-reduces block: exposed.
        double p2p = 0, reduces = 0;
        pipeline_timeline(r, f, b, p2p, reduces);
        if (r == 0) m.comm_ns += p2p + reduces, m.exposed_comm_ns += reduces;
      }
    }
  }
  for (double l : losses) loss += l;  // in global micro-batch order, as one chip would
  std::vector<int> dp_group;
  auto collective = [&](auto&& go) {
    go();
    const double d = system_->events().back().duration.value();
    m.comm_ns += d;
    m.exposed_comm_ns += d;  // nothing overlaps it: it follows the backward pass
  };
  // Collectives of one kind on disjoint chips (per stage, per tp rank) run
  // side by side: the step waits for the longest.
  double side = 0;
  auto beside = [&](auto&& go) {
    go();
    side = std::max(side, system_->events().back().duration.value());
  };
  auto end_beside = [&] {
    m.comm_ns += side, m.exposed_comm_ns += side;
    side = 0;
  };
  auto position = [&](std::size_t st, std::size_t i) {  // param i among stage st's
    const auto& ps = stages_[st].params;
    return static_cast<std::size_t>(std::find(ps.begin(), ps.end(), i) - ps.begin());
  };
  // ... a param in two stages (GPT-2's tied embedding, pp > 1): its two
  // gradients all-reduced between the first and the last stage's chips ...
  std::vector<std::size_t> tied;
  if (P > 1 && c_.tp == 1)
    for (std::size_t i : stages_.back().params)
      if (stage_of_[i] != P - 1) tied.push_back(i);
  if (!tied.empty()) {
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
    collective([&] { system_->all_reduce("tied", groups); });
    for (std::int64_t r = 0; r < c_.dp; ++r) {
      const std::vector<float> sum = system_->read(chip_of(r, 0), "tied");
      std::size_t at = 0;
      for (std::size_t i : tied) {
        const auto e = static_cast<std::size_t>(acc_sizes_[i]);
        std::vector<float> x(sum.begin() + static_cast<std::ptrdiff_t>(at),
                             sum.begin() + static_cast<std::ptrdiff_t>(at + e));
        at += e;
        accs[static_cast<std::size_t>(r)][P - 1][position(P - 1, i)] = x;
        accs[static_cast<std::size_t>(r)][0][position(0, i)] = std::move(x);
      }
    }
  }
  // ... and the data-parallel reduction on the simulated chips: FP32, in
  // replica order, one bucket of every gradient of a stage (runtime::
  // System): an all-reduce, or (zero 1) a reduce-scatter that leaves each
  // replica its shard, the bucket laid out shard by shard, each padded to
  // the largest.
  if (c_.tp > 1) {
    // Each replica's whole accumulators: its ranks' slices side by side,
    // a replicated param's pieces summed (FP32, in order: the tied
    // embedding's two uses) ...
    std::vector<std::vector<std::vector<float>>> full(static_cast<std::size_t>(c_.dp));
    for (std::int64_t r = 0; r < c_.dp; ++r) {
      auto& fr = full[static_cast<std::size_t>(r)];
      fr.resize(param_names_.size());
      std::vector<std::vector<std::vector<float>>> parts(param_names_.size());
      for (std::size_t st = 0; st < P; ++st)
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
    }
    // A param on two stages (the tied embedding, pp > 1): its two
    // gradients all-reduced between the first and the last stage's chips
    // (summed above; here timed).
    if (c_.pp > 1) {
      std::int64_t tied_n = 0;
      for (std::size_t i = 0; i < param_names_.size(); ++i)
        if (stage_of_[i] == stage_pieces_[0].first)
          for (std::size_t k = stage_pieces_.back().first; k < stage_pieces_.back().second; ++k)
            if (std::find(stages_[k].params.begin(), stages_[k].params.end(), i) !=
                stages_[k].params.end()) {
              tied_n += acc_sizes_[i];
              break;
            }
      if (tied_n > 0) {
        std::vector<std::vector<int>> groups;
        const std::vector<float> buf(static_cast<std::size_t>(tied_n), 0.0f);
        for (std::int64_t r = 0; r < c_.dp; ++r)
          for (std::int64_t t = 0; t < c_.tp; ++t) {
            groups.push_back({chip_of(r, 0, t), chip_of(r, c_.pp - 1, t)});
            for (int ch : groups.back()) system_->write(ch, "tied", buf);
          }
        collective([&] { system_->all_reduce("tied", groups); });
      }
    }
    // ... then the data-parallel all-reduce of each optimizer shard's
    // bucket (a tp rank's slices of a stage's params and the replicated
    // ones) over its replicas.
    std::map<std::size_t, std::vector<std::vector<float>>> slices;
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
        beside([&] { system_->all_reduce(name, {sh.chips}); });
        sum = system_->read(sh.chips.front(), name);
      }
      std::size_t at = 0;
      for (std::size_t i : sh.params) {
        const auto e = static_cast<std::size_t>(sliced(i) ? acc_sizes_[i] / c_.tp : acc_sizes_[i]);
        std::vector<float> x(sum.begin() + static_cast<std::ptrdiff_t>(at),
                             sum.begin() + static_cast<std::ptrdiff_t>(at + e));
        at += e;
        if (sliced(i)) {
          slices[i].resize(static_cast<std::size_t>(c_.tp));
          slices[i][static_cast<std::size_t>(sh.tp)] = std::move(x);
        } else if (!reduced_.contains(acc_names_[i])) {
          reduced_[acc_names_[i]] = std::move(x);
        }
      }
    }
    end_beside();
    for (auto& [i, parts] : slices) reduced_[acc_names_[i]] = assemble(i, parts);
  } else if (c_.zero == 1) {
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
    collective([&] { system_->reduce_scatter("grads", "grad_shard", {group}); });
    for (std::size_t k = 0; k < shards_.size(); ++k) {
      const std::vector<float> x = system_->read(shards_[k].chips.front(), "grad_shard");
      std::size_t at = 0;
      for (std::size_t i : shards_[k].params) {
        const auto e = static_cast<std::size_t>(acc_sizes_[i]);
        reduced_[acc_names_[i]].assign(x.begin() + static_cast<std::ptrdiff_t>(at),
                                       x.begin() + static_cast<std::ptrdiff_t>(at + e));
        at += e;
      }
    }
  } else if (overlap) {
    // Buckets in the order their gradients become final, each closed at
    // bucket_mb MiB of FP32 (a larger param is a bucket of its own).
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
    const double program = ran[0].b[0].back();
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
      m.comm_ns += system_->events().back().duration.value();
    }
    for (std::int64_t r = 0; r < c_.dp; ++r)
      if (program > done) system_->advance(chip_of(r, 0), Nanoseconds(program - done), "grad");
    const Nanoseconds computed = max_clock();
    for (runtime::Handle h : handles) system_->wait(h);
    m.exposed_comm_ns += (max_clock() - computed).value();
    for (std::size_t k = 0; k < buckets.size(); ++k) {
      const std::vector<float> sum = system_->read(group.front(), fmt::format("grads.{}", k));
      std::size_t at = 0;
      for (std::size_t i : buckets[k]) {
        const auto e = static_cast<std::size_t>(acc_sizes_[i]);
        reduced_[acc_names_[i]].assign(sum.begin() + static_cast<std::ptrdiff_t>(at),
                                       sum.begin() + static_cast<std::ptrdiff_t>(at + e));
        at += e;
      }
    }
  } else {
    for (std::size_t st = 0; st < P; ++st) {
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
        beside([&] { system_->all_reduce(name, {group}); });
        sum = system_->read(group.front(), name);
      } else {
        for (const auto& x : accs[0][st]) sum.insert(sum.end(), x.begin(), x.end());
      }
      std::size_t at = 0;
      for (std::size_t i : stages_[st].params) {
        const auto e = static_cast<std::size_t>(acc_sizes_[i]);
        if (stage_of_[i] == st)
          reduced_[acc_names_[i]].assign(sum.begin() + static_cast<std::ptrdiff_t>(at),
                                         sum.begin() + static_cast<std::ptrdiff_t>(at + e));
        at += e;
      }
    }
    end_beside();
  }
  // The norm: each shard's chips of their copy of its sum, the shards' sums
  // of squares then all-gathered (between a replica's stages, or over the
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
    std::vector<std::vector<int>> groups;
    if (c_.zero == 1) {
      groups.emplace_back();
      for (std::int64_t r = 0; r < c_.dp; ++r) groups.back().push_back(chip_of(r, 0));
    } else if (c_.tp > 1) {
      for (std::int64_t r = 0; r < c_.dp; ++r) {
        groups.emplace_back();
        for (std::int64_t st = 0; st < c_.pp; ++st)
          for (std::int64_t t = 0; t < c_.tp; ++t) groups.back().push_back(chip_of(r, st, t));
      }
    } else {
      for (std::int64_t r = 0; r < c_.dp; ++r) {
        groups.emplace_back();
        for (std::int64_t st = 0; st < c_.pp; ++st) groups.back().push_back(chip_of(r, st));
      }
    }
    collective([&] { system_->all_gather("sumsq", "sumsqs", groups); });
  }
  m.sim_ns += (max_clock() - t0).value();
  return norm;
}

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
