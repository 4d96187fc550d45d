// What each instruction does in the functional model (the selection family
// is in functional_select.cpp).
#include "sim/functional.h"

#include <bit>
#include <cmath>

#include "sim/act_table.h"
#include "sim/codec.h"
#include "sim/matmul_host.h"

namespace tern::sim {

void Simulator::Impl::execute(int core, const Instruction& in) {
  if (in.operands.empty()) return;  // sequencer instructions: handled by the scheduler
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
  switch (in.op) {
    case Opcode::dma_copy:
      op_dma_copy(core, in);
      break;
    case Opcode::load_stationary:
      stationary[core].w = ops.size() == 2 ? read_mx(core, d, ops[1], "the MX stationary")
                                           : read(core, d, "load_stationary");
      if (in.perf == isa::PerfMode::double_row)
        stationary[core].w = unfold_rows(stationary[core].w, d.partitions);
      break;
    case Opcode::quantize_mx:
      quantize_mx(core, in);
      break;
    case Opcode::multiply_moving:
      op_multiply(core, in);
      break;
    case Opcode::transpose:
      op_transpose(core, in);
      break;
    case Opcode::tensor_tensor:
      op_tensor_tensor(core, in);
      break;
    case Opcode::tensor_scalar:
      op_tensor_scalar(core, in);
      break;
    case Opcode::scalar_tensor_tensor:
      op_scalar_tensor_tensor(core, in);
      break;
    case Opcode::tensor_copy:
      if (all_int(in)) {
        write_int(core, d, read_int(core, ops[1], "the source"));
        break;
      }
      write(core, d, read(core, ops[1], "the source"));
      break;
    case Opcode::tensor_reduce:
      op_tensor_reduce(core, in);
      break;
    case Opcode::memset:
      write(core, d, Floats(static_cast<std::size_t>(d.elements()), in.imm0));
      break;
    case Opcode::activation:
      op_activation(core, in);
      break;
    case Opcode::iota:
      op_iota(core, in);
      break;
    case Opcode::reciprocal: {
      Floats a = read(core, ops[1], "the source");
      for (float& x : a) x = 1.0f / x;
      write(core, d, a);
      break;
    }
    case Opcode::bn_stats:
      op_bn_stats(core, in);
      break;
    case Opcode::bn_aggr:
      op_bn_aggr(core, in);
      break;
    case Opcode::select:
      op_select(core, in);
      break;
    case Opcode::copy_predicated:
      op_copy_predicated(core, in);
      break;
    case Opcode::exponential:
      op_exponential(core, in);
      break;
    case Opcode::affine_select:
      op_affine_select(core, in);
      break;
    case Opcode::partition_reduce:
      op_partition_reduce(core, in);
      break;
    case Opcode::dma_transpose:
      op_dma_transpose(core, in);
      break;
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
    case Opcode::sequence_bounds:
    case Opcode::rng:
    case Opcode::rng_state:
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

void Simulator::Impl::op_dma_copy(int core, const Instruction& in) {
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
  if (in.peer_core >= 0) {  // into another core's SBUF (sendrecv)
    if (d.dtype == ops[1].dtype && !in.accumulate)
      copy_bytes(core, d, ops[1], in.peer_core);
    else
      write(in.peer_core, d, read(core, ops[1], "the DMA source"));
    return;
  }
  if (!in.accumulate && d.dtype == ops[1].dtype) {
    copy_bytes(core, d, ops[1]);  // same type: the bytes move unchanged
    return;
  }
  Floats v = read(core, ops[1], "the DMA source");
  if (in.accumulate) {
    const Floats old = read(core, d, "the DMA accumulate destination");
    for (std::size_t i = 0; i < v.size(); ++i) v[i] += old[i];
  }
  write(core, d, v);
}

void Simulator::Impl::op_multiply(int core, const Instruction& in) {
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
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
        std::memset(ps.row(d.start_partition + r) + first, 0, static_cast<std::size_t>(n) * 4);
      }
    }
    float* acc = reinterpret_cast<float*>(ps.row(d.start_partition) + first);
    matmul_accumulate(st.w.data(), m.data(), n, acc, ps.bytes_per_partition() / 4, st.k, st.m, n,
                      fp32, threads);
    for (int r = 0; r < d.partitions && sram_flags; ++r) {
      std::memset(ps.written_row(d.start_partition + r) + first, s.mark_,
                  static_cast<std::size_t>(n) * 4);
    }
    return;
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
}

void Simulator::Impl::op_transpose(int core, const Instruction& in) {
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
  const AccessPattern& src = ops[1];
  const Floats v = read(core, src, "the transpose source");
  const int p = src.partitions, f = static_cast<int>(src.free_size());
  Floats t(v.size());
  for_rows(f, static_cast<std::int64_t>(v.size()), [&](int j) {
    float* out = t.data() + static_cast<std::size_t>(j) * p;
    for (int i = 0; i < p; ++i) out[i] = v[static_cast<std::size_t>(i) * f + j];
  });
  write(core, d, t);
}

void Simulator::Impl::op_tensor_tensor(int core, const Instruction& in) {
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
  if (all_int(in)) {  // integer tensors: exact integer arithmetic
    auto a = read_int(core, ops[1], "input a");
    const auto b = read_int(core, ops[2], "input b");
    const bool sgn = signed_int(ops[1].dtype);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = isa::apply_alu_int(in.alu0, a[i], b[i], sgn);
    write_int(core, d, a);
    return;
  }
  Floats a = read(core, ops[1], "input a");
  const Floats b = read(core, ops[2], "input b");
  const std::size_t f = static_cast<std::size_t>(d.free_size());
  for_rows(d.rows(), static_cast<std::int64_t>(a.size()), [&](int r) {
    const std::size_t o = static_cast<std::size_t>(r) * f;
    isa::apply_alu(in.alu0, a.data() + o, b.data() + o, f);
  });
  write(core, d, a);
}

// (data op0 s) op1 b in FP32, one rounding into dst (nki.isa
// scalar_tensor_tensor); s is imm0 or row r's column value.
void Simulator::Impl::op_scalar_tensor_tensor(int core, const Instruction& in) {
  const auto& ops = in.operands;
  Floats a = read(core, ops[1], "data");
  const Floats b = read(core, ops[2], "b");
  const Floats c = in.col0 ? read(core, ops[3], "the column") : Floats{};
  const std::size_t f = static_cast<std::size_t>(ops[0].free_size());
  for_rows(ops[0].rows(), static_cast<std::int64_t>(a.size()), [&](int r) {
    const std::size_t o = static_cast<std::size_t>(r) * f;
    const float sv = in.col0 ? c[static_cast<std::size_t>(r)] : in.imm0;
    for (std::size_t i = o; i < o + f; ++i) {
      const float t =
          in.reverse0 ? isa::apply_alu(in.alu0, sv, a[i]) : isa::apply_alu(in.alu0, a[i], sv);
      a[i] = in.reverse1 ? isa::apply_alu(in.alu1, b[i], t) : isa::apply_alu(in.alu1, t, b[i]);
    }
  });
  write(core, ops[0], a);
}

void Simulator::Impl::op_tensor_scalar(int core, const Instruction& in) {
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
  if (in.reverse0 || in.reverse1) {
    tensor_scalar_reversed(core, in);
    return;
  }
  if (all_int(in)) {
    auto a = read_int(core, ops[1], "the source");
    const bool sgn = signed_int(ops[1].dtype);
    const auto i0 = static_cast<std::int64_t>(in.imm0), i1 = static_cast<std::int64_t>(in.imm1);
    for (auto& x : a)
      x = isa::apply_alu_int(in.alu1, isa::apply_alu_int(in.alu0, x, i0, sgn), i1, sgn);
    write_int(core, d, a);
    return;
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
}

void Simulator::Impl::op_tensor_reduce(int core, const Instruction& in) {
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
  if (all_int(in) && isa::is_bitwise(in.alu0)) {
    // Bitwise reductions act on the integers (arithmetic ones go
    // through FP32, as the engines).
    const auto a = read_int(core, ops[1], "the source");
    const bool sgn = signed_int(ops[1].dtype);
    const std::size_t f = static_cast<std::size_t>(ops[1].free_size());
    std::vector<std::int64_t> out(static_cast<std::size_t>(d.rows()));
    for (std::size_t r = 0; r < out.size(); ++r) {
      std::int64_t acc = a[r * f];
      for (std::size_t i = 1; i < f; ++i) acc = isa::apply_alu_int(in.alu0, acc, a[r * f + i], sgn);
      out[r] = acc;
    }
    write_int(core, d, out);
    return;
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
}

void Simulator::Impl::op_activation(int core, const Instruction& in) {
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
  Floats a = read(core, ops[1], "the source");
  const std::size_t f = static_cast<std::size_t>(d.free_size());
  const int nops = static_cast<int>(ops.size());
  // col0: a per-partition scale column follows the source.
  const bool has_bias = nops - (in.accumulate ? 1 : 0) - (in.col0 ? 1 : 0) > 2;
  Floats bias, scale;
  if (in.col0) scale = read(core, ops[2], "the scale");
  if (has_bias) bias = read(core, ops[in.col0 ? 3 : 2], "the bias");
  Floats sums(static_cast<std::size_t>(d.rows()), 0.0f);
  // BF16 values without a per-row bias or scale: by table once the
  // function is used enough (the same bits, sums in the same order).
  const float* table = ops[1].dtype == DType::bf16 && !has_bias && !in.col0
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
    sums[ru] =
        isa::apply_act(in.func, x, f, in.col0 ? scale[ru] : in.scale, has_bias ? bias[ru] : 0.0f);
  });
  write(core, d, a);
  // The Scalar engine's per-partition reduce registers (NKI
  // reduce_cmd, imm2): 0 load this instruction's sums, 1 reset to 0,
  // 2 add the sums, 3 keep. With acc the last operand receives them.
  reduce_registers(act_regs[core], d.start_partition, static_cast<int>(in.imm2), 0.0f, 0.0f, sums,
                   [](float x, float y) { return x + y; });
  if (in.accumulate) write(core, ops.back(), sums);
}

void Simulator::Impl::op_iota(int core, const Instruction& in) {
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
  Floats v(static_cast<std::size_t>(d.elements()));
  const std::size_t f = static_cast<std::size_t>(d.free_size());
  for (std::size_t r = 0; r < static_cast<std::size_t>(d.rows()); ++r)
    for (std::size_t i = 0; i < f; ++i)
      v[r * f + i] = in.imm0 + in.imm1 * static_cast<float>(d.start_partition + r) +
                     in.imm2 * static_cast<float>(i);
  write(core, d, v);
}

void Simulator::Impl::op_bn_stats(int core, const Instruction& in) {
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
  // Per partition, for the even- and the odd-indexed elements: count,
  // mean and M2 = sum (x - mean)^2, each summed in FP32 in index order.
  const Floats a = read(core, ops[1], "the source");
  const std::size_t f = static_cast<std::size_t>(ops[1].free_size());
  Floats out(static_cast<std::size_t>(d.rows()) * 6);
  for (std::size_t r = 0; r < static_cast<std::size_t>(d.rows()); ++r)
    isa::bn_stats_row(a.data() + r * f, f, out.data() + r * 6);
  write(core, d, out);
}

void Simulator::Impl::op_bn_aggr(int core, const Instruction& in) {
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
  // Chan et al.'s pairwise combination of (count, mean, M2) groups in
  // order, in FP32; variance = M2 / count (population variance).
  const Floats a = read(core, ops[1], "the bn_stats input");
  const std::size_t f = static_cast<std::size_t>(ops[1].free_size());
  Floats out(static_cast<std::size_t>(d.rows()) * 2);
  for (std::size_t r = 0; r < static_cast<std::size_t>(d.rows()); ++r)
    isa::bn_aggr_row(a.data() + r * f, f / 3, out.data() + r * 2);
  write(core, d, out);
}

void Simulator::Impl::op_select(int core, const Instruction& in) {
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
  const Floats pred = read(core, ops[1], "the predicate");
  Floats a = read(core, ops[2], "input a");
  const Floats b = read(core, ops[3], "input b");
  for (std::size_t i = 0; i < a.size(); ++i)
    if (pred[i] == 0.0f) a[i] = b[i];
  write(core, d, a);
}

void Simulator::Impl::op_copy_predicated(int core, const Instruction& in) {
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
  const Floats pred = read(core, ops[1], "the predicate");
  const Floats src = read(core, ops[2], "the source");
  Floats out = read(core, d, "copy_predicated (the destination keeps unselected values)");
  for (std::size_t i = 0; i < out.size(); ++i)
    if (pred[i] != 0.0f) out[i] = src[i];
  write(core, d, out);
}

void Simulator::Impl::op_exponential(int core, const Instruction& in) {
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
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
  reduce_registers(vec_regs[core], d.start_partition, static_cast<int>(in.imm2), 0.0f, in.imm3,
                   sums, [](float x, float y) { return x + y; });
  if (in.accumulate) write(core, ops.back(), sums);
}

void Simulator::Impl::op_affine_select(int core, const Instruction& in) {
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
  Floats a = read(core, ops[1], "the source");
  const std::size_t f = static_cast<std::size_t>(d.free_size());
  for (std::size_t r = 0; r < static_cast<std::size_t>(d.rows()); ++r)
    for (std::size_t i = 0; i < f; ++i) {
      const float v = in.imm0 + in.imm1 * static_cast<float>(d.start_partition + r) +
                      in.imm2 * static_cast<float>(i);
      if (isa::apply_alu(in.alu0, v, 0.0f) == 0.0f) a[r * f + i] = in.imm3;
    }
  write(core, d, a);
}

void Simulator::Impl::op_partition_reduce(int core, const Instruction& in) {
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
  if (all_int(in) && isa::is_bitwise(in.alu0)) {
    const auto a = read_int(core, ops[1], "the source");
    const bool sgn = signed_int(ops[1].dtype);
    const std::size_t f = static_cast<std::size_t>(d.free_size());
    std::vector<std::int64_t> out(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(f));
    for (std::size_t r = 1; r < static_cast<std::size_t>(ops[1].rows()); ++r)
      for (std::size_t i = 0; i < f; ++i)
        out[i] = isa::apply_alu_int(in.alu0, out[i], a[r * f + i], sgn);
    write_int(core, d, out);
    return;
  }
  const Floats a = read(core, ops[1], "the source");
  const std::size_t f = static_cast<std::size_t>(d.free_size());
  Floats out(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(f));
  for (std::size_t r = 1; r < static_cast<std::size_t>(ops[1].rows()); ++r)
    for (std::size_t i = 0; i < f; ++i) out[i] = isa::apply_alu(in.alu0, out[i], a[r * f + i]);
  write(core, d, out);
}

void Simulator::Impl::op_dma_transpose(int core, const Instruction& in) {
  const auto& ops = in.operands;
  const AccessPattern& d = ops[0];
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
    return;
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
}

// tensor_scalar with an operand first (imm op data), element by element.
void Simulator::Impl::tensor_scalar_reversed(int core, const Instruction& in) {
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

// The Tensor engine's weight state: shapes and dtype pairing are checked
// in every mode (they need no data).
void Simulator::Impl::tensor_state(int core, const Instruction& in) {
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
    throw Error(fmt::format("{} moving with {} stationary: MX operands pair only with MX operands",
                            mx ? "an MX" : "a non-MX", st.mx ? "an MX" : "a non-MX"));
  }
  const bool dr = in.perf == isa::PerfMode::double_row;
  if (dr != st.double_row) {
    throw Error(fmt::format("a {} multiply after a {} weight load: both must use perf=double_row",
                            dr ? "double-row" : "normal", st.double_row ? "double-row" : "normal"));
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

void Simulator::Impl::check_pairing(const Stationary& st, const AccessPattern& mv) {
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

}  // namespace tern::sim
