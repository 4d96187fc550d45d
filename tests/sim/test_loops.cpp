// Registers, loops and branches: each engine's sequencer runs a loop whose
// operands are addressed by a register and whose semaphore waits grow with
// the iteration.
#include <gtest/gtest.h>

#include "common/sim_helpers.h"
#include "sim/simulator.h"
#include "util/error.h"

namespace tern {
namespace {

using isa::DType;
using isa::Engine;
using isa::Opcode;
using namespace testing_helpers;

isa::Instruction reg_set(Engine e, int rd, float v) {
  auto in = ins(e, Opcode::reg_set, {});
  in.rd = rd;
  in.imm0 = v;
  return in;
}
isa::Instruction reg_add(Engine e, int rd, int ra, float v) {
  auto in = ins(e, Opcode::reg_alu, {});
  in.rd = rd;
  in.ra = ra;
  in.alu0 = isa::AluOp::add;
  in.imm0 = v;
  return in;
}
isa::Instruction branch_lt(Engine e, int ra, float v, int target) {
  auto in = ins(e, Opcode::branch, {});
  in.ra = ra;
  in.alu0 = isa::AluOp::is_lt;
  in.imm0 = v;
  in.target = target;
  return in;
}
// The 64-float tile number `reg` of a row of tiles starting at `base` bytes.
isa::AccessPattern tile_at(std::int64_t base, int reg) {
  auto ap = sbuf(0, 128, base, 64);
  ap.offset_reg = reg;
  ap.reg_stride = 64 * 4;
  return ap;
}

// DMA loop (sync): load tile i, signal queue semaphore 4. Vector loop: wait
// for tile i (semaphore 4 >= 1 + r0), add 1, signal 1. A final DMA stores all.
isa::Program pipeline(const arch::ChipSpec& chip) {
  isa::Program p = program(chip);
  p.tensors.push_back({"out", 1 << 22, {128, 256}, DType::fp32, isa::TensorKind::output});
  // sync: r0 = 0; L1: dma tile r0; r0 += 1; if r0 < 4 goto L1; wait vector 4; store
  add(p, reg_set(Engine::sync, 0, 0));
  auto load = ins(Engine::sync, Opcode::dma_copy, {tile_at(0, 0), hbm(0, 128, 64)});
  load.operands[1].offset_reg = 0;
  load.operands[1].reg_stride = 128 * 64 * 4;
  load.signals = {4};
  add(p, load);
  add(p, reg_add(Engine::sync, 0, 0, 1));
  add(p, branch_lt(Engine::sync, 0, 4, 1));
  auto store =
      ins(Engine::sync, Opcode::dma_copy, {hbm(1 << 22, 128, 256), sbuf(0, 128, 4096, 256)});
  store.waits = {{1, 4, -1}};
  store.queue = 1;
  add(p, store);
  // vector: r0 = 0; L2: wait 4 >= 1 + r0; out tile r0 = in tile r0 + 1; r0 += 1; if r0 < 4 goto L2
  add(p, reg_set(Engine::vector, 0, 0));
  auto op = ins(Engine::vector, Opcode::tensor_scalar, {tile_at(4096, 0), tile_at(0, 0)});
  op.alu0 = isa::AluOp::add;
  op.imm0 = 1.0f;
  op.waits = {{4, 1, 0}};
  op.signals = {1};
  add(p, op);
  add(p, reg_add(Engine::vector, 0, 0, 1));
  add(p, branch_lt(Engine::vector, 0, 4, 1));
  return p;
}

TEST(Loops, RegisterAddressedPipelineComputesAndTimes) {
  const auto chip = arch::load_chip("trn3");
  const isa::Program p = pipeline(chip);
  sim::Simulator s(chip);
  s.load(p);
  // "t" holds 4 tiles of [128, 64], tile i row r at (i * 128 + r) * 64.
  std::vector<float> t(1 << 20, 0.0f);
  for (std::size_t i = 0; i < 4 * 128 * 64; ++i) t[i] = static_cast<float>(i % 1000) * 0.5f;
  s.write("t", t);
  sim::Options o;
  o.trace = true;
  const auto st = s.run(o);
  const auto out = s.read("out");
  for (int tile = 0; tile < 4; ++tile)
    for (int r = 0; r < 128; ++r)
      for (int i = 0; i < 64; ++i)
        ASSERT_EQ(out[r * 256 + tile * 64 + i], t[(tile * 128 + r) * 64 + i] + 1.0f);
  // 1 + 4 x 3 + 1 on the sync engine, 1 + 4 x 3 on the vector engine.
  EXPECT_EQ(st.instructions, 14 + 13);
  EXPECT_EQ(st.engines[0][static_cast<int>(Engine::vector)].instructions, 13);
  // The vector engine's compute: four 64-cycle tensor_scalars.
  EXPECT_DOUBLE_EQ(st.engines[0][static_cast<int>(Engine::vector)].busy_ns,
                   4 * 64 / chip.vector.clock.value());
  // Each add starts once its own tile has arrived: the 4th after the 4th load.
  double last_load_end = 0, last_add_start = 0;
  for (const auto& e : st.events) {
    if (e.name == "dma_copy" && e.track == "dma q0")
      last_load_end = std::max(last_load_end, e.start_ns + e.dur_ns);
    if (e.name == "tensor_scalar") last_add_start = std::max(last_add_start, e.start_ns);
  }
  EXPECT_GE(last_add_start, last_load_end);
}

TEST(Loops, TextAndBinaryKeepRegisters) {
  const auto chip = arch::load_chip("trn3");
  const isa::Program p = pipeline(chip);
  EXPECT_EQ(isa::parse_program_text(isa::to_text(p)), p);
  EXPECT_EQ(isa::parse_program_binary(isa::to_binary(p)), p);
  EXPECT_NE(isa::to_text(p).find("+r0*256"), std::string::npos);
  EXPECT_NE(isa::to_text(p).find("wait=4>=1+r0"), std::string::npos);
}

void expect_run_error(const arch::ChipSpec& chip, const isa::Program& p, const std::string& needle,
                      std::int64_t limit = 2'000'000'000) {
  sim::Simulator s(chip);
  try {
    s.load(p);
    sim::Options o;
    o.mode = sim::Mode::timing;
    o.max_instructions = limit;
    s.run(o);
    ADD_FAILURE() << "no error; wanted " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Loops, Errors) {
  const auto chip = arch::load_chip("trn3");
  isa::Program forever = program(chip);
  add(forever, branch_lt(Engine::vector, -1, 0, 0));  // unconditional jump to itself
  expect_run_error(chip, forever, "stopped after 1000 instructions", 1000);
  isa::Program past = program(chip);
  add(past, branch_lt(Engine::vector, 0, 1, 7));
  expect_run_error(chip, past, "branch target 7 is past the end of the 1-instruction stream");
  isa::Program bad_reg = program(chip);
  add(bad_reg, reg_set(Engine::scalar, 40, 1));
  expect_run_error(chip, bad_reg, "reg_set needs a destination register 0..31, got r40");
  // A register-addressed operand that walks out of SBUF fails when it gets there.
  isa::Program walk = program(chip);
  add(walk, reg_set(Engine::vector, 3, 0));
  auto m = ins(Engine::vector, Opcode::memset, {sbuf(0, 128, 0, 64)});
  m.operands[0].offset_reg = 3;
  m.operands[0].reg_stride = 100000;
  add(walk, m);
  add(walk, reg_add(Engine::vector, 3, 3, 1));
  add(walk, branch_lt(Engine::vector, 3, 10, 1));
  expect_run_error(
      chip, walk,
      "core 0, vector instruction #1 (memset): destination reaches bytes [300000, 300256)");
}

}  // namespace
}  // namespace tern
