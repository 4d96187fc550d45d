// Packed layouts of narrow codes.
//  - x4 (NKI float8_e4m3fn_x4 / float8_e5m2_x4 on NeuronCore-v4): four
//    consecutive 8-bit codes in one 32-bit word, element 0 in bits 0-7.
//  - float4_e2m1fn_x4: four consecutive 4-bit codes in one 16-bit word,
//    element 0 in bits 0-3.
//  - bit streams (OCP MX storage of FP6 / FP4): codes of `bits` bits laid
//    out little-endian, element 0 in the lowest bits of byte 0 (FP4: two
//    per byte; FP6: four per three bytes).
#pragma once

#include <cstdint>
#include <span>

namespace tern::num {

// codes.size() must be a multiple of 4 (tern::Error otherwise).
void pack_x4_fp8(std::span<const std::uint8_t> codes, std::span<std::uint32_t> packed);
void unpack_x4_fp8(std::span<const std::uint32_t> packed, std::span<std::uint8_t> codes);
void pack_x4_fp4(std::span<const std::uint8_t> codes, std::span<std::uint16_t> packed);
void unpack_x4_fp4(std::span<const std::uint16_t> packed, std::span<std::uint8_t> codes);

// Bytes needed for n codes of `bits` bits.
std::size_t packed_bytes(std::size_t n, int bits);
void pack_bits(std::span<const std::uint8_t> codes, int bits, std::span<std::uint8_t> out);
void unpack_bits(std::span<const std::uint8_t> in, int bits, std::span<std::uint8_t> codes);

}  // namespace tern::num
