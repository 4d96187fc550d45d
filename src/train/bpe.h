// GPT-2's byte-level BPE tokenizer (Radford et al. 2019; the reference is
// OpenAI's encoder.py, which the npm package gpt-3-encoder ports): text is
// split by GPT-2's pre-tokenizer pattern (contractions, letters, digits,
// other symbols, whitespace; Unicode classes through ICU's regex), each
// piece's UTF-8 bytes are mapped to printable code points (bytes_to_unicode),
// merged pair by pair in the order of vocab.bpe, and looked up in
// encoder.json. Decoding maps back to the bytes. Any vocabulary and merge
// list in those two formats works (GPT-2's own: 50,257 tokens, 50,000
// merges).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "train/tokenizer.h"

namespace tern::train {

class Gpt2Bpe : public Tokenizer {
 public:
  // encoder: token string (in bytes_to_unicode's alphabet, UTF-8) -> id;
  // merges: pairs in priority order. Throws tern::Error for ids past
  // 65535 (tokens are uint16, as llm.c's shards) or duplicated ids.
  Gpt2Bpe(std::map<std::string, int> encoder,
          std::vector<std::pair<std::string, std::string>> merges);
  // From GPT-2's files (encoder.json, vocab.bpe); errors name the file and line.
  static Gpt2Bpe from_files(const std::filesystem::path& encoder_json,
                            const std::filesystem::path& vocab_bpe);

  int vocab() const override { return static_cast<int>(decoder_.size()); }
  // Throws naming a piece that has no token (a vocabulary without every
  // byte) or text that is not UTF-8.
  std::vector<std::uint16_t> encode(std::string_view text) const override;
  std::string decode(std::span<const std::uint16_t> tokens) const override;
  std::string kind() const override { return "gpt2-bpe"; }
  // The text pieces of GPT-2's pre-tokenizer, in order (tests).
  static std::vector<std::string> pretokenize(std::string_view text);

 private:
  std::vector<std::string> bpe(const std::string& piece) const;  // mapped piece -> tokens
  std::map<std::string, int> encoder_;
  std::vector<std::string> decoder_;  // id -> token string
  std::map<std::pair<std::string, std::string>, int> ranks_;
};

// The code point GPT-2 maps byte b to (bytes_to_unicode), as UTF-8.
std::string byte_to_unicode(std::uint8_t b);

}  // namespace tern::train
