// SPDX-License-Identifier: Apache-2.0
#include "bench.h"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "../runner/error.h"
#include "../runner/kv_cache.h"
#include "../runner/runner.h"
#include "../runner/transformer.h"

namespace kvc_cli {
using namespace kvc_runner;

namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

/// CPU seconds to feed one window of `n` positions (BOS, then token ids from a
/// fixed pseudo-random walk) into `cache`.
template <class Cache>
double time_window(Transformer &transformer, Cache &cache, int n, int vocab) {
  std::uint32_t state = 12345;
  const double start = thread_cpu_seconds();
  for (int pos = 0; pos < n; ++pos) {
    state = state * 1664525u + 1013904223u;
    const int token = pos == 0 ? kBosToken : static_cast<int>(state >> 8) % vocab;
    transformer.forward(cache, token, pos);
  }
  return thread_cpu_seconds() - start;
}

}  // namespace

void run_bench(const BenchOptions &o) {
  if (o.tokens < 1) throw RunnerError("--tokens must be >= 1");
  if (o.rounds < 1) throw RunnerError("--rounds must be >= 1");
  const std::string path = resolve_model_path(o.model);
  const Model model = Model::load(path);
  const ModelConfig &c = model.config();
  Transformer transformer(model);
  const char *names[] = {"array", "f32", "f16", "bf16"};
  const kvc_dtype dtypes[] = {KVC_DTYPE_F32, KVC_DTYPE_F32, KVC_DTYPE_F16, KVC_DTYPE_BF16};
  std::vector<std::unique_ptr<KvPool>> pools;
  for (int k = 1; k < 4; ++k) {
    pools.push_back(std::make_unique<KvPool>(c, dtypes[k], dtypes[k], static_cast<std::uint32_t>(c.seq_len)));
  }
  // Windows of seq_len positions; every window runs on all four caches back to
  // back, `rounds` times, and each (window, cache) keeps its fastest time, so a
  // burst of load from other processes hits no cache kind more than another.
  std::vector<int> windows;
  for (int left = o.tokens; left > 0; left -= c.seq_len) windows.push_back(std::min(left, c.seq_len));
  double best_total[4] = {0, 0, 0, 0};
  std::uint64_t seq_id = 0;
  for (int n : windows) {
    double best[4] = {1e300, 1e300, 1e300, 1e300};
    for (int round = 0; round < o.rounds; ++round) {
      for (int k = 0; k < 4; ++k) {
        double t;
        if (k == 0) {
          ArrayCache cache(c);
          t = time_window(transformer, cache, n, c.vocab_size);
        } else {
          PoolSequence seq(*pools[k - 1], seq_id++, c.n_layers);
          t = time_window(transformer, seq, n, c.vocab_size);
        }
        best[k] = std::min(best[k], t);
      }
    }
    for (int k = 0; k < 4; ++k) best_total[k] += best[k];
  }
  const double base = best_total[0] / o.tokens * 1000.0;
  if (o.json) {
    nlohmann::ordered_json j;
    j["model"] = o.model;
    j["tokens"] = o.tokens;
    j["rounds"] = o.rounds;
    nlohmann::ordered_json results = nlohmann::ordered_json::array();
    for (int k = 0; k < 4; ++k) {
      const double ms = best_total[k] / o.tokens * 1000.0;
      results.push_back({{"cache", names[k]}, {"ms_per_token", ms}, {"overhead_vs_array", ms / base}});
    }
    j["results"] = results;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("forward pass of %s, %d positions (windows of %d) per cache, CPU time, fastest of %d rounds "
              "per window, one thread\n\n",
              o.model.c_str(), o.tokens, c.seq_len, o.rounds);
  std::printf("%-28s  %10s  %16s\n", "cache", "ms/token", "vs plain array");
  std::printf("%s\n", std::string(58, '-').c_str());
  for (int k = 0; k < 4; ++k) {
    const double ms = best_total[k] / o.tokens * 1000.0;
    const std::string name = k == 0 ? "plain array (no pool)" : std::string("kvc_pool ") + names[k] + " (zero copy)";
    std::printf("%-28s  %10.4f  %15.3fx\n", name.c_str(), ms, ms / base);
  }
}

}  // namespace kvc_cli
