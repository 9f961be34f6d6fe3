// SPDX-License-Identifier: Apache-2.0
// The `kvcache` command-line tool: eval, memory, generate, bench.
#include <kvcache/kvcache.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "../runner/error.h"
#include "../runner/kv_cache.h"
#include "../runner/runner.h"
#include "bench.h"
#include "eval.h"
#include "eval_prefix.h"
#include "memory.h"
#include "recommend.h"
#include "strategy.h"

namespace {

using namespace kvc_cli;
using kvc_runner::RunnerError;

int cmd_generate(const std::string &model_arg, const std::string &tokenizer_arg,
                 const kvc_runner::GenerateOptions &options, bool print_ids) {
  const kvc_runner::Model model = kvc_runner::Model::load(kvc_runner::resolve_model_path(model_arg));
  const kvc_runner::Tokenizer tokenizer = kvc_runner::Tokenizer::load(
      kvc_runner::resolve_tokenizer_path(tokenizer_arg, model_arg), model.config().vocab_size);
  const kvc_runner::GenerateResult r = kvc_runner::generate(model, tokenizer, options);
  std::fwrite(r.text.data(), 1, r.text.size(), stdout);
  if (print_ids) {
    std::fprintf(stderr, "token_ids (%zu):", r.tokens.size());
    for (int t : r.tokens) std::fprintf(stderr, " %d", t);
    std::fprintf(stderr, "\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  CLI::App app{"kvcache: measure and size KV-cache strategies (libkvcache " +
               std::string(kvc_version_string()) + ")"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(kvc_version_string()));

  // --- eval ---------------------------------------------------------------
  EvalOptions eval_opt;
  std::string strategies_arg;
  std::string plot_path;
  bool eval_json_flag = false, list_strategies = false, no_progress = false, eval_long = false;
  CLI::App *eval = app.add_subcommand(
      "eval", "Compare KV-cache strategies with the dense f32 cache on a real model and text");
  eval->add_option("--model", eval_opt.model, "Checkpoint path, GGUF file or known name (stories260k, smollm2)")
      ->capture_default_str();
  eval->add_option("--tokenizer", eval_opt.tokenizer, "Tokenizer path or known name (default: the model's)");
  eval->add_option("--text", eval_opt.text, "UTF-8 text to score (default: shared data/tinystories-valid-sample.txt)");
  eval->add_option("--strategies", strategies_arg, "Comma-separated strategy specs, e.g. int4:group=32:full-range:hadamard or k-int8:per-token+v-int4:group=32 "
                  "(grammar in docs/eval.md; default: every strategy of --list-strategies)");
  eval->add_option("--ctx", eval_opt.ctx, "Window length in tokens, BOS included (default: the model's seq_len)");
  CLI::Option *max_tokens_opt =
      eval->add_option("--max-tokens", eval_opt.max_tokens, "Tokens to score (0: the whole text)")
          ->capture_default_str();
  eval->add_flag("--long", eval_long,
                 "Long context: windows of 8x the model's trained context (--ctx to change) fed as one stream, "
                 "dense vs window vs StreamingLLM by default, perplexity per segment");
  PrefixEvalOptions prefix_opt;
  bool eval_prefix = false;
  eval->add_flag("--prefix", eval_prefix,
                 "Prefix-cache scenario: requests sharing one prompt prefix, with and without the prefix "
                 "cache (hit rate, tokens computed, time to first token, identical log-probabilities)");
  eval->add_option("--requests", prefix_opt.requests, "--prefix: requests")->capture_default_str();
  eval->add_option("--prefix-tokens", prefix_opt.prefix_tokens, "--prefix: shared prefix length, BOS included")
      ->capture_default_str();
  eval->add_option("--suffix-tokens", prefix_opt.suffix_tokens, "--prefix: tokens after the prefix, different per request")
      ->capture_default_str();
  eval->add_option("--block-size", prefix_opt.block_size, "--prefix: pool block size in tokens")->capture_default_str();
  eval->add_option("--tier-dir", prefix_opt.tier_dir,
                   "--prefix: also the tiered run (docs/tiers.md): the prefix served from host memory, then from "
                   "this directory's disk tier by a new process");
  eval->add_option("--redis", prefix_opt.redis,
                   "--prefix --tier-dir: also from Redis (host:port, or cluster seeds host:port,host:port) by a new "
                   "process");
  eval->add_option("--tier-child", prefix_opt.tier_child, "internal: one phase of the tiered run")->group("");
  std::string peer_path;
  eval->add_option("--peer", peer_path,
                   "JSON of bench/peers/llamacpp_kv.py (llama.cpp's KV types on the same windows): printed "
                   "beside our rows");
  eval->add_option("--chunk", eval_opt.chunk,
                   "Positions per forward pass: 1 decodes token by token; more batches the matrix products "
                   "(BLAS) and runs the library's prefill attention (default: 1 for llama2.c models, 64 for GGUF)");
  eval->add_option("--segment", eval_opt.segment,
                   "Positions per segment of the per-segment perplexity (default: the model's seq_len)");
  eval->add_option("--threads", eval_opt.threads, "Worker threads (default: one per core)");
  eval->add_flag("--json", eval_json_flag, "Write one JSON object to stdout instead of the table");
  eval->add_option("--plot", plot_path, "Write a plot of quality loss vs bits per element (.png or .svg; needs gnuplot)");
  eval->add_flag("--list-strategies", list_strategies, "Print the default strategies, one spec per line, and exit");
  eval->add_flag("--overhead", eval_opt.overhead, "Also time the bare forward pass on a plain array cache");
  eval->add_flag("--no-progress", no_progress, "No progress bar");

  // --- memory -------------------------------------------------------------
  MemoryOptions mem_opt;
  CLI::App *memory = app.add_subcommand("memory", "KV-cache size of a model: per token, per layer, in total");
  std::string presets_help = "Model preset:";
  for (const ModelPreset &p : model_presets()) presets_help += std::string(" ") + p.name;
  memory->add_option("--preset", mem_opt.preset, presets_help);
  memory->add_option("--layers", mem_opt.num_layers, "Transformer layers (instead of --preset)");
  memory->add_option("--kv-heads", mem_opt.num_kv_heads, "KV heads (instead of --preset)");
  memory->add_option("--head-dim", mem_opt.head_dim, "Elements per head (instead of --preset)");
  memory->add_option("--seq-len", mem_opt.seq_len, "Tokens per sequence")->required();
  memory->add_option("--batch", mem_opt.batch, "Sequences")->capture_default_str();
  memory->add_option("--dtype", mem_opt.dtype, "Storage dtype: f32, f16, bf16")->capture_default_str();
  memory->add_flag("--json", mem_opt.json, "Write one JSON object to stdout");

  // --- generate -----------------------------------------------------------
  kvc_runner::GenerateOptions gen_opt;
  std::string gen_model = "stories260k", gen_tokenizer, gen_cache = "f32";
  bool gen_array = false, gen_ids = false;
  CLI::App *gen = app.add_subcommand("generate", "Generate text with the model runner (llama2.c run.c compatible)");
  gen->add_option("--model", gen_model, "Checkpoint path or known name")->capture_default_str();
  gen->add_option("--tokenizer", gen_tokenizer, "Tokenizer path or known name (default: the model's)");
  gen->add_option("-i,--prompt", gen_opt.prompt, "Prompt text");
  gen->add_option("-n,--steps", gen_opt.steps, "Positions to run, prompt included (0: seq_len)")->capture_default_str();
  gen->add_option("-t,--temperature", gen_opt.temperature, "0: greedy (argmax)")->capture_default_str();
  gen->add_option("-p,--top-p", gen_opt.top_p, "Nucleus sampling threshold")->capture_default_str();
  gen->add_option("-s,--seed", gen_opt.seed, "Sampling seed");
  gen->add_option("--cache", gen_cache, "Pool storage dtype: f32, f16, bf16")->capture_default_str();
  gen->add_flag("--array-cache", gen_array, "Use a plain array cache instead of a kvc_pool");
  gen->add_flag("--print-ids", gen_ids, "Print the token ids to stderr");

  // --- bench --------------------------------------------------------------
  BenchOptions bench_opt;
  CLI::App *bench = app.add_subcommand(
      "bench", "Time the library's operations (pool, codecs, attention, eviction, prefix lookup) and the "
               "model's forward pass, each beside a baseline measured in the same run");
  bench->add_flag("--quick", bench_opt.quick, "Short rounds: the whole run in well under a minute");
  bench->add_option("--filter", bench_opt.filter, "Run only the cases whose group/name contains this text");
  bench->add_option("--model", bench_opt.model, "Checkpoint path or known name (forward-pass case)")
      ->capture_default_str();
  bench->add_option("--tokens", bench_opt.tokens, "Forward-pass case: positions per pass (default: the model's seq_len)");
  bench->add_option("--rounds", bench_opt.rounds, "Rounds per case, the fastest counts (default 5, --quick 3)");
  bench->add_flag("--json", bench_opt.json, "Write one JSON object to stdout");

  // --- recommend ------------------------------------------------------------
  RecommendOptions rec_opt;
  bool rec_no_progress = false;
  CLI::App *rec = app.add_subcommand(
      "recommend", "Pick the smallest KV-cache strategy that meets a quality floor, from measured eval results");
  rec->add_option("--preset", rec_opt.preset, presets_help);
  rec->add_option("--layers", rec_opt.num_layers, "Transformer layers (instead of --preset)");
  rec->add_option("--kv-heads", rec_opt.num_kv_heads, "KV heads (instead of --preset)");
  rec->add_option("--head-dim", rec_opt.head_dim, "Elements per head (instead of --preset)");
  rec->add_option("--seq-len", rec_opt.seq_len, "Longest sequence, in tokens (required)");
  rec->add_option("--batch", rec_opt.batch, "Sequences held at once")->capture_default_str();
  rec->add_option("--memory", rec_opt.memory, "KV-cache memory budget, e.g. 16GiB, 512MiB, 1e9 (required)");
  rec->add_option("--max-ppl-increase", rec_opt.max_ppl_increase,
                  "Quality floor: largest perplexity increase over the dense cache, in percent (required)");
  rec->add_option("--from", rec_opt.from, "A `kvcache eval --json` report (default: run the eval now)");
  rec->add_option("--model", rec_opt.model, "Model of the eval run without --from")->capture_default_str();
  rec->add_option("--strategies", rec_opt.strategies, "Strategies of the eval run without --from (default: all)");
  rec->add_option("--eval-tokens", rec_opt.eval_tokens, "Tokens the eval run without --from scores")
      ->capture_default_str();
  rec->add_option("--prefix-share", rec_opt.prefix_share, "Share (0..1) of each prompt that all requests share");
  rec->add_option("--prefix-tokens", rec_opt.prefix_tokens, "Length of the shared prefix, in tokens");
  rec->add_option("--block-size", rec_opt.block_size, "Block size of the pool, in tokens (default: 16)");
  rec->add_option("--from-prefix", rec_opt.from_prefix, "A `kvcache eval --prefix --json` report");
  rec->add_flag("--json", rec_opt.json, "Write one JSON object to stdout");
  rec->add_flag("--no-progress", rec_no_progress, "No progress bar during the eval run");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // Usage errors read like every other error: one line, exit status 1.
    std::fprintf(stderr, "kvcache: error: %s (see --help)\n", e.what());
    return 1;
  }

  try {
    if (eval->parsed() && eval_prefix) {
      for (const char *name : {"--long", "--strategies", "--list-strategies", "--plot", "--ctx", "--max-tokens",
                               "--segment", "--chunk", "--overhead", "--threads", "--peer"}) {
        if (eval->count(name) > 0)
          throw RunnerError(std::string("--prefix runs its own scenario: it takes no ") + name);
      }
      prefix_opt.model = eval_opt.model;
      prefix_opt.tokenizer = eval_opt.tokenizer;
      prefix_opt.text = eval_opt.text;
      if (!prefix_opt.tier_child.empty()) {
        std::printf("%s\n", run_tier_child(prefix_opt).c_str());
        return 0;
      }
      if (!prefix_opt.redis.empty() && prefix_opt.tier_dir.empty()) throw RunnerError("--redis needs --tier-dir");
      const PrefixReport report = run_prefix_eval(prefix_opt);
      if (eval_json_flag) {
        std::printf("%s\n", prefix_json(report).c_str());
      } else {
        print_prefix_report(report, stdout);
        print_tier_report(report, stdout);
      }
      return 0;
    }
    if (eval->parsed()) {
      for (const char *name : {"--requests", "--prefix-tokens", "--suffix-tokens", "--block-size", "--tier-dir", "--redis",
                               "--tier-child"}) {
        if (eval->count(name) > 0) throw RunnerError(std::string(name) + " applies to --prefix only");
      }
      const std::vector<std::string> defaults = eval_long ? default_long_strategies() : default_strategies();
      if (list_strategies) {
        for (const std::string &s : defaults) std::printf("%s\n", s.c_str());
        return 0;
      }
      if (strategies_arg.empty()) {
        for (const std::string &d : defaults) strategies_arg += (strategies_arg.empty() ? "" : ",") + d;
      }
      eval_opt.max_tokens_default = max_tokens_opt->count() == 0;
      if (eval_long) {
        eval_opt.long_context = true;
        if (max_tokens_opt->count() == 0) eval_opt.max_tokens = kLongEvalTokens;
      }
      eval_opt.strategies = parse_strategy_list(strategies_arg);
      if (!plot_path.empty()) check_plot_target(plot_path);  // fail before the long run
      eval_opt.progress = !no_progress;
      std::string peer;
      if (!peer_path.empty()) peer = read_peer_report(peer_path);  // fail before the long run
      const EvalReport report = run_eval(eval_opt);
      if (eval_json_flag) {
        std::printf("%s\n", eval_json(report, peer).c_str());
      } else {
        print_eval_table(report, stdout);
        if (!peer.empty()) print_peer_table(report, peer, stdout);
      }
      if (!plot_path.empty()) {
        write_plot(report, plot_path);
        std::fprintf(stderr, "plot written to %s\n", plot_path.c_str());
      }
      return 0;
    }
    if (memory->parsed()) {
      run_memory(mem_opt);
      return 0;
    }
    if (gen->parsed()) {
      if (!kvc_runner::parse_dtype(gen_cache, &gen_opt.cache_dtype)) {
        throw RunnerError("unknown --cache '" + gen_cache + "' (known: f32, f16, bf16)");
      }
      gen_opt.use_pool = !gen_array;
      return cmd_generate(gen_model, gen_tokenizer, gen_opt, gen_ids);
    }
    if (bench->parsed()) {
      const std::vector<BenchResult> results = run_bench(bench_opt);
      if (bench_opt.json) std::printf("%s\n", bench_json(bench_opt, results).c_str());
      else print_bench(bench_opt, results);
      return 0;
    }
    if (rec->parsed()) {
      rec_opt.progress = !rec_no_progress;
      run_recommend(rec_opt);
      return 0;
    }
  } catch (const RunnerError &e) {
    std::fprintf(stderr, "kvcache: error: %s\n", e.what());
    return 1;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "kvcache: internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}
