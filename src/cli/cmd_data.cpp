// tern data: tokenizes a text file into token shards (llm.c .bin format)
// for `tern train` (issue 7).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "train/shard.h"
#include "train/tokenizer.h"
#include "util/error.h"
#include "util/file.h"

namespace tern::cli {

namespace {

struct Args {
  std::string input, out, tokenizer = "char";
  double val_fraction = 0.1;
  bool json = false;
};

void run(const Args& a) {
  if (a.tokenizer != "char")
    throw NotSupported(
        fmt::format("tokenizer '{}' (char is; GPT-2 BPE comes with the trainer)", a.tokenizer));
  if (!(a.val_fraction >= 0.0 && a.val_fraction < 1.0))
    throw Error(fmt::format("--val-fraction must be in [0, 1), got {}", a.val_fraction));
  const std::string text = read_file(a.input);
  const train::CharTokenizer tok = train::CharTokenizer::from_text(text);
  const auto tokens = tok.encode(text);
  // The last val_fraction of the text is validation, split as nanoGPT's
  // char-level Shakespeare does (train = the first floor(n (1 - f)) tokens).
  const auto n_train =
      static_cast<std::size_t>(static_cast<double>(tokens.size()) * (1.0 - a.val_fraction));
  const std::size_t n_val = tokens.size() - n_train;
  const std::filesystem::path in(a.input);
  const std::filesystem::path out =
      a.out.empty() ? in.parent_path() / in.stem() : std::filesystem::path(a.out);
  std::filesystem::create_directories(out);
  const std::span<const std::uint16_t> all(tokens);
  train::write_shard(out / "train.bin", all.first(n_train));
  train::write_shard(out / "val.bin", all.subspan(n_train));
  write_file_atomic(out / "tokenizer.json", tok.to_json());
  if (a.json) {
    nlohmann::json j{{"input", a.input},        {"tokenizer", "char"}, {"vocab", tok.vocab()},
                     {"train_tokens", n_train}, {"val_tokens", n_val}, {"out", out.string()}};
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("%s: %zu bytes, char tokenizer with %d symbols\n", a.input.c_str(), text.size(),
              tok.vocab());
  std::printf("  %-28s %10zu tokens\n", (out / "train.bin").string().c_str(), n_train);
  std::printf("  %-28s %10zu tokens\n", (out / "val.bin").string().c_str(), n_val);
  std::printf("  %-28s\n", (out / "tokenizer.json").string().c_str());
}

}  // namespace

void add_data_command(CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "data",
      "Tokenize a text file into token shards (llm.c .bin: train.bin, val.bin) for training");
  cmd->add_option("input", a->input, "Text file (e.g. data/tinyshakespeare.txt)")->required();
  cmd->add_option("--out", a->out, "Output folder (default: beside the input, named after it)");
  cmd->add_option("--tokenizer", a->tokenizer, "char (the distinct bytes of the text)")
      ->capture_default_str();
  cmd->add_option("--val-fraction", a->val_fraction,
                  "The last fraction of the text held out for validation")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "Print the results as JSON");
  cmd->callback([a] { run(*a); });
}

}  // namespace tern::cli
