#include "sim/simulator.h"

#include "isa/select_ops.h"

#include "num/mx.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <omp.h>

#include "sim/act_table.h"
#include "sim/check.h"
#include "sim/codec.h"
#include "sim/cost.h"
#include "sim/matmul_host.h"
#include "util/error.h"

namespace tern::sim {

namespace {
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
}  // namespace

using isa::AccessPattern;
using isa::DType;
using isa::Engine;
using isa::Instruction;
using isa::Mem;
using isa::Opcode;

Mode parse_mode(std::string_view s) {
  if (s == "both") return Mode::both;
  if (s == "functional") return Mode::functional;
  if (s == "timing") return Mode::timing;
  throw Error(fmt::format("unknown simulation mode '{}': expected both, functional or timing", s));
}

Simulator::Simulator(arch::ChipSpec chip) : chip_(std::move(chip)) {}

void Simulator::load(const isa::Program& p) {
  load_shared(std::make_shared<const isa::Program>(p));
}

void Simulator::load_shared(std::shared_ptr<const isa::Program> shared, bool checked) {
  const isa::Program& p = *shared;
  if (p.cores.empty()) throw Error("the program has no cores");
  if (static_cast<int>(p.cores.size()) > chip_.cores) {
    throw Error(fmt::format("the program uses {} cores but {} has {}", p.cores.size(), chip_.name,
                            chip_.cores));
  }
  if (p.lnc != 1 && p.lnc != 2) throw Error(fmt::format("lnc must be 1 or 2, got {}", p.lnc));
  if (p.lnc == 2 && chip_.core_version < 3) {
    throw Error(fmt::format("LNC=2 needs NeuronCore-v3 or later; {} is {}", chip_.name,
                            chip_.core_generation));
  }
  if (p.cores.size() % static_cast<std::size_t>(p.lnc) != 0) {
    throw Error(fmt::format("LNC={} groups physical cores in pairs, but the program has {} cores",
                            p.lnc, p.cores.size()));
  }
  if (p.arch != chip_.name) {
    throw Error(fmt::format("the program was built for {} but the simulated chip is {}", p.arch,
                            chip_.name));
  }
  for (std::size_t c = 0; c < (checked ? 0 : p.cores.size()); ++c) {
    for (const auto& stream : p.cores[c].streams) {
      for (std::size_t i = 0; i < stream.size(); ++i) {
        if (const std::string e = check_instruction(chip_, p, stream[i]); !e.empty()) {
          throw Error(fmt::format("{}: {}", where(static_cast<int>(c), stream[i], i), e));
        }
        if (stream[i].op == Opcode::branch &&
            static_cast<std::size_t>(stream[i].target) > stream.size()) {
          throw Error(fmt::format(
              "{}: branch target {} is past the end of the {}-instruction stream",
              where(static_cast<int>(c), stream[i], i), stream[i].target, stream.size()));
        }
      }
    }
  }
  hbm_ = Hbm();
  for (const auto& t : p.tensors) hbm_.add(t.name, t.address, t.bytes());
  // A new program starts with fresh SBUF and PSUM: the memories are kept
  // (reallocating 32 MiB a core per launch was half of a small model's
  // training step) and a new mark makes every earlier write stale without
  // touching the flags (clearing them was a fifth of a training step); only
  // when the 8-bit mark wraps are the flags cleared.
  if (++mark_ == 0) {
    mark_ = 1;
    for (Sram& m : sbuf_) m.clear_written(sbuf_used_);
    for (Sram& m : psum_) m.clear_written(psum_used_);
    sbuf_used_ = psum_used_ = 0;
  }
  program_ = std::move(shared);
  loaded_ = true;
}

void Simulator::write_bytes(const std::string& tensor, std::span<const std::uint8_t> bytes) {
  Region& r = hbm_.by_name(tensor);
  if (static_cast<std::int64_t>(bytes.size()) != r.size) {
    throw Error(fmt::format("tensor '{}' holds {} bytes, got {}", tensor, r.size, bytes.size()));
  }
  std::copy(bytes.begin(), bytes.end(), r.data.get());
  std::memset(r.written.get(), mark_, static_cast<std::size_t>(r.size));
}

void Simulator::write(const std::string& tensor, std::span<const float> values) {
  const isa::HbmTensor& t = program_->tensor(tensor);
  if (static_cast<std::int64_t>(values.size()) != t.elements()) {
    throw Error(fmt::format("tensor '{}' has {} elements, got {} values", tensor, t.elements(),
                            values.size()));
  }
  const int sz = isa::size_bytes(t.dtype);
  std::vector<std::int64_t> offs(values.size());
  for (std::size_t i = 0; i < offs.size(); ++i) offs[i] = static_cast<std::int64_t>(i) * sz;
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(t.bytes()));
  encode_row(t.dtype, values.data(), offs, bytes.data(), {}, 0);
  write_bytes(tensor, bytes);
}

std::vector<float> Simulator::read(const std::string& tensor) const {
  const isa::HbmTensor& t = program_->tensor(tensor);
  const Region& r = const_cast<Hbm&>(hbm_).by_name(tensor);
  const int sz = isa::size_bytes(t.dtype);
  std::vector<std::int64_t> offs(static_cast<std::size_t>(t.elements()));
  for (std::size_t i = 0; i < offs.size(); ++i) offs[i] = static_cast<std::int64_t>(i) * sz;
  std::vector<float> out(offs.size());
  decode_row(t.dtype, r.data.get(), offs, out.data());
  return out;
}

std::vector<std::uint8_t> Simulator::read_bytes(const std::string& tensor) const {
  const Region& r = const_cast<Hbm&>(hbm_).by_name(tensor);
  return {r.data.get(), r.data.get() + r.size};
}

// ------------------------------------------------------------------ run

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
  std::map<int, std::vector<float>> act_regs;
  // Per core: the Vector engine's accumulators (select_reduce, range_select,
  // exponential reduce_cmd), shared by those instructions as on the hardware.
  std::map<int, std::vector<float>> vec_regs;

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

  Impl(Simulator& sim, const Options& o) : s(sim), opt(o) {
    threads = o.threads > 0 ? o.threads
                            : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
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
      const std::int64_t lo = ap.min_byte(), hi = ap.max_byte();
      if (!region_ || lo < region_->address || hi > region_->address + region_->size)
        region_ = s.hbm_.find(lo, hi - lo);
      Region* reg = region_;
      const std::int64_t off = ap.row_address(r) - reg->address;
      return {reg->data.get() + off, reg->written.get() + off};
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
  static constexpr std::int64_t kParallelElements = 16384;
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

  Floats read(int core, const AccessPattern& ap, const char* what) {
    const Walk& w = walk(ap);
    const int rows = ap.rows();
    const std::size_t n = w.offs.size();
    Floats v(static_cast<std::size_t>(rows) * n);
    const auto b = bases(core, ap);
    for (int r = 0; r < rows; ++r)
      check_written(b[static_cast<std::size_t>(r)].second, ap, r, w, what);
    if (rows == 0) return v;
    decode_row(ap.dtype, b[0].first, w.offs, v.data(), w.run);  // may throw (x4 types)
    for_rows(rows - 1, static_cast<std::int64_t>(v.size()), [&](int r) {
      decode_row(ap.dtype, b[static_cast<std::size_t>(r) + 1].first, w.offs,
                 v.data() + static_cast<std::size_t>(r + 1) * n, w.run);
    });
    return v;
  }

  // Whether distinct rows of `ap` never share a byte (always for SBUF/PSUM:
  // a row is a partition).
  static bool disjoint_rows(const AccessPattern& ap, const Walk& w) {
    if (ap.mem != Mem::hbm || ap.rows() <= 1) return true;
    const std::int64_t stride = ap.dims[0].stride * isa::size_bytes(ap.dtype);
    return stride >= w.hi - w.lo;
  }

  void write(int core, const AccessPattern& ap, const Floats& v) {
    const Walk& w = walk(ap);
    const std::size_t n = w.offs.size();
    num::CastOptions co;
    co.rounding = opt.stochastic_rounding ? num::Rounding::stochastic : num::Rounding::nearest_even;
    co.seed = opt.seed;
    const auto b = bases(core, ap);
    auto one = [&](int r) {
      auto [base, written] = b[static_cast<std::size_t>(r)];
      const float* in = v.data() + static_cast<std::size_t>(r) * n;
      if (w.run && ap.dtype == DType::fp32) {
        std::memcpy(base + w.lo, in, n * sizeof(float));
      } else {
        encode_row(ap.dtype, in, w.offs, base, co,
                   (serial << 24) + static_cast<std::uint64_t>(r) * n, w.run ? 1 : 0);
      }
      mark_written(written, w);
    };
    const int rows = ap.rows();
    if (rows == 0) return;
    one(0);  // may throw (x4 types)
    if (disjoint_rows(ap, w)) {
      for_rows(rows - 1, static_cast<std::int64_t>(v.size()), [&](int r) { one(r + 1); });
    } else {
      for (int r = 1; r < rows; ++r) one(r);  // later rows overwrite earlier ones, in order
    }
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

  // Integer tensors as exact 64-bit integers (no FP32 detour).
  std::vector<std::int64_t> read_int(int core, const AccessPattern& ap, const char* what) {
    const Walk& w = walk(ap);
    const auto& offs = w.offs;
    std::vector<std::int64_t> v(static_cast<std::size_t>(ap.rows()) * offs.size());
    for (int r = 0; r < ap.rows(); ++r) {
      auto [base, written] = row(core, ap, r);
      check_written(written, ap, r, w, what);
      for (std::size_t i = 0; i < offs.size(); ++i) {
        const std::uint8_t* q = base + offs[i];
        std::int64_t x = 0;
        switch (ap.dtype) {
          case DType::int8:
            x = static_cast<std::int8_t>(*q);
            break;
          case DType::uint8:
            x = *q;
            break;
          case DType::int16: {
            std::int16_t t;
            std::memcpy(&t, q, 2);
            x = t;
            break;
          }
          case DType::uint16: {
            std::uint16_t t;
            std::memcpy(&t, q, 2);
            x = t;
            break;
          }
          case DType::int32: {
            std::int32_t t;
            std::memcpy(&t, q, 4);
            x = t;
            break;
          }
          default: {
            std::uint32_t t;
            std::memcpy(&t, q, 4);
            x = t;
            break;
          }
        }
        v[static_cast<std::size_t>(r) * offs.size() + i] = x;
      }
    }
    return v;
  }

  // Stores the low bits of each value (two's complement wrap-around).
  void write_int(int core, const AccessPattern& ap, const std::vector<std::int64_t>& v) {
    const Walk& w = walk(ap);
    const auto& offs = w.offs;
    for (int r = 0; r < ap.rows(); ++r) {
      auto [base, written] = row(core, ap, r);
      for (std::size_t i = 0; i < offs.size(); ++i) {
        const auto x = static_cast<std::uint64_t>(v[static_cast<std::size_t>(r) * offs.size() + i]);
        std::memcpy(base + offs[i], &x,
                    static_cast<std::size_t>(w.size));  // little endian: the low bytes
      }
      mark_written(written, w);
    }
  }

  // A double-row operand [P, 2F] (rows k < P in columns [0, F), rows P + k in
  // [F, 2F)) as the logical [2P, F] matrix.
  static Floats unfold_rows(const Floats& v, int p) {
    const std::size_t f2 = v.size() / static_cast<std::size_t>(p), f = f2 / 2;
    Floats out(v.size());
    for (std::size_t r = 0; r < static_cast<std::size_t>(p); ++r)
      for (std::size_t h = 0; h < 2; ++h)
        std::copy_n(
            v.begin() + static_cast<std::ptrdiff_t>(r * f2 + h * f), f,
            out.begin() + static_cast<std::ptrdiff_t>((h * static_cast<std::size_t>(p) + r) * f));
    return out;
  }

  // Element i of `sz` bytes from s + so[i] to d + do_[i]: a fixed-size copy
  // per element size (a memcpy call of a variable size per element was a
  // tenth of a training step).
  template <int Sz>
  static void gather_n(std::uint8_t* d, const std::int64_t* do_, const std::uint8_t* s,
                       const std::int64_t* so, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) std::memcpy(d + do_[i], s + so[i], Sz);
  }
  static void gather(std::uint8_t* d, const std::int64_t* do_, const std::uint8_t* s,
                     const std::int64_t* so, std::size_t n, int sz) {
    switch (sz) {
      case 1:
        return gather_n<1>(d, do_, s, so, n);
      case 2:
        return gather_n<2>(d, do_, s, so, n);
      case 4:
        return gather_n<4>(d, do_, s, so, n);
      default:
        for (std::size_t i = 0; i < n; ++i)
          std::memcpy(d + do_[i], s + so[i], static_cast<std::size_t>(sz));
    }
  }

  // Same-type DMA: element bytes move unchanged (NaN payloads, x4 packing).
  void copy_bytes(int core, const AccessPattern& dst, const AccessPattern& src, int dst_core = -1) {
    const Walk& sw_ = walk(src);
    const Walk& dw_ = walk(dst);
    const bool runs = sw_.run && dw_.run;
    const std::size_t len = static_cast<std::size_t>(sw_.hi - sw_.lo);
    for (int r = 0; r < src.rows(); ++r) {
      auto [sb, sw] = row(core, src, r);
      check_written(sw, src, r, sw_, "the DMA source");
      auto [db, dw] = row(dst_core >= 0 ? dst_core : core, dst, r);
      if (runs) {  // one block per row
        if (len) std::memcpy(db + dw_.lo, sb + sw_.lo, len);
      } else {
        gather(db, dw_.offs.data(), sb, sw_.offs.data(), sw_.offs.size(), sw_.size);
      }
      mark_written(dw, dw_);
    }
  }

  // An MX operand: x4 data [P, F] and E8M0 scales [P/8, F], as the logical
  // [4P, F] FP32 matrix X * P (contraction index 4p + j for packed value j).
  // Each value is rounded once to FP32 (exact within FP32's normal range);
  // a NaN scale (0xFF) gives NaN.
  Floats read_mx(int core, const AccessPattern& data, const AccessPattern& scale,
                 const char* what) {
    const bool fp4 = data.dtype == DType::fp4_e2m1_x4;
    const Walk& dwk = walk(data);
    const Walk& swk = walk(scale);
    const auto& doffs = dwk.offs;
    const auto& soffs = swk.offs;
    const std::size_t F = doffs.size();
    Floats out(static_cast<std::size_t>(data.partitions) * 4 * F);
    const auto db = bases(core, data);
    const auto sb = bases(core, scale);
    for (int p = 0; p < data.partitions; ++p) {
      check_written(db[static_cast<std::size_t>(p)].second, data, p, dwk, what);
      if (p % 8 == 0)
        check_written(sb[static_cast<std::size_t>(p / 8)].second, scale, p / 8, swk, what);
    }
    // The scale rows' tables first (they fill on this thread), then the
    // partitions on the host threads.
    std::vector<const float*> luts(static_cast<std::size_t>(sb.size()) * F);
    for (std::size_t g = 0; g < sb.size(); ++g)
      for (std::size_t f = 0; f < F; ++f)
        luts[g * F + f] = scaled_lut(data.dtype, sb[g].first[soffs[f]]);
    for_rows(data.partitions, static_cast<std::int64_t>(out.size()), [&](int p) {
      const std::uint8_t* base = db[static_cast<std::size_t>(p)].first;
      const float* const* lut = luts.data() + static_cast<std::size_t>(p / 8) * F;
      float* o = out.data() + static_cast<std::size_t>(p) * 4 * F;
      for (std::size_t f = 0; f < F; ++f) {
        if (fp4) {
          std::uint16_t w;
          std::memcpy(&w, base + doffs[f], 2);
          for (int j = 0; j < 4; ++j) o[j * F + f] = lut[f][(w >> (4 * j)) & 0xFu];
        } else {
          const std::uint8_t* q = base + doffs[f];
          for (int j = 0; j < 4; ++j) o[j * F + f] = lut[f][q[j]];
        }
      }
    });
    return out;
  }

  // Vector QuantizeMX: each group of 8 partitions x 4 values (32 contraction
  // values) shares one E8M0 scale chosen by Trainium3's policy. Groups are
  // independent (the stochastic-rounding stream is indexed by element), so
  // they run on the host threads.
  void quantize_mx(int core, const Instruction& in) {
    const AccessPattern& d = in.operands[0];
    const AccessPattern& sc = in.operands[1];
    const AccessPattern& src = in.operands[2];
    const Floats x = read(core, src, "the quantize_mx source");
    const std::size_t F = static_cast<std::size_t>(src.free_size()), C = F / 4;
    const std::size_t groups = static_cast<std::size_t>(src.partitions) / 8;
    num::CastOptions co;
    co.rounding = opt.stochastic_rounding ? num::Rounding::stochastic : num::Rounding::nearest_even;
    co.seed = opt.seed;
    const num::MxFormat& mf = num::mx_format(d.dtype == DType::fp8_e4m3_x4 ? num::MxId::mxfp8_e4m3
                                                                           : num::MxId::mxfp8_e5m2);
    const Walk& dwk = walk(d);
    const Walk& swk = walk(sc);
    const auto db = bases(core, d);
    const auto sb = bases(core, sc);
    const std::size_t block = num::kMxBlock;
    for_rows(static_cast<int>(groups), static_cast<std::int64_t>(x.size()), [&](int gi) {
      const std::size_t g = static_cast<std::size_t>(gi);
      Floats blocks(C * block);
      for (std::size_t pp = 0; pp < 8; ++pp) {
        const float* xr = x.data() + (8 * g + pp) * F;
        float* br = blocks.data() + 4 * pp;
        for (std::size_t c = 0; c < C; ++c) std::memcpy(br + c * block, xr + 4 * c, 16);
      }
      std::vector<std::uint8_t> codes(blocks.size()), scales(C);
      num::mx_quantize(mf, num::ScalePolicy::trn3, blocks, codes, scales, co,
                       (serial << 24) + g * C * block);
      for (std::size_t c = 0; c < C; ++c) sb[g].first[swk.offs[c]] = scales[c];
      mark_written(sb[g].second, swk);
      for (std::size_t pp = 0; pp < 8; ++pp) {
        std::uint8_t* drow = db[8 * g + pp].first;
        for (std::size_t c = 0; c < C; ++c)
          std::memcpy(drow + dwk.offs[c], &codes[c * block + 4 * pp], 4);
        mark_written(db[8 * g + pp].second, dwk);
      }
    });
  }

  // Decoded x4 element codes times 2^(scale - 127), by E8M0 scale code:
  // a row is filled the first time its scale shows up (runs use few), each
  // entry exactly what times_pow2 gives; scale 0xFF (NaN) gives NaN. A pure
  // function of (dtype, scale, code), so the tables live as long as the
  // thread.
  static const float* scaled_lut(DType t, std::uint8_t xs) {
    struct Lut {
      std::vector<float> table;  // [256 scales][256 codes]
      std::array<bool, 256> filled{};
    };
    static thread_local std::array<Lut, static_cast<std::size_t>(DType::count_)> luts;
    Lut& l = luts[static_cast<std::size_t>(t)];
    if (l.table.empty()) l.table.resize(256 * 256);
    float* row = l.table.data() + std::size_t{xs} * 256;
    if (!l.filled[xs]) {
      const num::Format& ef = *isa::x4_element(t);
      for (std::uint32_t c = 0; c < 256; ++c)
        row[c] = xs == 0xFF ? std::numeric_limits<float>::quiet_NaN()
                            : num::times_pow2(num::decode(ef, c & ef.code_mask()), int(xs) - 127);
      l.filled[xs] = true;
    }
    return row;
  }

  void execute(int core, const Instruction& in) {
    if (in.operands.empty()) return;  // sequencer instructions: handled by the scheduler
    const auto& ops = in.operands;
    const AccessPattern& d = ops[0];
    switch (in.op) {
      case Opcode::dma_copy: {
        if (in.peer_core >= 0) {  // into another core's SBUF (sendrecv)
          if (d.dtype == ops[1].dtype && !in.accumulate)
            copy_bytes(core, d, ops[1], in.peer_core);
          else
            write(in.peer_core, d, read(core, ops[1], "the DMA source"));
          break;
        }
        if (!in.accumulate && d.dtype == ops[1].dtype) {
          copy_bytes(core, d, ops[1]);  // same type: the bytes move unchanged
          break;
        }
        Floats v = read(core, ops[1], "the DMA source");
        if (in.accumulate) {
          const Floats old = read(core, d, "the DMA accumulate destination");
          for (std::size_t i = 0; i < v.size(); ++i) v[i] += old[i];
        }
        write(core, d, v);
        break;
      }
      case Opcode::load_stationary:
        stationary[core].w = ops.size() == 2 ? read_mx(core, d, ops[1], "the MX stationary")
                                             : read(core, d, "load_stationary");
        if (in.perf == isa::PerfMode::double_row)
          stationary[core].w = unfold_rows(stationary[core].w, d.partitions);
        break;
      case Opcode::quantize_mx:
        quantize_mx(core, in);
        break;
      case Opcode::multiply_moving: {
        const Stationary& st = stationary[core];
        const AccessPattern& mv = ops[1];
        Floats m = ops.size() == 3 ? read_mx(core, mv, ops[2], "the MX moving tensor")
                                   : read(core, mv, "the moving tensor");
        const bool dr = in.perf == isa::PerfMode::double_row;
        if (dr) m = unfold_rows(m, mv.partitions);
        const int n = static_cast<int>(mv.free_size()) / (dr ? 2 : 1);
        const bool fp32 = st.dtype == DType::fp32 || mv.dtype == DType::fp32;
        const Walk& dwk = walk(d);
        if (d.dtype == DType::fp32 && dwk.run && !dwk.offs.empty()) {
          // FP32 PSUM: accumulate in place, one partition per output row.
          Sram& ps = sram(core, Mem::psum);
          const std::int64_t first = dwk.lo;
          for (int r = 0; r < d.partitions; ++r) {
            std::uint8_t* w = ps.written_row(d.start_partition + r) + first;
            if (in.accumulate && sram_flags) {
              if (const void* z = find_unwritten(w, static_cast<std::size_t>(n) * 4, s.mark_)) {
                uninitialized("accumulate=True onto PSUM", d, r,
                              static_cast<const std::uint8_t*>(z) - w + first);
              }
            } else if (!in.accumulate) {
              std::memset(ps.row(d.start_partition + r) + first, 0,
                          static_cast<std::size_t>(n) * 4);
            }
          }
          float* acc = reinterpret_cast<float*>(ps.row(d.start_partition) + first);
          matmul_accumulate(st.w.data(), m.data(), n, acc, ps.bytes_per_partition() / 4, st.k, st.m,
                            n, fp32, threads);
          for (int r = 0; r < d.partitions && sram_flags; ++r) {
            std::memset(ps.written_row(d.start_partition + r) + first, s.mark_,
                        static_cast<std::size_t>(n) * 4);
          }
          break;
        }
        // BF16 PSUM (v4): read, upcast, accumulate in FP32, round back once.
        Floats acc;
        if (in.accumulate) {
          acc = read(core, d, "accumulate=True onto PSUM");
        } else {
          acc.assign(static_cast<std::size_t>(st.m) * n, 0.0f);
        }
        matmul_accumulate(st.w.data(), m.data(), n, acc.data(), n, st.k, st.m, n, fp32, threads);
        write(core, d, acc);
        break;
      }
      case Opcode::transpose: {
        const AccessPattern& src = ops[1];
        const Floats v = read(core, src, "the transpose source");
        const int p = src.partitions, f = static_cast<int>(src.free_size());
        Floats t(v.size());
        for_rows(f, static_cast<std::int64_t>(v.size()), [&](int j) {
          float* out = t.data() + static_cast<std::size_t>(j) * p;
          for (int i = 0; i < p; ++i) out[i] = v[static_cast<std::size_t>(i) * f + j];
        });
        write(core, d, t);
        break;
      }
      case Opcode::tensor_tensor: {
        if (all_int(in)) {  // integer tensors: exact integer arithmetic
          auto a = read_int(core, ops[1], "input a");
          const auto b = read_int(core, ops[2], "input b");
          const bool sgn = signed_int(ops[1].dtype);
          for (std::size_t i = 0; i < a.size(); ++i)
            a[i] = isa::apply_alu_int(in.alu0, a[i], b[i], sgn);
          write_int(core, d, a);
          break;
        }
        Floats a = read(core, ops[1], "input a");
        const Floats b = read(core, ops[2], "input b");
        const std::size_t f = static_cast<std::size_t>(d.free_size());
        for_rows(d.rows(), static_cast<std::int64_t>(a.size()), [&](int r) {
          const std::size_t o = static_cast<std::size_t>(r) * f;
          isa::apply_alu(in.alu0, a.data() + o, b.data() + o, f);
        });
        write(core, d, a);
        break;
      }
      case Opcode::tensor_scalar: {
        if (in.reverse0 || in.reverse1) {
          tensor_scalar_reversed(core, in);
          break;
        }
        if (all_int(in)) {
          auto a = read_int(core, ops[1], "the source");
          const bool sgn = signed_int(ops[1].dtype);
          const auto i0 = static_cast<std::int64_t>(in.imm0),
                     i1 = static_cast<std::int64_t>(in.imm1);
          for (auto& x : a)
            x = isa::apply_alu_int(in.alu1, isa::apply_alu_int(in.alu0, x, i0, sgn), i1, sgn);
          write_int(core, d, a);
          break;
        }
        Floats a = read(core, ops[1], "the source");
        if (in.col0 || in.col1) {
          // Per-partition operands: row r uses column[r].
          std::size_t next = 2;
          const Floats c0 = in.col0 ? read(core, ops[next++], "column 0") : Floats{};
          const Floats c1 = in.col1 ? read(core, ops[next++], "column 1") : Floats{};
          const std::size_t f = static_cast<std::size_t>(d.free_size());
          for_rows(d.rows(), static_cast<std::int64_t>(a.size()), [&](int r) {
            const std::size_t ru = static_cast<std::size_t>(r);
            const float v0 = in.col0 ? c0[ru] : in.imm0, v1 = in.col1 ? c1[ru] : in.imm1;
            // Two passes, one operator each: the same bits as both per element.
            isa::apply_alu(in.alu0, a.data() + ru * f, v0, f);
            isa::apply_alu(in.alu1, a.data() + ru * f, v1, f);
          });
        } else {
          const std::size_t f = static_cast<std::size_t>(d.free_size());
          for_rows(d.rows(), static_cast<std::int64_t>(a.size()), [&](int r) {
            isa::apply_alu(in.alu0, a.data() + static_cast<std::size_t>(r) * f, in.imm0, f);
            isa::apply_alu(in.alu1, a.data() + static_cast<std::size_t>(r) * f, in.imm1, f);
          });
        }
        write(core, d, a);
        break;
      }
      case Opcode::tensor_copy:
        if (all_int(in)) {
          write_int(core, d, read_int(core, ops[1], "the source"));
          break;
        }
        write(core, d, read(core, ops[1], "the source"));
        break;
      case Opcode::tensor_reduce: {
        if (all_int(in) && isa::is_bitwise(in.alu0)) {
          // Bitwise reductions act on the integers (arithmetic ones go
          // through FP32, as the engines).
          const auto a = read_int(core, ops[1], "the source");
          const bool sgn = signed_int(ops[1].dtype);
          const std::size_t f = static_cast<std::size_t>(ops[1].free_size());
          std::vector<std::int64_t> out(static_cast<std::size_t>(d.rows()));
          for (std::size_t r = 0; r < out.size(); ++r) {
            std::int64_t acc = a[r * f];
            for (std::size_t i = 1; i < f; ++i)
              acc = isa::apply_alu_int(in.alu0, acc, a[r * f + i], sgn);
            out[r] = acc;
          }
          write_int(core, d, out);
          break;
        }
        const Floats a = read(core, ops[1], "the source");
        const std::size_t f = static_cast<std::size_t>(ops[1].free_size());
        Floats out(static_cast<std::size_t>(d.rows()));
        for (std::size_t r = 0; r < out.size(); ++r) {
          float acc = a[r * f];
          for (std::size_t i = 1; i < f; ++i) acc = isa::apply_alu(in.alu0, acc, a[r * f + i]);
          out[r] = in.negate ? -acc : acc;
        }
        write(core, d, out);
        break;
      }
      case Opcode::memset:
        write(core, d, Floats(static_cast<std::size_t>(d.elements()), in.imm0));
        break;
      case Opcode::activation: {
        Floats a = read(core, ops[1], "the source");
        const std::size_t f = static_cast<std::size_t>(d.free_size());
        const int nops = static_cast<int>(ops.size());
        const bool has_bias = nops - (in.accumulate ? 1 : 0) > 2;
        Floats bias;
        if (has_bias) bias = read(core, ops[2], "the bias");
        Floats sums(static_cast<std::size_t>(d.rows()), 0.0f);
        // BF16 values without a per-row bias: by table once the function is
        // used enough (the same bits, sums in the same order).
        const float* table = ops[1].dtype == DType::bf16 && !has_bias
                                 ? act_tables().get(in.func, in.scale, 0.0f, a.size())
                                 : nullptr;
        for_rows(d.rows(), static_cast<std::int64_t>(a.size()), [&](int r) {
          const std::size_t ru = static_cast<std::size_t>(r);
          float* x = a.data() + ru * f;
          if (table) {
            float sum = 0.0f;
            for (std::size_t i = 0; i < f; ++i) {
              x[i] = table[std::bit_cast<std::uint32_t>(x[i]) >> 16];
              sum += x[i];
            }
            sums[ru] = sum;
            return;
          }
          sums[ru] = isa::apply_act(in.func, x, f, in.scale, has_bias ? bias[ru] : 0.0f);
        });
        write(core, d, a);
        // The Scalar engine's per-partition reduce registers (NKI
        // reduce_cmd, imm2): 0 load this instruction's sums, 1 reset to 0,
        // 2 add the sums, 3 keep. With acc the last operand receives them.
        reduce_registers(act_regs[core], d.start_partition, static_cast<int>(in.imm2), 0.0f, 0.0f,
                         sums, [](float x, float y) { return x + y; });
        if (in.accumulate) write(core, ops.back(), sums);
        break;
      }
      case Opcode::iota: {
        Floats v(static_cast<std::size_t>(d.elements()));
        const std::size_t f = static_cast<std::size_t>(d.free_size());
        for (std::size_t r = 0; r < static_cast<std::size_t>(d.rows()); ++r)
          for (std::size_t i = 0; i < f; ++i)
            v[r * f + i] = in.imm0 + in.imm1 * static_cast<float>(d.start_partition + r) +
                           in.imm2 * static_cast<float>(i);
        write(core, d, v);
        break;
      }
      case Opcode::reciprocal: {
        Floats a = read(core, ops[1], "the source");
        for (float& x : a) x = 1.0f / x;
        write(core, d, a);
        break;
      }
      case Opcode::bn_stats: {
        // Per partition, for the even- and the odd-indexed elements: count,
        // mean and M2 = sum (x - mean)^2, each summed in FP32 in index order.
        const Floats a = read(core, ops[1], "the source");
        const std::size_t f = static_cast<std::size_t>(ops[1].free_size());
        Floats out(static_cast<std::size_t>(d.rows()) * 6);
        for (std::size_t r = 0; r < static_cast<std::size_t>(d.rows()); ++r)
          isa::bn_stats_row(a.data() + r * f, f, out.data() + r * 6);
        write(core, d, out);
        break;
      }
      case Opcode::bn_aggr: {
        // Chan et al.'s pairwise combination of (count, mean, M2) groups in
        // order, in FP32; variance = M2 / count (population variance).
        const Floats a = read(core, ops[1], "the bn_stats input");
        const std::size_t f = static_cast<std::size_t>(ops[1].free_size());
        Floats out(static_cast<std::size_t>(d.rows()) * 2);
        for (std::size_t r = 0; r < static_cast<std::size_t>(d.rows()); ++r)
          isa::bn_aggr_row(a.data() + r * f, f / 3, out.data() + r * 2);
        write(core, d, out);
        break;
      }
      case Opcode::select: {
        const Floats pred = read(core, ops[1], "the predicate");
        Floats a = read(core, ops[2], "input a");
        const Floats b = read(core, ops[3], "input b");
        for (std::size_t i = 0; i < a.size(); ++i)
          if (pred[i] == 0.0f) a[i] = b[i];
        write(core, d, a);
        break;
      }
      case Opcode::copy_predicated: {
        const Floats pred = read(core, ops[1], "the predicate");
        const Floats src = read(core, ops[2], "the source");
        Floats out = read(core, d, "copy_predicated (the destination keeps unselected values)");
        for (std::size_t i = 0; i < out.size(); ++i)
          if (pred[i] != 0.0f) out[i] = src[i];
        write(core, d, out);
        break;
      }
      case Opcode::exponential: {
        Floats a = read(core, ops[1], "the source");
        const std::size_t f = static_cast<std::size_t>(d.free_size());
        const bool has_sub = static_cast<int>(ops.size()) - (in.accumulate ? 1 : 0) > 2;
        Floats sub;
        if (has_sub) sub = read(core, ops[2], "the subtrahend");
        Floats sums(static_cast<std::size_t>(d.rows()), 0.0f);
        for_rows(d.rows(), static_cast<std::int64_t>(a.size()), [&](int r) {
          const std::size_t ru = static_cast<std::size_t>(r);
          const float m = has_sub ? sub[ru] : 0.0f;
          float sum = 0.0f;
          for (std::size_t i = 0; i < f; ++i) {
            float& x = a[ru * f + i];
            x = std::exp(x - m);
            sum += x;
          }
          sums[ru] = sum;
        });
        write(core, d, a);
        reduce_registers(vec_regs[core], d.start_partition, static_cast<int>(in.imm2), 0.0f,
                         in.imm3, sums, [](float x, float y) { return x + y; });
        if (in.accumulate) write(core, ops.back(), sums);
        break;
      }
      case Opcode::affine_select: {
        Floats a = read(core, ops[1], "the source");
        const std::size_t f = static_cast<std::size_t>(d.free_size());
        for (std::size_t r = 0; r < static_cast<std::size_t>(d.rows()); ++r)
          for (std::size_t i = 0; i < f; ++i) {
            const float v = in.imm0 + in.imm1 * static_cast<float>(d.start_partition + r) +
                            in.imm2 * static_cast<float>(i);
            if (isa::apply_alu(in.alu0, v, 0.0f) == 0.0f) a[r * f + i] = in.imm3;
          }
        write(core, d, a);
        break;
      }
      case Opcode::partition_reduce: {
        if (all_int(in) && isa::is_bitwise(in.alu0)) {
          const auto a = read_int(core, ops[1], "the source");
          const bool sgn = signed_int(ops[1].dtype);
          const std::size_t f = static_cast<std::size_t>(d.free_size());
          std::vector<std::int64_t> out(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(f));
          for (std::size_t r = 1; r < static_cast<std::size_t>(ops[1].rows()); ++r)
            for (std::size_t i = 0; i < f; ++i)
              out[i] = isa::apply_alu_int(in.alu0, out[i], a[r * f + i], sgn);
          write_int(core, d, out);
          break;
        }
        const Floats a = read(core, ops[1], "the source");
        const std::size_t f = static_cast<std::size_t>(d.free_size());
        Floats out(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(f));
        for (std::size_t r = 1; r < static_cast<std::size_t>(ops[1].rows()); ++r)
          for (std::size_t i = 0; i < f; ++i)
            out[i] = isa::apply_alu(in.alu0, out[i], a[r * f + i]);
        write(core, d, out);
        break;
      }
      case Opcode::dma_transpose: {
        // Destination row i, element r <- source row r, element i.
        const AccessPattern& src = ops[1];
        const Walk& swk = walk(src);
        const Walk& dwk = walk(d);
        const auto sb = bases(core, src);
        const auto db = bases(core, d);
        const std::size_t sz = static_cast<std::size_t>(swk.size);
        const int drows = static_cast<int>(swk.offs.size());
        const bool apart =
            src.mem != d.mem || src.max_byte() <= d.min_byte() || d.max_byte() <= src.min_byte() ||
            (src.mem != Mem::hbm && (src.start_partition + src.partitions <= d.start_partition ||
                                     d.start_partition + d.partitions <= src.start_partition));
        if (!apart || !disjoint_rows(d, dwk)) {
          // Source and destination share bytes, or destination rows do:
          // element by element in source order, each source row checked
          // just before it is read (what an earlier row wrote counts).
          for (int r = 0; r < src.rows(); ++r) {
            const std::size_t ru = static_cast<std::size_t>(r);
            check_written(sb[ru].second, src, r, swk, "the DMA source");
            for (std::size_t i = 0; i < swk.offs.size(); ++i) {
              std::memcpy(db[i].first + dwk.offs[ru], sb[ru].first + swk.offs[i], sz);
              if (db[i].second) std::memset(db[i].second + dwk.offs[ru], s.mark_, sz);
            }
          }
          break;
        }
        for (int r = 0; r < src.rows(); ++r)
          check_written(sb[static_cast<std::size_t>(r)].second, src, r, swk, "the DMA source");
        for_rows(drows, src.elements(), [&](int i) {
          const std::size_t iu = static_cast<std::size_t>(i);
          std::uint8_t* dst = db[iu].first;
          const std::int64_t so = swk.offs[iu];
          switch (sz) {
            case 2:
              for (std::size_t r = 0; r < sb.size(); ++r)
                std::memcpy(dst + dwk.offs[r], sb[r].first + so, 2);
              break;
            case 4:
              for (std::size_t r = 0; r < sb.size(); ++r)
                std::memcpy(dst + dwk.offs[r], sb[r].first + so, 4);
              break;
            default:
              for (std::size_t r = 0; r < sb.size(); ++r)
                std::memcpy(dst + dwk.offs[r], sb[r].first + so, sz);
          }
          mark_written(db[iu].second, dwk);
        });
        break;
      }
      case Opcode::max8:
      case Opcode::find_index8:
      case Opcode::match_replace8:
      case Opcode::tensor_scan:
      case Opcode::select_reduce:
      case Opcode::range_select:
      case Opcode::nonzero_count:
      case Opcode::n_gather:
      case Opcode::stream_shuffle:
      case Opcode::local_gather:
        execute_select(core, in);
        break;
      case Opcode::dma_gather:
      case Opcode::dma_scatter:
        indirect_dma(core, in);
        break;
      case Opcode::reg_set:
      case Opcode::reg_alu:
      case Opcode::branch:
      case Opcode::core_sync:
      case Opcode::count_:
        break;
    }
  }

  // One partition of an SBUF/PSUM operand.
  static AccessPattern partition_of(const AccessPattern& ap, int r) {
    AccessPattern p = ap;
    p.start_partition += r;
    p.partitions = 1;
    return p;
  }

  // The selection, search and scan instructions, row by row through the
  // definitions in isa/select_ops.h.
  void execute_select(int core, const Instruction& in) {
    const auto& ops = in.operands;
    const AccessPattern& d = ops[0];
    const std::size_t rows = static_cast<std::size_t>(d.rows());
    const std::size_t f = static_cast<std::size_t>(d.free_size());
    switch (in.op) {
      case Opcode::max8:
      case Opcode::find_index8:
      case Opcode::match_replace8: {
        Floats x = read(core, ops[1], "the source");
        const std::size_t n = static_cast<std::size_t>(ops[1].free_size());
        Floats vals, out(rows * 8), idx(rows * 8);
        if (in.op != Opcode::max8) vals = read(core, ops[2], "vals");
        for (std::size_t r = 0; r < rows; ++r) {
          float* row = x.data() + r * n;
          if (in.op == Opcode::max8) isa::max8_row(row, n, out.data() + r * 8);
          if (in.op == Opcode::find_index8)
            isa::find_index8_row(row, n, vals.data() + r * 8, out.data() + r * 8);
          if (in.op == Opcode::match_replace8)
            isa::match_replace8_row(row, n, vals.data() + r * 8, in.imm0, idx.data() + r * 8);
        }
        if (in.op == Opcode::match_replace8) {
          write(core, d, x);
          if (ops.size() == 4) write(core, ops[3], idx);
        } else {
          write(core, d, out);
        }
        break;
      }
      case Opcode::tensor_scan: {
        const Floats a = read(core, ops[1], "data0");
        const Floats b = read(core, ops[2], "data1");
        const Floats init = in.col0 ? read(core, ops[3], "the initial value") : Floats{};
        Floats out(rows * f);
        for (std::size_t r = 0; r < rows; ++r)
          isa::scan_row(a.data() + r * f, b.data() + r * f, f, in.col0 ? init[r] : in.imm0, in.alu0,
                        in.alu1, in.reverse0, in.reverse1, out.data() + r * f);
        write(core, d, out);
        break;
      }
      case Opcode::select_reduce:
      case Opcode::range_select: {
        const bool sel = in.op == Opcode::select_reduce;
        const Floats p = sel ? read(core, ops[1], "the predicate") : Floats{};
        Floats x = read(core, ops[sel ? 2 : 1], sel ? "on_true" : "on_true_tile");
        const Floats fill = sel && in.col0 ? read(core, ops[3], "on_false") : Floats{};
        const Floats b0 = sel ? Floats{} : read(core, ops[2], "bound0");
        const Floats b1 = sel ? Floats{} : read(core, ops[3], "bound1");
        Floats mx(rows, -std::numeric_limits<float>::infinity());
        for (std::size_t r = 0; r < rows; ++r) {
          for (std::size_t i = 0; i < f; ++i) {
            float& v = x[r * f + i];
            bool keep;
            if (sel) {
              keep = (p[r * f + i] != 0.0f) != in.reverse0;
            } else {
              const float at = in.imm0 + static_cast<float>(i);
              keep = isa::apply_alu(in.alu0, at, b0[r]) != 0.0f &&
                     isa::apply_alu(in.alu1, at, b1[r]) != 0.0f;
            }
            if (!keep) v = sel ? (in.col0 ? fill[r] : in.imm0) : in.imm1;
            mx[r] = std::max(mx[r], v);
          }
        }
        write(core, d, x);
        reduce_registers(vec_regs[core], d.start_partition, static_cast<int>(in.imm2),
                         -std::numeric_limits<float>::infinity(), in.imm3, mx,
                         [](float a, float b) { return std::max(a, b); });
        if (in.accumulate) write(core, ops.back(), mx);
        break;
      }
      case Opcode::nonzero_count: {
        // Each GpSimd core works on the first partition of its 16.
        const std::size_t n = static_cast<std::size_t>(ops[1].free_size());
        for (int r = 0; r < d.rows(); ++r) {
          if ((d.start_partition + r) % 16 != 0) continue;
          const Floats x = read(core, partition_of(ops[1], r), "the source");
          Floats out(n + 1);
          isa::nonzero_row(x.data(), n, in.imm0, in.imm1, out.data());
          write(core, partition_of(d, r), out);
        }
        break;
      }
      case Opcode::n_gather: {
        const Floats x = read(core, ops[1], "the data");
        const auto idx = read_int(core, ops[2], "the indices");
        const std::size_t n = static_cast<std::size_t>(ops[1].free_size());
        Floats out(rows * f);
        for (std::size_t r = 0; r < rows; ++r)
          for (std::size_t j = 0; j < f; ++j) {
            const std::int64_t k = idx[r * f + j];
            if (k < 0 || static_cast<std::size_t>(k) >= n)
              throw Error(fmt::format(
                  "nc_n_gather index {} outside the {} data elements of partition {}", k, n, r));
            out[r * f + j] = x[r * n + static_cast<std::size_t>(k)];
          }
        write(core, d, out);
        break;
      }
      case Opcode::stream_shuffle: {
        // Every source partition is read before any destination is written
        // (in-place shuffles see the old values).
        std::vector<Floats> src(rows);
        for (std::size_t r = 0; r < rows; ++r) {
          const std::int32_t t = in.table[r % 32];
          if (t == 255) continue;
          const int from = static_cast<int>(r / 32 * 32) + t;
          if (from >= ops[1].rows())
            throw Error(fmt::format("nc_stream_shuffle reads source partition {} of {}", from,
                                    ops[1].rows()));
          src[r] = read(core, partition_of(ops[1], from), "the source");
        }
        for (std::size_t r = 0; r < rows; ++r)
          if (in.table[r % 32] != 255) write(core, partition_of(d, static_cast<int>(r)), src[r]);
        break;
      }
      case Opcode::local_gather: {
        // 16-partition groups: the group's indices in partition-major order
        // (index[p, j] for p then j... flattened column by column), each
        // selecting imm0 consecutive elements of every partition of the group.
        const auto k = static_cast<std::size_t>(in.imm0);
        const auto valid = static_cast<std::size_t>(in.imm1);
        const Floats x = read(core, ops[1], "the source");
        const auto idx = read_int(core, ops[2], "the index");
        const std::size_t n = static_cast<std::size_t>(ops[1].free_size());
        const std::size_t ni = static_cast<std::size_t>(ops[2].free_size());
        if (f < valid * k) throw Error("local_gather destination is too small for its indices");
        Floats out(rows * f, 0.0f);
        for (std::size_t g = 0; g < rows / 16; ++g) {
          std::vector<std::int64_t> flat;
          for (std::size_t j = 0; j < ni; ++j)
            for (std::size_t p = 0; p < 16; ++p) flat.push_back(idx[(g * 16 + p) * ni + j]);
          for (std::size_t p = 0; p < 16; ++p)
            for (std::size_t v = 0; v < valid && v < flat.size(); ++v)
              for (std::size_t e = 0; e < k; ++e) {
                const std::size_t at = static_cast<std::size_t>(flat[v]) * k + e;
                if (at >= n)
                  throw Error(fmt::format("local_gather index {} is out of range", flat[v]));
                out[(g * 16 + p) * f + v * k + e] = x[(g * 16 + p) * n + at];
              }
        }
        write(core, d, out);
        break;
      }
      default:
        break;
    }
  }

  // tensor_scalar with an operand first (imm op data), element by element.
  void tensor_scalar_reversed(int core, const Instruction& in) {
    const auto& ops = in.operands;
    Floats a = read(core, ops[1], "the source");
    std::size_t next = 2;
    const Floats c0 = in.col0 ? read(core, ops[next++], "column 0") : Floats{};
    const Floats c1 = in.col1 ? read(core, ops[next++], "column 1") : Floats{};
    const std::size_t f = static_cast<std::size_t>(ops[0].free_size());
    auto step = [](isa::AluOp op, float x, float v, bool rev) {
      if (op == isa::AluOp::bypass) return x;
      return rev ? isa::apply_alu(op, v, x) : isa::apply_alu(op, x, v);
    };
    for (std::size_t i = 0; i < a.size(); ++i) {
      const std::size_t r = i / f;
      const float v0 = in.col0 ? c0[r] : in.imm0, v1 = in.col1 ? c1[r] : in.imm1;
      a[i] = step(in.alu1, step(in.alu0, a[i], v0, in.reverse0), v1, in.reverse1);
    }
    write(core, ops[0], a);
  }

  // dma_gather / dma_scatter. The index tile is [P, K]; the SBUF operand's
  // free elements form K slots of F (the HBM view's row length): slot k of
  // partition p <-> HBM row idx[p, k]. Rows move one after the other in the
  // index tile's element order, partition by partition and slot by slot
  // within a partition (a kernel that puts consecutive tokens there gets
  // token order), so duplicate indices of an accumulating scatter add up in
  // that order, deterministically (as NKI's compiler serializes duplicate
  // offsets). Every index is checked before any row moves: an out-of-range
  // one stops the run (oob=error) or skips its row (oob=skip). Accumulation
  // is in FP32 with one rounding per row.
  void indirect_dma(int core, const Instruction& in) {
    const bool gather = in.op == Opcode::dma_gather;
    const AccessPattern& hbm = gather ? in.operands[1] : in.operands[0];
    const AccessPattern& sb = gather ? in.operands[0] : in.operands[1];
    const AccessPattern& ix = in.operands[2];
    const std::vector<std::int64_t> idx = read_int(core, ix, "the DMA index tile");
    const std::int64_t rows = hbm.rows();
    const int P = sb.partitions;
    const std::size_t K = static_cast<std::size_t>(ix.free_size());
    if (!in.oob_skip) {
      for (std::size_t j = 0; j < idx.size(); ++j) {
        if (idx[j] < 0 || idx[j] >= rows) {
          throw Error(fmt::format(
              "index {} at [{}, {}] of the index tile is outside the {} rows [0, {}) of the HBM "
              "{} (oob=error)",
              idx[j], ix.start_partition + static_cast<int>(j / K), j % K, rows, rows,
              gather ? "source" : "destination"));
        }
      }
    }
    const Walk& hwk = walk(hbm);
    const auto& hoffs = hwk.offs;
    const auto& soffs = walk(sb).offs;
    const std::size_t F = hoffs.size();
    // The SBUF operand's K slots, each a walk of its own.
    std::vector<Walk> slots;
    for (std::size_t k = 0; k < K; ++k)
      slots.push_back(make_walk({soffs.begin() + static_cast<std::ptrdiff_t>(k * F),
                                 soffs.begin() + static_cast<std::ptrdiff_t>((k + 1) * F)},
                                isa::size_bytes(sb.dtype)));
    const DType dt = gather ? sb.dtype : hbm.dtype, st = gather ? hbm.dtype : sb.dtype;
    const int dsz = isa::size_bytes(dt);
    const bool raw = !in.accumulate && dt == st;  // same type: the bytes move unchanged
    num::CastOptions co;
    co.rounding = opt.stochastic_rounding ? num::Rounding::stochastic : num::Rounding::nearest_even;
    co.seed = opt.seed;
    Floats v(F), old(F);
    for (int p = 0; p < P; ++p) {
      for (std::size_t k = 0; k < K; ++k) {
        const std::span<const std::int64_t> slot(slots[k].offs);
        const std::int64_t i = idx[static_cast<std::size_t>(p) * K + k];
        if (i < 0 || i >= rows) continue;  // oob=skip
        auto [hb, hw] = row(core, hbm, static_cast<int>(i));
        auto [sbase, sw] = row(core, sb, p);
        std::uint8_t *db = gather ? sbase : hb, *dw = gather ? sw : hw;
        const std::uint8_t *srcb = gather ? hb : sbase, *srcw = gather ? hw : sw;
        const std::span<const std::int64_t> doff = gather ? slot : std::span(hoffs),
                                            soff = gather ? std::span(hoffs) : slot;
        const AccessPattern& src_ap = gather ? hbm : sb;
        const AccessPattern& dst_ap = gather ? sb : hbm;
        const int src_row = gather ? static_cast<int>(i) : p,
                  dst_row = gather ? p : static_cast<int>(i);
        check_written(srcw, src_ap, src_row, gather ? hwk : slots[k], "the DMA source");
        if (raw) {
          for (std::size_t e = 0; e < F; ++e)
            std::memcpy(db + doff[e], srcb + soff[e], static_cast<std::size_t>(dsz));
        } else {
          decode_row(st, srcb, soff, v.data());
          if (in.accumulate) {
            check_written(dw, dst_ap, dst_row, gather ? slots[k] : hwk,
                          "the DMA accumulate destination");
            decode_row(dt, db, doff, old.data());
            for (std::size_t e = 0; e < F; ++e) v[e] += old[e];
          }
          encode_row(dt, v.data(), doff, db, co,
                     (serial << 24) + (static_cast<std::size_t>(p) * K + k) * F);
        }
        if (dw)
          for (std::size_t e = 0; e < F; ++e)
            std::memset(dw + doff[e], s.mark_, static_cast<std::size_t>(dsz));
      }
    }
  }

  // The Tensor engine's weight state: shapes and dtype pairing are checked
  // in every mode (they need no data).
  void tensor_state(int core, const Instruction& in) {
    if (in.op != Opcode::load_stationary && in.op != Opcode::multiply_moving) return;
    Stationary& st = stationary[core];
    const AccessPattern& d = in.operands[0];
    if (in.op == Opcode::load_stationary) {
      st.mx = in.operands.size() == 2;
      st.double_row = in.perf == isa::PerfMode::double_row;
      st.k = d.partitions * (st.mx ? 4 : st.double_row ? 2 : 1);
      st.m = static_cast<int>(d.free_size()) / (st.double_row ? 2 : 1);
      st.dtype = d.dtype;
      st.loaded = true;
      return;
    }
    if (in.op != Opcode::multiply_moving) return;
    const AccessPattern& mv = in.operands[1];
    if (!st.loaded) throw Error("multiply_moving without a load_stationary before it");
    const bool mx = in.operands.size() == 3;
    if (mx != st.mx) {
      throw Error(
          fmt::format("{} moving with {} stationary: MX operands pair only with MX operands",
                      mx ? "an MX" : "a non-MX", st.mx ? "an MX" : "a non-MX"));
    }
    const bool dr = in.perf == isa::PerfMode::double_row;
    if (dr != st.double_row) {
      throw Error(fmt::format("a {} multiply after a {} weight load: both must use perf=double_row",
                              dr ? "double-row" : "normal",
                              st.double_row ? "double-row" : "normal"));
    }
    if (!mx) check_pairing(st, mv);
    const int k = mv.partitions * (mx ? 4 : dr ? 2 : 1);
    if (k != st.k) {
      throw Error(fmt::format("moving has contraction {} but the stationary has {}", k, st.k));
    }
    if (d.partitions != st.m) {
      throw Error(fmt::format("output has {} partitions but the stationary has {} columns",
                              d.partitions, st.m));
    }
  }

  void check_pairing(const Stationary& st, const AccessPattern& mv) {
    auto wide = [](DType t) { return t == DType::fp32 || t == DType::tf32; };
    if (wide(st.dtype) != wide(mv.dtype)) {
      throw Error(fmt::format("stationary {} with moving {}: fp32/tf32 pair only with fp32/tf32",
                              isa::name(st.dtype), isa::name(mv.dtype)));
    }
    auto ocp = [](DType t) { return t == DType::fp8_e4m3; };
    auto legacy = [](DType t) { return t == DType::fp8_e4m3_legacy; };
    if ((ocp(st.dtype) && legacy(mv.dtype)) || (legacy(st.dtype) && ocp(mv.dtype))) {
      throw Error("the legacy float8_e4m3 cannot be mixed with OCP float8_e4m3fn");
    }
  }
};

namespace {

// Bounding box of an operand: (memory, first..last row, first..last byte).
struct Box {
  Mem mem;
  std::int64_t r0, r1, b0, b1;
};
Box box(const AccessPattern& ap) {
  if (ap.mem == Mem::hbm) return {ap.mem, 0, 1, ap.min_byte(), ap.max_byte()};
  return {ap.mem, ap.start_partition, ap.start_partition + ap.partitions, ap.min_byte(),
          ap.max_byte()};
}
bool overlap(const Box& a, const Box& b) {
  return a.mem == b.mem && a.r0 < b.r1 && b.r0 < a.r1 && a.b0 < b.b1 && b.b0 < a.b1;
}

// Runs a register instruction; returns whether a branch is taken.
bool sequencer(std::vector<std::int32_t>& r, const Instruction& in) {
  auto reg = [&](int i) -> std::int64_t { return r[static_cast<std::size_t>(i)]; };
  auto alu = [&](std::int64_t a, std::int64_t b) {
    return isa::apply_alu_int(in.alu0, a, b, true);
  };
  const auto imm = static_cast<std::int64_t>(in.imm0);
  switch (in.op) {
    case Opcode::reg_set:
      r[static_cast<std::size_t>(in.rd)] = static_cast<std::int32_t>(imm);
      return false;
    case Opcode::reg_alu:
      // 32-bit registers: the result wraps around like the hardware's.
      r[static_cast<std::size_t>(in.rd)] = static_cast<std::int32_t>(
          static_cast<std::uint32_t>(alu(reg(in.ra), in.rb >= 0 ? reg(in.rb) : imm)));
      return false;
    case Opcode::branch:
      return in.ra < 0 || alu(reg(in.ra), imm) != 0;
    default:
      return false;
  }
}

std::string detail(const Instruction& in) {
  std::string s;
  for (std::size_t i = 0; i < in.operands.size(); ++i) {
    const auto& ap = in.operands[i];
    s += fmt::format("{}{}[{},{}] {}", i ? ", " : "", isa::mem_name(ap.mem), ap.rows(),
                     ap.free_size(), isa::name(ap.dtype));
  }
  return s;
}

}  // namespace

// A program's first run, for replays: the instructions that touch data in
// the order they ran, with their serial numbers (stochastic-rounding
// streams), and the run's statistics.
struct Simulator::Recording {
  std::weak_ptr<const isa::Program> program;
  struct Step {
    int core;
    std::size_t index;      // in its engine's stream (error messages)
    std::uint64_t serial;   // the instruction's number in the run
    const Instruction* in;  // the program's, or a register-resolved copy below
  };
  std::vector<Step> steps;                  // in run order
  std::vector<std::vector<Step>> per_core;  // the same, core by core
  std::deque<Instruction> resolved;
  RunStats stats;
  // No core writes HBM bytes that another core reads or writes: each
  // core's steps may then run on their own, in their recorded order.
  bool cores_independent = false;
  // Which SBUF bytes the program writes or reads depends on data (a gather
  // or scatter that skips out-of-range rows): replays keep checking
  // SBUF/PSUM flags.
  bool data_dependent_writes = false;
  // Elements each core's instructions move (operands summed): a replay puts
  // cores on threads only when that balances the threads' work.
  std::vector<std::int64_t> core_work;
};

namespace {

// [lo, hi) byte ranges, sorted and merged.
using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;
Ranges merged(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& x : r) {
    if (!out.empty() && x.first <= out.back().second)
      out.back().second = std::max(out.back().second, x.second);
    else
      out.push_back(x);
  }
  return out;
}
bool intersect(const Ranges& a, const Ranges& b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i].second <= b[j].first)
      ++i;
    else if (b[j].second <= a[i].first)
      ++j;
    else
      return true;
  }
  return false;
}

}  // namespace

RunStats Simulator::replay(const Recording& rec, const Options& opt) {
  const int ncores = static_cast<int>(program_->cores.size());
  // One functional model per host thread (row() caches an HBM region);
  // each core runs wholly on one of them.
  auto run_steps = [&](Impl& impl, const std::vector<Recording::Step>& steps,
                       std::uint64_t& failed_serial, std::exception_ptr& error) {
    for (const Recording::Step& s : steps) {
      impl.serial = s.serial;
      try {
        impl.tensor_state(s.core, *s.in);
        impl.execute(s.core, *s.in);
      } catch (const Error& err) {
        failed_serial = s.serial;
        error = std::make_exception_ptr(
            Error(fmt::format("{}: {}", where(s.core, *s.in, s.index), err.what())));
        return;
      } catch (...) {
        failed_serial = s.serial;
        error = std::current_exception();
        return;
      }
    }
  };
  std::vector<int> busy;
  for (int c = 0; c < ncores; ++c)
    if (!rec.per_core[static_cast<std::size_t>(c)].empty()) busy.push_back(c);
  const int hw = opt.threads > 0
                     ? opt.threads
                     : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Cores on threads when they are independent and their work balances
  // (the busiest core at most a quarter over an even share); otherwise one
  // thread runs the recorded order and splits large instructions' rows.
  int t = rec.cores_independent ? std::min(hw, static_cast<int>(busy.size())) : 1;
  if (t > 1) {
    std::int64_t total = 0, most = 0;
    for (const std::int64_t w : rec.core_work) total += w, most = std::max(most, w);
    if (4 * most * t > 5 * total) t = 1;
  }
  if (t <= 1) {
    Impl impl(*this, opt);
    impl.sram_flags = rec.data_dependent_writes;
    impl.stationary.resize(static_cast<std::size_t>(ncores));
    std::uint64_t serial = 0;
    std::exception_ptr error;
    run_steps(impl, rec.steps, serial, error);
    if (error) std::rethrow_exception(error);
    RunStats st = rec.stats;
    st.replay_threads = 1;
    return st;
  }
  // Cores on the host threads; the first error in run order is the one
  // reported.
  std::vector<std::uint64_t> serials(busy.size(), std::numeric_limits<std::uint64_t>::max());
  std::vector<std::exception_ptr> errors(busy.size());
#pragma omp parallel num_threads(t)
  {
    Impl impl(*this, opt);
    impl.sram_flags = rec.data_dependent_writes;
    impl.stationary.resize(static_cast<std::size_t>(ncores));
#pragma omp for schedule(dynamic, 1)
    for (std::size_t i = 0; i < busy.size(); ++i)
      run_steps(impl, rec.per_core[static_cast<std::size_t>(busy[i])], serials[i], errors[i]);
  }
  std::size_t first = busy.size();
  for (std::size_t i = 0; i < busy.size(); ++i)
    if (errors[i] && (first == busy.size() || serials[i] < serials[first])) first = i;
  if (first < busy.size()) std::rethrow_exception(errors[first]);
  RunStats st = rec.stats;
  st.replay_threads = t;
  return st;
}

RunStats Simulator::run(const Options& opt) {
  if (!loaded_) throw Error("no program loaded");
  const isa::Program& p = *program_;
  const int ncores = static_cast<int>(p.cores.size());
  const bool data = opt.mode != Mode::timing;
  if (data) {
    // Never shrunk: a later program with more cores reuses the memories.
    if (static_cast<int>(sbuf_.size()) < ncores) {
      sbuf_.resize(static_cast<std::size_t>(ncores));
      psum_.resize(static_cast<std::size_t>(ncores));
    }
    for (int c = 0; c < ncores; ++c) {
      if (sbuf_[c].partitions() == 0) {
        sbuf_[c] = Sram(chip_.sbuf_partitions, chip_.sbuf_partition_bytes.value(), true);
        psum_[c] = Sram(chip_.psum_partitions, chip_.psum_partition_bytes.value(), true);
      }
    }
  }
  // The walks of a training step's programs are a few thousand; a bound
  // keeps a long session of ever-new shapes from growing without end.
  if (walks_->size() > 65536 || walks_->bytes() > (std::size_t{256} << 20)) walks_->clear();
  const bool replayable = data && !opt.trace;
  if (replayable) {
    if (const auto it = recordings_.find(program_.get()); it != recordings_.end()) {
      const Recording& rec = *it->second;
      if (rec.program.lock() == program_ && rec.stats.instructions <= opt.max_instructions) {
        sbuf_used_ = std::max(sbuf_used_, rec.stats.sbuf_high_water);
        psum_used_ = std::max(psum_used_, rec.stats.psum_high_water);
        return replay(rec, opt);
      }
    }
  }
  // This run is recorded for later ones, with each core's HBM writes and
  // reads (bounding bytes) to tell whether cores can replay independently.
  const std::shared_ptr<Recording> rec = replayable ? std::make_shared<Recording>() : nullptr;
  std::vector<Ranges> hbm_writes(static_cast<std::size_t>(ncores)),
      hbm_reads(static_cast<std::size_t>(ncores));
  Impl impl(*this, opt);
  impl.stationary.resize(ncores);
  RunStats& st = impl.stats;
  st.engines.resize(ncores);

  const CostModel cost(chip_);
  struct EngineState {
    std::size_t pc = 0;  // next instruction of the stream
    double free_at = 0;
    double ls_end = 0, mm_start = 0, mm_end = 0;  // Tensor engine: background weight load
    std::vector<std::int32_t> regs;               // the sequencer's registers
    bool has_prev = false;                        // the previous executed instruction's
    Box prev_dst{};                               // destination (static-overhead rule)
  };
  std::vector<std::array<EngineState, isa::kEngines>> eng(ncores);
  for (auto& core : eng)
    for (auto& es : core) es.regs.assign(static_cast<std::size_t>(chip_.sequencer.registers), 0);
  std::vector<std::vector<std::vector<double>>> sem(ncores,
                                                    std::vector<std::vector<double>>(p.semaphores));
  DmaModel dma(chip_, ncores);

  auto target_of = [&](int c, int e, const isa::SemWait& w) {
    return w.value + (w.reg >= 0 ? eng[c][e].regs[static_cast<std::size_t>(w.reg)] : 0);
  };
  auto wait_ready = [&](int c, int e, const Instruction& in, double& t) {
    for (const auto& w : in.waits) {
      const std::int64_t v = target_of(c, e, w);
      const auto& times = sem[w.core >= 0 ? w.core : c][w.sem];
      if (v <= 0) continue;
      if (static_cast<std::int64_t>(times.size()) < v) return false;
      t = std::max(t, times[static_cast<std::size_t>(v - 1)]);
    }
    return true;
  };
  auto earliest = [&](int c, int e, const Instruction& in, double& t) {
    const EngineState& es = eng[c][e];
    t = es.free_at;
    if (e == static_cast<int>(Engine::tensor)) {
      if (in.op == Opcode::load_stationary)
        t = std::max(es.ls_end, es.mm_start);
      else
        t = std::max(es.mm_end, es.ls_end);
    }
    return wait_ready(c, e, in, t);
  };

  std::int64_t executed = 0;
  while (true) {
    int bc = -1, be = -1;
    double bt = std::numeric_limits<double>::infinity();
    bool remaining = false;
    for (int c = 0; c < ncores; ++c) {
      for (int e = 0; e < isa::kEngines; ++e) {
        const auto& stream = p.cores[c].streams[e];
        if (eng[c][e].pc >= stream.size()) continue;
        remaining = true;
        double t;
        if (earliest(c, e, stream[eng[c][e].pc], t) && t < bt) {
          bt = t;
          bc = c;
          be = e;
        }
      }
    }
    if (!remaining) break;
    if (bc < 0) {  // every remaining instruction waits for a signal that never comes
      std::string blocked;
      for (int c = 0; c < ncores; ++c) {
        for (int e = 0; e < isa::kEngines; ++e) {
          const auto& stream = p.cores[c].streams[e];
          if (eng[c][e].pc >= stream.size()) continue;
          const Instruction& in = stream[eng[c][e].pc];
          for (const auto& w : in.waits) {
            const std::int64_t v = target_of(c, e, w);
            const int wc = w.core >= 0 ? w.core : c;
            if (static_cast<std::int64_t>(sem[wc][w.sem].size()) < v) {
              const std::string whose = wc == c ? "" : fmt::format("core {}'s ", wc);
              blocked += fmt::format("{}{} waits for {}semaphore {} >= {} (it only reaches {})",
                                     blocked.empty() ? "" : "; ", where(c, in, eng[c][e].pc), whose,
                                     w.sem, v, sem[wc][w.sem].size());
              break;
            }
          }
        }
      }
      throw Error("deadlock: " + blocked);
    }
    if (++executed > opt.max_instructions) {
      throw Error(
          fmt::format("stopped after {} instructions (Options::max_instructions): a loop "
                      "that never ends?",
                      opt.max_instructions));
    }
    const int c = bc, e = be;
    EngineState& es = eng[c][e];
    const std::size_t index = es.pc;
    const auto& stream = p.cores[c].streams[e];
    std::size_t next_pc = index + 1;
    // Register-addressed operands take this moment's register values, and
    // are checked now that their addresses are known.
    Instruction resolved;
    const Instruction* inp = &stream[index];
    if (std::any_of(inp->operands.begin(), inp->operands.end(),
                    [](const AccessPattern& ap) { return ap.offset_reg >= 0; })) {
      resolved = *inp;
      for (auto& ap : resolved.operands) {
        if (ap.offset_reg >= 0)
          ap = isa::resolve(ap, es.regs[static_cast<std::size_t>(ap.offset_reg)]);
      }
      if (const std::string err = check_instruction(chip_, p, resolved); !err.empty()) {
        throw Error(fmt::format("{}: {}", where(c, resolved, index), err));
      }
      inp = &resolved;
    }
    const Instruction& in = *inp;
    const double start = bt;
    double end;
    std::string track(isa::engine_name(in.engine));
    if (in.op == Opcode::reg_set || in.op == Opcode::reg_alu || in.op == Opcode::branch ||
        in.op == Opcode::core_sync) {
      end = start + cost.duration_ns(in, false);
      try {
        if (sequencer(es.regs, in)) next_pc = static_cast<std::size_t>(in.target);
      } catch (const Error& err) {
        throw Error(fmt::format("{}: {}", where(c, in, index), err.what()));
      }
      if (e == static_cast<int>(Engine::tensor)) {
        es.mm_end = end;
        es.ls_end = std::max(es.ls_end, end);
      } else {
        es.free_at = end;
      }
    } else if (isa::is_dma(in.op)) {
      end = dma.transfer(c, in, start);
      // Triggering a DMA costs the engine no time, but its stream stays in
      // order: a later instruction of this engine cannot start before this
      // trigger did (the builder elides waits an engine already made on the
      // strength of that order).
      es.free_at = std::max(es.free_at, start);
      track = fmt::format("dma q{}", in.queue);
      ++st.dma_transfers;
      if (isa::is_indirect_dma(in.op)) {
        // The rows the indices select, not the whole HBM view (the index
        // tile is SBUF); an accumulating scatter reads and writes them.
        const std::int64_t rows = isa::indirect_hbm_bytes(in);
        st.dma_bytes += in.op == Opcode::dma_gather ? in.operands[0].bytes() : rows;
        st.hbm_bytes += rows * (in.op == Opcode::dma_scatter && in.accumulate ? 2 : 1);
      } else {
        st.dma_bytes += in.operands[0].bytes();
        for (const auto& ap : in.operands)
          if (ap.mem == Mem::hbm) st.hbm_bytes += ap.bytes();
        if (in.accumulate && in.operands[0].mem == Mem::hbm)
          st.hbm_bytes += in.operands[0].bytes();  // read-modify-write
      }
    } else {
      // A same-engine dependency on the previous instruction pays the static overhead.
      bool dependent = false;
      if (es.has_prev && e != static_cast<int>(Engine::tensor)) {
        for (std::size_t i = 1; i < in.operands.size(); ++i)
          dependent |= overlap(es.prev_dst, box(in.operands[i]));
      }
      es.has_prev = true;
      es.prev_dst = box(in.operands[0]);
      const double dur = cost.duration_ns(in, dependent);
      end = start + dur;
      if (in.op == Opcode::load_stationary) {
        es.ls_end = end;
      } else if (e == static_cast<int>(Engine::tensor)) {
        if (in.op == Opcode::multiply_moving) es.mm_start = start;
        es.mm_end = end;
        if (in.op == Opcode::transpose) es.ls_end = end;
        st.engines[c][e].busy_ns += dur;
      } else {
        es.free_at = end;
        st.engines[c][e].busy_ns += dur;
      }
      if (in.op == Opcode::multiply_moving) {
        const auto& mv = in.operands[1];
        const bool dr = in.perf == isa::PerfMode::double_row;
        const double k = mv.partitions * (isa::is_x4(mv.dtype) ? 4.0 : dr ? 2.0 : 1.0);
        st.tensor_flops[std::string(isa::name(mv.dtype))] +=
            2.0 * k * static_cast<double>(in.operands[0].free_size()) * in.operands[0].partitions;
      }
    }
    es.pc = next_pc;
    ++st.engines[c][e].instructions;
    for (const auto& ap : in.operands) {
      if (ap.mem == Mem::sbuf) st.sbuf_high_water = std::max(st.sbuf_high_water, ap.max_byte());
      if (ap.mem == Mem::psum) st.psum_high_water = std::max(st.psum_high_water, ap.max_byte());
    }
    // What the flags' clear at the mark's wrap-around must cover (before
    // the instruction runs: it may throw).
    sbuf_used_ = std::max(sbuf_used_, st.sbuf_high_water);
    psum_used_ = std::max(psum_used_, st.psum_high_water);
    if (rec && !in.operands.empty()) {
      const Instruction* kept = &in;
      if (inp == &resolved) kept = &rec->resolved.emplace_back(resolved);
      rec->steps.push_back({c, index, impl.serial, kept});
      // A gather that skips rows leaves SBUF slots unwritten, a scatter that
      // skips leaves them unread: which depends on the indices.
      if (isa::is_indirect_dma(in.op) && in.oob_skip) rec->data_dependent_writes = true;
      for (std::size_t i = 0; i < in.operands.size(); ++i) {
        const AccessPattern& ap = in.operands[i];
        if (ap.mem != Mem::hbm) continue;
        // Operand 0 is a DMA's destination; the others are read. Each row
        // counts by the bytes its elements span (cores often write column
        // blocks of one tensor); an indirect DMA's rows are chosen by data,
        // so it counts by its whole view.
        Ranges& to = (i == 0 ? hbm_writes : hbm_reads)[static_cast<std::size_t>(c)];
        if (isa::is_indirect_dma(in.op)) {
          to.emplace_back(ap.min_byte(), ap.max_byte());
          continue;
        }
        const Walk& w = impl.walk(ap);
        for (int r = 0; r < ap.rows(); ++r) {
          const std::int64_t row = ap.row_address(r);
          to.emplace_back(row + w.lo, row + w.hi);
        }
      }
    }
    try {
      impl.tensor_state(c, in);
      if (data) impl.execute(c, in);
    } catch (const Error& err) {
      throw Error(fmt::format("{}: {}", where(c, in, index), err.what()));
    }
    ++impl.serial;
    for (int sg : in.signals) {
      auto& times = sem[c][sg];
      times.insert(std::upper_bound(times.begin(), times.end(), end), end);
    }
    st.latency_ns = std::max(st.latency_ns, end);
    if (opt.trace)
      st.events.push_back(
          {c, track, std::string(isa::opcode_name(in.op)), start, end - start, detail(in)});
  }
  st.instructions = executed;
  st.dma_engine_busy_ns = dma.busy_ns();
  if (rec) {
    rec->program = program_;
    rec->stats = st;
    std::vector<Ranges> writes(static_cast<std::size_t>(ncores)),
        touched(static_cast<std::size_t>(ncores));
    for (std::size_t c = 0; c < writes.size(); ++c) {
      Ranges all = hbm_writes[c];
      all.insert(all.end(), hbm_reads[c].begin(), hbm_reads[c].end());
      writes[c] = merged(std::move(hbm_writes[c]));
      touched[c] = merged(std::move(all));
    }
    rec->cores_independent = true;
    for (const auto& core : p.cores)  // cores that wait for or write each other replay in order
      for (const auto& stream : core.streams)
        for (const auto& ins : stream) {
          if (ins.peer_core >= 0) rec->cores_independent = false;
          for (const auto& w : ins.waits)
            if (w.core >= 0) rec->cores_independent = false;
        }
    for (std::size_t a = 0; a < writes.size(); ++a)
      for (std::size_t b = 0; b < writes.size(); ++b)
        if (a != b && intersect(writes[a], touched[b])) rec->cores_independent = false;
    rec->per_core.resize(static_cast<std::size_t>(ncores));
    rec->core_work.assign(static_cast<std::size_t>(ncores), 0);
    for (const auto& step : rec->steps) {
      rec->per_core[static_cast<std::size_t>(step.core)].push_back(step);
      for (const auto& ap : step.in->operands)
        rec->core_work[static_cast<std::size_t>(step.core)] += ap.elements();
    }
    std::erase_if(recordings_, [](const auto& kv) { return kv.second->program.expired(); });
    recordings_[program_.get()] = rec;
  }
  return st;
}

}  // namespace tern::sim
