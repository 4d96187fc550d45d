#include "plan/search.h"

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

#include "util/error.h"

namespace tern::plan {

namespace {

// Ascending; O(sqrt n).
std::vector<int> divisors(int n) {
  std::vector<int> low, high;
  for (int i = 1; static_cast<std::int64_t>(i) * i <= n; ++i) {
    if (n % i != 0) continue;
    low.push_back(i);
    if (i != n / i) high.push_back(n / i);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

}  // namespace

namespace {

// Fastest first; equal times: the layout needing less memory; then the
// simpler one.
bool faster(const Estimate& a, const Estimate& b) {
  if (a.time.step != b.time.step) return a.time.step < b.time.step;
  if (a.memory.total != b.memory.total) return a.memory.total < b.memory.total;
  // The same plan: the simpler layout first (it names the row).
  if (a.layout.recompute != b.layout.recompute) return a.layout.recompute < b.layout.recompute;
  return a.layout.zero < b.layout.zero;
}

}  // namespace

SearchResult search(const Planner& planner, const SearchOptions& opt) {
  if (opt.top < 1) throw Error(fmt::format("search: top must be at least 1 (got {})", opt.top));
  const Model& m = planner.model();
  const Training& t = planner.training();
  const int ranks = planner.ranks();
  SearchResult r;
  std::vector<Estimate> kept;
  const auto consider = [&](const Layout& l) {
    ++r.evaluated;
    auto e = planner.evaluate(l);
    if (!e || !e->memory.fits) return;
    ++r.fitting;
    kept.push_back(std::move(*e));
    // Keep the list short: trim to the best `top` now and then.
    // (Four times `top`: equivalent layouts collapse into one entry below.)
    if (kept.size() >= static_cast<std::size_t>(8 * opt.top + 64)) {
      std::nth_element(kept.begin(), kept.begin() + 4 * opt.top, kept.end(), faster);
      kept.resize(static_cast<std::size_t>(4 * opt.top));
    }
  };
  const std::vector<int> ep_choices = m.moe() ? divisors(m.experts) : std::vector<int>{1};
  for (int tp : divisors(ranks)) {
    if (m.heads % tp != 0 || m.ffn_dim() % tp != 0) continue;
    if (m.kv() % tp != 0 && tp % m.kv() != 0) continue;
    for (int cp : divisors(ranks / tp)) {
      if (m.seq % cp != 0 || (cp > 1 && (cp & (cp - 1)) != 0)) continue;
      for (int pp : divisors(ranks / (tp * cp))) {
        if (m.layers % pp != 0) continue;
        const int dp = ranks / (tp * cp * pp);
        for (int micro : opt.micro_batches) {
          if (t.global_batch % (static_cast<std::int64_t>(dp) * micro) != 0) continue;
          const std::int64_t mb = t.global_batch / (static_cast<std::int64_t>(dp) * micro);
          for (int vpp : divisors(m.layers / pp)) {
            if (vpp > opt.max_vpp || (vpp > 1 && (pp == 1 || mb % pp != 0))) continue;
            for (int ep : ep_choices) {
              if (dp % ep != 0) continue;
              for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp) {
                for (int zero = 0; zero <= (dp > 1 ? 3 : 0); ++zero) {
                  for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
                    Layout l;
                    l.dp = dp, l.tp = tp, l.pp = pp, l.vpp = vpp, l.ep = ep, l.cp = cp;
                    l.sp = sp != 0, l.zero = zero, l.recompute = rc, l.micro_batch = micro;
                    consider(l);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  // Equal times (e.g. a recompute mode that changes nothing with fused
  // attention): the layout needing less memory first.
  std::sort(kept.begin(), kept.end(), faster);
  for (Estimate& e : kept) {
    if (!r.best.empty() && e.time.step == r.best.back().time.step &&
        e.memory.total == r.best.back().memory.total) {
      r.alternatives.back().push_back(e.layout);
      continue;
    }
    if (r.best.size() == static_cast<std::size_t>(opt.top)) break;
    r.best.push_back(std::move(e));
    r.alternatives.emplace_back();
  }
  return r;
}

}  // namespace tern::plan
