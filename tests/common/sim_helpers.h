// Small helpers to write raw programs in tests.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "arch/chip.h"
#include "isa/program.h"

namespace tern::testing_helpers {

// n draws of N(0, scale^2) from mt19937 seeded with `seed`.
inline std::vector<float> random_values(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline isa::AccessPattern sbuf(int p0, int np, std::int64_t offset, std::int64_t free,
                               isa::DType dt = isa::DType::fp32, isa::Mem mem = isa::Mem::sbuf) {
  isa::AccessPattern ap;
  ap.mem = mem;
  ap.dtype = dt;
  ap.offset = offset;
  ap.start_partition = p0;
  ap.partitions = np;
  ap.dims = {{1, free}};
  return ap;
}
inline isa::AccessPattern psum(int p0, int np, std::int64_t offset, std::int64_t free,
                               isa::DType dt = isa::DType::fp32) {
  return sbuf(p0, np, offset, free, dt, isa::Mem::psum);
}
// Rows x cols of a row-major HBM tensor at `address`.
inline isa::AccessPattern hbm(std::int64_t address, std::int64_t rows, std::int64_t cols,
                              isa::DType dt = isa::DType::fp32) {
  isa::AccessPattern ap;
  ap.mem = isa::Mem::hbm;
  ap.dtype = dt;
  ap.offset = address;
  ap.partitions = static_cast<int>(rows);
  ap.dims = {{cols, rows}, {1, cols}};
  return ap;
}

inline isa::Instruction ins(isa::Engine e, isa::Opcode op, std::vector<isa::AccessPattern> ops) {
  isa::Instruction in;
  in.engine = e;
  in.op = op;
  in.operands = std::move(ops);
  return in;
}

// A one-core program for `chip` with one HBM tensor "t" of `bytes` bytes.
inline isa::Program program(const arch::ChipSpec& chip, std::int64_t hbm_floats = 1 << 20) {
  isa::Program p;
  p.arch = chip.name;
  p.semaphores = 20;
  p.tensors.push_back({"t", 0, {hbm_floats}, isa::DType::fp32, isa::TensorKind::input});
  p.cores.resize(1);
  return p;
}

inline void add(isa::Program& p, isa::Instruction in) {
  p.cores[0].streams[static_cast<int>(in.engine)].push_back(std::move(in));
}

}  // namespace tern::testing_helpers
