// The pool's public face (core/pool.h): construction and destruction. Its
// operations live in the units named in pool.h (sequences.cpp, write.cpp,
// read.cpp, attention.cpp, evict.cpp, state.cpp) and the prefix cache and
// tiers in prefix_cache.cpp and offload.cpp.
#include "core/pool.h"

#include "core/offload.h"
#include "core/prefix_cache.h"

namespace kvc::core {

namespace {
PoolConfig validated(const PoolConfig &cfg) {
  PoolConfig c = cfg;
  validate_config(c);
  return c;
}
}  // namespace

Pool::Pool(const PoolConfig &cfg)
    : PoolCore(validated(cfg)),
      prefix_(std::make_unique<PrefixCache>(static_cast<PoolCore &>(*this))) {}

Pool::~Pool() {
  prefix_->tiers().shutdown();  // the offload threads call into the pool: stopped first
}

}  // namespace kvc::core
