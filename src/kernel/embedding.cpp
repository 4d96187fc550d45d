// Embedding lookup (gather) and its backward (scatter-add), on indirect DMA:
// the token ids select HBM rows directly, so neither kernel touches a
// compute engine's datapath (the backward's zero fill aside).
#include <algorithm>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "kernel/builder.h"
#include "kernel/detail.h"
#include "kernel/kernels.h"
#include "util/error.h"

namespace tern::kernel {

using isa::DType;
using isa::Engine;
using namespace detail;

namespace {

// Bytes per partition of one row transfer: rows of >= 4 KiB saturate a DMA
// engine (hardware.md section 1), so wider rows are split into column
// chunks of this size; it bounds the SBUF the kernels use too.
constexpr std::int64_t kChunkBytes = 8192;
// Tiles in flight per core (index tile + row buffer each): enough to cover
// the ~5 us latency of an ids load -> gather -> store chain (three fixed DMA
// latencies and the gather's descriptor generation) on trn3.
constexpr int kBufs = 8;
// The backward gives each core at least this many columns (unless D is
// smaller), so a scatter row stays well above a few bytes.
constexpr std::int64_t kMinCoreCols = 64;
// One DMA queue per role. A queue completes in order and the builder's
// semaphores count a queue's completions, so a transfer that waited on a
// queue shared with unrelated traffic would also wait for that traffic;
// giving the ids loads, data loads, gathers/scatters and stores their own
// queues keeps each wait exactly on what it depends on.
constexpr int kQueueIds = 0, kQueueLoad = 1, kQueueIndirect = 2, kQueueStore = 3;
constexpr int kQueueZero0 = 4;  // the backward's zero fill rotates over the rest

// Most tokens per partition one scatter carries (index tile [P, K]).
constexpr std::int64_t kMaxSlots = 64;

// The HBM view of the row-major [rows, D] tensor `t` in which slot j of
// partition p is row r0 + p * part_rows + j * slot_rows, columns
// [c0, c0 + w): an SBUF-shaped [parts, slots * w] access.
Tensor row_slots(const Tensor& t, std::int64_t r0, int parts, std::int64_t part_rows,
                 std::int64_t slots, std::int64_t slot_rows, std::int64_t c0, std::int64_t w) {
  const std::int64_t pitch = t.ap.dims[0].stride;  // elements per row
  Tensor v = t;
  v.ap.offset = t.ap.offset + (r0 * pitch + c0) * isa::size_bytes(t.ap.dtype);
  v.ap.dims = {{part_rows * pitch, parts}, {slot_rows * pitch, slots}, {1, w}};
  v.ap.partitions = parts;
  return v;
}

// Tokens [t0, t0 + n * slots): partition p holds tokens t0 + p * slots ..
// t0 + p * slots + slots - 1 (consecutive, so its ids and dout rows are
// contiguous, and the index tile's element order is token order).
struct Group {
  std::int64_t t0;
  int n;
  std::int64_t slots;
};
// T tokens in groups of P x K, then one group of P x K' (K' < K) and the
// last T mod P tokens one per partition.
std::vector<Group> token_groups(std::int64_t T, int P, std::int64_t K) {
  std::vector<Group> g;
  std::int64_t t = 0;
  for (; t + P * K <= T; t += P * K) g.push_back({t, P, K});
  if (const std::int64_t k = (T - t) / P; k > 0) {
    g.push_back({t, P, k});
    t += P * k;
  }
  if (t < T) g.push_back({t, static_cast<int>(T - t), 1});
  return g;
}

void check_embedding(const arch::ChipSpec& chip, const char* name, const EmbeddingSpec& s) {
  if (chip.dma.queues_per_engine <= kQueueZero0)
    throw NotSupported(fmt::format("{} on a chip with {} DMA queues (it uses {} or more)", name,
                                   chip.dma.queues_per_engine, kQueueZero0 + 1));
  if (s.tokens < 1 || s.vocab < 1 || s.dim < 1)
    throw Error(fmt::format("{}: tokens {}, vocab {}, dim {} must all be >= 1", name, s.tokens,
                            s.vocab, s.dim));
  if (s.dtype != DType::fp32 && s.dtype != DType::bf16 && s.dtype != DType::fp16)
    throw NotSupported(fmt::format("{} of {} (fp32, bf16, fp16 are)", name, isa::name(s.dtype)));
  // Token ids are int32; rows and tokens are addressed with int.
  constexpr std::int64_t kMax = (std::int64_t{1} << 31) - 1;
  if (s.vocab > kMax || s.tokens > kMax)
    throw NotSupported(fmt::format("{} with more than 2^31 - 1 tokens or vocabulary rows", name));
}

}  // namespace

isa::Program embedding_kernel(const arch::ChipSpec& chip, const EmbeddingSpec& s) {
  check_embedding(chip, "embedding", s);
  Builder b(chip, s.cores);
  const std::int64_t T = s.tokens, V = s.vocab, D = s.dim;
  const Tensor ids = b.hbm("ids", {T, 1}, DType::int32, isa::TensorKind::input);
  const Tensor table = b.hbm("table", {V, D}, s.dtype, isa::TensorKind::input);
  const Tensor out = b.hbm("out", {T, D}, s.dtype, isa::TensorKind::output);
  const int P = chip.sbuf_partitions;
  const std::int64_t chunk = std::min(D, kChunkBytes / isa::size_bytes(s.dtype));
  const std::int64_t tiles = ceil_div(T, P);
  for (int core = 0; core < s.cores && core < tiles; ++core) {
    b.set_core(core);
    Tensor idx[kBufs], rows[kBufs];
    for (int i = 0; i < kBufs; ++i) {
      idx[i] = b.sbuf(P, 1, DType::int32);
      rows[i] = b.sbuf(P, chunk, s.dtype);
    }
    // Three instruction streams, so that none waits behind another's
    // dependency: Sync loads the ids, GpSimd triggers the gathers (NKI's
    // software DGE runs there), Scalar the stores. The builder's semaphores
    // order them through the buffers.
    std::int64_t unit = 0, k = 0;
    for (std::int64_t t = core; t < tiles; t += s.cores, ++k) {
      const int r0 = static_cast<int>(t * P),
                n = static_cast<int>(std::min<std::int64_t>(P, T - t * P));
      const Tensor ix = idx[k % kBufs].tile(0, n, 0, 1);
      b.dma_copy(ix, ids.tile(r0, n, 0, 1), kQueueIds);
      for (std::int64_t c0 = 0; c0 < D; c0 += chunk, ++unit) {
        const std::int64_t w = std::min(chunk, D - c0);
        const Tensor g = rows[unit % kBufs].tile(0, n, 0, w);
        b.dma_gather(g, table.tile(0, static_cast<int>(V), c0, w), ix, kQueueIndirect, false,
                     Engine::gpsimd);
        b.dma_copy(out.tile(r0, n, c0, w), g, kQueueStore, false, Engine::scalar);
      }
    }
  }
  return b.finish();
}

isa::Program embedding_backward_kernel(const arch::ChipSpec& chip, const EmbeddingSpec& s) {
  check_embedding(chip, "embedding_backward", s);
  Builder b(chip, s.cores);
  const std::int64_t T = s.tokens, V = s.vocab, D = s.dim;
  const Tensor ids = b.hbm("ids", {T, 1}, DType::int32, isa::TensorKind::input);
  const Tensor dout = b.hbm("dout", {T, D}, s.dtype, isa::TensorKind::input);
  const Tensor dtable = b.hbm("dtable", {V, D}, DType::fp32, isa::TensorKind::output);
  const int P = chip.sbuf_partitions;
  const int Vi = static_cast<int>(V);
  const std::int64_t esz = isa::size_bytes(s.dtype);
  // The columns are split over the cores: core c owns dtable[:, its
  // columns], zeroes them and scatter-adds every token's slice of dout into
  // them. No two cores touch the same bytes, so no cross-core ordering is
  // needed and every token's row costs HBM traffic once. (Splitting the
  // tokens instead would make cores race on rows that share an id.)
  const std::int64_t per = std::max(ceil_div(D, s.cores), std::min(D, kMinCoreCols));
  for (int core = 0; core < s.cores && core * per < D; ++core) {
    b.set_core(core);
    const std::int64_t c_lo = core * per, c_hi = std::min(D, c_lo + per);
    // Column chunks of at most kChunkBytes of FP32 per row.
    const std::int64_t zc = std::min(kChunkBytes / 4, c_hi - c_lo);
    // Zero fill: kz table rows per partition per transfer (each partition's
    // rows are consecutive), so that a transfer moves up to kChunkBytes per
    // partition however narrow the core's columns are.
    const std::int64_t kz =
        std::max<std::int64_t>(1, std::min(ceil_div(V, P), kChunkBytes / (zc * 4)));
    // Scatters of up to 128 x K tokens at once: index tile [P, K] and data
    // [P, K * w], partition p holding K consecutive tokens (Group), so that
    // the scatter's accumulation order (the index tile's element order) is
    // token order, and each partition's ids and dout rows load contiguously.
    const std::int64_t K = std::clamp<std::int64_t>(kChunkBytes / (zc * esz), 1, kMaxSlots);
    Tensor idx[kBufs], rows[kBufs];
    for (int i = 0; i < kBufs; ++i) {
      idx[i] = b.sbuf(P, K, DType::int32);
      rows[i] = b.sbuf(P, K * zc, s.dtype);
    }
    const Tensor zero = b.sbuf(P, kz * zc, DType::fp32);
    // One scatter per (token group, column chunk).
    struct Unit {
      Group g;
      std::int64_t gi, c0, w;
    };
    std::vector<Unit> units;
    std::int64_t gi = 0;
    for (const Group& g : token_groups(T, P, K)) {
      for (std::int64_t c0 = c_lo; c0 < c_hi; c0 += zc)
        units.push_back({g, gi, c0, std::min(zc, c_hi - c0)});
      ++gi;
    }
    auto index_tile = [&](const Unit& u) { return idx[u.gi % kBufs].tile(0, u.g.n, 0, u.g.slots); };
    auto data_tile = [&](std::size_t i) {
      return rows[i % kBufs].tile(0, units[i].g.n, 0, units[i].g.slots * units[i].w);
    };
    auto load = [&](std::size_t i) {
      const Unit& u = units[i];
      if (u.c0 == c_lo)
        b.dma_copy(index_tile(u), row_slots(ids, u.g.t0, u.g.n, u.g.slots, u.g.slots, 1, 0, 1),
                   kQueueIds);
      b.dma_copy(data_tile(i), row_slots(dout, u.g.t0, u.g.n, u.g.slots, u.g.slots, 1, u.c0, u.w),
                 kQueueLoad);
    };
    // The first unit's loads go ahead of the zero fill on the DMA engines
    // (which serve transfers in issue order), so that the first scatter can
    // start as soon as the fill is done.
    load(0);
    b.memset(zero, 0.0f, Engine::gpsimd);
    const int zero_queues = chip.dma.queues_per_engine - kQueueZero0;
    int zq = 0;
    auto zero_rows = [&](const Tensor& view, std::int64_t elems_per_partition, int parts) {
      b.dma_copy(view, zero.tile(0, parts, 0, elems_per_partition), kQueueZero0 + zq);
      zq = (zq + 1) % zero_queues;
    };
    for (std::int64_t c0 = c_lo; c0 < c_hi; c0 += zc) {
      const std::int64_t w = std::min(zc, c_hi - c0);
      std::int64_t v0 = 0;
      for (; v0 + P * kz <= V; v0 += P * kz)
        zero_rows(row_slots(dtable, v0, P, kz, kz, 1, c0, w), kz * w, P);
      for (; v0 < V; v0 += P) {  // the rest, one row per partition
        const int nv = static_cast<int>(std::min<std::int64_t>(P, V - v0));
        zero_rows(dtable.tile(static_cast<int>(v0), nv, c0, w), w, nv);
      }
    }
    // Every scatter writes (and reads) the core's whole dtable view as far
    // as the builder knows (the rows are data), so each one waits for the
    // zero fill and for the previous scatter to complete: duplicate ids in
    // different scatters add in token order. The loads run ahead on Sync
    // while the scatters, issued from GpSimd, form one chain; K tokens per
    // partition shorten it.
    for (std::size_t i = 0; i < units.size(); ++i) {
      if (i > 0) load(i);
      b.dma_scatter(dtable.tile(0, Vi, units[i].c0, units[i].w), data_tile(i), index_tile(units[i]),
                    kQueueIndirect, true, Engine::gpsimd);
    }
  }
  return b.finish();
}

}  // namespace tern::kernel
