// The lowering of one fusion group to kernel launches: the Lowerer, its
// families of ops defined in their own files (attention, matmul, layout,
// elementwise, norm; lower.cpp dispatches a group). Private to src/lower.
#pragma once

#include "lower/lower.h"

#include <fmt/format.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <tuple>
#include "graph/ops.h"
#include "graph/quant.h"
#include "graph/text.h"
#include "kernel/kernels.h"
#include "util/error.h"
#include "util/file.h"

namespace tern::graph::detail {

inline isa::ActFunc act_func(Op op) {
  switch (op) {
    case Op::gelu:
      return isa::ActFunc::gelu;
    case Op::gelu_tanh:
      return isa::ActFunc::gelu_tanh;
    case Op::silu:
      return isa::ActFunc::silu;
    case Op::relu:
      return isa::ActFunc::relu;
    default:
      return isa::ActFunc::identity;
  }
}

class Lowerer {
 public:
  std::vector<ScalingSite> sites;  // delayed FP8 scaling sites met so far

  Lowerer(const Graph& g, const FusionReport& f, const arch::ChipSpec& chip, int cores, int lnc,
          bool fuse_mx = true)
      : g_(g), f_(f), chip_(chip), cores_(cores), lnc_(lnc), fuse_mx_(fuse_mx) {}

  // The group just lowered is kept: its quantized operands become readable
  // by later groups; rollback forgets them (a group that did not lower).
  void commit() { pending_mx_.clear(); }
  void rollback() {
    for (const std::string& k : pending_mx_) mx_quantized_.erase(k);
    pending_mx_.clear();
  }

  const Node& node(int n) const { return g_.node(n); }
  const Value& val(int v) const { return g_.value(v); }
  int out(int n) const { return node(n).outputs[0]; }

  [[noreturn]] void unsupported(int n, const std::string& why = {}) const;

  // The group's nodes other than views.
  std::vector<int> real_nodes(const KernelGroup& k) const;

  // [rows, last dim] of a value.
  std::pair<std::int64_t, std::int64_t> rows_cols(int v) const;

  std::vector<Launch> lower(const KernelGroup& k, int gi);

  // Forward and / or backward: scale = dloss / valid, the fused kernel, the
  // mean of the per-token losses.
  std::vector<Launch> cross_entropy(const std::vector<int>& nodes, const Launch& base);
  static std::string tmp(const Launch& l, const std::string& name) {
    return fmt::format("g{}.{}", l.group, name);
  }
  static std::string stat(int norm_node, const char* what) {
    return fmt::format("norm{}.{}", norm_node, what);
  }

  // The attention or attention_backward node of a group whose other nodes
  // are head views (fusion.h HeadView), or -1.
  int attention_node(const std::vector<int>& nodes) const;

  // Attention: the kernels read q and k as [B, H, D, S] (NKI's layout), so
  // both go through batched Tensor-engine transposes first; the backward
  // transposes dq and dk back.
  Launch transpose_launch(const Launch& base, int value, const std::string& in_temp,
                          const std::string& out_temp, int out_value, std::int64_t batch,
                          std::int64_t rows, std::int64_t cols, DType dt);
  // q or k of attention as [B * H, D, S] in a temporary: transposed from the
  // value, or straight from the projection output when it is a head view.
  Launch head_transpose(const Launch& base, int t, const std::string& out_temp);
  // v of attention as [B, H, S, D]: the value itself, or a head view copied
  // out of the projection output into `temp` (launch appended to ls).
  Binding head_rows(const Launch& base, int t, const std::string& temp, std::vector<Launch>& ls);
  kernel::AttentionSpec attention_spec(const Node& n, int q, int k) const;
  std::vector<Launch> attention(int n, const Launch& base);

  // The matmul(q, k^T) [-> scale] -> softmax -> matmul(., v) pattern as
  // non-causal flash attention: q, k, v [..., S, D] with rank 4 [B, H, ..]
  // or 3 [B * H, ..]; lse is kept in a temporary nobody reads.
  std::vector<Launch> attention_pattern(const std::vector<int>& nodes, const Launch& base);

  void rope(int n, Launch& l);

  // A cast of a temporary into a value (kernel::cast_kernel, unscaled).
  Launch cast_launch(const Launch& base, const std::string& in_temp, int value, std::int64_t rows,
                     std::int64_t cols, DType from);

  std::vector<Launch> embedding(int n, const Launch& base);

  // Norm backward: the kernel reads the forward's statistics (kept by the
  // forward launch) and gives per-core partial parameter gradients, summed
  // by ones @ parts on the Tensor engine.
  std::vector<Launch> norm_backward(int n, const Launch& base);

  // GLU: act(gate) * up in one pass; its backward (the two muls and the
  // act_backward) recomputes act(gate) from gate.
  void glu(const std::vector<int>& nodes, Launch& l);

  // add / sub / mul with a broadcast operand. One row of the last dim's
  // size (a bias) is read by the kernel's broadcast DMA (add and mul either
  // way round, sub when it is subtracted); any other broadcast is first
  // copied to the full shape (a layout copy into a temporary), then one pass.
  std::vector<Launch> broadcast_elementwise(int n, const Launch& base);
  kernel::LayoutCopySpec broadcast_spec(int v, const Shape& os) const;

  // A fused elementwise chain: one pass of elementwise_chain_kernel. The
  // running value enters each op as its first operand (sub with the running
  // value second becomes scale -1, add).
  void chain(const std::vector<int>& nodes, Launch& l);

  // Shape ops as row copies (kernel::layout_copy_kernel): for every output
  // row (a multi-index over the leading dims), the input segments it takes;
  // rows whose segments continue at a constant input stride merge into one
  // run.
  void layout(int n, Launch& l);

  // Sums over the leading axes: x^T @ ones on the Tensor engine, or for a
  // few rows (k <= kBlockSumRows) Vector adds of the k blocks; over all axes
  // (fp32): the reduce kernel, its row tiles spread over the cores, then
  // the cores' partials combined in core order.
  // squares: n sums x * x, the mul fused (x is the mul's operand).
  std::vector<Launch> sum(int n, Launch& l, bool squares = false);
  // Up to this many rows a leading-axes sum adds blocks on the Vector engine:
  // x^T @ ones would stream each 128-row output tile through k of the PE
  // array's 128 rows, paying a matmul's fixed cost per tile for k MACs.
  static constexpr std::int64_t kBlockSumRows = 32;

  std::vector<Launch> matmul(const std::vector<int>& nodes, Launch& l);

  // A matmul operand in HBM: a graph value or a temporary.
  struct Operand {
    int value = -1;
    std::string temp = {}, state = {};  // state: a buffer the runtime keeps across steps
    Binding as(const std::string& tensor) const {
      return state.empty() ? Binding(tensor, value, temp) : Binding::kept(tensor, state);
    }
  };
  // Operand v with K leading ([K, cols]): v itself when k_major, else v
  // ([cols, K]) transposed into a temporary by a launch appended to ls.
  Operand kmajor(std::vector<Launch>& ls, const Launch& l, int v, bool k_major, std::int64_t cols,
                 std::int64_t k, DType dt, const char* name);

  // Quantized operands (quant.h): A^T [K, M] and B [K, N] in BF16 (transposed
  // first where the graph holds A [M, K] or B [N, K]), then
  //   MX: the MX matmul quantizes on chip (QuantizeMX: MXFP8 with trn3
  //       scales), or mx_quantize launches (other policies, MXFP4) write the
  //       x4 operands for a prequantized MX matmul;
  //   per-tensor FP8: fp8_scale (amax -> s, 1 / s) and a scaled cast per
  //       operand, the FP8 matmul with the dequant epilogue.
  std::vector<Launch> quantized_matmul(int m, const MatmulQuant& q, int a, bool ta, int b, bool tb,
                                       kernel::MatmulSpec s, Launch l);

  // Value v as an MX operand [K, cols] (x4 data, E8M0 scales) in temporaries:
  // v is [K, cols], or with `trans` [cols, K]. Quantized by an mx_quantize
  // launch appended to ls the first time, over all cores; later matmuls
  // reading v the same way read those bytes. `where` says which group
  // quantized it (for the fusion report).
  struct MxOperand {
    Operand q, scale;
    int group = -1;
  };
  MxOperand mx_operand(std::vector<Launch>& ls, const Launch& l, int v, bool trans, std::int64_t k,
                       std::int64_t cols, DType elem, num::ScalePolicy policy);

  // AdamW steps (one, or the multi-tensor group) as one launch; each tensor
  // as [128, n / 128] when it splits so (all partitions busy), else
  // [rows, last dim].
  void adamw(const std::vector<int>& nodes, Launch& l);

  void norm(const std::vector<int>& nodes, Launch& l);

  void softmax(int n, Launch& l);

  void elementwise(int n, Launch& l) { elementwise_with(n, l, false); }
  // `row`: which operand of add / sub / mul is one broadcast row (-1: none).
  void elementwise_with(int n, Launch& l, bool broadcast_ok, int row = -1);

 private:
  const Graph& g_;
  const FusionReport& f_;
  const arch::ChipSpec& chip_;
  int cores_;
  int lnc_;       // CompileOptions::lnc: the matmuls pair cores into logical ones
  bool fuse_mx_;  // CompileOptions::fuse_mx
  std::map<std::string, MxOperand> mx_quantized_;  // by (value, axis, format, policy)
  std::vector<std::string> pending_mx_;            // added by the group being lowered
};

}  // namespace tern::graph::detail
