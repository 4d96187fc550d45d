// The training loop: a GPT-2- or Llama-style model on char-level
// text, trained on a simulated chip under a precision recipe.
//
// A step is two compiled programs on two runtime Sessions, as a framework
// runs them on the device:
//   grad    forward + backward of one micro-batch; each gradient is added
//           into an FP32 accumulator kept on the device (carried), and the
//           program also outputs the loss and each accumulator's sum of
//           squares (the global gradient norm without reading gradients
//           back). Run `accum` times a step.
//   update  AdamW over the accumulators (multi-tensor kernels; matrices and
//           embeddings decayed, biases and norm weights not), warmup +
//           cosine schedule. Clipping and the 1 / accum average are folded
//           into the step's runtime scalars: m += (1 - b1) * (c * g) becomes
//           m += ((1 - b1) * c) * g and v's term takes c^2 (kernel/adamw;
//           it differs from scaling the gradient first by at most a rounding
//           of each product).
// Between them the host checks the loss and the norm (numeric health,
// TrainConfig's policies) and decides: update, clip, skip, fall back to
// bf16 (recompiling), roll back to a checkpoint, or retry a failed step.
// The updated weights go back to the grad program's Session each step.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "graph/quant.h"
#include "train/config.h"
#include "train/loader.h"
#include "train/tokenizer.h"
#include "util/units.h"

namespace tern::graph {
struct Executable;
class Graph;
}  // namespace tern::graph
namespace tern::runtime {
class Session;
class System;
class Comm;
struct StepResult;
struct StepOptions;
}  // namespace tern::runtime

namespace tern::train {

// The learning rate of step `step` (from 1): linear warmup over `warmup`
// steps to lr, then cosine decay to min_lr at `steps` (and min_lr after).
double learning_rate(const TrainConfig& c, std::int64_t step);

struct StepMetrics {
  std::int64_t step = 0;
  double loss = 0, lr = 0;
  double grad_norm = 0;              // global L2 norm of the step's mean gradient, before clipping
  double clip_scale = 1;             // what clipping multiplied the gradient by (1: none)
  double sim_ns = 0;                 // simulated time: every micro-batch's program and the update
                                     // (dp > 1: the slowest replica, the all-reduce, the update)
  double comm_ns = 0;                // simulated time of the step's collectives (dp > 1)
  double exposed_comm_ns = 0;        // the part of comm_ns no compute overlaps
  double wall_ms = 0;                // host time of the simulation (the whole step)
  bool updated = true;               // false: the health policy skipped the update
  bool spike = false;                // the norm's z-score over the recent steps exceeded spike_z
  int retries = 0;                   // failed attempts before this one succeeded
  std::int64_t nonfinite = 0;        // NaN/Inf gradient elements seen (before any action)
  std::vector<std::string> actions;  // what policies and recovery did, for the log
  // Per quantized matmul operand (a monitored step only): its health.
  std::map<std::string, graph::QuantStats> monitors;
};

class Trainer {
 public:
  // Reads and tokenizes the text, builds and compiles the programs,
  // initializes the weights (normal(0, init_std); norm weights 1, biases 0)
  // and the optimizer state, or restores them from c.resume. Throws
  // tern::Error naming what is wrong.
  //
  // Data parallel (c.dp > 1): dp replicas of the grad program, each on its
  // own simulated chip of c.system; `comm` (default: one process) says
  // which of them this process simulates (a block of dp / ranks, docs/
  // multichip.md). Every rank ends each step with the same state.
  explicit Trainer(const TrainConfig& c, runtime::Comm* comm = nullptr);
  ~Trainer();

  // One optimizer step (accum micro-batches). Throws tern::Error when the
  // stop policy fires or recovery is impossible (no checkpoint to roll back
  // to), naming the step and the cause.
  StepMetrics step();
  // A step on given batches (accum x dp micro-batches of [batch, seq] ids
  // and targets; replica r takes [r accum, (r + 1) accum)) instead of the
  // loader's: reference checks, custom data.
  // Throws naming the expected shape.
  StepMetrics step(const std::vector<Batch>& micro);
  // The mean loss over the first `batches` batches of the held-out text
  // (the same batches every time) with the current weights: a forward-only
  // program under the current recipe.
  double validate(int batches);
  // Writes the state after the current step to ckpt_dir (atomically; keeps
  // the last keep_last). Returns the file.
  std::string save_checkpoint();

  std::int64_t steps_done() const { return step_; }
  const TrainConfig& config() const { return c_; }
  const Tokenizer& tokenizer() const { return *tok_; }
  const graph::Executable& executable() const;  // the grad program
  const graph::Executable& update_executable() const;
  std::int64_t parameters() const { return params_; }
  // Model FLOPs of a training step: (6 N + 12 L h s) per token (PaLM; N
  // the parameters, embeddings included), x batch x seq x accum x dp.
  double flops_per_step() const;
  // The recipe in force (fallback-global turns it to bf16) and the layers
  // kept in bf16 by fallback-layer.
  const std::string& recipe() const { return recipe_; }
  const std::set<std::int64_t>& bf16_layers() const { return bf16_layers_; }
  // Messages from construction (a corrupt checkpoint passed over, ...).
  const std::vector<std::string>& notes() const { return notes_; }
  // dp > 1: the chips and their fabric (clocks, collectives, the trace);
  // null for a single chip.
  const runtime::System* system() const { return system_.get(); }
  // The replicas this process simulates: [first, last).
  std::pair<std::int64_t, std::int64_t> local_replicas() const { return {first_, last_}; }
  // A param's current values (row-major, decoded to FP32).
  std::vector<float> param(const std::string& name) const;
  // Sets a param (and its FP32 master) before training or between steps.
  // Throws naming an unknown param or a wrong size.
  void set_param(const std::string& name, const std::vector<float>& values);
  const std::vector<std::string>& param_names() const { return param_names_; }
  // Keep each step's mean gradient (before clipping) for gradients().
  void keep_gradients(bool on) { keep_grads_ = on; }
  const std::map<std::string, std::vector<float>>& gradients() const { return grads_; }
  // The logits [batch, seq, vocab] of a batch with the current weights (a
  // forward program with the logits as output, compiled on first use).
  std::vector<float> logits(const Batch& b);
  // Continues `prompt` by `tokens` characters, each drawn from the model's
  // next-token distribution at `temperature` (0: the most likely), with a
  // seeded mt19937_64; one forward pass on the simulated chip a character,
  // the context the last `seq` characters. Throws naming a prompt byte
  // outside the vocabulary.
  std::string sample(const std::string& prompt, int tokens, double temperature, std::uint64_t seed);

 private:
  void build();  // compiles grad, update and eval programs for recipe_ / bf16_layers_
  // The steps of build(), in order: the grad program (forward, backward,
  // accumulators) ...
  struct BuildContext;  // defined in trainer_build.cpp
  void build_grad(const BuildContext& b);
  // ... the pipeline stages (pp > 1) or the tensor-parallel pieces, each a
  // piece of the forward pass and its backward (make_piece) ...
  struct Stage;
  Stage make_piece(const BuildContext& b, const graph::Graph& part, std::vector<std::string> ins,
                   std::vector<std::string> outs, int rank) const;
  void build_stages(const BuildContext& b);
  void build_pieces(const BuildContext& b);
  // ... and the optimizer's shards (which params, which chips) and their
  // update and gradient-norm programs.
  void partition_shards();
  void zero_shards();
  void build_shard_programs(const BuildContext& b);
  bool one_chip() const { return c_.dp == 1 && c_.pp == 1 && c_.tp == 1; }
  void init_weights();
  void push_weights();  // weights_ -> every grad session of this process
  void zero_accumulators();
  // Runs this process's replicas on `batches` (host threads; pp > 1: each
  // through its pipeline stages), then reduces the accumulators into
  // reduced_ (dp > 1 or pp > 1: on the simulated fabric) and computes the
  // sums of squares (the returned outputs "<param>.grad_sumsq").
  runtime::StepResult run_replicas(std::int64_t s, const std::vector<Batch>& batches,
                                   StepMetrics& m, double& loss);
  // One replica's results of a step: its micro-batches' losses, program
  // times [stage][micro-batch] (forward f, backward b) and the last
  // backward program's result.
  struct ReplicaRun;  // defined in trainer_sync.cpp
  // accs[r][st][p]: replica r's accumulator of stage st's p-th param.
  using Accumulators = std::vector<std::vector<std::vector<std::vector<float>>>>;
  // The phases of run_replicas, in order: every local replica's
  // micro-batches (host threads) ...
  std::vector<ReplicaRun> run_micro_batches(std::int64_t s, const std::vector<Batch>& batches);
  void replica_micro_batches(std::size_t k, std::int64_t s, const std::vector<Batch>& batches,
                             ReplicaRun& out);
  // ... when the overlapped reduction's gradients become final (ns into
  // the last backward program, from its launches' events) ...
  std::vector<double> gradient_ready(const ReplicaRun& first) const;
  // ... every replica's losses, times and accumulators on every rank (MPI),
  // each replica's timeline advanced on its chips, the losses summed in
  // global micro-batch order into `loss` ...
  Accumulators gather_accumulators(const std::vector<ReplicaRun>& ran, bool overlap, StepMetrics& m,
                                   double& loss);
  void replica_timeline(std::int64_t r, const std::vector<std::vector<double>>& f,
                        const std::vector<std::vector<double>>& b, bool overlap, StepMetrics& m);
  // ... the reductions into reduced_ on the simulated fabric (the tied
  // embedding's two stages; then tensor parallel, ZeRO-1's reduce-scatter,
  // DDP's overlapped buckets, or one all-reduce per stage) ...
  void reduce_tied(Accumulators& accs, StepMetrics& m);
  void reduce_tensor_parallel(const Accumulators& accs, StepMetrics& m);
  std::vector<std::vector<float>> whole_accumulators(const Accumulators& accs,
                                                     std::int64_t r) const;
  void time_tied_tensor_parallel(StepMetrics& m);
  void reduce_zero(const Accumulators& accs, StepMetrics& m);
  std::vector<std::vector<std::size_t>> gradient_buckets(const std::vector<double>& ready) const;
  void reduce_buckets(const Accumulators& accs, const std::vector<double>& ready, double program,
                      StepMetrics& m);
  void reduce_stages(const Accumulators& accs, StepMetrics& m);
  // ... and the gradient's sums of squares, per shard, all-gathered.
  runtime::StepResult gradient_norm(StepMetrics& m);
  std::vector<std::vector<int>> sumsq_groups() const;
  std::size_t position(std::size_t st, std::size_t i) const;  // param i among stage st's
  // Adds the last collective's time to comm and exposed comm (nothing
  // overlaps it: it follows the backward pass).
  void exposed_collective(StepMetrics& m) const;
  // pp or tp > 1: the timeline of one replica's micro-batches on its chips
  // (1F1B over the stages; each stage's pieces on its tp chips) from the
  // programs' times f[piece][i] (forward) and b[piece][i] (backward); adds
  // the send/recv time (one tp rank's) to p2p, the tp all-reduces to reduces.
  void pipeline_timeline(std::int64_t replica, const std::vector<std::vector<double>>& f,
                         const std::vector<std::vector<double>>& b, double& p2p, double& reduces);
  // Pieces [lo, hi) of a stage for micro-batch i, forward or (in reverse)
  // backward, on the stage's tp chips; returns the all-reduces' time.
  double pieces_timeline(std::int64_t replica, std::int64_t stage, std::size_t lo, std::size_t hi,
                         bool forward, std::size_t i, const std::vector<std::vector<double>>& f,
                         const std::vector<std::vector<double>>& b);
  Nanoseconds max_clock() const;
  // Chips: replica-major, then pipeline stage, then tensor-parallel rank.
  int chip_of(std::int64_t replica, std::int64_t stage, std::int64_t rank = 0) const {
    return static_cast<int>((replica * c_.pp + stage) * c_.tp + rank);
  }
  // A session holding param i (stage and replica of this process's first).
  runtime::Session& holder(std::size_t i);
  // `values` of param i rounded to its dtype; throws naming a wrong size.
  std::vector<float> rounded(std::size_t i, const std::vector<float>& values) const;
  // tp > 1: whether param i is split over the tp ranks, and rank t's part
  // of a full tensor of its shape (a param, its gradient or optimizer
  // state), and the full tensor from the parts.
  bool sliced(std::size_t i) const;
  std::vector<float> slice(std::size_t i, int t, const std::vector<float>& full) const;
  std::vector<float> assemble(std::size_t i, const std::vector<std::vector<float>>& parts) const;
  // tp > 1: one micro-batch of one replica through its pieces (times into
  // f and b by piece, the loss appended).
  struct Replica;
  void tensor_parallel_micro_batch(Replica& rep,
                                   const std::map<std::string, std::vector<float>>& inputs,
                                   const std::function<runtime::StepOptions(std::size_t)>& opts,
                                   std::vector<std::vector<double>>& f,
                                   std::vector<std::vector<double>>& b,
                                   std::vector<double>& losses);
  // sp: rank t's positions [t seq / tp, (t + 1) seq / tp) of every
  // sequence of a [batch, seq, ...] value, and the value from the ranks'.
  std::vector<float> seq_shard(const std::vector<float>& x, std::size_t t) const;
  std::vector<float> seq_assemble(const std::vector<std::vector<float>>& parts) const;
  std::map<std::string, isa::DType> boundary_dtype_;  // the forward pass's values
  std::map<std::string, std::int64_t> boundary_elements_;
  std::vector<std::pair<std::size_t, std::size_t>> stage_pieces_;  // pipeline stage -> pieces
  std::vector<std::vector<std::string>> stage_inputs_;  // what crosses into a pipeline stage
  void restore(const std::string& file_or_dir);
  void restore_from(const std::string& file_or_dir);
  void restore_checkpoint(const struct Checkpoint& ck);
  std::map<std::string, std::vector<float>> model_inputs(const Batch& b) const;
  StepMetrics attempt(std::int64_t step, const LoaderState& start, int& fails_left);
  // The parts of attempt(), in order: an injected device fault (throws
  // InjectedFault), the step's batches, injected NaNs, then after the
  // replicas ran the gradient's health (false: too many non-finite
  // elements or a non-finite loss; the nan_policy then applies), the
  // spike watch and the update.
  void raise_injected_failure(std::int64_t s);
  std::vector<Batch> step_batches(std::int64_t s, const LoaderState& start);
  void inject_nans(std::int64_t s, StepMetrics& m);
  bool healthy(std::int64_t s, double& sumsq, StepMetrics& m,
               std::map<std::int64_t, std::int64_t>& bad_by_layer);
  void unhealthy(std::int64_t s, const LoaderState& start, StepMetrics& m,
                 const std::map<std::int64_t, std::int64_t>& bad_by_layer, int& redo);
  void watch_spikes(std::int64_t s, StepMetrics& m);
  void update(StepMetrics& m);  // clipping, AdamW on every shard, the weights pushed
  StepMetrics run_step(const std::vector<Batch>* given);
  void monitor(const Batch& b, StepMetrics& m);
  void rebuild();
  Batch checked(const Batch& b) const;

  TrainConfig c_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<BatchLoader> train_;
  std::vector<std::uint16_t> val_tokens_;
  std::vector<std::string> param_names_;
  std::vector<float> rope_cos_, rope_sin_;  // Llama's tables [seq, head_dim / 2]
  std::string recipe_;
  std::set<std::int64_t> bf16_layers_;
  std::shared_ptr<const graph::Executable> grad_exe_, eval_exe_;
  std::unique_ptr<graph::Graph> grad_graph_;  // the grad program's graph (monitors)
  std::unique_ptr<runtime::Session> eval_;
  // The model's pipeline stages (pp 1: one, the whole grad program). Stage
  // s runs layers [s L / pp, (s + 1) L / pp) (the first also the
  // embeddings, the last the head and the loss); its backward program
  // recomputes its forward from the stage's input (full recompute) and
  // adds its params' gradients into FP32 accumulators.
  //
  // tp > 1 (Megatron-LM): the pieces of the model between tensor-parallel
  // all-reduces instead, in order: replicated pieces (embeddings, norms,
  // residual adds, biases after a reduction, the head; tp -1, run once a
  // replica on the host and timed on each of its tp chips) and each
  // layer's attention and MLP shard for every tp rank (tp >= 0, their
  // params sliced: slice()).
  struct Stage {
    std::string in, out;              // boundary values ("" for the first's in; "loss")
    std::string dx, dy;               // bwd: gradient of `in` (output), of `out` (input)
    std::vector<std::size_t> params;  // indices into param_names_ (a tied param in two stages)
    std::shared_ptr<const graph::Executable> fwd, bwd;  // fwd: null for the last stage
    int tp = -1;                                        // tp > 1: the rank of a shard piece
    bool sp = false;  // sp: a sequence-parallel piece (rank tp's seq / tp positions)
    std::vector<std::string> ins, outs;           // tp > 1: boundary values (in, out above: pp)
    std::map<std::string, std::string> dxs, dys;  // tp > 1: value -> its gradient's name
  };
  std::vector<Stage> stages_;
  std::vector<std::size_t> stage_of_;  // param -> the first stage holding it
  // This process's replicas [first_, last_): per stage, its sessions.
  struct Replica {
    std::vector<std::unique_ptr<runtime::Session>> fwd, bwd;
  };
  std::vector<Replica> replicas_;
  std::map<std::string, std::vector<float>> reduced_;  // the step's summed accumulators
  // The optimizer: one shard of every param (zero 0: run by every chip on
  // its copy), one per pipeline stage (pp > 1: run by the stage's chips),
  // or dp shards of whole params in order, balanced by elements (zero 1:
  // replica r updates shard r, then the weights are all-gathered). A
  // shard's Session exists where one of its chips is simulated.
  struct Shard {
    std::vector<int> chips;           // the chips that run it
    int tp = -1;                      // tp > 1: the rank whose slices it holds
    std::vector<std::size_t> params;  // indices into param_names_
    std::int64_t elements = 0;
    std::vector<std::string> state;                         // its masters and moments
    std::shared_ptr<const graph::Executable> update, norm;  // norm: dp > 1
    std::unique_ptr<runtime::Session> session, norm_session;
  };
  std::vector<Shard> shards_;
  std::map<std::string, std::vector<float>> weights_;  // every param as every replica holds it
  bool local_chip(int chip) const {
    const std::int64_t r = chip / (c_.pp * c_.tp);
    return r >= first_ && r < last_;
  }
  bool local_shard(const Shard& s) const {
    for (int c : s.chips)
      if (local_chip(c)) return true;
    return false;
  }
  // The rank that reports a shard's results: the one simulating its first chip.
  int reporter(const Shard& s) const;
  // Every state tensor of the optimizer (masters, moments), gathered from
  // the shards of every process (checkpoints, rebuilds).
  std::map<std::string, std::vector<float>> optimizer_state();
  // Writes the named state tensors into the shards this process holds.
  void set_optimizer_state(const std::map<std::string, std::vector<float>>& state);
  std::string param_of_state(const std::string& state) const;
  std::size_t param_index(const std::string& name) const;  // throws naming an unknown param
  // The update of a step from the reduced accumulators: every
  // shard, then (zero 1) the weights gathered; returns the simulated time.
  double run_update(const std::map<std::string, std::vector<float>>& scalars, StepMetrics& m);
  runtime::Comm* comm_ = nullptr;
  std::unique_ptr<runtime::Comm> own_comm_;
  std::int64_t first_ = 0, last_ = 1;        // this process's replicas
  std::unique_ptr<runtime::System> system_;  // the chips' clocks and fabric
  std::vector<std::string> acc_names_, sumsq_names_;
  std::vector<std::int64_t> acc_sizes_;  // elements of each accumulator
  std::vector<graph::Shape> param_shapes_;
  std::vector<isa::DType> param_dtypes_;
  std::map<std::string, std::string> master_of_;  // master input -> param
  std::vector<std::string> moment_names_;
  std::int64_t step_ = 0, opt_step_ = 0, params_ = 0;
  std::set<std::int64_t> skip_batches_;  // steps whose batches are skipped (after a rollback)
  std::deque<double> norms_;             // recent gradient norms (spike detection)
  std::vector<std::string> notes_;
  bool keep_grads_ = false;
  std::map<std::string, std::vector<float>> grads_;
  const std::vector<Batch>* given_ = nullptr;  // step(micro)'s batches
  std::shared_ptr<const graph::Executable> logits_exe_;
  std::unique_ptr<runtime::Session> logits_;
  std::map<std::int64_t, int> fails_done_;  // injected failures already raised, by step
  std::set<std::int64_t> nans_done_;        // injected NaNs already raised
};

}  // namespace tern::train
