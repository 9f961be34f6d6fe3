// Shared by attention.cu and attention_fast.cu: the attention kernels'
// arguments and tile sizes, and the launch of the specialized kernel.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend.h"

namespace kvc::cuda {

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
  float *ws;      // [items][hq][n_splits][hd + 2]: acc, m, l
  int bs_shift;   // log2(block_size) when a power of two, else -1
  uint32_t tile;  // attn_fast_kernel: tokens per shared-memory tile
};

// Launches attn_fast_kernel for the storage `fast` (CudaDevice::fast_kind(),
// >= 0) with `smem` bytes of dynamic shared memory.
void launch_attn_fast(int fast, dim3 grid, size_t smem, cudaStream_t stream, const AttnArgs &c);

}  // namespace kvc::cuda
