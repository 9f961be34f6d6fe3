// SPDX-License-Identifier: Apache-2.0
#include "kv_cache.h"

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
               std::uint32_t max_seqs, std::uint32_t block_size) {
  kvc_pool_config config;
  check_kvc(kvc_pool_config_init(&config), "kvc_pool_config_init");
  config.num_layers = static_cast<std::uint32_t>(c.n_layers);
  config.num_q_heads = static_cast<std::uint32_t>(c.n_heads);
  config.num_kv_heads = static_cast<std::uint32_t>(c.n_kv_heads);
  config.head_dim = static_cast<std::uint32_t>(c.head_dim());
  config.block_size = block_size;
  const std::uint64_t blocks_per_layer = (std::uint64_t(max_tokens) + block_size - 1) / block_size;
  config.num_blocks = blocks_per_layer * std::uint64_t(c.n_layers) * max_seqs;
  config.k_dtype = k_dtype;
  config.v_dtype = v_dtype;
  config.layout = KVC_LAYOUT_NHD;
  check_kvc(kvc_pool_create(&config, &pool_), "kvc_pool_create");
  kvc_pool_layout_init(&layout_);
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

KvPool::~KvPool() { kvc_pool_destroy(pool_); }

kvc_stats KvPool::stats() const {
  kvc_stats s;
  kvc_stats_init(&s);
  check_kvc(kvc_pool_stats(pool_, &s), "kvc_pool_stats");
  return s;
}

void KvPool::reset_peak() { check_kvc(kvc_pool_reset_peak(pool_), "kvc_pool_reset_peak"); }

PoolSequence::PoolSequence(KvPool &pool, std::uint64_t seq_id, int num_layers)
    : pool_(pool.get()), seq_id_(seq_id), layout_(pool.layout()),
      tables_(static_cast<std::size_t>(num_layers)),
      scratch_(std::size_t(layout_.block_size) * layout_.head_dim),
      f16_lut_(f16_table()) {
  check_kvc(kvc_seq_create(pool_, seq_id_), "kvc_seq_create");
}

PoolSequence::~PoolSequence() { kvc_seq_free(pool_, seq_id_); }

void PoolSequence::begin_token(int pos) {
  check_kvc(kvc_seq_reserve(pool_, seq_id_, 1, nullptr), "kvc_seq_reserve");
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

}  // namespace kvc_runner
