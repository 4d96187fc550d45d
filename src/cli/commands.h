// The `tern` subcommands. Each registers itself on the root app; its
// callback throws tern::Error on bad input (main prints it on one line).
#pragma once

#include <CLI/CLI.hpp>

namespace tern::cli {

void add_info_command(CLI::App& app);
void add_num_command(CLI::App& app);
void add_sim_commands(CLI::App& app);  // run, bench
void add_compile_command(CLI::App& app);
void add_data_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_sample_command(CLI::App& app);  // cmd_train.cpp
void add_plan_command(CLI::App& app);    // plan, search, compare, validate

}  // namespace tern::cli
