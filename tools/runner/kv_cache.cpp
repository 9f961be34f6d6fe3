// SPDX-License-Identifier: Apache-2.0
#include "kv_cache.h"

#include <algorithm>
#include <cmath>
#include <mutex>

namespace kvc_runner {

void check_kvc(kvc_status status, const char *what) {
  if (status != KVC_OK) {
    throw RunnerError(std::string(what) + " failed: " + kvc_status_string(status) + ": " +
                      kvc_last_error_message());
  }
}

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = (std::uint32_t(h) & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu;
  const std::uint32_t mantissa = h & 0x3FFu;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
  } else if (exponent == 31) {
    value = mantissa ? NAN : INFINITY;
  } else {
    value = std::ldexp(static_cast<float>(mantissa | 0x400u), int(exponent) - 25);
  }
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  bits |= sign;
  std::memcpy(&value, &bits, sizeof bits);
  return value;
}

const float *f16_table() {
  static std::vector<float> table;
  static std::once_flag once;
  std::call_once(once, [] {
    table.resize(65536);
    for (std::uint32_t i = 0; i < 65536; ++i) table[i] = f16_to_f32(static_cast<std::uint16_t>(i));
  });
  return table.data();
}

KvPool::KvPool(const ModelConfig &c, kvc_dtype k_dtype, kvc_dtype v_dtype, std::uint32_t max_tokens,
               std::uint32_t max_seqs, std::uint32_t block_size)
    : KvPool(
          c,
          [&] {
            PoolSettings s;
            s.k_dtype = k_dtype;
            s.v_dtype = v_dtype;
            s.block_size = block_size;
            return s;
          }(),
          max_tokens, max_seqs) {}

kvc_pool_config pool_config(const ModelConfig &c, const PoolSettings &settings,
                            std::uint64_t num_blocks, std::vector<const kvc_codec *> (*tables)[2]) {
  kvc_pool_config config;
  check_kvc(kvc_pool_config_init(&config), "kvc_pool_config_init");
  config.num_layers = static_cast<std::uint32_t>(c.n_layers);
  config.num_q_heads = static_cast<std::uint32_t>(c.n_heads);
  config.num_kv_heads = static_cast<std::uint32_t>(c.n_kv_heads);
  config.head_dim = static_cast<std::uint32_t>(c.head_dim());
  config.block_size = settings.block_size;
  config.num_blocks = num_blocks;
  config.k_dtype = settings.k_dtype;
  config.v_dtype = settings.v_dtype;
  config.layout = KVC_LAYOUT_NHD;
  config.rope_style = KVC_ROPE_INTERLEAVED;  // the runner rotates pairs (2i, 2i+1)
  config.rope_theta = c.rope_theta;
  config.k_codec = settings.k_codec;
  config.v_codec = settings.v_codec;
  config.residual_window = settings.residual_window;
  config.residual_fraction = settings.residual_fraction;
  config.residual_sinks = settings.residual_sinks;
  config.residual_dtype = settings.residual_dtype;
  if (settings.pre_rope_keys) config.flags |= KVC_POOL_PRE_ROPE_KEYS;
  if (settings.headwise) config.flags |= KVC_POOL_HEADWISE;
  if (settings.residual_window || settings.residual_fraction > 0 || settings.residual_sinks ||
      (settings.k_codec && settings.k_codec->granularity == KVC_SCALE_PER_CHANNEL))
    config.num_residual_blocks = config.num_blocks;
  if (!settings.layer_codecs.empty()) {
    if (!tables) throw RunnerError("per-layer codecs (@LAYERS=...) are not supported here");
    for (int kv = 0; kv < 2; ++kv)
      (*tables)[kv].assign(std::size_t(c.n_layers), kv == 0 ? settings.k_codec : settings.v_codec);
    for (const PoolSettings::LayerCodec &lc : settings.layer_codecs) {
      if (lc.layer >= std::uint32_t(c.n_layers))
        throw RunnerError("per-layer codecs: layer " + std::to_string(lc.layer) +
                          ", the model has " + std::to_string(c.n_layers) + " layers (0.." +
                          std::to_string(c.n_layers - 1) + ")");
      (*tables)[0][lc.layer] = &lc.k;
      (*tables)[1][lc.layer] = &lc.v;
    }
    config.layer_k_codecs = (*tables)[0].data();
    config.layer_v_codecs = (*tables)[1].data();
  }
  return config;
}

KvPool::KvPool(const ModelConfig &c, const PoolSettings &settings, std::uint32_t max_tokens,
               std::uint32_t max_seqs) {
  settings_ = settings;
  settings_.k_codec = settings_.v_codec = nullptr;  // not kept: the caller owns them
  if (settings.k_codec && settings.k_codec->granularity == KVC_SCALE_PER_CHANNEL)
    group_ = settings.k_codec->group_size;
  if (settings.v_codec && settings.v_codec->granularity == KVC_SCALE_PER_CHANNEL)
    group_ = std::max(group_, settings.v_codec->group_size);
  const std::uint32_t block_size = settings.block_size;
  const std::uint64_t blocks_per_layer = (std::uint64_t(max_tokens) + block_size - 1) / block_size;
  // A head-wise pool's blocks hold one KV head: as many per head as per layer.
  const std::uint64_t tables =
      std::uint64_t(c.n_layers) * (settings.headwise ? std::uint64_t(c.n_kv_heads) : 1);
  std::vector<const kvc_codec *> layer_tables[2];
  const kvc_pool_config config =
      pool_config(c, settings, blocks_per_layer * tables * max_seqs, &layer_tables);
  check_kvc(kvc_pool_create(&config, &pool_), "kvc_pool_create");
  settings_.key_scale.clear();  // copied into the pool
  settings_.key_offset.clear();
  if (!settings.key_scale.empty()) {
    const kvc_status s = kvc_pool_set_key_smoothing(
        pool_, settings.key_scale.data(),
        settings.key_offset.empty() ? nullptr : settings.key_offset.data(),
        settings.key_scale.size());
    if (s != KVC_OK) {
      kvc_pool_destroy(pool_);
      pool_ = nullptr;
      check_kvc(s, "kvc_pool_set_key_smoothing");
    }
  }
  for (std::uint32_t kv = 0; kv < 2; ++kv) {
    if (settings.codebook[kv].empty()) continue;
    const kvc_status s = kvc_pool_set_codebook(pool_, kv, settings.codebook[kv].data(),
                                               settings.codebook[kv].size());
    if (s != KVC_OK) {
      kvc_pool_destroy(pool_);
      pool_ = nullptr;
      check_kvc(s, "kvc_pool_set_codebook");
    }
  }
  settings_.codebook[0].clear();  // copied into the pool
  settings_.codebook[1].clear();
  if (settings.prefix_cache) {
    kvc_prefix_config pc;
    kvc_prefix_config_init(&pc);
    pc.seed_set = 1;  // reproducible keys (all zero seed)
    const kvc_status s = kvc_pool_enable_prefix_cache(pool_, &pc);
    if (s != KVC_OK) {
      kvc_pool_destroy(pool_);
      pool_ = nullptr;
      check_kvc(s, "kvc_pool_enable_prefix_cache");
    }
  }
  kvc_pool_layout_init(&layout_);
  if (!settings.layer_codecs.empty()) {
    // Per-layer codecs: no one layout (blocks differ in size); the runner
    // reads such a pool through kvc_gather (a quantized layout marks it).
    layout_.num_kv_heads = config.num_kv_heads;
    layout_.head_dim = config.head_dim;
    layout_.block_size = config.block_size;
    layout_.device = KVC_DEVICE_CPU;
    layout_.k_dtype = layout_.v_dtype = KVC_DTYPE_INT8;
    settings_.layer_codecs.clear();
    return;
  }
  const kvc_status s = kvc_pool_get_layout(pool_, &layout_);
  if (s != KVC_OK) {
    kvc_pool_destroy(pool_);
    pool_ = nullptr;
    check_kvc(s, "kvc_pool_get_layout");
  }
  if (layout_.device != KVC_DEVICE_CPU) {
    kvc_pool_destroy(pool_);
    pool_ = nullptr;
    throw RunnerError("the model runner reads K/V on the host; the pool is not in host memory");
  }
}

KvPool::~KvPool() {
  kvc_pool_destroy(pool_);
}

kvc_stats KvPool::stats() const {
  kvc_stats s;
  kvc_stats_init(&s);
  check_kvc(kvc_pool_stats(pool_, &s), "kvc_pool_stats");
  return s;
}

void KvPool::reset_peak() {
  check_kvc(kvc_pool_reset_peak(pool_), "kvc_pool_reset_peak");
}

PoolSequence::PoolSequence(KvPool &pool, std::uint64_t seq_id, int num_layers)
    : pool_(pool.get()),
      seq_id_(seq_id),
      layout_(pool.layout()),
      owner_(&pool),
      tables_(static_cast<std::size_t>(num_layers)),
      scratch_(std::size_t(layout_.block_size) * layout_.head_dim),
      f16_lut_(f16_table()) {
  check_kvc(kvc_seq_create(pool_, seq_id_), "kvc_seq_create");
  const auto plain = [](kvc_dtype d) {
    return d == KVC_DTYPE_F32 || d == KVC_DTYPE_F16 || d == KVC_DTYPE_BF16;
  };
  gathered_ =
      !plain(layout_.k_dtype) || !plain(layout_.v_dtype) || layout_.residual_base != nullptr;
  if (gathered_) {
    gk_.resize(std::size_t(num_layers));
    gv_.resize(std::size_t(num_layers));
    stable_.assign(std::size_t(num_layers), 0);
  }
}

void PoolSequence::gather_layer(int layer, int n) {
  const std::size_t row = std::size_t(layout_.num_kv_heads) * layout_.head_dim;
  std::vector<float> &k = gk_[std::size_t(layer)], &v = gv_[std::size_t(layer)];
  if (k.size() < std::size_t(n) * row) {
    k.resize(std::size_t(n) * row * 2);
    v.resize(std::size_t(n) * row * 2);
  }
  const std::uint64_t unstable = owner_->unstable_tokens(std::uint64_t(n));
  const std::uint64_t from = std::min<std::uint64_t>(stable_[std::size_t(layer)], std::uint64_t(n));
  check_kvc(kvc_gather(pool_, seq_id_, static_cast<std::uint32_t>(layer), from,
                       static_cast<std::uint64_t>(n) - from, k.data() + from * row,
                       v.data() + from * row, KVC_DTYPE_F32, nullptr),
            "kvc_gather");
  stable_[std::size_t(layer)] = std::uint64_t(n) > unstable ? std::uint64_t(n) - unstable : 0;
  gathered_layer_ = layer;
  gathered_n_ = n;
}

PoolSequence::~PoolSequence() {
  kvc_seq_free(pool_, seq_id_);
}

void PoolSequence::begin_token(int pos) {
  check_kvc(kvc_seq_reserve(pool_, seq_id_, 1, nullptr), "kvc_seq_reserve");
  gathered_layer_ = -1;  // the cache changed: gather again
  if (gathered_) return;
  const std::size_t blocks_needed = std::size_t(pos) / layout_.block_size + 1;
  if (tables_[0].size() < blocks_needed) refresh_block_tables();
}

void PoolSequence::refresh_block_tables() {
  for (std::size_t layer = 0; layer < tables_.size(); ++layer) {
    std::vector<std::int32_t> &table = tables_[layer];
    table.resize(table.size() + 16);  // room for new blocks; capacity is kept when shrinking
    std::size_t n = 0;
    kvc_status s = kvc_seq_block_table(pool_, seq_id_, static_cast<std::uint32_t>(layer),
                                       table.data(), table.size(), &n);
    if (s == KVC_ERR_BUFFER_TOO_SMALL) {
      table.resize(n);
      s = kvc_seq_block_table(pool_, seq_id_, static_cast<std::uint32_t>(layer), table.data(),
                              table.size(), &n);
    }
    check_kvc(s, "kvc_seq_block_table");
    table.resize(n);
  }
}

AttnSequence::AttnSequence(KvPool &pool, std::uint64_t seq_id, const ModelConfig &c,
                           const EvictionSettings &ev)
    : pool_(pool.get()),
      seq_id_(seq_id),
      ev_(ev),
      owner_(&pool),
      n_layers_(c.n_layers),
      n_kv_heads_(c.n_kv_heads),
      head_dim_(c.head_dim()),
      n_heads_(c.n_heads) {
  check_kvc(kvc_seq_create(pool_, seq_id_), "kvc_seq_create");
  kvc_attention_params_init(&params_);
  params_.num_q_heads = static_cast<std::uint32_t>(c.n_heads);
  if (ev_.policy && ev_.protocol == EvictionSettings::Protocol::Stream) {
    const kvc_status s = kvc_seq_set_policy(pool_, seq_id_, ev_.policy);
    if (s != KVC_OK) {
      kvc_seq_free(pool_, seq_id_);
      check_kvc(s, "kvc_seq_set_policy");
    }
  }
}

AttnSequence::AttnSequence(KvPool &pool, std::uint64_t seq_id, const ModelConfig &c,
                           const std::vector<int> &prompt)
    : pool_(pool.get()),
      seq_id_(seq_id),
      owner_(&pool),
      n_layers_(c.n_layers),
      n_kv_heads_(c.n_kv_heads),
      head_dim_(c.head_dim()),
      n_heads_(c.n_heads) {
  std::vector<std::int32_t> t(prompt.begin(), prompt.end());
  kvc_prefix_result r;
  r.struct_size = sizeof r;
  check_kvc(kvc_prefix_attach(pool_, seq_id_, t.data(), t.size(), nullptr, 0, 0, &r),
            "kvc_prefix_attach");
  cached_ = static_cast<int>(r.hit_tokens);
  kvc_attention_params_init(&params_);
  params_.num_q_heads = static_cast<std::uint32_t>(c.n_heads);
}

AttnSequence::AttnSequence(const AttnSequence &parent, std::uint64_t seq_id, kvc_observe observe)
    : pool_(parent.pool_),
      seq_id_(seq_id),
      params_(parent.params_),
      owner_(parent.owner_),
      n_layers_(parent.n_layers_),
      n_kv_heads_(parent.n_kv_heads_),
      head_dim_(parent.head_dim_),
      n_heads_(parent.n_heads_) {
  check_kvc(kvc_seq_fork(pool_, parent.seq_id_, seq_id_), "kvc_seq_fork");
  ev_.observe = observe;
}

void AttnSequence::register_prefix(const std::vector<int> &prompt) {
  std::vector<std::int32_t> t(prompt.begin(), prompt.end());
  check_kvc(kvc_prefix_insert(pool_, seq_id_, t.data(), t.size(), nullptr, 0, nullptr),
            "kvc_prefix_insert");
}

AttnSequence::~AttnSequence() {
  kvc_seq_free(pool_, seq_id_);
}

void AttnSequence::begin_token(int pos) {
  pos_ = pos;
  if (ev_.protocol == EvictionSettings::Protocol::PrefillCompress && ev_.policy &&
      pos == ev_.prefill_tokens && pos > 0)
    check_kvc(kvc_evict(pool_, seq_id_, ev_.policy, nullptr), "kvc_evict");
  check_kvc(kvc_seq_reserve(pool_, seq_id_, 1, nullptr), "kvc_seq_reserve");
}

int AttnSequence::rope_position(int pos) const {
  if (!ev_.shift_positions) return pos;
  std::int32_t rp = 0;
  check_kvc(kvc_seq_rope_positions(pool_, seq_id_, 0, static_cast<std::uint64_t>(pos), 1, &rp),
            "kvc_seq_rope_positions");
  return rp;
}

void AttnSequence::begin_chunk(int pos, int n) {
  pos_ = pos;
  if (ev_.protocol == EvictionSettings::Protocol::PrefillCompress && ev_.policy &&
      pos == ev_.prefill_tokens && pos > 0)
    check_kvc(kvc_evict(pool_, seq_id_, ev_.policy, nullptr), "kvc_evict");
  if (owner_ && owner_->staged()) {
    // The rows the chunk's first query still reads exact, from the pool's
    // residual (f16, as written) before the reserve ages any of them.
    const std::uint64_t p0 = static_cast<std::uint64_t>(pos),
                        lo = std::min(owner_->encoded_at(p0 + 1), p0);
    const std::size_t row = std::size_t(n_kv_heads_) * std::size_t(head_dim_);
    exact_.resize(std::size_t(n_layers_));
    for (int layer = 0; layer < n_layers_; ++layer) {
      ExactRows &e = exact_[std::size_t(layer)];
      e.first = lo;
      e.k.resize(std::size_t(p0 - lo) * row);
      e.v.resize(std::size_t(p0 - lo) * row);
      if (p0 > lo)
        check_kvc(kvc_gather(pool_, seq_id_, static_cast<std::uint32_t>(layer), lo, p0 - lo,
                             e.k.data(), e.v.data(), KVC_DTYPE_F32, nullptr),
                  "kvc_gather");
    }
  }
  check_kvc(kvc_seq_reserve(pool_, seq_id_, static_cast<std::uint64_t>(n), nullptr),
            "kvc_seq_reserve");
}

void AttnSequence::rope_positions(int pos, int n, int *out) const {
  if (!ev_.shift_positions) {
    for (int i = 0; i < n; ++i) out[i] = pos + i;
    return;
  }
  std::vector<std::int32_t> rp(static_cast<std::size_t>(n));
  check_kvc(kvc_seq_rope_positions(pool_, seq_id_, 0, static_cast<std::uint64_t>(pos),
                                   static_cast<std::uint64_t>(n), rp.data()),
            "kvc_seq_rope_positions");
  for (int i = 0; i < n; ++i) out[i] = rp[static_cast<std::size_t>(i)];
}

void AttnSequence::attend_chunk(int layer, const float *q, int n, float *out) {
  kvc_attention_params p = params_;
  p.observe = ev_.observe;
  p.observe_from = 0;
  if (ev_.protocol == EvictionSettings::Protocol::PrefillCompress) {
    // Only the prefill's last observe_window positions are recorded.
    const int first_observed = ev_.prefill_tokens - ev_.observe_window;
    if (pos_ >= ev_.prefill_tokens || pos_ + n <= first_observed)
      p.observe = KVC_OBSERVE_NONE;
    else
      p.observe_from = static_cast<std::uint64_t>(std::max(0, first_observed - pos_));
  }
  const bool window = owner_ && owner_->staged();
  if (window) lse_.resize(std::size_t(n) * std::size_t(n_heads_));
  check_kvc(
      kvc_attention_prefill(pool_, static_cast<std::uint32_t>(layer), seq_id_, q,
                            static_cast<std::uint64_t>(n), out, window ? lse_.data() : nullptr, &p),
      "kvc_attention_prefill");
  if (window) decode_window(layer, q, n, out, lse_.data());
}

void AttnSequence::store_chunk(int layer, int pos, int n, const float *k, const float *v) {
  check_kvc(
      kvc_append(pool_, seq_id_, static_cast<std::uint32_t>(layer), static_cast<std::uint64_t>(pos),
                 static_cast<std::uint64_t>(n), k, v, KVC_DTYPE_F32),
      "kvc_append");
  if (owner_ && owner_->staged()) keep_exact(layer, pos, n, k, v);
}

// The chunk's own rows as the residual stores them (docs/codecs.md), after
// the rows begin_chunk took from the pool: f16, saturated to its range; or
// int8 rows with an f16 scale per token and KV head (residual-int8), the
// codes kvc_quantize() gives for that codec.
void AttnSequence::keep_exact(int layer, int pos, int n, const float *k, const float *v) {
  ExactRows &e = exact_.at(std::size_t(layer));
  const std::size_t row = std::size_t(n_kv_heads_) * std::size_t(head_dim_);
  if (e.first + e.k.size() / row != static_cast<std::uint64_t>(pos))
    throw RunnerError("decode window: a chunk's rows do not follow the rows kept");
  const std::size_t at = e.k.size(), cnt = std::size_t(n) * row;
  e.k.resize(at + cnt);
  e.v.resize(at + cnt);
  const bool int8 = owner_->residual_dtype() == KVC_DTYPE_INT8;
  half_.resize(int8 ? cnt / 2 + std::size_t(n) * std::size_t(n_kv_heads_) : cnt);
  kvc_codec c8;
  kvc_codec_init(&c8);
  c8.dtype = KVC_DTYPE_INT8;
  c8.granularity = KVC_SCALE_PER_TOKEN;
  c8.scale_dtype = KVC_DTYPE_F16;
  const std::uint64_t rows = std::uint64_t(n) * std::uint64_t(n_kv_heads_);
  for (int kv = 0; kv < 2; ++kv) {
    const float *src = kv ? v : k;
    float *dst = (kv ? e.v : e.k).data() + at;
    if (int8) {  // codes in half_'s first cnt bytes, the f16 scales after them
      void *codes = half_.data(), *scales = half_.data() + cnt / 2;
      check_kvc(kvc_quantize(&c8, src, KVC_DTYPE_F32, rows, std::uint64_t(head_dim_), codes, scales,
                             nullptr),
                "kvc_quantize");
      check_kvc(kvc_dequantize(&c8, codes, scales, nullptr, rows, std::uint64_t(head_dim_), dst,
                               KVC_DTYPE_F32),
                "kvc_dequantize");
      continue;
    }
    for (std::size_t i = 0; i < cnt; ++i) dst[i] = std::clamp(src[i], -65504.0f, 65504.0f);
    check_kvc(kvc_convert(dst, KVC_DTYPE_F32, half_.data(), KVC_DTYPE_F16, cnt), "kvc_convert");
    check_kvc(kvc_convert(half_.data(), KVC_DTYPE_F16, dst, KVC_DTYPE_F32, cnt), "kvc_convert");
  }
}

// Query i (position p = pos + i) of a chunk: token-by-token decode would have
// read tokens [encoded_at(p + 1), p] exact; the library read those below
// encoded_at(pos + n) as codes. Each such token's term of the softmax is
// swapped: out' = (out - sum a_j v_j + sum a'_j v'_j) / (1 - sum a_j + sum a'_j),
// a_j = exp(s_j - lse) with the codes' score, a'_j with the exact one. Where
// the swapped terms held nearly all of the mass (1 - sum a_j < 1/64), or an
// exact score lies far above lse, that difference loses precision: such a
// row and head is recomputed from all of its tokens instead.
void AttnSequence::decode_window(int layer, const float *q, int n, float *out, const float *lse) {
  const std::uint64_t pos = static_cast<std::uint64_t>(pos_), end = pos + std::uint64_t(n);
  const std::uint64_t now = owner_->encoded_at(end), sinks = owner_->sinks();
  const std::uint64_t lo = std::max(owner_->encoded_at(pos + 1), sinks);
  if (lo >= now) return;  // every query's window is still exact in the pool
  const ExactRows &e = exact_.at(std::size_t(layer));
  const std::size_t row = std::size_t(n_kv_heads_) * std::size_t(head_dim_);
  if (lo < e.first || e.first + e.k.size() / row < now)
    throw RunnerError("decode window: the exact rows were not kept");
  // The pool's rows as the prefill read them: [lo, now) (codes), and on a
  // recomputation [0, end) (codes below `now`, the residual's rows after).
  std::uint64_t g0 = lo;
  bool whole = false;
  gk_.resize((now - lo) * row);
  gv_.resize((now - lo) * row);
  check_kvc(kvc_gather(pool_, seq_id_, static_cast<std::uint32_t>(layer), lo, now - lo, gk_.data(),
                       gv_.data(), KVC_DTYPE_F32, nullptr),
            "kvc_gather");
  const auto gather_all = [&] {
    gk_.resize(end * row);
    gv_.resize(end * row);
    check_kvc(kvc_gather(pool_, seq_id_, static_cast<std::uint32_t>(layer), 0, end, gk_.data(),
                         gv_.data(), KVC_DTYPE_F32, nullptr),
              "kvc_gather");
    g0 = 0;
    whole = true;
  };
  const int hd = head_dim_, group = n_heads_ / n_kv_heads_;
  const double scale = params_.scale > 0.0f ? params_.scale : 1.0 / std::sqrt(double(hd));
  acc_.resize(std::size_t(hd));
  const auto dot = [hd](const float *a, const float *b) {
    double t = 0.0;
    for (int d = 0; d < hd; ++d) t += double(a[d]) * double(b[d]);
    return t;
  };
  for (int i = 0; i < n; ++i) {
    const std::uint64_t p = pos + std::uint64_t(i);
    const std::uint64_t from = std::max(owner_->encoded_at(p + 1), sinks),
                        to = std::min(now, p + 1);
    if (from >= to) continue;
    // Decode's rows for this query: exact in [from, to), the pool's elsewhere.
    const auto key = [&](std::uint64_t j, std::size_t off) {
      return j >= from && j < to ? &e.k[(j - e.first) * row + off] : &gk_[(j - g0) * row + off];
    };
    const auto value = [&](std::uint64_t j, std::size_t off) {
      return j >= from && j < to ? &e.v[(j - e.first) * row + off] : &gv_[(j - g0) * row + off];
    };
    for (int h = 0; h < n_heads_; ++h) {
      const float *qh = q + (std::size_t(i) * n_heads_ + h) * hd;
      float *oh = out + (std::size_t(i) * n_heads_ + h) * hd;
      const double m = lse[std::size_t(i) * n_heads_ + h];
      const std::size_t off = std::size_t(h / group) * hd;
      double den = 1.0, swapped = 0.0, top = -HUGE_VAL;
      for (int d = 0; d < hd; ++d) acc_[d] = oh[d];
      for (std::uint64_t j = from; j < to; ++j) {
        const double sc = dot(qh, &gk_[(j - g0) * row + off]) * scale - m,
                     se = dot(qh, key(j, off)) * scale - m;
        top = std::max(top, se);
        const double ac = std::exp(sc), ae = std::exp(std::min(se, 64.0));
        swapped += ac;
        den += ae - ac;
        const float *vc = &gv_[(j - g0) * row + off], *ve = value(j, off);
        for (int d = 0; d < hd; ++d) acc_[d] += ae * ve[d] - ac * vc[d];
      }
      if (1.0 - swapped < 1.0 / 64.0 || top > 32.0) {  // recompute from all of its tokens
        if (!whole) gather_all();
        scores_.resize(std::size_t(p) + 1);
        double mx = -HUGE_VAL;
        for (std::uint64_t j = 0; j <= p; ++j)
          mx = std::max(mx, scores_[j] = dot(qh, key(j, off)) * scale);
        den = 0.0;
        std::fill(acc_.begin(), acc_.end(), 0.0);
        for (std::uint64_t j = 0; j <= p; ++j) {
          const double a = std::exp(scores_[j] - mx);
          den += a;
          const float *v = value(j, off);
          for (int d = 0; d < hd; ++d) acc_[d] += a * v[d];
        }
      }
      for (int d = 0; d < hd; ++d) oh[d] = static_cast<float>(acc_[d] / den);
    }
  }
}

void AttnSequence::attend(int layer, const float *q, float *out) {
  kvc_observe obs = ev_.observe;
  if (ev_.protocol == EvictionSettings::Protocol::PrefillCompress &&
      (pos_ >= ev_.prefill_tokens || pos_ < ev_.prefill_tokens - ev_.observe_window))
    obs = KVC_OBSERVE_NONE;  // only the prefill's observation window is recorded
  params_.observe = obs;
  check_kvc(kvc_attention_decode(pool_, static_cast<std::uint32_t>(layer), &seq_id_, 1, q, out,
                                 nullptr, &params_),
            "kvc_attention_decode");
}

}  // namespace kvc_runner
