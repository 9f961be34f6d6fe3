// SPDX-License-Identifier: Apache-2.0
// `kvcache recommend`: the target from the options, then the measurements
// loaded (recommend_load.cpp), every strategy sized at the target and the pick
// chosen (recommend_size.cpp), and the report (recommend_report.cpp).
#include "recommend.h"

#include <cstdint>
#include <string>

#include "../runner/error.h"
#include "memory.h"
#include "recommend_int.h"

namespace kvc_cli {
using kvc_runner::RunnerError;

void run_recommend(const RecommendOptions &o) {
  // ---- arguments ----
  auto given = [](std::int64_t v) { return v != RecommendOptions::kUnset; };
  auto positive = [](std::int64_t v, const char *flag, std::int64_t hi) {
    if (v < 1 || v > hi) {
      throw RunnerError(std::string(flag) + " " + std::to_string(v) + " must be in 1.." +
                        std::to_string(hi));
    }
    return static_cast<std::uint64_t>(v);
  };
  const bool dims = given(o.num_layers) || given(o.num_kv_heads) || given(o.head_dim);
  if (o.preset.empty() && !dims)
    throw RunnerError(
        "give --preset NAME, or all of --layers, --kv-heads and --head-dim (each >= 1)");
  if (!o.preset.empty() && dims)
    throw RunnerError("give either --preset or --layers/--kv-heads/--head-dim, not both");
  std::uint32_t layers = 0, kv_heads = 0, head_dim = 0;
  if (dims) {
    if (!(given(o.num_layers) && given(o.num_kv_heads) && given(o.head_dim)))
      throw RunnerError("give all of --layers, --kv-heads and --head-dim (or --preset NAME)");
    layers = static_cast<std::uint32_t>(positive(o.num_layers, "--layers", 1 << 20));
    kv_heads = static_cast<std::uint32_t>(positive(o.num_kv_heads, "--kv-heads", 1 << 20));
    head_dim = static_cast<std::uint32_t>(positive(o.head_dim, "--head-dim", 1 << 20));
  }
  recommend::Target t;
  t.geometry = resolve_geometry(o.preset, layers, kv_heads, head_dim);
  if (!given(o.seq_len))
    throw RunnerError("--seq-len N is required (the longest sequence, in tokens)");
  t.seq_len = positive(o.seq_len, "--seq-len", std::int64_t(1) << 40);
  t.batch = positive(o.batch, "--batch", std::int64_t(1) << 30);
  if (o.memory.empty())
    throw RunnerError("--memory SIZE is required (the KV-cache budget, e.g. 16GiB)");
  t.memory = parse_byte_size(o.memory, "--memory");
  if (!o.max_ppl_increase.given)
    throw RunnerError(
        "--max-ppl-increase PCT is required (the largest perplexity increase allowed, in percent)");
  t.max_ppl_increase =
      recommend::typed_number(o.max_ppl_increase, "--max-ppl-increase",
                              "the largest perplexity increase allowed, in percent, e.g. 1");
  if (!(t.max_ppl_increase >= 0.0))
    throw RunnerError("--max-ppl-increase '" + o.max_ppl_increase.text +
                      "' must be a finite percentage >= 0");
  t.elements_per_token =
      2ull * t.geometry.num_layers * t.geometry.num_kv_heads * t.geometry.head_dim;
  const recommend::PrefixInput prefix =
      recommend::prefix_input(o, t.seq_len);  // checked before a long eval run

  // ---- measurements, scaled ----
  const recommend::Measurements m = recommend::measure(o);
  recommend::Choice choice;
  recommend::choose(m, t, choice);
  recommend::PrefixAnalysis pa;
  if (prefix.given) pa = recommend::analyze_prefix(prefix, t, choice);

  if (o.json)
    recommend::print_json_report(t, m, choice, prefix, pa);
  else
    recommend::print_text_report(t, m, choice, prefix, pa);
}

}  // namespace kvc_cli
