// SPDX-License-Identifier: Apache-2.0
#include "runner.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <sstream>

#include "error.h"
#include "kv_cache.h"
#include "transformer.h"

#ifndef KVC_SHARED_DIR_DEFAULT
#define KVC_SHARED_DIR_DEFAULT "../shared"
#endif

namespace kvc_runner {

std::string shared_dir() {
  const char *env = std::getenv("KVCACHE_SHARED_DIR");
  if (env != nullptr && env[0] != '\0') return env;
  return KVC_SHARED_DIR_DEFAULT;
}

namespace {
struct KnownModel {
  const char *name;
  const char *checkpoint;  // relative to the shared folder, or (cached) to model_cache_dir()
  const char *tokenizer;   // the same; a GGUF model is its own tokenizer
  bool cached;
};
constexpr KnownModel kKnownModels[] = {
    {"stories260k", "models/stories260K.bin", "models/tok512.bin", false},
    {"smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf", true},
};

std::string known_path(const KnownModel &m, const char *file) {
  if (!m.cached) return shared_dir() + "/" + file;
  const std::string path = model_cache_dir() + "/" + file;
  if (!std::ifstream(path).good()) {
    throw RunnerError("model '" + std::string(m.name) + "' is not in the model cache (" + path +
                      "): fetch it with scripts/fetch-models.sh");
  }
  return path;
}

bool is_gguf(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {0, 0, 0, 0};
  in.read(magic, 4);
  return in && std::memcmp(magic, "GGUF", 4) == 0;
}

const KnownModel *find_known(const std::string &name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  for (const KnownModel &m : kKnownModels) {
    if (lower == m.name) return &m;
  }
  return nullptr;
}
}  // namespace

std::string model_cache_dir() {
  if (const char *env = std::getenv("KVCACHE_MODEL_CACHE"); env != nullptr && env[0] != '\0')
    return env;
  if (const char *xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] != '\0')
    return std::string(xdg) + "/kvcache";
  if (const char *home = std::getenv("HOME"); home != nullptr && home[0] != '\0')
    return std::string(home) + "/.cache/kvcache";
  return ".kvcache-models";
}

std::vector<std::string> known_models() {
  std::vector<std::string> names;
  for (const KnownModel &m : kKnownModels) names.emplace_back(m.name);
  return names;
}

std::string resolve_model_path(const std::string &name_or_path) {
  if (const KnownModel *m = find_known(name_or_path)) return known_path(*m, m->checkpoint);
  return name_or_path;
}

std::string resolve_tokenizer_path(const std::string &name_or_path, const std::string &model_arg) {
  if (!name_or_path.empty()) {
    if (const KnownModel *m = find_known(name_or_path)) return known_path(*m, m->tokenizer);
    return name_or_path;
  }
  if (const KnownModel *m = find_known(model_arg)) return known_path(*m, m->tokenizer);
  // A GGUF model carries its tokenizer; for a llama2.c checkpoint given by
  // path, look for the tokenizer next to it.
  const std::string model_path = resolve_model_path(model_arg);
  if (is_gguf(model_path)) return model_path;
  const std::size_t slash = model_path.find_last_of('/');
  const std::string folder = slash == std::string::npos ? "." : model_path.substr(0, slash);
  for (const char *candidate : {"tokenizer.bin", "tok512.bin"}) {
    const std::string p = folder + "/" + candidate;
    if (std::ifstream(p).good()) return p;
  }
  throw RunnerError("no tokenizer given for model '" + model_arg +
                    "' and none found next to it (tokenizer.bin); pass --tokenizer");
}

std::string read_text_file(const std::string &path, const char *what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw RunnerError(std::string("cannot read ") + what + " '" + path + "': it is a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw RunnerError(std::string("cannot open ") + what + " '" + path +
                      "': " + std::strerror(errno));
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw RunnerError(std::string("cannot read ") + what + " '" + path + "'");
  return text;
}

bool parse_dtype(const std::string &name, kvc_dtype *out) {
  if (name == "f32")
    *out = KVC_DTYPE_F32;
  else if (name == "f16")
    *out = KVC_DTYPE_F16;
  else if (name == "bf16")
    *out = KVC_DTYPE_BF16;
  else
    return false;
  return true;
}

const char *dtype_name(kvc_dtype dtype) {
  switch (dtype) {
    case KVC_DTYPE_F32:
      return "f32";
    case KVC_DTYPE_F16:
      return "f16";
    case KVC_DTYPE_BF16:
      return "bf16";
    default:
      return "?";
  }
}

void log_softmax(const float *logits, int n, std::vector<double> &out) {
  out.resize(static_cast<std::size_t>(n));
  double max_logit = logits[0];
  for (int i = 1; i < n; ++i) max_logit = std::max(max_logit, double(logits[i]));
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - max_logit);
  const double log_sum = std::log(sum);
  for (int i = 0; i < n; ++i) out[i] = double(logits[i]) - max_logit - log_sum;
}

namespace {

int argmax(const float *v, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i) {
    if (v[i] > v[best]) best = i;
  }
  return best;
}

int sample(const float *logits, int n, float temperature, float top_p, std::mt19937_64 &rng) {
  std::vector<double> p(static_cast<std::size_t>(n));
  const double max_logit = *std::max_element(logits, logits + n);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += p[i] = std::exp((logits[i] - max_logit) / temperature);
  for (double &x : p) x /= sum;
  std::vector<int> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
  double mass = 0.0;
  std::size_t keep = 0;
  while (keep < order.size()) {
    mass += p[order[keep++]];
    if (top_p > 0.0f && top_p < 1.0f && mass >= top_p) break;
  }
  std::uniform_real_distribution<double> u(0.0, mass);
  double r = u(rng), acc = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    acc += p[order[i]];
    if (r < acc) return order[i];
  }
  return order[keep - 1];
}

template <class Cache>
GenerateResult generate_with(const Model &model, const Tokenizer &tokenizer,
                             const GenerateOptions &opt, Cache &cache) {
  const ModelConfig &c = model.config();
  Transformer transformer(model);
  std::vector<int> prompt = tokenizer.encode(opt.prompt, true, false);
  int steps = opt.steps;
  if (steps <= 0 || steps > c.seq_len) steps = c.seq_len;
  std::mt19937_64 rng(opt.seed ? opt.seed : 0x5eed);
  GenerateResult result;
  result.tokens.push_back(prompt[0]);
  int token = prompt[0];
  for (int pos = 0; pos < steps; ++pos) {
    const float *logits = transformer.forward(cache, token, pos);
    ++result.positions;
    int next;
    if (pos + 1 < static_cast<int>(prompt.size())) {
      next = prompt[pos + 1];
    } else if (opt.temperature <= 0.0f) {
      next = argmax(logits, c.vocab_size);
    } else {
      next = sample(logits, c.vocab_size, opt.temperature, opt.top_p, rng);
    }
    if (next == kBosToken) break;
    result.tokens.push_back(next);
    result.text += tokenizer.printable(token, next);
    token = next;
  }
  result.text += '\n';
  return result;
}

}  // namespace

GenerateResult generate(const Model &model, const Tokenizer &tokenizer,
                        const GenerateOptions &opt) {
  const ModelConfig &c = model.config();
  if (opt.use_pool) {
    KvPool pool(c, opt.cache_dtype, opt.cache_dtype, static_cast<std::uint32_t>(c.seq_len));
    PoolSequence seq(pool, 0, c.n_layers);
    return generate_with(model, tokenizer, opt, seq);
  }
  ArrayCache cache(c);
  return generate_with(model, tokenizer, opt, cache);
}

}  // namespace kvc_runner
