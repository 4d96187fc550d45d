// `tern plan validate`: the planner against published measurements
// (data/plan/validation/*.toml), as a table with the mean absolute error.
#include <cmath>
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "arch/chip.h"
#include "arch/system.h"
#include "cli/options.h"
#include "cli/table.h"
#include "plan/estimate.h"
#include "plan/request.h"
#include "util/error.h"

namespace tern::cli {

using nlohmann::json;

void add_validate_command(CLI::App& plan_cmd) {
  auto* v = plan_cmd.add_subcommand(
      "validate", "Predict published iteration times (Megatron on A100) and report the error");
  struct Opts {
    std::string file;
    bool markdown = false, json = false;
    double max_mae = 0;
  };
  auto o = std::make_shared<Opts>();
  v->add_option("file", o->file,
                "Validation set: a name in data/plan/validation (megatron-a100, trainium) or a "
                ".toml file [default: megatron-a100]");
  v->add_flag("--markdown", o->markdown, "Print a Markdown table (docs/validation.md)");
  v->add_flag("--json", o->json, "Print JSON");
  number_range(v->add_option("--max-mae", o->max_mae,
                             "Exit non-zero when the mean absolute error (%) exceeds this"),
               0, 1000);
  v->callback([o] {
    const std::string name = o->file.empty() ? "megatron-a100" : o->file;
    const auto named = arch::data_dir() / "plan" / "validation" / (name + ".toml");
    const std::string file =
        name.find('/') == std::string::npos && name.find(".toml") == std::string::npos
            ? named.string()
            : name;
    const json tree = plan::read_tree(file);
    if (!tree.contains("run") || !tree["run"].is_array())
      throw Error(file + ": no [[run]] entries");
    Table t({"source", "configuration", "layout", "measured s", "predicted s", "error %"});
    std::string md =
        "| source | configuration | layout | measured (s) | predicted (s) | error "
        "|\n|---|---|---|---:|---:|---:|\n";
    json out = json::array();
    double sum = 0;
    int n = 0;
    for (std::size_t i = 0; i < tree["run"].size(); ++i) {
      json run = tree["run"][i];
      const std::string where = fmt::format("{}: run[{}]", file, i);
      const std::string source = run.value("source", "?"), label = run.value("label", "?");
      // Throughput tables publish sequences per second: the iteration
      // time is the global batch over it.
      if (run.contains("measured_seq_per_s")) {
        const json& q = run["measured_seq_per_s"];
        const json* gb = run.contains("training") && run["training"].contains("global_batch")
                             ? &run["training"]["global_batch"]
                             : nullptr;
        if (!q.is_number() || !(q.get<double>() > 0) || !gb || !gb->is_number_integer())
          throw Error(where +
                      ": key 'measured_seq_per_s': expected a positive number and an integer "
                      "training.global_batch");
        run["measured_s"] = gb->get<double>() / q.get<double>();
        run.erase("measured_seq_per_s");
      }
      if (!run.contains("measured_s") || !run["measured_s"].is_number()) {
        throw Error(where + ": key 'measured_s': expected a number of seconds");
      }
      const double measured = run["measured_s"].get<double>();
      run.erase("source");
      run.erase("label");
      run.erase("measured_s");
      plan::Request r;
      plan::apply(run, where, r);
      if (!r.layout) throw Error(where + ": no [run.layout]");
      plan::Layout l = *r.layout;
      const arch::SystemSpec sys = arch::load_system(r.system);
      if (l.dp == 0 && l.tp > 0 && l.pp > 0 && l.cp > 0) {
        l.dp = static_cast<int>(std::int64_t{r.chips} * sys.ranks_per_chip(r.lnc) /
                                (static_cast<std::int64_t>(l.tp) * l.pp * l.cp));
      }
      const plan::Planner p(sys, r.model, r.training, r.chips, r.lnc);
      const auto e = p.estimate(l);
      const double pred = e.time.step.value() * 1e-9;
      const double err = (pred - measured) / measured * 100;
      sum += std::fabs(err);
      ++n;
      const std::string lay =
          fmt::format("tp{} pp{} dp{}{}{}{} mb{} {}", l.tp, l.pp, l.dp,
                      l.vpp > 1 ? fmt::format(" v{}", l.vpp) : "", l.sp ? " sp" : "",
                      l.zero > 0 ? fmt::format(" z{}", l.zero) : "", r.training.micro_batch,
                      plan::recompute_name(l.recompute));
      t.add({source, label, lay, fmt::format("{:.2f}", measured), fmt::format("{:.2f}", pred),
             fmt::format("{:+.1f}", err)});
      md += fmt::format("| {} | {} | {} | {:.2f} | {:.2f} | {:+.1f} % |\n", source, label, lay,
                        measured, pred, err);
      out.push_back({{"source", source},
                     {"label", label},
                     {"measured_s", measured},
                     {"predicted_s", pred},
                     {"error_percent", err}});
    }
    if (n == 0) throw Error(file + ": no [[run]] entries");
    const double mae = sum / n;
    if (o->json) {
      std::puts(json{{"runs", out}, {"mean_absolute_error_percent", mae}}.dump(2).c_str());
    } else if (o->markdown) {
      std::fputs(
          (md + fmt::format("\nMean absolute error over {} runs: {:.1f} %\n", n, mae)).c_str(),
          stdout);
    } else {
      std::fputs(t.render().c_str(), stdout);
      std::printf("\nmean absolute error over %d runs: %.1f %%\n", n, mae);
    }
    if (o->max_mae > 0 && mae > o->max_mae) {
      throw Error(
          fmt::format("mean absolute error {:.1f} % exceeds --max-mae {:.1f} %", mae, o->max_mae));
    }
  });
}

}  // namespace tern::cli
