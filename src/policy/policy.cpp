#include "policy/policy.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"
#include "common/strings.h"
#include "policy/plugin.h"

namespace kvc::policy {

void PolicySpec::validate() const {
  const int32_t k = static_cast<int32_t>(kind);
  if (k < 0 || k > static_cast<int32_t>(PolicyKind::DuoAttention))
    fail(Errc::InvalidArgument, "policy kind " + std::to_string(k) + " is unknown");
  if (!(compression_ratio >= 0.0 && compression_ratio < 1.0))
    fail(Errc::InvalidArgument,
         "compression_ratio must be in [0, 1) (the fraction dropped; kvpress's convention)");
  if (!(recent_fraction >= 0.0 && recent_fraction <= 1.0))
    fail(Errc::InvalidArgument, "recent_fraction must be in [0, 1]");
  if (kernel_size == 0 || kernel_size % 2 == 0 || kernel_size > 1025)
    fail(Errc::InvalidArgument, "kernel_size " + u64s(kernel_size) + " must be odd, 1..1025");
  if (pooling != Pooling::Max && pooling != Pooling::Avg)
    fail(Errc::InvalidArgument, "pooling must be KVC_POOLING_MAX or KVC_POOLING_AVG");
  if (schedule != Schedule::Paper && schedule != Schedule::Linear)
    fail(Errc::InvalidArgument, "pyramid schedule must be KVC_PYRAMID_PAPER or KVC_PYRAMID_LINEAR");
  if (!(beta >= 1.0 && beta <= 1e6)) fail(Errc::InvalidArgument, "beta must be in [1, 1e6]");
  if (kind == PolicyKind::Plugin && !plugin)
    fail(Errc::InvalidArgument, "a plugin policy needs a loaded plugin (kvc_plugin_load)");
  if (kind != PolicyKind::Plugin && plugin)
    fail(Errc::InvalidArgument, "a plugin is set on a policy whose kind is not KVC_POLICY_PLUGIN");
  if (kind == PolicyKind::Streaming && budget_tokens == 0 && compression_ratio == 0.0 &&
      recent_tokens == 0)
    fail(Errc::InvalidArgument,
         "streaming needs a window: set recent_tokens (W), budget_tokens or compression_ratio");
  if (kind == PolicyKind::ExpectedAttention &&
      (future_positions == 0 || future_positions > (1u << 20)))
    fail(Errc::InvalidArgument,
         "future_positions " + u64s(future_positions) + " must be in 1..1048576");
  if (head_budget != HeadBudget::Uniform && head_budget != HeadBudget::AdaKV)
    fail(Errc::InvalidArgument, "head_budget " + std::to_string(static_cast<int32_t>(head_budget)) +
                                    ": unknown (KVC_HEAD_BUDGET_UNIFORM or KVC_HEAD_BUDGET_ADAKV)");
  if (head_budget == HeadBudget::AdaKV &&
      (kind == PolicyKind::Streaming || kind == PolicyKind::DuoAttention))
    fail(Errc::InvalidArgument,
         "AdaKV head budgets need a policy that scores tokens: StreamingLLM and DuoAttention keep "
         "sinks and the newest tokens by rule");
  if (!(head_floor >= 0.0 && head_floor <= 1.0))
    fail(Errc::InvalidArgument, "head_floor must be in [0, 1] (AdaKV's per-head share)");
  if (kind == PolicyKind::DuoAttention) {
    if (head_gates.empty())
      fail(Errc::InvalidArgument,
           "duo-attention needs head_gates (num_layers x num_kv_heads gates in [0, 1])");
    for (size_t i = 0; i < head_gates.size(); ++i)
      if (!(head_gates[i] >= 0.0f && head_gates[i] <= 1.0f))
        fail(Errc::InvalidArgument, "head_gates[" + u64s(i) + "] is not in [0, 1] (NaN included)");
    if (!(gate_threshold >= 0.0f && gate_threshold <= 1.0f))
      fail(Errc::InvalidArgument, "gate_threshold must be in [0, 1]");
    if (recent_tokens == 0)
      fail(Errc::InvalidArgument,
           "duo-attention needs recent_tokens (the streaming heads' window)");
  } else if (!head_gates.empty()) {
    fail(Errc::InvalidArgument,
         "head_gates are set on a policy whose kind is not "
         "KVC_POLICY_DUO_ATTENTION");
  }
  if (auto_evict && budget_tokens == 0 && kind != PolicyKind::DuoAttention)
    fail(Errc::InvalidArgument, "auto_evict needs budget_tokens (the per-layer cap it enforces)");
}

uint64_t base_target(const PolicySpec &p, uint64_t n) {
  if (n == 0) return 0;
  uint64_t t = n;
  if (p.budget_tokens) t = std::min(t, p.budget_tokens);
  if (p.compression_ratio > 0.0) {
    const double keep = std::floor(static_cast<double>(n) * (1.0 - p.compression_ratio));
    t = std::min(t, std::max<uint64_t>(1, static_cast<uint64_t>(keep)));
  }
  if (p.kind == PolicyKind::Streaming && !p.budget_tokens && p.compression_ratio == 0.0)
    t = std::min<uint64_t>(n, static_cast<uint64_t>(p.sink_tokens) + p.recent_tokens);
  return std::max<uint64_t>(t, 1);
}

uint64_t layer_target(const PolicySpec &p, uint32_t layer, uint32_t num_layers, uint64_t n) {
  const uint64_t base = base_target(p, n);
  if (p.kind != PolicyKind::PyramidKV || num_layers <= 1 || n == 0) return base;
  // PyramidKV: budgets fall linearly from the first layer to the last. The
  // paper's schedule keeps the total (last = base / beta, first = 2 base -
  // last); the linear one goes from 1.0 to 0.2 of the base. Floors keep the
  // sum at or below num_layers x base; every layer keeps at least 1.
  const double b = static_cast<double>(base), frac = static_cast<double>(layer) / (num_layers - 1);
  double t;
  if (p.schedule == Schedule::Paper) {
    const double last = b / p.beta, first = 2.0 * b - last;
    t = first - (first - last) * frac;
  } else {
    t = b * (5.0 - 4.0 * frac) / 5.0;  // 1.0 -> 0.2 (0.2 as 1/5: exact at the last layer)
  }
  // The epsilon absorbs rounding of exact values (e.g. 5.9999999 for 6).
  return std::min<uint64_t>(n, std::max<uint64_t>(1, static_cast<uint64_t>(std::floor(t + 1e-9))));
}

void pool1d(const float *x, uint64_t n, uint32_t kernel, Pooling how, float *out) {
  const uint64_t r = kernel / 2;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t lo = i >= r ? i - r : 0, hi = std::min(n - 1, i + r);
    float acc = how == Pooling::Max ? x[lo] : 0.0f;
    for (uint64_t j = lo; j <= hi; ++j)
      acc = how == Pooling::Max ? std::max(acc, x[j]) : acc + x[j];
    out[i] = how == Pooling::Max ? acc : acc / static_cast<float>(hi - lo + 1);
  }
}

void QueryStats::merge(const QueryStats &o) {
  if (o.count == 0) return;
  if (count == 0 || sum.size() != o.sum.size() || outer.size() != o.outer.size()) {
    std::vector<double> s = o.sum, x = o.outer;  // may throw: nothing changed
    sum.swap(s);
    outer.swap(x);
    count = o.count;
    return;
  }
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += o.sum[i];
  for (size_t i = 0; i < outer.size(); ++i) outer[i] += o.outer[i];
  count += o.count;
}

void QueryStats::add(const float *q, uint32_t q_heads, uint32_t head_dim) {
  const uint64_t d = head_dim;
  if (sum.size() != q_heads * d || outer.size() != q_heads * d * d) {
    std::vector<double> s(q_heads * d, 0.0), x(q_heads * d * d, 0.0);  // may throw: nothing changed
    sum.swap(s);
    outer.swap(x);
    count = 0;
  }
  for (uint32_t h = 0; h < q_heads; ++h) {
    const float *x = q + h * d;
    double *s = sum.data() + h * d, *o = outer.data() + h * d * d;
    for (uint64_t i = 0; i < d; ++i) {
      const double xi = x[i];
      s[i] += xi;
      for (uint64_t j = 0; j < d; ++j) o[i * d + j] += xi * static_cast<double>(x[j]);
    }
  }
  ++count;
}

void future_moments(const QueryStats &st, uint32_t q_heads, uint32_t head_dim, uint32_t rope_dims,
                    bool interleaved, double theta, uint64_t from, uint64_t count,
                    std::vector<double> &mean, std::vector<double> &cov) {
  const uint64_t d = head_dim, hq = q_heads;
  mean.assign(hq * d, 0.0);
  cov.assign(hq * d * d, 0.0);
  if (st.count == 0) return;
  const double inv = 1.0 / static_cast<double>(st.count);
  for (uint64_t h = 0; h < hq; ++h)
    for (uint64_t i = 0; i < d; ++i) mean[h * d + i] = st.sum[h * d + i] * inv;
  for (uint64_t h = 0; h < hq; ++h)
    for (uint64_t i = 0; i < d; ++i)
      for (uint64_t j = 0; j < d; ++j)
        cov[(h * d + i) * d + j] =
            st.outer[(h * d + i) * d + j] * inv - mean[h * d + i] * mean[h * d + j];
  // The mean rotation of pair p over positions [from, from + count):
  // sum_t e^{i t f} = e^{i (from + (count - 1) / 2) f} sin(count f / 2) / sin(f / 2).
  const uint32_t half = rope_dims / 2;
  if (half == 0 || count == 0) return;
  std::vector<double> c(half), s(half);
  const double n = static_cast<double>(count), a = static_cast<double>(from);
  for (uint32_t p = 0; p < half; ++p) {
    const double f = std::pow(theta, -2.0 * p / rope_dims), den = std::sin(f / 2.0);
    const double mid = (a + (n - 1.0) / 2.0) * f;
    const double amp = std::fabs(den) < 1e-300 ? 1.0 : std::sin(n * f / 2.0) / (n * den);
    c[p] = std::cos(mid) * amp;
    s[p] = std::sin(mid) * amp;
  }
  auto pair = [&](uint32_t p, uint64_t &i0, uint64_t &i1) {
    i0 = interleaved ? 2u * p : p;
    i1 = interleaved ? 2u * p + 1u : p + half;
  };
  for (uint64_t h = 0; h < hq; ++h) {
    double *m = mean.data() + h * d, *S = cov.data() + h * d * d;
    for (uint32_t p = 0; p < half; ++p) {
      uint64_t i0, i1;
      pair(p, i0, i1);
      const double x0 = m[i0], x1 = m[i1];
      m[i0] = x0 * c[p] - x1 * s[p];
      m[i1] = x0 * s[p] + x1 * c[p];
      for (uint64_t j = 0; j < d; ++j) {  // rows: R S
        const double r0 = S[i0 * d + j], r1 = S[i1 * d + j];
        S[i0 * d + j] = r0 * c[p] - r1 * s[p];
        S[i1 * d + j] = r0 * s[p] + r1 * c[p];
      }
    }
    for (uint32_t p = 0; p < half; ++p) {  // columns: (R S) R^T
      uint64_t i0, i1;
      pair(p, i0, i1);
      for (uint64_t i = 0; i < d; ++i) {
        const double a0 = S[i * d + i0], a1 = S[i * d + i1];
        S[i * d + i0] = a0 * c[p] - a1 * s[p];
        S[i * d + i1] = a0 * s[p] + a1 * c[p];
      }
    }
  }
}

std::vector<float> expected_attention_scores(const LayerView &v) {
  std::vector<float> out(v.n, 0.0f);
  if (!v.keys || !v.q_mean || !v.q_cov || v.q_heads == 0 || v.n == 0) return out;
  const uint64_t d = v.head_dim, hk = v.kv_heads, g = v.q_heads / v.kv_heads, n = v.n;
  const double rs = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> z(n), acc(n);
  for (uint64_t h = 0; h < hk; ++h) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (uint64_t j = h * g; j < (h + 1) * g; ++j) {
      const double *m = v.q_mean + j * d, *S = v.q_cov + j * d * d;
      double zmax = -INFINITY;
      for (uint64_t t = 0; t < n; ++t) {
        const float *k = v.keys + (t * hk + h) * d;
        double lin = 0.0, quad = 0.0;
        for (uint64_t a = 0; a < d; ++a) {
          lin += m[a] * k[a];
          double r = 0.0;
          for (uint64_t b = 0; b < d; ++b) r += S[a * d + b] * k[b];
          quad += k[a] * r;
        }
        z[t] = lin * rs + quad / (2.0 * static_cast<double>(d));
        zmax = std::max(zmax, z[t]);
      }
      double sum = 0.0;
      for (uint64_t t = 0; t < n; ++t) sum += (z[t] = std::exp(z[t] - zmax));
      for (uint64_t t = 0; t < n; ++t) acc[t] += z[t] / sum;
    }
    for (uint64_t t = 0; t < n; ++t) {
      double vn = 1.0;
      if (v.values) {
        const float *x = v.values + (t * hk + h) * d;
        double sq = 0.0;
        for (uint64_t a = 0; a < d; ++a) sq += static_cast<double>(x[a]) * x[a];
        vn = std::sqrt(sq);
      }
      out[t] += static_cast<float>(acc[t] / static_cast<double>(g) * vn);
    }
  }
  return out;
}

namespace {

// Appends to `keep` the `k` indices of [0, end) with the highest score
// (ties: the newer token).
void top_k(const std::vector<float> &score, uint64_t end, uint64_t k, std::vector<uint32_t> &keep) {
  if (k == 0) return;
  std::vector<uint32_t> idx(end);
  std::iota(idx.begin(), idx.end(), 0u);
  auto better = [&](uint32_t a, uint32_t b) {
    return score[a] > score[b] || (score[a] == score[b] && a > b);
  };
  if (k < end)
    std::nth_element(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(), better);
  keep.insert(keep.end(), idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(std::min(k, end)));
}

// Knorm: minus the mean over KV heads of the key's L2 norm (a smaller norm
// ranks higher), accumulated in double; all zero without keys.
std::vector<float> key_norm_scores(const LayerView &v) {
  std::vector<float> s(v.n, 0.0f);
  if (!v.keys) return s;
  const uint64_t row = static_cast<uint64_t>(v.kv_heads) * v.head_dim;
  for (uint64_t t = 0; t < v.n; ++t) {
    double sum = 0.0;
    for (uint32_t h = 0; h < v.kv_heads; ++h) {
      const float *k = v.keys + t * row + static_cast<uint64_t>(h) * v.head_dim;
      double sq = 0.0;
      for (uint32_t d = 0; d < v.head_dim; ++d) sq += static_cast<double>(k[d]) * k[d];
      sum += std::sqrt(sq);
    }
    s[t] = static_cast<float>(-sum / v.kv_heads);
  }
  return s;
}

// Scores computed from the stored keys and values (Knorm, ExpectedAttention)
// are finite unless the cache holds NaN or Inf (plain f16 / f32 appends are
// not checked): ranking them would be undefined, so the eviction is refused.
void check_finite(const std::vector<float> &s, const char *policy) {
  for (size_t t = 0; t < s.size(); ++t)
    if (!std::isfinite(s[t]))
      fail(Errc::NonFinite,
           std::string(policy) + ": the score of token " + u64s(t) +
               " is NaN or Inf (the cache holds a non-finite key or value): nothing "
               "was evicted");
}

// Per-token score summed over KV heads.
std::vector<float> head_sum(const LayerView &v) {
  std::vector<float> s(v.n, 0.0f);
  if (v.scores)
    for (uint64_t t = 0; t < v.n; ++t)
      for (uint32_t h = 0; h < v.kv_heads; ++h) s[t] += v.scores[t * v.kv_heads + h];
  return s;
}

}  // namespace

void shared_targets(const PolicySpec &p, const std::vector<LayerView> &views,
                    std::vector<uint64_t> &targets, double floor) {
  struct Cand {
    float score;
    uint32_t layer;
    uint64_t token;
  };
  std::vector<Cand> cand;
  std::vector<uint64_t> fixed(views.size(), 0), floors(views.size(), 0);
  uint64_t free_total = 0, floor_total = 0;
  for (size_t li = 0; li < views.size(); ++li) {
    const LayerView &v = views[li];
    const uint64_t target = std::min(targets[li], v.n);
    if (v.n == 0 || target == 0) continue;
    const uint64_t sinks = std::min<uint64_t>(p.sink_tokens, target);
    const uint64_t recent = std::min<uint64_t>(p.recent_tokens, target - sinks);
    const uint64_t lo = std::min(sinks, v.n - recent);
    fixed[li] = lo + recent;
    free_total += target - fixed[li];
    const std::vector<float> s = head_sum(v);
    std::vector<Cand> own;
    for (uint64_t t = lo; t < v.n - recent; ++t)
      own.push_back({s[t], static_cast<uint32_t>(li), t});
    // AdaKV's safeguard: the view's own best floor x its budget, before any sharing.
    const uint64_t fl = std::min<uint64_t>(
        static_cast<uint64_t>(std::floor(floor * static_cast<double>(target - fixed[li]))),
        own.size());
    if (fl) {
      std::nth_element(own.begin(), own.begin() + static_cast<std::ptrdiff_t>(fl), own.end(),
                       [](const Cand &a, const Cand &b) {
                         return a.score != b.score ? a.score > b.score : a.token > b.token;
                       });
      floors[li] = fl;
      floor_total += fl;
    }
    cand.insert(cand.end(), own.begin() + static_cast<std::ptrdiff_t>(fl), own.end());
  }
  // The free_total best candidates over all layers (ties: the newer token first, then the
  // lower layer, so the counts do not depend on the sort).
  auto better = [](const Cand &a, const Cand &b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.token != b.token) return a.token > b.token;
    return a.layer < b.layer;
  };
  const uint64_t k = std::min<uint64_t>(free_total - floor_total, cand.size());
  if (k < cand.size())
    std::nth_element(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(k), cand.end(),
                     better);
  std::vector<uint64_t> got(floors);
  for (uint64_t i = 0; i < k; ++i) ++got[cand[i].layer];
  for (size_t li = 0; li < views.size(); ++li)
    if (views[li].n)
      targets[li] = std::min(views[li].n, std::max<uint64_t>(1, fixed[li] + got[li]));
}

// The ranking behind every kept set: tokens [0, lo) and [hi, n) are kept by
// rule (sinks, a recent or observation window), the candidates [lo, hi) are
// ranked by score[t - lo] (higher kept first; ties keep the newer token).
// `target` sizes the rule's parts where they depend on it (H2O's recent
// share, windows capped at the target). Scores computed from the stored keys
// and values must be finite (Knorm, ExpectedAttention).
Ranking rank(const PolicySpec &p, const LayerView &v, uint64_t target) {
  Ranking r;
  const uint64_t n = v.n;
  target = std::min(target, n);
  switch (p.kind) {
    case PolicyKind::None:
      r.lo = r.hi = n;
      break;
    case PolicyKind::DuoAttention:  // a streaming head (core decides which heads stream)
    case PolicyKind::Streaming: {   // the sinks, then the newest (score = index)
      r.lo = std::min<uint64_t>(p.sink_tokens, target);
      r.hi = n;
      r.score.resize(n - r.lo);
      for (uint64_t t = r.lo; t < n; ++t) r.score[t - r.lo] = static_cast<float>(t);
      break;
    }
    case PolicyKind::H2O:
    case PolicyKind::Plugin:
    case PolicyKind::Knorm: {
      // A protected window of the newest tokens (floor: a window that rounds
      // down to 0 protects nothing), then the highest-scoring older tokens.
      uint64_t recent =
          p.kind == PolicyKind::H2O
              ? static_cast<uint64_t>(std::floor(static_cast<double>(target) * p.recent_fraction))
              : p.recent_tokens;
      recent = std::min(recent, target);
      std::vector<float> s;
      if (p.kind == PolicyKind::H2O) {
        s = head_sum(v);
      } else if (p.kind == PolicyKind::Knorm) {
        s = key_norm_scores(v);
        check_finite(s, "knorm");
      } else {
        s.assign(n, 0.0f);
        kvc_plugin_layer_view pv{};
        pv.struct_size = sizeof pv;
        pv.layer = v.layer;
        pv.num_layers = v.num_layers;
        pv.n_tokens = n;
        pv.num_kv_heads = v.kv_heads;
        pv.head_dim = v.head_dim;
        pv.keys = v.keys;
        pv.positions = v.positions;
        pv.attention = v.scores;
        p.plugin->score(pv, s.data());
      }
      r.lo = 0;
      r.hi = n - recent;
      s.resize(r.hi);
      r.score = std::move(s);
      break;
    }
    case PolicyKind::ExpectedAttention:
    case PolicyKind::KVzip: {
      // The sinks, the newest recent_tokens, the best-scoring tokens between.
      const uint64_t sinks = std::min<uint64_t>(p.sink_tokens, target);
      const uint64_t recent = std::min<uint64_t>(p.recent_tokens, target - sinks);
      r.lo = std::min(sinks, n - recent);
      r.hi = n - recent;
      if (p.kind == PolicyKind::ExpectedAttention) {
        // Expected attention normalized over the middle tokens alone
        // (kvpress leaves its sinks out of the softmax).
        LayerView mid = v;
        mid.n = r.hi - r.lo;
        mid.keys = v.keys ? v.keys + r.lo * v.kv_heads * v.head_dim : nullptr;
        mid.values = v.values ? v.values + r.lo * v.kv_heads * v.head_dim : nullptr;
        r.score = expected_attention_scores(mid);
        check_finite(r.score, "expected attention");
      } else {
        const std::vector<float> s = head_sum(v);  // scores summed over the KV heads
        r.score.assign(s.begin() + static_cast<std::ptrdiff_t>(r.lo),
                       s.begin() + static_cast<std::ptrdiff_t>(r.hi));
      }
      break;
    }
    case PolicyKind::TOVA:
      r.lo = 0;
      r.hi = n;
      r.score = head_sum(v);
      break;
    case PolicyKind::SnapKV:
    case PolicyKind::PyramidKV: {
      // The observation window (newest tokens) stays; the prefix is ranked
      // by the window's attention, pooled along the tokens.
      const uint64_t win = std::min<uint64_t>(p.window, target);
      r.lo = 0;
      r.hi = n - win;
      const std::vector<float> s = head_sum(v);
      r.score.resize(r.hi);
      if (r.hi) pool1d(s.data(), r.hi, p.kernel_size, p.pooling, r.score.data());
      break;
    }
  }
  return r;
}

void select_keep(const PolicySpec &p, const LayerView &v, uint64_t target,
                 std::vector<uint32_t> &keep) {
  keep.clear();
  const uint64_t n = v.n;
  target = std::min(target, n);
  if (target == n || p.kind == PolicyKind::None) {
    keep.resize(n);
    std::iota(keep.begin(), keep.end(), 0u);
    return;
  }
  keep.reserve(target);
  const Ranking r = rank(p, v, target);
  const uint64_t fixed = r.lo + (n - r.hi);
  for (uint64_t i = 0; i < r.lo; ++i) keep.push_back(static_cast<uint32_t>(i));
  std::vector<uint32_t> top;
  top_k(r.score, r.score.size(), target > fixed ? target - fixed : 0, top);
  for (uint32_t i : top) keep.push_back(static_cast<uint32_t>(i + r.lo));
  for (uint64_t i = r.hi; i < n; ++i) keep.push_back(static_cast<uint32_t>(i));
  std::sort(keep.begin(), keep.end());
}

void adakv_keep(const PolicySpec &p, const std::vector<LayerView> &heads,
                const std::vector<uint64_t> &targets, std::vector<std::vector<uint32_t>> &keep) {
  struct Cand {
    float score;
    uint32_t head;
    uint32_t token;
  };
  const size_t H = heads.size();
  keep.assign(H, {});
  std::vector<Ranking> r(H);
  std::vector<uint64_t> free(H, 0), got(H, 0);
  std::vector<Cand> rest;
  uint64_t total_free = 0;
  auto better = [](const Cand &a, const Cand &b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.token != b.token) return a.token > b.token;
    return a.head < b.head;
  };
  for (size_t h = 0; h < H; ++h) {
    const uint64_t n = heads[h].n, target = std::min(targets[h], n);
    if (n == 0) continue;
    r[h] = rank(p, heads[h], target);
    const uint64_t fixed = r[h].lo + (n - r[h].hi);
    // The head's own candidate budget (its floor's base); the shared pool is
    // every head's target less its rule's tokens, even where a head holds
    // fewer tokens than its target (the rest goes to the other heads).
    free[h] = target > fixed ? std::min<uint64_t>(target - fixed, r[h].score.size()) : 0;
    if (__builtin_add_overflow(total_free, targets[h] > fixed ? targets[h] - fixed : 0,
                               &total_free))
      total_free = UINT64_MAX;  // (budgets of 2^64 tokens: keeps everything)
    // The safeguard: each head's best floor(head_floor x its own share) candidates
    // (at least 1 when the rule keeps nothing), the rest compete across heads.
    uint64_t floor_h =
        static_cast<uint64_t>(std::floor(p.head_floor * static_cast<double>(free[h])));
    if (fixed == 0 && free[h] > 0) floor_h = std::max<uint64_t>(floor_h, 1);
    std::vector<Cand> c(r[h].score.size());
    for (size_t i = 0; i < c.size(); ++i)
      c[i] = {r[h].score[i], static_cast<uint32_t>(h), static_cast<uint32_t>(r[h].lo + i)};
    if (floor_h < c.size())
      std::nth_element(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(floor_h), c.end(),
                       better);
    for (uint64_t i = 0; i < std::min<uint64_t>(floor_h, c.size()); ++i)
      keep[h].push_back(c[i].token);
    got[h] = keep[h].size();
    rest.insert(rest.end(), c.begin() + static_cast<std::ptrdiff_t>(got[h]), c.end());
  }
  uint64_t taken = 0;
  for (size_t h = 0; h < H; ++h) taken += got[h];
  const uint64_t k = std::min<uint64_t>(total_free - std::min(total_free, taken), rest.size());
  if (k < rest.size())
    std::nth_element(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(k), rest.end(),
                     better);
  for (uint64_t i = 0; i < k; ++i) keep[rest[i].head].push_back(rest[i].token);
  for (size_t h = 0; h < H; ++h) {
    const uint64_t n = heads[h].n;
    if (n == 0) continue;
    for (uint64_t i = 0; i < r[h].lo; ++i) keep[h].push_back(static_cast<uint32_t>(i));
    for (uint64_t i = r[h].hi; i < n; ++i) keep[h].push_back(static_cast<uint32_t>(i));
    std::sort(keep[h].begin(), keep[h].end());
  }
}

}  // namespace kvc::policy
