// Residual staging and attention sinks (KIVI arXiv 2402.02750's residual
// window, hybrid precision, per-channel groups; StreamingLLM arXiv
// 2309.17453's sinks kept exact): a second arena whose blocks hold each
// layer's newest tokens in residual_dtype, [block_size][kv_heads][head_dim]
// K then V (or int8 rows with a scale per token and KV head); tokens leave it for the codec blocks
// as they age, one aging unit (a per-channel group) at a time. Sink blocks hold each layer's first
// residual_sinks tokens as written, laid over the decoded codes on reads.
//
// The rules here (how many tokens a layer keeps staged, the aging unit, the
// sink blocks a sequence needs) are the ones the sizing call
// (core/sizing.cpp) replays.
#pragma once
#include <cstdint>
#include <vector>

#include "core/block_allocator.h"
#include "core/types.h"
#include "core/written.h"

namespace kvc::core {

struct LayerTable;
struct Sequence;
struct PoolCore;

// The staging rules of a configuration, without an arena.
struct StagingRules {
  explicit StagingRules(const PoolConfig &cfg);
  bool active = false;    // the pool has a residual arena
  uint32_t unit = 1;      // tokens encoded together when aging (a per-channel group size)
  uint64_t window = 0;    // residual_window
  double fraction = 0.0;  // residual_fraction
  uint32_t sinks = 0;     // residual_sinks
  uint32_t block_size = 16, num_layers = 0;
  // Tokens a layer keeps in the residual at a sequence length.
  uint64_t hp_target(uint64_t length) const {
    const uint64_t frac = static_cast<uint64_t>(fraction * static_cast<double>(length));
    return window > frac ? window : frac;
  }
  // Residual blocks a sequence needs for its attention-sink copies.
  uint64_t sink_blocks_needed() const;
  // Slot of layer `layer`'s first sink copy in its sink block: layer l's copies
  // of its first S tokens are at slots (l % per) * S + i of sink block l / per,
  // per = floor(block_size / S) layers to a residual block.
  uint32_t sink_slot(uint32_t layer) const {
    return static_cast<uint32_t>(layer % layers_per_sink_block()) * sinks;
  }
  uint64_t layers_per_sink_block() const { return sinks ? block_size / sinks : 1; }
};

class Staging : public StagingRules {
 public:
  Staging(PoolCore &core, const PoolConfig &cfg);
  ~Staging();
  Staging(const Staging &) = delete;
  Staging &operator=(const Staging &) = delete;

  // Bytes of one residual block of a configuration: [block_size][kv_heads][head_dim] K then V
  // (int8 rows: each part's codes, then its [block_size][kv_heads] f16 scales).
  static uint64_t stride_of(const PoolConfig &cfg);
  // Bytes of one token's K (or V) row: kv_heads x head_dim elements (int8: plus one f16 scale
  // per KV head).
  static uint64_t row_bytes_of(const PoolConfig &cfg);

  BlockAllocator alloc;  // the residual arena's blocks
  SlotBits written;      // slots an append wrote
  uint8_t *arena = nullptr;
  uint64_t stride = 0, arena_bytes = 0;

  uint8_t *ptr(int32_t b) const { return arena + static_cast<uint64_t>(b) * stride; }
  int32_t take();           // allocate (caller checked availability); nothing written yet
  void release(int32_t b);  // reference - 1, zero on free (KVC_POOL_ZERO_ON_FREE)
  int32_t cow(int32_t b);   // fresh private copy of b; releases b
  // Zeroes slots [slot, slot + count) of a copy of a residual block in host memory.
  void zero_slots(uint8_t *blk, uint32_t slot, uint64_t count) const;

  // Rows of `count` tokens to / from slots [slot, ...) of a residual block
  // (values saturate to residual_dtype's range: a finite input never becomes Inf;
  // int8 rows take finite input only, which the append checked).
  void write(uint8_t *blk, uint32_t slot, const uint8_t *k, const uint8_t *v, DType src,
             uint64_t count) const;
  void read(const uint8_t *blk, uint32_t slot, uint64_t count, uint8_t *k_out, uint8_t *v_out,
            DType dst) const;

  // One token's K and V rows, as stored, from slot src_slot of residual block src to slot
  // dst_slot of residual block dst (src != dst or different slots).
  void copy_row(const uint8_t *src, uint32_t src_slot, uint8_t *dst, uint32_t dst_slot) const;

  // Attention sinks.
  void assign_sinks(Sequence &s) const;  // each layer's sink_block from s.sink_blocks
  // Copies of tokens [idx0, idx0 + n) of a layer (rows of k and v), those below S.
  void write_sinks(uint32_t layer, const LayerTable &l, uint64_t idx0, uint64_t n, const uint8_t *k,
                   const uint8_t *v, DType src) const;
  // Rows of tokens [idx0, idx0 + n) read from codec blocks (k_out / v_out, either
  // null) as dst: the encoded sinks among them are replaced by their copies.
  void overlay_sinks(uint32_t layer, const LayerTable &l, uint64_t idx0, uint64_t n, uint8_t *k_out,
                     uint8_t *v_out, DType dst) const;
  // Shared scales leave the attention sinks out: the leading sink rows of n
  // rows at idx0 (0 unless others follow), and a per-channel group's sink
  // rows clamped into its other rows' per-column range.
  uint64_t leading_sinks(const LayerTable &l, uint64_t idx0, uint64_t n) const;
  void clamp_sinks(const LayerTable &l, uint64_t idx0, uint32_t unit, float *x, uint64_t row) const;

  // Aging: encodes the `count` oldest residual tokens of a layer (a multiple
  // of unit) into its codec blocks and frees the residual blocks they leave.
  // The caller reserved the codec blocks it needs and made the last one
  // private. Never throws.
  void age(uint32_t layer, LayerTable &l, uint64_t count);
  // Whether an append of indices [idx0, written_end) of a layer lets tokens
  // age now, and (exclusive lock held, best effort, never throws) ages them.
  bool age_due(const Sequence &s, uint32_t layer, uint64_t idx0, uint64_t written_end) const;
  void age_written(Sequence &s, uint32_t layer, uint64_t idx0, uint64_t written_end);

 private:
  PoolCore &c_;
  PoolConfig cfg_;
};

}  // namespace kvc::core
