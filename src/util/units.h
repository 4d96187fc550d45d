// Typed physical quantities for interfaces: a function that takes a
// bandwidth cannot be handed a byte count by mistake. Each quantity stores
// one canonical unit (named in the alias comment) and converts only through
// named accessors.
#pragma once

#include <compare>
#include <cstdint>

namespace tern {

template <typename Tag, typename Rep>
class Quantity {
 public:
  using rep = Rep;
  constexpr Quantity() = default;
  constexpr explicit Quantity(Rep v) : v_(v) {}
  // The value in the canonical unit of this quantity.
  constexpr Rep value() const { return v_; }

  constexpr Quantity operator+(Quantity o) const { return Quantity(v_ + o.v_); }
  constexpr Quantity operator-(Quantity o) const { return Quantity(v_ - o.v_); }
  constexpr Quantity& operator+=(Quantity o) {
    v_ += o.v_;
    return *this;
  }
  constexpr Quantity operator*(Rep k) const { return Quantity(v_ * k); }
  constexpr Quantity operator/(Rep k) const { return Quantity(v_ / k); }
  // Ratio of two quantities of the same kind is a plain number.
  constexpr double operator/(Quantity o) const {
    return static_cast<double>(v_) / static_cast<double>(o.v_);
  }
  constexpr auto operator<=>(const Quantity&) const = default;

 private:
  Rep v_{};
};

struct BytesTag {};
struct NanosecondsTag {};
struct CyclesTag {};
struct BandwidthTag {};
struct FrequencyTag {};
struct FlopRateTag {};

using Bytes = Quantity<BytesTag, std::int64_t>;        // bytes
using Nanoseconds = Quantity<NanosecondsTag, double>;  // ns
using Cycles = Quantity<CyclesTag, std::int64_t>;      // clock cycles of one engine
using Bandwidth = Quantity<BandwidthTag, double>;      // GB/s (10^9 B/s) == bytes per ns
using Frequency = Quantity<FrequencyTag, double>;      // GHz (10^9 cycles/s)
using FlopRate = Quantity<FlopRateTag, double>;        // FLOP/s

constexpr std::int64_t kKiB = 1024;
constexpr std::int64_t kMiB = 1024 * kKiB;
constexpr std::int64_t kGiB = 1024 * kMiB;

constexpr Bytes kibibytes(double n) {
  return Bytes(static_cast<std::int64_t>(n * kKiB));
}
constexpr Bytes mebibytes(double n) {
  return Bytes(static_cast<std::int64_t>(n * kMiB));
}
constexpr Bytes gibibytes(double n) {
  return Bytes(static_cast<std::int64_t>(n * kGiB));
}
constexpr Bandwidth gigabytes_per_second(double n) {
  return Bandwidth(n);
}
constexpr Frequency gigahertz(double n) {
  return Frequency(n);
}

// Time to move `b` at bandwidth `bw`: bytes / (bytes per ns).
constexpr Nanoseconds transfer_time(Bytes b, Bandwidth bw) {
  return Nanoseconds(static_cast<double>(b.value()) / bw.value());
}
// Duration of `c` cycles at clock `f`: cycles / (cycles per ns).
constexpr Nanoseconds cycles_to_time(Cycles c, Frequency f) {
  return Nanoseconds(static_cast<double>(c.value()) / f.value());
}
// FLOP/s of `flops_per_cycle` operations every cycle at clock `f`.
constexpr FlopRate flop_rate(double flops_per_cycle, Frequency f) {
  return FlopRate(flops_per_cycle * f.value() * 1e9);
}

}  // namespace tern
