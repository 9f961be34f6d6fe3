// The int8 modes of decode attention (KVC_QUERY_INT8, KVC_QUERY_INT8_VALUES):
// within their documented bounds of the exact path, taken only where they
// apply, the exact bytes everywhere else.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../whitebox.h"
#include "api/internal.h"
#include "attention/fused.h"
#include "attention_test_util.h"

// KVC_QUERY_INT8: with integer keys each score moves by at most the query's
// rounding, (max |q| / 254) x sum |k| (q after the scale), so the log-sum-exp
// moves by at most the largest such bound B and each output by at most
// (e^(2B) - 1) x max |v|; the path really runs where the CPU has AVX-512 VNNI
// (some result differs from KVC_QUERY_EXACT's), and everything it does not
// take (f16 keys, head_dim not a multiple of 32, prefill, a capped ISA) gives
// KVC_QUERY_EXACT's bytes.
KVTEST(query_int8_within_bound) {
  const bool vnni = kvc::attention::fused::int8_query_available();
  std::fprintf(stderr, "int8-query kernels %s on this CPU\n", vnni ? "run" : "are not available");
  struct Storage {
    const char *name;
    kvc_dtype dt;
    int asym;
  };
  const Storage stor[] = {{"int8", KVC_DTYPE_INT8, 0},
                          {"int8 asym", KVC_DTYPE_INT8, 1},
                          {"int4", KVC_DTYPE_INT4, 0},
                          {"int4 asym", KVC_DTYPE_INT4, 1},
                          {"f16", KVC_DTYPE_F16, 0}};
  // (GQA groups 1, 2, 3, 4, 8 + 4 and 8 heads; head_dim 64 and 192 take the
  // 64-dimension int4 key kernel, 128 and 256 the 16-tokens-across-lanes one)
  const Geo shapes[] = {{1, 8, 2, 64, 16},  {1, 32, 8, 128, 16}, {1, 12, 1, 32, 8},
                        {1, 4, 4, 96, 16},  {1, 6, 2, 48, 16},   {1, 3, 3, 256, 32},
                        {1, 16, 8, 128, 16}, {1, 8, 1, 192, 16},  {1, 4, 4, 192, 16},
                        {1, 16, 2, 64, 16}};
  int differed = 0;
  for (const Storage &st : stor)
    for (const Geo &g : shapes) {
      kvc_codec codec = per_token_codec(st.dt, st.asym != 0);
      const bool quant = st.dt != KVC_DTYPE_F16;
      kvc_pool *p = make_pool(g, KVC_DTYPE_F16, quant ? &codec : nullptr, quant ? &codec : nullptr);
      uint64_t id = 1;
      for (uint64_t n : {1ull, 17ull, 40ull, 100ull}) {
        fill(p, g, id, n);
        std::vector<float> k(n * g.hkv * g.hd), v(k.size());
        CHECK_OK(kvc_gather(p, id, 0, 0, n, k.data(), v.data(), KVC_DTYPE_F32, nullptr));
        const std::vector<float> q = randn(g.hq * g.hd, 2.0f);
        kvc_attention_params a = params(g);
        std::vector<float> out[3], lse[3];
        for (int mode = 0; mode < 3; ++mode) {  // exact, int8, int8 with the ISA capped at AVX2
          a.query_quant = mode ? KVC_QUERY_INT8 : KVC_QUERY_EXACT;
          kvc::attention::fused::set_isa_limit(mode == 2 ? 1 : 2);
          out[mode].assign(g.hq * g.hd, 0.0f);
          lse[mode].assign(g.hq, 0.0f);
          CHECK_OK(
              kvc_attention_decode(p, 0, &id, 1, q.data(), out[mode].data(), lse[mode].data(), &a));
        }
        kvc::attention::fused::set_isa_limit(2);
        const bool taken = vnni && quant && g.hd % 32 == 0;
        CHECK(out[2] == out[0] && lse[2] == lse[0]);
        if (!taken) {
          CHECK(out[1] == out[0] && lse[1] == lse[0]);
        } else {
          const float sc = 1.0f / std::sqrt(static_cast<float>(g.hd));
          double vmax = 0.0;
          for (float x : v) vmax = std::max(vmax, std::fabs(static_cast<double>(x)));
          const uint32_t grp = g.hq / g.hkv;
          for (uint32_t h = 0; h < g.hq; ++h) {
            double qmax = 0.0;
            for (uint32_t d = 0; d < g.hd; ++d)
              qmax = std::max(qmax, std::fabs(static_cast<double>(q[h * g.hd + d]) * sc));
            double bound = 0.0;  // the largest score change the query's rounding allows
            for (uint64_t t = 0; t < n; ++t) {
              double ksum = 0.0;
              for (uint32_t d = 0; d < g.hd; ++d)
                ksum += std::fabs(k[(t * g.hkv + h / grp) * g.hd + d]);
              bound = std::max(bound, qmax / 254.0 * ksum);
            }
            const double tol = 1e-5 * std::max(1.0, std::fabs(static_cast<double>(lse[0][h])));
            if (!(std::fabs(lse[1][h] - lse[0][h]) <= bound + tol))
              std::fprintf(stderr, "%s hq %u hd %u n %llu head %u: lse %g vs %g, bound %g\n",
                           st.name, g.hq, g.hd, static_cast<unsigned long long>(n), h, lse[1][h],
                           lse[0][h], bound);
            CHECK(std::fabs(lse[1][h] - lse[0][h]) <= bound + tol);
            for (uint32_t d = 0; d < g.hd; ++d)
              CHECK(std::fabs(out[1][h * g.hd + d] - out[0][h * g.hd + d]) <=
                    (std::exp(2.0 * bound) - 1.0) * vmax + 1e-5);
          }
          if (lse[1] != lse[0]) ++differed;
        }
        // Prefill never quantizes the query.
        std::vector<float> po[2];
        for (int mode = 0; mode < 2; ++mode) {
          a.query_quant = mode ? KVC_QUERY_INT8 : KVC_QUERY_EXACT;
          po[mode].assign(g.hq * g.hd, 0.0f);
          CHECK_OK(kvc_attention_prefill(p, 0, id, q.data(), 1, po[mode].data(), nullptr, &a));
        }
        CHECK(po[1] == po[0]);
        ++id;
      }
      kvc_pool_destroy(p);
    }
  if (vnni) CHECK(differed > 0);
}

// KVC_QUERY_INT8_VALUES: with symmetric int8 or int4 values (per-token
// scales) the weighted sum runs in integers: each weight p x s moves by at
// most 2^-16 of its run's largest, so an output moves by at most (the
// largest |code| / 2: 64 for int8, 4 for int4) x n x max_t(prob_t x s_t) /
// 32767 beyond KVC_QUERY_INT8's result (n tokens; prob the softmax
// probabilities, s the value scales; the check allows 2x for the int8
// query's own change of the probabilities); the lse is KVC_QUERY_INT8's to
// the bit (the softmax is unchanged). Runs of 1 to 2,048 tokens (blocks of
// 8 to 512: the int8 sums flushed every 256 tokens, the int4 ones every
// 4,096), odd counts, GQA 1 to 12. Everything else (asymmetric or f16
// values, head_dim not a multiple of 32, a capped ISA) gives
// KVC_QUERY_INT8's bytes.
KVTEST(query_int8_values_within_bound) {
  const bool vnni = kvc::attention::fused::int8_query_available();
  std::fprintf(stderr, "int8 kernels %s on this CPU\n", vnni ? "run" : "are not available");
  struct Storage {
    const char *name;
    kvc_dtype kt, vt;
    int kasym, vasym;
  };
  const Storage stor[] = {{"int8 / int8", KVC_DTYPE_INT8, KVC_DTYPE_INT8, 0, 0},
                          {"int8 asym / int8", KVC_DTYPE_INT8, KVC_DTYPE_INT8, 1, 0},
                          {"int4 / int8", KVC_DTYPE_INT4, KVC_DTYPE_INT8, 0, 0},
                          {"int8 / int8 asym", KVC_DTYPE_INT8, KVC_DTYPE_INT8, 0, 1},
                          {"int8 / int4", KVC_DTYPE_INT8, KVC_DTYPE_INT4, 0, 0},
                          {"int4 / int4", KVC_DTYPE_INT4, KVC_DTYPE_INT4, 0, 0},
                          {"int8 / int4 asym", KVC_DTYPE_INT8, KVC_DTYPE_INT4, 0, 1},
                          {"int8 / f16", KVC_DTYPE_INT8, KVC_DTYPE_F16, 0, 0}};
  const Geo shapes[] = {{1, 8, 2, 64, 16},  {1, 32, 8, 128, 16}, {1, 12, 1, 32, 8},
                        {1, 4, 4, 96, 256}, {1, 6, 2, 48, 16},   {1, 16, 2, 128, 512},
                        {1, 16, 8, 128, 16}, {1, 2, 2, 64, 16}};  // (groups of 2 and 1, 64 columns)
  int differed[2] = {0, 0};  // int8 values, int4 values: the integer sum ran and moved the output
  double worst_ratio = 0.0;
  for (const Storage &st : stor)
    for (const Geo &g : shapes) {
      kvc_codec kc = per_token_codec(st.kt, st.kasym != 0),
                vc = per_token_codec(st.vt, st.vasym != 0);
      const bool vquant = st.vt != KVC_DTYPE_F16;
      kvc_pool *p = make_pool(g, KVC_DTYPE_F16, &kc, vquant ? &vc : nullptr, 0, 256);
      uint64_t id = 1;
      for (uint64_t n : {1ull, 17ull, 100ull, 1101ull}) {
        fill(p, g, id, n);
        std::vector<float> k(n * g.hkv * g.hd), v(k.size());
        CHECK_OK(kvc_gather(p, id, 0, 0, n, k.data(), v.data(), KVC_DTYPE_F32, nullptr));
        const std::vector<float> q = randn(g.hq * g.hd, 2.0f);
        kvc_attention_params a = params(g);
        std::vector<float> out[3], lse[3];
        for (int mode = 0; mode < 3; ++mode) {  // int8 query, int8 values, values with AVX2 only
          a.query_quant = mode ? KVC_QUERY_INT8_VALUES : KVC_QUERY_INT8;
          kvc::attention::fused::set_isa_limit(mode == 2 ? 1 : 2);
          out[mode].assign(g.hq * g.hd, 0.0f);
          lse[mode].assign(g.hq, 0.0f);
          CHECK_OK(
              kvc_attention_decode(p, 0, &id, 1, q.data(), out[mode].data(), lse[mode].data(), &a));
        }
        kvc::attention::fused::set_isa_limit(2);
        std::vector<float> exact(g.hq * g.hd);
        a.query_quant = KVC_QUERY_EXACT;
        CHECK_OK(kvc_attention_decode(p, 0, &id, 1, q.data(), exact.data(), nullptr, &a));
        CHECK(out[2] == exact);  // AVX2 only: neither int8 mode runs
        CHECK(lse[1] == lse[0]);
        const bool taken = vnni && (st.vt == KVC_DTYPE_INT8 || st.vt == KVC_DTYPE_INT4) &&
                           !st.vasym && g.hd % 32 == 0;
        // int8 codes: |code| <= 128, scale max |v| / 127; int4: |nibble - 8| <= 8, max |v| / 7
        const double half_code = st.vt == KVC_DTYPE_INT4 ? 4.0 : 64.0;
        const double qmax = st.vt == KVC_DTYPE_INT4 ? 7.0 : 127.0;
        if (!taken) {
          CHECK(out[1] == out[0]);
        } else {
          std::vector<double> ref, rlse, probs;
          const float sc = 1.0f / std::sqrt(static_cast<float>(g.hd));
          const uint32_t grp = g.hq / g.hkv;
          for (uint32_t h = 0; h < g.hq; ++h) {
            // the largest probability x value scale of the head's tokens
            double wmax = 0.0;
            double mx = -1e300;
            std::vector<double> s(n);
            for (uint64_t t = 0; t < n; ++t) {
              double d = 0.0;
              for (uint32_t i = 0; i < g.hd; ++i)
                d += static_cast<double>(q[h * g.hd + i]) * k[(t * g.hkv + h / grp) * g.hd + i];
              s[t] = d * sc;
              mx = std::max(mx, s[t]);
            }
            double sum = 0.0;
            for (uint64_t t = 0; t < n; ++t) sum += std::exp(s[t] - mx);
            for (uint64_t t = 0; t < n; ++t) {
              double vm = 0.0;
              for (uint32_t i = 0; i < g.hd; ++i)
                vm = std::max(vm, std::fabs(static_cast<double>(v[(t * g.hkv + h / grp) * g.hd + i])));
              wmax = std::max(wmax, std::exp(s[t] - mx) / sum * vm / qmax);
            }
            const double bound = 2.0 * half_code * static_cast<double>(n) * wmax / 32767.0 + 1e-6;
            for (uint32_t d = 0; d < g.hd; ++d) {
              const double e = std::fabs(out[1][h * g.hd + d] - out[0][h * g.hd + d]);
              worst_ratio = std::max(worst_ratio, (e - 1e-6) / (bound - 1e-6));
              if (!(e <= bound))
                std::fprintf(stderr, "%s hq %u hd %u bs %u n %llu head %u dim %u: %g vs %g (bound %g)\n",
                             st.name, g.hq, g.hd, g.bs, static_cast<unsigned long long>(n), h, d,
                             out[1][h * g.hd + d], out[0][h * g.hd + d], bound);
              CHECK(e <= bound);
            }
          }
          if (out[1] != out[0]) ++differed[st.vt == KVC_DTYPE_INT4 ? 1 : 0];
        }
        // Prefill never quantizes.
        std::vector<float> po[2];
        for (int mode = 0; mode < 2; ++mode) {
          a.query_quant = mode ? KVC_QUERY_INT8_VALUES : KVC_QUERY_EXACT;
          po[mode].assign(g.hq * g.hd, 0.0f);
          CHECK_OK(kvc_attention_prefill(p, 0, id, q.data(), 1, po[mode].data(), nullptr, &a));
        }
        CHECK(po[1] == po[0]);
        CHECK_OK(kvc_seq_free(p, id));
        ++id;
      }
      kvc_pool_destroy(p);
    }
  std::fprintf(stderr, "largest error / bound: %.3g\n", worst_ratio);
  if (vnni) CHECK(differed[0] > 0 && differed[1] > 0);
}

// KVC_QUERY_INT8_VALUES where the weights are negative or tiny (the first
// version failed both, found by review): full-range int8 codes store a
// negative scale when a token's extreme is positive, so the weights p x s
// have either sign (rows [2, 1, 1, ...] gave 0 instead of [2, 1]); and
// values near 1e-33 or below make 32767 / max overflow f32 (the sum came
// back with its sign flipped): such runs are summed in f32. Uniform
// attention (q = 0) and random queries, 1 to 100 tokens, values scaled by 1,
// 1e-30, 1e-33, 1e-36, 1e-40 (subnormal scales), symmetric and full-range
// codes: within the bound of KVC_QUERY_INT8's output, relative to its scale.
KVTEST(query_int8_values_signed_and_tiny_weights) {
  if (!kvc::attention::fused::int8_query_available()) {
    std::fprintf(stderr, "int8 kernels not available on this CPU: nothing to check\n");
    return;
  }
  Geo g;
  g.layers = 1;
  g.hq = 4;
  g.hkv = 1;
  g.hd = 32;
  g.bs = 16;
  int cases = 0, differed[2] = {0, 0};
  for (kvc_dtype vt : {KVC_DTYPE_INT8, KVC_DTYPE_INT4})
  for (int full : {0, 1})
    for (double scale : {1.0, 1e-30, 1e-33, 1e-36, 1e-40})
      for (int uniform : {1, 0})
        for (uint64_t n : {1ull, 2ull, 17ull, 20ull, 100ull}) {
          kvc_codec c = per_token_codec(vt, false);
          c.full_range = static_cast<uint32_t>(full);
          kvc_pool *p = make_pool(g, KVC_DTYPE_F16, &c, &c, 0, 64);
          const uint64_t id = 1;
          CHECK_OK(kvc_seq_create(p, id));
          CHECK_OK(kvc_seq_reserve(p, id, n, nullptr));
          std::vector<float> k = randn(n * g.hd), v(n * g.hd);
          for (uint64_t t = 0; t < n; ++t)
            for (uint32_t d = 0; d < g.hd; ++d)
              v[t * g.hd + d] = static_cast<float>(
                  (uniform ? (d == 0 ? 2.0 : 1.0) : (t % 3 ? 1.0 : -1.0) * (1.0 + 0.1 * d)) *
                  scale);
          CHECK_OK(kvc_append(p, id, 0, 0, n, k.data(), v.data(), KVC_DTYPE_F32));
          std::vector<float> q = uniform ? std::vector<float>(g.hq * g.hd, 0.0f) : randn(g.hq * g.hd);
          kvc_attention_params a = params(g);
          std::vector<float> out[2];
          for (int mode = 0; mode < 2; ++mode) {
            a.query_quant = mode ? KVC_QUERY_INT8_VALUES : KVC_QUERY_INT8;
            out[mode].assign(g.hq * g.hd, 0.0f);
            CHECK_OK(kvc_attention_decode(p, 0, &id, 1, q.data(), out[mode].data(), nullptr, &a));
          }
          double vmax = 0.0, omax = 0.0;
          for (float x : v) vmax = std::max(vmax, std::fabs(static_cast<double>(x)));
          for (float x : out[0]) omax = std::max(omax, std::fabs(static_cast<double>(x)));
          // every weight within 2^-16 of the largest (prob <= 1, value scale <= vmax / qmax): the
          // output within half_code x n x vmax / qmax / 32767 of the f32 sum, and 1e-6 of its scale
          const double half_code = vt == KVC_DTYPE_INT4 ? 4.0 : 64.0;
          const double qmax = vt == KVC_DTYPE_INT4 ? 7.0 : 127.0;
          const double bound =
              half_code * static_cast<double>(n) * vmax / qmax / 32767.0 + 1e-6 * omax;
          for (size_t i = 0; i < out[0].size(); ++i) {
            const double e = std::fabs(static_cast<double>(out[1][i]) - out[0][i]);
            if (!(e <= bound))
              std::fprintf(stderr, "%s full %d scale %g uniform %d n %llu [%zu]: %g vs %g (bound %g)\n",
                           vt == KVC_DTYPE_INT4 ? "int4" : "int8", full, scale, uniform, static_cast<unsigned long long>(n), i, out[1][i],
                           out[0][i], bound);
            CHECK(e <= bound);
          }
          if (uniform && scale == 1.0) CHECK(std::fabs(out[1][0] - 2.0f) < 1e-3f);
          if (!uniform && scale == 1.0 && out[1] != out[0])
            ++differed[vt == KVC_DTYPE_INT4 ? 1 : 0];  // the integer sum ran
          ++cases;
          kvc_pool_destroy(p);
        }
  std::fprintf(stderr, "%d cases\n", cases);
  CHECK(differed[0] > 0 && differed[1] > 0);
}


// The int8 query's codes, scales and sums (fused::quantize_query) and their
// int4-key order (split_query_nibbles): the AVX-512 helpers give the scalar
// rule's bytes, for head_dim 16 to 256, a zero head, ties at .5 (rounded to
// even) and values that clamp.
KVTEST(query_int8_quantize_paths_agree) {
  namespace fu = kvc::attention::fused;
  if (fu::set_isa_limit(2) < 2 || !fu::int8_query_available()) {
    std::fprintf(stderr, "no AVX-512 VNNI here: the scalar rule alone\n");
    return;
  }
  for (uint64_t hd : {16ull, 32ull, 48ull, 64ull, 128ull, 192ull, 256ull}) {
    const uint64_t hq = 5;
    std::vector<float> q = randn(hq * hd, 3.0f);
    std::fill(q.begin() + hd, q.begin() + 2 * hd, 0.0f);  // head 1: all zero
    for (uint64_t d = 0; d < hd; ++d)  // head 2: halves of the step (ties) and the maximum
      q[2 * hd + d] = d == 0 ? 127.0f : static_cast<float>(d % 9) - 4.5f;
    q[3 * hd + hd - 1] = -1e30f;  // head 3: one huge value, the rest rounded to 0
    std::vector<int8_t> codes[2], nib[2];
    std::vector<float> scale[2];
    std::vector<int32_t> sum[2];
    uint64_t chunk[2] = {0, 0};
    for (int path = 0; path < 2; ++path) {
      fu::set_isa_limit(path ? 2 : 1);
      codes[path].assign(hq * hd, 99);
      scale[path].assign(hq, -1.0f);
      sum[path].assign(hq, -1);
      fu::quantize_query(q.data(), hq, hd, codes[path].data(), scale[path].data(),
                         sum[path].data());
      if (hd % 64 == 0) {
        nib[path].assign(hq * hd, 99);
        chunk[path] = fu::split_query_nibbles(codes[path].data(), hq, hd, nib[path].data());
      }
    }
    fu::set_isa_limit(2);
    CHECK(codes[1] == codes[0] && scale[1] == scale[0] && sum[1] == sum[0]);
    CHECK(nib[1] == nib[0] && chunk[1] == chunk[0]);
    // the scalar rule itself, by hand for head 2: 127 -> 127 (scale 1), -4.5 -> -4, 0.5 -> 0
    CHECK(scale[0][2] == 1.0f && codes[0][2 * hd] == 127);
    CHECK(codes[0][2 * hd + 9] == -4 && codes[0][2 * hd + 5] == 0);
    CHECK(scale[0][1] == 0.0f && sum[0][1] == 0 && codes[0][hd] == 0);
    int32_t s3 = 0;
    for (uint64_t d = 0; d < hd; ++d) s3 += codes[0][3 * hd + d];
    CHECK(s3 == -127 && sum[0][3] == -127);
    if (hd % 64 == 0) {
      const uint64_t half = chunk[0] / 2;
      CHECK(chunk[0] == (hd % 128 == 0 ? 128u : 64u));
      for (uint64_t b = 0; b < hq * hd; b += chunk[0])
        for (uint64_t i = 0; i < half; ++i) {
          CHECK(nib[0][b + i] == codes[0][b + 2 * i]);
          CHECK(nib[0][b + half + i] == codes[0][b + 2 * i + 1]);
        }
    }
  }
}

// The two int8 modes share one softmax (softmax_pack, heads 16 at a time):
// the log-sum-exp and the observed scores bit for bit, the outputs within
// the integer sum's bound, for GQA groups of 17 and 20 (a second chunk of
// heads), float keys with int8 values, asymmetric keys and a residual
// window of f16 tokens; and a group of 20 whose heads 16-19 put all their
// weight on token 0 (later runs' weights near e^-75 x the value scale, below the packing's
// 2^-100: those runs of that KV head fall back to the f32 sum after heads
// 0-15 were packed).
KVTEST(query_int8_modes_share_softmax) {
  if (!kvc::attention::fused::int8_query_available()) {
    std::fprintf(stderr, "int8 kernels not available on this CPU: nothing to check\n");
    return;
  }
  struct Storage {
    kvc_dtype kt, vt;
    int kasym;
    uint32_t residual;
  };
  const Storage stor[] = {{KVC_DTYPE_INT8, KVC_DTYPE_INT8, 0, 0},
                          {KVC_DTYPE_INT4, KVC_DTYPE_INT4, 0, 0},
                          {KVC_DTYPE_INT8, KVC_DTYPE_INT4, 1, 0},
                          {KVC_DTYPE_F16, KVC_DTYPE_INT8, 0, 0},
                          {KVC_DTYPE_INT4, KVC_DTYPE_INT8, 0, 32}};
  const Geo shapes[] = {{1, 34, 2, 64, 16}, {1, 20, 1, 128, 16}, {1, 40, 2, 32, 8}};
  int cases = 0;
  for (const Storage &st : stor)
    for (const Geo &g : shapes)
      for (int steep : {0, 1}) {
        if (steep && g.hq / g.hkv != 20) continue;
        kvc_codec kc = per_token_codec(st.kt, st.kasym != 0),
                  vc = per_token_codec(st.vt, false);
        const bool kq = st.kt != KVC_DTYPE_F16;
        kvc_pool *p =
            make_pool(g, KVC_DTYPE_F16, kq ? &kc : nullptr, &vc, st.residual, 512);
        const uint64_t n = 300, id = 1;
        CHECK_OK(kvc_seq_create(p, id));
        CHECK_OK(kvc_seq_reserve(p, id, n, nullptr));
        std::vector<float> k = randn(n * g.hkv * g.hd), v = randn(n * g.hkv * g.hd);
        std::vector<float> q = randn(g.hq * g.hd, 0.5f);
        const uint32_t grp = g.hq / g.hkv;
        if (steep) {  // token 0's key along +1 / -1 signs, heads 16-19 of each group along it
          for (uint32_t kh = 0; kh < g.hkv; ++kh)
            for (uint32_t d = 0; d < g.hd; ++d) k[kh * g.hd + d] = d % 2 ? 4.0f : -4.0f;
          const float a = 75.0f * std::sqrt(static_cast<float>(g.hd)) / (4.0f * g.hd);  // score 75
          for (uint32_t h = 0; h < g.hq; ++h)
            if (h % grp >= 16)
              for (uint32_t d = 0; d < g.hd; ++d) q[h * g.hd + d] = d % 2 ? a : -a;
        }
        CHECK_OK(kvc_append(p, id, 0, 0, n, k.data(), v.data(), KVC_DTYPE_F32));
        kvc_attention_params a = params(g);
        a.observe = KVC_OBSERVE_REPLACE;
        std::vector<float> out[2], lse[2], sc[2];
        for (int mode = 0; mode < 2; ++mode) {
          a.query_quant = mode ? KVC_QUERY_INT8_VALUES : KVC_QUERY_INT8;
          out[mode].assign(g.hq * g.hd, 0.0f);
          lse[mode].assign(g.hq, 0.0f);
          sc[mode].assign(n * g.hkv, 0.0f);
          CHECK_OK(kvc_attention_decode(p, 0, &id, 1, q.data(), out[mode].data(), lse[mode].data(),
                                        &a));
          CHECK_OK(kvc_seq_scores(p, id, 0, sc[mode].data(), n));
        }
        CHECK(lse[1] == lse[0]);
        CHECK(sc[1] == sc[0]);
        // each weight within 2^-16 of its run's largest: an output moves by at most
        // C x n x max |v| / qmax / 32767 (C half the code range)
        double vmax = 0.0;
        for (float x : v) vmax = std::max(vmax, std::fabs(static_cast<double>(x)));
        const double half_code = st.vt == KVC_DTYPE_INT4 ? 4.0 : 64.0;
        const double qmax = st.vt == KVC_DTYPE_INT4 ? 7.0 : 127.0;
        const double bound = half_code * static_cast<double>(n) * vmax / qmax / 32767.0;
        bool moved = false;
        for (size_t i = 0; i < out[0].size(); ++i) {
          CHECK(std::isfinite(out[1][i]));
          CHECK(std::fabs(static_cast<double>(out[1][i]) - out[0][i]) <= bound);
          moved = moved || out[1][i] != out[0][i];
        }
        CHECK(moved);  // the integer sum ran
        if (steep) {  // heads 16-19: token 0's stored value (its weight 1 within 1e-25)
          std::vector<float> kg(n * g.hkv * g.hd), vg(kg.size());
          CHECK_OK(kvc_gather(p, id, 0, 0, n, kg.data(), vg.data(), KVC_DTYPE_F32, nullptr));
          for (uint32_t h = 0; h < g.hq; ++h)
            if (h % grp >= 16)
              for (uint32_t d = 0; d < g.hd; ++d) {
                const float v0 = vg[(h / grp) * g.hd + d];
                CHECK(std::fabs(out[1][h * g.hd + d] - v0) <= 1e-4f * (1.0f + std::fabs(v0)));
              }
        }
        ++cases;
        kvc_pool_destroy(p);
      }
  CHECK(cases == 25);
}

// KVC_QUERY_INT8 over int8 keys on the AMX tiles (fused_amx.cpp) against the
// VNNI kernel: the same bytes (outputs, log-sum-exp, observed scores) for
// symmetric and asymmetric int8 keys, head_dim 64 to 256 and one above the
// tiles' 256, GQA groups 1 to 16 and 17 (beyond the tiles), 1 to 1,100
// tokens (bands of 16 on the tiles, shorter ones on VNNI in the same run), both
// int8 modes; one thread observing, and 2 and 3 threads without observing
// (an observing decode runs on the calling thread only), 1,100 tokens so the
// threads split the sequence. Groups of 1 and 2 query heads of one KV head
// leave a piece's padded heads past the score rows, 12 heads take 3 pieces.
// Skipped (exit 77) where the CPU or the OS gives no AMX.
KVTEST(query_int8_amx_paths_agree) {
  namespace fu = kvc::attention::fused;
  if (!fu::set_amx(true)) {
    std::fprintf(stderr, "no AMX-INT8 here (CPU, OS permission or int8 kernels): skipped\n");
    std::exit(77);
  }
  const Geo shapes[] = {{1, 8, 2, 64, 16},   {1, 32, 8, 128, 16}, {1, 3, 3, 192, 16},
                        {1, 16, 2, 256, 32}, {1, 10, 2, 128, 16}, {1, 16, 1, 64, 16},
                        {1, 17, 1, 64, 16},  {1, 4, 1, 320, 16}, {1, 1, 1, 128, 16},
                        {1, 2, 2, 64, 16},   {1, 24, 2, 192, 32}};
  int cases = 0;
  uint64_t bands = 0;
  for (int asym : {0, 1})
    for (const Geo &g : shapes)
      for (uint64_t n : {1ull, 15ull, 16ull, 17ull, 40ull, 300ull, 1100ull}) {
        kvc_codec kc = per_token_codec(KVC_DTYPE_INT8, asym != 0),
                  vc = per_token_codec(KVC_DTYPE_INT8, false);
        kvc_pool *p = make_pool(g, KVC_DTYPE_F16, &kc, &vc, 0, 1024);
        const uint64_t id = 1;
        fill(p, g, id, n);
        const std::vector<float> q = randn(g.hq * g.hd, 2.0f);
        kvc_attention_params a = params(g);
        for (int mode = 0; mode < 2; ++mode)
          for (uint32_t threads : {1u, 2u, 3u}) {
            a.query_quant = mode ? KVC_QUERY_INT8_VALUES : KVC_QUERY_INT8;
            a.num_threads = threads;
            a.observe = threads == 1 ? KVC_OBSERVE_REPLACE : KVC_OBSERVE_NONE;
            std::vector<float> out[2], lse[2], sc[2];
            for (int amx = 0; amx < 2; ++amx) {
              fu::set_amx(amx == 1);
              const uint64_t before = fu::amx_bands_here();
              out[amx].assign(g.hq * g.hd, -1.0f);
              lse[amx].assign(g.hq, -1.0f);
              sc[amx].assign(n * g.hkv, -1.0f);
              CHECK_OK(kvc_attention_decode(p, 0, &id, 1, q.data(), out[amx].data(),
                                            lse[amx].data(), &a));
              if (threads == 1) CHECK_OK(kvc_seq_scores(p, id, 0, sc[amx].data(), n));
              if (amx && threads == 1) bands += fu::amx_bands_here() - before;
              if (!amx) CHECK(fu::amx_bands_here() == before);
            }
            CHECKF(std::memcmp(out[0].data(), out[1].data(), out[0].size() * 4) == 0 &&
                       std::memcmp(lse[0].data(), lse[1].data(), lse[0].size() * 4) == 0 &&
                       std::memcmp(sc[0].data(), sc[1].data(), sc[0].size() * 4) == 0,
                   "asym %d hq %u hkv %u hd %u n %llu mode %d threads %u", asym, g.hq, g.hkv,
                   g.hd, static_cast<unsigned long long>(n), mode, threads);
            ++cases;
          }
        kvc_pool_destroy(p);
      }
  fu::set_amx(true);
  std::fprintf(stderr, "%d cases, %llu bands on the tiles\n", cases,
               static_cast<unsigned long long>(bands));
  CHECK(bands > 0);
}

int main(int argc, char **argv) {
  return kvtest_main(argc, argv);
}

// Per-group scales (the fused kernels dequantize such parts in registers,
// with the exact query): keys with per-group scales, or Hadamard-rotated
// ones, give KVC_QUERY_EXACT's bytes in both int8 modes; per-token int8 keys beside per-group values keep
// KVC_QUERY_INT8's integer scores (within its bound, some result differs
// where the CPU has VNNI), and KVC_QUERY_INT8_VALUES, whose integer sum
// takes per-token values only, gives KVC_QUERY_INT8's bytes there.
KVTEST(query_int8_per_group_parts) {
  const bool vnni = kvc::attention::fused::int8_query_available();
  const Geo g{1, 8, 2, 128, 16};
  auto group_codec = [](kvc_dtype dt, bool asym, uint32_t group) {
    kvc_codec c = per_token_codec(dt, asym);
    c.granularity = KVC_SCALE_PER_GROUP;
    c.group_size = group;
    return c;
  };
  int differed = 0;
  // keys: 0 per-token int8, 1 int4 per group of 32, 2 per-token int8
  // Hadamard-rotated (blocks of 32: scored against the rotated query, exactly)
  for (int keys = 0; keys < 3; ++keys)
    for (int asym = 0; asym < 2; ++asym) {
      kvc_codec kc = keys == 1 ? group_codec(KVC_DTYPE_INT4, asym != 0, 32)
                               : per_token_codec(KVC_DTYPE_INT8, asym != 0);
      if (keys == 2) {
        kc.rotation = KVC_ROTATION_HADAMARD;
        kc.rotation_block = 32;
      }
      const bool keys_exact = keys != 0;
      const kvc_codec vc = group_codec(KVC_DTYPE_INT4, asym != 0, 16);
      kvc_pool *p = make_pool(g, KVC_DTYPE_F16, &kc, &vc);
      uint64_t id = 1;
      for (uint64_t n : {17ull, 100ull}) {
        fill(p, g, id, n);
        std::vector<float> k(n * g.hkv * g.hd), v(k.size());
        CHECK_OK(kvc_gather(p, id, 0, 0, n, k.data(), v.data(), KVC_DTYPE_F32, nullptr));
        const std::vector<float> q = randn(g.hq * g.hd, 2.0f);
        kvc_attention_params a = params(g);
        std::vector<float> out[3], lse[3];
        const kvc_query_quant modes[3] = {KVC_QUERY_EXACT, KVC_QUERY_INT8, KVC_QUERY_INT8_VALUES};
        for (int mode = 0; mode < 3; ++mode) {
          a.query_quant = modes[mode];
          out[mode].assign(g.hq * g.hd, 0.0f);
          lse[mode].assign(g.hq, 0.0f);
          CHECK_OK(
              kvc_attention_decode(p, 0, &id, 1, q.data(), out[mode].data(), lse[mode].data(), &a));
        }
        std::vector<double> ro, rl;
        reference(g, q.data(), k, v, n, 1.0f / std::sqrt(static_cast<float>(g.hd)), ro, rl,
                  nullptr);
        CHECK(rel_err(out[0].data(), ro) <= 1e-5);
        CHECK(out[2] == out[1] && lse[2] == lse[1]);
        if (keys_exact) {
          CHECK(out[1] == out[0] && lse[1] == lse[0]);
        } else {
          float qmax = 0.0f;
          for (float x : q) qmax = std::max(qmax, std::fabs(x) / std::sqrt(float(g.hd)));
          double ksum_max = 0.0;
          for (uint64_t t = 0; t < n * g.hkv; ++t) {
            double ks = 0.0;
            for (uint32_t d = 0; d < g.hd; ++d) ks += std::fabs(k[t * g.hd + d]);
            ksum_max = std::max(ksum_max, ks);
          }
          const double bound = qmax / 254.0 * ksum_max;
          double vmax = 0.0;
          for (float x : v) vmax = std::max(vmax, std::fabs(static_cast<double>(x)));
          for (uint32_t h = 0; h < g.hq; ++h) {
            CHECK(std::fabs(lse[1][h] - lse[0][h]) <=
                  bound + 1e-5 * std::max(1.0, std::fabs(static_cast<double>(lse[0][h]))));
            // (the values too: a wrong zero point of the per-group values moves these)
            for (uint32_t d = 0; d < g.hd; ++d)
              CHECK(std::fabs(out[1][h * g.hd + d] - out[0][h * g.hd + d]) <=
                    (std::exp(2.0 * bound) - 1.0) * vmax + 1e-5);
          }
          if (lse[1] != lse[0]) ++differed;
        }
        ++id;
      }
      kvc_pool_destroy(p);
    }
  if (vnni) CHECK(differed > 0);
}
