// layout_copy_kernel: the shape ops' data movement (kernels.h).
#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "kernel/builder.h"
#include "kernel/detail.h"
#include "kernel/kernels.h"
#include "util/error.h"

namespace tern::kernel {

using isa::DType;
using isa::Engine;

namespace {

// Groups of runs that a permute of the two outer dims makes: consecutive
// runs of k >= 2 whole rows each, one after another in the output, with the
// same input and row stride and first elements a constant step apart. A
// band of up to P of them is one DMA each way (partition j <- run j's k
// rows), where run by run each would be a transfer of k rows.
struct Group {
  std::vector<const CopyRun*> runs;  // in output order
  std::int64_t pstride;
};
std::vector<Group> find_groups(const LayoutCopySpec& s, std::int64_t max_row_elements) {
  std::vector<const CopyRun*> rs;
  for (const CopyRun& r : s.runs) rs.push_back(&r);
  std::sort(rs.begin(), rs.end(),
            [](const CopyRun* a, const CopyRun* b) { return a->out_row0 < b->out_row0; });
  auto whole = [&](const CopyRun* r) {
    return r->col0 == 0 && r->len == s.cols && r->rows >= 2 && r->rows * s.cols <= max_row_elements;
  };
  std::vector<Group> out;
  for (std::size_t i = 0; i < rs.size();) {
    std::size_t j = i + 1;
    if (whole(rs[i]) && j < rs.size()) {
      const std::int64_t step = rs[j]->in0 - rs[i]->in0;
      auto next = [&](std::size_t a, std::size_t b) {
        return whole(rs[b]) && rs[b]->input == rs[a]->input && rs[b]->rows == rs[a]->rows &&
               rs[b]->in_stride == rs[a]->in_stride &&
               rs[b]->out_row0 == rs[a]->out_row0 + rs[a]->rows &&
               rs[b]->in0 - rs[a]->in0 == step && step >= 0;
      };
      while (j < rs.size() && next(j - 1, j)) ++j;
    }
    if (j - i >= 2)
      out.push_back({std::vector<const CopyRun*>(rs.begin() + static_cast<std::ptrdiff_t>(i),
                                                 rs.begin() + static_cast<std::ptrdiff_t>(j)),
                     rs[i + 1]->in0 - rs[i]->in0});
    i = j;
  }
  return out;
}

}  // namespace

isa::Program layout_copy_kernel(const arch::ChipSpec& chip, const LayoutCopySpec& s) {
  if (s.rows < 1 || s.cols < 1)
    throw Error(fmt::format("layout_copy: output [{}, {}] must be >= 1", s.rows, s.cols));
  if (s.cores < 1) throw Error(fmt::format("layout_copy: cores must be >= 1, got {}", s.cores));
  const std::int64_t row_bytes = s.cols * isa::size_bytes(s.dtype);
  if (row_bytes > detail::sbuf_budget(chip) / 4)
    throw NotSupported(fmt::format("layout_copy with rows of {} bytes (SBUF holds {} a tile)",
                                   row_bytes, detail::sbuf_budget(chip) / 4));
  // Every read inside its input, every write inside the output.
  for (const CopyRun& r : s.runs)
    if (r.input < 0 || r.input >= static_cast<int>(s.input_elements.size()) || r.rows < 1 ||
        r.len < 1 || r.col0 < 0 || r.col0 + r.len > s.cols || r.out_row0 < 0 ||
        r.out_row0 + r.rows > s.rows || r.in0 < 0 || r.in_stride < 0 ||
        r.in0 + (r.rows - 1) * r.in_stride + r.len >
            s.input_elements[static_cast<std::size_t>(r.input)])
      throw Error(fmt::format(
          "layout_copy: run (input {}, rows {}+{}, in {} stride {}, cols {}+{}) is out of range",
          r.input, r.out_row0, r.rows, r.in0, r.in_stride, r.col0, r.len));
  Builder b(chip, s.cores);
  std::vector<Tensor> in;
  for (std::size_t i = 0; i < s.input_elements.size(); ++i)
    in.push_back(
        b.hbm(fmt::format("in{}", i), {1, s.input_elements[i]}, s.dtype, isa::TensorKind::input));
  const Tensor out = b.hbm("out", {s.rows, s.cols}, s.dtype, isa::TensorKind::output);
  const int P = chip.sbuf_partitions;
  // Bands of output rows (at most P, starting a tile at partition 0, as the
  // start-partition rule wants) in which the same runs cover every row: cut
  // at every run's first and last row.
  std::vector<std::int64_t> cuts{0, s.rows};
  for (const CopyRun& r : s.runs) cuts.push_back(r.out_row0), cuts.push_back(r.out_row0 + r.rows);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  // A band that one run fills with whole rows packs k consecutive rows per
  // partition (contiguous k * cols elements on the output side), so that
  // narrow rows (a 64-element head dim) do not move as one short DMA
  // element each; up to the bytes per partition at which DMA saturates
  // (data/arch [dma]).
  const std::int64_t esz = isa::size_bytes(s.dtype);
  const std::int64_t sat = chip.dma.saturating_per_partition.value();
  const std::int64_t kmax = std::max<std::int64_t>(1, sat / (s.cols * esz));
  struct Piece {
    std::int64_t r0, n;  // output rows [r0, r0 + n), covered by the same runs
  };
  struct Band {
    std::int64_t r0, n, k;     // rows [r0, r0 + n), k rows per partition
    std::vector<Piece> parts;  // k == 1: stacked on the partitions in order
    // k > 1: partition j holds k whole rows, from input element in0 + j *
    // pstride on, row after row `run->in_stride` apart (k consecutive rows
    // of one run, or one run each of a group).
    const CopyRun* run = nullptr;
    std::int64_t in0 = 0, pstride = 0;
  };
  // Bands of the run groups, up to P runs each, in row order (four times
  // the saturating bytes per partition at most: a group's k rows share a
  // partition).
  auto run_groups = [&]() {
    const int parts = P;
    std::vector<Band> gs;
    for (const Group& g : find_groups(s, 4 * sat / esz)) {
      const std::int64_t k = g.runs[0]->rows, count = static_cast<std::int64_t>(g.runs.size());
      for (std::int64_t j = 0; j < count; j += parts) {
        const std::int64_t m = std::min<std::int64_t>(parts, count - j);
        const CopyRun* first = g.runs[static_cast<std::size_t>(j)];
        gs.push_back({first->out_row0, m * k, k, {}, first, first->in0, g.pstride});
      }
    }
    return gs;
  };
  // The run whose whole rows alone cover row r (and every row of its cut
  // interval), else null.
  auto single_whole_run = [&](std::int64_t r) -> const CopyRun* {
    int covering = 0;
    const CopyRun* one = nullptr;
    for (const CopyRun& run : s.runs)
      if (run.out_row0 <= r && r < run.out_row0 + run.rows) ++covering, one = &run;
    return covering == 1 && one->col0 == 0 && one->len == s.cols ? one : nullptr;
  };
  std::vector<Band> bands;
  const std::vector<Band> groups = run_groups();
  std::size_t gi = 0;
  for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
    std::int64_t r = cuts[c];
    const std::int64_t end = cuts[c + 1];
    // Rows a group covers move with it (its bands come in row order).
    bool grouped = false;
    while (gi < groups.size() && groups[gi].r0 + groups[gi].n <= r) bands.push_back(groups[gi++]);
    for (std::size_t g = gi; g < groups.size() && groups[g].r0 <= r; ++g)
      grouped |= r < groups[g].r0 + groups[g].n;
    if (grouped) continue;
    const CopyRun* whole = single_whole_run(r);
    if (whole && kmax > 1)
      for (std::int64_t k = std::min(kmax, (end - r) / P); k > 1 && end - r >= P * k;) {
        bands.push_back({r,
                         P * k,
                         k,
                         {},
                         whole,
                         whole->in0 + (r - whole->out_row0) * whole->in_stride,
                         k * whole->in_stride});
        r += P * k;
        k = std::min(kmax, (end - r) / P);
      }
    for (; r < end; r += P) {
      const std::int64_t n = std::min<std::int64_t>(P, end - r);
      // Short whole-row pieces of different runs (a head permute's rows)
      // share a band up to P rows: one load per piece, one store per band.
      Band* last = bands.empty() ? nullptr : &bands.back();
      if (whole && last && last->k == 1 && last->r0 + last->n == r && last->n + n <= P &&
          single_whole_run(last->parts.back().r0)) {
        last->n += n;
        last->parts.push_back({r, n});
      } else {
        bands.push_back({r, n, 1, {{r, n}}, nullptr, 0, 0});
      }
    }
  }
  while (gi < groups.size()) bands.push_back(groups[gi++]);
  // Buffers: as many band tiles as a quarter of the SBUF budget holds (2..16),
  // so short bands keep many transfers in flight.
  std::int64_t tile_cols = s.cols * kmax;
  for (const Band& g : groups) tile_cols = std::max(tile_cols, g.k * s.cols);
  const std::int64_t tile_bytes = tile_cols * esz;
  const int kBufs =
      static_cast<int>(std::clamp<std::int64_t>(detail::sbuf_budget(chip) / 4 / tile_bytes, 2, 16));
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    std::vector<Tensor> tiles;
    for (int i = 0; i < kBufs; ++i) tiles.push_back(b.sbuf(P, tile_cols, s.dtype));
    int k = 0;
    for (std::size_t bi = static_cast<std::size_t>(core); bi < bands.size();
         bi += static_cast<std::size_t>(s.cores), k = (k + 1) % kBufs) {
      const Band& band = bands[bi];
      const Tensor& tile = tiles[static_cast<std::size_t>(k)];
      if (band.k > 1) {  // k whole rows per partition: one DMA each way
        const int parts = static_cast<int>(band.n / band.k);
        const Tensor t = tile.tile(0, parts, 0, band.k * s.cols);
        Tensor src = in[static_cast<std::size_t>(band.run->input)];
        src.ap.offset += band.in0 * esz;
        src.ap.dims = {{band.pstride, parts}, {band.run->in_stride, band.k}, {1, s.cols}};
        src.ap.partitions = parts;
        b.dma_copy(t, src);
        Tensor dst = out;
        dst.ap.offset += band.r0 * s.cols * esz;
        dst.ap.dims = {{band.k * s.cols, parts}, {1, band.k * s.cols}};
        dst.ap.partitions = parts;
        b.dma_copy(dst, t);
        continue;
      }
      int p0 = 0;
      for (const Piece& pc : band.parts) {
        const int n = static_cast<int>(pc.n);
        const Tensor t = tile.tile(p0, n, 0, s.cols);
        std::int64_t cols = 0;
        for (const CopyRun& r : s.runs)
          if (r.out_row0 <= pc.r0 && pc.r0 < r.out_row0 + r.rows) cols += r.len;
        // Pads and uncovered rows (only a band's first piece: stacked pieces are whole rows).
        if (cols < s.cols) b.memset(t, 0.0f, Engine::gpsimd);
        for (const CopyRun& r : s.runs) {
          if (!(r.out_row0 <= pc.r0 && pc.r0 < r.out_row0 + r.rows)) continue;
          Tensor src = in[static_cast<std::size_t>(r.input)];
          src.ap.offset += (r.in0 + (pc.r0 - r.out_row0) * r.in_stride) * esz;
          src.ap.dims = {{r.in_stride, pc.n}, {1, r.len}};
          src.ap.partitions = n;
          b.dma_copy(t.tile(0, n, r.col0, r.len), src);
        }
        p0 += n;
      }
      b.dma_copy(out.tile(static_cast<int>(band.r0), static_cast<int>(band.n), 0, s.cols),
                 tile.tile(0, static_cast<int>(band.n), 0, s.cols));
    }
  }
  return b.finish();
}

}  // namespace tern::kernel
