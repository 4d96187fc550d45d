// Instruction costs. Compute engines: cycles per instruction from the
// NeuronCore performance guide (hardware.md section 3), at the engine's
// clock. DMA: a transfer's rows are split over the core's DMA engines; each
// engine is a FIFO that is busy for (rows x per-row overhead + bytes) /
// engine bandwidth, and a transfer completes a fixed latency after its last
// part leaves its engine; HBM traffic of all cores shares the chip's HBM
// bandwidth. Every parameter comes from the chip description; docs/sim.md
// states each formula.
#pragma once

#include <map>
#include <vector>

#include "arch/chip.h"
#include "isa/instruction.h"

namespace tern::sim {

class CostModel {
 public:
  explicit CostModel(const arch::ChipSpec& chip);
  // Engine cycles of a compute instruction. `dependent`: it reads what the
  // previous instruction of the same engine wrote (static overhead applies).
  double cycles(const isa::Instruction& in, bool dependent) const;
  double duration_ns(const isa::Instruction& in, bool dependent) const;
  // Whether `in` runs in the Vector engine's performance mode on a chip
  // where that mode takes the SBUF bus Vector shares with GpSimd: the
  // scheduler then keeps it and GpSimd's compute instructions apart.
  bool takes_gpsimd_bus(const isa::Instruction& in) const;

 private:
  // The performance-mode speedup of `in` over its NeuronCore-v2 cost (1
  // where no mode applies): the Vector and Scalar rules of CostSpec.
  double perf_speedup(const isa::Instruction& in) const;
  double vector_speedup(const isa::Instruction& in) const;
  bool perf_dtype(isa::DType t) const;

  const arch::ChipSpec& chip_;
  std::vector<isa::DType> perf_dtypes_;  // CostSpec::perf_mode_dtypes, parsed
  // Passes of an FP32 matmul: the Tensor engine's BF16 rate over its FP32
  // rate (tensor.rate), 1 where the chip has no FP32 rate of its own.
  double fp32_passes_ = 1;
};

// The chip's HBM as a shared resource in time: busy intervals, and
// reservations that take the first free capacity at or after their start,
// filling gaps left by earlier reservations (a transfer may be split over
// gaps). Reservations arrive in simulation order, which is not time order:
// a DMA queued behind others on its engine reserves in the future, and a
// later-processed transfer that can start earlier must still find the
// bandwidth that is free before it (a plain FIFO would leave that idle).
class HbmCalendar {
 public:
  // Reserves `duration` ns of the HBM from `start` on; returns when the last
  // of it ends. Intervals that end before `horizon` (no later request can
  // start before it) are forgotten.
  double reserve(double start, double duration, double horizon);

 private:
  // A flat sorted array, not a std::map: a DMA reserves up to one interval
  // per engine, and the live ones are few (those ending before the horizon
  // are dropped), so binary search and short moves beat a node allocation
  // per insert.
  struct Interval {
    double start, end;
  };
  std::vector<Interval> busy_;              // sorted by start, disjoint, non-adjacent
  std::size_t head_ = 0;                    // busy_[0, head_) are forgotten
  std::size_t after(double t) const;        // first live interval starting after t
  std::size_t at_or_after(double t) const;  // first live interval starting at or after t
  void insert(double lo, double hi);        // [lo, hi), merged with intervals touching it
};

class DmaModel {
 public:
  DmaModel(const arch::ChipSpec& chip, int cores);
  // Issues the transfer (dma_copy, dma_transpose, dma_gather, dma_scatter) at `issue_ns` on core
  // `core`; returns its completion time. Indirect transfers start descriptor_gen later;
  // hardware-DGE ones (hwdge) once one of the core's DGE instances has spent
  // descriptor_gen on their descriptors.
  double transfer(int core, const isa::Instruction& in, double issue_ns);
  double busy_ns() const { return busy_; }

 private:
  const arch::ChipSpec& chip_;
  std::vector<std::vector<double>> engine_free_;  // [core][engine]
  std::vector<std::vector<double>> queue_done_;   // [core][queue]: in-order completion
  std::vector<std::vector<double>> dge_free_;     // [core][hardware DGE instance]
  HbmCalendar hbm_;
  double horizon_ = 0;  // the latest issue time seen (issues arrive in time order)
  double busy_ = 0;
};

}  // namespace tern::sim
