// `tern compile`: a graph (a .tgraph file or a built-in model) through
// autodiff (--train), fusion and HBM planning, with the fusion report and
// the memory plan; the fit check against the chip's HBM.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "arch/chip.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "graph/autocast.h"
#include "graph/autodiff.h"
#include "graph/fusion.h"
#include "graph/memplan.h"
#include "graph/models.h"
#include "graph/optimizer.h"
#include "graph/recompute.h"
#include "graph/text.h"
#include "lower/lower.h"
#include "sim/simulator.h"
#include "util/error.h"

namespace tern::cli {

namespace {

struct Args {
  std::string file, model, arch = "trn3", emit, autocast = "none", autocast_type = "bf16",
                           mx_policy = "rceil", recompute = "none", dtype = "bf16",
                           optimizer = "adamw", fp8_scaling = "current";
  bool train = false, report = false, json = false, estimate = false, progress = true;
  bool mx_unfused = false;
  std::int64_t layers = 12, dim = 768, heads = 12, kv_heads = 0, ffn = 0, vocab = 50304, seq = 1024,
               batch = 4;
  std::int64_t optimizer_bytes = -1;
  int cores = 0, lnc = 1;
  std::int64_t amax_history = 1024;
};

graph::Model build(const Args& a) {
  if (!a.file.empty() && !a.model.empty())
    throw Error("give either a .tgraph file or --model, not both");
  if (a.file.empty() && a.model.empty())
    throw Error("give a .tgraph file or --model gpt2|llama (see --help)");
  if (!a.file.empty()) {
    graph::Model m{graph::load(a.file), -1, {}};
    for (const graph::Value& v : m.graph.values())
      if (m.graph.node(v.node).op == graph::Op::param) m.params.push_back(m.graph.find(v.name));
    for (int o : m.graph.outputs())
      if (m.graph.value(o).shape.empty()) {
        m.loss = o;
        break;
      }
    return m;
  }
  const isa::DType dt = isa::parse_dtype(a.dtype);
  if (a.model == "gpt2") {
    graph::Gpt2Config c;
    c.layers = a.layers, c.dim = a.dim, c.heads = a.heads, c.vocab = a.vocab, c.seq = a.seq;
    c.batch = a.batch, c.dtype = dt;
    return graph::gpt2(c);
  }
  if (a.model == "llama") {
    graph::LlamaConfig c;
    c.layers = a.layers, c.dim = a.dim, c.heads = a.heads;
    c.kv_heads = a.kv_heads ? a.kv_heads : a.heads, c.ffn = a.ffn ? a.ffn : 4 * a.dim;
    c.vocab = a.vocab, c.seq = a.seq, c.batch = a.batch, c.dtype = dt;
    return graph::llama(c);
  }
  throw Error(fmt::format("unknown --model '{}' (gpt2, llama)", a.model));
}

void run(Args a) {
  if (a.report) a.estimate = true;  // the report includes the time estimate
  const bool is_recipe = a.autocast == "bf16" || a.autocast == "fp8-hybrid" ||
                         a.autocast == "mxfp8" || a.autocast == "mxfp4";
  graph::AutocastOptions ac = is_recipe ? graph::recipe(a.autocast, a.mx_policy)
                                        : graph::parse_autocast(a.autocast, a.autocast_type);
  if (a.fp8_scaling != "current" || a.amax_history != 1024)
    graph::set_fp8_scaling(ac, a.fp8_scaling, a.amax_history);
  const arch::ChipSpec chip = arch::load_chip(a.arch);
  graph::Model m = build(a);
  if (ac.mode != "none") {  // the forward rewritten; values keep their names
    graph::Model c{graph::autocast(m.graph, ac), -1, {}};
    if (m.loss >= 0) c.loss = c.graph.find(m.graph.value(m.loss).name);
    for (int p : m.params) c.params.push_back(c.graph.find(m.graph.value(p).name));
    m = std::move(c);
  }
  graph::Graph& g = m.graph;
  if (a.train) {
    if (m.loss < 0)
      throw Error(
          fmt::format("--train: graph {} has no scalar output to use as the loss", g.name()));
    std::vector<std::pair<std::string, std::string>> named;  // param, gradient
    for (const auto& [p, d] : graph::add_backward(g, m.loss, m.params)) {
      g.mark_output(d);
      named.emplace_back(g.value(p).name, g.value(d).name);
    }
    g = graph::recompute(g, m.loss, a.recompute);  // a new graph: ids by name
    if (a.optimizer == "adamw") {
      std::map<int, int> grads;
      for (const auto& [p, d] : named) grads[g.find(p)] = g.find(d);
      graph::add_adamw(g, grads);
    } else if (a.optimizer != "none") {
      throw Error(fmt::format("--optimizer '{}': expected adamw or none", a.optimizer));
    }
  } else if (a.recompute != "none") {
    throw Error("--recompute needs --train (there is no backward pass to recompute for)");
  }
  if (!a.emit.empty()) graph::save(g, a.emit);
  const graph::FusionReport f = graph::fuse(g);
  graph::PlanOptions po;
  // With the optimizer in the graph its state is there too (masters and
  // moments are inputs); without, --train reserves AdamW's 12 bytes.
  const bool in_graph = a.train && a.optimizer == "adamw";
  po.optimizer_bytes_per_param =
      a.optimizer_bytes >= 0 ? a.optimizer_bytes : (a.train && !in_graph ? 12 : 0);
  graph::MemoryPlan plan = graph::plan_memory(g, f, po);
  const std::int64_t cap = chip.hbm_capacity.value();
  // Per-kernel time: every group the lowering handles, built for its shapes
  // and simulated in timing mode (no data).
  struct LaunchTime {
    std::string kernel, detail;
    double ns;
  };
  struct Estimate {
    int group;
    std::string kernel, detail;
    double ns;
    std::vector<LaunchTime> launches;  // the group's launches, in order
  };
  std::vector<Estimate> est;
  std::vector<std::pair<int, std::string>> unlowered;
  double est_total = 0;
  if (a.estimate) {
    graph::CompileOptions co;
    co.partial = true, co.cores = a.cores, co.lnc = a.lnc, co.fuse_mx = !a.mx_unfused;
    const graph::Executable exe = graph::compile(g, chip, co);
    sim::Simulator s(chip);
    sim::Options so;
    so.mode = sim::Mode::timing;
    // A progress line only on a terminal (a log gets no carriage returns).
    const bool progress = a.progress && !a.json && ::isatty(2);
    for (std::size_t i = 0; i < exe.launches.size(); ++i) {
      const graph::Launch& l = exe.launches[i];
      if (progress)
        std::fprintf(stderr, "\rsimulating kernel %zu of %zu", i + 1, exe.launches.size());
      s.load(l.program);
      const double ns = s.run(so).latency_ns;
      // Launches of one group add up under the group's kernel.
      const graph::KernelGroup& kg = exe.fusion.groups[static_cast<std::size_t>(l.group)];
      if (!est.empty() && est.back().group == l.group)
        est.back().ns += ns;
      else
        est.push_back({l.group, kg.kernel, kg.detail.empty() ? l.detail : kg.detail, ns, {}});
      est.back().launches.push_back({l.kernel, l.detail, ns});
      // The group's own kernel describes it (not the transposes before it).
      if (kg.detail.empty() && l.kernel == kg.kernel) est.back().detail = l.detail;
      est_total += ns;
    }
    if (progress) std::fprintf(stderr, "\r%40s\r", "");
    unlowered = exe.unlowered;
    plan.temp_peak = exe.plan.temp_peak, plan.temps_counted = true;
  }
  const bool fits = plan.total() <= cap;
  if (a.json) {
    nlohmann::json j;
    j["graph"] = g.name();
    j["arch"] = chip.name;
    j["ops"] = f.ops;
    j["fused_ops"] = f.fused;
    j["fusion_rate"] = f.rate();
    j["kernels"] = f.groups.size();
    j["params"] = plan.param_elements;
    j["hbm"] = {{"total_bytes", plan.total()},
                {"params_and_inputs_bytes", plan.persistent_bytes},
                {"activations_bytes", plan.arena_bytes - plan.persistent_bytes},
                {"peak_live_activations_bytes", plan.transient_peak},
                {"optimizer_bytes", plan.optimizer_bytes},
                {"between_launches_bytes",
                 plan.temps_counted ? nlohmann::json(plan.temp_peak) : nlohmann::json(nullptr)},
                {"capacity_bytes", cap},
                {"fits", fits}};
    nlohmann::json kernels = nlohmann::json::array(), unfused = nlohmann::json::array();
    for (const graph::KernelGroup& k : f.groups) {
      nlohmann::json ops = nlohmann::json::array();
      for (int n : k.nodes) {
        const graph::Node& node = g.node(n);
        const std::string v = g.value(node.outputs[0]).name;
        ops.push_back({{"op", graph::op_name(node.op)}, {"value", v}});
        if (!f.alone[static_cast<std::size_t>(n)].empty())
          unfused.push_back({{"op", graph::op_name(node.op)},
                             {"value", v},
                             {"reason", f.alone[static_cast<std::size_t>(n)]}});
      }
      kernels.push_back({{"kernel", k.kernel}, {"detail", k.detail}, {"ops", ops}});
    }
    j["kernel_list"] = kernels;
    j["unfused"] = unfused;
    if (a.estimate) {
      nlohmann::json e = nlohmann::json::array(), u = nlohmann::json::array();
      for (const Estimate& x : est) {
        nlohmann::json ls = nlohmann::json::array();
        for (const LaunchTime& t : x.launches)
          ls.push_back({{"kernel", t.kernel}, {"detail", t.detail}, {"ns", t.ns}});
        e.push_back({{"group", x.group},
                     {"kernel", x.kernel},
                     {"detail", x.detail},
                     {"ns", x.ns},
                     {"launches", ls}});
      }
      for (const auto& [gi, why] : unlowered) u.push_back({{"group", gi}, {"reason", why}});
      j["estimate"] = {{"total_ns", est_total}, {"kernels", e}, {"not_lowered", u}};
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("graph %s: %d ops in %zu kernels, fusion rate %.3f; %lld parameters\n",
                g.name().c_str(), f.ops, f.groups.size(), f.rate(),
                static_cast<long long>(plan.param_elements));
    if (a.report) std::printf("\n%s\n", graph::fusion_table(g, f).c_str());
    std::printf("%s", graph::plan_table(g, plan, a.report ? 10 : 3).c_str());
    std::printf("fits %s (%s HBM): %s\n", chip.name.c_str(), graph::bytes_string(cap).c_str(),
                fits ? "yes" : "no");
    if (a.estimate) {
      std::vector<Estimate> top = est;
      std::sort(top.begin(), top.end(),
                [](const Estimate& x, const Estimate& y) { return x.ns > y.ns; });
      const std::string missing = unlowered.empty()
                                      ? "every kernel lowered"
                                      : fmt::format(
                                            "{} kernels not lowered yet; --json lists them with "
                                            "the reason",
                                            unlowered.size());
      std::printf("\nsimulated time of the %zu lowered kernels: %.1f us (%s)\n", est.size(),
                  est_total / 1e3, missing.c_str());
      std::printf("  %-6s %-16s %-28s %12s\n", "group", "kernel", "detail", "us");
      for (std::size_t i = 0; i < std::min<std::size_t>(a.report ? 20 : 5, top.size()); ++i)
        std::printf("  %-6d %-16s %-28s %12.2f\n", top[i].group, top[i].kernel.c_str(),
                    top[i].detail.substr(0, 28).c_str(), top[i].ns / 1e3);
      // Where the time goes by launched kernel (a group may launch several:
      // transposes and quantization before a quantized matmul, ...).
      std::map<std::string, std::pair<double, int>> by;
      for (const Estimate& x : est)
        for (const LaunchTime& t : x.launches) {
          auto& [ns, n] = by[t.kernel];
          ns += t.ns, ++n;
        }
      std::vector<std::pair<std::string, std::pair<double, int>>> rows(by.begin(), by.end());
      std::sort(rows.begin(), rows.end(),
                [](const auto& x, const auto& y) { return x.second.first > y.second.first; });
      std::printf("  by launched kernel:\n  %-22s %8s %12s %7s\n", "kernel", "launches", "us",
                  "share");
      for (const auto& [k, v] : rows)
        std::printf("  %-22s %8d %12.2f %6.1f%%\n", k.c_str(), v.second, v.first / 1e3,
                    100.0 * v.first / est_total);
    }
    if (!a.emit.empty()) std::printf("graph written to %s\n", a.emit.c_str());
  }
  graph::check_fits(g, plan, cap, fmt::format("{} ({})", chip.name, graph::bytes_string(cap)));
}

}  // namespace

void add_compile_command(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "compile",
      "Compile a graph: autodiff (--train), operator fusion and the HBM plan, with reports");
  cmd->add_option("graph", a->file, "Graph file (.tgraph text form; docs/graph.md)");
  one_of(cmd->add_option("--model", a->model, "A built-in model instead of a file: gpt2 or llama"),
         {"gpt2", "llama"});
  int_range(cmd->add_option("--layers", a->layers, "Built-in model: layers")->capture_default_str(),
            1, 4096);
  int_range(cmd->add_option("--dim", a->dim, "Built-in model: hidden size")->capture_default_str(),
            1, 1 << 20);
  int_range(cmd->add_option("--heads", a->heads, "Built-in model: attention heads")
                ->capture_default_str(),
            1, 4096);
  int_range(cmd->add_option("--kv-heads", a->kv_heads, "llama: kv heads (default: --heads)"), 0,
            4096);
  int_range(cmd->add_option("--ffn", a->ffn, "llama: feed-forward size (default: 4 x --dim)"), 0,
            1 << 22);
  int_range(
      cmd->add_option("--vocab", a->vocab, "Built-in model: vocabulary")->capture_default_str(), 1,
      1 << 24);
  int_range(
      cmd->add_option("--seq", a->seq, "Built-in model: sequence length")->capture_default_str(), 1,
      1 << 24);
  int_range(
      cmd->add_option("--batch", a->batch, "Built-in model: micro-batch")->capture_default_str(), 1,
      1 << 20);
  cmd->add_option("--dtype", a->dtype, "Built-in model: weights and activations dtype")
      ->capture_default_str();
  cmd->add_flag("--train", a->train,
                "Add the backward pass: gradients of the scalar output for every param");
  one_of(
      cmd->add_option("--optimizer", a->optimizer,
                      "With --train: adamw (the AdamW step in the graph: FP32 masters and moments "
                      "as inputs, updates carried into them) or none (forward and backward only)")
          ->capture_default_str(),
      {"adamw", "none"});
  int_range(
      cmd->add_option("--optimizer-bytes", a->optimizer_bytes,
                      "Extra optimizer state per parameter in the fit check (default 0; 12 with "
                      "--train --optimizer none: AdamW's FP32 master, m, v)"),
      0, 1024);
  one_of(cmd->add_option(
                "--autocast", a->autocast,
                "Precision policy: none, matmult (matmuls and attention in --autocast-type), "
                "all (all but norms, softmax, cross-entropy, embedding), or a recipe: bf16, "
                "fp8-hybrid (E4M3 forward, E5M2 gradients, per-tensor current scaling), mxfp8 "
                "(MX blocks of 32, --mx-policy scales), mxfp4 (MXFP4 weights, MXFP8 the rest); "
                "recipes keep the LM head, norms, softmax and embeddings in BF16")
             ->capture_default_str(),
         {"none", "matmult", "all", "bf16", "fp8-hybrid", "mxfp8", "mxfp4"});
  one_of(cmd->add_option(
                "--autocast-type", a->autocast_type,
                "With matmult / all: bf16, fp16 or fp8_e4m3 (matmul operands per-tensor E4M3, "
                "current scaling)")
             ->capture_default_str(),
         {"bf16", "fp16", "fp8_e4m3"});
  one_of(cmd->add_option(
                "--fp8-scaling", a->fp8_scaling,
                "Per-tensor FP8 scales (fp8-hybrid, fp8_e4m3): current (from this step's amax) "
                "or delayed (from an amax history of earlier steps, kept by the runtime)")
             ->capture_default_str(),
         {"current", "delayed"});
  int_range(
      cmd->add_option("--amax-history", a->amax_history, "Delayed scaling's amax history length")
          ->capture_default_str(),
      1, 1 << 20);
  one_of(cmd->add_option("--mx-policy", a->mx_policy,
                         "MX scale policy of the mx recipes: rceil, trn3 "
                         "(QuantizeMX on chip) or ocp-floor")
             ->capture_default_str(),
         {"rceil", "trn3", "ocp-floor"});
  one_of(cmd->add_option("--recompute", a->recompute,
                         "Activation recomputation with --train: none or selective (cheap ops "
                         "recomputed before the backward reads them)")
             ->capture_default_str(),
         {"none", "selective"});
  cmd->add_option("--arch", a->arch, "Chip whose HBM must hold the plan")->capture_default_str();
  int_range(
      cmd->add_option("--cores", a->cores,
                      "--estimate: physical NeuronCores each kernel uses (0: all of the chip's)")
          ->capture_default_str(),
      0, 1024);
  int_range(
      cmd->add_option("--lnc", a->lnc,
                      "--estimate: logical NeuronCore setting, 1 or 2 (2 pairs the cores for the "
                      "matmuls; NeuronCore-v3+)")
          ->capture_default_str(),
      1, 2);
  cmd->add_flag("--mx-unfused", a->mx_unfused,
                "--estimate: quantize MX operands inside every matmul (after Tensor-engine "
                "transposes) instead of once per step, the baseline of the fused lowering "
                "(same bits)");
  output_file(
      cmd->add_option("--emit", a->emit, "Write the compiled graph's text form to this file"));
  cmd->add_flag("--report", a->report,
                "Print the fusion report (each op, its kernel, why an op runs alone), the largest "
                "tensors and the per-kernel time estimate (--estimate)");
  cmd->add_flag("--estimate", a->estimate,
                "Simulate every lowered kernel (timing only) and print the per-kernel times");
  cmd->add_flag("!--no-progress", a->progress, "No progress line on stderr");
  cmd->add_flag("--json", a->json, "Print the results as JSON");
  cmd->callback([a] { run(*a); });
}

}  // namespace tern::cli
