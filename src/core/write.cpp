// Writing K/V into a pool (kvc_append): the positions are checked against
// the reservation, shared blocks are copied first (copy-on-write, under the
// exclusive lock), the store writes (quantize on write), and residual tokens
// that left the window age into codec blocks right after.
#include <algorithm>
#include <mutex>
#include <shared_mutex>

#include "common/error.h"
#include "core/pool.h"

namespace kvc::core {

void Pool::append(uint64_t id, uint32_t layer, uint64_t pos, uint64_t n, const void *k,
                  const void *v, DType src) {
  const BlockDiv bs = block_div(cfg_.block_size);
  auto locate = [&](Sequence &s) -> uint64_t {
    check_layer(layer);
    if (n == 0) fail(Errc::InvalidArgument, "n_tokens 0: append at least one token");
    if (n > s.length || pos > s.length - n)
      fail(Errc::NotReserved,
           "positions from " + u64s(pos) + " (" + u64s(n) + " tokens) are not reserved: sequence " +
               u64s(id) + " has length " + u64s(s.length) + " (call kvc_seq_reserve first)");
    const LayerTable &l = s.layers[layer];
    if (pos < l.tail_pos)
      fail(Errc::NotReserved, "position " + u64s(pos) + " of layer " + u64s(layer) +
                                  " was compacted by eviction; only positions >= " +
                                  u64s(l.tail_pos) + " can be written");
    return l.tail_index + (pos - l.tail_pos);
  };
  // Shared blocks the write touches: codec blocks (first) and residual blocks (second).
  auto shared_blocks = [&](const LayerTable &l, uint64_t idx0) {
    std::pair<uint64_t, uint64_t> cnt{0, 0};
    const uint64_t lp_end = std::min(idx0 + n, l.n_lp);
    if (idx0 < lp_end)
      for (uint64_t b = idx0 / bs; b <= (lp_end - 1) / bs; ++b)
        if (alloc_.refcount(l.blocks[b]) > 1) ++cnt.first;
    const uint64_t hp_begin = std::max(idx0, l.n_lp);
    if (hp_begin < idx0 + n) {
      const uint64_t r0 = l.res_off + (hp_begin - l.n_lp), r1 = l.res_off + (idx0 + n - l.n_lp) - 1;
      for (uint64_t b = r0 / bs; b <= r1 / bs; ++b)
        if (stage_.alloc.refcount(l.res_blocks[b]) > 1) ++cnt.second;
    }
    return cnt;
  };
  // A registered block written in place (this sequence is its only holder)
  // leaves the prefix index first (exclusive lock).
  auto touches_registered = [&](const LayerTable &l, uint64_t idx0) {
    const uint64_t lp_end = std::min(idx0 + n, l.n_lp);
    if (!events_ || idx0 >= lp_end) return false;
    for (uint64_t b = idx0 / bs; b <= (lp_end - 1) / bs; ++b)
      if (registered(l.blocks[b]) && alloc_.refcount(l.blocks[b]) == 1) return true;
    return false;
  };
  auto check_lp_write = [&](const LayerTable &l, uint64_t idx0) {
    if (idx0 < l.n_lp && stage_.unit > 1)
      fail(Errc::NotReserved, "position " + u64s(l.position_of(idx0)) + " of layer " + u64s(layer) +
                                  " is already encoded in a per-channel group; only residual "
                                  "(newest) positions can be written");
  };
  // The input's size, then the store's preparation: a CPU store converts
  // quantized parts to f32 and refuses NaN / Inf before anything is written;
  // a CUDA store checks on the device.
  const uint64_t row = static_cast<uint64_t>(cfg_.num_kv_heads) * cfg_.head_dim;
  if ((fmt_.part[0].quantized || fmt_.part[1].quantized) &&
      n > (uint64_t(1) << 40) / (row ? row : 1))
    fail(Errc::Overflow, "n_tokens " + u64s(n) + " x row of " + u64s(row) + " values is too large");
  const BlockStore::Input in = store_->prepare(n, k, v, src);
  auto write = [&](LayerTable &l, uint64_t idx0) {
    store_->write(layer, l, idx0, in);
    mark_written(l, idx0, n, true);
  };
  {
    std::shared_lock lk(mu_);
    Sequence &s = find(id);
    const uint64_t idx0 = locate(s);
    LayerTable &l = s.layers[layer];
    check_lp_write(l, idx0);
    const auto shared = shared_blocks(l, idx0);
    if (shared.first == 0 && shared.second == 0 && !touches_registered(l, idx0)) {
      {  // kvc_seq_save of this sequence waits (and holds writes off) meanwhile
        std::shared_lock wl(s.writers.mu);
        write(l, idx0);
      }
      if (!stage_.age_due(s, layer, idx0, idx0 + n)) return;
      // Aging moves blocks: exclusive lock, and only if the layer is as this
      // write left it (otherwise the next reserve ages it). The stamp tells
      // a sequence truncated, or freed and made again, that grew back to the
      // same lengths (ABA) with positions not written yet.
      const uint64_t seen_tokens = l.n_tokens, seen_lp = l.n_lp, seen_len = s.length,
                     seen_at = l.reserved_at, seen_stamp = s.stamp;
      lk.unlock();
      std::unique_lock ulk(mu_);
      Sequence *sp = seqs_.find(id);
      if (sp && sp->stamp == seen_stamp && sp->length == seen_len &&
          sp->layers[layer].n_tokens == seen_tokens && sp->layers[layer].n_lp == seen_lp &&
          sp->layers[layer].reserved_at == seen_at)
        stage_.age_written(*sp, layer, idx0, idx0 + n);
      return;
    }
  }
  // Copy-on-write needed: redo under the exclusive lock (the state may have changed).
  std::unique_lock lk(mu_);
  Sequence &s = find(id);
  const uint64_t idx0 = locate(s);
  LayerTable &l = s.layers[layer];
  check_lp_write(l, idx0);
  const auto need = shared_blocks(l, idx0);
  if (need.first > alloc_.available() || need.second > stage_.alloc.available())
    fail(Errc::PoolExhausted, "pool exhausted: copy-on-write needs " + u64s(need.first) +
                                  " blocks (" + u64s(alloc_.available()) + " available) and " +
                                  u64s(need.second) + " residual blocks (" +
                                  u64s(stage_.alloc.available()) + " available)");
  const uint64_t lp_end = std::min(idx0 + n, l.n_lp);
  if (idx0 < lp_end)
    for (uint64_t b = idx0 / bs; b <= (lp_end - 1) / bs; ++b) {
      if (alloc_.refcount(l.blocks[b]) > 1)
        l.blocks[b] = cow_copy(l.blocks[b]);
      else
        prefix_drop_block(l.blocks[b]);  // written in place: leaves the prefix index
    }
  const uint64_t hp_begin = std::max(idx0, l.n_lp);
  if (hp_begin < idx0 + n) {
    const uint64_t r0 = l.res_off + (hp_begin - l.n_lp), r1 = l.res_off + (idx0 + n - l.n_lp) - 1;
    for (uint64_t b = r0 / bs; b <= r1 / bs; ++b)
      if (stage_.alloc.refcount(l.res_blocks[b]) > 1) l.res_blocks[b] = stage_.cow(l.res_blocks[b]);
  }
  note_usage();
  write(l, idx0);
  stage_.age_written(s, layer, idx0, idx0 + n);
}

}  // namespace kvc::core
