// Activation tables for BF16 inputs: a BF16 operand has 65,536 values, so
// once a function is used on enough of them, a table of f(x * scale + bias)
// by BF16 code replaces the libm calls (the transcendental functions were a
// seventh of a training step). Each entry is computed by isa::apply_act
// itself, so results are bit-identical.
#pragma once

#include <cstddef>

#include "isa/instruction.h"

namespace tern::sim {

class ActTables {
 public:
  // Tables are built for a key after this many elements were asked for.
  static constexpr std::size_t kBuildAfter = std::size_t{1} << 18;

  // The table of (f, scale, bias), indexed by BF16 code (an FP32 value's
  // top 16 bits), or nullptr while the key has been asked for fewer than
  // kBuildAfter elements in all (`elements` counts this use). Thread-safe;
  // tables live as long as the process.
  const float* get(isa::ActFunc f, float scale, float bias, std::size_t elements);
};

// The process's tables.
ActTables& act_tables();

}  // namespace tern::sim
