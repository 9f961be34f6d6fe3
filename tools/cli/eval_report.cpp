// SPDX-License-Identifier: Apache-2.0
// `kvcache eval`, reporting: the strategy table (and --long's perplexity per
// segment), the JSON report, and a llama.cpp peer report read and printed
// beside our rows (--peer).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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

}  // namespace

std::string read_peer_report(const std::string &path) {
  const std::string text = read_text_file(path, "peer report");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception &e) {
    throw RunnerError("peer report '" + path + "' is not JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("results") || !j["results"].is_array() || j["results"].empty())
    throw RunnerError("peer report '" + path +
                      "' has no results (expected the --json output of bench/peers/llamacpp_kv.py "
                      "or bench/peers/hf_caches.py)");
  if (!j.contains("model") || !j["model"].is_string())
    throw RunnerError("peer report '" + path + "' lacks 'model' (the model file it ran)");
  for (const char *k : {"token_ids_sha256"})
    if (j.contains(k) && !j[k].is_string())
      throw RunnerError("peer report '" + path + "': '" + k + "' is not a string");
  for (const char *k : {"token_ids_count", "ctx"})
    if (j.contains(k) && !j[k].is_number_integer())
      throw RunnerError("peer report '" + path + "': '" + k + "' is not an integer");
  std::size_t i = 0;
  for (const auto &r : j["results"]) {
    const std::string row = "peer report '" + path + "': result " + std::to_string(i++);
    if (!r.is_object()) throw RunnerError(row + " is not an object");
    for (const char *k :
         {"strategy", "bits_per_element", "kv_bytes_per_token", "ppl", "ppl_delta_pct", "kl_mean"})
      if (!r.contains(k)) throw RunnerError(row + " lacks '" + k + "'");
    if (!r["strategy"].is_string()) throw RunnerError(row + ": 'strategy' is not a string");
    // Quality may be null: a peer whose logits were not finite (the row says why in "note").
    for (const char *k :
         {"bits_per_element", "kv_bytes_per_token", "ppl", "ppl_delta_pct", "kl_mean",
          "kept_fraction", "memory_vs_f16", "top1_agreement", "ms_per_token"}) {
      const bool nullable = std::strcmp(k, "ppl") == 0 || std::strcmp(k, "ppl_delta_pct") == 0 ||
                            std::strcmp(k, "kl_mean") == 0;
      if (r.contains(k) && !r[k].is_number() && !(nullable && r[k].is_null()))
        throw RunnerError(row + " ('" + r["strategy"].get<std::string>() + "'): '" + k +
                          "' is not a number");
    }
    if (r.contains("kept_fraction") &&
        !(r["kept_fraction"].get<double>() > 0 && r["kept_fraction"].get<double>() <= 1))
      throw RunnerError(row + " ('" + r["strategy"].get<std::string>() +
                        "'): 'kept_fraction' must be in (0, 1]");
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
}

void print_peer_table(const EvalReport &rep, const std::string &peer, std::FILE *out) {
  const nlohmann::json j = nlohmann::json::parse(peer);
  std::fprintf(
      out,
      "\nside by side with %s (%s; %s windows of ctx %s, %s tokens scored). Our rows against dense "
      "f32, the peer's against %s:\n\n",
      j.value("peer", std::string("peer")).c_str(), j.value("model", std::string("?")).c_str(),
      j.contains("windows") ? j["windows"].dump().c_str() : "?",
      j.contains("ctx") ? j["ctx"].dump().c_str() : "?",
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
                    r.value("memory_vs_f16", bits > 0 ? 16.0 / (bits * kept) : 0.0),
                    number_or_nan(r["ppl"]), number_or_nan(r["ppl_delta_pct"]),
                    number_or_nan(r["kl_mean"]), r.value("top1_agreement", -1.0)});
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row &a, const Row &b) { return a.bits < b.bits; });
  std::size_t w = 8, wp = 8;
  for (const Row &r : rows) {
    w = std::max(w, r.name.size());
    wp = std::max(wp, r.protocol.size());
  }
  std::fprintf(out, "%-*s  %-*s  %9s  %12s  %10s  %10s  %10s  %10s  %7s\n", static_cast<int>(w),
               "strategy", static_cast<int>(wp), "protocol", "eff. bits", "B/position",
               "mem vs f16", "ppl", "ppl Δ%", "KL mean", "top-1");
  std::fprintf(out, "%s\n", std::string(w + wp + 90, '-').c_str());
  for (const Row &r : rows) {
    char top1[32];
    if (r.top1 >= 0)
      std::snprintf(top1, sizeof top1, "%7.4f", r.top1);
    else
      std::snprintf(top1, sizeof top1, "%7s", "-");
    std::fprintf(out, "%-*s  %-*s  %9.2f  %12.0f  %9.2fx  %10.5f  %+10.4f  %10.3e  %s\n",
                 static_cast<int>(w), r.name.c_str(), static_cast<int>(wp), r.protocol.c_str(),
                 r.bits, r.bytes, r.memory, r.ppl, r.delta, r.kl, top1);
  }
  std::fprintf(
      out,
      "\neff. bits: bits per element x share of positions held; B/position: KV bytes per position "
      "of the window; mem vs f16: the dense f16 cache's bytes / the row's bytes held at the end of "
      "a window; protocol: how the peer's row ran (stream: every position decoded through the "
      "cache; prefill-compress: half the window prefilled and compressed once, the rest "
      "decoded).\n");
}

std::string eval_json(const EvalReport &rep, const std::string &peer) {
  nlohmann::ordered_json j;
  j["model"] = rep.model;
  j["model_path"] = rep.model_path;
  j["tokenizer"] = rep.tokenizer_path;
  j["text"] = rep.text_path;
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
