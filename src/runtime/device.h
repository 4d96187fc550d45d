// The runtime: a simulated chip that runs compiled graphs (lower/lower.h)
// step after step.
//
// A Session is one executable loaded on a device: its HBM is one arena laid
// out by the executable's memory plan (values at their planned offsets, so
// buffers whose lifetimes do not overlap really share bytes). Inputs and
// params are written from the host once and stay on the device; each step
// runs the launches in order (each loads its kernel program and runs on the
// simulator on the arena's bytes in place: no copy in or out, LaunchTraffic);
// after a step the graph's carried outputs (graph::Graph::carry: updated
// weights, optimizer state) replace their inputs, so a training loop only
// feeds the batch, and delayed FP8 scaling's scales move on from the step's
// amaxes (graph/quant.h). The executable is compiled once and reused by
// every step.
//
// Simulated time is the sum of the kernels' latencies (they run one after
// another; no launch overhead is modelled); each launch is reported with
// its start and duration (the step's events).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "arch/chip.h"
#include "graph/quant.h"
#include "lower/lower.h"
#include "sim/simulator.h"

namespace tern::runtime {

// One launch of a step on the simulated timeline.
struct LaunchEvent {
  int group = -1;
  std::string kernel, detail;
  double start_ns = 0, ns = 0;
};

// How a step's launches reached their data. A launch runs on its tensors
// where they live in the session's memory (bound, no copy); a tensor is
// copied in or out only when the kernel writes a tensor it reads from
// another value, or two of its tensors would share bytes.
struct LaunchTraffic {
  std::int64_t bound = 0;         // tensors run in place
  std::int64_t copied = 0;        // tensors copied in or out
  std::int64_t copied_bytes = 0;  // their bytes
  // Device-side copies: a kernel's written tensor seeded from the value it
  // reads, or an input snapshot before a tensor on the same bytes (an
  // in-place update) overwrites it.
  std::int64_t device_copies = 0;
};

struct StepResult {
  double time_ns = 0;                                 // simulated
  std::vector<double> kernel_ns;                      // per launch
  std::vector<LaunchEvent> events;                    // per launch, in order
  LaunchTraffic traffic;                              // summed over the launches
  std::map<std::string, std::vector<float>> outputs;  // the graph outputs by name
  // Simulated time by launched kernel name, largest first: the step's
  // profile summary.
  std::vector<std::pair<std::string, double>> by_kernel() const;
};

// How a step rounds: stochastic rounding of the engines' output casts, its
// stream from `seed` (each launch of the step draws from its own stream).
struct StepOptions {
  bool stochastic_rounding = false;
  std::uint64_t seed = 0;
};

// What a Session keeps besides the graph's inputs and params: the kept
// buffers (delayed FP8 scaling's scales and amaxes) and the scaling
// histories. Checkpoints save it; restoring it continues bit-exactly.
struct KeptState {
  std::map<std::string, std::vector<std::uint8_t>> buffers;
  graph::DelayedScaling scaling;
};

class Session {
 public:
  // Throws tern::Error for an executable built for another chip or one
  // with groups not lowered (a partial compile, for estimates).
  Session(arch::ChipSpec chip, std::shared_ptr<const graph::Executable> exe);
  const graph::Executable& executable() const { return *exe_; }

  // Host -> device: an input or param by name, row-major, encoded to its
  // dtype (round to nearest even). It stays until written again or replaced
  // by a carry. Throws naming the value for an unknown name or wrong size.
  void write(const std::string& name, const std::vector<float>& values);
  void fill(const std::string& name, float value);
  // Device -> host: an input, param or graph output (after a step).
  std::vector<float> read(const std::string& name) const;
  // Writes `feeds`, runs one step, then applies the carries. Throws naming
  // a bad feed (before writing any) or an input or param that was never
  // written. A step that fails in a kernel leaves the device state
  // undefined (in-place updates may have happened): start a new Session.
  StepResult step(const std::map<std::string, std::vector<float>>& feeds = {},
                  const StepOptions& options = {});
  std::int64_t steps() const { return steps_; }
  KeptState kept_state() const { return {state_, scaling_}; }
  void restore_kept_state(const KeptState& s) {
    state_ = s.buffers;
    scaling_ = s.scaling;
  }

 private:
  // One launch: its tensors bound to the arena, the kept buffers and
  // `temps` (or copied where they must be), run, results in place.
  sim::RunStats run_launch(std::size_t index, const sim::Options& so,
                           std::map<std::string, std::vector<std::uint8_t>>& temps,
                           LaunchTraffic& traffic);
  std::span<std::uint8_t> input_bytes(const graph::Launch& l, const graph::Binding& b,
                                      std::map<std::string, std::vector<std::uint8_t>>& temps);
  std::span<std::uint8_t> output_bytes(const graph::Binding& b, std::int64_t size,
                                       std::map<std::string, std::vector<std::uint8_t>>& temps);
  std::pair<std::uint8_t*, std::size_t> bytes_of(int v);
  std::pair<const std::uint8_t*, std::size_t> bytes_of(int v) const;
  int leaf(const std::string& name) const;  // an input or param by name

  arch::ChipSpec chip_;
  std::shared_ptr<const graph::Executable> exe_;
  sim::Simulator sim_;
  std::vector<int> root_;
  std::map<int, std::int64_t> offset_;
  std::vector<std::uint8_t> arena_;
  std::set<int> written_;
  std::int64_t steps_ = 0;
  // Buffers kept across steps (graph::Binding::state) and delayed FP8
  // scaling's histories behind them.
  std::map<std::string, std::vector<std::uint8_t>> state_;
  graph::DelayedScaling scaling_;
  // Per launch, computed on its first run: which of its program's tensors
  // the kernel writes, and its constants' encoded bytes.
  std::vector<std::vector<bool>> kernel_writes_;
  std::vector<std::map<std::string, std::vector<std::uint8_t>>> constants_;
  // The current launch's snapshots of inputs it overwrites in place (kept:
  // their allocations are reused launch after launch).
  std::map<std::string, std::vector<std::uint8_t>> snapshots_;
  void update_scaling();
};

// A device that runs an executable once with every input and param fed
// (a one-step Session).
class Device {
 public:
  explicit Device(arch::ChipSpec chip) : chip_(std::move(chip)) {}
  const arch::ChipSpec& chip() const { return chip_; }
  StepResult run(const graph::Executable& exe,
                 const std::map<std::string, std::vector<float>>& feeds);

 private:
  arch::ChipSpec chip_;
};

// The "adamw.scalars" feed of step `step` (from 1): kernel::adamw_scalars
// for learning rate lr and weight decay wd (graph/optimizer.h).
std::vector<float> adamw_scalars(double lr, double weight_decay, double beta1, double beta2,
                                 std::int64_t step);

}  // namespace tern::runtime
