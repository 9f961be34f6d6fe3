// Attention over the paged cache (kvc_attention_decode / _prefill): against a
// dense float64 reference, over every storage codec, with batches of ragged
// lengths, observation of attention mass, and bad input.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <atomic>
#include <thread>
#include <vector>

#include "../whitebox.h"
#include "api/internal.h"
#include "attention/fused.h"

#include "attention_test_util.h"

// Decode over f32 storage matches float64 within 1e-5 (relative), lengths 0..70.
KVTEST(decode_matches_reference) {
  Geo g;
  kvc_pool *p = make_pool(g);
  const float scale = 1.0f / std::sqrt(static_cast<float>(g.hd));
  uint64_t id = 1;
  for (uint64_t n : {0ull, 1ull, 2ull, 15ull, 16ull, 17ull, 33ull, 70ull}) {
    Seq s = fill(p, g, id, n);
    for (uint32_t l = 0; l < g.layers; ++l) {
      std::vector<float> q = randn(g.hq * g.hd, 2.0f), out(g.hq * g.hd, 7.0f), lse(g.hq);
      kvc_attention_params a = params(g);
      CHECK_OK(kvc_attention_decode(p, l, &id, 1, q.data(), out.data(), lse.data(), &a));
      std::vector<double> ro, rl;
      reference(g, q.data(), s.k[l], s.v[l], n, scale, ro, rl);
      CHECK(rel_err(out.data(), ro) <= 1e-5);
      for (uint32_t h = 0; h < g.hq; ++h) {
        if (n == 0)
          CHECK(std::isinf(lse[h]) && lse[h] < 0);
        else
          CHECK_NEAR(lse[h], rl[h], 1e-5 * std::max(1.0, std::fabs(rl[h])));
      }
      if (n == 0)
        for (float x : out) CHECK(x == 0.0f);
    }
    ++id;
  }
  kvc_pool_destroy(p);
}

// Ragged batch [0, 17, 16] at block_size 16: each sequence as when run alone,
// in any order; the empty one gives zeros and -inf, never NaN.
KVTEST(decode_ragged_batch) {
  Geo g;
  g.layers = 1;
  kvc_pool *p = make_pool(g);
  fill(p, g, 10, 0);
  fill(p, g, 11, 17);
  fill(p, g, 12, 16);
  std::vector<float> q = randn(3 * g.hq * g.hd);
  const size_t row = g.hq * g.hd;
  kvc_attention_params a = params(g);
  std::vector<float> alone(3 * row), alone_lse(3 * g.hq);
  for (int i = 0; i < 3; ++i) {
    const uint64_t id = 10 + i;
    CHECK_OK(kvc_attention_decode(p, 0, &id, 1, q.data() + i * row, alone.data() + i * row,
                                  alone_lse.data() + i * g.hq, &a));
  }
  const uint64_t ids_a[3] = {10, 11, 12};
  std::vector<float> out(3 * row), lse(3 * g.hq);
  CHECK_OK(kvc_attention_decode(p, 0, ids_a, 3, q.data(), out.data(), lse.data(), &a));
  CHECK(std::memcmp(out.data(), alone.data(), out.size() * 4) == 0);
  CHECK(std::memcmp(lse.data(), alone_lse.data(), lse.size() * 4) == 0);
  // Order [17, 0, 16]: permute the queries the same way.
  const uint64_t ids_b[3] = {11, 10, 12};
  std::vector<float> qb(3 * row), outb(3 * row), lseb(3 * g.hq);
  const int perm[3] = {1, 0, 2};
  for (int i = 0; i < 3; ++i) std::memcpy(qb.data() + i * row, q.data() + perm[i] * row, row * 4);
  CHECK_OK(kvc_attention_decode(p, 0, ids_b, 3, qb.data(), outb.data(), lseb.data(), &a));
  for (int i = 0; i < 3; ++i) {
    CHECK(std::memcmp(outb.data() + i * row, alone.data() + perm[i] * row, row * 4) == 0);
    CHECK(std::memcmp(lseb.data() + i * g.hq, alone_lse.data() + perm[i] * g.hq, g.hq * 4) == 0);
  }
  for (size_t i = 0; i < row; ++i) CHECK(out[i] == 0.0f);
  for (uint32_t h = 0; h < g.hq; ++h) CHECK(std::isinf(lse[h]) && lse[h] < 0);
  for (float x : out) CHECK(!std::isnan(x));
  kvc_pool_destroy(p);
}

// Prefill: query i of the chunk sees tokens [0, n - n_q + i], matching the
// reference row by row; a chunk of 1 equals decode.
KVTEST(prefill_causal) {
  Geo g;
  g.hq = 4;
  g.hkv = 4;
  g.hd = 8;
  g.bs = 4;
  kvc_pool *p = make_pool(g);
  const uint64_t n = 45, n_q = 29;
  Seq s = fill(p, g, 3, n);
  const float scale = 0.3f;
  std::vector<float> q = randn(n_q * g.hq * g.hd), out(n_q * g.hq * g.hd), lse(n_q * g.hq);
  kvc_attention_params a = params(g);
  a.scale = scale;
  CHECK_OK(kvc_attention_prefill(p, 1, 3, q.data(), n_q, out.data(), lse.data(), &a));
  for (uint64_t i = 0; i < n_q; ++i) {
    std::vector<double> ro, rl;
    reference(g, q.data() + i * g.hq * g.hd, s.k[1], s.v[1], n - n_q + i + 1, scale, ro, rl);
    CHECK(rel_err(out.data() + i * g.hq * g.hd, ro) <= 1e-5);
    for (uint32_t h = 0; h < g.hq; ++h)
      CHECK_NEAR(lse[i * g.hq + h], rl[h], 1e-5 * std::max(1.0, std::fabs(rl[h])));
  }
  std::vector<float> d(g.hq * g.hd), dl(g.hq);
  const uint64_t id = 3;
  const float *last = q.data() + (n_q - 1) * g.hq * g.hd;
  CHECK_OK(kvc_attention_decode(p, 1, &id, 1, last, d.data(), dl.data(), &a));
  std::vector<float> p1(g.hq * g.hd), l1(g.hq);
  CHECK_OK(kvc_attention_prefill(p, 1, 3, last, 1, p1.data(), l1.data(), &a));
  CHECK(std::memcmp(d.data(), p1.data(), d.size() * 4) == 0);
  // More queries than tokens: out of range, nothing written.
  std::vector<float> big_q(46 * g.hq * g.hd, 0.5f), big_out(46 * g.hq * g.hd, 9.0f);
  CHECK_STATUS(kvc_attention_prefill(p, 1, 3, big_q.data(), 46, big_out.data(), nullptr, &a),
               KVC_ERR_OUT_OF_RANGE);
  for (float x : big_out) CHECK(x == 9.0f);
  kvc_pool_destroy(p);
}

// Every codec and the residual window: attention equals the float64 reference
// over the dequantized K/V the pool returns (kvc_gather), within 1e-5.
KVTEST(codecs_match_dequantized) {
  Geo g;
  g.layers = 1;
  g.hq = 8;
  g.hkv = 2;
  g.hd = 32;
  struct Case {
    const char *name;
    kvc_dtype plain;
    kvc_dtype dt;
    kvc_granularity gran;
    int asym;
    int hadamard;
    uint32_t residual;
  };
  const Case cases[] = {
      {"f16", KVC_DTYPE_F16, KVC_DTYPE_F16, KVC_SCALE_NONE, 0, 0, 0},
      {"bf16", KVC_DTYPE_BF16, KVC_DTYPE_BF16, KVC_SCALE_NONE, 0, 0, 0},
      {"int8 per-token", KVC_DTYPE_F16, KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0, 0},
      {"int4 group", KVC_DTYPE_F16, KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 0, 0, 0},
      {"int4 hadamard", KVC_DTYPE_F16, KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 0, 1, 0},
      {"int2 asym", KVC_DTYPE_F16, KVC_DTYPE_INT2, KVC_SCALE_PER_GROUP, 1, 0, 0},
      {"int3 group", KVC_DTYPE_F16, KVC_DTYPE_INT3, KVC_SCALE_PER_GROUP, 0, 0, 0},
      {"int3 asym hadamard", KVC_DTYPE_F16, KVC_DTYPE_INT3, KVC_SCALE_PER_GROUP, 1, 1, 0},
      {"fp8 e4m3", KVC_DTYPE_F16, KVC_DTYPE_FP8_E4M3, KVC_SCALE_PER_TOKEN, 0, 0, 0},
      {"kivi int4 + residual", KVC_DTYPE_F16, KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 1, 0, 20},
  };
  for (const Case &c : cases) {
    kvc_codec codec;
    kvc_codec_init(&codec);
    codec.dtype = c.dt;
    codec.granularity = c.gran;
    codec.group_size = 16;
    codec.asymmetric = static_cast<uint32_t>(c.asym);
    codec.rotation = c.hadamard ? KVC_ROTATION_HADAMARD : KVC_ROTATION_NONE;
    const bool q = c.gran != KVC_SCALE_NONE;
    kvc_pool *p = make_pool(g, c.plain, q ? &codec : nullptr, q ? &codec : nullptr, c.residual);
    const uint64_t n = 57;
    fill(p, g, 1, n);
    std::vector<float> k(n * g.hkv * g.hd), v(k.size());
    CHECK_OK(kvc_gather(p, 1, 0, 0, n, k.data(), v.data(), KVC_DTYPE_F32, nullptr));
    std::vector<float> qv = randn(g.hq * g.hd), out(g.hq * g.hd), lse(g.hq);
    kvc_attention_params a = params(g);
    const uint64_t id = 1;
    CHECK_OK(kvc_attention_decode(p, 0, &id, 1, qv.data(), out.data(), lse.data(), &a));
    std::vector<double> ro, rl;
    reference(g, qv.data(), k, v, n, 1.0f / std::sqrt(32.0f), ro, rl);
    const double e = rel_err(out.data(), ro);
    if (!(e <= 1e-5)) std::fprintf(stderr, "%s: relative error %g\n", c.name, e);
    CHECK(e <= 1e-5);
    kvc_pool_destroy(p);
  }
}

// f16 / bf16 queries and outputs: the same result as f32 within their rounding.
KVTEST(half_precision_io) {
  Geo g;
  g.layers = 1;
  kvc_pool *p = make_pool(g, KVC_DTYPE_F16);
  fill(p, g, 5, 40);
  std::vector<float> q = randn(g.hq * g.hd);
  std::vector<uint16_t> qh(q.size()), oh(q.size());
  CHECK_OK(kvc_convert(q.data(), KVC_DTYPE_F32, qh.data(), KVC_DTYPE_F16, q.size()));
  std::vector<float> qr(q.size());
  CHECK_OK(kvc_convert(qh.data(), KVC_DTYPE_F16, qr.data(), KVC_DTYPE_F32, q.size()));
  kvc_attention_params a = params(g);
  const uint64_t id = 5;
  std::vector<float> ref(q.size()), got(q.size());
  CHECK_OK(kvc_attention_decode(p, 0, &id, 1, qr.data(), ref.data(), nullptr, &a));
  a.q_dtype = KVC_DTYPE_F16;
  a.out_dtype = KVC_DTYPE_BF16;
  CHECK_OK(kvc_attention_decode(p, 0, &id, 1, qh.data(), oh.data(), nullptr, &a));
  CHECK_OK(kvc_convert(oh.data(), KVC_DTYPE_BF16, got.data(), KVC_DTYPE_F32, q.size()));
  for (size_t i = 0; i < q.size(); ++i)
    CHECK_NEAR(got[i], ref[i], std::fabs(ref[i]) / 128.0 + 1e-6);
  kvc_pool_destroy(p);
}

// Observation: accumulated scores equal the reference probabilities summed
// over each KV head's query heads; replace mode keeps only the last call;
// prefill observes only rows from observe_from on.
KVTEST(observe_scores) {
  Geo g;
  g.layers = 1;
  kvc_pool *p = make_pool(g);
  const uint64_t n = 23, id = 4;
  Seq s = fill(p, g, id, n);
  kvc_attention_params a = params(g);
  a.observe = KVC_OBSERVE_ACCUMULATE;
  std::vector<double> total(n * g.hkv, 0.0);
  std::vector<float> out(g.hq * g.hd);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> q = randn(g.hq * g.hd);
    CHECK_OK(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), nullptr, &a));
    std::vector<double> ro, rl, pr;
    reference(g, q.data(), s.k[0], s.v[0], n, 1.0f / 4.0f, ro, rl, &pr);
    for (size_t i = 0; i < total.size(); ++i) total[i] += pr[i];
  }
  std::vector<float> sc(n * g.hkv);
  CHECK_OK(kvc_seq_scores(p, id, 0, sc.data(), n));
  for (size_t i = 0; i < sc.size(); ++i) CHECK_NEAR(sc[i], total[i], 1e-5);
  double sum = 0;
  for (float x : sc) sum += x;
  CHECK_NEAR(sum, 3.0 * g.hq, 1e-3);  // each query head's probabilities sum to 1
  // Replace: only the last call's.
  a.observe = KVC_OBSERVE_REPLACE;
  std::vector<float> q = randn(g.hq * g.hd);
  CHECK_OK(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), nullptr, &a));
  std::vector<double> ro, rl, pr;
  reference(g, q.data(), s.k[0], s.v[0], n, 0.25f, ro, rl, &pr);
  CHECK_OK(kvc_seq_scores(p, id, 0, sc.data(), n));
  for (size_t i = 0; i < sc.size(); ++i) CHECK_NEAR(sc[i], pr[i], 1e-5);
  // Prefill observing the last 5 rows of a 9-row chunk.
  a.observe = KVC_OBSERVE_REPLACE;
  a.observe_from = 4;
  std::vector<float> qc = randn(9 * g.hq * g.hd), oc(9 * g.hq * g.hd);
  CHECK_OK(kvc_attention_prefill(p, 0, id, qc.data(), 9, oc.data(), nullptr, &a));
  std::vector<double> want(n * g.hkv, 0.0);
  for (uint64_t i = 4; i < 9; ++i) {
    reference(g, qc.data() + i * g.hq * g.hd, s.k[0], s.v[0], n - 9 + i + 1, 0.25f, ro, rl, &pr);
    for (size_t t = 0; t < pr.size(); ++t) want[t] += pr[t];
  }
  CHECK_OK(kvc_seq_scores(p, id, 0, sc.data(), n));
  for (size_t i = 0; i < sc.size(); ++i) CHECK_NEAR(sc[i], want[i], 1e-5);
  // Scores from the engine's own kernels.
  std::vector<float> mine(n * g.hkv, 0.5f);
  CHECK_OK(kvc_seq_observe_scores(p, id, 0, mine.data(), n, 0));
  CHECK_OK(kvc_seq_observe_scores(p, id, 0, mine.data(), n, 1));
  CHECK_OK(kvc_seq_scores(p, id, 0, sc.data(), n));
  for (float x : sc) CHECK(x == 1.0f);
  mine[3] = -1.0f;
  CHECK_STATUS(kvc_seq_observe_scores(p, id, 0, mine.data(), n, 1), KVC_ERR_NON_FINITE);
  mine[3] = std::numeric_limits<float>::quiet_NaN();
  CHECK_STATUS(kvc_seq_observe_scores(p, id, 0, mine.data(), n, 1), KVC_ERR_NON_FINITE);
  CHECK_OK(kvc_seq_scores(p, id, 0, sc.data(), n));
  for (float x : sc) CHECK(x == 1.0f);  // nothing changed
  CHECK_STATUS(kvc_seq_scores(p, id, 0, sc.data(), n - 1), KVC_ERR_BUFFER_TOO_SMALL);
  CHECK(kvc::api::core_pool(p).check_invariants().empty());
  kvc_pool_destroy(p);
}

// Threads: sequences spread over threads and long sequences split into token
// ranges merged by log-sum-exp give the single-thread result within 1e-5.
KVTEST(threads_match_single) {
  Geo g;
  g.layers = 1;
  g.hd = 64;
  kvc_pool *p = make_pool(g, KVC_DTYPE_F16, nullptr, nullptr, 0, 1024);
  // 9,000 tokens x 8 heads x 64: enough work for two threads (attention.cpp's kMinWork).
  const uint64_t lens[5] = {0, 17, 16, 700, 9000};
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 5; ++i) {
    fill(p, g, 100 + i, lens[i]);
    ids.push_back(100 + i);
  }
  const size_t row = g.hq * g.hd;
  kvc_attention_params a = params(g);
  for (size_t batch : {size_t(1), size_t(2), size_t(5)}) {
    const uint64_t *first = batch == 1 ? &ids[4] : batch == 2 ? &ids[3] : ids.data();
    std::vector<float> q = randn(batch * row), one(batch * row), lse1(batch * g.hq);
    a.num_threads = 1;
    CHECK_OK(kvc_attention_decode(p, 0, first, batch, q.data(), one.data(), lse1.data(), &a));
    for (uint32_t t : {2u, 3u, 8u}) {
      std::vector<float> many(batch * row, 5.0f), lsem(batch * g.hq);
      a.num_threads = t;
      CHECK_OK(kvc_attention_decode(p, 0, first, batch, q.data(), many.data(), lsem.data(), &a));
      for (size_t i = 0; i < many.size(); ++i)
        CHECK_NEAR(many[i], one[i], 1e-5 * std::max(1.0f, std::fabs(one[i])));
      for (size_t i = 0; i < lsem.size(); ++i) {
        if (std::isinf(lse1[i]))
          CHECK(std::isinf(lsem[i]) && lsem[i] < 0);
        else
          CHECK_NEAR(lsem[i], lse1[i], 1e-5 * std::max(1.0f, std::fabs(lse1[i])));
      }
    }
  }
  a.num_threads = 257;
  std::vector<float> q = randn(row), out(row);
  CHECK_STATUS(kvc_attention_decode(p, 0, &ids[0], 1, q.data(), out.data(), nullptr, &a),
               KVC_ERR_INVALID_ARGUMENT);
  kvc_pool_destroy(p);
}

// Prefill over threads: blocks of 32 query rows are independent, so 2, 3 and 8
// threads give the single thread's output and log-sum-exp byte for byte,
// for chunks shorter than one block, ragged last blocks and whole prompts;
// f16 and int8 storage, f16 output.
KVTEST(threads_prefill_identical) {
  Geo g;
  g.layers = 1;
  g.hd = 64;
  kvc_codec c8 = per_token_codec(KVC_DTYPE_INT8, false);
  for (int quant = 0; quant < 2; ++quant) {
    kvc_pool *p =
        make_pool(g, KVC_DTYPE_F16, quant ? &c8 : nullptr, quant ? &c8 : nullptr, 0, 1024);
    fill(p, g, 7, 700);
    const size_t row = g.hq * g.hd;
    kvc_attention_params a = params(g);
    for (uint64_t n_q : {uint64_t(1), uint64_t(31), uint64_t(33), uint64_t(200), uint64_t(700)}) {
      for (kvc_dtype od : {KVC_DTYPE_F32, KVC_DTYPE_F16}) {
        a.out_dtype = od;
        const size_t osz = od == KVC_DTYPE_F32 ? 4 : 2;
        std::vector<float> q = randn(n_q * row), lse1(n_q * g.hq);
        std::vector<uint8_t> one(n_q * row * osz);
        a.num_threads = 1;
        CHECK_OK(kvc_attention_prefill(p, 0, 7, q.data(), n_q, one.data(), lse1.data(), &a));
        for (uint32_t t : {2u, 3u, 8u}) {
          std::vector<uint8_t> many(one.size(), 0xab);
          std::vector<float> lsem(lse1.size(), 5.0f);
          a.num_threads = t;
          CHECK_OK(kvc_attention_prefill(p, 0, 7, q.data(), n_q, many.data(), lsem.data(), &a));
          CHECK(std::memcmp(many.data(), one.data(), one.size()) == 0);
          CHECK(std::memcmp(lsem.data(), lse1.data(), lse1.size() * sizeof(float)) == 0);
        }
      }
    }
    kvc_pool_destroy(p);
  }
}

// Regressions of the adversarial review: q.k overflow stays defined, q x
// scale overflow is refused, huge prefill chunks are range errors, replace
// mode with a repeated id keeps both queries' mass, scores can be read while
// attention records them (TSan runs this in CI).
KVTEST(threads_review_regressions) {
  Geo g;
  g.layers = 1;
  g.hq = g.hkv = 1;
  g.hd = 4;
  kvc_pool *p = make_pool(g);
  CHECK_OK(kvc_seq_create(p, 1));
  CHECK_OK(kvc_seq_reserve(p, 1, 2, nullptr));
  std::vector<float> k(8, 1e19f), v(8, 1.0f);
  CHECK_OK(kvc_append(p, 1, 0, 0, 2, k.data(), v.data(), KVC_DTYPE_F32));
  const uint64_t id = 1;
  kvc_attention_params a = params(g);
  a.scale = 1.0f;
  std::vector<float> q(4, 1e19f), out(4), lse(1);
  CHECK_OK(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), lse.data(), &a));
  for (float x : out) CHECK_NEAR(x, 1.0f, 1e-6);
  CHECK(std::isfinite(lse[0]));
  a.scale = 3e38f;
  std::vector<float> q2(4, 2.0f);
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 1, q2.data(), out.data(), lse.data(), &a),
               KVC_ERR_NON_FINITE);
  a.scale = 0.0f;
  CHECK_STATUS(
      kvc_attention_prefill(p, 0, id, q2.data(), uint64_t(1) << 31, out.data(), nullptr, &a),
      KVC_ERR_OUT_OF_RANGE);
  kvc_pool_destroy(p);
  // Replace mode with the same sequence twice: both queries' probabilities.
  Geo g2;
  g2.layers = 1;
  kvc_pool *r = make_pool(g2);
  Seq s = fill(r, g2, 5, 9);
  const uint64_t twice[2] = {5, 5};
  std::vector<float> qq = randn(2 * g2.hq * g2.hd), oo(qq.size());
  kvc_attention_params b = params(g2);
  b.observe = KVC_OBSERVE_REPLACE;
  CHECK_OK(kvc_attention_decode(r, 0, twice, 2, qq.data(), oo.data(), nullptr, &b));
  std::vector<double> want(9 * g2.hkv, 0.0), ro, rl, pr;
  for (int i = 0; i < 2; ++i) {
    reference(g2, qq.data() + i * g2.hq * g2.hd, s.k[0], s.v[0], 9, 0.25f, ro, rl, &pr);
    for (size_t t = 0; t < pr.size(); ++t) want[t] += pr[t];
  }
  std::vector<float> sc(9 * g2.hkv);
  CHECK_OK(kvc_seq_scores(r, 5, 0, sc.data(), 9));
  for (size_t t = 0; t < sc.size(); ++t) CHECK_NEAR(sc[t], want[t], 1e-5);
  // Reading scores while another thread records them.
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    std::vector<float> buf(9 * g2.hkv);
    while (!stop.load()) kvc_seq_scores(r, 5, 0, buf.data(), 9);
  });
  b.observe = KVC_OBSERVE_ACCUMULATE;
  const uint64_t one = 5;
  for (int i = 0; i < 300; ++i)
    CHECK_OK(kvc_attention_decode(r, 0, &one, 1, qq.data(), oo.data(), nullptr, &b));
  stop = true;
  reader.join();
  kvc_pool_destroy(r);
}

// Bad input: a clear status, nothing written.
KVTEST(bad_input) {
  Geo g;
  g.layers = 1;
  kvc_pool *p = make_pool(g);
  fill(p, g, 1, 5);
  const uint64_t id = 1, missing = 99;
  std::vector<float> q(g.hq * g.hd, 0.1f), out(g.hq * g.hd, 3.0f), lse(g.hq, 3.0f);
  kvc_attention_params a = params(g);
  auto untouched = [&] {
    for (float x : out) CHECK(x == 3.0f);
    for (float x : lse) CHECK(x == 3.0f);
  };
  q[5] = std::numeric_limits<float>::infinity();
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), lse.data(), &a),
               KVC_ERR_NON_FINITE);
  q[5] = std::numeric_limits<float>::quiet_NaN();
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), lse.data(), &a),
               KVC_ERR_NON_FINITE);
  q[5] = 0.1f;
  untouched();
  CHECK_STATUS(kvc_attention_decode(p, 0, &missing, 1, q.data(), out.data(), lse.data(), &a),
               KVC_ERR_SEQ_NOT_FOUND);
  const uint64_t mixed[2] = {1, 99};
  std::vector<float> q2(2 * q.size(), 0.1f), out2(2 * q.size(), 3.0f);
  CHECK_STATUS(kvc_attention_decode(p, 0, mixed, 2, q2.data(), out2.data(), nullptr, &a),
               KVC_ERR_SEQ_NOT_FOUND);
  for (float x : out2) CHECK(x == 3.0f);
  CHECK_STATUS(kvc_attention_decode(p, 1, &id, 1, q.data(), out.data(), lse.data(), &a),
               KVC_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 0, q.data(), out.data(), lse.data(), &a),
               KVC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kvc_attention_decode(nullptr, 0, &id, 1, q.data(), out.data(), lse.data(), &a),
               KVC_ERR_NULL_POINTER);
  CHECK_STATUS(kvc_attention_decode(p, 0, nullptr, 1, q.data(), out.data(), lse.data(), &a),
               KVC_ERR_NULL_POINTER);
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 1, nullptr, out.data(), lse.data(), &a),
               KVC_ERR_NULL_POINTER);
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 1, q.data(), nullptr, lse.data(), &a),
               KVC_ERR_NULL_POINTER);
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), lse.data(), nullptr),
               KVC_ERR_NULL_POINTER);
  kvc_attention_params b = a;
  b.num_q_heads = 4;
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), lse.data(), &b),
               KVC_ERR_INVALID_ARGUMENT);
  b = a;
  b.num_q_heads = 7;
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), lse.data(), &b),
               KVC_ERR_INVALID_ARGUMENT);
  b = a;
  b.scale = -1.0f;
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), lse.data(), &b),
               KVC_ERR_INVALID_ARGUMENT);
  b.scale = std::numeric_limits<float>::quiet_NaN();
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), lse.data(), &b),
               KVC_ERR_INVALID_ARGUMENT);
  b = a;
  b.observe = static_cast<kvc_observe>(7);
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), lse.data(), &b),
               KVC_ERR_INVALID_ARGUMENT);
  b.observe = static_cast<kvc_observe>(-3);
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), lse.data(), &b),
               KVC_ERR_INVALID_ARGUMENT);
  b = a;
  b.query_quant = static_cast<kvc_query_quant>(3);
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), lse.data(), &b),
               KVC_ERR_INVALID_ARGUMENT);
  CHECK(std::strstr(kvc_last_error_message(), "query_quant 3") != nullptr);
  b.query_quant = static_cast<kvc_query_quant>(-1);
  CHECK_STATUS(kvc_attention_prefill(p, 0, id, q.data(), 1, out.data(), lse.data(), &b),
               KVC_ERR_INVALID_ARGUMENT);
  b = a;
  b.q_dtype = KVC_DTYPE_INT8;
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), lse.data(), &b),
               KVC_ERR_INVALID_ARGUMENT);
  b = a;
  b.struct_size = 8;
  CHECK_STATUS(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), lse.data(), &b),
               KVC_ERR_STRUCT_SIZE);
  CHECK_STATUS(kvc_attention_prefill(p, 0, id, q.data(), 0, out.data(), lse.data(), &a),
               KVC_ERR_INVALID_ARGUMENT);
  untouched();
  // The 0.3 function: the header's macro needs a typed pointer.
  CHECK_STATUS((kvc_attention_params_init)(nullptr), KVC_ERR_NULL_POINTER);
  kvc_pool_destroy(p);
}

// The fused decode kernels (attention/fused.h: K/V read in place, one
// conversion per row for its GQA group) against the f32 tile path and a
// float64 reference: every storage they take (f32, f16, bf16, int8 and int4
// codes and fp8 e4m3 / e5m2 codes with per-token scales or per-group ones
// within each head (groups of 16 and 32: several scales a head), int8 /
// int4 codes with per-channel scales (KIVI's keys, groups of 4 and 8
// tokens), symmetric and with zero points, f32 and f16 scales, Hadamard-rotated
// or not), GQA
// groups of 1, 2, 3, 4, 8 and 12 heads (1 to 8 KV heads), head_dim 16 to 128, lengths across
// block and band edges, observation, and scores beyond f32.
KVTEST(fused_paths_agree) {
  const int top = kvc::attention::fused::set_isa_limit(2);
  if (top == 0) {
    std::fprintf(stderr, "fused kernels not available on this CPU: tile path only\n");
    return;
  }
  std::fprintf(stderr, "fused kernels: AVX2%s\n", top >= 2 ? " and AVX-512VL" : " only");
  struct Storage {
    const char *name;
    kvc_dtype plain, dt;
    int asym;
    kvc_dtype scale;
    uint32_t group;    // 0: per-token scales
    uint32_t channel;  // > 0: per-channel scales over groups of this many tokens
    uint32_t full_range;
    uint32_t rotation;  // Hadamard blocks (0: none)
  };
  const Storage stor[] = {
      {"f32", KVC_DTYPE_F32, KVC_DTYPE_F32, 0, KVC_DTYPE_F32, 0, 0, 0, 0},
      {"f16", KVC_DTYPE_F16, KVC_DTYPE_F16, 0, KVC_DTYPE_F32, 0, 0, 0, 0},
      {"bf16", KVC_DTYPE_BF16, KVC_DTYPE_BF16, 0, KVC_DTYPE_F32, 0, 0, 0, 0},
      {"int8", KVC_DTYPE_F16, KVC_DTYPE_INT8, 0, KVC_DTYPE_F32, 0, 0, 0, 0},
      {"int8 asym f16 scales", KVC_DTYPE_F16, KVC_DTYPE_INT8, 1, KVC_DTYPE_F16, 0, 0, 0, 0},
      {"int4 f16 scales", KVC_DTYPE_F16, KVC_DTYPE_INT4, 0, KVC_DTYPE_F16, 0, 0, 0, 0},
      {"int4", KVC_DTYPE_F16, KVC_DTYPE_INT4, 0, KVC_DTYPE_F32, 0, 0, 0, 0},
      {"int4 asym", KVC_DTYPE_F16, KVC_DTYPE_INT4, 1, KVC_DTYPE_F32, 0, 0, 0, 0},
      {"int8 group 16", KVC_DTYPE_F16, KVC_DTYPE_INT8, 0, KVC_DTYPE_F32, 16, 0, 0, 0},
      {"int8 asym group 16 f16 scales", KVC_DTYPE_F16, KVC_DTYPE_INT8, 1, KVC_DTYPE_F16, 16, 0, 0, 0},
      {"int4 group 16 f16 scales", KVC_DTYPE_F16, KVC_DTYPE_INT4, 0, KVC_DTYPE_F16, 16, 0, 0, 0},
      {"int4 asym group 16", KVC_DTYPE_F16, KVC_DTYPE_INT4, 1, KVC_DTYPE_F32, 16, 0, 0, 0},
      {"int4 group 32", KVC_DTYPE_F16, KVC_DTYPE_INT4, 0, KVC_DTYPE_F32, 32, 0, 0, 0},
      {"fp8 e4m3", KVC_DTYPE_F16, KVC_DTYPE_FP8_E4M3, 0, KVC_DTYPE_F32, 0, 0, 0, 0},
      {"fp8 e5m2 f16 scales", KVC_DTYPE_F16, KVC_DTYPE_FP8_E5M2, 0, KVC_DTYPE_F16, 0, 0, 0, 0},
      {"fp8 e4m3 group 16", KVC_DTYPE_F16, KVC_DTYPE_FP8_E4M3, 0, KVC_DTYPE_F32, 16, 0, 0, 0},
      {"int4 asym per-channel (KIVI keys), groups of 4 tokens", KVC_DTYPE_F16, KVC_DTYPE_INT4, 1,
       KVC_DTYPE_F32, 0, 4, 0, 0},
      {"int8 per-channel f16 scales, groups of 8 tokens", KVC_DTYPE_F16, KVC_DTYPE_INT8, 0,
       KVC_DTYPE_F16, 0, 8, 0, 0},
      {"int4 per-channel, groups of 4 tokens", KVC_DTYPE_F16, KVC_DTYPE_INT4, 0, KVC_DTYPE_F32, 0,
       4, 0, 0},
      {"int4 group 32 full range", KVC_DTYPE_F16, KVC_DTYPE_INT4, 0, KVC_DTYPE_F32, 32, 0, 1, 0},
      {"int8 per-channel full range", KVC_DTYPE_F16, KVC_DTYPE_INT8, 0, KVC_DTYPE_F32, 0, 4, 1, 0},
      {"int4 Hadamard-rotated (blocks of 16)", KVC_DTYPE_F16, KVC_DTYPE_INT4, 0, KVC_DTYPE_F32, 0,
       0, 0, 16},
      {"int8 asym group 16 rotated (blocks of 32)", KVC_DTYPE_F16, KVC_DTYPE_INT8, 1,
       KVC_DTYPE_F32, 16, 0, 0, 32},
      {"int4 asym per-channel rotated (blocks of 16)", KVC_DTYPE_F16, KVC_DTYPE_INT4, 1,
       KVC_DTYPE_F32, 0, 4, 0, 16},
      {"fp8 e4m3 rotated (blocks of 16)", KVC_DTYPE_F16, KVC_DTYPE_FP8_E4M3, 0, KVC_DTYPE_F32, 0,
       0, 0, 16},
  };
  struct Shape {
    uint32_t hq, hkv, hd, bs;
  };
  const Shape shapes[] = {
      {4, 4, 16, 16}, {6, 2, 48, 16}, {8, 2, 64, 32}, {16, 2, 128, 16}, {12, 1, 32, 8},
      {16, 8, 64, 16}, {32, 16, 32, 16}};  // 8 and 16 KV heads: the scales read 8 heads x 8
                                           // tokens at a time
  for (const Storage &st : stor)
    for (const Shape &sp : shapes) {
      Geo g;
      g.layers = 1;
      g.hq = sp.hq;
      g.hkv = sp.hkv;
      g.hd = sp.hd;
      g.bs = sp.bs;
      kvc_codec codec = per_token_codec(st.dt, st.asym != 0, st.scale);
      codec.full_range = st.full_range;
      if (st.rotation) {
        if (sp.hd % st.rotation != 0) continue;
        codec.rotation = KVC_ROTATION_HADAMARD;
        codec.rotation_block = st.rotation;
      }
      if (st.group) {
        if (sp.hd % st.group != 0) continue;  // (the tile path's own groups: not the kernels')
        codec.granularity = KVC_SCALE_PER_GROUP;
        codec.group_size = st.group;
      }
      if (st.channel) {  // (its tokens wait in the residual arena until their group is whole)
        if (sp.bs % st.channel != 0) continue;
        codec.granularity = KVC_SCALE_PER_CHANNEL;
        codec.group_size = st.channel;
      }
      const bool quant = st.dt != st.plain;
      kvc_pool *p = make_pool(g, st.plain, quant ? &codec : nullptr, quant ? &codec : nullptr, 0,
                              256, st.channel ? 64 : 0);
      uint64_t id = 1;
      for (uint64_t n : {1ull, 15ull, 16ull, 17ull, 40ull, 100ull}) {
        fill(p, g, id, n);
        std::vector<float> k(n * g.hkv * g.hd), v(k.size());
        CHECK_OK(kvc_gather(p, id, 0, 0, n, k.data(), v.data(), KVC_DTYPE_F32, nullptr));
        const std::vector<float> q = randn(g.hq * g.hd);
        kvc_attention_params a = params(g);
        a.observe = KVC_OBSERVE_REPLACE;
        std::vector<float> out[3], lse[3], sc[3];
        // 0: tile path, 1: fused AVX2 kernels, 2: fused AVX-512VL kernels
        // (where the CPU has them; else AVX2 again)
        for (int path = 0; path < 3; ++path) {
          kvc::attention::fused::set_isa_limit(path);
          out[path].assign(g.hq * g.hd, 0.0f);
          lse[path].assign(g.hq, 0.0f);
          sc[path].assign(n * g.hkv, 0.0f);
          CHECK_OK(
              kvc_attention_decode(p, 0, &id, 1, q.data(), out[path].data(), lse[path].data(), &a));
          CHECK_OK(kvc_seq_scores(p, id, 0, sc[path].data(), n));
        }
        std::vector<double> ro, rl, pr;
        reference(g, q.data(), k, v, n, 1.0f / std::sqrt(static_cast<float>(g.hd)), ro, rl, &pr);
        const double e0 = rel_err(out[0].data(), ro), e1 = rel_err(out[1].data(), ro);
        if (!(e1 <= 1e-5))
          std::fprintf(stderr, "%s hq %u hkv %u hd %u n %llu: fused error %g (tile %g)\n", st.name,
                       sp.hq, sp.hkv, sp.hd, static_cast<unsigned long long>(n), e1, e0);
        CHECK(e0 <= 1e-5);
        CHECK(e1 <= 1e-5);
        for (uint32_t h = 0; h < g.hq; ++h) {
          CHECK_NEAR(lse[1][h], rl[h], 1e-5 * std::max(1.0, std::fabs(rl[h])));
          CHECK_NEAR(lse[1][h], lse[0][h], 1e-5 * std::max(1.0, std::fabs(rl[h])));
        }
        for (size_t i = 0; i < pr.size(); ++i) {
          CHECK_NEAR(sc[1][i], pr[i], 1e-5);
          CHECK_NEAR(sc[1][i], sc[0][i], 1e-5);
        }
        // The two kernel sets sum in the same order: the same bytes (memcmp: a
        // float comparison passes -0 against +0 and fails two identical NaNs).
        auto same_bytes = [](const std::vector<float> &a, const std::vector<float> &b) {
          return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
        };
        CHECK(same_bytes(out[2], out[1]) && same_bytes(lse[2], lse[1]) &&
              same_bytes(sc[2], sc[1]));
        ++id;
      }
      kvc_pool_destroy(p);
    }
  // Scores past f32 (q.k overflows): clamped the same way on both paths, so
  // the output stays finite and equal.
  Geo g;
  g.layers = 1;
  g.hq = 4;
  g.hkv = 1;
  g.hd = 16;
  kvc_pool *p = make_pool(g);
  const uint64_t n = 20, id = 9;
  CHECK_OK(kvc_seq_create(p, id));
  CHECK_OK(kvc_seq_reserve(p, id, n, nullptr));
  std::vector<float> k = randn(n * g.hd), v = randn(n * g.hd);
  for (uint64_t t = 0; t < n; t += 3) std::fill(k.begin() + t * 16, k.begin() + t * 16 + 16, 1e30f);
  k[5 * 16] = -3e38f;
  CHECK_OK(kvc_append(p, id, 0, 0, n, k.data(), v.data(), KVC_DTYPE_F32));
  std::vector<float> q(g.hq * g.hd, 1e30f), out[2];
  for (uint32_t i = 0; i < g.hd; ++i) q[g.hd + i] = -1e30f;  // head 1: scores of -inf
  kvc_attention_params a = params(g);
  for (int path = 0; path < 2; ++path) {
    kvc::attention::fused::set_isa_limit(path);
    out[path].assign(g.hq * g.hd, 0.0f);
    CHECK_OK(kvc_attention_decode(p, 0, &id, 1, q.data(), out[path].data(), nullptr, &a));
  }
  for (size_t i = 0; i < out[0].size(); ++i) {
    CHECK(std::isfinite(out[1][i]));
    CHECK_NEAR(out[1][i], out[0][i], 1e-5 * std::max(1.0f, std::fabs(out[0][i])));
  }
  kvc::attention::fused::set_isa_limit(2);
  kvc_pool_destroy(p);
}

// Every finite fp8 code through the fused kernels' conversion (e4m3:
// exponent and mantissa moved into an f32 and rescaled, subnormals too;
// e5m2: an f16's top byte): a value row holding each finite e4m3 / e5m2
// value once, the largest among them so the token's scale is 1 and the codes
// are the values; one token, so each head's output is that row, exactly, on
// both kernel sets and the tile path.
KVTEST(fused_fp8_every_code) {
  if (kvc::attention::fused::set_isa_limit(2) == 0) {
    std::fprintf(stderr, "fused kernels not available on this CPU: nothing to compare\n");
    return;
  }
  for (kvc_dtype dt : {KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E5M2}) {
    const bool e4m3 = dt == KVC_DTYPE_FP8_E4M3;
    // The finite codes' values: e4m3 0x00..0x7e (0x7f is NaN), e5m2
    // 0x00..0x7b (above: Inf and NaN), and their negatives.
    std::vector<float> vals;
    for (int c = 0; c <= (e4m3 ? 0x7e : 0x7b); ++c) {
      const int mb = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
      const int e = c >> mb, m = c & ((1 << mb) - 1);
      const float x = e ? std::ldexp(1.0f + float(m) / float(1 << mb), e - bias)
                        : std::ldexp(float(m) / float(1 << mb), 1 - bias);
      vals.push_back(x);
      if (c) vals.push_back(-x);
    }
    Geo g;
    g.layers = 1;
    g.hq = 4;
    g.hkv = 1;
    g.hd = 256;
    CHECK(vals.size() <= g.hd);
    vals.resize(g.hd, 0.0f);
    kvc_codec codec = per_token_codec(dt, false);
    kvc_pool *p = make_pool(g, KVC_DTYPE_F16, &codec, &codec);
    const uint64_t id = 1;
    CHECK_OK(kvc_seq_create(p, id));
    CHECK_OK(kvc_seq_reserve(p, id, 1, nullptr));
    CHECK_OK(kvc_append(p, id, 0, 0, 1, vals.data(), vals.data(), KVC_DTYPE_F32));
    std::vector<float> k(g.hd), v(g.hd);
    CHECK_OK(kvc_gather(p, id, 0, 0, 1, k.data(), v.data(), KVC_DTYPE_F32, nullptr));
    CHECK(v == vals);  // (the scale is 1: the codes are the values)
    const std::vector<float> q = randn(g.hq * g.hd);
    kvc_attention_params a = params(g);
    for (int path = 0; path < 3; ++path) {  // tile path, AVX2, AVX-512 (where the CPU has it)
      kvc::attention::fused::set_isa_limit(path);
      std::vector<float> out(g.hq * g.hd, -1.0f);
      CHECK_OK(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), nullptr, &a));
      for (uint32_t h = 0; h < g.hq; ++h)
        for (uint32_t d = 0; d < g.hd; ++d)
          if (out[h * g.hd + d] != vals[d]) {
            std::fprintf(stderr, "%s path %d head %u dim %u: %g, not %g\n",
                         e4m3 ? "e4m3" : "e5m2", path, h, d, out[h * g.hd + d], vals[d]);
            CHECK(false);
            h = g.hq;
            break;
          }
    }
    kvc::attention::fused::set_isa_limit(2);
    kvc_pool_destroy(p);
  }
}

// Asymmetric integer codes (x = scale x code + zero) with large zero points
// (keys of scale 4, values of scale 4 shifted by +6, a query of scale 3 and
// mean 2, so sum(q) is large): the fused path scores them as
// scale x (q . (codes - centre)) + (zero + scale x centre) x sum(q), whose
// terms do not cancel as the uncentred ones did; its log-sum-exp stays
// within 1e-6 of float64 (relative), as the tile path's (which dequantizes
// first).
KVTEST(fused_asym_codes_centred) {
  if (kvc::attention::fused::set_isa_limit(2) == 0) {
    std::fprintf(stderr, "fused kernels not available on this CPU: nothing to compare\n");
    return;
  }
  for (kvc_dtype dt : {KVC_DTYPE_INT8, KVC_DTYPE_INT4}) {
    Geo g;
    g.layers = 1;
    g.hq = 8;
    g.hkv = 2;
    g.hd = 128;
    kvc_codec codec = per_token_codec(dt, true);
    kvc_pool *p = make_pool(g, KVC_DTYPE_F16, &codec, &codec);
    const uint64_t n = 512, id = 1;
    CHECK_OK(kvc_seq_create(p, id));
    CHECK_OK(kvc_seq_reserve(p, id, n, nullptr));
    std::vector<float> k = randn(n * g.hkv * g.hd, 4.0f), v = randn(k.size(), 4.0f);
    for (float &x : v) x += 6.0f;
    CHECK_OK(kvc_append(p, id, 0, 0, n, k.data(), v.data(), KVC_DTYPE_F32));
    std::vector<float> gk(k.size()), gv(k.size());
    CHECK_OK(kvc_gather(p, id, 0, 0, n, gk.data(), gv.data(), KVC_DTYPE_F32, nullptr));
    double worst[2] = {0, 0}, worst_out[2] = {0, 0};
    for (int trial = 0; trial < 8; ++trial) {
      std::vector<float> q = randn(g.hq * g.hd, 3.0f);
      for (float &x : q) x += 2.0f;
      std::vector<double> ro, rl;
      reference(g, q.data(), gk, gv, n, 1.0f / std::sqrt(static_cast<float>(g.hd)), ro, rl);
      kvc_attention_params a = params(g);
      for (int path = 0; path < 2; ++path) {
        kvc::attention::fused::set_isa_limit(path ? 2 : 0);
        std::vector<float> out(g.hq * g.hd), lse(g.hq);
        CHECK_OK(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), lse.data(), &a));
        for (uint32_t h = 0; h < g.hq; ++h)
          worst[path] = std::max(worst[path], std::fabs(lse[h] - rl[h]) / std::max(1.0, std::fabs(rl[h])));
        worst_out[path] = std::max(worst_out[path], rel_err(out.data(), ro));
      }
    }
    std::fprintf(stderr, "%s asym: lse error tile %.3g fused %.3g; outputs tile %.3g fused %.3g\n",
                 dt == KVC_DTYPE_INT8 ? "int8" : "int4", worst[0], worst[1], worst_out[0],
                 worst_out[1]);
    // Uncentred codes measured lse 2.4e-6 / 3.0e-6 and outputs 1.3e-5 /
    // 6.4e-6 (int8 / int4) here; centred 4.2e-7 / 5.0e-7 and 3.1e-6.
    CHECK(worst[0] <= 1e-6);
    CHECK(worst[1] <= 1e-6);
    CHECK(worst_out[1] <= 5e-6);
    kvc_pool_destroy(p);
  }
  // Rows at their minimum (zeros and one positive value; hd 256, a query of
  // mean 30): a fixed centre (128) left a zero point of half the row's range
  // times sum(q) against the codes' term (lse error 1.3e-5 / 1.6e-5); the
  // code of 0 as the centre keeps them as exact as the tile path (1e-9).
  // And the int8 query over such keys (a one-hot key, one large query
  // value): within KVC_QUERY_INT8's bound, (max |q| / 254) x sum |k|, which
  // the exact query sum against the quantized query's dot broke (0.076
  // against a bound of 0.005).
  for (kvc_dtype dt : {KVC_DTYPE_INT8, KVC_DTYPE_INT4}) {
    Geo g;
    g.layers = 1;
    g.hq = g.hkv = 1;
    g.hd = 256;
    kvc_codec codec = per_token_codec(dt, true);
    kvc_pool *p = make_pool(g, KVC_DTYPE_F32, &codec, nullptr);
    const uint64_t id = 1, n = 2;
    CHECK_OK(kvc_seq_create(p, id));
    CHECK_OK(kvc_seq_reserve(p, id, n, nullptr));
    std::vector<float> k(n * g.hd, 0.0f), v(n * g.hd), q(g.hd);
    k[0] = 1.0f;
    k[g.hd + 1] = 0.7f;
    for (uint32_t d = 0; d < g.hd; ++d) {
      v[d] = 1.0f;
      v[g.hd + d] = -1.0f;
      q[d] = 30.0f + 0.37f * std::sin(1.7f * static_cast<float>(d));
    }
    q[0] = 0.25f;
    q[1] = 0.25f / 0.7f;
    CHECK_OK(kvc_append(p, id, 0, 0, n, k.data(), v.data(), KVC_DTYPE_F32));
    std::vector<float> gk(k.size()), gv(v.size());
    CHECK_OK(kvc_gather(p, id, 0, 0, n, gk.data(), gv.data(), KVC_DTYPE_F32, nullptr));
    std::vector<double> ro, rl;
    reference(g, q.data(), gk, gv, n, 1.0f / 16.0f, ro, rl);
    kvc_attention_params a = params(g);
    std::vector<float> out(g.hd);
    float lse = 0.0f;
    CHECK_OK(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), &lse, &a));
    CHECK_NEAR(lse, rl[0], 1e-6 * std::max(1.0, std::fabs(rl[0])));
    double oe = 0.0;  // (the two values' weights are near equal: outputs near 0, |v| = 1)
    for (uint32_t d = 0; d < g.hd; ++d) oe = std::max(oe, std::fabs(out[d] - ro[d]));
    std::fprintf(stderr, "%s asym, rows at their minimum: lse error %.3g, outputs %.3g\n",
                 dt == KVC_DTYPE_INT8 ? "int8" : "int4",
                 std::fabs(lse - rl[0]) / std::max(1.0, std::fabs(rl[0])), oe);
    CHECK(oe <= 1e-6);
    kvc_pool_destroy(p);
    if (!kvc::attention::fused::int8_query_available()) continue;
    for (float sign : {1.0f, -1.0f}) {
      Geo h;
      h.layers = 1;
      h.hq = h.hkv = 1;
      h.hd = 32;
      kvc_pool *pi = make_pool(h, KVC_DTYPE_F16, &codec, &codec);
      CHECK_OK(kvc_seq_create(pi, id));
      CHECK_OK(kvc_seq_reserve(pi, id, 1, nullptr));
      std::vector<float> k1(h.hd, 0.0f), v1(h.hd, 0.5f), q1(h.hd, 0.0049f);
      k1[0] = sign;
      q1[0] = 1.27f;
      CHECK_OK(kvc_append(pi, id, 0, 0, 1, k1.data(), v1.data(), KVC_DTYPE_F32));
      kvc_attention_params b = params(h);
      b.scale = 1.0f;
      float l[2];
      std::vector<float> o(h.hd);
      for (int mode = 0; mode < 2; ++mode) {
        b.query_quant = mode ? KVC_QUERY_INT8 : KVC_QUERY_EXACT;
        CHECK_OK(kvc_attention_decode(pi, 0, &id, 1, q1.data(), o.data(), &l[mode], &b));
      }
      const double bound = 1.27 / 254.0 * 1.0;  // (max |q| / 254) x sum |k|
      if (!(std::fabs(l[1] - l[0]) <= bound + 1e-6))
        std::fprintf(stderr, "int8 query over a one-hot asymmetric key: lse %g vs %g (bound %g)\n",
                     l[1], l[0], bound);
      CHECK(std::fabs(l[1] - l[0]) <= bound + 1e-6);
      kvc_pool_destroy(pi);
    }
  }
  kvc::attention::fused::set_isa_limit(2);
}

int main(int argc, char **argv) {
  return kvtest_main(argc, argv);
}
