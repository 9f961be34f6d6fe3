// SPDX-License-Identifier: Apache-2.0
// KV-cache strategies of `kvcache eval`: one string names a storage codec and
// an optional eviction policy with their parameters. Grammar (docs/eval.md):
//
//   strategy := part ( '+' part )*          at most one codec (or one k- and one
//                                           v- codec), at most one policy, at most
//                                           one wrapper (adakv) of the policy
//   part     := [ 'k-' | 'v-' ] name ( ':' param )*
//   param    := key '=' value | flag
//   name, key, flag := [a-z0-9_.-]+         value := [A-Za-z0-9_.-]+
//
// e.g. "f16", "int8:per-token", "h2o:budget=0.3+int4:group=32",
// "k-int4:group=48:asym:hadamard+v-int4:per-token:hadamard" (keys and values
// stored with different codecs; an unnamed side stays f16).
#pragma once

#include <kvcache/kvcache.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../runner/kv_cache.h"

namespace kvc_cli {

/// One named component with its parameters, in the order given.
struct StrategyPart {
  std::string name;
  std::vector<std::pair<std::string, std::string>> params;  ///< flag: value ""
};

struct Strategy {
  std::string spec;             ///< canonical text: policy first, then codec
  StrategyPart codec;           ///< storage format of K and V (default f16); unused when split_kv
  bool split_kv = false;        ///< K and V have their own codec parts (k-NAME / v-NAME)
  StrategyPart k_part, v_part;  ///< when split_kv: the parts without their prefix (name "" = f16)
  bool has_policy = false;      ///< false: every token is kept
  StrategyPart policy;          ///< eviction policy when has_policy
  bool has_wrapper = false;     ///< adakv: head budgets over the policy's scores
  StrategyPart wrapper;         ///< the wrapper part when has_wrapper
  // Resolved settings for the pool (what this build can run).
  kvc_dtype k_dtype = KVC_DTYPE_F16;
  kvc_dtype v_dtype = KVC_DTYPE_F16;
  bool quantized = false;    ///< k_codec or v_codec applies (fp8 and integer codecs)
  bool k_quantized = false;  ///< k_codec applies to keys (else keys are stored as k_dtype)
  bool v_quantized = false;  ///< v_codec applies to values
  kvc_codec k_codec{}, v_codec{};
  std::uint32_t residual_window = 0;  ///< KIVI residual (tokens kept in f16)
  double residual_fraction = 0.0;     ///< hybrid: newest fraction kept in f16
  std::uint32_t residual_sinks =
      0;  ///< sinks=N: first N tokens of each layer kept in f16 (KVQuant / IntactKV)
  /// residual-int8: the residual's rows (window, sinks, staged tokens) as int8 with an f16
  /// scale per token and KV head (kvc_pool_config.residual_dtype); else f16.
  kvc_dtype residual_dtype = KVC_DTYPE_F16;
  bool pre_rope_keys =
      false;  ///< pre-rope: keys quantized before RoPE (KVQuant; KVC_POOL_PRE_ROPE_KEYS)
  /// smooth[=A]: per-channel key smoothing from the model's key statistics
  /// (kvc_pool_set_key_smoothing), scale = rms ^ A (default A = 1); 0: none.
  double key_smooth = 0.0;
  /// qsmooth=B: the smoothing's scale divided by the queries' rms ^ B (the
  /// statistics' qrms): channels the queries weigh more get finer codes; 0: none.
  double key_qsmooth = 0.0;
  /// codebook: the part's codes index the built-in Lloyd-Max levels of
  /// Gaussian groups (kvc_pool_set_codebook, kvc_codebook_gaussian); [0] keys, [1] values.
  bool codebook[2] = {false, false};
  /// codebook=fit: the part's levels are fitted to the model's own K/V per
  /// layer (codebook_fit.h) before the run instead of the Gaussian table.
  bool codebook_fit[2] = {false, false};
  std::uint32_t block_size = 16;  ///< pool block size (per-channel groups must divide it)
  bool block_explicit = false;    ///< block=N gave block_size
  /// Per-layer codecs: "BASE@LAYERS=CODECS" parts (kvc_pool_config.layer_k_codecs); each
  /// layer listed stores K and V with that part's codecs instead of the base's.
  struct LayerPart {
    std::vector<std::uint32_t> layers;  ///< ascending, distinct
    std::string text;                   ///< "LAYERS=CODECS" as written (canonical)
    kvc_codec k{}, v{};                 ///< the codecs (plain: a float dtype, KVC_SCALE_NONE)
  };
  std::vector<LayerPart> layer_parts;
  // Eviction (when has_policy): the library policy and the eval protocol.
  enum class Protocol { None, Stream, PrefillCompress };
  Protocol protocol = Protocol::None;
  kvc_policy_kind policy_kind = KVC_POLICY_NONE;
  double budget =
      1.0;  ///< fraction kept: stream caps layers at ceil(budget x ctx); prefill keeps budget x P
  std::uint32_t budget_tokens =
      0;  ///< stream protocol: a fixed cap in tokens per layer instead of budget x ctx
  std::uint32_t sinks = 4;        ///< streaming
  double recent_fraction = 0.5;   ///< h2o
  std::uint32_t obs_window = 16;  ///< snapkv / pyramidkv observation window
  std::uint32_t kernel = 7;       ///< snapkv / pyramidkv pooling kernel
  kvc_pooling pooling = KVC_POOLING_MAX;
  kvc_pyramid_schedule schedule = KVC_PYRAMID_PAPER;
  double prefill_fraction = 0.5;  ///< prefill-compress: P = prefill_fraction x window
  bool shift_positions = false;   ///< StreamingLLM positions within the cache
  kvc_observe observe = KVC_OBSERVE_NONE;
  std::uint32_t future_positions = 512;  ///< expected-attention: positions the rotation averages
  /// kvzip: before the compression the runner reconstructs the prefill on a
  /// fork (a repeat prompt + the context again, chunk by chunk) and records
  /// each token's largest attention (KVC_OBSERVE_MAX).
  bool reconstruct = false;
  std::uint32_t recon_chunk = 128;  ///< kvzip: context tokens per reconstruction pass
  /// headwise (a policy flag) or adakv: a head-wise pool (KVC_POOL_HEADWISE),
  /// each KV head its own kept set and blocks.
  bool headwise = false;
  kvc_head_budget head_budget = KVC_HEAD_BUDGET_UNIFORM;  ///< adakv: KVC_HEAD_BUDGET_ADAKV
  double head_floor = 0.2;                                ///< adakv: floor=F
  /// duo-attention: the share of KV heads that stream (the lowest gates),
  /// their window in tokens (after `sinks`), or (stream-head=I, for deriving
  /// gates) the one head that streams.
  double duo_stream_share = 0.5;
  std::uint32_t duo_window = 64;
  int duo_stream_head = -1;
};

/// The pool settings of a strategy (its codecs are pointed to: `s` must outlive them).
kvc_runner::PoolSettings pool_settings(const Strategy &s);

/// Parses and validates one spec; throws kvc_runner::RunnerError naming what is wrong.
Strategy parse_strategy(const std::string &spec);
/// Splits a comma-separated list and parses each spec (empty items are errors).
std::vector<Strategy> parse_strategy_list(const std::string &list);
/// The strategies `kvcache eval` runs by default, one spec each.
std::vector<std::string> default_strategies();
/// The strategies of `kvcache eval --long`: dense, window-only and StreamingLLM
/// with a cache of 512 tokens (the trained context of the shared model).
std::vector<std::string> default_long_strategies();
/// Known codec and policy names with a one-line description, for --list-strategies and errors.
std::vector<std::pair<std::string, std::string>> known_codecs();
std::vector<std::pair<std::string, std::string>> known_policies();

}  // namespace kvc_cli
