// SPDX-License-Identifier: Apache-2.0
// `kvcache bench`: the library's operations (pool, codecs, attention,
// eviction, prefix hashing) and the model's forward pass, each timed beside a
// baseline measured in the same run (memcpy of the same bytes, malloc, a
// plain loop, a plain hash map), with the ratio. Timings are reported, never
// judged: a slow figure is not an error.
#pragma once

#include <string>
#include <vector>

namespace kvc_cli {

struct BenchOptions {
  std::string model = "stories260k";
  int tokens = 0;  ///< forward pass: positions per operation (0: the model's seq_len, --quick 256)
  int rounds = 0;  ///< rounds per case, the fastest counts (0: 5, --quick 3)
  bool quick = false;  ///< fewer and shorter rounds: the whole run in well under a minute
  bool json = false;
  std::string filter;  ///< run only cases whose "group/name" contains this text
};

/// One measured case: `seconds` per operation of the library, `baseline_seconds`
/// per operation of the baseline; speed = baseline_seconds / seconds (> 1: faster).
struct BenchResult {
  std::string group, name, baseline;
  double seconds = 0, baseline_seconds = 0;
  double bytes = 0;       ///< bytes one operation moves (0: not a bandwidth case)
  double items = 0;       ///< tokens (or rows) one operation handles
  std::string item_unit;  ///< "token", "row", "block"...
};

std::vector<BenchResult> run_bench(const BenchOptions &options);
void print_bench(const BenchOptions &options, const std::vector<BenchResult> &results);
std::string bench_json(const BenchOptions &options, const std::vector<BenchResult> &results);

}  // namespace kvc_cli
