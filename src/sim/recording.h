// Private to sim: the record of a program's first run that later runs
// replay (replay.cpp), and the byte ranges the scheduler (scheduler.cpp)
// uses to tell whether cores touch each other's HBM bytes.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "isa/program.h"
#include "sim/simulator.h"

namespace tern::sim {

// A program's first run, for replays: the instructions that touch data in
// the order they ran, with their serial numbers (stochastic-rounding
// streams), and the run's statistics.
struct Simulator::Recording {
  std::weak_ptr<const isa::Program> program;
  struct Step {
    int core;
    std::size_t index;      // in its engine's stream (error messages)
    std::uint64_t serial;   // the instruction's number in the run
    const Instruction* in;  // the program's, or a register-resolved copy below
  };
  std::vector<Step> steps;                  // in run order
  std::vector<std::vector<Step>> per_core;  // the same, core by core
  std::deque<Instruction> resolved;
  RunStats stats;
  // No core writes HBM bytes that another core reads or writes: each
  // core's steps may then run on their own, in their recorded order.
  bool cores_independent = false;
  // Which SBUF bytes the program writes or reads depends on data (a gather
  // or scatter that skips out-of-range rows): replays keep checking
  // SBUF/PSUM flags.
  bool data_dependent_writes = false;
  // Elements each core's instructions move (operands summed): a replay puts
  // cores on threads only when that balances the threads' work.
  std::vector<std::int64_t> core_work;
  // Per HBM tensor: whether the host had filled it when the run was recorded.
  std::vector<bool> host_written;
};

// [lo, hi) byte ranges, sorted and merged.
using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;
Ranges merged(Ranges r);
bool intersect(const Ranges& a, const Ranges& b);

}  // namespace tern::sim
