// SPDX-License-Identifier: Apache-2.0
// The default strategy lists of `kvcache eval` (and kvcache.default_strategies
// in Python): the rows docs/eval.md measures.
#include "strategy.h"

namespace kvc_cli {

std::vector<std::string> default_strategies() {
  // The codecs issue's rows at <= 4.5, 3.5, 3.0 and 2.5 mean bits: keys with
  // query-weighted smoothing (C), values rotated with codebooks (V); the
  // lower three also as SmolLM2's best rows: the newest 8 tokens as int8 rows
  // in blocks of 8 (residual=8:block=8:residual-int8), a scale per token for
  // the values (group=192, SmolLM2's 3 KV heads x 64), more bits in the
  // layers a sensitivity scan found most sensitive (docs/eval.md "Int8
  // windows"). Rows with per-layer parts run only on models that have those
  // layers.
  const std::string C = "pre-rope:smooth=0.5:qsmooth=0.5:hadamard:codebook",
                    V = "hadamard:codebook";
  const std::string w8 = ":sinks=1:residual=8:block=8:residual-int8";
  // clang-format off
  return {
      "f32", "f16", "bf16", "fp8_e4m3", "fp8_e4m3:per-token", "fp8_e5m2", "int8:per-token",
      "int4:group=32:full-range",
      "int4:group=32:full-range:hadamard",
      "k-int4:group=32:full-range:hadamard+v-int4:per-token:full-range:hadamard",
      "k-int4:kchannel=128:asym+v-int4:per-token:full-range:hadamard",
      "k-int4:kchannel=128:asym+v-int4:group=32:full-range:hadamard",
      "k-int4:kchannel=128:asym:pre-rope+v-int4:per-token:full-range:hadamard",
      "k-int4:per-token:asym:pre-rope:smooth:sinks=1+v-int4:per-token:full-range:hadamard",
      "k-int4:group=32:" + C + ":sinks=2+v-int4:per-token:" + V,
      "k-int3:kchannel=128:asym:pre-rope+v-int2:group=32:full-range",
      "k-int3:per-token:" + C + ":sinks=1+v-int3:group=32:" + V,
      "k-int3:per-token:" + C + w8 + "+v-int3:per-token:" + V,
      "k-int3:per-token:" + C + ":sinks=1+v-int2:group=32:" + V,
      "k-int3:per-token:" + C + w8 + "+v-int2:group=192:" + V + "@2.18.19.20.21.22.23.24=k-int3:per-token:" +
          V + "+v-int3:group=192:" + V,
      "k-int2:per-token:" + C + ":sinks=1+v-int2:group=32:" + V,
      "k-int2:per-token:" + C + w8 + "+v-int2:group=192:" + V + "@3.8.17.18.20.23=k-int3:per-token:" +
          V + "+v-int2:group=192:" + V,
      "int2:group=32",
      "int2:group=32:hadamard",
      "kivi4:group=16:residual=32",
      "kivi2:group=16:residual=32",
      "hybrid:fraction=0.25",
      "streaming:budget=0.3",
      "window:budget=0.3",
      "h2o:budget=0.3",
      "tova:budget=0.3",
      "tova:budget=0.5",
      "snapkv:budget=0.3",
      "pyramidkv:budget=0.3",
      "knorm:budget=0.3",
      "expected-attention:budget=0.3",
      "kvzip:budget=0.3",
      "adakv+kvzip:budget=0.3",
      "duo-attention:heads=0.75:window=150",
      "h2o:budget=0.3+int4:per-token:asym:hadamard",
      "streaming:budget=0.3+int4:per-token:asym:hadamard:pre-rope"};
  // clang-format on
}

std::vector<std::string> default_long_strategies() {
  return {"f32",
          "window:tokens=512",
          "window:tokens=512:keep-positions",
          "streaming:tokens=512",
          "streaming:tokens=512:keep-positions",
          "streaming:tokens=256"};
}

}  // namespace kvc_cli
