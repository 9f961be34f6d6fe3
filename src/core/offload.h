// The offload tiers of a pool (docs/tiers.md): the tiers below the prefix
// cache, the demotion writer, the loader of prefetches and the reaper of
// loads whose tier does not answer in time.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/pool_int.h"
#include "core/types.h"
#include "tier/factory.h"
#include "tier/tier.h"

namespace kvc::core {

// Test hooks (tests only; empty by default). Set them while no pool with tiers
// runs or from the test thread; they are copied under a mutex before use.
struct TestHooks {
  bool pause_writer = false;  // the demotion writer takes nothing from its queue
  // The loader, before each tier read (may block: a tier that never answers).
  std::function<void(const BlockKey &)> before_get;
  // True: this demotion write fails (an injected error).
  std::function<bool(const BlockKey &)> fail_put;
};
TestHooks get_test_hooks();
void set_test_hooks(const TestHooks &h);

class PrefixCache;

// A tier's description (tier/factory.h); kinds equal kvc_tier_kind.
using TierSpec = tier::Spec;
using TierKind = tier::Kind;

struct TierSlot {
  std::unique_ptr<tier::Tier> t;
  int32_t kind = 0;
  std::atomic<uint64_t> demotions{0}, promotions{0}, other_errors{0};
  uint64_t pinned = 0;  // keys pinned through pool pins (under Offload::m_)
};

struct Demotion {
  BlockKey key;
  std::vector<uint8_t> payload;
};

struct PendingLoad {
  std::vector<BlockKey> keys;                // blocks to load, in chain order
  std::vector<std::vector<int32_t>> tokens;  // their token ids (verified against the record)
  BlockKey parent;                           // key before keys[0] (the root for depth 1)
  uint64_t first_depth = 1;
  std::vector<uint8_t> xb;        // extras encoding
  BlockKey xd;                    // extras digest
  std::vector<int32_t> reserved;  // [keys.size()][num_layers] pool blocks (reference 1)
  std::chrono::steady_clock::time_point deadline;
  LoadState state = LoadState::Pending;
  uint64_t loaded_tokens = 0;
  bool sync = false;  // kvc_prefix_load's own: only its caller waits for it
};

struct PinRecord {
  std::vector<std::pair<TierSlot *, BlockKey>> keys;
};

// The offload tiers of one pool's prefix cache and their three threads: the
// demotion *writer* (a bounded queue of staged block copies written to every
// tier; a full queue drops and counts), the *loader* of prefetches (reads,
// then install_load under the pool lock) and the *reaper* of loads whose
// tier does not answer in time. It reaches the pool through PoolCore and
// PrefixCache, never the other way round but for the demotion hook.
//
// Locks: the pool lock is always taken before Offload::m_; the writer never
// takes the pool lock (it only writes staged copies), the loader and the
// reaper take it to install or free reserved blocks. No tier call is made
// under the pool lock.
class Offload {
 public:
  Offload(PoolCore &c, PrefixCache &pc);
  ~Offload();  // shutdown()
  Offload(const Offload &) = delete;
  Offload &operator=(const Offload &) = delete;
  // Stops and joins the threads (a queued demotion is still written). The
  // pool calls it before it starts to go away: the threads call into it.
  void shutdown();

  // Adds the tier `make` opens (which may throw) once the pool can take it.
  uint32_t add_tier(const std::function<std::unique_ptr<tier::Tier>()> &make, int32_t kind);
  // The tier a description names (tier/factory.h: checked before anything changes).
  uint32_t add_tier(const tier::Spec &spec) {
    return add_tier(tier::tier_maker(spec), static_cast<int32_t>(spec.kind));
  }
  void set_offload(uint32_t queue_blocks, uint32_t load_timeout_ms);
  uint32_t num_tiers() const;
  TierCounts counts(uint32_t index) const;
  // Lookup through the pool and then the tiers; `pin`: pins the tier blocks found.
  PrefixResult lookup(const int32_t *tokens, uint64_t n, const ExtraKeys &kx, bool partial,
                      bool pin);
  void unpin(uint64_t pin);
  // Queues the registered blocks of a prompt for writing to every tier; returns blocks queued.
  uint64_t offload(const int32_t *tokens, uint64_t n, const ExtraKeys &kx);
  void flush();
  // Loads the tier blocks following the pool's hit into cached pool blocks
  // (registered, reference count 0). prefetch returns a ticket; poll reports
  // its state (wait: until it is no longer pending) and on Done / TimedOut
  // forgets the ticket. sync: kvc_prefix_load's own ticket, reported only to
  // poll(wait = true).
  uint64_t prefetch(const int32_t *tokens, uint64_t n, const ExtraKeys &kx, bool sync = false);
  LoadState poll(uint64_t ticket, bool wait, uint64_t *loaded_tokens);

  // ---- for the prefix cache and the checks (exclusive pool lock held) ----
  bool active() const;  // a tier was added
  // Stages entry e's blocks and queues them; never throws (a block that
  // cannot be queued is dropped and counted). False: dropped.
  bool demote_entry(uint32_t e);
  // Adds the reference of every block reserved for a pending load to refs[b].
  void count_reserved(std::vector<uint64_t> &refs) const;

 private:
  std::vector<TierSlot *> snapshot() const;  // m_ held
  uint32_t num_tiers_locked() const;         // m_ not held
  bool stopping();                           // m_ not held
  void start();                              // m_ not held; starts the threads once
  void writer_loop();
  void loader_loop();
  void reaper_loop();
  std::vector<uint8_t> stage_entry(uint32_t e) const;  // a registered entry as a tier payload
  void install_load(uint64_t ticket, const std::vector<std::vector<uint8_t>> &payloads,
                    const std::vector<uint32_t> &from);
  void expire_loads();  // frees reservations past their deadline

  PoolCore &c_;
  PrefixCache &pc_;
  std::vector<uint8_t> fp_;  // the pool's fingerprint (tiers keep it with each record)
  std::vector<std::unique_ptr<TierSlot>> tiers_;
  uint32_t queue_cap_ = 256;
  uint32_t timeout_ms_ = 10000;

  mutable std::mutex m_;
  std::condition_variable writer_cv_, idle_cv_, loader_cv_, reaper_cv_, done_cv_;
  std::deque<Demotion> demote_q_;
  uint32_t writing_ = 0;
  std::atomic<uint64_t> drops_{0};
  std::deque<uint64_t> load_q_;
  std::unordered_map<uint64_t, PendingLoad> loads_;
  std::unordered_map<uint64_t, PinRecord> pins_;
  bool stop_ = false, started_ = false;
  std::atomic<bool> active_{false};
  std::thread writer_, loader_, reaper_;
};

}  // namespace kvc::core
