// Typed option helpers shared by the commands: each sets the option's type
// name in --help (INT, FLOAT, a list of choices) and checks the value when
// the command line is parsed, naming the range or the choices it wanted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace tern::cli {

// An integer >= min (and <= max): "--layers: 0 is out of range: INT >= 1".
CLI::Option* int_range(CLI::Option* o, std::int64_t min, std::int64_t max = INT64_MAX);
// A finite number >= min (and <= max); nan and inf are refused.
CLI::Option* number_range(CLI::Option* o, double min, double max = 1e300);
// One of `choices`, listed in --help.
CLI::Option* one_of(CLI::Option* o, const std::vector<std::string>& choices);
// An output file: its folder must exist and be writable, and the path must
// not be a folder (util/file.h: check_writable_file); checked at parse
// time, before any work starts, without touching the file.
CLI::Option* output_file(CLI::Option* o);

}  // namespace tern::cli
