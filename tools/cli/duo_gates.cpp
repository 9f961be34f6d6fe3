// SPDX-License-Identifier: Apache-2.0
#include "duo_gates.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <sstream>

#include "../runner/error.h"

namespace kvc_cli {

// The text of bench/duo/gates-*.txt, compiled in (generated duo_gates_data.cpp,
// tools/CMakeLists.txt).
extern const char *const kDuoGatesStories260k;
extern const char *const kDuoGatesSmolLM2;

using kvc_runner::RunnerError;

std::vector<float> parse_gates(const std::string &text, const std::string &where) {
  std::vector<float> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const std::size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string w;
    while (words >> w) {
      char *end = nullptr;
      const double v = std::strtod(w.c_str(), &end);
      if (end != w.c_str() + w.size() || !(v >= 0.0 && v <= 1.0))
        throw RunnerError(where + ": gate '" + w + "' is not a number in [0, 1]");
      if (out.size() >= (1u << 20)) throw RunnerError(where + ": more than 1048576 gates");
      out.push_back(static_cast<float>(v));
    }
  }
  return out;
}

std::vector<float> model_gates(const kvc_runner::ModelConfig &c, const std::string &file) {
  const std::size_t want = std::size_t(c.n_layers) * std::size_t(c.n_kv_heads);
  std::vector<float> g;
  std::string where;
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) throw RunnerError("--head-gates " + file + ": cannot be read");
    std::stringstream ss;
    ss << in.rdbuf();
    where = "--head-gates " + file;
    g = parse_gates(ss.str(), where);
  } else if (c.n_layers == 5 && c.n_heads == 8 && c.n_kv_heads == 4 && c.dim == 64) {
    where = "bench/duo/gates-stories260k.txt";
    g = parse_gates(kDuoGatesStories260k, where);
  } else if (c.n_layers == 30 && c.n_heads == 9 && c.n_kv_heads == 3 && c.dim == 576) {
    where = "bench/duo/gates-smollm2.txt";
    g = parse_gates(kDuoGatesSmolLM2, where);
  } else {
    throw RunnerError(
        "duo-attention needs the model's head gates: give --head-gates FILE (num_layers x "
        "num_kv_heads values; bench/duo/derive_gates.py derives them)");
  }
  if (g.size() != want)
    throw RunnerError(where + ": " + std::to_string(g.size()) + " gates for a model of " +
                      std::to_string(c.n_layers) + " layers x " + std::to_string(c.n_kv_heads) +
                      " KV heads");
  return g;
}

std::vector<float> streaming_heads(const std::vector<float> &gates, double share, int only) {
  std::vector<float> out(gates.size(), 1.0f);
  if (only >= 0) {
    if (static_cast<std::size_t>(only) >= gates.size())
      throw RunnerError("duo-attention: stream-head=" + std::to_string(only) +
                        " but the model has " + std::to_string(gates.size()) + " KV heads in all");
    out[static_cast<std::size_t>(only)] = 0.0f;
    return out;
  }
  std::vector<std::size_t> idx(gates.size());
  std::iota(idx.begin(), idx.end(), std::size_t(0));
  std::stable_sort(idx.begin(), idx.end(),
                   [&](std::size_t a, std::size_t b) { return gates[a] < gates[b]; });
  const std::size_t k =
      static_cast<std::size_t>(std::llround(share * static_cast<double>(gates.size())));
  for (std::size_t i = 0; i < std::min(k, idx.size()); ++i) out[idx[i]] = 0.0f;
  return out;
}

}  // namespace kvc_cli
