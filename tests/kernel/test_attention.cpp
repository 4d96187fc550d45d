// Flash attention forward / backward and RoPE: against the FP64 definition
// (attention, with bf16 / fp16 tolerances) and bit for bit (RoPE); odd
// sequence lengths, GQA, causal and not, several cores; bad shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "arch/chip.h"
#include "common/run_kernel.h"
#include "kernel/kernels.h"
#include "kernel/reference.h"
#include "num/convert.h"
#include "sim/simulator.h"
#include "util/error.h"

namespace tern {
namespace {

using isa::DType;
using kernel::AttentionSpec;

std::vector<float> normal(std::size_t n, std::uint32_t seed, float sd, DType dt) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = num::round_to(*isa::format_of(dt), d(rng));
  return v;
}

// Largest |got - want| / (atol + rtol |want|); <= 1 passes.
double worst(const std::vector<float>& got, const std::vector<double>& want, double atol,
             double rtol, const char* what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  double w = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double e = std::fabs(got[i] - want[i]) / (atol + rtol * std::fabs(want[i]));
    if (!(e <= w)) w = e, at = i;  // NaN counts as worst
  }
  if (w > 1)
    ADD_FAILURE() << what << "[" << at << "] = " << got[at] << ", want " << want[at] << " (error "
                  << w << " x tolerance)";
  return w;
}

struct Case {
  std::int64_t batch, hq, hkv, sq, sk, d;
  bool causal;
  int cores;
  DType dt = DType::bf16;
  const char* chip = "trn3";
};

AttentionSpec spec_of(const Case& c) {
  AttentionSpec s;
  s.batch = c.batch, s.q_heads = c.hq, s.kv_heads = c.hkv, s.seq_q = c.sq, s.seq_k = c.sk,
  s.head_dim = c.d, s.causal = c.causal, s.cores = c.cores, s.dtype = c.dt;
  return s;
}

// Tolerances (atol, rtol) against FP64: bf16 inputs / outputs carry 8
// significand bits (relative rounding 2^-9 = 0.2 %); P, dS and the scaled Q
// are rounded to the dtype once each before the matmuls, and the outputs once.
// Errors measured on these shapes are ~3x below the bounds (bf16) and the fp16
// bounds are 4x tighter (11 significand bits).
double atol_of(DType dt) {
  return dt == DType::bf16 ? 2e-2 : 5e-3;
}

// Random q, k, v and dO of a case (seeded; rounded to its dtype).
struct Inputs {
  std::vector<float> q, k, v, dout;
};
Inputs inputs_of(const Case& c, std::int64_t Sk) {
  return {normal(static_cast<std::size_t>(c.batch * c.hq * c.d * c.sq), 1, 1.0f, c.dt),
          normal(static_cast<std::size_t>(c.batch * c.hkv * c.d * Sk), 2, 1.0f, c.dt),
          normal(static_cast<std::size_t>(c.batch * c.hkv * Sk * c.d), 3, 1.0f, c.dt),
          normal(static_cast<std::size_t>(c.batch * c.hq * c.sq * c.d), 4, 1.0f, c.dt)};
}

class Attention : public ::testing::TestWithParam<Case> {};

TEST_P(Attention, ForwardAndBackwardCloseToFp64) {
  const Case c = GetParam();
  const auto chip = arch::load_chip(c.chip);
  const AttentionSpec s = spec_of(c);
  const std::int64_t Sk = s.kv_len();
  const auto [q, k, v, dout] = inputs_of(c, Sk);
  const double atol = atol_of(c.dt), rtol = atol;

  sim::Simulator fwd(chip);
  fwd.load(kernel::flash_attention_kernel(chip, s));
  fwd.write("q", q);
  fwd.write("k", k);
  fwd.write("v", v);
  fwd.run();
  const auto o = fwd.read("o");
  const auto lse = fwd.read("lse");
  const auto want = kernel::attention_reference_f64(q, k, v, s);
  worst(o, want.o, atol, rtol, "o");
  // lse: the scores use Q * scale rounded to the dtype (2^-9 relative for
  // bf16, unless the scale is a power of two), so lse is off by about
  // 2^-9 |s| for scores s of a few units.
  worst(lse, want.lse, atol / 2, 1e-3, "lse");

  sim::Simulator bwd(chip);
  bwd.load(kernel::flash_attention_backward_kernel(chip, s));
  bwd.write("q", q);
  bwd.write("k", k);
  bwd.write("v", v);
  bwd.write("o", o);
  bwd.write("do", dout);
  bwd.write("lse", lse);
  bwd.run();
  const auto g = kernel::attention_backward_reference_f64(q, k, v, dout, s);
  // Gradients sum over up to Sq (dk, dv) or Sk (dq) terms: the absolute
  // tolerance grows with the square root of the terms (rounding errors
  // accumulate like a random walk).
  const double grow = std::sqrt(static_cast<double>(std::max(c.sq * (c.hq / c.hkv), Sk)) / 64.0);
  worst(bwd.read("dq"), g.dq, atol * std::max(1.0, grow), rtol, "dq");
  worst(bwd.read("dk"), g.dk, atol * std::max(1.0, grow), rtol, "dk");
  worst(bwd.read("dv"), g.dv, atol * std::max(1.0, grow), rtol, "dv");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Attention,
    ::testing::Values(Case{1, 1, 1, 1, 0, 64, true, 1},       // one query, one key
                      Case{1, 2, 2, 77, 0, 64, false, 1},     // partial tile
                      Case{1, 2, 1, 200, 0, 128, true, 2},    // GQA 2:1, causal, 2 cores
                      Case{1, 4, 1, 257, 0, 64, true, 3},     // GQA 4:1, 3 partial tiles
                      Case{2, 4, 2, 130, 0, 128, false, 2},   // batch 2, GQA 2:1
                      Case{1, 1, 1, 600, 0, 128, true, 1},    // two key blocks, causal
                      Case{1, 2, 2, 100, 700, 64, false, 2},  // seq_k != seq_q
                      Case{1, 1, 1, 300, 129, 64, true, 1},   // seq_q > seq_k, causal
                      Case{1, 2, 1, 150, 0, 64, true, 1, DType::fp16},
                      Case{1, 2, 2, 140, 0, 64, true, 2, DType::bf16, "trn2"}));

// FP32 (the P and dS transposes on the Tensor engine, exact; the matmuls in
// FP32 at a quarter of the BF16 rate; the softmax statistics in FP32): within
// about FP32 rounding of FP64. Every value is held to atol + rtol |want| with
// rtol = 1e-5 and atol = 1e-5 times the output's RMS (0.02 to 1.1 here; with
// one key dq and dk are exactly 0, the kernel's the rounding noise of
// dP - Dsum, ~1e-7: there the RMS counts as 0.05). Measured: the worst
// element of each output within 0.6x of its bound, typically 0.2x to 0.4x
// (lse within 0.02x).
double rms(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return s > 0 ? std::sqrt(s / static_cast<double>(x.size())) : 0.05;
}

class AttentionFp32 : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionFp32, ForwardAndBackwardWithin1e5OfFp64) {
  const Case c = GetParam();
  ASSERT_EQ(c.dt, DType::fp32);
  const auto chip = arch::load_chip(c.chip);
  const AttentionSpec s = spec_of(c);
  const std::int64_t Sk = s.kv_len();
  const auto [q, k, v, dout] = inputs_of(c, Sk);
  constexpr double kRel = 1e-5;

  sim::Simulator fwd(chip);
  fwd.load(kernel::flash_attention_kernel(chip, s));
  fwd.write("q", q), fwd.write("k", k), fwd.write("v", v);
  fwd.run();
  const auto o = fwd.read("o");
  const auto lse = fwd.read("lse");
  const auto want = kernel::attention_reference_f64(q, k, v, s);
  const double eo = worst(o, want.o, kRel * rms(want.o), kRel, "o");
  // lse (a few units): scale * K rounded to FP32 moves a score by 2^-24 |s|.
  const double el = worst(lse, want.lse, kRel, kRel, "lse");

  sim::Simulator bwd(chip);
  bwd.load(kernel::flash_attention_backward_kernel(chip, s));
  bwd.write("q", q), bwd.write("k", k), bwd.write("v", v), bwd.write("o", o);
  bwd.write("do", dout), bwd.write("lse", lse);
  bwd.run();
  const auto g = kernel::attention_backward_reference_f64(q, k, v, dout, s);
  const double eq = worst(bwd.read("dq"), g.dq, kRel * rms(g.dq), kRel, "dq");
  const double ek = worst(bwd.read("dk"), g.dk, kRel * rms(g.dk), kRel, "dk");
  const double ev = worst(bwd.read("dv"), g.dv, kRel * rms(g.dv), kRel, "dv");
  RecordProperty("worst_o_lse_dq_dk_dv",
                 fmt::format("{:.3f} {:.3f} {:.3f} {:.3f} {:.3f}", eo, el, eq, ek, ev));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionFp32,
    ::testing::Values(Case{1, 1, 1, 1, 0, 64, true, 1, DType::fp32},      // one query, one key
                      Case{1, 2, 2, 77, 0, 64, false, 1, DType::fp32},    // partial tile
                      Case{1, 2, 1, 200, 0, 128, true, 2, DType::fp32},   // GQA 2:1, causal
                      Case{2, 4, 2, 130, 0, 128, false, 2, DType::fp32},  // batch 2, GQA 2:1
                      Case{1, 1, 1, 1100, 0, 64, true, 1, DType::fp32},   // two forward steps
                      Case{1, 1, 1, 1100, 0, 128, false, 2, DType::fp32},
                      Case{1, 2, 2, 100, 700, 64, false, 2, DType::fp32},  // seq_k != seq_q
                      Case{1, 1, 1, 300, 129, 128, true, 1, DType::fp32},  // seq_q > seq_k
                      Case{1, 2, 2, 140, 0, 64, true, 2, DType::fp32, "trn2"}));

// The backward writing the gradient of a fused qkv projection [B, S, W]
// (AttentionSpec::qkv_width) gives the bits of dq, dk, dv, transposed and
// placed in their columns: the transposes (DMA; fp32: Tensor engine) move
// the values unchanged.
void expect_qkv_gradient_bits(const Case& c) {
  const auto chip = arch::load_chip(c.chip);
  const AttentionSpec s = spec_of(c);
  const std::int64_t B = c.batch, Hq = c.hq, Hkv = c.hkv, S = c.sq, D = c.d;
  const auto q = normal(static_cast<std::size_t>(B * Hq * D * S), 1, 1.0f, c.dt);
  const auto k = normal(static_cast<std::size_t>(B * Hkv * D * S), 2, 1.0f, c.dt);
  const auto v = normal(static_cast<std::size_t>(B * Hkv * S * D), 3, 1.0f, c.dt);
  const auto dout = normal(static_cast<std::size_t>(B * Hq * S * D), 4, 1.0f, c.dt);
  sim::Simulator fwd(chip);
  fwd.load(kernel::flash_attention_kernel(chip, s));
  fwd.write("q", q), fwd.write("k", k), fwd.write("v", v);
  fwd.run();
  auto run = [&](const AttentionSpec& bs, sim::Simulator& bwd) {
    bwd.load(kernel::flash_attention_backward_kernel(chip, bs));
    bwd.write("q", q), bwd.write("k", k), bwd.write("v", v), bwd.write("o", fwd.read("o"));
    bwd.write("do", dout), bwd.write("lse", fwd.read("lse"));
    bwd.run();
  };
  sim::Simulator plain(chip), merged(chip);
  run(s, plain);
  AttentionSpec m = s;
  // Columns: an unwritten gap of 64 first, then v, q, k (any order works).
  m.v_col = 64, m.q_col = m.v_col + Hkv * D, m.k_col = m.q_col + Hq * D;
  m.qkv_width = m.k_col + Hkv * D;
  run(m, merged);
  const auto dq = plain.read("dq"), dk = plain.read("dk"), dv = plain.read("dv");
  const auto g = merged.read("dqkv");
  ASSERT_EQ(g.size(), static_cast<std::size_t>(B * S * m.qkv_width));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < S; ++t)
      for (std::int64_t d = 0; d < D; ++d) {
        const auto row = static_cast<std::size_t>((b * S + t) * m.qkv_width + d);
        for (std::int64_t h = 0; h < Hq; ++h)
          ASSERT_EQ(g[row + static_cast<std::size_t>(m.q_col + h * D)],
                    dq[static_cast<std::size_t>(((b * Hq + h) * D + d) * S + t)])
              << "dq b " << b << " h " << h << " s " << t << " d " << d;
        for (std::int64_t h = 0; h < Hkv; ++h) {
          ASSERT_EQ(g[row + static_cast<std::size_t>(m.k_col + h * D)],
                    dk[static_cast<std::size_t>(((b * Hkv + h) * D + d) * S + t)])
              << "dk b " << b << " h " << h << " s " << t << " d " << d;
          ASSERT_EQ(g[row + static_cast<std::size_t>(m.v_col + h * D)],
                    dv[static_cast<std::size_t>(((b * Hkv + h) * S + t) * D + d)])
              << "dv b " << b << " h " << h << " s " << t << " d " << d;
        }
      }
}

TEST(Attention, BackwardIntoQkvGradientHasTheSameBits) {
  for (const Case& c : {Case{2, 4, 2, 130, 0, 64, true, 2}, Case{1, 2, 2, 300, 0, 128, false, 3}})
    expect_qkv_gradient_bits(c);
  const auto chip = arch::load_chip("trn3");
  // Columns that do not fit, and the option on the forward kernel.
  AttentionSpec s = spec_of(Case{1, 2, 2, 128, 0, 64, true, 1});
  s.qkv_width = 3 * 128, s.q_col = 0, s.k_col = 128, s.v_col = 300;
  EXPECT_THROW(kernel::flash_attention_backward_kernel(chip, s), Error);
  EXPECT_THROW(kernel::flash_attention_kernel(chip, s), Error);
}

// o and dO in the merged-heads layout [B, S, width] (o_width, do_width):
// the forward writes o's bits there, and the backward reading o and dO
// from there gives the bits it gives from [B, H, S, D].
void expect_merged_o_do_bits(const Case& c) {
  const auto chip = arch::load_chip(c.chip);
  const std::int64_t B = c.batch, H = c.hq, S = c.sq, D = c.d, W = H * D + 64;
  const AttentionSpec s = spec_of(c);
  AttentionSpec w = s;
  w.o_width = W, w.do_width = W;
  const auto q = normal(static_cast<std::size_t>(B * H * D * S), 1, 1.0f, c.dt);
  const auto k = normal(static_cast<std::size_t>(B * c.hkv * D * S), 2, 1.0f, c.dt);
  const auto v = normal(static_cast<std::size_t>(B * c.hkv * S * D), 3, 1.0f, c.dt);
  const auto dout = normal(static_cast<std::size_t>(B * H * S * D), 4, 1.0f, c.dt);
  // [B, H, S, D] <-> [B, S, W] (columns past H D hold 0 on the way in).
  auto wide = [&](const std::vector<float>& x) {
    std::vector<float> y(static_cast<std::size_t>(B * S * W), 0.0f);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t t = 0; t < S; ++t)
          for (std::int64_t d = 0; d < D; ++d)
            y[static_cast<std::size_t>((b * S + t) * W + h * D + d)] =
                x[static_cast<std::size_t>(((b * H + h) * S + t) * D + d)];
    return y;
  };
  sim::Simulator f0(chip), f1(chip);
  for (auto [sim, sp] : {std::pair{&f0, &s}, {&f1, &w}}) {
    sim->load(kernel::flash_attention_kernel(chip, *sp));
    sim->write("q", q), sim->write("k", k), sim->write("v", v);
    sim->run();
  }
  const auto o = f0.read("o"), ow = f1.read("o");
  const auto want = wide(o);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < S; ++t)
      for (std::int64_t j = 0; j < H * D; ++j) {
        const auto i = static_cast<std::size_t>((b * S + t) * W + j);
        ASSERT_EQ(ow[i], want[i]) << "o at b " << b << " s " << t << " column " << j;
      }
  EXPECT_EQ(f0.read("lse"), f1.read("lse"));
  sim::Simulator b0(chip), b1(chip);
  b0.load(kernel::flash_attention_backward_kernel(chip, s));
  b1.load(kernel::flash_attention_backward_kernel(chip, w));
  for (auto* sim : {&b0, &b1}) sim->write("q", q), sim->write("k", k), sim->write("v", v);
  b0.write("o", o), b0.write("do", dout), b0.write("lse", f0.read("lse"));
  b1.write("o", ow), b1.write("do", wide(dout)), b1.write("lse", f1.read("lse"));
  b0.run(), b1.run();
  for (const char* g : {"dq", "dk", "dv"}) EXPECT_EQ(b0.read(g), b1.read(g)) << g;
}

TEST(Attention, MergedHeadLayoutsOfOAndDoHaveTheSameBits) {
  const Case c{2, 4, 2, 200, 0, 64, true, 3};
  expect_merged_o_do_bits(c);
  const auto chip = arch::load_chip("trn3");
  const std::int64_t H = c.hq, D = c.d;
  AttentionSpec bad = spec_of(c);
  bad.o_width = H * D - 1;
  EXPECT_THROW(kernel::flash_attention_kernel(chip, bad), Error);
}

TEST(Attention, Fp32MergedLayoutsHaveTheSameBits) {
  expect_qkv_gradient_bits(Case{2, 4, 2, 130, 0, 64, true, 2, DType::fp32});
  expect_qkv_gradient_bits(Case{1, 2, 2, 300, 0, 128, false, 3, DType::fp32});
  expect_merged_o_do_bits(Case{2, 4, 2, 200, 0, 64, true, 3, DType::fp32});
}

TEST(Attention, BadShapesNameTheParameter) {
  const auto chip = arch::load_chip("trn3");
  auto msg = [&](AttentionSpec s) -> std::string {
    try {
      kernel::flash_attention_kernel(chip, s);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  AttentionSpec s;
  s.seq_q = 256;
  s.head_dim = 96;
  EXPECT_NE(msg(s).find("not supported: flash_attention with head_dim 96"), std::string::npos)
      << msg(s);
  s.head_dim = 128;
  s.q_heads = 6, s.kv_heads = 4;
  EXPECT_NE(msg(s).find("q_heads (6) must be a multiple of kv_heads (4)"), std::string::npos)
      << msg(s);
  s.q_heads = 8, s.kv_heads = 8, s.seq_q = 0;
  EXPECT_NE(msg(s).find("seq_q must be >= 1"), std::string::npos) << msg(s);
  s.seq_q = 128, s.dtype = DType::fp8_e4m3;
  EXPECT_NE(msg(s).find("not supported: flash_attention with float8_e4m3fn (bf16, fp16 and fp32 "
                        "are)"),
            std::string::npos)
      << msg(s);
  s.dtype = DType::bf16, s.cores = 9;
  EXPECT_NE(msg(s).find("cores must be in 1..8"), std::string::npos) << msg(s);
  s.cores = 1, s.head_dim = 96;
  EXPECT_THROW(kernel::flash_attention_backward_kernel(chip, s), NotSupported);
}

struct RopeCase {
  std::int64_t batch, heads, seq, d;
  DType dt;
  bool backward;
  int cores;
};
class Rope : public ::testing::TestWithParam<RopeCase> {};

TEST_P(Rope, BitExactAgainstHostReferenceAndInverse) {
  const RopeCase c = GetParam();
  const auto chip = arch::load_chip("trn3");
  kernel::RopeSpec s;
  s.batch = c.batch, s.heads = c.heads, s.seq = c.seq, s.head_dim = c.d, s.dtype = c.dt,
  s.backward = c.backward, s.cores = c.cores;
  const auto x = normal(static_cast<std::size_t>(c.batch * c.heads * c.seq * c.d), 5, 1.0f, c.dt);
  std::vector<float> cs, sn;
  for (std::int64_t p = 0; p < c.seq; ++p)
    for (std::int64_t j = 0; j < c.d / 2; ++j) {
      const double theta = p * std::pow(10000.0, -2.0 * j / c.d);
      cs.push_back(static_cast<float>(std::cos(theta)));
      sn.push_back(static_cast<float>(std::sin(theta)));
    }
  auto run = [&](const kernel::RopeSpec& sp, const std::vector<float>& in) {
    sim::Simulator sim(chip);
    sim.load(kernel::rope_kernel(chip, sp));
    sim.write("x", in);
    sim.write("cos", cs);
    sim.write("sin", sn);
    sim.run();
    return sim.read("y");
  };
  const auto y = run(s, x);
  auto round = +[](float v) { return v; };
  if (c.dt == DType::bf16)
    round = +[](float v) { return num::round_to(*isa::format_of(DType::bf16), v); };
  EXPECT_EQ(testing_helpers::mismatches(y, kernel::rope_reference(x, cs, sn, s, round), "y"), 0u);
  // The backward undoes the forward (up to the dtype's rounding).
  kernel::RopeSpec inv = s;
  inv.backward = !s.backward;
  const auto back = run(inv, y);
  const double tol = c.dt == DType::fp32 ? 1e-5 : 2e-2;
  for (std::size_t i = 0; i < x.size(); ++i)
    ASSERT_NEAR(back[i], x[i], tol * (1 + std::fabs(x[i]))) << i;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Rope,
                         ::testing::Values(RopeCase{1, 2, 200, 64, DType::bf16, false, 1},
                                           RopeCase{2, 3, 77, 128, DType::fp32, true, 2},
                                           RopeCase{1, 20, 130, 128, DType::bf16, false, 3},
                                           RopeCase{1, 1, 1, 2, DType::fp32, false, 1}));

TEST(Rope, BadShapes) {
  const auto chip = arch::load_chip("trn3");
  kernel::RopeSpec s;
  s.head_dim = 63;
  EXPECT_THROW(kernel::rope_kernel(chip, s), Error);
  s.head_dim = 64, s.seq = 0;
  EXPECT_THROW(kernel::rope_kernel(chip, s), Error);
}

}  // namespace
}  // namespace tern
