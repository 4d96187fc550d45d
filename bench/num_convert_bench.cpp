// Array conversion throughput: FP32 -> BF16, FP32 -> E4M3 and
// MXFP8 quantization, each as a ratio to memcpy of the same input bytes
// measured in the same run (ratio 1.0 = as fast as copying the input).
//
//   ./build/bench/bench_num_convert [--benchmark_min_time=0.5]
//
// Results are recorded in bench/README.md.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "num/convert.h"
#include "num/mx.h"

namespace {

using namespace tern::num;

constexpr std::size_t kN = std::size_t{1} << 22;  // 4 Mi floats = 16 MiB in

const std::vector<float>& input() {
  static const std::vector<float> v = [] {
    std::vector<float> x(kN);
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 10.0f);
    for (float& f : x) f = d(rng);
    return x;
  }();
  return v;
}

void set_counters(benchmark::State& st) {
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations() * kN));
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations() * kN * sizeof(float)));
}

void BM_memcpy(benchmark::State& st) {
  const auto& in = input();
  std::vector<float> out(kN);
  for (auto _ : st) {
    std::memcpy(out.data(), in.data(), kN * sizeof(float));
    benchmark::ClobberMemory();
  }
  set_counters(st);
}

template <FormatId F, typename T, Rounding R>
void BM_encode(benchmark::State& st) {
  const auto& in = input();
  std::vector<T> out(kN);
  const CastOptions opt{R, Overflow::saturate, 1};
  for (auto _ : st) {
    encode_array(format(F), in, std::span<T>(out), opt);
    benchmark::ClobberMemory();
  }
  set_counters(st);
}

void BM_mxfp8_quantize(benchmark::State& st) {
  const auto& in = input();
  std::vector<std::uint8_t> el(kN), sc(kN / kMxBlock);
  for (auto _ : st) {
    mx_quantize(mx_format(MxId::mxfp8_e4m3), ScalePolicy::rceil, in, el, sc);
    benchmark::ClobberMemory();
  }
  set_counters(st);
}

BENCHMARK(BM_memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_encode<FormatId::bf16, std::uint16_t, Rounding::nearest_even>)
    ->Name("fp32_to_bf16_rne")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_encode<FormatId::bf16, std::uint16_t, Rounding::stochastic>)
    ->Name("fp32_to_bf16_sr")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_encode<FormatId::e4m3, std::uint8_t, Rounding::nearest_even>)
    ->Name("fp32_to_e4m3_rne")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_mxfp8_quantize)
    ->Name("mxfp8_e4m3_quantize_rceil")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Console output plus a closing table of ratios to memcpy.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.run_type == Run::RT_Iteration && !r.error_occurred) {
        times_[r.run_name.function_name] = r.GetAdjustedRealTime();
        order_.push_back(r.run_name.function_name);
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    const auto base = times_.find("BM_memcpy");
    if (base == times_.end()) return;
    std::printf("\n%-28s %12s %14s %18s\n", "conversion", "ms / 4Mi", "Gelem/s", "ratio to memcpy");
    for (const auto& name : order_) {
      const double ms = times_[name];
      std::printf("%-28s %12.3f %14.2f %18.2f\n", name.c_str(), ms, kN / (ms * 1e-3) / 1e9,
                  base->second / ms);
    }
  }

 private:
  std::map<std::string, double> times_;
  std::vector<std::string> order_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
