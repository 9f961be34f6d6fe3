// Helpers of the head-wise pool tests (test_headwise.cpp, test_duo.cpp): pools
// with or without KVC_POOL_HEADWISE, Gaussian data appended to every layer,
// each head's positions and a float64 reference of attention over each head's
// own kept tokens.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../whitebox.h"
#include "evict_util.h"

namespace headwise_util {

using evict_util::Geo;

inline std::mt19937 g_rng(11);

inline kvc_pool *make(const Geo &g, bool headwise, const kvc_codec *codec = nullptr,
               uint64_t blocks = 1024, kvc_status want = KVC_OK) {
  kvc_pool_config c = evict_util::pool_config(g, blocks);
  if (codec) c.k_codec = c.v_codec = codec;
  if (headwise) c.flags |= KVC_POOL_HEADWISE;
  kvc_pool *p = nullptr;
  CHECK_STATUS(kvc_pool_create(&c, &p), want);
  return p;
}

// n tokens of Gaussian K/V ([n][hkv][hd]) appended to every layer of a new sequence.
struct Data {
  std::vector<float> k, v;
};
inline Data fill(kvc_pool *p, const Geo &g, uint64_t id, uint64_t n, const Data *same = nullptr) {
  Data d = same ? *same
                : Data{evict_util::randn(g_rng, n * g.hkv * g.hd),
                       evict_util::randn(g_rng, n * g.hkv * g.hd)};
  CHECK_OK(kvc_seq_create(p, id));
  CHECK_OK(kvc_seq_reserve(p, id, n, nullptr));
  for (uint32_t l = 0; l < g.layers; ++l)
    CHECK_OK(kvc_append(p, id, l, 0, n, d.k.data(), d.v.data(), KVC_DTYPE_F32));
  return d;
}

inline std::vector<int32_t> head_positions(kvc_pool *p, uint64_t id, uint32_t layer, uint32_t head) {
  uint64_t n = 0;
  CHECK_OK(kvc_seq_head_tokens(p, id, layer, head, &n));
  std::vector<int32_t> pos(n);
  if (n)
    CHECK_OK(kvc_gather_head(p, id, layer, head, 0, n, nullptr, nullptr, KVC_DTYPE_F32,
                             pos.data()));
  return pos;
}

inline uint64_t in_use(kvc_pool *p) {
  kvc_stats s;
  kvc_stats_init(&s);
  CHECK_OK(kvc_pool_stats(p, &s));
  return s.bytes_in_use;
}

// Decode attention of one query row [hq][hd] in float64 where KV head h sees
// only the positions kept[h] of the data d ([n][hkv][hd]).
inline std::vector<double> masked_attention(const Geo &g, const std::vector<float> &q, const Data &d,
                                     const std::vector<std::vector<int32_t>> &kept) {
  const uint32_t grp = g.hq / g.hkv;
  std::vector<double> out(g.hq * g.hd, 0.0);
  for (uint32_t j = 0; j < g.hq; ++j) {
    const uint32_t h = j / grp;
    std::vector<double> z;
    for (int32_t t : kept[h]) {
      double dot = 0.0;
      for (uint32_t a = 0; a < g.hd; ++a)
        dot += double(q[j * g.hd + a]) * d.k[(t * g.hkv + h) * g.hd + a];
      z.push_back(dot / std::sqrt(double(g.hd)));
    }
    const double mx = *std::max_element(z.begin(), z.end());
    double sum = 0.0;
    for (double &x : z) sum += (x = std::exp(x - mx));
    for (size_t i = 0; i < kept[h].size(); ++i)
      for (uint32_t a = 0; a < g.hd; ++a)
        out[j * g.hd + a] += z[i] / sum * d.v[(kept[h][i] * g.hkv + h) * g.hd + a];
  }
  return out;
}

inline kvc_policy *policy(kvc_policy_kind kind, uint64_t budget, kvc_head_budget hb, double floor = 0.2,
                   uint32_t sinks = 0, uint32_t recent = 0) {
  kvc_policy_config c;
  kvc_policy_config_init(&c);
  c.kind = kind;
  c.budget_tokens = budget;
  c.sink_tokens = sinks;
  c.recent_tokens = recent;
  c.head_budget = hb;
  c.head_floor = floor;
  kvc_policy *pol = nullptr;
  CHECK_OK(kvc_policy_create(&c, &pol));
  return pol;
}

}  // namespace headwise_util
