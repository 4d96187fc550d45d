// Character-level tokenizer (issue 7): the vocabulary is the sorted set of
// distinct bytes of a corpus (nanoGPT's char-level Shakespeare: 65 symbols),
// token i is the i-th byte of that set. Saved as JSON beside the shards.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tern::train {

class CharTokenizer {
 public:
  // The distinct bytes of `text`, sorted. Throws tern::Error for empty text.
  static CharTokenizer from_text(std::string_view text);
  // From a JSON text written by to_json ({"kind": "char", "chars": [...]}):
  // errors name `source`.
  static CharTokenizer from_json(std::string_view json, const std::string& source);
  explicit CharTokenizer(std::string chars);  // distinct bytes, sorted

  int vocab() const { return static_cast<int>(chars_.size()); }
  // Throws tern::Error naming the byte and its offset when a byte is not in
  // the vocabulary.
  std::vector<std::uint16_t> encode(std::string_view text) const;
  // Throws tern::Error for a token >= vocab().
  std::string decode(std::span<const std::uint16_t> tokens) const;
  std::string to_json() const;

 private:
  std::string chars_;
  std::int16_t index_[256];
};

}  // namespace tern::train
