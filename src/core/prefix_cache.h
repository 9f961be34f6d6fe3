// The prefix cache of a pool (docs/prefix-cache.md): registering the full
// blocks of a sequence under chained keys, looking prompts up, attaching
// cached blocks to a new sequence, LRU reclaim that keeps chains whole, the
// events an external router can follow, and the offload tiers below it
// (core/offload.h, docs/tiers.md). The keys and the index itself are the
// prefix module's (prefix/prefix.h); this class ties them to the pool's
// blocks and sequences, and the pool reaches it only through BlockEvents.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/pool_int.h"
#include "core/types.h"
#include "prefix/prefix.h"

namespace kvc::core {

class Offload;

class PrefixCache final : private BlockEvents {
 public:
  explicit PrefixCache(PoolCore &c);
  ~PrefixCache() override;
  PrefixCache(const PrefixCache &) = delete;
  PrefixCache &operator=(const PrefixCache &) = delete;

  // Turns the cache on (once; refused for pools with a residual arena).
  void enable(const PrefixConfig &c);
  bool enabled() const { return st_ != nullptr; }
  uint32_t key_size() const;
  // A call's extra keys in their key form, checked against the declared
  // names (docs/prefix-cache.md); the calls below take it.
  ExtraKeys extra_keys(const PrefixExtra *ex, uint32_t nx) const;
  PrefixResult lookup(const int32_t *tokens, uint64_t n, const ExtraKeys &kx, bool partial) const;
  PrefixResult attach(uint64_t id, const int32_t *tokens, uint64_t n, const ExtraKeys &kx,
                      bool partial);
  uint64_t insert(uint64_t id, const int32_t *tokens, uint64_t n, const ExtraKeys &kx);
  // Chain keys of the full blocks of tokens[0, n): [n / block_size][key_size] bytes.
  void keys(const int32_t *tokens, uint64_t n, const ExtraKeys &kx, uint8_t *out) const;
  PrefixCounts counts() const;
  void set_callback(PrefixEventFn fn, void *user, const std::function<void()> &under_lock);
  // White-box: the keys in the index (key_size bytes each, as strings).
  std::vector<std::string> registered_keys() const;

  // The offload tiers (they need the cache enabled).
  Offload &tiers() { return *offload_; }

  // ---- for the offload tiers and the checks (exclusive pool lock held) ----
  // Registers blocks[num_layers] under key k (tokens of one block) as a
  // child of parent_entry (-1: the root); returns the entry.
  uint32_t register_entry(const BlockKey &k, const BlockKey &parent, int64_t parent_entry,
                          uint64_t depth, const int32_t *tokens, const BlockKey &xd,
                          const std::vector<uint8_t> &xb, const int32_t *blocks);
  // The index (null while disabled); the offload tiers read it under the pool lock.
  PrefixState *state() const { return st_.get(); }
  // "" or the first violation of the index's invariants (shared lock held).
  std::string check() const;

 private:
  // BlockEvents: the pool's hooks on block life (exclusive pool lock held).
  bool registered(int32_t b) const override { return st_ && st_->block_entry[b] >= 0; }
  void before_write(int32_t b) override;
  void reclaimed(int32_t b) override;
  void cached(int32_t b) override;
  // Drops entry e and, recursively, its children; `taken`: a block the
  // allocator already handed out (not to uncache).
  void drop_entry(uint32_t e, int32_t taken);
  void need_enabled() const;

  PoolCore &c_;
  std::unique_ptr<PrefixState> st_;
  std::unique_ptr<Offload> offload_;
};

}  // namespace kvc::core
