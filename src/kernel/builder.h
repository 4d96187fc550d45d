// The C++ kernel builder: write kernels as sequential code in the style of
// nki.isa (destination first); the builder allocates SBUF/PSUM, records
// which memory each instruction reads and writes, and inserts the
// semaphore waits between engines and DMA queues (RAW, WAR, WAW), so the
// program is correct however the engines overlap.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <source_location>
#include <string>
#include <vector>

#include "arch/chip.h"
#include "isa/program.h"

namespace tern::kernel {

using isa::DType;

// A view of memory: an access pattern plus convenience slicing. Views are
// free (no instruction).
struct Tensor {
  isa::AccessPattern ap;

  int rows() const { return ap.rows(); }
  std::int64_t cols() const { return ap.free_size(); }
  DType dtype() const { return ap.dtype; }
  // Rows [r0, r0 + nr) and columns [c0, c0 + nc) of a 2-D view (one free dim).
  Tensor tile(int r0, int nr, std::int64_t c0, std::int64_t nc) const;
  // The same memory reinterpreted with another free pattern (elements).
  Tensor with_dims(std::vector<isa::Dim> free_dims, std::int64_t extra_offset_elems = 0) const;
};

class Builder {
 public:
  // `cores` physical cores; lnc = 2 groups them in pairs into logical cores
  // (v3+), like a kernel launched with a grid of 2.
  explicit Builder(const arch::ChipSpec& chip, int cores = 1, int lnc = 1);

  // Row-major HBM tensor [rows, cols] (or any shape: the last dim is
  // contiguous, the rest folds into rows).
  Tensor hbm(const std::string& name, std::vector<std::int64_t> shape, DType dtype,
             isa::TensorKind kind);
  // A [partitions, free] tile in SBUF / PSUM of the current core. PSUM tiles
  // start on a bank. Throws tern::Error when it does not fit.
  Tensor sbuf(int partitions, std::int64_t free, DType dtype,
              std::source_location loc = std::source_location::current());
  Tensor psum(int partitions, std::int64_t free, DType dtype = DType::fp32,
              std::source_location loc = std::source_location::current());
  // Gives a tile's memory back (later instructions may reuse it; the
  // builder orders them after every use of the old tile).
  void release(const Tensor& t);
  // Places a tile at an explicit byte offset (tests of the rules); an
  // overlap with a live allocation is an error.
  Tensor sbuf_at(std::int64_t offset, int partitions, std::int64_t free, DType dtype);
  // A tile the kernel places itself (NKI nl.ndarray(address=)): partitions
  // from `start_partition`, bytes from `offset` of each. It may overlap other
  // placed tiles (a kernel aliasing memory on purpose); automatic
  // allocations keep clear of it while it lives.
  Tensor place(isa::Mem mem, int start_partition, std::int64_t offset, int partitions,
               std::int64_t free, DType dtype);

  void set_core(int core);
  // PSUM tiles of at most a bank share banks (each stays inside one),
  // as NKI's allocator places them; off: every PSUM tile starts a bank.
  void set_psum_packing(bool on) { psum_packing_ = on; }
  // Next-fit placement: a new tile goes in the first gap at or after the
  // end of the previous allocation in that memory, wrapping to the start
  // when none is left, so memory just freed is reused last. A kernel whose
  // loop tiles are freed and allocated again each iteration then gets as
  // many buffers per tile as the memory holds (the NKI compiler allocates
  // loop tiles with several buffers so iterations overlap); off: first fit.
  void set_rotating_allocation(bool on) { rotating_ = on; }
  // The DMA copies and transposes recorded while on take their descriptors
  // from the hardware DGE (NKI dge_mode.hwdge; v3+, Scalar or Sync engine).
  void set_hardware_dge(bool on) { hwdge_ = on; }
  // With overcommit, SBUF / PSUM allocations past the capacity succeed (at
  // addresses beyond it): a trace that only measures tiles' lifetimes, never
  // run (the program's rule checks refuse those addresses).
  void set_overcommit(bool on) { overcommit_ = on; }
  int core() const { return core_; }

  // ---- instructions (each records the caller's source location)
  // A DMA triggered from `engine`'s instruction stream (the Sync engine by
  // default; a compute engine triggers without blocking the Sync queue, e.g.
  // a store right after the instruction that produced the data).
  void dma_copy(const Tensor& dst, const Tensor& src, int queue = -1, bool accumulate = false,
                isa::Engine engine = isa::Engine::sync,
                std::source_location loc = std::source_location::current());
  // Indirect DMA (nki.isa.dma_copy with an indirect access pattern):
  // dst[p, slot k] = table[index[p, k], :] for dst an SBUF [P, K * F] tile
  // (K slots of F elements), table an HBM [rows, F] view and index an SBUF
  // [P, K] int32/uint32 tile (K = 1: one row per partition). An index
  // outside [0, rows) stops the run, or with oob_skip leaves its slot as it
  // was. Dependencies: the index tile and the whole table view are read.
  void dma_gather(const Tensor& dst, const Tensor& table, const Tensor& index, int queue = -1,
                  bool oob_skip = false, isa::Engine engine = isa::Engine::sync,
                  std::source_location loc = std::source_location::current());
  // table[index[p, k], :] = src[p, slot k] (accumulate: +=, in FP32,
  // duplicate indices adding up in the index tile's element order:
  // partition by partition, slot by slot within a partition). The rows are
  // data, so the whole table view counts as written (and read): scatters
  // into one view are ordered one after another.
  void dma_scatter(const Tensor& table, const Tensor& src, const Tensor& index, int queue = -1,
                   bool accumulate = false, isa::Engine engine = isa::Engine::sync,
                   std::source_location loc = std::source_location::current());
  // dst_psum[M, N] (+)= stationary[K, M]^T @ moving[K, N]: load_stationary + multiply_moving.
  // perf = double_row (FP8, v3+): stationary [K, 2M] and moving [K, 2N] hold
  // contraction rows [0, K) and [K, 2K) side by side (see isa::PerfMode).
  void matmul(const Tensor& dst, const Tensor& stationary, const Tensor& moving, bool accumulate,
              isa::PerfMode perf = isa::PerfMode::none,
              std::source_location loc = std::source_location::current());
  // MX matmul (v4): x4 data with E8M0 scales [P/8, F]; contraction 4P.
  void matmul_mx(const Tensor& dst, const Tensor& stationary, const Tensor& stationary_scale,
                 const Tensor& moving, const Tensor& moving_scale, bool accumulate,
                 std::source_location loc = std::source_location::current());
  // Vector QuantizeMX (v4): dst x4 [P, F/4] and dst_scale [P/8, F/4] from src [P, F].
  void quantize_mx(const Tensor& dst, const Tensor& dst_scale, const Tensor& src,
                   std::source_location loc = std::source_location::current());
  void transpose(const Tensor& dst, const Tensor& src,
                 std::source_location loc = std::source_location::current());
  void tensor_tensor(const Tensor& dst, const Tensor& a, const Tensor& b, isa::AluOp op,
                     isa::Engine engine = isa::Engine::vector,
                     std::source_location loc = std::source_location::current());
  void tensor_scalar(const Tensor& dst, const Tensor& src, isa::AluOp op0, float imm0,
                     isa::AluOp op1 = isa::AluOp::bypass, float imm1 = 0.0f,
                     isa::Engine engine = isa::Engine::vector,
                     std::source_location loc = std::source_location::current());
  // As above with operand 0 a per-partition column `col0` [P, 1] (row r uses
  // col0[r]; NKI's tensor_scalar with a tensor operand), and operand 1 either
  // the column `col1` (if given) or imm1. Same cost as the immediate form.
  void tensor_scalar(const Tensor& dst, const Tensor& src, isa::AluOp op0, const Tensor& col0,
                     isa::AluOp op1 = isa::AluOp::bypass, float imm1 = 0.0f,
                     const Tensor* col1 = nullptr, isa::Engine engine = isa::Engine::vector,
                     std::source_location loc = std::source_location::current());
  // dst = (data op0 s) op1 b in FP32 (nki.isa.scalar_tensor_tensor), s the
  // immediate `imm0` or, with `col0`, a per-partition column [P, 1];
  // reverse0 / reverse1 put s / b first. The cost of one tensor_tensor.
  void scalar_tensor_tensor(const Tensor& dst, const Tensor& data, isa::AluOp op0, float imm0,
                            const Tensor* col0, isa::AluOp op1, const Tensor& b,
                            bool reverse0 = false, bool reverse1 = false,
                            isa::Engine engine = isa::Engine::vector,
                            std::source_location loc = std::source_location::current());
  void tensor_copy(const Tensor& dst, const Tensor& src, isa::Engine engine = isa::Engine::vector,
                   std::source_location loc = std::source_location::current());
  void tensor_reduce(const Tensor& dst, const Tensor& src, isa::AluOp op, bool negate = false,
                     std::source_location loc = std::source_location::current());
  void memset(const Tensor& dst, float value, isa::Engine engine = isa::Engine::vector,
              std::source_location loc = std::source_location::current());
  void activation(const Tensor& dst, isa::ActFunc func, const Tensor& src,
                  const Tensor* bias = nullptr, float scale = 1.0f,
                  const Tensor* row_sums = nullptr,
                  std::source_location loc = std::source_location::current());
  // dst[p, i] = base + per_partition * p + per_element * i (i: flat free index).
  void iota(const Tensor& dst, float base, float per_partition, float per_element = 1.0f,
            std::source_location loc = std::source_location::current());

  void reciprocal(const Tensor& dst, const Tensor& src,
                  std::source_location loc = std::source_location::current());
  // dst [P, 6] statistics of src [P, <= 512]; bn_aggr folds [P, 6k] into (mean, variance).
  void bn_stats(const Tensor& dst, const Tensor& src,
                std::source_location loc = std::source_location::current());
  void bn_aggr(const Tensor& dst, const Tensor& src,
               std::source_location loc = std::source_location::current());
  void select(const Tensor& dst, const Tensor& pred, const Tensor& a, const Tensor& b,
              std::source_location loc = std::source_location::current());
  void copy_predicated(const Tensor& dst, const Tensor& pred, const Tensor& src,
                       std::source_location loc = std::source_location::current());
  // v4 fast exp: dst = exp(src - subtract[p]), optional row sums.
  void exponential(const Tensor& dst, const Tensor& src, const Tensor* subtract = nullptr,
                   const Tensor* row_sums = nullptr,
                   std::source_location loc = std::source_location::current());
  // Keeps src where (offset + per_partition * p + per_element * i) cmp 0, else fill.
  void affine_select(const Tensor& dst, const Tensor& src, float offset, float per_partition,
                     float per_element, isa::AluOp cmp, float fill,
                     std::source_location loc = std::source_location::current());
  void partition_reduce(const Tensor& dst, const Tensor& src, isa::AluOp op,
                        std::source_location loc = std::source_location::current());
  void dma_transpose(const Tensor& dst, const Tensor& src, int queue = -1,
                     std::source_location loc = std::source_location::current());
  void vector_transpose(const Tensor& dst, const Tensor& src,
                        std::source_location loc = std::source_location::current());

  // Cross-core synchronization of a launch grid's programs (nki.isa
  // core_barrier and sendrecv; builder_sync.cpp). core_sync emits a
  // no-data instruction on `engine` ordered after this core's earlier
  // accesses of `reads` and before its later accesses of `writes`.
  // sync_point names this core's latest instruction `key`. sync_wait emits
  // a core_sync that also waits for each peer core's instruction named
  // `key`; the waits resolve in finish(), so a peer traced later counts.
  // sync_operand names a view of this core `key`; dma_to_core copies this
  // core's SBUF `src` into the view core `peer` names `dst_key` (resolved in
  // finish(), like the waits).
  void core_sync(isa::Engine engine, const std::vector<Tensor>& writes,
                 const std::vector<Tensor>& reads,
                 std::source_location loc = std::source_location::current());
  void sync_point(const std::string& key);
  void sync_wait(isa::Engine engine, const std::string& key, const std::vector<int>& peers,
                 const std::vector<Tensor>& writes,
                 std::source_location loc = std::source_location::current());
  void sync_operand(const std::string& key, const Tensor& view);
  void dma_to_core(const std::string& dst_key, const Tensor& src, int peer,
                   isa::Engine engine = isa::Engine::sync,
                   std::source_location loc = std::source_location::current());

  // Emits a raw instruction (operands, parameters); waits and signals are
  // added by the builder.
  void emit(isa::Instruction in, std::source_location loc = std::source_location::current());

  // Appends an instruction exactly as given: no dependency tracking, no
  // added waits or signals (loops, hand-synchronized code). Its signals still
  // count, so later automatic waits on the same semaphores stay right only if
  // the raw code signals once per emitted instruction.
  void emit_raw(isa::Instruction in, std::source_location loc = std::source_location::current());

  // Records `where` ("kernel.py:12") as the source location of the next
  // instructions instead of the C++ caller's (frontends that trace kernels
  // written in another language); empty restores the default.
  void set_location(std::string where) { location_override_ = std::move(where); }

  isa::Program finish();

 private:
  // Semaphores: one per compute engine (its Engine value, 0..3), then one
  // per DMA queue q at kQueueSemaphore0 + q.
  static constexpr int kQueueSemaphore0 = 4;
  static int engine_semaphore(isa::Engine e) { return static_cast<int>(e); }
  static std::size_t bucket(isa::Mem m, bool write) {
    return static_cast<std::size_t>(m) * 2 + (write ? 1 : 0);
  }
  struct Alloc {
    std::int64_t lo, hi;
  };
  struct Access {
    isa::Mem mem;
    std::int64_t r0, r1, b0, b1;
    int producer;  // semaphore of the engine or DMA queue
    std::int64_t seq;
    bool write;
  };
  Tensor alloc(isa::Mem mem, int partitions, std::int64_t free, DType dtype,
               std::source_location loc);
  void emit_matmul(const Tensor& dst, const Tensor& stationary, const Tensor* stationary_scale,
                   const Tensor& moving, const Tensor* moving_scale, bool accumulate,
                   isa::PerfMode perf, std::source_location loc);
  void record(isa::Instruction& in, int producer, std::size_t first_read, bool read_dst);
  int take_queue();  // the next DMA queue, round robin

  const arch::ChipSpec& chip_;
  isa::Program prog_;
  int core_ = 0;
  std::int64_t next_hbm_ = 0;
  std::vector<std::vector<Alloc>> sbuf_allocs_, psum_allocs_;  // per core
  // Earlier accesses still to be ordered against, per core, bucketed by
  // memory and by read / write (a read only conflicts with writes, so a
  // read scans one bucket: kernels read far more than they write).
  using AccessBuckets = std::array<std::vector<Access>, 6>;  // [mem * 2 + write]
  std::vector<AccessBuckets> accesses_;
  std::vector<std::vector<std::int64_t>> signals_;             // [core][sem] count
  std::vector<std::vector<std::vector<std::int64_t>>> known_;  // [core][engine][sem] waited
  int next_queue_ = 0;
  bool psum_packing_ = false;
  bool rotating_ = false;
  bool hwdge_ = false;
  std::vector<std::int64_t> sbuf_next_, psum_next_;  // per core: where next fit starts
  bool overcommit_ = false;
  struct SyncWait {
    int core, engine;
    std::size_t index;
    std::string key;
    std::vector<int> peers;
  };
  std::vector<std::pair<int, std::int64_t>> last_signal_;  // per core: (semaphore, count)
  std::map<std::pair<int, std::string>, std::pair<int, std::int64_t>> sync_points_;
  std::vector<SyncWait> sync_waits_;
  std::map<std::pair<int, std::string>, isa::AccessPattern> sync_operands_;
  std::vector<SyncWait> sync_dmas_;  // DMAs whose destination is a peer's named view
  std::string location_override_;
  std::string location(const std::source_location& loc) const;
};

}  // namespace tern::kernel
