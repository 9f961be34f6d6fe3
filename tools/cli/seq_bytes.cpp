// SPDX-License-Identifier: Apache-2.0
#include "seq_bytes.h"

#include <algorithm>
#include <cmath>

#include "../runner/model.h"

namespace kvc_cli {

namespace {
std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return a / b + (a % b != 0); }

struct Staging {
  std::uint64_t encoded = 0, staged = 0, offset = 0;  // offset: of the first staged token in its residual block
};

std::uint64_t hp_target(const SeqBytes &m, std::uint64_t n) {
  return std::max(m.window, static_cast<std::uint64_t>(m.fraction * static_cast<double>(n)));
}

// Saturating arithmetic: sizes beyond 2^64 read as UINT64_MAX (never fit).
std::uint64_t sat_mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

std::uint64_t bytes_of(const SeqBytes &m, const Staging &st) {
  const std::uint64_t res_blocks = st.staged ? ceil_div(st.offset + st.staged, m.block_size) : 0;
  const std::uint64_t per_layer =
      sat_add(sat_mul(ceil_div(st.encoded, m.block_size), m.block_bytes), sat_mul(res_blocks, m.residual_block_bytes));
  return sat_add(sat_mul(m.layers, per_layer), sat_mul(m.sink_blocks, m.residual_block_bytes));
}

}  // namespace

std::uint64_t SeqBytes::bytes(std::uint64_t n) const {
  if (n == 0) return 0;
  Staging st;
  if (!residual_block_bytes) {
    st.encoded = n;
  } else {
    const std::uint64_t hp = hp_target(*this, n);
    st.encoded = n > hp ? (n - hp) / unit * unit : 0;
    st.staged = n - st.encoded;
    // While the target is at most 1 (n < settle) every encoding empties the
    // residual, and the next token starts a fresh block at offset 0.
    st.offset = n < settle ? 0 : (st.encoded - encoded_at_reset) % block_size;
  }
  return bytes_of(*this, st);
}

std::uint64_t SeqBytes::peak(std::uint64_t n) const {
  // bytes() rises with n between the points where a unit (and the residual
  // blocks it leaves) is encoded, and each such fall is back within the last
  // unit + 2 block_size lengths' rise (tests/seq_bytes_test.cpp checks this
  // against the running maximum).
  std::uint64_t best = 0;
  const std::uint64_t span = unit + 2 * block_size + 1;
  for (std::uint64_t m = n > span ? n - span : 1; m <= n; ++m) best = std::max(best, bytes(m));
  return best;
}

std::optional<SeqBytes> seq_bytes(const Strategy &s, std::uint32_t layers, std::uint32_t kv_heads,
                                  std::uint32_t head_dim, std::string *why) {
  kvc_runner::ModelConfig c;
  c.n_layers = static_cast<int>(layers);
  c.n_heads = c.n_kv_heads = static_cast<int>(kv_heads);
  c.dim = static_cast<int>(kv_heads * head_dim);
  const kvc_runner::PoolSettings ps = pool_settings(s);
  if (std::uint64_t(kv_heads) * head_dim > std::uint64_t(1) << 30) {
    if (why) *why = "the geometry is too large for a pool";
    return std::nullopt;
  }
  // One block is enough: block sizes do not depend on the capacity.
  kvc_pool_config cfg = kvc_runner::pool_config(c, ps, 1);
  // Sizes do not depend on RoPE; only pre-RoPE keys need it (and an even head_dim).
  if (!ps.pre_rope_keys) cfg.rope_style = KVC_ROPE_NONE;
  kvc_pool *pool = nullptr;
  if (kvc_pool_create(&cfg, &pool) != KVC_OK) {
    if (why) *why = kvc_last_error_message();
    return std::nullopt;
  }
  kvc_stats st;
  kvc_stats_init(&st);
  const kvc_status status = kvc_pool_stats(pool, &st);
  kvc_pool_destroy(pool);
  if (status != KVC_OK) {
    if (why) *why = kvc_last_error_message();
    return std::nullopt;
  }
  SeqBytes m;
  m.layers = layers;
  m.block_size = cfg.block_size;
  m.block_bytes = st.bytes_per_block;
  m.residual_block_bytes = cfg.num_residual_blocks ? st.residual_bytes_per_block : 0;
  m.window = cfg.residual_window;
  m.fraction = cfg.residual_fraction;
  for (const kvc_codec *codec : {ps.k_codec, ps.v_codec})
    if (codec && codec->granularity == KVC_SCALE_PER_CHANNEL) m.unit = std::max<std::uint64_t>(m.unit, codec->group_size);
  if (cfg.residual_sinks) m.sink_blocks = ceil_div(layers, cfg.block_size / cfg.residual_sinks);
  // Emptying needs a target of at most 1. While it is (n < settle), each
  // encoding empties the residual (a target of 0 encodes what it stages once
  // a unit is complete; a target of 1 ages every staged token at the reserve
  // after a unit is staged), so the encoded count then is the last emptying's.
  // settle: the first n whose target is 2 or more (it stays so: the target
  // never falls with n), found without stepping through every length (a tiny
  // hybrid fraction puts it beyond any length; UINT64_MAX: never).
  if (m.residual_block_bytes && m.window < 2) {
    if (m.fraction > 0.0 && 2.0 / m.fraction < 0x1p62) {
      std::uint64_t n1 = static_cast<std::uint64_t>(std::ceil(2.0 / m.fraction));
      while (n1 > 1 && hp_target(m, n1 - 1) >= 2) --n1;
      while (hp_target(m, n1) < 2) ++n1;
      m.settle = n1;
      const std::uint64_t last = n1 - 1, hp = hp_target(m, last);
      m.encoded_at_reset = last > hp ? (last - hp) / m.unit * m.unit : 0;
    } else {
      m.settle = UINT64_MAX;
    }
  }
  return m;
}

}  // namespace kvc_cli
