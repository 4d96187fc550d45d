// Mutations for the readers' fuzz tests: byte flips, inserts, deletes and
// copies; whole numbers in text swapped for the values that break range
// arithmetic (0, -1, 2^31, 2^63 - 1, -2^63, 1e308, nan); binary words
// overwritten with the same. Deterministic from a seed.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace tern::fuzz {

class Mutator {
 public:
  explicit Mutator(std::uint64_t seed) : rng_(seed) {}

  // One to four mutations of any kind on raw bytes.
  std::string bytes(std::string s);
  // One to three mutations that keep text text: a number replaced by an
  // interesting one, a line dropped or doubled, a token cut, a byte flipped.
  std::string text(std::string s);
  // A 1-, 2-, 4- or 8-byte little-endian word at a random offset in
  // [from, s.size()) overwritten with an interesting value.
  std::string word(std::string s, std::size_t from);
  std::uint64_t below(std::uint64_t n) { return n ? rng_() % n : 0; }

 private:
  std::string number();
  std::mt19937_64 rng_;
};

// The number of inputs each fuzz test runs: TERN_FUZZ_COUNT, else `ci`.
int fuzz_count(int ci);

// Counts what the reader did with each input; a test fails on any crash
// (the process dies), internal error (an exception that is not a
// tern::Error) or hang (ctest's timeout).
struct Outcome {
  int accepted = 0, rejected = 0;
  std::vector<std::string> internal;  // "input 12: std::out_of_range: stoll"
};

}  // namespace tern::fuzz
