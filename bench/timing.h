// Host timing shared by the benchmarks: the median of repeated runs.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace tern::bench {

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Median host seconds of `reps` calls of f.
template <typename F>
double median_seconds(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = Clock::now();
    f();
    t.push_back(seconds(a, Clock::now()));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace tern::bench
