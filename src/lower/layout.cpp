// Lowering of layout ops (transpose, permute, slice, concat, broadcast
// copies) and of elementwise ops whose operands broadcast.
#include "lower/lowerer.h"

namespace tern::graph::detail {

// add / sub / mul with a broadcast operand. One row of the last dim's
// size (a bias) is read by the kernel's broadcast DMA (add and mul either
// way round, sub when it is subtracted); any other broadcast is first
// copied to the full shape (a layout copy into a temporary), then one pass.
std::vector<Launch> Lowerer::broadcast_elementwise(int n, const Launch& base) {
  const Node& N = node(n);
  const Shape& os = val(out(n)).shape;
  Launch e = base;
  for (std::size_t i = 0; i < 2; ++i) {
    const Shape& is = val(N.inputs[i]).shape;
    const bool row = !is.empty() && is.back() == os.back() && elements(is) == os.back() &&
                     val(N.inputs[1 - i]).shape == os;
    if (row && (i == 1 || N.op != Op::sub)) {
      elementwise_with(n, e, true, static_cast<int>(i));
      return {e};
    }
  }
  elementwise_with(n, e, true);
  std::vector<Launch> ls;
  for (std::size_t i = 0; i < 2; ++i) {
    if (val(N.inputs[i]).shape == os) continue;
    const std::string t = tmp(base, fmt::format("bcast{}", i));
    Launch c = base;
    c.kernel = "copy", c.detail = "broadcast";
    c.program = kernel::layout_copy_kernel(chip_, broadcast_spec(N.inputs[i], os));
    c.inputs = {{"in0", N.inputs[i]}};
    c.outputs = {{"out", -1, t}};
    ls.push_back(std::move(c));
    e.inputs[i] = Binding(e.inputs[i].tensor, -1, t);
  }
  ls.push_back(std::move(e));
  return ls;
}

kernel::LayoutCopySpec Lowerer::broadcast_spec(int v, const Shape& os) const {
  const Shape& is = val(v).shape;
  const std::size_t r = os.size(), off = r - is.size();
  const std::int64_t C = os.back();
  if (is.empty() || is.back() != C)
    throw NotSupported(fmt::format("lowering a broadcast of %{} {} to {} along the last dim",
                                   val(v).name, shape_string(is), shape_string(os)));
  std::vector<std::int64_t> st(is.size(), 1);
  for (std::size_t i = is.size(); i-- > 1;) st[i - 1] = st[i] * is[i];
  kernel::LayoutCopySpec s;
  s.rows = elements(os) / C, s.cols = C, s.dtype = val(v).dtype, s.cores = cores_;
  s.input_elements = {elements(is)};
  std::vector<std::int64_t> o(r - 1, 0);
  for (std::int64_t row = 0; row < s.rows; ++row) {
    std::int64_t at = 0;
    for (std::size_t k = off; k + 1 < r; ++k)
      if (is[k - off] != 1) at += o[k] * st[k - off];
    kernel::CopyRun* last = s.runs.empty() ? nullptr : &s.runs.back();
    if (last && last->out_row0 + last->rows == row &&
        (last->rows == 1 ||
         at - (last->in0 + (last->rows - 1) * last->in_stride) == last->in_stride) &&
        at >= last->in0 + (last->rows - 1) * last->in_stride) {
      if (last->rows == 1) last->in_stride = at - last->in0;
      ++last->rows;
    } else {
      s.runs.push_back({0, row, 1, at, 0, 0, C});
    }
    for (std::size_t k = o.size(); k-- > 0;) {
      if (++o[k] < os[k]) break;
      o[k] = 0;
    }
  }
  return s;
}

// Shape ops as row copies (kernel::layout_copy_kernel): for every output
// row (a multi-index over the leading dims), the input segments it takes;
// rows whose segments continue at a constant input stride merge into one
// run.
void Lowerer::layout(int n, Launch& l) {
  const Node& N = node(n);
  const Shape& os = val(out(n)).shape;
  const std::size_t r = os.size();
  for (int v : N.inputs)
    if (val(v).shape.empty() || r == 0) unsupported(n, "a shape op on a scalar []");
  const std::int64_t C = os.back(), R = elements(os) / C;
  std::vector<std::vector<std::int64_t>> st;  // row-major strides of each input
  for (int v : N.inputs) {
    const Shape& is = val(v).shape;
    std::vector<std::int64_t> t(is.size(), 1);
    for (std::size_t i = is.size(); i-- > 1;) t[i - 1] = t[i] * is[i];
    st.push_back(t);
  }
  const auto axis = [&](std::int64_t a) {
    return static_cast<std::size_t>((a + static_cast<std::int64_t>(r)) %
                                    static_cast<std::int64_t>(r));
  };
  struct Seg {
    int input;
    std::int64_t in0, col0, len;
  };
  // The segments of output row `o` (its leading multi-index).
  auto segments = [&](const std::vector<std::int64_t>& o, std::vector<Seg>& out_segs) {
    out_segs.clear();
    const Shape& is0 = val(N.inputs[0]).shape;
    switch (N.op) {
      case Op::transpose: {
        const auto perm = attr_ints(N.attrs, "perm");
        if (perm.back() != static_cast<std::int64_t>(r - 1))
          unsupported(n, "a transpose that moves the last dim");
        std::int64_t at = 0;
        for (std::size_t k = 0; k + 1 < r; ++k)
          at += o[k] * st[0][static_cast<std::size_t>(perm[k])];
        out_segs.push_back({0, at, 0, C});
        return;
      }
      case Op::slice:
      case Op::pad: {
        const std::size_t a = axis(attr_int(N.attrs, "axis", 0));
        const std::int64_t shift =
            N.op == Op::slice ? attr_int(N.attrs, "start", 0) : -attr_int(N.attrs, "before", 0);
        std::int64_t at = 0;
        for (std::size_t k = 0; k + 1 < r; ++k) {
          const std::int64_t i = o[k] + (k == a ? shift : 0);
          if (i < 0 || i >= is0[k]) return;  // a pad row: zeros
          at += i * st[0][k];
        }
        if (a == r - 1) {
          if (N.op == Op::slice)
            out_segs.push_back({0, at + shift, 0, C});
          else
            out_segs.push_back({0, at, -shift, is0.back()});
        } else {
          out_segs.push_back({0, at, 0, C});
        }
        return;
      }
      case Op::concat: {
        const std::size_t a = axis(attr_int(N.attrs, "axis", 0));
        std::int64_t base = 0;
        for (std::size_t k = 0; k < N.inputs.size(); ++k) {
          const Shape& is = val(N.inputs[k]).shape;
          if (a == r - 1) {
            std::int64_t at = 0;
            for (std::size_t d = 0; d + 1 < r; ++d) at += o[d] * st[k][d];
            out_segs.push_back({static_cast<int>(k), at, base, is.back()});
          } else if (o[a] >= base && o[a] < base + is[a]) {
            std::int64_t at = 0;
            for (std::size_t d = 0; d + 1 < r; ++d) at += (d == a ? o[d] - base : o[d]) * st[k][d];
            out_segs.push_back({static_cast<int>(k), at, 0, C});
          }
          base += is[a];
        }
        return;
      }
      default: {  // broadcast: the input aligned to the right, dims of 1 repeat
        const std::size_t off = r - is0.size();
        if (is0.back() != C) unsupported(n, "a broadcast of the last dim");
        std::int64_t at = 0;
        for (std::size_t k = off; k + 1 < r; ++k)
          if (is0[k - off] != 1) at += o[k] * st[0][k - off];
        out_segs.push_back({0, at, 0, C});
        return;
      }
    }
  };
  kernel::LayoutCopySpec s;
  s.rows = R, s.cols = C, s.dtype = val(out(n)).dtype, s.cores = cores_;
  for (int v : N.inputs) {
    s.input_elements.push_back(elements(val(v).shape));
    l.inputs.emplace_back(fmt::format("in{}", l.inputs.size()), v);
  }
  std::vector<std::int64_t> o(r - 1, 0);
  std::vector<Seg> segs;
  // Open runs by (input, col0, len): extended while the stride holds.
  std::map<std::tuple<int, std::int64_t, std::int64_t>, std::size_t> open;
  for (std::int64_t row = 0; row < R; ++row) {
    segments(o, segs);
    std::map<std::tuple<int, std::int64_t, std::int64_t>, std::size_t> next;
    for (const Seg& g : segs) {
      const auto key = std::make_tuple(g.input, g.col0, g.len);
      const auto it = open.find(key);
      if (it != open.end()) {
        kernel::CopyRun& run = s.runs[it->second];
        const std::int64_t stride = g.in0 - (run.in0 + (run.rows - 1) * run.in_stride);
        if (run.out_row0 + run.rows == row && (run.rows == 1 || stride == run.in_stride) &&
            stride >= 0) {
          if (run.rows == 1) run.in_stride = stride;
          ++run.rows;
          next[key] = it->second;
          continue;
        }
      }
      s.runs.push_back({g.input, row, 1, g.in0, 0, g.col0, g.len});
      next[key] = s.runs.size() - 1;
    }
    open = std::move(next);
    for (std::size_t k = o.size(); k-- > 0;) {  // next leading multi-index
      if (++o[k] < os[k]) break;
      o[k] = 0;
    }
  }
  l.outputs = {{"out", out(n)}};
  l.detail = fmt::format("{} runs", s.runs.size());
  l.program = kernel::layout_copy_kernel(chip_, s);
}

}  // namespace tern::graph::detail
