// Private to sim: the row decoders of codec.cpp vectorized for the host
// (Highway, dispatched at run time). Decoding is exact, so the results are
// the scalar loops' bits on any target.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tern::sim {

// n BF16 codes at p (2 bytes each, little endian) as FP32.
void decode_bf16_run(const std::uint8_t* p, std::size_t n, float* out);
// Four runs of `per` BF16 (bf16 true) or FP32 elements, run j at
// p + j * stride bytes, interleaved: out[4 i + j] = element i of run j.
void decode_4_columns(bool bf16, const std::uint8_t* p, std::size_t per, std::int64_t stride,
                      float* out);

// One partition of an MX-FP8 operand: F x4 elements at `codes` (packed
// value j in byte j) and their E8M0 scale codes at `scales` (one byte per
// element), looked up in `table` ([256 scales][256 codes] FP32, the rows
// of the scales present filled): out[j * F + f] = table[scale f][byte j of
// element f].
void decode_mx8_row(const std::uint8_t* codes, const std::uint8_t* scales, std::size_t F,
                    const float* table, float* out);

}  // namespace tern::sim
