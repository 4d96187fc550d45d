// `tern num`: a number-format workbench for kernel authors.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/table.h"
#include "num/convert.h"
#include "num/format.h"
#include "num/mx.h"
#include "util/error.h"

namespace tern::cli {

namespace {

using nlohmann::json;

// A float the way people read it: shortest round-trip text.
std::string show(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{}", v);
}

// JSON has no NaN/Inf: they become strings.
json jnum(double v) {
  if (std::isfinite(v)) return v;
  return show(v);
}

float parse_value(const std::string& s) {
  if (s.empty()) throw Error("malformed number '': expected a decimal or hex float");
  errno = 0;
  char* end = nullptr;
  const float v = std::strtof(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0') {
    throw Error(
        fmt::format("malformed number '{}': expected a decimal or hex float such as "
                    "300.5, -1e-3, 0x1.8p3, inf or nan",
                    s));
  }
  return v;
}

std::uint32_t parse_code(const std::string& s, const num::Format& f) {
  int base = 10;
  std::string digits = s;
  if (s.size() > 2 && (s.starts_with("0x") || s.starts_with("0X"))) {
    base = 16;
    digits = s.substr(2);
  } else if (s.size() > 2 && (s.starts_with("0b") || s.starts_with("0B"))) {
    base = 2;
    digits = s.substr(2);
  }
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = digits.empty() || digits[0] == '-' || digits[0] == '+'
                                   ? 0
                                   : std::strtoull(digits.c_str(), &end, base);
  if (digits.empty() || !end || *end != '\0' || errno == ERANGE) {
    throw Error(
        fmt::format("malformed code '{}': expected an unsigned integer such as 0x7e, "
                    "126 or 0b01111110",
                    s));
  }
  if (v > f.code_mask()) {
    throw Error(fmt::format("code {} does not fit {} ({} bits, max 0x{:x})", s, f.name, f.bits,
                            f.code_mask()));
  }
  return static_cast<std::uint32_t>(v);
}

// "S EEEE MMM" fields of a code.
std::string fields(const num::Format& f, std::uint32_t code) {
  auto bits = [&](int hi, int n) {
    std::string s;
    for (int i = hi; i > hi - n; --i) s += ((code >> i) & 1u) ? '1' : '0';
    return s;
  };
  if (f.encoding == num::Encoding::e8m0) return bits(7, 8);
  if (f.encoding == num::Encoding::int_fixed) return bits(f.bits - 1, f.bits);
  return bits(f.bits - 1, 1) + " " + bits(f.bits - 2, f.exp_bits) + " " +
         bits(f.man_bits - 1, f.man_bits);
}

std::string classify(const num::Format& f, std::uint32_t code) {
  const float v = num::decode(f, code);
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return "inf";
  if (v == 0) return "zero";
  if (f.has_subnormals() && std::fabs(v) < f.min_normal()) return "subnormal";
  return "normal";
}

std::string hex(std::uint32_t code, const num::Format& f) {
  return fmt::format("0x{:0{}x}", code, (f.bits + 3) / 4);
}

void print(const json& j, bool as_json, const std::string& text) {
  std::fputs(as_json ? (j.dump(2) + "\n").c_str() : text.c_str(), stdout);
}

num::Rounding parse_rounding(const std::string& s) {
  if (s == "rne" || s == "nearest" || s == "nearest-even") return num::Rounding::nearest_even;
  if (s == "sr" || s == "stochastic") return num::Rounding::stochastic;
  throw Error(fmt::format("unknown rounding '{}': expected rne or sr", s));
}

struct CastArgs {
  std::string round = "rne";
  std::uint64_t seed = 0;
  bool sat = false;
  bool json = false;
};

void add_cast_options(CLI::App* cmd, CastArgs& a) {
  one_of(cmd->add_option("--round", a.round,
                         "Rounding: rne (nearest, ties to even) or sr (stochastic)")
             ->capture_default_str(),
         {"rne", "sr"});
  int_range(cmd->add_option("--seed", a.seed, "Seed of the stochastic rounding stream")
                ->capture_default_str(),
            0);
  cmd->add_flag("--json", a.json, "Print JSON");
}

void decode_cmd(CLI::App& num) {
  struct A {
    std::string fmt, code;
    bool json = false;
  };
  auto a = std::make_shared<A>();
  auto* cmd = num.add_subcommand("decode", "Value of a code: tern num decode e4m3 0x7e");
  cmd->add_option("format", a->fmt, "Format (see `tern num formats`)")->required();
  cmd->add_option("code", a->code, "Code: hex 0x.., binary 0b.. or decimal")->required();
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a] {
    const num::Format f = num::parse_format(a->fmt);
    const std::uint32_t code = parse_code(a->code, f);
    const float v = num::decode(f, code);
    const json j = {{"format", f.name},           {"code", code},
                    {"code_hex", hex(code, f)},   {"bits", fields(f, code)},
                    {"class", classify(f, code)}, {"value", jnum(v)}};
    print(j, a->json,
          fmt::format("{} {} = {}   [{}] {}\n", f.name, hex(code, f), show(v), fields(f, code),
                      classify(f, code)));
  });
}

void encode_cmd(CLI::App& num) {
  struct A : CastArgs {
    std::string fmt, value;
  };
  auto a = std::make_shared<A>();
  auto* cmd = num.add_subcommand("encode", "Code of a value: tern num encode e4m3 300.5 [--sat]");
  cmd->add_option("format", a->fmt, "Format (see `tern num formats`)")->required();
  cmd->add_option("value", a->value, "Value (decimal or hex float, inf, nan)")->required();
  add_cast_options(cmd, *a);
  cmd->add_flag("--sat", a->sat, "Saturate: overflow and Inf go to +-max finite");
  cmd->callback([a] {
    const num::Format f = num::parse_format(a->fmt);
    const float x = parse_value(a->value);
    const auto r = parse_rounding(a->round);
    const auto ovf = a->sat ? num::Overflow::saturate : num::Overflow::non_saturating;
    const std::uint32_t rnd = r == num::Rounding::stochastic ? num::sr_random(a->seed, 0) : 0;
    num::CastStats st;
    const std::uint32_t code = num::encode(f, x, r, ovf, rnd, 0, &st);
    const float v = num::decode(f, code);
    std::string status = "exact";
    if (st.nan)
      status = f.has_nan() ? "nan" : "nan (no NaN in format: +0)";
    else if (st.inf)
      status = a->sat ? "inf saturated" : "inf";
    else if (st.overflow)
      status = a->sat ? "overflow, saturated" : "overflow";
    else if (st.underflow)
      status = "underflow to zero";
    else if (v != x)
      status = "rounded";
    const std::string rname =
        r == num::Rounding::stochastic ? fmt::format("sr (seed {})", a->seed) : "rne";
    json j = {{"format", f.name},   {"input", a->value},        {"input_fp32", jnum(x)},
              {"code", code},       {"code_hex", hex(code, f)}, {"bits", fields(f, code)},
              {"value", jnum(v)},   {"rounding", a->round},     {"seed", a->seed},
              {"saturate", a->sat}, {"status", status}};
    std::string text =
        fmt::format("{} {} -> {} = {}   [{}]  {}, {}{}\n", f.name, show(x), hex(code, f), show(v),
                    fields(f, code), rname, a->sat ? "saturating" : "non-saturating",
                    status == "exact" ? "" : ", " + status);
    if (std::isfinite(x) && std::isfinite(v) && x != 0 && v != x) {
      j["error"] = static_cast<double>(v) - static_cast<double>(x);
      text += fmt::format("  error {} ({:+.3g} %)\n", show(double(v) - double(x)),
                          100.0 * (double(v) - double(x)) / double(x));
    }
    if (std::isinf(x) && a->value.find("inf") == std::string::npos) {
      text += fmt::format("  note: {} is beyond FP32's range: taken as {}\n", a->value, show(x));
    } else if (std::isfinite(x) && show(x) != a->value) {
      text += fmt::format("  note: the input is first rounded to FP32: {}\n", show(x));
    }
    print(j, a->json, text);
  });
}

void mx_cmd(CLI::App& num) {
  struct A : CastArgs {
    std::string fmt = "mxfp8-e4m3", policy = "rceil";
    std::vector<std::string> values;
  };
  auto a = std::make_shared<A>();
  auto* cmd =
      num.add_subcommand("mx",
                         "Quantize one or more 32-value MX blocks: tern num mx --format mxfp8-e4m3 "
                         "--policy rceil v1 ... v32");
  one_of(cmd->add_option("--format", a->fmt,
                         "mxfp8-e4m3, mxfp8-e5m2, mxfp6-e3m2, mxfp6-e2m3, mxfp4, mxint8")
             ->capture_default_str(),
         {"mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e3m2", "mxfp6-e2m3", "mxfp4", "mxint8"});
  one_of(cmd->add_option("--policy", a->policy, "Scale policy: ocp-floor, rceil or trn3")
             ->capture_default_str(),
         {"ocp-floor", "rceil", "trn3"});
  cmd->add_option("values", a->values,
                  "Values (a short last block is padded with zeros, which leaves amax unchanged)")
      ->required();
  add_cast_options(cmd, *a);
  cmd->callback([a] {
    const num::MxFormat& mf = num::parse_mx_format(a->fmt);
    const num::ScalePolicy pol = num::parse_scale_policy(a->policy);
    const num::Format& ef = num::format(mf.element);
    std::vector<float> in;
    for (const auto& s : a->values) in.push_back(parse_value(s));
    const std::size_t given = in.size();
    in.resize((given + num::kMxBlock - 1) / num::kMxBlock * num::kMxBlock, 0.0f);
    std::vector<std::uint8_t> el(in.size()), sc(in.size() / num::kMxBlock);
    num::CastOptions opt;
    opt.rounding = parse_rounding(a->round);
    opt.seed = a->seed;
    num::mx_quantize(mf, pol, in, el, sc, opt);
    std::vector<float> deq(in.size());
    num::mx_dequantize(mf, el, sc, deq);

    json blocks = json::array();
    std::string text = fmt::format(
        "{} ({} elements), policy {}, {} value(s){}\n", mf.name, ef.name, num::policy_name(pol),
        given, in.size() > given ? fmt::format(", padded with {} zero(s)", in.size() - given) : "");
    for (std::size_t b = 0; b < sc.size(); ++b) {
      const float scale = num::decode(num::format(num::FormatId::e8m0), sc[b]);
      const std::string sdesc = sc[b] == 0xFF
                                    ? "NaN (block holds NaN/Inf or the scale overflows)"
                                    : fmt::format("2^{} = {}", int(sc[b]) - 127, show(scale));
      text += fmt::format("\nblock {}: scale 0x{:02x} = {}\n", b, sc[b], sdesc);
      Table t({"i", "input", "code", "element", "dequantized", "error"});
      json elems = json::array();
      for (std::size_t j = 0; j < num::kMxBlock; ++j) {
        const std::size_t i = b * num::kMxBlock + j;
        if (i >= given) break;
        const float p = num::decode(ef, el[i]);
        const double err = double(deq[i]) - double(in[i]);
        t.add({std::to_string(i), show(in[i]), hex(el[i], ef), show(p), show(deq[i]),
               std::isfinite(err) ? show(err) : "-"});
        elems.push_back({{"input", jnum(in[i])},
                         {"code", el[i]},
                         {"element", jnum(p)},
                         {"dequantized", jnum(deq[i])}});
      }
      text += t.render();
      blocks.push_back({{"scale_code", sc[b]},
                        {"scale_exponent", sc[b] == 0xFF ? json(nullptr) : json(int(sc[b]) - 127)},
                        {"scale", jnum(scale)},
                        {"elements", elems}});
    }
    const json j = {
        {"format", mf.name},    {"element_format", ef.name}, {"policy", num::policy_name(pol)},
        {"rounding", a->round}, {"values", given},           {"blocks", blocks}};
    print(j, a->json, text);
  });
}

void formats_cmd(CLI::App& num) {
  auto json_out = std::make_shared<bool>(false);
  auto* cmd = num.add_subcommand("formats", "The properties of every number format");
  cmd->add_flag("--json", *json_out, "Print JSON");
  cmd->callback([json_out] {
    Table t({"format", "bits", "E", "M", "bias", "max finite", "min normal", "min subnormal", "Inf",
             "NaN", "description"});
    t.set_align_right({false, true, true, true, true, true, true, true, false, false, false});
    json j = json::array();
    for (const num::Format& f : num::builtin_formats()) {
      const bool fp = f.encoding != num::Encoding::int_fixed && f.encoding != num::Encoding::e8m0;
      const std::string nan =
          f.has_nan() ? hex(static_cast<std::uint32_t>(f.nan_code()), f) : "none";
      const std::string inf =
          f.has_inf() ? hex(static_cast<std::uint32_t>(f.inf_code()), f) : "none";
      t.add({f.name, std::to_string(f.bits),
             fp || f.encoding == num::Encoding::e8m0 ? std::to_string(f.exp_bits) : "-",
             std::to_string(f.man_bits),
             fp || f.encoding == num::Encoding::e8m0 ? std::to_string(f.bias) : "-",
             show(f.max_finite()), show(f.min_normal()), show(f.min_subnormal()), inf, nan,
             f.description});
      j.push_back({{"name", f.name},
                   {"bits", f.bits},
                   {"exp_bits", f.exp_bits},
                   {"man_bits", f.man_bits},
                   {"bias", f.bias},
                   {"max_finite", f.max_finite()},
                   {"min_normal", f.min_normal()},
                   {"min_subnormal", f.min_subnormal()},
                   {"has_inf", f.has_inf()},
                   {"has_nan", f.has_nan()},
                   {"description", f.description}});
    }
    print(j, *json_out,
          t.render() +
              "\nAlso: cfp8-e<E>m<M>-b<bias> (configurable-bias FP8, IEEE-like), "
              "e.g. cfp8-e4m3-b10. MX block formats: see `tern num mx --help`.\n");
  });
}

}  // namespace

void add_num_command(CLI::App& app) {
  auto* num = app.add_subcommand("num", "Number-format workbench: decode, encode, mx, formats");
  num->require_subcommand(1);
  decode_cmd(*num);
  encode_cmd(*num);
  mx_cmd(*num);
  formats_cmd(*num);
}

}  // namespace tern::cli
