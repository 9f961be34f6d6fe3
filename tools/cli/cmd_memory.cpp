// SPDX-License-Identifier: Apache-2.0
// `kvcache memory`: its options and its run.
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "commands.h"
#include "memory.h"

namespace kvc_cli {

std::string presets_help() {
  std::string help = "Model preset:";
  for (const ModelPreset &p : model_presets()) help += std::string(" ") + p.name;
  return help;
}

void register_memory(CLI::App &app) {
  const auto mem_opt = std::make_shared<MemoryOptions>();
  CLI::App *memory =
      app.add_subcommand("memory", "KV-cache size of a model: per token, per layer, in total");
  memory->add_option("--preset", mem_opt->preset, presets_help());
  memory->add_option("--layers", mem_opt->num_layers, "Transformer layers (instead of --preset)");
  memory->add_option("--kv-heads", mem_opt->num_kv_heads, "KV heads (instead of --preset)");
  memory->add_option("--head-dim", mem_opt->head_dim, "Elements per head (instead of --preset)");
  memory->add_option("--seq-len", mem_opt->seq_len, "Tokens per sequence")->required();
  memory->add_option("--batch", mem_opt->batch, "Sequences")->capture_default_str();
  memory->add_option("--dtype", mem_opt->dtype, "Storage dtype: f32, f16, bf16")
      ->capture_default_str();
  memory->add_flag("--json", mem_opt->json, "Write one JSON object to stdout");
  memory->callback([mem_opt] { run_memory(*mem_opt); });
}

}  // namespace kvc_cli
