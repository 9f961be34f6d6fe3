// SPDX-License-Identifier: Apache-2.0
// `kvcache bench`: cost per token of the forward pass on the pool vs a plain array cache.
#pragma once

#include <string>

namespace kvc_cli {

struct BenchOptions {
  std::string model = "stories260k";
  int tokens = 4096;  ///< positions per cache kind and round
  int rounds = 5;     ///< per window, the fastest round counts
  bool json = false;
};

void run_bench(const BenchOptions &options);

}  // namespace kvc_cli
