// NeuronCore instructions: one per nki.isa call, each bound to an engine.
//
// Semantics follow nki.isa (destination operand first); every instruction
// may wait on semaphores before it starts and increments semaphores when it
// completes, which is how engines order themselves (hardware.md section 1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "isa/access.h"

namespace tern::isa {

enum class Engine : std::uint8_t { tensor, vector, scalar, gpsimd, sync, count_ };
constexpr int kEngines = static_cast<int>(Engine::count_);
// quantize_mx reads whole groups of this many partitions (NKI
// nisa.quantize_mx; the simulator's rule checks enforce it, kernels pad to it).
constexpr int kQuantizeMxPartitions = 32;
std::string_view engine_name(Engine e);
Engine parse_engine(std::string_view s);

enum class Opcode : std::uint8_t {
  dma_copy,         // sync: dst <- src with cast (HBM<->SBUF, SBUF<->SBUF); accumulate: dst += src
  load_stationary,  // tensor: weights [K partitions, M] into the PE array; MX (v4): x4 data
                    // [P, M] and its E8M0 scales [P/8, M], contraction K = 4P
  multiply_moving,  // tensor: dst_psum[M, N] (+)= stationary^T @ moving[K, N]; MX: moving x4
                    // [P, N] and its scales [P/8, N]
  transpose,        // tensor: dst_psum[F, P] = src[P, F]^T (exact)
  tensor_tensor,    // vector/gpsimd: dst = a op0 b
  tensor_scalar,    // vector/scalar/gpsimd: dst = (src op0 imm0) op1 imm1
  tensor_copy,      // vector/scalar/gpsimd: dst = src (cast)
  tensor_reduce,    // vector: dst[P, 1] = reduce_op0 over the free dims of src (negate optional)
  memset,           // vector/gpsimd: dst = imm0
  activation,       // scalar: dst = func(src * scale + bias); operands dst, src, [bias [P,1]],
                    // and with accumulate=true a last [P,1] operand receiving the row sums
  iota,             // gpsimd: dst[p, i] = imm0 + imm1 * p + imm2 * i
  quantize_mx,      // vector (v4): dst x4 [P, F/4], dst_scale [P/8, F/4] <- src [P, F], trn3 scales
  reciprocal,       // vector: dst = 1 / src
  bn_stats,         // vector: dst [P, 6] = (count, mean, M2) of the even- and odd-indexed elements
  bn_aggr,          // vector: dst [P, 2] = (mean, variance) combining src [P, 6k] bn_stats groups
  select,           // vector: dst = pred != 0 ? a : b (operands dst, pred, a, b)
  copy_predicated,  // vector: dst = pred != 0 ? src : dst (operands dst, pred, src)
  exponential,    // vector (v4): dst = exp(src - sub[p]); operands dst, src, [sub [P,1]], [row sums
                  // if acc]
  affine_select,  // gpsimd: dst = (imm0 + imm1 * p + imm2 * i) op0 0 ? src : imm3
  partition_reduce,  // gpsimd: dst [1, F] = op0-reduction of src [P, F] over partitions
  dma_transpose,     // DMA: dst [F, P] = src [P, F]^T (bytes unchanged)
  // The engine's sequencer (any engine): 32-bit integer registers, ALU ops,
  // branches. No operands.
  reg_set,  // r[rd] = imm0
  reg_alu,  // r[rd] = r[ra] op0 (rb >= 0 ? r[rb] : imm0)
  branch,   // if (ra < 0 || r[ra] op0 imm0) jump to instruction `target` of this stream
  // Indirect (descriptor-generated) DMA, nki.isa.dma_copy with an indirect
  // access pattern. Operands: the destination, the source, then the index
  // tile idx [P, K] (int32 or uint32, SBUF). The HBM operand is a [rows, F]
  // view whose row dim the indices select; the SBUF operand is [P, K * F]:
  // K slots of F elements, slot k of partition p <-> row idx[p, k]. Rows
  // move in the index tile's element order: partition by partition, slot by
  // slot within a partition (docs/sim.md).
  dma_gather,   // DMA: dst_sbuf[p, slot k] (+)= src_hbm[idx[p, k], :]
  dma_scatter,  // DMA: dst_hbm[idx[p, k], :] (+)= src_sbuf[p, slot k]
  // Selection, search and scan instructions of nki.isa (row semantics in
  // isa/select_ops.h). Per-partition rows are the flattened free dims.
  max8,            // vector: dst [P, 8] = the 8 largest of src's row, descending
  find_index8,     // vector: dst [P, 8] = first index of vals[p, j] in data's row (dst, data, vals)
  match_replace8,  // vector: dst = data with the first match of each of vals[p, 0..8) set to imm0,
                   // in order (dst, data, vals, [indices [P, 8] if acc])
  tensor_scan,     // vector: r = op1(op0(data0[i], r), data1[i]) from r = initial (imm0, or a
                   // [P, 1] column with col0); operands dst, data0, data1, [initial]
  select_reduce,   // vector: dst = pred ? on_true : on_false (imm0, or column with col0), and
                   // with acc the row maxima; operands dst, pred, on_true, [on_false], [max]
  range_select,    // vector: dst[i] = op0(start + i, bound0) && op1(start + i, bound1) ? src :
                   // imm1, start = imm0; operands dst, src, bound0, bound1, [row max if acc]
  nonzero_count,   // gpsimd: per 16-partition group's first partition, the indices (+ imm0) of
                   // src's non-zero elements, padded with imm1, then their count (dst, src)
  n_gather,        // gpsimd: dst[p, j] = data[p, indices[p, j]] (dst, data, indices)
  stream_shuffle,  // vector: dst[q*32 + i] = src[q*32 + table[i]] per 32-partition quadrant
                   // (table[i] = 255 keeps dst partition i)
  local_gather,    // gpsimd: per 16-partition group, imm0 elements at each index of the group's
                   // index tile (partition-major, imm1 valid indices) from every partition
                   // (dst, src, index)
  // Any engine: no data moves; its waits (which may name another core's
  // semaphores) and signal order cores (nki.isa core_barrier, sendrecv).
  // Operands only order it against this core's accesses of them.
  core_sync,
  sequence_bounds,  // gpsimd: for each element of a [1, N] segment-id row, the first index of
                    // its run of equal ids and one past its last (id 0: N and -1); dst
                    // [1, 2N] holds the N starts then the N ends (dst, segment ids)
  // vector / gpsimd: random numbers from the engine's per-partition XORWOW
  // states, element by element in free order (sub-state i % k of a lane
  // with k states). imm2 = 0: the 32-bit outputs' low bits into an integer
  // dst; imm2 = 1: uniform FP32 in [lo, hi) (imm0 / imm1, or [P, 1] columns
  // with col0 / col1) rounded to dst's type (dst, [lo], [hi]).
  rng,
  // vector / gpsimd: the engine's XORWOW states; imm2 = 0 set from a
  // [P, 6k] uint32 tile, 1 get into one, 2 seed every lane from the 32-bit
  // value of a [1, 1] tile (operand: the tile).
  rng_state,
  // vector / gpsimd: dst = (data op0 s) op1 b in FP32, s = imm0 or (col0) a
  // [P, 1] column; reverse0 / reverse1 put the operand first (nki.isa
  // scalar_tensor_tensor). Operands dst, data, b, [column].
  scalar_tensor_tensor,
  count_,
};
std::string_view opcode_name(Opcode op);
Opcode parse_opcode(std::string_view s);
// Indirect DMA: dma_gather / dma_scatter (operand 2 is the index tile).
constexpr bool is_indirect_dma(Opcode op) {
  return op == Opcode::dma_gather || op == Opcode::dma_scatter;
}
// Instructions that run on a DMA queue (triggered from an engine's stream).
constexpr bool is_dma(Opcode op) {
  return op == Opcode::dma_copy || op == Opcode::dma_transpose || is_indirect_dma(op);
}

enum class AluOp : std::uint8_t {
  bypass,
  add,
  subtract,
  multiply,
  divide,
  max,
  min,
  abs_max,
  pow,
  is_equal,
  not_equal,
  is_gt,
  is_ge,
  is_lt,
  is_le,
  // Integer tensors only (computed on the exact integers; see docs/sim.md).
  bitwise_and,
  bitwise_or,
  bitwise_xor,
  shift_left,
  shift_right,  // logical (NKI right_shift), on the 32-bit value
  // a op b = 1 / sqrt(a), b unused (NKI nl.rsqrt as a tensor_scalar operator).
  rsqrt,
  count_,
};
std::string_view alu_name(AluOp op);
bool is_bitwise(AluOp op);
// a op b on integers (comparisons give 1 / 0); divide truncates, by zero gives 0.
std::int64_t apply_alu_int(AluOp op, std::int64_t a, std::int64_t b, bool is_signed);
AluOp parse_alu(std::string_view s);
// a op b in FP32 (comparisons give 1.0 / 0.0).
float apply_alu(AluOp op, float a, float b);
// The same over arrays, the operator chosen once: a[i] = a[i] op b[i], and
// a[i] = a[i] op s (bit-identical to apply_alu element by element).
void apply_alu(AluOp op, float* a, const float* b, std::size_t n);
void apply_alu(AluOp op, float* a, float s, std::size_t n);

enum class ActFunc : std::uint8_t {
  identity,
  exp,
  log,
  tanh,
  sigmoid,
  gelu,
  gelu_tanh,
  silu,
  relu,
  rsqrt,
  sqrt,
  square,
  reciprocal,
  // Derivatives (the Scalar engine's table has them: NKI's silu_dx and
  // gelu_dx; gelu_tanh_dx is tern's, by the same pattern, for GeGLU with
  // the tanh approximation).
  silu_dx,
  gelu_dx,
  gelu_tanh_dx,
  // NKI's gelu_apprx_sigmoid x * sigmoid(1.702 x) and its derivative, and
  // the other functions of nki.language's activation table.
  gelu_sigmoid,
  gelu_sigmoid_dx,
  sin,
  cos,
  arctan,
  erf,
  erf_dx,
  softplus,
  mish,
  sign,
  abs,
  count_,
};
std::string_view act_name(ActFunc f);
ActFunc parse_act(std::string_view s);
// f(x) in FP32 (host libm; see docs/sim.md).
float apply_act(ActFunc f, float x);
// x[i] = f(x[i] * scale + bias) for i < n, and the sum of the results in
// index order (FP32), as apply_act element by element.
float apply_act(ActFunc f, float* x, std::size_t n, float scale, float bias);
// bn_stats of one partition's `n` values (stride 1): out[0..2] = count, mean,
// M2 of the even-indexed elements, out[3..5] of the odd ones, each summed in
// FP32 in index order.
void bn_stats_row(const float* x, std::size_t n, float out[6]);
// bn_aggr of `groups` (count, mean, M2) triples: Chan et al.'s pairwise
// combination in order, in FP32; out = mean, population variance.
void bn_aggr_row(const float* stats, std::size_t groups, float out[2]);

// Tensor engine performance modes (nki matmul_perf_mode).
enum class PerfMode : std::uint8_t {
  none,
  // FP8 on NeuronCore-v3+: two contraction rows per PE, K = 2P per
  // instruction at the cost of one. tern's operand layout: the stationary
  // [P, 2M] holds rows k < P in columns [0, M) and rows P + k in [M, 2M);
  // the moving [P, 2N] likewise; the output is [M, N].
  double_row,
};

struct SemWait {
  int sem = 0;
  std::int64_t value = 0;  // start only once semaphore `sem` >= value (+ r[reg])
  int reg = -1;            // register of the waiting engine added to value (loops), or -1
  int core = -1;           // the core whose semaphore it is (-1: this core's)
  bool operator==(const SemWait&) const = default;
};

struct Instruction {
  Opcode op = Opcode::tensor_copy;
  Engine engine = Engine::vector;
  std::vector<AccessPattern> operands;  // destination(s) first
  AluOp alu0 = AluOp::bypass, alu1 = AluOp::bypass;
  float imm0 = 0.0f, imm1 = 0.0f, imm2 = 0.0f, imm3 = 0.0f;
  ActFunc func = ActFunc::identity;
  float scale = 1.0f;
  bool accumulate = false;  // multiply_moving: add onto PSUM; dma_copy: add-reduce into dst
  bool negate = false;      // tensor_reduce
  // tensor_scalar: operand 0 / 1 is a per-partition FP32 column [P, 1] (the
  // next operand after the source, in order) instead of imm0 / imm1;
  // scalar_tensor_tensor: col0, its last operand.
  bool col0 = false, col1 = false;
  // dma_gather / dma_scatter: an index outside the HBM view's rows skips
  // its row (NKI oob_mode.skip) instead of stopping the run (oob_mode.error).
  bool oob_skip = false;
  // tensor_scalar / tensor_scan / scalar_tensor_tensor: the operand comes
  // first (imm op data, b op1 t); for
  // select_reduce reverse0 inverts the predicate.
  bool reverse0 = false, reverse1 = false;
  std::vector<std::int32_t> table;  // stream_shuffle: 32 source partitions (255: keep)
  int peer_core = -1;  // dma_copy: the destination is this core's SBUF (-1: the issuing core's)
  int queue = 0;       // dma_copy: DMA queue id
  int priority = 0;    // dma_copy: priority class (v4)
  // dma_copy / dma_transpose: descriptors built at run time by the hardware
  // descriptor generator (NKI dge_mode.hwdge, v3+), not before the run.
  bool hwdge = false;
  PerfMode perf = PerfMode::none;  // load_stationary / multiply_moving
  int rd = -1, ra = -1, rb = -1;   // registers of reg_set / reg_alu / branch
  int target = -1;                 // branch: index in this engine's stream
  std::vector<SemWait> waits;
  std::vector<int> signals;  // semaphores incremented by one at completion
  std::string loc;           // kernel source location, when the builder recorded one

  bool operator==(const Instruction&) const = default;
};

// Bytes of HBM rows an indirect DMA selects: indices x the HBM view's row
// (not the whole view; the SBUF side may hold another dtype).
std::int64_t indirect_hbm_bytes(const Instruction& in);

// One line: "<engine> <opcode> <operand>, <operand> key=value ... wait=s>=v signal=s @loc".
std::string to_string(const Instruction& in);
Instruction parse_instruction(const std::string& line);

}  // namespace tern::isa
