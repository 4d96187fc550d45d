// Shared checks of the built-in kernels.
#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "kernel/detail.h"
#include "util/error.h"

namespace tern::kernel::detail {

bool vector_fast(const arch::ChipSpec& chip, isa::DType dt) {
  if (chip.costs.vector_perf_speedup <= 1) return false;
  const auto& names = chip.costs.perf_mode_dtypes;
  return std::any_of(names.begin(), names.end(),
                     [&](const std::string& n) { return isa::parse_dtype(n) == dt; });
}

void check_rows(const char* name, std::int64_t rows, std::int64_t dim, isa::DType dt, int cores) {
  if (rows < 1 || dim < 1)
    throw Error(fmt::format("{}: shape [{}, {}] must be >= 1", name, rows, dim));
  if (dt != isa::DType::fp32 && dt != isa::DType::bf16 && dt != isa::DType::fp16)
    throw NotSupported(fmt::format("{} of {} (fp32, bf16, fp16 are)", name, isa::name(dt)));
  if (cores < 1) throw Error(fmt::format("{}: cores must be >= 1, got {}", name, cores));
}

void check_sbuf(const arch::ChipSpec& chip, const char* name, std::int64_t dim, isa::DType dt,
                std::int64_t need) {
  if (need > sbuf_budget(chip)) {
    throw NotSupported(fmt::format(
        "{} with D = {} at {}: a row does not fit SBUF ({} bytes per partition needed, budget {})",
        name, dim, isa::name(dt), need, sbuf_budget(chip)));
  }
}

}  // namespace tern::kernel::detail
