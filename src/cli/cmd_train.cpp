// tern train: trains a GPT-2- or Llama-style model on char-level text on a
// simulated chip (docs/train.md): precision recipes, numeric-health
// policies, checkpoints and resume, a progress line, metrics file.
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "arch/chip.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "lower/lower.h"
#include "profile/profile.h"
#include "runtime/comm.h"
#include "runtime/system.h"
#include "train/checkpoint.h"
#include "train/plot.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/file.h"

namespace tern::cli {

namespace {

struct Options {
  std::string config;               // a TOML file of TrainConfig keys
  std::vector<std::string> faults;  // --inject
  std::int64_t every = 100;         // validation every N steps (0: only at the end)
  int batches = 20;                 // held-out batches a validation averages
  std::int64_t log_every = 10;      // progress line every N steps
  std::string metrics;              // every step's metrics: JSONL, or CSV by extension ("" none)
  std::string plot;                 // the loss curves as PNG at the end ("" none)
  std::string trace;                // the chips' timeline (Chrome trace JSON) at the end
  bool json = false;
  bool progress = true;  // the "compiling" line on a terminal
};

void run(train::TrainConfig c, Options o) {
  for (const std::string& f : o.faults) c.faults.push_back(train::parse_fault(f));
  // Under mpirun every rank trains (each simulating its block of the dp
  // replicas) and ends each step with the same state; the first rank
  // prints and writes the files.
  runtime::Comm& world = runtime::world();
  if (world.rank() != 0) {
    if (!std::freopen("/dev/null", "w", stdout)) throw Error("cannot silence stdout of rank");
    o.metrics.clear(), o.plot.clear(), o.trace.clear();
  }
  const bool tty = o.progress && !o.json && ::isatty(2) && world.rank() == 0;
  if (tty)
    std::fprintf(stderr, "compiling the training step (%s, %s)...\r", c.recipe.c_str(),
                 c.arch.c_str());
  train::Trainer t(c, &world);
  if (tty) std::fprintf(stderr, "%60s\r", "");
  for (const std::string& n : t.notes()) std::fprintf(stderr, "note: %s\n", n.c_str());
  const graph::Executable& e = t.executable();
  const arch::ChipSpec chip = arch::load_chip(c.arch);
  // MFU against the chip's dense peaks (tensor engines of every core):
  // model FLOPs of the step / (simulated step time x peak).
  const double peak_bf16 = chip.tensor_peak_per_chip("bf16").value();
  const double peak_mx = chip.supports("mxfp8") ? chip.tensor_peak_per_chip("mxfp8").value() : 0;
  const double fusion = e.fusion.rate();
  // HBM the programs' plans need (grad + update; a fallback recompiles).
  auto hbm_now = [&t] {
    return static_cast<double>(t.executable().plan.total() + t.update_executable().plan.total());
  };
  const double hbm = hbm_now();
  if (!o.json)
    std::printf(
        "model: %s, %lld layers, dim %lld, %lld heads, vocab %d (%s), %lld parameters; batch "
        "%lld x %lld x %lld accum x %lld dp; recipe %s on %s; %zu + %zu kernels a step, fusion "
        "rate "
        "%.3f, HBM %.1f MiB a chip\n",
        c.model.c_str(), static_cast<long long>(c.layers), static_cast<long long>(c.dim),
        static_cast<long long>(c.heads), t.tokenizer().vocab(), t.tokenizer().kind().c_str(),
        static_cast<long long>(t.parameters()), static_cast<long long>(c.batch),
        static_cast<long long>(c.seq), static_cast<long long>(c.accum),
        static_cast<long long>(c.dp), t.recipe().c_str(), c.arch.c_str(), e.launches.size(),
        t.update_executable().launches.size(), fusion, hbm / (1 << 20));
  const std::int64_t chips_used = c.dp * c.tp * c.pp;
  if (!o.json && chips_used > 1)
    std::printf(
        "layout: dp %lld x tp %lld x pp %lld on %lld chips of %s (%s), %d process%s, replicas "
        "%lld..%lld here\n",
        static_cast<long long>(c.dp), static_cast<long long>(c.tp), static_cast<long long>(c.pp),
        static_cast<long long>(chips_used), t.system()->spec().name.c_str(),
        c.zero     ? "ZeRO-1"
        : c.pp > 1 ? "1F1B, optimizer by stage"
        : c.tp > 1
            ? (c.sp ? "Megatron tensor parallel, sequence parallel" : "Megatron tensor parallel")
            : "replicated optimizer",
        world.size(), world.size() > 1 ? "es" : "",
        static_cast<long long>(t.local_replicas().first),
        static_cast<long long>(t.local_replicas().second - 1));
  const double tokens = static_cast<double>(c.batch * c.seq * c.accum * c.dp);
  // The metrics file is rewritten atomically after every step (a reader
  // never sees half a line; a killed run leaves the steps done so far); a
  // resumed run continues the file it finds.
  // CSV: one row a step or validation, the columns below (empty where a
  // row has no value); JSONL: every record as it is.
  const bool csv = o.metrics.ends_with(".csv");
  static const char* kColumns[] = {"step",     "loss",      "val_loss",     "grad_norm",
                                   "lr",       "wall_ms",   "tokens_per_s", "sim_ns",
                                   "mfu_bf16", "mfu_mxfp8", "fusion_rate",  "recipe"};
  std::string metrics;
  if (csv && metrics.empty()) {
    for (const char* col : kColumns) metrics += std::string(metrics.empty() ? "" : ",") + col;
    metrics += "\n";
  }
  train::Series train_curve{"train", 0x1f77b4, {}}, val_curve{"validation", 0xd62728, {}};
  // Drops the lines and curve points of steps after `step` (a resume or a
  // rollback redoes them); the curves are rebuilt from the kept lines.
  auto truncate_after = [&](std::int64_t step) {
    std::string kept;
    train_curve.points.clear(), val_curve.points.clear();
    std::size_t pos = 0;
    while (pos < metrics.size()) {
      const std::size_t nl = metrics.find('\n', pos);
      const std::string line = metrics.substr(pos, nl - pos);
      pos = nl == std::string::npos ? metrics.size() : nl + 1;
      if (line.empty()) continue;
      if (csv) {  // the header, and rows by their first column
        if (line.starts_with("step,")) {
          kept += line + "\n";
          continue;
        }
        if (std::atoll(line.c_str()) > step) continue;
        kept += line + "\n";
        // step,loss,val_loss,...
        const std::size_t a = line.find(','), b = line.find(',', a + 1), c3 = line.find(',', b + 1);
        const double x = std::atof(line.c_str());
        if (b > a + 1) train_curve.points.emplace_back(x, std::atof(line.c_str() + a + 1));
        if (c3 > b + 1) val_curve.points.emplace_back(x, std::atof(line.c_str() + b + 1));
        continue;
      }
      try {
        const nlohmann::json j = nlohmann::json::parse(line);
        if (j.value("step", std::int64_t{0}) > step) continue;
        kept += line + "\n";
        if (j.contains("loss"))
          train_curve.points.emplace_back(j["step"].get<double>(), j["loss"].get<double>());
        if (j.contains("val_loss"))
          val_curve.points.emplace_back(j["step"].get<double>(), j["val_loss"].get<double>());
      } catch (const nlohmann::json::exception&) {  // a line that is not ours: dropped
      }
    }
    metrics = kept;
    if (!o.metrics.empty()) write_file_atomic(o.metrics, metrics);
  };
  // A resumed run continues the file it finds.
  if (!o.metrics.empty() && !c.resume.empty() && std::filesystem::exists(o.metrics)) {
    metrics = read_file(o.metrics);
    truncate_after(t.steps_done());
  }
  auto record = [&](const nlohmann::json& j) {
    if (o.json) std::printf("%s\n", j.dump().c_str());
    if (j.contains("loss"))
      train_curve.points.emplace_back(j["step"].get<double>(), j["loss"].get<double>());
    if (j.contains("val_loss"))
      val_curve.points.emplace_back(j["step"].get<double>(), j["val_loss"].get<double>());
    if (o.metrics.empty() || (csv && j.contains("action")) || (csv && j.contains("checkpoint")))
      return;
    if (csv) {
      std::string row;
      for (const char* col : kColumns) {
        if (col != kColumns[0]) row += ",";
        if (!j.contains(col)) continue;
        row += j[col].is_string() ? j[col].get<std::string>() : j[col].dump();
      }
      metrics += row + "\n";
    } else {
      metrics += j.dump() + "\n";
    }
    write_file_atomic(o.metrics, metrics);
  };
  double first = NAN, last = NAN, ema_tps = 0;
  while (t.steps_done() < c.steps) {
    const train::StepMetrics m = t.step();
    // Rolled back: the lines of the steps to redo go first, then the
    // actions that say why.
    const bool rolled_back = t.steps_done() < m.step;
    if (rolled_back) truncate_after(t.steps_done());
    for (const std::string& a : m.actions) {
      if (!o.json) std::printf("%s\n", a.c_str());
      record({{"step", m.step}, {"action", a}});
    }
    if (!m.monitors.empty()) {
      // The worst operand by saturation, underflow; totals of non-finite.
      nlohmann::json mon = nlohmann::json::object();
      const graph::QuantStats* worst_sat = nullptr;
      const graph::QuantStats* worst_under = nullptr;
      std::string sat_site, under_site;
      graph::QuantStats total;
      auto frac = [](std::int64_t n, std::int64_t d) {
        return d ? 100.0 * static_cast<double>(n) / static_cast<double>(d) : 0.0;
      };
      for (const auto& [site, st] : m.monitors) {
        mon[site] = {{"elements", st.elements},   {"saturated", st.saturated},
                     {"underflow", st.underflow}, {"nonfinite", st.nonfinite},
                     {"scale_min", st.scale_min}, {"scale_max", st.scale_max}};
        total.merge(st);
        if (!worst_sat ||
            frac(st.saturated, st.elements) > frac(worst_sat->saturated, worst_sat->elements))
          worst_sat = &st, sat_site = site;
        if (!worst_under ||
            frac(st.underflow, st.elements) > frac(worst_under->underflow, worst_under->elements))
          worst_under = &st, under_site = site;
      }
      record({{"step", m.step}, {"monitor", mon}});
      if (!o.json)
        std::printf(
            "step %lld monitors (%zu quantized operands): saturated %.3f%% (worst %s %.3f%%), "
            "underflow %.3f%% (worst %s %.3f%%), non-finite %lld, scales 2^%.0f..2^%.0f\n",
            static_cast<long long>(m.step), m.monitors.size(),
            frac(total.saturated, total.elements), sat_site.c_str(),
            frac(worst_sat->saturated, worst_sat->elements), frac(total.underflow, total.elements),
            under_site.c_str(), frac(worst_under->underflow, worst_under->elements),
            static_cast<long long>(total.nonfinite), std::log2(total.scale_min),
            std::log2(total.scale_max));
    }
    if (rolled_back) continue;
    if (std::isnan(first)) first = m.loss;
    last = m.loss;
    const double tps = tokens / (m.wall_ms / 1e3);
    ema_tps = ema_tps == 0 ? tps : 0.9 * ema_tps + 0.1 * tps;
    const double flops = t.flops_per_step();
    // MFU per chip: the step's FLOPs over every chip's peak.
    const double chips = static_cast<double>(chips_used);
    const double mfu_bf16 = flops / (m.sim_ns * 1e-9) / (peak_bf16 * chips);
    const double mfu_mx = peak_mx > 0 ? flops / (m.sim_ns * 1e-9) / (peak_mx * chips) : 0;
    record({{"step", m.step},
            {"loss", m.loss},
            {"grad_norm", m.grad_norm},
            {"clip_scale", m.clip_scale},
            {"lr", m.lr},
            {"updated", m.updated},
            {"retries", m.retries},
            {"wall_ms", m.wall_ms},
            {"tokens_per_s", tps},
            {"sim_ns", m.sim_ns},
            {"comm_ns", m.comm_ns},
            {"exposed_comm_ns", m.exposed_comm_ns},
            {"mfu_bf16", mfu_bf16},
            {"mfu_mxfp8", mfu_mx},
            {"fusion_rate", t.executable().fusion.rate()},
            {"hbm_bytes", hbm_now()},
            {"recipe", t.recipe()}});
    if (!o.json && (m.step % o.log_every == 0 || m.step == c.steps)) {
      std::printf(
          "step %5lld/%lld | loss %.4f | norm %6.3f | lr %.2e | %6.0f ms | %6.0f tok/s | sim "
          "%.3f ms%s | MFU %.1f%% bf16, %.1f%% mxfp8 | fusion %.3f | HBM %.1f MiB\n",
          static_cast<long long>(m.step), static_cast<long long>(c.steps), m.loss, m.grad_norm,
          m.lr, m.wall_ms, ema_tps, m.sim_ns / 1e6,
          chips_used > 1 ? fmt::format(" (comm {:.3f} ms, exposed {:.3f})", m.comm_ns / 1e6,
                                       m.exposed_comm_ns / 1e6)
                               .c_str()
                         : "",
          100 * mfu_bf16, 100 * mfu_mx, t.executable().fusion.rate(), hbm_now() / (1 << 20));
    }
    if (c.ckpt_every > 0 && (t.steps_done() % c.ckpt_every == 0 || t.steps_done() == c.steps)) {
      const std::string f = t.save_checkpoint();
      record({{"step", t.steps_done()}, {"checkpoint", f}});
    }
    if ((o.every > 0 && t.steps_done() % o.every == 0) || t.steps_done() == c.steps) {
      const double v = t.validate(o.batches);
      record({{"step", t.steps_done()}, {"val_loss", v}});
      if (!o.json)
        std::printf("step %5lld/%lld | val loss %.4f (%d batches of held-out text)\n",
                    static_cast<long long>(t.steps_done()), static_cast<long long>(c.steps), v,
                    o.batches);
    }
    std::fflush(stdout);
    for (const train::Fault& f : c.faults)
      if (f.kind == train::Fault::Kind::kill && f.step == t.steps_done()) {
        std::fflush(nullptr);
        std::raise(SIGKILL);  // an abrupt death, as a crashed host (tests of resume)
      }
  }
  if (!o.json)
    std::printf("loss %.4f -> %.4f over %lld steps\n", first, last,
                static_cast<long long>(c.steps));
  if (!o.plot.empty()) {
    train::write_plot(o.plot, {train_curve, val_curve}, "step",
                      fmt::format("loss (nats/char), {} {}", c.model, t.recipe()));
    if (!o.json) std::printf("loss curves: %s\n", o.plot.c_str());
  }
  if (!o.trace.empty()) {
    profile::write_trace(t.system()->trace(), o.trace);
    if (!o.json) std::printf("trace (one process per chip): %s\n", o.trace.c_str());
  }
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto c = std::make_shared<train::TrainConfig>();
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train a GPT-2- or Llama-style model on text (char or GPT-2 BPE tokens) on a simulated "
      "chip (docs/train.md)");
  cmd->add_option("--config", o->config,
                  "A TOML file of settings (docs/train.md); flags given here override it");
  cmd->add_option("--text", c->text, "Training text (char tokenizer)")->capture_default_str();
  cmd->add_option("--data", c->data,
                  "Train on token shards instead: a `tern data` directory (train.bin, val.bin, "
                  "tokenizer.json)");
  number_range(
      cmd->add_option("--val-fraction", c->val_fraction, "The text's last fraction held out")
          ->capture_default_str(),
      0, 1);
  one_of(cmd->add_option("--model", c->model, "gpt2 or llama")->capture_default_str(),
         {"gpt2", "llama"});
  int_range(cmd->add_option("--layers", c->layers, "Transformer layers")->capture_default_str(), 1,
            4096);
  int_range(cmd->add_option("--dim", c->dim, "Model width (head dim dim / heads: 64 or 128)")
                ->capture_default_str(),
            1, 1 << 20);
  int_range(cmd->add_option("--heads", c->heads, "Attention heads")->capture_default_str(), 1,
            4096);
  int_range(cmd->add_option("--kv-heads", c->kv_heads, "Llama: key/value heads (0: heads)")
                ->capture_default_str(),
            0, 4096);
  int_range(cmd->add_option("--ffn", c->ffn, "Llama: SwiGLU width (0: 8/3 dim rounded up to 64)")
                ->capture_default_str(),
            0, 1 << 22);
  int_range(cmd->add_option("--batch", c->batch, "Sequences a micro-batch")->capture_default_str(),
            1, 1 << 20);
  int_range(cmd->add_option("--seq", c->seq, "Tokens a sequence")->capture_default_str(), 1,
            1 << 24);
  int_range(cmd->add_option("--accum", c->accum, "Micro-batches a step (gradient accumulation)")
                ->capture_default_str(),
            1, 1 << 20);
  one_of(cmd->add_option("--recipe", c->recipe, "Precision: fp32, bf16, fp8-hybrid, mxfp8, mxfp4")
             ->capture_default_str(),
         {"fp32", "bf16", "fp8-hybrid", "mxfp8", "mxfp4"});
  one_of(cmd->add_option("--mx-policy", c->mx_policy, "MX scale rule: trn3, rceil, ocp-floor")
             ->capture_default_str(),
         {"trn3", "rceil", "ocp-floor"});
  cmd->add_flag("--stochastic-rounding", c->stochastic_rounding,
                "Engines round their outputs stochastically (seeded)");
  cmd->add_option("--arch", c->arch, "Chip")->capture_default_str();
  int_range(cmd->add_option("--cores", c->cores, "NeuronCores a kernel uses (0: all)")
                ->capture_default_str(),
            0, 1024);
  int_range(
      cmd->add_option("--dp", c->dp,
                      "Data-parallel replicas, each on its own simulated chip (docs/multichip.md)")
          ->capture_default_str(),
      1, 1 << 16);
  int_range(cmd->add_option("--tp", c->tp, "Tensor-parallel chips (Megatron-LM style; GPT-2)")
                ->capture_default_str(),
            1, 1024);
  cmd->add_flag("--sp", c->sp,
                "With --tp: sequence parallelism (norms and residual adds on seq / tp positions "
                "a rank; reduce-scatter and all-gather instead of all-reduce)");
  int_range(cmd->add_option("--pp", c->pp, "Pipeline stages (1F1B over the --accum micro-batches)")
                ->capture_default_str(),
            1, 1024);
  int_range(
      cmd->add_option("--zero", c->zero, "1: shard the optimizer state over the replicas (ZeRO-1)")
          ->capture_default_str(),
      0, 1);
  number_range(
      cmd->add_option(
             "--bucket-mb", c->bucket_mb,
             "DP gradient all-reduce buckets (MiB), each launched when its gradients are "
             "final, overlapping the backward (zero 0, pp 1, tp 1); 0: one bucket after it")
          ->capture_default_str(),
      0, 1 << 20);
  cmd->add_option("--system", c->system,
                  "The system whose fabric joins the chips (default: the smallest of --arch's "
                  "holding them)");
  int_range(
      cmd->add_option("--threads", c->threads,
                      "Host threads simulating this process's chips (0: one a chip, at most the "
                      "cores)")
          ->capture_default_str(),
      0, 4096);
  int_range(cmd->add_option("--steps", c->steps, "Optimizer steps (the schedule's length)")
                ->capture_default_str(),
            0, 1LL << 40);
  number_range(cmd->add_option("--lr", c->lr, "Peak learning rate (AdamW)")->capture_default_str(),
               0, 1e6);
  number_range(cmd->add_option("--min-lr", c->min_lr, "Final learning rate of the cosine decay")
                   ->capture_default_str(),
               0, 1e6);
  int_range(cmd->add_option("--warmup", c->warmup, "Linear warmup steps")->capture_default_str(), 0,
            1LL << 40);
  number_range(cmd->add_option("--weight-decay", c->weight_decay, "AdamW weight decay")
                   ->capture_default_str(),
               0, 1e6);
  number_range(cmd->add_option("--beta1", c->beta1, "AdamW beta1")->capture_default_str(), 0, 1);
  number_range(cmd->add_option("--beta2", c->beta2, "AdamW beta2")->capture_default_str(), 0, 1);
  number_range(cmd->add_option("--init-std", c->init_std, "Initial weights' standard deviation")
                   ->capture_default_str(),
               0, 1e6);
  number_range(cmd->add_option("--clip", c->clip, "Clip the global gradient norm to this (0: off)")
                   ->capture_default_str(),
               0);
  int_range(cmd->add_option("--seed", c->seed, "Weights, batch order, rounding streams")
                ->capture_default_str(),
            0);
  one_of(cmd->add_option("--nan-policy", c->nan_policy,
                         "On NaN/Inf: skip, fallback-layer, fallback-global, rollback, stop")
             ->capture_default_str(),
         {"skip", "fallback-layer", "fallback-global", "rollback", "stop"});
  number_range(cmd->add_option("--nan-rate", c->nan_rate,
                               "Non-finite gradient elements tolerated (fraction; 0: none)")
                   ->capture_default_str(),
               0, 1);
  number_range(cmd->add_option("--spike-z", c->spike_z,
                               "Log a gradient-norm spike above this z-score (0: off)")
                   ->capture_default_str(),
               0);
  int_range(
      cmd->add_option("--spike-window", c->spike_window, "Steps the spike z-score looks back on")
          ->capture_default_str(),
      1, 1 << 20);
  int_range(cmd->add_option("--retries", c->retries, "Retries of a failed step before a rollback")
                ->capture_default_str(),
            0, 1000);
  int_range(cmd->add_option(
                   "--monitor-every", c->monitor_every,
                   "Per-matmul numeric monitors (saturation, underflow, NaN, scales) every N steps "
                   "(0: off)")
                ->capture_default_str(),
            0);
  number_range(
      cmd->add_option("--overflow-pct", c->overflow_pct,
                      "A matmul operand saturating more than this % triggers --overflow-policy")
          ->capture_default_str(),
      0, 100);
  one_of(cmd->add_option("--overflow-policy", c->overflow_policy,
                         "On overflow: warn, fallback-layer, fallback-global")
             ->capture_default_str(),
         {"warn", "fallback-layer", "fallback-global"});
  cmd->add_option("--ckpt-dir", c->ckpt_dir, "Checkpoint directory");
  int_range(cmd->add_option("--ckpt-every", c->ckpt_every, "Checkpoint every N steps (0: none)")
                ->capture_default_str(),
            0);
  int_range(cmd->add_option("--keep-last", c->keep_last, "Checkpoints kept")->capture_default_str(),
            1, 1 << 20);
  cmd->add_option("--resume", c->resume,
                  "Continue from a checkpoint file, or a directory's newest good one");
  cmd->add_option("--inject", o->faults,
                  "Inject a fault (tests): nan@STEP[:PARAM], fail@STEP[xCOUNT], kill@STEP");
  int_range(cmd->add_option("--eval-every", o->every,
                            "Validation loss every N steps (0: at the end only)")
                ->capture_default_str(),
            0);
  int_range(cmd->add_option("--eval-batches", o->batches, "Held-out batches a validation averages")
                ->capture_default_str(),
            1, 1 << 20);
  int_range(cmd->add_option("--log-every", o->log_every, "Progress line every N steps")
                ->capture_default_str(),
            1);
  output_file(cmd->add_option(
      "--metrics", o->metrics,
      "Write every step's metrics and validation losses to this file (JSONL; CSV if "
      "it ends in .csv)"));
  output_file(
      cmd->add_option("--plot", o->plot, "Write the loss curves (train, validation) to this PNG"));
  output_file(
      cmd->add_option("--trace", o->trace,
                      "Write the chips' timeline (compute, collectives; one process per chip) as a "
                      "Chrome trace JSON"));
  cmd->add_flag("--json", o->json, "One JSON line a step");
  cmd->add_flag("!--no-progress", o->progress,
                "No progress line on stderr (there is none when stderr is not a terminal)");
  cmd->callback([c, o, cmd] {
    train::TrainConfig cfg = *c;
    if (!o->config.empty()) {
      // The file's settings, then every flag given on the command line
      // ("--kv-heads" sets the key kv_heads).
      train::TrainConfig file;
      train::load_config_file(file, o->config);
      nlohmann::json merged = train::to_json(file);
      const nlohmann::json flags = train::to_json(*c);
      for (const CLI::Option* opt : cmd->get_options()) {
        if (opt->count() == 0 || opt->get_lnames().empty()) continue;
        std::string key = opt->get_lnames().front();
        std::replace(key.begin(), key.end(), '-', '_');
        if (flags.contains(key)) merged[key] = flags.at(key);
      }
      cfg = train::config_from_json(merged);
    }
    if (o->log_every < 1) throw Error("--log-every must be >= 1");
    // Where checkpoints go is checked before the first step, not after it.
    if (!cfg.ckpt_dir.empty() && cfg.ckpt_every > 0)
      ensure_writable_dir(cfg.ckpt_dir, "--ckpt-dir");
    try {
      run(cfg, *o);
    } catch (const std::exception& e) {
      // Under mpirun the other ranks would wait for this one in their next
      // collective: end them all.
      runtime::Comm& w = runtime::world();
      if (w.size() > 1) {
        std::fprintf(stderr, "tern: error (rank %d of %d): %s\n", w.rank(), w.size(), e.what());
        w.abort(2);
      }
      throw;
    }
  });
}

void add_sample_command(CLI::App& app) {
  struct Opts {
    std::string ckpt, prompt = "\n";
    int tokens = 200;
    double temperature = 0.8;
    std::uint64_t seed = 1;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "sample", "Generate text from a training checkpoint on the simulated chip (docs/train.md)");
  cmd->add_option("--ckpt", o->ckpt, "A checkpoint file, or a directory (its newest good one)")
      ->required();
  cmd->add_option("--prompt", o->prompt, "Text to continue (default: a line break)");
  int_range(cmd->add_option("--tokens", o->tokens,
                            "Tokens (characters, for the char tokenizer) to generate")
                ->capture_default_str(),
            0, 1 << 24);
  number_range(cmd->add_option("--temperature", o->temperature, "Sampling temperature (0: greedy)")
                   ->capture_default_str(),
               0, 1e6);
  int_range(cmd->add_option("--seed", o->seed, "Sampling seed")->capture_default_str(), 0);
  cmd->add_flag("--json", o->json, "Print {prompt, text, step} as JSON");
  cmd->callback([o] {
    // The run's own config (model, data, recipe), resumed from the file.
    std::filesystem::path file = o->ckpt;
    std::vector<std::string> notes;
    train::Checkpoint ck;
    if (std::filesystem::is_directory(file)) {
      auto good = train::latest_good(file, notes);
      if (!good) throw Error(fmt::format("--ckpt {}: no checkpoint there loads", o->ckpt));
      file = good->first;
      ck = std::move(good->second);
    } else {
      ck = train::load_checkpoint(file);
    }
    for (const std::string& n : notes) std::fprintf(stderr, "note: %s\n", n.c_str());
    train::TrainConfig c;
    try {
      c = train::config_from_json(ck.meta.at("config"));
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("--ckpt {}: the checkpoint's settings are not what tern writes ({})",
                              file.string(), e.what()));
    }
    c.resume = file.string();
    c.faults.clear();
    c.accum *= c.dp, c.dp = 1, c.tp = 1, c.pp = 1, c.zero = 0;  // sampling needs one chip
    train::Trainer t(c);
    const std::string text = t.sample(o->prompt, o->tokens, o->temperature, o->seed);
    if (o->json) {
      std::printf("%s\n", nlohmann::json{{"checkpoint", file.string()},
                                         {"step", t.steps_done()},
                                         {"prompt", o->prompt},
                                         {"text", text}}
                              .dump()
                              .c_str());
    } else {
      std::printf("%s%s\n", o->prompt.c_str(), text.c_str());
    }
  });
}

}  // namespace tern::cli
