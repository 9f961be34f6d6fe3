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

namespace {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
uint64_t le64(const uint8_t *p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
uint64_t fold(uint64_t a, uint64_t b) {  // XXH3's 64 x 64 -> 128-bit multiply, folded
  const unsigned __int128 r = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
}
uint64_t avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  return h ^ (h >> 32);
}

// XXH3-128 (seed 0, the default secret) of chained block inputs of 72 to
// 128 bytes, the algorithm's 17-128-byte path regrouped: every term that
// reads only bytes from 24 on (tokens, extra keys) is computed apart from
// the three words at offsets 0, 8 and 16 that hold the parent key (with the
// tag and n), which enter as registers, so a block waits on its parent only
// for two folded multiplies and the final mixing (not the whole hash and a
// round trip through memory). The same digests as XXH3_128bits (tested
// against block() in prefix_chain_equals_block).
void chain_xxh3_72to128(uint8_t *const buf[2], uint64_t size, uint32_t tag, uint32_t n,
                        const BlockKey &parent, const int32_t *tokens, uint64_t m, BlockKey *out) {
  const uint8_t *const sec = XXH3_kSecret;
  uint64_t w0 = le64(buf[0]), w1 = le64(buf[0] + 8), w2 = le64(buf[0] + 16);
  (void)parent;
  for (uint64_t i = 0; i < m; ++i) {
    const uint8_t *const in = buf[i & 1];
    if (i + 1 < m) std::memcpy(buf[(i + 1) & 1] + 24, tokens + (i + 1) * n, 4ull * n);
    // The terms of bytes 24 on, in the algorithm's order of accumulation.
    uint64_t lo = size * XXH_PRIME64_1, hi = 0;
    if (size > 96) {
      lo += fold(le64(in + 48) ^ le64(sec + 96), le64(in + 56) ^ le64(sec + 104));
      lo ^= le64(in + size - 64) + le64(in + size - 56);
      hi += fold(le64(in + size - 64) ^ le64(sec + 112), le64(in + size - 56) ^ le64(sec + 120));
      hi ^= le64(in + 48) + le64(in + 56);
    }
    lo += fold(le64(in + 32) ^ le64(sec + 64), le64(in + 40) ^ le64(sec + 72));
    lo ^= le64(in + size - 48) + le64(in + size - 40);
    hi += fold(le64(in + size - 48) ^ le64(sec + 80), le64(in + size - 40) ^ le64(sec + 88));
    hi ^= le64(in + 32) + le64(in + 40);
    const uint64_t w3 = le64(in + 24);
    const uint64_t a2 = le64(in + size - 32) + le64(in + size - 24);
    const uint64_t m2 =
        fold(le64(in + size - 32) ^ le64(sec + 48), le64(in + size - 24) ^ le64(sec + 56));
    const uint64_t a3 = le64(in + size - 16) + le64(in + size - 8);
    const uint64_t m3 =
        fold(le64(in + size - 16) ^ le64(sec + 16), le64(in + size - 8) ^ le64(sec + 24));
    // The parent's words: the mixes of bytes [16, 32) and [0, 16).
    lo += fold(w2 ^ le64(sec + 32), w3 ^ le64(sec + 40));
    lo ^= a2;
    hi += m2;
    hi ^= w2 + w3;
    lo += fold(w0 ^ le64(sec + 0), w1 ^ le64(sec + 8));
    lo ^= a3;
    hi += m3;
    hi ^= w0 + w1;
    const uint64_t h_lo = avalanche(lo + hi);
    const uint64_t h_hi =
        0 - avalanche(lo * XXH_PRIME64_1 + hi * XXH_PRIME64_4 + size * XXH_PRIME64_2);
    // The canonical digest (high then low half, big-endian) as the key and
    // as the next block's words 0, 8 and 16.
    const uint64_t dh = __builtin_bswap64(h_hi), dl = __builtin_bswap64(h_lo);
    BlockKey &k = out[i];
    std::memcpy(k.b.data(), &dh, 8);
    std::memcpy(k.b.data() + 8, &dl, 8);
    std::memset(k.b.data() + 16, 0, 16);
    w0 = tag | dh << 32;
    w1 = dh >> 32 | dl << 32;
    w2 = dl >> 32 | uint64_t{n} << 32;
  }
}
#endif
}  // namespace

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
    if (size >= 72 && size <= 128) {
      chain_xxh3_72to128(buf, size, tag, n, parent, tokens, m, out);
      return;
    }
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
