// SPDX-License-Identifier: Apache-2.0
// `kvcache eval`, reporting: the strategy table (and --long's perplexity per
// segment), the JSON report, and a llama.cpp peer report read and printed
// beside our rows (--peer).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <set>
#include <vector>

#include "../runner/blas.h"
#include "../runner/error.h"
#include "../runner/runner.h"
#include "eval.h"
#include "memory.h"

namespace kvc_cli {
using namespace kvc_runner;

void print_eval_table(const EvalReport &rep, std::FILE *out) {
  std::fprintf(out, "model   %s (%s): %d layers, %d query heads, %d KV heads, head_dim %d\n",
               rep.model.c_str(), rep.model_path.c_str(), rep.num_layers, rep.num_q_heads,
               rep.num_kv_heads, rep.head_dim);
  std::fprintf(out, "text    %s\n", rep.text_path.c_str());
  if (!rep.codebook_fit_text.empty())
    std::fprintf(out, "fitted  codebook=fit levels from %s\n", rep.codebook_fit_text.c_str());
  std::fprintf(
      out,
      "scored  %lld tokens in %d window%s of ctx %d (teacher forcing, each window starts "
      "with %s); reference: dense f32%s\n",
      static_cast<long long>(rep.tokens_scored), rep.windows, rep.windows == 1 ? "" : "s", rep.ctx,
      rep.bos ? "BOS" : "the token before its first scored one",
      rep.chunk > 1
          ? (", forward pass in chunks of " + std::to_string(rep.chunk) + " positions").c_str()
          : "");
  if (rep.ctx > rep.trained_context) {
    std::fprintf(
        out,
        "note    ctx %d is above the model's trained context of %d positions: dense caches run "
        "positions it never saw\n",
        rep.ctx, rep.trained_context);
  }
  std::fprintf(out, "\n");
  std::vector<std::vector<std::string>> cells;
  cells.push_back({"strategy", "bits/elem", "mean bits", "KV B/token", "kept", "peak KV",
                   "memory vs f16", "peak vs f16", "B/token vs f16", "ppl", "ppl Δ%", "KL mean",
                   "top-1", "ms/token"});
  char buf[64];
  for (const StrategyResult &r : rep.results) {
    std::vector<std::string> row;
    row.push_back(r.strategy);
    std::snprintf(buf, sizeof buf, "%.2f", r.bits_per_element);
    row.push_back(buf);
    std::snprintf(buf, sizeof buf, "%.2f", r.mean_bits_per_element);
    row.push_back(buf);
    row.push_back(std::to_string(r.kv_bytes_per_token));
    std::snprintf(buf, sizeof buf, "%.1f%%", r.kept_fraction * 100.0);
    row.push_back(buf);
    row.push_back(human_bytes(static_cast<long double>(r.peak_kv_bytes)));
    std::snprintf(buf, sizeof buf, "%.2fx", r.memory_vs_f16);
    row.push_back(buf);
    std::snprintf(buf, sizeof buf, "%.2fx", r.peak_memory_vs_f16);
    row.push_back(buf);
    std::snprintf(buf, sizeof buf, "%.2fx", r.compression_vs_f16);
    row.push_back(buf);
    std::snprintf(buf, sizeof buf, "%.6f", r.ppl);
    row.push_back(buf);
    std::snprintf(buf, sizeof buf, "%+.5f", r.ppl_delta_pct);
    row.push_back(buf);
    std::snprintf(buf, sizeof buf, "%.3e", r.kl_mean);
    row.push_back(buf);
    std::snprintf(buf, sizeof buf, "%.4f", r.top1_agreement);
    row.push_back(buf);
    std::snprintf(buf, sizeof buf, "%.4f", r.ms_per_token);
    row.push_back(buf);
    cells.push_back(row);
  }
  // Column widths counted in code points (the header holds a 'Δ').
  auto width = [](const std::string &s) {
    std::size_t n = 0;
    for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
    return n;
  };
  std::vector<std::size_t> widths(cells[0].size(), 0);
  for (const auto &row : cells) {
    for (std::size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], width(row[i]));
  }
  for (std::size_t k = 0; k < cells.size(); ++k) {
    std::string line;
    for (std::size_t i = 0; i < cells[k].size(); ++i) {
      const std::string &s = cells[k][i];
      const std::string pad(widths[i] - width(s), ' ');
      line += i == 0 ? s + pad : "  " + pad + s;  // first column left, numbers right
    }
    std::fprintf(out, "%s\n", line.c_str());
    if (k == 0) {
      std::size_t total = 0;
      for (std::size_t w : widths) total += w + 2;
      std::fprintf(out, "%s\n", std::string(total - 2, '-').c_str());
    }
  }
  std::fprintf(
      out,
      "\nbits/elem: bits held per stored element at the end of each full window; mean bits: the "
      "same "
      "averaged over every forward pass (partly filled blocks and tokens staged in f16 count while "
      "they "
      "exist);\n"
      "kept: K/V tokens held at the end of a full window over positions fed (eviction);\n"
      "memory vs f16: the dense f16 cache's bytes at the end of a full window / this row's bytes "
      "held then (above 1: less memory); peak vs f16: the same for the peaks; B/token vs f16: per "
      "token held (f16 bytes per token / KV B/token);\n"
      "KL: mean KL(dense f32 || strategy) over the full vocabulary, nats per token; top-1: "
      "share of positions whose argmax equals the dense one;\nms/token: CPU time of "
      "the forward pass with the cache, per position. Wall time %.1f s on %d thread(s).\n",
      rep.wall_seconds, rep.threads);
  const std::size_t n_segments = rep.results.empty() ? 0 : rep.results[0].segment_ppl.size();
  if (n_segments > 1) {
    std::fprintf(out,
                 "\nperplexity per segment of %d positions (targets at positions [from, to)):\n\n",
                 rep.segment);
    std::string head = "strategy";
    std::size_t name_w = head.size();
    for (const StrategyResult &r : rep.results) name_w = std::max(name_w, r.strategy.size());
    std::string line = head + std::string(name_w - head.size(), ' ');
    for (std::size_t k = 0; k < n_segments; ++k) {
      const int from = static_cast<int>(k) * rep.segment,
                to = std::min(rep.ctx, from + rep.segment);
      std::snprintf(buf, sizeof buf, "%d-%d", from, to);
      line +=
          "  " + std::string(std::max<int>(0, 10 - static_cast<int>(std::strlen(buf))), ' ') + buf;
    }
    std::snprintf(buf, sizeof buf, "%d-%d / 0-%d", rep.ctx / 2, rep.ctx, rep.segment);
    line += "  " + std::string(buf);
    std::fprintf(out, "%s\n%s\n", line.c_str(), std::string(line.size(), '-').c_str());
    for (const StrategyResult &r : rep.results) {
      line = r.strategy + std::string(name_w - r.strategy.size(), ' ');
      for (double p : r.segment_ppl) {
        if (p > 0)
          std::snprintf(buf, sizeof buf, "%10.4f", p);
        else
          std::snprintf(buf, sizeof buf, "%10s", "-");  // no scored target in this segment
        line += "  " + std::string(buf);
      }
      if (r.segment_ppl[0] > 0 && r.second_half_ppl > 0)
        std::snprintf(buf, sizeof buf, "%.3fx", r.second_half_ppl / r.segment_ppl[0]);
      else
        std::snprintf(buf, sizeof buf, "-");
      line += "  " + std::string(buf);
      std::fprintf(out, "%s\n", line.c_str());
    }
  }
  if (rep.has_overhead) {
    std::fprintf(out, "Overhead: plain array cache %.4f ms/token, f32 pool %.4f ms/token: %.3fx\n",
                 rep.array_ms_per_token, rep.pool_f32_ms_per_token,
                 rep.pool_f32_ms_per_token / rep.array_ms_per_token);
  }
}

namespace {

double number_or_nan(const nlohmann::json &v) {
  return v.is_number() ? v.get<double>() : std::nan("");
}

std::string base_name(const std::string &path) {
  const std::size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

/// Largest peer report read (a full table is a few hundred KiB).
constexpr std::uintmax_t kMaxPeerReportBytes = 64u << 20;
/// Deepest nesting of arrays and objects a peer report may have (the schema needs 4).
constexpr int kMaxPeerReportDepth = 32;
// The longest strategy name a peer row may have (a table column, not a file).
constexpr std::size_t kMaxPeerStrategyBytes = 256;

/// Deepest nesting of [ and { outside strings (before parsing: nlohmann recurses per level).
int json_depth(const std::string &text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// Whether s holds a C0 or C1 control character or a bidirectional override
// or isolate (U+202A..U+202E, U+2066..U+2069), which would reach the terminal
// and rearrange the table.
bool has_control_char(const std::string &s) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return true;
    const unsigned char c1 = i + 1 < s.size() ? static_cast<unsigned char>(s[i + 1]) : 0;
    const unsigned char c2 = i + 2 < s.size() ? static_cast<unsigned char>(s[i + 2]) : 0;
    if (c == 0xC2 && c1 >= 0x80 && c1 <= 0x9F) return true;                // U+0080..U+009F
    if (c == 0xE2 && c1 == 0x80 && c2 >= 0xAA && c2 <= 0xAE) return true;  // U+202A..U+202E
    if (c == 0xE2 && c1 == 0x81 && c2 >= 0xA6 && c2 <= 0xA9) return true;  // U+2066..U+2069
  }
  return false;
}

/// Code points of a UTF-8 string (what a terminal column counts, near enough).
std::size_t text_width(const std::string &s) {
  std::size_t n = 0;
  for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
  return n;
}

std::string pad_right(const std::string &s, std::size_t width) {
  const std::size_t w = text_width(s);
  return w >= width ? s : s + std::string(width - w, ' ');
}

std::string pad_left(const std::string &s, std::size_t width) {
  const std::size_t w = text_width(s);
  return w >= width ? s : std::string(width - w, ' ') + s;
}

}  // namespace

std::string read_peer_report(const std::string &path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status))
    throw RunnerError("cannot open peer report '" + path + "': no such file");
  if (!std::filesystem::is_regular_file(status))
    throw RunnerError("peer report '" + path + "' is not a regular file");
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec || size > kMaxPeerReportBytes)
    throw RunnerError("peer report '" + path + "' is larger than " +
                      std::to_string(kMaxPeerReportBytes >> 20) + " MiB");
  const std::string text = read_text_file(path, "peer report");
  if (json_depth(text) > kMaxPeerReportDepth)
    throw RunnerError("peer report '" + path + "' nests arrays or objects deeper than " +
                      std::to_string(kMaxPeerReportDepth) + " levels");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception &e) {
    const bool non_finite =
        text.find("NaN") != std::string::npos || text.find("Infinity") != std::string::npos;
    throw RunnerError("peer report '" + path + "' is not JSON" +
                      (non_finite ? " (NaN and Infinity are not JSON: write null)" : "") + ": " +
                      e.what());
  }
  const std::string where = "peer report '" + path + "'";
  if (!j.is_object() || !j.contains("results") || !j["results"].is_array() || j["results"].empty())
    throw RunnerError(where +
                      " has no results (expected the --json output of bench/peers/llamacpp_kv.py "
                      "or bench/peers/hf_caches.py)");
  if (!j.contains("model")) throw RunnerError(where + " lacks 'model' (the model file it ran)");
  if (j.contains("complete") && j["complete"] == false)
    throw RunnerError(where +
                      " is the checkpoint of an unfinished run (complete: false): finish it with "
                      "--resume and give the report it writes");
  for (const char *k : {"model", "peer", "reference", "token_ids_sha256"})
    if (j.contains(k) && (!j[k].is_string() || has_control_char(j[k].get<std::string>())))
      throw RunnerError(where + ": '" + k + "' is not a string of printable characters");
  if (j.contains("token_ids_sha256")) {
    const std::string h = j["token_ids_sha256"].get<std::string>();
    if (h.size() != 64 || h.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw RunnerError(where + ": 'token_ids_sha256' is not 64 lower-case hex digits");
  }
  for (const char *k : {"token_ids_count", "ctx", "windows", "tokens_scored", "chunk"}) {
    if (j.contains(k) && !j[k].is_number_integer())
      throw RunnerError(where + ": '" + k + "' is not an integer");
    // (an unsigned value past int64 would read as a negative one below)
    if (j.contains(k) && j[k].is_number_unsigned() &&
        j[k].get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
      throw RunnerError(where + ": '" + k + "' " + j[k].dump() + " is too large");
  }
  if (j.contains("ctx") &&
      (j["ctx"].get<std::int64_t>() < 2 || j["ctx"].get<std::int64_t>() > kMaxEvalContext))
    throw RunnerError(where + ": 'ctx' " + j["ctx"].dump() + " is not a window length (2.." +
                      std::to_string(kMaxEvalContext) + ")");
  for (const char *k : {"token_ids_count", "windows", "tokens_scored", "chunk"})
    if (j.contains(k) && j[k].get<std::int64_t>() < 1)
      throw RunnerError(where + ": '" + k + "' must be at least 1, not " + j[k].dump());
  std::size_t i = 0;
  std::set<std::string> seen;  // strategy, protocol and side of each row
  for (const auto &r : j["results"]) {
    const std::string row = where + ": result " + std::to_string(i++);
    if (!r.is_object()) throw RunnerError(row + " is not an object");
    for (const char *k :
         {"strategy", "bits_per_element", "kv_bytes_per_token", "ppl", "ppl_delta_pct", "kl_mean"})
      if (!r.contains(k)) throw RunnerError(row + " lacks '" + k + "'");
    if (!r["strategy"].is_string() || r["strategy"].get<std::string>().empty() ||
        has_control_char(r["strategy"].get<std::string>()))
      throw RunnerError(row + ": 'strategy' is not a non-empty string of printable characters");
    if (r["strategy"].get<std::string>().size() > kMaxPeerStrategyBytes)
      throw RunnerError(row + ": 'strategy' is longer than " +
                        std::to_string(kMaxPeerStrategyBytes) + " bytes");
    const std::string name = row + " ('" + r["strategy"].get<std::string>() + "')";
    const auto text_of = [&](const char *k) {
      return r.contains(k) && r[k].is_string() ? r[k].get<std::string>() : std::string();
    };
    if (!seen.insert(r["strategy"].get<std::string>() + '\n' + text_of("protocol") + '\n' +
                     text_of("side"))
             .second)
      throw RunnerError(name + " repeats an earlier row (the same strategy and protocol)");
    if (r.contains("protocol") &&
        (!r["protocol"].is_string() || has_control_char(r["protocol"].get<std::string>())))
      throw RunnerError(name + ": 'protocol' is not a string of printable characters");
    // Quality may be null: a peer whose logits were not finite (the row says why in "note").
    struct Range {
      const char *key;
      double lo, hi;
      bool lo_open, nullable;
    };
    for (const Range &k :
         {Range{"bits_per_element", 0, 1024, true, false},
          Range{"kv_bytes_per_token", 0, 1e12, false, false}, Range{"ppl", 1, 1e12, false, true},
          Range{"ppl_delta_pct", -100, 1e12, false, true},
          Range{"kl_mean", -1e-6, 1e6, false, true}, Range{"kept_fraction", 0, 1, true, false},
          Range{"memory_vs_f16", 0, 1e6, true, false}, Range{"top1_agreement", 0, 1, false, false},
          Range{"ms_per_token", 0, 1e9, false, false}}) {
      if (!r.contains(k.key)) continue;
      const nlohmann::json &v = r[k.key];
      if (k.nullable && v.is_null()) continue;
      if (!v.is_number())
        throw RunnerError(name + ": '" + k.key + "' is not a number" +
                          (k.nullable ? " (or null)" : ""));
      const double x = v.get<double>();
      if (!(std::isfinite(x) && (k.lo_open ? x > k.lo : x >= k.lo) && x <= k.hi)) {
        char range[96];
        std::snprintf(range, sizeof range, "%s%g, %g]", k.lo_open ? "(" : "[", k.lo, k.hi);
        throw RunnerError(name + ": '" + k.key + "' " + v.dump() + " is outside " + range);
      }
    }
  }
  return text;
}

void check_peer_report(const EvalReport &rep, const std::string &peer, const std::string &path) {
  const nlohmann::json j = nlohmann::json::parse(peer);
  const std::string model = j["model"].get<std::string>(), ours = base_name(rep.model_path);
  if (base_name(model) != ours)
    throw RunnerError("peer report '" + path + "' was measured on model '" + model +
                      "', this run evaluates '" + ours + "'");
  if (j.contains("ctx") && j["ctx"].get<std::int64_t>() != rep.ctx)
    throw RunnerError("peer report '" + path + "' used windows of " + j["ctx"].dump() +
                      " positions, this run " + std::to_string(rep.ctx) + " (give --ctx " +
                      j["ctx"].dump() + ")");
  if (j.contains("token_ids_count") &&
      j["token_ids_count"].get<std::int64_t>() != rep.token_ids_count)
    throw RunnerError("peer report '" + path + "' read " + j["token_ids_count"].dump() +
                      " token ids of the text, this run " + std::to_string(rep.token_ids_count) +
                      " (--max-tokens " + std::to_string(rep.tokens_scored) +
                      "; the peer's --max-tokens must match)");
  if (j.contains("token_ids_sha256") &&
      j["token_ids_sha256"].get<std::string>() != rep.token_ids_sha256)
    throw RunnerError("peer report '" + path + "' scored different token ids (token_ids_sha256 " +
                      j["token_ids_sha256"].get<std::string>() + ", this run " +
                      rep.token_ids_sha256 + "): another text or tokenizer");
  if (j.contains("tokens_scored") && j["tokens_scored"].get<std::int64_t>() != rep.tokens_scored)
    throw RunnerError("peer report '" + path + "' scored " + j["tokens_scored"].dump() +
                      " tokens, this run " + std::to_string(rep.tokens_scored));
  if (!j.contains("token_ids_sha256") || !j.contains("ctx"))
    std::fprintf(stderr,
                 "note: peer report '%s' does not name its %s: only its model file is checked "
                 "against this run\n",
                 path.c_str(),
                 !j.contains("ctx") ? "window length (ctx)" : "token ids (token_ids_sha256)");
  if (j.contains("chunk") && j["chunk"].get<std::int64_t>() != rep.chunk)
    std::fprintf(stderr,
                 "note: the peer ran forward passes of %s position(s), this run %d (stream "
                 "policies evict once per pass; --chunk %s runs ours the same way)\n",
                 j["chunk"].dump().c_str(), rep.chunk, j["chunk"].dump().c_str());
}

void print_peer_table(const EvalReport &rep, const std::string &peer, std::FILE *out) {
  const nlohmann::json j = nlohmann::json::parse(peer);
  const std::string windows = j.contains("windows") ? j["windows"].dump() : "?";
  std::fprintf(
      out,
      "\nside by side with %s (%s; %s window%s of ctx %s, %s tokens scored). Our rows against "
      "dense f32, the peer's against %s:\n\n",
      j.value("peer", std::string("peer")).c_str(), j.value("model", std::string("?")).c_str(),
      windows.c_str(), windows == "1" ? "" : "s", j.contains("ctx") ? j["ctx"].dump().c_str() : "?",
      j.contains("tokens_scored") ? j["tokens_scored"].dump().c_str() : "?",
      j.value("reference", std::string("its own reference")).c_str());
  struct Row {
    std::string name, protocol;
    double bits, bytes, memory, ppl, delta, kl, top1;
  };
  std::vector<Row> rows;
  for (const StrategyResult &r : rep.results)
    rows.push_back({r.strategy, "kvcache eval", r.effective_bits_per_element,
                    double(r.kv_bytes_per_token) * r.kept_fraction, r.memory_vs_f16, r.ppl,
                    r.ppl_delta_pct, r.kl_mean, r.top1_agreement});
  for (const auto &r : j["results"]) {
    const double kept = r.value("kept_fraction", 1.0), bits = r["bits_per_element"].get<double>();
    rows.push_back({r["strategy"].get<std::string>(), r.value("protocol", std::string("stream")),
                    bits * kept, r["kv_bytes_per_token"].get<double>() * kept,
                    r.value("memory_vs_f16", 16.0 / (bits * kept)), number_or_nan(r["ppl"]),
                    number_or_nan(r["ppl_delta_pct"]), number_or_nan(r["kl_mean"]),
                    r.value("top1_agreement", -1.0)});
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row &a, const Row &b) { return a.bits < b.bits; });
  std::vector<std::vector<std::string>> cells;
  cells.push_back({"strategy", "protocol", "eff. bits", "B/position", "mem vs f16", "ppl", "ppl Δ%",
                   "KL mean", "top-1"});
  char buf[64];
  auto num = [&](const char *fmt, double v) {
    if (!std::isfinite(v)) return std::string("-");
    std::snprintf(buf, sizeof buf, fmt, v);
    return std::string(buf);
  };
  for (const Row &r : rows)
    cells.push_back({r.name, r.protocol, num("%.2f", r.bits), num("%.0f", r.bytes),
                     num("%.2fx", r.memory), num("%.5f", r.ppl), num("%+.4f", r.delta),
                     num("%.3e", r.kl), r.top1 >= 0 ? num("%.4f", r.top1) : "-"});
  std::vector<std::size_t> widths(cells[0].size(), 0);
  for (const auto &row : cells)
    for (std::size_t c = 0; c < row.size(); ++c)
      widths[c] = std::max(widths[c], text_width(row[c]));
  std::size_t total = 0;
  for (std::size_t w : widths) total += w + 2;
  for (std::size_t k = 0; k < cells.size(); ++k) {
    std::string line;
    for (std::size_t c = 0; c < cells[k].size(); ++c)
      line += c < 2 ? pad_right(cells[k][c], widths[c]) + "  "
                    : pad_left(cells[k][c], widths[c]) + (c + 1 < cells[k].size() ? "  " : "");
    std::fprintf(out, "%s\n", line.c_str());
    if (k == 0) std::fprintf(out, "%s\n", std::string(total - 2, '-').c_str());
  }
  std::fprintf(
      out,
      "\neff. bits: bits per element x share of positions held; B/position: KV bytes per position "
      "of the window; mem vs f16: the dense f16 cache's bytes / the row's bytes held at the end of "
      "a window; protocol: how the peer's row ran (stream: every position decoded through the "
      "cache; prefill-compress: half the window prefilled and compressed once, the rest "
      "decoded); -: no finite value.\n");
}

std::string eval_json(const EvalReport &rep, const std::string &peer) {
  nlohmann::ordered_json j;
  j["model"] = rep.model;
  j["model_path"] = rep.model_path;
  j["tokenizer"] = rep.tokenizer_path;
  j["text"] = rep.text_path;
  if (!rep.codebook_fit_text.empty()) j["codebook_fit_text"] = rep.codebook_fit_text;
  j["ctx"] = rep.ctx;
  j["trained_context"] = rep.trained_context;
  j["chunk"] = rep.chunk;
  j["segment"] = rep.segment;
  j["windows"] = rep.windows;
  j["tokens_scored"] = rep.tokens_scored;
  j["token_ids_count"] = rep.token_ids_count;
  j["token_ids_sha256"] = rep.token_ids_sha256;
  j["geometry"] = {{"num_layers", rep.num_layers},
                   {"num_q_heads", rep.num_q_heads},
                   {"num_kv_heads", rep.num_kv_heads},
                   {"head_dim", rep.head_dim}};
  j["threads"] = rep.threads;
  j["wall_seconds"] = rep.wall_seconds;
  j["blas_core"] = kvc_runner::blas_core_name();
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (const StrategyResult &r : rep.results) {
    nlohmann::ordered_json o;
    o["strategy"] = r.strategy;
    o["reference"] = r.reference;
    o["bits_per_element"] = r.bits_per_element;
    o["kv_bytes_per_token"] = r.kv_bytes_per_token;
    o["peak_kv_bytes"] = r.peak_kv_bytes;
    o["compression_vs_f16"] = r.compression_vs_f16;
    o["memory_vs_f16"] = r.memory_vs_f16;
    o["peak_memory_vs_f16"] = r.peak_memory_vs_f16;
    o["ppl"] = r.ppl;
    o["ppl_delta_pct"] = r.ppl_delta_pct;
    o["kl_mean"] = r.kl_mean;
    o["top1_agreement"] = r.top1_agreement;
    o["ms_per_token"] = r.ms_per_token;
    o["kept_fraction"] = r.kept_fraction;
    o["effective_bits_per_element"] = r.effective_bits_per_element;
    o["mean_bits_per_element"] = r.mean_bits_per_element;
    // A segment without a scored target (a text shorter than the window) is null.
    nlohmann::ordered_json seg = nlohmann::ordered_json::array();
    for (double p : r.segment_ppl)
      seg.push_back(p > 0 ? nlohmann::ordered_json(p) : nlohmann::ordered_json());
    o["segment_ppl"] = seg;
    o["second_half_ppl"] = r.second_half_ppl > 0 ? nlohmann::ordered_json(r.second_half_ppl)
                                                 : nlohmann::ordered_json();
    results.push_back(o);
  }
  j["results"] = results;
  if (!peer.empty()) j["peer"] = nlohmann::ordered_json::parse(peer);
  if (rep.has_overhead) {
    j["overhead"] = {{"array_ms_per_token", rep.array_ms_per_token},
                     {"pool_f32_ms_per_token", rep.pool_f32_ms_per_token},
                     {"ratio", rep.pool_f32_ms_per_token / rep.array_ms_per_token}};
  }
  return j.dump(2);
}

}  // namespace kvc_cli
