// Offload tiers of a pool through the public API (docs/tiers.md): demotion on
// reclaim with a bounded queue, lookups and loads (synchronous and
// prefetch + poll) with the loaded bytes compared, pins, load timeouts,
// namespaces (salt, model), injected write failures, damaged records, a full
// disk and restart persistence. Test hooks (src/core/offload.h) pause the
// writer, block reads and inject failures.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <dirent.h>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "../whitebox.h"
#include "api/internal.h"
#include "core/offload.h"
#include "core/prefix_cache.h"
#include "pool_util.h"

using namespace tier_test;

// Demoted on reclaim, found by lookup, loaded back synchronously: the
// attached sequence holds the original bytes.
KVTEST(host_demote_and_load) {
  Pool p(16);
  const uint32_t ti = add_host(p);
  CHECK(ti == 0);
  const auto t = prompt(100, 13);  // 3 whole blocks usable
  write_seq(p, 1, t);
  CHECK_OK(kvc_seq_free(p, 1));
  const uint64_t end = squeeze(p, 100);  // reclaims the 3 cached entries
  CHECK_OK(kvc_pool_flush_tiers(p));
  kvc_tier_stats s = tier_stats(p, 0);
  CHECK(s.kind == KVC_TIER_HOST);
  CHECK(s.demotions == 3);
  CHECK(s.entries == 3);
  CHECK(s.drops == 0);
  free_range(p, 100, end);
  kvc_prefix_result r = lookup(p, t);
  CHECK(r.hit_tokens == 0);
  CHECK(r.tier_tokens == 12);
  CHECK(r.pin == 0);
  uint64_t loaded = 0;
  CHECK_OK(kvc_prefix_load(p, t.data(), t.size(), nullptr, 0, &loaded));
  CHECK(loaded == 12);
  r = lookup(p, t);
  CHECK(r.hit_tokens == 12);
  CHECK(r.tier_tokens == 0);
  CHECK_OK(kvc_prefix_attach(p, 2, t.data(), t.size(), nullptr, 0, 0, &r));
  CHECK(r.hit_tokens == 12);
  CHECK(seq_matches(p, 2, t, 12));
  s = tier_stats(p, 0);
  CHECK(s.promotions == 3);
  CHECK(s.hits == 3);
  CHECK(invariants(p));
}

// Prefetch + poll: pending while the read is held, then done with the bytes.
KVTEST(host_prefetch_poll) {
  HooksReset reset;
  Pool p(16);
  add_host(p);
  const auto t = prompt(200, 9);  // 2 blocks
  write_seq(p, 1, t);
  uint64_t queued = 0;
  CHECK_OK(kvc_prefix_offload(p, t.data(), t.size(), nullptr, 0, &queued));
  CHECK(queued == 2);
  CHECK_OK(kvc_pool_flush_tiers(p));
  CHECK_OK(kvc_seq_free(p, 1));
  free_range(p, 100, squeeze(p, 100));
  Gate gate;
  kvc::core::TestHooks h;
  h.before_get = [&](const kvc::BlockKey &) { gate.wait(); };
  kvc::core::set_test_hooks(h);
  uint64_t ticket = 0, loaded = 7;
  CHECK_OK(kvc_prefix_prefetch(p, t.data(), t.size(), nullptr, 0, &ticket));
  CHECK(ticket != 0);
  CHECK(gate.wait_for_waiter(5000));
  CHECK_STATUS(kvc_prefix_poll(p, ticket, &loaded), KVC_ERR_PENDING);
  CHECK(loaded == 0);
  CHECK(pool_stats(p).blocks_used == 2 * kLayers);  // reserved for the load
  CHECK(invariants(p));
  gate.release();
  kvc_status st = KVC_ERR_PENDING;
  for (int i = 0; i < 5000 && st == KVC_ERR_PENDING; ++i) {
    st = kvc_prefix_poll(p, ticket, &loaded);
    if (st == KVC_ERR_PENDING) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(st == KVC_OK);
  CHECK(loaded == 8);
  CHECK_STATUS(kvc_prefix_poll(p, ticket, &loaded), KVC_ERR_INVALID_ARGUMENT);  // reported once
  CHECK(pool_stats(p).blocks_used == 0);
  CHECK(pool_stats(p).blocks_cached == 2 * kLayers);
  kvc_prefix_result r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  CHECK_OK(kvc_prefix_attach(p, 2, t.data(), t.size(), nullptr, 0, 0, &r));
  CHECK(r.hit_tokens == 8);
  CHECK(seq_matches(p, 2, t, 8));
  CHECK(invariants(p));
}

// A paused writer and a queue of N: N + 1 demotions give exactly one drop,
// and the call that reclaimed them returned without waiting.
KVTEST(host_queue_full_drops_one) {
  HooksReset reset;
  constexpr uint32_t N = 3;
  Pool p(kLayers * (N + 2));  // a prompt of N + 1 whole blocks and one partial
  add_host(p);
  CHECK_OK(kvc_pool_set_offload(p, N, 10000));
  kvc::core::TestHooks h;
  h.pause_writer = true;
  kvc::core::set_test_hooks(h);
  const auto t = prompt(300, kBs * (N + 1) + 1);
  write_seq(p, 1, t);
  CHECK_OK(kvc_seq_free(p, 1));
  CHECK(pool_stats(p).blocks_cached == kLayers * (N + 1));
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t end = squeeze(p, 100);  // reclaims N + 1 entries
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CHECK(ms < 5000);  // did not wait for the paused writer
  kvc_tier_stats s = tier_stats(p, 0);
  CHECK(s.drops == 1);
  CHECK(s.demotions == 0);
  kvc::core::set_test_hooks({});
  CHECK_OK(kvc_pool_flush_tiers(p));
  s = tier_stats(p, 0);
  CHECK(s.demotions == N);
  CHECK(s.entries == N);
  CHECK(s.drops == 1);
  free_range(p, 100, end);
  CHECK(invariants(p));
}

// Blocks being demoted are copied before they are handed out again: with the
// writer paused, the reclaimed blocks are overwritten by another sequence,
// yet the tier stores the original bytes under each key.
KVTEST(host_demotion_copy_isolated) {
  HooksReset reset;
  Pool p(12);
  add_host(p);
  kvc::core::TestHooks h;
  h.pause_writer = true;
  kvc::core::set_test_hooks(h);
  const auto t = prompt(400, 17);  // 4 blocks
  write_seq(p, 1, t);
  CHECK_OK(kvc_seq_free(p, 1));
  const uint64_t end = squeeze(p, 100);  // reuses every block with other bytes
  for (uint64_t id = 100; id < end; ++id) CHECK(seq_is_garbage(p, id, kBs));
  kvc::core::set_test_hooks({});
  CHECK_OK(kvc_pool_flush_tiers(p));
  CHECK(tier_stats(p, 0).demotions == 4);
  free_range(p, 100, end);
  uint64_t loaded = 0;
  CHECK_OK(kvc_prefix_load(p, t.data(), t.size(), nullptr, 0, &loaded));
  CHECK(loaded == 16);
  CHECK_OK(kvc_prefix_attach(p, 2, t.data(), t.size(), nullptr, 0, 0, nullptr));
  CHECK(seq_matches(p, 2, t, 16));
  CHECK(invariants(p));
}

// A load whose tier never answers: its reserved blocks come back after the
// timeout, and the late answer is dropped, never written into blocks that
// now belong to another sequence.
KVTEST(host_load_timeout_returns_blocks) {
  HooksReset reset;
  Pool p(12);
  add_host(p);
  CHECK_OK(kvc_pool_set_offload(p, 64, 200));
  const auto t = prompt(500, 13);
  write_seq(p, 1, t);
  CHECK_OK(kvc_prefix_offload(p, t.data(), t.size(), nullptr, 0, nullptr));
  CHECK_OK(kvc_pool_flush_tiers(p));
  CHECK_OK(kvc_seq_free(p, 1));
  free_range(p, 100, squeeze(p, 100));
  CHECK(lookup(p, t).tier_tokens == 12);
  const uint64_t free0 = pool_stats(p).blocks_free;
  Gate gate;
  kvc::core::TestHooks h;
  h.before_get = [&](const kvc::BlockKey &) { gate.wait(); };
  kvc::core::set_test_hooks(h);
  uint64_t ticket = 0, loaded = 0;
  CHECK_OK(kvc_prefix_prefetch(p, t.data(), t.size(), nullptr, 0, &ticket));
  CHECK(gate.wait_for_waiter(5000));
  CHECK(pool_stats(p).blocks_free == free0 - 3 * kLayers);
  // The synchronous form times out too.
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  CHECK_STATUS(kvc_prefix_poll(p, ticket, &loaded), KVC_ERR_TIMEOUT);
  CHECK(pool_stats(p).blocks_free == free0);
  CHECK(invariants(p));
  // Another sequence takes every block now and writes its own bytes.
  const uint64_t end = squeeze(p, 200);
  gate.release();  // the late answer arrives
  kvc::core::set_test_hooks({});
  for (int i = 0; i < 200 && tier_stats(p, 0).hits < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (uint64_t id = 200; id < end; ++id) CHECK(seq_is_garbage(p, id, kBs));
  CHECK(kvc::api::core_pool(p).prefix().registered_keys().empty());
  CHECK(invariants(p));
  free_range(p, 200, end);
  CHECK_OK(kvc_prefix_load(p, t.data(), t.size(), nullptr, 0, &loaded));
  CHECK(loaded == 12);
}

// Pins keep the promised blocks through LRU pressure; unpinning twice is an error.
KVTEST(host_pin_survives_pressure) {
  Pool p(40);
  const auto t = prompt(600, 13);
  write_seq(p, 1, t);
  // Room for 4 records: 3 pinned, 1 for everything else.
  uint64_t rec = 0;
  {
    Pool q(16);
    add_host(q);
    write_seq(q, 1, t);
    CHECK_OK(kvc_prefix_offload(q, t.data(), t.size(), nullptr, 0, nullptr));
    CHECK_OK(kvc_pool_flush_tiers(q));
    rec = tier_stats(q, 0).bytes / 3;
  }
  add_host(p, rec * 4);
  CHECK_OK(kvc_prefix_offload(p, t.data(), t.size(), nullptr, 0, nullptr));
  CHECK_OK(kvc_pool_flush_tiers(p));
  CHECK_OK(kvc_seq_free(p, 1));
  free_range(p, 100, squeeze(p, 100));  // pool copies gone (their demotions rewrite the same keys)
  CHECK_OK(kvc_pool_flush_tiers(p));
  kvc_prefix_result r = lookup(p, t, nullptr, 0, KVC_PREFIX_PIN);
  CHECK(r.tier_tokens == 12);
  CHECK(r.pin != 0);
  CHECK(tier_stats(p, 0).pinned == 3);
  // Pressure: 6 other prompts' blocks go through the tier.
  for (int i = 0; i < 6; ++i) {
    const auto o = prompt(1000 + 50 * i, 5);
    write_seq(p, 10 + i, o);
    CHECK_OK(kvc_prefix_offload(p, o.data(), o.size(), nullptr, 0, nullptr));
    CHECK_OK(kvc_pool_flush_tiers(p));
    CHECK_OK(kvc_seq_free(p, 10 + i));
  }
  kvc_tier_stats s = tier_stats(p, 0);
  CHECK(s.evictions >= 5);
  CHECK(s.entries <= 4);
  uint64_t loaded = 0;
  CHECK_OK(kvc_prefix_load(p, t.data(), t.size(), nullptr, 0, &loaded));
  CHECK(loaded == 12);
  CHECK_OK(kvc_prefix_attach(p, 2, t.data(), t.size(), nullptr, 0, 0, nullptr));
  CHECK(seq_matches(p, 2, t, 12));
  CHECK_OK(kvc_prefix_unpin(p, r.pin));
  CHECK(tier_stats(p, 0).pinned == 0);
  CHECK_STATUS(kvc_prefix_unpin(p, r.pin), KVC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kvc_prefix_unpin(p, 0), KVC_ERR_INVALID_ARGUMENT);
  CHECK(tier_stats(p, 0).pinned == 0);
  CHECK(invariants(p));
}

// A store that fails for the second of three chained blocks: a lookup finds
// one block, a load loads one.
KVTEST(host_failed_store_breaks_chain) {
  HooksReset reset;
  Pool p(16);
  add_host(p);
  const auto t = prompt(700, 13);
  uint8_t keys[3 * 32];
  size_t ks = 0;
  CHECK_OK(kvc_prefix_keys(p, t.data(), 12, nullptr, 0, keys, sizeof keys, &ks));
  CHECK(ks == 32);
  kvc::BlockKey second;
  std::memcpy(second.b.data(), keys + ks, ks);
  kvc::core::TestHooks h;
  h.fail_put = [second](const kvc::BlockKey &k) { return k == second; };
  kvc::core::set_test_hooks(h);
  write_seq(p, 1, t);
  CHECK_OK(kvc_seq_free(p, 1));
  free_range(p, 100, squeeze(p, 100));
  CHECK_OK(kvc_pool_flush_tiers(p));
  const kvc_tier_stats s = tier_stats(p, 0);
  CHECK(s.demotions == 2);
  CHECK(s.errors == 1);
  CHECK(std::strlen(s.last_error) > 0);
  CHECK(lookup(p, t).tier_tokens == 4);
  uint64_t loaded = 0;
  CHECK_OK(kvc_prefix_load(p, t.data(), t.size(), nullptr, 0, &loaded));
  CHECK(loaded == 4);
  CHECK_OK(kvc_prefix_attach(p, 2, t.data(), t.size(), nullptr, 0, 0, nullptr));
  CHECK(seq_matches(p, 2, t, 4));
  CHECK(invariants(p));
}

// Tier keys carry the pool's namespace: a tenant's blocks (salt s1) are never
// found with salt s2, and no tier read is issued for them; the same tenant
// finds them all, byte-identical. Another model id (same seed, same directory)
// finds nothing either.
KVTEST(disk_salt_and_model_isolation) {
  const std::string dir = temp_dir();
  const auto t = prompt(800, 13);
  const kvc_prefix_extra s1 = salt_of("tenant-1"), s2 = salt_of("tenant-2");
  {
    Pool p(16);
    add_host(p);
    add_disk(p, dir);
    write_seq(p, 1, t, &s1, 1);
    CHECK_OK(kvc_prefix_offload(p, t.data(), t.size(), &s1, 1, nullptr));
    CHECK_OK(kvc_pool_flush_tiers(p));
    CHECK(tier_stats(p, 0).entries == 3);
    CHECK(tier_stats(p, 1).entries == 3);
    CHECK_OK(kvc_seq_free(p, 1));
    free_range(p, 100, squeeze(p, 100));
    CHECK_OK(kvc_pool_flush_tiers(p));
    const kvc_tier_stats h0 = tier_stats(p, 0), d0 = tier_stats(p, 1);
    CHECK(lookup(p, t, &s2, 1).tier_tokens == 0);
    CHECK(lookup(p, t).tier_tokens == 0);
    uint64_t loaded = 9;
    CHECK_OK(kvc_prefix_load(p, t.data(), t.size(), &s2, 1, &loaded));
    CHECK(loaded == 0);
    const kvc_tier_stats h1 = tier_stats(p, 0), d1 = tier_stats(p, 1);
    CHECK(h1.hits + h1.misses == h0.hits + h0.misses);  // no read issued
    CHECK(d1.hits + d1.misses == d0.hits + d0.misses);
    CHECK(lookup(p, t, &s1, 1).tier_tokens == 12);
    CHECK_OK(kvc_prefix_load(p, t.data(), t.size(), &s1, 1, &loaded));
    CHECK(loaded == 12);
    CHECK_OK(kvc_prefix_attach(p, 2, t.data(), t.size(), &s1, 1, 0, nullptr));
    CHECK(seq_matches(p, 2, t, 12));
  }
  {
    Pool other(16, "m2");  // same seed and directory, another model
    add_disk(other, dir);
    CHECK(lookup(other, t, &s1, 1).tier_tokens == 0);
  }
  {
    Pool same(16, "m1");
    add_disk(same, dir);
    CHECK(lookup(same, t, &s1, 1).tier_tokens == 12);
  }
  remove_dir(dir);
}

// A new process that opens the same directory serves the prefix from disk.
KVTEST(disk_restart_serves_prefix) {
  const std::string dir = temp_dir();
  const auto t = prompt(900, 21);  // 5 blocks
  const pid_t pid = fork();
  if (pid == 0) {  // the writer process
    int rc = 0;
    {
      Pool p(32);
      add_disk(p, dir);
      write_seq(p, 1, t);
      uint64_t q = 0;
      rc |= kvc_prefix_offload(p, t.data(), t.size(), nullptr, 0, &q) != KVC_OK || q != 5;
      rc |= kvc_pool_flush_tiers(p) != KVC_OK;
    }
    _exit(rc | (g_kvtest_fail != 0));
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  Pool p(32);
  add_disk(p, dir);
  CHECK(tier_stats(p, 0).entries == 5);
  CHECK(lookup(p, t).tier_tokens == 20);
  uint64_t loaded = 0;
  CHECK_OK(kvc_prefix_load(p, t.data(), t.size(), nullptr, 0, &loaded));
  CHECK(loaded == 20);
  CHECK_OK(kvc_prefix_attach(p, 2, t.data(), t.size(), nullptr, 0, 0, nullptr));
  CHECK(seq_matches(p, 2, t, 20));
  CHECK(tier_stats(p, 0).promotions == 5);
  CHECK(invariants(p));
  remove_dir(dir);
}

// A flipped byte in a disk record: the load stops before that block, the
// record is removed, the error counted; the lookup then reports one block.
KVTEST(disk_flipped_byte_is_miss) {
  const std::string dir = temp_dir();
  const auto t = prompt(1100, 13);
  Pool p(16);
  add_disk(p, dir);
  write_seq(p, 1, t);
  CHECK_OK(kvc_prefix_offload(p, t.data(), t.size(), nullptr, 0, nullptr));
  CHECK_OK(kvc_pool_flush_tiers(p));
  CHECK_OK(kvc_seq_free(p, 1));
  free_range(p, 100, squeeze(p, 100));
  CHECK_OK(kvc_pool_flush_tiers(p));
  uint8_t keys[3 * 32];
  size_t ks = 0;
  CHECK_OK(kvc_prefix_keys(p, t.data(), 12, nullptr, 0, keys, sizeof keys, &ks));
  static const char hx[] = "0123456789abcdef";
  std::string name;
  for (size_t i = 0; i < 32; ++i) name += hx[keys[ks + i] >> 4], name += hx[keys[ks + i] & 15];
  const std::string path = dir + "/" + name + ".kvct";
  FILE *f = std::fopen(path.c_str(), "r+b");
  CHECK(f != nullptr);
  if (f) {
    std::fseek(f, 200, SEEK_SET);
    const int c = std::fgetc(f);
    std::fseek(f, 200, SEEK_SET);
    std::fputc(c ^ 0x10, f);
    std::fclose(f);
  }
  const uint64_t err0 = tier_stats(p, 0).errors;
  uint64_t loaded = 0;
  CHECK_OK(kvc_prefix_load(p, t.data(), t.size(), nullptr, 0, &loaded));
  CHECK(loaded == 4);
  CHECK(access(path.c_str(), F_OK) != 0);  // removed
  CHECK(tier_stats(p, 0).errors == err0 + 1);
  CHECK(lookup(p, t).hit_tokens == 4);
  CHECK(lookup(p, t).tier_tokens == 0);
  CHECK_OK(kvc_prefix_attach(p, 2, t.data(), t.size(), nullptr, 0, 0, nullptr));
  CHECK(seq_matches(p, 2, t, 4));
  CHECK(invariants(p));
  remove_dir(dir);
}

// A full disk (a file size limit: writes fail with EFBIG): demotions turn into
// counted errors with a readable reason, the pool's own blocks stay intact.
KVTEST(disk_full_turns_into_errors) {
  const std::string dir = temp_dir();
  const auto t = prompt(1200, 13);
  Pool p(16);
  add_disk(p, dir);
  write_seq(p, 1, t);
  struct rlimit old;
  getrlimit(RLIMIT_FSIZE, &old);
  void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 100;
  CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
  CHECK_OK(kvc_prefix_offload(p, t.data(), t.size(), nullptr, 0, nullptr));
  CHECK_OK(kvc_pool_flush_tiers(p));
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, prev);
  const kvc_tier_stats s = tier_stats(p, 0);
  CHECK(s.errors == 3);
  CHECK(s.demotions == 0);
  CHECK(s.entries == 0);
  CHECK(std::strstr(s.last_error, "cannot write") != nullptr);
  CHECK(seq_matches(p, 1, t, 13));  // the pool keeps its blocks
  CHECK(lookup(p, t).hit_tokens == 12);
  CHECK(lookup(p, t).tier_tokens == 0);
  // The disk has room again: the same call now stores them.
  CHECK_OK(kvc_prefix_offload(p, t.data(), t.size(), nullptr, 0, nullptr));
  CHECK_OK(kvc_pool_flush_tiers(p));
  CHECK(tier_stats(p, 0).entries == 3);
  CHECK(invariants(p));
  remove_dir(dir);
}

// Random operations on a small pool with a small host tier: prompts drawn
// from a few shared prefixes are written, attached, loaded (sync and async),
// pinned and unpinned, offloaded and reclaimed. After every operation the
// pool's invariants hold, and every attached sequence holds the computed
// bytes of its prompt.
KVTEST(host_random_ops) {
  uint64_t total_loaded = 0, total_demoted = 0, total_attached = 0;
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    std::mt19937 rng(seed);
    Pool p(8 + seed * 4);
    add_host(p, 6000 + seed * 3000);  // a few records: LRU replacement is exercised
    CHECK_OK(kvc_pool_set_offload(p, 1 + seed % 4, 2000));
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 6; ++i) {
      auto t = prompt(100 * (i % 3), 3 + (i * 5 + seed) % 14);  // shared starts
      for (size_t j = t.size() / 2; j < t.size(); ++j) t[j] += i;
      prompts.push_back(t);
    }
    struct Live {
      size_t prompt;
      uint64_t valid;  // leading tokens that must hold the computed bytes
    };
    std::map<uint64_t, Live> live;
    std::vector<uint64_t> pins, tickets;
    uint64_t next = 1;
    for (int op = 0; op < 300; ++op) {
      const size_t pi = rng() % prompts.size();
      const auto &t = prompts[pi];
      switch (rng() % 9) {
        case 0: {  // compute and register a prompt (if it fits)
          const kvc_stats s = pool_stats(p);
          if ((s.blocks_free + s.blocks_cached) / kLayers < (t.size() + kBs - 1) / kBs + 1) break;
          write_seq(p, next, t);
          live[next++] = {pi, t.size()};
          break;
        }
        case 1: {  // attach the cached prefix
          kvc_prefix_result r;
          std::memset(&r, 0, sizeof r);
          r.struct_size = sizeof r;
          const kvc_status st = kvc_prefix_attach(p, next, t.data(), t.size(), nullptr, 0, rng() % 2, &r);
          CHECK(st == KVC_OK || st == KVC_ERR_POOL_EXHAUSTED);
          if (st == KVC_OK) live[next++] = {pi, r.hit_tokens + r.partial_tokens};
          if (st == KVC_OK) total_attached += r.hit_tokens;
          break;
        }
        case 2:
        case 3:
          if (!live.empty()) {  // free one
            auto it = live.begin();
            std::advance(it, rng() % live.size());
            CHECK_OK(kvc_seq_free(p, it->first));
            live.erase(it);
          }
          break;
        case 4: {  // synchronous load
          uint64_t loaded = 0;
          const kvc_status st = kvc_prefix_load(p, t.data(), t.size(), nullptr, 0, &loaded);
          CHECK(st == KVC_OK);
          CHECK(loaded % kBs == 0 && loaded < t.size());
          total_loaded += loaded;
          break;
        }
        case 5: {  // prefetch, polled later
          uint64_t ticket = 0;
          CHECK_OK(kvc_prefix_prefetch(p, t.data(), t.size(), nullptr, 0, &ticket));
          tickets.push_back(ticket);
          break;
        }
        case 6:
          if (!tickets.empty()) {
            uint64_t loaded = 0;
            const kvc_status st = kvc_prefix_poll(p, tickets.back(), &loaded);
            CHECK(st == KVC_OK || st == KVC_ERR_PENDING);
            if (st == KVC_OK) tickets.pop_back();
          }
          break;
        case 7: {  // pin through a lookup, or unpin
          if (!pins.empty() && rng() % 2) {
            CHECK_OK(kvc_prefix_unpin(p, pins.back()));
            CHECK_STATUS(kvc_prefix_unpin(p, pins.back()), KVC_ERR_INVALID_ARGUMENT);
            pins.pop_back();
          } else {
            const kvc_prefix_result r = lookup(p, t, nullptr, 0, KVC_PREFIX_PIN);
            CHECK(r.hit_tokens + r.tier_tokens < t.size());
            if (r.pin) pins.push_back(r.pin);
          }
          break;
        }
        default: {  // offload, or reclaim everything cached
          if (rng() % 2) {
            CHECK_OK(kvc_prefix_offload(p, t.data(), t.size(), nullptr, 0, nullptr));
          } else {
            const uint64_t end = squeeze(p, 1u << 20);
            free_range(p, 1u << 20, end);
          }
          break;
        }
      }
      if (!invariants(p)) {
        std::fprintf(stderr, "seed %u op %d\n", seed, op);
        ++g_kvtest_fail;
        return;
      }
    }
    for (auto &[id, l] : live) {
      const bool ok = seq_matches(p, id, prompts[l.prompt], l.valid);
      if (!ok) std::fprintf(stderr, "seed %u seq %llu prompt %zu valid %llu\n", seed, (unsigned long long)id, l.prompt, (unsigned long long)l.valid);
      CHECK(ok);
    }
    for (uint64_t tk : tickets) {
      uint64_t loaded = 0;
      kvc_status st = KVC_ERR_PENDING;
      for (int i = 0; i < 5000 && st == KVC_ERR_PENDING; ++i) {
        st = kvc_prefix_poll(p, tk, &loaded);
        if (st == KVC_ERR_PENDING) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      CHECK(st == KVC_OK);
    }
    for (uint64_t pin : pins) CHECK_OK(kvc_prefix_unpin(p, pin));
    CHECK(tier_stats(p, 0).pinned == 0);
    CHECK_OK(kvc_pool_flush_tiers(p));
    CHECK(invariants(p));
    total_demoted += tier_stats(p, 0).demotions;
    // After all that, the round trip still works: a prompt offloaded,
    // reclaimed and loaded back is byte-identical.
    for (auto &[id, l] : live) CHECK_OK(kvc_seq_free(p, id));
    free_range(p, 1u << 21, squeeze(p, 1u << 21));
    CHECK_OK(kvc_pool_flush_tiers(p));  // the queue is empty again (it may hold 1 block only)
    const auto last = prompt(5000 + static_cast<int32_t>(seed), 9);  // 2 whole blocks
    write_seq(p, 1u << 22, last);
    CHECK_OK(kvc_pool_set_offload(p, 64, 2000));  // room for every block queued below
    uint64_t queued = 0;
    CHECK_OK(kvc_prefix_offload(p, last.data(), last.size(), nullptr, 0, &queued));
    CHECK(queued == 2);
    CHECK_OK(kvc_pool_flush_tiers(p));
    CHECK_OK(kvc_seq_free(p, 1u << 22));
    free_range(p, 1u << 21, squeeze(p, 1u << 21));
    CHECK_OK(kvc_pool_flush_tiers(p));
    uint64_t loaded = 0;
    CHECK_OK(kvc_prefix_load(p, last.data(), last.size(), nullptr, 0, &loaded));
    CHECK(loaded == 8);
    CHECK_OK(kvc_prefix_attach(p, (1u << 22) + 1, last.data(), last.size(), nullptr, 0, 0, nullptr));
    CHECK(seq_matches(p, (1u << 22) + 1, last, 8));
    CHECK(invariants(p));
  }
  std::printf("loaded %llu tokens, demoted %llu blocks, attached %llu tokens\n", (unsigned long long)total_loaded,
              (unsigned long long)total_demoted, (unsigned long long)total_attached);
  CHECK(total_demoted > 0 && total_attached > 0);  // the paths were exercised
}

// Threads attach, load, prefetch, reclaim and offload on one pool with a host
// and a disk tier at the same time (ThreadSanitizer runs this): every
// attached sequence holds its prompt's computed bytes.
KVTEST(host_threads_offload) {
  const std::string dir = temp_dir();
  {
    Pool p(64);
    add_host(p, 20000);
    add_disk(p, dir, 60000);
    CHECK_OK(kvc_pool_set_offload(p, 8, 5000));
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 4; ++i) prompts.push_back(prompt(50 * i, 13));
    for (int i = 0; i < 4; ++i) {
      write_seq(p, 1 + i, prompts[i]);
      CHECK_OK(kvc_seq_free(p, 1 + i));
    }
    std::atomic<int> bad{0};
    std::vector<std::thread> th;
    for (int w = 0; w < 3; ++w) {
      th.emplace_back([&, w] {
        std::mt19937 rng(w + 11);
        for (int i = 0; i < 60; ++i) {
          const auto &t = prompts[rng() % prompts.size()];
          const uint64_t id = 1000 + uint64_t(w) * 1000 + i;
          uint64_t loaded = 0;
          if (rng() % 2) {
            if (kvc_prefix_load(p, t.data(), t.size(), nullptr, 0, &loaded) != KVC_OK) ++bad;
          } else {
            uint64_t ticket = 0;
            if (kvc_prefix_prefetch(p, t.data(), t.size(), nullptr, 0, &ticket) != KVC_OK) ++bad;
            kvc_status st = KVC_ERR_PENDING;
            while (st == KVC_ERR_PENDING) st = kvc_prefix_poll(p, ticket, &loaded);
            if (st != KVC_OK) ++bad;
          }
          kvc_prefix_result r;
          std::memset(&r, 0, sizeof r);
          r.struct_size = sizeof r;
          const kvc_status st = kvc_prefix_attach(p, id, t.data(), t.size(), nullptr, 0, 0, &r);
          if (st == KVC_OK) {
            if (!seq_matches(p, id, t, r.hit_tokens)) ++bad;
            kvc_seq_free(p, id);
          } else if (st != KVC_ERR_POOL_EXHAUSTED) {
            ++bad;
          }
        }
      });
    }
    th.emplace_back([&] {  // pressure: garbage sequences reclaim cached blocks
      for (int i = 0; i < 40; ++i) {
        const uint64_t id = 50000 + i;
        std::vector<int32_t> g(kBs * 3, 0);
        if (kvc_seq_create(p, id) != KVC_OK) ++bad;
        if (kvc_seq_reserve(p, id, g.size(), nullptr) == KVC_OK) {
          std::vector<float> k(g.size() * kRow, -1.0f);
          for (uint32_t l = 0; l < kLayers; ++l)
            if (kvc_append(p, id, l, 0, g.size(), k.data(), k.data(), KVC_DTYPE_F32) != KVC_OK) ++bad;
        }
        kvc_seq_free(p, id);
        const auto &t = prompts[i % prompts.size()];
        kvc_prefix_offload(p, t.data(), t.size(), nullptr, 0, nullptr);
        kvc_prefix_result r = lookup(p, t, nullptr, 0, KVC_PREFIX_PIN);
        if (r.pin && kvc_prefix_unpin(p, r.pin) != KVC_OK) ++bad;
      }
    });
    for (auto &x : th) x.join();
    CHECK(bad.load() == 0);
    CHECK_OK(kvc_pool_flush_tiers(p));
    CHECK(invariants(p));
  }
  remove_dir(dir);
}

// The seed's store / retrieve by sequence id, with the public API: a request's
// sequence is stored to a file named by its id, the pool forgets it, and a
// new process retrieves it into its own pool, byte-identical and able to go on.
KVTEST(disk_store_retrieve_by_sequence) {
  const std::string dir = temp_dir();
  const auto t = prompt(1300, 23);
  const uint64_t seq_id = 77;
  const std::string path = dir + "/seq-" + std::to_string(seq_id) + ".kvcs";
  {
    Pool p(16);
    write_seq(p, seq_id, t);
    CHECK_OK(kvc_seq_save_file(p, seq_id, path.c_str()));  // store
    CHECK_OK(kvc_seq_free(p, seq_id));
    CHECK_STATUS(kvc_seq_save_file(p, seq_id, path.c_str()), KVC_ERR_SEQ_NOT_FOUND);
  }
  const pid_t pid = fork();
  if (pid == 0) {  // retrieve in another process
    int rc = 0;
    {
      Pool q(16);
      rc |= kvc_seq_restore_file(q, seq_id, path.c_str()) != KVC_OK;
      uint64_t len = 0;
      rc |= kvc_seq_length(q, seq_id, &len) != KVC_OK || len != t.size();
      rc |= !seq_matches(q, seq_id, t, t.size());
      rc |= kvc_seq_restore_file(q, seq_id, path.c_str()) != KVC_ERR_SEQ_EXISTS;
      // It goes on: one more token appended after the restored ones.
      rc |= kvc_seq_reserve(q, seq_id, 1, nullptr) != KVC_OK;
      std::vector<float> k(kRow, 0.5f);
      for (uint32_t l = 0; l < kLayers; ++l)
        rc |= kvc_append(q, seq_id, l, t.size(), 1, k.data(), k.data(), KVC_DTYPE_F32) != KVC_OK;
      rc |= !seq_matches(q, seq_id, t, t.size());
    }
    _exit(rc | (g_kvtest_fail != 0));
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // A pool of another geometry refuses the record with its own status.
  kvc_pool *other = nullptr;
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = kLayers, c.num_q_heads = kHeads, c.num_kv_heads = kHeads, c.head_dim = kDim;
  c.block_size = kBs * 2, c.num_blocks = 16, c.k_dtype = c.v_dtype = KVC_DTYPE_F32;
  CHECK_OK(kvc_pool_create(&c, &other));
  CHECK_STATUS(kvc_seq_restore_file(other, seq_id, path.c_str()), KVC_ERR_INCOMPATIBLE);
  kvc_pool_destroy(other);
  remove_dir(dir);
}

// Bad input gets a status and a message, never a half applied change.
KVTEST(host_bad_input) {
  Pool p(8);
  kvc_tier_config c;
  // The 0.3 function: the header's macro needs a typed pointer.
  CHECK_STATUS((kvc_tier_config_init)(nullptr, KVC_TIER_HOST), KVC_ERR_NULL_POINTER);
  CHECK_STATUS(kvc_tier_config_init(&c, static_cast<kvc_tier_kind>(7)), KVC_ERR_INVALID_ARGUMENT);
  CHECK_OK(kvc_tier_config_init(&c, KVC_TIER_HOST));
  CHECK_STATUS(kvc_pool_add_tier(p, &c, nullptr), KVC_ERR_INVALID_ARGUMENT);  // capacity 0
  c.capacity_bytes = 1 << 20;
  c.flags = KVC_TIER_REDIS_CLUSTER;
  CHECK_STATUS(kvc_pool_add_tier(p, &c, nullptr), KVC_ERR_INVALID_ARGUMENT);
  c.flags = 0;
  c.reserved = 1;
  CHECK_STATUS(kvc_pool_add_tier(p, &c, nullptr), KVC_ERR_UNSUPPORTED);
  c.reserved = 0;
  c.struct_size = 8;
  CHECK_STATUS(kvc_pool_add_tier(p, &c, nullptr), KVC_ERR_STRUCT_SIZE);
  c.struct_size = sizeof c;
  CHECK_STATUS(kvc_pool_add_tier(nullptr, &c, nullptr), KVC_ERR_NULL_POINTER);
  CHECK_STATUS(kvc_pool_add_tier(p, nullptr, nullptr), KVC_ERR_NULL_POINTER);
  kvc_tier_config d;
  CHECK_OK(kvc_tier_config_init(&d, KVC_TIER_DISK));
  d.capacity_bytes = 1 << 20;
  CHECK_STATUS(kvc_pool_add_tier(p, &d, nullptr), KVC_ERR_INVALID_ARGUMENT);  // no path
  d.path = "/proc/kvc-no-such-dir/x";
  CHECK_STATUS(kvc_pool_add_tier(p, &d, nullptr), KVC_ERR_IO);
  kvc_tier_config r;
  CHECK_OK(kvc_tier_config_init(&r, KVC_TIER_REDIS));
  CHECK_STATUS(kvc_pool_add_tier(p, &r, nullptr), KVC_ERR_INVALID_ARGUMENT);  // no address
  for (const char *bad : {"localhost", ":6379", "host:", "host:0", "host:65536", "host:12x", "a:1,", "a:1,b:2"}) {
    r.address = bad;
    CHECK_STATUS(kvc_pool_add_tier(p, &r, nullptr), KVC_ERR_INVALID_ARGUMENT);
  }
  // No tier was added by any of these.
  kvc_tier_stats s;
  kvc_tier_stats_init(&s);
  CHECK_STATUS(kvc_pool_tier_stats(p, 0, &s), KVC_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kvc_pool_set_offload(p, 4, 100), KVC_ERR_INVALID_ARGUMENT);  // no tier
  CHECK_STATUS(kvc_pool_flush_tiers(nullptr), KVC_ERR_NULL_POINTER);
  CHECK_OK(kvc_pool_flush_tiers(p));
  uint64_t ticket = 0;
  const int32_t tok[5] = {1, 2, 3, 4, 5};
  CHECK_STATUS(kvc_prefix_prefetch(p, tok, 5, nullptr, 0, &ticket), KVC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kvc_prefix_load(p, tok, 5, nullptr, 0, nullptr), KVC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kvc_prefix_offload(p, tok, 5, nullptr, 0, nullptr), KVC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kvc_prefix_unpin(p, 1), KVC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kvc_prefix_poll(p, 1, nullptr), KVC_ERR_INVALID_ARGUMENT);
  add_host(p);
  CHECK_STATUS(kvc_pool_set_offload(p, 0, 100), KVC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kvc_pool_set_offload(p, 4, 0), KVC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kvc_prefix_prefetch(p, tok, 5, nullptr, 0, nullptr), KVC_ERR_NULL_POINTER);
  CHECK_STATUS(kvc_prefix_prefetch(p, nullptr, 5, nullptr, 0, &ticket), KVC_ERR_NULL_POINTER);
  CHECK_STATUS(kvc_prefix_poll(p, 12345, nullptr), KVC_ERR_INVALID_ARGUMENT);
  CHECK_OK(kvc_prefix_prefetch(p, tok, 5, nullptr, 0, &ticket));  // nothing to load: done at once
  uint64_t loaded = 5;
  CHECK_OK(kvc_prefix_poll(p, ticket, &loaded));
  CHECK(loaded == 0);
  kvc_prefix_result old;
  std::memset(&old, 0, sizeof old);
  old.struct_size = offsetof(kvc_prefix_result, tier_tokens);  // a 0.2-sized result
  CHECK_OK(kvc_prefix_lookup(p, tok, 5, nullptr, 0, 0, &old));
  CHECK_STATUS(kvc_prefix_lookup(p, tok, 5, nullptr, 0, KVC_PREFIX_PIN, &old), KVC_ERR_STRUCT_SIZE);
  CHECK_STATUS(kvc_prefix_lookup(p, tok, 5, nullptr, 0, 0x4, &old), KVC_ERR_INVALID_ARGUMENT);
  kvc_pool *plain = nullptr;
  kvc_pool_config pc;
  kvc_pool_config_init(&pc);
  pc.num_layers = 1, pc.num_q_heads = 1, pc.num_kv_heads = 1, pc.head_dim = 8, pc.num_blocks = 4;
  CHECK_OK(kvc_pool_create(&pc, &plain));
  CHECK_OK(kvc_tier_config_init(&c, KVC_TIER_HOST));
  c.capacity_bytes = 1 << 20;
  CHECK_STATUS(kvc_pool_add_tier(plain, &c, nullptr), KVC_ERR_INVALID_ARGUMENT);  // no prefix cache
  kvc_pool_destroy(plain);
  CHECK(invariants(p));
}

int main(int argc, char **argv) { return kvtest_main(argc, argv); }
