// GPT-2's byte-level BPE on a small vocabulary built here (GPT-2's own files
// are not in Debian): the byte alphabet, the pre-tokenizer, the merge order,
// round trips of any UTF-8, and errors naming the file and line.
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "train/bpe.h"
#include "util/error.h"
#include "util/file.h"

namespace tern::train {
namespace {

// Every byte's token (ids 0..255: byte b is id b) and four merges.
Gpt2Bpe tiny() {
  std::map<std::string, int> enc;
  for (int b = 0; b < 256; ++b) enc[byte_to_unicode(static_cast<std::uint8_t>(b))] = b;
  enc["he"] = 256, enc["ll"] = 257, enc["hell"] = 258, enc["\u0120w"] = 259;
  return Gpt2Bpe(enc, {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"\u0120", "w"}});
}

TEST(Bpe, ByteAlphabetIsGpt2s) {
  EXPECT_EQ(byte_to_unicode(' '), "\u0120");   // Ġ
  EXPECT_EQ(byte_to_unicode('\n'), "\u010a");  // Ċ
  EXPECT_EQ(byte_to_unicode('a'), "a");
  EXPECT_EQ(byte_to_unicode(0xA1), "\u00a1");  // printable Latin-1 maps to itself
  EXPECT_EQ(byte_to_unicode(0xAD), "\u0143");  // soft hyphen: the last of the 68 remapped bytes
  EXPECT_EQ(byte_to_unicode(0x00), "\u0100");
}

TEST(Bpe, PretokenizerPieces) {
  using V = std::vector<std::string>;
  EXPECT_EQ(Gpt2Bpe::pretokenize("Hello world's 123 !!"),
            (V{"Hello", " world", "'s", " 123", " !!"}));
  // Whitespace before a word keeps one space for the word.
  EXPECT_EQ(Gpt2Bpe::pretokenize("Hello  world\n"), (V{"Hello", " ", " world", "\n"}));
  // Unicode letters and digits by class (ICU): é and ö are letters, ٣ a digit.
  EXPECT_EQ(Gpt2Bpe::pretokenize("héllo wörld ٣٣"), (V{"héllo", " wörld", " ٣٣"}));
  EXPECT_THROW(Gpt2Bpe::pretokenize("bad \xff byte"), Error);
}

TEST(Bpe, MergesInRankOrder) {
  const Gpt2Bpe t = tiny();
  EXPECT_EQ(t.vocab(), 260);
  using V = std::vector<std::uint16_t>;
  EXPECT_EQ(t.encode("hello"), (V{258, 'o'}));  // he, ll, then hell
  EXPECT_EQ(t.encode("hello world"), (V{258, 'o', 259, 'o', 'r', 'l', 'd'}));
  for (const std::string& s :
       std::vector<std::string>{"hello world", "héllo\twörld\n\n  x €", std::string("\0a", 2)})
    EXPECT_EQ(t.decode(t.encode(s)), s);
  EXPECT_THROW(t.decode(V{260}), Error);
}

TEST(Bpe, FilesAndTheirErrors) {
  const auto d = std::filesystem::temp_directory_path() / ("tern_bpe" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  nlohmann::json enc = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) enc[byte_to_unicode(static_cast<std::uint8_t>(b))] = b;
  enc["he"] = 256;
  write_file_atomic(d / "encoder.json", enc.dump());
  write_file_atomic(d / "vocab.bpe", "#version: 0.2\nh e\n");
  const Gpt2Bpe t = Gpt2Bpe::from_files(d / "encoder.json", d / "vocab.bpe");
  EXPECT_EQ(t.encode("he"), (std::vector<std::uint16_t>{256}));
  write_file_atomic(d / "tokenizer.json",
                    R"({"kind": "gpt2-bpe", "encoder": "encoder.json", "merges": "vocab.bpe"})");
  EXPECT_EQ(load_tokenizer(d / "tokenizer.json")->vocab(), 257);
  write_file_atomic(d / "vocab.bpe", "#version: 0.2\nh e\nbad\n");
  try {
    Gpt2Bpe::from_files(d / "encoder.json", d / "vocab.bpe");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab.bpe:3:"), std::string::npos) << e.what();
  }
  enc["x"] = 70000;
  write_file_atomic(d / "encoder.json", enc.dump());
  EXPECT_THROW(Gpt2Bpe::from_files(d / "encoder.json", d / "vocab.bpe"), Error);
  std::filesystem::remove_all(d);
}

}  // namespace
}  // namespace tern::train
