// Fused decode kernels (attention/fused.h).

// GCC 12's 512-bit intrinsics (unpacks, lane shuffles, inserts) start from an
// undefined vector that -W(maybe-)uninitialized reports once they are
// inlined; no variable of this file is read uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "attention/fused.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "codec/codec.h"
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
  // per-group scales: whole groups of 16 values or more in each head, the
  // head's scales adjacent
  auto grouped = [&](const RawPart &p) {
    const uint64_t sb = p.scale_f16 ? 2 : 4;
    if (p.channel)  // one scale per dimension of each head, integer codes
      return p.group == 0 &&
             (p.type == RawType::Int8 || p.type == RawType::UInt8 || p.type == RawType::Int4) &&
             p.scale_head_stride == head_dim * sb;
    return p.group == 0 || (p.group % 16 == 0 && head_dim % p.group == 0 &&
                            p.scale_head_stride == head_dim / p.group * sb);
  };
  // rotated codes: whole rotation blocks in each head
  auto rotated = [&](const RawPart &p) {
    return p.rotation == 0 || (p.rotation <= head_dim && head_dim % p.rotation == 0);
  };
  return head_dim > 0 && head_dim % 16 == 0 && known(rt.k) && known(rt.v) && grouped(rt.k) &&
         grouped(rt.v) && rotated(rt.k) && rotated(rt.v);
}

bool same_layout(const RawTile &a, const RawTile &b) {
  auto same = [](const RawPart &x, const RawPart &y) {
    return x.type == y.type && x.token_stride == y.token_stride && x.head_stride == y.head_stride &&
           x.offset == y.offset && (x.zero == nullptr) == (y.zero == nullptr) &&
           x.scale_token_stride == y.scale_token_stride &&
           x.scale_head_stride == y.scale_head_stride && x.scale_f16 == y.scale_f16 &&
           x.group == y.group && x.channel == y.channel && x.rotation == y.rotation;
  };
  return same(a.k, b.k) && same(a.v, b.v);
}

#if defined(__x86_64__)

namespace {
// 0: no fused kernels; 1: AVX2 + FMA + F16C; 2: also AVX-512F + VL (32
// vector registers; __builtin_cpu_supports reports AVX-512 features only
// where the OS saves their state).
int detect_isa() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
  // F16C from CPUID leaf 1, ECX bit 29: clang's __builtin_cpu_supports does not
  // know the name "f16c" (GCC does), and both compilers build this file.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
  if (!(ecx & bit_F16C)) return 0;
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") ? 2 : 1;
}
const int g_cpu_isa = detect_isa();
// AVX-512 VNNI (and BW) for the int8-query score kernels, at level 2.
const bool g_cpu_vnni =
    g_cpu_isa >= 2 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
std::atomic<int> g_isa_limit{2};
int isa() {
  return std::min(g_cpu_isa, g_isa_limit.load(std::memory_order_relaxed));
}
}  // namespace

bool available() {
  return isa() > 0;
}
bool int8_query_available() {
  return isa() >= 2 && g_cpu_vnni;
}
int set_isa_limit(int limit) {
  g_isa_limit.store(limit, std::memory_order_relaxed);
  return isa();
}

namespace {
// AVX-512 F + BW + VL, for the two query helpers below (called only where
// int8_query_available()).
#define KVC_Q512 __attribute__((target("avx2,avx512f,avx512vl,avx512bw")))

// One head of quantize_query, 16 values a step (head_dim % 16 == 0): the
// same operations as the scalar rule (max |x|, x / scale rounded to nearest
// even, clamped), lane by lane, so the same codes.
KVC_Q512 void quantize_query_head16(const float *x, uint64_t hd, int8_t *c, float *scale,
                                    int32_t *sum) {
  __m512 vm = _mm512_setzero_ps();
  for (uint64_t d = 0; d < hd; d += 16)
    vm = _mm512_max_ps(vm, _mm512_abs_ps(_mm512_loadu_ps(x + d)));
  const float sc = _mm512_reduce_max_ps(vm) / 127.0f;
  *scale = sc;
  if (!(sc > 0.0f)) {
    std::memset(c, 0, hd);
    *sum = 0;
    return;
  }
  const __m512 vs = _mm512_set1_ps(sc), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
  __m512i total = _mm512_setzero_si512();
  for (uint64_t d = 0; d < hd; d += 16) {
    __m512 r = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(x + d), vs),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i v = _mm512_cvttps_epi32(_mm512_max_ps(_mm512_min_ps(r, hi), lo));
    total = _mm512_add_epi32(total, v);
    _mm_storeu_si128(reinterpret_cast<__m128i *>(c + d), _mm512_cvtepi32_epi8(v));
  }
  *sum = _mm512_reduce_add_epi32(total);
}
// split_query_nibbles 16 codes a step: each 16 bytes' even ones to the
// chunk's first half, the odd ones to its second (half: 32 or 64).
KVC_Q512 void split_query_nibbles16(const int8_t *codes, uint64_t n, uint64_t half, int8_t *out) {
  const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (uint64_t b = 0; b < n; b += 2 * half)
    for (uint64_t i = 0; i < 2 * half; i += 16) {
      const __m128i x = _mm_shuffle_epi8(
          _mm_loadu_si128(reinterpret_cast<const __m128i *>(codes + b + i)), order);
      _mm_storel_epi64(reinterpret_cast<__m128i *>(out + b + i / 2), x);
      _mm_storel_epi64(reinterpret_cast<__m128i *>(out + b + half + i / 2),
                       _mm_unpackhi_epi64(x, x));
    }
}
}  // namespace

void quantize_query(const float *q, uint64_t q_heads, uint64_t head_dim, int8_t *codes,
                    float *scale, int32_t *sum) {
  for (uint64_t h = 0; h < q_heads; ++h) {
    const float *x = q + h * head_dim;
    int8_t *c = codes + h * head_dim;
    if (head_dim % 16 == 0 && int8_query_available()) {
      quantize_query_head16(x, head_dim, c, scale + h, sum + h);
      continue;
    }
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

uint64_t split_query_nibbles(const int8_t *codes, uint64_t q_heads, uint64_t head_dim,
                             int8_t *out) {
  const uint64_t n = q_heads * head_dim, chunk = head_dim % 128 == 0 ? 128 : 64, half = chunk / 2;
  if (int8_query_available()) {
    split_query_nibbles16(codes, n, half, out);
    return chunk;
  }
  for (uint64_t b = 0; b < n; b += chunk)
    for (uint64_t i = 0; i < half; ++i) {
      out[b + i] = codes[b + 2 * i];
      out[b + half + i] = codes[b + 2 * i + 1];
    }
  return chunk;
}

namespace {

// Register arrays (accumulators, converted rows) need their loops unrolled.
#define KVC_UNROLL _Pragma("GCC unroll 16")

bool integer(RawType t) {
  return t == RawType::Int8 || t == RawType::UInt8 || t == RawType::Int4;
}
// Codes with scales: integer ones and fp8 ones (the exact query only).
bool scaled(RawType t) {
  return integer(t) || t == RawType::FP8E4M3 || t == RawType::FP8E5M2;
}
// The middle of an asymmetric code range (uint8 0..255, int4 0..15).
int32_t centre(RawType t) {
  return t == RawType::UInt8 ? 128 : t == RawType::Int4 ? 8 : 0;
}
struct FusedScratch {
  ScratchBuffer<float> buf;
  ScratchBuffer<int32_t> corr;
  // KVC_QUERY_INT8_VALUES: the packed weights, their units and the run's value rows
  ScratchBuffer<int32_t> wq;
  ScratchBuffer<float> wu;
  ScratchBuffer<const uint8_t *> vrow;
  ScratchBuffer<uint8_t> packed;
  ScratchBuffer<float> qsum;
  ScratchBuffer<int32_t> toff;  // per-token code centres of asymmetric parts
  ScratchBuffer<float> chan;    // per-channel scales as f32 rows
  ScratchBuffer<float> qrot;    // rotated keys: the query rotated alike
  ScratchBuffer<float> vrot;    // rotated values: a run's sums before the rotation back
};

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

// The 8 scores of NT = 8 / J tokens x J heads (lane u J + j: token t + u,
// head j) to s[j ss + t + u]: each head's NT tokens as one store.
template <int J>
KVC_VNNI inline void store_scores(__m256 r, float *s, uint64_t ss, uint64_t t) {
  if constexpr (J == 1) {
    _mm256_storeu_ps(s + t, r);
  } else if constexpr (J == 2) {  // [u0 j0, u0 j1, u1 j0, ...] -> [j0: u0..u3 | j1: u0..u3]
    r = _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    _mm_storeu_ps(s + t, _mm256_castps256_ps128(r));
    _mm_storeu_ps(s + ss + t, _mm256_extractf128_ps(r, 1));
  } else if constexpr (J == 4) {  // -> [j0: u0 u1 | j1: u0 u1 | j2 ... | j3 ...]
    r = _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    const __m128 lo = _mm256_castps256_ps128(r), hi = _mm256_extractf128_ps(r, 1);
    _mm_storel_pi(reinterpret_cast<__m64 *>(s + t), lo);
    _mm_storeh_pi(reinterpret_cast<__m64 *>(s + ss + t), lo);
    _mm_storel_pi(reinterpret_cast<__m64 *>(s + 2 * ss + t), hi);
    _mm_storeh_pi(reinterpret_cast<__m64 *>(s + 3 * ss + t), hi);
  } else {
    alignas(32) float v[8];
    _mm256_store_ps(v, r);
    KVC_UNROLL
    for (int j = 0; j < J; ++j) s[j * ss + t] = v[j];
  }
}

// The 8 pairs of 32-bit lanes of v added: 512 -> 256 bits (256 bits: v).
KVC_VNNI inline __m256i fold(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}
KVC_VNNI inline __m256i fold(__m256i v) {
  return v;
}

// The driver of the int8-query score kernels below: s[j][t] = (sum_d
// q8[j][d] u[t][d] - corr[j]) x qs[j] for the J heads and c tokens (u: the
// unsigned key codes), NT = 8 / J tokens a step into 8 accumulators of type V
// (a[u J + j]: token t + u, head j; the last c % NT tokens one at a time into
// a[j]); step(a, t, N, d) adds dimensions d .. d + D - 1 of tokens t .. t + N
// - 1 (N an integral_constant), the sums are folded to 256 bits, reduced 8
// at a time and stored a head's tokens at once (store_scores).
template <int J, uint64_t D, typename V, typename Step>
KVC_VNNI inline void score_tokens(uint64_t c, uint64_t hd, const int32_t *corr, const float *qs,
                                  float *s, uint64_t ss, Step &&step) {
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
    V a[8];
    KVC_UNROLL
    for (int i = 0; i < 8; ++i) a[i] = V{};
    for (uint64_t d = 0; d < hd; d += D) step(a, t, std::integral_constant<int, NT>{}, d);
    __m256i f[8];
    KVC_UNROLL
    for (int i = 0; i < 8; ++i) f[i] = fold(a[i]);
    store_scores<J>(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(hsum8_epi32(f), vc)), vs), s,
                    ss, t);
  }
  for (; t < c; ++t) {
    V a[J];
    KVC_UNROLL
    for (int j = 0; j < J; ++j) a[j] = V{};
    for (uint64_t d = 0; d < hd; d += D) step(a, t, std::integral_constant<int, 1>{}, d);
    KVC_UNROLL
    for (int j = 0; j < J; ++j)
      s[j * ss + t] = static_cast<float>(hsum_epi32(fold(a[j])) - corr[j]) * qs[j];
  }
}

// int8 / uint8 / int4 keys (unpacked to dimension order), 32 dimensions a step.
template <RawType T, int J>
KVC_VNNI void scores_i8(const uint8_t *k0, uint64_t kts, uint64_t c, uint64_t hd, const int8_t *q8,
                        const int32_t *corr, const float *qs, float *s, uint64_t ss) {
  score_tokens<J, 32, __m256i>(
      c, hd, corr, qs, s, ss, [=](__m256i *a, uint64_t t, auto nt, uint64_t d) KVC_VNNI {
        constexpr int N = decltype(nt)::value;
        __m256i x[N];
        KVC_UNROLL
        for (int u = 0; u < N; ++u) x[u] = load32u<T>(k0 + (t + u) * kts, d);
        KVC_UNROLL
        for (int j = 0; j < J; ++j) {
          const __m256i qq = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q8 + j * hd + d));
          KVC_UNROLL
          for (int u = 0; u < N; ++u) a[u * J + j] = _mm256_dpbusd_epi32(a[u * J + j], x[u], qq);
        }
      });
}

// int4 keys against the query in int4-key order (qn: QueryI8::codes_nib,
// chunks of 64; hd % 64 == 0): each 32 key bytes (64 dimensions) give their
// low nibbles (the even dimensions) and high nibbles (the odd ones) by one
// mask and one shift, each multiplied with its half of the query's chunk: the
// same integer dot products as scores_i8 (integer sums are exact in any
// order), without the unpacking to dimension order.
template <int J>
KVC_VNNI void scores_i4n(const uint8_t *k0, uint64_t kts, uint64_t c, uint64_t hd, const int8_t *qn,
                         const int32_t *corr, const float *qs, float *s, uint64_t ss) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  score_tokens<J, 64, __m256i>(
      c, hd, corr, qs, s, ss, [=](__m256i *a, uint64_t t, auto nt, uint64_t d) KVC_VNNI {
        constexpr int N = decltype(nt)::value;
        __m256i lo[N], hi[N];
        KVC_UNROLL
        for (int u = 0; u < N; ++u) {
          const __m256i b =
              _mm256_loadu_si256(reinterpret_cast<const __m256i *>(k0 + (t + u) * kts + d / 2));
          lo[u] = _mm256_and_si256(b, m4);
          hi[u] = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
        }
        KVC_UNROLL
        for (int j = 0; j < J; ++j) {
          const __m256i qe = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qn + j * hd + d));
          const __m256i qo =
              _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qn + j * hd + d + 32));
          KVC_UNROLL
          for (int u = 0; u < N; ++u)
            a[u * J + j] =
                _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(a[u * J + j], lo[u], qe), hi[u], qo);
        }
      });
}

// int8 / uint8 keys with 512-bit vectors (hd % 64 == 0): 64 key codes a
// load, made unsigned as load32u makes them (the same integers).
template <RawType T, int J>
KVC_VNNI void scores_i8_512(const uint8_t *k0, uint64_t kts, uint64_t c, uint64_t hd,
                            const int8_t *q8, const int32_t *corr, const float *qs, float *s,
                            uint64_t ss) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(T == RawType::Int8 ? 0x80 : 0));
  score_tokens<J, 64, __m512i>(
      c, hd, corr, qs, s, ss, [=](__m512i *a, uint64_t t, auto nt, uint64_t d) KVC_VNNI {
        constexpr int N = decltype(nt)::value;
        __m512i x[N];
        KVC_UNROLL
        for (int u = 0; u < N; ++u)
          x[u] = _mm512_xor_si512(_mm512_loadu_si512(k0 + (t + u) * kts + d), flip);
        KVC_UNROLL
        for (int j = 0; j < J; ++j) {
          const __m512i qq = _mm512_loadu_si512(q8 + j * hd + d);
          KVC_UNROLL
          for (int u = 0; u < N; ++u) a[u * J + j] = _mm512_dpbusd_epi32(a[u * J + j], x[u], qq);
        }
      });
}

// 16 rows of 16 32-bit words -> r[k] = word k of rows 0..15 (in lane u: row
// u), in registers: interleaves of 32 and 64 bits, then a 4 x 4 transpose
// of 128-bit lanes.
__attribute__((always_inline)) KVC_VNNI inline void transpose16x16(__m512i *r) {
  __m512i t[16], u[16];
  KVC_UNROLL
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4 g + m], lane L: word 4 L + m of rows 4 g .. 4 g + 3
  KVC_UNROLL
  for (int g = 0; g < 4; ++g) {
    u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  KVC_UNROLL
  for (int m = 0; m < 4; ++m) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[m], u[4 + m], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i v1 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i v2 = _mm512_shuffle_i32x4(u[m], u[4 + m], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], _MM_SHUFFLE(3, 2, 3, 2));
    r[m] = _mm512_shuffle_i32x4(v0, v1, _MM_SHUFFLE(2, 0, 2, 0));
    r[4 + m] = _mm512_shuffle_i32x4(v0, v1, _MM_SHUFFLE(3, 1, 3, 1));
    r[8 + m] = _mm512_shuffle_i32x4(v2, v3, _MM_SHUFFLE(2, 0, 2, 0));
    r[12 + m] = _mm512_shuffle_i32x4(v2, v3, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// scores_i4n for the query split per 128 dimensions (hd % 128 == 0) with
// the tokens across the lanes of 512-bit vectors: 16 tokens'
// rows of one 128-dimension chunk (16 words of 8 nibbles each) transposed
// in registers, so word k of the 16 tokens meets the query's even and odd
// codes of dimensions 8 k .. 8 k + 7 broadcast (4 each), and each head's 16
// scores end in one vector: no horizontal sums. The same integer dot
// products as scores_i8.
template <int J>
KVC_VNNI void scores_i4v(const uint8_t *k0, uint64_t kts, uint64_t c, uint64_t hd, const int8_t *qn,
                         const int32_t *corr, const float *qs, float *s, uint64_t ss) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  for (uint64_t t = 0; t < c; t += 16) {
    const uint64_t n = std::min<uint64_t>(16, c - t);
    __m512i a[J];
    KVC_UNROLL
    for (int j = 0; j < J; ++j) a[j] = _mm512_setzero_si512();
    for (uint64_t d = 0; d < hd; d += 128) {
      __m512i r[16];
      KVC_UNROLL
      for (int u = 0; u < 16; ++u)
        r[u] = static_cast<uint64_t>(u) < n ? _mm512_loadu_si512(k0 + (t + u) * kts + d / 2)
                                            : _mm512_setzero_si512();
      transpose16x16(r);
      KVC_UNROLL
      for (int w = 0; w < 16; ++w) {
        const __m512i lo = _mm512_and_si512(r[w], m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(r[w], 4), m4);
        KVC_UNROLL
        for (int j = 0; j < J; ++j) {
          int32_t qe, qo;  // the even and odd codes of dimensions d + 8 w .. d + 8 w + 7
          std::memcpy(&qe, qn + j * hd + d + 4 * w, 4);
          std::memcpy(&qo, qn + j * hd + d + 64 + 4 * w, 4);
          a[j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a[j], lo, _mm512_set1_epi32(qe)), hi,
                                     _mm512_set1_epi32(qo));
        }
      }
    }
    const __mmask16 keep = static_cast<__mmask16>((1u << n) - 1);
    KVC_UNROLL
    for (int j = 0; j < J; ++j)
      _mm512_mask_storeu_ps(
          s + j * ss + t, keep,
          _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a[j], _mm512_set1_epi32(corr[j]))),
                        _mm512_set1_ps(qs[j])));
  }
}

template <int J>
using ScoresI8Fn = void (*)(const uint8_t *, uint64_t, uint64_t, uint64_t, const int8_t *,
                            const int32_t *, const float *, float *, uint64_t);
template <int J>
ScoresI8Fn<J> scores_i8_fn(RawType t, uint64_t hd) {
  switch (t) {
    case RawType::Int8:
      return hd % 64 == 0 ? scores_i8_512<RawType::Int8, J> : scores_i8<RawType::Int8, J>;
    case RawType::UInt8:
      return hd % 64 == 0 ? scores_i8_512<RawType::UInt8, J> : scores_i8<RawType::UInt8, J>;
    default:
      return scores_i8<RawType::Int4, J>;
  }
}

// --- int8 values (KVC_QUERY_INT8_VALUES): the weighted sum in integers ----
// A running sum's update ls x corr + sum with the product rounded on its own
// (never a fused multiply-add, whatever the compiler would contract): every
// softmax of this file updates its sums this way, so KVC_QUERY_INT8_VALUES
// keeps KVC_QUERY_INT8's log-sum-exp bit for bit.
inline float rescale_add(float ls, float corr, float sum) {
  float p = ls * corr;
  asm volatile("" : "+x"(p));
  return p + sum;
}
// e^x for x <= 0, 16 lanes: exp8's operations (fused_kernels.inc) lane by
// lane, so the same values.
KVC_VNNI inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f);
  const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), lo);
  __m512 fx = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f));
  fx = _mm512_roundscale_ps(fx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 y = _mm512_set1_ps(1.9875691500E-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
  y = _mm512_fmadd_ps(y, z, _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  const __m512i e =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~under), y, _mm512_castsi512_ps(e));
}

// The int8 query's runs (KVC_QUERY_INT8 over integer keys, and
// KVC_QUERY_INT8_VALUES): the online softmax's update of the nj query heads
// of one KV head over a run of c tokens, with the weights packed for the
// integer weighted sum where wq is not null, in 512-bit registers (the f32
// path's clamp_max and exp_sum, the same operations lane by lane and the
// same order of the sums, and the packing, in one call per KV head):
//   s [nj][c]: the scores of the codes, made x = s x ks + kz x qsum[j] (ks
//     null: float keys, x = s; kz null: symmetric keys), clamped to
//     +-FLT_MAX (NaN: -FLT_MAX) and copied to obs + j x obs_stride (obs not
//     null); then, where vs is null (float values), the probabilities
//     e^(x - m_new) in place;
//   m, ls [nj]: the running maxima and sums, corr [nj] = e^(m - m_new);
//   pv [nj][c] = e^(x - m_new) x vs[t] where vs is not null (integer values
//     with symmetric scales; what the f32 sum reads);
//   wq [nj][wqs], u [nj] (wq null: nothing packed; needs vs): head j's weights pv[j][t] (finite;
//   negative where a
//     full-range codec stored a negative scale) as integers of at most 15
//     bits and a sign packed two tokens to a 32-bit word, wq[j][i] =
//     w'[2i] & 0xffff | w'[2i + 1] << 16 (an odd count's last pair: 0 for its
//     second token), w' = round(pv / u[j]) (to nearest even), u[j] =
//     max_t |pv[j][t]| / 32767 (0 when every weight is 0: the head adds
//     nothing).
// Returns false, packing nothing more, when a head's largest weight is above
// 0 but below 2^-100 (32767 / max would overflow f32 near 1e-35, and u would
// lose its precision): the caller sums that KV head's run in f32 from pv.
// The softmax state and pv are complete either way.
KVC_VNNI bool softmax_pack(float *s, uint64_t c, uint64_t nj, const float *ks, const float *kz,
                           const float *qsum, const float *vs, float *m, float *ls, float *corr,
                           float *pv, int32_t *wq, uint64_t wqs, float *u, float *obs,
                           uint64_t obs_stride) {
  constexpr float kMax = std::numeric_limits<float>::max();
  const __m512 hi = _mm512_set1_ps(kMax), lo = _mm512_set1_ps(-kMax);
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  auto mask = [c](uint64_t t) -> __mmask16 {
    return c - t >= 16 ? 0xffff : static_cast<__mmask16>((1u << (c - t)) - 1);
  };
  bool packed = true;
  for (uint64_t j0 = 0; j0 < nj; j0 += 16) {
    const uint64_t jn = std::min<uint64_t>(16, nj - j0);
    alignas(64) float mo[16], mn[16];
    // The scores of the codes, clamped, and each head's maximum.
    for (uint64_t j = j0; j < j0 + jn; ++j) {
      float *x = s + j * c;
      const __m512 vq = _mm512_set1_ps(kz ? qsum[j] : 0.0f);
      __m512 vmax = ninf;
      for (uint64_t t = 0; t < c; t += 16) {
        const __mmask16 k = mask(t);
        __m512 v = _mm512_maskz_loadu_ps(k, x + t);
        if (ks) {
          v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(k, ks + t));
          if (kz) v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, kz + t), vq, v);
        }
        v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), lo);
        v = _mm512_max_ps(_mm512_min_ps(v, hi), lo);
        _mm512_mask_storeu_ps(x + t, k, v);
        if (obs) _mm512_mask_storeu_ps(obs + j * obs_stride + t, k, v);
        vmax = _mm512_mask_max_ps(vmax, k, vmax, v);
      }
      mo[j - j0] = m[j];
      mn[j - j0] = std::max(m[j], _mm512_reduce_max_ps(vmax));
    }
    // e^(m - m_new) for the heads at once (0 while nothing came: m = -inf)
    const __mmask16 kj = static_cast<__mmask16>((1u << jn) - 1);
    const __m512 e =
        exp16(_mm512_maskz_sub_ps(kj, _mm512_maskz_load_ps(kj, mo), _mm512_maskz_load_ps(kj, mn)));
    _mm512_mask_storeu_ps(corr + j0, kj, e);
    _mm512_mask_storeu_ps(m + j0, kj, _mm512_maskz_load_ps(kj, mn));
    // The probabilities times the value scales, their sum and their largest
    // magnitude per head.
    alignas(64) float wm[16];
    for (uint64_t j = j0; j < j0 + jn; ++j) {
      float *x = s + j * c;
      float *w = vs ? pv + j * c : nullptr;
      const __m512 vm = _mm512_set1_ps(mn[j - j0]);
      // (summed in exp_sum's order, 8 lanes token by token then
      // ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)): the log-sum-exp of
      // KVC_QUERY_INT8, whose softmax this is)
      __m256 sum = _mm256_setzero_ps();
      __m512 wmax = _mm512_setzero_ps();
      for (uint64_t t = 0; t < c; t += 16) {
        const __mmask16 k = mask(t);
        const __m512 p =
            _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + t), vm)));
        sum = _mm256_add_ps(sum, _mm512_castps512_ps256(p));
        sum = _mm256_add_ps(sum, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1)));
        if (!vs) {
          _mm512_mask_storeu_ps(x + t, k, p);
          continue;
        }
        const __m512 pw = _mm512_mul_ps(p, _mm512_maskz_loadu_ps(k, vs + t));
        _mm512_mask_storeu_ps(w + t, k, pw);
        wmax = _mm512_max_ps(wmax, _mm512_abs_ps(pw));
      }
      __m128 h = _mm_hadd_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
      h = _mm_hadd_ps(h, h);
      ls[j] = rescale_add(ls[j], corr[j], _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h))));
      wm[j - j0] = _mm512_reduce_max_ps(wmax);
    }
    if (!wq || !packed) continue;
    // The units u = max / 32767 and their inverses, the heads at once.
    const __m512 vw = _mm512_maskz_load_ps(kj, wm), k32767 = _mm512_set1_ps(32767.0f);
    const __mmask16 pos = _mm512_cmp_ps_mask(vw, _mm512_setzero_ps(), _CMP_GT_OQ);
    if (_mm512_mask_cmp_ps_mask(pos, vw, _mm512_set1_ps(0x1p-100f), _CMP_LT_OQ)) {
      packed = false;
      continue;
    }
    _mm512_mask_storeu_ps(u + j0, kj, _mm512_div_ps(vw, k32767));
    alignas(64) float inv[16];
    _mm512_store_ps(inv, _mm512_maskz_div_ps(pos, k32767, vw));
    // The 15-bit weights.
    const __m512i top = _mm512_set1_epi32(32767), bottom = _mm512_set1_epi32(-32767);
    for (uint64_t j = j0; j < j0 + jn; ++j) {
      const float *w = pv + j * c;
      const __m512 vi = _mm512_set1_ps(inv[j - j0]);
      int32_t *o = wq + j * wqs;
      for (uint64_t t = 0; t < c; t += 16) {
        const uint64_t r = std::min<uint64_t>(16, c - t);
        const __m512 x = _mm512_maskz_loadu_ps(mask(t), w + t);
        const __m512i q = _mm512_max_epi32(
            _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x, vi)), top), bottom);
        const __m256i h = _mm512_cvtepi32_epi16(q);
        _mm256_mask_storeu_epi32(o + t / 2, static_cast<__mmask8>((1u << ((r + 1) / 2)) - 1), h);
      }
    }
  }
  return packed;
}

// acc[j][d] += u[j] x sum_t w'[j][t] x code[t][d] for the J heads (rows hd
// apart) over c tokens of symmetric int8 value codes (vrow[t]: token t's
// row of this KV head), 8 DV columns a step: the codes of two tokens
// interleaved as int16 pairs, one vpdpwssd per 8 columns and head; the
// 32-bit sums go to acc every 128 pairs (|sum| < 2^31: 256 x 32767 x 128).
template <int J>
KVC_VNNI void accumulate_v16_cols(float *acc, uint64_t hd, const int32_t *wq, uint64_t wqs,
                                  const float *u, const uint8_t *const *vrow, uint64_t c,
                                  uint64_t d) {
  const uint64_t pairs = (c + 1) / 2;
  for (uint64_t p0 = 0; p0 < pairs; p0 += 128) {
    const uint64_t p1 = std::min(pairs, p0 + 128);
    // 32 columns: x[0] columns 0-7, x[1] 16-23, x[2] 8-15, x[3] 24-31 (the
    // in-lane byte unpacks of two 32-byte rows, each half widened)
    __m256i a[J][4];
    KVC_UNROLL
    for (int j = 0; j < J; ++j) KVC_UNROLL
    for (int v = 0; v < 4; ++v) a[j][v] = _mm256_setzero_si256();
    for (uint64_t i = p0; i < p1; ++i) {
      const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(vrow[2 * i] + d));
      const __m256i r1 = _mm256_loadu_si256(
          reinterpret_cast<const __m256i *>(vrow[std::min(2 * i + 1, c - 1)] + d));
      const __m256i lo = _mm256_unpacklo_epi8(r0, r1), hi = _mm256_unpackhi_epi8(r0, r1);
      __m256i x[4];
      x[0] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(lo));
      x[1] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(lo, 1));
      x[2] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(hi));
      x[3] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(hi, 1));
      KVC_UNROLL
      for (int j = 0; j < J; ++j) {
        const __m256i w = _mm256_set1_epi32(wq[j * wqs + i]);
        KVC_UNROLL
        for (int v = 0; v < 4; ++v) a[j][v] = _mm256_dpwssd_epi32(a[j][v], x[v], w);
      }
    }
    constexpr int col[4] = {0, 16, 8, 24};
    KVC_UNROLL
    for (int j = 0; j < J; ++j) {
      const __m256 uj = _mm256_set1_ps(u[j]);
      KVC_UNROLL
      for (int v = 0; v < 4; ++v) {
        float *o = acc + j * hd + d + col[v];
        _mm256_storeu_ps(o, _mm256_fmadd_ps(uj, _mm256_cvtepi32_ps(a[j][v]), _mm256_loadu_ps(o)));
      }
    }
  }
}
// a[4 j + k] += x_k times head j's packed weight pair (vpdpwssd: two tokens'
// int16 columns against their two 16-bit weights), J heads, weights w[j wqs].
template <int J>
KVC_VNNI inline void add_pair4(__m512i *a, __m512i x0, __m512i x1, __m512i x2, __m512i x3,
                               const int32_t *w, uint64_t wqs) {
  KVC_UNROLL
  for (int j = 0; j < J; ++j) {
    const __m512i wj = _mm512_set1_epi32(w[j * wqs]);
    a[4 * j] = _mm512_dpwssd_epi32(a[4 * j], x0, wj);
    a[4 * j + 1] = _mm512_dpwssd_epi32(a[4 * j + 1], x1, wj);
    a[4 * j + 2] = _mm512_dpwssd_epi32(a[4 * j + 2], x2, wj);
    a[4 * j + 3] = _mm512_dpwssd_epi32(a[4 * j + 3], x3, wj);
  }
}

// The same 64 columns a step in 512-bit registers (hd % 64 == 0): x[0]
// holds columns 0-7 and 16-23, x[1] 32-39 and 48-55, x[2] 8-15 and 24-31,
// x[3] 40-47 and 56-63 (the in-lane byte unpacks of two 64-byte rows, each
// 256-bit half widened); the same integer sums, so the same floats.
template <int J>
KVC_VNNI void accumulate_v16_cols64(float *acc, uint64_t hd, const int32_t *wq, uint64_t wqs,
                                    const float *u, const uint8_t *const *vrow, uint64_t c,
                                    uint64_t d) {
  const uint64_t pairs = (c + 1) / 2;
  for (uint64_t p0 = 0; p0 < pairs; p0 += 128) {
    const uint64_t p1 = std::min(pairs, p0 + 128);
    __m512i a[4 * J];  // a[4 j + v]: head j, x[v]'s columns
    KVC_UNROLL
    for (int k = 0; k < 4 * J; ++k) a[k] = _mm512_setzero_si512();
    const uint64_t full = std::min(p1, c / 2);
    auto step = [&](const uint8_t *row0, const uint8_t *row1, uint64_t i) KVC_VNNI {
      const __m512i r0 = _mm512_loadu_si512(row0 + d), r1 = _mm512_loadu_si512(row1 + d);
      const __m512i lo = _mm512_unpacklo_epi8(r0, r1), hi = _mm512_unpackhi_epi8(r0, r1);
      const __m512i x0 = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(lo));
      const __m512i x1 = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(lo, 1));
      const __m512i x2 = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(hi));
      const __m512i x3 = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(hi, 1));
      add_pair4<J>(a, x0, x1, x2, x3, wq + i, wqs);
    };
    for (uint64_t i = p0; i < full; ++i) step(vrow[2 * i], vrow[2 * i + 1], i);
    if (full < p1) step(vrow[c - 1], vrow[c - 1], full);
    constexpr int col[4] = {0, 32, 8, 40};  // lanes 0-7; lanes 8-15 are 16 further
    KVC_UNROLL
    for (int j = 0; j < J; ++j) {
      const __m256 uj = _mm256_set1_ps(u[j]);
      KVC_UNROLL
      for (int v = 0; v < 4; ++v) {
        const __m512 f = _mm512_cvtepi32_ps(a[4 * j + v]);
        float *o = acc + j * hd + d + col[v];
        _mm256_storeu_ps(o, _mm256_fmadd_ps(uj, _mm512_castps512_ps256(f), _mm256_loadu_ps(o)));
        _mm256_storeu_ps(
            o + 16,
            _mm256_fmadd_ps(uj, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)),
                            _mm256_loadu_ps(o + 16)));
      }
    }
  }
}
// The same for symmetric int4 value codes (element d of token t's row
// vrow[t] in bits 4(d%2).. of byte d/2, value = (nibble - off) x scale), 32
// columns a step: the 16-bit words of two tokens' rows (four columns each)
// interleaved as 32-bit lanes, column 4i + k of both tokens masked out of
// lane i as two int16 (less off: -8..7), one vpdpwssd per 8 columns and
// head; lane i of accumulator k is column 4i + k (transposed to column
// order when the sums go to acc, every 2048 pairs: |sum| <= 2 x 8 x 32767
// x 2048 < 2^30).
template <int J>
KVC_VNNI void accumulate_v4_cols(float *acc, uint64_t hd, const int32_t *wq, uint64_t wqs,
                                 const float *u, int32_t off, const uint8_t *const *vrow,
                                 uint64_t c, uint64_t d) {
  const uint64_t pairs = (c + 1) / 2;
  const __m256i nib = _mm256_set1_epi16(0xf);
  const __m256i o16 = _mm256_set1_epi16(static_cast<int16_t>(off));
  for (uint64_t p0 = 0; p0 < pairs; p0 += 2048) {
    const uint64_t p1 = std::min(pairs, p0 + 2048);
    __m256i a[J][4];
    KVC_UNROLL
    for (int j = 0; j < J; ++j) KVC_UNROLL
    for (int k = 0; k < 4; ++k) a[j][k] = _mm256_setzero_si256();
    for (uint64_t i = p0; i < p1; ++i) {
      const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(vrow[2 * i] + d / 2));
      const __m128i r1 = _mm_loadu_si128(
          reinterpret_cast<const __m128i *>(vrow[std::min(2 * i + 1, c - 1)] + d / 2));
      const __m256i z = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi16(r0, r1)),
                                                _mm_unpackhi_epi16(r0, r1), 1);
      __m256i x[4];
      x[0] = _mm256_sub_epi16(_mm256_and_si256(z, nib), o16);
      x[1] = _mm256_sub_epi16(_mm256_and_si256(_mm256_srli_epi16(z, 4), nib), o16);
      x[2] = _mm256_sub_epi16(_mm256_and_si256(_mm256_srli_epi16(z, 8), nib), o16);
      x[3] = _mm256_sub_epi16(_mm256_srli_epi16(z, 12), o16);
      KVC_UNROLL
      for (int j = 0; j < J; ++j) {
        const __m256i w = _mm256_set1_epi32(wq[j * wqs + i]);
        KVC_UNROLL
        for (int k = 0; k < 4; ++k) a[j][k] = _mm256_dpwssd_epi32(a[j][k], x[k], w);
      }
    }
    KVC_UNROLL
    for (int j = 0; j < J; ++j) {
      // [k][i] (column 4i + k) to column order: 4 x 8 transposed in registers
      const __m256i t0 = _mm256_unpacklo_epi32(a[j][0], a[j][1]);
      const __m256i t1 = _mm256_unpacklo_epi32(a[j][2], a[j][3]);
      const __m256i t2 = _mm256_unpackhi_epi32(a[j][0], a[j][1]);
      const __m256i t3 = _mm256_unpackhi_epi32(a[j][2], a[j][3]);
      const __m256i s0 = _mm256_unpacklo_epi64(t0, t1), s1 = _mm256_unpackhi_epi64(t0, t1);
      const __m256i s2 = _mm256_unpacklo_epi64(t2, t3), s3 = _mm256_unpackhi_epi64(t2, t3);
      const __m256i col[4] = {
          _mm256_permute2x128_si256(s0, s1, 0x20), _mm256_permute2x128_si256(s2, s3, 0x20),
          _mm256_permute2x128_si256(s0, s1, 0x31), _mm256_permute2x128_si256(s2, s3, 0x31)};
      const __m256 uj = _mm256_set1_ps(u[j]);
      KVC_UNROLL
      for (int v = 0; v < 4; ++v) {
        float *o = acc + j * hd + d + 8 * v;
        _mm256_storeu_ps(o, _mm256_fmadd_ps(uj, _mm256_cvtepi32_ps(col[v]), _mm256_loadu_ps(o)));
      }
    }
  }
}
// The same 64 columns a step in 512-bit registers (hd % 64 == 0): the two
// tokens' 32 bytes interleaved by 16-bit words (128-bit lane L of z holds
// words {0, 8, 4, 12}[L] .. + 3 of both rows), the nibbles masked out without
// the offset, and off x (the chunk's weight sum) taken from each column's
// sum when it goes to acc: the same integer sums as accumulate_v4_cols (the
// products wrap modulo 2^32 in vpdpwssd and the subtraction; the result
// fits), so the same floats.
template <int J>
KVC_VNNI void accumulate_v4_cols64(float *acc, uint64_t hd, const int32_t *wq, uint64_t wqs,
                                   const float *u, int32_t off, const uint8_t *const *vrow,
                                   uint64_t c, uint64_t d) {
  const uint64_t pairs = (c + 1) / 2;
  const __m512i nib = _mm512_set1_epi16(0xf);
  for (uint64_t p0 = 0; p0 < pairs; p0 += 2048) {
    const uint64_t p1 = std::min(pairs, p0 + 2048);
    // The chunk's weights summed per head (|sum| <= 2 x 32767 x 2048): the
    // int16 halves of the packed words added by vpmaddwd with ones.
    int32_t wsum[J];
    const __m512i ones = _mm512_set1_epi16(1);
    KVC_UNROLL
    for (int j = 0; j < J; ++j) {
      const int32_t *w = wq + j * wqs;
      __m512i t = _mm512_setzero_si512();
      uint64_t i = p0;
      for (; i + 16 <= p1; i += 16)
        t = _mm512_add_epi32(t, _mm512_madd_epi16(_mm512_loadu_si512(w + i), ones));
      if (i < p1)
        t = _mm512_add_epi32(
            t, _mm512_madd_epi16(
                   _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << (p1 - i)) - 1), w + i),
                   ones));
      wsum[j] = _mm512_reduce_add_epi32(t);
    }
    __m512i a[4 * J];  // a[4 j + k]: head j, nibble k of each 16-bit word
    KVC_UNROLL
    for (int k = 0; k < 4 * J; ++k) a[k] = _mm512_setzero_si512();
    // The pairs' rows (an odd count's last pair repeats its token, whose
    // weight's second half is 0).
    const uint64_t full = std::min(p1, c / 2);
    auto step = [&](const uint8_t *row0, const uint8_t *row1, uint64_t i) KVC_VNNI {
      const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(row0 + d / 2));
      const __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(row1 + d / 2));
      const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_unpacklo_epi16(r0, r1)),
                                           _mm256_unpackhi_epi16(r0, r1), 1);
      const __m512i x0 = _mm512_and_si512(z, nib);
      const __m512i x1 = _mm512_and_si512(_mm512_srli_epi16(z, 4), nib);
      const __m512i x2 = _mm512_and_si512(_mm512_srli_epi16(z, 8), nib);
      const __m512i x3 = _mm512_srli_epi16(z, 12);
      add_pair4<J>(a, x0, x1, x2, x3, wq + i, wqs);
    };
    for (uint64_t i = p0; i < full; ++i) step(vrow[2 * i], vrow[2 * i + 1], i);
    if (full < p1) step(vrow[c - 1], vrow[c - 1], full);
    KVC_UNROLL
    for (int j = 0; j < J; ++j) {
      // Within each 128-bit lane: [k][e] -> 16 columns in order; lane L then
      // holds the columns of words {0, 8, 4, 12}[L] (16-column groups 0, 2,
      // 1, 3), gathered into column order by two lane shuffles.
      const __m512i t0 = _mm512_unpacklo_epi32(a[4 * j + 0], a[4 * j + 1]);
      const __m512i t1 = _mm512_unpacklo_epi32(a[4 * j + 2], a[4 * j + 3]);
      const __m512i t2 = _mm512_unpackhi_epi32(a[4 * j + 0], a[4 * j + 1]);
      const __m512i t3 = _mm512_unpackhi_epi32(a[4 * j + 2], a[4 * j + 3]);
      const __m512i s0 = _mm512_unpacklo_epi64(t0, t1), s1 = _mm512_unpackhi_epi64(t0, t1);
      const __m512i s2 = _mm512_unpacklo_epi64(t2, t3), s3 = _mm512_unpackhi_epi64(t2, t3);
      const __m512i u01 = _mm512_shuffle_i32x4(s0, s1, _MM_SHUFFLE(1, 0, 1, 0));
      const __m512i u23 = _mm512_shuffle_i32x4(s2, s3, _MM_SHUFFLE(1, 0, 1, 0));
      const __m512i v01 = _mm512_shuffle_i32x4(s0, s1, _MM_SHUFFLE(3, 2, 3, 2));
      const __m512i v23 = _mm512_shuffle_i32x4(s2, s3, _MM_SHUFFLE(3, 2, 3, 2));
      const __m512i col[4] = {_mm512_shuffle_i32x4(u01, u23, _MM_SHUFFLE(2, 0, 2, 0)),   // lane 0
                              _mm512_shuffle_i32x4(v01, v23, _MM_SHUFFLE(2, 0, 2, 0)),   // lane 2
                              _mm512_shuffle_i32x4(u01, u23, _MM_SHUFFLE(3, 1, 3, 1)),   // lane 1
                              _mm512_shuffle_i32x4(v01, v23, _MM_SHUFFLE(3, 1, 3, 1))};  // lane 3
      const __m512i bias = _mm512_set1_epi32(static_cast<int32_t>(
          static_cast<uint32_t>(off) * static_cast<uint32_t>(wsum[j])));  // (mod 2^32)
      const __m512 uj = _mm512_set1_ps(u[j]);
      KVC_UNROLL
      for (int v = 0; v < 4; ++v) {
        float *o = acc + j * hd + d + 16 * v;
        _mm512_storeu_ps(o, _mm512_fmadd_ps(uj, _mm512_cvtepi32_ps(_mm512_sub_epi32(col[v], bias)),
                                            _mm512_loadu_ps(o)));
      }
    }
  }
}
// The weighted sum over all hd columns (hd a multiple of 32), after acc *=
// corr: symmetric int8 codes (Int4 false) or int4 nibbles less off, J heads,
// in register blocks of 4 heads from J = 8 (J x 4 accumulators and the rows
// in 32 registers).
template <int J, bool Int4>
KVC_VNNI void accumulate_vint(float *acc, const float *corr, uint64_t hd, const int32_t *wq,
                              uint64_t wqs, const float *u, int32_t off, const uint8_t *const *vrow,
                              uint64_t c) {
  KVC_UNROLL
  for (int j = 0; j < J; ++j) {
    const __m256 cj = _mm256_set1_ps(corr[j]);
    for (uint64_t d = 0; d < hd; d += 8)
      _mm256_storeu_ps(acc + j * hd + d, _mm256_mul_ps(_mm256_loadu_ps(acc + j * hd + d), cj));
  }
  constexpr int B = J >= 8 ? 4 : J;
  for (int j = 0; j < J; j += B)
    for (uint64_t d = 0; d < hd; d += 32) {
      if (Int4 && hd % 64 == 0) {
        accumulate_v4_cols64<B>(acc + j * hd, hd, wq + j * wqs, wqs, u + j, off, vrow, c, d);
        d += 32;
      } else if constexpr (Int4) {
        accumulate_v4_cols<B>(acc + j * hd, hd, wq + j * wqs, wqs, u + j, off, vrow, c, d);
      } else if (hd % 64 == 0) {
        accumulate_v16_cols64<B>(acc + j * hd, hd, wq + j * wqs, wqs, u + j, vrow, c, d);
        d += 32;
      } else {
        accumulate_v16_cols<B>(acc + j * hd, hd, wq + j * wqs, wqs, u + j, vrow, c, d);
      }
    }
}
template <int J>
using AccVFn = void (*)(float *, const float *, uint64_t, const int32_t *, uint64_t, const float *,
                        int32_t, const uint8_t *const *, uint64_t);
// The kernel of int8 (int4 false) or int4 value codes.
template <int J>
AccVFn<J> acc_vint_fn(bool int4) {
  return int4 ? accumulate_vint<J, true> : accumulate_vint<J, false>;
}

// The kernels for AVX2 + FMA + F16C (16 vector registers) and for AVX-512 F
// + VL (the ISA level 2): 32 registers (larger register blocks: 16
// accumulators per step instead of 8), and with KVC_FUSED_WIDE the scores
// two tokens per 512-bit register and the weighted sum 16 columns a
// register, each lane's operations those of the 256-bit kernels (so the same
// bytes): half the multiply-add instructions, which CPUs with full-width
// 512-bit units (the Intel Xeon of docs/eval.md's 2026-12-05 figures) run at
// the 256-bit rate.
namespace avx2 {
#define KVC_FUSED __attribute__((target("avx2,fma,f16c")))
#define KVC_FUSED_WIDE 0
constexpr int kAcc = 8;
#include "attention/fused_kernels.inc"
#include "attention/fused_run.inc"
#undef KVC_FUSED_WIDE
#undef KVC_FUSED
}  // namespace avx2
namespace avx512 {
#define KVC_FUSED __attribute__((target("avx2,fma,f16c,avx512f,avx512vl")))
#define KVC_FUSED_WIDE 1
constexpr int kAcc = 16;
#include "attention/fused_kernels.inc"
#include "attention/fused_run.inc"
#undef KVC_FUSED_WIDE
#undef KVC_FUSED
}  // namespace avx512

}  // namespace

void run(const Shape &sh, const RawTile *rt, const uint64_t *c, int n, const float *q, float *m,
         float *ls, float *acc, float *obs, uint64_t obs_stride, uint64_t t0, const RawTile *next,
         const uint64_t *next_c, int next_n, const QueryI8 *q8) {
  if (isa() >= 2)
    avx512::run_tiles(sh, rt, c, n, q, m, ls, acc, obs, obs_stride, t0, next, next_c, next_n, q8);
  else
    avx2::run_tiles(sh, rt, c, n, q, m, ls, acc, obs, obs_stride, t0, next, next_c, next_n, q8);
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
uint64_t split_query_nibbles(const int8_t *, uint64_t, uint64_t, int8_t *) {
  return 0;
}
void run(const Shape &, const RawTile *, const uint64_t *, int, const float *, float *, float *,
         float *, float *, uint64_t, uint64_t, const RawTile *, const uint64_t *, int,
         const QueryI8 *) {}

#endif

}  // namespace kvc::attention::fused
