// The pool's vocabulary as core's callers see it: configuration, statistics,
// layout, attention parameters, prefix-cache and tier results. Values of the
// enums equal the public ones (checked in src/api).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "common/dtype.h"
#include "policy/plugin.h"
#include "policy/policy.h"
#include "prefix/prefix.h"

namespace kvc::core {

// The vocabulary core's callers use that the modules below it define.
using CodecSpec = codec::Spec;         // how K or V is stored (codec/codec.h)
using ScaleGranularity = codec::Gran;  // values equal kvc_granularity
using policy::HeadBudget;
using policy::layer_target;
using policy::LayerView;
using policy::Plugin;  // a loaded scorer plugin (kvc_plugin_load)
using policy::PolicyKind;
using policy::PolicySpec;
using policy::Pooling;
using policy::Schedule;
using policy::select_keep;
using prefix::ExtraKeys;
using prefix::kMaxExtraKeyNameBytes;
using prefix::kMaxExtraKeyNames;
using prefix::PrefixEntry;
using prefix::PrefixExtra;
using prefix::PrefixHash;
using prefix::PrefixHasher;
using prefix::PrefixState;

enum class Layout : int32_t { NHD = 0, HND = 1 };
enum class Device : int32_t { CPU = 0, CUDA = 1 };
// Values equal the public kvc_rope_style values.
enum class RopeStyle : int32_t { None = 0, Interleaved = 1, Neox = 2 };

constexpr uint32_t kFlagZeroOnFree = 0x1u;
constexpr uint32_t kFlagPreRopeKeys = 0x2u;
constexpr uint32_t kFlagHeadwise = 0x4u;

// Per-channel key smoothing (kvc_pool_set_key_smoothing; SmoothAttention,
// QServe arXiv 2405.04532): keys are encoded as (k - offset) / scale per
// channel and read back as decoded * scale + offset. Arrays are
// [num_layers][num_kv_heads * head_dim]; offset empty means zeros.
constexpr uint32_t kKeySmoothingTag = 0x314d534bu;  // "KSM1" little-endian, in fingerprints
struct KeySmoothing {
  std::vector<float> scale, offset;
  uint8_t digest[16] = {};  // XXH3-128 of the arrays' little-endian bits (fingerprints)
};

// A part's codebook (kvc_pool_set_codebook; docs/codecs.md "Codebooks"):
// 2^bits ascending levels in [-1, 1] per layer, in units of each group's
// signed extreme.
constexpr uint32_t kCodebookTag = 0x314b4243u;  // "CBK1" little-endian, in fingerprints
struct Codebook {
  uint32_t per_layer = 0;     // levels of a layer: 2^bits of the part's codec (0: per-layer codecs)
  std::vector<float> levels;  // [num_layers][per_layer], or each layer's 2^bits in turn
  std::vector<uint64_t> offset;  // per-layer codecs: layer l's levels at [offset[l], offset[l + 1])
  uint8_t digest[16] = {};       // XXH3-128 of "CBK1", the part, per_layer (and counts), the levels
  const float *layer(uint32_t l) const {
    return levels.data() + (offset.empty() ? static_cast<uint64_t>(l) * per_layer : offset[l]);
  }
  // Whether layer l has levels (per-layer codecs: an int8 or fp8 layer has
  // none and keeps its uniform codes).
  bool has(uint32_t l) const { return offset.empty() || offset[l + 1] > offset[l]; }
};

constexpr uint32_t kMixedTag = 0x3158494du;  // "MIX1" little-endian, in fingerprints

struct PoolConfig {
  uint32_t num_layers = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  uint32_t block_size = 16;
  uint32_t flags = 0;
  // Head-wise pools (kFlagHeadwise): validate_config stores each (layer, KV
  // head) as a layer of its own (num_layers x num_kv_heads tables of one KV
  // head and num_q_heads / num_kv_heads query heads) and keeps the caller's
  // num_kv_heads here; 0 in token-wise pools. core/headwise.cpp maps a
  // caller's layer to its heads' tables.
  uint32_t headwise_heads = 0;
  uint64_t num_blocks = 0;
  uint64_t capacity_bytes = 0;
  DType k_dtype = DType::F16, v_dtype = DType::F16;
  // Quantized storage (codecs): when k_codec.dtype is not a float dtype it
  // overrides k_dtype (likewise for V). A float codec with no scales means
  // plain k_dtype storage.
  codec::Spec k_codec, v_codec;
  // Residual window (KIVI) and hybrid precision: the newest
  // max(residual_window, floor(residual_fraction * length)) tokens of each
  // layer stay in residual_dtype blocks of a second arena and are encoded
  // with the codecs as they age. Per-channel codecs always stage tokens
  // until a group of G is complete.
  uint32_t residual_window = 0;
  double residual_fraction = 0.0;
  DType residual_dtype = DType::F16;
  uint64_t num_residual_blocks = 0;  // 0: as many as num_blocks
  // Attention sinks: the first residual_sinks tokens of each layer keep a
  // residual_dtype copy once encoded (sink blocks of the residual arena).
  uint32_t residual_sinks = 0;
  Layout layout = Layout::NHD;
  Device device = Device::CPU;
  int32_t device_index = 0;
  // Rotary embedding the engine applied to the keys (needed to re-rotate
  // keys whose positions shift; None: positions never shift).
  RopeStyle rope_style = RopeStyle::None;
  uint32_t rope_dims = 0;  // rotated dimensions per head (0: head_dim)
  double rope_theta = 10000.0;
  // Per-channel key smoothing (null: none); set on an empty pool only.
  std::shared_ptr<const KeySmoothing> k_smoothing;
  // Codebooks of K (0) and V (1) (null: uniform codes); set on an empty pool only.
  std::shared_ptr<const Codebook> codebook[2];
  // Mixed precision: the K (0) and V (1) codec of each layer (num_layers
  // entries each), or empty: k_codec / v_codec for every layer. A validated
  // configuration keeps them only when two layers differ (k_codec / v_codec
  // then hold layer 0's).
  std::vector<codec::Spec> layer_codec[2];
  bool mixed() const { return !layer_codec[0].empty(); }
  const codec::Spec &codec_of(uint32_t layer, int kv) const {
    return layer_codec[kv].empty() ? (kv == 0 ? k_codec : v_codec) : layer_codec[kv][layer];
  }
};

// Prefix cache (core/prefix_cache.h).
struct PrefixConfig {
  PrefixHash hash = PrefixHash::Sha256;
  bool verify_tokens = true;
  bool seed_set = false;
  uint8_t seed[32] = {};
  std::string model_id, tokenizer_id;
  std::vector<std::string> extra_key_names;  // declared names (empty: positional extra keys)
};
struct PrefixResult {
  uint64_t hit_tokens = 0, hit_blocks = 0, partial_tokens = 0;
  uint64_t tier_tokens = 0;  // whole-block tokens after hit_tokens the offload tiers hold
  uint64_t pin = 0;          // pin handle (lookup with pin), 0: none
};
// Offload tiers (core/offload.h, docs/tiers.md).
struct TierCounts {
  int32_t kind = 0;  // kvc_tier_kind
  uint64_t bytes = 0, entries = 0, hits = 0, misses = 0, demotions = 0, promotions = 0, drops = 0,
           evictions = 0, errors = 0, pinned = 0;
  std::string last_error;
};
// Outcome of polling an asynchronous load.
enum class LoadState : int32_t { Pending = 0, Done = 1, TimedOut = 2 };
struct PrefixCounts {
  uint64_t queried_tokens, hit_tokens, partial_tokens, registered, reclaimable, referenced,
      inserted, removed, reclaimed;
};
// kind 0: stored, 1: removed.
using PrefixEventFn = void (*)(void *user, int kind, const uint8_t *key, const uint8_t *parent,
                               uint32_t key_size, uint64_t depth);
// Attention over the pool's blocks (attention.cpp).
struct AttnParams {
  uint32_t num_q_heads = 0;
  float scale = 0.0f;  // 0: 1 / sqrt(head_dim)
  DType q_dtype = DType::F32, out_dtype = DType::F32;
  uint32_t observe = 0;       // 0: none, 1: accumulate attention mass (H2O), 2: replace (TOVA)
  uint64_t observe_from = 0;  // prefill: first query row whose attention is observed
  uint32_t num_threads = 1;   // decode without observation: threads for this call
  bool query_int8 = false;    // decode: an int8 query against integer keys (KVC_QUERY_INT8)
  bool int_values = false;    // and int8 values summed in integers (KVC_QUERY_INT8_VALUES)
};

// The pool's geometry and storage as bytes (docs/prefix-cache.md): equal
// fingerprints mean equal block layouts and codecs (config.cpp).
std::vector<uint8_t> pool_fingerprint(const PoolConfig &c);

// Scale entries per token slot in a block for a codec (per-token: one per
// KV head; per-group: one per group of the [num_kv_heads * head_dim] row).
uint64_t scales_per_token(const codec::Spec &sp, uint64_t num_kv_heads, uint64_t head_dim);
uint64_t scales_per_block(const codec::Spec &sp, uint64_t num_kv_heads, uint64_t head_dim,
                          uint64_t block_size);
struct PoolStats {
  uint64_t blocks_total, blocks_free, blocks_cached, blocks_used, blocks_shared;
  uint64_t bytes_per_block, bytes_per_token, bytes_total, bytes_in_use, peak_bytes_in_use;
  uint64_t num_sequences;
  uint64_t residual_blocks_total, residual_blocks_used, residual_bytes_per_block;
  uint64_t tokens_stored;  // tokens held, summed over sequences and layers
};

// Where K (part 0) or V (part 1) sits inside a block.
struct PartLayout {
  codec::Spec spec;               // dtype, granularity, ... (float dtypes: gran None)
  bool quantized = false;         // fp8 / int storage with scales
  uint64_t offset = 0;            // codes (or plain values) from the block start
  uint64_t token_stride = 0;      // bytes between token slots of the codes
  uint64_t head_stride = 0;       // bytes between KV heads of the codes
  uint64_t codes_bytes = 0;       // codes per block
  uint64_t scale_offset = 0;      // scales from the block start
  uint64_t zero_offset = 0;       // zero points from the block start (asymmetric)
  uint64_t scales_per_token = 0;  // scale entries per token slot (per token / group)
  uint64_t scales_per_block = 0;  // scale entries per block (all granularities)
  uint64_t scale_bytes = 0;       // bytes of one scale entry (4 f32, 2 f16)
  uint64_t outlier_offset = 0;    // outlier pairs from the block start (codec outliers)
  uint64_t outlier_bytes = 0;     // outlier pair bytes per token slot (0: none)
  uint64_t bytes = 0;             // the part's bytes per block, scales and zeros included
  uint32_t rotation_block = 0;    // Hadamard block inside each head (0: none)
};

struct PoolLayout {
  uint8_t *base;
  uint64_t num_blocks, block_stride;
  PartLayout part[2];
  uint8_t *residual_base;  // residual blocks: [block_size][kv_heads][head_dim] K then V
  uint64_t residual_num_blocks, residual_block_stride;
};

// Receives a sequence record (Pool::seq_save).
struct RecordSink {
  virtual ~RecordSink() = default;
  virtual bool begin(uint64_t total) = 0;
  virtual void write(const uint8_t *p, uint64_t n) = 0;
  virtual void finish(uint64_t checksum) = 0;
};

// Checks and completes a configuration (num_blocks from capacity_bytes,
// plain codecs folded into k_dtype / v_dtype, ...); throws Error describing
// the first problem (core/config.cpp). check_memory: also refuse a pool this
// machine's memory can never hold (OutOfMemory; off when nothing is allocated).
void validate_config(PoolConfig &cfg, bool check_memory = true);

}  // namespace kvc::core
