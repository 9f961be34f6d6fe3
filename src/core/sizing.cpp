// Sizing (core/sizing.h): the block sizes come from the block format and the
// residual stride from the staging unit; the token counts follow the staging
// rules (StagingRules: the residual target, the aging unit, the sink blocks)
// as reserve and append apply them. tests: eval_recommend_seq_bytes_match_pool
// checks every length against a real pool token by token.
#include "core/sizing.h"

#include <algorithm>
#include <cmath>

#include "core/format.h"
#include "core/staging.h"

namespace kvc::core {

namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) {
  return a / b + (a % b != 0);
}
// Saturating arithmetic: sizes beyond 2^64 read as UINT64_MAX (never fit).
uint64_t sat_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
uint64_t sat_add(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

class SizeModel {
 public:
  explicit SizeModel(const PoolConfig &cfg)
      : rules_(cfg),
        layers_(cfg.num_layers),
        block_size_(cfg.block_size),
        layer_block_bytes_([&] {
          uint64_t b = 0;  // one block of every layer (per-layer formats: each its own)
          for (const FormatClass &k : BlockFormat(cfg).cls) b += k.stride * k.layers;
          return b;
        }()),
        residual_block_bytes_(rules_.active ? Staging::stride_of(cfg) : 0),
        sink_blocks_(rules_.active ? rules_.sink_blocks_needed() : 0) {
    // While the residual target is at most 1 (n < settle_), every encoding
    // empties the residual (a target of 0 encodes what it stages once a unit
    // is complete; a target of 1 ages every staged token at the reserve after
    // a unit is staged), and the next staged token starts a fresh block at
    // offset 0; encoded_at_reset_ is the encoded count at the last emptying.
    // settle_: the first n whose target is 2 or more (it stays so: the target
    // never falls with n), found without stepping through every length (a
    // tiny hybrid fraction puts it beyond any length; UINT64_MAX: never).
    if (rules_.active && rules_.window < 2) {
      if (rules_.fraction > 0.0 && 2.0 / rules_.fraction < 0x1p62) {
        uint64_t n1 = static_cast<uint64_t>(std::ceil(2.0 / rules_.fraction));
        while (n1 > 1 && rules_.hp_target(n1 - 1) >= 2) --n1;
        while (rules_.hp_target(n1) < 2) ++n1;
        settle_ = n1;
        encoded_at_reset_ = encoded(n1 - 1);
      } else {
        settle_ = UINT64_MAX;
      }
    }
  }

  uint64_t bytes(uint64_t n) const {
    if (n == 0) return 0;
    uint64_t enc = n, staged = 0, offset = 0;
    if (rules_.active) {
      enc = encoded(n);
      staged = n - enc;
      offset = n < settle_ ? 0 : (enc - encoded_at_reset_) % block_size_;
    }
    const uint64_t res_blocks = staged ? ceil_div(offset + staged, block_size_) : 0;
    const uint64_t codec = sat_mul(ceil_div(enc, block_size_), layer_block_bytes_);
    const uint64_t res = sat_mul(layers_, sat_mul(res_blocks, residual_block_bytes_));
    return sat_add(sat_add(codec, res), sat_mul(sink_blocks_, residual_block_bytes_));
  }

  // bytes() rises with n between the points where a unit (and the residual
  // blocks it leaves) is encoded, and each such fall is back within the last
  // unit + 2 block_size lengths' rise (the test checks this against the
  // running maximum).
  uint64_t peak(uint64_t n) const {
    if (n == 0) return 0;
    uint64_t best = 0;
    const uint64_t span = rules_.unit + 2 * block_size_ + 1;
    for (uint64_t m = n > span ? n - span : 1;; ++m) {  // (m <= n would wrap at n = 2^64 - 1)
      best = std::max(best, bytes(m));
      if (m >= n) break;
    }
    return best;
  }

 private:
  // Tokens encoded at length n: whole aging units beyond the residual target.
  uint64_t encoded(uint64_t n) const {
    const uint64_t hp = rules_.hp_target(n);
    return n > hp ? (n - hp) / rules_.unit * rules_.unit : 0;
  }

  StagingRules rules_;
  uint64_t layers_, block_size_, layer_block_bytes_, residual_block_bytes_, sink_blocks_;
  uint64_t settle_ = 0, encoded_at_reset_ = 0;
};

}  // namespace

SeqSize seq_bytes(const PoolConfig &cfg_in, uint64_t n) {
  // One block (per-layer codecs: one per layer, so every format has one):
  // sizes do not depend on the capacity.
  PoolConfig cfg = cfg_in;
  cfg.num_blocks = cfg.mixed() ? std::max(1u, cfg.num_layers) : 1;
  cfg.capacity_bytes = 0;
  cfg.num_residual_blocks = 0;
  validate_config(cfg, /*check_memory=*/false);  // nothing is allocated: any host may size any pool
  const SizeModel m(cfg);
  return {m.bytes(n), m.peak(n)};
}

}  // namespace kvc::core
