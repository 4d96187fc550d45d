// Training checkpoints: one file per checkpoint holding the run's
// whole state (weights, optimizer moments and masters, data position, step,
// recipe state), written atomically and checked on load.
//
// File layout (little-endian): "TERNCKPT" | u32 version (1) | u64 header
// length | header (JSON: "meta" and the tensor table [{name, count,
// offset}]) | payload (the tensors as FP32, in table order) | u32 CRC-32
// (zlib) of every byte before it. A truncated or corrupted file fails its
// size or CRC check and is rejected with a message naming the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tern::train {

struct Checkpoint {
  nlohmann::json meta;
  std::map<std::string, std::vector<float>> tensors;
};

// Writes atomically (a temporary file, then a rename: a reader or a crash
// never sees half a checkpoint).
void save_checkpoint(const std::filesystem::path& file, const Checkpoint& c);
// Throws tern::Error naming the file and what is wrong (not a checkpoint,
// another version, truncated, checksum mismatch, bad table).
Checkpoint load_checkpoint(const std::filesystem::path& file);

// dir/step-00000100.ckpt
std::filesystem::path checkpoint_path(const std::filesystem::path& dir, std::int64_t step);
// The checkpoint files of dir by step, oldest first (none: empty).
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& dir);
// The newest checkpoint of dir that loads; each newer one that does not is
// named in `notes` with the reason. nullopt when none loads.
// Checkpoints past max_step are not considered (a rollback never jumps
// forward into an older run's later checkpoints).
std::optional<std::pair<std::filesystem::path, Checkpoint>> latest_good(
    const std::filesystem::path& dir, std::vector<std::string>& notes,
    std::int64_t max_step = std::numeric_limits<std::int64_t>::max());
// Deletes all but the newest `keep` checkpoints of dir.
void prune_checkpoints(const std::filesystem::path& dir, int keep);
// Removes the temporaries (step-N.ckpt.tmpPID) that writers killed mid-write
// left in `dir` (their process is gone); returns what it removed. Every
// save_checkpoint does this first.
std::vector<std::filesystem::path> remove_stale_temporaries(const std::filesystem::path& dir);

}  // namespace tern::train
