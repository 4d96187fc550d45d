// Test-only oracle: exact rounding of FP32 values into ExMy formats by GNU
// MPFR, independent of tern's integer algorithm.
#pragma once

#include <cstdint>
#include <optional>

namespace tern::num::oracle {

enum class Dir { nearest_even, down, up };

// x rounded to a binary float with `man_bits` fraction bits, smallest normal
// exponent `emin` (subnormals below it) and an unbounded top, as a double.
double round_float(float x, int man_bits, int emin, Dir dir);

// x rounded to a multiple of 2^-frac_bits (nearest, ties to even).
double round_fixed(float x, int frac_bits);

// x rounded to a power of two (one significant bit), exponent unbounded.
double round_pow2(float x);

}  // namespace tern::num::oracle
