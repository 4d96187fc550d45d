// Private to arch: typed, validated access to a parsed TOML file. Every
// error names the file, the dotted key and what was expected; unknown keys
// are errors too (a typo must not silently fall back to nothing).
#pragma once

#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <toml++/toml.h>

namespace tern::arch::detail {

class TomlReader {
 public:
  // Parses `file`; a missing file or a syntax error is a tern::Error.
  explicit TomlReader(std::filesystem::path file);

  const std::filesystem::path& file() const { return file_; }
  const toml::table& root() const { return root_; }

  // Required values. `key` is dotted ("hbm.capacity_gib").
  std::string string(std::string_view key) const;
  std::int64_t integer(std::string_view key, std::int64_t min, std::int64_t max) const;
  // Accepts integers and floats; requires min < value (exclusive) or min <= value.
  double number(std::string_view key, double min, bool min_exclusive = true) const;
  bool has(std::string_view key) const;
  bool boolean(std::string_view key) const;

  // The table at `key` (required) and its keys checked against `allowed`.
  const toml::table& table(std::string_view key) const;
  void check_keys(std::string_view table_key, const toml::table& t,
                  std::initializer_list<std::string_view> allowed) const;

  [[noreturn]] void fail(std::string_view key, std::string_view expected,
                         const toml::node* got) const;

 private:
  const toml::node* find(std::string_view key) const;
  std::filesystem::path file_;
  toml::table root_;
};

// Error from a node inside an array of tables: "file: key[i].sub: ...".
std::string describe(const toml::node* n);

}  // namespace tern::arch::detail
