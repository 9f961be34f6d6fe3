// SPDX-License-Identifier: Apache-2.0
#include "memory.h"

#include <kvcache/kvcache.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>

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

std::string human_bytes(long double bytes) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024.0L && u < 6) {
    bytes /= 1024.0L;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%.0Lf B", bytes);
  else
    std::snprintf(buf, sizeof buf, "%.2Lf %s", bytes, units[u]);
  return buf;
}

namespace {

std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, const char *what) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) {
    throw RunnerError(std::string("the ") + what + " overflows 64 bits");
  }
  return a * b;
}

}  // namespace

Geometry resolve_geometry(const std::string &preset, std::uint32_t layers, std::uint32_t kv_heads,
                          std::uint32_t head_dim) {
  Geometry g{"custom", "explicit dimensions", layers, kv_heads, head_dim};
  const bool explicit_dims = layers || kv_heads || head_dim;
  if (!preset.empty()) {
    if (explicit_dims) {
      throw RunnerError("give either --preset or --layers/--kv-heads/--head-dim, not both");
    }
    const ModelPreset *found = nullptr;
    for (const ModelPreset &p : model_presets()) {
      if (preset == p.name) found = &p;
    }
    if (found == nullptr) {
      std::string names;
      for (const ModelPreset &p : model_presets())
        names += (names.empty() ? "" : ", ") + std::string(p.name);
      throw RunnerError("unknown preset '" + preset + "' (known: " + names + ")");
    }
    g = {found->name, found->description, found->num_layers, found->num_kv_heads, found->head_dim};
  } else if (!(layers && kv_heads && head_dim)) {
    throw RunnerError(
        "give --preset NAME, or all of --layers, --kv-heads and --head-dim (each >= 1)");
  }
  return g;
}

std::uint64_t parse_byte_size(const std::string &text, const std::string &what) {
  const std::string where = what + " '" + text + "': ";
  // number [unit], spaces allowed around both
  static const std::regex form(
      R"(^\s*([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?\s*([A-Za-z]*)\s*$)");
  std::smatch m;
  if (!std::regex_match(text, m, form)) {
    throw RunnerError(where +
                      "not a size (expected a number and an optional unit: B, KB, MB, GB, TB, "
                      "KiB, MiB, GiB, TiB; e.g. 16GiB, 512MiB, 1e9)");
  }
  std::string unit = m[4].str();
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char ch) { return char(std::tolower(ch)); });
  static const std::pair<const char *, long double> units[] = {
      {"", 1.0L},    {"b", 1.0L},      {"kb", 1e3L},     {"mb", 1e6L},     {"gb", 1e9L},
      {"tb", 1e12L}, {"kib", 0x1p10L}, {"mib", 0x1p20L}, {"gib", 0x1p30L}, {"tib", 0x1p40L}};
  long double scale = 0.0L;
  for (const auto &[name, factor] : units) {
    if (unit == name) scale = factor;
  }
  if (scale == 0.0L) {
    throw RunnerError(where + "unknown unit '" + m[4].str() +
                      "' (known: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  }
  const std::string number = m[1].str() + m[3].str();
  const long double bytes = std::floor(std::strtold(number.c_str(), nullptr) * scale);
  if (!(bytes >= 1.0L)) throw RunnerError(where + "must be at least 1 byte");
  if (!(bytes <= 0x1p63L)) throw RunnerError(where + "is too large (at most 2^63 bytes)");
  return static_cast<std::uint64_t>(bytes);
}

void run_memory(const MemoryOptions &o) {
  const Geometry g = resolve_geometry(o.preset, o.num_layers, o.num_kv_heads, o.head_dim);
  const std::uint32_t layers = g.num_layers, kv_heads = g.num_kv_heads, head_dim = g.head_dim;
  const std::string &name = g.name;
  const std::string &description = g.description;
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
  std::printf("%17s  %10s  (batch %llu)\n", "seq_len", "total",
              static_cast<unsigned long long>(o.batch));
  std::vector<std::uint64_t> lengths = {2048, 4096, 8192, 32768};
  bool listed = false;
  for (std::uint64_t n : lengths) listed = listed || n == o.seq_len;
  if (!listed) lengths.push_back(o.seq_len);
  for (std::uint64_t n : lengths) {
    const long double bytes = static_cast<long double>(per_token) * n * o.batch;
    std::printf("%10llu tokens  %10s%s\n", static_cast<unsigned long long>(n),
                human_bytes(bytes).c_str(), n == o.seq_len ? "  <-" : "");
  }
}

}  // namespace kvc_cli
