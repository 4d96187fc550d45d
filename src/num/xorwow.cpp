#include "num/xorwow.h"

#include "num/encode_params.h"

namespace tern::num {

std::uint32_t Xorwow::next() {
  // Marsaglia 2003, xorwow: t = x ^ (x >> 2); shift the words; v = (v ^ (v
  // << 4)) ^ (t ^ (t << 1)); d += 362437; output v + d.
  const std::uint32_t t = s[0] ^ (s[0] >> 2);
  s[0] = s[1];
  s[1] = s[2];
  s[2] = s[3];
  s[3] = s[4];
  s[4] = (s[4] ^ (s[4] << 4)) ^ (t ^ (t << 1));
  s[5] += 362437u;
  return s[4] + s[5];
}

Xorwow Xorwow::seeded(std::uint32_t seed, std::uint32_t lane, std::uint32_t sub) {
  Xorwow g;
  std::uint32_t h = detail::fmix32(seed ^ 0x9e3779b9u) ^
                    detail::fmix32(lane * 0x632be5abu + sub * 0x85157af5u + 1u);
  for (auto& w : g.s) {
    h += 0x9e3779b9u;
    w = detail::fmix32(h);
  }
  if ((g.s[0] | g.s[1] | g.s[2] | g.s[3] | g.s[4]) == 0) g.s[0] = 0x6c078965u;
  return g;
}

float unit_float(std::uint32_t r) {
  return static_cast<float>(r >> 8) * 0x1p-24f;
}

}  // namespace tern::num
