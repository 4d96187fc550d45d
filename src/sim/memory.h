// Simulated memories with real bytes: HBM (only the regions a program
// declares get backing store; a chip's 144 GiB are never allocated) and
// per-core SBUF and PSUM. Each byte carries a "written" flag so that reads
// of never-written memory are caught (poison).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "isa/access.h"

namespace tern::sim {

// The first of `len` written flags that is not `mark` (never written in the
// current run), or nullptr: memchr's job for "flag != mark", 8 bytes a step.
const std::uint8_t* find_unwritten(const std::uint8_t* flags, std::size_t len, std::uint8_t mark);

// Zero-filled bytes from calloc: the OS hands out zero pages lazily, so a
// 32 MiB SBUF or a 64 MiB HBM tensor costs only the pages a run touches.
struct FreeBytes {
  void operator()(std::uint8_t* p) const { std::free(p); }
};
using Bytes = std::unique_ptr<std::uint8_t[], FreeBytes>;
Bytes zeroed_bytes(std::size_t n);

// One declared HBM tensor. Its bytes are its own (zeroed when first
// needed) or memory a caller bound to it (Simulator::bind: a runtime's
// device memory, used in place). Written flags exist only where a run
// checks them: a tensor the host filled counts as written throughout.
struct Region {
  std::string name;
  std::int64_t address = 0, size = 0;
  std::uint8_t* data = nullptr;  // `own`, bound memory, or nullptr before either
  Bytes own, written;
  bool host_written = false;  // every byte filled by the host (write_bytes, bind)
  // Its bytes: the bound memory, else its own (zeroed, allocated now when
  // it has none).
  std::uint8_t* memory() {
    if (!data) own = zeroed_bytes(static_cast<std::size_t>(size)), data = own.get();
    return data;
  }
};

class Hbm {
 public:
  // Declares a tensor; its memory comes later (storage() or a bind).
  void add(std::string name, std::int64_t address, std::int64_t size);
  // Zeroed memory for every tensor that has none yet.
  void storage();
  // Written flags (all never-written) for every tensor the host did not
  // fill that has none yet.
  void flags();
  // The region holding [address, address + len), or nullptr.
  Region* find(std::int64_t address, std::int64_t len);
  Region& by_name(const std::string& name);
  std::vector<Region>& regions() { return regions_; }

 private:
  std::vector<Region> regions_;
};

// SBUF or PSUM of one core: partitions x bytes, row-major by partition.
class Sram {
 public:
  Sram() = default;
  Sram(int partitions, std::int64_t bytes_per_partition, bool track_written);
  std::uint8_t* row(int p) { return data_.get() + p * bytes_; }
  std::uint8_t* written_row(int p) { return written_.get() + p * bytes_; }
  bool tracks_written() const { return written_ != nullptr; }
  int partitions() const { return partitions_; }
  std::int64_t bytes_per_partition() const { return bytes_; }
  // Bytes [0, used) never written again (the flags cleared). Runs use a mark
  // instead (Simulator: a byte is written when its flag equals the current
  // mark), so this is needed only when the mark wraps around.
  // Flags past `used` in every partition were never set since the last clear.
  void clear_written(std::int64_t used) {
    if (!written_) return;
    const auto n = static_cast<std::size_t>(std::clamp<std::int64_t>(used, 0, bytes_));
    for (int p = 0; p < partitions_; ++p) std::memset(written_row(p), 0, n);
  }

 private:
  int partitions_ = 0;
  std::int64_t bytes_ = 0;
  Bytes data_, written_;
};

}  // namespace tern::sim
