// Runs a built-in kernel's program on named inputs (tests only).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "arch/chip.h"
#include "isa/program.h"
#include "sim/simulator.h"

namespace tern::testing_helpers {

// Loads `p`, writes each (HBM tensor name, values) input, runs both models;
// read the outputs from the returned simulator.
inline std::unique_ptr<sim::Simulator> run_kernel(
    const arch::ChipSpec& chip, const isa::Program& p,
    const std::vector<std::pair<std::string, const std::vector<float>*>>& inputs) {
  auto s = std::make_unique<sim::Simulator>(chip);
  s->load(p);
  for (const auto& [name, values] : inputs) s->write(name, *values);
  s->run();
  return s;
}

}  // namespace tern::testing_helpers
