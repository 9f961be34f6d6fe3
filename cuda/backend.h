// The CUDA backend as the core sees it: device memory for a pool's blocks
// and the kernels that read and write them. No CUDA header is needed to use
// it; builds without CUDA link cuda/stub.cpp, whose open() reports
// DeviceUnavailable.
//
// Kernels (cuda/*.cu; device.cuh lists the files):
// - append: converts K/V rows to f32, checks them (quantized parts), applies
//   the Hadamard rotation, computes scales and writes codes into the rows'
//   slots: the same float operations as src/codec, so the bytes equal the
//   CPU pool's;
// - gather: decodes slots back (inverse rotation, conversion);
// - paged decode attention (FlashDecoding: each sequence's tokens are split
//   across thread blocks and the partial softmax states merged by
//   log-sum-exp); prefill runs as a decode batch of its query rows, each
//   seeing its causal prefix;
// - block copies (copy-on-write, zeroing) and token moves (eviction
//   compaction), swaps to and from host memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kvc::cuda {

// Scale granularities as PartDesc::gran carries them: codec::Gran's values
// (checked in core/store_cuda.cpp; the kernels' G_* in cuda/dtype.cuh).
enum : int32_t { kGranNone = 0, kGranTensor = 1, kGranToken = 2, kGranGroup = 3, kGranChannel = 4 };

// How one part (K or V) sits in a block (a copy of core::PartLayout plus
// the codec fields the kernels use).
struct PartDesc {
  int32_t dtype = 1;   // DType value
  int32_t gran = 0;    // codec::Gran value
  uint32_t group = 0;  // values per group (Group)
  int32_t asym = 0;
  int32_t scale_f16 = 0;  // scales stored as f16 (else f32)
  uint32_t rotation = 0;  // Hadamard block (0: none)
  int32_t quantized = 0;
  uint64_t offset = 0, token_stride = 0, head_stride = 0;
  uint64_t scale_offset = 0, zero_offset = 0, scales_per_token = 0, scale_bytes = 0;
  double static_scale = 0.0;  // > 0: the spec's fixed per-tensor scale
};

struct Geometry {
  uint32_t kv_heads = 0, head_dim = 0, block_size = 0;
  uint64_t block_stride = 0;
  PartDesc part[2];
};

// A host-side description of where a token lives: block * block_size + slot.
using Slot = int64_t;

class Device {
 public:
  // Allocates `bytes` of device memory on device `index` (zeroed). Throws
  // Error: DeviceUnavailable (no CUDA build, no driver, no device),
  // OutOfMemory.
  static std::unique_ptr<Device> open(int index, uint64_t bytes, const Geometry &g);
  // Whether this build has the CUDA backend compiled in.
  static bool compiled();
  virtual ~Device() = default;

  virtual uint8_t *arena() const = 0;
  virtual void set_stream(void *stream) = 0;
  virtual void *stream() const = 0;

  // Zero `n` bytes at arena offset `off`; copy `n` bytes inside the arena.
  virtual void zero(uint64_t off, uint64_t n) = 0;
  virtual void copy(uint64_t dst_off, uint64_t src_off, uint64_t n) = 0;

  // Writes n tokens (rows [n][kv_heads * head_dim] of src_dtype, host or
  // device memory) into slots[0..n). tensor_scale[kv]: the layer's
  // per-tensor scale (Tensor granularity). Quantized parts are checked for
  // NaN / Inf on the device: a bad call writes nothing and is counted
  // (sync() reports it). Host inputs make the call wait for the stream.
  // parts: bit 0 writes K, bit 1 writes V (the other pointer may be null).
  virtual void append(const Slot *slots, uint64_t n, const void *k, const void *v,
                      int32_t src_dtype, const float tensor_scale[2], int parts) = 0;
  // Absolute maximum of the rotated rows of part kv (for the dynamic
  // per-tensor scale); waits. Throws NonFinite when a value is NaN or Inf.
  virtual float absmax(int kv, uint64_t n, const void *src, int32_t src_dtype) = 0;
  // Reads n tokens from slots into rows of dst_dtype (host or device memory;
  // either may be null).
  virtual void gather(const Slot *slots, uint64_t n, void *k_out, void *v_out, int32_t dst_dtype,
                      const float tensor_scale[2]) = 0;

  // Attention over paged blocks. Item i attends to its first n_tokens[i]
  // tokens, whose blocks are block_ids[block_start[i] ...]; its query rows
  // are q + q_row[i] * num_q_heads * head_dim (q_dtype), output at the same
  // row of out (out_dtype), lse (f32, may be null) at q_row[i] * num_q_heads.
  struct AttnBatch {
    const int32_t *block_ids = nullptr;  // host
    const uint64_t *block_start = nullptr;
    const uint64_t *n_tokens = nullptr;
    const uint64_t *q_row = nullptr;
    uint64_t n_items = 0, n_blocks = 0, n_rows = 0;
  };
  virtual void attention(const AttnBatch &b, uint32_t num_q_heads, float scale, const void *q,
                         int32_t q_dtype, void *out, int32_t out_dtype, float *lse,
                         const float tensor_scale[2]) = 0;

  // Moves tokens: dst[i] receives src[i]'s codes, scales and zero points
  // (both parts). Sources are read before any destination is written.
  virtual void move_tokens(const Slot *src, const Slot *dst, uint64_t n) = 0;

  // Whole blocks to (to_host) or from a host buffer.
  virtual void copy_blocks(const int32_t *blocks, size_t n, void *host, bool to_host) = 0;

  // Waits for the stream; returns the number of appends refused for NaN /
  // Inf since the last call (and resets it). Throws Internal on a CUDA error.
  virtual uint64_t sync() = 0;
};

}  // namespace kvc::cuda
