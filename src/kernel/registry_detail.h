// Helpers shared by the kernel registry's files (registry.cpp,
// registry_rows.cpp): parameter documents, the specs read from Params, the
// references' rounding and input lookup. Not a public interface.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "arch/chip.h"
#include "kernel/kernels.h"
#include "kernel/reference.h"
#include "kernel/registry.h"

namespace tern::kernel::reg {

using RoundFn = float (*)(float);
RoundFn rounder(isa::DType dt);
const std::vector<float>& input(const NamedData& in, const std::string& name);
const std::vector<float>* optional_input(const NamedData& in, const std::string& name);
ParamDoc rows_doc();
ParamDoc dim_doc(const char* what = "Columns (the normalized dim)");
ParamDoc cores_doc();
RmsNormSpec norm_spec(const Params& p, float default_eps);
std::vector<ParamDoc> with_quant_docs(std::vector<ParamDoc> d);
std::optional<NormQuant> norm_quant(const RmsNormSpec& s, const NamedData& in);
std::vector<ParamDoc> norm_docs(const char* eps_default);
std::string norm_describe(const char* what, const Params& p);
AdamWSpec adamw_spec(const Params& p);
MatmulSpec matmul_spec(const Params& p);
SoftmaxSpec softmax_spec(const Params& p);
CrossEntropySpec cross_entropy_spec(const Params& p);
ElementwiseSpec elementwise_spec(const Params& p);
ReduceSpec reduce_spec(const Params& p);
ClipSpec clip_spec(const Params& p);
GluSpec glu_spec(const Params& p);
CastSpec cast_spec(const Params& p);
std::string rows_describe(const char* what, const Params& p);
EmbeddingSpec embedding_spec(const Params& p);
std::vector<ParamDoc> embedding_docs(const char* dtype_help);
void prepare_ids(const Params& p, const std::string& name, std::vector<float>& v);
std::vector<ParamDoc> attention_docs();
AttentionSpec attention_spec(const arch::ChipSpec& c, const Params& p);
double attention_flops(const Params& p);
std::string attention_describe(const char* what, const Params& p);
std::function<void(const Params&, const std::string&, std::vector<float>&)> qscale_input(
    float value);
// The entries of the row-wise, layout and attention kernels (registry_rows.cpp).
void add_row_kernels(std::vector<KernelEntry>& r);

}  // namespace tern::kernel::reg
