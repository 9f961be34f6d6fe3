// Reading a pool: gather (any codec, residual and sinks), block tables and
// FlashInfer-style page tables, statistics and the memory layout; device
// streams and whole-block copies to and from host memory.
#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "common/error.h"
#include "core/pool.h"

namespace kvc::core {

void Pool::gather(uint64_t id, uint32_t layer, uint64_t first, uint64_t n, void *k_out, void *v_out,
                  DType dst, int32_t *positions_out) const {
  std::shared_lock lk(mu_);
  const Sequence &s = find(id);
  if (heads() > 1) {
    check_caller_layer(layer);
    gather_heads(s, layer, first, n, k_out, v_out, dst, positions_out);
    return;
  }
  check_layer(layer);
  const LayerTable &l = s.layers[layer];
  if (first > l.n_tokens || n > l.n_tokens - first)
    fail(Errc::OutOfRange, u64s(n) + " tokens from index " + u64s(first) + " are beyond the " +
                               u64s(l.n_tokens) + " tokens of layer " + u64s(layer));
  store_->read(layer, l, first, n, k_out, v_out, dst);
  if (positions_out)
    for (uint64_t i = 0; i < n; ++i)
      positions_out[i] = static_cast<int32_t>(l.position_of(first + i));
}

size_t Pool::block_table(uint64_t id, uint32_t layer, int32_t *out, size_t capacity) const {
  std::shared_lock lk(mu_);
  const Sequence &s = find(id);
  if (headwise()) {
    check_caller_layer(layer);
    fail(Errc::Unsupported,
         "kvc_seq_block_table: a head-wise pool (KVC_POOL_HEADWISE) has a "
         "block table per KV head: use kvc_seq_head_block_table");
  }
  check_layer(layer);
  const auto &b = s.layers[layer].blocks;
  if (out && b.size() <= capacity) std::copy(b.begin(), b.end(), out);
  return b.size();
}

size_t Pool::export_page_table(uint32_t layer, const uint64_t *seq_ids, size_t n_seqs,
                               int32_t *indptr, int32_t *indices, size_t capacity,
                               int32_t *last_page_len) const {
  std::shared_lock lk(mu_);
  if (headwise()) {
    check_caller_layer(layer);
    fail(Errc::Unsupported,
         "kvc_export_page_table: a head-wise pool (KVC_POOL_HEADWISE) has a "
         "block table per KV head: use kvc_export_head_page_table");
  }
  check_layer(layer);
  std::vector<const LayerTable *> rows(n_seqs);
  for (size_t i = 0; i < n_seqs; ++i) rows[i] = &find(seq_ids[i]).layers[layer];
  return page_table(rows, indptr, indices, capacity, last_page_len);
}

size_t PoolCore::page_table(const std::vector<const LayerTable *> &rows, int32_t *indptr,
                            int32_t *indices, size_t capacity, int32_t *last_page_len) const {
  uint64_t total = 0;
  for (const LayerTable *l : rows) total += l->blocks.size();
  if (total > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    fail(Errc::Overflow, "page table of " + u64s(total) + " indices exceeds int32");
  if (total > capacity) return static_cast<size_t>(total);
  const BlockDiv bs = block_div(cfg_.block_size);
  int32_t off = 0;
  indptr[0] = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const LayerTable &l = *rows[i];
    for (int32_t b : l.blocks) indices[off++] = b;
    indptr[i + 1] = off;
    last_page_len[i] =  // codec blocks only: residual tokens are not in the page table
        l.n_lp == 0 ? 0 : static_cast<int32_t>(l.n_lp - (l.blocks.size() - 1) * bs);
  }
  return static_cast<size_t>(total);
}

PoolStats Pool::stats() const {
  std::shared_lock lk(mu_);
  PoolStats s{};
  s.blocks_total = alloc_.num_blocks();
  s.blocks_free = alloc_.num_free();
  s.blocks_cached = alloc_.num_cached();
  s.blocks_used = alloc_.num_used();
  s.blocks_shared = alloc_.num_shared();
  // Exact: a block's bytes (codes, scales and zero points) over its tokens,
  // summed over the layers; per-layer formats: the mean block over the layers.
  uint64_t layer_bytes = 0;
  for (const FormatClass &k : fmt_.cls) layer_bytes += k.stride * k.layers;
  s.bytes_per_block = layer_bytes / cfg_.num_layers;
  s.bytes_per_token = layer_bytes / cfg_.block_size;
  s.bytes_total = arena_bytes_ + stage_.arena_bytes;
  s.bytes_in_use = bytes_in_use();
  s.peak_bytes_in_use = peak_bytes_;
  s.num_sequences = seqs_.size();
  s.residual_blocks_total = stage_.alloc.num_blocks();
  s.residual_blocks_used = stage_.alloc.num_used();
  s.residual_bytes_per_block = stage_.stride;
  s.tokens_stored = tokens_stored_;
  return s;
}

PoolLayout Pool::layout() const {
  if (fmt_.mixed())
    fail(Errc::Unsupported, "the pool has per-layer codecs (" + u64s(fmt_.cls.size()) +
                                " block formats): kvc_pool_get_layout describes one format");
  PoolLayout l{};
  l.base = arena_;
  l.num_blocks = cfg_.num_blocks;
  l.block_stride = block_stride_;
  l.part[0] = fmt_.cls[0].part[0];
  l.part[1] = fmt_.cls[0].part[1];
  l.residual_base = stage_.arena;
  l.residual_num_blocks = cfg_.num_residual_blocks;
  l.residual_block_stride = stage_.stride;
  return l;
}

std::pair<float, float> Pool::tensor_scales(uint32_t layer) const {
  check_caller_layer(layer);
  layer *= heads();  // head-wise pools have no per-tensor scales (refused at create)
  float r[2] = {0.0f, 0.0f};
  for (int kv = 0; kv < 2; ++kv)
    if (fmt_.per_tensor(kv, layer)) r[kv] = fmt_.tensor_scale(kv, layer);
  return {r[0], r[1]};
}

void Pool::reset_peak() {
  std::unique_lock lk(mu_);
  peak_bytes_ = bytes_in_use();
}

void Pool::set_stream(void *stream) {
  std::unique_lock lk(mu_);
  store_->set_stream(stream);
}

void Pool::sync() {
  const uint64_t refused = store_->sync();
  if (refused)
    fail(Errc::NonFinite,
         u64s(refused) + (refused == 1 ? " append" : " appends") +
             " since the last sync held NaN or Inf (or values too large to rotate) in a "
             "quantized part; none of their values were written");
}

void Pool::copy_blocks(const int32_t *blocks, size_t n, void *host, bool to_host) {
  if (n && (!blocks || !host)) fail(Errc::NullPointer, "blocks or host is NULL");
  if (fmt_.mixed())
    fail(Errc::Unsupported, "the pool has per-layer codecs (" + u64s(fmt_.cls.size()) +
                                " block formats of different sizes): kvc_pool_copy_blocks copies "
                                "blocks of one size; nothing copied");
  if (n > (uint64_t(1) << 40) / fmt_.max_stride())
    fail(Errc::Overflow, "n_blocks " + u64s(n) + " is too large");
  std::unique_lock lk(mu_);
  for (size_t i = 0; i < n; ++i)
    if (blocks[i] < 0 || static_cast<uint64_t>(blocks[i]) >= cfg_.num_blocks)
      fail(Errc::OutOfRange, "block " + std::to_string(blocks[i]) + " (index " + u64s(i) +
                                 "): the pool has " + u64s(cfg_.num_blocks) +
                                 " blocks; nothing copied");
  if (!to_host) {
    for (size_t i = 0; i < n; ++i)
      if (alloc_.refcount(blocks[i]) == 0)
        fail(Errc::InvalidArgument,
             "block " + std::to_string(blocks[i]) + " (index " + u64s(i) +
                 ") is not held by any sequence (free or only cached): copy into blocks "
                 "a sequence holds; nothing copied");
    for (size_t i = 0; i < n; ++i) prefix_drop_block(blocks[i]);  // content changes
  }
  if (!to_host)  // the engine wrote every slot of these blocks
    for (size_t i = 0; i < n; ++i) written_.set(blocks[i], 0, cfg_.block_size);
  if (to_host)
    store_->to_host(blocks, n, static_cast<uint8_t *>(host));
  else
    store_->from_host(blocks, n, static_cast<const uint8_t *>(host));
}

}  // namespace kvc::core
