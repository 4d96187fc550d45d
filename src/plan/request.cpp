#include "plan/request.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include <fmt/format.h>
#include <toml++/toml.h>
#include <nlohmann/json.hpp>

#include "arch/chip.h"
#include "util/error.h"

namespace tern::plan {

using nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& where, const std::string& key, const std::string& what) {
  throw Error(fmt::format("{}: key '{}': {}", where, key, what));
}

void check_keys(const json& t, const std::string& where, const std::string& table,
                std::initializer_list<const char*> allowed) {
  if (!t.is_object()) bad(where, table, "expected a table");
  for (const auto& [k, v] : t.items()) {
    if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; }) ==
        allowed.end()) {
      std::string known;
      for (const char* a : allowed) known += (known.empty() ? "" : ", ") + std::string(a);
      bad(where, table + "." + k, "unknown key (known here: " + known + ")");
    }
  }
}

template <typename T>
void get(const json& t, const char* key, const std::string& where, const std::string& table,
         T& out) {
  if (!t.contains(key)) return;
  const json& v = t.at(key);
  const std::string k = table + "." + key;
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) bad(where, k, "expected true or false");
    out = v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) bad(where, k, "expected an integer, got " + v.dump());
    const auto x = v.get<std::int64_t>();
    if (x < 0 || x > std::numeric_limits<T>::max()) {
      bad(where, k, fmt::format("{} is out of range (0 to {})", x, std::numeric_limits<T>::max()));
    }
    out = static_cast<T>(x);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) bad(where, k, "expected a number, got " + v.dump());
    out = v.get<T>();
  } else {
    if (!v.is_string()) bad(where, k, "expected a string, got " + v.dump());
    out = v.get<std::string>();
  }
}

void apply_model(const json& t, const std::string& where, Model& m) {
  check_keys(t, where, "model",
             {"preset", "name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq",
              "experts", "top_k", "gated_mlp", "tied_embeddings", "learned_positions", "biases"});
  if (t.contains("preset")) {
    std::string p;
    get(t, "preset", where, "model", p);
    m = load_model(p);
  }
  get(t, "name", where, "model", m.name);
  get(t, "layers", where, "model", m.layers);
  get(t, "hidden", where, "model", m.hidden);
  get(t, "heads", where, "model", m.heads);
  get(t, "kv_heads", where, "model", m.kv_heads);
  get(t, "ffn", where, "model", m.ffn);
  get(t, "vocab", where, "model", m.vocab);
  get(t, "seq", where, "model", m.seq);
  get(t, "experts", where, "model", m.experts);
  get(t, "top_k", where, "model", m.top_k);
  get(t, "gated_mlp", where, "model", m.gated_mlp);
  get(t, "tied_embeddings", where, "model", m.tied_embeddings);
  get(t, "learned_positions", where, "model", m.learned_positions);
  get(t, "biases", where, "model", m.biases);
}

}  // namespace

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::none;
  if (s == "selective") return Recompute::selective;
  if (s == "full") return Recompute::full;
  throw Error(fmt::format("recompute '{}' is not one of none, selective, full", s));
}

std::vector<std::string> parse_order(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, '-');) out.push_back(part);
  return out;
}

json read_tree(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    throw Error(fmt::format("{}: no such file", file.string()));
  }
  if (file.extension() == ".json") {
    std::ifstream in(file);
    try {
      return json::parse(in);
    } catch (const json::exception& e) {
      throw Error(fmt::format("{}: JSON syntax error: {}", file.string(), e.what()));
    }
  }
  try {
    const toml::table t = toml::parse_file(file.string());
    std::ostringstream out;
    out << toml::json_formatter(t);
    return json::parse(out.str());
  } catch (const toml::parse_error& e) {
    throw Error(fmt::format("{}:{}: TOML syntax error: {}", file.string(), e.source().begin.line,
                            e.description()));
  }
}

void apply(const json& tree, const std::string& where, Request& r) {
  check_keys(tree, where, "(top level)", {"model", "training", "system", "layout"});
  if (tree.contains("model")) apply_model(tree["model"], where, r.model);
  if (tree.contains("training")) {
    const json& t = tree["training"];
    check_keys(t, where, "training",
               {"global_batch", "micro_batch", "tokens", "recipe", "attention", "dp_overlap",
                "tp_overlap", "grad_bytes", "price_per_chip_hour", "hbm_reserve"});
    Training& x = r.training;
    get(t, "global_batch", where, "training", x.global_batch);
    get(t, "micro_batch", where, "training", x.micro_batch);
    get(t, "tokens", where, "training", x.tokens);
    get(t, "recipe", where, "training", x.recipe);
    get(t, "attention", where, "training", x.attention);
    get(t, "dp_overlap", where, "training", x.dp_overlap);
    get(t, "tp_overlap", where, "training", x.tp_overlap);
    get(t, "grad_bytes", where, "training", x.grad_bytes);
    get(t, "price_per_chip_hour", where, "training", x.price_per_chip_hour);
    get(t, "hbm_reserve", where, "training", x.hbm_reserve);
  }
  if (tree.contains("system")) {
    const json& t = tree["system"];
    check_keys(t, where, "system", {"name", "chips", "lnc"});
    get(t, "name", where, "system", r.system);
    get(t, "chips", where, "system", r.chips);
    get(t, "lnc", where, "system", r.lnc);
  }
  if (tree.contains("layout")) {
    const json& t = tree["layout"];
    check_keys(
        t, where, "layout",
        {"dp", "tp", "pp", "vpp", "ep", "cp", "sp", "zero", "recompute", "order", "micro_batch"});
    Layout l = r.layout.value_or(Layout{});
    if (!r.layout) l.dp = 0;  // 0: what the other dimensions leave of the chips
    get(t, "dp", where, "layout", l.dp);
    get(t, "tp", where, "layout", l.tp);
    get(t, "pp", where, "layout", l.pp);
    get(t, "vpp", where, "layout", l.vpp);
    get(t, "ep", where, "layout", l.ep);
    get(t, "cp", where, "layout", l.cp);
    if (!t.contains("sp")) l.sp = l.tp > 1;  // Megatron's default with TP
    get(t, "sp", where, "layout", l.sp);
    r.sp_given = r.sp_given || t.contains("sp");
    get(t, "zero", where, "layout", l.zero);
    get(t, "micro_batch", where, "layout", l.micro_batch);
    std::string s;
    get(t, "recompute", where, "layout", s);
    if (!s.empty()) {
      try {
        l.recompute = parse_recompute(s);
      } catch (const Error& e) {
        bad(where, "layout.recompute", e.what());
      }
    }
    s.clear();
    get(t, "order", where, "layout", s);
    if (!s.empty()) l.order = parse_order(s);
    r.layout = l;
  }
}

Request load_request(const std::filesystem::path& file) {
  Request r;
  apply(read_tree(file), file.string(), r);
  return r;
}

Model load_model(const std::string& name_or_path) {
  std::filesystem::path file = name_or_path;
  if (name_or_path.find('/') == std::string::npos && !name_or_path.ends_with(".toml") &&
      !name_or_path.ends_with(".json")) {
    file = arch::data_dir() / "plan" / "models" / (name_or_path + ".toml");
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec)) {
      const auto names = list_models();
      throw Error(fmt::format("unknown model '{}' (known: {})", name_or_path,
                              fmt::format("{}", fmt::join(names, ", "))));
    }
  }
  const json tree = read_tree(file);
  check_keys(tree, file.string(), "(top level)", {"model"});
  if (!tree.contains("model")) bad(file.string(), "model", "missing [model] table");
  if (tree["model"].contains("preset"))
    bad(file.string(), "model.preset", "a preset cannot name another");
  Model m;
  apply_model(tree["model"], file.string(), m);
  return m;
}

std::vector<std::string> list_models() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e :
       std::filesystem::directory_iterator(arch::data_dir() / "plan" / "models", ec)) {
    if (e.path().extension() == ".toml") out.push_back(e.path().stem().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tern::plan
