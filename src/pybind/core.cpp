// tern._core: the C++ layers for Python (pybind11). A thin, explicit API:
// hardware descriptions, the kernel builder and the simulator; the graph IR
// (graph.cpp). The NKI frontend (python/tern/nki) and tern.graph are
// written on top of it.
#include <fmt/format.h>

#include <map>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "arch/chip.h"
#include "isa/program.h"
#include "kernel/builder.h"
#include "kernel/kernels.h"
#include "kernel/reference.h"
#include "kernel/registry.h"
#include "profile/profile.h"
#include "sim/codec.h"
#include "sim/simulator.h"
#include "util/error.h"

namespace py = pybind11;
using namespace tern;

namespace tern {
void bind_graph(py::module_& m);   // graph.cpp
void bind_train(py::module_& m);   // train.cpp
void bind_system(py::module_& m);  // system.cpp
}  // namespace tern

namespace {

using kernel::Builder;
using kernel::Tensor;

py::dict summary_dict(const sim::RunStats& st, const arch::ChipSpec& chip) {
  const auto s = profile::summarize(st, chip);
  return py::module_::import("json").attr("loads")(profile::to_json(s).dump());
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() =
      "tern's C++ layers: hardware descriptions, the kernel builder, the simulator, the graph IR";

  // Every tern::Error becomes a Python exception with the same message;
  // "not supported" ones become NotImplementedError.
  static py::exception<Error> tern_error(m, "TernError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const NotSupported& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    } catch (const Error& e) {
      tern_error(e.what());
    }
  });
  bind_graph(m);
  bind_train(m);
  bind_system(m);

  py::class_<arch::ChipSpec>(m, "Chip")
      .def_readonly("name", &arch::ChipSpec::name)
      .def_readonly("core_version", &arch::ChipSpec::core_version)
      .def_readonly("cores", &arch::ChipSpec::cores)
      .def_readonly("sbuf_partitions", &arch::ChipSpec::sbuf_partitions)
      .def_readonly("bn_stats_fmax", &arch::ChipSpec::bn_stats_fmax)
      .def_property_readonly("sbuf_partition_bytes",
                             [](const arch::ChipSpec& c) { return c.sbuf_partition_bytes.value(); })
      .def_property_readonly("psum_partition_bytes",
                             [](const arch::ChipSpec& c) { return c.psum_partition_bytes.value(); })
      .def_property_readonly("psum_banks", [](const arch::ChipSpec& c) { return c.psum_banks; })
      .def_property_readonly("sbuf_min_align",
                             [](const arch::ChipSpec& c) { return c.sbuf_min_align.value(); })
      .def_property_readonly("psum_min_align",
                             [](const arch::ChipSpec& c) { return c.psum_min_align.value(); })
      .def_property_readonly("psum_bank_bytes",
                             [](const arch::ChipSpec& c) { return c.psum_bank_bytes().value(); })
      .def_property_readonly("stationary_fmax",
                             [](const arch::ChipSpec& c) { return c.tensor.stationary_fmax; })
      .def_property_readonly("moving_fmax",
                             [](const arch::ChipSpec& c) { return c.tensor.moving_fmax; })
      .def("tensor_peak_per_core", [](const arch::ChipSpec& c, const std::string& d) {
        return c.tensor_peak_per_core(d).value();
      });
  m.def("load_chip", &arch::load_chip, py::arg("name"), "A chip description by name or path");
  m.def(
      "data_dir", [] { return arch::data_dir().string(); },
      "The data directory tern reads (arch/, plan/, the default corpus)");

  py::class_<isa::Dim>(m, "Dim")
      .def(py::init([](std::int64_t stride, std::int64_t count) {
        return isa::Dim{stride, count};
      }))
      .def_readwrite("stride", &isa::Dim::stride)
      .def_readwrite("count", &isa::Dim::count);

  py::class_<isa::AccessPattern>(m, "AccessPattern")
      .def_property_readonly(
          "mem", [](const isa::AccessPattern& a) { return std::string(isa::mem_name(a.mem)); })
      .def_property_readonly(
          "dtype", [](const isa::AccessPattern& a) { return std::string(isa::name(a.dtype)); })
      .def_readwrite("offset", &isa::AccessPattern::offset)
      .def_readwrite("start_partition", &isa::AccessPattern::start_partition)
      .def_readwrite("partitions", &isa::AccessPattern::partitions)
      .def_readwrite("dims", &isa::AccessPattern::dims)
      .def("__repr__", [](const isa::AccessPattern& a) { return isa::to_string(a); });

  py::class_<Tensor>(m, "Tensor")
      .def_readwrite("ap", &Tensor::ap)
      .def("tile", &Tensor::tile)
      .def("with_dims", &Tensor::with_dims, py::arg("dims"), py::arg("extra_offset_elems") = 0)
      // A new view: partitions [p0, p0 + np) (rows for HBM), `offset_elems`
      // added, the free pattern replaced by `dims` [(stride, count), ...].
      // For HBM, `row_stride` (elements) is the stride of the first dim.
      .def(
          "view",
          [](const Tensor& t, int p0, int np, std::int64_t offset_elems,
             const std::vector<std::pair<std::int64_t, std::int64_t>>& dims,
             std::int64_t row_stride) {
            Tensor v = t;
            const int sz = isa::size_bytes(t.ap.dtype);
            std::vector<isa::Dim> free;
            for (auto [stride, count] : dims) free.push_back({stride, count});
            if (t.ap.mem == isa::Mem::hbm) {
              v.ap.offset += (p0 * row_stride + offset_elems) * sz;
              free.insert(free.begin(), isa::Dim{row_stride, np});
              v.ap.partitions = np;
            } else {
              v.ap.start_partition += p0;
              v.ap.partitions = np;
              v.ap.offset += offset_elems * sz;
            }
            v.ap.dims = std::move(free);
            return v;
          },
          py::arg("p0"), py::arg("np"), py::arg("offset_elems"), py::arg("dims"),
          py::arg("row_stride") = 0)
      // The same memory seen as another dtype: the byte offset stays; element
      // strides of later views count elements of the new type.
      .def("retyped",
           [](const Tensor& t, const std::string& dt) {
             Tensor v = t;
             v.ap.dtype = isa::parse_dtype(dt);
             return v;
           })
      .def("__repr__", [](const Tensor& t) { return isa::to_string(t.ap); });

  py::enum_<isa::Engine>(m, "Engine")
      .value("tensor", isa::Engine::tensor)
      .value("vector", isa::Engine::vector)
      .value("scalar", isa::Engine::scalar)
      .value("gpsimd", isa::Engine::gpsimd)
      .value("sync", isa::Engine::sync);

  m.def("alu_op", [](const std::string& s) { return static_cast<int>(isa::parse_alu(s)); });
  m.def("act_func", [](const std::string& s) { return static_cast<int>(isa::parse_act(s)); });
  m.def("dtype_names", [] {
    std::vector<std::string> v;
    for (int i = 0; i < static_cast<int>(isa::DType::count_); ++i)
      v.emplace_back(isa::name(static_cast<isa::DType>(i)));
    return v;
  });
  m.def("dtype_size", [](const std::string& d) { return isa::size_bytes(isa::parse_dtype(d)); });
  // Raw little-endian elements of dtype `d` <-> their FP32 values, through
  // the simulator's codec (encode rounds to nearest even, non-saturating).
  m.def("decode", [](const std::string& d,
                     py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast> raw) {
    const isa::DType dt = isa::parse_dtype(d);
    const auto sz = static_cast<std::size_t>(isa::size_bytes(dt));
    if (isa::is_x4(dt)) throw Error("decode: x4-packed types hold 4 elements per code");
    if (static_cast<std::size_t>(raw.size()) % sz != 0)
      throw Error(fmt::format("decode: {} bytes are not whole {} elements", raw.size(), d));
    const std::size_t n = static_cast<std::size_t>(raw.size()) / sz;
    std::vector<std::int64_t> offs(n);
    for (std::size_t i = 0; i < n; ++i) offs[i] = static_cast<std::int64_t>(i * sz);
    py::array_t<float> out(static_cast<py::ssize_t>(n));
    sim::decode_row(dt, raw.data(), offs, out.mutable_data(), 1);
    return out;
  });
  m.def("encode", [](const std::string& d,
                     py::array_t<float, py::array::c_style | py::array::forcecast> values) {
    const isa::DType dt = isa::parse_dtype(d);
    if (isa::is_x4(dt)) throw Error("encode: x4-packed types hold 4 elements per code");
    const auto sz = static_cast<std::size_t>(isa::size_bytes(dt));
    const auto n = static_cast<std::size_t>(values.size());
    std::vector<std::int64_t> offs(n);
    for (std::size_t i = 0; i < n; ++i) offs[i] = static_cast<std::int64_t>(i * sz);
    py::array_t<std::uint8_t> out(static_cast<py::ssize_t>(n * sz));
    sim::encode_row(dt, values.data(), offs, out.mutable_data(), num::CastOptions{}, 0, 1);
    return out;
  });

  auto alu = [](int v) { return static_cast<isa::AluOp>(v); };
  py::class_<Builder>(m, "Builder")
      .def(py::init([](const arch::ChipSpec& chip, int cores, int lnc) {
             return new Builder(chip, cores, lnc);
           }),
           py::arg("chip"), py::arg("cores") = 1, py::arg("lnc") = 1, py::keep_alive<1, 2>())
      .def("set_location", &Builder::set_location)
      .def("set_core", &Builder::set_core)
      .def("set_psum_packing", &Builder::set_psum_packing)
      .def("set_rotating_allocation", &Builder::set_rotating_allocation)
      .def("set_hardware_dge", &Builder::set_hardware_dge)
      .def("set_overcommit", &Builder::set_overcommit)
      .def("release", &Builder::release)
      .def("hbm",
           [](Builder& b, const std::string& name, std::vector<std::int64_t> shape,
              const std::string& dt, bool output) {
             return b.hbm(name, std::move(shape), isa::parse_dtype(dt),
                          output ? isa::TensorKind::output : isa::TensorKind::input);
           })
      .def("sbuf", [](Builder& b, int p, std::int64_t f,
                      const std::string& dt) { return b.sbuf(p, f, isa::parse_dtype(dt)); })
      .def("place",
           [](Builder& b, const std::string& mem, int p0, std::int64_t offset, int p,
              std::int64_t f, const std::string& dt) {
             return b.place(mem == "psum" ? isa::Mem::psum : isa::Mem::sbuf, p0, offset, p, f,
                            isa::parse_dtype(dt));
           })
      .def("psum", [](Builder& b, int p, std::int64_t f,
                      const std::string& dt) { return b.psum(p, f, isa::parse_dtype(dt)); })
      .def("dma_copy", [](Builder& b, const Tensor& d, const Tensor& s, int queue, bool acc,
                          isa::Engine e) { b.dma_copy(d, s, queue, acc, e); })
      .def("dma_gather",
           [](Builder& b, const Tensor& d, const Tensor& table, const Tensor& idx, int queue,
              bool oob_skip, isa::Engine e) { b.dma_gather(d, table, idx, queue, oob_skip, e); })
      .def("dma_scatter",
           [](Builder& b, const Tensor& table, const Tensor& s, const Tensor& idx, int queue,
              bool acc, isa::Engine e) { b.dma_scatter(table, s, idx, queue, acc, e); })
      .def("dma_transpose",
           [](Builder& b, const Tensor& d, const Tensor& s) { b.dma_transpose(d, s); })
      .def("matmul",
           [](Builder& b, const Tensor& d, const Tensor& st, const Tensor& mv, bool acc,
              bool double_row) {
             b.matmul(d, st, mv, acc, double_row ? isa::PerfMode::double_row : isa::PerfMode::none);
           })
      .def("matmul_mx",
           [](Builder& b, const Tensor& d, const Tensor& st, const Tensor& ss, const Tensor& mv,
              const Tensor& ms, bool acc) { b.matmul_mx(d, st, ss, mv, ms, acc); })
      .def("quantize_mx", [](Builder& b, const Tensor& d, const Tensor& ds,
                             const Tensor& s) { b.quantize_mx(d, ds, s); })
      .def("transpose",
           [](Builder& b, const Tensor& d, const Tensor& s, isa::Engine e) {
             if (e == isa::Engine::vector)
               b.vector_transpose(d, s);
             else
               b.transpose(d, s);
           })
      .def("tensor_tensor", [alu](Builder& b, const Tensor& d, const Tensor& x, const Tensor& y,
                                  int op, isa::Engine e) { b.tensor_tensor(d, x, y, alu(op), e); })
      .def("tensor_scalar",
           [alu](Builder& b, const Tensor& d, const Tensor& s, int op0, float imm0, int op1,
                 float imm1,
                 isa::Engine e) { b.tensor_scalar(d, s, alu(op0), imm0, alu(op1), imm1, e); })
      .def("tensor_copy", [](Builder& b, const Tensor& d, const Tensor& s,
                             isa::Engine e) { b.tensor_copy(d, s, e); })
      .def("tensor_reduce", [alu](Builder& b, const Tensor& d, const Tensor& s, int op,
                                  bool neg) { b.tensor_reduce(d, s, alu(op), neg); })
      .def("memset", [](Builder& b, const Tensor& d, float v, isa::Engine e) { b.memset(d, v, e); })
      .def("activation",
           [](Builder& b, const Tensor& d, int func, const Tensor& s, std::optional<Tensor> bias,
              float scale, std::optional<Tensor> sums) {
             b.activation(d, static_cast<isa::ActFunc>(func), s, bias ? &*bias : nullptr, scale,
                          sums ? &*sums : nullptr);
           })
      .def("exponential",
           [](Builder& b, const Tensor& d, const Tensor& s, std::optional<Tensor> sub,
              std::optional<Tensor> sums) {
             b.exponential(d, s, sub ? &*sub : nullptr, sums ? &*sums : nullptr);
           })
      .def("reciprocal", [](Builder& b, const Tensor& d, const Tensor& s) { b.reciprocal(d, s); })
      .def("bn_stats", [](Builder& b, const Tensor& d, const Tensor& s) { b.bn_stats(d, s); })
      .def("bn_aggr", [](Builder& b, const Tensor& d, const Tensor& s) { b.bn_aggr(d, s); })
      .def("select", [](Builder& b, const Tensor& d, const Tensor& p, const Tensor& x,
                        const Tensor& y) { b.select(d, p, x, y); })
      .def("copy_predicated", [](Builder& b, const Tensor& d, const Tensor& p,
                                 const Tensor& s) { b.copy_predicated(d, p, s); })
      .def("iota", [](Builder& b, const Tensor& d, float base, float per_partition,
                      float per_element) { b.iota(d, base, per_partition, per_element); })
      .def("affine_select",
           [alu](Builder& b, const Tensor& d, const Tensor& s, float off, float pp, float pe,
                 int cmp, float fill) { b.affine_select(d, s, off, pp, pe, alu(cmp), fill); })
      .def("partition_reduce", [alu](Builder& b, const Tensor& d, const Tensor& s,
                                     int op) { b.partition_reduce(d, s, alu(op)); })
      // Any instruction by opcode name, its dependencies tracked like the
      // named builders' (destination first; see isa::Opcode for operands).
      .def(
          "emit_op",
          [](Builder& b, const std::string& op, isa::Engine e, const std::vector<Tensor>& operands,
             int alu0, int alu1, float imm0, float imm1, float imm2, float imm3, bool acc,
             bool col0, bool col1, bool rev0, bool rev1, std::vector<std::int32_t> table, int func,
             float scale) {
            isa::Instruction in;
            in.func = static_cast<isa::ActFunc>(func);
            in.scale = scale;
            in.op = isa::parse_opcode(op);
            in.engine = e;
            for (const auto& t : operands) in.operands.push_back(t.ap);
            in.alu0 = static_cast<isa::AluOp>(alu0);
            in.alu1 = static_cast<isa::AluOp>(alu1);
            in.imm0 = imm0;
            in.imm1 = imm1;
            in.imm2 = imm2;
            in.imm3 = imm3;
            in.accumulate = acc;
            in.col0 = col0;
            in.col1 = col1;
            in.reverse0 = rev0;
            in.reverse1 = rev1;
            in.table = std::move(table);
            b.emit(std::move(in));
          },
          py::arg("op"), py::arg("engine"), py::arg("operands"), py::arg("alu0") = 0,
          py::arg("alu1") = 0, py::arg("imm0") = 0.0f, py::arg("imm1") = 0.0f,
          py::arg("imm2") = 0.0f, py::arg("imm3") = 0.0f, py::arg("acc") = false,
          py::arg("col0") = false, py::arg("col1") = false, py::arg("rev0") = false,
          py::arg("rev1") = false, py::arg("table") = std::vector<std::int32_t>{},
          py::arg("func") = 0, py::arg("scale") = 1.0f)
      .def("core_sync", [](Builder& b, isa::Engine e, const std::vector<Tensor>& writes,
                           const std::vector<Tensor>& reads) { b.core_sync(e, writes, reads); })
      .def("sync_point", &Builder::sync_point)
      .def("sync_wait",
           [](Builder& b, isa::Engine e, const std::string& key, const std::vector<int>& peers,
              const std::vector<Tensor>& writes) { b.sync_wait(e, key, peers, writes); })
      .def("sync_operand", &Builder::sync_operand)
      .def("dma_to_core", [](Builder& b, const std::string& key, const Tensor& s, int peer,
                             isa::Engine e) { b.dma_to_core(key, s, peer, e); })
      .def("finish", &Builder::finish);

  m.def(
      "mx_roundtrip_columns",
      [](py::array_t<float, py::array::c_style | py::array::forcecast> v, std::int64_t k,
         std::int64_t c, bool e5m2) {
        std::vector<float> in(v.data(), v.data() + v.size());
        const auto out = kernel::mx_roundtrip_columns(in, k, c, e5m2);
        py::array_t<float> r(static_cast<py::ssize_t>(out.size()));
        std::copy(out.begin(), out.end(), r.mutable_data());
        return r;
      },
      "Each column of a row-major [k, c] matrix MX-quantized (blocks of 32 rows, trn3 scales) and "
      "back");

  // Built-in kernels (src/kernel/kernels.h): programs to load into a Simulator.
  m.def(
      "matmul_kernel",
      [](const arch::ChipSpec& chip, std::int64_t m_, std::int64_t n, std::int64_t k,
         const std::string& dtype, const std::string& out, const std::string& epilogue, int cores,
         int lnc) {
        kernel::MatmulSpec s;
        s.m = m_, s.n = n, s.k = k, s.in = isa::parse_dtype(dtype), s.out = isa::parse_dtype(out);
        s.cores = cores * lnc, s.lnc = lnc, s.epilogue = kernel::parse_epilogue(epilogue);
        return kernel::matmul_kernel(chip, s);
      },
      py::arg("chip"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("dtype") = "bf16",
      py::arg("out") = "fp32", py::arg("epilogue") = "", py::arg("cores") = 1, py::arg("lnc") = 1,
      "C = at^T @ b (HBM 'at' [k, m], 'b' [k, n], 'c' [m, n]) with an optional fused epilogue "
      "(e.g. 'scale=0.5,bias,gelu,residual': HBM 'bias' [1, n], 'residual' [m, n], fp32)");
  m.def(
      "epilogue_kernel",
      [](const arch::ChipSpec& chip, std::int64_t m_, std::int64_t n, const std::string& epilogue,
         const std::string& out) {
        return kernel::epilogue_kernel(chip, m_, n, kernel::parse_epilogue(epilogue),
                                       isa::parse_dtype(out));
      },
      py::arg("chip"), py::arg("m"), py::arg("n"), py::arg("epilogue"), py::arg("out") = "fp32",
      "y = epilogue(x) as a standalone kernel (HBM 'x' [m, n] fp32, 'y' [m, n])");

  m.def(
      "rmsnorm_kernel",
      [](const arch::ChipSpec& chip, std::int64_t rows, std::int64_t dim, const std::string& dtype,
         float eps, bool residual, int cores) {
        kernel::RmsNormSpec s;
        s.rows = rows, s.dim = dim, s.dtype = isa::parse_dtype(dtype), s.eps = eps,
        s.residual = residual, s.cores = cores;
        return kernel::rmsnorm_kernel(chip, s);
      },
      py::arg("chip"), py::arg("rows"), py::arg("dim"), py::arg("dtype") = "bf16",
      py::arg("eps") = 1e-6f, py::arg("residual") = false, py::arg("cores") = 1,
      "RMSNorm forward: HBM 'x' [rows, dim], 'gamma' [1, dim] (+ 'residual') -> 'y', 'rstd' "
      "[rows, 1] fp32 (+ 'h' = x + residual)");

  m.def(
      "adamw_kernel",
      [](const arch::ChipSpec& chip, std::int64_t rows, std::int64_t cols, const std::string& grad,
         float lr, float beta1, float beta2, float eps, float weight_decay, std::int64_t step,
         int cores) {
        kernel::AdamWSpec s;
        s.rows = rows, s.cols = cols, s.grad = isa::parse_dtype(grad), s.lr = lr, s.beta1 = beta1,
        s.beta2 = beta2, s.eps = eps, s.weight_decay = weight_decay, s.step = step, s.cores = cores;
        return kernel::adamw_kernel(chip, s);
      },
      py::arg("chip"), py::arg("rows"), py::arg("cols"), py::arg("grad") = "bf16",
      py::arg("lr") = 1e-3f, py::arg("beta1") = 0.9f, py::arg("beta2") = 0.999f,
      py::arg("eps") = 1e-8f, py::arg("weight_decay") = 0.01f, py::arg("step") = 1,
      py::arg("cores") = 1,
      "One AdamW step: HBM 'param', 'grad', 'm', 'v' -> 'param_out', 'm_out', 'v_out', "
      "'param_bf16'");

  // Every built-in kernel by name (src/kernel/registry.h); parameters as
  // keyword arguments (any value; its str() is parsed by the kernel).
  m.def(
      "build_kernel",
      [](const arch::ChipSpec& chip, const std::string& name, const py::kwargs& kw) {
        std::map<std::string, std::string> given;
        for (const auto& [k, v] : kw) {
          std::string text = py::str(v);
          if (py::isinstance<py::bool_>(v)) text = v.cast<bool>() ? "true" : "false";
          given[k.cast<std::string>()] = text;
        }
        return kernel::build_kernel(chip, name, given);
      },
      py::arg("chip"), py::arg("name"),
      "Builds the built-in kernel `name` with its parameters as keyword arguments "
      "(see kernel_params)");
  m.def(
      "kernel_params",
      [](const std::string& name) {
        py::dict d;
        for (const auto& p : kernel::find_kernel(name).params)
          d[py::str(p.name)] = py::make_tuple(p.default_value, p.help);
        return d;
      },
      "{parameter: (default, help)} of a built-in kernel");
  m.def(
      "kernel_names",
      [] {
        std::vector<std::string> v;
        for (const auto& e : kernel::kernel_registry()) v.push_back(e.name);
        return v;
      },
      "Names of the built-in kernels");

  py::class_<isa::Program>(m, "Program")
      .def("instruction_count", &isa::Program::instruction_count)
      .def("to_text", [](const isa::Program& p) { return isa::to_text(p); })
      .def("save",
           [](const isa::Program& p, const std::string& path) { isa::save_program(p, path); });

  py::class_<sim::Simulator>(m, "Simulator")
      .def(py::init<arch::ChipSpec>())
      .def("load", &sim::Simulator::load)
      .def("write",
           [](sim::Simulator& s, const std::string& name,
              py::array_t<float, py::array::c_style | py::array::forcecast> a) {
             s.write(name, std::span<const float>(a.data(), static_cast<std::size_t>(a.size())));
           })
      .def("read",
           [](const sim::Simulator& s, const std::string& name) {
             const std::vector<float> v = s.read(name);
             py::array_t<float> out(static_cast<py::ssize_t>(v.size()));
             std::copy(v.begin(), v.end(), out.mutable_data());
             return out;
           })
      // Raw bytes of a tensor (x4-packed MX data, E8M0 scales, FP8 codes).
      .def("read_bytes",
           [](const sim::Simulator& s, const std::string& name) {
             const std::vector<std::uint8_t> v = s.read_bytes(name);
             py::array_t<std::uint8_t> out(static_cast<py::ssize_t>(v.size()));
             std::copy(v.begin(), v.end(), out.mutable_data());
             return out;
           })
      .def("write_bytes",
           [](sim::Simulator& s, const std::string& name,
              py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast> a) {
             s.write_bytes(
                 name, std::span<const std::uint8_t>(a.data(), static_cast<std::size_t>(a.size())));
           })
      // Runs; returns (summary dict, RunStats handle for the trace).
      .def(
          "run",
          [](sim::Simulator& s, const std::string& mode, bool trace, int threads,
             bool uninitialized_reads) {
            sim::Options o;
            o.mode = sim::parse_mode(mode);
            o.trace = trace;
            o.threads = threads;
            o.uninitialized_reads = uninitialized_reads;
            sim::RunStats st;
            {
              py::gil_scoped_release release;
              st = s.run(o);
            }
            return std::make_pair(summary_dict(st, s.chip()), st);
          },
          py::arg("mode") = "both", py::arg("trace") = false, py::arg("threads") = 0,
          py::arg("uninitialized_reads") = false);

  py::class_<sim::RunStats>(m, "RunStats")
      .def_readonly("latency_ns", &sim::RunStats::latency_ns)
      .def_readonly("instructions", &sim::RunStats::instructions);
  m.def("write_trace", [](const sim::RunStats& st, const arch::ChipSpec& chip,
                          const std::string& path) { profile::write_trace(st, chip, path); });
}
