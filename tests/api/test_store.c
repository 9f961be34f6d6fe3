/* cmocka tests of kvc_store_* (a tier by itself, addressed by an engine's
 * keys): values round-trip byte for byte, replace, miss, contains, remove,
 * pins against LRU, scopes that never share, disk values found again by a new
 * store, damaged records refused, and every error path without a change. */
#include "../blackbox.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

static kvc_store *host_store(uint64_t capacity, const char *scope) {
  kvc_tier_config c;
  ASSERT_OK(kvc_tier_config_init(&c, KVC_TIER_HOST));
  c.capacity_bytes = capacity;
  kvc_store *s = NULL;
  ASSERT_OK(kvc_store_open(&c, scope, scope ? strlen(scope) : 0, &s));
  assert_non_null(s);
  return s;
}

static kvc_store *disk_store(const char *dir, uint64_t capacity, const char *scope) {
  kvc_tier_config c;
  ASSERT_OK(kvc_tier_config_init(&c, KVC_TIER_DISK));
  c.capacity_bytes = capacity;
  c.path = dir;
  kvc_store *s = NULL;
  ASSERT_OK(kvc_store_open(&c, scope, scope ? strlen(scope) : 0, &s));
  assert_non_null(s);
  return s;
}

static void fill(uint8_t *p, size_t n, unsigned seed) {
  uint32_t x = 2654435761u * (seed + 1);
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = (uint8_t)(x >> 24);
  }
}

static void put_str(kvc_store *s, const char *key, const uint8_t *v, size_t n) {
  ASSERT_OK(kvc_store_put(s, key, strlen(key), v, n));
}

/* A hit with exactly `n` bytes equal to `want`. */
static void expect_stored(kvc_store *s, const char *key, const uint8_t *want, size_t n) {
  uint8_t buf[4096];
  size_t got = 12345;
  int32_t found = -1;
  assert_true(n <= sizeof buf);
  ASSERT_OK(kvc_store_get(s, key, strlen(key), buf, sizeof buf, &got, &found));
  assert_int_equal(found, 1);
  assert_int_equal(got, n);
  assert_memory_equal(buf, want, n);
}

static void expect_miss(kvc_store *s, const char *key) {
  uint8_t buf[16];
  size_t got = 12345;
  int32_t found = -1;
  ASSERT_OK(kvc_store_get(s, key, strlen(key), buf, sizeof buf, &got, &found));
  assert_int_equal(found, 0);
  assert_int_equal(got, 0);
}

static void test_host_round_trip(void **state) {
  (void)state;
  kvc_store *s = host_store(1 << 20, "model-a/f16/tp0");
  uint8_t a[1000], b[777];
  fill(a, sizeof a, 1);
  fill(b, sizeof b, 2);
  put_str(s, "page-0", a, sizeof a);
  put_str(s, "page-1", b, sizeof b);
  expect_stored(s, "page-0", a, sizeof a);
  expect_stored(s, "page-1", b, sizeof b);
  expect_miss(s, "page-2");
  /* Replace: the new value whole. */
  put_str(s, "page-0", b, sizeof b);
  expect_stored(s, "page-0", b, sizeof b);
  /* An empty value is a value. */
  ASSERT_OK(kvc_store_put(s, "empty", 5, NULL, 0));
  size_t got = 9;
  int32_t found = 0;
  ASSERT_OK(kvc_store_get(s, "empty", 5, NULL, 0, &got, &found));
  assert_int_equal(found, 1);
  assert_int_equal(got, 0);
  /* Keys are bytes: embedded NULs, binary digests. */
  const uint8_t k1[4] = {0, 1, 0, 2}, k2[4] = {0, 1, 0, 3};
  ASSERT_OK(kvc_store_put(s, k1, 4, a, 10));
  ASSERT_OK(kvc_store_get(s, k2, 4, NULL, 0, &got, &found));
  assert_int_equal(found, 0);
  kvc_tier_stats st;
  ASSERT_OK(kvc_tier_stats_init(&st));
  ASSERT_OK(kvc_store_stats(s, &st));
  assert_int_equal(st.kind, KVC_TIER_HOST);
  assert_int_equal(st.entries, 4);
  assert_int_equal(st.demotions, 5);
  assert_int_equal(st.hits, 4);
  assert_int_equal(st.promotions, 4);
  assert_int_equal(st.misses, 2);
  assert_int_equal(st.errors, 0);
  assert_true(st.bytes >= sizeof b + sizeof b + 10);
  kvc_store_close(s);
}

static void test_host_contains_remove(void **state) {
  (void)state;
  kvc_store *s = host_store(1 << 20, NULL);
  char names[10][16];
  const void *keys[10];
  size_t lens[10];
  uint8_t v[64];
  for (int i = 0; i < 10; ++i) {
    snprintf(names[i], sizeof names[i], "blk%d", i);
    keys[i] = names[i];
    lens[i] = strlen(names[i]);
    fill(v, sizeof v, (unsigned)i);
    if (i % 3 != 0) put_str(s, names[i], v, sizeof v);
  }
  uint8_t found[10];
  memset(found, 7, sizeof found);
  ASSERT_OK(kvc_store_contains(s, keys, lens, 10, found));
  for (int i = 0; i < 10; ++i) assert_int_equal(found[i], i % 3 != 0);
  ASSERT_OK(kvc_store_contains(s, NULL, NULL, 0, NULL)); /* nothing to do */
  int32_t removed = -1;
  ASSERT_OK(kvc_store_remove(s, "blk1", 4, &removed));
  assert_int_equal(removed, 1);
  ASSERT_OK(kvc_store_remove(s, "blk1", 4, &removed));
  assert_int_equal(removed, 0);
  ASSERT_OK(kvc_store_remove(s, "blk0", 4, NULL));
  ASSERT_OK(kvc_store_contains(s, keys, lens, 10, found));
  assert_int_equal(found[1], 0);
  assert_int_equal(found[2], 1);
  expect_miss(s, "blk1");
  kvc_store_close(s);
}

/* Another scope, same tier bytes: never seen. */
static void test_disk_scopes_and_reopen(void **state) {
  (void)state;
  char dir[] = "/tmp/kvc_store_XXXXXX";
  assert_non_null(mkdtemp(dir));
  uint8_t a[3000];
  fill(a, sizeof a, 9);
  kvc_store *s = disk_store(dir, 1 << 20, "model-a");
  kvc_store *t = disk_store(dir, 1 << 20, "model-b");
  put_str(s, "p0", a, sizeof a);
  expect_stored(s, "p0", a, sizeof a);
  expect_miss(t, "p0");
  const void *k = "p0";
  size_t kl = 2;
  uint8_t f = 9;
  ASSERT_OK(kvc_store_contains(t, &k, &kl, 1, &f));
  assert_int_equal(f, 0);
  kvc_store_close(s);
  kvc_store_close(t);
  /* A new store over the directory (a new process) finds the value. */
  kvc_store *r = disk_store(dir, 1 << 20, "model-a");
  expect_stored(r, "p0", a, sizeof a);
  /* Damage every record: refused and removed, never returned. */
  DIR *d = opendir(dir);
  assert_non_null(d);
  struct dirent *e;
  int damaged = 0;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *fp = fopen(path, "r+b");
    if (!fp) continue;
    fseek(fp, -1, SEEK_END);
    int c = fgetc(fp);
    fseek(fp, -1, SEEK_END);
    fputc(c ^ 0x5a, fp);
    fclose(fp);
    ++damaged;
  }
  closedir(d);
  assert_true(damaged >= 1);
  expect_miss(r, "p0");
  kvc_tier_stats st;
  ASSERT_OK(kvc_tier_stats_init(&st));
  ASSERT_OK(kvc_store_stats(r, &st));
  assert_true(st.errors >= 1);
  assert_true(strlen(st.last_error) > 0);
  ASSERT_OK(kvc_store_contains(r, &k, &kl, 1, &f));
  assert_int_equal(f, 0);
  kvc_store_close(r);
  /* The directory is empty again but for what the tier keeps of its own. */
  rmdir(dir);
}

/* LRU evicts the oldest unpinned value; a pinned one stays until unpinned. */
static void test_pins_and_capacity(void **state) {
  (void)state;
  /* Room for three records of 1000 bytes with their keys, not four. */
  kvc_store *s = host_store(3 * 1040, "x");
  uint8_t v[1000];
  fill(v, sizeof v, 3);
  put_str(s, "a", v, sizeof v);
  put_str(s, "b", v, sizeof v);
  int32_t done = -1;
  ASSERT_OK(kvc_store_pin(s, "a", 1, 1, &done));
  assert_int_equal(done, 1);
  ASSERT_OK(kvc_store_pin(s, "zz", 2, 1, &done));
  assert_int_equal(done, 0); /* absent */
  put_str(s, "c", v, sizeof v);
  put_str(s, "d", v, sizeof v); /* evicts b (a is pinned) */
  expect_stored(s, "a", v, sizeof v);
  expect_miss(s, "b");
  kvc_tier_stats st;
  ASSERT_OK(kvc_tier_stats_init(&st));
  ASSERT_OK(kvc_store_stats(s, &st));
  assert_int_equal(st.pinned, 1);
  assert_true(st.evictions >= 1);
  ASSERT_OK(kvc_store_pin(s, "a", 1, 0, &done));
  assert_int_equal(done, 1);
  ASSERT_OK(kvc_store_pin(s, "a", 1, 0, &done));
  assert_int_equal(done, 0); /* not pinned: counts never go negative */
  ASSERT_OK(kvc_store_stats(s, &st));
  assert_int_equal(st.pinned, 0);
  /* Larger than the whole tier: refused, nothing changes. */
  uint8_t big[4000];
  fill(big, sizeof big, 4);
  ASSERT_STATUS(KVC_ERR_EXCEEDS_CAPACITY, kvc_store_put(s, "a", 1, big, sizeof big));
  expect_stored(s, "a", v, sizeof v);
  /* A pinned store full of pins: the put fails (IO, the reason given), the
   * old values stay. */
  ASSERT_OK(kvc_store_pin(s, "a", 1, 1, &done));
  ASSERT_OK(kvc_store_pin(s, "c", 1, 1, &done));
  ASSERT_OK(kvc_store_pin(s, "d", 1, 1, &done));
  ASSERT_STATUS(KVC_ERR_IO, kvc_store_put(s, "e", 1, v, sizeof v));
  assert_non_null(strstr(kvc_last_error_message(), "pinned"));
  expect_miss(s, "e");
  /* A pinned value removed takes its pins with it. */
  ASSERT_OK(kvc_store_remove(s, "d", 1, &done));
  assert_int_equal(done, 1);
  ASSERT_OK(kvc_store_stats(s, &st));
  assert_int_equal(st.pinned, 2);
  kvc_store_close(s);
}

static void test_errors(void **state) {
  (void)state;
  kvc_tier_config c;
  ASSERT_OK(kvc_tier_config_init(&c, KVC_TIER_HOST));
  kvc_store *s = (kvc_store *)(uintptr_t)1;
  /* Host without capacity, unknown flags, reserved, NULLs, a long scope. */
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_store_open(&c, NULL, 0, &s));
  assert_null(s);
  c.capacity_bytes = 1 << 16;
  c.flags = 0x80;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_store_open(&c, NULL, 0, &s));
  c.flags = 0;
  c.reserved = 1;
  ASSERT_STATUS(KVC_ERR_UNSUPPORTED, kvc_store_open(&c, NULL, 0, &s));
  c.reserved = 0;
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_store_open(NULL, NULL, 0, &s));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_store_open(&c, NULL, 0, NULL));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_store_open(&c, NULL, 3, &s));
  static char long_scope[KVC_STORE_KEY_MAX + 1];
  memset(long_scope, 'x', sizeof long_scope);
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_store_open(&c, long_scope, sizeof long_scope, &s));
  assert_non_null(strstr(kvc_last_error_message(), "scope"));
  c.struct_size = 8;
  ASSERT_STATUS(KVC_ERR_STRUCT_SIZE, kvc_store_open(&c, NULL, 0, &s));
  c.struct_size = sizeof c;
  kvc_tier_config d;
  ASSERT_OK(kvc_tier_config_init(&d, KVC_TIER_DISK));
  d.capacity_bytes = 1 << 16;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_store_open(&d, NULL, 0, &s)); /* no path */
  d.path = "/proc/version/not-a-dir";
  ASSERT_STATUS(KVC_ERR_IO, kvc_store_open(&d, NULL, 0, &s));
  kvc_tier_config r;
  ASSERT_OK(kvc_tier_config_init(&r, KVC_TIER_REDIS));
  r.address = "no-port";
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_store_open(&r, NULL, 0, &s));

  s = host_store(1 << 16, "e");
  uint8_t v[8] = {1, 2, 3, 4, 5, 6, 7, 8}, buf[8];
  put_str(s, "k", v, 8);
  static char long_key[KVC_STORE_KEY_MAX + 1];
  memset(long_key, 'k', sizeof long_key);
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_store_put(s, "", 0, v, 8));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_store_put(s, long_key, sizeof long_key, v, 8));
  ASSERT_OK(kvc_store_put(s, long_key, KVC_STORE_KEY_MAX, v, 8)); /* the longest key */
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_store_put(s, NULL, 1, v, 8));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_store_put(s, "k", 1, NULL, 8));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_store_put(NULL, "k", 1, v, 8));
  expect_stored(s, "k", v, 8); /* none of them changed it */
  size_t got = 0;
  int32_t found = 0;
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_store_get(s, "k", 1, buf, 8, &got, NULL));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_store_get(s, "k", 1, NULL, 8, &got, &found));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_store_get(s, "k", 0, buf, 8, &got, &found));
  assert_int_equal(found, 0);
  memset(buf, 0xee, sizeof buf);
  ASSERT_STATUS(KVC_ERR_BUFFER_TOO_SMALL, kvc_store_get(s, "k", 1, buf, 7, &got, &found));
  assert_int_equal(found, 1);
  assert_int_equal(got, 8);
  for (int i = 0; i < 8; ++i) assert_int_equal(buf[i], 0xee); /* untouched */
  const void *keys[2] = {"k", ""};
  size_t lens[2] = {1, 0};
  uint8_t f[2] = {7, 7};
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_store_contains(s, keys, lens, 2, f));
  assert_int_equal(f[0], 7); /* untouched */
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_store_contains(s, keys, lens, 2, NULL));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_store_contains(s, NULL, lens, 1, f));
  keys[1] = NULL;
  lens[1] = 1;
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_store_contains(s, keys, lens, 2, f));
  int32_t done = 5;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_store_pin(s, "k", 1, 2, &done));
  assert_int_equal(done, 0);
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_store_remove(s, long_key, sizeof long_key, NULL));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_store_stats(s, NULL));
  kvc_tier_stats st;
  ASSERT_OK(kvc_tier_stats_init(&st));
  st.struct_size = 4;
  ASSERT_STATUS(KVC_ERR_STRUCT_SIZE, kvc_store_stats(s, &st));
  expect_stored(s, "k", v, 8);
  kvc_store_close(s);
  kvc_store_close(NULL);
}

/* The one record file of a directory holding one value (its name is the tier key). */
static void only_record(const char *dir, char *path, size_t n) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  struct dirent *e;
  int found = 0;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, n, "%s/%s", dir, e->d_name);
    ++found;
  }
  closedir(d);
  assert_int_equal(found, 1);
}

static void rm_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char path[512];
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

/* A value size near SIZE_MAX (a caller's wrong length) is refused by its size
 * alone: the buffer is never read, nothing is stored. */
static void test_sizes_never_wrap(void **state) {
  (void)state;
  char dir[] = "/tmp/kvc_store_XXXXXX";
  assert_non_null(mkdtemp(dir));
  kvc_store *h = host_store(1 << 20, "s");
  kvc_store *d = disk_store(dir, 1 << 20, "s");
  uint8_t small[8] = {0};
  const size_t lies[3] = {SIZE_MAX, SIZE_MAX - 30, (size_t)1 << 40};
  for (int i = 0; i < 3; ++i) {
    ASSERT_STATUS(KVC_ERR_EXCEEDS_CAPACITY, kvc_store_put(h, "a", 1, small, lies[i]));
    ASSERT_STATUS(KVC_ERR_EXCEEDS_CAPACITY, kvc_store_put(d, "a", 1, small, lies[i]));
  }
  expect_miss(h, "a");
  expect_miss(d, "a");
  kvc_store_close(h);
  kvc_store_close(d);
  rm_dir(dir);
}

/* A FIFO in a record's place is refused at once (a miss, the record removed),
 * never a read that blocks every caller. */
static void test_disk_fifo_refused(void **state) {
  (void)state;
  char dir[] = "/tmp/kvc_store_XXXXXX";
  assert_non_null(mkdtemp(dir));
  kvc_store *s = disk_store(dir, 1 << 20, "f");
  uint8_t v[100];
  fill(v, sizeof v, 11);
  put_str(s, "a", v, sizeof v);
  char path[512];
  only_record(dir, path, sizeof path);
  assert_int_equal(unlink(path), 0);
  assert_int_equal(mkfifo(path, 0600), 0);
  expect_miss(s, "a");
  put_str(s, "a", v, sizeof v); /* written again over it */
  expect_stored(s, "a", v, sizeof v);
  kvc_store_close(s);
  rm_dir(dir);
}

/* Records another store wrote, read and pinned here, can hold more pinned
 * bytes than this store's capacity: a put then fails cleanly (IO, nothing
 * stored), never corrupts the index; and a damaged pinned record no longer
 * counts as pinned. */
static void test_disk_pins_past_capacity(void **state) {
  (void)state;
  char dir[] = "/tmp/kvc_store_XXXXXX";
  assert_non_null(mkdtemp(dir));
  kvc_store *a = disk_store(dir, 1000, NULL);
  kvc_store *b = disk_store(dir, 1000, NULL);
  uint8_t v[551], w[51];
  fill(v, sizeof v, 12);
  fill(w, sizeof w, 13);
  int32_t done = 0;
  put_str(a, "1", v, sizeof v);
  ASSERT_OK(kvc_store_pin(a, "1", 1, 1, &done));
  assert_int_equal(done, 1);
  put_str(b, "2", v, sizeof v);
  expect_stored(a, "2", v, sizeof v); /* indexed by a: over its capacity */
  ASSERT_OK(kvc_store_pin(a, "2", 1, 1, &done));
  assert_int_equal(done, 1);
  ASSERT_STATUS(KVC_ERR_IO, kvc_store_put(a, "3", 1, w, sizeof w));
  assert_non_null(strstr(kvc_last_error_message(), "pinned"));
  expect_miss(a, "3");
  expect_stored(a, "1", v, sizeof v);
  expect_stored(a, "2", v, sizeof v);
  kvc_tier_stats st;
  ASSERT_OK(kvc_tier_stats_init(&st));
  ASSERT_OK(kvc_store_stats(a, &st));
  assert_int_equal(st.pinned, 2);
  kvc_store_close(a);
  kvc_store_close(b);
  rm_dir(dir);

  /* A pinned record damaged on disk: refused at the next read, no longer pinned. */
  char dir2[] = "/tmp/kvc_store_XXXXXX";
  assert_non_null(mkdtemp(dir2));
  kvc_store *s = disk_store(dir2, 1 << 20, NULL);
  put_str(s, "p", v, sizeof v);
  ASSERT_OK(kvc_store_pin(s, "p", 1, 1, &done));
  char path[512];
  only_record(dir2, path, sizeof path);
  assert_int_equal(truncate(path, 40), 0);
  expect_miss(s, "p");
  ASSERT_OK(kvc_store_stats(s, &st));
  assert_int_equal(st.pinned, 0);
  assert_int_equal(st.entries, 0);
  kvc_store_close(s);
  rm_dir(dir2);
}

/* Through the dlopen table (version 7). */
static void test_api_table(void **state) {
  (void)state;
  const kvc_api *api = kvc_get_api(7);
  assert_non_null(api);
  assert_ptr_equal(api->store_open, kvc_store_open);
  assert_ptr_equal(api->store_get, kvc_store_get);
  assert_ptr_equal(api->store_stats, kvc_store_stats);
  kvc_tier_config c;
  ASSERT_OK(api->tier_config_init_sized(&c, KVC_TIER_HOST, sizeof c));
  c.capacity_bytes = 4096;
  kvc_store *s = NULL;
  ASSERT_OK(api->store_open(&c, "t", 1, &s));
  ASSERT_OK(api->store_put(s, "k", 1, "value", 5));
  char buf[8];
  size_t n = 0;
  int32_t found = 0;
  ASSERT_OK(api->store_get(s, "k", 1, buf, sizeof buf, &n, &found));
  assert_int_equal(found, 1);
  assert_int_equal(n, 5);
  assert_memory_equal(buf, "value", 5);
  api->store_close(s);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_round_trip),
      cmocka_unit_test(test_host_contains_remove),
      cmocka_unit_test(test_disk_scopes_and_reopen),
      cmocka_unit_test(test_pins_and_capacity),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_api_table),
      cmocka_unit_test(test_sizes_never_wrap),
      cmocka_unit_test(test_disk_fifo_refused),
      cmocka_unit_test(test_disk_pins_past_capacity),
  };
  return run_named_tests("tier_store", tests, sizeof tests / sizeof tests[0], argc, argv);
}
