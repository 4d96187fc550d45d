#include "sim/memory.h"

#include <algorithm>

#include <fmt/format.h>

#include "util/error.h"

namespace tern::sim {

void Hbm::add(std::string name, std::int64_t address, std::int64_t size) {
  for (const Region& r : regions_) {
    if (address < r.address + r.size && r.address < address + size) {
      throw Error(fmt::format("HBM tensor '{}' [{}, {}) overlaps tensor '{}' [{}, {})", name,
                              address, address + size, r.name, r.address, r.address + r.size));
    }
  }
  Region r;
  r.name = std::move(name);
  r.address = address;
  r.size = size;
  regions_.push_back(std::move(r));
}

void Hbm::storage() {
  for (Region& r : regions_) r.memory();
}

void Hbm::flags() {
  for (Region& r : regions_)
    if (!r.host_written && !r.written) r.written = zeroed_bytes(static_cast<std::size_t>(r.size));
}

Region* Hbm::find(std::int64_t address, std::int64_t len) {
  for (Region& r : regions_) {
    if (address >= r.address && address + len <= r.address + r.size) return &r;
  }
  return nullptr;
}

Region& Hbm::by_name(const std::string& name) {
  for (Region& r : regions_)
    if (r.name == name) return r;
  throw Error(fmt::format("no HBM tensor named '{}'", name));
}

const std::uint8_t* find_unwritten(const std::uint8_t* flags, std::size_t len, std::uint8_t mark) {
  // memcmp against a row of marks (libc's vectorized compare), then the
  // byte loop only inside a block that differs.
  constexpr std::size_t kBlock = 4096;
  static thread_local std::uint8_t marks[kBlock];
  static thread_local int filled = -1;
  if (filled != mark) std::memset(marks, mark, kBlock), filled = mark;
  std::size_t i = 0;
  while (i < len) {
    const std::size_t n = std::min(kBlock, len - i);
    if (std::memcmp(flags + i, marks, n) != 0)
      for (std::size_t k = i; k < i + n; ++k)
        if (flags[k] != mark) return flags + k;
    i += n;
  }
  return nullptr;
}

Bytes zeroed_bytes(std::size_t n) {
  auto* p = static_cast<std::uint8_t*>(std::calloc(n, 1));
  if (!p)
    throw Error(fmt::format("cannot allocate {} bytes of host memory for the simulated chip", n));
  return Bytes(p);
}

Sram::Sram(int partitions, std::int64_t bytes_per_partition, bool track_written)
    : partitions_(partitions), bytes_(bytes_per_partition) {
  const auto n =
      static_cast<std::size_t>(partitions) * static_cast<std::size_t>(bytes_per_partition);
  data_ = zeroed_bytes(n);
  if (track_written) written_ = zeroed_bytes(n);
}

}  // namespace tern::sim
