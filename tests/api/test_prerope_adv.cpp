// codec_prerope_adv: adversarial random tests of pre-RoPE keys
// (KVC_POOL_PRE_ROPE_KEYS) through the public API, against RoPE computed
// here in double (interleaved and NeoX, partial rope_dims, odd thetas).
//
// - oracle: keys RoPE(x, pos) of random pre-RoPE rows x read back (gather,
//   decode and prefill attention) as RoPE(decode(encode(x)), pos): the same
//   error as a pool that is handed x itself, for per-token, per-group,
//   per-tensor, per-channel (KIVI, residual window, sinks, hybrid), Hadamard,
//   fp8 and int3 keys; per-channel groups of one constant pre-RoPE row are
//   exact.
// - evict: random appends at the RoPE positions kvc_seq_rope_positions()
//   reports, StreamingLLM / H2O / TOVA / PyramidKV evictions with and
//   without shift_positions, auto-eviction, forks, truncation and save /
//   restore. After every step each kept key j reads back as its row turned
//   to its RoPE position (j once shifted) within the codec's error, and its
//   decoded pre-RoPE row never changes (a shift re-encodes nothing: no error
//   accumulates however many times a key moves).
// - threads: appends, gathers and attention on different sequences at once
//   read back the bits a serial run reads; decode with several threads over
//   long sequences (FlashDecoding splits); keys up to the documented limit
//   never read back Inf / NaN, keys at it are refused.
// Arguments: [ops per fuzz run] [seeds] [case name].
#include <kvcache/kvcache.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../whitebox.h"

namespace {


struct Rope {
  kvc_rope_style style;
  uint32_t hd, dims;
  double theta;
  // Turns every head of a row of `heads` heads by `pos` (sign -1: back).
  void apply(double *x, uint32_t heads, double pos, int sign) const {
    const uint32_t half = dims / 2;
    for (uint32_t h = 0; h < heads; ++h)
      for (uint32_t i = 0; i < half; ++i) {
        const double a = sign * pos * std::pow(theta, -2.0 * i / dims);
        const uint32_t i0 = style == KVC_ROPE_INTERLEAVED ? 2 * i : i;
        const uint32_t i1 = style == KVC_ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
        double *y = x + static_cast<size_t>(h) * hd;
        const double x0 = y[i0], x1 = y[i1];
        y[i0] = x0 * std::cos(a) - x1 * std::sin(a);
        y[i1] = x0 * std::sin(a) + x1 * std::cos(a);
      }
  }
  // The pairs of a head: (i0, i1) of each rotated pair, then unrotated dims alone.
  std::vector<std::pair<uint32_t, uint32_t>> pairs() const {
    std::vector<std::pair<uint32_t, uint32_t>> p;
    const uint32_t half = dims / 2;
    for (uint32_t i = 0; i < half; ++i)
      p.push_back(style == KVC_ROPE_INTERLEAVED ? std::make_pair(2 * i, 2 * i + 1)
                                                : std::make_pair(i, i + half));
    for (uint32_t e = dims; e < hd; ++e) p.push_back({e, e});
    return p;
  }
};

struct Case {
  const char *name;
  kvc_dtype kd;
  kvc_granularity kg;
  uint32_t group, asym, hadamard;
  uint32_t window, sinks;
  double fraction;
  double tol;  // error per pair, as a fraction of the head's largest |x| (or the tensor's)
};

const Case kCases[] = {
    {"int8-token", KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0, 0, 0, 0, 0.0, 0.012},
    {"int8-token-asym", KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 1, 0, 0, 0, 0.0, 0.012},
    {"int4-group8", KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 8, 0, 0, 0, 0, 0.0, 0.11},
    {"int3-token", KVC_DTYPE_INT3, KVC_SCALE_PER_TOKEN, 0, 0, 0, 0, 0, 0.0, 0.26},
    {"fp8-e4m3", KVC_DTYPE_FP8_E4M3, KVC_SCALE_PER_TOKEN, 0, 0, 0, 0, 0, 0.0, 0.1},
    {"int8-tensor", KVC_DTYPE_INT8, KVC_SCALE_PER_TENSOR, 0, 0, 0, 0, 0, 0.0, 0.012},
    {"int4-token-hadamard", KVC_DTYPE_INT4, KVC_SCALE_PER_TOKEN, 0, 0, 1, 0, 0, 0.0, 0.6},
    {"int8-token-sinks", KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0, 0, 0, 3, 0.0, 0.012},
    {"int4-channel", KVC_DTYPE_INT4, KVC_SCALE_PER_CHANNEL, 8, 1, 0, 0, 0, 0.0, 0.16},
    {"int4-channel-window", KVC_DTYPE_INT4, KVC_SCALE_PER_CHANNEL, 8, 1, 0, 5, 0, 0.0, 0.16},
    {"int2-channel-sinks", KVC_DTYPE_INT2, KVC_SCALE_PER_CHANNEL, 4, 1, 0, 0, 2, 0.0, 0.75},
    {"int3-channel-hadamard", KVC_DTYPE_INT3, KVC_SCALE_PER_CHANNEL, 8, 1, 1, 4, 0, 0.0, 0.9},
    {"int8-token-hybrid", KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0, 0, 2, 0, 0.3, 0.012},
};

struct Geo {
  const char *name;
  kvc_rope_style style;
  uint32_t heads, qheads, hd, dims;
  double theta;
  uint32_t block;
};

const Geo kGeos[] = {
    {"interleaved", KVC_ROPE_INTERLEAVED, 2, 4, 16, 0, 10000.0, 16},
    {"neox-partial", KVC_ROPE_NEOX, 2, 2, 32, 16, 500000.0, 8},
    {"interleaved-partial", KVC_ROPE_INTERLEAVED, 1, 3, 24, 8, 1234.5, 5},
    {"neox", KVC_ROPE_NEOX, 3, 6, 8, 0, 1e6, 16},
};

// StreamingLLM eviction of sequence id with shifted positions (keys re-read
// at their in-cache index).
void shift_evict(kvc_pool *p, uint64_t id, uint32_t sinks, uint32_t budget) {
  kvc_policy_config pc;
  kvc_policy_config_init(&pc);
  pc.kind = KVC_POLICY_STREAMING;
  pc.sink_tokens = sinks;
  pc.budget_tokens = budget;
  pc.shift_positions = 1;
  kvc_policy *pol = nullptr;
  CHECKF(kvc_policy_create(&pc, &pol) == KVC_OK, "policy");
  CHECKF(kvc_evict(p, id, pol, nullptr) == KVC_OK, "evict");
  kvc_policy_destroy(pol);
}

bool residual(const Case &c) {
  return c.window || c.sinks || c.fraction > 0.0 || c.kg == KVC_SCALE_PER_CHANNEL;
}

kvc_pool *make_pool(const Case &c, const Geo &g, kvc_codec *k, bool pre, bool rope, uint32_t layers,
                    uint64_t blocks) {
  kvc_codec_init(k);
  k->dtype = c.kd;
  k->granularity = c.kg;
  if (c.group) k->group_size = c.group;
  k->asymmetric = c.asym;
  if (c.hadamard) {
    k->rotation = KVC_ROTATION_HADAMARD;
    k->rotation_block = 8;
  }
  kvc_pool_config pc;
  kvc_pool_config_init(&pc);
  pc.num_layers = layers;
  pc.num_q_heads = g.qheads;
  pc.num_kv_heads = g.heads;
  pc.head_dim = g.hd;
  pc.block_size = g.block;
  pc.num_blocks = blocks;
  pc.k_codec = k;
  pc.v_dtype = KVC_DTYPE_F32;
  pc.residual_window = c.window;
  pc.residual_sinks = c.sinks;
  pc.residual_fraction = c.fraction;
  pc.residual_dtype = KVC_DTYPE_F32;
  if (rope) {
    pc.rope_style = g.style;
    pc.rope_dims = g.dims;
    pc.rope_theta = g.theta;
  }
  pc.flags = pre ? KVC_POOL_PRE_ROPE_KEYS : 0u;
  kvc_pool *p = nullptr;
  const kvc_status st = kvc_pool_create(&pc, &p);
  CHECKF(st == KVC_OK, "%s/%s: create (pre %d)", c.name, g.name, pre);
  return st == KVC_OK ? p : nullptr;
}

Rope rope_of(const Geo &g) {
  return Rope{g.style, g.hd, g.dims ? g.dims : g.hd, g.theta};
}

// Softmax attention of one query row (qheads x hd) over gathered rows.
void attend(const float *q, const float *k, const float *v, uint64_t n, uint32_t heads,
            uint32_t qheads, uint32_t hd, double *out) {
  const uint32_t per = qheads / heads;
  std::vector<double> sc(n);
  for (uint32_t h = 0; h < qheads; ++h) {
    const uint32_t g = h / per;
    double mx = -1e300, sum = 0.0;
    for (uint64_t t = 0; t < n; ++t) {
      double d = 0.0;
      for (uint32_t e = 0; e < hd; ++e) d += double(q[h * hd + e]) * k[(t * heads + g) * hd + e];
      sc[t] = d / std::sqrt(double(hd));
      mx = std::max(mx, sc[t]);
    }
    for (uint64_t t = 0; t < n; ++t) sum += std::exp(sc[t] - mx);
    for (uint32_t e = 0; e < hd; ++e) {
      double o = 0.0;
      for (uint64_t t = 0; t < n; ++t)
        o += std::exp(sc[t] - mx) / sum * v[(t * heads + g) * hd + e];
      out[h * hd + e] = o;
    }
  }
}

// ---- oracle ---------------------------------------------------------------

void oracle(const Case &c, const Geo &g, uint32_t seed, bool constant) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  const Rope r = rope_of(g);
  const uint32_t row = g.heads * g.hd;
  const uint64_t T = 61;
  kvc_codec k1, k2, k3;
  kvc_pool *pre = make_pool(c, g, &k1, true, true, 1, 64);
  kvc_pool *ref = make_pool(c, g, &k2, false, false, 1, 64);  // handed x itself
  kvc_pool *post = make_pool(c, g, &k3, false, true, 1, 64);  // no flag: keys after RoPE
  if (!pre || !ref || !post) return;
  // Channel statistics that do not turn: per channel offset and scale (an
  // outlier channel), the layout per-channel codecs are for.
  std::vector<double> off(row), mul(row);
  for (uint32_t e = 0; e < row; ++e) {
    off[e] = (e % 5 == 1 ? 6.0 : 0.5) * nd(rng);
    mul[e] = e % 7 == 3 ? 4.0 : 0.3 + 0.2 * (e % 3);
  }
  std::vector<double> x(T * row);
  std::vector<float> xf(T * row), kf(T * row), vf(T * row);
  for (uint64_t t = 0; t < T; ++t)
    for (uint32_t e = 0; e < row; ++e) {
      x[t * row + e] = constant ? off[e] : off[e] + mul[e] * nd(rng);
      if (c.kg == KVC_SCALE_PER_TENSOR && t == 0 && e == 0)
        x[e] = 40.0;  // the layer's first row sets the scale
      vf[t * row + e] = static_cast<float>(nd(rng));
    }
  for (uint64_t t = 0; t < T; ++t) {
    std::vector<double> y(x.begin() + t * row, x.begin() + (t + 1) * row);
    for (uint32_t e = 0; e < row; ++e) xf[t * row + e] = static_cast<float>(y[e]);
    r.apply(y.data(), g.heads, double(t), 1);
    for (uint32_t e = 0; e < row; ++e) kf[t * row + e] = static_cast<float>(y[e]);
  }
  for (kvc_pool *p : {pre, ref, post}) {
    CHECKF(kvc_seq_create(p, 7) == KVC_OK, "seq");
    uint64_t t = 0;
    std::mt19937 chunks(seed + 1);
    while (t < T) {
      const uint64_t n = std::min<uint64_t>(T - t, 1 + chunks() % 7);
      CHECKF(kvc_seq_reserve(p, 7, n, nullptr) == KVC_OK, "reserve");
      const float *src = p == ref ? xf.data() : kf.data();
      CHECKF(kvc_append(p, 7, 0, t, n, src + t * row, vf.data() + t * row, KVC_DTYPE_F32) == KVC_OK,
             "%s/%s: append", c.name, g.name);
      t += n;
    }
  }
  std::vector<float> gp(T * row), gr(T * row), gq(T * row), vp(T * row);
  CHECKF(kvc_gather(pre, 7, 0, 0, T, gp.data(), vp.data(), KVC_DTYPE_F32, nullptr) == KVC_OK,
         "gather");
  CHECKF(kvc_gather(ref, 7, 0, 0, T, gr.data(), nullptr, KVC_DTYPE_F32, nullptr) == KVC_OK,
         "gather");
  CHECKF(kvc_gather(post, 7, 0, 0, T, gq.data(), nullptr, KVC_DTYPE_F32, nullptr) == KVC_OK,
         "gather");
  // Errors per pair (rotation-invariant): pre-RoPE pool against the truth,
  // the pool handed x (its decode turned here) against the truth.
  const auto pairs = r.pairs();
  double max_pre = 0, max_ref = 0, max_post = 0, sum_pre = 0, sum_ref = 0, scale = 0;
  for (uint64_t t = 0; t < T; ++t) {
    std::vector<double> e(gr.begin() + t * row, gr.begin() + (t + 1) * row);
    r.apply(e.data(), g.heads, double(t), 1);
    for (uint32_t h = 0; h < g.heads; ++h)
      for (auto [i0, i1] : pairs) {
        const uint64_t a = t * row + h * g.hd + i0, b = t * row + h * g.hd + i1;
        auto d2 = [&](double p0, double p1) {
          const double d0 = p0 - kf[a], d1 = i0 == i1 ? 0.0 : p1 - kf[b];
          return std::sqrt(d0 * d0 + d1 * d1);
        };
        const double ep = d2(gp[a], gp[b]), er = d2(e[h * g.hd + i0], e[h * g.hd + i1]);
        const double eq = d2(gq[a], gq[b]);
        max_pre = std::max(max_pre, ep);
        max_ref = std::max(max_ref, er);
        max_post = std::max(max_post, eq);
        sum_pre += ep;
        sum_ref += er;
        scale = std::max(scale, std::fabs(double(kf[a])));
        CHECKF(std::isfinite(gp[a]), "%s/%s: non-finite key", c.name, g.name);
      }
  }
  const double slack = 2e-6 * scale;
  if (constant) {
    // One pre-RoPE row repeated: per-channel groups (and their staging) are exact.
    CHECKF(max_pre <= slack, "%s/%s: constant rows read back with error %g (scale %g)", c.name,
           g.name, max_pre, scale);
  } else {
    CHECKF(max_pre <= 1.05 * max_ref + slack && sum_pre <= 1.03 * sum_ref + slack * T,
           "%s/%s seed %u: pre-RoPE error max %g mean %g, the pool handed x: max %g mean %g "
           "(post-RoPE max %g)",
           c.name, g.name, seed, max_pre, sum_pre / T, max_ref, sum_ref / T, max_post);
  }
  // Attention (decode over all, prefill over the last rows) against the gathered rows.
  kvc_attention_params ap;
  kvc_attention_params_init(&ap);
  ap.num_q_heads = g.qheads;
  const uint32_t qrow = g.qheads * g.hd;
  std::vector<float> q(5 * qrow), out(5 * qrow);
  for (float &v : q) v = static_cast<float>(0.5 * nd(rng));
  std::vector<double> want(qrow);
  const uint64_t one = 7;
  CHECKF(kvc_attention_decode(pre, 0, &one, 1, q.data(), out.data(), nullptr, &ap) == KVC_OK,
         "decode");
  attend(q.data(), gp.data(), vp.data(), T, g.heads, g.qheads, g.hd, want.data());
  for (uint32_t e = 0; e < qrow; ++e)
    CHECKF(std::fabs(out[e] - want[e]) <= 2e-5 * (1 + std::fabs(want[e])), "%s/%s: decode %g vs %g",
           c.name, g.name, out[e], want[e]);
  CHECKF(kvc_attention_prefill(pre, 0, 7, q.data(), 5, out.data(), nullptr, &ap) == KVC_OK,
         "prefill");
  for (uint32_t i = 0; i < 5; ++i) {
    attend(q.data() + i * qrow, gp.data(), vp.data(), T - 5 + i + 1, g.heads, g.qheads, g.hd,
           want.data());
    for (uint32_t e = 0; e < qrow; ++e)
      CHECKF(std::fabs(out[i * qrow + e] - want[e]) <= 2e-5 * (1 + std::fabs(want[e])),
             "%s/%s: prefill %g vs %g", c.name, g.name, out[i * qrow + e], want[e]);
  }
  // Gathering any sub-range reads the same bits.
  for (int rep = 0; rep < 8; ++rep) {
    const uint64_t a = rng() % T, n = 1 + rng() % (T - a);
    std::vector<float> part(n * row);
    CHECKF(kvc_gather(pre, 7, 0, a, n, part.data(), nullptr, KVC_DTYPE_F32, nullptr) == KVC_OK,
           "gather part");
    CHECKF(std::memcmp(part.data(), gp.data() + a * row, n * row * sizeof(float)) == 0,
           "%s/%s: gather [%llu, +%llu) differs", c.name, g.name, (unsigned long long)a,
           (unsigned long long)n);
  }
  kvc_pool_destroy(pre);
  kvc_pool_destroy(ref);
  kvc_pool_destroy(post);
}

// ---- eviction and sequence operations ---------------------------------------

struct SeqModel {
  uint64_t length = 0;
  std::vector<std::map<uint64_t, std::vector<double>>> x;  // [layer] text position -> pre-RoPE row
  std::vector<std::map<uint64_t, std::vector<double>>>
      decoded;                 // [layer] text position -> first decoded pre-RoPE row
  std::vector<bool> by_index;  // [layer] RoPE position = cache index
};

class EvictFuzz {
 public:
  EvictFuzz(const Case &c, const Geo &g, uint32_t seed) : c_(c), g_(g), r_(rope_of(g)), rng_(seed) {
    row_ = g.heads * g.hd;
    p_ = make_pool(c, g, &k_, true, true, kLayers, 400);
  }
  ~EvictFuzz() {
    if (p_) kvc_pool_destroy(p_);
  }

  void run(int ops) {
    if (!p_) return;
    const int fails = g_kvtest_fail;
    for (int op = 0; op < ops && g_kvtest_fail == fails; ++op) {
      const int what = static_cast<int>(rng_() % 100);
      if (std::getenv("PREROPE_TRACE"))
        std::fprintf(stderr, "op %d: %d\n", op, what);  // which step failed
      if (seqs_.empty() || what < 45)
        grow();
      else if (what < 70)
        evict();
      else if (what < 77)
        fork();
      else if (what < 84)
        truncate();
      else if (what < 90)
        save_restore();
      else if (what < 94)
        drop();
      else
        attention();
      verify();
    }
    CHECKF(evictions_ > 0 || residual(c_) || g_kvtest_fail != fails, "%s/%s: no eviction ran", c_.name,
           g_.name);
  }

 private:
  static constexpr uint32_t kLayers = 3;

  uint64_t pick() {
    auto it = seqs_.begin();
    std::advance(it, rng_() % seqs_.size());
    return it->first;
  }

  std::vector<double> fresh_row() {
    std::normal_distribution<double> nd;
    std::vector<double> x(row_);
    for (uint32_t e = 0; e < row_; ++e) x[e] = (e % 5 == 2 ? 3.0 : 0.0) + nd(rng_);
    if (c_.kg == KVC_SCALE_PER_TENSOR) {
      for (double &v : x) v = std::max(-7.5, std::min(7.5, v));
      x[0] = 8.0;  // every row holds the largest value: the first append of a layer sets the scale
    }
    return x;
  }

  void grow() {
    if (seqs_.size() < 3 && (seqs_.empty() || rng_() % 4 == 0)) {
      const uint64_t id = next_id_++;
      CHECKF(kvc_seq_create(p_, id) == KVC_OK, "create");
      SeqModel m;
      m.x.resize(kLayers);
      m.decoded.resize(kLayers);
      m.by_index.assign(kLayers, false);
      seqs_[id] = m;
    }
    const uint64_t id = pick();
    SeqModel &m = seqs_[id];
    const uint64_t n = 1 + rng_() % 9;
    const kvc_status st = kvc_seq_reserve(p_, id, n, nullptr);
    if (st == KVC_ERR_POOL_EXHAUSTED) return;
    CHECKF(st == KVC_OK, "reserve");
    if (st) return;
    // Auto-eviction may have run inside the reservation: resync what the
    // model knows from the pool's positions (nothing else changes).
    if (auto_) resync(id);
    const uint64_t pos0 = m.length;
    m.length += n;
    for (uint32_t l = 0; l < kLayers; ++l) {
      std::vector<int32_t> rp(n);
      CHECKF(kvc_seq_rope_positions(p_, id, l, pos0, n, rp.data()) == KVC_OK, "rope positions");
      uint64_t ntok = 0;
      kvc_seq_layer_tokens(p_, id, l, &ntok);
      for (uint64_t i = 0; i < n; ++i) {
        const int64_t want = m.by_index[l] ? int64_t(ntok - n + i) : int64_t(pos0 + i);
        CHECKF(rp[i] == want, "%s/%s: layer %u position %llu: RoPE position %d, model %lld", c_.name,
               g_.name, l, (unsigned long long)(pos0 + i), rp[i], (long long)want);
      }
      std::vector<float> kb(n * row_), vb(n * row_);
      for (uint64_t i = 0; i < n; ++i) {
        std::vector<double> x = fresh_row(), y = x;
        m.x[l][pos0 + i] = x;
        m.decoded[l].erase(pos0 + i);
        r_.apply(y.data(), g_.heads, double(rp[i]), 1);
        for (uint32_t e = 0; e < row_; ++e) {
          kb[i * row_ + e] = static_cast<float>(y[e]);
          vb[i * row_ + e] = static_cast<float>(x[e]);
        }
      }
      // Appends in one or two calls (the second part first, sometimes).
      const uint64_t cut = n > 1 && rng_() % 3 == 0 ? 1 + rng_() % (n - 1) : n;
      if (cut < n && !residual(c_) && rng_() % 2) {
        CHECKF(kvc_append(p_, id, l, pos0 + cut, n - cut, kb.data() + cut * row_,
                         vb.data() + cut * row_, KVC_DTYPE_F32) == KVC_OK,
               "append");
        CHECKF(kvc_append(p_, id, l, pos0, cut, kb.data(), vb.data(), KVC_DTYPE_F32) == KVC_OK,
               "append");
      } else {
        CHECKF(kvc_append(p_, id, l, pos0, cut, kb.data(), vb.data(), KVC_DTYPE_F32) == KVC_OK,
               "append");
        if (cut < n)
          CHECKF(kvc_append(p_, id, l, pos0 + cut, n - cut, kb.data() + cut * row_,
                           vb.data() + cut * row_, KVC_DTYPE_F32) == KVC_OK,
                 "append");
      }
    }
  }

  // After an eviction the model keeps only the positions the pool reports.
  void resync(uint64_t id) {
    SeqModel &m = seqs_[id];
    for (uint32_t l = 0; l < kLayers; ++l) {
      uint64_t n = 0;
      kvc_seq_layer_tokens(p_, id, l, &n);
      std::vector<int32_t> pos(n);
      std::vector<float> kb(n * row_);
      if (n)
        CHECKF(kvc_gather(p_, id, l, 0, n, kb.data(), nullptr, KVC_DTYPE_F32, pos.data()) == KVC_OK,
               "gather");
      std::map<uint64_t, std::vector<double>> x, d;
      for (uint64_t j = 0; j < n; ++j) {
        x[pos[j]] = m.x[l][pos[j]];
        if (m.decoded[l].count(pos[j])) d[pos[j]] = m.decoded[l][pos[j]];
      }
      if (n < m.x[l].size() && shift_) m.by_index[l] = true;
      m.x[l].swap(x);
      m.decoded[l].swap(d);
    }
  }

  void evict() {
    const uint64_t id = pick();
    kvc_policy_config pc;
    kvc_policy_config_init(&pc);
    const int kind = static_cast<int>(rng_() % 5);
    pc.shift_positions = rng_() % 3 != 0;
    pc.budget_tokens = 4 + rng_() % 20;
    switch (kind) {
      case 0:
        pc.kind = KVC_POLICY_STREAMING;
        pc.sink_tokens = rng_() % 4;
        break;
      case 1:
        pc.kind = KVC_POLICY_H2O;
        break;
      case 2:
        pc.kind = KVC_POLICY_TOVA;
        break;
      case 3:
        pc.kind = KVC_POLICY_PYRAMIDKV;
        pc.window = 2;
        pc.kernel_size = 3;
        break;
      default:
        pc.kind = KVC_POLICY_STREAMING;
        pc.sink_tokens = 2;
        pc.auto_evict = 1;
        break;
    }
    if (kind >= 1 && kind <= 3) {  // scores the policies read
      for (uint32_t l = 0; l < kLayers; ++l) {
        uint64_t n = 0;
        kvc_seq_layer_tokens(p_, id, l, &n);
        std::vector<float> sc(n * g_.heads);
        for (float &v : sc) v = static_cast<float>(rng_() % 1000) / 100.0f;
        if (n) CHECKF(kvc_seq_observe_scores(p_, id, l, sc.data(), n, 1) == KVC_OK, "scores");
      }
    }
    kvc_policy *pol = nullptr;
    CHECKF(kvc_policy_create(&pc, &pol) == KVC_OK, "policy");
    if (!pol) return;
    if (pc.auto_evict) {
      const kvc_status st = kvc_seq_set_policy(p_, id, pol);
      if (residual(c_)) {
        CHECKF(st == KVC_ERR_UNSUPPORTED, "auto-eviction with a residual: %d", st);
      } else {
        CHECKF(st == KVC_OK, "set policy");
        auto_ = true;
        shift_ = pc.shift_positions;
        for (int i = 0; i < 4; ++i) grow_id(id);
        auto_ = false;
        CHECKF(kvc_seq_set_policy(p_, id, nullptr) == KVC_OK, "unset policy");
        ++evictions_;
      }
      kvc_policy_destroy(pol);
      return;
    }
    std::vector<uint64_t> dropped(kLayers, 0);
    const kvc_status st = kvc_evict(p_, id, pol, dropped.data());
    kvc_policy_destroy(pol);
    if (residual(c_)) {
      uint64_t n = 0;
      kvc_seq_layer_tokens(p_, id, 0, &n);
      CHECKF(st == KVC_OK || st == KVC_ERR_UNSUPPORTED, "evict with a residual: %d", st);
      return;
    }
    if (st == KVC_ERR_POOL_EXHAUSTED) return;
    CHECKF(st == KVC_OK, "%s/%s: evict kind %d", c_.name, g_.name, kind);
    if (st) return;
    ++evictions_;
    SeqModel &m = seqs_[id];
    for (uint32_t l = 0; l < kLayers; ++l)
      if (dropped[l] && (pc.shift_positions || m.by_index[l])) m.by_index[l] = true;
    shift_ = false;
    resync(id);
  }

  void grow_id(uint64_t id) {
    // grow_only() on a given sequence: the others leave the model meanwhile
    std::map<uint64_t, SeqModel> keep;
    for (auto it = seqs_.begin(); it != seqs_.end();)
      if (it->first != id) {
        keep.insert(*it);
        it = seqs_.erase(it);
      } else {
        ++it;
      }
    const uint64_t saved_next = next_id_;
    grow_only();
    next_id_ = saved_next;
    for (auto &kv : keep) seqs_.insert(kv);
  }

  void grow_only() {
    const uint64_t id = seqs_.begin()->first;
    SeqModel &m = seqs_[id];
    const uint64_t n = 1 + rng_() % 9;
    const kvc_status st = kvc_seq_reserve(p_, id, n, nullptr);
    if (st) {
      CHECKF(st == KVC_ERR_POOL_EXHAUSTED, "reserve");
      resync(id);
      return;
    }
    resync(id);
    const uint64_t pos0 = m.length;
    m.length += n;
    for (uint32_t l = 0; l < kLayers; ++l) {
      std::vector<int32_t> rp(n);
      CHECKF(kvc_seq_rope_positions(p_, id, l, pos0, n, rp.data()) == KVC_OK, "rope positions");
      uint64_t ntok = 0;
      kvc_seq_layer_tokens(p_, id, l, &ntok);
      std::vector<float> kb(n * row_), vb(n * row_);
      for (uint64_t i = 0; i < n; ++i) {
        const int64_t want = m.by_index[l] ? int64_t(ntok - n + i) : int64_t(pos0 + i);
        CHECKF(rp[i] == want, "auto: layer %u RoPE position %d, model %lld", l, rp[i],
               (long long)want);
        std::vector<double> x = fresh_row(), y = x;
        m.x[l][pos0 + i] = x;
        m.decoded[l].erase(pos0 + i);
        r_.apply(y.data(), g_.heads, double(rp[i]), 1);
        for (uint32_t e = 0; e < row_; ++e) {
          kb[i * row_ + e] = static_cast<float>(y[e]);
          vb[i * row_ + e] = static_cast<float>(x[e]);
        }
      }
      CHECKF(kvc_append(p_, id, l, pos0, n, kb.data(), vb.data(), KVC_DTYPE_F32) == KVC_OK,
             "append");
    }
  }

  void fork() {
    if (seqs_.size() >= 4) return;
    const uint64_t id = pick(), child = next_id_++;
    const kvc_status st = kvc_seq_fork(p_, id, child);
    if (st == KVC_ERR_POOL_EXHAUSTED) return;
    CHECKF(st == KVC_OK, "fork");
    if (!st) seqs_[child] = seqs_[id];
  }

  void truncate() {
    const uint64_t id = pick();
    SeqModel &m = seqs_[id];
    if (!m.length) return;
    const uint64_t nl = rng_() % m.length;
    const kvc_status st = kvc_seq_truncate(p_, id, nl);
    if (st == KVC_ERR_POOL_EXHAUSTED) return;
    CHECKF(st == KVC_OK, "truncate");
    if (st) return;
    m.length = nl;
    for (uint32_t l = 0; l < kLayers; ++l) {
      m.x[l].erase(m.x[l].lower_bound(nl), m.x[l].end());
      // A per-channel group cut in two goes back to the staging and is
      // encoded again when it completes: its rows decode anew.
      m.decoded[l].clear();
    }
  }

  void save_restore() {
    const uint64_t id = pick();
    size_t need = 0;
    CHECKF(kvc_seq_save(p_, id, nullptr, 0, &need) == KVC_ERR_BUFFER_TOO_SMALL, "save size");
    std::vector<uint8_t> rec(need);
    CHECKF(kvc_seq_save(p_, id, rec.data(), rec.size(), &need) == KVC_OK, "save");
    const uint64_t nid = next_id_++;
    const kvc_status st = kvc_seq_restore(p_, nid, rec.data(), need);
    if (st == KVC_ERR_POOL_EXHAUSTED) return;
    CHECKF(st == KVC_OK, "restore");
    if (!st) seqs_[nid] = seqs_[id];
    // A pool without the flag (or with other RoPE settings) refuses it, and
    // this pool refuses such a pool's records.
    if (rng_() % 4 == 0) {
      kvc_codec k;
      Geo g2 = g_;
      g2.theta *= 2.0;
      kvc_pool *other = make_pool(c_, g_, &k, false, true, kLayers, 64);
      kvc_pool *theta = make_pool(c_, g2, &k, true, true, kLayers, 64);
      if (other && theta) {
        CHECKF(kvc_seq_restore(other, 1, rec.data(), need) == KVC_ERR_INCOMPATIBLE,
               "restore without the flag");
        CHECKF(kvc_seq_restore(theta, 1, rec.data(), need) == KVC_ERR_INCOMPATIBLE,
               "restore with another theta");
        CHECKF(kvc_seq_create(other, 2) == KVC_OK && kvc_seq_reserve(other, 2, 3, nullptr) == KVC_OK,
               "seq");
        size_t n2 = 0;
        kvc_seq_save(other, 2, nullptr, 0, &n2);
        std::vector<uint8_t> rec2(n2);
        CHECKF(kvc_seq_save(other, 2, rec2.data(), n2, &n2) == KVC_OK, "save");
        CHECKF(kvc_seq_restore(p_, next_id_++, rec2.data(), n2) == KVC_ERR_INCOMPATIBLE,
               "restore a record without the flag");
      }
      if (other) kvc_pool_destroy(other);
      if (theta) kvc_pool_destroy(theta);
    }
  }

  void drop() {
    if (seqs_.size() < 2) return;
    const uint64_t id = pick();
    CHECKF(kvc_seq_free(p_, id) == KVC_OK, "free");
    seqs_.erase(id);
  }

  void attention() {
    const uint64_t id = pick();
    const uint32_t l = rng_() % kLayers;
    uint64_t n = 0;
    kvc_seq_layer_tokens(p_, id, l, &n);
    if (!n) return;
    std::vector<float> kb(n * row_), vb(n * row_), q(g_.qheads * g_.hd), out(q.size());
    CHECKF(kvc_gather(p_, id, l, 0, n, kb.data(), vb.data(), KVC_DTYPE_F32, nullptr) == KVC_OK,
           "gather");
    std::normal_distribution<double> nd;
    for (float &v : q) v = static_cast<float>(0.4 * nd(rng_));
    kvc_attention_params ap;
    kvc_attention_params_init(&ap);
    ap.num_q_heads = g_.qheads;
    ap.num_threads = 1 + rng_() % 3;
    CHECKF(kvc_attention_decode(p_, l, &id, 1, q.data(), out.data(), nullptr, &ap) == KVC_OK,
           "decode");
    std::vector<double> want(q.size());
    attend(q.data(), kb.data(), vb.data(), n, g_.heads, g_.qheads, g_.hd, want.data());
    for (size_t e = 0; e < q.size(); ++e)
      CHECKF(std::fabs(out[e] - want[e]) <= 3e-5 * (1 + std::fabs(want[e])),
             "%s/%s: decode %g vs %g", c_.name, g_.name, out[e], want[e]);
  }

  void verify() {
    const auto pairs = r_.pairs();
    for (auto &[id, m] : seqs_)
      for (uint32_t l = 0; l < kLayers; ++l) {
        uint64_t n = 0;
        CHECKF(kvc_seq_layer_tokens(p_, id, l, &n) == KVC_OK, "tokens");
        CHECKF(n == m.x[l].size(), "%s/%s: seq %llu layer %u holds %llu tokens, model %zu", c_.name,
               g_.name, (unsigned long long)id, l, (unsigned long long)n, m.x[l].size());
        if (n != m.x[l].size()) return;
        std::vector<float> kb(n * row_);
        std::vector<int32_t> pos(n);
        if (n)
          CHECKF(
              kvc_gather(p_, id, l, 0, n, kb.data(), nullptr, KVC_DTYPE_F32, pos.data()) == KVC_OK,
              "gather");
        uint64_t j = 0;
        for (auto &[p, x] : m.x[l]) {
          CHECKF(pos[j] == int64_t(p), "seq %llu layer %u index %llu: position %d, model %llu",
                 (unsigned long long)id, l, (unsigned long long)j, pos[j], (unsigned long long)p);
          const double rp = m.by_index[l] ? double(j) : double(p);
          std::vector<double> d(kb.begin() + j * row_, kb.begin() + (j + 1) * row_);
          r_.apply(d.data(), g_.heads, rp, -1);  // back to pre-RoPE
          double xmax = 0;
          for (double v : x) xmax = std::max(xmax, std::fabs(v));
          for (uint32_t h = 0; h < g_.heads; ++h) {
            double hmax = 0;
            for (uint32_t e = 0; e < g_.hd; ++e) hmax = std::max(hmax, std::fabs(x[h * g_.hd + e]));
            const double ref = c_.kg == KVC_SCALE_PER_TENSOR ? 8.0 : c_.hadamard ? xmax : hmax;
            for (auto [i0, i1] : pairs) {
              const uint32_t a = h * g_.hd + i0, b = h * g_.hd + i1;
              const double e0 = d[a] - x[a], e1 = i0 == i1 ? 0.0 : d[b] - x[b];
              const double err = std::sqrt(e0 * e0 + e1 * e1);
              CHECKF(err <= c_.tol * ref * 1.5 + 1e-5,
                     "%s/%s: seq %llu layer %u index %llu (pos %llu, RoPE %g): "
                     "pair error %g (ref %g)",
                     c_.name, g_.name, (unsigned long long)id, l, (unsigned long long)j,
                     (unsigned long long)p, rp, err, ref);
            }
          }
          // The decoded pre-RoPE row never changes while the key stays
          // (staged keys, in pools with a residual, are encoded as they age).
          auto it = m.decoded[l].find(p);
          if (residual(c_)) {
          } else if (it == m.decoded[l].end()) {
            m.decoded[l][p] = d;
          } else {
            double worst = 0;
            for (uint32_t e = 0; e < row_; ++e)
              worst = std::max(worst, std::fabs(d[e] - it->second[e]));
            CHECKF(worst <= 2e-5 * (1 + xmax),
                   "%s/%s: seq %llu layer %u index %llu (pos %llu, RoPE %g): decoded "
                   "pre-RoPE row moved by %g",
                   c_.name, g_.name, (unsigned long long)id, l, (unsigned long long)j,
                   (unsigned long long)p, rp, worst);
          }
          ++j;
        }
      }
  }

  const Case &c_;
  const Geo &g_;
  Rope r_;
  std::mt19937 rng_;
  uint32_t row_;
  kvc_codec k_;
  kvc_pool *p_ = nullptr;
  std::map<uint64_t, SeqModel> seqs_;
  uint64_t next_id_ = 1;
  bool auto_ = false, shift_ = false;
  int evictions_ = 0;
};

// ---- threads ----------------------------------------------------------------

// Each thread writes its own sequence (appends in random chunks, gathers and
// attention in between); the final gathers must equal a serial run's bits.
void threads(const Case &c, const Geo &g, uint32_t seed) {
  const int kThreads = 4;
  const uint64_t T = 150;
  const uint32_t row = g.heads * g.hd;
  const Rope r = rope_of(g);
  auto work = [&](kvc_pool *p, int t, std::vector<float> *out) {
    std::mt19937 rng(seed * 31 + t);
    std::normal_distribution<double> nd;
    const uint64_t id = 100 + t;
    if (kvc_seq_create(p, id) != KVC_OK) return;
    uint64_t len = 0;
    kvc_attention_params ap;
    kvc_attention_params_init(&ap);
    ap.num_q_heads = g.qheads;
    std::vector<float> q(g.qheads * g.hd, 0.1f), o(q.size());
    while (len < T) {
      const uint64_t n = std::min<uint64_t>(T - len, 1 + rng() % 12);
      if (kvc_seq_reserve(p, id, n, nullptr) != KVC_OK) return;
      std::vector<float> kb(n * row), vb(n * row);
      for (uint64_t i = 0; i < n; ++i) {
        std::vector<double> y(row);
        for (double &v : y) v = nd(rng);
        for (uint32_t e = 0; e < row; ++e) vb[i * row + e] = static_cast<float>(y[e]);
        r.apply(y.data(), g.heads, double(len + i), 1);
        for (uint32_t e = 0; e < row; ++e) kb[i * row + e] = static_cast<float>(y[e]);
      }
      if (kvc_append(p, id, 0, len, n, kb.data(), vb.data(), KVC_DTYPE_F32) != KVC_OK) return;
      len += n;
      std::vector<float> tmp(len * row);
      kvc_gather(p, id, 0, rng() % len, 1, tmp.data(), nullptr, KVC_DTYPE_F32, nullptr);
      kvc_attention_decode(p, 0, &id, 1, q.data(), o.data(), nullptr, &ap);
    }
    out->resize(T * row);
    kvc_gather(p, id, 0, 0, T, out->data(), nullptr, KVC_DTYPE_F32, nullptr);
  };
  kvc_codec k1, k2;
  kvc_pool *serial = make_pool(c, g, &k1, true, true, 1, 256);
  kvc_pool *par = make_pool(c, g, &k2, true, true, 1, 256);
  if (!serial || !par) return;
  std::vector<std::vector<float>> a(kThreads), b(kThreads);
  for (int t = 0; t < kThreads; ++t) work(serial, t, &a[t]);
  std::vector<std::thread> th;
  for (int t = 0; t < kThreads; ++t) th.emplace_back(work, par, t, &b[t]);
  for (auto &x : th) x.join();
  for (int t = 0; t < kThreads; ++t)
    CHECKF(a[t].size() == T * row && a[t] == b[t],
           "%s/%s: thread %d reads other bits than a serial run", c.name, g.name, t);
  kvc_pool_destroy(serial);
  kvc_pool_destroy(par);
}

// ---- long sequences: FlashDecoding splits ----------------------------------

// Decode with several threads over long sequences (token ranges merged by
// log-sum-exp), before and after a shifting eviction, against the gathered rows.
void long_decode(const Case &c, const Geo &g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  const Rope r = rope_of(g);
  const uint32_t row = g.heads * g.hd, qrow = g.qheads * g.hd;
  kvc_codec k;
  kvc_pool *p = make_pool(c, g, &k, true, true, 1, 2 * 1400 / g.block + 8);
  if (!p) return;
  const uint64_t ids[2] = {1, 2};
  const uint64_t T = 1300;
  for (uint64_t id : ids) {
    CHECKF(kvc_seq_create(p, id) == KVC_OK, "seq");
    for (uint64_t t = 0; t < T;) {
      const uint64_t n = std::min<uint64_t>(T - t, 1 + rng() % 64);
      CHECKF(kvc_seq_reserve(p, id, n, nullptr) == KVC_OK, "reserve");
      std::vector<float> kb(n * row), vb(n * row);
      for (uint64_t i = 0; i < n; ++i) {
        std::vector<double> y(row);
        for (double &v : y) v = nd(rng);
        if (c.kg == KVC_SCALE_PER_TENSOR) y[0] = 8.0;
        for (uint32_t e = 0; e < row; ++e) vb[i * row + e] = static_cast<float>(nd(rng));
        r.apply(y.data(), g.heads, double(t + i), 1);
        for (uint32_t e = 0; e < row; ++e) kb[i * row + e] = static_cast<float>(y[e]);
      }
      CHECKF(kvc_append(p, id, 0, t, n, kb.data(), vb.data(), KVC_DTYPE_F32) == KVC_OK, "append");
      t += n;
    }
  }
  for (int round = 0; round < 2; ++round) {
    std::vector<float> q(2 * qrow), out(2 * qrow);
    for (float &v : q) v = static_cast<float>(0.3 * nd(rng));
    kvc_attention_params ap;
    kvc_attention_params_init(&ap);
    ap.num_q_heads = g.qheads;
    ap.num_threads = 4;
    CHECKF(kvc_attention_decode(p, 0, ids, 2, q.data(), out.data(), nullptr, &ap) == KVC_OK,
           "decode");
    for (int i = 0; i < 2; ++i) {
      uint64_t n = 0;
      kvc_seq_layer_tokens(p, ids[i], 0, &n);
      std::vector<float> kb(n * row), vb(n * row);
      CHECKF(kvc_gather(p, ids[i], 0, 0, n, kb.data(), vb.data(), KVC_DTYPE_F32, nullptr) == KVC_OK,
             "gather");
      std::vector<double> want(qrow);
      attend(q.data() + i * qrow, kb.data(), vb.data(), n, g.heads, g.qheads, g.hd, want.data());
      for (uint32_t e = 0; e < qrow; ++e)
        CHECKF(std::fabs(out[i * qrow + e] - want[e]) <= 3e-5 * (1 + std::fabs(want[e])),
               "%s/%s: long decode %g vs %g (round %d)", c.name, g.name, out[i * qrow + e], want[e],
               round);
    }
    if (round == 0 && !residual(c)) {
      shift_evict(p, 1, 4, 700);
    }
  }
  kvc_pool_destroy(p);
}

// ---- huge values ------------------------------------------------------------

// Keys up to the documented limit never turn into Inf / NaN; keys at it are
// refused with KVC_ERR_NON_FINITE and nothing is written.
void huge(const Case &c, const Geo &g, uint32_t seed) {
  std::mt19937 rng(seed);
  kvc_codec k;
  kvc_pool *p = make_pool(c, g, &k, true, true, 1, 64);
  if (!p) return;
  const uint32_t row = g.heads * g.hd;
  const float lim = FLT_MAX / (c.hadamard ? 16.0f : 2.0f);  // rotation block 8
  const float big = std::nextafter(lim, 0.0f);
  CHECKF(kvc_seq_create(p, 1) == KVC_OK, "seq");
  std::vector<float> kb(row), vb(row, 1.0f);
  uint64_t len = 0;
  for (int t = 0; t < 120; ++t) {
    for (float &v : kb) {
      const int m = rng() % 4;
      v = m == 0   ? big
          : m == 1 ? -big
                   : big * (static_cast<float>(int(rng() % 2001) - 1000) / 1000.0f);
    }
    if (kvc_seq_reserve(p, 1, 1, nullptr) != KVC_OK) break;
    CHECKF(kvc_append(p, 1, 0, len, 1, kb.data(), vb.data(), KVC_DTYPE_F32) == KVC_OK,
           "%s/%s: huge append", c.name, g.name);
    ++len;
  }
  // At the limit: refused, the slot keeps what it held.
  std::vector<float> before(row), after(row);
  CHECKF(kvc_gather(p, 1, 0, len - 1, 1, before.data(), nullptr, KVC_DTYPE_F32, nullptr) == KVC_OK,
         "gather");
  kb[rng() % row] = -lim;
  CHECKF(kvc_append(p, 1, 0, len - 1, 1, kb.data(), vb.data(), KVC_DTYPE_F32) == KVC_ERR_NON_FINITE,
         "%s/%s: a key at the limit", c.name, g.name);
  CHECKF(kvc_gather(p, 1, 0, len - 1, 1, after.data(), nullptr, KVC_DTYPE_F32, nullptr) == KVC_OK,
         "gather");
  CHECKF(before == after, "%s/%s: a refused append wrote", c.name, g.name);
  uint64_t n = 0;
  kvc_seq_layer_tokens(p, 1, 0, &n);
  std::vector<float> all(n * row);
  CHECKF(kvc_gather(p, 1, 0, 0, n, all.data(), nullptr, KVC_DTYPE_F32, nullptr) == KVC_OK, "gather");
  int bad = 0;
  for (float v : all) bad += !std::isfinite(v);
  CHECKF(bad == 0, "%s/%s: %d non-finite values read back", c.name, g.name, bad);
  if (!residual(c)) {  // a shift reads them at other positions
    shift_evict(p, 1, 3, 40);
    std::vector<float> kept(40 * row);
    CHECKF(kvc_gather(p, 1, 0, 0, 40, kept.data(), nullptr, KVC_DTYPE_F32, nullptr) == KVC_OK,
           "gather");
    for (float v : kept) bad += !std::isfinite(v);
    CHECKF(bad == 0, "%s/%s: %d non-finite values after a shift", c.name, g.name, bad);
  }
  kvc_pool_destroy(p);
}

}  // namespace

int main(int argc, char **argv) {
  const int ops = argc > 1 ? std::atoi(argv[1]) : 150;
  const uint32_t seeds = argc > 2 ? static_cast<uint32_t>(std::atoi(argv[2])) : 2;
  const char *only = argc > 3 ? argv[3] : nullptr;
  for (const Case &c : kCases) {
    if (only && std::strcmp(only, c.name) != 0) continue;
    for (const Geo &g : kGeos) {
      const int fails = g_kvtest_fail;
      if (c.kd == KVC_DTYPE_INT3 && g.hd % 8) continue;                  // int3 needs head_dim % 8
      if (c.kg == KVC_SCALE_PER_CHANNEL && g.block % c.group) continue;  // groups inside a block
      for (uint32_t s = 1; s <= seeds; ++s) {
        oracle(c, g, s, false);
        EvictFuzz f(c, g, 1000 * s + 17);
        f.run(ops);
      }
      if (c.kg == KVC_SCALE_PER_CHANNEL) oracle(c, g, 5, true);
      huge(c, g, 3);
      long_decode(c, g, 11);
      if (c.kg != KVC_SCALE_PER_TENSOR)
        threads(c, g, 9);  // (a per-tensor scale is set by the first writer)
      if (g_kvtest_fail != fails)
        std::fprintf(stderr, "FAILED: %s/%s (%d)\n", c.name, g.name, g_kvtest_fail - fails);
    }
  }
  if (g_kvtest_fail) {
    std::fprintf(stderr, "codec_prerope_adv: %d failures\n", g_kvtest_fail);
    return 1;
  }
  std::printf("codec_prerope_adv: ok\n");
  return 0;
}
