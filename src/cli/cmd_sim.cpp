// `tern run` (run a program file on the simulated chip) and `tern bench
// matmul` (build, simulate and check the built-in matmul kernel).
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "arch/chip.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "isa/program.h"
#include "kernel/kernels.h"
#include "kernel/reference.h"
#include "kernel/registry.h"
#include "num/convert.h"
#include "profile/profile.h"
#include "sim/simulator.h"
#include "util/error.h"
#include "util/file.h"

namespace tern::cli {

namespace {

using nlohmann::json;

// The largest matrix dimension `bench matmul` takes: the kernel builder
// counts tiles in 32-bit integers (whether the matrices fit in HBM is the
// simulator's check).
constexpr std::int64_t kMaxDim = INT32_MAX;

std::vector<std::uint8_t> read_bytes(const std::string& path) {
  const std::string s = read_file(path);
  return {s.begin(), s.end()};
}

std::pair<std::string, std::string> split_assignment(const std::string& s, const char* what) {
  const auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size()) {
    throw Error(fmt::format("{} '{}': expected NAME=FILE", what, s));
  }
  return {s.substr(0, eq), s.substr(eq + 1)};
}

// --mode and --check of a bench command, resolved: under "auto", `small`
// shapes run with data and are checked, larger ones run timing only.
struct BenchPlan {
  sim::Options opt;
  bool check = false;
};
BenchPlan plan_bench(const std::string& mode, const std::string& check, const std::string& trace,
                     bool small) {
  if (check != "auto" && check != "yes" && check != "no")
    throw Error(fmt::format("--check '{}': expected auto, yes or no", check));
  BenchPlan plan;
  plan.opt.mode =
      mode == "auto" ? (small ? sim::Mode::both : sim::Mode::timing) : sim::parse_mode(mode);
  plan.opt.trace = !trace.empty();
  if (check == "yes" && plan.opt.mode == sim::Mode::timing)
    throw Error("--check yes needs data: not with --mode timing");
  plan.check = plan.opt.mode != sim::Mode::timing && (check == "yes" || (check == "auto" && small));
  return plan;
}

// The result check of a bench command, for the table and the JSON.
struct CheckReport {
  json result = nullptr;
  std::string text = "result check: skipped (timing-only or large shape; --check yes forces it)";
};
// Compares the named outputs of `s` with the expected values bit for bit;
// throws (with the report's text) when any element differs.
CheckReport check_bits(const sim::Simulator& s,
                       const std::vector<std::pair<std::string, std::vector<float>>>& want) {
  std::size_t mismatches = 0, elements = 0;
  for (const auto& [name, w] : want) {
    const auto got = s.read(name);
    if (got.size() != w.size())
      throw Error(fmt::format("result check: '{}' has {} elements, the reference {}", name,
                              got.size(), w.size()));
    elements += got.size();
    for (std::size_t i = 0; i < got.size(); ++i)
      mismatches += std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(w[i]);
  }
  CheckReport r;
  r.result = {{"bit_exact", mismatches == 0}, {"mismatches", mismatches}, {"elements", elements}};
  r.text = mismatches == 0
               ? fmt::format("result check: bit-exact against the host reference ({} elements)",
                             elements)
               : fmt::format("result check: {} of {} elements differ from the host reference",
                             mismatches, elements);
  if (mismatches) throw Error(r.text);
  return r;
}

void add_run(CLI::App& app) {
  struct A {
    std::string program, arch, trace, mode = "both";
    std::vector<std::string> inputs, outputs;
    std::uint64_t seed = 0;
    int threads = 0;
    bool json = false;
  };
  auto a = std::make_shared<A>();
  auto* cmd =
      app.add_subcommand("run", "Run a program file (.tern binary or text) on the simulated chip");
  cmd->add_option("program", a->program, "Program file")->required();
  cmd->add_option("--arch", a->arch,
                  "Chip to simulate (default: the one the program was built for)");
  one_of(cmd->add_option("--mode", a->mode, "both (data and time), functional or timing (no data)")
             ->capture_default_str(),
         {"both", "functional", "timing"});
  output_file(
      cmd->add_option("--trace", a->trace, "Write a Perfetto / chrome://tracing trace (JSON)"));
  cmd->add_option("--input", a->inputs,
                  "NAME=FILE: raw bytes of an input tensor in its dtype (others: random)");
  cmd->add_option("--output", a->outputs, "NAME=FILE: write an output tensor's raw bytes");
  int_range(cmd->add_option("--seed", a->seed, "Seed of the random inputs")->capture_default_str(),
            0);
  int_range(
      cmd->add_option("--threads", a->threads,
                      "Host threads for the functional model (0: all cores; same bits for any)")
          ->capture_default_str(),
      0, 4096);
  cmd->add_flag("--json", a->json, "Print the summary as JSON");
  cmd->callback([a] {
    const isa::Program p = isa::load_program(a->program);
    const arch::ChipSpec chip = arch::load_chip(a->arch.empty() ? p.arch : a->arch);
    sim::Options opt;
    opt.mode = sim::parse_mode(a->mode);
    opt.trace = !a->trace.empty();
    opt.threads = a->threads;
    sim::Simulator s(chip);
    s.load(p);
    // Every output named and writable before the run, not after it.
    for (const auto& out : a->outputs) {
      const auto [name, file] = split_assignment(out, "--output");
      (void)p.tensor(name);  // throws naming the program's tensors
      if (opt.mode == sim::Mode::timing)
        throw Error("--output needs data: use --mode both or functional");
      check_writable_file(file, "--output");
    }
    std::vector<std::string> given;
    for (const auto& in : a->inputs) {
      const auto [name, file] = split_assignment(in, "--input");
      s.write_bytes(name, read_bytes(file));
      given.push_back(name);
    }
    if (opt.mode != sim::Mode::timing) {
      std::uint64_t k = 0;
      for (const auto& t : p.tensors) {
        if (t.kind != isa::TensorKind::input ||
            std::find(given.begin(), given.end(), t.name) != given.end())
          continue;
        s.write(t.name, kernel::random_values(t, a->seed + k++));
      }
    }
    const sim::RunStats st = s.run(opt);
    for (const auto& out : a->outputs) {
      const auto [name, file] = split_assignment(out, "--output");
      // Raw bytes in the tensor's dtype, as stored; written atomically.
      const auto raw = s.read_bytes(name);
      write_file_atomic(file,
                        std::string_view(reinterpret_cast<const char*>(raw.data()), raw.size()));
    }
    if (opt.trace) profile::write_trace(st, chip, a->trace);
    const auto sum = profile::summarize(st, chip);
    if (a->json) {
      std::printf("%s\n", profile::to_json(sum).dump(2).c_str());
    } else {
      std::printf("%s on %s (%s mode)\n%s", a->program.c_str(), chip.name.c_str(), a->mode.c_str(),
                  profile::to_text(sum).c_str());
      if (opt.trace)
        std::printf("trace written to %s (open in https://ui.perfetto.dev)\n", a->trace.c_str());
    }
  });
}

void add_bench_kernel(CLI::App& bench);

void add_bench(CLI::App& app) {
  auto* bench =
      app.add_subcommand("bench", "Simulate built-in kernels and report time and efficiency");
  bench->require_subcommand(1);
  struct A {
    std::string arch = "trn3", dtype = "bf16", out = "fp32", trace, mode = "auto", check = "auto",
                save, epilogue;
    std::int64_t m = 4096, n = 4096, k = 4096;
    int cores = 1, lnc = 1;
    bool json = false, compare_unfused = false;
  };
  auto a = std::make_shared<A>();
  add_bench_kernel(*bench);
  auto* cmd = bench->add_subcommand("matmul",
                                    "C = A @ B on the simulated chip: latency, TFLOPS, % of peak");
  cmd->add_option("--arch", a->arch, "Chip")->capture_default_str();
  int_range(cmd->add_option("--m", a->m, "Rows of A and C")->capture_default_str(), 1, kMaxDim);
  int_range(cmd->add_option("--n", a->n, "Columns of B and C")->capture_default_str(), 1, kMaxDim);
  int_range(cmd->add_option("--k", a->k, "Contraction size")->capture_default_str(), 1, kMaxDim);
  cmd->add_option("--dtype", a->dtype,
                  "Input dtype: bf16, fp16, fp32, tf32, fp8_e4m3 (trn3), fp8_e5m2, fp8_e4m3_legacy "
                  "(trn1/2), "
                  "mxfp8 / mxfp8_e5m2 (trn3: BF16 inputs quantized on chip)")
      ->capture_default_str();
  one_of(cmd->add_option("--out", a->out, "Output dtype: fp32 or bf16")->capture_default_str(),
         {"fp32", "bf16"});
  int_range(cmd->add_option("--cores", a->cores, "Logical NeuronCores to spread M over")
                ->capture_default_str(),
            1, 1024);
  int_range(cmd->add_option("--lnc", a->lnc, "Physical cores per logical core: 1, or 2 (v3+)")
                ->capture_default_str(),
            1, 2);
  one_of(cmd->add_option("--mode", a->mode,
                         "auto (data when small enough), both, functional or timing")
             ->capture_default_str(),
         {"both", "functional", "timing", "auto"});
  one_of(cmd->add_option("--check", a->check, "Check C against the host reference: auto, yes, no")
             ->capture_default_str(),
         {"auto", "yes", "no"});
  cmd->add_option("--epilogue", a->epilogue,
                  "Chain fused into the PSUM evacuation, in this order: scale=<x>, bias (input "
                  "'bias' [1, N] fp32), an activation (gelu, gelu_tanh, silu, relu, ...), residual "
                  "(input 'residual' [M, N] fp32); e.g. bias,gelu");
  cmd->add_flag("--compare-unfused", a->compare_unfused,
                "Also time the unfused chain: the plain matmul to FP32 then one kernel per "
                "epilogue step, each through HBM");
  output_file(
      cmd->add_option("--trace", a->trace, "Write a Perfetto / chrome://tracing trace (JSON)"));
  output_file(
      cmd->add_option("--save", a->save, "Save the generated program (.tern binary, .txt text)"));
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a] {
    const arch::ChipSpec chip = arch::load_chip(a->arch);
    // "mxfp8" names the MX matmul (BF16 inputs quantized on chip).
    const std::string dt = a->dtype == "mxfp8" || a->dtype == "mxfp8_e4m3" ? "fp8_e4m3_x4"
                           : a->dtype == "mxfp8_e5m2"                      ? "fp8_e5m2_x4"
                                                                           : a->dtype;
    kernel::MatmulSpec spec{
        a->m,  a->n, a->k, isa::parse_dtype(dt), isa::parse_dtype(a->out), a->cores * a->lnc,
        a->lnc};
    spec.epilogue = kernel::parse_epilogue(a->epilogue);
    const kernel::Epilogue& ep = spec.epilogue;
    if (a->compare_unfused && !ep.any()) throw Error("--compare-unfused needs an --epilogue");
    const bool mx = isa::is_x4(spec.in);
    const auto t0 = std::chrono::steady_clock::now();
    const isa::Program p = kernel::matmul_kernel(chip, spec);
    if (!a->save.empty()) isa::save_program(p, a->save);
    // Data for shapes whose host reference takes about a second at most.
    const double work =
        static_cast<double>(a->m) * static_cast<double>(a->n) * static_cast<double>(a->k);
    const bool small = work <= 1.1e9;
    const auto [opt, check] = plan_bench(a->mode, a->check, a->trace, small);
    sim::Simulator s(chip);
    s.load(p);
    std::vector<float> at, b, bias, residual;
    if (opt.mode != sim::Mode::timing) {
      at = kernel::random_values(p.tensor("at"), 1);
      b = kernel::random_values(p.tensor("b"), 2);
      s.write("at", at);
      s.write("b", b);
      if (ep.bias) s.write("bias", bias = kernel::random_values(p.tensor("bias"), 3));
      if (ep.residual)
        s.write("residual", residual = kernel::random_values(p.tensor("residual"), 4));
    }
    const auto t1 = std::chrono::steady_clock::now();
    const sim::RunStats st = s.run(opt);
    const auto t2 = std::chrono::steady_clock::now();
    CheckReport report;
    if (check) {
      const kernel::KernelEntry& me = kernel::find_kernel("matmul");
      const kernel::Params mp(me.name, me.params,
                              {{"m", std::to_string(a->m)},
                               {"n", std::to_string(a->n)},
                               {"k", std::to_string(a->k)},
                               {"dtype", std::string(isa::name(spec.in))},
                               {"out", std::string(isa::name(spec.out))},
                               {"epilogue", a->epilogue}});
      kernel::NamedData in{{"at", at}, {"b", b}};
      if (ep.bias) in.emplace_back("bias", bias);
      if (ep.residual) in.emplace_back("residual", residual);
      report = check_bits(s, me.reference(chip, mp, in));
    }
    if (opt.trace) profile::write_trace(st, chip, a->trace);
    const auto sum = profile::summarize(st, chip);
    // The unfused chain, timed only: matmul to FP32, then each step alone.
    json unfused = nullptr;
    if (a->compare_unfused) {
      sim::Options topt;
      topt.mode = sim::Mode::timing;
      kernel::MatmulSpec plain = spec;
      plain.out = isa::DType::fp32;
      plain.epilogue = {};
      sim::Simulator ms(chip);
      ms.load(kernel::matmul_kernel(chip, plain));
      const double matmul_ns = ms.run(topt).latency_ns;
      const std::vector<kernel::Epilogue> steps = kernel::unfused_steps(ep);
      json kernels = json::array({{{"kernel", "matmul"}, {"latency_ns", matmul_ns}}});
      double total = matmul_ns;
      for (std::size_t i = 0; i < steps.size(); ++i) {
        const isa::DType out = i + 1 == steps.size() ? spec.out : isa::DType::fp32;
        sim::Simulator es(chip);
        es.load(kernel::epilogue_kernel(chip, a->m, a->n, steps[i], out));
        const double ns = es.run(topt).latency_ns;
        total += ns;
        kernels.push_back({{"kernel", kernel::to_string(steps[i])}, {"latency_ns", ns}});
      }
      unfused = {
          {"kernels", kernels}, {"latency_ns", total}, {"fused_speedup", total / st.latency_ns}};
    }
    const std::string peak_key = mx                            ? "mxfp8"
                                 : spec.in == isa::DType::fp32 ? "fp32"
                                 : spec.in == isa::DType::tf32 ? "tf32"
                                 : isa::is_fp8(spec.in)        ? "fp8"
                                 : spec.in == isa::DType::fp16 ? "fp16"
                                                               : "bf16";
    const double flops = 2.0 * work;
    const double bound_ns =
        flops / (chip.tensor_peak_per_core(peak_key).value() * spec.cores) * 1e9;
    const double host_s = std::chrono::duration<double>(t2 - t1).count();
    const double build_s = std::chrono::duration<double>(t1 - t0).count();
    if (a->json) {
      json j = profile::to_json(sum);
      j["kernel"] = {{"name", "matmul"},    {"m", a->m},
                     {"n", a->n},           {"k", a->k},
                     {"dtype", a->dtype},   {"out", a->out},
                     {"cores", spec.cores}, {"lnc", a->lnc},
                     {"arch", chip.name},   {"epilogue", kernel::to_string(ep)}};
      j["unfused"] = unfused;
      j["peak_bound_ns"] = bound_ns;
      j["latency_over_bound"] = st.latency_ns / bound_ns;
      j["tflops"] = flops / st.latency_ns / 1e3;
      j["peak_percent"] = 100.0 * bound_ns / st.latency_ns;
      j["host_seconds"] = host_s;
      j["build_seconds"] = build_s;
      j["mode"] = opt.mode == sim::Mode::timing       ? "timing"
                  : opt.mode == sim::Mode::functional ? "functional"
                                                      : "both";
      j["check"] = report.result;
      std::printf("%s\n", j.dump(2).c_str());
      return;
    }
    std::printf("matmul %lld x %lld x %lld %s -> %s%s on %s, %d physical core%s%s (%s)\n",
                static_cast<long long>(a->m), static_cast<long long>(a->n),
                static_cast<long long>(a->k), a->dtype.c_str(), a->out.c_str(),
                ep.any() ? (" + " + kernel::to_string(ep)).c_str() : "", chip.name.c_str(),
                spec.cores, spec.cores == 1 ? "" : "s", a->lnc == 2 ? " at LNC=2" : "",
                opt.mode == sim::Mode::timing ? "timing only" : "functional + timing");
    std::printf("%s", profile::to_text(sum).c_str());
    std::printf(
        "peak-FLOPS bound  %.3f us: latency is %.3fx the bound (%.1f %% of peak, %.1f TFLOPS)\n",
        bound_ns / 1e3, st.latency_ns / bound_ns, 100.0 * bound_ns / st.latency_ns,
        flops / st.latency_ns / 1e3);
    std::printf("host time        %.3f s to simulate (%.0f instructions/s), %.3f s to build\n",
                host_s, static_cast<double>(st.instructions) / std::max(host_s, 1e-9), build_s);
    std::printf("%s\n", report.text.c_str());
    if (!unfused.is_null()) {
      std::printf("\nunfused chain (separate kernels through HBM, timing only):\n");
      for (const auto& k : unfused["kernels"])
        std::printf("  %-28s %12.3f us\n", k["kernel"].get<std::string>().c_str(),
                    k["latency_ns"].get<double>() / 1e3);
      std::printf("  %-28s %12.3f us\n  %-28s %12.3f us: fused is %.2fx faster\n", "total",
                  unfused["latency_ns"].get<double>() / 1e3, "fused", st.latency_ns / 1e3,
                  unfused["fused_speedup"].get<double>());
    }
    if (opt.trace)
      std::printf("trace written to %s (open in https://ui.perfetto.dev)\n", a->trace.c_str());
  });
}

// A parameter's text as the JSON value it reads as (integer, number, bool).
json param_json(const std::string& t) {
  if (t == "true" || t == "false") return t == "true";
  char* end = nullptr;
  const long long i = std::strtoll(t.c_str(), &end, 10);
  if (!t.empty() && *end == '\0') return i;
  const double d = std::strtod(t.c_str(), &end);
  if (!t.empty() && *end == '\0') return d;
  return t;
}

struct BenchCommon {
  std::string arch = "trn3", mode = "auto", check = "auto", trace;
  bool json = false;
};

// Runs one registered kernel with random inputs, checks it bit for bit
// against its host reference when small, and prints latency, efficiency and
// engine busy.
void bench_registered(const kernel::KernelEntry& e, const std::map<std::string, std::string>& given,
                      const BenchCommon& c) {
  const arch::ChipSpec chip = arch::load_chip(c.arch);
  const kernel::Params params(e.name, e.params, given);
  const isa::Program p = e.build(chip, params);
  // "Small": a host reference of about a second at most.
  double elements = 0;
  bool packed = false;  // x4-packed inputs take bytes, not random values
  for (const auto& t : p.tensors) {
    elements += static_cast<double>(t.elements());
    packed |= t.kind == isa::TensorKind::input && isa::is_x4(t.dtype);
  }
  if (packed && c.mode != "auto" && c.mode != "timing")
    throw Error(
        fmt::format("kernel {}: x4-packed inputs need byte data; run with --mode timing, "
                    "or save the program and use tern run --input NAME=FILE",
                    e.name));
  const double flops = e.useful_flops ? e.useful_flops(params) : 0.0;
  const bool small = e.reference && !packed && elements <= (1 << 24) && flops <= 2.2e9;
  const auto [opt, check] = plan_bench(c.mode, e.reference ? c.check : "no", c.trace, small);
  if (c.check == "yes" && !e.reference)
    throw Error(fmt::format("--check yes: kernel {} has no bit-exact host reference", e.name));
  sim::Simulator s(chip);
  s.load(p);
  kernel::NamedData in;
  if (opt.mode != sim::Mode::timing) {
    in = kernel::make_inputs(p, e, params);
    for (const auto& [name, v] : in) s.write(name, v);
  }
  const sim::RunStats st = s.run(opt);
  CheckReport report;
  if (check) report = check_bits(s, e.reference(chip, params, in));
  if (opt.trace) profile::write_trace(st, chip, c.trace);
  const auto sum = profile::summarize(st, chip);
  // Useful work: the executed FLOPs' % of peak scaled by useful / executed.
  json useful = nullptr;
  std::string useful_text;
  if (flops > 0) {
    const profile::DtypeUse* main = nullptr;
    for (const auto& [dt, u] : sum.tensor)
      if (!main || u.flops > main->flops) main = &u;
    const double tflops = flops / sum.latency_ns / 1e3;
    const double pct = main && main->flops > 0 ? main->peak_percent * flops / main->flops : 0.0;
    useful = {{"flops", flops}, {"tflops", tflops}, {"peak_percent", pct}};
    useful_text = fmt::format("useful work: {:.4g} GFLOP, {:.1f} TFLOPS, {:.1f} % of Tensor peak\n",
                              flops / 1e9, tflops, pct);
  }
  const std::string what = e.describe(params);
  if (c.json) {
    json j = profile::to_json(sum);
    json pj = json::object();
    for (const auto& [k, v] : params.values()) pj[k] = param_json(v);
    j["kernel"] = {
        {"name", e.name}, {"arch", chip.name}, {"what", what}, {"bound", e.bound}, {"params", pj}};
    j["useful"] = useful;
    j["check"] = report.result;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("%s on %s (%s)\n%s%s%s\n", what.c_str(), chip.name.c_str(),
              opt.mode == sim::Mode::timing ? "timing only" : "functional + timing",
              profile::to_text(sum).c_str(), useful_text.c_str(), report.text.c_str());
  if (opt.trace)
    std::printf("trace written to %s (open in https://ui.perfetto.dev)\n", c.trace.c_str());
}

// A registry parameter's type on the command line: checked when parsed,
// its range or choices in --help.
void typed_param(CLI::Option* o, const kernel::ParamDoc& d) {
  switch (d.kind()) {
    case kernel::ParamKind::integer:
      int_range(o, d.min_integer());
      break;
    case kernel::ParamKind::number:
      number_range(o, -1e300);
      break;
    case kernel::ParamKind::flag:
      o->expected(0, 1);
      one_of(o, {"true", "false", "1", "0"})->type_name("BOOL");
      break;
    case kernel::ParamKind::dtype:
      // NKI or short names (the help lists the kernel's); parse_dtype's
      // error names them all.
      o->type_name("DTYPE")->check(CLI::Validator(
          [](std::string& v) -> std::string {
            try {
              (void)isa::parse_dtype(v);
              return "";
            } catch (const Error& e) {
              return e.what();
            }
          },
          ""));
      break;
    case kernel::ParamKind::choice:
      one_of(o, d.choices);
      break;
    case kernel::ParamKind::deduce:
    case kernel::ParamKind::text:
      break;
  }
}

// `tern bench kernel NAME [--param value ...]`: one subcommand per kernel
// of the registry, its options generated from the kernel's parameters.
void add_bench_kernel(CLI::App& bench) {
  auto* cmd = bench.add_subcommand(
      "kernel", "A built-in kernel: latency, % of HBM bandwidth or Tensor peak, engine busy");
  // An unknown name is left as an extra argument: name the known kernels.
  cmd->allow_extras();
  cmd->callback([cmd] {
    if (!cmd->get_subcommands().empty()) return;
    const auto rest = cmd->remaining();
    if (rest.empty()) {
      std::string names;
      for (const auto& e : kernel::kernel_registry()) names += " " + e.name;
      throw Error("bench kernel: name a kernel:" + names);
    }
    kernel::find_kernel(rest.front());  // throws, naming them
  });
  for (const auto& e : kernel::kernel_registry()) {
    auto* sub = cmd->add_subcommand(e.name, e.summary);
    sub->allow_extras(false);
    auto given = std::make_shared<std::map<std::string, std::string>>();
    auto common = std::make_shared<BenchCommon>();
    for (const auto& d : e.params) {
      std::string opt = "--" + d.name;
      std::replace(opt.begin(), opt.end(), '_', '-');
      const std::string name = d.name;
      // Booleans: `--name` alone means true; `--name true|false` sets it.
      // (A bare option would take its default string as the value: booleans
      // state their default in the help instead.)
      auto* o = sub->add_option_function<std::string>(
          opt, [given, name](const std::string& v) { (*given)[name] = v.empty() ? "true" : v; },
          d.flag() ? d.help + " [default: " + d.default_value + "]" : d.help);
      if (!d.flag() && !d.default_value.empty()) o->default_str(d.default_value);
      typed_param(o, d);
    }
    sub->add_option("--arch", common->arch, "Chip")->capture_default_str();
    one_of(sub->add_option("--mode", common->mode,
                           "auto (data when small enough), both, functional or timing")
               ->capture_default_str(),
           {"both", "functional", "timing", "auto"});
    one_of(
        sub->add_option("--check", common->check, "Check against the host reference: auto, yes, no")
            ->capture_default_str(),
        {"auto", "yes", "no"});
    output_file(sub->add_option("--trace", common->trace,
                                "Write a Perfetto / chrome://tracing trace (JSON)"));
    sub->add_flag("--json", common->json, "Print JSON");
    const kernel::KernelEntry* entry = &e;
    sub->callback([entry, given, common] { bench_registered(*entry, *given, *common); });
  }
}

}  // namespace

void add_sim_commands(CLI::App& app) {
  add_run(app);
  add_bench(app);
}

}  // namespace tern::cli
