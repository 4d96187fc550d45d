#include "sim/memory.h"

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
  r.data.assign(static_cast<std::size_t>(size), 0);
  r.written.assign(static_cast<std::size_t>(size), 0);
  regions_.push_back(std::move(r));
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

Sram::Sram(int partitions, std::int64_t bytes_per_partition, bool track_written)
    : partitions_(partitions), bytes_(bytes_per_partition) {
  data_.assign(static_cast<std::size_t>(partitions) * bytes_per_partition, 0);
  if (track_written) written_.assign(data_.size(), 0);
}

}  // namespace tern::sim
