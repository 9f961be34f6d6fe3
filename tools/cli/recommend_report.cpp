// SPDX-License-Identifier: Apache-2.0
// `kvcache recommend`, reporting: the recommendation as one JSON object or as
// text (the pick in detail with its headroom, a table of the rows around it,
// prefix caching and the block-size comparison).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "recommend_int.h"

namespace kvc_cli::recommend {

namespace {

using ojson = nlohmann::ordered_json;

/// How to ask for the prefix-caching assessment.
const char *const kPrefixHow =
    "give --prefix-share F (the share of each prompt that all requests share) and/or "
    "--prefix-tokens L, "
    "or --from-prefix FILE from `kvcache eval --prefix --json`";

/// One row of the JSON report.
ojson row_json(const Row &r) {
  ojson o;
  o["strategy"] = r.m.strategy;
  o["reference"] = r.m.reference;
  o["bits_per_element"] = r.m.bits_per_element;
  o["kept_fraction"] = r.kept;
  o["kept_fraction_source"] = r.kept_source;
  o["evicts"] = r.evicts;
  o["bytes_per_token"] = r.bytes_per_token;
  o["bytes_source"] = r.layout ? "pool layout" : "bits_per_element";
  o["tokens_held"] = r.tokens_held;
  o["bytes_per_sequence"] = r.bytes_per_seq;
  o["bytes_total"] = r.bytes_total;
  o["budget_share"] = r.budget_share;
  o["ppl_delta_pct"] = r.m.ppl_delta_pct;
  if (r.m.ppl) o["ppl"] = *r.m.ppl;
  if (r.m.kl_mean) o["kl_mean"] = *r.m.kl_mean;
  if (r.m.top1_agreement) o["top1_agreement"] = *r.m.top1_agreement;
  o["meets_floor"] = r.meets;
  o["fits"] = r.fits;
  if (r.cap_tokens) o["fixed_cap_tokens"] = r.cap_tokens;
  o["largest_batch_that_fits"] = r.largest_batch;
  o["largest_seq_len_that_fits"] = r.largest_seq_len;
  o["largest_batch_unbounded"] = r.batch_unbounded;
  o["largest_seq_len_unbounded"] = r.seq_len_unbounded;
  o["prefix_cache_ok"] = r.prefix_ok;
  return o;
}

/// The "prefix" object of the JSON report (prefix caching assessed).
ojson prefix_json(const PrefixInput &in, const PrefixAnalysis &a, const Target &t) {
  ojson p;
  p["assessed"] = true;
  p["source"] = in.source;
  if (in.source == "file") p["path"] = in.path;
  p["prefix_tokens"] = in.prefix_tokens;
  p["prompt_tokens"] = in.prompt_tokens;
  p["prompt_tokens_assumed"] = in.prompt_assumed;
  p["shared_prefix_share"] = in.share;
  p["block_size"] = in.block_size;
  p["strategy"] = a.subject ? ojson(a.subject->m.strategy) : ojson(nullptr);
  if (!a.subject_note.empty()) p["note"] = a.subject_note;
  p["reusable_tokens_per_request"] = a.reusable;
  p["lost_tokens_per_request"] = a.lost;
  p["memory_saved_bytes"] = a.memory_saved;
  p["bytes_total_with_sharing"] = a.total_with_sharing;
  p["fits_with_sharing"] = a.subject != nullptr && a.total_with_sharing <= t.memory;
  p["compute_saved_share_per_request"] = a.compute_per_request;
  p["compute_saved_share_batch"] = a.compute_batch;
  if (in.source == "file") {
    ojson m;
    m["block_size"] = in.m_block_size;
    m["requests"] = in.m_requests;
    m["tokens_computed_without_cache"] = in.m_without;
    m["tokens_computed_with_cache"] = in.m_with;
    m["compute_saved_share"] = 1.0 - double(in.m_with) / double(in.m_without);
    if (in.m_hit_rate) m["hit_rate_tokens"] = *in.m_hit_rate;
    if (in.m_ttft_without) m["ttft_ms_mean_without_cache"] = *in.m_ttft_without;
    if (in.m_ttft_with) m["ttft_ms_mean_with_cache"] = *in.m_ttft_with;
    if (in.m_speedup) m["ttft_speedup"] = *in.m_speedup;
    p["measured"] = m;
  }
  p["pays"] = a.pays;
  p["verdict"] = a.verdict;
  if (a.best_with_sharing) p["best_with_sharing"] = a.best_with_sharing->m.strategy;
  ojson opts = ojson::array();
  for (const BlockOption &o : a.options) {
    ojson x;
    x["block_size"] = o.block_size;
    x["valid"] = o.valid;
    if (!o.valid) x["invalid_reason"] = o.invalid_reason;
    x["reusable_tokens"] = o.reusable;
    x["lost_tokens"] = o.lost;
    x["block_table_bytes_per_sequence"] = o.table_bytes_per_seq;
    x["extra_saved_bytes"] = o.extra_saved;
    x["extra_block_table_bytes"] = o.extra_table;
    x["net_bytes"] = o.net;
    opts.push_back(x);
  }
  p["block_size_options"] = opts;
  p["recommended_block_size"] = a.recommended_block_size;
  p["block_size_verdict"] = a.block_verdict;
  return p;
}

// ---- text output ----------------------------------------------------------------

/// Columns of text: code points, not bytes (headers hold a 'Δ').
std::size_t text_width(const std::string &s) {
  std::size_t n = 0;
  for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
  return n;
}

/// A table with a rule under its header: the first column left, the others right.
void print_table(const std::vector<std::vector<std::string>> &cells, const std::string &indent) {
  std::vector<std::size_t> widths(cells[0].size(), 0);
  for (const auto &row : cells)
    for (std::size_t i = 0; i < row.size(); ++i)
      widths[i] = std::max(widths[i], text_width(row[i]));
  for (std::size_t k = 0; k < cells.size(); ++k) {
    std::string line = indent;
    for (std::size_t i = 0; i < cells[k].size(); ++i) {
      const std::string &s = cells[k][i];
      const std::string pad(widths[i] - text_width(s), ' ');
      line += i == 0 ? s + pad : "  " + pad + s;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::printf("%s\n", line.c_str());
    if (k == 0) {
      std::size_t total = 0;
      for (std::size_t w : widths) total += w + 2;
      std::printf("%s%s\n", indent.c_str(), std::string(total - 2, '-').c_str());
    }
  }
}

/// A share in percent, never rounded to 0.0% when it is not 0.
std::string share_text(double kept) {
  if (kept > 0.0 && kept < 0.0005) return fmt("%.2g%%", 100.0 * kept);
  return fmt("%.1f%%", 100.0 * kept);
}

/// The kept column: "all", or the share held and where it comes from.
std::string kept_text(const Row &r) {
  if (!r.evicts) return "all";
  std::string s = share_text(r.kept);
  if (r.cap_tokens)
    s += " (cap " + u(r.cap_tokens) + ")";
  else if (r.kept_source == "measured")
    s += " (measured)";
  else if (r.kept_source == "spec")
    s += " (spec)";
  return s;
}

/// One row of the text table; `mark` follows the strategy ("  <- pick").
std::vector<std::string> table_row(const Row &r, const std::string &mark) {
  return {r.m.strategy + mark,
          fmt("%.2f", r.m.bits_per_element),
          kept_text(r),
          u(r.bytes_per_token),
          human_bytes(static_cast<long double>(r.bytes_total)),
          fmt("%.1f%%", 100.0 * r.budget_share),
          fmt("%+.4f", r.m.ppl_delta_pct),
          r.meets ? "yes" : "no",
          r.fits ? "yes" : "no"};
}

/// The quality, layout, bytes and tokens held of `r` at the target, and whether it fits.
void print_row_detail(const Row &r, const Target &t) {
  std::printf("  ppl %+.4f%% against the dense reference (floor: at most %+.4f%%)",
              r.m.ppl_delta_pct, t.max_ppl_increase);
  if (r.m.kl_mean) std::printf(", KL %.3e", *r.m.kl_mean);
  if (r.m.top1_agreement) std::printf(", top-1 %.4f", *r.m.top1_agreement);
  std::printf("\n");
  if (r.layout) {
    const PoolSizes &l = *r.layout;
    std::printf(
        "  its pool at %u layers x %u KV heads x %u: blocks of %s tokens, %s bytes per block and "
        "layer",
        t.geometry.num_layers, t.geometry.num_kv_heads, t.geometry.head_dim,
        u(l.block_size).c_str(), u(l.block_bytes).c_str());
    if (l.residual_block_bytes)
      std::printf(", %s per residual (f16 staging) block", u(l.residual_block_bytes).c_str());
    std::printf(" (eval measured %.3f bits per element on its model)\n", r.m.bits_per_element);
    std::printf(
        "  one sequence takes up to %s bytes on its way to %s tokens (%s bytes per token held)\n",
        u(r.bytes_per_seq).c_str(), u(t.seq_len).c_str(), u(r.bytes_per_token).c_str());
  } else {
    std::printf(
        "  %.3f bits per element: %s bytes per token (%.3f x 2 x %u layers x %u KV heads x %u / 8; "
        "the "
        "pool's layout is unknown: %s)\n",
        r.m.bits_per_element, u(r.bytes_per_token).c_str(), r.m.bits_per_element,
        t.geometry.num_layers, t.geometry.num_kv_heads, t.geometry.head_dim,
        r.layout_refusal.c_str());
  }
  if (r.cap_tokens) {
    std::printf(
        "  holds at most %s tokens (a fixed cap of %s tokens from its spec, whatever the length): "
        "%s of %s "
        "tokens held per sequence (%s)\n",
        u(r.cap_tokens).c_str(), u(r.cap_tokens).c_str(), u(r.tokens_held).c_str(),
        u(t.seq_len).c_str(), share_text(r.kept).c_str());
  } else if (r.evicts) {
    std::printf("  keeps %s of the tokens (%s): %s of %s tokens held per sequence%s\n",
                share_text(r.kept).c_str(),
                r.kept_source == "measured" ? "kept_fraction measured by eval" : "from its spec",
                u(r.tokens_held).c_str(), u(t.seq_len).c_str(),
                r.kept * double(t.seq_len) < 1.0 ? " (at least one token is held)" : "");
  }
  std::printf("  %s bytes per sequence x batch %s = %s: %.1f%% of the budget of %s: %s\n",
              u(r.bytes_per_seq).c_str(), u(t.batch).c_str(), bytes_text(r.bytes_total).c_str(),
              100.0 * r.budget_share, human_bytes(static_cast<long double>(t.memory)).c_str(),
              r.fits ? "fits" : "DOES NOT FIT");
}

/// The largest batch and seq-len of `r` that fit the budget (or what would have to give).
void print_headroom(const Row &r, const Target &t) {
  const std::string batch = "batch " + u(r.largest_batch) + (r.batch_unbounded ? " or more" : "");
  std::string seq_len;
  if (r.seq_len_unbounded && r.cap_tokens) {
    seq_len = "any seq-len at batch " + u(t.batch) + " (it never holds more than " +
              u(r.cap_tokens) + " tokens)";
  } else if (r.seq_len_unbounded) {
    seq_len = "seq-len " + u(kMaxSeqLen) + " or more at batch " + u(t.batch);
  } else if (r.largest_seq_len == 0) {
    seq_len = "not even one token per sequence at batch " + u(t.batch);
  } else {
    seq_len =
        "seq-len " + u(r.largest_seq_len) + (r.fits ? "" : " at most") + " at batch " + u(t.batch);
  }
  if (r.fits) {
    std::printf("  headroom: up to %s at seq-len %s, or %s\n", batch.c_str(), u(t.seq_len).c_str(),
                seq_len.c_str());
  } else if (r.largest_batch > 0) {
    std::printf("  to fit: %s at most at seq-len %s, or %s\n", batch.c_str(), u(t.seq_len).c_str(),
                seq_len.c_str());
  } else {
    std::printf("  to fit: not even one sequence of %s tokens fits; %s\n", u(t.seq_len).c_str(),
                seq_len.c_str());
  }
}

}  // namespace

void print_json_report(const Target &t, const Measurements &m, const Choice &c,
                       const PrefixInput &prefix, const PrefixAnalysis &pa) {
  const std::vector<Row> &rows = c.rows;
  const Row *pick = c.pick, *closest = c.closest;
  const std::optional<Row> &reference = c.reference;
  const std::vector<const Row *> &order = c.order;
  ojson j;
  j["verdict"] = pick ? "recommend" : "nothing_meets_floor";
  ojson tj;
  tj["model"] = t.geometry.name;
  tj["description"] = t.geometry.description;
  tj["num_layers"] = t.geometry.num_layers;
  tj["num_kv_heads"] = t.geometry.num_kv_heads;
  tj["head_dim"] = t.geometry.head_dim;
  tj["elements_per_token"] = t.elements_per_token;
  tj["seq_len"] = t.seq_len;
  tj["batch"] = t.batch;
  tj["memory_bytes"] = t.memory;
  tj["max_ppl_increase_pct"] = t.max_ppl_increase;
  j["target"] = tj;
  ojson mj;
  mj["source"] = m.source;
  if (m.source == "file") mj["path"] = m.path;
  mj["model"] = m.model;
  if (m.ctx) mj["ctx"] = *m.ctx;
  if (m.tokens_scored) mj["tokens_scored"] = *m.tokens_scored;
  if (m.num_layers && m.num_kv_heads && m.head_dim)
    mj["geometry"] = {{"num_layers", *m.num_layers},
                      {"num_kv_heads", *m.num_kv_heads},
                      {"head_dim", *m.head_dim}};
  mj["strategies"] = rows.size();
  j["measurements"] = mj;
  j["pick"] = pick ? row_json(*pick) : ojson(nullptr);
  j["fits"] = pick ? ojson(pick->fits) : ojson(nullptr);
  j["closest"] = closest ? row_json(*closest) : ojson(nullptr);
  j["reference"] = row_json(*reference);
  ojson all = ojson::array();
  for (const Row *r : order) all.push_back(row_json(*r));
  j["rows"] = all;
  if (prefix.given) {
    j["prefix"] = prefix_json(prefix, pa, t);
  } else {
    j["prefix"] = {{"assessed", false}, {"how", kPrefixHow}};
  }
  std::printf("%s\n", j.dump(2).c_str());
}

void print_text_report(const Target &t, const Measurements &m, const Choice &c,
                       const PrefixInput &prefix, const PrefixAnalysis &pa) {
  const std::vector<Row> &rows = c.rows;
  const Row *pick = c.pick, *closest = c.closest;
  const std::optional<Row> &reference = c.reference;
  const std::vector<const Row *> &order = c.order;
  const Geometry &g = t.geometry;
  std::printf("target    %s (%s): %u layers, %u KV heads, head_dim %u\n", g.name.c_str(),
              g.description.c_str(), g.num_layers, g.num_kv_heads, g.head_dim);
  std::printf(
      "          seq-len %s x batch %s, memory budget %s, quality floor: ppl at most %+.4f%%\n",
      u(t.seq_len).c_str(), u(t.batch).c_str(), bytes_text(t.memory).c_str(), t.max_ppl_increase);
  std::printf("measured  %s", m.source == "file" ? m.path.c_str() : "an eval run just now");
  if (!m.model.empty()) std::printf(": %s", m.model.c_str());
  if (m.num_layers && m.num_kv_heads && m.head_dim)
    std::printf(" (%lld layers, %lld KV heads, head_dim %lld)",
                static_cast<long long>(*m.num_layers), static_cast<long long>(*m.num_kv_heads),
                static_cast<long long>(*m.head_dim));
  if (m.ctx) std::printf(", ctx %lld", static_cast<long long>(*m.ctx));
  if (m.tokens_scored)
    std::printf(", %lld tokens scored", static_cast<long long>(*m.tokens_scored));
  std::printf(", %zu strategies\n\n", rows.size());

  if (pick) {
    std::printf("recommendation: %s\n", pick->m.strategy.c_str());
    print_row_detail(*pick, t);
    print_headroom(*pick, t);
    if (!pick->fits) {
      std::printf("  no strategy that meets the floor fits: this is the smallest one\n");
    }
    if (pick->evicts && pick->tokens_held < t.seq_len && m.ctx &&
        static_cast<std::uint64_t>(*m.ctx) < t.seq_len) {
      std::printf(
          "  note: its quality was measured on windows of %lld tokens; at %s tokens it %s but "
          "drops %s tokens "
          "per sequence (not measured)\n",
          static_cast<long long>(*m.ctx), u(t.seq_len).c_str(),
          pick->cap_tokens ? ("holds the same " + u(pick->cap_tokens) + " tokens").c_str()
                           : "keeps the same share",
          u(t.seq_len - pick->tokens_held).c_str());
    }
    // Staged tokens (a residual window, a per-channel group waiting) are read exactly: in short
    // windows they are a larger share of the cache than at a longer seq-len. (A hybrid share
    // stays the same share at any length.) The note names the spec's parameters.
    const PoolSizes *l = pick->layout ? &*pick->layout : nullptr;
    if (l && l->residual_block_bytes && l->fraction == 0.0 && (l->window > 1 || l->group > 1) &&
        m.ctx && static_cast<std::uint64_t>(*m.ctx) < t.seq_len) {
      std::string what;
      if (l->window) what = "a residual window of " + u(l->window) + " tokens";
      if (l->group > 1)
        what += (what.empty() ? "" : " and ") + std::string("a per-channel group of up to ") +
                u(l->group) + " tokens being filled";
      std::printf(
          "  note: its newest tokens (%s) wait in f16 and are read without error; in the "
          "eval's windows of %lld tokens they are a larger share of the cache than at %s "
          "tokens, where its loss may be larger than measured\n",
          what.c_str(), static_cast<long long>(*m.ctx), u(t.seq_len).c_str());
    }
  } else {
    std::printf(
        "no strategy meets the floor: the smallest ppl increase measured is %+.4f%% (%s), above "
        "%+.4f%%\n",
        closest->m.ppl_delta_pct, closest->m.strategy.c_str(), t.max_ppl_increase);
    std::printf("closest: %s\n", closest->m.strategy.c_str());
    print_row_detail(*closest, t);
    std::printf("the dense reference (%s) meets any floor: %s, %s\n", reference->m.strategy.c_str(),
                bytes_text(reference->bytes_total).c_str(),
                reference->fits ? "fits" : "does not fit");
  }

  // The pick, every cheaper row (they miss the floor) and up to three runners-up.
  std::vector<std::vector<std::string>> cells;
  cells.push_back({"strategy", "bits/elem", "kept", "B/token",
                   "total at " + u(t.seq_len) + " x " + u(t.batch), "of budget", "ppl Δ%", "floor",
                   "fits"});
  int runners_up = 0;
  std::size_t shown = 0;
  for (const Row *r : order) {
    const bool after_pick = pick && cheaper(pick, r);
    if (after_pick && r->meets && runners_up >= 3) continue;
    if (after_pick && !r->meets) continue;
    if (after_pick) ++runners_up;
    cells.push_back(table_row(*r, r == pick ? "  <- pick" : r == closest ? "  <- closest" : ""));
    ++shown;
  }
  cells.push_back(table_row(*reference, "  (reference)"));
  std::printf("\n");
  print_table(cells, "");
  if (shown < order.size()) {
    const std::size_t more = order.size() - shown;
    std::printf("(%zu more row%s cost%s more than the runners-up; --json lists every row)\n", more,
                more == 1 ? "" : "s", more == 1 ? "s" : "");
  }
  std::printf(
      "bits/elem: measured by eval on its model; B/token: the most one sequence holds on its way "
      "to seq-len, "
      "in whole blocks of its pool at %u x %u x %u (codes, scales, f16 staging), over the tokens "
      "held; total = "
      "batch x that; kept: tokens held / seq-len\n",
      g.num_layers, g.num_kv_heads, g.head_dim);
  for (const Row *r : order)
    if (!r->layout)
      std::printf(
          "  %s: %s; its bits per element carry over (bits x 2 x %u x %u x %u / 8 per token "
          "held)\n",
          r->m.strategy.c_str(), r->layout_refusal.c_str(), g.num_layers, g.num_kv_heads,
          g.head_dim);

  std::printf("\n");
  if (!prefix.given) {
    std::printf("prefix caching: not assessed (%s)\n", kPrefixHow);
    return;
  }
  std::printf(
      "prefix caching (%s): shared prefix %s of %s%s prompt tokens (%.1f%%), block size %s\n",
      prefix.source == "file" ? ("measured in " + prefix.path).c_str() : "from the flags",
      u(prefix.prefix_tokens).c_str(), u(prefix.prompt_tokens).c_str(),
      prefix.prompt_assumed ? " (the prompt taken as the whole --seq-len)" : "",
      100.0 * prefix.share, u(prefix.block_size).c_str());
  if (prefix.source == "file") {
    std::printf(
        "  measured at block size %s over %s requests: %s of %s prompt tokens computed (%.1f%% not "
        "recomputed)",
        u(prefix.m_block_size).c_str(), u(prefix.m_requests).c_str(), u(prefix.m_with).c_str(),
        u(prefix.m_without).c_str(),
        100.0 * (1.0 - double(prefix.m_with) / double(prefix.m_without)));
    if (prefix.m_speedup) std::printf(", time to first token %.2fx faster", *prefix.m_speedup);
    std::printf("\n");
  }
  if (!pa.subject_note.empty()) std::printf("  %s\n", pa.subject_note.c_str());
  std::printf("  %s\n", pa.verdict.c_str());
  if (pa.subject && pa.memory_shared) {
    std::printf("  %s with the prefix shared: %s, %.1f%% of the budget: %s\n",
                pa.subject->m.strategy.c_str(), bytes_text(pa.total_with_sharing).c_str(),
                100.0 * double(pa.total_with_sharing) / double(t.memory),
                pa.total_with_sharing <= t.memory ? "fits" : "does not fit");
  }
  if (pick && pa.subject && pa.subject != pick) {
    const std::uint64_t with = pa.total_with_sharing;
    const std::string pick_bytes = human_bytes(static_cast<long double>(pick->bytes_total));
    const std::string with_bytes = human_bytes(static_cast<long double>(with));
    if (pick->bytes_total <= with) {
      std::printf(
          "  %s without prefix sharing still needs less memory (%s) than %s with it (%s): using it "
          "for "
          "the prefix cache trades memory for prefill compute\n",
          pick->m.strategy.c_str(), pick_bytes.c_str(), pa.subject->m.strategy.c_str(),
          with_bytes.c_str());
    } else {
      std::printf("  %s with the prefix shared needs less memory (%s) than %s without it (%s)\n",
                  pa.subject->m.strategy.c_str(), with_bytes.c_str(), pick->m.strategy.c_str(),
                  pick_bytes.c_str());
    }
  }
  if (pick && pa.best_with_sharing && pa.best_with_sharing != pick) {
    // Against the pick with the prefix shared too, when its codec takes this block size.
    const std::uint64_t B = prefix.block_size,
                        best = with_sharing(*pa.best_with_sharing, prefix, t, B);
    const std::uint64_t pick_cost =
        codec_takes_block(*pick, B) ? with_sharing(*pick, prefix, t, B) : pick->bytes_total;
    if (best < pick_cost)
      std::printf("  with the prefix shared, %s needs less than the pick: %s (the pick: %s)\n",
                  pa.best_with_sharing->m.strategy.c_str(), bytes_text(best).c_str(),
                  bytes_text(pick_cost).c_str());
  }
  if (!pa.options.empty()) {
    std::vector<std::vector<std::string>> bc;
    bc.push_back({"block size", "reusable", "lost", "block table/seq",
                  "sharing vs " + u(prefix.block_size), "tables vs " + u(prefix.block_size),
                  "net"});
    for (const BlockOption &b : pa.options) {
      bc.push_back({u(b.block_size) + (b.valid ? "" : " (not possible)"), u(b.reusable), u(b.lost),
                    u(b.table_bytes_per_seq), fmt("%+.0f", double(b.extra_saved)),
                    fmt("%+.0f", double(b.extra_table)), fmt("%+.0f", double(b.net))});
    }
    print_table(bc, "  ");
    for (const BlockOption &b : pa.options)
      if (!b.valid)
        std::printf("  block size %s: %s\n", u(b.block_size).c_str(), b.invalid_reason.c_str());
    std::printf(
        "  (per request: tokens of the prefix; block table: ceil(%s / block) x %u layers x %llu "
        "bytes; "
        "bytes across the batch of %s)\n",
        u(t.seq_len).c_str(), g.num_layers, static_cast<unsigned long long>(kBlockTableEntryBytes),
        u(t.batch).c_str());
  }
  if (pa.subject && pa.subject != (pick ? pick : &*reference))
    std::printf("  for %s: %s\n", pa.subject->m.strategy.c_str(), pa.block_verdict.c_str());
  else
    std::printf("  %s\n", pa.block_verdict.c_str());
}

}  // namespace kvc_cli::recommend
