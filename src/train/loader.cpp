#include "train/loader.h"

#include <random>
#include <utility>

#include <fmt/format.h>

#include "util/error.h"

namespace tern::train {

std::vector<std::int64_t> shuffled_order(std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  // One generator per epoch (seed and epoch mixed by the golden-ratio
  // constant), so epoch k's order does not depend on the draws of the ones
  // before.
  std::mt19937_64 rng(seed ^ (0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(epoch + 1)));
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto range = static_cast<std::uint64_t>(i + 1);
    const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % range);
    std::uint64_t r = rng();
    while (r >= limit) r = rng();
    std::swap(v[static_cast<std::size_t>(i)], v[static_cast<std::size_t>(r % range)]);
  }
  return v;
}

BatchLoader::BatchLoader(std::vector<std::uint16_t> tokens, int batch, int seq, std::uint64_t seed,
                         bool shuffle)
    : tokens_(std::move(tokens)), batch_(batch), seq_(seq), shuffle_(shuffle) {
  if (batch < 1 || seq < 1)
    throw Error(fmt::format("data loader: batch ({}) and seq ({}) must be >= 1", batch, seq));
  const auto n = static_cast<std::int64_t>(tokens_.size());
  windows_ = n > seq ? (n - 1) / seq : 0;
  if (windows_ < batch)
    throw Error(
        fmt::format("data loader: {} tokens hold {} windows of {} + 1 tokens, fewer than "
                    "a batch of {}",
                    n, windows_, seq, batch));
  state_.seed = seed, state_.windows = windows_, state_.shuffle = shuffle;
  order_epoch();
}

void BatchLoader::order_epoch() {
  if (shuffle_) {
    order_ = shuffled_order(windows_, state_.seed, state_.epoch);
  } else {
    order_.resize(static_cast<std::size_t>(windows_));
    for (std::int64_t i = 0; i < windows_; ++i) order_[static_cast<std::size_t>(i)] = i;
  }
}

Batch BatchLoader::next() {
  Batch b;
  const auto n = static_cast<std::size_t>(batch_) * static_cast<std::size_t>(seq_);
  b.ids.resize(n), b.targets.resize(n);
  for (int r = 0; r < batch_; ++r) {
    if (state_.next == windows_) {
      ++state_.epoch, state_.next = 0;
      order_epoch();
    }
    const std::int64_t w = order_[static_cast<std::size_t>(state_.next++)];
    const std::size_t at = static_cast<std::size_t>(w) * static_cast<std::size_t>(seq_);
    for (int t = 0; t < seq_; ++t) {
      const std::size_t o = static_cast<std::size_t>(r) * static_cast<std::size_t>(seq_) +
                            static_cast<std::size_t>(t);
      b.ids[o] = tokens_[at + static_cast<std::size_t>(t)];
      b.targets[o] = tokens_[at + static_cast<std::size_t>(t) + 1];
    }
  }
  return b;
}

void BatchLoader::restore(const LoaderState& s) {
  if (s.seed != state_.seed)
    throw Error(fmt::format("data loader: the saved position is for seed {}, this loader's is {}",
                            s.seed, state_.seed));
  if (s.windows != windows_ || s.shuffle != shuffle_)
    throw Error(
        fmt::format("data loader: the saved position is in {} windows ({}), this "
                    "loader has {} ({})",
                    s.windows, s.shuffle ? "shuffled" : "in order", windows_,
                    shuffle_ ? "shuffled" : "in order"));
  if (s.epoch < 0 || s.next < 0 || s.next > windows_)
    throw Error(
        fmt::format("data loader: position (epoch {}, window {}) is outside the {} "
                    "windows of the data",
                    s.epoch, s.next, windows_));
  const bool new_epoch = s.epoch != state_.epoch;
  state_ = s;
  if (new_epoch) order_epoch();
}

}  // namespace tern::train
