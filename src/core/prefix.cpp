#include "core/prefix.h"

#include <openssl/sha.h>
#include <xxhash.h>

#include <cstring>

namespace kvc::core {

namespace {
std::atomic<bool> g_constant{false};

void put_u32(std::vector<uint8_t> &b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(std::vector<uint8_t> &b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_bytes(std::vector<uint8_t> &b, const void *p, size_t n) {
  const uint8_t *c = static_cast<const uint8_t *>(p);
  b.insert(b.end(), c, c + n);
}
}  // namespace

void prefix_hash_force_constant(bool on) { g_constant.store(on); }

PrefixKey PrefixHasher::digest(const std::vector<uint8_t> &bytes) const {
  PrefixKey k;
  if (g_constant.load(std::memory_order_relaxed)) {
    k.b.fill(0x42);
    if (h_ == PrefixHash::Xxh3_128) std::fill(k.b.begin() + 16, k.b.end(), 0);
    return k;
  }
  if (h_ == PrefixHash::Sha256) {
    SHA256(bytes.data(), bytes.size(), k.b.data());
  } else {
    const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);  // big-endian: the same bytes on every host
    std::memcpy(k.b.data(), c.digest, 16);
  }
  return k;
}

PrefixKey PrefixHasher::root(const uint8_t seed[32], const std::vector<uint8_t> &fingerprint,
                             const std::string &model_id, const std::string &tokenizer_id) const {
  std::vector<uint8_t> b;
  put_bytes(b, "KVCP", 4);
  put_u32(b, 1);
  put_u32(b, static_cast<uint32_t>(h_));
  put_bytes(b, seed, 32);
  put_u64(b, fingerprint.size());
  put_bytes(b, fingerprint.data(), fingerprint.size());
  put_u64(b, model_id.size());
  put_bytes(b, model_id.data(), model_id.size());
  put_u64(b, tokenizer_id.size());
  put_bytes(b, tokenizer_id.data(), tokenizer_id.size());
  return digest(b);
}

PrefixKey PrefixHasher::block(const PrefixKey &parent, const int32_t *tokens, uint32_t n,
                              const PrefixExtra *extras, uint32_t n_extras, std::vector<uint8_t> &b) const {
  b.clear();
  put_bytes(b, "KVCB", 4);
  put_bytes(b, parent.b.data(), key_size());
  put_u32(b, n);
  for (uint32_t i = 0; i < n; ++i) put_u32(b, static_cast<uint32_t>(tokens[i]));
  put_u32(b, n_extras);
  for (uint32_t i = 0; i < n_extras; ++i) {
    put_u64(b, extras[i].size);
    put_bytes(b, extras[i].data, extras[i].size);
  }
  return digest(b);
}

}  // namespace kvc::core
