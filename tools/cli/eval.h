// SPDX-License-Identifier: Apache-2.0
// `kvcache eval`: teacher-forced quality of KV-cache strategies against the dense f32 cache.
// By role: loading the model, tokenizer, text and windows (eval_load.h/.cpp),
// running the strategies (eval_run.cpp), reporting (eval_report.cpp) and
// plotting (eval_plot.cpp); the options are registered in cmd_eval.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "strategy.h"

namespace kvc_cli {

/// The longest window `kvcache eval --ctx` accepts (positions, BOS included).
constexpr int kMaxEvalContext = 65536;
/// At most this many segments per window (--segment).
constexpr std::size_t kMaxSegments = 1024;
/// Default window: the model's trained context, at most this many positions.
constexpr int kDefaultWindow = 512;
/// `kvcache eval --long`: windows of this many times the default window...
constexpr int kLongContextFactor = 8;
/// ...and this many tokens scored by default (8 windows of 4,096 positions on stories260K).
constexpr std::int64_t kLongEvalTokens = 32760;

/// Tokens scored by default on GGUF models (135M parameters and more: about 40x the work per
/// token).
constexpr std::int64_t kGgufEvalTokens = 4096;
/// Default chunk of the forward pass for GGUF models (BLAS GEMMs, prefill attention).
constexpr int kGgufChunk = 64;

struct EvalReport;

struct EvalOptions {
  std::string model = "stories260k";
  std::string tokenizer;  ///< empty: the model's own
  std::string text;       ///< empty: <shared>/data/tinystories-valid-sample.txt
  std::vector<Strategy> strategies;
  /// The strategies are the default list: its rows with per-layer parts
  /// (mixed precision chosen for SmolLM2's 30 layers) run only on models
  /// that have those layers.
  bool default_rows = false;
  /// --sensitivity CODECS: the rows are sensitivity_base, then for each
  /// layer l sensitivity_base@l=CODECS (one layer at a time quantized with
  /// CODECS, the others with the base), instead of `strategies`.
  std::string sensitivity, sensitivity_base = "int8";
  int ctx = 0;                ///< 0: the model's seq_len; above it runs past the trained context
  bool long_context = false;  ///< --long: ctx 0 means kLongContextFactor x seq_len
  int chunk = 0;    ///< positions per forward pass (0: 1 for llama2.c models, kGgufChunk for GGUF)
  int segment = 0;  ///< perplexity per segment of this many positions (0: the model's seq_len)
  std::int64_t max_tokens = 32768;  ///< tokens scored (0: the whole text)
  bool max_tokens_default = false;  ///< not given: 32768, or kGgufEvalTokens for GGUF models
  int threads = 0;                  ///< 0: one per core, at most one per window
  bool progress = true;             ///< progress bar on stderr (only when it is a terminal)
  bool overhead = false;            ///< also time the bare forward pass on a plain array cache
  std::string key_stats;  ///< smooth rows: a key statistics file (empty: the model's built-in ones)
  std::string head_gates;  ///< duo-attention: a gates file (empty: the model's built-in gates)
  /// codebook=fit rows: the text their levels are fitted on (empty:
  /// <shared>/data/out-of-domain.txt, as `kvcache calibrate`; never the eval text).
  std::string codebook_text;
  /// Called once the model, text and windows are loaded (the report's
  /// description filled), before any window runs; may throw to stop the run
  /// (--peer checks its report against the run here).
  std::function<void(const EvalReport &)> before_run;
};

struct StrategyResult {
  std::string strategy;
  bool reference = false;       ///< the dense f32 run every row is compared with
  double bits_per_element = 0;  ///< of the tokens held (codes, scales, zero points, residual)
  /// The same over the whole run: bytes in use / tokens held after every
  /// forward pass, weighted by the positions it fed (staged per-channel
  /// groups and partly filled blocks count while they exist).
  double mean_bits_per_element = 0;
  double kept_fraction = 1.0;  ///< tokens held at the end of a full window / positions fed
  double effective_bits_per_element = 0;  ///< bits_per_element x kept_fraction
  std::uint64_t kv_bytes_per_token = 0;
  std::uint64_t peak_kv_bytes = 0;
  double compression_vs_f16 = 0;  ///< per token held: f16 bytes per token / this row's
  /// "How much less memory than the dense f16 cache": the bytes a dense f16
  /// pool (blocks of 16) holds at the end of a window, every position kept /
  /// this row's bytes held then (codes, scales, residual, only the tokens
  /// kept), over the full windows. Above 1: a saving.
  double memory_vs_f16 = 0;
  /// The same for the peaks: the dense f16 pool's bytes for the longest
  /// window / this row's peak bytes in use (prefill-compress rows peak after
  /// their decoding regrew the cache; stream policies at their cap).
  double peak_memory_vs_f16 = 0;
  double ppl = 0;
  double ppl_delta_pct = 0;
  double kl_mean = 0;
  double top1_agreement = 0;
  double ms_per_token = 0;
  std::vector<double>
      segment_ppl;  ///< perplexity of the targets at positions [k x segment, (k+1) x segment)
  double second_half_ppl = 0;  ///< perplexity of the targets at positions [ctx / 2, ctx)
};

struct EvalReport {
  std::string model, model_path, tokenizer_path, text_path;
  int ctx = 0;
  int trained_context = 0;  ///< the model's seq_len
  int chunk = 1;            ///< positions per forward pass
  bool bos = true;  ///< windows start with BOS (else with the token before the first scored one)
  int segment = 0;  ///< positions per segment of segment_ppl
  int windows = 0;
  std::int64_t tokens_scored = 0;
  std::int64_t positions_fed = 0;  ///< per strategy, BOS included
  /// The text's token ids the windows read (the first window's context token
  /// included, BOS not): how many, and the SHA-256 of them as little-endian
  /// uint32, in hex. A peer report must name the same (read_peer_report).
  std::int64_t token_ids_count = 0;
  std::string token_ids_sha256;
  int threads = 0;
  double wall_seconds = 0;
  int num_layers = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  std::vector<StrategyResult> results;
  bool has_overhead = false;
  double array_ms_per_token = 0;  ///< bare forward pass, plain array cache
  double pool_f32_ms_per_token = 0;
  /// codebook=fit rows: what their levels were fitted on (empty: no such row).
  std::string codebook_fit_text;
};

/// Scores every strategy of `options` against the dense f32 cache over the
/// windows of the text (loading: eval_load.cpp; the runs: eval_run.cpp).
/// Throws kvc_runner::RunnerError for a bad file or option.
EvalReport run_eval(const EvalOptions &options);
/// The strategy table, its legend, and with more than one segment per window
/// the perplexity per segment (eval_report.cpp).
void print_eval_table(const EvalReport &report, std::FILE *out);
/// The report as one JSON object (the keys docs/eval.md lists). `peer`: empty,
/// or a peer report (read_peer_report) added under "peer".
std::string eval_json(const EvalReport &report, const std::string &peer = "");
/// Reads and checks a peer report (bench/peers/llamacpp_kv.py or
/// bench/peers/hf_caches.py --json): a JSON object with a non-empty "results"
/// array whose rows have the keys print_peer_table reads, of the right types.
/// Returns its text. Throws kvc_runner::RunnerError naming the file and what is wrong.
std::string read_peer_report(const std::string &path);
/// Checks a peer report (read_peer_report's text) against this run: the same
/// model file name, and, where the report names them, the same token ids
/// (token_ids_sha256 over token_ids_count ids) and window length. Throws
/// kvc_runner::RunnerError saying which differs.
void check_peer_report(const EvalReport &report, const std::string &peer, const std::string &path);
/// Our rows and the peer's, side by side: bits per element, bytes per token,
/// perplexity change and KL against each side's own 16-bit reference.
void print_peer_table(const EvalReport &report, const std::string &peer, std::FILE *out);
/// Checks that --plot can be written before the run: a .png or .svg name in a
/// writable folder, and gnuplot on PATH (eval_plot.cpp); throws
/// kvc_runner::RunnerError naming what is wrong.
void check_plot_target(const std::string &path);
/// With gnuplot, PNG or SVG by extension: perplexity change (%) against
/// effective bits per element, one labelled point per strategy; with more than
/// one segment per window, perplexity per segment instead (one line per strategy).
void write_plot(const EvalReport &report, const std::string &path);

}  // namespace kvc_cli
