// Block allocator: O(1) allocate / reference / release over a fixed number of
// blocks, with the three block states of the pool (free, cached, used).
//
// - free: on the free stack (LIFO, so recently freed, cache-warm blocks are
//   reused first);
// - cached: reference count 0 but still registered for prefix reuse, kept in
//   an intrusive LRU list (least recently released first) and reclaimed only
//   when the free stack is empty;
// - used: reference count >= 1.
//
// Blocks come in classes (block formats of different sizes: a pool with a
// codec per layer, docs/codecs.md "Mixed precision"): class c owns the ids
// [first(c), first(c) + blocks(c)), with a free stack and an LRU list of its
// own; an allocation names its class. A pool with one format has one class.
// Not thread-safe: the pool serializes calls.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvc::core {

class BlockAllocator {
 public:
  enum class State : uint8_t { Free = 0, Cached = 1, Used = 2 };

  // One class of num_blocks blocks.
  explicit BlockAllocator(uint32_t num_blocks)
      : BlockAllocator(std::vector<uint32_t>{num_blocks}) {}
  // Classes of class_blocks[c] blocks each (at most 255 classes), in order.
  explicit BlockAllocator(const std::vector<uint32_t> &class_blocks);

  uint32_t num_blocks() const { return static_cast<uint32_t>(refcount_.size()); }
  uint32_t num_free() const { return num_free_; }
  uint32_t num_cached() const { return num_cached_; }
  uint32_t num_used() const { return num_blocks() - num_free_ - num_cached_; }
  uint32_t num_shared() const { return num_shared_; }
  // Blocks an allocation can take now (free + reclaimable cached), in all classes.
  uint32_t available() const { return num_free_ + num_cached_; }

  uint32_t num_classes() const { return static_cast<uint32_t>(cls_.size()); }
  uint32_t class_of(int32_t b) const { return block_cls_.empty() ? 0u : block_cls_[b]; }
  uint32_t first(uint32_t c) const { return cls_[c].first; }
  uint32_t blocks(uint32_t c) const { return cls_[c].count; }
  uint32_t available(uint32_t c) const { return cls_[c].free_top + cls_[c].num_cached; }
  uint32_t used(uint32_t c) const { return cls_[c].count - available(c); }  // used + 0 cached
  uint32_t cached(uint32_t c) const { return cls_[c].num_cached; }

  State state(int32_t b) const { return static_cast<State>(state_[b]); }
  uint32_t refcount(int32_t b) const { return refcount_[b]; }

  // Takes a free block of class c (reference count 1), or reclaims the
  // class's least recently released cached block when none is free (its id
  // is reported through *reclaimed so the owner can drop it from its index;
  // -1 otherwise). Returns -1 when the class has nothing available.
  int32_t allocate(uint32_t c, int32_t *reclaimed);
  int32_t allocate(int32_t *reclaimed) { return allocate(0, reclaimed); }

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
  struct Class {
    uint32_t first = 0, count = 0;
    uint32_t free_top = 0;  // class c's free stack: free_stack_[first, first + free_top)
    uint32_t num_cached = 0;
    int32_t lru_head = -1, lru_tail = -1;
  };
  Class &cls(int32_t b) { return cls_[class_of(b)]; }
  void push_free(int32_t b) {
    Class &k = cls(b);
    free_stack_[k.first + k.free_top++] = b;
    ++num_free_;
  }
  void lru_push_back(int32_t b);
  void lru_remove(int32_t b);

  std::vector<uint32_t> refcount_;
  std::vector<uint8_t> state_;
  std::vector<uint8_t> block_cls_;  // class of each block; empty with one class
  std::vector<Class> cls_;
  std::vector<int32_t> free_stack_;
  std::vector<int32_t> lru_prev_, lru_next_;
  uint32_t num_free_ = 0;
  uint32_t num_cached_ = 0;
  uint32_t num_shared_ = 0;
};

inline int32_t BlockAllocator::allocate(uint32_t c, int32_t *reclaimed) {
  *reclaimed = -1;
  Class &k = cls_[c];
  int32_t b;
  if (k.free_top > 0) {
    b = free_stack_[k.first + --k.free_top];
    --num_free_;
  } else if (k.lru_head >= 0) {
    b = k.lru_head;
    lru_remove(b);
    --k.num_cached;
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
    --cls(b).num_cached;
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
    ++cls(b).num_cached;
    ++num_cached_;
    return false;
  }
  state_[b] = static_cast<uint8_t>(State::Free);
  push_free(b);
  return true;
}
inline void BlockAllocator::uncache(int32_t b) {
  lru_remove(b);
  --cls(b).num_cached;
  --num_cached_;
  state_[b] = static_cast<uint8_t>(State::Free);
  push_free(b);
}
inline void BlockAllocator::lru_push_back(int32_t b) {
  Class &k = cls(b);
  lru_prev_[b] = k.lru_tail;
  lru_next_[b] = -1;
  if (k.lru_tail >= 0)
    lru_next_[k.lru_tail] = b;
  else
    k.lru_head = b;
  k.lru_tail = b;
}
inline void BlockAllocator::lru_remove(int32_t b) {
  Class &k = cls(b);
  const int32_t p = lru_prev_[b], n = lru_next_[b];
  if (p >= 0)
    lru_next_[p] = n;
  else
    k.lru_head = n;
  if (n >= 0)
    lru_prev_[n] = p;
  else
    k.lru_tail = p;
  lru_prev_[b] = lru_next_[b] = -1;
}

}  // namespace kvc::core
