// Offload tiers of a pool (docs/tiers.md): demotion of reclaimed prefix
// blocks through a bounded background queue, lookups that continue into the
// tiers (with optional pins), synchronous and asynchronous loads back into
// the pool with a timeout, and per-tier counters.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <system_error>

#include "common/error.h"
#include "core/offload.h"

namespace kvc::tier {
namespace {
std::mutex g_hooks_mu;
TestHooks g_hooks;
}  // namespace
TestHooks get_test_hooks() {
  std::lock_guard g(g_hooks_mu);
  return g_hooks;
}
void set_test_hooks(const TestHooks &h) {
  std::lock_guard g(g_hooks_mu);
  g_hooks = h;
}
}  // namespace kvc::tier

namespace kvc::core {

namespace {
constexpr uint32_t kPayloadVersion = 1;
constexpr size_t kPayloadHeader = 72;  // up to the tokens

std::string u64s(uint64_t v) { return std::to_string(v); }
template <class T>
void put(uint8_t *p, T v) {
  std::memcpy(p, &v, sizeof v);
}
template <class T>
T get(const uint8_t *p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// Process-wide ticket and pin numbers: one pool never accepts another's.
std::atomic<uint64_t> g_next_ticket{1}, g_next_pin{1};
}  // namespace

// ---------------------------------------------------------------------------
// OffloadState: threads

OffloadState::OffloadState(Pool *p) : pool(p) {}

OffloadState::~OffloadState() { shutdown(); }

void OffloadState::shutdown() {
  {
    std::lock_guard g(m);
    stop = true;
  }
  writer_cv.notify_all();
  loader_cv.notify_all();
  reaper_cv.notify_all();
  if (writer.joinable()) writer.join();
  if (loader.joinable()) loader.join();
  if (reaper.joinable()) reaper.join();
}

bool OffloadState::stopping() {
  std::lock_guard g(m);
  return stop;
}

std::vector<TierSlot *> OffloadState::snapshot() {
  std::vector<TierSlot *> v;
  for (auto &t : tiers) v.push_back(t.get());
  return v;
}

void OffloadState::start() {
  std::unique_lock g(m);
  if (started) return;
  // All three or none: a thread that cannot be created undoes the others.
  try {
    writer = std::thread([this] { writer_loop(); });
    loader = std::thread([this] { loader_loop(); });
    reaper = std::thread([this] { reaper_loop(); });
  } catch (...) {
    stop = true;
    g.unlock();
    writer_cv.notify_all();
    loader_cv.notify_all();
    reaper_cv.notify_all();
    for (std::thread *t : {&writer, &loader, &reaper})
      if (t->joinable()) t->join();
    g.lock();
    stop = false;
    throw;
  }
  started = true;
}

void OffloadState::writer_loop() {
  std::unique_lock lk(m);
  bool drain_failed = false;  // while the pool goes away, a tier failed
  for (;;) {
    // A paused writer (test hook) polls; otherwise it sleeps until work comes.
    while (!stop && (demote_q.empty() || tier::get_test_hooks().pause_writer))
      writer_cv.wait_for(lk, std::chrono::milliseconds(demote_q.empty() ? 1000 : 5));
    // The pool goes away: the queue is still written, unless a tier fails
    // meanwhile (a server that does not answer would make every write wait
    // for its timeout): then the rest is dropped and counted.
    if (stop && (demote_q.empty() || drain_failed)) {
      drops.fetch_add(demote_q.size(), std::memory_order_relaxed);
      demote_q.clear();
      idle_cv.notify_all();
      return;
    }
    Demotion d = std::move(demote_q.front());
    demote_q.pop_front();
    ++writing;
    const std::vector<TierSlot *> ts = snapshot();
    lk.unlock();
    const tier::TestHooks hooks = tier::get_test_hooks();
    for (TierSlot *t : ts) {  // write-through: every tier gets the block
      if (hooks.fail_put && hooks.fail_put(d.key)) {
        t->other_errors.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      try {
        // A block the tier already holds is not written again: its key fixes
        // its content (tokens, position, model, codecs), and a hot prefix is
        // reclaimed and loaded back many times.
        if (t->t->contains(d.key)) continue;
        if (t->t->put(d.key, fp, d.payload.data(), d.payload.size()))
          t->demotions.fetch_add(1, std::memory_order_relaxed);
        else if (stopping())
          drain_failed = true;
      } catch (...) {  // a tier never takes the thread down
        t->other_errors.fetch_add(1, std::memory_order_relaxed);
      }
    }
    lk.lock();
    --writing;
    idle_cv.notify_all();
  }
}

void OffloadState::loader_loop() {
  std::unique_lock lk(m);
  for (;;) {
    loader_cv.wait(lk, [&] { return stop || !load_q.empty(); });
    if (stop) return;
    const uint64_t ticket = load_q.front();
    load_q.pop_front();
    auto it = loads.find(ticket);
    if (it == loads.end() || it->second.state != LoadState::Pending) continue;
    const std::vector<BlockKey> keys = it->second.keys;
    const std::vector<TierSlot *> ts = snapshot();
    lk.unlock();
    const tier::TestHooks hooks = tier::get_test_hooks();
    std::vector<std::vector<uint8_t>> payloads;
    std::vector<uint32_t> from;
    // Still wanted? (not timed out, the pool not going away) - checked before
    // each block, so a slow tier holds the loader for one read at most after
    // the load's deadline.
    auto wanted = [&] {
      std::lock_guard g(m);
      auto i = loads.find(ticket);
      return !stop && i != loads.end() && i->second.state == LoadState::Pending;
    };
    for (const BlockKey &k : keys) {
      if (!wanted()) break;
      if (hooks.before_get) hooks.before_get(k);
      std::vector<uint8_t> out;
      bool got = false;
      for (uint32_t t = 0; t < ts.size() && !got; ++t) {
        try {
          if (ts[t]->t->get(k, fp, out)) {
            got = true;
            from.push_back(t);
          }
        } catch (...) {  // a tier that throws (out of memory) is a miss
          ts[t]->other_errors.fetch_add(1, std::memory_order_relaxed);
        }
      }
      if (!got) break;  // the chain ends at the first block no tier returns
      try {
        payloads.push_back(std::move(out));
      } catch (...) {
        break;
      }
    }
    try {
      pool->install_load(ticket, payloads, from);
    } catch (...) {  // cannot happen by construction; never let the thread die
    }
    lk.lock();
  }
}

void OffloadState::reaper_loop() {
  std::unique_lock lk(m);
  for (;;) {
    if (stop) return;
    auto next = std::chrono::steady_clock::time_point::max();
    for (const auto &[t, l] : loads)
      if (l.state == LoadState::Pending) next = std::min(next, l.deadline);
    if (next == std::chrono::steady_clock::time_point::max()) {
      reaper_cv.wait(lk);
      continue;
    }
    if (std::chrono::steady_clock::now() < next) {
      reaper_cv.wait_until(lk, next);
      continue;
    }
    lk.unlock();
    pool->expire_loads();
    lk.lock();
  }
}

// ---------------------------------------------------------------------------
// Pool: configuration and counters

uint32_t Pool::add_tier(const std::function<std::unique_ptr<tier::Tier>()> &make, int32_t kind) {
  std::unique_lock lk(mu_);
  if (!prefix_)
    fail(Errc::InvalidArgument, "tiers hold prefix blocks: enable the prefix cache first (kvc_pool_enable_prefix_cache)");
  if (offload_) {
    std::lock_guard g(offload_->m);
    if (offload_->tiers.size() >= 8) fail(Errc::InvalidArgument, "a pool has at most 8 tiers");
  }
  // The tier is made only when the pool can take it (a disk tier's directory
  // scan removes files: a refused call must not have run it).
  auto slot = std::make_unique<TierSlot>();
  slot->t = make();  // throws: nothing changed
  slot->kind = kind;
  const bool fresh = !offload_;
  if (fresh) {
    offload_ = std::make_unique<OffloadState>(this);
    offload_->fp = pool_fingerprint(cfg_);
  }
  try {
    offload_->start();
  } catch (const std::system_error &e) {
    if (fresh) offload_.reset();
    fail(Errc::OutOfMemory, std::string("cannot start the offload threads: ") + e.what());
  }
  std::lock_guard g(offload_->m);
  offload_->tiers.push_back(std::move(slot));  // reserved below 8 under the pool lock: cannot fail
  return static_cast<uint32_t>(offload_->tiers.size() - 1);
}

void Pool::set_offload(uint32_t queue_blocks, uint32_t load_timeout_ms) {
  if (queue_blocks == 0 || queue_blocks > (1u << 20))
    fail(Errc::InvalidArgument, "queue_blocks " + u64s(queue_blocks) + " is outside [1, 2^20]");
  if (load_timeout_ms == 0 || load_timeout_ms > 3600u * 1000u)
    fail(Errc::InvalidArgument, "load_timeout_ms " + u64s(load_timeout_ms) + " is outside [1, 3600000]");
  std::unique_lock lk(mu_);
  if (!offload_) fail(Errc::InvalidArgument, "the pool has no tiers (kvc_pool_add_tier)");
  std::lock_guard g(offload_->m);
  offload_->queue_cap = queue_blocks;
  offload_->timeout_ms = load_timeout_ms;
}

uint32_t Pool::num_tiers() const {
  std::shared_lock lk(mu_);
  if (!offload_) return 0;
  std::lock_guard g(offload_->m);
  return static_cast<uint32_t>(offload_->tiers.size());
}

TierCounts Pool::tier_counts(uint32_t index) const {
  std::shared_lock lk(mu_);
  TierSlot *t = nullptr;
  uint64_t pinned = 0;
  if (offload_) {
    std::lock_guard g(offload_->m);
    if (index < offload_->tiers.size()) {
      t = offload_->tiers[index].get();
      pinned = t->pinned;
    }
  }
  if (!t) fail(Errc::OutOfRange, "tier " + u64s(index) + ": the pool has " + u64s(offload_ ? offload_->tiers.size() : 0) + " tiers");
  const tier::Stats s = t->t->stats();
  TierCounts c;
  c.kind = t->kind;
  c.bytes = s.bytes;
  c.entries = s.entries;
  c.hits = s.hits;
  c.misses = s.misses;
  c.demotions = t->demotions.load();
  c.promotions = t->promotions.load();
  c.drops = offload_->drops.load();
  c.evictions = s.evictions;
  c.errors = s.errors + t->other_errors.load();
  c.pinned = pinned;
  c.last_error = t->t->last_error();
  if (c.last_error.empty() && t->other_errors.load())
    c.last_error = "a record was refused by the pool (another prompt's, layout's or per-tensor scales), or a write or "
                   "read failed outside the tier (out of memory, an injected test error)";
  return c;
}

// ---------------------------------------------------------------------------
// Demotion

// Payload of a tier record: header, the block's token ids, the extra keys'
// encoding, the per-tensor scales (pools with per-tensor codecs), then the
// entry's blocks, layer by layer, as the pool stores them.
std::vector<uint8_t> Pool::stage_entry(uint32_t e) const {
  const PrefixState &ps = *prefix_;
  const PrefixEntry &en = ps.entries[e];
  const uint64_t nl = cfg_.num_layers, bs = cfg_.block_size;
  const uint32_t n_scales = static_cast<uint32_t>(tensor_scale_parts() * nl);
  const std::vector<uint8_t> &xb = en.extras_bytes;
  const uint64_t head = kPayloadHeader + bs * 4 + xb.size() + uint64_t(n_scales) * 4;
  std::vector<uint8_t> p(head + nl * block_stride_);
  uint8_t *q = p.data();
  std::memcpy(q, "KVCD", 4);
  put<uint32_t>(q + 4, kPayloadVersion);
  put<uint32_t>(q + 8, static_cast<uint32_t>(nl));
  put<uint32_t>(q + 12, static_cast<uint32_t>(bs));
  put<uint64_t>(q + 16, block_stride_);
  put<uint64_t>(q + 24, en.depth);
  put<uint32_t>(q + 32, static_cast<uint32_t>(xb.size()));
  put<uint32_t>(q + 36, n_scales);
  std::memcpy(q + 40, en.parent.b.data(), 32);
  std::memcpy(q + kPayloadHeader, en.tokens.data(), bs * 4);
  uint8_t *x = q + kPayloadHeader + bs * 4;
  if (!xb.empty()) std::memcpy(x, xb.data(), xb.size());
  x += xb.size();
  {  // per-tensor scales: the layers of K (if per-tensor), then of V
    uint32_t i = 0;
    for (int kv = 0; kv < 2; ++kv)
      if (tensor_scale_[kv])
        for (uint64_t l = 0; l < nl; ++l) put<uint32_t>(x + 4 * i++, tensor_scale_[kv][l].load(std::memory_order_acquire));
  }
  x += uint64_t(n_scales) * 4;
  if (dev_) {
    dev_->copy_blocks(en.blocks.data(), nl, x, /*to_host=*/true);
  } else {
    for (uint64_t li = 0; li < nl; ++li) std::memcpy(x + li * block_stride_, block_ptr(en.blocks[li]), block_stride_);
  }
  return p;
}

// Never throws (called while a block is being handed out): a block that
// cannot be queued is dropped and counted.
bool Pool::demote_entry(uint32_t e) {
  OffloadState &o = *offload_;
  try {
    {
      std::lock_guard g(o.m);
      if (o.tiers.empty() || o.stop) return false;
      if (o.demote_q.size() >= o.queue_cap) {  // full: drop, never wait
        o.drops.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
    }
    Demotion d;
    d.key = prefix_->entries[e].key;
    d.payload = stage_entry(e);  // copied now: the block may be reused as soon as this returns
    {
      std::lock_guard g(o.m);
      if (o.demote_q.size() >= o.queue_cap) {
        o.drops.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
      o.demote_q.push_back(std::move(d));
    }
    o.writer_cv.notify_one();
    return true;
  } catch (...) {
    o.drops.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
}

uint64_t Pool::prefix_offload(const int32_t *tokens, uint64_t n, const ExtraKeys &kx) {
  std::unique_lock lk(mu_);
  if (!prefix_) fail(Errc::InvalidArgument, "the prefix cache is not enabled (kvc_pool_enable_prefix_cache)");
  if (!offload_) fail(Errc::InvalidArgument, "the pool has no tiers (kvc_pool_add_tier)");
  // Every whole block of the prompt (the last token included: n + 1).
  const std::vector<uint32_t> path = prefix_walk_path(*prefix_, cfg_.block_size, tokens, n + 1, kx);
  uint64_t queued = 0;
  for (uint32_t e : path) queued += demote_entry(e) ? 1 : 0;
  return queued;
}

void Pool::flush_tiers() {
  OffloadState *o;
  {
    std::shared_lock lk(mu_);
    o = offload_.get();
  }
  if (!o) return;
  std::unique_lock g(o->m);
  o->idle_cv.wait(g, [&] { return o->demote_q.empty() && o->writing == 0; });
}

// ---------------------------------------------------------------------------
// Lookup, pins

PrefixResult Pool::prefix_lookup_tiers(const int32_t *tokens, uint64_t n, const ExtraKeys &kx,
                                       bool partial, bool pin) {
  PrefixResult r = prefix_lookup(tokens, n, kx, partial);
  std::vector<BlockKey> keys;
  OffloadState *o;
  {
    std::shared_lock lk(mu_);
    o = offload_.get();
    if (!o || n <= 1) return r;
    const PrefixState &ps = *prefix_;
    const uint64_t bs = cfg_.block_size;
    const std::vector<uint32_t> path = prefix_walk_path(ps, bs, tokens, n, kx);
    BlockKey parent = path.empty() ? ps.root : ps.entries[path.back()].key;
    std::vector<uint8_t> scratch;
    const uint64_t last = std::min<uint64_t>((n - 1) / bs, path.size() + alloc_.num_blocks() / cfg_.num_layers);
    for (uint64_t i = path.size(); i < last; ++i) {
      parent = ps.hasher.block(parent, tokens + i * bs, static_cast<uint32_t>(bs), kx, scratch);
      keys.push_back(parent);
    }
  }
  std::vector<TierSlot *> ts;
  {
    std::lock_guard g(o->m);
    ts = o->snapshot();
  }
  PinRecord rec;
  uint64_t found = 0;
  try {
    for (const BlockKey &pk : keys) {  // no pool lock held: tiers may be slow
      const BlockKey k = pk;
      bool any = false;
      for (TierSlot *t : ts) {
        if (pin && t->t->pin(k)) {  // pinning doubles as the presence check
          try {
            rec.keys.emplace_back(t, k);
          } catch (...) {
            t->t->unpin(k);
            throw;
          }
          any = true;
          break;
        }
        if (t->t->contains(k)) {
          any = true;
          break;
        }
      }
      if (!any) break;
      ++found;
    }
    r.tier_tokens = found * cfg_.block_size;
    if (pin && !rec.keys.empty()) {
      std::lock_guard g(o->m);
      const uint64_t id = g_next_pin.fetch_add(1, std::memory_order_relaxed);
      o->pins.emplace(id, rec);  // may throw: the pins are released below
      for (auto &[t, k] : rec.keys) ++t->pinned;
      r.pin = id;
    }
  } catch (...) {  // no pin is left behind by a failed lookup
    for (auto &[t, k] : rec.keys) t->t->unpin(k);
    throw;
  }
  return r;
}

void Pool::prefix_unpin(uint64_t pin) {
  OffloadState *o;
  {
    std::shared_lock lk(mu_);
    o = offload_.get();
  }
  if (!o) fail(Errc::InvalidArgument, "pin " + u64s(pin) + " is not held (the pool has no tiers)");
  PinRecord rec;
  {
    std::lock_guard g(o->m);
    auto it = o->pins.find(pin);
    if (it == o->pins.end()) fail(Errc::InvalidArgument, "pin " + u64s(pin) + " is not held (never given, or already unpinned)");
    rec = std::move(it->second);
    o->pins.erase(it);
    for (auto &[t, k] : rec.keys) --t->pinned;
  }
  for (auto &[t, k] : rec.keys) t->t->unpin(k);
}

// ---------------------------------------------------------------------------
// Loads

uint64_t Pool::prefix_prefetch(const int32_t *tokens, uint64_t n, const ExtraKeys &kx, bool sync) {
  PendingLoad L;
  L.sync = sync;
  OffloadState *o;
  {
    std::shared_lock lk(mu_);
    if (!prefix_) fail(Errc::InvalidArgument, "the prefix cache is not enabled (kvc_pool_enable_prefix_cache)");
    o = offload_.get();
    if (!o) fail(Errc::InvalidArgument, "the pool has no tiers (kvc_pool_add_tier)");
    const PrefixState &ps = *prefix_;
    const uint64_t bs = cfg_.block_size;
    if (n > 1) {
      const std::vector<uint32_t> path = prefix_walk_path(ps, bs, tokens, n, kx);
      L.parent = path.empty() ? ps.root : ps.entries[path.back()].key;
      L.first_depth = path.size() + 1;
      L.xb = kx.enc;
      L.xd = prefix_extras_digest(ps.hasher, kx);
      BlockKey parent = L.parent;
      std::vector<uint8_t> scratch;
      const uint64_t last = std::min<uint64_t>((n - 1) / bs, path.size() + alloc_.num_blocks() / cfg_.num_layers);
      for (uint64_t i = path.size(); i < last; ++i) {
        parent = ps.hasher.block(parent, tokens + i * bs, static_cast<uint32_t>(bs), kx, scratch);
        L.keys.push_back(parent);
        L.tokens.emplace_back(tokens + i * bs, tokens + (i + 1) * bs);
      }
    }
  }
  // Which of them the tiers hold (no pool lock: tiers may be slow).
  std::vector<TierSlot *> ts;
  {
    std::lock_guard g(o->m);
    ts = o->snapshot();
  }
  size_t held = 0;
  for (; held < L.keys.size(); ++held) {
    bool any = false;
    for (TierSlot *t : ts) any = any || t->t->contains(L.keys[held]);
    if (!any) break;
  }
  L.keys.resize(held);
  L.tokens.resize(held);

  std::unique_lock lk(mu_);
  const uint64_t nl = cfg_.num_layers;
  // Reserve the blocks now (the pool's own prefix path stays: referenced
  // while reserving, so the reservation cannot reclaim the chain it extends).
  const std::vector<uint32_t> path = prefix_walk_path(*prefix_, cfg_.block_size, tokens, n, kx);
  std::vector<int32_t> held_path;
  for (uint32_t e : path)
    for (int32_t b : prefix_->entries[e].blocks)
      if (alloc_.state(b) == BlockAllocator::State::Cached) held_path.push_back(b);
  const uint64_t can = (alloc_.available() - std::min<uint64_t>(alloc_.available(), held_path.size())) / nl;
  const uint64_t k = std::min<uint64_t>(held, can);
  L.keys.resize(k);
  L.tokens.resize(k);
  L.reserved.reserve(k * nl);
  uint64_t ticket;
  {
    std::lock_guard g(o->m);
    ticket = g_next_ticket.fetch_add(1, std::memory_order_relaxed);
    L.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(o->timeout_ms);
    if (k == 0) L.state = LoadState::Done;
    o->loads.emplace(ticket, PendingLoad{});  // may throw: nothing reserved yet
  }
  // From here on nothing throws.
  for (int32_t b : held_path) alloc_.ref(b);
  for (uint64_t i = 0; i < k * nl; ++i) L.reserved.push_back(take_block());
  for (int32_t b : held_path) release_block(b);
  {
    std::lock_guard g(o->m);
    const bool pending = L.state == LoadState::Pending;
    o->loads[ticket] = std::move(L);
    if (pending) o->load_q.push_back(ticket);
  }
  o->loader_cv.notify_one();
  o->reaper_cv.notify_one();
  return ticket;
}

void Pool::install_load(uint64_t ticket, const std::vector<std::vector<uint8_t>> &payloads,
                        const std::vector<uint32_t> &from) {
  std::unique_lock lk(mu_);
  OffloadState &o = *offload_;
  std::lock_guard g(o.m);
  auto it = o.loads.find(ticket);
  if (it == o.loads.end()) return;
  PendingLoad &L = it->second;
  if (L.state != LoadState::Pending) return;  // timed out: its blocks went back to the pool; the late answer is dropped
  PrefixState &ps = *prefix_;
  const uint64_t nl = cfg_.num_layers, bs = cfg_.block_size;
  const uint32_t n_scales = static_cast<uint32_t>(tensor_scale_parts() * nl);
  // The chain's parent must still be in the index (it may have been reclaimed meanwhile).
  int64_t parent_entry = -1;
  BlockKey parent = L.parent;
  bool ok = true;
  if (L.first_depth > 1) {
    parent_entry = ps.map.find(parent);
    ok = parent_entry >= 0;
  }
  uint64_t loaded = 0;
  const std::vector<TierSlot *> ts = o.snapshot();
  for (size_t i = 0; ok && i < payloads.size() && i < L.keys.size(); ++i) {
    const std::vector<uint8_t> &p = payloads[i];
    const uint8_t *q = p.data();
    BlockKey k;
    k.b = L.keys[i].b;
    // The record's extra keys (X bytes: their encoding, docs/tiers.md) must be
    // the query's with verify_tokens. A pool without it trusts the key, as
    // its index does, and skips them: its own records carry none (X = 0).
    const uint64_t xsize = p.size() >= kPayloadHeader ? get<uint32_t>(q + 32) : 0;
    const uint64_t head = kPayloadHeader + bs * 4 + xsize + uint64_t(n_scales) * 4;
    // (Read only once the size is known to cover them.)
    auto extras_ok = [&] {
      return !ps.verify_tokens ||
             (xsize == L.xb.size() &&
              std::memcmp(q + kPayloadHeader + bs * 4, L.xb.data(), L.xb.size()) == 0);
    };
    const bool valid =
        p.size() >= kPayloadHeader && p.size() == head + nl * block_stride_ &&
        std::memcmp(q, "KVCD", 4) == 0 && get<uint32_t>(q + 4) == kPayloadVersion &&
        get<uint32_t>(q + 8) == nl && get<uint32_t>(q + 12) == bs &&
        get<uint64_t>(q + 16) == block_stride_ && get<uint64_t>(q + 24) == L.first_depth + i &&
        get<uint32_t>(q + 36) == n_scales && std::memcmp(q + 40, parent.b.data(), 32) == 0 &&
        std::memcmp(q + kPayloadHeader, L.tokens[i].data(), bs * 4) == 0 && extras_ok();
    if (!valid) {  // not this block (a collision, another layout): a refused record, the chain stops here
      if (from[i] < ts.size()) ts[from[i]]->other_errors.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    // Per-tensor scales: a calibrated layer must have the record's; all are
    // checked before an uncalibrated one takes the record's (no change when
    // refused). The exclusive lock keeps appends from calibrating meanwhile.
    const uint8_t *sc = q + kPayloadHeader + bs * 4 + xsize;
    bool scales_ok = true;
    for (int pass = 0; pass < 2 && scales_ok; ++pass) {
      uint32_t si = 0;
      for (int kv = 0; kv < 2; ++kv) {
        if (!tensor_scale_[kv]) continue;
        for (uint64_t l = 0; l < nl; ++l, ++si) {
          const uint32_t want = get<uint32_t>(sc + 4 * si);
          std::atomic<uint32_t> &cur = tensor_scale_[kv][l];
          const uint32_t have = cur.load(std::memory_order_acquire);
          if (pass == 0 && want != 0 && have != 0 && have != want) scales_ok = false;
          if (pass == 1 && have == 0 && want != 0) cur.store(want, std::memory_order_release);
        }
      }
    }
    if (!scales_ok) {  // written with other per-tensor scales: refused
      if (from[i] < ts.size()) ts[from[i]]->other_errors.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    const int64_t existing = ps.map.find(k);
    if (existing >= 0) {  // registered meanwhile (the engine computed it): keep the pool's
      parent = k;
      parent_entry = existing;
      continue;
    }
    const uint8_t *blocks = q + head;
    const int32_t *dst = L.reserved.data() + i * nl;
    if (dev_) {
      dev_->copy_blocks(dst, nl, const_cast<uint8_t *>(blocks), /*to_host=*/false);
    } else {
      for (uint64_t li = 0; li < nl; ++li) std::memcpy(block_ptr(dst[li]), blocks + li * block_stride_, block_stride_);
    }
    for (uint64_t li = 0; li < nl; ++li) written_.set(dst[li], 0, cfg_.block_size);  // a whole registered block
    parent_entry = prefix_register(k, parent, parent_entry, L.first_depth + i, L.tokens[i].data(), L.xd, L.xb, dst);
    parent = k;
    if (from[i] < ts.size()) ts[from[i]]->promotions.fetch_add(1, std::memory_order_relaxed);
    ++loaded;
  }
  // Loaded blocks become cached (findable, reclaimable); the rest go back.
  for (size_t i = 0; i < L.keys.size(); ++i)
    for (uint64_t li = 0; li < nl; ++li) release_block(L.reserved[i * nl + li]);
  L.reserved.clear();
  L.state = LoadState::Done;
  L.loaded_tokens = loaded * bs;
  o.done_cv.notify_all();
}

void Pool::expire_loads() {
  std::unique_lock lk(mu_);
  OffloadState &o = *offload_;
  std::lock_guard g(o.m);
  const auto now = std::chrono::steady_clock::now();
  for (auto &[t, L] : o.loads) {
    if (L.state != LoadState::Pending || now < L.deadline) continue;
    for (int32_t b : L.reserved) release_block(b);  // unregistered: back to the free list
    L.reserved.clear();
    L.state = LoadState::TimedOut;
  }
  o.done_cv.notify_all();
}

LoadState Pool::prefix_poll(uint64_t ticket, bool wait, uint64_t *loaded_tokens) {
  OffloadState *o;
  {
    std::shared_lock lk(mu_);
    o = offload_.get();
  }
  if (!o) fail(Errc::InvalidArgument, "ticket " + u64s(ticket) + " is unknown (the pool has no tiers)");
  std::unique_lock g(o->m);
  auto it = o->loads.find(ticket);
  // A synchronous load's ticket is its own (never polled by anyone else).
  if (it == o->loads.end() || it->second.sync != wait)
    fail(Errc::InvalidArgument, "ticket " + u64s(ticket) +
                                    " is unknown to this pool (never given by kvc_prefix_prefetch, or already reported)");
  if (wait) {
    // Looked up again after each wake: the map may have rehashed meanwhile.
    o->done_cv.wait(g, [&] {
      it = o->loads.find(ticket);
      return it == o->loads.end() || it->second.state != LoadState::Pending;
    });
    if (it == o->loads.end()) fail(Errc::Internal, "load " + u64s(ticket) + " vanished while waited for");
  }
  const LoadState s = it->second.state;
  if (loaded_tokens) *loaded_tokens = s == LoadState::Done ? it->second.loaded_tokens : 0;
  if (s != LoadState::Pending) o->loads.erase(it);
  return s;
}

}  // namespace kvc::core
