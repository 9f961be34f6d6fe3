// How a pool block stores its tokens: the K part then the V part, each plain
// (f32 / f16 / bf16, NHD or HND) or in a codec's codes + scales + zero points
// (docs/codecs.md), plus what writing and reading a token needs beyond the
// block: the layers' per-tensor scales (calibrated by the first write) and,
// for pre-RoPE keys, the RoPE table. The CPU codec path of the pool.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "codec/codec.h"
#include "common/rope.h"
#include "core/types.h"

namespace kvc::core {

struct LayerTable;

// The most block formats a pool has (distinct per-layer codec pairs).
constexpr uint32_t kMaxFormats = 16;

// One block format of a pool: its parts, its size, and the block ids and
// arena bytes of the blocks in it. A pool has one; a pool with a codec per
// layer (mixed precision, docs/codecs.md) one per distinct (K, V) codec pair.
struct FormatClass {
  PartLayout part[2];              // K (0) and V (1)
  uint64_t stride = 0;             // bytes of one block (K and V, each part on 16 bytes)
  uint64_t base = 0;               // arena offset of the class's first block
  uint32_t first = 0, blocks = 0;  // its block ids: [first, first + blocks)
  uint32_t layers = 0;             // tables (layers) stored in it
};

// Whether two codec specs store a part alike (every field of the spec).
bool same_spec(const codec::Spec &a, const codec::Spec &b);

// The classes of a validated configuration (blocks and base from
// cfg.num_blocks), and the class of each table (empty: every table class 0).
// Throws Error (Overflow) when a block's bytes overflow.
void format_classes(const PoolConfig &cfg, std::vector<FormatClass> *cls,
                    std::vector<uint8_t> *layer_cls);
// How the pool's num_blocks divide among the classes: each class
// floor(num_blocks x its tables / all tables), the rest one each to the
// largest remainders; they sum to num_blocks.
void split_blocks(uint64_t num_blocks, uint32_t num_tables, std::vector<FormatClass> &cls);

class BlockFormat {
 public:
  // Lays the parts out for a validated configuration.
  explicit BlockFormat(const PoolConfig &cfg);

  std::vector<FormatClass> cls;    // at least one
  std::vector<uint8_t> layer_cls;  // class of each table; empty: all class 0
  uint64_t arena_bytes = 0;        // all classes' blocks
  bool mixed() const { return cls.size() > 1; }
  uint32_t class_of_layer(uint32_t layer) const {
    return layer_cls.empty() ? 0u : layer_cls[layer];
  }
  const FormatClass &of_layer(uint32_t layer) const { return cls[class_of_layer(layer)]; }
  const PartLayout &part(uint32_t layer, int kv) const { return of_layer(layer).part[kv]; }
  uint64_t stride(uint32_t layer) const { return of_layer(layer).stride; }
  uint32_t class_of_block(int32_t b) const {
    uint32_t c = 0;
    while (c + 1 < cls.size() && static_cast<uint32_t>(b) >= cls[c + 1].first) ++c;
    return c;
  }
  // Where block b starts in the arena and its bytes.
  uint64_t block_offset(int32_t b) const {
    if (cls.size() == 1) return static_cast<uint64_t>(b) * cls[0].stride;
    const FormatClass &k = cls[class_of_block(b)];
    return k.base + static_cast<uint64_t>(b - static_cast<int32_t>(k.first)) * k.stride;
  }
  uint64_t block_stride(int32_t b) const {
    return cls.size() == 1 ? cls[0].stride : cls[class_of_block(b)].stride;
  }
  // One block of every table (a prefix entry's blocks, a tier payload's).
  uint64_t layer_bytes() const {
    uint64_t b = 0;
    for (const FormatClass &k : cls) b += k.stride * k.layers;
    return b;
  }
  uint64_t max_stride() const {
    uint64_t m = 0;
    for (const FormatClass &k : cls) m = std::max(m, k.stride);
    return m;
  }
  // Per-layer per-tensor scales (bits of a float; 0: not calibrated yet),
  // for quantized parts; null otherwise.
  std::unique_ptr<std::atomic<uint32_t>[]> scale[2];
  std::unique_ptr<RopeTable> pre_rope;  // KVC_POOL_PRE_ROPE_KEYS only
  // Per-channel key smoothing (kvc_pool_set_key_smoothing; null: none).
  // Written under the exclusive pool lock and smooth_mu; read under the pool
  // lock, or with smooth_snapshot() (an append's prepare, before the lock).
  std::shared_ptr<const KeySmoothing> smooth;
  std::shared_ptr<const KeySmoothing> smooth_snapshot() const {
    std::lock_guard<std::mutex> g(smooth_mu);
    return smooth;
  }
  mutable std::mutex smooth_mu;
  // Codebooks of K and V (kvc_pool_set_codebook; null: uniform codes).
  // Written under the exclusive pool lock on an empty pool; read under it.
  std::shared_ptr<const Codebook> codebook[2];
  // Smoothing of `n` key rows of a layer, in place: (k - offset) / scale,
  // clamped so a later Hadamard rotation stays finite; and its inverse (the
  // pool's smoothing, or `s`).
  void smooth_keys(uint32_t layer, float *x, uint64_t n) const {
    smooth_keys(*smooth, layer, x, n);
  }
  void smooth_keys(const KeySmoothing &s, uint32_t layer, float *x, uint64_t n) const;
  void unsmooth_keys(uint32_t layer, float *x, uint64_t n) const;

  // Whether part kv is quantized (the same in every class) and whether any
  // class stores it with a per-tensor scale.
  bool quantized(int kv) const { return cls[0].part[kv].quantized; }
  bool per_tensor(int kv) const {
    for (const FormatClass &k : cls)
      if (k.part[kv].quantized && k.part[kv].spec.gran == codec::Gran::Tensor) return true;
    return false;
  }
  bool per_tensor(int kv, uint32_t layer) const {
    const PartLayout &pl = part(layer, kv);
    return pl.quantized && pl.spec.gran == codec::Gran::Tensor;
  }
  // The Hadamard rotation block of part kv (the same in every class).
  uint32_t rotation_block(int kv) const { return cls[0].part[kv].rotation_block; }
  // Parts with per-tensor scales (0, 1 or 2).
  uint32_t scale_parts() const { return (scale[0] ? 1u : 0u) + (scale[1] ? 1u : 0u); }
  // Whether the bits of a per-tensor scale from outside (a record, a tier
  // payload) are one a pool can hold: 0 (not calibrated) or a finite normal
  // float (negative for a full-range codec whose extreme is positive).
  static bool valid_scale_bits(uint32_t bits);
  // The per-tensor scale of a layer (dynamic: calibrated by the first write).
  float tensor_scale(int kv, uint32_t layer) const;
  // The per-tensor scales of a layer for the CUDA kernels (0 for other parts).
  void tensor_scales(uint32_t layer, float out[2]) const;
  // Dynamic per-tensor scale: fixed by the first write to the layer (as vLLM
  // computes k_scale / v_scale on the first forward pass).
  void calibrate(int kv, uint32_t layer, const float *x, uint64_t n);
  void calibrate_absmax(int kv, uint32_t layer, float absmax);

  // Writes `count` tokens into slots [slot, slot + count) of part kv of block
  // `blk`. Plain storage converts from `src`; quantized storage encodes the
  // f32 rows `src_f32` (already converted, checked finite and rotated), or,
  // where src_f32 is null, quantizes (and Hadamard-rotates) `src` itself
  // (f16 rows checked finite, a part with per-token or per-group scales that
  // nothing else transforms: CpuStore::prepare's choice; keys: the groups'
  // keys of these rows it computed as that check, or null).
  void write_part(int kv, uint32_t layer, uint8_t *blk, const uint8_t *src, DType src_type,
                  const float *src_f32, uint32_t slot, uint64_t count,
                  const codec::F16Keys *keys = nullptr) const;
  // Reads `count` tokens from slots [slot, ...) of part kv into `out` rows of
  // dst; `l` and `idx0` (the layer's index of the first) give the RoPE
  // positions that pre-RoPE keys are rotated back to.
  void read_part(int kv, uint32_t layer, const uint8_t *blk, uint32_t slot, uint64_t count,
                 uint8_t *out, DType dst, const LayerTable &l, uint64_t idx0) const;
  // Byte ranges (offset in a block of class c, length) that hold token slots
  // [slot, slot + count): codes, per-token scales and zero points of K and V.
  template <typename F>
  void for_slot_bytes(uint32_t c, uint32_t slot, uint64_t count, F &&f) const;
  // Zeroes slots [slot, slot + count) of a copy of a block of class c in host memory.
  void zero_slots(uint32_t c, uint8_t *blk, uint32_t slot, uint64_t count) const;
  // Moves a run of tokens of both parts from slot ss of block src to slot ds
  // of block dst, both of class c (codes, scales and zero points as bytes:
  // bit-exact; the ranges may overlap inside one block).
  void move_run(uint32_t c, uint8_t *dst, uint64_t ds, const uint8_t *src, uint64_t ss,
                uint64_t run) const;

 private:
  PoolConfig cfg_;
};

// Bytes of a part stored by codec sp (a float spec: plain sp.dtype) in one
// block; UINT64_MAX on overflow.
uint64_t part_bytes(const PoolConfig &c, const codec::Spec &sp);

template <typename F>
void BlockFormat::for_slot_bytes(uint32_t c, uint32_t slot, uint64_t count, F &&f) const {
  for (int kv = 0; kv < 2; ++kv) {
    const PartLayout &pl = cls[c].part[kv];
    if (!pl.quantized && cfg_.layout == Layout::HND) {
      for (uint64_t hh = 0; hh < cfg_.num_kv_heads; ++hh)
        f(pl.offset + hh * pl.head_stride + slot * pl.token_stride, count * pl.token_stride);
    } else {
      f(pl.offset + slot * pl.token_stride, count * pl.token_stride);
    }
    if (pl.quantized && pl.scales_per_token) {
      const uint64_t sb = pl.scales_per_token * pl.scale_bytes;
      f(pl.scale_offset + slot * sb, count * sb);
      if (pl.spec.asym) f(pl.zero_offset + slot * sb, count * sb);
      if (pl.outlier_bytes)
        f(pl.outlier_offset + slot * pl.outlier_bytes, count * pl.outlier_bytes);
    }
  }
}

}  // namespace kvc::core
