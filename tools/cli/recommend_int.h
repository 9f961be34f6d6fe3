// SPDX-License-Identifier: Apache-2.0
// `kvcache recommend`, internal (as SQLite pairs X.h with XInt.h): the types
// and calls its parts share. By role: loading the measurements and the prefix
// facts (recommend_load.cpp), sizing every strategy at the target and choosing
// (recommend_size.cpp), reporting as text or JSON (recommend_report.cpp), and
// run_recommend tying them together (recommend.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <kvcache/kvcache.h>

#include "memory.h"
#include "recommend.h"
#include "strategy.h"

namespace kvc_cli::recommend {

/// One block id (int32) per block of a sequence and per layer.
constexpr std::uint64_t kBlockTableEntryBytes = 4;
/// Largest byte count handled (sizes are signed in differences).
constexpr std::uint64_t kMaxBytes = std::uint64_t(1) << 63;
/// The largest --seq-len accepted; headroom is not searched beyond it.
constexpr std::uint64_t kMaxSeqLen = std::uint64_t(1) << 40;
/// The largest --batch accepted; headroom is not searched beyond it.
constexpr std::uint64_t kMaxBatch = std::uint64_t(1) << 30;

/// `v` printed with a printf `format` that takes one double.
inline std::string fmt(const char *format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

/// A byte count in binary units with the exact count: "1.50 GiB (1610612736 bytes)".
inline std::string bytes_text(std::uint64_t b) {
  return human_bytes(static_cast<long double>(b)) + " (" + std::to_string(b) + " bytes)";
}

/// An unsigned count in decimal.
inline std::string u(std::uint64_t v) {
  return std::to_string(v);
}

// ---- loading (recommend_load.cpp) ------------------------------------------------

/// One result row of an `eval --json` report: the fields recommend reads.
struct EvalRow {
  std::string strategy;         ///< its spec, as eval printed it
  bool reference = false;       ///< the dense row every ppl_delta_pct is measured against
  double bits_per_element = 0;  ///< on the eval's model
  double ppl_delta_pct = 0;     ///< perplexity change against the reference, percent
  /// Optional fields: the share of positions held (eviction), and the quality figures printed
  /// beside.
  std::optional<double> kept_fraction, ppl, kl_mean, top1_agreement;
};

/// The measured rows, from an `eval --json` file or an eval run here.
struct Measurements {
  std::string source;  ///< "file" or "eval"
  std::string path;    ///< the file (source "file")
  std::string model;   ///< the eval's model ("" when the report names none)
  std::optional<std::int64_t> ctx, tokens_scored;  ///< the eval's windows and tokens
  std::optional<std::int64_t> num_layers, num_kv_heads, head_dim;  ///< the eval model's geometry
  std::vector<EvalRow> rows;  ///< exactly one of them the reference
};

/// The shared prompt prefix, from the flags or an `eval --prefix --json` file.
struct PrefixInput {
  bool given = false;               ///< assessed at all (a flag or a file given)
  std::string source;               ///< "flags" or "file"
  std::string path;                 ///< the file (source "file")
  std::uint64_t prefix_tokens = 0;  ///< L
  std::uint64_t prompt_tokens = 0;  ///< P
  bool prompt_assumed = false;      ///< P taken as the whole seq_len
  double share = 0;                 ///< L / P
  std::uint64_t block_size = 16;    ///< the pool's block size assessed
  // Measured by `eval --prefix` (source "file").
  std::uint64_t m_block_size = 0, m_requests = 0, m_without = 0, m_with = 0;
  std::optional<double> m_hit_rate, m_ttft_without, m_ttft_with, m_speedup;
};

/// A number option as typed: the whole text must be a finite decimal number;
/// throws kvc_runner::RunnerError naming `flag` and what is expected.
double typed_number(const TypedOption &o, const std::string &flag, const std::string &expect);

/// The prefix facts of the options (--prefix-share, --prefix-tokens,
/// --block-size, or --from-prefix FILE) for sequences of `seq_len` tokens;
/// `given` is false when none was given. Throws kvc_runner::RunnerError for
/// contradicting flags or a bad file.
PrefixInput prefix_input(const RecommendOptions &o, std::uint64_t seq_len);

/// The measured rows: read from --from FILE, or measured by an eval run now
/// (read back through its JSON report, exactly as from a file). Throws
/// kvc_runner::RunnerError for a bad file.
Measurements measure(const RecommendOptions &o);

// ---- sizing and choosing (recommend_size.cpp) ------------------------------------

/// The target: a geometry, a length, a batch, a memory budget and a quality floor.
struct Target {
  Geometry geometry;                                 ///< a preset or explicit dimensions
  std::uint64_t elements_per_token = 0;              ///< 2 (K, V) x layers x KV heads x head_dim
  std::uint64_t seq_len = 0, batch = 0, memory = 0;  ///< tokens, sequences, bytes
  double max_ppl_increase = 0;                       ///< the quality floor, percent
};

/// A strategy's pool at the target geometry as the library sizes it: block
/// sizes from kvc_pool_stats() of a one-block pool, sequence sizes from
/// kvc_pool_seq_bytes() (the pool's own staging rules).
struct PoolSizes {
  kvc_pool_config
      cfg{};  ///< one block; its codec pointers are set on each call (to the codecs below)
  kvc_codec k_codec{}, v_codec{};
  bool k_quantized = false, v_quantized = false;
  std::uint64_t block_size = 16, block_bytes = 0;  ///< one codec block (K and V, one layer)
  std::uint64_t residual_block_bytes = 0;          ///< one residual block (0: no residual arena)
  /// The spec's staging parameters, named in the report's notes (the bytes
  /// they cost come from kvc_pool_seq_bytes, which knows how they combine).
  std::uint64_t window = 0;  ///< residual window (residual_window)
  std::uint64_t group = 0;   ///< per-channel group size of a codec (0: none)
  double fraction = 0;       ///< hybrid share (residual_fraction)
  /// The most bytes one sequence holds on its way to n tokens (saturates to UINT64_MAX).
  std::uint64_t peak(std::uint64_t n) const;
};

/// The sizes of strategy `s` at a geometry; std::nullopt (and why in `why`)
/// when the library refuses such a pool (e.g. a head_dim the codec cannot take).
std::optional<PoolSizes> pool_sizes(const Strategy &s, std::uint32_t layers, std::uint32_t kv_heads,
                                    std::uint32_t head_dim, std::string *why);

/// One measured strategy scaled to the target.
struct Row {
  EvalRow m;            ///< as measured
  bool evicts = false;  ///< it holds fewer tokens than it was fed
  double kept = 1.0;    ///< the share held at seq_len
  std::uint64_t cap_tokens =
      0;  ///< a fixed cap (tokens=N in its spec): min(N, length) held, whatever the length
  std::string kept_source;          ///< "measured", "spec", "no eviction"
  bool prefix_ok = true;            ///< the pool can share its blocks through the prefix cache
  std::string prefix_refusal;       ///< why it cannot (prefix_ok false)
  std::uint32_t channel_group = 0;  ///< keys per channel over G tokens: blocks hold a multiple of G
  std::uint64_t bytes_per_token = 0;  ///< bytes_per_seq / tokens_held, rounded up
  std::uint64_t tokens_held = 0;      ///< per sequence of seq_len tokens
  std::uint64_t bytes_per_seq = 0;    ///< the most one sequence holds on its way to seq_len tokens
  std::uint64_t bytes_total = 0;      ///< batch x bytes_per_seq
  /// The pool's layout at the target geometry (from the library); without it
  /// (a spec this build cannot read, or a pool the library refuses) the
  /// measured bits per element carry over: carried_bytes_per_token per token held.
  std::optional<PoolSizes> layout;
  std::string layout_refusal;  ///< why there is no layout
  std::uint64_t carried_bytes_per_token = 0;
  double budget_share = 0;                               ///< bytes_total / the memory budget
  bool meets = false, fits = false;                      ///< the quality floor; the memory budget
  std::uint64_t largest_batch = 0, largest_seq_len = 0;  ///< the headroom: at seq_len; at the batch
  bool batch_unbounded = false;  ///< even batch kMaxBatch fits (largest_batch is clamped to it)
  bool seq_len_unbounded =
      false;  ///< even seq-len kMaxSeqLen fits (largest_seq_len is clamped to it)

  /// Tokens held per sequence of n tokens: a fixed cap holds min(cap, n); a share holds
  /// ceil(kept x n), at least one token of a non-empty sequence.
  std::uint64_t held(std::uint64_t n) const {
    if (cap_tokens) return std::min(cap_tokens, n);
    if (kept >= 1.0 || n == 0) return n;
    const double t = std::ceil(kept * static_cast<double>(n) - 1e-9);
    if (!(t >= 1.0)) return 1;
    return t >= static_cast<double>(n) ? n : static_cast<std::uint64_t>(t);
  }
  /// Bytes one sequence needs to reach n tokens: the most its pool holds on the
  /// way (staged groups are released as they are encoded, so a length can hold
  /// less than a shorter one). Never decreases with n.
  std::uint64_t seq_bytes_at(std::uint64_t n) const {
    if (!layout) {  // saturating like kvc_pool_seq_bytes: the headroom search asks about lengths
                    // far beyond seq_len
      std::uint64_t b;
      return __builtin_mul_overflow(held(n), carried_bytes_per_token, &b) ? UINT64_MAX : b;
    }
    // held(n) is n without eviction. Evicting pools have no residual (their peak is whole
    // blocks of the held tokens); peak() keeps the size monotone even for a crafted
    // kept_fraction on a pool that stages.
    return layout->peak(held(n));
  }
};

/// The rows scaled to the target and the choice among them. Its pointers
/// point into itself: fill it in place (choose) and never copy it.
struct Choice {
  std::vector<Row> rows;  ///< every measured strategy but the reference, in the report's order
  std::optional<Row> reference;    ///< the dense reference row
  std::vector<const Row *> order;  ///< the rows, least memory first (cheaper)
  const Row *pick =
      nullptr;  ///< the least memory among the rows meeting the floor (nullptr: none does)
  const Row *closest = nullptr;  ///< without a pick: the row with the smallest ppl increase
  Choice() = default;
  Choice(const Choice &) = delete;
  Choice &operator=(const Choice &) = delete;
};

/// A block size compared with the current one for prefix sharing.
struct BlockOption {
  std::uint64_t block_size = 0;
  bool valid = true;           ///< the codec can use blocks of this size
  std::string invalid_reason;  ///< why not (valid false)
  std::uint64_t reusable = 0,
                lost = 0;  ///< prefix tokens per request taken from the cache; recomputed
  std::uint64_t table_bytes_per_seq = 0;  ///< block-table bytes of one sequence of seq_len tokens
  std::int64_t extra_saved = 0, extra_table = 0,
               net = 0;  ///< against the current block size, whole batch
};

/// Whether and how much prefix caching pays at the target, and the block-size advice.
struct PrefixAnalysis {
  const Row *subject = nullptr;  ///< the row assessed (nullptr: no prefix-capable row)
  std::string subject_note;      ///< why the subject is not the pick ("" when it is)
  std::uint64_t reusable = 0,
                lost = 0;  ///< prefix tokens per request taken from the cache; recomputed
  std::uint64_t memory_saved = 0, total_with_sharing = 0;  ///< across the batch
  bool memory_shared = false;  ///< sharing saves memory (batch > 1, no eviction)
  std::string no_memory_reason;
  double compute_per_request = 0, compute_batch = 0;  ///< share of the prefill not recomputed
  bool pays = false;                                  ///< a request reuses at least one whole block
  std::string verdict;                                ///< the sentence the report prints
  const Row *best_with_sharing =
      nullptr;  ///< least memory with the prefix shared, among rows meeting the floor
  std::vector<BlockOption> options;  ///< block sizes B, B/2, B/4 (the whole numbers)
  std::uint64_t recommended_block_size = 0;
  std::string block_verdict;  ///< the block-size advice the report prints
};

/// Least memory first; then the smaller quality loss, then the smaller bytes per token.
bool cheaper(const Row *a, const Row *b);

/// Scales every measured row to the target (tokens held, bytes per sequence
/// from the pool's layout, budget share, headroom) and picks the least memory
/// meeting the floor, else the closest to it. Fills `c` in place. Throws
/// kvc_runner::RunnerError when the reference row evicts or a row cannot be sized.
void choose(const Measurements &m, const Target &t, Choice &c);

/// Whether the codec of `r` can use blocks of `block` tokens: keys quantized per channel over
/// G tokens need blocks holding a multiple of G.
bool codec_takes_block(const Row &r, std::uint64_t block);

/// The memory of `r` with the prefix shared at `block` tokens per block.
std::uint64_t with_sharing(const Row &r, const PrefixInput &in, const Target &t,
                           std::uint64_t block);

/// Prefix caching for the choice: the row assessed (the pick, the reference
/// when nothing meets the floor, or the cheapest row meeting the floor that can
/// share blocks), the tokens reused, the memory and compute saved, the least
/// memory with the prefix shared, and the block sizes B, B/2 and B/4 compared.
PrefixAnalysis analyze_prefix(const PrefixInput &in, const Target &t, const Choice &c);

// ---- reporting (recommend_report.cpp) --------------------------------------------

/// The recommendation as one JSON object on stdout (the keys docs/recommend.md lists).
void print_json_report(const Target &t, const Measurements &m, const Choice &c,
                       const PrefixInput &prefix, const PrefixAnalysis &pa);

/// The recommendation as text on stdout: the target and measurements, the pick
/// (or the closest row) in detail with its headroom, the table of the cheaper
/// rows and runners-up, and prefix caching.
void print_text_report(const Target &t, const Measurements &m, const Choice &c,
                       const PrefixInput &prefix, const PrefixAnalysis &pa);

}  // namespace kvc_cli::recommend
