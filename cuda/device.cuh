// The Device object of a CUDA pool (backend.h's interface): block memory, its
// stream, temporaries and copies. Each method is defined beside the kernels it
// launches:
//   device.cu          construction, the stream, zeroing and copies inside the
//                      arena, metadata uploads, sync(), Device::open()
//   append.cu          append() and absmax(): quantize-on-write
//   gather.cu          gather()
//   attention.cu       attention(): paged decode / prefill attention, split +
//                      log-sum-exp merge
//   attention_fast.cu  the specialized attention kernel (storage known at
//                      compile time)
//   moves.cu           move_tokens() (eviction compaction), copy_blocks()
//                      (swaps to and from host memory)
// Device helpers shared by the kernels: dtype.cuh (element types) and
// codec.cuh (src/codec's float operations).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "backend.h"
#include "common/strings.h"

namespace kvc::cuda {

// Threads per block of the row kernels (append, gather, absmax) and of attention.
constexpr int kThreads = 128;

// Throws Error for a failed CUDA call: OutOfMemory for an allocation, else Internal.
void check(cudaError_t e, const char *what);
// Whether p points to device (or managed) memory.
bool is_device_ptr(const void *p);

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, uint64_t bytes, const Geometry &g);
  ~CudaDevice() override;
  uint8_t *arena() const override { return arena_; }
  void set_stream(void *s) override;
  void *stream() const override { return stream_; }

  void zero(uint64_t off, uint64_t n) override;
  void copy(uint64_t dst, uint64_t src, uint64_t n) override;

  void append(const Slot *slots, uint64_t n, const void *k, const void *v, int32_t src_dtype,
              const float ts[2], int parts) override;
  float absmax(int kv, uint64_t n, const void *src, int32_t dt) override;
  void gather(const Slot *slots, uint64_t n, void *k_out, void *v_out, int32_t dt,
              const float ts[2]) override;
  void attention(const AttnBatch &b, uint32_t hq, float scale, const void *q, int32_t q_dtype,
                 void *out, int32_t out_dtype, float *lse, const float ts[2]) override;
  void move_tokens(const Slot *src, const Slot *dst, uint64_t n) override;
  void copy_blocks(const int32_t *blocks, size_t n, void *host, bool to_host) override;
  uint64_t sync() override;

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
  void upload(void *dst, const void *a, size_t na, const void *b, size_t nb);
  // Lets the fast kernel use more than 48 KiB of dynamic shared memory (set
  // once per kernel and size).
  void set_smem(int fast, size_t bytes);
  // The storage the specialized attention kernel handles: K and V of one
  // dtype among f16, bf16, int8, fp8 e4m3 and int4 (symmetric, one scale per
  // 8 values), head_dim / 8 a power of two from 4 to 32; else -1.
  int fast_kind() const;
  // Values per lane of append_warp_kernel, or 0 where it does not apply.
  int warp_vpl() const;
  uint32_t max_groups() const;

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

}  // namespace kvc::cuda
