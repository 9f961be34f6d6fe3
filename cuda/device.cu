// The Device object (device.cuh): construction and destruction, the stream,
// zeroing and copies inside the arena, metadata uploads, sync(), and
// Device::open() / compiled(). Compiled with -fmad=false as every .cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

#include "common/error.h"
#include "device.cuh"

namespace kvc::cuda {

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

CudaDevice::CudaDevice(int index, uint64_t bytes, const Geometry &g) : index_(index), g_(g) {
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
    fail(Errc::OutOfMemory, "CUDA device " + std::to_string(index) + ": cannot allocate " +
                                u64s(bytes) + " bytes of block memory (" + cudaGetErrorString(e) +
                                ")");
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

CudaDevice::~CudaDevice() {
  Guard gd(index_);
  cudaStreamSynchronize(stream_);
  if (stage_event_) cudaEventDestroy(stage_event_);
  if (stage_) cudaFreeHost(stage_);
  cudaFree(arena_);
  cudaFree(flags_);
  cudaStreamDestroy(own_);
}

void CudaDevice::set_stream(void *s) {
  Guard gd(index_);
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");  // work queued so far comes first
  stream_ = static_cast<cudaStream_t>(s);
}

void CudaDevice::zero(uint64_t off, uint64_t n) {
  Guard gd(index_);
  check(cudaMemsetAsync(arena_ + off, 0, n, stream_), "cudaMemsetAsync");
}

void CudaDevice::copy(uint64_t dst, uint64_t src, uint64_t n) {
  Guard gd(index_);
  check(cudaMemcpyAsync(arena_ + dst, arena_ + src, n, cudaMemcpyDeviceToDevice, stream_),
        "cudaMemcpyAsync");
}

uint64_t CudaDevice::sync() {
  Guard gd(index_);
  unsigned long long refused = 0;
  check(cudaMemcpyAsync(&refused, flags_, sizeof refused, cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync");
  check(cudaMemsetAsync(flags_, 0, sizeof refused, stream_), "cudaMemsetAsync");
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  return refused;
}

void CudaDevice::upload(void *dst, const void *a, size_t na, const void *b, size_t nb) {
  std::lock_guard<std::mutex> lk(stage_mu_);
  if (stage_event_)
    check(cudaEventSynchronize(stage_event_), "cudaEventSynchronize");
  else
    check(cudaEventCreateWithFlags(&stage_event_, cudaEventDisableTiming), "cudaEventCreate");
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

bool Device::compiled() {
  return true;
}

std::unique_ptr<Device> Device::open(int index, uint64_t bytes, const Geometry &g) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail(Errc::DeviceUnavailable, std::string("no usable CUDA device: ") + cudaGetErrorString(e));
  }
  if (index < 0 || index >= count)
    fail(Errc::DeviceUnavailable, "CUDA device " + std::to_string(index) +
                                      " does not exist (this machine has " + std::to_string(count) +
                                      ")");
  return std::make_unique<CudaDevice>(index, bytes, g);
}

}  // namespace kvc::cuda
