// Character-level tokenizer: the vocabulary is the sorted set of
// distinct bytes of a corpus (nanoGPT's char-level Shakespeare: 65 symbols),
// token i is the i-th byte of that set. Saved as JSON beside the shards.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tern::train {

// What the trainer and the data tools need of a tokenizer.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual int vocab() const = 0;
  // Throws tern::Error naming what cannot be encoded or decoded.
  virtual std::vector<std::uint16_t> encode(std::string_view text) const = 0;
  virtual std::string decode(std::span<const std::uint16_t> tokens) const = 0;
  virtual std::string kind() const = 0;  // "char", "gpt2-bpe"
};

class CharTokenizer : public Tokenizer {
 public:
  // The distinct bytes of `text`, sorted. Throws tern::Error for empty text.
  static CharTokenizer from_text(std::string_view text);
  // From a JSON text written by to_json ({"kind": "char", "chars": [...]}):
  // errors name `source`.
  static CharTokenizer from_json(std::string_view json, const std::string& source);
  explicit CharTokenizer(std::string chars);  // distinct bytes, sorted

  int vocab() const override { return static_cast<int>(chars_.size()); }
  // Throws tern::Error naming the byte and its offset when a byte is not in
  // the vocabulary.
  std::vector<std::uint16_t> encode(std::string_view text) const override;
  // Throws tern::Error for a token >= vocab().
  std::string decode(std::span<const std::uint16_t> tokens) const override;
  std::string kind() const override { return "char"; }
  std::string to_json() const;

 private:
  std::string chars_;
  std::int16_t index_[256];
};

// The tokenizer a data directory's tokenizer.json describes: {"kind":
// "char", "chars": [...]} or {"kind": "gpt2-bpe", "encoder": FILE,
// "merges": FILE} (paths relative to the JSON file). Errors name the file.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& json_file);

}  // namespace tern::train
