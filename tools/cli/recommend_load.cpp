// SPDX-License-Identifier: Apache-2.0
// `kvcache recommend`, loading: the measurements (an `eval --json` report, or
// an eval run now) and the prefix facts (flags, or an `eval --prefix --json`
// report), every field checked with a message naming the file and the field.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "../runner/error.h"
#include "eval.h"
#include "recommend_int.h"
#include "strategy.h"

namespace kvc_cli::recommend {
using kvc_runner::RunnerError;

namespace {

using json = nlohmann::json;

/// The number `key` of `o`, if there: it must be a finite number.
std::optional<double> opt_number(const json &o, const char *key, const std::string &where) {
  if (!o.contains(key)) return std::nullopt;
  const json &v = o[key];
  if (!v.is_number()) throw RunnerError(where + "field '" + key + "' is not a number");
  const double d = v.get<double>();
  if (!std::isfinite(d)) throw RunnerError(where + "field '" + key + "' is not finite");
  return d;
}

/// The number `key` of `o`: it must be there.
double req_number(const json &o, const char *key, const std::string &where) {
  const std::optional<double> v = opt_number(o, key, where);
  if (!v) throw RunnerError(where + "misses the required field '" + key + "'");
  return *v;
}

/// The integer `key` of `o`, if there: it must fit an int64.
std::optional<std::int64_t> opt_integer(const json &o, const char *key, const std::string &where) {
  if (!o.contains(key)) return std::nullopt;
  const json &v = o[key];
  if (!v.is_number_integer()) throw RunnerError(where + "field '" + key + "' is not an integer");
  if (v.is_number_unsigned() &&
      v.get<std::uint64_t>() > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
    throw RunnerError(where + "field '" + key + "' is out of range (" + v.dump() + " > 2^63 - 1)");
  return v.get<std::int64_t>();
}

/// The integer `key` of `o`: it must be there.
std::int64_t req_integer(const json &o, const char *key, const std::string &where) {
  const std::optional<std::int64_t> v = opt_integer(o, key, where);
  if (!v) throw RunnerError(where + "misses the required field '" + key + "'");
  return *v;
}

/// The object `key` of `o`: it must be there.
const json &req_object(const json &o, const char *key, const std::string &where) {
  if (!o.contains(key)) throw RunnerError(where + "misses the required field '" + key + "'");
  if (!o[key].is_object()) throw RunnerError(where + "field '" + key + "' is not an object");
  return o[key];
}

/// The JSON of the file at `path`; `what` names it in errors ("eval report").
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
    throw RunnerError(
        what + " '" + path +
        "' holds a number out of range (a double holds at most about 1.8e308): " + e.what());
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
    for (std::size_t i = 0; i < v.size(); ++i)
      check_finite(v[i], name + "[" + std::to_string(i) + "]", where);
}

/// Reads an `eval --json` report; fields not named here are ignored.
Measurements load_eval_report(const json &j, const std::string &where) {
  if (!j.is_object()) throw RunnerError(where + "is not a JSON object");
  Measurements m;
  if (j.contains("model") && j["model"].is_string()) m.model = j["model"].get<std::string>();
  m.ctx = opt_integer(j, "ctx", where);
  m.tokens_scored = opt_integer(j, "tokens_scored", where);
  if (m.ctx && *m.ctx < 1)
    throw RunnerError(where + "ctx " + std::to_string(*m.ctx) + " must be >= 1");
  if (m.tokens_scored && *m.tokens_scored < 1)
    throw RunnerError(where + "tokens_scored " + std::to_string(*m.tokens_scored) +
                      " must be >= 1");
  if (j.contains("geometry")) {
    const json &g = req_object(j, "geometry", where);
    m.num_layers = opt_integer(g, "num_layers", where + "geometry: ");
    m.num_kv_heads = opt_integer(g, "num_kv_heads", where + "geometry: ");
    m.head_dim = opt_integer(g, "head_dim", where + "geometry: ");
  }
  if (!j.contains("results")) {
    throw RunnerError(
        where + "misses the required field 'results' (is it a `kvcache eval --json` report?)");
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
      if (!r["reference"].is_boolean())
        throw RunnerError(at + "field 'reference' is not true or false");
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
        throw RunnerError(at + "the reference row has ppl_delta_pct " +
                          fmt("%g", row.ppl_delta_pct) +
                          " (expected 0: every ppl_delta_pct is measured against it)");
      if (row.kl_mean && *row.kl_mean != 0.0)
        throw RunnerError(at + "the reference row has kl_mean " + fmt("%g", *row.kl_mean) +
                          " (expected 0: every kl_mean is measured against it)");
    }
    references += row.reference ? 1 : 0;
    m.rows.push_back(row);
  }
  if (references == 0) {
    throw RunnerError(where +
                      "has no reference row (a result with \"reference\": true, the dense cache "
                      "every ppl_delta_pct is measured against)");
  }
  if (references > 1)
    throw RunnerError(where + "has " + std::to_string(references) +
                      " reference rows (expected one)");
  if (m.rows.size() == 1)
    throw RunnerError(where + "holds only the reference row: no strategy to choose from");
  return m;
}

/// The measured fields of an `eval --prefix --json` report.
void load_prefix_report(const json &j, const std::string &where, PrefixInput &in) {
  if (!j.is_object()) throw RunnerError(where + "is not a JSON object");
  if (j.contains("mode") && !(j["mode"].is_string() && j["mode"].get<std::string>() == "prefix"))
    throw RunnerError(where +
                      "mode is not \"prefix\" (is it a `kvcache eval --prefix --json` report?)");
  const std::int64_t bs = req_integer(j, "block_size", where),
                     requests = req_integer(j, "requests", where);
  const std::int64_t prefix = req_integer(j, "prefix_tokens", where),
                     suffix = req_integer(j, "suffix_tokens", where);
  const json &without = req_object(j, "without_cache", where),
             &with = req_object(j, "with_cache", where);
  const std::int64_t t_without = req_integer(without, "tokens_computed", where + "without_cache: ");
  const std::int64_t t_with = req_integer(with, "tokens_computed", where + "with_cache: ");
  if (bs < 1 || requests < 1 || prefix < 0 || suffix < 0 || t_without < 1 || t_with < 0)
    throw RunnerError(
        where +
        "impossible values (block_size, requests and without_cache.tokens_computed must be "
        ">= 1; prefix_tokens, suffix_tokens and with_cache.tokens_computed >= 0)");
  if (prefix > std::numeric_limits<std::int64_t>::max() - suffix)
    throw RunnerError(where + "impossible values: prefix_tokens + suffix_tokens (" +
                      std::to_string(prefix) + " + " + std::to_string(suffix) +
                      ") overflows 64 bits");
  if (prefix + suffix < 1)
    throw RunnerError(where + "impossible values: prefix_tokens + suffix_tokens is 0");
  // Without the cache every request computes its whole prompt.
  if (prefix + suffix > std::numeric_limits<std::int64_t>::max() / requests ||
      t_without != requests * (prefix + suffix))
    throw RunnerError(
        where + "impossible values: without_cache.tokens_computed (" + std::to_string(t_without) +
        ") is not requests x (prefix_tokens + suffix_tokens) = " + std::to_string(requests) +
        " x " + std::to_string(prefix + suffix));
  if (t_with > t_without)
    throw RunnerError(where + "impossible values: with_cache.tokens_computed (" +
                      std::to_string(t_with) + ") is more than without_cache.tokens_computed (" +
                      std::to_string(t_without) + "): the prefix cache only skips tokens");
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
    throw RunnerError(where + "impossible values: with_cache.hit_rate_tokens " +
                      fmt("%g", *in.m_hit_rate) + " is not in [0, 1]");
  if (in.m_ttft_without && !(*in.m_ttft_without >= 0.0))
    throw RunnerError(where + "impossible values: without_cache.ttft_ms_mean " +
                      fmt("%g", *in.m_ttft_without) + " is negative");
  if (in.m_ttft_with && !(*in.m_ttft_with >= 0.0))
    throw RunnerError(where + "impossible values: with_cache.ttft_ms_mean " +
                      fmt("%g", *in.m_ttft_with) + " is negative");
  if (in.m_speedup && !(*in.m_speedup > 0.0))
    throw RunnerError(where + "impossible values: ttft_speedup " + fmt("%g", *in.m_speedup) +
                      " must be > 0");
}

}  // namespace

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

PrefixInput prefix_input(const RecommendOptions &o, std::uint64_t seq_len) {
  PrefixInput in;
  const bool share_given = o.prefix_share.given;
  const bool tokens_given = o.prefix_tokens != RecommendOptions::kUnset;
  const bool block_given = o.block_size != RecommendOptions::kUnset;
  if (block_given && o.block_size < 1)
    throw RunnerError("--block-size " + std::to_string(o.block_size) + " must be >= 1");
  if (block_given && !share_given && !tokens_given && o.from_prefix.empty())
    throw RunnerError(
        "--block-size " + std::to_string(o.block_size) +
        " is used only to assess prefix caching: "
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
      throw RunnerError(where + "its prompts (" + u(in.prompt_tokens) +
                        " tokens) are longer than --seq-len " + u(seq_len));
    return in;
  }
  in.block_size = block_given ? static_cast<std::uint64_t>(o.block_size) : 16;
  if (!share_given && !tokens_given) return in;
  in.given = true;
  in.source = "flags";
  if (share_given && tokens_given) {
    if (share == 0.0)
      throw RunnerError("--prefix-share '" + o.prefix_share.text +
                        "' contradicts --prefix-tokens " + std::to_string(o.prefix_tokens));
    in.prefix_tokens = static_cast<std::uint64_t>(o.prefix_tokens);
    const double prompt = std::round(double(o.prefix_tokens) / share);
    if (!(prompt <= static_cast<double>(seq_len)))
      throw RunnerError("the prompt implied by --prefix-tokens / --prefix-share (" +
                        fmt("%.6g", prompt) + " tokens) is longer than --seq-len " + u(seq_len));
    in.prompt_tokens = static_cast<std::uint64_t>(prompt);
    in.share = share;
  } else if (tokens_given) {
    if (static_cast<std::uint64_t>(o.prefix_tokens) > seq_len)
      throw RunnerError("--prefix-tokens " + std::to_string(o.prefix_tokens) +
                        " is longer than --seq-len " + u(seq_len));
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

Measurements measure(const RecommendOptions &o) {
  if (!o.from.empty()) {
    const std::string where = "eval report '" + o.from + "': ";
    const json j = read_json_file(o.from, "eval report");
    Measurements m;
    try {
      m = load_eval_report(j, where);
    } catch (const json::exception &e) {
      throw RunnerError(where + "cannot be read: " + e.what());
    }
    m.source = "file";
    m.path = o.from;
    return m;
  }
  if (o.eval_tokens < 1)
    throw RunnerError("--eval-tokens " + std::to_string(o.eval_tokens) + " must be >= 1");
  EvalOptions eo;
  eo.model = o.model;
  std::string list = o.strategies;
  if (list.empty()) {
    for (const std::string &d : default_strategies()) list += (list.empty() ? "" : ",") + d;
    eo.default_rows = true;
  }
  eo.strategies = parse_strategy_list(list);
  eo.max_tokens = o.eval_tokens;
  eo.progress = o.progress;
  std::fprintf(stderr,
               "kvcache recommend: no --from: measuring %s%zu strategies on %s (%lld tokens) "
               "...\n",
               eo.default_rows ? "up to " : "", eo.strategies.size(), o.model.c_str(),
               static_cast<long long>(o.eval_tokens));
  const EvalReport report = run_eval(eo);
  // Through the JSON report, so the eval's fields are read exactly as from a file.
  Measurements m = load_eval_report(json::parse(eval_json(report)), "eval run: ");
  m.source = "eval";
  return m;
}

}  // namespace kvc_cli::recommend
