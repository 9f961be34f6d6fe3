// SPDX-License-Identifier: Apache-2.0
#include "strategy.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "../runner/error.h"

namespace kvc_cli {
using kvc_runner::RunnerError;

namespace {

enum class Kind { Codec, Policy, Wrapper };

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
      {"fp8_e4m3",
       Kind::Codec,
       "OCP fp8 E4M3, one scale per layer (static, default 1.0 as vLLM's uncalibrated k_scale; "
       "per-token: dynamic per token and KV head)",
       KVC_DTYPE_FP8_E4M3,
       {"scale", "per-token", "hadamard", "sinks", "pre-rope", "smooth", "qsmooth", "residual",
        "residual-int8", "block"}},
      {"fp8_e5m2",
       Kind::Codec,
       "OCP fp8 E5M2, like fp8_e4m3",
       KVC_DTYPE_FP8_E5M2,
       {"scale", "per-token", "hadamard", "sinks", "pre-rope", "smooth", "qsmooth", "residual",
        "residual-int8", "block"}},
      {"int8",
       Kind::Codec,
       "int8, symmetric, f32 scale per token and KV head (per-token, default; vLLM style) or per "
       "group of G values",
       KVC_DTYPE_INT8,
       {"per-token", "group", "asym", "scale-f16", "hadamard", "full-range", "sinks", "pre-rope",
        "smooth", "qsmooth", "outliers", "residual", "residual-int8", "block"}},
      {"int4",
       Kind::Codec,
       "int4, f16 scale per group of G values of a token's row (default G=32, symmetric); "
       "full-range: all 16 codes, llama.cpp q4_0's rule; hadamard: rotate heads first (QuaRot)",
       KVC_DTYPE_INT4,
       {"group", "per-token", "asym", "scale-f32", "hadamard", "kchannel", "full-range", "sinks",
        "pre-rope", "smooth", "qsmooth", "outliers", "codebook", "residual", "residual-int8",
        "block"}},
      {"int3",
       Kind::Codec,
       "int3 (eight codes in three bytes), f16 scale per group of G values (default G=32, "
       "symmetric), like "
       "int4; kchannel=G: keys per channel over G tokens (KVQuant-style 3-bit keys)",
       KVC_DTYPE_INT3,
       {"group", "per-token", "asym", "scale-f32", "hadamard", "kchannel", "full-range", "sinks",
        "pre-rope", "smooth", "qsmooth", "outliers", "codebook", "residual", "residual-int8",
        "block"}},
      {"int2",
       Kind::Codec,
       "int2, asymmetric f16 scale and zero per group of G values (default 32); sym or full-range: "
       "symmetric",
       KVC_DTYPE_INT2,
       {"group", "per-token", "sym", "scale-f32", "hadamard", "kchannel", "full-range", "sinks",
        "pre-rope", "smooth", "qsmooth", "outliers", "codebook", "residual", "residual-int8",
        "block"}},
      {"kivi2",
       Kind::Codec,
       "KIVI (arXiv 2402.02750) 2-bit: K per channel over G tokens, V per group of G values, "
       "asymmetric, newest R tokens in f16 (default G=32, R=32)",
       KVC_DTYPE_INT2,
       {"group", "residual", "residual-int8", "sinks", "pre-rope"}},
      {"kivi4",
       Kind::Codec,
       "KIVI 4-bit, like kivi2",
       KVC_DTYPE_INT4,
       {"group", "residual", "residual-int8", "sinks", "pre-rope"}},
      {"hybrid",
       Kind::Codec,
       "recent-high / old-low precision: newest fraction of the sequence in f16, older tokens "
       "re-encoded as int4 as they age (V per group of 32 values, K per channel over kchannel=16 "
       "tokens; default fraction=0.25)",
       KVC_DTYPE_INT4,
       {"fraction", "group", "kchannel", "sinks", "pre-rope", "residual-int8"}},
      {"full", Kind::Policy, "keep every token (no eviction; the default)", KVC_DTYPE_F32, {}},
      {"streaming",
       Kind::Policy,
       "StreamingLLM (arXiv 2309.17453): sinks=S first tokens + the newest, at most ceil(budget x "
       "ctx) "
       "per layer (or tokens=N), keys re-rotated to positions within the cache (stream protocol; "
       "default "
       "S=4, budget=0.3)",
       KVC_DTYPE_F32,
       {"budget", "tokens", "sinks", "keep-positions", "headwise"}},
      {"window",
       Kind::Policy,
       "sliding window: streaming without sinks (stream protocol); keep-positions: keys keep their "
       "text "
       "positions (no re-rotation), for both",
       KVC_DTYPE_F32,
       {"budget", "tokens", "keep-positions", "headwise"}},
      {"h2o",
       Kind::Policy,
       "H2O (arXiv 2306.14048): heavy hitters by accumulated attention + a recent window of "
       "recent x budget tokens (stream protocol; default recent=0.5, budget=0.3)",
       KVC_DTYPE_F32,
       {"budget", "tokens", "recent", "headwise"}},
      {"tova",
       Kind::Policy,
       "TOVA (arXiv 2401.06104): top tokens by the latest query's attention (stream protocol)",
       KVC_DTYPE_F32,
       {"budget", "tokens", "headwise"}},
      {"snapkv",
       Kind::Policy,
       "SnapKV (arXiv 2404.14469): after a prefill of prefill x ctx tokens, keep budget x P by the "
       "attention of the last window=W prefill queries, pooled (kernel, pool=max|avg) "
       "(prefill-compress protocol; default W=16, kernel=7, prefill=0.5)",
       KVC_DTYPE_F32,
       {"budget", "window", "kernel", "pool", "prefill", "headwise"}},
      {"knorm",
       Kind::Policy,
       "Knorm (arXiv 2406.11430, kvpress KnormPress): keep the tokens whose keys have the smallest "
       "L2 norm, mean over KV heads; query-agnostic, no attention observed "
       "(prefill-compress protocol like kvpress's, default prefill=0.5; stream: the stream "
       "protocol's per-layer cap instead)",
       KVC_DTYPE_F32,
       {"budget", "tokens", "prefill", "stream", "headwise"}},
      {"expected-attention",
       Kind::Policy,
       "ExpectedAttention (arXiv 2510.00636, kvpress ExpectedAttentionPress): keep the tokens the "
       "future queries are expected to attend, from the mean and covariance of the queries seen "
       "(all prefill queries), rotated over the next future=N positions (default 512), times the "
       "value norm; sinks=S first tokens kept (default 4) (prefill-compress protocol, "
       "prefill=0.5; stream: the stream protocol's cap, queries of every step)",
       KVC_DTYPE_F32,
       {"budget", "tokens", "prefill", "stream", "future", "sinks", "headwise"}},
      {"kvzip",
       Kind::Policy,
       "KVzip (arXiv 2505.23416, kvpress KVzipPress): keep the tokens that get the largest "
       "attention (max over the queries and each KV head's query heads, summed over KV heads) "
       "while the model reconstructs the prefill from the cache: a repeat prompt and the context "
       "again, chunk=N context tokens per pass (default 128) on a fork of the sequence; layers "
       "share the budget; sinks=S first tokens kept (default 4); query-agnostic "
       "(prefill-compress protocol, prefill=0.5)",
       KVC_DTYPE_F32,
       {"budget", "prefill", "chunk", "sinks", "headwise"}},
      {"duo-attention",
       Kind::Policy,
       "DuoAttention (arXiv 2410.10819): a head-wise pool whose streaming KV heads keep sinks=S "
       "first tokens and the newest window=W (default 4 + 64), the others every token; heads=F "
       "of the heads stream (default 0.5), those with the lowest gates (--head-gates, or the "
       "model's gates from bench/duo); stream-head=I: only head I streams (gate derivation) "
       "(stream protocol)",
       KVC_DTYPE_F32,
       {"heads", "window", "sinks", "stream-head"}},
      {"adakv",
       Kind::Wrapper,
       "AdaKV (arXiv 2407.11550, kvpress AdaKVPress), a wrapper of any scorer "
       "(adakv+kvzip:budget=0.3): a head-wise pool (KVC_POOL_HEADWISE) whose layers share their "
       "budget across KV heads by the scorer's scores, each head keeping at least floor=F of its "
       "own (default 0.2); frees each head's own blocks",
       KVC_DTYPE_F32,
       {"floor"}},
      {"pyramidkv",
       Kind::Policy,
       "PyramidKV (arXiv 2406.02069): SnapKV's selection with per-layer budgets falling with depth "
       "(schedule=paper|linear) (prefill-compress protocol)",
       KVC_DTYPE_F32,
       {"budget", "window", "kernel", "pool", "prefill", "schedule", "headwise"}},
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

double number(const std::string &where, const std::string &key, const std::string &value, double lo,
              double hi) {
  char *end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  const bool hex = value.find_first_of("xX") != std::string::npos;  // strtod reads 0x10 as 16
  if (value.empty() || hex || end != value.c_str() + value.size() || !(v >= lo && v <= hi)) {
    char range[96];
    std::snprintf(range, sizeof range, "[%g, %g]", lo, hi);
    throw RunnerError(where + "parameter " + key + "=" + value + " must be a decimal number in " +
                      range);
  }
  return v;
}

// A count parameter: a whole decimal number in [lo, hi].
std::uint32_t whole(const std::string &where, const std::string &key, const std::string &value,
                    double lo, double hi) {
  const double v = number(where, key, value, lo, hi);
  if (v != std::floor(v))
    throw RunnerError(where + "parameter " + key + "=" + value + " must be a whole number");
  return static_cast<std::uint32_t>(v);
}

// Turns the codec part into the pool's kvc_codec settings.
void resolve_codec(Strategy &st, const std::string &where) {
  const std::string &name = st.codec.name;
  if (name == "f32" || name == "f16" || name == "bf16") return;
  st.quantized = st.k_quantized = st.v_quantized = true;
  st.k_dtype = st.v_dtype = KVC_DTYPE_F16;  // the codecs decide the storage
  kvc_codec c;
  kvc_codec_init(&c);
  c.scale_dtype = name == "int8" ? KVC_DTYPE_F32 : KVC_DTYPE_F16;
  bool per_token = false, asym = false, sym = false, hadamard = false, full_range = false,
       codebook = false, codebook_fit = false;
  std::uint32_t group = 32, residual = 32, kchannel = 0, outliers = 0, block = 0;
  bool has_residual = false;
  // residual=R: the newest R tokens of each layer stay in f16 (a KIVI residual
  // window on any fp8 / integer codec); block=N: the pool's block size (small
  // blocks keep a short residual window cheap: its blocks hold N tokens).
  const auto window_and_block = [&] {
    if (has_residual) st.residual_window = residual;
    if (!block) return;
    if (kchannel && block % kchannel != 0)
      throw RunnerError(where + "block=" + std::to_string(block) + " must be a multiple of " +
                        "kchannel=" + std::to_string(kchannel));
    if (block & (block - 1))
      throw RunnerError(where + "block=" + std::to_string(block) + " must be a power of two");
    st.block_size = block;
    st.block_explicit = true;
  };
  double scale = -1.0, fraction = 0.25;
  for (const auto &[key, value] : st.codec.params) {
    if (key == "per-token")
      per_token = true;
    else if (key == "asym")
      asym = true;
    else if (key == "sym")
      sym = true;
    else if (key == "hadamard")
      hadamard = true;
    else if (key == "full-range")
      full_range = true;
    else if (key == "scale-f32")
      c.scale_dtype = KVC_DTYPE_F32;
    else if (key == "scale-f16")
      c.scale_dtype = KVC_DTYPE_F16;
    else if (key == "group")
      group = whole(where, key, value, 1, 4096);
    else if (key == "kchannel")
      kchannel = whole(where, key, value, 1, 4096);
    else if (key == "residual") {
      residual = whole(where, key, value, 0, 65536);
      has_residual = true;
    } else if (key == "residual-int8")
      st.residual_dtype = KVC_DTYPE_INT8;
    else if (key == "block")
      block = whole(where, key, value, 1, 4096);
    else if (key == "pre-rope")
      st.pre_rope_keys = true;
    else if (key == "outliers")
      outliers = whole(where, key, value, 1, 16);
    else if (key == "codebook") {
      if (!value.empty() && value != "fit")
        throw RunnerError(where +
                          "codebook takes no value (the Gaussian levels) or 'fit' (levels "
                          "fitted to the model's own K/V), not '" +
                          value + "'");
      codebook = true;
      codebook_fit = value == "fit";
    } else if (key == "smooth")
      st.key_smooth = value.empty() ? 1.0 : number(where, key, value, 0.05, 1.0);
    else if (key == "qsmooth")
      st.key_qsmooth = number(where, key, value, 0.05, 1.0);
    else if (key == "sinks")
      st.residual_sinks = whole(where, key, value, 1, 4096);
    else if (key == "scale")
      scale = number(where, key, value, 1e-30, 1e30);
    else if (key == "fraction")
      fraction = number(where, key, value, 0.0, 0.99);
    if ((key == "hadamard" || key == "per-token" || key == "asym" || key == "sym" ||
         key == "full-range" || key == "pre-rope" || key == "scale-f32" || key == "scale-f16" ||
         key == "residual-int8") &&
        !value.empty())
      throw RunnerError(where + "'" + key + "' is a flag and takes no value");
  }
  const auto &reg = registry();
  c.dtype = std::find_if(reg.begin(), reg.end(), [&](const Component &x) {
              return name == x.name;
            })->dtype;
  if (name == "fp8_e4m3" || name == "fp8_e5m2") {
    if (per_token) {
      c.granularity = KVC_SCALE_PER_TOKEN;
    } else {
      c.granularity = KVC_SCALE_PER_TENSOR;
      c.static_scale = 1;
      c.scale = scale > 0 ? scale : 1.0;
    }
    if (hadamard) c.rotation = KVC_ROTATION_HADAMARD;
    st.k_codec = st.v_codec = c;
    window_and_block();
    return;
  }
  if (name == "kivi2" || name == "kivi4") {
    c.asymmetric = 1;
    kvc_codec k = c, v = c;
    k.granularity = KVC_SCALE_PER_CHANNEL;
    k.group_size = group;
    v.granularity = KVC_SCALE_PER_GROUP;
    v.group_size = group;
    st.k_codec = k;
    st.v_codec = v;
    st.residual_window = residual;
    st.block_size = std::max<std::uint32_t>(16, group);
    if (st.block_size % group != 0)
      throw RunnerError(where + "group " + std::to_string(group) +
                        " must divide 16 or be a multiple of it");
    return;
  }
  // kchannel=G: keys per channel over G tokens (KIVI's key quantization; the
  // pool stages up to G tokens in f16 until a group is complete).
  auto key_channels = [&](kvc_codec &k) {
    if (!kchannel) return;
    k.granularity = KVC_SCALE_PER_CHANNEL;
    k.group_size = kchannel;
    k.rotation = KVC_ROTATION_NONE;
    st.block_size = std::max<std::uint32_t>(16, kchannel);
    if (st.block_size % kchannel != 0)
      throw RunnerError(where + "kchannel " + std::to_string(kchannel) +
                        " must divide 16 or be a multiple of it");
  };
  if (name == "hybrid") {
    if (!kchannel) kchannel = 16;
    c.granularity = KVC_SCALE_PER_GROUP;
    c.group_size = group;
    st.k_codec = st.v_codec = c;
    key_channels(st.k_codec);
    st.residual_fraction = fraction;
    return;
  }
  // int8 / int4 / int3 / int2
  const bool has_group = std::any_of(st.codec.params.begin(), st.codec.params.end(),
                                     [](const auto &kv) { return kv.first == "group"; });
  if (name == "int8")
    c.granularity = has_group ? KVC_SCALE_PER_GROUP : KVC_SCALE_PER_TOKEN;
  else
    c.granularity = per_token ? KVC_SCALE_PER_TOKEN : KVC_SCALE_PER_GROUP;
  c.group_size = group;
  if (full_range && asym)
    throw RunnerError(where + "full-range is symmetric: it cannot be combined with asym");
  c.asymmetric = name == "int2" ? (sym || full_range ? 0 : 1) : (asym ? 1 : 0);
  c.full_range = full_range ? 1 : 0;
  if (hadamard) c.rotation = KVC_ROTATION_HADAMARD;
  if (outliers) {
    if (c.asymmetric)
      throw RunnerError(where + "outliers=" + std::to_string(outliers) +
                        " needs symmetric codes: add full-range (or sym for int2), drop asym");
    if (kchannel)
      throw RunnerError(where + "outliers apply to per-token or per-group scales, not kchannel");
    c.outliers = outliers;
  }
  if (codebook) {  // kvc_pool_set_codebook: symmetric codes, the group's signed extreme as scale
    if (asym || full_range || outliers)
      throw RunnerError(where +
                        "codebook replaces the level rule: drop asym, full-range and outliers");
    if (kchannel)
      throw RunnerError(where + "codebook applies to per-token or per-group scales, not kchannel");
    c.asymmetric = 0;  // int2's default (asymmetric) gives way
    st.codebook[0] = st.codebook[1] = true;
    st.codebook_fit[0] = st.codebook_fit[1] = codebook_fit;
  }
  st.k_codec = st.v_codec = c;
  key_channels(st.k_codec);
  window_and_block();
}

// Turns the policy part into the eviction settings.
void resolve_policy(Strategy &st, const std::string &where) {
  if (!st.has_policy) return;
  const std::string &name = st.policy.name;
  if (name == "full") return;
  if (st.residual_window || st.residual_fraction > 0.0 || st.residual_sinks ||
      (st.k_quantized && st.k_codec.granularity == KVC_SCALE_PER_CHANNEL))
    throw RunnerError(
        where +
        "eviction cannot be combined with a residual window, hybrid precision, "
        "per-channel keys or sinks= (tokens are staged and encoded as they age); use a "
        "per-token or group-wise codec");
  st.budget = 0.3;
  for (const auto &[key, value] : st.policy.params) {
    if (key == "budget")
      st.budget = number(where, key, value, 0.001, 1.0);
    else if (key == "keep-positions" || key == "stream" || key == "headwise") {
      if (!value.empty()) throw RunnerError(where + "'" + key + "' is a flag and takes no value");
    } else if (key == "tokens") {
      const double t =
          number(where, key, value, 2, 1 << 24);  // the library keeps one earlier token at least
      if (t != std::floor(t))
        throw RunnerError(where + "parameter tokens=" + value + " must be a whole number");
      st.budget_tokens = static_cast<std::uint32_t>(t);
    } else if (key == "sinks")
      st.sinks = whole(where, key, value, 0, 4096);
    else if (key == "recent")
      st.recent_fraction = number(where, key, value, 0.0, 1.0);
    else if (key == "future") {
      const double f = number(where, key, value, 1, 1 << 20);
      if (f != std::floor(f))
        throw RunnerError(where + "parameter future=" + value + " must be a whole number");
      st.future_positions = static_cast<std::uint32_t>(f);
    } else if (key == "window" && name != "duo-attention")
      st.obs_window = whole(where, key, value, 1, 65536);
    else if (key == "kernel") {
      st.kernel = whole(where, key, value, 1, 1025);
      if (st.kernel % 2 == 0) throw RunnerError(where + "kernel must be odd");
    } else if (key == "pool") {
      if (value == "max")
        st.pooling = KVC_POOLING_MAX;
      else if (value == "avg")
        st.pooling = KVC_POOLING_AVG;
      else
        throw RunnerError(where + "pool must be max or avg");
    } else if (key == "chunk") {
      const double c = number(where, key, value, 1, 1 << 16);
      if (c != std::floor(c))
        throw RunnerError(where + "parameter chunk=" + value + " must be a whole number");
      st.recon_chunk = static_cast<std::uint32_t>(c);
    } else if (key == "prefill")
      st.prefill_fraction = number(where, key, value, 0.01, 0.99);
    else if (key == "schedule") {
      if (value == "paper")
        st.schedule = KVC_PYRAMID_PAPER;
      else if (value == "linear")
        st.schedule = KVC_PYRAMID_LINEAR;
      else
        throw RunnerError(where + "schedule must be paper or linear");
    }
  }
  st.headwise = std::any_of(st.policy.params.begin(), st.policy.params.end(),
                            [](const auto &kv) { return kv.first == "headwise"; });
  const bool has_budget = std::any_of(st.policy.params.begin(), st.policy.params.end(),
                                      [](const auto &kv) { return kv.first == "budget"; });
  if (has_budget && st.budget_tokens)
    throw RunnerError(where + "give budget=FRACTION or tokens=N, not both");
  if (name == "window") st.sinks = 0;
  if (name == "streaming" || name == "window") {
    if (st.budget_tokens && st.budget_tokens <= st.sinks)
      throw RunnerError(where + "tokens=" + std::to_string(st.budget_tokens) +
                        " leaves no room for the window after " + std::to_string(st.sinks) +
                        " sinks");
    st.policy_kind = KVC_POLICY_STREAMING;
    st.shift_positions = std::none_of(st.policy.params.begin(), st.policy.params.end(),
                                      [](const auto &kv) { return kv.first == "keep-positions"; });
    st.protocol = Strategy::Protocol::Stream;
  } else if (name == "h2o") {
    st.policy_kind = KVC_POLICY_H2O;
    st.observe = KVC_OBSERVE_ACCUMULATE;
    st.protocol = Strategy::Protocol::Stream;
  } else if (name == "tova") {
    st.policy_kind = KVC_POLICY_TOVA;
    st.observe = KVC_OBSERVE_REPLACE;
    st.protocol = Strategy::Protocol::Stream;
  } else if (name == "knorm" || name == "expected-attention") {
    const bool stream = std::any_of(st.policy.params.begin(), st.policy.params.end(),
                                    [](const auto &kv) { return kv.first == "stream"; });
    const bool prefill = std::any_of(st.policy.params.begin(), st.policy.params.end(),
                                     [](const auto &kv) { return kv.first == "prefill"; });
    if (stream && prefill)
      throw RunnerError(where +
                        "'stream' caps every pass; 'prefill' is the prefill-compress "
                        "protocol's: give one of them");
    if (st.budget_tokens && !stream)
      throw RunnerError(where + "tokens=N is a per-layer cap: add 'stream' (or give budget=)");
    st.protocol = stream ? Strategy::Protocol::Stream : Strategy::Protocol::PrefillCompress;
    st.policy_kind = KVC_POLICY_KNORM;
    if (name == "expected-attention") {
      st.policy_kind = KVC_POLICY_EXPECTED_ATTENTION;
      st.observe = KVC_OBSERVE_QUERIES;
      st.obs_window = 1u << 30;  // every prefill query feeds the statistics
    }
  } else if (name == "kvzip") {
    st.policy_kind = KVC_POLICY_KVZIP;
    st.observe = KVC_OBSERVE_NONE;  // the prefill itself is not observed: the reconstruction is
    st.reconstruct = true;
    st.protocol = Strategy::Protocol::PrefillCompress;
  } else if (name == "duo-attention") {
    for (const auto &[key, value] : st.policy.params) {
      if (key == "heads") st.duo_stream_share = number(where, key, value, 0.0, 1.0);
      if (key == "window") st.duo_window = whole(where, key, value, 1, 1 << 20);
      if (key == "stream-head")
        st.duo_stream_head = static_cast<int>(whole(where, key, value, 0, 1 << 20));
    }
    if (std::any_of(st.policy.params.begin(), st.policy.params.end(),
                    [](const auto &kv) { return kv.first == "heads"; }) &&
        st.duo_stream_head >= 0)
      throw RunnerError(where + "give heads=F or stream-head=I, not both");
    st.policy_kind = KVC_POLICY_DUO_ATTENTION;
    st.protocol = Strategy::Protocol::Stream;
    st.headwise = true;
  } else if (name == "snapkv" || name == "pyramidkv") {
    st.policy_kind = name == "snapkv" ? KVC_POLICY_SNAPKV : KVC_POLICY_PYRAMIDKV;
    st.observe = KVC_OBSERVE_ACCUMULATE;
    st.protocol = Strategy::Protocol::PrefillCompress;
  }
}

}  // namespace

namespace {
Strategy parse_base(const std::string &spec);

// "0.3.8-11": layer indices (ascending once sorted, each once).
std::vector<std::uint32_t> parse_layers(const std::string &where, const std::string &text) {
  std::vector<std::uint32_t> out;
  for (const std::string &item : split(text, '.')) {
    const std::size_t dash = item.find('-');
    const std::string a = dash == std::string::npos ? item : item.substr(0, dash);
    const std::string b = dash == std::string::npos ? item : item.substr(dash + 1);
    auto index = [&](const std::string &x) {
      if (x.empty() || x.size() > 4 || x.find_first_not_of("0123456789") != std::string::npos)
        throw RunnerError(where + "layers '" + text +
                          "': expected indices and ranges joined by '.', like 0.3.8-11");
      return static_cast<std::uint32_t>(std::stoul(x));
    };
    const std::uint32_t lo = index(a), hi = index(b);
    if (hi < lo) throw RunnerError(where + "layers '" + text + "': range " + item + " is empty");
    for (std::uint32_t l = lo; l <= hi; ++l) out.push_back(l);
  }
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end())
    throw RunnerError(where + "layers '" + text + "': a layer is listed twice");
  return out;
}

// A strategy's codecs as the pool takes them (plain storage: a float codec).
kvc_codec codec_or_plain(bool quantized, const kvc_codec &c, kvc_dtype plain) {
  if (quantized) return c;
  kvc_codec p;
  kvc_codec_init(&p);
  p.dtype = plain;
  p.granularity = KVC_SCALE_NONE;
  return p;
}
}  // namespace

Strategy parse_strategy(const std::string &spec) {
  const std::string where = "strategy '" + spec + "': ";
  const std::vector<std::string> parts = split(spec, '@');
  Strategy st = parse_base(parts[0]);
  if (parts.size() == 1) return st;
  // Per-layer codecs: BASE@LAYERS=CODECS@...
  if (st.has_policy || st.has_wrapper)
    throw RunnerError(where + "per-layer codecs (@LAYERS=...) take no eviction policy here");
  if (st.k_codec.granularity == KVC_SCALE_PER_CHANNEL ||
      st.v_codec.granularity == KVC_SCALE_PER_CHANNEL || st.headwise || st.codebook_fit[0] ||
      st.codebook_fit[1])
    throw RunnerError(where +
                      "per-layer codecs (@LAYERS=...) take per-token, per-group and per-tensor "
                      "codecs (no kivi, hybrid or kchannel; codebook, not codebook=fit)");
  std::vector<std::uint32_t> seen;
  std::string text = st.spec;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const std::size_t eq = parts[i].find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == parts[i].size())
      throw RunnerError(where + "'@" + parts[i] +
                        "': expected @LAYERS=CODECS, like @0.1=k-int8+v-int8");
    Strategy::LayerPart lp;
    lp.layers = parse_layers(where, parts[i].substr(0, eq));
    if (parts[i].find("residual-int8") != std::string::npos)
      throw RunnerError(where + "'@" + parts[i] +
                        "': residual-int8 stores every layer's residual rows: give it on the base");
    const Strategy alt = parse_base(parts[i].substr(eq + 1));
    if (alt.residual_window)
      throw RunnerError(where + "'@" + parts[i] +
                        "': residual= keeps every layer's newest tokens: give it on the base");
    if (alt.has_policy || alt.has_wrapper || alt.residual_fraction > 0.0 ||
        alt.k_codec.granularity == KVC_SCALE_PER_CHANNEL ||
        alt.v_codec.granularity == KVC_SCALE_PER_CHANNEL || alt.headwise)
      throw RunnerError(where + "'@" + parts[i] +
                        "': a layer's part takes codecs only (per-token, per-group or per-tensor)");
    // What applies to the whole pool is the base's: a part may repeat it, not change it.
    if ((alt.residual_sinks && alt.residual_sinks != st.residual_sinks) ||
        (alt.pre_rope_keys && !st.pre_rope_keys) ||
        (alt.key_smooth > 0.0 && alt.key_smooth != st.key_smooth) ||
        (alt.key_qsmooth > 0.0 && alt.key_qsmooth != st.key_qsmooth))
      throw RunnerError(
          where + "'@" + parts[i] +
          "': sinks, pre-rope, smooth and qsmooth apply to every layer: give them on the "
          "base (a layer's part may repeat the base's)");
    for (int kv = 0; kv < 2; ++kv) {
      // int8 / fp8 layers of a codebook part keep their uniform codes (no levels)
      const kvc_codec &ac = kv ? alt.v_codec : alt.k_codec;
      const bool wide = (kv ? alt.v_quantized : alt.k_quantized) &&
                        (ac.dtype == KVC_DTYPE_INT8 || ac.dtype == KVC_DTYPE_FP8_E4M3 ||
                         ac.dtype == KVC_DTYPE_FP8_E5M2);
      if ((alt.codebook[kv] != st.codebook[kv] && !(st.codebook[kv] && wide)) ||
          alt.codebook_fit[kv])
        throw RunnerError(where + "'@" + parts[i] + "': " + (kv ? "values" : "keys") +
                          " take a codebook in every layer or in none, but for int8 and fp8 "
                          "layers, which keep their uniform codes (codebook, not "
                          "codebook=fit): as the base");
    }
    // A part that names no block size takes the base's block=.
    if (alt.block_size != st.block_size && (alt.block_explicit || !st.block_explicit))
      throw RunnerError(where + "'@" + parts[i] + "': its block size differs from the base's");
    lp.k = codec_or_plain(alt.k_quantized, alt.k_codec, alt.k_dtype);
    lp.v = codec_or_plain(alt.v_quantized, alt.v_codec, alt.v_dtype);
    for (std::uint32_t l : lp.layers) {
      if (std::find(seen.begin(), seen.end(), l) != seen.end())
        throw RunnerError(where + "layer " + std::to_string(l) + " is in two @ parts");
      seen.push_back(l);
    }
    lp.text = parts[i].substr(0, eq) + "=" + alt.spec;
    text += "@" + lp.text;
    st.layer_parts.push_back(std::move(lp));
  }
  st.spec = text;
  return st;
}

namespace {
Strategy parse_base(const std::string &spec) {
  const std::string where = "strategy '" + spec + "': ";
  if (spec.empty()) throw RunnerError("empty strategy spec");
  if (spec.find_first_of(" \t,") != std::string::npos) {
    throw RunnerError(
        where + "contains a space or comma (specs are like f16 or h2o:budget=0.3+int4:group=32)");
  }
  Strategy st;
  bool has_codec = false;
  for (const std::string &part_str : split(spec, '+')) {
    if (part_str.empty()) throw RunnerError(where + "empty part around '+'");
    const std::vector<std::string> fields = split(part_str, ':');
    StrategyPart part;
    part.name = fields[0];
    // "k-NAME" / "v-NAME": a codec for keys or values only.
    char side = 0;
    std::string prefix;
    if (part.name.size() > 2 && (part.name[0] == 'k' || part.name[0] == 'v') &&
        part.name[1] == '-') {
      side = part.name[0];
      prefix = part.name.substr(0, 2);
      part.name = part.name.substr(2);
    }
    if (!valid_word(part.name, false)) {
      throw RunnerError(where + "malformed name '" + part.name +
                        "' (use lower-case letters, digits, '_', '.', '-')");
    }
    const auto it = std::find_if(registry().begin(), registry().end(),
                                 [&](const Component &c) { return part.name == c.name; });
    if (it == registry().end()) {
      throw RunnerError(where + "unknown codec or policy '" + part.name +
                        "' (known: " + known_names() + ")");
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
      if (std::any_of(part.params.begin(), part.params.end(),
                      [&](const auto &kv) { return kv.first == key; }))
        throw RunnerError(where + "parameter '" + key + "' of '" + part.name + "' is given twice");
      part.params.emplace_back(std::move(key), std::move(value));
    }
    if (it->kind == Kind::Codec) {
      if (side != 0) {
        if (has_codec)
          throw RunnerError(where + "give one codec for K and V or k-/v- codecs, not both");
        StrategyPart &slot = side == 'k' ? st.k_part : st.v_part;
        if (!slot.name.empty())
          throw RunnerError(where + "more than one " + (side == 'k' ? "key" : "value") +
                            " codec ('" + prefix + slot.name + "' and '" + prefix + part.name +
                            "')");
        if (part.name == "kivi2" || part.name == "kivi4" || part.name == "hybrid")
          throw RunnerError(where + "'" + part.name +
                            "' sets keys and values together; it takes no k-/v- prefix");
        auto has = [&](const char *key) {
          return std::any_of(part.params.begin(), part.params.end(),
                             [&](const auto &kv) { return kv.first == key; });
        };
        if (side == 'v' && has("kchannel"))
          throw RunnerError(where + "kchannel quantizes keys; use it on the k- codec");
        // Per-channel keys are stored unrotated: on a k- codec the flag would do nothing.
        if (side == 'k' && has("kchannel") && has("hadamard"))
          throw RunnerError(
              where +
              "'hadamard' does not apply to per-channel keys (kchannel): they are stored "
              "unrotated; drop one of them");
        st.split_kv = true;
        slot = part;
        continue;
      }
      if (st.split_kv)
        throw RunnerError(where + "give one codec for K and V or k-/v- codecs, not both");
      if (has_codec)
        throw RunnerError(where + "more than one codec ('" + st.codec.name + "' and '" + part.name +
                          "')");
      has_codec = true;
      st.codec = part;
      st.k_dtype = st.v_dtype = it->dtype;
    } else if (it->kind == Kind::Wrapper) {
      if (side != 0)
        throw RunnerError(where + "'" + prefix + part.name +
                          "': only codecs take a k- or v- prefix");
      if (st.has_wrapper) throw RunnerError(where + "more than one '" + part.name + "'");
      st.has_wrapper = true;
      st.wrapper = part;
    } else {
      if (side != 0)
        throw RunnerError(where + "'" + prefix + part.name +
                          "': only codecs take a k- or v- prefix");
      if (st.has_policy)
        throw RunnerError(where + "more than one policy ('" + st.policy.name + "' and '" +
                          part.name + "')");
      st.has_policy = true;
      st.policy = part;
    }
  }
  if (st.split_kv) {
    // Each side is resolved as if it stored both, then keeps its own half.
    auto side_of = [&](const StrategyPart &p) {
      Strategy one;
      one.codec = p;
      if (one.codec.name.empty()) one.codec.name = "f16";  // the pool's default storage dtype
      const auto &reg = registry();
      one.k_dtype = one.v_dtype = std::find_if(reg.begin(), reg.end(), [&](const Component &x) {
                                    return one.codec.name == x.name;
                                  })->dtype;
      resolve_codec(one, where);
      return one;
    };
    const Strategy k = side_of(st.k_part), v = side_of(st.v_part);
    st.k_dtype = k.k_dtype;
    st.k_codec = k.k_codec;
    st.k_quantized = k.k_quantized;
    st.v_dtype = v.v_dtype;
    st.v_codec = v.v_codec;
    st.v_quantized = v.v_quantized;
    st.quantized = st.k_quantized || st.v_quantized;
    if (k.block_explicit && v.block_explicit)
      throw RunnerError(where +
                        "block= sizes the pool's blocks: give it once (on the k- or the v- "
                        "codec)");
    if (k.residual_window && v.residual_window)
      throw RunnerError(where +
                        "residual= keeps keys and values of the newest tokens: give it "
                        "once (on the k- or the v- codec)");
    st.residual_window = std::max(k.residual_window, v.residual_window);
    if (k.residual_dtype == KVC_DTYPE_INT8 && v.residual_dtype == KVC_DTYPE_INT8)
      throw RunnerError(where +
                        "residual-int8 stores keys and values of the residual: give it once (on "
                        "the k- or the v- codec)");
    st.residual_dtype = k.residual_dtype == KVC_DTYPE_INT8 ? k.residual_dtype : v.residual_dtype;
    st.block_explicit = k.block_explicit || v.block_explicit;
    const Strategy &sized = k.block_explicit ? k : v;
    const Strategy &other = k.block_explicit ? v : k;
    for (const kvc_codec *oc : {&other.k_codec, &other.v_codec})
      if (st.block_explicit && oc->granularity == KVC_SCALE_PER_CHANNEL &&
          sized.block_size % oc->group_size != 0)
        throw RunnerError(where + "block=" + std::to_string(sized.block_size) +
                          " must be a multiple of kchannel=" + std::to_string(oc->group_size));
    st.block_size = st.block_explicit ? sized.block_size : std::max(k.block_size, v.block_size);
    if (k.residual_sinks && v.residual_sinks)
      throw RunnerError(where +
                        "sinks= keeps keys and values of the first tokens: give it once (on the k- "
                        "or the v- codec)");
    st.residual_sinks = std::max(k.residual_sinks, v.residual_sinks);
    if (v.pre_rope_keys)
      throw RunnerError(where + "pre-rope quantizes keys before RoPE: give it on the k- codec");
    st.pre_rope_keys = k.pre_rope_keys;
    if (v.key_smooth > 0.0 || v.key_qsmooth > 0.0)
      throw RunnerError(where + "smooth scales key channels: give it on the k- codec");
    st.key_smooth = k.key_smooth;
    st.key_qsmooth = k.key_qsmooth;
    st.codebook[0] = k.codebook[0];
    st.codebook[1] = v.codebook[1];
    st.codebook_fit[0] = k.codebook_fit[0];
    st.codebook_fit[1] = v.codebook_fit[1];
  } else {
    if (!has_codec) st.codec.name = "f16";  // the pool's default storage dtype
    resolve_codec(st, where);
  }
  // Attention sinks are kept from a quantized codec, in one block.
  if (st.residual_sinks) {
    if (!st.quantized)
      throw RunnerError(
          where +
          "sinks= keeps the first tokens from being quantized: it needs an fp8 or integer codec");
    if (st.residual_sinks > st.block_size)
      throw RunnerError(where + "sinks=" + std::to_string(st.residual_sinks) +
                        " is above the block size of " + std::to_string(st.block_size));
  }
  // Int8 residual rows need a residual arena to store.
  if (st.residual_dtype == KVC_DTYPE_INT8) {
    const bool staged = st.residual_window || st.residual_fraction > 0.0 || st.residual_sinks ||
                        (st.k_quantized && st.k_codec.granularity == KVC_SCALE_PER_CHANNEL) ||
                        (st.v_quantized && st.v_codec.granularity == KVC_SCALE_PER_CHANNEL);
    if (!staged)
      throw RunnerError(where +
                        "residual-int8 stores the residual's rows as int8: it needs residual=, "
                        "sinks=, kchannel= or a hybrid / kivi codec");
  }
  // Key smoothing scales the channels of quantized keys (kvc_pool_set_key_smoothing).
  if (st.key_qsmooth > 0.0 && st.key_smooth <= 0.0)
    throw RunnerError(where + "qsmooth weighs the key smoothing by the queries: give smooth too");
  if (st.key_smooth > 0.0) {
    if (!st.k_quantized)
      throw RunnerError(where +
                        "smooth scales the channels of quantized keys: it needs an fp8 or "
                        "integer key codec");
    if (st.k_codec.granularity == KVC_SCALE_PER_CHANNEL)
      throw RunnerError(where + "smooth replaces per-channel key scales (kchannel): drop one");
  }
  // "full" is the absence of a policy; normalize it away.
  if (st.has_policy && st.policy.name == "full") st.has_policy = false;
  resolve_policy(st, where);
  if (st.has_wrapper) {  // adakv: head budgets over the policy's scores
    if (!st.has_policy)
      throw RunnerError(where +
                        "'adakv' shares a policy's budget across KV heads: add a policy "
                        "(e.g. adakv+kvzip:budget=0.3)");
    if (st.policy_kind == KVC_POLICY_STREAMING || st.policy_kind == KVC_POLICY_DUO_ATTENTION)
      throw RunnerError(where + "'adakv' needs a policy that scores tokens; '" + st.policy.name +
                        "' keeps sinks and the newest tokens by rule");
    for (const auto &[key, value] : st.wrapper.params)
      if (key == "floor") st.head_floor = number(where, key, value, 0.0, 1.0);
    st.headwise = true;
    st.head_budget = KVC_HEAD_BUDGET_ADAKV;
  }
  if (st.headwise && (st.codebook[0] || st.codebook[1]))
    throw RunnerError(where +
                      "codebook: head-wise pools (the headwise flag, adakv) take no codebook "
                      "(kvc_pool_set_codebook); drop one of them");
  std::string codec_text = part_text(st.codec);
  if (st.split_kv) {
    codec_text.clear();
    if (!st.k_part.name.empty()) codec_text = "k-" + part_text(st.k_part);
    if (!st.v_part.name.empty())
      codec_text += (codec_text.empty() ? "v-" : "+v-") + part_text(st.v_part);
  }
  st.spec = st.has_policy ? part_text(st.policy) + "+" + codec_text : codec_text;
  if (st.has_wrapper) st.spec = part_text(st.wrapper) + "+" + st.spec;
  return st;
}

}  // namespace

std::vector<Strategy> parse_strategy_list(const std::string &list) {
  std::vector<Strategy> out;
  for (const std::string &item : split(list, ',')) {
    if (item.empty()) throw RunnerError("empty item in the strategy list '" + list + "'");
    out.push_back(parse_strategy(item));
  }
  return out;
}

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

namespace kvc_cli {

kvc_runner::PoolSettings pool_settings(const Strategy &s) {
  kvc_runner::PoolSettings ps;
  ps.k_dtype = s.k_dtype;
  ps.v_dtype = s.v_dtype;
  if (s.k_quantized) ps.k_codec = &s.k_codec;
  if (s.v_quantized) ps.v_codec = &s.v_codec;
  ps.residual_window = s.residual_window;
  ps.residual_fraction = s.residual_fraction;
  ps.residual_sinks = s.residual_sinks;
  ps.residual_dtype = s.residual_dtype;
  ps.pre_rope_keys = s.pre_rope_keys;
  ps.headwise = s.headwise;
  ps.block_size = s.block_size;
  for (const Strategy::LayerPart &lp : s.layer_parts)
    for (std::uint32_t l : lp.layers) ps.layer_codecs.push_back({l, lp.k, lp.v});
  return ps;  // (codebooks need the model's geometry: codebook_levels())
}

}  // namespace kvc_cli
