// Residual staging and attention sinks (core/staging.h).
#include "core/staging.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>

#include "codec/codec.h"
#include "common/convert.h"
#include "common/error.h"
#include "core/pool_int.h"

namespace kvc::core {

namespace {

// Like convert(), but values beyond the destination's range become its
// largest finite value (f16: +-65504; bf16: +-3.3895e38, where f32 values
// near FLT_MAX would round to Inf) instead of +-Inf, as the codecs saturate:
// a finite input never turns into Inf (and then NaN) in the residual. NaN and
// Inf (which plain parts store as written) are kept.
void convert_saturating(const void *src, DType st, void *dst, DType dt, uint64_t n) {
  if (dt == DType::F32 || st == dt) return convert(src, st, dst, dt, n);
  const float big = dt == DType::F16 ? 65504.0f : 3.38953139e38f;  // 0x7f7f as bf16
  float buf[256];
  const uint64_t es = dtype_bytes(st);
  for (uint64_t i = 0; i < n; i += 256) {
    const uint64_t m = std::min<uint64_t>(256, n - i);
    convert(static_cast<const uint8_t *>(src) + i * es, st, buf, DType::F32, m);
    // Only finite values saturate: NaN and +-Inf (plain parts accept them)
    // stay what they are (std::max(-big, NaN) would give -big).
    for (uint64_t j = 0; j < m; ++j)
      if (std::isfinite(buf[j])) buf[j] = std::min(big, std::max(-big, buf[j]));
    convert(buf, DType::F32, static_cast<uint8_t *>(dst) + i * 2, dt, m);
  }
}

}  // namespace

StagingRules::StagingRules(const PoolConfig &c)
    : active(c.num_residual_blocks > 0),
      window(c.residual_window),
      fraction(c.residual_fraction),
      sinks(c.residual_sinks),
      block_size(c.block_size),
      num_layers(c.num_layers) {
  for (const codec::Spec *sp : {&c.k_codec, &c.v_codec})
    if (!is_float(sp->dtype) && sp->gran == codec::Gran::Channel) unit = std::max(unit, sp->group);
}

uint64_t StagingRules::sink_blocks_needed() const {
  if (!sinks) return 0;
  const uint64_t per = layers_per_sink_block();
  return (num_layers + per - 1) / per;
}

uint64_t Staging::row_bytes_of(const PoolConfig &cfg) {
  const uint64_t h = cfg.num_kv_heads, d = cfg.head_dim;
  return cfg.residual_dtype == DType::INT8 ? h * (d + 2) : h * d * dtype_bytes(cfg.residual_dtype);
}

uint64_t Staging::stride_of(const PoolConfig &cfg) {
  return uint64_t(cfg.block_size) * row_bytes_of(cfg) * 2;
}

Staging::Staging(PoolCore &core, const PoolConfig &cfg)
    : StagingRules(cfg),
      alloc(static_cast<uint32_t>(cfg.num_residual_blocks)),
      written(cfg.num_residual_blocks, cfg.block_size),
      c_(core),
      cfg_(cfg) {
  if (!cfg_.num_residual_blocks) return;
  stride = stride_of(cfg_);
  arena_bytes = cfg_.num_residual_blocks * stride;
  // Anonymous mapping: page-aligned and zero-filled; pages are touched lazily.
  void *r = mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (r == MAP_FAILED)
    fail(Errc::OutOfMemory, "cannot map " + u64s(arena_bytes) + " bytes of residual blocks");
  arena = static_cast<uint8_t *>(r);
}

Staging::~Staging() {
  if (arena) munmap(arena, arena_bytes);
}

int32_t Staging::take() {
  int32_t reclaimed;
  const int32_t b = alloc.allocate(&reclaimed);
  if (b < 0) fail(Errc::Internal, "residual allocator empty after an availability check");
  written.clear(b, 0, cfg_.block_size);  // a new owner has written nothing yet
  return b;
}

void Staging::release(int32_t b) {
  if (alloc.release(b, false) && (cfg_.flags & kFlagZeroOnFree)) std::memset(ptr(b), 0, stride);
}

int32_t Staging::cow(int32_t b) {
  const int32_t nb = take();
  std::memcpy(ptr(nb), ptr(b), stride);
  written.copy_block(nb, b);
  release(b);
  return nb;
}

// Int8 residual rows (residual_dtype INT8): the codec of kvc_quantize()'s
// int8 per-token rows with f16 scales (symmetric, scale = largest |x| / 127,
// round to nearest even), one scale per token and KV head.
namespace {
constexpr uint64_t kMaxHeadDim = 1024;  // config.cpp: head_dim in [1, 1024]
codec::Spec int8_rows() {
  codec::Spec s;
  s.dtype = DType::INT8;
  s.gran = codec::Gran::Token;
  s.scale_dtype = DType::F16;
  return s;
}
}  // namespace

void Staging::zero_slots(uint8_t *blk, uint32_t slot, uint64_t count) const {
  if (!count) return;
  const uint64_t bs = cfg_.block_size, part = bs * row_bytes_of(cfg_);
  if (cfg_.residual_dtype == DType::INT8) {
    const uint64_t h = cfg_.num_kv_heads, codes = h * cfg_.head_dim;
    for (uint64_t p = 0; p < 2; ++p) {
      std::memset(blk + p * part + slot * codes, 0, count * codes);
      std::memset(blk + p * part + bs * codes + slot * h * 2, 0, count * h * 2);
    }
    return;
  }
  const uint64_t row = row_bytes_of(cfg_);
  std::memset(blk + slot * row, 0, count * row);
  std::memset(blk + part + slot * row, 0, count * row);
}

// Residual blocks hold K then V, each [block_size][num_kv_heads][head_dim] of
// residual_dtype; int8 rows: each part [block_size][num_kv_heads][head_dim]
// codes, then [block_size][num_kv_heads] f16 scales.
void Staging::write(uint8_t *blk, uint32_t slot, const uint8_t *k, const uint8_t *v, DType src,
                    uint64_t count) const {
  const uint64_t row = static_cast<uint64_t>(cfg_.num_kv_heads) * cfg_.head_dim;
  const uint64_t part = cfg_.block_size * row_bytes_of(cfg_);
  if (cfg_.residual_dtype == DType::INT8) {
    // One head's row at a time through a stack buffer (head_dim <= 1024, as
    // config.cpp checks): the input was checked finite by the append;
    // nothing here allocates or throws.
    const codec::Spec spec = int8_rows();
    const uint64_t h = cfg_.num_kv_heads, d = cfg_.head_dim, es = dtype_bytes(src);
    const uint64_t codes = h * d, bs = cfg_.block_size;
    float buf[kMaxHeadDim];
    for (uint64_t p = 0; p < 2; ++p) {
      const uint8_t *in = p ? v : k;
      uint8_t *c = blk + p * part, *sc = blk + p * part + bs * codes;
      for (uint64_t t = 0; t < count; ++t)
        for (uint64_t j = 0; j < h; ++j) {
          const uint64_t r = t * h + j;
          convert(in + r * d * es, src, buf, DType::F32, d);
          codec::encode(spec, buf, 1, d, c + (slot * h + r) * d, sc + (slot * h + r) * 2, nullptr);
        }
    }
    return;
  }
  const uint64_t e = dtype_bytes(cfg_.residual_dtype);
  convert_saturating(k, src, blk + slot * row * e, cfg_.residual_dtype, count * row);
  convert_saturating(v, src, blk + part + slot * row * e, cfg_.residual_dtype, count * row);
}

void Staging::copy_row(const uint8_t *src, uint32_t src_slot, uint8_t *dst,
                       uint32_t dst_slot) const {
  const uint64_t bs = cfg_.block_size, part = bs * row_bytes_of(cfg_);
  if (cfg_.residual_dtype == DType::INT8) {
    const uint64_t h = cfg_.num_kv_heads, codes = h * cfg_.head_dim;
    for (uint64_t p = 0; p < 2; ++p) {
      std::memcpy(dst + p * part + dst_slot * codes, src + p * part + src_slot * codes, codes);
      std::memcpy(dst + p * part + bs * codes + dst_slot * h * 2,
                  src + p * part + bs * codes + src_slot * h * 2, h * 2);
    }
    return;
  }
  const uint64_t row = row_bytes_of(cfg_);
  for (uint64_t p = 0; p < 2; ++p)
    std::memcpy(dst + p * part + dst_slot * row, src + p * part + src_slot * row, row);
}

void Staging::read(const uint8_t *blk, uint32_t slot, uint64_t count, uint8_t *k_out,
                   uint8_t *v_out, DType dst) const {
  const uint64_t row = static_cast<uint64_t>(cfg_.num_kv_heads) * cfg_.head_dim;
  const uint64_t part = cfg_.block_size * row_bytes_of(cfg_);
  if (cfg_.residual_dtype == DType::INT8) {
    const codec::Spec spec = int8_rows();
    const uint64_t h = cfg_.num_kv_heads, d = cfg_.head_dim, es = dtype_bytes(dst);
    const uint64_t codes = h * d, bs = cfg_.block_size;
    float buf[kMaxHeadDim];
    for (uint64_t p = 0; p < 2; ++p) {
      uint8_t *out = p ? v_out : k_out;
      if (!out) continue;
      const uint8_t *c = blk + p * part, *sc = blk + p * part + bs * codes;
      for (uint64_t r = 0; r < count * h; ++r) {
        float *x = dst == DType::F32 ? reinterpret_cast<float *>(out) + r * d : buf;
        codec::decode(spec, c + (slot * h + r) * d, sc + (slot * h + r) * 2, nullptr, 1, d, x);
        if (dst != DType::F32) convert(buf, DType::F32, out + r * d * es, dst, d);
      }
    }
    return;
  }
  const uint64_t e = dtype_bytes(cfg_.residual_dtype);
  if (k_out) convert(blk + slot * row * e, cfg_.residual_dtype, k_out, dst, count * row);
  if (v_out) convert(blk + part + slot * row * e, cfg_.residual_dtype, v_out, dst, count * row);
}

void Staging::assign_sinks(Sequence &s) const {
  const uint64_t per = layers_per_sink_block();
  for (uint32_t li = 0; li < cfg_.num_layers; ++li)
    s.layers[li].sink_block = s.sink_blocks.empty() ? -1 : s.sink_blocks[li / per];
}

// Copies of tokens [idx0, idx0 + n) of a layer (rows of src from k and v),
// those below S.
void Staging::write_sinks(uint32_t layer, const LayerTable &l, uint64_t idx0, uint64_t n,
                          const uint8_t *k, const uint8_t *v, DType src) const {
  const uint64_t S = cfg_.residual_sinks;
  if (l.sink_block < 0 || idx0 >= S) return;
  write(ptr(l.sink_block), sink_slot(layer) + static_cast<uint32_t>(idx0), k, v, src,
        std::min(n, S - idx0));
}

// Rows of tokens [idx0, idx0 + n) read from codec blocks into k_out / v_out
// (either NULL) as dst: the encoded sinks among them are replaced by their
// copies.
void Staging::overlay_sinks(uint32_t layer, const LayerTable &l, uint64_t idx0, uint64_t n,
                            uint8_t *k_out, uint8_t *v_out, DType dst) const {
  const uint64_t S = cfg_.residual_sinks;
  if (l.sink_block < 0) return;
  const uint64_t end = std::min({idx0 + n, S, l.n_lp});
  if (idx0 >= end) return;
  read(ptr(l.sink_block), sink_slot(layer) + static_cast<uint32_t>(idx0), end - idx0, k_out, v_out,
       dst);
}

// Rows [0, result) of `n` rows at sequence indices idx0.. are attention
// sinks with exact copies, and some rows after them are not: the rows to
// leave out of the statistics of a scale that other tokens share. 0 when
// there are no such sinks, or only sinks.
uint64_t Staging::leading_sinks(const LayerTable &l, uint64_t idx0, uint64_t n) const {
  const uint64_t S = cfg_.residual_sinks;
  if (l.sink_block < 0 || idx0 >= S || idx0 + n <= S) return 0;
  return S - idx0;
}

// Scales shared by tokens (per channel, per tensor) leave the attention
// sinks out. Readers take the sinks from their exact copies, and their keys
// are often far outside the other tokens' range (the first token's key is an
// outlier in many heads: StreamingLLM arXiv 2309.17453, KVQuant arXiv
// 2401.18079 section 3.5, which keeps it in fp16 for this reason). So a
// per-channel group's range comes from its other rows: the sink rows are
// clamped into it and their codes hold the nearest value in range.
void Staging::clamp_sinks(const LayerTable &l, uint64_t idx0, uint32_t unit, float *x,
                          uint64_t row) const {
  const uint64_t first = leading_sinks(l, idx0, unit);
  if (!first) return;
  for (uint64_t c = 0; c < row; ++c) {
    float lo = x[first * row + c], hi = lo;
    for (uint64_t t = first + 1; t < unit; ++t) {
      lo = std::min(lo, x[t * row + c]);
      hi = std::max(hi, x[t * row + c]);
    }
    for (uint64_t t = 0; t < first; ++t) x[t * row + c] = std::clamp(x[t * row + c], lo, hi);
  }
}

// Encodes the `count` oldest residual tokens of a layer (a multiple of
// unit) into its codec blocks and frees the residual blocks they leave.
// The caller reserved the codec blocks it needs and made the last one
// private. Never throws.
void Staging::age(uint32_t layer, LayerTable &l, uint64_t count) {
  const BlockDiv bs = block_div(cfg_.block_size);
  const uint64_t row = static_cast<uint64_t>(cfg_.num_kv_heads) * cfg_.head_dim;
  const uint32_t unit = this->unit;
  float *buf = scratch_input(2 * unit * row);
  for (uint64_t done = 0; done < count; done += unit) {
    // Gather `unit` residual tokens (they may straddle two residual blocks).
    for (uint32_t t = 0; t < unit; ++t) {
      const uint64_t r = l.res_off + done + t;
      read(ptr(l.res_blocks[r / bs]), static_cast<uint32_t>(r % bs), 1,
           reinterpret_cast<uint8_t *>(buf + t * row),
           reinterpret_cast<uint8_t *>(buf + (unit + t) * row), DType::F32);
      // A staged token no append wrote enters its group as zeros (no stale
      // bytes in a shared scale) and stays unwritten.
      c_.zero_unwritten_rows(true, l.res_blocks[r / bs], static_cast<uint32_t>(r % bs), 1,
                             reinterpret_cast<uint8_t *>(buf + t * row),
                             reinterpret_cast<uint8_t *>(buf + (unit + t) * row),
                             row * sizeof(float));
    }
    // Attention sinks keep their residual rows: the stored bytes (int8 rows
    // re-encoded from their decoded values could take another scale where
    // the f16 scale is subnormal); an unwritten row as zeros.
    if (l.sink_block >= 0)
      for (uint32_t t = 0; t < unit && l.n_lp + done + t < sinks; ++t) {
        const uint64_t r = l.res_off + done + t;
        const uint32_t dst = sink_slot(layer) + static_cast<uint32_t>(l.n_lp + done + t);
        if (written.test(l.res_blocks[r / bs], static_cast<uint32_t>(r % bs)))
          copy_row(ptr(l.res_blocks[r / bs]), static_cast<uint32_t>(r % bs), ptr(l.sink_block),
                   dst);
        else
          zero_slots(ptr(l.sink_block), dst, 1);
      }
    if (c_.fmt_.pre_rope)  // keys before RoPE: undo it at each token's RoPE position
      for (uint32_t t = 0; t < unit; ++t)
        c_.fmt_.pre_rope->rotate(buf + t * row, cfg_.num_kv_heads,
                                 static_cast<uint64_t>(l.rope_position_of(l.n_lp + done + t)), -1);
    if (c_.fmt_.smooth) c_.fmt_.smooth_keys(layer, buf, unit);  // keys: per-channel smoothing
    for (int kv = 0; kv < 2; ++kv) {
      const PartLayout &pl = c_.fmt_.part(layer, kv);
      float *x = buf + kv * unit * row;
      if (pl.rotation_block)
        for (uint32_t t = 0; t < unit; ++t) codec::hadamard(x + t * row, row, pl.rotation_block);
      if (pl.quantized && pl.spec.gran == codec::Gran::Channel)
        clamp_sinks(l, l.n_lp + done, unit, x, row);
      if (pl.quantized && pl.spec.gran == codec::Gran::Tensor) {
        // sinks saturate: read from their copies
        const uint64_t skip = leading_sinks(l, l.n_lp + done, unit);
        c_.fmt_.calibrate(kv, layer, x + skip * row, (unit - skip) * row);
      }
    }
    const uint64_t idx = l.n_lp + done;
    if (l.blocks.size() <= idx / bs) l.blocks.push_back(c_.take_layer_block(layer));
    c_.store_->write_rows(layer, l.blocks[idx / bs], static_cast<uint32_t>(idx % bs), unit, buf,
                          buf + unit * row);
    for (uint32_t t = 0; t < unit; ++t) {
      const uint64_t r = l.res_off + done + t;
      c_.written_.put(l.blocks[idx / bs], static_cast<uint32_t>((idx + t) % bs),
                      written.test(l.res_blocks[r / bs], static_cast<uint32_t>(r % bs)));
    }
  }
  l.n_lp += count;
  const uint64_t off = l.res_off + count;
  size_t drop = std::min(static_cast<size_t>(off / bs), l.res_blocks.size());
  if (l.n_lp == l.n_tokens) drop = l.res_blocks.size();  // nothing left in the residual
  for (size_t i = 0; i < drop; ++i) release(l.res_blocks[i]);
  l.res_blocks.erase(l.res_blocks.begin(),
                     l.res_blocks.begin() + static_cast<std::ptrdiff_t>(drop));
  l.res_off = l.res_blocks.empty() ? 0 : static_cast<uint32_t>(off % bs);
}

// Tokens of a layer an append of indices [idx0, written_end) lets age now:
// none unless the append wrote the layer's newest reserved position; then
// the residual tokens beyond the window, in whole aging units, among those
// known written: every token before the layer's last reserve (as reserve()
// takes them), and the last reserve's own tokens only when this append
// covered them all (an append of its newest positions ahead of its older
// ones must not encode positions not written yet). 0 when none.
static uint64_t written_agable(const LayerTable &l, uint64_t target, uint64_t idx0,
                               uint64_t written_end, uint32_t unit) {
  const uint64_t hp = l.n_tokens - l.n_lp;
  uint64_t a = hp > target ? hp - target : 0;
  if (written_end != l.n_tokens) return 0;  // only an append of the layer's newest positions
  if (idx0 > l.reserved_at) a = std::min(a, l.reserved_at > l.n_lp ? l.reserved_at - l.n_lp : 0);
  return a - a % unit;
}

bool Staging::age_due(const Sequence &s, uint32_t layer, uint64_t idx0,
                      uint64_t written_end) const {
  if (!active) return false;
  return written_agable(s.layers[layer], hp_target(s.length), idx0, written_end, unit) > 0;
}

// After an append that wrote the layer's newest positions: the residual
// tokens that left the window in whole aging units are encoded now instead of
// at the next reserve, so a per-channel group (KIVI) leaves its f16 staging as
// soon as it is complete and kvc_pool_stats() reports the bytes the layer
// really needs at this length. Best effort: without the free blocks (or
// memory) it needs nothing changes, and the next reserve ages them. Caller
// holds the exclusive lock. Never throws.
void Staging::age_written(Sequence &s, uint32_t layer, uint64_t idx0, uint64_t written_end) {
  LayerTable &l = s.layers[layer];
  const BlockDiv bs = block_div(cfg_.block_size);
  const uint64_t a = written_agable(l, hp_target(s.length), idx0, written_end, unit);
  if (!a) return;
  const bool cow = l.n_lp % bs != 0 && c_.alloc_.refcount(l.blocks.back()) > 1;
  const uint64_t need = (l.n_lp + a + bs - 1) / bs - l.blocks.size() + (cow ? 1 : 0);
  if (need > c_.alloc_.available(c_.fmt_.class_of_layer(layer))) return;
  const size_t lp_target = static_cast<size_t>((l.n_lp + a + bs - 1) / bs);
  try {  // the block table's room and age()'s buffer, before any change
    if (l.blocks.capacity() < lp_target)
      l.blocks.reserve(std::max(lp_target, 2 * l.blocks.capacity()));
    scratch_input(2 * static_cast<uint64_t>(unit) * cfg_.num_kv_heads * cfg_.head_dim);
  } catch (const std::bad_alloc &) {
    return;  // the write stands; the next reserve ages these tokens
  }
  // From here on nothing throws.
  if (cow) l.blocks.back() = c_.cow_copy(l.blocks.back());
  age(layer, l, a);
  c_.note_usage();
}

}  // namespace kvc::core
