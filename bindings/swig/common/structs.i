/*
 * bindings/swig/common/structs.i: the config and result structs: defaults on
 * construction, init_sized() for other header sizes, the tier error string,
 * Pool.prefix_poll()'s answer.
 * %included by bindings/swig/kvcache_common.i (see there for the overlays'
 * contract); no language's overlay includes it directly.
 */
/* ---- defaults on construction ---- */
%extend kvc_pool_config {
  kvc_pool_config() {
    kvc_pool_config *c = new kvc_pool_config;
    kvc_pool_config_init_sized(c, sizeof *c);
    return c;
  }
  ~kvc_pool_config() { delete $self; }
  /** Initialise a caller buffer as a kvc_pool_config of struct_size bytes (another header's size): kvc_pool_config_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_pool_config_init_sized((kvc_pool_config *)dst, struct_size));
  }
}
%extend kvc_codec {
  kvc_codec() {
    kvc_codec *c = new kvc_codec;
    kvc_codec_init_sized(c, sizeof *c);
    return c;
  }
  ~kvc_codec() { delete $self; }
  /** Initialise a caller buffer as a kvc_codec of struct_size bytes (another header's size): kvc_codec_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_codec_init_sized((kvc_codec *)dst, struct_size));
  }

  /** Buffer sizes quantize() needs for `[n][d]` values. */
  kvc_quant_sizes sizes(uint64_t n, uint64_t d) {
    const kvc_codec codec = *$self;
    kvc_quant_sizes s;
    kvc_quant_sizes_init_sized(&s, sizeof s);
    kvc_swig_check(kvc_quantize_sizes(&codec, n, d, &s));
    return s;
  }

  /**
   * Quantize `src` (`[n][d]` of src_dtype, n = bytes / (d x element size))
   * into caller buffers of at least sizes(n, d) bytes each (scales and zeros
   * may be empty when the codec has none). Returns n.
   */
  uint64_t quantize(const void *src, size_t src_bytes, kvc_dtype src_dtype, uint64_t d,
                    void *codes_out, size_t codes_out_bytes, void *scales_out, size_t scales_out_bytes,
                    void *zeros_out, size_t zeros_out_bytes) {
    /* One copy of the codec for the size check and the call: another thread
     * may change the object's fields meanwhile. */
    const kvc_codec codec = *$self;
    size_t elem = kvc_swig_elem(src_dtype);
    if (elem == 0) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "src_dtype " + std::to_string((int)src_dtype) + ": must be f32, f16 or bf16");
      return 0;
    }
    if (d == 0 || d > ((uint64_t)1 << 24)) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "d " + std::to_string(d) + ": must be 1..2^24");
      return 0;
    }
    if (src_bytes % (elem * d) != 0) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "src holds " + std::to_string(src_bytes) +
                    " bytes: not whole rows of d = " + std::to_string(d) + " f32/f16/bf16 values");
      return 0;
    }
    uint64_t n = src_bytes / (elem * d);
    kvc_quant_sizes s;
    kvc_quant_sizes_init_sized(&s, sizeof s);
    if (kvc_swig_check(kvc_quantize_sizes(&codec, n, d, &s))) return 0;
    if (!kvc_swig_need("codes", codes_out_bytes, s.codes_bytes) ||
        !kvc_swig_need("scales", scales_out_bytes, s.scales_bytes) ||
        !kvc_swig_need("zeros", zeros_out_bytes, s.zeros_bytes))
      return 0;
    kvc_swig_check(kvc_quantize(&codec, src, src_dtype, n, d, codes_out, scales_out, zeros_out));
    return n;
  }

  /** Dequantize `[n][d]` values into `dst` (at least n x d elements of dst_dtype). */
  void dequantize(const void *codes, size_t codes_bytes, const void *scales, size_t scales_bytes,
                  const void *zeros, size_t zeros_bytes, uint64_t n, uint64_t d,
                  void *dst, size_t dst_bytes, kvc_dtype dst_dtype) {
    const kvc_codec codec = *$self;
    kvc_quant_sizes s;
    kvc_quant_sizes_init_sized(&s, sizeof s);
    if (kvc_swig_check(kvc_quantize_sizes(&codec, n, d, &s))) return;
    size_t elem = kvc_swig_elem(dst_dtype);
    if (elem == 0) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "dst_dtype " + std::to_string((int)dst_dtype) + ": must be f32, f16 or bf16");
      return;
    }
    if (!kvc_swig_need("codes", codes_bytes, s.codes_bytes) ||
        !kvc_swig_need("scales", scales_bytes, s.scales_bytes) ||
        !kvc_swig_need("zeros", zeros_bytes, s.zeros_bytes) ||
        !kvc_swig_need("dst", dst_bytes, n * d * elem))
      return;
    kvc_swig_check(kvc_dequantize(&codec, codes, scales, zeros, n, d, dst, dst_dtype));
  }
}
%extend kvc_policy_config {
  kvc_policy_config() {
    kvc_policy_config *c = new kvc_policy_config;
    kvc_policy_config_init_sized(c, sizeof *c);
    return c;
  }
  ~kvc_policy_config() { delete $self; }
  /** Initialise a caller buffer as a kvc_policy_config of struct_size bytes (another header's size): kvc_policy_config_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_policy_config_init_sized((kvc_policy_config *)dst, struct_size));
  }
}
%extend kvc_prefix_config {
  kvc_prefix_config() {
    kvc_prefix_config *c = new kvc_prefix_config;
    kvc_prefix_config_init_sized(c, sizeof *c);
    return c;
  }
  ~kvc_prefix_config() { delete $self; }
  /** Initialise a caller buffer as a kvc_prefix_config of struct_size bytes (another header's size): kvc_prefix_config_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_prefix_config_init_sized((kvc_prefix_config *)dst, struct_size));
  }
  /** Seed the key chain's root with exactly 32 bytes (sets seed_set), so keys match across pools and restarts. */
  void set_seed(const void *seed, size_t seed_bytes) {
    if (seed == NULL || seed_bytes != sizeof $self->seed) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "the seed must be exactly 32 bytes, got " + std::to_string(seed_bytes));
      return;
    }
    memcpy($self->seed, seed, sizeof $self->seed);
    $self->seed_set = 1;
  }
}

/* Result structs: the library's defaults (zeros) on construction too. */
%extend kvc_stats {
  kvc_stats() {
    kvc_stats *s = new kvc_stats;
    kvc_stats_init_sized(s, sizeof *s);
    return s;
  }
  ~kvc_stats() { delete $self; }
  /** Initialise a caller buffer as a kvc_stats of struct_size bytes: kvc_stats_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_stats_init_sized((kvc_stats *)dst, struct_size));
  }
}
%extend kvc_prefix_stats {
  kvc_prefix_stats() {
    kvc_prefix_stats *s = new kvc_prefix_stats;
    kvc_prefix_stats_init_sized(s, sizeof *s);
    return s;
  }
  ~kvc_prefix_stats() { delete $self; }
  /** Initialise a caller buffer as a kvc_prefix_stats of struct_size bytes: kvc_prefix_stats_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_prefix_stats_init_sized((kvc_prefix_stats *)dst, struct_size));
  }
}
%extend kvc_quant_sizes {
  kvc_quant_sizes() {
    kvc_quant_sizes *s = new kvc_quant_sizes;
    kvc_quant_sizes_init_sized(s, sizeof *s);
    return s;
  }
  ~kvc_quant_sizes() { delete $self; }
  /** Initialise a caller buffer as a kvc_quant_sizes of struct_size bytes: kvc_quant_sizes_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_quant_sizes_init_sized((kvc_quant_sizes *)dst, struct_size));
  }
}

%extend kvc_tier_config {
  /** Defaults of kvc_tier_config_init() for `kind` (path and address are arguments of Pool.add_tier()). */
  kvc_tier_config(kvc_tier_kind kind = KVC_TIER_HOST) {
    kvc_tier_config c;
    if (kvc_swig_check(kvc_tier_config_init_sized(&c, kind, sizeof c))) return NULL;
    return new kvc_tier_config(c);
  }
  ~kvc_tier_config() { delete $self; }
  /** Initialise a caller buffer as a kvc_tier_config of struct_size bytes for `kind`: kvc_tier_config_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size, kvc_tier_kind kind = KVC_TIER_HOST) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_tier_config_init_sized((kvc_tier_config *)dst, kind, struct_size));
  }
}
%extend kvc_tier_stats {
  kvc_tier_stats() {
    kvc_tier_stats *s = new kvc_tier_stats;
    kvc_tier_stats_init_sized(s, sizeof *s);
    return s;
  }
  ~kvc_tier_stats() { delete $self; }
  /** Initialise a caller buffer as a kvc_tier_stats of struct_size bytes: kvc_tier_stats_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_tier_stats_init_sized((kvc_tier_stats *)dst, struct_size));
  }
  /** The reason of the tier's last error, "" if none (the C field's bytes up to its NUL). */
  %immutable;
  std::string last_error_str;
  %mutable;
}
%{
/* The getter's wrapper takes the address of the result and converts it at
 * once: a per-thread copy, bounded by the array even without a NUL. */
static const std::string &kvc_tier_stats_last_error_str_get(kvc_tier_stats *s) {
  static thread_local std::string out;
  out.assign(s->last_error, strnlen(s->last_error, sizeof s->last_error));
  return out;
}
%}

/* Pool.prefix_poll()'s answer: done (loaded_tokens valid) or pending. */
%immutable kvc_swig_poll::done;
%immutable kvc_swig_poll::loaded_tokens;
struct kvc_swig_poll {
  bool done;
  uint64_t loaded_tokens;
};
