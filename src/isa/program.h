// A Program: what runs on one chip. Per core, one instruction stream per
// engine; plus the HBM tensors it reads and writes (named, with their
// addresses). Programs are artifacts: a versioned binary file (.tern) and a
// readable text form that parses back to the same program.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "isa/instruction.h"

namespace tern::isa {

enum class TensorKind : std::uint8_t { input, output, scratch };

struct HbmTensor {
  std::string name;
  std::int64_t address = 0;  // bytes
  std::vector<std::int64_t> shape;
  DType dtype = DType::fp32;
  TensorKind kind = TensorKind::input;
  std::int64_t elements() const;
  std::int64_t bytes() const { return elements() * size_bytes(dtype); }
  bool operator==(const HbmTensor&) const = default;
};

struct CoreProgram {
  std::array<std::vector<Instruction>, kEngines> streams;
  bool operator==(const CoreProgram&) const = default;
};

struct Program {
  std::string arch = "trn3";  // chip the program was built for
  int semaphores = 0;         // per core
  // Logical NeuronCore configuration (v3+): with lnc = 2 every pair of
  // physical cores forms one logical core (a launch grid of 2: program ids
  // 0 and 1 on the two physical cores); cores must be a multiple of lnc.
  int lnc = 1;
  std::vector<HbmTensor> tensors;
  std::vector<CoreProgram> cores;

  std::size_t instruction_count() const;
  const HbmTensor& tensor(const std::string& name) const;  // throws tern::Error
  bool operator==(const Program&) const = default;
};

// Per tensor, in `tensors` order: whether the program may write it. Only a
// DMA writes HBM, through its destination (operand 0); a register-addressed
// HBM destination may land in any tensor, so then every tensor counts.
std::vector<bool> written_tensors(const Program& p);

// Version 2 added dma_gather / dma_scatter and their oob flag (flags bit
// 16); a version-1 file is a version-2 file without them, so both load.
// Files are always written at kProgramVersion.
constexpr std::uint32_t kProgramVersion = 4;
constexpr std::uint32_t kProgramMinVersion = 1;

std::string to_text(const Program& p);
Program parse_program_text(const std::string& text);  // errors name the line

std::vector<std::uint8_t> to_binary(const Program& p);
Program parse_program_binary(const std::vector<std::uint8_t>& bytes);

// Writes atomically (temporary file + rename). Binary unless the path ends
// in ".txt" / ".ternt". load_program reads either form.
void save_program(const Program& p, const std::filesystem::path& path);
Program load_program(const std::filesystem::path& path);

}  // namespace tern::isa
