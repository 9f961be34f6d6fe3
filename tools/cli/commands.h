// SPDX-License-Identifier: Apache-2.0
// The `kvcache` subcommands, one file each (cmd_<name>.cpp, as libgit2's
// src/cli/cmd_*.c): each adds itself to the tool's CLI::App with its options,
// help texts and defaults, and the callback that runs it once the command line
// is parsed. The callbacks report errors by throwing: kvc_runner::RunnerError
// for bad arguments and bad files (main prints "kvcache: error: ..." and exits
// 1), any other exception as an internal error (exit 3).
#pragma once

#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace kvc_cli {

/// `kvcache eval`: KV-cache strategies against the dense f32 cache (the table,
/// --long, --plot, --peer) and the --prefix scenario (cmd_eval.cpp).
void register_eval(CLI::App &app);

/// `kvcache memory`: the KV-cache size of a model geometry (cmd_memory.cpp).
void register_memory(CLI::App &app);

/// `kvcache generate`: text from the model runner, llama2.c run.c compatible
/// (cmd_generate.cpp).
void register_generate(CLI::App &app);

/// `kvcache bench`: the library's operations timed beside their baselines
/// (cmd_bench.cpp).
void register_bench(CLI::App &app);

/// `kvcache recommend`: the smallest strategy meeting a quality floor, sized
/// for a target model, length, batch and memory budget (cmd_recommend.cpp).
void register_recommend(CLI::App &app);

/// `kvcache calibrate`: per-channel statistics of a model's pre-RoPE keys,
/// for key smoothing (cmd_calibrate.cpp).
void register_calibrate(CLI::App &app);

/// The help text of --preset (memory, recommend): "Model preset:" followed by
/// every preset's name.
std::string presets_help();

}  // namespace kvc_cli
