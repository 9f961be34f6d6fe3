// The paged KV pool: one arena of blocks, sequences with per-layer block
// tables, copy-on-write forks, eviction, records, and (through their own
// classes) the prefix cache and the offload tiers, with the locking described
// in kvcache.h. This is the pool's whole public surface; its internals are
// in core/pool_int.h, its units in core/*.cpp (docs/ARCHITECTURE.md).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "core/pool_int.h"
#include "core/types.h"

namespace kvc::core {

class PrefixCache;  // core/prefix_cache.h: the prefix index and the tiers below it

class Pool : private PoolCore {
 public:
  // Validates `cfg` (throws Error) and allocates everything.
  explicit Pool(const PoolConfig &cfg);
  ~Pool();
  Pool(const Pool &) = delete;
  Pool &operator=(const Pool &) = delete;

  // ---- pool ----
  // The storage configuration: in a head-wise pool, num_layers x num_kv_heads
  // tables of one KV head (what block layouts describe); caller_config() is
  // the configuration as the caller gave it (core/headwise.cpp).
  const PoolConfig &config() const { return cfg_; }
  PoolConfig caller_config() const;
  PoolStats stats() const;
  PoolLayout layout() const;
  void reset_peak();
  // Per-tensor scales of a layer (K, V); 0 where there is none.
  std::pair<float, float> tensor_scales(uint32_t layer) const;
  // Per-channel key smoothing, [num_layers][num_kv_heads * head_dim] (offset
  // null: zeros; scale null with count 0: none), on a pool with no sequence
  // and no prefix cache (core/smoothing.cpp).
  void set_key_smoothing(const float *scale, const float *offset, size_t count);
  // A codebook for part kv (0 keys, 1 values): [num_layers][2^bits] levels,
  // or none (null, 0); on an empty pool (core/codebook.cpp).
  void set_codebook(int kv, const float *levels, size_t count);
  // Throws InvalidArgument unless the pool holds no sequence and has no
  // prefix cache: `what` (key smoothing, codebooks) changes the codes' meaning.
  void require_empty_for(const char *what) const;
  // XXH3-128 of b, canonical (big-endian) bytes: the digests of the fingerprint.
  static void digest128(const std::vector<uint8_t> &b, uint8_t out[16]);
  // The built-in Gaussian levels (codec::gaussian_levels; null: none).
  static const float *gaussian_codebook(uint32_t bits, uint64_t group);

  // ---- device ----
  // CUDA pools: the stream work is queued on; waits and reports refused appends.
  void set_stream(void *stream);
  void sync();
  // Whole blocks to or from host memory (kvc_pool_copy_blocks).
  void copy_blocks(const int32_t *blocks, size_t n, void *host, bool to_host);

  // ---- sequences ----
  void seq_create(uint64_t id);
  void seq_fork(uint64_t parent, uint64_t child);
  void seq_truncate(uint64_t id, uint64_t new_length);
  void seq_free(uint64_t id);
  uint64_t seq_length(uint64_t id) const;
  // Head-wise pools: the most any head of the layer holds.
  uint64_t seq_layer_tokens(uint64_t id, uint32_t layer) const;
  uint64_t seq_head_tokens(uint64_t id, uint32_t layer, uint32_t head) const;
  void seq_reserve(uint64_t id, uint64_t n_new, int64_t *slot_mapping);

  // ---- write / read ----
  void append(uint64_t id, uint32_t layer, uint64_t pos, uint64_t n, const void *k, const void *v,
              DType src);
  void gather(uint64_t id, uint32_t layer, uint64_t first, uint64_t n, void *k_out, void *v_out,
              DType dst, int32_t *positions_out) const;
  size_t block_table(uint64_t id, uint32_t layer, int32_t *out, size_t capacity) const;
  size_t export_page_table(uint32_t layer, const uint64_t *seq_ids, size_t n_seqs, int32_t *indptr,
                           int32_t *indices, size_t capacity, int32_t *last_page_len) const;
  // One KV head (core/headwise.cpp): its tokens as [n][head_dim] rows, its
  // block table (a token-wise layer's, whose blocks hold every head), and a
  // head-wise pool's page table with one row per (sequence, head).
  void gather_head(uint64_t id, uint32_t layer, uint32_t head, uint64_t first, uint64_t n,
                   void *k_out, void *v_out, DType dst, int32_t *positions_out) const;
  size_t head_block_table(uint64_t id, uint32_t layer, uint32_t head, int32_t *out,
                          size_t capacity) const;
  size_t export_head_page_table(uint32_t layer, const uint64_t *seq_ids, size_t n_seqs,
                                int32_t *indptr, int32_t *indices, size_t capacity,
                                int32_t *last_page_len) const;
  // Attention of n_q query rows per sequence over one layer (attention.cpp).
  // Decode (prefill false): every query sees all of its sequence's tokens.
  // Prefill: one sequence; query i is the layer's token n - n_q + i and sees
  // tokens [0, n - n_q + i] (causal).
  void attention(uint32_t layer, const uint64_t *ids, size_t n_seqs, const void *q, uint64_t n_q,
                 bool prefill, void *out, float *lse, const AttnParams &p);

  // ---- eviction (evict.cpp) ----
  // The policy of sequence `id`, or (no id) the pool's default.
  void set_policy(std::optional<uint64_t> id, std::shared_ptr<const PolicySpec> p);
  // Applies `policy` (or the sequence's / the pool's) to every layer;
  // dropped: NULL or [num_layers] tokens dropped per layer.
  void evict(uint64_t id, const PolicySpec *policy, uint64_t *dropped);
  // Keeps exactly the tokens keep_idx[0..n_keep) (strictly increasing) of one
  // layer and drops the others, as an eviction does (kvc_seq_keep).
  // With `head` (head-wise pools, kvc_seq_keep_head): that KV head's tokens
  // only; without, every head of the layer (which must hold the same tokens).
  void keep_tokens(uint64_t id, uint32_t layer, const uint64_t *keep_idx, uint64_t n_keep,
                   uint64_t *dropped, std::optional<uint32_t> head = std::nullopt);
  void observe_scores(uint64_t id, uint32_t layer, const float *scores, uint64_t n,
                      bool accumulate);
  void read_scores(uint64_t id, uint32_t layer, float *out, uint64_t n) const;
  // Adds n query rows ([n][num_q_heads][head_dim], q_dtype) at RoPE positions
  // `positions` to the layer's query statistics (kvc_seq_observe_queries):
  // un-rotated first when the pool has rope_style. All checks before the first change.
  void observe_queries(uint64_t id, uint32_t layer, const void *q, DType q_dtype, uint64_t n,
                       uint32_t num_q_heads, const int32_t *positions);
  // The two halves of it: the rows' statistics (checks, conversion, un-rotation
  // and sums, no lock held), then adding them to sequences' layer statistics
  // under the lock (every sequence found before the first change).
  policy::QueryStats query_stats(const void *q, DType q_dtype, uint64_t n, uint32_t num_q_heads,
                                 const int32_t *positions) const;
  void merge_query_stats(uint32_t layer, const uint64_t *ids, const policy::QueryStats *stats,
                         size_t n_seqs);
  void rope_positions(uint64_t id, uint32_t layer, uint64_t pos, uint64_t n, int32_t *out) const;

  // ---- records (state.cpp, docs/tiers.md) ----
  // One sequence as a self-describing record, as it is at one instant
  // (appends to it wait meanwhile): begin(total) first (false: stop, e.g. a
  // buffer too small), then the bytes in order through write(), then
  // finish(checksum) for header bytes 16..24 (written as zero). Returns the
  // record's size.
  uint64_t seq_save(uint64_t id, RecordSink &out) const;
  // Creates sequence `id` from a record (all checks first: nothing changes on failure).
  void seq_restore(uint64_t id, const uint8_t *data, size_t size);

  // ---- prefix cache and offload tiers (core/prefix_cache.h) ----
  PrefixCache &prefix() { return *prefix_; }

  // ---- checks ----
  // Debug / fuzz support: verifies every invariant (block states, reference
  // counts equal to the number of block-table entries, token counts, the
  // prefix index); returns "" or the first violation.
  std::string check_invariants() const;

 private:
  void append_heads(uint64_t id, uint32_t layer, uint64_t pos, uint64_t n, const void *k,
                    const void *v, DType src);
  void gather_heads(const Sequence &s, uint32_t layer, uint64_t first, uint64_t n, void *k_out,
                    void *v_out, DType dst, int32_t *positions_out) const;
  std::unique_ptr<PrefixCache> prefix_;
};

}  // namespace kvc::core
