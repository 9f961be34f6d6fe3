// Prefix cache: block identity (chained keys, seeds, salts, the spec's byte
// encoding), lookup / attach / insert, token verification against forced
// collisions, token-granular reuse, LRU reclaim from the end of a chain,
// removal before in-place writes, events, and lookups concurrent with appends.
#include <openssl/sha.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../whitebox.h"
#include "api/internal.h"
#include "common/scratch.h"
#include "core/prefix_cache.h"
#include "prefix/prefix.h"

namespace {

kvc_pool *make_pool(uint32_t bs, uint64_t blocks, uint32_t layers = 2, const uint8_t *seed = nullptr,
                    kvc_prefix_hash hash = KVC_PREFIX_HASH_SHA256, int verify = 1) {
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = layers;
  c.num_q_heads = 2;
  c.num_kv_heads = 2;
  c.head_dim = 4;
  c.block_size = bs;
  c.num_blocks = blocks;
  c.k_dtype = c.v_dtype = KVC_DTYPE_F32;
  kvc_pool *p = nullptr;
  CHECK_OK(kvc_pool_create(&c, &p));
  kvc_prefix_config pc;
  kvc_prefix_config_init(&pc);
  pc.hash = hash;
  pc.verify_tokens = static_cast<uint32_t>(verify);
  if (seed) {
    pc.seed_set = 1;
    std::memcpy(pc.seed, seed, 32);
  }
  CHECK_OK(kvc_pool_enable_prefix_cache(p, &pc));
  return p;
}

// K/V of token t at position pos: recognizable values.
void kv_of(int32_t token, uint64_t pos, float *row) {
  for (int i = 0; i < 8; ++i) row[i] = static_cast<float>(token) * 0.5f + static_cast<float>(pos) * 0.01f + i;
}

// Runs a "request": attaches the cached prefix (when asked), computes the
// rest (reserve + append), registers the full blocks. Returns hit tokens.
uint64_t request(kvc_pool *p, uint64_t id, const std::vector<int32_t> &toks, bool attach = true,
                 const kvc_prefix_extra *ex = nullptr, uint32_t nx = 0, uint32_t flags = 0,
                 kvc_prefix_result *out = nullptr) {
  kvc_prefix_result r;
  r.struct_size = sizeof r;
  r.hit_tokens = r.partial_tokens = 0;
  if (attach) CHECK_OK(kvc_prefix_attach(p, id, toks.data(), toks.size(), ex, nx, flags, &r));
  else CHECK_OK(kvc_seq_create(p, id));
  const uint64_t have = r.hit_tokens + r.partial_tokens;
  uint32_t layers = 0;
  {
    kvc_pool_config c;
    kvc_pool_config_init(&c);
    CHECK_OK(kvc_pool_get_config(p, &c));
    layers = c.num_layers;
  }
  if (toks.size() > have) {
    CHECK_OK(kvc_seq_reserve(p, id, toks.size() - have, nullptr));
    for (uint64_t t = have; t < toks.size(); ++t) {
      float row[8];
      kv_of(toks[t], t, row);
      for (uint32_t l = 0; l < layers; ++l) CHECK_OK(kvc_append(p, id, l, t, 1, row, row, KVC_DTYPE_F32));
    }
  }
  CHECK_OK(kvc_prefix_insert(p, id, toks.data(), toks.size(), ex, nx, nullptr));
  if (out) *out = r;
  return r.hit_tokens;
}

kvc_prefix_result lookup(kvc_pool *p, const std::vector<int32_t> &toks, const kvc_prefix_extra *ex = nullptr,
                         uint32_t nx = 0, uint32_t flags = 0) {
  kvc_prefix_result r;
  r.struct_size = sizeof r;
  CHECK_OK(kvc_prefix_lookup(p, toks.data(), toks.size(), ex, nx, flags, &r));
  return r;
}

kvc_prefix_stats stats(kvc_pool *p) {
  kvc_prefix_stats s;
  kvc_prefix_stats_init(&s);
  CHECK_OK(kvc_prefix_get_stats(p, &s));
  return s;
}

bool consistent(kvc_pool *p) {
  const kvc_prefix_stats s = stats(p);
  const std::string e = kvc::api::core_pool(p).check_invariants();
  if (!e.empty()) std::fprintf(stderr, "invariant: %s\n", e.c_str());
  return e.empty() && s.reclaimable_blocks + s.referenced_blocks == s.registered_blocks;
}

std::vector<int32_t> range(int32_t a, int32_t b) {
  std::vector<int32_t> v(static_cast<size_t>(b - a));
  std::iota(v.begin(), v.end(), a);
  return v;
}

std::vector<uint8_t> keys_of(kvc_pool *p, const std::vector<int32_t> &toks, const kvc_prefix_extra *ex = nullptr,
                             uint32_t nx = 0) {
  std::vector<uint8_t> k(toks.size() * 32 + 32);
  size_t ks = 0;
  CHECK_OK(kvc_prefix_keys(p, toks.data(), toks.size(), ex, nx, k.data(), k.size(), &ks));
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  kvc_pool_get_config(p, &c);
  k.resize(toks.size() / c.block_size * ks);
  return k;
}

}  // namespace

// block_size 4, tokens [5..12] cached: with a constant hash, [1,2,3,4] is
// refused by token comparison (and would be served without it); the real
// hash (SHA-256, 32-byte keys) hits [5..12]; seeds separate pools.
KVTEST(collision_and_seeds) {
  const uint8_t seed_a[32] = {1}, seed_b[32] = {2};
  {
    kvc::prefix::prefix_hash_force_constant(true);
    kvc_pool *p = make_pool(4, 64, 2, seed_a);
    request(p, 1, range(5, 13), false);
    CHECK(lookup(p, {1, 2, 3, 4, 99}).hit_tokens == 0);  // same (constant) key, other tokens
    CHECK(lookup(p, range(5, 14)).hit_tokens == 4);       // the second block collides with the first: refused
    kvc_pool_destroy(p);
    kvc_pool *unsafe = make_pool(4, 64, 2, seed_a, KVC_PREFIX_HASH_SHA256, /*verify=*/0);
    request(unsafe, 1, range(5, 13), false);
    CHECK(lookup(unsafe, {1, 2, 3, 4, 99}).hit_tokens == 4);  // what verification prevents
    kvc_pool_destroy(unsafe);
    kvc::prefix::prefix_hash_force_constant(false);
  }
  kvc_pool *p = make_pool(4, 64, 2, seed_a);
  CHECK(lookup(p, range(5, 14)).hit_tokens == 0);  // nothing cached yet
  request(p, 1, range(5, 13), false);
  CHECK(lookup(p, range(5, 14)).hit_tokens == 8);  // caching works
  CHECK(lookup(p, range(5, 13)).hit_tokens == 4);  // at most n - 1 tokens: the last block is recomputed
  CHECK(lookup(p, {1, 2, 3, 4, 99}).hit_tokens == 0);
  size_t ks = 0;
  uint8_t k[64];
  const std::vector<int32_t> t = range(5, 13);
  CHECK_OK(kvc_prefix_keys(p, t.data(), t.size(), nullptr, 0, k, sizeof k, &ks));
  CHECK(ks == 32);
  kvc_pool *q = make_pool(4, 64, 2, seed_a), *r = make_pool(4, 64, 2, seed_b);
  CHECK(keys_of(p, t) == keys_of(q, t));
  CHECK(keys_of(p, t) != keys_of(r, t));
  kvc_pool *rnd1 = make_pool(4, 64), *rnd2 = make_pool(4, 64);  // random seeds by default
  CHECK(keys_of(rnd1, t) != keys_of(rnd2, t));
  kvc_pool *x = make_pool(4, 64, 2, seed_a, KVC_PREFIX_HASH_XXH3_128);
  CHECK_OK(kvc_prefix_keys(x, t.data(), t.size(), nullptr, 0, k, sizeof k, &ks));
  CHECK(ks == 16);
  CHECK(consistent(p));
  for (kvc_pool *z : {p, q, r, rnd1, rnd2, x}) kvc_pool_destroy(z);
}

// The keys follow docs/prefix-cache.md byte for byte (recomputed here with
// OpenSSL directly).
KVTEST(spec_encoding) {
  const uint8_t seed[32] = {7, 7, 7};
  kvc_pool *p = make_pool(4, 16, 1, seed);
  // Root: "KVCP" | u32 1 | u32 hash 0 | seed | u64 len + fingerprint | u64 0 | u64 0 (empty ids).
  std::vector<uint8_t> b = {'K', 'V', 'C', 'P', 1, 0, 0, 0, 0, 0, 0, 0};
  b.insert(b.end(), seed, seed + 32);
  std::vector<uint8_t> fp;
  auto u32 = [](std::vector<uint8_t> &v, uint32_t x) {
    for (int i = 0; i < 4; ++i) v.push_back(static_cast<uint8_t>(x >> (8 * i)));
  };
  auto u64 = [](std::vector<uint8_t> &v, uint64_t x) {
    for (int i = 0; i < 8; ++i) v.push_back(static_cast<uint8_t>(x >> (8 * i)));
  };
  // layers, q heads, kv heads, head_dim, block_size, k dtype (f32 = 0), v dtype, layout (NHD = 0)
  for (uint32_t x : {1u, 2u, 2u, 4u, 4u, 0u, 0u, 0u}) u32(fp, x);
  // K and V codecs of plain f32 storage: dtype 0, gran 0, group 0, asym 0, scale dtype 0, rotation 0, scale 0.0
  for (int part = 0; part < 2; ++part) {
    for (int i = 0; i < 6; ++i) u32(fp, 0);
    u64(fp, 0);
  }
  u32(fp, 0);  // residual window
  u32(fp, 1);  // residual dtype (f16, the default)
  u64(fp, 0);  // residual fraction 0.0
  u64(b, fp.size());
  b.insert(b.end(), fp.begin(), fp.end());
  u64(b, 0);
  u64(b, 0);
  uint8_t root[32];
  SHA256(b.data(), b.size(), root);
  // Block 1: "KVCB" | root | u32 4 | tokens | u32 0 extras.
  std::vector<uint8_t> blk = {'K', 'V', 'C', 'B'};
  blk.insert(blk.end(), root, root + 32);
  u32(blk, 4);
  for (uint32_t tk : {10u, 11u, 12u, 13u}) u32(blk, tk);
  u32(blk, 0);
  uint8_t want[32];
  SHA256(blk.data(), blk.size(), want);
  const std::vector<int32_t> t = {10, 11, 12, 13};
  const std::vector<uint8_t> got = keys_of(p, t);
  CHECK(got.size() == 32 && std::memcmp(got.data(), want, 32) == 0);
  // With an extra key: u32 1 | u64 3 | "abc".
  const kvc_prefix_extra salt = {"abc", 3};
  blk.resize(blk.size() - 4);
  u32(blk, 1);
  u64(blk, 3);
  blk.insert(blk.end(), {'a', 'b', 'c'});
  SHA256(blk.data(), blk.size(), want);
  const std::vector<uint8_t> got2 = keys_of(p, t, &salt, 1);
  CHECK(got2.size() == 32 && std::memcmp(got2.data(), want, 32) == 0);
  kvc_pool_destroy(p);
}

// The test vectors of docs/prefix-cache.md.
KVTEST(test_vectors) {
  const char *want[2][2][2] = {
      {{"fb6ca8a8e2808f267ed596bf3760298379fb27898f5afb246bdda2ac6aa2fa0a",
        "18e0c8b6c5881edca87e1750a4a23ed446f3467d7118802b8cc540c8467ee05b"},
       {"b211fd461a050639e96ab7efd1dd5f7c980dbb707b1e510ca47ea23ae66abcee",
        "0930fcb3b06c395e3ebd0d264c0972e081b13f333a03db1a259c8ee959676143"}},
      {{"8e893e0ef814970d95d8517e4ef47c27", "38fab926b888a0d5020b457068e30377"},
       {"44d7dc0acce68637f7909b5583b90a93", "0677cdca05bca1d74431eaa417d96318"}}};
  for (int h = 0; h < 2; ++h) {
    kvc_pool_config c;
    kvc_pool_config_init(&c);
    c.num_layers = 1;
    c.num_q_heads = c.num_kv_heads = 2;
    c.head_dim = 4;
    c.block_size = 4;
    c.num_blocks = 16;
    c.k_dtype = c.v_dtype = KVC_DTYPE_F32;
    kvc_pool *p = nullptr;
    CHECK_OK(kvc_pool_create(&c, &p));
    kvc_prefix_config pc;
    kvc_prefix_config_init(&pc);
    pc.hash = h ? KVC_PREFIX_HASH_XXH3_128 : KVC_PREFIX_HASH_SHA256;
    pc.seed_set = 1;
    pc.model_id = "stories260K";
    pc.tokenizer_id = "tok512";
    CHECK_OK(kvc_pool_enable_prefix_cache(p, &pc));
    const kvc_prefix_extra salt = {"abc", 3};
    for (int e = 0; e < 2; ++e) {
      const std::vector<uint8_t> k = keys_of(p, range(10, 18), e ? &salt : nullptr, e ? 1 : 0);
      const size_t ks = h ? 16 : 32;
      CHECK(k.size() == 2 * ks);
      for (int b = 0; b < 2 && k.size() == 2 * ks; ++b) {
        char hex[65] = {0};
        for (size_t i = 0; i < ks; ++i) std::snprintf(hex + 2 * i, 3, "%02x", k[b * ks + i]);
        if (std::string(hex) != want[h][e][b]) std::fprintf(stderr, "hash %d extras %d block %d: %s\n", h, e, b, hex);
        CHECK(std::string(hex) == want[h][e][b]);
      }
    }
    kvc_pool_destroy(p);
  }
}

// PrefixHasher::chain (a lookup's keys, built in place) gives block()'s keys,
// chained: both hashes, block sizes whose input fits its stack buffers and
// ones that do not, no extra keys, positional and named ones, chains of 1 to
// 9 blocks.
KVTEST(chain_equals_block) {
  std::vector<int32_t> toks(9 * 80);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>(i * 2654435761u >> 7);
  kvc::prefix::ExtraKeys none, pos, named;
  none.enc = {'K', 'V', 'C', 'X', 0, 0, 0, 0};
  pos.enc = {'K', 'V', 'C', 'X', 1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 'a', 'b', 'c'};
  named.named = true;
  named.enc = {'K', 'V', 'C', 'N', 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 't',
               2, 0, 0, 0, 0, 0, 0, 0, 'x', 'y'};
  for (kvc::prefix::PrefixHash hk : {kvc::prefix::PrefixHash::Sha256, kvc::prefix::PrefixHash::Xxh3_128}) {
    const kvc::prefix::PrefixHasher h(hk);
    kvc::BlockKey root;
    for (size_t i = 0; i < root.b.size(); ++i) root.b[i] = static_cast<uint8_t>(i * 37 + 1);
    if (hk == kvc::prefix::PrefixHash::Xxh3_128) std::fill(root.b.begin() + 16, root.b.end(), 0);
    for (const kvc::prefix::ExtraKeys *kx : {&none, &pos, &named})
      for (uint32_t n : {1u, 4u, 16u, 57u, 80u})
        for (uint64_t m : {1ull, 2ull, 9ull}) {
          std::vector<uint8_t> scratch;
          std::vector<kvc::BlockKey> got(m);
          h.chain(root, toks.data(), n, m, *kx, got.data(), scratch);
          kvc::BlockKey parent = root;
          for (uint64_t i = 0; i < m; ++i) {
            parent = h.block(parent, toks.data() + i * n, n, *kx, scratch);
            if (!(got[i] == parent))
              std::fprintf(stderr, "hash %d n %u m %llu block %llu differs\n",
                           static_cast<int>(hk), n, static_cast<unsigned long long>(m),
                           static_cast<unsigned long long>(i));
            CHECK(got[i] == parent);
          }
        }
  }
}

// block_size 16, a 32-token prompt: an identical request reuses exactly 16
// (whole blocks, at most 31); so does a third; the second block stays
// registered under the key chained from the first.
KVTEST(whole_block_reuse) {
  kvc_pool *p = make_pool(16, 64);
  const std::vector<int32_t> prompt = range(100, 132);
  CHECK(request(p, 1, prompt) == 0);
  CHECK_OK(kvc_seq_free(p, 1));
  CHECK(consistent(p));
  CHECK(stats(p).registered_blocks == 2 && stats(p).reclaimable_blocks == 2);
  CHECK(request(p, 2, prompt) == 16);
  CHECK(consistent(p));
  CHECK(stats(p).referenced_blocks == 1);  // request 2 holds block 1; block 2 is its own fresh copy (the cached one stays cached)
  CHECK_OK(kvc_seq_free(p, 2));
  CHECK(request(p, 3, prompt) == 16);
  std::vector<int32_t> longer = prompt;
  longer.push_back(7);
  CHECK(lookup(p, longer).hit_tokens == 32);  // block 2 under the chained key
  // The attached data is the cached data.
  std::vector<float> k(16 * 8);
  CHECK_OK(kvc_gather(p, 3, 1, 0, 16, k.data(), nullptr, KVC_DTYPE_F32, nullptr));
  float row[8];
  kv_of(prompt[5], 5, row);
  CHECK(std::memcmp(k.data() + 5 * 8, row, sizeof row) == 0);
  const kvc_prefix_stats s = stats(p);
  CHECK(s.hit_tokens >= 64 && s.queried_tokens >= 4 * 32);
  CHECK(consistent(p));
  kvc_pool_destroy(p);
}

// block_size 4, [1..8] cached: [1,2,3] matches no whole block and at most 2
// tokens token-granularly, and leaves the index unchanged; attach copies them.
KVTEST(partial_reuse) {
  kvc_pool *p = make_pool(4, 64);
  request(p, 1, range(1, 9), false);
  CHECK_OK(kvc_seq_free(p, 1));
  const kvc_prefix_stats before = stats(p);
  kvc_prefix_result r = lookup(p, {1, 2, 3});
  CHECK(r.hit_tokens == 0 && r.partial_tokens == 0);
  r = lookup(p, {1, 2, 3}, nullptr, 0, KVC_PREFIX_PARTIAL);
  CHECK(r.hit_tokens == 0 && r.partial_tokens == 2);
  r = lookup(p, {1, 2, 3, 4, 5, 6, 9, 9}, nullptr, 0, KVC_PREFIX_PARTIAL);
  CHECK(r.hit_tokens == 4 && r.partial_tokens == 2);
  const kvc_prefix_stats after = stats(p);
  CHECK(after.registered_blocks == before.registered_blocks && after.reclaimable_blocks == before.reclaimable_blocks);
  CHECK(consistent(p));
  kvc_prefix_result ar;
  request(p, 2, {1, 2, 3, 4, 5, 6, 9, 9}, true, nullptr, 0, KVC_PREFIX_PARTIAL, &ar);
  CHECK(ar.hit_tokens == 4 && ar.partial_tokens == 2);
  std::vector<float> k(8 * 8);
  CHECK_OK(kvc_gather(p, 2, 0, 0, 8, k.data(), nullptr, KVC_DTYPE_F32, nullptr));
  for (uint64_t t = 0; t < 8; ++t) {
    float row[8];
    const int32_t tok = t < 6 ? static_cast<int32_t>(t) + 1 : 9;
    kv_of(tok, t, row);
    CHECK(std::memcmp(k.data() + t * 8, row, sizeof row) == 0);
  }
  CHECK(consistent(p));
  kvc_pool_destroy(p);
}

// The same tokens with different salts never share a block (not even a partial one).
KVTEST(salt_isolation) {
  kvc_pool *p = make_pool(4, 64);
  const kvc_prefix_extra a = {"tenant-a", 8}, b = {"tenant-b", 8};
  request(p, 1, range(1, 13), false, &a, 1);
  CHECK(lookup(p, range(1, 14), &a, 1).hit_tokens == 12);
  const kvc_prefix_result rb = lookup(p, range(1, 14), &b, 1, KVC_PREFIX_PARTIAL);
  CHECK(rb.hit_tokens == 0 && rb.partial_tokens == 0);
  const kvc_prefix_result rn = lookup(p, range(1, 14), nullptr, 0, KVC_PREFIX_PARTIAL);
  CHECK(rn.hit_tokens == 0 && rn.partial_tokens == 0);
  CHECK(keys_of(p, range(1, 5), &a, 1) != keys_of(p, range(1, 5), &b, 1));
  kvc_pool_destroy(p);
}

namespace {
struct EventLog {
  std::set<std::string> keys;
  int stored = 0, removed = 0;
};
void on_event(void *user, const kvc_prefix_event *ev) {
  EventLog *log = static_cast<EventLog *>(user);
  const std::string k(reinterpret_cast<const char *>(ev->key), ev->key_size);
  if (ev->kind == KVC_PREFIX_STORED) {
    log->keys.insert(k);
    ++log->stored;
  } else {
    log->keys.erase(k);
    ++log->removed;
  }
}
bool events_match(kvc_pool *p, const EventLog &log) {
  const std::vector<std::string> reg = kvc::api::core_pool(p).prefix().registered_keys();
  return std::set<std::string>(reg.begin(), reg.end()) == log.keys;
}
}  // namespace

// LRU reclaim: a full pool reclaims cached chains from their end (children
// first); hits revive blocks; the events alone rebuild the set of keys.
KVTEST(reclaim_lru_chains_and_events) {
  kvc_pool *p = make_pool(4, 24, 2);  // 12 blocks per layer-pair... 24 blocks: 2 layers x 12
  EventLog log;
  CHECK_OK(kvc_prefix_set_callback(p, on_event, &log));
  const std::vector<int32_t> a = range(1, 17), b = range(50, 66);  // 4 blocks each
  request(p, 1, a, false);
  CHECK_OK(kvc_seq_free(p, 1));
  request(p, 2, b, false);
  CHECK_OK(kvc_seq_free(p, 2));
  CHECK(events_match(p, log));
  CHECK(stats(p).registered_blocks == 8 && stats(p).reclaimable_blocks == 8);
  CHECK(consistent(p));
  // A hit on chain a revives and re-releases it: chain b is now the oldest.
  std::vector<int32_t> a1 = a;
  a1.push_back(0);
  CHECK(request(p, 3, a1) == 16);
  CHECK_OK(kvc_seq_free(p, 3));
  CHECK(consistent(p));
  // 16 + 1 fresh tokens need 5 block pairs: 4 free pairs (24 - 16 used) then
  // reclaim from the least recently used chain (b), from its end.
  CHECK_OK(kvc_seq_create(p, 4));
  CHECK_OK(kvc_seq_reserve(p, 4, 20, nullptr));
  CHECK(consistent(p));
  CHECK(events_match(p, log));
  std::vector<int32_t> b1 = b;
  b1.push_back(0);
  const uint64_t bh = lookup(p, b1).hit_tokens, ah = lookup(p, a1).hit_tokens;
  CHECK(ah == 16);              // the recently used chain survives whole
  CHECK(bh == 12);              // b lost its last block only (children before parents)
  CHECK(stats(p).reclaimed_total >= 1);
  CHECK(log.removed >= 1);
  CHECK_OK(kvc_seq_free(p, 4));
  CHECK(consistent(p));
  CHECK_OK(kvc_prefix_set_callback(p, nullptr, nullptr));
  kvc_pool_destroy(p);
}

// A prefix callback may call into other pools. One that appends to another
// pool while this pool's append is between its preparation and its writes
// (the append's copy-on-write reclaims a cached block: a REMOVED event) gets
// scratch buffers of its own: the first append stores its own rows (f16 rows
// through the group keys its preparation computed, bf16 and f32 rows through
// their f32 copies; with one scratch per thread the callback's rows
// overwrote them, or its growth or its return's release of large buffers
// freed them: ASan).
namespace {
struct NestedAppend {
  kvc_pool *other = nullptr;
  kvc_dtype src = KVC_DTYPE_F16;
  std::vector<uint16_t> rows16;  // 512 tokens x 32 (f16 or bf16)
  std::vector<float> rows32;
  int fired = 0;
  kvc_status status = KVC_OK;
};
void append_to_other(void *user, const kvc_prefix_event *e) {
  auto *n = static_cast<NestedAppend *>(user);
  if (e->kind != KVC_PREFIX_REMOVED || n->fired++) return;
  const void *r = n->src == KVC_DTYPE_F32 ? static_cast<const void *>(n->rows32.data())
                                          : static_cast<const void *>(n->rows16.data());
  kvc::t_scratch_large = true;  // as if this call grew a large buffer: its return releases them
  n->status = kvc_append(n->other, 1, 0, 0, 512, r, r, n->src);
}
}  // namespace

KVTEST(callback_appends_to_another_pool) {
  constexpr uint32_t kHd = 32;
  kvc_codec c;
  kvc_codec_init(&c);
  c.dtype = KVC_DTYPE_INT8;
  c.granularity = KVC_SCALE_PER_TOKEN;
  auto pool = [&](uint64_t blocks) {
    kvc_pool_config cfg;
    kvc_pool_config_init(&cfg);
    cfg.num_layers = 1;
    cfg.num_kv_heads = cfg.num_q_heads = 1;
    cfg.head_dim = kHd;
    cfg.block_size = 4;
    cfg.num_blocks = blocks;
    cfg.k_codec = cfg.v_codec = &c;
    kvc_pool *p = nullptr;
    CHECK_OK(kvc_pool_create(&cfg, &p));
    return p;
  };
  for (kvc_dtype src : {KVC_DTYPE_F16, KVC_DTYPE_BF16, KVC_DTYPE_F32}) {
    kvc_pool *a = pool(4), *b = pool(256);
    NestedAppend n;
    n.other = b;
    n.src = src;
    std::vector<float> big(512 * kHd);
    for (size_t i = 0; i < big.size(); ++i) big[i] = 100.0f + static_cast<float>(i % 7);
    n.rows32 = big;
    n.rows16.resize(big.size());
    if (src != KVC_DTYPE_F32)
      CHECK_OK(kvc_convert(big.data(), KVC_DTYPE_F32, n.rows16.data(), src, big.size()));
    CHECK_OK(kvc_seq_create(b, 1));
    CHECK_OK(kvc_seq_reserve(b, 1, 512, nullptr));
    {  // the thread's scratch grown to the callback's size first: reused, not reallocated
      const void *r = src == KVC_DTYPE_F32 ? static_cast<const void *>(n.rows32.data())
                                           : static_cast<const void *>(n.rows16.data());
      CHECK_OK(kvc_append(b, 1, 0, 0, 512, r, r, src));
    }
    std::vector<float> f(12 * kHd);
    for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(static_cast<int>(i % 29) - 14) / 16;
    std::vector<uint16_t> r16(f.size());
    if (src != KVC_DTYPE_F32) CHECK_OK(kvc_convert(f.data(), KVC_DTYPE_F32, r16.data(), src, f.size()));
    const void *rows = src == KVC_DTYPE_F32 ? static_cast<const void *>(f.data())
                                            : static_cast<const void *>(r16.data());
    kvc_prefix_config pc;
    kvc_prefix_config_init(&pc);
    CHECK_OK(kvc_pool_enable_prefix_cache(a, &pc));
    CHECK_OK(kvc_prefix_set_callback(a, append_to_other, &n));
    // A cached block (sequence 9's, freed), then the pool's other 3 blocks
    // held by sequences 2 and 3 (a fork).
    const int32_t toks[4] = {1, 2, 3, 4};
    uint64_t reg = 0;
    CHECK_OK(kvc_seq_create(a, 9));
    CHECK_OK(kvc_seq_reserve(a, 9, 4, nullptr));
    CHECK_OK(kvc_append(a, 9, 0, 0, 4, rows, rows, src));
    CHECK_OK(kvc_prefix_insert(a, 9, toks, 4, nullptr, 0, &reg));
    CHECK(reg == 1);
    CHECK_OK(kvc_seq_free(a, 9));
    CHECK_OK(kvc_seq_create(a, 2));
    CHECK_OK(kvc_seq_reserve(a, 2, 12, nullptr));
    CHECK_OK(kvc_append(a, 2, 0, 0, 12, rows, rows, src));
    CHECK_OK(kvc_seq_fork(a, 2, 3));
    std::vector<float> before(12 * kHd), after(12 * kHd);
    CHECK_OK(kvc_gather(a, 2, 0, 0, 12, before.data(), nullptr, KVC_DTYPE_F32, nullptr));
    // The same rows again at positions 0..3: copy-on-write takes the cached
    // block. (Every scratch buffer counted large: the callback's return
    // through the C API releases the thread's buffers but the held ones.)
    const size_t keep = kvc::scratch_keep_bytes();
    kvc::set_scratch_keep_bytes(0);
    CHECK_OK(kvc_append(a, 2, 0, 0, 4, rows, rows, src));
    kvc::set_scratch_keep_bytes(keep);
    CHECK(n.fired == 1 && n.status == KVC_OK);
    CHECK_OK(kvc_gather(a, 2, 0, 0, 12, after.data(), nullptr, KVC_DTYPE_F32, nullptr));
    CHECK(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)) == 0);
    std::vector<float> got(512 * kHd);  // and the callback's append stored its rows
    CHECK_OK(kvc_gather(b, 1, 0, 0, 512, got.data(), nullptr, KVC_DTYPE_F32, nullptr));
    double err = 0;
    for (size_t i = 0; i < got.size(); ++i) err = std::max(err, double(std::fabs(got[i] - big[i])));
    CHECK(err < 0.5);  // int8 of values near 100: a step of 106 / 127
    kvc_pool_destroy(a);
    kvc_pool_destroy(b);
  }
}

// A registered block leaves the index before its content changes in place:
// rewriting a position it holds, truncating into it (sole holder), eviction
// compaction. Shared blocks are copied instead and stay registered.
KVTEST(removed_before_in_place_writes) {
  kvc_pool *p = make_pool(4, 64, 1);
  EventLog log;
  CHECK_OK(kvc_prefix_set_callback(p, on_event, &log));
  request(p, 1, range(1, 13), false);  // 3 blocks, held by sequence 1 only
  CHECK(stats(p).registered_blocks == 3);
  float row[8] = {0};
  CHECK_OK(kvc_append(p, 1, 0, 9, 1, row, row, KVC_DTYPE_F32));  // rewrites block 3 in place
  CHECK(stats(p).registered_blocks == 2);
  CHECK(events_match(p, log));
  CHECK_OK(kvc_seq_truncate(p, 1, 6));  // cuts into block 2: it and its child leave
  CHECK(stats(p).registered_blocks == 1);
  CHECK(events_match(p, log));
  CHECK(consistent(p));
  // Shared: a fork holds block 1; writing it copies, the entry stays.
  request(p, 2, range(20, 28), false);
  CHECK_OK(kvc_seq_fork(p, 2, 3));
  CHECK_OK(kvc_append(p, 3, 0, 1, 1, row, row, KVC_DTYPE_F32));
  std::vector<int32_t> q = range(20, 28);
  q.push_back(0);
  CHECK(lookup(p, q).hit_tokens == 8);
  // Eviction compaction rewrites sequence 2's first block in place.
  CHECK_OK(kvc_seq_free(p, 3));
  kvc_policy_config pc;
  kvc_policy_config_init(&pc);
  pc.kind = KVC_POLICY_STREAMING;
  pc.sink_tokens = 1;
  pc.budget_tokens = 4;
  kvc_policy *pol = nullptr;
  CHECK_OK(kvc_policy_create(&pc, &pol));
  CHECK_OK(kvc_evict(p, 2, pol, nullptr));
  CHECK(lookup(p, q).hit_tokens == 0);
  CHECK(events_match(p, log));
  CHECK(consistent(p));
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

// Lookups and attaches on some threads while others append and free
// (ThreadSanitizer runs this in CI).
KVTEST(threads_lookup_append) {
  kvc_pool *p = make_pool(4, 4096, 2);
  const std::vector<int32_t> base = range(1, 33);
  request(p, 1, base, false);
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};
  std::vector<std::thread> th;
  for (int w = 0; w < 2; ++w)
    th.emplace_back([&, w] {
      for (int i = 0; i < 200; ++i) {
        const uint64_t id = 1000 + uint64_t(w) * 1000 + uint64_t(i);
        std::vector<int32_t> t = base;
        t.push_back(i);
        kvc_prefix_result r;
        r.struct_size = sizeof r;
        if (kvc_prefix_attach(p, id, t.data(), t.size(), nullptr, 0, 0, &r) != KVC_OK) ++errors;
        float row[8] = {1};
        if (kvc_seq_reserve(p, id, 1, nullptr) != KVC_OK) ++errors;
        for (uint32_t l = 0; l < 2; ++l)
          if (kvc_append(p, id, l, r.hit_tokens, 1, row, row, KVC_DTYPE_F32) != KVC_OK) ++errors;
        if (kvc_seq_free(p, id) != KVC_OK) ++errors;
      }
    });
  th.emplace_back([&] {
    std::vector<int32_t> t = base;
    t.push_back(0);
    while (!stop.load()) {
      kvc_prefix_result r;
      r.struct_size = sizeof r;
      if (kvc_prefix_lookup(p, t.data(), t.size(), nullptr, 0, KVC_PREFIX_PARTIAL, &r) != KVC_OK || r.hit_tokens != 32)
        ++errors;
    }
  });
  th[0].join();
  th[1].join();
  stop = true;
  th[2].join();
  CHECK(errors.load() == 0);
  CHECK(consistent(p));
  kvc_pool_destroy(p);
}

// Token verification compares every byte: with a constant hash (every key
// collides, so one block registers), a query that differs from the cached
// block in one byte of one token, or of the extra keys, misses, whatever the
// block size (tokens compared 64 bytes, 16 bytes and 8 bytes at a time, then byte
// by byte), hash and extra-key length.
KVTEST(collision_any_byte) {
  kvc::prefix::prefix_hash_force_constant(true);
  for (kvc_prefix_hash h : {KVC_PREFIX_HASH_SHA256, KVC_PREFIX_HASH_XXH3_128})
    for (uint32_t bs : {3u, 4u, 5u, 16u, 20u, 33u}) {
      for (size_t xn : {size_t{0}, size_t{1}, size_t{7}, size_t{16}, size_t{23}, size_t{64}, size_t{70}}) {
        kvc_pool *p = make_pool(bs, 8, 1, nullptr, h);
        std::vector<uint8_t> xb(xn);
        for (size_t i = 0; i < xn; ++i) xb[i] = static_cast<uint8_t>(i * 37 + 1);
        const kvc_prefix_extra ex = {xb.data(), xb.size()};
        const std::vector<int32_t> toks = range(1000, 1000 + static_cast<int32_t>(bs + 1));
        request(p, 1, toks, false, &ex, 1);
        CHECK(lookup(p, toks, &ex, 1).hit_tokens == bs);
        for (uint32_t t = 0; t < bs; ++t)
          for (int b = 0; b < 4; ++b) {
            std::vector<int32_t> q = toks;
            q[t] = static_cast<int32_t>(static_cast<uint32_t>(q[t]) ^ (1u << (8 * b)));
            const uint64_t hit = lookup(p, q, &ex, 1).hit_tokens;
            if (hit != 0)
              std::fprintf(stderr, "hash %d bs %u extras %zu token %u byte %d: hit %llu\n", int(h), bs, xn, t, b,
                           static_cast<unsigned long long>(hit));
            CHECK(hit == 0);
          }
        for (size_t i = 0; i < xn; ++i) {
          std::vector<uint8_t> other = xb;
          other[i] ^= 0x10;
          const kvc_prefix_extra ox = {other.data(), other.size()};
          CHECK(lookup(p, toks, &ox, 1).hit_tokens == 0);
        }
        kvc_pool_destroy(p);
      }
    }
  kvc::prefix::prefix_hash_force_constant(false);
}

// The verified walk descends the tree of cached blocks by tokens where a
// node has at most 4 children and hashes at more crowded nodes (a root of 10
// first blocks, a fork of 6): every query's hit is the longest whole-block
// prefix (at most n - 1 tokens) some cached prompt shares with it, for both
// hashes, with and without verification.
KVTEST(walk_tree_and_index_agree) {
  std::vector<std::vector<int32_t>> cached;
  for (int32_t k = 0; k < 10; ++k) {  // 10 first blocks, each followed by 100..103
    std::vector<int32_t> t = {k, k, k, k, 100, 101, 102, 103};
    if (k < 3) t.insert(t.end(), {300 + k, 301, 302, 303});  // a third block on some
    cached.push_back(t);
  }
  for (int32_t j = 0; j < 6; ++j) {  // a fork of 6 after [0 0 0 0][100..103]
    std::vector<int32_t> t = {0, 0, 0, 0, 100, 101, 102, 103, 200 + j, 201, 202, 203};
    t.insert(t.end(), {400 + j, 401, 402, 403});
    cached.push_back(t);
  }
  auto expected = [&](const std::vector<int32_t> &q) {
    uint64_t best = 0;
    for (const auto &c : cached) {
      uint64_t m = 0;
      while (m + 4 <= c.size() && m + 4 <= q.size() - 1 &&
             std::equal(c.begin() + static_cast<long>(m), c.begin() + static_cast<long>(m + 4),
                        q.begin() + static_cast<long>(m)))
        m += 4;
      best = std::max(best, m);
    }
    return best;
  };
  for (kvc_prefix_hash h : {KVC_PREFIX_HASH_SHA256, KVC_PREFIX_HASH_XXH3_128})
    for (int verify : {1, 0}) {
      kvc_pool *p = make_pool(4, 256, 1, nullptr, h, verify);
      uint64_t id = 1;
      for (const auto &c : cached) request(p, id++, c, false);
      std::vector<std::vector<int32_t>> queries;
      for (const auto &c : cached) {
        std::vector<int32_t> q = c;
        q.push_back(7);
        queries.push_back(q);                                      // all of it
        queries.push_back(std::vector<int32_t>(c.begin(), c.end()));  // n - 1: not the last block
        for (size_t t = 0; t < c.size(); ++t) {  // one token changed
          std::vector<int32_t> d = q;
          d[t] += 1000;
          queries.push_back(d);
        }
      }
      queries.push_back({5, 5, 5, 5, 100, 101, 102, 103, 200, 201, 202, 203, 9});  // another's fork
      queries.push_back({0, 0, 0, 0, 100, 101, 102, 103, 205, 201, 202, 203, 405, 401, 402, 403, 1});
      int wrong = 0;
      for (const auto &q : queries) {
        const uint64_t hit = lookup(p, q).hit_tokens, want = expected(q);
        if (hit != want && ++wrong <= 5)
          std::fprintf(stderr, "hash %d verify %d: a %zu-token query hit %llu, want %llu\n", int(h),
                       verify, q.size(), static_cast<unsigned long long>(hit),
                       static_cast<unsigned long long>(want));
      }
      CHECK(wrong == 0);
      CHECK(consistent(p));
      kvc_pool_destroy(p);
    }
}

// Regressions of the adversarial review: a partial attach on a full pool
// falls back to whole blocks; reclaimed cached blocks are zeroed with
// ZERO_ON_FREE; a forced collision never serves another tenant's, parent's or
// depth's block; reserving into a registered block removes it first.
KVTEST(review_regressions) {
  {
    kvc_pool *p = make_pool(4, 4, 1);
    request(p, 1, range(1, 9), false);
    CHECK_OK(kvc_seq_free(p, 1));
    CHECK_OK(kvc_seq_create(p, 2));
    CHECK_OK(kvc_seq_reserve(p, 2, 8, nullptr));  // takes both free blocks
    kvc_prefix_result r;
    r.struct_size = sizeof r;
    const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 9, 9};
    CHECK_OK(kvc_prefix_attach(p, 3, t.data(), t.size(), nullptr, 0, KVC_PREFIX_PARTIAL, &r));
    CHECK(r.hit_tokens == 4 && r.partial_tokens == 0);  // no room for the copy: skipped
    uint64_t len = 0;
    CHECK_OK(kvc_seq_length(p, 3, &len));
    CHECK(len == 4);
    CHECK(consistent(p));
    kvc_pool_destroy(p);
  }
  {
    kvc_pool_config c;
    kvc_pool_config_init(&c);
    c.num_layers = 1;
    c.num_q_heads = c.num_kv_heads = 2;
    c.head_dim = 4;
    c.block_size = 4;
    c.num_blocks = 2;
    c.k_dtype = c.v_dtype = KVC_DTYPE_F32;
    c.flags = KVC_POOL_ZERO_ON_FREE;
    kvc_pool *p = nullptr;
    CHECK_OK(kvc_pool_create(&c, &p));
    kvc_prefix_config pc;
    kvc_prefix_config_init(&pc);
    CHECK_OK(kvc_pool_enable_prefix_cache(p, &pc));
    request(p, 1, range(1, 5), false);
    CHECK_OK(kvc_seq_free(p, 1));  // cached
    CHECK_OK(kvc_seq_create(p, 2));
    CHECK_OK(kvc_seq_reserve(p, 2, 8, nullptr));  // reclaims it
    std::vector<float> k(8 * 8, 7.0f);
    CHECK_OK(kvc_gather(p, 2, 0, 0, 8, k.data(), nullptr, KVC_DTYPE_F32, nullptr));
    for (float x : k) CHECK(x == 0.0f);
    kvc_pool_destroy(p);
  }
  {
    kvc::prefix::prefix_hash_force_constant(true);
    kvc_pool *p = make_pool(4, 64, 1);
    const kvc_prefix_extra a = {"tenantA", 7}, b = {"tenantB", 7};
    request(p, 1, range(1, 5), false, &a, 1);
    CHECK(lookup(p, {1, 2, 3, 4, 5}, &b, 1).hit_tokens == 0);
    const kvc_prefix_result rp = lookup(p, {1, 2, 3, 9, 9}, &b, 1, KVC_PREFIX_PARTIAL);
    CHECK(rp.partial_tokens == 0);
    CHECK(lookup(p, {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 9}, &a, 1).hit_tokens == 4);  // not the same block thrice
    kvc_pool_destroy(p);
    kvc::prefix::prefix_hash_force_constant(false);
  }
  {
    kvc_pool *p = make_pool(4, 64, 1);
    request(p, 1, range(1, 5), false);
    CHECK_OK(kvc_seq_fork(p, 1, 2));
    CHECK_OK(kvc_seq_truncate(p, 2, 2));  // shared: stays registered
    CHECK_OK(kvc_seq_free(p, 1));
    CHECK(stats(p).registered_blocks == 1);
    CHECK_OK(kvc_seq_reserve(p, 2, 2, nullptr));  // its free slots will be written
    CHECK(stats(p).registered_blocks == 0);
    CHECK(consistent(p));
    kvc_pool_destroy(p);
  }
}

// Setting the event callback while another thread registers blocks (TSan in CI).
KVTEST(threads_callback) {
  kvc_pool *p = make_pool(4, 4096, 1);
  EventLog log;
  std::atomic<bool> stop{false};
  std::thread toggler([&] {
    while (!stop.load()) {
      kvc_prefix_set_callback(p, on_event, &log);
      kvc_prefix_set_callback(p, nullptr, nullptr);
    }
  });
  for (int i = 0; i < 300; ++i) {
    request(p, 100 + static_cast<uint64_t>(i), range(i * 8, i * 8 + 8), false);
    CHECK_OK(kvc_seq_free(p, 100 + static_cast<uint64_t>(i)));
  }
  stop = true;
  toggler.join();
  CHECK(consistent(p));
  kvc_pool_destroy(p);
}

// Bad input.
KVTEST(bad_input) {
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = 1;
  c.num_q_heads = c.num_kv_heads = 1;
  c.head_dim = 4;
  c.block_size = 4;
  c.num_blocks = 8;
  kvc_pool *p = nullptr;
  CHECK_OK(kvc_pool_create(&c, &p));
  const int32_t t[4] = {1, 2, 3, 4};
  kvc_prefix_result r;
  r.struct_size = sizeof r;
  CHECK_STATUS(kvc_prefix_lookup(p, t, 4, nullptr, 0, 0, &r), KVC_ERR_INVALID_ARGUMENT);  // not enabled
  kvc_prefix_config pc;
  kvc_prefix_config_init(&pc);
  pc.hash = static_cast<kvc_prefix_hash>(9);
  CHECK_STATUS(kvc_pool_enable_prefix_cache(p, &pc), KVC_ERR_INVALID_ARGUMENT);
  pc.hash = KVC_PREFIX_HASH_XXH3_128;
  pc.struct_size = 12;
  CHECK_STATUS(kvc_pool_enable_prefix_cache(p, &pc), KVC_ERR_STRUCT_SIZE);
  pc.struct_size = sizeof pc;
  CHECK_OK(kvc_pool_enable_prefix_cache(p, &pc));
  CHECK_STATUS(kvc_pool_enable_prefix_cache(p, &pc), KVC_ERR_INVALID_ARGUMENT);  // twice
  CHECK_STATUS(kvc_prefix_lookup(p, t, 4, nullptr, 0, 0x10, &r), KVC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kvc_prefix_lookup(p, nullptr, 4, nullptr, 0, 0, &r), KVC_ERR_NULL_POINTER);
  CHECK_STATUS(kvc_prefix_lookup(p, t, 4, nullptr, 1, 0, &r), KVC_ERR_NULL_POINTER);
  CHECK_STATUS(kvc_prefix_lookup(p, t, 4, nullptr, 65, 0, &r), KVC_ERR_INVALID_ARGUMENT);
  const kvc_prefix_extra bad = {nullptr, 5};
  CHECK_STATUS(kvc_prefix_lookup(p, t, 4, &bad, 1, 0, &r), KVC_ERR_NULL_POINTER);
  const kvc_prefix_extra huge = {t, (size_t(1) << 20) + 1};
  CHECK_STATUS(kvc_prefix_lookup(p, t, 4, &huge, 1, 0, &r), KVC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kvc_prefix_lookup(p, t, uint64_t(1) << 40, nullptr, 0, 0, &r), KVC_ERR_OVERFLOW);
  r.struct_size = 4;
  CHECK_STATUS(kvc_prefix_lookup(p, t, 4, nullptr, 0, 0, &r), KVC_ERR_STRUCT_SIZE);
  r.struct_size = sizeof r;
  CHECK_OK(kvc_prefix_lookup(p, t, 0, nullptr, 0, 0, &r));
  CHECK(r.hit_tokens == 0);
  CHECK_STATUS(kvc_prefix_insert(p, 5, t, 4, nullptr, 0, nullptr), KVC_ERR_SEQ_NOT_FOUND);
  CHECK_OK(kvc_seq_create(p, 5));
  CHECK_STATUS(kvc_prefix_insert(p, 5, t, 4, nullptr, 0, nullptr), KVC_ERR_OUT_OF_RANGE);  // length 0
  CHECK_STATUS(kvc_prefix_attach(p, 5, t, 4, nullptr, 0, 0, &r), KVC_ERR_SEQ_EXISTS);
  uint8_t keys[8];
  size_t ks = 0;
  CHECK_STATUS(kvc_prefix_keys(p, t, 4, nullptr, 0, keys, sizeof keys, &ks), KVC_ERR_BUFFER_TOO_SMALL);
  CHECK(ks == 16);
  CHECK_STATUS(kvc_prefix_get_stats(p, nullptr), KVC_ERR_NULL_POINTER);
  kvc_pool_destroy(p);
  // A pool with a residual window refuses the prefix cache.
  kvc_codec codec;
  kvc_codec_init(&codec);
  c.k_codec = c.v_codec = &codec;
  c.residual_window = 4;
  CHECK_OK(kvc_pool_create(&c, &p));
  kvc_prefix_config_init(&pc);
  CHECK_STATUS(kvc_pool_enable_prefix_cache(p, &pc), KVC_ERR_UNSUPPORTED);
  kvc_pool_destroy(p);
}

// ---------------------------------------------------------------------------
// Named extra keys (kvc_prefix_config::extra_key_names, 0.4; docs/prefix-cache.md)

namespace {

const uint8_t kNamedSeed[32] = {9, 8, 7};

// A pool of make_pool's geometry whose prefix cache declares `names`.
kvc_pool *make_named_pool(const std::vector<const char *> &names, uint32_t bs = 4,
                          uint64_t blocks = 64, const uint8_t *seed = kNamedSeed, int verify = 1) {
  kvc_pool *p = nullptr;
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = 2;
  c.num_q_heads = c.num_kv_heads = 2;
  c.head_dim = 4;
  c.block_size = bs;
  c.num_blocks = blocks;
  c.k_dtype = c.v_dtype = KVC_DTYPE_F32;
  CHECK_OK(kvc_pool_create(&c, &p));
  kvc_prefix_config pc;
  kvc_prefix_config_init(&pc);
  pc.verify_tokens = static_cast<uint32_t>(verify);
  pc.seed_set = 1;
  std::memcpy(pc.seed, seed, 32);
  pc.extra_key_names = names.data();
  pc.n_extra_key_names = static_cast<uint32_t>(names.size());
  CHECK_OK(kvc_pool_enable_prefix_cache(p, &pc));
  return p;
}

// One value per declared name, in declaration order ("" = none).
std::vector<kvc_prefix_extra> values(const std::vector<const char *> &v) {
  std::vector<kvc_prefix_extra> out;
  for (const char *s : v) out.push_back({s, std::strlen(s)});
  return out;
}

std::vector<uint8_t> named_keys(kvc_pool *p, const std::vector<int32_t> &t,
                                const std::vector<const char *> &v) {
  const std::vector<kvc_prefix_extra> ex = values(v);
  return keys_of(p, t, ex.data(), static_cast<uint32_t>(ex.size()));
}

bool message_has(const char *what) {
  return std::strstr(kvc_last_error_message(), what) != nullptr;
}

}  // namespace

// Tenant "salt=x" and adapter "adapter=x" never share a key or a block: not
// in one pool (lookup, attach, insert, partial reuse), not between a pool
// declaring only "salt" and one declaring only "adapter" (positionally their
// values would sit in the same place), and not with the positional form.
KVTEST(named_keys_salt_vs_adapter) {
  kvc_pool *p = make_named_pool({"salt", "adapter"});
  const std::vector<int32_t> t = range(1, 13);
  CHECK(named_keys(p, t, {"x", ""}) != named_keys(p, t, {"", "x"}));
  const std::vector<kvc_prefix_extra> salt_x = values({"x", ""}), adapter_x = values({"", "x"});
  request(p, 1, t, false, salt_x.data(), 2);  // insert under salt=x
  CHECK(lookup(p, range(1, 14), salt_x.data(), 2).hit_tokens == 12);
  const kvc_prefix_result ra = lookup(p, range(1, 14), adapter_x.data(), 2, KVC_PREFIX_PARTIAL);
  CHECK(ra.hit_tokens == 0 && ra.partial_tokens == 0);
  kvc_prefix_result r;
  r.struct_size = sizeof r;
  CHECK_OK(
      kvc_prefix_attach(p, 2, t.data(), t.size(), adapter_x.data(), 2, KVC_PREFIX_PARTIAL, &r));
  CHECK(r.hit_tokens == 0 && r.partial_tokens == 0);
  CHECK_OK(kvc_prefix_attach(p, 3, t.data(), t.size(), salt_x.data(), 2, 0, &r));
  CHECK(r.hit_tokens == 8);  // at most n - 1 tokens: the last block is computed
  // The same tokens computed under adapter=x are other blocks, not "already registered".
  const uint64_t registered = stats(p).registered_blocks;
  CHECK(request(p, 4, t, true, adapter_x.data(), 2) == 0);
  CHECK(stats(p).registered_blocks == registered + 3);
  CHECK(lookup(p, range(1, 14), adapter_x.data(), 2).hit_tokens == 12);
  CHECK(lookup(p, range(1, 14), salt_x.data(), 2).hit_tokens == 12);
  CHECK(consistent(p));
  kvc_pool *ps = make_named_pool({"salt"}), *pa = make_named_pool({"adapter"});
  kvc_pool *legacy = make_pool(4, 64, 2, kNamedSeed);
  const kvc_prefix_extra x = {"x", 1};
  CHECK(named_keys(ps, t, {"x"}) != named_keys(pa, t, {"x"}));
  CHECK(named_keys(ps, t, {"x"}) == named_keys(p, t, {"x", ""}));
  CHECK(named_keys(pa, t, {"x"}) == named_keys(p, t, {"", "x"}));
  CHECK(named_keys(ps, t, {"x"}) != keys_of(legacy, t, &x, 1));
  CHECK(named_keys(pa, t, {"x"}) != keys_of(legacy, t, &x, 1));
  for (kvc_pool *z : {p, ps, pa, legacy}) kvc_pool_destroy(z);
}

// The key depends only on the assignment {name: non-empty value}: another
// declaration order, or a declared name left empty, gives the same keys;
// with no value at all a call has the keys of a pool without names and
// without extra keys. Every other assignment differs.
KVTEST(named_keys_order_and_empty_names) {
  kvc_pool *a = make_named_pool({"salt", "adapter"});
  kvc_pool *b = make_named_pool({"adapter", "media", "salt"});
  kvc_pool *legacy = make_pool(4, 64, 2, kNamedSeed);
  const std::vector<int32_t> t = range(40, 52);
  const std::vector<uint8_t> k = named_keys(a, t, {"tenant-1", "lora-7"});
  CHECK(k.size() == 3 * 32);
  CHECK(named_keys(b, t, {"lora-7", "", "tenant-1"}) == k);
  CHECK(named_keys(b, t, {"lora-7", "img", "tenant-1"}) != k);  // one more value
  CHECK(named_keys(b, t, {"tenant-1", "", "lora-7"}) != k);     // values swapped between names
  CHECK(named_keys(a, t, {"tenant-1", ""}) == named_keys(b, t, {"", "", "tenant-1"}));
  CHECK(named_keys(a, t, {"tenant-1", ""}) != k);
  CHECK(named_keys(a, t, {"", ""}) == keys_of(legacy, t));
  CHECK(named_keys(b, t, {"", "", ""}) == keys_of(legacy, t));
  // Lengths are encoded: moving a byte between two values changes the key.
  CHECK(named_keys(a, t, {"ab", "c"}) != named_keys(a, t, {"a", "bc"}));
  // In the pool: registered under one order's values, found under the same assignment only.
  const std::vector<kvc_prefix_extra> ex = values({"tenant-1", "lora-7"}),
                                      only_salt = values({"tenant-1", ""});
  request(a, 1, t, false, ex.data(), 2);
  CHECK(lookup(a, range(40, 53), ex.data(), 2).hit_tokens == 12);
  CHECK(lookup(a, range(40, 53), only_salt.data(), 2).hit_tokens == 0);
  for (kvc_pool *z : {a, b, legacy}) kvc_pool_destroy(z);
}

// A call with another number of values than the pool declares names is
// refused (KVC_ERR_INVALID_ARGUMENT, the message names them) and changes
// nothing: no sequence attached, no block registered, no counter moved.
KVTEST(named_keys_wrong_count) {
  kvc_pool *p = make_named_pool({"salt", "adapter"});
  const std::vector<int32_t> t = range(1, 13);
  const std::vector<kvc_prefix_extra> two = values({"x", ""}), three = values({"x", "", "z"});
  request(p, 1, t, false, two.data(), 2);
  const kvc_prefix_stats before = stats(p);
  kvc_prefix_result r;
  r.struct_size = sizeof r;
  for (uint32_t n : {0u, 1u, 3u}) {
    const kvc_prefix_extra *ex = n ? three.data() : nullptr;
    CHECK_STATUS(kvc_prefix_lookup(p, t.data(), t.size(), ex, n, 0, &r), KVC_ERR_INVALID_ARGUMENT);
    CHECK(message_has("2 extra-key names (salt, adapter)"));
    CHECK(message_has(("got " + std::to_string(n)).c_str()));
    CHECK_STATUS(kvc_prefix_attach(p, 7, t.data(), t.size(), ex, n, 0, &r),
                 KVC_ERR_INVALID_ARGUMENT);
    uint64_t len = 0;
    CHECK_STATUS(kvc_seq_length(p, 7, &len), KVC_ERR_SEQ_NOT_FOUND);  // not created
    uint64_t added = 99;
    CHECK_STATUS(kvc_prefix_insert(p, 1, t.data(), t.size(), ex, n, &added),
                 KVC_ERR_INVALID_ARGUMENT);
    CHECK(added == 99);
    uint8_t keys[3 * 32];
    size_t ks = 0;
    CHECK_STATUS(kvc_prefix_keys(p, t.data(), t.size(), ex, n, keys, sizeof keys, &ks),
                 KVC_ERR_INVALID_ARGUMENT);
  }
  const kvc_prefix_stats after = stats(p);
  CHECK(after.registered_blocks == before.registered_blocks &&
        after.stored_total == before.stored_total);
  CHECK(after.queried_tokens == before.queried_tokens && after.hit_tokens == before.hit_tokens);
  CHECK(lookup(p, range(1, 14), two.data(), 2).hit_tokens == 12);  // still there, still found
  CHECK(consistent(p));
  kvc_pool_destroy(p);
}

// Bad declarations are refused with a clear message and leave the prefix
// cache off (a later valid enable works); the limits themselves are accepted.
KVTEST(named_keys_bad_declarations) {
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = 1;
  c.num_q_heads = c.num_kv_heads = 1;
  c.head_dim = 4;
  c.block_size = 4;
  c.num_blocks = 8;
  kvc_pool *p = nullptr;
  CHECK_OK(kvc_pool_create(&c, &p));
  kvc_prefix_config pc;
  kvc_prefix_config_init(&pc);
  CHECK(pc.extra_key_names == nullptr && pc.n_extra_key_names == 0);  // default: positional
  const std::string long_name(KVC_PREFIX_MAX_EXTRA_KEY_NAME_BYTES + 1, 'n');
  std::vector<std::string> many_s;
  for (int i = 0; i <= KVC_PREFIX_MAX_EXTRA_KEY_NAMES; ++i)
    many_s.push_back("name" + std::to_string(i));
  std::vector<const char *> many;
  for (const std::string &s : many_s) many.push_back(s.c_str());
  struct Bad {
    std::vector<const char *> names;
    uint32_t n;
    kvc_status want;
    const char *message;
  };
  const std::vector<Bad> bad = {
      {{"salt", ""}, 2, KVC_ERR_INVALID_ARGUMENT, "extra_key_names[1] is empty"},
      {{"salt", long_name.c_str()},
       2,
       KVC_ERR_INVALID_ARGUMENT,
       "extra_key_names[1] is longer than 64 bytes"},
      {{"salt", "adapter", "salt"},
       3,
       KVC_ERR_INVALID_ARGUMENT,
       "extra_key_names[2] \"salt\" is declared twice"},
      {many, static_cast<uint32_t>(many.size()), KVC_ERR_INVALID_ARGUMENT,
       "n_extra_key_names 65: at most 64"},
      {{"salt", nullptr}, 2, KVC_ERR_NULL_POINTER, "extra_key_names[1] is NULL"},
      {{}, 1, KVC_ERR_NULL_POINTER, "extra_key_names"},
  };
  const int32_t t[5] = {1, 2, 3, 4, 5};
  for (const Bad &b : bad) {
    pc.extra_key_names = b.names.empty() ? nullptr : b.names.data();
    pc.n_extra_key_names = b.n;
    CHECK_STATUS(kvc_pool_enable_prefix_cache(p, &pc), b.want);
    CHECKF(message_has(b.message), "want \"%s\"", b.message);
    kvc_prefix_result r;
    r.struct_size = sizeof r;
    CHECK_STATUS(kvc_prefix_lookup(p, t, 5, nullptr, 0, 0, &r),
                 KVC_ERR_INVALID_ARGUMENT);  // still off
    CHECK(message_has("not enabled"));
  }
  // At the limits: 64 names of 64 bytes.
  std::vector<std::string> max_s;
  for (int i = 0; i < KVC_PREFIX_MAX_EXTRA_KEY_NAMES; ++i) {
    std::string s(KVC_PREFIX_MAX_EXTRA_KEY_NAME_BYTES, 'a');
    s[0] = static_cast<char>('0' + i / 10);
    s[1] = static_cast<char>('0' + i % 10);
    max_s.push_back(s);
  }
  std::vector<const char *> max;
  for (const std::string &s : max_s) max.push_back(s.c_str());
  pc.extra_key_names = max.data();
  pc.n_extra_key_names = KVC_PREFIX_MAX_EXTRA_KEY_NAMES;
  CHECK_OK(kvc_pool_enable_prefix_cache(p, &pc));
  std::vector<kvc_prefix_extra> ex(KVC_PREFIX_MAX_EXTRA_KEY_NAMES, kvc_prefix_extra{"v", 1});
  kvc_prefix_result r;
  r.struct_size = sizeof r;
  CHECK_OK(kvc_prefix_lookup(p, t, 5, ex.data(), KVC_PREFIX_MAX_EXTRA_KEY_NAMES, 0, &r));
  // The names were copied: the caller's strings may go.
  for (std::string &s : max_s) s.assign(s.size(), 'z');
  CHECK_OK(kvc_prefix_lookup(p, t, 5, ex.data(), KVC_PREFIX_MAX_EXTRA_KEY_NAMES, 0, &r));
  kvc_pool_destroy(p);
  // An older caller (0.3 struct, without the names) still gets positional keys.
  CHECK_OK(kvc_pool_create(&c, &p));
  kvc_prefix_config_init(&pc);
  pc.struct_size = offsetof(kvc_prefix_config, extra_key_names);
  CHECK_OK(kvc_pool_enable_prefix_cache(p, &pc));
  const kvc_prefix_extra three[3] = {{"a", 1}, {"b", 1}, {"c", 1}};
  CHECK_OK(kvc_prefix_lookup(p, t, 5, three, 3, 0, &r));
  kvc_pool_destroy(p);
}

// The named encoding of docs/prefix-cache.md byte for byte, recomputed here
// with OpenSSL and xxHash directly: "KVCN" | parent | u32 B | tokens | u32 m
// | m x (u64 len | name | u64 size | value), the names with a value sorted.
KVTEST(named_keys_spec_encoding) {
  const std::vector<int32_t> t = {10, 11, 12, 13, 14, 15, 16, 17};
  for (int h = 0; h < 2; ++h) {
    kvc_pool_config c;
    kvc_pool_config_init(&c);
    c.num_layers = 1;
    c.num_q_heads = c.num_kv_heads = 2;
    c.head_dim = 4;
    c.block_size = 4;
    c.num_blocks = 16;
    c.k_dtype = c.v_dtype = KVC_DTYPE_F32;
    kvc_pool *legacy = nullptr, *p = nullptr;
    CHECK_OK(kvc_pool_create(&c, &legacy));
    CHECK_OK(kvc_pool_create(&c, &p));
    kvc_prefix_config pc;
    kvc_prefix_config_init(&pc);
    pc.hash = h ? KVC_PREFIX_HASH_XXH3_128 : KVC_PREFIX_HASH_SHA256;
    pc.seed_set = 1;
    pc.model_id = "stories260K";
    pc.tokenizer_id = "tok512";
    CHECK_OK(kvc_pool_enable_prefix_cache(legacy, &pc));
    const char *names[] = {"salt", "adapter", "media"};
    pc.extra_key_names = names;
    pc.n_extra_key_names = 3;
    CHECK_OK(kvc_pool_enable_prefix_cache(p, &pc));
    const size_t ks = h ? 16 : 32;
    auto digest = [&](const std::vector<uint8_t> &b) {
      std::vector<uint8_t> d(ks);
      if (h == 0) {
        SHA256(b.data(), b.size(), d.data());
      } else {
        XXH128_canonical_t cn;
        XXH128_canonicalFromHash(&cn, XXH3_128bits(b.data(), b.size()));
        std::memcpy(d.data(), cn.digest, 16);
      }
      return d;
    };
    auto u32 = [](std::vector<uint8_t> &v, uint32_t x) {
      for (int i = 0; i < 4; ++i) v.push_back(static_cast<uint8_t>(x >> (8 * i)));
    };
    auto u64 = [](std::vector<uint8_t> &v, uint64_t x) {
      for (int i = 0; i < 8; ++i) v.push_back(static_cast<uint8_t>(x >> (8 * i)));
    };
    auto str = [&](std::vector<uint8_t> &v, const char *s) {
      u64(v, std::strlen(s));
      v.insert(v.end(), s, s + std::strlen(s));
    };
    // The root (names are not in it): "KVCP" | u32 1 | u32 hash | seed | fp | model | tokenizer.
    std::vector<uint8_t> root_in = {'K', 'V', 'C', 'P', 1, 0, 0, 0, static_cast<uint8_t>(h),
                                    0,   0,   0};
    root_in.insert(root_in.end(), 32, 0);  // seed: 32 zero bytes
    std::vector<uint8_t> fp;
    for (uint32_t x : {1u, 2u, 2u, 4u, 4u, 0u, 0u, 0u}) u32(fp, x);
    for (int part = 0; part < 2; ++part) {
      for (int i = 0; i < 6; ++i) u32(fp, 0);
      u64(fp, 0);
    }
    u32(fp, 0);
    u32(fp, 1);
    u64(fp, 0);
    u64(root_in, fp.size());
    root_in.insert(root_in.end(), fp.begin(), fp.end());
    str(root_in, "stories260K");
    str(root_in, "tok512");
    const std::vector<uint8_t> root = digest(root_in);
    // Legacy block 1 without extras: checks the root against the legacy pool.
    std::vector<uint8_t> lb = {'K', 'V', 'C', 'B'};
    lb.insert(lb.end(), root.begin(), root.end());
    u32(lb, 4);
    for (int i = 0; i < 4; ++i) u32(lb, static_cast<uint32_t>(t[i]));
    u32(lb, 0);
    const std::vector<uint8_t> legacy_keys = keys_of(legacy, t);
    CHECK(legacy_keys.size() == 2 * ks &&
          std::memcmp(legacy_keys.data(), digest(lb).data(), ks) == 0);
    // Named: salt "abc", adapter "lora-7", media empty (left out); "adapter" sorts first.
    std::vector<uint8_t> parent = root, want;
    for (int b = 0; b < 2; ++b) {
      std::vector<uint8_t> nb = {'K', 'V', 'C', 'N'};
      nb.insert(nb.end(), parent.begin(), parent.end());
      u32(nb, 4);
      for (int i = 0; i < 4; ++i) u32(nb, static_cast<uint32_t>(t[b * 4 + i]));
      u32(nb, 2);
      str(nb, "adapter");
      str(nb, "lora-7");
      str(nb, "salt");
      str(nb, "abc");
      parent = digest(nb);
      want.insert(want.end(), parent.begin(), parent.end());
    }
    CHECK(named_keys(p, t, {"abc", "lora-7", ""}) == want);
    CHECK(named_keys(p, t, {"", "", ""}) == legacy_keys);
    kvc_pool_destroy(p);
    kvc_pool_destroy(legacy);
  }
}

// The named-key test vectors of docs/prefix-cache.md (the pool of
// test_vectors, names declared "salt", "adapter").
KVTEST(named_keys_test_vectors) {
  struct Vec {
    std::vector<const char *> v;
    const char *want[2][2];  // [hash][block]
  };
  const std::vector<Vec> vecs = {
      {{"abc", ""},
       {{"e64bb76e36ae1605cdf852ca4c55a412c413acd709fc73ad8876d620998fada4",
         "936f379f3b88aa60754094a587dbe45fcfda06a911a0f8db0662c4265d4df7c1"},
        {"8c341104630584d34cb3bfcc52f1e250", "b42b16770f635e4f48846d31611435aa"}}},
      {{"", "abc"},
       {{"a56f4e5afbc3ed88b60f0b1b9a5693035b86800e3f7268c7929332a5cc32effa",
         "721a8ad653e6211764ee093883b4d4de52743e9ae29e0700f407b29735864edb"},
        {"f19397bda2fd33b317405de7bcdb1792", "c2e8406fbcd363ea0d168bae21573eaa"}}},
      {{"abc", "lora-7"},
       {{"4b39a455995209a14f0fc08fe5a3dded304a1a2290be2ab53f3c347aff3f6843",
         "7ec33c152d328c65c85f4917878cc9b696ea528441ffde46065b21b4a04e19cb"},
        {"5d0bbebfe355fb6347388c74c4c471f8", "b9da7c6ead2be0cb57d196cc99b7f2ac"}}},
      {{"", ""},
       {{"fb6ca8a8e2808f267ed596bf3760298379fb27898f5afb246bdda2ac6aa2fa0a",
         "18e0c8b6c5881edca87e1750a4a23ed446f3467d7118802b8cc540c8467ee05b"},
        {"8e893e0ef814970d95d8517e4ef47c27", "38fab926b888a0d5020b457068e30377"}}},
  };
  for (int h = 0; h < 2; ++h) {
    kvc_pool_config c;
    kvc_pool_config_init(&c);
    c.num_layers = 1;
    c.num_q_heads = c.num_kv_heads = 2;
    c.head_dim = 4;
    c.block_size = 4;
    c.num_blocks = 16;
    c.k_dtype = c.v_dtype = KVC_DTYPE_F32;
    kvc_pool *p = nullptr;
    CHECK_OK(kvc_pool_create(&c, &p));
    kvc_prefix_config pc;
    kvc_prefix_config_init(&pc);
    pc.hash = h ? KVC_PREFIX_HASH_XXH3_128 : KVC_PREFIX_HASH_SHA256;
    pc.seed_set = 1;
    pc.model_id = "stories260K";
    pc.tokenizer_id = "tok512";
    const char *names[] = {"salt", "adapter"};
    pc.extra_key_names = names;
    pc.n_extra_key_names = 2;
    CHECK_OK(kvc_pool_enable_prefix_cache(p, &pc));
    const size_t ks = h ? 16 : 32;
    for (const Vec &vec : vecs) {
      const std::vector<uint8_t> k = named_keys(p, range(10, 18), vec.v);
      CHECK(k.size() == 2 * ks);
      for (int b = 0; b < 2 && k.size() == 2 * ks; ++b) {
        char hex[65] = {0};
        for (size_t i = 0; i < ks; ++i) std::snprintf(hex + 2 * i, 3, "%02x", k[b * ks + i]);
        if (std::string(hex) != vec.want[h][b])
          std::fprintf(stderr, "hash %d salt '%s' adapter '%s' block %d: %s\n", h, vec.v[0],
                       vec.v[1], b, hex);
        CHECK(std::string(hex) == vec.want[h][b]);
      }
    }
    kvc_pool_destroy(p);
  }
}

int main(int argc, char **argv) { return kvtest_main(argc, argv); }
