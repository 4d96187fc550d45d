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
  // element each; up to 4 KiB per partition, where DMA reaches its rate.
  const std::int64_t esz = isa::size_bytes(s.dtype);
  const std::int64_t kmax = std::max<std::int64_t>(1, 4096 / (s.cols * esz));
  struct Band {
    std::int64_t r0, n, k;  // rows [r0, r0 + n), k rows per partition
  };
  std::vector<Band> bands;
  for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
    std::int64_t r = cuts[c];
    const std::int64_t end = cuts[c + 1];
    int covering = 0;
    bool whole = false;
    for (const CopyRun& run : s.runs)
      if (run.out_row0 <= r && r < run.out_row0 + run.rows)
        ++covering, whole = run.col0 == 0 && run.len == s.cols;
    if (covering == 1 && whole && kmax > 1)
      for (std::int64_t k = std::min(kmax, (end - r) / P); k > 1 && end - r >= P * k;) {
        bands.push_back({r, P * k, k});
        r += P * k;
        k = std::min(kmax, (end - r) / P);
      }
    for (; r < end; r += P) bands.push_back({r, std::min<std::int64_t>(P, end - r), 1});
  }
  constexpr int kBufs = 3;
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    Tensor tiles[kBufs];
    for (auto& t : tiles) t = b.sbuf(P, s.cols * kmax, s.dtype);
    int k = 0;
    for (std::size_t bi = static_cast<std::size_t>(core); bi < bands.size();
         bi += static_cast<std::size_t>(s.cores), k = (k + 1) % kBufs) {
      const Band& band = bands[bi];
      std::vector<const CopyRun*> here;
      std::int64_t cols = 0;
      for (const CopyRun& r : s.runs)
        if (r.out_row0 <= band.r0 && band.r0 < r.out_row0 + r.rows)
          here.push_back(&r), cols += r.len;
      if (band.k > 1) {  // one run, whole rows, k per partition
        const CopyRun* r = here[0];
        const int parts = static_cast<int>(band.n / band.k);
        const Tensor t = tiles[k].tile(0, parts, 0, band.k * s.cols);
        Tensor src = in[static_cast<std::size_t>(r->input)];
        src.ap.offset += (r->in0 + (band.r0 - r->out_row0) * r->in_stride) * esz;
        src.ap.dims = {{band.k * r->in_stride, parts}, {r->in_stride, band.k}, {1, s.cols}};
        src.ap.partitions = parts;
        b.dma_copy(t, src);
        Tensor dst = out;
        dst.ap.offset += band.r0 * s.cols * esz;
        dst.ap.dims = {{band.k * s.cols, parts}, {1, band.k * s.cols}};
        dst.ap.partitions = parts;
        b.dma_copy(dst, t);
        continue;
      }
      const int n = static_cast<int>(band.n);
      const Tensor t = tiles[k].tile(0, n, 0, s.cols);
      if (cols < s.cols) b.memset(t, 0.0f, Engine::gpsimd);  // pads and uncovered rows
      for (const CopyRun* r : here) {
        Tensor src = in[static_cast<std::size_t>(r->input)];
        src.ap.offset += (r->in0 + (band.r0 - r->out_row0) * r->in_stride) * esz;
        src.ap.dims = {{r->in_stride, band.n}, {1, r->len}};
        src.ap.partitions = n;
        b.dma_copy(t.tile(0, n, r->col0, r->len), src);
      }
      b.dma_copy(out.tile(static_cast<int>(band.r0), n, 0, s.cols), t);
    }
  }
  return b.finish();
}

}  // namespace tern::kernel
