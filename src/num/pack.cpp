#include "num/pack.h"

#include <fmt/format.h>

#include "util/error.h"

namespace tern::num {

namespace {
void check_x4(std::size_t codes, std::size_t packed, const char* what) {
  if (codes % 4 != 0 || packed * 4 != codes) {
    throw Error(fmt::format("{}: {} codes do not fill {} x4 words (need 4 codes per word)", what,
                            codes, packed));
  }
}
}  // namespace

void pack_x4_fp8(std::span<const std::uint8_t> codes, std::span<std::uint32_t> packed) {
  check_x4(codes.size(), packed.size(), "pack_x4_fp8");
  for (std::size_t w = 0; w < packed.size(); ++w) {
    packed[w] = std::uint32_t(codes[4 * w]) | std::uint32_t(codes[4 * w + 1]) << 8 |
                std::uint32_t(codes[4 * w + 2]) << 16 | std::uint32_t(codes[4 * w + 3]) << 24;
  }
}

void unpack_x4_fp8(std::span<const std::uint32_t> packed, std::span<std::uint8_t> codes) {
  check_x4(codes.size(), packed.size(), "unpack_x4_fp8");
  for (std::size_t i = 0; i < codes.size(); ++i) {
    codes[i] = static_cast<std::uint8_t>(packed[i / 4] >> (8 * (i % 4)));
  }
}

void pack_x4_fp4(std::span<const std::uint8_t> codes, std::span<std::uint16_t> packed) {
  check_x4(codes.size(), packed.size(), "pack_x4_fp4");
  for (std::size_t w = 0; w < packed.size(); ++w) {
    std::uint16_t v = 0;
    for (int j = 0; j < 4; ++j)
      v |= static_cast<std::uint16_t>((codes[4 * w + j] & 0xFu) << (4 * j));
    packed[w] = v;
  }
}

void unpack_x4_fp4(std::span<const std::uint16_t> packed, std::span<std::uint8_t> codes) {
  check_x4(codes.size(), packed.size(), "unpack_x4_fp4");
  for (std::size_t i = 0; i < codes.size(); ++i) {
    codes[i] = static_cast<std::uint8_t>((packed[i / 4] >> (4 * (i % 4))) & 0xFu);
  }
}

std::size_t packed_bytes(std::size_t n, int bits) {
  return (n * static_cast<std::size_t>(bits) + 7) / 8;
}

static void check_bits(int bits) {
  if (bits < 1 || bits > 8)
    throw Error(fmt::format("bit packing: {} bits per code, need 1..8", bits));
}

void pack_bits(std::span<const std::uint8_t> codes, int bits, std::span<std::uint8_t> out) {
  check_bits(bits);
  if (out.size() != packed_bytes(codes.size(), bits)) {
    throw Error(fmt::format("pack_bits: {} codes of {} bits need {} bytes, got {}", codes.size(),
                            bits, packed_bytes(codes.size(), bits), out.size()));
  }
  std::fill(out.begin(), out.end(), 0);
  const std::uint32_t mask = (1u << bits) - 1u;
  std::size_t bit = 0;
  for (std::uint8_t c : codes) {
    const std::uint32_t v = (c & mask) << (bit % 8);
    out[bit / 8] |= static_cast<std::uint8_t>(v);
    if ((bit % 8) + bits > 8) out[bit / 8 + 1] |= static_cast<std::uint8_t>(v >> 8);
    bit += bits;
  }
}

void unpack_bits(std::span<const std::uint8_t> in, int bits, std::span<std::uint8_t> codes) {
  check_bits(bits);
  if (in.size() != packed_bytes(codes.size(), bits)) {
    throw Error(fmt::format("unpack_bits: {} codes of {} bits need {} bytes, got {}", codes.size(),
                            bits, packed_bytes(codes.size(), bits), in.size()));
  }
  const std::uint32_t mask = (1u << bits) - 1u;
  std::size_t bit = 0;
  for (auto& c : codes) {
    std::uint32_t v = in[bit / 8];
    if ((bit % 8) + bits > 8) v |= std::uint32_t(in[bit / 8 + 1]) << 8;
    c = static_cast<std::uint8_t>((v >> (bit % 8)) & mask);
    bit += bits;
  }
}

}  // namespace tern::num
