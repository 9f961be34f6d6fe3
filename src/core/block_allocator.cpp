#include "core/block_allocator.h"

#include <string>

namespace kvc::core {

BlockAllocator::BlockAllocator(const std::vector<uint32_t> &class_blocks) {
  uint64_t n = 0;
  for (uint32_t c : class_blocks) n += c;
  refcount_.assign(n, 0);
  state_.assign(n, static_cast<uint8_t>(State::Free));
  free_stack_.resize(n);
  lru_prev_.assign(n, -1);
  lru_next_.assign(n, -1);
  if (class_blocks.size() > 1) block_cls_.resize(n);
  uint32_t first = 0;
  for (size_t c = 0; c < class_blocks.size(); ++c) {
    Class k;
    k.first = first;
    k.count = k.free_top = class_blocks[c];
    // The class's first block on top of its stack: allocation order first,
    // first + 1, ... on a fresh pool.
    for (uint32_t i = 0; i < k.count; ++i) {
      free_stack_[first + i] = static_cast<int32_t>(first + k.count - 1 - i);
      if (!block_cls_.empty()) block_cls_[first + i] = static_cast<uint8_t>(c);
    }
    first += k.count;
    cls_.push_back(k);
  }
  num_free_ = static_cast<uint32_t>(n);
}

std::string BlockAllocator::check() const {
  const uint32_t n = num_blocks();
  std::vector<uint8_t> seen(n, 0);
  uint32_t free = 0, cached = 0;
  for (uint32_t c = 0; c < num_classes(); ++c) {
    const Class &k = cls_[c];
    auto in_class = [&](int32_t b) {
      return b >= static_cast<int32_t>(k.first) && b < static_cast<int32_t>(k.first + k.count);
    };
    for (uint32_t i = 0; i < k.free_top; ++i) {
      const int32_t b = free_stack_[k.first + i];
      if (b < 0 || static_cast<uint32_t>(b) >= n) return "free stack holds an invalid id";
      if (!in_class(b)) return "block " + std::to_string(b) + " in another class's free stack";
      if (seen[b]++) return "block " + std::to_string(b) + " twice in the free stack";
      if (state_[b] != static_cast<uint8_t>(State::Free) || refcount_[b] != 0)
        return "block " + std::to_string(b) + " in the free stack but not free";
    }
    free += k.free_top;
    uint32_t in_lru = 0;
    for (int32_t b = k.lru_head; b >= 0; b = lru_next_[b]) {
      if (!in_class(b)) return "block " + std::to_string(b) + " in another class's LRU";
      if (seen[b]++) return "block " + std::to_string(b) + " in two lists";
      if (state_[b] != static_cast<uint8_t>(State::Cached) || refcount_[b] != 0)
        return "block " + std::to_string(b) + " in the LRU but not cached";
      if (++in_lru > n) return "LRU list has a cycle";
    }
    if (in_lru != k.num_cached) return "a class's cached count disagrees with its LRU list";
    cached += in_lru;
  }
  if (free != num_free_) return "free count disagrees with the free stacks";
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
