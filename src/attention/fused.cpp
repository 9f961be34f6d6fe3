// Fused decode kernels (attention/fused.h).
#include "attention/fused.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/scratch.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <cpuid.h>
#endif

namespace kvc::attention::fused {

bool supports(const RawTile &rt, uint64_t head_dim) {
  auto known = [](const RawPart &p) {
    return p.type != RawType::None && p.data != nullptr &&
           (p.type == RawType::F32 || p.type == RawType::F16 || p.type == RawType::BF16 ||
            p.scale != nullptr);
  };
  return head_dim > 0 && head_dim % 16 == 0 && known(rt.k) && known(rt.v);
}

#if defined(__x86_64__)

namespace {
int detect_isa() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
  // F16C from CPUID leaf 1, ECX bit 29: clang's __builtin_cpu_supports does not
  // know the name "f16c" (GCC does), and both compilers build this file.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
  if (!(ecx & bit_F16C)) return 0;
  // Level 2: AVX-512 VNNI on 256-bit vectors (needs VL; __builtin_cpu_supports
  // reports AVX-512 features only where the OS saves their state).
  return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") ? 2 : 1;
}
const int g_cpu_isa = detect_isa();
std::atomic<int> g_isa_limit{2};
int isa() {
  return std::min(g_cpu_isa, g_isa_limit.load(std::memory_order_relaxed));
}
}  // namespace

bool available() {
  return isa() > 0;
}
bool int8_query_available() {
  return isa() >= 2;
}
int set_isa_limit(int limit) {
  g_isa_limit.store(limit, std::memory_order_relaxed);
  return isa();
}

void quantize_query(const float *q, uint64_t q_heads, uint64_t head_dim, int8_t *codes,
                    float *scale, int32_t *sum) {
  for (uint64_t h = 0; h < q_heads; ++h) {
    const float *x = q + h * head_dim;
    int8_t *c = codes + h * head_dim;
    float amax = 0.0f;
    for (uint64_t d = 0; d < head_dim; ++d) amax = std::max(amax, std::fabs(x[d]));
    const float sc = amax / 127.0f;
    int32_t total = 0;
    for (uint64_t d = 0; d < head_dim; ++d) {
      // |x / sc| <= 127 up to rounding; the clamp keeps a code in range
      const float r = sc > 0.0f ? std::nearbyint(x[d] / sc) : 0.0f;
      const int32_t v = static_cast<int32_t>(std::min(127.0f, std::max(-127.0f, r)));
      c[d] = static_cast<int8_t>(v);
      total += v;
    }
    scale[h] = sc;
    sum[h] = total;
  }
}

namespace {

#define KVC_FUSED __attribute__((target("avx2,fma,f16c")))
// Register arrays (accumulators, converted rows) need their loops unrolled.
#define KVC_UNROLL _Pragma("GCC unroll 16")

constexpr float kMax = std::numeric_limits<float>::max();

// 8 values of a head's row from element d (d % 8 == 0) as f32 codes (before
// scale and zero).
template <RawType T>
KVC_FUSED inline __m256 load8(const uint8_t *row, uint64_t d, __m256i off) {
  if constexpr (T == RawType::F32) {
    return _mm256_loadu_ps(reinterpret_cast<const float *>(row) + d);
  } else if constexpr (T == RawType::F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(row + 2 * d)));
  } else if constexpr (T == RawType::BF16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(row + 2 * d));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else if constexpr (T == RawType::Int8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(row + d));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  } else if constexpr (T == RawType::UInt8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(row + d));
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
  } else {  // Int4: element j in bits 4j.. of the little-endian word of 4 bytes
    uint32_t w;
    std::memcpy(&w, row + d / 2, 4);
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)),
                                  _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    v = _mm256_sub_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xf)), off);
    return _mm256_cvtepi32_ps(v);
  }
}

KVC_FUSED inline float hsum(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}
// r[i] = the sum of the lanes of a[i], i = 0..7.
KVC_FUSED inline __m256 hsum8(const __m256 *a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// e^x for x <= 0 (Cephes' expf: a degree-5 polynomial after a range
// reduction by ln 2, about 1 ulp); below -87.3 (under FLT_MIN) gives 0.
KVC_FUSED inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), lo);
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, z, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(under, y);
}

// s[j][t] = q_j . k_t (codes) for the J heads q (rows of hd) and c tokens,
// NT tokens a step with J * NT == 8 accumulators.
template <RawType T, int J>
KVC_FUSED void scores(const uint8_t *k0, uint64_t kts, uint64_t c, uint64_t hd, const float *q,
                      int32_t off32, float *s, uint64_t ss) {
  // The code offset arrives as an integer and is broadcast here: a vector
  // argument through the pointers of ScoresFn (declared without the AVX2
  // target) is passed differently at -O0 than the callee reads it.
  const __m256i off = _mm256_set1_epi32(off32);
  constexpr int NT = 8 / J;
  uint64_t t = 0;
  for (; t + NT <= c; t += NT) {
    __m256 a[8];
    KVC_UNROLL
    for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
    for (uint64_t d = 0; d < hd; d += 8) {
      __m256 x[NT];
      KVC_UNROLL
      for (int u = 0; u < NT; ++u) x[u] = load8<T>(k0 + (t + u) * kts, d, off);
      KVC_UNROLL
      for (int j = 0; j < J; ++j) {
        const __m256 qq = _mm256_loadu_ps(q + j * hd + d);
        KVC_UNROLL
        for (int u = 0; u < NT; ++u) a[u * J + j] = _mm256_fmadd_ps(qq, x[u], a[u * J + j]);
      }
    }
    alignas(32) float r[8];
    _mm256_store_ps(r, hsum8(a));
    KVC_UNROLL
    for (int u = 0; u < NT; ++u) KVC_UNROLL
    for (int j = 0; j < J; ++j) s[j * ss + t + u] = r[u * J + j];
  }
  for (; t < c; ++t) {
    __m256 a[J];
    KVC_UNROLL
    for (int j = 0; j < J; ++j) a[j] = _mm256_setzero_ps();
    for (uint64_t d = 0; d < hd; d += 8) {
      const __m256 x = load8<T>(k0 + t * kts, d, off);
      KVC_UNROLL
      for (int j = 0; j < J; ++j) a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * hd + d), x, a[j]);
    }
    KVC_UNROLL
    for (int j = 0; j < J; ++j) s[j * ss + t] = hsum(a[j]);
  }
}

// acc_j = acc_j * corr_j + sum_t p[j][t] v_t (codes) + zadd_j, for the J
// heads' accumulators (rows of hd), DV vectors of 8 a head at a time.
template <RawType T, int J>
KVC_FUSED void accumulate(float *acc, const float *corr, const float *p, uint64_t ps,
                          const float *zadd, const uint8_t *v0, uint64_t vts, uint64_t c,
                          uint64_t hd, int32_t off32) {
  const __m256i off = _mm256_set1_epi32(off32);  // (see scores)
  constexpr int DV = J <= 4 ? 2 : 1;
  for (uint64_t d = 0; d < hd; d += 8 * DV) {
    __m256 a[J][DV];
    KVC_UNROLL
    for (int j = 0; j < J; ++j) KVC_UNROLL
    for (int u = 0; u < DV; ++u)
      a[j][u] = _mm256_mul_ps(_mm256_loadu_ps(acc + j * hd + d + 8 * u), _mm256_set1_ps(corr[j]));
    for (uint64_t t = 0; t < c; ++t) {
      const uint8_t *row = v0 + t * vts;
      __m256 x[DV];
      KVC_UNROLL
      for (int u = 0; u < DV; ++u) x[u] = load8<T>(row, d + 8 * u, off);
      KVC_UNROLL
      for (int j = 0; j < J; ++j) {
        const __m256 pj = _mm256_broadcast_ss(p + j * ps + t);
        KVC_UNROLL
        for (int u = 0; u < DV; ++u) a[j][u] = _mm256_fmadd_ps(pj, x[u], a[j][u]);
      }
    }
    KVC_UNROLL
    for (int j = 0; j < J; ++j) KVC_UNROLL
    for (int u = 0; u < DV; ++u) {
      __m256 r = a[j][u];
      if (zadd) r = _mm256_add_ps(r, _mm256_set1_ps(zadd[j]));
      _mm256_storeu_ps(acc + j * hd + d + 8 * u, r);
    }
  }
}

template <int J>
using ScoresFn = void (*)(const uint8_t *, uint64_t, uint64_t, uint64_t, const float *, int32_t,
                          float *, uint64_t);
template <int J>
using AccFn = void (*)(float *, const float *, const float *, uint64_t, const float *,
                       const uint8_t *, uint64_t, uint64_t, uint64_t, int32_t);

template <int J>
ScoresFn<J> scores_fn(RawType t) {
  switch (t) {
    case RawType::F32:
      return scores<RawType::F32, J>;
    case RawType::F16:
      return scores<RawType::F16, J>;
    case RawType::BF16:
      return scores<RawType::BF16, J>;
    case RawType::Int8:
      return scores<RawType::Int8, J>;
    case RawType::UInt8:
      return scores<RawType::UInt8, J>;
    default:
      return scores<RawType::Int4, J>;
  }
}
template <int J>
AccFn<J> acc_fn(RawType t) {
  switch (t) {
    case RawType::F32:
      return accumulate<RawType::F32, J>;
    case RawType::F16:
      return accumulate<RawType::F16, J>;
    case RawType::BF16:
      return accumulate<RawType::BF16, J>;
    case RawType::Int8:
      return accumulate<RawType::Int8, J>;
    case RawType::UInt8:
      return accumulate<RawType::UInt8, J>;
    default:
      return accumulate<RawType::Int4, J>;
  }
}

// --- int8 query (KVC_QUERY_INT8): scores of integer keys in integers -------
// vpdpbusd multiplies unsigned bytes by signed ones: the key codes are the
// unsigned side (int8 codes + 128, uint8 codes, int4 nibbles), the query's
// int8 codes the signed side; what the unsigned form adds (128 or the int4
// offset, times the sum of the query codes) is taken off once per score.
#define KVC_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))

// 32 key codes of a row from element d (d % 32 == 0) as unsigned bytes.
template <RawType T>
KVC_VNNI inline __m256i load32u(const uint8_t *row, uint64_t d) {
  if constexpr (T == RawType::Int8) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(row + d)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  } else if constexpr (T == RawType::UInt8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(row + d));
  } else {  // Int4: byte i holds elements 2i (low nibble) and 2i + 1
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(row + d / 2));
    const __m128i m = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    return _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
  }
}
// r[i] = the sum of the lanes of a[i], i = 0..7.
KVC_VNNI inline __m256i hsum8_epi32(const __m256i *a) {
  const __m256i t0 = _mm256_hadd_epi32(a[0], a[1]), t1 = _mm256_hadd_epi32(a[2], a[3]);
  const __m256i t2 = _mm256_hadd_epi32(a[4], a[5]), t3 = _mm256_hadd_epi32(a[6], a[7]);
  const __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                          _mm256_permute2x128_si256(u0, u1, 0x31));
}
KVC_VNNI inline int32_t hsum_epi32(__m256i v) {
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 1));
  return _mm_cvtsi128_si32(h);
}

// s[j][t] = (sum_d q8[j][d] u[t][d] - corr[j]) x qs[j] for the J heads and c
// tokens (u: the unsigned key codes), NT tokens a step with J * NT == 8
// accumulators.
template <RawType T, int J>
KVC_VNNI void scores_i8(const uint8_t *k0, uint64_t kts, uint64_t c, uint64_t hd, const int8_t *q8,
                        const int32_t *corr, const float *qs, float *s, uint64_t ss) {
  constexpr int NT = 8 / J;
  alignas(32) int32_t cl[8];
  alignas(32) float sl[8];
  for (int i = 0; i < 8; ++i) {
    cl[i] = corr[i % J];
    sl[i] = qs[i % J];
  }
  const __m256i vc = _mm256_load_si256(reinterpret_cast<const __m256i *>(cl));
  const __m256 vs = _mm256_load_ps(sl);
  uint64_t t = 0;
  for (; t + NT <= c; t += NT) {
    __m256i a[8];
    KVC_UNROLL
    for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_si256();
    for (uint64_t d = 0; d < hd; d += 32) {
      __m256i x[NT];
      KVC_UNROLL
      for (int u = 0; u < NT; ++u) x[u] = load32u<T>(k0 + (t + u) * kts, d);
      KVC_UNROLL
      for (int j = 0; j < J; ++j) {
        const __m256i qq = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q8 + j * hd + d));
        KVC_UNROLL
        for (int u = 0; u < NT; ++u) a[u * J + j] = _mm256_dpbusd_epi32(a[u * J + j], x[u], qq);
      }
    }
    alignas(32) float r[8];
    _mm256_store_ps(r, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(hsum8_epi32(a), vc)), vs));
    KVC_UNROLL
    for (int u = 0; u < NT; ++u) KVC_UNROLL
    for (int j = 0; j < J; ++j) s[j * ss + t + u] = r[u * J + j];
  }
  for (; t < c; ++t) {
    __m256i a[J];
    KVC_UNROLL
    for (int j = 0; j < J; ++j) a[j] = _mm256_setzero_si256();
    for (uint64_t d = 0; d < hd; d += 32) {
      const __m256i x = load32u<T>(k0 + t * kts, d);
      KVC_UNROLL
      for (int j = 0; j < J; ++j)
        a[j] = _mm256_dpbusd_epi32(
            a[j], x, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q8 + j * hd + d)));
    }
    KVC_UNROLL
    for (int j = 0; j < J; ++j)
      s[j * ss + t] = static_cast<float>(hsum_epi32(a[j]) - corr[j]) * qs[j];
  }
}

template <int J>
using ScoresI8Fn = void (*)(const uint8_t *, uint64_t, uint64_t, uint64_t, const int8_t *,
                            const int32_t *, const float *, float *, uint64_t);
template <int J>
ScoresI8Fn<J> scores_i8_fn(RawType t) {
  switch (t) {
    case RawType::Int8:
      return scores_i8<RawType::Int8, J>;
    case RawType::UInt8:
      return scores_i8<RawType::UInt8, J>;
    default:
      return scores_i8<RawType::Int4, J>;
  }
}

KVC_FUSED float load_scale(const uint8_t *p, bool f16) {
  if (f16) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
  }
  float f;
  std::memcpy(&f, p, 4);
  return f;
}
bool integer(RawType t) {
  return t == RawType::Int8 || t == RawType::UInt8 || t == RawType::Int4;
}

// Integer keys first turn the code dots into scores (s = s * ks + kz * qsum;
// ks null: float keys), then clamps them as the tile path does (NaN:
// -FLT_MAX); returns their maximum.
KVC_FUSED float clamp_max(float *s, uint64_t c, const float *ks, const float *kz, float qsum) {
  const __m256 hi = _mm256_set1_ps(kMax), lo = _mm256_set1_ps(-kMax), vq = _mm256_set1_ps(qsum);
  __m256 mx = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  uint64_t t = 0;
  for (; t + 8 <= c; t += 8) {
    __m256 x = _mm256_loadu_ps(s + t);
    if (ks) {
      x = _mm256_mul_ps(x, _mm256_loadu_ps(ks + t));
      if (kz) x = _mm256_fmadd_ps(_mm256_loadu_ps(kz + t), vq, x);
    }
    x = _mm256_blendv_ps(x, lo, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
    _mm256_storeu_ps(s + t, x);
    mx = _mm256_max_ps(mx, x);
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  float m = _mm_cvtss_f32(h);
  for (; t < c; ++t) {
    float v = s[t];
    if (ks) v = kz ? std::fma(kz[t], qsum, v * ks[t]) : v * ks[t];
    v = v != v ? -kMax : std::min(kMax, std::max(-kMax, v));
    s[t] = v;
    m = std::max(m, v);
  }
  return m;
}
// p[t] = e^(s[t] - m) in place; returns their sum. Integer values (vs not
// null): also pv[t] = p[t] * vs[t] and, with zero points, *zadd = the sum of
// p[t] * vz[t].
KVC_FUSED float exp_sum(float *s, uint64_t c, float m, const float *vs, const float *vz, float *pv,
                        float *zadd) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps(), zs = _mm256_setzero_ps();
  uint64_t t = 0;
  for (; t + 8 <= c; t += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), vm));
    _mm256_storeu_ps(s + t, e);
    sum = _mm256_add_ps(sum, e);
    if (vs) {
      _mm256_storeu_ps(pv + t, _mm256_mul_ps(e, _mm256_loadu_ps(vs + t)));
      if (vz) zs = _mm256_fmadd_ps(e, _mm256_loadu_ps(vz + t), zs);
    }
  }
  if (t < c) {  // the rest through padded vectors
    alignas(32) float b[8] = {}, sv[8] = {}, zv[8] = {};
    const uint64_t r = c - t;
    for (uint64_t i = 0; i < 8; ++i) {
      b[i] = i < r ? s[t + i] - m : -std::numeric_limits<float>::infinity();
      if (vs && i < r) sv[i] = vs[t + i];
      if (vz && i < r) zv[i] = vz[t + i];
    }
    const __m256 e = exp8(_mm256_load_ps(b));
    _mm256_store_ps(b, e);
    for (uint64_t i = 0; i < r; ++i) s[t + i] = b[i];
    sum = _mm256_add_ps(sum, e);
    if (vs) {
      _mm256_store_ps(sv, _mm256_mul_ps(e, _mm256_load_ps(sv)));
      for (uint64_t i = 0; i < r; ++i) pv[t + i] = sv[i];
      if (vz) zs = _mm256_fmadd_ps(e, _mm256_load_ps(zv), zs);
    }
  }
  if (zadd) *zadd = hsum(zs);
  return hsum(sum);
}

struct FusedScratch {
  ScratchBuffer<float> buf;
  ScratchBuffer<int32_t> corr;
};

// Calls f(J, j) for the chunks of J heads (8, 4, 2 or 1) that cover grp heads.
template <typename F>
KVC_FUSED inline void chunks(uint64_t grp, F &&f) {
  uint64_t j = 0;
  for (; j + 8 <= grp; j += 8) f(std::integral_constant<int, 8>{}, j);
  for (; j + 4 <= grp; j += 4) f(std::integral_constant<int, 4>{}, j);
  for (; j + 2 <= grp; j += 2) f(std::integral_constant<int, 2>{}, j);
  for (; j < grp; ++j) f(std::integral_constant<int, 1>{}, j);
}

// Prefetches rows [b0, b0 + n) of KV head g of part P (bytes per row
// `bytes`) into the cache.
KVC_FUSED inline void prefetch_rows(const RawPart &P, uint64_t b0, uint64_t n, uint64_t g,
                                    uint64_t bytes) {
  const uint8_t *base = P.data + b0 * P.token_stride + g * P.head_stride;
  for (uint64_t t = 0; t < n; ++t)
    for (uint64_t b = 0; b < bytes; b += 64)
      _mm_prefetch(reinterpret_cast<const char *>(base + t * P.token_stride + b), _MM_HINT_T0);
}
uint64_t row_bytes(RawType t, uint64_t hd) {
  switch (t) {
    case RawType::F32:
      return 4 * hd;
    case RawType::F16:
    case RawType::BF16:
      return 2 * hd;
    case RawType::Int4:
      return hd / 2;
    default:
      return hd;
  }
}

// Three passes over a tile: the scores of every query head (each K row
// converted once for the heads of its group), the online softmax's update
// per head, the weighted sum of V (each V row converted once for its group).
// The values of this tile and the keys of the next are prefetched while the
// pass before them computes.
KVC_FUSED void tile_avx2(const Shape &sh, const RawTile &rt, uint64_t c, const float *q, float *m,
                         float *ls, float *acc, float *obs, uint64_t obs_stride, uint64_t t0,
                         const RawTile *next, uint64_t next_c, const QueryI8 *q8) {
  constexpr uint64_t kBand = 16;
  thread_local FusedScratch fs;
  const uint64_t hq = sh.q_heads, h = sh.kv_heads, grp = hq / h, hd = sh.head_dim;
  const RawPart &K = rt.k, &V = rt.v;
  const bool kint = integer(K.type), vint = integer(V.type);
  float *buf = fs.buf.get(c * (2 * hq + 4 * h) + 3 * hq + 8);
  float *s = buf, *pv = s + hq * c, *ks = pv + hq * c, *kz = ks + h * c, *vs = kz + h * c,
        *vz = vs + h * c, *corr = vz + h * c, *zadd = corr + hq, *mx = zadd + hq;
  for (int kv = 0; kv < 2; ++kv) {  // scales and zero points per KV head
    const RawPart &P = kv ? V : K;
    if (!integer(P.type)) continue;
    for (uint64_t g = 0; g < h; ++g) {
      float *sc = (kv ? vs : ks) + g * c, *zr = (kv ? vz : kz) + g * c;
      const uint8_t *sp = P.scale + g * P.scale_head_stride;
      const uint8_t *zp = P.zero ? P.zero + g * P.scale_head_stride : nullptr;
      for (uint64_t t = 0; t < c; ++t) {
        sc[t] = load_scale(sp + t * P.scale_token_stride, P.scale_f16);
        zr[t] = zp ? load_scale(zp + t * P.scale_token_stride, P.scale_f16) : 0.0f;
      }
    }
  }
  // An int8 query scores integer keys in integers; what the unsigned form of
  // the key codes adds per head is qcorr[hh] (128 or the int4 offset, times
  // the sum of the head's query codes).
  const bool i8 = q8 && kint;
  int32_t *qcorr = i8 ? fs.corr.get(hq) : nullptr;
  if (i8) {
    const int32_t add = K.type == RawType::Int8 ? 128 : K.type == RawType::Int4 ? K.offset : 0;
    for (uint64_t hh = 0; hh < hq; ++hh) qcorr[hh] = add * q8->sum[hh];
  }
  const uint64_t vrow = row_bytes(V.type, hd);
  const int32_t koff = K.offset, voff = V.offset;
  // Scores s[hh][t] of the codes.
  for (uint64_t b0 = 0; b0 < c; b0 += kBand) {
    const uint64_t n = std::min(kBand, c - b0);
    for (uint64_t g = 0; g < h; ++g)
      chunks(grp, [&](auto J, uint64_t j) {
        const uint64_t hh = g * grp + j;
        if (i8)
          scores_i8_fn<J>(K.type)(K.data + b0 * K.token_stride + g * K.head_stride, K.token_stride,
                                  n, hd, q8->codes + hh * hd, qcorr + hh, q8->scale + hh,
                                  s + hh * c + b0, c);
        else
          scores_fn<J>(K.type)(K.data + b0 * K.token_stride + g * K.head_stride, K.token_stride, n,
                               hd, q + hh * hd, koff, s + hh * c + b0, c);
        if (j == 0) prefetch_rows(V, b0, n, g, vrow);  // this tile's values, used below
      });
  }
  // Scores of the codes (scale, zero point), clamped; each head's maximum.
  for (uint64_t hh = 0; hh < hq; ++hh) {
    const uint64_t g = hh / grp;
    float *sh_ = s + hh * c;
    float qsum = 0.0f;
    if (kint && K.zero)
      for (uint64_t d = 0; d < hd; ++d) qsum += q[hh * hd + d];
    mx[hh] =
        clamp_max(sh_, c, kint ? ks + g * c : nullptr, kint && K.zero ? kz + g * c : nullptr, qsum);
    if (obs) std::memcpy(obs + hh * obs_stride + t0, sh_, c * sizeof(float));
  }
  // The running maxima and the rescale of what came before, e^(m - m_new)
  // (0 while nothing came: m = -inf), eight heads at a time.
  for (uint64_t h0 = 0; h0 < hq; h0 += 8) {
    const uint64_t r = std::min<uint64_t>(8, hq - h0);
    alignas(32) float mo[8], mn[8];
    for (uint64_t i = 0; i < 8; ++i) {
      mo[i] = i < r ? m[h0 + i] : 0.0f;
      mn[i] = i < r ? std::max(m[h0 + i], mx[h0 + i]) : 0.0f;
    }
    alignas(32) float e[8];
    _mm256_store_ps(e, exp8(_mm256_sub_ps(_mm256_load_ps(mo), _mm256_load_ps(mn))));
    for (uint64_t i = 0; i < r; ++i) {
      corr[h0 + i] = e[i];
      m[h0 + i] = mn[i];
    }
  }
  // Probabilities (and their value-scaled copies) and the running sums.
  for (uint64_t hh = 0; hh < hq; ++hh) {
    const uint64_t g = hh / grp;
    zadd[hh] = 0.0f;
    ls[hh] = ls[hh] * corr[hh] + exp_sum(s + hh * c, c, m[hh], vint ? vs + g * c : nullptr,
                                         vint && V.zero ? vz + g * c : nullptr, pv + hh * c,
                                         vint && V.zero ? zadd + hh : nullptr);
  }
  // acc = acc * corr + p . v (+ the zero points' share, once).
  const float *p = vint ? pv : s;
  float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  for (uint64_t b0 = 0; b0 < c; b0 += kBand) {
    const uint64_t n = std::min(kBand, c - b0);
    for (uint64_t g = 0; g < h; ++g)
      chunks(grp, [&](auto J, uint64_t j) {
        const uint64_t hh = g * grp + j;
        acc_fn<J>(V.type)(acc + hh * hd, b0 == 0 ? corr + hh : ones, p + hh * c + b0, c,
                          b0 == 0 && V.zero ? zadd + hh : nullptr,
                          V.data + b0 * V.token_stride + g * V.head_stride, V.token_stride, n, hd,
                          voff);
        if (j == 0 && next && b0 < next_c)  // the next tile's keys
          prefetch_rows(next->k, b0, std::min(kBand, next_c - b0), g, row_bytes(next->k.type, hd));
      });
  }
}
}  // namespace

void tile(const Shape &sh, const RawTile &rt, uint64_t c, const float *q, float *m, float *ls,
          float *acc, float *obs, uint64_t obs_stride, uint64_t t0, const RawTile *next,
          uint64_t next_c, const QueryI8 *q8) {
  tile_avx2(sh, rt, c, q, m, ls, acc, obs, obs_stride, t0, next, next_c, q8);
}

#else

bool available() {
  return false;
}
bool int8_query_available() {
  return false;
}
int set_isa_limit(int) {
  return 0;
}
void quantize_query(const float *, uint64_t, uint64_t, int8_t *, float *, int32_t *) {}
void tile(const Shape &, const RawTile &, uint64_t, const float *, float *, float *, float *,
          float *, uint64_t, uint64_t, const RawTile *, uint64_t, const QueryI8 *) {}

#endif

}  // namespace kvc::attention::fused
