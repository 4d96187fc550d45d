// The selection, search and scan instructions of the functional model.
#include "sim/functional.h"

#include <limits>

#include "isa/select_ops.h"

namespace tern::sim {

// The selection, search and scan instructions, row by row through the
// definitions in isa/select_ops.h.
void Simulator::Impl::execute_select(int core, const Instruction& in) {
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
      // Each GpSimd core works on the first partition of its own.
      const std::size_t n = static_cast<std::size_t>(ops[1].free_size());
      const int g = s.chip_.gpsimd_partitions();
      for (int r = 0; r < d.rows(); ++r) {
        if ((d.start_partition + r) % g != 0) continue;
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
      const std::size_t q = static_cast<std::size_t>(s.chip_.shuffle_partitions);
      for (std::size_t r = 0; r < rows; ++r) {
        const std::int32_t t = in.table[r % q];
        if (t == 255) continue;
        const int from = static_cast<int>(r / q * q) + t;
        if (from >= ops[1].rows())
          throw Error(fmt::format("nc_stream_shuffle reads source partition {} of {}", from,
                                  ops[1].rows()));
        src[r] = read(core, partition_of(ops[1], from), "the source");
      }
      for (std::size_t r = 0; r < rows; ++r)
        if (in.table[r % q] != 255) write(core, partition_of(d, static_cast<int>(r)), src[r]);
      break;
    }
    case Opcode::local_gather: {
      // One group of partitions per GpSimd core: the group's indices in partition-major order
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
      const std::size_t G = static_cast<std::size_t>(s.chip_.gpsimd_partitions());
      for (std::size_t g = 0; g < rows / G; ++g) {
        std::vector<std::int64_t> flat;
        for (std::size_t j = 0; j < ni; ++j)
          for (std::size_t p = 0; p < G; ++p) flat.push_back(idx[(g * G + p) * ni + j]);
        for (std::size_t p = 0; p < G; ++p)
          for (std::size_t v = 0; v < valid && v < flat.size(); ++v)
            for (std::size_t e = 0; e < k; ++e) {
              const std::size_t at = static_cast<std::size_t>(flat[v]) * k + e;
              if (at >= n)
                throw Error(fmt::format("local_gather index {} is out of range", flat[v]));
              out[(g * G + p) * f + v * k + e] = x[(g * G + p) * n + at];
            }
      }
      write(core, d, out);
      break;
    }
    case Opcode::rng:
      execute_rng(core, in);
      break;
    case Opcode::rng_state:
      execute_rng_state(core, in);
      break;
    case Opcode::sequence_bounds: {
      const Floats ids = read(core, ops[1], "the segment ids");
      Floats out(2 * ids.size());
      isa::sequence_bounds_row(ids.data(), ids.size(), out.data());
      write(core, d, out);
      break;
    }
    default:
      break;
  }
}

std::vector<num::Xorwow>& Simulator::Impl::rng_lanes(int core, isa::Engine e) {
  auto& lanes = rng_states[static_cast<std::size_t>(core)][e == isa::Engine::vector ? 0 : 1];
  if (lanes.empty()) {
    const int k = rng_substates(e);
    for (int p = 0; p < s.chip_.sbuf_partitions; ++p)
      for (int j = 0; j < k; ++j)
        lanes.push_back(
            num::Xorwow::seeded(0, static_cast<std::uint32_t>(p), static_cast<std::uint32_t>(j)));
  }
  return lanes;
}

// Random numbers: partition r of dst draws from lane start + r, element i
// from that lane's sub-state i % k.
void Simulator::Impl::execute_rng(int core, const Instruction& in) {
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
  auto& lanes = rng_lanes(core, in.engine);
  const std::size_t k = static_cast<std::size_t>(rng_substates(in.engine));
  const std::size_t f = static_cast<std::size_t>(d.free_size());
  const bool uniform = in.imm2 != 0.0f;
  std::size_t next = 1;
  const Floats lo = uniform && in.col0 ? read(core, ops[next++], "the minimum") : Floats{};
  const Floats hi = uniform && in.col1 ? read(core, ops[next++], "the maximum") : Floats{};
  Floats v(uniform ? static_cast<std::size_t>(d.rows()) * f : 0);
  std::vector<std::int64_t> bits(uniform ? 0 : static_cast<std::size_t>(d.rows()) * f);
  for (std::size_t r = 0; r < static_cast<std::size_t>(d.rows()); ++r) {
    num::Xorwow* lane = &lanes[(static_cast<std::size_t>(d.start_partition) + r) * k];
    const float a = in.col0 ? lo[r] : in.imm0, b = in.col1 ? hi[r] : in.imm1;
    for (std::size_t i = 0; i < f; ++i) {
      const std::uint32_t x = lane[i % k].next();
      if (uniform)
        v[r * f + i] = a + num::unit_float(x) * (b - a);
      else
        bits[r * f + i] = x;
    }
  }
  if (uniform)
    write(core, d, v);
  else
    write_int(core, d, bits);
}

// The lanes' states as [P, 6k] uint32 words (set, get), or every lane
// seeded from one 32-bit value.
void Simulator::Impl::execute_rng_state(int core, const Instruction& in) {
  const AccessPattern& t = in.operands[0];
  auto& lanes = rng_lanes(core, in.engine);
  const std::size_t k = static_cast<std::size_t>(rng_substates(in.engine));
  const int mode = static_cast<int>(in.imm2);
  if (mode == 2) {
    const auto seed = static_cast<std::uint32_t>(read_int(core, t, "the seed")[0]);
    for (std::size_t p = 0; p < lanes.size() / k; ++p)
      for (std::size_t j = 0; j < k; ++j)
        lanes[p * k + j] =
            num::Xorwow::seeded(seed, static_cast<std::uint32_t>(p), static_cast<std::uint32_t>(j));
    return;
  }
  const std::size_t words = 6 * k, p0 = static_cast<std::size_t>(t.start_partition);
  if (mode == 0) {
    const auto w = read_int(core, t, "the rand state");
    for (std::size_t r = 0; r < static_cast<std::size_t>(t.rows()); ++r)
      for (std::size_t i = 0; i < words; ++i)
        lanes[(p0 + r) * k + i / 6].s[i % 6] = static_cast<std::uint32_t>(w[r * words + i]);
    return;
  }
  std::vector<std::int64_t> w(static_cast<std::size_t>(t.rows()) * words);
  for (std::size_t r = 0; r < static_cast<std::size_t>(t.rows()); ++r)
    for (std::size_t i = 0; i < words; ++i) w[r * words + i] = lanes[(p0 + r) * k + i / 6].s[i % 6];
  write_int(core, t, w);
}

}  // namespace tern::sim
