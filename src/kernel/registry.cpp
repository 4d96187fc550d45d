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
#include "kernel/registry_detail.h"
#include "num/convert.h"
#include "util/error.h"

namespace tern::kernel {
namespace {

using namespace reg;  // the registry's helpers (registry_detail.h)

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
  add_row_kernels(r);
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
