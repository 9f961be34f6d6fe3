// Google Benchmark programs for the pool (issue 2), through the public C API:
//  BM_ReserveFreeOneBlock/<pool blocks>   reserve block_size tokens (one block)
//                                         of a 1-layer pool, truncate to 0
//  BM_ReserveFree256Blocks/<pool blocks>  the same with 256 blocks at once
//      both at 1k and 1M blocks, with half of the pool held by another
//      sequence: the time per block must not depend on the pool's size (O(1)).
//  BM_AppendF16 / BM_MemcpySamePattern    16 tokens of f16 K and V rows,
//      8 KV heads x head_dim 128, into an f16 pool, against memcpy of the
//      same bytes to the same block addresses (bytes/s of both; the ratio is
//      printed by bench/run_quick.sh)
//  BM_AppendQuantized/<codec>             the same 16 tokens into an int8
//      per-token (0), int4 group 32 (1) or int4 group 32 full-range
//      Hadamard (2) pool: the CPU hot-path issue's append goals through
//      kvc_append itself
//  BM_ForkFree/<layers>                   fork of a 4096-token sequence, then
//      free of the child
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench_common.h"
#include "kvcache/kvcache.h"

namespace {


kvc_pool *make_pool(uint32_t layers, uint32_t kv_heads, uint32_t head_dim, uint64_t blocks) {
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = layers;
  c.num_kv_heads = kv_heads;
  c.num_q_heads = kv_heads;
  c.head_dim = head_dim;
  c.block_size = 16;
  c.num_blocks = blocks;
  kvc_pool *p = nullptr;
  OK(kvc_pool_create(&c, &p));
  return p;
}

// A 1-layer pool of `blocks` blocks, half of them held by sequence 100.
kvc_pool *half_full_pool(uint64_t blocks) {
  kvc_pool *p = make_pool(1, 1, 8, blocks);
  OK(kvc_seq_create(p, 100));
  OK(kvc_seq_reserve(p, 100, blocks / 2 * 16, nullptr));
  OK(kvc_seq_create(p, 1));
  return p;
}

void BM_ReserveFreeOneBlock(benchmark::State &state) {
  kvc_pool *p = half_full_pool(static_cast<uint64_t>(state.range(0)));
  for (auto _ : state) {
    kvc_seq_reserve(p, 1, 16, nullptr);
    kvc_seq_truncate(p, 1, 0);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.counters["ns_per_block"] =
      benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate |
                                benchmark::Counter::kInvert);
  kvc_pool_destroy(p);
}
BENCHMARK(BM_ReserveFreeOneBlock)->Arg(1 << 10)->Arg(1 << 20);

void BM_ReserveFree256Blocks(benchmark::State &state) {
  kvc_pool *p = half_full_pool(static_cast<uint64_t>(state.range(0)));
  for (auto _ : state) {
    kvc_seq_reserve(p, 1, 256 * 16, nullptr);
    kvc_seq_truncate(p, 1, 0);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * 256);
  state.counters["ns_per_block"] =
      benchmark::Counter(256, benchmark::Counter::kIsIterationInvariantRate |
                                  benchmark::Counter::kInvert);
  kvc_pool_destroy(p);
}
BENCHMARK(BM_ReserveFree256Blocks)->Arg(1 << 10)->Arg(1 << 20);

// ---- append vs memcpy ----
constexpr uint32_t kHeads = 8, kHeadDim = 128, kTokens = 16, kSeqTokens = 1024;
constexpr size_t kRowBytes = size_t{kHeads} * kHeadDim * 2;  // one token, f16
constexpr size_t kCallBytes = kTokens * kRowBytes;            // K (and again V) per call

struct AppendSetup {
  kvc_pool *pool = nullptr;
  std::vector<uint16_t> k, v;
  std::vector<int32_t> blocks;
  kvc_pool_layout layout{};
  AppendSetup() {
    pool = make_pool(1, kHeads, kHeadDim, kSeqTokens / 16 + 4);
    OK(kvc_seq_create(pool, 1));
    OK(kvc_seq_reserve(pool, 1, kSeqTokens, nullptr));
    k.resize(kCallBytes / 2);
    v.resize(kCallBytes / 2);
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = static_cast<uint16_t>(0x3c00 + (i % 1024));  // finite f16 values
      v[i] = static_cast<uint16_t>(0xbc00 + (i % 1024));
    }
    size_t n = 0;
    blocks.resize(kSeqTokens / 16);
    OK(kvc_seq_block_table(pool, 1, 0, blocks.data(), blocks.size(), &n));
    kvc_pool_layout_init(&layout);
    OK(kvc_pool_get_layout(pool, &layout));
  }
  ~AppendSetup() { kvc_pool_destroy(pool); }
};

void BM_AppendF16(benchmark::State &state) {
  AppendSetup s;
  uint64_t pos = 0;
  for (auto _ : state) {
    kvc_append(s.pool, 1, 0, pos, kTokens, s.k.data(), s.v.data(), KVC_DTYPE_F16);
    pos = (pos + kTokens) % kSeqTokens;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * kCallBytes);
}
BENCHMARK(BM_AppendF16);

// One decode step's append into a quantized pool (16 tokens of f16 K and V
// rows, 8 KV heads x 128): codec 0 int8 per token, 1 int4 group 32, 2 int4
// group 32 full range Hadamard (the default list's row); bytes/s of the f16
// input, beside BM_MemcpySamePattern.
void BM_AppendQuantized(benchmark::State &state) {
  kvc_codec c;
  kvc_codec_init(&c);
  const int64_t which = state.range(0);
  c.dtype = which == 0 ? KVC_DTYPE_INT8 : KVC_DTYPE_INT4;
  c.granularity = which == 0 ? KVC_SCALE_PER_TOKEN : KVC_SCALE_PER_GROUP;
  c.group_size = 32;
  if (which == 2) {
    c.full_range = 1;
    c.rotation = KVC_ROTATION_HADAMARD;
    c.rotation_block = kHeadDim;
  }
  kvc_pool_config cfg;
  kvc_pool_config_init(&cfg);
  cfg.num_layers = 1;
  cfg.num_kv_heads = kHeads;
  cfg.num_q_heads = kHeads;
  cfg.head_dim = kHeadDim;
  cfg.block_size = 16;
  cfg.num_blocks = kSeqTokens / 16 + 4;
  cfg.k_codec = &c;
  cfg.v_codec = &c;
  kvc_pool *pool = nullptr;
  OK(kvc_pool_create(&cfg, &pool));
  OK(kvc_seq_create(pool, 1));
  OK(kvc_seq_reserve(pool, 1, kSeqTokens, nullptr));
  std::vector<uint16_t> k(kCallBytes / 2), v(kCallBytes / 2);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<uint16_t>(0x3c00 + (i % 1024));
    v[i] = static_cast<uint16_t>(0xbc00 + (i % 1024));
  }
  uint64_t pos = 0;
  for (auto _ : state) {
    if (kvc_append(pool, 1, 0, pos, kTokens, k.data(), v.data(), KVC_DTYPE_F16) != KVC_OK)
      state.SkipWithError(kvc_last_error_message());
    pos = (pos + kTokens) % kSeqTokens;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * kCallBytes);
  kvc_pool_destroy(pool);
}
BENCHMARK(BM_AppendQuantized)->Arg(0)->Arg(1)->Arg(2);

// The same bytes to the same addresses: K rows of 16 tokens to the K part of
// the block, V rows to the V part (block_size 16, NHD: each is one contiguous run).
void BM_MemcpySamePattern(benchmark::State &state) {
  AppendSetup s;
  uint64_t pos = 0;
  auto *base = static_cast<uint8_t *>(s.layout.base);
  for (auto _ : state) {
    uint8_t *blk = base + static_cast<uint64_t>(s.blocks[pos / 16]) * s.layout.block_stride;
    const uint64_t slot = pos % 16;
    std::memcpy(blk + s.layout.k_offset + slot * s.layout.k_token_stride, s.k.data(), kCallBytes);
    std::memcpy(blk + s.layout.v_offset + slot * s.layout.v_token_stride, s.v.data(), kCallBytes);
    benchmark::ClobberMemory();
    pos = (pos + kTokens) % kSeqTokens;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * kCallBytes);
}
BENCHMARK(BM_MemcpySamePattern);

// ---- fork ----
void BM_ForkFree(benchmark::State &state) {
  const uint32_t layers = static_cast<uint32_t>(state.range(0));
  constexpr uint64_t kTok = 4096;
  kvc_pool *p = make_pool(layers, 8, 128, layers * (kTok / 16) + 16);
  OK(kvc_seq_create(p, 1));
  OK(kvc_seq_reserve(p, 1, kTok, nullptr));
  for (auto _ : state) {
    kvc_seq_fork(p, 1, 2);
    kvc_seq_free(p, 2);
  }
  state.counters["blocks_shared_per_fork"] = static_cast<double>(layers * (kTok / 16));
  kvc_pool_destroy(p);
}
BENCHMARK(BM_ForkFree)->Arg(1)->Arg(32);

}  // namespace

BENCHMARK_MAIN();
