#include "sim/check.h"
#include "util/checked.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tern::sim {

using isa::AccessPattern;
using isa::DType;
using isa::Engine;
using isa::Mem;
using isa::Opcode;

std::string where(int core, const isa::Instruction& in, std::size_t index) {
  std::string s = fmt::format("core {}, {} instruction #{} ({})", core, isa::engine_name(in.engine),
                              index, isa::opcode_name(in.op));
  if (!in.loc.empty()) s += " at " + in.loc;
  return s;
}

namespace {

// Which engines may run each opcode.
bool engine_allowed(Opcode op, Engine e) {
  switch (op) {
    case Opcode::dma_copy:  // any engine's queue may trigger a DMA, as on the hardware
    case Opcode::dma_transpose:
    case Opcode::dma_gather:
    case Opcode::dma_scatter:
      return e != Engine::tensor;
    case Opcode::load_stationary:
    case Opcode::multiply_moving:
      return e == Engine::tensor;
    case Opcode::transpose:  // Tensor engine (128 x 128) or Vector engine (32 x 32)
      return e == Engine::tensor || e == Engine::vector;
    case Opcode::tensor_tensor:
    case Opcode::scalar_tensor_tensor:
    case Opcode::memset:
    case Opcode::rng:
    case Opcode::rng_state:
      return e == Engine::vector || e == Engine::gpsimd;
    case Opcode::tensor_scalar:
    case Opcode::tensor_copy:
      return e == Engine::vector || e == Engine::scalar || e == Engine::gpsimd;
    case Opcode::tensor_reduce:
    case Opcode::quantize_mx:
    case Opcode::reciprocal:
    case Opcode::bn_stats:
    case Opcode::bn_aggr:
    case Opcode::select:
    case Opcode::copy_predicated:
    case Opcode::exponential:
    case Opcode::max8:
    case Opcode::find_index8:
    case Opcode::match_replace8:
    case Opcode::tensor_scan:
    case Opcode::select_reduce:
    case Opcode::range_select:
    case Opcode::stream_shuffle:
      return e == Engine::vector;
    case Opcode::affine_select:
    case Opcode::partition_reduce:
    case Opcode::nonzero_count:
    case Opcode::n_gather:
    case Opcode::local_gather:
    case Opcode::sequence_bounds:
      return e == Engine::gpsimd;
    case Opcode::activation:
      return e == Engine::scalar;
    case Opcode::iota:
      return e == Engine::gpsimd;
    case Opcode::reg_set:
    case Opcode::reg_alu:
    case Opcode::branch:
    case Opcode::core_sync:
      return true;  // every engine has a sequencer
    case Opcode::count_:
      break;
  }
  return false;
}

struct Arity {
  int min, max;
};
Arity arity(Opcode op) {
  switch (op) {
    case Opcode::dma_copy:
      return {2, 2};
    case Opcode::load_stationary:
      return {1, 2};  // [+ MX scales]
    case Opcode::multiply_moving:
      return {2, 3};  // [+ MX scales]
    case Opcode::transpose:
      return {2, 2};
    case Opcode::tensor_tensor:
      return {3, 3};
    case Opcode::scalar_tensor_tensor:
      return {3, 4};  // dst, data, b, [column [P, 1] if col0]
    case Opcode::tensor_scalar:
      return {2, 4};  // dst, src, [column 0 [P, 1]], [column 1 [P, 1]]
    case Opcode::tensor_copy:
      return {2, 2};
    case Opcode::tensor_reduce:
      return {2, 2};
    case Opcode::memset:
    case Opcode::rng_state:
      return {1, 1};
    case Opcode::rng:
      return {1, 3};  // dst, [lo column], [hi column]
    case Opcode::activation:
      return {2, 5};  // dst, src, [scale [P,1] if col0], [bias [P,1]], [row sums [P,1] if acc]
    case Opcode::iota:
      return {1, 1};
    case Opcode::reg_set:
    case Opcode::reg_alu:
    case Opcode::branch:
      return {0, 0};
    case Opcode::core_sync:
      return {0, 4};  // views it is ordered against (never accessed)
    case Opcode::quantize_mx:
      return {3, 3};  // dst x4, dst_scale, src
    case Opcode::reciprocal:
    case Opcode::bn_stats:
    case Opcode::bn_aggr:
    case Opcode::affine_select:
    case Opcode::partition_reduce:
    case Opcode::dma_transpose:
      return {2, 2};
    case Opcode::select:
      return {4, 4};  // dst, pred, a, b
    case Opcode::copy_predicated:
      return {3, 3};  // dst, pred, src
    case Opcode::dma_gather:
    case Opcode::dma_scatter:
      return {3, 3};  // dst, src, index tile
    case Opcode::exponential:
      return {2, 4};  // dst, src, [sub [P,1]], [row sums [P,1] if acc]
    case Opcode::max8:
    case Opcode::nonzero_count:
    case Opcode::stream_shuffle:
    case Opcode::sequence_bounds:
      return {2, 2};
    case Opcode::find_index8:
    case Opcode::n_gather:
    case Opcode::local_gather:
      return {3, 3};
    case Opcode::match_replace8:
    case Opcode::tensor_scan:
      return {3, 4};  // [indices] / [initial column]
    case Opcode::select_reduce:
      return {3, 5};  // dst, pred, on_true, [on_false column], [row max]
    case Opcode::range_select:
      return {4, 5};  // dst, src, bound0, bound1, [row max]
    case Opcode::count_:
      break;
  }
  return {0, 0};
}

std::string operand_rules(const arch::ChipSpec& chip, const isa::Program& prog,
                          const AccessPattern& ap, int idx, bool dma) {
  const std::string name = idx == 0 ? "destination" : fmt::format("operand {}", idx);
  if (ap.dims.empty()) return fmt::format("{} has no access pattern dims", name);
  if (ap.offset_reg >= chip.sequencer.registers)
    return fmt::format("{} is addressed by register r{} but engines have {}", name, ap.offset_reg,
                       chip.sequencer.registers);
  // A register-addressed operand is checked once its address is known (at run time).
  if (ap.offset_reg >= 0) return {};
  for (const auto& d : ap.dims) {
    if (d.count < 1) return fmt::format("{} has a dim of count {} (need >= 1)", name, d.count);
  }
  if (ap.mem == Mem::hbm) {
    if (ap.dims.size() > isa::kMaxFreeDims + 1)
      return fmt::format("{} has {} HBM dims (at most {})", name, ap.dims.size(),
                         isa::kMaxFreeDims + 1);
    const std::int64_t lo = ap.min_byte(), hi = ap.max_byte();
    for (const auto& t : prog.tensors) {
      if (lo >= t.address && hi <= t.address + t.bytes()) return {};
    }
    return fmt::format("{} reaches HBM bytes [{}, {}) outside every declared tensor", name, lo, hi);
  }
  const bool psum = ap.mem == Mem::psum;
  const int parts = psum ? chip.psum_partitions : chip.sbuf_partitions;
  const std::int64_t bytes =
      psum ? chip.psum_partition_bytes.value() : chip.sbuf_partition_bytes.value();
  const std::string_view mem = isa::mem_name(ap.mem);
  if (ap.dims.size() > isa::kMaxFreeDims)
    return fmt::format("{} has {} free dims (at most {})", name, ap.dims.size(), isa::kMaxFreeDims);
  for (const auto& d : ap.dims) {
    if (d.count > 65535 || d.stride < -32768 || d.stride > 32767) {
      return fmt::format(
          "{} dim [{},{}] exceeds the access-pattern fields (count <= 65535, "
          "stride in int16)",
          name, d.stride, d.count);
    }
  }
  if (ap.partitions < 1 || ap.start_partition < 0 ||
      std::int64_t{ap.start_partition} + ap.partitions > parts) {
    return fmt::format("{} uses {} partitions [{}, {}) but {} has {}", name, mem,
                       ap.start_partition, ap.start_partition + ap.partitions, mem, parts);
  }
  // Start-partition rule of the compute engines (hardware.md section 1); a
  // DMA descriptor addresses any partition.
  const int n = ap.partitions, s = ap.start_partition;
  const bool ok = dma || (n > 64 ? s == 0 : n > 32 ? (s == 0 || s == 64) : (s % 32 == 0));
  if (!ok) {
    return fmt::format(
        "{} starts at partition {} with {} partitions: an access of {} partitions "
        "must start at {}",
        name, s, n, n,
        n > 64   ? "0"
        : n > 32 ? "0 or 64"
                 : "0, 32, 64 or 96");
  }
  const std::int64_t lo = ap.min_byte(), hi = ap.max_byte();
  if (lo < 0 || hi > bytes) {
    return fmt::format(
        "{} reaches bytes [{}, {}) of each {} partition, which holds {} bytes "
        "(capacity)",
        name, lo, hi, mem, bytes);
  }
  if (psum) {
    const std::int64_t bank = chip.psum_bank_bytes().value();
    if (lo / bank != (hi - 1) / bank) {
      return fmt::format("{} spans PSUM bytes [{}, {}), crossing a {}-byte bank boundary", name, lo,
                         hi, bank);
    }
  }
  return {};
}

// MX data [P, F] (x4) and its scales [P/8, F]: one E8M0 scale per group of
// 8 partitions x 4 packed values (32 contraction values).
std::string mx_pair_rules(const AccessPattern& data, const AccessPattern& scale, const char* what) {
  if (!isa::is_x4(data.dtype)) {
    return fmt::format("{} is {} but has a scale operand: MX data must be an x4-packed type", what,
                       isa::name(data.dtype));
  }
  if (scale.dtype != DType::uint8 && scale.dtype != DType::e8m0) {
    return fmt::format("{} scales must be uint8 or float8_e8m0fnu, got {}", what,
                       isa::name(scale.dtype));
  }
  if (data.partitions % 8 != 0) {
    return fmt::format("{} has {} partitions: MX scale groups need a multiple of 8", what,
                       data.partitions);
  }
  if (scale.partitions != data.partitions / 8 || scale.free_size() != data.free_size()) {
    return fmt::format(
        "{} scales are [{}, {}], expected [{}, {}] (one per 8 partitions x 4 values)", what,
        scale.partitions, scale.free_size(), data.partitions / 8, data.free_size());
  }
  return {};
}

// FP8 double-row matmul: NeuronCore-v3+ and FP8 operands only.
std::string double_row_rules(const arch::ChipSpec& chip, const isa::Instruction& in) {
  if (chip.core_version < 3)
    return fmt::format("double-row matmul needs NeuronCore-v3 or later; {} is {}", chip.name,
                       chip.core_generation);
  const auto& data = in.op == Opcode::load_stationary ? in.operands[0] : in.operands[1];
  if (!isa::is_fp8(data.dtype))
    return fmt::format("double-row matmul takes FP8 operands, got {}", isa::name(data.dtype));
  return {};
}

bool supports_type(const arch::ChipSpec& chip, DType d) {
  return isa::supported_by(d, chip.core_version);
}

}  // namespace

namespace {
// The PE array multiplies floats: fp32 (in passes), tf32, bf16, fp16, the
// fp8 types and the MX x4 types (nki.isa.nc_matmul's operand dtypes); not
// integers, nor the E8M0 scale type.
std::string matmul_operand_type(const AccessPattern& ap, const char* what) {
  if (isa::is_x4(ap.dtype) || (isa::is_float(ap.dtype) && ap.dtype != DType::e8m0)) return {};
  return fmt::format("the Tensor engine multiplies float operands, not a {} {}",
                     isa::name(ap.dtype), what);
}
}  // namespace

std::string check_declarations(const arch::ChipSpec& chip, const isa::Program& prog) {
  // A format limit, not the hardware's: semaphores are a per-program table.
  constexpr int kMaxSemaphores = 1 << 16;
  if (prog.semaphores < 0 || prog.semaphores > kMaxSemaphores)
    return fmt::format("the program declares {} semaphores (0 to {})", prog.semaphores,
                       kMaxSemaphores);
  const std::int64_t cap = chip.hbm_capacity.value();
  for (const isa::HbmTensor& t : prog.tensors) {
    // In 128 bits, stopping past the capacity: a shape from a file must not
    // wrap its byte count back into range.
    Int128 bytes = isa::size_bytes(t.dtype);
    for (const std::int64_t d : t.shape) {
      if (d < 1) return fmt::format("HBM tensor '{}' has a dim of {} (need >= 1)", t.name, d);
      if (bytes <= cap) bytes *= d;
    }
    if (t.address < 0 || bytes > cap || t.address > cap - static_cast<std::int64_t>(bytes))
      return fmt::format(
          "HBM tensor '{}' [{}] {} at byte {} needs {} bytes: outside {}'s {} bytes of HBM", t.name,
          fmt::join(t.shape, ", "), isa::name(t.dtype), t.address,
          bytes > cap ? fmt::format("more than {}", cap) : fmt::format("{}", t.bytes()), chip.name,
          cap);
  }
  return {};
}

namespace {
// nki.isa.scalar_tensor_tensor: arithmetic operators only (the Vector
// engine computes in FP32), data and b of the destination's shape and not
// both in PSUM, a [P, 1] float column when col0.
std::string scalar_tensor_tensor_rules(const isa::Instruction& in) {
  const auto& d = in.operands[0];
  for (isa::AluOp op : {in.alu0, in.alu1})
    if (isa::is_bitwise(op) || op == isa::AluOp::bypass)
      return fmt::format("scalar_tensor_tensor takes two arithmetic operators, got {}",
                         isa::alu_name(op));
  const std::size_t want = in.col0 ? 4 : 3;
  if (in.operands.size() != want)
    return fmt::format("has {} operands: dst, data, b{}", in.operands.size(),
                       in.col0 ? " and the column (col0)" : " (a column needs col0)");
  const char* names[] = {"data", "b"};
  for (int i = 1; i <= 2; ++i) {
    const auto& x = in.operands[static_cast<std::size_t>(i)];
    if (x.rows() != d.rows() || x.free_size() != d.free_size())
      return fmt::format("{} is [{}, {}] but the destination is [{}, {}]", names[i - 1], x.rows(),
                         x.free_size(), d.rows(), d.free_size());
  }
  if (in.operands[1].mem == Mem::psum && in.operands[2].mem == Mem::psum)
    return "scalar_tensor_tensor cannot read both data and b from PSUM";
  if (in.col0) {
    const auto& c = in.operands[3];
    if (c.rows() != d.rows() || c.free_size() != 1 || !isa::is_float(c.dtype))
      return fmt::format("the column operand is [{}, {}] {}, need [{}, 1] float", c.rows(),
                         c.free_size(), isa::name(c.dtype), d.rows());
  }
  return {};
}

// The hardware descriptor generator (Descriptor Generation Engine
// reference): v3+ only, direct copies and transposes only (indirect DMAs
// take software DGE), triggered from the Scalar or Sync engine.
std::string dge_rules(const arch::ChipSpec& chip, const isa::Instruction& in) {
  if (!in.hwdge) return {};
  if (in.op != Opcode::dma_copy && in.op != Opcode::dma_transpose)
    return fmt::format("dge=hw (hardware DGE) applies to dma_copy and dma_transpose, not {}",
                       isa::opcode_name(in.op));
  if (chip.dma.dge_instances == 0)
    return fmt::format("dge=hw: {} ({}) has no hardware DGE (NeuronCore-v3 or newer)", chip.name,
                       chip.core_generation);
  if (in.engine != Engine::scalar && in.engine != Engine::sync)
    return fmt::format("dge=hw: the hardware DGE is triggered by the Scalar or Sync engine, not {}",
                       isa::engine_name(in.engine));
  return {};
}
}  // namespace

std::string check_instruction(const arch::ChipSpec& chip, const isa::Program& prog,
                              const isa::Instruction& in) {
  if (!engine_allowed(in.op, in.engine)) {
    return fmt::format("{} cannot run on the {} engine", isa::opcode_name(in.op),
                       isa::engine_name(in.engine));
  }
  const Arity a = arity(in.op);
  const int nops = static_cast<int>(in.operands.size());
  if (nops < a.min || nops > a.max) {
    return fmt::format("takes {} operands, got {}",
                       a.min == a.max ? std::to_string(a.min) : fmt::format("{}-{}", a.min, a.max),
                       nops);
  }
  for (const auto& w : in.waits)
    if (w.core >= static_cast<int>(prog.cores.size()))
      return fmt::format("waits on core {}'s semaphore but the program has {} cores", w.core,
                         prog.cores.size());
  if (in.peer_core >= 0) {
    if (in.op != Opcode::dma_copy) return "only dma_copy writes another core's SBUF (peer=)";
    if (in.peer_core >= static_cast<int>(prog.cores.size()))
      return fmt::format("writes core {}'s SBUF but the program has {} cores", in.peer_core,
                         prog.cores.size());
    if (nops > 0 && in.operands[0].mem != Mem::sbuf) return "a DMA to another core writes its SBUF";
  }
  if (in.op == Opcode::core_sync) return {};  // its operands only order it
  for (int i = 0; i < nops; ++i) {
    const auto& ap = in.operands[i];
    if (std::string e = operand_rules(chip, prog, ap, i, isa::is_dma(in.op)); !e.empty()) return e;
    if (!supports_type(chip, ap.dtype)) {
      return fmt::format("{} is not a {} ({}) data type", isa::name(ap.dtype), chip.name,
                         chip.core_generation);
    }
    // x4-packed MX types: moved by DMA (unchanged), written by quantize_mx,
    // read by the Tensor engine's MX matmul.
    if (isa::is_x4(ap.dtype)) {
      const bool ok = in.op == Opcode::dma_copy || (in.op == Opcode::load_stationary && i == 0) ||
                      (in.op == Opcode::multiply_moving && i == 1) ||
                      (in.op == Opcode::quantize_mx && i == 0);
      if (!ok) {
        return fmt::format("{} is x4-packed: only dma_copy, quantize_mx and the MX matmul use it",
                           isa::name(ap.dtype));
      }
    }
    // Engine-memory access rules.
    const bool is_tensor = in.engine == Engine::tensor;
    if (isa::is_dma(in.op)) {
      if (ap.mem == Mem::psum)
        return "DMA cannot access PSUM (DMA moves HBM <-> SBUF and SBUF <-> SBUF)";
    } else if (ap.mem == Mem::hbm) {
      return fmt::format("the {} engine cannot access HBM (move data with dma_copy)",
                         isa::engine_name(in.engine));
    } else if (is_tensor && i == 0 && ap.mem != Mem::psum) {
      if (in.op != Opcode::load_stationary) return "the Tensor engine writes PSUM only";
    } else if (is_tensor && (i > 0 || in.op == Opcode::load_stationary) && ap.mem != Mem::sbuf) {
      return "the Tensor engine reads SBUF only";
    } else if (in.engine == Engine::gpsimd && ap.mem == Mem::psum) {
      return "GpSimd cannot access PSUM";
    }
  }
  // Sequencer instructions have no operands: their rules are the register checks below.
  static const AccessPattern kNone{};
  const auto& d = nops > 0 ? in.operands[0] : kNone;
  auto same_shape = [&](const AccessPattern& x, const char* what) -> std::string {
    if (x.rows() != d.rows() || x.free_size() != d.free_size()) {
      return fmt::format("{} is [{}, {}] but the destination is [{}, {}]", what, x.rows(),
                         x.free_size(), d.rows(), d.free_size());
    }
    return {};
  };
  auto queue_rules = [&]() -> std::string {
    if (in.queue < 0 || in.queue >= chip.dma.queues_per_engine)
      return fmt::format("DMA queue {} does not exist (0..{})", in.queue,
                         chip.dma.queues_per_engine - 1);
    if (in.priority < 0 || in.priority >= chip.dma.priority_classes)
      return fmt::format("DMA priority {} does not exist on {} (0..{})", in.priority, chip.name,
                         chip.dma.priority_classes - 1);
    return {};
  };
  if (in.oob_skip && !isa::is_indirect_dma(in.op))
    return "oob=skip applies to dma_gather and dma_scatter only";
  if (auto e = dge_rules(chip, in); !e.empty()) return e;
  switch (in.op) {
    case Opcode::dma_gather:
    case Opcode::dma_scatter: {
      if (auto e = queue_rules(); !e.empty()) return e;
      const bool gather = in.op == Opcode::dma_gather;
      const auto& hbm = gather ? in.operands[1] : d;
      const auto& sb = gather ? d : in.operands[1];
      const auto& ix = in.operands[2];
      const char* hbm_side = gather ? "source" : "destination";
      const char* sb_side = gather ? "destination" : "source";
      if (hbm.mem != Mem::hbm)
        return fmt::format("the {} of an indirect DMA must be an HBM [rows, F] view, not {}",
                           hbm_side, isa::mem_name(hbm.mem));
      if (sb.mem != Mem::sbuf)
        return fmt::format("the {} of an indirect DMA must be an SBUF [P, F] tile, not {}", sb_side,
                           isa::mem_name(sb.mem));
      if (ix.mem != Mem::sbuf)
        return fmt::format("the index tile must be in SBUF, not {}", isa::mem_name(ix.mem));
      if (ix.dtype != DType::int32 && ix.dtype != DType::uint32)
        return fmt::format("the index tile must be int32 or uint32, got {}", isa::name(ix.dtype));
      if (ix.partitions != sb.partitions)
        return fmt::format("the index tile has {} partitions, the SBUF {} {} (need [{}, K])",
                           ix.partitions, sb_side, sb.partitions, sb.partitions);
      if (sb.free_size() != ix.free_size() * hbm.free_size())
        return fmt::format(
            "the SBUF {} holds {} elements per partition, but {} indices per partition x "
            "{}-element "
            "HBM rows need {}",
            sb_side, sb.free_size(), ix.free_size(), hbm.free_size(),
            ix.free_size() * hbm.free_size());
      if (in.oob_skip && in.accumulate)
        return "oob=skip cannot accumulate (as NKI: dst_rmw_op allows only oob_mode.error)";
      break;
    }
    case Opcode::dma_copy:
      if (auto e = queue_rules(); !e.empty()) return e;
      if (d.elements() != in.operands[1].elements())
        return fmt::format("copies {} elements into {}", in.operands[1].elements(), d.elements());
      if (d.rows() != in.operands[1].rows())
        return fmt::format("copies {} rows of {} elements into {} rows of {} (match the shapes)",
                           in.operands[1].rows(), in.operands[1].free_size(), d.rows(),
                           d.free_size());
      if ((isa::is_x4(d.dtype) || isa::is_x4(in.operands[1].dtype)) &&
          d.dtype != in.operands[1].dtype)
        return "an x4-packed type is copied only into the same type (no cast)";
      break;
    case Opcode::load_stationary:
      if (auto e = matmul_operand_type(d, "stationary"); !e.empty()) return e;
      if (nops == 2) {
        if (auto e = mx_pair_rules(d, in.operands[1], "the MX stationary"); !e.empty()) return e;
      } else if (isa::is_x4(d.dtype)) {
        return "an x4-packed stationary needs its scale operand";
      }
      if (d.partitions > chip.tensor.rows)
        return fmt::format("stationary has {} partitions (contraction), the PE array has {} rows",
                           d.partitions, chip.tensor.rows);
      if (in.perf == isa::PerfMode::double_row) {
        if (auto e = double_row_rules(chip, in); !e.empty()) return e;
        if (d.free_size() % 2 != 0 || d.free_size() / 2 > chip.tensor.stationary_fmax)
          return fmt::format("a double-row stationary is [P, 2M] with M <= {}, got free size {}",
                             chip.tensor.stationary_fmax, d.free_size());
        break;
      }
      if (d.free_size() > chip.tensor.stationary_fmax)
        return fmt::format("stationary free size {} exceeds the tile limit {}", d.free_size(),
                           chip.tensor.stationary_fmax);
      break;
    case Opcode::multiply_moving: {
      const auto& mv = in.operands[1];
      if (auto e = matmul_operand_type(mv, "moving"); !e.empty()) return e;
      if (nops == 3) {
        if (auto e = mx_pair_rules(mv, in.operands[2], "the MX moving tensor"); !e.empty())
          return e;
      } else if (isa::is_x4(mv.dtype)) {
        return "an x4-packed moving tensor needs its scale operand";
      }
      if (mv.partitions > chip.tensor.rows)
        return fmt::format("moving has {} partitions (contraction), the PE array has {} rows",
                           mv.partitions, chip.tensor.rows);
      const bool dr = in.perf == isa::PerfMode::double_row;
      if (dr) {
        if (auto e = double_row_rules(chip, in); !e.empty()) return e;
        if (mv.free_size() % 2 != 0 || mv.free_size() / 2 > chip.tensor.moving_fmax)
          return fmt::format("a double-row moving tensor is [P, 2N] with N <= {}, got free size {}",
                             chip.tensor.moving_fmax, mv.free_size());
        if (d.free_size() * 2 != mv.free_size())
          return fmt::format("double-row output free size {} is not half the moving free size {}",
                             d.free_size(), mv.free_size());
      } else if (mv.free_size() > chip.tensor.moving_fmax)
        return fmt::format("moving free size {} exceeds the tile limit {}", mv.free_size(),
                           chip.tensor.moving_fmax);
      if (!dr && d.free_size() != mv.free_size())
        return fmt::format("output free size {} differs from moving free size {}", d.free_size(),
                           mv.free_size());
      if (d.dtype != DType::fp32 && !(d.dtype == DType::bf16 && chip.core_version >= 4))
        return fmt::format("PSUM output must be float32{} , got {}",
                           chip.core_version >= 4 ? " or bfloat16" : "", isa::name(d.dtype));
      break;
    }
    case Opcode::transpose: {
      const auto& s = in.operands[1];
      if (in.engine == Engine::vector) {
        // The Vector engine transposes within 32 x 32 blocks.
        const int lim = chip.vector_transpose_max;
        if (s.partitions > lim || s.free_size() > lim)
          return fmt::format("the Vector engine transposes at most {} x {}, got [{}, {}]", lim, lim,
                             s.partitions, s.free_size());
        if (d.partitions != s.free_size() || d.free_size() != s.partitions)
          return fmt::format("destination is [{}, {}], the transpose of [{}, {}] is [{}, {}]",
                             d.partitions, d.free_size(), s.partitions, s.free_size(),
                             s.free_size(), s.partitions);
        break;
      }
      if (s.partitions > chip.tensor.rows || s.free_size() > chip.tensor.cols)
        return fmt::format("transposes [{}, {}], the PE array is {} x {}", s.partitions,
                           s.free_size(), chip.tensor.rows, chip.tensor.cols);
      if (d.partitions != s.free_size() || d.free_size() != s.partitions)
        return fmt::format("destination is [{}, {}], the transpose of [{}, {}] is [{}, {}]",
                           d.partitions, d.free_size(), s.partitions, s.free_size(), s.free_size(),
                           s.partitions);
      break;
    }
    case Opcode::quantize_mx: {
      const auto& sc = in.operands[1];
      const auto& src = in.operands[2];
      if (d.dtype != DType::fp8_e4m3_x4 && d.dtype != DType::fp8_e5m2_x4)
        return fmt::format("quantize_mx writes float8_e4m3fn_x4 or float8_e5m2_x4, not {}",
                           isa::name(d.dtype));
      if (src.dtype != DType::bf16 && src.dtype != DType::fp16)
        return fmt::format("quantize_mx reads bfloat16 or float16, not {}", isa::name(src.dtype));
      for (const auto* ap : {&d, &sc, &src})
        if (ap->mem != Mem::sbuf) return "quantize_mx reads and writes SBUF only";
      if (src.partitions % isa::kQuantizeMxPartitions != 0 || src.free_size() % 4 != 0)
        return fmt::format(
            "quantize_mx source is [{}, {}]: partitions must be a multiple of {} and the "
            "free size a multiple of 4",
            src.partitions, src.free_size(), isa::kQuantizeMxPartitions);
      if (d.partitions != src.partitions || d.free_size() * 4 != src.free_size())
        return fmt::format("quantize_mx destination is [{}, {}], expected [{}, {}] x4 values",
                           d.partitions, d.free_size(), src.partitions, src.free_size() / 4);
      if (auto e = mx_pair_rules(d, sc, "quantize_mx destination"); !e.empty()) return e;
      break;
    }
    case Opcode::reciprocal:
      if (auto e = same_shape(in.operands[1], "the source"); !e.empty()) return e;
      break;
    case Opcode::bn_stats: {
      const auto& s = in.operands[1];
      if (d.rows() != s.rows() || d.free_size() != 6)
        return fmt::format("bn_stats writes [{}, 6], got [{}, {}]", s.rows(), d.rows(),
                           d.free_size());
      if (s.free_size() > chip.bn_stats_fmax)
        return fmt::format(
            "bn_stats reads at most {} elements per partition (bn_stats_fmax), got {}",
            chip.bn_stats_fmax, s.free_size());
      break;
    }
    case Opcode::bn_aggr: {
      const auto& s = in.operands[1];
      if (d.rows() != s.rows() || d.free_size() != 2 || s.free_size() % 6 != 0)
        return fmt::format(
            "bn_aggr reads [P, 6k] bn_stats groups into [P, 2], got [{}, {}] -> [{}, {}]", s.rows(),
            s.free_size(), d.rows(), d.free_size());
      break;
    }
    case Opcode::select:
      for (int i = 1; i < 4; ++i)
        if (auto e = same_shape(in.operands[i], i == 1 ? "the predicate" : "an input"); !e.empty())
          return e;
      break;
    case Opcode::copy_predicated:
      for (int i = 1; i < 3; ++i)
        if (auto e = same_shape(in.operands[i], i == 1 ? "the predicate" : "the source");
            !e.empty())
          return e;
      break;
    case Opcode::exponential:
      if (chip.core_version < 4) return "exponential is a NeuronCore-v4 Vector instruction";
      if (auto e = same_shape(in.operands[1], "the source"); !e.empty()) return e;
      for (int i = 2; i < nops; ++i)
        if (in.operands[i].rows() != d.rows() || in.operands[i].free_size() != 1)
          return fmt::format("operand {} must be a [{}, 1] column", i, d.rows());
      break;
    case Opcode::affine_select:
      if (auto e = same_shape(in.operands[1], "the source"); !e.empty()) return e;
      break;
    case Opcode::partition_reduce: {
      const auto& s = in.operands[1];
      if (d.rows() != 1 || d.free_size() != s.free_size())
        return fmt::format("partition_reduce reduces [{}, {}] into [1, {}], got [{}, {}]", s.rows(),
                           s.free_size(), s.free_size(), d.rows(), d.free_size());
      break;
    }
    case Opcode::dma_transpose: {
      const auto& s = in.operands[1];
      // The 2-byte limit is the hardware DGE's (nki.isa.dma_transpose, "DMA
      // Direct Transpose Constraints"); other descriptor paths move any type.
      if (d.dtype != s.dtype)
        return fmt::format("dma_transpose moves the bytes unchanged, got {} -> {}",
                           isa::name(s.dtype), isa::name(d.dtype));
      if (d.rows() != s.free_size() || d.free_size() != s.rows())
        return fmt::format("destination is [{}, {}], the transpose of [{}, {}] is [{}, {}]",
                           d.rows(), d.free_size(), s.rows(), s.free_size(), s.free_size(),
                           s.rows());
      if (in.queue < 0 || in.queue >= chip.dma.queues_per_engine)
        return fmt::format("DMA queue {} does not exist (0..{})", in.queue,
                           chip.dma.queues_per_engine - 1);
      break;
    }
    case Opcode::tensor_tensor:
      if (isa::is_bitwise(in.alu0))
        for (const auto& ap : in.operands)
          if (isa::is_float(ap.dtype))
            return fmt::format("{} takes integer tensors, got {}", isa::alu_name(in.alu0),
                               isa::name(ap.dtype));
      if (in.operands[1].mem == Mem::psum && in.operands[2].mem == Mem::psum)
        return "tensor_tensor cannot read both inputs from PSUM";
      if (auto e = same_shape(in.operands[1], "input a"); !e.empty()) return e;
      if (auto e = same_shape(in.operands[2], "input b"); !e.empty()) return e;
      break;
    case Opcode::scalar_tensor_tensor:
      if (auto e = scalar_tensor_tensor_rules(in); !e.empty()) return e;
      break;
    case Opcode::tensor_scalar:
    case Opcode::tensor_copy:
      for (isa::AluOp op : {in.alu0, in.alu1})
        if (isa::is_bitwise(op) && in.op == Opcode::tensor_scalar)
          for (const auto& ap : in.operands)
            if (isa::is_float(ap.dtype))
              return fmt::format("{} takes integer tensors, got {}", isa::alu_name(op),
                                 isa::name(ap.dtype));
      if (auto e = same_shape(in.operands[1], "the source"); !e.empty()) return e;
      if (in.op == Opcode::tensor_scalar) {
        const std::size_t cols = (in.col0 ? 1u : 0u) + (in.col1 ? 1u : 0u);
        if (in.operands.size() != 2 + cols)
          return fmt::format("has {} operands but {} per-partition column{} (col0/col1)",
                             in.operands.size(), cols, cols == 1 ? "" : "s");
        for (std::size_t i = 2; i < in.operands.size(); ++i) {
          const auto& c = in.operands[i];
          if (c.rows() != d.rows() || c.free_size() != 1)
            return fmt::format("column operand {} is [{}, {}], need [{}, 1]", i - 2, c.rows(),
                               c.free_size(), d.rows());
          if (!isa::is_float(c.dtype) || !isa::is_float(in.operands[1].dtype))
            return "per-partition column operands take float tensors";
        }
      }
      break;
    case Opcode::tensor_reduce:
      if (d.rows() != in.operands[1].rows() || d.free_size() != 1)
        return fmt::format("reduces [{}, {}] into [{}, {}] (need [{}, 1])", in.operands[1].rows(),
                           in.operands[1].free_size(), d.rows(), d.free_size(),
                           in.operands[1].rows());
      break;
    case Opcode::activation:
      if (auto e = same_shape(in.operands[1], "the source"); !e.empty()) return e;
      if (nops - 2 - (in.col0 ? 1 : 0) - (in.accumulate ? 1 : 0) > 1)
        return fmt::format("has {} operands: dst, src, [scale if col0], [bias], [sums if acc]",
                           nops);
      if (in.col0 && nops < 3) return "col0 (a per-partition scale) needs its column operand";
      for (int i = 2; i < nops; ++i) {
        if (in.operands[i].rows() != d.rows() || in.operands[i].free_size() != 1)
          return fmt::format("operand {} must be a [{}, 1] column", i, d.rows());
      }
      break;
    default:
      if (auto e = select_rules(chip, in); !e.empty()) return e;
      break;
  }
  for (const auto& w : in.waits) {
    if (w.sem < 0 || w.sem >= prog.semaphores)
      return fmt::format("waits on semaphore {} but the program has {}", w.sem, prog.semaphores);
    if (w.reg >= chip.sequencer.registers)
      return fmt::format("waits with register r{} but engines have {}", w.reg,
                         chip.sequencer.registers);
  }
  const int nregs = chip.sequencer.registers;
  auto bad_reg = [&](int r, bool required) { return (required && r < 0) || r >= nregs; };
  if (in.op == Opcode::reg_set && bad_reg(in.rd, true))
    return fmt::format("reg_set needs a destination register 0..{}, got r{}", nregs - 1, in.rd);
  if (in.op == Opcode::reg_alu &&
      (bad_reg(in.rd, true) || bad_reg(in.ra, true) || bad_reg(in.rb, false)))
    return fmt::format("reg_alu registers must be 0..{} (rd={}, ra={}, rb={})", nregs - 1, in.rd,
                       in.ra, in.rb);
  if (in.op == Opcode::branch && (bad_reg(in.ra, false) || in.target < 0))
    return fmt::format("branch needs a target and a register 0..{} or none, got ra={} target={}",
                       nregs - 1, in.ra, in.target);
  for (int s : in.signals) {
    if (s < 0 || s >= prog.semaphores)
      return fmt::format("signals semaphore {} but the program has {}", s, prog.semaphores);
  }
  return {};
}

}  // namespace tern::sim
