// SPDX-License-Identifier: Apache-2.0
// `kvcache recommend`: picks the KV-cache strategy with the least memory that
// meets a quality floor, from measured eval results, scaled to a target model
// geometry, sequence length and batch; says whether a memory budget holds and
// when prefix caching (and a smaller block size) pays. docs/recommend.md.
// By role (recommend_int.h): loading the measurements and prefix reports
// (recommend_load.cpp), sizing and choosing (recommend_size.cpp), reporting
// (recommend_report.cpp); the options are registered in cmd_recommend.cpp.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

namespace kvc_cli {

/// A number option kept as typed (the command line assigns the text), so that
/// "", "nan" or "1e999" are refused naming exactly what was given.
struct TypedOption {
  std::string text;
  bool given = false;
  TypedOption &operator=(const std::string &typed) {
    text = typed;
    given = true;
    return *this;
  }
};

struct RecommendOptions {
  static constexpr std::int64_t kUnset = std::numeric_limits<std::int64_t>::min();

  // Target: a preset or explicit dimensions, a length, a batch and a budget.
  std::string preset;
  std::int64_t num_layers = kUnset, num_kv_heads = kUnset, head_dim = kUnset;
  std::int64_t seq_len = kUnset;
  std::int64_t batch = 1;
  std::string memory;            ///< a byte size: 16GiB, 512MiB, 1e9
  TypedOption max_ppl_increase;  ///< percent
  // Measurements: an `eval --json` file, or an eval run here.
  std::string from;
  std::string model = "stories260k";  ///< the model of the eval run here
  std::string strategies;             ///< the eval run's strategies (empty: the defaults)
  std::int64_t eval_tokens = 32768;   ///< tokens the eval run here scores
  bool progress = true;
  // Prefix caching: flags, or an `eval --prefix --json` file.
  TypedOption prefix_share;  ///< 0..1
  std::int64_t prefix_tokens = kUnset;
  std::int64_t block_size = kUnset;  ///< unset: the prefix file's, else 16
  std::string from_prefix;
  bool json = false;
};

/// Prints the recommendation (text or one JSON object) to stdout. Throws
/// kvc_runner::RunnerError for bad options or a bad file; "nothing meets the
/// floor" and "does not fit" are answers, not errors.
void run_recommend(const RecommendOptions &options);

}  // namespace kvc_cli
