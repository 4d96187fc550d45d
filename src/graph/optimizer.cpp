#include "graph/optimizer.h"

#include <fmt/format.h>

#include "util/error.h"

namespace tern::graph {

OptimizerInputs add_adamw(Graph& g, const std::map<int, int>& grads, const AdamWConfig& c) {
  OptimizerInputs in;
  in.scalars = "adamw.scalars";
  if (g.find(in.scalars) >= 0)
    throw Error(fmt::format("graph {} already has %{} (an optimizer step was added before)",
                            g.name(), in.scalars));
  const int scalars = g.input(in.scalars, {5}, DType::fp32);
  int no_decay = -1;
  if (c.no_decay_group) {
    in.scalars_no_decay = "adamw.scalars_no_decay";
    no_decay = g.input(in.scalars_no_decay, {5}, DType::fp32);
  }
  for (const auto& [p, d] : grads) {
    const Value pv = g.value(p);
    if (g.node(pv.node).op != Op::param)
      throw Error(fmt::format("adamw: %{} is not a param", pv.name));
    if (pv.dtype != DType::bf16 && pv.dtype != DType::fp32)
      throw NotSupported(fmt::format("adamw for %{} of {} (bf16 and fp32 params are)", pv.name,
                                     isa::name(pv.dtype)));
    const bool own = pv.dtype == DType::fp32;  // an fp32 param is its own master
    const int master = own ? p : g.input(pv.name + ".master", pv.shape, DType::fp32);
    const int m = g.input(pv.name + ".adam_m", pv.shape, DType::fp32);
    const int v = g.input(pv.name + ".adam_v", pv.shape, DType::fp32);
    if (!own) in.master[pv.name + ".master"] = pv.name;
    in.zeros.push_back(pv.name + ".adam_m"), in.zeros.push_back(pv.name + ".adam_v");
    const int sc = no_decay >= 0 && pv.shape.size() < 2 ? no_decay : scalars;
    const auto out = g.add(Op::adamw, {master, d, m, v, sc},
                           {{"beta1", c.beta1},
                            {"beta2", c.beta2},
                            {"eps", c.eps},
                            {"dtype", std::string(isa::name(pv.dtype))}},
                           {pv.name + ".master.next", pv.name + ".adam_m.next",
                            pv.name + ".adam_v.next", pv.name + ".next"});
    g.carry(out[3], p);
    if (!own) g.carry(out[0], master);
    g.carry(out[1], m), g.carry(out[2], v);
  }
  return in;
}

}  // namespace tern::graph
