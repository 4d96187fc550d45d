// Tensor element types of the NeuronCore ISA (names follow nki.language).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "num/format.h"

namespace tern::isa {

enum class DType : std::uint8_t {
  fp32,
  tf32,
  bf16,
  fp16,
  fp8_e4m3,         // OCP float8_e4m3fn (Trn3)
  fp8_e5m2,         // float8_e5m2
  fp8_e4m3_legacy,  // IEEE-like float8_e4m3 of Trn1/Trn2 (max 240)
  e8m0,             // float8_e8m0fnu (MX scales)
  int8,
  uint8,
  int16,
  uint16,
  int32,
  uint32,
  // NeuronCore-v4 x4-packed MX element types: four consecutive contraction
  // values in one element (element 0 in the low bits). Only DMA moves them,
  // quantize_mx writes them and the Tensor engine's MX matmul reads them.
  fp8_e4m3_x4,
  fp8_e5m2_x4,
  fp4_e2m1_x4,
  count_,
};

int size_bytes(DType d);
// NKI name: "float32", "bfloat16", "float8_e4m3fn", ...
std::string_view name(DType d);
// Accepts NKI names and tern's short ones ("fp32", "bf16", "fp8_e4m3", "e4m3").
// Throws tern::Error listing the known names.
DType parse_dtype(std::string_view s);
bool is_float(DType d);
bool is_fp8(DType d);
// The number format of a float type (nullptr for integers and x4 types).
const num::Format* format_of(DType d);
bool is_x4(DType d);
// Whether NeuronCore-v`core_version` has the type: MX x4 types from v4;
// OCP E4M3 from v4 (v2 / v3 have the IEEE-like "legacy" E4M3, which v4 keeps).
bool supported_by(DType d, int core_version);
// The element format of an x4-packed type (nullptr otherwise).
const num::Format* x4_element(DType d);

}  // namespace tern::isa
