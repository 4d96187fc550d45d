// Simulator benchmarks. Each figure is a ratio to a baseline
// measured in the same run, or a simulated-time ratio to an analytic bound.
//
//   ./build/bench/bench_sim            # all measurements, a table at the end
//
// 1. Functional matmul throughput: simulating the built-in bf16 matmul
//    kernel (functional mode, bit-exact) vs OpenBLAS sgemm on the same shape,
//    both single-threaded, median of 5 warm runs.
// 2. Timing-only simulation rate: simulated instructions per host second.
// 3. 4096^3 bf16 matmul on trn3 (one NeuronCore): simulated latency over the
//    peak-FLOPS lower bound, and the host time to build + simulate it.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "arch/chip.h"
#include "kernel/kernels.h"
#include "sim/simulator.h"
#include "timing.h"

namespace {

using namespace tern;
using bench::Clock;
using bench::median_seconds;
using bench::seconds;

}  // namespace

int main() {
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  openblas_set_num_threads(1);
  const auto chip = arch::load_chip("trn3");
  std::printf("%-58s %12s %12s %10s %8s\n", "measurement", "tern", "baseline", "ratio", "goal");

  // 1. Functional matmul vs sgemm.
  for (int n : {1024, 2048}) {
    const isa::Program p =
        kernel::matmul_kernel(chip, {n, n, n, isa::DType::bf16, isa::DType::fp32, 1});
    sim::Simulator s(chip);
    s.load(p);
    std::vector<float> a(static_cast<std::size_t>(n) * n), b(a.size()), c(a.size());
    std::mt19937 rng(1);
    std::normal_distribution<float> d;
    for (float& x : a) x = d(rng);
    for (float& x : b) x = d(rng);
    s.write("at", a);
    s.write("b", b);
    a = s.read("at");  // the bf16-rounded values the simulator holds
    b = s.read("b");
    sim::Options o;
    o.mode = sim::Mode::functional;
    o.threads = 1;  // one thread each, like OpenBLAS here
    s.run(o);       // warm: first-touch page faults of the simulated memories
    const double ts = median_seconds(5, [&] { s.run(o); });
    const double tb = median_seconds(5, [&] {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                  0.0f, c.data(), n);
    });
    std::printf("%-58s %10.1f ms %10.1f ms %10.2f %8s\n",
                (std::string("functional bf16 matmul ") + std::to_string(n) +
                 "^3 vs OpenBLAS sgemm (throughput)")
                    .c_str(),
                ts * 1e3, tb * 1e3, tb / ts, ">= 0.5");
  }

  // 2 and 3. Timing-only.
  const int n = 4096;
  const auto t0 = Clock::now();
  const isa::Program p =
      kernel::matmul_kernel(chip, {n, n, n, isa::DType::bf16, isa::DType::fp32, 1});
  sim::Simulator s(chip);
  s.load(p);
  sim::Options o;
  o.mode = sim::Mode::timing;
  const sim::RunStats st = s.run(o);
  const double first = seconds(t0, Clock::now());
  const double run = median_seconds(21, [&] { s.run(o); });  // about 5 ms each
  const double rate = static_cast<double>(st.instructions) / run;
  std::printf("%-58s %12.3g %12s %10s %8s\n",
              "timing-only rate, 4096^3 matmul (instructions / host s)", rate, "-", "-", ">= 5e6");
  const double bound = 2.0 * n * n * n / chip.tensor_peak_per_core("bf16").value() * 1e9;
  std::printf("%-58s %10.1f us %10.1f us %10.3f %8s\n",
              "4096^3 bf16 trn3 simulated latency vs peak-FLOPS bound", st.latency_ns / 1e3,
              bound / 1e3, st.latency_ns / bound, "<= 1.3");
  // The same shape in FP8 (double row, 2x) and MXFP8 (4x, quantized on chip).
  for (const auto& [dt, key, label] :
       {std::tuple{isa::DType::fp8_e4m3, "fp8", "fp8 (double row)"},
        std::tuple{isa::DType::fp8_e4m3_x4, "mxfp8", "mxfp8 (on-chip quantize)"}}) {
    const isa::Program q = kernel::matmul_kernel(chip, {n, n, n, dt, isa::DType::fp32, 1});
    sim::Simulator sq(chip);
    sq.load(q);
    const double lat = sq.run(o).latency_ns;
    const double b = 2.0 * n * n * n / chip.tensor_peak_per_core(key).value() * 1e9;
    std::printf("%-58s %10.1f us %10.1f us %10.3f %8s\n",
                (std::string("4096^3 ") + label + " trn3 latency vs its peak bound").c_str(),
                lat / 1e3, b / 1e3, lat / b, "-");
  }
  std::printf("%-58s %10.3f s  %12s %10s %8s\n",
              "4096^3 timing-only host time (build + load + simulate)", first, "-", "-", "< 1 s");
  return 0;
}
