#include "core/block_allocator.h"

#include <string>

namespace kvc::core {

BlockAllocator::BlockAllocator(uint32_t n)
    : refcount_(n, 0),
      state_(n, static_cast<uint8_t>(State::Free)),
      free_stack_(n),
      free_top_(n),
      lru_prev_(n, -1),
      lru_next_(n, -1) {
  // Block 0 on top of the stack: allocation order 0, 1, 2, ... on a fresh pool.
  for (uint32_t i = 0; i < n; ++i) free_stack_[i] = static_cast<int32_t>(n - 1 - i);
}

std::string BlockAllocator::check() const {
  const uint32_t n = num_blocks();
  std::vector<uint8_t> seen(n, 0);
  for (uint32_t i = 0; i < free_top_; ++i) {
    const int32_t b = free_stack_[i];
    if (b < 0 || static_cast<uint32_t>(b) >= n) return "free stack holds an invalid id";
    if (seen[b]++) return "block " + std::to_string(b) + " twice in the free stack";
    if (state_[b] != static_cast<uint8_t>(State::Free) || refcount_[b] != 0)
      return "block " + std::to_string(b) + " in the free stack but not free";
  }
  uint32_t cached = 0;
  for (int32_t b = lru_head_; b >= 0; b = lru_next_[b]) {
    if (seen[b]++) return "block " + std::to_string(b) + " in two lists";
    if (state_[b] != static_cast<uint8_t>(State::Cached) || refcount_[b] != 0)
      return "block " + std::to_string(b) + " in the LRU but not cached";
    if (++cached > n) return "LRU list has a cycle";
  }
  if (cached != num_cached_) return "cached count disagrees with the LRU list";
  uint32_t shared = 0;
  for (uint32_t b = 0; b < n; ++b) {
    if (state_[b] == static_cast<uint8_t>(State::Used)) {
      if (seen[b]) return "used block " + std::to_string(b) + " in a list";
      if (refcount_[b] == 0) return "used block " + std::to_string(b) + " with reference count 0";
      if (refcount_[b] >= 2) ++shared;
    } else if (!seen[b]) {
      return "block " + std::to_string(b) + " is in no state";
    }
  }
  if (shared != num_shared_) return "shared count disagrees";
  return {};
}

}  // namespace kvc::core
