// Each hardware rule, broken once: the program is rejected (or stops) with a
// message naming the core, engine, instruction index, opcode and, when the
// builder recorded it, the kernel source line.
#include <gtest/gtest.h>

#include "common/expect_error.h"
#include "common/sim_helpers.h"
#include "kernel/builder.h"
#include "sim/simulator.h"
#include "util/error.h"

namespace tern {
namespace {

using isa::DType;
using isa::Engine;
using isa::Opcode;
using namespace testing_helpers;

// Loads (and runs, functional+timing) `p`; the error must contain every needle.
void expect_error(const arch::ChipSpec& chip, const isa::Program& p,
                  std::initializer_list<std::string> needles, sim::Mode mode = sim::Mode::both) {
  test_util::expect_error_words(
      [&] {
        sim::Simulator s(chip);
        s.load(p);
        sim::Options o;
        o.mode = mode;
        s.run(o);
      },
      needles);
}

isa::Program single(const arch::ChipSpec& chip, isa::Instruction in) {
  isa::Program p = program(chip);
  add(p, std::move(in));
  return p;
}

const arch::ChipSpec& trn3() {
  static const arch::ChipSpec c = arch::load_chip("trn3");
  return c;
}

TEST(Rules, SbufCapacity) {
  // 128 x 256 KiB: bytes [262000, 262000 + 4 x 100) run past the partition.
  expect_error(trn3(),
               single(trn3(), ins(Engine::vector, Opcode::memset, {sbuf(0, 128, 262000, 100)})),
               {"core 0, vector instruction #0 (memset)", "262144 bytes (capacity)"});
}

TEST(Rules, PsumCapacityAndBank) {
  expect_error(trn3(),
               single(trn3(), ins(Engine::vector, Opcode::memset, {psum(0, 128, 16384, 4)})),
               {"16384 bytes (capacity)"});
  // 512 fp32 starting at byte 1024 crosses the 2 KiB bank at 2048.
  expect_error(trn3(),
               single(trn3(), ins(Engine::vector, Opcode::memset, {psum(0, 128, 1024, 512)})),
               {"crossing a 2048-byte bank boundary"});
}

TEST(Rules, PartitionStartAndCount) {
  expect_error(trn3(), single(trn3(), ins(Engine::vector, Opcode::memset, {sbuf(32, 64, 0, 8)})),
               {"starts at partition 32 with 64 partitions", "must start at 0 or 64"});
  expect_error(trn3(), single(trn3(), ins(Engine::vector, Opcode::memset, {sbuf(16, 16, 0, 8)})),
               {"must start at 0, 32, 64 or 96"});
  expect_error(trn3(), single(trn3(), ins(Engine::vector, Opcode::memset, {sbuf(0, 129, 0, 8)})),
               {"partitions [0, 129) but sbuf has 128"});
  expect_error(trn3(), single(trn3(), ins(Engine::vector, Opcode::memset, {sbuf(64, 65, 0, 8)})),
               {"but sbuf has 128"});
}

TEST(Rules, TileLimits) {
  expect_error(trn3(),
               single(trn3(), ins(Engine::tensor, Opcode::load_stationary,
                                  {sbuf(0, 128, 0, 200, DType::bf16)})),
               {"stationary free size 200 exceeds the tile limit 128"});
  // A BF16 PSUM output (v4) keeps 600 columns inside one bank.
  auto mm = ins(Engine::tensor, Opcode::multiply_moving,
                {psum(0, 128, 0, 600, DType::bf16), sbuf(0, 128, 0, 600, DType::bf16)});
  expect_error(trn3(), single(trn3(), mm), {"moving free size 600 exceeds the tile limit 512"});
}

TEST(Rules, TensorScalarColumns) {
  auto ts = ins(Engine::vector, Opcode::tensor_scalar,
                {sbuf(0, 128, 0, 8), sbuf(0, 128, 64, 8), sbuf(0, 128, 128, 2)});
  ts.col0 = true;
  expect_error(trn3(), single(trn3(), ts), {"column operand 0 is [128, 2], need [128, 1]"});
  ts.operands.pop_back();
  expect_error(trn3(), single(trn3(), ts), {"has 2 operands but 1 per-partition column"});
}

TEST(Rules, EngineMemoryAccess) {
  auto mm = ins(Engine::tensor, Opcode::multiply_moving,
                {sbuf(0, 128, 0, 512), sbuf(0, 128, 4096, 512, DType::bf16)});
  expect_error(trn3(), single(trn3(), mm), {"the Tensor engine writes PSUM only"});
  mm.operands = {psum(0, 128, 0, 512), psum(0, 128, 2048, 512, DType::bf16)};
  expect_error(trn3(), single(trn3(), mm), {"the Tensor engine reads SBUF only"});
  expect_error(trn3(), single(trn3(), ins(Engine::gpsimd, Opcode::memset, {psum(0, 128, 0, 8)})),
               {"GpSimd cannot access PSUM"});
  expect_error(trn3(),
               single(trn3(), ins(Engine::vector, Opcode::tensor_tensor,
                                  {sbuf(0, 128, 0, 8), psum(0, 128, 0, 8), psum(0, 128, 2048, 8)})),
               {"cannot read both inputs from PSUM"});
  expect_error(
      trn3(),
      single(trn3(), ins(Engine::sync, Opcode::dma_copy, {psum(0, 128, 0, 8), hbm(0, 128, 8)})),
      {"DMA cannot access PSUM"});
  expect_error(trn3(), single(trn3(), ins(Engine::vector, Opcode::memset, {hbm(0, 128, 8)})),
               {"the vector engine cannot access HBM"});
  expect_error(trn3(), single(trn3(), ins(Engine::scalar, Opcode::memset, {sbuf(0, 128, 0, 8)})),
               {"memset cannot run on the scalar engine"});
  expect_error(trn3(),
               single(trn3(), ins(Engine::sync, Opcode::dma_copy,
                                  {sbuf(0, 128, 0, 8), hbm(1 << 30, 128, 8)})),
               {"outside every declared tensor"});
}

TEST(Rules, DtypePairingAndAvailability) {
  isa::Program p = program(trn3());
  add(p, ins(Engine::tensor, Opcode::load_stationary, {sbuf(0, 128, 0, 128, DType::fp32)}));
  add(p, ins(Engine::tensor, Opcode::multiply_moving,
             {psum(0, 128, 0, 512), sbuf(0, 128, 4096, 512, DType::bf16)}));
  expect_error(trn3(), p,
               {"stationary float32 with moving bfloat16", "fp32/tf32 pair only with fp32/tf32",
                "tensor instruction #1 (multiply_moving)"},
               sim::Mode::timing);
  const auto trn2 = arch::load_chip("trn2");
  expect_error(
      trn2,
      single(trn2, ins(Engine::vector, Opcode::memset, {sbuf(0, 128, 0, 8, DType::fp8_e4m3)})),
      {"float8_e4m3fn is not a trn2 (NeuronCore-v3) data type"});
  // The legacy E4M3 is still a Trainium3 type.
  sim::Simulator legacy_on_trn3(trn3());
  EXPECT_NO_THROW(legacy_on_trn3.load(single(
      trn3(), ins(Engine::vector, Opcode::memset, {sbuf(0, 128, 0, 8, DType::fp8_e4m3_legacy)}))));
}

TEST(Rules, MxOperands) {
  const auto x4 = DType::fp8_e4m3_x4;
  // x4 data is only for DMA, quantize_mx and the MX matmul.
  expect_error(
      trn3(),
      single(trn3(), ins(Engine::vector, Opcode::tensor_copy,
                         {sbuf(0, 128, 0, 8, x4), sbuf(0, 128, 64, 8, x4)})),
      {"float8_e4m3fn_x4 is x4-packed: only dma_copy, quantize_mx and the MX matmul use it"});
  // Scales must be [P/8, F].
  expect_error(
      trn3(),
      single(trn3(), ins(Engine::tensor, Opcode::load_stationary,
                         {sbuf(0, 128, 0, 128, x4), sbuf(0, 32, 4096, 128, DType::uint8)})),
      {"the MX stationary scales are [32, 128], expected [16, 128]"});
  // MX pairs only with MX.
  isa::Program p = program(trn3());
  add(p, ins(Engine::tensor, Opcode::load_stationary, {sbuf(0, 128, 0, 128, DType::bf16)}));
  add(p, ins(Engine::tensor, Opcode::multiply_moving,
             {psum(0, 128, 0, 512), sbuf(0, 128, 4096, 512, x4),
              sbuf(0, 16, 8192, 512, DType::uint8)}));
  expect_error(trn3(), p,
               {"an MX moving with a non-MX stationary: MX operands pair only with MX operands"},
               sim::Mode::timing);
  // quantize_mx groups: partitions a multiple of 32.
  expect_error(trn3(),
               single(trn3(), ins(Engine::vector, Opcode::quantize_mx,
                                  {sbuf(0, 16, 0, 8, x4), sbuf(0, 2, 4096, 8, DType::uint8),
                                   sbuf(0, 16, 8192, 32, DType::bf16)})),
               {"partitions must be a multiple of 32"});
  const auto trn2 = arch::load_chip("trn2");
  expect_error(trn2,
               single(trn2, ins(Engine::sync, Opcode::dma_copy,
                                {sbuf(0, 128, 0, 8, x4), sbuf(0, 128, 64, 8, x4)})),
               {"float8_e4m3fn_x4 is not a trn2 (NeuronCore-v3) data type"});
}

TEST(Rules, AccumulateOntoUninitializedPsum) {
  kernel::Builder b(trn3());
  const auto w = b.sbuf(128, 128, DType::bf16);
  const auto x = b.sbuf(128, 512, DType::bf16);
  const auto out = b.psum(128, 512);
  b.memset(w, 1.0f);
  b.memset(x, 1.0f);
  b.matmul(out, w, x, /*accumulate=*/true);
  expect_error(trn3(), b.finish(),
               {"accumulate=True onto PSUM reads never-written psum memory",
                "tensor instruction #1 (multiply_moving) at test_rules.cpp:"});
}

TEST(Rules, ReadOfNeverWrittenMemory) {
  kernel::Builder b(trn3());
  const auto src = b.sbuf(128, 64, DType::fp32);
  const auto dst = b.sbuf(128, 64, DType::fp32);
  b.tensor_copy(dst, src);
  expect_error(trn3(), b.finish(),
               {"the source reads never-written sbuf memory", "(tensor_copy) at test_rules.cpp:"});
  // HBM inputs the host never wrote are poisoned too.
  kernel::Builder h(trn3());
  const auto in = h.hbm("in", {128, 64}, DType::fp32, isa::TensorKind::input);
  const auto t = h.sbuf(128, 64, DType::fp32);
  h.dma_copy(t, in);
  expect_error(trn3(), h.finish(), {"the DMA source reads never-written hbm memory"});
}

// Each program starts with fresh SBUF and PSUM even on one simulator that
// ran another before (the memories are kept between loads, their written
// flags cleared): what the first program wrote is never-written for the
// second.
TEST(Rules, ANewProgramDoesNotSeeTheLastOnesWrites) {
  kernel::Builder a(trn3());
  const auto s1 = a.sbuf(128, 64, DType::fp32), s2 = a.sbuf(128, 64, DType::fp32);
  const auto p1 = a.psum(128, 512);
  a.memset(s1, 1.0f);
  a.memset(p1, 2.0f);
  a.tensor_copy(s2, s1);
  sim::Simulator sim(trn3());
  sim.load(a.finish());
  sim.run();
  kernel::Builder b(trn3());
  const auto t1 = b.sbuf(128, 64, DType::fp32), t2 = b.sbuf(128, 64, DType::fp32);
  b.tensor_copy(t2, t1);  // the same addresses the first program wrote
  sim.load(b.finish());
  try {
    sim.run();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reads never-written sbuf memory"), std::string::npos)
        << e.what();
  }
  kernel::Builder c(trn3());
  const auto w = c.sbuf(128, 128, DType::bf16), x = c.sbuf(128, 512, DType::bf16);
  c.memset(w, 1.0f), c.memset(x, 1.0f);
  c.matmul(c.psum(128, 512), w, x, /*accumulate=*/true);  // onto the PSUM written before
  sim.load(c.finish());
  EXPECT_THROW(sim.run(), Error);
}

// The written flags are marks that move on with each load (8 bits: they
// wrap around every 255 loads and are cleared then): across the wrap, a
// program still sees none of the earlier programs' writes.
TEST(Rules, WritesStayStaleAcrossTheMarksWrapAround) {
  kernel::Builder a(trn3());
  const auto s1 = a.sbuf(128, 64, DType::fp32), s2 = a.sbuf(128, 64, DType::fp32);
  a.memset(s1, 1.0f);
  a.tensor_copy(s2, s1);
  const isa::Program writer = a.finish();
  kernel::Builder b(trn3());
  const auto t1 = b.sbuf(128, 64, DType::fp32), t2 = b.sbuf(128, 64, DType::fp32);
  b.tensor_copy(t2, t1);  // reads what the writer wrote, never written by itself
  const isa::Program reader = b.finish();
  sim::Simulator sim(trn3());
  for (int i = 0; i < 600; ++i) {
    sim.load(writer);
    sim.run();
    if (i % 37 == 0 || (i >= 250 && i <= 260)) {  // around the first wrap too
      sim.load(reader);
      EXPECT_THROW(sim.run(), Error) << "load " << i;
    }
  }
}

TEST(Rules, Deadlock) {
  isa::Program p = program(trn3());
  auto a = ins(Engine::vector, Opcode::memset, {sbuf(0, 128, 0, 8)});
  a.waits = {{2, 1}};  // the scalar engine's semaphore, which nothing signals
  add(p, a);
  expect_error(
      trn3(), p,
      {"deadlock",
       "core 0, vector instruction #0 (memset) waits for semaphore 2 >= 1 (it only reaches 0)"});
  // A cycle: vector waits for scalar, scalar waits for vector.
  isa::Program q = program(trn3());
  auto v = ins(Engine::vector, Opcode::memset, {sbuf(0, 128, 0, 8)});
  v.waits = {{2, 1}};
  v.signals = {1};
  auto s = ins(Engine::scalar, Opcode::tensor_copy, {sbuf(0, 128, 64, 8), sbuf(0, 128, 0, 8)});
  s.waits = {{1, 1}};
  s.signals = {2};
  add(q, v);
  add(q, s);
  expect_error(trn3(), q, {"deadlock", "vector instruction #0", "scalar instruction #0"});
}

TEST(Rules, SemaphoresAndQueuesMustExist) {
  auto a = ins(Engine::vector, Opcode::memset, {sbuf(0, 128, 0, 8)});
  a.signals = {99};
  expect_error(trn3(), single(trn3(), a), {"signals semaphore 99 but the program has 20"});
  auto d = ins(Engine::sync, Opcode::dma_copy, {sbuf(0, 128, 0, 8), hbm(0, 128, 8)});
  d.queue = 16;
  expect_error(trn3(), single(trn3(), d), {"DMA queue 16 does not exist (0..15)"});
  d.queue = 0;
  d.priority = 2;
  const auto trn2 = arch::load_chip("trn2");
  expect_error(trn2, single(trn2, d), {"DMA priority 2 does not exist on trn2"});
}

TEST(Rules, HardwareDge) {
  // Descriptor Generation Engine reference: hwdge is v3+, direct copies and
  // transposes only, triggered by the Scalar or Sync engine.
  auto d = ins(Engine::sync, Opcode::dma_copy, {sbuf(0, 128, 0, 8), hbm(0, 128, 8)});
  d.hwdge = true;
  const auto trn1 = arch::load_chip("trn1");
  expect_error(trn1, single(trn1, d), {"dge=hw", "trn1", "has no hardware DGE"});
  d.engine = Engine::gpsimd;
  expect_error(trn3(), single(trn3(), d), {"triggered by the Scalar or Sync engine, not gpsimd"});
  auto g = ins(Engine::sync, Opcode::dma_gather,
               {sbuf(0, 128, 0, 8), hbm(0, 128, 8), sbuf(0, 128, 64, 1, DType::int32)});
  g.hwdge = true;
  expect_error(trn3(), single(trn3(), g),
               {"applies to dma_copy and dma_transpose, not dma_gather"});
}

TEST(Rules, DoubleRow) {
  auto ls = ins(Engine::tensor, Opcode::load_stationary, {sbuf(0, 128, 0, 256, DType::bf16)});
  ls.perf = isa::PerfMode::double_row;
  expect_error(trn3(), single(trn3(), ls), {"double-row matmul takes FP8 operands, got bfloat16"});
  const auto trn1 = arch::load_chip("trn1");
  ls.operands = {sbuf(0, 128, 0, 256, DType::fp8_e5m2)};
  expect_error(trn1, single(trn1, ls),
               {"double-row matmul needs NeuronCore-v3 or later; trn1 is NeuronCore-v2"});
  isa::Program p = program(trn3());
  add(p, ls);
  add(p, ins(Engine::tensor, Opcode::multiply_moving,
             {psum(0, 128, 0, 512), sbuf(0, 128, 4096, 512, DType::fp8_e5m2)}));
  expect_error(trn3(), p, {"a normal multiply after a double-row weight load"}, sim::Mode::timing);
}

TEST(Rules, LogicalCores) {
  isa::Program p = program(trn3());
  p.lnc = 2;  // one physical core cannot pair up
  expect_error(trn3(), p, {"LNC=2 groups physical cores in pairs, but the program has 1 cores"});
  const auto trn1 = arch::load_chip("trn1");
  isa::Program q = program(trn1);
  q.cores.resize(2);
  q.lnc = 2;
  expect_error(trn1, q, {"LNC=2 needs NeuronCore-v3 or later; trn1 is NeuronCore-v2"});
}

TEST(Rules, BuilderAllocations) {
  kernel::Builder b(trn3());
  b.sbuf(128, 60000, DType::fp32);  // 240,000 of 262,144 bytes per partition
  try {
    b.sbuf(128, 10000, DType::fp32);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("sbuf allocation of 40000 bytes per partition does not fit"),
        std::string::npos)
        << e.what();
  }
  kernel::Builder c(trn3());
  c.sbuf_at(0, 128, 256, DType::fp32);
  try {
    c.sbuf_at(512, 128, 256, DType::fp32);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("overlaps the live allocation [0, 1024)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tern
