#include "train/tokenizer.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "train/bpe.h"
#include "util/error.h"
#include "util/file.h"

namespace tern::train {

CharTokenizer::CharTokenizer(std::string chars) : chars_(std::move(chars)) {
  std::fill(std::begin(index_), std::end(index_), std::int16_t{-1});
  if (chars_.empty()) throw Error("char tokenizer: the vocabulary is empty");
  for (std::size_t i = 0; i < chars_.size(); ++i) {
    const auto b = static_cast<unsigned char>(chars_[i]);
    if (i > 0 && static_cast<unsigned char>(chars_[i - 1]) >= b)
      throw Error("char tokenizer: the vocabulary must be distinct bytes in increasing order");
    index_[b] = static_cast<std::int16_t>(i);
  }
}

CharTokenizer CharTokenizer::from_text(std::string_view text) {
  bool seen[256] = {};
  for (char c : text) seen[static_cast<unsigned char>(c)] = true;
  std::string chars;
  for (int b = 0; b < 256; ++b)
    if (seen[b]) chars.push_back(static_cast<char>(b));
  if (chars.empty()) throw Error("char tokenizer: the text is empty");
  return CharTokenizer(std::move(chars));
}

CharTokenizer CharTokenizer::from_json(std::string_view json, const std::string& source) {
  try {
    const nlohmann::json j = nlohmann::json::parse(json);
    if (j.at("kind").get<std::string>() != "char")
      throw Error(fmt::format("not a char tokenizer (kind '{}')", j.at("kind").get<std::string>()));
    const nlohmann::json& list = j.at("chars");
    if (!list.is_array()) throw Error("'chars' must be a list of bytes");
    std::string chars;
    for (const auto& b : list) {
      const int v = b.get<int>();
      if (v < 0 || v > 255) throw Error(fmt::format("byte {} out of range", v));
      chars.push_back(static_cast<char>(v));
    }
    if (j.contains("vocab") && j.at("vocab").get<std::size_t>() != chars.size())
      throw Error(fmt::format("'vocab' says {}, 'chars' has {}", j.at("vocab").get<std::size_t>(),
                              chars.size()));
    return CharTokenizer(std::move(chars));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not a tokenizer file: {}", source, e.what()));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", source, e.what()));
  }
}

std::vector<std::uint16_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<std::uint16_t> out(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (index_[b] < 0)
      throw Error(fmt::format("char tokenizer: byte {} at offset {} is not in the vocabulary of {}",
                              static_cast<int>(b), i, chars_.size()));
    out[i] = static_cast<std::uint16_t>(index_[b]);
  }
  return out;
}

std::string CharTokenizer::decode(std::span<const std::uint16_t> tokens) const {
  std::string s;
  s.reserve(tokens.size());
  for (std::uint16_t t : tokens) {
    if (t >= chars_.size())
      throw Error(
          fmt::format("char tokenizer: token {} is not below the vocabulary {}", t, chars_.size()));
    s.push_back(chars_[t]);
  }
  return s;
}

std::string CharTokenizer::to_json() const {
  nlohmann::json j;
  j["kind"] = "char";
  j["vocab"] = chars_.size();
  std::vector<int> bytes;
  for (char c : chars_) bytes.push_back(static_cast<unsigned char>(c));
  j["chars"] = bytes;
  return j.dump() + "\n";
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& json_file) {
  const std::string text = read_file(json_file);
  std::string kind;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
    kind = j.at("kind").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not a tokenizer description ({})", json_file.string(), e.what()));
  }
  if (kind == "char")
    return std::make_unique<CharTokenizer>(CharTokenizer::from_json(text, json_file.string()));
  if (kind == "gpt2-bpe") {
    const std::filesystem::path dir = json_file.parent_path();
    try {
      return std::make_unique<Gpt2Bpe>(Gpt2Bpe::from_files(
          dir / j.at("encoder").get<std::string>(), dir / j.at("merges").get<std::string>()));
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}: gpt2-bpe needs 'encoder' and 'merges' files ({})",
                              json_file.string(), e.what()));
    }
  }
  throw Error(fmt::format("{}: tokenizer kind '{}' is not one of char, gpt2-bpe",
                          json_file.string(), kind));
}

}  // namespace tern::train
