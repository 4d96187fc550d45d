#include "kernel/builder.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "util/checked.h"
#include "util/error.h"

namespace tern::kernel {

using isa::AccessPattern;
using isa::Engine;
using isa::Instruction;
using isa::Mem;
using isa::Opcode;

Tensor Tensor::tile(int r0, int nr, std::int64_t c0, std::int64_t nc) const {
  const std::size_t fd = ap.mem == Mem::hbm ? 1 : 0;  // index of the first free dim
  if (ap.dims.size() != fd + 1) {
    throw Error("Tensor::tile needs a 2-D view with one free dim; use with_dims for others");
  }
  if (r0 < 0 || nr < 1 || r0 + nr > rows() || c0 < 0 || nc < 1 || c0 + nc > cols()) {
    throw Error(fmt::format("tile [{}:{}, {}:{}] is outside the [{}, {}] view", r0, r0 + nr, c0,
                            c0 + nc, rows(), cols()));
  }
  Tensor t = *this;
  const int sz = isa::size_bytes(ap.dtype);
  t.ap.offset += c0 * ap.dims[fd].stride * sz;
  t.ap.dims[fd].count = nc;
  if (ap.mem == Mem::hbm) {
    t.ap.offset += r0 * ap.dims[0].stride * sz;
    t.ap.dims[0].count = nr;
    t.ap.partitions = nr;
  } else {
    t.ap.start_partition += r0;
    t.ap.partitions = nr;
  }
  return t;
}

Tensor Tensor::with_dims(std::vector<isa::Dim> free_dims, std::int64_t extra_offset_elems) const {
  Tensor t = *this;
  t.ap.offset += extra_offset_elems * isa::size_bytes(ap.dtype);
  if (ap.mem == Mem::hbm) {
    free_dims.insert(free_dims.begin(), ap.dims[0]);
  }
  t.ap.dims = std::move(free_dims);
  return t;
}

namespace {
std::string loc_string(const std::source_location& l) {
  return fmt::format("{}:{}", std::filesystem::path(l.file_name()).filename().string(), l.line());
}
}  // namespace

Builder::Builder(const arch::ChipSpec& chip, int cores, int lnc) : chip_(chip) {
  if (lnc != 1 && lnc != 2) throw Error(fmt::format("lnc must be 1 or 2, got {}", lnc));
  if (cores % lnc != 0)
    throw Error(fmt::format("LNC={} needs an even number of cores, got {}", lnc, cores));
  if (cores < 1 || cores > chip.cores) {
    throw Error(fmt::format("a kernel for {} cores, but {} has {}", cores, chip.name, chip.cores));
  }
  prog_.arch = chip.name;
  prog_.lnc = lnc;
  prog_.semaphores = kQueueSemaphore0 + chip.dma.queues_per_engine;
  prog_.cores.resize(cores);
  sbuf_allocs_.resize(cores);
  psum_allocs_.resize(cores);
  sbuf_next_.assign(cores, 0);
  psum_next_.assign(cores, 0);
  accesses_.resize(cores);
  signals_.assign(cores, std::vector<std::int64_t>(prog_.semaphores, 0));
  known_.assign(cores, std::vector<std::vector<std::int64_t>>(
                           isa::kEngines, std::vector<std::int64_t>(prog_.semaphores, 0)));
}

void Builder::set_core(int core) {
  if (core < 0 || core >= static_cast<int>(prog_.cores.size())) {
    throw Error(fmt::format("core {} is outside this kernel's {} cores", core, prog_.cores.size()));
  }
  core_ = core;
}

Tensor Builder::hbm(const std::string& name, std::vector<std::int64_t> shape, DType dtype,
                    isa::TensorKind kind) {
  if (shape.empty()) throw Error(fmt::format("HBM tensor '{}' needs a shape", name));
  for (const auto& t : prog_.tensors)
    if (t.name == name) throw Error(fmt::format("HBM tensor '{}' declared twice", name));
  // The chip's HBM bounds every tensor (checked before any size is used,
  // in 128 bits so that no shape wraps).
  const std::int64_t cap = chip_.hbm_capacity.value();
  Int128 bytes = isa::size_bytes(dtype);
  for (const std::int64_t d : shape) {
    if (d < 1) throw Error(fmt::format("HBM tensor '{}': a dim of {} (need >= 1)", name, d));
    if (bytes <= cap) bytes *= d;
  }
  if (bytes > cap - next_hbm_ || (bytes / isa::size_bytes(dtype) / shape.back() > INT32_MAX))
    throw Error(fmt::format(
        "HBM tensor '{}' [{}] {} does not fit: {} bytes with the tensors before it, {} has {} "
        "bytes of HBM",
        name, fmt::join(shape, ", "), isa::name(dtype),
        bytes > cap ? fmt::format("more than {}", cap)
                    : fmt::format("{}", next_hbm_ + static_cast<std::int64_t>(bytes)),
        chip_.name, cap));
  isa::HbmTensor t{name, next_hbm_, shape, dtype, kind};
  // 64-byte aligned, packed one after another.
  next_hbm_ += (t.bytes() + 63) / 64 * 64;
  prog_.tensors.push_back(t);
  const std::int64_t cols = shape.back();
  const std::int64_t rows = t.elements() / cols;
  Tensor v;
  v.ap.mem = Mem::hbm;
  v.ap.dtype = dtype;
  v.ap.offset = t.address;
  v.ap.dims = {{cols, rows}, {1, cols}};
  v.ap.partitions = static_cast<int>(rows);
  return v;
}

Tensor Builder::alloc(Mem mem, int partitions, std::int64_t free, DType dtype,
                      std::source_location loc) {
  const bool ps = mem == Mem::psum;
  const int maxp = ps ? chip_.psum_partitions : chip_.sbuf_partitions;
  const std::int64_t cap =
      ps ? chip_.psum_partition_bytes.value() : chip_.sbuf_partition_bytes.value();
  if (partitions < 1 || partitions > maxp) {
    throw Error(fmt::format("{}: a {} tile of {} partitions ({} has {})", location(loc),
                            isa::mem_name(mem), partitions, chip_.name, maxp));
  }
  std::int64_t bytes = free * isa::size_bytes(dtype);
  const std::int64_t bank = chip_.psum_bank_bytes().value();
  // PSUM tiles start on a bank, or with packing (NKI kernels: several small
  // accumulators share a bank) anywhere a tile of at most a bank stays
  // inside one.
  const bool pack = ps && psum_packing_ && bytes <= bank;
  const std::int64_t align =
      ps ? (pack ? chip_.psum_min_align.value() : bank) : chip_.sbuf_min_align.value();
  bytes = (bytes + align - 1) / align * align;
  auto place = [&](std::int64_t start) {
    start = (start + align - 1) / align * align;
    if (pack && start % bank + bytes > bank) start = (start / bank + 1) * bank;
    return start;
  };
  auto& allocs = ps ? psum_allocs_[core_] : sbuf_allocs_[core_];
  std::sort(allocs.begin(), allocs.end(),
            [](const Alloc& a, const Alloc& b) { return a.lo < b.lo; });
  std::int64_t used = 0;
  for (const Alloc& a : allocs) used += a.hi - a.lo;
  // The first gap of `bytes` at or after `from` (the end of memory counts
  // as a gap when the tile fits before the capacity).
  auto fit_from = [&](std::int64_t from, std::int64_t& at) {
    at = from;
    for (const Alloc& a : allocs) {
      if (a.hi <= at) continue;
      if (a.lo - place(at) >= bytes) {
        at = place(at);
        return true;
      }
      at = std::max(at, a.hi);
    }
    at = place(at);
    return cap - at >= bytes;
  };
  auto& next = ps ? psum_next_ : sbuf_next_;
  std::int64_t at = 0;
  bool found = rotating_ && fit_from(next[core_], at);
  if (!found) found = fit_from(0, at);
  if (!found && !overcommit_) {
    throw Error(
        fmt::format("{}: {} allocation of {} bytes per partition does not fit: {} of {} bytes "
                    "per partition are in use (capacity)",
                    location(loc), isa::mem_name(mem), bytes, used, cap));
  }
  allocs.push_back({at, at + bytes});
  next[core_] = at + bytes;
  Tensor t;
  t.ap.mem = mem;
  t.ap.dtype = dtype;
  t.ap.offset = at;
  t.ap.start_partition = 0;
  t.ap.partitions = partitions;
  t.ap.dims = {{1, free}};
  return t;
}

Tensor Builder::sbuf(int partitions, std::int64_t free, DType dtype, std::source_location loc) {
  return alloc(Mem::sbuf, partitions, free, dtype, loc);
}
Tensor Builder::psum(int partitions, std::int64_t free, DType dtype, std::source_location loc) {
  return alloc(Mem::psum, partitions, free, dtype, loc);
}

Tensor Builder::sbuf_at(std::int64_t offset, int partitions, std::int64_t free, DType dtype) {
  const std::int64_t hi = offset + free * isa::size_bytes(dtype);
  for (const Alloc& a : sbuf_allocs_[core_]) {
    if (offset < a.hi && a.lo < hi) {
      throw Error(fmt::format("SBUF tile at bytes [{}, {}) overlaps the live allocation [{}, {})",
                              offset, hi, a.lo, a.hi));
    }
  }
  sbuf_allocs_[core_].push_back({offset, hi});
  Tensor t;
  t.ap.mem = Mem::sbuf;
  t.ap.dtype = dtype;
  t.ap.offset = offset;
  t.ap.partitions = partitions;
  t.ap.dims = {{1, free}};
  return t;
}

Tensor Builder::place(Mem mem, int start_partition, std::int64_t offset, int partitions,
                      std::int64_t free, DType dtype) {
  const bool ps = mem == Mem::psum;
  const int maxp = ps ? chip_.psum_partitions : chip_.sbuf_partitions;
  const std::int64_t cap =
      ps ? chip_.psum_partition_bytes.value() : chip_.sbuf_partition_bytes.value();
  const std::int64_t hi = offset + free * isa::size_bytes(dtype);
  if (start_partition < 0 || partitions < 1 || start_partition + partitions > maxp || offset < 0 ||
      hi > cap)
    throw Error(
        fmt::format("a {} tile placed at partitions [{}, {}) bytes [{}, {}) is outside {}'s "
                    "{} partitions of {} bytes",
                    isa::mem_name(mem), start_partition, start_partition + partitions, offset, hi,
                    chip_.name, maxp, cap));
  (ps ? psum_allocs_ : sbuf_allocs_)[core_].push_back({offset, hi});
  Tensor t;
  t.ap.mem = mem;
  t.ap.dtype = dtype;
  t.ap.offset = offset;
  t.ap.start_partition = start_partition;
  t.ap.partitions = partitions;
  t.ap.dims = {{1, free}};
  return t;
}

void Builder::release(const Tensor& t) {
  if (t.ap.mem == Mem::hbm) return;
  auto& allocs = t.ap.mem == Mem::psum ? psum_allocs_[core_] : sbuf_allocs_[core_];
  for (auto it = allocs.begin(); it != allocs.end(); ++it) {
    if (it->lo == t.ap.offset) {
      allocs.erase(it);
      return;
    }
  }
  throw Error(fmt::format("release of a {} tile at byte {} that is not allocated",
                          isa::mem_name(t.ap.mem), t.ap.offset));
}

// Adds the waits `in` needs given earlier accesses, then records its own
// accesses under `producer`'s next signal. Operands [0, first_read) are
// written, the rest read (plus extra reads of written operands, e.g.
// accumulate).
void Builder::record(Instruction& in, int producer, std::size_t first_read, bool read_dst) {
  for (const auto& ap : in.operands) {
    if (ap.offset_reg >= 0) {
      throw NotSupported(
          "automatic semaphores for register-addressed operands (a loop's addresses are known only "
          "at run time): emit loop code with explicit waits and signals through Builder::emit_raw");
    }
  }
  auto& acc = accesses_[core_];
  const int consumer = static_cast<int>(in.engine);
  auto box = [](const AccessPattern& ap, bool write, int prod, std::int64_t seq) {
    Access a{ap.mem, 0, 1, ap.min_byte(), ap.max_byte(), prod, seq, write};
    if (ap.mem != Mem::hbm) {
      a.r0 = ap.start_partition;
      a.r1 = ap.start_partition + ap.partitions;
    }
    return a;
  };
  std::vector<Access> mine;
  const std::int64_t seq = signals_[core_][producer] + 1;
  for (std::size_t i = 0; i < in.operands.size(); ++i) {
    const bool write = i < first_read;
    mine.push_back(box(in.operands[i], write, producer, seq));
    if (write && read_dst) mine.push_back(box(in.operands[i], false, producer, seq));
  }
  // Waits: for each earlier producer, the latest conflicting access.
  std::vector<std::int64_t> need(prog_.semaphores, 0);
  const bool in_order_engine = producer < kQueueSemaphore0;
  for (const Access& m : mine) {
    for (int w = m.write ? 0 : 1; w < 2; ++w) {  // a read conflicts with writes only
      for (const Access& a : acc[bucket(m.mem, w == 1)]) {
        if (a.producer == producer && in_order_engine) continue;  // same engine: program order
        if (a.r0 < m.r1 && m.r0 < a.r1 && a.b0 < m.b1 && m.b0 < a.b1)
          need[a.producer] = std::max(need[a.producer], a.seq);
      }
    }
  }
  auto& known = known_[core_][consumer];
  for (int s = 0; s < prog_.semaphores; ++s) {
    if (need[s] > known[s]) {
      in.waits.push_back({s, need[s]});
      known[s] = need[s];
    }
  }
  // Record, dropping older accesses that this one covers (they are now
  // ordered before it, and so before anything that must wait for it): a
  // write covers every access, a read the same producer's reads.
  for (const Access& m : mine) {
    for (int w = 0; w < (m.write ? 2 : 1); ++w) {
      auto& list = acc[bucket(m.mem, w == 1)];
      list.erase(std::remove_if(list.begin(), list.end(),
                                [&](const Access& a) {
                                  return a.r0 >= m.r0 && a.r1 <= m.r1 && a.b0 >= m.b0 &&
                                         a.b1 <= m.b1 && (m.write || a.producer == m.producer);
                                }),
                 list.end());
    }
    acc[bucket(m.mem, m.write)].push_back(m);
  }
  in.signals.push_back(producer);
  signals_[core_][producer] = seq;
  if (last_signal_.size() < prog_.cores.size()) last_signal_.resize(prog_.cores.size(), {-1, 0});
  last_signal_[core_] = {producer, seq};
}

void Builder::emit(Instruction in, std::source_location loc) {
  if (in.loc.empty()) in.loc = location(loc);
  std::size_t writes = 1;
  bool read_dst = false;
  switch (in.op) {
    case Opcode::load_stationary:
      throw Error(
          "emit load_stationary through Builder::matmul (it pairs it with multiply_moving)");
    case Opcode::multiply_moving:
      read_dst = in.accumulate;
      break;
    case Opcode::dma_copy:
    case Opcode::dma_gather:
    case Opcode::dma_scatter:
      // An accumulating DMA reads its destination. A scatter's destination
      // is its whole HBM view (the rows are data): every later access of
      // that view waits for it, and it for every earlier one.
      read_dst = in.accumulate;
      break;
    case Opcode::copy_predicated:
    case Opcode::stream_shuffle:
      read_dst = true;  // unselected elements / partitions keep their value
      break;
    case Opcode::quantize_mx:
      writes = 2;  // data and scales
      break;
    default:
      break;
  }
  const bool dma = isa::is_dma(in.op);
  const int producer = dma ? kQueueSemaphore0 + in.queue : engine_semaphore(in.engine);
  const bool last_written = in.op == Opcode::activation || in.op == Opcode::exponential ||
                            in.op == Opcode::select_reduce || in.op == Opcode::range_select ||
                            in.op == Opcode::match_replace8;
  if (last_written && in.accumulate) {
    // The row sums / maxima / indices (last operand) are written too: move
    // them to the front.
    std::rotate(in.operands.rbegin(), in.operands.rbegin() + 1, in.operands.rend());
    writes = 2;
    record(in, producer, writes, false);
    std::rotate(in.operands.begin(), in.operands.begin() + 1, in.operands.end());
  } else {
    record(in, producer, writes, read_dst);
  }
  prog_.cores[core_].streams[static_cast<int>(in.engine)].push_back(std::move(in));
}

void Builder::dma_copy(const Tensor& dst, const Tensor& src, int queue, bool accumulate,
                       Engine engine, std::source_location loc) {
  Instruction in;
  in.op = Opcode::dma_copy;
  in.engine = engine;
  in.operands = {dst.ap, src.ap};
  in.accumulate = accumulate;
  in.hwdge = hwdge_;
  if (queue < 0) {
    queue = next_queue_;
    next_queue_ = (next_queue_ + 1) % chip_.dma.queues_per_engine;
  }
  in.queue = queue;
  emit(std::move(in), loc);
}

void Builder::dma_gather(const Tensor& dst, const Tensor& table, const Tensor& index, int queue,
                         bool oob_skip, Engine engine, std::source_location loc) {
  Instruction in;
  in.op = Opcode::dma_gather;
  in.engine = engine;
  in.operands = {dst.ap, table.ap, index.ap};  // the index tile is read like the table
  in.oob_skip = oob_skip;
  in.queue = queue < 0 ? take_queue() : queue;
  emit(std::move(in), loc);
}

void Builder::dma_scatter(const Tensor& table, const Tensor& src, const Tensor& index, int queue,
                          bool accumulate, Engine engine, std::source_location loc) {
  Instruction in;
  in.op = Opcode::dma_scatter;
  in.engine = engine;
  in.operands = {table.ap, src.ap, index.ap};
  in.accumulate = accumulate;
  in.queue = queue < 0 ? take_queue() : queue;
  emit(std::move(in), loc);
}

int Builder::take_queue() {
  const int q = next_queue_;
  next_queue_ = (next_queue_ + 1) % chip_.dma.queues_per_engine;
  return q;
}

namespace {
std::vector<isa::AccessPattern> aps(std::initializer_list<const Tensor*> ts) {
  std::vector<isa::AccessPattern> v;
  for (const Tensor* t : ts)
    if (t) v.push_back(t->ap);
  return v;
}
}  // namespace

void Builder::emit_matmul(const Tensor& dst, const Tensor& stationary,
                          const Tensor* stationary_scale, const Tensor& moving,
                          const Tensor* moving_scale, bool accumulate, isa::PerfMode perf,
                          std::source_location loc) {
  Instruction mm;
  mm.perf = perf;
  mm.op = Opcode::multiply_moving;
  mm.engine = Engine::tensor;
  // The stationary operands are listed for dependencies only, then dropped.
  mm.operands = aps({&dst, &moving, moving_scale, &stationary, stationary_scale});
  mm.accumulate = accumulate;
  mm.loc = location(loc);
  record(mm, engine_semaphore(Engine::tensor), 1, accumulate);
  mm.operands.resize(moving_scale ? 3 : 2);
  // The weight load goes first and carries the waits; it signals nothing
  // (its reads are accounted to the multiply, which completes after it).
  Instruction ls;
  ls.op = Opcode::load_stationary;
  ls.engine = Engine::tensor;
  ls.operands = aps({&stationary, stationary_scale});
  ls.loc = mm.loc;
  ls.perf = perf;
  ls.waits = std::move(mm.waits);
  mm.waits.clear();
  auto& stream = prog_.cores[core_].streams[static_cast<int>(Engine::tensor)];
  stream.push_back(std::move(ls));
  stream.push_back(std::move(mm));
}

void Builder::matmul(const Tensor& dst, const Tensor& stationary, const Tensor& moving,
                     bool accumulate, isa::PerfMode perf, std::source_location loc) {
  emit_matmul(dst, stationary, nullptr, moving, nullptr, accumulate, perf, loc);
}

void Builder::matmul_mx(const Tensor& dst, const Tensor& stationary, const Tensor& stationary_scale,
                        const Tensor& moving, const Tensor& moving_scale, bool accumulate,
                        std::source_location loc) {
  emit_matmul(dst, stationary, &stationary_scale, moving, &moving_scale, accumulate,
              isa::PerfMode::none, loc);
}

void Builder::quantize_mx(const Tensor& dst, const Tensor& dst_scale, const Tensor& src,
                          std::source_location loc) {
  Instruction in;
  in.op = Opcode::quantize_mx;
  in.engine = Engine::vector;
  in.operands = {dst.ap, dst_scale.ap, src.ap};
  emit(std::move(in), loc);
}

void Builder::transpose(const Tensor& dst, const Tensor& src, std::source_location loc) {
  Instruction in;
  in.op = Opcode::transpose;
  in.engine = Engine::tensor;
  in.operands = {dst.ap, src.ap};
  emit(std::move(in), loc);
}

void Builder::tensor_tensor(const Tensor& dst, const Tensor& a, const Tensor& b, isa::AluOp op,
                            Engine engine, std::source_location loc) {
  Instruction in;
  in.op = Opcode::tensor_tensor;
  in.engine = engine;
  in.operands = {dst.ap, a.ap, b.ap};
  in.alu0 = op;
  emit(std::move(in), loc);
}

void Builder::scalar_tensor_tensor(const Tensor& dst, const Tensor& data, isa::AluOp op0,
                                   float imm0, const Tensor* col0, isa::AluOp op1, const Tensor& b,
                                   bool reverse0, bool reverse1, Engine engine,
                                   std::source_location loc) {
  Instruction in;
  in.op = Opcode::scalar_tensor_tensor;
  in.engine = engine;
  in.operands = {dst.ap, data.ap, b.ap};
  if (col0) {
    in.operands.push_back(col0->ap);
    in.col0 = true;
  }
  in.alu0 = op0;
  in.imm0 = imm0;
  in.alu1 = op1;
  in.reverse0 = reverse0;
  in.reverse1 = reverse1;
  emit(std::move(in), loc);
}

void Builder::tensor_scalar(const Tensor& dst, const Tensor& src, isa::AluOp op0, float imm0,
                            isa::AluOp op1, float imm1, Engine engine, std::source_location loc) {
  Instruction in;
  in.op = Opcode::tensor_scalar;
  in.engine = engine;
  in.operands = {dst.ap, src.ap};
  in.alu0 = op0;
  in.imm0 = imm0;
  in.alu1 = op1;
  in.imm1 = imm1;
  emit(std::move(in), loc);
}

void Builder::tensor_scalar(const Tensor& dst, const Tensor& src, isa::AluOp op0,
                            const Tensor& col0, isa::AluOp op1, float imm1, const Tensor* col1,
                            Engine engine, std::source_location loc) {
  Instruction in;
  in.op = Opcode::tensor_scalar;
  in.engine = engine;
  in.operands = {dst.ap, src.ap, col0.ap};
  in.col0 = true;
  if (col1) {
    in.operands.push_back(col1->ap);
    in.col1 = true;
  }
  in.alu0 = op0;
  in.alu1 = op1;
  in.imm1 = imm1;
  emit(std::move(in), loc);
}

void Builder::tensor_copy(const Tensor& dst, const Tensor& src, Engine engine,
                          std::source_location loc) {
  Instruction in;
  in.op = Opcode::tensor_copy;
  in.engine = engine;
  in.operands = {dst.ap, src.ap};
  emit(std::move(in), loc);
}

void Builder::tensor_reduce(const Tensor& dst, const Tensor& src, isa::AluOp op, bool negate,
                            std::source_location loc) {
  Instruction in;
  in.op = Opcode::tensor_reduce;
  in.engine = Engine::vector;
  in.operands = {dst.ap, src.ap};
  in.alu0 = op;
  in.negate = negate;
  emit(std::move(in), loc);
}

void Builder::memset(const Tensor& dst, float value, Engine engine, std::source_location loc) {
  Instruction in;
  in.op = Opcode::memset;
  in.engine = engine;
  in.operands = {dst.ap};
  in.imm0 = value;
  emit(std::move(in), loc);
}

void Builder::activation(const Tensor& dst, isa::ActFunc func, const Tensor& src,
                         const Tensor* bias, float scale, const Tensor* row_sums,
                         std::source_location loc) {
  Instruction in;
  in.op = Opcode::activation;
  in.engine = Engine::scalar;
  in.operands = {dst.ap, src.ap};
  if (bias) in.operands.push_back(bias->ap);
  if (row_sums) {
    in.operands.push_back(row_sums->ap);
    in.accumulate = true;
  }
  in.func = func;
  in.scale = scale;
  emit(std::move(in), loc);
}

void Builder::iota(const Tensor& dst, float base, float per_partition, float per_element,
                   std::source_location loc) {
  Instruction in;
  in.op = Opcode::iota;
  in.engine = Engine::gpsimd;
  in.operands = {dst.ap};
  in.imm0 = base;
  in.imm1 = per_partition;
  in.imm2 = per_element;
  emit(std::move(in), loc);
}

namespace {
Instruction make(Opcode op, Engine e, std::vector<isa::AccessPattern> ops) {
  Instruction in;
  in.op = op;
  in.engine = e;
  in.operands = std::move(ops);
  return in;
}
}  // namespace

void Builder::reciprocal(const Tensor& dst, const Tensor& src, std::source_location loc) {
  emit(make(Opcode::reciprocal, Engine::vector, {dst.ap, src.ap}), loc);
}
void Builder::bn_stats(const Tensor& dst, const Tensor& src, std::source_location loc) {
  emit(make(Opcode::bn_stats, Engine::vector, {dst.ap, src.ap}), loc);
}
void Builder::bn_aggr(const Tensor& dst, const Tensor& src, std::source_location loc) {
  emit(make(Opcode::bn_aggr, Engine::vector, {dst.ap, src.ap}), loc);
}
void Builder::select(const Tensor& dst, const Tensor& pred, const Tensor& a, const Tensor& b,
                     std::source_location loc) {
  emit(make(Opcode::select, Engine::vector, {dst.ap, pred.ap, a.ap, b.ap}), loc);
}
void Builder::copy_predicated(const Tensor& dst, const Tensor& pred, const Tensor& src,
                              std::source_location loc) {
  emit(make(Opcode::copy_predicated, Engine::vector, {dst.ap, pred.ap, src.ap}), loc);
}
void Builder::exponential(const Tensor& dst, const Tensor& src, const Tensor* subtract,
                          const Tensor* row_sums, std::source_location loc) {
  Instruction in = make(Opcode::exponential, Engine::vector, {dst.ap, src.ap});
  if (subtract) in.operands.push_back(subtract->ap);
  if (row_sums) {
    in.operands.push_back(row_sums->ap);
    in.accumulate = true;
  }
  emit(std::move(in), loc);
}
void Builder::affine_select(const Tensor& dst, const Tensor& src, float offset, float per_partition,
                            float per_element, isa::AluOp cmp, float fill,
                            std::source_location loc) {
  Instruction in = make(Opcode::affine_select, Engine::gpsimd, {dst.ap, src.ap});
  in.imm0 = offset;
  in.imm1 = per_partition;
  in.imm2 = per_element;
  in.alu0 = cmp;
  in.imm3 = fill;
  emit(std::move(in), loc);
}
void Builder::partition_reduce(const Tensor& dst, const Tensor& src, isa::AluOp op,
                               std::source_location loc) {
  Instruction in = make(Opcode::partition_reduce, Engine::gpsimd, {dst.ap, src.ap});
  in.alu0 = op;
  emit(std::move(in), loc);
}
void Builder::dma_transpose(const Tensor& dst, const Tensor& src, int queue,
                            std::source_location loc) {
  Instruction in = make(Opcode::dma_transpose, Engine::sync, {dst.ap, src.ap});
  in.hwdge = hwdge_;
  if (queue < 0) {
    queue = next_queue_;
    next_queue_ = (next_queue_ + 1) % chip_.dma.queues_per_engine;
  }
  in.queue = queue;
  emit(std::move(in), loc);
}
void Builder::vector_transpose(const Tensor& dst, const Tensor& src, std::source_location loc) {
  emit(make(Opcode::transpose, Engine::vector, {dst.ap, src.ap}), loc);
}

void Builder::emit_raw(isa::Instruction in, std::source_location loc) {
  if (in.loc.empty()) in.loc = location(loc);
  for (int sg : in.signals) {
    if (sg >= 0 && sg < prog_.semaphores) ++signals_[core_][sg];
  }
  prog_.cores[core_].streams[static_cast<int>(in.engine)].push_back(std::move(in));
}

std::string Builder::location(const std::source_location& loc) const {
  return location_override_.empty() ? loc_string(loc) : location_override_;
}

isa::Program Builder::finish() {
  for (const SyncWait& w : sync_waits_) {
    Instruction& in = prog_.cores[w.core].streams[w.engine][w.index];
    for (int peer : w.peers) {
      const auto it = sync_points_.find({peer, w.key});
      if (it == sync_points_.end())
        throw Error(
            fmt::format("{}: core {} waits for core {} at '{}', which core {} never reaches",
                        in.loc, w.core, peer, w.key, peer));
      in.waits.push_back({it->second.first, it->second.second, -1, peer});
    }
  }
  sync_waits_.clear();
  for (const SyncWait& d : sync_dmas_) {
    Instruction& in = prog_.cores[d.core].streams[d.engine][d.index];
    const auto it = sync_operands_.find({d.peers[0], d.key});
    if (it == sync_operands_.end())
      throw Error(fmt::format("{}: core {} sends to core {}'s '{}', which core {} never receives",
                              in.loc, d.core, d.peers[0], d.key, d.peers[0]));
    if (it->second.elements() != in.operands[1].elements())
      throw Error(fmt::format("{}: core {} sends {} elements, core {} receives {}", in.loc, d.core,
                              in.operands[1].elements(), d.peers[0], it->second.elements()));
    in.operands[0] = it->second;
  }
  sync_dmas_.clear();
  return prog_;
}

}  // namespace tern::kernel
