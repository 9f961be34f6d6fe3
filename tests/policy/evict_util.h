// Helpers shared by the eviction tests of tests/policy (test_expected.cpp,
// test_kvzip.cpp): a small f32 pool, Gaussian data, sequences filled with it,
// and the positions a layer still holds.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "../whitebox.h"

namespace evict_util {

struct Geo {
  uint32_t layers = 1, hq = 4, hkv = 2, hd = 8, bs = 4;
};

// An f32 pool's configuration of this geometry.
inline kvc_pool_config pool_config(const Geo &g, uint64_t blocks = 512) {
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = g.layers;
  c.num_q_heads = g.hq;
  c.num_kv_heads = g.hkv;
  c.head_dim = g.hd;
  c.block_size = g.bs;
  c.num_blocks = blocks;
  c.k_dtype = c.v_dtype = KVC_DTYPE_F32;
  return c;
}

inline kvc_pool *make_pool(const Geo &g, kvc_rope_style rope = KVC_ROPE_NONE,
                           uint64_t blocks = 512) {
  kvc_pool_config c = pool_config(g, blocks);
  c.rope_style = rope;
  c.rope_theta = 10000.0;
  kvc_pool *p = nullptr;
  CHECK_OK(kvc_pool_create(&c, &p));
  return p;
}

inline std::vector<float> randn(std::mt19937 &rng, size_t n, float mean = 0.0f) {
  std::normal_distribution<float> d(mean, 1.0f);
  std::vector<float> v(n);
  for (float &x : v) x = d(rng);
  return v;
}

struct Seq {
  std::vector<float> k, v;  // [n][hkv][hd], the same on every layer
};

// Creates sequence `id` with n tokens of Gaussian K/V, the same on every layer.
inline Seq fill(kvc_pool *p, const Geo &g, std::mt19937 &rng, uint64_t id, uint64_t n) {
  Seq s{randn(rng, n * g.hkv * g.hd), randn(rng, n * g.hkv * g.hd)};
  CHECK_OK(kvc_seq_create(p, id));
  CHECK_OK(kvc_seq_reserve(p, id, n, nullptr));
  for (uint32_t l = 0; l < g.layers; ++l)
    CHECK_OK(kvc_append(p, id, l, 0, n, s.k.data(), s.v.data(), KVC_DTYPE_F32));
  return s;
}

// The positions layer `layer` of sequence `id` holds, in cache order.
inline std::vector<int32_t> positions(kvc_pool *p, uint64_t id, uint32_t layer) {
  uint64_t n = 0;
  CHECK_OK(kvc_seq_layer_tokens(p, id, layer, &n));
  std::vector<int32_t> pos(n);
  if (n) CHECK_OK(kvc_gather(p, id, layer, 0, n, nullptr, nullptr, KVC_DTYPE_F32, pos.data()));
  return pos;
}

}  // namespace evict_util
