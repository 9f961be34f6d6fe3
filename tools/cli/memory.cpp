// SPDX-License-Identifier: Apache-2.0
#include "memory.h"

#include <kvcache/kvcache.h>

#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "../runner/error.h"
#include "../runner/kv_cache.h"
#include "../runner/runner.h"

namespace kvc_cli {
using kvc_runner::RunnerError;

const std::vector<ModelPreset> &model_presets() {
  static const std::vector<ModelPreset> presets = {
      {"llama-7b", "LLaMA-7B (MHA)", 32, 32, 32, 128},
      {"llama-2-13b", "Llama-2-13B (MHA)", 40, 40, 40, 128},
      {"llama-2-70b", "Llama-2-70B (GQA, 8 KV heads)", 80, 64, 8, 128},
      {"llama-3-8b", "Llama-3-8B (GQA, 8 KV heads)", 32, 32, 8, 128},
      {"mistral-7b", "Mistral-7B (GQA, 8 KV heads)", 32, 32, 8, 128},
      {"qwen2.5-7b", "Qwen2.5-7B (GQA, 4 KV heads)", 28, 28, 4, 128},
      {"stories260k", "stories260K, the shared llama2.c model (GQA, 4 KV heads)", 5, 8, 4, 8},
  };
  return presets;
}

namespace {

std::string human_bytes(long double bytes) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024.0L && u < 6) {
    bytes /= 1024.0L;
    ++u;
  }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%.0Lf B", bytes);
  else std::snprintf(buf, sizeof buf, "%.2Lf %s", bytes, units[u]);
  return buf;
}

std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, const char *what) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) {
    throw RunnerError(std::string("the ") + what + " overflows 64 bits");
  }
  return a * b;
}

}  // namespace

void run_memory(const MemoryOptions &o) {
  std::uint32_t layers = o.num_layers, kv_heads = o.num_kv_heads, head_dim = o.head_dim;
  std::string name = "custom";
  std::string description = "explicit dimensions";
  const bool explicit_dims = layers || kv_heads || head_dim;
  if (!o.preset.empty()) {
    if (explicit_dims) {
      throw RunnerError("give either --preset or --layers/--kv-heads/--head-dim, not both");
    }
    const ModelPreset *found = nullptr;
    for (const ModelPreset &p : model_presets()) {
      if (o.preset == p.name) found = &p;
    }
    if (found == nullptr) {
      std::string names;
      for (const ModelPreset &p : model_presets()) names += (names.empty() ? "" : ", ") + std::string(p.name);
      throw RunnerError("unknown preset '" + o.preset + "' (known: " + names + ")");
    }
    layers = found->num_layers;
    kv_heads = found->num_kv_heads;
    head_dim = found->head_dim;
    name = found->name;
    description = found->description;
  } else if (!(layers && kv_heads && head_dim)) {
    throw RunnerError("give --preset NAME, or all of --layers, --kv-heads and --head-dim (each >= 1)");
  }
  if (o.seq_len == 0) throw RunnerError("--seq-len must be >= 1");
  if (o.batch == 0) throw RunnerError("--batch must be >= 1");
  kvc_dtype dtype;
  if (!kvc_runner::parse_dtype(o.dtype, &dtype)) {
    throw RunnerError("unknown --dtype '" + o.dtype + "' (known: f32, f16, bf16)");
  }
  std::size_t element_bytes = 0;
  kvc_runner::check_kvc(kvc_dtype_size(dtype, &element_bytes), "kvc_dtype_size");

  // K and V of one token in one layer, then all layers, then the whole batch.
  const std::uint64_t per_token_layer =
      checked_mul(checked_mul(2ull * kv_heads, head_dim, "size"), element_bytes, "size");
  const std::uint64_t per_token = checked_mul(per_token_layer, layers, "size per token");
  const std::uint64_t tokens = checked_mul(o.seq_len, o.batch, "token count");
  const std::uint64_t per_layer = checked_mul(per_token_layer, tokens, "size per layer");
  const std::uint64_t total = checked_mul(per_token, tokens, "total size");

  if (o.json) {
    nlohmann::ordered_json j;
    j["preset"] = name;
    j["num_layers"] = layers;
    j["num_kv_heads"] = kv_heads;
    j["head_dim"] = head_dim;
    j["dtype"] = o.dtype;
    j["bytes_per_element"] = element_bytes;
    j["seq_len"] = o.seq_len;
    j["batch"] = o.batch;
    j["bytes_per_token"] = per_token;
    j["bytes_per_token_per_layer"] = per_token_layer;
    j["bytes_per_layer"] = per_layer;
    j["bytes_total"] = total;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("model      %s: %s; %u layers, %u KV heads, head_dim %u\n", name.c_str(),
              description.c_str(), layers, kv_heads, head_dim);
  std::printf("dtype      %s, %zu bytes per element\n", o.dtype.c_str(), element_bytes);
  std::printf("per token  %s (%llu bytes: K and V of all %u layers); %s per layer\n",
              human_bytes(per_token).c_str(), static_cast<unsigned long long>(per_token), layers,
              human_bytes(per_token_layer).c_str());
  std::printf("per layer  %s for %llu tokens x batch %llu\n", human_bytes(per_layer).c_str(),
              static_cast<unsigned long long>(o.seq_len), static_cast<unsigned long long>(o.batch));
  std::printf("total      %s (%llu bytes) for %llu tokens x batch %llu\n\n",
              human_bytes(total).c_str(), static_cast<unsigned long long>(total),
              static_cast<unsigned long long>(o.seq_len), static_cast<unsigned long long>(o.batch));
  std::printf("%17s  %10s  (batch %llu)\n", "seq_len", "total", static_cast<unsigned long long>(o.batch));
  std::vector<std::uint64_t> lengths = {2048, 4096, 8192, 32768};
  bool listed = false;
  for (std::uint64_t n : lengths) listed = listed || n == o.seq_len;
  if (!listed) lengths.push_back(o.seq_len);
  for (std::uint64_t n : lengths) {
    const long double bytes = static_cast<long double>(per_token) * n * o.batch;
    std::printf("%10llu tokens  %10s%s\n", static_cast<unsigned long long>(n), human_bytes(bytes).c_str(),
                n == o.seq_len ? "  <-" : "");
  }
}

}  // namespace kvc_cli
