// The paged KV pool: one arena of blocks, sequences with per-layer block
// tables, copy-on-write forks, and the locking described in kvcache.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "codec/codec.h"
#include "cuda/backend.h"
#include "core/block_allocator.h"
#include "policy/policy.h"
#include "prefix/prefix.h"
#include "common/convert.h"
#include "common/rope.h"
#include "common/rwlock.h"
#include "core/seq_map.h"
#include "core/written.h"

namespace kvc::tier {
class Tier;
}

namespace kvc::core {

// Names core takes from the policy and prefix modules.
using policy::LayerView;
using policy::layer_target;
using policy::Plugin;
using policy::PolicyKind;
using policy::PolicySpec;
using policy::select_keep;
using prefix::ExtraKeys;
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

struct PoolConfig {
  uint32_t num_layers = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  uint32_t block_size = 16;
  uint32_t flags = 0;
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
};

// Prefix cache (prefix_pool.cpp).
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
// Offload tiers (tier_pool.cpp, docs/tiers.md).
struct OffloadState;
struct TierCounts {
  int32_t kind = 0;  // kvc_tier_kind
  uint64_t bytes = 0, entries = 0, hits = 0, misses = 0, demotions = 0, promotions = 0, drops = 0,
           evictions = 0, errors = 0, pinned = 0;
  std::string last_error;
};
// Outcome of polling an asynchronous load.
enum class LoadState : int32_t { Pending = 0, Done = 1, TimedOut = 2 };
struct PrefixCounts {
  uint64_t queried_tokens, hit_tokens, partial_tokens, registered, reclaimable, referenced, inserted, removed,
      reclaimed;
};
// kind 0: stored, 1: removed.
using PrefixEventFn = void (*)(void *user, int kind, const uint8_t *key, const uint8_t *parent, uint32_t key_size,
                               uint64_t depth);
// Attention over the pool's blocks (attention.cpp).
struct AttnParams {
  uint32_t num_q_heads = 0;
  float scale = 0.0f;  // 0: 1 / sqrt(head_dim)
  DType q_dtype = DType::F32, out_dtype = DType::F32;
  uint32_t observe = 0;       // 0: none, 1: accumulate attention mass (H2O), 2: replace (TOVA)
  uint64_t observe_from = 0;  // prefill: first query row whose attention is observed
  uint32_t num_threads = 1;   // decode without observation: threads for this call
};

// The pool's geometry and storage as bytes (docs/prefix-cache.md): equal
// fingerprints mean equal block layouts and codecs (prefix_pool.cpp).
std::vector<uint8_t> pool_fingerprint(const PoolConfig &c);

// Scale entries per token slot in a block for a codec (per-token: one per
// KV head; per-group: one per group of the [num_kv_heads * head_dim] row).
uint64_t scales_per_token(const codec::Spec &sp, uint64_t num_kv_heads, uint64_t head_dim);
uint64_t scales_per_block(const codec::Spec &sp, uint64_t num_kv_heads, uint64_t head_dim,
                          uint64_t block_size);
// Per-thread f32 scratch buffers of at least n values.
float *scratch_f32(uint64_t n);
float *scratch_input(uint64_t n);

struct PoolStats {
  uint64_t blocks_total, blocks_free, blocks_cached, blocks_used, blocks_shared;
  uint64_t bytes_per_block, bytes_per_token, bytes_total, bytes_in_use, peak_bytes_in_use;
  uint64_t num_sequences;
  uint64_t residual_blocks_total, residual_blocks_used, residual_bytes_per_block;
  uint64_t tokens_stored;  // tokens held, summed over sequences and layers
};

// Where K (part 0) or V (part 1) sits inside a block.
struct PartLayout {
  codec::Spec spec;            // dtype, granularity, ... (float dtypes: gran None)
  bool quantized = false;      // fp8 / int storage with scales
  uint64_t offset = 0;         // codes (or plain values) from the block start
  uint64_t token_stride = 0;   // bytes between token slots of the codes
  uint64_t head_stride = 0;    // bytes between KV heads of the codes
  uint64_t codes_bytes = 0;    // codes per block
  uint64_t scale_offset = 0;   // scales from the block start
  uint64_t zero_offset = 0;    // zero points from the block start (asymmetric)
  uint64_t scales_per_token = 0;  // scale entries per token slot (per token / group)
  uint64_t scales_per_block = 0;  // scale entries per block (all granularities)
  uint64_t scale_bytes = 0;    // bytes of one scale entry (4 f32, 2 f16)
  uint64_t bytes = 0;          // the part's bytes per block, scales and zeros included
  uint32_t rotation_block = 0; // Hadamard block inside each head (0: none)
};

struct PoolLayout {
  uint8_t *base;
  uint64_t num_blocks, block_stride;
  PartLayout part[2];
  uint8_t *residual_base;  // residual blocks: [block_size][kv_heads][head_dim] K then V
  uint64_t residual_num_blocks, residual_block_stride;
};

// One layer of a sequence. Tokens are held in block-table order; the tokens
// with index >= tail_index have the contiguous positions tail_pos, tail_pos+1,
// ...; the positions of the first tail_index tokens (survivors of an
// eviction) are listed in `positions`.
struct LayerTable {
  std::vector<int32_t> blocks;      // main arena: tokens [0, n_lp)
  std::vector<int32_t> res_blocks;  // residual arena: tokens [n_lp, n_tokens)
  uint64_t n_tokens = 0;
  uint64_t n_lp = 0;     // tokens in codec format (== n_tokens without a residual)
  uint32_t res_off = 0;  // slot of token n_lp in res_blocks[0]
  // Residual pools: the layer's token count when the last reserve began.
  // Tokens below it are taken as written (the reserve contract); tokens of
  // that reserve only once one append covered them all, so an append does not
  // age (encode) reserved positions an out-of-order write has not reached.
  uint64_t reserved_at = 0;
  uint64_t tail_pos = 0;
  uint64_t tail_index = 0;
  std::vector<int32_t> positions;
  // Observed attention mass per token and KV head ([n_tokens][kv_heads]),
  // kept only while the sequence tracks scores.
  std::vector<float> scores;
  // Residual block with this layer's attention-sink copies (tokens
  // [0, residual_sinks) at slots (layer % per block) x residual_sinks + i);
  // -1 without. One of its sequence's sink_blocks.
  int32_t sink_block = -1;
  // Keys were re-rotated to their in-cache index (StreamingLLM positions):
  // the RoPE position of token i is i, not its text position.
  bool rope_by_index = false;

  int64_t position_of(uint64_t index) const {
    return index >= tail_index ? static_cast<int64_t>(tail_pos + (index - tail_index))
                               : positions[index];
  }
  int64_t rope_position_of(uint64_t index) const {
    return rope_by_index ? static_cast<int64_t>(index) : position_of(index);
  }
};

struct Sequence {
  uint64_t length = 0;  // next position to write
  // New when the sequence is made (SeqMap::insert) and when it is truncated:
  // with its lengths, it tells whether a sequence is still as an append that
  // let go of the lock left it (lengths only grow between stamps).
  uint64_t stamp = 0;
  std::vector<LayerTable> layers;
  // Residual blocks with the high-precision copies of every layer's first
  // residual_sinks tokens (Pool::sink_at): taken with the first reserve,
  // private to the sequence (a fork copies them), freed with it.
  std::vector<int32_t> sink_blocks;
  bool track_scores = false;  // layers keep `scores`
  // Appends hold it shared while they write the sequence's bytes (under the
  // pool's shared lock); kvc_seq_save holds it exclusively, so a record is
  // the sequence at one instant. A copy (fork) gets a fresh lock.
  struct WriteLock {
    mutable RwLock mu;
    WriteLock() = default;
    WriteLock(const WriteLock &) {}
    WriteLock &operator=(const WriteLock &) { return *this; }
  } writers;
  std::shared_ptr<const PolicySpec> policy;  // null: the pool's default
};

// Receives a sequence record (Pool::seq_save).
struct RecordSink {
  virtual ~RecordSink() = default;
  virtual bool begin(uint64_t total) = 0;
  virtual void write(const uint8_t *p, uint64_t n) = 0;
  virtual void finish(uint64_t checksum) = 0;
};

class Pool {
 public:
  // Validates `cfg` (throws Error) and allocates everything.
  explicit Pool(const PoolConfig &cfg);
  ~Pool();
  friend struct PrefixState;
  Pool(const Pool &) = delete;
  Pool &operator=(const Pool &) = delete;

  // Validation shared with the API (throws Error describing the first problem).
  static void validate(PoolConfig &cfg);

  const PoolConfig &config() const { return cfg_; }
  bool on_device() const { return dev_ != nullptr; }
  // CUDA pools: the stream work is queued on; waits and reports refused appends.
  void set_stream(void *stream);
  void sync();
  // Whole blocks to or from host memory (kvc_pool_copy_blocks).
  void copy_blocks(const int32_t *blocks, size_t n, void *host, bool to_host);
  PoolStats stats() const;
  PoolLayout layout() const;
  void reset_peak();
  // Per-tensor scales of a layer (K, V); 0 where there is none.
  std::pair<float, float> tensor_scales(uint32_t layer) const;

  void seq_create(uint64_t id);
  void seq_fork(uint64_t parent, uint64_t child);
  void seq_truncate(uint64_t id, uint64_t new_length);
  void seq_free(uint64_t id);
  uint64_t seq_length(uint64_t id) const;
  uint64_t seq_layer_tokens(uint64_t id, uint32_t layer) const;
  void seq_reserve(uint64_t id, uint64_t n_new, int64_t *slot_mapping);

  void append(uint64_t id, uint32_t layer, uint64_t pos, uint64_t n, const void *k, const void *v,
              DType src);
  void gather(uint64_t id, uint32_t layer, uint64_t first, uint64_t n, void *k_out, void *v_out,
              DType dst, int32_t *positions_out) const;
  size_t block_table(uint64_t id, uint32_t layer, int32_t *out, size_t capacity) const;
  size_t export_page_table(uint32_t layer, const uint64_t *seq_ids, size_t n_seqs, int32_t *indptr,
                           int32_t *indices, size_t capacity, int32_t *last_page_len) const;

  // Attention of n_q query rows per sequence over one layer (attention.cpp).
  // Decode (prefill false): every query sees all of its sequence's tokens.
  // Prefill: one sequence; query i is the layer's token n - n_q + i and sees
  // tokens [0, n - n_q + i] (causal).
  void attention(uint32_t layer, const uint64_t *ids, size_t n_seqs, const void *q, uint64_t n_q,
                 bool prefill, void *out, float *lse, const AttnParams &p);

  // Eviction (evict.cpp).
  void set_policy(uint64_t id, std::shared_ptr<const PolicySpec> p);
  void set_default_policy(std::shared_ptr<const PolicySpec> p);
  // Applies `policy` (or the sequence's / the pool's) to every layer;
  // dropped: NULL or [num_layers] tokens dropped per layer.
  void evict(uint64_t id, const PolicySpec *policy, uint64_t *dropped);
  // Keeps exactly the tokens keep_idx[0..n_keep) (strictly increasing) of one
  // layer and drops the others, as an eviction does (kvc_seq_keep).
  void keep_tokens(uint64_t id, uint32_t layer, const uint64_t *keep_idx, uint64_t n_keep, uint64_t *dropped);
  void observe_scores(uint64_t id, uint32_t layer, const float *scores, uint64_t n, bool accumulate);
  void read_scores(uint64_t id, uint32_t layer, float *out, uint64_t n) const;
  void rope_positions(uint64_t id, uint32_t layer, uint64_t pos, uint64_t n, int32_t *out) const;

  // One sequence as a self-describing record (state.cpp, docs/tiers.md),
  // as it is at one instant (appends to it wait meanwhile): begin(total)
  // first (false: stop, e.g. a buffer too small), then the bytes in order
  // through write(), then finish(checksum) for header bytes 16..24 (written
  // as zero). Returns the record's size. Refuses a sequence with reserved
  // positions no append wrote.
  uint64_t seq_save(uint64_t id, RecordSink &out) const;
  // Creates sequence `id` from a record (all checks first: nothing changes on failure).
  void seq_restore(uint64_t id, const uint8_t *data, size_t size);

  // Prefix cache (prefix_pool.cpp).
  void prefix_enable(const PrefixConfig &c);
  bool prefix_enabled() const { return prefix_ != nullptr; }
  uint32_t prefix_key_size() const;
  // A call's extra keys in their key form, checked against the declared
  // names (docs/prefix-cache.md); the calls below take it.
  ExtraKeys prefix_extra_keys(const PrefixExtra *ex, uint32_t nx) const;
  PrefixResult prefix_lookup(const int32_t *tokens, uint64_t n, const ExtraKeys &kx,
                             bool partial) const;
  PrefixResult prefix_attach(uint64_t id, const int32_t *tokens, uint64_t n, const ExtraKeys &kx,
                             bool partial);
  uint64_t prefix_insert(uint64_t id, const int32_t *tokens, uint64_t n, const ExtraKeys &kx);
  // Chain keys of the full blocks of tokens[0, n): [n / block_size][key_size] bytes.
  void prefix_keys(const int32_t *tokens, uint64_t n, const ExtraKeys &kx, uint8_t *out) const;
  PrefixCounts prefix_counts() const;

  // Offload tiers (tier_pool.cpp, docs/tiers.md). Tiers need the prefix cache.
  // Makes the tier with `make` (which may throw) once the pool can take it.
  uint32_t add_tier(const std::function<std::unique_ptr<tier::Tier>()> &make, int32_t kind);
  void set_offload(uint32_t queue_blocks, uint32_t load_timeout_ms);
  uint32_t num_tiers() const;
  TierCounts tier_counts(uint32_t index) const;
  // Lookup through the pool and then the tiers; `pin`: pins the tier blocks found.
  PrefixResult prefix_lookup_tiers(const int32_t *tokens, uint64_t n, const ExtraKeys &kx,
                                   bool partial, bool pin);
  void prefix_unpin(uint64_t pin);
  // Queues the registered blocks of a prompt for writing to every tier; returns blocks queued.
  uint64_t prefix_offload(const int32_t *tokens, uint64_t n, const ExtraKeys &kx);
  void flush_tiers();
  // Loads the tier blocks following the pool's hit into cached pool blocks
  // (registered, reference count 0). prefetch returns a ticket; poll reports
  // its state (wait: until it is no longer pending) and on Done / TimedOut
  // forgets the ticket.
  // sync: kvc_prefix_load's own ticket, reported only to prefix_poll(wait = true).
  uint64_t prefix_prefetch(const int32_t *tokens, uint64_t n, const ExtraKeys &kx,
                           bool sync = false);
  LoadState prefix_poll(uint64_t ticket, bool wait, uint64_t *loaded_tokens);
  // White-box: the keys in the index (key_size bytes each, as strings).
  std::vector<std::string> prefix_registered_keys() const;
  void prefix_set_callback(PrefixEventFn fn, void *user, const std::function<void()> &under_lock);

  // Debug / fuzz support: verifies every invariant (block states, reference
  // counts equal to the number of block-table entries, token counts); returns
  // "" or the first violation.
  std::string check_invariants() const;
  std::string check_prefix() const;  // part of check_invariants (lock held)

  // Block-table entries per block and the seq ids, for the invariant check.
 private:
  std::string check_sequence(uint64_t id, const Sequence &s, std::vector<uint64_t> &refs,
                             std::vector<uint64_t> &res_refs) const;

 public:

 private:
  Sequence &find(uint64_t id);
  const Sequence &find(uint64_t id) const;
  void check_layer(uint32_t layer) const;
  uint8_t *block_ptr(int32_t b) const { return arena_ + static_cast<uint64_t>(b) * block_stride_; }
  cuda::Geometry geometry() const;
  void zero_block(int32_t b);
  void copy_block(int32_t dst, int32_t src);
  // Written-slot tracking (core/written.h). Calls f(residual, block, slot,
  // run, done) for the runs of tokens [idx0, idx0 + n) of a layer, one block
  // at a time (done: tokens before the run).
  template <typename F>
  void for_runs(const LayerTable &l, uint64_t idx0, uint64_t n, F &&f) const;
  void mark_written(const LayerTable &l, uint64_t idx0, uint64_t n, bool written);
  // The first of tokens [idx0, idx0 + n) of a layer no append wrote, or UINT64_MAX.
  uint64_t first_unwritten(const LayerTable &l, uint64_t idx0, uint64_t n) const;
  // Zeroes the output rows (row_bytes each, K and / or V) of the tokens of a
  // run [slot, slot + run) of block b that no append wrote.
  void zero_unwritten_rows(bool residual, int32_t b, uint32_t slot, uint64_t run, uint8_t *k_out,
                           uint8_t *v_out, uint64_t row_bytes) const;
  // Byte ranges (offset in a main-arena block, length) that hold token slots
  // [slot, slot + count): codes, per-token scales and zero points of K and V.
  template <typename F>
  void for_slot_bytes(uint32_t slot, uint64_t count, F &&f) const;
  // Zeroes slots [slot, slot + count) of a copy of a block (residual: of the
  // residual arena) in host memory.
  void zero_slots(uint8_t *blk, bool residual, uint32_t slot, uint64_t count) const;
  // Slots (block * block_size + slot) of tokens [first, first + n) of a layer's main arena.
  std::vector<cuda::Slot> slots_of(const LayerTable &l, uint64_t first, uint64_t n) const;
  int32_t take_block();              // allocate (caller checked availability)
  void release_block(int32_t b);     // reference - 1, zero on free
  int32_t cow_copy(int32_t b);       // fresh private copy of block b; releases b
  void note_usage();
  bool residual() const { return res_alloc_.num_blocks() > 0; }
  uint8_t *res_ptr(int32_t b) const { return res_arena_ + static_cast<uint64_t>(b) * res_stride_; }
  int32_t take_res();
  void release_res(int32_t b);
  int32_t cow_res(int32_t b);
  // Attention sinks: blocks a sequence needs for its copies, where layer
  // `layer`'s copy of token i lives (block, slot + i), writes and overlays.
  uint64_t sink_blocks_needed() const;
  uint32_t sink_slot(uint32_t layer) const;  // slot of the layer's first copy in its sink block
  void assign_sinks(Sequence &s) const;  // each layer's sink_block from s.sink_blocks
  // Shared scales leave the attention sinks out: the leading sink rows of n
  // rows at idx0 (0 unless others follow), and a per-channel group's sink
  // rows clamped into its other rows' per-column range.
  uint64_t leading_sinks(const LayerTable &l, uint64_t idx0, uint64_t n) const;
  void clamp_sinks(const LayerTable &l, uint64_t idx0, uint32_t unit, float *x, uint64_t row) const;
  void write_sinks(uint32_t layer, const LayerTable &l, uint64_t idx0, uint64_t n, const uint8_t *k,
                   const uint8_t *v, DType src) const;
  void overlay_sinks(uint32_t layer, const LayerTable &l, uint64_t idx0, uint64_t n, uint8_t *k_out,
                     uint8_t *v_out, DType dst) const;
  uint64_t hp_target(uint64_t length) const;  // tokens a layer keeps in the residual
  uint32_t age_unit() const;                  // tokens encoded together when aging
  void age(uint32_t layer, LayerTable &l, uint64_t count);
  bool age_due(const Sequence &s, uint32_t layer, uint64_t idx0, uint64_t written_end) const;
  void age_written(Sequence &s, uint32_t layer, uint64_t idx0, uint64_t written_end);
  void write_residual(uint8_t *blk, uint32_t slot, const uint8_t *k, const uint8_t *v, DType src,
                      uint64_t count) const;
  void read_residual(const uint8_t *blk, uint32_t slot, uint64_t count, uint8_t *k_out,
                     uint8_t *v_out, DType dst) const;
  uint64_t bytes_in_use() const;
  void enable_scores(Sequence &s);  // exclusive lock held; may throw bad_alloc (nothing changed)
  const PolicySpec *policy_of(const Sequence &s) const;
  void check_policy_fits(const PolicySpec *p) const;
  // Plans and applies an eviction of every layer of `s` (exclusive lock
  // held): all checks first, then changes that cannot fail.
  void evict_locked(uint64_t id, Sequence &s, const PolicySpec &p, uint64_t reserve_new, uint64_t *dropped);
  // The apply half of an eviction: keep[li] (the survivors of layer li, for
  // the layers whose first_write is set), copy-on-write first. Throws only
  // before the first change (PoolExhausted when cow_needed blocks are missing).
  void apply_keep_locked(Sequence &s, const std::vector<std::vector<uint32_t>> &keep,
                         const std::vector<uint64_t> &first_write, const std::vector<char> &shift,
                         uint64_t cow_needed, uint64_t *dropped);
  class LayerTiles;  // attention.cpp: a layer's blocks as attention tiles
  void attention_device(uint32_t layer, const uint64_t *ids, size_t n_seqs, const void *q, uint64_t n_q,
                        bool prefill, void *out, float *lse, const AttnParams &p, float scale);
  void write_part(int kv, uint32_t layer, uint8_t *blk, const uint8_t *src, DType src_type,
                  const float *src_f32, uint32_t slot, uint64_t count) const;
  // Reads `count` tokens from slots [slot, ...) of part kv; `l` and `idx0`
  // (the layer's index of the first) give the RoPE positions that pre-RoPE
  // keys are rotated back to.
  void read_part(int kv, uint32_t layer, const uint8_t *blk, uint32_t slot, uint64_t count,
                 uint8_t *out, DType dst, const LayerTable &l, uint64_t idx0) const;
  // The per-tensor scale of a layer (dynamic: calibrated by the first write).
  float tensor_scale(int kv, uint32_t layer) const;
  void calibrate(int kv, uint32_t layer, const float *x, uint64_t n);
  void calibrate_absmax(int kv, uint32_t layer, float absmax);

  PoolConfig cfg_;
  PartLayout part_[2];
  uint64_t block_stride_ = 0, arena_bytes_ = 0;
  uint64_t res_stride_ = 0, res_arena_bytes_ = 0;
  uint8_t *res_arena_ = nullptr;
  // Per-layer per-tensor scales (bits of a float; 0 = not calibrated yet).
  std::unique_ptr<std::atomic<uint32_t>[]> tensor_scale_[2];
  uint8_t *arena_ = nullptr;  // host memory, or device memory owned by dev_
  std::unique_ptr<cuda::Device> dev_;  // CUDA pools only
  BlockAllocator alloc_;
  BlockAllocator res_alloc_;
  SeqMap<Sequence> seqs_;
  uint64_t peak_bytes_ = 0;
  uint64_t tokens_stored_ = 0;  // sum of n_tokens over sequences and layers
  uint32_t unit_ = 1;  // tokens encoded together when aging (per-channel group size)
  std::unique_ptr<RopeTable> pre_rope_;  // KVC_POOL_PRE_ROPE_KEYS only
  std::shared_ptr<const PolicySpec> default_policy_;
  std::unique_ptr<PrefixState> prefix_;
  std::unique_ptr<OffloadState> offload_;
  friend struct OffloadState;
  // Offload internals (tier_pool.cpp; exclusive lock held unless noted).
  std::vector<uint8_t> stage_entry(uint32_t e) const;  // a registered entry as a tier payload
  uint32_t tensor_scale_parts() const { return (tensor_scale_[0] ? 1u : 0u) + (tensor_scale_[1] ? 1u : 0u); }
  bool demote_entry(uint32_t e);                       // stage + queue; false: dropped (queue full)
  void install_load(uint64_t ticket, const std::vector<std::vector<uint8_t>> &payloads,
                    const std::vector<uint32_t> &from);
  void expire_loads();                                 // frees reservations past their deadline
  // Registers blocks[nl] under key k (tokens of one block) as a child of
  // parent_entry (-1: root); returns the entry.
  uint32_t prefix_register(const BlockKey &k, const BlockKey &parent, int64_t parent_entry, uint64_t depth,
                           const int32_t *tokens, const BlockKey &xd, const std::vector<uint8_t> &xb,
                           const int32_t *blocks);
  // Prefix index hooks (exclusive lock held).
  bool registered(int32_t b) const;
  void prefix_drop_block(int32_t b);                 // drops the entry holding block b (before an in-place write)
  void prefix_on_reclaim(int32_t b);                 // block b left the LRU for reuse
  void prefix_on_cached(int32_t b);                  // block b became cached: keep its chain's parents newer
  void prefix_drop_entry(uint32_t e, int32_t taken);
  SlotBits written_, res_written_;  // slots an append wrote (main arena, residual arena)
  mutable RwLock mu_;
  mutable std::mutex scores_mu_;  // recorded attention scores (written under the shared lock)
};

}  // namespace kvc::core
