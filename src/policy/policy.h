// Eviction policies: which tokens of one layer to keep. Pure functions of a
// layer's token count, observed attention scores and (for plugins) keys, so
// they are tested on hand-made score patterns without a pool.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvc::policy {

// Values equal the public kvc_policy_kind values.
enum class PolicyKind : int32_t {
  None = 0,       // keep everything
  Streaming = 1,  // StreamingLLM: S attention sinks + the newest tokens (arXiv 2309.17453)
  H2O = 2,        // heavy hitters by accumulated attention + a recent window (arXiv 2306.14048)
  SnapKV = 3,     // observation-window attention, pooled, top-k + the window (arXiv 2404.14469)
  PyramidKV = 4,  // SnapKV scoring under per-layer pyramid budgets (arXiv 2406.02069)
  TOVA = 5,       // the latest query's attention, top-k (arXiv 2401.06104)
  Plugin = 6,     // scores from a loaded plugin (kvcache_plugin.h) + a recent window
  Knorm = 7,      // smallest key L2 norm, mean over KV heads, + a recent window (arXiv 2406.11430)
  ExpectedAttention = 8,  // attention expected from future queries' statistics (arXiv 2510.00636)
  // KVzip: the largest attention during context reconstruction, summed over KV heads
  // (arXiv 2505.23416)
  KVzip = 9,
  // DuoAttention: per-head retrieval (all tokens) or streaming (sinks + recent) (arXiv 2410.10819)
  DuoAttention = 10,
};
enum class Pooling : int32_t { Max = 0, Avg = 1 };
// How a head-wise pool's layer budget is split over its KV heads (values
// equal kvc_head_budget): each head its own (Uniform), or AdaKV's shared
// top-k with a per-head floor.
enum class HeadBudget : int32_t { Uniform = 0, AdaKV = 1 };
enum class Schedule : int32_t { Paper = 0, Linear = 1 };

class Plugin;  // plugin.h

struct PolicySpec {
  PolicyKind kind = PolicyKind::None;
  uint64_t budget_tokens = 0;      // per-layer cap (0: none)
  double compression_ratio = 0.0;  // fraction dropped at evict time, in [0, 1) (0: none)
  uint32_t sink_tokens = 4;        // streaming: S
  uint32_t recent_tokens = 0;      // streaming: W (when no budget); plugin: protected newest tokens
  double recent_fraction = 0.5;    // h2o: share of the budget kept as the recent window
  uint32_t window = 32;            // snapkv / pyramidkv: observation window (newest tokens, kept)
  uint32_t kernel_size = 7;        // snapkv / pyramidkv: pooling kernel over the token axis (odd)
  Pooling pooling = Pooling::Max;
  Schedule schedule = Schedule::Paper;
  double beta = 20.0;               // pyramidkv (paper schedule): last layer gets budget / beta
  bool shift_positions = false;     // re-rotate keys to their in-cache positions (needs RoPE)
  bool auto_evict = false;          // evict in reserve when a layer would exceed budget_tokens
  uint32_t future_positions = 512;  // expected attention: the next positions averaged over
  HeadBudget head_budget = HeadBudget::Uniform;  // head-wise pools: budgets across KV heads
  double head_floor =
      0.2;  // AdaKV: share of a head's own budget it keeps whatever the others score
  std::vector<float> head_gates;   // DuoAttention: [layers][kv_heads] gates in [0, 1]
  float gate_threshold = 0.5f;     // DuoAttention: a head whose gate is below it streams
  std::shared_ptr<Plugin> plugin;  // kind Plugin

  // True when eviction reads the layer's keys (f32).
  bool needs_keys() const {
    return kind == PolicyKind::Plugin || kind == PolicyKind::Knorm ||
           kind == PolicyKind::ExpectedAttention;
  }
  // True when the policy reads observed attention scores.
  bool needs_scores() const {
    return kind == PolicyKind::H2O || kind == PolicyKind::SnapKV || kind == PolicyKind::PyramidKV ||
           kind == PolicyKind::TOVA || kind == PolicyKind::KVzip;
  }
  // Throws Error(InvalidArgument) describing the first bad parameter.
  void validate() const;
};

// Tokens a layer keeps: the base budget min(n, budget_tokens, max(1,
// floor(n * (1 - ratio)))), then (pyramidkv) the layer's share of it.
// Never more than n, at least 1 when n >= 1.
uint64_t base_target(const PolicySpec &p, uint64_t n);
uint64_t layer_target(const PolicySpec &p, uint32_t layer, uint32_t num_layers, uint64_t n);

struct LayerView {
  uint64_t n = 0;  // tokens of the layer
  uint32_t kv_heads = 1;
  uint32_t head_dim = 0;
  uint32_t layer = 0, num_layers = 1;
  const float *scores = nullptr;       // [n][kv_heads] observed attention (or null: all zero)
  const float *keys = nullptr;         // [n][kv_heads][head_dim] f32 (plugins, knorm; may be null)
  const int32_t *positions = nullptr;  // [n] (plugins only; may be null)
  // Expected attention: the values ([n][kv_heads][head_dim] f32) and, per
  // query head, the future queries' mean ([q_heads][head_dim]) and
  // covariance ([q_heads][head_dim][head_dim]), rotated as future_rotation()
  // describes. q_heads is a multiple of kv_heads (grouped-query attention).
  const float *values = nullptr;
  uint32_t q_heads = 0;
  const double *q_mean = nullptr, *q_cov = nullptr;
};

// Running statistics of the queries a sequence's layer has seen, in their
// pre-RoPE frame: count, sum [q_heads][head_dim] and sum of outer products
// [q_heads][head_dim][head_dim].
struct QueryStats {
  uint64_t count = 0;
  std::vector<double> sum, outer;
  void add(const float *q, uint32_t q_heads, uint32_t head_dim);  // one row [q_heads][head_dim]
  // Adds another's rows (same shape). All or nothing: a first merge copies
  // into temporaries before it takes them.
  void merge(const QueryStats &o);
};

// The mean and covariance of future queries: the statistics' mean mu and
// covariance S (population), each turned by R = the mean over positions
// [from, from + count) of the RoPE rotation matrix (pairs of dims rotated by
// pos x theta^(-2i/dims), interleaved or NeoX pairs; dims past rope_dims and
// pools without RoPE (rope_dims 0) are left as they are): mu' = R mu,
// S' = R S R^T. ExpectedAttention (arXiv 2510.00636; kvpress
// ExpectedAttentionPress) averages the rotation this way.
void future_moments(const QueryStats &st, uint32_t q_heads, uint32_t head_dim, uint32_t rope_dims,
                    bool interleaved, double theta, uint64_t from, uint64_t count,
                    std::vector<double> &mean, std::vector<double> &cov);

// Expected attention scores per token, summed over KV heads: for each query
// head, z_t = mu'.k_t / sqrt(d) + k_t^T S' k_t / (2 d) (the log of
// E[exp(q.k / sqrt(d))] for q ~ N(mu', S')), softmax over the tokens; mean
// over the query heads of a KV head, times ||v_t|| of that head.
std::vector<float> expected_attention_scores(const LayerView &v);

// KVzip's budgets shared across layers (kvpress KVzipPress, layerwise=False):
// `targets` holds each layer's own target (layer_target); the same total is
// redistributed by one threshold over every layer's ranked tokens (recorded
// scores summed over the KV heads, tokens between the sinks and the recent
// window), so a layer whose tokens score higher keeps more. Each layer keeps
// its sinks and recent window and at least 1 token, at most all of them.
// With `floor` > 0 (AdaKV's safeguard over head-wise tables), each view first
// takes its own best floor x (its target less its rule's tokens) candidates;
// the rest of the total is shared as above.
void shared_targets(const PolicySpec &p, const std::vector<LayerView> &views,
                    std::vector<uint64_t> &targets, double floor = 0.0);

// How a policy ranks a layer's tokens for a budget of `target`: tokens
// [0, lo) and [hi, n) are kept by rule (attention sinks, a recent or
// observation window), the candidates [lo, hi) by score[t - lo], highest
// first (ties keep the newer token).
struct Ranking {
  uint64_t lo = 0, hi = 0;
  std::vector<float> score;
};
Ranking rank(const PolicySpec &p, const LayerView &v, uint64_t target);

// DuoAttention: whether head `table` (layer x kv_heads + head) streams.
inline bool duo_streams(const PolicySpec &p, uint64_t table) {
  return p.head_gates[table] < p.gate_threshold;
}

// Fills `keep` with the sorted indices of the `target` tokens to keep
// (target <= n): the rule's tokens and the best candidates. Deterministic.
void select_keep(const PolicySpec &p, const LayerView &v, uint64_t target,
                 std::vector<uint32_t> &keep);

// AdaKV (Feng et al., "Ada-KV: Optimizing KV Cache Eviction by Adaptive
// Budget Allocation for Efficient LLM Inference", arXiv 2407.11550; kvpress
// AdaKVPress): the KV heads of one layer (one view each, kv_heads 1) share
// the sum of their targets. Each head keeps its rule's tokens and its best
// floor(head_floor x its own candidate budget) candidates (at least one when
// its rule keeps none: no head is emptied); the rest of the shared budget
// goes to the best remaining candidates of all the heads by score (a head
// holding fewer tokens than its target leaves the rest to the others).
// keep[h]: head h's sorted kept indices; the counts sum to the targets' sum
// (capped at what the heads hold).
void adakv_keep(const PolicySpec &p, const std::vector<LayerView> &heads,
                const std::vector<uint64_t> &targets, std::vector<std::vector<uint32_t>> &keep);

// 1-D pooling of `x` (n values) with an odd kernel, "same" padding that
// ignores the outside (max of the values inside; average over them).
void pool1d(const float *x, uint64_t n, uint32_t kernel, Pooling how, float *out);

}  // namespace kvc::policy
