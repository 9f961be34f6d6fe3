// Writing K/V into a pool (kvc_append): the positions are checked against
// the reservation, shared blocks are copied first (copy-on-write, under the
// exclusive lock), the store writes (quantize on write), and residual tokens
// that left the window age into codec blocks right after.
#include <algorithm>
#include <cstring>
#include <vector>
#include <mutex>
#include <shared_mutex>

#include "codec/codec.h"
#include "common/error.h"
#include "core/pool.h"

namespace kvc::core {

// Shared blocks a write of tokens [idx0, idx0 + n) of a layer touches:
// codec blocks (first) and residual blocks (second).
std::pair<uint64_t, uint64_t> PoolCore::shared_in_write(const LayerTable &l, uint64_t idx0,
                                                        uint64_t n) const {
  const BlockDiv bs = block_div(cfg_.block_size);
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
}

// A registered block written in place (this sequence is its only holder)
// leaves the prefix index first (exclusive lock).
bool PoolCore::write_touches_registered(const LayerTable &l, uint64_t idx0, uint64_t n) const {
  const BlockDiv bs = block_div(cfg_.block_size);
  const uint64_t lp_end = std::min(idx0 + n, l.n_lp);
  if (!events_ || idx0 >= lp_end) return false;
  for (uint64_t b = idx0 / bs; b <= (lp_end - 1) / bs; ++b)
    if (registered(l.blocks[b]) && alloc_.refcount(l.blocks[b]) == 1) return true;
  return false;
}

// Makes the blocks a write touches private (exclusive lock; the caller
// checked that enough blocks are free).
void PoolCore::cow_for_write(LayerTable &l, uint64_t idx0, uint64_t n) {
  const BlockDiv bs = block_div(cfg_.block_size);
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
}

void Pool::append(uint64_t id, uint32_t layer, uint64_t pos, uint64_t n, const void *k,
                  const void *v, DType src) {
  if (heads() > 1) {
    append_heads(id, layer, pos, n, k, v, src);
    return;
  }
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
  if ((fmt_.quantized(0) || fmt_.quantized(1)) && n > (uint64_t(1) << 40) / (row ? row : 1))
    fail(Errc::Overflow, "n_tokens " + u64s(n) + " x row of " + u64s(row) + " values is too large");
  InputScratch scratch;  // what `in` points to, held until the last write below
  const BlockStore::Input in = store_->prepare(n, k, v, src, scratch);
  // (Under the pool lock: the key smoothing prepare() used is still the pool's.)
  auto same_smoothing = [&] {
    if (in.smooth != fmt_.smooth)
      fail(Errc::InvalidArgument,
           "the pool's key smoothing changed while this append was prepared (its sequence was "
           "freed meanwhile): nothing written");
  };
  auto write = [&](LayerTable &l, uint64_t idx0) {
    store_->write(layer, l, idx0, in);
    mark_written(l, idx0, n, true);
  };
  {
    std::shared_lock lk(mu_);
    Sequence &s = find(id);
    same_smoothing();
    const uint64_t idx0 = locate(s);
    LayerTable &l = s.layers[layer];
    check_lp_write(l, idx0);
    const auto shared = shared_in_write(l, idx0, n);
    if (shared.first == 0 && shared.second == 0 && !write_touches_registered(l, idx0, n)) {
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
  same_smoothing();
  const uint64_t idx0 = locate(s);
  LayerTable &l = s.layers[layer];
  check_lp_write(l, idx0);
  const auto need = shared_in_write(l, idx0, n);
  const uint32_t cl = fmt_.class_of_layer(layer);  // the layer's blocks' format
  if (need.first > alloc_.available(cl) || need.second > stage_.alloc.available())
    fail(Errc::PoolExhausted,
         "pool exhausted: copy-on-write needs " + u64s(need.first) + " blocks (" +
             u64s(alloc_.available(cl)) + " available" +
             (fmt_.mixed() ? " in " + table_name(layer) + "'s block format" : std::string()) +
             ") and " + u64s(need.second) + " residual blocks (" + u64s(stage_.alloc.available()) +
             " available)");
  cow_for_write(l, idx0, n);
  note_usage();
  write(l, idx0);
  stage_.age_written(s, layer, idx0, idx0 + n);
}

// A head-wise pool's append (KVC_POOL_HEADWISE): the rows [n][H][D] go to
// the layer's H tables (layer x H + h), each head at its own index (heads
// evicted differently hold different counts). The input is made head-major
// and prepared once (conversion, the NaN / Inf check, rotations) and every
// head's checks and copy-on-write needs are taken before the first write,
// so a refused append writes nothing.
void Pool::append_heads(uint64_t id, uint32_t layer, uint64_t pos, uint64_t n, const void *k,
                        const void *v, DType src) {
  const uint32_t H = heads();
  const uint64_t D = cfg_.head_dim;
  check_caller_layer(layer);
  auto locate = [&](Sequence &s, std::vector<uint64_t> &idx) {
    if (n == 0) fail(Errc::InvalidArgument, "n_tokens 0: append at least one token");
    if (n > s.length || pos > s.length - n)
      fail(Errc::NotReserved,
           "positions from " + u64s(pos) + " (" + u64s(n) + " tokens) are not reserved: sequence " +
               u64s(id) + " has length " + u64s(s.length) + " (call kvc_seq_reserve first)");
    for (uint32_t h = 0; h < H; ++h) {
      const LayerTable &l = s.layers[static_cast<size_t>(layer) * H + h];
      if (pos < l.tail_pos)
        fail(Errc::NotReserved, "position " + u64s(pos) + " of layer " + u64s(layer) + " head " +
                                    u64s(h) + " was compacted by eviction; only positions >= " +
                                    u64s(l.tail_pos) + " can be written");
      idx[h] = l.tail_index + (pos - l.tail_pos);
      if (idx[h] < l.n_lp && stage_.unit > 1)
        fail(Errc::NotReserved, "position " + u64s(pos) + " of layer " + u64s(layer) + " head " +
                                    u64s(h) +
                                    " is already encoded in a per-channel group; only residual "
                                    "(newest) positions can be written");
    }
  };
  if (n > (uint64_t(1) << 40) / (H * D))
    fail(Errc::Overflow,
         "n_tokens " + u64s(n) + " x row of " + u64s(H * D) + " values is too large");
  std::vector<uint64_t> idx(H);
  {  // the positions first: a refused append reads none of the rows
    std::shared_lock lk(mu_);
    locate(find(id), idx);
  }
  // Head-major copies of the rows ([H][n][D], the input's dtype).
  const uint64_t rb = D * static_cast<uint64_t>(bits_of(src)) / 8;
  std::vector<uint8_t> hm(2 * H * n * rb);
  uint8_t *khm = hm.data(), *vhm = hm.data() + H * n * rb;
  for (uint64_t i = 0; i < n; ++i)
    for (uint32_t h = 0; h < H; ++h) {
      std::memcpy(khm + (h * n + i) * rb, static_cast<const uint8_t *>(k) + (i * H + h) * rb, rb);
      std::memcpy(vhm + (h * n + i) * rb, static_cast<const uint8_t *>(v) + (i * H + h) * rb, rb);
    }
  InputScratch scratch;  // what `all` points to, held until the last write below
  const BlockStore::Input all = [&] {
    const codec::HeadMajorNames names(n, H);  // messages name k[t][h][d] of the caller's rows
    return store_->prepare(n * H, khm, vhm, src, scratch);
  }();
  std::vector<BlockStore::Input> in(H, all);
  for (uint32_t h = 0; h < H; ++h) {
    in[h].n = n;
    in[h].k = khm + h * n * rb;
    in[h].v = vhm + h * n * rb;
    if (all.kf) in[h].kf = all.kf + h * n * D;
    if (all.vf) in[h].vf = all.vf + h * n * D;
    if (all.kpre) in[h].kpre = all.kpre + h * n * D;
    for (int kv = 0; kv < 2; ++kv) {  // (keys_per_token of one head's rows)
      const uint64_t off = h * n * all.keys_per_token[kv];
      if (all.keys[kv].lo) in[h].keys[kv].lo = all.keys[kv].lo + off;
      if (all.keys[kv].hi) in[h].keys[kv].hi = all.keys[kv].hi + off;
    }
  }
  auto write_all = [&](Sequence &s) {
    for (uint32_t h = 0; h < H; ++h) {
      const uint32_t t = layer * H + h;
      store_->write(t, s.layers[t], idx[h], in[h]);
      mark_written(s.layers[t], idx[h], n, true);
    }
  };
  {
    std::shared_lock lk(mu_);
    Sequence &s = find(id);
    locate(s, idx);
    bool shared = false;
    for (uint32_t h = 0; h < H && !shared; ++h) {
      const LayerTable &l = s.layers[layer * H + h];
      const auto c = shared_in_write(l, idx[h], n);
      shared = c.first || c.second || write_touches_registered(l, idx[h], n);
    }
    if (!shared) {
      {
        std::shared_lock wl(s.writers.mu);
        write_all(s);
      }
      bool due = false;
      for (uint32_t h = 0; h < H && !due; ++h)
        due = stage_.age_due(s, layer * H + h, idx[h], idx[h] + n);
      if (!due) return;
      // Aging under the exclusive lock, each head only if it is as this write left it.
      std::vector<uint64_t> seen(3 * H);
      for (uint32_t h = 0; h < H; ++h) {
        const LayerTable &l = s.layers[layer * H + h];
        seen[3 * h] = l.n_tokens, seen[3 * h + 1] = l.n_lp, seen[3 * h + 2] = l.reserved_at;
      }
      const uint64_t seen_len = s.length, seen_stamp = s.stamp;
      lk.unlock();
      std::unique_lock ulk(mu_);
      Sequence *sp = seqs_.find(id);
      if (!sp || sp->stamp != seen_stamp || sp->length != seen_len) return;
      for (uint32_t h = 0; h < H; ++h) {
        const LayerTable &l = sp->layers[layer * H + h];
        if (l.n_tokens == seen[3 * h] && l.n_lp == seen[3 * h + 1] &&
            l.reserved_at == seen[3 * h + 2])
          stage_.age_written(*sp, layer * H + h, idx[h], idx[h] + n);
      }
      return;
    }
  }
  std::unique_lock lk(mu_);
  Sequence &s = find(id);
  locate(s, idx);
  uint64_t need = 0, need_res = 0;
  for (uint32_t h = 0; h < H; ++h) {
    const auto c = shared_in_write(s.layers[layer * H + h], idx[h], n);
    need += c.first;
    need_res += c.second;
  }
  if (need > alloc_.available() || need_res > stage_.alloc.available())
    fail(Errc::PoolExhausted, "pool exhausted: copy-on-write needs " + u64s(need) + " blocks (" +
                                  u64s(alloc_.available()) + " available) and " + u64s(need_res) +
                                  " residual blocks (" + u64s(stage_.alloc.available()) +
                                  " available)");
  for (uint32_t h = 0; h < H; ++h) cow_for_write(s.layers[layer * H + h], idx[h], n);
  note_usage();
  write_all(s);
  for (uint32_t h = 0; h < H; ++h) stage_.age_written(s, layer * H + h, idx[h], idx[h] + n);
}

}  // namespace kvc::core
