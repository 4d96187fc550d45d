// MX quantization on chip: the bytes of q and q_scale against tern::num's
// host quantizer (Trainium3 policy), in the layout the MX matmul reads.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "arch/chip.h"
#include "common/run_kernel.h"
#include "kernel/kernels.h"
#include "kernel/reference.h"
#include "num/convert.h"
#include "num/mx.h"
#include "util/error.h"

namespace tern {
namespace {

using isa::DType;

// n normal(0, 1) values rounded to BF16 (kept as float).
std::vector<float> bf16_normal(std::mt19937& rng, std::size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = num::round_to(*isa::format_of(DType::bf16), d(rng));
  return v;
}

// Quantizes x on chip and compares q / q_scale byte for byte with
// tern::num::mx_quantize of each column under the same policy.
void check_mx(std::int64_t k, std::int64_t cols, DType elem, int cores,
              num::ScalePolicy policy = num::ScalePolicy::trn3, bool software = false,
              std::vector<float> x = {}, bool trans = false) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  kernel::MxQuantizeSpec s;
  s.k = k, s.cols = cols, s.elem = elem, s.cores = cores, s.policy = policy, s.software = software;
  s.trans = trans;
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 1.0f);
  if (x.empty()) {
    x.resize(static_cast<std::size_t>(k * cols));
    for (std::size_t i = 0; i < x.size(); ++i)  // blocks of very different magnitudes
      x[i] = num::round_to(*isa::format_of(DType::bf16),
                           d(rng) * std::ldexp(1.0f, static_cast<int>((i / 97) % 40) - 20));
  }
  std::vector<float> xt;  // trans: the kernel reads x^T, [cols, K]
  for (std::int64_t c = 0; trans && c < cols; ++c)
    for (std::int64_t i = 0; i < k; ++i) xt.push_back(x[static_cast<std::size_t>(i * cols + c)]);
  auto sim = testing_helpers::run_kernel(chip, kernel::mx_quantize_kernel(chip, s),
                                         {{"x", trans ? &xt : &x}});
  const auto q = sim->read_bytes("q"), qs = sim->read_bytes("q_scale");
  const bool fp4 = elem == DType::fp4_e2m1_x4;
  ASSERT_EQ(q.size(), fp4 ? x.size() / 2 : x.size());
  ASSERT_EQ(qs.size(), x.size() / 32);
  const num::MxFormat& f = num::mx_format(fp4                          ? num::MxId::mxfp4
                                          : elem == DType::fp8_e5m2_x4 ? num::MxId::mxfp8_e5m2
                                                                       : num::MxId::mxfp8_e4m3);
  std::vector<float> col(static_cast<std::size_t>(k));
  std::vector<std::uint8_t> el(col.size()), sc(col.size() / 32);
  std::size_t bad = 0;
  for (std::int64_t c = 0; c < cols; ++c) {
    for (std::int64_t i = 0; i < k; ++i)
      col[static_cast<std::size_t>(i)] = x[static_cast<std::size_t>(i * cols + c)];
    num::mx_quantize(f, policy, col, el, sc);
    for (std::int64_t i = 0; i < k; ++i) {
      // Element (k4, c) of the x4 tensor holds rows 4 k4 .. 4 k4 + 3: MXFP8
      // one byte each, MXFP4 a nibble each (row 4 k4 + j in bits 4j..4j+3).
      const std::size_t e = static_cast<std::size_t>((i / 4) * cols + c);
      const unsigned got = fp4 ? (q[e * 2 + (i % 4) / 2] >> (4 * (i % 2))) & 0xF
                               : q[e * 4 + static_cast<std::size_t>(i % 4)];
      if (got != el[static_cast<std::size_t>(i)] && bad++ < 5)
        ADD_FAILURE() << "element row " << i << " col " << c << " x " << col[i] << ": got " << got
                      << " want " << unsigned{el[static_cast<std::size_t>(i)]};
    }
    for (std::int64_t b = 0; b < k / 32; ++b)
      if (qs[static_cast<std::size_t>(b * cols + c)] != sc[static_cast<std::size_t>(b)] &&
          bad++ < 5)
        ADD_FAILURE() << "scale block " << b << " col " << c << ": got "
                      << unsigned{qs[static_cast<std::size_t>(b * cols + c)]} << " want "
                      << unsigned{sc[static_cast<std::size_t>(b)]};
  }
  EXPECT_EQ(bad, 0u);
}

TEST(MxQuantize, BytesMatchTheHostQuantizer) {
  check_mx(1024, 700, DType::fp8_e4m3_x4, 2);
  check_mx(128, 1, DType::fp8_e5m2_x4, 1);
  check_mx(640, 513, DType::fp8_e4m3_x4, 3);
}

// The transposing load (x given as [cols, K]) gives the same bytes, on the
// QuantizeMX path and the software one, for partial column tiles too.
TEST(MxQuantize, TransposedInputGivesTheSameBytes) {
  using num::ScalePolicy;
  check_mx(1024, 700, DType::fp8_e4m3_x4, 2, ScalePolicy::trn3, false, {}, true);
  check_mx(256, 130, DType::fp8_e5m2_x4, 1, ScalePolicy::trn3, false, {}, true);
  check_mx(640, 300, DType::fp8_e4m3_x4, 3, ScalePolicy::rceil, false, {}, true);
  check_mx(384, 130, DType::fp4_e2m1_x4, 2, ScalePolicy::trn3, false, {}, true);
}

// The software path (no QuantizeMX) gives QuantizeMX's bytes for its own
// policy, and the host's for the others and for MXFP4.
TEST(MxQuantize, SoftwarePathMatchesEveryPolicy) {
  using num::ScalePolicy;
  check_mx(256, 300, DType::fp8_e4m3_x4, 2, ScalePolicy::trn3, true);
  for (ScalePolicy p : {ScalePolicy::ocp_floor, ScalePolicy::rceil}) {
    SCOPED_TRACE(std::string(num::policy_name(p)));
    check_mx(640, 513, DType::fp8_e4m3_x4, 3, p);
    check_mx(128, 40, DType::fp8_e5m2_x4, 1, p);
  }
  for (ScalePolicy p : {ScalePolicy::trn3, ScalePolicy::ocp_floor, ScalePolicy::rceil}) {
    SCOPED_TRACE(std::string(num::policy_name(p)));
    check_mx(384, 130, DType::fp4_e2m1_x4, 2, p);
  }
}

// The edge cases of numerics.md section 3 in one tensor, one block per
// column: zero blocks, NaN and Inf, -0, BF16 subnormals, amax exactly at
// and just past the element maximum's mantissa (the rceil decision),
// the largest BF16 values, E2M1 ties.
TEST(MxQuantize, SoftwarePathEdgeCases) {
  const std::int64_t K = 128, C = 12;
  std::vector<float> x(static_cast<std::size_t>(K * C));
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f,        -0.0f,  inf,      -inf,  std::nanf(""), 1.75f,  1.7578125f,
                            -3.3895e38f, 1e-39f, 0.25f,    0.75f, -1.25f,        2.5f,   5.0f,
                            448.0f,      464.0f, 57344.0f, 6.0f,  1.5f,          -0.375f};
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::int64_t r = static_cast<std::int64_t>(i) / C, c = static_cast<std::int64_t>(i) % C;
    float v = d(rng);
    switch (c) {
      case 0:
        v = 0.0f;
        break;  // all-zero blocks
      case 1:
        v = r % 32 == 5 ? std::nanf("") : v;
        break;
      case 2:
        v = r % 32 == 7 ? -inf : v;
        break;
      case 3:
        v = v * 1e-39f;
        break;  // subnormal amax
      case 4:
        v = r % 32 == 0 ? 1.75f * 256 : v;
        break;  // amax mantissa = E4M3's
      case 5:
        v = r % 32 == 0 ? 1.7578125f * 256 : v;
        break;  // just above it
      case 6:
        v = v * 1e38f;
        break;  // near the BF16 maximum
      default:
        v = specials[(i * 7 + r) % 20] * std::ldexp(1.0f, static_cast<int>(c) - 8);
        break;
    }
    x[i] = num::round_to(*isa::format_of(DType::bf16), v);
  }
  using num::ScalePolicy;
  for (DType e : {DType::fp8_e4m3_x4, DType::fp8_e5m2_x4, DType::fp4_e2m1_x4})
    for (ScalePolicy p : {ScalePolicy::trn3, ScalePolicy::ocp_floor, ScalePolicy::rceil}) {
      SCOPED_TRACE(fmt::format("{} {}", isa::name(e), num::policy_name(p)));
      check_mx(K, C, e, 1, p, true, x);
    }
}

TEST(MxQuantize, RejectsWhatItDoesNotSupport) {
  kernel::MxQuantizeSpec s;
  s.k = 100;
  EXPECT_THROW(kernel::mx_quantize_kernel(arch::load_chip("trn3"), s), Error);
  s.k = 128;
  EXPECT_THROW(kernel::mx_quantize_kernel(arch::load_chip("trn2"), s), NotSupported);
  s.elem = DType::bf16;
  EXPECT_THROW(kernel::mx_quantize_kernel(arch::load_chip("trn3"), s), NotSupported);
}

// The MX matmul on operands quantized beforehand by mx_quantize_kernel gives
// the bits of the MX matmul that quantizes its BF16 inputs on chip.
TEST(MxQuantize, PrequantizedMatmulEqualsOnChipQuantization) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  const std::int64_t M = 200, N = 300, K = 384;
  std::mt19937 rng(13);
  auto bf16 = [&](std::size_t n) { return bf16_normal(rng, n); };
  const std::vector<float> at = bf16(static_cast<std::size_t>(K * M)),
                           bm = bf16(static_cast<std::size_t>(K * N));
  auto quantize = [&](const std::vector<float>& x, std::int64_t cols) {
    kernel::MxQuantizeSpec q;
    q.k = K, q.cols = cols, q.cores = 2;
    auto s = testing_helpers::run_kernel(chip, kernel::mx_quantize_kernel(chip, q), {{"x", &x}});
    return std::make_pair(s->read_bytes("q"), s->read_bytes("q_scale"));
  };
  const auto [aq, as] = quantize(at, M);
  const auto [bq, bs] = quantize(bm, N);
  kernel::MatmulSpec ms;
  ms.m = M, ms.n = N, ms.k = K, ms.in = DType::fp8_e4m3_x4, ms.cores = 2;
  ms.epilogue = kernel::parse_epilogue("gelu");
  const auto direct =
      testing_helpers::run_kernel(chip, kernel::matmul_kernel(chip, ms), {{"at", &at}, {"b", &bm}})
          ->read("c");
  ms.mx_prequantized = true;
  sim::Simulator s(chip);
  s.load(kernel::matmul_kernel(chip, ms));
  s.write_bytes("at_q", aq);
  s.write_bytes("at_scale", as);
  s.write_bytes("b_q", bq);
  s.write_bytes("b_scale", bs);
  s.run();
  EXPECT_EQ(testing_helpers::mismatches(s.read("c"), direct, "c"), 0u);
  ms.in = DType::bf16;
  EXPECT_THROW(kernel::matmul_kernel(chip, ms), Error);
}

// MXFP4: operands quantized on the host (tern::num, Trainium3 policy),
// packed as the x4 layout (element (k4, c): codes of rows 4 k4 + j in bits
// 4j .. 4j + 3), multiplied on chip; the result equals the FP32 product of
// the dequantized operands summed in contraction order.
TEST(MxQuantize, Mxfp4MatmulOnHostQuantizedOperands) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  const std::int64_t M = 130, N = 200, K = 256;
  std::mt19937 rng(17);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const num::MxFormat& f = num::mx_format(num::MxId::mxfp4);
  // Quantizes each column of a row-major [K, C] matrix; returns the packed
  // x4 bytes, the scales and the dequantized values.
  struct Q {
    std::vector<std::uint8_t> q, s;
    std::vector<float> deq;
  };
  auto quantize = [&](std::int64_t C) {
    Q r;
    r.q.assign(static_cast<std::size_t>(K / 4 * C * 2), 0);
    r.s.resize(static_cast<std::size_t>(K / 32 * C));
    r.deq.resize(static_cast<std::size_t>(K * C));
    std::vector<float> col(static_cast<std::size_t>(K)), dq(col.size());
    std::vector<std::uint8_t> el(col.size()), sc(col.size() / 32);
    for (std::int64_t c = 0; c < C; ++c) {
      for (float& x : col) x = d(rng);
      num::mx_quantize(f, num::ScalePolicy::trn3, col, el, sc);
      num::mx_dequantize(f, el, sc, dq);
      for (std::int64_t k = 0; k < K; ++k) {
        const std::size_t at = static_cast<std::size_t>(((k / 4) * C + c) * 2 + (k % 4) / 2);
        r.q[at] =
            static_cast<std::uint8_t>(r.q[at] | (el[static_cast<std::size_t>(k)] << (4 * (k % 2))));
        r.deq[static_cast<std::size_t>(k * C + c)] = dq[static_cast<std::size_t>(k)];
      }
      for (std::int64_t b = 0; b < K / 32; ++b)
        r.s[static_cast<std::size_t>(b * C + c)] = sc[static_cast<std::size_t>(b)];
    }
    return r;
  };
  const Q a = quantize(M), b = quantize(N);
  kernel::MatmulSpec ms;
  ms.m = M, ms.n = N, ms.k = K, ms.in = DType::fp4_e2m1_x4, ms.mx_prequantized = true, ms.cores = 2;
  sim::Simulator s(chip);
  s.load(kernel::matmul_kernel(chip, ms));
  s.write_bytes("at_q", a.q);
  s.write_bytes("at_scale", a.s);
  s.write_bytes("b_q", b.q);
  s.write_bytes("b_scale", b.s);
  s.run();
  const auto want = kernel::matmul_reference(a.deq, b.deq, M, N, K, false);
  EXPECT_EQ(testing_helpers::mismatches(s.read("c"), want, "c"), 0u);
  ms.mx_prequantized = false;
  EXPECT_THROW(kernel::matmul_kernel(chip, ms), NotSupported);
}

// MX dequantization on chip (identity MX matmuls) gives tern::num's
// dequantized values bit for bit (MXFP8 E4M3 / E5M2 and MXFP4, quantized on
// the host), but for the sign of zero.
TEST(MxDequantize, EqualsHostDequantization) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  std::mt19937 rng(19);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (const auto& [K, C, elem] :
       {std::tuple<std::int64_t, std::int64_t, DType>{640, 700, DType::fp8_e4m3_x4},
        {128, 1, DType::fp8_e5m2_x4},
        {512, 130, DType::fp4_e2m1_x4}}) {
    const num::MxFormat& f = num::mx_format(elem == DType::fp8_e4m3_x4   ? num::MxId::mxfp8_e4m3
                                            : elem == DType::fp8_e5m2_x4 ? num::MxId::mxfp8_e5m2
                                                                         : num::MxId::mxfp4);
    const int per = elem == DType::fp4_e2m1_x4 ? 2 : 4;  // bytes per x4 element
    std::vector<std::uint8_t> q(static_cast<std::size_t>(K / 4 * C * per), 0),
        s(static_cast<std::size_t>(K / 32 * C));
    std::vector<float> want(static_cast<std::size_t>(K * C)), col(static_cast<std::size_t>(K)),
        dq(col.size());
    std::vector<std::uint8_t> el(col.size()), sc(col.size() / 32);
    for (std::int64_t c = 0; c < C; ++c) {
      for (std::size_t i = 0; i < col.size(); ++i)
        col[i] = d(rng) * std::ldexp(1.0f, static_cast<int>(i / 32 % 9) - 4);
      num::mx_quantize(f, num::ScalePolicy::trn3, col, el, sc);
      num::mx_dequantize(f, el, sc, dq);
      for (std::int64_t k = 0; k < K; ++k) {
        want[static_cast<std::size_t>(k * C + c)] = dq[static_cast<std::size_t>(k)];
        const std::size_t e = static_cast<std::size_t>(((k / 4) * C + c) * per);
        if (per == 4)
          q[e + static_cast<std::size_t>(k % 4)] = el[static_cast<std::size_t>(k)];
        else
          q[e + static_cast<std::size_t>(k % 4 / 2)] |=
              static_cast<std::uint8_t>(el[static_cast<std::size_t>(k)] << (4 * (k % 2)));
      }
      for (std::int64_t blk = 0; blk < K / 32; ++blk)
        s[static_cast<std::size_t>(blk * C + c)] = sc[static_cast<std::size_t>(blk)];
    }
    kernel::MxDequantizeSpec ds;
    ds.k = K, ds.cols = C, ds.elem = elem, ds.out = DType::fp32, ds.cores = 2;
    sim::Simulator sim(chip);
    sim.load(kernel::mx_dequantize_kernel(chip, ds));
    sim.write_bytes("q", q);
    sim.write_bytes("q_scale", s);
    sim.run();
    // The matmul sums into a zeroed accumulator, so a -0 element comes back
    // as +0 (documented); every other value bit for bit.
    for (float& w : want)
      if (w == 0.0f) w = 0.0f;
    EXPECT_EQ(testing_helpers::mismatches(sim.read("x"), want, "x"), 0u) << isa::name(elem);
  }
  kernel::MxDequantizeSpec bad;
  bad.k = 100;
  EXPECT_THROW(kernel::mx_dequantize_kernel(chip, bad), Error);
  bad.k = 128;
  EXPECT_THROW(kernel::mx_dequantize_kernel(arch::load_chip("trn2"), bad), NotSupported);
}

// The matmul epilogue's mxfp8 step: c_q / c_scale are C (rounded to BF16)
// MX-quantized in blocks of 32 along N for every row, in
// mx_quantize_kernel's layout of C^T; c itself is unchanged.
TEST(MxQuantize, MatmulMxfp8EpilogueQuantizesTheOutputAlongN) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  for (const auto& [in, out, n] :
       {std::tuple<DType, DType, std::int64_t>{DType::bf16, DType::fp32, 640},
        {DType::bf16, DType::bf16, 128},
        {DType::fp8_e4m3_x4, DType::bf16, 512}}) {
    kernel::MatmulSpec ms;
    ms.m = 200, ms.n = n, ms.k = 256, ms.in = in, ms.out = out, ms.cores = 2;
    const bool mx_in = in == DType::fp8_e4m3_x4;  // the step alone, after an MX matmul
    ms.epilogue = kernel::parse_epilogue(mx_in ? "mxfp8" : "bias,gelu,mxfp8");
    std::mt19937 rng(23);
    auto values = [&](std::size_t count) { return bf16_normal(rng, count); };
    const auto at = values(static_cast<std::size_t>(ms.k * ms.m)),
               b = values(static_cast<std::size_t>(ms.k * ms.n)),
               bias = values(static_cast<std::size_t>(ms.n));
    std::vector<std::pair<std::string, const std::vector<float>*>> ins{{"at", &at}, {"b", &b}};
    if (!mx_in) ins.emplace_back("bias", &bias);
    auto sim = testing_helpers::run_kernel(chip, kernel::matmul_kernel(chip, ms), ins);
    std::vector<float> c = sim->read("c");
    num::round_array(*isa::format_of(DType::bf16), c);
    const auto q = sim->read_bytes("c_q"), s = sim->read_bytes("c_scale");
    const num::MxFormat& f = num::mx_format(num::MxId::mxfp8_e4m3);
    std::vector<std::uint8_t> el(static_cast<std::size_t>(n)), sc(static_cast<std::size_t>(n / 32));
    std::size_t bad = 0;
    for (std::int64_t m = 0; m < ms.m; ++m) {
      num::mx_quantize(f, num::ScalePolicy::trn3,
                       std::span<const float>(c.data() + m * n, static_cast<std::size_t>(n)), el,
                       sc);
      for (std::int64_t k = 0; k < n; ++k)
        bad += q[static_cast<std::size_t>(((k / 4) * ms.m + m) * 4 + k % 4)] !=
               el[static_cast<std::size_t>(k)];
      for (std::int64_t blk = 0; blk < n / 32; ++blk)
        bad += s[static_cast<std::size_t>(blk * ms.m + m)] != sc[static_cast<std::size_t>(blk)];
    }
    EXPECT_EQ(bad, 0u) << isa::name(in) << " -> " << isa::name(out) << ", N = " << n;
  }
  kernel::MatmulSpec bad;
  bad.n = 100;
  bad.epilogue = kernel::parse_epilogue("mxfp8");
  EXPECT_THROW(kernel::matmul_kernel(chip, bad), NotSupported);
  bad.n = 128;
  EXPECT_THROW(kernel::matmul_kernel(arch::load_chip("trn2"), bad), NotSupported);
}

// The norms' mxfp8 output: y_q / y_scale are y (rounded to BF16)
// MX-quantized along D for every row, in the matmul epilogue's layout.
TEST(MxQuantize, NormMxfp8OutputQuantizesYAlongD) {
  const arch::ChipSpec chip = arch::load_chip("trn3");
  for (const bool layer : {false, true}) {
    kernel::RmsNormSpec ns;
    ns.rows = 200, ns.dim = 640, ns.dtype = DType::bf16, ns.mxfp8 = true, ns.cores = 2;
    std::mt19937 rng(29);
    auto values = [&](std::size_t count) { return bf16_normal(rng, count); };
    const auto x = values(static_cast<std::size_t>(ns.rows * ns.dim)),
               g = values(static_cast<std::size_t>(ns.dim)),
               be = values(static_cast<std::size_t>(ns.dim));
    std::vector<std::pair<std::string, const std::vector<float>*>> ins{{"x", &x}, {"gamma", &g}};
    if (layer) ins.emplace_back("beta", &be);
    auto sim = testing_helpers::run_kernel(
        chip, layer ? kernel::layernorm_kernel(chip, ns) : kernel::rmsnorm_kernel(chip, ns), ins);
    const std::vector<float> y = sim->read("y");  // bf16 values
    const auto q = sim->read_bytes("y_q"), s = sim->read_bytes("y_scale");
    const num::MxFormat& f = num::mx_format(num::MxId::mxfp8_e4m3);
    const std::int64_t D = ns.dim, R = ns.rows;
    std::vector<std::uint8_t> el(static_cast<std::size_t>(D)), sc(static_cast<std::size_t>(D / 32));
    std::size_t bad = 0;
    for (std::int64_t r = 0; r < R; ++r) {
      num::mx_quantize(f, num::ScalePolicy::trn3,
                       std::span<const float>(y.data() + r * D, static_cast<std::size_t>(D)), el,
                       sc);
      for (std::int64_t k = 0; k < D; ++k)
        bad += q[static_cast<std::size_t>(((k / 4) * R + r) * 4 + k % 4)] !=
               el[static_cast<std::size_t>(k)];
      for (std::int64_t blk = 0; blk < D / 32; ++blk)
        bad += s[static_cast<std::size_t>(blk * R + r)] != sc[static_cast<std::size_t>(blk)];
    }
    EXPECT_EQ(bad, 0u) << (layer ? "layernorm" : "rmsnorm");
  }
}

}  // namespace
}  // namespace tern
