// Operands: access patterns over HBM, SBUF or PSUM (nki `.ap`).
//
// SBUF/PSUM operands occupy `partitions` contiguous partitions from
// `start_partition` (no partition stride) and, inside every partition, the
// same free pattern: up to four (stride, count) pairs in elements, outermost
// first, starting at `offset` bytes into the partition.
// HBM operands have no partitions: `offset` is a byte address and the first
// pair of `dims` is the row ("partition") dimension that a DMA maps onto
// SBUF partitions; the rest is the free pattern.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "isa/dtype.h"

namespace tern::isa {

enum class Mem : std::uint8_t { hbm, sbuf, psum };
std::string_view mem_name(Mem m);

struct Dim {
  std::int64_t stride = 1;  // elements
  std::int64_t count = 1;
  bool operator==(const Dim&) const = default;
};

constexpr int kMaxFreeDims = 4;

struct AccessPattern {
  Mem mem = Mem::sbuf;
  DType dtype = DType::fp32;
  std::int64_t offset = 0;  // bytes: HBM address, or offset inside each partition
  int start_partition = 0;  // SBUF/PSUM
  int partitions = 1;       // SBUF/PSUM; for HBM, dims[0].count
  std::vector<Dim> dims;    // free pattern (HBM: row dim first, then free)
  // Register addressing: the effective offset is offset + reg_stride x the
  // value of register `offset_reg` of the issuing engine (-1: none), bytes.
  int offset_reg = -1;
  std::int64_t reg_stride = 0;

  // Rows: partitions for SBUF/PSUM, dims[0].count for HBM.
  int rows() const;
  // Elements per row (product of the free counts).
  std::int64_t free_size() const;
  std::int64_t elements() const { return rows() * free_size(); }
  std::int64_t bytes() const { return elements() * size_bytes(dtype); }
  // Byte offset of free element `i` (row-major over the free dims) from the
  // start of its row (SBUF/PSUM: within the partition, including `offset`).
  std::int64_t element_offset(std::int64_t i) const;
  // HBM: byte address of row r's first element.
  std::int64_t row_address(int r) const;
  // [lo, hi) bytes touched inside each row (SBUF/PSUM) or in HBM overall.
  std::int64_t min_byte() const;
  std::int64_t max_byte() const;
  // Whether the innermost free dimension is contiguous (stride 1).
  bool contiguous_inner() const;
  // Elements in each contiguous run of a row: the product of the innermost
  // free counts whose strides continue the run (count-1 dims skipped); 1
  // when the innermost stride is not 1. A row is free_size() / run runs.
  std::int64_t contiguous_run() const;

  bool operator==(const AccessPattern&) const = default;
};

// The pattern with its register term resolved (offset_reg cleared).
AccessPattern resolve(const AccessPattern& ap, std::int64_t reg_value);

// Readable form, e.g. sbuf[0:128]+1024 [[1,512]] bfloat16 (with a register
// term: sbuf[0:128]+1024+r3*2048 ...) and
// hbm+4096 [[512,128],[1,512]] float32. parse_access() reads it back.
std::string to_string(const AccessPattern& ap);
AccessPattern parse_access(const std::string& text);

}  // namespace tern::isa
