#include "prefix/prefix.h"

#define OPENSSL_SUPPRESS_DEPRECATED 1
#include <openssl/sha.h>
// xxHash compiled into this file (its header-only mode): a block key's hash
// is one short call per block of every lookup, which the library's call
// through the PLT would not inline.
#define XXH_INLINE_ALL 1
#include <xxhash.h>

#include <cstring>
#include <stdexcept>

#include "common/le.h"

namespace kvc::prefix {

namespace {
std::atomic<bool> g_constant{false};

void put_bytes(std::vector<uint8_t> &b, const void *p, size_t n) {
  const uint8_t *c = static_cast<const uint8_t *>(p);
  b.insert(b.end(), c, c + n);
}
}  // namespace

void prefix_hash_force_constant(bool on) {
  g_constant.store(on);
}

namespace {
// SHA-256 through OpenSSL's low-level interface: the EVP one-shot looks the
// algorithm up on every call, which costs more than hashing a block of
// tokens. (Deprecated in OpenSSL 3 in favour of EVP, still supported.)
bool sha256(const uint8_t *data, size_t n, uint8_t out[32]) {
  SHA256_CTX c;
  return SHA256_Init(&c) == 1 && SHA256_Update(&c, data, n) == 1 && SHA256_Final(out, &c) == 1;
}
}  // namespace

BlockKey PrefixHasher::digest(const uint8_t *bytes, size_t n) const {
  BlockKey k;
  if (g_constant.load(std::memory_order_relaxed)) {
    k.b.fill(0x42);
    if (h_ == PrefixHash::Xxh3_128) std::fill(k.b.begin() + 16, k.b.end(), 0);
    return k;
  }
  if (h_ == PrefixHash::Sha256) {
    if (!sha256(bytes, n, k.b.data())) throw std::runtime_error("OpenSSL SHA-256 failed");
  } else {
    const XXH128_hash_t h = XXH3_128bits(bytes, n);
    // XXH128's canonical form: high then low half, big-endian (the same
    // bytes on every host).
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    std::memcpy(k.b.data(), c.digest, 16);
  }
  return k;
}

BlockKey PrefixHasher::root(const uint8_t seed[32], const std::vector<uint8_t> &fingerprint,
                            const std::string &model_id, const std::string &tokenizer_id) const {
  std::vector<uint8_t> b;
  put_bytes(b, "KVCP", 4);
  append_le32(b, 1);
  append_le32(b, static_cast<uint32_t>(h_));
  put_bytes(b, seed, 32);
  append_le64(b, fingerprint.size());
  put_bytes(b, fingerprint.data(), fingerprint.size());
  append_le64(b, model_id.size());
  put_bytes(b, model_id.data(), model_id.size());
  append_le64(b, tokenizer_id.size());
  put_bytes(b, tokenizer_id.data(), tokenizer_id.size());
  return digest(b);
}

BlockKey PrefixHasher::block(const BlockKey &parent, const int32_t *tokens, uint32_t n,
                             const ExtraKeys &extras, std::vector<uint8_t> &b) const {
  // Sized once, then filled in place (this runs once per block of every lookup).
  // The extra keys' encoding without its own 4-byte tag follows the tokens.
  const uint64_t xs = extras.enc.size() - 4;
  const uint64_t size = 4 + key_size() + 4 + 4ull * n + xs;
  // Small inputs (every block of a plain prompt) are built on the stack.
  uint8_t local[512];
  if (size > sizeof local) b.resize(size);
  uint8_t *const start = size > sizeof local ? b.data() : local;
  uint8_t *p = start;
  std::memcpy(p, extras.named ? "KVCN" : "KVCB", 4);
  p += 4;
  std::memcpy(p, parent.b.data(), key_size());
  p += key_size();
  auto u32 = [&](uint32_t v) {
    p[0] = static_cast<uint8_t>(v);
    p[1] = static_cast<uint8_t>(v >> 8);
    p[2] = static_cast<uint8_t>(v >> 16);
    p[3] = static_cast<uint8_t>(v >> 24);
    p += 4;
  };
  u32(n);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  std::memcpy(p, tokens, 4ull * n);  // already little-endian u32
  p += 4ull * n;
#else
  for (uint32_t i = 0; i < n; ++i) u32(static_cast<uint32_t>(tokens[i]));
#endif
  std::memcpy(p, extras.enc.data() + 4, xs);
  return digest(start, size);
}

}  // namespace kvc::prefix
