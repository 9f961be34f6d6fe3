// A small reader-writer lock for the pool: one atomic word, uncontended lock
// and unlock are one atomic operation each (pthread_rwlock costs ~4x more,
// which dominated block reserve/free). Waiters block in the kernel through
// C++20 atomic wait/notify (a futex on Linux), so a long append never burns
// a waiting writer's CPU. Readers may starve writers under a continuous
// stream of overlapping readers; the pool's readers are short.
#pragma once
#include <atomic>
#include <cstdint>

namespace kvc {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class RwLock {
 public:
  void lock() {
    uint32_t expected = 0;
    if (state_.compare_exchange_strong(expected, kWriter, std::memory_order_acquire,
                                       std::memory_order_relaxed))
      return;
    lock_slow();
  }
  void unlock() {
    if (state_.exchange(0, std::memory_order_release) & kWaiters) state_.notify_all();
  }
  void lock_shared() {
    uint32_t s = state_.load(std::memory_order_relaxed);
    if (!(s & kWriter) && state_.compare_exchange_strong(s, s + 1, std::memory_order_acquire,
                                                         std::memory_order_relaxed))
      return;
    lock_shared_slow();
  }
  void unlock_shared() {
    const uint32_t prev = state_.fetch_sub(1, std::memory_order_release);
    if ((prev & kReaders) == 1 && (prev & kWaiters)) {
      uint32_t expected = kWaiters;  // last reader, someone waits: clear the flag and wake
      if (state_.compare_exchange_strong(expected, 0, std::memory_order_relaxed))
        state_.notify_all();
    }
  }

 private:
  static constexpr uint32_t kWriter = 1u << 31;
  static constexpr uint32_t kWaiters = 1u << 30;
  static constexpr uint32_t kReaders = kWaiters - 1;

  // Spins briefly, then sleeps on the word until `next(s)` can be stored:
  // `next` returns the state to install, or kBusy when the lock is not free
  // for this kind of holder.
  static constexpr uint32_t kBusy = 0xffffffffu;
  template <typename Next>
  void acquire_slow(Next next) {
    for (int spin = 0;; ++spin) {
      uint32_t s = state_.load(std::memory_order_relaxed);
      const uint32_t want = next(s);
      if (want != kBusy) {
        if (state_.compare_exchange_weak(s, want, std::memory_order_acquire,
                                         std::memory_order_relaxed))
          return;
        continue;
      }
      if (spin < 64) {
        cpu_relax();
        continue;
      }
      if (!(s & kWaiters) &&
          !state_.compare_exchange_weak(s, s | kWaiters, std::memory_order_relaxed))
        continue;
      state_.wait(s | kWaiters, std::memory_order_relaxed);
    }
  }
  // A writer takes a free lock, keeping the waiters flag so its unlock wakes them.
  void lock_slow() {
    acquire_slow(
        [](uint32_t s) { return (s & ~kWaiters) == 0 ? kWriter | (s & kWaiters) : kBusy; });
  }
  void lock_shared_slow() {
    acquire_slow([](uint32_t s) { return (s & kWriter) ? kBusy : s + 1; });
  }

  std::atomic<uint32_t> state_{0};
};

}  // namespace kvc
