#include "profile/profile.h"

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <unistd.h>

#include "util/error.h"
#include "util/file.h"

namespace tern::profile {

using nlohmann::json;

namespace {
// Dtype names the Tensor engine peak table knows ("bf16", "fp8", ...).
std::string peak_key(const std::string& nki_name) {
  if (nki_name == "float32") return "fp32";
  if (nki_name == "tfloat32") return "tf32";
  if (nki_name == "bfloat16") return "bf16";
  if (nki_name == "float16") return "fp16";
  if (nki_name.ends_with("_x4")) return nki_name.starts_with("float4") ? "mxfp4" : "mxfp8";
  return "fp8";  // the float8 types
}
}  // namespace

json chrome_trace(const sim::RunStats& st, const arch::ChipSpec& chip) {
  json events = json::array();
  std::map<std::pair<int, std::string>, int> tids;
  auto tid = [&](int core, const std::string& track) {
    const auto key = std::make_pair(core, track);
    auto it = tids.find(key);
    if (it != tids.end()) return it->second;
    // Engines first, then DMA queues in order.
    int id = 100;
    const char* engines[] = {"tensor", "vector", "scalar", "gpsimd", "sync"};
    for (int e = 0; e < 5; ++e)
      if (track == engines[e]) id = e;
    if (track.starts_with("dma q")) id = 10 + std::stoi(track.substr(5));
    tids[key] = id;
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", core},
                      {"tid", id},
                      {"args", {{"name", track}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", core},
                      {"tid", id},
                      {"args", {{"sort_index", id}}}});
    return id;
  };
  for (std::size_t c = 0; c < st.engines.size(); ++c) {
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", c},
                      {"tid", 0},
                      {"args", {{"name", fmt::format("{} core {}", chip.name, c)}}}});
  }
  for (const auto& e : st.events) {
    events.push_back({{"ph", "X"},
                      {"name", e.name},
                      {"cat", e.track.starts_with("dma") ? "dma" : "compute"},
                      {"pid", e.core},
                      {"tid", tid(e.core, e.track)},
                      {"ts", e.start_ns / 1e3},
                      {"dur", e.dur_ns / 1e3},
                      {"args", {{"operands", e.detail}}}});
  }
  return {{"traceEvents", events},
          {"displayTimeUnit", "ns"},
          {"otherData", {{"chip", chip.name}, {"latency_us", st.latency_ns / 1e3}}}};
}

void write_trace(const sim::RunStats& st, const arch::ChipSpec& chip, const std::string& path) {
  write_file_atomic(path, chrome_trace(st, chip).dump() + "\n");
}

json chrome_trace(const std::vector<Span>& spans) {
  json events = json::array();
  std::map<int, std::map<std::string, int>> tids;  // per process: track -> tid
  for (const Span& s : spans) {
    auto& tracks = tids[s.process];
    if (tracks.empty()) {
      events.push_back({{"ph", "M"},
                        {"name", "process_name"},
                        {"pid", s.process},
                        {"tid", 0},
                        {"args", {{"name", s.process_name}}}});
      events.push_back({{"ph", "M"},
                        {"name", "process_sort_index"},
                        {"pid", s.process},
                        {"tid", 0},
                        {"args", {{"sort_index", s.process}}}});
    }
    auto it = tracks.find(s.track);
    if (it == tracks.end()) {
      const int id = static_cast<int>(tracks.size()) + 1;
      it = tracks.emplace(s.track, id).first;
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", s.process},
                        {"tid", id},
                        {"args", {{"name", s.track}}}});
    }
    events.push_back({{"ph", "X"},
                      {"name", s.name},
                      {"cat", s.track},
                      {"pid", s.process},
                      {"tid", it->second},
                      {"ts", s.start_ns / 1e3},
                      {"dur", s.dur_ns / 1e3},
                      {"args", s.args}});
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ns"}};
}

void write_trace(const std::vector<Span>& spans, const std::string& path) {
  write_file_atomic(path, chrome_trace(spans).dump() + "\n");
}

Summary summarize(const sim::RunStats& st, const arch::ChipSpec& chip) {
  Summary s;
  s.latency_ns = st.latency_ns;
  s.cores = static_cast<int>(st.engines.size());
  s.instructions = st.instructions;
  const char* names[] = {"tensor", "vector", "scalar", "gpsimd", "sync"};
  for (const auto& core : st.engines) {
    std::map<std::string, double> busy;
    for (int e = 0; e < 4; ++e)
      busy[names[e]] = st.latency_ns > 0 ? 100.0 * core[e].busy_ns / st.latency_ns : 0;
    s.engine_busy_percent.push_back(busy);
  }
  const double secs = st.latency_ns * 1e-9;
  for (const auto& [dt, flops] : st.tensor_flops) {
    DtypeUse u;
    u.flops = flops;
    u.tflops = secs > 0 ? flops / secs / 1e12 : 0;
    const std::string key = peak_key(dt);
    if (chip.supports(key)) {
      const double peak = chip.tensor_peak_per_core(key).value() * s.cores;
      u.peak_percent = secs > 0 ? 100.0 * flops / secs / peak : 0;
    }
    s.tensor[dt] = u;
  }
  s.hbm_bytes = st.hbm_bytes;
  s.hbm_gbps = st.latency_ns > 0 ? static_cast<double>(st.hbm_bytes) / st.latency_ns : 0;
  s.hbm_peak_percent = 100.0 * s.hbm_gbps / chip.hbm_bandwidth.value();
  s.dma_bytes = st.dma_bytes;
  s.dma_transfers = st.dma_transfers;
  const double payload_ns = static_cast<double>(st.dma_bytes) / chip.dma.engine_bandwidth.value();
  s.dma_efficiency_percent =
      st.dma_engine_busy_ns > 0 ? 100.0 * payload_ns / st.dma_engine_busy_ns : 0;
  s.sbuf_high_water = st.sbuf_high_water;
  s.psum_high_water = st.psum_high_water;
  return s;
}

json to_json(const Summary& s) {
  json tensor = json::object();
  for (const auto& [dt, u] : s.tensor) {
    tensor[dt] = {{"flops", u.flops}, {"tflops", u.tflops}, {"peak_percent", u.peak_percent}};
  }
  return {{"latency_ns", s.latency_ns},
          {"latency_us", s.latency_ns / 1e3},
          {"cores", s.cores},
          {"instructions", s.instructions},
          {"engine_busy_percent", s.engine_busy_percent},
          {"tensor", tensor},
          {"hbm_bytes", s.hbm_bytes},
          {"hbm_gbps", s.hbm_gbps},
          {"hbm_peak_percent", s.hbm_peak_percent},
          {"dma_bytes", s.dma_bytes},
          {"dma_transfers", s.dma_transfers},
          {"dma_efficiency_percent", s.dma_efficiency_percent},
          {"sbuf_high_water_bytes_per_partition", s.sbuf_high_water},
          {"psum_high_water_bytes_per_partition", s.psum_high_water}};
}

std::string to_text(const Summary& s) {
  std::string out =
      fmt::format("latency          {:.3f} us ({} instructions on {} core{})\n", s.latency_ns / 1e3,
                  s.instructions, s.cores, s.cores == 1 ? "" : "s");
  for (const auto& [dt, u] : s.tensor) {
    out += fmt::format("tensor {:<17} {:.1f} TFLOPS, {:.1f} % of peak\n", dt, u.tflops,
                       u.peak_percent);
  }
  out += fmt::format("HBM              {:.2f} MB, {:.1f} GB/s, {:.1f} % of peak\n",
                     static_cast<double>(s.hbm_bytes) / 1e6, s.hbm_gbps, s.hbm_peak_percent);
  out += fmt::format("DMA              {} transfers, {:.2f} MB, {:.1f} % efficiency\n",
                     s.dma_transfers, static_cast<double>(s.dma_bytes) / 1e6,
                     s.dma_efficiency_percent);
  out += fmt::format("SBUF / PSUM      {:.1f} KiB / {:.1f} KiB per partition (high-water)\n",
                     static_cast<double>(s.sbuf_high_water) / 1024.0,
                     static_cast<double>(s.psum_high_water) / 1024.0);
  for (std::size_t c = 0; c < s.engine_busy_percent.size(); ++c) {
    const auto& b = s.engine_busy_percent[c];
    out += fmt::format(
        "core {} busy      tensor {:.1f} %, vector {:.1f} %, scalar {:.1f} %, gpsimd {:.1f} %\n", c,
        b.at("tensor"), b.at("vector"), b.at("scalar"), b.at("gpsimd"));
  }
  return out;
}

}  // namespace tern::profile
