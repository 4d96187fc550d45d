// The hardware's rules for one instruction, checked before a program runs
// (the data-dependent ones, uninitialized reads and PSUM accumulation, are
// checked while it runs). Each violation is a message naming the operand
// and the rule; the simulator prefixes the core, engine, index, opcode and
// kernel source location.
#pragma once

#include <string>

#include "arch/chip.h"
#include "isa/program.h"

namespace tern::sim {

// Empty when the instruction is legal on `chip`.
std::string check_instruction(const arch::ChipSpec& chip, const isa::Program& program,
                              const isa::Instruction& in);

// The program's own declarations against the chip: every HBM tensor of
// positive dims, at a non-negative address, inside the chip's HBM; the
// semaphore count in range. Empty when they hold; else what and where.
std::string check_declarations(const arch::ChipSpec& chip, const isa::Program& program);

// The rules of the selection, search and scan instructions (check_select.cpp).
std::string select_rules(const arch::ChipSpec& chip, const isa::Instruction& in);

// "core 0, vector instruction #3 (tensor_tensor) at kernel.cpp:12"
std::string where(int core, const isa::Instruction& in, std::size_t index);

}  // namespace tern::sim
