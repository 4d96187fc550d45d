#include "arch/toml_reader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "util/error.h"

namespace tern::arch::detail {

TomlReader::TomlReader(std::filesystem::path file) : file_(std::move(file)) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file_, ec)) {
    throw Error(fmt::format("{}: no such hardware description file", file_.string()));
  }
  try {
    root_ = toml::parse_file(file_.string());
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw Error(fmt::format("{}:{}:{}: TOML syntax error: {}", file_.string(), b.line, b.column,
                            e.description()));
  }
}

std::string describe(const toml::node* n) {
  if (!n) return "nothing (the key is missing)";
  switch (n->type()) {
    case toml::node_type::string:
      return fmt::format("string \"{}\"", n->as_string()->get());
    case toml::node_type::integer:
      return fmt::format("integer {}", n->as_integer()->get());
    case toml::node_type::floating_point:
      return fmt::format("float {}", n->as_floating_point()->get());
    case toml::node_type::boolean:
      return fmt::format("boolean {}", n->as_boolean()->get());
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    default:
      return "a date/time";
  }
}

void TomlReader::fail(std::string_view key, std::string_view expected,
                      const toml::node* got) const {
  std::string where = file_.string();
  if (got && got->source().begin.line > 0) where += fmt::format(":{}", got->source().begin.line);
  throw Error(
      fmt::format("{}: key '{}': expected {}, got {}", where, key, expected, describe(got)));
}

const toml::node* TomlReader::find(std::string_view key) const {
  return root_.at_path(key).node();
}

bool TomlReader::has(std::string_view key) const {
  return find(key) != nullptr;
}

std::string TomlReader::string(std::string_view key) const {
  const toml::node* n = find(key);
  if (!n || !n->is_string() || n->as_string()->get().empty()) fail(key, "a non-empty string", n);
  return n->as_string()->get();
}

bool TomlReader::boolean(std::string_view key) const {
  const toml::node* n = find(key);
  if (!n || !n->is_boolean()) fail(key, "true or false", n);
  return n->as_boolean()->get();
}

std::int64_t TomlReader::integer(std::string_view key, std::int64_t min, std::int64_t max) const {
  const toml::node* n = find(key);
  const std::string expected = fmt::format("an integer in [{}, {}]", min, max);
  if (!n || !n->is_integer()) fail(key, expected, n);
  const std::int64_t v = n->as_integer()->get();
  if (v < min || v > max) fail(key, expected, n);
  return v;
}

double TomlReader::number(std::string_view key, double min, bool min_exclusive) const {
  const toml::node* n = find(key);
  const std::string expected = fmt::format("a number {} {}", min_exclusive ? ">" : ">=", min);
  if (!n || !(n->is_integer() || n->is_floating_point())) fail(key, expected, n);
  const double v =
      n->is_integer() ? static_cast<double>(n->as_integer()->get()) : n->as_floating_point()->get();
  if (!(min_exclusive ? v > min : v >= min) || v != v) fail(key, expected, n);
  return v;
}

const toml::table& TomlReader::table(std::string_view key) const {
  const toml::node* n = find(key);
  if (!n || !n->is_table()) fail(key, "a table", n);
  return *n->as_table();
}

void TomlReader::check_keys(std::string_view table_key, const toml::table& t,
                            std::initializer_list<std::string_view> allowed) const {
  for (const auto& [k, v] : t) {
    bool ok = false;
    for (std::string_view a : allowed) ok = ok || a == k.str();
    if (!ok) {
      const std::string known = fmt::format("{}", fmt::join(allowed, ", "));
      const std::string full =
          table_key.empty() ? std::string(k.str()) : fmt::format("{}.{}", table_key, k.str());
      throw Error(fmt::format("{}:{}: unknown key '{}' (known here: {})", file_.string(),
                              v.source().begin.line, full, known));
    }
  }
}

}  // namespace tern::arch::detail
