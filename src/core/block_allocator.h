// Block allocator: O(1) allocate / reference / release over a fixed number of
// blocks, with the three block states of the pool (free, cached, used).
//
// - free: on the free stack (LIFO, so recently freed, cache-warm blocks are
//   reused first);
// - cached: reference count 0 but still registered for prefix reuse, kept in
//   an intrusive LRU list (least recently released first) and reclaimed only
//   when the free stack is empty;
// - used: reference count >= 1.
// Not thread-safe: the pool serializes calls.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvc::core {

class BlockAllocator {
 public:
  enum class State : uint8_t { Free = 0, Cached = 1, Used = 2 };

  explicit BlockAllocator(uint32_t num_blocks);

  uint32_t num_blocks() const { return static_cast<uint32_t>(refcount_.size()); }
  uint32_t num_free() const { return free_top_; }
  uint32_t num_cached() const { return num_cached_; }
  uint32_t num_used() const { return num_blocks() - free_top_ - num_cached_; }
  uint32_t num_shared() const { return num_shared_; }
  // Blocks an allocation can take now (free + reclaimable cached).
  uint32_t available() const { return free_top_ + num_cached_; }

  State state(int32_t b) const { return static_cast<State>(state_[b]); }
  uint32_t refcount(int32_t b) const { return refcount_[b]; }

  // Takes a free block (reference count 1), or reclaims the least recently
  // released cached block when none is free (its id is reported through
  // *reclaimed so the owner can drop it from its index; -1 otherwise).
  // Returns -1 when nothing is available.
  int32_t allocate(int32_t *reclaimed);

  // Reference count + 1. A cached block becomes used again (a prefix hit).
  void ref(int32_t b);

  // Reference count - 1. At 0 the block becomes cached when `keep_cached`
  // (registered in a prefix index) and free otherwise. Returns true when the
  // block became free.
  bool release(int32_t b, bool keep_cached);

  // Moves a cached block to the free stack (its index entry was dropped).
  void uncache(int32_t b);
  // Moves a cached block to the most recently released end of the LRU.
  void touch(int32_t b) {
    lru_remove(b);
    lru_push_back(b);
  }

  // Checks every block is in exactly one state and the counters agree;
  // returns "" or a description of the first violation.
  std::string check() const;

 private:
  void lru_push_back(int32_t b);
  void lru_remove(int32_t b);

  std::vector<uint32_t> refcount_;
  std::vector<uint8_t> state_;
  std::vector<int32_t> free_stack_;
  uint32_t free_top_ = 0;
  std::vector<int32_t> lru_prev_, lru_next_;
  int32_t lru_head_ = -1, lru_tail_ = -1;
  uint32_t num_cached_ = 0;
  uint32_t num_shared_ = 0;
};

inline int32_t BlockAllocator::allocate(int32_t *reclaimed) {
  *reclaimed = -1;
  int32_t b;
  if (free_top_ > 0) {
    b = free_stack_[--free_top_];
  } else if (lru_head_ >= 0) {
    b = lru_head_;
    lru_remove(b);
    --num_cached_;
    *reclaimed = b;
  } else {
    return -1;
  }
  state_[b] = static_cast<uint8_t>(State::Used);
  refcount_[b] = 1;
  return b;
}
inline void BlockAllocator::ref(int32_t b) {
  if (state_[b] == static_cast<uint8_t>(State::Cached)) {
    lru_remove(b);
    --num_cached_;
    state_[b] = static_cast<uint8_t>(State::Used);
  }
  if (++refcount_[b] == 2) ++num_shared_;
}
inline bool BlockAllocator::release(int32_t b, bool keep_cached) {
  if (refcount_[b]-- == 2) --num_shared_;
  if (refcount_[b] != 0) return false;
  if (keep_cached) {
    state_[b] = static_cast<uint8_t>(State::Cached);
    lru_push_back(b);
    ++num_cached_;
    return false;
  }
  state_[b] = static_cast<uint8_t>(State::Free);
  free_stack_[free_top_++] = b;
  return true;
}
inline void BlockAllocator::uncache(int32_t b) {
  lru_remove(b);
  --num_cached_;
  state_[b] = static_cast<uint8_t>(State::Free);
  free_stack_[free_top_++] = b;
}
inline void BlockAllocator::lru_push_back(int32_t b) {
  lru_prev_[b] = lru_tail_;
  lru_next_[b] = -1;
  if (lru_tail_ >= 0)
    lru_next_[lru_tail_] = b;
  else
    lru_head_ = b;
  lru_tail_ = b;
}
inline void BlockAllocator::lru_remove(int32_t b) {
  const int32_t p = lru_prev_[b], n = lru_next_[b];
  if (p >= 0)
    lru_next_[p] = n;
  else
    lru_head_ = n;
  if (n >= 0)
    lru_prev_[n] = p;
  else
    lru_tail_ = p;
  lru_prev_[b] = lru_next_[b] = -1;
}

}  // namespace kvc::core
