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

void PrefixHasher::chain(const BlockKey &parent, const int32_t *tokens, uint32_t n, uint64_t m,
                         const ExtraKeys &extras, BlockKey *out,
                         std::vector<uint8_t> &scratch) const {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  if (h_ == PrefixHash::Xxh3_128 && m > 0 && !g_constant.load(std::memory_order_relaxed)) {
    // block()'s input, laid out once in two buffers: "KVCB" / "KVCN" |
    // parent | n | tokens | extras. Block i + 1's tokens go into the other
    // buffer while block i hashes (off the chain), and each digest is
    // written as the three 8-byte words at offsets 0, 8 and 16 that hold it
    // (with the tag and n): the hash's own 8-byte loads there then take
    // them straight from the store buffer (a load spanning two stores
    // would wait for both to reach the cache, on every block of the chain).
    const uint64_t xs = extras.enc.size() - 4;
    const uint64_t size = 4 + 16 + 4 + 4ull * n + xs;
    uint8_t local[2][256];
    if (size > sizeof local[0]) scratch.resize(2 * size);
    uint8_t *const buf[2] = {size > sizeof local[0] ? scratch.data() : local[0],
                             size > sizeof local[0] ? scratch.data() + size : local[1]};
    uint32_t tag;
    std::memcpy(&tag, extras.named ? "KVCN" : "KVCB", 4);
    for (uint8_t *b : buf) {
      std::memcpy(b, &tag, 4);
      put_le32(b + 20, n);
      std::memcpy(b + 24 + 4ull * n, extras.enc.data() + 4, xs);
    }
    std::memcpy(buf[0] + 4, parent.b.data(), 16);
    std::memcpy(buf[0] + 24, tokens, 4ull * n);  // already little-endian u32
    for (uint64_t i = 0; i < m; ++i) {
      uint8_t *const b = buf[i & 1];
      if (i + 1 < m) std::memcpy(buf[(i + 1) & 1] + 24, tokens + (i + 1) * n, 4ull * n);
      const XXH128_hash_t h = XXH3_128bits(b, size);
      // The canonical digest: the high then the low half, big-endian.
      const uint64_t hi = __builtin_bswap64(h.high64), lo = __builtin_bswap64(h.low64);
      BlockKey &k = out[i];
      std::memcpy(k.b.data(), &hi, 8);
      std::memcpy(k.b.data() + 8, &lo, 8);
      std::memset(k.b.data() + 16, 0, 16);
      uint8_t *const nb = buf[(i + 1) & 1];
      const uint64_t w0 = tag | hi << 32, w1 = hi >> 32 | lo << 32,
                     w2 = lo >> 32 | uint64_t{n} << 32;
      std::memcpy(nb, &w0, 8);
      std::memcpy(nb + 8, &w1, 8);
      std::memcpy(nb + 16, &w2, 8);
    }
    return;
  }
#endif
  BlockKey prev = parent;
  for (uint64_t i = 0; i < m; ++i) prev = out[i] = block(prev, tokens + i * n, n, extras, scratch);
}

}  // namespace kvc::prefix
