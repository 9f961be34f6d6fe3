// C entry points: check arguments, call the core, turn C++ errors into
// kvc_status plus the thread's last error message. No logic lives here.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "api/internal.h"
#include "api/struct_io.h"
#include "common/convert.h"
#include "common/error.h"
#include "core/pool.h"
#include "common/scratch.h"
#include "core/offload.h"
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

#define KVC_CHECK_ERRC(name, value) \
  static_assert(static_cast<int>(Errc::name) == static_cast<int>(value), #name)
KVC_CHECK_ERRC(InvalidArgument, KVC_ERR_INVALID_ARGUMENT);
KVC_CHECK_ERRC(NullPointer, KVC_ERR_NULL_POINTER);
KVC_CHECK_ERRC(StructSize, KVC_ERR_STRUCT_SIZE);
KVC_CHECK_ERRC(Unsupported, KVC_ERR_UNSUPPORTED);
KVC_CHECK_ERRC(Overflow, KVC_ERR_OVERFLOW);
KVC_CHECK_ERRC(OutOfMemory, KVC_ERR_OUT_OF_MEMORY);
KVC_CHECK_ERRC(PoolExhausted, KVC_ERR_POOL_EXHAUSTED);
KVC_CHECK_ERRC(SeqNotFound, KVC_ERR_SEQ_NOT_FOUND);
KVC_CHECK_ERRC(SeqExists, KVC_ERR_SEQ_EXISTS);
KVC_CHECK_ERRC(OutOfRange, KVC_ERR_OUT_OF_RANGE);
KVC_CHECK_ERRC(NotReserved, KVC_ERR_NOT_RESERVED);
KVC_CHECK_ERRC(BufferTooSmall, KVC_ERR_BUFFER_TOO_SMALL);
KVC_CHECK_ERRC(DeviceUnavailable, KVC_ERR_DEVICE_UNAVAILABLE);
KVC_CHECK_ERRC(Version, KVC_ERR_VERSION);
KVC_CHECK_ERRC(InvalidScale, KVC_ERR_INVALID_SCALE);
KVC_CHECK_ERRC(NonFinite, KVC_ERR_NON_FINITE);
KVC_CHECK_ERRC(Internal, KVC_ERR_INTERNAL);
KVC_CHECK_ERRC(Incompatible, KVC_ERR_INCOMPATIBLE);
KVC_CHECK_ERRC(Corrupt, KVC_ERR_CORRUPT);
KVC_CHECK_ERRC(Io, KVC_ERR_IO);
KVC_CHECK_ERRC(Pending, KVC_ERR_PENDING);
KVC_CHECK_ERRC(Timeout, KVC_ERR_TIMEOUT);
KVC_CHECK_ERRC(ExceedsCapacity, KVC_ERR_EXCEEDS_CAPACITY);
// The one DType enum (common/dtype.h) equals kvc_dtype value for value.
static_assert(static_cast<int>(DType::F32) == KVC_DTYPE_F32 && static_cast<int>(DType::F16) == KVC_DTYPE_F16 &&
              static_cast<int>(DType::BF16) == KVC_DTYPE_BF16 &&
              static_cast<int>(DType::FP8_E4M3) == KVC_DTYPE_FP8_E4M3 &&
              static_cast<int>(DType::FP8_E5M2) == KVC_DTYPE_FP8_E5M2 &&
              static_cast<int>(DType::INT8) == KVC_DTYPE_INT8 && static_cast<int>(DType::INT4) == KVC_DTYPE_INT4 &&
              static_cast<int>(DType::INT2) == KVC_DTYPE_INT2 && static_cast<int>(DType::INT3) == KVC_DTYPE_INT3 &&
              kvc::kNumDTypes == 9);
static_assert(static_cast<int>(kvc::tier::Kind::Host) == KVC_TIER_HOST &&
              static_cast<int>(kvc::tier::Kind::Disk) == KVC_TIER_DISK &&
              static_cast<int>(kvc::tier::Kind::Redis) == KVC_TIER_REDIS);
static_assert(static_cast<int>(kvc::core::Layout::NHD) == KVC_LAYOUT_NHD &&
              static_cast<int>(kvc::core::Layout::HND) == KVC_LAYOUT_HND);
static_assert(static_cast<int>(kvc::core::Device::CPU) == KVC_DEVICE_CPU &&
              static_cast<int>(kvc::core::Device::CUDA) == KVC_DEVICE_CUDA);

kvc::core::Pool &kvc::api::core_pool(kvc_pool *pool) { return pool->core; }

namespace {

std::string fmt_g(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

thread_local std::string t_last_error;

// Minimum struct sizes accepted (docs/abi-policy.md): the fields of the first
// release the library cannot do without. Fields past the caller's size take
// defaults (inputs) or are not written (outputs).
constexpr size_t kPoolConfigMin = offsetof(kvc_pool_config, capacity_bytes) + sizeof(uint64_t);
constexpr size_t kPoolStatsMin = offsetof(kvc_stats, blocks_shared) + sizeof(uint64_t);
constexpr size_t kPoolLayoutMin = offsetof(kvc_pool_layout, v_bytes) + sizeof(uint64_t);

// A struct of zeros but for struct_size (the output structs' defaults).
template <typename T>
T zeroed_struct() {
  T t;
  std::memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  return t;
}

kvc_status set_error(kvc_status s, const char *msg) {
  try {
    t_last_error = msg;
  } catch (...) {
    // Keep the status even if the message cannot be stored.
  }
  return s;
}

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



void need(const void *p, const char *name) {
  if (!p) fail(Errc::NullPointer, std::string(name) + " is NULL");
}

kvc::core::Pool &core_of(kvc_pool *pool) {
  need(pool, "pool");
  return pool->core;
}

DType dtype_arg(kvc_dtype d, const char *name) {
  if (!kvc::dtype_is_plain(static_cast<int32_t>(d)))
    fail(Errc::InvalidArgument,
         std::string(name) + " " + std::to_string(static_cast<int32_t>(d)) +
             ": unknown dtype (KVC_DTYPE_F32, KVC_DTYPE_F16 or KVC_DTYPE_BF16)");
  return static_cast<DType>(d);
}

void codec_defaults(kvc_codec *c) {
  std::memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  c->dtype = KVC_DTYPE_INT8;
  c->granularity = KVC_SCALE_PER_TOKEN;
  c->group_size = 32;
  c->scale_dtype = KVC_DTYPE_F32;
  c->rotation = KVC_ROTATION_NONE;
}

constexpr size_t kCodecMin = offsetof(kvc_codec, scale) + sizeof(double);
constexpr size_t kQuantSizesMin = offsetof(kvc_quant_sizes, num_scales) + sizeof(uint64_t);

// Reads a caller's codec into the core's Spec. `rotation_row` is the length
// whose largest power-of-two divisor is the default Hadamard block (the row
// for arrays, head_dim in a pool).
kvc::codec::Spec to_spec(const kvc_codec *in, const char *name, uint64_t rotation_row) {
  kvc_codec c;
  codec_defaults(&c);
  kvc::api::read_input_struct(in, kCodecMin, name, &c);
  const int32_t dt = static_cast<int32_t>(c.dtype);
  if (dt < 0 || dt > 8)
    fail(Errc::InvalidArgument, std::string(name) + ".dtype " + std::to_string(dt) + ": unknown dtype");
  if (c.rotation != KVC_ROTATION_NONE && c.rotation != KVC_ROTATION_HADAMARD)
    fail(Errc::InvalidArgument, std::string(name) + ".rotation " +
                                    std::to_string(static_cast<int32_t>(c.rotation)) + ": unknown");
  if (c.asymmetric > 1) fail(Errc::InvalidArgument, std::string(name) + ".asymmetric must be 0 or 1");
  if (c.static_scale > 1) fail(Errc::InvalidArgument, std::string(name) + ".static_scale must be 0 or 1");
  if (c.full_range > 1) fail(Errc::InvalidArgument, std::string(name) + ".full_range must be 0 or 1");
  if (c.full_range && (dt < static_cast<int32_t>(KVC_DTYPE_INT8) || c.asymmetric || c.static_scale))
    fail(Errc::InvalidArgument, std::string(name) +
                                    ".full_range applies to symmetric integer codecs (int8, int4, int3, int2) with "
                                    "dynamic scales only");
  if (c.static_scale) {
    const double v = c.scale;
    if (!(v >= 1e-30 && v <= 1e30))  // also false for NaN
      fail(Errc::InvalidScale, std::string(name) + ".scale " + fmt_g(v) +
                                   ": a static scale must be a finite value in [1e-30, 1e30]");
  }
  kvc::codec::Spec sp;
  sp.dtype = static_cast<kvc::DType>(c.dtype);
  sp.gran = static_cast<kvc::codec::Gran>(c.granularity);
  sp.group = c.group_size;
  sp.asym = c.asymmetric != 0;
  sp.full_range = c.full_range != 0;
  sp.scale_dtype = static_cast<kvc::DType>(c.scale_dtype);
  sp.static_scale = c.static_scale ? c.scale : 0.0;
  if (c.rotation == KVC_ROTATION_HADAMARD)
    sp.rotation_block = c.rotation_block ? c.rotation_block
                                         : kvc::codec::default_rotation_block(rotation_row);
  else if (c.rotation_block != 0)
    fail(Errc::InvalidArgument, std::string(name) + ".rotation_block set without a rotation");
  return sp;
}

kvc::core::PoolConfig to_core(const kvc_pool_config &c) {
  kvc::core::PoolConfig p;
  p.num_layers = c.num_layers;
  p.num_q_heads = c.num_q_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.block_size = c.block_size;
  p.flags = c.flags;
  p.num_blocks = c.num_blocks;
  p.capacity_bytes = c.capacity_bytes;
  p.k_dtype = static_cast<DType>(c.k_dtype);
  p.v_dtype = static_cast<DType>(c.v_dtype);
  p.layout = static_cast<kvc::core::Layout>(c.layout);
  p.device = static_cast<kvc::core::Device>(c.device);
  p.device_index = c.device_index;
  p.residual_window = c.residual_window;
  p.residual_dtype = static_cast<DType>(c.residual_dtype);
  p.residual_fraction = c.residual_fraction;
  p.num_residual_blocks = c.num_residual_blocks;
  p.rope_style = static_cast<kvc::core::RopeStyle>(c.rope_style);
  p.rope_dims = c.rope_dims;
  p.rope_theta = c.rope_theta;
  p.residual_sinks = c.residual_sinks;
  for (int kv = 0; kv < 2; ++kv) {
    const kvc_codec *in = kv == 0 ? c.k_codec : c.v_codec;
    if (!in) continue;
    const char *name = kv == 0 ? "k_codec" : "v_codec";
    kvc::codec::Spec sp = to_spec(in, name, c.head_dim);
    if (kvc::is_float(sp.dtype)) {  // a float codec: plain storage of that dtype
      try {
        kvc::codec::validate(sp, c.head_dim);
      } catch (const kvc::Error &e) {
        fail(e.code(), std::string(name) + ": " + e.what());
      }
      (kv == 0 ? p.k_dtype : p.v_dtype) = static_cast<DType>(sp.dtype);
      continue;
    }
    (kv == 0 ? p.k_codec : p.v_codec) = sp;
  }
  return p;
}

void defaults(kvc_pool_config *c) {
  std::memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  c->block_size = 16;
  c->k_dtype = KVC_DTYPE_F16;
  c->v_dtype = KVC_DTYPE_F16;
  c->layout = KVC_LAYOUT_NHD;
  c->device = KVC_DEVICE_CPU;
  c->residual_dtype = KVC_DTYPE_F16;
  c->rope_theta = 10000.0;
}

}  // namespace

namespace {
struct QuantPlan {
  kvc::codec::Spec spec;
  uint64_t codes, scales, zeros, num_scales;
};

QuantPlan plan_quant(const kvc_codec *codec, uint64_t n, uint64_t d) {
  need(codec, "codec");
  if (d < 1 || d > (1u << 24)) fail(Errc::InvalidArgument, "d " + std::to_string(d) + ": must be 1..2^24");
  if (n > (uint64_t(1) << 40)) fail(Errc::InvalidArgument, "n " + std::to_string(n) + ": must be 0..2^40");
  QuantPlan q;
  q.spec = to_spec(codec, "codec", d);
  kvc::codec::validate(q.spec, d);
  // Every size fits in the address space (n * d values are also staged as f32).
  const uint64_t limit = uint64_t(1) << 56;
  uint64_t nd = 0, groups = 0;
  const uint64_t g = q.spec.group ? q.spec.group : 1;
  if (__builtin_mul_overflow(n, d, &nd) || nd > limit / 4 ||
      __builtin_mul_overflow(n, (d + g - 1) / g, &groups) || groups > limit / 8)
    fail(Errc::Overflow, "an array of " + std::to_string(n) + " x " + std::to_string(d) +
                             " values (or its scales) overflows the address space");
  q.codes = n * kvc::codec::row_bytes(q.spec.dtype, d);
  q.num_scales = kvc::codec::num_scales(q.spec, n, d);
  q.scales = q.num_scales * kvc::codec::scale_bytes(q.spec);
  q.zeros = q.spec.asym ? q.scales : 0;
  return q;
}
}  // namespace

extern "C" {

KVC_API uint32_t kvc_version(void) { return KVC_VERSION_NUMBER; }

KVC_API const char *kvc_version_string(void) {
#define KVC_STR2(x) #x
#define KVC_STR(x) KVC_STR2(x)
  return KVC_STR(KVC_VERSION_MAJOR) "." KVC_STR(KVC_VERSION_MINOR) "." KVC_STR(KVC_VERSION_PATCH);
}

KVC_API const char *kvc_status_string(kvc_status s) {
  switch (s) {
    case KVC_OK: return "KVC_OK";
    case KVC_ERR_INVALID_ARGUMENT: return "KVC_ERR_INVALID_ARGUMENT";
    case KVC_ERR_NULL_POINTER: return "KVC_ERR_NULL_POINTER";
    case KVC_ERR_STRUCT_SIZE: return "KVC_ERR_STRUCT_SIZE";
    case KVC_ERR_UNSUPPORTED: return "KVC_ERR_UNSUPPORTED";
    case KVC_ERR_OVERFLOW: return "KVC_ERR_OVERFLOW";
    case KVC_ERR_OUT_OF_MEMORY: return "KVC_ERR_OUT_OF_MEMORY";
    case KVC_ERR_POOL_EXHAUSTED: return "KVC_ERR_POOL_EXHAUSTED";
    case KVC_ERR_SEQ_NOT_FOUND: return "KVC_ERR_SEQ_NOT_FOUND";
    case KVC_ERR_SEQ_EXISTS: return "KVC_ERR_SEQ_EXISTS";
    case KVC_ERR_OUT_OF_RANGE: return "KVC_ERR_OUT_OF_RANGE";
    case KVC_ERR_NOT_RESERVED: return "KVC_ERR_NOT_RESERVED";
    case KVC_ERR_BUFFER_TOO_SMALL: return "KVC_ERR_BUFFER_TOO_SMALL";
    case KVC_ERR_DEVICE_UNAVAILABLE: return "KVC_ERR_DEVICE_UNAVAILABLE";
    case KVC_ERR_VERSION: return "KVC_ERR_VERSION";
    case KVC_ERR_INVALID_SCALE: return "KVC_ERR_INVALID_SCALE";
    case KVC_ERR_NON_FINITE: return "KVC_ERR_NON_FINITE";
    case KVC_ERR_INTERNAL: return "KVC_ERR_INTERNAL";
    case KVC_ERR_INCOMPATIBLE: return "KVC_ERR_INCOMPATIBLE";
    case KVC_ERR_CORRUPT: return "KVC_ERR_CORRUPT";
    case KVC_ERR_IO: return "KVC_ERR_IO";
    case KVC_ERR_PENDING: return "KVC_ERR_PENDING";
    case KVC_ERR_TIMEOUT: return "KVC_ERR_TIMEOUT";
    case KVC_ERR_EXCEEDS_CAPACITY: return "KVC_ERR_EXCEEDS_CAPACITY";
    case KVC_STATUS_FORCE_32BIT:
    case KVC_STATUS_FORCE_SIGNED:
      break;
  }
  return "KVC_ERR_UNKNOWN";
}

KVC_API const char *kvc_last_error_message(void) { return t_last_error.c_str(); }

// The 0.3 symbols of the init functions (the header's macros of the same
// names call the _sized functions): parenthesized, so the macros do not apply.
KVC_API kvc_status(kvc_pool_config_init)(kvc_pool_config *config) {
  return kvc_pool_config_init_sized(config, kvc::api::size_0_3<kvc_pool_config>);
}

KVC_API kvc_status kvc_pool_config_init_sized(kvc_pool_config *config, size_t struct_size) {
  return guard([&] {
    need(config, "config");
    kvc_pool_config d;
    defaults(&d);
    kvc::api::init_sized(config, struct_size, kPoolConfigMin, d);
  });
}

KVC_API kvc_status kvc_pool_create(const kvc_pool_config *config, kvc_pool **out) {
  return guard([&] {
    need(config, "config");
    need(out, "out");
    kvc_pool_config c;
    defaults(&c);
    // (A struct_size ending inside a field is refused: every field is
    // either the caller's or its default.)
    kvc::api::read_input_struct(config, kPoolConfigMin, "kvc_pool_config", &c);
    kvc::core::PoolConfig pc = to_core(c);
    *out = new kvc_pool(pc);
  });
}

KVC_API void kvc_pool_destroy(kvc_pool *pool) { delete pool; }

KVC_API kvc_status(kvc_stats_init)(kvc_stats *stats) {
  return kvc_stats_init_sized(stats, kvc::api::size_0_3<kvc_stats>);
}

KVC_API kvc_status kvc_stats_init_sized(kvc_stats *stats, size_t struct_size) {
  return guard([&] {
    need(stats, "stats");
    kvc::api::init_sized(stats, struct_size, kPoolStatsMin, zeroed_struct<kvc_stats>());
  });
}

KVC_API kvc_status kvc_pool_stats(kvc_pool *pool, kvc_stats *stats) {
  return guard([&] {
    auto &p = core_of(pool);
    need(stats, "stats");
    kvc::api::check_output_struct(stats, kPoolStatsMin, "kvc_stats");
    const auto s = p.stats();
    kvc_stats full{};
    full.struct_size = sizeof full;
    full.blocks_total = s.blocks_total;
    full.blocks_free = s.blocks_free;
    full.blocks_cached = s.blocks_cached;
    full.blocks_used = s.blocks_used;
    full.blocks_shared = s.blocks_shared;
    full.bytes_per_block = s.bytes_per_block;
    full.bytes_per_token = s.bytes_per_token;
    full.bytes_total = s.bytes_total;
    full.bytes_in_use = s.bytes_in_use;
    full.peak_bytes_in_use = s.peak_bytes_in_use;
    full.num_sequences = s.num_sequences;
    full.residual_blocks_total = s.residual_blocks_total;
    full.residual_blocks_used = s.residual_blocks_used;
    full.residual_bytes_per_block = s.residual_bytes_per_block;
    full.tokens_stored = s.tokens_stored;
    kvc::api::write_output_struct(full, stats);
  });
}

KVC_API kvc_status kvc_pool_reset_peak(kvc_pool *pool) {
  return guard([&] { core_of(pool).reset_peak(); });
}

KVC_API kvc_status kvc_pool_set_stream(kvc_pool *pool, void *stream) {
  return guard([&] { core_of(pool).set_stream(stream); });
}

KVC_API kvc_status kvc_pool_sync(kvc_pool *pool) {
  return guard([&] { core_of(pool).sync(); });
}

KVC_API kvc_status kvc_pool_copy_blocks(kvc_pool *pool, const int32_t *blocks, size_t n_blocks, void *host,
                                        kvc_copy_direction direction) {
  return guard([&] {
    kvc::core::Pool &p = core_of(pool);
    const int32_t d = static_cast<int32_t>(direction);
    if (d != KVC_COPY_TO_HOST && d != KVC_COPY_FROM_HOST)
      kvc::fail(kvc::Errc::InvalidArgument,
                      "direction " + std::to_string(d) + ": must be KVC_COPY_TO_HOST or KVC_COPY_FROM_HOST");
    if (n_blocks == 0) return;
    need(blocks, "blocks");
    need(host, "host");
    p.copy_blocks(blocks, n_blocks, host, d == KVC_COPY_TO_HOST);
  });
}

KVC_API kvc_status(kvc_pool_layout_init)(kvc_pool_layout *layout) {
  return kvc_pool_layout_init_sized(layout, kvc::api::size_0_3<kvc_pool_layout>);
}

KVC_API kvc_status kvc_pool_layout_init_sized(kvc_pool_layout *layout, size_t struct_size) {
  return guard([&] {
    need(layout, "layout");
    kvc::api::init_sized(layout, struct_size, kPoolLayoutMin, zeroed_struct<kvc_pool_layout>());
  });
}

KVC_API kvc_status kvc_pool_get_layout(kvc_pool *pool, kvc_pool_layout *layout) {
  return guard([&] {
    auto &p = core_of(pool);
    need(layout, "layout");
    kvc::api::check_output_struct(layout, kPoolLayoutMin, "kvc_pool_layout");
    const auto l = p.layout();
    const auto &c = p.config();
    kvc_pool_layout full{};
    full.struct_size = sizeof full;
    full.base = l.base;
    full.num_blocks = l.num_blocks;
    full.block_stride = l.block_stride;
    full.block_size = c.block_size;
    full.num_kv_heads = c.num_kv_heads;
    full.head_dim = c.head_dim;
    full.layout = static_cast<kvc_layout>(c.layout);
    full.k_dtype = static_cast<kvc_dtype>(l.part[0].spec.dtype);
    full.v_dtype = static_cast<kvc_dtype>(l.part[1].spec.dtype);
    full.k_offset = l.part[0].offset;
    full.k_token_stride = l.part[0].token_stride;
    full.k_head_stride = l.part[0].head_stride;
    full.k_bytes = l.part[0].bytes;
    full.v_offset = l.part[1].offset;
    full.v_token_stride = l.part[1].token_stride;
    full.v_head_stride = l.part[1].head_stride;
    full.v_bytes = l.part[1].bytes;
    full.k_codes_bytes = l.part[0].codes_bytes;
    full.k_scale_offset = l.part[0].scale_offset;
    full.k_zero_offset = l.part[0].zero_offset;
    full.k_scales_per_token = static_cast<uint32_t>(l.part[0].scales_per_token);
    full.k_scale_dtype = static_cast<kvc_dtype>(l.part[0].spec.scale_dtype);
    full.v_codes_bytes = l.part[1].codes_bytes;
    full.v_scale_offset = l.part[1].scale_offset;
    full.v_zero_offset = l.part[1].zero_offset;
    full.v_scales_per_token = static_cast<uint32_t>(l.part[1].scales_per_token);
    full.v_scale_dtype = static_cast<kvc_dtype>(l.part[1].spec.scale_dtype);
    full.k_granularity = static_cast<kvc_granularity>(l.part[0].spec.gran);
    full.k_group_size = l.part[0].spec.group;
    full.v_granularity = static_cast<kvc_granularity>(l.part[1].spec.gran);
    full.v_group_size = l.part[1].spec.group;
    full.residual_base = l.residual_base;
    full.residual_num_blocks = l.residual_num_blocks;
    full.residual_block_stride = l.residual_block_stride;
    full.residual_dtype = static_cast<kvc_dtype>(c.residual_dtype);
    full.device = static_cast<kvc_device>(c.device);
    full.device_index = c.device_index;
    kvc::api::write_output_struct(full, layout);
  });
}

KVC_API kvc_status kvc_pool_get_config(kvc_pool *pool, kvc_pool_config *config) {
  return guard([&] {
    auto &p = core_of(pool);
    need(config, "config");
    kvc::api::check_output_struct(config, kPoolConfigMin, "kvc_pool_config");
    const auto &c = p.config();
    kvc_pool_config full;
    defaults(&full);
    full.num_layers = c.num_layers;
    full.num_q_heads = c.num_q_heads;
    full.num_kv_heads = c.num_kv_heads;
    full.head_dim = c.head_dim;
    full.block_size = c.block_size;
    full.flags = c.flags;
    full.num_blocks = c.num_blocks;
    full.capacity_bytes = c.capacity_bytes;
    full.k_dtype = static_cast<kvc_dtype>(c.k_dtype);
    full.v_dtype = static_cast<kvc_dtype>(c.v_dtype);
    full.layout = static_cast<kvc_layout>(c.layout);
    full.device = static_cast<kvc_device>(c.device);
    full.device_index = c.device_index;
    full.residual_window = c.residual_window;
    full.residual_dtype = static_cast<kvc_dtype>(c.residual_dtype);
    full.residual_fraction = c.residual_fraction;
    full.num_residual_blocks = c.num_residual_blocks;
    full.rope_style = static_cast<kvc_rope_style>(c.rope_style);
    full.rope_dims = c.rope_dims;
    full.rope_theta = c.rope_theta;
    full.residual_sinks = c.residual_sinks;
    kvc::api::write_output_struct(full, config);
  });
}

KVC_API kvc_status kvc_seq_create(kvc_pool *pool, uint64_t seq_id) {
  return guard([&] { core_of(pool).seq_create(seq_id); });
}

KVC_API kvc_status kvc_seq_fork(kvc_pool *pool, uint64_t parent_id, uint64_t child_id) {
  return guard([&] { core_of(pool).seq_fork(parent_id, child_id); });
}

KVC_API kvc_status kvc_seq_truncate(kvc_pool *pool, uint64_t seq_id, uint64_t new_length) {
  return guard([&] { core_of(pool).seq_truncate(seq_id, new_length); });
}

KVC_API kvc_status kvc_seq_free(kvc_pool *pool, uint64_t seq_id) {
  return guard([&] { core_of(pool).seq_free(seq_id); });
}

KVC_API kvc_status kvc_seq_length(kvc_pool *pool, uint64_t seq_id, uint64_t *length) {
  return guard([&] {
    auto &p = core_of(pool);
    need(length, "length");
    *length = p.seq_length(seq_id);
  });
}

KVC_API kvc_status kvc_seq_layer_tokens(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                        uint64_t *n_tokens) {
  return guard([&] {
    auto &p = core_of(pool);
    need(n_tokens, "n_tokens");
    *n_tokens = p.seq_layer_tokens(seq_id, layer);
  });
}

KVC_API kvc_status kvc_seq_reserve(kvc_pool *pool, uint64_t seq_id, uint64_t n_new,
                                   int64_t *slot_mapping) {
  return guard([&] { core_of(pool).seq_reserve(seq_id, n_new, slot_mapping); });
}

KVC_API kvc_status kvc_append(kvc_pool *pool, uint64_t seq_id, uint32_t layer, uint64_t pos,
                              uint64_t n_tokens, const void *k, const void *v,
                              kvc_dtype src_dtype) {
  return guard([&] {
    auto &p = core_of(pool);
    need(k, "k");
    need(v, "v");
    p.append(seq_id, layer, pos, n_tokens, k, v, dtype_arg(src_dtype, "src_dtype"));
  });
}

KVC_API kvc_status kvc_gather(kvc_pool *pool, uint64_t seq_id, uint32_t layer, uint64_t first,
                              uint64_t n_tokens, void *k_out, void *v_out, kvc_dtype dst_dtype,
                              int32_t *positions_out) {
  return guard([&] {
    auto &p = core_of(pool);
    if (!k_out && !v_out && !positions_out)
      fail(Errc::NullPointer, "k_out, v_out and positions_out are all NULL");
    p.gather(seq_id, layer, first, n_tokens, k_out, v_out, dtype_arg(dst_dtype, "dst_dtype"),
             positions_out);
  });
}

KVC_API kvc_status kvc_seq_block_table(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                       int32_t *block_ids, size_t capacity, size_t *n_blocks) {
  return guard([&] {
    auto &p = core_of(pool);
    need(n_blocks, "n_blocks");
    const size_t n = p.block_table(seq_id, layer, block_ids, capacity);
    *n_blocks = n;
    if (block_ids && n > capacity)
      fail(Errc::BufferTooSmall, "block_ids holds " + std::to_string(capacity) +
                                     " entries; the block table has " + std::to_string(n));
  });
}

KVC_API kvc_status kvc_export_page_table(kvc_pool *pool, uint32_t layer, const uint64_t *seq_ids,
                                         size_t n_seqs, int32_t *indptr, int32_t *indices,
                                         size_t indices_capacity, int32_t *last_page_len,
                                         size_t *n_indices) {
  return guard([&] {
    auto &p = core_of(pool);
    need(n_indices, "n_indices");
    need(indptr, "indptr");
    if (n_seqs > 0) {
      need(seq_ids, "seq_ids");
      need(last_page_len, "last_page_len");
    }
    if (n_seqs > 0x7fffffffu) fail(Errc::InvalidArgument, "n_seqs above 2^31-1");
    if (!indices && indices_capacity > 0) fail(Errc::NullPointer, "indices is NULL");
    const size_t total = p.export_page_table(layer, seq_ids, n_seqs, indptr, indices,
                                             indices_capacity, last_page_len);
    *n_indices = total;
    if (total > indices_capacity)
      fail(Errc::BufferTooSmall, "indices holds " + std::to_string(indices_capacity) +
                                     " entries; the page table needs " + std::to_string(total));
  });
}

KVC_API kvc_status kvc_convert(const void *src, kvc_dtype src_dtype, void *dst,
                               kvc_dtype dst_dtype, size_t n) {
  return guard([&] {
    const DType s = dtype_arg(src_dtype, "src_dtype");
    const DType d = dtype_arg(dst_dtype, "dst_dtype");
    if (n == 0) return;
    need(src, "src");
    need(dst, "dst");
    if (n > SIZE_MAX / 4) fail(Errc::Overflow, "n elements overflow the address space");
    kvc::convert(src, s, dst, d, n);
  });
}

KVC_API kvc_status kvc_dtype_size(kvc_dtype dtype, size_t *bytes) {
  return guard([&] {
    need(bytes, "bytes");
    const int32_t d = static_cast<int32_t>(dtype);
    if (d >= 3 && d <= 8)
      fail(Errc::InvalidArgument, "dtype " + std::to_string(d) +
                                      " is a quantized storage format whose size depends on its "
                                      "codec: use kvc_quantize_sizes() or kvc_pool_get_layout()");
    *bytes = kvc::dtype_bytes(dtype_arg(dtype, "dtype"));
  });
}

KVC_API kvc_status(kvc_codec_init)(kvc_codec *codec) {
  return kvc_codec_init_sized(codec, kvc::api::size_0_3<kvc_codec>);
}

KVC_API kvc_status kvc_codec_init_sized(kvc_codec *codec, size_t struct_size) {
  return guard([&] {
    need(codec, "codec");
    kvc_codec d;
    codec_defaults(&d);
    kvc::api::init_sized(codec, struct_size, kCodecMin, d);
  });
}

KVC_API kvc_status kvc_pool_tensor_scales(kvc_pool *pool, uint32_t layer, float *k_scale,
                                          float *v_scale) {
  return guard([&] {
    auto &p = core_of(pool);
    const auto ks = p.tensor_scales(layer);
    if (k_scale) *k_scale = ks.first;
    if (v_scale) *v_scale = ks.second;
  });
}

KVC_API kvc_status(kvc_quant_sizes_init)(kvc_quant_sizes *sizes) {
  return kvc_quant_sizes_init_sized(sizes, kvc::api::size_0_3<kvc_quant_sizes>);
}

KVC_API kvc_status kvc_quant_sizes_init_sized(kvc_quant_sizes *sizes, size_t struct_size) {
  return guard([&] {
    need(sizes, "sizes");
    kvc::api::init_sized(sizes, struct_size, kQuantSizesMin, zeroed_struct<kvc_quant_sizes>());
  });
}

KVC_API kvc_status kvc_quantize_sizes(const kvc_codec *codec, uint64_t n, uint64_t d,
                                      kvc_quant_sizes *sizes) {
  return guard([&] {
    need(sizes, "sizes");
    kvc::api::check_output_struct(sizes, kQuantSizesMin, "kvc_quant_sizes");
    const QuantPlan q = plan_quant(codec, n, d);
    kvc_quant_sizes full{};
    full.struct_size = sizeof full;
    full.codes_bytes = q.codes;
    full.scales_bytes = q.spec.dtype <= kvc::DType::BF16 ? 0 : q.scales;
    full.zeros_bytes = q.zeros;
    full.num_scales = q.num_scales;
    kvc::api::write_output_struct(full, sizes);
  });
}

KVC_API kvc_status kvc_quantize(const kvc_codec *codec, const void *src, kvc_dtype src_dtype,
                                uint64_t n, uint64_t d, void *codes, void *scales, void *zeros) {
  return guard([&] {
    const QuantPlan q = plan_quant(codec, n, d);
    const DType st = dtype_arg(src_dtype, "src_dtype");
    if (n == 0) return;
    need(src, "src");
    need(codes, "codes");
    if (q.scales && !scales) fail(Errc::NullPointer, "scales is NULL but the codec has scales");
    if (q.zeros && !zeros) fail(Errc::NullPointer, "zeros is NULL but the codec is asymmetric");
    kvc::codec::quantize(q.spec, src, st, n, d, static_cast<uint8_t *>(codes),
                         static_cast<uint8_t *>(scales), static_cast<uint8_t *>(zeros));
  });
}

KVC_API kvc_status kvc_dequantize(const kvc_codec *codec, const void *codes, const void *scales,
                                  const void *zeros, uint64_t n, uint64_t d, void *dst,
                                  kvc_dtype dst_dtype) {
  return guard([&] {
    const QuantPlan q = plan_quant(codec, n, d);
    const DType dt = dtype_arg(dst_dtype, "dst_dtype");
    if (n == 0) return;
    need(codes, "codes");
    need(dst, "dst");
    if (q.scales && !scales) fail(Errc::NullPointer, "scales is NULL but the codec has scales");
    if (q.zeros && !zeros) fail(Errc::NullPointer, "zeros is NULL but the codec is asymmetric");
    kvc::codec::dequantize(q.spec, static_cast<const uint8_t *>(codes),
                           static_cast<const uint8_t *>(scales), static_cast<const uint8_t *>(zeros),
                           n, d, dst, dt);
  });
}

}  // extern "C"

struct kvc_policy {
  std::shared_ptr<const kvc::core::PolicySpec> spec;
};
struct kvc_plugin {
  std::shared_ptr<kvc::policy::Plugin> core;
};

namespace {

constexpr size_t kAttnParamsMin = offsetof(kvc_attention_params, observe_from) + sizeof(uint64_t);
constexpr size_t kPolicyConfigMin = offsetof(kvc_policy_config, plugin) + sizeof(void *);

void attn_defaults(kvc_attention_params *p) {
  std::memset(p, 0, sizeof *p);
  p->struct_size = sizeof *p;
  p->q_dtype = KVC_DTYPE_F32;
  p->out_dtype = KVC_DTYPE_F32;
  p->observe = KVC_OBSERVE_NONE;
}

kvc::core::AttnParams to_attn(const kvc_attention_params *in) {
  need(in, "params");
  kvc_attention_params c;
  attn_defaults(&c);
  kvc::api::read_input_struct(in, kAttnParamsMin, "kvc_attention_params", &c);
  kvc::core::AttnParams a;
  a.num_q_heads = c.num_q_heads;
  a.scale = c.scale;
  a.q_dtype = dtype_arg(c.q_dtype, "q_dtype");
  a.out_dtype = dtype_arg(c.out_dtype, "out_dtype");
  const int32_t ob = static_cast<int32_t>(c.observe);
  if (ob < 0 || ob > 2)
    fail(Errc::InvalidArgument, "observe " + std::to_string(ob) + ": unknown mode (KVC_OBSERVE_NONE, _ACCUMULATE, _REPLACE)");
  if (c.num_threads > 256) fail(Errc::InvalidArgument, "num_threads " + std::to_string(c.num_threads) + ": at most 256");
  a.observe = static_cast<uint32_t>(ob);
  a.observe_from = c.observe_from;
  a.num_threads = c.num_threads;
  return a;
}

void policy_defaults(kvc_policy_config *c) {
  std::memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  c->kind = KVC_POLICY_NONE;
  c->sink_tokens = 4;
  c->window = 32;
  c->recent_fraction = 0.5;
  c->kernel_size = 7;
  c->pooling = KVC_POOLING_MAX;
  c->schedule = KVC_PYRAMID_PAPER;
  c->beta = 20.0;
}

}  // namespace

extern "C" {

KVC_API kvc_status(kvc_attention_params_init)(kvc_attention_params *params) {
  return kvc_attention_params_init_sized(params, kvc::api::size_0_3<kvc_attention_params>);
}

KVC_API kvc_status kvc_attention_params_init_sized(kvc_attention_params *params,
                                                   size_t struct_size) {
  return guard([&] {
    need(params, "params");
    kvc_attention_params d;
    attn_defaults(&d);
    kvc::api::init_sized(params, struct_size, kAttnParamsMin, d);
  });
}

KVC_API kvc_status kvc_attention_decode(kvc_pool *pool, uint32_t layer, const uint64_t *seq_ids,
                                        size_t n_seqs, const void *q, void *out, float *lse,
                                        const kvc_attention_params *params) {
  return guard([&] {
    auto &p = core_of(pool);
    need(seq_ids, "seq_ids");
    need(q, "q");
    need(out, "out");
    const kvc::core::AttnParams a = to_attn(params);
    if (n_seqs == 0) fail(Errc::InvalidArgument, "n_seqs 0: pass at least one sequence");
    p.attention(layer, seq_ids, n_seqs, q, 1, false, out, lse, a);
  });
}

KVC_API kvc_status kvc_attention_prefill(kvc_pool *pool, uint32_t layer, uint64_t seq_id,
                                         const void *q, uint64_t n_q, void *out, float *lse,
                                         const kvc_attention_params *params) {
  return guard([&] {
    auto &p = core_of(pool);
    need(q, "q");
    need(out, "out");
    const kvc::core::AttnParams a = to_attn(params);
    if (n_q == 0) fail(Errc::InvalidArgument, "n_q 0: pass at least one query row");
    p.attention(layer, &seq_id, 1, q, n_q, true, out, lse, a);
  });
}

KVC_API kvc_status kvc_seq_observe_scores(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                          const float *scores, uint64_t n_tokens, int accumulate) {
  return guard([&] {
    auto &p = core_of(pool);
    need(scores, "scores");
    p.observe_scores(seq_id, layer, scores, n_tokens, accumulate != 0);
  });
}

KVC_API kvc_status kvc_seq_scores(kvc_pool *pool, uint64_t seq_id, uint32_t layer, float *out,
                                  uint64_t n_tokens) {
  return guard([&] {
    auto &p = core_of(pool);
    need(out, "out");
    p.read_scores(seq_id, layer, out, n_tokens);
  });
}

KVC_API kvc_status kvc_seq_rope_positions(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                          uint64_t pos, uint64_t n, int32_t *out) {
  return guard([&] {
    auto &p = core_of(pool);
    if (n) need(out, "out");
    p.rope_positions(seq_id, layer, pos, n, out);
  });
}

KVC_API kvc_status(kvc_policy_config_init)(kvc_policy_config *config) {
  return kvc_policy_config_init_sized(config, kvc::api::size_0_3<kvc_policy_config>);
}

KVC_API kvc_status kvc_policy_config_init_sized(kvc_policy_config *config, size_t struct_size) {
  return guard([&] {
    need(config, "config");
    kvc_policy_config d;
    policy_defaults(&d);
    kvc::api::init_sized(config, struct_size, kPolicyConfigMin, d);
  });
}

KVC_API kvc_status kvc_policy_create(const kvc_policy_config *config, kvc_policy **out) {
  return guard([&] {
    need(config, "config");
    need(out, "out");
    kvc_policy_config c;
    policy_defaults(&c);
    kvc::api::read_input_struct(config, kPolicyConfigMin, "kvc_policy_config", &c);
    auto sp = std::make_shared<kvc::core::PolicySpec>();
    sp->kind = static_cast<kvc::core::PolicyKind>(c.kind);
    sp->budget_tokens = c.budget_tokens;
    sp->compression_ratio = c.compression_ratio;
    sp->sink_tokens = c.sink_tokens;
    sp->recent_tokens = c.recent_tokens;
    sp->recent_fraction = c.recent_fraction;
    sp->window = c.window;
    sp->kernel_size = c.kernel_size;
    sp->pooling = static_cast<kvc::policy::Pooling>(c.pooling);
    sp->schedule = static_cast<kvc::policy::Schedule>(c.schedule);
    sp->beta = c.beta;
    sp->shift_positions = c.shift_positions != 0;
    sp->auto_evict = c.auto_evict != 0;
    if (c.plugin) sp->plugin = c.plugin->core;
    sp->validate();
    auto *pol = new kvc_policy;
    pol->spec = std::move(sp);
    *out = pol;
  });
}

KVC_API void kvc_policy_destroy(kvc_policy *policy) { delete policy; }

KVC_API kvc_status kvc_seq_set_policy(kvc_pool *pool, uint64_t seq_id, const kvc_policy *policy) {
  return guard([&] {
    auto &p = core_of(pool);
    p.set_policy(seq_id, policy ? policy->spec : nullptr);
  });
}

KVC_API kvc_status kvc_pool_set_policy(kvc_pool *pool, const kvc_policy *policy) {
  return guard([&] {
    auto &p = core_of(pool);
    p.set_policy(std::nullopt, policy ? policy->spec : nullptr);
  });
}

KVC_API kvc_status kvc_evict(kvc_pool *pool, uint64_t seq_id, const kvc_policy *policy, uint64_t *dropped) {
  return guard([&] {
    auto &p = core_of(pool);
    p.evict(seq_id, policy ? policy->spec.get() : nullptr, dropped);
  });
}

KVC_API kvc_status kvc_seq_keep(kvc_pool *pool, uint64_t seq_id, uint32_t layer, const uint64_t *keep,
                                uint64_t n_keep, uint64_t *dropped) {
  return guard([&] {
    auto &p = core_of(pool);
    if (n_keep > 0) need(keep, "keep");
    uint64_t d = 0;
    p.keep_tokens(seq_id, layer, keep, n_keep, &d);
    if (dropped) *dropped = d;
  });
}

KVC_API kvc_status kvc_plugin_load(const char *path, kvc_plugin **out) {
  return guard([&] {
    need(path, "path");
    need(out, "out");
    auto core = kvc::policy::Plugin::load(path);
    auto *pl = new kvc_plugin;
    pl->core = std::move(core);
    *out = pl;
  });
}

KVC_API void kvc_plugin_unload(kvc_plugin *plugin) { delete plugin; }

KVC_API const char *kvc_plugin_name(const kvc_plugin *plugin) { return plugin ? plugin->core->name() : nullptr; }


}  // extern "C"

namespace {
constexpr size_t kPrefixConfigMin = offsetof(kvc_prefix_config, tokenizer_id) + sizeof(void *);
constexpr size_t kPrefixResultMin = offsetof(kvc_prefix_result, partial_tokens) + sizeof(uint64_t);
constexpr size_t kPrefixStatsMin = offsetof(kvc_prefix_stats, reclaimed_total) + sizeof(uint64_t);

void prefix_defaults(kvc_prefix_config *c) {
  std::memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  c->hash = KVC_PREFIX_HASH_SHA256;
  c->verify_tokens = 1;
}

// Checks the prompt arguments and converts the extra keys.
std::vector<kvc::core::PrefixExtra> prefix_args(const int32_t *tokens, uint64_t n, const kvc_prefix_extra *extras,
                                                uint32_t n_extras) {
  if (n) need(tokens, "tokens");
  if (n > (uint64_t(1) << 31)) fail(Errc::Overflow, "n_tokens " + std::to_string(n) + " is above 2^31");
  if (n_extras > 64) fail(Errc::InvalidArgument, "n_extras " + std::to_string(n_extras) + ": at most 64");
  if (n_extras) need(extras, "extras");
  std::vector<kvc::core::PrefixExtra> ex(n_extras);
  for (uint32_t i = 0; i < n_extras; ++i) {
    if (extras[i].size > (size_t(1) << 20))
      fail(Errc::InvalidArgument, "extra key " + std::to_string(i) + " is larger than 1 MiB");
    if (extras[i].size && !extras[i].data) fail(Errc::NullPointer, "extra key " + std::to_string(i) + " has no data");
    ex[i] = {static_cast<const uint8_t *>(extras[i].data), extras[i].size};
  }
  return ex;
}

void write_result(const kvc::core::PrefixResult &r, kvc_prefix_result *out) {
  kvc_prefix_result full{};
  full.struct_size = sizeof full;
  full.hit_tokens = r.hit_tokens;
  full.hit_blocks = r.hit_blocks;
  full.partial_tokens = r.partial_tokens;
  full.tier_tokens = r.tier_tokens;
  full.pin = r.pin;
  kvc::api::write_output_struct(full, out);
}

struct CallbackBox {
  kvc_prefix_event_fn fn;
  void *user;
};
}  // namespace

extern "C" {

KVC_API kvc_status(kvc_prefix_config_init)(kvc_prefix_config *config) {
  return kvc_prefix_config_init_sized(config, kvc::api::size_0_3<kvc_prefix_config>);
}

KVC_API kvc_status kvc_prefix_config_init_sized(kvc_prefix_config *config, size_t struct_size) {
  return guard([&] {
    need(config, "config");
    kvc_prefix_config d;
    prefix_defaults(&d);
    kvc::api::init_sized(config, struct_size, kPrefixConfigMin, d);
  });
}

KVC_API kvc_status kvc_pool_enable_prefix_cache(kvc_pool *pool, const kvc_prefix_config *config) {
  return guard([&] {
    auto &p = core_of(pool);
    need(config, "config");
    kvc_prefix_config c;
    prefix_defaults(&c);
    kvc::api::read_input_struct(config, kPrefixConfigMin, "kvc_prefix_config", &c);
    const int32_t h = static_cast<int32_t>(c.hash);
    if (h != KVC_PREFIX_HASH_SHA256 && h != KVC_PREFIX_HASH_XXH3_128)
      fail(Errc::InvalidArgument, "hash " + std::to_string(h) + ": unknown (KVC_PREFIX_HASH_SHA256 or _XXH3_128)");
    kvc::core::PrefixConfig pc;
    pc.hash = static_cast<kvc::core::PrefixHash>(h);
    pc.verify_tokens = c.verify_tokens != 0;
    pc.seed_set = c.seed_set != 0;
    std::memcpy(pc.seed, c.seed, 32);
    if (c.model_id) pc.model_id = c.model_id;
    if (c.tokenizer_id) pc.tokenizer_id = c.tokenizer_id;
    // Extra-key names (0.4): bounded reads; the core checks them.
    if (c.n_extra_key_names > kvc::prefix::kMaxExtraKeyNames)
      fail(Errc::InvalidArgument, "n_extra_key_names " + std::to_string(c.n_extra_key_names) +
                                      ": at most " + std::to_string(kvc::prefix::kMaxExtraKeyNames));
    if (c.n_extra_key_names) need(c.extra_key_names, "extra_key_names");
    for (uint32_t i = 0; i < c.n_extra_key_names; ++i) {
      const char *name = c.extra_key_names[i];
      if (!name) fail(Errc::NullPointer, "extra_key_names[" + std::to_string(i) + "] is NULL");
      pc.extra_key_names.emplace_back(name, strnlen(name, kvc::prefix::kMaxExtraKeyNameBytes + 1));
    }
    p.prefix().enable(pc);
  });
}

KVC_API kvc_status kvc_prefix_lookup(kvc_pool *pool, const int32_t *tokens, uint64_t n_tokens,
                                     const kvc_prefix_extra *extras, uint32_t n_extras, uint32_t flags,
                                     kvc_prefix_result *result) {
  return guard([&] {
    auto &p = core_of(pool);
    need(result, "result");
    kvc::api::check_output_struct(result, kPrefixResultMin, "kvc_prefix_result");
    if (flags & ~(KVC_PREFIX_PARTIAL | KVC_PREFIX_PIN))
      fail(Errc::InvalidArgument, "unknown flags (known: KVC_PREFIX_PARTIAL, KVC_PREFIX_PIN)");
    const auto ex = prefix_args(tokens, n_tokens, extras, n_extras);
    const bool pin = (flags & KVC_PREFIX_PIN) != 0;
    if (pin && result->struct_size < offsetof(kvc_prefix_result, pin) + sizeof(uint64_t))
      fail(Errc::StructSize, "KVC_PREFIX_PIN needs a kvc_prefix_result with the pin field (0.3)");
    const auto kx = p.prefix().extra_keys(ex.data(), n_extras);
    const auto r =
        p.prefix().tiers().lookup(tokens, n_tokens, kx, (flags & KVC_PREFIX_PARTIAL) != 0, pin);
    write_result(r, result);
  });
}

KVC_API kvc_status kvc_prefix_attach(kvc_pool *pool, uint64_t seq_id, const int32_t *tokens,
                                     uint64_t n_tokens, const kvc_prefix_extra *extras, uint32_t n_extras,
                                     uint32_t flags, kvc_prefix_result *result) {
  return guard([&] {
    auto &p = core_of(pool);
    if (result) kvc::api::check_output_struct(result, kPrefixResultMin, "kvc_prefix_result");
    if (flags & ~KVC_PREFIX_PARTIAL) fail(Errc::InvalidArgument, "unknown flags (known: KVC_PREFIX_PARTIAL)");
    const auto ex = prefix_args(tokens, n_tokens, extras, n_extras);
    const auto kx = p.prefix().extra_keys(ex.data(), n_extras);
    const auto r = p.prefix().attach(seq_id, tokens, n_tokens, kx, (flags & KVC_PREFIX_PARTIAL) != 0);
    if (result) write_result(r, result);
  });
}

KVC_API kvc_status kvc_prefix_insert(kvc_pool *pool, uint64_t seq_id, const int32_t *tokens,
                                     uint64_t n_tokens, const kvc_prefix_extra *extras, uint32_t n_extras,
                                     uint64_t *n_registered) {
  return guard([&] {
    auto &p = core_of(pool);
    const auto ex = prefix_args(tokens, n_tokens, extras, n_extras);
    const uint64_t n =
        p.prefix().insert(seq_id, tokens, n_tokens, p.prefix().extra_keys(ex.data(), n_extras));
    if (n_registered) *n_registered = n;
  });
}

KVC_API kvc_status kvc_prefix_keys(kvc_pool *pool, const int32_t *tokens, uint64_t n_tokens,
                                   const kvc_prefix_extra *extras, uint32_t n_extras, uint8_t *keys_out,
                                   size_t capacity, size_t *key_size) {
  return guard([&] {
    auto &p = core_of(pool);
    need(key_size, "key_size");
    const auto ex = prefix_args(tokens, n_tokens, extras, n_extras);
    const auto kx = p.prefix().extra_keys(ex.data(), n_extras);
    const uint64_t ks = p.prefix().key_size();
    *key_size = ks;
    const uint64_t blocks = n_tokens / p.config().block_size;
    if (blocks * ks > capacity)
      fail(Errc::BufferTooSmall, std::to_string(blocks) + " keys need " + std::to_string(blocks * ks) +
                                     " bytes, capacity is " + std::to_string(capacity));
    if (blocks) need(keys_out, "keys_out");
    p.prefix().keys(tokens, n_tokens, kx, keys_out);
  });
}

KVC_API kvc_status kvc_seq_save(kvc_pool *pool, uint64_t seq_id, void *buffer, size_t capacity, size_t *size) {
  return guard([&] {
    auto &p = core_of(pool);
    need(size, "size");
    // One pass under the sequence's lock: the size, then (when it fits) the
    // record straight into the buffer.
    kvc::core::BufferSink sink(static_cast<uint8_t *>(buffer), capacity);
    const uint64_t want = p.seq_save(seq_id, sink);
    *size = want;
    if (!buffer || capacity < want)
      fail(Errc::BufferTooSmall, "the record of sequence " + std::to_string(seq_id) + " is " +
                                     std::to_string(want) + " bytes, capacity is " +
                                     std::to_string(buffer ? capacity : 0));
  });
}

KVC_API kvc_status kvc_seq_restore(kvc_pool *pool, uint64_t seq_id, const void *data, size_t size) {
  return guard([&] {
    auto &p = core_of(pool);
    need(data, "data");
    p.seq_restore(seq_id, static_cast<const uint8_t *>(data), size);
  });
}

KVC_API kvc_status kvc_seq_save_file(kvc_pool *pool, uint64_t seq_id, const char *path) {
  return guard([&] {
    auto &p = core_of(pool);
    need(path, "path");
    kvc::core::save_file(p, seq_id, path);  // streamed: no copy of the whole record in memory
  });
}

KVC_API kvc_status kvc_seq_restore_file(kvc_pool *pool, uint64_t seq_id, const char *path) {
  return guard([&] {
    auto &p = core_of(pool);
    need(path, "path");
    kvc::core::restore_file(p, seq_id, path);
  });
}

// ---------------------------------------------------------------------------
// Offload tiers

namespace {
constexpr size_t kTierConfigMin = offsetof(kvc_tier_config, ttl_seconds) + sizeof(uint64_t);
// The whole 0.3 struct (not sizeof: the minimum stays when the struct grows).
constexpr size_t kTierStatsMin = kvc::api::size_0_3<kvc_tier_stats>;

kvc_tier_config tier_defaults() {
  kvc_tier_config c;
  std::memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.kind = KVC_TIER_HOST;
  c.timeout_ms = 1000;
  return c;
}

}  // namespace

KVC_API kvc_status(kvc_tier_config_init)(kvc_tier_config *config, kvc_tier_kind kind) {
  return kvc_tier_config_init_sized(config, kind, kvc::api::size_0_3<kvc_tier_config>);
}

KVC_API kvc_status kvc_tier_config_init_sized(kvc_tier_config *config, kvc_tier_kind kind,
                                              size_t struct_size) {
  return guard([&] {
    need(config, "config");
    if (kind != KVC_TIER_HOST && kind != KVC_TIER_DISK && kind != KVC_TIER_REDIS)
      fail(Errc::InvalidArgument, "kind " + std::to_string(static_cast<int32_t>(kind)) +
                                      ": unknown (KVC_TIER_HOST, KVC_TIER_DISK or KVC_TIER_REDIS)");
    kvc_tier_config d = tier_defaults();
    d.kind = kind;
    kvc::api::init_sized(config, struct_size, kTierConfigMin, d);
  });
}

KVC_API kvc_status kvc_pool_add_tier(kvc_pool *pool, const kvc_tier_config *config, uint32_t *tier_index) {
  return guard([&] {
    auto &p = core_of(pool);
    need(config, "config");
    kvc_tier_config c = tier_defaults();
    kvc::api::read_input_struct(config, kTierConfigMin, "kvc_tier_config", &c);
    if (c.reserved != 0) fail(Errc::Unsupported, "kvc_tier_config.reserved must be 0");
    if (c.kind != KVC_TIER_HOST && c.kind != KVC_TIER_DISK && c.kind != KVC_TIER_REDIS)
      fail(Errc::InvalidArgument, "kind " + std::to_string(static_cast<int32_t>(c.kind)) + ": unknown");
    const uint32_t known = c.kind == KVC_TIER_DISK ? KVC_TIER_FSYNC : c.kind == KVC_TIER_REDIS ? KVC_TIER_REDIS_CLUSTER : 0u;
    if (c.flags & ~known)
      fail(Errc::InvalidArgument, c.kind == KVC_TIER_REDIS ? "unknown flags for a Redis tier" : "unknown flags for this tier kind");
    kvc::tier::Spec ts;
    ts.kind = static_cast<kvc::tier::Kind>(c.kind);
    ts.capacity_bytes = c.capacity_bytes;
    ts.path = c.path ? c.path : "";
    ts.fsync = (c.flags & KVC_TIER_FSYNC) != 0;
    ts.address = c.address ? c.address : "";
    ts.cluster = (c.flags & KVC_TIER_REDIS_CLUSTER) != 0;
    ts.timeout_ms = c.timeout_ms;
    ts.ttl_seconds = c.ttl_seconds;
    // Everything checked first; the tier is made by the pool once it can take it.
    const uint32_t i = p.prefix().tiers().add_tier(ts);
    if (tier_index) *tier_index = i;
  });
}

KVC_API kvc_status kvc_pool_set_offload(kvc_pool *pool, uint32_t queue_blocks, uint32_t load_timeout_ms) {
  return guard([&] { core_of(pool).prefix().tiers().set_offload(queue_blocks, load_timeout_ms); });
}

KVC_API kvc_status(kvc_tier_stats_init)(kvc_tier_stats *stats) {
  return kvc_tier_stats_init_sized(stats, kvc::api::size_0_3<kvc_tier_stats>);
}

KVC_API kvc_status kvc_tier_stats_init_sized(kvc_tier_stats *stats, size_t struct_size) {
  return guard([&] {
    need(stats, "stats");
    kvc::api::init_sized(stats, struct_size, kTierStatsMin, zeroed_struct<kvc_tier_stats>());
  });
}

KVC_API kvc_status kvc_pool_tier_stats(kvc_pool *pool, uint32_t tier_index, kvc_tier_stats *stats) {
  return guard([&] {
    auto &p = core_of(pool);
    need(stats, "stats");
    kvc::api::check_output_struct(stats, kTierStatsMin, "kvc_tier_stats");
    const kvc::core::TierCounts c = p.prefix().tiers().counts(tier_index);
    kvc_tier_stats full;
    std::memset(&full, 0, sizeof full);
    full.struct_size = sizeof full;
    full.kind = static_cast<kvc_tier_kind>(c.kind);
    full.bytes = c.bytes;
    full.entries = c.entries;
    full.hits = c.hits;
    full.misses = c.misses;
    full.demotions = c.demotions;
    full.promotions = c.promotions;
    full.drops = c.drops;
    full.evictions = c.evictions;
    full.errors = c.errors;
    full.pinned = c.pinned;
    std::snprintf(full.last_error, sizeof full.last_error, "%s", c.last_error.c_str());
    kvc::api::write_output_struct(full, stats);
  });
}

KVC_API kvc_status kvc_prefix_offload(kvc_pool *pool, const int32_t *tokens, uint64_t n_tokens,
                                      const kvc_prefix_extra *extras, uint32_t n_extras, uint64_t *n_queued) {
  return guard([&] {
    auto &p = core_of(pool);
    const auto ex = prefix_args(tokens, n_tokens, extras, n_extras);
    const uint64_t q = p.prefix().tiers().offload(tokens, n_tokens, p.prefix().extra_keys(ex.data(), n_extras));
    if (n_queued) *n_queued = q;
  });
}

KVC_API kvc_status kvc_pool_flush_tiers(kvc_pool *pool) {
  return guard([&] { core_of(pool).prefix().tiers().flush(); });
}

KVC_API kvc_status kvc_prefix_prefetch(kvc_pool *pool, const int32_t *tokens, uint64_t n_tokens,
                                       const kvc_prefix_extra *extras, uint32_t n_extras, uint64_t *ticket) {
  return guard([&] {
    auto &p = core_of(pool);
    need(ticket, "ticket");
    const auto ex = prefix_args(tokens, n_tokens, extras, n_extras);
    *ticket = p.prefix().tiers().prefetch(tokens, n_tokens, p.prefix().extra_keys(ex.data(), n_extras));
  });
}

namespace {
void poll_status(kvc::core::LoadState s, uint64_t ticket) {
  if (s == kvc::core::LoadState::Pending)
    fail(Errc::Pending, "load " + std::to_string(ticket) + " is still reading from the tiers");
  if (s == kvc::core::LoadState::TimedOut)
    fail(Errc::Timeout, "load " + std::to_string(ticket) +
                            ": the tiers did not answer within the load timeout; its reserved blocks are back in the pool");
}
}  // namespace

KVC_API kvc_status kvc_prefix_load(kvc_pool *pool, const int32_t *tokens, uint64_t n_tokens,
                                   const kvc_prefix_extra *extras, uint32_t n_extras, uint64_t *loaded_tokens) {
  return guard([&] {
    auto &p = core_of(pool);
    const auto ex = prefix_args(tokens, n_tokens, extras, n_extras);
    if (loaded_tokens) *loaded_tokens = 0;
    const uint64_t t = p.prefix().tiers().prefetch(tokens, n_tokens, p.prefix().extra_keys(ex.data(), n_extras),
                                         /*sync=*/true);
    uint64_t loaded = 0;
    poll_status(p.prefix().tiers().poll(t, /*wait=*/true, &loaded), t);
    if (loaded_tokens) *loaded_tokens = loaded;
  });
}

KVC_API kvc_status kvc_prefix_poll(kvc_pool *pool, uint64_t ticket, uint64_t *loaded_tokens) {
  return guard([&] {
    auto &p = core_of(pool);
    if (loaded_tokens) *loaded_tokens = 0;
    uint64_t loaded = 0;
    poll_status(p.prefix().tiers().poll(ticket, /*wait=*/false, &loaded), ticket);
    if (loaded_tokens) *loaded_tokens = loaded;
  });
}

KVC_API kvc_status kvc_prefix_unpin(kvc_pool *pool, uint64_t pin) {
  return guard([&] { core_of(pool).prefix().tiers().unpin(pin); });
}

KVC_API kvc_status(kvc_prefix_stats_init)(kvc_prefix_stats *stats) {
  return kvc_prefix_stats_init_sized(stats, kvc::api::size_0_3<kvc_prefix_stats>);
}

KVC_API kvc_status kvc_prefix_stats_init_sized(kvc_prefix_stats *stats, size_t struct_size) {
  return guard([&] {
    need(stats, "stats");
    kvc::api::init_sized(stats, struct_size, kPrefixStatsMin, zeroed_struct<kvc_prefix_stats>());
  });
}

KVC_API kvc_status kvc_prefix_get_stats(kvc_pool *pool, kvc_prefix_stats *stats) {
  return guard([&] {
    auto &p = core_of(pool);
    need(stats, "stats");
    kvc::api::check_output_struct(stats, kPrefixStatsMin, "kvc_prefix_stats");
    const auto c = p.prefix().counts();
    kvc_prefix_stats full{};
    full.struct_size = sizeof full;
    full.queried_tokens = c.queried_tokens;
    full.hit_tokens = c.hit_tokens;
    full.partial_tokens = c.partial_tokens;
    full.registered_blocks = c.registered;
    full.reclaimable_blocks = c.reclaimable;
    full.referenced_blocks = c.referenced;
    full.stored_total = c.inserted;
    full.removed_total = c.removed;
    full.reclaimed_total = c.reclaimed;
    kvc::api::write_output_struct(full, stats);
  });
}

KVC_API kvc_status kvc_prefix_set_callback(kvc_pool *pool, kvc_prefix_event_fn fn, void *user) {
  return guard([&] {
    auto &p = core_of(pool);
    auto set_box = [&] {
      pool->prefix_callback.fn = fn;
      pool->prefix_callback.user = user;
    };
    if (!fn) {
      p.prefix().set_callback(nullptr, nullptr, set_box);
      return;
    }
    p.prefix().set_callback(
        [](void *u, int kind, const uint8_t *key, const uint8_t *parent, uint32_t ks, uint64_t depth) {
          const auto *box = static_cast<const kvc_pool::Callback *>(u);
          kvc_prefix_event ev{};
          ev.struct_size = sizeof ev;
          ev.kind = kind == 0 ? KVC_PREFIX_STORED : KVC_PREFIX_REMOVED;
          ev.key_size = ks;
          ev.key = key;
          ev.parent_key = parent;
          ev.depth = depth;
          box->fn(box->user, &ev);
        },
        &pool->prefix_callback, set_box);
  });
}

}  // extern "C"

extern "C" {

static const kvc_api g_api = {
    sizeof(kvc_api),
    KVC_API_VERSION,
    0,
    kvc_version,
    kvc_version_string,
    kvc_status_string,
    kvc_last_error_message,
    kvc_pool_config_init,
    kvc_pool_create,
    kvc_pool_destroy,
    kvc_stats_init,
    kvc_pool_stats,
    kvc_pool_reset_peak,
    kvc_pool_layout_init,
    kvc_pool_get_layout,
    kvc_pool_get_config,
    kvc_seq_create,
    kvc_seq_fork,
    kvc_seq_truncate,
    kvc_seq_free,
    kvc_seq_length,
    kvc_seq_layer_tokens,
    kvc_seq_reserve,
    kvc_append,
    kvc_gather,
    kvc_seq_block_table,
    kvc_export_page_table,
    kvc_convert,
    kvc_dtype_size,
    kvc_codec_init,
    kvc_pool_tensor_scales,
    kvc_quant_sizes_init,
    kvc_quantize_sizes,
    kvc_quantize,
    kvc_dequantize,
    kvc_attention_params_init,
    kvc_attention_decode,
    kvc_attention_prefill,
    kvc_seq_observe_scores,
    kvc_seq_scores,
    kvc_seq_rope_positions,
    kvc_policy_config_init,
    kvc_policy_create,
    kvc_policy_destroy,
    kvc_seq_set_policy,
    kvc_pool_set_policy,
    kvc_evict,
    kvc_plugin_load,
    kvc_plugin_unload,
    kvc_plugin_name,
    kvc_prefix_config_init,
    kvc_pool_enable_prefix_cache,
    kvc_prefix_lookup,
    kvc_prefix_attach,
    kvc_prefix_insert,
    kvc_prefix_keys,
    kvc_prefix_stats_init,
    kvc_prefix_get_stats,
    kvc_prefix_set_callback,
    kvc_pool_set_stream,
    kvc_pool_sync,
    kvc_pool_copy_blocks,
    kvc_seq_save,
    kvc_seq_restore,
    kvc_seq_save_file,
    kvc_seq_restore_file,
    kvc_tier_config_init,
    kvc_pool_add_tier,
    kvc_pool_set_offload,
    kvc_tier_stats_init,
    kvc_pool_tier_stats,
    kvc_prefix_offload,
    kvc_pool_flush_tiers,
    kvc_prefix_load,
    kvc_prefix_prefetch,
    kvc_prefix_poll,
    kvc_prefix_unpin,
    // version 4 (0.4)
    kvc_pool_config_init_sized,
    kvc_stats_init_sized,
    kvc_pool_layout_init_sized,
    kvc_codec_init_sized,
    kvc_quant_sizes_init_sized,
    kvc_attention_params_init_sized,
    kvc_policy_config_init_sized,
    kvc_prefix_config_init_sized,
    kvc_prefix_stats_init_sized,
    kvc_tier_config_init_sized,
    kvc_tier_stats_init_sized,
    kvc_seq_keep,
};

KVC_API const kvc_api *kvc_get_api(uint32_t api_version) {
  if (api_version == 0 || api_version > KVC_API_VERSION) {
    char msg[96];
    std::snprintf(msg, sizeof msg, "API version %u: this library provides versions 1..%u",
                  static_cast<unsigned>(api_version), static_cast<unsigned>(KVC_API_VERSION));
    set_error(KVC_ERR_VERSION, msg);
    return nullptr;
  }
  return &g_api;
}

}  // extern "C"
