// Head-wise pools (KVC_POOL_HEADWISE) and AdaKV head budgets
// (KVC_HEAD_BUDGET_ADAKV, arXiv 2407.11550): the same bytes as a token-wise
// pool until heads diverge; per-head kept sets that free each head's own
// blocks; attention equal to a float64 softmax over each head's kept tokens;
// AdaKV's kept sets against a reference written here from the paper's rule;
// fork / copy-on-write, records, disk-tier offload, page tables; refusals that
// change nothing. DuoAttention's tests are in test_duo.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../whitebox.h"
#include "../temp_dir.h"
#include "headwise_util.h"

using namespace headwise_util;
using evict_util::Geo;

// Before any eviction a head-wise pool holds what a token-wise pool holds, in
// the same bytes (block_size tokens of one head per block), and reads and
// attends to the same values: f32, int8 per-token and int4 groups of 8.
KVTEST(headwise_matches_tokenwise) {
  Geo g;
  g.layers = 2, g.hq = 6, g.hkv = 3, g.hd = 16, g.bs = 4;
  kvc_codec i8, i4;
  kvc_codec_init(&i8);
  i8.dtype = KVC_DTYPE_INT8;
  i8.granularity = KVC_SCALE_PER_TOKEN;
  kvc_codec_init(&i4);
  i4.dtype = KVC_DTYPE_INT4;
  i4.granularity = KVC_SCALE_PER_GROUP;
  i4.group_size = 8;
  for (const kvc_codec *codec : {static_cast<const kvc_codec *>(nullptr),
                                 static_cast<const kvc_codec *>(&i8),
                                 static_cast<const kvc_codec *>(&i4)}) {
    kvc_pool *tw = make(g, false, codec), *hw = make(g, true, codec);
    const uint64_t n = 23;  // not a multiple of the block size
    const Data d = fill(tw, g, 1, n);
    fill(hw, g, 1, n, &d);
    kvc_pool_config cfg;
    kvc_pool_config_init(&cfg);
    CHECK_OK(kvc_pool_get_config(hw, &cfg));
    CHECK(cfg.num_layers == g.layers && cfg.num_kv_heads == g.hkv && cfg.num_q_heads == g.hq);
    CHECK(cfg.flags & KVC_POOL_HEADWISE);
    kvc_pool_layout lay;
    kvc_pool_layout_init(&lay);
    CHECK_OK(kvc_pool_get_layout(hw, &lay));
    CHECK(lay.num_kv_heads == 1);  // a block holds one KV head
    for (uint32_t l = 0; l < g.layers; ++l) {
      std::vector<float> k1(n * g.hkv * g.hd), v1(k1.size()), k2(k1.size()), v2(k1.size());
      std::vector<int32_t> p1(n), p2(n);
      CHECK_OK(kvc_gather(tw, 1, l, 0, n, k1.data(), v1.data(), KVC_DTYPE_F32, p1.data()));
      CHECK_OK(kvc_gather(hw, 1, l, 0, n, k2.data(), v2.data(), KVC_DTYPE_F32, p2.data()));
      CHECK(k1 == k2 && v1 == v2 && p1 == p2);
      for (uint32_t h = 0; h < g.hkv; ++h) {  // one head's rows
        std::vector<float> kh(n * g.hd);
        CHECK_OK(kvc_gather_head(hw, 1, l, h, 0, n, kh.data(), nullptr, KVC_DTYPE_F32, nullptr));
        bool same = true;
        for (uint64_t t = 0; t < n; ++t)
          same = same && std::memcmp(&kh[t * g.hd], &k1[(t * g.hkv + h) * g.hd],
                                     g.hd * sizeof(float)) == 0;
        CHECK(same);
        std::vector<float> kt(n * g.hd);  // a token-wise pool's head, as the same call reads it
        CHECK_OK(kvc_gather_head(tw, 1, l, h, 0, n, kt.data(), nullptr, KVC_DTYPE_F32, nullptr));
        CHECK(kt == kh);
      }
      // Decode (one row) and prefill (the last 5 tokens) attention: the same bytes.
      kvc_attention_params a;
      kvc_attention_params_init(&a);
      a.num_q_heads = g.hq;
      const std::vector<float> q = evict_util::randn(g_rng, 5 * g.hq * g.hd);
      std::vector<float> o1(5 * g.hq * g.hd), o2(o1.size()), l1(5 * g.hq), l2(l1.size());
      const uint64_t id = 1;
      CHECK_OK(kvc_attention_decode(tw, l, &id, 1, q.data(), o1.data(), l1.data(), &a));
      CHECK_OK(kvc_attention_decode(hw, l, &id, 1, q.data(), o2.data(), l2.data(), &a));
      CHECK(std::equal(o1.begin(), o1.begin() + g.hq * g.hd, o2.begin()));
      CHECK(std::equal(l1.begin(), l1.begin() + g.hq, l2.begin()));
      CHECK_OK(kvc_attention_prefill(tw, l, 1, q.data(), 5, o1.data(), l1.data(), &a));
      CHECK_OK(kvc_attention_prefill(hw, l, 1, q.data(), 5, o2.data(), l2.data(), &a));
      CHECK(o1 == o2 && l1 == l2);
    }
    // Same bytes: per-token / per-group codecs of one head are a token-wise
    // row's slices; blocks of 4 tokens x 1 head, 3 x as many of them (23
    // tokens: 6 blocks per layer and head against 6 per layer).
    CHECK(in_use(hw) == in_use(tw));
    kvc_pool_destroy(tw);
    kvc_pool_destroy(hw);
  }
}

// f16 rows into int8 per-token, int4 group-8 and asymmetric int4 group-16
// pools (codec::quantize's direct path, from the group keys kvc_append
// computes once for all heads as its NaN / Inf check): a head-wise pool
// stores each head's rows with those heads' keys, the bytes a token-wise pool
// reads back; a NaN in the last head's last value writes nothing, and the
// message names it by the caller's [token][head][dim] (f16 and f32 rows).
KVTEST(headwise_f16_matches_tokenwise) {
  Geo g;
  g.layers = 1, g.hq = 4, g.hkv = 4, g.hd = 16, g.bs = 4;
  kvc_codec c[3];
  for (kvc_codec &x : c) kvc_codec_init(&x);
  c[0].dtype = KVC_DTYPE_INT8;
  c[0].granularity = KVC_SCALE_PER_TOKEN;
  c[1].dtype = c[2].dtype = KVC_DTYPE_INT4;
  c[1].granularity = c[2].granularity = KVC_SCALE_PER_GROUP;
  c[1].group_size = 8;
  c[2].group_size = 16;
  c[2].asymmetric = 1;
  for (const kvc_codec &codec : c) {
    kvc_pool *tw = make(g, false, &codec), *hw = make(g, true, &codec);
    const uint64_t n = 11;
    std::vector<float> kf(n * g.hkv * g.hd), vf(kf.size());
    for (size_t i = 0; i < kf.size(); ++i) {  // each head's rows of another size
      const float head = static_cast<float>(1 + (i / g.hd) % g.hkv * 7);
      kf[i] = head * std::sin(0.37f * static_cast<float>(i));
      vf[i] = head * std::cos(0.11f * static_cast<float>(i)) + 0.5f;
    }
    std::vector<uint16_t> k(kf.size()), v(kf.size());
    CHECK_OK(kvc_convert(kf.data(), KVC_DTYPE_F32, k.data(), KVC_DTYPE_F16, k.size()));
    CHECK_OK(kvc_convert(vf.data(), KVC_DTYPE_F32, v.data(), KVC_DTYPE_F16, v.size()));
    for (kvc_pool *p : {tw, hw}) {
      CHECK_OK(kvc_seq_create(p, 1));
      CHECK_OK(kvc_seq_reserve(p, 1, n, nullptr));
      CHECK_OK(kvc_append(p, 1, 0, 0, 7, k.data(), v.data(), KVC_DTYPE_F16));
      const size_t off = 7 * g.hkv * g.hd;  // the rest in a second call
      CHECK_OK(kvc_append(p, 1, 0, 7, n - 7, k.data() + off, v.data() + off, KVC_DTYPE_F16));
    }
    std::vector<float> k1(kf.size()), v1(kf.size()), k2(kf.size()), v2(kf.size());
    CHECK_OK(kvc_gather(tw, 1, 0, 0, n, k1.data(), v1.data(), KVC_DTYPE_F32, nullptr));
    CHECK_OK(kvc_gather(hw, 1, 0, 0, n, k2.data(), v2.data(), KVC_DTYPE_F32, nullptr));
    CHECK(k1 == k2 && v1 == v2);
    double err = 0;  // and they are the input's values, to the codec's step
    for (size_t i = 0; i < kf.size(); ++i)
      err = std::max(err, static_cast<double>(std::fabs(k1[i] - kf[i])) /
                              (1 + (i / g.hd) % g.hkv * 7));
    CHECK(err > 0 && err < (codec.dtype == KVC_DTYPE_INT8 ? 0.01 : 0.2));
    std::vector<uint16_t> bad = v;
    bad.back() = 0x7e00;  // NaN
    std::vector<float> k3(kf.size()), v3(kf.size());
    for (kvc_pool *p : {tw, hw}) {
      CHECK(kvc_append(p, 1, 0, 0, n, k.data(), bad.data(), KVC_DTYPE_F16) ==
            KVC_ERR_NON_FINITE);
      CHECK(std::strstr(kvc_last_error_message(), "v[10][3][15] is NaN") != nullptr);
      std::vector<float> badf = kf;  // f32 rows: the element named in the caller's order too
      badf[((n - 1) * g.hkv + 2) * g.hd + 5] = -INFINITY;
      CHECK(kvc_append(p, 1, 0, 0, n, badf.data(), vf.data(), KVC_DTYPE_F32) ==
            KVC_ERR_NON_FINITE);
      CHECK(std::strstr(kvc_last_error_message(), "k[10][2][5] is Inf") != nullptr);
      CHECK_OK(kvc_gather(p, 1, 0, 0, n, k3.data(), v3.data(), KVC_DTYPE_F32, nullptr));
      CHECK(k3 == k1 && v3 == v1);
    }
    kvc_pool_destroy(tw);
    kvc_pool_destroy(hw);
  }
}

// kvc_seq_keep_head keeps a different set in each head: each head frees its
// own blocks (pool counters), other heads stay, and decode attention equals a
// float64 softmax over each head's own kept tokens.
KVTEST(headwise_keep_frees_blocks) {
  Geo g;
  g.layers = 1, g.hq = 4, g.hkv = 2, g.hd = 8, g.bs = 4;
  kvc_pool *p = make(g, true);
  const uint64_t n = 40;
  const Data d = fill(p, g, 1, n);
  kvc_pool_layout lay;
  kvc_pool_layout_init(&lay);
  CHECK_OK(kvc_pool_get_layout(p, &lay));
  const uint64_t before = in_use(p);
  CHECK(before == 2 * 10 * lay.block_stride);
  // Head 0 keeps 8 tokens (20 %): 2 blocks; head 1 keeps 27 (t % 3 != 1): 7 blocks.
  std::vector<uint64_t> k0 = {0, 3, 7, 11, 20, 31, 38, 39}, k1;
  for (uint64_t t = 0; t < n; ++t)
    if (t % 3 != 1) k1.push_back(t);
  uint64_t dropped = 0;
  CHECK_OK(kvc_seq_keep_head(p, 1, 0, 0, k0.data(), k0.size(), &dropped));
  CHECK(dropped == n - k0.size());
  CHECK_OK(kvc_seq_keep_head(p, 1, 0, 1, k1.data(), k1.size(), &dropped));
  CHECK(dropped == n - k1.size());
  size_t nb0 = 0, nb1 = 0;
  CHECK_OK(kvc_seq_head_block_table(p, 1, 0, 0, nullptr, 0, &nb0));
  CHECK_OK(kvc_seq_head_block_table(p, 1, 0, 1, nullptr, 0, &nb1));
  CHECK(nb0 == 2 && nb1 == (k1.size() + 3) / 4);
  CHECK(in_use(p) == (nb0 + nb1) * lay.block_stride);
  std::vector<std::vector<int32_t>> kept = {head_positions(p, 1, 0, 0), head_positions(p, 1, 0, 1)};
  CHECK(kept[0] == std::vector<int32_t>(k0.begin(), k0.end()));
  CHECK(kept[1] == std::vector<int32_t>(k1.begin(), k1.end()));
  uint64_t most = 0;
  CHECK_OK(kvc_seq_layer_tokens(p, 1, 0, &most));
  CHECK(most == k1.size());
  kvc_stats st;
  kvc_stats_init(&st);
  CHECK_OK(kvc_pool_stats(p, &st));
  CHECK(st.tokens_stored == k0.size() + k1.size());  // (token, KV head) pairs
  const std::vector<float> q = evict_util::randn(g_rng, g.hq * g.hd);
  std::vector<float> out(g.hq * g.hd);
  kvc_attention_params a;
  kvc_attention_params_init(&a);
  a.num_q_heads = g.hq;
  const uint64_t id = 1;
  CHECK_OK(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), nullptr, &a));
  const std::vector<double> want = masked_attention(g, q, d, kept);
  double worst = 0.0;
  for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::fabs(out[i] - want[i]));
  CHECKF(worst < 1e-5, "largest difference %g", worst);
  // The next token is appended at each head's own index and attended to.
  CHECK_OK(kvc_seq_reserve(p, 1, 1, nullptr));
  const std::vector<float> kn = evict_util::randn(g_rng, g.hkv * g.hd),
                           vn = evict_util::randn(g_rng, g.hkv * g.hd);
  CHECK_OK(kvc_append(p, 1, 0, n, 1, kn.data(), vn.data(), KVC_DTYPE_F32));
  Data d2 = d;
  d2.k.insert(d2.k.end(), kn.begin(), kn.end());
  d2.v.insert(d2.v.end(), vn.begin(), vn.end());
  for (auto &kk : kept) kk.push_back(static_cast<int32_t>(n));
  CHECK(head_positions(p, 1, 0, 0) == kept[0] && head_positions(p, 1, 0, 1) == kept[1]);
  CHECK_OK(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), nullptr, &a));
  const std::vector<double> want2 = masked_attention(g, q, d2, kept);
  worst = 0.0;
  for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::fabs(out[i] - want2[i]));
  CHECKF(worst < 1e-5, "largest difference after an append %g", worst);
  kvc_pool_destroy(p);
}

// Uniform head budgets: each head keeps its own top-k of its own scores
// (TOVA on hand-made scores that differ per head).
KVTEST(headwise_evict_per_head_sets) {
  Geo g;
  g.layers = 2, g.hq = 4, g.hkv = 2, g.hd = 8, g.bs = 4;
  kvc_pool *p = make(g, true);
  const uint64_t n = 30, budget = 9;
  fill(p, g, 1, n);
  std::vector<std::vector<float>> sc(g.layers, std::vector<float>(n * g.hkv));
  for (uint32_t l = 0; l < g.layers; ++l) {
    for (uint64_t t = 0; t < n; ++t)
      for (uint32_t h = 0; h < g.hkv; ++h)
        sc[l][t * g.hkv + h] = static_cast<float>((t * (7 + 5 * h + l) + 3 * h) % 31) + 0.5f;
    CHECK_OK(kvc_seq_observe_scores(p, 1, l, sc[l].data(), n, 0));
  }
  kvc_policy *pol = policy(KVC_POLICY_TOVA, budget, KVC_HEAD_BUDGET_UNIFORM);
  std::vector<uint64_t> dropped(g.layers);
  CHECK_OK(kvc_evict(p, 1, pol, dropped.data()));
  for (uint32_t l = 0; l < g.layers; ++l) {
    CHECK(dropped[l] == g.hkv * (n - budget));
    for (uint32_t h = 0; h < g.hkv; ++h) {
      std::vector<int32_t> idx(n);
      std::iota(idx.begin(), idx.end(), 0);
      std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
        const float sa = sc[l][a * g.hkv + h], sb = sc[l][b * g.hkv + h];
        return sa > sb || (sa == sb && a > b);
      });
      std::vector<int32_t> want(idx.begin(), idx.begin() + budget);
      std::sort(want.begin(), want.end());
      CHECK(head_positions(p, 1, l, h) == want);
    }
    // The heads now differ: per-layer reads refuse, naming the per-head call.
    std::vector<int32_t> pos(n);
    CHECK_STATUS(kvc_gather(p, 1, l, 0, 1, nullptr, nullptr, KVC_DTYPE_F32, pos.data()),
                 KVC_ERR_UNSUPPORTED);
    std::vector<float> s(budget * g.hkv);
    CHECK_STATUS(kvc_seq_scores(p, 1, l, s.data(), budget), KVC_ERR_UNSUPPORTED);
  }
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

namespace {
// AdaKV's kept sets by the rule, written here: per head the rule's tokens
// (sinks, recent window) and its best floor(f x own candidate budget)
// candidates (at least one if the rule keeps none); then the rest of the
// summed budget to the best remaining candidates of all heads (ties: the
// newer token, then the lower head).
std::vector<std::vector<int32_t>> adakv_reference(const std::vector<float> &sc, uint32_t H,
                                                  uint64_t n, uint64_t budget, double f,
                                                  uint32_t sinks, uint32_t recent) {
  struct C {
    float s;
    uint32_t h;
    int32_t t;
  };
  auto better = [](const C &a, const C &b) {
    if (a.s != b.s) return a.s > b.s;
    if (a.t != b.t) return a.t > b.t;
    return a.h < b.h;
  };
  std::vector<std::vector<int32_t>> keep(H);
  std::vector<C> rest;
  uint64_t free_total = 0, taken = 0;
  const uint64_t s0 = std::min<uint64_t>(sinks, budget),
                 r0 = std::min<uint64_t>(recent, budget - s0), lo = std::min(s0, n - r0),
                 hi = n - r0;
  for (uint32_t h = 0; h < H; ++h) {
    std::vector<C> c;
    for (uint64_t t = lo; t < hi; ++t) c.push_back({sc[t * H + h], h, static_cast<int32_t>(t)});
    std::sort(c.begin(), c.end(), better);
    const uint64_t fr = std::min<uint64_t>(budget - (lo + n - hi), c.size());
    free_total += fr;
    uint64_t fl = static_cast<uint64_t>(std::floor(f * fr));
    if (lo + n - hi == 0 && fr > 0) fl = std::max<uint64_t>(fl, 1);
    fl = std::min<uint64_t>(fl, c.size());
    for (uint64_t i = 0; i < fl; ++i) keep[h].push_back(c[i].t);
    taken += fl;
    rest.insert(rest.end(), c.begin() + fl, c.end());
    for (uint64_t t = 0; t < lo; ++t) keep[h].push_back(static_cast<int32_t>(t));
    for (uint64_t t = hi; t < n; ++t) keep[h].push_back(static_cast<int32_t>(t));
  }
  std::sort(rest.begin(), rest.end(), better);
  for (uint64_t i = 0; i < std::min<uint64_t>(free_total - taken, rest.size()); ++i)
    keep[rest[i].h].push_back(rest[i].t);
  for (auto &k : keep) std::sort(k.begin(), k.end());
  return keep;
}
}  // namespace

// AdaKV on KVzip-style scores (sinks + recent window + candidates) and on TOVA
// (no rule tokens): exact kept sets, the layer's total kept equal to H x B,
// and a head whose scores are low everywhere still keeps its floor.
KVTEST(adakv_exact_kept_sets) {
  Geo g;
  g.layers = 1, g.hq = 8, g.hkv = 4, g.hd = 8, g.bs = 4;
  const uint64_t n = 48, budget = 12;
  struct Case {
    kvc_policy_kind kind;
    uint32_t sinks, recent;
    double floor;
  } cases[] = {{KVC_POLICY_KVZIP, 2, 3, 0.2},
               {KVC_POLICY_TOVA, 0, 0, 0.2},
               {KVC_POLICY_TOVA, 0, 0, 0.0},
               {KVC_POLICY_KVZIP, 4, 0, 1.0}};
  for (const Case &cs : cases) {
    kvc_pool *p = make(g, true);
    fill(p, g, 1, n);
    std::vector<float> sc(n * g.hkv);
    for (uint64_t t = 0; t < n; ++t)
      for (uint32_t h = 0; h < g.hkv; ++h)  // head 3 scores low everywhere; head 0 high
        sc[t * g.hkv + h] = (h == 3 ? 0.01f : 1.0f / (1 + h)) *
                            static_cast<float>((t * (11 + 2 * h) + 5 * h) % 47 + 1);
    CHECK_OK(kvc_seq_observe_scores(p, 1, 0, sc.data(), n, 0));
    kvc_policy *pol = policy(cs.kind, budget, KVC_HEAD_BUDGET_ADAKV, cs.floor, cs.sinks, cs.recent);
    uint64_t dropped = 0;
    CHECK_OK(kvc_evict(p, 1, pol, &dropped));
    const auto want = adakv_reference(sc, g.hkv, n, budget, cs.floor, cs.sinks, cs.recent);
    uint64_t total = 0;
    for (uint32_t h = 0; h < g.hkv; ++h) {
      const std::vector<int32_t> got = head_positions(p, 1, 0, h);
      CHECKF(got == want[h], "kind %d floor %g head %u: kept %zu, want %zu", cs.kind, cs.floor, h,
             got.size(), want[h].size());
      CHECKF(!got.empty(), "head %u emptied", h);
      total += got.size();
    }
    CHECKF(total == g.hkv * budget, "kept %llu of %llu", (unsigned long long)total,
           (unsigned long long)(g.hkv * budget));
    CHECK(dropped == g.hkv * n - total);
    // The budgets really moved (head 0 keeps more than B, head 3 fewer), except
    // with a floor of 1: every head keeps its own budget.
    if (cs.floor < 1.0) {
      CHECK(head_positions(p, 1, 0, 0).size() > budget);
      CHECK(head_positions(p, 1, 0, 3).size() < budget);
    } else {
      for (uint32_t h = 0; h < g.hkv; ++h) CHECK(head_positions(p, 1, 0, h).size() == budget);
    }
    kvc_policy_destroy(pol);
    kvc_pool_destroy(p);
  }
}

// KVzip under a compression ratio shares one threshold over every (layer,
// head) table; AdaKV's floor is taken first from each table's own (uniform)
// budget: a floor of 1 leaves nothing to share (every head keeps B), a floor
// of 0 is the plain shared threshold (heads with low scores keep fewer).
KVTEST(adakv_shared_threshold_floor) {
  Geo g;
  g.layers = 2, g.hq = 4, g.hkv = 2, g.hd = 8, g.bs = 4;
  const uint64_t n = 40;
  for (double floor : {0.0, 0.5, 1.0}) {
    kvc_pool *p = make(g, true);
    fill(p, g, 1, n);
    for (uint32_t l = 0; l < g.layers; ++l) {
      std::vector<float> sc(n * g.hkv);
      for (uint64_t t = 0; t < n; ++t)
        for (uint32_t h = 0; h < g.hkv; ++h)  // layer 0 head 0 scores high, layer 1 head 1 lowest
          sc[t * g.hkv + h] = (l == 0 && h == 0 ? 10.0f : l == 1 && h == 1 ? 0.001f : 0.1f) *
                              float((t * 7 + h) % 13 + 1);
      CHECK_OK(kvc_seq_observe_scores(p, 1, l, sc.data(), n, 0));
    }
    kvc_policy_config c;
    kvc_policy_config_init(&c);
    c.kind = KVC_POLICY_KVZIP;
    c.compression_ratio = 0.5;  // B = 20 of 40 in every table
    c.sink_tokens = 2;
    c.head_budget = KVC_HEAD_BUDGET_ADAKV;
    c.head_floor = floor;
    kvc_policy *pol = nullptr;
    CHECK_OK(kvc_policy_create(&c, &pol));
    CHECK_OK(kvc_evict(p, 1, pol, nullptr));
    uint64_t total = 0, top = 0, least = n;
    for (uint32_t l = 0; l < g.layers; ++l)
      for (uint32_t h = 0; h < g.hkv; ++h) {
        const uint64_t k = head_positions(p, 1, l, h).size();
        total += k;
        if (l == 0 && h == 0) top = k;
        least = std::min(least, k);
      }
    CHECKF(total == 4 * 20, "floor %g: kept %llu", floor, (unsigned long long)total);
    const uint64_t floor_keep = 2 + static_cast<uint64_t>(std::floor(floor * 18));
    CHECKF(least >= floor_keep, "floor %g: a table keeps %llu < %llu", floor,
           (unsigned long long)least, (unsigned long long)floor_keep);
    if (floor == 1.0) CHECK(top == 20);
    // Otherwise its scores win the shared budget it can hold; without a floor
    // some table falls below the 2 + 9 a floor of 0.5 guarantees.
    if (floor < 1.0) CHECK(top == n);
    if (floor == 0.0) CHECK(least < 11);
    kvc_policy_destroy(pol);
    kvc_pool_destroy(p);
  }
}

// AdaKV needs a head-wise pool: refused when attached to or run on a
// token-wise one, with nothing changed; bad floors and kinds refused at create.
KVTEST(adakv_refused) {
  Geo g;
  kvc_pool *p = make(g, false);
  fill(p, g, 1, 20);
  const uint64_t before = in_use(p);
  std::vector<float> sc(20 * g.hkv, 1.0f);
  CHECK_OK(kvc_seq_observe_scores(p, 1, 0, sc.data(), 20, 0));
  kvc_policy *pol = policy(KVC_POLICY_TOVA, 5, KVC_HEAD_BUDGET_ADAKV);
  CHECK_STATUS(kvc_seq_set_policy(p, 1, pol), KVC_ERR_UNSUPPORTED);
  CHECK_STATUS(kvc_pool_set_policy(p, pol), KVC_ERR_UNSUPPORTED);
  CHECK_STATUS(kvc_evict(p, 1, pol, nullptr), KVC_ERR_UNSUPPORTED);
  uint64_t n = 0;
  CHECK_OK(kvc_seq_layer_tokens(p, 1, 0, &n));
  CHECK(n == 20 && in_use(p) == before);
  kvc_policy_destroy(pol);
  kvc_policy_config c;
  kvc_policy_config_init(&c);
  c.kind = KVC_POLICY_TOVA;
  c.budget_tokens = 4;
  kvc_policy *bad = nullptr;
  for (double f : {-0.1, 1.5, std::nan("")}) {
    c.head_floor = f;
    CHECK_STATUS(kvc_policy_create(&c, &bad), KVC_ERR_INVALID_ARGUMENT);
  }
  c.head_floor = 0.2;
  for (int hb : {2, -1}) {
    c.head_budget = static_cast<kvc_head_budget>(hb);
    CHECK_STATUS(kvc_policy_create(&c, &bad), KVC_ERR_INVALID_ARGUMENT);
  }
  CHECK(bad == nullptr);
  // A token-wise pool's head calls: one table for all heads; no per-head keep.
  size_t nb = 0;
  CHECK_OK(kvc_seq_head_block_table(p, 1, 0, 1, nullptr, 0, &nb));
  CHECK(nb == 5);
  const uint64_t keep[] = {0, 1};
  CHECK_STATUS(kvc_seq_keep_head(p, 1, 0, 0, keep, 2, nullptr), KVC_ERR_UNSUPPORTED);
  int32_t indptr[8], idx[64], last[8];
  size_t ni = 0;
  const uint64_t id = 1;
  CHECK_STATUS(kvc_export_head_page_table(p, 0, &id, 1, indptr, idx, 64, last, &ni),
               KVC_ERR_UNSUPPORTED);
  kvc_pool_destroy(p);
}

// Fork and copy-on-write per head: the child's head-wise eviction leaves the
// parent's tokens and bytes as they were; shared blocks are copied only where
// written; a record of the evicted child restores into a new head-wise pool
// with every head as it was, and is refused by a token-wise pool of
// num_layers x num_kv_heads layers.
KVTEST(headwise_fork_save_restore) {
  Geo g;
  g.layers = 2, g.hq = 4, g.hkv = 2, g.hd = 8, g.bs = 4;
  kvc_pool *p = make(g, true);
  const uint64_t n = 24;
  const Data d = fill(p, g, 1, n);
  CHECK_OK(kvc_seq_fork(p, 1, 2));
  const uint64_t shared = in_use(p);
  const std::vector<uint64_t> keep = {0, 1, 2, 3, 9, 23};  // block 0 kept in place
  CHECK_OK(kvc_seq_keep_head(p, 2, 1, 1, keep.data(), keep.size(), nullptr));
  kvc_pool_layout lay;
  kvc_pool_layout_init(&lay);
  CHECK_OK(kvc_pool_get_layout(p, &lay));
  // Blocks 1 (tokens 9, 23 moved into it) copied; block 0 untouched stays shared.
  CHECK(in_use(p) == shared + lay.block_stride);
  for (uint32_t l = 0; l < g.layers; ++l) {  // the parent: every head as appended
    std::vector<float> k(n * g.hkv * g.hd), v(k.size());
    CHECK_OK(kvc_gather(p, 1, l, 0, n, k.data(), v.data(), KVC_DTYPE_F32, nullptr));
    CHECK(k == d.k && v == d.v);
  }
  CHECK(head_positions(p, 2, 1, 1) == std::vector<int32_t>(keep.begin(), keep.end()));
  CHECK(head_positions(p, 2, 1, 0).size() == n);
  size_t size = 0;
  CHECK_STATUS(kvc_seq_save(p, 2, nullptr, 0, &size), KVC_ERR_BUFFER_TOO_SMALL);
  std::vector<uint8_t> rec(size);
  CHECK_OK(kvc_seq_save(p, 2, rec.data(), rec.size(), &size));
  kvc_pool *q = make(g, true);
  CHECK_OK(kvc_seq_restore(q, 7, rec.data(), rec.size()));
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t h = 0; h < g.hkv; ++h) {
      const std::vector<int32_t> pos = head_positions(q, 7, l, h);
      CHECK(pos == head_positions(p, 2, l, h));
      std::vector<float> a(pos.size() * g.hd), b(a.size());
      CHECK_OK(kvc_gather_head(p, 2, l, h, 0, pos.size(), a.data(), nullptr, KVC_DTYPE_F32,
                               nullptr));
      CHECK_OK(kvc_gather_head(q, 7, l, h, 0, pos.size(), b.data(), nullptr, KVC_DTYPE_F32,
                               nullptr));
      CHECK(a == b);
    }
  Geo flat = g;  // token-wise, num_layers x num_kv_heads layers of one KV head
  flat.layers = g.layers * g.hkv, flat.hkv = 1, flat.hq = g.hq / g.hkv;
  kvc_pool *t = make(flat, false);
  CHECK_STATUS(kvc_seq_restore(t, 7, rec.data(), rec.size()), KVC_ERR_INCOMPATIBLE);
  kvc_pool_destroy(t);
  kvc_pool_destroy(q);
  kvc_pool_destroy(p);
}

// Prefix sharing of the unevicted prefix: a head-wise sequence's full blocks
// are registered for every (layer, head) table and attached by a later
// prompt without copies; a head-wise eviction of the attached sequence copies
// what it rewrites, so the registered prompt still matches, byte for byte.
KVTEST(headwise_prefix_sharing) {
  Geo g;
  g.layers = 2, g.hq = 4, g.hkv = 2, g.hd = 8, g.bs = 4;
  kvc_pool *p = make(g, true);
  kvc_prefix_config pc;
  kvc_prefix_config_init(&pc);
  CHECK_OK(kvc_pool_enable_prefix_cache(p, &pc));
  const uint64_t n = 16;
  const Data d = fill(p, g, 1, n);
  std::vector<int32_t> toks(n + 2);
  std::iota(toks.begin(), toks.end(), 100);
  uint64_t reg = 0;
  CHECK_OK(kvc_prefix_insert(p, 1, toks.data(), n, nullptr, 0, &reg));
  CHECK(reg == 4);
  const uint64_t held = in_use(p);
  kvc_prefix_result r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  CHECK_OK(kvc_prefix_attach(p, 2, toks.data(), n + 2, nullptr, 0, 0, &r));
  CHECK(r.hit_tokens == n);
  CHECK(in_use(p) == held);  // the 4 blocks x 2 layers x 2 heads are shared, not copied
  const uint64_t keep[] = {0, 1, 2, 3, 14, 15};
  CHECK_OK(kvc_seq_keep_head(p, 2, 0, 1, keep, 6, nullptr));
  CHECK(head_positions(p, 2, 0, 1) == std::vector<int32_t>({0, 1, 2, 3, 14, 15}));
  std::vector<float> k(n * g.hkv * g.hd);
  for (uint32_t l = 0; l < g.layers; ++l) {
    CHECK_OK(kvc_gather(p, 1, l, 0, n, k.data(), nullptr, KVC_DTYPE_F32, nullptr));
    CHECK(k == d.k);
  }
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  CHECK_OK(kvc_prefix_attach(p, 3, toks.data(), n + 2, nullptr, 0, 0, &r));
  CHECK(r.hit_tokens == n);
  for (uint32_t l = 0; l < g.layers; ++l) {
    CHECK_OK(kvc_gather(p, 3, l, 0, n, k.data(), nullptr, KVC_DTYPE_F32, nullptr));
    CHECK(k == d.k);
  }
  kvc_pool_destroy(p);
}

// Offload: a head-wise pool's prefix blocks (one per (layer, head) per block
// of tokens) written to a disk tier and loaded into another pool of the same
// configuration and seed hold each head's K/V exactly; a token-wise pool of
// layers x heads tables does not find them (the fingerprint has the flag).
KVTEST(headwise_tier_round_trip) {
  Geo g;
  g.layers = 2, g.hq = 4, g.hkv = 2, g.hd = 8, g.bs = 4;
  const std::string dir = kvtest::temp_dir("kvc_headwise_tier");
  auto prefix_pool = [&](const Geo &geo, bool headwise) {
    kvc_pool *p = make(geo, headwise);
    kvc_prefix_config pc;
    kvc_prefix_config_init(&pc);
    for (size_t i = 0; i < sizeof pc.seed; ++i) pc.seed[i] = static_cast<uint8_t>(i * 7 + 1);
    pc.seed_set = 1;
    CHECK_OK(kvc_pool_enable_prefix_cache(p, &pc));
    kvc_tier_config tc;
    CHECK_OK(kvc_tier_config_init(&tc, KVC_TIER_DISK));
    tc.capacity_bytes = 1 << 22;
    tc.path = dir.c_str();
    CHECK_OK(kvc_pool_add_tier(p, &tc, nullptr));
    return p;
  };
  const uint64_t n = 16;
  std::vector<int32_t> toks(n + 2);  // a prompt of 18: its first 16 (4 blocks) are cached
  std::iota(toks.begin(), toks.end(), 300);
  kvc_pool *a = prefix_pool(g, true);
  const Data d = fill(a, g, 1, n);
  CHECK_OK(kvc_prefix_insert(a, 1, toks.data(), n, nullptr, 0, nullptr));
  uint64_t queued = 0;
  CHECK_OK(kvc_prefix_offload(a, toks.data(), n, nullptr, 0, &queued));
  CHECK(queued == 4);  // one record per block of tokens (every layer and head in it)
  CHECK_OK(kvc_pool_flush_tiers(a));
  kvc_pool_destroy(a);

  kvc_pool *b = prefix_pool(g, true);
  uint64_t loaded = 0;
  CHECK_OK(kvc_prefix_load(b, toks.data(), n + 2, nullptr, 0, &loaded));
  CHECK(loaded == n);
  kvc_prefix_result r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  CHECK_OK(kvc_prefix_attach(b, 2, toks.data(), n + 2, nullptr, 0, 0, &r));
  CHECK(r.hit_tokens == n);
  std::vector<float> k(n * g.hd), v(n * g.hd);
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t h = 0; h < g.hkv; ++h) {
      CHECK_OK(kvc_gather_head(b, 2, l, h, 0, n, k.data(), v.data(), KVC_DTYPE_F32, nullptr));
      bool same = true;
      for (uint64_t t = 0; t < n; ++t)
        for (uint32_t a2 = 0; a2 < g.hd; ++a2)
          same = same && k[t * g.hd + a2] == d.k[(t * g.hkv + h) * g.hd + a2] &&
                 v[t * g.hd + a2] == d.v[(t * g.hkv + h) * g.hd + a2];
      CHECK(same);
    }
  kvc_pool_destroy(b);

  Geo tw = g;  // a token-wise pool whose tables have the same shape
  tw.layers = g.layers * g.hkv, tw.hq = g.hq / g.hkv, tw.hkv = 1;
  kvc_pool *c = prefix_pool(tw, false);
  loaded = 99;
  CHECK_OK(kvc_prefix_load(c, toks.data(), n + 2, nullptr, 0, &loaded));
  CHECK(loaded == 0);
  kvc_pool_destroy(c);
  kvtest::remove_dir(dir);
}

// The page table has one row per (sequence, KV head), equal to the heads'
// block tables; per-layer tables are refused in a head-wise pool.
KVTEST(headwise_page_table) {
  Geo g;
  g.layers = 1, g.hq = 6, g.hkv = 3, g.hd = 8, g.bs = 4;
  kvc_pool *p = make(g, true);
  fill(p, g, 1, 17);
  fill(p, g, 2, 9);
  const uint64_t keep[] = {1, 4, 8, 15, 16};
  CHECK_OK(kvc_seq_keep_head(p, 1, 0, 2, keep, 5, nullptr));
  const uint64_t ids[] = {2, 1};
  int32_t indptr[7], last[6], idx[64];
  size_t ni = 0;
  CHECK_STATUS(kvc_export_head_page_table(p, 0, ids, 2, indptr, idx, 3, last, &ni),
               KVC_ERR_BUFFER_TOO_SMALL);
  CHECK(ni == 3 * 3 + 5 + 5 + 2);
  CHECK_OK(kvc_export_head_page_table(p, 0, ids, 2, indptr, idx, 64, last, &ni));
  for (size_t i = 0; i < 2; ++i)
    for (uint32_t h = 0; h < 3; ++h) {
      const size_t row = i * 3 + h;
      int32_t tab[16];
      size_t nb = 0;
      CHECK_OK(kvc_seq_head_block_table(p, ids[i], 0, h, tab, 16, &nb));
      CHECK(static_cast<size_t>(indptr[row + 1] - indptr[row]) == nb);
      CHECK(std::equal(tab, tab + nb, idx + indptr[row]));
      uint64_t nt = 0;
      CHECK_OK(kvc_seq_head_tokens(p, ids[i], 0, h, &nt));
      CHECK(last[row] == static_cast<int32_t>(nt - (nb - 1) * 4));
    }
  int32_t tab[16];
  size_t nb = 0;
  CHECK_STATUS(kvc_seq_block_table(p, 1, 0, tab, 16, &nb), KVC_ERR_UNSUPPORTED);
  CHECK_STATUS(kvc_export_page_table(p, 0, ids, 2, indptr, idx, 64, last, &ni),
               KVC_ERR_UNSUPPORTED);
  uint64_t nt = 0;
  CHECK_STATUS(kvc_seq_head_tokens(p, 1, 0, 3, &nt), KVC_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kvc_seq_head_block_table(p, 1, 1, 0, tab, 16, &nb), KVC_ERR_OUT_OF_RANGE);
  kvc_pool_destroy(p);
}

// Refusals: configurations a head-wise pool does not take; a NaN in one
// head's rows of a quantized append writes no head; keep_head's bad indices
// change nothing.
KVTEST(headwise_bad_input) {
  Geo g;
  g.layers = 1, g.hq = 4, g.hkv = 2, g.hd = 8, g.bs = 4;
  kvc_codec tensor;
  kvc_codec_init(&tensor);
  tensor.dtype = KVC_DTYPE_INT8;
  tensor.granularity = KVC_SCALE_PER_TENSOR;
  CHECK(make(g, true, &tensor, 64, KVC_ERR_UNSUPPORTED) == nullptr);
  kvc_codec wide;  // groups spanning two heads
  kvc_codec_init(&wide);
  wide.dtype = KVC_DTYPE_INT8;
  wide.granularity = KVC_SCALE_PER_GROUP;
  wide.group_size = 16;
  CHECK(make(g, true, &wide, 64, KVC_ERR_UNSUPPORTED) == nullptr);
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = 1, c.num_q_heads = 4, c.num_kv_heads = 2, c.head_dim = 8, c.num_blocks = 8;
  c.flags = KVC_POOL_HEADWISE;
  c.layout = KVC_LAYOUT_HND;
  kvc_pool *bad = nullptr;
  CHECK_STATUS(kvc_pool_create(&c, &bad), KVC_ERR_UNSUPPORTED);
  c.layout = KVC_LAYOUT_NHD;
  c.device = KVC_DEVICE_CUDA;
  const kvc_status cuda = kvc_pool_create(&c, &bad);
  CHECK(cuda == KVC_ERR_UNSUPPORTED || cuda == KVC_ERR_DEVICE_UNAVAILABLE);
  c.device = KVC_DEVICE_CPU;
  c.num_layers = 4096, c.num_kv_heads = 512, c.num_q_heads = 512;
  CHECK_STATUS(kvc_pool_create(&c, &bad), KVC_ERR_INVALID_ARGUMENT);
  CHECK(bad == nullptr);

  kvc_codec i8;
  kvc_codec_init(&i8);
  i8.dtype = KVC_DTYPE_INT8;
  i8.granularity = KVC_SCALE_PER_TOKEN;
  kvc_pool *p = make(g, true, &i8);
  const Data d = fill(p, g, 1, 8);
  CHECK_OK(kvc_seq_reserve(p, 1, 2, nullptr));
  std::vector<float> k = evict_util::randn(g_rng, 2 * g.hkv * g.hd), v = k;
  k[1 * g.hkv * g.hd + 1 * g.hd + 3] = std::nanf("");  // token 1, head 1
  CHECK_STATUS(kvc_append(p, 1, 0, 8, 2, k.data(), v.data(), KVC_DTYPE_F32), KVC_ERR_NON_FINITE);
  std::vector<float> got(2 * g.hkv * g.hd, 1.0f);  // unwritten slots read as zeros
  CHECK_OK(kvc_gather(p, 1, 0, 8, 2, got.data(), nullptr, KVC_DTYPE_F32, nullptr));
  CHECK(std::all_of(got.begin(), got.end(), [](float x) { return x == 0.0f; }));
  const uint64_t before = in_use(p);
  const uint64_t dup[] = {1, 1}, past[] = {3, 10};
  CHECK_STATUS(kvc_seq_keep_head(p, 1, 0, 1, dup, 2, nullptr), KVC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kvc_seq_keep_head(p, 1, 0, 1, past, 2, nullptr), KVC_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kvc_seq_keep_head(p, 1, 0, 2, past, 1, nullptr), KVC_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kvc_seq_keep_head(p, 1, 0, 0, nullptr, 1, nullptr), KVC_ERR_NULL_POINTER);
  for (uint32_t h = 0; h < 2; ++h) CHECK(head_positions(p, 1, 0, h).size() == 10);
  CHECK(in_use(p) == before);
  std::vector<float> row(8 * g.hd);
  CHECK_STATUS(kvc_gather_head(p, 1, 0, 2, 0, 1, row.data(), nullptr, KVC_DTYPE_F32, nullptr),
               KVC_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kvc_gather_head(p, 1, 0, 0, 5, 6, row.data(), nullptr, KVC_DTYPE_F32, nullptr),
               KVC_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kvc_gather_head(p, 1, 0, 0, 0, 1, row.data(), nullptr, KVC_DTYPE_INT8, nullptr),
               KVC_ERR_INVALID_ARGUMENT);
  // A caller's layer past the pool's (or one whose x heads wraps 32 bits) is refused.
  kvc_attention_params a;
  kvc_attention_params_init(&a);
  a.num_q_heads = g.hq;
  std::vector<float> q(g.hq * g.hd, 0.5f), out(g.hq * g.hd);
  const uint64_t id = 1;
  for (uint32_t layer : {1u, 0x80000000u, 0xffffffffu}) {
    CHECK_STATUS(kvc_attention_decode(p, layer, &id, 1, q.data(), out.data(), nullptr, &a),
                 KVC_ERR_OUT_OF_RANGE);
    CHECK_STATUS(kvc_append(p, 1, layer, 8, 1, k.data(), v.data(), KVC_DTYPE_F32),
                 KVC_ERR_OUT_OF_RANGE);
    uint64_t nt = 0;
    CHECK_STATUS(kvc_seq_head_tokens(p, 1, layer, 0, &nt), KVC_ERR_OUT_OF_RANGE);
  }
  (void)d;
  kvc_pool_destroy(p);
}

// Findings of the adversarial review, each kept fixed: AdaKV's H x budget
// saturates; a head holding fewer tokens than the budget leaves the rest to
// the others; AdaKV over rule-only policies and shift_positions in head-wise
// pools are refused; a head-wise pool of one KV head is head-wise; an append
// past the reservation is refused before its rows are read.
KVTEST(headwise_review_regressions) {
  Geo g;
  g.layers = 1, g.hq = 4, g.hkv = 2, g.hd = 8, g.bs = 4;
  {  // budget 2^62 + 5 under auto_evict: nothing evicted
    kvc_pool *p = make(g, true);
    fill(p, g, 1, 40);
    kvc_policy_config c;
    kvc_policy_config_init(&c);
    c.kind = KVC_POLICY_KNORM;
    c.budget_tokens = (uint64_t(1) << 62) + 5;
    c.head_budget = KVC_HEAD_BUDGET_ADAKV;
    c.auto_evict = 1;
    kvc_policy *pol = nullptr;
    CHECK_OK(kvc_policy_create(&c, &pol));
    CHECK_OK(kvc_seq_set_policy(p, 1, pol));
    CHECK_OK(kvc_seq_reserve(p, 1, 1, nullptr));
    for (uint32_t h = 0; h < g.hkv; ++h) CHECK(head_positions(p, 1, 0, h).size() == 41);
    kvc_policy_destroy(pol);
    kvc_pool_destroy(p);
  }
  {  // head 1 holds 3 of a budget of 6: the layer still keeps 2 x 6
    kvc_pool *p = make(g, true);
    fill(p, g, 1, 20);
    const uint64_t k3[] = {0, 10, 19};
    CHECK_OK(kvc_seq_keep_head(p, 1, 0, 1, k3, 3, nullptr));
    kvc_policy *pol = policy(KVC_POLICY_KNORM, 6, KVC_HEAD_BUDGET_ADAKV);
    CHECK_OK(kvc_evict(p, 1, pol, nullptr));
    const size_t k0 = head_positions(p, 1, 0, 0).size(), k1 = head_positions(p, 1, 0, 1).size();
    CHECKF(k0 + k1 == 12 && k1 >= 1 && k1 <= 3, "kept %zu + %zu", k0, k1);
    kvc_policy_destroy(pol);
    kvc_pool_destroy(p);
  }
  kvc_policy_config c;
  kvc_policy_config_init(&c);
  c.kind = KVC_POLICY_STREAMING;
  c.budget_tokens = 6;
  c.head_budget = KVC_HEAD_BUDGET_ADAKV;
  kvc_policy *bad = nullptr;
  CHECK_STATUS(kvc_policy_create(&c, &bad), KVC_ERR_INVALID_ARGUMENT);
  CHECK(bad == nullptr);
  {  // shift_positions: refused when attached or run
    kvc_pool_config pc = evict_util::pool_config(g, 64);
    pc.flags = KVC_POOL_HEADWISE;
    pc.rope_style = KVC_ROPE_NEOX;
    kvc_pool *p = nullptr;
    CHECK_OK(kvc_pool_create(&pc, &p));
    fill(p, g, 1, 20);
    kvc_policy_config_init(&c);
    c.kind = KVC_POLICY_KNORM;
    c.budget_tokens = 8;
    c.shift_positions = 1;
    kvc_policy *sh = nullptr;
    CHECK_OK(kvc_policy_create(&c, &sh));
    CHECK_STATUS(kvc_seq_set_policy(p, 1, sh), KVC_ERR_UNSUPPORTED);
    CHECK_STATUS(kvc_evict(p, 1, sh, nullptr), KVC_ERR_UNSUPPORTED);
    CHECK(head_positions(p, 1, 0, 0).size() == 20);
    kvc_policy_destroy(sh);
    kvc_pool_destroy(p);
  }
  {  // one KV head (MQA) with the flag: still head-wise
    Geo one = g;
    one.hkv = 1;
    kvc_pool *p = make(one, true);
    fill(p, one, 1, 10);
    const uint64_t keep[] = {0, 9};
    CHECK_OK(kvc_seq_keep_head(p, 1, 0, 0, keep, 2, nullptr));
    int32_t tab[8];
    size_t nb = 0;
    CHECK_STATUS(kvc_seq_block_table(p, 1, 0, tab, 8, &nb), KVC_ERR_UNSUPPORTED);
    kvc_policy *ada = policy(KVC_POLICY_TOVA, 1, KVC_HEAD_BUDGET_ADAKV);
    CHECK_OK(kvc_seq_set_policy(p, 1, ada));
    kvc_policy_destroy(ada);
    kvc_pool_destroy(p);
  }
  {  // an append past the reservation: refused before the rows are read
    kvc_pool *p = make(g, true);
    fill(p, g, 1, 4);
    CHECK_OK(kvc_seq_reserve(p, 1, 4, nullptr));
    std::vector<float> rows(4 * g.hkv * g.hd, 1.0f);  // 4 rows; 5 asked
    CHECK_STATUS(kvc_append(p, 1, 0, 4, 5, rows.data(), rows.data(), KVC_DTYPE_F32),
                 KVC_ERR_NOT_RESERVED);
    kvc_pool_destroy(p);
  }
}

int main(int argc, char **argv) {
  return kvtest_main(argc, argv);
}
