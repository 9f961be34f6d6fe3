// The Redis tier (src/tier/redis_tier.cpp) against real servers: the ctest
// fixture tests/tier/redis_fixture.sh starts a standalone redis-server and a
// 3-node cluster on free loopback ports and writes them to $KVC_REDIS_DIR/ports.
// Without redis-server (or hiredis) every test exits 77: skipped.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "../whitebox.h"
#include "tier/redis_cluster.h"
#include "tier/tier.h"
#include "pool_util.h"

#ifdef KVC_TEST_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#endif

using kvc::BlockKey;
using kvc::tier::RedisConfig;
using kvc::tier::Tier;
namespace redis = kvc::tier::redis;

namespace {

bool g_skip = false;

void skip(const char *why) {
  std::fprintf(stderr, "skipped: %s\n", why);
  g_skip = true;
}

BlockKey key(int i) {
  BlockKey k;
  for (size_t j = 0; j < 32; ++j)
    k.b[j] = static_cast<uint8_t>((i * 131 + j * 7 + (i >> 8)) & 0xff);
  k.b[0] = static_cast<uint8_t>(i), k.b[1] = static_cast<uint8_t>(i >> 8);
  return k;
}

std::vector<uint8_t> payload(int i, size_t n) {
  std::vector<uint8_t> p(n);
  for (size_t j = 0; j < n; ++j) p[j] = static_cast<uint8_t>(i * 17 + j * 3 + (j >> 9));
  return p;
}

const std::vector<uint8_t> kFp = {1, 2, 3, 4, 5, 6, 7, 8};
const std::vector<uint8_t> kOtherFp = {1, 2, 3, 4, 5, 6, 7, 9};

// A key prefix of its own per test and process, so tests sharing a server never meet.
std::string prefix(const char *test) {
  return std::string("kvct:") + test + ":" + std::to_string(getpid()) + ":";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Servers {
  std::string dir;
  int standalone = 0;
  std::vector<int> cluster;
};

// The fixture's servers, or false (and the test is skipped) when there are none.
bool servers(Servers &s) {
#ifndef KVC_TEST_HAVE_HIREDIS
  (void)s;
  skip("built without hiredis");
  return false;
#else
  const char *d = std::getenv("KVC_REDIS_DIR");
  if (!d) {
    skip("KVC_REDIS_DIR not set (run through ctest: its fixture starts the servers)");
    return false;
  }
  s.dir = d;
  std::ifstream f(s.dir + "/ports");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string what;
    in >> what;
    if (what == "skip") {
      skip(line.c_str());
      return false;
    }
    if (what == "standalone") in >> s.standalone;
    for (int p; what == "cluster" && in >> p;) s.cluster.push_back(p);
  }
  if (!s.standalone || s.cluster.size() != 3) {
    std::fprintf(stderr, "%s/ports: no servers listed (did the fixture fail?)\n", s.dir.c_str());
    CHECK(false);
    return false;
  }
  return true;
#endif
}

RedisConfig standalone_cfg(int port, const char *test) {
  RedisConfig c;
  c.nodes = {{"127.0.0.1", port}};
  c.key_prefix = prefix(test);
  return c;
}

RedisConfig cluster_cfg(const std::vector<int> &ports, const char *test) {
  RedisConfig c;
  for (int p : ports) c.nodes.push_back({"127.0.0.1", p});
  c.cluster = true;
  c.key_prefix = prefix(test);
  return c;
}

}  // namespace

// The slot function needs no server.
KVTEST(redis_crc16_slots) {
  CHECK(redis::crc16("123456789", 9) == 0x31C3);
  CHECK(redis::crc16("", 0) == 0);
  CHECK(redis::key_slot("123456789") == 0x31C3 % 16384);
  CHECK(redis::key_slot("{user1000}.following") == redis::key_slot("{user1000}.followers"));
  CHECK(redis::key_slot("{user1000}.following") == redis::key_slot("user1000"));
  CHECK(redis::key_slot("foo{}{bar}") ==
        redis::crc16("foo{}{bar}", 10) % 16384);                       // empty tag: whole key
  CHECK(redis::key_slot("foo{{bar}}zap") == redis::key_slot("{bar"));  // first '{' to first '}'
  CHECK(redis::key_slot("foo{{bar}}zap") == redis::crc16("{bar", 4) % 16384);
  CHECK(redis::key_slot("foo{bar}{zap}") == redis::key_slot("bar"));
  CHECK(redis::key_slot("foo{bar") == redis::crc16("foo{bar", 7) % 16384);  // no '}': whole key
  CHECK(redis::key_slot("foo}bar{") == redis::crc16("foo}bar{", 8) % 16384);
  // Published values (the specification's examples and redis-cli CLUSTER KEYSLOT).
  CHECK(redis::key_slot("foo") == 12182);
  CHECK(redis::key_slot("bar") == 5061);
  CHECK(redis::key_slot("hello") == 866);
#ifdef KVC_TEST_HAVE_HIREDIS
  Servers s;
  if (!servers(s)) return;
  redisContext *c = redisConnect("127.0.0.1", s.cluster[0]);
  CHECK(c && !c->err);
  if (!c || c->err) return;
  std::mt19937 rng(12345);
  const std::string alphabet = "ab{}:x0";
  for (int i = 0; i < 50; ++i) {
    std::string k;
    const size_t n = 1 + rng() % 24;
    for (size_t j = 0; j < n; ++j)
      k += (i % 2) ? alphabet[rng() % alphabet.size()]
                   : static_cast<char>(rng() & 0xff);  // binary keys too
    const char *av[] = {"CLUSTER", "KEYSLOT", k.data()};
    const size_t al[] = {7, 7, k.size()};
    auto *r = static_cast<redisReply *>(redisCommandArgv(c, 3, av, al));
    CHECK(r && r->type == REDIS_REPLY_INTEGER);
    if (r && r->type == REDIS_REPLY_INTEGER && r->integer != redis::key_slot(k)) {
      std::fprintf(stderr, "key %d: server slot %lld, client slot %u\n", i, r->integer,
                   redis::key_slot(k));
      CHECK(false);
    }
    if (r) freeReplyObject(r);
  }
  redisFree(c);
#else
  skip("built without hiredis: the slots were not compared with a server");
#endif
}

// The configurations make_redis_tier refuses, and a server that is not there.
KVTEST(redis_config_and_refused) {
  std::string err;
  RedisConfig c;
  auto t = kvc::tier::make_redis_tier(c, &err);
#ifndef KVC_TEST_HAVE_HIREDIS
  CHECK(!t && err == "built without hiredis");
  skip("built without hiredis");
  return;
#else
  CHECK(!t && !err.empty());
  c.nodes = {{"127.0.0.1", 1}, {"127.0.0.1", 2}};
  CHECK(!kvc::tier::make_redis_tier(c, &err));  // two servers without cluster
  c.nodes = {{"127.0.0.1", 70000}};
  CHECK(!kvc::tier::make_redis_tier(c, &err));
  c.nodes = {{"127.0.0.1", 6379}};
  c.timeout_ms = 0;
  CHECK(!kvc::tier::make_redis_tier(c, &err));
  // A port nobody listens on (port 1 needs root to bind): made, but every call fails.
  c.nodes = {{"127.0.0.1", 1}};
  c.timeout_ms = 300;
  t = kvc::tier::make_redis_tier(c, &err);
  CHECK(t != nullptr);
  if (!t) return;
  std::vector<uint8_t> out, p = payload(1, 100);
  CHECK(!t->put(key(1), kFp, p.data(), p.size()));
  CHECK(!t->get(key(1), kFp, out));
  CHECK(!t->contains(key(1)) && !t->erase(key(1)));
  const auto st = t->stats();
  CHECK(st.errors == 4 && st.misses == 1 && st.puts == 0 && st.hits == 0);
  CHECK(t->last_error().find("127.0.0.1:1") != std::string::npos);
  std::fprintf(stderr, "last_error: %s\n", t->last_error().c_str());
  c.cluster = true;  // a cluster whose seeds are all down
  t = kvc::tier::make_redis_tier(c, &err);
  CHECK(t && !t->get(key(1), kFp, out) && t->stats().errors == 1 && !t->last_error().empty());
#endif
}

#ifdef KVC_TEST_HAVE_HIREDIS
namespace {

struct ReplyFree {
  void operator()(redisReply *r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

// A raw hiredis connection to look behind the tier's back.
struct Raw {
  redisContext *c = nullptr;
  int port = 0;
  explicit Raw(int p) : port(p) {
    timeval tv{5, 0};
    c = redisConnectWithTimeout("127.0.0.1", p, tv);
    if (c && !c->err) redisSetTimeout(c, tv);
    CHECK(c && !c->err);
  }
  ~Raw() {
    if (c) redisFree(c);
  }
  Raw(const Raw &) = delete;
  Raw &operator=(const Raw &) = delete;
  bool ok() const { return c && !c->err; }
  Reply cmd(const std::vector<std::string> &args) {
    if (!ok()) return nullptr;
    std::vector<const char *> av;
    std::vector<size_t> al;
    for (const auto &a : args) av.push_back(a.data()), al.push_back(a.size());
    return Reply(static_cast<redisReply *>(
        redisCommandArgv(c, static_cast<int>(av.size()), av.data(), al.data())));
  }
  long long integer(const std::vector<std::string> &args) {
    Reply r = cmd(args);
    if (!r || r->type != REDIS_REPLY_INTEGER) {
      std::fprintf(stderr, "%s on %d: %s\n", args[0].c_str(), port,
                   r ? (r->str ? r->str : "not an integer") : c->errstr);
      return -1;
    }
    return r->integer;
  }
  std::string str(const std::vector<std::string> &args) {
    Reply r = cmd(args);
    if (!r || !(r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)) {
      std::fprintf(stderr, "%s on %d: %s\n", args[0].c_str(), port,
                   r ? (r->str ? r->str : "no string") : c->errstr);
      return "";
    }
    return std::string(r->str, r->len);
  }
};

// The node (index into ports) that holds `k` in the cluster, or -1.
int owner_of(std::vector<std::unique_ptr<Raw>> &raw, const std::string &k) {
  int found = -1;
  for (size_t i = 0; i < raw.size(); ++i) {
    Reply r = raw[i]->cmd({"EXISTS", k});  // a node that does not serve the slot answers MOVED
    if (r && r->type == REDIS_REPLY_INTEGER && r->integer == 1)
      found = found < 0 ? static_cast<int>(i) : -2;
  }
  return found;
}

std::vector<std::unique_ptr<Raw>> connect_all(const std::vector<int> &ports) {
  std::vector<std::unique_ptr<Raw>> v;
  for (int p : ports) v.push_back(std::make_unique<Raw>(p));
  return v;
}

// Moves `slot` from node `from` to node `to`: both marked, then either only
// `only` (when not empty) or every key migrated; `finish` assigns the slot to
// `to` on every node (else it stays MIGRATING / IMPORTING: the ASK state).
void migrate_slot(std::vector<std::unique_ptr<Raw>> &raw, const std::vector<int> &ports,
                  long long slot, int from, int to, const std::string &only, bool finish) {
  const std::string s = std::to_string(slot), src_id = raw[from]->str({"CLUSTER", "MYID"}),
                    dst_id = raw[to]->str({"CLUSTER", "MYID"});
  CHECK(!src_id.empty() && !dst_id.empty());
  CHECK(raw[to]->str({"CLUSTER", "SETSLOT", s, "IMPORTING", src_id}) == "OK");
  CHECK(raw[from]->str({"CLUSTER", "SETSLOT", s, "MIGRATING", dst_id}) == "OK");
  std::vector<std::string> keys;
  if (!only.empty()) {
    keys.push_back(only);
  } else {
    Reply r = raw[from]->cmd({"CLUSTER", "GETKEYSINSLOT", s, "1000"});
    CHECK(r && r->type == REDIS_REPLY_ARRAY);
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; ++i)
      keys.emplace_back(r->element[i]->str, r->element[i]->len);
  }
  for (const auto &k : keys)
    CHECK(raw[from]->str({"MIGRATE", "127.0.0.1", std::to_string(ports[to]), k, "0", "5000"}) ==
          "OK");
  if (!finish) return;
  // The target first, then the source, then the others (the specification's order).
  CHECK(raw[to]->str({"CLUSTER", "SETSLOT", s, "NODE", dst_id}) == "OK");
  CHECK(raw[from]->str({"CLUSTER", "SETSLOT", s, "NODE", dst_id}) == "OK");
  for (size_t i = 0; i < raw.size(); ++i)
    if (static_cast<int>(i) != from && static_cast<int>(i) != to)
      CHECK(raw[i]->str({"CLUSTER", "SETSLOT", s, "NODE", dst_id}) == "OK");
}

bool wait_cluster_ok(int port, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (seconds_since(t0) < seconds) {
    {
      Raw r(port);
      if (r.ok() && r.str({"CLUSTER", "INFO"}).find("cluster_state:ok") != std::string::npos)
        return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

int run_shell(const std::string &cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace

KVTEST(redis_put_get_roundtrip) {
  Servers s;
  if (!servers(s)) return;
  std::string err;
  RedisConfig cfg = standalone_cfg(s.standalone, "roundtrip");
  auto t = kvc::tier::make_redis_tier(cfg, &err);
  CHECK(t != nullptr);
  if (!t) return;
  CHECK(std::strcmp(t->name(), "redis") == 0);
  const size_t sizes[] = {0, 1, 1000, 4096, 65536, 100003};
  std::vector<uint8_t> out;
  CHECK(!t->get(key(0), kFp, out));  // nothing yet
  uint64_t bytes = 0;
  for (int i = 0; i < 6; ++i) {
    const auto p = payload(i, sizes[i]);
    CHECK(t->put(key(i), kFp, p.data(), p.size()));
    bytes += 32 + kFp.size() + p.size();
  }
  for (int i = 0; i < 6; ++i) {
    out.assign(3, 0xee);
    CHECK(t->get(key(i), kFp, out) && out == payload(i, sizes[i]));
  }
  // The stored value: the record format of docs/tiers.md under key_prefix + hex.
  Raw raw(s.standalone);
  const std::string k4 = cfg.key_prefix + key(4).hex();
  const std::string v = raw.str({"GET", k4});
  CHECK(v.size() == 32 + kFp.size() + 65536 && v.compare(0, 4, "KVCR") == 0);
  CHECK(raw.integer({"TTL", k4}) == -1);  // no expiry by default
  CHECK(!t->get(key(4), kOtherFp, out));  // another pool's configuration: a miss, left in place
  CHECK(raw.integer({"EXISTS", k4}) == 1);
  CHECK(t->contains(key(4)) && !t->contains(key(99)));
  // Replaced by a later put.
  const auto p9 = payload(9, 5000);
  CHECK(t->put(key(2), kFp, p9.data(), p9.size()));
  CHECK(t->get(key(2), kFp, out) && out == p9);
  CHECK(t->erase(key(2)) && !t->contains(key(2)) && !t->erase(key(2)));
  CHECK(!t->get(key(2), kFp, out));
  auto st = t->stats();
  CHECK(st.puts == 7 && st.hits == 7 && st.misses == 3 && st.errors == 0 && st.evictions == 0);
  CHECK(st.entries == 6);  // what this client wrote (7) less what it deleted (1): an estimate
  CHECK(st.bytes > bytes - 100003 && st.bytes < bytes + 5100);
  CHECK(t->last_error().empty());
  // A TTL: the record expires.
  cfg.ttl_seconds = 100;
  auto tt = kvc::tier::make_redis_tier(cfg, &err);
  CHECK(tt && tt->put(key(7), kFp, p9.data(), p9.size()));
  const long long ttl = raw.integer({"TTL", cfg.key_prefix + key(7).hex()});
  CHECK(ttl > 0 && ttl <= 100);
  CHECK(tt->get(key(7), kFp, out) && out == p9);
  for (int i = 0; i < 8; ++i) t->erase(key(i));
}

KVTEST(redis_flipped_byte) {
  Servers s;
  if (!servers(s)) return;
  std::string err;
  const RedisConfig cfg = standalone_cfg(s.standalone, "flipped");
  auto t = kvc::tier::make_redis_tier(cfg, &err);
  CHECK(t != nullptr);
  if (!t) return;
  Raw raw(s.standalone);
  std::vector<uint8_t> out;
  // One flipped payload byte, one flipped header byte, a truncated record, a stranger's value.
  const auto p = payload(1, 4096);
  for (int i = 0; i < 4; ++i) CHECK(t->put(key(i), kFp, p.data(), p.size()));
  const std::string k0 = cfg.key_prefix + key(0).hex(), k1 = cfg.key_prefix + key(1).hex(),
                    k2 = cfg.key_prefix + key(2).hex(), k3 = cfg.key_prefix + key(3).hex();
  std::string b = raw.str({"GETRANGE", k0, "1000", "1000"});
  CHECK(b.size() == 1);
  b[0] = static_cast<char>(b[0] ^ 0x10);
  CHECK(raw.integer({"SETRANGE", k0, "1000", b}) == static_cast<long long>(32 + kFp.size() + 4096));
  CHECK(raw.integer({"SETRANGE", k1, "0", "X"}) > 0);  // magic
  const std::string whole = raw.str({"GET", k2});
  CHECK(raw.str({"SET", k2, whole.substr(0, whole.size() - 1)}) == "OK");
  CHECK(raw.str({"SET", k3, "not a record"}) == "OK");
  for (int i = 0; i < 4; ++i) {
    CHECK(!t->get(key(i), kFp, out));
    CHECK(t->stats().errors == static_cast<uint64_t>(i + 1));
  }
  CHECK(raw.integer({"EXISTS", k0}) == 0 && raw.integer({"EXISTS", k1}) == 0);
  CHECK(raw.integer({"EXISTS", k2}) == 0 && raw.integer({"EXISTS", k3}) == 0);
  const auto st = t->stats();
  CHECK(st.misses == 4 && st.hits == 0 && st.errors == 4);
  CHECK(t->last_error().find("deleted") != std::string::npos);
  std::fprintf(stderr, "last_error: %s\n", t->last_error().c_str());
  // A whole record still reads back after the damaged ones are gone.
  CHECK(t->put(key(0), kFp, p.data(), p.size()) && t->get(key(0), kFp, out) && out == p);
  t->erase(key(0));
}

// Its own server (started through the fixture script): stopped, frozen and
// started again under one tier object.
KVTEST(redis_server_restart) {
  Servers s;
  if (!servers(s)) return;
  const char *script = std::getenv("KVC_REDIS_FIXTURE");
  CHECK(script != nullptr);
  if (!script) return;
  const std::string name = "restart-" + std::to_string(getpid());
  FILE *f =
      popen((std::string("bash '") + script + "' server '" + s.dir + "' " + name).c_str(), "r");
  int port = 0;
  if (!f || std::fscanf(f, "%d", &port) != 1) port = 0;
  if (f) pclose(f);
  CHECK(port > 0);
  if (port <= 0) return;
  const std::string sdir = s.dir + "/" + name;
  RedisConfig cfg = standalone_cfg(port, "restart");
  cfg.timeout_ms = 500;
  std::string err;
  auto t = kvc::tier::make_redis_tier(cfg, &err);
  CHECK(t != nullptr);
  if (!t) return;
  std::vector<uint8_t> out;
  const auto p = payload(3, 65536);
  CHECK(t->put(key(1), kFp, p.data(), p.size()) && t->get(key(1), kFp, out) && out == p);

  // Stopped: every call fails at once (connection closed / refused), counted.
  {
    Raw raw(port);
    raw.cmd({"SHUTDOWN", "NOSAVE"});
  }
  auto t0 = std::chrono::steady_clock::now();
  CHECK(!t->get(key(1), kFp, out));
  CHECK(!t->put(key(2), kFp, p.data(), p.size()));
  CHECK(!t->contains(key(1)));
  CHECK(seconds_since(t0) < 3);
  auto st = t->stats();
  CHECK(st.errors == 3 && st.misses == 1 && st.hits == 1 && st.puts == 1);
  CHECK(t->last_error().find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
  std::fprintf(stderr, "server down: %s\n", t->last_error().c_str());

  // Started again on the same port (empty: no persistence): the same object works.
  CHECK(run_shell("sh '" + sdir + "/start.sh'") == 0);
  CHECK(!t->get(key(1), kFp, out) &&
        t->stats().errors == 3);  // gone with the restart: a plain miss
  CHECK(t->put(key(1), kFp, p.data(), p.size()) && t->get(key(1), kFp, out) && out == p);

  // Restarted behind an open connection: the closed connection is noticed and replaced.
  {
    Raw raw(port);
    raw.cmd({"SHUTDOWN", "NOSAVE"});
  }
  CHECK(run_shell("sh '" + sdir + "/start.sh'") == 0);
  CHECK(t->put(key(1), kFp, p.data(), p.size()) && t->get(key(1), kFp, out) && out == p);
  redis::Redirects rd;
  CHECK(redis::redirects_of(*t, &rd) && rd.reconnects >= 2);

  // Frozen (SIGSTOP): calls give up after the timeout, then work again.
  std::ifstream pf(sdir + "/redis.pid");
  pid_t pid = 0;
  pf >> pid;
  CHECK(pid > 0);
  if (pid > 0) {
    kill(pid, SIGSTOP);
    t0 = std::chrono::steady_clock::now();
    const uint64_t e0 = t->stats().errors;
    CHECK(!t->get(key(1), kFp, out));
    const double waited = seconds_since(t0);
    CHECK(waited >= 0.4 && waited < 2.5);
    CHECK(t->stats().errors == e0 + 1 && !t->last_error().empty());
    std::fprintf(stderr, "frozen server: %.2f s, %s\n", waited, t->last_error().c_str());
    kill(pid, SIGCONT);
    CHECK(t->get(key(1), kFp, out) && out == p);
  }
  Raw raw(port);
  raw.cmd({"SHUTDOWN", "NOSAVE"});
}

// Readers never see a torn payload while two writers replace one key.
KVTEST(redis_readers_race_writer) {
  Servers s;
  if (!servers(s)) return;
  std::string err;
  const RedisConfig cfg = standalone_cfg(s.standalone, "race");
  auto shared = kvc::tier::make_redis_tier(cfg, &err);  // one writer and the readers share it
  auto other = kvc::tier::make_redis_tier(cfg, &err);   // the other writer: another client
  CHECK(shared && other);
  if (!shared || !other) return;
  const auto a = payload(1, 50000), b = payload(2, 50000);
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0}, hits{0}, failed{0};
  std::thread w1([&] {
    for (int i = 0; i < 200; ++i) failed += !shared->put(key(1), kFp, a.data(), a.size());
  });
  std::thread w2([&] {
    for (int i = 0; i < 200; ++i) failed += !other->put(key(1), kFp, b.data(), b.size());
  });
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r)
    readers.emplace_back([&] {
      std::vector<uint8_t> out;
      while (!stop)
        if (shared->get(key(1), kFp, out)) {
          ++hits;
          torn += out != a && out != b;
        }
    });
  w1.join();
  w2.join();
  stop = true;
  for (auto &r : readers) r.join();
  CHECK(torn == 0);
  CHECK(failed == 0);
  CHECK(hits > 0);
  std::vector<uint8_t> out;
  CHECK(shared->get(key(1), kFp, out) && (out == a || out == b));
  CHECK(shared->stats().errors == 0 && other->stats().errors == 0);
  shared->erase(key(1));
}

KVTEST(redis_cluster_spread) {
  Servers s;
  if (!servers(s)) return;
  std::string err;
  // One seed: the other nodes come from its slot map.
  const RedisConfig cfg = cluster_cfg({s.cluster[1]}, "spread");
  auto t = kvc::tier::make_redis_tier(cfg, &err);
  CHECK(t != nullptr);
  if (!t) return;
  for (int i = 0; i < 200; ++i) {
    const auto p = payload(i, 2000 + i);
    CHECK(t->put(key(i), kFp, p.data(), p.size()));
  }
  auto raw = connect_all(s.cluster);
  int per_node[3] = {0, 0, 0};
  for (int i = 0; i < 200; ++i) {
    const std::string k = cfg.key_prefix + key(i).hex();
    CHECK(raw[0]->integer({"CLUSTER", "KEYSLOT", k}) == redis::key_slot(k));
    const int o = owner_of(raw, k);
    CHECK(o >= 0);
    if (o >= 0) ++per_node[o];
  }
  std::fprintf(stderr, "keys per node: %d %d %d\n", per_node[0], per_node[1], per_node[2]);
  CHECK(per_node[0] + per_node[1] + per_node[2] == 200);
  CHECK((per_node[0] > 0) + (per_node[1] > 0) + (per_node[2] > 0) >= 2);
  // Read back whole, through this tier and through a fresh one seeded elsewhere.
  auto t2 = kvc::tier::make_redis_tier(cluster_cfg({s.cluster[2], s.cluster[0]}, "spread"), &err);
  std::vector<uint8_t> out;
  int whole = 0;
  for (int i = 0; i < 200; ++i) {
    whole += t->get(key(i), kFp, out) && out == payload(i, 2000 + i);
    whole += t2->get(key(i), kFp, out) && out == payload(i, 2000 + i);
  }
  CHECK(whole == 400);
  const auto st = t->stats();
  CHECK(st.puts == 200 && st.hits == 200 && st.errors == 0);
  redis::Redirects rd;
  CHECK(redis::redirects_of(*t, &rd) && rd.map_refreshes >= 1 && rd.moved == 0 && rd.ask == 0);
  for (int i = 0; i < 200; ++i) CHECK(t->erase(key(i)));
  CHECK(!t->contains(key(0)));
}

// A slot moved behind the tier's back: its stale map sends the command to the
// old owner, which answers MOVED.
KVTEST(redis_cluster_moved) {
  Servers s;
  if (!servers(s)) return;
  std::string err;
  const RedisConfig cfg = cluster_cfg(s.cluster, "moved");
  auto t = kvc::tier::make_redis_tier(cfg, &err);
  CHECK(t != nullptr);
  if (!t) return;
  for (int i = 0; i < 20; ++i) CHECK(t->put(key(i), kFp, payload(i, 3000).data(), 3000));
  auto raw = connect_all(s.cluster);
  const std::string k = cfg.key_prefix + key(5).hex();
  const long long slot = raw[0]->integer({"CLUSTER", "KEYSLOT", k});
  const int from = owner_of(raw, k), to = (from + 1) % 3;
  CHECK(slot >= 0 && from >= 0);
  if (slot < 0 || from < 0) return;
  migrate_slot(raw, s.cluster, slot, from, to, "", true);
  CHECK(owner_of(raw, k) == to);
  redis::Redirects before, after, later;
  CHECK(redis::redirects_of(*t, &before) && before.moved == 0);
  std::vector<uint8_t> out;
  CHECK(t->get(key(5), kFp, out) && out == payload(5, 3000));
  CHECK(redis::redirects_of(*t, &after) && after.moved >= 1 &&
        after.map_refreshes > before.map_refreshes);
  // The map is right again: no more redirects for that slot, and the other keys are found.
  CHECK(t->put(key(5), kFp, payload(50, 3000).data(), 3000));
  CHECK(t->get(key(5), kFp, out) && out == payload(50, 3000));
  for (int i = 0; i < 20; ++i)
    if (i != 5) CHECK(t->get(key(i), kFp, out) && out == payload(i, 3000));
  CHECK(redis::redirects_of(*t, &later) && later.moved == after.moved);
  CHECK(t->stats().errors == 0);
  std::fprintf(stderr,
               "slot %lld moved from node %d to %d; redirects: moved %llu, map reads %llu\n", slot,
               from, to, static_cast<unsigned long long>(later.moved),
               static_cast<unsigned long long>(later.map_refreshes));
  for (int i = 0; i < 20; ++i) t->erase(key(i));
}

// A slot in migration: the key already on the target is reached with ASK.
KVTEST(redis_cluster_ask) {
  Servers s;
  if (!servers(s)) return;
  std::string err;
  const RedisConfig cfg = cluster_cfg(s.cluster, "ask");
  auto t = kvc::tier::make_redis_tier(cfg, &err);
  CHECK(t != nullptr);
  if (!t) return;
  for (int i = 0; i < 20; ++i) CHECK(t->put(key(i), kFp, payload(i, 3000).data(), 3000));
  auto raw = connect_all(s.cluster);
  const std::string k = cfg.key_prefix + key(7).hex();
  const long long slot = raw[0]->integer({"CLUSTER", "KEYSLOT", k});
  const int from = owner_of(raw, k), to = (from + 2) % 3;
  CHECK(slot >= 0 && from >= 0);
  if (slot < 0 || from < 0) return;
  migrate_slot(raw, s.cluster, slot, from, to, k,
               false);  // only this key, the slot stays in migration
  CHECK(raw[from]->integer({"EXISTS", k}) != 1);
  std::vector<uint8_t> out;
  CHECK(t->get(key(7), kFp, out) && out == payload(7, 3000));
  redis::Redirects rd;
  CHECK(redis::redirects_of(*t, &rd) && rd.ask >= 1 && rd.moved == 0);
  const uint64_t asks = rd.ask;
  CHECK(t->contains(key(7)));  // again through ASK: the map was not changed
  CHECK(redis::redirects_of(*t, &rd) && rd.ask == asks + 1 && rd.moved == 0);
  // Finish the migration (the slot's other keys, if any, then the owner everywhere).
  migrate_slot(raw, s.cluster, slot, from, to, "", true);
  CHECK(t->get(key(7), kFp, out) && out == payload(7, 3000));
  CHECK(redis::redirects_of(*t, &rd) && rd.moved >= 1);
  CHECK(t->stats().errors == 0);
  for (int i = 0; i < 20; ++i) t->erase(key(i));
}

// One node stopped: its keys are misses with counted errors, the others are served.
KVTEST(redis_node_down) {
  Servers s;
  if (!servers(s)) return;
  std::string err;
  RedisConfig cfg = cluster_cfg(s.cluster, "nodedown");
  cfg.timeout_ms = 500;
  auto t = kvc::tier::make_redis_tier(cfg, &err);
  CHECK(t != nullptr);
  if (!t) return;
  auto raw = connect_all(s.cluster);
  std::vector<int> owner(60);
  for (int i = 0; i < 60; ++i) {
    CHECK(t->put(key(i), kFp, payload(i, 1500).data(), 1500));
    owner[i] = owner_of(raw, cfg.key_prefix + key(i).hex());
    CHECK(owner[i] >= 0);
  }
  const int down = owner[0];
  if (down < 0) return;
  const std::string node_dir = s.dir + "/node" + std::to_string(down + 1);
  raw[down]->cmd({"SHUTDOWN", "NOSAVE"});
  std::vector<uint8_t> out;
  int served = 0, lost = 0, on_down = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 60; ++i) {
    const uint64_t e0 = t->stats().errors;
    const bool hit = t->get(key(i), kFp, out);
    if (owner[i] == down) {
      ++on_down;
      lost += !hit && t->stats().errors == e0 + 1;
    } else {
      served += hit && out == payload(i, 1500) && t->stats().errors == e0;
    }
  }
  const double took = seconds_since(t0);
  std::fprintf(stderr,
               "node %d down: %d keys on it lost, %d of %d served, %.2f s; last error: %s\n", down,
               lost, served, 60 - on_down, took, t->last_error().c_str());
  CHECK(on_down > 0 && lost == on_down && served == 60 - on_down);
  CHECK(t->last_error().find("127.0.0.1:" + std::to_string(s.cluster[down])) != std::string::npos);
  CHECK(took < 10);
  // Back (empty: no persistence) with its slots: misses without errors, then served again.
  CHECK(run_shell("sh '" + node_dir + "/start.sh'") == 0);
  CHECK(wait_cluster_ok(s.cluster[down], 20));
  const uint64_t e1 = t->stats().errors;
  CHECK(!t->get(key(0), kFp, out) && t->stats().errors == e1);
  CHECK(t->put(key(0), kFp, payload(0, 1500).data(), 1500) && t->get(key(0), kFp, out) &&
        out == payload(0, 1500));
  for (int i = 0; i < 60; ++i) t->erase(key(i));
}

// contains_many (what a prefix lookup asks a Redis tier): the answers of
// contains() for present and absent keys, in one round trip to a standalone
// server and at most one per node of the cluster; a server that is not there
// gives misses and a counted error, no crash.
KVTEST(redis_contains_many_round_trips) {
  Servers s;
  if (!servers(s)) return;
  std::string err;
  for (int cluster = 0; cluster < 2; ++cluster) {
    const RedisConfig cfg =
        cluster ? cluster_cfg(s.cluster, "many") : standalone_cfg(s.standalone, "many");
    auto t = kvc::tier::make_redis_tier(cfg, &err);
    CHECK(t != nullptr);
    if (!t) return;
    std::vector<BlockKey> keys;
    for (int i = 0; i < 80; ++i) keys.push_back(key(i));
    for (int i = 0; i < 80; i += 4) t->erase(key(i));
    for (int i = 0; i < 80; ++i)
      if (i % 4 != 0) CHECK(t->put(key(i), kFp, payload(i, 100).data(), 100));
    redis::Redirects before, after;
    CHECK(redis::redirects_of(*t, &before));
    std::vector<char> found;
    t->contains_many(keys.data(), keys.size(), found);
    CHECK(redis::redirects_of(*t, &after));
    const uint64_t trips = after.round_trips - before.round_trips;
    CHECK(found.size() == 80);
    for (int i = 0; i < 80; ++i) CHECK((found[i] != 0) == (i % 4 != 0));
    if (cluster)
      CHECK(trips >= 1 && trips <= 3);
    else
      CHECK(trips == 1);
    for (int i = 0; i < 80; ++i) CHECK((found[i] != 0) == t->contains(keys[i]));
    t->contains_many(keys.data(), 0, found);
    CHECK(found.empty());
    for (int i = 0; i < 80; ++i) t->erase(key(i));
  }
  // Nothing listening: misses, an error with a reason.
  RedisConfig down = standalone_cfg(1, "many-down");
  down.timeout_ms = 200;
  auto t = kvc::tier::make_redis_tier(down, &err);
  if (t) {
    std::vector<BlockKey> keys = {key(1), key(2)};
    std::vector<char> found;
    t->contains_many(keys.data(), keys.size(), found);
    CHECK(found.size() == 2 && !found[0] && !found[1]);
    CHECK(t->stats().errors >= 1 && !t->last_error().empty());
  }
}

// ---------------------------------------------------------------------------
// Through pools and the public API (docs/tiers.md)

namespace {

std::string address_of(const Servers &s, bool cluster) {
  if (!cluster) return "127.0.0.1:" + std::to_string(s.standalone);
  std::string a;
  for (int p : s.cluster) {  // appended piece by piece: GCC 12 -O3 warns (-Wrestrict) on a
                             // temporary's concatenation
    if (!a.empty()) a += ',';
    a += "127.0.0.1:";
    a += std::to_string(p);
  }
  return a;
}

uint32_t add_redis(kvc_pool *p, const std::string &address, bool cluster,
                   uint32_t timeout_ms = 1000) {
  kvc_tier_config c;
  CHECK_OK(kvc_tier_config_init(&c, KVC_TIER_REDIS));
  c.address = address.c_str();
  c.flags = cluster ? KVC_TIER_REDIS_CLUSTER : 0u;
  c.timeout_ms = timeout_ms;
  uint32_t i = 99;
  CHECK_OK(kvc_pool_add_tier(p, &c, &i));
  return i;
}

// A process writes a prompt's blocks through its pool to Redis; another
// process, with a pool of its own, finds them, loads them and holds the same
// bytes. Another tenant (salt) finds nothing.
void share_prefix(bool cluster) {
  Servers s;
  if (!servers(s)) return;
  const std::string addr = address_of(s, cluster);
  // A model id of its own per run: the servers are shared by the tests.
  const std::string model = "share-" + std::to_string(getpid()) + (cluster ? "-cluster" : "");
  const auto t = tier_test::prompt(2000, 8 * tier_test::kBs + 1);  // 8 whole blocks
  const pid_t pid = fork();
  if (pid == 0) {  // the writer process
    int rc = 0;
    {
      tier_test::Pool p(40, model.c_str());
      add_redis(p, addr, cluster);
      tier_test::write_seq(p, 1, t);
      uint64_t q = 0;
      rc |= kvc_prefix_offload(p, t.data(), t.size(), nullptr, 0, &q) != KVC_OK || q != 8;
      rc |= kvc_pool_flush_tiers(p) != KVC_OK;
      const kvc_tier_stats st = tier_test::tier_stats(p, 0);
      rc |= st.demotions != 8 || st.errors != 0 || st.kind != KVC_TIER_REDIS;
    }
    _exit(rc | (g_kvtest_fail != 0));
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  tier_test::Pool p(40, model.c_str());
  add_redis(p, addr, cluster);
  const kvc_prefix_extra salt = tier_test::salt_of("another-tenant");
  CHECK(tier_test::lookup(p, t, &salt, 1).tier_tokens == 0);
  CHECK(tier_test::lookup(p, t).tier_tokens == 32);
  uint64_t loaded = 0;
  CHECK_OK(kvc_prefix_load(p, t.data(), t.size(), nullptr, 0, &loaded));
  CHECK(loaded == 32);
  CHECK_OK(kvc_prefix_attach(p, 2, t.data(), t.size(), nullptr, 0, 0, nullptr));
  CHECK(tier_test::seq_matches(p, 2, t, 32));
  const kvc_tier_stats st = tier_test::tier_stats(p, 0);
  CHECK(st.promotions == 8);
  CHECK(st.hits == 8);
  CHECK(st.errors == 0);
  CHECK(tier_test::invariants(p));
}

}  // namespace

KVTEST(redis_pool_two_processes_share_prefix) {
  share_prefix(false);
}
KVTEST(redis_pool_cluster_share_prefix) {
  share_prefix(true);
}

// Redis stopped during a run and started again: demotions and lookups turn
// into counted errors and misses with a readable reason, the pool keeps its
// blocks and works on; once the server is back the same pool stores and
// loads again.
KVTEST(redis_pool_server_down_and_back) {
  Servers s;
  if (!servers(s)) return;
  const char *script = std::getenv("KVC_REDIS_FIXTURE");
  CHECK(script != nullptr);
  if (!script) return;
  const std::string name = "pool-down-" + std::to_string(getpid());
  FILE *f =
      popen((std::string("bash '") + script + "' server '" + s.dir + "' " + name).c_str(), "r");
  int port = 0;
  if (!f || std::fscanf(f, "%d", &port) != 1) port = 0;
  if (f) pclose(f);
  CHECK(port > 0);
  if (port <= 0) return;
  const std::string sdir = s.dir + "/" + name;
  const auto t = tier_test::prompt(3000, 13);  // 3 whole blocks
  tier_test::Pool p(32);
  add_redis(p, "127.0.0.1:" + std::to_string(port), false, 300);
  tier_test::write_seq(p, 1, t);
  {
    Raw raw(port);
    raw.cmd({"SHUTDOWN", "NOSAVE"});
  }
  CHECK_OK(kvc_prefix_offload(p, t.data(), t.size(), nullptr, 0, nullptr));
  CHECK_OK(kvc_pool_flush_tiers(p));
  kvc_tier_stats st = tier_test::tier_stats(p, 0);
  CHECK(st.errors >= 3);
  CHECK(st.demotions == 0);
  CHECK(std::strstr(st.last_error, std::to_string(port).c_str()) != nullptr);
  std::fprintf(stderr, "while down: %s\n", st.last_error);
  CHECK(tier_test::lookup(p, t).hit_tokens == 12);  // the pool's own blocks
  CHECK(tier_test::seq_matches(p, 1, t, 13));
  CHECK_OK(kvc_seq_free(p, 1));
  tier_test::free_range(p, 100, tier_test::squeeze(p, 100));  // reclaimed: the demotions fail too
  CHECK_OK(kvc_pool_flush_tiers(p));
  CHECK(tier_test::lookup(p, t).tier_tokens == 0);
  uint64_t loaded = 9;
  CHECK_OK(kvc_prefix_load(p, t.data(), t.size(), nullptr, 0, &loaded));
  CHECK(loaded == 0);
  CHECK(tier_test::invariants(p));
  // Back (empty): the same pool stores and loads again.
  CHECK(run_shell("sh '" + sdir + "/start.sh'") == 0);
  tier_test::write_seq(p, 2, t);
  CHECK_OK(kvc_prefix_offload(p, t.data(), t.size(), nullptr, 0, nullptr));
  CHECK_OK(kvc_pool_flush_tiers(p));
  st = tier_test::tier_stats(p, 0);
  CHECK(st.demotions == 3);
  CHECK_OK(kvc_seq_free(p, 2));
  tier_test::free_range(p, 200, tier_test::squeeze(p, 200));
  CHECK_OK(kvc_pool_flush_tiers(p));
  CHECK(tier_test::lookup(p, t).tier_tokens == 12);
  CHECK_OK(kvc_prefix_load(p, t.data(), t.size(), nullptr, 0, &loaded));
  CHECK(loaded == 12);
  CHECK_OK(kvc_prefix_attach(p, 3, t.data(), t.size(), nullptr, 0, 0, nullptr));
  CHECK(tier_test::seq_matches(p, 3, t, 12));
  CHECK(tier_test::invariants(p));
  {
    Raw raw(port);
    raw.cmd({"SHUTDOWN", "NOSAVE"});
  }
}

#endif  // KVC_TEST_HAVE_HIREDIS

int main(int argc, char **argv) {
#ifndef KVC_TEST_HAVE_HIREDIS
  if (argc > 1 && !kvtest_registry().count(argv[1])) {  // a server test, not compiled
    skip("built without hiredis");
    return 77;
  }
#endif
  const int rc = kvtest_main(argc, argv);
  if (rc == 0 && g_skip) return 77;  // ctest: SKIP_RETURN_CODE
  return rc;
}
