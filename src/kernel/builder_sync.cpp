// Cross-core synchronization in the kernel builder: the instructions behind
// nki.isa core_barrier and sendrecv (see builder.h).
#include <fmt/format.h>

#include "kernel/builder.h"
#include "util/error.h"

namespace tern::kernel {

using isa::Instruction;
using isa::Opcode;

void Builder::core_sync(isa::Engine engine, const std::vector<Tensor>& writes,
                        const std::vector<Tensor>& reads, std::source_location loc) {
  // The Sync engine's semaphore counts DMA queue 0, the PE array streams matmuls:
  // a barrier there waits on GpSimd's sequencer instead.
  if (engine == isa::Engine::tensor || engine == isa::Engine::sync) engine = isa::Engine::gpsimd;
  Instruction in;
  in.op = Opcode::core_sync;
  in.engine = engine;
  for (const auto& t : writes) in.operands.push_back(t.ap);
  for (const auto& t : reads) in.operands.push_back(t.ap);
  in.loc = location(loc);
  record(in, engine_semaphore(engine), writes.size(), false);
  prog_.cores[core_].streams[static_cast<int>(engine)].push_back(std::move(in));
}

void Builder::sync_point(const std::string& key) {
  if (last_signal_.size() <= static_cast<std::size_t>(core_) || last_signal_[core_].first < 0)
    throw Error(fmt::format("sync point '{}' on core {} before any instruction", key, core_));
  if (!sync_points_.emplace(std::make_pair(core_, key), last_signal_[core_]).second)
    throw Error(fmt::format("sync point '{}' twice on core {}", key, core_));
}

void Builder::sync_wait(isa::Engine engine, const std::string& key, const std::vector<int>& peers,
                        const std::vector<Tensor>& writes, std::source_location loc) {
  if (engine == isa::Engine::tensor || engine == isa::Engine::sync) engine = isa::Engine::gpsimd;
  for (int p : peers)
    if (p < 0 || p >= static_cast<int>(prog_.cores.size()))
      throw Error(fmt::format("core {} is outside this kernel's {} cores", p, prog_.cores.size()));
  core_sync(engine, writes, {}, loc);
  const int e = static_cast<int>(engine);
  sync_waits_.push_back({core_, e, prog_.cores[core_].streams[e].size() - 1, key, peers});
}

void Builder::sync_operand(const std::string& key, const Tensor& view) {
  if (!sync_operands_.emplace(std::make_pair(core_, key), view.ap).second)
    throw Error(fmt::format("sync operand '{}' twice on core {}", key, core_));
}

void Builder::dma_to_core(const std::string& dst_key, const Tensor& src, int peer,
                          isa::Engine engine, std::source_location loc) {
  if (peer < 0 || peer >= static_cast<int>(prog_.cores.size()))
    throw Error(fmt::format("core {} is outside this kernel's {} cores", peer, prog_.cores.size()));
  Instruction in;
  in.op = Opcode::dma_copy;
  in.engine = engine;
  in.queue = next_queue_;
  next_queue_ = (next_queue_ + 1) % chip_.dma.queues_per_engine;
  in.loc = location(loc);
  // Only the source is this core's memory: the destination is the peer's
  // (ordered there by its sync_wait on this DMA).
  in.operands = {src.ap};
  record(in, kQueueSemaphore0 + in.queue, 0, false);
  in.operands = {src.ap, src.ap};  // the destination is the peer's, set in finish()
  in.peer_core = peer;
  auto& stream = prog_.cores[core_].streams[static_cast<int>(engine)];
  stream.push_back(std::move(in));
  sync_dmas_.push_back({core_, static_cast<int>(engine), stream.size() - 1, dst_key, {peer}});
}

}  // namespace tern::kernel
