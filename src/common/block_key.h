// The key of one full block of a prompt: the prefix cache's chain key
// (docs/prefix-cache.md), under which the prefix index finds the block and
// the offload tiers store its bytes. One type for both.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvc {

struct BlockKey {
  std::array<uint8_t, 32> b{};  // SHA-256: 32 bytes; XXH3-128: 16 bytes, the rest 0
  // Four 8-byte words compared without a call (this runs once per block of
  // every prefix lookup).
  bool operator==(const BlockKey &o) const {
    uint64_t x = 0;
    for (size_t i = 0; i < 32; i += 8) {
      uint64_t u, v;
      __builtin_memcpy(&u, b.data() + i, 8);
      __builtin_memcpy(&v, o.b.data() + i, 8);
      x |= u ^ v;
    }
    return x == 0;
  }
  // The 32 bytes as 64 lowercase hex digits (disk file names, Redis keys).
  std::string hex() const {
    static const char d[] = "0123456789abcdef";
    std::string s(64, '0');
    for (size_t i = 0; i < 32; ++i) s[2 * i] = d[b[i] >> 4], s[2 * i + 1] = d[b[i] & 15];
    return s;
  }
};

// Hash for unordered containers: keys are digests, so any 8 bytes are uniform.
struct BlockKeyHash {
  size_t operator()(const BlockKey &k) const noexcept {
    size_t h;
    __builtin_memcpy(&h, k.b.data(), sizeof h);
    return h;
  }
};

}  // namespace kvc
