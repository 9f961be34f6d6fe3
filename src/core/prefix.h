// Prefix cache: keys of full blocks (docs/prefix-cache.md) and the index from
// keys to the pool blocks (one per layer) that hold them.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvc::core {

enum class PrefixHash : int32_t { Sha256 = 0, Xxh3_128 = 1 };

struct PrefixKey {
  std::array<uint8_t, 32> b{};  // SHA-256: 32 bytes; XXH3-128: 16 bytes, the rest 0
  bool operator==(const PrefixKey &o) const { return b == o.b; }
};
struct PrefixKeyHash {
  size_t operator()(const PrefixKey &k) const {
    uint64_t v;
    __builtin_memcpy(&v, k.b.data(), 8);
    return static_cast<size_t>(v);
  }
};

struct PrefixExtra {
  const uint8_t *data;
  uint64_t size;
};

// Hashing by the spec. key_size() bytes of a key are significant.
class PrefixHasher {
 public:
  explicit PrefixHasher(PrefixHash h) : h_(h) {}
  PrefixHash kind() const { return h_; }
  uint32_t key_size() const { return h_ == PrefixHash::Sha256 ? 32u : 16u; }
  PrefixKey digest(const std::vector<uint8_t> &bytes) const;
  // Root: "KVCP", version 1, hash id, seed, fingerprint, model id, tokenizer id.
  PrefixKey root(const uint8_t seed[32], const std::vector<uint8_t> &fingerprint, const std::string &model_id,
                 const std::string &tokenizer_id) const;
  // Block: "KVCB", parent key, token count and ids, extra keys.
  PrefixKey block(const PrefixKey &parent, const int32_t *tokens, uint32_t n, const PrefixExtra *extras,
                  uint32_t n_extras, std::vector<uint8_t> &scratch) const;

 private:
  PrefixHash h_;
};

// Test hook: every digest is the same constant (to test collision handling).
void prefix_hash_force_constant(bool on);

struct PrefixEntry {
  PrefixKey key, parent;
  PrefixKey extras;             // digest of the extra keys (partial matches stay within them)
  uint64_t depth = 0;           // 1 for the first block of a prompt
  std::vector<int32_t> blocks;  // one per layer
  std::vector<int32_t> tokens;  // block_size token ids
  std::vector<uint32_t> children;
  bool live = false;
};

struct PrefixStatsCore {
  mutable std::atomic<uint64_t> queried_tokens{0}, hit_tokens{0}, partial_tokens{0};
  uint64_t inserted = 0, removed = 0, reclaimed = 0;
};

// The pool's prefix index (guarded by the pool lock; counters are atomic).
struct PrefixState {
  explicit PrefixState(PrefixHash h) : hasher(h) {}
  PrefixHasher hasher;
  bool verify_tokens = true;
  PrefixKey root;
  std::unordered_map<PrefixKey, uint32_t, PrefixKeyHash> map;
  std::vector<PrefixEntry> entries;
  std::vector<uint32_t> free_entries;
  std::vector<uint32_t> root_children;
  std::vector<int32_t> block_entry;  // per pool block: its entry, or -1
  PrefixStatsCore stats;
  void (*callback)(void *, int, const uint8_t *, const uint8_t *, uint32_t, uint64_t) = nullptr;
  void *user = nullptr;
};

}  // namespace kvc::core
