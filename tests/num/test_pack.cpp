#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "num/pack.h"
#include "util/error.h"

namespace tern::num {
namespace {

TEST(Pack, X4Fp8LayoutIsElementZeroInTheLowByte) {
  const std::vector<std::uint8_t> codes = {0x01, 0x02, 0x03, 0x04, 0xAA, 0xBB, 0xCC, 0xDD};
  std::vector<std::uint32_t> w(2);
  pack_x4_fp8(codes, w);
  EXPECT_EQ(w[0], 0x04030201u);
  EXPECT_EQ(w[1], 0xDDCCBBAAu);
  std::vector<std::uint8_t> back(8);
  unpack_x4_fp8(w, back);
  EXPECT_EQ(back, codes);
}

TEST(Pack, X4Fp4LayoutIsElementZeroInTheLowNibble) {
  const std::vector<std::uint8_t> codes = {0x1, 0x2, 0x3, 0xF};
  std::vector<std::uint16_t> w(1);
  pack_x4_fp4(codes, w);
  EXPECT_EQ(w[0], 0xF321u);
  std::vector<std::uint8_t> back(4);
  unpack_x4_fp4(w, back);
  EXPECT_EQ(back, codes);
}

TEST(Pack, BitStreamsForFp6AndFp4) {
  // Four FP6 codes fill three bytes, little-endian bit order.
  const std::vector<std::uint8_t> six = {0x3F, 0x00, 0x15, 0x2A};
  std::vector<std::uint8_t> out(packed_bytes(4, 6));
  ASSERT_EQ(out.size(), 3u);
  pack_bits(six, 6, out);
  // bits: 111111 000000 010101 101010 -> byte0 = 00111111, byte1 = 0101 0000, byte2 = 101010 01
  EXPECT_EQ(out[0], 0x3F);
  EXPECT_EQ(out[1], 0x50);
  EXPECT_EQ(out[2], 0xA9);
  std::vector<std::uint8_t> back(4);
  unpack_bits(out, 6, back);
  EXPECT_EQ(back, six);

  std::mt19937 rng(3);
  for (int bits : {4, 6, 8, 3}) {
    std::vector<std::uint8_t> c(101);
    for (auto& x : c) x = static_cast<std::uint8_t>(rng() & ((1u << bits) - 1));
    std::vector<std::uint8_t> p(packed_bytes(c.size(), bits)), u(c.size());
    pack_bits(c, bits, p);
    unpack_bits(p, bits, u);
    EXPECT_EQ(u, c) << bits;
  }
}

TEST(Pack, SizeErrors) {
  std::vector<std::uint8_t> codes(6);
  std::vector<std::uint32_t> w(2);
  EXPECT_THROW(pack_x4_fp8(codes, w), Error);
  std::vector<std::uint8_t> out(2);
  EXPECT_THROW(pack_bits(codes, 6, out), Error);
  EXPECT_THROW(pack_bits(codes, 9, out), Error);
}

}  // namespace
}  // namespace tern::num
