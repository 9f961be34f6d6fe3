// llama.cpp sequence state blobs (kvc_seq_import_llama / kvc_seq_export_llama).
#include "api/api_int.h"
#include "core/llama_state.h"

using namespace kvc::api;

static_assert(kvc::core::kLlamaAttnRot == KVC_LLAMA_ATTN_ROT);
static_assert(kvc::core::kLlamaVTrans == KVC_LLAMA_V_TRANS);
static_assert(static_cast<int32_t>(kvc::core::LlamaType::F32) == KVC_LLAMA_F32);
static_assert(static_cast<int32_t>(kvc::core::LlamaType::F16) == KVC_LLAMA_F16);
static_assert(static_cast<int32_t>(kvc::core::LlamaType::Q8_0) == KVC_LLAMA_Q8_0);

extern "C" {

KVC_API kvc_status kvc_seq_import_llama(kvc_pool *pool, uint64_t seq_id, const void *blob,
                                        size_t size, uint32_t flags, uint64_t *n_tokens) {
  if (n_tokens) *n_tokens = 0;
  return guard([&] {
    auto &p = core_of(pool);
    if (size) need(blob, "blob");
    const uint64_t n =
        kvc::core::llama_import(p, seq_id, static_cast<const uint8_t *>(blob), size, flags);
    if (n_tokens) *n_tokens = n;
  });
}

KVC_API kvc_status kvc_seq_export_llama(kvc_pool *pool, uint64_t seq_id, int32_t llama_seq_id,
                                        kvc_llama_type k_type, kvc_llama_type v_type,
                                        uint32_t flags, void *buf, size_t capacity, size_t *size) {
  if (size) *size = 0;
  return guard([&] {
    auto &p = core_of(pool);
    need(size, "size");
    if (capacity && !buf) fail(Errc::NullPointer, "buf is NULL");
    const size_t total = kvc::core::llama_export(
        p, seq_id, llama_seq_id, static_cast<int32_t>(k_type), static_cast<int32_t>(v_type), flags,
        static_cast<uint8_t *>(buf), capacity);
    *size = total;
    if (capacity < total)
      fail(Errc::BufferTooSmall, "the blob has " + std::to_string(total) + " bytes, the buffer " +
                                     std::to_string(capacity));
  });
}

}  // extern "C"
