// tern: a software Trainium-class training system. Entry point of the CLI.
#include <malloc.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <new>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "util/error.h"

namespace {
// The simulator allocates and frees operand buffers of up to a few MiB for
// every instruction. glibc serves those from fresh mmap'd pages and hands
// the heap's top back to the kernel whenever 128 KiB are free, so each
// instruction paid page faults and zeroing (measured: the default `tern
// train` step 10-15 % faster with the settings below). Buffers up to
// glibc's largest mmap threshold (32 MiB on 64-bit) stay on the heap, and
// freed heap memory is kept for the next instruction.
void keep_freed_memory() {
  constexpr int kMmapThreshold = 32 << 20;  // DEFAULT_MMAP_THRESHOLD_MAX, 64-bit glibc
  constexpr int kTrimThreshold = 1 << 30;
  mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
  mallopt(M_TRIM_THRESHOLD, kTrimThreshold);
}
}  // namespace

int main(int argc, char** argv) {
  keep_freed_memory();
  CLI::App app{
      "tern: a Trainium3-class AI training system in software (simulated chip, SDK, trainer, "
      "planner)",
      "tern"};
  app.set_version_flag("--version", "tern 0.1.0");
  app.require_subcommand(1);
  tern::cli::add_info_command(app);
  tern::cli::add_num_command(app);
  tern::cli::add_sim_commands(app);
  tern::cli::add_compile_command(app);
  tern::cli::add_data_command(app);
  tern::cli::add_train_command(app);
  tern::cli::add_sample_command(app);
  tern::cli::add_plan_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // One line: what was wrong, and where to look.
    std::fprintf(stderr, "tern: error: %s (see --help)\n", e.what());
    return e.get_exit_code();
  } catch (const tern::Error& e) {
    std::fprintf(stderr, "tern: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    // A size no earlier check bounded: reported as what it is, not a crash.
    std::fprintf(stderr,
                 "tern: error: out of memory: the input asks for more memory than this host "
                 "has\n");
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    std::fprintf(stderr, "tern: error: %s: %s\n", e.path1().string().c_str(),
                 e.code().message().c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tern: internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}
