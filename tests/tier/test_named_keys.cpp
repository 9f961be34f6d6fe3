// Named extra keys through the offload tiers (docs/prefix-cache.md,
// docs/tiers.md): blocks written under {salt, adapter} values go down to a
// host, disk, Redis or Redis Cluster tier and come back under the same
// assignment, also into a pool that declares the names in another order (and
// one more name, left empty); another assignment, the positional form and a
// wrong count miss or are refused. ctest names prefix_named_keys_*; the
// Redis ones use the tier_redis fixture's servers and exit 77 (skipped)
// without them.
#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "prefix/prefix.h"
#include "pool_util.h"

namespace {

using tier_test::kBs;

bool g_skip = false;

void skip(const char *why) {
  std::fprintf(stderr, "skipped: %s\n", why);
  g_skip = true;
}

// A pool of pool_util's geometry and seed declaring `names` (none: positional).
kvc_pool *named_pool(const std::vector<const char *> &names, const std::string &model,
                     uint64_t blocks = 40, int verify = 1) {
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = tier_test::kLayers;
  c.num_q_heads = c.num_kv_heads = tier_test::kHeads;
  c.head_dim = tier_test::kDim;
  c.block_size = kBs;
  c.num_blocks = blocks;
  c.k_dtype = c.v_dtype = KVC_DTYPE_F32;
  kvc_pool *p = nullptr;
  CHECK_OK(kvc_pool_create(&c, &p));
  kvc_prefix_config pc;
  kvc_prefix_config_init(&pc);
  pc.seed_set = 1;
  for (int i = 0; i < 32; ++i) pc.seed[i] = static_cast<uint8_t>(i * 7 + 1);
  pc.model_id = model.c_str();
  pc.verify_tokens = static_cast<uint32_t>(verify);
  pc.extra_key_names = names.empty() ? nullptr : names.data();
  pc.n_extra_key_names = static_cast<uint32_t>(names.size());
  CHECK_OK(kvc_pool_enable_prefix_cache(p, &pc));
  return p;
}

struct Values {
  std::vector<kvc_prefix_extra> v;
  Values(std::initializer_list<const char *> l) {
    for (const char *s : l) v.push_back({s, std::strlen(s)});
  }
  const kvc_prefix_extra *data() const { return v.data(); }
  uint32_t n() const { return static_cast<uint32_t>(v.size()); }
};

kvc_prefix_result lookup(kvc_pool *p, const std::vector<int32_t> &t, const Values &x) {
  return tier_test::lookup(p, t, x.data(), x.n());
}

uint64_t load(kvc_pool *p, const std::vector<int32_t> &t, const Values &x) {
  uint64_t loaded = 99;
  CHECK_OK(kvc_prefix_load(p, t.data(), t.size(), x.data(), x.n(), &loaded));
  return loaded;
}

// Pool `w` (names salt, adapter) writes a prompt of 4 whole blocks under
// salt=tenant-1, adapter=lora-7 and offloads it to its tiers.
void write_named(kvc_pool *w, const std::vector<int32_t> &t) {
  const Values x = {"tenant-1", "lora-7"};
  tier_test::write_seq(w, 1, t, x.data(), x.n());
  uint64_t q = 0;
  CHECK_OK(kvc_prefix_offload(w, t.data(), t.size(), x.data(), x.n(), &q));
  CHECK(q == 4);
  CHECK_OK(kvc_pool_flush_tiers(w));
  CHECK(tier_test::tier_stats(w, 0).demotions == 4);
  CHECK_OK(kvc_seq_free(w, 1));
}

// A wrong count is refused by every tier call and changes nothing.
void wrong_counts(kvc_pool *p, const std::vector<int32_t> &t) {
  const Values one = {"tenant-1"};
  const kvc_tier_stats before = tier_test::tier_stats(p, 0);
  uint64_t n = 99;
  CHECK_STATUS(kvc_prefix_offload(p, t.data(), t.size(), one.data(), one.n(), &n),
               KVC_ERR_INVALID_ARGUMENT);
  CHECK(std::strstr(kvc_last_error_message(), "extra-key names (") != nullptr);
  CHECK_STATUS(kvc_prefix_load(p, t.data(), t.size(), one.data(), one.n(), &n),
               KVC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kvc_prefix_prefetch(p, t.data(), t.size(), one.data(), one.n(), &n),
               KVC_ERR_INVALID_ARGUMENT);
  CHECK(n == 99 || n == 0);
  kvc_prefix_result r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  CHECK_STATUS(kvc_prefix_lookup(p, t.data(), t.size(), one.data(), one.n(), KVC_PREFIX_PIN, &r),
               KVC_ERR_INVALID_ARGUMENT);
  CHECK(r.pin == 0 && r.tier_tokens == 0);
  CHECK_OK(kvc_pool_flush_tiers(p));
  const kvc_tier_stats after = tier_test::tier_stats(p, 0);
  CHECK(after.demotions == before.demotions && after.promotions == before.promotions &&
        after.hits == before.hits && after.pinned == 0);
  CHECK(tier_test::invariants(p));
}

// A reader pool that shares the writer's tier storage (disk directory,
// Redis): names declared in another order plus an unused one; the same
// assignment hits and loads the writer's bytes, the others miss.
void read_back_elsewhere(kvc_pool *r, kvc_pool *positional, const std::vector<int32_t> &t) {
  const Values same = {"", "lora-7", "tenant-1"};  // media, adapter, salt
  const Values swapped = {"", "tenant-1", "lora-7"}, more = {"img-3", "lora-7", "tenant-1"},
               salt_only = {"", "", "tenant-1"};
  CHECK(lookup(r, t, swapped).tier_tokens == 0);
  CHECK(lookup(r, t, more).tier_tokens == 0);
  CHECK(lookup(r, t, salt_only).tier_tokens == 0);
  CHECK(load(r, t, swapped) == 0);
  CHECK(lookup(r, t, same).tier_tokens == 16);
  CHECK(load(r, t, same) == 16);
  CHECK_OK(kvc_prefix_attach(r, 2, t.data(), t.size(), same.data(), same.n(), 0, nullptr));
  uint64_t len = 0;
  CHECK_OK(kvc_seq_length(r, 2, &len));
  CHECK(len == 16);
  CHECK(tier_test::seq_matches(r, 2, t, 16));
  CHECK(tier_test::tier_stats(r, 0).promotions == 4);
  CHECK(tier_test::tier_stats(r, 0).errors == 0);
  // The positional form (a 0.3 pool) with the same values in either order misses.
  const Values pos = {"tenant-1", "lora-7"}, pos2 = {"lora-7", "tenant-1"};
  CHECK(lookup(positional, t, pos).tier_tokens == 0);
  CHECK(lookup(positional, t, pos2).tier_tokens == 0);
  CHECK(tier_test::invariants(r));
}

std::string model_of(const char *test) {
  return std::string(test) + "-" + std::to_string(getpid());
}

}  // namespace

// Host tier (one pool: a host tier is the pool's own): the prompt is
// reclaimed from the pool, found in the tier and loaded back under the same
// assignment only.
KVTEST(named_keys_host) {
  const std::string model = model_of("host");
  kvc_pool *p = named_pool({"salt", "adapter"}, model, 24);
  tier_test::add_host(p);
  const auto t = tier_test::prompt(500, 4 * kBs + 1);
  write_named(p, t);
  {
    const uint64_t end = tier_test::squeeze(p, 100);  // the prompt's blocks are reclaimed
    tier_test::free_range(p, 100, end);
  }
  const Values same = {"tenant-1", "lora-7"}, swapped = {"lora-7", "tenant-1"},
               salt_only = {"tenant-1", ""}, adapter_only = {"", "lora-7"};
  CHECK(lookup(p, t, same).hit_tokens == 0);  // not in the pool any more
  CHECK(lookup(p, t, swapped).tier_tokens == 0);
  CHECK(lookup(p, t, salt_only).tier_tokens == 0);
  CHECK(lookup(p, t, adapter_only).tier_tokens == 0);
  wrong_counts(p, t);
  CHECK(lookup(p, t, same).tier_tokens == 16);
  CHECK(load(p, t, swapped) == 0);
  CHECK(load(p, t, same) == 16);
  CHECK_OK(kvc_prefix_attach(p, 2, t.data(), t.size(), same.data(), same.n(), 0, nullptr));
  CHECK(tier_test::seq_matches(p, 2, t, 16));
  CHECK(tier_test::tier_stats(p, 0).promotions == 4);
  CHECK(tier_test::tier_stats(p, 0).errors == 0);
  CHECK(tier_test::invariants(p));
  kvc_pool_destroy(p);
}

// Disk tier: a second pool (another declaration order) on the same directory.
KVTEST(named_keys_disk) {
  const std::string dir = tier_test::temp_dir("kvc_named_keys");
  const std::string model = model_of("disk");
  const auto t = tier_test::prompt(600, 4 * kBs + 1);
  {
    kvc_pool *w = named_pool({"salt", "adapter"}, model);
    tier_test::add_disk(w, dir);
    write_named(w, t);
    wrong_counts(w, t);
    kvc_pool_destroy(w);
  }
  kvc_pool *r = named_pool({"media", "adapter", "salt"}, model);
  kvc_pool *positional = named_pool({}, model);
  tier_test::add_disk(r, dir);
  tier_test::add_disk(positional, dir);
  read_back_elsewhere(r, positional, t);
  kvc_pool_destroy(r);
  kvc_pool_destroy(positional);
  tier_test::remove_dir(dir);
}

// Sequence records carry no keys: a record saved from one named pool
// restores into a pool declaring the names in another order, is registered
// there under its values, goes to disk and loads back into the first pool
// under the same assignment.
KVTEST(named_keys_seq_record) {
  const std::string dir = tier_test::temp_dir("kvc_named_rec");
  const std::string model = model_of("record");
  const auto t = tier_test::prompt(700, 4 * kBs + 1);
  kvc_pool *a = named_pool({"salt", "adapter"}, model);
  kvc_pool *b = named_pool({"adapter", "salt"}, model);
  const Values none = {"", ""};
  tier_test::write_seq(a, 1, t, none.data(),
                       none.n());  // registered without values (the empty assignment)
  size_t size = 0;
  CHECK_STATUS(kvc_seq_save(a, 1, nullptr, 0, &size), KVC_ERR_BUFFER_TOO_SMALL);
  std::vector<uint8_t> rec(size);
  CHECK_OK(kvc_seq_save(a, 1, rec.data(), rec.size(), &size));
  CHECK_OK(kvc_seq_restore(b, 5, rec.data(), rec.size()));
  const Values in_b = {"lora-7", "tenant-1"}, in_a = {"tenant-1", "lora-7"};
  uint64_t added = 0;
  CHECK_OK(kvc_prefix_insert(b, 5, t.data(), t.size(), in_b.data(), in_b.n(), &added));
  CHECK(added == 4);
  tier_test::add_disk(b, dir);
  uint64_t q = 0;
  CHECK_OK(kvc_prefix_offload(b, t.data(), t.size(), in_b.data(), in_b.n(), &q));
  CHECK(q == 4);
  CHECK_OK(kvc_pool_flush_tiers(b));
  tier_test::add_disk(a, dir);
  CHECK(lookup(a, t, in_a).hit_tokens == 0);
  CHECK(lookup(a, t, in_a).tier_tokens == 16);
  CHECK(lookup(a, t, in_b).tier_tokens == 0);
  CHECK(load(a, t, in_a) == 16);
  CHECK_OK(kvc_prefix_attach(a, 2, t.data(), t.size(), in_a.data(), in_a.n(), 0, nullptr));
  CHECK(tier_test::seq_matches(a, 2, t, 16));
  kvc_pool_destroy(a);
  kvc_pool_destroy(b);
  tier_test::remove_dir(dir);
}

// Pools without token verification (verify_tokens 0) trust keys, in their
// index and in tier records: blocks one writes under named values load back
// into another under the same assignment (before, a record's missing extras
// made every load of such a pool fail), and still miss under another one. A
// verifying pool refuses those records (their extra keys cannot be checked)
// but loads a verifying writer's.
KVTEST(named_keys_unverified_pools) {
  const std::string dir = tier_test::temp_dir("kvc_named_unv");
  const std::string model = model_of("unverified");
  const auto t = tier_test::prompt(900, 4 * kBs + 1), t2 = tier_test::prompt(950, 4 * kBs + 1);
  {
    kvc_pool *w = named_pool({"salt", "adapter"}, model, 40, /*verify=*/0);
    tier_test::add_disk(w, dir);
    write_named(w, t);
    kvc_pool_destroy(w);
    kvc_pool *wv = named_pool({"salt", "adapter"}, model, 40, /*verify=*/1);
    tier_test::add_disk(wv, dir);
    write_named(wv, t2);
    kvc_pool_destroy(wv);
  }
  kvc_pool *r = named_pool({"adapter", "salt"}, model, 40, /*verify=*/0);
  tier_test::add_disk(r, dir);
  const Values same = {"lora-7", "tenant-1"}, other = {"tenant-1", "lora-7"};
  CHECK(lookup(r, t, other).tier_tokens == 0);
  CHECK(load(r, t, same) == 16);
  CHECK_OK(kvc_prefix_attach(r, 2, t.data(), t.size(), same.data(), same.n(), 0, nullptr));
  CHECK(tier_test::seq_matches(r, 2, t, 16));
  CHECK(load(r, t2, same) == 16);  // a verifying writer's records too
  CHECK(tier_test::tier_stats(r, 0).errors == 0);
  kvc_pool *v = named_pool({"adapter", "salt"}, model, 40, /*verify=*/1);
  tier_test::add_disk(v, dir);
  CHECK(lookup(v, t, same).tier_tokens == 16);  // the key is there ...
  CHECK(load(v, t, same) == 0);                 // ... but its extra keys cannot be verified
  CHECK(tier_test::tier_stats(v, 0).errors == 1);
  CHECK(load(v, t2, same) == 16);
  CHECK(tier_test::invariants(r) && tier_test::invariants(v));
  kvc_pool_destroy(r);
  kvc_pool_destroy(v);
  tier_test::remove_dir(dir);
}

// With a constant hash (every key collides: kvc::prefix::prefix_hash_force_constant)
// verification keeps named assignments apart in the pool and in tier records:
// pool A (names "salt") writes salt=x to disk; pool B (names "adapter") with
// adapter=x finds the colliding key but refuses the record, whose extra keys
// are another assignment (positionally both would be the one value "x").
KVTEST(named_keys_forced_collision) {
  struct ConstantHash {
    ConstantHash() { kvc::prefix::prefix_hash_force_constant(true); }
    ~ConstantHash() { kvc::prefix::prefix_hash_force_constant(false); }
  } constant;
  const std::string dir = tier_test::temp_dir("kvc_named_col");
  const std::string model = model_of("collision");
  const auto t = tier_test::prompt(300, kBs + 1);  // one whole block
  const Values x = {"x"};
  {
    kvc_pool *a = named_pool({"salt", "adapter"}, model);
    const Values salt_x = {"x", ""}, adapter_x = {"", "x"}, none = {"", ""};
    tier_test::write_seq(a, 1, t, salt_x.data(), salt_x.n());
    CHECK(lookup(a, t, salt_x).hit_tokens == 4);
    CHECK(lookup(a, t, adapter_x).hit_tokens == 0);
    CHECK(lookup(a, t, none).hit_tokens == 0);
    kvc_pool_destroy(a);
  }
  {
    kvc_pool *w = named_pool({"salt"}, model);
    tier_test::add_disk(w, dir);
    tier_test::write_seq(w, 1, t, x.data(), x.n());
    uint64_t q = 0;
    CHECK_OK(kvc_prefix_offload(w, t.data(), t.size(), x.data(), x.n(), &q));
    CHECK(q == 1);
    CHECK_OK(kvc_pool_flush_tiers(w));
    kvc_pool_destroy(w);
  }
  kvc_pool *r = named_pool({"adapter"}, model);
  tier_test::add_disk(r, dir);
  CHECK(lookup(r, t, x).tier_tokens == 4);  // the (constant) key is there
  CHECK(load(r, t, x) == 0);                // refused: salt=x is not adapter=x
  CHECK(tier_test::tier_stats(r, 0).errors == 1);
  CHECK(lookup(r, t, x).hit_tokens == 0);
  kvc_pool_destroy(r);
  kvc_pool *s = named_pool({"salt"}, model);  // the same assignment is served
  tier_test::add_disk(s, dir);
  CHECK(load(s, t, x) == 4);
  kvc_pool_destroy(s);
  tier_test::remove_dir(dir);
}

namespace {

// The tier_redis fixture's servers: "standalone <port>", "cluster <p1> <p2> <p3>".
bool redis_address(bool cluster, std::string &address) {
  const char *d = std::getenv("KVC_REDIS_DIR");
  if (!d) {
    skip("KVC_REDIS_DIR not set (run through ctest: its fixture starts the servers)");
    return false;
  }
  std::ifstream f(std::string(d) + "/ports");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string what;
    in >> what;
    if (what == "skip") {
      skip(line.c_str());
      return false;
    }
    if (what != (cluster ? "cluster" : "standalone")) continue;
    for (int p; in >> p;) {
      if (!address.empty()) address += ',';
      address += "127.0.0.1:";
      address += std::to_string(p);
    }
  }
  if (address.empty()) {
    std::fprintf(stderr, "%s/ports: no servers listed (did the fixture fail?)\n", d);
    CHECK(false);
    return false;
  }
  return true;
}

// Adds a Redis tier, or false (skipped) when the library has no hiredis.
bool add_redis(kvc_pool *p, const std::string &address, bool cluster) {
  kvc_tier_config c;
  CHECK_OK(kvc_tier_config_init(&c, KVC_TIER_REDIS));
  c.address = address.c_str();
  c.flags = cluster ? KVC_TIER_REDIS_CLUSTER : 0u;
  const kvc_status st = kvc_pool_add_tier(p, &c, nullptr);
  if (st == KVC_ERR_UNSUPPORTED) {
    skip(kvc_last_error_message());
    return false;
  }
  CHECK_OK(st);
  return st == KVC_OK;
}

void redis_case(bool cluster) {
  std::string address;
  if (!redis_address(cluster, address)) return;
  // A model id of its own per run and process: the servers are shared.
  const std::string model = model_of(cluster ? "redis-cluster" : "redis");
  const auto t = tier_test::prompt(800, 4 * kBs + 1);
  {
    kvc_pool *w = named_pool({"salt", "adapter"}, model);
    if (!add_redis(w, address, cluster)) {
      kvc_pool_destroy(w);
      return;
    }
    write_named(w, t);
    wrong_counts(w, t);
    kvc_pool_destroy(w);
  }
  kvc_pool *r = named_pool({"media", "adapter", "salt"}, model);
  kvc_pool *positional = named_pool({}, model);
  add_redis(r, address, cluster);
  add_redis(positional, address, cluster);
  read_back_elsewhere(r, positional, t);
  kvc_pool_destroy(r);
  kvc_pool_destroy(positional);
}

}  // namespace

KVTEST(named_keys_redis) {
  redis_case(false);
}
KVTEST(named_keys_redis_cluster) {
  redis_case(true);
}

int main(int argc, char **argv) {
  const int rc = kvtest_main(argc, argv);
  if (rc == 0 && g_skip) return 77;  // ctest: SKIP_RETURN_CODE
  return rc;
}
