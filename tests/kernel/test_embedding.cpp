// Indirect DMA (dma_gather / dma_scatter) and the embedding kernels: bits
// against the host references (odd shapes, duplicate ids, the table's first
// and last rows), out-of-range ids, oob=skip, the rules checker, the text and
// binary forms, and the DMA time of one indirect transfer.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "arch/chip.h"
#include "common/run_kernel.h"
#include "common/sim_helpers.h"
#include "isa/program.h"
#include "kernel/builder.h"
#include "kernel/kernels.h"
#include "kernel/reference.h"
#include "num/convert.h"
#include "sim/simulator.h"
#include "util/error.h"

namespace tern {
namespace {

using isa::DType;
using isa::Engine;
using isa::Opcode;
using testing_helpers::mismatches;
using testing_helpers::run_kernel;

const arch::ChipSpec& chip(const char* name) {
  static const arch::ChipSpec c1 = arch::load_chip("trn1"), c2 = arch::load_chip("trn2"),
                              c3 = arch::load_chip("trn3");
  const std::string n = name;
  return n == "trn1" ? c1 : n == "trn2" ? c2 : c3;
}

// Normal values rounded to `dt` (what the HBM tensor holds).
std::vector<float> values(std::size_t n, std::uint32_t seed, DType dt) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  if (dt != DType::fp32) num::round_array(*isa::format_of(dt), v);
  return v;
}

// Ids in [0, V): random, the first token at row 0, the last at V - 1, and
// (with `repeats`) runs of one id inside the first 128-token tile, so that
// duplicates occur within one indirect transfer as well as across them.
std::vector<float> token_ids(std::int64_t T, std::int64_t V, std::uint32_t seed, bool repeats) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int64_t> d(0, V - 1);
  std::vector<float> v(static_cast<std::size_t>(T));
  for (float& x : v) x = static_cast<float>(d(rng));
  if (repeats)
    for (std::int64_t t = 1; t < std::min<std::int64_t>(T, 40); ++t) v[t] = v[1];
  v.front() = 0.0f;
  v.back() = static_cast<float>(V - 1);
  return v;
}

struct Case {
  std::int64_t tokens, vocab, dim;
  DType dt;
  int cores;
  const char* chip;
};

kernel::EmbeddingSpec spec_of(const Case& c) {
  kernel::EmbeddingSpec s;
  s.tokens = c.tokens, s.vocab = c.vocab, s.dim = c.dim, s.dtype = c.dt, s.cores = c.cores;
  return s;
}

class EmbeddingForward : public ::testing::TestWithParam<Case> {};

TEST_P(EmbeddingForward, BitExact) {
  const Case c = GetParam();
  const auto& ch = chip(c.chip);
  const auto ids = token_ids(c.tokens, c.vocab, 1, true);
  const auto table = values(static_cast<std::size_t>(c.vocab * c.dim), 2, c.dt);
  auto s =
      run_kernel(ch, kernel::embedding_kernel(ch, spec_of(c)), {{"ids", &ids}, {"table", &table}});
  EXPECT_EQ(mismatches(s->read("out"),
                       kernel::embedding_reference(ids, table, c.tokens, c.vocab, c.dim), "out"),
            0u);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, EmbeddingForward,
    ::testing::Values(Case{1, 1, 1, DType::fp32, 1, "trn3"},
                      Case{300, 1000, 200, DType::bf16, 2, "trn3"},
                      // Rows wider than 8 KiB move in column chunks (4100 fp32 = 3 chunks).
                      Case{129, 37, 4100, DType::fp32, 3, "trn2"},
                      Case{77, 5, 33, DType::fp16, 1, "trn1"},
                      // More cores than tiles.
                      Case{200, 64, 16, DType::bf16, 8, "trn3"}));

class EmbeddingBackward : public ::testing::TestWithParam<Case> {};

TEST_P(EmbeddingBackward, BitExact) {
  const Case c = GetParam();
  const auto& ch = chip(c.chip);
  const auto ids = token_ids(c.tokens, c.vocab, 3, true);
  const auto dout = values(static_cast<std::size_t>(c.tokens * c.dim), 4, c.dt);
  auto s = run_kernel(ch, kernel::embedding_backward_kernel(ch, spec_of(c)),
                      {{"ids", &ids}, {"dout", &dout}});
  EXPECT_EQ(mismatches(s->read("dtable"),
                       kernel::embedding_backward_reference(ids, dout, c.tokens, c.vocab, c.dim),
                       "dtable"),
            0u);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, EmbeddingBackward,
    ::testing::Values(Case{1, 1, 1, DType::fp32, 1, "trn3"},
                      // Many duplicates: 300 tokens into 7 rows, a partial last tile.
                      Case{300, 7, 96, DType::bf16, 2, "trn3"},
                      // Several [P, 16] groups plus leftovers; D split over 3 cores.
                      Case{2500, 300, 200, DType::fp32, 3, "trn3"},
                      // Wide rows: column chunks of 2048 FP32 per core.
                      Case{130, 50, 2100, DType::fp16, 1, "trn2"},
                      // More cores than 64-column slices: 2 of 8 cores work.
                      Case{257, 1000, 100, DType::bf16, 8, "trn3"},
                      // D below one core's slice: one of two cores works.
                      Case{150, 20, 40, DType::fp32, 2, "trn1"}));

// The order of the additions is what the test pins: summing the duplicates
// in reverse token order gives different bits for this case, so a scatter
// that added rows out of order would fail BitExact.
TEST(EmbeddingBackwardOrder, ReverseOrderDiffers) {
  const std::int64_t T = 600, V = 3, D = 8;
  const auto ids = token_ids(T, V, 5, false);
  const auto dout = values(static_cast<std::size_t>(T * D), 6, DType::fp32);
  const auto fwd = kernel::embedding_backward_reference(ids, dout, T, V, D);
  std::vector<float> rids(ids.rbegin(), ids.rend()), rdout(dout.size());
  for (std::int64_t t = 0; t < T; ++t)
    std::copy_n(dout.begin() + (T - 1 - t) * D, D, rdout.begin() + t * D);
  const auto rev = kernel::embedding_backward_reference(rids, rdout, T, V, D);
  EXPECT_NE(fwd, rev);
}

// An id outside [0, V): the run stops naming the instruction and the id.
TEST(EmbeddingErrors, OutOfRangeId) {
  const auto& ch = chip("trn3");
  kernel::EmbeddingSpec s;
  s.tokens = 130, s.vocab = 10, s.dim = 4, s.dtype = DType::fp32;
  auto ids = token_ids(s.tokens, s.vocab, 7, false);
  ids[129] = 10.0f;  // the second tile's first partition
  const auto table = values(40, 8, DType::fp32);
  try {
    run_kernel(ch, kernel::embedding_kernel(ch, s), {{"ids", &ids}, {"table", &table}});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("(dma_gather)"), std::string::npos) << m;
    EXPECT_NE(m.find("index 10 at [1, 0]"), std::string::npos) << m;
    EXPECT_NE(m.find("rows [0, 10)"), std::string::npos) << m;
  }
  ids[129] = -1.0f;
  const auto dout = values(static_cast<std::size_t>(s.tokens * s.dim), 9, DType::fp32);
  try {
    run_kernel(ch, kernel::embedding_backward_kernel(ch, s), {{"ids", &ids}, {"dout", &dout}});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("(dma_scatter)"), std::string::npos) << m;
    EXPECT_NE(m.find("index -1"), std::string::npos) << m;
  }
}

TEST(EmbeddingErrors, BadSpec) {
  kernel::EmbeddingSpec s;
  s.vocab = 0;
  EXPECT_THROW(kernel::embedding_kernel(chip("trn3"), s), Error);
  s.vocab = 10;
  s.dtype = DType::fp8_e4m3;
  EXPECT_THROW(kernel::embedding_backward_kernel(chip("trn3"), s), NotSupported);
}

// A raw gather with two index columns (K = 2) and oob=skip: slot k of
// partition p is row idx[p, k]; a skipped slot keeps what it held.
TEST(IndirectDma, GatherSlotsAndSkip) {
  const auto& ch = chip("trn3");
  kernel::Builder b(ch);
  const auto table = b.hbm("table", {5, 3}, DType::bf16, isa::TensorKind::input);
  const auto idxh = b.hbm("idx", {4, 2}, DType::int32, isa::TensorKind::input);
  const auto out = b.hbm("out", {4, 6}, DType::fp32, isa::TensorKind::output);
  const auto ix = b.sbuf(4, 2, DType::int32);
  const auto dst = b.sbuf(4, 6, DType::bf16);
  const auto o = b.sbuf(4, 6, DType::fp32);
  b.dma_copy(ix, idxh);
  b.memset(dst, -7.0f);
  b.dma_gather(dst, table, ix, -1, /*oob_skip=*/true);
  b.tensor_copy(o, dst);
  b.dma_copy(out, o);
  const std::vector<float> tv = {0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32, 40, 41, 42};
  const std::vector<float> iv = {4, 0, 1, 1, 5, 2, -1, 3};  // 5 and -1 are skipped
  auto s = run_kernel(ch, b.finish(), {{"table", &tv}, {"idx", &iv}});
  const std::vector<float> want = {40, 41, 42, 0,  1,  2,  10, 11, 12, 10, 11, 12,
                                   -7, -7, -7, 20, 21, 22, -7, -7, -7, 30, 31, 32};
  EXPECT_EQ(mismatches(s->read("out"), want, "out"), 0u);
}

// A raw scatter-add with duplicates inside one transfer: FP32 additions in
// the index tile's element order (partition by partition, slot by slot),
// onto the existing rows.
TEST(IndirectDma, ScatterAccumulateOrder) {
  const auto& ch = chip("trn3");
  kernel::Builder b(ch);
  const auto dst = b.hbm("dst", {3, 1}, DType::fp32, isa::TensorKind::output);
  const auto srch = b.hbm("src", {2, 2}, DType::fp32, isa::TensorKind::input);
  const auto idxh = b.hbm("idx", {2, 2}, DType::uint32, isa::TensorKind::input);
  const auto init = b.sbuf(3, 1, DType::fp32);
  const auto src = b.sbuf(2, 2, DType::fp32);
  const auto ix = b.sbuf(2, 2, DType::uint32);
  b.memset(init, 1.0f);
  b.dma_copy(dst, init);
  b.dma_copy(src, srch);
  b.dma_copy(ix, idxh);
  b.dma_scatter(dst, src, ix, -1, /*accumulate=*/true);
  // Row 0 (initially 1) gets, in order: partition 0's slots 0 and 1 (1e8,
  // then -1e8), then partition 1's slot 0 (1): ((1 + 1e8) - 1e8) + 1 = 1 in
  // FP32 (the first 1 vanishes into 1e8); slot-major order would give
  // ((1 + 1e8) + 1) - 1e8 = 0, and either order reversed 0. Row 2 gets 5.
  const std::vector<float> sv = {1e8f, -1e8f, 1.0f, 5.0f};
  const std::vector<float> iv = {0, 0, 0, 2};
  auto s = run_kernel(ch, b.finish(), {{"src", &sv}, {"idx", &iv}});
  const std::vector<float> want = {1.0f, 1.0f, 6.0f};
  EXPECT_EQ(mismatches(s->read("dst"), want, "dst"), 0u);
}

// The builder orders scatters into one view and the loads that follow them.
TEST(IndirectDma, BuilderWaitsOnScatters) {
  const auto& ch = chip("trn3");
  kernel::Builder b(ch);
  const auto dst = b.hbm("dst", {8, 4}, DType::fp32, isa::TensorKind::output);
  const auto ix = b.sbuf(2, 1, DType::int32);
  const auto src = b.sbuf(2, 4, DType::fp32);
  const auto back = b.sbuf(8, 4, DType::fp32);
  b.memset(ix, 3.0f);
  b.memset(src, 1.0f);
  b.dma_scatter(dst, src, ix, 5);
  b.dma_scatter(dst, src, ix, 6);
  b.dma_copy(back, dst, 7);
  const isa::Program p = b.finish();
  const auto& sync = p.cores[0].streams[static_cast<int>(Engine::sync)];
  ASSERT_EQ(sync.size(), 3u);
  auto waits_on = [](const isa::Instruction& in, int sem) {
    return std::any_of(in.waits.begin(), in.waits.end(),
                       [&](const isa::SemWait& w) { return w.sem == sem; });
  };
  EXPECT_TRUE(waits_on(sync[0], static_cast<int>(Engine::vector)));  // reads the memsets
  EXPECT_TRUE(waits_on(sync[1], 4 + 5));                             // WAW on dst
  EXPECT_TRUE(waits_on(sync[2], 4 + 6));                             // RAW on dst
}

isa::Program indirect_program(const arch::ChipSpec& ch) {
  isa::Program p = testing_helpers::program(ch);
  auto g = testing_helpers::ins(Engine::gpsimd, Opcode::dma_gather,
                                {testing_helpers::sbuf(0, 128, 0, 64, DType::bf16),
                                 testing_helpers::hbm(0, 1000, 32, DType::bf16),
                                 testing_helpers::sbuf(0, 128, 1024, 2, DType::int32)});
  g.oob_skip = true;
  g.queue = 3;
  g.signals = {7};
  g.loc = "emb.py:3";
  auto sc = testing_helpers::ins(Engine::sync, Opcode::dma_scatter,
                                 {testing_helpers::hbm(65536, 1000, 16, DType::fp32),
                                  testing_helpers::sbuf(0, 64, 2048, 16, DType::fp32),
                                  testing_helpers::sbuf(64, 64, 1024, 1, DType::uint32)});
  sc.accumulate = true;
  sc.priority = 2;
  sc.waits = {{7, 1, -1}};
  testing_helpers::add(p, g);
  testing_helpers::add(p, sc);
  return p;
}

TEST(IndirectDma, TextAndBinaryRoundTrip) {
  const isa::Program p = indirect_program(chip("trn3"));
  const std::string text = isa::to_text(p);
  EXPECT_NE(text.find("gpsimd dma_gather (sbuf[0:128]+0 [[1,64]] bfloat16) (hbm+0 "
                      "[[32,1000],[1,32]] bfloat16) (sbuf[0:128]+1024 [[1,2]] int32) oob=skip "
                      "queue=3 signal=7 @emb.py:3"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("sync dma_scatter"), std::string::npos);
  EXPECT_NE(text.find("acc=1 priority=2 wait=7>=1"), std::string::npos) << text;
  EXPECT_EQ(isa::parse_program_text(text), p);
  EXPECT_EQ(isa::to_text(isa::parse_program_text(text)), text);
  const auto bin = isa::to_binary(p);
  EXPECT_EQ(isa::parse_program_binary(bin), p);
  // Both checks pass (the program is valid).
  sim::Simulator s(chip("trn3"));
  EXPECT_NO_THROW(s.load(p));
}

// Version-1 files (before indirect DMA) still load; other versions do not.
TEST(IndirectDma, ReadsVersionOne) {
  isa::Program p = testing_helpers::program(chip("trn3"));
  testing_helpers::add(p, testing_helpers::ins(Engine::vector, Opcode::memset,
                                               {testing_helpers::sbuf(0, 128, 0, 8)}));
  auto bin = isa::to_binary(p);
  bin[8] = 1;  // the version is outside the checksummed payload
  EXPECT_EQ(isa::parse_program_binary(bin), p);
  std::string text = isa::to_text(p);
  text.replace(text.find("tern-program 4"), 14, "tern-program 1");
  EXPECT_EQ(isa::parse_program_text(text), p);
  bin[8] = 5;
  EXPECT_THROW(isa::parse_program_binary(bin), Error);
  EXPECT_THROW(isa::parse_instruction("sync dma_gather oob=maybe"), Error);
}

void expect_rule(const isa::Program& p, const std::string& needle) {
  sim::Simulator s(chip("trn3"));
  try {
    s.load(p);
    ADD_FAILURE() << "no error; wanted: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("instruction #"), std::string::npos) << e.what();
  }
}

TEST(IndirectDma, Rules) {
  const auto& ch = chip("trn3");
  auto with = [&](auto edit) {
    isa::Program p = indirect_program(ch);
    edit(p.cores[0].streams[static_cast<int>(Engine::gpsimd)][0]);
    return p;
  };
  expect_rule(with([](isa::Instruction& in) { in.operands[2].dtype = DType::fp32; }),
              "the index tile must be int32 or uint32, got float32");
  expect_rule(with([](isa::Instruction& in) {
                in.operands[2] = testing_helpers::hbm(0, 128, 2, DType::int32);
              }),
              "the index tile must be in SBUF, not hbm");
  expect_rule(with([](isa::Instruction& in) { in.operands[2].partitions = 64; }),
              "the index tile has 64 partitions");
  expect_rule(with([](isa::Instruction& in) {
                in.operands[2].dims = {{1, 3}};
              }),
              "3 indices per partition x 32-element HBM rows need 96");
  expect_rule(with([](isa::Instruction& in) {
                in.operands[1] = testing_helpers::sbuf(0, 128, 4096, 32, DType::bf16);
              }),
              "the source of an indirect DMA must be an HBM [rows, F] view, not sbuf");
  expect_rule(with([](isa::Instruction& in) {
                in.operands[0] = testing_helpers::psum(0, 128, 0, 64, DType::bf16);
              }),
              "DMA cannot access PSUM");
  expect_rule(with([](isa::Instruction& in) { in.accumulate = true; }),
              "oob=skip cannot accumulate");
  expect_rule(with([](isa::Instruction& in) { in.engine = Engine::tensor; }),
              "dma_gather cannot run on the tensor engine");
  expect_rule(with([](isa::Instruction& in) { in.queue = 16; }), "DMA queue 16 does not exist");
  expect_rule(with([](isa::Instruction& in) {
                in.operands[1] = testing_helpers::hbm(0, 1u << 22, 32, DType::bf16);
              }),
              "outside every declared tensor");
  expect_rule(with([](isa::Instruction& in) { in.operands.pop_back(); }),
              "takes 3 operands, got 2");
  expect_rule(with([](isa::Instruction& in) {
                in.op = Opcode::dma_copy;
                in.operands.pop_back();
              }),
              "oob=skip applies to dma_gather and dma_scatter only");
}

// One gather of 128 rows x 512 bf16 (1 KiB) on trn3: the descriptors are
// generated first (descriptor_gen), then 8 rows on each of the 16 DMA
// engines at (per-row overhead + row bytes) / engine bandwidth, then the
// fixed completion latency. HBM (4.9 TB/s) is not the bottleneck.
TEST(IndirectDma, GatherTime) {
  const auto& ch = chip("trn3");
  isa::Program p = testing_helpers::program(ch);
  testing_helpers::add(
      p, testing_helpers::ins(Engine::sync, Opcode::dma_gather,
                              {testing_helpers::sbuf(0, 128, 0, 512, DType::bf16),
                               testing_helpers::hbm(0, 1000, 512, DType::bf16),
                               testing_helpers::sbuf(0, 128, 2048, 1, DType::int32)}));
  sim::Simulator s(ch);
  s.load(p);
  sim::Options o;
  o.mode = sim::Mode::timing;
  const auto st = s.run(o);
  const double rows_per_engine = 128.0 / ch.dma.engines_per_core;
  const double want =
      ch.dma.descriptor_gen.value() +
      rows_per_engine * (static_cast<double>(ch.dma.overhead_bound_per_partition.value()) + 1024) /
          ch.dma.engine_bandwidth.value() +
      ch.dma.fixed_cost.value();
  EXPECT_NEAR(st.latency_ns, want, 1e-6);
  EXPECT_EQ(st.dma_bytes, 128 * 1024);  // the rows moved, not the 1000-row view
  EXPECT_EQ(st.hbm_bytes, 128 * 1024);
}

// A scatter-add of bf16 rows into an fp32 table: the HBM traffic is the
// selected fp32 rows, read and written (read-modify-write), not the view
// and not the bf16 source's size.
TEST(IndirectDma, ScatterAddTraffic) {
  const auto& ch = chip("trn3");
  isa::Program p = testing_helpers::program(ch);
  auto in = testing_helpers::ins(Engine::sync, Opcode::dma_scatter,
                                 {testing_helpers::hbm(0, 1000, 64, DType::fp32),
                                  testing_helpers::sbuf(0, 128, 0, 128, DType::bf16),
                                  testing_helpers::sbuf(0, 128, 4096, 2, DType::int32)});
  in.accumulate = true;
  testing_helpers::add(p, in);
  sim::Simulator s(ch);
  s.load(p);
  sim::Options o;
  o.mode = sim::Mode::timing;
  const auto st = s.run(o);
  EXPECT_EQ(st.dma_bytes, 128 * 2 * 64 * 4);
  EXPECT_EQ(st.hbm_bytes, 2 * 128 * 2 * 64 * 4);
  EXPECT_EQ(st.dma_transfers, 1);
}

}  // namespace
}  // namespace tern
