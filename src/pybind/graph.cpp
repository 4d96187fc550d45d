// tern._core's graph API (src/graph): the Graph IR with its builders, the
// text form, autodiff and the float64 reference interpreter. Values are
// plain int ids; dtypes are names ("bf16", "float32", "int32", ...); every
// tern::Error surfaces as tern._core.TernError (core.cpp's translator).
// tern.graph (python/tern/graph.py) wraps it in Tensor handles.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "graph/autocast.h"
#include "graph/autodiff.h"
#include "graph/eval.h"
#include "graph/ir.h"
#include "graph/optimizer.h"
#include "graph/text.h"
#include "lower/lower.h"
#include "runtime/device.h"
#include "util/error.h"

namespace py = pybind11;

namespace tern {

namespace {

using graph::Attr;
using graph::Attrs;
using graph::Graph;
using graph::Op;
using graph::Shape;

// A Python attribute value: bool and int -> integer, float -> real, str ->
// name, a list or tuple of ints -> integer list.
Attr to_attr(const std::string& key, const py::handle& v) {
  if (py::isinstance<py::bool_>(v)) return std::int64_t{v.cast<bool>() ? 1 : 0};
  if (py::isinstance<py::int_>(v)) return v.cast<std::int64_t>();
  if (py::isinstance<py::float_>(v)) return v.cast<double>();
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    std::vector<std::int64_t> out;
    for (const py::handle& e : v) {
      if (!py::isinstance<py::int_>(e) || py::isinstance<py::bool_>(e))
        throw Error(fmt::format("attribute '{}': a list holds integers only, got {}", key,
                                py::repr(e).cast<std::string>()));
      out.push_back(e.cast<std::int64_t>());
    }
    return out;
  }
  throw Error(fmt::format("attribute '{}': {} is not an int, float, str or list of ints", key,
                          py::repr(v).cast<std::string>()));
}

py::object from_attr(const Attr& a) {
  return std::visit([](const auto& x) -> py::object { return py::cast(x); }, a);
}

Op activation(const std::string& name) {
  const Op f = graph::parse_op(name);
  if (f != Op::gelu && f != Op::gelu_tanh && f != Op::silu && f != Op::relu)
    throw Error(fmt::format("act: '{}' is not an activation (gelu, gelu_tanh, silu, relu)", name));
  return f;
}

using F64Array = py::array_t<double, py::array::c_style | py::array::forcecast>;

}  // namespace

void bind_graph(py::module_& m) {
  // A value's type and producer, copied out of the graph.
  py::class_<graph::Value>(m, "GraphValue")
      .def_readonly("name", &graph::Value::name)
      .def_readonly("shape", &graph::Value::shape)
      .def_property_readonly("dtype",
                             [](const graph::Value& v) { return std::string(isa::name(v.dtype)); })
      .def_readonly("node", &graph::Value::node, "the producing node's index")
      .def_readonly("index", &graph::Value::index, "which of the producer's outputs")
      .def("__repr__", [](const graph::Value& v) {
        return fmt::format("%{} : {} {}", v.name, graph::shape_string(v.shape), isa::name(v.dtype));
      });

  py::class_<Graph>(m, "Graph")
      .def(py::init<std::string>(), py::arg("name") = "main")
      .def_property_readonly("name", &Graph::name)
      .def_property_readonly("outputs", &Graph::outputs, "the graph's result ids, in order")
      .def("num_values", [](const Graph& g) { return g.values().size(); })
      .def("num_nodes", [](const Graph& g) { return g.nodes().size(); })
      .def(
          "value", [](const Graph& g, int id) { return g.value(id); }, py::arg("id"),
          "a copy of value `id` (name, shape, dtype name, producer)")
      .def(
          "shape", [](const Graph& g, int id) { return g.value(id).shape; }, py::arg("id"))
      .def(
          "dtype", [](const Graph& g, int id) { return std::string(isa::name(g.value(id).dtype)); },
          py::arg("id"))
      .def(
          "value_name", [](const Graph& g, int id) { return g.value(id).name; }, py::arg("id"))
      .def("find", &Graph::find, py::arg("name"), "the id of value `name` (no '%'); -1 if absent")
      // The node producing value `id`: (op name, input ids, attrs dict, output ids).
      .def(
          "producer",
          [](const Graph& g, int id) {
            const graph::Node& n = g.node(g.value(id).node);
            py::dict attrs;
            for (const auto& [k, a] : n.attrs) attrs[py::str(k)] = from_attr(a);
            return py::make_tuple(std::string(graph::op_name(n.op)), n.inputs, attrs, n.outputs);
          },
          py::arg("id"))
      .def(
          "input",
          [](Graph& g, const std::string& name, Shape shape, const std::string& dtype) {
            return g.input(name, std::move(shape), isa::parse_dtype(dtype));
          },
          py::arg("name"), py::arg("shape"), py::arg("dtype") = "fp32")
      .def(
          "param",
          [](Graph& g, const std::string& name, Shape shape, const std::string& dtype) {
            return g.param(name, std::move(shape), isa::parse_dtype(dtype));
          },
          py::arg("name"), py::arg("shape"), py::arg("dtype") = "fp32")
      .def(
          "add_op",
          [](Graph& g, const std::string& op, std::vector<int> inputs, const py::dict& attrs,
             std::vector<std::string> names) {
            Attrs at;
            for (const auto& [k, v] : attrs) {
              const std::string key = py::str(k);
              at[key] = to_attr(key, v);
            }
            return g.add(graph::parse_op(op), std::move(inputs), std::move(at), std::move(names));
          },
          py::arg("op"), py::arg("inputs"), py::arg("attrs") = py::dict(),
          py::arg("names") = std::vector<std::string>{},
          "adds a node of op `op` (by name); returns its output ids")
      .def("mark_output", &Graph::mark_output, py::arg("id"))
      .def("matmul", &Graph::matmul, py::arg("a"), py::arg("b"), py::arg("trans_a") = false,
           py::arg("trans_b") = false)
      .def(
          "add", [](Graph& g, int a, int b) { return g.add(a, b); }, py::arg("a"), py::arg("b"))
      .def("sub", &Graph::sub, py::arg("a"), py::arg("b"))
      .def("mul", &Graph::mul, py::arg("a"), py::arg("b"))
      .def("scale", &Graph::scale, py::arg("x"), py::arg("value"))
      .def(
          "act", [](Graph& g, const std::string& f, int x) { return g.act(activation(f), x); },
          py::arg("func"), py::arg("x"), "func: gelu, gelu_tanh, silu or relu")
      .def("rmsnorm", &Graph::rmsnorm, py::arg("x"), py::arg("gamma"), py::arg("eps") = 1e-6)
      .def("layernorm", &Graph::layernorm, py::arg("x"), py::arg("gamma"), py::arg("beta"),
           py::arg("eps") = 1e-5)
      .def("softmax", &Graph::softmax, py::arg("x"))
      .def("cross_entropy", &Graph::cross_entropy, py::arg("logits"), py::arg("targets"),
           py::arg("ignore_index") = -100)
      .def("embedding", &Graph::embedding, py::arg("table"), py::arg("ids"))
      .def("rope", &Graph::rope, py::arg("x"), py::arg("cos"), py::arg("sin"))
      .def("attention", &Graph::attention, py::arg("q"), py::arg("k"), py::arg("v"),
           py::arg("causal"), py::arg("scale"), "returns [o, lse]")
      .def("reshape", &Graph::reshape, py::arg("x"), py::arg("shape"))
      .def("transpose", &Graph::transpose, py::arg("x"), py::arg("perm"))
      .def("slice", &Graph::slice, py::arg("x"), py::arg("axis"), py::arg("start"), py::arg("end"))
      .def("concat", &Graph::concat, py::arg("xs"), py::arg("axis"))
      .def(
          "cast",
          [](Graph& g, int x, const std::string& to) { return g.cast(x, isa::parse_dtype(to)); },
          py::arg("x"), py::arg("dtype"))
      .def("sum", &Graph::sum, py::arg("x"), py::arg("axes") = std::vector<std::int64_t>{},
           py::arg("keepdims") = false, "axes [] (the default): all")
      .def("broadcast", &Graph::broadcast, py::arg("x"), py::arg("shape"))
      .def(
          "full",
          [](Graph& g, Shape shape, double value, const std::string& dtype) {
            return g.full(std::move(shape), value, isa::parse_dtype(dtype));
          },
          py::arg("shape"), py::arg("value"), py::arg("dtype") = "fp32")
      .def("__str__", [](const Graph& g) { return graph::print(g); })
      .def("__repr__", [](const Graph& g) {
        return fmt::format("<tern._core.Graph {}: {} values, {} nodes>", g.name(),
                           g.values().size(), g.nodes().size());
      });

  m.def("print_graph", &graph::print, py::arg("graph"), "the graph's text form");
  m.def("parse_graph", &graph::parse, py::arg("text"), py::arg("source") = "<text>",
        "a graph from its text form; errors read '<source>:<line>: ...'");
  m.def("load_graph", &graph::load, py::arg("path"));
  m.def("save_graph", &graph::save, py::arg("graph"), py::arg("path"));
  m.def("add_backward",
        static_cast<std::map<int, int> (*)(graph::Graph&, int, const std::vector<int>&)>(
            &graph::add_backward),
        py::arg("graph"), py::arg("loss"), py::arg("wrt"),
        "adds the gradient of the scalar `loss` with respect to each of `wrt`; returns "
        "{value id: gradient id}");
  m.def(
      "evaluate",
      [](const Graph& g, const py::dict& feeds, std::optional<std::vector<int>> ids) {
        std::map<std::string, graph::HostData> in;
        for (const auto& [k, v] : feeds) {
          const std::string name = py::str(k);
          const F64Array a = F64Array::ensure(v);
          if (!a) throw Error(fmt::format("feed %{}: not convertible to a float64 array", name));
          if (const int id = g.find(name); id >= 0) {
            const Shape& want = g.value(id).shape;
            const Shape got(a.shape(), a.shape() + a.ndim());
            if (got != want)
              throw Error(fmt::format("feed %{}: shape {}, the graph says {}", name,
                                      graph::shape_string(got), graph::shape_string(want)));
          }
          in[name].assign(a.data(), a.data() + a.size());
        }
        const std::vector<graph::HostData> vals = graph::evaluate(g, in);
        std::vector<int> which;
        if (ids) {
          which = *ids;
        } else {
          for (int i = 0; i < static_cast<int>(vals.size()); ++i) which.push_back(i);
        }
        py::list out;
        for (int id : which) {
          const Shape& s = g.value(id).shape;
          const graph::HostData& d = vals[static_cast<std::size_t>(id)];
          F64Array arr(std::vector<py::ssize_t>(s.begin(), s.end()));
          std::copy(d.begin(), d.end(), arr.mutable_data());
          out.append(std::move(arr));
        }
        return out;
      },
      py::arg("graph"), py::arg("feeds"), py::arg("ids") = py::none(),
      "evaluates the graph in float64 with feeds {input/param name: array}; returns one array "
      "per value id (or per id of `ids`), shaped like the value");

  // Precision recipes and the optimizer step (graph/autocast.h,
  // graph/optimizer.h).
  m.def(
      "autocast",
      [](const Graph& g, const std::string& mode, const std::string& type,
         const std::string& mx_policy, const std::string& fp8_scaling, std::int64_t history) {
        const bool recipe =
            mode == "bf16" || mode == "fp8-hybrid" || mode == "mxfp8" || mode == "mxfp4";
        graph::AutocastOptions o =
            recipe ? graph::recipe(mode, mx_policy) : graph::parse_autocast(mode, type);
        if (fp8_scaling != "current" || history != 1024)
          graph::set_fp8_scaling(o, fp8_scaling, history);
        return graph::autocast(g, o);
      },
      py::arg("graph"), py::arg("mode"), py::arg("type") = "bf16", py::arg("mx_policy") = "rceil",
      py::arg("fp8_scaling") = "current", py::arg("amax_history") = 1024,
      "the graph rewritten under an autocast mode (none, matmult, all) or a recipe (bf16, "
      "fp8-hybrid, mxfp8, mxfp4)");
  m.def(
      "add_adamw",
      [](Graph& g, const std::map<int, int>& grads, double beta1, double beta2, double eps) {
        const graph::OptimizerInputs in = graph::add_adamw(g, grads, {beta1, beta2, eps});
        py::dict d;
        d["scalars"] = in.scalars;
        d["master"] = in.master;
        d["zeros"] = in.zeros;
        return d;
      },
      py::arg("graph"), py::arg("grads"), py::arg("beta1") = 0.9, py::arg("beta2") = 0.999,
      py::arg("eps") = 1e-8,
      "adds an AdamW step for every param in `grads` (param id -> gradient id); returns the "
      "inputs a runtime writes first: {scalars, master: {master: param}, zeros: [...]}");
  m.def("adamw_scalars", &runtime::adamw_scalars, py::arg("lr"), py::arg("weight_decay"),
        py::arg("beta1"), py::arg("beta2"), py::arg("step"),
        "the adamw.scalars feed of step `step` (from 1)");

  // Compiled graphs and the device that runs them (lower/lower.h,
  // runtime/device.h).
  py::class_<graph::Executable, std::shared_ptr<graph::Executable>>(m, "Executable")
      .def_property_readonly("launches",
                             [](const graph::Executable& e) { return e.launches.size(); })
      .def_property_readonly("kernels",
                             [](const graph::Executable& e) {
                               std::vector<std::string> k;
                               for (const auto& l : e.launches) k.push_back(l.kernel);
                               return k;
                             })
      .def_property_readonly("unlowered", [](const graph::Executable& e) { return e.unlowered; })
      .def_property_readonly("fusion_rate",
                             [](const graph::Executable& e) { return e.fusion.rate(); })
      .def_property_readonly("hbm_bytes",
                             [](const graph::Executable& e) { return e.plan.total(); });
  // One cache for the process: compiling the same graph, chip and options
  // again returns the executable compiled before.
  static graph::CompileCache cache;
  m.def(
      "compile_graph",
      [](const Graph& g, const arch::ChipSpec& chip, int cores, bool partial, int lnc) {
        graph::CompileOptions o;
        o.cores = cores, o.partial = partial, o.lnc = lnc;
        return std::const_pointer_cast<graph::Executable>(cache.get(g, chip, o));
      },
      py::arg("graph"), py::arg("chip"), py::arg("cores") = 0, py::arg("partial") = false,
      py::arg("lnc") = 1,
      "fuses, plans HBM and lowers every group to kernel launches for `chip` (cached by graph, "
      "chip and options)");
  m.def("compile_cache_stats",
        [] { return py::make_tuple(cache.size(), cache.hits(), cache.misses()); });
  auto feeds_of = [](const py::dict& feeds) {
    std::map<std::string, std::vector<float>> in;
    for (const auto& [k, v] : feeds) {
      const auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(v);
      if (!a) throw Error(fmt::format("feed %{}: not a float array", std::string(py::str(k))));
      in[py::str(k)] = std::vector<float>(a.data(), a.data() + a.size());
    }
    return in;
  };
  auto array_of = [](const graph::Executable& e, const std::string& name,
                     const std::vector<float>& vals) {
    const Shape& s = e.graph.value(e.graph.find(name)).shape;
    py::array_t<float> arr(std::vector<py::ssize_t>(s.begin(), s.end()));
    std::copy(vals.begin(), vals.end(), arr.mutable_data());
    return arr;
  };
  auto result_of = [array_of](const graph::Executable& e, const runtime::StepResult& r) {
    py::dict out;
    for (const auto& [name, vals] : r.outputs) out[py::str(name)] = array_of(e, name, vals);
    py::list events;
    for (const auto& ev : r.events)
      events.append(py::dict(py::arg("group") = ev.group, py::arg("kernel") = ev.kernel,
                             py::arg("detail") = ev.detail, py::arg("start_ns") = ev.start_ns,
                             py::arg("ns") = ev.ns));
    return py::make_tuple(out, r.time_ns, events);
  };
  py::class_<runtime::Device>(m, "Device")
      .def(py::init<arch::ChipSpec>())
      .def(
          "run",
          [feeds_of, array_of](runtime::Device& d, const graph::Executable& e,
                               const py::dict& feeds) {
            const runtime::StepResult r = d.run(e, feeds_of(feeds));
            py::dict out;
            for (const auto& [name, vals] : r.outputs) out[py::str(name)] = array_of(e, name, vals);
            return py::make_tuple(out, r.time_ns);
          },
          py::arg("executable"), py::arg("feeds"),
          "one step: feeds {input/param name: array}; returns ({output name: float32 array}, "
          "simulated ns)");
  py::class_<runtime::Session>(m, "Session")
      .def(py::init([](const arch::ChipSpec& chip, std::shared_ptr<graph::Executable> e) {
             return std::make_unique<runtime::Session>(chip, std::move(e));
           }),
           py::arg("chip"), py::arg("executable"))
      .def(
          "write",
          [feeds_of](runtime::Session& s, const std::string& name, const py::object& v) {
            py::dict d;
            d[py::str(name)] = v;
            for (const auto& [k, x] : feeds_of(d)) s.write(k, x);
          },
          py::arg("name"), py::arg("values"))
      .def("fill", &runtime::Session::fill, py::arg("name"), py::arg("value"))
      .def(
          "read",
          [array_of](const runtime::Session& s, const std::string& name) {
            return array_of(s.executable(), name, s.read(name));
          },
          py::arg("name"))
      .def(
          "step",
          [feeds_of, result_of](runtime::Session& s, const py::dict& feeds) {
            return result_of(s.executable(), s.step(feeds_of(feeds)));
          },
          py::arg("feeds") = py::dict(),
          "writes `feeds`, runs one step, applies the carries; returns ({output: array}, "
          "simulated ns, [launch events])")
      .def_property_readonly("steps", &runtime::Session::steps);
}

}  // namespace tern
