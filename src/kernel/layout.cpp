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
  struct Band {
    std::int64_t r0, n;
  };
  std::vector<Band> bands;
  for (std::size_t c = 0; c + 1 < cuts.size(); ++c)
    for (std::int64_t r = cuts[c]; r < cuts[c + 1]; r += P)
      bands.push_back({r, std::min<std::int64_t>(P, cuts[c + 1] - r)});
  constexpr int kBufs = 3;
  for (int core = 0; core < s.cores; ++core) {
    b.set_core(core);
    Tensor tiles[kBufs];
    for (auto& t : tiles) t = b.sbuf(P, s.cols, s.dtype);
    int k = 0;
    for (std::size_t bi = static_cast<std::size_t>(core); bi < bands.size();
         bi += static_cast<std::size_t>(s.cores), k = (k + 1) % kBufs) {
      const Band& band = bands[bi];
      const int n = static_cast<int>(band.n);
      const Tensor t = tiles[k].tile(0, n, 0, s.cols);
      std::int64_t cols = 0;
      std::vector<const CopyRun*> here;
      for (const CopyRun& r : s.runs)
        if (r.out_row0 <= band.r0 && band.r0 < r.out_row0 + r.rows)
          here.push_back(&r), cols += r.len;
      if (cols < s.cols) b.memset(t, 0.0f, Engine::gpsimd);  // pads and uncovered rows
      for (const CopyRun* r : here) {
        Tensor src = in[static_cast<std::size_t>(r->input)];
        src.ap.offset +=
            (r->in0 + (band.r0 - r->out_row0) * r->in_stride) * isa::size_bytes(s.dtype);
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
