// Test helpers for built-in kernels: run a program on named inputs, compare bits.
#pragma once

#include <bit>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "arch/chip.h"
#include "isa/program.h"
#include "sim/simulator.h"

#include <gtest/gtest.h>

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

// Elements whose bits differ (the first five reported as failures, named
// `what`[i]).
inline std::size_t mismatches(const std::vector<float>& got, const std::vector<float>& want,
                              const char* what = "element") {
  EXPECT_EQ(got.size(), want.size()) << what;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i)
    if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i]) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", want " << want[i];
  return bad;
}

}  // namespace tern::testing_helpers
