// Example: a row softmax kernel written with tern's C++ kernel builder,
// simulated on a Trainium3 core and checked against the host.
//
//   ./build/examples/example_softmax [rows] [cols]
//
// y[r, :] = exp(x[r, :] - max(x[r, :])) / sum(exp(x[r, :] - max(x[r, :])))
// Rows map to partitions (128 at a time); the Vector engine finds each row's
// max, its v4 fast exponential subtracts it and sums the row, the reciprocal
// of the sums scales the row through a stride-0 (broadcast) access pattern.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "arch/chip.h"
#include "kernel/builder.h"
#include "profile/profile.h"
#include "sim/simulator.h"
#include "util/error.h"

using namespace tern;
using isa::DType;
using kernel::Tensor;

isa::Program softmax_kernel(const arch::ChipSpec& chip, std::int64_t rows, std::int64_t cols) {
  kernel::Builder b(chip);
  const Tensor x = b.hbm("x", {rows, cols}, DType::fp32, isa::TensorKind::input);
  const Tensor y = b.hbm("y", {rows, cols}, DType::fp32, isa::TensorKind::output);
  const int P = chip.sbuf_partitions;
  // Two sets of tiles: the next block loads while this one computes.
  Tensor in[2] = {b.sbuf(P, cols, DType::fp32), b.sbuf(P, cols, DType::fp32)};
  Tensor e[2] = {b.sbuf(P, cols, DType::fp32), b.sbuf(P, cols, DType::fp32)};
  Tensor stats[2] = {b.sbuf(P, 3, DType::fp32), b.sbuf(P, 3, DType::fp32)};  // max, sum, 1/sum
  int i = 0;
  for (std::int64_t r0 = 0; r0 < rows; r0 += P, i ^= 1) {
    const int n = static_cast<int>(std::min<std::int64_t>(P, rows - r0));
    const Tensor t = in[i].tile(0, n, 0, cols), ex = e[i].tile(0, n, 0, cols);
    const Tensor mx = stats[i].tile(0, n, 0, 1), sum = stats[i].tile(0, n, 1, 1),
                 inv = stats[i].tile(0, n, 2, 1);
    b.dma_copy(t, x.tile(static_cast<int>(r0), n, 0, cols));
    b.tensor_reduce(mx, t, isa::AluOp::max);
    b.exponential(ex, t, &mx, &sum);
    b.reciprocal(inv, sum);
    b.tensor_tensor(ex, ex, inv.with_dims({{0, cols}}), isa::AluOp::multiply);  // broadcast 1/sum
    b.dma_copy(y.tile(static_cast<int>(r0), n, 0, cols), ex, -1, false, isa::Engine::vector);
  }
  return b.finish();
}

int main(int argc, char** argv) {
  try {
    const std::int64_t rows = argc > 1 ? std::atoll(argv[1]) : 300;
    const std::int64_t cols = argc > 2 ? std::atoll(argv[2]) : 1000;
    const auto chip = arch::load_chip("trn3");
    sim::Simulator s(chip);
    s.load(softmax_kernel(chip, rows, cols));
    std::vector<float> x(static_cast<std::size_t>(rows * cols));
    std::mt19937 rng(0);
    std::normal_distribution<float> d(0.0f, 3.0f);
    for (float& v : x) v = d(rng);
    s.write("x", x);
    const sim::RunStats st = s.run();
    const std::vector<float> y = s.read("y");
    double worst = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      double m = -INFINITY, z = 0;
      for (std::int64_t c = 0; c < cols; ++c) m = std::max<double>(m, x[r * cols + c]);
      for (std::int64_t c = 0; c < cols; ++c) z += std::exp(x[r * cols + c] - m);
      for (std::int64_t c = 0; c < cols; ++c) {
        const double want = std::exp(x[r * cols + c] - m) / z;
        worst = std::max(worst, std::fabs(y[r * cols + c] - want) / std::max(want, 1e-30));
      }
    }
    std::printf("softmax %lld x %lld on %s\n%s", static_cast<long long>(rows),
                static_cast<long long>(cols), chip.name.c_str(),
                profile::to_text(profile::summarize(st, chip)).c_str());
    std::printf("largest relative error against the host (double): %.2e\n", worst);
    if (worst > 1e-5) {
      std::fprintf(stderr, "softmax: error %.2e exceeds 1e-5\n", worst);
      return 1;
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "softmax: %s\n", e.what());
    return 2;
  }
}
