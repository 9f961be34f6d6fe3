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

}  // namespace kvc::core
