// Mutation fuzzing of every file reader: each test starts from a valid file,
// mutates it (recomputing its checksum where it has one, so the mutations
// reach the decoder), reads it and uses what it read. A reader must accept
// or reject each input with a tern::Error: a crash, a hang (ctest's
// timeout) or any other exception fails the test. CI runs a fixed seed and
// a bounded count; the benchmark runs more (bench/README.md):
//   TERN_FUZZ_COUNT=10000 build/tests/fuzz/test_fuzz
#include <unistd.h>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include "arch/chip.h"
#include "arch/system.h"
#include "fixtures.h"
#include "graph/text.h"
#include "isa/program.h"
#include "kernel/registry.h"
#include "mutate.h"
#include "plan/estimate.h"
#include "plan/request.h"
#include "sim/simulator.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/shard.h"
#include "util/error.h"
#include "util/file.h"

namespace tern::fuzz {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("tern_fuzz_{}", ::getpid());
  fs::create_directories(dir);
  return dir / name;
}

// Runs `read` on `count` mutations of `seed` made by `mutate`; expects no
// internal error. Returns the outcome (the test states what it expects of
// the accepted / rejected split: both must occur).
Outcome fuzz(const std::string& seed_input, int count,
             const std::function<std::string(Mutator&, const std::string&)>& mutate,
             const std::function<void(const std::string&)>& read) {
  read(seed_input);  // the valid file itself must be accepted
  Outcome o;
  Mutator m(20261201);
  for (int i = 0; i < count; ++i) {
    const std::string input = mutate(m, seed_input);
    try {
      read(input);
      ++o.accepted;
    } catch (const Error&) {
      ++o.rejected;
    } catch (const std::exception& e) {
      o.internal.push_back(fmt::format("input {}: {}", i, e.what()));
    }
  }
  for (std::size_t i = 0; i < o.internal.size() && i < 10; ++i) ADD_FAILURE() << o.internal[i];
  EXPECT_TRUE(o.internal.empty()) << o.internal.size() << " internal errors";
  EXPECT_GT(o.rejected, 0) << "no mutation was rejected: the mutator does nothing?";
  std::printf("%d inputs: %d accepted, %d rejected, %zu internal errors\n", count, o.accepted,
              o.rejected, o.internal.size());
  return o;
}

// What a program reader's output must survive: the simulator's checks,
// then both models on random inputs.
void simulate(const isa::Program& p) {
  sim::Simulator s(trn3());
  s.load(p);
  for (const auto& t : p.tensors)
    if (t.kind == isa::TensorKind::input && t.bytes() <= (1 << 22))
      s.write_bytes(t.name, std::vector<std::uint8_t>(static_cast<std::size_t>(t.bytes()), 0x3c));
  sim::Options o;
  o.mode = sim::Mode::both;
  s.run(o);
}

TEST(Fuzz, ProgramText) {
  fuzz(
      isa::to_text(small_matmul()), fuzz_count(1500),
      [](Mutator& m, const std::string& s) { return m.text(s); },
      [](const std::string& in) { simulate(isa::parse_program_text(in)); });
}

// FNV-1a, as the format's header stores it (an independent copy).
std::string with_program_checksum(std::string s) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (std::size_t i = 20; i < s.size(); ++i)
    h = (h ^ static_cast<std::uint8_t>(s[i])) * 0x100000001B3ull;
  for (int k = 0; k < 8 && s.size() >= 20; ++k)
    s[12 + static_cast<std::size_t>(k)] = static_cast<char>((h >> (8 * k)) & 0xFF);
  return s;
}

TEST(Fuzz, ProgramBinary) {
  const auto b = isa::to_binary(small_matmul());
  fuzz(
      std::string(b.begin(), b.end()), fuzz_count(1500),
      [](Mutator& m, const std::string& s) {
        const std::string t = m.below(2) ? m.word(s, 20) : m.bytes(s);
        return m.below(8) ? with_program_checksum(t) : t;  // now and then a damaged sum
      },
      [](const std::string& in) {
        simulate(isa::parse_program_binary(std::vector<std::uint8_t>(in.begin(), in.end())));
      });
}

// A checkpoint's header and payload mutated, its length field and CRC
// recomputed so the mutations reach the table's decoder.
std::string with_checkpoint_crc(std::string s) {
  if (s.size() < 24) return s;
  s.resize(s.size() - 4);
  const auto c = static_cast<std::uint32_t>(
      ::crc32(0L, reinterpret_cast<const Bytef*>(s.data()), static_cast<uInt>(s.size())));
  s.append(reinterpret_cast<const char*>(&c), 4);
  return s;
}

TEST(Fuzz, Checkpoint) {
  train::Checkpoint ck;
  ck.meta = {{"step", 7}, {"opt_step", 7}, {"recipe", "bf16"}};
  ck.tensors["param/w"] = std::vector<float>(96, 0.25f);
  ck.tensors["param/b"] = std::vector<float>(8, -1.0f);
  ck.tensors["adam/m"] = std::vector<float>(96, 1e-3f);
  const fs::path file = scratch("seed.ckpt");
  train::save_checkpoint(file, ck);
  const std::string seed = read_file(file);
  fuzz(
      seed, fuzz_count(2000),
      [](Mutator& m, const std::string& s) {
        std::uint64_t hlen = 0;
        std::memcpy(&hlen, s.data() + 12, 8);
        std::string out;
        if (m.below(2)) {  // the JSON header as text, its length field updated
          const std::string h = m.text(s.substr(20, hlen));
          const std::uint64_t n = h.size();
          out = s.substr(0, 12) + std::string(reinterpret_cast<const char*>(&n), 8) + h +
                s.substr(20 + hlen);
        } else {
          out = m.below(2) ? m.word(s, 8) : m.bytes(s);
        }
        return m.below(8) ? with_checkpoint_crc(out) : out;
      },
      [&](const std::string& in) {
        write_file_atomic(file, in);
        const train::Checkpoint c = train::load_checkpoint(file);
        std::size_t floats = 0;
        for (const auto& [name, x] : c.tensors) floats += x.size();
        if (floats * 4 > in.size()) throw std::logic_error("more floats than the file holds");
      });
}

TEST(Fuzz, ChipDescription) {
  const std::string seed = read_file(arch::data_dir() / "arch" / "trn3.toml");
  const fs::path file = scratch("chip.toml");
  fuzz(
      seed, fuzz_count(1000), [](Mutator& m, const std::string& s) { return m.text(s); },
      [&](const std::string& in) {
        write_file_atomic(file, in);
        const arch::ChipSpec c = arch::load_chip_file(file);
        // What the chip's numbers feed: the peaks and a kernel's build.
        (void)c.tensor_peak_per_chip("bf16");
        (void)kernel::build_kernel(c, "matmul", {{"m", "128"}, {"n", "128"}, {"k", "128"}});
      });
}

TEST(Fuzz, TrainConfig) {
  const std::string seed =
      "model = \"gpt2\"\nlayers = 2\ndim = 128\nheads = 2\nbatch = 4\nseq = 64\naccum = 1\n"
      "recipe = \"bf16\"\nlr = 0.001\nmin_lr = 0.0001\nwarmup = 10\nsteps = 100\n"
      "weight_decay = 0.1\nclip = 1.0\nnan_rate = 0.0\nspike_z = 4.0\nckpt_every = 10\n"
      "ckpt_dir = \"runs/x\"\n";
  const fs::path file = scratch("train.toml");
  fuzz(
      seed, fuzz_count(2000), [](Mutator& m, const std::string& s) { return m.text(s); },
      [&](const std::string& in) {
        write_file_atomic(file, in);
        train::TrainConfig c;
        train::load_config_file(c, file.string());
        train::validate(c);
      });
}

TEST(Fuzz, PlanRequest) {
  const std::string seed =
      "[model]\npreset = \"llama3-8b\"\nlayers = 32\n[training]\nglobal_batch = 576\n"
      "micro_batch = 1\ntokens = 1e12\n[system]\nname = \"trn3-ultraserver-gen2\"\nchips = 144\n"
      "[layout]\ntp = 8\npp = 2\ndp = 36\nzero = 1\n";
  const fs::path file = scratch("plan.toml");
  fuzz(
      seed, fuzz_count(1000), [](Mutator& m, const std::string& s) { return m.text(s); },
      [&](const std::string& in) {
        write_file_atomic(file, in);
        const plan::Request r = plan::load_request(file);
        const plan::Planner p(arch::load_system(r.system), r.model, r.training, r.chips);
        if (r.layout) (void)p.estimate(*r.layout);
      });
}

TEST(Fuzz, GraphText) {
  const std::string seed = read_file(fs::path(TERN_SOURCE_DIR) / "examples/graphs/mlp.tgraph");
  fuzz(
      seed, fuzz_count(2000), [](Mutator& m, const std::string& s) { return m.text(s); },
      [](const std::string& in) {
        const graph::Graph g = graph::parse(in, "fuzz");
        (void)graph::parse(graph::print(g), "round trip");
      });
}

TEST(Fuzz, TokenShard) {
  const fs::path file = scratch("shard.bin");
  std::vector<std::uint16_t> tokens(300);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>(i * 7);
  train::write_shard(file, tokens);
  const std::string seed = read_file(file);
  fuzz(
      seed, fuzz_count(2000),
      [](Mutator& m, const std::string& s) { return m.below(2) ? m.word(s, 0) : m.bytes(s); },
      [&](const std::string& in) {
        write_file_atomic(file, in);
        const auto t = train::read_shard(file);
        if (t.size() * 2 + 1024 != in.size()) throw std::logic_error("token count off the size");
      });
}

}  // namespace
}  // namespace tern::fuzz
