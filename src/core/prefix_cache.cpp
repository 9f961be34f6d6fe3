// The prefix cache of a pool (core/prefix_cache.h). Spec: docs/prefix-cache.md.
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include "common/error.h"
#include "core/offload.h"
#include "core/prefix_cache.h"

namespace kvc::core {

PrefixCache::PrefixCache(PoolCore &c) : c_(c), offload_(std::make_unique<Offload>(c, *this)) {}

PrefixCache::~PrefixCache() = default;

void PrefixCache::need_enabled() const {
  if (!st_)
    fail(Errc::InvalidArgument, "the prefix cache is not enabled (kvc_pool_enable_prefix_cache)");
}

void PrefixCache::enable(const PrefixConfig &c) {
  std::unique_lock lk(c_.mu_);
  if (st_) fail(Errc::InvalidArgument, "the prefix cache of this pool is already enabled");
  if (c.hash != PrefixHash::Sha256 && c.hash != PrefixHash::Xxh3_128)
    fail(Errc::InvalidArgument,
         "unknown prefix hash " + std::to_string(static_cast<int32_t>(c.hash)));
  if (c_.stage_.active)
    fail(Errc::Unsupported,
         "the prefix cache needs a pool without a residual window, hybrid precision, "
         "per-channel (KIVI) codec or attention sinks (their tokens are staged and encoded "
         "as they age)");
  prefix::check_extra_key_names(c.extra_key_names);
  auto st = std::make_unique<PrefixState>(c.hash);
  st->verify_tokens = c.verify_tokens;
  st->extra_names = c.extra_key_names;
  st->names_sorted.resize(st->extra_names.size());
  for (uint32_t i = 0; i < st->names_sorted.size(); ++i) st->names_sorted[i] = i;
  std::sort(st->names_sorted.begin(), st->names_sorted.end(),
            [&](uint32_t a, uint32_t b) { return st->extra_names[a] < st->extra_names[b]; });
  uint8_t seed[32];
  if (c.seed_set) {
    std::memcpy(seed, c.seed, 32);
  } else if (RAND_bytes(seed, 32) != 1) {
    fail(Errc::Internal, "cannot draw a random prefix seed (OpenSSL RAND_bytes failed)");
  }
  st->root = st->hasher.root(seed, pool_fingerprint(c_.cfg_), c.model_id, c.tokenizer_id);
  st->block_entry.assign(c_.alloc_.num_blocks(), -1);
  st_ = std::move(st);
  c_.events_ = this;
}

uint32_t PrefixCache::key_size() const {
  std::shared_lock lk(c_.mu_);
  need_enabled();
  return st_->hasher.key_size();
}

void PrefixCache::set_callback(PrefixEventFn fn, void *user,
                               const std::function<void()> &under_lock) {
  std::unique_lock lk(c_.mu_);
  need_enabled();
  if (under_lock)
    under_lock();  // the caller's state the callback reads, changed while no event can run
  st_->callback = fn;
  st_->user = user;
}

// Drops entry e and, recursively, its children (a chain never keeps a block
// whose parent is gone). Cached blocks of dropped entries become free;
// `taken` is a block the allocator already handed out (not to uncache).
void PrefixCache::drop_entry(uint32_t e, int32_t taken) {
  PrefixState &ps = *st_;
  std::vector<uint32_t> stack{e};
  while (!stack.empty()) {
    const uint32_t x = stack.back();
    stack.pop_back();
    PrefixEntry &en = ps.entries[x];
    if (!en.live) continue;
    for (uint32_t c : en.children) stack.push_back(c);
    en.children.clear();
    for (int32_t b : en.blocks) {
      ps.block_entry[b] = -1;
      if (b != taken && c_.alloc_.state(b) == BlockAllocator::State::Cached) {
        c_.alloc_.uncache(b);
        if (c_.cfg_.flags & kFlagZeroOnFree) c_.zero_block(b);
      }
    }
    ps.map.erase(en.key);  // before the entry is reused
    // Unlink from the parent's children.
    std::vector<uint32_t> *siblings = &ps.root_children;
    if (en.depth > 1) {
      const int64_t pe = ps.map.find(en.parent);
      siblings = pe >= 0 ? &ps.entries[static_cast<size_t>(pe)].children : nullptr;
    }
    if (siblings)
      siblings->erase(std::remove(siblings->begin(), siblings->end(), x), siblings->end());
    en.live = false;
    ++ps.stats.removed;
    if (ps.callback)
      ps.callback(ps.user, 1, en.key.b.data(), en.parent.b.data(), ps.hasher.key_size(), en.depth);
    en.blocks.clear();
    en.tokens.clear();
    ps.free_entries.push_back(x);
  }
}

void PrefixCache::before_write(int32_t b) {
  if (!registered(b)) return;
  drop_entry(static_cast<uint32_t>(st_->block_entry[b]), -1);
}

void PrefixCache::reclaimed(int32_t b) {
  if (!registered(b)) return;
  ++st_->stats.reclaimed;
  // Demotion (docs/tiers.md): the entry's blocks are copied before any of
  // them can be handed out again, then written by the offload writer.
  if (offload_->active()) offload_->demote_entry(static_cast<uint32_t>(st_->block_entry[b]));
  drop_entry(static_cast<uint32_t>(st_->block_entry[b]), b);
}

// A registered block became cached: its cached ancestors move to the newest
// end of the LRU, so a chain is reclaimed from its end (children first).
void PrefixCache::cached(int32_t b) {
  PrefixState &ps = *st_;
  const PrefixEntry *en = &ps.entries[static_cast<uint32_t>(ps.block_entry[b])];
  while (en->depth > 1) {
    const int64_t pe = ps.map.find(en->parent);
    if (pe < 0) break;
    const PrefixEntry &par = ps.entries[static_cast<size_t>(pe)];
    bool any = false;
    for (int32_t pb : par.blocks)
      if (c_.alloc_.state(pb) == BlockAllocator::State::Cached) {
        c_.alloc_.touch(pb);
        any = true;
      }
    if (!any) break;
    en = &par;
  }
}

ExtraKeys PrefixCache::extra_keys(const PrefixExtra *ex, uint32_t nx) const {
  std::shared_lock lk(c_.mu_);
  need_enabled();
  return st_->extra_keys(ex, nx);
}

void PrefixCache::keys(const int32_t *tokens, uint64_t n, const ExtraKeys &kx, uint8_t *out) const {
  std::shared_lock lk(c_.mu_);
  need_enabled();
  const PrefixState &ps = *st_;
  const uint64_t bs = c_.cfg_.block_size, ks = ps.hasher.key_size();
  BlockKey parent = ps.root;
  std::vector<uint8_t> scratch;
  for (uint64_t i = 0; i < n / bs; ++i) {
    parent = ps.hasher.block(parent, tokens + i * bs, static_cast<uint32_t>(bs), kx, scratch);
    std::memcpy(out + i * ks, parent.b.data(), ks);
  }
}

PrefixResult PrefixCache::lookup(const int32_t *tokens, uint64_t n, const ExtraKeys &kx,
                                 bool partial) const {
  std::shared_lock lk(c_.mu_);
  need_enabled();
  const PrefixState &ps = *st_;
  const uint64_t bs = c_.cfg_.block_size;
  PrefixResult r;
  const prefix::Walk w = prefix::walk(ps, bs, tokens, n, kx, partial);
  r.hit_blocks = w.path.size();
  r.hit_tokens = r.hit_blocks * bs;
  r.partial_tokens = w.partial_tokens;
  ps.stats.queried_tokens.fetch_add(n, std::memory_order_relaxed);
  ps.stats.hit_tokens.fetch_add(r.hit_tokens, std::memory_order_relaxed);
  ps.stats.partial_tokens.fetch_add(r.partial_tokens, std::memory_order_relaxed);
  return r;
}

PrefixResult PrefixCache::attach(uint64_t id, const int32_t *tokens, uint64_t n,
                                 const ExtraKeys &kx, bool partial) {
  std::unique_lock lk(c_.mu_);
  need_enabled();
  if (c_.seqs_.find(id)) fail(Errc::SeqExists, "sequence " + u64s(id) + " already exists");
  PrefixState &ps = *st_;
  const uint64_t bs = c_.cfg_.block_size, nl = c_.cfg_.num_layers;
  PrefixResult r;
  const prefix::Walk w = prefix::walk(ps, bs, tokens, n, kx, partial);
  const std::vector<uint32_t> &path = w.path;
  const PrefixEntry *part_src =
      w.partial_entry >= 0 ? &ps.entries[static_cast<size_t>(w.partial_entry)] : nullptr;
  r.hit_blocks = path.size();
  r.hit_tokens = r.hit_blocks * bs;
  r.partial_tokens = w.partial_tokens;
  if (part_src) {
    // The copies need nl fresh blocks; cached blocks this call references
    // (the whole-block path, the pinned source) stop being available.
    PoolCore::Need need(c_);  // the copies, then the pinned cached blocks, per block format
    for (uint32_t li = 0; li < nl; ++li) need.add(li, 1);
    std::vector<int32_t> seen;
    auto count = [&](int32_t b) {
      if (c_.alloc_.state(b) == BlockAllocator::State::Cached &&
          std::find(seen.begin(), seen.end(), b) == seen.end()) {
        seen.push_back(b);
        need.add_block(b, 1);
      }
    };
    for (uint32_t e : path)
      for (int32_t b : ps.entries[e].blocks) count(b);
    for (int32_t b : part_src->blocks) count(b);
    if (!c_.fits(need)) {  // not enough room: whole blocks only
      r.partial_tokens = 0;
      part_src = nullptr;
    }
  }
  // Build the sequence (may throw before anything is referenced).
  auto s = std::make_unique<Sequence>();
  s->layers.resize(nl);
  for (uint64_t li = 0; li < nl; ++li) s->layers[li].blocks.reserve(path.size() + 1);
  Sequence *sp = c_.seqs_.insert(id, std::move(s));  // may throw: nothing changed yet
  // From here on nothing throws.
  for (uint32_t e : path)
    for (uint64_t li = 0; li < nl; ++li) {
      const int32_t b = ps.entries[e].blocks[li];
      c_.alloc_.ref(b);  // a cached block is revived
      sp->layers[li].blocks.push_back(b);
    }
  if (part_src) {
    const std::vector<int32_t> src_blocks = part_src->blocks;  // take_block may drop entries
    for (uint64_t li = 0; li < nl; ++li) {
      c_.alloc_.ref(src_blocks[li]);  // pinned while copying: take_block cannot reclaim it
    }
    for (uint64_t li = 0; li < nl; ++li) {
      const int32_t nb = c_.take_layer_block(static_cast<uint32_t>(li));
      c_.copy_block(nb, src_blocks[li]);
      sp->layers[li].blocks.push_back(nb);
    }
    for (uint64_t li = 0; li < nl; ++li) c_.release_block(src_blocks[li]);
  }
  const uint64_t len = r.hit_tokens + r.partial_tokens;
  for (LayerTable &l : sp->layers) {
    l.n_tokens = l.n_lp = len;
    c_.tokens_stored_ += len;
  }
  sp->length = len;
  ps.stats.queried_tokens.fetch_add(n, std::memory_order_relaxed);
  ps.stats.hit_tokens.fetch_add(r.hit_tokens, std::memory_order_relaxed);
  ps.stats.partial_tokens.fetch_add(r.partial_tokens, std::memory_order_relaxed);
  c_.note_usage();
  return r;
}

uint32_t PrefixCache::register_entry(const BlockKey &k, const BlockKey &parent,
                                     int64_t parent_entry, uint64_t depth, const int32_t *tokens,
                                     const BlockKey &xd, const std::vector<uint8_t> &xb,
                                     const int32_t *blocks) {
  PrefixState &ps = *st_;
  const uint64_t bs = c_.cfg_.block_size, nl = c_.cfg_.num_layers;
  uint32_t e;
  if (!ps.free_entries.empty()) {
    e = ps.free_entries.back();
    ps.free_entries.pop_back();
  } else {
    e = static_cast<uint32_t>(ps.entries.size());
    ps.entries.emplace_back();
  }
  PrefixEntry &en = ps.entries[e];
  en.key = k;
  en.parent = parent;
  en.extras = xd;
  en.extras_bytes = ps.verify_tokens ? xb : std::vector<uint8_t>{};
  en.parent_entry = parent_entry;
  en.depth = depth;
  en.blocks.assign(blocks, blocks + nl);
  for (uint64_t li = 0; li < nl; ++li) ps.block_entry[en.blocks[li]] = static_cast<int32_t>(e);
  en.tokens.assign(tokens, tokens + bs);
  en.children.clear();
  en.live = true;
  ps.map.insert(k, e);
  (parent_entry >= 0 ? ps.entries[static_cast<uint64_t>(parent_entry)].children : ps.root_children)
      .push_back(e);
  ++ps.stats.inserted;
  if (ps.callback)
    ps.callback(ps.user, 0, k.b.data(), parent.b.data(), ps.hasher.key_size(), en.depth);
  return e;
}

uint64_t PrefixCache::insert(uint64_t id, const int32_t *tokens, uint64_t n, const ExtraKeys &kx) {
  std::unique_lock lk(c_.mu_);
  need_enabled();
  Sequence &s = c_.find(id);
  PrefixState &ps = *st_;
  const uint64_t bs = c_.cfg_.block_size, nl = c_.cfg_.num_layers;
  if (n > s.length)
    fail(Errc::OutOfRange,
         u64s(n) + " tokens given but sequence " + u64s(id) + " has length " + u64s(s.length));
  // Whole blocks held unevicted by every layer (positions 0.. in order).
  uint64_t full = n / bs;
  for (const LayerTable &l : s.layers) {
    if (l.tail_index != 0 || l.tail_pos != 0) {
      full = 0;  // evicted or shifted: not a plain prefix any more
      break;
    }
    full = std::min(full, l.n_lp / bs);
  }
  // Only what appends wrote becomes findable: a block with a slot that was
  // reserved but never written refuses the whole call (nothing registered).
  for (uint32_t li = 0; li < nl; ++li)
    if (const uint64_t u = c_.first_unwritten(s.layers[li], 0, full * bs); u != UINT64_MAX)
      fail(Errc::InvalidArgument,
           "position " + u64s(s.layers[li].position_of(u)) + " of layer " + u64s(li) +
               " of sequence " + u64s(id) +
               " was reserved but never written (kvc_append): prefix blocks are registered "
               "only once every slot is written; nothing registered");
  const BlockKey xd = prefix::prefix_extras_digest(ps.hasher, kx);
  const std::vector<uint8_t> &xb = kx.enc;
  BlockKey parent = ps.root;
  std::vector<uint8_t> scratch;
  uint64_t added = 0;
  int64_t parent_entry = -1;
  for (uint64_t i = 0; i < full; ++i) {
    const BlockKey k =
        ps.hasher.block(parent, tokens + i * bs, static_cast<uint32_t>(bs), kx, scratch);
    const int64_t found = ps.map.find(k);
    if (found >= 0) {  // already registered (by this sequence or with the same content by another)
      const PrefixEntry &en = ps.entries[static_cast<size_t>(found)];
      if (!prefix::verified(ps, en, tokens + i * bs, xb, parent_entry, i + 1))
        break;  // a collision: stop
      parent = k;
      parent_entry = found;
      continue;
    }
    bool free_blocks = true;
    for (uint64_t li = 0; li < nl; ++li)
      free_blocks = free_blocks && ps.block_entry[s.layers[li].blocks[i]] < 0;
    if (!free_blocks)
      break;  // a block registered under another key (cannot be: content is the key) - stop
    std::vector<int32_t> blocks(nl);
    for (uint64_t li = 0; li < nl; ++li) blocks[li] = s.layers[li].blocks[i];
    const uint32_t e =
        register_entry(k, parent, parent_entry, i + 1, tokens + i * bs, xd, xb, blocks.data());
    ++added;
    parent = k;
    parent_entry = e;
  }
  return added;
}

std::vector<std::string> PrefixCache::registered_keys() const {
  std::shared_lock lk(c_.mu_);
  std::vector<std::string> out;
  if (!st_) return out;
  for (const PrefixEntry &en : st_->entries)
    if (en.live)
      out.emplace_back(reinterpret_cast<const char *>(en.key.b.data()), st_->hasher.key_size());
  return out;
}

PrefixCounts PrefixCache::counts() const {
  std::shared_lock lk(c_.mu_);
  need_enabled();
  const PrefixState &ps = *st_;
  PrefixCounts c{};
  c.queried_tokens = ps.stats.queried_tokens.load();
  c.hit_tokens = ps.stats.hit_tokens.load();
  c.partial_tokens = ps.stats.partial_tokens.load();
  c.inserted = ps.stats.inserted;
  c.removed = ps.stats.removed;
  c.reclaimed = ps.stats.reclaimed;
  for (const PrefixEntry &en : ps.entries) {
    if (!en.live) continue;
    ++c.registered;
    bool all_cached = true;
    for (int32_t b : en.blocks)
      all_cached = all_cached && c_.alloc_.state(b) == BlockAllocator::State::Cached;
    ++(all_cached ? c.reclaimable : c.referenced);
  }
  return c;
}

std::string PrefixCache::check() const {
  if (!st_) return {};
  const PrefixState &ps = *st_;
  uint64_t live = 0;
  for (size_t e = 0; e < ps.entries.size(); ++e) {
    const PrefixEntry &en = ps.entries[e];
    if (!en.live) continue;
    ++live;
    if (ps.map.find(en.key) != static_cast<int64_t>(e)) return "prefix entry not in the key map";
    if (en.blocks.size() != c_.cfg_.num_layers) return "prefix entry without a block per layer";
    for (int32_t b : en.blocks) {
      if (ps.block_entry[b] != static_cast<int32_t>(e))
        return "prefix block not mapped to its entry";
      if (c_.alloc_.state(b) == BlockAllocator::State::Free)
        return "prefix entry holds a free block";
    }
  }
  if (live != ps.map.size()) return "prefix key map and entries disagree";
  for (size_t b = 0; b < ps.block_entry.size(); ++b) {
    const int32_t e = ps.block_entry[b];
    if (e >= 0 && !ps.entries[static_cast<size_t>(e)].live)
      return "block mapped to a dropped prefix entry";
    if (c_.alloc_.state(static_cast<int32_t>(b)) == BlockAllocator::State::Cached && e < 0)
      return "cached block outside the prefix index";
  }
  return {};
}

}  // namespace kvc::core
