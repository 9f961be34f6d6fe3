// Where a pool's block bytes live and how tokens get in and out of them: the
// one seam between core's bookkeeping and the memory. CpuStore
// (store_cpu.cpp) keeps the blocks in host memory and runs the codec path on
// the CPU (the residual arena and attention sinks included); CudaStore
// (store_cuda.cpp) keeps them in device memory and runs the kernels of cuda/.
// Block tables, allocation, copy-on-write, staging bookkeeping, eviction
// plans and the prefix index are the same for both: core decides, the store
// moves bytes.
//
// Callers hold the pool lock as the operation needs (shared for reads and
// appends, exclusive for everything that changes block tables) and have
// checked every argument; a store call fails only for what only it can see
// (NaN / Inf input, a CUDA error).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "codec/codec.h"
#include "common/dtype.h"
#include "common/rope.h"
#include "core/types.h"

namespace kvc::core {

struct LayerTable;
struct PoolCore;
class InputScratch;  // (pool_int.h)

class BlockStore {
 public:
  virtual ~BlockStore() = default;
  // Block 0's address: host memory, or device memory (CUDA pools' engines
  // run their own kernels over it).
  virtual uint8_t *arena() const = 0;

  // ---- whole blocks ----
  // A block taken from the free list, and slots handed out by a reserve:
  // device kernels read whole blocks, so a CUDA store zeroes them (a CPU
  // store relies on the written-slot bits).
  virtual void taken(int32_t b) = 0;
  virtual void reserved(int32_t b, uint32_t slot, uint64_t n) = 0;
  virtual void zero(int32_t b) = 0;
  virtual void copy(int32_t dst, int32_t src) = 0;
  // Block b's bytes where the host can read them in place (a CPU store's
  // arena), or null (device memory: copy them with to_host).
  virtual const uint8_t *host_block(int32_t b) const = 0;
  // Blocks to or from host memory, block after block (stride bytes each).
  // to_host leaves zeros, not an earlier owner's bytes, in the slots no
  // append wrote since the block was taken.
  virtual void to_host(const int32_t *blocks, size_t n, uint8_t *host) const = 0;
  virtual void from_host(const int32_t *blocks, size_t n, const uint8_t *host) = 0;
  virtual void set_stream(void *stream) = 0;
  // Waits for queued work; returns the appends refused since the last call
  // (CUDA checks NaN / Inf on the device), 0 on the CPU.
  virtual uint64_t sync() = 0;

  // ---- tokens of one layer ----
  // An append's K/V prepared before the pool lock is taken: a CPU store
  // converts quantized parts to f32, refuses NaN / Inf and rotates them
  // (throws NonFinite, nothing written); a CUDA store checks on the device.
  struct Input {
    const void *k = nullptr, *v = nullptr;
    DType src = DType::F32;
    uint64_t n = 0;
    const float *kf = nullptr, *vf = nullptr;  // CPU: quantized parts as rotated f32 rows
    float *kpre = nullptr;                     // CPU, pre-RoPE / smoothed keys: room for them
    // The key smoothing prepare() saw (null: none); the write checks under the
    // pool lock that it is still the pool's (kvc_pool_set_key_smoothing).
    std::shared_ptr<const KeySmoothing> smooth;
    // CPU, f16 parts quantized straight from the input: their groups' keys
    // (codec::f16_keys: prepare's finiteness check; keys[kv].hi null: none),
    // keys_per_token[kv] of them per token.
    codec::F16Keys keys[2];
    uint64_t keys_per_token[2] = {0, 0};
  };
  // (scratch: the append's, which holds what Input points to until its last write)
  virtual Input prepare(uint64_t n, const void *k, const void *v, DType src,
                        InputScratch &scratch) const = 0;
  // Writes tokens [idx0, idx0 + n) of a layer (blocks private to the caller,
  // codec or residual). Does not mark them written (the caller does).
  virtual void write(uint32_t layer, const LayerTable &l, uint64_t idx0, const Input &in) = 0;
  // Residual aging: writes n tokens of f32 rows (converted, checked,
  // Hadamard-rotated, RoPE undone for pre-RoPE keys, per-tensor scales
  // calibrated) into slots [slot, slot + n) of codec block b (a block the
  // caller made private): plain parts convert them, quantized parts encode
  // them (whole per-channel groups).
  virtual void write_rows(uint32_t layer, int32_t b, uint32_t slot, uint64_t n, const float *k,
                          const float *v) = 0;
  // Reads tokens [first, first + n) of a layer as dst rows (k_out or v_out may
  // be null); unwritten slots read as zeros.
  virtual void read(uint32_t layer, const LayerTable &l, uint64_t first, uint64_t n, void *k_out,
                    void *v_out, DType dst) const = 0;
  // Eviction's compaction: token keep[j] moves to index j for j >= first
  // (keep increasing, keep[j] >= j; sources read before they are overwritten).
  virtual void move_tokens(const LayerTable &l, const std::vector<uint32_t> &keep,
                           uint64_t first) = 0;
  // Re-rotates the keys of indices idx by delta positions (after the moves):
  // decode, RoPE shift, encode.
  virtual void rotate_keys(uint32_t layer, const LayerTable &l, const std::vector<uint64_t> &idx,
                           const std::vector<int64_t> &delta, RopeShift &rope) = 0;

  // ---- attention ----
  // n_seqs sequences' layer tables (ids for messages), queries q of
  // p.q_dtype, outputs of p.out_dtype; scale already resolved. The caller
  // checked shapes and holds no lock: the store takes the pool lock itself
  // (a CPU store may need the exclusive lock once, to start tracking scores).
  virtual void attention(uint32_t layer, const uint64_t *ids, size_t n_seqs, const void *q,
                         uint64_t n_q, bool prefill, void *out, float *lse, const AttnParams &p,
                         float scale) = 0;
};

// The store of a validated configuration; throws Error (OutOfMemory,
// DeviceUnavailable).
std::unique_ptr<BlockStore> make_cpu_store(PoolCore &c);
std::unique_ptr<BlockStore> make_cuda_store(PoolCore &c);

}  // namespace kvc::core
