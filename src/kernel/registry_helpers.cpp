#include "kernel/registry_detail.h"

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

namespace tern::kernel::reg {

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
ParamDoc dim_doc(const char* what) {
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

}  // namespace tern::kernel::reg
