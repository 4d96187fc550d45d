#include "cli/table.h"

#include <algorithm>

namespace tern::cli {

namespace {
// Display width in code points (UTF-8 continuation bytes take no column).
std::size_t width(const std::string& s) {
  std::size_t w = 0;
  for (unsigned char c : s) w += (c & 0xC0) != 0x80;
  return w;
}
}  // namespace

std::string Table::render() const {
  const std::size_t ncol = header_.size();
  std::vector<std::size_t> w(ncol, 0);
  for (std::size_t i = 0; i < ncol; ++i) w[i] = width(header_[i]);
  for (const auto& r : rows_) {
    for (std::size_t i = 0; i < std::min(ncol, r.size()); ++i) w[i] = std::max(w[i], width(r[i]));
  }
  auto line = [&](const std::vector<std::string>& r) {
    std::string out;
    for (std::size_t i = 0; i < ncol; ++i) {
      const std::string cell = i < r.size() ? r[i] : "";
      const bool right = i < right_.size() ? right_[i] : i > 0;
      const std::string pad(w[i] - width(cell), ' ');
      if (i) out += "  ";
      out += right ? pad + cell : cell + (i + 1 < ncol ? pad : "");
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(header_);
  std::string rule;
  for (std::size_t i = 0; i < ncol; ++i) rule += (i ? "  " : "") + std::string(w[i], '-');
  out += rule + "\n";
  for (const auto& r : rows_) out += line(r);
  return out;
}

}  // namespace tern::cli
