// Eviction: a policy picks the tokens each layer keeps; the survivors are
// compacted, in order, into the fewest blocks; emptied blocks are freed;
// shared blocks are copied before they are written; positions (and, for
// StreamingLLM's in-cache positions, the keys' rotary embedding) follow.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "common/convert.h"
#include "common/error.h"
#include "common/rope.h"
#include "core/pool.h"
#include "policy/plugin.h"

namespace kvc::core {

void PoolCore::enable_scores(Sequence &s) {
  if (s.track_scores) return;
  std::vector<std::vector<float>> fresh(s.layers.size());  // may throw: nothing changed
  for (size_t i = 0; i < s.layers.size(); ++i)
    fresh[i].assign(s.layers[i].n_tokens * cfg_.num_kv_heads, 0.0f);
  for (size_t i = 0; i < s.layers.size(); ++i) s.layers[i].scores.swap(fresh[i]);
  s.track_scores = true;
}

const PolicySpec *PoolCore::policy_of(const Sequence &s) const {
  if (s.policy) return s.policy.get();
  return default_policy_.get();
}

// DuoAttention's gates name a pool's KV heads one by one: a table per head
// (a head-wise pool, or one KV head per layer) and one gate per table.
void PoolCore::check_duo_fits(const PolicySpec &p) const {
  if (p.kind != PolicyKind::DuoAttention) return;
  if (cfg_.num_kv_heads != 1)
    fail(Errc::Unsupported,
         "duo-attention keeps every token in retrieval heads and a window in streaming heads: "
         "it needs a head-wise pool (KVC_POOL_HEADWISE)");
  if (p.head_gates.size() != cfg_.num_layers)
    fail(Errc::InvalidArgument, "duo-attention: " + u64s(p.head_gates.size()) +
                                    " head gates for a pool of " + u64s(num_layers()) +
                                    " layers x " + u64s(heads()) + " KV heads");
}

// Head-wise pools: keys keep their text positions (a per-head RoPE position
// would need a per-head kvc_seq_rope_positions); AdaKV needs one.
void PoolCore::check_headwise_fits(const PolicySpec &p) const {
  if (p.shift_positions && headwise())
    fail(Errc::Unsupported,
         "shift_positions in a head-wise pool (KVC_POOL_HEADWISE): heads keep different tokens, "
         "so in-cache positions would differ per head; keys keep their text positions here");
  if (p.head_budget == policy::HeadBudget::AdaKV && !headwise())
    fail(Errc::Unsupported,
         "AdaKV head budgets (KVC_HEAD_BUDGET_ADAKV) need a head-wise pool (KVC_POOL_HEADWISE): "
         "a token-wise pool keeps the same tokens in every KV head");
}

// Policies this pool cannot run are refused when attached, not at the first
// reservation that would evict.
void PoolCore::check_policy_fits(const PolicySpec *p) const {
  if (!p) return;
  check_duo_fits(*p);
  check_headwise_fits(*p);
  if (p->shift_positions && cfg_.rope_style == RopeStyle::None)
    fail(Errc::InvalidArgument,
         "the policy shifts positions but the pool has no RoPE parameters (rope_style)");
  if (p->shift_positions && fmt_.per_tensor(0) && !fmt_.pre_rope)
    fail(Errc::Unsupported,
         "the policy shifts positions but keys use one scale per tensor: rotated keys can "
         "exceed it (use per-token or per-group scales)");
  if (p->auto_evict && p->kind != PolicyKind::None && stage_.active)
    fail(Errc::Unsupported,
         "auto-eviction in a pool with a residual window, hybrid precision or attention sinks "
         "is not supported");
}

void Pool::set_policy(std::optional<uint64_t> id, std::shared_ptr<const PolicySpec> p) {
  std::unique_lock lk(mu_);
  if (!id) {
    check_policy_fits(p.get());
    default_policy_ = std::move(p);
    return;
  }
  Sequence &s = find(*id);
  check_policy_fits(p.get());
  if (p && p->needs_scores()) enable_scores(s);
  s.policy = std::move(p);
}

void Pool::observe_scores(uint64_t id, uint32_t layer, const float *scores, uint64_t n,
                          bool accumulate) {
  std::unique_lock lk(mu_);
  Sequence &s = find(id);
  check_caller_layer(layer);
  const uint32_t H = heads();
  if (H > 1) check_heads_agree(s, layer, "kvc_seq_observe_scores");
  const LayerTable &l0 = s.layers[static_cast<size_t>(layer) * H];
  const uint64_t h = cfg_.num_kv_heads * H;  // scores per token: the caller's KV heads
  if (n != l0.n_tokens)
    fail(Errc::InvalidArgument, "scores for " + u64s(n) + " tokens but layer " + u64s(layer) +
                                    " holds " + u64s(l0.n_tokens));
  for (uint64_t i = 0; i < n * h; ++i)
    if (!std::isfinite(scores[i]) || scores[i] < 0.0f)
      fail(Errc::NonFinite, "score " + u64s(i) + " is negative, NaN or Inf: nothing was changed");
  enable_scores(s);
  if (H == 1) {
    std::vector<float> &dst = s.layers[layer].scores;
    for (uint64_t i = 0; i < n * h; ++i) dst[i] = accumulate ? dst[i] + scores[i] : scores[i];
    return;
  }
  for (uint32_t hh = 0; hh < H; ++hh) {  // head-wise: head hh's column to its table
    std::vector<float> &dst = s.layers[static_cast<size_t>(layer) * H + hh].scores;
    for (uint64_t i = 0; i < n; ++i)
      dst[i] = accumulate ? dst[i] + scores[i * H + hh] : scores[i * H + hh];
  }
}

policy::QueryStats Pool::query_stats(const void *q, DType q_dtype, uint64_t n, uint32_t num_q_heads,
                                     const int32_t *positions) const {
  const uint64_t hd = cfg_.head_dim;
  if (num_q_heads != cfg_.num_q_heads)
    fail(Errc::InvalidArgument,
         "num_q_heads " + u64s(num_q_heads) + " differs from the pool's " + u64s(cfg_.num_q_heads));
  if (q_dtype != DType::F32 && q_dtype != DType::F16 && q_dtype != DType::BF16)
    fail(Errc::InvalidArgument, "q_dtype must be f32, f16 or bf16");
  if (n > (uint64_t(1) << 31)) fail(Errc::Overflow, "n " + u64s(n) + ": too many query rows");
  policy::QueryStats st;
  if (n == 0) return st;
  const uint64_t row = static_cast<uint64_t>(num_q_heads) * hd;
  std::vector<float> x(n * row);
  convert(q, q_dtype, x.data(), DType::F32, x.size());
  for (uint64_t i = 0; i < x.size(); ++i)
    if (!std::isfinite(x[i]))
      fail(Errc::NonFinite, "query value " + u64s(i) + " is NaN or Inf: nothing was changed");
  for (uint64_t i = 0; i < n; ++i)
    if (positions[i] < 0) fail(Errc::InvalidArgument, "position " + u64s(i) + " is negative");
  if (cfg_.rope_style != RopeStyle::None) {  // back to the pre-RoPE frame
    RopeShift rope(cfg_.head_dim, cfg_.rope_dims ? cfg_.rope_dims : cfg_.head_dim,
                   cfg_.rope_style == RopeStyle::Interleaved, cfg_.rope_theta);
    for (uint64_t i = 0; i < n; ++i)
      for (uint32_t h = 0; h < num_q_heads; ++h)
        rope.rotate(x.data() + i * row + h * hd, -positions[i]);
  }
  for (uint64_t i = 0; i < n; ++i) st.add(x.data() + i * row, num_q_heads, cfg_.head_dim);
  return st;
}

void Pool::merge_query_stats(uint32_t layer, const uint64_t *ids, const policy::QueryStats *stats,
                             size_t n_seqs) {
  std::shared_lock lk(mu_);
  check_layer(layer);
  std::vector<Sequence *> seqs(n_seqs);
  for (size_t i = 0; i < n_seqs; ++i) seqs[i] = &find(ids[i]);
  std::lock_guard<std::mutex> g(scores_mu_);
  // First merges (empty statistics) copy: made before any change.
  std::vector<policy::QueryStats> fresh(n_seqs);
  for (size_t i = 0; i < n_seqs; ++i)
    if (seqs[i]->layers[layer].qstats.count == 0) fresh[i].merge(stats[i]);
  for (size_t i = 0; i < n_seqs; ++i) {
    policy::QueryStats &dst = seqs[i]->layers[layer].qstats;
    if (dst.count == 0)
      std::swap(dst, fresh[i]);
    else
      dst.merge(stats[i]);  // same shape: adds, cannot throw
  }
}

void Pool::observe_queries(uint64_t id, uint32_t layer, const void *q, DType q_dtype, uint64_t n,
                           uint32_t num_q_heads, const int32_t *positions) {
  const uint32_t H = heads();
  if (H > 1) {  // head-wise: each head's table gets the statistics of its query heads
    const uint32_t q_heads = cfg_.num_q_heads * H;
    if (num_q_heads != q_heads)
      fail(Errc::InvalidArgument,
           "num_q_heads " + u64s(num_q_heads) + " differs from the pool's " + u64s(q_heads));
    if (q_dtype != DType::F32 && q_dtype != DType::F16 && q_dtype != DType::BF16)
      fail(Errc::InvalidArgument, "q_dtype must be f32, f16 or bf16");
    if (n > (uint64_t(1) << 31)) fail(Errc::Overflow, "n " + u64s(n) + ": too many query rows");
    {
      std::shared_lock lk(mu_);
      find(id);
      check_caller_layer(layer);
    }
    if (n == 0) return;
    const uint64_t eb = static_cast<uint64_t>(bits_of(q_dtype)) / 8;
    const uint64_t gb = uint64_t(cfg_.num_q_heads) * cfg_.head_dim * eb, rb = gb * H;
    std::vector<policy::QueryStats> st(H);
    std::vector<uint8_t> part(n * gb);
    for (uint32_t hh = 0; hh < H; ++hh) {
      for (uint64_t r = 0; r < n; ++r)
        std::memcpy(&part[r * gb], static_cast<const uint8_t *>(q) + r * rb + hh * gb, gb);
      st[hh] = query_stats(part.data(), q_dtype, n, cfg_.num_q_heads, positions);
    }
    for (uint32_t hh = 0; hh < H; ++hh) merge_query_stats(layer * H + hh, &id, &st[hh], 1);
    return;
  }
  const policy::QueryStats st = query_stats(q, q_dtype, n, num_q_heads, positions);
  if (n == 0) {  // the sequence and layer are still checked
    std::shared_lock lk(mu_);
    find(id);
    check_layer(layer);
    return;
  }
  merge_query_stats(layer, &id, &st, 1);
}

void Pool::read_scores(uint64_t id, uint32_t layer, float *out, uint64_t n) const {
  std::shared_lock lk(mu_);
  const Sequence &s = find(id);
  check_caller_layer(layer);
  const uint32_t H = heads();
  if (H > 1) check_heads_agree(s, layer, "kvc_seq_scores");
  const LayerTable &l = s.layers[static_cast<size_t>(layer) * H];
  if (n != l.n_tokens)
    fail(Errc::BufferTooSmall,
         "layer " + u64s(layer) + " holds " + u64s(l.n_tokens) + " tokens, not " + u64s(n));
  const uint64_t cnt = n * cfg_.num_kv_heads * H;
  // observing attention writes them under the shared lock
  std::lock_guard<std::mutex> g(scores_mu_);
  if (!s.track_scores)
    std::fill(out, out + cnt, 0.0f);
  else if (H == 1)
    std::memcpy(out, l.scores.data(), cnt * sizeof(float));
  else
    for (uint32_t hh = 0; hh < H; ++hh) {
      const std::vector<float> &src = s.layers[static_cast<size_t>(layer) * H + hh].scores;
      for (uint64_t i = 0; i < n; ++i) out[i * H + hh] = src[i];
    }
}

void Pool::rope_positions(uint64_t id, uint32_t layer, uint64_t pos, uint64_t n,
                          int32_t *out) const {
  std::shared_lock lk(mu_);
  const Sequence &s = find(id);
  check_caller_layer(layer);
  if (heads() > 1) check_heads_agree(s, layer, "kvc_seq_rope_positions");
  const LayerTable &l = s.layers[static_cast<size_t>(layer) * heads()];
  if (n > s.length || pos > s.length - n || pos < l.tail_pos)
    fail(Errc::OutOfRange, "positions [" + u64s(pos) + ", " + u64s(pos + n) +
                               ") are not the layer's tail (" + u64s(l.tail_pos) + " to " +
                               u64s(s.length) + ")");
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t idx = l.tail_index + (pos + i - l.tail_pos);
    out[i] = static_cast<int32_t>(l.rope_by_index ? idx : pos + i);
  }
}

void Pool::evict(uint64_t id, const PolicySpec *policy, uint64_t *dropped) {
  std::unique_lock lk(mu_);
  Sequence &s = find(id);
  const PolicySpec *p = policy ? policy : policy_of(s);
  if (!p) {  // no policy: nothing to do
    if (dropped) std::fill(dropped, dropped + num_layers(), 0);
    return;
  }
  evict_locked(id, s, *p, 0, dropped);
}

// What a streaming head (StreamingLLM; a DuoAttention streaming head) keeps
// before a reservation of at least as many new tokens as its cap: its
// attention sinks (at least one token), never fewer.
static uint64_t sinks_floor(const PolicySpec &p, uint64_t n) {
  return std::max<uint64_t>(1, std::min<uint64_t>(n, p.sink_tokens));
}

void PoolCore::evict_locked(uint64_t id, Sequence &s, const PolicySpec &p, uint64_t reserve_new,
                            uint64_t *dropped) {
  const uint32_t nl = cfg_.num_layers, H = heads(), L = nl / H;  // tables, heads, layers
  const uint64_t bs = cfg_.block_size, h = cfg_.num_kv_heads, hd = cfg_.head_dim, row = h * hd;
  // ---- plan: every check and allocation before the first change ----
  std::vector<std::vector<uint32_t>> keep(nl);
  std::vector<uint64_t> first_write(nl, UINT64_MAX);
  std::vector<char> shift(nl, 0);
  Need cow_needed(*this);
  check_duo_fits(p);
  check_headwise_fits(p);
  // KVzip under a compression ratio: the layers' budgets shared by one
  // threshold over all of them (with budget_tokens set, budgets stay per layer).
  if (p.kind == PolicyKind::KVzip && !s.track_scores)
    fail(Errc::InvalidArgument,
         "kvzip needs the attention scores of sequence " + u64s(id) +
             ": observe the context-reconstruction pass first (KVC_OBSERVE_MAX on a fork of "
             "the sequence, then kvc_seq_observe_scores)");
  std::vector<uint64_t> shared;
  if (p.kind == PolicyKind::KVzip && !reserve_new && p.budget_tokens == 0 &&
      p.compression_ratio > 0.0) {
    std::vector<LayerView> views(nl);
    shared.resize(nl);
    for (uint32_t li = 0; li < nl; ++li) {
      const LayerTable &l = s.layers[li];
      views[li].n = l.n_tokens;
      views[li].kv_heads = static_cast<uint32_t>(h);
      views[li].scores = s.track_scores ? l.scores.data() : nullptr;
      shared[li] = layer_target(p, li / H, L, l.n_tokens);
    }
    // AdaKV on a head-wise pool: the shared threshold runs over every
    // (layer, head) table, each keeping its floor of its uniform budget first.
    const bool ada = p.head_budget == policy::HeadBudget::AdaKV;
    policy::shared_targets(p, views, shared, ada ? p.head_floor : 0.0);
  }
  // The views of one layer's tables (its KV heads in a head-wise pool), with
  // the keys, values and future-query moments the policy reads.
  std::vector<LayerView> views(H);
  std::vector<std::vector<float>> keys(H), values(H);
  std::vector<std::vector<double>> q_mean(H), q_cov(H);
  std::vector<std::vector<int32_t>> pos(H);
  std::vector<uint64_t> target(H);
  std::vector<std::vector<uint32_t>> ada;
  for (uint32_t layer = 0; layer < L; ++layer) {
    bool any = false;
    const bool layer_cap = p.head_budget == policy::HeadBudget::AdaKV;
    if (reserve_new && layer_cap) {
      // AdaKV under a cap: the layer's heads share H x budget_tokens (a head
      // may hold more than the cap while others hold less); room is made for
      // the new tokens when the layer's total would pass it.
      uint64_t total = 0;
      for (uint32_t hh = 0; hh < H; ++hh) total += s.layers[layer * H + hh].n_tokens + reserve_new;
      uint64_t cap_total;
      if (__builtin_mul_overflow(uint64_t(H), p.budget_tokens, &cap_total)) cap_total = UINT64_MAX;
      if (total <= cap_total) continue;
      // (PyramidKV: the layer's share of the cap)
      const uint64_t cap = std::min(p.budget_tokens, layer_target(p, layer, L, p.budget_tokens));
      for (uint32_t hh = 0; hh < H; ++hh) target[hh] = cap > reserve_new ? cap - reserve_new : 1;
      any = true;
    }
    for (uint32_t hh = 0; hh < H && !(reserve_new && layer_cap); ++hh) {
      const uint32_t li = layer * H + hh;
      const uint64_t n = s.layers[li].n_tokens;
      uint64_t t;
      if (p.kind == PolicyKind::DuoAttention) {  // retrieval heads keep all; streaming: S + W
        const uint64_t cap = uint64_t(p.sink_tokens) + p.recent_tokens;
        t = !policy::duo_streams(p, li) ? n
            : !reserve_new              ? std::min(n, cap)
            : n + reserve_new <= cap    ? n
            : cap > reserve_new         ? cap - reserve_new
                                        : sinks_floor(p, n);
      } else if (reserve_new) {  // auto-eviction before a reservation: make room under the cap
        t = n + reserve_new <= p.budget_tokens
                ? n
                : std::min(p.budget_tokens > reserve_new     ? p.budget_tokens - reserve_new
                           : p.kind == PolicyKind::Streaming ? sinks_floor(p, n)
                                                             : 1,
                           layer_target(p, layer, L, n));
      } else if (layer_cap && shared.empty()) {
        // AdaKV: every head's budget is the layer's uniform one (its largest
        // head's), so a head holding fewer tokens leaves the rest to the others.
        uint64_t most = 0, held = 0;
        for (uint32_t h2 = 0; h2 < H; ++h2) {
          most = std::max(most, s.layers[layer * H + h2].n_tokens);
          held += s.layers[layer * H + h2].n_tokens;
        }
        t = layer_target(p, layer, L, most);
        uint64_t all;
        if (__builtin_mul_overflow(uint64_t(H), t, &all)) all = UINT64_MAX;
        target[hh] = t;
        any = held > all;
        continue;
      } else {
        t = shared.empty() ? layer_target(p, layer, L, n) : shared[li];
      }
      target[hh] = t;
      any = any || (n != 0 && t < n);
    }
    if (!any || p.kind == PolicyKind::None) continue;
    if (stage_.active)
      fail(Errc::Unsupported,
           "eviction in a pool with a residual window, hybrid precision or attention "
           "sinks (KIVI, per-channel keys, residual_sinks) is not supported: their tokens "
           "are staged and encoded as they age");
    for (uint32_t hh = 0; hh < H; ++hh) {
      const uint32_t li = layer * H + hh;
      const LayerTable &l = s.layers[li];
      const uint64_t n = l.n_tokens;
      LayerView &v = views[hh];
      v = LayerView{};
      v.n = n;
      v.kv_heads = static_cast<uint32_t>(h);
      v.head_dim = static_cast<uint32_t>(hd);
      v.layer = layer;
      v.num_layers = L;
      v.scores = s.track_scores ? l.scores.data() : nullptr;
      if (n == 0) continue;
      if (p.kind == PolicyKind::ExpectedAttention) {
        if (l.qstats.count == 0)
          fail(Errc::InvalidArgument,
               "expected attention needs the queries' statistics of layer " + u64s(layer) +
                   " of sequence " + u64s(id) +
                   ": observe queries first (KVC_OBSERVE_QUERIES or kvc_seq_observe_queries)");
        values[hh].resize(n * row);
        policy::future_moments(
            l.qstats, cfg_.num_q_heads, cfg_.head_dim,
            cfg_.rope_style == RopeStyle::None ? 0u
                                               : (cfg_.rope_dims ? cfg_.rope_dims : cfg_.head_dim),
            cfg_.rope_style == RopeStyle::Interleaved, cfg_.rope_theta,
            l.rope_by_index ? l.n_tokens : s.length, p.future_positions, q_mean[hh], q_cov[hh]);
        v.q_heads = cfg_.num_q_heads;
        v.q_mean = q_mean[hh].data();
        v.q_cov = q_cov[hh].data();
        v.values = values[hh].data();
      }
      if (p.needs_keys()) {
        keys[hh].resize(n * row);
        pos[hh].resize(n);
        store_->read(li, l, 0, n, keys[hh].data(),
                     p.kind == PolicyKind::ExpectedAttention ? values[hh].data() : nullptr,
                     DType::F32);
        for (uint64_t t = 0; t < n; ++t) pos[hh][t] = static_cast<int32_t>(l.position_of(t));
        v.keys = keys[hh].data();
        v.positions = pos[hh].data();
      }
    }
    if (p.head_budget == policy::HeadBudget::AdaKV && shared.empty()) {
      policy::adakv_keep(p, views, target, ada);
      for (uint32_t hh = 0; hh < H; ++hh) keep[layer * H + hh].swap(ada[hh]);
    } else {
      for (uint32_t hh = 0; hh < H; ++hh)
        if (views[hh].n) select_keep(p, views[hh], target[hh], keep[layer * H + hh]);
    }
    for (uint32_t hh = 0; hh < H; ++hh) {
      const uint32_t li = layer * H + hh;
      const LayerTable &l = s.layers[li];
      const std::vector<uint32_t> &k = keep[li];
      if (l.n_tokens == 0 || k.size() == l.n_tokens) continue;
      const bool sh = p.shift_positions || l.rope_by_index;
      if (sh && cfg_.rope_style == RopeStyle::None)
        fail(Errc::InvalidArgument,
             "the policy shifts positions but the pool has no RoPE parameters (rope_style)");
      if (sh && fmt_.per_tensor(0, li) && !fmt_.pre_rope)
        fail(Errc::Unsupported,
             "shifting positions re-rotates keys, which one scale per tensor cannot hold "
             "(use per-token or per-group key scales); nothing changed");
      shift[li] = sh;
      uint64_t fw = k.size();
      for (uint64_t j = 0; j < k.size(); ++j)
        if (k[j] != j || (sh && l.rope_position_of(k[j]) != static_cast<int64_t>(j))) {
          fw = j;
          break;
        }
      first_write[li] = fw;
      const uint64_t kept_blocks = (k.size() + bs - 1) / bs;
      for (uint64_t b = fw / bs; b < kept_blocks; ++b)
        if (alloc_.refcount(l.blocks[b]) > 1) cow_needed.add_block(l.blocks[b], 1);
    }
  }
  std::vector<uint64_t> per_table(nl, 0);
  apply_keep_locked(s, keep, first_write, shift, cow_needed, per_table.data());
  if (dropped)  // per caller's layer: a head-wise layer's (token, KV head) pairs
    for (uint32_t layer = 0; layer < L; ++layer) {
      dropped[layer] = 0;
      for (uint32_t hh = 0; hh < H; ++hh) dropped[layer] += per_table[layer * H + hh];
    }
}

void Pool::keep_tokens(uint64_t id, uint32_t layer, const uint64_t *keep_idx, uint64_t n_keep,
                       uint64_t *dropped, std::optional<uint32_t> head) {
  // dropped: [1], the tokens this layer (head) lost; a head-wise layer's
  // (token, KV head) pairs when every head is kept alike.
  std::unique_lock lk(mu_);
  Sequence &s = find(id);
  if (layer >= num_layers())
    fail(Errc::OutOfRange,
         "layer " + u64s(layer) + " of a pool of " + u64s(num_layers()) + " layers");
  const uint32_t nl = cfg_.num_layers, H = heads();
  const uint64_t bs = cfg_.block_size;
  // The tables: the layer's; one head's; or every head of a head-wise layer.
  uint32_t t0 = layer * H, tn = H;
  if (head) {
    if (!headwise())
      fail(Errc::Unsupported,
           "kvc_seq_keep_head: a token-wise pool keeps the same tokens in "
           "every KV head (use kvc_seq_keep, or a KVC_POOL_HEADWISE pool)");
    if (*head >= H)
      fail(Errc::OutOfRange, "head " + u64s(*head) + ": the pool has " + u64s(H) + " KV heads");
    t0 += *head;
    tn = 1;
  } else if (H > 1) {
    check_heads_agree(s, layer, "kvc_seq_keep");
  }
  const std::string where = "layer " + u64s(layer) + (head ? " head " + u64s(*head) : "");
  const uint64_t n = s.layers[t0].n_tokens;
  if (n_keep > n)
    fail(Errc::InvalidArgument, "n_keep " + u64s(n_keep) + " exceeds the " + u64s(n) + " tokens " +
                                    where + " holds; nothing changed");
  std::vector<std::vector<uint32_t>> keep(nl);
  std::vector<uint64_t> first_write(nl, UINT64_MAX);
  std::vector<char> shift(nl, 0);
  std::vector<uint32_t> &k = keep[t0];
  k.reserve(n_keep);
  for (uint64_t j = 0; j < n_keep; ++j) {
    const uint64_t t = keep_idx[j];
    if (t >= n)
      fail(Errc::OutOfRange, "keep[" + u64s(j) + "] = " + u64s(t) + " is not below the " + u64s(n) +
                                 " tokens " + where + " holds; nothing changed");
    if (j > 0 && t <= keep_idx[j - 1])
      fail(Errc::InvalidArgument, "keep[" + u64s(j) + "] = " + u64s(t) + " does not follow keep[" +
                                      u64s(j - 1) + "] = " + u64s(keep_idx[j - 1]) +
                                      ": indices must increase strictly; nothing changed");
    k.push_back(static_cast<uint32_t>(t));
  }
  Need cow_needed(*this);
  if (n_keep < n) {
    if (stage_.active)
      fail(Errc::Unsupported,
           "dropping tokens from a pool with a residual window, hybrid precision or attention "
           "sinks (KIVI, per-channel keys, residual_sinks) is not supported: their tokens "
           "are staged and encoded as they age; nothing changed");
    uint64_t fw = n_keep;
    for (uint64_t j = 0; j < n_keep; ++j)
      if (k[j] != j) {
        fw = j;
        break;
      }
    const uint64_t kept_blocks = (n_keep + bs - 1) / bs;
    for (uint32_t t = t0; t < t0 + tn; ++t) {
      if (t != t0) keep[t] = k;
      first_write[t] = fw;
      for (uint64_t b = fw / bs; b < kept_blocks; ++b)
        if (alloc_.refcount(s.layers[t].blocks[b]) > 1)
          cow_needed.add_block(s.layers[t].blocks[b], 1);
    }
  }
  std::vector<uint64_t> per_table(nl, 0);
  apply_keep_locked(s, keep, first_write, shift, cow_needed, per_table.data());
  if (dropped) {
    *dropped = 0;
    for (uint32_t t = t0; t < t0 + tn; ++t) *dropped += per_table[t];
  }
}

void PoolCore::apply_keep_locked(Sequence &s, const std::vector<std::vector<uint32_t>> &keep,
                                 const std::vector<uint64_t> &first_write,
                                 const std::vector<char> &shift, const Need &cow_needed,
                                 uint64_t *dropped) {
  const uint32_t nl = cfg_.num_layers;
  const uint64_t bs = cfg_.block_size, h = cfg_.num_kv_heads, hd = cfg_.head_dim, row = h * hd;
  if (!fits(cow_needed))
    fail(Errc::PoolExhausted, "pool exhausted: eviction must copy " + u64s(cow_needed.total()) +
                                  " shared blocks, " + u64s(alloc_.available()) + " available" +
                                  class_detail(cow_needed, false) + "; nothing changed");
  // Buffers the changes need (may throw: nothing changed yet).
  std::vector<std::vector<int32_t>> new_pos(nl);
  for (uint32_t li = 0; li < nl; ++li)
    if (first_write[li] != UINT64_MAX) new_pos[li].reserve(keep[li].size());
  const uint32_t rope_dims = cfg_.rope_dims ? cfg_.rope_dims : cfg_.head_dim;
  RopeShift rope(cfg_.head_dim, rope_dims, cfg_.rope_style == RopeStyle::Interleaved,
                 cfg_.rope_theta);
  scratch_input(2 * row);     // rotate_keys's row buffer (core's scratch), grown before any change
  std::vector<uint64_t> idx;  // keys to re-rotate and by how much (room for the largest layer)
  std::vector<int64_t> delta;
  {
    size_t most = 0;
    for (uint32_t li = 0; li < nl; ++li)
      if (shift[li]) most = std::max(most, keep[li].size());
    idx.reserve(most);
    delta.reserve(most);
  }
  // ---- apply: nothing below throws ----
  for (uint32_t li = 0; li < nl; ++li) {
    if (dropped) dropped[li] = 0;
    if (first_write[li] == UINT64_MAX) continue;
    LayerTable &l = s.layers[li];
    const std::vector<uint32_t> &k = keep[li];
    const uint64_t n = l.n_tokens, kn = k.size(), kept_blocks = (kn + bs - 1) / bs;
    for (uint64_t b = first_write[li] / bs; b < kept_blocks; ++b) {
      if (alloc_.refcount(l.blocks[b]) > 1)
        l.blocks[b] = cow_copy(l.blocks[b]);
      else
        prefix_drop_block(l.blocks[b]);  // rewritten in place: leaves the prefix index
    }
    // Survivors keep their written state (sources are read before a later
    // destination could overwrite them: k[j] >= j, in increasing j).
    for (uint64_t j = first_write[li]; j < kn; ++j)
      if (k[j] != j)
        written_.put(l.blocks[j / bs], static_cast<uint32_t>(j % bs),
                     written_.test(l.blocks[k[j] / bs], static_cast<uint32_t>(k[j] % bs)));
    // Move the survivors forward (destination index j <= source k[j]).
    store_->move_tokens(l, k, first_write[li]);
    // Re-rotate the keys whose in-cache position changed (llama.cpp's
    // K-shift). Pre-RoPE keys are stored unrotated: a shift only changes the
    // positions they are rotated to when read (rope_by_index below), with no
    // re-encoding and no new quantization error.
    if (shift[li] && !fmt_.pre_rope) {
      idx.clear();
      delta.clear();
      for (uint64_t j = first_write[li]; j < kn; ++j) {
        const int64_t d = static_cast<int64_t>(j) - l.rope_position_of(k[j]);
        if (d != 0) idx.push_back(j), delta.push_back(d);
      }
      store_->rotate_keys(li, l, idx, delta, rope);
    }
    // Positions (text positions; the RoPE position is the index once shifted).
    std::vector<int32_t> &np = new_pos[li];
    for (uint64_t j = 0; j < kn; ++j) np.push_back(static_cast<int32_t>(l.position_of(k[j])));
    uint64_t u = kn;  // the tail: the longest run of consecutive positions ending at length - 1
    if (kn && static_cast<uint64_t>(np[kn - 1]) + 1 == s.length) {
      u = kn - 1;
      while (u > 0 && np[u - 1] + 1 == np[u]) --u;
    }
    l.tail_index = u;
    l.tail_pos = u < kn ? static_cast<uint64_t>(np[u]) : s.length;
    np.resize(u);
    l.positions.swap(np);
    if (shift[li]) l.rope_by_index = true;
    if (s.track_scores) {
      for (uint64_t j = 0; j < kn; ++j)
        for (uint64_t hh = 0; hh < h; ++hh) l.scores[j * h + hh] = l.scores[k[j] * h + hh];
      l.scores.resize(kn * h);
    }
    while (l.blocks.size() > kept_blocks) {
      release_block(l.blocks.back());
      l.blocks.pop_back();
    }
    tokens_stored_ -= n - kn;
    l.n_tokens = kn;
    l.n_lp = kn;
    if (dropped) dropped[li] = n - kn;
  }
}

}  // namespace kvc::core
