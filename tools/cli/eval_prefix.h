// SPDX-License-Identifier: Apache-2.0
// `kvcache eval --prefix`: requests that share one prompt prefix, run with and
// without the pool's prefix cache (kvc_prefix_attach / kvc_prefix_insert).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace kvc_cli {

struct PrefixEvalOptions {
  std::string model = "stories260k";
  std::string tokenizer;  ///< empty: the model's own
  std::string text;       ///< empty: <shared>/data/tinystories-valid-sample.txt
  int requests = 32;
  int prefix_tokens = 256;  ///< shared by every request, BOS included
  int suffix_tokens = 64;   ///< different in every request
  int block_size = 16;
  /// Tiered run (docs/tiers.md): a directory for the disk tier (empty: no
  /// tiered run), a Redis address (empty: no Redis phase), and the phase a
  /// child process runs ("disk" or "redis"; internal).
  std::string tier_dir, redis, tier_child;
};

/// One phase of the tiered run: each request starts with the shared prefix
/// only in one place (recomputed, the pool, or one tier) and is timed from
/// its start (lookup and load included) to the logits of its last prompt position.
struct TierPhase {
  std::string name;  ///< "compute", "pool", "host", "disk (new process)", "redis (new process)"
  bool ran = false;
  std::string skipped;  ///< why it did not run
  int requests = 0;
  std::int64_t tokens_loaded = 0, tokens_hit = 0, tokens_computed = 0;
  double ttft_ms_mean = 0, ttft_ms_p50 = 0, ttft_ms_max = 0, load_ms_mean = 0;
  double suffix_nll_mean = 0;
  bool nll_equal = false;  ///< suffix NLL equal, bit for bit, to the compute phase's
};

/// One pass over all requests, one after the other on one thread.
struct PrefixRun {
  bool prefix_cache = false;
  std::int64_t tokens_computed = 0;  ///< positions run through the model
  std::int64_t hit_requests = 0;     ///< requests that found at least one cached block
  std::int64_t hit_tokens = 0;       ///< prompt positions taken from the cache
  double ttft_ms_mean = 0, ttft_ms_p50 = 0,
         ttft_ms_max = 0;  ///< request start to the last prompt logits
  double wall_seconds = 0;
  double suffix_nll_mean = 0;  ///< mean negative log-likelihood of the suffix tokens (nats)
  // The library's counters (kvc_prefix_get_stats) at the end; 0 without the cache.
  std::uint64_t queried_tokens = 0, stats_hit_tokens = 0, registered_blocks = 0;
};

struct PrefixReport {
  std::string model, model_path, text_path;
  int requests = 0, prefix_tokens = 0, suffix_tokens = 0, block_size = 0;
  std::int64_t prompt_tokens_total = 0;
  double shared_prefix_share = 0;  ///< prefix / (prefix + suffix)
  PrefixRun without_cache, with_cache;
  bool logprobs_identical = false;  ///< every logit of every suffix position, bit for bit
  std::int64_t positions_compared = 0;
  double max_abs_logprob_diff = 0;
  std::vector<TierPhase> tiers;  ///< the tiered run (empty without --tier-dir)
};

PrefixReport run_prefix_eval(const PrefixEvalOptions &options);
/// A child process's phase of the tiered run (--tier-child): one JSON line.
std::string run_tier_child(const PrefixEvalOptions &options);
void print_prefix_report(const PrefixReport &report, std::FILE *out);
void print_tier_report(const PrefixReport &report, std::FILE *out);
std::string prefix_json(const PrefixReport &report);

}  // namespace kvc_cli
