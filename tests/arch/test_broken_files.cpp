// Broken hardware descriptions: each defect gives one clear error naming
// the file, the key and what was expected.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "arch/chip.h"
#include "arch/system.h"
#include "util/error.h"

namespace tern::arch {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class Broken : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tern_broken_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "systems");
    chip_text_ = read(fs::path(TERN_TEST_DATA_DIR) / "arch" / "trn3.toml");
    system_text_ =
        read(fs::path(TERN_TEST_DATA_DIR) / "arch" / "systems" / "trn3-ultraserver-gen2.toml");
    ASSERT_FALSE(chip_text_.empty());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The chip file with `from` replaced by `to`; the error must contain every needle.
  void expect_chip_error(const std::string& from, const std::string& to,
                         std::initializer_list<std::string> needles) {
    const auto pos = chip_text_.find(from);
    ASSERT_NE(pos, std::string::npos) << from;
    std::string text = chip_text_;
    text.replace(pos, from.size(), to);
    const fs::path file = dir_ / "broken.toml";
    std::ofstream(file) << text;
    try {
      load_chip_file(file);
      ADD_FAILURE() << "no error for " << from << " -> " << to;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
      for (const auto& n : needles)
        EXPECT_NE(msg.find(n), std::string::npos) << msg << "\nmissing: " << n;
    }
  }

  fs::path dir_;
  std::string chip_text_, system_text_;
};

TEST_F(Broken, MissingKey) {
  expect_chip_error("cores = 8 ", "# cores removed ",
                    {"'chip.cores'", "expected an integer", "missing"});
}

TEST_F(Broken, WrongType) {
  expect_chip_error("capacity_gib = 144", "capacity_gib = \"lots\"",
                    {"'hbm.capacity_gib'", "expected a number > 0", "string \"lots\""});
  expect_chip_error("[sbuf]", "sbuf = 5\n[old_sbuf]", {"unknown key 'old_sbuf'"});
}

TEST_F(Broken, ImpossibleValues) {
  expect_chip_error("cores = 8 ", "cores = 0 ", {"'chip.cores'", "[1, 4096]", "integer 0"});
  expect_chip_error("clock_ghz = 2.4", "clock_ghz = -2.4", {"'tensor.clock_ghz'", "> 0"});
  expect_chip_error("banks = 8", "banks = 3", {"'psum.banks'", "do not divide"});
  expect_chip_error("[psum]\npartitions = 128", "[psum]\npartitions = 64", {"'psum.partitions'"});
  expect_chip_error("rows = 128", "rows = 256", {"'tensor.rows'", "[1, 128]"});
}

TEST_F(Broken, PerformanceModeKeys) {
  expect_chip_error("perf_mode_dtypes = [", "perf_mode_dtypes = \"bf16\" #[",
                    {"'costs.perf_mode_dtypes'", "a list of data type names"});
  expect_chip_error("vector_perf_shares_gpsimd_bus = true", "vector_perf_shares_gpsimd_bus = 1",
                    {"'costs.vector_perf_shares_gpsimd_bus'", "true or false"});
  expect_chip_error("vector_perf_copy_speedup = 4", "vector_perf_copy_speedup = 0",
                    {"'costs.vector_perf_copy_speedup'", "[1, 64]"});
}

TEST_F(Broken, TypoInKeyName) {
  expect_chip_error("capacity_gib", "capacty_gib",
                    {"unknown key 'hbm.capacty_gib'", "capacity_gib"});
  expect_chip_error("mxfp8 = 4.0", "mxfp9 = 4.0", {"unknown key 'tensor.rate.mxfp9'"});
}

TEST_F(Broken, SyntaxError) {
  expect_chip_error("cores = 8 ", "cores = = 8 ", {"TOML syntax error"});
}

TEST_F(Broken, MissingFile) {
  EXPECT_THROW(load_chip_file(dir_ / "nope.toml"), Error);
  EXPECT_THROW(load_system("no-such-system"), Error);
}

TEST_F(Broken, SystemFabricMustHoldTheChips) {
  std::string text = system_text_;
  text.replace(text.find("size = 36"), 9, "size = 35");
  const fs::path file = dir_ / "systems" / "sys.toml";
  std::ofstream(dir_ / "trn3.toml") << chip_text_;
  std::ofstream(file) << text;
  try {
    load_system_file(file);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hold 140 chips but system.chips is 144"),
              std::string::npos)
        << e.what();
  }
  text = system_text_;
  text.replace(text.find("topology = \"switched\""), 21, "topology = \"mesh\"");
  std::ofstream(file) << text;
  try {
    load_system_file(file);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fabric[0].topology'"), std::string::npos) << e.what();
  }
  text = system_text_;
  text.replace(text.find("bandwidth_counts = \"bidirectional\""), 34,
               "bandwidth_counts = \"both\"");
  std::ofstream(file) << text;
  try {
    load_system_file(file);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fabric[0].bandwidth_counts'"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tern::arch
