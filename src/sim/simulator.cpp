// The simulator's driver: loading programs and the host's reads and writes
// of their tensors. The scheduler (Simulator::run) is in scheduler.cpp, the
// replay of a recorded run in replay.cpp.
#include "sim/simulator.h"

#include <algorithm>
#include <exception>
#include <limits>

#include <fmt/format.h>
#include <omp.h>

#include "sim/check.h"
#include "sim/codec.h"
#include "sim/functional.h"
#include "util/error.h"

namespace tern::sim {

int host_threads() {
  return std::max(1, omp_get_max_threads());
}

void set_host_threads(int n) {
  omp_set_num_threads(std::max(1, n));
}

Mode parse_mode(std::string_view s) {
  if (s == "both") return Mode::both;
  if (s == "functional") return Mode::functional;
  if (s == "timing") return Mode::timing;
  throw Error(fmt::format("unknown simulation mode '{}': expected both, functional or timing", s));
}

Simulator::Simulator(arch::ChipSpec chip) : chip_(std::move(chip)) {}

void Simulator::load(const isa::Program& p) {
  load_shared(std::make_shared<const isa::Program>(p));
}

void Simulator::load_shared(std::shared_ptr<const isa::Program> shared, bool checked) {
  const isa::Program& p = *shared;
  if (p.cores.empty()) throw Error("the program has no cores");
  if (static_cast<int>(p.cores.size()) > chip_.cores) {
    throw Error(fmt::format("the program uses {} cores but {} has {}", p.cores.size(), chip_.name,
                            chip_.cores));
  }
  if (p.lnc != 1 && p.lnc != 2) throw Error(fmt::format("lnc must be 1 or 2, got {}", p.lnc));
  if (p.lnc == 2 && chip_.core_version < 3) {
    throw Error(fmt::format("LNC=2 needs NeuronCore-v3 or later; {} is {}", chip_.name,
                            chip_.core_generation));
  }
  if (p.cores.size() % static_cast<std::size_t>(p.lnc) != 0) {
    throw Error(fmt::format("LNC={} groups physical cores in pairs, but the program has {} cores",
                            p.lnc, p.cores.size()));
  }
  if (p.arch != chip_.name) {
    throw Error(fmt::format("the program was built for {} but the simulated chip is {}", p.arch,
                            chip_.name));
  }
  if (const std::string e = check_declarations(chip_, p); !e.empty()) throw Error(e);
  for (std::size_t c = 0; c < (checked ? 0 : p.cores.size()); ++c) {
    for (const auto& stream : p.cores[c].streams) {
      for (std::size_t i = 0; i < stream.size(); ++i) {
        if (const std::string e = check_instruction(chip_, p, stream[i]); !e.empty()) {
          throw Error(fmt::format("{}: {}", where(static_cast<int>(c), stream[i], i), e));
        }
        if (stream[i].op == Opcode::branch &&
            static_cast<std::size_t>(stream[i].target) > stream.size()) {
          throw Error(fmt::format(
              "{}: branch target {} is past the end of the {}-instruction stream",
              where(static_cast<int>(c), stream[i], i), stream[i].target, stream.size()));
        }
      }
    }
  }
  hbm_ = Hbm();
  for (const auto& t : p.tensors) hbm_.add(t.name, t.address, t.bytes());
  // A new program starts with fresh SBUF and PSUM: the memories are kept
  // (reallocating 32 MiB a core per launch was half of a small model's
  // training step) and a new mark makes every earlier write stale without
  // touching the flags (clearing them was a fifth of a training step); only
  // when the 8-bit mark wraps are the flags cleared.
  if (++mark_ == 0) {
    mark_ = 1;
    for (Sram& m : sbuf_) m.clear_written(sbuf_used_);
    for (Sram& m : psum_) m.clear_written(psum_used_);
    sbuf_used_ = psum_used_ = 0;
  }
  program_ = std::move(shared);
  loaded_ = true;
}

void Simulator::bind(const std::string& tensor, std::span<std::uint8_t> bytes, bool filled) {
  Region& r = hbm_.by_name(tensor);
  if (static_cast<std::int64_t>(bytes.size()) != r.size) {
    throw Error(fmt::format("tensor '{}' holds {} bytes, got {}", tensor, r.size, bytes.size()));
  }
  r.own.reset();
  r.written.reset();
  r.data = bytes.data();
  r.host_written = filled;
}

void Simulator::write_bytes(const std::string& tensor, std::span<const std::uint8_t> bytes) {
  Region& r = hbm_.by_name(tensor);
  if (static_cast<std::int64_t>(bytes.size()) != r.size) {
    throw Error(fmt::format("tensor '{}' holds {} bytes, got {}", tensor, r.size, bytes.size()));
  }
  std::copy(bytes.begin(), bytes.end(), r.memory());
  r.written.reset();
  r.host_written = true;
}

void Simulator::write(const std::string& tensor, std::span<const float> values) {
  const isa::HbmTensor& t = program_->tensor(tensor);
  if (static_cast<std::int64_t>(values.size()) != t.elements()) {
    throw Error(fmt::format("tensor '{}' has {} elements, got {} values", tensor, t.elements(),
                            values.size()));
  }
  const int sz = isa::size_bytes(t.dtype);
  std::vector<std::int64_t> offs(values.size());
  for (std::size_t i = 0; i < offs.size(); ++i) offs[i] = static_cast<std::int64_t>(i) * sz;
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(t.bytes()));
  encode_row(t.dtype, values.data(), offs, bytes.data(), {}, 0);
  write_bytes(tensor, bytes);
}

std::vector<float> Simulator::read(const std::string& tensor) const {
  const isa::HbmTensor& t = program_->tensor(tensor);
  const Region& r = const_cast<Hbm&>(hbm_).by_name(tensor);
  const int sz = isa::size_bytes(t.dtype);
  std::vector<std::int64_t> offs(static_cast<std::size_t>(t.elements()));
  for (std::size_t i = 0; i < offs.size(); ++i) offs[i] = static_cast<std::int64_t>(i) * sz;
  std::vector<float> out(offs.size());
  if (r.data) decode_row(t.dtype, r.data, offs, out.data());  // else never written: zeros
  return out;
}

std::vector<std::uint8_t> Simulator::read_bytes(const std::string& tensor) const {
  const Region& r = const_cast<Hbm&>(hbm_).by_name(tensor);
  if (!r.data) return std::vector<std::uint8_t>(static_cast<std::size_t>(r.size), 0);
  return {r.data, r.data + r.size};
}

}  // namespace tern::sim
