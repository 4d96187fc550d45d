// The Vector/GpSimd/DMA instructions beyond the basics, each against a
// host computation: exact where the operation is exact in FP32, otherwise
// within a stated tolerance of a double-precision reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "arch/chip.h"
#include "kernel/builder.h"
#include "num/convert.h"
#include "sim/simulator.h"
#include "util/error.h"

namespace tern {
namespace {

using isa::DType;
using kernel::Builder;
using kernel::Tensor;

struct Rig {
  arch::ChipSpec chip = arch::load_chip("trn3");
  Builder b{chip};
  Tensor in, out;
  std::vector<float> x;

  // An fp32 input [p, f] of normal values loaded into an SBUF tile.
  Tensor input(int p, int f, float scale = 1.0f, std::uint32_t seed = 1) {
    in = b.hbm("in", {p, f}, DType::fp32, isa::TensorKind::input);
    Tensor t = b.sbuf(p, f, DType::fp32);
    b.dma_copy(t, in);
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, scale);
    x.resize(static_cast<std::size_t>(p) * f);
    for (float& v : x) v = d(rng);
    return t;
  }
  // Stores an SBUF tile [p, f] to the output and runs; returns the output.
  std::vector<float> run(const Tensor& t) {
    out = b.hbm("out", {t.rows(), t.cols()}, t.dtype(), isa::TensorKind::output);
    b.dma_copy(out, t);
    sim::Simulator s(chip);
    s.load(b.finish());
    s.write("in", x);
    s.run();
    return s.read("out");
  }
};

TEST(Ops, ReciprocalIsExactFp32Division) {
  Rig r;
  const Tensor t = r.input(128, 64);
  const Tensor o = r.b.sbuf(128, 64, DType::fp32);
  r.b.reciprocal(o, t);
  const auto y = r.run(o);
  for (std::size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], 1.0f / r.x[i]);
}

// tensor_scalar with per-partition columns: row r uses column[r]; exact
// FP32 (x - c0[r]) * c1[r] on GpSimd, and a column with an immediate.
TEST(Ops, TensorScalarWithPerPartitionColumns) {
  Rig r;
  const Tensor t = r.input(100, 40);
  const Tensor c0 = r.b.sbuf(100, 1, DType::fp32), c1 = r.b.sbuf(100, 1, DType::fp32);
  r.b.iota(c0, 0.5f, 1.0f, 0.0f);    // c0[p] = 0.5 + p
  r.b.iota(c1, 2.0f, -0.25f, 0.0f);  // c1[p] = 2 - p / 4
  const Tensor o = r.b.sbuf(100, 40, DType::fp32), o2 = r.b.sbuf(100, 40, DType::fp32);
  r.b.tensor_scalar(o, t, isa::AluOp::subtract, c0, isa::AluOp::multiply, 0.0f, &c1,
                    isa::Engine::gpsimd);
  r.b.tensor_scalar(o2, o, isa::AluOp::multiply, c1, isa::AluOp::add, 1.5f);
  const auto y = r.run(o2);
  for (std::size_t p = 0; p < 100; ++p)
    for (std::size_t i = 0; i < 40; ++i) {
      const float a = 0.5f + static_cast<float>(p), m = 2.0f - 0.25f * static_cast<float>(p);
      const float want = ((r.x[p * 40 + i] - a) * m) * m + 1.5f;
      ASSERT_EQ(y[p * 40 + i], want) << p << "," << i;
    }
}

// scalar_tensor_tensor: (data op0 s) op1 b in FP32, rounded once into the
// destination (two instructions would round the intermediate too).
TEST(Ops, ScalarTensorTensorRoundsOnce) {
  Rig r;
  const Tensor t = r.input(96, 48);
  const Tensor c = r.b.sbuf(96, 1, DType::fp32), u = r.b.sbuf(96, 48, DType::fp32);
  r.b.iota(c, 0.25f, 0.5f, 0.0f);   // c[p] = 0.25 + p / 2
  r.b.iota(u, 1.5f, 0.0f, 0.125f);  // u[p, i] = 1.5 + i / 8
  const Tensor o = r.b.sbuf(96, 48, DType::bf16), o2 = r.b.sbuf(96, 48, DType::fp32);
  r.b.scalar_tensor_tensor(o, t, isa::AluOp::subtract, 0.0f, &c, isa::AluOp::multiply, u);
  // Reversed: u - (3 / data), the immediate form, on GpSimd.
  r.b.scalar_tensor_tensor(o2, t, isa::AluOp::divide, 3.0f, nullptr, isa::AluOp::subtract, u, true,
                           true, isa::Engine::gpsimd);
  const Tensor both = r.b.sbuf(96, 96, DType::fp32);
  r.b.tensor_copy(both.tile(0, 96, 0, 48), o);
  r.b.tensor_copy(both.tile(0, 96, 48, 48), o2);
  const auto y = r.run(both);
  const auto& bf = num::format(num::FormatId::bf16);
  for (std::size_t p = 0; p < 96; ++p)
    for (std::size_t i = 0; i < 48; ++i) {
      const float x = r.x[p * 48 + i], cp = 0.25f + 0.5f * static_cast<float>(p);
      const float ui = 1.5f + 0.125f * static_cast<float>(i);
      ASSERT_EQ(y[p * 96 + i], num::round_to(bf, (x - cp) * ui)) << p << "," << i;
      ASSERT_EQ(y[p * 96 + 48 + i], ui - 3.0f / x) << p << "," << i;
    }
}

TEST(Ops, BnStatsAndAggrGiveMeanAndVariance) {
  Rig r;
  const int P = 128, F = 1000;  // two bn_stats chunks of 500
  const Tensor t = r.input(P, F, 3.0f);
  const Tensor stats = r.b.sbuf(P, 12, DType::fp32);
  r.b.bn_stats(stats.tile(0, P, 0, 6), t.tile(0, P, 0, 500));
  r.b.bn_stats(stats.tile(0, P, 6, 6), t.tile(0, P, 500, 500));
  const Tensor mv = r.b.sbuf(P, 2, DType::fp32);
  r.b.bn_aggr(mv, stats);
  const auto y = r.run(mv);
  for (int p = 0; p < P; ++p) {
    double mean = 0, var = 0;
    for (int i = 0; i < F; ++i) mean += r.x[p * F + i];
    mean /= F;
    for (int i = 0; i < F; ++i) var += (r.x[p * F + i] - mean) * (r.x[p * F + i] - mean);
    var /= F;
    EXPECT_NEAR(y[p * 2], mean, 1e-5 * 3);
    EXPECT_NEAR(y[p * 2 + 1], var, 1e-5 * var);
  }
}

TEST(Ops, SelectAndPredicatedCopy) {
  Rig r;
  const Tensor t = r.input(64, 32);
  const Tensor pred = r.b.sbuf(64, 32, DType::fp32);
  r.b.tensor_scalar(pred, t, isa::AluOp::is_gt, 0.0f);  // pred = x > 0
  const Tensor neg = r.b.sbuf(64, 32, DType::fp32);
  r.b.tensor_scalar(neg, t, isa::AluOp::multiply, -1.0f);
  const Tensor sel = r.b.sbuf(64, 32, DType::fp32);
  r.b.select(sel, pred, t, neg);  // |x|
  const Tensor acc = r.b.sbuf(64, 32, DType::fp32);
  r.b.memset(acc, 7.0f);
  r.b.copy_predicated(acc, pred, t);  // x where x > 0, else 7
  const Tensor both = r.b.sbuf(64, 64, DType::fp32);
  r.b.tensor_copy(both.tile(0, 64, 0, 32), sel);
  r.b.tensor_copy(both.tile(0, 64, 32, 32), acc);
  const auto y = r.run(both);
  for (int p = 0; p < 64; ++p)
    for (int i = 0; i < 32; ++i) {
      const float v = r.x[p * 32 + i];
      ASSERT_EQ(y[p * 64 + i], std::fabs(v));
      ASSERT_EQ(y[p * 64 + 32 + i], v > 0 ? v : 7.0f);
    }
}

TEST(Ops, ExponentialWithMaxSubtractAndRowSums) {
  Rig r;
  const int P = 128, F = 256;
  const Tensor t = r.input(P, F, 2.0f);
  const Tensor mx = r.b.sbuf(P, 1, DType::fp32);
  r.b.tensor_reduce(mx, t, isa::AluOp::max);
  const Tensor e = r.b.sbuf(P, F + 1, DType::fp32);
  const Tensor ev = e.tile(0, P, 0, F), sums = e.tile(0, P, F, 1);
  r.b.exponential(ev, t, &mx, &sums);
  const auto y = r.run(e);
  for (int p = 0; p < P; ++p) {
    double m = -1e30, s = 0;
    for (int i = 0; i < F; ++i) m = std::max<double>(m, r.x[p * F + i]);
    for (int i = 0; i < F; ++i) {
      const double want = std::exp(r.x[p * F + i] - m);
      s += want;
      ASSERT_NEAR(y[p * (F + 1) + i], want, 2e-7 * std::max(1.0, want));
    }
    EXPECT_NEAR(y[p * (F + 1) + F], s, 1e-5 * s);
  }
}

TEST(Ops, AffineSelectMakesACausalMask) {
  Rig r;
  const Tensor t = r.input(128, 128);
  const Tensor o = r.b.sbuf(128, 128, DType::fp32);
  // keep where p - i >= 0, else -inf
  r.b.affine_select(o, t, 0.0f, 1.0f, -1.0f, isa::AluOp::is_ge, -INFINITY);
  const auto y = r.run(o);
  for (int p = 0; p < 128; ++p)
    for (int i = 0; i < 128; ++i) ASSERT_EQ(y[p * 128 + i], i <= p ? r.x[p * 128 + i] : -INFINITY);
}

TEST(Ops, PartitionReduce) {
  Rig r;
  const Tensor t = r.input(128, 40);
  const Tensor o = r.b.sbuf(1, 80, DType::fp32);
  r.b.partition_reduce(o.tile(0, 1, 0, 40), t, isa::AluOp::max);
  r.b.partition_reduce(o.tile(0, 1, 40, 40), t, isa::AluOp::add);
  const auto y = r.run(o);
  for (int i = 0; i < 40; ++i) {
    float m = r.x[i];
    double s = 0;
    for (int p = 0; p < 128; ++p) {
      m = std::max(m, r.x[p * 40 + i]);
      s += r.x[p * 40 + i];
    }
    EXPECT_EQ(y[i], m);
    EXPECT_NEAR(y[40 + i], s, 1e-4);
  }
}

TEST(Ops, TransposesOnVectorAndDma) {
  Rig r;
  const Tensor t = r.input(32, 32);
  const Tensor v = r.b.sbuf(32, 32, DType::fp32);
  r.b.vector_transpose(v, t);
  const Tensor h = r.b.sbuf(32, 32, DType::bf16);
  r.b.tensor_copy(h, t);
  const Tensor d = r.b.sbuf(32, 32, DType::bf16);
  r.b.dma_transpose(d, h);
  const Tensor both = r.b.sbuf(32, 64, DType::fp32);
  r.b.tensor_copy(both.tile(0, 32, 0, 32), v);
  r.b.tensor_copy(both.tile(0, 32, 32, 32), d);
  const auto y = r.run(both);
  for (int p = 0; p < 32; ++p)
    for (int i = 0; i < 32; ++i) {
      ASSERT_EQ(y[p * 64 + i], r.x[i * 32 + p]);
      const float bf = num::round_to(num::format(num::FormatId::bf16), r.x[i * 32 + p]);
      ASSERT_EQ(y[p * 64 + 32 + i], bf);
    }
}

TEST(Ops, IntegerOpsAreExactOnGpSimdAndVector) {
  const auto chip = arch::load_chip("trn3");
  Builder b(chip);
  const Tensor in = b.hbm("in", {128, 4}, DType::int32, isa::TensorKind::input);
  const Tensor out = b.hbm("out", {128, 6}, DType::int32, isa::TensorKind::output);
  const Tensor u = b.hbm("u8", {128, 1}, DType::uint8, isa::TensorKind::output);
  const Tensor t = b.sbuf(128, 4, DType::int32);
  b.dma_copy(t, in);
  const Tensor o = b.sbuf(128, 6, DType::int32);
  const Tensor a = t.tile(0, 128, 0, 1), c = t.tile(0, 128, 1, 1);
  b.tensor_tensor(o.tile(0, 128, 0, 1), a, c, isa::AluOp::bitwise_xor, isa::Engine::gpsimd);
  b.tensor_tensor(o.tile(0, 128, 1, 1), a, c, isa::AluOp::add, isa::Engine::gpsimd);
  b.tensor_scalar(o.tile(0, 128, 2, 1), a, isa::AluOp::shift_right, 3.0f);
  b.tensor_scalar(o.tile(0, 128, 3, 1), a, isa::AluOp::bitwise_and, 255.0f, isa::AluOp::shift_left,
                  4.0f);
  b.tensor_tensor(o.tile(0, 128, 4, 1), a, c, isa::AluOp::max, isa::Engine::vector);
  b.tensor_copy(o.tile(0, 128, 5, 1), c, isa::Engine::gpsimd);
  b.dma_copy(out, o);
  const Tensor w = b.sbuf(128, 1, DType::uint8);
  b.tensor_scalar(w, a, isa::AluOp::add, 1.0f);  // wraps into the 8-bit destination
  b.dma_copy(u, w);
  sim::Simulator s(chip);
  s.load(b.finish());
  std::vector<std::uint8_t> bytes(128 * 4 * 4);
  std::vector<std::int32_t> x(128 * 4);
  for (int p = 0; p < 128; ++p) {
    x[p * 4] =
        static_cast<std::int32_t>(0x7654321u * static_cast<std::uint32_t>(p + 1) -
                                  (p % 2 ? 0x40000000u : 0u));  // beyond FP32's exact integers
    x[p * 4 + 1] = 123457 * p - 999;
  }
  std::memcpy(bytes.data(), x.data(), bytes.size());
  s.write_bytes("in", bytes);
  s.run();
  const auto raw = s.read_bytes("out");
  std::vector<std::int32_t> y(128 * 6);
  std::memcpy(y.data(), raw.data(), raw.size());
  const auto u8 = s.read_bytes("u8");
  for (int p = 0; p < 128; ++p) {
    const std::int32_t va = x[p * 4], vc = x[p * 4 + 1];
    EXPECT_EQ(y[p * 6 + 0], va ^ vc);
    EXPECT_EQ(y[p * 6 + 1], static_cast<std::int32_t>(static_cast<std::uint32_t>(va) +
                                                      static_cast<std::uint32_t>(vc)));
    // Logical, as NKI's right_shift (the engines shift the 32-bit value).
    EXPECT_EQ(y[p * 6 + 2], static_cast<std::int32_t>(static_cast<std::uint32_t>(va) >> 3));
    EXPECT_EQ(y[p * 6 + 3],
              static_cast<std::int32_t>((static_cast<std::uint32_t>(va) & 255u) << 4));
    EXPECT_EQ(y[p * 6 + 4], std::max(va, vc));
    EXPECT_EQ(y[p * 6 + 5], vc);
    EXPECT_EQ(u8[p], static_cast<std::uint8_t>(static_cast<std::uint32_t>(va) + 1u));
  }
  // Bitwise ops on floats are refused.
  Builder f(chip);
  const Tensor ft = f.sbuf(128, 4, DType::fp32);
  f.memset(ft, 1.0f);
  f.tensor_scalar(ft, ft, isa::AluOp::bitwise_and, 1.0f);
  sim::Simulator s2(chip);
  try {
    s2.load(f.finish());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bitwise_and takes integer tensors, got float32"),
              std::string::npos);
  }
}

TEST(Ops, PermutedAccessPatternsAreNotMistakenForBlocks) {
  // A free pattern that visits a contiguous range out of order ([c][j] over
  // a [4][c] layout) must not take the block-copy fast paths.
  const auto chip = arch::load_chip("trn3");
  Builder b(chip);
  const Tensor in = b.hbm("in", {4, 64}, DType::bf16, isa::TensorKind::input);
  const Tensor out = b.hbm("out", {1, 512}, DType::fp32, isa::TensorKind::output);
  const Tensor same = b.sbuf(1, 256, DType::bf16), cast = b.sbuf(1, 256, DType::fp32);
  Tensor perm = in;  // one row: element (c, j) = in[j][c]
  perm.ap.dims = {{256, 1}, {1, 64}, {64, 4}};
  perm.ap.partitions = 1;
  b.dma_copy(same, perm);  // same type: bytes
  b.dma_copy(cast, perm);  // with a cast: decode
  const Tensor both = b.sbuf(1, 512, DType::fp32);
  b.tensor_copy(both.tile(0, 1, 0, 256), same);
  b.tensor_copy(both.tile(0, 1, 256, 256), cast);
  b.dma_copy(out, both);
  sim::Simulator s(chip);
  s.load(b.finish());
  std::vector<float> x(256);
  for (int i = 0; i < 256; ++i) x[i] = static_cast<float>(i);
  s.write("in", x);
  s.run();
  const auto y = s.read("out");
  for (int c = 0; c < 64; ++c)
    for (int j = 0; j < 4; ++j) {
      ASSERT_EQ(y[c * 4 + j], x[j * 64 + c]);
      ASSERT_EQ(y[256 + c * 4 + j], x[j * 64 + c]);
    }
}

TEST(Ops, RulesOfTheNewInstructions) {
  const auto chip = arch::load_chip("trn3");
  Builder b(chip);
  const Tensor big = b.sbuf(64, 64, DType::fp32);
  const Tensor o = b.sbuf(64, 64, DType::fp32);
  b.memset(big, 1.0f);
  b.vector_transpose(o, big);
  sim::Simulator s(chip);
  try {
    s.load(b.finish());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("the Vector engine transposes at most 32 x 32, got [64, 64]"),
        std::string::npos)
        << e.what();
  }
  // scalar_tensor_tensor: arithmetic operators, data and b not both in PSUM.
  auto stt_error = [&](bool psum, isa::AluOp op) {
    Builder k(chip);
    const Tensor x = psum ? k.psum(64, 64, DType::fp32) : k.sbuf(64, 64, DType::fp32);
    const Tensor y = psum ? k.psum(64, 64, DType::fp32) : k.sbuf(64, 64, DType::fp32);
    const Tensor z = k.sbuf(64, 64, DType::fp32);
    k.scalar_tensor_tensor(z, x, isa::AluOp::add, 1.0f, nullptr, op, y);
    sim::Simulator sk(chip);
    try {
      sk.load(k.finish());
      return std::string();
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  EXPECT_NE(stt_error(true, isa::AluOp::add).find("cannot read both data and b from PSUM"),
            std::string::npos);
  EXPECT_NE(stt_error(false, isa::AluOp::bitwise_and).find("two arithmetic operators"),
            std::string::npos);
  const auto trn2 = arch::load_chip("trn2");
  Builder c(trn2);
  const Tensor a = c.sbuf(128, 8, DType::fp32);
  c.memset(a, 0.0f);
  c.exponential(a, a);
  sim::Simulator s2(trn2);
  EXPECT_THROW(s2.load(c.finish()), Error);
}

}  // namespace
}  // namespace tern
