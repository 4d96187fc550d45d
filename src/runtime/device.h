// The runtime: a simulated chip that runs compiled graphs (graph/lower.h)
// step after step. Device memory is one HBM arena laid out by the
// executable's memory plan (values at their planned offsets, so buffers
// whose lifetimes do not overlap really share bytes); each launch loads its
// kernel program, copies its bound input values from the arena into the
// program's HBM tensors, runs on the simulator and copies the outputs back.
// Simulated time is the sum of the kernels' latencies (they run one after
// another; no launch overhead is modelled).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "arch/chip.h"
#include "graph/lower.h"
#include "sim/simulator.h"

namespace tern::runtime {

struct StepResult {
  double time_ns = 0;                                 // simulated
  std::vector<double> kernel_ns;                      // per launch
  std::map<std::string, std::vector<float>> outputs;  // the graph outputs by name
};

class Device {
 public:
  explicit Device(arch::ChipSpec chip);
  const arch::ChipSpec& chip() const { return chip_; }

  // One step. `feeds`: every input and param of the graph by name, in
  // row-major order (encoded to the value's dtype, rounding to nearest
  // even). Throws tern::Error for a missing or mis-sized feed or an
  // executable built for another chip.
  StepResult run(const graph::Executable& exe,
                 const std::map<std::string, std::vector<float>>& feeds);

 private:
  arch::ChipSpec chip_;
  sim::Simulator sim_;
};

}  // namespace tern::runtime
