// SPDX-License-Identifier: Apache-2.0
// `kvcache eval`: its options and its run (the strategy table, --long, --plot,
// --peer, or the --prefix scenario).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "../runner/error.h"
#include "commands.h"
#include "eval.h"
#include "eval_prefix.h"
#include "strategy.h"

namespace kvc_cli {
namespace {

using kvc_runner::RunnerError;

/// What the command line of `kvcache eval` sets.
struct EvalCommand {
  CLI::App *app = nullptr;
  EvalOptions options;
  PrefixEvalOptions prefix_options;
  CLI::Option *max_tokens = nullptr;  ///< --max-tokens: whether it was given
  std::string strategies, plot_path, peer_path;
  bool json = false, list_strategies = false, no_progress = false, long_context = false,
       prefix = false;
};

/// --prefix: requests sharing one prompt prefix, with and without the prefix cache.
void run_prefix_command(EvalCommand &cmd) {
  for (const char *name :
       {"--long", "--strategies", "--list-strategies", "--plot", "--ctx", "--max-tokens",
        "--segment", "--chunk", "--overhead", "--threads", "--peer"}) {
    if (cmd.app->count(name) > 0)
      throw RunnerError(std::string("--prefix runs its own scenario: it takes no ") + name);
  }
  PrefixEvalOptions &prefix_opt = cmd.prefix_options;
  prefix_opt.model = cmd.options.model;
  prefix_opt.tokenizer = cmd.options.tokenizer;
  prefix_opt.text = cmd.options.text;
  if (!prefix_opt.tier_child.empty()) {
    std::printf("%s\n", run_tier_child(prefix_opt).c_str());
    return;
  }
  if (!prefix_opt.redis.empty() && prefix_opt.tier_dir.empty())
    throw RunnerError("--redis needs --tier-dir");
  const PrefixReport report = run_prefix_eval(prefix_opt);
  if (cmd.json) {
    std::printf("%s\n", prefix_json(report).c_str());
  } else {
    print_prefix_report(report, stdout);
    print_tier_report(report, stdout);
  }
}

/// The strategy table (or --long's segments) against the dense f32 cache.
void run_eval_command(EvalCommand &cmd) {
  if (cmd.prefix) {
    run_prefix_command(cmd);
    return;
  }
  for (const char *name : {"--requests", "--prefix-tokens", "--suffix-tokens", "--block-size",
                           "--tier-dir", "--redis", "--tier-child"}) {
    if (cmd.app->count(name) > 0)
      throw RunnerError(std::string(name) + " applies to --prefix only");
  }
  EvalOptions &eval_opt = cmd.options;
  const std::vector<std::string> defaults =
      cmd.long_context ? default_long_strategies() : default_strategies();
  if (cmd.list_strategies) {
    for (const std::string &s : defaults) std::printf("%s\n", s.c_str());
    return;
  }
  std::string &strategies_arg = cmd.strategies;
  if (strategies_arg.empty()) {
    for (const std::string &d : defaults) strategies_arg += (strategies_arg.empty() ? "" : ",") + d;
    eval_opt.default_rows = true;
  }
  eval_opt.max_tokens_default = cmd.max_tokens->count() == 0;
  if (cmd.long_context) {
    eval_opt.long_context = true;
    if (cmd.max_tokens->count() == 0) eval_opt.max_tokens = kLongEvalTokens;
  }
  if (!eval_opt.sensitivity.empty()) {
    if (cmd.app->count("--strategies") > 0)
      throw RunnerError("--sensitivity makes its own rows: give it without --strategies");
    // Fail before the long run: the rows parse (layer 0 stands for every layer).
    parse_strategy(eval_opt.sensitivity_base + "@0=" + eval_opt.sensitivity);
  } else if (cmd.app->count("--sensitivity-base") > 0) {
    throw RunnerError("--sensitivity-base applies to --sensitivity only");
  }
  eval_opt.strategies = parse_strategy_list(strategies_arg);
  if (!cmd.plot_path.empty()) check_plot_target(cmd.plot_path);  // fail before the long run
  eval_opt.progress = !cmd.no_progress;
  std::string peer;
  if (cmd.app->count("--peer") > 0 && cmd.peer_path.empty())
    throw RunnerError("--peer needs a file name (a peer report: bench/peers/*.py --json)");
  if (!cmd.peer_path.empty()) {
    peer = read_peer_report(cmd.peer_path);  // fail before the long run
    eval_opt.before_run = [&](const EvalReport &rep) {
      check_peer_report(rep, peer, cmd.peer_path);
    };
  }
  const EvalReport report = run_eval(eval_opt);
  if (cmd.json) {
    std::printf("%s\n", eval_json(report, peer).c_str());
  } else {
    print_eval_table(report, stdout);
    if (!peer.empty()) print_peer_table(report, peer, stdout);
  }
  if (!cmd.plot_path.empty()) {
    write_plot(report, cmd.plot_path);
    std::fprintf(stderr, "plot written to %s\n", cmd.plot_path.c_str());
  }
}

}  // namespace

void register_eval(CLI::App &app) {
  const auto cmd = std::make_shared<EvalCommand>();
  EvalOptions &eval_opt = cmd->options;
  PrefixEvalOptions &prefix_opt = cmd->prefix_options;
  CLI::App *eval = app.add_subcommand(
      "eval", "Compare KV-cache strategies with the dense f32 cache on a real model and text");
  cmd->app = eval;
  eval->add_option("--model", eval_opt.model,
                   "Checkpoint path, GGUF file or known name (stories260k, smollm2)")
      ->capture_default_str();
  eval->add_option("--tokenizer", eval_opt.tokenizer,
                   "Tokenizer path or known name (default: the model's)");
  eval->add_option("--text", eval_opt.text,
                   "UTF-8 text to score (default: shared data/tinystories-valid-sample.txt)");
  eval->add_option("--strategies", cmd->strategies,
                   "Comma-separated strategy specs, e.g. int4:group=32:full-range:hadamard or "
                   "k-int8:per-token+v-int4:group=32 "
                   "(grammar in docs/eval.md; default: every strategy of --list-strategies)");
  eval->add_option("--ctx", eval_opt.ctx,
                   "Window length in tokens, BOS included (default: the model's seq_len)");
  cmd->max_tokens =
      eval->add_option("--max-tokens", eval_opt.max_tokens, "Tokens to score (0: the whole text)")
          ->capture_default_str();
  eval->add_flag("--long", cmd->long_context,
                 "Long context: windows of 8x the model's trained context (--ctx to change) fed as "
                 "one stream, "
                 "dense vs window vs StreamingLLM by default, perplexity per segment");
  eval->add_flag(
      "--prefix", cmd->prefix,
      "Prefix-cache scenario: requests sharing one prompt prefix, with and without the prefix "
      "cache (hit rate, tokens computed, time to first token, identical log-probabilities)");
  eval->add_option("--requests", prefix_opt.requests, "--prefix: requests")->capture_default_str();
  eval->add_option("--prefix-tokens", prefix_opt.prefix_tokens,
                   "--prefix: shared prefix length, BOS included")
      ->capture_default_str();
  eval->add_option("--suffix-tokens", prefix_opt.suffix_tokens,
                   "--prefix: tokens after the prefix, different per request")
      ->capture_default_str();
  eval->add_option("--block-size", prefix_opt.block_size, "--prefix: pool block size in tokens")
      ->capture_default_str();
  eval->add_option("--tier-dir", prefix_opt.tier_dir,
                   "--prefix: also the tiered run (docs/tiers.md): the prefix served from host "
                   "memory, then from "
                   "this directory's disk tier by a new process");
  eval->add_option("--redis", prefix_opt.redis,
                   "--prefix --tier-dir: also from Redis (host:port, or cluster seeds "
                   "host:port,host:port) by a new "
                   "process");
  eval->add_option("--tier-child", prefix_opt.tier_child, "internal: one phase of the tiered run")
      ->group("");
  eval->add_option(
      "--peer", cmd->peer_path,
      "JSON of bench/peers/llamacpp_kv.py or bench/peers/hf_caches.py (peers on the same windows "
      "and tokens): printed beside our rows; refused if its model, window length or token ids "
      "differ from this run's");
  eval->add_option(
      "--chunk", eval_opt.chunk,
      "Positions per forward pass: 1 decodes token by token; more batches the matrix products "
      "(BLAS) and runs the library's prefill attention (default: 1 for llama2.c models, 64 for "
      "GGUF)");
  eval->add_option(
      "--segment", eval_opt.segment,
      "Positions per segment of the per-segment perplexity (default: the model's seq_len)");
  eval->add_option("--threads", eval_opt.threads, "Worker threads (default: one per core)");
  eval->add_option("--head-gates", eval_opt.head_gates,
                   "duo-attention rows: a file of num_layers x num_kv_heads gates in [0, 1] "
                   "(layer by layer, whitespace-separated, '#' comments; the lowest stream), "
                   "default: bench/duo's gates for stories260k and smollm2 (docs/eviction.md)");
  eval->add_option("--key-stats", eval_opt.key_stats,
                   "smooth rows: a key statistics file from `kvcache calibrate` (default: "
                   "bench/calib's statistics for stories260k and smollm2; docs/codecs.md)");
  eval->add_option("--codebook-text", eval_opt.codebook_text,
                   "codebook=fit rows: the text their levels are fitted on (default: shared "
                   "data/out-of-domain.txt, as `kvcache calibrate`; 4 windows of up to 512)");
  eval->add_option("--sensitivity", eval_opt.sensitivity,
                   "Per-layer sensitivity scan: rows of the base codecs with one layer at a time "
                   "stored with these codecs (e.g. k-int3:per-token+v-int3:group=32); compare "
                   "their KL to choose per-layer codecs (BASE@LAYERS=CODECS, docs/eval.md)");
  eval->add_option("--sensitivity-base", eval_opt.sensitivity_base,
                   "--sensitivity: the codecs of the other layers")
      ->capture_default_str();
  eval->add_flag("--json", cmd->json, "Write one JSON object to stdout instead of the table");
  eval->add_option(
      "--plot", cmd->plot_path,
      "Write a plot of quality loss vs bits per element (.png or .svg; needs gnuplot)");
  eval->add_flag("--list-strategies", cmd->list_strategies,
                 "Print the default strategies, one spec per line, and exit");
  eval->add_flag("--overhead", eval_opt.overhead,
                 "Also time the bare forward pass on a plain array cache");
  eval->add_flag("--no-progress", cmd->no_progress, "No progress bar");
  eval->callback([cmd] { run_eval_command(*cmd); });
}

}  // namespace kvc_cli
