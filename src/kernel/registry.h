// The built-in kernels by name: their parameters (with defaults and help),
// how to build each one, and its bit-exact host reference. One table serves
// `tern bench kernel NAME`, the Python package (tern._core.build_kernel) and
// the graph compiler's lowering.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "arch/chip.h"
#include "isa/program.h"

namespace tern::kernel {

// What a parameter's text holds. `deduce`: from the default value (true or
// false: flag; an integer: integer; a number: number; a dtype name: dtype;
// anything else: text).
enum class ParamKind { deduce, integer, number, flag, dtype, choice, text };

struct ParamDoc {
  std::string name;           // lower_snake_case; the CLI option is --name with '-' for '_'
  std::string default_value;  // text; "" for none (the kernel picks; help says what)
  std::string help;
  ParamKind declared = ParamKind::deduce;
  std::vector<std::string> choices = {};  // ParamKind::choice: the accepted words
  bool flag() const { return kind() == ParamKind::flag; }
  ParamKind kind() const;
  // The smallest value of an integer: 0 where 0 means "the default" (its
  // default is 0), else 1 (sizes and counts).
  std::int64_t min_integer() const { return default_value == "0" ? 0 : 1; }
};

// A kernel's parameters resolved against its ParamDocs: every documented
// name has a value (given or default); typed getters throw tern::Error
// naming the kernel, the parameter and the bad text.
class Params {
 public:
  Params(std::string kernel, const std::vector<ParamDoc>& docs,
         const std::map<std::string, std::string>& given);
  std::int64_t i64(const std::string& name) const;
  int i32(const std::string& name) const;
  float f32(const std::string& name) const;
  bool flag(const std::string& name) const;
  isa::DType dtype(const std::string& name) const;
  const std::string& text(const std::string& name) const;
  const std::map<std::string, std::string>& values() const { return values_; }

 private:
  std::string kernel_;
  std::map<std::string, std::string> values_;
};

using NamedData = std::vector<std::pair<std::string, std::vector<float>>>;

struct KernelEntry {
  std::string name, summary;
  std::vector<ParamDoc> params;
  // What bounds it: "memory" (report % of HBM bandwidth) or "compute" (% of
  // Tensor-engine peak counting useful_flops).
  std::string bound = "memory";
  std::function<isa::Program(const arch::ChipSpec&, const Params&)> build;
  // Expected outputs by name, bit for bit, from the inputs by name (in the
  // program's declaration order); null when only tolerance checks exist.
  std::function<NamedData(const arch::ChipSpec&, const Params&, const NamedData&)> reference;
  // Makes random inputs valid (e.g. |v| for AdamW's second moment, token ids
  // in range); null when any values are.
  std::function<void(const Params&, const std::string& input, std::vector<float>&)> prepare;
  // FLOPs the operation needs (not counting masked or padded work); null for
  // memory-bound kernels.
  std::function<double(const Params&)> useful_flops;
  // One line naming the shape and dtypes, for tables.
  std::function<std::string(const Params&)> describe;
};

const std::vector<KernelEntry>& kernel_registry();
// Throws tern::Error listing the known names when `name` is not one.
const KernelEntry& find_kernel(const std::string& name);
// Deterministic values for tensor `t`: normal(0, 1) rounded to its dtype
// (nearest even, saturating).
std::vector<float> random_values(const isa::HbmTensor& t, std::uint64_t seed);
// Deterministic random inputs for every input tensor of `p` (normal(0, 1)
// rounded to the tensor's dtype, seeds seed, seed + 1, ... in declaration
// order), made valid by the entry's `prepare`.
NamedData make_inputs(const isa::Program& p, const KernelEntry& e, const Params& params,
                      std::uint64_t seed = 1);
// Convenience: resolve `given` and build.
isa::Program build_kernel(const arch::ChipSpec& chip, const std::string& name,
                          const std::map<std::string, std::string>& given);

}  // namespace tern::kernel
