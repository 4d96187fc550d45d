// Hardware rules of the selection, search and scan instructions (NKI API
// reference of each nki.isa call: shapes, dtypes, partition limits).
#include <fmt/format.h>

#include "sim/check.h"

namespace tern::sim {

using isa::AccessPattern;
using isa::DType;
using isa::Opcode;

namespace {

std::string column(const AccessPattern& c, int rows, const char* what) {
  if (c.rows() != rows || c.free_size() != 1)
    return fmt::format("{} is [{}, {}], need a [{}, 1] column", what, c.rows(), c.free_size(),
                       rows);
  return {};
}

std::string same(const AccessPattern& x, const AccessPattern& d, const char* what) {
  if (x.rows() != d.rows() || x.free_size() != d.free_size())
    return fmt::format("{} is [{}, {}] but the destination is [{}, {}]", what, x.rows(),
                       x.free_size(), d.rows(), d.free_size());
  return {};
}

bool unsigned_index(DType t) {
  return t == DType::uint16 || t == DType::uint32;
}

std::string eight_rules(const arch::ChipSpec& chip, const isa::Instruction& in) {
  const auto& d = in.operands[0];
  const auto& src = in.operands[1];
  if (src.free_size() < chip.select8_min || src.free_size() > chip.select8_max)
    return fmt::format("{} reads {} elements per partition (needs {}..{})", isa::opcode_name(in.op),
                       src.free_size(), chip.select8_min, chip.select8_max);
  if (src.rows() != d.rows())
    return fmt::format("source has {} partitions, destination {}", src.rows(), d.rows());
  if (in.op == Opcode::max8) {
    if (d.free_size() != 8) return fmt::format("max8 writes [P, 8], got [P, {}]", d.free_size());
    return {};
  }
  const auto& vals = in.operands[2];
  if (vals.rows() != d.rows() || vals.free_size() != 8)
    return fmt::format("vals are [{}, {}], need [{}, 8]", vals.rows(), vals.free_size(), d.rows());
  if (in.op == Opcode::find_index8) {
    if (d.free_size() != 8)
      return fmt::format("nc_find_index8 writes [P, 8], got [P, {}]", d.free_size());
    if (!unsigned_index(d.dtype))
      return fmt::format("nc_find_index8 writes uint16 or uint32 indices, not {}",
                         isa::name(d.dtype));
    return {};
  }
  if (auto e = same(src, d, "the data"); !e.empty()) return e;
  if (in.operands.size() == 4 &&
      (in.operands[3].rows() != d.rows() || in.operands[3].free_size() != 8))
    return fmt::format("dst_idx is [{}, {}], need [{}, 8]", in.operands[3].rows(),
                       in.operands[3].free_size(), d.rows());
  return {};
}

}  // namespace

std::string select_rules(const arch::ChipSpec& chip, const isa::Instruction& in) {
  // Sequencer instructions (no operands) reach here too: nothing to check.
  if (in.operands.empty()) return {};
  const auto& d = in.operands[0];
  const int nops = static_cast<int>(in.operands.size());
  switch (in.op) {
    case Opcode::max8:
    case Opcode::find_index8:
    case Opcode::match_replace8:
      return eight_rules(chip, in);
    case Opcode::tensor_scan:
      for (int i = 1; i < 3; ++i)
        if (auto e = same(in.operands[i], d, i == 1 ? "data0" : "data1"); !e.empty()) return e;
      if (in.operands[1].mem == isa::Mem::psum && in.operands[2].mem == isa::Mem::psum)
        return "tensor_tensor_scan cannot read both inputs from PSUM";
      if (in.col0 != (nops == 4)) return "an initial column operand goes with col0=1";
      if (nops == 4) return column(in.operands[3], d.rows(), "the initial value");
      return {};
    case Opcode::select_reduce: {
      if (auto e = same(in.operands[1], d, "the predicate"); !e.empty()) return e;
      if (auto e = same(in.operands[2], d, "on_true"); !e.empty()) return e;
      const int want = 3 + (in.col0 ? 1 : 0) + (in.accumulate ? 1 : 0);
      if (nops != want)
        return fmt::format("has {} operands, col0={} acc={} need {}", nops, in.col0, in.accumulate,
                           want);
      const auto p = in.operands[1].dtype;
      if (p != DType::int8 && p != DType::uint8 && p != DType::int16 && p != DType::uint16)
        return fmt::format("the predicate must be an 8- or 16-bit integer, not {}", isa::name(p));
      for (int i = 3; i < nops; ++i)
        if (auto e = column(in.operands[i], d.rows(), "a column operand"); !e.empty()) return e;
      return {};
    }
    case Opcode::range_select:
      if (chip.core_version < 3) return "range_select needs NeuronCore-v3 or later";
      if (auto e = same(in.operands[1], d, "on_true_tile"); !e.empty()) return e;
      if (!isa::is_float(in.operands[1].dtype)) return "on_true_tile must be a float type";
      for (int i = 2; i < nops; ++i)
        if (auto e = column(in.operands[i], d.rows(), i < 4 ? "a bound" : "reduce_res"); !e.empty())
          return e;
      if (in.accumulate != (nops == 5)) return "reduce_res goes with acc=1";
      return {};
    case Opcode::nonzero_count: {
      if (chip.core_version < 3) return "nonzero_with_count needs NeuronCore-v3 or later";
      const auto& s = in.operands[1];
      if (d.dtype != DType::int32) return "nonzero_with_count writes int32";
      if (s.dtype != DType::fp32 && s.dtype != DType::int32)
        return "nonzero_with_count reads float32 or int32";
      if (d.rows() != s.rows() || d.free_size() != s.free_size() + 1)
        return fmt::format("destination is [{}, {}], need [{}, {}] (the indices and the count)",
                           d.rows(), d.free_size(), s.rows(), s.free_size() + 1);
      return {};
    }
    case Opcode::n_gather: {
      const auto& ix = in.operands[2];
      if (ix.dtype != DType::uint32) return "nc_n_gather indices must be uint32";
      if (ix.rows() != d.rows() || ix.free_size() != d.free_size())
        return fmt::format("indices are [{}, {}] but the destination is [{}, {}]", ix.rows(),
                           ix.free_size(), d.rows(), d.free_size());
      if (in.operands[1].rows() != d.rows()) return "data and destination partitions differ";
      if (in.operands[1].dtype != d.dtype) return "nc_n_gather keeps the data's dtype";
      return {};
    }
    case Opcode::stream_shuffle: {
      const int q = chip.shuffle_partitions;
      if (static_cast<int>(in.table.size()) != q)
        return fmt::format("nc_stream_shuffle needs a {}-entry shuffle_mask", q);
      for (auto t : in.table)
        if (t != 255 && (t < 0 || t >= q))
          return fmt::format("shuffle_mask entry {} is neither a partition 0..{} nor 255", t,
                             q - 1);
      if (d.dtype != in.operands[1].dtype || d.free_size() != in.operands[1].free_size())
        return "nc_stream_shuffle keeps dtype and elements per partition";
      return {};
    }
    case Opcode::local_gather: {
      const auto& src = in.operands[1];
      const auto& ix = in.operands[2];
      const int g = chip.gpsimd_partitions();
      if (ix.dtype != DType::uint16) return "local_gather indices must be uint16";
      if (src.rows() != ix.rows() || src.rows() % g != 0 || src.start_partition % g != 0)
        return fmt::format(
            "local_gather source and index cover the same whole {}-partition groups (one per "
            "GpSimd core)",
            g);
      if (d.dtype != src.dtype) return "local_gather keeps the source dtype";
      return {};
    }
    case Opcode::rng: {
      const bool uniform = in.imm2 != 0.0f;
      if (!uniform && (isa::is_float(d.dtype) || isa::size_bytes(d.dtype) > 4))
        return fmt::format("rng writes 8-, 16- or 32-bit integers, not {}", isa::name(d.dtype));
      if (in.engine == isa::Engine::gpsimd && chip.core_version < 3)
        return "rng on the GpSimd engine needs NeuronCore-v3 or later";
      if (in.engine == isa::Engine::gpsimd && d.mem != isa::Mem::sbuf)
        return "the GpSimd engine writes its random numbers to SBUF";
      for (int i = 1; i < nops; ++i)
        if (auto e = column(in.operands[i], d.rows(), "a range bound"); !e.empty()) return e;
      if (nops != 1 + (in.col0 ? 1 : 0) + (in.col1 ? 1 : 0))
        return "rng's bound columns go with col0 / col1";
      return {};
    }
    case Opcode::rng_state: {
      if (in.imm2 == 2.0f) {  // set_rng_seed: the Vector engine's seed, every version
        if (d.rows() != 1 || d.free_size() != 1 || isa::size_bytes(d.dtype) != 4)
          return "the seed is a [1, 1] tile of one 32-bit value";
        return {};
      }
      if (chip.core_version < 3) return "the rand state instructions need NeuronCore-v3 or later";
      const int words = 6 * (in.engine == isa::Engine::vector && chip.core_version >= 4 ? 4 : 1);
      if (d.dtype != DType::uint32 || d.free_size() != words)
        return fmt::format("the {} engine's rand state is [P, {}] uint32, got [{}, {}] {}",
                           isa::engine_name(in.engine), words, d.rows(), d.free_size(),
                           isa::name(d.dtype));
      if (in.engine == isa::Engine::gpsimd && d.mem != isa::Mem::sbuf)
        return "the GpSimd engine's rand state moves through SBUF";
      return {};
    }
    case Opcode::sequence_bounds: {
      const auto& ids = in.operands[1];
      auto fp32_or_int32 = [](DType t) { return t == DType::fp32 || t == DType::int32; };
      if (!fp32_or_int32(ids.dtype) || !fp32_or_int32(d.dtype))
        return "sequence_bounds reads and writes float32 or int32";
      if (ids.rows() != 1 || d.rows() != 1)
        return fmt::format("sequence_bounds works on one partition, got {} -> {}", ids.rows(),
                           d.rows());
      if (d.free_size() != 2 * ids.free_size())
        return fmt::format("destination has {} elements, need [1, 2, {}]", d.free_size(),
                           ids.free_size());
      return {};
    }
    default:
      return {};
  }
}

}  // namespace tern::sim
