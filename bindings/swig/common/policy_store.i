/*
 * bindings/swig/common/policy_store.i: the Policy (kvc_policy) and Store
 * (kvc_store) handles.
 * %included by bindings/swig/kvcache_common.i (see there for the overlays'
 * contract); no language's overlay includes it directly.
 */
/* ---- handles ---- */
struct kvc_swig_policy {};
%extend kvc_swig_policy {
  /** An eviction policy (kvc_policy_create). */
  kvc_swig_policy(const kvc_policy_config *config) {
    kvc_policy *p = NULL;
    if (kvc_swig_check(kvc_policy_create(config, &p))) return NULL;
    kvc_swig_policy *h = new kvc_swig_policy;
    h->p = p;
    return h;
  }
  /**
   * A DuoAttention policy (KVC_POLICY_DUO_ATTENTION) with its per-head gates:
   * `gates` holds num_layers x num_kv_heads float32 values in [0, 1], layer by
   * layer, in native byte order (Python also takes numbers, converted; Java a
   * float[]); copied as kvc_policy_config.head_gates, `config`'s own are not
   * read. The errors of kvc_policy_create, and ERR_INVALID_ARGUMENT when the
   * bytes are not whole float32 values or hold more than 2^20 of them.
   */
  static kvc_swig_policy *with_head_gates(const kvc_policy_config *config, const void *gates, size_t gates_bytes) {
    if (config == NULL) {
      kvc_swig_fail(KVC_ERR_NULL_POINTER, "config is required");
      return NULL;
    }
    if (gates == NULL || gates_bytes == 0 || gates_bytes % sizeof(float) != 0) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "gates must hold one or more float32 values, got " +
                    std::to_string(gates_bytes) + " bytes");
      return NULL;
    }
    if (gates_bytes / sizeof(float) > (1u << 20)) { /* kvc_policy_create's limit, before any copy */
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "num_head_gates " + std::to_string(gates_bytes / sizeof(float)) +
                    " is above 1048576");
      return NULL;
    }
    std::vector<float> g(gates_bytes / sizeof(float));
    memcpy(g.data(), gates, gates_bytes);
    kvc_policy_config c = *config;
    c.head_gates = g.data();
    c.num_head_gates = (uint32_t)g.size();
    kvc_policy *p = NULL;
    if (kvc_swig_check(kvc_policy_create(&c, &p))) return NULL;
    kvc_swig_policy *h = new kvc_swig_policy;
    h->p = p;
    return h;
  }
  ~kvc_swig_policy() {
    kvc_policy_destroy($self->p);
    delete $self;
  }
  /** Release the policy now (pools and sequences it is attached to keep theirs); waits for calls using it. Idempotent. */
  void close() {
    std::unique_lock<std::shared_mutex> lock($self->mu);
    kvc_policy_destroy($self->p);
    $self->p = NULL;
  }
  bool closed() {
    std::shared_lock<std::shared_mutex> lock($self->mu);
    return $self->p == NULL;
  }
}

struct kvc_swig_store {};
%extend kvc_swig_store {
  /**
   * A store (kvc_store_open, docs/engines.md): one tier by itself, addressed
   * by byte-string keys under `scope`. kind: TIER_HOST / TIER_DISK /
   * TIER_REDIS; capacity_bytes: host and disk; path: disk directory;
   * address: Redis "host:port[,host:port...]"; flags: TIER_FSYNC,
   * TIER_REDIS_CLUSTER or 0.
   */
  kvc_swig_store(kvc_tier_kind kind, uint64_t capacity_bytes, const std::string &path,
                 const std::string &address, uint32_t flags, uint32_t timeout_ms,
                 uint64_t ttl_seconds, const void *scope, size_t scope_bytes) {
    if (!kvc_swig_c_string("path", path) || !kvc_swig_c_string("address", address)) return NULL;
    kvc_tier_config c;
    if (kvc_swig_check(kvc_tier_config_init_sized(&c, kind, sizeof c))) return NULL;
    c.capacity_bytes = capacity_bytes;
    c.path = path.empty() ? NULL : path.c_str();
    c.address = address.empty() ? NULL : address.c_str();
    c.flags = flags;
    c.timeout_ms = timeout_ms;
    c.ttl_seconds = ttl_seconds;
    kvc_store *p = NULL;
    if (kvc_swig_check(kvc_store_open(&c, scope, scope_bytes, &p))) return NULL;
    kvc_swig_store *h = new kvc_swig_store;
    h->p = p;
    return h;
  }
  ~kvc_swig_store() {
    kvc_store_close($self->p);
    delete $self;
  }
  /** Close the store now, after the calls in flight; later calls fail with ERR_NULL_POINTER. Idempotent. */
  void close() {
    std::unique_lock<std::shared_mutex> lock($self->mu);
    kvc_store_close($self->p);
    $self->p = NULL;
  }
  bool closed() {
    std::shared_lock<std::shared_mutex> lock($self->mu);
    return $self->p == NULL;
  }
  /** Store `value` under `key` (kvc_store_put). */
  void put(const void *key, size_t key_bytes, const void *value, size_t value_bytes) {
    KVC_STORE();
    kvc_swig_check(kvc_store_put(store_, key, key_bytes, value, value_bytes));
  }
  /**
   * Read the value of `key` into `value_out` (kvc_store_get): its length on
   * a hit, -1 on a miss. A value longer than value_out is not read: its
   * length is returned (larger than value_out) and value_out is untouched.
   */
  int64_t get_into(const void *key, size_t key_bytes, void *value_out, size_t value_out_bytes) {
    KVC_STORE(-1);
    size_t n = 0;
    int32_t found = 0;
    kvc_status st = kvc_store_get(store_, key, key_bytes, value_out, value_out_bytes, &n, &found);
    if (st == KVC_ERR_BUFFER_TOO_SMALL) return (int64_t)n;
    if (kvc_swig_check(st)) return -1;
    return found ? (int64_t)n : -1;
  }
  /**
   * Which keys the store holds (kvc_store_contains): `keys` is the keys'
   * bytes one after another, `lengths` their lengths; 1 or 0 per key.
   */
  std::vector<int32_t> contains_many(const void *keys, size_t keys_bytes,
                                     const std::vector<unsigned long long> &lengths) {
    std::vector<int32_t> out;
    KVC_STORE(out);
    std::vector<const void *> ptrs(lengths.size());
    std::vector<size_t> lens(lengths.size());
    unsigned long long off = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      if (off > keys_bytes || lengths[i] > keys_bytes - off) {
        kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "the key lengths add up to more than the " +
                                                    std::to_string(keys_bytes) + " key bytes");
        return out;
      }
      ptrs[i] = (const char *)keys + off;
      lens[i] = (size_t)lengths[i];
      off += lengths[i];
    }
    std::vector<uint8_t> found(lengths.size(), 0);
    if (kvc_swig_check(kvc_store_contains(store_, ptrs.data(), lens.data(), ptrs.size(),
                                          found.data())))
      return out;
    out.assign(found.begin(), found.end());
    return out;
  }
  /** Remove the value of `key` (kvc_store_remove): whether there was one. */
  bool remove(const void *key, size_t key_bytes) {
    KVC_STORE(false);
    int32_t removed = 0;
    kvc_swig_check(kvc_store_remove(store_, key, key_bytes, &removed));
    return removed != 0;
  }
  /** Pin (true) or unpin (false) the value of `key` (kvc_store_pin): whether it was. */
  bool pin(const void *key, size_t key_bytes, bool on = true) {
    KVC_STORE(false);
    int32_t done = 0;
    kvc_swig_check(kvc_store_pin(store_, key, key_bytes, on ? 1 : 0, &done));
    return done != 0;
  }
  /** Counters of the store's tier (kvc_store_stats). */
  kvc_tier_stats stats() {
    kvc_tier_stats s;
    kvc_tier_stats_init_sized(&s, sizeof s);
    KVC_STORE(s);
    kvc_swig_check(kvc_store_stats(store_, &s));
    return s;
  }
}
