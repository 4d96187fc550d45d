// Operand reads and writes of the functional model: decoding and encoding
// rows, written-flag checks, same-type byte copies, MX operands, indirect DMA.
#include "sim/functional.h"

#include <array>
#include <limits>
#include <span>

#include "num/mx.h"
#include "sim/codec.h"
#include "sim/codec_simd.h"

namespace tern::sim {

Floats Simulator::Impl::read(int core, const AccessPattern& ap, const char* what) {
  const Walk& w = walk(ap);
  const int rows = ap.rows();
  const std::size_t n = w.offs.size();
  Floats v(static_cast<std::size_t>(rows) * n);
  const auto b = bases(core, ap);
  for (int r = 0; r < rows; ++r)
    check_written(b[static_cast<std::size_t>(r)].second, ap, r, w, what);
  if (rows == 0) return v;
  auto one = [&](int r) {
    const std::uint8_t* base = b[static_cast<std::size_t>(r)].first;
    float* out = v.data() + static_cast<std::size_t>(r) * n;
    if (w.cols > 0) {
      const auto cols = static_cast<std::size_t>(w.cols);
      if (decode_columns(ap.dtype, base + w.offs[0], n / cols, cols, w.col_stride, out)) return;
    }
    decode_row(ap.dtype, base, w.offs, out, w.run);  // may throw (x4 types)
  };
  one(0);
  for_rows(rows - 1, static_cast<std::int64_t>(v.size()), [&](int r) { one(r + 1); });
  return v;
}

void Simulator::Impl::write(int core, const AccessPattern& ap, const Floats& v) {
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
      encode_row(ap.dtype, in, w.offs, base, co, (serial << 24) + static_cast<std::uint64_t>(r) * n,
                 w.run ? 1 : 0);
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

// Integer tensors as exact 64-bit integers (no FP32 detour).
std::vector<std::int64_t> Simulator::Impl::read_int(int core, const AccessPattern& ap,
                                                    const char* what) {
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
void Simulator::Impl::write_int(int core, const AccessPattern& ap,
                                const std::vector<std::int64_t>& v) {
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
Floats Simulator::Impl::unfold_rows(const Floats& v, int p) {
  const std::size_t f2 = v.size() / static_cast<std::size_t>(p), f = f2 / 2;
  Floats out(v.size());
  for (std::size_t r = 0; r < static_cast<std::size_t>(p); ++r)
    for (std::size_t h = 0; h < 2; ++h)
      std::copy_n(
          v.begin() + static_cast<std::ptrdiff_t>(r * f2 + h * f), f,
          out.begin() + static_cast<std::ptrdiff_t>((h * static_cast<std::size_t>(p) + r) * f));
  return out;
}

namespace {
// Element i of `sz` bytes from s + so[i] to d + do_[i]: a fixed-size copy
// per element size (a memcpy call of a variable size per element was a
// tenth of a training step).
template <int Sz>
void gather_n(std::uint8_t* d, const std::int64_t* do_, const std::uint8_t* s,
              const std::int64_t* so, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) std::memcpy(d + do_[i], s + so[i], Sz);
}
void gather(std::uint8_t* d, const std::int64_t* do_, const std::uint8_t* s, const std::int64_t* so,
            std::size_t n, int sz) {
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
}  // namespace

// Same-type DMA: element bytes move unchanged (NaN payloads, x4 packing).
void Simulator::Impl::copy_bytes(int core, const AccessPattern& dst, const AccessPattern& src,
                                 int dst_core) {
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
Floats Simulator::Impl::read_mx(int core, const AccessPattern& data, const AccessPattern& scale,
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
  // MX-FP8 rows of adjacent elements and scales: a table lookup per lane.
  const bool lanes = !fp4 && dwk.run && swk.run && F > 0;
  // The rows live in one [256 scales][256 codes] table: its start is any
  // row less that row's offset.
  const float* table = F > 0 ? luts[0] - std::size_t{sb[0].first[soffs[0]]} * 256 : nullptr;
  for_rows(data.partitions, static_cast<std::int64_t>(out.size()), [&](int p) {
    const std::uint8_t* base = db[static_cast<std::size_t>(p)].first;
    if (lanes) {
      decode_mx8_row(base + dwk.lo, sb[static_cast<std::size_t>(p / 8)].first + swk.lo, F, table,
                     out.data() + static_cast<std::size_t>(p) * 4 * F);
      return;
    }
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
void Simulator::Impl::quantize_mx(int core, const Instruction& in) {
  const AccessPattern& d = in.operands[0];
  const AccessPattern& sc = in.operands[1];
  const AccessPattern& src = in.operands[2];
  const Floats x = read(core, src, "the quantize_mx source");
  const std::size_t F = static_cast<std::size_t>(src.free_size()), C = F / 4;
  const std::size_t groups = static_cast<std::size_t>(src.partitions) / 8;
  num::CastOptions co;
  co.rounding = opt.stochastic_rounding ? num::Rounding::stochastic : num::Rounding::nearest_even;
  co.seed = opt.seed;
  const num::MxFormat& mf =
      num::mx_format(d.dtype == DType::fp8_e4m3_x4 ? num::MxId::mxfp8_e4m3 : num::MxId::mxfp8_e5m2);
  const Walk& dwk = walk(d);
  const Walk& swk = walk(sc);
  const auto db = bases(core, d);
  const auto sb = bases(core, sc);
  for_rows(static_cast<int>(groups), static_cast<std::int64_t>(x.size()), [&](int gi) {
    const std::size_t g = static_cast<std::size_t>(gi);
    // [8][F] codes in the tile's layout: byte 4c + j of a row is packed
    // value j of the row's x4 element c.
    thread_local std::vector<std::uint8_t> codes, scales;
    codes.resize(8 * F);
    scales.resize(C);
    num::mx_quantize_tile(mf, num::ScalePolicy::trn3, {x.data() + 8 * g * F, 8 * F}, 8, codes,
                          scales, co, (serial << 24) + g * C * num::kMxBlock);
    for (std::size_t c = 0; c < C; ++c) sb[g].first[swk.offs[c]] = scales[c];
    mark_written(sb[g].second, swk);
    for (std::size_t pp = 0; pp < 8; ++pp) {
      std::uint8_t* drow = db[8 * g + pp].first;
      const std::uint8_t* crow = codes.data() + pp * F;
      if (dwk.run) {
        std::memcpy(drow + dwk.lo, crow, F);
      } else {
        for (std::size_t c = 0; c < C; ++c) std::memcpy(drow + dwk.offs[c], crow + 4 * c, 4);
      }
      mark_written(db[8 * g + pp].second, dwk);
    }
  });
}

// Decoded x4 element codes times 2^(scale - 127), by E8M0 scale code:
// a row is filled the first time its scale shows up (runs use few), each
// entry exactly what times_pow2 gives; scale 0xFF (NaN) gives NaN. A pure
// function of (dtype, scale, code), so the tables live as long as the
// thread.
const float* Simulator::Impl::scaled_lut(DType t, std::uint8_t xs) {
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
void Simulator::Impl::indirect_dma(int core, const Instruction& in) {
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

}  // namespace tern::sim
