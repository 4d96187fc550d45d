#include "plan/estimate.h"
#include "plan/request.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "util/error.h"

namespace tern::plan {

using fabric::Collective;
using fabric::Group;
using fabric::Op;

std::optional<Group> group_of(const Layout& l, std::string_view dim, const fabric::Network& net) {
  const auto size_of = [&](std::string_view d) {
    return d == "tp" ? l.tp : d == "cp" ? l.cp : d == "dp" ? l.dp : l.pp;
  };
  // Ranks are numbered with order[0] fastest: a dimension's group is `g`
  // ranks `stride` apart. Expert-parallel groups are the first ep of dp.
  const std::string_view base = dim == "ep" ? std::string_view("dp") : dim;
  std::int64_t stride = 1;
  for (const auto& d : l.order) {
    if (d == base) break;
    stride *= size_of(d);
  }
  const std::int64_t g = dim == "ep" ? l.ep : size_of(base);
  // Rank r sits at level j's coordinate (r / P_j) mod L_j, P_j the product
  // of the inner levels' sizes. For {i * stride}, i < g, that takes
  // min(g, L / gcd(stride / P, L)) values when P divides the stride, and
  // min(L, ceil(g / (P / stride))) when the stride divides P.
  Group out;
  std::int64_t P = 1, product = 1;
  for (const auto& lv : net.levels()) {
    const std::int64_t L = lv.size();
    std::int64_t s;
    if (stride % P == 0) {
      s = std::min<std::int64_t>(g, L / std::gcd((stride / P) % L, L));
    } else if (P % stride == 0) {
      const std::int64_t r = P / stride;
      s = std::min<std::int64_t>(L, (g + r - 1) / r);
    } else {
      return std::nullopt;
    }
    out.span.push_back(static_cast<int>(s));
    product *= s;
    P *= L;
  }
  if (product != g) return std::nullopt;
  return out;
}

namespace {

double ns(Nanoseconds t) {
  return t.value();
}

}  // namespace

namespace {
int checked_chips(int chips) {
  if (chips < 1 || chips > kMaxChips)
    throw Error(fmt::format("{} chips: a plan covers 1 to {} chips", chips, kMaxChips));
  return chips;
}
}  // namespace

fabric::Network rank_network(const arch::SystemSpec& s, int chips, int ranks_per_chip) {
  const fabric::Network net = fabric::Network::of(s, chips);
  if (ranks_per_chip == 1 || !s.chip) return net;
  const arch::ChipSpec& c = *s.chip;
  const fabric::Level on_chip{"on-chip (" + c.core_generation + ")",
                              arch::Topology::switched,
                              {ranks_per_chip},
                              c.hbm_bandwidth / (2.0 * ranks_per_chip),
                              c.dma.fixed_cost + c.dma.descriptor_gen};
  return net.with_ranks_per_chip(on_chip);
}

Planner::Planner(const arch::SystemSpec& system, Model model, Training training, int chips, int lnc)
    : system_(system),
      model_(std::move(model)),
      training_(std::move(training)),
      chips_(chips),
      lnc_(system.lnc_or_default(lnc)),
      net_(rank_network(system, checked_chips(chips), system.ranks_per_chip(lnc))),
      compute_(ComputeModel::of(system, system.ranks_per_chip(lnc))) {
  if (static_cast<std::int64_t>(chips) * ranks_per_chip() > kMaxChips) {
    throw Error(fmt::format("{} chips x {} ranks per chip: a plan covers at most {} ranks", chips,
                            ranks_per_chip(), kMaxChips));
  }
  if (auto e = validate(model_); !e.empty()) throw Error("model: " + e);
  if (auto e = validate(training_); !e.empty()) throw Error("training: " + e);
  dtype_ = training_.recipe;
  compute_.peak(dtype_);  // NotSupported naming the device when it lacks the recipe's type
  compute_.peak("bf16");
  const Model& m = model_;
  const double h = m.hidden, kvd = static_cast<double>(m.kv()) * m.head_dim(), f = m.ffn_dim();
  const double V = m.vocab, s = m.seq;
  const double attn = h * (h + 2 * kvd) + h * h + (m.biases ? h + 2 * kvd + h : 0);
  const double norms = 2 * (m.biases ? 2 * h : h);
  const double mlp_one =
      (m.gated_mlp ? 3 : 2) * h * f + (m.biases ? f * (m.gated_mlp ? 2 : 1) + h : 0);
  const double experts = m.moe() ? m.experts : 1;
  const double router = m.moe() ? h * m.experts : 0;
  layer_params_ = attn + norms + router;
  expert_params_ = mlp_one * experts;
  embed_params_ = V * h + (m.learned_positions ? s * h : 0);
  output_params_ = (m.tied_embeddings ? 0 : V * h) + (m.biases ? 2 * h : h);
  params_ = m.layers * (layer_params_ + expert_params_) + embed_params_ + output_params_;
  flop_params_ = m.layers * (attn + norms + router + mlp_one * (m.moe() ? m.top_k : 1)) + V * h;
}

Estimate Planner::estimate(const Layout& l) const {
  if (auto e = validate(model_, training_, l, ranks()); !e.empty()) throw Error("layout: " + e);
  std::string why;
  auto est = evaluate(l, &why);
  if (!est) throw NotSupported("layout: " + why);
  return *est;
}

std::optional<Estimate> Planner::evaluate(const Layout& l, std::string* why) const {
  try {
    return evaluate_or_throw(l, why);
  } catch (const NotSupported& e) {
    // A collective no algorithm of the system's library serves.
    if (why) *why = e.what();
    return std::nullopt;
  }
}

std::optional<Estimate> Planner::evaluate_or_throw(const Layout& l, std::string* why) const {
  const Model& m = model_;
  const Training& t = training_;
  const ComputeModel& c = compute_;
  const double T = l.tp, h = m.hidden, f = m.ffn_dim(), a = m.heads, d = m.head_dim();
  const double kvd = static_cast<double>(m.kv()) * d, V = m.vocab, s = m.seq;
  const int micro = l.micro_batch > 0 ? l.micro_batch : t.micro_batch;
  const double b = micro, sl = s / l.cp, tok = b * sl;
  const double layers = static_cast<double>(m.layers) / l.pp;  // per device, all chunks
  const std::int64_t mb = t.global_batch / (static_cast<std::int64_t>(l.dp) * micro);
  const bool flash = t.attention == "flash";
  const double topk = m.moe() ? m.top_k : 1;

  // ---- compute of one layer, one micro-batch, forward
  const double kv_cols = std::max(2 * kvd / T, 2 * d);  // K, V heads replicate when kv < tp
  double gemm = ns(c.gemm(tok, h, h / T + kv_cols, dtype_)) + ns(c.gemm(tok, h / T, h, dtype_));
  if (m.moe()) {
    const double local = static_cast<double>(m.experts) / l.ep;
    const double rows = tok * topk / local;  // tokens each local expert gets, on average
    gemm += local * (ns(c.gemm(rows, h, f * (m.gated_mlp ? 2 : 1) / T, dtype_)) +
                     ns(c.gemm(rows, f / T, h, dtype_)));
  } else {
    gemm += ns(c.gemm(tok, h, f * (m.gated_mlp ? 2 : 1) / T, dtype_)) +
            ns(c.gemm(tok, f / T, h, dtype_));
  }
  // QK^T and PV: 4 b (a/t) s_local s d FLOPs; a fused causal kernel skips
  // the masked half, the unfused one computes all of it.
  const double attn_flops = 4 * b * (a / T) * sl * s * d * (flash ? 0.5 : 1);
  const double attn_f = ns(c.attention(attn_flops, sl, d, flash, false));
  const double attn_b = flash ? ns(c.attention(2.5 * attn_flops, sl, d, true, true)) : 2 * attn_f;
  // HBM traffic of the bandwidth-bound kernels, bytes: two LayerNorms (read,
  // write: 4 B/element) and two bias-dropout-adds (two reads, a write, a
  // mask: 7 B), replicated across TP unless sequence parallel; the MLP
  // activation (read, write; gated: 3 tensors); unfused attention's scores:
  // written by QK^T, softmax in and out, dropout in, out and mask, read by PV
  // (13 B per score).
  const double rows_h = tok * h;
  const double scores = b * (a / T) * sl * s;
  const double mem_bytes = (l.sp ? rows_h / T : rows_h) * (8 + 14) +
                           tok * f / T * (m.gated_mlp ? 6 : 4) * topk + (flash ? 0 : 13 * scores);
  // Those are kernels of their own, each paying the kernel latency: two
  // LayerNorms, two bias-dropout-adds, the MLP activation; unfused
  // attention adds its softmax and dropout. The backward runs twice the
  // bytes and twice the kernels (each one's backward, LayerNorm's parameter
  // gradient reductions, the gradients' accumulation).
  const double mem_kernels = 5 + (flash ? 0 : 2);
  const double mem_f = ns(c.memory(mem_bytes, mem_kernels));
  const double layer_f = gemm + attn_f + mem_f;
  const double layer_b = 2 * gemm + attn_b + 2 * mem_f;
  double layer_r = 0;
  if (l.recompute == Recompute::full) layer_r = layer_f;
  if (l.recompute == Recompute::selective && !flash)
    layer_r = attn_f + ns(c.memory(13 * scores, 2));

  // ---- communication of one layer, one micro-batch
  const auto tp_g = group_of(l, "tp", net_), dp_g = group_of(l, "dp", net_);
  const auto pp_g = group_of(l, "pp", net_), cp_g = group_of(l, "cp", net_);
  const auto ep_g = group_of(l, "ep", net_);
  if (!tp_g || !dp_g || !pp_g || !cp_g || !ep_g) {
    if (why) {
      *why =
          fmt::format("the rank order {} places a group irregularly across the fabric levels of {}",
                      fmt::format("{}", fmt::join(l.order, "-")), system_.name);
    }
    return std::nullopt;
  }
  const auto cost = [&](Op op, double bytes, const Group& g) {
    return fabric::best(net_, Collective{op, Bytes(static_cast<std::int64_t>(bytes)), g});
  };
  Estimate e;
  e.layout = l;
  e.layout.micro_batch = micro;  // the one used, whoever set it
  double tp_one = 0;             // one forward all-reduce (or gather + scatter)
  if (l.tp > 1) {
    const double n = rows_h * 2;
    if (l.sp) {
      const auto ag = cost(Op::all_gather, n, *tp_g), rs = cost(Op::reduce_scatter, n, *tp_g);
      // Sequence parallel: each all-reduce becomes an all-gather (into
      // attention or the MLP) and a reduce-scatter (out of it); two of each.
      tp_one = 2 * (ns(ag.time) + ns(rs.time));
      e.time.tp_algorithm = std::string(fabric::algorithm_name(ag.algorithm));
    } else {
      const auto ar = cost(Op::all_reduce, n, *tp_g);
      tp_one = 2 * ns(ar.time);  // attention and MLP: two per pass
      e.time.tp_algorithm = std::string(fabric::algorithm_name(ar.algorithm));
    }
    tp_one *= 1 - t.tp_overlap;
  }
  double cp_f = 0, cp_b = 0;
  if (l.cp > 1) {
    const double kv_bytes = b * s * 2 * kvd / T * 2;  // the whole sequence's K and V
    cp_f = ns(cost(Op::all_gather, kv_bytes, *cp_g).time);
    cp_b = cp_f + ns(cost(Op::reduce_scatter, kv_bytes, *cp_g).time);
  }
  double ep_one = 0;  // dispatch + combine
  if (l.ep > 1) ep_one = 2 * ns(cost(Op::all_to_all, rows_h * topk * 2, *ep_g).time);
  const double full = l.recompute == Recompute::full ? 1 : 0;

  // ---- the last stage (it holds the output layer), one micro-batch
  // The final LayerNorm (4 B per element of the rows, two kernels back) and
  // the fused softmax cross-entropy (12 B per logit forward, 8 back).
  const double logit_f =
      ns(c.gemm(tok, h, V / T, dtype_)) + ns(c.memory(12 * tok * V / T + 4 * rows_h, 2));
  const double logit_b =
      2 * ns(c.gemm(tok, h, V / T, dtype_)) + ns(c.memory(8 * tok * V / T + 8 * rows_h, 3));
  // Parameters on one chip of the first stage (embedding) and of the last
  // (output layer; a tied embedding keeps a copy there); one stage holds
  // both.
  const double layer_share = layers * (layer_params_ + expert_params_ / l.ep) / T;
  const double output_share = (output_params_ + (m.tied_embeddings ? V * h : 0)) / T;
  const double first_params =
      layer_share + (l.pp == 1 ? (embed_params_ + output_params_) / T : embed_params_ / T);
  const double last_params = l.pp == 1 ? first_params : layer_share + output_share;
  const double stage_params = std::max(first_params, last_params);
  // Weight gradients accumulate into FP32 main-gradient buffers: every
  // micro-batch reads and writes 8 bytes per local parameter.
  const double accumulate = ns(c.memory(8 * last_params));
  // The embedding lookup (a gather, and the position add: read, write) and
  // its backward (a scatter-add into the table's gradient), on the first
  // stage; with one stage it is the modelled one.
  const double embed_f = l.pp == 1 ? ns(c.memory(4 * rows_h, 1)) : 0;
  const double embed_b = l.pp == 1 ? ns(c.memory(8 * rows_h, 1)) : 0;
  const double fwd = layers * layer_f + logit_f + embed_f;
  const double bwd = layers * layer_b + logit_b + accumulate + embed_b;
  const double rec = layers * layer_r;
  const double tp = layers * tp_one * (2 + full);  // forward, backward, recomputed forward
  const double cp = layers * (cp_f * (1 + full) + cp_b);
  const double ep = layers * ep_one * (2 + full);
  double p2p = 0;
  if (l.pp > 1) {
    // The slowest boundary paces the pipeline: the outermost level the
    // stages span.
    Group pair{std::vector<int>(pp_g->span.size(), 1)};
    for (std::size_t i = pair.span.size(); i-- > 0;) {
      if (pp_g->span[i] > 1) {
        pair.span[i] = 2;
        break;
      }
    }
    // Megatron's scatter/gather: each TP rank sends 1/t of the activation.
    const double n = rows_h * 2 / T;
    p2p = 2 * l.vpp * ns(cost(Op::send_recv, n, pair).time);
  }
  const double slot = fwd + bwd + rec + tp + cp + ep + p2p;
  const double mbd = static_cast<double>(mb);

  // ---- data parallel and the optimizer, on this chip's parameters
  const double dp = l.dp;
  double dp_sync = 0, dp_window = bwd + tp / (2 + full);
  double zero3 = 0;
  if (l.dp > 1) {
    const double grads = stage_params * t.grad_bytes;
    if (l.zero == 0) {
      const auto ar = cost(Op::all_reduce, grads, *dp_g);
      dp_sync = ns(ar.time);
      e.time.dp_algorithm = std::string(fabric::algorithm_name(ar.algorithm));
    } else {
      const auto rs = cost(Op::reduce_scatter, grads, *dp_g);
      dp_sync = ns(rs.time) + ns(cost(Op::all_gather, stage_params * 2, *dp_g).time);
      e.time.dp_algorithm = std::string(fabric::algorithm_name(rs.algorithm));
      // ZeRO-3 gathers the parameters again for every micro-batch's forward
      // and backward; prefetching hides them behind compute.
      if (l.zero == 3) {
        zero3 = 2 * mbd * ns(cost(Op::all_gather, stage_params * 2, *dp_g).time);
      }
    }
  }
  const double dp_exposed =
      ns(fabric::exposed(Nanoseconds(dp_sync), Nanoseconds(dp_window), t.dp_overlap)) +
      ns(fabric::exposed(Nanoseconds(zero3), Nanoseconds(mbd * (fwd + bwd)), t.dp_overlap));
  const double shard = l.zero >= 1 ? stage_params / dp : stage_params;
  // Clipping's global norm reads every FP32 gradient once (4 B) before
  // Adam; a multi-tensor kernel each.
  const double opt = ns(c.memory(shard * (4 + ComputeModel::kAdamBytesPerParam), 2));

  StepTime& st = e.time;
  st.forward = Nanoseconds(mbd * fwd);
  st.backward = Nanoseconds(mbd * bwd);
  st.recompute = Nanoseconds(mbd * rec);
  st.tp_comm = Nanoseconds(mbd * tp);
  st.cp_comm = Nanoseconds(mbd * cp);
  st.ep_comm = Nanoseconds(mbd * ep);
  st.pp_p2p = Nanoseconds(mbd * p2p);
  st.pp_bubble = Nanoseconds((l.pp - 1.0) / l.vpp * slot);
  st.dp_exposed = Nanoseconds(dp_exposed);
  st.dp_total = Nanoseconds(dp_sync + zero3);
  st.optimizer = Nanoseconds(opt);
  st.step = st.forward + st.backward + st.recompute + st.tp_comm + st.cp_comm + st.ep_comm +
            st.pp_p2p + st.pp_bubble + st.dp_exposed + st.optimizer;

  // ---- memory per chip: the first stage (embedding, the most micro-batches
  // in flight) or the last (output layer, logits), whichever needs more
  MemoryUse& mu = e.memory;
  // Saved activations per layer per token row, bytes (Korthikanti et al.
  // 2022, generalized to GQA, any ffn and gated MLPs): attention 7h + 4 kv d
  // (11h without GQA), MLP 3h + 4f (gated 3h + 6f; 19h for f = 4h) per
  // routed expert, LayerNorms 4h: 34h for GPT. Without sequence parallel,
  // 10h of it is replicated on every TP rank. Unfused attention adds the
  // scores: 5 a s / t.
  const double attn_h = 7 * h + 4 * kvd, mlp_h = (3 * h + (m.gated_mlp ? 6 : 4) * f) * topk;
  const double all_h = attn_h + mlp_h + 4 * h;
  const double base = l.sp ? all_h / T : 10 * h + (all_h - 10 * h) / T;
  const double score_row = 5 * a * s / T;
  double per_layer = base + (flash ? 0 : score_row);
  double working = 0;
  if (l.recompute == Recompute::selective) per_layer = base;
  if (l.recompute == Recompute::full) {
    working = (base + (flash ? 0 : score_row)) * sl * b;  // one layer rebuilt at a time
    per_layer = l.sp ? 2 * h / T : 2 * h;
  }
  // 1F1B: the first stage holds min(M, p) micro-batches, interleaving 1 +
  // (p - 1)/(p v) times that; the last holds one (interleaved: as the first,
  // for it also runs early chunks).
  const double interleave = l.vpp > 1 ? 1 + (l.pp - 1.0) / (l.pp * l.vpp) : 1;
  const double inflight_first = std::min<double>(mbd, l.pp) * interleave;
  const double inflight_last = l.vpp > 1 ? inflight_first : 1;
  const auto stage_memory = [&](double params, double inflight, bool logits) {
    MemoryUse u;
    u.weights = Bytes(static_cast<std::int64_t>(l.zero == 3 ? 2 * params / dp : 2 * params));
    u.grads = Bytes(static_cast<std::int64_t>(l.zero >= 2 ? 2 * params / dp : 2 * params));
    u.optimizer = Bytes(static_cast<std::int64_t>(l.zero >= 1 ? 12 * params / dp : 12 * params));
    u.activations =
        Bytes(static_cast<std::int64_t>(layers * per_layer * sl * b * inflight + working));
    u.logits = Bytes(logits ? static_cast<std::int64_t>(2 * 4 * tok * V / T) : 0);
    u.total = u.weights + u.grads + u.optimizer + u.activations + u.logits;
    return u;
  };
  mu = stage_memory(first_params, inflight_first, l.pp == 1);
  if (l.pp > 1) {
    const MemoryUse last = stage_memory(last_params, inflight_last, true);
    if (last.total > mu.total) mu = last;
  }
  mu.usable = Bytes(static_cast<std::int64_t>(static_cast<double>(c.device().hbm_capacity.value()) *
                                              (1 - t.hbm_reserve)));
  mu.fits = mu.total <= mu.usable;

  // ---- throughput
  e.micro_batches = mb;
  e.tokens_per_step = static_cast<double>(t.global_batch) * s;
  const double step_s = st.step.value() * 1e-9;
  e.tokens_per_s = e.tokens_per_step / step_s;
  // MFU: 6 N + 12 L h s FLOPs per token (training.md; N = flop_params()).
  e.model_flops_per_token = 6 * flop_params_ + 12.0 * m.layers * h * s;
  double recompute_per_token = 0;
  if (l.recompute == Recompute::full) {
    recompute_per_token = 2 * (flop_params_ - V * h) + 4.0 * m.layers * h * s;
  } else if (l.recompute == Recompute::selective && !flash) {
    recompute_per_token = 4.0 * m.layers * h * s;
  }
  const double chips = ranks();  // ranks x the rank's peak = chips x the chip's
  e.mfu = e.tokens_per_s * e.model_flops_per_token / (chips * c.peak(dtype_).value());
  e.hfu = e.tokens_per_s * (e.model_flops_per_token + recompute_per_token) /
          (chips * c.peak(dtype_).value());
  e.mfu_bf16 = e.tokens_per_s * e.model_flops_per_token / (chips * c.peak("bf16").value());
  if (t.tokens > 0) {
    const double seconds = t.tokens / e.tokens_per_s;
    e.days_to_train = seconds / 86400;
    e.chip_hours = seconds / 3600 * chips_;
    e.cost_usd = e.chip_hours * t.price_per_chip_hour;
  }
  return e;
}

}  // namespace tern::plan
