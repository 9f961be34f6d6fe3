// Helpers of the pool-level tier tests (test_offload.cpp, test_redis.cpp): a
// small f32 pool with the prefix cache (fixed seed), K/V that are a function of
// a token's id and position (so a prompt's prefix has the same bytes in every
// pool and process), and checks of what a sequence holds.
#pragma once
#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "../whitebox.h"
#include "api/internal.h"
#include "core/offload.h"
#include "core/pool.h"

namespace tier_test {

constexpr uint32_t kLayers = 2, kHeads = 2, kDim = 8, kBs = 4;
constexpr uint64_t kRow = kHeads * kDim;  // floats per token and layer

// A pool of the pool_util geometry (kLayers x kHeads x kDim) with optional
// codecs, block size, flags and block count; prefix cache with pool_util's seed.
inline kvc_pool *make_pool(uint64_t blocks, const kvc_codec *kc = nullptr, const kvc_codec *vc = nullptr, uint32_t bs = kBs,
                           uint32_t flags = 0, const char *model = "m1") {
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = kLayers;
  c.num_q_heads = kHeads;
  c.num_kv_heads = kHeads;
  c.head_dim = kDim;
  c.block_size = bs;
  c.num_blocks = blocks;
  c.k_dtype = KVC_DTYPE_F32;
  c.v_dtype = KVC_DTYPE_F32;
  c.k_codec = kc;
  c.v_codec = vc;
  c.flags = flags;
  kvc_pool *p = nullptr;
  const kvc_status st = kvc_pool_create(&c, &p);
  if (st != KVC_OK) {
    std::fprintf(stderr, "pool create: %s\n", kvc_last_error_message());
    std::abort();
  }
  kvc_prefix_config pc;
  kvc_prefix_config_init(&pc);
  pc.seed_set = 1;
  for (int i = 0; i < 32; ++i) pc.seed[i] = static_cast<uint8_t>(i * 7 + 1);
  pc.model_id = model;
  CHECK_OK(kvc_pool_enable_prefix_cache(p, &pc));
  return p;
}

// The same, owned.
struct Pool {
  kvc_pool *p = nullptr;
  explicit Pool(uint64_t blocks, const char *model = "m1") : p(make_pool(blocks, nullptr, nullptr, kBs, 0, model)) {}
  ~Pool() { kvc_pool_destroy(p); }
  operator kvc_pool *() const { return p; }
};

// K / V of a token: a function of its id, position, layer and part only, so a
// prompt's prefix has the same bytes in every pool.
inline float value(int32_t tok, uint64_t pos, uint32_t layer, int kv, uint64_t j) {
  return static_cast<float>((tok * 31 + static_cast<int64_t>(pos) * 7 + layer * 13 + kv * 5 + static_cast<int64_t>(j)) % 97) / 8.0f;
}

inline std::vector<int32_t> prompt(int32_t base, uint64_t n) {
  std::vector<int32_t> t(n);
  for (uint64_t i = 0; i < n; ++i) t[i] = base + static_cast<int32_t>(i * 3 % 11);
  return t;
}

inline kvc_prefix_extra salt_of(const char *s) { return kvc_prefix_extra{s, std::strlen(s)}; }

// Creates seq `id` holding tokens (computed K/V) and registers its blocks.
inline void write_seq(kvc_pool *p, uint64_t id, const std::vector<int32_t> &t, const kvc_prefix_extra *ex = nullptr,
               uint32_t nx = 0, bool garbage = false) {
  CHECK_OK(kvc_seq_create(p, id));
  CHECK_OK(kvc_seq_reserve(p, id, t.size(), nullptr));
  std::vector<float> k(t.size() * kRow), v(t.size() * kRow);
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint64_t i = 0; i < t.size(); ++i)
      for (uint64_t j = 0; j < kRow; ++j) {
        k[i * kRow + j] = garbage ? -1.0f - static_cast<float>(id) : value(t[i], i, l, 0, j);
        v[i * kRow + j] = garbage ? -2.0f - static_cast<float>(id) : value(t[i], i, l, 1, j);
      }
    CHECK_OK(kvc_append(p, id, l, 0, t.size(), k.data(), v.data(), KVC_DTYPE_F32));
  }
  if (!garbage) CHECK_OK(kvc_prefix_insert(p, id, t.data(), t.size(), ex, nx, nullptr));
}

// The first n tokens of seq `id` hold exactly the computed K/V of t.
inline bool seq_matches(kvc_pool *p, uint64_t id, const std::vector<int32_t> &t, uint64_t n) {
  if (n == 0) return true;
  std::vector<float> k(n * kRow), v(n * kRow);
  for (uint32_t l = 0; l < kLayers; ++l) {
    if (kvc_gather(p, id, l, 0, n, k.data(), v.data(), KVC_DTYPE_F32, nullptr) != KVC_OK) return false;
    for (uint64_t i = 0; i < n; ++i)
      for (uint64_t j = 0; j < kRow; ++j)
        if (k[i * kRow + j] != value(t[i], i, l, 0, j) || v[i * kRow + j] != value(t[i], i, l, 1, j)) return false;
  }
  return true;
}

inline bool seq_is_garbage(kvc_pool *p, uint64_t id, uint64_t n) {
  std::vector<float> k(n * kRow), v(n * kRow);
  for (uint32_t l = 0; l < kLayers; ++l) {
    if (kvc_gather(p, id, l, 0, n, k.data(), v.data(), KVC_DTYPE_F32, nullptr) != KVC_OK) return false;
    for (uint64_t i = 0; i < n * kRow; ++i)
      if (k[i] != -1.0f - static_cast<float>(id) || v[i] != -2.0f - static_cast<float>(id)) return false;
  }
  return true;
}

inline uint32_t add_host(kvc_pool *p, uint64_t cap = 1 << 20) {
  kvc_tier_config c;
  CHECK_OK(kvc_tier_config_init(&c, KVC_TIER_HOST));
  c.capacity_bytes = cap;
  uint32_t i = 99;
  CHECK_OK(kvc_pool_add_tier(p, &c, &i));
  return i;
}

inline uint32_t add_disk(kvc_pool *p, const std::string &dir, uint64_t cap = 1 << 24) {
  kvc_tier_config c;
  CHECK_OK(kvc_tier_config_init(&c, KVC_TIER_DISK));
  c.capacity_bytes = cap;
  c.path = dir.c_str();
  uint32_t i = 99;
  CHECK_OK(kvc_pool_add_tier(p, &c, &i));
  return i;
}

inline kvc_tier_stats tier_stats(kvc_pool *p, uint32_t i) {
  kvc_tier_stats s;
  kvc_tier_stats_init(&s);
  CHECK_OK(kvc_pool_tier_stats(p, i, &s));
  return s;
}

inline kvc_stats pool_stats(kvc_pool *p) {
  kvc_stats s;
  kvc_stats_init(&s);
  CHECK_OK(kvc_pool_stats(p, &s));
  return s;
}

inline kvc_prefix_result lookup(kvc_pool *p, const std::vector<int32_t> &t, const kvc_prefix_extra *ex = nullptr,
                         uint32_t nx = 0, uint32_t flags = 0) {
  kvc_prefix_result r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  CHECK_OK(kvc_prefix_lookup(p, t.data(), t.size(), ex, nx, flags, &r));
  return r;
}

// Takes every free and reclaimable block with garbage sequences (ids from
// `first`), so the pool's cached prefix blocks are reclaimed (demoted).
inline uint64_t squeeze(kvc_pool *p, uint64_t first) {
  uint64_t id = first;
  for (;;) {
    const kvc_stats s = pool_stats(p);
    if (s.blocks_free + s.blocks_cached < kLayers) break;
    std::vector<int32_t> t(kBs, 0);
    write_seq(p, id++, t, nullptr, 0, /*garbage=*/true);
  }
  return id;
}
inline void free_range(kvc_pool *p, uint64_t first, uint64_t end) {
  for (uint64_t id = first; id < end; ++id) CHECK_OK(kvc_seq_free(p, id));
}

inline bool invariants(kvc_pool *p) {
  const std::string e = kvc::api::core_pool(p).check_invariants();
  if (!e.empty()) std::fprintf(stderr, "invariant: %s\n", e.c_str());
  return e.empty();
}

// A fresh temporary folder, and its removal (recursive): tests/temp_dir.h.
inline std::string temp_dir(const char *name = "kvc_tier_test") {
  return kvtest::temp_dir(name);
}
using kvtest::remove_dir;

// A latch the test hooks wait on (a tier read that does not answer until released).
struct Gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  int waiting = 0;
  void wait() {
    std::unique_lock lk(m);
    ++waiting;
    cv.notify_all();
    cv.wait(lk, [&] { return open; });
  }
  void release() {
    std::lock_guard g(m);
    open = true;
    cv.notify_all();
  }
  bool wait_for_waiter(int ms) {
    std::unique_lock lk(m);
    return cv.wait_for(lk, std::chrono::milliseconds(ms), [&] { return waiting > 0; });
  }
};

// Clears the test hooks when a test ends, however it ends.
struct HooksReset {
  ~HooksReset() { kvc::core::set_test_hooks({}); }
};

}  // namespace tier_test
