// src/codec's float operations on the device: fp8 decoding, scales and zero
// points, make_params, encoding and decoding of one element, the Hadamard
// rotation in shared memory, and the element reads of gather and attention.
// They repeat src/codec's operations one for one (explicit _rn intrinsics;
// every .cu is compiled with -fmad=false: no fused multiply-add), so a CUDA
// pool stores the same bytes as a CPU pool given the same rows.
#pragma once
#include <cuda_fp16.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "backend.h"
#include "common/fp8.h"
#include "dtype.cuh"

namespace kvc::cuda {

namespace {

// fp8 decode (exact in f32).
template <int kMant, int kBias>
__device__ inline float fp8_decode(uint32_t c) {
  const uint32_t sign = (c & 0x80u) << 24;
  const uint32_t e = (c >> kMant) & ((0x80u >> kMant) - 1u);
  const uint32_t m = c & ((1u << kMant) - 1u);
  if (kMant == 3 && (c & 0x7fu) == 0x7fu) return __uint_as_float(0x7fc00000u | sign);  // E4M3 NaN
  if (kMant == 2 && e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m ? 0x400000u : 0u));
  if (e == 0) {  // subnormal: m x 2^(1 - bias - mant), exact
    const float v = static_cast<float>(m) *
                    __uint_as_float(static_cast<uint32_t>(127 + 1 - kBias - kMant) << 23);
    return sign ? -v : v;
  }
  return __uint_as_float(sign | ((e - kBias + 127) << 23) | (m << (23 - kMant)));
}

// Scales and zero points: little-endian f32 or f16 at any byte address.
__device__ inline float load_scale(const uint8_t *p, int f16) {
  const uintptr_t al = reinterpret_cast<uintptr_t>(p);
  if (f16 && (al & 1u) == 0) return h2f(*reinterpret_cast<const uint16_t *>(p));
  if (!f16 && (al & 3u) == 0) return *reinterpret_cast<const float *>(p);
  if (f16) return h2f(static_cast<uint16_t>(p[0] | (p[1] << 8)));
  return __uint_as_float(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}
__device__ inline void store_scale(uint8_t *p, int f16, float v) {
  if (f16) {
    // A 16-bit store where aligned. (Two byte stores of the converted value
    // lost its low byte on sm_90 with CUDA 13.0: seen on the H200.)
    const uint32_t h = __half_as_ushort(__float2half_rn(v));
    if ((reinterpret_cast<uintptr_t>(p) & 1u) == 0) {
      *reinterpret_cast<uint16_t *>(p) = static_cast<uint16_t>(h);
    } else {
      p[0] = static_cast<uint8_t>(h & 0xffu);
      p[1] = static_cast<uint8_t>(h >> 8);
    }
    return;
  }
  const uint32_t u = __float_as_uint(v);
  p[0] = static_cast<uint8_t>(u), p[1] = static_cast<uint8_t>(u >> 8);
  p[2] = static_cast<uint8_t>(u >> 16), p[3] = static_cast<uint8_t>(u >> 24);
}
__device__ inline float round_scale_up(float v, int f16) {
  if (!f16) return v;
  if (v >= 65504.0f) return 65504.0f;
  uint16_t h = f2h(v);
  if (h2f(h) < v) ++h;
  return h2f(h);
}
__device__ inline float round_zero_down(float v, int f16) {
  if (!f16) return v;
  if (v <= -65504.0f) return -65504.0f;
  if (v >= 65504.0f) return 65504.0f;
  uint16_t h = f2h(v);
  if (h2f(h) > v) {
    if (h == 0x0000)
      h = 0x8001;
    else if (h & 0x8000)
      ++h;
    else
      --h;
  }
  return h2f(h);
}

struct Params {
  float scale = 0.0f, inv = 0.0f, zero = 0.0f;
};
__device__ inline int qmax_sym(int32_t d) {
  return d == I8 ? 127 : d == I4 ? 7 : 1;
}
__device__ inline int qmax_asym(int32_t d) {
  return d == I8 ? 255 : d == I4 ? 15 : 3;
}

// src/codec's make_params for dynamic scales (min and max of a group).
__device__ Params make_params(const PartDesc &d, float lo, float hi) {
  Params p;
  lo = __fadd_rn(lo, 0.0f);
  hi = __fadd_rn(hi, 0.0f);
  double raw;
  if (is_int(d.dtype) && d.asym) {
    lo = lo < -1e38f ? -1e38f : lo;
    hi = hi > 1e38f ? 1e38f : hi;
    p.zero = round_zero_down(lo, d.scale_f16);
    raw = __ddiv_rn(__dsub_rn(static_cast<double>(hi), static_cast<double>(p.zero)),
                    static_cast<double>(qmax_asym(d.dtype)));
  } else {
    const double cap = is_int(d.dtype) ? 1e38 : static_cast<double>(INFINITY);
    const double a = fabs(static_cast<double>(lo)), b = fabs(static_cast<double>(hi));
    const double m = a < b ? b : a;
    const double absmax = cap < m ? cap : m;
    const double q = d.dtype == E4M3   ? 448.0
                     : d.dtype == E5M2 ? 57344.0
                                       : static_cast<double>(qmax_sym(d.dtype));
    raw = __ddiv_rn(absmax, q);
  }
  if (raw > 0.0) {
    float f = __double2float_rn(raw);
    f = f < FLT_MIN ? FLT_MIN : f;
    const float up = static_cast<double>(f) < raw ? __uint_as_float(__float_as_uint(f) + 1) : f;
    p.scale = round_scale_up(up, d.scale_f16);
  }
  p.inv = p.scale > 0.0f ? __fdiv_rn(1.0f, p.scale) : 0.0f;
  return p;
}

// Per-tensor (static or calibrated) scale: zero point 0.
__device__ inline Params tensor_params(float ts) {
  Params p;
  p.scale = ts;
  p.inv = ts > 0.0f ? __fdiv_rn(1.0f, ts) : 0.0f;
  return p;
}

__device__ inline uint32_t encode_one(const PartDesc &d, float x, const Params &p) {
  if (d.dtype == E4M3) return fp8_e4m3_encode(__fmul_rn(x, p.inv));
  if (d.dtype == E5M2) return fp8_e5m2_encode(__fmul_rn(x, p.inv));
  const int bits = bits_of(d.dtype);
  float lo, hi;
  int32_t off = 0;
  if (d.asym) {
    lo = 0.0f, hi = static_cast<float>(qmax_asym(d.dtype));
  } else {
    hi = static_cast<float>(qmax_sym(d.dtype)), lo = -hi;
    off = bits == 4 ? 8 : bits == 2 ? 2 : 0;
  }
  float y = d.asym ? __fmul_rn(__fsub_rn(x, p.zero), p.inv) : __fmul_rn(x, p.inv);
  y = y < lo ? lo : y > hi ? hi : y;
  return static_cast<uint32_t>(static_cast<int32_t>(rintf(y)) + off) & ((1u << bits) - 1u);
}

__device__ inline float decode_one(const PartDesc &d, uint32_t c, float scale, float zero) {
  if (d.dtype == E4M3) return __fmul_rn(fp8_decode<3, 7>(c), scale);
  if (d.dtype == E5M2) return __fmul_rn(fp8_decode<2, 15>(c), scale);
  const int bits = bits_of(d.dtype);
  int32_t v = static_cast<int32_t>(c);
  if (bits == 8 && !d.asym)
    v = static_cast<int8_t>(c);
  else if (!d.asym)
    v -= bits == 4 ? 8 : 2;
  const float q = static_cast<float>(v);
  return d.asym ? __fadd_rn(__fmul_rn(q, scale), zero) : __fmul_rn(q, scale);
}

// Normalized Walsh-Hadamard transform of each block of `blk` values of
// x[0, n) in shared memory: src/codec's butterflies, stage by stage, then
// the normalization. Called by the whole thread block.
__device__ void hadamard_smem(float *x, uint32_t n, uint32_t blk) {
  if (blk <= 1) return;
  const uint32_t half = blk / 2, pairs = n / 2;
  for (uint32_t h = 1; h < blk; h *= 2) {
    for (uint32_t k = threadIdx.x; k < pairs; k += blockDim.x) {
      const uint32_t b = k / half, r = k % half;
      const uint32_t j = b * blk + (r / h) * 2 * h + (r % h);
      const float a = x[j], c = x[j + h];
      x[j] = __fadd_rn(a, c);
      x[j + h] = __fsub_rn(a, c);
    }
    __syncthreads();
  }
  const float norm = __fdiv_rn(1.0f, __fsqrt_rn(static_cast<float>(blk)));
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) x[i] = __fmul_rn(x[i], norm);
  __syncthreads();
}

// Where element e of a token's row sits in the codes: per-token scales keep
// each head's row of head_dim values byte-aligned (row_bytes each); the
// other granularities pack the whole [kv_heads * head_dim] row.
struct CodePos {
  uint64_t bit;
  uint32_t scale_idx;
};
__device__ inline CodePos code_pos(const PartDesc &d, uint32_t e, uint32_t hd) {
  const int bits = bits_of(d.dtype);
  if (d.gran == G_TOKEN) {
    const uint32_t head = e / hd;
    return {head * row_bytes(d.dtype, hd) * 8 + static_cast<uint64_t>(e % hd) * bits, head};
  }
  return {static_cast<uint64_t>(e) * bits, d.gran == G_GROUP ? e / d.group : 0u};
}

// Decodes element e of the token in slot s of block blk.
__device__ inline float read_elem(const Geometry &g, int kv, const uint8_t *blk, uint32_t s,
                                  uint32_t e, float ts) {
  const PartDesc &d = g.part[kv];
  if (!d.quantized) {
    const uint32_t head = e / g.head_dim, i = e % g.head_dim;
    return load_plain(
        blk + d.offset + head * d.head_stride + s * d.token_stride + i * plain_bytes(d.dtype),
        d.dtype);
  }
  const CodePos cp = code_pos(d, e, g.head_dim);
  const uint8_t *codes = blk + d.offset + s * d.token_stride;
  const int bits = bits_of(d.dtype);
  const uint32_t c = (codes[cp.bit >> 3] >> (cp.bit & 7)) & ((1u << bits) - 1u);
  float scale = ts, zero = 0.0f;
  if (d.gran != G_TENSOR) {
    const uint64_t idx = s * d.scales_per_token + cp.scale_idx;
    scale = load_scale(blk + d.scale_offset + idx * d.scale_bytes, d.scale_f16);
    if (d.asym) zero = load_scale(blk + d.zero_offset + idx * d.scale_bytes, d.scale_f16);
  }
  return decode_one(d, c, scale, zero);
}

}  // namespace

}  // namespace kvc::cuda
