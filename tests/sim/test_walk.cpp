// Walks of access patterns and the row decoders the functional model reads
// operands with: a pattern read across runs (Walk::cols) decodes to the
// same floats as element by element.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "sim/codec.h"
#include "sim/codec_simd.h"
#include "sim/walk.h"

namespace tern::sim {
namespace {

using isa::AccessPattern;
using isa::DType;

// An SBUF pattern with free dims given as {count, stride in elements},
// outer first.
AccessPattern sbuf(DType d, std::vector<std::pair<std::int64_t, std::int64_t>> dims,
                   std::int64_t offset = 0) {
  AccessPattern ap;
  ap.dtype = d;
  ap.offset = offset;
  ap.partitions = 1;
  for (const auto& [count, stride] : dims) ap.dims.push_back(isa::Dim{stride, count});
  return ap;
}

TEST(Walk, ReadAcrossRunsIsColumns) {
  // 128 groups of 4 elements, element j of a group 128 elements on: the
  // quantize_mx source layout of the MX matmul kernels.
  const Walk w = make_walk(sbuf(DType::bf16, {{128, 1}, {4, 128}}, 64));
  EXPECT_FALSE(w.run);
  EXPECT_EQ(w.cols, 4);
  EXPECT_EQ(w.col_stride, 256);
  EXPECT_EQ(w.offs[0], 64);
  EXPECT_EQ(w.offs[5], 64 + 256 + 2);
}

TEST(Walk, OtherPatternsAreNotColumns) {
  EXPECT_EQ(make_walk(sbuf(DType::fp32, {{512, 1}})).cols, 0);                  // one run
  EXPECT_EQ(make_walk(sbuf(DType::fp32, {{4, 128}, {128, 1}})).cols, 0);        // runs, row-major
  EXPECT_EQ(make_walk(sbuf(DType::fp32, {{128, 2}, {4, 256}})).cols, 0);        // gaps in a column
  EXPECT_EQ(make_walk(sbuf(DType::fp32, {{512, 2}})).cols, 0);                  // a plain stride
  EXPECT_EQ(make_walk(std::vector<std::int64_t>{0, 8, 4, 12, 16}, 4).cols, 0);  // ragged
}

// Every type with a run decoder, 3 and 4 runs (4: the vectorized path),
// lengths with and without a vector tail: decode_columns gives
// decode_row's floats; the other types are refused untouched.
TEST(Codec, DecodeColumnsEqualsElementByElement) {
  std::mt19937 rng(7);
  std::vector<std::uint8_t> mem(4 * 4 * 96);
  for (auto& b : mem) b = static_cast<std::uint8_t>(rng());
  for (DType d : {DType::fp32, DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2,
                  DType::int8, DType::int32})
    for (std::int64_t cols : {3, 4})
      for (std::int64_t per : {std::int64_t{37}, std::int64_t{96 / isa::size_bytes(d)}}) {
        SCOPED_TRACE(fmt::format("{} cols {} per {}", isa::name(d), cols, per));
        const int sz = isa::size_bytes(d);
        std::vector<std::int64_t> offs;
        for (std::int64_t i = 0; i < per; ++i)
          for (std::int64_t j = 0; j < cols; ++j) offs.push_back(j * per * sz + i * sz);
        std::vector<float> want(offs.size()), got(offs.size(), -1.0f);
        decode_row(d, mem.data(), offs, want.data(), 0);
        const bool ok = decode_columns(d, mem.data(), static_cast<std::size_t>(per),
                                       static_cast<std::size_t>(cols), per * sz, got.data());
        if (d == DType::int8 || d == DType::int32) {
          EXPECT_FALSE(ok);
          EXPECT_EQ(got[0], -1.0f);
          continue;
        }
        ASSERT_TRUE(ok);
        for (std::size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i]))
              << i;
      }
}

// BF16 runs of every length up to a few vectors decode to the codes'
// high halves (the vector body and its tail).
TEST(Codec, Bf16RunsOfEveryLength) {
  std::vector<std::uint8_t> mem(2 * 100);
  for (std::size_t i = 0; i < mem.size(); ++i) mem[i] = static_cast<std::uint8_t>(i * 37 + 11);
  for (std::size_t n = 1; n <= 100; ++n) {
    std::vector<std::int64_t> offs(n);
    for (std::size_t i = 0; i < n; ++i) offs[i] = static_cast<std::int64_t>(2 * i);
    std::vector<float> got(n);
    decode_row(DType::bf16, mem.data(), offs, got.data(), 1);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t code = mem[2 * i] | (std::uint32_t{mem[2 * i + 1]} << 8);
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), code << 16) << n << " " << i;
    }
  }
}

// MX-FP8 rows of every length up to a few vectors: each packed byte looks
// up its element's scale row (the vector body's gathers and the tail).
TEST(Codec, Mx8RowsLookUpEachByteInItsScaleRow) {
  std::vector<float> table(256 * 256);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i) * 0.5f - 7.0f;
  std::mt19937 rng(3);
  for (std::size_t F = 1; F <= 70; ++F) {
    std::vector<std::uint8_t> codes(4 * F), scales(F);
    for (auto& b : codes) b = static_cast<std::uint8_t>(rng());
    for (auto& b : scales) b = static_cast<std::uint8_t>(rng());
    std::vector<float> got(4 * F);
    decode_mx8_row(codes.data(), scales.data(), F, table.data(), got.data());
    for (std::size_t f = 0; f < F; ++f)
      for (std::size_t j = 0; j < 4; ++j)
        ASSERT_EQ(got[j * F + f], table[std::size_t{scales[f]} * 256 + codes[4 * f + j]])
            << F << " " << f << " " << j;
  }
}

}  // namespace
}  // namespace tern::sim
