// The specialized attention kernel: K and V of one storage known at compile
// time (f16, bf16, int8, fp8 e4m3, int4), tiles copied into shared memory with
// cp.async (double buffering). Writes each split's softmax state for
// attention.cu's merge. Compiled with -fmad=false as every .cu.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <mutex>

#include "attention.cuh"
#include "codec.cuh"
#include "device.cuh"
#include "dtype.cuh"

namespace kvc::cuda {

namespace {

// ---- specialized attention: storage known at compile time ----------------
// Loaders of 8 consecutive values of one head row (d0 a multiple of 8).
// Quantized loaders take one scale for the 8 values (per-token, per-tensor,
// or per-group with group_size a multiple of 8) and symmetric codes.
__device__ inline float scale_at(const PartDesc &d, const uint8_t *blk, uint32_t s, uint32_t head,
                                 uint32_t d0, uint32_t hd, float ts) {
  if (d.gran == G_TENSOR) return ts;
  const uint32_t gi = d.gran == G_TOKEN ? head : (head * hd + d0) / d.group;
  return load_scale(blk + d.scale_offset + (s * d.scales_per_token + gi) * d.scale_bytes,
                    d.scale_f16);
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
    for (int i = 0; i < 4; ++i)
      v[2 * i] = __uint_as_float(w[i] << 16), v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
};
struct LoadI8 {
  static constexpr int kBits = 8;
  static constexpr bool kQuant = true;
  static __device__ void load(const uint8_t *p, float sc, float *v) {
    const uint2 u = *reinterpret_cast<const uint2 *>(p);
    const uint32_t w[2] = {u.x, u.y};
#pragma unroll
    for (int i = 0; i < 8; ++i)
      v[i] = static_cast<float>(static_cast<int8_t>(w[i / 4] >> (8 * (i % 4)))) * sc;
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
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(w[i / 2] >> (16 * (i % 2))), __NV_E4M3);
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
    for (int i = 0; i < 8;
         ++i)  // 2^23 + nibble as a float, minus 2^23 + 8: the signed code, exactly
      v[i] = (__uint_as_float(0x4b000000u | ((w >> (4 * i)) & 0xfu)) - 8388616.0f) * sc;
  }
};

__device__ inline void cp_async16(void *dst, const void *src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}
__device__ inline void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
__device__ inline void cp_async_wait1() {
  asm volatile("cp.async.wait_group 1;\n" ::);
}

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
  const uint32_t T = a.tile;                                        // tokens per tile (<= kTile)

  __shared__ float q_s[GM][256];
  __shared__ float sc[GM][kTile];
  __shared__ float m_s[GM], l_s[GM], alpha_s[GM];
  extern __shared__ __align__(16)
      uint8_t dyn[];  // K tiles [2][T][rk], V tiles [2][T][rv]; later the reduction
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
    if (bsh >= 0)
      b = t >> bsh, slot = t & (bs - 1);
    else
      b = t / bs, slot = t - b * bs;
    return a.arena + static_cast<uint64_t>(ids_s[b - b0]) * g.block_stride;
  };
  // Queues the copies of tile `t0` into buffer `buf` (one commit group).
  // Each thread copies one fixed 16-byte chunk of a row (K: chunk ck_part of
  // tokens ck_tok0, ck_tok0 + ck_step, ...; V likewise): no division per copy.
  const uint32_t ck = rk / 16, cv = rv / 16;  // chunks per row, <= kThreads
  const uint32_t ck_part = threadIdx.x % ck, ck_tok0 = threadIdx.x / ck, ck_step = kThreads / ck;
  const uint32_t cv_part = threadIdx.x % cv, cv_tok0 = threadIdx.x / cv, cv_step = kThreads / cv;
  const uint64_t k_off = dk.offset + kh * dk.head_stride + ck_part * 16,
                 v_off = dv.offset + kh * dv.head_stride + cv_part * 16;
  // Queues the copies of tile `t0` into buffer `buf` (one commit group).
  auto issue = [&](uint32_t t0, int buf) {
    const uint32_t nt = min(T, t_end - t0);
    if (threadIdx.x < ck * ck_step)
      for (uint32_t tok = ck_tok0; tok < nt; tok += ck_step) {
        uint32_t slot;
        const uint8_t *blk = token_blk(t0 + tok, slot);
        cp_async16(kbuf + (buf * T + tok) * rk + ck_part * 16,
                   blk + k_off + slot * dk.token_stride);
      }
    if (threadIdx.x < cv * cv_step)
      for (uint32_t tok = cv_tok0; tok < nt; tok += cv_step) {
        uint32_t slot;
        const uint8_t *blk = token_blk(t0 + tok, slot);
        cp_async16(vbuf + (buf * T + tok) * rv + cv_part * 16,
                   blk + v_off + slot * dv.token_stride);
      }
    cp_async_commit();
  };
  // Per-token scales of quantized parts ([2 parts][2 buffers][T]), loaded
  // one tile ahead into registers and stored after the current tile.
  __shared__ float ssc[2][2][kTile];
  const bool kq_tok = KL::kQuant && dk.gran == G_TOKEN, vq_tok = VL::kQuant && dv.gran == G_TOKEN;
  float pend = 0.0f;
  int pend_idx = -1;
  auto fetch_scale = [&](uint32_t t0,
                         int buf) {  // one scale per thread at most (2 x T <= kThreads)
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
    pend = load_scale(blk + d.scale_offset + (slot * d.scales_per_token + kh) * d.scale_bytes,
                      d.scale_f16);
    pend_idx = (kv * 2 + buf) * kTile + tok;
  };
  auto store_scale_s = [&]() {
    if (pend_idx >= 0) (&ssc[0][0][0])[pend_idx] = pend;
  };

  for (uint32_t i = threadIdx.x; i < GM * hd; i += kThreads) {
    const uint32_t gi = i / hd, e = i % hd;
    q_s[gi][e] =
        gi < ng ? load_src(a.q, a.q_dtype, (qrow * a.hq + qh0 + gi) * hd + e) * a.scale : 0.0f;
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
        if ((ln & (quarter - 1)) == 0 && tt < nt && my_head < ng)
          sc[my_head][tt] = fminf(FLT_MAX, fmaxf(-FLT_MAX, r));
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

}  // namespace

void launch_attn_fast(int fast, dim3 grid, size_t red, cudaStream_t stream_, const AttnArgs &c) {
  if (fast == F16)
    attn_fast_kernel<LoadF16, LoadF16><<<grid, kThreads, red, stream_>>>(c);
  else if (fast == BF16)
    attn_fast_kernel<LoadBF16, LoadBF16><<<grid, kThreads, red, stream_>>>(c);
  else if (fast == I8)
    attn_fast_kernel<LoadI8, LoadI8><<<grid, kThreads, red, stream_>>>(c);
  else if (fast == E4M3)
    attn_fast_kernel<LoadE4M3, LoadE4M3><<<grid, kThreads, red, stream_>>>(c);
  else if (fast == I4)
    attn_fast_kernel<LoadI4, LoadI4><<<grid, kThreads, red, stream_>>>(c);
}

void CudaDevice::set_smem(int fast, size_t bytes) {
  std::lock_guard<std::mutex> lk(stage_mu_);
  if (smem_set_[fast & 7] >= bytes) return;
  smem_set_[fast & 7] = bytes;
  cudaError_t e = cudaSuccess;
  const int b = static_cast<int>(bytes);
  switch (fast) {
    case F16:
      e = cudaFuncSetAttribute(attn_fast_kernel<LoadF16, LoadF16>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, b);
      break;
    case BF16:
      e = cudaFuncSetAttribute(attn_fast_kernel<LoadBF16, LoadBF16>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, b);
      break;
    case I8:
      e = cudaFuncSetAttribute(attn_fast_kernel<LoadI8, LoadI8>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, b);
      break;
    case E4M3:
      e = cudaFuncSetAttribute(attn_fast_kernel<LoadE4M3, LoadE4M3>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, b);
      break;
    default:
      e = cudaFuncSetAttribute(attn_fast_kernel<LoadI4, LoadI4>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, b);
      break;
  }
  check(e, "cudaFuncSetAttribute");
}

int CudaDevice::fast_kind() const {
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

}  // namespace kvc::cuda
