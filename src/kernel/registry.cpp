#include "kernel/registry.h"

#include <bit>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>

#include <fmt/format.h>

#include "kernel/detail.h"
#include "kernel/kernels.h"
#include "kernel/reference.h"
#include "num/convert.h"
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
  if (p.values().count("out")) {  // the forward kernels' quantized output
    if (!p.text("out").empty()) s.out = p.dtype("out");
    s.qscale = p.flag("qscale"), s.amax = p.flag("amax"), s.mxfp8 = p.flag("mxfp8");
  }
  return s;
}

// The forward norms' output options.
std::vector<ParamDoc> with_quant_docs(std::vector<ParamDoc> d) {
  d.push_back({"out", "", "Output dtype of y (default: dtype; fp8_e4m3 / fp8_e5m2 saturate)",
               ParamKind::dtype});
  d.push_back({"qscale", "false", "Multiply y by the HBM input qscale [1, 1] before the cast"});
  d.push_back({"amax", "false", "Output amax [rows, 1]: max |y| per row before the scale"});
  d.push_back({"mxfp8", "false", "Also y MX-quantized along dim: y_q, y_scale (trn3)"});
  return d;
}

// The NormQuant a forward spec asks for (none without one).
std::optional<NormQuant> norm_quant(const RmsNormSpec& s, const NamedData& in) {
  if (!s.out && !s.qscale && !s.amax) return std::nullopt;
  NormQuant q;
  q.out = s.out_dtype(), q.qscale = s.qscale, q.amax = s.amax;
  if (s.qscale) q.scale = input(in, "qscale")[0];
  return q;
}
std::vector<ParamDoc> norm_docs(const char* eps_default) {
  return {rows_doc(),
          dim_doc(),
          {"dtype", "bf16", "Tensor dtype: fp32, bf16 or fp16 (arithmetic in FP32)"},
          {"eps", "", fmt::format("Epsilon (default {})", eps_default), ParamKind::number},
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
  s.trans_a = p.flag("trans_a"), s.trans_b = p.flag("trans_b"), s.batch = p.i64("batch");
  s.mx_prequantized = p.flag("mx_prequantized");
  return s;
}

SoftmaxSpec softmax_spec(const Params& p) {
  SoftmaxSpec s;
  s.rows = p.i64("rows"), s.dim = p.i64("dim"), s.dtype = p.dtype("dtype"),
  s.cores = p.i32("cores");
  return s;
}

CrossEntropySpec cross_entropy_spec(const Params& p) {
  CrossEntropySpec s;
  s.rows = p.i64("rows"), s.vocab = p.i64("vocab"), s.dtype = p.dtype("dtype"),
  s.chunk = p.i64("chunk"), s.cores = p.i32("cores");
  if (!p.text("grad_scale").empty()) s.grad_scale = p.f32("grad_scale");
  return s;
}

ElementwiseSpec elementwise_spec(const Params& p) {
  ElementwiseSpec s;
  s.rows = p.i64("rows"), s.cols = p.i64("dim"), s.op = parse_elementwise_op(p.text("op")),
  s.alpha = p.f32("alpha"), s.dtype = p.dtype("dtype"), s.cores = p.i32("cores");
  s.b_row = p.flag("b_row");
  return s;
}

ReduceSpec reduce_spec(const Params& p) {
  ReduceSpec s;
  s.rows = p.i64("rows"), s.cols = p.i64("dim"), s.op = parse_reduce_op(p.text("op")),
  s.all = p.flag("all"), s.dtype = p.dtype("dtype"), s.cores = p.i32("cores");
  return s;
}

ClipSpec clip_spec(const Params& p) {
  ClipSpec s;
  s.rows = p.i64("rows"), s.cols = p.i64("dim"), s.parts = p.i64("parts"),
  s.max_norm = p.f32("max_norm"), s.dtype = p.dtype("dtype"), s.cores = p.i32("cores");
  return s;
}

GluSpec glu_spec(const Params& p) {
  GluSpec s;
  s.rows = p.i64("rows"), s.cols = p.i64("dim"), s.dtype = p.dtype("dtype"),
  s.cores = p.i32("cores");
  try {
    s.act = isa::parse_act(p.text("act"));
  } catch (const Error&) {
    throw Error(
        fmt::format("kernel glu: act = '{}': expected silu, gelu or gelu_tanh", p.text("act")));
  }
  return s;
}

CastSpec cast_spec(const Params& p) {
  CastSpec s;
  s.rows = p.i64("rows"), s.cols = p.i64("dim"), s.in = p.dtype("in"), s.out = p.dtype("out"),
  s.scaled = p.flag("scaled"), s.amax = p.flag("amax"), s.cores = p.i32("cores");
  return s;
}

std::string rows_describe(const char* what, const Params& p) {
  return fmt::format("{} [{}, {}] {}", what, p.i64("rows"), p.i64("dim"), p.text("dtype"));
}

EmbeddingSpec embedding_spec(const Params& p) {
  EmbeddingSpec s;
  s.tokens = p.i64("tokens"), s.vocab = p.i64("vocab"), s.dim = p.i64("dim"),
  s.dtype = p.dtype("dtype"), s.cores = p.i32("cores");
  return s;
}
std::vector<ParamDoc> embedding_docs(const char* dtype_help) {
  return {{"tokens", "4096", "Tokens T (128 per tile)"},
          {"vocab", "32000", "Vocabulary rows V of the table"},
          {"dim", "1024", "Embedding dim D"},
          {"dtype", "bf16", dtype_help},
          {"cores", "1", "NeuronCores (forward: token tiles; backward: dim columns)"}};
}
// Random inputs -> token ids in [0, vocab): a hash of each value's bits
// (uniform, with the duplicates a real batch has), and the first and last
// tokens at the table's ends, rows 0 and V - 1. The simulator takes inputs
// as floats and encodes them into the tensor's dtype (int32 here), exact for
// integers up to 2^24.
void prepare_ids(const Params& p, const std::string& name, std::vector<float>& v) {
  if (name != "ids") return;
  const std::int64_t vocab = p.i64("vocab");
  if (vocab > (std::int64_t{1} << 24))
    throw NotSupported(fmt::format(
        "random token ids for vocab {} > 2^24 (inputs pass through float values)", vocab));
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint64_t h = std::bit_cast<std::uint32_t>(v[i]) + 0x9E3779B97F4A7C15ull * (i + 1);
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;  // splitmix64 finalizer
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    v[i] = static_cast<float>(h % static_cast<std::uint64_t>(vocab));
  }
  if (!v.empty()) v.front() = 0.0f;
  if (v.size() > 1) v.back() = static_cast<float>(vocab - 1);
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
          {"causal", "true",
           "Causal mask (top-left: query i sees keys j <= i); --causal false for none"},
          {"scale", "", "Softmax scale (default 1/sqrt(head_dim))", ParamKind::number},
          {"dtype", "bf16", "q, k, v, o (and gradient) dtype: bf16, fp16 or fp32"},
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

// A prepare hook setting the "qscale" input to `value` (large enough that
// FP8 outputs saturate somewhere, so the tests exercise it).
std::function<void(const Params&, const std::string&, std::vector<float>&)> qscale_input(
    float value) {
  return [value](const Params&, const std::string& input, std::vector<float>& v) {
    if (input == "qscale") v[0] = value;
  };
}

std::vector<KernelEntry> make_registry() {
  std::vector<KernelEntry> r;

  {
    KernelEntry e;
    e.name = "matmul";
    e.summary = "C = A @ B (A given transposed) with a fused epilogue";
    e.bound = "compute";
    e.params = {{"m", "512", "Rows of C"},
                {"n", "512", "Columns of C"},
                {"k", "512", "Contraction"},
                {"dtype", "bf16",
                 "Input dtype: bf16, fp16, fp32, fp8_e4m3, fp8_e5m2, fp8_e4m3_x4 / fp8_e5m2_x4 "
                 "(MXFP8), fp4_e2m1_x4 (MXFP4, with mx_prequantized)"},
                {"out", "fp32", "Output dtype"},
                {"epilogue", "", "Fused chain, e.g. scale=0.5,bias,gelu,residual,amax,qscale"},
                {"cores", "1", "NeuronCores (logical cores with lnc 2)"},
                {"lnc", "1", "Logical NeuronCore size (1 or 2)"},
                {"trans_a", "true", "A given as A^T [K, M] ('at'); false: as A [M, K] ('a')"},
                {"trans_b", "false", "B given as B^T [N, K] ('bt'); false: as B [K, N] ('b')"},
                {"batch", "1", "Independent products, operands stacked along their first dim"},
                {"mx_prequantized", "false",
                 "MX inputs: operands already quantized in HBM (at_q, at_scale, b_q, b_scale)"}};
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return matmul_kernel(c, matmul_spec(p));
    };
    e.reference = [](const arch::ChipSpec& chip, const Params& p, const NamedData& in) {
      const MatmulSpec s = matmul_spec(p);
      const bool mx = s.in == isa::DType::fp8_e4m3_x4 || s.in == isa::DType::fp8_e5m2_x4;
      const bool e5m2 = s.in == isa::DType::fp8_e5m2_x4;
      // Per batch: A^T [K, M] and B [K, N] in the reference's layout.
      const std::size_t M = static_cast<std::size_t>(s.m), N = static_cast<std::size_t>(s.n),
                        K = static_cast<std::size_t>(s.k);
      const auto& av = input(in, s.trans_a ? "at" : "a");
      const auto& bv = input(in, s.trans_b ? "bt" : "b");
      std::vector<float> c;
      for (std::size_t bi = 0; bi < static_cast<std::size_t>(s.batch); ++bi) {
        std::vector<float> at(K * M), b(K * N);
        for (std::size_t k = 0; k < K; ++k) {
          for (std::size_t i = 0; i < M; ++i)
            at[k * M + i] = s.trans_a ? av[bi * K * M + k * M + i] : av[bi * M * K + i * K + k];
          for (std::size_t j = 0; j < N; ++j)
            b[k * N + j] = s.trans_b ? bv[bi * N * K + j * K + k] : bv[bi * K * N + k * N + j];
        }
        auto cb =
            mx ? matmul_reference(mx_roundtrip_columns(at, s.k, s.m, e5m2),
                                  mx_roundtrip_columns(b, s.k, s.n, e5m2), s.m, s.n, s.k, false)
               : matmul_reference(at, b, s.m, s.n, s.k, s.in == isa::DType::fp32);
        c.insert(c.end(), cb.begin(), cb.end());
      }
      const std::vector<float> none;
      const auto* bias = optional_input(in, "bias");
      const auto* res = optional_input(in, "residual");
      epilogue_reference(c, bias ? *bias : none, res ? *res : none, s.epilogue, s.batch * s.m, s.n);
      const auto* qs = optional_input(in, "qscale");
      auto amax = epilogue_quant_reference(c, qs ? (*qs)[0] : 1.0f, s.epilogue, s.batch * s.m, s.n,
                                           detail::output_tile_columns(chip));
      round_output(c, s.out);
      NamedData out{{"c", std::move(c)}};
      if (s.epilogue.amax) out.emplace_back("amax", std::move(amax));
      return out;
    };
    e.useful_flops = [](const Params& p) {
      return 2.0 * static_cast<double>(p.i64("batch")) * static_cast<double>(p.i64("m")) *
             static_cast<double>(p.i64("n")) * static_cast<double>(p.i64("k"));
    };
    e.prepare = qscale_input(16.0f);
    e.describe = [](const Params& p) {
      const std::string ep = p.text("epilogue");
      const std::int64_t nb = p.i64("batch");
      return fmt::format("matmul {}{}x{}x{} {}{}{} -> {}{}", nb > 1 ? fmt::format("{} x ", nb) : "",
                         p.i64("m"), p.i64("n"), p.i64("k"), p.text("dtype"),
                         p.flag("trans_a") ? "" : " (A [M, K])", p.flag("trans_b") ? " (B^T)" : "",
                         p.text("out"), ep.empty() ? "" : " + " + ep);
    };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "epilogue";
    e.summary = "The epilogue chain as a standalone kernel (the unfused baseline)";
    e.params = {
        rows_doc(),
        dim_doc("Columns (N)"),
        {"epilogue", "bias,gelu", "The chain, e.g. scale=0.5,bias,gelu,residual"},
        {"dtype", "fp32", "Output dtype: fp32, bf16, fp8_e4m3, fp8_e5m2 (input x is fp32)"}};
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return epilogue_kernel(c, p.i64("rows"), p.i64("dim"), parse_epilogue(p.text("epilogue")),
                             p.dtype("dtype"));
    };
    e.reference = [](const arch::ChipSpec& chip, const Params& p, const NamedData& in) {
      std::vector<float> y = input(in, "x");
      const std::vector<float> none;
      const auto* bias = optional_input(in, "bias");
      const auto* res = optional_input(in, "residual");
      const Epilogue ep = parse_epilogue(p.text("epilogue"));
      epilogue_reference(y, bias ? *bias : none, res ? *res : none, ep, p.i64("rows"),
                         p.i64("dim"));
      const auto* qs = optional_input(in, "qscale");
      auto amax = epilogue_quant_reference(y, qs ? (*qs)[0] : 1.0f, ep, p.i64("rows"), p.i64("dim"),
                                           detail::output_tile_columns(chip));
      round_output(y, p.dtype("dtype"));
      NamedData out{{"y", std::move(y)}};
      if (ep.amax) out.emplace_back("amax", std::move(amax));
      return out;
    };
    e.prepare = qscale_input(16.0f);
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
    e.summary = "RMSNorm forward (optional fused residual add, quantized output); y, rstd (, h)";
    e.params = with_quant_docs(norm_docs("1e-6"));
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return rmsnorm_kernel(c, norm_spec(p, 1e-6f));
    };
    e.reference = [](const arch::ChipSpec&, const Params& p, const NamedData& in) {
      const RmsNormSpec s = norm_spec(p, 1e-6f);
      const auto q = norm_quant(s, in);
      auto res =
          rmsnorm_reference(input(in, "x"), input(in, "gamma"), optional_input(in, "residual"),
                            s.rows, s.dim, s.eps, rounder(s.dtype), q ? &*q : nullptr);
      NamedData out{{"y", res.y}, {"rstd", res.rstd}};
      if (s.residual) out.emplace_back("h", res.h);
      if (s.amax) out.emplace_back("amax", res.amax);
      return out;
    };
    e.prepare = qscale_input(128.0f);
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
    e.summary = "LayerNorm forward (fused residual add, quantized output); y, mean, rstd (, h)";
    e.params = with_quant_docs(norm_docs("1e-5"));
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return layernorm_kernel(c, norm_spec(p, 1e-5f));
    };
    e.reference = [](const arch::ChipSpec& c, const Params& p, const NamedData& in) {
      const RmsNormSpec s = norm_spec(p, 1e-5f);
      const auto q = norm_quant(s, in);
      auto res = layernorm_reference(input(in, "x"), input(in, "gamma"), input(in, "beta"),
                                     optional_input(in, "residual"), s.rows, s.dim, s.eps,
                                     c.bn_stats_fmax, rounder(s.dtype), q ? &*q : nullptr);
      NamedData out{{"y", res.y}, {"mean", res.mean}, {"rstd", res.rstd}};
      if (s.residual) out.emplace_back("h", res.h);
      if (s.amax) out.emplace_back("amax", res.amax);
      return out;
    };
    e.prepare = qscale_input(128.0f);
    e.describe = [](const Params& p) { return norm_describe("layernorm", p); };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "layernorm_backward";
    e.summary = "LayerNorm backward: dh and per-core dgamma / dbeta partial sums";
    e.params = norm_docs("1e-5");
    e.params[1].default_value = "2048";  // dgamma and dbeta share PSUM: D <= 2048 on trn3
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return layernorm_backward_kernel(c, norm_spec(p, 1e-5f));
    };
    e.reference = [](const arch::ChipSpec& c, const Params& p, const NamedData& in) {
      const RmsNormSpec s = norm_spec(p, 1e-5f);
      auto res = layernorm_backward_reference(input(in, "dy"), input(in, "h"), input(in, "gamma"),
                                              input(in, "mean"), input(in, "rstd"), s.rows, s.dim,
                                              s.cores, c.sbuf_partitions, rounder(s.dtype));
      return NamedData{
          {"dh", res.dh}, {"dgamma_parts", res.dgamma_parts}, {"dbeta_parts", res.dbeta_parts}};
    };
    e.prepare = [](const Params&, const std::string& name, std::vector<float>& v) {
      if (name == "rstd")
        for (float& x : v) x = std::fabs(x);
    };
    e.describe = [](const Params& p) { return norm_describe("layernorm backward", p); };
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
    e.name = "softmax";
    e.summary = "Softmax over the last dim (trn3)";
    e.params = {rows_doc(),
                dim_doc("Columns (the softmax dim)"),
                {"dtype", "bf16", "Tensor dtype: fp32, bf16 or fp16"},
                cores_doc()};
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return softmax_kernel(c, softmax_spec(p));
    };
    e.reference = [](const arch::ChipSpec&, const Params& p, const NamedData& in) {
      const SoftmaxSpec s = softmax_spec(p);
      return NamedData{{"y", softmax_reference(input(in, "x"), s.rows, s.dim, rounder(s.dtype))}};
    };
    e.describe = [](const Params& p) { return rows_describe("softmax", p); };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "softmax_backward";
    e.summary = "Softmax backward: dx = y * (dy - sum(dy * y))";
    e.params = {rows_doc(),
                dim_doc("Columns (the softmax dim)"),
                {"dtype", "bf16", "Tensor dtype: fp32, bf16 or fp16"},
                cores_doc()};
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return softmax_backward_kernel(c, softmax_spec(p));
    };
    e.reference = [](const arch::ChipSpec&, const Params& p, const NamedData& in) {
      const SoftmaxSpec s = softmax_spec(p);
      return NamedData{{"dx", softmax_backward_reference(input(in, "dy"), input(in, "y"), s.rows,
                                                         s.dim, rounder(s.dtype))}};
    };
    e.describe = [](const Params& p) { return rows_describe("softmax backward", p); };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "cross_entropy";
    e.summary = "Cross-entropy loss fused with softmax: per-token loss and dlogits in one kernel";
    e.params = {
        {"rows", "4096", "Tokens T (spread over the cores, 128 per tile)"},
        {"vocab", "50304", "Vocabulary V (the logits' columns)"},
        {"dtype", "bf16", "Logits and gradient dtype: fp32, bf16 or fp16"},
        {"grad_scale", "", "Gradient scale (default 1 / T, the mean loss)", ParamKind::number},
        {"chunk", "2048", "Columns per chunk of the two passes"},
        cores_doc()};
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return cross_entropy_kernel(c, cross_entropy_spec(p));
    };
    e.reference = [](const arch::ChipSpec&, const Params& p, const NamedData& in) {
      const CrossEntropySpec s = cross_entropy_spec(p);
      const float gs = std::isnan(s.grad_scale) ? 1.0f / static_cast<float>(s.rows) : s.grad_scale;
      auto res = cross_entropy_reference(input(in, "logits"), input(in, "targets"), s.rows, s.vocab,
                                         s.chunk, gs, rounder(s.dtype));
      return NamedData{{"loss", res.loss}, {"dlogits", res.dlogits}};
    };
    e.prepare = [](const Params& p, const std::string& name, std::vector<float>& v) {
      if (name != "targets") return;
      const std::int64_t vocab = p.i64("vocab");
      for (float& x : v)  // deterministic ids spread over [0, V)
        x = static_cast<float>(static_cast<std::int64_t>(std::fabs(x) * 7919.0f) %
                               std::max<std::int64_t>(vocab, 1));
    };
    e.describe = [](const Params& p) {
      return fmt::format("cross_entropy [{} tokens, vocab {}] {}", p.i64("rows"), p.i64("vocab"),
                         p.text("dtype"));
    };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "elementwise";
    e.summary =
        "Elementwise add, sub, mul (out = a op b), scale (alpha * a), activations f(a) and "
        "their gradients (b * f'(a))";
    e.params = {rows_doc(),
                {"dim", "4096", "Columns (any flattening of the tensors)"},
                {"op",
                 "add",
                 "The operation (the activations' backward: b * f'(a))",
                 ParamKind::choice,
                 {"add", "sub", "mul", "scale", "gelu", "gelu_tanh", "silu", "relu",
                  "gelu_backward", "gelu_tanh_backward", "silu_backward", "relu_backward"}},
                {"alpha", "1", "The factor of scale", ParamKind::number},
                {"b_row", "false", "add, sub, mul: b is one row [1, dim] for every row (a bias)"},
                {"dtype", "bf16", "Tensor dtype: fp32, bf16 or fp16"},
                cores_doc()};
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return elementwise_kernel(c, elementwise_spec(p));
    };
    e.reference = [](const arch::ChipSpec&, const Params& p, const NamedData& in) {
      const ElementwiseSpec s = elementwise_spec(p);
      const std::vector<float> none;
      const auto* b = optional_input(in, "b");
      return NamedData{
          {"out", elementwise_reference(input(in, "a"), b ? *b : none, s, rounder(s.dtype))}};
    };
    e.describe = [](const Params& p) {
      return fmt::format("elementwise {} [{}, {}] {}", p.text("op"), p.i64("rows"), p.i64("dim"),
                         p.text("dtype"));
    };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "reduce";
    e.summary = "Row reductions (sum, max, sum of squares) or per-core totals";
    e.params = {rows_doc(),
                dim_doc("Columns (reduced)"),
                {"op", "sum", "The reduction", ParamKind::choice, {"sum", "max", "sumsq"}},
                {"all", "false", "Reduce everything: one partial per core ([cores, 1])"},
                {"dtype", "bf16", "Input dtype: fp32, bf16 or fp16"},
                cores_doc()};
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return reduce_kernel(c, reduce_spec(p));
    };
    e.reference = [](const arch::ChipSpec& c, const Params& p, const NamedData& in) {
      return NamedData{
          {"out", reduce_reference(input(in, "x"), reduce_spec(p), c.sbuf_partitions)}};
    };
    e.describe = [](const Params& p) {
      return fmt::format("reduce {}{} [{}, {}] {}", p.text("op"), p.flag("all") ? " (all)" : "",
                         p.i64("rows"), p.i64("dim"), p.text("dtype"));
    };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "clip_by_global_norm";
    e.summary = "Gradient clipping by global norm from partial sums of squares";
    e.params = {rows_doc(),
                dim_doc("Columns (the gradient viewed as [rows, dim])"),
                {"parts", "8", "Partial sums of squares in sumsq_parts"},
                {"max_norm", "1", "The norm to clip to", ParamKind::number},
                {"dtype", "fp32", "Gradient dtype: fp32, bf16 or fp16"},
                cores_doc()};
    e.build = [](const arch::ChipSpec& c, const Params& p) { return clip_kernel(c, clip_spec(p)); };
    e.reference = [](const arch::ChipSpec&, const Params& p, const NamedData& in) {
      const ClipSpec s = clip_spec(p);
      auto res = clip_reference(input(in, "grad"), input(in, "sumsq_parts"), s, rounder(s.dtype));
      return NamedData{{"grad_out", res.grad}, {"norm", res.norm}};
    };
    e.prepare = [](const Params&, const std::string& name, std::vector<float>& v) {
      if (name == "sumsq_parts")  // sums of squares: >= 0, large enough to clip
        for (float& x : v) x = 100.0f * std::fabs(x);
    };
    e.describe = [](const Params& p) {
      return fmt::format("clip_by_global_norm [{}, {}] {} ({} partial sums)", p.i64("rows"),
                         p.i64("dim"), p.text("dtype"), p.i64("parts"));
    };
    r.push_back(std::move(e));
  }

  for (const bool backward : {false, true}) {
    KernelEntry e;
    e.name = backward ? "glu_backward" : "glu";
    e.summary = backward ? "SwiGLU / GeGLU backward: dgate and dup"
                         : "SwiGLU / GeGLU: out = act(gate) * up";
    e.params = {rows_doc(),
                dim_doc("Columns (the FFN width)"),
                {"act", "silu", "silu (SwiGLU), gelu or gelu_tanh (GeGLU)", ParamKind::text},
                {"dtype", "bf16", "Tensor dtype: fp32, bf16 or fp16"},
                cores_doc()};
    e.build = [backward](const arch::ChipSpec& c, const Params& p) {
      return backward ? glu_backward_kernel(c, glu_spec(p)) : glu_kernel(c, glu_spec(p));
    };
    e.reference = [backward](const arch::ChipSpec&, const Params& p, const NamedData& in) {
      const GluSpec s = glu_spec(p);
      if (!backward)
        return NamedData{
            {"out", glu_reference(input(in, "gate"), input(in, "up"), s.act, rounder(s.dtype))}};
      auto g = glu_backward_reference(input(in, "dout"), input(in, "gate"), input(in, "up"), s.act,
                                      rounder(s.dtype));
      return NamedData{{"dgate", g.dgate}, {"dup", g.dup}};
    };
    e.describe = [backward](const Params& p) {
      return fmt::format("glu{} {} [{}, {}] {}", backward ? " backward" : "", p.text("act"),
                         p.i64("rows"), p.i64("dim"), p.text("dtype"));
    };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "cast";
    e.summary = "Cast, per-tensor scaled FP8 quantize / dequantize, amax capture";
    e.params = {rows_doc(),
                dim_doc("Columns"),
                {"in", "bf16", "Input dtype: fp32, bf16, fp16, fp8_e4m3, fp8_e5m2"},
                {"out", "fp8_e4m3", "Output dtype (FP8 saturates)"},
                {"scaled", "true", "Multiply by the HBM input scale [1, 1] before the cast"},
                {"amax", "true", "Output the per-core max |x| (delayed scaling's amax)"},
                cores_doc()};
    e.build = [](const arch::ChipSpec& c, const Params& p) { return cast_kernel(c, cast_spec(p)); };
    e.reference = [](const arch::ChipSpec& c, const Params& p, const NamedData& in) {
      const CastSpec s = cast_spec(p);
      const auto* sc = optional_input(in, "scale");
      auto res = cast_reference(input(in, "x"), sc ? (*sc)[0] : 1.0f, s, c.sbuf_partitions);
      NamedData out{{"y", res.y}};
      if (s.amax) out.emplace_back("amax", res.amax);
      return out;
    };
    e.prepare = [](const Params& p, const std::string& name, std::vector<float>& v) {
      // A scale as delayed scaling would pick for normal(0, 1) data, and a
      // few large values so that FP8 saturation is exercised.
      if (name == "scale") v[0] = p.text("out").rfind("fp8", 0) == 0 ? 64.0f : 0.5f;
      if (name == "x" && p.text("in").rfind("fp8", 0) != 0)  // FP8 inputs: already in range
        for (std::size_t i = 0; i < v.size(); i += 97) v[i] *= 128.0f;  // exact
    };
    e.describe = [](const Params& p) {
      return fmt::format("cast [{}, {}] {} -> {}{}{}", p.i64("rows"), p.i64("dim"), p.text("in"),
                         p.text("out"), p.flag("scaled") ? " scaled" : "",
                         p.flag("amax") ? " + amax" : "");
    };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "fp8_scale";
    e.summary = "Per-tensor FP8 current scaling: scale = fp8_max / amax(x) and its inverse";
    e.params = {rows_doc(),
                dim_doc("Columns"),
                {"in", "bf16", "Input dtype: fp32, bf16, fp16"},
                {"fp8", "fp8_e4m3", "Target: fp8_e4m3 or fp8_e5m2"}};
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return fp8_scale_kernel(c, {p.i64("rows"), p.i64("dim"), p.dtype("in"), p.dtype("fp8")});
    };
    e.reference = [](const arch::ChipSpec&, const Params& p, const NamedData& in) {
      float amax = 0.0f;
      for (float v : input(in, "x")) amax = std::max(amax, std::fabs(v));
      const float fmax = static_cast<float>(isa::format_of(p.dtype("fp8"))->max_finite());
      const float s = amax > 0.0f && std::isfinite(amax)
                          ? std::min(fmax / amax, std::numeric_limits<float>::max())
                          : 1.0f;
      return NamedData{{"scale", {s}}, {"inv_scale", {1.0f / s}}};
    };
    e.describe = [](const Params& p) {
      return fmt::format("fp8_scale [{}, {}] {} for {}", p.i64("rows"), p.i64("dim"), p.text("in"),
                         p.text("fp8"));
    };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "transpose";
    e.summary = "out [batch * cols, rows] = in [batch * rows, cols]^T by Tensor-engine transposes";
    e.params = {rows_doc(),
                dim_doc("Columns"),
                {"batch", "1", "Matrices stacked along the first dim"},
                {"dtype", "bf16", "fp32, bf16 or fp16"},
                cores_doc()};
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return transpose_kernel(c, p.i64("rows"), p.i64("dim"), p.dtype("dtype"), p.i64("batch"),
                              p.i32("cores"));
    };
    e.reference = [](const arch::ChipSpec&, const Params& p, const NamedData& in) {
      const std::int64_t R = p.i64("rows"), C = p.i64("dim"), N = p.i64("batch");
      const std::vector<float>& x = input(in, "in");
      std::vector<float> y(x.size());
      for (std::int64_t m = 0; m < N; ++m)
        for (std::int64_t i = 0; i < R; ++i)
          for (std::int64_t c = 0; c < C; ++c)
            y[static_cast<std::size_t>((m * C + c) * R + i)] =
                x[static_cast<std::size_t>((m * R + i) * C + c)];
      return NamedData{{"out", y}};
    };
    e.describe = [](const Params& p) {
      return fmt::format("transpose {} x [{}, {}] {}", p.i64("batch"), p.i64("rows"), p.i64("dim"),
                         p.text("dtype"));
    };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "mx_quantize";
    e.summary =
        "MX block quantization on chip (trn3; QuantizeMX or ALU ops), the MX matmul's layout";
    e.params = {{"k", "4096", "Rows K (blocks of 32 along K)"},
                {"dim", "4096", "Columns"},
                {"elem", "fp8_e4m3_x4", "Element type: fp8_e4m3_x4, fp8_e5m2_x4 or fp4_e2m1_x4"},
                {"policy",
                 "trn3",
                 "Scale policy: trn3 (QuantizeMX for MXFP8), ocp-floor or rceil (ALU ops)",
                 ParamKind::choice,
                 {"trn3", "ocp-floor", "rceil"}},
                {"software", "false", "Use the ALU-op path even where QuantizeMX would do"},
                cores_doc()};
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      MxQuantizeSpec s;
      s.k = p.i64("k"), s.cols = p.i64("dim"), s.elem = p.dtype("elem"), s.cores = p.i32("cores");
      s.policy = num::parse_scale_policy(p.text("policy")), s.software = p.flag("software");
      return mx_quantize_kernel(c, s);
    };
    e.describe = [](const Params& p) {
      return fmt::format("mx_quantize [{}, {}] bf16 -> {} ({} scales{})", p.i64("k"), p.i64("dim"),
                         p.text("elem"), p.text("policy"), p.flag("software") ? ", software" : "");
    };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "mx_dequantize";
    e.summary = "MX dequantization on chip (identity MX matmuls; trn3)";
    e.params = {{"k", "4096", "Rows K (blocks of 32 along K)"},
                {"dim", "4096", "Columns"},
                {"elem", "fp8_e4m3_x4", "Element type: fp8_e4m3_x4, fp8_e5m2_x4, fp4_e2m1_x4"},
                {"out", "bf16", "Output dtype: fp32 or bf16"},
                cores_doc()};
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      MxDequantizeSpec s;
      s.k = p.i64("k"), s.cols = p.i64("dim"), s.elem = p.dtype("elem"), s.out = p.dtype("out"),
      s.cores = p.i32("cores");
      return mx_dequantize_kernel(c, s);
    };
    e.describe = [](const Params& p) {
      return fmt::format("mx_dequantize [{}, {}] {} -> {}", p.i64("k"), p.i64("dim"),
                         p.text("elem"), p.text("out"));
    };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "embedding";
    e.summary = "Embedding lookup: out[t] = table[ids[t]] by indirect DMA (gather)";
    e.params = embedding_docs("Table and output dtype: fp32, bf16 or fp16");
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return embedding_kernel(c, embedding_spec(p));
    };
    e.reference = [](const arch::ChipSpec&, const Params& p, const NamedData& in) {
      const EmbeddingSpec s = embedding_spec(p);
      return NamedData{{"out", embedding_reference(input(in, "ids"), input(in, "table"), s.tokens,
                                                   s.vocab, s.dim)}};
    };
    e.prepare = prepare_ids;
    e.describe = [](const Params& p) {
      return fmt::format("embedding {} tokens of [{}, {}] {}", p.i64("tokens"), p.i64("vocab"),
                         p.i64("dim"), p.text("dtype"));
    };
    r.push_back(std::move(e));
  }

  {
    KernelEntry e;
    e.name = "embedding_backward";
    e.summary =
        "Embedding backward: dtable = 0, dtable[ids[t]] += dout[t] in token order (scatter-add)";
    e.params = embedding_docs("dout dtype: fp32, bf16 or fp16 (dtable is fp32)");
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      return embedding_backward_kernel(c, embedding_spec(p));
    };
    e.reference = [](const arch::ChipSpec&, const Params& p, const NamedData& in) {
      const EmbeddingSpec s = embedding_spec(p);
      return NamedData{{"dtable", embedding_backward_reference(input(in, "ids"), input(in, "dout"),
                                                               s.tokens, s.vocab, s.dim)}};
    };
    e.prepare = prepare_ids;
    e.describe = [](const Params& p) {
      return fmt::format("embedding backward {} tokens of {} into [{}, {}] fp32", p.i64("tokens"),
                         p.text("dtype"), p.i64("vocab"), p.i64("dim"));
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

std::vector<float> random_values(const isa::HbmTensor& t, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(t.elements()));
  for (float& x : v) x = d(rng);
  if (const num::Format* f = isa::format_of(t.dtype); f && t.dtype != isa::DType::fp32)
    num::round_array(*f, v, {num::Rounding::nearest_even, num::Overflow::saturate, 0});
  return v;
}

NamedData make_inputs(const isa::Program& p, const KernelEntry& e, const Params& params,
                      std::uint64_t seed) {
  NamedData in;
  for (const auto& t : p.tensors) {
    if (t.kind != isa::TensorKind::input) continue;
    std::vector<float> v = random_values(t, seed++);
    if (e.prepare) e.prepare(params, t.name, v);
    in.emplace_back(t.name, std::move(v));
  }
  return in;
}

isa::Program build_kernel(const arch::ChipSpec& chip, const std::string& name,
                          const std::map<std::string, std::string>& given) {
  const KernelEntry& e = find_kernel(name);
  return e.build(chip, Params(e.name, e.params, given));
}

}  // namespace tern::kernel
