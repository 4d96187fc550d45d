#include "train/shard.h"

#include <bit>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "util/error.h"
#include "util/file.h"

namespace tern::train {

namespace {

constexpr std::size_t kHeaderInts = 256, kHeaderBytes = kHeaderInts * 4;
static_assert(std::endian::native == std::endian::little,
              "the llm.c shard format is little endian; add byte swaps for this host");

}  // namespace

void write_shard(const std::filesystem::path& path, std::span<const std::uint16_t> tokens) {
  if (tokens.size() >= (std::size_t{1} << 31))
    throw Error(
        fmt::format("{}: {} tokens: a shard holds fewer than 2^31", path.string(), tokens.size()));
  std::string bytes(kHeaderBytes + tokens.size() * 2, '\0');
  const std::int32_t header[3] = {kShardMagic, kShardVersion,
                                  static_cast<std::int32_t>(tokens.size())};
  std::memcpy(bytes.data(), header, sizeof header);
  if (!tokens.empty())  // an empty span's data() may be null
    std::memcpy(bytes.data() + kHeaderBytes, tokens.data(), tokens.size() * 2);
  write_file_atomic(path, bytes);
}

std::vector<std::uint16_t> read_shard(const std::filesystem::path& path) {
  const std::string bytes = read_file(path);
  const std::string name = path.string();
  if (bytes.size() < kHeaderBytes)
    throw Error(fmt::format("{}: {} bytes: shorter than a shard header ({} bytes)", name,
                            bytes.size(), kHeaderBytes));
  std::int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof header);
  if (header[0] != kShardMagic)
    throw Error(
        fmt::format("{}: not a token shard (magic {}, want {})", name, header[0], kShardMagic));
  if (header[1] != kShardVersion)
    throw NotSupported(fmt::format("{}: token shard version {} (version {}: uint16 tokens, is)",
                                   name, header[1], kShardVersion));
  if (header[2] < 0) throw Error(fmt::format("{}: the header says {} tokens", name, header[2]));
  const auto count = static_cast<std::size_t>(header[2]);
  if (bytes.size() != kHeaderBytes + count * 2)
    throw Error(
        fmt::format("{}: the header says {} tokens ({} bytes), the file has {} bytes "
                    "(truncated or padded)",
                    name, header[2], kHeaderBytes + count * 2, bytes.size()));
  std::vector<std::uint16_t> tokens(count);
  if (count > 0) std::memcpy(tokens.data(), bytes.data() + kHeaderBytes, count * 2);
  return tokens;
}

}  // namespace tern::train
