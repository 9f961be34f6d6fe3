// SPDX-License-Identifier: Apache-2.0
// High-level helpers shared by the kvcache tool and the golden tests:
// locating the shared model/data, greedy generation, and log-probabilities.
#pragma once

#include <kvcache/kvcache.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model.h"
#include "tokenizer.h"

namespace kvc_runner {

/// The folder with models/ and data/: $KVCACHE_SHARED_DIR if set, else the
/// folder compiled in (CMake's KVC_SHARED_DIR).
std::string shared_dir();
/// Where models fetched from outside the repository live (scripts/fetch-models.sh):
/// $KVCACHE_MODEL_CACHE, else $XDG_CACHE_HOME/kvcache, else $HOME/.cache/kvcache.
std::string model_cache_dir();

/// A --model argument: a known name ("stories260k") or a path.
std::string resolve_model_path(const std::string &name_or_path);
/// A --tokenizer argument: a known name or a path. Empty: the tokenizer of
/// `model_arg` when that is a known name, else tokenizer.bin or tok512.bin next
/// to the checkpoint (an error naming --tokenizer when there is none).
std::string resolve_tokenizer_path(const std::string &name_or_path, const std::string &model_arg);
/// The list of known model names, for help texts.
std::vector<std::string> known_models();

/// Reads a whole file (throws RunnerError with a clear message).
std::string read_text_file(const std::string &path, const char *what);

/// Parses "f32", "f16" or "bf16".
bool parse_dtype(const std::string &name, kvc_dtype *out);
const char *dtype_name(kvc_dtype dtype);

struct GenerateOptions {
  std::string prompt;
  int steps = 256;           ///< positions to run (0 or > seq_len: seq_len), like run.c's -n
  float temperature = 0.0f;  ///< 0: greedy (argmax)
  float top_p = 0.9f;        ///< nucleus sampling when temperature > 0
  std::uint64_t seed = 0;    ///< sampling seed (0: fixed default)
  kvc_dtype cache_dtype = KVC_DTYPE_F32;
  bool use_pool = true;  ///< false: plain array cache (no library)
};

struct GenerateResult {
  std::vector<int> tokens;  ///< BOS, prompt ids, then generated ids
  std::string text;         ///< what llama2.c's run.c prints on stdout (final '\n' included)
  int positions = 0;        ///< forward passes run
};

/// Generation exactly as llama2.c's run.c does it: prompt tokens are forced,
/// then tokens are sampled; stops at BOS or after `steps` positions.
GenerateResult generate(const Model &model, const Tokenizer &tokenizer, const GenerateOptions &opt);

/// log softmax of `logits` in double precision: logit - max - log(sum exp(logit - max)).
void log_softmax(const float *logits, int n, std::vector<double> &out);

}  // namespace kvc_runner
