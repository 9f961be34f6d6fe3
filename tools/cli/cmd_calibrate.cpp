// SPDX-License-Identifier: Apache-2.0
// `kvcache calibrate`: per-channel statistics of a model's pre-RoPE keys (and
// the queries' rms per key channel, for qsmooth) from a model run
// (key_stats.h), written to the file `kvcache eval --key-stats` and
// kvc_pool_set_key_smoothing() callers read (docs/codecs.md).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "../runner/error.h"
#include "../runner/runner.h"
#include "../runner/tokenizer.h"
#include "codebook_fit.h"
#include "commands.h"
#include "key_stats.h"
#include "strategy.h"

namespace kvc_cli {
namespace {

using kvc_runner::RunnerError;

struct CalibrateCommand {
  std::string model = "stories260k", tokenizer, text, out, codebook, key_stats;
  int window = 0, windows = 4;
  bool codebook_given = false;
  long long skip = 0;
};

void run_calibrate(const CalibrateCommand &cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  const kvc_runner::Model model =
      kvc_runner::Model::load(kvc_runner::resolve_model_path(cmd.model));
  const kvc_runner::ModelConfig &c = model.config();
  const kvc_runner::Tokenizer tokenizer = kvc_runner::Tokenizer::load(
      kvc_runner::resolve_tokenizer_path(cmd.tokenizer, cmd.model), c.vocab_size);
  const std::string text_path =
      cmd.text.empty() ? kvc_runner::shared_dir() + "/data/out-of-domain.txt" : cmd.text;
  std::vector<int> tokens =
      tokenizer.encode(kvc_runner::read_text_file(text_path, "text file"), false, false);
  if (cmd.skip < 0 || static_cast<unsigned long long>(cmd.skip) > tokens.size())
    throw RunnerError("--skip " + std::to_string(cmd.skip) + " is outside the text's " +
                      std::to_string(tokens.size()) + " tokens");
  tokens.erase(tokens.begin(), tokens.begin() + cmd.skip);
  const int window = cmd.window ? cmd.window : std::min(c.seq_len, 512);
  const std::size_t slash = text_path.find_last_of('/');
  const std::string source =
      "model " + cmd.model + ", " + std::to_string(cmd.windows) + " windows of " +
      std::to_string(window) + " positions (BOS + text) of " +
      (slash == std::string::npos ? text_path : text_path.substr(slash + 1)) +
      (cmd.skip ? " from token " + std::to_string(cmd.skip) : std::string());
  std::string body, what;
  if (cmd.codebook_given) {  // codebooks of a strategy's codebook parts
    if (cmd.codebook.empty()) throw RunnerError("--codebook: give a strategy with codebook parts");
    const Strategy st = parse_strategy(cmd.codebook);
    if (!cmd.key_stats.empty() && st.key_smooth <= 0.0)
      throw RunnerError("--key-stats applies to strategies that smooth keys ('" + st.spec +
                        "' has no smooth)");
    std::vector<float> key_scale, key_offset;
    if (st.key_smooth > 0.0)
      key_smoothing(model_key_stats(c, cmd.key_stats), st.key_smooth, st.key_qsmooth, key_scale,
                    key_offset);
    const std::vector<CodebookPart> parts =
        strategy_codebook_parts(st, c, key_scale, key_offset, false);
    if (parts.empty())
      throw RunnerError("--codebook " + cmd.codebook +
                        ": no part with a codebook (add codebook to an int4 / int3 / int2 codec)");
    const std::vector<FittedCodebook> books =
        fit_codebooks(model, tokens, c.bos_token, window, cmd.windows, parts);
    body = format_codebooks(books,
                            "Codebooks fitted per layer (kvcache calibrate --codebook, "
                            "docs/codecs.md)\nstrategy " +
                                st.spec + "\n" + source);
    what = std::to_string(books.size()) + " codebook part(s) x " + std::to_string(c.n_layers) +
           " layers from " + std::to_string(books[0].groups) + " scale groups per layer";
  } else {
    if (!cmd.key_stats.empty())
      throw RunnerError("--key-stats applies to --codebook strategies that smooth keys");
    KeyStats s = fit_key_stats(model, tokens, c.bos_token, window, cmd.windows);
    body = format_key_stats(
        s,
        "Per-channel statistics of pre-RoPE keys (kvcache calibrate, docs/codecs.md)\n" + source);
    what = std::to_string(s.layers) + " layers x " + std::to_string(s.kv_heads) + " KV heads x " +
           std::to_string(s.head_dim) + " dims from " + std::to_string(s.tokens) +
           " keys per channel";
  }
  if (cmd.out == "-") {
    std::fwrite(body.data(), 1, body.size(), stdout);
  } else {
    std::ofstream f(cmd.out, std::ios::binary);
    if (!f || !(f << body) || !f.flush())
      throw RunnerError("--out " + cmd.out + ": cannot be written");
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "kvcache calibrate: %s in %.1f s\n", what.c_str(), secs);
}

}  // namespace

void register_calibrate(CLI::App &app) {
  const auto cmd = std::make_shared<CalibrateCommand>();
  CLI::App *sub = app.add_subcommand(
      "calibrate",
      "Fit per-channel key statistics (pre-RoPE; with the queries' rms per key channel) from a "
      "model run, for key smoothing; or, with "
      "--codebook, per-layer codebooks");
  sub->add_option("--model", cmd->model, "Checkpoint path or known name")->capture_default_str();
  sub->add_option("--tokenizer", cmd->tokenizer,
                  "Tokenizer path or known name (default: the model's)");
  sub->add_option("--text", cmd->text,
                  "UTF-8 text to run (default: shared data/out-of-domain.txt, not the eval text)");
  sub->add_option("--window", cmd->window,
                  "Positions per window, BOS included (0: min(model context, 512))")
      ->capture_default_str();
  sub->add_option("--windows", cmd->windows, "Windows to run (consecutive text)")
      ->capture_default_str();
  sub->add_option("--skip", cmd->skip, "Text tokens to skip before the first window")
      ->capture_default_str();
  sub->add_option(
      "--codebook", cmd->codebook,
      "Fit codebooks instead: the levels of this strategy's codebook parts, per layer, "
      "by weighted k-means on the model's own K/V after the strategy's transforms "
      "(e.g. k-int4:per-token:pre-rope:smooth=0.5:qsmooth=0.5:hadamard:codebook+v-int4:per-token:"
      "hadamard:codebook); kvc_pool_set_codebook takes them");
  sub->add_option("--key-stats", cmd->key_stats,
                  "--codebook with smooth: the key statistics file (default: bench/calib's)");
  sub->add_option("-o,--out", cmd->out, "File to write ('-': stdout)")->required();
  sub->callback([cmd, sub] {
    cmd->codebook_given = sub->count("--codebook") > 0;
    run_calibrate(*cmd);
  });
}

}  // namespace kvc_cli
