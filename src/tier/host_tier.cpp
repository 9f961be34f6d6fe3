// The host-memory tier: payloads in a hash map, least recently used first out
// when the byte capacity is reached.
#include <cstring>
#include <iterator>
#include <memory>
#include <utility>

#include "tier/tier.h"

namespace kvc::tier {

namespace {

class HostTier final : public Tier {
 public:
  explicit HostTier(uint64_t cap) : cap_(cap) {}
  const char *name() const override { return "host"; }

  bool put(const BlockKey &key, const std::vector<uint8_t> &fp, const uint8_t *payload,
           size_t n) override {
    std::unique_lock lk(mu_);
    if (n > cap_ || fp.size() > cap_ - n) {  // compared without wrapping
      ++st_.errors;
      err_ = "a block of " + std::to_string(n) + " + " + std::to_string(fp.size()) +
             " bytes is larger than the tier (" + std::to_string(cap_) + ")";
      return false;
    }
    const uint64_t need = n + fp.size();
    auto old = map_.find(key);
    const uint32_t pins = old == map_.end() ? 0 : old->second.pins;
    const uint64_t pinned_other =
        pinned_bytes_ - (pins ? old->second.n + old->second.fp.size() : 0);
    if (need > cap_ - pinned_other) {  // checked first: a refused put changes nothing
      ++st_.errors;
      err_ = "no room for a block of " + std::to_string(need) +
             " bytes: " + std::to_string(pinned_other) + " of the tier's " + std::to_string(cap_) +
             " bytes are pinned";
      return false;
    }
    Entry e;
    try {  // copy first: a failed allocation changes nothing
      e.fp = fp;
      e.data = take_buffer(n);
      e.n = n;
      if (n) std::memcpy(e.data.get(), payload, n);
    } catch (const std::bad_alloc &) {
      ++st_.errors;
      err_ = "out of host memory";
      return false;
    }
    drop(key);
    while (st_.bytes + need > cap_) {  // cannot run out: unpinned bytes suffice
      auto victim = std::prev(lru_.end());
      while (map_.at(*victim).pins) --victim;
      drop(*victim);
      ++st_.evictions;
    }
    lru_.push_front(key);
    e.pos = lru_.begin();
    e.pins = pins;  // a rewrite keeps its pins
    map_.emplace(key, std::move(e));
    st_.bytes += need;
    if (pins) pinned_bytes_ += need;
    ++st_.entries;
    ++st_.puts;
    return true;
  }

  bool get(const BlockKey &key, const std::vector<uint8_t> &fp,
           std::vector<uint8_t> &out) override {
    std::unique_lock lk(mu_);
    auto it = map_.find(key);
    if (it == map_.end() || it->second.fp != fp) {
      ++st_.misses;
      return false;
    }
    out.assign(it->second.data.get(), it->second.data.get() + it->second.n);
    lru_.splice(lru_.begin(), lru_, it->second.pos);  // most recently used
    ++st_.hits;
    return true;
  }

  bool contains(const BlockKey &key) override {
    std::unique_lock lk(mu_);
    return map_.count(key) != 0;
  }
  bool erase(const BlockKey &key) override {
    std::unique_lock lk(mu_);
    return drop(key);
  }
  bool pin(const BlockKey &key) override {
    std::unique_lock lk(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    if (it->second.pins++ == 0) pinned_bytes_ += it->second.n + it->second.fp.size();
    return true;
  }
  uint32_t pins(const BlockKey &key) const override {
    std::unique_lock lk(mu_);
    auto it = map_.find(key);
    return it == map_.end() ? 0 : it->second.pins;
  }
  bool unpin(const BlockKey &key) override {
    std::unique_lock lk(mu_);
    auto it = map_.find(key);
    if (it == map_.end() || it->second.pins == 0) return false;
    if (--it->second.pins == 0) pinned_bytes_ -= it->second.n + it->second.fp.size();
    return true;
  }
  Stats stats() const override {
    std::unique_lock lk(mu_);
    return st_;
  }
  std::string last_error() const override {
    std::unique_lock lk(mu_);
    return err_;
  }

 private:
  struct Entry {
    std::vector<uint8_t> fp;
    std::unique_ptr<uint8_t[]> data;  // n bytes (not value-initialized: written once by put)
    size_t n = 0;
    std::list<BlockKey>::iterator pos;
    uint32_t pins = 0;
  };
  // A buffer of n bytes: a recycled one of that size (blocks of one pool all
  // have one size, so replacement reuses the buffers it frees), else a new
  // one. Fresh allocations of large blocks would be returned to the system
  // and faulted in again on every put.
  std::unique_ptr<uint8_t[]> take_buffer(size_t n) {
    for (size_t i = 0; i < spare_.size(); ++i)
      if (spare_[i].second == n) {
        std::unique_ptr<uint8_t[]> b = std::move(spare_[i].first);
        spare_.erase(spare_.begin() + static_cast<std::ptrdiff_t>(i));
        return b;
      }
    return std::unique_ptr<uint8_t[]>(new uint8_t[n ? n : 1]);
  }
  bool drop(const BlockKey &key) {
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    st_.bytes -= it->second.n + it->second.fp.size();
    if (it->second.pins) pinned_bytes_ -= it->second.n + it->second.fp.size();
    // Kept for reuse only while small: a removed large value gives its memory back.
    if (spare_.size() < kSpares && it->second.n <= kSpareMax) {
      try {
        spare_.emplace_back(std::move(it->second.data), it->second.n);
      } catch (const std::bad_alloc &) {  // not kept: freed with the entry
      }
    }
    --st_.entries;
    lru_.erase(it->second.pos);
    map_.erase(it);
    return true;
  }

  const uint64_t cap_;
  mutable std::mutex mu_;
  std::unordered_map<BlockKey, Entry, BlockKeyHash> map_;
  std::list<BlockKey> lru_;  // front: most recently used
  Stats st_;
  uint64_t pinned_bytes_ = 0;  // bytes of entries with pins > 0
  static constexpr size_t kSpares = 4;
  static constexpr size_t kSpareMax = 4u << 20;  // the largest buffer kept for reuse
  std::vector<std::pair<std::unique_ptr<uint8_t[]>, size_t>> spare_;  // freed buffers for reuse
  std::string err_;
};

}  // namespace

std::unique_ptr<Tier> make_host_tier(uint64_t capacity_bytes) {
  return std::make_unique<HostTier>(capacity_bytes);
}

}  // namespace kvc::tier
