// The prefix index's key side (prefix/prefix.h): extra keys in their key
// form, and walks of a prompt's chain of block keys through the index.
// Spec: docs/prefix-cache.md.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/error.h"
#include "common/le.h"
#include "common/strings.h"
#include "prefix/prefix.h"

namespace kvc::prefix {

namespace {
// The positional (legacy) form: "KVCX" | u32 count | count x (u64 size | bytes).
ExtraKeys positional_extras(const PrefixExtra *ex, uint32_t nx) {
  uint64_t size = 8;
  for (uint32_t i = 0; i < nx; ++i) size += 8 + ex[i].size;
  ExtraKeys kx;
  kx.enc.resize(size);
  uint8_t *p = kx.enc.data();
  std::memcpy(p, "KVCX", 4);
  put_le32(p + 4, nx);
  p += 8;
  for (uint32_t i = 0; i < nx; ++i) {
    put_le64(p, ex[i].size);
    p += 8;
    if (ex[i].size) std::memcpy(p, ex[i].data, ex[i].size);
    p += ex[i].size;
  }
  return kx;
}

std::string joined(const std::vector<std::string> &names) {
  std::string s;
  for (const std::string &n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}
}  // namespace

BlockKey prefix_extras_digest(const PrefixHasher &h, const ExtraKeys &kx) {
  return h.digest(kx.enc);
}

namespace {
// Byte equality without a call: a block's tokens (64 bytes for 16 tokens)
// and its extra keys are compared once per block of every lookup, in
// 16-byte vectors (SSE2, every x86-64) four at a time with the differences
// or-ed and tested once, then 8-byte words.
inline bool same_bytes(const void *a, const void *b, size_t n) {
  const uint8_t *x = static_cast<const uint8_t *>(a), *y = static_cast<const uint8_t *>(b);
  size_t i = 0;
#if defined(__SSE2__)
  auto d16 = [&](size_t o) {
    return _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i *>(x + o)),
                         _mm_loadu_si128(reinterpret_cast<const __m128i *>(y + o)));
  };
  for (; i + 64 <= n; i += 64) {
    const __m128i d =
        _mm_or_si128(_mm_or_si128(d16(i), d16(i + 16)), _mm_or_si128(d16(i + 32), d16(i + 48)));
    if (_mm_movemask_epi8(_mm_cmpeq_epi8(d, _mm_setzero_si128())) != 0xffff) return false;
  }
  for (; i + 16 <= n; i += 16)
    if (_mm_movemask_epi8(_mm_cmpeq_epi8(d16(i), _mm_setzero_si128())) != 0xffff) return false;
#endif
  uint64_t diff = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t u, v;
    std::memcpy(&u, x + i, 8);
    std::memcpy(&v, y + i, 8);
    diff |= u ^ v;
  }
  for (; i < n; ++i) diff |= static_cast<uint64_t>(x[i] ^ y[i]);
  return diff == 0;
}
}  // namespace

// With verify_tokens, a hit must be the block itself, not just its key: the
// same tokens, the same extra keys and the same parent (so a forced
// collision can never return another prompt's, tenant's or position's KV).
bool verified(const PrefixState &ps, const PrefixEntry &en, const int32_t *tokens,
              const std::vector<uint8_t> &xb, int64_t parent_entry, uint64_t depth) {
  if (!ps.verify_tokens) return true;
  if (en.depth != depth || en.parent_entry != parent_entry || en.extras_bytes.size() != xb.size() ||
      !same_bytes(en.extras_bytes.data(), xb.data(), xb.size()))
    return false;
  return same_bytes(en.tokens.data(), tokens, en.tokens.size() * sizeof(int32_t));
}

void check_extra_key_names(const std::vector<std::string> &names) {
  if (names.size() > kMaxExtraKeyNames)
    fail(Errc::InvalidArgument,
         "n_extra_key_names " + u64s(names.size()) + ": at most " + u64s(kMaxExtraKeyNames));
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string &n = names[i];
    if (n.empty()) fail(Errc::InvalidArgument, "extra_key_names[" + u64s(i) + "] is empty");
    if (n.size() > kMaxExtraKeyNameBytes)
      fail(Errc::InvalidArgument, "extra_key_names[" + u64s(i) + "] is longer than " +
                                      u64s(kMaxExtraKeyNameBytes) + " bytes");
    if (n.find('\0') != std::string::npos)
      fail(Errc::InvalidArgument, "extra_key_names[" + u64s(i) + "] contains a NUL byte");
    for (size_t j = 0; j < i; ++j)
      if (names[j] == n)
        fail(Errc::InvalidArgument, "extra_key_names[" + u64s(i) + "] \"" + n +
                                        "\" is declared twice (also [" + u64s(j) + "])");
  }
}

// Named form (docs/prefix-cache.md): one value per declared name, in
// declaration order; the key depends only on the assignment {name: non-empty
// value}: "KVCN" | u32 m | m x (u64 len | name | u64 size | bytes), names
// sorted by their bytes. With no non-empty value the call has no extra keys
// and takes the positional form of zero extras (the key of a pool without
// names and without extras).
ExtraKeys PrefixState::extra_keys(const PrefixExtra *ex, uint32_t nx) const {
  if (extra_names.empty()) return positional_extras(ex, nx);
  if (nx != extra_names.size())
    fail(Errc::InvalidArgument,
         "this pool declares " + u64s(extra_names.size()) + " extra-key names (" +
             joined(extra_names) +
             "): pass one value per name, in that order (empty for none); got " + u64s(nx) +
             " extra keys");
  uint64_t size = 8;
  uint32_t m = 0;
  for (uint32_t i = 0; i < nx; ++i)
    if (ex[i].size) {
      size += 16 + extra_names[i].size() + ex[i].size;
      ++m;
    }
  if (m == 0) return positional_extras(nullptr, 0);
  ExtraKeys kx;
  kx.named = true;
  kx.enc.resize(size);
  uint8_t *p = kx.enc.data();
  std::memcpy(p, "KVCN", 4);
  put_le32(p + 4, m);
  p += 8;
  for (uint32_t i : names_sorted) {
    if (!ex[i].size) continue;
    const std::string &name = extra_names[i];
    put_le64(p, name.size());
    std::memcpy(p + 8, name.data(), name.size());
    p += 8 + name.size();
    put_le64(p, ex[i].size);
    std::memcpy(p + 8, ex[i].data, ex[i].size);
    p += 8 + ex[i].size;
  }
  return kx;
}

namespace {
void finish_walk(const PrefixState &ps, uint64_t bs, const int32_t *tokens, uint64_t usable,
                 const ExtraKeys &kx, bool partial, const std::vector<uint8_t> &xb, Walk &w);
}  // namespace

Walk walk(const PrefixState &ps, uint64_t bs, const int32_t *tokens, uint64_t n,
          const ExtraKeys &kx, bool partial) {
  Walk w;
  if (n <= 1) return w;
  const uint64_t usable = n - 1;              // at least one token is always left to compute
  thread_local std::vector<uint8_t> scratch;  // one block's hash input, kept between calls
  static const std::vector<uint8_t> none;
  const std::vector<uint8_t> &xb = ps.verify_tokens ? kx.enc : none;
  const uint64_t nb = usable / bs;
  w.path.reserve(std::min<uint64_t>(nb, ps.entries.size()));
  // With token verification, a hit is the child of the previous hit (or a
  // first block) whose tokens, extra keys and depth are the block's
  // (verified()), so where the previous hit has few children the walk
  // descends the tree of cached blocks by comparing tokens, as SGLang's
  // radix tree does, and computes no key: the same hits as the keys would
  // give (a child that verifies has the key the block's tokens hash to, and
  // the block whose key is found must verify, so it is such a child). At a
  // node with more children (a crowded first block, a fork point), and
  // without verification, the block's key is computed from its parent's and
  // looked up in the index.
  constexpr size_t kScan = 4;
  // The chain of keys is serial (each hashes its parent), the index probes
  // and token checks are not: keys are computed a batch ahead (2, then 4,
  // then 8 at a time, so a prompt that misses at once hashes little more
  // than it needs), their slots prefetched, then the batch is probed and
  // verified in order.
  constexpr uint64_t kAhead = 8;
  BlockKey ks[kAhead];
  int64_t es[kAhead];
  uint64_t batch = 2;
  for (uint64_t i = 0; i < nb;) {
    const int64_t last = w.path.empty() ? -1 : static_cast<int64_t>(w.path.back());
    if (ps.verify_tokens) {
      const std::vector<uint32_t> &kids =
          last < 0 ? ps.root_children : ps.entries[static_cast<size_t>(last)].children;
      if (kids.size() <= kScan) {
        int64_t hit = -1;
        for (uint32_t c : kids)
          if (verified(ps, ps.entries[c], tokens + i * bs, xb, last, i + 1)) {
            hit = c;
            break;
          }
        if (hit < 0) break;
        w.path.push_back(static_cast<uint32_t>(hit));
        ++i;
        continue;
      }
    }
    // Keys from the parent's: the root's, or the previous hit's own key.
    const BlockKey parent = last < 0 ? ps.root : ps.entries[static_cast<size_t>(last)].key;
    // Verified walks hash one block at a crowded node, then descend again.
    const uint64_t m = ps.verify_tokens ? 1 : std::min(batch, nb - i);
    ps.hasher.chain(parent, tokens + i * bs, static_cast<uint32_t>(bs), m, kx, ks, scratch);
    for (uint64_t j = 0; j < m; ++j) ps.map.prefetch(ks[j]);
    for (uint64_t j = 0; j < m; ++j) {
      es[j] = ps.map.find(ks[j]);
      if (es[j] < 0) break;
      const PrefixEntry &en = ps.entries[static_cast<size_t>(es[j])];
      __builtin_prefetch(reinterpret_cast<const char *>(&en) + 64);
      __builtin_prefetch(en.tokens.data());
    }
    bool miss = false;
    for (uint64_t j = 0; j < m && !miss; ++j, ++i) {
      const int64_t e = es[j];
      const int64_t prev = w.path.empty() ? -1 : static_cast<int64_t>(w.path.back());
      miss = e < 0 ||
             !verified(ps, ps.entries[static_cast<size_t>(e)], tokens + i * bs, xb, prev, i + 1);
      if (!miss) w.path.push_back(static_cast<uint32_t>(e));
    }
    if (miss) break;
    batch = std::min(kAhead, 2 * batch);
  }
  finish_walk(ps, bs, tokens, usable, kx, partial, xb, w);
  return w;
}

namespace {
// After the whole blocks: the partial match of the next block, when asked.
void finish_walk(const PrefixState &ps, uint64_t bs, const int32_t *tokens, uint64_t usable,
                 const ExtraKeys &kx, bool partial, const std::vector<uint8_t> &xb, Walk &w) {
  const uint64_t hit = w.path.size() * bs;
  if (!partial || hit >= usable) return;
  const uint64_t want = std::min<uint64_t>(bs - 1, usable - hit);
  const BlockKey xd = prefix_extras_digest(ps.hasher, kx);
  const std::vector<uint32_t> &cands =
      w.path.empty() ? ps.root_children : ps.entries[w.path.back()].children;
  for (uint32_t c : cands) {
    const PrefixEntry &en = ps.entries[c];
    if (!(en.extras == xd) || (ps.verify_tokens && en.extras_bytes != xb)) continue;
    uint64_t m = 0;
    while (m < want && en.tokens[m] == tokens[hit + m]) ++m;
    if (m > w.partial_tokens) {
      w.partial_tokens = m;
      w.partial_entry = c;
    }
  }
}
}  // namespace

std::vector<uint32_t> prefix_walk_path(const PrefixState &ps, uint64_t bs, const int32_t *tokens,
                                       uint64_t n, const ExtraKeys &kx) {
  return walk(ps, bs, tokens, n, kx, false).path;
}

}  // namespace kvc::prefix
