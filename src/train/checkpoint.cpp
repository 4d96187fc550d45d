#include "train/checkpoint.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <regex>

#include <fmt/format.h>
#include <zlib.h>

#include "util/error.h"
#include "util/file.h"

namespace tern::train {

static_assert(std::endian::native == std::endian::little,
              "checkpoints are little-endian; a big-endian host would need byte swaps");

namespace {

constexpr char kMagic[8] = {'T', 'E', 'R', 'N', 'C', 'K', 'P', 'T'};
constexpr std::uint32_t kVersion = 1;

template <class T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

std::uint32_t crc(const char* p, std::size_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  // zlib's length is a uInt: feed large buffers in pieces.
  while (n > 0) {
    const auto k = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    c = crc32(c, reinterpret_cast<const Bytef*>(p), k);
    p += k, n -= k;
  }
  return static_cast<std::uint32_t>(c);
}

}  // namespace

void save_checkpoint(const std::filesystem::path& file, const Checkpoint& c) {
  nlohmann::json table = nlohmann::json::array();
  std::size_t offset = 0;
  for (const auto& [name, x] : c.tensors) {
    table.push_back({{"name", name}, {"count", x.size()}, {"offset", offset}});
    offset += x.size() * 4;
  }
  const std::string header = nlohmann::json{{"meta", c.meta}, {"tensors", table}}.dump();
  std::string s;
  s.reserve(24 + header.size() + offset + 4);
  s.append(kMagic, 8);
  put(s, kVersion);
  put(s, static_cast<std::uint64_t>(header.size()));
  s += header;
  for (const auto& [name, x] : c.tensors)
    s.append(reinterpret_cast<const char*>(x.data()), x.size() * 4);
  put(s, crc(s.data(), s.size()));
  std::filesystem::create_directories(file.parent_path().empty() ? "." : file.parent_path());
  write_file_atomic(file, s);
}

Checkpoint load_checkpoint(const std::filesystem::path& file) {
  const std::string s = read_file(file);
  auto bad = [&](const std::string& what) {
    throw Error(fmt::format("checkpoint {}: {}", file.string(), what));
  };
  if (s.size() < 24 || std::memcmp(s.data(), kMagic, 8) != 0)
    bad("not a tern checkpoint (no TERNCKPT header)");
  std::uint32_t version;
  std::uint64_t hlen;
  std::memcpy(&version, s.data() + 8, 4);
  std::memcpy(&hlen, s.data() + 12, 8);
  if (version != kVersion)
    bad(fmt::format("version {} is not supported (this tern reads 1)", version));
  if (hlen > s.size() - 24)
    bad(fmt::format("truncated: {} bytes, the header alone needs {}", s.size(), 24 + hlen));
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(s.substr(20, hlen));
  } catch (const nlohmann::json::exception& e) {
    bad(fmt::format("header is not JSON ({})", e.what()));
  }
  std::size_t payload = 0;
  try {
    for (const auto& t : h.at("tensors")) payload += t.at("count").get<std::size_t>() * 4;
  } catch (const nlohmann::json::exception& e) {
    bad(fmt::format("bad tensor table ({})", e.what()));
  }
  const std::size_t want = 20 + hlen + payload + 4;
  if (s.size() != want)
    bad(fmt::format("{}: {} bytes, the table says {}",
                    s.size() < want ? "truncated" : "trailing bytes", s.size(), want));
  std::uint32_t stored;
  std::memcpy(&stored, s.data() + s.size() - 4, 4);
  if (crc(s.data(), s.size() - 4) != stored) bad("checksum mismatch: the file is corrupted");
  Checkpoint c;
  c.meta = h.value("meta", nlohmann::json::object());
  const char* base = s.data() + 20 + hlen;
  for (const auto& t : h.at("tensors")) {
    const auto n = t.at("count").get<std::size_t>();
    const auto off = t.at("offset").get<std::size_t>();
    if (off + n * 4 > payload)
      bad(fmt::format("tensor {} lies past the payload", t.at("name").dump()));
    std::vector<float> x(n);
    std::memcpy(x.data(), base + off, n * 4);
    c.tensors[t.at("name").get<std::string>()] = std::move(x);
  }
  return c;
}

std::filesystem::path checkpoint_path(const std::filesystem::path& dir, std::int64_t step) {
  return dir / fmt::format("step-{:08d}.ckpt", step);
}

std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& dir) {
  std::vector<std::pair<std::int64_t, std::filesystem::path>> found;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return {};
  static const std::regex name(R"(step-(\d+)\.ckpt)");
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::smatch m;
    const std::string f = e.path().filename().string();
    if (std::regex_match(f, m, name)) found.emplace_back(std::stoll(m[1].str()), e.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::filesystem::path> out;
  for (auto& [step, p] : found) out.push_back(p);
  return out;
}

std::optional<std::pair<std::filesystem::path, Checkpoint>> latest_good(
    const std::filesystem::path& dir, std::vector<std::string>& notes, std::int64_t max_step) {
  const auto all = list_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    // step-00000100.ckpt: the step is the name's digits.
    const std::string f = it->filename().string();
    if (std::stoll(f.substr(5, f.size() - 10)) > max_step) continue;
    try {
      return std::make_pair(*it, load_checkpoint(*it));
    } catch (const Error& e) {
      notes.push_back(fmt::format("{}; using an older checkpoint", e.what()));
    }
  }
  return std::nullopt;
}

void prune_checkpoints(const std::filesystem::path& dir, int keep) {
  const auto all = list_checkpoints(dir);
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < all.size(); ++i)
    std::filesystem::remove(all[i]);
}

}  // namespace tern::train
