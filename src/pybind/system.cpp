// tern._core.System: runtime::System for Python, where tern.nki runs the
// collectives of multi-rank kernels (python/tern/nki/collectives.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "arch/system.h"
#include "fabric/collective.h"
#include "num/format.h"
#include "profile/profile.h"
#include "runtime/system.h"
#include "util/error.h"

namespace py = pybind11;

namespace tern {

namespace {

using Groups = std::vector<std::vector<int>>;

runtime::ReduceOp reduce_op(const std::string& s) {
  if (s == "add") return runtime::ReduceOp::sum;
  if (s == "max") return runtime::ReduceOp::max;
  if (s == "min") return runtime::ReduceOp::min;
  throw NotSupported("a collective reduction '" + s + "' (add, max or min)");
}

// A System buffer's dtype by its NKI or tern name.
num::FormatId buffer_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32") return num::FormatId::fp32;
  if (s == "bf16" || s == "bfloat16") return num::FormatId::bf16;
  if (s == "fp16" || s == "float16") return num::FormatId::fp16;
  throw NotSupported("collectives on " + s + " tensors (float32, bfloat16 or float16)");
}

runtime::Launch launch(bool async) {
  return async ? runtime::Launch::async : runtime::Launch::sync;
}

py::array_t<float> to_array(const std::vector<float>& v) {
  py::array_t<float> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

}  // namespace

void bind_system(py::module_& m) {
  using runtime::System;
  using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
  m.def(
      "smallest_system",
      [](const std::string& chip, std::int64_t chips) -> std::optional<std::string> {
        const auto s = arch::smallest_system(chip, chips);
        if (!s) return std::nullopt;
        return s->name;
      },
      "The name of the smallest system of `chip` chips holding `chips`, or None");
  py::class_<System>(m, "System")
      .def(py::init([](const std::string& system, int chips) {
             return new System(arch::load_system(system), chips);
           }),
           py::arg("system"), py::arg("chips"))
      .def_property_readonly("chips", &System::chips)
      .def_property_readonly("name", [](const System& s) { return s.spec().name; })
      .def(
          "write",
          [](System& s, int chip, const std::string& name, FloatArray a, const std::string& dt) {
            s.write(chip, name,
                    std::span<const float>(a.data(), static_cast<std::size_t>(a.size())),
                    buffer_dtype(dt));
          },
          py::arg("chip"), py::arg("name"), py::arg("values"), py::arg("dtype") = "fp32")
      .def("read", [](const System& s, int chip,
                      const std::string& name) { return to_array(s.read(chip, name)); })
      .def("clock", [](const System& s, int chip) { return s.clock(chip).value(); })
      .def(
          "advance",
          [](System& s, int chip, double ns, const std::string& name) {
            s.advance(chip, Nanoseconds(ns), name);
          },
          py::arg("chip"), py::arg("ns"), py::arg("name") = "compute")
      // Collectives: `async_` launches return at once (the chips compute
      // on; wait() later), else they synchronize the members. Each returns
      // its handle.
      .def(
          "all_reduce",
          [](System& s, const std::string& in, const Groups& g, const std::string& op, bool a) {
            return s.all_reduce(in, g, reduce_op(op), launch(a));
          },
          py::arg("name"), py::arg("groups"), py::arg("op") = "add", py::arg("async_") = false)
      .def(
          "all_gather",
          [](System& s, const std::string& in, const std::string& out, const Groups& g, bool a) {
            return s.all_gather(in, out, g, launch(a));
          },
          py::arg("name"), py::arg("out"), py::arg("groups"), py::arg("async_") = false)
      .def(
          "reduce_scatter",
          [](System& s, const std::string& in, const std::string& out, const Groups& g,
             const std::string& op,
             bool a) { return s.reduce_scatter(in, out, g, reduce_op(op), launch(a)); },
          py::arg("name"), py::arg("out"), py::arg("groups"), py::arg("op") = "add",
          py::arg("async_") = false)
      .def(
          "all_to_all",
          [](System& s, const std::string& in, const std::string& out, const Groups& g, bool a) {
            return s.all_to_all(in, out, g, launch(a));
          },
          py::arg("name"), py::arg("out"), py::arg("groups"), py::arg("async_") = false)
      .def(
          "send_recv",
          [](System& s, int from, const std::string& in, int to, const std::string& out, bool a) {
            return s.send_recv(from, in, to, out, launch(a));
          },
          py::arg("src"), py::arg("name"), py::arg("dst"), py::arg("out"),
          py::arg("async_") = false)
      // Waits for an async collective on one member (its clock moves to the
      // end if earlier; its outputs become readable), or on all of them.
      .def(
          "wait", [](System& s, runtime::Handle h, int chip) { s.wait(h, chip); },
          py::arg("handle"), py::arg("chip"))
      .def("wait_all", [](System& s, runtime::Handle h) { s.wait(h); })
      // The collectives as they ran: op, algorithm, chips, bytes, start and
      // duration (ns).
      .def("events",
           [](const System& s) {
             py::list out;
             for (const runtime::CollectiveEvent& e : s.events()) {
               py::dict d;
               d["op"] = std::string(fabric::op_name(e.op));
               d["algorithm"] = std::string(fabric::algorithm_name(e.algorithm));
               d["chips"] = e.chips;
               d["bytes"] = e.bytes.value();
               d["start_ns"] = e.start.value();
               d["duration_ns"] = e.duration.value();
               out.append(d);
             }
             return out;
           })
      .def("write_trace",
           [](const System& s, const std::string& path) { profile::write_trace(s.trace(), path); });
}

}  // namespace tern
