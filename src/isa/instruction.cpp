#include "isa/instruction.h"

#include <array>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include <fmt/format.h>

#include "util/error.h"

namespace tern::isa {

namespace {

template <typename E, std::size_t N>
E parse_named(std::string_view s, const std::array<std::string_view, N>& names, const char* what) {
  for (std::size_t i = 0; i < N; ++i) {
    if (names[i] == s) return static_cast<E>(i);
  }
  std::string known;
  for (auto n : names) known += (known.empty() ? "" : ", ") + std::string(n);
  throw Error(fmt::format("unknown {} '{}'; known: {}", what, s, known));
}

constexpr std::array<std::string_view, kEngines> kEngineNames = {"tensor", "vector", "scalar",
                                                                 "gpsimd", "sync"};
constexpr std::array<std::string_view, static_cast<std::size_t>(Opcode::count_)> kOpNames = {
    "dma_copy",
    "load_stationary",
    "multiply_moving",
    "transpose",
    "tensor_tensor",
    "tensor_scalar",
    "tensor_copy",
    "tensor_reduce",
    "memset",
    "activation",
    "iota",
    "quantize_mx",
    "reciprocal",
    "bn_stats",
    "bn_aggr",
    "select",
    "copy_predicated",
    "exponential",
    "affine_select",
    "partition_reduce",
    "dma_transpose",
    "reg_set",
    "reg_alu",
    "branch",
    "dma_gather",
    "dma_scatter",
    "max8",
    "find_index8",
    "match_replace8",
    "tensor_scan",
    "select_reduce",
    "range_select",
    "nonzero_count",
    "n_gather",
    "stream_shuffle",
    "local_gather",
    "core_sync",
    "sequence_bounds",
    "rng",
    "rng_state",
    "scalar_tensor_tensor"};
constexpr std::array<std::string_view, static_cast<std::size_t>(AluOp::count_)> kAluNames = {
    "bypass",  "add",         "subtract",   "multiply",    "divide",     "max",         "min",
    "abs_max", "pow",         "is_equal",   "not_equal",   "is_gt",      "is_ge",       "is_lt",
    "is_le",   "bitwise_and", "bitwise_or", "bitwise_xor", "shift_left", "shift_right", "rsqrt"};
constexpr std::array<std::string_view, static_cast<std::size_t>(ActFunc::count_)> kActNames = {
    "identity",   "exp",     "log",     "tanh",         "sigmoid",      "gelu",
    "gelu_tanh",  "silu",    "relu",    "rsqrt",        "sqrt",         "square",
    "reciprocal", "silu_dx", "gelu_dx", "gelu_tanh_dx", "gelu_sigmoid", "gelu_sigmoid_dx",
    "sin",        "cos",     "arctan",  "erf",          "erf_dx",       "softplus",
    "mish",       "sign",    "abs"};

}  // namespace

std::string_view engine_name(Engine e) {
  return kEngineNames[static_cast<std::size_t>(e)];
}
Engine parse_engine(std::string_view s) {
  return parse_named<Engine>(s, kEngineNames, "engine");
}
std::string_view opcode_name(Opcode op) {
  return kOpNames[static_cast<std::size_t>(op)];
}
Opcode parse_opcode(std::string_view s) {
  return parse_named<Opcode>(s, kOpNames, "opcode");
}
std::string_view alu_name(AluOp op) {
  return kAluNames[static_cast<std::size_t>(op)];
}
AluOp parse_alu(std::string_view s) {
  return parse_named<AluOp>(s, kAluNames, "ALU op");
}
std::string_view act_name(ActFunc f) {
  return kActNames[static_cast<std::size_t>(f)];
}
ActFunc parse_act(std::string_view s) {
  return parse_named<ActFunc>(s, kActNames, "activation function");
}

namespace {
// One definition of each operator, instantiated per operator so that the
// array forms dispatch once and their loops compile to straight code.
template <AluOp Op>
inline float alu(float a, float b) {
  if constexpr (Op == AluOp::bypass) return a;
  if constexpr (Op == AluOp::add) return a + b;
  if constexpr (Op == AluOp::subtract) return a - b;
  if constexpr (Op == AluOp::multiply) return a * b;
  if constexpr (Op == AluOp::divide) return a / b;
  if constexpr (Op == AluOp::max) return std::fmax(a, b);
  if constexpr (Op == AluOp::min) return std::fmin(a, b);
  if constexpr (Op == AluOp::abs_max) return std::fmax(std::fabs(a), std::fabs(b));
  if constexpr (Op == AluOp::pow) return std::pow(a, b);
  if constexpr (Op == AluOp::rsqrt) return 1.0f / std::sqrt(a);
  if constexpr (Op == AluOp::is_equal) return a == b ? 1.0f : 0.0f;
  if constexpr (Op == AluOp::not_equal) return a != b ? 1.0f : 0.0f;
  if constexpr (Op == AluOp::is_gt) return a > b ? 1.0f : 0.0f;
  if constexpr (Op == AluOp::is_ge) return a >= b ? 1.0f : 0.0f;
  if constexpr (Op == AluOp::is_lt) return a < b ? 1.0f : 0.0f;
  if constexpr (Op == AluOp::is_le) return a <= b ? 1.0f : 0.0f;
  // Bitwise and shift operators: integer tensors only (rejected before a run).
  if constexpr (Op == AluOp::bitwise_and || Op == AluOp::bitwise_or || Op == AluOp::bitwise_xor ||
                Op == AluOp::shift_left || Op == AluOp::shift_right)
    return std::numeric_limits<float>::quiet_NaN();
  return a;
}

// Calls f(std::integral_constant<AluOp, op>) for the runtime op.
template <typename F>
decltype(auto) with_alu(AluOp op, F&& f) {
  using A = AluOp;
  switch (op) {
#define TERN_ALU(x) \
  case A::x:        \
    return f(std::integral_constant<A, A::x>{});
    TERN_ALU(bypass)
    TERN_ALU(add)
    TERN_ALU(subtract)
    TERN_ALU(multiply)
    TERN_ALU(divide)
    TERN_ALU(max)
    TERN_ALU(min)
    TERN_ALU(abs_max)
    TERN_ALU(pow)
    TERN_ALU(rsqrt)
    TERN_ALU(is_equal)
    TERN_ALU(not_equal)
    TERN_ALU(is_gt)
    TERN_ALU(is_ge)
    TERN_ALU(is_lt)
    TERN_ALU(is_le)
    TERN_ALU(bitwise_and)
    TERN_ALU(bitwise_or)
    TERN_ALU(bitwise_xor)
    TERN_ALU(shift_left)
    TERN_ALU(shift_right)
#undef TERN_ALU
    case A::count_:
      break;
  }
  return f(std::integral_constant<A, A::bypass>{});
}
}  // namespace

float apply_alu(AluOp op, float a, float b) {
  return with_alu(op, [&](auto o) { return alu<decltype(o)::value>(a, b); });
}

void apply_alu(AluOp op, float* a, const float* b, std::size_t n) {
  with_alu(op, [&](auto o) {
    for (std::size_t i = 0; i < n; ++i) a[i] = alu<decltype(o)::value>(a[i], b[i]);
  });
}

void apply_alu(AluOp op, float* a, float s, std::size_t n) {
  with_alu(op, [&](auto o) {
    for (std::size_t i = 0; i < n; ++i) a[i] = alu<decltype(o)::value>(a[i], s);
  });
}

bool is_bitwise(AluOp op) {
  return op == AluOp::bitwise_and || op == AluOp::bitwise_or || op == AluOp::bitwise_xor ||
         op == AluOp::shift_left || op == AluOp::shift_right;
}

std::int64_t apply_alu_int(AluOp op, std::int64_t a, std::int64_t b, bool is_signed) {
  // The engines' integer ALU is 32 bits wide: shifts and wrap-around
  // arithmetic act on the 32-bit value (right_shift is logical, as NKI's).
  const auto u32 = static_cast<std::uint32_t>(a);
  const int sh = static_cast<int>(b & 31);
  auto wrap = [is_signed](std::uint32_t v) {
    return is_signed ? static_cast<std::int64_t>(static_cast<std::int32_t>(v))
                     : static_cast<std::int64_t>(v);
  };
  const auto ua = static_cast<std::uint64_t>(a);
  switch (op) {
    case AluOp::bypass:
      return a;
    case AluOp::add:
      return wrap(static_cast<std::uint32_t>(ua + static_cast<std::uint64_t>(b)));
    case AluOp::subtract:
      return wrap(static_cast<std::uint32_t>(ua - static_cast<std::uint64_t>(b)));
    case AluOp::multiply:
      return wrap(static_cast<std::uint32_t>(ua * static_cast<std::uint64_t>(b)));
    case AluOp::divide:
      return b == 0 ? 0 : a / b;
    case AluOp::max:
      return std::max(a, b);
    case AluOp::min:
      return std::min(a, b);
    case AluOp::abs_max:
      return std::max(a < 0 ? -a : a, b < 0 ? -b : b);
    case AluOp::is_equal:
      return a == b;
    case AluOp::not_equal:
      return a != b;
    case AluOp::is_gt:
      return a > b;
    case AluOp::is_ge:
      return a >= b;
    case AluOp::is_lt:
      return a < b;
    case AluOp::is_le:
      return a <= b;
    case AluOp::bitwise_and:
      return wrap(u32 & static_cast<std::uint32_t>(b));
    case AluOp::bitwise_or:
      return wrap(u32 | static_cast<std::uint32_t>(b));
    case AluOp::bitwise_xor:
      return wrap(u32 ^ static_cast<std::uint32_t>(b));
    case AluOp::shift_left:
      return wrap(u32 << sh);
    case AluOp::shift_right:
      return wrap(u32 >> sh);
    case AluOp::rsqrt:
    case AluOp::pow:
    case AluOp::count_:
      break;
  }
  throw NotSupported(fmt::format("integer {}", alu_name(op)));
}

void bn_stats_row(const float* x, std::size_t n, float out[6]) {
  for (std::size_t half = 0; half < 2; ++half) {
    float count = 0, sum = 0, m2 = 0;
    for (std::size_t i = half; i < n; i += 2) {
      sum += x[i];
      count += 1;
    }
    const float mean = count > 0 ? sum / count : 0.0f;
    for (std::size_t i = half; i < n; i += 2) {
      const float dlt = x[i] - mean;
      m2 += dlt * dlt;
    }
    out[3 * half] = count;
    out[3 * half + 1] = mean;
    out[3 * half + 2] = m2;
  }
}

void bn_aggr_row(const float* stats, std::size_t groups, float out[2]) {
  float n = 0, mean = 0, m2 = 0;
  for (std::size_t g = 0; g < groups; ++g) {
    const float nb = stats[3 * g], mb = stats[3 * g + 1], m2b = stats[3 * g + 2];
    if (nb == 0) continue;
    const float total = n + nb;
    const float delta = mb - mean;
    mean = mean + delta * (nb / total);
    m2 = m2 + m2b + delta * delta * (n * nb / total);
    n = total;
  }
  out[0] = mean;
  out[1] = n > 0 ? m2 / n : 0.0f;
}

float apply_act(ActFunc f, float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  switch (f) {
    case ActFunc::identity:
      return x;
    case ActFunc::exp:
      return std::exp(x);
    case ActFunc::log:
      return std::log(x);
    case ActFunc::tanh:
      return std::tanh(x);
    case ActFunc::sigmoid:
      return 1.0f / (1.0f + std::exp(-x));
    case ActFunc::gelu:
      return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f));
    case ActFunc::gelu_tanh:
      return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
    case ActFunc::silu:
      return x / (1.0f + std::exp(-x));
    case ActFunc::relu:
      return x > 0.0f ? x : 0.0f;
    case ActFunc::rsqrt:
      return 1.0f / std::sqrt(x);
    case ActFunc::sqrt:
      return std::sqrt(x);
    case ActFunc::square:
      return x * x;
    case ActFunc::reciprocal:
      return 1.0f / x;
    case ActFunc::silu_dx: {  // s (1 + x (1 - s)), s = sigmoid(x)
      const float s = 1.0f / (1.0f + std::exp(-x));
      return s * (1.0f + x * (1.0f - s));
    }
    case ActFunc::gelu_dx:  // Phi(x) + x phi(x)
      return 0.5f * (1.0f + std::erf(x * 0.7071067811865476f)) +
             x * 0.3989422804014327f * std::exp(-0.5f * x * x);
    case ActFunc::gelu_tanh_dx: {  // d/dx of 0.5 x (1 + tanh(u)), u = k (x + 0.044715 x^3)
      const float t = std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x));
      return 0.5f * (1.0f + t) +
             0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
    }
    case ActFunc::gelu_sigmoid:  // x sigmoid(1.702 x) (NKI gelu_apprx_sigmoid)
      return x / (1.0f + std::exp(-1.702f * x));
    case ActFunc::gelu_sigmoid_dx: {  // s (1 + 1.702 x (1 - s)), s = sigmoid(1.702 x)
      const float s = 1.0f / (1.0f + std::exp(-1.702f * x));
      return s * (1.0f + 1.702f * x * (1.0f - s));
    }
    case ActFunc::sin:
      return std::sin(x);
    case ActFunc::cos:
      return std::cos(x);
    case ActFunc::arctan:
      return std::atan(x);
    case ActFunc::erf:
      return std::erf(x);
    case ActFunc::erf_dx:  // 2 / sqrt(pi) exp(-x^2)
      return 1.1283791670955126f * std::exp(-x * x);
    case ActFunc::softplus:  // log(1 + e^x), without overflow for large x
      return x > 20.0f ? x : std::log1p(std::exp(x));
    case ActFunc::mish: {  // x tanh(softplus(x))
      const float sp = x > 20.0f ? x : std::log1p(std::exp(x));
      return x * std::tanh(sp);
    }
    case ActFunc::sign:
      return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x);
    case ActFunc::abs:
      return std::fabs(x);
    case ActFunc::count_:
      break;
  }
  return x;
}

float apply_act(ActFunc f, float* x, std::size_t n, float scale, float bias) {
  // Element by element through the one definition above; the switch is
  // cheap next to the transcendental functions most entries call.
  float sum = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = apply_act(f, x[i] * scale + bias);
    sum += x[i];
  }
  return sum;
}

std::int64_t indirect_hbm_bytes(const Instruction& in) {
  const AccessPattern& h = in.operands[in.op == Opcode::dma_gather ? 1 : 0];
  return in.operands[2].elements() * h.free_size() * size_bytes(h.dtype);
}

std::string to_string(const Instruction& in) {
  std::string s = fmt::format("{} {}", engine_name(in.engine), opcode_name(in.op));
  for (const auto& ap : in.operands) s += " (" + to_string(ap) + ")";
  const Instruction def;
  if (in.alu0 != def.alu0) s += fmt::format(" op0={}", alu_name(in.alu0));
  if (in.alu1 != def.alu1) s += fmt::format(" op1={}", alu_name(in.alu1));
  if (in.imm0 != def.imm0 || std::signbit(in.imm0)) s += fmt::format(" imm0={}", in.imm0);
  if (in.imm1 != def.imm1 || std::signbit(in.imm1)) s += fmt::format(" imm1={}", in.imm1);
  if (in.imm2 != def.imm2 || std::signbit(in.imm2)) s += fmt::format(" imm2={}", in.imm2);
  if (in.imm3 != def.imm3 || std::signbit(in.imm3)) s += fmt::format(" imm3={}", in.imm3);
  if (in.func != def.func) s += fmt::format(" func={}", act_name(in.func));
  if (in.scale != def.scale) s += fmt::format(" scale={}", in.scale);
  if (in.accumulate) s += " acc=1";
  if (in.negate) s += " negate=1";
  if (in.col0) s += " col0=1";
  if (in.col1) s += " col1=1";
  if (in.oob_skip) s += " oob=skip";
  if (in.reverse0) s += " rev0=1";
  if (in.peer_core >= 0) s += fmt::format(" peer={}", in.peer_core);
  if (in.reverse1) s += " rev1=1";
  if (!in.table.empty()) {
    s += " table=";
    for (std::size_t i = 0; i < in.table.size(); ++i)
      s += fmt::format("{}{}", i ? "," : "", in.table[i]);
  }
  if (in.queue != def.queue) s += fmt::format(" queue={}", in.queue);
  if (in.priority != def.priority) s += fmt::format(" priority={}", in.priority);
  if (in.hwdge) s += " dge=hw";
  if (in.perf == isa::PerfMode::double_row) s += " perf=double_row";
  if (in.rd >= 0) s += fmt::format(" rd={}", in.rd);
  if (in.ra >= 0) s += fmt::format(" ra={}", in.ra);
  if (in.rb >= 0) s += fmt::format(" rb={}", in.rb);
  if (in.target >= 0) s += fmt::format(" target={}", in.target);
  for (const auto& w : in.waits) {
    s += fmt::format(" wait={}>={}", w.sem, w.value);
    if (w.reg >= 0) s += fmt::format("+r{}", w.reg);
    if (w.core >= 0) s += fmt::format("^c{}", w.core);
  }
  for (int sig : in.signals) s += fmt::format(" signal={}", sig);
  if (!in.loc.empty()) s += " @" + in.loc;
  return s;
}

Instruction parse_instruction(const std::string& line) {
  Instruction in;
  std::string body = line;
  if (const auto at = body.find(" @"); at != std::string::npos) {
    in.loc = body.substr(at + 2);
    body = body.substr(0, at);
  }
  std::size_t pos = 0;
  auto next_word = [&]() {
    while (pos < body.size() && body[pos] == ' ') ++pos;
    const std::size_t start = pos;
    while (pos < body.size() && body[pos] != ' ') ++pos;
    return body.substr(start, pos - start);
  };
  in.engine = parse_engine(next_word());
  in.op = parse_opcode(next_word());
  while (true) {
    while (pos < body.size() && body[pos] == ' ') ++pos;
    if (pos >= body.size() || body[pos] != '(') break;
    const std::size_t close = body.find(')', pos);
    if (close == std::string::npos) throw Error(fmt::format("unclosed operand in '{}'", line));
    in.operands.push_back(parse_access(body.substr(pos + 1, close - pos - 1)));
    pos = close + 1;
  }
  for (std::string kv = next_word(); !kv.empty(); kv = next_word()) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos)
      throw Error(fmt::format("expected key=value, got '{}' in '{}'", kv, line));
    const std::string key = kv.substr(0, eq), val = kv.substr(eq + 1);
    auto number = [&]() {
      char* end = nullptr;
      const float v = std::strtof(val.c_str(), &end);
      if (end == val.c_str() || *end)
        throw Error(fmt::format("bad number '{}' for {} in '{}'", val, key, line));
      return v;
    };
    auto integer = [&]() {
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(val.c_str(), &end, 10);
      if (end == val.c_str() || *end || errno == ERANGE || v < INT32_MIN || v > INT32_MAX)
        throw Error(fmt::format("bad integer '{}' for {} in '{}' (a 32-bit int)", val, key, line));
      return static_cast<int>(v);
    };
    if (key == "op0")
      in.alu0 = parse_alu(val);
    else if (key == "op1")
      in.alu1 = parse_alu(val);
    else if (key == "imm0")
      in.imm0 = number();
    else if (key == "imm1")
      in.imm1 = number();
    else if (key == "imm2")
      in.imm2 = number();
    else if (key == "imm3")
      in.imm3 = number();
    else if (key == "func")
      in.func = parse_act(val);
    else if (key == "scale")
      in.scale = number();
    else if (key == "acc")
      in.accumulate = integer() != 0;
    else if (key == "negate")
      in.negate = integer() != 0;
    else if (key == "col0")
      in.col0 = integer() != 0;
    else if (key == "peer")
      in.peer_core = integer();
    else if (key == "rev0")
      in.reverse0 = integer() != 0;
    else if (key == "rev1")
      in.reverse1 = integer() != 0;
    else if (key == "table") {
      std::stringstream ts(val);
      for (std::string item; std::getline(ts, item, ',');) {
        char* end = nullptr;
        const long v = std::strtol(item.c_str(), &end, 10);
        if (end == item.c_str() || *end)
          throw Error(fmt::format("bad table entry '{}' in '{}'", item, line));
        in.table.push_back(static_cast<std::int32_t>(v));
      }
    } else if (key == "col1")
      in.col1 = integer() != 0;
    else if (key == "oob") {
      if (val != "skip" && val != "error")
        throw Error(fmt::format("oob '{}': expected error or skip in '{}'", val, line));
      in.oob_skip = val == "skip";
    } else if (key == "queue")
      in.queue = integer();
    else if (key == "perf") {
      if (val != "double_row" && val != "none")
        throw Error(fmt::format("perf '{}': expected none or double_row in '{}'", val, line));
      in.perf = val == "double_row" ? PerfMode::double_row : PerfMode::none;
    } else if (key == "priority")
      in.priority = integer();
    else if (key == "dge") {
      if (val != "hw" && val != "none")
        throw Error(fmt::format("dge '{}': expected none or hw in '{}'", val, line));
      in.hwdge = val == "hw";
    } else if (key == "rd")
      in.rd = integer();
    else if (key == "ra")
      in.ra = integer();
    else if (key == "rb")
      in.rb = integer();
    else if (key == "target")
      in.target = integer();
    else if (key == "signal")
      in.signals.push_back(integer());
    else if (key == "wait") {
      const auto ge = val.find(">=");
      if (ge == std::string::npos)
        throw Error(fmt::format("expected wait=SEM>=VALUE in '{}'", line));
      // Each number in range (atoi would wrap a long one into a valid index).
      auto num = [&](const char* at, long long lo, long long hi) {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(at, &end, 10);
        if (end == at || errno == ERANGE || v < lo || v > hi)
          throw Error(fmt::format("bad number in wait={} in '{}'", val, line));
        return v;
      };
      SemWait w{static_cast<int>(num(val.c_str(), 0, INT32_MAX)),
                num(val.c_str() + ge + 2, INT64_MIN, INT64_MAX), -1};
      if (const auto plus = val.find("+r", ge); plus != std::string::npos)
        w.reg = static_cast<int>(num(val.c_str() + plus + 2, 0, INT32_MAX));
      if (const auto hat = val.find("^c", ge); hat != std::string::npos)
        w.core = static_cast<int>(num(val.c_str() + hat + 2, 0, INT32_MAX));
      in.waits.push_back(w);
    } else {
      throw Error(fmt::format("unknown instruction field '{}' in '{}'", key, line));
    }
  }
  return in;
}

}  // namespace tern::isa
