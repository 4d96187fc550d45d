// Plain-text tables for people: columns sized to their content, numbers
// right-aligned, an optional title line.
#pragma once

#include <string>
#include <vector>

namespace tern::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  // Columns are right-aligned when `right[i]` is true (default: column > 0).
  void set_align_right(std::vector<bool> right) { right_ = std::move(right); }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
  std::vector<bool> right_;
};

}  // namespace tern::cli
