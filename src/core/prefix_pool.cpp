// The prefix cache inside the pool: registering the full blocks of a
// sequence under chained keys, looking prompts up, attaching cached blocks to
// a new sequence, LRU reclaim that keeps chains whole, and the events an
// external router can follow. Spec: docs/prefix-cache.md.
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include "core/error.h"
#include "core/pool.h"

namespace kvc::core {

namespace {
std::string u64s(uint64_t v) { return std::to_string(v); }

void put_u32(std::vector<uint8_t> &b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_f64(std::vector<uint8_t> &b, double d) {
  uint64_t v;
  std::memcpy(&v, &d, 8);
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void put_u64(uint8_t *p, uint64_t v) {
  for (int k = 0; k < 8; ++k) p[k] = static_cast<uint8_t>(v >> (8 * k));
}
void put_u32(uint8_t *p, uint32_t v) {
  for (int k = 0; k < 4; ++k) p[k] = static_cast<uint8_t>(v >> (8 * k));
}

// The positional (legacy) form: "KVCX" | u32 count | count x (u64 size | bytes).
ExtraKeys positional_extras(const PrefixExtra *ex, uint32_t nx) {
  uint64_t size = 8;
  for (uint32_t i = 0; i < nx; ++i) size += 8 + ex[i].size;
  ExtraKeys kx;
  kx.enc.resize(size);
  uint8_t *p = kx.enc.data();
  std::memcpy(p, "KVCX", 4);
  put_u32(p + 4, nx);
  p += 8;
  for (uint32_t i = 0; i < nx; ++i) {
    put_u64(p, ex[i].size);
    p += 8;
    if (ex[i].size) std::memcpy(p, ex[i].data, ex[i].size);
    p += ex[i].size;
  }
  return kx;
}

std::string joined(const std::vector<std::string> &names) {
  std::string s;
  for (const std::string &n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}
// With verify_tokens, a hit must be the block itself, not just its key: the
// same tokens, the same extra keys and the same parent (so a forced
// collision can never return another prompt's, tenant's or position's KV).
bool verified(const PrefixState &ps, const PrefixEntry &en, const int32_t *tokens, const std::vector<uint8_t> &xb,
              int64_t parent_entry, uint64_t depth) {
  if (!ps.verify_tokens) return true;
  return en.depth == depth && en.parent_entry == parent_entry && en.extras_bytes == xb &&
         std::equal(en.tokens.begin(), en.tokens.end(), tokens);
}

PrefixKey extras_digest(const PrefixHasher &h, const ExtraKeys &kx) {
  return h.digest(kx.enc);
}
}  // namespace

void check_extra_key_names(const std::vector<std::string> &names) {
  if (names.size() > kMaxExtraKeyNames)
    fail(Errc::InvalidArgument,
         "n_extra_key_names " + u64s(names.size()) + ": at most " + u64s(kMaxExtraKeyNames));
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string &n = names[i];
    if (n.empty()) fail(Errc::InvalidArgument, "extra_key_names[" + u64s(i) + "] is empty");
    if (n.size() > kMaxExtraKeyNameBytes)
      fail(Errc::InvalidArgument, "extra_key_names[" + u64s(i) + "] is longer than " +
                                      u64s(kMaxExtraKeyNameBytes) + " bytes");
    if (n.find('\0') != std::string::npos)
      fail(Errc::InvalidArgument, "extra_key_names[" + u64s(i) + "] contains a NUL byte");
    for (size_t j = 0; j < i; ++j)
      if (names[j] == n)
        fail(Errc::InvalidArgument, "extra_key_names[" + u64s(i) + "] \"" + n +
                                        "\" is declared twice (also [" + u64s(j) + "])");
  }
}

// Named form (docs/prefix-cache.md): one value per declared name, in
// declaration order; the key depends only on the assignment {name: non-empty
// value}: "KVCN" | u32 m | m x (u64 len | name | u64 size | bytes), names
// sorted by their bytes. With no non-empty value the call has no extra keys
// and takes the positional form of zero extras (the key of a pool without
// names and without extras).
ExtraKeys PrefixState::extra_keys(const PrefixExtra *ex, uint32_t nx) const {
  if (extra_names.empty()) return positional_extras(ex, nx);
  if (nx != extra_names.size())
    fail(Errc::InvalidArgument,
         "this pool declares " + u64s(extra_names.size()) + " extra-key names (" +
             joined(extra_names) +
             "): pass one value per name, in that order (empty for none); got " + u64s(nx) +
             " extra keys");
  uint64_t size = 8;
  uint32_t m = 0;
  for (uint32_t i = 0; i < nx; ++i)
    if (ex[i].size) {
      size += 16 + extra_names[i].size() + ex[i].size;
      ++m;
    }
  if (m == 0) return positional_extras(nullptr, 0);
  ExtraKeys kx;
  kx.named = true;
  kx.enc.resize(size);
  uint8_t *p = kx.enc.data();
  std::memcpy(p, "KVCN", 4);
  put_u32(p + 4, m);
  p += 8;
  for (uint32_t i : names_sorted) {
    if (!ex[i].size) continue;
    const std::string &name = extra_names[i];
    put_u64(p, name.size());
    std::memcpy(p + 8, name.data(), name.size());
    p += 8 + name.size();
    put_u64(p, ex[i].size);
    std::memcpy(p + 8, ex[i].data, ex[i].size);
    p += 8 + ex[i].size;
  }
  return kx;
}

// The pool's fingerprint: geometry and storage, little-endian fields in a
// fixed order (docs/prefix-cache.md).
std::vector<uint8_t> pool_fingerprint(const PoolConfig &c) {
  std::vector<uint8_t> b;
  for (uint32_t v : {c.num_layers, c.num_q_heads, c.num_kv_heads, c.head_dim, c.block_size,
                     static_cast<uint32_t>(c.k_dtype), static_cast<uint32_t>(c.v_dtype),
                     static_cast<uint32_t>(c.layout)})
    put_u32(b, v);
  for (const codec::Spec *sp : {&c.k_codec, &c.v_codec}) {
    for (uint32_t v : {static_cast<uint32_t>(sp->dtype), static_cast<uint32_t>(sp->gran), sp->group,
                       // bit 0: asymmetric, bit 1: full range (0 for pools without it, as before it existed)
                       static_cast<uint32_t>(sp->asym) | (sp->full_range ? 2u : 0u),
                       static_cast<uint32_t>(sp->scale_dtype), sp->rotation_block})
      put_u32(b, v);
    put_f64(b, sp->static_scale);
  }
  put_u32(b, c.residual_window);
  put_u32(b, static_cast<uint32_t>(c.residual_dtype));
  put_f64(b, c.residual_fraction);
  // Pre-RoPE keys (absent without: older keys and records still match),
  // with the RoPE settings their codes depend on.
  if (c.flags & kFlagPreRopeKeys) {
    put_u32(b, kFlagPreRopeKeys);
    put_u32(b, static_cast<uint32_t>(c.rope_style));
    put_u32(b, c.rope_dims ? c.rope_dims : c.head_dim);
    put_f64(b, c.rope_theta);
  }
  return b;
}

void Pool::prefix_enable(const PrefixConfig &c) {
  std::unique_lock lk(mu_);
  if (prefix_) fail(Errc::InvalidArgument, "the prefix cache of this pool is already enabled");
  if (c.hash != PrefixHash::Sha256 && c.hash != PrefixHash::Xxh3_128)
    fail(Errc::InvalidArgument, "unknown prefix hash " + std::to_string(static_cast<int32_t>(c.hash)));
  if (residual())
    fail(Errc::Unsupported, "the prefix cache needs a pool without a residual window, hybrid precision, "
                            "per-channel (KIVI) codec or attention sinks (their tokens are staged and encoded "
                            "as they age)");
  check_extra_key_names(c.extra_key_names);
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
  st->root = st->hasher.root(seed, pool_fingerprint(cfg_), c.model_id, c.tokenizer_id);
  st->block_entry.assign(alloc_.num_blocks(), -1);
  prefix_ = std::move(st);
}

uint32_t Pool::prefix_key_size() const {
  std::shared_lock lk(mu_);
  if (!prefix_) fail(Errc::InvalidArgument, "the prefix cache is not enabled (kvc_pool_enable_prefix_cache)");
  return prefix_->hasher.key_size();
}

bool Pool::registered(int32_t b) const { return prefix_ && prefix_->block_entry[b] >= 0; }

void Pool::prefix_set_callback(PrefixEventFn fn, void *user, const std::function<void()> &under_lock) {
  std::unique_lock lk(mu_);
  if (!prefix_) fail(Errc::InvalidArgument, "the prefix cache is not enabled (kvc_pool_enable_prefix_cache)");
  if (under_lock) under_lock();  // the caller's state the callback reads, changed while no event can run
  prefix_->callback = fn;
  prefix_->user = user;
}

// Drops entry e and, recursively, its children (a chain never keeps a block
// whose parent is gone). Cached blocks of dropped entries become free;
// `taken` is a block the allocator already handed out (not to uncache).
void Pool::prefix_drop_entry(uint32_t e, int32_t taken) {
  PrefixState &ps = *prefix_;
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
      if (b != taken && alloc_.state(b) == BlockAllocator::State::Cached) {
        alloc_.uncache(b);
        if (cfg_.flags & kFlagZeroOnFree) zero_block(b);
      }
    }
    ps.map.erase(en.key);  // before the entry is reused
    // Unlink from the parent's children.
    std::vector<uint32_t> *siblings = &ps.root_children;
    if (en.depth > 1) {
      const int64_t pe = ps.map.find(en.parent);
      siblings = pe >= 0 ? &ps.entries[static_cast<size_t>(pe)].children : nullptr;
    }
    if (siblings) siblings->erase(std::remove(siblings->begin(), siblings->end(), x), siblings->end());
    en.live = false;
    ++ps.stats.removed;
    if (ps.callback) ps.callback(ps.user, 1, en.key.b.data(), en.parent.b.data(), ps.hasher.key_size(), en.depth);
    en.blocks.clear();
    en.tokens.clear();
    ps.free_entries.push_back(x);
  }
}

void Pool::prefix_drop_block(int32_t b) {
  if (!registered(b)) return;
  prefix_drop_entry(static_cast<uint32_t>(prefix_->block_entry[b]), -1);
}

void Pool::prefix_on_reclaim(int32_t b) {
  if (!registered(b)) return;
  ++prefix_->stats.reclaimed;
  // Demotion (docs/tiers.md): the entry's blocks are copied before any of
  // them can be handed out again, then written by the offload writer.
  if (offload_) demote_entry(static_cast<uint32_t>(prefix_->block_entry[b]));
  prefix_drop_entry(static_cast<uint32_t>(prefix_->block_entry[b]), b);
}

// A registered block became cached: its cached ancestors move to the newest
// end of the LRU, so a chain is reclaimed from its end (children first).
void Pool::prefix_on_cached(int32_t b) {
  PrefixState &ps = *prefix_;
  const PrefixEntry *en = &ps.entries[static_cast<uint32_t>(ps.block_entry[b])];
  while (en->depth > 1) {
    const int64_t pe = ps.map.find(en->parent);
    if (pe < 0) break;
    const PrefixEntry &par = ps.entries[static_cast<size_t>(pe)];
    bool any = false;
    for (int32_t pb : par.blocks)
      if (alloc_.state(pb) == BlockAllocator::State::Cached) {
        alloc_.touch(pb);
        any = true;
      }
    if (!any) break;
    en = &par;
  }
}

ExtraKeys Pool::prefix_extra_keys(const PrefixExtra *ex, uint32_t nx) const {
  std::shared_lock lk(mu_);
  if (!prefix_)
    fail(Errc::InvalidArgument, "the prefix cache is not enabled (kvc_pool_enable_prefix_cache)");
  return prefix_->extra_keys(ex, nx);
}

void Pool::prefix_keys(const int32_t *tokens, uint64_t n, const ExtraKeys &kx, uint8_t *out) const {
  std::shared_lock lk(mu_);
  if (!prefix_)
    fail(Errc::InvalidArgument, "the prefix cache is not enabled (kvc_pool_enable_prefix_cache)");
  const PrefixState &ps = *prefix_;
  const uint64_t bs = cfg_.block_size, ks = ps.hasher.key_size();
  PrefixKey parent = ps.root;
  std::vector<uint8_t> scratch;
  for (uint64_t i = 0; i < n / bs; ++i) {
    parent = ps.hasher.block(parent, tokens + i * bs, static_cast<uint32_t>(bs), kx, scratch);
    std::memcpy(out + i * ks, parent.b.data(), ks);
  }
}

namespace {
// Walks a prompt's chain through the index: the whole blocks found (path)
// among the first n - 1 tokens, and with `partial` the cached child block
// whose start matches the most following tokens (same extra keys).
struct Walk {
  std::vector<uint32_t> path;
  uint64_t partial_tokens = 0;
  int64_t partial_entry = -1;
};
Walk walk(const PrefixState &ps, uint64_t bs, const int32_t *tokens, uint64_t n,
          const ExtraKeys &kx, bool partial) {
  Walk w;
  if (n <= 1) return w;
  const uint64_t usable = n - 1;  // at least one token is always left to compute
  PrefixKey parent = ps.root;
  std::vector<uint8_t> scratch;
  static const std::vector<uint8_t> none;
  const std::vector<uint8_t> &xb = ps.verify_tokens ? kx.enc : none;
  for (uint64_t i = 0; i < usable / bs; ++i) {
    const PrefixKey k =
        ps.hasher.block(parent, tokens + i * bs, static_cast<uint32_t>(bs), kx, scratch);
    const int64_t e = ps.map.find(k);
    if (e < 0) break;
    const int64_t last = w.path.empty() ? -1 : static_cast<int64_t>(w.path.back());
    if (!verified(ps, ps.entries[static_cast<size_t>(e)], tokens + i * bs, xb, last, i + 1)) break;
    w.path.push_back(static_cast<uint32_t>(e));
    parent = k;
  }
  const uint64_t hit = w.path.size() * bs;
  if (!partial || hit >= usable) return w;
  const uint64_t want = std::min<uint64_t>(bs - 1, usable - hit);
  const PrefixKey xd = extras_digest(ps.hasher, kx);
  const std::vector<uint32_t> &cands = w.path.empty() ? ps.root_children : ps.entries[w.path.back()].children;
  for (uint32_t c : cands) {
    const PrefixEntry &en = ps.entries[c];
    if (!(en.extras == xd) || (ps.verify_tokens && en.extras_bytes != xb)) continue;
    uint64_t m = 0;
    while (m < want && en.tokens[m] == tokens[hit + m]) ++m;
    if (m > w.partial_tokens) {
      w.partial_tokens = m;
      w.partial_entry = c;
    }
  }
  return w;
}
}  // namespace

// For tier_pool.cpp.
PrefixKey prefix_extras_digest(const PrefixHasher &h, const ExtraKeys &kx) {
  return extras_digest(h, kx);
}
std::vector<uint32_t> prefix_walk_path(const PrefixState &ps, uint64_t bs, const int32_t *tokens,
                                       uint64_t n, const ExtraKeys &kx) {
  return walk(ps, bs, tokens, n, kx, false).path;
}

PrefixResult Pool::prefix_lookup(const int32_t *tokens, uint64_t n, const ExtraKeys &kx,
                                 bool partial) const {
  std::shared_lock lk(mu_);
  if (!prefix_) fail(Errc::InvalidArgument, "the prefix cache is not enabled (kvc_pool_enable_prefix_cache)");
  const PrefixState &ps = *prefix_;
  const uint64_t bs = cfg_.block_size;
  PrefixResult r;
  const Walk w = walk(ps, bs, tokens, n, kx, partial);
  r.hit_blocks = w.path.size();
  r.hit_tokens = r.hit_blocks * bs;
  r.partial_tokens = w.partial_tokens;
  ps.stats.queried_tokens.fetch_add(n, std::memory_order_relaxed);
  ps.stats.hit_tokens.fetch_add(r.hit_tokens, std::memory_order_relaxed);
  ps.stats.partial_tokens.fetch_add(r.partial_tokens, std::memory_order_relaxed);
  return r;
}

PrefixResult Pool::prefix_attach(uint64_t id, const int32_t *tokens, uint64_t n,
                                 const ExtraKeys &kx, bool partial) {
  std::unique_lock lk(mu_);
  if (!prefix_) fail(Errc::InvalidArgument, "the prefix cache is not enabled (kvc_pool_enable_prefix_cache)");
  if (seqs_.find(id)) fail(Errc::SeqExists, "sequence " + u64s(id) + " already exists");
  PrefixState &ps = *prefix_;
  const uint64_t bs = cfg_.block_size, nl = cfg_.num_layers;
  PrefixResult r;
  const Walk w = walk(ps, bs, tokens, n, kx, partial);
  const std::vector<uint32_t> &path = w.path;
  const PrefixEntry *part_src = w.partial_entry >= 0 ? &ps.entries[static_cast<size_t>(w.partial_entry)] : nullptr;
  r.hit_blocks = path.size();
  r.hit_tokens = r.hit_blocks * bs;
  r.partial_tokens = w.partial_tokens;
  if (part_src) {
    // The copies need nl fresh blocks; cached blocks this call references
    // (the whole-block path, the pinned source) stop being available.
    uint64_t pinned = 0;
    std::vector<int32_t> seen;
    auto count = [&](int32_t b) {
      if (alloc_.state(b) == BlockAllocator::State::Cached && std::find(seen.begin(), seen.end(), b) == seen.end()) {
        seen.push_back(b);
        ++pinned;
      }
    };
    for (uint32_t e : path)
      for (int32_t b : ps.entries[e].blocks) count(b);
    for (int32_t b : part_src->blocks) count(b);
    if (alloc_.available() < nl + pinned) {  // not enough room: whole blocks only
      r.partial_tokens = 0;
      part_src = nullptr;
    }
  }
  // Build the sequence (may throw before anything is referenced).
  auto s = std::make_unique<Sequence>();
  s->layers.resize(nl);
  for (uint64_t li = 0; li < nl; ++li) s->layers[li].blocks.reserve(path.size() + 1);
  Sequence *sp = seqs_.insert(id, std::move(s));  // may throw: nothing changed yet
  // From here on nothing throws.
  for (uint32_t e : path)
    for (uint64_t li = 0; li < nl; ++li) {
      const int32_t b = ps.entries[e].blocks[li];
      alloc_.ref(b);  // a cached block is revived
      sp->layers[li].blocks.push_back(b);
    }
  if (part_src) {
    const std::vector<int32_t> src_blocks = part_src->blocks;  // take_block may drop entries
    for (uint64_t li = 0; li < nl; ++li) {
      alloc_.ref(src_blocks[li]);  // pinned while copying: take_block cannot reclaim it
    }
    for (uint64_t li = 0; li < nl; ++li) {
      const int32_t nb = take_block();
      copy_block(nb, src_blocks[li]);
      sp->layers[li].blocks.push_back(nb);
    }
    for (uint64_t li = 0; li < nl; ++li) release_block(src_blocks[li]);
  }
  const uint64_t len = r.hit_tokens + r.partial_tokens;
  for (LayerTable &l : sp->layers) {
    l.n_tokens = l.n_lp = len;
    tokens_stored_ += len;
  }
  sp->length = len;
  ps.stats.queried_tokens.fetch_add(n, std::memory_order_relaxed);
  ps.stats.hit_tokens.fetch_add(r.hit_tokens, std::memory_order_relaxed);
  ps.stats.partial_tokens.fetch_add(r.partial_tokens, std::memory_order_relaxed);
  note_usage();
  return r;
}

uint32_t Pool::prefix_register(const PrefixKey &k, const PrefixKey &parent, int64_t parent_entry, uint64_t depth,
                               const int32_t *tokens, const PrefixKey &xd, const std::vector<uint8_t> &xb,
                               const int32_t *blocks) {
  PrefixState &ps = *prefix_;
  const uint64_t bs = cfg_.block_size, nl = cfg_.num_layers;
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
  (parent_entry >= 0 ? ps.entries[static_cast<uint64_t>(parent_entry)].children : ps.root_children).push_back(e);
  ++ps.stats.inserted;
  if (ps.callback) ps.callback(ps.user, 0, k.b.data(), parent.b.data(), ps.hasher.key_size(), en.depth);
  return e;
}

uint64_t Pool::prefix_insert(uint64_t id, const int32_t *tokens, uint64_t n, const ExtraKeys &kx) {
  std::unique_lock lk(mu_);
  if (!prefix_) fail(Errc::InvalidArgument, "the prefix cache is not enabled (kvc_pool_enable_prefix_cache)");
  Sequence &s = find(id);
  PrefixState &ps = *prefix_;
  const uint64_t bs = cfg_.block_size, nl = cfg_.num_layers;
  if (n > s.length)
    fail(Errc::OutOfRange, u64s(n) + " tokens given but sequence " + u64s(id) + " has length " + u64s(s.length));
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
    if (const uint64_t u = first_unwritten(s.layers[li], 0, full * bs); u != UINT64_MAX)
      fail(Errc::InvalidArgument, "position " + u64s(s.layers[li].position_of(u)) + " of layer " + u64s(li) +
                                      " of sequence " + u64s(id) +
                                      " was reserved but never written (kvc_append): prefix blocks are registered "
                                      "only once every slot is written; nothing registered");
  const PrefixKey xd = extras_digest(ps.hasher, kx);
  const std::vector<uint8_t> &xb = kx.enc;
  PrefixKey parent = ps.root;
  std::vector<uint8_t> scratch;
  uint64_t added = 0;
  int64_t parent_entry = -1;
  for (uint64_t i = 0; i < full; ++i) {
    const PrefixKey k =
        ps.hasher.block(parent, tokens + i * bs, static_cast<uint32_t>(bs), kx, scratch);
    const int64_t found = ps.map.find(k);
    if (found >= 0) {  // already registered (by this sequence or with the same content by another)
      const PrefixEntry &en = ps.entries[static_cast<size_t>(found)];
      if (!verified(ps, en, tokens + i * bs, xb, parent_entry, i + 1)) break;  // a collision: stop
      parent = k;
      parent_entry = found;
      continue;
    }
    bool free_blocks = true;
    for (uint64_t li = 0; li < nl; ++li) free_blocks = free_blocks && ps.block_entry[s.layers[li].blocks[i]] < 0;
    if (!free_blocks) break;  // a block registered under another key (cannot be: content is the key) - stop
    std::vector<int32_t> blocks(nl);
    for (uint64_t li = 0; li < nl; ++li) blocks[li] = s.layers[li].blocks[i];
    const uint32_t e = prefix_register(k, parent, parent_entry, i + 1, tokens + i * bs, xd, xb, blocks.data());
    ++added;
    parent = k;
    parent_entry = e;
  }
  return added;
}

std::vector<std::string> Pool::prefix_registered_keys() const {
  std::shared_lock lk(mu_);
  std::vector<std::string> out;
  if (!prefix_) return out;
  for (const PrefixEntry &en : prefix_->entries)
    if (en.live) out.emplace_back(reinterpret_cast<const char *>(en.key.b.data()), prefix_->hasher.key_size());
  return out;
}

PrefixCounts Pool::prefix_counts() const {
  std::shared_lock lk(mu_);
  if (!prefix_) fail(Errc::InvalidArgument, "the prefix cache is not enabled (kvc_pool_enable_prefix_cache)");
  const PrefixState &ps = *prefix_;
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
    for (int32_t b : en.blocks) all_cached = all_cached && alloc_.state(b) == BlockAllocator::State::Cached;
    ++(all_cached ? c.reclaimable : c.referenced);
  }
  return c;
}

}  // namespace kvc::core
