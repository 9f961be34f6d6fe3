// SPDX-License-Identifier: Apache-2.0
// `kvcache recommend`: its options and its run.
#include <CLI/CLI.hpp>
#include <memory>

#include "commands.h"
#include "recommend.h"

namespace kvc_cli {
namespace {

/// What the command line of `kvcache recommend` sets.
struct RecommendCommand {
  RecommendOptions options;
  bool no_progress = false;
};

}  // namespace

void register_recommend(CLI::App &app) {
  const auto cmd = std::make_shared<RecommendCommand>();
  RecommendOptions &rec_opt = cmd->options;
  CLI::App *rec = app.add_subcommand(
      "recommend",
      "Pick the smallest KV-cache strategy that meets a quality floor, from measured eval results");
  rec->add_option("--preset", rec_opt.preset, presets_help());
  rec->add_option("--layers", rec_opt.num_layers, "Transformer layers (instead of --preset)");
  rec->add_option("--kv-heads", rec_opt.num_kv_heads, "KV heads (instead of --preset)");
  rec->add_option("--head-dim", rec_opt.head_dim, "Elements per head (instead of --preset)");
  rec->add_option("--seq-len", rec_opt.seq_len, "Longest sequence, in tokens (required)");
  rec->add_option("--batch", rec_opt.batch, "Sequences held at once")->capture_default_str();
  rec->add_option("--memory", rec_opt.memory,
                  "KV-cache memory budget, e.g. 16GiB, 512MiB, 1e9 (required)");
  rec->add_option(
      "--max-ppl-increase", rec_opt.max_ppl_increase,
      "Quality floor: largest perplexity increase over the dense cache, in percent (required)");
  rec->add_option("--from", rec_opt.from,
                  "A `kvcache eval --json` report (default: run the eval now)");
  rec->add_option("--model", rec_opt.model, "Model of the eval run without --from")
      ->capture_default_str();
  rec->add_option("--strategies", rec_opt.strategies,
                  "Strategies of the eval run without --from (default: all)");
  rec->add_option("--eval-tokens", rec_opt.eval_tokens, "Tokens the eval run without --from scores")
      ->capture_default_str();
  rec->add_option("--prefix-share", rec_opt.prefix_share,
                  "Share (0..1) of each prompt that all requests share");
  rec->add_option("--prefix-tokens", rec_opt.prefix_tokens,
                  "Length of the shared prefix, in tokens");
  rec->add_option("--block-size", rec_opt.block_size,
                  "Block size of the pool, in tokens (default: 16)");
  rec->add_option("--from-prefix", rec_opt.from_prefix, "A `kvcache eval --prefix --json` report");
  rec->add_flag("--json", rec_opt.json, "Write one JSON object to stdout");
  rec->add_flag("--no-progress", cmd->no_progress, "No progress bar during the eval run");
  rec->callback([cmd] {
    cmd->options.progress = !cmd->no_progress;
    run_recommend(cmd->options);
  });
}

}  // namespace kvc_cli
