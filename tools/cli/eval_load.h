// SPDX-License-Identifier: Apache-2.0
// `kvcache eval`, loading: the model, its tokenizer and the text, tokenized
// and cut into the windows every strategy is scored on (eval_load.cpp). The
// strategy runs (eval_run.cpp) read what this returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../runner/model.h"
#include "../runner/tokenizer.h"
#include "eval.h"

namespace kvc_cli {

/// One window of the text: position 0 is its context token (BOS, or the text
/// token before its first scored one), positions 1..scored feed the scored
/// tokens; every window is scored separately, from an empty cache.
struct EvalWindow {
  std::size_t first = 0;  ///< index of its first content token
  int scored = 0;         ///< tokens scored (positions fed = scored + 1)
};

/// The model, the tokenizer and the text of an eval run, cut into windows.
struct EvalInput {
  kvc_runner::Model model;          ///< the checkpoint or GGUF file, loaded and checked
  kvc_runner::Tokenizer tokenizer;  ///< its tokenizer, as many pieces as the model's vocabulary
  std::vector<int> tokens;          ///< the whole text, without BOS
  std::vector<EvalWindow> windows;  ///< in text order, each of at most ctx - 1 scored tokens
  int ctx = 0;                      ///< positions per window, context token included
  int segment = 0;                  ///< positions per segment of the per-segment perplexity
  std::size_t n_segments = 0;       ///< segments per window (ceil(ctx / segment))
  int chunk = 1;                    ///< positions per forward pass
  bool use_bos = true;        ///< windows start with BOS (else with the token before the window)
  int bos = 0;                ///< the tokenizer's BOS token
  std::int64_t to_score = 0;  ///< tokens scored, over all windows
};

/// Resolves and loads the model, its tokenizer and the text of `options`,
/// checks --ctx, --max-tokens, --segment and --chunk against the model, and
/// cuts the text into windows. Fills the description of `report` (names,
/// paths, geometry, ctx, segment, chunk, windows, tokens scored). Throws
/// kvc_runner::RunnerError for a bad file or an option out of range.
EvalInput load_eval_input(const EvalOptions &options, EvalReport &report);

}  // namespace kvc_cli
