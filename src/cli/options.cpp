#include "cli/options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "util/error.h"
#include "util/file.h"

namespace tern::cli {
namespace {

std::string int_text(std::int64_t min, std::int64_t max) {
  if (max == INT64_MAX) return fmt::format("INT >= {}", min);
  return fmt::format("INT in [{}, {}]", min, max);
}
std::string number_text(double min, double max) {
  if (min <= -1e300 && max >= 1e300) return "FLOAT";
  if (max >= 1e300) return fmt::format("FLOAT >= {:g}", min);
  return fmt::format("FLOAT in [{:g}, {:g}]", min, max);
}

}  // namespace

CLI::Option* int_range(CLI::Option* o, std::int64_t min, std::int64_t max) {
  const std::string want = int_text(min, max);
  o->type_name(want);
  return o->check(CLI::Validator(
      [min, max, want](std::string& s) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || *end != '\0') return fmt::format("'{}' is not an integer ({})", s, want);
        if (errno == ERANGE || v < min || v > max)
          return fmt::format("{} is out of range ({})", s, want);
        return "";
      },
      ""));
}

CLI::Option* number_range(CLI::Option* o, double min, double max) {
  const std::string want = number_text(min, max);
  o->type_name(want);
  return o->check(CLI::Validator(
      [min, max, want](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0') return fmt::format("'{}' is not a number ({})", s, want);
        if (!std::isfinite(v)) return fmt::format("{} is not a finite number ({})", s, want);
        if (v < min || v > max) return fmt::format("{} is out of range ({})", s, want);
        return "";
      },
      ""));
}

CLI::Option* one_of(CLI::Option* o, const std::vector<std::string>& choices) {
  const std::string want = fmt::format("{{{}}}", fmt::join(choices, ","));
  o->type_name(want);
  return o->check(CLI::Validator(
      [choices, want](std::string& s) -> std::string {
        for (const std::string& c : choices)
          if (s == c) return "";
        return fmt::format("'{}' is not one of {}", s, want);
      },
      ""));
}

CLI::Option* output_file(CLI::Option* o) {
  return o->check(CLI::Validator(
      [](std::string& s) -> std::string {
        if (s.empty()) return "";
        try {
          check_writable_file(s, "");
        } catch (const Error& e) {
          return std::string(e.what()).substr(1);  // without the empty name's space
        }
        return "";
      },
      ""));
}

}  // namespace tern::cli
