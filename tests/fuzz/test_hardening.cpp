// One regression test for each class of bad input that once crashed,
// hung, escaped as an internal error or was silently accepted: each must
// now be a tern::Error whose message says what was wrong.
#include <unistd.h>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include "arch/chip.h"
#include "arch/system.h"
#include "common/expect_error.h"
#include "fabric/network.h"
#include "fixtures.h"
#include "graph/models.h"
#include "isa/program.h"
#include "kernel/registry.h"
#include "plan/estimate.h"
#include "plan/request.h"
#include "sim/simulator.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/file.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

using fuzz::trn3;
using tern::test_util::expect_error;
isa::Program matmul128() {
  return fuzz::small_matmul(128, 128, 128);
}

void load(const isa::Program& p) {
  sim::Simulator s(trn3());
  s.load(p);
}

TEST(Hardening, OperandOffsetsThatWouldOverflowAreRefused) {
  // The text parser refuses numbers beyond int64 (it used to saturate).
  std::string t = isa::to_text(matmul128());
  const std::size_t at = t.find("sbuf[0:128]+");
  ASSERT_NE(at, std::string::npos);
  t.insert(at + 12, "99999999999999999999999");
  expect_error([&] { (void)isa::parse_program_text(t); }, "outside the 64-bit range");
  // An offset near INT64_MAX (binary or text) fails the bounds check
  // instead of wrapping past it.
  isa::Program p = matmul128();
  for (auto& in : p.cores[0].streams[static_cast<int>(isa::Engine::sync)])
    for (auto& ap : in.operands)
      if (ap.mem == isa::Mem::hbm) ap.offset = INT64_MAX - 100;
  expect_error([&] { load(isa::parse_program_binary(isa::to_binary(p))); }, "HBM bytes");
}

TEST(Hardening, DeclarationsOutsideTheChipAreRefused) {
  isa::Program p = matmul128();
  p.tensors[0].shape = {1 << 20, 1 << 20};  // 4 TiB of fp32
  p.tensors[0].dtype = isa::DType::fp32;
  expect_error([&] { load(p); }, "bytes of HBM");
  p = matmul128();
  p.tensors[0].shape[0] = -128;
  expect_error([&] { load(p); }, "a dim of -128");
  p = matmul128();
  p.semaphores = INT32_MAX;
  expect_error([&] { load(p); }, "semaphores");
  // A kernel whose tensors cannot fit in HBM is refused before it is built.
  expect_error(
      [] {
        (void)kernel::build_kernel(trn3(), "matmul",
                                   {{"m", "99999999999"}, {"n", "128"}, {"k", "128"}});
      },
      "does not fit");
}

TEST(Hardening, TheTensorEngineMultipliesFloats) {
  isa::Program p = matmul128();
  for (auto& in : p.cores[0].streams[static_cast<int>(isa::Engine::tensor)])
    for (auto& ap : in.operands)
      if (ap.mem == isa::Mem::sbuf) ap.dtype = isa::DType::int32;
  expect_error([&] { load(p); }, "float operands");
}

// A checkpoint file with the header `h` (JSON) over `payload` floats,
// its CRC valid.
std::string checkpoint_bytes(const std::string& h, std::size_t payload) {
  std::string s = "TERNCKPT";
  const std::uint32_t version = 1;
  const std::uint64_t hlen = h.size();
  s.append(reinterpret_cast<const char*>(&version), 4);
  s.append(reinterpret_cast<const char*>(&hlen), 8);
  s += h + std::string(payload * 4, '\0');
  const auto c = static_cast<std::uint32_t>(
      ::crc32(0L, reinterpret_cast<const Bytef*>(s.data()), static_cast<uInt>(s.size())));
  return s.append(reinterpret_cast<const char*>(&c), 4);
}

TEST(Hardening, CheckpointTablesAreCheckedAfterTheirChecksum) {
  const fs::path f = fs::temp_directory_path() / fmt::format("tern_hard_{}.ckpt", ::getpid());
  auto load_with = [&](const std::string& table) {
    write_file_atomic(f, checkpoint_bytes(R"({"meta":{},"tensors":)" + table + "}", 16));
    (void)train::load_checkpoint(f);
  };
  expect_error([&] { load_with(R"([{"name":"w","count":16,"offset":-64}])"); },
               "non-negative integers");
  expect_error([&] { load_with(R"([{"name":"w","count":16,"offset":4}])"); }, "outside");
  expect_error([&] { load_with(R"([{"count":16,"offset":0}])"); }, "bad tensor table");
  expect_error([&] { load_with(R"([{"name":7,"count":16,"offset":0}])"); }, "a name (text)");
  expect_error([&] { load_with(R"([{"name":"w","count":4611686018427387904,"offset":0}])"); },
               "more than the file holds");
  fs::remove(f);
}

TEST(Hardening, ResumingAStateTernNeverWritesIsRefused) {
  train::TrainConfig c;
  c.text = TERN_DATA_DIR "/tinyshakespeare.txt";
  c.layers = 1, c.dim = 128, c.heads = 2, c.batch = 1, c.seq = 16, c.steps = 4;
  c.recipe = "fp32", c.cores = 1;
  const fs::path dir = fs::temp_directory_path() / fmt::format("tern_hard_{}", ::getpid());
  c.ckpt_dir = dir.string();
  fs::path file;
  {
    train::Trainer t(c);
    t.step();
    file = t.save_checkpoint();
  }
  train::Checkpoint ck = train::load_checkpoint(file);
  ck.meta["step"] = INT64_MIN;
  train::save_checkpoint(file, ck);
  c.resume = file.string();
  expect_error([&] { train::Trainer t(c); }, "not a state tern writes");
  // A killed writer's temporary is removed at the next write.
  const fs::path stale = dir / "step-00000009.ckpt.tmp999999999";
  write_file_atomic(stale, "partial");
  c.resume.clear();
  train::save_checkpoint(dir / "step-00000010.ckpt", ck);
  EXPECT_FALSE(fs::exists(stale));
  fs::remove_all(dir);
}

TEST(Hardening, ModelAndTrainingSizesAreBounded) {
  graph::Gpt2Config g;
  g.heads = 0;
  expect_error([&] { (void)graph::gpt2(g); }, "heads 0");
  g = {};
  g.layers = 100000000;
  expect_error([&] { (void)graph::gpt2(g); }, "layers 100000000");
  train::TrainConfig c;
  c.lr = 1.0 / 0.0;
  expect_error([&] { train::validate(c); }, "lr must be a finite number");
  c = {};
  c.weight_decay = 0.0 / 0.0;
  expect_error([&] { train::validate(c); }, "weight_decay must be a finite number");
  expect_error([&] { train::load_config_file(c, fs::temp_directory_path().string()); },
               "not a file");
}

TEST(Hardening, PlannerBoundsAndMessages) {
  const arch::SystemSpec s = arch::load_system("trn3-ultraserver-gen2");
  try {
    (void)fabric::Network::of(s, INT32_MAX);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("try -"), std::string::npos) << e.what();
  }
  plan::Training t;
  t.tokens = 0.0 / 0.0;
  expect_error([&] { plan::Planner p(s, plan::load_model("llama3-8b"), t, 144); },
               "tokens must be a finite number");
  expect_error([&] { plan::Planner p(s, plan::load_model("llama3-8b"), {}, 2147483520); }, "chips");
}

TEST(Hardening, FilesThatAreNotFiles) {
  expect_error([] { (void)read_file(fs::temp_directory_path()); }, "is a folder");
  expect_error([] { (void)read_file("/dev/zero"); }, "not a regular file");
  expect_error([] { (void)isa::load_program(fs::temp_directory_path()); }, "is a folder");
  // A rename onto a folder reports the reason, not "Success".
  const fs::path d = fs::temp_directory_path() / fmt::format("tern_hard_dir_{}", ::getpid());
  fs::create_directories(d);
  expect_error([&] { write_file_atomic(d, "x"); }, "directory");
  const fs::path f = d / "a_file";
  write_file_atomic(f, "x");
  expect_error([&] { ensure_writable_dir(f, "--out"); }, "not a folder");
  fs::remove_all(d);
}

}  // namespace
}  // namespace tern
