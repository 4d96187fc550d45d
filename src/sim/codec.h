// Element <-> FP32 conversion for every isa::DType, on rows of elements.
// Engines compute in FP32 and cast on input and output (hardware.md
// section 1): decoding is exact; encoding rounds to nearest even (or
// stochastically), saturating for FP8 and E8M0 outputs and following IEEE
// (overflow to Inf) for BF16/FP16/TF32; integers round to nearest even and
// saturate. See docs/sim.md.
#pragma once

#include <cstdint>
#include <span>

#include "isa/dtype.h"
#include "num/convert.h"

namespace tern::sim {

// Whether the offsets are one ascending run of adjacent elements of `sz`
// bytes (then a row is a plain block of memory).
bool is_run(std::span<const std::int64_t> offs, int sz);

// src: n elements of `d`, each at byte offset offs[i] from base. `run`:
// whether offs is_run (1 / 0), when the caller knows; -1: checked here.
void decode_row(isa::DType d, const std::uint8_t* base, std::span<const std::int64_t> offs,
                float* out, int run = -1);
// A row stored as `cols` runs of `per` adjacent elements, run j starting
// j * stride bytes after p, read in the walk's order: out[i * cols + j] is
// element i of run j (a free pattern whose inner dim strides across
// partition-sized blocks and whose outer dim is contiguous). False, with nothing written, for a
// type read element by element only (decode_row then handles it, or says why not).
bool decode_columns(isa::DType d, const std::uint8_t* p, std::size_t per, std::size_t cols,
                    std::int64_t stride, float* out);
// Encodes n floats into elements of `d` at base + offs[i]. `index_base`
// numbers the elements for stochastic rounding. `run`: whether offs is_run
// (1 / 0), when the caller knows; -1: checked here.
void encode_row(isa::DType d, const float* in, std::span<const std::int64_t> offs,
                std::uint8_t* base, const num::CastOptions& opt, std::uint64_t index_base,
                int run = -1);

}  // namespace tern::sim
