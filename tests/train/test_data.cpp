// The trainer's data side: the char tokenizer, llm.c token shards (with the
// broken files a user can hand it) and the batch loader's deterministic,
// resumable order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include <unistd.h>

#include "train/loader.h"
#include "train/shard.h"
#include "train/tokenizer.h"
#include "util/error.h"
#include "util/file.h"

namespace tern::train {
namespace {

std::string message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(CharTokenizer, VocabularyEncodeDecodeJson) {
  const CharTokenizer t = CharTokenizer::from_text("hello, world\n");
  EXPECT_EQ(t.vocab(), 10);  // \n, space, ',', d, e, h, l, o, r, w in byte order
  const auto ids = t.encode("hello");
  EXPECT_EQ(ids, (std::vector<std::uint16_t>{5, 4, 6, 6, 7}));
  EXPECT_EQ(t.decode(ids), "hello");
  const CharTokenizer u = CharTokenizer::from_json(t.to_json(), "t.json");
  EXPECT_EQ(u.encode("world"), t.encode("world"));
  EXPECT_NE(message([&] { t.encode("hex"); }).find("byte 120 at offset 2 is not in the vocabulary"),
            std::string::npos);
  const std::vector<std::uint16_t> bad{10};
  EXPECT_NE(message([&] { t.decode(bad); }).find("token 10 is not below the vocabulary 10"),
            std::string::npos);
  EXPECT_NE(message([] { CharTokenizer::from_json("{\"kind\": 3}", "x.json"); }).find("x.json"),
            std::string::npos);
  EXPECT_NE(message([] {
              CharTokenizer::from_json(R"({"kind": "char", "chars": 65})", "y.json");
            }).find("y.json: 'chars' must be a list"),
            std::string::npos);
  EXPECT_NE(message([] {
              CharTokenizer::from_json(R"({"kind": "char", "vocab": 3, "chars": [97, 98]})",
                                       "z.json");
            }).find("z.json: 'vocab' says 3, 'chars' has 2"),
            std::string::npos);
  EXPECT_NE(message([] {
              CharTokenizer::from_json(R"({"kind": "char", "chars": [98, 97]})", "w.json");
            }).find("w.json: char tokenizer"),
            std::string::npos);
  EXPECT_THROW(CharTokenizer::from_text(""), Error);
  EXPECT_THROW(CharTokenizer("ba"), Error);  // not increasing
}

class Shards : public ::testing::Test {
 protected:
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tern_shards_" + std::to_string(::getpid()));
  void SetUp() override { std::filesystem::create_directories(dir); }
  void TearDown() override { std::filesystem::remove_all(dir); }
};

TEST_F(Shards, RoundTripAndTheLlmcHeader) {
  std::vector<std::uint16_t> t(70000);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::uint16_t>(i * 7);
  write_shard(dir / "a.bin", t);
  EXPECT_EQ(read_shard(dir / "a.bin"), t);
  const std::string bytes = read_file(dir / "a.bin");
  ASSERT_EQ(bytes.size(), 1024 + 2 * t.size());
  std::int32_t h[3];
  std::memcpy(h, bytes.data(), sizeof h);
  EXPECT_EQ(h[0], 20240520);
  EXPECT_EQ(h[1], 1);
  EXPECT_EQ(h[2], 70000);
  write_shard(dir / "empty.bin", {});
  EXPECT_TRUE(read_shard(dir / "empty.bin").empty());
}

TEST_F(Shards, BrokenFilesNameThemselves) {
  const std::vector<std::uint16_t> t{1, 2, 3};
  write_shard(dir / "ok.bin", t);
  std::string bytes = read_file(dir / "ok.bin");
  write_file_atomic(dir / "short.bin", bytes.substr(0, 100));
  EXPECT_NE(message([&] { read_shard(dir / "short.bin"); }).find("shorter than a shard header"),
            std::string::npos);
  write_file_atomic(dir / "cut.bin", bytes.substr(0, bytes.size() - 1));
  EXPECT_NE(message([&] {
              read_shard(dir / "cut.bin");
            }).find("cut.bin: the header says 3 tokens (1030 bytes), the file has 1029"),
            std::string::npos);
  std::string magic = bytes;
  magic[0] = 7;
  write_file_atomic(dir / "magic.bin", magic);
  EXPECT_NE(message([&] { read_shard(dir / "magic.bin"); }).find("not a token shard"),
            std::string::npos);
  std::string v2 = bytes;
  v2[4] = 2;
  write_file_atomic(dir / "v2.bin", v2);
  EXPECT_THROW(read_shard(dir / "v2.bin"), NotSupported);
  EXPECT_NE(message([&] { read_shard(dir / "none.bin"); }).find("cannot read"), std::string::npos);
}

std::vector<std::uint16_t> ramp(std::size_t n) {
  std::vector<std::uint16_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::uint16_t>(i);
  return t;
}

TEST(BatchLoader, WindowsTargetsAndEpochs) {
  // 41 tokens, seq 4: windows start at 0, 4, ..., 36 (10 windows; the last
  // needs token 40 as its final target).
  BatchLoader l(ramp(41), 3, 4, 7, /*shuffle=*/false);
  EXPECT_EQ(l.windows(), 10);
  const Batch b = l.next();
  EXPECT_EQ(b.ids, (std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(b.targets[0], 1);
  EXPECT_EQ(b.targets[11], 12);
  // Shuffled: every window once per epoch, a batch may cross into the next.
  BatchLoader s(ramp(41), 3, 4, 7);
  std::multiset<std::int32_t> starts;
  for (int i = 0; i < 4; ++i) {  // 12 windows: one epoch and 2 of the next
    const Batch x = s.next();
    for (int r = 0; r < 3; ++r) starts.insert(x.ids[static_cast<std::size_t>(r * 4)]);
  }
  for (std::int32_t w = 0; w < 40; w += 4) EXPECT_GE(starts.count(w), 1u) << w;
  EXPECT_EQ(s.state().epoch, 1);
  EXPECT_EQ(s.state().next, 2);
  EXPECT_THROW(BatchLoader(ramp(8), 3, 4, 0), Error);  // one window
}

TEST(BatchLoader, RestoringThePositionRepeatsTheBatches) {
  BatchLoader a(ramp(1000), 4, 16, 42);
  for (int i = 0; i < 20; ++i) a.next();  // into epoch 1 (62 windows)
  const LoaderState at = a.state();
  std::vector<Batch> want;
  for (int i = 0; i < 30; ++i) want.push_back(a.next());
  BatchLoader b(ramp(1000), 4, 16, 42);
  b.restore(at);
  for (int i = 0; i < 30; ++i) EXPECT_EQ(b.next().ids, want[static_cast<std::size_t>(i)].ids) << i;
  BatchLoader other(ramp(1000), 4, 16, 43);
  EXPECT_THROW(other.restore(at), Error);  // another seed
  BatchLoader ordered(ramp(1000), 4, 16, 42, /*shuffle=*/false);
  EXPECT_THROW(ordered.restore(at), Error);  // another order
  BatchLoader longer(ramp(2000), 4, 16, 42);
  EXPECT_THROW(longer.restore(at), Error);  // other data
  LoaderState past = at;
  past.next = 1000;
  EXPECT_THROW(b.restore(past), Error);
}

// The order is tern's own (not std::shuffle's), the same on every platform:
// pinned here.
TEST(BatchLoader, ShuffledOrderIsPinned) {
  EXPECT_EQ(shuffled_order(8, 1, 0), shuffled_order(8, 1, 0));
  EXPECT_NE(shuffled_order(8, 1, 0), shuffled_order(8, 1, 1));
  auto v = shuffled_order(1000, 5, 3);
  std::sort(v.begin(), v.end());
  for (std::int64_t i = 0; i < 1000; ++i) ASSERT_EQ(v[static_cast<std::size_t>(i)], i);
  EXPECT_EQ(shuffled_order(8, 1, 0), (std::vector<std::int64_t>{6, 1, 0, 7, 3, 2, 5, 4}));
}

}  // namespace
}  // namespace tern::train
