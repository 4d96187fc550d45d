#include "train/checkpoint.h"

#include <signal.h>
#include <unistd.h>

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
  const std::filesystem::path dir = file.parent_path().empty() ? "." : file.parent_path();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw Error(fmt::format("cannot create checkpoint folder {}: {}", dir.string(), ec.message()));
  remove_stale_temporaries(dir);
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
  // The table, checked whole before any byte is used: every entry a name,
  // a count and an offset (non-negative integers; the sum cannot wrap since
  // each count is bounded by the file's size first).
  struct Entry {
    std::string name;
    std::uint64_t count, offset;
  };
  std::vector<Entry> table;
  std::uint64_t payload = 0;
  const std::uint64_t room = s.size() - 24 - hlen;
  try {
    if (!h.is_object() || !h.value("meta", nlohmann::json::object()).is_object())
      bad("the header is not an object with a \"meta\" object");
    for (const auto& t : h.at("tensors")) {
      const auto &name = t.at("name"), &count = t.at("count"), &offset = t.at("offset");
      if (!name.is_string() || !count.is_number_unsigned() || !offset.is_number_unsigned())
        bad(
            fmt::format("tensor table entry {}: needs a name (text), a count and an offset "
                        "(non-negative integers)",
                        t.dump()));
      table.push_back(
          {name.get<std::string>(), count.get<std::uint64_t>(), offset.get<std::uint64_t>()});
      if (table.back().count > room / 4)
        bad(fmt::format("truncated: tensor {} has {} floats, more than the file holds",
                        t.at("name").dump(), table.back().count));
      payload += table.back().count * 4;
      if (payload > room) bad(fmt::format("truncated: the table needs more than {} bytes", room));
    }
  } catch (const nlohmann::json::exception& e) {
    bad(fmt::format("bad tensor table ({})", e.what()));
  }
  const std::uint64_t want = 20 + hlen + payload + 4;
  if (s.size() != want)
    bad(fmt::format("{}: {} bytes, the table says {}",
                    s.size() < want ? "truncated" : "trailing bytes", s.size(), want));
  std::uint32_t stored;
  std::memcpy(&stored, s.data() + s.size() - 4, 4);
  if (crc(s.data(), s.size() - 4) != stored) bad("checksum mismatch: the file is corrupted");
  Checkpoint c;
  c.meta = h.value("meta", nlohmann::json::object());
  const char* base = s.data() + 20 + hlen;
  for (const Entry& t : table) {
    if (t.offset % 4 != 0 || t.offset > payload || t.count * 4 > payload - t.offset)
      bad(fmt::format("tensor {} [offset {}, {} floats] lies outside the {}-byte payload", t.name,
                      t.offset, t.count, payload));
    if (c.tensors.count(t.name)) bad(fmt::format("tensor {} appears twice", t.name));
    std::vector<float> x(t.count);
    std::memcpy(x.data(), base + t.offset, t.count * 4);
    c.tensors[t.name] = std::move(x);
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
  // Step numbers that fit in 18 digits (a longer one is not a name tern writes).
  static const std::regex name(R"(step-(\d{1,18})\.ckpt)");
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
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
    } catch (const std::exception& e) {  // Error, or bad_alloc of a damaged count
      notes.push_back(fmt::format("{}; using an older checkpoint", e.what()));
    }
  }
  return std::nullopt;
}

void prune_checkpoints(const std::filesystem::path& dir, int keep) {
  const auto all = list_checkpoints(dir);
  std::error_code ec;
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < all.size(); ++i)
    std::filesystem::remove(all[i], ec);
}

std::vector<std::filesystem::path> remove_stale_temporaries(const std::filesystem::path& dir) {
  // write_file_atomic's temporaries: <name>.ckpt.tmp<pid>. One whose writer
  // is gone (no such process) was left by a kill mid-write.
  static const std::regex name(R"(step-\d+\.ckpt\.tmp(\d{1,9}))");
  std::vector<std::filesystem::path> removed;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string f = e.path().filename().string();
    if (!std::regex_match(f, m, name)) continue;
    const auto pid = static_cast<pid_t>(std::stol(m[1].str()));
    if (pid == ::getpid() || (::kill(pid, 0) != 0 && errno == ESRCH)) {
      std::error_code rm;
      if (std::filesystem::remove(e.path(), rm)) removed.push_back(e.path());
    }
  }
  return removed;
}

}  // namespace tern::train
