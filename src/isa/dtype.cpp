#include "isa/dtype.h"

#include <fmt/format.h>
#include <array>

#include "util/error.h"

namespace tern::isa {

namespace {
struct Info {
  std::string_view nki, shorter;
  int bytes;
  int format;  // num::FormatId or -1
};
constexpr std::array<Info, static_cast<std::size_t>(DType::count_)> kInfo = {{
    {"float32", "fp32", 4, static_cast<int>(num::FormatId::fp32)},
    {"tfloat32", "tf32", 4, static_cast<int>(num::FormatId::tf32)},
    {"bfloat16", "bf16", 2, static_cast<int>(num::FormatId::bf16)},
    {"float16", "fp16", 2, static_cast<int>(num::FormatId::fp16)},
    {"float8_e4m3fn", "fp8_e4m3", 1, static_cast<int>(num::FormatId::e4m3)},
    {"float8_e5m2", "fp8_e5m2", 1, static_cast<int>(num::FormatId::e5m2)},
    {"float8_e4m3", "fp8_e4m3_legacy", 1, static_cast<int>(num::FormatId::e4m3_legacy)},
    {"float8_e8m0fnu", "e8m0", 1, static_cast<int>(num::FormatId::e8m0)},
    {"int8", "i8", 1, -1},
    {"uint8", "u8", 1, -1},
    {"int16", "i16", 2, -1},
    {"uint16", "u16", 2, -1},
    {"int32", "i32", 4, -1},
    {"uint32", "u32", 4, -1},
    {"float8_e4m3fn_x4", "fp8_e4m3_x4", 4, -1},
    {"float8_e5m2_x4", "fp8_e5m2_x4", 4, -1},
    {"float4_e2m1fn_x4", "fp4_e2m1_x4", 2, -1},
}};
const Info& info(DType d) {
  return kInfo[static_cast<std::size_t>(d)];
}
}  // namespace

int size_bytes(DType d) {
  return info(d).bytes;
}
std::string_view name(DType d) {
  return info(d).nki;
}
bool is_float(DType d) {
  return info(d).format >= 0;
}
bool is_fp8(DType d) {
  return d == DType::fp8_e4m3 || d == DType::fp8_e5m2 || d == DType::fp8_e4m3_legacy;
}

const num::Format* format_of(DType d) {
  const int f = info(d).format;
  return f < 0 ? nullptr : &num::format(static_cast<num::FormatId>(f));
}

bool is_x4(DType d) {
  return d == DType::fp8_e4m3_x4 || d == DType::fp8_e5m2_x4 || d == DType::fp4_e2m1_x4;
}

const num::Format* x4_element(DType d) {
  switch (d) {
    case DType::fp8_e4m3_x4:
      return &num::format(num::FormatId::e4m3);
    case DType::fp8_e5m2_x4:
      return &num::format(num::FormatId::e5m2);
    case DType::fp4_e2m1_x4:
      return &num::format(num::FormatId::e2m1);
    default:
      return nullptr;
  }
}

DType parse_dtype(std::string_view s) {
  for (std::size_t i = 0; i < kInfo.size(); ++i) {
    if (kInfo[i].nki == s || kInfo[i].shorter == s) return static_cast<DType>(i);
  }
  std::string known;
  for (const auto& i : kInfo) known += (known.empty() ? "" : ", ") + std::string(i.nki);
  throw Error(fmt::format("unknown dtype '{}'; known: {}", s, known));
}

bool supported_by(DType d, int core_version) {
  if (is_x4(d)) return core_version >= 4;
  if (d == DType::fp8_e4m3) return core_version >= 4;
  // The legacy IEEE-like E4M3 stays through Trainium3 (nki.language
  // float8_e4m3: "Trn1, Trn2, Trn3"; neuronx-cc NCC_EVRF052: "not supported
  // on hardware newer than Trn3").
  if (d == DType::fp8_e4m3_legacy) return core_version <= 4;
  return true;
}

}  // namespace tern::isa
