// The pool's internals (as SQLite keeps X.h and XInt.h): a sequence's
// per-layer tables, the shared state of one pool and the helpers core's units
// share. Only src/core includes it; callers use core/pool.h.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/rwlock.h"
#include "common/strings.h"
#include "core/block_allocator.h"
#include "core/format.h"
#include "core/seq_map.h"
#include "core/staging.h"
#include "core/store.h"
#include "core/types.h"
#include "core/written.h"

namespace kvc::core {

using policy::layer_target;
using policy::LayerView;
using policy::PolicyKind;
using policy::PolicySpec;
using policy::select_keep;

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
  // Statistics of the queries observed on this layer (pre-RoPE frame), for
  // expected-attention eviction; empty until the first observation. A fork
  // copies them; records (seq_save) do not hold them.
  policy::QueryStats qstats;
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
  // residual_sinks tokens (Staging::sink_slot): taken with the first reserve,
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

  // Back to a new sequence's state (every field as a new Sequence's; the
  // layers' block tables emptied, their capacity kept up to kKeptEntries
  // each while the kept capacity stays within `budget` bytes), for
  // PoolCore::retire_sequence.
  static constexpr size_t kKeptEntries = 64;
  void reset_for_reuse(size_t budget);
};

// The prefix cache's hooks on the life of a block (core/prefix_cache.h;
// exclusive pool lock held).
class BlockEvents {
 public:
  virtual ~BlockEvents() = default;
  virtual bool registered(int32_t b) const = 0;
  // Block b is about to be written in place: its entry leaves the index.
  virtual void before_write(int32_t b) = 0;
  // A cached block b was taken for reuse.
  virtual void reclaimed(int32_t b) = 0;
  // Registered block b became cached (reference count 0).
  virtual void cached(int32_t b) = 0;
};

// The block size as a divisor: a shift and a mask when it is a power of two
// (the usual case), so the hot paths (reserve, truncate, append) pay no
// 64-bit division, which costs tens of cycles.
struct BlockDiv {
  uint64_t v;
  uint32_t shift;  // 64: not a power of two
  operator uint64_t() const { return v; }
};
inline BlockDiv block_div(uint64_t v) {
  const bool pow2 = (v & (v - 1)) == 0;
  return {v, pow2 ? static_cast<uint32_t>(__builtin_ctzll(v)) : 64u};
}
inline uint64_t operator/(uint64_t x, BlockDiv d) {
  return d.shift < 64 ? x >> d.shift : x / d.v;
}
inline uint64_t operator%(uint64_t x, BlockDiv d) {
  return d.shift < 64 ? x & (d.v - 1) : x % d.v;
}

// Largest token count and block id (block tables hold int32).
constexpr uint64_t kMaxLength = 0x7fffffffu;

// Per-thread f32 scratch buffers of at least n values (blocks.cpp).
float *scratch_f32(uint64_t n);
float *scratch_input(uint64_t n);

// The scratch an append holds from its store's prepare() to its last write
// (the input converted to f32 rows, f16 rows' group keys): the thread's own
// buffers where they are free. A call made on the same thread meanwhile (a
// prefix-cache callback that appends to another pool from a block reclaimed
// by the append's copy-on-write) finds them held and works in buffers of its
// own, and the release of large buffers as C API calls return leaves held
// ones alone. (blocks.cpp)
class InputScratch {
 public:
  InputScratch();
  ~InputScratch();
  InputScratch(const InputScratch &) = delete;
  InputScratch &operator=(const InputScratch &) = delete;
  float *floats(uint64_t n);           // at least n (contents not kept when grown)
  uint16_t *keys(int kv, uint64_t n);  // kv 0 (K) or 1 (V)

 private:
  struct Own;
  std::unique_ptr<Own> own_;              // null: the thread's buffers
  bool held_[3] = {false, false, false};  // the thread's f32 and K / V keys buffers in use
};

// One pool's state: the configuration, the block format, the store of the
// block bytes, the main arena's allocator and written-slot bits, the residual
// staging, the sequences and the lock. Pool (core/pool.h) is its public face;
// the prefix cache and the offload tiers reach it through their own classes.
struct PoolCore {
  explicit PoolCore(const PoolConfig &validated);
  ~PoolCore();
  PoolCore(const PoolCore &) = delete;
  PoolCore &operator=(const PoolCore &) = delete;

  PoolConfig cfg_;
  BlockFormat fmt_;
  uint64_t block_stride_ = 0, arena_bytes_ = 0;
  BlockAllocator alloc_;
  SlotBits written_;  // slots an append wrote (main arena)
  Staging stage_;
  std::unique_ptr<BlockStore> store_;
  uint8_t *arena_ = nullptr;  // store_->arena(), for kvc_pool_get_layout (core reads no block byte)
  SeqMap<Sequence> seqs_;
  // Freed sequences that seq_create reuses (their layer tables and small
  // block tables: a short request's create / reserve / free allocates
  // nothing). At most kSpareSequences, each holding at most kSpareBytes
  // (its tables and kept block-table capacity: a sequence with more tables,
  // such as a head-wise pool's of thousands of layers x heads, is not kept);
  // under the exclusive lock.
  static constexpr size_t kSpareSequences = 8, kSpareBytes = size_t(512) << 10;
  std::vector<std::unique_ptr<Sequence>> spare_seqs_;
  uint64_t peak_bytes_ = 0;
  uint64_t tokens_stored_ = 0;  // sum of n_tokens over sequences and layers
  std::shared_ptr<const PolicySpec> default_policy_;
  BlockEvents *events_ = nullptr;  // the prefix cache, once enabled
  mutable RwLock mu_;
  mutable std::mutex scores_mu_;  // recorded attention scores (written under the shared lock)

  // ---- sequences ----
  // A new sequence with one table per layer (a spare when there is one).
  // May throw bad_alloc.
  std::unique_ptr<Sequence> new_sequence();
  // A freed sequence (its blocks released): kept as a spare or deleted.
  void retire_sequence(std::unique_ptr<Sequence> s) noexcept;
  Sequence &find(uint64_t id);
  const Sequence &find(uint64_t id) const;
  void check_layer(uint32_t layer) const;  // a table index (a layer of a token-wise pool)

  // ---- head-wise pools (core/headwise.cpp) ----
  // Tables per caller's layer: its KV heads in a head-wise pool, else 1.
  // Layer l's head h is table l x heads() + h.
  uint32_t heads() const { return cfg_.headwise_heads ? cfg_.headwise_heads : 1u; }
  bool headwise() const { return cfg_.headwise_heads != 0; }  // KVC_POOL_HEADWISE (any head count)
  uint32_t num_layers() const { return cfg_.num_layers / heads(); }  // the caller's layers
  void check_caller_layer(uint32_t layer) const;
  // "layer L", or "layer L head H" in a head-wise pool: table t for messages.
  std::string table_name(uint32_t t) const;
  // The table of KV head `head` of a caller's layer (a token-wise pool: the
  // layer's, whose blocks hold every head); both checked.
  uint32_t head_table(uint32_t layer, uint32_t head) const;
  // FlashInfer's CSR page table of these tables, one row each (read.cpp);
  // returns the indices it needs (only counts when above `capacity`).
  size_t page_table(const std::vector<const LayerTable *> &rows, int32_t *indptr, int32_t *indices,
                    size_t capacity, int32_t *last_page_len) const;
  // A head-wise layer whose heads hold the same tokens at the same positions
  // (so per-layer reads apply); throws Unsupported naming `what` otherwise.
  void check_heads_agree(const Sequence &s, uint32_t layer, const char *what) const;

  // ---- blocks (exclusive lock held) ----
  // A block of format class c (caller checked its availability), or of
  // table `layer`'s class.
  int32_t take_block(uint32_t c);
  int32_t take_layer_block(uint32_t layer) { return take_block(fmt_.class_of_layer(layer)); }
  void release_block(int32_t b);  // reference - 1, zero on free
  int32_t cow_copy(int32_t b);    // fresh private copy of block b; releases b
  void copy_block(int32_t dst, int32_t src);
  void zero_block(int32_t b);
  uint64_t bytes_in_use() const;
  // Blocks an operation needs, per format class (one class unless the pool
  // has per-layer codecs): counted with add(table, n), checked with fits().
  // (Only the pool's classes are set and read: a reserve makes two of these,
  // and zeroing all kMaxFormats counts cost it more than its atomics.)
  struct Need {
    uint64_t n[kMaxFormats];
    explicit Need(const PoolCore &c) : c_(&c) {
      for (uint32_t k = 0; k < c.alloc_.num_classes(); ++k) n[k] = 0;
    }
    void add(uint32_t layer, uint64_t k) { n[c_->fmt_.class_of_layer(layer)] += k; }
    void add_block(int32_t b, uint64_t k) { n[c_->alloc_.class_of(b)] += k; }
    uint64_t total() const {
      uint64_t t = 0;
      for (uint32_t k = 0; k < c_->alloc_.num_classes(); ++k) t += n[k];
      return t;
    }
    const PoolCore *c_;
  };
  // Whether every class has need.n[c] blocks available now.
  bool fits(const Need &need) const {
    for (uint32_t c = 0; c < alloc_.num_classes(); ++c)
      if (need.n[c] > alloc_.available(c)) return false;
    return true;
  }
  // Whether every class has need.n[c] blocks at all.
  bool ever_fits(const Need &need) const {
    for (uint32_t c = 0; c < alloc_.num_classes(); ++c)
      if (need.n[c] > alloc_.blocks(c)) return false;
    return true;
  }
  // " (per-layer formats: class c needs n, a available; ...)" for a mixed
  // pool's messages; "" otherwise.
  std::string class_detail(const Need &need, bool total) const;
  void note_usage();
  // Prefix-index hooks (no-ops without a prefix cache).
  bool registered(int32_t b) const { return events_ && events_->registered(b); }
  void prefix_drop_block(int32_t b) {
    if (events_) events_->before_write(b);
  }

  // ---- written slots (core/written.h) ----
  // Calls f(residual, block, slot, run, done) for the runs of tokens
  // [idx0, idx0 + n) of a layer, one block at a time (done: tokens before the run).
  template <typename F>
  void for_runs(const LayerTable &l, uint64_t idx0, uint64_t n, F &&f) const;
  void mark_written(const LayerTable &l, uint64_t idx0, uint64_t n, bool written);
  // The first of tokens [idx0, idx0 + n) of a layer no append wrote, or UINT64_MAX.
  uint64_t first_unwritten(const LayerTable &l, uint64_t idx0, uint64_t n) const;
  // Zeroes the output rows (row_bytes each, K and / or V) of the tokens of a
  // run [slot, slot + run) of block b that no append wrote.
  void zero_unwritten_rows(bool residual, int32_t b, uint32_t slot, uint64_t run, uint8_t *k_out,
                           uint8_t *v_out, uint64_t row_bytes) const;

  // ---- appends (write.cpp) ----
  // Shared blocks a write of tokens [idx0, idx0 + n) of a table touches
  // (codec, residual); whether it writes a registered block in place; and
  // (exclusive lock, room checked) the copy-on-write that makes them private.
  std::pair<uint64_t, uint64_t> shared_in_write(const LayerTable &l, uint64_t idx0,
                                                uint64_t n) const;
  bool write_touches_registered(const LayerTable &l, uint64_t idx0, uint64_t n) const;
  void cow_for_write(LayerTable &l, uint64_t idx0, uint64_t n);

  // ---- eviction (evict.cpp; exclusive lock held) ----
  void enable_scores(Sequence &s);  // may throw bad_alloc (nothing changed)
  const PolicySpec *policy_of(const Sequence &s) const;
  void check_policy_fits(const PolicySpec *p) const;
  void check_duo_fits(const PolicySpec &p) const;       // DuoAttention: a table and a gate per head
  void check_headwise_fits(const PolicySpec &p) const;  // shift_positions, AdaKV
  // Plans and applies an eviction of every layer of `s`: all checks first,
  // then changes that cannot fail.
  void evict_locked(uint64_t id, Sequence &s, const PolicySpec &p, uint64_t reserve_new,
                    uint64_t *dropped);
  // The apply half of an eviction: keep[li] (the survivors of layer li, for
  // the layers whose first_write is set), copy-on-write first. Throws only
  // before the first change (PoolExhausted when cow_needed blocks are missing).
  void apply_keep_locked(Sequence &s, const std::vector<std::vector<uint32_t>> &keep,
                         const std::vector<uint64_t> &first_write, const std::vector<char> &shift,
                         const Need &cow_needed, uint64_t *dropped);
};

template <typename F>
void PoolCore::for_runs(const LayerTable &l, uint64_t idx0, uint64_t n, F &&f) const {
  const BlockDiv bs = block_div(cfg_.block_size);
  for (uint64_t done = 0; done < n;) {
    const uint64_t idx = idx0 + done;
    uint64_t run;
    if (idx < l.n_lp) {
      const uint32_t slot = static_cast<uint32_t>(idx % bs);
      run = std::min<uint64_t>({n - done, bs - slot, l.n_lp - idx});
      f(false, l.blocks[idx / bs], slot, run, done);
    } else {
      const uint64_t r = l.res_off + (idx - l.n_lp);
      const uint32_t slot = static_cast<uint32_t>(r % bs);
      run = std::min<uint64_t>(n - done, bs - slot);
      f(true, l.res_blocks[r / bs], slot, run, done);
    }
    done += run;
  }
}

}  // namespace kvc::core
