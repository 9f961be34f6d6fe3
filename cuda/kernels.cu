// CUDA kernels of the device pools (see backend.h). The codec arithmetic
// repeats src/codec's float operations one for one (explicit _rn intrinsics,
// no fused multiply-add), so a CUDA pool stores the same bytes as a CPU pool
// given the same rows.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "backend.h"
#include "common/dtype.h"
#include "common/fp8.h"
#include "common/error.h"

namespace kvc::cuda {


namespace {

// ---- dtypes: kvc::DType's values, as the descriptors carry them (int3 is
// CPU-only: core refuses it for a CUDA pool, and the kernels take the others)
constexpr int32_t F32 = static_cast<int32_t>(DType::F32);
constexpr int32_t F16 = static_cast<int32_t>(DType::F16);
constexpr int32_t BF16 = static_cast<int32_t>(DType::BF16);
constexpr int32_t E4M3 = static_cast<int32_t>(DType::FP8_E4M3);
constexpr int32_t E5M2 = static_cast<int32_t>(DType::FP8_E5M2);
constexpr int32_t I8 = static_cast<int32_t>(DType::INT8);
constexpr int32_t I4 = static_cast<int32_t>(DType::INT4);
constexpr int32_t I2 = static_cast<int32_t>(DType::INT2);
// Scale granularities: codec::Gran's values (src/codec/codec.h).
enum : int32_t { G_NONE = 0, G_TENSOR = 1, G_TOKEN = 2, G_GROUP = 3, G_CHANNEL = 4 };

__host__ __device__ constexpr int bits_of(int32_t d) {
  return d == F32 ? 32 : (d == F16 || d == BF16) ? 16 : (d == E4M3 || d == E5M2 || d == I8) ? 8 : d == I4 ? 4 : 2;
}
__host__ __device__ inline uint64_t row_bytes(int32_t d, uint64_t n) { return (n * bits_of(d) + 7) / 8; }
__device__ inline bool is_int(int32_t d) { return d == I8 || d == I4 || d == I2; }
// bits_of() agrees with common/dtype.h's table for every dtype the kernels take.
static_assert(bits_of(F32) == kvc::bits_of(DType::F32) && bits_of(F16) == kvc::bits_of(DType::F16) &&
                  bits_of(BF16) == kvc::bits_of(DType::BF16) && bits_of(E4M3) == kvc::bits_of(DType::FP8_E4M3) &&
                  bits_of(E5M2) == kvc::bits_of(DType::FP8_E5M2) && bits_of(I8) == kvc::bits_of(DType::INT8) &&
                  bits_of(I4) == kvc::bits_of(DType::INT4) && bits_of(I2) == kvc::bits_of(DType::INT2),
              "the kernels' bits_of() disagrees with common/dtype.h");

__device__ inline float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ inline uint16_t f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ inline float bf2f(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }
// Round to nearest even (src/core/convert.h's f32_to_bf16_scalar).
__device__ inline uint16_t f2bf(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// fp8 decode (exact in f32).
template <int kMant, int kBias>
__device__ inline float fp8_decode(uint32_t c) {
  const uint32_t sign = (c & 0x80u) << 24;
  const uint32_t e = (c >> kMant) & ((0x80u >> kMant) - 1u);
  const uint32_t m = c & ((1u << kMant) - 1u);
  if (kMant == 3 && (c & 0x7fu) == 0x7fu) return __uint_as_float(0x7fc00000u | sign);  // E4M3 NaN
  if (kMant == 2 && e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m ? 0x400000u : 0u));
  if (e == 0) {  // subnormal: m x 2^(1 - bias - mant), exact
    const float v = static_cast<float>(m) * __uint_as_float(static_cast<uint32_t>(127 + 1 - kBias - kMant) << 23);
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
    if (h == 0x0000) h = 0x8001;
    else if (h & 0x8000) ++h;
    else --h;
  }
  return h2f(h);
}

struct Params {
  float scale = 0.0f, inv = 0.0f, zero = 0.0f;
};
__device__ inline int qmax_sym(int32_t d) { return d == I8 ? 127 : d == I4 ? 7 : 1; }
__device__ inline int qmax_asym(int32_t d) { return d == I8 ? 255 : d == I4 ? 15 : 3; }

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
    raw = __ddiv_rn(__dsub_rn(static_cast<double>(hi), static_cast<double>(p.zero)), static_cast<double>(qmax_asym(d.dtype)));
  } else {
    const double cap = is_int(d.dtype) ? 1e38 : static_cast<double>(INFINITY);
    const double a = fabs(static_cast<double>(lo)), b = fabs(static_cast<double>(hi));
    const double m = a < b ? b : a;
    const double absmax = cap < m ? cap : m;
    const double q = d.dtype == E4M3 ? 448.0 : d.dtype == E5M2 ? 57344.0 : static_cast<double>(qmax_sym(d.dtype));
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
  if (bits == 8 && !d.asym) v = static_cast<int8_t>(c);
  else if (!d.asym) v -= bits == 4 ? 8 : 2;
  const float q = static_cast<float>(v);
  return d.asym ? __fadd_rn(__fmul_rn(q, scale), zero) : __fmul_rn(q, scale);
}

// Plain element read / write (f32, f16, bf16).
__device__ inline float load_plain(const uint8_t *p, int32_t dt) {
  if (dt == F32) return *reinterpret_cast<const float *>(p);
  const uint16_t h = *reinterpret_cast<const uint16_t *>(p);
  return dt == F16 ? h2f(h) : bf2f(h);
}
__device__ inline void store_plain(uint8_t *p, int32_t dt, float v) {
  if (dt == F32) *reinterpret_cast<float *>(p) = v;
  else *reinterpret_cast<uint16_t *>(p) = dt == F16 ? f2h(v) : f2bf(v);
}
__host__ __device__ inline uint32_t plain_bytes(int32_t dt) { return dt == F32 ? 4 : 2; }

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
__device__ inline float read_elem(const Geometry &g, int kv, const uint8_t *blk, uint32_t s, uint32_t e, float ts) {
  const PartDesc &d = g.part[kv];
  if (!d.quantized) {
    const uint32_t head = e / g.head_dim, i = e % g.head_dim;
    return load_plain(blk + d.offset + head * d.head_stride + s * d.token_stride + i * plain_bytes(d.dtype), d.dtype);
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

__device__ inline float load_src(const void *src, int32_t dt, uint64_t i) {
  if (dt == F32) return static_cast<const float *>(src)[i];
  const uint16_t h = static_cast<const uint16_t *>(src)[i];
  return dt == F16 ? h2f(h) : bf2f(h);
}

// ---- append --------------------------------------------------------------
struct AppendArgs {
  uint8_t *arena;
  Geometry g;
  const Slot *slots;
  const void *src[2];
  int32_t src_dtype;
  float ts[2];
  int *bad;   // set by check_kernel: the whole call writes nothing
  int parts;  // bit 0: write K, bit 1: write V
  int bs_shift = -1;  // log2(block_size) when a power of two
};

// Flags NaN / Inf (and values too large to rotate) in the rows of quantized parts.
// limit: FLT_MAX / rotation block (src/codec's check_rotatable), 0 without a rotation.
__global__ void check_kernel(const void *src, int32_t dt, uint64_t count, float limit, int *bad, unsigned long long *refused) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const float x = fabsf(load_src(src, dt, i));
    if (!(x <= FLT_MAX) || (limit > 0.0f && !(x < limit))) {
      if (atomicExch(bad, 1) == 0) atomicAdd(refused, 1ull);
      return;
    }
  }
}

__global__ void append_kernel(AppendArgs a) {
  const int kv = blockIdx.y;
  if (*a.bad || !((a.parts >> kv) & 1)) return;
  extern __shared__ float sm[];
  const Geometry &g = a.g;
  const PartDesc &d = g.part[kv];
  const uint32_t row = g.kv_heads * g.head_dim;
  const uint64_t t = blockIdx.x;
  const Slot slot = a.slots[t];
  uint8_t *blk = a.arena + static_cast<uint64_t>(slot / g.block_size) * g.block_stride;
  const uint32_t s = static_cast<uint32_t>(slot % g.block_size);
  float *x = sm;
  for (uint32_t e = threadIdx.x; e < row; e += blockDim.x) x[e] = load_src(a.src[kv], a.src_dtype, t * row + e);
  __syncthreads();
  if (!d.quantized) {
    for (uint32_t e = threadIdx.x; e < row; e += blockDim.x) {
      const uint32_t head = e / g.head_dim, i = e % g.head_dim;
      store_plain(blk + d.offset + head * d.head_stride + s * d.token_stride + i * plain_bytes(d.dtype), d.dtype, x[e]);
    }
    return;
  }
  if (d.rotation) hadamard_smem(x, row, d.rotation);
  // Parameters of each scale group: a warp per group.
  float *gs = sm + row;  // [ng] scales, then [ng] zero points
  uint32_t ng = 1, glen = row;
  if (d.gran == G_TOKEN) ng = g.kv_heads, glen = g.head_dim;
  else if (d.gran == G_GROUP) ng = (row + d.group - 1) / d.group, glen = d.group;
  float *gz = gs + ng;
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
  if (d.gran == G_TENSOR) {
    if (threadIdx.x == 0) gs[0] = a.ts[kv], gz[0] = 0.0f;
  } else {
    for (uint32_t gi = warp; gi < ng; gi += nwarps) {
      const uint32_t b = gi * glen, len = min(glen, row - b);
      float lo = x[b], hi = x[b];
      for (uint32_t i = lane; i < len; i += 32) {
        lo = fminf(lo, x[b + i]);
        hi = fmaxf(hi, x[b + i]);
      }
      for (int o = 16; o; o /= 2) {
        lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
      }
      if (lane == 0) {
        const Params p = make_params(d, lo, hi);
        gs[gi] = p.scale, gz[gi] = p.zero;
        const uint64_t idx = s * d.scales_per_token + gi;
        store_scale(blk + d.scale_offset + idx * d.scale_bytes, d.scale_f16, p.scale);
        if (d.asym) store_scale(blk + d.zero_offset + idx * d.scale_bytes, d.scale_f16, p.zero);
      }
    }
  }
  __syncthreads();
  // Codes: a thread per byte (whole bytes: no two threads share one).
  const int bits = bits_of(d.dtype), epb = 8 / bits;
  uint8_t *codes = blk + d.offset + s * d.token_stride;
  const uint64_t rb = row_bytes(d.dtype, g.head_dim);
  const uint64_t nbytes = d.gran == G_TOKEN ? g.kv_heads * rb : row_bytes(d.dtype, row);
  for (uint64_t b = threadIdx.x; b < nbytes; b += blockDim.x) {
    uint32_t e0, e1;
    if (d.gran == G_TOKEN) {
      const uint32_t head = static_cast<uint32_t>(b / rb), bb = static_cast<uint32_t>(b % rb);
      e0 = head * g.head_dim + bb * epb;
      e1 = head * g.head_dim + min(g.head_dim, (bb + 1) * epb);
    } else {
      e0 = static_cast<uint32_t>(b * epb);
      e1 = min(row, e0 + epb);
    }
    uint32_t byte = 0;
    for (uint32_t e = e0; e < e1; ++e) {
      const uint32_t gi = d.gran == G_TOKEN ? e / g.head_dim : d.gran == G_GROUP ? e / d.group : 0;
      Params p;
      if (d.gran == G_TENSOR) p = tensor_params(gs[0]);
      else {
        p.scale = gs[gi], p.zero = gz[gi];
        p.inv = p.scale > 0.0f ? __fdiv_rn(1.0f, p.scale) : 0.0f;
      }
      byte |= encode_one(d, x[e], p) << ((e - e0) * bits);
    }
    codes[b] = static_cast<uint8_t>(byte);
  }
}

// The common case at full speed: one warp per (token, KV head, part), each
// lane holding VPL = head_dim / 32 consecutive values (vector loads and
// stores). Used when head_dim is a multiple of 32, there is no rotation and
// scale groups do not cross heads (per tensor, per token, per group of G
// dividing head_dim with G / VPL lanes a power of two); the same operations
// as append_kernel, so the same bytes.
// VPL consecutive values at element index i of a row array (f32 / f16 /
// bf16), with one vector load when the address allows.
template <int VPL>
__device__ inline void load_run(const void *src, int32_t dt, uint64_t i, float *x) {
  if (dt == F32) {
    const float *p = static_cast<const float *>(src) + i;
    if (VPL % 4 == 0 && (reinterpret_cast<uintptr_t>(p) & 15u) == 0) {
#pragma unroll
      for (int j = 0; j < VPL / 4; ++j) {
        const float4 f = reinterpret_cast<const float4 *>(p)[j];
        x[4 * j] = f.x, x[4 * j + 1] = f.y, x[4 * j + 2] = f.z, x[4 * j + 3] = f.w;
      }
      return;
    }
#pragma unroll
    for (int j = 0; j < VPL; ++j) x[j] = p[j];
    return;
  }
  const uint16_t *p = static_cast<const uint16_t *>(src) + i;
  uint16_t h[VPL];
  if (VPL >= 4 && (reinterpret_cast<uintptr_t>(p) & (2 * VPL - 1)) == 0) {
    if (VPL == 8) {
      const uint4 u = *reinterpret_cast<const uint4 *>(p);
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) h[2 * j] = static_cast<uint16_t>(w[j]), h[2 * j + 1] = static_cast<uint16_t>(w[j] >> 16);
    } else {
      const uint2 u = *reinterpret_cast<const uint2 *>(p);
      h[0] = static_cast<uint16_t>(u.x), h[1] = static_cast<uint16_t>(u.x >> 16);
      h[2] = static_cast<uint16_t>(u.y), h[3] = static_cast<uint16_t>(u.y >> 16);
    }
  } else {
#pragma unroll
    for (int j = 0; j < VPL; ++j) h[j] = p[j];
  }
#pragma unroll
  for (int j = 0; j < VPL; ++j) x[j] = dt == F16 ? h2f(h[j]) : bf2f(h[j]);
}

// The common case at full speed: one warp per (token, KV head, part) in a
// grid-stride loop, each lane holding VPL = head_dim / 32 consecutive values
// (vector loads and stores). Used when head_dim is a multiple of 32, there
// is no rotation and scale groups do not cross heads (per tensor, per
// token, per group of G dividing head_dim with G / VPL lanes a power of
// two); the same operations as append_kernel, so the same bytes.
template <int VPL>
__global__ void append_warp_kernel(AppendArgs a, uint64_t n) {
  const Geometry &g = a.g;
  if (*a.bad) return;
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t units = static_cast<uint32_t>(n) * g.kv_heads * 2;  // < 2^31 (the host splits larger calls)
  const uint32_t nwarps = gridDim.x * blockDim.x / 32;
  const uint32_t hd = g.head_dim, d0 = lane * VPL;
  for (uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32; warp < units; warp += nwarps) {
    const int kv = static_cast<int>(warp & 1u);
    const uint32_t th = warp >> 1, t = th / g.kv_heads, head = th - t * g.kv_heads;
    if (!((a.parts >> kv) & 1)) continue;
    const PartDesc &d = g.part[kv];
    const Slot slot = a.slots[t];
    uint8_t *blk;
    uint32_t s;
    if (a.bs_shift >= 0) {
      blk = a.arena + static_cast<uint64_t>(slot >> a.bs_shift) * g.block_stride;
      s = static_cast<uint32_t>(slot) & (g.block_size - 1);
    } else {
      blk = a.arena + static_cast<uint64_t>(slot / g.block_size) * g.block_stride;
      s = static_cast<uint32_t>(slot % g.block_size);
    }
    float x[VPL];
    load_run<VPL>(a.src[kv], a.src_dtype, (static_cast<uint64_t>(t) * g.kv_heads + head) * hd + d0, x);
    if (!d.quantized) {
      uint8_t *o = blk + d.offset + head * d.head_stride + s * d.token_stride + d0 * plain_bytes(d.dtype);
      if (d.dtype != F32 && VPL >= 4 && (reinterpret_cast<uintptr_t>(o) & (2 * VPL - 1)) == 0) {
        uint32_t w[VPL / 2 + 1] = {};
#pragma unroll
        for (int j = 0; j < VPL / 2; ++j) {
          const uint32_t lo = d.dtype == F16 ? f2h(x[2 * j]) : f2bf(x[2 * j]);
          const uint32_t hi = d.dtype == F16 ? f2h(x[2 * j + 1]) : f2bf(x[2 * j + 1]);
          w[j] = lo | hi << 16;
        }
        if (VPL == 8) *reinterpret_cast<uint4 *>(o) = make_uint4(w[0], w[1], w[VPL >= 8 ? 2 : 0], w[VPL >= 8 ? 3 : 0]);
        else *reinterpret_cast<uint2 *>(o) = make_uint2(w[0], w[1]);
        continue;
      }
#pragma unroll
      for (int i = 0; i < VPL; ++i) store_plain(o + i * plain_bytes(d.dtype), d.dtype, x[i]);
      continue;
    }
    Params p;
    if (d.gran == G_TENSOR) {
      p = tensor_params(a.ts[kv]);
    } else {
      // Lanes per scale group: a power of two (checked by the host).
      const uint32_t glanes = d.gran == G_TOKEN ? 32u : d.group / VPL;
      float lo = x[0], hi = x[0];
#pragma unroll
      for (int i = 1; i < VPL; ++i) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
      for (uint32_t o = glanes / 2; o; o /= 2) {
        lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
      }
      p = make_params(d, lo, hi);
      if (lane % glanes == 0) {
        const uint32_t gi = d.gran == G_TOKEN ? head : (head * hd + d0) / d.group;
        const uint64_t idx = s * d.scales_per_token + gi;
        store_scale(blk + d.scale_offset + idx * d.scale_bytes, d.scale_f16, p.scale);
        if (d.asym) store_scale(blk + d.zero_offset + idx * d.scale_bytes, d.scale_f16, p.zero);
      }
    }
    const int bits = bits_of(d.dtype);
    uint8_t *codes = blk + d.offset + s * d.token_stride + head * d.head_stride + d0 * bits / 8;
    uint32_t w[VPL / 4 + 1] = {};
#pragma unroll
    for (int i = 0; i < VPL; ++i) w[(i * bits) / 32] |= encode_one(d, x[i], p) << ((i * bits) % 32);
    const int nbytes = VPL * bits / 8;
    if (nbytes == 4 && (reinterpret_cast<uintptr_t>(codes) & 3u) == 0) {
      *reinterpret_cast<uint32_t *>(codes) = w[0];
    } else if (nbytes == 8 && (reinterpret_cast<uintptr_t>(codes) & 7u) == 0) {
      *reinterpret_cast<uint2 *>(codes) = make_uint2(w[0], w[1]);
    } else {
#pragma unroll
      for (int b = 0; b < nbytes; ++b) codes[b] = static_cast<uint8_t>(w[b / 4] >> ((b % 4) * 8));
    }
  }
}

// ---- gather --------------------------------------------------------------
struct GatherArgs {
  const uint8_t *arena;
  Geometry g;
  const Slot *slots;
  void *out[2];
  int32_t dst_dtype;
  float ts[2];
};

__global__ void gather_kernel(GatherArgs a) {
  extern __shared__ float sm[];
  const Geometry &g = a.g;
  const int kv = blockIdx.y;
  if (!a.out[kv]) return;
  const PartDesc &d = g.part[kv];
  const uint32_t row = g.kv_heads * g.head_dim;
  const uint64_t t = blockIdx.x;
  const Slot slot = a.slots[t];
  const uint8_t *blk = a.arena + static_cast<uint64_t>(slot / g.block_size) * g.block_stride;
  const uint32_t s = static_cast<uint32_t>(slot % g.block_size);
  for (uint32_t e = threadIdx.x; e < row; e += blockDim.x) sm[e] = read_elem(g, kv, blk, s, e, a.ts[kv]);
  __syncthreads();
  if (d.quantized && d.rotation) hadamard_smem(sm, row, d.rotation);
  uint8_t *o = static_cast<uint8_t *>(a.out[kv]) + t * row * plain_bytes(a.dst_dtype);
  for (uint32_t e = threadIdx.x; e < row; e += blockDim.x) store_plain(o + e * plain_bytes(a.dst_dtype), a.dst_dtype, sm[e]);
}

// Absolute maximum of rotated rows (dynamic per-tensor calibration).
__global__ void absmax_kernel(const void *src, int32_t dt, uint32_t row, uint32_t rot, unsigned int *out) {
  extern __shared__ float sm[];
  const uint64_t t = blockIdx.x;
  for (uint32_t e = threadIdx.x; e < row; e += blockDim.x) sm[e] = load_src(src, dt, t * row + e);
  __syncthreads();
  if (rot) hadamard_smem(sm, row, rot);
  float m = 0.0f;
  for (uint32_t e = threadIdx.x; e < row; e += blockDim.x) m = fmaxf(m, fabsf(sm[e]));
  atomicMax(out, __float_as_uint(m));  // non-negative floats order as their bits
}

// ---- attention ------------------------------------------------------------
constexpr int kThreads = 128;
constexpr int kTile = 128;    // tokens whose scores are held at once
constexpr int kMaxGroup = 8;  // query heads per thread block (fewer with 16 values per lane)

struct AttnArgs {
  const uint8_t *arena;
  Geometry g;
  const int32_t *block_ids;
  const uint64_t *meta;  // [items][3]: block_start, n_tokens, q_row
  const void *q;
  int32_t q_dtype;
  float scale;
  uint32_t hq, group, hchunks, split_len, n_splits;
  float ts[2];
  float *ws;     // [items][hq][n_splits][hd + 2]: acc, m, l
  int bs_shift;  // log2(block_size) when a power of two, else -1
  uint32_t tile; // attn_fast_kernel: tokens per shared-memory tile
};

// Loads the EPT consecutive values [d0, d0 + EPT) of one head's row with
// vector loads (16 bytes where the storage allows), decoding codes.
template <int EPT>
__device__ inline void load_vals(const Geometry &g, int kv, const uint8_t *blk, uint32_t s, uint32_t head, uint32_t d0,
                                 float ts, float *v) {
  const PartDesc &d = g.part[kv];
  if (EPT > 1 && !d.quantized) {
    const uint8_t *p = blk + d.offset + head * d.head_stride + s * d.token_stride + d0 * plain_bytes(d.dtype);
    if (d.dtype == F32) {
#pragma unroll
      for (int j = 0; j < EPT / 4; ++j) {
        const float4 f = reinterpret_cast<const float4 *>(p)[j];
        v[4 * j] = f.x, v[4 * j + 1] = f.y, v[4 * j + 2] = f.z, v[4 * j + 3] = f.w;
      }
      return;
    }
#pragma unroll
    for (int j = 0; j < EPT / 8; ++j) {
      const uint4 u = reinterpret_cast<const uint4 *>(p)[j];
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint16_t lo = static_cast<uint16_t>(w[i]), hi = static_cast<uint16_t>(w[i] >> 16);
        v[8 * j + 2 * i] = d.dtype == F16 ? h2f(lo) : bf2f(lo);
        v[8 * j + 2 * i + 1] = d.dtype == F16 ? h2f(hi) : bf2f(hi);
      }
    }
    return;
  }
  if (EPT > 1 && (d.gran == G_TOKEN || d.gran == G_TENSOR || (d.gran == G_GROUP && d.group % EPT == 0))) {
    const int bits = bits_of(d.dtype);
    const uint8_t *p = blk + d.offset + s * d.token_stride + head * d.head_stride + d0 * bits / 8;
    uint32_t w[4] = {0, 0, 0, 0};
    const int nbytes = EPT * bits / 8;  // 2..16, aligned to itself
    if (nbytes == 16) {
      const uint4 u = *reinterpret_cast<const uint4 *>(p);
      w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
    } else if (nbytes == 8) {
      const uint2 u = *reinterpret_cast<const uint2 *>(p);
      w[0] = u.x, w[1] = u.y;
    } else if (nbytes == 4) {
      w[0] = *reinterpret_cast<const uint32_t *>(p);
    } else {
      w[0] = *reinterpret_cast<const uint16_t *>(p);
    }
    float scale = ts, zero = 0.0f;
    if (d.gran != G_TENSOR) {
      const uint32_t gi = d.gran == G_TOKEN ? head : (head * g.head_dim + d0) / d.group;
      const uint64_t idx = s * d.scales_per_token + gi;
      scale = load_scale(blk + d.scale_offset + idx * d.scale_bytes, d.scale_f16);
      if (d.asym) zero = load_scale(blk + d.zero_offset + idx * d.scale_bytes, d.scale_f16);
    }
    const uint32_t mask = (1u << bits) - 1u;
#pragma unroll
    for (int i = 0; i < EPT; ++i) {
      const int bit = i * bits;
      v[i] = decode_one(d, (w[bit >> 5] >> (bit & 31)) & mask, scale, zero);
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < EPT; ++i) v[i] = read_elem(g, kv, blk, s, head * g.head_dim + d0 + i, ts);
}

// One thread block: one item (sequence or prefill row), one KV head, up to
// GM of its query heads, one split of its tokens. L lanes (a power of two)
// read one token's head row, EPT values each; the block's token groups take
// the tile's tokens in turn, kUnroll tokens at a time (independent loads in
// flight). Writes the split's unnormalized softmax state to ws.
template <int EPT, int GM>
__global__ void __launch_bounds__(kThreads, EPT * GM > 32 ? 3 : 4) attn_kernel(AttnArgs a) {
  // Tokens each lane group loads before computing (independent loads in
  // flight), within the registers that 3 or 4 blocks per multiprocessor leave.
  constexpr int kUnroll = EPT * GM > 32 ? 2 : 4;
  const Geometry &g = a.g;
  const uint32_t hd = g.head_dim, bs = g.block_size;
  const uint64_t item = blockIdx.z;
  const uint32_t kh = blockIdx.y / a.hchunks, hc = blockIdx.y % a.hchunks;
  const uint32_t qh0 = kh * a.group + hc * GM;
  const uint32_t ng = min(static_cast<uint32_t>(GM), a.group - hc * GM);
  const uint32_t split = blockIdx.x;
  const uint64_t qrow = a.meta[item * 3 + 2];
  // This item's block ids; token indices fit 32 bits (lengths < 2^31), and
  // block / slot come from a shift where block_size is a power of two (no
  // 64-bit division in the loops).
  const int32_t *ids = a.block_ids + a.meta[item * 3];
  const uint32_t n = static_cast<uint32_t>(a.meta[item * 3 + 1]);
  const uint32_t t_begin = split * a.split_len;
  const uint32_t t_end = min(n, t_begin + a.split_len);
  const int bsh = a.bs_shift;
  auto token_blk = [&](uint32_t t, uint32_t &slot) {
    uint32_t b;
    if (bsh >= 0) b = t >> bsh, slot = t & (bs - 1);
    else b = t / bs, slot = t - b * bs;
    return a.arena + static_cast<uint64_t>(__ldg(ids + b)) * g.block_stride;
  };

  __shared__ float q_s[GM][256];
  __shared__ float sc[GM][kTile];
  __shared__ float m_s[GM], l_s[GM], alpha_s[GM];
  extern __shared__ float red[];  // [token groups][GM][hd]

  const uint32_t per_tok = (hd + EPT - 1) / EPT;
  uint32_t L = 1;
  while (L < per_tok) L *= 2;
  const uint32_t ntg = kThreads / L, tg = threadIdx.x / L, ln = threadIdx.x % L;
  const uint32_t d0 = ln * EPT;
  const bool active = d0 < hd;

  for (uint32_t i = threadIdx.x; i < ng * hd; i += kThreads) {
    const uint32_t gi = i / hd, e = i % hd;
    const uint64_t qi = (qrow * a.hq + qh0 + gi) * hd + e;
    q_s[gi][e] = load_src(a.q, a.q_dtype, qi) * a.scale;
  }
  if (threadIdx.x < GM) m_s[threadIdx.x] = -INFINITY, l_s[threadIdx.x] = 0.0f;
  __syncthreads();
  // Keys stored rotated (H k): score with the rotated query, (H q).(H k) = q.k
  // (H orthogonal, block-diagonal inside each head).
  if (g.part[0].quantized && g.part[0].rotation > 1)
    for (uint32_t gi = 0; gi < ng; ++gi) hadamard_smem(q_s[gi], hd, g.part[0].rotation);
  float acc[GM][EPT];
#pragma unroll
  for (int gi = 0; gi < GM; ++gi)
#pragma unroll
    for (int i = 0; i < EPT; ++i) acc[gi][i] = 0.0f;
  __syncthreads();

  const unsigned full = 0xffffffffu;
  const uint32_t step = ntg * kUnroll;
  for (uint32_t t0 = t_begin; t0 < t_end; t0 += kTile) {
    const uint32_t nt = min(static_cast<uint32_t>(kTile), t_end - t0);
    const uint32_t bound = (nt + step - 1) / step * step;  // every lane runs the same iterations (shuffles)
    // Scores of the tile.
    for (uint32_t base = tg; base < bound; base += step) {
      float k[kUnroll][EPT];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint32_t tt = base + u * ntg;
        if (tt < nt && active) {
          uint32_t slot;
          const uint8_t *blk = token_blk(t0 + tt, slot);
          load_vals<EPT>(g, 0, blk, slot, kh, d0, a.ts[0], k[u]);
        } else {
#pragma unroll
          for (int i = 0; i < EPT; ++i) k[u][i] = 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint32_t tt = base + u * ntg;
#pragma unroll
        for (int gi = 0; gi < GM; ++gi) {
          if (gi >= static_cast<int>(ng)) break;
          float p = 0.0f;
          if (active)
#pragma unroll
            for (int i = 0; i < EPT; ++i) p = __fmaf_rn(q_s[gi][d0 + i], k[u][i], p);
          for (uint32_t o = L / 2; o; o /= 2) p += __shfl_xor_sync(full, p, o);
          if (ln == 0 && tt < nt) sc[gi][tt] = fminf(FLT_MAX, fmaxf(-FLT_MAX, p));
        }
      }
    }
    __syncthreads();
    // Online softmax: a warp per query head.
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (uint32_t gi = warp; gi < ng; gi += kThreads / 32) {
      float mx = -INFINITY;
      for (uint32_t i = lane; i < nt; i += 32) mx = fmaxf(mx, sc[gi][i]);
      for (int o = 16; o; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(full, mx, o));
      const float m_old = m_s[gi], m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
      for (uint32_t i = lane; i < nt; i += 32) {
        const float p = __expf(sc[gi][i] - m_new);
        sc[gi][i] = p;
        sum += p;
      }
      for (int o = 16; o; o /= 2) sum += __shfl_xor_sync(full, sum, o);
      if (lane == 0) {
        const float al = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
        alpha_s[gi] = al;
        l_s[gi] = l_s[gi] * al + sum;
        m_s[gi] = m_new;
      }
    }
    __syncthreads();
#pragma unroll
    for (int gi = 0; gi < GM; ++gi) {
      if (gi >= static_cast<int>(ng)) break;
      const float al = alpha_s[gi];
#pragma unroll
      for (int i = 0; i < EPT; ++i) acc[gi][i] *= al;
    }
    if (active)
      for (uint32_t base = tg; base < nt; base += step) {
        float v[kUnroll][EPT];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const uint32_t tt = base + u * ntg;
          if (tt < nt) {
            uint32_t slot;
            const uint8_t *blk = token_blk(t0 + tt, slot);
            load_vals<EPT>(g, 1, blk, slot, kh, d0, a.ts[1], v[u]);
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const uint32_t tt = base + u * ntg;
          if (tt >= nt) break;
#pragma unroll
          for (int gi = 0; gi < GM; ++gi) {
            if (gi >= static_cast<int>(ng)) break;
            const float p = sc[gi][tt];
#pragma unroll
            for (int i = 0; i < EPT; ++i) acc[gi][i] = __fmaf_rn(p, v[u][i], acc[gi][i]);
          }
        }
      }
    __syncthreads();
  }
  // Sum the token groups' accumulators.
  if (active)
    for (uint32_t gi = 0; gi < ng; ++gi)
#pragma unroll
      for (int i = 0; i < EPT; ++i)
        if (d0 + i < hd) red[(tg * GM + gi) * hd + d0 + i] = acc[gi][i];
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < ng * hd; i += kThreads) {
    const uint32_t gi = i / hd, e = i % hd;
    float s = 0.0f;
    for (uint32_t k = 0; k < ntg; ++k) s += red[(k * GM + gi) * hd + e];
    float *w = a.ws + (((item * a.hq) + qh0 + gi) * a.n_splits + split) * (hd + 2);
    w[e] = s;
    if (e == 0) w[hd] = m_s[gi], w[hd + 1] = l_s[gi];
  }
}

// ---- specialized attention: storage known at compile time ----------------
// Loaders of 8 consecutive values of one head row (d0 a multiple of 8).
// Quantized loaders take one scale for the 8 values (per-token, per-tensor,
// or per-group with group_size a multiple of 8) and symmetric codes.
__device__ inline float scale_at(const PartDesc &d, const uint8_t *blk, uint32_t s, uint32_t head, uint32_t d0,
                                 uint32_t hd, float ts) {
  if (d.gran == G_TENSOR) return ts;
  const uint32_t gi = d.gran == G_TOKEN ? head : (head * hd + d0) / d.group;
  return load_scale(blk + d.scale_offset + (s * d.scales_per_token + gi) * d.scale_bytes, d.scale_f16);
}
// Loaders decode 8 consecutive values from a row chunk already in shared
// memory (16-bit storage: 16 bytes; 8-bit: 8; 4-bit: 4), times the scale.
struct LoadF16 {
  static constexpr int kBits = 16;
  static constexpr bool kQuant = false;
  static __device__ void load(const uint8_t *p, float, float *v) {
    const uint4 u = *reinterpret_cast<const uint4 *>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&w[i]));
      v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
  }
};
struct LoadBF16 {
  static constexpr int kBits = 16;
  static constexpr bool kQuant = false;
  static __device__ void load(const uint8_t *p, float, float *v) {
    const uint4 u = *reinterpret_cast<const uint4 *>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) v[2 * i] = __uint_as_float(w[i] << 16), v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
};
struct LoadI8 {
  static constexpr int kBits = 8;
  static constexpr bool kQuant = true;
  static __device__ void load(const uint8_t *p, float sc, float *v) {
    const uint2 u = *reinterpret_cast<const uint2 *>(p);
    const uint32_t w[2] = {u.x, u.y};
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = static_cast<float>(static_cast<int8_t>(w[i / 4] >> (8 * (i % 4)))) * sc;
  }
};
struct LoadE4M3 {
  static constexpr int kBits = 8;
  static constexpr bool kQuant = true;
  static __device__ void load(const uint8_t *p, float sc, float *v) {
    const uint2 u = *reinterpret_cast<const uint2 *>(p);
    const uint32_t w[2] = {u.x, u.y};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // hardware conversion of two e4m3 values to two f16 (exact)
      const __half2_raw h =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w[i / 2] >> (16 * (i % 2))), __NV_E4M3);
      const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h));
      v[2 * i] = f.x * sc, v[2 * i + 1] = f.y * sc;
    }
  }
};
struct LoadI4 {
  static constexpr int kBits = 4;
  static constexpr bool kQuant = true;
  static __device__ void load(const uint8_t *p, float sc, float *v) {
    const uint32_t w = *reinterpret_cast<const uint32_t *>(p);
#pragma unroll
    for (int i = 0; i < 8; ++i)  // 2^23 + nibble as a float, minus 2^23 + 8: the signed code, exactly
      v[i] = (__uint_as_float(0x4b000000u | ((w >> (4 * i)) & 0xfu)) - 8388616.0f) * sc;
  }
};

__device__ inline void cp_async16(void *dst, const void *src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ inline void cp_async_wait1() { asm volatile("cp.async.wait_group 1;\n" ::); }

// As attn_kernel for the common storages: 4 query heads per block (larger
// groups run in chunks of 4), 8 values per lane, L = head_dim / 8 >= 4 lanes
// per token. The K and V rows of the next tile are copied into shared memory
// with cp.async while the current tile is computed (double buffering: the
// memory system always has a tile in flight); the queries live in registers
// and the 4 partial dot products are reduced with a transposing butterfly
// (5 shuffles instead of 4 x log2 L). Writes the split's softmax state.
template <class KL, class VL>
__global__ void __launch_bounds__(kThreads, 4) attn_fast_kernel(AttnArgs a) {
  constexpr int GM = 4, EPT = 8;
  const Geometry &g = a.g;
  const uint32_t hd = g.head_dim, bs = g.block_size;
  const uint64_t item = blockIdx.z;
  const uint32_t kh = blockIdx.y / a.hchunks, hc = blockIdx.y % a.hchunks;
  const uint32_t qh0 = kh * a.group + hc * GM;
  const uint32_t ng = min(static_cast<uint32_t>(GM), a.group - hc * GM);
  const uint32_t split = blockIdx.x;
  const uint64_t qrow = a.meta[item * 3 + 2];
  const int32_t *ids = a.block_ids + a.meta[item * 3];
  const uint32_t n = static_cast<uint32_t>(a.meta[item * 3 + 1]);
  const uint32_t t_begin = split * a.split_len;
  const uint32_t t_end = min(n, t_begin + a.split_len);
  const int bsh = a.bs_shift;
  const PartDesc &dk = g.part[0], &dv = g.part[1];
  const uint32_t rk = hd * KL::kBits / 8, rv = hd * VL::kBits / 8;  // row bytes, multiples of 16
  const uint32_t T = a.tile;  // tokens per tile (<= kTile)

  __shared__ float q_s[GM][256];
  __shared__ float sc[GM][kTile];
  __shared__ float m_s[GM], l_s[GM], alpha_s[GM];
  extern __shared__ __align__(16) uint8_t dyn[];  // K tiles [2][T][rk], V tiles [2][T][rv]; later the reduction
  uint8_t *kbuf = dyn, *vbuf = dyn + 2 * T * rk;
  const uint32_t L = hd / EPT;
  const uint32_t ntg = kThreads / L, tg = threadIdx.x / L, ln = threadIdx.x % L, d0 = ln * EPT;
  // The split's block ids, read once into shared memory (the copies below
  // need them without a dependent global load each).
  int32_t *ids_s = reinterpret_cast<int32_t *>(dyn + 2 * T * (rk + rv));
  const uint32_t b0 = bsh >= 0 ? t_begin >> bsh : t_begin / bs;
  if (t_begin < t_end) {
    const uint32_t b1 = bsh >= 0 ? (t_end - 1) >> bsh : (t_end - 1) / bs;
    for (uint32_t i = threadIdx.x; i <= b1 - b0; i += kThreads) ids_s[i] = __ldg(ids + b0 + i);
  }
  __syncthreads();
  auto token_blk = [&](uint32_t t, uint32_t &slot) {
    uint32_t b;
    if (bsh >= 0) b = t >> bsh, slot = t & (bs - 1);
    else b = t / bs, slot = t - b * bs;
    return a.arena + static_cast<uint64_t>(ids_s[b - b0]) * g.block_stride;
  };
  // Queues the copies of tile `t0` into buffer `buf` (one commit group).
  // Each thread copies one fixed 16-byte chunk of a row (K: chunk ck_part of
  // tokens ck_tok0, ck_tok0 + ck_step, ...; V likewise): no division per copy.
  const uint32_t ck = rk / 16, cv = rv / 16;  // chunks per row, <= kThreads
  const uint32_t ck_part = threadIdx.x % ck, ck_tok0 = threadIdx.x / ck, ck_step = kThreads / ck;
  const uint32_t cv_part = threadIdx.x % cv, cv_tok0 = threadIdx.x / cv, cv_step = kThreads / cv;
  const uint64_t k_off = dk.offset + kh * dk.head_stride + ck_part * 16, v_off = dv.offset + kh * dv.head_stride + cv_part * 16;
  // Queues the copies of tile `t0` into buffer `buf` (one commit group).
  auto issue = [&](uint32_t t0, int buf) {
    const uint32_t nt = min(T, t_end - t0);
    if (threadIdx.x < ck * ck_step)
      for (uint32_t tok = ck_tok0; tok < nt; tok += ck_step) {
        uint32_t slot;
        const uint8_t *blk = token_blk(t0 + tok, slot);
        cp_async16(kbuf + (buf * T + tok) * rk + ck_part * 16, blk + k_off + slot * dk.token_stride);
      }
    if (threadIdx.x < cv * cv_step)
      for (uint32_t tok = cv_tok0; tok < nt; tok += cv_step) {
        uint32_t slot;
        const uint8_t *blk = token_blk(t0 + tok, slot);
        cp_async16(vbuf + (buf * T + tok) * rv + cv_part * 16, blk + v_off + slot * dv.token_stride);
      }
    cp_async_commit();
  };
  // Per-token scales of quantized parts ([2 parts][2 buffers][T]), loaded
  // one tile ahead into registers and stored after the current tile.
  __shared__ float ssc[2][2][kTile];
  const bool kq_tok = KL::kQuant && dk.gran == G_TOKEN, vq_tok = VL::kQuant && dv.gran == G_TOKEN;
  float pend = 0.0f;
  int pend_idx = -1;
  auto fetch_scale = [&](uint32_t t0, int buf) {  // one scale per thread at most (2 x T <= kThreads)
    pend_idx = -1;
    const uint32_t nt = min(T, t_end - t0);
    const uint32_t c = threadIdx.x;
    if (c >= 2 * nt) return;
    const int kv = c >= nt;
    const uint32_t tok = kv ? c - nt : c;
    if (!(kv ? vq_tok : kq_tok)) return;
    const PartDesc &d = kv ? dv : dk;
    uint32_t slot;
    const uint8_t *blk = token_blk(t0 + tok, slot);
    pend = load_scale(blk + d.scale_offset + (slot * d.scales_per_token + kh) * d.scale_bytes, d.scale_f16);
    pend_idx = (kv * 2 + buf) * kTile + tok;
  };
  auto store_scale_s = [&]() {
    if (pend_idx >= 0) (&ssc[0][0][0])[pend_idx] = pend;
  };


  for (uint32_t i = threadIdx.x; i < GM * hd; i += kThreads) {
    const uint32_t gi = i / hd, e = i % hd;
    q_s[gi][e] = gi < ng ? load_src(a.q, a.q_dtype, (qrow * a.hq + qh0 + gi) * hd + e) * a.scale : 0.0f;
  }
  if (threadIdx.x < GM) m_s[threadIdx.x] = -INFINITY, l_s[threadIdx.x] = 0.0f;
  if (t_begin < t_end) {
    issue(t_begin, 0);
    fetch_scale(t_begin, 0);
    store_scale_s();
  }
  __syncthreads();
  if (dk.quantized && dk.rotation > 1)
    for (uint32_t gi = 0; gi < ng; ++gi) hadamard_smem(q_s[gi], hd, dk.rotation);
  float qr[GM][EPT], acc[GM][EPT];
#pragma unroll
  for (int gi = 0; gi < GM; ++gi)
#pragma unroll
    for (int i = 0; i < EPT; ++i) qr[gi][i] = q_s[gi][d0 + i], acc[gi][i] = 0.0f;
  const uint32_t half = L / 2, quarter = L / 4;
  const bool up1 = ln & half, up2 = ln & quarter;
  const uint32_t my_head = (up1 ? 2 : 0) + (up2 ? 1 : 0);
  const unsigned full = 0xffffffffu;
  const uint32_t bound_step = ntg * 2;

  int buf = 0;
  for (uint32_t t0 = t_begin; t0 < t_end; t0 += T, buf ^= 1) {
    const uint32_t nt = min(T, t_end - t0);
    if (t0 + T < t_end) {
      issue(t0 + T, buf ^ 1);
      fetch_scale(t0 + T, buf ^ 1);
    } else {
      cp_async_commit();  // an empty group keeps "all but the newest" meaning this tile
      pend_idx = -1;
    }
    cp_async_wait1();
    __syncthreads();
    const uint8_t *kt = kbuf + buf * T * rk, *vt = vbuf + buf * T * rv;
    // Scores of the tile (two tokens per lane group at a time).
    const uint32_t bound = (nt + bound_step - 1) / bound_step * bound_step;
    for (uint32_t base = tg; base < bound; base += bound_step) {
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const uint32_t tt = base + u * ntg;
        float k[EPT];
        float scl = 1.0f;
        if (KL::kQuant && tt < nt) {
          if (kq_tok) {
            scl = ssc[0][buf][tt];
          } else if (dk.gran == G_TENSOR) {
            scl = a.ts[0];
          } else {
            uint32_t slot;
            const uint8_t *blk = token_blk(t0 + tt, slot);
            scl = scale_at(dk, blk, slot, kh, d0, hd, a.ts[0]);
          }
        }
        KL::load(kt + min(tt, nt - 1) * rk + d0 * KL::kBits / 8, scl, k);
        float p[GM];
#pragma unroll
        for (int gi = 0; gi < GM; ++gi) {
          p[gi] = 0.0f;
#pragma unroll
          for (int i = 0; i < EPT; ++i) p[gi] = __fmaf_rn(qr[gi][i], k[i], p[gi]);
        }
        float k0 = up1 ? p[2] : p[0], k1 = up1 ? p[3] : p[1];
        k0 += __shfl_xor_sync(full, up1 ? p[0] : p[2], half);
        k1 += __shfl_xor_sync(full, up1 ? p[1] : p[3], half);
        float r = up2 ? k1 : k0;
        r += __shfl_xor_sync(full, up2 ? k0 : k1, quarter);
        for (uint32_t o = quarter / 2; o; o /= 2) r += __shfl_xor_sync(full, r, o);
        if ((ln & (quarter - 1)) == 0 && tt < nt && my_head < ng) sc[my_head][tt] = fminf(FLT_MAX, fmaxf(-FLT_MAX, r));
      }
    }
    __syncthreads();
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (uint32_t gi = warp; gi < ng; gi += kThreads / 32) {
      float mx = -INFINITY;
      for (uint32_t i = lane; i < nt; i += 32) mx = fmaxf(mx, sc[gi][i]);
      for (int o = 16; o; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(full, mx, o));
      const float m_old = m_s[gi], m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
      for (uint32_t i = lane; i < nt; i += 32) {
        const float e = __expf(sc[gi][i] - m_new);
        sc[gi][i] = e;
        sum += e;
      }
      for (int o = 16; o; o /= 2) sum += __shfl_xor_sync(full, sum, o);
      if (lane == 0) {
        const float al = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
        alpha_s[gi] = al;
        l_s[gi] = l_s[gi] * al + sum;
        m_s[gi] = m_new;
      }
    }
    __syncthreads();
#pragma unroll
    for (int gi = 0; gi < GM; ++gi) {
      const float al = gi < static_cast<int>(ng) ? alpha_s[gi] : 0.0f;
#pragma unroll
      for (int i = 0; i < EPT; ++i) acc[gi][i] *= al;
    }
    for (uint32_t tt = tg; tt < nt; tt += ntg) {
      float scl = 1.0f;
      if (VL::kQuant) {
        if (vq_tok) {
          scl = ssc[1][buf][tt];
        } else if (dv.gran == G_TENSOR) {
          scl = a.ts[1];
        } else {
          uint32_t slot;
          const uint8_t *blk = token_blk(t0 + tt, slot);
          scl = scale_at(dv, blk, slot, kh, d0, hd, a.ts[1]);
        }
      }
      float v[EPT];
      VL::load(vt + tt * rv + d0 * VL::kBits / 8, scl, v);
#pragma unroll
      for (int gi = 0; gi < GM; ++gi) {
        const float pr = gi < static_cast<int>(ng) ? sc[gi][tt] : 0.0f;
#pragma unroll
        for (int i = 0; i < EPT; ++i) acc[gi][i] = __fmaf_rn(pr, v[i], acc[gi][i]);
      }
    }
    store_scale_s();  // the next tile's scales (its buffer is no longer read)
    __syncthreads();
  }
  float *red = reinterpret_cast<float *>(dyn);  // [token groups][GM][hd]
  for (uint32_t gi = 0; gi < ng; ++gi)
#pragma unroll
    for (int i = 0; i < EPT; ++i) red[(tg * GM + gi) * hd + d0 + i] = acc[gi][i];
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < ng * hd; i += kThreads) {
    const uint32_t gi = i / hd, e = i % hd;
    float sum = 0.0f;
    for (uint32_t k = 0; k < ntg; ++k) sum += red[(k * GM + gi) * hd + e];
    float *w = a.ws + (((item * a.hq) + qh0 + gi) * a.n_splits + split) * (hd + 2);
    w[e] = sum;
    if (e == 0) w[hd] = m_s[gi], w[hd + 1] = l_s[gi];
  }
}

// Merges the splits of each (item, query head) by log-sum-exp and writes the
// output rows (and lse).
// Values stored rotated (H v): the output is rotated back (H is its own inverse).
__global__ void merge_kernel(const float *ws, uint32_t hd, uint32_t hq, uint32_t n_splits, const uint64_t *meta,
                             void *out, int32_t out_dtype, float *lse, uint32_t v_rotation) {
  __shared__ float o_s[256];
  const uint64_t item = blockIdx.x / hq;
  const uint32_t qh = blockIdx.x % hq;
  const float *w = ws + (item * hq + qh) * n_splits * (hd + 2);
  float M = -INFINITY;
  for (uint32_t s = 0; s < n_splits; ++s)
    if (w[s * (hd + 2) + hd + 1] > 0.0f) M = fmaxf(M, w[s * (hd + 2) + hd]);
  float L = 0.0f;
  for (uint32_t s = 0; s < n_splits; ++s) {
    const float l = w[s * (hd + 2) + hd + 1];
    if (l > 0.0f) L += l * __expf(w[s * (hd + 2) + hd] - M);
  }
  const uint64_t qrow = meta[item * 3 + 2];
  uint8_t *o = static_cast<uint8_t *>(out) + ((qrow * hq) + qh) * hd * plain_bytes(out_dtype);
  for (uint32_t e = threadIdx.x; e < hd; e += blockDim.x) {
    float acc = 0.0f;
    if (L > 0.0f)
      for (uint32_t s = 0; s < n_splits; ++s) {
        const float l = w[s * (hd + 2) + hd + 1];
        if (l > 0.0f) acc += w[s * (hd + 2) + e] * __expf(w[s * (hd + 2) + hd] - M);
      }
    o_s[e] = L > 0.0f ? acc / L : 0.0f;
  }
  __syncthreads();
  if (v_rotation > 1) hadamard_smem(o_s, hd, v_rotation);
  for (uint32_t e = threadIdx.x; e < hd; e += blockDim.x) store_plain(o + e * plain_bytes(out_dtype), out_dtype, o_s[e]);
  if (lse && threadIdx.x == 0) lse[qrow * hq + qh] = L > 0.0f ? M + logf(L) : -INFINITY;
}

// ---- token moves (eviction compaction) -------------------------------------
struct MoveArgs {
  uint8_t *arena;
  Geometry g;
  const Slot *slots;  // [n] sources then [n] destinations
  uint64_t n;
  uint8_t *stage;     // [n][token_bytes]
  uint64_t token_bytes;
  int to_stage;
};

// Byte b of a token's record: each part's codes (head by head for plain
// HND storage), then its scales and zero points.
__device__ uint8_t *token_byte(const Geometry &g, uint8_t *blk, uint32_t s, uint64_t b) {
  for (int kv = 0; kv < 2; ++kv) {
    const PartDesc &d = g.part[kv];
    const uint64_t head_row = d.quantized ? d.token_stride / g.kv_heads : g.head_dim * plain_bytes(d.dtype);
    const uint64_t codes = head_row * g.kv_heads;
    if (b < codes) {
      if (d.quantized) return blk + d.offset + s * d.token_stride + b;
      return blk + d.offset + (b / head_row) * d.head_stride + s * d.token_stride + b % head_row;
    }
    b -= codes;
    const uint64_t sb = d.quantized ? d.scales_per_token * d.scale_bytes : 0;
    if (b < sb) return blk + d.scale_offset + s * sb + b;
    b -= sb;
    const uint64_t zb = d.quantized && d.asym ? sb : 0;
    if (b < zb) return blk + d.zero_offset + s * sb + b;
    b -= zb;
  }
  return nullptr;
}

__global__ void move_kernel(MoveArgs a) {
  const uint64_t i = blockIdx.x;
  const Slot slot = a.slots[a.to_stage ? i : a.n + i];
  uint8_t *blk = a.arena + static_cast<uint64_t>(slot / a.g.block_size) * a.g.block_stride;
  const uint32_t s = static_cast<uint32_t>(slot % a.g.block_size);
  for (uint64_t b = threadIdx.x; b < a.token_bytes; b += blockDim.x) {
    uint8_t *p = token_byte(a.g, blk, s, b);
    if (a.to_stage) a.stage[i * a.token_bytes + b] = *p;
    else *p = a.stage[i * a.token_bytes + b];
  }
}

// ---- host side ---------------------------------------------------------------
std::string u64s(uint64_t v) { return std::to_string(v); }

void check(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error
  if (e == cudaErrorMemoryAllocation)
    fail(Errc::OutOfMemory, std::string("CUDA: ") + what + ": out of device memory");
  fail(Errc::Internal, std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

bool is_device_ptr(const void *p) {
  if (!p) return false;
  cudaPointerAttributes at{};
  if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
}

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, uint64_t bytes, const Geometry &g) : index_(index), g_(g) {
    Guard gd(index);
    // Ordered after the legacy default stream, so an engine's plain
    // cudaMemcpy into its buffers completes before the pool reads them.
    check(cudaStreamCreate(&own_), "cudaStreamCreate");
    // Per-call temporaries come from the stream-ordered allocator: keep its
    // memory between calls instead of returning it at every synchronization.
    cudaMemPool_t mp;
    if (cudaDeviceGetDefaultMemPool(&mp, index) == cudaSuccess) {
      uint64_t keep = UINT64_MAX;
      cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    cudaGetLastError();
    stream_ = own_;
    cudaError_t e = cudaMalloc(&arena_, bytes ? bytes : 1);
    if (e != cudaSuccess) {
      cudaGetLastError();
      cudaStreamDestroy(own_);
      fail(Errc::OutOfMemory, "CUDA device " + std::to_string(index) + ": cannot allocate " + u64s(bytes) +
                                  " bytes of block memory (" + cudaGetErrorString(e) + ")");
    }
    e = cudaMalloc(&flags_, sizeof(unsigned long long));
    if (e == cudaSuccess) e = cudaMemset(arena_, 0, bytes);
    if (e == cudaSuccess) e = cudaMemset(flags_, 0, sizeof(unsigned long long));
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      cudaGetLastError();
      cudaFree(arena_);
      if (flags_) cudaFree(flags_);
      cudaStreamDestroy(own_);
      fail(Errc::OutOfMemory, std::string("CUDA: pool set-up failed: ") + cudaGetErrorString(e));
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, index) == cudaSuccess) sms_ = prop.multiProcessorCount;
  }
  ~CudaDevice() override {
    Guard gd(index_);
    cudaStreamSynchronize(stream_);
    if (stage_event_) cudaEventDestroy(stage_event_);
    if (stage_) cudaFreeHost(stage_);
    cudaFree(arena_);
    cudaFree(flags_);
    cudaStreamDestroy(own_);
  }
  uint8_t *arena() const override { return arena_; }
  void set_stream(void *s) override {
    Guard gd(index_);
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");  // work queued so far comes first
    stream_ = static_cast<cudaStream_t>(s);
  }
  void *stream() const override { return stream_; }

  void zero(uint64_t off, uint64_t n) override {
    Guard gd(index_);
    check(cudaMemsetAsync(arena_ + off, 0, n, stream_), "cudaMemsetAsync");
  }
  void copy(uint64_t dst, uint64_t src, uint64_t n) override {
    Guard gd(index_);
    check(cudaMemcpyAsync(arena_ + dst, arena_ + src, n, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
  }

  void append(const Slot *slots, uint64_t n, const void *k, const void *v, int32_t src_dtype,
              const float ts[2], int parts) override {
    Guard gd(index_);
    const uint32_t row = g_.kv_heads * g_.head_dim;
    const uint64_t in_bytes = n * row * plain_bytes(src_dtype);
    Temp tmp(stream_);
    const void *src[2] = {k, v};
    bool host = false;
    for (int kv = 0; kv < 2; ++kv)
      if ((parts >> kv & 1) && !is_device_ptr(src[kv])) {
        host = true;
        void *d = tmp.get(in_bytes);
        check(cudaMemcpyAsync(d, src[kv], in_bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (K/V rows)");
        src[kv] = d;
      }
    Slot *dslots = static_cast<Slot *>(tmp.get(n * sizeof(Slot)));
    upload(dslots, slots, n * sizeof(Slot), nullptr, 0);
    int *bad = static_cast<int *>(tmp.get(sizeof(int)));  // this call's flag
    check(cudaMemsetAsync(bad, 0, sizeof(int), stream_), "cudaMemsetAsync");
    for (int kv = 0; kv < 2; ++kv) {
      const PartDesc &d = g_.part[kv];
      if (!d.quantized || !(parts >> kv & 1)) continue;
      const float limit = d.rotation ? FLT_MAX / static_cast<float>(d.rotation) : 0.0f;
      const uint64_t count = n * row;
      const unsigned blocks = static_cast<unsigned>(std::min<uint64_t>((count + 255) / 256, 64ull * sms_));
      check_kernel<<<blocks, 256, 0, stream_>>>(src[kv], src_dtype, count, limit, bad, flags_);
    }
    AppendArgs a{arena_, g_, dslots, {src[0], src[1]}, src_dtype, {ts[0], ts[1]}, bad, parts};
    for (int sh = 0; sh < 31; ++sh)
      if ((1u << sh) == g_.block_size) a.bs_shift = sh;
    const int vpl = warp_vpl();
    if (vpl) {
      const uint64_t per = (uint64_t(1) << 30) / (g_.kv_heads * 2);  // tokens per launch: 32-bit unit indices
      for (uint64_t t0 = 0; t0 < n; t0 += per) {
        const uint64_t cnt = std::min(per, n - t0);
        AppendArgs b = a;
        b.slots = dslots + t0;
        for (int kv = 0; kv < 2; ++kv)
          if (src[kv]) b.src[kv] = static_cast<const uint8_t *>(src[kv]) + t0 * row * plain_bytes(src_dtype);
        const uint64_t warps = cnt * g_.kv_heads * 2;
        const unsigned blocks = static_cast<unsigned>(std::min<uint64_t>((warps * 32 + 255) / 256, 32ull * sms_));
        switch (vpl) {
          case 1: append_warp_kernel<1><<<blocks, 256, 0, stream_>>>(b, cnt); break;
          case 2: append_warp_kernel<2><<<blocks, 256, 0, stream_>>>(b, cnt); break;
          case 4: append_warp_kernel<4><<<blocks, 256, 0, stream_>>>(b, cnt); break;
          default: append_warp_kernel<8><<<blocks, 256, 0, stream_>>>(b, cnt); break;
        }
      }
      check(cudaGetLastError(), "append kernel launch");
      if (host) check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      return;
    }
    const size_t smem = (row + 2 * max_groups()) * sizeof(float);
    for (uint64_t t0 = 0; t0 < n; t0 += 65535u * 16) {
      const uint64_t cnt = std::min<uint64_t>(n - t0, 65535u * 16);
      AppendArgs b = a;
      b.slots = dslots + t0;
      for (int kv = 0; kv < 2; ++kv)
        if (src[kv]) b.src[kv] = static_cast<const uint8_t *>(src[kv]) + t0 * row * plain_bytes(src_dtype);
      append_kernel<<<dim3(static_cast<unsigned>(cnt), 2), kThreads, smem, stream_>>>(b);
    }
    check(cudaGetLastError(), "append kernel launch");
    if (host) check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  float absmax(int kv, uint64_t n, const void *src, int32_t dt) override {
    Guard gd(index_);
    const uint32_t row = g_.kv_heads * g_.head_dim;
    const uint64_t bytes = n * row * plain_bytes(dt);
    Temp tmp(stream_);
    if (!is_device_ptr(src)) {
      void *d = tmp.get(bytes);
      check(cudaMemcpyAsync(d, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
      src = d;
    }
    // NaN / Inf (or values too large to rotate) first: such a call writes
    // nothing and calibrates nothing, as on the CPU.
    unsigned int *m = static_cast<unsigned int *>(tmp.get(4 * sizeof(unsigned int)));
    int *bad = reinterpret_cast<int *>(m + 1);
    unsigned long long *count = reinterpret_cast<unsigned long long *>(m + 2);
    check(cudaMemsetAsync(m, 0, 4 * sizeof(unsigned int), stream_), "cudaMemsetAsync");
    const uint32_t rot = g_.part[kv].rotation;
    const uint64_t total = n * row;
    check_kernel<<<static_cast<unsigned>(std::min<uint64_t>((total + 255) / 256, 4096)), 256, 0, stream_>>>(
        src, dt, total, rot ? FLT_MAX / static_cast<float>(rot) : 0.0f, bad, count);
    for (uint64_t t0 = 0; t0 < n; t0 += 65535) {
      const uint64_t cnt = std::min<uint64_t>(n - t0, 65535);
      absmax_kernel<<<static_cast<unsigned>(cnt), kThreads, row * sizeof(float), stream_>>>(
          static_cast<const uint8_t *>(src) + t0 * row * plain_bytes(dt), dt, row, rot, m);
    }
    check(cudaGetLastError(), "absmax kernel launch");
    unsigned int res[2] = {0, 0};
    check(cudaMemcpyAsync(res, m, sizeof res, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    float f;
    std::memcpy(&f, &res[0], 4);
    if (res[1] || !(f <= FLT_MAX))
      fail(Errc::NonFinite, std::string(kv ? "v" : "k") +
                                " holds NaN, Inf or a value too large to rotate: nothing was written");
    return f;
  }

  void gather(const Slot *slots, uint64_t n, void *k_out, void *v_out, int32_t dt, const float ts[2]) override {
    Guard gd(index_);
    const uint32_t row = g_.kv_heads * g_.head_dim;
    const uint64_t out_bytes = n * row * plain_bytes(dt);
    Temp tmp(stream_);
    void *outs[2] = {k_out, v_out}, *dev_out[2] = {k_out, v_out};
    bool host = false;
    for (int kv = 0; kv < 2; ++kv)
      if (outs[kv] && !is_device_ptr(outs[kv])) dev_out[kv] = tmp.get(out_bytes), host = true;
    Slot *dslots = static_cast<Slot *>(tmp.get(n * sizeof(Slot)));
    upload(dslots, slots, n * sizeof(Slot), nullptr, 0);
    for (uint64_t t0 = 0; t0 < n; t0 += 65535) {
      const uint64_t cnt = std::min<uint64_t>(n - t0, 65535);
      GatherArgs a{arena_, g_, dslots + t0, {nullptr, nullptr}, dt, {ts[0], ts[1]}};
      for (int kv = 0; kv < 2; ++kv)
        if (dev_out[kv]) a.out[kv] = static_cast<uint8_t *>(dev_out[kv]) + t0 * row * plain_bytes(dt);
      gather_kernel<<<dim3(static_cast<unsigned>(cnt), 2), kThreads, row * sizeof(float), stream_>>>(a);
    }
    check(cudaGetLastError(), "gather kernel launch");
    for (int kv = 0; kv < 2; ++kv)
      if (outs[kv] && dev_out[kv] != outs[kv])
        check(cudaMemcpyAsync(outs[kv], dev_out[kv], out_bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    if (host) check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  void attention(const AttnBatch &b, uint32_t hq, float scale, const void *q, int32_t q_dtype, void *out,
                 int32_t out_dtype, float *lse, const float ts[2]) override {
    Guard gd(index_);
    const uint32_t hd = g_.head_dim, h = g_.kv_heads, group = hq / h;
    // Values per lane: 16 when a part stores 8 bits or fewer (16-byte code
    // loads), else 8 (16-byte f16 loads); 1 for head sizes not a multiple of 8.
    const bool narrow = bits_of(g_.part[0].dtype) <= 8 || bits_of(g_.part[1].dtype) <= 8;
    const int fast = fast_kind();  // a specialized kernel for this storage, or -1
    const int ept = fast >= 0 ? 8 : hd % 16 == 0 && narrow ? 16 : hd % 8 == 0 ? 8 : 1;
    // Query heads per block: must match the kernel instantiated below.
    const uint32_t gm = fast >= 0 || ept == 16 || (ept == 8 && group <= 4) ? 4 : kMaxGroup;
    const uint32_t hchunks = (group + gm - 1) / gm;
    Temp tmp(stream_);
    const uint64_t qbytes = b.n_rows * hq * hd * plain_bytes(q_dtype), obytes = b.n_rows * hq * hd * plain_bytes(out_dtype);
    bool host = false;
    const void *dq = q;
    if (!is_device_ptr(q)) {
      void *d = tmp.get(qbytes);
      check(cudaMemcpyAsync(d, q, qbytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (q)");
      dq = d, host = true;
    }
    void *dout = out;
    if (!is_device_ptr(out)) dout = tmp.get(obytes), host = true;
    float *dlse = lse;
    if (lse && !is_device_ptr(lse)) dlse = static_cast<float *>(tmp.get(b.n_rows * hq * sizeof(float))), host = true;
    // Block ids and per-item metadata in one upload.
    std::vector<uint64_t> meta(b.n_items * 3);
    uint64_t max_n = 0;
    for (uint64_t i = 0; i < b.n_items; ++i) {
      meta[3 * i] = b.block_start[i], meta[3 * i + 1] = b.n_tokens[i], meta[3 * i + 2] = b.q_row[i];
      max_n = std::max(max_n, b.n_tokens[i]);
    }
    const uint64_t meta_bytes = meta.size() * 8 + b.n_blocks * 4;
    uint64_t *dmeta = static_cast<uint64_t *>(tmp.get(meta_bytes + 16));
    int32_t *dblocks = reinterpret_cast<int32_t *>(dmeta + meta.size());
    upload(dmeta, meta.data(), meta.size() * 8, b.block_ids, b.n_blocks * 4);
    // Splits: enough thread blocks for several waves on the device, at
    // least 256 tokens each.
    const uint64_t base = b.n_items * h * hchunks;
    const uint64_t want = (16ull * sms_ + base - 1) / base;
    uint64_t split = std::max<uint64_t>(256, (max_n + want - 1) / std::max<uint64_t>(want, 1));
    split = std::min<uint64_t>(split, 4096);  // bounds the fast kernel's block ids in shared memory
    split = (split + kTile - 1) / kTile * kTile;
    const uint64_t n_splits = std::max<uint64_t>(1, (max_n + split - 1) / split);
    float *ws = static_cast<float *>(tmp.get(b.n_items * hq * n_splits * (hd + 2) * sizeof(float)));
    int bs_shift = -1;
    for (int sh = 0; sh < 31; ++sh)
      if ((1u << sh) == g_.block_size) bs_shift = sh;
    // Fast kernel: tiles of up to kTile tokens, at most 16 KiB per part.
    const uint32_t rk = hd * bits_of(g_.part[0].dtype) / 8, rv = hd * bits_of(g_.part[1].dtype) / 8;
    // 8 KiB per part and tile (32 tokens at head_dim 128 in f16): measured on
    // the H200 against 4 and 16 KiB (more blocks per multiprocessor win).
    const uint32_t tile = std::max<uint32_t>(8, std::min<uint32_t>(kThreads / 2, 8192 / std::max(rk, rv)));
    AttnArgs a{arena_, g_, dblocks, dmeta, dq, q_dtype, scale, hq, group, hchunks,
               static_cast<uint32_t>(split), static_cast<uint32_t>(n_splits), {ts[0], ts[1]}, ws, bs_shift, tile};
    const uint32_t per_tok = (hd + ept - 1) / ept;
    uint32_t L = 1;
    while (L < per_tok) L *= 2;
    size_t red = static_cast<size_t>(kThreads / L) * gm * hd * sizeof(float);
    if (fast >= 0) {  // tiles, then the split's block ids
      red = std::max<size_t>(red, 2ull * tile * (rk + rv) + ((split + g_.block_size - 1) / g_.block_size + 2) * 4);
      set_smem(fast, red);
    }
    for (uint64_t z0 = 0; z0 < b.n_items; z0 += 65535) {
      const uint64_t nz = std::min<uint64_t>(65535, b.n_items - z0);
      AttnArgs c = a;
      c.meta = dmeta + z0 * 3;
      c.ws = ws + z0 * hq * n_splits * (hd + 2);
      const dim3 grid(static_cast<unsigned>(n_splits), h * hchunks, static_cast<unsigned>(nz));
      if (fast == F16) attn_fast_kernel<LoadF16, LoadF16><<<grid, kThreads, red, stream_>>>(c);
      else if (fast == BF16) attn_fast_kernel<LoadBF16, LoadBF16><<<grid, kThreads, red, stream_>>>(c);
      else if (fast == I8) attn_fast_kernel<LoadI8, LoadI8><<<grid, kThreads, red, stream_>>>(c);
      else if (fast == E4M3) attn_fast_kernel<LoadE4M3, LoadE4M3><<<grid, kThreads, red, stream_>>>(c);
      else if (fast == I4) attn_fast_kernel<LoadI4, LoadI4><<<grid, kThreads, red, stream_>>>(c);
      else if (ept == 16) attn_kernel<16, 4><<<grid, kThreads, red, stream_>>>(c);
      else if (ept == 8 && gm == 4) attn_kernel<8, 4><<<grid, kThreads, red, stream_>>>(c);
      else if (ept == 8) attn_kernel<8, kMaxGroup><<<grid, kThreads, red, stream_>>>(c);
      else attn_kernel<1, kMaxGroup><<<grid, kThreads, red, stream_>>>(c);
    }
    check(cudaGetLastError(), "attention kernel launch");
    const uint64_t rows = b.n_items * hq;
    merge_kernel<<<static_cast<unsigned>(rows), std::min<uint32_t>(256, (hd + 31) / 32 * 32), 0, stream_>>>(
        ws, hd, hq, static_cast<uint32_t>(n_splits), dmeta, dout, out_dtype, dlse,
        g_.part[1].quantized ? g_.part[1].rotation : 0u);
    check(cudaGetLastError(), "merge kernel launch");
    if (dout != out) check(cudaMemcpyAsync(out, dout, obytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    if (dlse != lse)
      check(cudaMemcpyAsync(lse, dlse, b.n_rows * hq * sizeof(float), cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    if (host) check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  void move_tokens(const Slot *src, const Slot *dst, uint64_t n) override {
    if (!n) return;
    Guard gd(index_);
    uint64_t tb = 0;
    for (const PartDesc &d : g_.part) {
      const uint64_t head_row = d.quantized ? d.token_stride / g_.kv_heads : g_.head_dim * plain_bytes(d.dtype);
      tb += head_row * g_.kv_heads;
      if (d.quantized) tb += d.scales_per_token * d.scale_bytes * (d.asym ? 2 : 1);
    }
    Temp tmp(stream_);
    Slot *ds = static_cast<Slot *>(tmp.get(2 * n * sizeof(Slot)));
    check(cudaMemcpyAsync(ds, src, n * sizeof(Slot), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    check(cudaMemcpyAsync(ds + n, dst, n * sizeof(Slot), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    uint8_t *stage = static_cast<uint8_t *>(tmp.get(n * tb));
    // Every source is staged before any destination is written (a
    // destination may be another token's source).
    for (int to_stage = 1; to_stage >= 0; --to_stage)
      for (uint64_t i0 = 0; i0 < n; i0 += 65535) {
        const uint64_t cnt = std::min<uint64_t>(n - i0, 65535);
        // Chunk i0: sources ds[i0 + i], destinations ds[n + i0 + i].
        MoveArgs a{arena_, g_, ds + i0, n, stage + i0 * tb, tb, to_stage};
        move_kernel<<<static_cast<unsigned>(cnt), 128, 0, stream_>>>(a);
      }
    check(cudaGetLastError(), "move kernel launch");
  }

  void copy_blocks(const int32_t *blocks, size_t n, void *host, bool to_host) override {
    Guard gd(index_);
    for (size_t i = 0; i < n; ++i) {
      uint8_t *dp = arena_ + static_cast<uint64_t>(blocks[i]) * g_.block_stride;
      uint8_t *hp = static_cast<uint8_t *>(host) + i * g_.block_stride;
      if (to_host) check(cudaMemcpyAsync(hp, dp, g_.block_stride, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
      else check(cudaMemcpyAsync(dp, hp, g_.block_stride, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    }
    cudaPointerAttributes at{};
    const bool pinned = cudaPointerGetAttributes(&at, host) == cudaSuccess && at.type == cudaMemoryTypeHost;
    cudaGetLastError();
    if (!pinned) check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  uint64_t sync() override {
    Guard gd(index_);
    unsigned long long refused = 0;
    check(cudaMemcpyAsync(&refused, flags_, sizeof refused, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    check(cudaMemsetAsync(flags_, 0, sizeof refused, stream_), "cudaMemsetAsync");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return refused;
  }

 private:
  // Stream-ordered temporary device memory, freed at scope exit.
  struct Temp {
    explicit Temp(cudaStream_t s) : s_(s) {}
    ~Temp() {
      for (void *p : ps_) cudaFreeAsync(p, s_);
    }
    void *get(uint64_t bytes) {
      void *p = nullptr;
      check(cudaMallocAsync(&p, bytes ? bytes : 1, s_), "cudaMallocAsync");
      ps_.push_back(p);
      return p;
    }
    cudaStream_t s_;
    std::vector<void *> ps_;
  };
  // Makes the pool's device current for the call and restores the caller's.
  struct Guard {
    explicit Guard(int index) {
      if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
      if (prev_ != index) check(cudaSetDevice(index), "cudaSetDevice");
    }
    ~Guard() {
      int cur = -1;
      if (prev_ >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev_) cudaSetDevice(prev_);
    }
    int prev_ = -1;
  };
  // Copies two host arrays (back to back) to device memory at dst through a
  // page-locked staging buffer, so the copy is queued without the driver's
  // synchronous staging of pageable memory. The buffer is reused once the
  // previous copy from it has completed (an event).
  void upload(void *dst, const void *a, size_t na, const void *b, size_t nb) {
    std::lock_guard<std::mutex> lk(stage_mu_);
    if (stage_event_) check(cudaEventSynchronize(stage_event_), "cudaEventSynchronize");
    else check(cudaEventCreateWithFlags(&stage_event_, cudaEventDisableTiming), "cudaEventCreate");
    if (stage_size_ < na + nb) {
      if (stage_) cudaFreeHost(stage_);
      stage_ = nullptr;
      stage_size_ = 0;
      check(cudaMallocHost(&stage_, std::max<size_t>(na + nb, 1 << 16)), "cudaMallocHost");
      stage_size_ = std::max<size_t>(na + nb, 1 << 16);
    }
    if (na) std::memcpy(stage_, a, na);
    if (nb) std::memcpy(static_cast<uint8_t *>(stage_) + na, b, nb);
    check(cudaMemcpyAsync(dst, stage_, na + nb, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    check(cudaEventRecord(stage_event_, stream_), "cudaEventRecord");
  }
  // Lets the fast kernel use more than 48 KiB of dynamic shared memory (set
  // once per kernel and size).
  void set_smem(int fast, size_t bytes) {
    std::lock_guard<std::mutex> lk(stage_mu_);
    if (smem_set_[fast & 7] >= bytes) return;
    smem_set_[fast & 7] = bytes;
    cudaError_t e = cudaSuccess;
    const int b = static_cast<int>(bytes);
    switch (fast) {
      case F16: e = cudaFuncSetAttribute(attn_fast_kernel<LoadF16, LoadF16>, cudaFuncAttributeMaxDynamicSharedMemorySize, b); break;
      case BF16: e = cudaFuncSetAttribute(attn_fast_kernel<LoadBF16, LoadBF16>, cudaFuncAttributeMaxDynamicSharedMemorySize, b); break;
      case I8: e = cudaFuncSetAttribute(attn_fast_kernel<LoadI8, LoadI8>, cudaFuncAttributeMaxDynamicSharedMemorySize, b); break;
      case E4M3: e = cudaFuncSetAttribute(attn_fast_kernel<LoadE4M3, LoadE4M3>, cudaFuncAttributeMaxDynamicSharedMemorySize, b); break;
      default: e = cudaFuncSetAttribute(attn_fast_kernel<LoadI4, LoadI4>, cudaFuncAttributeMaxDynamicSharedMemorySize, b); break;
    }
    check(e, "cudaFuncSetAttribute");
  }
  // The storage the specialized attention kernel handles: K and V of one
  // dtype among f16, bf16, int8, fp8 e4m3 and int4 (symmetric, one scale per
  // 8 values), head_dim / 8 a power of two from 4 to 32; else -1.
  int fast_kind() const {
    const uint32_t hd = g_.head_dim;
    if (hd % 8 != 0 || hd / 8 < 4 || hd / 8 > 32 || ((hd / 8) & (hd / 8 - 1))) return -1;
    if ((hd * bits_of(g_.part[0].dtype) / 8) % 16 != 0) return -1;  // whole 16-byte copies per row
    const PartDesc &k = g_.part[0], &v = g_.part[1];
    if (k.dtype != v.dtype || k.quantized != v.quantized) return -1;
    if (!k.quantized) return k.dtype == F16 || k.dtype == BF16 ? k.dtype : -1;
    if (k.dtype != I8 && k.dtype != E4M3 && k.dtype != I4) return -1;
    for (const PartDesc *d : {&k, &v}) {
      if (d->asym) return -1;
      if (d->gran == G_GROUP && d->group % 8 != 0) return -1;
      if (d->gran != G_TOKEN && d->gran != G_TENSOR && d->gran != G_GROUP) return -1;
    }
    return k.dtype;
  }
  // Values per lane of append_warp_kernel, or 0 where it does not apply.
  int warp_vpl() const {
    const uint32_t hd = g_.head_dim;
    if (hd % 32 != 0 || hd > 256) return 0;
    const int vpl = static_cast<int>(hd / 32);
    if (vpl == 3 || vpl > 4 && vpl != 8) return 0;  // 1, 2, 4 or 8 values
    for (const PartDesc &d : g_.part) {
      if (!d.quantized) continue;
      if (d.rotation > 1) return 0;
      if ((vpl * bits_of(d.dtype)) % 8 != 0) return 0;
      if (d.gran == G_GROUP) {
        if (hd % d.group != 0 || d.group % vpl != 0) return 0;
        const uint32_t lanes = d.group / vpl;
        if (lanes & (lanes - 1)) return 0;
      } else if (d.gran != G_TOKEN && d.gran != G_TENSOR) {
        return 0;
      }
    }
    return vpl;
  }
  uint32_t max_groups() const {
    uint32_t m = 1;
    for (const PartDesc &d : g_.part) {
      if (d.gran == G_TOKEN) m = std::max(m, g_.kv_heads);
      if (d.gran == G_GROUP) m = std::max(m, (g_.kv_heads * g_.head_dim + d.group - 1) / d.group);
    }
    return m;
  }

  int index_;
  Geometry g_;
  std::mutex stage_mu_;
  void *stage_ = nullptr;  // page-locked staging of per-call metadata
  size_t stage_size_ = 0;
  cudaEvent_t stage_event_ = nullptr;
  size_t smem_set_[8] = {};
  uint8_t *arena_ = nullptr;
  unsigned long long *flags_ = nullptr;  // appends refused since the last sync()
  cudaStream_t own_ = nullptr, stream_ = nullptr;
  int sms_ = 132;
};

}  // namespace

bool Device::compiled() { return true; }

std::unique_ptr<Device> Device::open(int index, uint64_t bytes, const Geometry &g) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail(Errc::DeviceUnavailable, std::string("no usable CUDA device: ") + cudaGetErrorString(e));
  }
  if (index < 0 || index >= count)
    fail(Errc::DeviceUnavailable, "CUDA device " + std::to_string(index) + " does not exist (this machine has " +
                                      std::to_string(count) + ")");
  return std::make_unique<CudaDevice>(index, bytes, g);
}

}  // namespace kvc::cuda
