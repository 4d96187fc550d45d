#include "plan/inputs.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace tern::plan {

std::string_view recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none:
      return "none";
    case Recompute::selective:
      return "selective";
    case Recompute::full:
      return "full";
  }
  return "?";
}

namespace {

void add(std::string& out, const std::string& what) {
  if (what.empty()) return;
  out += (out.empty() ? "" : "; ") + what;
}

}  // namespace

std::string validate(const Model& m) {
  std::string e;
  for (auto [name, v] : {std::pair{"layers", m.layers},
                         {"hidden", m.hidden},
                         {"heads", m.heads},
                         {"vocab", m.vocab},
                         {"seq", m.seq}}) {
    if (v <= 0) add(e, fmt::format("model.{} must be positive (got {})", name, v));
  }
  if (!e.empty()) return e;
  if (m.hidden % m.heads != 0) {
    add(e, fmt::format("hidden {} is not a multiple of heads {}", m.hidden, m.heads));
  }
  if (m.kv_heads < 0 || m.heads % m.kv() != 0) {
    add(e, fmt::format("heads {} is not a multiple of kv_heads {}", m.heads, m.kv_heads));
  }
  if (m.ffn < 0) add(e, fmt::format("model.ffn must be positive (got {})", m.ffn));
  if (m.experts < 0) add(e, fmt::format("model.experts must be 0 or more (got {})", m.experts));
  if (m.moe() && (m.top_k < 1 || m.top_k > m.experts)) {
    add(e, fmt::format("top_k {} must be between 1 and experts {}", m.top_k, m.experts));
  }
  return e;
}

std::string validate(const Training& t) {
  std::string e;
  if (t.global_batch <= 0)
    add(e, fmt::format("training.global_batch must be positive (got {})", t.global_batch));
  if (t.micro_batch <= 0)
    add(e, fmt::format("training.micro_batch must be positive (got {})", t.micro_batch));
  if (t.recipe != "bf16" && t.recipe != "fp8" && t.recipe != "mxfp8") {
    add(e, fmt::format("training.recipe '{}' is not one of bf16, fp8, mxfp8", t.recipe));
  }
  if (t.attention != "flash" && t.attention != "unfused") {
    add(e, fmt::format("training.attention '{}' is not flash or unfused", t.attention));
  }
  for (auto [name, v] : {std::pair{"dp_overlap", t.dp_overlap}, {"tp_overlap", t.tp_overlap}}) {
    if (!(v >= 0 && v <= 1)) add(e, fmt::format("training.{} must be in [0, 1] (got {})", name, v));
  }
  if (!(t.hbm_reserve >= 0 && t.hbm_reserve < 1)) {
    add(e, fmt::format("training.hbm_reserve must be in [0, 1) (got {})", t.hbm_reserve));
  }
  if (t.grad_bytes != 2 && t.grad_bytes != 4) {
    add(e, fmt::format("training.grad_bytes must be 2 or 4 (got {})", t.grad_bytes));
  }
  for (auto [name, v] : {std::pair{"tokens", t.tokens}, {"price", t.price_per_chip_hour}}) {
    if (!(v >= 0) || !std::isfinite(v))
      add(e, fmt::format("training.{} must be a finite number >= 0 (got {})", name, v));
  }
  return e;
}

std::string validate(const Model& m, const Training& t, const Layout& l, int ranks) {
  std::string e = validate(m);
  add(e, validate(t));
  if (!e.empty()) return e;
  for (auto [name, v] : {std::pair{"dp", l.dp},
                         {"tp", l.tp},
                         {"pp", l.pp},
                         {"vpp", l.vpp},
                         {"ep", l.ep},
                         {"cp", l.cp}}) {
    if (v < 1) add(e, fmt::format("{} must be at least 1 (got {})", name, v));
  }
  if (!e.empty()) return e;
  if (l.ranks() != ranks) {
    add(e, fmt::format("the layout needs dp {} x tp {} x pp {} x cp {} = {} ranks but {} are given",
                       l.dp, l.tp, l.pp, l.cp, l.ranks(), ranks));
  }
  if (m.heads % l.tp != 0)
    add(e, fmt::format("tp {} does not divide heads {}", l.tp, m.heads));
  else if (m.kv() % l.tp != 0 && l.tp % m.kv() != 0) {
    add(e, fmt::format("tp {} and kv_heads {} do not divide one another", l.tp, m.kv()));
  }
  if (m.ffn_dim() % l.tp != 0)
    add(e, fmt::format("tp {} does not divide ffn {}", l.tp, m.ffn_dim()));
  if (m.layers % (l.pp * l.vpp) != 0) {
    add(e, fmt::format("pp {} x vpp {} does not divide layers {}", l.pp, l.vpp, m.layers));
  }
  if (l.vpp > 1 && l.pp == 1) add(e, "vpp > 1 needs pipeline parallelism (pp > 1)");
  if (m.seq % l.cp != 0) add(e, fmt::format("cp {} does not divide seq {}", l.cp, m.seq));
  if (l.ep > 1) {
    if (!m.moe())
      add(e, fmt::format("ep {} needs an MoE model (experts > 1)", l.ep));
    else if (m.experts % l.ep != 0)
      add(e, fmt::format("ep {} does not divide experts {}", l.ep, m.experts));
    if (l.dp % l.ep != 0) add(e, fmt::format("ep {} does not divide dp {}", l.ep, l.dp));
  }
  if (l.sp && l.tp == 1) add(e, "sequence parallelism needs tp > 1");
  if (l.zero < 0 || l.zero > 3) add(e, fmt::format("zero stage {} is not 0-3", l.zero));
  if (l.micro_batch < 0) {
    add(e, fmt::format("layout.micro_batch must be positive (got {})", l.micro_batch));
  }
  const int micro = l.micro_batch > 0 ? l.micro_batch : t.micro_batch;
  const std::int64_t per_replica = static_cast<std::int64_t>(l.dp) * micro;
  if (t.global_batch % per_replica != 0) {
    add(e, fmt::format("global batch {} is not a multiple of dp {} x micro-batch {}",
                       t.global_batch, l.dp, micro));
  } else if (l.vpp > 1 && (t.global_batch / per_replica) % l.pp != 0) {
    add(e,
        fmt::format("the interleaved schedule needs micro-batches ({}) to be a multiple of pp {}",
                    t.global_batch / per_replica, l.pp));
  }
  std::vector<std::string> o = l.order;
  std::sort(o.begin(), o.end());
  if (o != std::vector<std::string>{"cp", "dp", "pp", "tp"}) {
    add(e, "order must be a permutation of tp, cp, dp, pp");
  }
  return e;
}

}  // namespace tern::plan
