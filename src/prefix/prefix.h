// Prefix cache: keys of full blocks (docs/prefix-cache.md) and the index from
// keys to the pool blocks (one per layer) that hold them.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common/block_key.h"

namespace kvc::prefix {

enum class PrefixHash : int32_t { Sha256 = 0, Xxh3_128 = 1 };

struct PrefixExtra {
  const uint8_t *data;
  uint64_t size;
};

// Limits of declared extra-key names (kvc_prefix_config::extra_key_names).
constexpr uint32_t kMaxExtraKeyNames = 64;
constexpr uint32_t kMaxExtraKeyNameBytes = 64;

// The extra keys of one call as they enter block keys (docs/prefix-cache.md):
// `enc` is "KVCX" | u32 n | n x (u64 size | bytes) for the positional
// (legacy) form, or "KVCN" | u32 n | n x (u64 len | name | u64 size | bytes)
// for named values (the non-empty ones, sorted by name). A block key hashes
// the tag ("KVCB" positional, "KVCN" named) and then enc without its first 4
// bytes; the index and tier records keep enc whole (verified on hits).
struct ExtraKeys {
  bool named = false;
  std::vector<uint8_t> enc;
};

// Hashing by the spec. key_size() bytes of a key are significant.
class PrefixHasher {
 public:
  explicit PrefixHasher(PrefixHash h) : h_(h) {}
  PrefixHash kind() const { return h_; }
  uint32_t key_size() const { return h_ == PrefixHash::Sha256 ? 32u : 16u; }
  BlockKey digest(const std::vector<uint8_t> &bytes) const {
    return digest(bytes.data(), bytes.size());
  }
  BlockKey digest(const uint8_t *bytes, size_t n) const;
  // Root: "KVCP", version 1, hash id, seed, fingerprint, model id, tokenizer id.
  BlockKey root(const uint8_t seed[32], const std::vector<uint8_t> &fingerprint,
                const std::string &model_id, const std::string &tokenizer_id) const;
  // Block: "KVCB" (or "KVCN" for named extra keys), parent key, token count
  // and ids, extra keys.
  BlockKey block(const BlockKey &parent, const int32_t *tokens, uint32_t n, const ExtraKeys &extras,
                 std::vector<uint8_t> &scratch) const;
  // The keys of m consecutive blocks of n tokens each (tokens[i * n ..]),
  // the first one's parent given: out[i] = block(out[i - 1], ...), the same
  // keys; for XXH3 keys block()'s input is built once and only its parent
  // and tokens rewritten per block (a prompt's lookup is a chain of these
  // hashes).
  void chain(const BlockKey &parent, const int32_t *tokens, uint32_t n, uint64_t m,
             const ExtraKeys &extras, BlockKey *out, std::vector<uint8_t> &scratch) const;

 private:
  PrefixHash h_;
};

// Test hook: every digest is the same constant (to test collision handling).
void prefix_hash_force_constant(bool on);

// What a lookup reads of an entry comes first (entries start on a cache
// line): the tree walk's children and what verification checks in the first
// line, the key (the index's confirmation) and the extra keys in the second;
// a lookup touches them for every block of a prompt.
struct alignas(64) PrefixEntry {
  int64_t parent_entry = -1;       // the parent's entry (-1: the root); verified on hits
  uint64_t depth = 0;              // 1 for the first block of a prompt
  std::vector<uint32_t> children;  // the entries whose parent this is
  std::vector<int32_t> tokens;     // block_size token ids
  BlockKey key;
  std::vector<uint8_t> extras_bytes;  // the extra keys as encoded (verified with verify_tokens)
  BlockKey parent;
  BlockKey extras;              // digest of the extra keys (partial matches stay within them)
  std::vector<int32_t> blocks;  // one per layer
  bool live = false;
};

struct PrefixStatsCore {
  mutable std::atomic<uint64_t> queried_tokens{0}, hit_tokens{0}, partial_tokens{0};
  uint64_t inserted = 0, removed = 0, reclaimed = 0;
};

// Open-addressing map from keys to entry ids: linear probing over slots of
// (the key's first 8 bytes, entry id); a tag match is confirmed against the
// entry's full key. Deletion shifts the following run back (no tombstones).
class KeyIndex {
 public:
  explicit KeyIndex(const std::vector<PrefixEntry> *entries) : entries_(entries) {
    slots_.assign(16, Slot{});
  }
  size_t size() const { return size_; }
  int64_t find(const BlockKey &k) const {
    const uint64_t tag = tag_of(k);
    for (size_t i = tag & mask(); slots_[i].entry >= 0; i = (i + 1) & mask())
      if (slots_[i].tag == tag && (*entries_)[static_cast<size_t>(slots_[i].entry)].key == k)
        return slots_[i].entry;
    return -1;
  }
  // Starts loading the slot where find(k) begins (a lookup computes a few
  // keys ahead and prefetches their slots while it hashes the next ones).
  void prefetch(const BlockKey &k) const { __builtin_prefetch(&slots_[tag_of(k) & mask()]); }
  void insert(const BlockKey &k, uint32_t e) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    place(tag_of(k), static_cast<int64_t>(e));
    ++size_;
  }
  void erase(const BlockKey &k) {
    const uint64_t tag = tag_of(k);
    size_t i = tag & mask();
    for (; slots_[i].entry >= 0; i = (i + 1) & mask())
      if (slots_[i].tag == tag && (*entries_)[static_cast<size_t>(slots_[i].entry)].key == k) break;
    if (slots_[i].entry < 0) return;
    // Backward-shift deletion.
    for (size_t j = (i + 1) & mask(); slots_[j].entry >= 0; j = (j + 1) & mask()) {
      const size_t home = slots_[j].tag & mask();
      const bool movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
      if (movable) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
    --size_;
  }

 private:
  struct Slot {
    uint64_t tag = 0;
    int64_t entry = -1;
  };
  static uint64_t tag_of(const BlockKey &k) {
    uint64_t v;
    __builtin_memcpy(&v, k.b.data(), 8);
    return v;
  }
  size_t mask() const { return slots_.size() - 1; }
  void place(uint64_t tag, int64_t e) {
    size_t i = tag & mask();
    while (slots_[i].entry >= 0) i = (i + 1) & mask();
    slots_[i] = Slot{tag, e};
  }
  void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.size() * 2, Slot{});
    for (const Slot &s : old)
      if (s.entry >= 0) place(s.tag, s.entry);
  }
  const std::vector<PrefixEntry> *entries_;
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

// The pool's prefix index (guarded by the pool lock; counters are atomic).
struct PrefixState {
  explicit PrefixState(PrefixHash h) : hasher(h), map(&entries) {}
  PrefixHasher hasher;
  bool verify_tokens = true;
  std::vector<std::string>
      extra_names;  // declared extra-key names, in declaration order (empty: positional)
  std::vector<uint32_t> names_sorted;  // their indices, sorted by name bytes
  // The extra keys of a call in their key form; refuses a count other than
  // the declared names' (InvalidArgument).
  ExtraKeys extra_keys(const PrefixExtra *ex, uint32_t nx) const;
  BlockKey root;
  std::vector<PrefixEntry> entries;
  KeyIndex map;
  std::vector<uint32_t> free_entries;
  std::vector<uint32_t> root_children;
  std::vector<int32_t> block_entry;  // per pool block: its entry, or -1
  PrefixStatsCore stats;
  void (*callback)(void *, int, const uint8_t *, const uint8_t *, uint32_t, uint64_t) = nullptr;
  void *user = nullptr;
};

// Checks declared extra-key names (non-empty, at most kMaxExtraKeyNameBytes
// bytes, unique, at most kMaxExtraKeyNames of them); throws InvalidArgument.
void check_extra_key_names(const std::vector<std::string> &names);

// The digest of a call's extra keys (partial matches stay within them).
BlockKey prefix_extras_digest(const PrefixHasher &h, const ExtraKeys &kx);
// With verify_tokens, whether entry `en` is the block itself, not just its
// key: the same tokens, extra keys (xb: their encoding), parent and depth.
bool verified(const PrefixState &ps, const PrefixEntry &en, const int32_t *tokens,
              const std::vector<uint8_t> &xb, int64_t parent_entry, uint64_t depth);

// A prompt's chain walked through the index: the whole blocks found (path)
// among the first n - 1 tokens, and with `partial` the cached child block
// whose start matches the most following tokens (same extra keys).
struct Walk {
  std::vector<uint32_t> path;
  uint64_t partial_tokens = 0;
  int64_t partial_entry = -1;
};
Walk walk(const PrefixState &ps, uint64_t bs, const int32_t *tokens, uint64_t n,
          const ExtraKeys &kx, bool partial);

// The entries of the whole cached blocks among the first n - 1 tokens.
std::vector<uint32_t> prefix_walk_path(const PrefixState &ps, uint64_t bs, const int32_t *tokens,
                                       uint64_t n, const ExtraKeys &kx);

}  // namespace kvc::prefix
