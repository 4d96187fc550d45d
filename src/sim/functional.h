// The simulator's functional model: the state one run keeps (Tensor
// engine weights, accumulator registers) and what each instruction does to
// the bytes of SBUF, PSUM and HBM. Internal to sim: scheduler.cpp orders
// instructions and replay.cpp replays a recorded order; functional_*.cpp
// execute them.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <omp.h>

#include "num/xorwow.h"
#include "sim/memory.h"
#include "sim/simulator.h"
#include "sim/walk.h"
#include "util/error.h"

namespace tern::sim {

// An allocator that leaves new floats uninitialized: the functional model's
// row buffers are written in full before they are read, and zero-filling
// them was a tenth of a training step.
template <typename T>
struct NoInit : std::allocator<T> {
  using value_type = T;
  template <typename U>
  struct rebind {
    using other = NoInit<U>;
  };
  NoInit() = default;
  template <typename U>
  NoInit(const NoInit<U>&) {}
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0) {
      ::new (static_cast<void*>(p)) U;
    } else {
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
  }
};
using Floats = std::vector<float, NoInit<float>>;

using isa::AccessPattern;
using isa::DType;
using isa::Engine;
using isa::Instruction;
using isa::Mem;
using isa::Opcode;

struct Simulator::Impl {
  Simulator& s;
  const Options& opt;
  RunStats stats;
  std::uint64_t serial = 0;   // instructions executed, numbers SR streams
  Region* region_ = nullptr;  // row()'s last HBM region (valid for this run's load)

  struct Stationary {
    int k = 0, m = 0;  // contraction (4x partitions for MX, 2x for double row) and columns
    bool mx = false, double_row = false;
    DType dtype = DType::bf16;
    Floats w;  // [k][m]
    bool loaded = false;
  };
  std::vector<Stationary> stationary;
  // Per core: the Scalar engine's reduce registers (activation reduce_cmd).
  std::vector<std::vector<float>> act_regs;
  // Per core: the Vector engine's accumulators (select_reduce, range_select,
  // exponential reduce_cmd), shared by those instructions as on the hardware.
  std::vector<std::vector<float>> vec_regs;
  // Per core, for the Vector [0] and GpSimd [1] engines: each lane's XORWOW
  // states (lane-major; empty until first used: seed 0).
  std::vector<std::array<std::vector<num::Xorwow>, 2>> rng_states;

  // Per-core state for `n` cores (sized before a run: replays run cores on
  // threads of their own, so nothing is inserted while they run).
  void set_cores(int n) {
    const auto u = static_cast<std::size_t>(n);
    stationary.resize(u);
    act_regs.resize(u);
    vec_regs.resize(u);
    rng_states.resize(u);
  }
  // Sub-states per lane: four on NeuronCore-v4's Vector engine (its 24-word
  // rand state), one elsewhere (6 words).
  int rng_substates(isa::Engine e) const {
    return e == isa::Engine::vector && s.chip_.core_version >= 4 ? 4 : 1;
  }
  std::vector<num::Xorwow>& rng_lanes(int core, isa::Engine e);

  // Applies reduce command `cmd` (imm2: 0 this instruction's values, 1 reset
  // to `reset`, 2 combine with `combine`, 3 keep, 4 load `init` then combine)
  // to partitions [p0, p0 + v.size()) of `regs`; v becomes the registers.
  template <typename Combine>
  static void reduce_registers(std::vector<float>& regs, int p0, int cmd, float reset, float init,
                               Floats& v, Combine combine) {
    if (regs.size() < static_cast<std::size_t>(p0) + v.size())
      regs.resize(static_cast<std::size_t>(p0) + v.size(), reset);
    for (std::size_t r = 0; r < v.size(); ++r) {
      float& g = regs[static_cast<std::size_t>(p0) + r];
      g = cmd == 0   ? v[r]
          : cmd == 1 ? reset
          : cmd == 2 ? combine(g, v[r])
          : cmd == 4 ? combine(init, v[r])
                     : g;
      v[r] = g;
    }
  }

  int threads = 1;  // host threads for rows of large instructions and the matmul
  // A replay neither checks nor sets SBUF/PSUM written flags: a program
  // starts with fresh SBUF and PSUM, and its recorded run already found
  // every read of them written, in the same order. HBM flags stay checked
  // (the host may leave an input unwritten on a later run).
  bool sram_flags = true;
  // HBM written flags, for the tensors the host did not fill. A replay
  // skips them when the host filled at least the tensors it filled for the
  // recorded run (which found every read of the others written) and no
  // write depends on data.
  bool hbm_flags = true;

  Impl(Simulator& sim, const Options& o) : s(sim), opt(o) {
    threads = o.threads > 0 ? o.threads : host_threads();
  }

  // ---- functional model

  Sram& sram(int core, Mem m) { return m == Mem::sbuf ? s.sbuf_[core] : s.psum_[core]; }

  // The byte offsets of an operand's free elements (cached by shape).
  const Walk& walk(const AccessPattern& ap) { return s.walks_->get(ap); }

  // Row r of an operand: (data base, written-flags base).
  std::pair<std::uint8_t*, std::uint8_t*> row(int core, const AccessPattern& ap, int r) {
    if (ap.mem == Mem::hbm) {
      // load() checked that the whole pattern lies inside one declared tensor;
      // the last region found is reused while it holds the pattern (regions
      // never overlap, so it is the one; rows and loops repeat it).
      // A row's first byte inside the last region means the pattern is in
      // it (the pattern lies in one region and regions are disjoint).
      const std::int64_t a = ap.row_address(r);
      if (!region_ || a < region_->address || a >= region_->address + region_->size) {
        const std::int64_t lo = ap.min_byte(), hi = ap.max_byte();
        region_ = s.hbm_.find(lo, hi - lo);
      }
      Region* reg = region_;
      const std::int64_t off = a - reg->address;
      return {reg->data + off, hbm_flags && reg->written ? reg->written.get() + off : nullptr};
    }
    Sram& m = sram(core, ap.mem);
    return {m.row(ap.start_partition + r),
            sram_flags && m.tracks_written() ? m.written_row(ap.start_partition + r) : nullptr};
  }

  [[noreturn]] static void uninitialized(const char* what, const AccessPattern& ap, int r,
                                         std::int64_t byte) {
    throw Error(
        fmt::format("{} reads never-written {} memory (row {}, byte {} of {}): uninitialized data",
                    what, isa::mem_name(ap.mem), ap.mem == Mem::hbm ? r : ap.start_partition + r,
                    byte, isa::to_string(ap)));
  }

  // Row r of `ap` was written at the walk's elements. A strided walk checks
  // the bytes it spans first (one memcmp); only when a gap in that span is
  // unwritten are the elements checked one by one, so the error names the
  // first unwritten element read, as before.
  void check_written(const std::uint8_t* written, const AccessPattern& ap, int r, const Walk& w,
                     const char* what) {
    if (!written || w.offs.empty() || opt.uninitialized_reads) return;
    const std::uint8_t m = s.mark_;
    if (w.run) {
      if (const void* z = find_unwritten(written + w.lo, static_cast<std::size_t>(w.hi - w.lo), m))
        uninitialized(what, ap, r, static_cast<const std::uint8_t*>(z) - written);
      return;
    }
    if (!find_unwritten(written + w.lo, static_cast<std::size_t>(w.hi - w.lo), m)) return;
    for (auto o : w.offs)
      for (int b = 0; b < w.size; ++b)
        if (written[o + b] != m) uninitialized(what, ap, r, o + b);
  }

  void mark_written(std::uint8_t* written, const Walk& w) {
    if (!written || w.offs.empty()) return;
    const std::uint8_t m = s.mark_;
    if (w.run) {
      std::memset(written + w.lo, m, static_cast<std::size_t>(w.hi - w.lo));
      return;
    }
    // Element by element (sizes 1 to 4: a call to memset each costs more).
    switch (w.size) {
      case 1:
        for (auto o : w.offs) written[o] = m;
        return;
      case 2: {
        const std::uint16_t v = static_cast<std::uint16_t>(m * 0x0101u);
        for (auto o : w.offs) std::memcpy(written + o, &v, 2);
        return;
      }
      case 4: {
        const std::uint32_t v = m * 0x01010101u;
        for (auto o : w.offs) std::memcpy(written + o, &v, 4);
        return;
      }
      default:
        for (auto o : w.offs)
          for (int b = 0; b < w.size; ++b) written[o + b] = m;
    }
  }

  // Runs f(r) for the rows [0, rows), on up to `threads` host threads when
  // the instruction moves enough elements to pay for waking them. Rows are
  // independent (each its own partition, or disjoint HBM rows), so the bits
  // do not depend on the split. f must not throw.
  static constexpr std::int64_t kParallelElements = 65536;
  template <typename F>
  void for_rows(int rows, std::int64_t elements, F&& f) const {
    // Inside a replay's per-core threads the rows stay on the caller's.
    const int t = elements >= kParallelElements && !omp_in_parallel() ? std::min(threads, rows) : 1;
    if (t <= 1) {
      for (int r = 0; r < rows; ++r) f(r);
      return;
    }
#pragma omp parallel for num_threads(t) schedule(static)
    for (int r = 0; r < rows; ++r) f(r);
  }

  // Each row's (data, written-flags) bases, found on this thread (row()
  // caches the HBM region).
  std::vector<std::pair<std::uint8_t*, std::uint8_t*>> bases(int core, const AccessPattern& ap) {
    std::vector<std::pair<std::uint8_t*, std::uint8_t*>> b(static_cast<std::size_t>(ap.rows()));
    for (int r = 0; r < ap.rows(); ++r) b[static_cast<std::size_t>(r)] = row(core, ap, r);
    return b;
  }

  // Whether distinct rows of `ap` never share a byte (always for SBUF/PSUM:
  // a row is a partition).
  static bool disjoint_rows(const AccessPattern& ap, const Walk& w) {
    if (ap.mem != Mem::hbm || ap.rows() <= 1) return true;
    const std::int64_t stride = ap.dims[0].stride * isa::size_bytes(ap.dtype);
    return stride >= w.hi - w.lo;
  }

  static bool int_type(DType t) {
    return !isa::is_float(t) && !isa::is_x4(t);
  }
  static bool signed_int(DType t) {
    return t == DType::int8 || t == DType::int16 || t == DType::int32;
  }
  static bool all_int(const Instruction& in) {
    return std::all_of(in.operands.begin(), in.operands.end(),
                       [](const AccessPattern& ap) { return int_type(ap.dtype); });
  }
  // One partition of an SBUF/PSUM operand.
  static AccessPattern partition_of(const AccessPattern& ap, int r) {
    AccessPattern p = ap;
    p.start_partition += r;
    p.partitions = 1;
    return p;
  }

  // ---- operand data (functional_data.cpp)

  // The operand's elements decoded to FP32, row-major; `what` names the
  // operand in the error for a never-written element.
  Floats read(int core, const AccessPattern& ap, const char* what);
  // v (row-major FP32) encoded into the operand's dtype (RNE or stochastic).
  void write(int core, const AccessPattern& ap, const Floats& v);
  // Integer tensors as exact 64-bit integers (no FP32 detour).
  std::vector<std::int64_t> read_int(int core, const AccessPattern& ap, const char* what);
  // Stores the low bits of each value (two's complement wrap-around).
  void write_int(int core, const AccessPattern& ap, const std::vector<std::int64_t>& v);
  static Floats unfold_rows(const Floats& v, int p);
  void copy_bytes(int core, const AccessPattern& dst, const AccessPattern& src, int dst_core = -1);
  Floats read_mx(int core, const AccessPattern& data, const AccessPattern& scale, const char* what);
  void quantize_mx(int core, const Instruction& in);
  static const float* scaled_lut(DType t, std::uint8_t xs);
  void indirect_dma(int core, const Instruction& in);

  // ---- instructions (functional_ops.cpp, functional_select.cpp)

  // Runs one instruction on core `core`'s memories (the scheduler has
  // already ordered it after what it waits for).
  void execute(int core, const Instruction& in);
  void tensor_state(int core, const Instruction& in);
  void check_pairing(const Stationary& st, const AccessPattern& mv);
  void execute_select(int core, const Instruction& in);
  void execute_rng(int core, const Instruction& in);
  void execute_rng_state(int core, const Instruction& in);
  void tensor_scalar_reversed(int core, const Instruction& in);

  void op_dma_copy(int core, const Instruction& in);
  void op_multiply(int core, const Instruction& in);
  void op_transpose(int core, const Instruction& in);
  void op_tensor_tensor(int core, const Instruction& in);
  void op_scalar_tensor_tensor(int core, const Instruction& in);
  void op_tensor_scalar(int core, const Instruction& in);
  void op_tensor_reduce(int core, const Instruction& in);
  void op_activation(int core, const Instruction& in);
  void op_iota(int core, const Instruction& in);
  void op_bn_stats(int core, const Instruction& in);
  void op_bn_aggr(int core, const Instruction& in);
  void op_select(int core, const Instruction& in);
  void op_copy_predicated(int core, const Instruction& in);
  void op_exponential(int core, const Instruction& in);
  void op_affine_select(int core, const Instruction& in);
  void op_partition_reduce(int core, const Instruction& in);
  void op_dma_transpose(int core, const Instruction& in);
};

}  // namespace tern::sim
