// The Redis tier (docs/tiers.md, "Redis"): one record per block, stored with
// one SET under key_prefix + the key's hex digits, on one server or a Redis
// Cluster. Record: "KVCR", u32 version 1, u32 fingerprint bytes F, u32 0, u64
// payload bytes P, u64 XXH3-64 of the F + P bytes that follow, the
// fingerprint, the payload (little-endian), as the disk tier's record.
//
// The cluster client (hiredis has none) follows the Redis Cluster
// specification's client side: key slots (redis_cluster.cpp), a slot map read
// with CLUSTER SLOTS, one connection per node opened when first needed, MOVED
// (the map is read again and the command sent to the named node) and ASK
// (ASKING then the command at the named node, the map unchanged), at most
// kMaxRedirects redirects per command.
#include "tier/redis_cluster.h"
#include "tier/checksum.h"
#include "tier/tier.h"

#ifdef KVC_HAVE_HIREDIS

#include <hiredis/hiredis.h>
#include <sys/time.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <array>
#include <chrono>
#include <cstring>
#include <string_view>
#include <vector>

namespace kvc::tier {

namespace {

constexpr char kMagic[4] = {'K', 'V', 'C', 'R'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeader = 32;
constexpr size_t kMaxRecord = size_t{512} << 20;  // Redis's default proto-max-bulk-len
constexpr int kMaxRedirects = 5;
constexpr uint16_t kNoNode = 0xffff;
// A slot map that failed us (a node unreachable) is read again at most this often.
constexpr auto kRefreshInterval = std::chrono::milliseconds(500);

struct ReplyFree {
  void operator()(redisReply *r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

std::string addr_of(const std::string &host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381": the node's host and
// port ("" host when the server does not know its endpoint: the sender's).
bool parse_redirect(std::string_view msg, std::string &host, int &port) {
  const size_t sp = msg.rfind(' '), colon = msg.rfind(':');
  if (sp == std::string_view::npos || colon == std::string_view::npos || colon < sp) return false;
  host.assign(msg.substr(sp + 1, colon - sp - 1));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  port = 0;
  for (size_t i = colon + 1; i < msg.size(); ++i) {
    if (msg[i] < '0' || msg[i] > '9' || port > 65535) return false;
    port = port * 10 + (msg[i] - '0');
  }
  return port > 0 && port <= 65535 && colon + 1 < msg.size();
}

// A client of one server or of a cluster. Not thread-safe: the tier serializes it.
class Client {
 public:
  explicit Client(const RedisConfig &cfg) : cfg_(cfg) {
    tv_.tv_sec = cfg.timeout_ms / 1000;
    tv_.tv_usec = static_cast<suseconds_t>(cfg.timeout_ms % 1000) * 1000;
    for (const auto &[h, p] : cfg.nodes) node_index(h, p);
    slots_.fill(cfg.cluster ? kNoNode : 0);
  }
  ~Client() {
    for (Node &n : nodes_)
      if (n.c) redisFree(n.c);
  }
  Client(const Client &) = delete;
  Client &operator=(const Client &) = delete;

  // Runs `argv` (argv[1] is the key) where the key lives. Null with `why` set
  // when no answer came (node down, timeout, too many redirects); a Redis
  // error reply is returned as it is.
  Reply run(const std::vector<std::string_view> &argv, std::string &why) {
    std::vector<const char *> av(argv.size());
    std::vector<size_t> al(argv.size());
    for (size_t i = 0; i < argv.size(); ++i) av[i] = argv[i].data(), al[i] = argv[i].size();

    uint16_t slot = 0, node = 0;
    if (cfg_.cluster) {
      slot = redis::key_slot(argv[1]);
      if (slots_[slot] == kNoNode ||
          (stale_ && std::chrono::steady_clock::now() - last_refresh_ >= kRefreshInterval))
        refresh(why);
      node = slots_[slot];
      if (node == kNoNode) {
        if (why.empty()) why = "redis cluster: no node serves slot " + std::to_string(slot);
        return nullptr;
      }
    }
    bool asking = false;
    for (int redirects = 0;; ++redirects) {
      Reply r = exec(node, asking, av, al, why);
      if (!r) {
        stale_ = cfg_.cluster;  // the node may be gone: read the map again on a later call
        return nullptr;
      }
      if (!cfg_.cluster || r->type != REDIS_REPLY_ERROR) return r;
      const std::string_view msg(r->str, r->len);
      const bool moved = msg.starts_with("MOVED "), ask = msg.starts_with("ASK ");
      if (!moved && !ask) return r;
      std::string host;
      int port;
      if (!parse_redirect(msg, host, port)) {
        why = "redis " + nodes_[node].addr + ": unreadable redirect \"" + std::string(msg) + "\"";
        return nullptr;
      }
      if (redirects >= kMaxRedirects) {
        why = "redis cluster: more than " + std::to_string(kMaxRedirects) + " redirects for slot " +
              std::to_string(slot) + " (last: " + std::string(msg) + ")";
        return nullptr;
      }
      if (host.empty()) host = nodes_[node].host;
      const uint16_t to = node_index(host, port);
      if (moved) {  // the slot has a new owner: read the whole map again, then ask the owner
        ++red_.moved;
        std::string ignored;
        refresh(ignored);
        slots_[slot] = to;  // the redirect is the authority for this slot
        asking = false;
      } else {  // ASK: this command only, the map stays
        ++red_.ask;
        asking = true;
      }
      node = to;
    }
  }

  // run() of several commands (argv[1] of each is its key): the commands of
  // each node go out in one pipeline, one round trip per node. out[i] is the
  // reply of cmds[i], or null when none came (why: the last failure). A
  // command answered with a redirect or left without an answer by a
  // connection that was found closed runs again alone through run().
  void run_many(const std::vector<std::vector<std::string_view>> &cmds, std::vector<Reply> &out,
                std::string &why) {
    out.clear();
    out.resize(cmds.size());
    std::vector<uint16_t> node_of(cmds.size(), 0);
    std::vector<char> alone(cmds.size(), 0);  // to be run through run()
    std::vector<char> skip(cmds.size(), 0);   // no node serves its slot: no answer
    if (cfg_.cluster) {
      // The slot map read at most once per call (a cluster that does not
      // answer costs one round of connection attempts, not one per key).
      bool refreshed = false;
      for (size_t i = 0; i < cmds.size(); ++i) {
        const uint16_t slot = redis::key_slot(cmds[i][1]);
        if (!refreshed &&
            (slots_[slot] == kNoNode ||
             (stale_ && std::chrono::steady_clock::now() - last_refresh_ >= kRefreshInterval))) {
          refresh(why);
          refreshed = true;
        }
        node_of[i] = slots_[slot];
        if (node_of[i] == kNoNode) {
          skip[i] = 1;
          if (why.empty()) why = "redis cluster: no node serves slot " + std::to_string(slot);
        }
      }
    }
    std::vector<char> done_node(nodes_.size(), 0);
    for (size_t first = 0; first < cmds.size(); ++first) {
      if (skip[first] || done_node[node_of[first]]) continue;
      const uint16_t node = node_of[first];
      done_node[node] = 1;
      std::vector<size_t> mine;
      for (size_t i = first; i < cmds.size(); ++i)
        if (!skip[i] && node_of[i] == node) mine.push_back(i);
      pipeline(node, cmds, mine, out, alone, why);
    }
    // Redirected commands, and those a restarted server left unanswered, alone;
    // after one of a node's fails, the rest of that node's stay unanswered.
    std::vector<char> failed(nodes_.size() + 1, 0);
    for (size_t i = 0; i < cmds.size(); ++i) {
      if (skip[i] || (!out[i] && !alone[i])) continue;  // no node, or the node failed
      if (out[i] && !(cfg_.cluster && out[i]->type == REDIS_REPLY_ERROR &&
                      (std::string_view(out[i]->str, out[i]->len).starts_with("MOVED ") ||
                       std::string_view(out[i]->str, out[i]->len).starts_with("ASK "))))
        continue;
      if (node_of[i] < failed.size() && failed[node_of[i]]) {
        out[i].reset();
        continue;
      }
      out[i] = run(cmds[i], why);
      if (!out[i] && node_of[i] < failed.size()) failed[node_of[i]] = 1;
    }
  }

  const redis::Redirects &redirects() const { return red_; }

 private:
  struct Node {
    std::string host;
    int port;
    std::string addr;  // "host:port" for messages
    redisContext *c = nullptr;
    bool ever_connected = false;
  };

  uint16_t node_index(const std::string &host, int port) {
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i].port == port && nodes_[i].host == host) return static_cast<uint16_t>(i);
    nodes_.push_back(Node{host, port, addr_of(host, port)});
    return static_cast<uint16_t>(nodes_.size() - 1);
  }

  void drop(Node &n) {
    if (n.c) redisFree(n.c);
    n.c = nullptr;
  }

  // The commands `idx` of cmds on node i, pipelined: one round trip. A
  // connection found closed (a restarted server) marks the commands without
  // an answer to run again alone; any other failure drops the connection and
  // leaves them without one.
  void pipeline(uint16_t i, const std::vector<std::vector<std::string_view>> &cmds,
                const std::vector<size_t> &idx, std::vector<Reply> &out, std::vector<char> &alone,
                std::string &why) {
    Node &n = nodes_[i];
    const bool reused = n.c != nullptr;
    redisContext *c = connect(n, why);
    if (!c) {
      stale_ = cfg_.cluster;  // the node may be gone: read the map again on a later call
      return;
    }
    ++red_.round_trips;
    bool ok = true;
    for (size_t k : idx) {
      std::vector<const char *> av(cmds[k].size());
      std::vector<size_t> al(cmds[k].size());
      for (size_t a = 0; a < cmds[k].size(); ++a)
        av[a] = cmds[k][a].data(), al[a] = cmds[k][a].size();
      if (redisAppendCommandArgv(c, static_cast<int>(av.size()), av.data(), al.data()) !=
          REDIS_OK) {
        ok = false;
        break;
      }
    }
    size_t got = 0;
    for (; ok && got < idx.size(); ++got) {
      void *raw = nullptr;
      if (redisGetReply(c, &raw) != REDIS_OK) {
        ok = false;
        break;
      }
      out[idx[got]] = Reply(static_cast<redisReply *>(raw));
    }
    if (ok) return;
    const bool closed = c->err == REDIS_ERR_EOF;
    const bool timeout = c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
    why = "redis " + n.addr + ": " +
          (timeout        ? "no answer within " + std::to_string(cfg_.timeout_ms) + " ms (timeout)"
           : c->errstr[0] ? c->errstr
                          : "no reply");
    drop(n);
    if (cfg_.cluster) stale_ = true;
    if (closed && reused)  // a restarted server: the rest once more, alone
      for (size_t k = got; k < idx.size(); ++k) alone[idx[k]] = 1;
  }

  redisContext *connect(Node &n, std::string &why) {
    if (n.c) return n.c;
    redisContext *c = redisConnectWithTimeout(n.host.c_str(), n.port, tv_);
    if (!c || c->err) {
      why = "redis " + n.addr + ": " + (c ? c->errstr : "cannot allocate a connection");
      if (c) redisFree(c);
      return nullptr;
    }
    if (redisSetTimeout(c, tv_) != REDIS_OK) {
      why = "redis " + n.addr + ": cannot set the timeout";
      redisFree(c);
      return nullptr;
    }
    redisEnableKeepAlive(c);
    if (n.ever_connected) ++red_.reconnects;
    n.ever_connected = true;
    n.c = c;
    return c;
  }

  // One command (after ASKING when `asking`) on node `i`. A connection that
  // was open before and is found closed (a restarted server) is opened again
  // and the command sent once more; any other failure drops the connection.
  Reply exec(uint16_t i, bool asking, const std::vector<const char *> &av,
             const std::vector<size_t> &al, std::string &why) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      Node &n = nodes_[i];
      const bool reused = n.c != nullptr;
      redisContext *c = connect(n, why);
      if (!c) return nullptr;
      ++red_.round_trips;
      void *raw = nullptr;
      bool ok;
      if (asking) {
        ok = redisAppendCommand(c, "ASKING") == REDIS_OK &&
             redisAppendCommandArgv(c, static_cast<int>(av.size()),
                                    const_cast<const char **>(av.data()), al.data()) == REDIS_OK &&
             redisGetReply(c, &raw) == REDIS_OK;
        if (ok) {
          Reply asked(static_cast<redisReply *>(raw));
          raw = nullptr;
          ok = redisGetReply(c, &raw) == REDIS_OK;
          if (ok && asked->type == REDIS_REPLY_ERROR) {  // ASKING refused: not a cluster node
            freeReplyObject(raw);
            why = "redis " + n.addr + ": ASKING: " + std::string(asked->str, asked->len);
            return nullptr;
          }
        }
      } else {
        raw = redisCommandArgv(c, static_cast<int>(av.size()), const_cast<const char **>(av.data()),
                               al.data());
        ok = raw != nullptr;
      }
      if (ok) return Reply(static_cast<redisReply *>(raw));
      const bool closed = c->err == REDIS_ERR_EOF;
      const bool timeout = c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
      why = "redis " + n.addr + ": " +
            (timeout ? "no answer within " + std::to_string(cfg_.timeout_ms) + " ms (timeout)"
             : c->errstr[0] ? c->errstr
                            : "no reply");
      drop(n);
      if (!(closed && reused)) return nullptr;
    }
    return nullptr;
  }

  // Reads the slot map with CLUSTER SLOTS from the first node that answers
  // (the known nodes, seeds first). False (the map unchanged) when none does.
  bool refresh(std::string &why) {
    last_refresh_ = std::chrono::steady_clock::now();
    const std::vector<const char *> av = {"CLUSTER", "SLOTS"};
    const std::vector<size_t> al = {7, 5};
    for (size_t i = 0; i < nodes_.size(); ++i) {
      std::string w;
      Reply r = exec(static_cast<uint16_t>(i), false, av, al, w);
      if (!r) {
        why = w;
        continue;
      }
      std::array<uint16_t, redis::kSlots> map;
      map.fill(kNoNode);
      if (!parse_slots(r.get(), static_cast<uint16_t>(i), map)) {
        why = "redis " + nodes_[i].addr + ": CLUSTER SLOTS: " +
              (r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : "unexpected reply");
        continue;
      }
      slots_ = map;
      stale_ = false;
      ++red_.map_refreshes;
      return true;
    }
    return false;
  }

  // [[start, end, [host, port, id...], replicas...], ...] into `map`.
  bool parse_slots(const redisReply *r, uint16_t from, std::array<uint16_t, redis::kSlots> &map) {
    if (r->type != REDIS_REPLY_ARRAY) return false;
    for (size_t i = 0; i < r->elements; ++i) {
      const redisReply *e = r->element[i];
      if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
          e->element[0]->type != REDIS_REPLY_INTEGER ||
          e->element[1]->type != REDIS_REPLY_INTEGER || e->element[2]->type != REDIS_REPLY_ARRAY ||
          e->element[2]->elements < 2 || e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
          e->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
        return false;
      const long long lo = e->element[0]->integer, hi = e->element[1]->integer;
      const redisReply *m = e->element[2];
      std::string host(m->element[0]->str, m->element[0]->len);
      const long long port = m->element[1]->integer;
      if (lo < 0 || hi < lo || hi >= redis::kSlots || port <= 0 || port > 65535) return false;
      if (host.empty() || host == "?")
        host = nodes_[from].host;  // endpoint unknown: the answering node's host
      const uint16_t n = node_index(host, static_cast<int>(port));
      for (long long s = lo; s <= hi; ++s) map[static_cast<size_t>(s)] = n;
    }
    return true;
  }

  const RedisConfig cfg_;
  timeval tv_{};
  std::vector<Node> nodes_;
  std::array<uint16_t, redis::kSlots> slots_{};
  bool stale_ = false;
  std::chrono::steady_clock::time_point last_refresh_{};
  redis::Redirects red_;
};

class RedisTier final : public Tier {
 public:
  explicit RedisTier(const RedisConfig &cfg)
      : prefix_(cfg.key_prefix), ttl_(cfg.ttl_seconds), client_(cfg) {}
  const char *name() const override { return "redis"; }

  bool put(const BlockKey &key, const std::vector<uint8_t> &fp, const uint8_t *payload,
           size_t n) override {
    // Redis refuses a value over its proto-max-bulk-len (512 MiB by default);
    // also keeps the sum below from wrapping.
    if (n > kMaxRecord || kHeader + fp.size() > kMaxRecord - n)
      return count_error("a record of " + std::to_string(n) + " + " +
                         std::to_string(kHeader + fp.size()) +
                         " bytes is larger than a Redis value (512 MiB)");
    std::string rec;
    try {
      rec.resize(kHeader + fp.size() + n);
    } catch (const std::bad_alloc &) {
      return count_error("out of memory");
    }
    auto *h = reinterpret_cast<uint8_t *>(rec.data());
    std::memcpy(h, kMagic, 4);
    const uint32_t v = kVersion, f = static_cast<uint32_t>(fp.size()), zero = 0;
    const uint64_t p = n;
    std::memcpy(h + 4, &v, 4);
    std::memcpy(h + 8, &f, 4);
    std::memcpy(h + 12, &zero, 4);
    std::memcpy(h + 16, &p, 8);
    if (!fp.empty()) std::memcpy(h + kHeader, fp.data(), fp.size());
    if (n) std::memcpy(h + kHeader + fp.size(), payload, n);
    const uint64_t sum = xxh3(h + kHeader, fp.size() + n);
    std::memcpy(h + 24, &sum, 8);

    const std::string k = redis_key(key), ttl = std::to_string(ttl_);
    std::vector<std::string_view> argv = {"SET", k, rec};
    if (ttl_ > 0) argv.insert(argv.end(), {"EX", ttl});
    std::string why;
    Reply r = command(argv, why);
    if (!r) return count_error(why);
    if (r->type != REDIS_REPLY_STATUS || std::string_view(r->str, r->len) != "OK")
      return count_error("redis SET " + k + ": " + reply_text(r.get()));
    std::unique_lock lk(st_mu_);
    ++st_.puts;
    ++st_.entries;
    st_.bytes += rec.size();
    return true;
  }

  bool get(const BlockKey &key, const std::vector<uint8_t> &fp,
           std::vector<uint8_t> &out) override {
    const std::string k = redis_key(key);
    std::string why;
    Reply r = command({"GET", k}, why);
    if (!r || (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_NIL)) {
      count_error(r ? "redis GET " + k + ": " + reply_text(r.get()) : why);
      count(&Stats::misses);
      return false;
    }
    if (r->type == REDIS_REPLY_NIL) return count(&Stats::misses);
    const auto *rec = reinterpret_cast<const uint8_t *>(r->str);
    const size_t len = r->len;
    const std::string bad = check(rec, len);
    if (!bad.empty()) {  // refused and deleted, never served
      Reply d = command({"DEL", k}, why);
      std::unique_lock lk(st_mu_);
      if (d && d->type == REDIS_REPLY_INTEGER && d->integer > 0) forget(len);
      ++st_.misses;
      ++st_.errors;
      err_ = "redis record " + k + " " + bad + ": deleted";
      return false;
    }
    uint32_t f;
    std::memcpy(&f, rec + 8, 4);
    if (f != fp.size() || (f && std::memcmp(rec + kHeader, fp.data(), f) != 0))
      return count(&Stats::misses);  // another pool's record: a miss, left in place
    try {
      out.assign(rec + kHeader + f, rec + len);
    } catch (const std::bad_alloc &) {
      count_error("out of memory");
      return count(&Stats::misses);
    }
    count(&Stats::hits);
    return true;
  }

  bool contains(const BlockKey &key) override {
    const std::string k = redis_key(key);
    std::string why;
    Reply r = command({"EXISTS", k}, why);
    if (!r || r->type != REDIS_REPLY_INTEGER)
      return count_error(r ? "redis EXISTS " + k + ": " + reply_text(r.get()) : why);
    return r->integer > 0;
  }

  bool batched_contains() const override { return true; }
  void contains_many(const BlockKey *keys, size_t n, std::vector<char> &found) override {
    found.assign(n, 0);
    if (n == 0) return;
    std::vector<std::string> ks(n);
    std::vector<std::vector<std::string_view>> cmds(n);
    for (size_t i = 0; i < n; ++i) {
      ks[i] = redis_key(keys[i]);
      cmds[i] = {"EXISTS", ks[i]};
    }
    std::vector<Reply> replies;
    std::string why;
    {
      std::unique_lock lk(io_mu_);
      client_.run_many(cmds, replies, why);
    }
    std::string bad;  // one error counted per call, the first reason kept
    for (size_t i = 0; i < n; ++i) {
      const Reply &r = replies[i];
      if (!r || r->type != REDIS_REPLY_INTEGER) {
        if (bad.empty()) bad = r ? "redis EXISTS " + ks[i] + ": " + reply_text(r.get()) : why;
      } else {
        found[i] = r->integer > 0 ? 1 : 0;
      }
    }
    if (!bad.empty()) count_error(bad);
  }

  bool erase(const BlockKey &key) override {
    const std::string k = redis_key(key);
    std::string why;
    Reply r = command({"DEL", k}, why);
    if (!r || r->type != REDIS_REPLY_INTEGER)
      return count_error(r ? "redis DEL " + k + ": " + reply_text(r.get()) : why);
    if (r->integer <= 0) return false;
    std::unique_lock lk(st_mu_);
    if (st_.entries) --st_.entries;  // the size of what was deleted is unknown: the average
    st_.bytes -= st_.entries ? st_.bytes / (st_.entries + 1) : st_.bytes;
    return true;
  }

  Stats stats() const override {
    std::unique_lock lk(st_mu_);
    return st_;
  }
  std::string last_error() const override {
    std::unique_lock lk(st_mu_);
    return err_;
  }
  redis::Redirects redirects() const {
    std::unique_lock lk(io_mu_);
    return client_.redirects();
  }

 private:
  Reply command(const std::vector<std::string_view> &argv, std::string &why) {
    std::unique_lock lk(io_mu_);
    return client_.run(argv, why);
  }
  std::string redis_key(const BlockKey &k) const { return prefix_ + k.hex(); }
  static std::string reply_text(const redisReply *r) {
    if (r->type == REDIS_REPLY_ERROR || r->type == REDIS_REPLY_STATUS)
      return std::string(r->str, r->len);
    return "unexpected reply type " + std::to_string(r->type);
  }
  bool count_error(const std::string &why) {
    std::unique_lock lk(st_mu_);
    ++st_.errors;
    err_ = why;
    return false;
  }
  bool count(uint64_t Stats::*field) {
    std::unique_lock lk(st_mu_);
    ++(st_.*field);
    return false;
  }
  void forget(uint64_t bytes) {  // a record this client may have written is gone (st_mu_ held)
    if (st_.entries) --st_.entries;
    st_.bytes -= std::min(st_.bytes, bytes);
  }
  // "" when the record is whole and of this format (the fingerprint is checked apart).
  static std::string check(const uint8_t *rec, size_t len) {
    if (len < kHeader || std::memcmp(rec, kMagic, 4) != 0) return "is not a block record";
    uint32_t v, f;
    uint64_t p, sum;
    std::memcpy(&v, rec + 4, 4);
    std::memcpy(&f, rec + 8, 4);
    std::memcpy(&p, rec + 16, 8);
    std::memcpy(&sum, rec + 24, 8);
    if (v != kVersion) return "has format version " + std::to_string(v);
    if (p > len || kHeader + static_cast<uint64_t>(f) + p != len)
      return "has the wrong size (truncated?)";
    if (xxh3(rec + kHeader, len - kHeader) != sum) return "fails its checksum";
    return "";
  }

  const std::string prefix_;
  const uint64_t ttl_;
  mutable std::mutex io_mu_;  // the client: its connections and slot map
  Client client_;
  mutable std::mutex st_mu_;  // the counters and the last error
  Stats st_;
  std::string err_;
};

}  // namespace

std::unique_ptr<Tier> make_redis_tier(const RedisConfig &cfg, std::string *error) {
  auto fail = [&](const std::string &why) -> std::unique_ptr<Tier> {
    if (error) *error = why;
    return nullptr;
  };
  if (cfg.nodes.empty()) return fail("redis tier: no server given");
  if (!cfg.cluster && cfg.nodes.size() != 1)
    return fail("redis tier: one server (or cluster = true for seed nodes), " +
                std::to_string(cfg.nodes.size()) + " given");
  for (const auto &[h, p] : cfg.nodes)
    if (h.empty() || p <= 0 || p > 65535)
      return fail("redis tier: invalid server address " + addr_of(h, p));
  if (cfg.timeout_ms == 0)
    return fail("redis tier: timeout_ms must be positive (0 would wait forever)");
  return std::make_unique<RedisTier>(cfg);
}

bool redis::redirects_of(const Tier &t, Redirects *out) {
  const auto *r = dynamic_cast<const RedisTier *>(&t);
  if (!r) return false;
  *out = r->redirects();
  return true;
}

}  // namespace kvc::tier

#else  // built without hiredis

namespace kvc::tier {

std::unique_ptr<Tier> make_redis_tier(const RedisConfig &, std::string *error) {
  if (error) *error = "built without hiredis";
  return nullptr;
}

bool redis::redirects_of(const Tier &, Redirects *) {
  return false;
}

}  // namespace kvc::tier

#endif
