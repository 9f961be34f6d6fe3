// SPDX-License-Identifier: Apache-2.0
// DuoAttention's per-head gates for `kvcache eval` (docs/eviction.md): a
// text of num_layers x num_kv_heads values in [0, 1], layer by layer; the
// heads with the lowest gates stream. Built-in gates of the two models eval
// knows come from bench/duo (derived there by bench/duo/derive_gates.py).
#pragma once

#include <string>
#include <vector>

#include "../runner/model.h"

namespace kvc_cli {

/// Parses a gates text (whitespace-separated numbers, '#' to the end of a
/// line is a comment); throws RunnerError naming `where` and the problem.
std::vector<float> parse_gates(const std::string &text, const std::string &where);

/// The gates for a model: `file` when given, else the built-in gates of
/// stories260K or SmolLM2-135M (matched by geometry); throws RunnerError when
/// there are none or their count is not n_layers x n_kv_heads.
std::vector<float> model_gates(const kvc_runner::ModelConfig &c, const std::string &file);

/// The binary gates of a duo-attention row: the `share` of heads with the
/// lowest gates (ties: the lower index) get 0 (stream), the others 1; with
/// `only` >= 0, head `only` alone streams.
std::vector<float> streaming_heads(const std::vector<float> &gates, double share, int only);

}  // namespace kvc_cli
