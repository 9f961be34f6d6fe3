// Helpers of the attention tests (test_attention.cpp, test_attention_int8.cpp):
// pools of a geometry, per-token codecs, random sequences and the dense
// float64 reference.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "../whitebox.h"

namespace attn_test {

struct Geo {
  uint32_t layers = 2, hq = 8, hkv = 2, hd = 16, bs = 16;
};

inline kvc_pool *make_pool(const Geo &g, kvc_dtype kd = KVC_DTYPE_F32, const kvc_codec *kc = nullptr,
                    const kvc_codec *vc = nullptr, uint32_t residual = 0, uint64_t blocks = 256,
                    uint64_t residual_blocks = 0) {
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = g.layers;
  c.num_q_heads = g.hq;
  c.num_kv_heads = g.hkv;
  c.head_dim = g.hd;
  c.block_size = g.bs;
  c.num_blocks = blocks;
  c.k_dtype = c.v_dtype = kd;
  c.k_codec = kc;
  c.v_codec = vc;
  c.residual_window = residual;
  c.num_residual_blocks = residual_blocks;
  kvc_pool *p = nullptr;
  CHECK_OK(kvc_pool_create(&c, &p));
  return p;
}

// A per-token integer (or fp8) codec: one scale (and zero point when
// asymmetric) per token and KV head.
inline kvc_codec per_token_codec(kvc_dtype dt, bool asym, kvc_dtype scale = KVC_DTYPE_F32) {
  kvc_codec c;
  kvc_codec_init(&c);
  c.dtype = dt;
  c.granularity = KVC_SCALE_PER_TOKEN;
  c.asymmetric = asym ? 1u : 0u;
  c.scale_dtype = scale;
  return c;
}

inline std::mt19937 &rng() {
  static std::mt19937 r(1234);
  return r;
}
inline std::vector<float> randn(size_t n, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float &x : v) x = d(rng());
  return v;
}

// Appends n tokens of random K/V to every layer; returns them ([layer] -> rows).
struct Seq {
  std::vector<std::vector<float>> k, v;  // per layer, [n][hkv][hd]
};
inline Seq fill(kvc_pool *p, const Geo &g, uint64_t id, uint64_t n) {
  Seq s;
  s.k.resize(g.layers);
  s.v.resize(g.layers);
  CHECK_OK(kvc_seq_create(p, id));
  if (n == 0) return s;
  CHECK_OK(kvc_seq_reserve(p, id, n, nullptr));
  for (uint32_t l = 0; l < g.layers; ++l) {
    s.k[l] = randn(n * g.hkv * g.hd);
    s.v[l] = randn(n * g.hkv * g.hd);
    CHECK_OK(kvc_append(p, id, l, 0, n, s.k[l].data(), s.v[l].data(), KVC_DTYPE_F32));
  }
  return s;
}

// Dense float64 attention of one query row over tokens [0, vis) of k, v;
// mask (optional) drops tokens.
inline void reference(const Geo &g, const float *q, const std::vector<float> &k,
               const std::vector<float> &v, uint64_t vis, float scale, std::vector<double> &out,
               std::vector<double> &lse, std::vector<double> *probs = nullptr,
               const std::vector<char> *mask = nullptr) {
  out.assign(g.hq * g.hd, 0.0);
  lse.assign(g.hq, -std::numeric_limits<double>::infinity());
  if (probs) probs->assign(vis * g.hkv, 0.0);
  const uint32_t grp = g.hq / g.hkv;
  for (uint32_t h = 0; h < g.hq; ++h) {
    const uint32_t kvh = h / grp;
    std::vector<double> s(vis);
    double mx = -std::numeric_limits<double>::infinity();
    for (uint64_t t = 0; t < vis; ++t) {
      if (mask && !(*mask)[t]) continue;
      double d = 0;
      for (uint32_t i = 0; i < g.hd; ++i)
        d += static_cast<double>(q[h * g.hd + i]) * k[(t * g.hkv + kvh) * g.hd + i];
      s[t] = d * scale;
      mx = std::max(mx, s[t]);
    }
    if (mx == -std::numeric_limits<double>::infinity()) continue;
    double sum = 0;
    for (uint64_t t = 0; t < vis; ++t)
      if (!mask || (*mask)[t]) sum += std::exp(s[t] - mx);
    lse[h] = mx + std::log(sum);
    for (uint64_t t = 0; t < vis; ++t) {
      if (mask && !(*mask)[t]) continue;
      const double pr = std::exp(s[t] - mx) / sum;
      if (probs) (*probs)[t * g.hkv + kvh] += pr;
      for (uint32_t i = 0; i < g.hd; ++i) out[h * g.hd + i] += pr * v[(t * g.hkv + kvh) * g.hd + i];
    }
  }
}

// Largest |a - b| relative to the largest |b| (the 1e-5 criterion).
inline double rel_err(const float *a, const std::vector<double> &b) {
  double err = 0, mag = 1e-30;
  for (size_t i = 0; i < b.size(); ++i) {
    err = std::max(err, std::fabs(a[i] - b[i]));
    mag = std::max(mag, std::fabs(b[i]));
  }
  return err / mag;
}

inline kvc_attention_params params(const Geo &g) {
  kvc_attention_params a;
  kvc_attention_params_init(&a);
  a.num_q_heads = g.hq;
  return a;
}

}  // namespace attn_test

using namespace attn_test;
