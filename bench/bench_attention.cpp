// Attention and eviction throughput (issue "Attention over the paged cache"):
//  BM_AttnPaged/<storage>/<batch>/<threads>   kvc_attention_decode (1 or 2 threads), one query token per
//      sequence over a 4096-token cache: head_dim 128, 32 query heads, 8 KV
//      heads; storage 0 = f16, 1 = int8 per token, 2 = int4 per group of 32,
//      3 = int4 per token, 4 = fp8 e4m3 per token, 5 = KIVI (int4 keys
//      per channel over groups of 16 tokens, int4 values per token, both
//      asymmetric), 6 = int4 per group of 32, full range, Hadamard-rotated in
//      blocks of 128
//  BM_AttnPagedQ8/<storage>/<batch>/<threads> the same with KVC_QUERY_INT8
//      (storage 1 and 3: the integer keys scored against an int8 query)
//  BM_AttnPagedQ8V/<storage>/<batch>/<threads> KVC_QUERY_INT8_VALUES over the
//      int8 or int4 per-token blocks (storage 1 and 3: the values summed in
//      integers too)
//  BM_AttnDense/<batch>             the same attention as a plain loop over
//      contiguous f16 K and V (the baseline, same run)
//  BM_AttnMemcpy/<batch>            memcpy of the f16 K/V bytes the attention reads
//  BM_EvictHalf                     kvc_evict of half of a 4096-token sequence
//      (one layer, 8 KV heads, head_dim 128, f16; StreamingLLM keeps 4 sinks +
//      the newest 2044, so 2044 tokens move); bytes/s = bytes moved
//  BM_EvictMemcpy                   memcpy of the same bytes
// Times are wall time (bytes/s where it applies); bench/run_quick.sh prints
// the ratios against the targets.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_common.h"
#include "kvcache/kvcache.h"

namespace {


constexpr uint32_t kHq = 32, kHkv = 8, kHd = 128, kTokens = 4096, kRow = kHkv * kHd;

std::vector<uint16_t> random_f16(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> f(n);
  for (float &x : f) x = g(rng);
  std::vector<uint16_t> h(n);
  OK(kvc_convert(f.data(), KVC_DTYPE_F32, h.data(), KVC_DTYPE_F16, n));
  return h;
}

struct PagedSetup {
  kvc_pool *pool = nullptr;
  std::vector<uint64_t> ids;
  PagedSetup(int storage, int batch) {
    kvc_pool_config c;
    kvc_pool_config_init(&c);
    c.num_layers = 1;
    c.num_q_heads = kHq;
    c.num_kv_heads = kHkv;
    c.head_dim = kHd;
    c.block_size = 16;
    c.num_blocks = uint64_t(batch) * kTokens / 16;
    kvc_codec codec;
    kvc_codec_init(&codec);
    if (storage == 1) {
      codec.dtype = KVC_DTYPE_INT8;
      codec.granularity = KVC_SCALE_PER_TOKEN;
    } else if (storage == 2) {
      codec.dtype = KVC_DTYPE_INT4;
      codec.granularity = KVC_SCALE_PER_GROUP;
      codec.group_size = 32;
    } else if (storage == 3) {
      codec.dtype = KVC_DTYPE_INT4;
      codec.granularity = KVC_SCALE_PER_TOKEN;
    } else if (storage == 4) {
      codec.dtype = KVC_DTYPE_FP8_E4M3;
      codec.granularity = KVC_SCALE_PER_TOKEN;
    } else if (storage == 6) {  // the default list's int4:group=32:full-range:hadamard
      codec.dtype = KVC_DTYPE_INT4;
      codec.granularity = KVC_SCALE_PER_GROUP;
      codec.group_size = 32;
      codec.full_range = 1;
      codec.rotation = KVC_ROTATION_HADAMARD;
      codec.rotation_block = 128;
    }
    if (storage) c.k_codec = c.v_codec = &codec;
    kvc_codec vcodec;  // storage 5 (KIVI): int4 keys per channel, int4 values per token
    if (storage == 5) {
      codec.dtype = KVC_DTYPE_INT4;
      codec.granularity = KVC_SCALE_PER_CHANNEL;
      codec.group_size = 16;
      codec.asymmetric = 1;
      kvc_codec_init(&vcodec);
      vcodec.dtype = KVC_DTYPE_INT4;
      vcodec.granularity = KVC_SCALE_PER_TOKEN;
      vcodec.asymmetric = 1;
      c.v_codec = &vcodec;
      c.num_residual_blocks = uint64_t(batch) * (kTokens / 16 + 1);  // (staging rows reserved)
    }
    OK(kvc_pool_create(&c, &pool));
    const std::vector<uint16_t> kv = random_f16(size_t(kTokens) * kRow, 1);
    for (int b = 0; b < batch; ++b) {
      ids.push_back(uint64_t(b));
      OK(kvc_seq_create(pool, uint64_t(b)));
      OK(kvc_seq_reserve(pool, uint64_t(b), kTokens, nullptr));
      OK(kvc_append(pool, uint64_t(b), 0, 0, kTokens, kv.data(), kv.data(), KVC_DTYPE_F16));
    }
  }
  ~PagedSetup() { kvc_pool_destroy(pool); }
};

void run_paged(benchmark::State &state, kvc_query_quant query_quant) {
  const int storage = static_cast<int>(state.range(0)), batch = static_cast<int>(state.range(1));
  const uint32_t threads = static_cast<uint32_t>(state.range(2));
  PagedSetup s(storage, batch);
  std::vector<uint16_t> q = random_f16(size_t(batch) * kHq * kHd, 2), out(q.size());
  kvc_attention_params a;
  kvc_attention_params_init(&a);
  a.num_q_heads = kHq;
  a.q_dtype = a.out_dtype = KVC_DTYPE_F16;
  a.num_threads = threads;
  a.query_quant = query_quant;
  for (auto _ : state) {
    OK(kvc_attention_decode(s.pool, 0, s.ids.data(), s.ids.size(), q.data(), out.data(), nullptr, &a));
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * batch * kTokens * kRow * 2 * 2);  // f16 K+V equivalent
  state.SetLabel(std::string(storage == 0   ? "f16"
                             : storage == 1 ? "int8"
                             : storage == 2 ? "int4 group 32"
                             : storage == 3 ? "int4 per token"
                             : storage == 4 ? "fp8 e4m3 per token"
                             : storage == 5 ? "KIVI: int4 keys per channel, values per token"
                                            : "int4 group 32 full range, Hadamard 128") +
                 (query_quant == KVC_QUERY_INT8          ? ", int8 query"
                  : query_quant == KVC_QUERY_INT8_VALUES ? ", int8 query and values"
                                                         : "") +
                 ", " +
                 std::to_string(threads) + " thread(s)");
}
void BM_AttnPaged(benchmark::State &state) {
  run_paged(state, KVC_QUERY_EXACT);
}
// KVC_QUERY_INT8: the int8 and int4 per-token keys scored against an int8
// query (AVX-512 VNNI where the CPU has it, else the exact path).
void BM_AttnPagedQ8(benchmark::State &state) {
  run_paged(state, KVC_QUERY_INT8);
}
// KVC_QUERY_INT8_VALUES: the int8 blocks' values summed in integers too.
void BM_AttnPagedQ8V(benchmark::State &state) {
  run_paged(state, KVC_QUERY_INT8_VALUES);
}

// The baseline: decode attention as a plain loop over contiguous f16 K/V
// [tokens][kv_heads][head_dim] (the usual CPU reference: all scores, softmax,
// then the weighted sum of V), each row converted once with F16C and shared
// by the query heads of its KV head, AVX2 FMA dot products.
__attribute__((target("avx2,fma,f16c"))) void dense_attention(const uint16_t *k, const uint16_t *v,
                                                               const float *q, float *out,
                                                               std::vector<float> &scores) {
  constexpr uint32_t grp = kHq / kHkv;
  const float scale = 1.0f / std::sqrt(float(kHd));
  scores.resize(size_t(grp) * kTokens);
  alignas(32) float row[kHd];
  for (uint32_t g = 0; g < kHkv; ++g) {
    for (uint32_t t = 0; t < kTokens; ++t) {
      const uint16_t *kr = k + (size_t(t) * kRow + g * kHd);
      for (uint32_t i = 0; i < kHd; i += 8)
        _mm256_store_ps(row + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(kr + i))));
      for (uint32_t h = 0; h < grp; ++h) {
        const float *qh = q + (g * grp + h) * kHd;
        __m256 d0 = _mm256_setzero_ps(), d1 = _mm256_setzero_ps();
        for (uint32_t i = 0; i < kHd; i += 16) {
          d0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i), _mm256_load_ps(row + i), d0);
          d1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i + 8), _mm256_load_ps(row + i + 8), d1);
        }
        d0 = _mm256_add_ps(d0, d1);
        __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(d0), _mm256_extractf128_ps(d0, 1));
        s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
        scores[size_t(h) * kTokens + t] = _mm_cvtss_f32(s4) * scale;
      }
    }
    for (uint32_t h = 0; h < grp; ++h) {
      float *sc = scores.data() + size_t(h) * kTokens, mx = sc[0], sum = 0;
      for (uint32_t t = 1; t < kTokens; ++t) mx = std::max(mx, sc[t]);
      for (uint32_t t = 0; t < kTokens; ++t) sum += (sc[t] = std::exp(sc[t] - mx));
      for (uint32_t t = 0; t < kTokens; ++t) sc[t] /= sum;
    }
    alignas(32) float acc[grp][kHd];
    std::memset(acc, 0, sizeof acc);
    for (uint32_t t = 0; t < kTokens; ++t) {
      const uint16_t *vr = v + (size_t(t) * kRow + g * kHd);
      for (uint32_t i = 0; i < kHd; i += 8)
        _mm256_store_ps(row + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(vr + i))));
      for (uint32_t h = 0; h < grp; ++h) {
        const __m256 p = _mm256_set1_ps(scores[size_t(h) * kTokens + t]);
        for (uint32_t i = 0; i < kHd; i += 8)
          _mm256_store_ps(acc[h] + i, _mm256_fmadd_ps(p, _mm256_load_ps(row + i), _mm256_load_ps(acc[h] + i)));
      }
    }
    for (uint32_t h = 0; h < grp; ++h) std::memcpy(out + (g * grp + h) * kHd, acc[h], sizeof acc[h]);
  }
}

void BM_AttnDense(benchmark::State &state) {
  const int batch = static_cast<int>(state.range(0));
  std::vector<std::vector<uint16_t>> k, v;
  for (int b = 0; b < batch; ++b) {
    k.push_back(random_f16(size_t(kTokens) * kRow, 1));
    v.push_back(k.back());
  }
  std::vector<float> q(size_t(batch) * kHq * kHd, 0.1f), out(q.size()), scores;
  for (auto _ : state) {
    for (int b = 0; b < batch; ++b)
      dense_attention(k[b].data(), v[b].data(), q.data() + size_t(b) * kHq * kHd, out.data() + size_t(b) * kHq * kHd,
                      scores);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * batch * kTokens * kRow * 2 * 2);
}

void BM_AttnMemcpy(benchmark::State &state) {
  const size_t bytes = size_t(state.range(0)) * kTokens * kRow * 2 * 2;
  std::vector<uint8_t> a(bytes + 8192, 1), b(bytes + 8192);
  uint8_t *dst = b.data() + 2048 + 64;
  for (auto _ : state) {
    std::memcpy(dst, a.data(), bytes);
    benchmark::DoNotOptimize(dst);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations() * bytes));
}

constexpr uint64_t kEvictKeep = 2048, kSinks = 4;
constexpr uint64_t kMovedBytes = (kEvictKeep - kSinks) * kRow * 2 * 2;

void BM_EvictHalf(benchmark::State &state) {
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = 1;
  c.num_q_heads = kHkv;
  c.num_kv_heads = kHkv;
  c.head_dim = kHd;
  c.num_blocks = kTokens / 16;
  kvc_pool *pool = nullptr;
  OK(kvc_pool_create(&c, &pool));
  kvc_policy_config pc;
  kvc_policy_config_init(&pc);
  pc.kind = KVC_POLICY_STREAMING;
  pc.sink_tokens = kSinks;
  pc.budget_tokens = kEvictKeep;
  kvc_policy *pol = nullptr;
  OK(kvc_policy_create(&pc, &pol));
  const std::vector<uint16_t> kv = random_f16(size_t(kTokens) * kRow, 3);
  for (auto _ : state) {
    state.PauseTiming();
    OK(kvc_seq_create(pool, 1));
    OK(kvc_seq_reserve(pool, 1, kTokens, nullptr));
    OK(kvc_append(pool, 1, 0, 0, kTokens, kv.data(), kv.data(), KVC_DTYPE_F16));
    state.ResumeTiming();
    OK(kvc_evict(pool, 1, pol, nullptr));
    state.PauseTiming();
    OK(kvc_seq_free(pool, 1));
    state.ResumeTiming();
  }
  state.SetBytesProcessed(int64_t(state.iterations() * kMovedBytes));
  kvc_policy_destroy(pol);
  kvc_pool_destroy(pool);
}

void BM_EvictMemcpy(benchmark::State &state) {
  std::vector<uint8_t> a(kMovedBytes + 8192, 1), b(kMovedBytes + 8192);
  uint8_t *dst = b.data() + 2048 + 64;
  for (auto _ : state) {
    std::memcpy(dst, a.data(), kMovedBytes);
    benchmark::DoNotOptimize(dst);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations() * kMovedBytes));
}

}  // namespace

BENCHMARK(BM_AttnPaged)->ArgsProduct({{0, 1, 2, 3, 4, 5, 6}, {1, 8}, {1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AttnPagedQ8)->ArgsProduct({{1, 3}, {1, 8}, {1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AttnPagedQ8V)->ArgsProduct({{1, 3}, {1, 8}, {1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AttnDense)->Arg(1)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AttnMemcpy)->Arg(1)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_EvictHalf)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_EvictMemcpy)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_MAIN();
