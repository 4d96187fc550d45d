// HBM planning for a fused graph: which values live in HBM, when, and at
// which offset. Values a kernel keeps on chip (inside a fused group) take
// no HBM; reshapes alias their input; params and inputs live for the whole
// step; every other materialized value lives from the kernel that writes it
// to the last kernel that reads it (graph outputs: to the end). Offsets come
// from greedy-by-size placement (largest first, lowest offset that no
// overlapping lifetime uses), 64-byte aligned, so buffers whose lifetimes do
// not overlap share memory. The buffers a lowering passes between launches
// (lower/lower.h Binding::temp: transposed q / k for attention, a norm's
// statistics, the FP32 embedding gradient before its cast) are known only
// after lowering, which adds their peak (temp_peak).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/fusion.h"
#include "graph/ir.h"

namespace tern::graph {

struct Buffer {
  int value = -1;
  std::int64_t bytes = 0, offset = 0;
  int first = 0, last = 0;  // kernel (group) indices, inclusive
  bool persistent = false;  // params and inputs
};

struct PlanOptions {
  // Optimizer state kept per parameter element, bytes (AdamW with FP32
  // master weights, m and v: 12). Counted in the fit check, not placed.
  std::int64_t optimizer_bytes_per_param = 0;
};

struct MemoryPlan {
  std::vector<Buffer> buffers;
  std::int64_t persistent_bytes = 0;  // params and inputs
  std::int64_t transient_peak = 0;    // the most the other buffers need at once
  std::int64_t arena_bytes = 0;       // persistent + placed transient span
  std::int64_t optimizer_bytes = 0;
  std::int64_t param_elements = 0;
  // Known after lowering (lower/lower.h fills it): the most bytes of the
  // buffers launches pass on outside the plan live at once.
  std::int64_t temp_peak = 0;
  bool temps_counted = false;
  std::int64_t total() const { return arena_bytes + optimizer_bytes + temp_peak; }
};

MemoryPlan plan_memory(const Graph& g, const FusionReport& f, const PlanOptions& opt = {});

// For each value, the value whose bytes hold it: itself, or for reshapes
// and the views of f (FusionReport::alias) the value they read.
std::vector<int> storage_roots(const Graph& g, const FusionReport& f);

// Throws tern::Error when plan.total() exceeds `capacity` bytes, naming the
// largest buffers; `where` names the device ("trn3 (144 GiB)").
void check_fits(const Graph& g, const MemoryPlan& plan, std::int64_t capacity,
                const std::string& where);

// Human-readable summary: totals and the `top` largest buffers.
std::string plan_table(const Graph& g, const MemoryPlan& plan, int top = 10);

std::string bytes_string(std::int64_t b);  // "1.50 GiB"

}  // namespace tern::graph
