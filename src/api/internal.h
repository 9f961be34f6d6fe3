// Internal access to a pool's core object, for white-box tests, fuzz targets
// and benchmarks that link the static library. Not exported from the shared
// library (hidden visibility, not in the version script).
#pragma once
#include "core/pool.h"
#include "kvcache/kvcache.h"

namespace kvc::api {
// The core pool behind a handle (pool must be non-NULL).
core::Pool &core_pool(kvc_pool *pool);
}  // namespace kvc::api
