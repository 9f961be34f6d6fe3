// SPDX-License-Identifier: Apache-2.0
// `kvcache recommend`, sizing and choosing: every measured strategy scaled to
// the target geometry, length and batch (bytes from the pool's own layout,
// kvc_pool_seq_bytes), the pick among those meeting the quality floor, and what
// prefix caching (and a smaller block size) would save.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "../runner/error.h"
#include "recommend_int.h"
#include "strategy.h"

namespace kvc_cli::recommend {
using kvc_runner::RunnerError;

namespace {

/// a x b; throws kvc_runner::RunnerError naming `what` above 2^63.
std::uint64_t mul(std::uint64_t a, std::uint64_t b, const std::string &what) {
  if (a != 0 && b > kMaxBytes / a)
    throw RunnerError(what + " exceeds 2^63: the target is too large");
  return a * b;
}

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) {
  return a / b + (a % b != 0);
}

/// One measured row at the target: tokens held, bytes per sequence and in
/// total, whether it meets the floor and fits, and its headroom.
Row scale_row(const EvalRow &e, const Target &t) {
  Row r;
  r.m = e;
  std::optional<Strategy> st;
  std::string parse_error;
  try {
    st = parse_strategy(e.strategy);
  } catch (const RunnerError &err) {
    parse_error = err.what();
  }
  if (st) {
    r.evicts = st->protocol != Strategy::Protocol::None;
    // Every pool with a residual arena refuses the prefix cache (kvc_pool_enable_prefix_cache):
    // residual windows, hybrid precision, per-channel codecs (they stage a group) and sinks.
    const bool channel = (st->k_quantized && st->k_codec.granularity == KVC_SCALE_PER_CHANNEL) ||
                         (st->v_quantized && st->v_codec.granularity == KVC_SCALE_PER_CHANNEL);
    if (st->residual_window > 0 || st->residual_fraction > 0.0 || st->residual_sinks > 0 ||
        channel) {
      r.prefix_ok = false;
      r.prefix_refusal =
          "its codec stages tokens and encodes them as they age (residual window, hybrid "
          "precision, per-channel groups or attention sinks), and such pools refuse the prefix "
          "cache";
    }
    if (st->k_quantized && st->k_codec.granularity == KVC_SCALE_PER_CHANNEL)
      r.channel_group = st->k_codec.group_size;
  } else if (!e.kept_fraction) {
    throw RunnerError("result '" + e.strategy +
                      "' has no kept_fraction and this build cannot read its spec: " + parse_error);
  } else {
    r.prefix_ok = false;
    r.prefix_refusal = "this build does not know its spec";
  }
  if (st && st->protocol == Strategy::Protocol::Stream && st->budget_tokens > 0) {
    // A fixed cap of N tokens per layer: it holds min(N, length) at any length, so neither a
    // kept_fraction measured at the eval's ctx nor the default budget scales to --seq-len.
    r.cap_tokens = st->budget_tokens;
    r.kept_source = "spec";
  } else if (e.kept_fraction) {
    r.kept = *e.kept_fraction;
    r.kept_source = "measured";
  } else if (!r.evicts) {
    r.kept = 1.0;
    r.kept_source = "no eviction";
  } else if (st->protocol == Strategy::Protocol::Stream) {
    r.kept = st->budget;  // the cap: ceil(budget x length) tokens per layer
    r.kept_source = "spec";
  } else {
    // prefill-compress: P = prefill x n tokens keep budget x P, the rest is decoded uncompressed
    r.kept = 1.0 - (1.0 - st->budget) * st->prefill_fraction;
    r.kept_source = "spec";
  }
  r.evicts = r.evicts || r.kept < 1.0;
  // Bytes at the target: the pool's blocks at the target geometry, measured from the
  // library, with the rules by which its tokens are staged and encoded (kvc_pool_seq_bytes).
  if (st) {
    r.layout = pool_sizes(*st, t.geometry.num_layers, t.geometry.num_kv_heads, t.geometry.head_dim,
                          &r.layout_refusal);
  } else {
    r.layout_refusal = "this build does not know its spec";
  }
  if (!r.layout) {  // the measured bits per element carry over
    const long double bpt =
        static_cast<long double>(e.bits_per_element) * t.elements_per_token / 8.0L;
    if (!(bpt < static_cast<long double>(kMaxBytes)))
      throw RunnerError("bytes per token exceed 2^63");
    r.carried_bytes_per_token = static_cast<std::uint64_t>(std::ceil(bpt - 1e-6L));
    if (r.carried_bytes_per_token == 0) r.carried_bytes_per_token = 1;
  }
  r.tokens_held = r.held(t.seq_len);
  if (r.cap_tokens) r.kept = double(r.tokens_held) / double(t.seq_len);
  r.bytes_per_seq = r.seq_bytes_at(t.seq_len);
  r.bytes_per_token = ceil_div(r.bytes_per_seq, r.tokens_held);  // tokens_held >= 1
  r.bytes_total = mul(t.batch, r.bytes_per_seq, "the total size");
  r.budget_share = double(r.bytes_total) / double(t.memory);
  r.meets = e.ppl_delta_pct <= t.max_ppl_increase;
  r.fits = r.bytes_total <= t.memory;
  // Headroom: the largest batch at seq_len, the largest length at the batch, each searched
  // up to the largest --batch / --seq-len accepted (beyond them: "unbounded").
  r.largest_batch = t.memory / std::max<std::uint64_t>(r.bytes_per_seq, 1);
  r.batch_unbounded = r.largest_batch >= kMaxBatch;
  if (r.batch_unbounded) r.largest_batch = kMaxBatch;
  const std::uint64_t max_seq = t.memory / t.batch;  // bytes one sequence may take
  if (r.seq_bytes_at(kMaxSeqLen) <= max_seq) {
    r.seq_len_unbounded = true;
    r.largest_seq_len = kMaxSeqLen;
  } else {
    // seq_bytes_at() never decreases with the length: the largest n in [0, kMaxSeqLen) that fits.
    std::uint64_t lo = 0, hi = kMaxSeqLen;  // seq_bytes_at(lo) <= max_seq < seq_bytes_at(hi)
    while (hi - lo > 1) {
      const std::uint64_t mid = lo + (hi - lo) / 2;
      (r.seq_bytes_at(mid) <= max_seq ? lo : hi) = mid;
    }
    r.largest_seq_len = lo;
  }
  return r;
}

/// Tokens of the shared prefix a request can take from whole cached blocks of `block` tokens.
std::uint64_t reusable_tokens(const PrefixInput &in, std::uint64_t block) {
  // A lookup never serves the last prompt token: a prefix that is the whole prompt reuses P - 1 at
  // most.
  const std::uint64_t usable =
      std::min(in.prefix_tokens, in.prompt_tokens > 0 ? in.prompt_tokens - 1 : 0);
  return usable / block * block;
}

/// Memory the shared prefix saves for row `r` (batch - 1 sequences attach instead of storing it).
std::uint64_t shared_saving(const Row &r, const PrefixInput &in, const Target &t,
                            std::uint64_t block) {
  if (!r.prefix_ok || r.evicts || t.batch < 2) return 0;
  return mul(mul(t.batch - 1, reusable_tokens(in, block), "the shared tokens"), r.bytes_per_token,
             "the saving");
}

/// Why blocks must hold a multiple of the key group of `r`.
std::string channel_group_reason(const Row &r) {
  return r.m.strategy + " quantizes keys per channel over " + u(r.channel_group) +
         " tokens: a block must hold a multiple of " + u(r.channel_group);
}

/// `items` joined by `sep`, the last two by " and ".
std::string join(const std::vector<std::string> &items, const std::string &sep) {
  std::string s;
  for (std::size_t i = 0; i < items.size(); ++i)
    s += (i == 0 ? "" : i + 1 == items.size() ? " and " : sep) + items[i];
  return s;
}

}  // namespace

/// Least memory first; then the smaller quality loss, then the smaller bytes per token.
bool cheaper(const Row *a, const Row *b) {
  if (a->bytes_total != b->bytes_total) return a->bytes_total < b->bytes_total;
  if (a->m.ppl_delta_pct != b->m.ppl_delta_pct) return a->m.ppl_delta_pct < b->m.ppl_delta_pct;
  return a->bytes_per_token < b->bytes_per_token;
}

bool codec_takes_block(const Row &r, std::uint64_t block) {
  return !r.channel_group || block % r.channel_group == 0;
}

std::uint64_t with_sharing(const Row &r, const PrefixInput &in, const Target &t,
                           std::uint64_t block) {
  return r.bytes_total - shared_saving(r, in, t, block);
}

void choose(const Measurements &m, const Target &t, Choice &c) {
  std::vector<Row> &rows = c.rows;
  std::optional<Row> &reference = c.reference;
  for (const EvalRow &e : m.rows) {
    if (e.reference)
      reference = scale_row(e, t);
    else
      rows.push_back(scale_row(e, t));
  }
  if (reference->evicts)
    throw RunnerError(
        (m.source == "file" ? "eval report '" + m.path + "': " : std::string("eval run: ")) +
        "the reference row '" + reference->m.strategy +
        "' evicts tokens: the reference must be the dense cache every ppl_delta_pct is measured "
        "against");
  std::vector<const Row *> order;
  for (const Row &r : rows) order.push_back(&r);
  std::stable_sort(order.begin(), order.end(), cheaper);
  // The pick: the least memory among the rows meeting the floor; else the closest to it.
  const auto meeting =
      std::find_if(order.begin(), order.end(), [](const Row *r) { return r->meets; });
  const Row *pick = meeting == order.end() ? nullptr : *meeting;
  c.order = std::move(order);
  c.pick = pick;
  c.closest =
      pick ? nullptr
           : *std::min_element(c.order.begin(), c.order.end(), [](const Row *a, const Row *b) {
               return a->m.ppl_delta_pct < b->m.ppl_delta_pct;
             });
}

PrefixAnalysis analyze_prefix(const PrefixInput &in, const Target &t, const Choice &c) {
  const std::vector<Row> &rows = c.rows;
  const Row *pick = c.pick;
  const Row &reference = *c.reference;
  PrefixAnalysis a;
  const std::uint64_t B = in.block_size;
  const auto can_share = [&](const Row &r) { return r.prefix_ok && codec_takes_block(r, B); };
  // The row assessed: the pick (or the reference when nothing meets the floor); when it
  // cannot use the prefix cache at this block size, the cheapest row meeting the floor that can.
  const Row *first = pick ? pick : &reference;
  if (can_share(*first)) {
    a.subject = first;
  } else {
    for (const Row &r : rows) {
      if (r.meets && can_share(r) && (!a.subject || cheaper(&r, a.subject))) a.subject = &r;
    }
    a.subject_note =
        first->m.strategy +
        (first->prefix_ok
             ? " cannot use blocks of " + u(B) + (B == 1 ? " token" : " tokens") +
                   ": it quantizes keys per channel over " + u(first->channel_group) +
                   " tokens, so a block must hold a multiple of " + u(first->channel_group)
             : " cannot share blocks: " + first->prefix_refusal);
    if (a.subject)
      a.subject_note += "; assessed for " + a.subject->m.strategy +
                        ", the cheapest row meeting the floor that can";
  }
  // The least memory with the prefix shared among the rows meeting the floor that can use
  // this block size (ties: the pick, then the cheaper without sharing).
  for (const Row &r : rows) {
    if (!r.meets || !codec_takes_block(r, B)) continue;
    const Row *b = a.best_with_sharing;
    const std::uint64_t cost = with_sharing(r, in, t, B),
                        best_cost = b ? with_sharing(*b, in, t, B) : 0;
    if (!b || cost < best_cost ||
        (cost == best_cost && b != pick && (&r == pick || cheaper(&r, b))))
      a.best_with_sharing = &r;
  }
  if (!a.subject) {
    a.verdict =
        "prefix caching is not available: " + a.subject_note + ", and no row meeting the floor can";
    a.recommended_block_size = B;
    a.block_verdict = "no block-size advice without a row that can use the prefix cache";
    return a;
  }
  const Row &s = *a.subject;
  a.reusable = reusable_tokens(in, B);
  a.lost = in.prefix_tokens - a.reusable;
  a.memory_saved = shared_saving(s, in, t, B);
  a.memory_shared = a.memory_saved > 0;
  if (s.evicts)
    a.no_memory_reason =
        "it evicts tokens, and eviction compaction copies shared blocks before it writes into them";
  else if (t.batch < 2)
    a.no_memory_reason = "a batch of 1 shares with nobody";
  a.total_with_sharing = s.bytes_total - a.memory_saved;
  a.compute_per_request = in.prompt_tokens ? double(a.reusable) / double(in.prompt_tokens) : 0.0;
  a.compute_batch = a.compute_per_request * double(t.batch - 1) / double(t.batch);
  a.pays = a.reusable > 0;
  if (in.prefix_tokens == 0) {
    a.verdict = "prefix caching does not pay: no prefix is shared";
  } else if (a.reusable == 0) {
    a.verdict = "prefix caching does not pay: the shared prefix (" + u(in.prefix_tokens) +
                " tokens) holds no whole block of " + u(B) + " tokens" +
                (in.prefix_tokens >= in.prompt_tokens ? " before the prompt's last token" : "");
  } else {
    a.verdict = "prefix caching pays: each request after the first reuses " + u(a.reusable) +
                " of its " + u(in.prompt_tokens) + " prompt tokens (" +
                fmt("%.1f", 100.0 * a.compute_per_request) + "% of the prefill not recomputed; " +
                fmt("%.1f", 100.0 * a.compute_batch) + "% across a batch of " + u(t.batch) + ")";
    if (a.memory_shared) {
      a.verdict += " and the batch shares " + bytes_text(a.memory_saved) + " of cache (" +
                   fmt("%.1f", 100.0 * double(a.memory_saved) / double(t.memory)) +
                   "% of the budget)";
    } else {
      a.verdict += "; it saves no memory: " + a.no_memory_reason;
    }
  }
  // Block size: B, B/2, B/4 (those that are whole numbers). Smaller blocks reuse more of a
  // prefix that is not a whole number of blocks, and cost more block-table entries.
  const std::uint64_t table_B =
      mul(mul(ceil_div(t.seq_len, B), t.geometry.num_layers, "the block table"),
          kBlockTableEntryBytes, "the block table");
  const std::uint64_t saved_B = a.memory_saved;
  std::vector<std::string> not_whole;  // B / 2, B / 4 when they are not whole numbers
  for (std::uint64_t div : {1, 2, 4}) {
    if (B % div != 0) {
      not_whole.push_back(u(B) + " / " + u(div));
      continue;
    }
    BlockOption o;
    o.block_size = B / div;
    if (!codec_takes_block(s, o.block_size)) {
      o.valid = false;
      o.invalid_reason = channel_group_reason(s);
    }
    o.reusable = reusable_tokens(in, o.block_size);
    o.lost = in.prefix_tokens - o.reusable;
    o.table_bytes_per_seq =
        mul(mul(ceil_div(t.seq_len, o.block_size), t.geometry.num_layers, "the block table"),
            kBlockTableEntryBytes, "the block table");
    o.extra_saved = static_cast<std::int64_t>(shared_saving(s, in, t, o.block_size)) -
                    static_cast<std::int64_t>(saved_B);
    o.extra_table =
        static_cast<std::int64_t>(mul(t.batch, o.table_bytes_per_seq, "the block tables")) -
        static_cast<std::int64_t>(mul(t.batch, table_B, "the block tables"));
    o.net = o.extra_saved - o.extra_table;
    a.options.push_back(o);
  }
  const BlockOption *best = nullptr;
  for (const BlockOption &o : a.options) {
    if (o.block_size < B && o.valid && o.net > 0 && (!best || o.net > best->net)) best = &o;
  }
  if (best) {
    a.recommended_block_size = best->block_size;
    a.block_verdict =
        "lower the block size to " + u(best->block_size) + ": " + u(best->reusable) +
        " prefix tokens reusable per request instead of " + u(a.reusable) + " (" + u(best->lost) +
        " lost instead of " + u(a.lost) + "), saving " +
        bytes_text(static_cast<std::uint64_t>(best->extra_saved)) + " across the batch for " +
        bytes_text(static_cast<std::uint64_t>(best->extra_table)) + " more block tables";
    return a;
  }
  a.recommended_block_size = B;
  a.block_verdict = "keep block size " + u(B) + ": ";
  std::vector<const BlockOption *> smaller;  // the smaller sizes the codec can use
  std::vector<std::string> impossible;       // the smaller sizes it cannot
  for (const BlockOption &o : a.options) {
    if (o.block_size >= B) continue;
    if (o.valid)
      smaller.push_back(&o);
    else
      impossible.push_back(u(o.block_size));
  }
  if (smaller.empty()) {
    std::vector<std::string> why;
    if (!not_whole.empty())
      why.push_back(join(not_whole, ", ") +
                    (not_whole.size() == 1 ? " is not a whole number" : " are not whole numbers"));
    if (!impossible.empty())
      why.push_back("blocks of " + join(impossible, ", ") +
                    " are not possible: " + channel_group_reason(s));
    a.block_verdict += "no smaller block size to compare (" + join(why, "; ") + ")";
    return a;
  }
  // Among the smaller sizes that reuse more of the prefix, the one closest to paying.
  const BlockOption *more = nullptr;
  for (const BlockOption *o : smaller)
    if (o->reusable > a.reusable && (!more || o->net > more->net)) more = o;
  if (!more) {
    std::vector<std::string> sizes;
    const BlockOption *least = nullptr;  // the smallest block-table cost among them
    for (const BlockOption *o : smaller) {
      sizes.push_back(u(o->block_size));
      if (!least || o->extra_table < least->extra_table) least = o;
    }
    const std::string tables = u(static_cast<std::uint64_t>(least->extra_table));
    if (sizes.size() == 1)
      a.block_verdict += "block size " + sizes[0] + " reuses no more of the prefix (" +
                         u(a.reusable) + " tokens per request) and adds " + tables +
                         " bytes of block tables";
    else
      a.block_verdict += "smaller blocks (" + join(sizes, ", ") +
                         ") reuse no more of the prefix (" + u(a.reusable) +
                         " tokens per request) and add block tables (" + tables +
                         " bytes more at block size " + u(least->block_size) + ")";
  } else if (!a.memory_shared) {
    a.block_verdict +=
        "block size " + u(more->block_size) + " would reuse " + u(more->reusable - a.reusable) +
        " more prefix tokens per request (prefill skipped), but sharing saves no memory here (" +
        a.no_memory_reason + ") and its block tables take " +
        u(static_cast<std::uint64_t>(more->extra_table)) + " more bytes";
  } else {
    a.block_verdict += "block size " + u(more->block_size) + " would share " +
                       u(static_cast<std::uint64_t>(more->extra_saved)) +
                       " more bytes but its block tables take " +
                       u(static_cast<std::uint64_t>(more->extra_table)) + " more (net " +
                       std::to_string(more->net) + " bytes)";
  }
  return a;
}

std::uint64_t PoolSizes::peak(std::uint64_t n) const {
  kvc_pool_config c = cfg;
  c.k_codec = k_quantized ? &k_codec : nullptr;
  c.v_codec = v_quantized ? &v_codec : nullptr;
  std::uint64_t peak_bytes = 0;
  if (kvc_pool_seq_bytes(&c, n, nullptr, &peak_bytes) != KVC_OK)  // the same config sized before
    throw RunnerError(std::string("kvc_pool_seq_bytes: ") + kvc_last_error_message());
  return peak_bytes;
}

std::optional<PoolSizes> pool_sizes(const Strategy &s, std::uint32_t layers, std::uint32_t kv_heads,
                                    std::uint32_t head_dim, std::string *why) {
  kvc_runner::ModelConfig c;
  c.n_layers = static_cast<int>(layers);
  c.n_heads = c.n_kv_heads = static_cast<int>(kv_heads);
  c.dim = static_cast<int>(kv_heads * head_dim);
  const kvc_runner::PoolSettings ps = pool_settings(s);
  if (std::uint64_t(kv_heads) * head_dim > std::uint64_t(1) << 30) {
    if (why) *why = "the geometry is too large for a pool";
    return std::nullopt;
  }
  PoolSizes m;
  // One block is enough: block sizes do not depend on the capacity.
  m.cfg = kvc_runner::pool_config(c, ps, 1);
  // Sizes do not depend on RoPE; only pre-RoPE keys need it (and an even head_dim).
  if (!ps.pre_rope_keys) m.cfg.rope_style = KVC_ROPE_NONE;
  if (ps.k_codec) m.k_codec = *ps.k_codec, m.k_quantized = true;
  if (ps.v_codec) m.v_codec = *ps.v_codec, m.v_quantized = true;
  m.cfg.k_codec = m.k_quantized ? &m.k_codec : nullptr;
  m.cfg.v_codec = m.v_quantized ? &m.v_codec : nullptr;
  kvc_pool *pool = nullptr;
  if (kvc_pool_create(&m.cfg, &pool) != KVC_OK) {
    if (why) *why = kvc_last_error_message();
    return std::nullopt;
  }
  kvc_stats st;
  kvc_stats_init(&st);
  const kvc_status status = kvc_pool_stats(pool, &st);
  kvc_pool_destroy(pool);
  if (status != KVC_OK) {
    if (why) *why = kvc_last_error_message();
    return std::nullopt;
  }
  // set again on each call: a copy points to its own codecs
  m.cfg.k_codec = m.cfg.v_codec = nullptr;
  m.block_size = m.cfg.block_size;
  m.block_bytes = st.bytes_per_block;
  m.residual_block_bytes = m.cfg.num_residual_blocks ? st.residual_bytes_per_block : 0;
  m.window = m.cfg.residual_window;
  m.fraction = m.cfg.residual_fraction;
  for (const kvc_codec *codec : {ps.k_codec, ps.v_codec})
    if (codec && codec->granularity == KVC_SCALE_PER_CHANNEL)
      m.group = std::max<std::uint64_t>(m.group, codec->group_size);
  return m;
}

}  // namespace kvc_cli::recommend
