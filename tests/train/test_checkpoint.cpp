// Checkpoint files and train configs: the round trip, and every way a file
// or a setting can be wrong, rejected with a message naming it.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "train/checkpoint.h"
#include "train/config.h"
#include "util/error.h"
#include "util/file.h"

namespace tern::train {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("tern_ckpt_" + name + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

Checkpoint sample(std::int64_t step) {
  Checkpoint c;
  c.meta = {{"step", step}, {"note", "x"}};
  c.tensors["a"] = {1.0f, -2.5f, std::nanf(""), 3e38f};
  c.tensors["b"] = std::vector<float>(1000, 0.25f);
  return c;
}

std::string error_of(const fs::path& f) {
  try {
    load_checkpoint(f);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Checkpoint, RoundTripIsExact) {
  const fs::path d = fresh_dir("rt");
  save_checkpoint(checkpoint_path(d, 7), sample(7));
  const Checkpoint c = load_checkpoint(d / "step-00000007.ckpt");
  EXPECT_EQ(c.meta.at("step"), 7);
  ASSERT_EQ(c.tensors.size(), 2u);
  const auto& a = c.tensors.at("a");
  EXPECT_EQ(a[0], 1.0f);
  EXPECT_EQ(a[1], -2.5f);
  EXPECT_TRUE(std::isnan(a[2]));
  EXPECT_EQ(a[3], 3e38f);
  EXPECT_EQ(c.tensors.at("b"), std::vector<float>(1000, 0.25f));
  fs::remove_all(d);
}

TEST(Checkpoint, CorruptFilesAreRejectedAndTheOlderOneIsUsed) {
  const fs::path d = fresh_dir("bad");
  for (int s : {2, 4, 6}) save_checkpoint(checkpoint_path(d, s), sample(s));
  const std::string whole = read_file(checkpoint_path(d, 6));
  // Truncated (a crash while copying, a full disk).
  write_file_atomic(checkpoint_path(d, 6), whole.substr(0, whole.size() - 100));
  EXPECT_NE(error_of(checkpoint_path(d, 6)).find("truncated"), std::string::npos)
      << error_of(checkpoint_path(d, 6));
  // One flipped bit in the payload.
  std::string flipped = whole;
  flipped[whole.size() - 50] ^= 0x10;
  write_file_atomic(checkpoint_path(d, 4), flipped);
  EXPECT_NE(error_of(checkpoint_path(d, 4)).find("checksum"), std::string::npos);
  // Not a checkpoint at all.
  write_file_atomic(d / "other.ckpt", "hello");
  EXPECT_NE(error_of(d / "other.ckpt").find("not a tern checkpoint"), std::string::npos);
  std::vector<std::string> notes;
  const auto good = latest_good(d, notes);
  ASSERT_TRUE(good);
  EXPECT_EQ(good->first, checkpoint_path(d, 2));
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_NE(notes[0].find("step-00000006.ckpt"), std::string::npos) << notes[0];
  EXPECT_NE(notes[1].find("step-00000004.ckpt"), std::string::npos) << notes[1];
  fs::remove_all(d);
}

TEST(Checkpoint, PruneKeepsTheNewest) {
  const fs::path d = fresh_dir("prune");
  for (int s : {10, 2, 30, 4}) save_checkpoint(checkpoint_path(d, s), sample(s));
  prune_checkpoints(d, 2);
  const auto left = list_checkpoints(d);
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0], checkpoint_path(d, 10));
  EXPECT_EQ(left[1], checkpoint_path(d, 30));
  EXPECT_TRUE(list_checkpoints(d / "none").empty());
  fs::remove_all(d);
}

TEST(TrainConfig, FaultSpecs) {
  Fault f = parse_fault("nan@12:h.0.mlp.c_fc.w");
  EXPECT_EQ(f.kind, Fault::Kind::nan);
  EXPECT_EQ(f.step, 12);
  EXPECT_EQ(f.param, "h.0.mlp.c_fc.w");
  f = parse_fault("fail@3x2");
  EXPECT_EQ(f.kind, Fault::Kind::fail);
  EXPECT_EQ(f.count, 2);
  f = parse_fault("kill@5");
  EXPECT_EQ(f.kind, Fault::Kind::kill);
  for (const char* bad : {"nan", "boom@3", "kill@0", "fail@3x", "nan@x"})
    EXPECT_THROW(parse_fault(bad), Error) << bad;
}

TEST(TrainConfig, TomlFileAndJsonRoundTrip) {
  const fs::path d = fresh_dir("cfg");
  write_file_atomic(d / "ok.toml",
                    "model = \"llama\"\nlayers = 3\nlr = 2e-3\nkv_heads = 1\nfaults = "
                    "[\"nan@4\"]\nstochastic_rounding = true\n");
  TrainConfig c;
  load_config_file(c, (d / "ok.toml").string());
  EXPECT_EQ(c.model, "llama");
  EXPECT_EQ(c.layers, 3);
  EXPECT_DOUBLE_EQ(c.lr, 2e-3);
  EXPECT_TRUE(c.stochastic_rounding);
  ASSERT_EQ(c.faults.size(), 1u);
  EXPECT_EQ(c.faults[0].step, 4);
  EXPECT_EQ(c.dim, TrainConfig{}.dim);  // untouched keys keep their defaults
  const TrainConfig back = config_from_json(to_json(c));
  EXPECT_EQ(to_json(back), to_json(c));

  auto error_for = [&](const std::string& text) {
    write_file_atomic(d / "bad.toml", text);
    TrainConfig x;
    try {
      load_config_file(x, (d / "bad.toml").string());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_for("layerz = 2\n").find("unknown key 'layerz'"), std::string::npos);
  EXPECT_NE(error_for("layers = \"two\"\n").find("'layers' must be a number"), std::string::npos)
      << error_for("layers = \"two\"\n");
  EXPECT_NE(error_for("layers = 2.5\n").find("'layers'"), std::string::npos);
  EXPECT_NE(error_for("layers = \n").find("bad.toml:1"), std::string::npos);
  fs::remove_all(d);
}

TEST(TrainConfig, ValidationNamesTheField) {
  auto error_of_config = [](auto change) {
    TrainConfig c;
    change(c);
    try {
      validate(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error_of_config([](TrainConfig&) {}), "");
  EXPECT_NE(error_of_config([](TrainConfig& c) { c.model = "bert"; }).find("model 'bert'"),
            std::string::npos);
  EXPECT_NE(error_of_config([](TrainConfig& c) { c.heads = 3; }).find("head dim"),
            std::string::npos);
  EXPECT_NE(error_of_config([](TrainConfig& c) { c.nan_policy = "pray"; }).find("nan_policy"),
            std::string::npos);
  EXPECT_NE(
      error_of_config([](TrainConfig& c) { c.nan_policy = "rollback"; }).find("needs checkpoints"),
      std::string::npos);
  EXPECT_NE(error_of_config([](TrainConfig& c) { c.recipe = "fp4"; }).find("fp4"),
            std::string::npos);
  EXPECT_NE(error_of_config([](TrainConfig& c) { c.kv_heads = 2; }).find("Llama"),
            std::string::npos);
}

}  // namespace
}  // namespace tern::train
