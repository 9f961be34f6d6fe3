/*
 * bindings/swig/common/pool.i: the Pool handle: creation (uniform and per-layer
 * codecs), sequences, K/V append and read, positions and block tables,
 * codebooks, eviction.
 * %included by bindings/swig/kvcache_common.i (see there for the overlays'
 * contract); no language's overlay includes it directly.
 */
struct kvc_swig_pool {};
%extend kvc_swig_pool {
  /** A pool (kvc_pool_create); k_codec / v_codec: null or the quantizer of K / V. */
  kvc_swig_pool(const kvc_pool_config *config, const kvc_codec *k_codec = NULL,
                const kvc_codec *v_codec = NULL) {
    if (config == NULL) {
      kvc_swig_fail(KVC_ERR_NULL_POINTER, "config is null");
      return NULL;
    }
    kvc_pool_config c = *config;
    c.k_codec = k_codec;
    c.v_codec = v_codec;
    kvc_pool *p = NULL;
    if (kvc_swig_check(kvc_pool_create(&c, &p))) return NULL;
    kvc_swig_pool *h = new kvc_swig_pool;
    h->p = p;
    return h;
  }
  /**
   * A pool with a codec per layer (kvc_pool_config.layer_k_codecs / layer_v_codecs, mixed
   * precision): layer_k / layer_v empty (every layer: k_codec / v_codec) or num_layers codecs,
   * entry i layer i's (a float dtype with SCALE_NONE: plain storage of that dtype; pass the pool's
   * own codec again for a layer that keeps it). ERR_INVALID_ARGUMENT for a table of another length;
   * otherwise what kvc_pool_create refuses (docs/codecs.md "Mixed precision per layer").
   */
  static kvc_swig_pool *with_layer_codecs(const kvc_pool_config *config, const kvc_codec *k_codec,
                                          const kvc_codec *v_codec,
                                          const std::vector<kvc_codec> &layer_k,
                                          const std::vector<kvc_codec> &layer_v) {
    if (config == NULL) {
      kvc_swig_fail(KVC_ERR_NULL_POINTER, "config is null");
      return NULL;
    }
    kvc_pool_config c = *config;
    c.k_codec = k_codec;
    c.v_codec = v_codec;
    const std::vector<kvc_codec> *in[2] = {&layer_k, &layer_v};
    for (int kv = 0; kv < 2; ++kv)  // the lengths first: a table is never larger than the caller's
      if (!in[kv]->empty() && in[kv]->size() != c.num_layers) {
        kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT,
                      std::string(kv ? "layer_v" : "layer_k") + ": " +
                          std::to_string(in[kv]->size()) + " codecs for " +
                          std::to_string(c.num_layers) + " layers (empty, or one per layer)");
        return NULL;
      }
    std::vector<const kvc_codec *> kt, vt;
    std::vector<const kvc_codec *> *out[2] = {&kt, &vt};
    for (int kv = 0; kv < 2; ++kv)
      for (const kvc_codec &e : *in[kv]) out[kv]->push_back(&e);
    if (!layer_k.empty()) c.layer_k_codecs = kt.data();
    if (!layer_v.empty()) c.layer_v_codecs = vt.data();
    kvc_pool *p = NULL;
    if (kvc_swig_check(kvc_pool_create(&c, &p))) return NULL;
    kvc_swig_pool *h = new kvc_swig_pool;
    h->p = p;
    return h;
  }
  ~kvc_swig_pool() {
    kvc_pool_destroy($self->p);
    delete $self;
  }
  /** Destroy the pool now, after the calls in flight; later calls fail with ERR_NULL_POINTER. Idempotent. */
  void close() {
    std::unique_lock<std::shared_mutex> lock($self->mu);
    kvc_pool_destroy($self->p);
    $self->p = NULL;
  }
  bool closed() {
    std::shared_lock<std::shared_mutex> lock($self->mu);
    return $self->p == NULL;
  }

  kvc_pool_config config() {
    kvc_pool_config c;
    kvc_pool_config_init_sized(&c, sizeof c);
    KVC_POOL(c);
    kvc_swig_check(kvc_pool_get_config(pool_, &c));
    c.k_codec = NULL;
    c.v_codec = NULL;
    return c;
  }
  kvc_stats stats() {
    kvc_stats s;
    kvc_stats_init_sized(&s, sizeof s);
    KVC_POOL(s);
    kvc_swig_check(kvc_pool_stats(pool_, &s));
    return s;
  }

  void seq_create(uint64_t seq_id) {
    KVC_POOL();
    kvc_swig_check(kvc_seq_create(pool_, seq_id));
  }
  void seq_fork(uint64_t parent_id, uint64_t child_id) {
    KVC_POOL();
    kvc_swig_check(kvc_seq_fork(pool_, parent_id, child_id));
  }
  void seq_truncate(uint64_t seq_id, uint64_t new_length) {
    KVC_POOL();
    kvc_swig_check(kvc_seq_truncate(pool_, seq_id, new_length));
  }
  void seq_free(uint64_t seq_id) {
    KVC_POOL();
    kvc_swig_check(kvc_seq_free(pool_, seq_id));
  }
  uint64_t seq_length(uint64_t seq_id) {
    uint64_t n = 0;
    KVC_POOL(0);
    kvc_swig_check(kvc_seq_length(pool_, seq_id, &n));
    return n;
  }
  uint64_t layer_tokens(uint64_t seq_id, uint32_t layer) {
    uint64_t n = 0;
    KVC_POOL(0);
    kvc_swig_check(kvc_seq_layer_tokens(pool_, seq_id, layer, &n));
    return n;
  }
  /** Reserve n_new positions in every layer (all or nothing). */
  void reserve(uint64_t seq_id, uint64_t n_new) {
    KVC_POOL();
    kvc_swig_check(kvc_seq_reserve(pool_, seq_id, n_new, NULL));
  }

  /**
   * Write K and V of n tokens at positions [pos, pos + n) of one layer:
   * each `[n][num_kv_heads][head_dim]` of dtype (f32, f16 or bf16),
   * n = bytes / row bytes. Returns n.
   */
  uint64_t append(uint64_t seq_id, uint32_t layer, uint64_t pos, const void *k, size_t k_bytes,
                  const void *v, size_t v_bytes, kvc_dtype dtype = KVC_DTYPE_F32) {
    KVC_POOL(0);
    size_t row = kvc_swig_row_bytes(pool_, dtype);
    uint64_t n = 0;
    if (row == 0 || !kvc_swig_tokens("k", k_bytes, row, &n)) return 0;
    if (v_bytes != k_bytes) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "v holds " + std::to_string(v_bytes) + " bytes, k " +
                    std::to_string(k_bytes) + ": K and V must have the same shape");
      return 0;
    }
    kvc_swig_check(kvc_append(pool_, seq_id, layer, pos, n, k, v, dtype));
    return n;
  }

  /**
   * Read K and/or V of the layer's tokens [first, first + n) into caller
   * buffers of `[n][num_kv_heads][head_dim]` dtype each (either may be
   * empty; n from the buffer sizes). Returns n.
   */
  uint64_t gather(uint64_t seq_id, uint32_t layer, uint64_t first, void *k_out, size_t k_out_bytes,
                  void *v_out, size_t v_out_bytes, kvc_dtype dtype = KVC_DTYPE_F32) {
    KVC_POOL(0);
    size_t row = kvc_swig_row_bytes(pool_, dtype);
    if (row == 0) return 0;
    if (k_out == NULL && v_out == NULL) {
      kvc_swig_fail(KVC_ERR_NULL_POINTER, "k_out and v_out are both empty");
      return 0;
    }
    uint64_t nk = 0, nv = 0;
    if (k_out != NULL && !kvc_swig_tokens("k_out", k_out_bytes, row, &nk)) return 0;
    if (v_out != NULL && !kvc_swig_tokens("v_out", v_out_bytes, row, &nv)) return 0;
    if (k_out != NULL && v_out != NULL && nk != nv) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "k_out and v_out hold different token counts");
      return 0;
    }
    uint64_t n = k_out != NULL ? nk : nv;
    kvc_swig_check(kvc_gather(pool_, seq_id, layer, first, n, k_out, v_out, dtype, NULL));
    return n;
  }

  /** Positions of the layer's tokens [first, first + n). */
  std::vector<int32_t> positions(uint64_t seq_id, uint32_t layer, uint64_t first, uint64_t n) {
    std::vector<int32_t> out;
    KVC_POOL(out);
    uint64_t held = 0;
    if (kvc_swig_check(kvc_seq_layer_tokens(pool_, seq_id, layer, &held))) return out;
    if (first > held || n > held - first) {
      kvc_swig_fail(KVC_ERR_OUT_OF_RANGE, "tokens [" + std::to_string(first) + ", " + std::to_string(first) + " + " +
                    std::to_string(n) + ") are beyond the " + std::to_string(held) + " the layer holds");
      return out;
    }
    out.resize(n);
    if (n == 0) return out;
    if (kvc_swig_check(kvc_gather(pool_, seq_id, layer, first, n, NULL, NULL, KVC_DTYPE_F32, out.data())))
      out.clear();
    return out;
  }

  /** Block ids of one layer of a sequence, in order. */
  std::vector<int32_t> block_table(uint64_t seq_id, uint32_t layer) {
    std::vector<int32_t> out;
    KVC_POOL(out);
    /* Another thread may grow or shrink the table between two calls: size
     * to what the last call reported until one fits. */
    for (;;) {
      size_t n = 0;
      const kvc_status st = kvc_seq_block_table(pool_, seq_id, layer, out.empty() ? NULL : out.data(), out.size(), &n);
      if (st == KVC_OK && n <= out.size()) {  /* (a NULL buffer only counts) */
        out.resize(n);
        return out;
      }
      if (st != KVC_OK && st != KVC_ERR_BUFFER_TOO_SMALL) {
        kvc_swig_check(st);
        out.clear();
        return out;
      }
      out.resize(n);
    }
  }

  /** Tokens one KV head of a layer holds (kvc_seq_head_tokens; head-wise pools differ per head). */
  uint64_t head_tokens(uint64_t seq_id, uint32_t layer, uint32_t head) {
    uint64_t n = 0;
    KVC_POOL(0);
    kvc_swig_check(kvc_seq_head_tokens(pool_, seq_id, layer, head, &n));
    return n;
  }
  /** Positions of one KV head's tokens, in cache order (kvc_gather_head). */
  std::vector<int32_t> head_positions(uint64_t seq_id, uint32_t layer, uint32_t head) {
    std::vector<int32_t> out;
    KVC_POOL(out);
    uint64_t n = 0;
    if (kvc_swig_check(kvc_seq_head_tokens(pool_, seq_id, layer, head, &n))) return out;
    out.resize(n);
    if (n && kvc_swig_check(kvc_gather_head(pool_, seq_id, layer, head, 0, n, NULL, NULL,
                                            KVC_DTYPE_F32, out.data())))
      out.clear();
    return out;
  }
  /** Block ids of one KV head of a layer (kvc_seq_head_block_table). */
  std::vector<int32_t> head_block_table(uint64_t seq_id, uint32_t layer, uint32_t head) {
    std::vector<int32_t> out;
    KVC_POOL(out);
    for (;;) {
      size_t n = 0;
      const kvc_status st = kvc_seq_head_block_table(pool_, seq_id, layer, head,
                                                     out.empty() ? NULL : out.data(), out.size(), &n);
      if (st == KVC_OK && n <= out.size()) {
        out.resize(n);
        return out;
      }
      if (st != KVC_OK && st != KVC_ERR_BUFFER_TOO_SMALL) {
        kvc_swig_check(st);
        out.clear();
        return out;
      }
      out.resize(n);
    }
  }

  /**
   * Per-channel key smoothing (kvc_pool_set_key_smoothing): keys are stored
   * as codes of (k - offset) / scale per channel. `smooth_scale` and
   * `smooth_offset` hold num_layers x num_kv_heads x head_dim float32 values
   * in native byte order (Python also takes numbers, converted; Java float[];
   * Go []float32); an empty offset means zeros, both empty remove the
   * smoothing. On a pool with no sequence and no prefix cache. The errors of
   * kvc_pool_set_key_smoothing, and ERR_INVALID_ARGUMENT when the bytes are
   * not whole float32 values or the two differ in size.
   */
  void set_key_smoothing(const void *smooth_scale, size_t smooth_scale_bytes,
                         const void *smooth_offset, size_t smooth_offset_bytes) {
    KVC_POOL();
    if (smooth_scale_bytes % sizeof(float) != 0 || smooth_offset_bytes % sizeof(float) != 0 ||
        (smooth_offset_bytes != 0 && smooth_offset_bytes != smooth_scale_bytes)) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT,
                    "scale (" + std::to_string(smooth_scale_bytes) + " bytes) and offset (" +
                        std::to_string(smooth_offset_bytes) +
                        " bytes) must be float32 values, the offset as many as the scale or none");
      return;
    }
    /* Aligned copies: a caller's bytes may start anywhere. */
    std::vector<float> sc(smooth_scale_bytes / sizeof(float)), off(smooth_offset_bytes / sizeof(float));
    if (!sc.empty()) memcpy(sc.data(), smooth_scale, smooth_scale_bytes);
    if (!off.empty()) memcpy(off.data(), smooth_offset, smooth_offset_bytes);
    kvc_swig_check(kvc_pool_set_key_smoothing(pool_, sc.empty() ? NULL : sc.data(),
                                              off.empty() ? NULL : off.data(), sc.size()));
  }

  /**
   * A codebook of the pool's keys (part 0) or values (part 1)
   * (kvc_pool_set_codebook): the part's int2/int3/int4 codes index
   * non-uniform levels instead of the evenly spaced integers. `levels` holds
   * num_layers x 2^bits float32 values in native byte order, layer by layer,
   * each in [-1, 1] and strictly ascending within a layer (Python also takes
   * numbers, converted; Java float[]; Go []float32); empty removes the part's
   * codebook. On a pool with no sequence and no prefix cache. The errors of
   * kvc_pool_set_codebook, and ERR_INVALID_ARGUMENT when the bytes are not
   * whole float32 values.
   */
  void set_codebook(uint32_t part, const void *levels, size_t levels_bytes) {
    KVC_POOL();
    if (levels_bytes % sizeof(float) != 0) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "levels (" + std::to_string(levels_bytes) +
                                                  " bytes) must be float32 values");
      return;
    }
    /* An aligned copy: a caller's bytes may start anywhere. */
    std::vector<float> lv(levels_bytes / sizeof(float));
    if (!lv.empty()) memcpy(lv.data(), levels, levels_bytes);
    kvc_swig_check(kvc_pool_set_codebook(pool_, part, lv.empty() ? NULL : lv.data(), lv.size()));
  }

  /** Set the pool's default eviction policy (null: none). */
  void set_policy(const kvc_swig_policy *policy) {
    KVC_POOL();
    KVC_POLICY(policy, p, );
    kvc_swig_check(kvc_pool_set_policy(pool_, p));
  }
  /** Attach a policy to one sequence (null: the pool's default). */
  void seq_set_policy(uint64_t seq_id, const kvc_swig_policy *policy) {
    KVC_POOL();
    KVC_POLICY(policy, p, );
    kvc_swig_check(kvc_seq_set_policy(pool_, seq_id, p));
  }
  /**
   * Evict with `policy` (null: the sequence's or the pool's); returns the
   * tokens each layer dropped, `[num_layers]`, as kvc_evict() does (empty
   * after a failure).
   */
  std::vector<unsigned long long> evict(uint64_t seq_id, const kvc_swig_policy *policy = NULL) {
    std::vector<unsigned long long> out;
    KVC_POOL(out);
    KVC_POLICY(policy, p, out);
    kvc_pool_config c;
    kvc_pool_config_init_sized(&c, sizeof c);
    if (kvc_swig_check(kvc_pool_get_config(pool_, &c))) return out;
    std::vector<uint64_t> dropped(c.num_layers, 0);
    if (kvc_swig_check(kvc_evict(pool_, seq_id, p, dropped.data()))) return out;
    out.assign(dropped.begin(), dropped.end());
    return out;
  }
}
