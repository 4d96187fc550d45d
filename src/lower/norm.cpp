// Lowering of LayerNorm / RMSNorm forward and backward.
#include "lower/lowerer.h"

namespace tern::graph::detail {

// Norm backward: the kernel reads the forward's statistics (kept by the
// forward launch) and gives per-core partial parameter gradients, summed
// by ones @ parts on the Tensor engine.
std::vector<Launch> Lowerer::norm_backward(int n, const Launch& base) {
  const Node& N = node(n);
  const bool ln = N.op == Op::layernorm_backward;
  int fwd = -1;
  for (std::size_t i = 0; i < g_.nodes().size(); ++i) {
    const Node& f = g_.nodes()[i];
    if (static_cast<int>(i) < n && f.op == (ln ? Op::layernorm : Op::rmsnorm) &&
        f.inputs[0] == N.inputs[1] && f.inputs[1] == N.inputs[2])
      fwd = static_cast<int>(i);
  }
  if (fwd < 0) unsupported(n, "without its forward norm in the graph (its statistics)");
  const auto [rows, dim] = rows_cols(N.inputs[1]);
  kernel::RmsNormSpec s;
  s.rows = rows, s.dim = dim, s.cores = cores_, s.dtype = val(N.inputs[1]).dtype;
  s.eps = static_cast<float>(attr_real(N.attrs, "eps", ln ? 1e-5 : 1e-6));
  Launch l = base;
  l.program =
      ln ? kernel::layernorm_backward_kernel(chip_, s) : kernel::rmsnorm_backward_kernel(chip_, s);
  l.inputs = {{"dy", N.inputs[0]},
              {"h", N.inputs[1]},
              {"gamma", N.inputs[2]},
              {"rstd", -1, stat(fwd, "rstd")}};
  if (ln) l.inputs.emplace_back("mean", -1, stat(fwd, "mean"));
  const std::string dg = tmp(base, "dgamma"), db = tmp(base, "dbeta");
  l.outputs = {{"dh", N.outputs[0]}, {"dgamma_parts", -1, dg}};
  if (ln) l.outputs.emplace_back("dbeta_parts", -1, db);
  std::vector<Launch> ls{l};
  auto colsum = [&](const std::string& parts, int value) {
    Launch c = base;
    kernel::MatmulSpec m;
    m.m = 1, m.n = dim, m.k = cores_, m.in = DType::fp32, m.out = val(value).dtype;
    m.trans_a = true, m.trans_b = false, m.cores = 1;
    c.kernel = "matmul", c.detail = "sum of per-core partials";
    c.program = kernel::matmul_kernel(chip_, m);
    c.constants = {{"at", 1.0f}};
    c.inputs = {{"b", -1, parts}};
    c.outputs = {{"c", value}};
    ls.push_back(std::move(c));
  };
  colsum(dg, N.outputs[1]);
  if (ln) colsum(db, N.outputs[2]);
  return ls;
}

void Lowerer::norm(const std::vector<int>& nodes, Launch& l) {
  int nn = -1, add = -1, cast = -1;
  for (int n : nodes) {
    const Op op = node(n).op;
    if (op == Op::rmsnorm || op == Op::layernorm) nn = n;
    if (op == Op::add) add = n;
    if (op == Op::cast) cast = n;
  }
  const Node& N = node(nn);
  const auto [rows, dim] = rows_cols(N.inputs[0]);
  kernel::RmsNormSpec s;
  s.rows = rows, s.dim = dim, s.cores = cores_;
  s.eps = static_cast<float>(attr_real(N.attrs, "eps", N.op == Op::layernorm ? 1e-5 : 1e-6));
  s.dtype = val(N.inputs[0]).dtype;
  if (add >= 0) {
    s.residual = true;
    l.inputs = {{"x", node(add).inputs[0]}, {"residual", node(add).inputs[1]}};
    l.outputs.push_back({"h", out(add)});
  } else {
    l.inputs = {{"x", N.inputs[0]}};
  }
  l.inputs.push_back({"gamma", N.inputs[1]});
  if (N.op == Op::layernorm) l.inputs.push_back({"beta", N.inputs[2]});
  const int y = cast >= 0 ? out(cast) : out(nn);
  if (cast >= 0) s.out = val(y).dtype;
  l.outputs.push_back({"y", y});
  l.outputs.emplace_back("rstd", -1, stat(nn, "rstd"));  // for the backward
  if (N.op == Op::layernorm) l.outputs.emplace_back("mean", -1, stat(nn, "mean"));
  l.program =
      N.op == Op::rmsnorm ? kernel::rmsnorm_kernel(chip_, s) : kernel::layernorm_kernel(chip_, s);
}

}  // namespace tern::graph::detail
