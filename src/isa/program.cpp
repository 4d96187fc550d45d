#include "isa/program.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <unistd.h>

#include "util/error.h"
#include "util/file.h"

namespace tern::isa {

std::int64_t HbmTensor::elements() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::size_t Program::instruction_count() const {
  std::size_t n = 0;
  for (const auto& c : cores)
    for (const auto& s : c.streams) n += s.size();
  return n;
}

const HbmTensor& Program::tensor(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return t;
  throw Error(fmt::format("the program has no HBM tensor named '{}'", name));
}

std::vector<bool> written_tensors(const Program& p) {
  std::vector<bool> w(p.tensors.size(), false);
  for (const CoreProgram& c : p.cores)
    for (const auto& stream : c.streams)
      for (const Instruction& in : stream) {
        if (in.operands.empty() || in.operands[0].mem != Mem::hbm) continue;
        const AccessPattern& d = in.operands[0];
        if (d.offset_reg >= 0) return std::vector<bool>(p.tensors.size(), true);
        const std::int64_t lo = d.min_byte(), hi = d.max_byte();
        for (std::size_t i = 0; i < p.tensors.size(); ++i) {
          const HbmTensor& t = p.tensors[i];
          if (lo < t.address + t.bytes() && t.address < hi) w[i] = true;
        }
      }
  return w;
}

namespace {
// Version-3 fields (the stream-shuffle table, cross-core DMA and waits):
// written only for instructions that use them.
bool has_v3_fields(const Instruction& in) {
  if (!in.table.empty() || in.peer_core >= 0) return true;
  for (const auto& w : in.waits)
    if (w.core >= 0) return true;
  return false;
}
}  // namespace

namespace {
constexpr const char* kKindNames[] = {"input", "output", "scratch"};
constexpr char kMagic[8] = {'T', 'E', 'R', 'N', 'P', 'R', 'O', 'G'};
}  // namespace

// ------------------------------------------------------------------ text

std::string to_text(const Program& p) {
  std::string s = fmt::format("tern-program {}\narch {}\nsemaphores {}\nlnc {}\n", kProgramVersion,
                              p.arch, p.semaphores, p.lnc);
  for (const auto& t : p.tensors) {
    std::string shape;
    for (auto d : t.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    s += fmt::format("hbm {} {} [{}] {} {}\n", t.name, t.address, shape, name(t.dtype),
                     kKindNames[static_cast<int>(t.kind)]);
  }
  for (std::size_t c = 0; c < p.cores.size(); ++c) {
    s += fmt::format("core {}\n", c);
    for (const auto& stream : p.cores[c].streams)
      for (const auto& in : stream) s += "  " + to_string(in) + "\n";
  }
  return s;
}

Program parse_program_text(const std::string& text) {
  Program p;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  bool header = false;
  try {
    while (std::getline(in, line)) {
      ++lineno;
      const auto first = line.find_first_not_of(' ');
      if (first == std::string::npos || line[first] == '#') continue;
      line = line.substr(first);
      std::istringstream ls(line);
      std::string word;
      ls >> word;
      if (!header) {
        std::uint32_t v = 0;
        if (word != "tern-program" || !(ls >> v)) throw Error("expected 'tern-program <version>'");
        if (v < kProgramMinVersion || v > kProgramVersion)
          throw Error(fmt::format("program format version {} (this tern reads {} to {})", v,
                                  kProgramMinVersion, kProgramVersion));
        header = true;
      } else if (word == "arch") {
        ls >> p.arch;
      } else if (word == "semaphores") {
        if (!(ls >> p.semaphores)) throw Error("expected 'semaphores N' (an int)");
      } else if (word == "lnc") {
        if (!(ls >> p.lnc)) throw Error("expected 'lnc N' (1 or 2)");
      } else if (word == "hbm") {
        HbmTensor t;
        std::string shape, dt, kind;
        ls >> t.name >> t.address >> shape >> dt >> kind;
        if (shape.size() < 2 || shape.front() != '[' || shape.back() != ']')
          throw Error("expected 'hbm NAME ADDRESS [d0,d1,...] DTYPE KIND'");
        std::istringstream ss(shape.substr(1, shape.size() - 2));
        for (std::string d; std::getline(ss, d, ',');) t.shape.push_back(std::stoll(d));
        t.dtype = parse_dtype(dt);
        bool ok = false;
        for (int k = 0; k < 3; ++k)
          if (kind == kKindNames[k]) {
            t.kind = static_cast<TensorKind>(k);
            ok = true;
          }
        if (!ok)
          throw Error(fmt::format("tensor kind '{}': expected input, output or scratch", kind));
        p.tensors.push_back(std::move(t));
      } else if (word == "core") {
        p.cores.emplace_back();
      } else {
        if (p.cores.empty()) throw Error("an instruction before the first 'core' line");
        Instruction ins = parse_instruction(line);
        p.cores.back().streams[static_cast<int>(ins.engine)].push_back(std::move(ins));
      }
    }
  } catch (const Error& e) {
    throw Error(fmt::format("program text line {}: {}", lineno, e.what()));
  } catch (const std::exception& e) {
    throw Error(fmt::format("program text line {}: malformed ({})", lineno, e.what()));
  }
  if (!header) throw Error("not a tern program: missing the 'tern-program <version>' line");
  return p;
}

// ---------------------------------------------------------------- binary

namespace {

class Writer {
 public:
  void u(std::uint64_t v) {  // LEB128
    do {
      std::uint8_t b = v & 0x7F;
      v >>= 7;
      out.push_back(static_cast<std::uint8_t>(b | (v ? 0x80 : 0)));
    } while (v);
  }
  void i(std::int64_t v) {
    u((static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63));
  }
  void f(float v) {
    std::uint32_t b;
    std::memcpy(&b, &v, 4);
    for (int k = 0; k < 4; ++k) out.push_back(static_cast<std::uint8_t>(b >> (8 * k)));
  }
  void s(const std::string& v) {
    u(v.size());
    out.insert(out.end(), v.begin(), v.end());
  }
  std::vector<std::uint8_t> out;
};

class Reader {
 public:
  explicit Reader(const std::vector<std::uint8_t>& b) : b_(b) {}
  std::uint64_t u() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const std::uint8_t x = byte();
      v |= static_cast<std::uint64_t>(x & 0x7F) << shift;
      if (!(x & 0x80)) return v;
    }
    throw Error("corrupt program file: bad integer encoding");
  }
  std::int64_t i() {
    const std::uint64_t v = u();
    return static_cast<std::int64_t>(v >> 1) ^ -static_cast<std::int64_t>(v & 1);
  }
  float f() {
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v |= static_cast<std::uint32_t>(byte()) << (8 * k);
    float r;
    std::memcpy(&r, &v, 4);
    return r;
  }
  std::string s() {
    const std::uint64_t n = count(1);
    std::string v(b_.begin() + static_cast<long>(pos_), b_.begin() + static_cast<long>(pos_ + n));
    pos_ += n;
    return v;
  }
  // A count of items of at least `min_bytes` each that must fit in what is left.
  std::uint64_t count(std::uint64_t min_bytes) {
    const std::uint64_t n = u();
    if (n * min_bytes > b_.size() - pos_)
      throw Error("corrupt program file: a count runs past the end");
    return n;
  }
  template <typename E>
  E e(std::uint64_t limit, const char* what) {
    const std::uint64_t v = u();
    if (v >= limit) throw Error(fmt::format("corrupt program file: bad {} {}", what, v));
    return static_cast<E>(v);
  }
  bool done() const { return pos_ == b_.size(); }
  std::size_t pos_ = 0;

 private:
  std::uint8_t byte() {
    if (pos_ >= b_.size()) throw Error("corrupt program file: truncated");
    return b_[pos_++];
  }
  const std::vector<std::uint8_t>& b_;
};

// FNV-1a over the payload: detects truncation and corruption.
std::uint64_t checksum(const std::uint8_t* p, std::size_t n) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}

}  // namespace

std::vector<std::uint8_t> to_binary(const Program& p) {
  Writer w;
  w.s(p.arch);
  w.u(static_cast<std::uint64_t>(p.semaphores));
  w.u(static_cast<std::uint64_t>(p.lnc));
  w.u(p.tensors.size());
  for (const auto& t : p.tensors) {
    w.s(t.name);
    w.i(t.address);
    w.u(t.shape.size());
    for (auto d : t.shape) w.i(d);
    w.u(static_cast<std::uint64_t>(t.dtype));
    w.u(static_cast<std::uint64_t>(t.kind));
  }
  w.u(p.cores.size());
  for (const auto& c : p.cores) {
    for (const auto& stream : c.streams) {
      w.u(stream.size());
      for (const auto& in : stream) {
        w.u(static_cast<std::uint64_t>(in.op));
        w.u(static_cast<std::uint64_t>(in.engine));
        w.u(in.operands.size());
        for (const auto& ap : in.operands) {
          w.u(static_cast<std::uint64_t>(ap.mem));
          w.u(static_cast<std::uint64_t>(ap.dtype));
          w.i(ap.offset);
          w.i(ap.start_partition);
          w.i(ap.partitions);
          w.i(ap.offset_reg);
          w.i(ap.reg_stride);
          w.u(ap.dims.size());
          for (const auto& d : ap.dims) {
            w.i(d.stride);
            w.i(d.count);
          }
        }
        w.u(static_cast<std::uint64_t>(in.alu0));
        w.u(static_cast<std::uint64_t>(in.alu1));
        w.f(in.imm0);
        w.f(in.imm1);
        w.f(in.imm2);
        w.f(in.imm3);
        w.u(static_cast<std::uint64_t>(in.func));
        w.f(in.scale);
        w.u((in.accumulate ? 1u : 0u) | (in.negate ? 2u : 0u) | (in.col0 ? 4u : 0u) |
            (in.col1 ? 8u : 0u) | (in.oob_skip ? 16u : 0u) | (in.reverse0 ? 32u : 0u) |
            (in.reverse1 ? 64u : 0u) | (has_v3_fields(in) ? 128u : 0u) | (in.hwdge ? 256u : 0u));
        w.i(in.queue);
        w.i(in.priority);
        w.u(static_cast<std::uint64_t>(in.perf));
        w.i(in.rd);
        w.i(in.ra);
        w.i(in.rb);
        w.i(in.target);
        w.u(in.waits.size());
        for (const auto& wt : in.waits) {
          w.i(wt.sem);
          w.i(wt.value);
          w.i(wt.reg);
        }
        w.u(in.signals.size());
        for (int s : in.signals) w.i(s);
        w.s(in.loc);
        if (has_v3_fields(in)) {  // flag 128: absent, the payload reads as versions 1 and 2
          w.u(in.table.size());
          for (std::int32_t t : in.table) w.i(t);
          w.i(in.peer_core);
          for (const auto& wt : in.waits) w.i(wt.core);
        }
      }
    }
  }
  std::vector<std::uint8_t> out(kMagic, kMagic + 8);
  for (int k = 0; k < 4; ++k) out.push_back(static_cast<std::uint8_t>(kProgramVersion >> (8 * k)));
  const std::uint64_t sum = checksum(w.out.data(), w.out.size());
  for (int k = 0; k < 8; ++k) out.push_back(static_cast<std::uint8_t>(sum >> (8 * k)));
  out.insert(out.end(), w.out.begin(), w.out.end());
  return out;
}

Program parse_program_binary(const std::vector<std::uint8_t>& bytes) {
  if (bytes.size() < 20 || std::memcmp(bytes.data(), kMagic, 8) != 0) {
    throw Error("not a tern program file (bad magic)");
  }
  std::uint32_t version = 0;
  for (int k = 0; k < 4; ++k) version |= static_cast<std::uint32_t>(bytes[8 + k]) << (8 * k);
  if (version < kProgramMinVersion || version > kProgramVersion) {
    throw Error(fmt::format("program file version {} (this tern reads {} to {})", version,
                            kProgramMinVersion, kProgramVersion));
  }
  std::uint64_t sum = 0;
  for (int k = 0; k < 8; ++k) sum |= static_cast<std::uint64_t>(bytes[12 + k]) << (8 * k);
  if (sum != checksum(bytes.data() + 20, bytes.size() - 20)) {
    throw Error("corrupt program file: checksum mismatch (truncated or damaged)");
  }
  const std::vector<std::uint8_t> payload(bytes.begin() + 20, bytes.end());
  Reader r(payload);
  Program p;
  p.arch = r.s();
  p.semaphores = static_cast<int>(r.u());
  p.lnc = static_cast<int>(r.u());
  for (std::uint64_t n = r.count(5); n--;) {
    HbmTensor t;
    t.name = r.s();
    t.address = r.i();
    for (std::uint64_t d = r.count(1); d--;) t.shape.push_back(r.i());
    t.dtype = r.e<DType>(static_cast<std::uint64_t>(DType::count_), "dtype");
    t.kind = r.e<TensorKind>(3, "tensor kind");
    p.tensors.push_back(std::move(t));
  }
  for (std::uint64_t nc = r.count(kEngines); nc--;) {
    CoreProgram c;
    for (auto& stream : c.streams) {
      for (std::uint64_t n = r.count(20); n--;) {
        Instruction in;
        in.op = r.e<Opcode>(static_cast<std::uint64_t>(Opcode::count_), "opcode");
        in.engine = r.e<Engine>(kEngines, "engine");
        for (std::uint64_t k = r.count(6); k--;) {
          AccessPattern ap;
          ap.mem = r.e<Mem>(3, "memory");
          ap.dtype = r.e<DType>(static_cast<std::uint64_t>(DType::count_), "dtype");
          ap.offset = r.i();
          ap.start_partition = static_cast<int>(r.i());
          ap.partitions = static_cast<int>(r.i());
          ap.offset_reg = static_cast<int>(r.i());
          ap.reg_stride = r.i();
          for (std::uint64_t d = r.count(2); d--;) {
            Dim dim;
            dim.stride = r.i();
            dim.count = r.i();
            ap.dims.push_back(dim);
          }
          in.operands.push_back(std::move(ap));
        }
        in.alu0 = r.e<AluOp>(static_cast<std::uint64_t>(AluOp::count_), "ALU op");
        in.alu1 = r.e<AluOp>(static_cast<std::uint64_t>(AluOp::count_), "ALU op");
        in.imm0 = r.f();
        in.imm1 = r.f();
        in.imm2 = r.f();
        in.imm3 = r.f();
        in.func = r.e<ActFunc>(static_cast<std::uint64_t>(ActFunc::count_), "function");
        in.scale = r.f();
        const std::uint64_t flags = r.u();
        in.accumulate = flags & 1u;
        in.negate = flags & 2u;
        in.col0 = flags & 4u;
        in.col1 = flags & 8u;
        in.oob_skip = flags & 16u;
        in.reverse0 = flags & 32u;
        in.reverse1 = flags & 64u;
        in.hwdge = flags & 256u;  // version 4
        in.queue = static_cast<int>(r.i());
        in.priority = static_cast<int>(r.i());
        in.perf = r.e<PerfMode>(2, "performance mode");
        in.rd = static_cast<int>(r.i());
        in.ra = static_cast<int>(r.i());
        in.rb = static_cast<int>(r.i());
        in.target = static_cast<int>(r.i());
        for (std::uint64_t k = r.count(2); k--;) {
          SemWait wt;
          wt.sem = static_cast<int>(r.i());
          wt.value = r.i();
          wt.reg = static_cast<int>(r.i());
          in.waits.push_back(wt);
        }
        for (std::uint64_t k = r.count(1); k--;) in.signals.push_back(static_cast<int>(r.i()));
        in.loc = r.s();
        if (flags & 128u) {
          for (std::uint64_t k = r.count(1); k--;)
            in.table.push_back(static_cast<std::int32_t>(r.i()));
          in.peer_core = static_cast<int>(r.i());
          for (auto& wt : in.waits) wt.core = static_cast<int>(r.i());
        }
        stream.push_back(std::move(in));
      }
    }
    p.cores.push_back(std::move(c));
  }
  if (!r.done()) throw Error("corrupt program file: trailing bytes");
  return p;
}

void save_program(const Program& p, const std::filesystem::path& path) {
  const std::string ext = path.extension().string();
  const bool text = ext == ".txt" || ext == ".ternt";
  if (text) {
    write_file_atomic(path, to_text(p));
  } else {
    const auto b = to_binary(p);
    write_file_atomic(path, std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
  }
}

Program load_program(const std::filesystem::path& path) {
  const std::string file = read_file(path);
  const std::vector<std::uint8_t> bytes(file.begin(), file.end());
  try {
    if (bytes.size() >= 8 && std::memcmp(bytes.data(), kMagic, 8) == 0)
      return parse_program_binary(bytes);
    return parse_program_text(std::string(bytes.begin(), bytes.end()));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path.string(), e.what()));
  }
}

}  // namespace tern::isa
