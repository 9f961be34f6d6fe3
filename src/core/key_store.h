// A store (kvc_store, docs/engines.md): one offload tier opened by itself and
// addressed by an engine's own keys (byte strings) under a scope. The tier key
// is XXH3-128 of (scope, key); the record's fingerprint is the scope and key
// themselves, so a read never returns another key's value even on a digest
// collision, and the tier's checksum refuses damaged records.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/types.h"
#include "tier/factory.h"
#include "tier/tier.h"

namespace kvc::core {

class KeyStore {
 public:
  static constexpr size_t kKeyMax = 4096;  // KVC_STORE_KEY_MAX

  // Checks the spec and the scope (throws Error: InvalidArgument, Unsupported,
  // Io) and opens the tier.
  KeyStore(const tier::Spec &spec, const void *scope, size_t scope_bytes);

  // Throws Error(ExceedsCapacity) when the record cannot fit the tier at all,
  // Error(Io) with the tier's reason when the tier refused it (nothing changed).
  void put(const void *key, size_t key_bytes, const void *value, size_t n);
  // A hit copies the value into `out` (resized); false on a miss.
  bool get(const void *key, size_t key_bytes, std::vector<uint8_t> &out);
  // found[i] for keys[i]; every key's length is checked before the tier is asked.
  void contains(const void *const *keys, const size_t *key_bytes, size_t n, uint8_t *found);
  bool remove(const void *key, size_t key_bytes);
  // Throws Error(Unsupported) for a Redis store.
  bool pin(const void *key, size_t key_bytes, bool pin);

  // The tier's counters: demotions = values stored, promotions = hits, drops 0.
  TierCounts counts() const;

  // Throws Error(InvalidArgument) unless 1 <= key_bytes <= kKeyMax (NullPointer for a NULL key).
  static void check_key(const void *key, size_t key_bytes, const char *name);

 private:
  // The tier key: XXH3-128 of the record's fingerprint (below).
  static BlockKey key_of(const std::vector<uint8_t> &fp);
  BlockKey key_of(const void *key, size_t key_bytes) const;
  // The record's fingerprint: a tag, the scope's length, the scope, the key.
  const std::vector<uint8_t> &fingerprint(const void *key, size_t key_bytes) const;

  tier::Spec spec_;
  std::string scope_;
  std::unique_ptr<tier::Tier> tier_;
  // Keys this store pinned; counts() asks the tier which still hold pins (the
  // tier may have dropped a damaged record, another process removed a file).
  mutable std::mutex pin_mu_;
  mutable std::unordered_set<BlockKey, BlockKeyHash> pinned_;
};

}  // namespace kvc::core
