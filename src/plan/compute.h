// How fast one chip runs the two kinds of work a training step is made of:
// GEMMs (tensor-engine bound) and elementwise / normalization kernels
// (HBM bound). GPUs take their efficiency from the system file (public
// microbenchmarks); Trainium chips from data/plan/efficiency/<chip>.toml,
// tables of `tern bench` runs on the simulator (scripts/plan_efficiency.py).
#pragma once

#include <string>
#include <vector>

#include "arch/system.h"
#include "util/units.h"

namespace tern::plan {

struct GemmPoint {
  std::string dtype;
  double m = 0, k = 0, n = 0;
  double efficiency = 0;          // achieved / peak of that dtype
  double lm = 0, lk = 0, ln = 0;  // log2 of m, k, n
};

// One rank's compute: a chip, or on Trainium one of its `ranks_per_chip`
// (logical) NeuronCores, which gets that share of the chip's peaks, HBM and
// HBM bandwidth.
class ComputeModel {
 public:
  // Loads the chip's table for Trainium systems; errors name the file.
  static ComputeModel of(const arch::SystemSpec& s, int ranks_per_chip = 1);

  // Time of C[m, n] = A[m, k] B[k, n] in `dtype` (bf16, fp8, mxfp8):
  // 2 m k n / (peak(dtype) x efficiency(m, k, n)).
  Nanoseconds gemm(double m, double k, double n, const std::string& dtype) const;
  // Attention core (QK^T and PV) of FLOPs `flops`, fused (FlashAttention,
  // forward or backward efficiency) when `fused`, else two batched GEMMs:
  // flops / (bf16 peak x efficiency).
  Nanoseconds attention(double flops, double seq, double head_dim, bool fused, bool backward) const;
  // `kernels` bandwidth-bound kernels moving `bytes` through HBM in all:
  // kernels x kernel_latency() + bytes / (HBM bandwidth x memory
  // efficiency). The latency is what a kernel costs however small its
  // tensors (on Trainium a DMA's fixed cost in and out); at a few thousand
  // tokens per micro-batch it is a large part of the elementwise work.
  Nanoseconds memory(double bytes, double kernels = 0) const;
  // Adam's update of one parameter element: read master, m, v and the
  // gradient, write master, m, v and the 16-bit weight.
  static constexpr double kAdamBytesPerParam = 4 * 3 * 2 + 2 + 2;

  // The efficiency tables measure whole chips, the kernels splitting M over
  // the cores: a rank's [m, k, n] GEMM is a chip's [m x ranks_per_chip, k, n].
  double gemm_efficiency(double m, double k, double n, const std::string& dtype) const;
  double memory_efficiency() const { return memory_eff_; }
  // The fixed time of one bandwidth-bound kernel (Trainium: from the
  // efficiency table; other devices: not modelled, 0).
  Nanoseconds kernel_latency() const { return Nanoseconds(kernel_latency_ns_); }
  const std::string& source() const { return source_; }
  FlopRate peak(const std::string& dtype) const;
  // The rank's device: peaks, HBM capacity and bandwidth of its share.
  const arch::DeviceSpec& device() const { return device_; }
  int ranks_per_chip() const { return ranks_per_chip_; }

 private:
  arch::DeviceSpec device_;
  std::vector<GemmPoint> gemms_;  // empty: device_.gemm_efficiency everywhere
  double attention_eff_ = 0, attention_bwd_eff_ = 0, memory_eff_ = 0;
  double kernel_latency_ns_ = 0;
  int ranks_per_chip_ = 1;
  std::string source_;
};

}  // namespace tern::plan
