// The simulated chip: runs a Program bit-exactly (functional model) and
// says how long it takes (timing model), checking the hardware's rules.
//
// Timing is discrete-event at instruction granularity (docs/sim.md): each
// engine runs its stream in order at its clock; semaphores order engines;
// DMA transfers are split across the core's DMA engines, each a FIFO with a
// fixed latency and a per-engine bandwidth; HBM bandwidth is shared by all
// cores of the chip. Every cost parameter comes from data/arch/<chip>.toml.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "arch/chip.h"
#include "isa/program.h"
#include "sim/memory.h"
#include "sim/walk.h"
#include "util/units.h"

namespace tern::sim {

// The host threads a simulation started from the calling thread may use
// when Options::threads is 0: OpenMP's default (OMP_NUM_THREADS, else the
// host's cores), or what set_host_threads gave this thread. A caller that
// runs simulations on several threads of its own gives each its share, so
// that the host is not oversubscribed (OpenMP's waiting threads spin).
int host_threads();
void set_host_threads(int n);  // n >= 1

enum class Mode : std::uint8_t {
  both,        // compute data and time
  functional,  // data only (times are still computed: they decide nothing)
  timing,      // time only: no data is read or written (large shapes)
};
Mode parse_mode(std::string_view s);

struct Options {
  Mode mode = Mode::both;
  bool trace = false;                // record events for the profile
  bool stochastic_rounding = false;  // engine output casts round stochastically
  std::uint64_t seed = 0;            // stochastic rounding stream
  // A program that loops forever stops with an error after this many
  // executed instructions.
  std::int64_t max_instructions = 2'000'000'000;
  // Host threads for the functional model's arithmetic and the replay of
  // independent cores (0: host_threads()). Results are bit-identical for
  // any value.
  int threads = 0;
  // Reads of SBUF/PSUM bytes no instruction wrote return what the memory
  // holds (as the hardware does; NKI kernels may read padding they later
  // ignore) instead of stopping the run with an error.
  bool uninitialized_reads = false;
};

// One span on a timeline track (engine or DMA queue of a core).
struct TraceEvent {
  int core = 0;
  std::string track;  // "tensor", "vector", ..., "dma q3"
  std::string name;   // opcode
  double start_ns = 0, dur_ns = 0;
  std::string detail;  // shapes and dtypes
};

struct EngineUse {
  double busy_ns = 0;
  std::int64_t instructions = 0;
};

struct RunStats {
  double latency_ns = 0;
  std::vector<std::array<EngineUse, isa::kEngines>> engines;  // per core
  std::map<std::string, double> tensor_flops;                 // FLOP by matmul input dtype
  std::int64_t hbm_bytes = 0;                                 // bytes read + written in HBM
  std::int64_t dma_bytes = 0;
  std::int64_t dma_transfers = 0;
  double dma_engine_busy_ns = 0;  // summed over the DMA engines
  std::int64_t dma_payload_ns_x_bw = 0;
  std::int64_t sbuf_high_water = 0;  // highest byte offset used in a partition
  std::int64_t psum_high_water = 0;
  std::int64_t instructions = 0;
  // 0: this run simulated timing; else it replayed its program's first run
  // (Simulator::run) on this many host threads.
  int replay_threads = 0;
  std::vector<TraceEvent> events;
};

class Simulator {
 public:
  explicit Simulator(arch::ChipSpec chip);
  const arch::ChipSpec& chip() const { return chip_; }

  // Checks the program against the chip (core count, semaphores, tensors)
  // and declares its HBM tensors (zeroed and never written until written
  // or bound).
  void load(const isa::Program& p);
  // The same without copying the program: it stays the caller's and must
  // outlive the runs (a runtime Session's executable). `checked`: the caller
  // loaded this very program before, so its rule checks passed already.
  void load_shared(std::shared_ptr<const isa::Program> p, bool checked = false);

  // Runs on `bytes` in place of the tensor's own memory (a runtime's device
  // memory: no copy in or out), until the next load. `filled`: the bytes
  // hold the tensor's data (an input); otherwise every byte counts as never
  // written until the program writes it (an output). `bytes` must hold the
  // tensor's size and outlive the runs; distinct tensors bound to
  // overlapping bytes are the caller's to avoid.
  void bind(const std::string& tensor, std::span<std::uint8_t> bytes, bool filled);

  // Input data: values are encoded into the tensor's dtype (RNE).
  void write(const std::string& tensor, std::span<const float> values);
  // Raw bytes in the tensor's dtype.
  void write_bytes(const std::string& tensor, std::span<const std::uint8_t> bytes);
  // The tensor decoded to FP32.
  std::vector<float> read(const std::string& tensor) const;
  // The tensor's raw bytes in its dtype.
  std::vector<std::uint8_t> read_bytes(const std::string& tensor) const;

  // Runs the loaded program. The first run of a program (load_shared's
  // pointer) simulates its timing and records the order its instructions
  // ran in; later runs of it replay that order for the data alone and
  // return the same statistics (timing never depends on data), with cores
  // on host threads when they share no HBM bytes. Results are bit-identical
  // either way. A traced or timing-only run always simulates.
  RunStats run(const Options& opt = {});

 private:
  struct Impl;
  struct Recording;
  struct Schedule;  // one simulated run's timing state (scheduler.cpp)
  RunStats replay(const Recording& rec, const Options& opt);
  arch::ChipSpec chip_;
  std::shared_ptr<const isa::Program> program_;
  Hbm hbm_;
  std::vector<Sram> sbuf_, psum_;
  // Written flags: a byte was written by the loaded program when its flag
  // equals mark_ (load() moves the mark on: fresh memory in O(1)).
  std::uint8_t mark_ = 1;
  // The highest SBUF / PSUM byte any run wrote since the flags were last
  // cleared: what the clear at the mark's wrap-around covers.
  std::int64_t sbuf_used_ = 0, psum_used_ = 0;
  bool loaded_ = false;
  // Operand walks by pattern shape, kept across runs (behind a pointer: the
  // cache holds a mutex, and a simulator stays movable).
  std::unique_ptr<WalkCache> walks_ = std::make_unique<WalkCache>();
  // Recorded runs by program (a recording holds its program weakly: a
  // program freed and another allocated at its address is not a match).
  std::map<const isa::Program*, std::shared_ptr<const Recording>> recordings_;
};

}  // namespace tern::sim
