// The chip and the small kernel the fuzz and hardening tests start from.
#pragma once

#include <string>

#include "arch/chip.h"
#include "isa/program.h"
#include "kernel/registry.h"

namespace tern::fuzz {

inline const arch::ChipSpec& trn3() {
  static const arch::ChipSpec c = arch::load_chip("trn3");
  return c;
}

// A valid program: C [m, n] = A @ B, bf16, on one trn3 core.
inline isa::Program small_matmul(int m = 128, int n = 256, int k = 128) {
  return kernel::build_kernel(
      trn3(), "matmul",
      {{"m", std::to_string(m)}, {"n", std::to_string(n)}, {"k", std::to_string(k)}});
}

}  // namespace tern::fuzz
