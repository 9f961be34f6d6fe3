// SPDX-License-Identifier: Apache-2.0
#include "strategy.h"

#include <algorithm>

#include "../runner/error.h"

namespace kvc_cli {
using kvc_runner::RunnerError;

namespace {

enum class Kind { Codec, Policy };

/// One entry of the registry: later codecs (int8, int4, fp8...) and policies
/// (h2o, snapkv, streaming...) add a row with their parameter checker.
struct Component {
  const char *name;
  Kind kind;
  const char *description;
  kvc_dtype dtype;  // codecs: the pool storage dtype
  // Names of parameters accepted (empty: none).
  std::vector<std::string> params;
};

const std::vector<Component> &registry() {
  static const std::vector<Component> r = {
      {"f32", Kind::Codec, "IEEE binary32 K and V (the dense reference)", KVC_DTYPE_F32, {}},
      {"f16", Kind::Codec, "IEEE binary16 K and V", KVC_DTYPE_F16, {}},
      {"bf16", Kind::Codec, "bfloat16 K and V", KVC_DTYPE_BF16, {}},
      {"full", Kind::Policy, "keep every token (no eviction; the default)", KVC_DTYPE_F32, {}},
  };
  return r;
}

std::string known_names() {
  std::string s;
  for (const Component &c : registry()) {
    if (!s.empty()) s += ", ";
    s += c.name;
  }
  return s;
}

bool valid_word(const std::string &w, bool allow_upper) {
  if (w.empty()) return false;
  return std::all_of(w.begin(), w.end(), [&](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' ||
           ch == '-' || (allow_upper && ch >= 'A' && ch <= 'Z');
  });
}

std::vector<std::string> split(const std::string &s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

std::string part_text(const StrategyPart &p) {
  std::string s = p.name;
  for (const auto &[key, value] : p.params) s += ":" + (value.empty() ? key : key + "=" + value);
  return s;
}

}  // namespace

Strategy parse_strategy(const std::string &spec) {
  const std::string where = "strategy '" + spec + "': ";
  if (spec.empty()) throw RunnerError("empty strategy spec");
  if (spec.find_first_of(" \t,") != std::string::npos) {
    throw RunnerError(where + "contains a space or comma (specs are like f16 or h2o:budget=0.3+int4:group=32)");
  }
  Strategy st;
  bool has_codec = false;
  for (const std::string &part_str : split(spec, '+')) {
    if (part_str.empty()) throw RunnerError(where + "empty part around '+'");
    const std::vector<std::string> fields = split(part_str, ':');
    StrategyPart part;
    part.name = fields[0];
    if (!valid_word(part.name, false)) {
      throw RunnerError(where + "malformed name '" + part.name + "' (use lower-case letters, digits, '_', '.', '-')");
    }
    const auto it = std::find_if(registry().begin(), registry().end(),
                                 [&](const Component &c) { return part.name == c.name; });
    if (it == registry().end()) {
      throw RunnerError(where + "unknown codec or policy '" + part.name + "' (known: " +
                        known_names() + ")");
    }
    for (std::size_t i = 1; i < fields.size(); ++i) {
      const std::string &f = fields[i];
      if (f.empty()) throw RunnerError(where + "empty parameter after ':' in '" + part_str + "'");
      const std::size_t eq = f.find('=');
      std::string key = eq == std::string::npos ? f : f.substr(0, eq);
      std::string value = eq == std::string::npos ? "" : f.substr(eq + 1);
      if (!valid_word(key, false) || (eq != std::string::npos && !valid_word(value, true))) {
        throw RunnerError(where + "malformed parameter '" + f + "' of '" + part.name +
                          "' (expected key=value or a flag)");
      }
      if (std::find(it->params.begin(), it->params.end(), key) == it->params.end()) {
        std::string accepted;
        for (const std::string &p : it->params) accepted += (accepted.empty() ? "" : ", ") + p;
        throw RunnerError(where + "'" + part.name + "' takes no parameter '" + key + "'" +
                          (accepted.empty() ? std::string(" (it has no parameters)")
                                            : " (accepted: " + accepted + ")"));
      }
      part.params.emplace_back(std::move(key), std::move(value));
    }
    if (it->kind == Kind::Codec) {
      if (has_codec) throw RunnerError(where + "more than one codec ('" + st.codec.name + "' and '" + part.name + "')");
      has_codec = true;
      st.codec = part;
      st.k_dtype = st.v_dtype = it->dtype;
    } else {
      if (st.has_policy) throw RunnerError(where + "more than one policy ('" + st.policy.name + "' and '" + part.name + "')");
      st.has_policy = true;
      st.policy = part;
    }
  }
  if (!has_codec) st.codec.name = "f16";  // the pool's default storage dtype
  // "full" is the absence of a policy; normalize it away.
  if (st.has_policy && st.policy.name == "full") st.has_policy = false;
  st.spec = st.has_policy ? part_text(st.policy) + "+" + part_text(st.codec) : part_text(st.codec);
  return st;
}

std::vector<Strategy> parse_strategy_list(const std::string &list) {
  std::vector<Strategy> out;
  for (const std::string &item : split(list, ',')) {
    if (item.empty()) throw RunnerError("empty item in the strategy list '" + list + "'");
    out.push_back(parse_strategy(item));
  }
  return out;
}

std::vector<std::string> default_strategies() { return {"f32", "f16", "bf16"}; }

std::vector<std::pair<std::string, std::string>> known_codecs() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Component &c : registry()) {
    if (c.kind == Kind::Codec) out.emplace_back(c.name, c.description);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> known_policies() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Component &c : registry()) {
    if (c.kind == Kind::Policy) out.emplace_back(c.name, c.description);
  }
  return out;
}

}  // namespace kvc_cli
