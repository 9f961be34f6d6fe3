// SPDX-License-Identifier: Apache-2.0
#include "calibration.h"

#include <cmath>
#include <string>

#include "../runner/error.h"
#include "../runner/transformer.h"

namespace kvc_cli {

using kvc_runner::RunnerError;

namespace {

// The plain f32 cache, also showing each layer's queries to the caller.
struct QueryWatchingCache : kvc_runner::ArrayCache {
  using ArrayCache::ArrayCache;
  const std::function<void(int, int, const float *)> *on_query = nullptr;
  void observe_query(int layer, int pos, const float *q) {
    if (*on_query) (*on_query)(layer, pos, q);
  }
};

}  // namespace

void run_calibration(const kvc_runner::Model &model, const std::vector<int> &tokens, int bos,
                     int window, int windows,
                     const std::function<void(const kvc_runner::ArrayCache &)> &f,
                     const std::function<void(int layer, int pos, const float *q)> &on_query) {
  const kvc_runner::ModelConfig &c = model.config();
  if (window < 2 || window > c.seq_len)
    throw RunnerError("--window " + std::to_string(window) + " must be in [2, " +
                      std::to_string(c.seq_len) + "] (the model's context)");
  if (windows < 1) throw RunnerError("--windows must be at least 1");
  const std::size_t need = std::size_t(window - 1) * std::size_t(windows);
  if (tokens.size() < need)
    throw RunnerError("the text has " + std::to_string(tokens.size()) + " tokens; " +
                      std::to_string(windows) + " windows of " + std::to_string(window) +
                      " positions need " + std::to_string(need));
  kvc_runner::Transformer tf(model, window);
  QueryWatchingCache cache(c);
  cache.on_query = &on_query;
  for (int w = 0; w < windows; ++w) {
    const std::size_t first = std::size_t(w) * std::size_t(window - 1);
    for (int pos = 0; pos < window; ++pos)
      tf.forward(cache, pos == 0 ? bos : tokens[first + std::size_t(pos - 1)], pos);
    f(cache);
  }
}

std::vector<float> rope_inv_freq(const kvc_runner::ModelConfig &c) {
  const int hd = c.head_dim(), half = hd / 2;
  std::vector<float> inv_freq(static_cast<std::size_t>(half));
  for (int i = 0; i < half; ++i)
    inv_freq[std::size_t(i)] =
        1.0f / std::pow(c.rope_theta, static_cast<float>(2 * i) / static_cast<float>(hd));
  return inv_freq;
}

}  // namespace kvc_cli
