// Paged decode / prefill attention (FlashDecoding): each item's tokens are
// split across thread blocks (attn_kernel, any storage; attention_fast.cu for
// the common storages), and merge_kernel combines the splits' softmax states
// by log-sum-exp. Prefill runs as a decode batch of its query rows, each
// seeing its causal prefix. Compiled with -fmad=false as every .cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "attention.cuh"
#include "codec.cuh"
#include "device.cuh"
#include "dtype.cuh"

namespace kvc::cuda {

namespace {

// Loads the EPT consecutive values [d0, d0 + EPT) of one head's row with
// vector loads (16 bytes where the storage allows), decoding codes.
template <int EPT>
__device__ inline void load_vals(const Geometry &g, int kv, const uint8_t *blk, uint32_t s,
                                 uint32_t head, uint32_t d0, float ts, float *v) {
  const PartDesc &d = g.part[kv];
  if (EPT > 1 && !d.quantized) {
    const uint8_t *p =
        blk + d.offset + head * d.head_stride + s * d.token_stride + d0 * plain_bytes(d.dtype);
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
  if (EPT > 1 &&
      (d.gran == G_TOKEN || d.gran == G_TENSOR || (d.gran == G_GROUP && d.group % EPT == 0))) {
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
__global__ void __launch_bounds__(kThreads, EPT *GM > 32 ? 3 : 4) attn_kernel(AttnArgs a) {
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
    if (bsh >= 0)
      b = t >> bsh, slot = t & (bs - 1);
    else
      b = t / bs, slot = t - b * bs;
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
    const uint32_t bound =
        (nt + step - 1) / step * step;  // every lane runs the same iterations (shuffles)
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

// Merges the splits of each (item, query head) by log-sum-exp and writes the
// output rows (and lse).
// Values stored rotated (H v): the output is rotated back (H is its own inverse).
__global__ void merge_kernel(const float *ws, uint32_t hd, uint32_t hq, uint32_t n_splits,
                             const uint64_t *meta, void *out, int32_t out_dtype, float *lse,
                             uint32_t v_rotation) {
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
  for (uint32_t e = threadIdx.x; e < hd; e += blockDim.x)
    store_plain(o + e * plain_bytes(out_dtype), out_dtype, o_s[e]);
  if (lse && threadIdx.x == 0) lse[qrow * hq + qh] = L > 0.0f ? M + logf(L) : -INFINITY;
}

}  // namespace

void CudaDevice::attention(const AttnBatch &b, uint32_t hq, float scale, const void *q,
                           int32_t q_dtype, void *out, int32_t out_dtype, float *lse,
                           const float ts[2]) {
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
  const uint64_t qbytes = b.n_rows * hq * hd * plain_bytes(q_dtype),
                 obytes = b.n_rows * hq * hd * plain_bytes(out_dtype);
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
  if (lse && !is_device_ptr(lse))
    dlse = static_cast<float *>(tmp.get(b.n_rows * hq * sizeof(float))), host = true;
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
  const uint32_t tile =
      std::max<uint32_t>(8, std::min<uint32_t>(kThreads / 2, 8192 / std::max(rk, rv)));
  AttnArgs a{arena_,
             g_,
             dblocks,
             dmeta,
             dq,
             q_dtype,
             scale,
             hq,
             group,
             hchunks,
             static_cast<uint32_t>(split),
             static_cast<uint32_t>(n_splits),
             {ts[0], ts[1]},
             ws,
             bs_shift,
             tile};
  const uint32_t per_tok = (hd + ept - 1) / ept;
  uint32_t L = 1;
  while (L < per_tok) L *= 2;
  size_t red = static_cast<size_t>(kThreads / L) * gm * hd * sizeof(float);
  if (fast >= 0) {  // tiles, then the split's block ids
    red = std::max<size_t>(
        red, 2ull * tile * (rk + rv) + ((split + g_.block_size - 1) / g_.block_size + 2) * 4);
    set_smem(fast, red);
  }
  for (uint64_t z0 = 0; z0 < b.n_items; z0 += 65535) {
    const uint64_t nz = std::min<uint64_t>(65535, b.n_items - z0);
    AttnArgs c = a;
    c.meta = dmeta + z0 * 3;
    c.ws = ws + z0 * hq * n_splits * (hd + 2);
    const dim3 grid(static_cast<unsigned>(n_splits), h * hchunks, static_cast<unsigned>(nz));
    if (fast >= 0)
      launch_attn_fast(fast, grid, red, stream_, c);
    else if (ept == 16)
      attn_kernel<16, 4><<<grid, kThreads, red, stream_>>>(c);
    else if (ept == 8 && gm == 4)
      attn_kernel<8, 4><<<grid, kThreads, red, stream_>>>(c);
    else if (ept == 8)
      attn_kernel<8, kMaxGroup><<<grid, kThreads, red, stream_>>>(c);
    else
      attn_kernel<1, kMaxGroup><<<grid, kThreads, red, stream_>>>(c);
  }
  check(cudaGetLastError(), "attention kernel launch");
  const uint64_t rows = b.n_items * hq;
  merge_kernel<<<static_cast<unsigned>(rows), std::min<uint32_t>(256, (hd + 31) / 32 * 32), 0,
                 stream_>>>(ws, hd, hq, static_cast<uint32_t>(n_splits), dmeta, dout, out_dtype,
                            dlse, g_.part[1].quantized ? g_.part[1].rotation : 0u);
  check(cudaGetLastError(), "merge kernel launch");
  if (dout != out)
    check(cudaMemcpyAsync(out, dout, obytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
  if (dlse != lse)
    check(
        cudaMemcpyAsync(lse, dlse, b.n_rows * hq * sizeof(float), cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync");
  if (host) check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

}  // namespace kvc::cuda
