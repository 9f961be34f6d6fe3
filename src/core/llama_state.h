// llama.cpp per-sequence state blobs (llama_state_seq_get_data) to and from
// pool sequences: kvc_seq_import_llama / kvc_seq_export_llama (docs/engines.md).
#pragma once
#include <cstddef>
#include <cstdint>

namespace kvc::core {

class Pool;

// The ggml types a blob's K / V may have (their ggml_type values).
enum class LlamaType : int32_t { F32 = 0, F16 = 1, Q8_0 = 8 };

constexpr uint32_t kLlamaAttnRot = 0x1u;  // K / V in llama.cpp's Hadamard-rotated space
constexpr uint32_t kLlamaVTrans = 0x2u;   // export: V transposed (no flash attention)

// Creates sequence `id` from the blob (every check before the sequence
// exists; on any failure nothing is left). Returns the tokens imported.
// Throws Error: Corrupt, Incompatible, Unsupported, InvalidArgument,
// SeqExists and what the pool's append throws.
uint64_t llama_import(Pool &pool, uint64_t id, const uint8_t *blob, size_t size, uint32_t flags);

// The blob's size; writes it to buf when buf is not NULL and capacity holds it
// (the caller reports BufferTooSmall otherwise). Throws Error: InvalidArgument,
// Unsupported, SeqNotFound, Overflow.
size_t llama_export(const Pool &pool, uint64_t id, int32_t llama_seq_id, int32_t k_type,
                    int32_t v_type, uint32_t flags, uint8_t *buf, size_t capacity);

}  // namespace kvc::core
