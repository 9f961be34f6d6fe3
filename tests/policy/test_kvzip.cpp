// KVzip eviction (KVC_POLICY_KVZIP, arXiv 2505.23416) and the max-pooling
// observe mode it reads (KVC_OBSERVE_MAX): recorded maxima against a float64
// softmax reference, exact kept sets on hand-made score patterns, the whole
// context-reconstruction flow an engine runs (fork, feed the context again,
// observe the maxima, hand them to the parent, evict), budgets that never
// floor to zero, and refusals that change nothing.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "../whitebox.h"
#include "api/internal.h"
#include "evict_util.h"

namespace {

using evict_util::Geo;
using evict_util::make_pool;
using evict_util::positions;
using evict_util::Seq;

std::mt19937 g_rng(23);

kvc_policy *kvzip_policy(uint64_t budget, uint32_t recent = 0, double ratio = 0.0,
                         uint32_t sinks = 0) {
  kvc_policy_config c;
  kvc_policy_config_init(&c);
  c.kind = KVC_POLICY_KVZIP;
  c.sink_tokens = sinks;
  c.budget_tokens = budget;
  c.recent_tokens = recent;
  c.compression_ratio = ratio;
  kvc_policy *pol = nullptr;
  CHECK_OK(kvc_policy_create(&c, &pol));
  return pol;
}

// Largest softmax probability per (token, KV head) over query rows and the
// KV head's query heads, in float64. Row r of `q` ([m][hq][hd]) sees tokens
// [0, visible[r]) of `k` ([n][hkv][hd]); scale 1/sqrt(hd).
std::vector<double> max_attention(const Geo &g, const std::vector<float> &q, uint64_t m,
                                  const std::vector<float> &k, uint64_t n,
                                  const std::vector<uint64_t> &visible) {
  const uint32_t grp = g.hq / g.hkv;
  std::vector<double> best(n * g.hkv, 0.0);
  for (uint64_t r = 0; r < m; ++r)
    for (uint32_t j = 0; j < g.hq; ++j) {
      const uint32_t h = j / grp;
      std::vector<double> z(visible[r]);
      double zmax = -INFINITY, sum = 0.0;
      for (uint64_t t = 0; t < visible[r]; ++t) {
        double dot = 0.0;
        for (uint32_t a = 0; a < g.hd; ++a)
          dot += double(q[(r * g.hq + j) * g.hd + a]) * k[(t * g.hkv + h) * g.hd + a];
        z[t] = dot / std::sqrt(double(g.hd));
        zmax = std::max(zmax, z[t]);
      }
      for (uint64_t t = 0; t < visible[r]; ++t) sum += std::exp(z[t] - zmax);
      for (uint64_t t = 0; t < visible[r]; ++t)
        best[t * g.hkv + h] = std::max(best[t * g.hkv + h], std::exp(z[t] - zmax) / sum);
    }
  return best;
}

// The kept positions: the first `sinks`, the newest `recent`, then the highest
// scores summed over the heads between them (ties: the newer token), sorted.
std::vector<int32_t> reference_keep(const std::vector<double> &scores, uint64_t n, uint32_t hkv,
                                    uint64_t target, uint64_t recent, uint64_t sinks = 0) {
  std::vector<float> s(n, 0.0f);  // summed in f32, head by head, as the library does
  for (uint64_t t = 0; t < n; ++t)
    for (uint32_t h = 0; h < hkv; ++h) s[t] += static_cast<float>(scores[t * hkv + h]);
  std::vector<uint64_t> idx(n - recent - sinks);
  std::iota(idx.begin(), idx.end(), sinks);
  std::sort(idx.begin(), idx.end(),
            [&](uint64_t a, uint64_t b) { return s[a] > s[b] || (s[a] == s[b] && a > b); });
  std::vector<int32_t> keep;
  for (uint64_t t = 0; t < sinks; ++t) keep.push_back(static_cast<int32_t>(t));
  for (uint64_t i = 0; i < target - recent - sinks; ++i)
    keep.push_back(static_cast<int32_t>(idx[i]));
  for (uint64_t t = n - recent; t < n; ++t) keep.push_back(static_cast<int32_t>(t));
  std::sort(keep.begin(), keep.end());
  return keep;
}

}  // namespace

// KVC_OBSERVE_MAX over a prefill chunk (causal, observe_from) and a decode
// row (observe_from applies to prefill rows only): each recorded score is the
// largest probability, not a sum.
KVTEST(kvzip_observe_max_matches_reference) {
  Geo g;
  g.hd = 16;
  kvc_pool *p = make_pool(g);
  const uint64_t n = 37, m = 9, from = 2;
  const Seq s = evict_util::fill(p, g, g_rng, 1, n);
  std::vector<float> qp = evict_util::randn(g_rng, m * g.hq * g.hd),
                     qd = evict_util::randn(g_rng, g.hq * g.hd), out(m * g.hq * g.hd);
  kvc_attention_params a;
  kvc_attention_params_init(&a);
  a.num_q_heads = g.hq;
  a.observe = KVC_OBSERVE_MAX;
  a.observe_from = from;
  CHECK_OK(kvc_attention_prefill(p, 0, 1, qp.data(), m, out.data(), nullptr, &a));
  uint64_t id = 1;
  CHECK_OK(kvc_attention_decode(p, 0, &id, 1, qd.data(), out.data(), nullptr, &a));
  // The reference: prefill rows from.. (row r sees n - m + r + 1 tokens), then the decode row.
  std::vector<float> q(qp.begin() + from * g.hq * g.hd, qp.end());
  q.insert(q.end(), qd.begin(), qd.end());
  std::vector<uint64_t> vis;
  for (uint64_t r = from; r < m; ++r) vis.push_back(n - m + r + 1);
  vis.push_back(n);
  const std::vector<double> want = max_attention(g, q, vis.size(), s.k, n, vis);
  std::vector<float> got(n * g.hkv);
  CHECK_OK(kvc_seq_scores(p, 1, 0, got.data(), n));
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(got[i] - want[i]));
  }
  CHECKF(worst < 1e-5, "largest difference %g", worst);
  // A second pass with the same rows changes nothing (a maximum, not a sum).
  CHECK_OK(kvc_attention_decode(p, 0, &id, 1, qd.data(), out.data(), nullptr, &a));
  std::vector<float> again(n * g.hkv);
  CHECK_OK(kvc_seq_scores(p, 1, 0, again.data(), n));
  CHECK(again == got);
  kvc_pool_destroy(p);
}

// Hand-made scores: the kept set is the first sink_tokens, the newest
// recent_tokens and the highest sums over the KV heads between them (one
// head's high score keeps a token); a budget_tokens cap is per layer.
KVTEST(kvzip_exact_kept_set) {
  Geo g;
  g.layers = 2;
  kvc_pool *p = make_pool(g);
  const uint64_t n = 30;
  evict_util::fill(p, g, g_rng, 1, n);
  std::vector<float> sc(n * g.hkv);
  std::vector<double> scd(sc.size());
  for (uint64_t t = 0; t < n; ++t) {
    // head 0 favours even tokens, head 1 a few odd ones; ties between t = 4 and t = 6
    sc[t * 2] = (t % 2 == 0) ? 0.01f * static_cast<float>(t % 7) : 0.0f;
    sc[t * 2 + 1] = (t % 5 == 3) ? 0.2f : 0.001f;
    scd[t * 2] = sc[t * 2];
    scd[t * 2 + 1] = sc[t * 2 + 1];
  }
  for (uint32_t l = 0; l < g.layers; ++l)
    CHECK_OK(kvc_seq_observe_scores(p, 1, l, sc.data(), n, 0));
  const std::vector<int32_t> want = reference_keep(scd, n, g.hkv, 12, 3, 2);
  kvc_policy *pol = kvzip_policy(12, 3, 0.0, 2);
  CHECK_OK(kvc_evict(p, 1, pol, nullptr));
  CHECK(positions(p, 1, 0) == want && want.size() == 12);
  CHECK(positions(p, 1, 1) == want);
  // every token with a 0.2 on head 1 (t = 3, 8, 13, 18, 23) is kept
  for (int32_t t : {0, 1, 3, 8, 13, 18, 23})
    CHECK(std::find(want.begin(), want.end(), t) != want.end());
  CHECK(kvc::api::core_pool(p).check_invariants().empty());
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

// What an engine runs: fork the prefilled sequence, append a repeat prompt and
// the context again to the fork, observe the reconstruction's attention with
// KVC_OBSERVE_MAX, hand the context's maxima to the parent, free the fork and
// evict the parent. The parent's tokens are untouched until the eviction, and
// the kept set equals the float64 reference of the same pass.
KVTEST(kvzip_fork_reconstruction) {
  Geo g;
  g.hd = 16;
  kvc_pool *p = make_pool(g, KVC_ROPE_NONE, 256);
  const uint64_t n = 40, prompt = 3, m = prompt + n;
  const Seq s = evict_util::fill(p, g, g_rng, 1, n);
  kvc_stats before{};
  before.struct_size = sizeof before;
  CHECK_OK(kvc_pool_stats(p, &before));
  CHECK_OK(kvc_seq_fork(p, 1, 2));
  // The reconstruction tokens' K/V: a prompt, then the context's own keys
  // again (as a model repeating the context would roughly produce).
  std::vector<float> k2 = evict_util::randn(g_rng, prompt * g.hkv * g.hd),
                     v2 = evict_util::randn(g_rng, prompt * g.hkv * g.hd);
  k2.insert(k2.end(), s.k.begin(), s.k.end());
  v2.insert(v2.end(), s.v.begin(), s.v.end());
  CHECK_OK(kvc_seq_reserve(p, 2, m, nullptr));
  CHECK_OK(kvc_append(p, 2, 0, n, m, k2.data(), v2.data(), KVC_DTYPE_F32));
  std::vector<float> q = evict_util::randn(g_rng, m * g.hq * g.hd), out(m * g.hq * g.hd);
  kvc_attention_params a;
  kvc_attention_params_init(&a);
  a.num_q_heads = g.hq;
  a.observe = KVC_OBSERVE_MAX;
  CHECK_OK(kvc_attention_prefill(p, 0, 2, q.data(), m, out.data(), nullptr, &a));
  std::vector<float> child(2 * (n + m) * g.hkv);
  CHECK_OK(kvc_seq_scores(p, 2, 0, child.data(), n + m));
  CHECK_OK(kvc_seq_observe_scores(p, 1, 0, child.data(), n, 0));
  CHECK_OK(kvc_seq_free(p, 2));
  // Parent untouched so far: its own keys and values.
  std::vector<float> k(n * g.hkv * g.hd), v(k.size());
  CHECK_OK(kvc_gather(p, 1, 0, 0, n, k.data(), v.data(), KVC_DTYPE_F32, nullptr));
  CHECK(k == s.k && v == s.v);
  // The reference over the fork's keys: row r sees n + r + 1 tokens.
  std::vector<float> all = s.k;
  all.insert(all.end(), k2.begin(), k2.end());
  std::vector<uint64_t> vis(m);
  for (uint64_t r = 0; r < m; ++r) vis[r] = n + r + 1;
  std::vector<double> want_sc = max_attention(g, q, m, all, n + m, vis);
  want_sc.resize(n * g.hkv);
  const std::vector<int32_t> want = reference_keep(want_sc, n, g.hkv, 14, 2, 4);
  kvc_policy *pol = kvzip_policy(14, 2, 0.0, 4);
  CHECK_OK(kvc_evict(p, 1, pol, nullptr));
  CHECK(positions(p, 1, 0) == want && want.size() == 14);
  CHECK_OK(kvc_gather(p, 1, 0, 0, 14, k.data(), v.data(), KVC_DTYPE_F32, nullptr));
  for (size_t i = 0; i < want.size(); ++i)
    CHECK(std::equal(k.begin() + i * g.hkv * g.hd, k.begin() + (i + 1) * g.hkv * g.hd,
                     s.k.begin() + want[i] * g.hkv * g.hd));
  kvc_stats after{};
  after.struct_size = sizeof after;
  CHECK_OK(kvc_pool_stats(p, &after));
  CHECK(after.blocks_used < before.blocks_used);  // the fork's blocks and the evicted ones
  CHECK(kvc::api::core_pool(p).check_invariants().empty());
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

// Under compression_ratio the layers share one threshold: the total kept is
// the layers' own budgets summed, and a layer whose tokens score higher keeps
// more; sinks stay in every layer. A budget_tokens cap stays per layer.
KVTEST(kvzip_shared_layer_budgets) {
  Geo g;
  g.layers = 3;
  kvc_pool *p = make_pool(g);
  const uint64_t n = 20;
  evict_util::fill(p, g, g_rng, 1, n);
  evict_util::fill(p, g, g_rng, 2, n);
  // Layer l's token t scores (l + 1) x (t + 1) / 1000 on head 0 and 0.001 on head 1, except
  // layer 0's tokens 5 and 6, which score 0.5 on head 1.
  std::vector<std::vector<float>> sc(g.layers, std::vector<float>(n * g.hkv));
  std::vector<std::pair<float, std::pair<uint32_t, uint64_t>>> all;  // (sum, (layer, token))
  for (uint32_t l = 0; l < g.layers; ++l) {
    for (uint64_t t = 0; t < n; ++t) {
      sc[l][t * 2] = static_cast<float>((l + 1) * (t + 1)) / 1000.0f;
      sc[l][t * 2 + 1] = (l == 0 && (t == 5 || t == 6)) ? 0.5f : 0.001f;
      if (t >= 2) all.push_back({sc[l][t * 2] + sc[l][t * 2 + 1], {l, t}});
    }
    CHECK_OK(kvc_seq_observe_scores(p, 1, l, sc[l].data(), n, 0));
    CHECK_OK(kvc_seq_observe_scores(p, 2, l, sc[l].data(), n, 0));
  }
  // ratio 0.6: each layer's own budget is floor(20 x 0.4) = 8, 24 in all; 2 sinks per layer, so
  // 18 free places go to the best of the 54 ranked (layer, token) pairs.
  std::sort(all.begin(), all.end(), [](const auto &a, const auto &b) {
    return a.first > b.first || (a.first == b.first && a.second.second > b.second.second);
  });
  std::vector<std::vector<int32_t>> want(g.layers, std::vector<int32_t>{0, 1});
  for (size_t i = 0; i < 18; ++i)
    want[all[i].second.first].push_back(static_cast<int32_t>(all[i].second.second));
  for (auto &w : want) std::sort(w.begin(), w.end());
  kvc_policy *pol = kvzip_policy(0, 0, 0.6, 2);
  std::vector<uint64_t> dropped(g.layers);
  CHECK_OK(kvc_evict(p, 1, pol, dropped.data()));
  uint64_t total = 0;
  for (uint32_t l = 0; l < g.layers; ++l) {
    CHECKF(positions(p, 1, l) == want[l], "layer %u", l);
    total += positions(p, 1, l).size();
  }
  CHECK(total == 24);
  CHECK(positions(p, 1, 2).size() > positions(p, 1, 1).size());      // the higher-scoring layer
  CHECK(want[0].size() == 4 && want[0][2] == 5 && want[0][3] == 6);  // layer 0: sinks + 5, 6
  CHECK(dropped[0] == 16 && dropped[2] == n - want[2].size());
  // recent_tokens 3 and sinks 2: both kept in every layer, the 24 places less those 15 shared
  // by the same threshold over tokens 2..16.
  const uint64_t id3 = 3;
  evict_util::fill(p, g, g_rng, id3, n);
  for (uint32_t l = 0; l < g.layers; ++l)
    CHECK_OK(kvc_seq_observe_scores(p, id3, l, sc[l].data(), n, 0));
  std::vector<std::pair<float, std::pair<uint32_t, uint64_t>>> mid;
  for (const auto &c : all)
    if (c.second.second < n - 3) mid.push_back(c);
  std::vector<std::vector<int32_t>> want3(g.layers, std::vector<int32_t>{0, 1, 17, 18, 19});
  for (size_t i = 0; i < 24 - 15; ++i)
    want3[mid[i].second.first].push_back(static_cast<int32_t>(mid[i].second.second));
  kvc_policy *rec = kvzip_policy(0, 3, 0.6, 2);
  CHECK_OK(kvc_evict(p, id3, rec, nullptr));
  for (uint32_t l = 0; l < g.layers; ++l) {
    std::sort(want3[l].begin(), want3[l].end());
    CHECKF(positions(p, id3, l) == want3[l], "layer %u (recent)", l);
  }
  kvc_policy_destroy(rec);
  // budget_tokens: 8 per layer whatever the scores.
  kvc_policy *cap = kvzip_policy(8, 0, 0.0, 2);
  CHECK_OK(kvc_evict(p, 2, cap, nullptr));
  for (uint32_t l = 0; l < g.layers; ++l) CHECK(positions(p, 2, l).size() == 8);
  CHECK(kvc::api::core_pool(p).check_invariants().empty());
  kvc_policy_destroy(cap);
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

// Budgets never floor to zero; a ratio keeps floor(n (1 - ratio)), at least 1.
KVTEST(kvzip_budget_never_zero) {
  Geo g;
  kvc_pool *p = make_pool(g);
  evict_util::fill(p, g, g_rng, 1, 10);
  std::vector<float> sc(10 * g.hkv, 0.5f);
  sc[7 * g.hkv + 1] = 0.9f;
  CHECK_OK(kvc_seq_observe_scores(p, 1, 0, sc.data(), 10, 0));
  kvc_policy *pol = kvzip_policy(0, 0, 0.99);
  CHECK_OK(kvc_evict(p, 1, pol, nullptr));
  CHECK(positions(p, 1, 0) == std::vector<int32_t>{7});
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

// Refusals change nothing: eviction before any observed score, an unknown
// observe mode, bad observed scores.
KVTEST(kvzip_bad_input) {
  Geo g;
  kvc_pool *p = make_pool(g);
  const uint64_t n = 20;
  const Seq s = evict_util::fill(p, g, g_rng, 1, n);
  kvc_policy *pol = kvzip_policy(8);
  CHECK_STATUS(kvc_evict(p, 1, pol, nullptr), KVC_ERR_INVALID_ARGUMENT);
  CHECK(positions(p, 1, 0).size() == n);
  std::vector<float> q = evict_util::randn(g_rng, g.hq * g.hd), out(q.size());
  kvc_attention_params a;
  kvc_attention_params_init(&a);
  a.num_q_heads = g.hq;
  a.observe = static_cast<kvc_observe>(5);
  uint64_t id = 1;
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), nullptr, &a),
               KVC_ERR_INVALID_ARGUMENT);
  std::vector<float> sc(n * g.hkv, 0.1f);
  sc[3] = -1.0f;
  CHECK_STATUS(kvc_seq_observe_scores(p, 1, 0, sc.data(), n, 0), KVC_ERR_NON_FINITE);
  CHECK_STATUS(kvc_seq_observe_scores(p, 1, 0, sc.data(), n - 1, 0), KVC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kvc_evict(p, 1, pol, nullptr), KVC_ERR_INVALID_ARGUMENT);  // still nothing observed
  kvc_policy *none = kvzip_policy(0);  // nothing to evict: refused all the same
  CHECK_STATUS(kvc_evict(p, 1, none, nullptr), KVC_ERR_INVALID_ARGUMENT);
  kvc_policy_destroy(none);
  std::vector<float> k(n * g.hkv * g.hd), v(k.size());
  CHECK_OK(kvc_gather(p, 1, 0, 0, n, k.data(), v.data(), KVC_DTYPE_F32, nullptr));
  CHECK(k == s.k && v == s.v);
  kvc_policy_config c;
  kvc_policy_config_init(&c);
  c.kind = static_cast<kvc_policy_kind>(10);
  kvc_policy *bad = nullptr;
  CHECK_STATUS(kvc_policy_create(&c, &bad), KVC_ERR_INVALID_ARGUMENT);
  CHECK(bad == nullptr);
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

int main(int argc, char **argv) {
  return kvtest_main(argc, argv);
}
