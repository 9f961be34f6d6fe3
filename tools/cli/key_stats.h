// SPDX-License-Identifier: Apache-2.0
// Per-channel statistics of a model's pre-RoPE keys, fitted by `kvcache
// calibrate` from a model run, and the key smoothing a pool takes from them
// (kvc_pool_set_key_smoothing; docs/codecs.md "Key smoothing"). The file
// format (text, '#' comments):
//
//   kvcache-key-stats 1
//   rope interleaved                   channel order: RoPE pairs (2i, 2i+1) (the
//                                      runner's, llama.cpp's) or `neox` (i, i + D/2,
//                                      Hugging Face's); optional, default interleaved
//   layers L kv_heads H head_dim D
//   mean <layer> <H x D numbers>       one line per layer
//   rms <layer> <H x D numbers>        root mean square around the mean
//   absmax <layer> <H x D numbers>     largest |k - mean|
//   qrms <layer> <H x D numbers>       optional (every layer or none): root mean
//                                      square of the queries before RoPE, over
//                                      the query heads of each KV head
//
// Built-in statistics of the two models eval knows come from bench/calib.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../runner/model.h"

namespace kvc_cli {

/// Statistics of keys before RoPE, per layer and channel: arrays `[layers][kv_heads * head_dim]`.
struct KeyStats {
  int layers = 0, kv_heads = 0, head_dim = 0;
  std::vector<float> mean, rms, absmax;
  /// Root mean square of the queries before RoPE per key channel (the mean of
  /// q[c]^2 over the query heads that share the KV head); empty: not fitted.
  std::vector<float> qrms;
  std::uint64_t tokens = 0;  ///< keys the statistics saw per channel (0: unknown)
  bool neox = false;         ///< channels in NeoX order (pairs (i, i + D/2)), else interleaved
};

/// The statistics with their channels in the runner's interleaved order (a
/// copy; `s` unchanged when it is already interleaved).
KeyStats interleaved(const KeyStats &s);

/// Parses a statistics text; throws RunnerError naming `where`, the line and the problem.
KeyStats parse_key_stats(const std::string &text, const std::string &where);

/// The text of `s` (values to 6 significant digits), with `comment` lines first.
std::string format_key_stats(const KeyStats &s, const std::string &comment);

/// The statistics for a model: `file` when given, else the built-in ones of
/// stories260K or SmolLM2-135M (matched by geometry); throws RunnerError when
/// there are none or their geometry is not the model's.
KeyStats model_key_stats(const kvc_runner::ModelConfig &c, const std::string &file);

/// Key smoothing from statistics (the `smooth[=A]` and `qsmooth=B` codec
/// flags): scale[c] = max(rms[c], 1e-3 x the layer's largest rms) ^ alpha /
/// max(qrms[c], 1e-3 x the layer's largest qrms) ^ beta (not divided in a
/// layer whose qrms are all 0), clamped to [1e-30, 1e30] (1 in a layer whose
/// rms are all 0), offset[c] = mean[c]. beta > 0 needs qrms (RunnerError
/// otherwise). (Measured on SmolLM2: the rms beat the largest
/// deviation on perplexity, alpha 1 beat 0.5, and centering is what lets
/// symmetric codes work; docs/codecs.md "Key smoothing".)
void key_smoothing(const KeyStats &s, double alpha, double beta, std::vector<float> &scale,
                   std::vector<float> &offset);

/// Fits statistics from a model run: `windows` windows of `window` positions
/// (BOS, then the next window - 1 tokens of `tokens`), one token at a time on
/// a plain f32 cache; each key is rotated back from its RoPE position (the
/// runner's interleaved pairs, the model's theta) before it is counted. The
/// keys at position 0 (BOS, the attention sink, whose channels lie far from
/// every other token's) are left out: a pool keeps them exact with
/// residual_sinks. The queries of positions 1 and on, rotated back the same
/// way, give `qrms`.
KeyStats fit_key_stats(const kvc_runner::Model &model, const std::vector<int> &tokens, int bos,
                       int window, int windows);

}  // namespace kvc_cli
