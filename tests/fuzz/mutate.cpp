#include "mutate.h"

#include <cctype>
#include <cstdlib>
#include <cstring>

namespace tern::fuzz {
namespace {

const char* const kNumbers[] = {"0",
                                "-1",
                                "1",
                                "2147483647",
                                "2147483648",
                                "4294967296",
                                "-2147483649",
                                "9223372036854775807",
                                "-9223372036854775808",
                                "99999999999999999999999",
                                "1e308",
                                "-1e308",
                                "nan",
                                "inf",
                                "0.5",
                                "65536"};
const std::uint64_t kWords[] = {0,
                                1,
                                0xFFFFFFFFFFFFFFFFull,
                                0x7FFFFFFFFFFFFFFFull,
                                0x8000000000000000ull,
                                0x7FFFFFFF,
                                0x80000000,
                                0xFFFFFFFF,
                                0x100000000ull,
                                0xFFFF,
                                128,
                                0x7FF8000000000000ull};

}  // namespace

std::string Mutator::number() {
  return kNumbers[below(std::size(kNumbers))];
}

std::string Mutator::bytes(std::string s) {
  const int n = 1 + static_cast<int>(below(4));
  for (int k = 0; k < n; ++k) {
    const std::size_t at = below(s.size() + 1);
    switch (below(5)) {
      case 0:  // flip a bit
        if (!s.empty()) s[at % s.size()] ^= static_cast<char>(1 << below(8));
        break;
      case 1:  // a random byte
        if (!s.empty()) s[at % s.size()] = static_cast<char>(below(256));
        break;
      case 2:  // insert bytes
        s.insert(at, std::string(1 + below(8), static_cast<char>(below(256))));
        break;
      case 3:  // delete a run
        s.erase(at, 1 + below(16));
        break;
      default:  // copy a run elsewhere
        if (!s.empty()) {
          const std::size_t from = below(s.size()), len = 1 + below(32);
          s.insert(at, s.substr(from, len));
        }
    }
  }
  return s;
}

std::string Mutator::text(std::string s) {
  const int n = 1 + static_cast<int>(below(3));
  for (int k = 0; k < n && !s.empty(); ++k) {
    const std::size_t at = below(s.size());
    switch (below(6)) {
      case 0:
      case 1:
      case 2: {  // the number at or after `at` replaced
        std::size_t b = at;
        while (b < s.size() && !std::isdigit(static_cast<unsigned char>(s[b]))) ++b;
        if (b == s.size()) break;
        while (b > 0 && (std::isdigit(static_cast<unsigned char>(s[b - 1])) || s[b - 1] == '-' ||
                         s[b - 1] == '.'))
          --b;
        std::size_t e = b;
        while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '.' ||
                                s[e] == '-' || s[e] == '+'))
          ++e;
        s.replace(b, e - b, number());
        break;
      }
      case 3: {  // a line dropped
        const std::size_t b = s.rfind('\n', at), e = s.find('\n', at);
        s.erase(b == std::string::npos ? 0 : b, e == std::string::npos ? std::string::npos : e - b);
        break;
      }
      case 4: {  // a line doubled
        const std::size_t b = s.rfind('\n', at), e = s.find('\n', at);
        const std::size_t from = b == std::string::npos ? 0 : b;
        s.insert(from, s.substr(from, e == std::string::npos ? std::string::npos : e - from));
        break;
      }
      default:  // a token cut short, or a byte flipped
        if (below(2))
          s.erase(at, 1 + below(4));
        else
          s[at] ^= static_cast<char>(1 << below(7));
    }
  }
  return s;
}

std::string Mutator::word(std::string s, std::size_t from) {
  if (s.size() <= from) return s;
  const std::size_t width = std::size_t{1} << below(4);
  const std::size_t at = from + below(s.size() - from);
  const std::uint64_t v = kWords[below(std::size(kWords))];
  for (std::size_t i = 0; i < width && at + i < s.size(); ++i)
    s[at + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

int fuzz_count(int ci) {
  if (const char* e = std::getenv("TERN_FUZZ_COUNT"); e && *e) return std::atoi(e);
  return ci;
}

}  // namespace tern::fuzz
