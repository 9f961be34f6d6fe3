// SPDX-License-Identifier: Apache-2.0
// The two K/V caches the forward pass runs on:
//  - ArrayCache: a plain contiguous float array per layer (the bare baseline);
//  - PoolSequence: one sequence of a kvc_pool, written with kvc_seq_reserve() +
//    kvc_append() and read zero-copy through kvc_pool_get_layout() and a cached
//    copy of each layer's block table (kvc_seq_block_table()).
// Both expose the same small interface the templated forward pass uses:
//   begin_token(pos), store(layer, pos, k, v),
//   for_each_key(layer, n, kv_head, f), for_each_value(layer, n, kv_head, f)
// where f(t0, count, rows, stride) sees tokens t0..t0+count-1 of one KV head:
// token t0+r's head_dim f32 elements start at rows + r * stride.
#pragma once

#include <kvcache/kvcache.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "error.h"
#include "model.h"

namespace kvc_runner {

/// Throws RunnerError naming the call and the library's explanation unless status is KVC_OK.
void check_kvc(kvc_status status, const char *what);

/// Widening of storage dtypes to f32 (f16 through a 65,536-entry table, bf16 by a shift).
float f16_to_f32(std::uint16_t h);
inline float bf16_to_f32(std::uint16_t b) {
  const std::uint32_t bits = std::uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
const float *f16_table();  ///< [65536] f32 value of every f16 bit pattern

/// Contiguous K/V: [layers][seq_len][kv_dim] floats, as llama2.c's run.c keeps them.
class ArrayCache {
 public:
  explicit ArrayCache(const ModelConfig &c)
      : kv_dim_(c.kv_dim()),
        head_dim_(c.head_dim()),
        seq_len_(c.seq_len),
        k_(std::size_t(c.n_layers) * c.seq_len * c.kv_dim()),
        v_(std::size_t(c.n_layers) * c.seq_len * c.kv_dim()) {}

  void begin_token(int) {}
  void store(int layer, int pos, const float *k, const float *v) {
    const std::size_t off = (std::size_t(layer) * seq_len_ + pos) * kv_dim_;
    std::memcpy(&k_[off], k, sizeof(float) * kv_dim_);
    std::memcpy(&v_[off], v, sizeof(float) * kv_dim_);
  }
  template <class F>
  void for_each_key(int layer, int n, int kv_head, F &&f) const {
    f(0, n, &k_[std::size_t(layer) * seq_len_ * kv_dim_ + std::size_t(kv_head) * head_dim_],
      std::size_t(kv_dim_));
  }
  template <class F>
  void for_each_value(int layer, int n, int kv_head, F &&f) const {
    f(0, n, &v_[std::size_t(layer) * seq_len_ * kv_dim_ + std::size_t(kv_head) * head_dim_],
      std::size_t(kv_dim_));
  }

 private:
  int kv_dim_, head_dim_, seq_len_;
  std::vector<float> k_, v_;
};

/// Storage settings of a pool: plain dtypes, or codecs with an optional
/// residual window / hybrid fraction.
struct PoolSettings {
  kvc_dtype k_dtype = KVC_DTYPE_F16, v_dtype = KVC_DTYPE_F16;
  const kvc_codec *k_codec = nullptr, *v_codec = nullptr;
  std::uint32_t residual_window = 0;
  double residual_fraction = 0.0;
  std::uint32_t residual_sinks =
      0;  ///< first tokens of each layer kept in f16 (kvc_pool_config.residual_sinks)
  kvc_dtype residual_dtype = KVC_DTYPE_F16;  ///< kvc_pool_config.residual_dtype (f16 or int8)
  bool pre_rope_keys = false;  ///< keys quantized before RoPE (KVC_POOL_PRE_ROPE_KEYS)
  /// Per-channel key smoothing (kvc_pool_set_key_smoothing): `[layers][kv_dim]`, empty: none.
  std::vector<float> key_scale, key_offset;
  /// Codebooks of K ([0]) and V ([1]) (kvc_pool_set_codebook): `[layers][2^bits]` (per-layer
  /// codecs: each layer's 2^bits in turn), empty: none.
  std::vector<float> codebook[2];
  std::uint32_t block_size = 16;
  /// Per-layer codecs (kvc_pool_config.layer_k_codecs / layer_v_codecs):
  /// layers whose K and V use these codecs instead of the pool's (a float
  /// dtype with KVC_SCALE_NONE: plain storage of it).
  struct LayerCodec {
    std::uint32_t layer = 0;
    kvc_codec k{}, v{};
  };
  std::vector<LayerCodec> layer_codecs;
  bool prefix_cache = false;  ///< enable the pool's prefix cache (SHA-256, fixed seed)
  bool headwise = false;      ///< a block table per (layer, KV head) (KVC_POOL_HEADWISE)
};

/// The kvc_pool_config of a pool of `num_blocks` blocks with these settings
/// for the model's geometry (what KvPool creates; the codecs are pointed to).
/// With per-layer codecs, `tables` receives the two per-layer pointer arrays
/// the config points to (they must outlive it); without `tables` such
/// settings throw RunnerError.
kvc_pool_config pool_config(const ModelConfig &c, const PoolSettings &settings,
                            std::uint64_t num_blocks,
                            std::vector<const kvc_codec *> (*tables)[2] = nullptr);

/// Owns a kvc_pool sized from the model geometry.
class KvPool {
 public:
  KvPool(const ModelConfig &c, const PoolSettings &settings, std::uint32_t max_tokens,
         std::uint32_t max_seqs = 1);
  /// A pool for `max_seqs` sequences of up to `max_tokens` tokens each.
  KvPool(const ModelConfig &c, kvc_dtype k_dtype, kvc_dtype v_dtype, std::uint32_t max_tokens,
         std::uint32_t max_seqs = 1, std::uint32_t block_size = 16);
  ~KvPool();
  KvPool(const KvPool &) = delete;
  KvPool &operator=(const KvPool &) = delete;

  kvc_pool *get() const { return pool_; }
  /// How many of a sequence's newest tokens may still change their stored
  /// value (a residual window re-encodes tokens as they age); older tokens
  /// keep their dequantized values, so readers may cache them.
  std::uint64_t unstable_tokens(std::uint64_t length) const {
    return settings_.residual_window + std::uint64_t(settings_.residual_fraction * double(length)) +
           2 * std::uint64_t(group_) + 2;
  }
  /// Tokens [0, n) a layer holds in codec form once an append ends at length
  /// L (the pool's aging rule, docs/codecs.md "Residual window"): the rest
  /// stay exact in the residual. L itself without a residual.
  std::uint64_t encoded_at(std::uint64_t length) const {
    if (!staged()) return length;
    const std::uint64_t frac =
        static_cast<std::uint64_t>(settings_.residual_fraction * static_cast<double>(length));
    const std::uint64_t hp = std::max<std::uint64_t>(settings_.residual_window, frac);
    return length > hp ? (length - hp) / group_ * group_ : 0;
  }
  /// Whether the pool stages its newest tokens exact (a residual window, hybrid
  /// fraction or per-channel groups).
  bool staged() const {
    return settings_.residual_window || settings_.residual_fraction > 0.0 || group_ > 1;
  }
  std::uint32_t sinks() const { return settings_.residual_sinks; }
  /// How the residual stores its rows (f16, or int8 with a scale per token and KV head).
  kvc_dtype residual_dtype() const { return settings_.residual_dtype; }
  const kvc_pool_layout &layout() const { return layout_; }
  kvc_stats stats() const;
  void reset_peak();

 private:
  kvc_pool *pool_ = nullptr;
  kvc_pool_layout layout_{};
  PoolSettings settings_;
  std::uint32_t group_ = 1;  // tokens encoded together (per-channel groups)
};

/// One sequence of a KvPool, used as the forward pass's cache. Creates the
/// sequence on construction and frees it on destruction.
class PoolSequence {
 public:
  PoolSequence(KvPool &pool, std::uint64_t seq_id, int num_layers);
  ~PoolSequence();
  PoolSequence(const PoolSequence &) = delete;
  PoolSequence &operator=(const PoolSequence &) = delete;

  /// Reserves the slot of position `pos` in every layer (kvc_seq_reserve) and
  /// refreshes the cached block tables when a new block was added.
  void begin_token(int pos);
  /// Writes one token's K and V rows ([num_kv_heads][head_dim] f32) of a layer (kvc_append).
  void store(int layer, int pos, const float *k, const float *v) {
    check_kvc(kvc_append(pool_, seq_id_, static_cast<std::uint32_t>(layer),
                         static_cast<std::uint64_t>(pos), 1, k, v, KVC_DTYPE_F32),
              "kvc_append");
  }
  template <class F>
  void for_each_key(int layer, int n, int kv_head, F &&f) {
    if (gathered_) return gathered_rows(layer, n, kv_head, 0, f);
    rows(layer, n, layout_.k_offset + kv_head * layout_.k_head_stride, layout_.k_token_stride,
         layout_.k_dtype, f);
  }
  template <class F>
  void for_each_value(int layer, int n, int kv_head, F &&f) {
    if (gathered_) return gathered_rows(layer, n, kv_head, 1, f);
    rows(layer, n, layout_.v_offset + kv_head * layout_.v_head_stride, layout_.v_token_stride,
         layout_.v_dtype, f);
  }

 private:
  void refresh_block_tables();

  // Quantized storage (or a residual window) cannot be read in place: the
  // layer's K and V are dequantized with kvc_gather() once per token step and
  // layer, then handed over like f32 blocks.
  // Tokens older than the pool's unstable window keep their values, so each
  // layer's dequantized rows are cached and only the newest are gathered again.
  template <class F>
  void gathered_rows(int layer, int n, int kv_head, int kv, F &f) {
    if (gathered_layer_ != layer || gathered_n_ != n) gather_layer(layer, n);
    const std::size_t row = std::size_t(layout_.num_kv_heads) * layout_.head_dim;
    const float *base =
        (kv == 0 ? gk_[layer].data() : gv_[layer].data()) + std::size_t(kv_head) * layout_.head_dim;
    f(0, n, base, row);
  }
  void gather_layer(int layer, int n);

  // Walks the layer's block table; f32 blocks are handed over in place, f16
  // and bf16 rows are widened into a scratch block first.
  template <class F>
  void rows(int layer, int n, std::uint64_t offset, std::uint64_t token_stride, kvc_dtype dtype,
            F &f) {
    const std::vector<std::int32_t> &table = tables_[layer];
    const char *base = static_cast<const char *>(layout_.base);
    const int block_size = static_cast<int>(layout_.block_size);
    const int head_dim = static_cast<int>(layout_.head_dim);
    float *tmp = scratch_.data();
    int t = 0;
    for (std::size_t b = 0; t < n; ++b) {
      const char *p = base + std::uint64_t(table[b]) * layout_.block_stride + offset;
      const int count = n - t < block_size ? n - t : block_size;
      if (dtype == KVC_DTYPE_F32) {
        f(t, count, reinterpret_cast<const float *>(p), std::size_t(token_stride / sizeof(float)));
      } else {
        const bool half = dtype == KVC_DTYPE_F16;
        for (int r = 0; r < count; ++r, p += token_stride) {
          const std::uint16_t *h = reinterpret_cast<const std::uint16_t *>(p);
          float *out = tmp + std::size_t(r) * head_dim;
          if (half) {
            for (int i = 0; i < head_dim; ++i) out[i] = f16_lut_[h[i]];
          } else {
            for (int i = 0; i < head_dim; ++i) out[i] = bf16_to_f32(h[i]);
          }
        }
        f(t, count, static_cast<const float *>(tmp), std::size_t(head_dim));
      }
      t += count;
    }
  }

  kvc_pool *pool_;
  std::uint64_t seq_id_;
  kvc_pool_layout layout_;
  const KvPool *owner_;
  std::vector<std::vector<std::int32_t>> tables_;  // cached block table per layer
  std::vector<float> scratch_;                     // one widened block (f16/bf16 storage)
  const float *f16_lut_;
  bool gathered_ = false;  // quantized storage: read through kvc_gather
  int gathered_layer_ = -1, gathered_n_ = -1;
  std::vector<std::vector<float>> gk_, gv_;  // per layer [n][kv_heads][head_dim], cached
  std::vector<std::uint64_t> stable_;        // per layer: rows [0, stable) are final
};

/// How a sequence evicts (kvcache eval's protocols, docs/eval.md).
struct EvictionSettings {
  enum class Protocol { None, Stream, PrefillCompress };
  Protocol protocol = Protocol::None;
  const kvc_policy *policy = nullptr;      ///< owned by the caller; attached to the sequence
  kvc_observe observe = KVC_OBSERVE_NONE;  ///< what attention records for the policy
  int prefill_tokens = 0;                  ///< PrefillCompress: positions [0, P) are the prefill
  int observe_window = 0;  ///< PrefillCompress: only the last W prefill positions are observed
  bool shift_positions = false;  ///< RoPE positions come from the pool (kvc_seq_rope_positions)
};

/// One sequence of a KvPool whose attention runs in the library
/// (kvc_attention_decode over the paged, possibly quantized blocks), with an
/// optional eviction policy. Creates the sequence on construction and frees
/// it on destruction.
class AttnSequence {
 public:
  AttnSequence(KvPool &pool, std::uint64_t seq_id, const ModelConfig &c,
               const EvictionSettings &ev = EvictionSettings{});
  /// A sequence that starts with the cached prefix of `prompt` (kvc_prefix_attach):
  /// positions [0, cached_tokens()) are already in the cache.
  AttnSequence(KvPool &pool, std::uint64_t seq_id, const ModelConfig &c,
               const std::vector<int> &prompt);
  /// A fork of `parent` (kvc_seq_fork: its blocks shared copy-on-write) as
  /// sequence `seq_id`, recording `observe` on every attention call and
  /// evicting nothing; freed on destruction. KVzip's context reconstruction
  /// (arXiv 2505.23416) runs on such a fork so the parent keeps its tokens.
  AttnSequence(const AttnSequence &parent, std::uint64_t seq_id, kvc_observe observe);
  kvc_pool *pool() const { return pool_; }
  std::uint64_t id() const { return seq_id_; }
  int cached_tokens() const { return cached_; }
  /// Registers the sequence's full blocks of `prompt` in the prefix cache.
  void register_prefix(const std::vector<int> &prompt);
  ~AttnSequence();
  AttnSequence(const AttnSequence &) = delete;
  AttnSequence &operator=(const AttnSequence &) = delete;

  /// Reserves position `pos` (the attached policy may auto-evict first); at
  /// the end of a prefill, compresses the cache once.
  void begin_token(int pos);
  /// The RoPE position of text position `pos` (itself, unless the policy
  /// shifted the cache to in-cache positions).
  int rope_position(int pos) const;
  void store(int layer, int pos, const float *k, const float *v) {
    check_kvc(kvc_append(pool_, seq_id_, static_cast<std::uint32_t>(layer),
                         static_cast<std::uint64_t>(pos), 1, k, v, KVC_DTYPE_F32),
              "kvc_append");
  }
  /// q: [n_heads][head_dim] (after RoPE); out: [n_heads][head_dim].
  void attend(int layer, const float *q, float *out);

  // Chunked prefill (Transformer::forward_chunk): n tokens at once.
  /// Reserves positions [pos, pos + n) (an attached policy may auto-evict first).
  void begin_chunk(int pos, int n);
  /// The RoPE positions of text positions [pos, pos + n), after begin_chunk.
  void rope_positions(int pos, int n, int *out) const;
  /// k, v: [n][num_kv_heads][head_dim] f32.
  void store_chunk(int layer, int pos, int n, const float *k, const float *v);
  /// Causal attention of the chunk's queries (kvc_attention_prefill); q and out:
  /// [n][n_heads][head_dim].
  void attend_chunk(int layer, const float *q, int n, float *out);
  /// PrefillCompress: the prefill length (a chunk must not cross it), else 0.
  int prefill_boundary() const {
    return ev_.protocol == EvictionSettings::Protocol::PrefillCompress && ev_.policy
               ? ev_.prefill_tokens
               : 0;
  }

 private:
  kvc_pool *pool_;
  std::uint64_t seq_id_;
  EvictionSettings ev_;
  kvc_attention_params params_{};
  int pos_ = 0;
  int cached_ = 0;
  // Chunked prefill over a pool that stages its newest tokens exact: the
  // chunk's queries see what token-by-token decode would (each query's own
  // window exact, older tokens as codes). The append encodes the chunk's
  // tokens beyond the window at once, so each query's window is put back from
  // the exact rows kept here (as the residual stores them, f16) by a
  // correction of the library's prefill output (kvc_attention_prefill's lse).
  const KvPool *owner_ = nullptr;
  int n_layers_ = 0, n_kv_heads_ = 0, head_dim_ = 0, n_heads_ = 0;
  struct ExactRows {
    std::uint64_t first = 0;  // position of k[0]
    std::vector<float> k, v;  // [position - first][kv_heads][head_dim]
  };
  std::vector<ExactRows> exact_;      // per layer: this chunk's window rows
  std::vector<std::uint16_t> half_;   // f16 rounding / int8 codes and scales scratch
  std::vector<float> lse_;            // attend_chunk: the prefill's lse for decode_window
  std::vector<float> gk_, gv_;        // decode_window: the pool's rows as read
  std::vector<double> acc_, scores_;  // decode_window: one row and head
  void keep_exact(int layer, int pos, int n, const float *k, const float *v);
  void decode_window(int layer, const float *q, int n, float *out, const float *lse);
};

}  // namespace kvc_runner
