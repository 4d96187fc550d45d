// Every registered kernel with a host reference, on small and odd shapes:
// bit for bit against the reference (the same check `tern bench kernel`
// runs), plus the registry's parameter handling.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "arch/chip.h"
#include "common/run_kernel.h"
#include "kernel/registry.h"
#include "sim/simulator.h"
#include "util/error.h"

namespace tern {
namespace {

struct Case {
  std::string kernel, chip;
  std::map<std::string, std::string> params;
};

std::string case_name(const Case& c) {
  std::string s = c.kernel + "_" + c.chip;
  for (const auto& [k, v] : c.params) s += "_" + k + v;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

class RegistryBitExact : public ::testing::TestWithParam<Case> {};

TEST_P(RegistryBitExact, MatchesHostReference) {
  const Case& c = GetParam();
  const arch::ChipSpec chip = arch::load_chip(c.chip);
  const kernel::KernelEntry& e = kernel::find_kernel(c.kernel);
  ASSERT_TRUE(e.reference) << c.kernel << " has no host reference";
  const kernel::Params p(e.name, e.params, c.params);
  const isa::Program prog = e.build(chip, p);
  const kernel::NamedData in = kernel::make_inputs(prog, e, p, 7);
  sim::Simulator s(chip);
  s.load(prog);
  for (const auto& [name, v] : in) s.write(name, v);
  s.run();
  for (const auto& [name, want] : e.reference(chip, p, in))
    EXPECT_EQ(testing_helpers::mismatches(s.read(name), want, name.c_str()), 0u) << name;
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, RegistryBitExact,
    ::testing::Values(
        Case{"softmax", "trn3", {{"rows", "200"}, {"dim", "333"}}},
        Case{"softmax", "trn3", {{"rows", "1"}, {"dim", "1"}}},
        Case{
            "softmax", "trn3", {{"rows", "257"}, {"dim", "64"}, {"dtype", "fp32"}, {"cores", "3"}}},
        Case{"softmax", "trn3", {{"rows", "130"}, {"dim", "2500"}, {"dtype", "fp16"}}},
        Case{"softmax_backward", "trn3", {{"rows", "200"}, {"dim", "333"}}},
        Case{"softmax_backward", "trn2", {{"rows", "129"}, {"dim", "1"}, {"dtype", "fp32"}}},
        Case{"softmax_backward", "trn1", {{"rows", "64"}, {"dim", "700"}, {"cores", "2"}}},
        Case{"cross_entropy", "trn3", {{"rows", "200"}, {"vocab", "65"}}},
        Case{"cross_entropy",
             "trn3",
             {{"rows", "130"}, {"vocab", "5000"}, {"chunk", "1024"}, {"cores", "2"}}},
        Case{"cross_entropy",
             "trn3",
             {{"rows", "3"}, {"vocab", "1"}, {"dtype", "fp32"}, {"grad_scale", "2"}}},
        Case{"cross_entropy", "trn3", {{"rows", "64"}, {"vocab", "777"}, {"chunk", "100"}}},
        Case{"elementwise", "trn3", {{"rows", "300"}, {"dim", "3000"}, {"cores", "2"}}},
        Case{
            "elementwise", "trn2", {{"rows", "1"}, {"dim", "1"}, {"op", "mul"}, {"dtype", "fp32"}}},
        Case{"elementwise",
             "trn1",
             {{"rows", "129"}, {"dim", "77"}, {"op", "sub"}, {"dtype", "fp16"}}},
        Case{"elementwise",
             "trn3",
             {{"rows", "200"}, {"dim", "50"}, {"op", "scale"}, {"alpha", "-0.3"}, {"cores", "3"}}},
        Case{"elementwise", "trn3", {{"rows", "130"}, {"dim", "300"}, {"op", "gelu"}}},
        Case{"elementwise",
             "trn3",
             {{"rows", "300"}, {"dim", "2100"}, {"b_row", "true"}, {"cores", "2"}}},
        Case{"elementwise",
             "trn1",
             {{"rows", "129"}, {"dim", "77"}, {"op", "sub"}, {"b_row", "true"}, {"dtype", "fp16"}}},
        Case{"elementwise",
             "trn3",
             {{"rows", "5"}, {"dim", "40"}, {"op", "mul"}, {"b_row", "true"}, {"dtype", "fp32"}}},
        Case{"elementwise",
             "trn2",
             {{"rows", "64"}, {"dim", "99"}, {"op", "silu"}, {"dtype", "fp32"}, {"cores", "2"}}},
        Case{"elementwise", "trn3", {{"rows", "70"}, {"dim", "33"}, {"op", "relu"}}},
        Case{"elementwise", "trn3", {{"rows", "129"}, {"dim", "40"}, {"op", "gelu_tanh_backward"}}},
        Case{"elementwise",
             "trn3",
             {{"rows", "50"}, {"dim", "64"}, {"op", "silu_backward"}, {"dtype", "fp32"}}},
        Case{"elementwise", "trn1", {{"rows", "8"}, {"dim", "300"}, {"op", "gelu_backward"}}},
        Case{"elementwise", "trn3", {{"rows", "20"}, {"dim", "20"}, {"op", "relu_backward"}}},
        Case{"reduce", "trn3", {{"rows", "300"}, {"dim", "5000"}, {"op", "sumsq"}}},
        Case{"reduce",
             "trn3",
             {{"rows", "257"}, {"dim", "4100"}, {"op", "max"}, {"all", "true"}, {"cores", "2"}}},
        Case{"reduce",
             "trn2",
             {{"rows", "1"}, {"dim", "1"}, {"op", "sum"}, {"all", "true"}, {"cores", "3"}}},
        Case{"reduce",
             "trn3",
             {{"rows", "130"},
              {"dim", "2049"},
              {"op", "sumsq"},
              {"all", "true"},
              {"dtype", "fp32"}}},
        Case{"clip_by_global_norm", "trn3", {{"rows", "300"}, {"dim", "1000"}, {"cores", "2"}}},
        Case{"clip_by_global_norm",
             "trn1",
             {{"rows", "3"},
              {"dim", "5000"},
              {"dtype", "bf16"},
              {"max_norm", "1000"},
              {"parts", "1"}}},
        Case{"glu", "trn3", {{"rows", "300"}, {"dim", "3000"}, {"cores", "2"}}},
        Case{"glu", "trn1", {{"rows", "1"}, {"dim", "1"}, {"act", "gelu"}, {"dtype", "fp32"}}},
        Case{"glu_backward",
             "trn3",
             {{"rows", "129"}, {"dim", "2100"}, {"act", "gelu_tanh"}, {"dtype", "fp16"}}},
        Case{"glu_backward", "trn2", {{"rows", "130"}, {"dim", "77"}, {"cores", "3"}}},
        Case{"layernorm_backward", "trn3", {{"rows", "300"}, {"dim", "1000"}, {"cores", "2"}}},
        Case{"layernorm_backward", "trn1", {{"rows", "1"}, {"dim", "1"}, {"cores", "2"}}},
        Case{"layernorm_backward",
             "trn2",
             {{"rows", "257"}, {"dim", "768"}, {"cores", "3"}, {"dtype", "fp16"}}},
        Case{"matmul",
             "trn3",
             {{"m", "200"},
              {"n", "700"},
              {"k", "300"},
              {"epilogue", "bias,gelu,amax,qscale"},
              {"out", "fp8_e4m3"},
              {"cores", "2"}}},
        // MX with a K tail of 64 and of 32 + 128: zero-padded on chip.
        Case{"matmul", "trn3", {{"m", "200"}, {"n", "300"}, {"k", "64"}, {"dtype", "fp8_e4m3_x4"}}},
        Case{"matmul",
             "trn3",
             {{"m", "64"}, {"n", "130"}, {"k", "160"}, {"dtype", "fp8_e5m2_x4"}, {"cores", "2"}}},
        Case{"matmul",
             "trn3",
             {{"m", "130"},
              {"n", "70"},
              {"k", "256"},
              {"dtype", "fp8_e4m3_x4"},
              {"epilogue", "amax,qscale"},
              {"out", "fp8_e5m2"}}},
        Case{"matmul",
             "trn2",
             {{"m", "100"},
              {"n", "100"},
              {"k", "100"},
              {"epilogue", "amax"},
              {"out", "bf16"},
              {"batch", "2"}}},
        Case{"epilogue",
             "trn3",
             {{"rows", "200"},
              {"dim", "700"},
              {"epilogue", "scale=2,bias,silu,residual,amax,qscale"},
              {"dtype", "fp8_e4m3"}}},
        Case{"rmsnorm",
             "trn3",
             {{"rows", "300"},
              {"dim", "1000"},
              {"out", "fp8_e4m3"},
              {"qscale", "true"},
              {"amax", "true"},
              {"cores", "2"}}},
        Case{"rmsnorm",
             "trn1",
             {{"rows", "130"}, {"dim", "1"}, {"amax", "true"}, {"residual", "true"}}},
        Case{"layernorm",
             "trn3",
             {{"rows", "300"},
              {"dim", "1000"},
              {"out", "fp8_e5m2"},
              {"qscale", "true"},
              {"amax", "true"},
              {"residual", "true"}}},
        Case{"layernorm",
             "trn2",
             {{"rows", "64"}, {"dim", "700"}, {"dtype", "fp32"}, {"out", "bf16"}}},
        // Two buffers (a row too long for three): two tiles in flight.
        Case{"rmsnorm_backward", "trn3", {{"rows", "384"}, {"dim", "4096"}, {"dtype", "fp32"}}},
        Case{"layernorm_backward", "trn3", {{"rows", "384"}, {"dim", "2048"}, {"dtype", "fp32"}}},
        Case{"cast", "trn3", {{"rows", "300"}, {"dim", "3000"}, {"cores", "2"}}},
        Case{"cast",
             "trn2",
             {{"rows", "130"}, {"dim", "1"}, {"in", "fp32"}, {"out", "bf16"}, {"scaled", "false"}}},
        Case{"cast",
             "trn3",
             {{"rows", "200"},
              {"dim", "2500"},
              {"in", "fp8_e4m3"},
              {"out", "fp32"},
              {"amax", "false"}}},
        Case{"cast", "trn3", {{"rows", "64"}, {"dim", "100"}, {"out", "fp8_e5m2"}, {"cores", "3"}}},
        Case{"rmsnorm", "trn3", {{"rows", "130"}, {"dim", "100"}, {"residual", "true"}}},
        Case{"layernorm", "trn2", {{"rows", "130"}, {"dim", "100"}}},
        Case{"adamw", "trn3", {{"rows", "130"}, {"dim", "100"}, {"step", "3"}}},
        Case{"matmul", "trn3", {{"m", "200"}, {"n", "300"}, {"k", "260"}, {"trans_a", "false"}}},
        Case{"matmul",
             "trn2",
             {{"m", "200"},
              {"n", "300"},
              {"k", "260"},
              {"trans_b", "true"},
              {"epilogue", "bias,gelu"},
              {"dtype", "fp16"}}},
        Case{"matmul",
             "trn3",
             {{"m", "130"},
              {"n", "70"},
              {"k", "300"},
              {"trans_a", "false"},
              {"trans_b", "true"},
              {"batch", "3"},
              {"cores", "2"},
              {"epilogue", "residual"},
              {"out", "bf16"}}},
        Case{"matmul",
             "trn1",
             {{"m", "1"}, {"n", "1"}, {"k", "1"}, {"batch", "5"}, {"dtype", "fp32"}}},
        Case{
            "matmul", "trn3", {{"m", "130"}, {"n", "70"}, {"k", "200"}, {"epilogue", "bias,silu"}}},
        // The embedding kernels' prepare hook turns the random values into ids.
        Case{"embedding",
             "trn3",
             {{"tokens", "300"}, {"vocab", "1000"}, {"dim", "200"}, {"cores", "2"}}},
        Case{"embedding",
             "trn1",
             {{"tokens", "129"}, {"vocab", "7"}, {"dim", "33"}, {"dtype", "fp16"}}},
        Case{"embedding_backward",
             "trn3",
             {{"tokens", "2500"}, {"vocab", "50"}, {"dim", "100"}, {"cores", "2"}}},
        Case{"embedding_backward",
             "trn2",
             {{"tokens", "1"}, {"vocab", "1"}, {"dim", "1"}, {"dtype", "fp32"}}}),
    [](const ::testing::TestParamInfo<Case>& tp) { return case_name(tp.param); });

TEST(Registry, EveryKernelHasDocumentedParametersAndBuildsWithDefaultsOnTrn3) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  for (const auto& e : kernel::kernel_registry()) {
    EXPECT_FALSE(e.summary.empty()) << e.name;
    EXPECT_TRUE(e.build && e.describe) << e.name;
    for (const auto& d : e.params) EXPECT_FALSE(d.help.empty()) << e.name << " " << d.name;
    if (e.bound == "compute") {
      EXPECT_TRUE(e.useful_flops) << e.name;
    }
    const kernel::Params p(e.name, e.params, {});
    EXPECT_GT(e.build(chip, p).instruction_count(), 0) << e.name;
  }
}

TEST(Registry, BadParametersNameTheKernelAndTheParameter) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  try {
    kernel::build_kernel(chip, "softmax", {{"rowz", "3"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kernel softmax: unknown parameter 'rowz'"),
              std::string::npos)
        << e.what();
  }
  try {
    kernel::build_kernel(chip, "softmax", {{"rows", "3x"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rows = '3x': expected an integer"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(kernel::build_kernel(chip, "nosuch", {}), Error);
  EXPECT_THROW(kernel::build_kernel(chip, "cross_entropy", {{"grad_scale", "-1"}}), Error);
  EXPECT_THROW(kernel::build_kernel(chip, "softmax", {{"dtype", "fp8_e4m3"}}), NotSupported);
  EXPECT_THROW(kernel::build_kernel(chip, "softmax", {{"dim", "0"}}), Error);
  EXPECT_THROW(kernel::build_kernel(chip, "softmax", {{"dim", "1000000"}}), NotSupported);
  EXPECT_THROW(kernel::build_kernel(arch::load_chip("trn2"), "softmax", {}), NotSupported);
}

}  // namespace
}  // namespace tern
