// Overflow-safe integer arithmetic for sizes and offsets that come from
// files and the command line: computed in 128 bits and saturated to int64,
// so a wrapped value can never pass a range check.
#pragma once

#include <cstdint>

namespace tern {

__extension__ typedef __int128 Int128;  // GCC's 128-bit integer (not ISO C++)

// v clamped to [INT64_MIN, INT64_MAX].
constexpr std::int64_t saturate(Int128 v) {
  if (v > INT64_MAX) return INT64_MAX;
  if (v < INT64_MIN) return INT64_MIN;
  return static_cast<std::int64_t>(v);
}

// The product of `n` values, saturated; stops growing past INT64_MAX.
template <class It>
constexpr std::int64_t saturated_product(It first, It last, std::int64_t start = 1) {
  Int128 p = start;
  for (; first != last; ++first) {
    p *= *first;
    if (p > INT64_MAX || p < INT64_MIN) return saturate(p);
  }
  return static_cast<std::int64_t>(p);
}

}  // namespace tern
