#include "common/convert.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define KVC_X86 1
#endif

namespace kvc {

namespace {

template <typename Load, typename Store>
void convert_loop(const void *src, void *dst, size_t n, Load load, Store store) {
  for (size_t i = 0; i < n; ++i) store(dst, i, load(src, i));
}

float load_elem(const void *src, DType t, size_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float *>(src)[i];
    case DType::F16:
      return f16_to_f32_scalar(static_cast<const uint16_t *>(src)[i]);
    case DType::BF16:
      return bf16_to_f32_scalar(static_cast<const uint16_t *>(src)[i]);
    default:
      return 0.0f;  // convert() takes plain types only
  }
}

void store_elem(void *dst, DType t, size_t i, float v) {
  switch (t) {
    case DType::F32:
      static_cast<float *>(dst)[i] = v;
      break;
    case DType::F16:
      static_cast<uint16_t *>(dst)[i] = f32_to_f16_scalar(v);
      break;
    case DType::BF16:
      static_cast<uint16_t *>(dst)[i] = f32_to_bf16_scalar(v);
      break;
    default:
      break;  // convert() takes plain types only
  }
}

#ifdef KVC_X86
__attribute__((target("avx2,f16c"))) void f32_to_f16_avx2(const float *s, uint16_t *d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(s + i);
    __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i *>(d + i), h);
  }
  for (; i < n; ++i) d[i] = f32_to_f16_scalar(s[i]);
}
__attribute__((target("avx2,f16c"))) void f16_to_f32_avx2(const uint16_t *s, float *d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + i));
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) d[i] = f16_to_f32_scalar(s[i]);
}
__attribute__((target("avx2"))) void f32_to_bf16_avx2(const float *s, uint16_t *d, size_t n) {
  size_t i = 0;
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i qbit = _mm256_set1_epi32(0x400000);
  for (; i + 8 <= n; i += 8) {
    __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + i));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, bias), lsb);
    __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), inf);
    __m256i qn = _mm256_or_si256(u, qbit);
    r = _mm256_blendv_epi8(r, qn, isnan);
    r = _mm256_srli_epi32(r, 16);
    // pack 8 x u32 (values < 65536) into 8 x u16
    __m128i lo = _mm256_castsi256_si128(r);
    __m128i hi = _mm256_extracti128_si256(r, 1);
    _mm_storeu_si128(reinterpret_cast<__m128i *>(d + i), _mm_packus_epi32(lo, hi));
  }
  for (; i < n; ++i) d[i] = f32_to_bf16_scalar(s[i]);
}
__attribute__((target("avx2"))) void bf16_to_f32_avx2(const uint16_t *s, float *d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + i));
    __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(d + i), u);
  }
  for (; i < n; ++i) d[i] = bf16_to_f32_scalar(s[i]);
}

// AVX2 and F16C through CPUID, with the OS saving the YMM state (XGETBV).
bool detect_simd() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool f16c = c & (1u << 29), osxsave = c & (1u << 27), avx = c & (1u << 28);
  if (!f16c || !osxsave || !avx) return false;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0x6) != 0x6) return false;  // XMM and YMM state enabled
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return b & (1u << 5);  // AVX2
}
#endif

}  // namespace

bool convert_has_simd() {
#ifdef KVC_X86
  static const bool has = detect_simd();
  return has;
#else
  return false;
#endif
}

void convert_scalar(const void *src, DType st, void *dst, DType dt, size_t n) {
  if (st == dt) {
    if (src != dst && n) std::memcpy(dst, src, n * dtype_bytes(st));
    return;
  }
  for (size_t i = 0; i < n; ++i) store_elem(dst, dt, i, load_elem(src, st, i));
}

void convert(const void *src, DType st, void *dst, DType dt, size_t n) {
  if (st == dt) {
    if (src != dst && n) std::memcpy(dst, src, n * dtype_bytes(st));
    return;
  }
#ifdef KVC_X86
  if (convert_has_simd()) {
    if (st == DType::F32 && dt == DType::F16)
      return f32_to_f16_avx2(static_cast<const float *>(src), static_cast<uint16_t *>(dst), n);
    if (st == DType::F16 && dt == DType::F32)
      return f16_to_f32_avx2(static_cast<const uint16_t *>(src), static_cast<float *>(dst), n);
    if (st == DType::F32 && dt == DType::BF16)
      return f32_to_bf16_avx2(static_cast<const float *>(src), static_cast<uint16_t *>(dst), n);
    if (st == DType::BF16 && dt == DType::F32)
      return bf16_to_f32_avx2(static_cast<const uint16_t *>(src), static_cast<float *>(dst), n);
  }
#endif
  convert_scalar(src, st, dst, dt, n);
}

}  // namespace kvc
