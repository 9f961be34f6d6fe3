// codec_*: the SIMD paths against the scalar reference, bit for bit
// (white-box, internal API): the AVX2 run kernels, the fused and one-pass
// quantize paths from f32 and f16 (each SIMD level: AVX2, and AVX-512 where
// the CPU has it), dequantization to f16, the Hadamard transform and the
// codebook kernels. The analytic bounds are in test_codec.cpp.
#include "codec_test_util.h"

// quantize() of n rows of d values at each SIMD level 0 .. top into q[level]
// (every output filled with 0xa5 first); leaves the level at top.
static void quantize_levels(const Spec &s, const void *src, kvc::DType in, uint64_t n,
                            uint64_t d, int top, Quantized *q) {
  for (int level = 0; level <= top; ++level) {
    q[level].codes.assign(n * row_bytes(s.dtype, d), 0xa5);
    q[level].scales.assign(num_scales(s, n, d) * scale_bytes(s), 0xa5);
    q[level].zeros.assign(s.asym ? q[level].scales.size() : 0, 0xa5);
    set_simd_level(level);
    quantize(s, src, in, n, d, q[level].codes.data(), q[level].scales.data(),
             q[level].zeros.data());
  }
}

// The AVX2 kernels give the scalar reference's bytes and floats, bit for bit.
static void test_simd_matches_scalar() {
  if (!simd_active()) {
    std::printf("no AVX2 on this machine: the scalar path is the only one\n");
  }
  for (DType dt :
       {DType::INT8, DType::INT4, DType::INT3, DType::INT2, DType::FP8_E4M3, DType::FP8_E5M2})
    for (Gran g : {Gran::Tensor, Gran::Token, Gran::Group, Gran::Channel})
      for (int mode : {0, 1, 2})  // symmetric, asymmetric, full range
        for (uint64_t d : {8ull, 40ull, 64ull, 96ull, 128ull, 200ull, 256ull}) {
          const bool asym = mode == 1;
          if (mode != 0 && is_fp8(dt)) continue;
          Spec s;
          s.dtype = dt;
          s.gran = g;
          s.asym = asym;
          s.full_range = mode == 2;
          s.group = g == Gran::Group ? (d % 64 == 0 ? 64 : 32) : 8;
          const uint64_t n = 19;
          std::vector<float> x = gaussian(n * d, 2.0f, asym ? 0.5f : 0.0f);
          for (uint64_t i = 0; i < x.size(); i += 17)
            x[i] = std::nearbyint(x[i] * 4.0f) / 4.0f;  // ties
          set_force_scalar(true);
          Quantized a = roundtrip(s, x, n, d);
          set_force_scalar(false);
          Quantized b = roundtrip(s, x, n, d);
          CHECK(a.codes == b.codes);
          CHECK(a.scales == b.scales);
          CHECK(a.zeros == b.zeros);
          CHECK(std::memcmp(a.out.data(), b.out.data(), a.out.size() * 4) == 0);
        }
}

// The fused quantize path (f16 or f32 input, rotation by blocks of 8, 64
// and 128, static scales, f16 scales) gives the scalar path's codes, scales and zero points bit for
// bit.
static void test_fused_quantize_matches_scalar() {
  for (DType dt :
       {DType::INT8, DType::INT4, DType::INT3, DType::INT2, DType::FP8_E4M3, DType::FP8_E5M2})
    for (Gran g : {Gran::Tensor, Gran::Token, Gran::Group})
      for (int mode : {0, 1, 2})                  // symmetric, asymmetric, full range
        for (uint32_t rot : {0u, 8u, 64u, 128u})  // 64, 128: the register transform
          for (DType sd : {DType::F32, DType::F16})
            for (kvc::DType in : {kvc::DType::F32, kvc::DType::F16})
              for (uint64_t d : {8ull, 24ull, 64ull, 128ull, 256ull})
                for (uint64_t group : {16ull, 32ull, 64ull}) {  // (8 where d % 16 != 0)
                if (rot && d % rot != 0) continue;
                if (group != 16 && (g != Gran::Group || d % group != 0)) continue;
                const bool asym = mode == 1;
                if (mode != 0 && is_fp8(dt)) continue;
                if (mode == 2 && g == Gran::Tensor) continue;  // full range: dynamic scales only
                Spec s;
                s.dtype = dt;
                s.gran = g;
                s.asym = asym;
                s.full_range = mode == 2;
                s.scale_dtype = sd;
                s.rotation_block = rot;
                s.group = d % 16 == 0 ? group : 8;
                if (g == Gran::Tensor) s.static_scale = 0.37;
                const uint64_t n = 7;
                std::vector<float> x = gaussian(n * d, 2.0f, asym ? 0.5f : 0.0f);
                x[3] = 0.0f;
                for (uint64_t i = 0; i < x.size(); i += 13)
                  x[i] = std::nearbyint(x[i] * 4.0f) / 4.0f;  // ties
                // Row 5 large (f32: f16 scales saturate at 65504), row 6 tiny
                // (f16 scales subnormal).
                for (uint64_t i = 0; i < d; ++i) {
                  x[5 * d + i] *= in == kvc::DType::F16 ? 2e3f : 1e6f;
                  x[6 * d + i] *= 1e-6f;
                }
                std::vector<uint16_t> h(x.size());
                kvc::convert(x.data(), kvc::DType::F32, h.data(), kvc::DType::F16, x.size());
                const void *src =
                    in == kvc::DType::F16 ? static_cast<const void *>(h.data()) : x.data();
                Quantized a, b;
                for (Quantized *q : {&a, &b}) {
                  q->codes.assign(n * row_bytes(s.dtype, d), 0xa5);
                  q->scales.assign(num_scales(s, n, d) * scale_bytes(s), 0xa5);
                  q->zeros.assign(s.asym ? q->scales.size() : 0, 0xa5);
                  set_force_scalar(q == &a);
                  quantize(s, src, in, n, d, q->codes.data(), q->scales.data(), q->zeros.data());
                }
                set_force_scalar(false);
                bool same = a.codes == b.codes && a.scales == b.scales && a.zeros == b.zeros;
                // Dequantize the same codes both ways, to f32 and to f16.
                for (kvc::DType out : {kvc::DType::F32, kvc::DType::F16}) {
                  std::vector<uint8_t> da(n * d * 4, 0x5a), db(n * d * 4, 0x5a);
                  set_force_scalar(true);
                  dequantize(s, b.codes.data(), b.scales.data(), b.zeros.data(), n, d, da.data(),
                             out);
                  set_force_scalar(false);
                  dequantize(s, b.codes.data(), b.scales.data(), b.zeros.data(), n, d, db.data(),
                             out);
                  same = same && da == db;
                }
                if (!same)
                  std::fprintf(stderr,
                               "fused quantize differs: dtype %d gran %d mode %d rot %u scale %d "
                               "in %d d %llu group %llu\n",
                               int(dt), int(g), mode, rot, int(sd), int(in), (unsigned long long)d,
                               (unsigned long long)s.group);
                CHECK(same);
              }
}

// Dequantizing to f16 (the fused AVX2 path) equals the scalar path's bytes.
static void test_dequant_f16_simd() {
  for (DType dt : {DType::INT8, DType::INT4})
    for (Gran g : {Gran::Token, Gran::Group})
      for (DType sd : {DType::F32, DType::F16}) {
        Spec s;
        s.dtype = dt;
        s.gran = g;
        s.group = 16;
        s.scale_dtype = sd;
        const uint64_t n = 9, d = 64;
        std::vector<float> x = gaussian(n * d, 3.0f);
        Quantized q = roundtrip(s, x, n, d);
        std::vector<uint16_t> a(n * d), b(n * d);
        set_force_scalar(true);
        dequantize(s, q.codes.data(), q.scales.data(), nullptr, n, d, a.data(), kvc::DType::F16);
        set_force_scalar(false);
        dequantize(s, q.codes.data(), q.scales.data(), nullptr, n, d, b.data(), kvc::DType::F16);
        CHECK(a == b);
      }
}

// The AVX2 Walsh-Hadamard transform equals the scalar one bit for bit.
static void test_hadamard_simd() {
  for (uint32_t block : {8u, 16u, 32u, 64u, 128u, 256u, 1024u}) {
    std::vector<float> x = gaussian(3 * block, 3.0f), y = x;
    set_force_scalar(true);
    hadamard(x.data(), x.size(), block);
    set_force_scalar(false);
    hadamard(y.data(), y.size(), block);
    CHECK(std::memcmp(x.data(), y.data(), x.size() * 4) == 0);
  }
}

// f16 rows with dynamic per-token or per-group scales take the direct path
// (extremes on the f16 bits, parameters 4 groups at a time, codes straight
// from f16): bit for bit the scalar reference, on the f16 values where the
// order of bits and values is delicate (signed zeros, subnormals, the largest
// finite, constant and one-signed groups) and on random finite bit patterns.
static void test_f16_direct_matches_scalar() {
  std::uniform_int_distribution<int> bits(0, 0xffff), pick(0, 9);
  const uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x83ff,
                               0x0400, 0x7bff, 0xfbff, 0x3c00, 0xbc00};
  auto make = [&](uint64_t count, uint64_t g) {
    std::vector<uint16_t> h(count);
    for (uint64_t i = 0; i < count; i += g) {
      const int kind = pick(rng);  // per group
      const uint16_t c = specials[bits(rng) % (sizeof specials / sizeof specials[0])];
      for (uint64_t j = i; j < i + g && j < count; ++j) {
        uint16_t v;
        do v = static_cast<uint16_t>(bits(rng));
        while ((v & 0x7c00) == 0x7c00);  // finite
        if (kind == 0)
          v = c;  // constant group
        else if (kind == 1)
          v = specials[bits(rng) % (sizeof specials / sizeof specials[0])];
        else if (kind == 2)
          v |= 0x8000;  // all negative
        else if (kind == 3)
          v &= 0x7fff;  // all positive
        else if (kind == 4)
          v = static_cast<uint16_t>(v & 0x83ff);  // subnormals and zeros
        else if (kind == 5 && j == i)
          v = c;  // one special among randoms
        h[j] = v;
      }
    }
    return h;
  };
  // Each SIMD level (AVX2; AVX-512 with its 512-bit first pass and int8 /
  // int4 encoders for groups of a multiple of 32, where the CPU has it)
  // against the scalar reference.
  const int top = set_simd_level(2);
  int cases = 0;
  for (DType dt :
       {DType::INT8, DType::INT4, DType::INT3, DType::INT2, DType::FP8_E4M3, DType::FP8_E5M2})
    for (int mode : {0, 1, 2})
      for (DType sd : {DType::F32, DType::F16})
        for (uint64_t d : {64ull, 96ull, 128ull, 200ull, 256ull})
          for (uint32_t group : {0u, 8u, 16u, 24u, 32u, 64u, 128u}) {
            if (mode != 0 && is_fp8(dt)) continue;
            if (group && d % group != 0) continue;
            Spec s;
            s.dtype = dt;
            s.gran = group ? Gran::Group : Gran::Token;
            s.group = group;
            s.asym = mode == 1;
            s.full_range = mode == 2;
            s.scale_dtype = sd;
            // 9 rows: group counts that leave a partial batch of 8 groups
            // and 32-value ends in the 512-bit passes.
            const uint64_t n = 9;
            const std::vector<uint16_t> h = make(n * d, group ? group : d);
            Quantized q[3];
            quantize_levels(s, h.data(), kvc::DType::F16, n, d, top, q);
            for (int level = 1; level <= top; ++level) {
              const bool same = q[0].codes == q[level].codes && q[0].scales == q[level].scales &&
                                q[0].zeros == q[level].zeros;
              if (!same)
                std::fprintf(stderr,
                             "f16 direct path (level %d) differs: dtype %d mode %d scale %d d %llu "
                             "group %u\n",
                             level, int(dt), mode, int(sd), (unsigned long long)d, group);
              CHECK(same);
            }
            // Keys computed ahead (f16_keys, as kvc_append's check does),
            // the rows then quantized in pieces of 1, 3 and 5 rows from the
            // keys at each piece's first group: the same bytes.
            for (int level = 1; level <= top; ++level) {
              set_simd_level(level);
              CHECK(f16_keys_apply(s, d));
              const uint64_t count = f16_keys_count(s, n, d), per_row = (count - 4) / n;
              CHECK(count - 4 == n * (d / (group ? group : d)));
              std::vector<uint16_t> lo(count, 0x5a5a), hi(count, 0x5a5a);
              CHECK(f16_keys(s, h.data(), n, d, lo.data(), hi.data()));
              Quantized p;
              p.codes.assign(q[0].codes.size(), 0xa5);
              p.scales.assign(q[0].scales.size(), 0xa5);
              p.zeros.assign(q[0].zeros.size(), 0xa5);
              const uint64_t sbytes = per_row * scale_bytes(s);
              for (uint64_t r0 = 0, piece = 1; r0 < n; r0 += piece, piece += 2) {
                const uint64_t m = std::min<uint64_t>(piece, n - r0);
                const F16Keys keys{mode ? lo.data() + r0 * per_row : nullptr,
                                   hi.data() + r0 * per_row};
                quantize(s, h.data() + r0 * d, kvc::DType::F16, m, d,
                         p.codes.data() + r0 * row_bytes(s.dtype, d),
                         p.scales.data() + r0 * sbytes,
                         s.asym ? p.zeros.data() + r0 * sbytes : nullptr, &keys);
              }
              CHECK(p.codes == q[0].codes && p.scales == q[0].scales && p.zeros == q[0].zeros);
              // A NaN anywhere: f16_keys reports it.
              std::vector<uint16_t> hb = h;
              hb[(level * 37 + d) % hb.size()] = 0xfe00;
              CHECK(!f16_keys(s, hb.data(), n, d, lo.data(), hi.data()));
            }
            set_simd_level(top);
            // A NaN or Inf of either sign in the last value (or in the
            // first group): refused, nothing written.
            for (int level = 0; level <= top; ++level)
              for (uint16_t badv : {0x7c00, 0xfc00, 0x7e00, 0xfe01})
                for (bool first : {false, true}) {
                  set_simd_level(level);
                  std::vector<uint16_t> hb = h;
                  (first ? hb[5] : hb.back()) = badv;
                  std::vector<uint8_t> codes(q[0].codes.size(), 0x5a),
                      scales(q[0].scales.size(), 0x5a), zeros(q[0].zeros.size(), 0x5a);
                  expect_error(
                      [&] {
                        quantize(s, hb.data(), kvc::DType::F16, n, d, codes.data(), scales.data(),
                                 zeros.data());
                      },
                      kvc::Errc::NonFinite);
                  bool untouched = true;
                  for (uint8_t c : codes) untouched = untouched && c == 0x5a;
                  for (uint8_t c : scales) untouched = untouched && c == 0x5a;
                  for (uint8_t c : zeros) untouched = untouched && c == 0x5a;
                  CHECK(untouched);
                }
            ++cases;
          }
  set_simd_level(2);
  CHECK(cases > 250);
  // An output of 4 MiB or more streams its int8 codes around the caches
  // (the 512-bit encoder where the codes are 64-byte aligned, the 256-bit
  // one where they are 16-byte aligned), symmetric, asymmetric and full
  // range; rows of 96 with an odd row count end each call on 32 values.
  for (int mode : {0, 1, 2})
    for (uint64_t misalign : {0ull, 16ull}) {
      Spec s;
      s.dtype = DType::INT8;
      s.gran = Gran::Token;
      s.asym = mode == 1;
      s.full_range = mode == 2;
      const uint64_t d = mode == 0 ? 128 : 96, n = mode == 0 ? 4096 * 8 : 44001;
      const std::vector<uint16_t> h = make(n * d, d);
      std::vector<uint8_t> codes[3], scales[3], zeros[3];
      for (int level = 0; level <= top; ++level) {
        codes[level].assign(n * d + 128, 0xa5);
        scales[level].assign(n * 4, 0xa5);
        zeros[level].assign(s.asym ? n * 4 : 0, 0xa5);
        uint8_t *base = codes[level].data();
        uint8_t *c = base + (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64 + misalign;
        set_simd_level(level);
        quantize(s, h.data(), kvc::DType::F16, n, d, c, scales[level].data(),
                 s.asym ? zeros[level].data() : nullptr);
        std::vector<uint8_t> only(c, c + n * d);  // the codes alone
        codes[level].swap(only);
      }
      set_simd_level(2);
      for (int level = 1; level <= top; ++level)
        CHECK(codes[0] == codes[level] && scales[0] == scales[level] &&
              zeros[0] == zeros[level]);
    }
}

// Codebook codes (encode_codebook / decode_codebook): the AVX2 path gives the
// scalar path's bytes and values, for 2..4 bits, f16 and f32 scales, groups
// that do and do not start on whole code bytes, rows with ties and zeros.
static void test_codebook_simd() {
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int bits = 2; bits <= 4; ++bits)
    for (DType sd : {DType::F32, DType::F16})
      for (uint64_t d : {16u, 20u, 64u, 72u}) {
        Spec s;
        s.dtype = bits == 4 ? DType::INT4 : bits == 3 ? DType::INT3 : DType::INT2;
        s.scale_dtype = sd;
        s.gran = d == 72 ? Gran::Group : Gran::Token;
        s.group = 12;  // int3 groups at 12, 36, 60 start inside a code byte
        const uint64_t n = 9, g = s.gran == Gran::Group ? s.group : d;
        std::vector<float> x(n * d);
        for (auto &v : x) v = nd(rng);
        for (uint64_t j = 0; j < d; ++j) x[2 * d + j] = 0.0f;       // a zero row
        for (uint64_t j = 0; j < d; ++j) x[3 * d + j] = j % 2 ? 1.0f : -1.0f;  // ties of the extreme
        for (uint64_t j = 0; j < d; ++j) x[4 * d + j] *= 0x1p-132f;  // subnormal: 1 / e overflows
        const float *lv = gaussian_levels(bits, g);
        CHECK(lv != nullptr);
        const uint64_t rb = row_bytes(s.dtype, d), ns = n * (d / g);
        std::vector<uint8_t> c1(n * rb), c2(n * rb), s1(ns * 4), s2(ns * 4);
        std::vector<float> o1(n * d), o2(n * d);
        set_force_scalar(true);
        encode_codebook(s, lv, x.data(), n, d, c1.data(), s1.data());
        decode_codebook(s, lv, c1.data(), s1.data(), n, d, o1.data());
        set_force_scalar(false);
        encode_codebook(s, lv, x.data(), n, d, c2.data(), s2.data());
        decode_codebook(s, lv, c2.data(), s2.data(), n, d, o2.data());
        CHECK(c1 == c2);
        CHECK(s1 == s2);
        CHECK(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)) == 0);
        for (uint64_t j = 0; j < d; ++j) CHECK(o1[2 * d + j] == 0.0f);
        // The subnormal row has the codes of the same row x 2^132 (exact).
        std::vector<float> up(x.begin() + 4 * d, x.begin() + 5 * d);
        for (float &u : up) u = u * 0x1p66f * 0x1p66f;
        std::vector<uint8_t> cu(rb), su(d / g * 4);
        encode_codebook(s, lv, up.data(), 1, d, cu.data(), su.data());
        CHECK(std::memcmp(cu.data(), c1.data() + 4 * rb, rb) == 0);
        // The group's norm is kept (f32 scales: up to rounding).
        if (sd == DType::F32)
          for (uint64_t r = 0; r < n; ++r) {
            if (r == 4) continue;  // subnormal products round
            double a = 0.0, b = 0.0;
            for (uint64_t j = 0; j < g; ++j)
              a += double(x[r * d + j]) * x[r * d + j], b += double(o1[r * d + j]) * o1[r * d + j];
            CHECK(std::fabs(std::sqrt(a) - std::sqrt(b)) <= 1e-5 * std::sqrt(a));
          }
      }
}
// f32 rows through quantize_fast at each SIMD level (AVX2's encoder; the
// 512-bit int8 / int4 encoder for groups of a multiple of 32, where the CPU
// has it) against the scalar reference: every integer and fp8 format and
// mode, per-token and per-group scales of 32 to 256 values, static
// per-tensor scales, ties, zeros, subnormals and values past the capped
// scales (near the f32 maximum, where only the clamp keeps codes in range);
// row counts that end a call on 32 values.
static void test_f32_levels_match_scalar() {
  const int top = set_simd_level(2);
  int cases = 0;
  for (DType dt :
       {DType::INT8, DType::INT4, DType::INT3, DType::INT2, DType::FP8_E4M3, DType::FP8_E5M2})
    for (int mode : {0, 1, 2})
      for (Gran gran : {Gran::Token, Gran::Group, Gran::Tensor})
        for (uint32_t group : {32u, 64u, 256u})
          for (uint64_t d : {96ull, 256ull, 512ull}) {
            if (mode != 0 && is_fp8(dt)) continue;
            if (mode == 2 && gran == Gran::Tensor) continue;  // full range: dynamic scales only
            if (gran == Gran::Group && d % group != 0) continue;
            if (gran != Gran::Group && group != 32) continue;  // (group unused: once)
            for (int kind = 0; kind < 3; ++kind) {  // plain, ties and zeros, huge
              Spec s;
              s.dtype = dt;
              s.gran = gran;
              s.group = gran == Gran::Group ? group : 0;
              s.asym = mode == 1;
              s.full_range = mode == 2;
              if (gran == Gran::Tensor) s.static_scale = 0.37;
              const uint64_t n = 5;
              std::vector<float> x = gaussian(n * d, 2.0f, s.asym ? 0.5f : 0.0f);
              if (kind == 1)
                for (uint64_t i = 0; i < x.size(); ++i)
                  x[i] = i % 7 == 0 ? 0.0f : i % 11 == 0 ? 1e-40f : std::nearbyint(x[i] * 4) / 4;
              if (kind == 2)
                for (uint64_t i = 0; i < x.size(); ++i)
                  x[i] = std::copysign(
                      i % 3 == 0 ? 3e38f : 1e37f * std::min(std::fabs(x[i]), 30.0f), x[i]);
              Quantized q[3];
              quantize_levels(s, x.data(), kvc::DType::F32, n, d, top, q);
              for (int level = 1; level <= top; ++level) {
                const bool same = q[0].codes == q[level].codes &&
                                  q[0].scales == q[level].scales && q[0].zeros == q[level].zeros;
                if (!same)
                  std::fprintf(stderr,
                               "f32 path (level %d) differs: dtype %d mode %d gran %d group %u "
                               "d %llu kind %d\n",
                               level, int(dt), mode, int(gran), group, (unsigned long long)d,
                               kind);
                CHECK(same);
              }
              ++cases;
            }
          }
  set_simd_level(2);
  CHECK(cases > 300);
  // Outputs of 1 MiB and more leave the staging buffer by non-temporal
  // stores: a destination 32-byte aligned and one 7 bytes past, sizes that
  // end between 128-byte steps.
  for (uint64_t misalign : {0ull, 7ull})
    for (DType dt : {DType::INT8, DType::INT4}) {
      Spec s;
      s.dtype = dt;
      s.gran = Gran::Token;
      const uint64_t d = 160, n = (uint64_t(1) << 20) / row_bytes(dt, d) * 2 + 3;
      const std::vector<float> x = gaussian(n * d, 2.0f);
      std::vector<uint8_t> codes[3], scales[3];
      for (int level = 0; level <= top; ++level) {
        codes[level].assign(n * row_bytes(dt, d) + 64, 0xa5);
        scales[level].assign(n * 4, 0xa5);
        uint8_t *base = codes[level].data();
        uint8_t *c = base + (32 - reinterpret_cast<uintptr_t>(base) % 32) % 32 + misalign;
        set_simd_level(level);
        quantize(s, x.data(), kvc::DType::F32, n, d, c, scales[level].data(), nullptr);
        std::vector<uint8_t> only(c, c + n * row_bytes(dt, d));
        codes[level].swap(only);
      }
      set_simd_level(2);
      for (int level = 1; level <= top; ++level)
        CHECK(codes[0] == codes[level] && scales[0] == scales[level]);
    }
}

// check_finite_raw (kvc_append's test of f16 / bf16 rows before anything is
// written) at each SIMD level: a NaN, Inf or largest-exponent value of either
// sign at any position of arrays of 1 .. 300 values is reported (the vector
// loops of 32 and 128 values, their tails), the largest finite values and
// subnormals are not.
static void test_finite_raw_levels() {
  const int top = set_simd_level(2);
  uint64_t checked = 0;
  for (kvc::DType t : {kvc::DType::F16, kvc::DType::BF16}) {
    const bool f16 = t == kvc::DType::F16;
    const uint16_t inf = f16 ? 0x7c00 : 0x7f80, nan = f16 ? 0x7e00 : 0x7fc0;
    const uint16_t max_finite = f16 ? 0x7bff : 0x7f7f, sub = 0x0001;
    for (uint64_t n : {1, 2, 15, 16, 31, 32, 33, 63, 64, 127, 128, 129, 160, 255, 256, 300}) {
      std::vector<uint16_t> h(n);
      for (uint64_t i = 0; i < n; ++i)  // finite values of every size, both signs
        h[i] = static_cast<uint16_t>((i % 3 == 0 ? max_finite : i % 3 == 1 ? sub : 0x3c00) |
                                     (i % 2 ? 0x8000 : 0));
      for (int level = 0; level <= top; ++level) {
        set_simd_level(level);
        check_finite_raw(h.data(), t, n, "input");  // no throw
        for (uint64_t pos = 0; pos < n; ++pos)
          for (uint16_t bad : {inf, nan, static_cast<uint16_t>(inf | 0x8000),
                               static_cast<uint16_t>(nan | 0x8001)}) {
            std::vector<uint16_t> b = h;
            b[pos] = bad;
            expect_error([&] { check_finite_raw(b.data(), t, n, "input"); },
                         kvc::Errc::NonFinite);
            ++checked;
          }
      }
    }
  }
  set_simd_level(2);
  CHECK(checked > 2 * 1600 * 4);
}

int main(int argc, char **argv) {
  const std::map<std::string, void (*)()> tests = {
      {"simd_matches_scalar", test_simd_matches_scalar},
      {"hadamard_simd", test_hadamard_simd},
      {"dequant_f16_simd", test_dequant_f16_simd},
      {"fused_quantize", test_fused_quantize_matches_scalar},
      {"f16_direct", test_f16_direct_matches_scalar},
      {"codebook_simd", test_codebook_simd},
      {"f32_levels", test_f32_levels_match_scalar},
      {"finite_raw_levels", test_finite_raw_levels},
  };
  return run_named_tests(argc, argv, tests);
}
