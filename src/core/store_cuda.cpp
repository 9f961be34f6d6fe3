// The CUDA store (core/store.h): blocks in device memory, every byte
// access through the kernels of cuda/ (cuda/backend.h). Pools on it have no
// residual arena, no pre-RoPE keys and observe no attention (refused when
// the pool is made or the call is checked).
#include <cmath>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "common/error.h"
#include "core/pool_int.h"
#include "core/store.h"
#include "cuda/backend.h"

namespace kvc::core {

// The descriptors carry codec::Gran's values as the kernels read them.
static_assert(static_cast<int32_t>(codec::Gran::None) == cuda::kGranNone &&
                  static_cast<int32_t>(codec::Gran::Tensor) == cuda::kGranTensor &&
                  static_cast<int32_t>(codec::Gran::Token) == cuda::kGranToken &&
                  static_cast<int32_t>(codec::Gran::Group) == cuda::kGranGroup &&
                  static_cast<int32_t>(codec::Gran::Channel) == cuda::kGranChannel,
              "cuda/backend.h's granularity values are codec::Gran's");

namespace {

cuda::Geometry geometry(const PoolCore &c) {
  cuda::Geometry g;
  g.kv_heads = c.cfg_.num_kv_heads;
  g.head_dim = c.cfg_.head_dim;
  g.block_size = c.cfg_.block_size;
  g.block_stride = c.block_stride_;
  for (int kv = 0; kv < 2; ++kv) {
    const PartLayout &pl = c.fmt_.cls[0].part[kv];  // (CUDA pools have one block format)
    cuda::PartDesc &d = g.part[kv];
    d.dtype = static_cast<int32_t>(pl.spec.dtype);
    d.gran = static_cast<int32_t>(pl.spec.gran);
    d.group = pl.spec.group;
    d.asym = pl.spec.asym;
    d.scale_f16 = pl.spec.scale_dtype == DType::F16;
    d.rotation = pl.rotation_block;
    d.quantized = pl.quantized;
    d.offset = pl.offset, d.token_stride = pl.token_stride, d.head_stride = pl.head_stride;
    d.scale_offset = pl.scale_offset, d.zero_offset = pl.zero_offset;
    d.scales_per_token = pl.scales_per_token, d.scale_bytes = pl.scale_bytes;
    d.static_scale = pl.spec.static_scale;
  }
  return g;
}

// Slots (block * block_size + slot) of tokens of a layer's main arena.
std::vector<cuda::Slot> slots_of(const LayerTable &l, uint64_t bs, uint64_t first, uint64_t n) {
  std::vector<cuda::Slot> v(n);
  for (uint64_t i = 0; i < n; ++i)
    v[i] = static_cast<cuda::Slot>(l.blocks[(first + i) / bs]) * static_cast<cuda::Slot>(bs) +
           (first + i) % bs;
  return v;
}

class CudaStore final : public BlockStore {
 public:
  explicit CudaStore(PoolCore &c)
      : c_(c),
        dev_(cuda::Device::open(c.cfg_.device_index, c.arena_bytes_, geometry(c))),
        stride_(c.block_stride_) {}
  uint8_t *arena() const override { return dev_->arena(); }

  // Device kernels and copies read whole blocks: none of an earlier owner's bytes.
  void taken(int32_t b) override { zero(b); }
  void reserved(int32_t b, uint32_t slot, uint64_t n) override {
    c_.fmt_.for_slot_bytes(0, slot, n, [&](uint64_t off, uint64_t len) {
      dev_->zero(static_cast<uint64_t>(b) * stride_ + off, len);
    });
  }
  void zero(int32_t b) override { dev_->zero(static_cast<uint64_t>(b) * stride_, stride_); }
  void copy(int32_t dst, int32_t src) override {
    dev_->copy(static_cast<uint64_t>(dst) * stride_, static_cast<uint64_t>(src) * stride_, stride_);
  }
  const uint8_t *host_block(int32_t) const override { return nullptr; }
  // (Blocks are zeroed on the device when taken, and reserved slots at
  // reserve: the device copy is clean already.)
  void to_host(const int32_t *blocks, size_t n, uint8_t *host) const override {
    if (n) dev_->copy_blocks(blocks, n, host, /*to_host=*/true);
  }
  void from_host(const int32_t *blocks, size_t n, const uint8_t *host) override {
    if (n) dev_->copy_blocks(blocks, n, const_cast<uint8_t *>(host), /*to_host=*/false);
  }
  void set_stream(void *stream) override { dev_->set_stream(stream); }
  uint64_t sync() override { return dev_->sync(); }

  // The device checks, rotates and encodes (cuda/kernels).
  Input prepare(uint64_t n, const void *k, const void *v, DType src,
                InputScratch &) const override {
    Input in;
    in.k = k;
    in.v = v;
    in.src = src;
    in.n = n;
    return in;
  }
  void write(uint32_t layer, const LayerTable &l, uint64_t idx0, const Input &in) override {
    float ts[2] = {0.0f, 0.0f};
    for (int kv = 0; kv < 2; ++kv)
      if (c_.fmt_.per_tensor(kv)) {
        if (c_.fmt_.scale[kv][layer].load(std::memory_order_acquire) == 0)
          c_.fmt_.calibrate_absmax(
              kv, layer,
              dev_->absmax(kv, in.n, kv == 0 ? in.k : in.v, static_cast<int32_t>(in.src)));
        ts[kv] = c_.fmt_.tensor_scale(kv, layer);
      }
    const std::vector<cuda::Slot> slots = slots_of(l, c_.cfg_.block_size, idx0, in.n);
    dev_->append(slots.data(), in.n, in.k, in.v, static_cast<int32_t>(in.src), ts, 3);
  }
  // Pools on CUDA have no residual arena (validate_config refuses them): nothing ages.
  void write_rows(uint32_t, int32_t, uint32_t, uint64_t, const float *, const float *) override {
    fail(Errc::Internal,
         "device CUDA: residual aging reached the CUDA store (residual pools are CPU-only)");
  }

  void read(uint32_t layer, const LayerTable &l, uint64_t first, uint64_t n, void *k_out,
            void *v_out, DType dst) const override {
    float ts[2];
    c_.fmt_.tensor_scales(layer, ts);
    const std::vector<cuda::Slot> slots = slots_of(l, c_.cfg_.block_size, first, n);
    if (n) dev_->gather(slots.data(), n, k_out, v_out, static_cast<int32_t>(dst), ts);
  }
  // All moves in two device passes (every source staged first).
  void move_tokens(const LayerTable &l, const std::vector<uint32_t> &k, uint64_t first) override {
    const uint64_t bs = c_.cfg_.block_size;
    std::vector<cuda::Slot> from, to;
    for (uint64_t j = first; j < k.size(); ++j)
      if (k[j] != j) {
        from.push_back(static_cast<cuda::Slot>(l.blocks[k[j] / bs]) * static_cast<cuda::Slot>(bs) +
                       k[j] % bs);
        to.push_back(static_cast<cuda::Slot>(l.blocks[j / bs]) * static_cast<cuda::Slot>(bs) +
                     j % bs);
      }
    dev_->move_tokens(from.data(), to.data(), from.size());
  }
  // Decode on the device, rotate here, encode on the device.
  void rotate_keys(uint32_t layer, const LayerTable &l, const std::vector<uint64_t> &idx,
                   const std::vector<int64_t> &delta, RopeShift &rope) override {
    if (idx.empty()) return;
    const uint64_t bs = c_.cfg_.block_size, h = c_.cfg_.num_kv_heads, hd = c_.cfg_.head_dim,
                   row = h * hd;
    std::vector<cuda::Slot> sl(idx.size());
    for (size_t i = 0; i < idx.size(); ++i)
      sl[i] = static_cast<cuda::Slot>(l.blocks[idx[i] / bs]) * static_cast<cuda::Slot>(bs) +
              idx[i] % bs;
    std::vector<float> rows(idx.size() * row);
    float ts[2] = {c_.fmt_.quantized(0) ? c_.fmt_.tensor_scale(0, layer) : 0.0f, 0.0f};
    dev_->gather(sl.data(), idx.size(), rows.data(), nullptr, static_cast<int32_t>(DType::F32), ts);
    for (size_t i = 0; i < idx.size(); ++i)
      for (uint64_t hh = 0; hh < h; ++hh) rope.rotate(rows.data() + i * row + hh * hd, delta[i]);
    dev_->append(sl.data(), idx.size(), rows.data(), nullptr, static_cast<int32_t>(DType::F32), ts,
                 1);
  }
  // The block tables go to the device with the call; q, out and lse may be
  // device or host memory. Queries are not checked for NaN / Inf on the
  // device (documented in kvcache.h).
  void attention(uint32_t layer, const uint64_t *ids, size_t n_seqs, const void *q, uint64_t n_q,
                 bool prefill, void *out, float *lse, const AttnParams &p, float scale) override {
    if (p.observe)
      fail(Errc::Unsupported,
           "device CUDA: observing attention (H2O, TOVA, SnapKV scores) is CPU-only in this "
           "version; feed scores with kvc_seq_observe_scores()");
    std::shared_lock lk(c_.mu_);
    c_.check_layer(layer);
    std::vector<int32_t> blocks;
    std::vector<uint64_t> start, count, row;
    const uint64_t bs = c_.cfg_.block_size;
    for (size_t i = 0; i < n_seqs; ++i) {
      const LayerTable &l = c_.find(ids[i]).layers[layer];
      if (prefill && n_q > l.n_tokens)
        fail(Errc::OutOfRange, u64s(n_q) + " prefill queries but layer " + u64s(layer) +
                                   " of sequence " + u64s(ids[i]) + " holds " + u64s(l.n_tokens) +
                                   " tokens (append the chunk's K/V first)");
      const uint64_t b0 = blocks.size();
      const uint64_t nb = (l.n_tokens + bs - 1) / bs;
      blocks.insert(blocks.end(), l.blocks.begin(),
                    l.blocks.begin() + static_cast<std::ptrdiff_t>(nb));
      for (uint64_t r = 0; r < n_q; ++r) {
        start.push_back(b0);
        count.push_back(prefill ? l.n_tokens - n_q + r + 1 : l.n_tokens);
        row.push_back(i * n_q + r);
      }
    }
    cuda::Device::AttnBatch b;
    b.block_ids = blocks.data();
    b.block_start = start.data();
    b.n_tokens = count.data();
    b.q_row = row.data();
    b.n_items = start.size();
    b.n_blocks = blocks.size();
    b.n_rows = n_seqs * n_q;
    float ts[2];
    c_.fmt_.tensor_scales(layer, ts);
    dev_->attention(b, p.num_q_heads, scale, q, static_cast<int32_t>(p.q_dtype), out,
                    static_cast<int32_t>(p.out_dtype), lse, ts);
  }

 private:
  PoolCore &c_;
  std::unique_ptr<cuda::Device> dev_;
  uint64_t stride_;
};

}  // namespace

std::unique_ptr<BlockStore> make_cuda_store(PoolCore &c) {
  return std::make_unique<CudaStore>(c);
}

}  // namespace kvc::core
