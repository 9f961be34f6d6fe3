// Eviction (kvc_evict and the policies): budgets, exact kept sets on
// hand-made score patterns, compaction that frees blocks and keeps data
// bit-exact, forks left untouched, attention over the compacted cache equal
// to masked attention over the full one, RoPE re-rotation, auto-eviction,
// and bad input.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "../whitebox.h"
#include "api/internal.h"

namespace {

struct Geo {
  uint32_t layers = 2, hq = 4, hkv = 2, hd = 8, bs = 4;
};

kvc_pool *make_pool(const Geo &g, uint64_t blocks = 512, kvc_dtype kd = KVC_DTYPE_F32,
                    const kvc_codec *codec = nullptr, kvc_rope_style rope = KVC_ROPE_NONE,
                    uint32_t residual = 0, kvc_layout layout = KVC_LAYOUT_NHD) {
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = g.layers;
  c.num_q_heads = g.hq;
  c.num_kv_heads = g.hkv;
  c.head_dim = g.hd;
  c.block_size = g.bs;
  c.num_blocks = blocks;
  c.k_dtype = c.v_dtype = kd;
  c.k_codec = c.v_codec = codec;
  c.rope_style = rope;
  c.residual_window = residual;
  c.layout = layout;
  kvc_pool *p = nullptr;
  CHECK_OK(kvc_pool_create(&c, &p));
  return p;
}

std::mt19937 g_rng(99);
std::vector<float> randn(size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float &x : v) x = d(g_rng);
  return v;
}

// Sequence `id` with n tokens; token t's K/V values are t + small noise so a
// token is recognizable after compaction. Returns K per layer.
std::vector<std::vector<float>> fill(kvc_pool *p, const Geo &g, uint64_t id, uint64_t n) {
  std::vector<std::vector<float>> ks(g.layers);
  CHECK_OK(kvc_seq_create(p, id));
  CHECK_OK(kvc_seq_reserve(p, id, n, nullptr));
  for (uint32_t l = 0; l < g.layers; ++l) {
    std::vector<float> k = randn(n * g.hkv * g.hd), v(k.size());
    for (uint64_t t = 0; t < n; ++t)
      for (uint32_t i = 0; i < g.hkv * g.hd; ++i) v[t * g.hkv * g.hd + i] = static_cast<float>(t) + 0.001f * i;
    CHECK_OK(kvc_append(p, id, l, 0, n, k.data(), v.data(), KVC_DTYPE_F32));
    ks[l] = k;
  }
  return ks;
}

kvc_policy *policy(kvc_policy_kind kind, uint64_t budget, double ratio = 0.0,
                   void (*tweak)(kvc_policy_config *) = nullptr) {
  kvc_policy_config c;
  kvc_policy_config_init(&c);
  c.kind = kind;
  c.budget_tokens = budget;
  c.compression_ratio = ratio;
  if (tweak) tweak(&c);
  kvc_policy *pol = nullptr;
  CHECK_OK(kvc_policy_create(&c, &pol));
  return pol;
}

// Positions a layer holds, in order.
std::vector<int32_t> positions(kvc_pool *p, uint64_t id, uint32_t layer) {
  uint64_t n = 0;
  CHECK_OK(kvc_seq_layer_tokens(p, id, layer, &n));
  std::vector<int32_t> pos(n);
  if (n) CHECK_OK(kvc_gather(p, id, layer, 0, n, nullptr, nullptr, KVC_DTYPE_F32, pos.data()));
  return pos;
}

std::vector<int32_t> iota_plus(std::initializer_list<std::pair<int, int>> ranges) {
  std::vector<int32_t> v;
  for (auto [a, b] : ranges)
    for (int i = a; i < b; ++i) v.push_back(i);
  return v;
}

bool invariants_ok(kvc_pool *p) {
  const std::string e = kvc::api::core_pool(p).check_invariants();
  if (!e.empty()) std::fprintf(stderr, "invariant: %s\n", e.c_str());
  return e.empty();
}

}  // namespace

// kvpress's budget convention: keep max(1, floor(n x (1 - r))).
KVTEST(budget_rules) {
  Geo g;
  g.layers = 1;
  struct Case {
    uint64_t n;
    double r;
    uint64_t keep;
  };
  for (const Case &c : {Case{2, 0.6, 1}, Case{1, 0.5, 1}, Case{8, 0.95, 1}, Case{100, 0.5, 50},
                        Case{100, 0.7, 30}, Case{10, 0.0, 5} /* no ratio: S + W = 4 + 1 */}) {
    kvc_pool *p = make_pool(g);
    fill(p, g, 1, c.n);
    kvc_policy *pol = policy(KVC_POLICY_STREAMING, 0, c.r, [](kvc_policy_config *x) { x->recent_tokens = 1; });
    uint64_t dropped = 7;
    CHECK_OK(kvc_evict(p, 1, pol, &dropped));
    uint64_t n = 0;
    CHECK_OK(kvc_seq_layer_tokens(p, 1, 0, &n));
    if (n != c.keep) std::fprintf(stderr, "n=%llu r=%g kept %llu\n", (unsigned long long)c.n, c.r, (unsigned long long)n);
    CHECK(n == c.keep);
    CHECK(dropped == c.n - c.keep);
    kvc_policy_destroy(pol);
    kvc_pool_destroy(p);
  }
  // r = 1 (drop everything) and out-of-range values are refused.
  kvc_policy_config c;
  kvc_policy_config_init(&c);
  c.kind = KVC_POLICY_H2O;
  kvc_policy *pol = reinterpret_cast<kvc_policy *>(0x1);
  for (double r : {1.0, 1.5, -0.1, std::numeric_limits<double>::quiet_NaN()}) {
    c.compression_ratio = r;
    CHECK_STATUS(kvc_policy_create(&c, &pol), KVC_ERR_INVALID_ARGUMENT);
  }
  CHECK(pol == reinterpret_cast<kvc_policy *>(0x1));
}

// StreamingLLM: S sinks + the newest tokens; S = 0 is a sliding window.
KVTEST(streaming_sinks_and_window) {
  Geo g;
  kvc_pool *p = make_pool(g);
  fill(p, g, 1, 30);
  kvc_policy *pol = policy(KVC_POLICY_STREAMING, 10);  // 4 sinks (default) + 6 recent
  uint64_t dropped[2] = {0, 0};
  CHECK_OK(kvc_evict(p, 1, pol, dropped));
  CHECK(dropped[0] == 20 && dropped[1] == 20);
  CHECK(positions(p, 1, 0) == iota_plus({{0, 4}, {24, 30}}));
  CHECK(positions(p, 1, 1) == iota_plus({{0, 4}, {24, 30}}));
  // The V rows moved with their tokens (V of token t is t + 0.001 i).
  std::vector<float> v(10 * g.hkv * g.hd);
  CHECK_OK(kvc_gather(p, 1, 0, 0, 10, nullptr, v.data(), KVC_DTYPE_F32, nullptr));
  const std::vector<int32_t> want = iota_plus({{0, 4}, {24, 30}});
  for (int j = 0; j < 10; ++j) CHECK(v[j * g.hkv * g.hd + 3] == static_cast<float>(want[j]) + 0.003f);
  // Appending continues at the next position.
  CHECK_OK(kvc_seq_reserve(p, 1, 1, nullptr));
  std::vector<float> k1(g.hkv * g.hd, 1.0f);
  CHECK_OK(kvc_append(p, 1, 0, 30, 1, k1.data(), k1.data(), KVC_DTYPE_F32));
  CHECK(positions(p, 1, 0) == iota_plus({{0, 4}, {24, 31}}));
  // Window only.
  kvc_policy *win = policy(KVC_POLICY_STREAMING, 5, 0, [](kvc_policy_config *x) { x->sink_tokens = 0; });
  CHECK_OK(kvc_evict(p, 1, win, nullptr));
  CHECK(positions(p, 1, 0) == iota_plus({{26, 31}}));
  CHECK(invariants_ok(p));
  kvc_policy_destroy(pol);
  kvc_policy_destroy(win);
  kvc_pool_destroy(p);
}

// H2O: the recent window plus the highest accumulated scores among the rest;
// a recent window that rounds down to 0 protects nothing.
KVTEST(h2o_heavy_hitters) {
  Geo g;
  g.layers = 1;
  kvc_pool *p = make_pool(g);
  const uint64_t n = 20;
  fill(p, g, 1, n);
  std::vector<float> sc(n * g.hkv, 0.0f);
  // Heavy hitters at 2, 7 and 11 (on different KV heads: summed); 17 has the
  // highest score but is inside the recent window anyway.
  sc[2 * 2 + 0] = 5.0f;
  sc[7 * 2 + 1] = 4.0f;
  sc[11 * 2 + 0] = 1.0f;
  sc[11 * 2 + 1] = 2.5f;
  sc[17 * 2 + 0] = 9.0f;
  sc[5 * 2 + 0] = 0.5f;
  CHECK_OK(kvc_seq_observe_scores(p, 1, 0, sc.data(), n, 0));
  kvc_policy *pol = policy(KVC_POLICY_H2O, 8);  // 4 recent + 4 heavy
  CHECK_OK(kvc_evict(p, 1, pol, nullptr));
  CHECK(positions(p, 1, 0) == std::vector<int32_t>({2, 5, 7, 11, 16, 17, 18, 19}));
  // Scores moved with their tokens.
  std::vector<float> after(8 * g.hkv);
  CHECK_OK(kvc_seq_scores(p, 1, 0, after.data(), 8));
  CHECK(after[0] == 5.0f && after[2 * 2 + 1] == 4.0f && after[3 * 2 + 1] == 2.5f);
  // recent_fraction 0.1 of a budget of 3 rounds to 0: pure heavy hitters.
  kvc_policy *pure = policy(KVC_POLICY_H2O, 3, 0, [](kvc_policy_config *x) { x->recent_fraction = 0.1; });
  CHECK_OK(kvc_evict(p, 1, pure, nullptr));
  CHECK(positions(p, 1, 0) == std::vector<int32_t>({2, 7, 17}));
  CHECK(invariants_ok(p));
  kvc_policy_destroy(pol);
  kvc_policy_destroy(pure);
  kvc_pool_destroy(p);
}

// TOVA: top scores of the latest query, no protected window.
KVTEST(tova_latest_query) {
  Geo g;
  g.layers = 1;
  kvc_pool *p = make_pool(g);
  fill(p, g, 1, 12);
  std::vector<float> sc(12 * g.hkv, 0.01f);
  sc[0] = 3;
  sc[6 * 2 + 1] = 2;
  sc[9 * 2] = 1;
  CHECK_OK(kvc_seq_observe_scores(p, 1, 0, sc.data(), 12, 0));
  kvc_policy *pol = policy(KVC_POLICY_TOVA, 3);
  CHECK_OK(kvc_evict(p, 1, pol, nullptr));
  CHECK(positions(p, 1, 0) == std::vector<int32_t>({0, 6, 9}));
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}


// Knorm (arXiv 2406.11430): the smallest mean key norm over KV heads, ranked
// against a float64 reference on the keys the pool holds, + recent_tokens.
namespace {
std::vector<int32_t> knorm_reference(kvc_pool *p, const Geo &g, uint64_t id, uint32_t layer,
                                     uint64_t target, uint64_t recent) {
  uint64_t n = 0;
  CHECK_OK(kvc_seq_layer_tokens(p, id, layer, &n));
  std::vector<float> k(n * g.hkv * g.hd);
  std::vector<int32_t> pos(n);
  CHECK_OK(kvc_gather(p, id, layer, 0, n, k.data(), nullptr, KVC_DTYPE_F32, pos.data()));
  std::vector<double> norm(n, 0.0);
  for (uint64_t t = 0; t < n; ++t)
    for (uint32_t h = 0; h < g.hkv; ++h) {
      double sq = 0;
      for (uint32_t d = 0; d < g.hd; ++d) {
        const double x = k[(t * g.hkv + h) * g.hd + d];
        sq += x * x;
      }
      norm[t] += std::sqrt(sq) / g.hkv;
    }
  std::vector<uint64_t> idx(n - recent);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](uint64_t a, uint64_t b) { return norm[a] < norm[b]; });
  std::vector<int32_t> keep;
  for (uint64_t i = 0; i < target - recent; ++i) keep.push_back(pos[idx[i]]);
  for (uint64_t t = n - recent; t < n; ++t) keep.push_back(pos[t]);
  std::sort(keep.begin(), keep.end());
  return keep;
}
}  // namespace

KVTEST(knorm_smallest_key_norms) {
  Geo g;
  g.layers = 2;
  kvc_pool *p = make_pool(g);
  const uint64_t n = 24;
  fill(p, g, 1, n);
  // Hand-made: layer 0's keys scaled so tokens 3, 8 and 15 have the smallest
  // norms on head 0 and head 1 together (a small head-0 norm alone is not
  // enough when head 1 is large: token 20).
  std::vector<float> k(n * g.hkv * g.hd), v(k.size(), 1.0f);
  for (uint64_t t = 0; t < n; ++t)
    for (uint32_t h = 0; h < g.hkv; ++h)
      for (uint32_t d = 0; d < g.hd; ++d) {
        float scale = 1.0f + 0.01f * static_cast<float>(t);
        if (t == 3 || t == 8 || t == 15) scale = 0.1f + 0.01f * static_cast<float>(t);
        if (t == 20) scale = h == 0 ? 0.01f : 3.0f;
        k[(t * g.hkv + h) * g.hd + d] = scale * (d % 2 ? 1.0f : -1.0f);
      }
  CHECK_OK(kvc_append(p, 1, 0, 0, n, k.data(), v.data(), KVC_DTYPE_F32));
  kvc_policy *pol = policy(KVC_POLICY_KNORM, 3);
  kvc_policy *win = policy(KVC_POLICY_KNORM, 0, 0.5, [](kvc_policy_config *x) { x->recent_tokens = 4; });
  // Layer 1 (random keys) against the float64 reference, before evicting.
  const std::vector<int32_t> want1 = knorm_reference(p, g, 1, 1, 3, 0);
  CHECK_OK(kvc_evict(p, 1, pol, nullptr));
  CHECK(positions(p, 1, 0) == std::vector<int32_t>({3, 8, 15}));
  CHECK(positions(p, 1, 1) == want1);
  // compression_ratio 0.5 of 24 keeps 12: the newest 4 + the 8 smallest norms.
  fill(p, g, 2, n);
  const std::vector<int32_t> want = knorm_reference(p, g, 2, 0, 12, 4);
  CHECK_OK(kvc_evict(p, 2, win, nullptr));
  CHECK(positions(p, 2, 0) == want && want.size() == 12);
  CHECK(std::vector<int32_t>(want.end() - 4, want.end()) == std::vector<int32_t>({20, 21, 22, 23}));
  CHECK(invariants_ok(p));
  kvc_policy_destroy(pol);
  kvc_policy_destroy(win);
  kvc_pool_destroy(p);
}

// Knorm reads the keys as stored: in an int8 pool it ranks the dequantized
// keys (the reference reads them back through kvc_gather).
KVTEST(knorm_quantized_pool) {
  Geo g;
  g.layers = 1;
  kvc_codec int8;
  kvc_codec_init(&int8);
  int8.dtype = KVC_DTYPE_INT8;
  int8.granularity = KVC_SCALE_PER_TOKEN;
  kvc_pool *p = make_pool(g, 512, KVC_DTYPE_F32, &int8);
  fill(p, g, 1, 40);
  const std::vector<int32_t> want = knorm_reference(p, g, 1, 0, 10, 0);
  kvc_policy *pol = policy(KVC_POLICY_KNORM, 10);
  CHECK_OK(kvc_evict(p, 1, pol, nullptr));
  CHECK(positions(p, 1, 0) == want);
  CHECK(invariants_ok(p));
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

// SnapKV: the window stays; max pooling lets a peak pull in its neighbours.
KVTEST(snapkv_pooled_window) {
  Geo g;
  g.layers = 1;
  kvc_pool *p = make_pool(g);
  const uint64_t n = 30;
  fill(p, g, 1, n);
  std::vector<float> sc(n * g.hkv, 0.0f);
  sc[10 * 2] = 1.0f;  // a peak at 10: kernel 3 pools it over 9, 10, 11
  sc[20 * 2] = 0.6f;  // a weaker peak at 20
  sc[3 * 2] = 0.2f;
  CHECK_OK(kvc_seq_observe_scores(p, 1, 0, sc.data(), n, 0));
  kvc_policy *pol = policy(KVC_POLICY_SNAPKV, 9, 0, [](kvc_policy_config *x) {
    x->window = 4;
    x->kernel_size = 3;
  });
  CHECK_OK(kvc_evict(p, 1, pol, nullptr));
  // 5 prefix tokens: 9, 10, 11 (pooled 1.0), then 19 and 21 before 20? All
  // three of 19, 20, 21 pool to 0.6; ties keep the newer: 21, 20.
  CHECK(positions(p, 1, 0) == std::vector<int32_t>({9, 10, 11, 20, 21, 26, 27, 28, 29}));
  kvc_policy_destroy(pol);
  // Average pooling, kernel 1 = raw scores.
  kvc_pool *q = make_pool(g);
  fill(q, g, 1, n);
  CHECK_OK(kvc_seq_observe_scores(q, 1, 0, sc.data(), n, 0));
  kvc_policy *raw = policy(KVC_POLICY_SNAPKV, 6, 0, [](kvc_policy_config *x) {
    x->window = 3;
    x->kernel_size = 1;
    x->pooling = KVC_POOLING_AVG;
  });
  CHECK_OK(kvc_evict(q, 1, raw, nullptr));
  CHECK(positions(q, 1, 0) == std::vector<int32_t>({3, 10, 20, 27, 28, 29}));
  kvc_policy_destroy(raw);
  kvc_pool_destroy(q);
  kvc_pool_destroy(p);
}

// PyramidKV: budgets fall with depth, each layer keeps >= 1 and the total
// never exceeds layers x base.
KVTEST(pyramid_budgets) {
  Geo g;
  g.layers = 6;
  for (kvc_pyramid_schedule sch : {KVC_PYRAMID_PAPER, KVC_PYRAMID_LINEAR}) {
    kvc_pool *p = make_pool(g, 2048);
    const uint64_t n = 100;
    fill(p, g, 1, n);
    kvc_policy_config c;
    kvc_policy_config_init(&c);
    c.kind = KVC_POLICY_PYRAMIDKV;
    c.compression_ratio = 0.7;  // base 30
    c.schedule = sch;
    c.window = 2;
    kvc_policy *pol = nullptr;
    CHECK_OK(kvc_policy_create(&c, &pol));
    uint64_t dropped[6];
    CHECK_OK(kvc_evict(p, 1, pol, dropped));
    uint64_t total = 0, prev = UINT64_MAX;
    for (uint32_t l = 0; l < g.layers; ++l) {
      const uint64_t kept = n - dropped[l];
      CHECK(kept >= 1 && kept <= prev);
      prev = kept;
      total += kept;
    }
    CHECK(total <= 6 * 30);
    if (sch == KVC_PYRAMID_PAPER) {
      CHECK(n - dropped[0] == 58);  // 2 x 30 - 30 / 20 = 58.5
      CHECK(n - dropped[5] == 1);   // 30 / 20 = 1.5
    } else {
      CHECK(n - dropped[0] == 30);
      CHECK(n - dropped[5] == 6);   // 0.2 x 30
    }
    CHECK(invariants_ok(p));
    kvc_policy_destroy(pol);
    kvc_pool_destroy(p);
  }
}

// Compaction frees the emptied blocks; data of survivors is bit-exact, also
// for quantized storage (codes and scales move as bytes).
KVTEST(compaction_frees_blocks_exact) {
  Geo g;
  kvc_codec codec;
  kvc_codec_init(&codec);
  codec.dtype = KVC_DTYPE_INT4;
  codec.granularity = KVC_SCALE_PER_GROUP;
  codec.group_size = 8;
  for (int quant = 0; quant < 3; ++quant) {  // f16 NHD, int4, f16 HND
    kvc_pool *p = make_pool(g, 512, KVC_DTYPE_F16, quant == 1 ? &codec : nullptr, KVC_ROPE_NONE, 0,
                            quant == 2 ? KVC_LAYOUT_HND : KVC_LAYOUT_NHD);
    const uint64_t n = 41;
    fill(p, g, 1, n);
    std::vector<float> k_before(n * g.hkv * g.hd), v_before(k_before.size());
    CHECK_OK(kvc_gather(p, 1, 1, 0, n, k_before.data(), v_before.data(), KVC_DTYPE_F32, nullptr));
    kvc_stats st;
    kvc_stats_init(&st);
    CHECK_OK(kvc_pool_stats(p, &st));
    CHECK(st.blocks_used == 2 * 11);
    std::vector<float> sc(n * g.hkv);
    for (uint64_t t = 0; t < n; ++t) sc[t * 2] = static_cast<float>((t * 7) % 13);
    CHECK_OK(kvc_seq_observe_scores(p, 1, 1, sc.data(), n, 0));
    kvc_policy *pol = policy(KVC_POLICY_H2O, 10);
    CHECK_OK(kvc_evict(p, 1, pol, nullptr));
    CHECK_OK(kvc_pool_stats(p, &st));
    CHECK(st.blocks_used == 2 * 3);  // 10 tokens per layer in blocks of 4
    CHECK(st.tokens_stored == 20);
    const std::vector<int32_t> pos = positions(p, 1, 1);
    CHECK(pos.size() == 10);
    // The exported page table stays valid: 3 pages, the last holding 10 - 8 = 2 tokens.
    {
      const uint64_t id1 = 1;
      int32_t indptr[2], indices[8], last = -1;
      size_t need = 0;
      CHECK_OK(kvc_export_page_table(p, 1, &id1, 1, indptr, indices, 8, &last, &need));
      CHECK(need == 3 && indptr[1] == 3 && last == 2);
    }
    std::vector<float> k(10 * g.hkv * g.hd), v(k.size());
    CHECK_OK(kvc_gather(p, 1, 1, 0, 10, k.data(), v.data(), KVC_DTYPE_F32, nullptr));
    const size_t row = g.hkv * g.hd;
    for (size_t j = 0; j < pos.size(); ++j) {
      CHECK(std::memcmp(k.data() + j * row, k_before.data() + pos[j] * row, row * 4) == 0);
      CHECK(std::memcmp(v.data() + j * row, v_before.data() + pos[j] * row, row * 4) == 0);
    }
    CHECK(invariants_ok(p));
    kvc_policy_destroy(pol);
    kvc_pool_destroy(p);
  }
}

// A fork shares blocks; evicting the child copies what it writes and leaves
// the parent's data, positions and blocks unchanged.
KVTEST(fork_isolated) {
  Geo g;
  kvc_pool *p = make_pool(g);
  const uint64_t n = 26;
  fill(p, g, 1, n);
  CHECK_OK(kvc_seq_fork(p, 1, 2));
  std::vector<float> k0(n * g.hkv * g.hd), v0(k0.size()), k1(k0.size()), v1(k0.size());
  CHECK_OK(kvc_gather(p, 1, 0, 0, n, k0.data(), v0.data(), KVC_DTYPE_F32, nullptr));
  kvc_policy *pol = policy(KVC_POLICY_STREAMING, 8);
  CHECK_OK(kvc_evict(p, 2, pol, nullptr));
  CHECK(positions(p, 2, 0) == iota_plus({{0, 4}, {22, 26}}));
  CHECK(positions(p, 1, 0) == iota_plus({{0, 26}}));
  CHECK_OK(kvc_gather(p, 1, 0, 0, n, k1.data(), v1.data(), KVC_DTYPE_F32, nullptr));
  CHECK(k0 == k1 && v0 == v1);
  CHECK(invariants_ok(p));
  CHECK_OK(kvc_seq_free(p, 1));
  CHECK_OK(kvc_seq_free(p, 2));
  kvc_stats st;
  kvc_stats_init(&st);
  CHECK_OK(kvc_pool_stats(p, &st));
  CHECK(st.blocks_used == 0 && st.blocks_free == st.blocks_total);
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

// Copy-on-write that cannot get a block: POOL_EXHAUSTED and nothing changed.
KVTEST(cow_exhausted_changes_nothing) {
  Geo g;
  g.layers = 1;
  kvc_pool *p = make_pool(g, 8);  // 24 tokens fill 6 blocks
  fill(p, g, 1, 24);
  CHECK_OK(kvc_seq_fork(p, 1, 2));
  CHECK_OK(kvc_seq_create(p, 3));
  CHECK_OK(kvc_seq_reserve(p, 3, 4, nullptr));  // one block left: the eviction must copy 2
  kvc_policy *pol = policy(KVC_POLICY_STREAMING, 6, 0, [](kvc_policy_config *x) { x->sink_tokens = 1; });
  uint64_t dropped = 77;
  CHECK_STATUS(kvc_evict(p, 2, pol, &dropped), KVC_ERR_POOL_EXHAUSTED);
  CHECK(dropped == 77);
  CHECK(positions(p, 2, 0) == iota_plus({{0, 24}}));
  CHECK(invariants_ok(p));
  CHECK_OK(kvc_seq_free(p, 3));
  CHECK_OK(kvc_evict(p, 2, pol, &dropped));
  CHECK(dropped == 18);
  CHECK(positions(p, 2, 0) == iota_plus({{0, 1}, {19, 24}}));
  CHECK(invariants_ok(p));
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

// After eviction, attention over the compacted cache equals attention over the
// full cache with the evicted tokens masked out.
KVTEST(attention_equals_masked) {
  Geo g;
  g.layers = 1;
  g.hq = 4;
  g.hkv = 2;
  g.hd = 16;
  kvc_pool *p = make_pool(g);
  const uint64_t n = 37, id = 1;
  fill(p, g, id, n);
  std::vector<float> k(n * g.hkv * g.hd), v(k.size());
  CHECK_OK(kvc_gather(p, id, 0, 0, n, k.data(), v.data(), KVC_DTYPE_F32, nullptr));
  std::vector<float> sc = randn(n * g.hkv);
  for (float &x : sc) x = std::fabs(x);
  CHECK_OK(kvc_seq_observe_scores(p, id, 0, sc.data(), n, 0));
  kvc_policy *pol = policy(KVC_POLICY_H2O, 12);
  CHECK_OK(kvc_evict(p, id, pol, nullptr));
  const std::vector<int32_t> pos = positions(p, id, 0);
  std::vector<char> keep(n, 0);
  for (int32_t x : pos) keep[x] = 1;
  std::vector<float> q = randn(g.hq * g.hd), out(g.hq * g.hd);
  kvc_attention_params a;
  kvc_attention_params_init(&a);
  a.num_q_heads = g.hq;
  CHECK_OK(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), nullptr, &a));
  // Masked reference in double.
  const float scale = 0.25f;
  for (uint32_t h = 0; h < g.hq; ++h) {
    const uint32_t kvh = h / 2;
    double mx = -1e300, sum = 0;
    std::vector<double> s(n);
    for (uint64_t t = 0; t < n; ++t) {
      if (!keep[t]) continue;
      double d = 0;
      for (uint32_t i = 0; i < g.hd; ++i) d += double(q[h * g.hd + i]) * k[(t * g.hkv + kvh) * g.hd + i];
      s[t] = d * scale;
      mx = std::max(mx, s[t]);
    }
    for (uint64_t t = 0; t < n; ++t)
      if (keep[t]) sum += std::exp(s[t] - mx);
    for (uint32_t i = 0; i < g.hd; ++i) {
      double o = 0;
      for (uint64_t t = 0; t < n; ++t)
        if (keep[t]) o += std::exp(s[t] - mx) / sum * v[(t * g.hkv + kvh) * g.hd + i];
      CHECK_NEAR(out[h * g.hd + i], o, 1e-5 * std::max(1.0, std::fabs(o)));
    }
  }
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

namespace {
// RoPE (interleaved pairs) of one head at position pos, in double.
void rope(float *x, uint32_t hd, int64_t pos, kvc_rope_style style) {
  for (uint32_t i = 0; i < hd / 2; ++i) {
    const double a = pos * std::pow(10000.0, -2.0 * i / hd);
    const uint32_t i0 = style == KVC_ROPE_INTERLEAVED ? 2 * i : i, i1 = style == KVC_ROPE_INTERLEAVED ? 2 * i + 1 : i + hd / 2;
    const double x0 = x[i0], x1 = x[i1];
    x[i0] = static_cast<float>(x0 * std::cos(a) - x1 * std::sin(a));
    x[i1] = static_cast<float>(x0 * std::sin(a) + x1 * std::cos(a));
  }
}
}  // namespace

// StreamingLLM positions within the cache: after eviction with
// shift_positions, the keys equal keys rotated at their new index (f32
// exactly to rounding; int8 within the codec's error), and new tokens get
// RoPE positions continuing from the cache size.
KVTEST(shift_positions_rerotates) {
  Geo g;
  g.layers = 1;
  g.hd = 16;
  kvc_codec int8;
  kvc_codec_init(&int8);
  int8.dtype = KVC_DTYPE_INT8;
  int8.granularity = KVC_SCALE_PER_TOKEN;
  for (kvc_rope_style style : {KVC_ROPE_INTERLEAVED, KVC_ROPE_NEOX})
    for (int quant = 0; quant < 2; ++quant) {
      kvc_pool *p = make_pool(g, 512, KVC_DTYPE_F32, quant ? &int8 : nullptr, style);
      const uint64_t n = 20, row = g.hkv * g.hd;
      std::vector<float> raw = randn(n * row), k = raw;
      for (uint64_t t = 0; t < n; ++t)
        for (uint32_t h = 0; h < g.hkv; ++h) rope(k.data() + t * row + h * g.hd, g.hd, static_cast<int64_t>(t), style);
      CHECK_OK(kvc_seq_create(p, 1));
      CHECK_OK(kvc_seq_reserve(p, 1, n, nullptr));
      CHECK_OK(kvc_append(p, 1, 0, 0, n, k.data(), k.data(), KVC_DTYPE_F32));
      kvc_policy *pol = policy(KVC_POLICY_STREAMING, 8, 0, [](kvc_policy_config *x) {
        x->sink_tokens = 2;
        x->shift_positions = 1;
      });
      CHECK_OK(kvc_evict(p, 1, pol, nullptr));
      std::vector<float> got(8 * row);
      CHECK_OK(kvc_gather(p, 1, 0, 0, 8, got.data(), nullptr, KVC_DTYPE_F32, nullptr));
      const int src[8] = {0, 1, 14, 15, 16, 17, 18, 19};
      double max_err = 0, max_mag = 0;
      for (int j = 0; j < 8; ++j) {
        std::vector<float> want(raw.begin() + src[j] * row, raw.begin() + (src[j] + 1) * row);
        for (uint32_t h = 0; h < g.hkv; ++h) rope(want.data() + h * g.hd, g.hd, j, style);
        for (uint64_t i = 0; i < row; ++i) {
          max_err = std::max(max_err, std::fabs(double(got[j * row + i]) - want[i]));
          max_mag = std::max(max_mag, std::fabs(double(want[i])));
        }
      }
      // f32: rounding only; int8: two quantizations of a row (<= 1/127 of its max each).
      CHECK(max_err <= (quant ? 2.5 * max_mag / 127.0 : 1e-5 * max_mag));
      int32_t rp[2];
      CHECK_OK(kvc_seq_reserve(p, 1, 2, nullptr));
      CHECK_OK(kvc_seq_rope_positions(p, 1, 0, 20, 2, rp));
      CHECK(rp[0] == 8 && rp[1] == 9);
      CHECK_STATUS(kvc_seq_rope_positions(p, 1, 0, 10, 2, rp), KVC_ERR_OUT_OF_RANGE);  // evicted
      CHECK(invariants_ok(p));
      kvc_policy_destroy(pol);
      kvc_pool_destroy(p);
    }
  // Without RoPE parameters a shifting policy is refused.
  kvc_pool *p = make_pool(g);
  fill(p, g, 1, 10);
  kvc_policy *pol = policy(KVC_POLICY_STREAMING, 4, 0, [](kvc_policy_config *x) { x->shift_positions = 1; });
  CHECK_STATUS(kvc_seq_set_policy(p, 1, pol), KVC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kvc_evict(p, 1, pol, nullptr), KVC_ERR_INVALID_ARGUMENT);
  CHECK(positions(p, 1, 0).size() == 10);
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

// auto_evict: reserve keeps every layer within budget_tokens.
KVTEST(auto_evict_on_reserve) {
  Geo g;
  kvc_pool *p = make_pool(g);
  CHECK_OK(kvc_seq_create(p, 1));
  kvc_policy *pol = policy(KVC_POLICY_STREAMING, 8, 0, [](kvc_policy_config *x) {
    x->auto_evict = 1;
    x->sink_tokens = 2;
  });
  CHECK_OK(kvc_seq_set_policy(p, 1, pol));
  kvc_policy_destroy(pol);  // the sequence keeps its reference
  std::vector<float> kv(g.hkv * g.hd, 0.5f);
  for (uint64_t t = 0; t < 30; ++t) {
    CHECK_OK(kvc_seq_reserve(p, 1, 1, nullptr));
    for (uint32_t l = 0; l < g.layers; ++l) CHECK_OK(kvc_append(p, 1, l, t, 1, kv.data(), kv.data(), KVC_DTYPE_F32));
    uint64_t n = 0;
    CHECK_OK(kvc_seq_layer_tokens(p, 1, 0, &n));
    CHECK(n == std::min<uint64_t>(t + 1, 8));
  }
  CHECK(positions(p, 1, 1) == iota_plus({{0, 2}, {24, 30}}));
  CHECK(invariants_ok(p));
  kvc_pool_destroy(p);
}

// Policies a pool cannot run are refused when attached: auto-eviction with a
// residual window, shifted positions with per-tensor key scales.
KVTEST(unfit_policies_refused) {
  Geo g;
  kvc_codec c;
  kvc_codec_init(&c);
  c.dtype = KVC_DTYPE_INT8;
  c.granularity = KVC_SCALE_PER_TOKEN;
  kvc_pool *p = make_pool(g, 512, KVC_DTYPE_F16, &c, KVC_ROPE_NONE, 2);
  fill(p, g, 1, 6);
  kvc_policy *pol = policy(KVC_POLICY_STREAMING, 4, 0, [](kvc_policy_config *x) { x->auto_evict = 1; });
  CHECK_STATUS(kvc_seq_set_policy(p, 1, pol), KVC_ERR_UNSUPPORTED);
  CHECK_STATUS(kvc_pool_set_policy(p, pol), KVC_ERR_UNSUPPORTED);
  CHECK_OK(kvc_seq_reserve(p, 1, 3, nullptr));  // still grows
  kvc_policy_destroy(pol);
  // A policy of kind none with a budget never touches the residual.
  kvc_policy *none = policy(KVC_POLICY_NONE, 2);
  uint64_t dropped[2] = {9, 9};
  CHECK_OK(kvc_evict(p, 1, none, dropped));
  CHECK(dropped[0] == 0 && dropped[1] == 0);
  kvc_policy_destroy(none);
  kvc_pool_destroy(p);
  kvc_codec pt;
  kvc_codec_init(&pt);
  pt.dtype = KVC_DTYPE_INT8;
  pt.granularity = KVC_SCALE_PER_TENSOR;
  kvc_pool *q = make_pool(g, 512, KVC_DTYPE_F16, &pt, KVC_ROPE_NEOX);
  fill(q, g, 1, 6);
  kvc_policy *sh = policy(KVC_POLICY_STREAMING, 2, 0, [](kvc_policy_config *x) { x->shift_positions = 1; });
  CHECK_STATUS(kvc_seq_set_policy(q, 1, sh), KVC_ERR_UNSUPPORTED);
  CHECK_STATUS(kvc_evict(q, 1, sh, nullptr), KVC_ERR_UNSUPPORTED);
  CHECK(positions(q, 1, 0).size() == 6);
  CHECK(invariants_ok(q));
  kvc_policy_destroy(sh);
  kvc_pool_destroy(q);
}

// Pools with a residual window refuse eviction and stay unchanged.
KVTEST(residual_pool_unsupported) {
  Geo g;
  kvc_codec c;
  kvc_codec_init(&c);
  c.dtype = KVC_DTYPE_INT4;
  c.granularity = KVC_SCALE_PER_GROUP;
  c.group_size = 8;
  kvc_pool *p = make_pool(g, 512, KVC_DTYPE_F16, &c, KVC_ROPE_NONE, 8);
  fill(p, g, 1, 20);
  kvc_policy *pol = policy(KVC_POLICY_STREAMING, 6);
  CHECK_STATUS(kvc_evict(p, 1, pol, nullptr), KVC_ERR_UNSUPPORTED);
  CHECK(positions(p, 1, 0).size() == 20);
  CHECK(invariants_ok(p));
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

// Every policy leaves a cache over which a fresh query gives finite output,
// including budgets of 1 token.
KVTEST(fresh_query_finite) {
  Geo g;
  for (kvc_policy_kind kind : {KVC_POLICY_STREAMING, KVC_POLICY_H2O, KVC_POLICY_SNAPKV, KVC_POLICY_PYRAMIDKV,
                               KVC_POLICY_TOVA})
    for (uint64_t budget : {1ull, 2ull, 9ull}) {
      kvc_pool *p = make_pool(g);
      fill(p, g, 1, 33);
      kvc_attention_params a;
      kvc_attention_params_init(&a);
      a.num_q_heads = g.hq;
      a.observe = KVC_OBSERVE_ACCUMULATE;
      const uint64_t id = 1;
      std::vector<float> q = randn(g.hq * g.hd), out(g.hq * g.hd);
      for (uint32_t l = 0; l < g.layers; ++l) CHECK_OK(kvc_attention_decode(p, l, &id, 1, q.data(), out.data(), nullptr, &a));
      kvc_policy *pol = policy(kind, budget);
      CHECK_OK(kvc_evict(p, 1, pol, nullptr));
      uint64_t total = 0;
      for (uint32_t l = 0; l < g.layers; ++l) {
        uint64_t n = 0;
        CHECK_OK(kvc_seq_layer_tokens(p, 1, l, &n));
        total += n;
        // PyramidKV's budget is the layers' average (the first layer may hold up to 2x).
        CHECK(n >= 1 && (kind == KVC_POLICY_PYRAMIDKV || n <= budget));
        CHECK_OK(kvc_attention_decode(p, l, &id, 1, q.data(), out.data(), nullptr, &a));
        for (float x : out) CHECK(std::isfinite(x));
      }
      CHECK(total <= g.layers * budget);
      CHECK(invariants_ok(p));
      kvc_policy_destroy(pol);
      kvc_pool_destroy(p);
    }
}

// Policy config validation and API misuse.
KVTEST(bad_input) {
  kvc_policy_config c;
  kvc_policy_config_init(&c);
  kvc_policy *pol = nullptr;
  auto refused = [&](void (*tweak)(kvc_policy_config *), kvc_status want) {
    kvc_policy_config x;
    kvc_policy_config_init(&x);
    x.kind = KVC_POLICY_H2O;
    tweak(&x);
    kvc_policy *out = nullptr;
    CHECK_STATUS(kvc_policy_create(&x, &out), want);
    CHECK(out == nullptr);
  };
  refused([](kvc_policy_config *x) { x->kind = static_cast<kvc_policy_kind>(42); }, KVC_ERR_INVALID_ARGUMENT);
  refused([](kvc_policy_config *x) { x->kind = static_cast<kvc_policy_kind>(-1); }, KVC_ERR_INVALID_ARGUMENT);
  refused([](kvc_policy_config *x) { x->kernel_size = 4; }, KVC_ERR_INVALID_ARGUMENT);
  refused([](kvc_policy_config *x) { x->kernel_size = 0; }, KVC_ERR_INVALID_ARGUMENT);
  refused([](kvc_policy_config *x) { x->recent_fraction = 1.5; }, KVC_ERR_INVALID_ARGUMENT);
  refused([](kvc_policy_config *x) { x->beta = 0.5; }, KVC_ERR_INVALID_ARGUMENT);
  refused([](kvc_policy_config *x) { x->pooling = static_cast<kvc_pooling>(3); }, KVC_ERR_INVALID_ARGUMENT);
  refused([](kvc_policy_config *x) { x->schedule = static_cast<kvc_pyramid_schedule>(9); }, KVC_ERR_INVALID_ARGUMENT);
  refused([](kvc_policy_config *x) { x->auto_evict = 1; }, KVC_ERR_INVALID_ARGUMENT);
  refused([](kvc_policy_config *x) { x->kind = KVC_POLICY_PLUGIN; }, KVC_ERR_INVALID_ARGUMENT);
  refused([](kvc_policy_config *x) {
    x->kind = KVC_POLICY_STREAMING;
    x->recent_tokens = 0;
  }, KVC_ERR_INVALID_ARGUMENT);
  refused([](kvc_policy_config *x) { x->struct_size = 16; }, KVC_ERR_STRUCT_SIZE);
  CHECK_STATUS(kvc_policy_create(nullptr, &pol), KVC_ERR_NULL_POINTER);
  CHECK_STATUS(kvc_policy_create(&c, nullptr), KVC_ERR_NULL_POINTER);
  // The 0.3 function: the header's macro needs a typed pointer.
  CHECK_STATUS((kvc_policy_config_init)(nullptr), KVC_ERR_NULL_POINTER);
  // A larger struct from a newer header with a non-zero unknown field.
  struct Bigger {
    kvc_policy_config c;
    uint64_t extra;
  } big;
  std::memset(&big, 0, sizeof big);
  kvc_policy_config_init(&big.c);
  big.c.struct_size = sizeof big;
  big.c.kind = KVC_POLICY_TOVA;
  CHECK_OK(kvc_policy_create(&big.c, &pol));
  kvc_policy_destroy(pol);
  big.extra = 1;
  CHECK_STATUS(kvc_policy_create(&big.c, &pol), KVC_ERR_UNSUPPORTED);
  Geo g;
  kvc_pool *p = make_pool(g);
  CHECK_STATUS(kvc_evict(p, 5, nullptr, nullptr), KVC_ERR_SEQ_NOT_FOUND);
  CHECK_STATUS(kvc_evict(nullptr, 5, nullptr, nullptr), KVC_ERR_NULL_POINTER);
  fill(p, g, 5, 9);
  uint64_t dropped[2] = {3, 3};
  CHECK_OK(kvc_evict(p, 5, nullptr, dropped));  // no policy anywhere: nothing happens
  CHECK(dropped[0] == 0 && dropped[1] == 0);
  CHECK_STATUS(kvc_seq_set_policy(p, 77, nullptr), KVC_ERR_SEQ_NOT_FOUND);
  // The pool default applies to sequences without their own.
  kvc_policy *def = nullptr;
  c.kind = KVC_POLICY_STREAMING;
  c.budget_tokens = 5;
  CHECK_OK(kvc_policy_create(&c, &def));
  CHECK_OK(kvc_pool_set_policy(p, def));
  kvc_policy_destroy(def);
  CHECK_OK(kvc_evict(p, 5, nullptr, dropped));
  CHECK(dropped[0] == 4 && dropped[1] == 4);
  CHECK_OK(kvc_pool_set_policy(p, nullptr));
  kvc_pool_destroy(p);
  kvc_policy_destroy(nullptr);
}

int main(int argc, char **argv) { return kvtest_main(argc, argv); }
