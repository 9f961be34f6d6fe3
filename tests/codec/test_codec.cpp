// codec_*: every codec against its analytic bound (white-box, internal API).
// - integer codecs, unrotated: every element within half a quantization step
//   of its input (the step of its own group);
// - fp8: test_codec_fp8.cpp;
// - rotated codecs: the L2 error of each row equals the error in the rotated
//   space, which is within the codec's bound there.
#include "codec_test_util.h"

// Index of the scale that element (r, c) of an [n][d] array shares.
static uint64_t scale_index(const Spec &s, uint64_t r, uint64_t c, uint64_t d) {
  switch (s.gran) {
    case Gran::Token:
      return r;
    case Gran::Group:
      return r * ((d + s.group - 1) / s.group) + c / s.group;
    case Gran::Channel:
      return (r / s.group) * d + c;
    default:
      return 0;  // Tensor (None has no scales)
  }
}

// The scale (step) that element (r, c) was quantized with.
static float step_of(const Spec &s, const Quantized &q, uint64_t r, uint64_t c, uint64_t n,
                     uint64_t d) {
  (void)n;
  if (s.gran == Gran::None) return 0.0f;
  return load_scale(q.scales.data() + scale_index(s, r, c, d) * scale_bytes(s), s.scale_dtype);
}

static std::string describe(const Spec &s, uint64_t d) {
  char b[160];
  std::snprintf(b, sizeof b, "%s gran=%d G=%u %s scale=%s d=%llu", dtype_name(s.dtype),
                static_cast<int>(s.gran), s.group, s.asym ? "asym" : "sym",
                s.scale_dtype == DType::F16 ? "f16" : "f32", static_cast<unsigned long long>(d));
  return b;
}

static void test_int_bounds() {
  const uint64_t dims[] = {8, 64, 96, 128, 256};
  for (DType dt : {DType::INT8, DType::INT4, DType::INT3, DType::INT2})
    for (Gran g : {Gran::Tensor, Gran::Token, Gran::Group, Gran::Channel})
      for (bool asym : {false, true})
        for (DType sd : {DType::F32, DType::F16})
          for (uint64_t d : dims) {
            Spec s;
            s.dtype = dt;
            s.gran = g;
            s.asym = asym;
            s.scale_dtype = sd;
            s.group = g == Gran::Group ? 32 : g == Gran::Channel ? 16 : 0;
            const uint64_t n = 37;
            // Real-looking data: a few outlier channels, a shifted mean.
            std::vector<float> x = gaussian(n * d, 1.0f, asym ? 0.7f : 0.0f);
            for (uint64_t r = 0; r < n; ++r) x[r * d + (d / 3)] *= 12.0f;
            Quantized q = roundtrip(s, x, n, d);
            float worst = 0.0f;
            for (uint64_t r = 0; r < n; ++r)
              for (uint64_t c = 0; c < d; ++c) {
                const float step = step_of(s, q, r, c, n, d);
                const float err = std::fabs(q.out[r * d + c] - x[r * d + c]);
                // Half a step, plus float rounding of x * (1/step) and q * step.
                const float bound = 0.5f * step * (1.0f + 1e-5f) + 4e-7f * std::fabs(x[r * d + c]);
                if (err > bound) {
                  if (worst == 0.0f)
                    std::fprintf(stderr, "%s: r=%llu c=%llu x=%g out=%g step=%g\n",
                                 describe(s, d).c_str(), (unsigned long long)r,
                                 (unsigned long long)c, x[r * d + c], q.out[r * d + c], step);
                  worst = err;
                }
              }
            CHECK(worst == 0.0f);
          }
}

static void test_zero_rows_exact() {
  for (DType dt :
       {DType::INT8, DType::INT4, DType::INT3, DType::INT2, DType::FP8_E4M3, DType::FP8_E5M2})
    for (Gran g : {Gran::Tensor, Gran::Token, Gran::Group, Gran::Channel})
      for (bool asym : {false, true}) {
        if (asym && is_fp8(dt)) continue;
        Spec s;
        s.dtype = dt;
        s.gran = g;
        s.asym = asym;
        s.group = 4;
        const uint64_t n = 6, d = 24;
        std::vector<float> x = gaussian(n * d, 2.0f);
        for (uint64_t c = 0; c < d; ++c) x[2 * d + c] = 0.0f;  // an all-zero token
        if (g == Gran::Tensor) std::fill(x.begin(), x.end(), 0.0f);
        Quantized q = roundtrip(s, x, n, d);
        for (uint64_t c = 0; c < d; ++c) {
          // Per-channel groups mix the zero row with other rows: the
          // symmetric codes still give exactly 0 for 0; asymmetric ones
          // only when the whole group is zero.
          if (g == Gran::Channel && asym) continue;
          CHECK(q.out[2 * d + c] == 0.0f);
        }
        for (float v : q.out) CHECK(std::isfinite(v));
      }
}

static void test_static_scales() {
  for (DType dt : {DType::INT8, DType::FP8_E4M3, DType::FP8_E5M2, DType::INT4}) {
    Spec s;
    s.dtype = dt;
    s.gran = Gran::Tensor;
    for (double bad : {1e-50, 1e300, std::nan(""), -1.0, double(INFINITY)}) {
      s.static_scale = bad;
      expect_error([&] { validate(s, 8); }, kvc::Errc::InvalidScale);
    }
    s.static_scale = 0.5;
    validate(s, 8);
    std::vector<float> x = gaussian(64, 4.0f);
    for (auto &v : x) v = std::max(-3.5f, std::min(3.5f, v));  // inside int4's static range
    Quantized q = roundtrip(s, x, 8, 8);
    for (size_t i = 0; i < x.size(); ++i) {
      if (is_int(dt))
        CHECK(std::fabs(q.out[i] - x[i]) <= 0.25f * (1 + 1e-6f));
      else
        CHECK(std::fabs(q.out[i] - x[i]) <= std::fabs(x[i]) * 0.125f + 1e-3f);
    }
  }
}

// int4 at head_dim 96 with group scales: values all in [5, 6] come back
// within (6 - 5) / 15 / 2: the group range is over real values only, never
// pulled towards 0 by padding (a group of 64 leaves a partial group of 32).
static void test_int4_partial_group() {
  for (uint32_t g : {32u, 64u, 96u, 128u}) {
    Spec s;
    s.dtype = DType::INT4;
    s.gran = Gran::Group;
    s.group = g;
    s.asym = true;
    std::uniform_real_distribution<float> u(5.0f, 6.0f);
    std::vector<float> x(3 * 96);
    for (auto &v : x) v = u(rng);
    x[0] = 5.0f;
    x[1] = 6.0f;
    Quantized q = roundtrip(s, x, 3, 96);
    for (size_t i = 0; i < x.size(); ++i)
      CHECK(std::fabs(q.out[i] - x[i]) <= (6.0f - 5.0f) / 15.0f / 2.0f * 1.0001f);
  }
}

static void test_rotation_bound() {
  for (DType dt : {DType::INT4, DType::INT3, DType::INT2, DType::INT8})
    for (uint64_t d : {8ull, 64ull, 96ull, 128ull, 256ull}) {
      Spec s;
      s.dtype = dt;
      s.gran = Gran::Group;
      s.group = 32;
      s.asym = dt == DType::INT2;
      s.rotation_block = default_rotation_block(d);
      const uint64_t n = 20;
      std::vector<float> x = gaussian(n * d, 1.0f);
      for (uint64_t r = 0; r < n; ++r) x[r * d + 1] += 25.0f;  // an outlier channel
      Quantized q = roundtrip(s, x, n, d);
      // The rotated input and the bound of the unrotated codec applied to it.
      for (uint64_t r = 0; r < n; ++r) {
        std::vector<float> xr(x.begin() + r * d, x.begin() + (r + 1) * d);
        hadamard(xr.data(), d, s.rotation_block);
        double bound2 = 0.0, err2 = 0.0;
        for (uint64_t c = 0; c < d; ++c) {
          const float step = step_of(s, q, r, c, n, d);
          bound2 += 0.25 * step * step;
          const double e = q.out[r * d + c] - x[r * d + c];
          err2 += e * e;
        }
        CHECK(std::sqrt(err2) <= std::sqrt(bound2) * 1.001 + 1e-5);
      }
      // The transform is orthogonal and its own inverse.
      std::vector<float> y(x.begin(), x.begin() + d), z = y;
      hadamard(z.data(), d, s.rotation_block);
      double n1 = 0, n2 = 0;
      for (uint64_t c = 0; c < d; ++c) n1 += y[c] * y[c], n2 += z[c] * z[c];
      CHECK(std::fabs(n1 - n2) <= 1e-4 * n1);
      hadamard(z.data(), d, s.rotation_block);
      for (uint64_t c = 0; c < d; ++c)
        CHECK(std::fabs(z[c] - y[c]) <= 1e-4f * (1 + std::fabs(y[c])));
    }
}

static void test_nonfinite_rejected() {
  Spec s;
  s.dtype = DType::INT8;
  s.gran = Gran::Token;
  std::vector<float> x = gaussian(32, 1.0f);
  x[17] = std::nanf("");
  std::vector<uint8_t> codes(32, 0xaa), scales(4 * 4, 0xbb);
  expect_error(
      [&] { quantize(s, x.data(), kvc::DType::F32, 4, 8, codes.data(), scales.data(), nullptr); },
      kvc::Errc::NonFinite);
  for (uint8_t c : codes) CHECK(c == 0xaa);  // nothing written
  for (uint8_t c : scales) CHECK(c == 0xbb);
  x[17] = INFINITY;
  expect_error(
      [&] { quantize(s, x.data(), kvc::DType::F32, 4, 8, codes.data(), scales.data(), nullptr); },
      kvc::Errc::NonFinite);
  // The one-read fused path (rows checked as they convert, outputs staged):
  // a NaN or Inf in the last row of many chunks still leaves every output
  // byte as it was, for per-token, per-group (asymmetric) and static scales.
  for (int g = 0; g < 3; ++g)
    for (float bad : {std::nanf(""), -INFINITY}) {
      Spec t;
      t.dtype = g == 1 ? DType::INT4 : DType::INT8;
      t.gran = g == 0 ? Gran::Token : g == 1 ? Gran::Group : Gran::Tensor;
      t.group = 32;
      t.asym = g == 1;
      if (g == 2) t.static_scale = 0.5;
      const uint64_t n = 300, d = 64;
      std::vector<float> y = gaussian(n * d, 1.0f);
      y[(n - 1) * d + 40] = bad;
      std::vector<uint8_t> c(n * row_bytes(t.dtype, d), 0xaa), sc(num_scales(t, n, d) * 4, 0xbb),
          z(t.asym ? sc.size() : 0, 0xcc);
      expect_error(
          [&] { quantize(t, y.data(), kvc::DType::F32, n, d, c.data(), sc.data(), z.data()); },
          kvc::Errc::NonFinite);
      for (uint8_t v : c) CHECK(v == 0xaa);
      for (uint8_t v : sc) CHECK(v == 0xbb);
      for (uint8_t v : z) CHECK(v == 0xcc);
    }
  // Rotated f16 rows take the one-read path too (checked as they rotate: a
  // NaN or Inf makes its whole rotation block non-finite): a bad value in
  // the last row, or in the first, still leaves every output byte as it was,
  // for blocks rotated in registers (64, 128) and the others (32),
  // symmetric and asymmetric codes.
  for (uint32_t rot : {32u, 64u, 128u})
    for (int asym : {0, 1})
      for (uint16_t bad : {uint16_t(0x7c00), uint16_t(0xfe00), uint16_t(0xfc00)})
        for (bool first : {false, true}) {
          Spec t;
          t.dtype = DType::INT4;
          t.gran = Gran::Group;
          t.group = 32;
          t.asym = asym != 0;
          t.rotation_block = rot;
          const uint64_t n = 300, d = 128;
          std::vector<float> y = gaussian(n * d, 1.0f);
          std::vector<uint16_t> h(n * d);
          kvc::convert(y.data(), kvc::DType::F32, h.data(), kvc::DType::F16, h.size());
          h[first ? 3 : (n - 1) * d + 77] = bad;
          std::vector<uint8_t> c(n * row_bytes(t.dtype, d), 0xaa),
              sc(num_scales(t, n, d) * 4, 0xbb), z(t.asym ? sc.size() : 0, 0xcc);
          expect_error(
              [&] { quantize(t, h.data(), kvc::DType::F16, n, d, c.data(), sc.data(), z.data()); },
              kvc::Errc::NonFinite);
          bool untouched = true;
          for (uint8_t v : c) untouched = untouched && v == 0xaa;
          for (uint8_t v : sc) untouched = untouched && v == 0xbb;
          for (uint8_t v : z) untouched = untouched && v == 0xcc;
          CHECK(untouched);
        }
}

static void test_byte_layout() {
  // int4 symmetric: element 0 in the low nibble, stored as q + 8.
  Spec s;
  s.dtype = DType::INT4;
  s.gran = Gran::Token;
  std::vector<float> x = {7.0f, -7.0f, 0.0f, 1.0f};
  Quantized q = roundtrip(s, x, 1, 4);
  CHECK(q.codes[0] == (0x1 << 4 | 0xf));  // 7 -> 15 (low), -7 -> 1 (high)
  CHECK(q.codes[1] == (0x9 << 4 | 0x8));  // 0 -> 8, 1 -> 9
  CHECK(load_scale(q.scales.data(), DType::F32) == 1.0f);
  CHECK(q.scales[0] == 0x00 && q.scales[3] == 0x3f);  // 1.0f little-endian
  // int2 asymmetric: element j at bits 2j.
  s.dtype = DType::INT2;
  s.asym = true;
  x = {0.0f, 1.0f, 2.0f, 3.0f};
  q = roundtrip(s, x, 1, 4);
  CHECK(q.codes[0] == (3 << 6 | 2 << 4 | 1 << 2 | 0));
  CHECK(load_scale(q.zeros.data(), DType::F32) == 0.0f);
  CHECK(load_scale(q.scales.data(), DType::F32) == 1.0f);
  // int3 symmetric: element j at bits 3j.. of the row's little-endian bit
  // string, stored as q + 4 (absmax 3: scale 1).
  s.dtype = DType::INT3;
  s.asym = false;
  x = {3.0f, -3.0f, 0.0f, 1.0f, 2.0f, -1.0f, -2.0f, 3.0f};  // codes 7 1 4 5 6 3 2 7
  q = roundtrip(s, x, 1, 8);
  CHECK(q.codes.size() == 3);
  CHECK(q.codes[0] == 0x0f && q.codes[1] == 0xeb && q.codes[2] == 0xe9);
  CHECK(load_scale(q.scales.data(), DType::F32) == 1.0f);
  for (int j = 0; j < 8; ++j) CHECK(q.out[j] == x[j]);
  // int3 asymmetric over 16 values (two 3-byte units), codes 0..7 and back.
  s.asym = true;
  x.clear();
  for (int j = 0; j < 16; ++j) x.push_back(static_cast<float>((j * 5) % 8));
  q = roundtrip(s, x, 1, 16);
  CHECK(q.codes.size() == 6 && load_scale(q.scales.data(), DType::F32) == 1.0f);
  for (int j = 0; j < 16; ++j) {
    const uint64_t bit = 3 * static_cast<uint64_t>(j);
    const uint32_t w = q.codes[bit / 8] | (bit / 8 + 1 < 6 ? q.codes[bit / 8 + 1] << 8 : 0u);
    CHECK(((w >> (bit % 8)) & 7u) == static_cast<uint32_t>(x[j]));
    CHECK(q.out[j] == x[j]);
  }
  // int8 symmetric: two's complement.
  s.dtype = DType::INT8;
  s.asym = false;
  x = {-127.0f, 127.0f, -1.0f, 0.0f};
  q = roundtrip(s, x, 1, 4);
  CHECK(q.codes[0] == 0x81 && q.codes[1] == 0x7f && q.codes[2] == 0xff && q.codes[3] == 0);
  // Round half to even: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2 (scale 1 via 127 max).
  x = {127.0f, 0.5f, 1.5f, 2.5f};
  q = roundtrip(s, x, 1, 4);
  CHECK(q.codes[1] == 0 && q.codes[2] == 2 && q.codes[3] == 2);
}

// Full range (llama.cpp q4_0's rule): the group's value of largest magnitude
// m (the positive one on a tie) maps to code -2^(b-1), scale = -m / 2^(b-1)
// (its magnitude rounded up to the scale dtype); every element is within half
// a step except values of the other sign beyond (2^(b-1) - 1) steps, which
// clamp to within one step. Hand-computed int4 codes, zero groups and dynamic
// per-tensor scales too.
static void test_full_range() {
  for (DType dt : {DType::INT8, DType::INT4, DType::INT3, DType::INT2})
    for (Gran g : {Gran::Tensor, Gran::Token, Gran::Group, Gran::Channel})
      for (DType sd : {DType::F32, DType::F16})
        for (uint64_t d : {8ull, 64ull, 96ull, 128ull}) {
          Spec s;
          s.dtype = dt;
          s.gran = g;
          s.full_range = true;
          s.scale_dtype = sd;
          s.group = g == Gran::Group ? 32 : g == Gran::Channel ? 16 : 0;
          const uint64_t n = 37;
          std::vector<float> x = gaussian(n * d, 1.0f);
          for (uint64_t r = 0; r < n; ++r)
            x[r * d + (d / 3)] *= (r % 2 ? 12.0f : -12.0f);  // outliers of both signs
          Quantized q = roundtrip(s, x, n, d);
          const double half = dt == DType::INT8   ? 128
                              : dt == DType::INT4 ? 8
                              : dt == DType::INT3 ? 4
                                                  : 2;
          // The extreme of each scale's elements.
          std::map<uint64_t, float> ext;
          auto idx_of = [&](uint64_t r, uint64_t c) { return scale_index(s, r, c, d); };
          for (uint64_t r = 0; r < n; ++r)
            for (uint64_t c = 0; c < d; ++c) {
              const float v = x[r * d + c];
              float &e = ext[idx_of(r, c)];
              if (std::fabs(v) > std::fabs(e) || (std::fabs(v) == std::fabs(e) && v > e)) e = v;
            }
          int bad = 0;
          for (uint64_t r = 0; r < n; ++r)
            for (uint64_t c = 0; c < d; ++c) {
              const float m = ext[idx_of(r, c)], scale = step_of(s, q, r, c, n, d),
                          v = x[r * d + c];
              const double want = std::fabs(m) / half, got = std::fabs(scale);
              const bool scale_ok =
                  (m > 0 ? scale < 0 : scale > 0) && got >= want &&
                  got <= want * (1.0 + (sd == DType::F16 ? 1.0 / 1024 : 1e-6)) + 1e-30;
              const float err = std::fabs(q.out[r * d + c] - v);
              const bool clamps = (v > 0) != (m > 0) && std::fabs(v) > (half - 1) * got;
              const float bound =
                  (clamps ? 1.0f : 0.5f) * got * (1.0f + 1e-5f) + 4e-7f * std::fabs(v);
              const bool extreme_exact =
                  v != m || q.out[r * d + c] == static_cast<float>(-half * scale);
              if (!scale_ok || err > bound || !extreme_exact) {
                if (bad++ < 3)
                  std::fprintf(stderr, "%s full range: r=%llu c=%llu x=%g out=%g m=%g scale=%g\n",
                               describe(s, d).c_str(), (unsigned long long)r, (unsigned long long)c,
                               v, q.out[r * d + c], m, scale);
              }
            }
          CHECK(bad == 0);
        }
  // int4, one group of 8, hand-computed: m = 6 -> scale -0.75; 6 -> -8,
  // -5 -> 6.67 -> 7, 1 -> -1.33 -> -1, -6 -> 8 clamps to 7 (-5.25, one step
  // off), 0.375 -> -0.5 -> 0 (ties to even), 3 -> -4, -0.75 -> 1, 2.25 -> -3.
  {
    Spec s;
    s.dtype = DType::INT4;
    s.gran = Gran::Token;
    s.full_range = true;
    const std::vector<float> x = {6.0f, -5.0f, 1.0f, -6.0f, 0.375f, 3.0f, -0.75f, 2.25f};
    Quantized q = roundtrip(s, x, 1, 8);
    CHECK(load_scale(q.scales.data(), DType::F32) == -0.75f);
    const int want_q[8] = {-8, 7, -1, 7, 0, -4, 1, -3};
    for (int j = 0; j < 8; ++j) {
      const int stored = (q.codes[j / 2] >> ((j & 1) * 4)) & 0xf;
      CHECK(stored == want_q[j] + 8);
      CHECK(q.out[j] == static_cast<float>(want_q[j]) * -0.75f);
    }
    // A tie of magnitudes picks the positive value: scale -3 / 8.
    const std::vector<float> t = {-3.0f, 3.0f, 0, 0, 0, 0, 0, 0};
    Quantized qt = roundtrip(s, t, 1, 8);
    CHECK(load_scale(qt.scales.data(), DType::F32) == -0.375f);
    CHECK(qt.out[1] == 3.0f && qt.out[0] == -2.625f);  // -3 -> 8 clamps to 7
    // Beyond the 1e38 cap the sign still follows the value of largest
    // magnitude: -2e38 (not the positive 1.5e38, which caps to the same
    // magnitude) gives a positive scale, and it saturates to the code -128.
    {
      Spec s8 = s;
      s8.dtype = DType::INT8;
      const std::vector<float> big = {1.5e38f, -2e38f, 1.0f, 0, 0, 0, 0, 0};
      for (bool scalar : {true, false}) {
        set_force_scalar(scalar);
        Quantized qb = roundtrip(s8, big, 1, 8);
        const float sc = load_scale(qb.scales.data(), DType::F32);
        CHECK(sc > 0.0f && sc >= static_cast<float>(1e38 / 128) && sc < 7.82e35f);
        CHECK(static_cast<int8_t>(qb.codes[1]) == -128 && qb.out[1] == -128.0f * sc);
        CHECK(static_cast<int8_t>(qb.codes[0]) == 127 && qb.out[0] == 127.0f * sc);
        // A true tie picks the positive extreme.
        Quantized qt2 = roundtrip(s8, {-3e38f, 3e38f, 0, 0, 0, 0, 0, 0}, 1, 8);
        CHECK(load_scale(qt2.scales.data(), DType::F32) < 0.0f &&
              static_cast<int8_t>(qt2.codes[1]) == -128);
      }
      set_force_scalar(false);
    }
    // A zero row: scale 0 and exact zeros, for every dtype.
    for (DType dt : {DType::INT8, DType::INT4, DType::INT3, DType::INT2}) {
      s.dtype = dt;
      Quantized z = roundtrip(s, std::vector<float>(8, 0.0f), 1, 8);
      CHECK(load_scale(z.scales.data(), DType::F32) == 0.0f);
      for (float v : z.out) CHECK(v == 0.0f && !std::signbit(v));
    }
  }
}

// int3 with odd shapes (rows not a multiple of 8 values, groups not a
// multiple of 8, per-channel groups, one row), every mode, scale dtype,
// input and output type, rotation and static scales: the AVX2 paths give the
// scalar path's codes, scales, zero points and outputs bit for bit, nothing
// is written past the sizes row_bytes / num_scales give, every code reads
// back (from its bits 3j .. 3j + 2) as the decoded value, and unrotated
// dynamic codes are within half a step (full range: one step for values of
// the other sign than the extreme).
static void test_int3_random() {
  using kvc::DType;
  std::mt19937 r3(20261130);
  auto pick = [&](std::initializer_list<uint64_t> v) { return v.begin()[r3() % v.size()]; };
  constexpr size_t kGuard = 64;
  constexpr uint8_t kCanary = 0x5a;
  auto guarded = [&](size_t bytes, uint8_t fill) {
    return std::vector<uint8_t>(bytes + kGuard, fill);
  };
  auto intact = [&](const std::vector<uint8_t> &b) {
    for (size_t i = b.size() - kGuard; i < b.size(); ++i)
      if (b[i] != kCanary) return false;
    return true;
  };
  int cases = 0, bad = 0;
  for (int it = 0; it < 20000; ++it) {
    const uint64_t d =
        pick({1, 2, 3, 5, 7, 8, 9, 13, 16, 24, 31, 33, 40, 64, 100, 127, 128, 200, 256});
    const uint64_t n = pick({1, 1, 2, 3, 5, 8, 17, 64});
    Spec s;
    s.dtype = DType::INT3;
    s.gran = static_cast<Gran>(1 + r3() % 4);     // Tensor, Token, Group, Channel
    const int mode = static_cast<int>(r3() % 3);  // symmetric, asymmetric, full range
    s.asym = mode == 1;
    s.full_range = mode == 2;
    s.scale_dtype = r3() % 2 ? DType::F16 : DType::F32;
    if (s.gran == Gran::Group)
      s.group = static_cast<uint32_t>(pick({1, 3, 5, 8, 12, 16, 20, 24, 32, 40, 64, d}));
    if (s.gran == Gran::Channel) s.group = static_cast<uint32_t>(pick({1, 2, 3, n}));
    if (r3() % 4 == 0 && default_rotation_block(d) > 1)
      s.rotation_block = default_rotation_block(d) >> (r3() % 2);
    if (s.rotation_block == 1) s.rotation_block = 0;
    if (s.gran == Gran::Tensor && mode == 0 && r3() % 3 == 0)
      s.static_scale = pick({1, 2, 4}) * 0.25;
    const DType src_t = static_cast<DType>(r3() % 3), dst_t = static_cast<DType>(r3() % 3);
    const uint64_t esz = kvc::dtype_bytes(src_t), osz = kvc::dtype_bytes(dst_t);
    // Values: gaussian, a shifted mean for asymmetric codes, an outlier, and
    // sometimes a zero row or a group of equal values.
    std::vector<float> xf = gaussian(n * d, 1.0f, s.asym ? 0.7f : 0.0f);
    for (uint64_t r = 0; r < n; ++r) xf[r * d + (r3() % d)] *= (r % 2 ? 9.0f : -9.0f);
    if (r3() % 8 == 0) std::fill(xf.begin(), xf.begin() + d, 0.0f);
    if (r3() % 8 == 0) std::fill(xf.begin() + (n - 1) * d, xf.end(), 1.5f);
    std::vector<uint8_t> src(n * d * esz);
    kvc::convert_scalar(xf.data(), DType::F32, src.data(), src_t, n * d);
    std::vector<float> x(n * d);  // the values as given (exact)
    kvc::convert_scalar(src.data(), src_t, x.data(), DType::F32, n * d);
    const uint64_t rb = row_bytes(s.dtype, d), cb = n * rb,
                   sbytes = num_scales(s, n, d) * scale_bytes(s);
    const uint64_t zb = s.asym ? sbytes : 0;
    CHECK(rb == (d * 3 + 7) / 8);
    std::vector<uint8_t> codes[2], scales[2], zeros[2], outs[2];
    for (int simd = 0; simd < 2; ++simd) {
      set_force_scalar(simd == 0);
      codes[simd] = guarded(cb, kCanary);
      std::fill(codes[simd].begin(), codes[simd].begin() + cb,
                static_cast<uint8_t>(0xff));  // garbage to overwrite
      scales[simd] = guarded(sbytes, kCanary);
      zeros[simd] = guarded(zb, kCanary);
      quantize(s, src.data(), src_t, n, d, codes[simd].data(), scales[simd].data(),
               s.asym ? zeros[simd].data() : nullptr);
      outs[simd] = guarded(n * d * osz, kCanary);
      dequantize(s, codes[simd].data(), scales[simd].data(), s.asym ? zeros[simd].data() : nullptr,
                 n, d, outs[simd].data(), dst_t);
    }
    set_force_scalar(false);
    ++cases;
    char what[256];
    std::snprintf(what, sizeof what, "%s full_range=%d rot=%u static=%g src=%d dst=%d n=%llu",
                  describe(s, d).c_str(), s.full_range ? 1 : 0, s.rotation_block, s.static_scale,
                  static_cast<int>(src_t), static_cast<int>(dst_t),
                  static_cast<unsigned long long>(n));
    bool ok = true;
    for (int k = 0; k < 2; ++k)
      ok = ok && intact(codes[k]) && intact(scales[k]) && intact(zeros[k]) && intact(outs[k]);
    if (!ok) std::fprintf(stderr, "int3 random: write past the end: %s\n", what);
    const bool same = codes[0] == codes[1] && scales[0] == scales[1] && zeros[0] == zeros[1] &&
                      outs[0] == outs[1];
    if (!same) std::fprintf(stderr, "int3 random: scalar and AVX2 differ: %s\n", what);
    ok = ok && same;
    // Full range: the value of largest magnitude of each scale's elements
    // (the positive one on a tie).
    std::map<uint64_t, float> ext;
    if (s.full_range)
      for (uint64_t r = 0; r < n; ++r)
        for (uint64_t c = 0; c < d; ++c) {
          const float v = x[r * d + c];
          float &e = ext[scale_index(s, r, c, d)];
          if (std::fabs(v) > std::fabs(e) || (std::fabs(v) == std::fabs(e) && v > e)) e = v;
        }
    // Each row's padding bits are zero, and every code decodes as stored.
    Quantized q;
    q.scales.assign(scales[1].begin(), scales[1].end() - kGuard);
    std::vector<float> out(n * d);
    kvc::convert_scalar(outs[1].data(), dst_t, out.data(), DType::F32, n * d);
    for (uint64_t r = 0; r < n && ok; ++r) {
      const uint8_t *row = codes[1].data() + r * rb;
      if (d * 3 % 8 && (row[rb - 1] >> (d * 3 % 8)) != 0) {
        std::fprintf(stderr, "int3 random: padding bits set in row %llu: %s\n",
                     (unsigned long long)r, what);
        ok = false;
      }
      if (s.rotation_block || dst_t != DType::F32) continue;
      for (uint64_t c = 0; c < d; ++c) {
        const uint64_t bit = 3 * c;
        uint32_t w = row[bit / 8];
        if (bit / 8 + 1 < rb) w |= static_cast<uint32_t>(row[bit / 8 + 1]) << 8;
        const int code = static_cast<int>((w >> (bit % 8)) & 7u);
        const uint64_t si = s.gran == Gran::Tensor ? 0 : scale_index(s, r, c, d);
        const float sc = load_scale(q.scales.data() + si * scale_bytes(s), s.scale_dtype);
        const float z =
            s.asym ? load_scale(zeros[1].data() + si * scale_bytes(s), s.scale_dtype) : 0.0f;
        const float want =
            s.asym ? static_cast<float>(code) * sc + z : static_cast<float>(code - 4) * sc;
        if (out[r * d + c] != want) {
          std::fprintf(stderr, "int3 random: r=%llu c=%llu code %d decodes to %g, not %g: %s\n",
                       (unsigned long long)r, (unsigned long long)c, code, out[r * d + c], want,
                       what);
          ok = false;
          break;
        }
        if (s.static_scale == 0.0) {
          const float step = std::fabs(sc), v = x[r * d + c], err = std::fabs(out[r * d + c] - v);
          // Full range: a value of the other sign than the extreme beyond 3
          // steps clamps to code 3 (within one step); all others round.
          const float m = s.full_range ? ext[scale_index(s, r, c, d)] : 0.0f;
          const bool clamps = s.full_range && (v > 0) != (m > 0) && std::fabs(v) > 3.0f * step;
          const float bound = (clamps ? 1.0f : 0.5f) * step * (1.0f + 1e-5f) +
                              4e-7f * std::fabs(v) + (s.asym ? 4e-7f * std::fabs(z) : 0.0f);
          if (err > bound) {
            std::fprintf(stderr, "int3 random: r=%llu c=%llu x=%g out=%g step=%g: %s\n",
                         (unsigned long long)r, (unsigned long long)c, v, out[r * d + c], step,
                         what);
            ok = false;
            break;
          }
        }
      }
    }
    if (!ok) ++bad;
  }
  std::printf("int3 random: %d cases, %d bad\n", cases, bad);
  CHECK(bad == 0);
}

// The batched scale computation of the fused path (four groups at a time)
// on the groups that take its edge branches: all zeros, -0, values below
// FLT_MIN, magnitudes past the 1e38 cap, a single nonzero value, and
// group counts that leave a remainder of 1 to 3, groups of 8 and of whole
// 32-value vectors (the inline int8 / int4 encoder): the scalar path's codes,
// scales and zero points bit for bit.
static void test_fused_params_edges() {
  const float tiny = 1e-40f, huge = 3e38f;
  for (DType dt : {DType::INT8, DType::INT4, DType::INT2, DType::FP8_E4M3, DType::FP8_E5M2})
    for (int asym : {0, 1})
      for (uint64_t gs : {8ull, 32ull, 64ull})
        for (uint64_t groups : {1ull, 2ull, 3ull, 5ull, 7ull}) {
          if (asym && is_fp8(dt)) continue;
          Spec s;
          s.dtype = dt;
          s.gran = Gran::Group;
          s.group = static_cast<uint32_t>(gs);
          s.asym = asym != 0;
          const uint64_t d = gs * groups, n = 9;
          std::vector<float> x = gaussian(n * d, 1.0f, 0.0f);
          for (uint64_t r = 0; r < n; ++r)
            for (uint64_t j = 0; j < d; ++j) {
              float &v = x[r * d + j];
              const uint64_t kind = (r * groups + j / gs) % 7;
              if (kind == 0) v = 0.0f;
              if (kind == 1) v = -0.0f;
              if (kind == 2) v = (j % 2 ? -tiny : tiny);
              if (kind == 3) v = (j % 3 ? huge : -huge);
              if (kind == 4) v = j % gs == 5 ? -2.5f : 0.0f;
              if (kind == 5) v = std::fabs(v) + 1.0f;  // all positive
            }
          Quantized a, b;
          for (Quantized *q : {&a, &b}) {
            q->codes.assign(n * row_bytes(s.dtype, d), 0xa5);
            q->scales.assign(num_scales(s, n, d) * scale_bytes(s), 0xa5);
            q->zeros.assign(s.asym ? q->scales.size() : 0, 0xa5);
            set_force_scalar(q == &a);
            quantize(s, x.data(), kvc::DType::F32, n, d, q->codes.data(), q->scales.data(),
                     q->zeros.data());
          }
          set_force_scalar(false);
          if (!(a.codes == b.codes && a.scales == b.scales && a.zeros == b.zeros))
            std::fprintf(stderr, "fused params differ: dtype %d asym %d groups %llu\n",
                         static_cast<int>(dt), asym, static_cast<unsigned long long>(groups));
          CHECK(a.codes == b.codes);
          CHECK(a.scales == b.scales);
          CHECK(a.zeros == b.zeros);
        }
}

// Symmetric scales at their rounding edge, through the eight-group float
// path (no group near the 1e38 cap): largest magnitudes of exactly q x m
// (the quotient is a float, kept) and one or two ulps above (raised to the
// next float), f32 and f16 input, f32 and f16 scales: the scalar path's
// bits.
static void test_scale_ceiling_edges() {
  const struct {
    DType dt;
    float q;
  } cases[] = {{DType::INT8, 127.0f}, {DType::INT4, 7.0f},       {DType::INT3, 3.0f},
               {DType::INT2, 1.0f},   {DType::FP8_E4M3, 448.0f}, {DType::FP8_E5M2, 57344.0f}};
  const float ms[] = {0.75f, 0.001f, 1.5f, 3.0517578125e-05f, 0.3f, 1.0f};
  for (const auto &c : cases)
    for (DType sd : {DType::F32, DType::F16})
      for (kvc::DType in : {kvc::DType::F32, kvc::DType::F16}) {
        Spec s;
        s.dtype = c.dt;
        s.gran = Gran::Group;
        s.group = 8;
        s.scale_dtype = sd;
        if (c.dt == DType::INT2) s.asym = false;
        const uint64_t n = 6, d = 8 * 24;
        std::vector<float> x = gaussian(n * d, 0.01f);
        for (uint64_t r = 0; r < n; ++r)
          for (uint64_t g = 0; g < d / 8; ++g) {
            float v = c.q * ms[(r + g) % 6];
            for (uint64_t k = 0; k < (r + g) % 3; ++k) v = std::nextafter(v, 2.0f * v);
            if (in == kvc::DType::F16) v = std::min(v, 60000.0f);
            x[r * d + g * 8 + (g % 8)] = (g % 2) ? -v : v;
          }
        std::vector<uint16_t> h(x.size());
        kvc::convert(x.data(), kvc::DType::F32, h.data(), kvc::DType::F16, x.size());
        const void *src = in == kvc::DType::F16 ? static_cast<const void *>(h.data()) : x.data();
        Quantized a, b;
        for (Quantized *q : {&a, &b}) {
          q->codes.assign(n * row_bytes(s.dtype, d), 0xa5);
          q->scales.assign(num_scales(s, n, d) * scale_bytes(s), 0xa5);
          set_force_scalar(q == &a);
          quantize(s, src, in, n, d, q->codes.data(), q->scales.data(), nullptr);
        }
        set_force_scalar(false);
        if (!(a.codes == b.codes && a.scales == b.scales))
          std::fprintf(stderr, "scale ceiling differs: dtype %d scale %d in %d\n",
                       static_cast<int>(c.dt), static_cast<int>(sd), static_cast<int>(in));
        CHECK(a.codes == b.codes);
        CHECK(a.scales == b.scales);
      }
}

int main(int argc, char **argv) {
  const std::map<std::string, void (*)()> tests = {
      {"int_bounds", test_int_bounds},
      {"zero_rows", test_zero_rows_exact},
      {"static_scales", test_static_scales},
      {"int4_partial_group", test_int4_partial_group},
      {"rotation_bound", test_rotation_bound},
      {"nonfinite", test_nonfinite_rejected},
      {"byte_layout", test_byte_layout},
      {"fused_params_edges", test_fused_params_edges},
      {"scale_ceiling_edges", test_scale_ceiling_edges},
      {"full_range", test_full_range},
      {"int3_random", test_int3_random},
  };
  return run_named_tests(argc, argv, tests);
}
