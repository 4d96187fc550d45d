#include "kernel/registry.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "kernel/kernels.h"
#include "kernel/reference.h"
#include "num/convert.h"
#include "util/error.h"

namespace tern::kernel {

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

namespace {

using RoundFn = float (*)(float);
RoundFn rounder(isa::DType dt) {
  if (dt == isa::DType::bf16)
    return +[](float x) { return num::round_to(*isa::format_of(isa::DType::bf16), x); };
  if (dt == isa::DType::fp16)
    return +[](float x) { return num::round_to(*isa::format_of(isa::DType::fp16), x); };
  return +[](float x) { return x; };
}

const std::vector<float>& input(const NamedData& in, const std::string& name) {
  for (const auto& [n, v] : in)
    if (n == name) return v;
  throw Error(fmt::format("reference: no input '{}'", name));
}
const std::vector<float>* optional_input(const NamedData& in, const std::string& name) {
  for (const auto& [n, v] : in)
    if (n == name) return &v;
  return nullptr;
}

// Parameters shared by the row-wise kernels.
ParamDoc rows_doc() {
  return {"rows", "4096", "Rows (spread over the cores, 128 per tile)"};
}
ParamDoc dim_doc(const char* what = "Columns (the normalized dim)") {
  return {"dim", "4096", what};
}
ParamDoc cores_doc() {
  return {"cores", "1", "NeuronCores to spread the rows over"};
}

RmsNormSpec norm_spec(const Params& p, float default_eps) {
  RmsNormSpec s;
  s.rows = p.i64("rows"), s.dim = p.i64("dim"), s.dtype = p.dtype("dtype"),
  s.residual = p.flag("residual"), s.cores = p.i32("cores");
  s.eps = p.text("eps").empty() ? default_eps : p.f32("eps");
  return s;
}
std::vector<ParamDoc> norm_docs(const char* eps_default) {
  return {rows_doc(),
          dim_doc(),
          {"dtype", "bf16", "Tensor dtype: fp32, bf16 or fp16 (arithmetic in FP32)"},
          {"eps", "", fmt::format("Epsilon (default {})", eps_default)},
          {"residual", "false", "Fuse the residual add h = x + residual (outputs h too)"},
          cores_doc()};
}
std::string norm_describe(const char* what, const Params& p) {
  return fmt::format("{} [{}, {}] {}{}", what, p.i64("rows"), p.i64("dim"), p.text("dtype"),
                     p.flag("residual") ? " + residual" : "");
}

AdamWSpec adamw_spec(const Params& p) {
  AdamWSpec s;
  s.rows = p.i64("rows"), s.cols = p.i64("dim"), s.grad = p.dtype("dtype"), s.lr = p.f32("lr"),
  s.beta1 = p.f32("beta1"), s.beta2 = p.f32("beta2"), s.eps = p.f32("eps"),
  s.weight_decay = p.f32("weight_decay"), s.step = p.i64("step"), s.cores = p.i32("cores");
  return s;
}

MatmulSpec matmul_spec(const Params& p) {
  MatmulSpec s;
  s.m = p.i64("m"), s.n = p.i64("n"), s.k = p.i64("k"), s.in = p.dtype("dtype"),
  s.out = p.dtype("out");
  const int cores = p.i32("cores"), lnc = p.i32("lnc");
  s.cores = cores * lnc, s.lnc = lnc, s.epilogue = parse_epilogue(p.text("epilogue"));
  return s;
}

// Attention parameters shared by the forward and the backward.
std::vector<ParamDoc> attention_docs() {
  return {{"batch", "1", "Batch size"},
          {"q_heads", "8", "Query heads"},
          {"kv_heads", "0", "Key/value heads (GQA; 0: equal to q_heads)"},
          {"seq", "4096", "Query sequence length"},
          {"seq_k", "0", "Key sequence length (0: equal to seq)"},
          {"head_dim", "128", "Head dim: 64 or 128"},
          // "1" rather than "true": a flag defaulting to true could not be
          // turned off from the command line (--causal 0 does).
          {"causal", "1", "Causal mask, 1 or 0 (top-left: query i sees keys j <= i)"},
          {"scale", "", "Softmax scale (default 1/sqrt(head_dim))"},
          {"dtype", "bf16", "q, k, v, o (and gradient) dtype: bf16 or fp16"},
          {"cores", "0", "NeuronCores (0: all of the chip's)"}};
}
AttentionSpec attention_spec(const arch::ChipSpec& c, const Params& p) {
  AttentionSpec s;
  s.batch = p.i64("batch"), s.q_heads = p.i64("q_heads"), s.kv_heads = p.i64("kv_heads"),
  s.seq_q = p.i64("seq"), s.seq_k = p.i64("seq_k"), s.head_dim = p.i64("head_dim"),
  s.causal = p.flag("causal"), s.dtype = p.dtype("dtype"), s.cores = p.i32("cores");
  if (s.kv_heads == 0) s.kv_heads = s.q_heads;
  if (s.cores == 0) s.cores = c.cores;
  s.scale = p.text("scale").empty() ? 0.0f : p.f32("scale");
  if (!p.text("scale").empty() && s.scale == 0.0f)
    throw Error("kernel flash_attention: scale must be non-zero");
  return s;
}
// Forward FLOPs counting only unmasked (query, key) pairs: 2 matmuls of
// 2 D FLOPs per pair (S = Q K^T and O = P V), per batch and query head.
// Causal (top-left): query i attends to min(Sk, i + 1) keys.
double attention_flops(const Params& p) {
  const std::int64_t hq = p.i64("q_heads"), sq = p.i64("seq");
  const std::int64_t sk = p.i64("seq_k") > 0 ? p.i64("seq_k") : sq;
  double pairs = 0;
  if (p.flag("causal")) {
    const std::int64_t full = std::max<std::int64_t>(0, sq - sk);  // rows that see all keys
    const std::int64_t tri = std::min(sq, sk);                     // rows i < sk see i + 1
    pairs = static_cast<double>(tri) * static_cast<double>(tri + 1) / 2 +
            static_cast<double>(full) * static_cast<double>(sk);
  } else {
    pairs = static_cast<double>(sq) * static_cast<double>(sk);
  }
  return 4.0 * static_cast<double>(p.i64("batch") * hq * p.i64("head_dim")) * pairs;
}
std::string attention_describe(const char* what, const Params& p) {
  const std::int64_t kv = p.i64("kv_heads") > 0 ? p.i64("kv_heads") : p.i64("q_heads");
  return fmt::format("{} B={} Hq={} Hkv={} S={}{} D={} {}{}", what, p.i64("batch"),
                     p.i64("q_heads"), kv, p.i64("seq"),
                     p.i64("seq_k") > 0 ? fmt::format(" Sk={}", p.i64("seq_k")) : "",
                     p.i64("head_dim"), p.text("dtype"), p.flag("causal") ? " causal" : "");
}

std::vector<KernelEntry> make_registry() {
  std::vector<KernelEntry> r;

  {
    KernelEntry e;
    e.name = "matmul";
    e.summary = "C = A @ B (A given transposed) with a fused epilogue";
    e.bound = "compute";
    e.params = {
        {"m", "512", "Rows of C"},
        {"n", "512", "Columns of C"},
        {"k", "512", "Contraction"},
        {"dtype", "bf16", "Input dtype: bf16, fp32, fp8_e4m3, fp8_e5m2, fp8_e4m3_x4 (MXFP8)"},
        {"out", "fp32", "Output dtype"},
        {"epilogue", "", "Fused chain, e.g. scale=0.5,bias,gelu,residual"},
        {"cores", "1", "NeuronCores (logical cores with lnc 2)"},
        {"lnc", "1", "Logical NeuronCore size (1 or 2)"}};
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return matmul_kernel(c, matmul_spec(p));
    };
    e.reference = [](const arch::ChipSpec&, const Params& p, const NamedData& in) {
      const MatmulSpec s = matmul_spec(p);
      const bool mx = s.in == isa::DType::fp8_e4m3_x4 || s.in == isa::DType::fp8_e5m2_x4;
      const bool e5m2 = s.in == isa::DType::fp8_e5m2_x4;
      const auto& at = input(in, "at");
      const auto& b = input(in, "b");
      auto c = mx ? matmul_reference(mx_roundtrip_columns(at, s.k, s.m, e5m2),
                                     mx_roundtrip_columns(b, s.k, s.n, e5m2), s.m, s.n, s.k, false)
                  : matmul_reference(at, b, s.m, s.n, s.k, s.in == isa::DType::fp32);
      const std::vector<float> none;
      const auto* bias = optional_input(in, "bias");
      const auto* res = optional_input(in, "residual");
      epilogue_reference(c, bias ? *bias : none, res ? *res : none, s.epilogue, s.m, s.n);
      if (s.out != isa::DType::fp32) num::round_array(*isa::format_of(s.out), c);
      return NamedData{{"c", std::move(c)}};
    };
    e.useful_flops = [](const Params& p) {
      return 2.0 * static_cast<double>(p.i64("m")) * static_cast<double>(p.i64("n")) *
             static_cast<double>(p.i64("k"));
    };
    e.describe = [](const Params& p) {
      const std::string ep = p.text("epilogue");
      return fmt::format("matmul {}x{}x{} {} -> {}{}", p.i64("m"), p.i64("n"), p.i64("k"),
                         p.text("dtype"), p.text("out"), ep.empty() ? "" : " + " + ep);
    };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "epilogue";
    e.summary = "The epilogue chain as a standalone kernel (the unfused baseline)";
    e.params = {rows_doc(),
                dim_doc("Columns (N)"),
                {"epilogue", "bias,gelu", "The chain, e.g. scale=0.5,bias,gelu,residual"},
                {"dtype", "fp32", "Output dtype: fp32 or bf16 (input x is fp32)"}};
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return epilogue_kernel(c, p.i64("rows"), p.i64("dim"), parse_epilogue(p.text("epilogue")),
                             p.dtype("dtype"));
    };
    e.reference = [](const arch::ChipSpec&, const Params& p, const NamedData& in) {
      std::vector<float> y = input(in, "x");
      const std::vector<float> none;
      const auto* bias = optional_input(in, "bias");
      const auto* res = optional_input(in, "residual");
      epilogue_reference(y, bias ? *bias : none, res ? *res : none,
                         parse_epilogue(p.text("epilogue")), p.i64("rows"), p.i64("dim"));
      const isa::DType dt = p.dtype("dtype");
      if (dt != isa::DType::fp32) num::round_array(*isa::format_of(dt), y);
      return NamedData{{"y", std::move(y)}};
    };
    e.describe = [](const Params& p) {
      return fmt::format("epilogue {} [{}, {}] fp32 -> {}",
                         to_string(parse_epilogue(p.text("epilogue"))), p.i64("rows"), p.i64("dim"),
                         p.text("dtype"));
    };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "rmsnorm";
    e.summary = "RMSNorm forward (optional fused residual add); outputs y, rstd (, h)";
    e.params = norm_docs("1e-6");
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return rmsnorm_kernel(c, norm_spec(p, 1e-6f));
    };
    e.reference = [](const arch::ChipSpec&, const Params& p, const NamedData& in) {
      const RmsNormSpec s = norm_spec(p, 1e-6f);
      auto res =
          rmsnorm_reference(input(in, "x"), input(in, "gamma"), optional_input(in, "residual"),
                            s.rows, s.dim, s.eps, rounder(s.dtype));
      NamedData out{{"y", res.y}, {"rstd", res.rstd}};
      if (s.residual) out.emplace_back("h", res.h);
      return out;
    };
    e.describe = [](const Params& p) { return norm_describe("rmsnorm", p); };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "rmsnorm_backward";
    e.summary = "RMSNorm backward: dh and per-core dgamma partial sums";
    e.params = norm_docs("1e-6");
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return rmsnorm_backward_kernel(c, norm_spec(p, 1e-6f));
    };
    e.reference = [](const arch::ChipSpec& c, const Params& p, const NamedData& in) {
      const RmsNormSpec s = norm_spec(p, 1e-6f);
      auto res = rmsnorm_backward_reference(input(in, "dy"), input(in, "h"), input(in, "gamma"),
                                            input(in, "rstd"), s.rows, s.dim, s.cores,
                                            c.sbuf_partitions, rounder(s.dtype));
      return NamedData{{"dh", res.dh}, {"dgamma_parts", res.dgamma_parts}};
    };
    e.prepare = [](const Params&, const std::string& name, std::vector<float>& v) {
      if (name == "rstd")
        for (float& x : v) x = std::fabs(x);
    };
    e.describe = [](const Params& p) { return norm_describe("rmsnorm backward", p); };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "layernorm";
    e.summary = "LayerNorm forward (optional fused residual add); outputs y, mean, rstd (, h)";
    e.params = norm_docs("1e-5");
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return layernorm_kernel(c, norm_spec(p, 1e-5f));
    };
    e.reference = [](const arch::ChipSpec& c, const Params& p, const NamedData& in) {
      const RmsNormSpec s = norm_spec(p, 1e-5f);
      auto res = layernorm_reference(input(in, "x"), input(in, "gamma"), input(in, "beta"),
                                     optional_input(in, "residual"), s.rows, s.dim, s.eps,
                                     c.bn_stats_fmax, rounder(s.dtype));
      NamedData out{{"y", res.y}, {"mean", res.mean}, {"rstd", res.rstd}};
      if (s.residual) out.emplace_back("h", res.h);
      return out;
    };
    e.describe = [](const Params& p) { return norm_describe("layernorm", p); };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "adamw";
    e.summary = "One fused AdamW step over fp32 master weights; outputs the bf16 copy too";
    e.params = {rows_doc(),
                dim_doc("Columns (the parameters viewed as [rows, dim])"),
                {"dtype", "bf16", "Gradient dtype: fp32 or bf16"},
                {"lr", "0.001", "Learning rate"},
                {"beta1", "0.9", "Adam beta1"},
                {"beta2", "0.999", "Adam beta2"},
                {"eps", "1e-08", "Adam epsilon"},
                {"weight_decay", "0.01", "Decoupled weight decay"},
                {"step", "1", "The step t, from 1 (bias correction)"},
                cores_doc()};
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return adamw_kernel(c, adamw_spec(p));
    };
    e.reference = [](const arch::ChipSpec&, const Params& p, const NamedData& in) {
      std::vector<float> p0 = input(in, "param"), m0 = input(in, "m"), v0 = input(in, "v");
      auto pb = adamw_reference(p0, input(in, "grad"), m0, v0, adamw_spec(p));
      return NamedData{{"param_out", p0}, {"m_out", m0}, {"v_out", v0}, {"param_bf16", pb}};
    };
    e.prepare = [](const Params&, const std::string& name, std::vector<float>& v) {
      if (name == "v")
        for (float& x : v) x = std::fabs(x);
    };
    e.describe = [](const Params& p) {
      return fmt::format("adamw step {} [{}, {}] fp32 state, {} gradients", p.i64("step"),
                         p.i64("rows"), p.i64("dim"), p.text("dtype"));
    };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "flash_attention";
    e.summary = "FlashAttention-2 forward (online softmax, causal, GQA); outputs o and lse";
    e.bound = "compute";
    e.params = attention_docs();
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return flash_attention_kernel(c, attention_spec(c, p));
    };
    e.useful_flops = attention_flops;
    e.describe = [](const Params& p) { return attention_describe("flash attention", p); };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "flash_attention_backward";
    e.summary = "FlashAttention-2 backward: dq, dk, dv from q, k, v, o, do and lse";
    e.bound = "compute";
    e.params = attention_docs();
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return flash_attention_backward_kernel(c, attention_spec(c, p));
    };
    // The convention of FlashAttention's benchmarks: 5 matmuls (S, dP, dV,
    // dK, dQ) against the forward's 2, i.e. 2.5x the forward's FLOPs.
    e.useful_flops = [](const Params& p) { return 2.5 * attention_flops(p); };
    e.prepare = [](const Params& p, const std::string& name, std::vector<float>& v) {
      // lse >= the largest scaled score keeps P = exp(S - lse) <= 1 for
      // random q and k, as a real forward pass's lse does.
      if (name == "lse")
        for (float& x : v)
          x = std::fabs(x) + 0.25f * std::sqrt(static_cast<float>(p.i64("head_dim")));
    };
    e.describe = [](const Params& p) { return attention_describe("flash attention backward", p); };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "rope";
    e.summary = "Rotary position embedding (rotate-half) on x [B, H, S, D]; backward flag";
    e.params = {{"batch", "1", "Batch size"},
                {"heads", "8", "Heads"},
                {"seq", "4096", "Sequence length (positions; cos/sin tables [seq, head_dim/2])"},
                {"head_dim", "128", "Head dim (even)"},
                {"dtype", "bf16", "x / y dtype: fp32, bf16 or fp16 (tables fp32)"},
                {"backward", "false", "Rotate by -theta (the gradient of the forward)"},
                cores_doc()};
    auto spec = [](const Params& p) {
      RopeSpec s;
      s.batch = p.i64("batch"), s.heads = p.i64("heads"), s.seq = p.i64("seq"),
      s.head_dim = p.i64("head_dim"), s.dtype = p.dtype("dtype"), s.backward = p.flag("backward"),
      s.cores = p.i32("cores");
      return s;
    };
    e.build = [spec](const arch::ChipSpec& c, const Params& p) { return rope_kernel(c, spec(p)); };
    e.reference = [spec](const arch::ChipSpec&, const Params& p, const NamedData& in) {
      const RopeSpec s = spec(p);
      return NamedData{{"y", rope_reference(input(in, "x"), input(in, "cos"), input(in, "sin"), s,
                                            rounder(s.dtype))}};
    };
    e.describe = [](const Params& p) {
      return fmt::format("rope{} [{}, {}, {}, {}] {}", p.flag("backward") ? " backward" : "",
                         p.i64("batch"), p.i64("heads"), p.i64("seq"), p.i64("head_dim"),
                         p.text("dtype"));
    };
    r.push_back(std::move(e));
  }

  return r;
}

}  // namespace

const std::vector<KernelEntry>& kernel_registry() {
  static const std::vector<KernelEntry> r = make_registry();
  return r;
}

const KernelEntry& find_kernel(const std::string& name) {
  std::string known;
  for (const auto& e : kernel_registry()) {
    if (e.name == name) return e;
    known += (known.empty() ? "" : ", ") + e.name;
  }
  throw Error(fmt::format("no built-in kernel '{}' (there are: {})", name, known));
}

isa::Program build_kernel(const arch::ChipSpec& chip, const std::string& name,
                          const std::map<std::string, std::string>& given) {
  const KernelEntry& e = find_kernel(name);
  return e.build(chip, Params(e.name, e.params, given));
}

}  // namespace tern::kernel
