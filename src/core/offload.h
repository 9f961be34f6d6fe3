// The pool's offload machinery (docs/tiers.md): the tiers below the pool,
// the demotion writer (a bounded queue of staged block copies), the loader of
// prefetches and the reaper of loads whose tier does not answer in time.
//
// Locks: the pool lock (mu_) is always taken before OffloadState::m; the
// writer never takes the pool lock (it only writes staged copies), the loader
// and the reaper take it to install or free reserved blocks.
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

#include "core/pool.h"
#include "tier/tier.h"

namespace kvc::tier {

// Test hooks (tests only; empty by default). Set them while no pool with tiers
// runs or from the test thread; they are copied under a mutex before use.
struct TestHooks {
  bool pause_writer = false;                     // the demotion writer takes nothing from its queue
  std::function<void(const BlockKey &)> before_get;   // loader, before each tier read (may block: a tier that never answers)
  std::function<bool(const BlockKey &)> fail_put;     // true: this demotion write fails (an injected error)
};
TestHooks get_test_hooks();
void set_test_hooks(const TestHooks &h);

}  // namespace kvc::tier

namespace kvc::core {

struct TierSlot {
  std::unique_ptr<tier::Tier> t;
  int32_t kind = 0;
  std::atomic<uint64_t> demotions{0}, promotions{0}, other_errors{0};
  uint64_t pinned = 0;  // keys pinned through pool pins (under OffloadState::m)
};

struct Demotion {
  BlockKey key;
  std::vector<uint8_t> payload;
};

struct PendingLoad {
  std::vector<BlockKey> keys;            // blocks to load, in chain order
  std::vector<std::vector<int32_t>> tokens;  // their token ids (verified against the record)
  BlockKey parent;                       // key before keys[0] (the root for depth 1)
  uint64_t first_depth = 1;
  std::vector<uint8_t> xb;                // extras encoding
  BlockKey xd;                           // extras digest
  std::vector<int32_t> reserved;          // [keys.size()][num_layers] pool blocks (reference 1)
  std::chrono::steady_clock::time_point deadline;
  LoadState state = LoadState::Pending;
  uint64_t loaded_tokens = 0;
  bool sync = false;  // kvc_prefix_load's own: only its caller waits for it
};

struct PinRecord {
  std::vector<std::pair<TierSlot *, BlockKey>> keys;
};

struct OffloadState {
  explicit OffloadState(Pool *p);
  ~OffloadState();  // shutdown()
  // Stops and joins the threads (a queued demotion is still written). The
  // pool calls it before it starts to go away: the threads call into it.
  void shutdown();
  OffloadState(const OffloadState &) = delete;
  OffloadState &operator=(const OffloadState &) = delete;

  std::vector<TierSlot *> snapshot();  // m held
  bool stopping();                     // m not held
  void start();                        // m not held; starts the threads once
  void writer_loop();
  void loader_loop();
  void reaper_loop();

  Pool *pool;
  std::vector<uint8_t> fp;  // the pool's fingerprint (tiers keep it with each record)
  std::vector<std::unique_ptr<TierSlot>> tiers;
  uint32_t queue_cap = 256;
  uint32_t timeout_ms = 10000;

  std::mutex m;
  std::condition_variable writer_cv, idle_cv, loader_cv, reaper_cv, done_cv;
  std::deque<Demotion> demote_q;
  uint32_t writing = 0;
  std::atomic<uint64_t> drops{0};
  std::deque<uint64_t> load_q;
  std::unordered_map<uint64_t, PendingLoad> loads;
  std::unordered_map<uint64_t, PinRecord> pins;
  bool stop = false, started = false;
  std::thread writer, loader, reaper;
};

}  // namespace kvc::core
