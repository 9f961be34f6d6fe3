// SPDX-License-Identifier: Apache-2.0
// eval_recommend_seq_bytes_match_pool: the library's sizing call
// (kvc_pool_seq_bytes, which `kvcache recommend` sizes with) against real
// pools. For each strategy, one sequence grows token by token to 700 tokens
// (3 layers, 2 KV heads of 64); after every token the pool's bytes_in_use
// must equal the call's bytes at that length, and the running maximum its
// peak_bytes; then peak_bytes must be the running maximum of bytes up to
// 20,000 tokens.
#include <cmath>
#include <cstdio>
#include <vector>

#include "../cli/strategy.h"
#include "../runner/kv_cache.h"
#include "../runner/model.h"

using namespace kvc_cli;

int main() {
  const char *specs[] = {
      "f16", "int8:per-token", "int4:group=32:full-range:hadamard", "kivi4:group=16:residual=32",
      "kivi2:group=32:residual=40", "hybrid:fraction=0.25",
      "hybrid:fraction=0.3:kchannel=4",  // groups of 4 in blocks of 16: staged tokens start
                                         // mid-block
      "kivi4:group=8:residual=20",
      "kivi4:group=4:residual=1",         // a target of 1: the residual empties again and again
      "hybrid:fraction=0.05:kchannel=4",  // the target reaches 2 only at 40 tokens
      "int4:per-token:sinks=2",
      "k-int4:kchannel=128:asym:pre-rope:sinks=1+v-int4:per-token:full-range:hadamard",
      "k-int3:kchannel=64:asym+v-int2:group=32:full-range",
      "hybrid:fraction=0.004:kchannel=2",  // the residual empties until 500 tokens
      "hybrid:fraction=1e-9:kchannel=4",   // ... until 2e9 tokens: not stepped through (it hung
                                           // recommend)
  };
  const std::uint32_t layers = 3, heads = 2, hd = 64, row = heads * hd;
  const std::uint64_t n_max = 700;
  kvc_runner::ModelConfig c;
  c.n_layers = layers;
  c.n_heads = c.n_kv_heads = heads;
  c.dim = heads * hd;
  int failures = 0;
  std::vector<float> k(row), v(row);
  for (const char *spec : specs) {
    const Strategy s = parse_strategy(spec);
    // The config of the pool below, sized by the library without a pool.
    const kvc_runner::PoolSettings settings = pool_settings(s);
    const kvc_pool_config cfg = kvc_runner::pool_config(c, settings, 1);
    bool sized = true;
    auto size_at = [&](std::uint64_t n, bool peak) {
      std::uint64_t bytes = 0, most = 0;
      if (kvc_pool_seq_bytes(&cfg, n, &bytes, &most) != KVC_OK) {
        if (sized)
          std::fprintf(stderr, "%s: kvc_pool_seq_bytes: %s\n", spec, kvc_last_error_message());
        sized = false;
      }
      return peak ? most : bytes;
    };
    size_at(1, false);
    if (!sized) {
      ++failures;
      continue;
    }
    kvc_runner::KvPool pool(c, pool_settings(s),
                            static_cast<std::uint32_t>(n_max + 2 * s.block_size));
    if (kvc_seq_create(pool.get(), 1) != KVC_OK) return 1;
    std::uint64_t running = 0;
    int bad = 0;
    for (std::uint64_t n = 1; n <= n_max && bad < 5; ++n) {
      if (kvc_seq_reserve(pool.get(), 1, 1, nullptr) != KVC_OK) {
        std::fprintf(stderr, "%s: reserve at %llu: %s\n", spec, (unsigned long long)n,
                     kvc_last_error_message());
        ++bad;
        break;
      }
      for (std::uint32_t l = 0; l < layers; ++l) {
        for (std::uint32_t e = 0; e < row; ++e) {
          k[e] = std::sin(0.1f * float(n) + 0.7f * float(e) + float(l));
          v[e] = std::cos(0.3f * float(n) - 0.2f * float(e));
        }
        if (kvc_append(pool.get(), 1, l, n - 1, 1, k.data(), v.data(), KVC_DTYPE_F32) != KVC_OK) {
          std::fprintf(stderr, "%s: append: %s\n", spec, kvc_last_error_message());
          return 1;
        }
      }
      const std::uint64_t used = pool.stats().bytes_in_use;
      running = std::max(running, used);
      if (used != size_at(n, false) || running != size_at(n, true)) {
        std::fprintf(stderr,
                     "%s: at %llu tokens the pool holds %llu bytes (peak %llu), kvc_pool_seq_bytes "
                     "says %llu (%llu)\n",
                     spec, (unsigned long long)n, (unsigned long long)used,
                     (unsigned long long)running, (unsigned long long)size_at(n, false),
                     (unsigned long long)size_at(n, true));
        ++bad;
      }
    }
    // Beyond the pool: peak(n) is the running maximum of bytes(n) over many more lengths.
    std::uint64_t most = 0;
    for (std::uint64_t n = 1; n <= 20000 && bad < 5; ++n) {
      most = std::max(most, size_at(n, false));
      if (most != size_at(n, true)) {
        std::fprintf(
            stderr, "%s: at %llu tokens the most bytes so far are %llu, peak_bytes is %llu\n", spec,
            (unsigned long long)n, (unsigned long long)most, (unsigned long long)size_at(n, true));
        ++bad;
      }
    }
    failures += bad;
    std::printf("%-80s %s (700 tokens: %llu bytes)\n", spec, bad ? "FAIL" : "ok",
                (unsigned long long)size_at(n_max, false));
  }
  return failures ? 1 : 0;
}
