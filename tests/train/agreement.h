// The heavy agreement tests run a small variant in CI and every case as a
// benchmark (bench/README.md): TERN_FULL_AGREEMENT=1 selects the latter.
#pragma once

#include <cstdlib>

namespace tern::train {

inline bool full_agreement() {
  const char* e = std::getenv("TERN_FULL_AGREEMENT");
  return e != nullptr && *e != '\0' && *e != '0';
}

}  // namespace tern::train
