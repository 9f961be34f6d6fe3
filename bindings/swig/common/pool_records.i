/*
 * bindings/swig/common/pool_records.i: the Pool's sequence records: save / restore
 * (memory and files) and llama.cpp state blobs (import / export).
 * %included by bindings/swig/kvcache_common.i (see there for the overlays'
 * contract); no language's overlay includes it directly.
 */
%extend kvc_swig_pool {
  /** Bytes of the sequence's record (save_into needs this much). */
  uint64_t save_size(uint64_t seq_id) {
    size_t n = 0;
    KVC_POOL(0);
    const kvc_status st = kvc_seq_save(pool_, seq_id, NULL, 0, &n);
    if (st != KVC_ERR_BUFFER_TOO_SMALL) kvc_swig_check(st);
    return n;
  }
  /** Save the sequence's record (kvc_seq_save) into a caller buffer; returns its size. */
  uint64_t save_into(uint64_t seq_id, void *dst, size_t dst_bytes) {
    size_t n = 0;
    KVC_POOL(0);
    kvc_swig_check(kvc_seq_save(pool_, seq_id, dst, dst_bytes, &n));
    return n;
  }
  /** Create seq_id from a record of save_into (kvc_seq_restore). */
  void restore(uint64_t seq_id, const void *src, size_t src_bytes) {
    KVC_POOL();
    kvc_swig_check(kvc_seq_restore(pool_, seq_id, src, src_bytes));
  }
  /** Create seq_id from a llama.cpp sequence state blob (kvc_seq_import_llama); returns the
   * tokens imported. flags: LLAMA_ATTN_ROT or 0. */
  uint64_t import_llama(uint64_t seq_id, const void *src, size_t src_bytes, uint32_t flags = 0) {
    uint64_t n = 0;
    KVC_POOL(0);
    kvc_swig_check(kvc_seq_import_llama(pool_, seq_id, src, src_bytes, flags, &n));
    return n;
  }
  /** Bytes of the sequence as a llama.cpp sequence state blob (kvc_seq_export_llama). */
  uint64_t export_llama_size(uint64_t seq_id, int32_t llama_seq_id, int32_t k_type, int32_t v_type,
                             uint32_t flags) {
    size_t n = 0;
    KVC_POOL(0);
    const kvc_status st = kvc_seq_export_llama(pool_, seq_id, llama_seq_id, (kvc_llama_type)k_type,
                                               (kvc_llama_type)v_type, flags, NULL, 0, &n);
    if (st != KVC_ERR_BUFFER_TOO_SMALL) kvc_swig_check(st);
    return n;
  }
  /** Write the sequence as a llama.cpp sequence state blob into a caller buffer; returns its size.
   * k_type / v_type: LLAMA_F32, LLAMA_F16, LLAMA_Q8_0; flags: LLAMA_ATTN_ROT, LLAMA_V_TRANS. */
  uint64_t export_llama_into(uint64_t seq_id, int32_t llama_seq_id, int32_t k_type, int32_t v_type,
                             uint32_t flags, void *dst, size_t dst_bytes) {
    size_t n = 0;
    KVC_POOL(0);
    kvc_swig_check(kvc_seq_export_llama(pool_, seq_id, llama_seq_id, (kvc_llama_type)k_type,
                                        (kvc_llama_type)v_type, flags, dst, dst_bytes, &n));
    return n;
  }
  /** Save the sequence into a file, atomically (kvc_seq_save_file). */
  void save_file(uint64_t seq_id, const std::string &path) {
    KVC_POOL();
    if (!kvc_swig_c_string("path", path)) return;
    kvc_swig_check(kvc_seq_save_file(pool_, seq_id, path.c_str()));
  }
  /** Create seq_id from a file written by save_file (kvc_seq_restore_file). */
  void restore_file(uint64_t seq_id, const std::string &path) {
    KVC_POOL();
    if (!kvc_swig_c_string("path", path)) return;
    kvc_swig_check(kvc_seq_restore_file(pool_, seq_id, path.c_str()));
  }

}
