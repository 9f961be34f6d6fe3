// Online-softmax attention over tiles of a TileSource (attention/attention.h).
#include "attention/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "attention/fused.h"
#include "common/scratch.h"

namespace kvc::attention {

namespace {

float dot_scalar(const float *a, const float *b, uint64_t n) {
  float s = 0.0f;
  for (uint64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
void axpy_scalar(float *y, float a, const float *x, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) float dot_avx2(const float *a, const float *b, uint64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  if (i + 8 <= n) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    i += 8;
  }
  s0 = _mm256_add_ps(s0, s1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  float s = _mm_cvtss_f32(h);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}
__attribute__((target("avx2,fma"))) void axpy_avx2(float *y, float a, const float *x, uint64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}
// Scores of c tokens: out[t] = dot(q, k + t * stride) with dot_avx2's
// arithmetic (the same bytes), without a call per token.
__attribute__((target("avx2,fma"))) void dots_avx2(const float *q, const float *k, uint64_t stride,
                                                   uint64_t c, uint64_t hd, float *out) {
  for (uint64_t t = 0; t < c; ++t) out[t] = dot_avx2(q, k + t * stride, hd);
}
// acc[d] += p[t] * v[t * stride + d] for t = 0..c-1 in that order (axpy_avx2's
// arithmetic, the same bytes), with 64 accumulator lanes held in registers
// across the tokens instead of a load and store per token.
__attribute__((target("avx2,fma"))) void accumulate_avx2(float *acc, const float *p, const float *v,
                                                         uint64_t stride, uint64_t c, uint64_t hd) {
  uint64_t d = 0;
  for (; d + 64 <= hd; d += 64) {
    __m256 a0 = _mm256_loadu_ps(acc + d), a1 = _mm256_loadu_ps(acc + d + 8);
    __m256 a2 = _mm256_loadu_ps(acc + d + 16), a3 = _mm256_loadu_ps(acc + d + 24);
    __m256 a4 = _mm256_loadu_ps(acc + d + 32), a5 = _mm256_loadu_ps(acc + d + 40);
    __m256 a6 = _mm256_loadu_ps(acc + d + 48), a7 = _mm256_loadu_ps(acc + d + 56);
    for (uint64_t t = 0; t < c; ++t) {
      const __m256 pt = _mm256_set1_ps(p[t]);
      const float *x = v + t * stride + d;
      a0 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(x), a0);
      a1 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(x + 8), a1);
      a2 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(x + 16), a2);
      a3 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(x + 24), a3);
      a4 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(x + 32), a4);
      a5 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(x + 40), a5);
      a6 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(x + 48), a6);
      a7 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(x + 56), a7);
    }
    _mm256_storeu_ps(acc + d, a0);
    _mm256_storeu_ps(acc + d + 8, a1);
    _mm256_storeu_ps(acc + d + 16, a2);
    _mm256_storeu_ps(acc + d + 24, a3);
    _mm256_storeu_ps(acc + d + 32, a4);
    _mm256_storeu_ps(acc + d + 40, a5);
    _mm256_storeu_ps(acc + d + 48, a6);
    _mm256_storeu_ps(acc + d + 56, a7);
  }
  if (d < hd)  // the rest (head_dim not a multiple of 64) as axpy_avx2 does it
    for (uint64_t t = 0; t < c; ++t) axpy_avx2(acc + d, p[t], v + t * stride + d, hd - d);
}
bool has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

void dots_scalar(const float *q, const float *k, uint64_t stride, uint64_t c, uint64_t hd,
                 float *out) {
  for (uint64_t t = 0; t < c; ++t) out[t] = dot_scalar(q, k + t * stride, hd);
}
void accumulate_scalar(float *acc, const float *p, const float *v, uint64_t stride, uint64_t c,
                       uint64_t hd) {
  for (uint64_t t = 0; t < c; ++t) axpy_scalar(acc, p[t], v + t * stride, hd);
}

struct Kernels {
  // out[t] = q . k[t] for c tokens k[t] = k + t * stride (head_dim hd).
  void (*dots)(const float *, const float *, uint64_t, uint64_t, uint64_t, float *);
  // acc += p[t] * v[t] for t = 0..c-1, in that order.
  void (*accumulate)(float *, const float *, const float *, uint64_t, uint64_t, uint64_t);
};
const Kernels &kernels() {
  static const Kernels k = [] {
#if defined(__x86_64__)
    if (has_avx2_fma()) return Kernels{dots_avx2, accumulate_avx2};
#endif
    return Kernels{dots_scalar, accumulate_scalar};
  }();
  return k;
}

// Per-thread buffers (common/scratch.h: grown on demand, large ones released
// when the API call returns).
struct AttnScratch {
  ScratchBuffer<float> q, out, tile, state, obs, sc, dense, q8_scale;
  ScratchBuffer<uint32_t> dense_len;
  ScratchBuffer<int8_t> q8;
  ScratchBuffer<int32_t> q8_sum;
  ScratchBuffer<int8_t> q8_nib;  // the codes in int4-key order
  ScratchBuffer<int8_t> q8_amx;  // and laid out for the AMX tiles
};
AttnScratch &scratch() {
  thread_local AttnScratch s;
  return s;
}
float *grow(ScratchBuffer<float> &v, uint64_t n) {
  return v.get(n);
}

// Online-softmax state of `rows` query rows x hq heads: running max m,
// running sum ls and accumulator acc[hd] (FlashAttention / FlashDecoding).
// Adds tokens [t_begin, t_end) of the layer (row r also stops at its visible
// length vis(r)) to the state. obs: null, or the raw scores of the rows
// [obs_first, i0 + rows) as [row][hq][obs_stride], filled for the tokens read.
void attend_range(const Shape &sh, const TileSource &src, uint64_t n, const float *q, uint64_t n_q,
                  bool prefill, uint64_t i0, uint64_t rows, uint64_t t_begin, uint64_t t_end,
                  float *m, float *ls, float *acc, float *obs, uint64_t obs_first,
                  uint64_t obs_stride) {
  const Kernels &kr = kernels();
  const uint64_t hq = sh.q_heads, h = sh.kv_heads, hd = sh.head_dim;
  const uint64_t grp = hq / h, row = h * hd, bs = sh.max_tile;
  AttnScratch &sc = scratch();
  float *tile = grow(sc.tile, 2 * bs * row);
  float *kt = tile, *vt = tile + bs * row;
  float *s_tok = grow(sc.sc, 2 * bs);
  auto vis = [&](uint64_t i) { return prefill ? n - n_q + i + 1 : n; };
  const uint64_t end = std::min(t_end, vis(i0 + rows - 1));
  // One query row (decode): tiles the source can show in place go through
  // the fused kernels (attention/fused.h), the others are read as f32.
  const bool fuse = rows == 1 && hd % 16 == 0 && fused::available();
  float *obs_row = obs && i0 >= obs_first ? obs : nullptr;
  // KVC_QUERY_INT8: the row's query quantized once, for the integer keys.
  fused::QueryI8 q8;
  const fused::QueryI8 *q8p = nullptr;
  if (fuse && sh.query_int8 && hd % 32 == 0 && fused::int8_query_available() && t_begin < end) {
    int8_t *codes = sc.q8.get(hq * hd);
    float *scale = grow(sc.q8_scale, hq);
    int32_t *sum = sc.q8_sum.get(hq);
    fused::quantize_query(q + i0 * hq * hd, hq, hd, codes, scale, sum);
    q8 = {codes, scale, sum, sh.int_values};
    q8p = &q8;
  }
  // Runs of tiles shown in place (this one and the next): up to 64 tokens
  // (or one tile) of one layout, so the softmax's per-call work is shared by
  // several blocks; 128 for integer keys scored by the int8 query (the
  // integer paths' per-run packing and per-head calls measured 4-5 % of the
  // int4 decode at 64; the float paths the same at 64 and 128). The rule is
  // the same with and without KVC_QUERY_INT8_VALUES, so the values mode keeps
  // KVC_QUERY_INT8's softmax bit for bit, and float keys keep
  // KVC_QUERY_EXACT's runs.
  auto run_tokens = [&](const RawTile &first) -> uint64_t {
    const RawType k = first.k.type;
    return q8p && (k == RawType::Int8 || k == RawType::UInt8 || k == RawType::Int4) &&
                   first.k.group == 0 && !first.k.channel && !first.k.rotation  // (else exact)
               ? 128
               : 64;
  };
  RawTile rt[2][fused::kMaxRun];
  uint64_t rc[2][fused::kMaxRun];
  int rn[2] = {0, 0}, cur = 0;
  auto gather = [&](uint64_t t, int slot) {
    int n = 0;
    uint64_t total = 0;
    while (n < fused::kMaxRun && t < end) {
      RawTile &r = rt[slot][n];
      const uint64_t c = src.raw(t, std::min(bs, end - t), r);
      if (!c || !fused::supports(r, hd) ||
          (n && (total + c > run_tokens(rt[slot][0]) || !fused::same_layout(r, rt[slot][0]))))
        break;
      rc[slot][n++] = c;
      total += c;
      t += c;
    }
    rn[slot] = n;
  };
  if (fuse && t_begin < end) gather(t_begin, 0);
  for (uint64_t t0 = t_begin; t0 < end;) {
    if (rn[cur]) {
      uint64_t t1 = t0;
      for (int i = 0; i < rn[cur]; ++i) t1 += rc[cur][i];
      if (t1 < end)
        gather(t1, cur ^ 1);
      else
        rn[cur ^ 1] = 0;
      if (q8p && !q8.codes_amx && bs >= 16 && hd % 64 == 0 && hd <= 64 * fused::kAmxMaxChunks &&
          grp <= 4 * fused::kAmxMaxPieces &&
          (rt[cur][0].k.type == RawType::Int8 || rt[cur][0].k.type == RawType::UInt8) &&
          rt[cur][0].k.group == 0 && !rt[cur][0].k.channel && !rt[cur][0].k.rotation &&
          fused::amx_in_use()) {
        // int8 keys on the AMX tiles, once a run of them comes
        int8_t *tiles = sc.q8_amx.get(fused::amx_query_bytes(hq, h, hd));
        fused::amx_query_tiles(q8.codes, hq, h, hd, tiles);
        q8.codes_amx = tiles;
      }
      if (q8p && !q8.codes_nib && hd % 64 == 0 && rt[cur][0].k.type == RawType::Int4 &&
          rt[cur][0].k.group == 0 && !rt[cur][0].k.channel && !rt[cur][0].k.rotation) {
        // int4 keys' order too, once a run of int4 keys comes
        int8_t *nib = sc.q8_nib.get(hq * hd);
        q8.nib_chunk = fused::split_query_nibbles(q8.codes, hq, hd, nib);
        q8.codes_nib = nib;
      }
      fused::run(sh, rt[cur], rc[cur], rn[cur], q + i0 * hq * hd, m, ls, acc, obs_row, obs_stride,
                 t0, rn[cur ^ 1] ? rt[cur ^ 1] : nullptr, rc[cur ^ 1], rn[cur ^ 1], q8p);
      cur ^= 1;
      t0 = t1;
      continue;
    }
    const uint64_t cnt = src.read(t0, std::min(bs, end - t0), kt, vt);
    for (uint64_t r = 0; r < rows; ++r) {
      const uint64_t v_r = vis(i0 + r);
      if (v_r <= t0) continue;
      const uint64_t c = std::min(cnt, v_r - t0);
      for (uint64_t hh = 0; hh < hq; ++hh) {
        const uint64_t g = hh / grp, st = r * hq + hh;
        const float *qv = q + ((i0 + r) * hq + hh) * hd;
        float mx = -std::numeric_limits<float>::infinity();
        kr.dots(qv, kt + g * hd, row, c, hd, s_tok);
        for (uint64_t t = 0; t < c; ++t) {
          float sv = s_tok[t];
          // q.k beyond f32 (finite inputs can overflow): clamped, so the
          // softmax stays defined; NaN (Inf - Inf in the sum) counts as -max.
          sv = sv != sv ? -std::numeric_limits<float>::max()
                        : std::min(std::numeric_limits<float>::max(),
                                   std::max(-std::numeric_limits<float>::max(), sv));
          s_tok[t] = sv;
          mx = std::max(mx, sv);
        }
        if (obs && i0 + r >= obs_first)
          std::memcpy(obs + ((i0 + r - obs_first) * hq + hh) * obs_stride + t0, s_tok,
                      c * sizeof(float));
        const float m_new = std::max(m[st], mx);
        const float corr =
            m[st] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(m[st] - m_new);
        float *a = acc + st * hd;
        if (corr != 1.0f) {
          ls[st] *= corr;
          for (uint64_t d = 0; d < hd; ++d) a[d] *= corr;
        }
        float *p_tok = s_tok + bs;  // the probabilities, after the scores
        for (uint64_t t = 0; t < c; ++t) {
          p_tok[t] = std::exp(s_tok[t] - m_new);
          ls[st] += p_tok[t];
        }
        kr.accumulate(a, p_tok, vt + g * hd, row, c, hd);
        m[st] = m_new;
      }
    }
    t0 += cnt;
    if (fuse && t0 < end) gather(t0, cur);
  }
}

void init_state(float *m, float *ls, float *acc, uint64_t heads, uint64_t hd) {
  std::fill(m, m + heads, -std::numeric_limits<float>::infinity());
  std::fill(ls, ls + heads, 0.0f);
  std::fill(acc, acc + heads * hd, 0.0f);
}
// out = acc / ls and lse = m + log(ls); nothing visible: zeros and -inf.
void finalize(const float *m, const float *ls, const float *acc, uint64_t heads, uint64_t hd,
              float *out, float *lse) {
  for (uint64_t st = 0; st < heads; ++st) {
    float *o = out + st * hd;
    if (ls[st] > 0.0f) {
      const float inv = 1.0f / ls[st];
      for (uint64_t d = 0; d < hd; ++d) o[d] = acc[st * hd + d] * inv;
      lse[st] = m[st] + std::log(ls[st]);
    } else {
      std::fill(o, o + hd, 0.0f);
      lse[st] = -std::numeric_limits<float>::infinity();
    }
  }
}
// Merges state b into a (the log-sum-exp merge of FlashDecoding's split-K).
void merge_state(float *m, float *ls, float *acc, const float *mb, const float *lsb,
                 const float *accb, uint64_t heads, uint64_t hd) {
  for (uint64_t st = 0; st < heads; ++st) {
    if (!(lsb[st] > 0.0f)) continue;
    if (!(ls[st] > 0.0f)) {
      m[st] = mb[st];
      ls[st] = lsb[st];
      std::copy(accb + st * hd, accb + (st + 1) * hd, acc + st * hd);
      continue;
    }
    const float mm = std::max(m[st], mb[st]), ca = std::exp(m[st] - mm), cb = std::exp(mb[st] - mm);
    ls[st] = ls[st] * ca + lsb[st] * cb;
    for (uint64_t d = 0; d < hd; ++d)
      acc[st * hd + d] = acc[st * hd + d] * ca + accb[st * hd + d] * cb;
    m[st] = mm;
  }
}

}  // namespace

namespace {

constexpr uint64_t kRows = 32;  // query rows that share one pass over the tiles

// Query rows [i0, i0 + rows) of attend(): their own state, output and
// log-sum-exp rows; observation added under *obs_mu.
void attend_block(const Shape &sh, const TileSource &src, uint64_t n, const float *q, uint64_t n_q,
                  bool prefill, uint64_t i0, uint64_t rows, float *out, float *lse,
                  float *obs_scores, uint64_t observe_from, std::mutex *obs_mu,
                  bool obs_max = false) {
  const uint64_t hq = sh.q_heads, h = sh.kv_heads, hd = sh.head_dim;
  const uint64_t grp = hq / h;
  AttnScratch &sc = scratch();
  auto vis = [&](uint64_t i) { return prefill ? n - n_q + i + 1 : n; };
  const uint64_t max_vis = vis(i0 + rows - 1);
  float *state = grow(sc.state, rows * hq * (hd + 2));
  float *m = state, *ls = state + rows * hq, *acc = state + 2 * rows * hq;
  init_state(m, ls, acc, rows * hq, hd);
  // Raw scores of observed rows, kept for the probabilities at the end.
  const uint64_t obs_first =
      obs_scores ? std::max(i0, std::min(observe_from, i0 + rows)) : i0 + rows;
  const uint64_t obs_rows = i0 + rows - obs_first;
  float *obs = obs_rows ? grow(sc.obs, obs_rows * hq * max_vis) : nullptr;
  attend_range(sh, src, n, q, n_q, prefill, i0, rows, 0, max_vis, m, ls, acc, obs, obs_first,
               max_vis);
  finalize(m, ls, acc, rows * hq, hd, out + i0 * hq * hd, lse + i0 * hq);
  std::unique_lock<std::mutex> sg;  // recorded scores are shared state
  if (obs_rows && obs_mu) sg = std::unique_lock<std::mutex>(*obs_mu);
  for (uint64_t i = obs_first; i < i0 + rows; ++i)
    for (uint64_t hh = 0; hh < hq; ++hh) {
      const float ll = lse[i * hq + hh];
      if (!(ll > -std::numeric_limits<float>::infinity())) continue;
      const float *sr = obs + ((i - obs_first) * hq + hh) * max_vis;
      const uint64_t g = hh / grp;
      if (obs_max)
        for (uint64_t t = 0; t < vis(i); ++t)
          obs_scores[t * h + g] = std::max(obs_scores[t * h + g], std::exp(sr[t] - ll));
      else
        for (uint64_t t = 0; t < vis(i); ++t) obs_scores[t * h + g] += std::exp(sr[t] - ll);
    }
}

// The tiles of a source read once into f32: each block of kRows query rows
// reads every tile again, and a source's read may decode a codec, re-rotate
// pre-RoPE keys or undo a Hadamard rotation. A read returns the source's own
// tile (the same boundaries, so the online softmax gives the same bytes),
// copied.
class DenseTiles final : public TileSource {
 public:
  // Null when the copy would pass kMaxDenseBytes (the source is then read
  // as it is).
  static const TileSource *make(const Shape &sh, const TileSource &src, uint64_t n,
                                std::optional<DenseTiles> &slot) {
    constexpr uint64_t kMaxDenseBytes = uint64_t(128) << 20;
    const uint64_t row = sh.kv_heads * sh.head_dim;
    if (n == 0 || row == 0 || n > kMaxDenseBytes / (2 * row * sizeof(float))) return nullptr;
    AttnScratch &sc = scratch();
    float *k = sc.dense.get(2 * n * row);
    uint32_t *len = sc.dense_len.get(n);
    for (uint64_t t0 = 0; t0 < n;) {
      const uint64_t c =
          src.read(t0, std::min(sh.max_tile, n - t0), k + t0 * row, k + (n + t0) * row);
      len[t0] = static_cast<uint32_t>(c);
      t0 += c;
    }
    slot.emplace(k, k + n * row, len, row);
    return &*slot;
  }
  DenseTiles(const float *k, const float *v, const uint32_t *len, uint64_t row)
      : k_(k), v_(v), len_(len), row_(row) {}
  uint64_t read(uint64_t t0, uint64_t max_count, float *k, float *v) const override {
    // t0 is always where a tile of the source starts: reads start at 0 and
    // advance by what they return, up to a row block's end.
    const uint64_t c = std::min<uint64_t>(len_[t0], max_count);
    std::memcpy(k, k_ + t0 * row_, c * row_ * sizeof(float));
    std::memcpy(v, v_ + t0 * row_, c * row_ * sizeof(float));
    return c;
  }

 private:
  const float *k_, *v_;
  const uint32_t *len_;
  uint64_t row_;
};

// Runs work() on the calling thread and up to `extra` more; the first
// exception is rethrown after all joined. A thread that cannot be started
// leaves its share to the others.
// A thread's start and join cost about 50-100 us; one core does a few
// multiply-adds per ns here. Below kMinWork multiply-adds (q.k and p.v over
// head_dim, about 0.3 ms) per thread a thread costs more than it saves.
constexpr uint64_t kMinWork = uint64_t(1) << 21;
uint32_t threads_for(uint64_t work, uint32_t threads) {
  return static_cast<uint32_t>(std::max<uint64_t>(1, std::min<uint64_t>(threads, work / kMinWork)));
}

template <typename Work>
void run_on_threads(uint32_t extra, Work &&work) {
  std::exception_ptr error;
  std::mutex error_mu;
  auto guarded = [&] {
    try {
      work();
    } catch (...) {
      std::lock_guard<std::mutex> g(error_mu);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(extra);
  for (uint32_t t = 0; t < extra; ++t) {
    try {
      pool.emplace_back(guarded);
    } catch (...) {
      break;
    }
  }
  guarded();
  for (std::thread &t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

void attend(const Shape &sh, const TileSource &src, uint64_t n, const float *q, uint64_t n_q,
            bool prefill, float *out, float *lse, float *obs_scores, uint64_t observe_from,
            std::mutex *obs_mu, bool obs_max) {
  std::optional<DenseTiles> dense;
  const TileSource *tiles = n_q > kRows ? DenseTiles::make(sh, src, n, dense) : nullptr;
  if (!tiles) tiles = &src;
  for (uint64_t i0 = 0; i0 < n_q; i0 += kRows)
    attend_block(sh, *tiles, n, q, n_q, prefill, i0, std::min(kRows, n_q - i0), out, lse,
                 obs_scores, observe_from, obs_mu, obs_max);
}

// The blocks of kRows rows are independent (each its own state and output
// rows), so each gives the same bytes on any thread. Under causal prefill
// later blocks see more tokens: they are handed out first.
void attend_rows_threads(const Shape &sh, const TileSource &src, uint64_t n, const float *q,
                         uint64_t n_q, bool prefill, float *out, float *lse, uint32_t threads) {
  const uint64_t blocks = (n_q + kRows - 1) / kRows;
  threads = threads_for(n_q * n * sh.q_heads * sh.head_dim, threads);
  if (threads <= 1 || blocks <= 1) {
    attend(sh, src, n, q, n_q, prefill, out, lse, nullptr, 0, nullptr);
    return;
  }
  std::optional<DenseTiles> dense;
  const TileSource *tiles = DenseTiles::make(sh, src, n, dense);
  if (!tiles) tiles = &src;
  std::atomic<uint64_t> next{0};
  run_on_threads(static_cast<uint32_t>(std::min<uint64_t>(threads, blocks)) - 1, [&] {
    for (uint64_t b; (b = next.fetch_add(1)) < blocks;) {
      const uint64_t i0 = (blocks - 1 - b) * kRows;
      attend_block(sh, *tiles, n, q, n_q, prefill, i0, std::min(kRows, n_q - i0), out, lse, nullptr,
                   0, nullptr);
    }
  });
}

// Decode over several threads (the caller's included): work units are
// (sequence, token range); a sequence longer than its share is split into
// ranges whose partial states are merged by log-sum-exp (FlashDecoding).
void attend_threads(const Shape &sh, const std::vector<const TileSource *> &src,
                    const std::vector<uint64_t> &ns, const float *q, float *out, float *lse,
                    uint32_t threads) {
  const uint64_t hq = sh.q_heads, hd = sh.head_dim, n_seqs = src.size();
  const uint64_t state_size = hq * (hd + 2);
  struct Unit {
    uint64_t seq, t0, t1;
  };
  std::vector<Unit> units;
  uint64_t total = 0;
  for (uint64_t n : ns) total += n;
  threads = threads_for(total * hq * hd, threads);
  const uint64_t per_seq_split = n_seqs >= threads ? 1 : (threads + n_seqs - 1) / n_seqs;
  constexpr uint64_t kMinChunk = 256;  // tokens: below this a split costs more than it saves
  for (uint64_t i = 0; i < n_seqs; ++i) {
    const uint64_t n = ns[i];
    const uint64_t parts = std::max<uint64_t>(1, std::min(per_seq_split, n / kMinChunk));
    const uint64_t chunk = (n + parts - 1) / std::max<uint64_t>(parts, 1);
    if (n == 0) units.push_back({i, 0, 0});
    for (uint64_t t = 0; t < n; t += chunk) units.push_back({i, t, std::min(n, t + chunk)});
  }
  std::vector<float> states(units.size() * state_size);
  std::atomic<size_t> next{0};
  run_on_threads(
      static_cast<uint32_t>(std::max<uint64_t>(1, std::min<uint64_t>(threads, units.size()))) - 1,
      [&] {
        for (size_t u; (u = next.fetch_add(1)) < units.size();) {
          float *st = states.data() + u * state_size;
          init_state(st, st + hq, st + 2 * hq, hq, hd);
          const Unit &un = units[u];
          attend_range(sh, *src[un.seq], ns[un.seq], q + un.seq * hq * hd, 1, false, 0, 1, un.t0,
                       un.t1, st, st + hq, st + 2 * hq, nullptr, 1, 0);
        }
      });
  // Merge each sequence's ranges in token order, then finalize.
  for (size_t u = 0; u < units.size();) {
    float *st = states.data() + u * state_size;
    size_t v = u + 1;
    for (; v < units.size() && units[v].seq == units[u].seq; ++v) {
      const float *sb = states.data() + v * state_size;
      merge_state(st, st + hq, st + 2 * hq, sb, sb + hq, sb + 2 * hq, hq, hd);
    }
    const uint64_t i = units[u].seq;
    finalize(st, st + hq, st + 2 * hq, hq, hd, out + i * hq * hd, lse + i * hq);
    u = v;
  }
}

}  // namespace kvc::attention
