#include "sim/cost.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "util/error.h"

namespace tern::sim {

using isa::DType;
using isa::Engine;
using isa::Mem;
using isa::Opcode;

namespace {
bool strided(const isa::AccessPattern& ap, std::int64_t penalty_bytes) {
  // SBUF/PSUM deliver one element per partition per cycle while the
  // innermost stride is under 16 bytes; a larger stride halves that.
  if (ap.mem == Mem::hbm || ap.dims.empty()) return false;
  return std::abs(ap.dims.back().stride) * isa::size_bytes(ap.dtype) >= penalty_bytes &&
         ap.dims.back().count > 1;
}

// Descriptors (contiguous chunks) per row of a copy: a chunk ends where
// either side's contiguous run ends, and both sides walk a row's elements
// in the same order, so runs of a and b elements cut an n-element row into
// n/a + n/b - ceil(n/lcm(a, b)) chunks (the rule checks give both sides
// the same rows and elements). Transposes (their own DMA path) and indirect
// rows are one descriptor.
double descriptors_per_row(const isa::Instruction& in) {
  if (in.op != Opcode::dma_copy) return 1.0;
  const auto& dst = in.operands[0];
  const auto& src = in.operands[1];
  const std::int64_t a = dst.contiguous_run(), b = src.contiguous_run();
  const std::int64_t n = dst.free_size();
  if (n <= 1) return 1.0;
  const std::int64_t l = std::lcm(a, b);
  return static_cast<double>(n / a + n / b - (n + l - 1) / l);
}
}  // namespace

CostModel::CostModel(const arch::ChipSpec& chip) : chip_(chip) {
  const auto bf16 = chip.tensor.rate.find("bf16"), fp32 = chip.tensor.rate.find("fp32");
  if (bf16 != chip.tensor.rate.end() && fp32 != chip.tensor.rate.end() && fp32->second > 0)
    fp32_passes_ = bf16->second / fp32->second;
  for (const auto& name : chip.costs.perf_mode_dtypes) {
    try {
      perf_dtypes_.push_back(isa::parse_dtype(name));
    } catch (const Error&) {
      throw Error(fmt::format("{}: costs.perf_mode_dtypes: unknown data type '{}'",
                              chip.source.string(), name));
    }
  }
}

bool CostModel::perf_dtype(DType t) const {
  return std::find(perf_dtypes_.begin(), perf_dtypes_.end(), t) != perf_dtypes_.end();
}

// The Vector performance mode (NKI Trainium2 architecture guide): 4x for a
// tensor_copy / tensor_scalar with input and output in SBUF, of qualifying
// types and contiguous innermost; 2x for the same strided, or contiguous
// with one side in PSUM, and for a tensor_tensor with both inputs in SBUF
// and every operand of a qualifying type.
double CostModel::vector_speedup(const isa::Instruction& in) const {
  if (in.engine != Engine::vector || perf_dtypes_.empty() || in.operands.size() < 2) return 1.0;
  const auto& d = in.operands[0];
  const auto& a = in.operands[1];
  const auto& cs = chip_.costs;
  switch (in.op) {
    case Opcode::tensor_copy:
    case Opcode::tensor_scalar: {
      if (!perf_dtype(d.dtype) || !perf_dtype(a.dtype)) return 1.0;
      const int psum = (d.mem == Mem::psum) + (a.mem == Mem::psum);
      const bool contiguous = d.contiguous_inner() && a.contiguous_inner();
      if (psum == 0) return contiguous ? cs.vector_perf_copy_speedup : cs.vector_perf_speedup;
      return psum == 1 && contiguous ? cs.vector_perf_speedup : 1.0;
    }
    case Opcode::tensor_tensor: {
      const auto& b = in.operands[2];
      const bool ok = a.mem == Mem::sbuf && b.mem == Mem::sbuf && perf_dtype(d.dtype) &&
                      perf_dtype(a.dtype) && perf_dtype(b.dtype);
      return ok ? cs.vector_perf_speedup : 1.0;
    }
    default:
      return 1.0;
  }
}

double CostModel::perf_speedup(const isa::Instruction& in) const {
  if (in.engine == Engine::vector) return vector_speedup(in);
  // Scalar (v4 datapath table): qualifying data in and out at
  // scalar_perf_speedup elements per lane and cycle.
  const bool scalar_op =
      in.op == Opcode::activation || in.op == Opcode::tensor_copy || in.op == Opcode::tensor_scalar;
  if (in.engine == Engine::scalar && scalar_op && in.operands.size() >= 2 &&
      perf_dtype(in.operands[0].dtype) && perf_dtype(in.operands[1].dtype))
    return chip_.costs.scalar_perf_speedup;
  return 1.0;
}

bool CostModel::takes_gpsimd_bus(const isa::Instruction& in) const {
  if (!chip_.costs.vector_perf_shares_gpsimd_bus || in.engine != Engine::vector) return false;
  // QuantizeMX runs in the 4x performance mode too (NKI Trainium3 guide).
  return vector_speedup(in) > 1.0 ||
         (in.op == Opcode::quantize_mx && chip_.costs.quantize_mx_speedup > 1);
}

double CostModel::cycles(const isa::Instruction& in, bool dependent) const {
  if (in.op == Opcode::reg_set || in.op == Opcode::reg_alu || in.op == Opcode::branch ||
      in.op == Opcode::core_sync) {
    return static_cast<double>(chip_.sequencer.op_cycles.value());  // the engine's sequencer
  }
  const double min_ii = static_cast<double>(chip_.costs.min_ii.value());
  const double gpsimd = static_cast<double>(chip_.costs.gpsimd_fixed.value());
  const auto& d = in.operands[0];
  double n = static_cast<double>(d.free_size());
  bool any_strided = false;
  for (const auto& ap : in.operands) any_strided |= strided(ap, chip_.costs.stride_penalty.value());
  const double penalty = any_strided ? chip_.costs.strided_slowdown : 1.0;
  double c = 0;
  switch (in.op) {
    case Opcode::load_stationary: {
      // Up to load_stationary_speedup (4) times faster than a
      // MultiplyMoving of the same free size; FP32 takes fp32_passes_ (4).
      const double fp32 = d.dtype == DType::fp32 ? fp32_passes_ : 1.0;
      return std::max(1.0, std::ceil(n / chip_.costs.load_stationary_speedup)) * fp32;
    }
    case Opcode::multiply_moving: {
      const auto& mv = in.operands[1];
      const double fp32 = mv.dtype == DType::fp32 ? fp32_passes_ : 1.0;
      // max(min(64, N_stationary), N_moving), N_stationary = output partitions,
      // N_moving = output columns (a double-row tile streams 2 rows per column).
      return std::max(std::min(min_ii, static_cast<double>(d.partitions)),
                      static_cast<double>(d.free_size())) *
             fp32;
    }
    case Opcode::transpose: {
      const auto& s = in.operands[1];
      if (in.engine == Engine::vector) return std::max(min_ii, static_cast<double>(s.free_size()));
      return std::max(static_cast<double>(s.partitions),
                      std::min(min_ii, static_cast<double>(s.free_size())));
    }
    case Opcode::tensor_tensor: {
      const auto& a = in.operands[1];
      const auto& b = in.operands[2];
      const bool psum_in = a.mem == Mem::psum || b.mem == Mem::psum;
      const bool fast_bf16 = a.dtype == DType::bf16 && b.dtype == DType::bf16 &&
                             a.mem == Mem::sbuf && b.mem == Mem::sbuf && a.contiguous_inner() &&
                             b.contiguous_inner() &&
                             (in.alu0 == isa::AluOp::add || in.alu0 == isa::AluOp::multiply ||
                              in.alu0 == isa::AluOp::subtract);
      const double per = psum_in || fast_bf16 ? 1.0 : chip_.costs.tensor_tensor_cycles;
      // 2x in the Vector performance mode (16-bit inputs in SBUF, v3+).
      c = std::max(min_ii, per * n * penalty / perf_speedup(in));
      break;
    }
    case Opcode::scalar_tensor_tensor: {
      // nki.isa.scalar_tensor_tensor's estimated cost: N with data and b
      // both BF16, subtract then multiply and N even; else 2N.
      const bool fast = in.operands[1].dtype == DType::bf16 &&
                        in.operands[2].dtype == DType::bf16 && in.alu0 == isa::AluOp::subtract &&
                        in.alu1 == isa::AluOp::multiply && d.free_size() % 2 == 0;
      c = std::max(min_ii, (fast ? 1.0 : 2.0) * n * penalty);
      break;
    }
    case Opcode::tensor_reduce: {
      const auto& s = in.operands[1];
      const double ns = static_cast<double>(s.free_size());
      const bool half =
          s.dtype == DType::bf16 && (in.alu0 == isa::AluOp::add || in.alu0 == isa::AluOp::max);
      c = (half ? ns / chip_.costs.bf16_reduce_speedup : ns) * penalty;
      break;
    }
    case Opcode::rng:  // one element per lane and cycle, as a memset
    case Opcode::rng_state:
      c = std::max(min_ii, n * penalty);
      break;
    case Opcode::memset: {
      const bool half = in.imm0 == 0.0f && isa::size_bytes(d.dtype) == 2;
      c = std::max(min_ii, (half ? n / chip_.costs.memset_zero_16bit_speedup : n) * penalty);
      break;
    }
    case Opcode::activation:  // 2x for 16-bit data on trn3's Scalar (perf_speedup)
      c = std::max(min_ii, n * penalty / perf_speedup(in)) + (in.accumulate ? min_ii : 0.0);
      break;
    case Opcode::quantize_mx:  // N = source elements per partition, quantize_mx_speedup (4) a cycle
      c = std::max(min_ii, static_cast<double>(in.operands[2].free_size()) * penalty /
                               chip_.costs.quantize_mx_speedup);
      break;
    case Opcode::reciprocal:
      c = std::max(min_ii, chip_.costs.reciprocal_cycles * n * penalty);
      break;
    case Opcode::bn_stats:
      c = std::max(min_ii, static_cast<double>(in.operands[1].free_size()) * penalty);
      break;
    case Opcode::bn_aggr:
      c = std::max(min_ii, chip_.costs.bn_aggr_cycles_per_3 *
                               static_cast<double>(in.operands[1].free_size()) / 3.0 * penalty);
      break;
    case Opcode::exponential: {  // the v4 fast exp: fast_exp_speedup (4) x the Scalar rate
      if (chip_.costs.fast_exp_speedup == 0)
        throw NotSupported(fmt::format("exponential on {}: the chip has no fast exp", chip_.name));
      c = std::max(min_ii, n / chip_.costs.fast_exp_speedup * penalty) +
          (in.accumulate ? min_ii : 0.0);
      break;
    } break;
    case Opcode::affine_select:
    case Opcode::partition_reduce:
      c = gpsimd + static_cast<double>(in.operands[1].free_size());  // GpSimd ~150 + N
      break;
    case Opcode::iota:
      c = gpsimd + n;  // GpSimd ~150 + N (hardware.md section 3)
      break;
    // Selection, search and scan (the NKI API reference's estimated costs;
    // N = source elements per partition).
    case Opcode::max8:
    case Opcode::find_index8:
      c = static_cast<double>(in.operands[1].free_size()) * penalty;
      break;
    case Opcode::match_replace8:
    case Opcode::select_reduce:
    case Opcode::range_select:
    case Opcode::stream_shuffle:
      c = std::max(min_ii, static_cast<double>(in.operands[1].free_size()) * penalty);
      break;
    case Opcode::tensor_scan:
      c = std::max(min_ii, 2.0 * n * penalty);
      break;
    case Opcode::nonzero_count:
    case Opcode::n_gather:
    case Opcode::sequence_bounds:
      c = gpsimd + static_cast<double>(in.operands[1].free_size());
      break;
    case Opcode::local_gather: {
      // 150 + indices x elements / C, C = ((28 + 4k) / 4k) / min(4 / dtype bytes, k)
      const double k = in.imm0, t = 4.0;
      const double per = std::min(4.0 / isa::size_bytes(d.dtype), k);
      const double cc = ((28.0 + t * k) / (t * k)) / per;
      c = gpsimd + in.imm1 * k / cc;
      break;
    }
    case Opcode::tensor_scalar:
    case Opcode::tensor_copy:
      // N over the Vector (4x / 2x) or Scalar (2x) performance-mode speedup.
      c = std::max(min_ii, n * penalty / perf_speedup(in));
      break;
    default:
      c = std::max(min_ii, n * penalty);
      break;
  }
  // An instruction reading what the previous one of its engine wrote starts
  // its read only once that output is committed to SRAM (NKI performance
  // guide, opt. 5a): it pays the static overhead, and the access start that
  // a pipelined, independent instruction hides inside MIN_II.
  if (dependent) {
    c +=
        static_cast<double>(chip_.costs.static_overhead.value() + chip_.costs.access_start.value());
  }
  return c;
}

double CostModel::duration_ns(const isa::Instruction& in, bool dependent) const {
  double ghz = 1;
  switch (in.engine) {
    case Engine::tensor:
      ghz = chip_.tensor.clock.value();
      break;
    case Engine::vector:
      ghz = chip_.vector.clock.value();
      break;
    case Engine::scalar:
      ghz = chip_.scalar.clock.value();
      break;
    case Engine::gpsimd:
      ghz = chip_.gpsimd.clock.value();
      break;
    case Engine::sync:
      ghz = chip_.sequencer.sync_clock.value();
      break;
    default:
      break;
  }
  return cycles(in, dependent) / ghz;
}

std::size_t HbmCalendar::after(double t) const {
  return static_cast<std::size_t>(
      std::upper_bound(busy_.begin() + static_cast<std::ptrdiff_t>(head_), busy_.end(), t,
                       [](double v, const Interval& i) { return v < i.start; }) -
      busy_.begin());
}

std::size_t HbmCalendar::at_or_after(double t) const {
  return static_cast<std::size_t>(
      std::lower_bound(busy_.begin() + static_cast<std::ptrdiff_t>(head_), busy_.end(), t,
                       [](const Interval& i, double v) { return i.start < v; }) -
      busy_.begin());
}

void HbmCalendar::insert(double lo, double hi) {
  // Most reservations extend the calendar's end: append or merge there.
  if (busy_.size() == head_ || lo > busy_.back().start) {
    if (busy_.size() > head_ && busy_.back().end >= lo) {
      busy_.back().end = std::max(busy_.back().end, hi);
    } else {
      busy_.push_back({lo, hi});
    }
    return;
  }
  // [lo, hi) lies in a gap (reserve only inserts free time), so the first
  // interval at or after lo is also the first at or after hi.
  std::size_t at = at_or_after(lo);
  if (at > head_ && busy_[at - 1].end >= lo) {  // touches the interval before
    lo = busy_[at - 1].start;
    busy_.erase(busy_.begin() + static_cast<std::ptrdiff_t>(--at));
  }
  if (at < busy_.size() && busy_[at].start <= hi) {  // touches the one after
    hi = busy_[at].end;
    busy_.erase(busy_.begin() + static_cast<std::ptrdiff_t>(at));
  }
  busy_.insert(busy_.begin() + static_cast<std::ptrdiff_t>(at), Interval{lo, hi});
}

double HbmCalendar::reserve(double start, double duration, double horizon) {
  // Forget what can no longer matter; compact once the forgotten prefix is
  // most of the array.
  while (head_ < busy_.size() && busy_[head_].end < horizon) ++head_;
  if (head_ > 32 && 2 * head_ > busy_.size()) {
    busy_.erase(busy_.begin(), busy_.begin() + static_cast<std::ptrdiff_t>(head_));
    head_ = 0;
  }
  double need = duration, cur = start;
  // The interval containing `cur`, if any, pushes it to that interval's end.
  std::size_t it = after(cur);
  if (it > head_ && busy_[it - 1].end > cur) cur = busy_[it - 1].end;
  while (true) {
    it = after(cur);  // the next interval starting after cur
    const double gap_end =
        it == busy_.size() ? std::numeric_limits<double>::infinity() : busy_[it].start;
    const double take = std::min(need, gap_end - cur);
    if (take > 0) {
      insert(cur, cur + take);
      need -= take;
      cur += take;
    }
    if (need <= 0) return cur;
    // cur sits at the start of the next busy interval: skip past it.
    cur = busy_[after(cur) - 1].end;
  }
}

DmaModel::DmaModel(const arch::ChipSpec& chip, int cores)
    : chip_(chip),
      engine_free_(cores, std::vector<double>(chip.dma.engines_per_core, 0.0)),
      queue_done_(cores, std::vector<double>(chip.dma.queues_per_engine, 0.0)),
      dge_free_(cores, std::vector<double>(static_cast<std::size_t>(chip.dma.dge_instances), 0.0)) {
}

double DmaModel::transfer(int core, const isa::Instruction& in, double issue) {
  const auto& dst = in.operands[0];
  const auto& src = in.operands[1];
  // Rows are the SBUF side's partitions (HBM -> HBM: the source rows).
  const auto& side = dst.mem != Mem::hbm ? dst : src;
  // An indirect transfer moves one row per index, not its whole HBM view;
  // each row is one descriptor like any DMA row, and the descriptors are
  // generated from the indices at run time (DGE) before the first row moves.
  const bool indirect = isa::is_indirect_dma(in.op);
  const std::int64_t bytes = indirect ? std::max(side.bytes(), isa::indirect_hbm_bytes(in))
                                      : std::max(dst.bytes(), src.bytes());
  // Issues arrive in time order: the calendar's horizon is the issue time,
  // not the later moment an indirect transfer's rows can start.
  horizon_ = std::max(horizon_, issue);
  if (indirect) issue += chip_.dma.descriptor_gen.value();
  if (in.hwdge && !dge_free_[core].empty()) {
    // The first free DGE instance builds the descriptors (about 600 ns an
    // instruction, Descriptor Generation Engine reference); the rows move
    // after it.
    auto& dge = dge_free_[core];
    const auto it = std::min_element(dge.begin(), dge.end());
    const double start = std::max(issue, *it);
    *it = start + chip_.dma.descriptor_gen.value();
    issue = *it;
  }
  // Accumulating into HBM is a read-modify-write there: its bytes cross
  // HBM twice.
  const double hbm_passes = in.accumulate && dst.mem == Mem::hbm ? 2.0 : 1.0;
  // An indirect transfer's rows are its indices (P x K), one descriptor each.
  const int rows =
      std::max(1, indirect ? static_cast<int>(in.operands[2].elements()) : side.rows());
  const int engines = chip_.dma.engines_per_core;
  const int parts = std::min(engines, rows);
  const double row_bytes = static_cast<double>(bytes) / rows;
  // Every descriptor pays the per-descriptor processing cost; a contiguous
  // row is one descriptor.
  const double overhead =
      static_cast<double>(chip_.dma.overhead_bound_per_partition.value()) * descriptors_per_row(in);
  const double bw = chip_.dma.engine_bandwidth.value();  // bytes per ns
  const bool hbm = dst.mem == Mem::hbm || src.mem == Mem::hbm;
  double done = 0;
  auto& free = engine_free_[core];
  for (int j = 0; j < parts; ++j) {
    // Rows are dealt out evenly; the queue id rotates which engine goes first.
    const int part_rows = rows / parts + (j < rows % parts ? 1 : 0);
    const int e = (in.queue + j) % engines;
    const double busy = part_rows * (overhead + row_bytes) / bw;
    const double start = std::max(issue, free[e]);
    free[e] = start + busy;
    busy_ += busy;
    double leave = start + busy;
    if (hbm) {
      const double hbm_done = hbm_.reserve(
          start, hbm_passes * part_rows * row_bytes / chip_.hbm_bandwidth.value(), horizon_);
      leave = std::max(leave, hbm_done);
    }
    done = std::max(done, leave + chip_.dma.fixed_cost.value());
  }
  done = std::max(done, queue_done_[core][in.queue]);  // a queue completes in order
  queue_done_[core][in.queue] = done;
  return done;
}

}  // namespace tern::sim
