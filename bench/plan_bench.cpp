// Planner speed: layouts evaluated per second (goal: >= 100,000),
// measured as the search for a 70B Llama-style model on 1024 Trainium3
// chips = 4096 logical cores (trn3-ultraserver-gen1 x 16), and one
// layout's estimate alone.
// The baseline in the same run is one fabric::best() call, the planner's
// smallest unit of work: an evaluation costs about a dozen of them.
#include <benchmark/benchmark.h>

#include "arch/system.h"
#include "plan/estimate.h"
#include "plan/request.h"
#include "plan/search.h"

namespace {

using namespace tern;

plan::Planner planner() {
  plan::Training t;
  t.global_batch = 1024;
  return plan::Planner(arch::load_system("trn3-ultraserver-gen1"), plan::load_model("llama3-70b"),
                       t, 1024);
}

void BM_CollectiveBest(benchmark::State& state) {
  const auto p = planner();
  const fabric::Collective c{fabric::Op::all_reduce, Bytes(1 << 30), fabric::Group{{4, 16, 4, 16}}};
  for (auto _ : state) benchmark::DoNotOptimize(fabric::best(p.network(), c));
  state.counters["per_second"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_EvaluateOneLayout(benchmark::State& state) {
  const auto p = planner();
  plan::Layout l;
  l.tp = 8, l.pp = 4, l.dp = 128, l.sp = true, l.zero = 1, l.recompute = plan::Recompute::selective;
  for (auto _ : state) benchmark::DoNotOptimize(p.evaluate(l));
  state.counters["layouts_per_second"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_Search70bOn1024(benchmark::State& state) {
  const auto p = planner();
  std::int64_t evaluated = 0;
  for (auto _ : state) {
    const auto r = plan::search(p, plan::SearchOptions{10});
    evaluated += r.evaluated;
    benchmark::DoNotOptimize(r.best.data());
  }
  state.counters["layouts_per_second"] =
      benchmark::Counter(static_cast<double>(evaluated), benchmark::Counter::kIsRate);
  state.counters["layouts"] = static_cast<double>(evaluated / state.iterations());
}

BENCHMARK(BM_CollectiveBest);
BENCHMARK(BM_EvaluateOneLayout);
BENCHMARK(BM_Search70bOn1024)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
