#include "graph/models.h"

#include <cmath>
#include <initializer_list>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "util/error.h"

namespace tern::graph {

namespace {

// [B, S, n * hd] -> [B, n, S, hd]
int split_heads(Graph& g, int x, std::int64_t b, std::int64_t s, std::int64_t n, std::int64_t hd) {
  return g.transpose(g.reshape(x, {b, s, n, hd}), {0, 2, 1, 3});
}
// [B, n, S, hd] -> [B, S, n * hd]
int merge_heads(Graph& g, int x, std::int64_t b, std::int64_t s, std::int64_t n, std::int64_t hd) {
  return g.reshape(g.transpose(x, {0, 2, 1, 3}), {b, s, n * hd});
}

// A trained parameter of the model, listed in m.params.
int add_param(Model& m, const std::string& name, Shape shape, DType dt) {
  const int p = m.graph.param(name, std::move(shape), dt);
  m.params.push_back(p);
  return p;
}

// Each size >= 1 and bounded so that the graph's shapes and the compiler's
// products stay in range (the graph holds every layer: the layer bound
// keeps it in memory).
void check_sizes(const char* model, std::initializer_list<std::pair<const char*, std::int64_t>> v) {
  for (const auto& [name, x] : v) {
    const std::int64_t most = std::string_view(name) == "layers" ? 4096 : std::int64_t{1} << 24;
    if (x < 1 || x > most)
      throw Error(fmt::format("{}: {} {} is out of range (1 to {})", model, name, x, most));
  }
}

}  // namespace

Model gpt2(const Gpt2Config& c) {
  check_sizes("gpt2", {{"layers", c.layers},
                       {"dim", c.dim},
                       {"heads", c.heads},
                       {"vocab", c.vocab},
                       {"seq", c.seq},
                       {"batch", c.batch}});
  if (c.dim % c.heads != 0)
    throw Error(fmt::format("gpt2: dim {} is not a multiple of heads {}", c.dim, c.heads));
  Model m{Graph("gpt2"), -1, {}};
  Graph& g = m.graph;
  const std::int64_t B = c.batch, S = c.seq, D = c.dim, H = c.heads, hd = D / H;
  auto param = [&m](const std::string& name, Shape shape, DType dt) {
    return add_param(m, name, std::move(shape), dt);
  };
  const DType w = c.dtype;
  const int ids = g.input("ids", {B, S}, DType::int32);
  const int targets = g.input("targets", {B, S}, DType::int32);
  const int wte = param("wte", {c.vocab, D}, w), wpe = param("wpe", {S, D}, w);
  int x = g.add(g.embedding(wte, ids), wpe);
  g.rename(x, "embed");
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string p = fmt::format("h.{}.", l);
    const int ln1 = g.layernorm(x, param(p + "ln_1.w", {D}, w), param(p + "ln_1.b", {D}, w));
    g.rename(ln1, p + "ln_1");
    const int qkv = g.add(g.matmul(ln1, param(p + "attn.c_attn.w", {D, 3 * D}, w)),
                          param(p + "attn.c_attn.b", {3 * D}, w));
    g.rename(qkv, p + "qkv");
    auto head = [&](std::int64_t part) {
      return split_heads(g, g.slice(qkv, 2, part * D, (part + 1) * D), B, S, H, hd);
    };
    const int o =
        g.attention(head(0), head(1), head(2), true, 1.0 / std::sqrt(static_cast<double>(hd)))[0];
    const int pm = g.matmul(merge_heads(g, o, B, S, H, hd), param(p + "attn.c_proj.w", {D, D}, w));
    g.rename(pm, p + "attn.proj");  // before its bias: where tensor parallelism all-reduces
    const int proj = g.add(pm, param(p + "attn.c_proj.b", {D}, w));
    x = g.add(proj, x);
    g.rename(x, p + "resid_attn");
    const int ln2 = g.layernorm(x, param(p + "ln_2.w", {D}, w), param(p + "ln_2.b", {D}, w));
    g.rename(ln2, p + "ln_2");
    const int fc = g.act(Op::gelu_tanh, g.add(g.matmul(ln2, param(p + "mlp.c_fc.w", {D, 4 * D}, w)),
                                              param(p + "mlp.c_fc.b", {4 * D}, w)));
    g.rename(fc, p + "mlp.fc");
    const int fm = g.matmul(fc, param(p + "mlp.c_proj.w", {4 * D, D}, w));
    g.rename(fm, p + "mlp.proj");
    const int fp = g.add(fm, param(p + "mlp.c_proj.b", {D}, w));
    x = g.add(fp, x);
    g.rename(x, p + "out");
  }
  const int lnf = g.layernorm(x, param("ln_f.w", {D}, w), param("ln_f.b", {D}, w));
  g.rename(lnf, "ln_f");
  const int logits = g.matmul(lnf, wte, false, true);
  g.rename(logits, "logits");
  m.loss = g.cross_entropy(logits, targets);
  g.rename(m.loss, "loss");
  g.mark_output(m.loss);
  return m;
}

Graph gpt2_attention_shard(const Gpt2Config& c, std::int64_t layer, int tp) {
  if (tp < 1 || c.heads % tp != 0)
    throw Error(fmt::format("gpt2: tp {} does not divide heads {}", tp, c.heads));
  Graph g(fmt::format("h.{}.attn.tp", layer));
  const std::int64_t B = c.batch, S = c.seq, D = c.dim, H = c.heads / tp, hd = c.dim / c.heads;
  const std::int64_t W = H * hd;  // this rank's share of the width
  const std::string p = fmt::format("h.{}.", layer);
  const DType w = c.dtype;
  const int ln1 = g.input(p + "ln_1", {B, S, D}, w);
  const int qkv = g.add(g.matmul(ln1, g.param(p + "attn.c_attn.w", {D, 3 * W}, w)),
                        g.param(p + "attn.c_attn.b", {3 * W}, w));
  g.rename(qkv, p + "qkv");
  auto head = [&](std::int64_t part) {
    return split_heads(g, g.slice(qkv, 2, part * W, (part + 1) * W), B, S, H, hd);
  };
  const int o =
      g.attention(head(0), head(1), head(2), true, 1.0 / std::sqrt(static_cast<double>(hd)))[0];
  const int pm = g.matmul(merge_heads(g, o, B, S, H, hd), g.param(p + "attn.c_proj.w", {W, D}, w));
  g.rename(pm, p + "attn.proj");
  g.mark_output(pm);
  return g;
}

Graph gpt2_mlp_shard(const Gpt2Config& c, std::int64_t layer, int tp) {
  if (tp < 1 || (4 * c.dim) % tp != 0)
    throw Error(fmt::format("gpt2: tp {} does not divide the MLP width {}", tp, 4 * c.dim));
  Graph g(fmt::format("h.{}.mlp.tp", layer));
  const std::int64_t B = c.batch, S = c.seq, D = c.dim, F = 4 * c.dim / tp;
  const std::string p = fmt::format("h.{}.", layer);
  const DType w = c.dtype;
  const int ln2 = g.input(p + "ln_2", {B, S, D}, w);
  const int fc = g.act(Op::gelu_tanh, g.add(g.matmul(ln2, g.param(p + "mlp.c_fc.w", {D, F}, w)),
                                            g.param(p + "mlp.c_fc.b", {F}, w)));
  g.rename(fc, p + "mlp.fc");
  const int fm = g.matmul(fc, g.param(p + "mlp.c_proj.w", {F, D}, w));
  g.rename(fm, p + "mlp.proj");
  g.mark_output(fm);
  return g;
}

Model llama(const LlamaConfig& c) {
  check_sizes("llama", {{"layers", c.layers},
                        {"dim", c.dim},
                        {"heads", c.heads},
                        {"kv_heads", c.kv_heads},
                        {"ffn", c.ffn},
                        {"vocab", c.vocab},
                        {"seq", c.seq},
                        {"batch", c.batch}});
  if (c.dim % c.heads != 0 || c.heads % c.kv_heads != 0)
    throw Error(
        fmt::format("llama: dim {} must be a multiple of heads {}, and heads of kv heads {}", c.dim,
                    c.heads, c.kv_heads));
  Model m{Graph("llama"), -1, {}};
  Graph& g = m.graph;
  const std::int64_t B = c.batch, S = c.seq, D = c.dim, H = c.heads, K = c.kv_heads, hd = D / H;
  auto param = [&m](const std::string& name, Shape shape, DType dt) {
    return add_param(m, name, std::move(shape), dt);
  };
  const DType w = c.dtype;
  const int ids = g.input("ids", {B, S}, DType::int32);
  const int targets = g.input("targets", {B, S}, DType::int32);
  const int cs = g.input("cos", {S, hd / 2}, DType::fp32),
            sn = g.input("sin", {S, hd / 2}, DType::fp32);
  int x = g.embedding(param("embed", {c.vocab, D}, w), ids);
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    const int h = g.rmsnorm(x, param(p + "attn_norm", {D}, w), c.norm_eps);
    const int q =
        g.rope(split_heads(g, g.matmul(h, param(p + "wq", {D, H * hd}, w)), B, S, H, hd), cs, sn);
    const int k =
        g.rope(split_heads(g, g.matmul(h, param(p + "wk", {D, K * hd}, w)), B, S, K, hd), cs, sn);
    const int v = split_heads(g, g.matmul(h, param(p + "wv", {D, K * hd}, w)), B, S, K, hd);
    const int o = g.attention(q, k, v, true, 1.0 / std::sqrt(static_cast<double>(hd)))[0];
    g.rename(o, p + "attn");
    x = g.add(g.matmul(merge_heads(g, o, B, S, H, hd), param(p + "wo", {H * hd, D}, w)), x);
    const int h2 = g.rmsnorm(x, param(p + "ffn_norm", {D}, w), c.norm_eps);
    const int gate = g.act(Op::silu, g.matmul(h2, param(p + "w_gate", {D, c.ffn}, w)));
    const int up = g.matmul(h2, param(p + "w_up", {D, c.ffn}, w));
    x = g.add(g.matmul(g.mul(gate, up), param(p + "w_down", {c.ffn, D}, w)), x);
    g.rename(x, p + "out");
  }
  const int hn = g.rmsnorm(x, param("norm", {D}, w), c.norm_eps);
  const int logits = g.matmul(hn, param("lm_head", {D, c.vocab}, w));
  g.rename(logits, "logits");
  m.loss = g.cross_entropy(logits, targets);
  g.rename(m.loss, "loss");
  g.mark_output(m.loss);
  return m;
}

}  // namespace tern::graph
