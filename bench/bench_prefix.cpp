// Prefix cache lookups (issue "Prefix cache"):
//  BM_PrefixLookup/<hash>/<cached blocks>  kvc_prefix_lookup of a prompt whose
//      first <cached blocks> blocks of 16 tokens are cached (hash 0 = SHA-256,
//      1 = XXH3-128); the prompt is that many blocks + 1 token, so every
//      block is a hit. Time per token.
//  BM_HashPass/<hash>/<blocks>             one pass of the same hash over the
//      same token bytes (one digest per 16-token block), the baseline.
//  BM_RegisterReclaim                       register a 16-token block and
//      reclaim it (time per block)
#include <benchmark/benchmark.h>
#define OPENSSL_SUPPRESS_DEPRECATED 1
#include <openssl/sha.h>
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "bench_common.h"
#include "kvcache/kvcache.h"

namespace {


constexpr uint32_t kBs = 16;

kvc_pool *make_pool(int hash, uint64_t blocks) {
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = 1;
  c.num_q_heads = c.num_kv_heads = 1;
  c.head_dim = 8;
  c.block_size = kBs;
  c.num_blocks = blocks + 8;
  kvc_pool *p = nullptr;
  OK(kvc_pool_create(&c, &p));
  kvc_prefix_config pc;
  kvc_prefix_config_init(&pc);
  pc.hash = hash ? KVC_PREFIX_HASH_XXH3_128 : KVC_PREFIX_HASH_SHA256;
  OK(kvc_pool_enable_prefix_cache(p, &pc));
  return p;
}

// Only written blocks register in the prefix cache: the K/V (zeros) of n
// tokens of the one layer (1 KV head of 8).
void write_zeros(kvc_pool *p, uint64_t id, uint64_t n) {
  const std::vector<float> zeros(n * 8, 0.0f);
  OK(kvc_append(p, id, 0, 0, n, zeros.data(), zeros.data(), KVC_DTYPE_F32));
}

void BM_PrefixLookup(benchmark::State &state) {
  const int hash = static_cast<int>(state.range(0));
  const uint64_t blocks = static_cast<uint64_t>(state.range(1));
  kvc_pool *p = make_pool(hash, blocks);
  std::vector<int32_t> toks(blocks * kBs + 1);
  std::iota(toks.begin(), toks.end(), 1000);
  OK(kvc_seq_create(p, 1));
  OK(kvc_seq_reserve(p, 1, blocks * kBs, nullptr));
  write_zeros(p, 1, blocks * kBs);
  OK(kvc_prefix_insert(p, 1, toks.data(), blocks * kBs, nullptr, 0, nullptr));
  kvc_prefix_result r;
  r.struct_size = sizeof r;
  for (auto _ : state) {
    OK(kvc_prefix_lookup(p, toks.data(), toks.size(), nullptr, 0, 0, &r));
    if (r.hit_blocks != blocks) state.SkipWithError("not every block hit");
    benchmark::DoNotOptimize(r.hit_tokens);
  }
  state.counters["ns_per_token"] = benchmark::Counter(double(blocks * kBs), benchmark::Counter::kIsIterationInvariantRate |
                                                                                benchmark::Counter::kInvert);
  state.SetLabel(hash ? "xxh3-128" : "sha-256");
  kvc_pool_destroy(p);
}

void BM_HashPass(benchmark::State &state) {
  const int hash = static_cast<int>(state.range(0));
  const uint64_t blocks = static_cast<uint64_t>(state.range(1));
  std::vector<int32_t> toks(blocks * kBs);
  std::iota(toks.begin(), toks.end(), 1000);
  unsigned char out[32];
  for (auto _ : state) {
    for (uint64_t b = 0; b < blocks; ++b) {
      if (hash) {
        const XXH128_hash_t h = XXH3_128bits(toks.data() + b * kBs, kBs * 4);
        benchmark::DoNotOptimize(h);
      } else {
        SHA256_CTX c;  // the low-level interface, as the library uses
        SHA256_Init(&c);
        SHA256_Update(&c, toks.data() + b * kBs, kBs * 4);
        SHA256_Final(out, &c);
        benchmark::DoNotOptimize(out);
      }
    }
  }
  state.counters["ns_per_token"] = benchmark::Counter(double(blocks * kBs), benchmark::Counter::kIsIterationInvariantRate |
                                                                                benchmark::Counter::kInvert);
  state.SetLabel(hash ? "xxh3-128" : "sha-256");
}

void BM_RegisterReclaim(benchmark::State &state) {
  kvc_pool *p = make_pool(1, 1);  // 9 blocks: one sequence block at a time
  std::vector<int32_t> toks(kBs);
  int32_t next = 0;
  uint64_t id = 1;
  for (auto _ : state) {
    std::iota(toks.begin(), toks.end(), next);
    next += kBs;
    OK(kvc_seq_create(p, id));
    OK(kvc_seq_reserve(p, id, kBs, nullptr));  // reclaims the oldest cached block once the pool is full
    write_zeros(p, id, kBs);
    OK(kvc_prefix_insert(p, id, toks.data(), kBs, nullptr, 0, nullptr));
    OK(kvc_seq_free(p, id));  // cached
    ++id;
  }
  kvc_pool_destroy(p);
}

}  // namespace

BENCHMARK(BM_PrefixLookup)->ArgsProduct({{0, 1}, {1, 64, 2048}});
BENCHMARK(BM_HashPass)->ArgsProduct({{0, 1}, {1, 64, 2048}});
BENCHMARK(BM_RegisterReclaim);
BENCHMARK_MAIN();
