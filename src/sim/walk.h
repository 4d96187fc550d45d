// The free elements of an access pattern as byte offsets from the start of
// a row, computed once per distinct pattern: a training step runs the same
// few hundred programs every step, so their operands' walks repeat.
#pragma once

#include <cstdint>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "isa/access.h"

namespace tern::sim {

struct Walk {
  // Byte offset of each free element (row-major over the free dims) from
  // its row's base: SBUF/PSUM, the partition's start (the pattern's offset
  // included); HBM, the row's first element.
  std::vector<std::int64_t> offs;
  int size = 1;                 // bytes per element
  bool run = false;             // the offsets are one ascending run of adjacent elements
  std::int64_t lo = 0, hi = 0;  // the bytes [lo, hi) the elements span (empty: lo == hi)
  // Not a run but `cols` > 1 runs read across: offs[i * cols + j] is
  // offs[0] + j * col_stride + i * size (decode_columns reads it run by
  // run). 0 otherwise.
  std::int64_t cols = 0, col_stride = 0;
};

// The walk of a pattern's free dims (rows are not part of it).
Walk make_walk(const isa::AccessPattern& ap);
// The walk of given element offsets.
Walk make_walk(std::vector<std::int64_t> offs, int size);

// Walks by pattern shape, safe to use from several threads at once (the
// cores of a replayed run). References stay valid until clear(), which must
// not race with get().
class WalkCache {
 public:
  const Walk& get(const isa::AccessPattern& ap);
  std::size_t size() const;
  std::size_t bytes() const;  // the walks' offsets, in all
  void clear();

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::string, Walk> map_;
  std::size_t bytes_ = 0;
};

}  // namespace tern::sim
