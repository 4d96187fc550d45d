// Row semantics of nki.isa's selection, search and scan instructions
// (max8, nc_find_index8, nc_match_replace8, tensor_tensor_scan,
// select_reduce, range_select, nonzero_with_count): pure functions over one
// partition's values in FP32, the free dims flattened in row-major order.
// The simulator applies them row by row; tests check them against NumPy
// transcriptions of the NKI API reference.
#pragma once

#include <cstddef>
#include <cstdint>

#include "isa/instruction.h"

namespace tern::isa {

// Written where nc_find_index8 finds no match: encodes to the all-ones
// value of the unsigned index types (the simulator's float-to-integer
// conversion saturates).
inline constexpr float kNotFound = 3.4028234663852886e38f;

// The 8 largest of x[0..n), descending (ties kept, NaN sorts first as the
// largest), n >= 8.
void max8_row(const float* x, std::size_t n, float out[8]);
// out[j] = the first i with x[i] == vals[j], or kNotFound.
void find_index8_row(const float* x, std::size_t n, const float vals[8], float out[8]);
// For j = 0..7 in order: the first i with x[i] == vals[j] becomes imm (so
// an equal later value finds the next occurrence); idx[j] = i, or 0 when
// there is none (x unchanged then).
void match_replace8_row(float* x, std::size_t n, const float vals[8], float imm, float idx[8]);
// out[i] = op1(op0(d0[i], r), d1[i]) with r = out[i - 1] (r = init at i = 0);
// reverse0 swaps op0's operands (op0(r, d0[i])), reverse1 op1's
// (op1(d1[i], .)). FP32 throughout.
void scan_row(const float* d0, const float* d1, std::size_t n, float init, AluOp op0, AluOp op1,
              bool reverse0, bool reverse1, float* out);
// dst[0..k) = offset + i for each non-zero x[i] in order, dst[k..n) = pad,
// dst[n] = k (dst has n + 1 entries).
void nonzero_row(const float* x, std::size_t n, float offset, float pad, float* dst);
// NKI sequence_bounds on one row of n segment ids: start[i] / end[i] the
// first index of the run of equal ids holding i / one past its last;
// padding (id 0) gets start n and end -1. dst has 2n entries: the starts,
// then the ends.
void sequence_bounds_row(const float* ids, std::size_t n, float* dst);

}  // namespace tern::isa
