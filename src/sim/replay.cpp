// Replays: a program's later runs execute the instructions its first run
// recorded, in the recorded order, for the data alone (the timing is the
// first run's); independent cores on host threads. See docs/sim.md.
#include <algorithm>
#include <exception>
#include <limits>

#include <fmt/format.h>
#include <omp.h>

#include "sim/check.h"
#include "sim/functional.h"
#include "sim/recording.h"
#include "util/error.h"

namespace tern::sim {

Ranges merged(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& x : r) {
    if (!out.empty() && x.first <= out.back().second)
      out.back().second = std::max(out.back().second, x.second);
    else
      out.push_back(x);
  }
  return out;
}
bool intersect(const Ranges& a, const Ranges& b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i].second <= b[j].first)
      ++i;
    else if (b[j].second <= a[i].first)
      ++j;
    else
      return true;
  }
  return false;
}

RunStats Simulator::replay(const Recording& rec, const Options& opt) {
  const int ncores = static_cast<int>(program_->cores.size());
  // One functional model per host thread (row() caches an HBM region);
  // each core runs wholly on one of them.
  auto run_steps = [&](Impl& impl, const std::vector<Recording::Step>& steps,
                       std::uint64_t& failed_serial, std::exception_ptr& error) {
    for (const Recording::Step& s : steps) {
      impl.serial = s.serial;
      try {
        impl.tensor_state(s.core, *s.in);
        impl.execute(s.core, *s.in);
      } catch (const Error& err) {
        failed_serial = s.serial;
        error = std::make_exception_ptr(
            Error(fmt::format("{}: {}", where(s.core, *s.in, s.index), err.what())));
        return;
      } catch (...) {
        failed_serial = s.serial;
        error = std::current_exception();
        return;
      }
    }
  };
  std::vector<int> busy;
  for (int c = 0; c < ncores; ++c)
    if (!rec.per_core[static_cast<std::size_t>(c)].empty()) busy.push_back(c);
  const int hw = opt.threads > 0 ? opt.threads : host_threads();
  // Cores on threads when they are independent and their work balances
  // (the busiest core at most a quarter over an even share); otherwise one
  // thread runs the recorded order and splits large instructions' rows.
  int t = rec.cores_independent ? std::min(hw, static_cast<int>(busy.size())) : 1;
  if (t > 1) {
    std::int64_t total = 0, most = 0;
    for (const std::int64_t w : rec.core_work) total += w, most = std::max(most, w);
    if (4 * most * t > 5 * total) t = 1;
  }
  // The HBM flags are needed when a tensor filled for the recorded run is
  // not filled now (its reads must be checked again) or writes depend on data.
  bool hbm_flags = rec.data_dependent_writes;
  for (std::size_t i = 0; i < hbm_.regions().size(); ++i)
    if (rec.host_written[i] && !hbm_.regions()[i].host_written) hbm_flags = true;
  hbm_.storage();
  if (hbm_flags) hbm_.flags();
  if (t <= 1) {
    Impl impl(*this, opt);
    impl.sram_flags = rec.data_dependent_writes;
    impl.hbm_flags = hbm_flags;
    impl.set_cores(ncores);
    std::uint64_t serial = 0;
    std::exception_ptr error;
    run_steps(impl, rec.steps, serial, error);
    if (error) std::rethrow_exception(error);
    RunStats st = rec.stats;
    st.replay_threads = 1;
    return st;
  }
  // Cores on the host threads; the first error in run order is the one
  // reported.
  std::vector<std::uint64_t> serials(busy.size(), std::numeric_limits<std::uint64_t>::max());
  std::vector<std::exception_ptr> errors(busy.size());
#pragma omp parallel num_threads(t)
  {
    Impl impl(*this, opt);
    impl.sram_flags = rec.data_dependent_writes;
    impl.hbm_flags = hbm_flags;
    impl.set_cores(ncores);
#pragma omp for schedule(dynamic, 1)
    for (std::size_t i = 0; i < busy.size(); ++i)
      run_steps(impl, rec.per_core[static_cast<std::size_t>(busy[i])], serials[i], errors[i]);
  }
  std::size_t first = busy.size();
  for (std::size_t i = 0; i < busy.size(); ++i)
    if (errors[i] && (first == busy.size() || serials[i] < serials[first])) first = i;
  if (first < busy.size()) std::rethrow_exception(errors[first]);
  RunStats st = rec.stats;
  st.replay_threads = t;
  return st;
}

}  // namespace tern::sim
