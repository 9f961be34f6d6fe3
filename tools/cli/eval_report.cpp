// SPDX-License-Identifier: Apache-2.0
// `kvcache eval`, reporting: the strategy table (and --long's perplexity per
// segment), the JSON report, and a llama.cpp peer report read and printed
// beside our rows (--peer).
#include <algorithm>
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
  cells.push_back({"strategy", "bits/elem", "mean bits", "KV B/token", "kept", "peak KV", "vs f16",
                   "ppl", "ppl Δ%", "KL mean", "top-1", "ms/token"});
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
      "kept: K/V tokens held at the end of a full window over positions fed (eviction); "
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
                      "' has no results (expected bench/peers/llamacpp_kv.py --json output)");
  for (const auto &r : j["results"]) {
    for (const char *k :
         {"strategy", "bits_per_element", "kv_bytes_per_token", "ppl", "ppl_delta_pct", "kl_mean"})
      if (!r.contains(k))
        throw RunnerError("peer report '" + path + "': a result lacks '" + k + "'");
    if (!r["strategy"].is_string() || !r["bits_per_element"].is_number() || !r["ppl"].is_number() ||
        !r["ppl_delta_pct"].is_number() || !r["kl_mean"].is_number() ||
        !r["kv_bytes_per_token"].is_number())
      throw RunnerError("peer report '" + path + "': a result has a field of the wrong type");
  }
  return text;
}

void print_peer_table(const EvalReport &rep, const std::string &peer, std::FILE *out) {
  const nlohmann::json j = nlohmann::json::parse(peer);
  std::fprintf(
      out,
      "\nside by side with %s (%s; %s windows of ctx %s, %s tokens scored). Our rows against dense "
      "f32, the peer's against its own f16 K/V:\n\n",
      j.value("peer", std::string("peer")).c_str(), j.value("model", std::string("?")).c_str(),
      j.contains("windows") ? j["windows"].dump().c_str() : "?",
      j.contains("ctx") ? j["ctx"].dump().c_str() : "?",
      j.contains("tokens_scored") ? j["tokens_scored"].dump().c_str() : "?");
  struct Row {
    std::string name;
    double bits, bytes, ppl, delta, kl;
  };
  std::vector<Row> rows;
  for (const StrategyResult &r : rep.results)
    rows.push_back({r.strategy, r.effective_bits_per_element,
                    double(r.kv_bytes_per_token) * r.kept_fraction, r.ppl, r.ppl_delta_pct,
                    r.kl_mean});
  for (const auto &r : j["results"])
    rows.push_back({r["strategy"].get<std::string>(), r["bits_per_element"].get<double>(),
                    r["kv_bytes_per_token"].get<double>(), r["ppl"].get<double>(),
                    r["ppl_delta_pct"].get<double>(), r["kl_mean"].get<double>()});
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row &a, const Row &b) { return a.bits < b.bits; });
  std::size_t w = 8;
  for (const Row &r : rows) w = std::max(w, r.name.size());
  std::fprintf(out, "%-*s  %9s  %12s  %10s  %10s  %10s\n", static_cast<int>(w), "strategy",
               "eff. bits", "B/position", "ppl", "ppl Δ%", "KL mean");
  std::fprintf(out, "%s\n", std::string(w + 60, '-').c_str());
  for (const Row &r : rows)
    std::fprintf(out, "%-*s  %9.2f  %12.0f  %10.5f  %+10.4f  %10.3e\n", static_cast<int>(w),
                 r.name.c_str(), r.bits, r.bytes, r.ppl, r.delta, r.kl);
  std::fprintf(
      out,
      "\neff. bits: bits per element x share of positions held; B/position: KV bytes per position "
      "of the window.\n");
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
