#include "train/config.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <toml++/toml.h>
#include <nlohmann/json.hpp>

#include "graph/autocast.h"
#include "util/error.h"

namespace tern::train {

namespace {

std::int64_t parse_int(const std::string& spec, std::string_view s) {
  std::int64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < 1)
    throw Error(
        fmt::format("fault '{}': '{}' is not a positive integer (forms: nan@STEP[:PARAM], "
                    "fail@STEP[xCOUNT], kill@STEP)",
                    spec, s));
  return v;
}

std::string fault_string(const Fault& f) {
  switch (f.kind) {
    case Fault::Kind::nan:
      return fmt::format("nan@{}{}", f.step, f.param.empty() ? "" : ":" + f.param);
    case Fault::Kind::fail:
      return fmt::format("fail@{}x{}", f.step, f.count);
    case Fault::Kind::kill:
      return fmt::format("kill@{}", f.step);
  }
  return "";
}

}  // namespace

Fault parse_fault(const std::string& spec) {
  const auto at = spec.find('@');
  if (at == std::string::npos)
    throw Error(
        fmt::format("fault '{}': expected nan@STEP[:PARAM], fail@STEP[xCOUNT] or kill@STEP", spec));
  const std::string kind = spec.substr(0, at);
  std::string rest = spec.substr(at + 1);
  Fault f;
  if (kind == "nan") {
    f.kind = Fault::Kind::nan;
    if (const auto c = rest.find(':'); c != std::string::npos) {
      f.param = rest.substr(c + 1);
      rest = rest.substr(0, c);
    }
  } else if (kind == "fail") {
    f.kind = Fault::Kind::fail;
    if (const auto x = rest.find('x'); x != std::string::npos) {
      f.count = static_cast<int>(parse_int(spec, rest.substr(x + 1)));
      rest = rest.substr(0, x);
    }
  } else if (kind == "kill") {
    f.kind = Fault::Kind::kill;
  } else {
    throw Error(fmt::format("fault '{}': unknown kind '{}' (nan, fail, kill)", spec, kind));
  }
  f.step = parse_int(spec, rest);
  return f;
}

void validate(const TrainConfig& c) {
  auto bad = [](const std::string& what) { throw Error("train config: " + what); };
  // Every real setting finite first: NaN passes every "<" check below.
  for (const auto& [name, v] : {std::pair{"lr", c.lr},
                                {"min_lr", c.min_lr},
                                {"weight_decay", c.weight_decay},
                                {"beta1", c.beta1},
                                {"beta2", c.beta2},
                                {"clip", c.clip},
                                {"init_std", c.init_std},
                                {"nan_rate", c.nan_rate},
                                {"spike_z", c.spike_z},
                                {"overflow_pct", c.overflow_pct},
                                {"bucket_mb", c.bucket_mb},
                                {"val_fraction", c.val_fraction}}) {
    if (!std::isfinite(v)) bad(fmt::format("{} must be a finite number, got {}", name, v));
  }
  // Sizes whose products the compiler forms: each bounded so none overflows.
  for (const auto& [name, v, most] : {std::tuple{"layers", c.layers, std::int64_t{4096}},
                                      {"dim", c.dim, std::int64_t{1} << 20},
                                      {"heads", c.heads, std::int64_t{4096}},
                                      {"batch", c.batch, std::int64_t{1} << 20},
                                      {"seq", c.seq, std::int64_t{1} << 24},
                                      {"accum", c.accum, std::int64_t{1} << 20},
                                      {"dp", c.dp, std::int64_t{1} << 16},
                                      {"tp", c.tp, std::int64_t{1024}},
                                      {"pp", c.pp, std::int64_t{1024}}}) {
    if (v > most) bad(fmt::format("{} {} is more than tern takes ({})", name, v, most));
  }
  if (c.model != "gpt2" && c.model != "llama")
    bad(fmt::format("model '{}' is not one of gpt2, llama", c.model));
  if (c.layers < 1 || c.dim < 1 || c.heads < 1 || c.batch < 1 || c.seq < 2 || c.accum < 1)
    bad(
        fmt::format("layers, dim, heads, batch, accum must be >= 1 and seq >= 2 (got layers {}, "
                    "dim {}, heads {}, batch {}, seq {}, accum {})",
                    c.layers, c.dim, c.heads, c.batch, c.seq, c.accum));
  if (c.dim % c.heads != 0 || (c.dim / c.heads != 64 && c.dim / c.heads != 128))
    bad(fmt::format(
        "head dim = dim / heads must be 64 or 128 (the attention kernels'), got {} / {}", c.dim,
        c.heads));
  if (c.kv_heads < 0 || (c.kv_heads > 0 && c.heads % c.kv_heads != 0))
    bad(fmt::format("kv_heads {} must divide heads {}", c.kv_heads, c.heads));
  if (c.model == "gpt2" && (c.kv_heads > 0 || c.ffn > 0))
    bad("kv_heads and ffn are Llama settings (model = \"llama\")");
  if (c.recipe != "fp32") graph::recipe(c.recipe == "fp32" ? "bf16" : c.recipe, c.mx_policy);
  if (!(c.val_fraction > 0 && c.val_fraction < 1))
    bad(fmt::format("val_fraction must be in (0, 1), got {}", c.val_fraction));
  if (c.warmup < 0 || c.steps < 1 || !(c.lr > 0) || c.min_lr < 0 || c.min_lr > c.lr)
    bad(
        fmt::format("need steps >= 1, warmup >= 0 and 0 <= min_lr <= lr, got steps {}, warmup "
                    "{}, lr {}, min_lr {}",
                    c.steps, c.warmup, c.lr, c.min_lr));
  if (!(c.init_std > 0) || c.cores < 0)
    bad(fmt::format("init_std must be > 0 and cores >= 0, got {} and {}", c.init_std, c.cores));
  if (c.clip < 0 || c.weight_decay < 0 || !(c.beta1 >= 0 && c.beta1 < 1) ||
      !(c.beta2 >= 0 && c.beta2 < 1))
    bad("clip and weight_decay must be >= 0 and betas in [0, 1)");
  static const std::set<std::string> policies = {"skip", "fallback-layer", "fallback-global",
                                                 "rollback", "stop"};
  if (!policies.contains(c.nan_policy))
    bad(
        fmt::format("nan_policy '{}' is not one of skip, fallback-layer, fallback-global, "
                    "rollback, stop",
                    c.nan_policy));
  if (c.nan_rate < 0 || c.nan_rate >= 1) bad("nan_rate must be in [0, 1)");
  if (c.spike_z < 0 || c.spike_window < 2) bad("spike_z must be >= 0 and spike_window >= 2");
  if (c.retries < 0) bad("retries must be >= 0");
  if (c.monitor_every < 0 || c.overflow_pct < 0 || c.overflow_pct > 100)
    bad("monitor_every must be >= 0 and overflow_pct in [0, 100]");
  if (c.overflow_policy != "warn" && c.overflow_policy != "fallback-layer" &&
      c.overflow_policy != "fallback-global")
    bad(fmt::format("overflow_policy '{}' is not one of warn, fallback-layer, fallback-global",
                    c.overflow_policy));
  if (c.dp < 1 || c.tp < 1 || c.pp < 1 || c.threads < 0)
    bad(fmt::format(
        "dp, tp and pp must be >= 1 and threads >= 0, got dp {}, tp {}, pp {}, threads {}", c.dp,
        c.tp, c.pp, c.threads));
  if (c.tp > 1 && c.model != "gpt2")
    bad("not supported: tensor parallel training (tp > 1) of the llama model; gpt2 is");
  if (c.tp > 1 && c.zero == 1) bad("not supported: zero 1 with tp > 1");
  if (c.sp && c.tp == 1) bad("sp (sequence parallelism) needs tp > 1");
  if (c.sp && c.seq % c.tp != 0)
    bad(fmt::format("sp: tp {} does not divide seq {} (each rank holds seq / tp positions)", c.tp,
                    c.seq));
  if (c.sp && c.pp > 1) bad("not supported: sp with pp > 1");
  if (c.tp > 1 && c.heads % c.tp != 0)
    bad(fmt::format("tp {} does not divide heads {}", c.tp, c.heads));
  if (c.pp > c.layers)
    bad(fmt::format("pp {} is more pipeline stages than the {} layers", c.pp, c.layers));
  if (c.pp > 1 && c.zero == 1)
    bad("not supported: zero 1 with pp > 1 (the optimizer is sharded by stage already)");
  if (!(c.bucket_mb >= 0) || c.bucket_mb > 1e6)
    bad(fmt::format("bucket_mb must be in [0, 1e6] MiB (0: one bucket after the backward), got {}",
                    c.bucket_mb));
  if (c.zero != 0 && c.zero != 1)
    bad(
        fmt::format("zero must be 0 (replicated optimizer) or 1 (sharded optimizer state), got {}"
                    "; ZeRO-2/3 are not supported",
                    c.zero));
  if ((c.dp > 1 || c.pp > 1 || c.tp > 1) && c.recipe == "fp8-hybrid")
    bad("not supported: dp, tp or pp > 1 with recipe fp8-hybrid (delayed scaling would need its "
        "amax history shared between chips); use mxfp8, bf16 or fp32");
  if (c.ckpt_every < 0 || c.keep_last < 1) bad("ckpt_every must be >= 0 and keep_last >= 1");
  if (c.ckpt_every > 0 && c.ckpt_dir.empty()) bad("ckpt_every needs ckpt_dir");
  if (c.nan_policy == "rollback" && c.ckpt_every == 0)
    bad("nan_policy rollback needs checkpoints (ckpt_dir and ckpt_every)");
}

nlohmann::json to_json(const TrainConfig& c) {
  nlohmann::json faults = nlohmann::json::array();
  for (const Fault& f : c.faults) faults.push_back(fault_string(f));
  return {{"text", c.text},
          {"val_fraction", c.val_fraction},
          {"data", c.data},
          {"model", c.model},
          {"layers", c.layers},
          {"dim", c.dim},
          {"heads", c.heads},
          {"kv_heads", c.kv_heads},
          {"ffn", c.ffn},
          {"batch", c.batch},
          {"seq", c.seq},
          {"accum", c.accum},
          {"recipe", c.recipe},
          {"mx_policy", c.mx_policy},
          {"stochastic_rounding", c.stochastic_rounding},
          {"arch", c.arch},
          {"cores", c.cores},
          {"dp", c.dp},
          {"tp", c.tp},
          {"pp", c.pp},
          {"zero", c.zero},
          {"bucket_mb", c.bucket_mb},
          {"sp", c.sp},
          {"system", c.system},
          {"threads", c.threads},
          {"lr", c.lr},
          {"min_lr", c.min_lr},
          {"weight_decay", c.weight_decay},
          {"beta1", c.beta1},
          {"beta2", c.beta2},
          {"clip", c.clip},
          {"warmup", c.warmup},
          {"steps", c.steps},
          {"seed", c.seed},
          {"init_std", c.init_std},
          {"nan_policy", c.nan_policy},
          {"nan_rate", c.nan_rate},
          {"spike_z", c.spike_z},
          {"spike_window", c.spike_window},
          {"retries", c.retries},
          {"monitor_every", c.monitor_every},
          {"overflow_pct", c.overflow_pct},
          {"overflow_policy", c.overflow_policy},
          {"ckpt_dir", c.ckpt_dir},
          {"ckpt_every", c.ckpt_every},
          {"keep_last", c.keep_last},
          {"resume", c.resume},
          {"faults", faults}};
}

namespace {

// Sets c's fields from j's keys (only those present); `where` names the
// source in errors.
void apply_json(TrainConfig& c, const nlohmann::json& j, const std::string& where) {
  const nlohmann::json known = to_json(TrainConfig{});
  for (const auto& [key, value] : j.items()) {
    if (!known.contains(key))
      throw Error(
          fmt::format("{}: unknown key '{}' (keys: text, model, layers, dim, heads, "
                      "kv_heads, ffn, batch, seq, accum, recipe, lr, steps, ...; "
                      "docs/train.md lists them all)",
                      where, key));
    const nlohmann::json& want = known.at(key);
    const bool ok = want.is_number_float()     ? value.is_number()
                    : want.is_number_integer() ? value.is_number_integer()
                                               : want.type() == value.type();
    if (!ok)
      throw Error(
          fmt::format("{}: '{}' must be a {}, got {}", where, key, want.type_name(), value.dump()));
  }
  nlohmann::json merged = to_json(c);
  for (const auto& [key, value] : j.items()) merged[key] = value;
  const nlohmann::json& m = merged;
  c.text = m["text"], c.val_fraction = m["val_fraction"], c.data = m["data"];
  c.model = m["model"];
  c.layers = m["layers"], c.dim = m["dim"], c.heads = m["heads"], c.kv_heads = m["kv_heads"];
  c.ffn = m["ffn"], c.batch = m["batch"], c.seq = m["seq"], c.accum = m["accum"];
  c.recipe = m["recipe"], c.mx_policy = m["mx_policy"];
  c.stochastic_rounding = m["stochastic_rounding"], c.arch = m["arch"], c.cores = m["cores"];
  c.dp = m["dp"], c.tp = m["tp"], c.pp = m["pp"], c.zero = m["zero"], c.system = m["system"];
  c.bucket_mb = m["bucket_mb"], c.sp = m["sp"];
  c.threads = m["threads"];
  c.lr = m["lr"], c.min_lr = m["min_lr"], c.weight_decay = m["weight_decay"];
  c.beta1 = m["beta1"], c.beta2 = m["beta2"], c.clip = m["clip"];
  c.warmup = m["warmup"], c.steps = m["steps"], c.seed = m["seed"], c.init_std = m["init_std"];
  c.nan_policy = m["nan_policy"], c.nan_rate = m["nan_rate"], c.spike_z = m["spike_z"];
  c.spike_window = m["spike_window"], c.retries = m["retries"];
  c.monitor_every = m["monitor_every"], c.overflow_pct = m["overflow_pct"];
  c.overflow_policy = m["overflow_policy"];
  c.ckpt_dir = m["ckpt_dir"], c.ckpt_every = m["ckpt_every"], c.keep_last = m["keep_last"];
  c.resume = m["resume"];
  c.faults.clear();
  for (const auto& f : m["faults"]) c.faults.push_back(parse_fault(f.get<std::string>()));
}

nlohmann::json toml_to_json(const toml::node& n, const std::string& where) {
  if (const auto* t = n.as_table()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, v] : *t) j[std::string(k.str())] = toml_to_json(v, where);
    return j;
  }
  if (const auto* a = n.as_array()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& v : *a) j.push_back(toml_to_json(v, where));
    return j;
  }
  if (const auto* v = n.as_integer()) return v->get();
  if (const auto* v = n.as_floating_point()) return v->get();
  if (const auto* v = n.as_boolean()) return v->get();
  if (const auto* v = n.as_string()) return v->get();
  throw Error(fmt::format("{}: dates and times are not train settings", where));
}

}  // namespace

TrainConfig config_from_json(const nlohmann::json& j) {
  if (!j.is_object())
    throw Error(fmt::format("train config: expected an object of settings, got {}", j.type_name()));
  TrainConfig c;
  apply_json(c, j, "train config");
  return c;
}

void load_config_file(TrainConfig& c, const std::string& path) {
  // toml++ reads a folder as an empty table.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw Error(fmt::format("--config {}: not a file (a TOML file of train settings)", path));
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw Error(fmt::format("{}:{}:{}: {}", path, b.line, b.column, e.description()));
  }
  const nlohmann::json j = toml_to_json(t, path);
  for (const auto& [k, v] : j.items())
    if (v.is_object())
      throw Error(fmt::format("{}: [{}]: train settings are top-level keys (no tables)", path, k));
  apply_json(c, j, path);
}

}  // namespace tern::train
