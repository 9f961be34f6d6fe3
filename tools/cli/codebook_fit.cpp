// SPDX-License-Identifier: Apache-2.0
#include "codebook_fit.h"

#include <kvcache/kvcache.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "../runner/error.h"
#include "../runner/runner.h"
#include "calibration.h"

namespace kvc_cli {
namespace {

using kvc_runner::RunnerError;

// Weighted histogram of values in [-1, 1]: per bin the weight and the
// weighted sum (so each bin's centroid is exact).
struct Hist {
  std::vector<double> w, s;
  explicit Hist(std::uint32_t bins) : w(bins, 0.0), s(bins, 0.0) {}
  void add(float u, double weight) {
    const std::size_t n = w.size();
    double pos = (static_cast<double>(u) + 1.0) * 0.5 * static_cast<double>(n);
    std::size_t i = pos <= 0.0 ? 0 : static_cast<std::size_t>(pos);
    if (i >= n) i = n - 1;
    w[i] += weight;
    s[i] += weight * static_cast<double>(u);
  }
};

// Lloyd's algorithm over a histogram: each bin goes whole to the level
// nearest its centroid (centroids ascend with the bin index, so one sweep
// assigns them), each level moves to the weighted mean of its bins.
std::vector<float> lloyd_hist(const Hist &h, std::uint32_t bits, const std::vector<float> &init) {
  const std::size_t k = std::size_t{1} << bits, n = h.w.size();
  if (init.size() != k)
    throw RunnerError("lloyd: init holds " + std::to_string(init.size()) + " levels, not 2^" +
                      std::to_string(bits));
  std::vector<double> lv(init.begin(), init.end()), cw(k), cs(k);
  for (int it = 0; it < 500; ++it) {
    std::fill(cw.begin(), cw.end(), 0.0);
    std::fill(cs.begin(), cs.end(), 0.0);
    std::size_t j = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (h.w[i] <= 0.0) continue;
      const double c = h.s[i] / h.w[i];
      while (j + 1 < k && std::fabs(lv[j + 1] - c) < std::fabs(lv[j] - c)) ++j;
      cw[j] += h.w[i];
      cs[j] += h.s[i];
    }
    double moved = 0.0;
    for (std::size_t q = 0; q < k; ++q)
      if (cw[q] > 0.0) {
        const double nv = cs[q] / cw[q];
        moved = std::max(moved, std::fabs(nv - lv[q]));
        lv[q] = nv;
      }
    std::sort(lv.begin(), lv.end());
    if (moved < 1e-9) break;
  }
  std::vector<float> out(k);
  for (std::size_t q = 0; q < k; ++q)
    out[q] = static_cast<float>(std::min(1.0, std::max(-1.0, lv[q])));
  // Strictly ascending inside [-1, 1] (kvc_pool_set_codebook's rule): nudge
  // equal neighbours apart, down from the top when the top would leave it.
  for (std::size_t q = 1; q < k; ++q)
    if (!(out[q] > out[q - 1])) out[q] = std::nextafter(out[q - 1], 2.0f);
  if (out[k - 1] > 1.0f) {
    out[k - 1] = 1.0f;
    for (std::size_t q = k - 1; q-- > 0;)
      if (!(out[q] < out[q + 1])) out[q] = std::nextafter(out[q + 1], -2.0f);
  }
  return out;
}

// The pool's normalized Walsh-Hadamard transform of each `block` values (codec::hadamard).
void hadamard(float *x, std::size_t d, std::uint32_t block) {
  const float norm = 1.0f / std::sqrt(static_cast<float>(block));
  for (std::size_t base = 0; base < d; base += block) {
    float *v = x + base;
    for (std::uint32_t h = 1; h < block; h *= 2)
      for (std::uint32_t i = 0; i < block; i += 2 * h)
        for (std::uint32_t j = i; j < i + h; ++j) {
          const float a = v[j], b = v[j + h];
          v[j] = a + b;
          v[j + h] = a - b;
        }
    for (std::uint32_t j = 0; j < block; ++j) v[j] *= norm;
  }
}

// Adds a row's normalized values: each group divided by its signed extreme
// (the first of equal magnitudes), weighted by the extreme squared.
void add_groups(Hist &h, const float *x, std::size_t d, std::uint64_t group,
                std::uint64_t &groups) {
  for (std::size_t g = 0; g < d; g += group) {
    float e = x[g];
    for (std::size_t i = g + 1; i < g + group; ++i)
      if (std::fabs(x[i]) > std::fabs(e)) e = x[i];
    if (e == 0.0f) continue;  // an all-zero group: every code decodes to 0
    const float inv = 1.0f / e;
    const double wt = static_cast<double>(e) * static_cast<double>(e);
    for (std::size_t i = g; i < g + group; ++i) h.add(x[i] * inv, wt);
    ++groups;
  }
}

}  // namespace

std::vector<float> lloyd_levels(const std::vector<float> &samples,
                                const std::vector<float> &weights, std::uint32_t bits,
                                const std::vector<float> &init, std::uint32_t bins) {
  if (weights.size() != samples.size())
    throw RunnerError("lloyd: " + std::to_string(weights.size()) + " weights for " +
                      std::to_string(samples.size()) + " samples");
  if (bins < 2) throw RunnerError("lloyd: at least 2 bins");
  Hist h(bins);
  for (std::size_t i = 0; i < samples.size(); ++i) {
    if (!(samples[i] >= -1.0f && samples[i] <= 1.0f) || !(weights[i] >= 0.0f))
      throw RunnerError("lloyd: sample " + std::to_string(i) + " outside [-1, 1] or weight < 0");
    h.add(samples[i], weights[i]);
  }
  return lloyd_hist(h, bits, init);
}

std::vector<FittedCodebook> fit_codebooks(const kvc_runner::Model &model,
                                          const std::vector<int> &tokens, int bos, int window,
                                          int windows, const std::vector<CodebookPart> &parts) {
  const kvc_runner::ModelConfig &c = model.config();
  const int hd = c.head_dim(), half = hd / 2, row = c.kv_dim(), nl = c.n_layers;
  for (const CodebookPart &p : parts) {
    const std::string what = std::string(p.part ? "values" : "keys") + ": ";
    if (p.bits < 2 || p.bits > 4) throw RunnerError(what + "codebooks take 2 to 4 bits");
    if (p.group == 0 || row % p.group != 0 || (p.group > std::uint64_t(hd) && p.group % hd != 0) ||
        (p.group < std::uint64_t(hd) && hd % p.group != 0))
      throw RunnerError(what + "a group of " + std::to_string(p.group) +
                        " values does not tile this model's rows of " + std::to_string(row));
    if (p.rotation && (hd % p.rotation != 0 || (p.rotation & (p.rotation - 1)) != 0))
      throw RunnerError(what + "a rotation block of " + std::to_string(p.rotation) +
                        " does not divide head_dim " + std::to_string(hd));
    if (!p.smooth_scale.empty() && p.smooth_scale.size() != std::size_t(nl) * row)
      throw RunnerError(what + "smoothing holds " + std::to_string(p.smooth_scale.size()) +
                        " scales, not layers x kv_dim");
    if (!p.smooth_offset.empty() && p.smooth_offset.size() != p.smooth_scale.size())
      throw RunnerError(what + "smoothing offsets and scales differ in count");
  }
  const std::vector<float> inv_freq = rope_inv_freq(c);  // the runner's RoPE
  std::vector<Hist> hist(parts.size() * std::size_t(nl), Hist(1u << 14));
  std::vector<std::uint64_t> groups(parts.size() * std::size_t(nl), 0);
  std::vector<float> x(static_cast<std::size_t>(row));
  run_calibration(model, tokens, bos, window, windows, [&](const kvc_runner::ArrayCache &cache) {
    for (int l = 0; l < nl; ++l)
      for (std::size_t pi = 0; pi < parts.size(); ++pi) {
        const CodebookPart &p = parts[pi];
        auto each = [&](int, int cnt, const float *rows, std::size_t st) {
          for (int pos = 1; pos < cnt; ++pos) {  // position 0: the attention sink
            std::copy(rows + std::size_t(pos) * st, rows + std::size_t(pos) * st + row, x.begin());
            if (p.part == 0 && p.pre_rope)  // the runner's RoPE: interleaved pairs
              for (int h = 0; h < c.n_kv_heads; ++h)
                for (int i = 0; i < half; ++i) {
                  float *q = x.data() + std::size_t(h) * hd + 2 * i;
                  const float ang = static_cast<float>(pos) * inv_freq[std::size_t(i)];
                  const float cs = std::cos(ang), sn = std::sin(ang), a = q[0], b = q[1];
                  q[0] = a * cs + b * sn;
                  q[1] = -a * sn + b * cs;
                }
            if (p.part == 0 && !p.smooth_scale.empty()) {
              const std::size_t base = std::size_t(l) * row;
              for (int i = 0; i < row; ++i)
                x[std::size_t(i)] =
                    (x[std::size_t(i)] -
                     (p.smooth_offset.empty() ? 0.0f : p.smooth_offset[base + std::size_t(i)])) /
                    p.smooth_scale[base + std::size_t(i)];
            }
            if (p.rotation > 1) hadamard(x.data(), std::size_t(row), p.rotation);
            const std::size_t at = pi * std::size_t(nl) + std::size_t(l);
            add_groups(hist[at], x.data(), std::size_t(row), p.group, groups[at]);
          }
        };
        if (p.part == 0)
          cache.for_each_key(l, window, 0, each);
        else
          cache.for_each_value(l, window, 0, each);
      }
  });
  std::vector<FittedCodebook> out;
  for (std::size_t pi = 0; pi < parts.size(); ++pi) {
    const CodebookPart &p = parts[pi];
    std::vector<float> init(std::size_t{1} << p.bits);
    if (kvc_codebook_gaussian(p.bits, p.group, init.data()) != KVC_OK)
      throw RunnerError(std::string("kvc_codebook_gaussian: ") + kvc_last_error_message());
    FittedCodebook fb;
    fb.how = p;
    fb.how.smooth_scale.clear();
    fb.how.smooth_offset.clear();
    fb.layers = nl;
    for (int l = 0; l < nl; ++l) {
      const std::size_t at = pi * std::size_t(nl) + std::size_t(l);
      const std::vector<float> lv = lloyd_hist(hist[at], p.bits, init);
      fb.levels.insert(fb.levels.end(), lv.begin(), lv.end());
      fb.groups = groups[at];
    }
    out.push_back(std::move(fb));
  }
  return out;
}

void layer_codebook_part(const kvc_codec &c, const kvc_runner::ModelConfig &mc, CodebookPart &p) {
  p.bits = c.dtype == KVC_DTYPE_INT4   ? 4
           : c.dtype == KVC_DTYPE_INT3 ? 3
           : c.dtype == KVC_DTYPE_INT2 ? 2
                                       : 0;  // int8 / fp8: no levels (uniform codes)
  p.group = c.granularity == KVC_SCALE_PER_TOKEN ? static_cast<std::uint64_t>(mc.head_dim())
                                                 : c.group_size;
}

std::vector<CodebookPart> strategy_codebook_parts(const Strategy &s,
                                                  const kvc_runner::ModelConfig &mc,
                                                  const std::vector<float> &key_scale,
                                                  const std::vector<float> &key_offset,
                                                  bool fit_only) {
  std::vector<CodebookPart> out;
  for (int kv = 0; kv < 2; ++kv) {
    if (!s.codebook[kv] || (fit_only && !s.codebook_fit[kv])) continue;
    const kvc_codec &c = kv ? s.v_codec : s.k_codec;
    CodebookPart p;
    p.part = kv;
    layer_codebook_part(c, mc, p);
    if (c.rotation == KVC_ROTATION_HADAMARD) {
      p.rotation = c.rotation_block;
      if (!p.rotation)  // the pool's default: the largest power of two dividing head_dim
        for (p.rotation = 1; p.rotation < 1024 && mc.head_dim() % (2 * p.rotation) == 0;)
          p.rotation *= 2;
    }
    if (kv == 0) {
      p.pre_rope = s.pre_rope_keys;
      p.smooth_scale = key_scale;
      p.smooth_offset = key_offset;
    }
    out.push_back(std::move(p));
  }
  return out;
}

CodebookText codebook_fit_text(const kvc_runner::Tokenizer &tokenizer,
                               const kvc_runner::ModelConfig &c, const std::string &path) {
  const std::string file =
      path.empty() ? kvc_runner::shared_dir() + "/data/out-of-domain.txt" : path;
  CodebookText t;
  t.tokens = tokenizer.encode(kvc_runner::read_text_file(file, "codebook text"), false, false);
  t.window = std::min(c.seq_len, 512);
  t.windows = std::min<int>(4, static_cast<int>(t.tokens.size() / std::size_t(t.window - 1)));
  if (t.windows < 1)
    throw RunnerError("codebook text " + file + ": " + std::to_string(t.tokens.size()) +
                      " tokens, fewer than one window of " + std::to_string(t.window));
  const std::size_t slash = file.find_last_of('/');
  t.description = (slash == std::string::npos ? file : file.substr(slash + 1)) + ", " +
                  std::to_string(t.windows) + " windows of " + std::to_string(t.window) +
                  " positions";
  return t;
}

std::string format_codebooks(const std::vector<FittedCodebook> &books, const std::string &comment) {
  std::ostringstream o;
  std::istringstream lines(comment);
  for (std::string line; std::getline(lines, line);) o << "# " << line << "\n";
  o << "kvcache-codebook 1\n";
  char buf[32];
  for (const FittedCodebook &b : books) {
    const std::size_t k = std::size_t{1} << b.how.bits;
    o << "part " << (b.how.part ? 'v' : 'k') << " bits " << b.how.bits << " group " << b.how.group
      << " layers " << b.layers << "\n";
    for (int l = 0; l < b.layers; ++l) {
      o << "levels " << l;
      for (std::size_t q = 0; q < k; ++q) {
        std::snprintf(buf, sizeof buf, " %.9g", static_cast<double>(b.levels[l * k + q]));
        o << buf;
      }
      o << "\n";
    }
  }
  return o.str();
}

std::vector<FittedCodebook> parse_codebooks(const std::string &text, const std::string &where) {
  std::istringstream in(text);
  std::vector<FittedCodebook> out;
  bool header = false;
  int line_no = 0;
  auto fail = [&](const std::string &why) {
    throw RunnerError(where + ":" + std::to_string(line_no) + ": " + why);
  };
  // A whole number of ASCII digits (no sign), at most `most`.
  auto whole = [&](const std::string &w, std::uint64_t most, const char *what) {
    if (w.empty() || w.size() > 20 ||
        !std::all_of(w.begin(), w.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      fail(std::string(what) + " '" + w + "' is not a whole number");
    const unsigned long long v = std::strtoull(w.c_str(), nullptr, 10);
    if (v > most) fail(std::string(what) + " " + w + " is above " + std::to_string(most));
    return static_cast<std::uint64_t>(v);
  };
  auto complete = [](const FittedCodebook &b) {
    return b.levels.size() == (std::size_t(b.layers) << b.how.bits);
  };
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    const std::size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream ls(line);
    std::vector<std::string> w;
    for (std::string x; ls >> x;) w.push_back(x);
    if (w.empty()) continue;
    if (!header) {
      if (w.size() != 2 || w[0] != "kvcache-codebook" || w[1] != "1")
        fail("expected the header 'kvcache-codebook 1'");
      header = true;
    } else if (w[0] == "part") {
      if (!out.empty() && !complete(out.back()))
        fail("the previous part has fewer levels lines than its layers");
      if (w.size() != 8 || (w[1] != "k" && w[1] != "v") || w[2] != "bits" || w[4] != "group" ||
          w[6] != "layers")
        fail("expected 'part k|v bits B group G layers L'");
      FittedCodebook b;
      b.how.part = w[1] == "v" ? 1 : 0;
      b.how.bits = static_cast<std::uint32_t>(whole(w[3], 4, "bits"));
      b.how.group = whole(w[5], std::uint64_t{1} << 32, "group");
      b.layers = static_cast<int>(whole(w[7], 4096, "layers"));
      if (b.how.bits < 2) fail("bits must be 2, 3 or 4");
      if (b.how.group == 0) fail("group must be at least 1");
      if (b.layers < 1) fail("layers must be in [1, 4096]");
      out.push_back(std::move(b));
    } else if (w[0] == "levels") {
      if (out.empty()) fail("'levels' before any 'part' line");
      FittedCodebook &b = out.back();
      const std::size_t k = std::size_t{1} << b.how.bits;
      const std::string layer = std::to_string(b.levels.size() / k);
      if (complete(b) || w.size() < 2 || w[1] != layer)
        fail("expected 'levels " + layer + "' (layers in order, as many as the part has)");
      if (w.size() != 2 + k)
        fail(std::to_string(w.size() - 2) + " levels, expected 2^bits = " + std::to_string(k));
      for (std::size_t q = 0; q < k; ++q) {
        const std::string &x = w[2 + q];
        char *end = nullptr;
        const float v = std::strtof(x.c_str(), &end);
        if (end != x.c_str() + x.size() || !(v >= -1.0f && v <= 1.0f))
          fail("level " + std::to_string(q) + " '" + x + "': expected a number in [-1, 1]");
        if (q > 0 && !(v > b.levels.back())) fail("levels must ascend strictly (as float32)");
        b.levels.push_back(v);
      }
    } else {
      fail("unknown line '" + w[0] + "'");
    }
  }
  if (!header) fail("empty: expected the header 'kvcache-codebook 1'");
  if (out.empty()) fail("no 'part' line");
  if (!complete(out.back())) fail("the last part has fewer levels lines than its layers");
  return out;
}

}  // namespace kvc_cli
