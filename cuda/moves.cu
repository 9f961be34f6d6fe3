// Token moves (eviction compaction: every source staged before any
// destination is written) and whole-block copies to and from host memory
// (swaps). Compiled with -fmad=false as every .cu.
#include <cuda_runtime.h>

#include <algorithm>

#include "device.cuh"
#include "dtype.cuh"

namespace kvc::cuda {

namespace {

// ---- token moves (eviction compaction) -------------------------------------
struct MoveArgs {
  uint8_t *arena;
  Geometry g;
  const Slot *slots;  // [n] sources then [n] destinations
  uint64_t n;
  uint8_t *stage;  // [n][token_bytes]
  uint64_t token_bytes;
  int to_stage;
};

// Byte b of a token's record: each part's codes (head by head for plain
// HND storage), then its scales and zero points.
__device__ uint8_t *token_byte(const Geometry &g, uint8_t *blk, uint32_t s, uint64_t b) {
  for (int kv = 0; kv < 2; ++kv) {
    const PartDesc &d = g.part[kv];
    const uint64_t head_row =
        d.quantized ? d.token_stride / g.kv_heads : g.head_dim * plain_bytes(d.dtype);
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
    if (a.to_stage)
      a.stage[i * a.token_bytes + b] = *p;
    else
      *p = a.stage[i * a.token_bytes + b];
  }
}

}  // namespace

void CudaDevice::move_tokens(const Slot *src, const Slot *dst, uint64_t n) {
  if (!n) return;
  Guard gd(index_);
  uint64_t tb = 0;
  for (const PartDesc &d : g_.part) {
    const uint64_t head_row =
        d.quantized ? d.token_stride / g_.kv_heads : g_.head_dim * plain_bytes(d.dtype);
    tb += head_row * g_.kv_heads;
    if (d.quantized) tb += d.scales_per_token * d.scale_bytes * (d.asym ? 2 : 1);
  }
  Temp tmp(stream_);
  Slot *ds = static_cast<Slot *>(tmp.get(2 * n * sizeof(Slot)));
  check(cudaMemcpyAsync(ds, src, n * sizeof(Slot), cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync");
  check(cudaMemcpyAsync(ds + n, dst, n * sizeof(Slot), cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync");
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

void CudaDevice::copy_blocks(const int32_t *blocks, size_t n, void *host, bool to_host) {
  Guard gd(index_);
  for (size_t i = 0; i < n; ++i) {
    uint8_t *dp = arena_ + static_cast<uint64_t>(blocks[i]) * g_.block_stride;
    uint8_t *hp = static_cast<uint8_t *>(host) + i * g_.block_stride;
    if (to_host)
      check(cudaMemcpyAsync(hp, dp, g_.block_stride, cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync");
    else
      check(cudaMemcpyAsync(dp, hp, g_.block_stride, cudaMemcpyHostToDevice, stream_),
            "cudaMemcpyAsync");
  }
  cudaPointerAttributes at{};
  const bool pinned =
      cudaPointerGetAttributes(&at, host) == cudaSuccess && at.type == cudaMemoryTypeHost;
  cudaGetLastError();
  if (!pinned) check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

}  // namespace kvc::cuda
