// Sequences, writing and reading K/V, block and page tables, and sequence
// records (buffer and file forms).
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "api/api_int.h"

using namespace kvc::api;

namespace {
// The page-table exports' argument checks, then `run` (the core export,
// returning the indices needed) and the buffer check.
template <typename Run>
void export_checked(const uint64_t *seq_ids, size_t n_seqs, const int32_t *indptr,
                    const int32_t *indices, size_t indices_capacity, const int32_t *last_page_len,
                    size_t *n_indices, Run &&run) {
  need(n_indices, "n_indices");
  need(indptr, "indptr");
  if (n_seqs > 0) {
    need(seq_ids, "seq_ids");
    need(last_page_len, "last_page_len");
  }
  if (n_seqs > 0x7fffffffu) fail(Errc::InvalidArgument, "n_seqs above 2^31-1");
  if (!indices && indices_capacity > 0) fail(Errc::NullPointer, "indices is NULL");
  const size_t total = run();
  *n_indices = total;
  if (total > indices_capacity)
    fail(Errc::BufferTooSmall, "indices holds " + std::to_string(indices_capacity) +
                                   " entries; the page table needs " + std::to_string(total));
}
}  // namespace

extern "C" {

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
    export_checked(seq_ids, n_seqs, indptr, indices, indices_capacity, last_page_len, n_indices,
                   [&] {
                     return p.export_page_table(layer, seq_ids, n_seqs, indptr, indices,
                                                indices_capacity, last_page_len);
                   });
  });
}

KVC_API kvc_status kvc_seq_head_tokens(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                       uint32_t head, uint64_t *n_tokens) {
  return guard([&] {
    auto &p = core_of(pool);
    need(n_tokens, "n_tokens");
    *n_tokens = p.seq_head_tokens(seq_id, layer, head);
  });
}

KVC_API kvc_status kvc_gather_head(kvc_pool *pool, uint64_t seq_id, uint32_t layer, uint32_t head,
                                   uint64_t first, uint64_t n, void *k_out, void *v_out,
                                   kvc_dtype dst, int32_t *positions_out) {
  return guard([&] {
    auto &p = core_of(pool);
    if (!k_out && !v_out && !positions_out)
      fail(Errc::NullPointer, "k_out, v_out and positions_out are all NULL");
    p.gather_head(seq_id, layer, head, first, n, k_out, v_out, dtype_arg(dst, "dst"),
                  positions_out);
  });
}

KVC_API kvc_status kvc_seq_head_block_table(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                            uint32_t head, int32_t *block_ids, size_t capacity,
                                            size_t *n_blocks) {
  return guard([&] {
    auto &p = core_of(pool);
    need(n_blocks, "n_blocks");
    const size_t n = p.head_block_table(seq_id, layer, head, block_ids, capacity);
    *n_blocks = n;
    if (block_ids && n > capacity)
      fail(Errc::BufferTooSmall, "block_ids holds " + std::to_string(capacity) +
                                     " entries; the block table has " + std::to_string(n));
  });
}

KVC_API kvc_status kvc_export_head_page_table(kvc_pool *pool, uint32_t layer,
                                              const uint64_t *seq_ids, size_t n_seqs,
                                              int32_t *indptr, int32_t *indices,
                                              size_t indices_capacity, int32_t *last_page_len,
                                              size_t *n_indices) {
  return guard([&] {
    auto &p = core_of(pool);
    export_checked(seq_ids, n_seqs, indptr, indices, indices_capacity, last_page_len, n_indices,
                   [&] {
                     return p.export_head_page_table(layer, seq_ids, n_seqs, indptr, indices,
                                                     indices_capacity, last_page_len);
                   });
  });
}

KVC_API kvc_status kvc_seq_save(kvc_pool *pool, uint64_t seq_id, void *buffer, size_t capacity,
                                size_t *size) {
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

}  // extern "C"
