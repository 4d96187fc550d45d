// Replayed runs: a program's later runs reuse the order and statistics its
// first run recorded. They must give the same bits and the same times as a
// fresh simulation, with cores on host threads or not, and the same errors.
#include <gtest/gtest.h>

#include <bit>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "arch/chip.h"
#include "common/sim_helpers.h"
#include "kernel/builder.h"
#include "kernel/kernels.h"
#include "sim/simulator.h"
#include "util/error.h"

namespace tern {
namespace {

using isa::DType;
using isa::Engine;
using isa::Opcode;
using namespace testing_helpers;

std::vector<std::uint32_t> bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = std::bit_cast<std::uint32_t>(v[i]);
  return b;
}

// A multi-core MX matmul (quantization on chip) with a GELU epilogue.
isa::Program mx_matmul(const arch::ChipSpec& chip) {
  kernel::MatmulSpec s;
  s.m = 384;
  s.k = 256;
  s.n = 640;
  s.in = DType::fp8_e4m3_x4;
  s.out = DType::bf16;
  s.cores = 4;
  s.epilogue.act = isa::ActFunc::gelu_tanh;
  return kernel::matmul_kernel(chip, s);
}

struct Result {
  std::vector<std::uint32_t> c;
  sim::RunStats stats;
};

// Run i of the matmul, its inputs drawn from seed i.
Result run_once(sim::Simulator& s, std::shared_ptr<const isa::Program> p, int i,
                const sim::Options& opt) {
  s.load_shared(std::move(p));
  s.write("at", random_values(256 * 384, 10 + static_cast<std::uint32_t>(i)));
  s.write("b", random_values(256 * 640, 20 + static_cast<std::uint32_t>(i)));
  Result r;
  r.stats = s.run(opt);
  r.c = bits(s.read("c"));
  return r;
}

void expect_same_stats(const sim::RunStats& a, const sim::RunStats& b) {
  EXPECT_EQ(a.latency_ns, b.latency_ns);
  EXPECT_EQ(a.instructions, b.instructions);
  EXPECT_EQ(a.hbm_bytes, b.hbm_bytes);
  EXPECT_EQ(a.dma_bytes, b.dma_bytes);
  EXPECT_EQ(a.dma_transfers, b.dma_transfers);
  EXPECT_EQ(a.dma_engine_busy_ns, b.dma_engine_busy_ns);
  EXPECT_EQ(a.tensor_flops, b.tensor_flops);
  EXPECT_EQ(a.sbuf_high_water, b.sbuf_high_water);
  EXPECT_EQ(a.psum_high_water, b.psum_high_water);
  ASSERT_EQ(a.engines.size(), b.engines.size());
  for (std::size_t c = 0; c < a.engines.size(); ++c)
    for (std::size_t e = 0; e < a.engines[c].size(); ++e) {
      EXPECT_EQ(a.engines[c][e].busy_ns, b.engines[c][e].busy_ns);
      EXPECT_EQ(a.engines[c][e].instructions, b.engines[c][e].instructions);
    }
}

// Later runs of one program replay the first; each must equal a fresh
// simulator's run of the same inputs, bit for bit and nanosecond for
// nanosecond, with cores on host threads (threads 0: all) or on one.
void check_replays(const sim::Options& opt) {
  const auto chip = arch::load_chip("trn3");
  const auto p = std::make_shared<const isa::Program>(mx_matmul(chip));
  sim::Simulator shared(chip);
  for (int i = 0; i < 3; ++i) {
    const Result replayed = run_once(shared, p, i, opt);
    sim::Simulator fresh(chip);
    const Result want = run_once(fresh, std::make_shared<const isa::Program>(*p), i, opt);
    EXPECT_EQ(replayed.c, want.c) << "run " << i;
    expect_same_stats(replayed.stats, want.stats);
    EXPECT_EQ(want.stats.replay_threads, 0);
    // The four cores share no HBM bytes: they replay on the host threads.
    const int threads = opt.threads > 0 ? opt.threads : -1;
    if (i == 0)
      EXPECT_EQ(replayed.stats.replay_threads, 0);
    else if (threads > 0)
      EXPECT_EQ(replayed.stats.replay_threads, std::min(threads, 4));
    else
      EXPECT_GE(replayed.stats.replay_threads, 1);
  }
}

TEST(Replay, MatchesFreshSimulation) {
  for (int threads : {0, 1, 2}) {
    sim::Options opt;
    opt.threads = threads;
    SCOPED_TRACE(threads);
    check_replays(opt);
  }
}

TEST(Replay, StochasticRoundingStreamsMatch) {
  sim::Options opt;
  opt.stochastic_rounding = true;
  opt.seed = 77;
  check_replays(opt);
}

// Two cores that race on HBM bytes (core 0 stores what core 1 loads, with
// no order between them): the replay cannot split them over threads, and
// must see exactly what the recorded run saw.
TEST(Replay, CoresSharingBytesReplayInRecordedOrder) {
  const auto chip = arch::load_chip("trn3");
  isa::Program p = program(chip);
  p.cores.resize(2);
  p.tensors.push_back({"out", 1 << 22, {128, 64}, DType::fp32, isa::TensorKind::output});
  // Core 0: t[0:128, 0:64] = 2.
  auto fill = ins(Engine::vector, Opcode::memset, {sbuf(0, 128, 0, 64)});
  fill.imm0 = 2.0f;
  fill.signals = {1};
  p.cores[0].streams[static_cast<int>(Engine::vector)].push_back(fill);
  auto store = ins(Engine::sync, Opcode::dma_copy, {hbm(0, 128, 64), sbuf(0, 128, 0, 64)});
  store.waits = {{1, 1}};
  p.cores[0].streams[static_cast<int>(Engine::sync)].push_back(store);
  // Core 1: out = t (whatever is there when its DMA runs).
  auto load = ins(Engine::sync, Opcode::dma_copy, {sbuf(0, 128, 0, 64), hbm(0, 128, 64)});
  load.signals = {2};
  p.cores[1].streams[static_cast<int>(Engine::sync)].push_back(load);
  auto out = ins(Engine::sync, Opcode::dma_copy, {hbm(1 << 22, 128, 64), sbuf(0, 128, 0, 64)});
  out.waits = {{2, 1}};
  p.cores[1].streams[static_cast<int>(Engine::sync)].push_back(out);

  const auto shared = std::make_shared<const isa::Program>(p);
  sim::Simulator s(chip);
  std::vector<std::vector<std::uint32_t>> got;
  sim::Options opt;
  opt.threads = 2;
  for (int i = 0; i < 3; ++i) {
    s.load_shared(shared);
    s.write("t", std::vector<float>(1 << 20, 1.0f));
    EXPECT_EQ(s.run(opt).replay_threads, i == 0 ? 0 : 1);
    got.push_back(bits(s.read("out")));
  }
  // Core 1's load starts at time 0, before core 0's store: it reads 1s.
  EXPECT_EQ(got[0], bits(std::vector<float>(128 * 64, 1.0f)));
  EXPECT_EQ(got[1], got[0]);
  EXPECT_EQ(got[2], got[0]);
}

// A replay stops at the same error, with the same message, as a fresh run.
TEST(Replay, ErrorsMatchFreshSimulation) {
  const auto chip = arch::load_chip("trn3");
  const auto p = std::make_shared<const isa::Program>(mx_matmul(chip));
  auto message = [&](sim::Simulator& s, std::shared_ptr<const isa::Program> prog) {
    s.load_shared(std::move(prog));
    s.write("at", random_values(256 * 384, 1));  // "b" never written
    try {
      s.run();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  sim::Simulator s(chip);
  run_once(s, p, 0, {});  // recorded
  const std::string replayed = message(s, p);
  sim::Simulator fresh(chip);
  const std::string want = message(fresh, std::make_shared<const isa::Program>(*p));
  EXPECT_NE(want.find("never-written"), std::string::npos) << want;
  EXPECT_EQ(replayed, want);
}

// A gather that skips out-of-range rows writes SBUF slots chosen by data:
// a replay whose indices skip a slot the recorded run wrote must still
// report the read of it as uninitialized.
TEST(Replay, DataDependentWritesStayChecked) {
  const auto chip = arch::load_chip("trn3");
  kernel::Builder b(chip);
  const auto table = b.hbm("table", {5, 3}, DType::fp32, isa::TensorKind::input);
  const auto idxh = b.hbm("idx", {4, 1}, DType::int32, isa::TensorKind::input);
  const auto out = b.hbm("out", {4, 3}, DType::fp32, isa::TensorKind::output);
  const auto ix = b.sbuf(4, 1, DType::int32);
  const auto dst = b.sbuf(4, 3, DType::fp32);
  b.dma_copy(ix, idxh);
  b.dma_gather(dst, table, ix, -1, /*oob_skip=*/true);
  b.dma_copy(out, dst);
  const auto p = std::make_shared<const isa::Program>(b.finish());
  sim::Simulator s(chip);
  auto run = [&](std::vector<float> idx) {
    s.load_shared(p);
    s.write("table", random_values(15, 3));
    s.write("idx", idx);
    return s.run();
  };
  EXPECT_EQ(run({0, 1, 2, 3}).replay_threads, 0);
  EXPECT_EQ(run({4, 3, 2, 1}).replay_threads, 1);
  try {
    run({0, 9, 2, 3});  // row 9 is skipped: partition 1 never written
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("never-written"), std::string::npos) << e.what();
  }
}

// The same for a scatter that skips out-of-range rows: which SBUF slots it
// reads depends on data, so a slot the recorded run skipped (never
// written) must still be reported when a later run reads it.
TEST(Replay, DataDependentReadsStayChecked) {
  const auto chip = arch::load_chip("trn3");
  kernel::Builder b(chip);
  const auto out = b.hbm("out", {4, 3}, DType::fp32, isa::TensorKind::output);
  const auto idxh = b.hbm("idx", {2, 1}, DType::int32, isa::TensorKind::input);
  const auto ix = b.sbuf(2, 1, DType::int32);
  const auto src = b.sbuf(2, 3, DType::fp32);
  b.dma_copy(ix, idxh);
  b.memset(src.tile(0, 1, 0, 3), 5.0f);  // partition 1 never written
  b.dma_scatter(out, src, ix);
  isa::Program prog = b.finish();
  for (auto& stream : prog.cores[0].streams)
    for (auto& in : stream)
      if (in.op == Opcode::dma_scatter) in.oob_skip = true;
  const auto p = std::make_shared<const isa::Program>(prog);
  sim::Simulator s(chip);
  auto run = [&](std::vector<float> idx) {
    s.load_shared(p);
    s.write("idx", idx);
    return s.run();
  };
  EXPECT_EQ(run({0, 99}).replay_threads, 0);  // partition 1 skipped: never read
  try {
    run({0, 1});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("never-written"), std::string::npos) << e.what();
  }
}

// A DMA transpose into HBM rows that overlap: the later source row's
// element wins, as element by element in source order.
TEST(Replay, OverlappingTransposeKeepsSourceOrder) {
  const auto chip = arch::load_chip("trn3");
  isa::Program p = program(chip);
  p.tensors.push_back({"x", 1 << 22, {2, 2}, DType::bf16, isa::TensorKind::input});
  p.tensors.push_back({"out", 1 << 23, {64}, DType::bf16, isa::TensorKind::output});
  auto fill = ins(Engine::sync, Opcode::dma_copy,
                  {sbuf(0, 2, 0, 2, DType::bf16), hbm(1 << 22, 2, 2, DType::bf16)});
  fill.signals = {1};
  add(p, fill);
  // Destination row i, element r at out + i + r (elements): (i, r) = (1, 0)
  // and (0, 1) are the same element.
  isa::AccessPattern dst = hbm(1 << 23, 2, 2, DType::bf16);
  dst.dims = {{1, 2}, {1, 2}};
  auto t = ins(Engine::sync, Opcode::dma_transpose, {dst, sbuf(0, 2, 0, 2, DType::bf16)});
  t.waits = {{1, 1}};
  add(p, t);
  sim::Simulator s(chip);
  s.load(p);
  s.write("x", std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f});
  s.write("out", std::vector<float>(64, 0.0f));
  s.run();
  const std::vector<float> out = s.read("out");
  // Source row 1 (3, 4) is copied after row 0 (1, 2): element 1 holds 3.
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 3.0f);
  EXPECT_EQ(out[2], 4.0f);
}

// A traced run simulates (the trace needs the timeline) and times the same.
TEST(Replay, TracedRunSimulates) {
  const auto chip = arch::load_chip("trn3");
  const auto p = std::make_shared<const isa::Program>(mx_matmul(chip));
  sim::Simulator s(chip);
  const Result first = run_once(s, p, 0, {});
  sim::Options traced;
  traced.trace = true;
  const Result again = run_once(s, p, 0, traced);
  EXPECT_FALSE(again.stats.events.empty());
  EXPECT_EQ(again.c, first.c);
  expect_same_stats(again.stats, first.stats);
}

}  // namespace
}  // namespace tern
