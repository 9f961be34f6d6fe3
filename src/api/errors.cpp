// Versions, status names and the thread's last error message; the checks
// that core's enums equal the public ones value for value.
#include <string>

#include "api/api_int.h"

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
static_assert(static_cast<int>(DType::F32) == KVC_DTYPE_F32 &&
              static_cast<int>(DType::F16) == KVC_DTYPE_F16 &&
              static_cast<int>(DType::BF16) == KVC_DTYPE_BF16 &&
              static_cast<int>(DType::FP8_E4M3) == KVC_DTYPE_FP8_E4M3 &&
              static_cast<int>(DType::FP8_E5M2) == KVC_DTYPE_FP8_E5M2 &&
              static_cast<int>(DType::INT8) == KVC_DTYPE_INT8 &&
              static_cast<int>(DType::INT4) == KVC_DTYPE_INT4 &&
              static_cast<int>(DType::INT2) == KVC_DTYPE_INT2 &&
              static_cast<int>(DType::INT3) == KVC_DTYPE_INT3 && kvc::kNumDTypes == 9);
static_assert(static_cast<int>(kvc::core::TierKind::Host) == KVC_TIER_HOST &&
              static_cast<int>(kvc::core::TierKind::Disk) == KVC_TIER_DISK &&
              static_cast<int>(kvc::core::TierKind::Redis) == KVC_TIER_REDIS);
static_assert(static_cast<int>(kvc::core::Layout::NHD) == KVC_LAYOUT_NHD &&
              static_cast<int>(kvc::core::Layout::HND) == KVC_LAYOUT_HND);
static_assert(static_cast<int>(kvc::core::Device::CPU) == KVC_DEVICE_CPU &&
              static_cast<int>(kvc::core::Device::CUDA) == KVC_DEVICE_CUDA);
static_assert(static_cast<int>(kvc::core::HeadBudget::Uniform) == KVC_HEAD_BUDGET_UNIFORM &&
              static_cast<int>(kvc::core::HeadBudget::AdaKV) == KVC_HEAD_BUDGET_ADAKV);
static_assert(static_cast<int>(kvc::core::PolicyKind::KVzip) == KVC_POLICY_KVZIP &&
              static_cast<int>(kvc::core::PolicyKind::DuoAttention) == KVC_POLICY_DUO_ATTENTION);
static_assert(kvc::core::kFlagHeadwise == KVC_POOL_HEADWISE &&
              kvc::core::kFlagPreRopeKeys == KVC_POOL_PRE_ROPE_KEYS);

kvc::core::Pool &kvc::api::core_pool(kvc_pool *pool) {
  return pool->core;
}

namespace {
thread_local std::string t_last_error;
}  // namespace

kvc_status kvc::api::set_error(kvc_status s, const char *msg) {
  try {
    t_last_error = msg;
  } catch (...) {
    // Keep the status even if the message cannot be stored.
  }
  return s;
}

extern "C" {

KVC_API uint32_t kvc_version(void) {
  return KVC_VERSION_NUMBER;
}

KVC_API const char *kvc_version_string(void) {
#define KVC_STR2(x) #x
#define KVC_STR(x) KVC_STR2(x)
  return KVC_STR(KVC_VERSION_MAJOR) "." KVC_STR(KVC_VERSION_MINOR) "." KVC_STR(KVC_VERSION_PATCH);
}

KVC_API const char *kvc_status_string(kvc_status s) {
  switch (s) {
    case KVC_OK:
      return "KVC_OK";
    case KVC_ERR_INVALID_ARGUMENT:
      return "KVC_ERR_INVALID_ARGUMENT";
    case KVC_ERR_NULL_POINTER:
      return "KVC_ERR_NULL_POINTER";
    case KVC_ERR_STRUCT_SIZE:
      return "KVC_ERR_STRUCT_SIZE";
    case KVC_ERR_UNSUPPORTED:
      return "KVC_ERR_UNSUPPORTED";
    case KVC_ERR_OVERFLOW:
      return "KVC_ERR_OVERFLOW";
    case KVC_ERR_OUT_OF_MEMORY:
      return "KVC_ERR_OUT_OF_MEMORY";
    case KVC_ERR_POOL_EXHAUSTED:
      return "KVC_ERR_POOL_EXHAUSTED";
    case KVC_ERR_SEQ_NOT_FOUND:
      return "KVC_ERR_SEQ_NOT_FOUND";
    case KVC_ERR_SEQ_EXISTS:
      return "KVC_ERR_SEQ_EXISTS";
    case KVC_ERR_OUT_OF_RANGE:
      return "KVC_ERR_OUT_OF_RANGE";
    case KVC_ERR_NOT_RESERVED:
      return "KVC_ERR_NOT_RESERVED";
    case KVC_ERR_BUFFER_TOO_SMALL:
      return "KVC_ERR_BUFFER_TOO_SMALL";
    case KVC_ERR_DEVICE_UNAVAILABLE:
      return "KVC_ERR_DEVICE_UNAVAILABLE";
    case KVC_ERR_VERSION:
      return "KVC_ERR_VERSION";
    case KVC_ERR_INVALID_SCALE:
      return "KVC_ERR_INVALID_SCALE";
    case KVC_ERR_NON_FINITE:
      return "KVC_ERR_NON_FINITE";
    case KVC_ERR_INTERNAL:
      return "KVC_ERR_INTERNAL";
    case KVC_ERR_INCOMPATIBLE:
      return "KVC_ERR_INCOMPATIBLE";
    case KVC_ERR_CORRUPT:
      return "KVC_ERR_CORRUPT";
    case KVC_ERR_IO:
      return "KVC_ERR_IO";
    case KVC_ERR_PENDING:
      return "KVC_ERR_PENDING";
    case KVC_ERR_TIMEOUT:
      return "KVC_ERR_TIMEOUT";
    case KVC_ERR_EXCEEDS_CAPACITY:
      return "KVC_ERR_EXCEEDS_CAPACITY";
    case KVC_STATUS_FORCE_32BIT:
    case KVC_STATUS_FORCE_SIGNED:
      break;
  }
  return "KVC_ERR_UNKNOWN";
}

KVC_API const char *kvc_last_error_message(void) {
  return t_last_error.c_str();
}

}  // extern "C"
