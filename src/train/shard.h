// Token shards in llm.c's .bin format (karpathy/llm.c dev/data/data_common.py),
// the de-facto interchange for tokenized corpora: a header of 256 int32
// (little endian): [0] magic 20240520, [1] version 1, [2] token count; then
// the tokens as uint16.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

namespace tern::train {

inline constexpr std::int32_t kShardMagic = 20240520;
inline constexpr std::int32_t kShardVersion = 1;

// Writes the shard atomically (temporary file, then rename).
void write_shard(const std::filesystem::path& path, std::span<const std::uint16_t> tokens);
// Reads a shard; throws tern::Error naming the file for a missing file, a
// short header, a bad magic or version, or a token count that does not
// match the file's size (truncated or padded).
std::vector<std::uint16_t> read_shard(const std::filesystem::path& path);

}  // namespace tern::train
