// Programs as artifacts: text -> program -> text round-trips, the binary
// format round-trips, and damaged files are refused with a reason.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "arch/chip.h"
#include "isa/program.h"
#include "kernel/kernels.h"
#include "util/error.h"

namespace tern {
namespace {

isa::Program sample() {
  const auto chip = arch::load_chip("trn3");
  isa::Program p =
      kernel::matmul_kernel(chip, {130, 520, 200, isa::DType::bf16, isa::DType::fp32, 2});
  // Exercise every field of the text form.
  isa::Instruction in;
  in.op = isa::Opcode::activation;
  in.engine = isa::Engine::scalar;
  in.operands = p.cores[0].streams[2].empty() ? p.cores[0].streams[1][0].operands
                                              : p.cores[0].streams[2][0].operands;
  in.func = isa::ActFunc::gelu_tanh;
  in.scale = -0.125f;
  in.imm0 = -0.0f;
  in.imm1 = 3.4028235e38f;
  in.alu0 = isa::AluOp::abs_max;
  in.alu1 = isa::AluOp::is_ge;
  in.accumulate = true;
  in.negate = true;
  in.col0 = true;
  in.col1 = true;
  in.queue = 3;
  in.priority = 1;
  in.hwdge = true;
  in.waits = {{4, 7}, {1, 2}};
  in.signals = {2};
  in.loc = "my kernel.py:12";
  p.cores[1].streams[2].push_back(in);
  p.lnc = 2;
  return p;
}

TEST(Program, TextRoundTrips) {
  const isa::Program p = sample();
  const std::string text = isa::to_text(p);
  const isa::Program q = isa::parse_program_text(text);
  EXPECT_EQ(q, p);
  EXPECT_EQ(isa::to_text(q), text);
}

TEST(Program, BinaryRoundTrips) {
  const isa::Program p = sample();
  EXPECT_EQ(isa::parse_program_binary(isa::to_binary(p)), p);
}

TEST(Program, HardwareDgeFlagIsTextAndBinary) {
  // Format version 4 carries dge=hw; a version-3 text without it loads as
  // descriptors built before the run.
  const isa::Program p = sample();
  const std::string text = isa::to_text(p);
  EXPECT_EQ(text.rfind("tern-program 4\n", 0), 0u);
  EXPECT_NE(text.find(" dge=hw"), std::string::npos);
  EXPECT_TRUE(isa::parse_program_binary(isa::to_binary(p)).cores[1].streams[2].back().hwdge);
  std::string v3 = text;
  v3.replace(0, 14, "tern-program 3");
  const std::size_t at = v3.find(" dge=hw");
  v3.erase(at, 7);
  EXPECT_FALSE(isa::parse_program_text(v3).cores[1].streams[2].back().hwdge);
}

TEST(Program, FilesSaveAtomicallyAndLoadEitherForm) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("tern_prog_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const isa::Program p = sample();
  isa::save_program(p, dir / "k.tern");
  isa::save_program(p, dir / "k.txt");
  EXPECT_EQ(isa::load_program(dir / "k.tern"), p);
  EXPECT_EQ(isa::load_program(dir / "k.txt"), p);
  std::size_t files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 2u);  // no temporaries left behind
  std::filesystem::remove_all(dir);
}

TEST(Program, DamagedBinaryIsRefused) {
  auto bytes = isa::to_binary(sample());
  auto flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x40;
  EXPECT_THROW(isa::parse_program_binary(flipped), Error);
  try {
    isa::parse_program_binary(flipped);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos);
  }
  auto truncated = bytes;
  truncated.resize(bytes.size() - 10);
  EXPECT_THROW(isa::parse_program_binary(truncated), Error);
  auto version = bytes;
  version[8] = 99;
  try {
    isa::parse_program_binary(version);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("program file version 99"), std::string::npos);
  }
  EXPECT_THROW(isa::parse_program_binary({1, 2, 3}), Error);
}

TEST(Program, TextErrorsNameTheLine) {
  try {
    isa::parse_program_text(
        "tern-program 1\narch trn3\nsemaphores 20\ncore 0\n  vector frobnicate (sbuf[0:128]+0 "
        "[[1,8]] float32)\n");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 5: unknown opcode 'frobnicate'"), std::string::npos)
        << e.what();
  }
  try {
    isa::parse_program_text(
        "tern-program 1\ncore 0\n  vector memset (sbuf[0:128]+0 [[1,8] float32)\n");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 3: malformed operand"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(isa::parse_program_text("hello\n"), Error);
}

}  // namespace
}  // namespace tern
