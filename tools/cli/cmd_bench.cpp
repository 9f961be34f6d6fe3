// SPDX-License-Identifier: Apache-2.0
// `kvcache bench`: its options and its run.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <vector>

#include "bench.h"
#include "commands.h"

namespace kvc_cli {

void register_bench(CLI::App &app) {
  const auto bench_opt = std::make_shared<BenchOptions>();
  CLI::App *bench = app.add_subcommand(
      "bench",
      "Time the library's operations (pool, codecs, attention, eviction, prefix lookup) and the "
      "model's forward pass, each beside a baseline measured in the same run");
  bench->add_flag("--quick", bench_opt->quick,
                  "Short rounds: the whole run in well under a minute");
  bench->add_option("--filter", bench_opt->filter,
                    "Run only the cases whose group/name contains this text");
  bench
      ->add_option("--model", bench_opt->model, "Checkpoint path or known name (forward-pass case)")
      ->capture_default_str();
  bench->add_option("--tokens", bench_opt->tokens,
                    "Forward-pass case: positions per pass (default: the model's seq_len)");
  bench->add_option("--rounds", bench_opt->rounds,
                    "Rounds per case, the fastest counts (default 5, --quick 3)");
  bench->add_flag("--json", bench_opt->json, "Write one JSON object to stdout");
  bench->callback([bench_opt] {
    const std::vector<BenchResult> results = run_bench(*bench_opt);
    if (bench_opt->json)
      std::printf("%s\n", bench_json(*bench_opt, results).c_str());
    else
      print_bench(*bench_opt, results);
  });
}

}  // namespace kvc_cli
