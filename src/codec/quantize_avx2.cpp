// quantize()'s AVX2 paths (x86-64): the fused path (convert, rotate, min / max
// per group into an L1 buffer, then the run kernels) and the one-pass path
// for f16 rows with dynamic per-token or per-group scales. Codes, scales and
// zero points are the scalar reference's, bit for bit.
#include "codec/kernels.h"

#ifdef KVC_CODEC_X86
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "codec/codec.h"
#include "codec/fp8_avx2.h"
#include "codec/hadamard_avx2.h"
#include "codec/kernels_avx2.h"
#include "codec/params_avx2.h"
#include "common/scratch.h"

namespace kvc::codec {

namespace {

// Horizontal min and max of 8 lanes (exact in any order).
__attribute__((target("avx2"), always_inline)) inline void hminmax(__m256 a, __m256 b, float *lo,
                                                                   float *hi) {
  __m128 l = _mm_min_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
  l = _mm_min_ps(l, _mm_movehl_ps(l, l));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  l = _mm_min_ss(l, _mm_shuffle_ps(l, l, 1));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  *lo = _mm_cvtss_f32(l);
  *hi = _mm_cvtss_f32(h);
}

// Codes of `rows` f32 rows x [rows][d] in groups of g values (g a multiple
// of 32), int8 or int4, Params per group (ps[r * (d / g) + gi], or ps[0] for
// every group when !per_group): encode_int_run_avx2's vector step, inline.
template <bool Asym>
__attribute__((target("avx2,f16c"))) void encode_groups32(const IntFormat &f, const float *x,
                                                          uint64_t rows, uint64_t d, uint64_t g,
                                                          const Params *ps, bool per_group,
                                                          uint8_t *codes, uint64_t rb) {
  const __m256 lo = _mm256_set1_ps(f.lo), hi = _mm256_set1_ps(f.hi);
  const __m256i off8 = _mm256_set1_epi8(static_cast<char>(f.off));
  const bool wide = f.bits == 8 && Asym;
  const uint64_t ng = d / g;
  for (uint64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * d;
    uint8_t *out = codes + r * rb;
    for (uint64_t gi = 0; gi < ng; ++gi) {
      const Params &p = per_group ? ps[r * ng + gi] : ps[0];
      const __m256 inv = _mm256_set1_ps(p.inv), z = _mm256_set1_ps(p.zero);
      for (uint64_t j = gi * g; j < (gi + 1) * g; j += 32) {
        const __m256i c = codes32_avx2<Asym, false>(xr, j, inv, z, lo, hi, off8, wide);
        if (f.bits == 8) {
          _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + j), c);
        } else {  // low nibble first
          store_int4_32(c, out + j / 2);
        }
      }
    }
  }
}

// Values [b, b + 8 NV) of a row (f16 or f32) rotated into x (f32).
template <bool Half, int NV>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void rotate_row_block(
    const void *row, float *x, uint64_t b, __m256 norm) {
  __m256 r[NV];
#pragma GCC unroll 16
  for (int i = 0; i < NV; ++i) r[i] = load8<Half>(row, b + 8 * i);
  rotate_regs<NV>(r, norm);
#pragma GCC unroll 16
  for (int i = 0; i < NV; ++i) _mm256_storeu_ps(x + b + 8 * i, r[i]);
}

// The largest |x| bits of a's lanes, for eight vectors at once: r[i] = the
// largest lane of a[i] (non-negative int32 bit patterns order as the floats).
__attribute__((target("avx2"), always_inline)) inline __m256i hmax8_epi32(const __m256i *a) {
  __m256i t[4];
  for (int i = 0; i < 4; ++i)
    t[i] = _mm256_max_epi32(_mm256_unpacklo_epi32(a[2 * i], a[2 * i + 1]),
                            _mm256_unpackhi_epi32(a[2 * i], a[2 * i + 1]));
  const __m256i u0 =
      _mm256_max_epi32(_mm256_unpacklo_epi64(t[0], t[1]), _mm256_unpackhi_epi64(t[0], t[1]));
  const __m256i u1 =
      _mm256_max_epi32(_mm256_unpacklo_epi64(t[2], t[3]), _mm256_unpackhi_epi64(t[2], t[3]));
  return _mm256_max_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                          _mm256_permute2x128_si256(u0, u1, 0x31));
}

// lohi[2k], lohi[2k + 1] = -amax, amax of each group k of g values (g a
// multiple of 8) of a finite f32 row x: what symmetric codes' parameters
// need (make_params uses max(|lo|, |hi|) alone).
// The largest |x| bits of the g values from v (g a multiple of 8), in 8 lanes.
__attribute__((target("avx2"), always_inline)) inline __m256i absmax_lanes(const float *v,
                                                                           uint64_t g,
                                                                           __m256i mag) {
  __m256i a = _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(v)), mag);
  for (uint64_t j = 8; j < g; j += 8)
    a = _mm256_max_epi32(a, _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(v + j)), mag));
  return a;
}
// Returns false when a value is NaN or Inf (its |x| bits exceed every
// finite value's), having written every group's amax all the same.
__attribute__((target("avx2"))) bool group_absmax(const float *x, uint64_t ng, uint64_t g,
                                                  float *lohi) {
  const __m256i mag = _mm256_set1_epi32(0x7fffffff);
  alignas(32) float am[8];
  __m256i worst = _mm256_setzero_si256();
  uint64_t k0 = 0;
  for (; k0 + 8 <= ng; k0 += 8) {  // eight groups at a time, in registers
    __m256i a[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) a[i] = absmax_lanes(x + (k0 + i) * g, g, mag);
    const __m256i h = hmax8_epi32(a);
    worst = _mm256_max_epi32(worst, h);
    _mm256_store_si256(reinterpret_cast<__m256i *>(am), h);
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      lohi[2 * (k0 + i)] = -am[i];
      lohi[2 * (k0 + i) + 1] = am[i];
    }
  }
  for (; k0 < ng; ++k0) {
    __m256i a[8];
    a[0] = absmax_lanes(x + k0 * g, g, mag);
    for (int i = 1; i < 8; ++i) a[i] = a[0];
    const __m256i h = hmax8_epi32(a);
    worst = _mm256_max_epi32(worst, h);
    _mm256_store_si256(reinterpret_cast<__m256i *>(am), h);
    lohi[2 * k0] = -am[0];
    lohi[2 * k0 + 1] = am[0];
  }
  return _mm256_testz_si256(_mm256_cmpgt_epi32(worst, _mm256_set1_epi32(0x7f7fffff)),
                            _mm256_set1_epi32(-1));
}

template <int kMant, int kBias, uint32_t kMaxCode, bool Half = true>
__attribute__((target("avx2,f16c"))) void encode_fp8_groups(const void *xv, uint64_t m, uint64_t g,
                                                            const float *iv, uint8_t *out);

// Every integer and fp8 codec with per-token, per-group or static
// per-tensor scales, straight from f16 or f32 input, a chunk of rows at a
// time: one pass converts the rows into an L1 buffer while taking each
// group's min and max (after the rotation when there is one); then the
// parameters of all the chunk's groups (independent scalar work that the CPU
// overlaps); then the run kernels encode each group from the buffer. The same
// operations as the scalar reference, so the codes, scales and zero points
// are identical bit for bit.
constexpr uint64_t kChunkFloats = 2048;
// Pass 1 reads each input line once, from memory for large inputs: a
// software prefetch this many bytes ahead of its loads (one per 64 bytes
// read) keeps more misses in flight than the hardware prefetcher alone
// (docs/eval.md: 10-15 % on the f32 [4096][1024] cases of an Intel Xeon).
constexpr uint64_t kPrefetchBytes = 2048;

template <bool Half>
__attribute__((target("avx2,fma,f16c"))) void quantize_fast(const Spec &s, const void *src,
                                                            uint64_t n, uint64_t d, uint8_t *codes,
                                                            uint8_t *scales, uint8_t *zeros,
                                                            float *buf, bool *nonfinite) {
  const bool fixed = s.gran == Gran::Tensor;  // static scale (checked by the caller)
  const uint64_t g = s.gran == Gran::Group ? s.group : d, ng = d / g;
  const uint64_t esz = Half ? 2 : 4, rb = row_bytes(s.dtype, d), sb = scale_bytes(s);
  const uint64_t chunk = std::max<uint64_t>(1, kChunkFloats / d);
  const bool integer = is_int(s.dtype), rotate = s.rotation_block != 0;
  // Symmetric codes (make_params uses max(|lo|, |hi|) alone).
  const bool sym = !(integer && (s.asym || s.full_range));
  const IntFormat f = int_format(s.dtype, s.asym, s.full_range);
  const Params fixed_p = fixed ? make_params(s, 0.0f, 0.0f) : Params{};
  // hadamard()'s normalization, the same float.
  const __m256 vnorm =
      _mm256_set1_ps(rotate ? 1.0f / std::sqrt(static_cast<float>(s.rotation_block)) : 1.0f);
  if (fixed) {
    store_scale(scales, s.scale_dtype, fixed_p.scale);
    if (s.asym && zeros) store_scale(zeros, s.scale_dtype, fixed_p.zero);
  }
  Params *ps = reinterpret_cast<Params *>(buf + chunk * d);  // chunk * ng of them
  float *lohi = buf + chunk * d + chunk * ng * (sizeof(Params) / sizeof(float));
  // f32 rows that need no rotation are encoded from the input itself (still
  // in L1 from pass 1); the others from their converted copy in buf.
  const bool stage = Half || rotate || fixed;
  for (uint64_t r0 = 0; r0 < n; r0 += chunk) {
    const uint64_t rows = std::min(chunk, n - r0);
    const float *rows_f32 = stage ? buf : static_cast<const float *>(src) + r0 * d;
    // Pass 1: convert (and rotate), min and max per group.
    for (uint64_t r = 0; r < rows; ++r) {
      const uint8_t *row = static_cast<const uint8_t *>(src) + (r0 + r) * d * esz;
      float *x = buf + r * d;
      if (rotate && (!nonfinite || Half) && hadamard_in_registers(s.rotation_block)) {
        // Converted and rotated a block at a time in registers (the input was
        // checked finite, and rotatable, by the caller; or it is f16, which
        // no rotation overflows, and is checked here: every output of a
        // block sums every input of it, so a NaN or Inf among the inputs
        // leaves the whole block NaN or infinite).
        if (use_avx512() && !sym && !fixed && g % 16 == 0) {
          // 16 lanes, 32 registers (quantize_avx512.cpp: the same bits), each
          // group's min and max taken from the registers (the check too;
          // symmetric groups' largest magnitude measured no faster so:
          // group_absmax below)
          if (!rotate_row_minmax_avx512(row, Half, x, d, s.rotation_block, _mm256_cvtss_f32(vnorm),
                                        g, lohi + 2 * r * ng) &&
              nonfinite) {
            *nonfinite = true;
            return;
          }
          continue;
        }
        if (use_avx512())  // 16 lanes, 32 registers (quantize_avx512.cpp: the same bits)
          rotate_row_avx512(row, Half, x, d, s.rotation_block, _mm256_cvtss_f32(vnorm));
        else
          for (uint64_t b = 0; b < d; b += s.rotation_block) {
            if (s.rotation_block == 128)
              rotate_row_block<Half, 16>(row, x, b, vnorm);
            else
              rotate_row_block<Half, 8>(row, x, b, vnorm);
          }
        if (sym && !fixed) {  // each group's largest magnitude, eight groups at a time
          if (!group_absmax(x, ng, g, lohi + 2 * r * ng) && nonfinite) {  // (the check too)
            *nonfinite = true;
            return;
          }
          continue;
        }
        if (nonfinite && !all_finite_avx2(x, d)) {
          *nonfinite = true;
          return;
        }
      } else if (rotate || fixed) {
        for (uint64_t j = 0; j < d; j += 8) _mm256_storeu_ps(x + j, load8<Half>(row, j));
        if (nonfinite && !all_finite_avx2(x, d)) {
          *nonfinite = true;
          return;
        }
        if (rotate) hadamard(x, d, s.rotation_block);
      }
      if (fixed) continue;
      if (sym && !rotate) {
        // Symmetric codes need only each group's largest magnitude: the
        // largest of the |x| bit patterns (ordered as integers, NaN and Inf
        // above every finite value, so it is the finiteness check too).
        const __m256i mag = _mm256_set1_epi32(0x7fffffff);
        __m256i worst = _mm256_setzero_si256();
        for (uint64_t gi = 0; gi < ng; ++gi) {
          const uint64_t j0 = gi * g, j1 = j0 + g;
          __m256i m0 = _mm256_setzero_si256(), m1 = m0;
          uint64_t j = j0;
          for (; j + 16 <= j1; j += 16) {
            _mm_prefetch(reinterpret_cast<const char *>(row) + j * esz + kPrefetchBytes,
                         _MM_HINT_T0);
            const __m256 a = load8<Half>(row, j), b = load8<Half>(row, j + 8);
            if (stage) {
              _mm256_storeu_ps(x + j, a);
              _mm256_storeu_ps(x + j + 8, b);
            }
            m0 = _mm256_max_epi32(m0, _mm256_and_si256(_mm256_castps_si256(a), mag));
            m1 = _mm256_max_epi32(m1, _mm256_and_si256(_mm256_castps_si256(b), mag));
          }
          if (j < j1) {
            const __m256 a = load8<Half>(row, j);
            if (stage) _mm256_storeu_ps(x + j, a);
            m0 = _mm256_max_epi32(m0, _mm256_and_si256(_mm256_castps_si256(a), mag));
          }
          m0 = _mm256_max_epi32(m0, m1);
          worst = _mm256_max_epi32(worst, m0);
          __m128i h = _mm_max_epi32(_mm256_castsi256_si128(m0), _mm256_extracti128_si256(m0, 1));
          h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0x4e));
          h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0xb1));
          float amax;
          const int bits = _mm_cvtsi128_si32(h);
          std::memcpy(&amax, &bits, 4);
          lohi[2 * (r * ng + gi)] = -amax;
          lohi[2 * (r * ng + gi) + 1] = amax;
        }
        if (nonfinite &&
            !_mm256_testz_si256(_mm256_cmpgt_epi32(worst, _mm256_set1_epi32(0x7f7fffff)),
                                _mm256_set1_epi32(-1))) {
          *nonfinite = true;
          return;
        }
        continue;
      }
      // NaN / Inf (exponent all ones) seen in this row, when checking.
      __m256i bad = _mm256_setzero_si256();
      const __m256i expo = _mm256_set1_epi32(0x7f800000);
      for (uint64_t gi = 0; gi < ng; ++gi) {
        const uint64_t j0 = gi * g, j1 = j0 + g;
        __m256 lo0 = _mm256_set1_ps(std::numeric_limits<float>::infinity()), lo1 = lo0;
        __m256 hi0 = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), hi1 = hi0;
        uint64_t j = j0;
        for (; j + 16 <= j1; j += 16) {
          if (!rotate)
            _mm_prefetch(reinterpret_cast<const char *>(row) + j * esz + kPrefetchBytes,
                         _MM_HINT_T0);
          const __m256 a = rotate ? _mm256_loadu_ps(x + j) : load8<Half>(row, j);
          const __m256 b = rotate ? _mm256_loadu_ps(x + j + 8) : load8<Half>(row, j + 8);
          if (!rotate) {
            if (stage) {
              _mm256_storeu_ps(x + j, a);
              _mm256_storeu_ps(x + j + 8, b);
            }
            bad = _mm256_or_si256(
                bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(a), expo), expo));
            bad = _mm256_or_si256(
                bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(b), expo), expo));
          }
          lo0 = _mm256_min_ps(lo0, a);
          hi0 = _mm256_max_ps(hi0, a);
          lo1 = _mm256_min_ps(lo1, b);
          hi1 = _mm256_max_ps(hi1, b);
        }
        if (j < j1) {
          const __m256 a = rotate ? _mm256_loadu_ps(x + j) : load8<Half>(row, j);
          if (!rotate) {
            if (stage) _mm256_storeu_ps(x + j, a);
            bad = _mm256_or_si256(
                bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(a), expo), expo));
          }
          lo0 = _mm256_min_ps(lo0, a);
          hi0 = _mm256_max_ps(hi0, a);
        }
        hminmax(_mm256_min_ps(lo0, lo1), _mm256_max_ps(hi0, hi1), &lohi[2 * (r * ng + gi)],
                &lohi[2 * (r * ng + gi) + 1]);
      }
      if (nonfinite && !_mm256_testz_si256(bad, bad)) {
        *nonfinite = true;
        return;
      }
    }
    // Parameters of every group of the chunk, and their scales and zeros.
    if (!fixed) {
      make_params_batch(s, lohi, rows * ng, ps);
      const uint64_t base = r0 * ng;
      if (s.scale_dtype == DType::F32) {
        for (uint64_t k = 0; k < rows * ng; ++k)
          std::memcpy(scales + (base + k) * 4, &ps[k].scale, 4);
      } else {
        for (uint64_t k = 0; k < rows * ng; ++k)
          store_scale(scales + (base + k) * sb, s.scale_dtype, ps[k].scale);
      }
      if (s.asym && zeros)
        for (uint64_t k = 0; k < rows * ng; ++k)
          store_scale(zeros + (base + k) * sb, s.scale_dtype, ps[k].zero);
    }
    // Pass 2: encode. fp8 groups of whole 32-value vectors: the groups
    // kernel (the inverse scales gathered where the extremes were); the
    // 512-bit one, on rows read from the input, prefetches the next chunk's
    // rows meanwhile (a chunk ahead: its pass 1 then finds them in the
    // caches; fp8's encoding is long enough to hide that read, 1.02x ->
    // 1.13-1.15x memcpy on [4096][1024] f32; int8 / int4 measured no faster).
    const uint64_t ahead = stage || r0 + rows >= n ? 0 : rows * d;
    if (!integer && g % 32 == 0) {
      float *iv = lohi;
      for (uint64_t k = 0; k < rows * ng; ++k) iv[k] = fixed ? fixed_p.inv : ps[k].inv;
      if (use_avx512())  // 512-bit vectors (quantize_avx512.cpp: the same codes)
        encode_fp8_groups_avx512(s.dtype == DType::FP8_E4M3, false, rows_f32, rows * ng, g, iv,
                                 codes + r0 * rb, ahead);
      else if (s.dtype == DType::FP8_E4M3)
        encode_fp8_groups<3, 7, 0x7eu, false>(rows_f32, rows * ng, g, iv, codes + r0 * rb);
      else
        encode_fp8_groups<2, 15, 0x7bu, false>(rows_f32, rows * ng, g, iv, codes + r0 * rb);
      continue;
    }
    // int8 / int4 groups of whole 32-value vectors: the run kernel's vector
    // step inline (the same operations), no call per group.
    if (integer && (f.bits == 8 || f.bits == 4) && g % 32 == 0) {
      if (use_avx512()) {  // 512-bit vectors (quantize_avx512.cpp: the same codes)
        encode_groups_f32_avx512(f.bits,
                                 s.asym         ? 1
                                 : s.full_range ? 2
                                                : 0,
                                 rows_f32, rows * ng, g, fixed ? &fixed_p : ps, fixed ? 0 : 1, f,
                                 codes + r0 * rb);
        continue;
      }
      if (s.asym)
        encode_groups32<true>(f, rows_f32, rows, d, g, fixed ? &fixed_p : ps, !fixed,
                              codes + r0 * rb, rb);
      else
        encode_groups32<false>(f, rows_f32, rows, d, g, fixed ? &fixed_p : ps, !fixed,
                               codes + r0 * rb, rb);
      continue;
    }
    for (uint64_t r = 0; r < rows; ++r) {
      uint8_t *out = codes + (r0 + r) * rb;
      if (f.bits < 8 && integer) std::memset(out, 0, rb);
      const float *x = rows_f32 + r * d;
      for (uint64_t gi = 0; gi < ng; ++gi) {
        const Params &p = fixed ? fixed_p : ps[r * ng + gi];
        const uint64_t j0 = gi * g, j1 = j0 + g;
        if (integer) {
          if (s.asym)
            encode_int_run_avx2<true>(f, x, j0, j1, p, out);
          else
            encode_int_run_avx2<false>(f, x, j0, j1, p, out);
        } else if (s.dtype == DType::FP8_E4M3) {
          encode_fp8_run_avx2<3, 7, 0x7eu>(x, j0, j1, p.inv, out);
        } else {
          encode_fp8_run_avx2<2, 15, 0x7bu>(x, j0, j1, p.inv, out);
        }
      }
    }
  }
}

// ---- f16 input, dynamic per-token / per-group scales, no rotation ---------
// The common case of a KV append (an engine's f16 K and V rows): two passes
// over the input and no float staging.
//
// Pass 1 reads every row once and takes each group's extremes on the f16
// bits themselves: for finite values, |x| orders as the integer h & 0x7fff,
// and x orders as the unsigned key h ^ (sign ? 0xffff : 0x8000). A key at or
// beyond Inf's marks a NaN or Inf, so this pass is also the finiteness check
// that must come before anything is written. Pass 2 turns each group's
// extremes into its parameters (make_params on the same floats the other
// paths see: f16 -> f32 is exact and monotonic, and -0 / +0 are normalized
// there) and encodes straight from the f16 row. Codes, scales and zero points
// are those of the scalar reference, bit for bit.

// Largest u16 of a vector of 16 (as the minimum of the complement).
__attribute__((target("avx2"), always_inline)) inline uint16_t hmax_epu16(__m256i v) {
  const __m128i m = _mm_max_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  return static_cast<uint16_t>(
      ~_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(m, _mm_set1_epi32(-1)))));
}
__attribute__((target("avx2"), always_inline)) inline uint16_t hmin_epu16(__m256i v) {
  const __m128i m = _mm_min_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  return static_cast<uint16_t>(_mm_cvtsi128_si32(_mm_minpos_epu16(m)));
}

// 16 f16 values from h (8 when only 8 remain: the upper half repeats them,
// which changes no extreme).
__attribute__((target("avx2"), always_inline)) inline __m256i load16h(const uint16_t *h,
                                                                      uint64_t left) {
  if (left >= 16) return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(h));
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h)));
}

// Pass 1. Signed: lo[k] / hi[k] = the ordered keys of group k's minimum and
// maximum; otherwise hi[k] = the largest |x| bits of group k. Returns false
// (having looked at every value) when any is NaN or Inf.
template <bool Signed>
__attribute__((target("avx2"))) bool f16_group_keys(const uint16_t *h, uint64_t groups, uint64_t g,
                                                    uint16_t *lo_keys, uint16_t *hi_keys) {
  const __m256i abs_mask = _mm256_set1_epi16(0x7fff),
                top = _mm256_set1_epi16(static_cast<short>(0x8000));
  [[maybe_unused]] __m256i bad =
      _mm256_setzero_si256();  // unsigned keys: max of |x| bits, >= 0x7c00 is NaN / Inf
  for (uint64_t k = 0; k < groups; ++k, h += g) {
    if constexpr (Signed) {
      // (NaN and Inf are caught on the keys: at or above Inf's, or at or
      // below -Inf's.)
      __m256i lo = _mm256_set1_epi16(-1), hi = _mm256_setzero_si256(), lo1 = lo, hi1 = hi;
      uint64_t j = 0;
      for (; j + 32 <= g; j += 32) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(h + j));
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(h + j + 16));
        const __m256i kv = _mm256_xor_si256(v, _mm256_or_si256(_mm256_srai_epi16(v, 15), top));
        const __m256i kw = _mm256_xor_si256(w, _mm256_or_si256(_mm256_srai_epi16(w, 15), top));
        lo = _mm256_min_epu16(lo, kv);
        hi = _mm256_max_epu16(hi, kv);
        lo1 = _mm256_min_epu16(lo1, kw);
        hi1 = _mm256_max_epu16(hi1, kw);
      }
      for (; j < g; j += 16) {
        const __m256i v = load16h(h + j, g - j);
        const __m256i key = _mm256_xor_si256(v, _mm256_or_si256(_mm256_srai_epi16(v, 15), top));
        lo = _mm256_min_epu16(lo, key);
        hi = _mm256_max_epu16(hi, key);
      }
      lo_keys[k] = hmin_epu16(_mm256_min_epu16(lo, lo1));
      hi_keys[k] = hmax_epu16(_mm256_max_epu16(hi, hi1));
    } else {
      __m256i m0 = _mm256_setzero_si256(), m1 = m0;
      uint64_t j = 0;
      for (; j + 32 <= g; j += 32) {
        m0 = _mm256_max_epu16(
            m0, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(h + j)),
                                 abs_mask));
        m1 = _mm256_max_epu16(
            m1, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(h + j + 16)),
                                 abs_mask));
      }
      for (; j < g; j += 16)
        m1 = _mm256_max_epu16(m1, _mm256_and_si256(load16h(h + j, g - j), abs_mask));
      const __m256i m = _mm256_max_epu16(m0, m1);
      bad = _mm256_max_epu16(bad, m);
      hi_keys[k] = hmax_epu16(m);
    }
  }
  if constexpr (Signed) {
    // Keys of +Inf and above (NaN) are >= 0xfc00; of -Inf and below, <= 0x03ff.
    const __m256i hi_bad = _mm256_set1_epi16(static_cast<short>(0xfc00 - 0x8000)),
                  lo_bad = _mm256_set1_epi16(0x03ff - 0x8000);
    const __m256i flip = _mm256_set1_epi16(static_cast<short>(0x8000));
    __m256i any = _mm256_setzero_si256();
    uint64_t k = 0;
    for (; k + 16 <= groups; k += 16) {  // signed compares on keys - 0x8000
      const __m256i a = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i *>(lo_keys + k)), flip);
      const __m256i b = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i *>(hi_keys + k)), flip);
      any = _mm256_or_si256(
          any,
          _mm256_or_si256(_mm256_cmpgt_epi16(_mm256_add_epi16(lo_bad, _mm256_set1_epi16(1)), a),
                          _mm256_cmpgt_epi16(b, _mm256_sub_epi16(hi_bad, _mm256_set1_epi16(1)))));
    }
    bool ok = _mm256_testz_si256(any, any);
    for (; k < groups; ++k) ok = ok && lo_keys[k] > 0x03ff && hi_keys[k] < 0xfc00;
    return ok;
  } else {
    return hmax_epu16(bad) < 0x7c00;
  }
}

// 4 ordered keys -> their f16 values as floats.
__attribute__((target("avx2,f16c"), always_inline)) inline __m128 f16_of_keys4(
    const uint16_t *keys) {
  const __m128i k = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(keys));
  const __m128i neg = _mm_srai_epi16(k, 15);  // key top bit set: a value >= +0
  const __m128i flip = _mm_or_si128(_mm_andnot_si128(neg, _mm_set1_epi32(-1)),
                                    _mm_set1_epi16(static_cast<short>(0x8000)));
  return _mm_cvtph_ps(_mm_xor_si128(k, flip));
}

// Codes of m integer groups of g values (g a multiple of 32) straight from
// f16, the run kernel's operations with the constants kept in registers
// across groups. No clamp for symmetric and asymmetric groups: each group's
// own scale (rounded up) and zero point (its minimum, exact for f16 input)
// keep y = (x - zero) / scale within [0, qmax] or [-qmax, qmax] up to a few
// ulps, which round to the same codes the clamp gives. Full-range groups
// clamp (values of the other sign may exceed 2^(b-1) - 1 steps).
// Stream: the codes go around the caches (non-temporal stores, for outputs
// far larger than the caches; out 16-byte aligned, g * Bits / 8 a multiple of
// 32).
template <int Bits, int Mode, bool Stream = false>
__attribute__((target("avx2,f16c"))) void encode_groups_f16(const uint16_t *x, uint64_t m,
                                                            uint64_t g, const float *iv,
                                                            const float *zp, const IntFormat &f,
                                                            uint8_t *out) {
  constexpr bool Asym = Mode == 1;
  const __m256 lo = _mm256_set1_ps(f.lo), hi = _mm256_set1_ps(f.hi);
  const __m256i off8 = _mm256_set1_epi8(static_cast<char>(f.off));
  for (uint64_t k = 0; k < m; ++k, x += g, out += g * Bits / 8) {
    const __m256 inv = _mm256_set1_ps(iv[k]),
                 z = Asym ? _mm256_set1_ps(zp[k]) : _mm256_setzero_ps();
    for (uint64_t j = 0; j < g; j += 32) {
      const __m256i c =
          codes32_avx2<Asym, true, Mode == 2>(x, j, inv, z, lo, hi, off8, Bits == 8 && Asym);
      if constexpr (Bits == 8) {
        if constexpr (Stream) {
          _mm_stream_si128(reinterpret_cast<__m128i *>(out + j), _mm256_castsi256_si128(c));
          _mm_stream_si128(reinterpret_cast<__m128i *>(out + j + 16),
                           _mm256_extracti128_si256(c, 1));
        } else {
          _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + j), c);
        }
      } else if constexpr (Bits == 4) {
        store_int4_32(c, out + j / 2);
      } else if constexpr (Bits == 3) {
        store_int3_32(c, out + j / 8 * 3);
      } else {
        const __m256i w16 = _mm256_maddubs_epi16(c, _mm256_set1_epi16(0x0401));
        const __m256i w32 = _mm256_madd_epi16(w16, _mm256_set1_epi32(0x00100001));
        const __m256i b8 =
            _mm256_packus_epi16(_mm256_packus_epi32(w32, w32), _mm256_setzero_si256());
        const __m256i lanes =
            _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
        _mm_storel_epi64(reinterpret_cast<__m128i *>(out + j / 4), _mm256_castsi256_si128(lanes));
      }
    }
  }
}

// fp8 codes of m groups of g values (g a multiple of 32) straight from f16
// (Half) or f32: the scalar encoder's rounding on magnitudes as integers
// (round half to even at the fp8 step on the bit pattern), the signs added
// after packing (the saturating packs keep each value's sign in the top bit
// of its byte): the scalar encoder's codes, bit for bit.
//
// The fast step computes every value's code less the smallest normal code,
// c' = ((|x| bits - smallest normal's bits) + half - 1 + odd) >> (23 - kMant),
// and packs it with signed saturation: a byte in [0, largest normal code -
// smallest normal code] is that code, and anything else (a value under the
// smallest normal, whose subtraction wraps, or past the largest finite
// value) lands outside that range, which one saturating add and a byte mask
// detect. Those 32 values (rare: fp8 subnormals are under 2^-6 of the range
// for e4m3, and only static or f16-capped scales reach past it) take the exact
// step: magnitudes clamped to the largest finite code's first, as the
// saturating encoder does, and the subnormals' own rounding.
template <int kMant, int kBias, uint32_t kMaxCode, bool Half>
__attribute__((target("avx2,f16c"))) void encode_fp8_groups(const void *xv, uint64_t m, uint64_t g,
                                                            const float *iv, uint8_t *out) {
  constexpr int kDrop = 23 - kMant, kEmin = 1 - kBias;
  constexpr uint32_t kMaxBits =
      ((kMaxCode >> kMant) + 127 - kBias) << 23 | (kMaxCode & ((1u << kMant) - 1)) << kDrop;
  constexpr int kMinNormalCode = 1 << kMant, kLim = static_cast<int>(kMaxCode) - kMinNormalCode;
  const __m256i vmax = _mm256_set1_epi32(static_cast<int>(kMaxBits));
  const uint8_t *x = static_cast<const uint8_t *>(xv);
  constexpr uint64_t esz = Half ? 2 : 4;
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff),
                rebias = _mm256_set1_epi32((127 - kBias) << 23);
  const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32((1 << (kDrop - 1)) - 1);
  const __m256i min_normal = _mm256_set1_epi32((127 + kEmin) << 23);
  // half - 1 - the smallest normal's bits (two's complement)
  const __m256i fast_add = _mm256_set1_epi32(static_cast<int>(
      static_cast<uint32_t>((1 << (kDrop - 1)) - 1) - static_cast<uint32_t>((127 + kEmin) << 23)));
  // bytes past kLim (as unsigned) get their top bit
  const __m256i lim_add = _mm256_set1_epi8(static_cast<char>(0x7f - kLim));
  const __m256i min_code = _mm256_set1_epi8(static_cast<char>(kMinNormalCode));
  const __m256 inv_step = _mm256_castsi256_ps(_mm256_set1_epi32((127 - kEmin + kMant) << 23));
  for (uint64_t k = 0; k < m; ++k, x += g * esz, out += g) {
    const __m256 vinv = _mm256_set1_ps(iv[k]);
    for (uint64_t j = 0; j < g; j += 32) {
      __m256i u[4], c[4];
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        u[t] = _mm256_castps_si256(_mm256_mul_ps(load8<Half>(x, j + 8 * t), vinv));
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u[t], kDrop), one);
        c[t] = _mm256_srli_epi32(
            _mm256_add_epi32(_mm256_add_epi32(_mm256_and_si256(u[t], abs_mask), fast_add), odd),
            kDrop);
      }
      __m256i codes =
          _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
      if (_mm256_movemask_epi8(_mm256_adds_epu8(codes, lim_add)) == 0) {
        codes = _mm256_add_epi8(codes, min_code);
      } else {  // the exact step
        __m256i a[4];
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
          a[t] = _mm256_min_epu32(_mm256_and_si256(u[t], abs_mask), vmax);
          const __m256i r = _mm256_sub_epi32(a[t], rebias);
          const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(r, kDrop), one);
          c[t] = _mm256_srli_epi32(_mm256_add_epi32(r, _mm256_add_epi32(odd, half)), kDrop);
          const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(a[t]), inv_step));
          c[t] = _mm256_blendv_epi8(c[t], q, _mm256_cmpgt_epi32(min_normal, a[t]));
        }
        codes =
            _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
      }
      const __m256i signs = _mm256_and_si256(
          _mm256_packs_epi16(_mm256_packs_epi32(u[0], u[1]), _mm256_packs_epi32(u[2], u[3])),
          _mm256_set1_epi8(static_cast<char>(0x80)));
      _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + j),
                          _mm256_permutevar8x32_epi32(_mm256_or_si256(codes, signs), order));
    }
  }
}

// m floats (f16 values already, so the conversion is exact) as little-endian
// f16 scales or zero points.
__attribute__((target("avx2,f16c"))) void store_f16_values(uint8_t *dst, const float *v,
                                                           uint64_t m) {
  uint64_t k = 0;
  for (; k + 8 <= m; k += 8)
    _mm_storeu_si128(
        reinterpret_cast<__m128i *>(dst + k * 2),
        _mm256_cvtps_ph(_mm256_loadu_ps(v + k), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; k < m; ++k) inl::store_scale(dst + k * 2, DType::F16, v[k]);
}

// Returns false, having written nothing, when the input holds a NaN or Inf.
// The keys of every group of src [n][d] into lo_keys / hi_keys (Signed
// only: lo), each padded with the key of +0 up to a multiple of 4 groups;
// false when a value is NaN or Inf.
template <bool Signed>
bool direct_keys(const Spec &s, const uint16_t *src, uint64_t n, uint64_t d, uint16_t *lo_keys,
                 uint16_t *hi_keys) {
  const uint64_t g = s.gran == Gran::Group ? s.group : d, groups = n * (d / g);
  for (uint64_t k = groups; k < (groups + 3) / 4 * 4; ++k)
    lo_keys[k] = hi_keys[k] = Signed ? 0x8000 : 0;  // +0
  // 512-bit vectors where the CPU has them (quantize_avx512.cpp: the same
  // keys, bit for bit) for groups of a multiple of 32 values.
  return use_avx512() && g % 32 == 0
             ? f16_group_keys_avx512(Signed, src, groups, g, lo_keys, hi_keys)
             : f16_group_keys<Signed>(src, groups, g, lo_keys, hi_keys);
}

template <int Mode>
__attribute__((target("avx2,fma,f16c"))) bool quantize_f16_direct(const Spec &s,
                                                                  const uint16_t *src, uint64_t n,
                                                                  uint64_t d, uint8_t *codes,
                                                                  uint8_t *scales, uint8_t *zeros,
                                                                  const F16Keys *given) {
  constexpr bool Signed = Mode != 0;
  const uint64_t g = s.gran == Gran::Group ? s.group : d, groups = n * (d / g);
  // Keys of every group (the whole input is checked before anything is
  // written; or the caller's, computed ahead as its check), then chunks of
  // groups: parameters, scales, codes. Every group of the flat input is g
  // consecutive values, its codes g * bits / 8 consecutive bytes and its
  // scale the next one (d is a multiple of g).
  constexpr uint64_t kChunk = 256;
  thread_local ScratchBuffer<uint16_t> keys_buf;
  thread_local std::vector<float> par_buf;  // fixed size: 3 x kChunk
  if (par_buf.size() < 3 * kChunk) par_buf.resize(3 * kChunk);
  const uint16_t *lo_keys, *hi_keys;
  if (given) {  // (read up to 3 past the last group: f16_keys_count's padding)
    lo_keys = given->lo;
    hi_keys = given->hi;
  } else {
    const uint64_t padded = (groups + 3) / 4 * 4;
    uint16_t *lo = keys_buf.get(2 * padded), *hi = lo + padded;
    if (!direct_keys<Signed>(s, src, n, d, lo, hi)) return false;
    lo_keys = lo;
    hi_keys = hi;
  }
  const bool wide = use_avx512() && g % 32 == 0;
  const bool integer = is_int(s.dtype), f16_scale = s.scale_dtype == DType::F16;
  const IntFormat f = int_format(s.dtype, s.asym, s.full_range);
  const uint64_t gb =
      g * (integer ? static_cast<uint64_t>(f.bits) : 8) / 8;  // code bytes per group
  const double q = Mode == 1         ? qmax_asym(s.dtype)
                   : Mode == 2       ? qmax_sym(s.dtype) + 1
                   : is_fp8(s.dtype) ? static_cast<double>(fp8_max(s.dtype))
                                     : qmax_sym(s.dtype);
  float *sc = par_buf.data(), *iv = sc + kChunk, *zp = iv + kChunk;
  // Outputs beyond a few MiB bypass the caches (the input is read twice and
  // should stay in them).
  const bool stream = integer && f.bits == 8 && g % 32 == 0 && groups * gb >= (uint64_t(4) << 20) &&
                      reinterpret_cast<uintptr_t>(codes) % (wide ? 64 : 16) == 0;
  for (uint64_t k0 = 0; k0 < groups; k0 += kChunk) {
    const uint64_t m = std::min(kChunk, groups - k0);
    uint64_t k = 0;
    if constexpr (Mode == 0 && !Signed)  // the symmetric parameters 8 groups at a time
      for (; k + 8 <= m; k += 8)
        params8_sym(
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(hi_keys + k0 + k))),
            static_cast<float>(q), f16_scale, sc + k, iv + k);
    for (; k < m; k += 4) {
      const uint64_t kk = k0 + k;
      const __m128 hi =
          Signed ? f16_of_keys4(hi_keys + kk)
                 : _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(hi_keys + kk)));
      const __m128 lo = Signed ? f16_of_keys4(lo_keys + kk) : _mm_sub_ps(_mm_setzero_ps(), hi);
      params4<Mode>(lo, hi, q, f16_scale, sc + k, iv + k, zp + k);
    }
    if (f16_scale) {  // (the values are f16 already: the conversion is exact; x86 is little-endian)
      store_f16_values(scales + k0 * 2, sc, m);
      if (Mode == 1 && zeros) store_f16_values(zeros + k0 * 2, zp, m);
    } else {
      std::memcpy(scales + k0 * 4, sc, m * 4);  // little-endian f32, as store_scale writes
      if (Mode == 1 && zeros) std::memcpy(zeros + k0 * 4, zp, m * 4);
    }
    if (g % 32 == 0) {
      const uint16_t *x = src + k0 * g;
      uint8_t *out = codes + k0 * gb;
      if (wide && integer && (f.bits == 8 || f.bits == 4)) {
        encode_groups_f16_avx512(f.bits, Mode, stream, x, m, g, iv, zp, f, out);
      } else if (!integer) {
        if (wide)
          encode_fp8_groups_avx512(s.dtype == DType::FP8_E4M3, true, x, m, g, iv, out);
        else if (s.dtype == DType::FP8_E4M3)
          encode_fp8_groups<3, 7, 0x7eu>(x, m, g, iv, out);
        else
          encode_fp8_groups<2, 15, 0x7bu>(x, m, g, iv, out);
      } else if (f.bits == 8) {
        if (stream)
          encode_groups_f16<8, Mode, true>(x, m, g, iv, zp, f, out);
        else
          encode_groups_f16<8, Mode>(x, m, g, iv, zp, f, out);
      } else if (f.bits == 4) {
        encode_groups_f16<4, Mode>(x, m, g, iv, zp, f, out);
      } else if (f.bits == 3) {
        encode_groups_f16<3, Mode>(x, m, g, iv, zp, f, out);
      } else {
        encode_groups_f16<2, Mode>(x, m, g, iv, zp, f, out);
      }
      continue;
    }
    if (integer && f.bits < 8) std::memset(codes + k0 * gb, 0, m * gb);  // scalar tails OR codes in
    for (uint64_t k = 0; k < m; ++k) {
      const uint16_t *x = src + (k0 + k) * g;
      uint8_t *out = codes + (k0 + k) * gb;
      Params p;
      p.scale = sc[k];
      p.inv = iv[k];
      p.zero = Mode == 1 ? zp[k] : 0.0f;
      if (integer)
        encode_int_run_avx2<Mode == 1, true, Mode != 0>(f, x, 0, g, p, out);
      else if (s.dtype == DType::FP8_E4M3)
        encode_fp8_run_avx2<3, 7, 0x7eu, true>(x, 0, g, p.inv, out);
      else
        encode_fp8_run_avx2<2, 15, 0x7bu, true>(x, 0, g, p.inv, out);
    }
  }
  if (stream) _mm_sfence();  // the streamed codes are visible before we return
  return true;
}
}  // namespace

// Floats of scratch quantize_fast needs for rows of d values.
uint64_t quantize_fast_scratch(const Spec &s, uint64_t d) {
  const uint64_t chunk = std::max<uint64_t>(1, kChunkFloats / d);
  const uint64_t ng = s.gran == Gran::Group ? d / s.group : 1;
  return chunk * d + chunk * ng * (sizeof(Params) / sizeof(float) + 2);
}

bool quantize_f16_direct_avx2(const Spec &s, const uint16_t *src, uint64_t n, uint64_t d,
                              uint8_t *codes, uint8_t *scales, uint8_t *zeros,
                              const F16Keys *keys) {
  return s.asym         ? quantize_f16_direct<1>(s, src, n, d, codes, scales, zeros, keys)
         : s.full_range ? quantize_f16_direct<2>(s, src, n, d, codes, scales, zeros, keys)
                        : quantize_f16_direct<0>(s, src, n, d, codes, scales, zeros, keys);
}

bool f16_keys_avx2(const Spec &s, const uint16_t *src, uint64_t n, uint64_t d, uint16_t *lo,
                   uint16_t *hi) {
  return s.asym || s.full_range ? direct_keys<true>(s, src, n, d, lo, hi)
                                : direct_keys<false>(s, src, n, d, lo, hi);
}

void quantize_fast_avx2(const Spec &s, const void *src, bool half, uint64_t n, uint64_t d,
                        uint8_t *codes, uint8_t *scales, uint8_t *zeros, float *buf,
                        bool *nonfinite) {
  if (half)
    quantize_fast<true>(s, src, n, d, codes, scales, zeros, buf, nonfinite);
  else
    quantize_fast<false>(s, src, n, d, codes, scales, zeros, buf, nonfinite);
}

}  // namespace kvc::codec
#endif
