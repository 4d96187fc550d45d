// A plan request read from TOML or JSON (the same structure), with model
// presets from data/plan/models/<name>.toml. Unknown keys and wrong types
// are errors naming the file and the key.
//
//   [model]    preset = "llama3-70b" and/or layers, hidden, heads, ...
//   [training] global_batch, micro_batch, tokens, recipe, attention, ...
//   [system]   name, chips
//   [layout]   dp, tp, pp, vpp, ep, cp, sp, zero, recompute, order
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "plan/inputs.h"

namespace tern::plan {

// The most chips one plan covers (2^20): a bound on the searches (layouts
// are divisors of the chip count), far above any cluster built so far.
inline constexpr int kMaxChips = 1 << 20;

struct Request {
  Model model;
  Training training;
  std::string system;
  int chips = 0;
  int lnc = 0;                   // logical-core degree (Trainium v3+); 0: the chip's default
  std::optional<Layout> layout;  // absent: search; dp 0: chips / (tp pp cp)
  bool sp_given = false;         // the layout named sp (else: on when tp > 1)
};

// Parses a .toml or .json file into its JSON tree (TOML converted).
nlohmann::json read_tree(const std::filesystem::path& file);
// Fills `r` from a tree; `where` names the source in errors.
void apply(const nlohmann::json& tree, const std::string& where, Request& r);
Request load_request(const std::filesystem::path& file);

// A model preset by name (data/plan/models/<name>.toml) or path.
Model load_model(const std::string& name_or_path);
std::vector<std::string> list_models();

// Helpers shared with the CLI's flags.
Recompute parse_recompute(const std::string& s);
std::vector<std::string> parse_order(const std::string& s);

}  // namespace tern::plan
