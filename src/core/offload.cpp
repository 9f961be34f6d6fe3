// Offload tiers of a pool's prefix cache (core/offload.h, docs/tiers.md):
// demotion of reclaimed prefix blocks through a bounded background queue,
// lookups that continue into the tiers (with optional pins), synchronous and
// asynchronous loads back into the pool with a timeout, per-tier counters.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <system_error>

#include "common/error.h"
#include "common/le.h"
#include "core/offload.h"
#include "core/prefix_cache.h"

namespace kvc::core {
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
}  // namespace kvc::core

namespace kvc::core {

namespace {
constexpr uint32_t kPayloadVersion = 1;
constexpr size_t kPayloadHeader = 72;  // up to the tokens

// Process-wide ticket and pin numbers: one pool never accepts another's.
std::atomic<uint64_t> g_next_ticket{1}, g_next_pin{1};
}  // namespace

// ---------------------------------------------------------------------------
// Threads

Offload::Offload(PoolCore &c, PrefixCache &pc) : c_(c), pc_(pc) {}

Offload::~Offload() {
  shutdown();
}

void Offload::shutdown() {
  {
    std::lock_guard g(m_);
    stop_ = true;
  }
  writer_cv_.notify_all();
  loader_cv_.notify_all();
  reaper_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (loader_.joinable()) loader_.join();
  if (reaper_.joinable()) reaper_.join();
}

bool Offload::stopping() {
  std::lock_guard g(m_);
  return stop_;
}

std::vector<TierSlot *> Offload::snapshot() const {
  std::vector<TierSlot *> v;
  for (auto &t : tiers_) v.push_back(t.get());
  return v;
}

void Offload::start() {
  std::unique_lock g(m_);
  if (started_) return;
  // All three or none: a thread that cannot be created undoes the others.
  try {
    writer_ = std::thread([this] { writer_loop(); });
    loader_ = std::thread([this] { loader_loop(); });
    reaper_ = std::thread([this] { reaper_loop(); });
  } catch (...) {
    stop_ = true;
    g.unlock();
    writer_cv_.notify_all();
    loader_cv_.notify_all();
    reaper_cv_.notify_all();
    for (std::thread *t : {&writer_, &loader_, &reaper_})
      if (t->joinable()) t->join();
    g.lock();
    stop_ = false;
    throw;
  }
  started_ = true;
}

void Offload::writer_loop() {
  std::unique_lock lk(m_);
  bool drain_failed = false;  // while the pool goes away, a tier failed
  for (;;) {
    // A paused writer (test hook) polls; otherwise it sleeps until work comes.
    while (!stop_ && (demote_q_.empty() || get_test_hooks().pause_writer))
      writer_cv_.wait_for(lk, std::chrono::milliseconds(demote_q_.empty() ? 1000 : 5));
    // The pool goes away: the queue is still written, unless a tier fails
    // meanwhile (a server that does not answer would make every write wait
    // for its timeout): then the rest is dropped and counted.
    if (stop_ && (demote_q_.empty() || drain_failed)) {
      drops_.fetch_add(demote_q_.size(), std::memory_order_relaxed);
      demote_q_.clear();
      idle_cv_.notify_all();
      return;
    }
    Demotion d = std::move(demote_q_.front());
    demote_q_.pop_front();
    ++writing_;
    const std::vector<TierSlot *> ts = snapshot();
    lk.unlock();
    const TestHooks hooks = get_test_hooks();
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
        if (t->t->put(d.key, fp_, d.payload.data(), d.payload.size()))
          t->demotions.fetch_add(1, std::memory_order_relaxed);
        else if (stopping())
          drain_failed = true;
      } catch (...) {  // a tier never takes the thread down
        t->other_errors.fetch_add(1, std::memory_order_relaxed);
      }
    }
    lk.lock();
    --writing_;
    idle_cv_.notify_all();
  }
}

void Offload::loader_loop() {
  std::unique_lock lk(m_);
  for (;;) {
    loader_cv_.wait(lk, [&] { return stop_ || !load_q_.empty(); });
    if (stop_) return;
    const uint64_t ticket = load_q_.front();
    load_q_.pop_front();
    auto it = loads_.find(ticket);
    if (it == loads_.end() || it->second.state != LoadState::Pending) continue;
    const std::vector<BlockKey> keys = it->second.keys;
    const std::vector<TierSlot *> ts = snapshot();
    lk.unlock();
    const TestHooks hooks = get_test_hooks();
    std::vector<std::vector<uint8_t>> payloads;
    std::vector<uint32_t> from;
    // Still wanted? (not timed out, the pool not going away) - checked before
    // each block, so a slow tier holds the loader_ for one read at most after
    // the load's deadline.
    auto wanted = [&] {
      std::lock_guard g(m_);
      auto i = loads_.find(ticket);
      return !stop_ && i != loads_.end() && i->second.state == LoadState::Pending;
    };
    for (const BlockKey &k : keys) {
      if (!wanted()) break;
      if (hooks.before_get) hooks.before_get(k);
      std::vector<uint8_t> out;
      bool got = false;
      for (uint32_t t = 0; t < ts.size() && !got; ++t) {
        try {
          if (ts[t]->t->get(k, fp_, out)) {
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
      install_load(ticket, payloads, from);
    } catch (...) {  // cannot happen by construction; never let the thread die
    }
    lk.lock();
  }
}

void Offload::reaper_loop() {
  std::unique_lock lk(m_);
  for (;;) {
    if (stop_) return;
    auto next = std::chrono::steady_clock::time_point::max();
    for (const auto &[t, l] : loads_)
      if (l.state == LoadState::Pending) next = std::min(next, l.deadline);
    if (next == std::chrono::steady_clock::time_point::max()) {
      reaper_cv_.wait(lk);
      continue;
    }
    if (std::chrono::steady_clock::now() < next) {
      reaper_cv_.wait_until(lk, next);
      continue;
    }
    lk.unlock();
    expire_loads();
    lk.lock();
  }
}

bool Offload::active() const {
  return active_.load(std::memory_order_acquire);
}

uint32_t Offload::num_tiers_locked() const {
  std::lock_guard g(m_);
  return static_cast<uint32_t>(tiers_.size());
}

void Offload::count_reserved(std::vector<uint64_t> &refs) const {
  std::lock_guard g(m_);
  for (const auto &[t, l] : loads_)
    for (int32_t b : l.reserved) ++refs[static_cast<size_t>(b)];
}

// ---------------------------------------------------------------------------
// Configuration and counters

uint32_t Offload::add_tier(const std::function<std::unique_ptr<tier::Tier>()> &make, int32_t kind) {
  std::unique_lock lk(c_.mu_);
  if (!pc_.enabled())
    fail(Errc::InvalidArgument,
         "tiers hold prefix blocks: enable the prefix cache first (kvc_pool_enable_prefix_cache)");
  {
    std::lock_guard g(m_);
    if (tiers_.size() >= 8) fail(Errc::InvalidArgument, "a pool has at most 8 tiers");
  }
  // The tier is made only when the pool can take it (a disk tier's directory
  // scan removes files: a refused call must not have run it).
  auto slot = std::make_unique<TierSlot>();
  slot->t = make();  // throws: nothing changed
  slot->kind = kind;
  if (fp_.empty()) fp_ = pool_fingerprint(c_.cfg_);
  try {
    start();
  } catch (const std::system_error &e) {
    fail(Errc::OutOfMemory, std::string("cannot start the offload threads: ") + e.what());
  }
  std::lock_guard g(m_);
  tiers_.push_back(std::move(slot));  // reserved below 8 under the pool lock: cannot fail
  active_.store(true, std::memory_order_release);
  return static_cast<uint32_t>(tiers_.size() - 1);
}

void Offload::set_offload(uint32_t queue_blocks, uint32_t load_timeout_ms) {
  if (queue_blocks == 0 || queue_blocks > (1u << 20))
    fail(Errc::InvalidArgument, "queue_blocks " + u64s(queue_blocks) + " is outside [1, 2^20]");
  if (load_timeout_ms == 0 || load_timeout_ms > 3600u * 1000u)
    fail(Errc::InvalidArgument,
         "load_timeout_ms " + u64s(load_timeout_ms) + " is outside [1, 3600000]");
  std::unique_lock lk(c_.mu_);
  if (!active()) fail(Errc::InvalidArgument, "the pool has no tiers (kvc_pool_add_tier)");
  std::lock_guard g(m_);
  queue_cap_ = queue_blocks;
  timeout_ms_ = load_timeout_ms;
}

uint32_t Offload::num_tiers() const {
  std::shared_lock lk(c_.mu_);
  if (!active()) return 0;
  std::lock_guard g(m_);
  return static_cast<uint32_t>(tiers_.size());
}

TierCounts Offload::counts(uint32_t index) const {
  std::shared_lock lk(c_.mu_);
  TierSlot *t = nullptr;
  uint64_t pinned = 0;
  {
    std::lock_guard g(m_);
    if (index < tiers_.size()) {
      t = tiers_[index].get();
      pinned = t->pinned;
    }
  }
  if (!t)
    fail(Errc::OutOfRange,
         "tier " + u64s(index) + ": the pool has " + u64s(num_tiers_locked()) + " tiers");
  const tier::Stats s = t->t->stats();
  TierCounts c;
  c.kind = t->kind;
  c.bytes = s.bytes;
  c.entries = s.entries;
  c.hits = s.hits;
  c.misses = s.misses;
  c.demotions = t->demotions.load();
  c.promotions = t->promotions.load();
  c.drops = drops_.load();
  c.evictions = s.evictions;
  c.errors = s.errors + t->other_errors.load();
  c.pinned = pinned;
  c.last_error = t->t->last_error();
  if (c.last_error.empty() && t->other_errors.load())
    c.last_error =
        "a record was refused by the pool (another prompt's, layout's or per-tensor scales), or a "
        "write or "
        "read failed outside the tier (out of memory, an injected test error)";
  return c;
}

// ---------------------------------------------------------------------------
// Demotion

// Payload of a tier record: header, the block's token ids, the extra keys'
// encoding, the per-tensor scales (pools with per-tensor codecs), then the
// entry's blocks, layer by layer, as the pool stores them.
std::vector<uint8_t> Offload::stage_entry(uint32_t e) const {
  const PrefixState &ps = *pc_.state();
  const PrefixEntry &en = ps.entries[e];
  const uint64_t nl = c_.cfg_.num_layers, bs = c_.cfg_.block_size;
  const uint32_t n_scales = static_cast<uint32_t>(c_.fmt_.scale_parts() * nl);
  const std::vector<uint8_t> &xb = en.extras_bytes;
  const uint64_t head = kPayloadHeader + bs * 4 + xb.size() + uint64_t(n_scales) * 4;
  std::vector<uint8_t> p(head + c_.fmt_.layer_bytes());
  uint8_t *q = p.data();
  std::memcpy(q, "KVCD", 4);
  put_le32(q + 4, kPayloadVersion);
  put_le32(q + 8, static_cast<uint32_t>(nl));
  put_le32(q + 12, static_cast<uint32_t>(bs));
  put_le64(q + 16, c_.block_stride_);  // (per-layer formats: layer 0's; the fingerprint has all)
  put_le64(q + 24, en.depth);
  put_le32(q + 32, static_cast<uint32_t>(xb.size()));
  put_le32(q + 36, n_scales);
  std::memcpy(q + 40, en.parent.b.data(), 32);
  std::memcpy(q + kPayloadHeader, en.tokens.data(), bs * 4);
  uint8_t *x = q + kPayloadHeader + bs * 4;
  if (!xb.empty()) std::memcpy(x, xb.data(), xb.size());
  x += xb.size();
  {  // per-tensor scales: the layers of K (if per-tensor), then of V
    uint32_t i = 0;
    for (int kv = 0; kv < 2; ++kv)
      if (c_.fmt_.scale[kv])
        for (uint64_t l = 0; l < nl; ++l)
          put_le32(x + 4 * i++, c_.fmt_.scale[kv][l].load(std::memory_order_acquire));
  }
  x += uint64_t(n_scales) * 4;
  c_.store_->to_host(en.blocks.data(), nl, x);
  return p;
}

// Never throws (called while a block is being handed out): a block that
// cannot be queued is dropped and counted.
bool Offload::demote_entry(uint32_t e) {
  try {
    {
      std::lock_guard g(m_);
      if (tiers_.empty() || stop_) return false;
      if (demote_q_.size() >= queue_cap_) {  // full: drop, never wait
        drops_.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
    }
    Demotion d;
    d.key = pc_.state()->entries[e].key;
    d.payload = stage_entry(e);  // copied now: the block may be reused as soon as this returns
    {
      std::lock_guard g(m_);
      if (demote_q_.size() >= queue_cap_) {
        drops_.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
      demote_q_.push_back(std::move(d));
    }
    writer_cv_.notify_one();
    return true;
  } catch (...) {
    drops_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
}

uint64_t Offload::offload(const int32_t *tokens, uint64_t n, const ExtraKeys &kx) {
  std::unique_lock lk(c_.mu_);
  if (!pc_.enabled())
    fail(Errc::InvalidArgument, "the prefix cache is not enabled (kvc_pool_enable_prefix_cache)");
  if (!active()) fail(Errc::InvalidArgument, "the pool has no tiers (kvc_pool_add_tier)");
  // Every whole block of the prompt (the last token included: n + 1).
  const std::vector<uint32_t> path =
      prefix::prefix_walk_path(*pc_.state(), c_.cfg_.block_size, tokens, n + 1, kx);
  uint64_t queued = 0;
  for (uint32_t e : path) queued += demote_entry(e) ? 1 : 0;
  return queued;
}

void Offload::flush() {
  if (!active()) return;
  std::unique_lock g(m_);
  idle_cv_.wait(g, [&] { return demote_q_.empty() && writing_ == 0; });
}

// ---------------------------------------------------------------------------
// Lookup, pins

PrefixResult Offload::lookup(const int32_t *tokens, uint64_t n, const ExtraKeys &kx, bool partial,
                             bool pin) {
  PrefixResult r = pc_.lookup(tokens, n, kx, partial);
  std::vector<BlockKey> keys;
  {
    std::shared_lock lk(c_.mu_);
    if (!active() || n <= 1) return r;
    const PrefixState &ps = *pc_.state();
    const uint64_t bs = c_.cfg_.block_size;
    const std::vector<uint32_t> path = prefix::prefix_walk_path(ps, bs, tokens, n, kx);
    BlockKey parent = path.empty() ? ps.root : ps.entries[path.back()].key;
    std::vector<uint8_t> scratch;
    const uint64_t last =
        std::min<uint64_t>((n - 1) / bs, path.size() + c_.alloc_.num_blocks() / c_.cfg_.num_layers);
    for (uint64_t i = path.size(); i < last; ++i) {
      parent = ps.hasher.block(parent, tokens + i * bs, static_cast<uint32_t>(bs), kx, scratch);
      keys.push_back(parent);
    }
  }
  std::vector<TierSlot *> ts;
  {
    std::lock_guard g(m_);
    ts = snapshot();
  }
  PinRecord rec;
  uint64_t found = 0;
  // Remote tiers (Redis) are asked about every key left at once, the first
  // time one is needed: one round trip per server instead of one per block.
  std::vector<std::vector<char>> present(ts.size());
  std::vector<size_t> present_from(ts.size(), SIZE_MAX);
  try {
    for (size_t i = 0; i < keys.size(); ++i) {  // no pool lock held: tiers may be slow
      const BlockKey k = keys[i];
      bool any = false;
      for (size_t ti = 0; ti < ts.size(); ++ti) {
        TierSlot *t = ts[ti];
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
        bool has;
        if (t->t->batched_contains()) {
          if (present_from[ti] == SIZE_MAX) {
            t->t->contains_many(keys.data() + i, keys.size() - i, present[ti]);
            present_from[ti] = i;
          }
          has = present[ti][i - present_from[ti]] != 0;
        } else {
          has = t->t->contains(k);
        }
        if (has) {
          any = true;
          break;
        }
      }
      if (!any) break;
      ++found;
    }
    r.tier_tokens = found * c_.cfg_.block_size;
    if (pin && !rec.keys.empty()) {
      std::lock_guard g(m_);
      const uint64_t id = g_next_pin.fetch_add(1, std::memory_order_relaxed);
      pins_.emplace(id, rec);  // may throw: the pins are released below
      for (auto &[t, k] : rec.keys) ++t->pinned;
      r.pin = id;
    }
  } catch (...) {  // no pin is left behind by a failed lookup
    for (auto &[t, k] : rec.keys) t->t->unpin(k);
    throw;
  }
  return r;
}

void Offload::unpin(uint64_t pin) {
  if (!active())
    fail(Errc::InvalidArgument, "pin " + u64s(pin) + " is not held (the pool has no tiers)");
  PinRecord rec;
  {
    std::lock_guard g(m_);
    auto it = pins_.find(pin);
    if (it == pins_.end())
      fail(Errc::InvalidArgument,
           "pin " + u64s(pin) + " is not held (never given, or already unpinned)");
    rec = std::move(it->second);
    pins_.erase(it);
    for (auto &[t, k] : rec.keys) --t->pinned;
  }
  for (auto &[t, k] : rec.keys) t->t->unpin(k);
}

// ---------------------------------------------------------------------------
// Loads

uint64_t Offload::prefetch(const int32_t *tokens, uint64_t n, const ExtraKeys &kx, bool sync) {
  PendingLoad L;
  L.sync = sync;
  {
    std::shared_lock lk(c_.mu_);
    if (!pc_.enabled())
      fail(Errc::InvalidArgument, "the prefix cache is not enabled (kvc_pool_enable_prefix_cache)");
    if (!active()) fail(Errc::InvalidArgument, "the pool has no tiers (kvc_pool_add_tier)");
    const PrefixState &ps = *pc_.state();
    const uint64_t bs = c_.cfg_.block_size;
    if (n > 1) {
      const std::vector<uint32_t> path = prefix::prefix_walk_path(ps, bs, tokens, n, kx);
      L.parent = path.empty() ? ps.root : ps.entries[path.back()].key;
      L.first_depth = path.size() + 1;
      L.xb = kx.enc;
      L.xd = prefix::prefix_extras_digest(ps.hasher, kx);
      BlockKey parent = L.parent;
      std::vector<uint8_t> scratch;
      const uint64_t last = std::min<uint64_t>(
          (n - 1) / bs, path.size() + c_.alloc_.num_blocks() / c_.cfg_.num_layers);
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
    std::lock_guard g(m_);
    ts = snapshot();
  }
  size_t held = 0;
  for (; held < L.keys.size(); ++held) {
    bool any = false;
    for (TierSlot *t : ts) any = any || t->t->contains(L.keys[held]);
    if (!any) break;
  }
  L.keys.resize(held);
  L.tokens.resize(held);

  std::unique_lock lk(c_.mu_);
  const uint64_t nl = c_.cfg_.num_layers;
  // Reserve the blocks now (the pool's own prefix path stays: referenced
  // while reserving, so the reservation cannot reclaim the chain it extends).
  const std::vector<uint32_t> path =
      prefix::prefix_walk_path(*pc_.state(), c_.cfg_.block_size, tokens, n, kx);
  std::vector<int32_t> held_path;
  for (uint32_t e : path)
    for (int32_t b : pc_.state()->entries[e].blocks)
      if (c_.alloc_.state(b) == BlockAllocator::State::Cached) held_path.push_back(b);
  // Whole entries: one block per layer, each of its layer's format.
  PoolCore::Need held_n(c_);
  for (int32_t b : held_path) held_n.add_block(b, 1);
  uint64_t can = UINT64_MAX;
  for (uint32_t cl = 0; cl < c_.alloc_.num_classes(); ++cl) {
    const uint64_t av = c_.alloc_.available(cl);
    can = std::min<uint64_t>(can, (av - std::min<uint64_t>(av, held_n.n[cl])) /
                                      std::max<uint32_t>(1, c_.fmt_.cls[cl].layers));
  }
  const uint64_t k = std::min<uint64_t>(held, can);
  L.keys.resize(k);
  L.tokens.resize(k);
  L.reserved.reserve(k * nl);
  uint64_t ticket;
  {
    std::lock_guard g(m_);
    ticket = g_next_ticket.fetch_add(1, std::memory_order_relaxed);
    L.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
    if (k == 0) L.state = LoadState::Done;
    loads_.emplace(ticket, PendingLoad{});  // may throw: nothing reserved yet
  }
  // From here on nothing throws.
  for (int32_t b : held_path) c_.alloc_.ref(b);
  for (uint64_t i = 0; i < k * nl; ++i)
    L.reserved.push_back(c_.take_layer_block(static_cast<uint32_t>(i % nl)));
  for (int32_t b : held_path) c_.release_block(b);
  {
    std::lock_guard g(m_);
    const bool pending = L.state == LoadState::Pending;
    loads_[ticket] = std::move(L);
    if (pending) load_q_.push_back(ticket);
  }
  loader_cv_.notify_one();
  reaper_cv_.notify_one();
  return ticket;
}

void Offload::install_load(uint64_t ticket, const std::vector<std::vector<uint8_t>> &payloads,
                           const std::vector<uint32_t> &from) {
  std::unique_lock lk(c_.mu_);
  std::lock_guard g(m_);
  auto it = loads_.find(ticket);
  if (it == loads_.end()) return;
  PendingLoad &L = it->second;
  if (L.state != LoadState::Pending)
    return;  // timed out: its blocks went back to the pool; the late answer is dropped
  PrefixState &ps = *pc_.state();
  const uint64_t nl = c_.cfg_.num_layers, bs = c_.cfg_.block_size;
  const uint32_t n_scales = static_cast<uint32_t>(c_.fmt_.scale_parts() * nl);
  // The chain's parent must still be in the index (it may have been reclaimed meanwhile).
  int64_t parent_entry = -1;
  BlockKey parent = L.parent;
  bool ok = true;
  if (L.first_depth > 1) {
    parent_entry = ps.map.find(parent);
    ok = parent_entry >= 0;
  }
  uint64_t loaded = 0;
  const std::vector<TierSlot *> ts = snapshot();
  for (size_t i = 0; ok && i < payloads.size() && i < L.keys.size(); ++i) {
    const std::vector<uint8_t> &p = payloads[i];
    const uint8_t *q = p.data();
    BlockKey k;
    k.b = L.keys[i].b;
    // The record's extra keys (X bytes: their encoding, docs/tiers.md) must be
    // the query's with verify_tokens. A pool without it trusts the key, as
    // its index does, and skips them: its own records carry none (X = 0).
    const uint64_t xsize = p.size() >= kPayloadHeader ? get_le32(q + 32) : 0;
    const uint64_t head = kPayloadHeader + bs * 4 + xsize + uint64_t(n_scales) * 4;
    // (Read only once the size is known to cover them.)
    auto extras_ok = [&] {
      return !ps.verify_tokens ||
             (xsize == L.xb.size() &&
              std::memcmp(q + kPayloadHeader + bs * 4, L.xb.data(), L.xb.size()) == 0);
    };
    const bool valid =
        p.size() >= kPayloadHeader && p.size() == head + c_.fmt_.layer_bytes() &&
        std::memcmp(q, "KVCD", 4) == 0 && get_le32(q + 4) == kPayloadVersion &&
        get_le32(q + 8) == nl && get_le32(q + 12) == bs && get_le64(q + 16) == c_.block_stride_ &&
        get_le64(q + 24) == L.first_depth + i && get_le32(q + 36) == n_scales &&
        std::memcmp(q + 40, parent.b.data(), 32) == 0 &&
        std::memcmp(q + kPayloadHeader, L.tokens[i].data(), bs * 4) == 0 && extras_ok();
    if (!valid) {  // not this block (a collision, another layout): a refused record, the chain
                   // stops here
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
        if (!c_.fmt_.scale[kv]) continue;
        for (uint64_t l = 0; l < nl; ++l, ++si) {
          const uint32_t want = get_le32(sc + 4 * si);
          std::atomic<uint32_t> &cur = c_.fmt_.scale[kv][l];
          const uint32_t have = cur.load(std::memory_order_acquire);
          if (pass == 0 &&
              (!BlockFormat::valid_scale_bits(want) || (want != 0 && have != 0 && have != want)))
            scales_ok = false;
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
    c_.store_->from_host(dst, nl, blocks);
    for (uint64_t li = 0; li < nl; ++li)
      c_.written_.set(dst[li], 0, c_.cfg_.block_size);  // a whole registered block
    parent_entry = pc_.register_entry(k, parent, parent_entry, L.first_depth + i,
                                      L.tokens[i].data(), L.xd, L.xb, dst);
    parent = k;
    if (from[i] < ts.size()) ts[from[i]]->promotions.fetch_add(1, std::memory_order_relaxed);
    ++loaded;
  }
  // Loaded blocks become cached (findable, reclaimable); the rest go back.
  for (size_t i = 0; i < L.keys.size(); ++i)
    for (uint64_t li = 0; li < nl; ++li) c_.release_block(L.reserved[i * nl + li]);
  L.reserved.clear();
  L.state = LoadState::Done;
  L.loaded_tokens = loaded * bs;
  done_cv_.notify_all();
}

void Offload::expire_loads() {
  std::unique_lock lk(c_.mu_);
  std::lock_guard g(m_);
  const auto now = std::chrono::steady_clock::now();
  for (auto &[t, L] : loads_) {
    if (L.state != LoadState::Pending || now < L.deadline) continue;
    for (int32_t b : L.reserved) c_.release_block(b);  // unregistered: back to the free list
    L.reserved.clear();
    L.state = LoadState::TimedOut;
  }
  done_cv_.notify_all();
}

LoadState Offload::poll(uint64_t ticket, bool wait, uint64_t *loaded_tokens) {
  if (!active())
    fail(Errc::InvalidArgument, "ticket " + u64s(ticket) + " is unknown (the pool has no tiers)");
  std::unique_lock g(m_);
  auto it = loads_.find(ticket);
  // A synchronous load's ticket is its own (never polled by anyone else).
  if (it == loads_.end() || it->second.sync != wait)
    fail(Errc::InvalidArgument,
         "ticket " + u64s(ticket) +
             " is unknown to this pool (never given by kvc_prefix_prefetch, or already reported)");
  if (wait) {
    // Looked up again after each wake: the map may have rehashed meanwhile.
    done_cv_.wait(g, [&] {
      it = loads_.find(ticket);
      return it == loads_.end() || it->second.state != LoadState::Pending;
    });
    if (it == loads_.end())
      fail(Errc::Internal, "load " + u64s(ticket) + " vanished while waited for");
  }
  const LoadState s = it->second.state;
  if (loaded_tokens) *loaded_tokens = s == LoadState::Done ? it->second.loaded_tokens : 0;
  if (s != LoadState::Pending) loads_.erase(it);
  return s;
}

}  // namespace kvc::core
