// The C layer's internals, shared by its files (one per area of the public
// header): the handle structs, the error guard, argument helpers. The C layer
// holds no pool logic: it checks arguments, reads and writes the caller's
// structs (struct_io.h) and calls core.
#pragma once
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "api/internal.h"
#include "api/struct_io.h"
#include "common/error.h"
#include "common/scratch.h"
#include "common/strings.h"
#include "core/offload.h"
#include "core/pool.h"
#include "core/prefix_cache.h"
#include "core/state.h"
#include "kvcache/kvcache.h"

using kvc::DType;
using kvc::Errc;
using kvc::fail;

struct kvc_pool {
  explicit kvc_pool(const kvc::core::PoolConfig &c) : core(c) {}
  kvc::core::Pool core;
  struct Callback {
    kvc_prefix_event_fn fn = nullptr;
    void *user = nullptr;
  } prefix_callback;
};
struct kvc_policy {
  std::shared_ptr<const kvc::core::PolicySpec> spec;
};
struct kvc_plugin {
  std::shared_ptr<kvc::core::Plugin> core;
};

namespace kvc::api {

// A struct of zeros but for struct_size (the output structs' defaults).
template <typename T>
T zeroed_struct() {
  T t;
  std::memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  return t;
}

// Records the thread's last error message (errors.cpp); returns s.
kvc_status set_error(kvc_status s, const char *msg);

template <typename F>
kvc_status guard(F &&f) noexcept {
  // Large per-thread scratch goes back when the call returns, however it ends.
  struct Trim {
    ~Trim() { kvc::trim_thread_scratch(); }
  } trim;
  try {
    f();
    return KVC_OK;
  } catch (const kvc::Error &e) {
    return set_error(static_cast<kvc_status>(e.code()), e.what());
  } catch (const std::bad_alloc &) {
    return set_error(KVC_ERR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception &e) {
    return set_error(KVC_ERR_INTERNAL, e.what());
  } catch (...) {
    return set_error(KVC_ERR_INTERNAL, "unknown internal error");
  }
}

inline void need(const void *p, const char *name) {
  if (!p) fail(Errc::NullPointer, std::string(name) + " is NULL");
}

inline kvc::core::Pool &core_of(kvc_pool *pool) {
  need(pool, "pool");
  return pool->core;
}

inline DType dtype_arg(kvc_dtype d, const char *name) {
  if (!kvc::dtype_is_plain(static_cast<int32_t>(d)))
    fail(Errc::InvalidArgument,
         std::string(name) + " " + std::to_string(static_cast<int32_t>(d)) +
             ": unknown dtype (KVC_DTYPE_F32, KVC_DTYPE_F16 or KVC_DTYPE_BF16)");
  return static_cast<DType>(d);
}

// Reads a caller's codec into the core's Spec (api/codec.cpp). `rotation_row` is
// the length whose largest power-of-two divisor is the default Hadamard block
// (the row for arrays, head_dim in a pool).
kvc::core::CodecSpec to_spec(const kvc_codec *in, const char *name, uint64_t rotation_row);

// Checks the prompt arguments and converts the extra keys (prefix.cpp).
std::vector<kvc::core::PrefixExtra> prefix_args(const int32_t *tokens, uint64_t n,
                                                const kvc_prefix_extra *extras, uint32_t n_extras);
// A core prefix result into the caller's struct (prefix.cpp).
void write_result(const kvc::core::PrefixResult &r, kvc_prefix_result *out);

// Reads and checks a caller's tier config (tier.cpp; the checks of kvc_pool_add_tier()).
kvc::core::TierSpec tier_spec(const kvc_tier_config *config);
// Tier counters into the caller's kvc_tier_stats (checked: size, NULL).
void write_tier_stats(const kvc::core::TierCounts &c, kvc_tier_stats *stats);

}  // namespace kvc::api
