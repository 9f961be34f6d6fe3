// The block format (core/format.h): part layouts, per-tensor scales, and
// writing / reading tokens through the codecs.
#include "core/format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/convert.h"
#include "common/error.h"
#include "core/pool_int.h"

namespace kvc::core {

namespace {
uint64_t align16(uint64_t x) {
  return (x + 15) & ~uint64_t(15);
}
bool mul_overflows(uint64_t a, uint64_t b, uint64_t *out) {
  return __builtin_mul_overflow(a, b, out);
}
}  // namespace

uint64_t part_bytes(const PoolConfig &c, const codec::Spec &sp) {
  const uint64_t h = c.num_kv_heads, d = c.head_dim, bs = c.block_size;
  uint64_t row = 0, codes = 0;
  if (mul_overflows(h, d, &row)) return UINT64_MAX;
  if (is_float(sp.dtype)) {
    const uint64_t e = dtype_bytes(sp.dtype);
    if (mul_overflows(row, e, &row) || mul_overflows(row, bs, &codes)) return UINT64_MAX;
    return codes;
  }
  if (mul_overflows(codec::row_bytes(sp.dtype, d), h, &row) || mul_overflows(row, bs, &codes))
    return UINT64_MAX;
  const uint64_t sc = scales_per_block(sp, h, d, bs) * codec::scale_bytes(sp) * (sp.asym ? 2 : 1);
  const uint64_t outl = bs * scales_per_token(sp, h, d) * sp.outliers * 2;
  return codes + sc + outl;
}

uint64_t scales_per_block(const codec::Spec &sp, uint64_t num_kv_heads, uint64_t head_dim,
                          uint64_t block_size) {
  if (sp.gran == codec::Gran::Channel) return block_size / sp.group * num_kv_heads * head_dim;
  return block_size * scales_per_token(sp, num_kv_heads, head_dim);
}

uint64_t scales_per_token(const codec::Spec &sp, uint64_t num_kv_heads, uint64_t head_dim) {
  switch (sp.gran) {
    case codec::Gran::Token:
      return num_kv_heads;  // one per (token, KV head)
    case codec::Gran::Group:
      return (num_kv_heads * head_dim + sp.group - 1) / sp.group;
    default:
      return 0;
  }
}

bool same_spec(const codec::Spec &a, const codec::Spec &b) {
  // group_size means something only to per-group and per-channel scales
  const bool grouped = a.gran == codec::Gran::Group || a.gran == codec::Gran::Channel;
  return a.dtype == b.dtype && a.gran == b.gran && (!grouped || a.group == b.group) &&
         a.asym == b.asym && a.scale_dtype == b.scale_dtype &&
         a.rotation_block == b.rotation_block && a.static_scale == b.static_scale &&
         a.full_range == b.full_range && a.outliers == b.outliers;
}

namespace {

// Lays out one part stored by codec sp from byte `off` of a block.
PartLayout lay_part(const PoolConfig &c, const codec::Spec &spec, uint64_t off) {
  const uint64_t hd = c.head_dim, h = c.num_kv_heads, bs = c.block_size;
  PartLayout pl;
  pl.spec = spec;
  pl.quantized = !is_float(pl.spec.dtype);
  pl.offset = off;
  if (!pl.quantized) {
    const uint64_t e = dtype_bytes(pl.spec.dtype);
    pl.codes_bytes = bs * h * hd * e;
    pl.token_stride = c.layout == Layout::NHD ? h * hd * e : hd * e;
    pl.head_stride = c.layout == Layout::NHD ? hd * e : bs * hd * e;
  } else {
    const uint64_t rb = codec::row_bytes(pl.spec.dtype, hd);
    pl.codes_bytes = bs * h * rb;
    pl.token_stride = h * rb;
    pl.head_stride = rb;
    pl.scales_per_token = scales_per_token(pl.spec, h, hd);
    pl.scale_bytes = codec::scale_bytes(pl.spec);
    pl.scale_offset = off + pl.codes_bytes;
    pl.scales_per_block = scales_per_block(pl.spec, h, hd, bs);
    pl.zero_offset = pl.scale_offset + pl.scales_per_block * pl.scale_bytes;
    // Outlier pairs (symmetric codes only: no zero points before them).
    pl.outlier_offset = pl.zero_offset;
    pl.outlier_bytes = pl.scales_per_token * pl.spec.outliers * 2;
    pl.rotation_block = pl.spec.rotation_block;
  }
  pl.bytes = part_bytes(c, spec);
  return pl;
}
}  // namespace

void format_classes(const PoolConfig &c, std::vector<FormatClass> *cls,
                    std::vector<uint8_t> *layer_cls) {
  cls->clear();
  layer_cls->clear();
  const uint32_t nl = c.mixed() ? c.num_layers : 1;
  std::vector<uint8_t> of(nl);
  for (uint32_t l = 0; l < nl; ++l) {
    const codec::Spec &k = c.codec_of(l, 0), &v = c.codec_of(l, 1);
    size_t i = 0;
    while (i < cls->size() &&
           !(same_spec((*cls)[i].part[0].spec, k) && same_spec((*cls)[i].part[1].spec, v)))
      ++i;
    if (i == cls->size()) {
      if (i == kMaxFormats)
        fail(Errc::InvalidArgument, "per-layer codecs: more than " + std::to_string(kMaxFormats) +
                                        " distinct (K, V) codec pairs");
      FormatClass fc;
      uint64_t off = 0;
      for (int kv = 0; kv < 2; ++kv) {
        fc.part[kv] = lay_part(c, kv == 0 ? k : v, off);
        if (fc.part[kv].bytes == UINT64_MAX || fc.part[kv].bytes > (uint64_t(1) << 60))
          fail(Errc::Overflow, "block size in bytes overflows 64 bits");
        off = align16(off + fc.part[kv].bytes);
      }
      fc.stride = off;
      cls->push_back(fc);
    }
    of[l] = static_cast<uint8_t>(i);
    ++(*cls)[i].layers;
  }
  if (!c.mixed()) (*cls)[0].layers = c.num_layers;
  if (cls->size() > 1) *layer_cls = std::move(of);
  if (c.num_blocks) split_blocks(c.num_blocks, c.num_layers, *cls);
}

void split_blocks(uint64_t num_blocks, uint32_t num_tables, std::vector<FormatClass> &cls) {
  // Each format its share floor(num_blocks x layers / tables), then the
  // blocks left one each to the largest remainders (ties: the earlier
  // format): the shares sum to num_blocks exactly, so a configuration read
  // back (kvc_pool_get_config) splits the same way.
  const uint64_t tables = std::max(1u, num_tables);
  uint64_t given = 0;
  std::vector<uint64_t> n(cls.size()), rem(cls.size());
  for (size_t i = 0; i < cls.size(); ++i) {
    const unsigned __int128 x = static_cast<unsigned __int128>(num_blocks) * cls[i].layers;
    n[i] = static_cast<uint64_t>(x / tables);
    rem[i] = static_cast<uint64_t>(x % tables);
    given += n[i];
  }
  for (uint64_t left = num_blocks - std::min(num_blocks, given); left > 0; --left) {
    size_t best = 0;
    for (size_t i = 1; i < cls.size(); ++i)
      if (rem[i] > rem[best]) best = i;
    ++n[best];
    rem[best] = 0;
  }
  uint64_t first = 0, base = 0;
  for (size_t i = 0; i < cls.size(); ++i) {
    FormatClass &k = cls[i];
    k.first = static_cast<uint32_t>(first);
    k.blocks = static_cast<uint32_t>(n[i]);
    k.base = base;
    first += n[i];
    base += n[i] * k.stride;
  }
}

BlockFormat::BlockFormat(const PoolConfig &cfg) : cfg_(cfg) {
  format_classes(cfg_, &cls, &layer_cls);
  for (const FormatClass &k : cls) arena_bytes += k.stride * k.blocks;
  for (int kv = 0; kv < 2; ++kv) {
    if (!quantized(kv)) continue;
    scale[kv].reset(new std::atomic<uint32_t>[cfg_.num_layers]);
    for (uint32_t l = 0; l < cfg_.num_layers; ++l) {
      // A static scale as stored in scale_dtype (as kvc_quantize() rounds it),
      // so pool and standalone quantizer agree.
      const codec::Spec &sp = part(l, kv).spec;
      float fixed_scale = static_cast<float>(sp.static_scale);
      if (sp.scale_dtype == DType::F16)
        fixed_scale = f16_to_f32_scalar(f32_to_f16_scalar(fixed_scale));
      scale[kv][l].store(sp.static_scale > 0.0 ? f32_bits(fixed_scale) : 0u);
    }
  }
  if (cfg_.flags & kFlagPreRopeKeys)
    pre_rope =
        std::make_unique<RopeTable>(cfg_.head_dim, cfg_.rope_dims ? cfg_.rope_dims : cfg_.head_dim,
                                    cfg_.rope_style == RopeStyle::Interleaved, cfg_.rope_theta);
}

float BlockFormat::tensor_scale(int kv, uint32_t layer) const {
  return bits_f32(scale[kv][layer].load(std::memory_order_acquire));
}

bool BlockFormat::valid_scale_bits(uint32_t bits) {
  if (bits == 0) return true;
  const float v = bits_f32(bits);
  return std::isfinite(v) && std::fabs(v) >= std::numeric_limits<float>::min();
}

void BlockFormat::tensor_scales(uint32_t layer, float out[2]) const {
  for (int kv = 0; kv < 2; ++kv) out[kv] = quantized(kv) ? tensor_scale(kv, layer) : 0.0f;
}

// Dynamic per-tensor scale: fixed by the first write to the layer (as vLLM
// computes k_scale / v_scale on the first forward pass); later values beyond
// its range saturate. A full-range codec takes the full-range rule's signed
// scale (-m / 2^(bits-1), negative when the extreme m is positive), as
// kvc_quantize() computes it for a per-tensor array.
void BlockFormat::calibrate(int kv, uint32_t layer, const float *x, uint64_t n) {
  if (scale[kv][layer].load(std::memory_order_acquire) != 0) return;
  const codec::Spec &sp = part(layer, kv).spec;
  if (sp.full_range) {
    float lo = 0.0f, hi = 0.0f;
    for (uint64_t i = 0; i < n; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    const float scale = codec::dynamic_scale(sp, lo, hi);
    if (scale == 0.0f) return;  // all zeros: stay uncalibrated
    uint32_t expected = 0;
    this->scale[kv][layer].compare_exchange_strong(expected, f32_bits(scale),
                                                   std::memory_order_acq_rel);
    return;
  }
  float absmax = 0.0f;
  for (uint64_t i = 0; i < n; ++i) absmax = std::max(absmax, std::fabs(x[i]));
  calibrate_absmax(kv, layer, absmax);
}

void BlockFormat::calibrate_absmax(int kv, uint32_t layer, float absmax) {
  const codec::Spec &sp = part(layer, kv).spec;
  const float qmax = sym_max(sp.dtype);
  if (!(absmax > 0.0f))
    return;  // all zeros: stay uncalibrated (zeros encode exactly without a scale)
  const float scale = codec::round_scale_up(
      std::max(absmax / qmax, std::numeric_limits<float>::min()), sp.scale_dtype);
  uint32_t expected = 0;
  this->scale[kv][layer].compare_exchange_strong(expected, f32_bits(scale),
                                                 std::memory_order_acq_rel);
}

// Writes `count` tokens into slots [slot, slot + count) of part kv of block
// `blk`. Plain storage converts from `src`; quantized storage encodes the
// f32 rows `src_f32` (already converted, checked finite and rotated), or
// quantizes `src` itself where src_f32 is null (format.h).
void BlockFormat::write_part(int kv, uint32_t layer, uint8_t *blk, const uint8_t *src,
                             DType src_type, const float *src_f32, uint32_t slot, uint64_t count,
                             const codec::F16Keys *keys) const {
  const PartLayout &pl = part(layer, kv);
  const uint64_t hd = cfg_.head_dim, h = cfg_.num_kv_heads;
  uint8_t *base = blk + pl.offset;
  if (!pl.quantized) {
    const DType dst = static_cast<DType>(pl.spec.dtype);
    const uint64_t src_row = h * hd * dtype_bytes(src_type);
    if (cfg_.layout == Layout::NHD) {
      convert(src, src_type, base + slot * pl.token_stride, dst, count * h * hd);
      return;
    }
    for (uint64_t t = 0; t < count; ++t)
      for (uint64_t hh = 0; hh < h; ++hh)
        convert(src + t * src_row + hh * hd * dtype_bytes(src_type), src_type,
                base + hh * pl.head_stride + (slot + t) * pl.token_stride, dst, hd);
    return;
  }
  codec::Spec sp = pl.spec;
  const uint64_t row = h * hd;
  const bool token = sp.gran == codec::Gran::Token;
  // Per-token or per-group scales, no codebook or outliers: the count tokens'
  // codes (and scales, zeros) lie back to back when a token's codes fill its
  // slot, so one codec call encodes them all.
  const bool plain_codes = (token || sp.gran == codec::Gran::Group) && !sp.outliers &&
                           !(codebook[kv] && codebook[kv]->has(layer));
  const uint64_t rows = token ? count * h : count, d = token ? hd : row;
  const bool contiguous =
      plain_codes && pl.token_stride == (token ? h : 1) * codec::row_bytes(sp.dtype, d);
  uint8_t *codes0 = base + slot * pl.token_stride;
  uint8_t *scales0 = blk + pl.scale_offset + slot * pl.scales_per_token * pl.scale_bytes;
  uint8_t *zeros0 = blk + pl.zero_offset + slot * pl.scales_per_token * pl.scale_bytes;
  if (!src_f32) {
    // f16 rows straight from the input (CpuStore::prepare checked them and
    // chose this for parts that nothing transforms but a rotation):
    // codec::quantize, the codes encode() gives their f32 values rotated
    // by hadamard() (each row of d values in blocks of the part's rotation
    // block, which lie within a head)
    const uint64_t src_row = row * dtype_bytes(src_type);
    sp.rotation_block = pl.rotation_block;
    if (contiguous) {
      codec::quantize(sp, src, src_type, rows, d, codes0, scales0, zeros0, keys);
      return;
    }
    const uint64_t kpt = row / (sp.gran == codec::Gran::Group ? sp.group : d);  // keys per token
    for (uint64_t t = 0; t < count; ++t) {
      codec::F16Keys kt;
      if (keys) kt = {keys->lo ? keys->lo + t * kpt : nullptr, keys->hi + t * kpt};
      codec::quantize(sp, src + t * src_row, src_type, token ? h : 1, d,
                      codes0 + t * pl.token_stride,
                      scales0 + t * pl.scales_per_token * pl.scale_bytes,
                      zeros0 + t * pl.scales_per_token * pl.scale_bytes, keys ? &kt : nullptr);
    }
    return;
  }
  if (contiguous) {  // (converted, checked and rotated: CpuStore::prepare)
    codec::encode(sp, src_f32, rows, d, codes0, scales0, zeros0);
    return;
  }
  if (sp.gran == codec::Gran::Channel) {  // whole groups of G tokens (aging only)
    for (uint64_t t = 0; t < count; t += sp.group) {
      const uint64_t g = (slot + t) / sp.group;
      codec::encode(sp, src_f32 + t * row, sp.group, row, base + (slot + t) * pl.token_stride,
                    blk + pl.scale_offset + g * row * pl.scale_bytes,
                    blk + pl.zero_offset + g * row * pl.scale_bytes);
    }
    return;
  }
  for (uint64_t t = 0; t < count; ++t) {
    const float *tmp = src_f32 + t * row;  // converted, checked and rotated (CpuStore::prepare)
    uint8_t *codes = base + (slot + t) * pl.token_stride;
    uint8_t *scales = blk + pl.scale_offset + (slot + t) * pl.scales_per_token * pl.scale_bytes;
    uint8_t *zeros = blk + pl.zero_offset + (slot + t) * pl.scales_per_token * pl.scale_bytes;
    uint8_t *outl = blk + pl.outlier_offset + (slot + t) * pl.outlier_bytes;
    switch (sp.gran) {
      case codec::Gran::Token:
        if (codebook[kv] && codebook[kv]->has(layer))
          codec::encode_codebook(sp, codebook[kv]->layer(layer), tmp, h, hd, codes, scales);
        else if (sp.outliers)
          codec::encode_outliers(sp, tmp, h, hd, codes, scales, outl);
        else
          codec::encode(sp, tmp, h, hd, codes, scales, zeros);
        break;
      case codec::Gran::Group:
        if (codebook[kv] && codebook[kv]->has(layer))
          codec::encode_codebook(sp, codebook[kv]->layer(layer), tmp, 1, row, codes, scales);
        else if (sp.outliers)
          codec::encode_outliers(sp, tmp, 1, row, codes, scales, outl);
        else
          codec::encode(sp, tmp, 1, row, codes, scales, zeros);
        break;
      default: {                                    // per tensor: the layer's scale
        sp.static_scale = tensor_scale(kv, layer);  // 0 only while every value written was 0
        sp.scale_dtype = DType::F32;                // per-tensor scales are kept as f32
        codec::encode(sp, tmp, 1, row, codes, nullptr, nullptr);
      }
    }
  }
}

// Reads `count` tokens from slots [slot, ...) of part kv into `out` rows of dst.
void BlockFormat::read_part(int kv, uint32_t layer, const uint8_t *blk, uint32_t slot,
                            uint64_t count, uint8_t *out, DType dst, const LayerTable &l,
                            uint64_t idx0) const {
  const PartLayout &pl = part(layer, kv);
  const uint64_t hd = cfg_.head_dim, h = cfg_.num_kv_heads, row = h * hd;
  const uint8_t *base = blk + pl.offset;
  if (!pl.quantized) {
    const DType st = static_cast<DType>(pl.spec.dtype);
    if (cfg_.layout == Layout::NHD) {
      convert(base + slot * pl.token_stride, st, out, dst, count * row);
      return;
    }
    for (uint64_t t = 0; t < count; ++t)
      for (uint64_t hh = 0; hh < h; ++hh)
        convert(base + hh * pl.head_stride + (slot + t) * pl.token_stride, st,
                out + (t * row + hh * hd) * dtype_bytes(dst), dst, hd);
    return;
  }
  codec::Spec sp = pl.spec;
  // f32 output: decode straight into it (no staging copy).
  const bool direct = dst == DType::F32 && reinterpret_cast<uintptr_t>(out) % alignof(float) == 0;
  float *tmp = direct ? reinterpret_cast<float *>(out) : scratch_f32(row * count);
  const uint8_t *codes = base + slot * pl.token_stride;  // `count` tokens, contiguous
  switch (sp.gran) {
    case codec::Gran::Token: {  // scales [slot][kv_heads], contiguous too
      const uint64_t sidx = slot * pl.scales_per_token;
      sp.rotation_block = 0;  // the rotation is undone below, per head
      if (codebook[kv] && codebook[kv]->has(layer)) {
        codec::decode_codebook(sp, codebook[kv]->layer(layer), codes,
                               blk + pl.scale_offset + sidx * pl.scale_bytes, count * h, hd, tmp);
        break;
      }
      codec::dequantize(sp, codes, blk + pl.scale_offset + sidx * pl.scale_bytes,
                        blk + pl.zero_offset + sidx * pl.scale_bytes, count * h, hd, tmp,
                        DType::F32);
      if (sp.outliers)
        codec::apply_outliers(sp, blk + pl.scale_offset + sidx * pl.scale_bytes,
                              blk + pl.outlier_offset + slot * pl.outlier_bytes, count * h, hd,
                              tmp);
      break;
    }
    case codec::Gran::Group: {
      const uint64_t sidx = slot * pl.scales_per_token;
      sp.rotation_block = 0;
      if (codebook[kv] && codebook[kv]->has(layer)) {
        codec::decode_codebook(sp, codebook[kv]->layer(layer), codes,
                               blk + pl.scale_offset + sidx * pl.scale_bytes, count, row, tmp);
        break;
      }
      codec::dequantize(sp, codes, blk + pl.scale_offset + sidx * pl.scale_bytes,
                        blk + pl.zero_offset + sidx * pl.scale_bytes, count, row, tmp, DType::F32);
      if (sp.outliers)
        codec::apply_outliers(sp, blk + pl.scale_offset + sidx * pl.scale_bytes,
                              blk + pl.outlier_offset + slot * pl.outlier_bytes, count, row, tmp);
      break;
    }
    case codec::Gran::Channel:
      // One call per run of tokens that share a group's scales.
      for (uint64_t t = 0; t < count;) {
        const uint64_t sidx = (slot + t) / sp.group * row;
        const uint64_t run = std::min<uint64_t>(count - t, sp.group - (slot + t) % sp.group);
        codec::decode(sp, codes + t * pl.token_stride,
                      blk + pl.scale_offset + sidx * pl.scale_bytes,
                      blk + pl.zero_offset + sidx * pl.scale_bytes, run, row, tmp + t * row);
        t += run;
      }
      break;
    default: {
      uint8_t one[4];
      sp.scale_dtype = DType::F32;
      codec::store_scale(one, DType::F32, tensor_scale(kv, layer));
      codec::decode(sp, codes, one, nullptr, count, row, tmp);
    }
  }
  if (pl.rotation_block)
    for (uint64_t t = 0; t < count; ++t) codec::hadamard(tmp + t * row, row, pl.rotation_block);
  if (kv == 0 && smooth) unsmooth_keys(layer, tmp, count);
  if (kv == 0 && pre_rope) {
    for (uint64_t t = 0; t < count; ++t)
      pre_rope->rotate(tmp + t * row, cfg_.num_kv_heads,
                       static_cast<uint64_t>(l.rope_position_of(idx0 + t)), 1);
    // Un-smoothed keys may reach FLT_MAX, which RoPE can turn into Inf: saturate.
    if (smooth)
      for (uint64_t i = 0; i < count * row; ++i)
        tmp[i] = std::clamp(tmp[i], -std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::max());
  }
  if (!direct) convert(tmp, DType::F32, out, dst, count * row);
}

void BlockFormat::zero_slots(uint32_t c, uint8_t *blk, uint32_t slot, uint64_t count) const {
  if (!count) return;
  for_slot_bytes(c, slot, count,
                 [&](uint64_t off, uint64_t len) { std::memset(blk + off, 0, len); });
}

void BlockFormat::move_run(uint32_t c, uint8_t *dst, uint64_t ds, const uint8_t *src, uint64_t ss,
                           uint64_t run) const {
  const uint64_t h = cfg_.num_kv_heads, hd = cfg_.head_dim;
  for (int kv = 0; kv < 2; ++kv) {
    const PartLayout &pl = cls[c].part[kv];
    if (!pl.quantized && cfg_.layout == Layout::HND) {
      const uint64_t e = dtype_bytes(pl.spec.dtype);
      for (uint64_t hh = 0; hh < h; ++hh)
        std::memmove(dst + pl.offset + hh * pl.head_stride + ds * pl.token_stride,
                     src + pl.offset + hh * pl.head_stride + ss * pl.token_stride, run * hd * e);
    } else {
      std::memmove(dst + pl.offset + ds * pl.token_stride, src + pl.offset + ss * pl.token_stride,
                   run * pl.token_stride);
    }
    if (pl.quantized && pl.scales_per_token) {
      const uint64_t sb = pl.scales_per_token * pl.scale_bytes;
      std::memmove(dst + pl.scale_offset + ds * sb, src + pl.scale_offset + ss * sb, run * sb);
      if (pl.spec.asym)
        std::memmove(dst + pl.zero_offset + ds * sb, src + pl.zero_offset + ss * sb, run * sb);
      if (pl.outlier_bytes)
        std::memmove(dst + pl.outlier_offset + ds * pl.outlier_bytes,
                     src + pl.outlier_offset + ss * pl.outlier_bytes, run * pl.outlier_bytes);
    }
  }
}

}  // namespace kvc::core
