// gather(): decodes tokens' slots back into rows (inverse rotation,
// conversion to the caller's dtype). Compiled with -fmad=false as every .cu.
#include <cuda_runtime.h>

#include <algorithm>

#include "codec.cuh"
#include "device.cuh"
#include "dtype.cuh"

namespace kvc::cuda {

namespace {

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
  for (uint32_t e = threadIdx.x; e < row; e += blockDim.x)
    sm[e] = read_elem(g, kv, blk, s, e, a.ts[kv]);
  __syncthreads();
  if (d.quantized && d.rotation) hadamard_smem(sm, row, d.rotation);
  uint8_t *o = static_cast<uint8_t *>(a.out[kv]) + t * row * plain_bytes(a.dst_dtype);
  for (uint32_t e = threadIdx.x; e < row; e += blockDim.x)
    store_plain(o + e * plain_bytes(a.dst_dtype), a.dst_dtype, sm[e]);
}

}  // namespace

void CudaDevice::gather(const Slot *slots, uint64_t n, void *k_out, void *v_out, int32_t dt,
                        const float ts[2]) {
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
    gather_kernel<<<dim3(static_cast<unsigned>(cnt), 2), kThreads, row * sizeof(float), stream_>>>(
        a);
  }
  check(cudaGetLastError(), "gather kernel launch");
  for (int kv = 0; kv < 2; ++kv)
    if (outs[kv] && dev_out[kv] != outs[kv])
      check(cudaMemcpyAsync(outs[kv], dev_out[kv], out_bytes, cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync");
  if (host) check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

}  // namespace kvc::cuda
