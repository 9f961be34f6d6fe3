// codec_fp8*: the fp8 codecs (white-box, internal API): decoding then
// re-encoding every code is the identity; encoding rounds to the nearest code
// (ties to even) and saturates; the AVX2 path gives the scalar codes on every
// code, midpoint, tie, subnormal and value past the largest code, under
// FTZ | DAZ too; every code decodes to the table's bits.
#include "codec_test_util.h"

static uint8_t ref_fp8(float x, const float *table, int max_code) {
  // Nearest finite code by value; ties to the even code; beyond max: saturate.
  int best = 0;
  double bd = INFINITY;
  for (int c = 0; c <= max_code; ++c) {
    const double v = table[c];
    const double dd = std::fabs(std::fabs(static_cast<double>(x)) - v);
    if (dd < bd || (dd == bd && (c & 1) == 0)) {
      bd = dd;
      best = c;
    }
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

static void test_fp8() {
  const float *t4 = fp8_e4m3_table(), *t5 = fp8_e5m2_table();
  CHECK(t4[0x7e] == 448.0f);
  CHECK(std::isnan(t4[0x7f]));
  CHECK(t4[0x01] == std::ldexp(1.0f, -9));
  CHECK(t5[0x7b] == 57344.0f);
  CHECK(std::isinf(t5[0x7c]));
  CHECK(t5[0x01] == std::ldexp(1.0f, -16));
  for (int c = 0; c < 256; ++c) {
    if (!std::isnan(t4[c]))
      CHECK(fp8_e4m3_encode(t4[c]) == c || (t4[c] == 0.0f && (c & 0x7f) == 0));
    if (std::isfinite(t5[c]))
      CHECK(fp8_e5m2_encode(t5[c]) == c || (t5[c] == 0.0f && (c & 0x7f) == 0));
  }
  // Saturation, never NaN or Inf.
  CHECK(fp8_e4m3_encode(500.0f) == 0x7e);
  CHECK(fp8_e4m3_encode(-1000.0f) == 0xfe);
  CHECK(fp8_e4m3_encode(INFINITY) == 0x7e);
  CHECK(fp8_e5m2_encode(1e9f) == 0x7b);
  // Random values against the nearest-code reference; midpoints included.
  std::uniform_real_distribution<float> ue(-12.0f, 9.5f);
  for (int i = 0; i < 40000; ++i) {
    float x = std::ldexp(1.0f + std::uniform_real_distribution<float>(0, 1)(rng),
                         static_cast<int>(ue(rng)));
    if (i & 1) x = -x;
    if (i % 7 == 0) {  // an exact midpoint between two e4m3 codes
      const int c = static_cast<int>(rng() % 0x7e);
      x = 0.5f * (t4[c] + t4[c + 1]);
    }
    CHECK(fp8_e4m3_encode(x) == ref_fp8(x, t4, 0x7e));
    if (std::fabs(x) < 1e5f) CHECK(fp8_e5m2_encode(x) == ref_fp8(x, t5, 0x7b));
  }
  // Relative error of normal values within half an ulp: 2^-4 (e4m3), 2^-3 (e5m2).
  for (float x : gaussian(20000, 30.0f)) {
    const float a = std::fabs(x);
    if (a >= std::ldexp(1.0f, -6) && a <= 448.0f) {
      const float y = t4[fp8_e4m3_encode(x)];
      CHECK(std::fabs(y - x) <= std::ldexp(1.0f, -4) * a * (1 + 1e-6f));
    }
    if (a >= std::ldexp(1.0f, -14)) {
      const float y = t5[fp8_e5m2_encode(x)];
      CHECK(std::fabs(y - x) <= std::ldexp(1.0f, -3) * a * (1 + 1e-6f));
    }
  }
  // Through the quantizer with a static scale of 1: 500 -> 448, -1000 -> -448.
  Spec s;
  s.dtype = DType::FP8_E4M3;
  s.gran = Gran::Tensor;
  s.static_scale = 1.0;
  std::vector<float> x = {500.0f, -1000.0f, 3.0f, 0.0f};
  Quantized q = roundtrip(s, x, 1, 4);
  CHECK(q.out[0] == 448.0f);
  CHECK(q.out[1] == -448.0f);
  CHECK(q.out[2] == 3.0f);
  CHECK(q.out[3] == 0.0f);
  // Dynamic per-token fp8: every normal value within half an ulp (relative).
  s.static_scale = 0.0;
  s.gran = Gran::Token;
  for (DType dt : {DType::FP8_E4M3, DType::FP8_E5M2}) {
    s.dtype = dt;
    std::vector<float> y = gaussian(16 * 128, 3.0f);
    Quantized r = roundtrip(s, y, 16, 128);
    const float rel = dt == DType::FP8_E4M3 ? std::ldexp(1.0f, -4) : std::ldexp(1.0f, -3);
    for (uint64_t t = 0; t < 16; ++t) {
      const float sc = load_scale(r.scales.data() + t * 4, DType::F32);
      for (uint64_t c = 0; c < 128; ++c) {
        const float v = y[t * 128 + c], o = r.out[t * 128 + c];
        const float smallest_normal =
            (dt == DType::FP8_E4M3 ? std::ldexp(1.0f, -6) : std::ldexp(1.0f, -14)) * sc;
        if (std::fabs(v) >= smallest_normal)
          CHECK(std::fabs(o - v) <= rel * std::fabs(v) * 1.0001f);
      }
    }
  }
}

// fp8 through the AVX2 path and the scalar path on the values where the
// encoding is delicate: every code's value, every midpoint between codes,
// f32 subnormals, values beyond the largest finite code, random exponents.
static void test_fp8_simd_edges() {
  for (DType dt : {DType::FP8_E4M3, DType::FP8_E5M2}) {
    const float *t = dt == DType::FP8_E4M3 ? fp8_e4m3_table() : fp8_e5m2_table();
    std::vector<float> x;
    for (int c = 0; c < 256; ++c) {
      if (!std::isfinite(t[c])) continue;
      x.push_back(t[c]);
      if (c < 255 && std::isfinite(t[c + 1]) && (c & 0x7f) != 0x7f)
        x.push_back(0.5f * (t[c] + t[c + 1]));
    }
    for (float v : {1e-45f, -1e-40f, 1.1754942e-38f, 3e-39f, 1e30f, -3e38f, 449.0f, 464.0f, 465.0f,
                    57344.0f, 61440.0f, 61441.0f, -0.0f})
      x.push_back(v);
    std::uniform_int_distribution<int> ex(-30, 20);
    std::uniform_real_distribution<float> m(1.0f, 2.0f);
    while (x.size() % 32 != 0 || x.size() < 2048)
      x.push_back(std::ldexp(m(rng), ex(rng)) * ((x.size() & 1) ? -1.0f : 1.0f));
    Spec s;
    s.dtype = dt;
    s.gran = Gran::Tensor;
    s.static_scale = 1.0;
    set_force_scalar(true);
    Quantized a = roundtrip(s, x, x.size() / 32, 32);
    set_force_scalar(false);
    Quantized b = roundtrip(s, x, x.size() / 32, 32);
    CHECK(a.codes == b.codes);
#if defined(__x86_64__)
    // A host that runs with flush-to-zero and denormals-are-zero (fast-math
    // builds, torch.set_flush_denormal): the same codes (the fp8 subnormals
    // among them are normal f32 values here).
    {
      const unsigned csr = _mm_getcsr();
      _mm_setcsr(csr | 0x8040);  // FTZ | DAZ
      Quantized c = roundtrip(s, x, x.size() / 32, 32);
      _mm_setcsr(csr);
      CHECK(c.codes == a.codes);
    }
#endif
    CHECK(std::memcmp(a.out.data(), b.out.data(), a.out.size() * 4) == 0);
    // The same with only normal values in range, both signs (the fast step's
    // 32 values at a time): every normal code's value and every midpoint
    // between two normal codes (ties: to the even code), then random ones.
    {
      std::vector<float> y;
      const int min_normal = dt == DType::FP8_E4M3 ? 0x08 : 0x04;
      const int max_code = dt == DType::FP8_E4M3 ? 0x7e : 0x7b;
      for (int c = min_normal; c <= max_code; ++c) {
        const float sg = (c & 1) ? -1.0f : 1.0f;
        y.push_back(sg * t[c]);
        if (c < max_code) {
          y.push_back(sg * 0.5f * (t[c] + t[c + 1]));
          y.push_back(-sg * std::nextafter(0.5f * (t[c] + t[c + 1]), 0.0f));
          y.push_back(sg * std::nextafter(0.5f * (t[c] + t[c + 1]), 1e30f));
        }
      }
      std::uniform_real_distribution<float> mag(t[min_normal], t[max_code]);
      while (y.size() % 32 != 0 || y.size() < 4096)
        y.push_back(mag(rng) * ((y.size() & 2) ? -1.0f : 1.0f));
      set_force_scalar(true);
      Quantized ya = roundtrip(s, y, y.size() / 32, 32);
      set_force_scalar(false);
      Quantized yb = roundtrip(s, y, y.size() / 32, 32);
      CHECK(ya.codes == yb.codes);
      for (size_t i = 0; i < y.size(); ++i)
        if (yb.codes[i] != (dt == DType::FP8_E4M3 ? fp8_e4m3_encode(y[i]) : fp8_e5m2_encode(y[i]))) {
          std::fprintf(stderr, "fp8 %d normal: x=%a simd %02x\n", int(dt), y[i], yb.codes[i]);
          CHECK(false);
          break;
        }
    }
    for (size_t i = 0; i < x.size(); ++i) {
      const uint8_t expect = dt == DType::FP8_E4M3 ? fp8_e4m3_encode(x[i]) : fp8_e5m2_encode(x[i]);
      if (b.codes[i] != expect) {
        std::fprintf(stderr, "fp8 %d: x=%g simd %02x scalar %02x\n", int(dt), x[i], b.codes[i],
                     expect);
        CHECK(false);
        break;
      }
    }
  }
}

// Every one of the 256 fp8 codes (NaN and Inf codes included, which only a
// caller can supply) decodes to the table's bits on the AVX2 path.
static void test_fp8_decode_all_codes() {
  for (DType dt : {DType::FP8_E4M3, DType::FP8_E5M2}) {
    Spec s;
    s.dtype = dt;
    s.gran = Gran::Tensor;
    s.static_scale = 0.75;
    std::vector<uint8_t> codes(256 * 3);
    for (size_t i = 0; i < codes.size(); ++i)
      codes[i] = static_cast<uint8_t>(i < 256 ? i : (i * 37) & 0x7e);
    const uint8_t scale[4] = {0x00, 0x00, 0x40, 0x3f};  // 0.75f little-endian
    std::vector<float> a(codes.size()), b(codes.size());
    set_force_scalar(true);
    dequantize(s, codes.data(), scale, nullptr, codes.size() / 32, 32, a.data(), kvc::DType::F32);
    set_force_scalar(false);
    dequantize(s, codes.data(), scale, nullptr, codes.size() / 32, 32, b.data(), kvc::DType::F32);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    // To f16 as well (the direct path converts each code through f16's fields).
    std::vector<uint16_t> ha(codes.size()), hb(codes.size());
    set_force_scalar(true);
    dequantize(s, codes.data(), scale, nullptr, codes.size() / 32, 32, ha.data(), kvc::DType::F16);
    set_force_scalar(false);
    dequantize(s, codes.data(), scale, nullptr, codes.size() / 32, 32, hb.data(), kvc::DType::F16);
    CHECK(ha == hb);
    const float *t = dt == DType::FP8_E4M3 ? fp8_e4m3_table() : fp8_e5m2_table();
    for (int c = 0; c < 256; ++c) {
      const float want = t[c] * 0.75f;
      if (std::memcmp(&want, &b[c], 4) != 0) {
        std::fprintf(stderr, "fp8 %d code %02x: %g, table %g\n", int(dt), c, b[c], want);
        CHECK(false);
        break;
      }
    }
  }
}

int main(int argc, char **argv) {
  const std::map<std::string, void (*)()> tests = {
      {"fp8", test_fp8},
      {"fp8_simd_edges", test_fp8_simd_edges},
      {"fp8_decode_all_codes", test_fp8_decode_all_codes},
  };
  return run_named_tests(argc, argv, tests);
}
