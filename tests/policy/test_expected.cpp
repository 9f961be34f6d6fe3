// ExpectedAttention eviction (KVC_POLICY_EXPECTED_ATTENTION, arXiv 2510.00636):
// exact kept sets against a float64 reference written here from the paper's
// formulas (the mean RoPE rotation summed position by position, not in closed
// form), query statistics fed by kvc_seq_observe_queries and by attention
// with KVC_OBSERVE_QUERIES alike, and refusals that change nothing.
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

std::mt19937 g_rng(7);
std::vector<float> randn(size_t n, float mean = 0.0f) {
  return evict_util::randn(g_rng, n, mean);
}
Seq fill(kvc_pool *p, const Geo &g, uint64_t id, uint64_t n) {
  return evict_util::fill(p, g, g_rng, id, n);
}

kvc_policy *ea_policy(uint64_t budget, uint32_t sinks = 4, uint32_t recent = 0,
                      uint32_t future = 512) {
  kvc_policy_config c;
  kvc_policy_config_init(&c);
  c.kind = KVC_POLICY_EXPECTED_ATTENTION;
  c.budget_tokens = budget;
  c.sink_tokens = sinks;
  c.recent_tokens = recent;
  c.future_positions = future;
  kvc_policy *pol = nullptr;
  CHECK_OK(kvc_policy_create(&c, &pol));
  return pol;
}

// NeoX pair p of dims d: (p, p + d/2), angle pos x 10000^(-2p/d).
void rope_neox(double *x, uint32_t d, double pos, double sign = 1.0) {
  for (uint32_t i = 0; i < d / 2; ++i) {
    const double a = sign * pos * std::pow(10000.0, -2.0 * i / d);
    const double x0 = x[i], x1 = x[i + d / 2];
    x[i] = x0 * std::cos(a) - x1 * std::sin(a);
    x[i + d / 2] = x0 * std::sin(a) + x1 * std::cos(a);
  }
}

// The kept positions by the paper's formulas in float64: pre-RoPE queries
// `qpre` ([m][hq][hd]), keys and values as stored, the sequence at `length`
// positions, rotation averaged over [length, length + future) when `rope`.
std::vector<int32_t> reference(const Geo &g, const std::vector<double> &qpre, uint64_t m,
                               const Seq &s, uint64_t n, uint64_t target, uint32_t sinks,
                               uint32_t recent, bool rope, uint64_t length, uint32_t future) {
  const uint32_t d = g.hd, hq = g.hq, hk = g.hkv, grp = hq / hk;
  std::vector<double> score(n, 0.0);
  const uint64_t lo = std::min<uint64_t>(sinks, n - recent), hi = n - recent;
  for (uint32_t h = 0; h < hk; ++h) {
    std::vector<double> acc(n, 0.0);
    for (uint32_t j = h * grp; j < (h + 1) * grp; ++j) {
      std::vector<double> mu(d, 0.0), S(d * d, 0.0);
      for (uint64_t r = 0; r < m; ++r)
        for (uint32_t a = 0; a < d; ++a) mu[a] += qpre[(r * hq + j) * d + a] / m;
      for (uint64_t r = 0; r < m; ++r)
        for (uint32_t a = 0; a < d; ++a)
          for (uint32_t b = 0; b < d; ++b)
            S[a * d + b] +=
                (qpre[(r * hq + j) * d + a] - mu[a]) * (qpre[(r * hq + j) * d + b] - mu[b]) / m;
      if (rope) {  // R = mean over positions of the rotation matrix, applied as R mu, R S R^T
        std::vector<double> R(d * d, 0.0);
        for (uint64_t t = length; t < length + future; ++t)
          for (uint32_t col = 0; col < d; ++col) {
            std::vector<double> e(d, 0.0);
            e[col] = 1.0;
            rope_neox(e.data(), d, static_cast<double>(t));
            for (uint32_t row = 0; row < d; ++row) R[row * d + col] += e[row] / future;
          }
        std::vector<double> mu2(d, 0.0), RS(d * d, 0.0), S2(d * d, 0.0);
        for (uint32_t a = 0; a < d; ++a)
          for (uint32_t b = 0; b < d; ++b) mu2[a] += R[a * d + b] * mu[b];
        for (uint32_t a = 0; a < d; ++a)
          for (uint32_t b = 0; b < d; ++b)
            for (uint32_t c = 0; c < d; ++c) RS[a * d + b] += R[a * d + c] * S[c * d + b];
        for (uint32_t a = 0; a < d; ++a)
          for (uint32_t b = 0; b < d; ++b)
            for (uint32_t c = 0; c < d; ++c) S2[a * d + b] += RS[a * d + c] * R[b * d + c];
        mu = mu2;
        S = S2;
      }
      std::vector<double> z(n, -INFINITY);
      double zmax = -INFINITY, sum = 0.0;
      for (uint64_t t = lo; t < hi; ++t) {
        const float *k = s.k.data() + (t * hk + h) * d;
        double lin = 0, quad = 0;
        for (uint32_t a = 0; a < d; ++a) {
          lin += mu[a] * k[a];
          for (uint32_t b = 0; b < d; ++b) quad += k[a] * S[a * d + b] * k[b];
        }
        z[t] = lin / std::sqrt(double(d)) + quad / (2.0 * d);
        zmax = std::max(zmax, z[t]);
      }
      for (uint64_t t = lo; t < hi; ++t) sum += std::exp(z[t] - zmax);
      for (uint64_t t = lo; t < hi; ++t) acc[t] += std::exp(z[t] - zmax) / sum / grp;
    }
    for (uint64_t t = lo; t < hi; ++t) {
      double vn = 0;
      for (uint32_t a = 0; a < d; ++a)
        vn += double(s.v[(t * hk + h) * d + a]) * s.v[(t * hk + h) * d + a];
      score[t] += acc[t] * std::sqrt(vn);
    }
  }
  std::vector<uint64_t> idx(hi - lo);
  std::iota(idx.begin(), idx.end(), lo);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](uint64_t a, uint64_t b) { return score[a] > score[b]; });
  std::vector<int32_t> keep;
  for (uint64_t i = 0; i < lo; ++i) keep.push_back(static_cast<int32_t>(i));
  for (uint64_t i = 0; i < target - lo - recent; ++i) keep.push_back(static_cast<int32_t>(idx[i]));
  for (uint64_t t = hi; t < n; ++t) keep.push_back(static_cast<int32_t>(t));
  std::sort(keep.begin(), keep.end());
  return keep;
}

std::vector<double> to_double(const std::vector<float> &x) {
  return {x.begin(), x.end()};
}

}  // namespace

// No RoPE: the statistics as given; sinks and a recent window kept.
KVTEST(expected_exact_kept_set) {
  Geo g;
  g.layers = 2;
  kvc_pool *p = make_pool(g);
  const uint64_t n = 40, m = 12;
  const Seq s = fill(p, g, 1, n);
  std::vector<float> q = randn(m * g.hq * g.hd, 0.3f);
  std::vector<int32_t> qpos(m);
  std::iota(qpos.begin(), qpos.end(), 28);
  for (uint32_t l = 0; l < g.layers; ++l)
    CHECK_OK(kvc_seq_observe_queries(p, 1, l, q.data(), KVC_DTYPE_F32, m, g.hq, qpos.data()));
  const std::vector<int32_t> want = reference(g, to_double(q), m, s, n, 16, 4, 3, false, n, 512);
  kvc_policy *pol = ea_policy(16, 4, 3);
  CHECK_OK(kvc_evict(p, 1, pol, nullptr));
  CHECK(positions(p, 1, 0) == want && want.size() == 16);
  CHECK(positions(p, 1, 1) == want);  // the same data and statistics on layer 1
  CHECK(kvc::api::core_pool(p).check_invariants().empty());
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

// RoPE (NeoX): queries given rotated at their positions are taken back to the
// pre-RoPE frame, and the future rotation averaged over [length, length + F)
// (the reference sums the rotation matrices position by position).
KVTEST(expected_rope_future_rotation) {
  Geo g;
  g.hd = 16;
  for (uint32_t future : {1u, 7u, 512u}) {
    kvc_pool *p = make_pool(g, KVC_ROPE_NEOX);
    const uint64_t n = 48, m = 20;
    const Seq s = fill(p, g, 1, n);
    std::vector<float> qpre = randn(m * g.hq * g.hd, 0.5f), qrot = qpre;
    std::vector<int32_t> qpos(m);
    for (uint64_t r = 0; r < m; ++r) {
      qpos[r] = static_cast<int32_t>(n - m + r);
      for (uint32_t h = 0; h < g.hq; ++h) {
        std::vector<double> x(qpre.begin() + (r * g.hq + h) * g.hd,
                              qpre.begin() + (r * g.hq + h + 1) * g.hd);
        rope_neox(x.data(), g.hd, qpos[r]);
        std::copy(x.begin(), x.end(), qrot.begin() + (r * g.hq + h) * g.hd);
      }
    }
    CHECK_OK(kvc_seq_observe_queries(p, 1, 0, qrot.data(), KVC_DTYPE_F32, m, g.hq, qpos.data()));
    const std::vector<int32_t> want =
        reference(g, to_double(qpre), m, s, n, 20, 4, 0, true, n, future);
    kvc_policy *pol = ea_policy(20, 4, 0, future);
    CHECK_OK(kvc_evict(p, 1, pol, nullptr));
    CHECKF(positions(p, 1, 0) == want, "future %u", future);
    kvc_policy_destroy(pol);
    kvc_pool_destroy(p);
  }
}

// KVC_OBSERVE_QUERIES on prefill (rows observe_from..) and decode attention
// adds what kvc_seq_observe_queries adds with the rows' positions; scores are
// not recorded.
KVTEST(expected_observe_through_attention) {
  Geo g;
  g.hd = 16;
  const uint64_t n = 32, m = 10, from = 4;
  std::vector<float> qp = randn(m * g.hq * g.hd, 0.2f), qd = randn(g.hq * g.hd, 0.2f),
                     out(m * g.hq * g.hd);
  std::vector<std::vector<int32_t>> kept;
  for (int via_attention = 0; via_attention < 2; ++via_attention) {
    g_rng.seed(11);
    kvc_pool *p = make_pool(g, KVC_ROPE_NEOX);
    fill(p, g, 1, n);
    if (via_attention) {
      kvc_attention_params a;
      kvc_attention_params_init(&a);
      a.num_q_heads = g.hq;
      a.observe = KVC_OBSERVE_QUERIES;
      a.observe_from = from;
      CHECK_OK(kvc_attention_prefill(p, 0, 1, qp.data(), m, out.data(), nullptr, &a));
      uint64_t id = 1;
      CHECK_OK(kvc_attention_decode(p, 0, &id, 1, qd.data(), out.data(), nullptr, &a));
      std::vector<float> sc(n * g.hkv, 1.0f);
      CHECK_OK(kvc_seq_scores(p, 1, 0, sc.data(), n));
      CHECK(std::all_of(sc.begin(), sc.end(), [](float x) { return x == 0.0f; }));
    } else {
      std::vector<int32_t> pos(m - from);
      std::iota(pos.begin(), pos.end(), static_cast<int32_t>(n - m + from));
      CHECK_OK(kvc_seq_observe_queries(p, 1, 0, qp.data() + from * g.hq * g.hd, KVC_DTYPE_F32,
                                       m - from, g.hq, pos.data()));
      const int32_t last = static_cast<int32_t>(n - 1);
      CHECK_OK(kvc_seq_observe_queries(p, 1, 0, qd.data(), KVC_DTYPE_F32, 1, g.hq, &last));
    }
    kvc_policy *pol = ea_policy(12);
    CHECK_OK(kvc_evict(p, 1, pol, nullptr));
    kept.push_back(positions(p, 1, 0));
    kvc_policy_destroy(pol);
    kvc_pool_destroy(p);
  }
  CHECK(kept[0] == kept[1] && kept[0].size() == 12);
}

// Refusals change nothing: eviction without statistics, bad query rows, bad
// policy parameters; a fork keeps its parent's statistics.
KVTEST(expected_bad_input) {
  Geo g;
  kvc_pool *p = make_pool(g);
  const uint64_t n = 24;
  const Seq s = fill(p, g, 1, n);
  kvc_policy *pol = ea_policy(8);
  CHECK_STATUS(kvc_evict(p, 1, pol, nullptr), KVC_ERR_INVALID_ARGUMENT);
  CHECK(positions(p, 1, 0).size() == n);
  std::vector<float> q = randn(3 * g.hq * g.hd);
  std::vector<int32_t> pos = {20, 21, 22};
  CHECK_STATUS(kvc_seq_observe_queries(p, 1, 0, q.data(), KVC_DTYPE_F32, 3, g.hq + 1, pos.data()),
               KVC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kvc_seq_observe_queries(p, 1, 0, q.data(), KVC_DTYPE_INT8, 3, g.hq, pos.data()),
               KVC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kvc_seq_observe_queries(p, 1, 0, nullptr, KVC_DTYPE_F32, 3, g.hq, pos.data()),
               KVC_ERR_NULL_POINTER);
  CHECK_STATUS(kvc_seq_observe_queries(p, 1, 0, q.data(), KVC_DTYPE_F32, 3, g.hq, nullptr),
               KVC_ERR_NULL_POINTER);
  CHECK_STATUS(kvc_seq_observe_queries(p, 9, 0, q.data(), KVC_DTYPE_F32, 3, g.hq, pos.data()),
               KVC_ERR_SEQ_NOT_FOUND);
  CHECK_STATUS(kvc_seq_observe_queries(p, 1, 5, q.data(), KVC_DTYPE_F32, 3, g.hq, pos.data()),
               KVC_ERR_OUT_OF_RANGE);
  std::vector<int32_t> neg = {20, -1, 22};
  CHECK_STATUS(kvc_seq_observe_queries(p, 1, 0, q.data(), KVC_DTYPE_F32, 3, g.hq, neg.data()),
               KVC_ERR_INVALID_ARGUMENT);
  std::vector<float> nan = q;
  nan[5] = NAN;
  CHECK_STATUS(kvc_seq_observe_queries(p, 1, 0, nan.data(), KVC_DTYPE_F32, 3, g.hq, pos.data()),
               KVC_ERR_NON_FINITE);
  CHECK_OK(kvc_seq_observe_queries(p, 1, 0, nullptr, KVC_DTYPE_F32, 0, g.hq, nullptr));  // nothing
  CHECK_STATUS(kvc_evict(p, 1, pol, nullptr), KVC_ERR_INVALID_ARGUMENT);  // still no statistics
  // The refused calls added nothing: the kept set is that of these rows alone.
  CHECK_OK(kvc_seq_observe_queries(p, 1, 0, q.data(), KVC_DTYPE_F32, 3, g.hq, pos.data()));
  CHECK_OK(kvc_seq_fork(p, 1, 2));
  const std::vector<int32_t> want = reference(g, to_double(q), 3, s, n, 8, 4, 0, false, n, 512);
  CHECK_OK(kvc_evict(p, 1, pol, nullptr));
  CHECK(positions(p, 1, 0) == want);
  CHECK_OK(kvc_evict(p, 2, pol, nullptr));  // the fork's copy of the statistics
  CHECK(positions(p, 2, 0) == want);
  for (uint32_t bad : {0u, (1u << 20) + 1}) {
    kvc_policy_config c;
    kvc_policy_config_init(&c);
    c.kind = KVC_POLICY_EXPECTED_ATTENTION;
    c.budget_tokens = 8;
    c.future_positions = bad;
    kvc_policy *x = nullptr;
    CHECK_STATUS(kvc_policy_create(&c, &x), KVC_ERR_INVALID_ARGUMENT);
    CHECK(x == nullptr);
  }
  kvc_attention_params a;
  kvc_attention_params_init(&a);
  a.num_q_heads = g.hq;
  a.observe = static_cast<kvc_observe>(5);
  std::vector<float> out(g.hq * g.hd);
  uint64_t id = 1;
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), nullptr, &a),
               KVC_ERR_INVALID_ARGUMENT);
  CHECK(kvc::api::core_pool(p).check_invariants().empty());
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

// A NaN or Inf in the stored keys or values (plain f32 appends are not
// checked) makes the scores non-finite: Knorm and ExpectedAttention refuse to
// rank them (KVC_ERR_NON_FINITE) and nothing is evicted.
KVTEST(expected_non_finite_cache_refused) {
  Geo g;
  for (int inf = 0; inf < 2; ++inf) {
    kvc_pool *p = make_pool(g);
    const uint64_t n = 20;
    Seq s = fill(p, g, 1, n);
    s.k[7 * g.hkv * g.hd + 3] = inf ? INFINITY : NAN;
    CHECK_OK(kvc_append(p, 1, 0, 0, n, s.k.data(), s.v.data(), KVC_DTYPE_F32));
    std::vector<float> q = randn(2 * g.hq * g.hd);
    std::vector<int32_t> pos = {18, 19};
    CHECK_OK(kvc_seq_observe_queries(p, 1, 0, q.data(), KVC_DTYPE_F32, 2, g.hq, pos.data()));
    kvc_policy *ea = ea_policy(8);
    kvc_policy_config c;
    kvc_policy_config_init(&c);
    c.kind = KVC_POLICY_KNORM;
    c.budget_tokens = 8;
    kvc_policy *kn = nullptr;
    CHECK_OK(kvc_policy_create(&c, &kn));
    CHECK_STATUS(kvc_evict(p, 1, ea, nullptr), KVC_ERR_NON_FINITE);
    CHECK_STATUS(kvc_evict(p, 1, kn, nullptr), KVC_ERR_NON_FINITE);
    CHECK(positions(p, 1, 0).size() == n);
    CHECK(kvc::api::core_pool(p).check_invariants().empty());
    kvc_policy_destroy(ea);
    kvc_policy_destroy(kn);
    kvc_pool_destroy(p);
  }
}

// A policy config of the 0.3 size (88 bytes, no future_positions) gets 512.
KVTEST(expected_old_struct_size) {
  kvc_policy_config c;
  CHECK_OK(kvc_policy_config_init_sized(&c, 88));
  CHECK(c.struct_size == 88);
  kvc_policy_config full;
  kvc_policy_config_init(&full);
  CHECK(full.future_positions == 512 && full.struct_size == sizeof full);
  c.kind = KVC_POLICY_EXPECTED_ATTENTION;
  c.budget_tokens = 4;
  kvc_policy *pol = nullptr;
  CHECK_OK(kvc_policy_create(&c, &pol));
  kvc_policy_destroy(pol);
}

int main(int argc, char **argv) {
  return kvtest_main(argc, argv);
}
