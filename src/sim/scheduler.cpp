// The scheduler: a program's first run orders its instructions across
// engines and cores by the timing model (cost.h, the DMA model), handing
// each to the functional model (functional.h), and records the run for
// replays (recording.h).
#include <algorithm>
#include <array>
#include <exception>
#include <limits>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "sim/check.h"
#include "sim/codec.h"
#include "sim/cost.h"
#include "sim/functional.h"
#include "sim/recording.h"
#include "util/error.h"

namespace tern::sim {

namespace {

// Bounding box of an operand: (memory, first..last row, first..last byte).
struct Box {
  Mem mem;
  std::int64_t r0, r1, b0, b1;
};
Box box(const AccessPattern& ap) {
  if (ap.mem == Mem::hbm) return {ap.mem, 0, 1, ap.min_byte(), ap.max_byte()};
  return {ap.mem, ap.start_partition, ap.start_partition + ap.partitions, ap.min_byte(),
          ap.max_byte()};
}
bool overlap(const Box& a, const Box& b) {
  return a.mem == b.mem && a.r0 < b.r1 && b.r0 < a.r1 && a.b0 < b.b1 && b.b0 < a.b1;
}

// Instructions of an engine's sequencer (no data path).
bool sequencer_op(Opcode op) {
  return op == Opcode::reg_set || op == Opcode::reg_alu || op == Opcode::branch ||
         op == Opcode::core_sync;
}

// Runs a register instruction; returns whether a branch is taken.
bool sequencer(std::vector<std::int32_t>& r, const Instruction& in) {
  auto reg = [&](int i) -> std::int64_t { return r[static_cast<std::size_t>(i)]; };
  auto alu = [&](std::int64_t a, std::int64_t b) {
    return isa::apply_alu_int(in.alu0, a, b, true);
  };
  const auto imm = static_cast<std::int64_t>(in.imm0);
  switch (in.op) {
    case Opcode::reg_set:
      r[static_cast<std::size_t>(in.rd)] = static_cast<std::int32_t>(imm);
      return false;
    case Opcode::reg_alu:
      // 32-bit registers: the result wraps around like the hardware's.
      r[static_cast<std::size_t>(in.rd)] = static_cast<std::int32_t>(
          static_cast<std::uint32_t>(alu(reg(in.ra), in.rb >= 0 ? reg(in.rb) : imm)));
      return false;
    case Opcode::branch:
      return in.ra < 0 || alu(reg(in.ra), imm) != 0;
    default:
      return false;
  }
}

std::string detail(const Instruction& in) {
  std::string s;
  for (std::size_t i = 0; i < in.operands.size(); ++i) {
    const auto& ap = in.operands[i];
    s += fmt::format("{}{}[{},{}] {}", i ? ", " : "", isa::mem_name(ap.mem), ap.rows(),
                     ap.free_size(), isa::name(ap.dtype));
  }
  return s;
}

}  // namespace

// One simulated run: each engine's next instruction, the semaphores' signal
// times, the DMA queues; the loop takes the instruction that can start
// first, times it, records it and hands it to the functional model.
struct Simulator::Schedule {
  struct EngineState {
    std::size_t pc = 0;  // next instruction of the stream
    double free_at = 0;
    double ls_end = 0, mm_start = 0, mm_end = 0;  // Tensor engine: background weight load
    std::vector<std::int32_t> regs;               // the sequencer's registers
    bool has_prev = false;                        // the previous executed instruction's
    Box prev_dst{};                               // destination (static-overhead rule)
  };
  Simulator& sim;
  const Options& opt;
  const isa::Program& p;
  const int ncores;
  const bool data;
  Impl impl;
  RunStats& st;
  const CostModel cost;
  DmaModel dma;
  std::vector<std::array<EngineState, isa::kEngines>> eng;
  // Per core: when its last Vector instruction in the performance mode that
  // takes the bus Vector shares with GpSimd ends (cost.h).
  std::vector<double> shared_bus_end;
  // Per core and semaphore: the times of its signals, ascending.
  std::vector<std::vector<std::vector<double>>> sem;
  // Recorded for later runs (null when not replayable), with each core's
  // HBM writes and reads (bounding bytes) to tell whether cores can replay
  // independently.
  std::shared_ptr<Recording> rec;
  std::vector<Ranges> hbm_writes, hbm_reads;

  Schedule(Simulator& s, const Options& o, bool record)
      : sim(s),
        opt(o),
        p(*s.program_),
        ncores(static_cast<int>(p.cores.size())),
        data(o.mode != Mode::timing),
        impl(s, o),
        st(impl.stats),
        cost(s.chip_),
        dma(s.chip_, ncores),
        eng(static_cast<std::size_t>(ncores)),
        shared_bus_end(static_cast<std::size_t>(ncores), 0.0),
        sem(static_cast<std::size_t>(ncores),
            std::vector<std::vector<double>>(static_cast<std::size_t>(p.semaphores))),
        rec(record ? std::make_shared<Recording>() : nullptr),
        hbm_writes(static_cast<std::size_t>(ncores)),
        hbm_reads(static_cast<std::size_t>(ncores)) {
    impl.set_cores(ncores);
    st.engines.resize(static_cast<std::size_t>(ncores));
    for (auto& core : eng)
      for (auto& es : core)
        es.regs.assign(static_cast<std::size_t>(sim.chip_.sequencer.registers), 0);
  }

  std::int64_t target_of(int c, int e, const isa::SemWait& w) const {
    return w.value + (w.reg >= 0 ? eng[c][e].regs[static_cast<std::size_t>(w.reg)] : 0);
  }
  // Whether every wait of `in` is signalled; t becomes the latest signal.
  bool wait_ready(int c, int e, const Instruction& in, double& t) const {
    for (const auto& w : in.waits) {
      const std::int64_t v = target_of(c, e, w);
      const auto& times = sem[w.core >= 0 ? w.core : c][w.sem];
      if (v <= 0) continue;
      if (static_cast<std::int64_t>(times.size()) < v) return false;
      t = std::max(t, times[static_cast<std::size_t>(v - 1)]);
    }
    return true;
  }
  // When `in` can start on engine e of core c (false: it waits for a signal).
  bool earliest(int c, int e, const Instruction& in, double& t) const {
    const EngineState& es = eng[c][e];
    t = es.free_at;
    if (e == static_cast<int>(Engine::tensor)) {
      if (in.op == Opcode::load_stationary)
        t = std::max(es.ls_end, es.mm_start);
      else
        t = std::max(es.mm_end, es.ls_end);
    }
    // The Vector performance mode and GpSimd's compute take turns on their
    // shared SBUF bus (NKI Trainium2 guide: the hardware arbitrates).
    if (e == static_cast<int>(Engine::gpsimd) && !isa::is_dma(in.op) && !sequencer_op(in.op))
      t = std::max(t, shared_bus_end[static_cast<std::size_t>(c)]);
    else if (e == static_cast<int>(Engine::vector) && cost.takes_gpsimd_bus(in))
      t = std::max(t, eng[c][static_cast<int>(Engine::gpsimd)].free_at);
    return wait_ready(c, e, in, t);
  }

  // The instruction that can start first (ties: the lowest core, then
  // engine); false when every stream is done. Throws on a deadlock.
  bool next(int& bc, int& be, double& bt) const {
    bc = be = -1;
    bt = std::numeric_limits<double>::infinity();
    bool remaining = false;
    for (int c = 0; c < ncores; ++c) {
      for (int e = 0; e < isa::kEngines; ++e) {
        const auto& stream = p.cores[c].streams[e];
        if (eng[c][e].pc >= stream.size()) continue;
        remaining = true;
        double t;
        if (earliest(c, e, stream[eng[c][e].pc], t) && t < bt) {
          bt = t;
          bc = c;
          be = e;
        }
      }
    }
    if (remaining && bc < 0) deadlock();
    return remaining;
  }

  // Every remaining instruction waits for a signal that never comes.
  [[noreturn]] void deadlock() const {
    std::string blocked;
    for (int c = 0; c < ncores; ++c) {
      for (int e = 0; e < isa::kEngines; ++e) {
        const auto& stream = p.cores[c].streams[e];
        if (eng[c][e].pc >= stream.size()) continue;
        const Instruction& in = stream[eng[c][e].pc];
        for (const auto& w : in.waits) {
          const std::int64_t v = target_of(c, e, w);
          const int wc = w.core >= 0 ? w.core : c;
          if (static_cast<std::int64_t>(sem[wc][w.sem].size()) < v) {
            const std::string whose = wc == c ? "" : fmt::format("core {}'s ", wc);
            blocked += fmt::format("{}{} waits for {}semaphore {} >= {} (it only reaches {})",
                                   blocked.empty() ? "" : "; ", where(c, in, eng[c][e].pc), whose,
                                   w.sem, v, sem[wc][w.sem].size());
            break;
          }
        }
      }
    }
    throw Error("deadlock: " + blocked);
  }

  // Register-addressed operands take this moment's register values, and
  // are checked now that their addresses are known: `resolved` holds them.
  const Instruction* resolve(int c, const EngineState& es, const Instruction* in, std::size_t index,
                             Instruction& resolved) const {
    if (std::none_of(in->operands.begin(), in->operands.end(),
                     [](const AccessPattern& ap) { return ap.offset_reg >= 0; }))
      return in;
    resolved = *in;
    for (auto& ap : resolved.operands) {
      if (ap.offset_reg >= 0)
        ap = isa::resolve(ap, es.regs[static_cast<std::size_t>(ap.offset_reg)]);
    }
    if (const std::string err = check_instruction(sim.chip_, p, resolved); !err.empty())
      throw Error(fmt::format("{}: {}", where(c, resolved, index), err));
    return &resolved;
  }

  double time_sequencer(int c, int e, const Instruction& in, std::size_t index, double start,
                        std::size_t& next_pc);
  double time_dma(int c, int e, const Instruction& in, double start, std::string& track);
  double time_compute(int c, int e, const Instruction& in, double start);
  void record(int c, std::size_t index, const Instruction& in, bool was_resolved,
              const Instruction& resolved);
  void execute(int c, const Instruction& in, std::size_t index, double start, double end,
               const std::string& track);
  // Whether the recorded cores may replay on their own, and each one's steps.
  void finish_recording();
};

// reg_set, reg_alu, branch, core_sync: the sequencer's registers and
// program counter.
double Simulator::Schedule::time_sequencer(int c, int e, const Instruction& in, std::size_t index,
                                           double start, std::size_t& next_pc) {
  EngineState& es = eng[c][e];
  const double end = start + cost.duration_ns(in, false);
  try {
    if (sequencer(es.regs, in)) next_pc = static_cast<std::size_t>(in.target);
  } catch (const Error& err) {
    throw Error(fmt::format("{}: {}", where(c, in, index), err.what()));
  }
  if (e == static_cast<int>(Engine::tensor)) {
    es.mm_end = end;
    es.ls_end = std::max(es.ls_end, end);
  } else {
    es.free_at = end;
  }
  return end;
}

// A DMA trigger: the transfer's time comes from the DMA model.
double Simulator::Schedule::time_dma(int c, int e, const Instruction& in, double start,
                                     std::string& track) {
  EngineState& es = eng[c][e];
  const double end = dma.transfer(c, in, start);
  // Triggering a DMA costs the engine no time, but its stream stays in
  // order: a later instruction of this engine cannot start before this
  // trigger did (the builder elides waits an engine already made on the
  // strength of that order).
  es.free_at = std::max(es.free_at, start);
  track = fmt::format("dma q{}", in.queue);
  ++st.dma_transfers;
  if (isa::is_indirect_dma(in.op)) {
    // The rows the indices select, not the whole HBM view (the index
    // tile is SBUF); an accumulating scatter reads and writes them.
    const std::int64_t rows = isa::indirect_hbm_bytes(in);
    st.dma_bytes += in.op == Opcode::dma_gather ? in.operands[0].bytes() : rows;
    st.hbm_bytes += rows * (in.op == Opcode::dma_scatter && in.accumulate ? 2 : 1);
  } else {
    st.dma_bytes += in.operands[0].bytes();
    for (const auto& ap : in.operands)
      if (ap.mem == Mem::hbm) st.hbm_bytes += ap.bytes();
    if (in.accumulate && in.operands[0].mem == Mem::hbm)
      st.hbm_bytes += in.operands[0].bytes();  // read-modify-write
  }
  return end;
}

// A compute instruction: its cost (cost.h), the Tensor engine's background
// weight load, and the FLOPs of a matmul.
double Simulator::Schedule::time_compute(int c, int e, const Instruction& in, double start) {
  EngineState& es = eng[c][e];
  // A same-engine dependency on the previous instruction pays the static overhead.
  bool dependent = false;
  if (es.has_prev && e != static_cast<int>(Engine::tensor)) {
    for (std::size_t i = 1; i < in.operands.size(); ++i)
      dependent |= overlap(es.prev_dst, box(in.operands[i]));
  }
  es.has_prev = true;
  es.prev_dst = box(in.operands[0]);
  const double dur = cost.duration_ns(in, dependent);
  const double end = start + dur;
  if (in.op == Opcode::load_stationary) {
    es.ls_end = end;
  } else if (e == static_cast<int>(Engine::tensor)) {
    if (in.op == Opcode::multiply_moving) es.mm_start = start;
    es.mm_end = end;
    if (in.op == Opcode::transpose) es.ls_end = end;
    st.engines[c][e].busy_ns += dur;
  } else {
    es.free_at = end;
    st.engines[c][e].busy_ns += dur;
    if (e == static_cast<int>(Engine::vector) && cost.takes_gpsimd_bus(in))
      shared_bus_end[static_cast<std::size_t>(c)] = end;
  }
  if (in.op == Opcode::multiply_moving) {
    const auto& mv = in.operands[1];
    const bool dr = in.perf == isa::PerfMode::double_row;
    const double k = mv.partitions * (isa::is_x4(mv.dtype) ? 4.0 : dr ? 2.0 : 1.0);
    st.tensor_flops[std::string(isa::name(mv.dtype))] +=
        2.0 * k * static_cast<double>(in.operands[0].free_size()) * in.operands[0].partitions;
  }
  return end;
}

// The step for replays, and the HBM bytes it writes and reads.
void Simulator::Schedule::record(int c, std::size_t index, const Instruction& in, bool was_resolved,
                                 const Instruction& resolved) {
  if (!rec || in.operands.empty()) return;
  const Instruction* kept = was_resolved ? &rec->resolved.emplace_back(resolved) : &in;
  rec->steps.push_back({c, index, impl.serial, kept});
  // A gather that skips rows leaves SBUF slots unwritten, a scatter that
  // skips leaves them unread: which depends on the indices.
  if (isa::is_indirect_dma(in.op) && in.oob_skip) rec->data_dependent_writes = true;
  for (std::size_t i = 0; i < in.operands.size(); ++i) {
    const AccessPattern& ap = in.operands[i];
    if (ap.mem != Mem::hbm) continue;
    // Operand 0 is a DMA's destination; the others are read. Each row
    // counts by the bytes its elements span (cores often write column
    // blocks of one tensor); an indirect DMA's rows are chosen by data,
    // so it counts by its whole view.
    Ranges& to = (i == 0 ? hbm_writes : hbm_reads)[static_cast<std::size_t>(c)];
    if (isa::is_indirect_dma(in.op)) {
      to.emplace_back(ap.min_byte(), ap.max_byte());
      continue;
    }
    const Walk& w = impl.walk(ap);
    for (int r = 0; r < ap.rows(); ++r) {
      const std::int64_t row = ap.row_address(r);
      to.emplace_back(row + w.lo, row + w.hi);
    }
  }
}

// The instruction's effect on the memories, its signals, the run's end
// and its trace event.
void Simulator::Schedule::execute(int c, const Instruction& in, std::size_t index, double start,
                                  double end, const std::string& track) {
  try {
    impl.tensor_state(c, in);
    if (data) impl.execute(c, in);
  } catch (const Error& err) {
    throw Error(fmt::format("{}: {}", where(c, in, index), err.what()));
  }
  ++impl.serial;
  for (int sg : in.signals) {
    auto& times = sem[c][sg];
    times.insert(std::upper_bound(times.begin(), times.end(), end), end);
  }
  st.latency_ns = std::max(st.latency_ns, end);
  if (opt.trace)
    st.events.push_back(
        {c, track, std::string(isa::opcode_name(in.op)), start, end - start, detail(in)});
}

void Simulator::Schedule::finish_recording() {
  rec->program = sim.program_;
  rec->stats = st;
  std::vector<Ranges> writes(static_cast<std::size_t>(ncores)),
      touched(static_cast<std::size_t>(ncores));
  for (std::size_t c = 0; c < writes.size(); ++c) {
    Ranges all = hbm_writes[c];
    all.insert(all.end(), hbm_reads[c].begin(), hbm_reads[c].end());
    writes[c] = merged(std::move(hbm_writes[c]));
    touched[c] = merged(std::move(all));
  }
  rec->cores_independent = true;
  for (const auto& core : p.cores)  // cores that wait for or write each other replay in order
    for (const auto& stream : core.streams)
      for (const auto& ins : stream) {
        if (ins.peer_core >= 0) rec->cores_independent = false;
        for (const auto& w : ins.waits)
          if (w.core >= 0) rec->cores_independent = false;
      }
  for (std::size_t a = 0; a < writes.size(); ++a)
    for (std::size_t b = 0; b < writes.size(); ++b)
      if (a != b && intersect(writes[a], touched[b])) rec->cores_independent = false;
  rec->per_core.resize(static_cast<std::size_t>(ncores));
  rec->core_work.assign(static_cast<std::size_t>(ncores), 0);
  for (const auto& step : rec->steps) {
    rec->per_core[static_cast<std::size_t>(step.core)].push_back(step);
    for (const auto& ap : step.in->operands)
      rec->core_work[static_cast<std::size_t>(step.core)] += ap.elements();
  }
}

RunStats Simulator::run(const Options& opt) {
  if (!loaded_) throw Error("no program loaded");
  const isa::Program& p = *program_;
  const int ncores = static_cast<int>(p.cores.size());
  const bool data = opt.mode != Mode::timing;
  if (data) {
    // Never shrunk: a later program with more cores reuses the memories.
    if (static_cast<int>(sbuf_.size()) < ncores) {
      sbuf_.resize(static_cast<std::size_t>(ncores));
      psum_.resize(static_cast<std::size_t>(ncores));
    }
    for (int c = 0; c < ncores; ++c) {
      if (sbuf_[c].partitions() == 0) {
        sbuf_[c] = Sram(chip_.sbuf_partitions, chip_.sbuf_partition_bytes.value(), true);
        psum_[c] = Sram(chip_.psum_partitions, chip_.psum_partition_bytes.value(), true);
      }
    }
  }
  // The walks of a training step's programs are a few thousand; a bound
  // keeps a long session of ever-new shapes from growing without end.
  if (walks_->size() > 65536 || walks_->bytes() > (std::size_t{256} << 20)) walks_->clear();
  const bool replayable = data && !opt.trace;
  if (replayable) {
    if (const auto it = recordings_.find(program_.get()); it != recordings_.end()) {
      const Recording& rec = *it->second;
      if (rec.program.lock() == program_ && rec.stats.instructions <= opt.max_instructions) {
        // The flags a wrapping mark must clear: a replay sets SBUF/PSUM
        // flags only when its writes depend on data.
        if (rec.data_dependent_writes) {
          sbuf_used_ = std::max(sbuf_used_, rec.stats.sbuf_high_water);
          psum_used_ = std::max(psum_used_, rec.stats.psum_high_water);
        }
        return replay(rec, opt);
      }
    }
  }
  // This run is recorded for later ones.
  if (data) hbm_.storage(), hbm_.flags();
  Schedule sc(*this, opt, replayable);
  if (sc.rec)
    for (const Region& r : hbm_.regions()) sc.rec->host_written.push_back(r.host_written);
  RunStats& st = sc.st;
  std::int64_t executed = 0;
  int c, e;
  double start;
  while (sc.next(c, e, start)) {
    if (++executed > opt.max_instructions) {
      throw Error(
          fmt::format("stopped after {} instructions (Options::max_instructions): a loop "
                      "that never ends?",
                      opt.max_instructions));
    }
    Schedule::EngineState& es = sc.eng[c][e];
    const std::size_t index = es.pc;
    std::size_t next_pc = index + 1;
    Instruction resolved;
    const Instruction* inp = sc.resolve(c, es, &p.cores[c].streams[e][index], index, resolved);
    const Instruction& in = *inp;
    std::string track(isa::engine_name(in.engine));
    double end;
    if (sequencer_op(in.op)) {
      end = sc.time_sequencer(c, e, in, index, start, next_pc);
    } else if (isa::is_dma(in.op)) {
      end = sc.time_dma(c, e, in, start, track);
    } else {
      end = sc.time_compute(c, e, in, start);
    }
    es.pc = next_pc;
    ++st.engines[c][e].instructions;
    for (const auto& ap : in.operands) {
      if (ap.mem == Mem::sbuf) st.sbuf_high_water = std::max(st.sbuf_high_water, ap.max_byte());
      if (ap.mem == Mem::psum) st.psum_high_water = std::max(st.psum_high_water, ap.max_byte());
    }
    // What the flags' clear at the mark's wrap-around must cover (before
    // the instruction runs: it may throw).
    sbuf_used_ = std::max(sbuf_used_, st.sbuf_high_water);
    psum_used_ = std::max(psum_used_, st.psum_high_water);
    sc.record(c, index, in, inp == &resolved, resolved);
    sc.execute(c, in, index, start, end, track);
  }
  st.instructions = executed;
  st.dma_engine_busy_ns = sc.dma.busy_ns();
  if (sc.rec) {
    sc.finish_recording();
    std::erase_if(recordings_, [](const auto& kv) { return kv.second->program.expired(); });
    recordings_[program_.get()] = sc.rec;
  }
  return st;
}

}  // namespace tern::sim
