// Profiles for people: a Perfetto / chrome://tracing trace of a run (one
// process per core, one track per engine and DMA queue) and a summary
// (latency, engine busy %, achieved TFLOPS and % of peak per dtype, HBM
// traffic and % of peak bandwidth, DMA efficiency, SBUF/PSUM high-water).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "arch/chip.h"
#include "sim/simulator.h"

namespace tern::profile {

// Chrome trace event format ("traceEvents" with complete "X" events and
// process/thread name metadata), timestamps in microseconds.
nlohmann::json chrome_trace(const sim::RunStats& st, const arch::ChipSpec& chip);
// Writes the trace atomically.
void write_trace(const sim::RunStats& st, const arch::ChipSpec& chip, const std::string& path);

// One span of a multi-chip timeline (runtime::System): `process` is a chip,
// `track` a thread of it ("compute", "collectives").
struct Span {
  int process = 0;
  std::string process_name, track, name;
  double start_ns = 0, dur_ns = 0;
  nlohmann::json args = nlohmann::json::object();
};
// One process per chip, one thread per track (tracks sorted by first use),
// complete "X" events; timestamps in microseconds.
nlohmann::json chrome_trace(const std::vector<Span>& spans);
void write_trace(const std::vector<Span>& spans, const std::string& path);

struct DtypeUse {
  double flops = 0;
  double tflops = 0;        // achieved over the run's latency
  double peak_percent = 0;  // of the cores' Tensor peak for that dtype (HFU)
};

struct Summary {
  double latency_ns = 0;
  int cores = 0;
  std::int64_t instructions = 0;
  std::vector<std::map<std::string, double>> engine_busy_percent;  // per core, by engine name
  std::map<std::string, DtypeUse> tensor;                          // by input dtype
  std::int64_t hbm_bytes = 0;
  double hbm_gbps = 0, hbm_peak_percent = 0;  // MBU
  std::int64_t dma_bytes = 0, dma_transfers = 0;
  double dma_efficiency_percent = 0;                      // payload time / DMA engine busy time
  std::int64_t sbuf_high_water = 0, psum_high_water = 0;  // bytes per partition
};

Summary summarize(const sim::RunStats& st, const arch::ChipSpec& chip);
nlohmann::json to_json(const Summary& s);
std::string to_text(const Summary& s);

}  // namespace tern::profile
