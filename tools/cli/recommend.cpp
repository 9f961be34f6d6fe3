// SPDX-License-Identifier: Apache-2.0
#include "recommend.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "../runner/error.h"
#include "eval.h"
#include "memory.h"
#include "seq_bytes.h"
#include "strategy.h"

namespace kvc_cli {
using kvc_runner::RunnerError;

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

/// One block id (int32) per block of a sequence and per layer.
constexpr std::uint64_t kBlockTableEntryBytes = 4;
/// Largest byte count handled (sizes are signed in differences).
constexpr std::uint64_t kMaxBytes = std::uint64_t(1) << 63;
/// The largest --seq-len and --batch accepted; headroom is not searched beyond them.
constexpr std::uint64_t kMaxSeqLen = std::uint64_t(1) << 40;
constexpr std::uint64_t kMaxBatch = std::uint64_t(1) << 30;

std::uint64_t mul(std::uint64_t a, std::uint64_t b, const std::string &what) {
  if (a != 0 && b > kMaxBytes / a) throw RunnerError(what + " exceeds 2^63: the target is too large");
  return a * b;
}

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return a / b + (a % b != 0); }

std::string fmt(const char *format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string bytes_text(std::uint64_t b) {
  return human_bytes(static_cast<long double>(b)) + " (" + std::to_string(b) + " bytes)";
}

std::string u(std::uint64_t v) { return std::to_string(v); }

/// A number option as typed: the whole text must be a finite decimal number.
double typed_number(const TypedOption &o, const std::string &flag, const std::string &expect) {
  const std::string &s = o.text;
  const std::string as_typed = flag + " '" + s + "'";
  const char *first = s.data(), *last = s.data() + s.size();
  if (first != last && *first == '+') ++first;  // from_chars takes no '+'
  double v = 0;
  const auto [end, ec] = std::from_chars(first, last, v);
  if (s.empty() || ec == std::errc::invalid_argument || end != last)
    throw RunnerError(as_typed + " is not a number (" + expect + ")");
  if (ec == std::errc::result_out_of_range)
    throw RunnerError(as_typed + " is out of the range of a double (" + expect + ")");
  if (!std::isfinite(v)) throw RunnerError(as_typed + " is not a finite number (" + expect + ")");
  return v;
}

// ---- measurements --------------------------------------------------------------

struct EvalRow {
  std::string strategy;
  bool reference = false;
  double bits_per_element = 0;
  double ppl_delta_pct = 0;
  std::optional<double> kept_fraction, ppl, kl_mean, top1_agreement;
};

struct Measurements {
  std::string source;  ///< "file" or "eval"
  std::string path;    ///< the file (source "file")
  std::string model;
  std::optional<std::int64_t> ctx, tokens_scored;
  std::optional<std::int64_t> num_layers, num_kv_heads, head_dim;
  std::vector<EvalRow> rows;
};

std::optional<double> opt_number(const json &o, const char *key, const std::string &where) {
  if (!o.contains(key)) return std::nullopt;
  const json &v = o[key];
  if (!v.is_number()) throw RunnerError(where + "field '" + key + "' is not a number");
  const double d = v.get<double>();
  if (!std::isfinite(d)) throw RunnerError(where + "field '" + key + "' is not finite");
  return d;
}

double req_number(const json &o, const char *key, const std::string &where) {
  const std::optional<double> v = opt_number(o, key, where);
  if (!v) throw RunnerError(where + "misses the required field '" + key + "'");
  return *v;
}

std::optional<std::int64_t> opt_integer(const json &o, const char *key, const std::string &where) {
  if (!o.contains(key)) return std::nullopt;
  const json &v = o[key];
  if (!v.is_number_integer()) throw RunnerError(where + "field '" + key + "' is not an integer");
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
    throw RunnerError(where + "field '" + key + "' is out of range (" + v.dump() + " > 2^63 - 1)");
  return v.get<std::int64_t>();
}

std::int64_t req_integer(const json &o, const char *key, const std::string &where) {
  const std::optional<std::int64_t> v = opt_integer(o, key, where);
  if (!v) throw RunnerError(where + "misses the required field '" + key + "'");
  return *v;
}

const json &req_object(const json &o, const char *key, const std::string &where) {
  if (!o.contains(key)) throw RunnerError(where + "misses the required field '" + key + "'");
  if (!o[key].is_object()) throw RunnerError(where + "field '" + key + "' is not an object");
  return o[key];
}

json read_json_file(const std::string &path, const std::string &what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw RunnerError(what + " '" + path + "' is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw RunnerError("cannot open " + what + " '" + path + "'");
  std::string text;
  try {
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::exception &e) {
    throw RunnerError("cannot read " + what + " '" + path + "': " + e.what());
  }
  if (in.bad()) throw RunnerError("cannot read " + what + " '" + path + "'");
  try {
    return json::parse(text);
  } catch (const json::parse_error &e) {
    throw RunnerError(what + " '" + path + "' is not JSON: " + e.what());
  } catch (const json::out_of_range &e) {
    throw RunnerError(what + " '" + path + "' holds a number out of range (a double holds at most about 1.8e308): " +
                      e.what());
  } catch (const json::exception &e) {
    throw RunnerError(what + " '" + path + "' cannot be read as JSON: " + e.what());
  }
}

/// Every number in `v` (a row, nested arrays and objects included) must be finite.
void check_finite(const json &v, const std::string &name, const std::string &where) {
  if (v.is_number_float() && !std::isfinite(v.get<double>()))
    throw RunnerError(where + "field '" + name + "' is not finite");
  if (v.is_object())
    for (auto it = v.begin(); it != v.end(); ++it)
      check_finite(it.value(), name.empty() ? it.key() : name + "." + it.key(), where);
  if (v.is_array())
    for (std::size_t i = 0; i < v.size(); ++i) check_finite(v[i], name + "[" + std::to_string(i) + "]", where);
}

/// Reads an `eval --json` report; fields not named here are ignored.
Measurements load_eval(const json &j, const std::string &where) {
  if (!j.is_object()) throw RunnerError(where + "is not a JSON object");
  Measurements m;
  if (j.contains("model") && j["model"].is_string()) m.model = j["model"].get<std::string>();
  m.ctx = opt_integer(j, "ctx", where);
  m.tokens_scored = opt_integer(j, "tokens_scored", where);
  if (m.ctx && *m.ctx < 1) throw RunnerError(where + "ctx " + std::to_string(*m.ctx) + " must be >= 1");
  if (m.tokens_scored && *m.tokens_scored < 1)
    throw RunnerError(where + "tokens_scored " + std::to_string(*m.tokens_scored) + " must be >= 1");
  if (j.contains("geometry")) {
    const json &g = req_object(j, "geometry", where);
    m.num_layers = opt_integer(g, "num_layers", where + "geometry: ");
    m.num_kv_heads = opt_integer(g, "num_kv_heads", where + "geometry: ");
    m.head_dim = opt_integer(g, "head_dim", where + "geometry: ");
  }
  if (!j.contains("results")) {
    throw RunnerError(where + "misses the required field 'results' (is it a `kvcache eval --json` report?)");
  }
  const json &results = j["results"];
  if (!results.is_array()) throw RunnerError(where + "field 'results' is not an array");
  if (results.empty()) throw RunnerError(where + "has no results (an empty 'results' array)");
  int references = 0;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const json &r = results[i];
    std::string at = where + "results[" + std::to_string(i) + "]: ";
    if (!r.is_object()) throw RunnerError(at + "is not an object");
    if (!r.contains("strategy")) throw RunnerError(at + "misses the required field 'strategy'");
    if (!r["strategy"].is_string() || r["strategy"].get<std::string>().empty())
      throw RunnerError(at + "field 'strategy' is not a non-empty string");
    EvalRow row;
    row.strategy = r["strategy"].get<std::string>();
    at = where + "result '" + row.strategy + "': ";
    check_finite(r, "", at);
    if (r.contains("reference")) {
      if (!r["reference"].is_boolean()) throw RunnerError(at + "field 'reference' is not true or false");
      row.reference = r["reference"].get<bool>();
    }
    row.bits_per_element = req_number(r, "bits_per_element", at);
    if (!(row.bits_per_element > 0.0)) throw RunnerError(at + "bits_per_element must be > 0");
    row.ppl_delta_pct = req_number(r, "ppl_delta_pct", at);
    row.kept_fraction = opt_number(r, "kept_fraction", at);
    if (row.kept_fraction && !(*row.kept_fraction > 0.0 && *row.kept_fraction <= 1.0))
      throw RunnerError(at + "kept_fraction must be in (0, 1]");
    row.ppl = opt_number(r, "ppl", at);
    row.kl_mean = opt_number(r, "kl_mean", at);
    row.top1_agreement = opt_number(r, "top1_agreement", at);
    if (row.reference) {
      // Every ppl_delta_pct and kl_mean is measured against this row: its own are 0 by definition.
      if (row.ppl_delta_pct != 0.0)
        throw RunnerError(at + "the reference row has ppl_delta_pct " + fmt("%g", row.ppl_delta_pct) +
                          " (expected 0: every ppl_delta_pct is measured against it)");
      if (row.kl_mean && *row.kl_mean != 0.0)
        throw RunnerError(at + "the reference row has kl_mean " + fmt("%g", *row.kl_mean) +
                          " (expected 0: every kl_mean is measured against it)");
    }
    references += row.reference ? 1 : 0;
    m.rows.push_back(row);
  }
  if (references == 0) {
    throw RunnerError(where + "has no reference row (a result with \"reference\": true, the dense cache "
                              "every ppl_delta_pct is measured against)");
  }
  if (references > 1) throw RunnerError(where + "has " + std::to_string(references) + " reference rows (expected one)");
  if (m.rows.size() == 1) throw RunnerError(where + "holds only the reference row: no strategy to choose from");
  return m;
}

// ---- one strategy scaled to the target ------------------------------------------

struct Target {
  Geometry geometry;
  std::uint64_t elements_per_token = 0;  ///< 2 (K, V) x layers x KV heads x head_dim
  std::uint64_t seq_len = 0, batch = 0, memory = 0;
  double max_ppl_increase = 0;
};

struct Row {
  EvalRow m;
  bool evicts = false;
  double kept = 1.0;               ///< the share held at seq_len
  std::uint64_t cap_tokens = 0;    ///< a fixed cap (tokens=N in its spec): min(N, length) held, whatever the length
  std::string kept_source;  ///< "measured", "spec", "no eviction"
  bool prefix_ok = true;    ///< the pool can share its blocks through the prefix cache
  std::string prefix_refusal;
  std::uint32_t channel_group = 0;  ///< keys per channel over G tokens: blocks hold a multiple of G
  std::uint64_t bytes_per_token = 0;  ///< bytes_per_seq / tokens_held, rounded up
  std::uint64_t tokens_held = 0;  ///< per sequence of seq_len tokens
  std::uint64_t bytes_per_seq = 0;  ///< the most one sequence holds on its way to seq_len tokens
  std::uint64_t bytes_total = 0;  ///< batch x bytes_per_seq
  /// The pool's layout at the target geometry (from the library); without it
  /// (a spec this build cannot read, or a pool the library refuses) the
  /// measured bits per element carry over: carried_bytes_per_token per token held.
  std::optional<SeqBytes> layout;
  std::string layout_refusal;
  std::uint64_t carried_bytes_per_token = 0;
  double budget_share = 0;
  bool meets = false, fits = false;
  std::uint64_t largest_batch = 0, largest_seq_len = 0;
  bool batch_unbounded = false;    ///< even batch kMaxBatch fits (largest_batch is clamped to it)
  bool seq_len_unbounded = false;  ///< even seq-len kMaxSeqLen fits (largest_seq_len is clamped to it)

  /// Tokens held per sequence of n tokens: a fixed cap holds min(cap, n); a share holds
  /// ceil(kept x n), at least one token of a non-empty sequence.
  std::uint64_t held(std::uint64_t n) const {
    if (cap_tokens) return std::min(cap_tokens, n);
    if (kept >= 1.0 || n == 0) return n;
    const double t = std::ceil(kept * static_cast<double>(n) - 1e-9);
    if (!(t >= 1.0)) return 1;
    return t >= static_cast<double>(n) ? n : static_cast<std::uint64_t>(t);
  }
  /// Bytes one sequence needs to reach n tokens: the most its pool holds on the
  /// way (staged groups are released as they are encoded, so a length can hold
  /// less than a shorter one). Never decreases with n.
  std::uint64_t seq_bytes_at(std::uint64_t n) const {
    if (!layout) {  // saturating like SeqBytes: the headroom search asks about lengths far beyond seq_len
      std::uint64_t b;
      return __builtin_mul_overflow(held(n), carried_bytes_per_token, &b) ? UINT64_MAX : b;
    }
    // held(n) is n without eviction. Evicting pools have no residual (their peak is whole
    // blocks of the held tokens); peak() keeps the size monotone even for a crafted
    // kept_fraction on a pool that stages.
    return layout->peak(held(n));
  }
};

Row scale_row(const EvalRow &e, const Target &t) {
  Row r;
  r.m = e;
  std::optional<Strategy> st;
  std::string parse_error;
  try {
    st = parse_strategy(e.strategy);
  } catch (const RunnerError &err) {
    parse_error = err.what();
  }
  if (st) {
    r.evicts = st->protocol != Strategy::Protocol::None;
    // Every pool with a residual arena refuses the prefix cache (kvc_pool_enable_prefix_cache):
    // residual windows, hybrid precision, per-channel codecs (they stage a group) and sinks.
    const bool channel = (st->k_quantized && st->k_codec.granularity == KVC_SCALE_PER_CHANNEL) ||
                         (st->v_quantized && st->v_codec.granularity == KVC_SCALE_PER_CHANNEL);
    if (st->residual_window > 0 || st->residual_fraction > 0.0 || st->residual_sinks > 0 || channel) {
      r.prefix_ok = false;
      r.prefix_refusal = "its codec stages tokens and encodes them as they age (residual window, hybrid "
                         "precision, per-channel groups or attention sinks), and such pools refuse the prefix "
                         "cache";
    }
    if (st->k_quantized && st->k_codec.granularity == KVC_SCALE_PER_CHANNEL)
      r.channel_group = st->k_codec.group_size;
  } else if (!e.kept_fraction) {
    throw RunnerError("result '" + e.strategy + "' has no kept_fraction and this build cannot read its spec: " +
                      parse_error);
  } else {
    r.prefix_ok = false;
    r.prefix_refusal = "this build does not know its spec";
  }
  if (st && st->protocol == Strategy::Protocol::Stream && st->budget_tokens > 0) {
    // A fixed cap of N tokens per layer: it holds min(N, length) at any length, so neither a
    // kept_fraction measured at the eval's ctx nor the default budget scales to --seq-len.
    r.cap_tokens = st->budget_tokens;
    r.kept_source = "spec";
  } else if (e.kept_fraction) {
    r.kept = *e.kept_fraction;
    r.kept_source = "measured";
  } else if (!r.evicts) {
    r.kept = 1.0;
    r.kept_source = "no eviction";
  } else if (st->protocol == Strategy::Protocol::Stream) {
    r.kept = st->budget;  // the cap: ceil(budget x length) tokens per layer
    r.kept_source = "spec";
  } else {
    // prefill-compress: P = prefill x n tokens keep budget x P, the rest is decoded uncompressed
    r.kept = 1.0 - (1.0 - st->budget) * st->prefill_fraction;
    r.kept_source = "spec";
  }
  r.evicts = r.evicts || r.kept < 1.0;
  // Bytes at the target: the pool's blocks at the target geometry, measured from the
  // library, with the rules by which its tokens are staged and encoded (seq_bytes.h).
  if (st) {
    r.layout = seq_bytes(*st, t.geometry.num_layers, t.geometry.num_kv_heads, t.geometry.head_dim, &r.layout_refusal);
  } else {
    r.layout_refusal = "this build does not know its spec";
  }
  if (!r.layout) {  // the measured bits per element carry over
    const long double bpt = static_cast<long double>(e.bits_per_element) * t.elements_per_token / 8.0L;
    if (!(bpt < static_cast<long double>(kMaxBytes))) throw RunnerError("bytes per token exceed 2^63");
    r.carried_bytes_per_token = static_cast<std::uint64_t>(std::ceil(bpt - 1e-6L));
    if (r.carried_bytes_per_token == 0) r.carried_bytes_per_token = 1;
  }
  r.tokens_held = r.held(t.seq_len);
  if (r.cap_tokens) r.kept = double(r.tokens_held) / double(t.seq_len);
  r.bytes_per_seq = r.seq_bytes_at(t.seq_len);
  r.bytes_per_token = ceil_div(r.bytes_per_seq, r.tokens_held);  // tokens_held >= 1
  r.bytes_total = mul(t.batch, r.bytes_per_seq, "the total size");
  r.budget_share = double(r.bytes_total) / double(t.memory);
  r.meets = e.ppl_delta_pct <= t.max_ppl_increase;
  r.fits = r.bytes_total <= t.memory;
  // Headroom: the largest batch at seq_len, the largest length at the batch, each searched
  // up to the largest --batch / --seq-len accepted (beyond them: "unbounded").
  r.largest_batch = t.memory / std::max<std::uint64_t>(r.bytes_per_seq, 1);
  r.batch_unbounded = r.largest_batch >= kMaxBatch;
  if (r.batch_unbounded) r.largest_batch = kMaxBatch;
  const std::uint64_t max_seq = t.memory / t.batch;  // bytes one sequence may take
  if (r.seq_bytes_at(kMaxSeqLen) <= max_seq) {
    r.seq_len_unbounded = true;
    r.largest_seq_len = kMaxSeqLen;
  } else {
    // seq_bytes_at() never decreases with the length: the largest n in [0, kMaxSeqLen) that fits.
    std::uint64_t lo = 0, hi = kMaxSeqLen;  // seq_bytes_at(lo) <= max_seq < seq_bytes_at(hi)
    while (hi - lo > 1) {
      const std::uint64_t mid = lo + (hi - lo) / 2;
      (r.seq_bytes_at(mid) <= max_seq ? lo : hi) = mid;
    }
    r.largest_seq_len = lo;
  }
  return r;
}

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

/// Least memory first; then the smaller quality loss, then the smaller bytes per token.
bool cheaper(const Row *a, const Row *b) {
  if (a->bytes_total != b->bytes_total) return a->bytes_total < b->bytes_total;
  if (a->m.ppl_delta_pct != b->m.ppl_delta_pct) return a->m.ppl_delta_pct < b->m.ppl_delta_pct;
  return a->bytes_per_token < b->bytes_per_token;
}

// ---- prefix caching ----------------------------------------------------------------

struct PrefixInput {
  bool given = false;
  std::string source;  ///< "flags" or "file"
  std::string path;
  std::uint64_t prefix_tokens = 0;  ///< L
  std::uint64_t prompt_tokens = 0;  ///< P
  bool prompt_assumed = false;      ///< P taken as the whole seq_len
  double share = 0;                 ///< L / P
  std::uint64_t block_size = 16;
  // Measured by `eval --prefix` (source "file").
  std::uint64_t m_block_size = 0, m_requests = 0, m_without = 0, m_with = 0;
  std::optional<double> m_hit_rate, m_ttft_without, m_ttft_with, m_speedup;
};

/// The measured fields of an `eval --prefix --json` report.
void load_prefix_report(const json &j, const std::string &where, PrefixInput &in) {
  if (!j.is_object()) throw RunnerError(where + "is not a JSON object");
  if (j.contains("mode") && !(j["mode"].is_string() && j["mode"].get<std::string>() == "prefix"))
    throw RunnerError(where + "mode is not \"prefix\" (is it a `kvcache eval --prefix --json` report?)");
  const std::int64_t bs = req_integer(j, "block_size", where), requests = req_integer(j, "requests", where);
  const std::int64_t prefix = req_integer(j, "prefix_tokens", where), suffix = req_integer(j, "suffix_tokens", where);
  const json &without = req_object(j, "without_cache", where), &with = req_object(j, "with_cache", where);
  const std::int64_t t_without = req_integer(without, "tokens_computed", where + "without_cache: ");
  const std::int64_t t_with = req_integer(with, "tokens_computed", where + "with_cache: ");
  if (bs < 1 || requests < 1 || prefix < 0 || suffix < 0 || t_without < 1 || t_with < 0)
    throw RunnerError(where + "impossible values (block_size, requests and without_cache.tokens_computed must be "
                              ">= 1; prefix_tokens, suffix_tokens and with_cache.tokens_computed >= 0)");
  if (prefix > std::numeric_limits<std::int64_t>::max() - suffix)
    throw RunnerError(where + "impossible values: prefix_tokens + suffix_tokens (" + std::to_string(prefix) + " + " +
                      std::to_string(suffix) + ") overflows 64 bits");
  if (prefix + suffix < 1) throw RunnerError(where + "impossible values: prefix_tokens + suffix_tokens is 0");
  // Without the cache every request computes its whole prompt.
  if (prefix + suffix > std::numeric_limits<std::int64_t>::max() / requests ||
      t_without != requests * (prefix + suffix))
    throw RunnerError(where + "impossible values: without_cache.tokens_computed (" + std::to_string(t_without) +
                      ") is not requests x (prefix_tokens + suffix_tokens) = " + std::to_string(requests) + " x " +
                      std::to_string(prefix + suffix));
  if (t_with > t_without)
    throw RunnerError(where + "impossible values: with_cache.tokens_computed (" + std::to_string(t_with) +
                      ") is more than without_cache.tokens_computed (" + std::to_string(t_without) +
                      "): the prefix cache only skips tokens");
  in.prefix_tokens = static_cast<std::uint64_t>(prefix);
  in.prompt_tokens = static_cast<std::uint64_t>(prefix + suffix);
  in.share = double(prefix) / double(prefix + suffix);
  in.m_block_size = static_cast<std::uint64_t>(bs);
  in.m_requests = static_cast<std::uint64_t>(requests);
  in.m_without = static_cast<std::uint64_t>(t_without);
  in.m_with = static_cast<std::uint64_t>(t_with);
  in.m_hit_rate = opt_number(with, "hit_rate_tokens", where + "with_cache: ");
  in.m_ttft_without = opt_number(without, "ttft_ms_mean", where + "without_cache: ");
  in.m_ttft_with = opt_number(with, "ttft_ms_mean", where + "with_cache: ");
  in.m_speedup = opt_number(j, "ttft_speedup", where);
  if (in.m_hit_rate && !(*in.m_hit_rate >= 0.0 && *in.m_hit_rate <= 1.0))
    throw RunnerError(where + "impossible values: with_cache.hit_rate_tokens " + fmt("%g", *in.m_hit_rate) +
                      " is not in [0, 1]");
  if (in.m_ttft_without && !(*in.m_ttft_without >= 0.0))
    throw RunnerError(where + "impossible values: without_cache.ttft_ms_mean " + fmt("%g", *in.m_ttft_without) +
                      " is negative");
  if (in.m_ttft_with && !(*in.m_ttft_with >= 0.0))
    throw RunnerError(where + "impossible values: with_cache.ttft_ms_mean " + fmt("%g", *in.m_ttft_with) +
                      " is negative");
  if (in.m_speedup && !(*in.m_speedup > 0.0))
    throw RunnerError(where + "impossible values: ttft_speedup " + fmt("%g", *in.m_speedup) + " must be > 0");
}

PrefixInput prefix_input(const RecommendOptions &o, std::uint64_t seq_len) {
  PrefixInput in;
  const bool share_given = o.prefix_share.given;
  const bool tokens_given = o.prefix_tokens != RecommendOptions::kUnset;
  const bool block_given = o.block_size != RecommendOptions::kUnset;
  if (block_given && o.block_size < 1)
    throw RunnerError("--block-size " + std::to_string(o.block_size) + " must be >= 1");
  if (block_given && !share_given && !tokens_given && o.from_prefix.empty())
    throw RunnerError("--block-size " + std::to_string(o.block_size) + " is used only to assess prefix caching: "
                      "give --prefix-share F and/or --prefix-tokens L, or --from-prefix FILE, with it");
  double share = 0;
  if (share_given) {
    share = typed_number(o.prefix_share, "--prefix-share",
                         "the share of each prompt that all requests share, in [0, 1]");
    if (!(share >= 0.0 && share <= 1.0))
      throw RunnerError("--prefix-share '" + o.prefix_share.text + "' must be in [0, 1]");
  }
  if (tokens_given && o.prefix_tokens < 1)
    throw RunnerError("--prefix-tokens " + std::to_string(o.prefix_tokens) + " must be >= 1");
  if (!o.from_prefix.empty()) {
    if (share_given || tokens_given)
      throw RunnerError("give either --from-prefix or --prefix-share/--prefix-tokens, not both");
    const json j = read_json_file(o.from_prefix, "prefix report");
    const std::string where = "prefix report '" + o.from_prefix + "': ";
    try {
      load_prefix_report(j, where, in);
    } catch (const json::exception &e) {
      throw RunnerError(where + "cannot be read: " + e.what());
    }
    in.given = true;
    in.source = "file";
    in.path = o.from_prefix;
    in.block_size = block_given ? static_cast<std::uint64_t>(o.block_size) : in.m_block_size;
    if (in.prompt_tokens > seq_len)
      throw RunnerError(where + "its prompts (" + u(in.prompt_tokens) + " tokens) are longer than --seq-len " + u(seq_len));
    return in;
  }
  in.block_size = block_given ? static_cast<std::uint64_t>(o.block_size) : 16;
  if (!share_given && !tokens_given) return in;
  in.given = true;
  in.source = "flags";
  if (share_given && tokens_given) {
    if (share == 0.0)
      throw RunnerError("--prefix-share '" + o.prefix_share.text + "' contradicts --prefix-tokens " +
                        std::to_string(o.prefix_tokens));
    in.prefix_tokens = static_cast<std::uint64_t>(o.prefix_tokens);
    const double prompt = std::round(double(o.prefix_tokens) / share);
    if (!(prompt <= static_cast<double>(seq_len)))
      throw RunnerError("the prompt implied by --prefix-tokens / --prefix-share (" + fmt("%.6g", prompt) +
                        " tokens) is longer than --seq-len " + u(seq_len));
    in.prompt_tokens = static_cast<std::uint64_t>(prompt);
    in.share = share;
  } else if (tokens_given) {
    if (static_cast<std::uint64_t>(o.prefix_tokens) > seq_len)
      throw RunnerError("--prefix-tokens " + std::to_string(o.prefix_tokens) + " is longer than --seq-len " + u(seq_len));
    in.prefix_tokens = static_cast<std::uint64_t>(o.prefix_tokens);
    in.prompt_tokens = seq_len;
    in.prompt_assumed = true;
    in.share = double(in.prefix_tokens) / double(seq_len);
  } else {
    in.prompt_tokens = seq_len;
    in.prompt_assumed = true;
    in.share = share;
    in.prefix_tokens = static_cast<std::uint64_t>(std::floor(share * double(seq_len)));
  }
  return in;
}

struct BlockOption {
  std::uint64_t block_size = 0;
  bool valid = true;
  std::string invalid_reason;
  std::uint64_t reusable = 0, lost = 0;
  std::uint64_t table_bytes_per_seq = 0;
  std::int64_t extra_saved = 0, extra_table = 0, net = 0;  ///< against the current block size, whole batch
};

struct PrefixAnalysis {
  const Row *subject = nullptr;  ///< the row assessed (nullptr: no prefix-capable row)
  std::string subject_note;
  std::uint64_t reusable = 0, lost = 0, memory_saved = 0, total_with_sharing = 0;
  bool memory_shared = false;  ///< sharing saves memory (batch > 1, no eviction)
  std::string no_memory_reason;
  double compute_per_request = 0, compute_batch = 0;
  bool pays = false;
  std::string verdict;
  const Row *best_with_sharing = nullptr;  ///< least memory with the prefix shared, among rows meeting the floor
  std::vector<BlockOption> options;
  std::uint64_t recommended_block_size = 0;
  std::string block_verdict;
};

std::uint64_t reusable_tokens(const PrefixInput &in, std::uint64_t block) {
  // A lookup never serves the last prompt token: a prefix that is the whole prompt reuses P - 1 at most.
  const std::uint64_t usable = std::min(in.prefix_tokens, in.prompt_tokens > 0 ? in.prompt_tokens - 1 : 0);
  return usable / block * block;
}

/// Memory the shared prefix saves for row `r` (batch - 1 sequences attach instead of storing it).
std::uint64_t shared_saving(const Row &r, const PrefixInput &in, const Target &t, std::uint64_t block) {
  if (!r.prefix_ok || r.evicts || t.batch < 2) return 0;
  return mul(mul(t.batch - 1, reusable_tokens(in, block), "the shared tokens"), r.bytes_per_token, "the saving");
}

/// Whether the codec of `r` can use blocks of `block` tokens: keys quantized per channel over
/// G tokens need blocks holding a multiple of G.
bool codec_takes_block(const Row &r, std::uint64_t block) { return !r.channel_group || block % r.channel_group == 0; }

std::string channel_group_reason(const Row &r) {
  return r.m.strategy + " quantizes keys per channel over " + u(r.channel_group) +
         " tokens: a block must hold a multiple of " + u(r.channel_group);
}

/// The memory of `r` with the prefix shared at `block` tokens per block.
std::uint64_t with_sharing(const Row &r, const PrefixInput &in, const Target &t, std::uint64_t block) {
  return r.bytes_total - shared_saving(r, in, t, block);
}

std::string join(const std::vector<std::string> &items, const std::string &sep) {
  std::string s;
  for (std::size_t i = 0; i < items.size(); ++i) s += (i == 0 ? "" : i + 1 == items.size() ? " and " : sep) + items[i];
  return s;
}

PrefixAnalysis analyze_prefix(const PrefixInput &in, const Target &t, const std::vector<Row> &rows,
                              const Row *pick, const Row &reference) {
  PrefixAnalysis a;
  const std::uint64_t B = in.block_size;
  const auto can_share = [&](const Row &r) { return r.prefix_ok && codec_takes_block(r, B); };
  // The row assessed: the pick (or the reference when nothing meets the floor); when it
  // cannot use the prefix cache at this block size, the cheapest row meeting the floor that can.
  const Row *first = pick ? pick : &reference;
  if (can_share(*first)) {
    a.subject = first;
  } else {
    for (const Row &r : rows) {
      if (r.meets && can_share(r) && (!a.subject || cheaper(&r, a.subject))) a.subject = &r;
    }
    a.subject_note = first->m.strategy +
                     (first->prefix_ok ? " cannot use blocks of " + u(B) + (B == 1 ? " token" : " tokens") +
                                             ": it quantizes keys per channel over " + u(first->channel_group) +
                                             " tokens, so a block must hold a multiple of " + u(first->channel_group)
                                       : " cannot share blocks: " + first->prefix_refusal);
    if (a.subject) a.subject_note += "; assessed for " + a.subject->m.strategy + ", the cheapest row meeting the floor that can";
  }
  // The least memory with the prefix shared among the rows meeting the floor that can use
  // this block size (ties: the pick, then the cheaper without sharing).
  for (const Row &r : rows) {
    if (!r.meets || !codec_takes_block(r, B)) continue;
    const Row *b = a.best_with_sharing;
    const std::uint64_t cost = with_sharing(r, in, t, B), best_cost = b ? with_sharing(*b, in, t, B) : 0;
    if (!b || cost < best_cost || (cost == best_cost && b != pick && (&r == pick || cheaper(&r, b))))
      a.best_with_sharing = &r;
  }
  if (!a.subject) {
    a.verdict = "prefix caching is not available: " + a.subject_note + ", and no row meeting the floor can";
    a.recommended_block_size = B;
    a.block_verdict = "no block-size advice without a row that can use the prefix cache";
    return a;
  }
  const Row &s = *a.subject;
  a.reusable = reusable_tokens(in, B);
  a.lost = in.prefix_tokens - a.reusable;
  a.memory_saved = shared_saving(s, in, t, B);
  a.memory_shared = a.memory_saved > 0;
  if (s.evicts) a.no_memory_reason = "it evicts tokens, and eviction compaction copies shared blocks before it writes into them";
  else if (t.batch < 2) a.no_memory_reason = "a batch of 1 shares with nobody";
  a.total_with_sharing = s.bytes_total - a.memory_saved;
  a.compute_per_request = in.prompt_tokens ? double(a.reusable) / double(in.prompt_tokens) : 0.0;
  a.compute_batch = a.compute_per_request * double(t.batch - 1) / double(t.batch);
  a.pays = a.reusable > 0;
  if (in.prefix_tokens == 0) {
    a.verdict = "prefix caching does not pay: no prefix is shared";
  } else if (a.reusable == 0) {
    a.verdict = "prefix caching does not pay: the shared prefix (" + u(in.prefix_tokens) +
                " tokens) holds no whole block of " + u(B) + " tokens" +
                (in.prefix_tokens >= in.prompt_tokens ? " before the prompt's last token" : "");
  } else {
    a.verdict = "prefix caching pays: each request after the first reuses " + u(a.reusable) + " of its " +
                u(in.prompt_tokens) + " prompt tokens (" + fmt("%.1f", 100.0 * a.compute_per_request) +
                "% of the prefill not recomputed; " + fmt("%.1f", 100.0 * a.compute_batch) + "% across a batch of " +
                u(t.batch) + ")";
    if (a.memory_shared) {
      a.verdict += " and the batch shares " + bytes_text(a.memory_saved) + " of cache (" +
                   fmt("%.1f", 100.0 * double(a.memory_saved) / double(t.memory)) + "% of the budget)";
    } else {
      a.verdict += "; it saves no memory: " + a.no_memory_reason;
    }
  }
  // Block size: B, B/2, B/4 (those that are whole numbers). Smaller blocks reuse more of a
  // prefix that is not a whole number of blocks, and cost more block-table entries.
  const std::uint64_t table_B =
      mul(mul(ceil_div(t.seq_len, B), t.geometry.num_layers, "the block table"), kBlockTableEntryBytes, "the block table");
  const std::uint64_t saved_B = a.memory_saved;
  std::vector<std::string> not_whole;  // B / 2, B / 4 when they are not whole numbers
  for (std::uint64_t div : {1, 2, 4}) {
    if (B % div != 0) {
      not_whole.push_back(u(B) + " / " + u(div));
      continue;
    }
    BlockOption o;
    o.block_size = B / div;
    if (!codec_takes_block(s, o.block_size)) {
      o.valid = false;
      o.invalid_reason = channel_group_reason(s);
    }
    o.reusable = reusable_tokens(in, o.block_size);
    o.lost = in.prefix_tokens - o.reusable;
    o.table_bytes_per_seq = mul(mul(ceil_div(t.seq_len, o.block_size), t.geometry.num_layers, "the block table"),
                                kBlockTableEntryBytes, "the block table");
    o.extra_saved = static_cast<std::int64_t>(shared_saving(s, in, t, o.block_size)) - static_cast<std::int64_t>(saved_B);
    o.extra_table = static_cast<std::int64_t>(mul(t.batch, o.table_bytes_per_seq, "the block tables")) -
                    static_cast<std::int64_t>(mul(t.batch, table_B, "the block tables"));
    o.net = o.extra_saved - o.extra_table;
    a.options.push_back(o);
  }
  const BlockOption *best = nullptr;
  for (const BlockOption &o : a.options) {
    if (o.block_size < B && o.valid && o.net > 0 && (!best || o.net > best->net)) best = &o;
  }
  if (best) {
    a.recommended_block_size = best->block_size;
    a.block_verdict = "lower the block size to " + u(best->block_size) + ": " + u(best->reusable) + " prefix tokens reusable per request instead of " +
                      u(a.reusable) + " (" + u(best->lost) + " lost instead of " + u(a.lost) + "), saving " +
                      bytes_text(static_cast<std::uint64_t>(best->extra_saved)) + " across the batch for " +
                      bytes_text(static_cast<std::uint64_t>(best->extra_table)) + " more block tables";
    return a;
  }
  a.recommended_block_size = B;
  a.block_verdict = "keep block size " + u(B) + ": ";
  std::vector<const BlockOption *> smaller;  // the smaller sizes the codec can use
  std::vector<std::string> impossible;       // the smaller sizes it cannot
  for (const BlockOption &o : a.options) {
    if (o.block_size >= B) continue;
    if (o.valid) smaller.push_back(&o);
    else impossible.push_back(u(o.block_size));
  }
  if (smaller.empty()) {
    std::vector<std::string> why;
    if (!not_whole.empty())
      why.push_back(join(not_whole, ", ") +
                    (not_whole.size() == 1 ? " is not a whole number" : " are not whole numbers"));
    if (!impossible.empty())
      why.push_back("blocks of " + join(impossible, ", ") + " are not possible: " + channel_group_reason(s));
    a.block_verdict += "no smaller block size to compare (" + join(why, "; ") + ")";
    return a;
  }
  // Among the smaller sizes that reuse more of the prefix, the one closest to paying.
  const BlockOption *more = nullptr;
  for (const BlockOption *o : smaller)
    if (o->reusable > a.reusable && (!more || o->net > more->net)) more = o;
  if (!more) {
    std::vector<std::string> sizes;
    const BlockOption *least = nullptr;  // the smallest block-table cost among them
    for (const BlockOption *o : smaller) {
      sizes.push_back(u(o->block_size));
      if (!least || o->extra_table < least->extra_table) least = o;
    }
    const std::string tables = u(static_cast<std::uint64_t>(least->extra_table));
    if (sizes.size() == 1)
      a.block_verdict += "block size " + sizes[0] + " reuses no more of the prefix (" + u(a.reusable) +
                         " tokens per request) and adds " + tables + " bytes of block tables";
    else
      a.block_verdict += "smaller blocks (" + join(sizes, ", ") + ") reuse no more of the prefix (" + u(a.reusable) +
                         " tokens per request) and add block tables (" + tables + " bytes more at block size " +
                         u(least->block_size) + ")";
  } else if (!a.memory_shared) {
    a.block_verdict += "block size " + u(more->block_size) + " would reuse " + u(more->reusable - a.reusable) +
                       " more prefix tokens per request (prefill skipped), but sharing saves no memory here (" +
                       a.no_memory_reason + ") and its block tables take " +
                       u(static_cast<std::uint64_t>(more->extra_table)) + " more bytes";
  } else {
    a.block_verdict += "block size " + u(more->block_size) + " would share " +
                       u(static_cast<std::uint64_t>(more->extra_saved)) + " more bytes but its block tables take " +
                       u(static_cast<std::uint64_t>(more->extra_table)) + " more (net " + std::to_string(more->net) +
                       " bytes)";
  }
  return a;
}

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

std::size_t text_width(const std::string &s) {
  std::size_t n = 0;
  for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
  return n;
}

void print_table(const std::vector<std::vector<std::string>> &cells, const std::string &indent) {
  std::vector<std::size_t> widths(cells[0].size(), 0);
  for (const auto &row : cells)
    for (std::size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], text_width(row[i]));
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

std::string kept_text(const Row &r) {
  if (!r.evicts) return "all";
  std::string s = share_text(r.kept);
  if (r.cap_tokens) s += " (cap " + u(r.cap_tokens) + ")";
  else if (r.kept_source == "measured") s += " (measured)";
  else if (r.kept_source == "spec") s += " (spec)";
  return s;
}

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

void print_row_detail(const Row &r, const Target &t) {
  std::printf("  ppl %+.4f%% against the dense reference (floor: at most %+.4f%%)", r.m.ppl_delta_pct, t.max_ppl_increase);
  if (r.m.kl_mean) std::printf(", KL %.3e", *r.m.kl_mean);
  if (r.m.top1_agreement) std::printf(", top-1 %.4f", *r.m.top1_agreement);
  std::printf("\n");
  if (r.layout) {
    const SeqBytes &l = *r.layout;
    std::printf("  its pool at %u layers x %u KV heads x %u: blocks of %s tokens, %s bytes per block and layer",
                t.geometry.num_layers, t.geometry.num_kv_heads, t.geometry.head_dim, u(l.block_size).c_str(),
                u(l.block_bytes).c_str());
    if (l.residual_block_bytes) std::printf(", %s per residual (f16 staging) block", u(l.residual_block_bytes).c_str());
    std::printf(" (eval measured %.3f bits per element on its model)\n", r.m.bits_per_element);
    std::printf("  one sequence takes up to %s bytes on its way to %s tokens (%s bytes per token held)\n",
                u(r.bytes_per_seq).c_str(), u(t.seq_len).c_str(), u(r.bytes_per_token).c_str());
  } else {
    std::printf("  %.3f bits per element: %s bytes per token (%.3f x 2 x %u layers x %u KV heads x %u / 8; the "
                "pool's layout is unknown: %s)\n",
                r.m.bits_per_element, u(r.bytes_per_token).c_str(), r.m.bits_per_element, t.geometry.num_layers,
                t.geometry.num_kv_heads, t.geometry.head_dim, r.layout_refusal.c_str());
  }
  if (r.cap_tokens) {
    std::printf("  holds at most %s tokens (a fixed cap of %s tokens from its spec, whatever the length): %s of %s "
                "tokens held per sequence (%s)\n",
                u(r.cap_tokens).c_str(), u(r.cap_tokens).c_str(), u(r.tokens_held).c_str(), u(t.seq_len).c_str(),
                share_text(r.kept).c_str());
  } else if (r.evicts) {
    std::printf("  keeps %s of the tokens (%s): %s of %s tokens held per sequence%s\n", share_text(r.kept).c_str(),
                r.kept_source == "measured" ? "kept_fraction measured by eval" : "from its spec",
                u(r.tokens_held).c_str(), u(t.seq_len).c_str(),
                r.kept * double(t.seq_len) < 1.0 ? " (at least one token is held)" : "");
  }
  std::printf("  %s bytes per sequence x batch %s = %s: %.1f%% of the budget of %s: %s\n", u(r.bytes_per_seq).c_str(),
              u(t.batch).c_str(), bytes_text(r.bytes_total).c_str(), 100.0 * r.budget_share,
              human_bytes(static_cast<long double>(t.memory)).c_str(), r.fits ? "fits" : "DOES NOT FIT");
}

void print_headroom(const Row &r, const Target &t) {
  const std::string batch = "batch " + u(r.largest_batch) + (r.batch_unbounded ? " or more" : "");
  std::string seq_len;
  if (r.seq_len_unbounded && r.cap_tokens) {
    seq_len = "any seq-len at batch " + u(t.batch) + " (it never holds more than " + u(r.cap_tokens) + " tokens)";
  } else if (r.seq_len_unbounded) {
    seq_len = "seq-len " + u(kMaxSeqLen) + " or more at batch " + u(t.batch);
  } else if (r.largest_seq_len == 0) {
    seq_len = "not even one token per sequence at batch " + u(t.batch);
  } else {
    seq_len = "seq-len " + u(r.largest_seq_len) + (r.fits ? "" : " at most") + " at batch " + u(t.batch);
  }
  if (r.fits) {
    std::printf("  headroom: up to %s at seq-len %s, or %s\n", batch.c_str(), u(t.seq_len).c_str(), seq_len.c_str());
  } else if (r.largest_batch > 0) {
    std::printf("  to fit: %s at most at seq-len %s, or %s\n", batch.c_str(), u(t.seq_len).c_str(), seq_len.c_str());
  } else {
    std::printf("  to fit: not even one sequence of %s tokens fits; %s\n", u(t.seq_len).c_str(), seq_len.c_str());
  }
}

Measurements measure(const RecommendOptions &o) {
  if (!o.from.empty()) {
    const std::string where = "eval report '" + o.from + "': ";
    const json j = read_json_file(o.from, "eval report");
    Measurements m;
    try {
      m = load_eval(j, where);
    } catch (const json::exception &e) {
      throw RunnerError(where + "cannot be read: " + e.what());
    }
    m.source = "file";
    m.path = o.from;
    return m;
  }
  if (o.eval_tokens < 1) throw RunnerError("--eval-tokens " + std::to_string(o.eval_tokens) + " must be >= 1");
  EvalOptions eo;
  eo.model = o.model;
  std::string list = o.strategies;
  if (list.empty()) {
    for (const std::string &d : default_strategies()) list += (list.empty() ? "" : ",") + d;
  }
  eo.strategies = parse_strategy_list(list);
  eo.max_tokens = o.eval_tokens;
  eo.progress = o.progress;
  std::fprintf(stderr, "kvcache recommend: no --from: measuring %zu strategies on %s (%lld tokens) ...\n",
               eo.strategies.size(), o.model.c_str(), static_cast<long long>(o.eval_tokens));
  const EvalReport report = run_eval(eo);
  // Through the JSON report, so the eval's fields are read exactly as from a file.
  Measurements m = load_eval(json::parse(eval_json(report)), "eval run: ");
  m.source = "eval";
  return m;
}

}  // namespace

void run_recommend(const RecommendOptions &o) {
  // ---- arguments ----
  auto given = [](std::int64_t v) { return v != RecommendOptions::kUnset; };
  auto positive = [](std::int64_t v, const char *flag, std::int64_t hi) {
    if (v < 1 || v > hi) {
      throw RunnerError(std::string(flag) + " " + std::to_string(v) + " must be in 1.." + std::to_string(hi));
    }
    return static_cast<std::uint64_t>(v);
  };
  const bool dims = given(o.num_layers) || given(o.num_kv_heads) || given(o.head_dim);
  if (o.preset.empty() && !dims)
    throw RunnerError("give --preset NAME, or all of --layers, --kv-heads and --head-dim (each >= 1)");
  if (!o.preset.empty() && dims) throw RunnerError("give either --preset or --layers/--kv-heads/--head-dim, not both");
  std::uint32_t layers = 0, kv_heads = 0, head_dim = 0;
  if (dims) {
    if (!(given(o.num_layers) && given(o.num_kv_heads) && given(o.head_dim)))
      throw RunnerError("give all of --layers, --kv-heads and --head-dim (or --preset NAME)");
    layers = static_cast<std::uint32_t>(positive(o.num_layers, "--layers", 1 << 20));
    kv_heads = static_cast<std::uint32_t>(positive(o.num_kv_heads, "--kv-heads", 1 << 20));
    head_dim = static_cast<std::uint32_t>(positive(o.head_dim, "--head-dim", 1 << 20));
  }
  Target t;
  t.geometry = resolve_geometry(o.preset, layers, kv_heads, head_dim);
  if (!given(o.seq_len)) throw RunnerError("--seq-len N is required (the longest sequence, in tokens)");
  t.seq_len = positive(o.seq_len, "--seq-len", std::int64_t(1) << 40);
  t.batch = positive(o.batch, "--batch", std::int64_t(1) << 30);
  if (o.memory.empty()) throw RunnerError("--memory SIZE is required (the KV-cache budget, e.g. 16GiB)");
  t.memory = parse_byte_size(o.memory, "--memory");
  if (!o.max_ppl_increase.given)
    throw RunnerError("--max-ppl-increase PCT is required (the largest perplexity increase allowed, in percent)");
  t.max_ppl_increase = typed_number(o.max_ppl_increase, "--max-ppl-increase",
                                    "the largest perplexity increase allowed, in percent, e.g. 1");
  if (!(t.max_ppl_increase >= 0.0))
    throw RunnerError("--max-ppl-increase '" + o.max_ppl_increase.text + "' must be a finite percentage >= 0");
  t.elements_per_token = 2ull * t.geometry.num_layers * t.geometry.num_kv_heads * t.geometry.head_dim;
  const PrefixInput prefix = prefix_input(o, t.seq_len);  // checked before a long eval run

  // ---- measurements, scaled ----
  const Measurements m = measure(o);
  std::vector<Row> rows;
  std::optional<Row> reference;
  for (const EvalRow &e : m.rows) {
    if (e.reference) reference = scale_row(e, t);
    else rows.push_back(scale_row(e, t));
  }
  if (reference->evicts)
    throw RunnerError((m.source == "file" ? "eval report '" + m.path + "': " : std::string("eval run: ")) +
                      "the reference row '" + reference->m.strategy +
                      "' evicts tokens: the reference must be the dense cache every ppl_delta_pct is measured against");
  std::vector<const Row *> order;
  for (const Row &r : rows) order.push_back(&r);
  std::stable_sort(order.begin(), order.end(), cheaper);
  // The pick: the least memory among the rows meeting the floor; else the closest to it.
  const auto meeting = std::find_if(order.begin(), order.end(), [](const Row *r) { return r->meets; });
  const Row *pick = meeting == order.end() ? nullptr : *meeting;
  const Row *closest = pick ? nullptr : *std::min_element(order.begin(), order.end(), [](const Row *a, const Row *b) {
    return a->m.ppl_delta_pct < b->m.ppl_delta_pct;
  });
  PrefixAnalysis pa;
  if (prefix.given) pa = analyze_prefix(prefix, t, rows, pick, *reference);
  const std::string prefix_how =
      "give --prefix-share F (the share of each prompt that all requests share) and/or --prefix-tokens L, "
      "or --from-prefix FILE from `kvcache eval --prefix --json`";

  if (o.json) {
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
      mj["geometry"] = {{"num_layers", *m.num_layers}, {"num_kv_heads", *m.num_kv_heads}, {"head_dim", *m.head_dim}};
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
      j["prefix"] = {{"assessed", false}, {"how", prefix_how}};
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }

  // ---- text ----
  const Geometry &g = t.geometry;
  std::printf("target    %s (%s): %u layers, %u KV heads, head_dim %u\n", g.name.c_str(), g.description.c_str(),
              g.num_layers, g.num_kv_heads, g.head_dim);
  std::printf("          seq-len %s x batch %s, memory budget %s, quality floor: ppl at most %+.4f%%\n",
              u(t.seq_len).c_str(), u(t.batch).c_str(), bytes_text(t.memory).c_str(), t.max_ppl_increase);
  std::printf("measured  %s", m.source == "file" ? m.path.c_str() : "an eval run just now");
  if (!m.model.empty()) std::printf(": %s", m.model.c_str());
  if (m.num_layers && m.num_kv_heads && m.head_dim)
    std::printf(" (%lld layers, %lld KV heads, head_dim %lld)", static_cast<long long>(*m.num_layers),
                static_cast<long long>(*m.num_kv_heads), static_cast<long long>(*m.head_dim));
  if (m.ctx) std::printf(", ctx %lld", static_cast<long long>(*m.ctx));
  if (m.tokens_scored) std::printf(", %lld tokens scored", static_cast<long long>(*m.tokens_scored));
  std::printf(", %zu strategies\n\n", rows.size());

  if (pick) {
    std::printf("recommendation: %s\n", pick->m.strategy.c_str());
    print_row_detail(*pick, t);
    print_headroom(*pick, t);
    if (!pick->fits) {
      std::printf("  no strategy that meets the floor fits: this is the smallest one\n");
    }
    if (pick->evicts && pick->tokens_held < t.seq_len && m.ctx && static_cast<std::uint64_t>(*m.ctx) < t.seq_len) {
      std::printf("  note: its quality was measured on windows of %lld tokens; at %s tokens it %s but drops %s tokens "
                  "per sequence (not measured)\n",
                  static_cast<long long>(*m.ctx), u(t.seq_len).c_str(),
                  pick->cap_tokens ? ("holds the same " + u(pick->cap_tokens) + " tokens").c_str()
                                   : "keeps the same share",
                  u(t.seq_len - pick->tokens_held).c_str());
    }
    // Staged tokens (a residual window, a hybrid share, a per-channel group waiting) are read
    // exactly: in short windows they are a larger share of the cache than at a longer seq-len.
    const SeqBytes *l = pick->layout ? &*pick->layout : nullptr;
    const std::uint64_t staged = l && l->residual_block_bytes ? l->window + l->unit - 1 : 0;
    if (staged > 1 && l->fraction == 0.0 && m.ctx && static_cast<std::uint64_t>(*m.ctx) < t.seq_len) {
      std::printf("  note: up to %s of its newest tokens wait in f16 and are read without error; in the eval's "
                  "windows of %lld tokens that is a larger share of the cache than at %s tokens, where its loss may "
                  "be larger than measured\n",
                  u(staged).c_str(), static_cast<long long>(*m.ctx), u(t.seq_len).c_str());
    }
  } else {
    std::printf("no strategy meets the floor: the smallest ppl increase measured is %+.4f%% (%s), above %+.4f%%\n",
                closest->m.ppl_delta_pct, closest->m.strategy.c_str(), t.max_ppl_increase);
    std::printf("closest: %s\n", closest->m.strategy.c_str());
    print_row_detail(*closest, t);
    std::printf("the dense reference (%s) meets any floor: %s, %s\n", reference->m.strategy.c_str(),
                bytes_text(reference->bytes_total).c_str(), reference->fits ? "fits" : "does not fit");
  }

  // The pick, every cheaper row (they miss the floor) and up to three runners-up.
  std::vector<std::vector<std::string>> cells;
  cells.push_back({"strategy", "bits/elem", "kept", "B/token", "total at " + u(t.seq_len) + " x " + u(t.batch),
                   "of budget", "ppl Δ%", "floor", "fits"});
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
  std::printf("bits/elem: measured by eval on its model; B/token: the most one sequence holds on its way to seq-len, "
              "in whole blocks of its pool at %u x %u x %u (codes, scales, f16 staging), over the tokens held; total = "
              "batch x that; kept: tokens held / seq-len\n",
              g.num_layers, g.num_kv_heads, g.head_dim);
  for (const Row *r : order)
    if (!r->layout)
      std::printf("  %s: %s; its bits per element carry over (bits x 2 x %u x %u x %u / 8 per token held)\n",
                  r->m.strategy.c_str(), r->layout_refusal.c_str(), g.num_layers, g.num_kv_heads, g.head_dim);

  std::printf("\n");
  if (!prefix.given) {
    std::printf("prefix caching: not assessed (%s)\n", prefix_how.c_str());
    return;
  }
  std::printf("prefix caching (%s): shared prefix %s of %s%s prompt tokens (%.1f%%), block size %s\n",
              prefix.source == "file" ? ("measured in " + prefix.path).c_str() : "from the flags",
              u(prefix.prefix_tokens).c_str(), u(prefix.prompt_tokens).c_str(),
              prefix.prompt_assumed ? " (the prompt taken as the whole --seq-len)" : "", 100.0 * prefix.share,
              u(prefix.block_size).c_str());
  if (prefix.source == "file") {
    std::printf("  measured at block size %s over %s requests: %s of %s prompt tokens computed (%.1f%% not recomputed)",
                u(prefix.m_block_size).c_str(), u(prefix.m_requests).c_str(), u(prefix.m_with).c_str(),
                u(prefix.m_without).c_str(), 100.0 * (1.0 - double(prefix.m_with) / double(prefix.m_without)));
    if (prefix.m_speedup) std::printf(", time to first token %.2fx faster", *prefix.m_speedup);
    std::printf("\n");
  }
  if (!pa.subject_note.empty()) std::printf("  %s\n", pa.subject_note.c_str());
  std::printf("  %s\n", pa.verdict.c_str());
  if (pa.subject && pa.memory_shared) {
    std::printf("  %s with the prefix shared: %s, %.1f%% of the budget: %s\n", pa.subject->m.strategy.c_str(),
                bytes_text(pa.total_with_sharing).c_str(), 100.0 * double(pa.total_with_sharing) / double(t.memory),
                pa.total_with_sharing <= t.memory ? "fits" : "does not fit");
  }
  if (pick && pa.subject && pa.subject != pick) {
    const std::uint64_t with = pa.total_with_sharing;
    const std::string pick_bytes = human_bytes(static_cast<long double>(pick->bytes_total));
    const std::string with_bytes = human_bytes(static_cast<long double>(with));
    if (pick->bytes_total <= with) {
      std::printf("  %s without prefix sharing still needs less memory (%s) than %s with it (%s): using it for "
                  "the prefix cache trades memory for prefill compute\n",
                  pick->m.strategy.c_str(), pick_bytes.c_str(), pa.subject->m.strategy.c_str(), with_bytes.c_str());
    } else {
      std::printf("  %s with the prefix shared needs less memory (%s) than %s without it (%s)\n",
                  pa.subject->m.strategy.c_str(), with_bytes.c_str(), pick->m.strategy.c_str(), pick_bytes.c_str());
    }
  }
  if (pick && pa.best_with_sharing && pa.best_with_sharing != pick) {
    // Against the pick with the prefix shared too, when its codec takes this block size.
    const std::uint64_t B = prefix.block_size, best = with_sharing(*pa.best_with_sharing, prefix, t, B);
    const std::uint64_t pick_cost = codec_takes_block(*pick, B) ? with_sharing(*pick, prefix, t, B) : pick->bytes_total;
    if (best < pick_cost)
      std::printf("  with the prefix shared, %s needs less than the pick: %s (the pick: %s)\n",
                  pa.best_with_sharing->m.strategy.c_str(), bytes_text(best).c_str(), bytes_text(pick_cost).c_str());
  }
  if (!pa.options.empty()) {
    std::vector<std::vector<std::string>> bc;
    bc.push_back({"block size", "reusable", "lost", "block table/seq", "sharing vs " + u(prefix.block_size),
                  "tables vs " + u(prefix.block_size), "net"});
    for (const BlockOption &b : pa.options) {
      bc.push_back({u(b.block_size) + (b.valid ? "" : " (not possible)"), u(b.reusable), u(b.lost),
                    u(b.table_bytes_per_seq), fmt("%+.0f", double(b.extra_saved)), fmt("%+.0f", double(b.extra_table)),
                    fmt("%+.0f", double(b.net))});
    }
    print_table(bc, "  ");
    for (const BlockOption &b : pa.options)
      if (!b.valid) std::printf("  block size %s: %s\n", u(b.block_size).c_str(), b.invalid_reason.c_str());
    std::printf("  (per request: tokens of the prefix; block table: ceil(%s / block) x %u layers x %llu bytes; "
                "bytes across the batch of %s)\n",
                u(t.seq_len).c_str(), g.num_layers, static_cast<unsigned long long>(kBlockTableEntryBytes), u(t.batch).c_str());
  }
  if (pa.subject && pa.subject != (pick ? pick : &*reference))
    std::printf("  for %s: %s\n", pa.subject->m.strategy.c_str(), pa.block_verdict.c_str());
  else
    std::printf("  %s\n", pa.block_verdict.c_str());
}

}  // namespace kvc_cli
