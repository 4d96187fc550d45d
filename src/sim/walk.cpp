#include "sim/walk.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "sim/codec.h"

namespace tern::sim {

using isa::Mem;

namespace {
// The columns of a walk read across runs (Walk::cols), or 0.
std::int64_t columns(const std::vector<std::int64_t>& offs, int size) {
  const auto n = static_cast<std::int64_t>(offs.size());
  if (n < 4) return 0;
  const std::int64_t stride = offs[1] - offs[0];
  if (stride == size) return 0;
  std::int64_t cols = 1;
  while (cols < n && offs[static_cast<std::size_t>(cols)] == offs[0] + cols * stride) ++cols;
  if (cols < 2 || cols == n || n % cols != 0) return 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t want = offs[0] + (i % cols) * stride + (i / cols) * size;
    if (offs[static_cast<std::size_t>(i)] != want) return 0;
  }
  return cols;
}
}  // namespace

Walk make_walk(std::vector<std::int64_t> offs, int size) {
  Walk w;
  w.size = size;
  w.offs = std::move(offs);
  if (w.offs.empty()) return w;
  w.run = is_run(w.offs, w.size);
  if (!w.run && (w.cols = columns(w.offs, size)) > 0) w.col_stride = w.offs[1] - w.offs[0];
  const auto [mn, mx] = std::minmax_element(w.offs.begin(), w.offs.end());
  w.lo = *mn;
  w.hi = *mx + size;
  return w;
}

Walk make_walk(const isa::AccessPattern& ap) {
  std::vector<std::int64_t> offs(static_cast<std::size_t>(ap.free_size()));
  const int size = isa::size_bytes(ap.dtype);
  if (offs.empty()) return make_walk(std::move(offs), size);
  // Walked like an odometer: no division per element.
  const std::size_t first = ap.mem == Mem::hbm ? 1 : 0;
  const std::int64_t sz = size;
  const std::int64_t base = ap.mem == Mem::hbm ? 0 : ap.offset;
  if (ap.dims.size() <= first) {
    offs[0] = base;
  } else {
    constexpr std::size_t kMaxDims = isa::kMaxFreeDims + 2;
    const std::size_t last = ap.dims.size() - 1;
    const std::int64_t inner = ap.dims[last].count, step = ap.dims[last].stride * sz;
    std::int64_t idx[kMaxDims] = {};
    std::int64_t outer = base;  // offset of the current innermost run's start
    std::size_t i = 0;
    while (i < offs.size()) {
      for (std::int64_t k = 0; k < inner; ++k) offs[i++] = outer + k * step;
      // Advance the outer dims (last - 1 down to first).
      for (std::size_t d = last; d-- > first;) {
        outer += ap.dims[d].stride * sz;
        if (++idx[d] < ap.dims[d].count) break;
        outer -= ap.dims[d].stride * sz * ap.dims[d].count;
        idx[d] = 0;
      }
    }
  }
  return make_walk(std::move(offs), size);
}

const Walk& WalkCache::get(const isa::AccessPattern& ap) {
  // The key: what the walk depends on (memory kind, dtype, the SBUF/PSUM
  // offset, the free dims), as raw bytes.
  thread_local std::string key;
  key.clear();
  auto put = [&](std::int64_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(ap.mem == Mem::hbm ? -1 : ap.offset);
  put(static_cast<std::int64_t>(ap.dtype));
  for (const auto& d : ap.dims) {
    put(d.count);
    put(d.stride);
  }
  {
    std::shared_lock lock(mutex_);
    if (const auto it = map_.find(key); it != map_.end()) return it->second;
  }
  Walk w = make_walk(ap);
  std::unique_lock lock(mutex_);
  const auto [it, added] = map_.try_emplace(key, std::move(w));
  if (added) bytes_ += it->second.offs.size() * sizeof(std::int64_t);
  return it->second;
}

std::size_t WalkCache::size() const {
  std::shared_lock lock(mutex_);
  return map_.size();
}

std::size_t WalkCache::bytes() const {
  std::shared_lock lock(mutex_);
  return bytes_;
}

void WalkCache::clear() {
  std::unique_lock lock(mutex_);
  map_.clear();
  bytes_ = 0;
}

}  // namespace tern::sim
