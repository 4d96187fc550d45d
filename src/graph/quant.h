// Quantized matmul operands: how the FP8 and MX training recipes
// (docs/reference/numerics.md section 5) enter the IR. A matmul's
// attributes say how each operand is quantized on its way into the Tensor
// engine; the values in the graph stay in their dtype (BF16), and the
// backward matmuls autodiff derives quantize their operands again from those
// high-precision values, each along its own contraction dim (numerics.md:
// "row-wise and column-wise copies are each quantized from high precision").
//
// Attributes of matmul:
//   quant_a, quant_b  the format of operand a / b:
//       fp8_e4m3, fp8_e5m2      per-tensor scaled FP8, current scaling:
//                               s = fp8_max / amax(operand) in FP32 (amax 0,
//                               Inf or NaN: s = 1), q = fp8(x s) saturating,
//                               the product divided by s_a s_b;
//       mxfp8_e4m3, mxfp8_e5m2, mxfp4
//                               MX blocks of 32 along the contraction dim
//                               with quant_policy's scales;
//   quant_grad        the format autodiff gives the incoming gradient when it
//                     is an operand of a backward matmul (fp8-hybrid: E5M2);
//   quant_policy      MX scale policy: rceil (default), trn3, ocp-floor;
//   quant_scaling     per-tensor FP8: current (default) or delayed;
//   quant_history     delayed: the amax history length (default 1024, as
//                     Transformer Engine).
// Absent or "": the operand is used as it is.
//
// Delayed scaling (numerics.md section 5): each per-tensor operand of each
// matmul is a site ("<matmul output name>.a" / ".b") with a scale s (1 at
// the start) and an amax history (zeros). A step quantizes with s and
// records the operand's amax; after the step the history takes the amax and
// s = fp8_max / max(history) when that is finite and > 0 (else s stays).
// The state lives outside the graph: in a DelayedScaling object (the
// interpreter's, or the one a runtime Session keeps beside the device).
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "num/mx.h"

namespace tern::graph {

enum class QuantKind : std::uint8_t { none, fp8_tensor, mx };

struct OperandQuant {
  QuantKind kind = QuantKind::none;
  std::string name;                      // the attribute value ("mxfp8_e4m3")
  DType fp8 = DType::fp8_e4m3;           // fp8_tensor: the element dtype
  num::MxId mx = num::MxId::mxfp8_e4m3;  // mx: the block format
  bool operator==(const OperandQuant& o) const { return name == o.name; }
};

struct MatmulQuant {
  OperandQuant a, b, grad;
  num::ScalePolicy policy = num::ScalePolicy::rceil;
  bool delayed = false;         // per-tensor FP8 operands: delayed scaling
  std::int64_t history = 1024;  // its amax history length
  bool any() const { return a.kind != QuantKind::none || b.kind != QuantKind::none; }
};

// The state of delayed scaling: per site, the scale in use and the amax
// history.
class DelayedScaling {
 public:
  // The scale `site` quantizes with now (1 for a site not seen yet).
  float scale(const std::string& site) const;
  // Records this step's amax of `site` (an operand quantized to fp8, with
  // an amax history of length `history`).
  void record(const std::string& site, DType fp8, float amax, std::int64_t history);
  // After a step: every recorded amax joins its history, scales update.
  void update();
  std::size_t sites() const { return sites_.size(); }

  // The whole state (checkpoints save and restore it).
  struct Site {
    float scale = 1.0f;
    std::vector<float> history;  // oldest first, at most `length`
    std::int64_t length = 1024;
    bool pending = false;
    float amax = 0.0f;
    DType fp8 = DType::fp8_e4m3;
  };
  const std::map<std::string, Site>& state() const { return sites_; }
  void restore(std::map<std::string, Site> s) { sites_ = std::move(s); }

 private:
  std::map<std::string, Site> sites_;
};

// Parses one format name ("" -> none). Throws tern::Error naming the value
// and the choices.
OperandQuant parse_operand_quant(const std::string& name);
// The quantization attributes of a matmul node (validated).
MatmulQuant matmul_quant(const Attrs& attrs);
// Sets them (empty formats are left out).
void set_matmul_quant(Attrs& attrs, const MatmulQuant& q);

// The values an operand has after quantization, in place: x holds a tensor
// of `shape` whose values are first rounded to `dtype` (the operand's dtype,
// as the device holds it); for MX the contraction dim is the last axis when
// k_last, else the second to last (its length a multiple of 32). Float64
// results, exact (every quantized value is a float).
// With `scale` (delayed scaling), fp8_tensor operands use it instead of
// the current fp8_max / amax. Returns the operand's amax (fp8_tensor; 0
// otherwise).
// Numeric health of one quantized operand (the trainer's monitors):
// elements seen, non-finite inputs, saturated ones (|x| beyond the
// format's largest value at its scale: clamped), underflowed ones (nonzero
// in, zero out), and the range of the scales used (FP8: the per-tensor
// factor; MX: the blocks' 2^X).
struct QuantStats {
  std::int64_t elements = 0, nonfinite = 0, saturated = 0, underflow = 0;
  double scale_min = INFINITY, scale_max = 0;
  void merge(const QuantStats& o);
};

float fake_quantize(std::vector<double>& x, const Shape& shape, bool k_last, const OperandQuant& q,
                    num::ScalePolicy policy, DType dtype, std::optional<float> scale = {},
                    QuantStats* stats = nullptr);

// fp8_tensor's current-scaling factor fp8_max / amax in FP32 (1 when amax is
// 0, Inf or NaN).
float fp8_scale(DType fp8, float amax);

}  // namespace tern::graph
