/*
 * bindings/swig/common/pool_prefix.i: the Pool's prefix cache and offload tiers:
 * lookup, attach, extra-key values, tiers, offload / load / prefetch / poll,
 * prefix statistics.
 * %included by bindings/swig/kvcache_common.i (see there for the overlays'
 * contract); no language's overlay includes it directly.
 */
%extend kvc_swig_pool {
  /**
   * Turn on the prefix cache (config null: defaults). extra_key_names: the
   * names of the extra keys (docs/prefix-cache.md), empty for positional
   * extra keys; the languages' prefix calls then take the values by name.
   */
  void enable_prefix_cache(const kvc_prefix_config *config = NULL, const std::string &model_id = std::string(),
                           const std::string &tokenizer_id = std::string(),
                           const std::vector<std::string> &extra_key_names = std::vector<std::string>()) {
    KVC_POOL();
    if (!kvc_swig_c_string("model_id", model_id) || !kvc_swig_c_string("tokenizer_id", tokenizer_id)) return;
    std::vector<const char *> names;
    for (size_t i = 0; i < extra_key_names.size(); ++i) {
      if (!kvc_swig_c_string("extra_key_names", extra_key_names[i])) return;
      names.push_back(extra_key_names[i].c_str());
    }
    kvc_prefix_config c;
    kvc_prefix_config_init_sized(&c, sizeof c);
    if (config != NULL) c = *config;
    c.model_id = model_id.c_str();
    c.tokenizer_id = tokenizer_id.c_str();
    c.extra_key_names = names.empty() ? NULL : names.data();
    c.n_extra_key_names = names.size() > 0xffffffffu ? 0xffffffffu : (uint32_t)names.size(); /* over 64: refused */
    std::lock_guard<std::mutex> g(self->names_mu);
    if (kvc_swig_check(kvc_pool_enable_prefix_cache(pool_, &c))) return;
    self->names = extra_key_names;
  }
  /** The extra-key names the prefix cache declares, in order (empty: positional or not enabled). */
  std::vector<std::string> extra_key_names() {
    std::vector<std::string> out;
    KVC_POOL(out);
    std::lock_guard<std::mutex> g(self->names_mu);
    out = self->names;
    return out;
  }
  /** Cached leading tokens of a prompt (salt: the tenant's extra key, empty for none). */
  kvc_prefix_result prefix_lookup(const int32_t *tokens, size_t n_tokens, uint32_t flags = 0,
                                  const std::string &salt = std::string()) {
    kvc_prefix_result r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    KVC_POOL(r);
    uint32_t n_extras = 0;
    kvc_prefix_extra e = kvc_swig_salt(salt, &n_extras);
    kvc_swig_check(kvc_prefix_lookup(pool_, tokens, n_tokens, &e, n_extras, flags, &r));
    return r;
  }
  /** Create seq_id holding the cached prefix of the prompt. */
  kvc_prefix_result prefix_attach(uint64_t seq_id, const int32_t *tokens, size_t n_tokens, uint32_t flags = 0,
                                  const std::string &salt = std::string()) {
    kvc_prefix_result r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    KVC_POOL(r);
    uint32_t n_extras = 0;
    kvc_prefix_extra e = kvc_swig_salt(salt, &n_extras);
    kvc_swig_check(kvc_prefix_attach(pool_, seq_id, tokens, n_tokens, &e, n_extras, flags, &r));
    return r;
  }
  /** Register the full blocks of a sequence's prompt; returns the blocks newly registered. */
  uint64_t prefix_insert(uint64_t seq_id, const int32_t *tokens, size_t n_tokens,
                         const std::string &salt = std::string()) {
    uint64_t n = 0;
    KVC_POOL(0);
    uint32_t n_extras = 0;
    kvc_prefix_extra e = kvc_swig_salt(salt, &n_extras);
    kvc_swig_check(kvc_prefix_insert(pool_, seq_id, tokens, n_tokens, &e, n_extras, &n));
    return n;
  }
  /*
   * The same calls with the extra keys as `values`: one value per declared
   * name, in the pool's order, each as a u32 little-endian size and its
   * bytes (the languages' by-name methods build it; positional pools take
   * any number). prefix_keys_values writes [blocks][key size] bytes into
   * keys_out and returns the key size.
   */
  kvc_prefix_result prefix_lookup_values(const int32_t *tokens, size_t n_tokens, uint32_t flags,
                                         const void *values, size_t values_bytes) {
    kvc_prefix_result r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    KVC_POOL(r);
    std::vector<kvc_prefix_extra> ex;
    if (!kvc_swig_values(values, values_bytes, &ex)) return r;
    kvc_swig_check(kvc_prefix_lookup(pool_, tokens, n_tokens, ex.data(), (uint32_t)ex.size(), flags, &r));
    return r;
  }
  kvc_prefix_result prefix_attach_values(uint64_t seq_id, const int32_t *tokens, size_t n_tokens, uint32_t flags,
                                         const void *values, size_t values_bytes) {
    kvc_prefix_result r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    KVC_POOL(r);
    std::vector<kvc_prefix_extra> ex;
    if (!kvc_swig_values(values, values_bytes, &ex)) return r;
    kvc_swig_check(kvc_prefix_attach(pool_, seq_id, tokens, n_tokens, ex.data(), (uint32_t)ex.size(), flags, &r));
    return r;
  }
  uint64_t prefix_insert_values(uint64_t seq_id, const int32_t *tokens, size_t n_tokens, const void *values,
                                size_t values_bytes) {
    uint64_t n = 0;
    KVC_POOL(0);
    std::vector<kvc_prefix_extra> ex;
    if (!kvc_swig_values(values, values_bytes, &ex)) return 0;
    kvc_swig_check(kvc_prefix_insert(pool_, seq_id, tokens, n_tokens, ex.data(), (uint32_t)ex.size(), &n));
    return n;
  }
  uint64_t prefix_keys_values(const int32_t *tokens, size_t n_tokens, const void *values, size_t values_bytes,
                              void *keys_out, size_t keys_out_bytes) {
    size_t ks = 0;
    KVC_POOL(0);
    std::vector<kvc_prefix_extra> ex;
    if (!kvc_swig_values(values, values_bytes, &ex)) return 0;
    kvc_swig_check(kvc_prefix_keys(pool_, tokens, n_tokens, ex.data(), (uint32_t)ex.size(), (uint8_t *)keys_out,
                                   keys_out_bytes, &ks));
    return ks;
  }
  uint64_t prefix_offload_values(const int32_t *tokens, size_t n_tokens, const void *values, size_t values_bytes) {
    uint64_t n = 0;
    KVC_POOL(0);
    std::vector<kvc_prefix_extra> ex;
    if (!kvc_swig_values(values, values_bytes, &ex)) return 0;
    kvc_swig_check(kvc_prefix_offload(pool_, tokens, n_tokens, ex.data(), (uint32_t)ex.size(), &n));
    return n;
  }
  uint64_t prefix_load_values(const int32_t *tokens, size_t n_tokens, const void *values, size_t values_bytes) {
    uint64_t n = 0;
    KVC_POOL(0);
    std::vector<kvc_prefix_extra> ex;
    if (!kvc_swig_values(values, values_bytes, &ex)) return 0;
    kvc_swig_check(kvc_prefix_load(pool_, tokens, n_tokens, ex.data(), (uint32_t)ex.size(), &n));
    return n;
  }
  uint64_t prefix_prefetch_values(const int32_t *tokens, size_t n_tokens, const void *values, size_t values_bytes) {
    uint64_t ticket = 0;
    KVC_POOL(0);
    std::vector<kvc_prefix_extra> ex;
    if (!kvc_swig_values(values, values_bytes, &ex)) return 0;
    kvc_swig_check(kvc_prefix_prefetch(pool_, tokens, n_tokens, ex.data(), (uint32_t)ex.size(), &ticket));
    return ticket;
  }
}

%extend kvc_swig_pool {
  /**
   * Add an offload tier below the pool (kvc_pool_add_tier, docs/tiers.md);
   * returns its index (0 for the first). path: the disk tier's directory,
   * address: Redis "host:port[,host:port...]" (empty: none); flags:
   * TIER_FSYNC, TIER_REDIS_CLUSTER or 0.
   */
  uint32_t add_tier(kvc_tier_kind kind, uint64_t capacity_bytes, const std::string &path = std::string(),
                    const std::string &address = std::string(), uint32_t flags = 0, uint32_t timeout_ms = 1000,
                    uint64_t ttl_seconds = 0) {
    uint32_t index = 0;
    KVC_POOL(0);
    if (!kvc_swig_c_string("path", path) || !kvc_swig_c_string("address", address)) return 0;
    kvc_tier_config c;
    if (kvc_swig_check(kvc_tier_config_init_sized(&c, kind, sizeof c))) return 0;
    c.capacity_bytes = capacity_bytes;
    c.path = path.empty() ? NULL : path.c_str();
    c.address = address.empty() ? NULL : address.c_str();
    c.flags = flags;
    c.timeout_ms = timeout_ms;
    c.ttl_seconds = ttl_seconds;
    kvc_swig_check(kvc_pool_add_tier(pool_, &c, &index));
    return index;
  }
  /** The offload writer's queue (blocks) and the load timeout (ms) (kvc_pool_set_offload). */
  void set_offload(uint32_t queue_blocks, uint32_t load_timeout_ms) {
    KVC_POOL();
    kvc_swig_check(kvc_pool_set_offload(pool_, queue_blocks, load_timeout_ms));
  }
  /** Counters of tier `index` (kvc_pool_tier_stats). */
  kvc_tier_stats tier_stats(uint32_t index) {
    kvc_tier_stats s;
    kvc_tier_stats_init_sized(&s, sizeof s);
    KVC_POOL(s);
    kvc_swig_check(kvc_pool_tier_stats(pool_, index, &s));
    return s;
  }
  /** Queue the prompt's registered blocks for writing to every tier; returns the blocks queued. */
  uint64_t prefix_offload(const int32_t *tokens, size_t n_tokens, const std::string &salt = std::string()) {
    uint64_t n = 0;
    KVC_POOL(0);
    uint32_t n_extras = 0;
    kvc_prefix_extra e = kvc_swig_salt(salt, &n_extras);
    kvc_swig_check(kvc_prefix_offload(pool_, tokens, n_tokens, &e, n_extras, &n));
    return n;
  }
  /** Wait until the offload writer has written every queued block. */
  void flush_tiers() {
    KVC_POOL();
    kvc_swig_check(kvc_pool_flush_tiers(pool_));
  }
  /** Load the tier blocks after the pool's hit of a prompt and wait; returns the tokens loaded (ERR_TIMEOUT: none). */
  uint64_t prefix_load(const int32_t *tokens, size_t n_tokens, const std::string &salt = std::string()) {
    uint64_t n = 0;
    KVC_POOL(0);
    uint32_t n_extras = 0;
    kvc_prefix_extra e = kvc_swig_salt(salt, &n_extras);
    kvc_swig_check(kvc_prefix_load(pool_, tokens, n_tokens, &e, n_extras, &n));
    return n;
  }
  /** Start loading as prefix_load() does, in the background; returns the ticket for prefix_poll(). */
  uint64_t prefix_prefetch(const int32_t *tokens, size_t n_tokens, const std::string &salt = std::string()) {
    uint64_t ticket = 0;
    KVC_POOL(0);
    uint32_t n_extras = 0;
    kvc_prefix_extra e = kvc_swig_salt(salt, &n_extras);
    kvc_swig_check(kvc_prefix_prefetch(pool_, tokens, n_tokens, &e, n_extras, &ticket));
    return ticket;
  }
  /**
   * The state of a prefetch: done (loaded_tokens set; the ticket is then
   * forgotten) or not yet (done false: poll again). A load that timed out
   * is an error (ERR_TIMEOUT), an unknown or already reported ticket too
   * (ERR_INVALID_ARGUMENT).
   */
  kvc_swig_poll prefix_poll(uint64_t ticket) {
    kvc_swig_poll r;
    r.done = false;
    r.loaded_tokens = 0;
    KVC_POOL(r);
    uint64_t n = 0;
    const kvc_status st = kvc_prefix_poll(pool_, ticket, &n);
    if (st == KVC_ERR_PENDING) return r;
    if (kvc_swig_check(st)) return r;
    r.done = true;
    r.loaded_tokens = n;
    return r;
  }
  /** Release the pins of a prefix_lookup() with PREFIX_PIN (its result's pin). */
  void prefix_unpin(uint64_t pin) {
    KVC_POOL();
    kvc_swig_check(kvc_prefix_unpin(pool_, pin));
  }

  kvc_prefix_stats prefix_stats() {
    kvc_prefix_stats s;
    kvc_prefix_stats_init_sized(&s, sizeof s);
    KVC_POOL(s);
    kvc_swig_check(kvc_prefix_get_stats(pool_, &s));
    return s;
  }
}
