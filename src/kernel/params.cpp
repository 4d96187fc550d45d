#include "kernel/registry.h"

#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

#include "util/error.h"

namespace tern::kernel {

ParamKind ParamDoc::kind() const {
  if (declared != ParamKind::deduce) return declared;
  const std::string& d = default_value;
  if (d == "true" || d == "false") return ParamKind::flag;
  if (d.empty()) return ParamKind::text;
  char* end = nullptr;
  (void)std::strtoll(d.c_str(), &end, 10);
  if (*end == '\0') return ParamKind::integer;
  (void)std::strtod(d.c_str(), &end);
  if (*end == '\0') return ParamKind::number;
  try {
    (void)isa::parse_dtype(d);
    return ParamKind::dtype;
  } catch (const Error&) {
    return ParamKind::text;
  }
}

Params::Params(std::string kernel, const std::vector<ParamDoc>& docs,
               const std::map<std::string, std::string>& given)
    : kernel_(std::move(kernel)) {
  for (const auto& d : docs) values_[d.name] = d.default_value;
  for (const auto& [k, v] : given) {
    if (!values_.count(k)) {
      std::string known;
      for (const auto& d : docs) known += (known.empty() ? "" : ", ") + d.name;
      throw Error(fmt::format("kernel {}: unknown parameter '{}' (it has: {})", kernel_, k, known));
    }
    values_[k] = v;
  }
}

const std::string& Params::text(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end())
    throw Error(fmt::format("kernel {}: no parameter '{}' (internal)", kernel_, name));
  return it->second;
}

std::int64_t Params::i64(const std::string& name) const {
  const std::string& t = text(name);
  std::size_t used = 0;
  std::int64_t v = 0;
  try {
    v = std::stoll(t, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != t.size())
    throw Error(fmt::format("kernel {}: {} = '{}': expected an integer", kernel_, name, t));
  return v;
}

int Params::i32(const std::string& name) const {
  const std::int64_t v = i64(name);
  if (v < -(1LL << 31) || v >= (1LL << 31))
    throw Error(fmt::format("kernel {}: {} = {} is out of range", kernel_, name, v));
  return static_cast<int>(v);
}

float Params::f32(const std::string& name) const {
  const std::string& t = text(name);
  std::size_t used = 0;
  float v = 0;
  try {
    v = std::stof(t, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != t.size())
    throw Error(fmt::format("kernel {}: {} = '{}': expected a number", kernel_, name, t));
  return v;
}

bool Params::flag(const std::string& name) const {
  const std::string& t = text(name);
  if (t == "true" || t == "1") return true;
  if (t == "false" || t == "0") return false;
  throw Error(fmt::format("kernel {}: {} = '{}': expected true or false", kernel_, name, t));
}

isa::DType Params::dtype(const std::string& name) const {
  try {
    return isa::parse_dtype(text(name));
  } catch (const Error& e) {
    throw Error(fmt::format("kernel {}: {}: {}", kernel_, name, e.what()));
  }
}

}  // namespace tern::kernel
