#include "train/bpe.h"

#include <algorithm>
#include <limits>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <unicode/regex.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>
#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/file.h"

namespace tern::train {

namespace {

// GPT-2's pre-tokenizer (encoder.py): contractions, optional space + letters,
// optional space + digits, optional space + other symbols, trailing
// whitespace, whitespace.
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string utf8(char32_t cp) {
  std::string s;
  icu::UnicodeString(static_cast<UChar32>(cp)).toUTF8String(s);
  return s;
}

// bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68
// to 256, 257, ... in byte order.
const std::vector<std::string>& byte_map() {
  static const std::vector<std::string> m = [] {
    std::vector<char32_t> cp(256, 0);
    std::vector<bool> direct(256, false);
    for (int b = '!'; b <= '~'; ++b) direct[static_cast<std::size_t>(b)] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[static_cast<std::size_t>(b)] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[static_cast<std::size_t>(b)] = true;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b)
      cp[static_cast<std::size_t>(b)] =
          direct[static_cast<std::size_t>(b)] ? static_cast<char32_t>(b) : next++;
    std::vector<std::string> out;
    for (char32_t c : cp) out.push_back(utf8(c));
    return out;
  }();
  return m;
}

// The code points of a UTF-8 string, each as its UTF-8 bytes.
std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  std::int32_t i = 0;
  const auto n = static_cast<std::int32_t>(s.size());
  while (i < n) {
    const std::int32_t start = i;
    UChar32 c;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wconversion"  // inside ICU's macro
    U8_NEXT(s.data(), i, n, c);
#pragma GCC diagnostic pop
    if (c < 0) throw Error("not UTF-8");
    out.push_back(s.substr(static_cast<std::size_t>(start), static_cast<std::size_t>(i - start)));
  }
  return out;
}

}  // namespace

std::string byte_to_unicode(std::uint8_t b) {
  return byte_map()[b];
}

Gpt2Bpe::Gpt2Bpe(std::map<std::string, int> encoder,
                 std::vector<std::pair<std::string, std::string>> merges)
    : encoder_(std::move(encoder)) {
  int top = -1;
  for (const auto& [tok, id] : encoder_) {
    if (id < 0 || id > std::numeric_limits<std::uint16_t>::max())
      throw Error(
          fmt::format("BPE vocabulary: id {} of '{}' is outside [0, 65535] (tokens are "
                      "uint16)",
                      id, tok));
    top = std::max(top, id);
  }
  decoder_.assign(static_cast<std::size_t>(top + 1), "");
  std::vector<bool> seen(decoder_.size(), false);
  for (const auto& [tok, id] : encoder_) {
    if (seen[static_cast<std::size_t>(id)])
      throw Error(fmt::format("BPE vocabulary: id {} is used twice", id));
    seen[static_cast<std::size_t>(id)] = true;
    decoder_[static_cast<std::size_t>(id)] = tok;
  }
  for (std::size_t i = 0; i < merges.size(); ++i)
    ranks_[std::move(merges[i])] = static_cast<int>(i);  // a repeated pair: the last rank, as
                                                         // encoder.py's dict(zip(...))
}

Gpt2Bpe Gpt2Bpe::from_files(const std::filesystem::path& encoder_json,
                            const std::filesystem::path& vocab_bpe) {
  std::map<std::string, int> enc;
  try {
    const nlohmann::json j = nlohmann::json::parse(read_file(encoder_json));
    for (const auto& [k, v] : j.items()) enc[k] = v.get<int>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not a BPE encoder (a JSON object token -> id): {}",
                            encoder_json.string(), e.what()));
  }
  std::vector<std::pair<std::string, std::string>> merges;
  const std::string text = read_file(vocab_bpe);
  std::size_t pos = 0, line = 0;
  while (pos < text.size()) {
    const std::size_t nl = text.find('\n', pos);
    std::string l = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    ++line;
    if (!l.empty() && l.back() == '\r') l.pop_back();
    if (l.empty() || (line == 1 && l.starts_with("#version"))) continue;
    const std::size_t sp = l.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 >= l.size() ||
        l.find(' ', sp + 1) != std::string::npos)
      throw Error(fmt::format("{}:{}: a merge is two tokens separated by one space, got '{}'",
                              vocab_bpe.string(), line, l));
    merges.emplace_back(l.substr(0, sp), l.substr(sp + 1));
  }
  return Gpt2Bpe(std::move(enc), std::move(merges));
}

std::vector<std::string> Gpt2Bpe::pretokenize(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  static const std::unique_ptr<icu::RegexPattern> pattern = [] {
    UErrorCode st = U_ZERO_ERROR;
    std::unique_ptr<icu::RegexPattern> p(
        icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(kPattern), 0, st));
    if (U_FAILURE(st))
      throw Error(fmt::format("BPE: ICU rejects the pattern: {}", u_errorName(st)));
    return p;
  }();
  if (text.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    throw Error(fmt::format("BPE: {} bytes of text in one piece (at most 2 GiB: ICU's limit)",
                            text.size()));
  // UTF-8 check without copies (ICU would replace bad bytes silently).
  for (std::int32_t i = 0, n = static_cast<std::int32_t>(text.size()); i < n;) {
    UChar32 c;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wconversion"  // inside ICU's macro
    U8_NEXT(text.data(), i, n, c);
#pragma GCC diagnostic pop
    if (c < 0) throw Error(fmt::format("BPE: the text is not UTF-8 (byte {})", i - 1));
  }
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(
      icu::StringPiece(text.data(), static_cast<std::int32_t>(text.size())));
  std::unique_ptr<icu::RegexMatcher> m(pattern->matcher(u, status));
  std::vector<std::string> out;
  while (m->find(status) && U_SUCCESS(status)) {
    std::string piece;
    m->group(status).toUTF8String(piece);
    out.push_back(std::move(piece));
  }
  if (U_FAILURE(status)) throw Error(fmt::format("BPE: ICU regex failed: {}", u_errorName(status)));
  return out;
}

std::vector<std::string> Gpt2Bpe::bpe(const std::string& piece) const {
  std::vector<std::string> word = code_points(piece);
  while (word.size() > 1) {
    // The adjacent pair of lowest rank.
    int best = std::numeric_limits<int>::max();
    std::size_t at = 0;
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      const auto it = ranks_.find({word[i], word[i + 1]});
      if (it != ranks_.end() && it->second < best) best = it->second, at = i;
    }
    if (best == std::numeric_limits<int>::max()) break;
    const std::string first = word[at], second = word[at + 1];
    // Merge every occurrence, left to right (encoder.py).
    std::vector<std::string> next;
    for (std::size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        next.push_back(first + second);
        i += 2;
      } else {
        next.push_back(word[i++]);
      }
    }
    word = std::move(next);
  }
  return word;
}

std::vector<std::uint16_t> Gpt2Bpe::encode(std::string_view text) const {
  std::vector<std::uint16_t> out;
  std::unordered_map<std::string, std::vector<std::uint16_t>> cache;  // pieces repeat
  for (const std::string& piece : pretokenize(text)) {
    auto [it, fresh] = cache.try_emplace(piece);
    if (fresh) {
      std::string mapped;
      for (char c : piece) mapped += byte_map()[static_cast<unsigned char>(c)];
      for (const std::string& tok : bpe(mapped)) {
        const auto e = encoder_.find(tok);
        if (e == encoder_.end())
          throw Error(fmt::format("BPE: '{}' (of the text piece '{}') has no token", tok, piece));
        it->second.push_back(static_cast<std::uint16_t>(e->second));
      }
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

std::string Gpt2Bpe::decode(std::span<const std::uint16_t> tokens) const {
  static const std::map<std::string, std::uint8_t> back = [] {
    std::map<std::string, std::uint8_t> b;
    for (int i = 0; i < 256; ++i)
      b[byte_map()[static_cast<std::size_t>(i)]] = static_cast<std::uint8_t>(i);
    return b;
  }();
  std::string out;
  for (std::uint16_t t : tokens) {
    if (t >= decoder_.size() || decoder_[t].empty())
      throw Error(fmt::format("BPE: token {} is not in the vocabulary of {}", t, decoder_.size()));
    for (const std::string& cp : code_points(decoder_[t])) {
      const auto it = back.find(cp);
      if (it == back.end())
        throw Error(fmt::format("BPE: token {} holds '{}', not a byte's code point", t, cp));
      out.push_back(static_cast<char>(it->second));
    }
  }
  return out;
}

}  // namespace tern::train
