// Instruction costs. Compute engines: cycles per instruction from the
// NeuronCore performance guide (hardware.md section 3), at the engine's
// clock. DMA: a transfer's rows are split over the core's DMA engines; each
// engine is a FIFO that is busy for (rows x per-row overhead + bytes) /
// engine bandwidth, and a transfer completes a fixed latency after its last
// part leaves its engine; HBM traffic of all cores shares the chip's HBM
// bandwidth. Every parameter comes from the chip description; docs/sim.md
// states each formula.
#pragma once

#include <vector>

#include "arch/chip.h"
#include "isa/instruction.h"

namespace tern::sim {

class CostModel {
 public:
  explicit CostModel(const arch::ChipSpec& chip) : chip_(chip) {}
  // Engine cycles of a compute instruction. `dependent`: it reads what the
  // previous instruction of the same engine wrote (static overhead applies).
  double cycles(const isa::Instruction& in, bool dependent) const;
  double duration_ns(const isa::Instruction& in, bool dependent) const;

 private:
  const arch::ChipSpec& chip_;
};

class DmaModel {
 public:
  DmaModel(const arch::ChipSpec& chip, int cores);
  // Issues the transfer (dma_copy or dma_transpose) at `issue_ns` on core `core`; returns its
  // completion time.
  double transfer(int core, const isa::Instruction& in, double issue_ns);
  double busy_ns() const { return busy_; }

 private:
  const arch::ChipSpec& chip_;
  std::vector<std::vector<double>> engine_free_;  // [core][engine]
  std::vector<std::vector<double>> queue_done_;   // [core][queue]: in-order completion
  double hbm_free_ = 0;
  double busy_ = 0;
};

}  // namespace tern::sim
