// SPDX-License-Identifier: Apache-2.0
// `kvcache memory`: KV-cache size of a model geometry.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvc_cli {

struct ModelPreset {
  const char *name;
  const char *description;
  std::uint32_t num_layers, num_q_heads, num_kv_heads, head_dim;
};

const std::vector<ModelPreset> &model_presets();

struct MemoryOptions {
  std::string preset;  ///< empty: explicit dimensions
  std::uint32_t num_layers = 0, num_kv_heads = 0, head_dim = 0;
  std::uint64_t seq_len = 0;
  std::uint64_t batch = 1;
  std::string dtype = "f16";
  bool json = false;
};

/// Prints the report; throws kvc_runner::RunnerError on bad options.
void run_memory(const MemoryOptions &options);

}  // namespace kvc_cli
