// tern._core's trainer API (src/train): a Trainer built from a config dict
// (TrainConfig's keys), stepped on the loader's batches or on given ones,
// with its params, last gradients and logits as numpy arrays: what the
// PyTorch reference check (tests/python/test_train_torch.py) drives.
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <nlohmann/json.hpp>

#include "lower/lower.h"
#include "train/trainer.h"
#include "util/error.h"

namespace py = pybind11;

namespace tern {

namespace {

using I32Array = py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>;
using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;

train::Batch batch_of(const I32Array& ids, const I32Array& targets) {
  train::Batch b;
  b.ids.assign(ids.data(), ids.data() + ids.size());
  b.targets.assign(targets.data(), targets.data() + targets.size());
  return b;
}

py::dict metrics_of(const train::StepMetrics& m) {
  py::dict d;
  d["step"] = m.step, d["loss"] = m.loss, d["lr"] = m.lr, d["grad_norm"] = m.grad_norm;
  d["clip_scale"] = m.clip_scale, d["sim_ns"] = m.sim_ns, d["wall_ms"] = m.wall_ms;
  d["updated"] = m.updated, d["spike"] = m.spike, d["retries"] = m.retries;
  d["nonfinite"] = m.nonfinite, d["actions"] = m.actions;
  return d;
}

}  // namespace

void bind_train(py::module_& m) {
  py::class_<train::Trainer>(m, "Trainer")
      .def(py::init([](const py::dict& config) {
             const std::string text =
                 py::module_::import("json").attr("dumps")(config).cast<std::string>();
             return std::make_unique<train::Trainer>(
                 train::config_from_json(nlohmann::json::parse(text)));
           }),
           py::arg("config"),
           "a Trainer from TrainConfig keys (docs/train.md); missing keys: defaults")
      .def(
          "step", [](train::Trainer& t) { return metrics_of(t.step()); },
          "one step on the loader's next batches; returns the step's metrics")
      .def(
          "step",
          [](train::Trainer& t, const I32Array& ids, const I32Array& targets) {
            return metrics_of(t.step({batch_of(ids, targets)}));
          },
          py::arg("ids"), py::arg("targets"), "one step on a given [batch, seq] batch (accum 1)")
      .def("validate", &train::Trainer::validate, py::arg("batches"))
      .def(
          "param",
          [](const train::Trainer& t, const std::string& name) {
            const std::vector<float> x = t.param(name);
            return py::array_t<float>(static_cast<py::ssize_t>(x.size()), x.data());
          },
          py::arg("name"), "a param's values, flat float32")
      .def(
          "set_param",
          [](train::Trainer& t, const std::string& name, const F32Array& x) {
            t.set_param(name, std::vector<float>(x.data(), x.data() + x.size()));
          },
          py::arg("name"), py::arg("values"))
      .def_property_readonly("param_names", &train::Trainer::param_names)
      .def("keep_gradients", &train::Trainer::keep_gradients, py::arg("on") = true)
      .def(
          "gradients",
          [](const train::Trainer& t) {
            py::dict d;
            for (const auto& [name, x] : t.gradients())
              d[py::str(name)] = py::array_t<float>(static_cast<py::ssize_t>(x.size()), x.data());
            return d;
          },
          "the last step's mean gradient by param (flat), when keep_gradients is on")
      .def(
          "logits",
          [](train::Trainer& t, const I32Array& ids) {
            train::Batch b = batch_of(ids, ids);
            const std::vector<float> x = t.logits(b);
            return py::array_t<float>(static_cast<py::ssize_t>(x.size()), x.data());
          },
          py::arg("ids"), "logits of a [batch, seq] batch, flat [batch * seq * vocab]")
      .def_property_readonly("steps_done", &train::Trainer::steps_done)
      .def_property_readonly("parameters", &train::Trainer::parameters)
      .def_property_readonly("recipe", &train::Trainer::recipe)
      .def_property_readonly("vocab", [](const train::Trainer& t) { return t.tokenizer().vocab(); })
      .def_property_readonly("flops_per_step", &train::Trainer::flops_per_step);
}

}  // namespace tern
