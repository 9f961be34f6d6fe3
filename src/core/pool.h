// The paged KV pool: one arena of blocks, sequences with per-layer block
// tables, copy-on-write forks, and the locking described in kvcache.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/block_allocator.h"
#include "core/convert.h"
#include "core/rwlock.h"
#include "core/seq_map.h"

namespace kvc::core {

enum class Layout : int32_t { NHD = 0, HND = 1 };
enum class Device : int32_t { CPU = 0, CUDA = 1 };

constexpr uint32_t kFlagZeroOnFree = 0x1u;

struct PoolConfig {
  uint32_t num_layers = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  uint32_t block_size = 16;
  uint32_t flags = 0;
  uint64_t num_blocks = 0;
  uint64_t capacity_bytes = 0;
  DType k_dtype = DType::F16, v_dtype = DType::F16;
  Layout layout = Layout::NHD;
  Device device = Device::CPU;
  int32_t device_index = 0;
};

struct PoolStats {
  uint64_t blocks_total, blocks_free, blocks_cached, blocks_used, blocks_shared;
  uint64_t bytes_per_block, bytes_per_token, bytes_total, bytes_in_use, peak_bytes_in_use;
  uint64_t num_sequences;
};

struct PoolLayout {
  uint8_t *base;
  uint64_t num_blocks, block_stride;
  uint64_t k_offset, k_token_stride, k_head_stride, k_bytes;
  uint64_t v_offset, v_token_stride, v_head_stride, v_bytes;
};

// One layer of a sequence. Tokens are held in block-table order; the tokens
// with index >= tail_index have the contiguous positions tail_pos, tail_pos+1,
// ...; the positions of the first tail_index tokens (survivors of an
// eviction) are listed in `positions`.
struct LayerTable {
  std::vector<int32_t> blocks;
  uint64_t n_tokens = 0;
  uint64_t tail_pos = 0;
  uint64_t tail_index = 0;
  std::vector<int32_t> positions;

  int64_t position_of(uint64_t index) const {
    return index >= tail_index ? static_cast<int64_t>(tail_pos + (index - tail_index))
                               : positions[index];
  }
};

struct Sequence {
  uint64_t length = 0;  // next position to write
  std::vector<LayerTable> layers;
};

class Pool {
 public:
  // Validates `cfg` (throws Error) and allocates everything.
  explicit Pool(const PoolConfig &cfg);
  ~Pool();
  Pool(const Pool &) = delete;
  Pool &operator=(const Pool &) = delete;

  // Validation shared with the API (throws Error describing the first problem).
  static void validate(PoolConfig &cfg);

  const PoolConfig &config() const { return cfg_; }
  PoolStats stats() const;
  PoolLayout layout() const;
  void reset_peak();

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

  // Debug / fuzz support: verifies every invariant (block states, reference
  // counts equal to the number of block-table entries, token counts); returns
  // "" or the first violation.
  std::string check_invariants() const;

  // Block-table entries per block and the seq ids, for the invariant check.
 private:
  std::string check_sequence(uint64_t id, const Sequence &s, std::vector<uint64_t> &refs) const;

 public:

 private:
  Sequence &find(uint64_t id);
  const Sequence &find(uint64_t id) const;
  void check_layer(uint32_t layer) const;
  uint8_t *block_ptr(int32_t b) const { return arena_ + static_cast<uint64_t>(b) * block_stride_; }
  int32_t take_block();              // allocate (caller checked availability)
  void release_block(int32_t b);     // reference - 1, zero on free
  int32_t cow_copy(int32_t b);       // fresh private copy of block b; releases b
  void note_usage();
  void write_rows(uint8_t *dst_base, uint64_t token_stride, uint64_t head_stride, DType dst,
                  const uint8_t *src, DType src_type, uint32_t slot, uint64_t count) const;

  PoolConfig cfg_;
  uint64_t k_bytes_ = 0, v_bytes_ = 0, block_stride_ = 0, arena_bytes_ = 0;
  uint64_t k_token_stride_ = 0, k_head_stride_ = 0, v_token_stride_ = 0, v_head_stride_ = 0;
  uint8_t *arena_ = nullptr;
  BlockAllocator alloc_;
  SeqMap<Sequence> seqs_;
  uint64_t peak_blocks_ = 0;
  mutable RwLock mu_;
};

}  // namespace kvc::core
