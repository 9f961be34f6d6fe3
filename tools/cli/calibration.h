// SPDX-License-Identifier: Apache-2.0
// The model run `kvcache calibrate` fits from (per-channel key statistics,
// key_stats.h; codebooks, codebook_fit.h), and the runner's RoPE frequencies
// both use to rotate keys back before RoPE.
#pragma once

#include <functional>
#include <vector>

#include "../runner/kv_cache.h"
#include "../runner/model.h"

namespace kvc_cli {

/// The calibration run `kvcache calibrate` fits from (key statistics,
/// codebooks): `windows` windows of `window` positions (BOS, then the next
/// window - 1 tokens of `tokens`), one token at a time on a plain f32 cache;
/// `f(cache)` after each window's forward pass. Throws RunnerError for a
/// window outside [2, the model's context], no window, or too short a text.
/// `on_query(layer, pos, q)`, when given, sees each token's queries after RoPE
/// (`[n_heads][head_dim]` floats at RoPE position `pos`), layer by layer.
void run_calibration(
    const kvc_runner::Model &model, const std::vector<int> &tokens, int bos, int window,
    int windows, const std::function<void(const kvc_runner::ArrayCache &)> &f,
    const std::function<void(int layer, int pos, const float *q)> &on_query = nullptr);

/// The runner's RoPE frequencies, theta^(-2i / head_dim) for pair i of a head.
std::vector<float> rope_inv_freq(const kvc_runner::ModelConfig &c);

}  // namespace kvc_cli
