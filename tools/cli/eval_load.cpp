// SPDX-License-Identifier: Apache-2.0
// `kvcache eval`, loading: model, tokenizer, text and windows (eval_load.h).
#include "eval_load.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../runner/error.h"
#include "../runner/runner.h"

namespace kvc_cli {
namespace {

/// SHA-256 of the first `n` ids as little-endian uint32, in lower-case hex
/// (what a peer script computes with hashlib over the same ids).
std::string token_ids_sha256(const std::vector<int> &ids, std::size_t n) {
  std::vector<unsigned char> bytes(4 * n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto v = static_cast<std::uint32_t>(ids[i]);
    for (int b = 0; b < 4; ++b) bytes[4 * i + b] = static_cast<unsigned char>(v >> (8 * b));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr) != 1)
    throw kvc_runner::RunnerError("OpenSSL SHA-256 failed");
  static const char *hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

}  // namespace

using namespace kvc_runner;

EvalInput load_eval_input(const EvalOptions &opt, EvalReport &rep) {
  rep.model = opt.model;
  rep.model_path = resolve_model_path(opt.model);
  rep.text_path = opt.text.empty() ? shared_dir() + "/data/tinystories-valid-sample.txt" : opt.text;

  Model model = Model::load(rep.model_path);
  rep.tokenizer_path = resolve_tokenizer_path(opt.tokenizer, opt.model);
  const ModelConfig &c = model.config();
  Tokenizer tokenizer = Tokenizer::load(rep.tokenizer_path, c.vocab_size);
  const std::string text = read_text_file(rep.text_path, "text file");
  rep.num_layers = c.n_layers;
  rep.num_q_heads = c.n_heads;
  rep.num_kv_heads = c.n_kv_heads;
  rep.head_dim = c.head_dim();

  // Windows: the trained context, at most kDefaultWindow positions (SmolLM2 is trained on 8,192).
  const int base_window = std::min(c.seq_len, kDefaultWindow);
  const int ctx = opt.ctx != 0       ? opt.ctx
                  : opt.long_context ? kLongContextFactor * base_window
                                     : base_window;
  if (ctx < 2 || ctx > kMaxEvalContext) {
    throw RunnerError("--ctx " + std::to_string(ctx) + " is out of range: must be 2.." +
                      std::to_string(kMaxEvalContext) + " (the model's trained context is " +
                      std::to_string(c.seq_len) + ")");
  }
  if (opt.max_tokens < 0) throw RunnerError("--max-tokens must be >= 0");
  if (opt.segment < 0) throw RunnerError("--segment must be >= 1 (0: the model's seq_len)");
  rep.ctx = ctx;
  rep.trained_context = c.seq_len;
  const int segment = opt.segment > 0 ? opt.segment : base_window;
  rep.segment = segment;
  const std::size_t n_segments = static_cast<std::size_t>((ctx - 1) / segment + 1);
  if (n_segments > kMaxSegments) {
    throw RunnerError("--segment " + std::to_string(segment) + " cuts a window of " +
                      std::to_string(ctx) + " into " + std::to_string(n_segments) +
                      " segments; at most " + std::to_string(kMaxSegments));
  }

  // A window's position 0 is BOS when the model's sequences start with it
  // (llama2.c); otherwise (SmolLM2's GGUF) the text token before the window's
  // first scored token, so the text's very first token is context only.
  const bool use_bos = c.add_bos;
  const int bos = tokenizer.bos_token();
  std::vector<int> tokens = tokenizer.encode(text, false, false);
  const std::int64_t lead = use_bos ? 0 : 1;
  if (static_cast<std::int64_t>(tokens.size()) <= lead)
    throw RunnerError("text file '" + rep.text_path + "' holds too few tokens");
  std::int64_t to_score = static_cast<std::int64_t>(tokens.size()) - lead;
  // GGUF models cost ~40x more per token: 4,096 tokens by default, and two
  // windows with --long.
  const std::int64_t max_tokens = !(opt.max_tokens_default && c.gguf) ? opt.max_tokens
                                  : opt.long_context                  ? 2 * std::int64_t(ctx - 1)
                                                                      : kGgufEvalTokens;
  if (max_tokens > 0) to_score = std::min(to_score, max_tokens);
  if (opt.chunk < 0) throw RunnerError("--chunk must be >= 1 (0: the model's default)");
  const int chunk = opt.chunk > 0 ? opt.chunk : c.gguf ? kGgufChunk : 1;
  rep.chunk = chunk;
  rep.bos = use_bos;
  std::vector<EvalWindow> windows;
  for (std::int64_t first = lead; first < lead + to_score; first += ctx - 1) {
    windows.push_back({static_cast<std::size_t>(first),
                       static_cast<int>(std::min<std::int64_t>(ctx - 1, lead + to_score - first))});
  }
  rep.windows = static_cast<int>(windows.size());
  rep.tokens_scored = to_score;
  rep.token_ids_count = lead + to_score;
  rep.token_ids_sha256 = token_ids_sha256(tokens, static_cast<std::size_t>(lead + to_score));
  return EvalInput{std::move(model),
                   std::move(tokenizer),
                   std::move(tokens),
                   std::move(windows),
                   ctx,
                   segment,
                   n_segments,
                   chunk,
                   use_bos,
                   bos,
                   to_score};
}

}  // namespace kvc_cli
