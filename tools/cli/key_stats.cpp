// SPDX-License-Identifier: Apache-2.0
#include "key_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "../runner/error.h"
#include "calibration.h"

namespace kvc_cli {

// The text of bench/calib/keys-*.txt, compiled in (generated key_stats_data.cpp,
// tools/CMakeLists.txt).
extern const char *const kKeyStatsStories260k;
extern const char *const kKeyStatsSmolLM2;

using kvc_runner::RunnerError;

namespace {

constexpr int kMaxDim = 1 << 20;  // layers x channels a file may hold

std::vector<float> *stat_array(KeyStats &s, const std::string &name) {
  if (name == "mean") return &s.mean;
  if (name == "rms") return &s.rms;
  if (name == "absmax") return &s.absmax;
  if (name == "qrms") return &s.qrms;
  return nullptr;
}

int parse_int(const std::string &w, const std::string &at, int lo, int hi) {
  char *end = nullptr;
  const long v = std::strtol(w.c_str(), &end, 10);
  if (w.empty() || end != w.c_str() + w.size() || v < lo || v > hi)
    throw RunnerError(at + "'" + w + "' is not a whole number in [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "]");
  return static_cast<int>(v);
}

}  // namespace

KeyStats parse_key_stats(const std::string &text, const std::string &where) {
  KeyStats s;
  std::istringstream lines(text);
  std::string line;
  int line_no = 0;
  bool magic = false, geometry = false;
  std::vector<std::vector<char>> seen(4);
  while (std::getline(lines, line)) {
    ++line_no;
    const std::string at = where + ":" + std::to_string(line_no) + ": ";
    const std::size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    if (w.empty()) continue;
    if (!magic) {
      if (w.size() != 2 || w[0] != "kvcache-key-stats" || w[1] != "1")
        throw RunnerError(at + "expected the header 'kvcache-key-stats 1'");
      magic = true;
      continue;
    }
    if (w[0] == "rope" && w.size() == 2 && (w[1] == "interleaved" || w[1] == "neox")) {
      s.neox = w[1] == "neox";
      continue;
    }
    if (w[0] == "tokens" && w.size() == 2) {
      s.tokens = static_cast<std::uint64_t>(parse_int(w[1], at, 0, 1 << 30));
      continue;
    }
    if (!geometry) {
      if (w.size() != 6 || w[0] != "layers" || w[2] != "kv_heads" || w[4] != "head_dim")
        throw RunnerError(at + "expected 'layers L kv_heads H head_dim D'");
      s.layers = parse_int(w[1], at, 1, 4096);
      s.kv_heads = parse_int(w[3], at, 1, 65536);
      s.head_dim = parse_int(w[5], at, 1, 1024);
      if (std::int64_t(s.layers) * s.kv_heads * s.head_dim > kMaxDim)
        throw RunnerError(at + "more than " + std::to_string(kMaxDim) + " channels in all");
      const std::size_t n = std::size_t(s.layers) * s.kv_heads * s.head_dim;
      s.mean.assign(n, 0.0f);
      s.rms.assign(n, 0.0f);
      s.absmax.assign(n, 0.0f);
      s.qrms.assign(n, 0.0f);
      for (auto &v : seen) v.assign(std::size_t(s.layers), 0);
      geometry = true;
      continue;
    }
    std::vector<float> *arr = stat_array(s, w[0]);
    if (!arr) throw RunnerError(at + "unknown statistic '" + w[0] + "' (mean, rms, absmax, qrms)");
    const std::size_t row = std::size_t(s.kv_heads) * s.head_dim;
    if (w.size() != row + 2)
      throw RunnerError(at + w[0] + ": expected a layer and " + std::to_string(row) +
                        " values, got " + std::to_string(w.size() - 1) + " words");
    const int layer = parse_int(w[1], at, 0, s.layers - 1);
    const int which = w[0] == "mean" ? 0 : w[0] == "rms" ? 1 : w[0] == "absmax" ? 2 : 3;
    if (seen[which][layer]) throw RunnerError(at + w[0] + " of layer " + w[1] + " given twice");
    seen[which][layer] = 1;
    for (std::size_t c = 0; c < row; ++c) {
      const std::string &x = w[c + 2];
      char *end = nullptr;
      const double v = std::strtod(x.c_str(), &end);
      if (end != x.c_str() + x.size() || !std::isfinite(v) || std::fabs(v) > 1e30 ||
          (which > 0 && v < 0.0))
        throw RunnerError(at + w[0] + " value '" + x + "' is not a finite number" +
                          (which > 0 ? " >= 0" : "") + " within 1e30");
      (*arr)[std::size_t(layer) * row + c] = static_cast<float>(v);
    }
  }
  if (!magic) throw RunnerError(where + ": empty: expected the header 'kvcache-key-stats 1'");
  if (!geometry) throw RunnerError(where + ": no 'layers L kv_heads H head_dim D' line");
  static const char *names[4] = {"mean", "rms", "absmax", "qrms"};
  // qrms is optional, but then for every layer.
  const bool queries = std::find(seen[3].begin(), seen[3].end(), 1) != seen[3].end();
  for (int k = 0; k < (queries ? 4 : 3); ++k)
    for (int l = 0; l < s.layers; ++l)
      if (!seen[k][l])
        throw RunnerError(where + ": no " + names[k] + " line for layer " + std::to_string(l));
  if (!queries) s.qrms.clear();
  return s;
}

std::string format_key_stats(const KeyStats &s, const std::string &comment) {
  std::string out;
  std::istringstream c(comment);
  for (std::string line; std::getline(c, line);) out += "# " + line + "\n";
  out += "kvcache-key-stats 1\n";
  out += s.neox ? "rope neox\n" : "rope interleaved\n";
  if (s.tokens) out += "tokens " + std::to_string(s.tokens) + "\n";
  out += "layers " + std::to_string(s.layers) + " kv_heads " + std::to_string(s.kv_heads) +
         " head_dim " + std::to_string(s.head_dim) + "\n";
  const std::size_t row = std::size_t(s.kv_heads) * s.head_dim;
  const std::pair<const char *, const std::vector<float> *> arrays[4] = {
      {"mean", &s.mean}, {"rms", &s.rms}, {"absmax", &s.absmax}, {"qrms", &s.qrms}};
  char buf[32];
  for (const auto &[name, arr] : arrays)
    for (int l = 0; l < s.layers && !arr->empty(); ++l) {
      out += name;
      out += " " + std::to_string(l);
      for (std::size_t c = 0; c < row; ++c) {
        std::snprintf(buf, sizeof buf, " %.6g", double((*arr)[std::size_t(l) * row + c]));
        out += buf;
      }
      out += "\n";
    }
  return out;
}

KeyStats interleaved(const KeyStats &s) {
  if (!s.neox) return s;
  KeyStats r = s;
  r.neox = false;
  const std::size_t hd = std::size_t(s.head_dim), half = hd / 2;
  const std::size_t heads = std::size_t(s.layers) * std::size_t(s.kv_heads);
  for (std::vector<float> KeyStats::*a :
       {&KeyStats::mean, &KeyStats::rms, &KeyStats::absmax, &KeyStats::qrms})
    for (std::size_t h = 0; h < heads && !(s.*a).empty(); ++h)
      for (std::size_t i = 0; i < half; ++i) {  // NeoX pair (i, i + D/2) -> (2i, 2i + 1)
        (r.*a)[h * hd + 2 * i] = (s.*a)[h * hd + i];
        (r.*a)[h * hd + 2 * i + 1] = (s.*a)[h * hd + half + i];
      }
  return r;
}

KeyStats model_key_stats(const kvc_runner::ModelConfig &c, const std::string &file) {
  KeyStats s;
  std::string where;
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) throw RunnerError("--key-stats " + file + ": cannot be read");
    std::stringstream ss;
    ss << in.rdbuf();
    where = "--key-stats " + file;
    s = parse_key_stats(ss.str(), where);
  } else if (c.n_layers == 5 && c.n_heads == 8 && c.n_kv_heads == 4 && c.dim == 64) {
    where = "bench/calib/keys-stories260k.txt";
    s = parse_key_stats(kKeyStatsStories260k, where);
  } else if (c.n_layers == 30 && c.n_heads == 9 && c.n_kv_heads == 3 && c.dim == 576) {
    where = "bench/calib/keys-smollm2.txt";
    s = parse_key_stats(kKeyStatsSmolLM2, where);
  } else {
    throw RunnerError(
        "smooth: no built-in key statistics for this model; fit them with `kvcache calibrate` "
        "and pass the file with --key-stats");
  }
  if (s.neox && s.head_dim % 2 != 0)
    throw RunnerError(where + ": NeoX channel order needs an even head_dim");
  if (s.layers != c.n_layers || s.kv_heads != c.n_kv_heads || s.head_dim != c.head_dim())
    throw RunnerError(where + ": statistics of " + std::to_string(s.layers) + " layers x " +
                      std::to_string(s.kv_heads) + " KV heads x " + std::to_string(s.head_dim) +
                      " dims, the model has " + std::to_string(c.n_layers) + " x " +
                      std::to_string(c.n_kv_heads) + " x " + std::to_string(c.head_dim()));
  return interleaved(s);  // the runner's RoPE pairs
}

void key_smoothing(const KeyStats &s, double alpha, double beta, std::vector<float> &scale,
                   std::vector<float> &offset) {
  if (beta > 0.0 && s.qrms.size() != s.rms.size())
    throw RunnerError(
        "qsmooth: the key statistics have no query rms (qrms lines); fit them again with "
        "`kvcache calibrate`");
  const std::size_t row = std::size_t(s.kv_heads) * s.head_dim;
  const std::vector<float> &m = s.rms;
  scale.assign(m.size(), 1.0f);
  offset.assign(m.size(), 0.0f);
  for (int l = 0; l < s.layers; ++l) {
    const float *ml = m.data() + std::size_t(l) * row;
    const float top = *std::max_element(ml, ml + row);
    const float *ql = beta > 0.0 ? s.qrms.data() + std::size_t(l) * row : nullptr;
    const float qtop = ql ? *std::max_element(ql, ql + row) : 0.0f;
    for (std::size_t c = 0; c < row; ++c) {
      const std::size_t i = std::size_t(l) * row + c;
      // A layer of constant keys (rms 0) keeps scale 1; no scale below the library's 1e-30.
      if (top > 0.0f) {
        double v = std::pow(std::max<double>(ml[c], 1e-3 * top), alpha);
        if (ql && qtop > 0.0f) v /= std::pow(std::max<double>(ql[c], 1e-3 * qtop), beta);
        scale[i] = static_cast<float>(std::min(std::max(v, 1e-30), 1e30));
      }
      offset[i] = s.mean[i];
    }
  }
}

KeyStats fit_key_stats(const kvc_runner::Model &model, const std::vector<int> &tokens, int bos,
                       int window, int windows) {
  const kvc_runner::ModelConfig &c = model.config();
  const int hd = c.head_dim(), half = hd / 2, row = c.kv_dim();
  // The runner's RoPE: pair i of a head turns by pos x theta^(-2i / head_dim).
  const std::vector<float> inv_freq = rope_inv_freq(c);
  // cos / sin of every position's RoPE angle per pair, [window][half]: keys
  // and queries are rotated back by -angle with the same table.
  std::vector<float> rcos(std::size_t(window) * half), rsin(rcos.size());
  for (int pos = 0; pos < window; ++pos)
    for (int i = 0; i < half; ++i) {
      const float ang = static_cast<float>(pos) * inv_freq[std::size_t(i)];
      rcos[std::size_t(pos) * half + i] = std::cos(ang);
      rsin[std::size_t(pos) * half + i] = std::sin(ang);
    }
  // Pair i of the head at `x`, at RoPE position `pos`, rotated back: u, v.
  const auto rotate_back = [&](const float *x, int pos, int i, float &u, float &v) {
    const float cs = rcos[std::size_t(pos) * half + i], sn = rsin[std::size_t(pos) * half + i];
    const float a = x[2 * i], b = x[2 * i + 1];
    u = a * cs + b * sn;
    v = -a * sn + b * cs;
  };
  const std::size_t n = std::size_t(c.n_layers) * std::size_t(row);
  std::vector<double> sum(n, 0.0), sum2(n, 0.0);
  std::vector<float> lo(n, INFINITY), hi(n, -INFINITY);
  std::uint64_t count = 0;
  // Queries: sum of q[c]^2 before RoPE over the query heads of each KV head.
  const int group = c.q_per_kv();
  std::vector<double> qsum2(n, 0.0);
  std::uint64_t qcount = 0;
  const auto on_query = [&](int layer, int pos, const float *q) {
    if (pos == 0) return;  // as the keys: BOS left out
    if (layer == 0) ++qcount;
    for (int h = 0; h < c.n_heads; ++h) {
      const float *x = q + std::size_t(h) * hd;
      const std::size_t base = std::size_t(layer) * row + std::size_t(h / group) * hd;
      for (int i = 0; i < half; ++i) {
        float u, v;
        rotate_back(x, pos, i, u, v);
        qsum2[base + std::size_t(2 * i)] += double(u) * u;
        qsum2[base + std::size_t(2 * i) + 1] += double(v) * v;
      }
    }
  };
  run_calibration(
      model, tokens, bos, window, windows,
      [&](const kvc_runner::ArrayCache &cache) {
        for (int l = 0; l < c.n_layers; ++l)
          for (int h = 0; h < c.n_kv_heads; ++h)
            cache.for_each_key(
                l, window, h, [&](int t0, int cnt, const float *rows, std::size_t st) {
                  for (int r = 0; r < cnt; ++r) {
                    const int pos = t0 + r;
                    if (pos == 0)
                      continue;  // the attention sink: far from the others (keep it with sinks=1)
                    const float *x = rows + std::size_t(r) * st;
                    const std::size_t base = std::size_t(l) * row + std::size_t(h) * hd;
                    for (int i = 0; i < half; ++i) {
                      float vals[2];
                      rotate_back(x, pos, i, vals[0], vals[1]);
                      for (int j = 0; j < 2; ++j) {
                        const std::size_t idx = base + std::size_t(2 * i + j);
                        sum[idx] += vals[j];
                        sum2[idx] += double(vals[j]) * vals[j];
                        lo[idx] = std::min(lo[idx], vals[j]);
                        hi[idx] = std::max(hi[idx], vals[j]);
                      }
                    }
                  }
                });
        count += std::uint64_t(window - 1);
      },
      on_query);
  KeyStats s;
  s.layers = c.n_layers;
  s.kv_heads = c.n_kv_heads;
  s.head_dim = hd;
  s.tokens = count;
  s.mean.resize(n);
  s.rms.resize(n);
  s.absmax.resize(n);
  // Every scored position's queries must have been seen (the runner's
  // token-at-a-time forward pass shows them to observe_query).
  if (qcount != count)
    throw RunnerError("calibrate: saw the queries of " + std::to_string(qcount) + " positions, " +
                      std::to_string(count) + " expected");
  s.qrms.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    s.qrms[i] = static_cast<float>(std::sqrt(qsum2[i] / (double(qcount) * group)));
    const double mean = sum[i] / double(count);
    const double var = std::max(0.0, sum2[i] / double(count) - mean * mean);
    s.mean[i] = static_cast<float>(mean);
    s.rms[i] = static_cast<float>(std::sqrt(var));
    s.absmax[i] = static_cast<float>(std::max(double(hi[i]) - mean, mean - double(lo[i])));
  }
  return s;
}

}  // namespace kvc_cli
