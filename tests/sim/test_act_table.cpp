// Activation tables for BF16 inputs: every entry of every function's table
// equals isa::apply_act on that BF16 value (exhaustive: 65,536 codes).
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>

#include "isa/instruction.h"
#include "sim/act_table.h"

namespace tern {
namespace {

TEST(ActTables, EveryEntryIsApplyActBitForBit) {
  for (int fi = 0; fi < static_cast<int>(isa::ActFunc::count_); ++fi) {
    const auto f = static_cast<isa::ActFunc>(fi);
    for (const auto& [scale, bias] : {std::pair{1.0f, 0.0f}, {0.5f, 0.25f}, {-3.0f, 0.0f}}) {
      const float* t = sim::act_tables().get(f, scale, bias, sim::ActTables::kBuildAfter);
      ASSERT_NE(t, nullptr);
      int bad = 0;
      for (std::uint32_t c = 0; c < (1u << 16); ++c) {
        const float want = isa::apply_act(f, std::bit_cast<float>(c << 16) * scale + bias);
        if (std::bit_cast<std::uint32_t>(t[c]) != std::bit_cast<std::uint32_t>(want) && bad++ < 3)
          ADD_FAILURE() << isa::act_name(f) << " code " << c << ": " << t[c] << ", want " << want;
      }
      EXPECT_EQ(bad, 0) << isa::act_name(f) << " scale " << scale << " bias " << bias;
    }
  }
}

TEST(ActTables, BuiltOnlyAfterEnoughUse) {
  auto& tables = sim::act_tables();
  const float scale = 0.123f;  // a key no other test uses
  EXPECT_EQ(tables.get(isa::ActFunc::tanh, scale, 0.0f, sim::ActTables::kBuildAfter - 10), nullptr);
  EXPECT_EQ(tables.get(isa::ActFunc::tanh, scale, 0.0f, 5), nullptr);
  EXPECT_NE(tables.get(isa::ActFunc::tanh, scale, 0.0f, 5), nullptr);
}

}  // namespace
}  // namespace tern
