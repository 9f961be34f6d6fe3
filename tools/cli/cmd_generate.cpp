// SPDX-License-Identifier: Apache-2.0
// `kvcache generate`: its options and its run (the model runner's sampling
// loop, llama2.c run.c compatible).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include "../runner/error.h"
#include "../runner/kv_cache.h"
#include "../runner/runner.h"
#include "commands.h"

namespace kvc_cli {
namespace {

using kvc_runner::RunnerError;

/// What the command line of `kvcache generate` sets.
struct GenerateCommand {
  kvc_runner::GenerateOptions options;
  std::string model = "stories260k", tokenizer, cache = "f32";
  bool array_cache = false, print_ids = false;
};

/// Generates from the prompt: the text to stdout, the token ids (--print-ids) to stderr.
void run_generate_command(GenerateCommand &cmd) {
  kvc_runner::GenerateOptions &options = cmd.options;
  if (!kvc_runner::parse_dtype(cmd.cache, &options.cache_dtype)) {
    throw RunnerError("unknown --cache '" + cmd.cache + "' (known: f32, f16, bf16)");
  }
  options.use_pool = !cmd.array_cache;
  const kvc_runner::Model model =
      kvc_runner::Model::load(kvc_runner::resolve_model_path(cmd.model));
  const kvc_runner::Tokenizer tokenizer = kvc_runner::Tokenizer::load(
      kvc_runner::resolve_tokenizer_path(cmd.tokenizer, cmd.model), model.config().vocab_size);
  const kvc_runner::GenerateResult r = kvc_runner::generate(model, tokenizer, options);
  std::fwrite(r.text.data(), 1, r.text.size(), stdout);
  if (cmd.print_ids) {
    std::fprintf(stderr, "token_ids (%zu):", r.tokens.size());
    for (int t : r.tokens) std::fprintf(stderr, " %d", t);
    std::fprintf(stderr, "\n");
  }
}

}  // namespace

void register_generate(CLI::App &app) {
  const auto cmd = std::make_shared<GenerateCommand>();
  kvc_runner::GenerateOptions &gen_opt = cmd->options;
  CLI::App *gen = app.add_subcommand(
      "generate", "Generate text with the model runner (llama2.c run.c compatible)");
  gen->add_option("--model", cmd->model, "Checkpoint path or known name")->capture_default_str();
  gen->add_option("--tokenizer", cmd->tokenizer,
                  "Tokenizer path or known name (default: the model's)");
  gen->add_option("-i,--prompt", gen_opt.prompt, "Prompt text");
  gen->add_option("-n,--steps", gen_opt.steps, "Positions to run, prompt included (0: seq_len)")
      ->capture_default_str();
  gen->add_option("-t,--temperature", gen_opt.temperature, "0: greedy (argmax)")
      ->capture_default_str();
  gen->add_option("-p,--top-p", gen_opt.top_p, "Nucleus sampling threshold")->capture_default_str();
  gen->add_option("-s,--seed", gen_opt.seed, "Sampling seed");
  gen->add_option("--cache", cmd->cache, "Pool storage dtype: f32, f16, bf16")
      ->capture_default_str();
  gen->add_flag("--array-cache", cmd->array_cache, "Use a plain array cache instead of a kvc_pool");
  gen->add_flag("--print-ids", cmd->print_ids, "Print the token ids to stderr");
  gen->callback([cmd] { run_generate_command(*cmd); });
}

}  // namespace kvc_cli
