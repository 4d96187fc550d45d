// A Trainium-class chip described as data (data/arch/<name>.toml).
//
// Only architectural facts are stored; every peak and total is derived here
// from clocks, widths and counts (docs/arch.md gives the formulas), so an
// architect who changes one number in a file sees its effect everywhere.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "util/units.h"

namespace tern::arch {

// A Vector, Scalar or GpSimd engine: one lane per partition.
struct EngineSpec {
  Frequency clock;
  int lanes = 0;
  double fp32_flops_per_lane_cycle = 0;  // FP32 operations per lane per cycle
  FlopRate fp32_peak() const { return flop_rate(lanes * fp32_flops_per_lane_cycle, clock); }
};

struct TensorSpec {
  Frequency clock;
  int rows = 0, cols = 0;  // systolic array (contraction rows x output columns)
  int stationary_fmax = 0;
  int moving_fmax = 0;
  // MACs per PE per cycle relative to BF16, by input type (bf16, fp16, tf32,
  // fp32, fp8, mxfp8, mxfp4, sparse). A missing entry: not supported.
  std::map<std::string, double, std::less<>> rate;
};

struct DmaSpec {
  int engines_per_core = 0;
  int queues_per_engine = 0;
  Bandwidth engine_bandwidth;
  Bandwidth chip_bandwidth;
  Nanoseconds fixed_cost;
  Nanoseconds descriptor_gen;
  int dge_instances = 0;  // hardware descriptor generators per core (0: none)
  Bytes overhead_bound_per_partition;
  Bytes efficient_per_partition;
  Bytes saturating_per_partition;
  int priority_classes = 1;
};

// The engines' instruction sequencers (registers, branches, loops).
struct SequencerSpec {
  int registers = 0;     // 32-bit registers per engine
  Cycles op_cycles;      // a register op or branch, in the engine's cycles
  Frequency sync_clock;  // the Sync engine's sequencer clock
};

struct CostSpec {
  Cycles min_ii;             // minimum initiation interval
  Cycles access_start;       // cycles to start a tensor access
  Cycles static_overhead;    // dependent back-to-back Vector/Scalar instruction overhead
  Cycles gpsimd_fixed;       // fixed part of iota / affine_select (~150 + N)
  Bytes stride_penalty;      // innermost stride at which SBUF/PSUM access slows down
  int strided_slowdown = 1;  // by this factor (engine cycles per element)
  // LoadStationary runs this many times faster than a MultiplyMoving of
  // the same free size.
  int load_stationary_speedup = 1;
  // The Vector engine's fast exponential (NeuronCore-v4) runs this many
  // times the Scalar engine's exp rate; 0 where the chip has none.
  int fast_exp_speedup = 0;
  // Cycles per element (the NeuronCore-v2 cost table): a tensor_tensor
  // that reads neither PSUM nor two contiguous SBUF bf16 operands of
  // add/multiply/subtract (those take one), and a reciprocal.
  int tensor_tensor_cycles = 1;
  int reciprocal_cycles = 1;
  // bn_aggr: cycles per three elements of its source (13 N / 3).
  int bn_aggr_cycles_per_3 = 3;
  // Faster by this factor: a bf16 add/max tensor_reduce, a memset of zero
  // into a 16-bit type.
  int bf16_reduce_speedup = 1;
  int memset_zero_16bit_speedup = 1;
  // Performance modes (NeuronCore-v3 and later), over the NeuronCore-v2
  // costs above. `perf_mode_dtypes` names the data types that qualify
  // (isa dtype names; empty: no performance mode). Vector: tensor_copy and
  // tensor_scalar with SBUF in and out, contiguous innermost, run
  // `vector_perf_copy_speedup` times faster; strided or with one side in
  // PSUM, and tensor_tensor with both inputs in SBUF, `vector_perf_speedup`
  // times. The mode uses the SBUF bus Vector shares with GpSimd when
  // `vector_perf_shares_gpsimd_bus` (the two then do not overlap).
  // Scalar: activation, tensor_copy and tensor_scalar whose data in and
  // out qualify run `scalar_perf_speedup` times faster. QuantizeMX reads
  // `quantize_mx_speedup` source elements per partition and cycle.
  std::vector<std::string> perf_mode_dtypes;
  int vector_perf_copy_speedup = 1;
  int vector_perf_speedup = 1;
  bool vector_perf_shares_gpsimd_bus = false;
  int scalar_perf_speedup = 1;
  int quantize_mx_speedup = 1;
};

struct ChipSpec {
  std::filesystem::path source;  // the file it was loaded from
  std::string source_text;       // its text at load time (a compile cache's key)
  std::string name, display_name, core_generation;
  int core_version = 0;
  int cores = 0;
  int collective_cores = 0;
  // Logical NeuronCore configuration: physical cores grouped into one
  // logical core (1 or 2). Neuron's parallel degrees and ranks count logical
  // cores: cores / lnc per chip.
  int max_lnc = 1;
  int default_lnc = 1;

  Bytes hbm_capacity;
  Bandwidth hbm_bandwidth;

  int sbuf_partitions = 0;
  Bytes sbuf_partition_bytes;
  int psum_partitions = 0;
  Bytes psum_partition_bytes;
  int psum_banks = 0;
  Bytes sbuf_min_align;  // an SBUF / PSUM tile's byte offset in a partition is
  Bytes psum_min_align;  // a multiple of these (nl.tile_size.*_min_align)

  TensorSpec tensor;
  EngineSpec vector, scalar, gpsimd;
  int bn_stats_fmax = 0;         // Vector bn_stats: elements per partition
  int vector_transpose_max = 0;  // Vector transpose: partitions and elements
  int select8_min = 0;           // max8 / nc_find_index8 / nc_match_replace8: elements
  int select8_max = 0;           //   per partition they read, at least / at most
  int shuffle_partitions = 0;    // nc_stream_shuffle: partitions one shuffle mask covers
  int gpsimd_cores = 0;
  int gpsimd_width_bits = 0;
  DmaSpec dma;
  CostSpec costs;
  SequencerSpec sequencer;
  std::string neuronlink_version;
  Bandwidth neuronlink_bandwidth;
  // Published chip-level figures (validation only, never used to compute).
  std::map<std::string, double, std::less<>> published;

  // ---- derived
  Bytes sbuf_bytes() const { return sbuf_partition_bytes * sbuf_partitions; }
  Bytes psum_bytes() const { return psum_partition_bytes * psum_partitions; }
  Bytes psum_bank_bytes() const { return psum_partition_bytes / psum_banks; }
  // Partitions each GpSimd core owns (nonzero_with_count, local_gather).
  int gpsimd_partitions() const { return sbuf_partitions / gpsimd_cores; }
  Bytes hbm_per_core() const { return hbm_capacity / cores; }
  Bandwidth dma_bandwidth_per_core() const {
    return dma.engine_bandwidth * static_cast<double>(dma.engines_per_core);
  }
  bool supports(std::string_view dtype) const { return tensor.rate.count(dtype) > 0; }
  // Tensor-engine peak of one core: rows x cols PEs x 2 FLOP per MAC x
  // clock x rate(dtype). Throws NotSupported when the chip lacks the type.
  FlopRate tensor_peak_per_core(std::string_view dtype) const;
  FlopRate tensor_peak_per_chip(std::string_view dtype) const {
    return tensor_peak_per_core(dtype) * static_cast<double>(cores);
  }
};

// Loads and validates one chip file. Errors (tern::Error) name the file,
// the key and what was expected.
ChipSpec load_chip_file(const std::filesystem::path& file);
// A name from data/arch ("trn3") or a path to a .toml file.
ChipSpec load_chip(std::string_view name_or_path);

// The data directory (arch/, plan/, the default corpus): $TERN_DATA_DIR;
// else the first share/tern/data or data/ holding arch/trn3.toml in the
// folder of the binary this code runs from (the tern executable or the
// Python module) or up to four folders above it: an install prefix or the
// source tree of a build; else the source tree's data/ (compiled in).
std::filesystem::path data_dir();
// Names of the chip descriptions and system descriptions found in data/arch.
std::vector<std::string> list_chips();
std::vector<std::string> list_systems();

}  // namespace tern::arch
