// Lowering: each fused group of a graph becomes one or more launches of
// kernels of the kernel library (Programs built for the group's shapes),
// with the kernels' HBM tensors bound to graph values. An Executable is the
// compiled graph: launches in order plus the HBM plan the runtime places
// values by. Built once, it runs step after step (runtime/device.h).
//
// Every op of the GPT-2 and Llama training steps lowers (docs/graph.md has
// the table of groups and their launches); what does not (transposes that
// move the last dim other than swapping the last two, mixed dtypes a kernel
// does not take, matmuls whose K does not fit SBUF) throws NotSupported
// naming the op and the value.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "arch/chip.h"
#include "graph/fusion.h"
#include "graph/ir.h"
#include "graph/memplan.h"
#include "isa/program.h"

namespace tern::graph {

struct Binding {
  Binding(std::string t, int v, std::string tmp = {})
      : tensor(std::move(t)), value(v), temp(std::move(tmp)) {}
  std::string tensor;  // the kernel's HBM tensor
  int value = -1;      // the graph value whose bytes it is, or
  std::string temp;    // (value -1) a named buffer one launch writes and later ones read
                       // within a step (a group's partial results, a norm's statistics)
  std::string state;   // (value -1, no temp) a buffer the runtime keeps across steps
                       // (delayed FP8 scaling's scales and amaxes)
  static Binding kept(std::string tensor, std::string state) {
    Binding b(std::move(tensor), -1);
    b.state = std::move(state);
    return b;
  }
};

// A per-tensor FP8 operand under delayed scaling (graph/quant.h): the
// runtime keeps "<name>.scale" and "<name>.inv" ([1, 1] fp32: s and 1 / s,
// 1 at the start) and "<name>.amax" ([cores, 1] fp32, the cast kernel's
// per-core amax), and after each step updates s from the amax history.
struct ScalingSite {
  std::string name;  // "<matmul output>.a" / ".b", as the interpreter names them
  isa::DType fp8 = isa::DType::fp8_e4m3;
  std::int64_t history = 1024;
  int cores = 1;
};

struct Launch {
  int group = -1;
  std::string kernel, detail;
  isa::Program program;
  std::vector<Binding> inputs, outputs;
  // Kernel tensors filled with one value (the executable's constants).
  std::vector<std::pair<std::string, float>> constants;
};

struct Executable {
  Graph graph;
  FusionReport fusion;
  MemoryPlan plan;
  std::vector<Launch> launches;
  std::string arch;
  // With CompileOptions::partial: the groups not lowered, and why.
  std::vector<std::pair<int, std::string>> unlowered;
  std::vector<ScalingSite> scaling;  // delayed FP8 scaling's state, by site
};

struct CompileOptions {
  int cores = 0;         // physical NeuronCores each kernel uses (0: all of the chip's)
  bool partial = false;  // lower what can be (for estimates); the rest into `unlowered`
  // Logical NeuronCore setting (NEURON_LOGICAL_NC_CONFIG): 2 pairs the
  // cores into logical cores (NeuronCore-v3+), which the matmuls use
  // (kernel::MatmulSpec::lnc); 1: every core on its own.
  int lnc = 1;
  // MX operands (mxfp8 / mxfp4 recipes): true quantizes each (value, axis)
  // once for the whole step, over all cores, and every matmul reading it
  // reads the quantized bytes (a [tokens, features] operand through the
  // quantizer's transposing load, no transpose pass); false is the unfused
  // baseline: every matmul quantizes its own BF16 operands (inside the MX
  // matmul with trn3 scales, else by launches of its own), after Tensor-
  // engine transposes into K-major form. The bits are the same either way.
  bool fuse_mx = true;
  std::string key() const;  // the options' part of a compile-cache key
};

// Throws NotSupported for a group it cannot lower yet, naming the op and
// value; tern::Error for graphs whose shapes a kernel rejects.
Executable compile(const Graph& g, const arch::ChipSpec& chip, const CompileOptions& opt = {});

// Compiled executables by (graph text, chip, options): compiling a graph
// that is already in the cache returns the same executable without work
// (hits() counts it). Thread-compatible (not synchronized).
class CompileCache {
 public:
  std::shared_ptr<const Executable> get(const Graph& g, const arch::ChipSpec& chip,
                                        const CompileOptions& opt = {});
  std::size_t size() const { return cache_.size(); }
  std::int64_t hits() const { return hits_; }
  std::int64_t misses() const { return misses_; }
  void clear() { cache_.clear(); }

 private:
  std::map<std::string, std::shared_ptr<const Executable>> cache_;
  std::int64_t hits_ = 0, misses_ = 0;
};

}  // namespace tern::graph
