// Built-in kernels against host references: bit for bit where tern
// promises it (FP32 accumulation in contraction order of exact products),
// for odd shapes too.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "arch/chip.h"
#include "common/sim_helpers.h"
#include "kernel/kernels.h"
#include "num/convert.h"
#include "num/mx.h"
#include "sim/simulator.h"
#include "util/error.h"

namespace tern {
namespace {

using isa::DType;
using testing_helpers::random_values;

// Rounds values to what a tensor of `dt` holds.
std::vector<float> as_dtype(std::vector<float> v, DType dt) {
  if (dt == DType::fp32) return v;
  num::round_array(*isa::format_of(dt), v,
                   {num::Rounding::nearest_even, num::Overflow::saturate, 0});
  return v;
}

// Independent reference: C[m][n] = sum over k in order, one rounding per
// step (FMA for exact products; product then sum for FP32).
std::vector<float> reference(const std::vector<float>& at, const std::vector<float>& b,
                             std::int64_t M, std::int64_t N, std::int64_t K, bool fp32) {
  std::vector<float> c(static_cast<std::size_t>(M * N));
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < K; ++k) {
        const float a = at[k * M + m], x = b[k * N + n];
        if (fp32) {
          const float p = a * x;
          acc = acc + p;
        } else {
          acc = std::fma(a, x, acc);
        }
      }
      c[m * N + n] = acc;
    }
  return c;
}

struct Shape {
  std::int64_t m, n, k;
  DType dt;
  const char* chip;
};

class MatmulKernel : public ::testing::TestWithParam<Shape> {};

TEST_P(MatmulKernel, BitExactAgainstHostReference) {
  const Shape s = GetParam();
  const auto chip = arch::load_chip(s.chip);
  kernel::MatmulSpec spec{s.m, s.n, s.k, s.dt, DType::fp32, 1};
  const isa::Program p = kernel::matmul_kernel(chip, spec);
  sim::Simulator sim(chip);
  sim.load(p);
  const auto at = as_dtype(random_values(s.k * s.m, 1), s.dt);
  const auto b = as_dtype(random_values(s.k * s.n, 2), s.dt);
  sim.write("at", at);
  sim.write("b", b);
  const sim::RunStats st = sim.run();
  const auto got = sim.read("c");
  const auto want = reference(at, b, s.m, s.n, s.k, s.dt == DType::fp32);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i]) &&
        bad++ < 5) {
      ADD_FAILURE() << "c[" << i / s.n << "][" << i % s.n << "] = " << got[i] << ", want "
                    << want[i];
    }
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_GT(st.latency_ns, 0.0);
  EXPECT_DOUBLE_EQ(st.tensor_flops.at(std::string(isa::name(s.dt))), 2.0 * s.m * s.n * s.k);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MatmulKernel,
    ::testing::Values(
        Shape{128, 512, 128, DType::bf16, "trn3"}, Shape{200, 600, 300, DType::bf16, "trn3"},
        Shape{1, 1, 1, DType::bf16, "trn3"}, Shape{129, 513, 257, DType::fp32, "trn3"},
        Shape{77, 45, 130, DType::fp16, "trn2"}, Shape{64, 100, 200, DType::fp8_e4m3, "trn3"},
        Shape{96, 130, 140, DType::fp8_e5m2, "trn2"},
        Shape{100, 70, 33, DType::fp8_e4m3_legacy, "trn1"},
        Shape{640, 520, 256, DType::bf16, "trn1"},
        // K = 640: two double-row FP8 pairs and one single K tile.
        Shape{130, 300, 640, DType::fp8_e4m3, "trn3"},
        Shape{64, 512, 512, DType::fp8_e5m2, "trn2"}));

// MXFP8 on trn3: BF16 inputs quantized on chip (groups of 32 along K, trn3
// scales), multiplied by the MX matmul, checked against host MX quantization
// + the same in-order FP32 accumulation.
std::vector<float> mx_columns(const std::vector<float>& v, std::int64_t k, std::int64_t c,
                              num::MxId id) {
  const auto& f = num::mx_format(id);
  std::vector<float> out(v.size()), col(k), deq(k);
  std::vector<std::uint8_t> el(k), sc(k / 32);
  for (std::int64_t j = 0; j < c; ++j) {
    for (std::int64_t i = 0; i < k; ++i) col[i] = v[i * c + j];
    num::mx_quantize(f, num::ScalePolicy::trn3, col, el, sc);
    num::mx_dequantize(f, el, sc, deq);
    for (std::int64_t i = 0; i < k; ++i) out[i * c + j] = deq[i];
  }
  return out;
}

TEST(Kernels, MxMatmulBitExact) {
  const auto chip = arch::load_chip("trn3");
  struct Case {
    std::int64_t m, n, k;
    DType dt;
    int cores;
  };
  for (const Case c :
       {Case{128, 512, 512, DType::fp8_e4m3_x4, 1}, Case{200, 130, 640, DType::fp8_e4m3_x4, 1},
        Case{64, 600, 128, DType::fp8_e5m2_x4, 2},
        // K = 16384: all of A's quantized columns do not fit SBUF at once, so
        // M goes in blocks of three and two tiles, B quantized again for each.
        Case{640, 64, 16384, DType::fp8_e4m3_x4, 1}}) {
    const isa::Program p = kernel::matmul_kernel(chip, {c.m, c.n, c.k, c.dt, DType::fp32, c.cores});
    sim::Simulator sim(chip);
    sim.load(p);
    const auto at = as_dtype(random_values(c.k * c.m, 7, 3.0f), DType::bf16);
    const auto b = as_dtype(random_values(c.k * c.n, 8, 0.01f), DType::bf16);
    sim.write("at", at);
    sim.write("b", b);
    const auto st = sim.run();
    const auto id = c.dt == DType::fp8_e5m2_x4 ? num::MxId::mxfp8_e5m2 : num::MxId::mxfp8_e4m3;
    const auto want =
        reference(mx_columns(at, c.k, c.m, id), mx_columns(b, c.k, c.n, id), c.m, c.n, c.k, false);
    const auto got = sim.read("c");
    std::size_t bad = 0;
    for (std::size_t i = 0; i < want.size(); ++i)
      bad += std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i]);
    EXPECT_EQ(bad, 0u) << c.m << "x" << c.n << "x" << c.k;
    EXPECT_DOUBLE_EQ(st.tensor_flops.at(std::string(isa::name(c.dt))), 2.0 * c.m * c.n * c.k);
  }
  EXPECT_THROW(kernel::matmul_kernel(chip, {128, 128, 100, DType::fp8_e4m3_x4, DType::fp32, 1}),
               NotSupported);
  EXPECT_THROW(kernel::matmul_kernel(arch::load_chip("trn2"),
                                     {128, 128, 128, DType::fp8_e4m3_x4, DType::fp32, 1}),
               NotSupported);
}

// K longer than the resident layout holds (every K tile of a block in
// SBUF): the kernel streams K through a ring of tiles, still accumulating in
// K order, so the bits are the reference's; A given as [M, K] (DMA
// transposes) and a bias epilogue too.
TEST(Kernels, MatmulStreamsALongK) {
  const auto chip = arch::load_chip("trn3");
  const std::int64_t M = 130, N = 200, K = 7040;
  for (const bool ta : {true, false}) {
    kernel::MatmulSpec spec{M, N, K, DType::bf16, DType::fp32, 2};
    spec.trans_a = ta, spec.epilogue.bias = true;
    sim::Simulator sim(chip);
    sim.load(kernel::matmul_kernel(chip, spec));
    const auto at = as_dtype(random_values(K * M, 31), DType::bf16);  // A^T [K, M]
    std::vector<float> a(at.size());
    for (std::int64_t k = 0; k < K; ++k)
      for (std::int64_t m = 0; m < M; ++m) a[m * K + k] = at[k * M + m];
    const auto bm = as_dtype(random_values(K * N, 32), DType::bf16);
    const auto bias = random_values(N, 33);
    sim.write(ta ? "at" : "a", ta ? at : a), sim.write("b", bm), sim.write("bias", bias);
    sim.run();
    const auto acc = reference(at, bm, M, N, K, false);
    const auto got = sim.read("c");
    std::size_t bad = 0;
    for (std::size_t i = 0; i < acc.size(); ++i)
      bad += std::bit_cast<std::uint32_t>(got[i]) !=
             std::bit_cast<std::uint32_t>(acc[i] + bias[i % static_cast<std::size_t>(N)]);
    EXPECT_EQ(bad, 0u) << "trans_a " << ta;
  }
}

// Fewer M blocks than cores (a weight gradient: M = 768 is two blocks of
// 384): the N tiles split into groups too, so every one of the 8 cores
// runs matmuls, and the bits are still the in-order reference's.
TEST(Kernels, MatmulSplitsNTilesWhenMBlocksAreFewerThanCores) {
  const auto chip = arch::load_chip("trn3");
  const std::int64_t M = 768, N = 2048, K = 256;
  kernel::MatmulSpec spec{M, N, K, DType::bf16, DType::fp32, 8};
  const isa::Program p = kernel::matmul_kernel(chip, spec);
  ASSERT_EQ(p.cores.size(), 8u);
  for (std::size_t c = 0; c < p.cores.size(); ++c) {
    const auto& tensor = p.cores[c].streams[static_cast<std::size_t>(isa::Engine::tensor)];
    EXPECT_FALSE(tensor.empty()) << "core " << c << " has no matmuls";
  }
  sim::Simulator sim(chip);
  sim.load(p);
  const auto at = as_dtype(random_values(K * M, 41), DType::bf16);
  const auto bm = as_dtype(random_values(K * N, 42), DType::bf16);
  sim.write("at", at), sim.write("b", bm);
  sim.run();
  const auto acc = reference(at, bm, M, N, K, false);
  const auto got = sim.read("c");
  std::size_t bad = 0;
  for (std::size_t i = 0; i < acc.size(); ++i)
    bad += std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(acc[i]);
  EXPECT_EQ(bad, 0u);
}

// Column sums (a bias gradient): ones stationary, x streaming, each core a
// slice of the columns; bit for bit the in-order FP32 matmul x^T @ ones
// (ragged rows, a core with two PSUM banks, a core with no columns).
TEST(Kernels, ColumnSumsMatchTheMatmulBitForBit) {
  const auto chip = arch::load_chip("trn3");
  for (const auto& [R, C, cores] :
       {std::tuple<std::int64_t, std::int64_t, int>{1000, 1100, 2}, {4096, 96, 8}, {130, 5, 8}}) {
    SCOPED_TRACE(testing::Message() << R << " x " << C << " on " << cores);
    const isa::Program p = kernel::column_sum_kernel(chip, {R, C, DType::bf16, DType::fp32, cores});
    sim::Simulator sim(chip);
    sim.load(p);
    const auto x = as_dtype(random_values(R * C, 43), DType::bf16);
    sim.write("x", x);
    sim.run();
    const auto want =
        reference(x, std::vector<float>(static_cast<std::size_t>(R), 1.0f), C, 1, R, false);
    const auto got = sim.read("y");
    ASSERT_EQ(got.size(), want.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < want.size(); ++i)
      bad += std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i]);
    EXPECT_EQ(bad, 0u);
  }
}

// fp8-hybrid's gradient products: E4M3 x E5M2 operands (in_b), dequantized
// in the epilogue by the two per-tensor factors before the bias; bit for bit
// against the in-order FP32 reference, then (acc * da) * db + bias in FP32.
TEST(Kernels, Fp8MixedOperandsWithDequantEpilogue) {
  const auto chip = arch::load_chip("trn3");
  const std::int64_t M = 130, N = 300, K = 384;
  kernel::MatmulSpec spec{M, N, K, DType::fp8_e4m3, DType::fp32, 2};
  spec.in_b = DType::fp8_e5m2;
  spec.epilogue.dequant = true, spec.epilogue.bias = true;
  sim::Simulator sim(chip);
  sim.load(kernel::matmul_kernel(chip, spec));
  const auto at = as_dtype(random_values(K * M, 11, 60.0f), DType::fp8_e4m3);
  const auto b = as_dtype(random_values(K * N, 12, 3000.0f), DType::fp8_e5m2);
  const auto bias = random_values(N, 13);
  const float da = 0.0123f, db = 3.5e-4f;
  sim.write("at", at), sim.write("b", b), sim.write("bias", bias);
  sim.write("dequant_a", std::vector<float>{da}), sim.write("dequant_b", std::vector<float>{db});
  sim.run();
  const auto acc = reference(at, b, M, N, K, false);
  const auto got = sim.read("c");
  std::size_t bad = 0;
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      const std::size_t i = static_cast<std::size_t>(m * N + n);
      const float want = acc[i] * da * db + bias[static_cast<std::size_t>(n)];
      bad += std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want);
    }
  EXPECT_EQ(bad, 0u);
  spec.in = DType::bf16;  // BF16 with FP8 is no pair
  EXPECT_THROW(kernel::matmul_kernel(chip, spec), NotSupported);
}

// Current scaling's scale: fp8_max / amax as one FP32 division, 1 for an
// all-zero or infinite tensor; its reciprocal for the dequantization.
TEST(Kernels, Fp8ScaleOfATensor) {
  const auto chip = arch::load_chip("trn3");
  struct Case {
    std::int64_t rows, cols;
    DType fp8;
    float plant;  // written at one position (0: none)
  };
  for (const Case c : {Case{300, 5000, DType::fp8_e4m3, -77.5f}, Case{1, 7, DType::fp8_e5m2, 0.0f},
                       Case{129, 64, DType::fp8_e4m3, INFINITY},
                       Case{2, 8, DType::fp8_e4m3, 2e-37f}}) {  // 448 / amax overflows: clamped
    kernel::Fp8ScaleSpec spec{c.rows, c.cols, DType::bf16, c.fp8};
    sim::Simulator sim(chip);
    sim.load(kernel::fp8_scale_kernel(chip, spec));
    auto x =
        as_dtype(random_values(static_cast<std::size_t>(c.rows * c.cols), 21, 2.0f), DType::bf16);
    if (c.cols <= 8) std::fill(x.begin(), x.end(), 0.0f);  // all zero (but the plant)
    if (c.plant != 0.0f) x[x.size() / 2 + 3] = c.plant;
    sim.write("x", x);
    sim.run();
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const float fmax = static_cast<float>(isa::format_of(c.fp8)->max_finite());
    const float want = amax > 0.0f && std::isfinite(amax)
                           ? std::min(fmax / amax, std::numeric_limits<float>::max())
                           : 1.0f;
    EXPECT_EQ(std::bit_cast<std::uint32_t>(sim.read("scale")[0]),
              std::bit_cast<std::uint32_t>(want))
        << c.rows << "x" << c.cols << ": " << sim.read("scale")[0] << " want " << want;
    EXPECT_EQ(sim.read("inv_scale")[0], 1.0f / want);
  }
  EXPECT_THROW(kernel::fp8_scale_kernel(chip, {4, 4, DType::fp8_e4m3, DType::fp8_e4m3}),
               NotSupported);
  EXPECT_THROW(kernel::fp8_scale_kernel(chip, {4, 4, DType::bf16, DType::bf16}), Error);
}

TEST(Kernels, SameBitsForAnyHostThreadCount) {
  const auto chip = arch::load_chip("trn3");
  for (DType dt : {DType::bf16, DType::fp32}) {
    const isa::Program p = kernel::matmul_kernel(chip, {256, 512, 640, dt, DType::fp32, 1});
    const auto at = as_dtype(random_values(640 * 256, 11), dt),
               b = as_dtype(random_values(640 * 512, 12), dt);
    std::vector<float> first;
    for (int threads : {1, 2, 3, 8}) {
      sim::Simulator sim(chip);
      sim.load(p);
      sim.write("at", at);
      sim.write("b", b);
      sim::Options o;
      o.threads = threads;
      sim.run(o);
      const auto c = sim.read("c");
      if (first.empty()) first = c;
      for (std::size_t i = 0; i < c.size(); ++i)
        ASSERT_EQ(std::bit_cast<std::uint32_t>(c[i]), std::bit_cast<std::uint32_t>(first[i]))
            << threads;
    }
  }
}

TEST(Kernels, AddMatchesHost) {
  const auto chip = arch::load_chip("trn3");
  for (DType dt : {DType::fp32, DType::bf16}) {
    const std::int64_t R = 200, C = 2100;
    const isa::Program p = kernel::add_kernel(chip, R, C, dt);
    sim::Simulator sim(chip);
    sim.load(p);
    const auto a = as_dtype(random_values(R * C, 3), dt), b = as_dtype(random_values(R * C, 4), dt);
    sim.write("a", a);
    sim.write("b", b);
    sim.run();
    const auto got = sim.read("out");
    std::vector<float> want(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) want[i] = a[i] + b[i];
    want = as_dtype(want, dt);  // the FP32 sum, rounded once to the output type
    ASSERT_EQ(got, want) << isa::name(dt);
  }
}

// Super tiles of 512 x 512 dealt over the cores: partial tiles both ways,
// a batch, several cores, FP32.
TEST(Kernels, TransposeIsExact) {
  const auto chip = arch::load_chip("trn3");
  struct Case {
    std::int64_t r, c, batch;
    int cores;
    DType dt;
  };
  for (const Case k : {Case{130, 250, 1, 1, DType::bf16}, Case{700, 1100, 1, 3, DType::bf16},
                       Case{64, 520, 5, 2, DType::fp32}, Case{1, 1, 1, 1, DType::fp16}}) {
    const isa::Program p = kernel::transpose_kernel(chip, k.r, k.c, k.dt, k.batch, k.cores);
    sim::Simulator sim(chip);
    sim.load(p);
    const auto in = as_dtype(random_values(k.batch * k.r * k.c, 5), k.dt);
    sim.write("in", in);
    sim.run();
    const auto got = sim.read("out");
    for (std::int64_t m = 0; m < k.batch; ++m)
      for (std::int64_t r = 0; r < k.r; ++r)
        for (std::int64_t c = 0; c < k.c; ++c)
          ASSERT_EQ(got[(m * k.c + c) * k.r + r], in[(m * k.r + r) * k.c + c])
              << k.r << "x" << k.c << " matrix " << m << " at " << r << "," << c;
  }
}

}  // namespace
}  // namespace tern
