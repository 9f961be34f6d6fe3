// Quantize-on-write: append() converts K/V rows to f32, checks them
// (quantized parts), applies the Hadamard rotation, computes scales and
// writes codes into the rows' slots (a block per token, or a warp per token
// and head in the common case); absmax() calibrates a dynamic per-tensor
// scale. The same float operations as src/codec (codec.cuh; -fmad=false), so
// the bytes equal the CPU pool's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#include "codec.cuh"
#include "common/error.h"
#include "device.cuh"
#include "dtype.cuh"

namespace kvc::cuda {

namespace {

// ---- append --------------------------------------------------------------
struct AppendArgs {
  uint8_t *arena;
  Geometry g;
  const Slot *slots;
  const void *src[2];
  int32_t src_dtype;
  float ts[2];
  int *bad;           // set by check_kernel: the whole call writes nothing
  int parts;          // bit 0: write K, bit 1: write V
  int bs_shift = -1;  // log2(block_size) when a power of two
};

// Flags NaN / Inf (and values too large to rotate) in the rows of quantized parts.
// limit: FLT_MAX / rotation block (src/codec's check_rotatable), 0 without a rotation.
__global__ void check_kernel(const void *src, int32_t dt, uint64_t count, float limit, int *bad,
                             unsigned long long *refused) {
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
  for (uint32_t e = threadIdx.x; e < row; e += blockDim.x)
    x[e] = load_src(a.src[kv], a.src_dtype, t * row + e);
  __syncthreads();
  if (!d.quantized) {
    for (uint32_t e = threadIdx.x; e < row; e += blockDim.x) {
      const uint32_t head = e / g.head_dim, i = e % g.head_dim;
      store_plain(
          blk + d.offset + head * d.head_stride + s * d.token_stride + i * plain_bytes(d.dtype),
          d.dtype, x[e]);
    }
    return;
  }
  if (d.rotation) hadamard_smem(x, row, d.rotation);
  // Parameters of each scale group: a warp per group.
  float *gs = sm + row;  // [ng] scales, then [ng] zero points
  uint32_t ng = 1, glen = row;
  if (d.gran == G_TOKEN)
    ng = g.kv_heads, glen = g.head_dim;
  else if (d.gran == G_GROUP)
    ng = (row + d.group - 1) / d.group, glen = d.group;
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
      if (d.gran == G_TENSOR)
        p = tensor_params(gs[0]);
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
      for (int j = 0; j < 4; ++j)
        h[2 * j] = static_cast<uint16_t>(w[j]), h[2 * j + 1] = static_cast<uint16_t>(w[j] >> 16);
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
  const uint32_t units =
      static_cast<uint32_t>(n) * g.kv_heads * 2;  // < 2^31 (the host splits larger calls)
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
    load_run<VPL>(a.src[kv], a.src_dtype, (static_cast<uint64_t>(t) * g.kv_heads + head) * hd + d0,
                  x);
    if (!d.quantized) {
      uint8_t *o =
          blk + d.offset + head * d.head_stride + s * d.token_stride + d0 * plain_bytes(d.dtype);
      if (d.dtype != F32 && VPL >= 4 && (reinterpret_cast<uintptr_t>(o) & (2 * VPL - 1)) == 0) {
        uint32_t w[VPL / 2 + 1] = {};
#pragma unroll
        for (int j = 0; j < VPL / 2; ++j) {
          const uint32_t lo = d.dtype == F16 ? f2h(x[2 * j]) : f2bf(x[2 * j]);
          const uint32_t hi = d.dtype == F16 ? f2h(x[2 * j + 1]) : f2bf(x[2 * j + 1]);
          w[j] = lo | hi << 16;
        }
        if (VPL == 8)
          *reinterpret_cast<uint4 *>(o) =
              make_uint4(w[0], w[1], w[VPL >= 8 ? 2 : 0], w[VPL >= 8 ? 3 : 0]);
        else
          *reinterpret_cast<uint2 *>(o) = make_uint2(w[0], w[1]);
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

// Absolute maximum of rotated rows (dynamic per-tensor calibration).
__global__ void absmax_kernel(const void *src, int32_t dt, uint32_t row, uint32_t rot,
                              unsigned int *out) {
  extern __shared__ float sm[];
  const uint64_t t = blockIdx.x;
  for (uint32_t e = threadIdx.x; e < row; e += blockDim.x) sm[e] = load_src(src, dt, t * row + e);
  __syncthreads();
  if (rot) hadamard_smem(sm, row, rot);
  float m = 0.0f;
  for (uint32_t e = threadIdx.x; e < row; e += blockDim.x) m = fmaxf(m, fabsf(sm[e]));
  atomicMax(out, __float_as_uint(m));  // non-negative floats order as their bits
}

}  // namespace

void CudaDevice::append(const Slot *slots, uint64_t n, const void *k, const void *v,
                        int32_t src_dtype, const float ts[2], int parts) {
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
      check(cudaMemcpyAsync(d, src[kv], in_bytes, cudaMemcpyHostToDevice, stream_),
            "cudaMemcpyAsync (K/V rows)");
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
    const unsigned blocks =
        static_cast<unsigned>(std::min<uint64_t>((count + 255) / 256, 64ull * sms_));
    check_kernel<<<blocks, 256, 0, stream_>>>(src[kv], src_dtype, count, limit, bad, flags_);
  }
  AppendArgs a{arena_, g_, dslots, {src[0], src[1]}, src_dtype, {ts[0], ts[1]}, bad, parts};
  for (int sh = 0; sh < 31; ++sh)
    if ((1u << sh) == g_.block_size) a.bs_shift = sh;
  const int vpl = warp_vpl();
  if (vpl) {
    const uint64_t per =
        (uint64_t(1) << 30) / (g_.kv_heads * 2);  // tokens per launch: 32-bit unit indices
    for (uint64_t t0 = 0; t0 < n; t0 += per) {
      const uint64_t cnt = std::min(per, n - t0);
      AppendArgs b = a;
      b.slots = dslots + t0;
      for (int kv = 0; kv < 2; ++kv)
        if (src[kv])
          b.src[kv] = static_cast<const uint8_t *>(src[kv]) + t0 * row * plain_bytes(src_dtype);
      const uint64_t warps = cnt * g_.kv_heads * 2;
      const unsigned blocks =
          static_cast<unsigned>(std::min<uint64_t>((warps * 32 + 255) / 256, 32ull * sms_));
      switch (vpl) {
        case 1:
          append_warp_kernel<1><<<blocks, 256, 0, stream_>>>(b, cnt);
          break;
        case 2:
          append_warp_kernel<2><<<blocks, 256, 0, stream_>>>(b, cnt);
          break;
        case 4:
          append_warp_kernel<4><<<blocks, 256, 0, stream_>>>(b, cnt);
          break;
        default:
          append_warp_kernel<8><<<blocks, 256, 0, stream_>>>(b, cnt);
          break;
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
      if (src[kv])
        b.src[kv] = static_cast<const uint8_t *>(src[kv]) + t0 * row * plain_bytes(src_dtype);
    append_kernel<<<dim3(static_cast<unsigned>(cnt), 2), kThreads, smem, stream_>>>(b);
  }
  check(cudaGetLastError(), "append kernel launch");
  if (host) check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

float CudaDevice::absmax(int kv, uint64_t n, const void *src, int32_t dt) {
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
  check_kernel<<<static_cast<unsigned>(std::min<uint64_t>((total + 255) / 256, 4096)), 256, 0,
                 stream_>>>(src, dt, total, rot ? FLT_MAX / static_cast<float>(rot) : 0.0f, bad,
                            count);
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
    fail(Errc::NonFinite,
         std::string(kv ? "v" : "k") +
             " holds NaN, Inf or a value too large to rotate: nothing was written");
  return f;
}

int CudaDevice::warp_vpl() const {
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

uint32_t CudaDevice::max_groups() const {
  uint32_t m = 1;
  for (const PartDesc &d : g_.part) {
    if (d.gran == G_TOKEN) m = std::max(m, g_.kv_heads);
    if (d.gran == G_GROUP) m = std::max(m, (g_.kv_heads * g_.head_dim + d.group - 1) / d.group);
  }
  return m;
}

}  // namespace kvc::cuda
