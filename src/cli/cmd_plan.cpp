// `tern plan`: the cluster planner. One layout's step time, memory and MFU
// (`tern plan`), the best layouts (`plan search`), several systems side by
// side (`plan compare`) and the check against published measurements
// (`plan validate`). docs/plan.md describes the model.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "arch/system.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "cli/table.h"
#include "fabric/network.h"
#include "plan/estimate.h"
#include "plan/request.h"
#include "plan/search.h"
#include "util/error.h"

namespace tern::cli {

using nlohmann::json;
using plan::Estimate;
using plan::kMaxChips;
using plan::Layout;

namespace {

// Flags shared by every plan command: a request file first, then every
// flag given on top of it (an unset optional: not given).
struct PlanArgs {
  std::string config;
  std::optional<std::string> model, system;
  std::optional<int> chips, lnc;
  // training
  std::optional<std::int64_t> global_batch;
  std::optional<int> micro_batch;
  std::optional<double> tokens, dp_overlap, tp_overlap, price;
  std::optional<std::string> recipe, attention;
  // layout
  std::optional<int> dp, tp, pp, vpp, ep, cp, zero;
  std::optional<std::string> sp, recompute, order;
  bool json = false;
};

constexpr const char* kDefaultModel = "llama3-8b";
constexpr const char* kDefaultSystem = "trn3-ultraserver-gen2";

void add_request_flags(CLI::App& c, PlanArgs& a, bool layout) {
  c.add_option(
      "--config", a.config,
      "Request file (.toml or .json): [model] [training] [system] [layout]; flags override it");
  c.add_option(
      "--model", a.model,
      fmt::format("Model preset (data/plan/models) or a .toml file [default: {}]", kDefaultModel));
  c.add_option("--system", a.system,
               fmt::format("System (tern info --list) [default: {}]", kDefaultSystem));
  int_range(c.add_option("--chips", a.chips, "Chips (default: one system)"), 1, kMaxChips);
  int_range(c.add_option("--lnc", a.lnc,
                         "Logical NeuronCore degree (Trainium2/3: 1 or 2; default: the chip's, 2 "
                         "there, 1 on trn1); layouts count these logical cores"),
            1, 2);
  int_range(c.add_option("--global-batch", a.global_batch,
                         "Sequences per step (default: about 16M tokens, a power of two per chip)"),
            1, 1LL << 40);
  int_range(c.add_option("--micro-batch", a.micro_batch, "Sequences per micro-batch (default 1)"),
            1, 1 << 20);
  number_range(
      c.add_option("--tokens", a.tokens, "Tokens to train, for time and cost to train (e.g. 1e12)"),
      0, 1e20);
  one_of(c.add_option("--recipe", a.recipe, "GEMM precision: bf16, fp8, mxfp8 (default bf16)"),
         {"bf16", "fp8", "mxfp8"});
  one_of(
      c.add_option("--attention", a.attention, "flash (default) or unfused (scores through HBM)"),
      {"flash", "unfused"});
  number_range(c.add_option("--dp-overlap", a.dp_overlap,
                            "Fraction of the last backward that hides DP traffic (default 1)"),
               0, 1);
  number_range(
      c.add_option("--tp-overlap", a.tp_overlap, "Fraction of TP traffic hidden (default 0)"), 0,
      1);
  number_range(c.add_option("--price", a.price, "USD per chip-hour, for cost"), 0, 1e9);
  if (layout) {
    int_range(c.add_option("--dp", a.dp,
                           "Data parallel (default: what the other dims leave). Degrees count "
                           "ranks: chips, or on Trainium (logical) NeuronCores"),
              1, kMaxChips);
    int_range(c.add_option("--tp", a.tp, "Tensor parallel"), 1, kMaxChips);
    int_range(c.add_option("--pp", a.pp, "Pipeline stages"), 1, kMaxChips);
    int_range(c.add_option("--vpp", a.vpp, "Interleaved model chunks per device"), 1, 1024);
    int_range(c.add_option("--ep", a.ep, "Expert parallel (within dp)"), 1, kMaxChips);
    int_range(c.add_option("--cp", a.cp, "Context parallel"), 1, kMaxChips);
    one_of(
        c.add_option("--sp", a.sp, "Sequence parallel: true or false (default: true when tp > 1)"),
        {"true", "false"});
    int_range(c.add_option("--zero", a.zero, "ZeRO stage 0-3"), 0, 3);
    one_of(c.add_option("--recompute", a.recompute, "Activation recompute: none, selective, full"),
           {"none", "selective", "full"});
    c.add_option("--order", a.order, "Rank order, innermost first (default tp-cp-dp-pp)");
  }
  c.add_flag("--json", a.json, "Print JSON");
}

plan::Request build_request(const PlanArgs& a, bool layout) {
  plan::Request r;
  r.training.global_batch = 0;  // default below: about 16M tokens
  bool file_model = false;
  if (!a.config.empty()) {
    const auto tree = plan::read_tree(a.config);
    file_model = tree.is_object() && tree.contains("model");
    plan::apply(tree, a.config, r);
  }
  // A model named on the command line replaces the file's.
  if (a.model) {
    r.model = plan::load_model(*a.model);
  } else if (!file_model) {
    r.model = plan::load_model(kDefaultModel);
  }
  if (a.system) r.system = *a.system;
  if (r.system.empty()) r.system = kDefaultSystem;
  plan::Training& t = r.training;
  if (a.global_batch) t.global_batch = *a.global_batch;
  if (a.micro_batch) t.micro_batch = *a.micro_batch;
  if (a.tokens) t.tokens = *a.tokens;
  if (a.recipe) t.recipe = *a.recipe;
  if (a.attention) t.attention = *a.attention;
  if (a.dp_overlap) t.dp_overlap = *a.dp_overlap;
  if (a.tp_overlap) t.tp_overlap = *a.tp_overlap;
  if (a.price) t.price_per_chip_hour = *a.price;
  if (a.chips) r.chips = *a.chips;
  if (r.chips == 0) r.chips = arch::load_system(r.system).chips;
  if (r.chips < 1) throw Error(fmt::format("--chips must be positive (got {})", r.chips));
  if (a.lnc) r.lnc = *a.lnc;
  if (t.global_batch == 0) {
    // About 16 Mi tokens a step (Llama 3's pre-training batch), as a power
    // of two of sequences per chip, at least one.
    const double per_chip = (16.0 * (1 << 20)) / (static_cast<double>(r.model.seq) * r.chips);
    const double pow2 = std::exp2(std::round(std::log2(std::max(per_chip, 1.0))));
    t.global_batch = static_cast<std::int64_t>(pow2) * r.chips;
  }
  if (!layout) return r;
  const bool from_file = r.layout.has_value();
  Layout l = r.layout.value_or(Layout{});
  if (!from_file) l.dp = 0;
  if (a.tp) l.tp = *a.tp;
  if (a.pp) l.pp = *a.pp;
  if (a.vpp) l.vpp = *a.vpp;
  if (a.ep) l.ep = *a.ep;
  if (a.cp) l.cp = *a.cp;
  if (a.zero) l.zero = *a.zero;
  if (a.micro_batch) l.micro_batch = 0;  // the flag beats the file's [layout]
  if (a.recompute) l.recompute = plan::parse_recompute(*a.recompute);
  if (a.order) l.order = plan::parse_order(*a.order);
  if (a.dp) l.dp = *a.dp;
  if (l.dp == 0 && l.tp > 0 && l.pp > 0 && l.cp > 0) {
    const std::int64_t rest = static_cast<std::int64_t>(l.tp) * l.pp * l.cp;
    const std::int64_t ranks =
        std::int64_t{r.chips} * arch::load_system(r.system).ranks_per_chip(r.lnc);
    if (ranks % rest != 0) {
      throw Error(fmt::format("layout: tp {} x pp {} x cp {} = {} ranks {} the {} ranks given",
                              l.tp, l.pp, l.cp, rest,
                              rest > ranks ? "is more than" : "does not divide", ranks));
    }
    l.dp = static_cast<int>(ranks / rest);
  }
  if (a.sp) {
    if (*a.sp != "true" && *a.sp != "false") throw Error("--sp must be true or false");
    l.sp = *a.sp == "true";
  } else if (!r.sp_given) {
    l.sp = l.tp > 1;  // Megatron's default with tensor parallelism
  }
  r.layout = l;
  return r;
}

std::string ms(Nanoseconds t) {
  return fmt::format("{:.1f}", t.value() / 1e6);
}
std::string gib(Bytes b) {
  return fmt::format("{:.1f}", static_cast<double>(b.value()) / kGiB);
}
std::string layout_text(const Layout& l) {
  std::string s = fmt::format("dp{} tp{} pp{}", l.dp, l.tp, l.pp);
  if (l.vpp > 1) s += fmt::format(" vpp{}", l.vpp);
  if (l.cp > 1) s += fmt::format(" cp{}", l.cp);
  if (l.ep > 1) s += fmt::format(" ep{}", l.ep);
  if (l.sp) s += " sp";
  s += fmt::format(" z{} mb{} {}", l.zero, l.micro_batch, plan::recompute_name(l.recompute));
  return s;
}

json layout_json(const Layout& l) {
  return {{"dp", l.dp},
          {"tp", l.tp},
          {"pp", l.pp},
          {"vpp", l.vpp},
          {"ep", l.ep},
          {"cp", l.cp},
          {"sp", l.sp},
          {"zero", l.zero},
          {"micro_batch", l.micro_batch},
          {"recompute", plan::recompute_name(l.recompute)},
          {"order", fmt::format("{}", fmt::join(l.order, "-"))}};
}

json estimate_json(const Estimate& e) {
  const auto& t = e.time;
  const auto& m = e.memory;
  const auto v = [](Nanoseconds x) { return x.value() / 1e6; };
  const auto g = [](Bytes b) { return static_cast<double>(b.value()) / kGiB; };
  return {{"layout", layout_json(e.layout)},
          {"step_ms", v(t.step)},
          {"time_ms",
           {{"forward", v(t.forward)},
            {"backward", v(t.backward)},
            {"recompute", v(t.recompute)},
            {"tp_comm", v(t.tp_comm)},
            {"cp_comm", v(t.cp_comm)},
            {"ep_all_to_all", v(t.ep_comm)},
            {"pp_p2p", v(t.pp_p2p)},
            {"pp_bubble", v(t.pp_bubble)},
            {"dp_exposed", v(t.dp_exposed)},
            {"optimizer", v(t.optimizer)},
            {"dp_total", v(t.dp_total)}}},
          {"algorithms", {{"tp", t.tp_algorithm}, {"dp", t.dp_algorithm}}},
          {"memory_gib",
           {{"weights", g(m.weights)},
            {"grads", g(m.grads)},
            {"optimizer", g(m.optimizer)},
            {"activations", g(m.activations)},
            {"logits", g(m.logits)},
            {"total", g(m.total)},
            {"usable", g(m.usable)},
            {"fits", m.fits}}},
          {"micro_batches", e.micro_batches},
          {"tokens_per_s", e.tokens_per_s},
          {"model_flops_per_token", e.model_flops_per_token},
          {"mfu", e.mfu},
          {"hfu", e.hfu},
          {"mfu_bf16_peak", e.mfu_bf16},
          {"days_to_train", e.days_to_train},
          {"chip_hours", e.chip_hours},
          {"cost_usd", e.cost_usd}};
}

std::string estimate_text(const plan::Planner& p, const Estimate& e) {
  const auto& t = e.time;
  const std::string ranks =
      p.ranks_per_chip() == 1
          ? std::string()
          : fmt::format(" = {} ranks ({} {} cores per chip{})", p.ranks(), p.ranks_per_chip(),
                        p.lnc() > 1 ? "logical" : "physical",
                        p.lnc() > 1 ? fmt::format(", lnc {}", p.lnc()) : "");
  std::string out = fmt::format(
      "{} on {} x {}{} ({}), {} recipe, global batch {} x {} tokens\nlayout: {}\n\n",
      p.model().name, p.chips(), p.system().device.name, ranks, p.system().name,
      p.training().recipe, p.training().global_batch, p.model().seq, layout_text(e.layout));
  Table tt({"step time", "ms", "%"});
  const double step = t.step.value();
  for (auto [name, v] : {std::pair{"forward", t.forward},
                         {"backward", t.backward},
                         {"recompute", t.recompute},
                         {"TP comm", t.tp_comm},
                         {"CP comm", t.cp_comm},
                         {"EP all-to-all", t.ep_comm},
                         {"PP send/recv", t.pp_p2p},
                         {"PP bubble", t.pp_bubble},
                         {"DP comm (exposed)", t.dp_exposed},
                         {"optimizer", t.optimizer}}) {
    tt.add({name, ms(v), fmt::format("{:.1f}", 100 * v.value() / step)});
  }
  tt.add({"step", ms(t.step), "100.0"});
  out += tt.render();
  if (!t.tp_algorithm.empty() || !t.dp_algorithm.empty()) {
    out += fmt::format("collectives: TP {}, DP {} (DP total {} ms)\n",
                       t.tp_algorithm.empty() ? "-" : t.tp_algorithm,
                       t.dp_algorithm.empty() ? "-" : t.dp_algorithm, ms(t.dp_total));
  }
  const auto& m = e.memory;
  Table mt({p.ranks_per_chip() == 1 ? "memory per chip" : "memory per rank", "GiB"});
  for (auto [name, v] : {std::pair{"weights", m.weights},
                         {"gradients", m.grads},
                         {"optimizer state", m.optimizer},
                         {"activations", m.activations},
                         {"logits", m.logits},
                         {"total", m.total}}) {
    mt.add({name, gib(v)});
  }
  mt.add({"usable HBM", gib(m.usable)});
  out += "\n" + mt.render();
  out += fmt::format("{}\n\n", m.fits ? "fits" : "DOES NOT FIT in HBM");
  out +=
      fmt::format("{} micro-batches per step; {:.0f} tokens/s\n", e.micro_batches, e.tokens_per_s);
  out += fmt::format("MFU {:.1f} % (HFU {:.1f} %) of the {} peak; {:.1f} % of BF16 peak\n",
                     100 * e.mfu, 100 * e.hfu, p.training().recipe, 100 * e.mfu_bf16);
  out += fmt::format("compute efficiency: {}\n", p.compute().source());
  out += fmt::format(
      "  MFU = tokens/s x (6 N + 12 L h s) / (chips x chip peak), N = {:.3g} (of {:.3g} "
      "parameters)\n",
      p.flop_params(), p.params());
  if (e.days_to_train > 0) {
    out += fmt::format("to train {:.3g} tokens: {:.1f} days, {:.3g} chip-hours",
                       p.training().tokens, e.days_to_train, e.chip_hours);
    if (e.cost_usd > 0) out += fmt::format(", ${:.3g}", e.cost_usd);
    out += "\n";
  }
  return out;
}

plan::Planner make_planner(const plan::Request& r) {
  return plan::Planner(arch::load_system(r.system), r.model, r.training, r.chips, r.lnc);
}

// Chip counts of `s` that form a network (whole systems over scale-out, or
// a part of one), at most `most`, largest first.
std::vector<int> chip_counts(const arch::SystemSpec& s, double most) {
  std::vector<int> out;
  most = std::min(most, static_cast<double>(kMaxChips));
  const double whole = std::floor(most / s.chips);
  if (s.scale_out) {
    for (double k = whole; k >= 1; --k) out.push_back(static_cast<int>(k) * s.chips);
  } else if (whole >= 1) {
    out.push_back(s.chips);
  }
  for (int c = std::min(s.chips - 1, static_cast<int>(most)); c >= 1; --c) {
    try {
      fabric::Network::of(s, c);
      out.push_back(c);
    } catch (const Error&) {
    }
  }
  return out;
}

// The search's ranking; the last column names the layouts that are the
// same plan (equal step time and memory) as the row's.
Table ranking_table() {
  Table t({"#", "layout", "step ms", "tokens/s", "MFU %", "memory GiB", "bubble %",
           "exposed comm %", "same plan as"});
  t.set_align_right({false, false, true, true, true, true, true, true, false});
  return t;
}
void ranking_row(Table& t, int i, const Estimate& e, const std::string& same) {
  const double step = e.time.step.value();
  const double comm =
      (e.time.tp_comm + e.time.cp_comm + e.time.ep_comm + e.time.pp_p2p + e.time.dp_exposed)
          .value();
  t.add({std::to_string(i), layout_text(e.layout), ms(e.time.step),
         fmt::format("{:.0f}", e.tokens_per_s), fmt::format("{:.1f}", 100 * e.mfu),
         gib(e.memory.total), fmt::format("{:.1f}", 100 * e.time.pp_bubble.value() / step),
         fmt::format("{:.1f}", 100 * comm / step), same});
}

}  // namespace

void add_validate_command(CLI::App& plan_cmd);

namespace {

// "64K", "4M", "1G" (binary multiples) or a plain byte count.
std::int64_t parse_size(const std::string& text) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw Error(fmt::format("--bytes: '{}' is not a size (e.g. 4096, 64K, 4M, 1G)", text));
  }
  const std::string unit = text.substr(used);
  double k = 1;
  if (unit == "K" || unit == "KiB")
    k = kKiB;
  else if (unit == "M" || unit == "MiB")
    k = kMiB;
  else if (unit == "G" || unit == "GiB")
    k = kGiB;
  else if (!unit.empty())
    throw Error(fmt::format("--bytes: unknown unit in '{}' (K, M, G)", text));
  if (!(v > 0)) throw Error(fmt::format("--bytes: '{}' is not a positive size", text));
  return static_cast<std::int64_t>(v * k);
}

std::string size_text(std::int64_t b) {
  if (b >= kGiB && b % kGiB == 0) return fmt::format("{} GiB", b / kGiB);
  if (b >= kMiB && b % kMiB == 0) return fmt::format("{} MiB", b / kMiB);
  if (b >= kKiB && b % kKiB == 0) return fmt::format("{} KiB", b / kKiB);
  return fmt::format("{} B", b);
}

// `tern plan collective`: one collective's time on a system's fabric, by
// size and algorithm, with nccl-tests' algorithm and bus bandwidths.
void add_collective_command(CLI::App& plan_cmd) {
  auto* c = plan_cmd.add_subcommand(
      "collective", "Time a collective on a system's fabric: every algorithm, by size");
  struct Opts {
    std::string system = kDefaultSystem, op = "all-reduce";
    int chips = 0, ranks = 0, stride = 1;
    std::vector<std::string> bytes = {"64K", "1M", "16M", "256M", "1G"};
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  c->add_option("--system", o->system, "System (tern info --list)")->capture_default_str();
  int_range(c->add_option("--chips", o->chips, "Chips of the network (default: one system)"), 1,
            kMaxChips);
  one_of(
      c->add_option("--op", o->op, "all-reduce, all-gather, reduce-scatter, all-to-all, send-recv")
          ->capture_default_str(),
      {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv"});
  int_range(c->add_option("--ranks", o->ranks, "Group size (default: every chip; send-recv: 2)"), 2,
            kMaxChips);
  int_range(c->add_option("--stride", o->stride,
                          "Chips between consecutive ranks (1: a contiguous group)")
                ->capture_default_str(),
            1, kMaxChips);
  c->add_option("--bytes", o->bytes, "Sizes (all-reduce: the buffer; all-gather: the result; ...)")
      ->delimiter(',')
      ->capture_default_str();
  c->add_flag("--json", o->json, "Print JSON");
  c->callback([o] {
    const auto spec = arch::load_system(o->system);
    const fabric::Network net = fabric::Network::of(spec, o->chips ? o->chips : spec.chips);
    fabric::Op op = fabric::Op::all_reduce;
    bool known = false;
    for (fabric::Op x : {fabric::Op::all_reduce, fabric::Op::all_gather, fabric::Op::reduce_scatter,
                         fabric::Op::all_to_all, fabric::Op::send_recv}) {
      std::string name(fabric::op_name(x));
      std::replace(name.begin(), name.end(), '/', '-');
      if (name == o->op) op = x, known = true;
    }
    if (!known) {
      throw Error(
          fmt::format("--op '{}' is not one of all-reduce, all-gather, reduce-scatter, "
                      "all-to-all, send-recv",
                      o->op));
    }
    const int ranks = o->ranks ? o->ranks : (op == fabric::Op::send_recv ? 2 : net.chips());
    if (ranks < 1 || o->stride < 1 ||
        static_cast<std::int64_t>(ranks - 1) * o->stride >= net.chips()) {
      throw Error(fmt::format("--ranks {} x --stride {} does not fit {} chips", ranks, o->stride,
                              net.chips()));
    }
    std::vector<int> members;
    for (int i = 0; i < ranks; ++i) members.push_back(i * o->stride);
    const fabric::Group group = fabric::placement(net, members);
    const double p = ranks;
    // nccl-tests: bus bandwidth = algorithm bandwidth x 2 (p-1)/p for
    // all-reduce, (p-1)/p for gathers, scatters and all-to-all, 1 for send.
    const double bus = op == fabric::Op::all_reduce  ? 2 * (p - 1) / p
                       : op == fabric::Op::send_recv ? 1
                                                     : (p - 1) / p;
    std::vector<std::string> head = {"size", "best", "time us", "algbw GB/s", "busbw GB/s"};
    for (fabric::Algorithm a : fabric::kAlgorithms)
      head.push_back(std::string(fabric::algorithm_name(a)) + " us");
    Table t(head);
    json rows = json::array();
    for (const auto& text : o->bytes) {
      const std::int64_t n = parse_size(text);
      const fabric::Collective coll{op, Bytes(n), group};
      const fabric::Cost best = fabric::best(net, coll);
      std::vector<std::string> row = {size_text(n),
                                      std::string(fabric::algorithm_name(best.algorithm)),
                                      fmt::format("{:.2f}", best.time.value() / 1e3)};
      const double algbw = static_cast<double>(n) / best.time.value();
      row.push_back(fmt::format("{:.1f}", algbw));
      row.push_back(fmt::format("{:.1f}", algbw * bus));
      json per = json::object();
      for (fabric::Algorithm a : fabric::kAlgorithms) {
        try {
          const double us = fabric::time(net, coll, a).value() / 1e3;
          row.push_back(fmt::format("{:.2f}", us));
          per[std::string(fabric::algorithm_name(a))] = us;
        } catch (const NotSupported&) {
          row.push_back("-");
        }
      }
      t.add(row);
      rows.push_back({{"bytes", n},
                      {"best", fabric::algorithm_name(best.algorithm)},
                      {"time_us", best.time.value() / 1e3},
                      {"algbw_gbps", algbw},
                      {"busbw_gbps", algbw * bus},
                      {"algorithms_us", per}});
    }
    if (o->json) {
      std::puts(json{{"system", spec.name},
                     {"chips", net.chips()},
                     {"op", o->op},
                     {"ranks", ranks},
                     {"stride", o->stride},
                     {"span", group.span},
                     {"rows", rows}}
                    .dump(2)
                    .c_str());
      return;
    }
    std::printf("%s on %d chips of %s: %d ranks, stride %d, spans [%s] over the levels [%s]\n\n",
                o->op.c_str(), net.chips(), spec.name.c_str(), ranks, o->stride,
                fmt::format("{}", fmt::join(group.span, ", ")).c_str(),
                [&] {
                  std::string out;
                  for (const auto& l : net.levels()) out += (out.empty() ? "" : ", ") + l.name;
                  return out;
                }()
                    .c_str());
    std::fputs(t.render().c_str(), stdout);
    std::puts("\n'-': the algorithm does not apply here (topology, group size, or the library).");
  });
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan",
                                 "Cluster planner: step time, memory and MFU of a layout; search, "
                                 "compare, validate, collective");
  auto a = std::make_shared<PlanArgs>();
  add_request_flags(*cmd, *a, true);
  cmd->callback([cmd, a] {
    if (!cmd->get_subcommands().empty()) return;
    const auto r = build_request(*a, true);
    const auto p = make_planner(r);
    const Estimate e = p.estimate(*r.layout);
    json j = estimate_json(e);
    j["model"] = {{"name", p.model().name},
                  {"params", p.params()},
                  {"flop_params", p.flop_params()},
                  {"layers", p.model().layers},
                  {"hidden", p.model().hidden}};
    j["system"] = p.system().name;
    j["chips"] = p.chips();
    j["lnc"] = p.lnc();
    j["ranks_per_chip"] = p.ranks_per_chip();
    j["ranks"] = p.ranks();
    j["efficiency_source"] = p.compute().source();
    j["training"] = {
        {"global_batch", p.training().global_batch},
        {"micro_batch", e.layout.micro_batch > 0 ? e.layout.micro_batch : p.training().micro_batch},
        {"recipe", p.training().recipe}};
    std::fputs(a->json ? (j.dump(2) + "\n").c_str() : estimate_text(p, e).c_str(), stdout);
  });

  auto* s =
      cmd->add_subcommand("search", "Every valid layout evaluated; the best that fit HBM, ranked");
  auto sa = std::make_shared<PlanArgs>();
  auto top = std::make_shared<int>(10);
  add_request_flags(*s, *sa, false);
  int_range(s->add_option("--top", *top, "How many to list")->capture_default_str(), 1, 1 << 20);
  s->callback([sa, top] {
    const auto r = build_request(*sa, false);
    const auto p = make_planner(r);
    plan::SearchOptions o;
    o.top = *top;
    const auto t0 = std::chrono::steady_clock::now();
    const auto res = plan::search(p, o);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (sa->json) {
      json j = {{"model", p.model().name},
                {"system", p.system().name},
                {"chips", p.chips()},
                {"ranks", p.ranks()},
                {"evaluated", res.evaluated},
                {"fitting", res.fitting},
                {"seconds", secs},
                {"layouts_per_second", static_cast<double>(res.evaluated) / std::max(secs, 1e-9)},
                {"best", json::array()}};
      for (std::size_t k = 0; k < res.best.size(); ++k) {
        json e = estimate_json(res.best[k]);
        e["same_plan"] = json::array();
        for (const Layout& l : res.alternatives[k]) e["same_plan"].push_back(layout_json(l));
        j["best"].push_back(std::move(e));
      }
      std::puts(j.dump(2).c_str());
      return;
    }
    std::printf(
        "%s on %d x %s (%s): %lld layouts evaluated in %.3f s (%.0f per second), %lld fit HBM\n\n",
        p.model().name.c_str(), p.chips(), p.system().device.name.c_str(), p.system().name.c_str(),
        static_cast<long long>(res.evaluated), secs,
        static_cast<double>(res.evaluated) / std::max(secs, 1e-9),
        static_cast<long long>(res.fitting));
    if (res.evaluated == 0) {
      throw Error(
          fmt::format("no valid layout: no tp / pp / cp / micro-batch split of {} chips "
                      "divides the model and a batch of {}",
                      p.chips(), p.training().global_batch));
    }
    if (res.best.empty()) {
      throw Error(
          fmt::format("none of the {} valid layouts fits HBM: try more chips or a smaller "
                      "micro-batch",
                      res.evaluated));
    }
    Table t = ranking_table();
    int i = 0;
    for (std::size_t k = 0; k < res.best.size(); ++k) {
      std::string same;
      for (const Layout& l : res.alternatives[k])
        same += (same.empty() ? "" : "; ") + layout_text(l);
      ranking_row(t, ++i, res.best[k], same);
    }
    std::fputs(t.render().c_str(), stdout);
    std::printf("\nThe best layout:\n\n%s", estimate_text(p, res.best.front()).c_str());
  });

  auto* c =
      cmd->add_subcommand("compare", "The same model on several systems: each one's best layout");
  auto ca = std::make_shared<PlanArgs>();
  auto systems = std::make_shared<std::vector<std::string>>(
      std::vector<std::string>{"trn3-ultraserver-gen2", "gb300-nvl72", "p5"});
  auto prices = std::make_shared<std::vector<double>>();
  auto budget = std::make_shared<double>(0);
  add_request_flags(*c, *ca, false);
  c->add_option("--systems", *systems, "Systems to compare")->delimiter(',')->capture_default_str();
  number_range(c->add_option("--prices", *prices, "USD per chip-hour of each system, in order")
                   ->delimiter(','),
               0.000001, 1e9);
  number_range(
      c->add_option(
          "--budget", *budget,
          "USD per hour: each system gets the most chips it can form for it (needs --prices)"),
      0, 1e12);
  c->callback([ca, systems, prices, budget] {
    if (!prices->empty() && prices->size() != systems->size()) {
      throw Error(
          fmt::format("--prices gives {} prices for {} systems", prices->size(), systems->size()));
    }
    if (*budget > 0 && prices->empty()) throw Error("--budget needs --prices");
    for (double price : *prices) {
      if (!(price > 0)) throw Error(fmt::format("--prices: {} is not a positive price", price));
    }
    if (*budget > 0 && ca->chips)
      throw Error("give --chips (equal chips) or --budget (equal cost), not both");
    // Equal chips by default: the first system's size.
    if (*budget <= 0 && !ca->chips) ca->chips = arch::load_system(systems->front()).chips;
    if (!ca->global_batch) ca->global_batch = 1152;  // divisible by 2^7 x 9: most dp sizes
    json j = json::array();
    Table t({"system", "chips", "best layout", "step ms", "tokens/s", "MFU %", "memory GiB",
             "$ per 1M tokens"});
    for (std::size_t i = 0; i < systems->size(); ++i) {
      PlanArgs one = *ca;
      one.system = (*systems)[i];
      if (!prices->empty()) one.price = (*prices)[i];
      std::vector<int> counts{0};  // 0: --chips as given
      if (*budget > 0) {
        const auto sys = arch::load_system(*one.system);
        counts = chip_counts(sys, *budget / *one.price);
        if (counts.empty()) {
          throw Error(fmt::format("a budget of ${}/h buys less than one chip of {} at ${}/h",
                                  *budget, *one.system, *one.price));
        }
      }
      // Equal cost: the most chips the budget buys for which some layout
      // divides the batch and fits HBM (trying at most 32 counts).
      std::optional<plan::Planner> p;
      plan::SearchResult res;
      for (std::size_t k = 0; k < std::min<std::size_t>(counts.size(), 32); ++k) {
        if (counts[k]) one.chips = counts[k];
        p.emplace(make_planner(build_request(one, false)));
        res = plan::search(*p, plan::SearchOptions{1});
        if (!res.best.empty()) break;
      }
      if (res.best.empty()) {
        t.add({*one.system, std::to_string(p->chips()), "no valid layout fits HBM", "-", "-", "-",
               "-", "-"});
        j.push_back({{"system", *one.system}, {"chips", p->chips()}, {"best", nullptr}});
        continue;
      }
      const Estimate& e = res.best.front();
      const double per_mtok =
          p->training().price_per_chip_hour * p->chips() / 3600.0 / e.tokens_per_s * 1e6;
      t.add({*one.system, std::to_string(p->chips()), layout_text(e.layout), ms(e.time.step),
             fmt::format("{:.0f}", e.tokens_per_s), fmt::format("{:.1f}", 100 * e.mfu),
             gib(e.memory.total), per_mtok > 0 ? fmt::format("{:.3f}", per_mtok) : "-"});
      j.push_back({{"system", *one.system},
                   {"chips", p->chips()},
                   {"best", estimate_json(e)},
                   {"usd_per_million_tokens", per_mtok}});
    }
    std::fputs(ca->json ? (j.dump(2) + "\n").c_str() : t.render().c_str(), stdout);
  });
  add_validate_command(*cmd);
  add_collective_command(*cmd);
}

}  // namespace tern::cli
