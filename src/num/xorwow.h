// Marsaglia's XORWOW generator ("Xorshift RNGs", J. Stat. Softw. 8(14),
// 2003, section 3.1: five xorshift words plus a Weyl counter), the
// algorithm the NKI ISA reference names for the engines' random numbers.
// Which seed gives which state, and how outputs become floats, are not
// published for the hardware: tern's choices are documented here and in
// docs/nki.md, so tern's streams are reproducible but not the hardware's.
#pragma once

#include <array>
#include <cstdint>

namespace tern::num {

struct Xorwow {
  // x, y, z, w, v (the xorshift words) and d (the Weyl counter), the order
  // of a lane's six state words in NKI's rand_get_state / rand_set_state.
  std::array<std::uint32_t, 6> s{};

  // The next 32-bit output: v + d after one step.
  std::uint32_t next();

  // The state tern gives lane `lane`, sub-state `sub` for a 32-bit seed:
  // each word MurmurHash3's fmix32 of a Weyl sequence started from (seed,
  // lane, sub), an all-zero xorshift part replaced by a fixed non-zero word.
  static Xorwow seeded(std::uint32_t seed, std::uint32_t lane, std::uint32_t sub);
};

// A 32-bit output as a uniform FP32 in [0, 1): its top 24 bits times 2^-24
// (exact in FP32).
float unit_float(std::uint32_t r);

}  // namespace tern::num
