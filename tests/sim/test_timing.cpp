// Exact simulated times for hand-computable programs. Every expected value
// is written from the chip description's parameters with the formulas of
// docs/sim.md, so a change to data/arch moves both sides together; the last
// tests change a parameter and check the time moves as the formula says.
#include <gtest/gtest.h>

#include <cmath>

#include "common/sim_helpers.h"
#include "kernel/builder.h"
#include "sim/cost.h"
#include "sim/simulator.h"
#include "util/error.h"

namespace tern {
namespace {

using isa::DType;
using isa::Engine;
using isa::Opcode;
using namespace testing_helpers;

sim::RunStats run_timing(const arch::ChipSpec& chip, const isa::Program& p) {
  sim::Simulator s(chip);
  s.load(p);
  sim::Options o;
  o.mode = sim::Mode::timing;
  o.trace = true;
  return s.run(o);
}

const sim::TraceEvent& event(const sim::RunStats& st, const std::string& name, int nth = 0) {
  for (const auto& e : st.events)
    if (e.name == name && nth-- == 0) return e;
  throw std::runtime_error("no event " + name);
}

isa::Program one_matmul(const arch::ChipSpec& chip, int n_moving, DType dt = DType::bf16,
                        int count = 1) {
  isa::Program p = program(chip);
  for (int i = 0; i < count; ++i) {
    add(p, ins(Engine::tensor, Opcode::load_stationary, {sbuf(0, 128, 0, 128, dt)}));
    auto mm = ins(Engine::tensor, Opcode::multiply_moving,
                  {psum(0, 128, 0, n_moving), sbuf(0, 128, 4096, n_moving, dt)});
    add(p, mm);
  }
  return p;
}

TEST(Timing, OneMatmul) {
  const auto chip = arch::load_chip("trn3");
  const double ghz = chip.tensor.clock.value();
  // LoadStationary of 128 columns: ceil(128 / 4) = 32 cycles; MultiplyMoving
  // N=512: max(min(64, 128), 512) = 512 cycles; the multiply waits for the load.
  const auto st = run_timing(chip, one_matmul(chip, 512));
  EXPECT_DOUBLE_EQ(st.latency_ns, (32 + 512) / ghz);
  EXPECT_DOUBLE_EQ(event(st, "multiply_moving").start_ns, 32 / ghz);
  // Small moving tile: the 64-cycle floor.
  EXPECT_DOUBLE_EQ(run_timing(chip, one_matmul(chip, 16)).latency_ns, (32 + 64) / ghz);
  // FP32 runs at a quarter rate: load and multiply take 4x the cycles.
  EXPECT_DOUBLE_EQ(run_timing(chip, one_matmul(chip, 512, DType::fp32)).latency_ns,
                   4 * (32 + 512) / ghz);
}

TEST(Timing, MxMatmulDoesFourTimesTheWorkPerCycle) {
  const auto chip = arch::load_chip("trn3");
  const double ghz = chip.tensor.clock.value();
  isa::Program p = program(chip);
  const auto x4 = DType::fp8_e4m3_x4;
  add(p, ins(Engine::tensor, Opcode::load_stationary,
             {sbuf(0, 128, 0, 128, x4), sbuf(0, 16, 2048, 128, DType::uint8)}));
  add(p, ins(Engine::tensor, Opcode::multiply_moving,
             {psum(0, 128, 0, 512), sbuf(0, 128, 4096, 512, x4),
              sbuf(0, 16, 8192, 512, DType::uint8)}));
  const auto st = run_timing(chip, p);
  // Same cycles as a BF16 matmul of the same tile, contraction 4 x 128.
  EXPECT_DOUBLE_EQ(st.latency_ns, (32 + 512) / ghz);
  EXPECT_DOUBLE_EQ(st.tensor_flops.at("float8_e4m3fn_x4"), 2.0 * 512 * 128 * 512);
}

TEST(Timing, Fp8DoubleRowDoublesTheWorkPerCycle) {
  const auto chip = arch::load_chip("trn2");
  const double ghz = chip.tensor.clock.value();
  isa::Program p = program(chip);
  auto ls = ins(Engine::tensor, Opcode::load_stationary, {sbuf(0, 128, 0, 256, DType::fp8_e5m2)});
  ls.perf = isa::PerfMode::double_row;
  auto mm = ins(Engine::tensor, Opcode::multiply_moving,
                {psum(0, 128, 0, 512), sbuf(0, 128, 4096, 1024, DType::fp8_e5m2)});
  mm.perf = isa::PerfMode::double_row;
  add(p, ls);
  add(p, mm);
  const auto st = run_timing(chip, p);
  // Loading 2 x 128 weight columns: 64 cycles; the multiply: 512 cycles for K = 256.
  EXPECT_DOUBLE_EQ(st.latency_ns, (64 + 512) / ghz);
  EXPECT_DOUBLE_EQ(st.tensor_flops.at("float8_e5m2"), 2.0 * 256 * 128 * 512);
}

TEST(Timing, BackgroundWeightLoadHidesTheSecondLoad) {
  const auto chip = arch::load_chip("trn3");
  const double ghz = chip.tensor.clock.value();
  const auto st = run_timing(chip, one_matmul(chip, 512, DType::bf16, 2));
  // LS2 runs during MM1; MM2 follows MM1 directly.
  EXPECT_DOUBLE_EQ(event(st, "load_stationary", 1).start_ns, 32 / ghz);
  EXPECT_DOUBLE_EQ(st.latency_ns, (32 + 512 + 512) / ghz);
}

// One HBM -> SBUF DMA of `rows` rows x `row_bytes`.
double dma_latency(const arch::ChipSpec& chip, int rows, std::int64_t row_bytes) {
  isa::Program p = program(chip);
  add(p, ins(Engine::sync, Opcode::dma_copy,
             {sbuf(0, rows, 0, row_bytes, DType::uint8), hbm(0, rows, row_bytes, DType::uint8)}));
  return run_timing(chip, p).latency_ns;
}

// The DMA parameters of docs/sim.md's formula, from the chip file.
struct DmaCosts {
  double bw, ovh, fixed;  // bytes / ns, bytes per descriptor, ns
  int engines;
  explicit DmaCosts(const arch::ChipSpec& c)
      : bw(c.dma.engine_bandwidth.value()),
        ovh(static_cast<double>(c.dma.overhead_bound_per_partition.value())),
        fixed(c.dma.fixed_cost.value()),
        engines(c.dma.engines_per_core) {}
};

TEST(Timing, DmaSizeClasses) {
  const auto chip = arch::load_chip("trn3");
  const auto [bw, ovh, fixed, engines] = DmaCosts(chip);
  // 128 rows are split over 16 engines, 8 rows each; every row costs the
  // per-row overhead plus its bytes at the engine's bandwidth.
  for (std::int64_t b : {64, 256, 2048, 4096, 16384}) {
    const double per_engine_rows = 128.0 / engines;
    EXPECT_DOUBLE_EQ(dma_latency(chip, 128, b), per_engine_rows * (ovh + b) / bw + fixed) << b;
  }
  // A single row uses one engine.
  EXPECT_DOUBLE_EQ(dma_latency(chip, 1, 64), (ovh + 64) / bw + fixed);
  // Efficiency classes: below 256 B per partition the overhead dominates;
  // 2 KiB moves >= 88 % of the payload rate; 4 KiB >= 94 %.
  auto efficiency = [&](std::int64_t b) { return b / (ovh + b); };
  EXPECT_LT(efficiency(128), 0.5);
  EXPECT_GE(efficiency(2048), 0.88);
  EXPECT_GE(efficiency(4096), 0.94);
}

// One HBM -> SBUF copy with the given free patterns on each side.
double strided_dma_latency(const arch::ChipSpec& chip, std::vector<isa::Dim> hbm_free,
                           std::vector<isa::Dim> sbuf_free) {
  isa::Program p = program(chip);
  auto dst = sbuf(0, 128, 0, 1);
  dst.dims = std::move(sbuf_free);
  auto src = hbm(0, 128, 1);
  src.dims = {{1, 128}};
  src.dims.insert(src.dims.end(), hbm_free.begin(), hbm_free.end());
  add(p, ins(Engine::sync, Opcode::dma_copy, {dst, src}));
  return run_timing(chip, p).latency_ns;
}

TEST(Timing, DmaPaysOneDescriptorPerContiguousChunk) {
  const auto chip = arch::load_chip("trn3");
  const auto [bw, ovh, fixed, engines] = DmaCosts(chip);
  const double rows_per_engine = 128.0 / engines;
  auto expect = [&](double descriptors, double row_bytes) {
    return rows_per_engine * (descriptors * ovh + row_bytes) / bw + fixed;
  };
  // A transposing read (HBM row stride 1 element, free stride 128): each
  // FP32 element is its own chunk, 64 descriptors per row.
  EXPECT_DOUBLE_EQ(strided_dma_latency(chip, {{128, 64}}, {{1, 64}}), expect(64, 256));
  // Four runs of 32 elements per row on the HBM side: 4 descriptors.
  EXPECT_DOUBLE_EQ(strided_dma_latency(chip, {{256, 4}, {1, 32}}, {{1, 128}}), expect(4, 512));
  // The same runs back to back are one contiguous row: 1 descriptor.
  EXPECT_DOUBLE_EQ(strided_dma_latency(chip, {{32, 4}, {1, 32}}, {{1, 128}}), expect(1, 512));
  // Every other SBUF element written from a contiguous row: 64 chunks.
  EXPECT_DOUBLE_EQ(strided_dma_latency(chip, {{1, 64}}, {{2, 64}}), expect(64, 256));
  // Runs of 48 (HBM) and 32 (SBUF) in a 96-element row cut it at 0, 32,
  // 48, 64: 96/48 + 96/32 - ceil(96/96) = 4 chunks.
  EXPECT_DOUBLE_EQ(strided_dma_latency(chip, {{64, 2}, {1, 48}}, {{64, 3}, {1, 32}}),
                   expect(4, 384));
}

TEST(Timing, HardwareDgeBuildsDescriptorsOnOneOfTheCoresInstances) {
  // trn2: two DGE instances a core, descriptor_gen (600 ns) per hwdge DMA.
  // Three one-row copies on three queues: the first two get an instance
  // each at 0, the third waits for one until descriptor_gen; each transfer
  // then moves its row and completes the fixed cost later.
  const auto chip = arch::load_chip("trn2");
  const DmaCosts d(chip);
  const double gen = chip.dma.descriptor_gen.value();
  ASSERT_EQ(chip.dma.dge_instances, 2);
  auto copies = [&](bool hw) {
    isa::Program p = program(chip);
    for (int i = 0; i < 3; ++i) {
      auto c = ins(Engine::sync, Opcode::dma_copy, {sbuf(0, 1, 64 * i, 16), hbm(4096 * i, 1, 16)});
      c.queue = i;
      c.hwdge = hw;
      add(p, c);
    }
    return run_timing(chip, p).latency_ns;
  };
  // Engines (queue mod 16) differ, so only the DGE serializes.
  EXPECT_DOUBLE_EQ(copies(true), 2 * gen + (d.ovh + 64) / d.bw + d.fixed);
  EXPECT_DOUBLE_EQ(copies(false), (d.ovh + 64) / d.bw + d.fixed);
}

TEST(Timing, DependentVectorChainPaysTheStaticOverheadAndAccessStart) {
  const auto chip = arch::load_chip("trn3");
  const double ghz = chip.vector.clock.value();
  // A dependent instruction reads only once the previous output is in SRAM,
  // so the access start (60 cycles) is exposed on top of the static
  // overhead (100): the performance guide's dependent ScalarE chain.
  const double ovh =
      static_cast<double>(chip.costs.static_overhead.value() + chip.costs.access_start.value());
  isa::Program dep = program(chip), indep = program(chip);
  for (int i = 0; i < 3; ++i) {
    auto in =
        ins(Engine::vector, Opcode::tensor_scalar, {sbuf(0, 128, 0, 256), sbuf(0, 128, 0, 256)});
    in.alu0 = isa::AluOp::add;
    add(dep, in);  // each reads what the previous wrote
    in.operands = {sbuf(0, 128, 4096 * (i + 1), 256), sbuf(0, 128, 0, 256)};
    add(indep, in);
  }
  // max(MIN_II, N) = 256 cycles each; + 160 for each of the two dependent ones.
  EXPECT_DOUBLE_EQ(run_timing(chip, dep).latency_ns, (3 * 256 + 2 * ovh) / ghz);
  EXPECT_DOUBLE_EQ(run_timing(chip, indep).latency_ns, 3 * 256 / ghz);
  // Tiny instructions are floored at MIN_II.
  isa::Program tiny = program(chip);
  auto t = ins(Engine::vector, Opcode::tensor_copy, {sbuf(0, 128, 0, 8), sbuf(0, 128, 64, 8)});
  add(tiny, t);
  EXPECT_DOUBLE_EQ(run_timing(chip, tiny).latency_ns,
                   static_cast<double>(chip.costs.min_ii.value()) / ghz);
}

// The Vector performance mode (v3+): over the NeuronCore-v2 costs, 4x for
// a 16-bit SBUF-to-SBUF copy / tensor_scalar with contiguous rows, 2x with
// one side in PSUM and for a 16-bit tensor_tensor; FP32 keeps the v2 cost.
// On trn3 FP8 qualifies too, and Scalar runs 16-bit data at 2x.
TEST(Timing, VectorAndScalarPerformanceModes) {
  const auto chip = arch::load_chip("trn3");
  const double v = chip.vector.clock.value(), s = chip.scalar.clock.value();
  auto one = [&](Engine e, Opcode op, std::vector<isa::AccessPattern> ops) {
    isa::Program p = program(chip);
    auto in = ins(e, op, std::move(ops));
    in.alu0 = isa::AluOp::multiply;
    add(p, in);
    return run_timing(chip, p).latency_ns;
  };
  const int n = 2048;
  const auto bf = DType::bf16;
  EXPECT_DOUBLE_EQ(
      one(Engine::vector, Opcode::tensor_copy, {sbuf(0, 128, 0, n, bf), sbuf(0, 128, 8192, n, bf)}),
      n / 4 / v);
  EXPECT_DOUBLE_EQ(one(Engine::vector, Opcode::tensor_scalar,
                       {sbuf(0, 128, 0, n, DType::fp8_e4m3), sbuf(0, 128, 8192, n, bf)}),
                   n / 4 / v);
  EXPECT_DOUBLE_EQ(one(Engine::vector, Opcode::tensor_copy,
                       {sbuf(0, 128, 0, 1024, bf), psum(0, 128, 0, 1024, bf)}),
                   1024 / 2 / v);
  // FP32 anywhere: the v2 cost.
  EXPECT_DOUBLE_EQ(
      one(Engine::vector, Opcode::tensor_copy, {sbuf(0, 128, 0, n, bf), sbuf(0, 128, 8192, n)}),
      n / v);
  // tensor_tensor: the v2 bf16 multiply costs N, halved.
  EXPECT_DOUBLE_EQ(
      one(Engine::vector, Opcode::tensor_tensor,
          {sbuf(0, 128, 0, n, bf), sbuf(0, 128, 8192, n, bf), sbuf(0, 128, 16384, n, bf)}),
      n / 2 / v);
  // The mode is the Vector engine's: GpSimd keeps N.
  EXPECT_DOUBLE_EQ(
      one(Engine::gpsimd, Opcode::tensor_tensor,
          {sbuf(0, 128, 0, n, bf), sbuf(0, 128, 8192, n, bf), sbuf(0, 128, 16384, n, bf)}),
      n / chip.gpsimd.clock.value());
  // Scalar: 16-bit in and out at 2x; an FP32 output at 1x.
  EXPECT_DOUBLE_EQ(
      one(Engine::scalar, Opcode::activation, {sbuf(0, 128, 0, n, bf), sbuf(0, 128, 8192, n, bf)}),
      n / 2 / s);
  EXPECT_DOUBLE_EQ(
      one(Engine::scalar, Opcode::activation, {sbuf(0, 128, 0, n), sbuf(0, 128, 8192, n, bf)}),
      n / s);
  // trn1 (NeuronCore-v2) has no performance mode.
  const auto t1 = arch::load_chip("trn1");
  isa::Program p = program(t1);
  add(p, ins(Engine::vector, Opcode::tensor_copy,
             {sbuf(0, 128, 0, n, bf), sbuf(0, 128, 8192, n, bf)}));
  EXPECT_DOUBLE_EQ(run_timing(t1, p).latency_ns, n / t1.vector.clock.value());
  // A data type name the ISA does not know is an error naming it.
  auto bad = arch::load_chip("trn3");
  bad.costs.perf_mode_dtypes = {"bf16", "bfloat17"};
  try {
    sim::CostModel m(bad);
    ADD_FAILURE() << "no error for an unknown performance-mode data type";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("perf_mode_dtypes: unknown data type 'bfloat17'"),
              std::string::npos)
        << e.what();
  }
}

// scalar_tensor_tensor (NKI's estimated cost): N for BF16 data and b with
// subtract then multiply and N even, else 2N.
TEST(Timing, ScalarTensorTensorCostsOneTensorTensor) {
  const auto chip = arch::load_chip("trn3");
  const double v = chip.vector.clock.value();
  auto one = [&](DType dt, isa::AluOp op0, isa::AluOp op1, int n) {
    isa::Program p = program(chip);
    auto in = ins(Engine::vector, Opcode::scalar_tensor_tensor,
                  {sbuf(0, 128, 0, n, dt), sbuf(0, 128, 16384, n, dt), sbuf(0, 128, 32768, n, dt)});
    in.alu0 = op0;
    in.alu1 = op1;
    add(p, in);
    return run_timing(chip, p).latency_ns;
  };
  using isa::AluOp;
  EXPECT_DOUBLE_EQ(one(DType::bf16, AluOp::subtract, AluOp::multiply, 2048), 2048 / v);
  EXPECT_DOUBLE_EQ(one(DType::bf16, AluOp::subtract, AluOp::multiply, 2047), 2 * 2047 / v);
  EXPECT_DOUBLE_EQ(one(DType::bf16, AluOp::multiply, AluOp::add, 2048), 2 * 2048 / v);
  EXPECT_DOUBLE_EQ(one(DType::fp32, AluOp::subtract, AluOp::multiply, 2048), 2 * 2048 / v);
}

// The performance mode takes the SBUF bus Vector shares with GpSimd: an
// independent GpSimd instruction waits for a perf-mode Vector instruction
// (and the other way round), while an FP32 Vector instruction overlaps it.
TEST(Timing, VectorPerformanceModeSharesTheGpSimdBus) {
  const auto chip = arch::load_chip("trn3");
  const double v = chip.vector.clock.value(), g = chip.gpsimd.clock.value();
  const int n = 4096;
  auto pair = [&](DType vt) {
    isa::Program p = program(chip);
    add(p, ins(Engine::vector, Opcode::tensor_copy,
               {sbuf(0, 128, 0, n, vt), sbuf(0, 128, 16384, n, vt)}));
    add(p,
        ins(Engine::gpsimd, Opcode::tensor_copy, {sbuf(0, 128, 65536, n), sbuf(0, 128, 98304, n)}));
    return run_timing(chip, p);
  };
  const auto fast = pair(DType::bf16);
  // Both are ready at 0; the lower engine (Vector) goes first.
  EXPECT_DOUBLE_EQ(event(fast, "tensor_copy", 0).start_ns, 0.0);
  EXPECT_DOUBLE_EQ(fast.latency_ns, n / 4 / v + n / g);
  const auto slow = pair(DType::fp32);
  EXPECT_DOUBLE_EQ(slow.latency_ns, std::max(n / v, n / g));
}

TEST(Timing, DmaComputeOverlap) {
  const auto chip = arch::load_chip("trn3");
  const double bw = chip.dma.engine_bandwidth.value();
  const double ovh = static_cast<double>(chip.dma.overhead_bound_per_partition.value());
  const double fixed = chip.dma.fixed_cost.value();
  const double vghz = chip.vector.clock.value();
  isa::Program p = program(chip);
  auto d1 = ins(Engine::sync, Opcode::dma_copy, {sbuf(0, 128, 0, 512), hbm(0, 128, 512)});
  d1.queue = 0;
  d1.signals = {4};
  auto d2 = ins(Engine::sync, Opcode::dma_copy, {sbuf(0, 128, 8192, 512), hbm(1 << 18, 128, 512)});
  d2.queue = 1;
  d2.signals = {5};
  auto v =
      ins(Engine::vector, Opcode::tensor_scalar, {sbuf(0, 128, 16384, 512), sbuf(0, 128, 0, 512)});
  v.waits = {{4, 1}};  // needs only the first transfer
  add(p, d1);
  add(p, d2);
  add(p, v);
  const auto st = run_timing(chip, p);
  const double busy = 8 * (ovh + 2048) / bw;  // per engine: 8 rows of 2 KiB
  const double d1_done = busy + fixed;
  const double d2_done = 2 * busy + fixed;  // queued behind the first on every engine
  EXPECT_DOUBLE_EQ(event(st, "tensor_scalar").start_ns, d1_done);
  EXPECT_DOUBLE_EQ(event(st, "dma_copy", 1).start_ns + event(st, "dma_copy", 1).dur_ns, d2_done);
  // The compute overlaps the second transfer.
  EXPECT_LT(event(st, "tensor_scalar").start_ns, d2_done);
  EXPECT_DOUBLE_EQ(st.latency_ns, std::max(d2_done, d1_done + 512 / vghz));
}

TEST(Timing, ChangingAParameterMovesTheTime) {
  auto chip = arch::load_chip("trn3");
  const double base = run_timing(chip, one_matmul(chip, 512)).latency_ns;
  chip.tensor.clock = gigahertz(chip.tensor.clock.value() * 2);
  EXPECT_DOUBLE_EQ(run_timing(chip, one_matmul(chip, 512)).latency_ns, base / 2);

  auto chip2 = arch::load_chip("trn3");
  const double fixed0 = chip2.dma.fixed_cost.value();
  const double d0 = dma_latency(chip2, 128, 4096);
  const double busy = d0 - fixed0;
  chip2.dma.fixed_cost = Nanoseconds(fixed0 + 500);
  EXPECT_DOUBLE_EQ(dma_latency(chip2, 128, 4096), busy + fixed0 + 500);
  chip2.dma.engine_bandwidth = gigabytes_per_second(chip2.dma.engine_bandwidth.value() * 2);
  EXPECT_DOUBLE_EQ(dma_latency(chip2, 128, 4096), busy / 2 + fixed0 + 500);
}

TEST(Timing, SemaphoresOrderEngines) {
  const auto chip = arch::load_chip("trn3");
  isa::Program p = program(chip);
  auto a = ins(Engine::vector, Opcode::memset, {sbuf(0, 128, 0, 512)});
  a.signals = {1};
  auto b =
      ins(Engine::scalar, Opcode::tensor_copy, {sbuf(0, 128, 4096, 512), sbuf(0, 128, 0, 512)});
  b.waits = {{1, 1}};
  add(p, a);
  add(p, b);
  const auto st = run_timing(chip, p);
  EXPECT_DOUBLE_EQ(event(st, "tensor_copy").start_ns, event(st, "memset").dur_ns);
}

// A DMA trigger costs its engine no time but keeps the stream's order: the
// builder gives the second transpose no wait (the Sync engine already waited
// for the Vector engine's copy), so it must not start before the first.
TEST(Timing, DmaTriggersKeepTheirEngineInOrder) {
  const auto chip = arch::load_chip("trn3");
  kernel::Builder b(chip);
  const auto big = b.sbuf(128, 8192, DType::fp32);
  const auto src = b.sbuf(128, 256, DType::bf16);
  const auto dst = b.sbuf(128, 256, DType::bf16);
  b.memset(big, 1.0f);  // keeps the Vector engine busy
  b.memset(src, 1.0f);
  b.dma_transpose(dst.tile(0, 128, 0, 128), src.tile(0, 128, 0, 128));
  b.dma_transpose(dst.tile(0, 128, 128, 128), src.tile(0, 128, 128, 128));
  const isa::Program p = b.finish();
  ASSERT_TRUE(p.cores[0].streams[static_cast<int>(Engine::sync)][1].waits.empty());
  const auto st = run_timing(chip, p);
  const double copy_end = event(st, "memset", 1).start_ns + event(st, "memset", 1).dur_ns;
  EXPECT_GE(event(st, "dma_transpose", 0).start_ns, copy_end);
  EXPECT_GE(event(st, "dma_transpose", 1).start_ns, copy_end);
}

}  // namespace
}  // namespace tern

namespace tern {
namespace {

// The HBM calendar fills the bandwidth left free before later reservations
// (requests arrive in simulation order, not time order).
TEST(HbmCalendar, FillsGapsBeforeLaterReservations) {
  tern::sim::HbmCalendar c;
  EXPECT_DOUBLE_EQ(c.reserve(0, 10, 0), 10);   // [0, 10)
  EXPECT_DOUBLE_EQ(c.reserve(20, 5, 0), 25);   // [20, 25), a gap [10, 20)
  EXPECT_DOUBLE_EQ(c.reserve(5, 4, 0), 14);    // waits for 10, fits the gap
  EXPECT_DOUBLE_EQ(c.reserve(12, 10, 0), 29);  // split: [14, 20) and [25, 29)
  EXPECT_DOUBLE_EQ(c.reserve(0, 1, 0), 30);
  EXPECT_DOUBLE_EQ(c.reserve(100, 1, 0), 101);
  // Intervals ending before the horizon are forgotten (no request starts there).
  EXPECT_DOUBLE_EQ(c.reserve(50, 2, 50), 52);
}

// Reservations that bridge two intervals merge them; once most intervals end
// before the horizon they are dropped, and the rest still fill and merge.
TEST(HbmCalendar, MergesAndForgetsManyIntervals) {
  tern::sim::HbmCalendar c;
  for (int k = 0; k < 40; ++k) EXPECT_DOUBLE_EQ(c.reserve(10.0 * k, 1, 0), 10.0 * k + 1);
  EXPECT_DOUBLE_EQ(c.reserve(1, 9, 0), 10);  // [1, 10) joins [0, 1) and [10, 11)
  EXPECT_DOUBLE_EQ(c.reserve(0, 1, 0), 12);  // [0, 11) is one interval now: [11, 12)
  // Horizon 350: [0, 12) and [20, 21) ... [340, 341) are forgotten (34 of 39
  // intervals); [350, 351) ... [390, 391) stay.
  EXPECT_DOUBLE_EQ(c.reserve(385, 10, 350), 396);  // [385, 390), then [391, 396)
  EXPECT_DOUBLE_EQ(c.reserve(350, 3, 350), 354);   // waits for 351, then [351, 354)
  EXPECT_DOUBLE_EQ(c.reserve(352, 8, 350), 363);   // [354, 360) and [361, 363)
}

}  // namespace
}  // namespace tern
