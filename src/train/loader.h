// Batches from a token stream for training. An epoch visits every
// window of seq + 1 tokens starting at a multiple of seq (inputs are the
// first seq tokens, targets the next token of each), in an order shuffled
// per epoch from the seed; batches take the next `batch` windows of that
// stream (an epoch's last batch continues into the next epoch). The
// position is the loader's state: restoring it continues the very same
// sequence of batches (a checkpoint stores it).
#pragma once

#include <cstdint>
#include <vector>

namespace tern::train {

struct LoaderState {
  std::uint64_t seed = 0;
  std::int64_t epoch = 0, next = 0;  // the next window of the epoch's order
  // What the position is a position in: restoring into a loader over other
  // data or with another order is an error.
  std::int64_t windows = 0;
  bool shuffle = true;
  bool operator==(const LoaderState&) const = default;
};

struct Batch {
  std::vector<std::int32_t> ids, targets;  // [batch, seq] each, row-major
};

class BatchLoader {
 public:
  // Throws tern::Error when the tokens hold fewer than `batch` windows.
  BatchLoader(std::vector<std::uint16_t> tokens, int batch, int seq, std::uint64_t seed,
              bool shuffle = true);
  Batch next();
  LoaderState state() const { return state_; }
  // Throws for a state of another seed or a position past the epoch.
  void restore(const LoaderState& s);
  std::int64_t windows() const { return windows_; }
  std::int64_t tokens() const { return static_cast<std::int64_t>(tokens_.size()); }

 private:
  void order_epoch();
  std::vector<std::uint16_t> tokens_;
  int batch_, seq_;
  bool shuffle_;
  std::int64_t windows_;
  LoaderState state_;
  std::vector<std::int64_t> order_;  // the current epoch's window order
};

// Window order of one epoch: Fisher-Yates on mt19937_64 draws with
// rejection sampling, written out because std::shuffle's draws differ
// between standard libraries and the order is part of a checkpoint.
std::vector<std::int64_t> shuffled_order(std::int64_t n, std::uint64_t seed, std::int64_t epoch);

}  // namespace tern::train
