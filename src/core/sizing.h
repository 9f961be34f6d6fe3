// Sizing (kvc_pool_seq_bytes): the bytes one sequence of a given length
// holds in a pool of a configuration, from the pool's own block format and
// staging rules, without a pool. `kvcache recommend` sizes every strategy at a
// target geometry with it.
#pragma once
#include <cstdint>

#include "core/types.h"

namespace kvc::core {

struct SeqSize {
  uint64_t bytes = 0;  // held at n tokens
  uint64_t peak = 0;   // the most held on the way to n tokens
};

// One sequence grown to n tokens one at a time (reserve one token, append it
// to every layer), without eviction, in a pool of `cfg` (checked as
// kvc_pool_create checks it; the capacity fields are ignored): per layer the
// codec blocks of its encoded tokens and the residual blocks of the tokens
// still staged (from where the first staged token sits in its block), plus
// its attention-sink blocks. Sizes beyond 2^64 saturate to UINT64_MAX.
// Throws Error for a configuration the pool refuses.
SeqSize seq_bytes(const PoolConfig &cfg, uint64_t n);

}  // namespace kvc::core
