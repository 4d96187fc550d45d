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

void add_row_kernels(std::vector<KernelEntry>& r) {
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
                {"trans", "false", "x given as [dim, K] (K contiguous), loaded by DMA transposes"},
                cores_doc()};
    e.build = [](const arch::ChipSpec& c, const Params& p) {
      MxQuantizeSpec s;
      s.trans = p.flag("trans");
      s.k = p.i64("k"), s.cols = p.i64("dim"), s.elem = p.dtype("elem"), s.cores = p.i32("cores");
      s.policy = num::parse_scale_policy(p.text("policy")), s.software = p.flag("software");
      return mx_quantize_kernel(c, s);
    };
    e.describe = [](const Params& p) {
      return fmt::format("mx_quantize [{}, {}]{} bf16 -> {} ({} scales{})", p.i64("k"),
                         p.i64("dim"), p.flag("trans") ? " given transposed" : "", p.text("elem"),
                         p.text("policy"), p.flag("software") ? ", software" : "");
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
}

}  // namespace tern::kernel::reg
