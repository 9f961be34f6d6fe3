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

/// A model geometry from a preset name or explicit dimensions (0: not given).
struct Geometry {
  std::string name;         ///< the preset's name, or "custom"
  std::string description;  ///< the preset's description, or "explicit dimensions"
  std::uint32_t num_layers = 0, num_kv_heads = 0, head_dim = 0;
};
/// Looks up `preset`, or takes all three dimensions; throws kvc_runner::RunnerError
/// for an unknown preset, a preset together with dimensions, or missing dimensions.
Geometry resolve_geometry(const std::string &preset, std::uint32_t num_layers,
                          std::uint32_t num_kv_heads, std::uint32_t head_dim);

/// Parses a byte size: a number (integer, decimal or with an exponent: 1e9) and an
/// optional unit, B, KB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB (powers of 1024),
/// case-insensitive, e.g. "16GiB", "512 MiB", "1e9". The result is rounded down
/// to whole bytes and must be 1..2^63; throws kvc_runner::RunnerError naming `what`.
std::uint64_t parse_byte_size(const std::string &text, const std::string &what);

/// "1.50 GiB", "512 B": binary units, two decimals.
std::string human_bytes(long double bytes);

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
