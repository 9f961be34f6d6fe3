// SPDX-License-Identifier: Apache-2.0
// The `kvcache` command-line tool: eval, memory, generate, bench, recommend.
// Each subcommand registers itself (commands.h, cmd_<name>.cpp); main parses
// the command line, which runs the chosen subcommand's callback, and turns
// errors into one line on stderr and an exit status.
#include <kvcache/kvcache.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "../runner/blas.h"
#include "../runner/error.h"
#include "commands.h"

int main(int argc, char **argv) {
  // OpenBLAS's fallback to SSE3 kernels on CPUs it does not know (blas.h)
  kvc_runner::ensure_blas_core(argv);
  CLI::App app{"kvcache: measure and size KV-cache strategies (libkvcache " +
               std::string(kvc_version_string()) + ")"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(kvc_version_string()));
  kvc_cli::register_eval(app);
  kvc_cli::register_memory(app);
  kvc_cli::register_generate(app);
  kvc_cli::register_bench(app);
  kvc_cli::register_recommend(app);
  kvc_cli::register_calibrate(app);

  try {
    app.parse(argc, argv);  // runs the subcommand's callback once every option is read
  } catch (const CLI::ParseError &e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // Usage errors read like every other error: one line, exit status 1.
    std::fprintf(stderr, "kvcache: error: %s (see --help)\n", e.what());
    return 1;
  } catch (const kvc_runner::RunnerError &e) {
    std::fprintf(stderr, "kvcache: error: %s\n", e.what());
    return 1;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "kvcache: internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}
