// Sequences of a pool: create, fork (copy-on-write: no K/V byte moves),
// truncate (per-channel groups cut in the middle are re-staged), free, and
// reserve (block tables grown, residual tokens aged into codec blocks,
// auto-eviction first when the policy asks; "never fits" told from "not now").
#include <algorithm>
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include "common/error.h"
#include "core/pool.h"

namespace kvc::core {

void Sequence::reset_for_reuse(size_t budget) {
  std::vector<LayerTable> tables = std::move(layers);
  for (LayerTable &l : tables) {
    std::vector<int32_t> b = std::move(l.blocks), r = std::move(l.res_blocks);
    l = LayerTable{};
    b.clear();
    r.clear();
    for (std::vector<int32_t> *v : {&b, &r}) {
      const size_t bytes = v->capacity() * sizeof(int32_t);
      if (v->capacity() > kKeptEntries || bytes > budget) continue;  // (freed with this step)
      budget -= bytes;
      (v == &b ? l.blocks : l.res_blocks) = std::move(*v);
    }
  }
  *this = Sequence{};
  layers = std::move(tables);
}

std::unique_ptr<Sequence> PoolCore::new_sequence() {
  if (!spare_seqs_.empty()) {
    std::unique_ptr<Sequence> s = std::move(spare_seqs_.back());
    spare_seqs_.pop_back();
    return s;
  }
  auto s = std::make_unique<Sequence>();
  s->layers.resize(cfg_.num_layers);
  return s;
}

void PoolCore::retire_sequence(std::unique_ptr<Sequence> s) noexcept {
  const size_t tables = s ? s->layers.size() * sizeof(LayerTable) : 0;
  if (!s || spare_seqs_.size() >= kSpareSequences || tables > kSpareBytes) return;
  s->reset_for_reuse(kSpareBytes - tables);
  spare_seqs_.push_back(std::move(s));  // (capacity reserved: no allocation)
}

void Pool::seq_create(uint64_t id) {
  std::unique_lock lk(mu_);
  if (seqs_.find(id)) fail(Errc::SeqExists, "sequence " + u64s(id) + " already exists");
  seqs_.insert(id, new_sequence());  // (may throw: nothing changed; a spare taken is deleted)
}

void Pool::seq_fork(uint64_t parent, uint64_t child) {
  std::unique_lock lk(mu_);
  const Sequence &p = find(parent);
  if (seqs_.find(child)) fail(Errc::SeqExists, "sequence " + u64s(child) + " already exists");
  // Attention-sink copies are private (an append may rewrite a sink): the
  // child gets its own.
  if (p.sink_blocks.size() > stage_.alloc.available())
    fail(Errc::PoolExhausted, "pool exhausted: the child's attention-sink copies need " +
                                  u64s(p.sink_blocks.size()) + " residual blocks, " +
                                  u64s(stage_.alloc.available()) + " available");
  auto c = std::make_unique<Sequence>(p);            // may throw: nothing changed yet
  Sequence *cp = seqs_.insert(child, std::move(c));  // may throw: nothing changed yet
  for (const LayerTable &l : cp->layers) {
    tokens_stored_ += l.n_tokens;
    for (int32_t b : l.blocks) alloc_.ref(b);
    for (int32_t b : l.res_blocks) stage_.alloc.ref(b);
  }
  if (!cp->sink_blocks.empty()) {
    for (int32_t &b : cp->sink_blocks) {
      const int32_t nb = stage_.take();
      std::memcpy(stage_.ptr(nb), stage_.ptr(b), stage_.stride);
      b = nb;
    }
    stage_.assign_sinks(*cp);
    note_usage();
  }
}

void Pool::seq_truncate(uint64_t id, uint64_t new_length) {
  std::unique_lock lk(mu_);
  Sequence &s = find(id);
  if (new_length >= s.length) return;
  const BlockDiv bs = block_div(cfg_.block_size);
  const uint32_t unit = stage_.unit;
  // Tokens a layer keeps (computed twice, without a heap allocation).
  auto keep_of = [&](const LayerTable &l) -> uint64_t {
    if (new_length >= l.tail_pos)
      return std::min(l.n_tokens, l.tail_index + (new_length - l.tail_pos));
    return static_cast<uint64_t>(
        std::lower_bound(l.positions.begin(), l.positions.end(), static_cast<int64_t>(new_length)) -
        l.positions.begin());
  };
  // A per-channel group cut in the middle is re-staged in the residual:
  // check the residual blocks that needs before anything changes.
  if (unit > 1) {
    uint64_t res_needed = 0;
    for (const LayerTable &l : s.layers) {
      const uint64_t keep = keep_of(l);
      if (keep < l.n_lp && keep % unit != 0) res_needed += (keep % unit + bs - 1) / bs;
    }
    if (res_needed > stage_.alloc.available())
      fail(Errc::PoolExhausted,
           "pool exhausted: truncating into a per-channel group re-stages its "
           "tokens and needs " +
               u64s(res_needed) + " residual blocks, " + u64s(stage_.alloc.available()) +
               " available");
    for (LayerTable &l : s.layers) l.res_blocks.reserve(l.res_blocks.size() + 2);  // may throw
  }
  // From here on nothing throws.
  const uint64_t row = static_cast<uint64_t>(cfg_.num_kv_heads) * cfg_.head_dim;
  for (uint32_t li = 0; li < cfg_.num_layers; ++li) {
    LayerTable &l = s.layers[li];
    const uint64_t keep = keep_of(l);
    // Truncating into a registered block this sequence alone holds: the block
    // will be rewritten in place, so it leaves the prefix index now.
    if (keep < l.n_lp && keep % bs != 0 && alloc_.refcount(l.blocks[keep / bs]) == 1)
      prefix_drop_block(l.blocks[keep / bs]);
    if (new_length < l.tail_pos) {
      l.positions.resize(keep);
      l.tail_index = keep;
      l.tail_pos = new_length;
    }
    if (keep >= l.n_lp) {  // cut inside the residual
      const size_t keep_res =
          keep == l.n_lp ? 0 : static_cast<size_t>((l.res_off + keep - l.n_lp + bs - 1) / bs);
      while (l.res_blocks.size() > keep_res) {
        stage_.release(l.res_blocks.back());
        l.res_blocks.pop_back();
      }
      if (l.res_blocks.empty()) l.res_off = 0;
    } else {  // cut inside the codec blocks: the residual goes entirely
      for (int32_t b : l.res_blocks) stage_.release(b);
      l.res_blocks.clear();
      l.res_off = 0;
      uint64_t lp = keep;
      const uint64_t partial = keep % unit;
      if (partial) {
        // Per-channel: the cut group's tokens go back to the residual
        // (dequantized), so the group can be completed and encoded again.
        lp = keep - partial;
        float *buf = scratch_input(2 * partial * row);
        store_->read(li, l, lp, partial, buf, buf + partial * row, DType::F32);
        l.res_blocks.push_back(stage_.take());
        stage_.write(stage_.ptr(l.res_blocks[0]), 0, reinterpret_cast<const uint8_t *>(buf),
                     reinterpret_cast<const uint8_t *>(buf + partial * row), DType::F32, partial);
        for (uint64_t t = 0; t < partial; ++t)  // the re-staged tokens keep their written state
          stage_.written.put(l.res_blocks[0], static_cast<uint32_t>(t),
                             written_.test(l.blocks[lp / bs], static_cast<uint32_t>(lp % bs + t)));
      }
      l.n_lp = lp;
      const size_t keep_blocks = static_cast<size_t>((lp + bs - 1) / bs);
      while (l.blocks.size() > keep_blocks) {
        release_block(l.blocks.back());
        l.blocks.pop_back();
      }
    }
    tokens_stored_ -= l.n_tokens - keep;
    l.n_tokens = keep;
    l.reserved_at = std::min(l.reserved_at, keep);
    if (s.track_scores) l.scores.resize(keep * cfg_.num_kv_heads);
  }
  s.length = new_length;
  s.stamp = seqs_.new_stamp();
  if (unit > 1) note_usage();  // re-staging may have taken residual blocks
}

void Pool::seq_free(uint64_t id) {
  std::unique_lock lk(mu_);
  Sequence *s = seqs_.find(id);
  if (!s) fail(Errc::SeqNotFound, "sequence " + u64s(id) + " does not exist (freed twice?)");
  // Newest blocks first, so a prefix chain enters the LRU children before
  // parents and is reclaimed from its end.
  size_t most = 0;
  for (const LayerTable &l : s->layers) {
    tokens_stored_ -= l.n_tokens;
    most = std::max(most, l.blocks.size());
    for (int32_t b : l.res_blocks) stage_.release(b);
  }
  for (int32_t b : s->sink_blocks) stage_.release(b);
  for (size_t i = most; i-- > 0;)
    for (const LayerTable &l : s->layers)
      if (i < l.blocks.size()) release_block(l.blocks[i]);
  retire_sequence(seqs_.take(id));
}

uint64_t Pool::seq_length(uint64_t id) const {
  std::shared_lock lk(mu_);
  return find(id).length;
}

uint64_t Pool::seq_layer_tokens(uint64_t id, uint32_t layer) const {
  std::shared_lock lk(mu_);
  const Sequence &s = find(id);
  check_caller_layer(layer);
  uint64_t most = 0;
  for (uint32_t h = 0; h < heads(); ++h)
    most = std::max(most, s.layers[static_cast<size_t>(layer) * heads() + h].n_tokens);
  return most;
}

void Pool::seq_reserve(uint64_t id, uint64_t n_new, int64_t *slot_mapping) {
  std::unique_lock lk(mu_);
  Sequence &s = find(id);
  if (n_new == 0) fail(Errc::InvalidArgument, "n_new 0: reserve at least one token");
  if (n_new > kMaxLength - s.length)
    fail(Errc::Overflow, "length " + u64s(s.length) + " + " + u64s(n_new) +
                             " tokens exceeds the maximum of " + u64s(kMaxLength));
  // Auto-eviction (a policy with auto_evict and a budget): make room under
  // the cap first. It stays done even if the reservation below then fails.
  if (const PolicySpec *pol = policy_of(s);
      pol && pol->auto_evict && (pol->budget_tokens || pol->kind == PolicyKind::DuoAttention)) {
    bool over = false;
    if (pol->kind == PolicyKind::DuoAttention) {  // streaming heads past sinks + window
      const uint64_t cap = uint64_t(pol->sink_tokens) + pol->recent_tokens;
      for (size_t li = 0; li < s.layers.size() && !over; ++li)
        over = policy::duo_streams(*pol, li) && s.layers[li].n_tokens + n_new > cap;
    } else if (pol->head_budget ==
               policy::HeadBudget::AdaKV) {  // a layer's heads share H x the cap
      const uint32_t H = heads();
      for (size_t l0 = 0; l0 < s.layers.size() && !over; l0 += H) {
        uint64_t total = 0;
        for (uint32_t hh = 0; hh < H; ++hh) total += s.layers[l0 + hh].n_tokens + n_new;
        uint64_t cap_total;  // H x the cap, saturating
        if (__builtin_mul_overflow(uint64_t(H), pol->budget_tokens, &cap_total))
          cap_total = UINT64_MAX;
        over = total > cap_total;
      }
    } else {
      for (const LayerTable &l : s.layers) over = over || l.n_tokens + n_new > pol->budget_tokens;
    }
    if (over) evict_locked(id, s, *pol, n_new, nullptr);
  }
  if (s.track_scores)  // capacity for the new tokens' scores (may throw: nothing changed yet)
    for (LayerTable &l : s.layers) l.scores.reserve((l.n_tokens + n_new) * cfg_.num_kv_heads);
  auto grow_scores = [&] {  // within the reserved capacity: cannot throw
    if (s.track_scores)
      for (LayerTable &l : s.layers) l.scores.resize(l.n_tokens * cfg_.num_kv_heads, 0.0f);
  };
  const BlockDiv bs = block_div(cfg_.block_size);
  if (!stage_.active) {
    uint64_t needed = 0, held_after = 0;
    Need need(*this), held(*this);  // per block format
    for (uint32_t li = 0; li < cfg_.num_layers; ++li) {
      const LayerTable &l = s.layers[li];
      uint64_t n = (l.n_tokens + n_new + bs - 1) / bs - l.blocks.size();
      held_after += (l.n_tokens + n_new + bs - 1) / bs;
      if (l.n_tokens % bs != 0 && alloc_.refcount(l.blocks.back()) > 1) ++n;  // copy-on-write
      needed += n;
      need.add(li, n);
      held.add(li, (l.n_tokens + n_new + bs - 1) / bs);
    }
    // Never fits: the sequence alone would hold more blocks than the pool
    // has (its shared blocks counted once, no copy-on-write then needed).
    if (!ever_fits(held)) {
      uint64_t most = 0;  // the largest table's blocks
      for (const LayerTable &l : s.layers)
        most = std::max(most, (l.n_tokens + n_new + bs - 1) / bs);
      fail(Errc::ExceedsCapacity,
           "exceeds the pool's capacity: sequence " + u64s(id) + " with " + u64s(n_new) +
               " more tokens needs " + u64s(held_after) + " blocks (" + u64s(cfg_.num_layers) +
               (headwise() ? " (layer, KV head) tables of up to " : " layers of up to ") +
               u64s(most) + "), the pool has " + u64s(alloc_.num_blocks()) + " in all" +
               class_detail(held, true));
    }
    if (!fits(need))
      fail(Errc::PoolExhausted, "pool exhausted: reserving " + u64s(n_new) + " tokens needs " +
                                    u64s(needed) + " blocks, " + u64s(alloc_.available()) +
                                    " available" + class_detail(need, false));
    for (LayerTable &l : s.layers) {  // may throw bad_alloc: nothing changed yet
      const size_t target = static_cast<size_t>((l.n_tokens + n_new + bs - 1) / bs);
      if (l.blocks.capacity() < target) l.blocks.reserve(std::max(target, 2 * l.blocks.capacity()));
    }
    // From here on nothing throws.
    for (uint32_t li = 0; li < cfg_.num_layers; ++li) {
      LayerTable &l = s.layers[li];
      if (l.n_tokens % bs != 0 && alloc_.refcount(l.blocks.back()) > 1)
        l.blocks.back() = cow_copy(l.blocks.back());
      else if (l.n_tokens % bs != 0)
        // its free slots will be written: it leaves the prefix index
        prefix_drop_block(l.blocks.back());
      const uint64_t target = (l.n_tokens + n_new + bs - 1) / bs;
      while (l.blocks.size() < target) l.blocks.push_back(take_layer_block(li));
      // The new slots are unwritten until an append writes them (device
      // pools also zero them: their kernels read the arena directly).
      for (uint64_t i = 0; i < n_new;) {
        const uint64_t idx = l.n_tokens + i;
        const uint32_t slot = static_cast<uint32_t>(idx % bs);
        const uint64_t run = std::min<uint64_t>(n_new - i, bs - slot);
        const int32_t b = l.blocks[idx / bs];
        written_.clear_owned(b, slot, run);  // (exclusive lock)
        store_->reserved(b, slot, run);
        i += run;
      }
      if (slot_mapping) {
        int64_t *out = slot_mapping + static_cast<uint64_t>(li) * n_new;
        for (uint64_t i = 0; i < n_new; ++i) {
          const uint64_t idx = l.n_tokens + i;
          out[i] = static_cast<int64_t>(l.blocks[idx / bs]) * static_cast<int64_t>(bs) +
                   static_cast<int64_t>(idx % bs);
        }
      }
      l.n_tokens += n_new;
      tokens_stored_ += n_new;
      l.n_lp = l.n_tokens;
    }
    s.length += n_new;
    grow_scores();
    note_usage();
    return;
  }
  // With a residual: new tokens go to residual blocks; the oldest residual
  // tokens beyond the window (already written: they precede this reserve)
  // are encoded into codec blocks in units of stage_.unit.
  const uint64_t target_hp = stage_.hp_target(s.length + n_new);
  const uint32_t unit = stage_.unit;
  std::vector<uint64_t> aged(cfg_.num_layers);
  uint64_t need_lp = 0, need_res = 0;
  // The sequence's attention-sink copies come with its first reserve.
  const uint64_t need_sinks = s.sink_blocks.empty() ? stage_.sink_blocks_needed() : 0;
  need_res += need_sinks;
  // Residual blocks in the order the changes below take and free them: the
  // sinks first, then per layer aging frees the blocks it leaves (those no
  // other sequence shares) before the layer's new ones are taken.
  bool res_fits = need_sinks <= stage_.alloc.available();
  uint64_t res_avail = res_fits ? stage_.alloc.available() - need_sinks : 0;
  uint64_t res_after = s.sink_blocks.size() + need_sinks;  // residual blocks held after the reserve
  Need need_lp_f(*this);                                   // need_lp per block format
  for (uint32_t li = 0; li < cfg_.num_layers; ++li) {
    const LayerTable &l = s.layers[li];
    const uint64_t hp_old = l.n_tokens - l.n_lp, hp_after = hp_old + n_new;
    uint64_t a = hp_after > target_hp ? std::min(hp_after - target_hp, hp_old) : 0;
    a -= a % unit;
    aged[li] = a;
    if (a) {
      uint64_t n = (l.n_lp + a + bs - 1) / bs - l.blocks.size();
      if (l.n_lp % bs != 0 && alloc_.refcount(l.blocks.back()) > 1) ++n;
      need_lp += n;
      need_lp_f.add(li, n);
    }
    // Residual blocks after aging: the kept ones plus new ones.
    const uint64_t off = l.res_off + a;
    const uint64_t kept = l.res_blocks.size() - std::min<uint64_t>(off / bs, l.res_blocks.size());
    const uint64_t hp_left = hp_after - a;
    const uint64_t first = hp_left == n_new ? 0 : off % bs;  // residual emptied: start afresh
    const uint64_t total = (first + hp_left + bs - 1) / bs;
    const uint64_t kept_used = hp_left == n_new ? 0 : kept;
    res_after += total;
    uint64_t take = total > kept_used ? total - kept_used : 0;
    if (kept_used && (l.res_off + hp_old) % bs != 0 &&
        stage_.alloc.refcount(l.res_blocks.back()) > 1)
      ++take;
    need_res += take;
    const size_t dropped = static_cast<size_t>(l.res_blocks.size() - kept_used);
    for (size_t i = 0; i < dropped; ++i)
      res_avail += stage_.alloc.refcount(l.res_blocks[i]) == 1 ? 1 : 0;
    if (take > res_avail)
      res_fits = false;
    else
      res_avail -= take;
  }
  {  // Never fits: what the sequence alone would hold after this reserve.
    // (The residual keeps its offset in its first block: what no one else's
    // freeing can change.)
    uint64_t lp_after = 0;
    Need lp_after_f(*this);
    for (uint32_t li = 0; li < cfg_.num_layers; ++li) {
      const uint64_t n = (s.layers[li].n_lp + aged[li] + bs - 1) / bs;
      lp_after += n;
      lp_after_f.add(li, n);
    }
    if (!ever_fits(lp_after_f) || res_after > stage_.alloc.num_blocks())
      fail(Errc::ExceedsCapacity,
           "exceeds the pool's capacity: sequence " + u64s(id) + " with " + u64s(n_new) +
               " more tokens needs " + u64s(lp_after) + " blocks (the pool has " +
               u64s(alloc_.num_blocks()) + ") and " + u64s(res_after) +
               " residual blocks (the pool has " + u64s(stage_.alloc.num_blocks()) + ")" +
               class_detail(lp_after_f, true));
  }
  if (!fits(need_lp_f) || !res_fits)
    fail(Errc::PoolExhausted,
         "pool exhausted: reserving " + u64s(n_new) + " tokens needs " + u64s(need_lp) +
             " blocks (" + u64s(alloc_.available()) + " available) and " + u64s(need_res) +
             " residual blocks (" + u64s(stage_.alloc.available()) +
             " available, more as aging frees some)" + class_detail(need_lp_f, false));
  for (uint32_t li = 0; li < cfg_.num_layers; ++li) {  // may throw bad_alloc: nothing changed yet
    LayerTable &l = s.layers[li];
    const size_t lp_target = static_cast<size_t>((l.n_lp + aged[li] + bs - 1) / bs);
    if (l.blocks.capacity() < lp_target)
      l.blocks.reserve(std::max(lp_target, 2 * l.blocks.capacity()));
    const size_t res_target = l.res_blocks.size() + static_cast<size_t>((n_new + bs - 1) / bs) + 1;
    if (l.res_blocks.capacity() < res_target)
      l.res_blocks.reserve(std::max(res_target, 2 * l.res_blocks.capacity()));
  }
  s.sink_blocks.reserve(need_sinks);
  // From here on nothing throws.
  if (need_sinks) {
    while (s.sink_blocks.size() < need_sinks) s.sink_blocks.push_back(stage_.take());
    stage_.assign_sinks(s);
  }
  for (uint32_t li = 0; li < cfg_.num_layers; ++li) {
    LayerTable &l = s.layers[li];
    if (aged[li]) {
      if (l.n_lp % bs != 0 && alloc_.refcount(l.blocks.back()) > 1)
        l.blocks.back() = cow_copy(l.blocks.back());
      stage_.age(li, l, aged[li]);
    }
    const uint64_t hp = l.n_tokens - l.n_lp;
    if (hp == 0) {
      for (int32_t b : l.res_blocks) stage_.release(b);
      l.res_blocks.clear();
      l.res_off = 0;
    } else if ((l.res_off + hp) % bs != 0 && stage_.alloc.refcount(l.res_blocks.back()) > 1) {
      l.res_blocks.back() = stage_.cow(l.res_blocks.back());
    }
    const uint64_t target = (l.res_off + hp + n_new + bs - 1) / bs;
    while (l.res_blocks.size() < target) l.res_blocks.push_back(stage_.take());
    for (uint64_t i = 0; i < n_new;) {  // unwritten until an append writes them
      const uint64_t r = l.res_off + hp + i;
      const uint64_t run = std::min<uint64_t>(n_new - i, bs - r % bs);
      stage_.written.clear(l.res_blocks[r / bs], static_cast<uint32_t>(r % bs), run);
      i += run;
    }
    if (slot_mapping) {  // slots in the residual arena
      int64_t *out = slot_mapping + static_cast<uint64_t>(li) * n_new;
      for (uint64_t i = 0; i < n_new; ++i) {
        const uint64_t r = l.res_off + hp + i;
        out[i] = static_cast<int64_t>(l.res_blocks[r / bs]) * static_cast<int64_t>(bs) +
                 static_cast<int64_t>(r % bs);
      }
    }
    l.reserved_at = l.n_tokens;
    l.n_tokens += n_new;
    tokens_stored_ += n_new;
  }
  s.length += n_new;
  grow_scores();
  note_usage();
}

}  // namespace kvc::core
