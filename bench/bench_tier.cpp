// Google Benchmark programs for the offload tiers (issue 9, src/tier), each
// against a baseline of the same bytes in the same run (bytes/s of both):
//  BM_HostPut/<bytes>, BM_HostGet/<bytes>   host tier put / get of one block
//      payload (64 KiB, 1 MiB), over 16 keys in turn
//                                        vs BM_Memcpy/<bytes> (into 16 buffers),
//                                           BM_MemcpyFrom/<bytes> (from 16 buffers)
//  BM_DiskPut/<bytes>, BM_DiskGet/<bytes>   disk tier (no fsync: the page
//      cache) record write / read        vs BM_FileWrite/<bytes>,
//      BM_FileRead/<bytes>: fopen + fwrite + fclose, fopen + fread + fclose of
//      a plain file of the same bytes in the same temporary folder
//  BM_RedisGet/<bytes>, BM_RedisPut/<bytes> the Redis tier on loopback (64 KiB)
//      against a redis-server the program starts on a free port (skipped when
//      redis-server is not installed); bench/redis_baseline.sh gives
//      redis-benchmark's GET figure of the same value size to compare.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tier/tier.h"

extern char **environ;

namespace {

using kvc::BlockKey;

const std::vector<uint8_t> kFp = {1, 2, 3, 4, 5, 6, 7, 8};

BlockKey key(int i) {
  BlockKey k;
  for (size_t j = 0; j < 32; ++j) k.b[j] = static_cast<uint8_t>(i * 37 + j);
  return k;
}

std::vector<uint8_t> bytes(size_t n) {
  std::vector<uint8_t> p(n);
  for (size_t j = 0; j < n; ++j) p[j] = static_cast<uint8_t>(j * 7 + (j >> 10));
  return p;
}

void set_bytes(benchmark::State &state, size_t n) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}

// A temporary folder for the disk cases, removed at exit.
const std::string &temp_dir() {
  static const std::string dir = [] {
    const char *base = std::getenv("TMPDIR");
    std::string t = std::string(base && *base ? base : "/tmp") + "/kvc_bench_tier_XXXXXX";
    if (!mkdtemp(t.data())) {
      std::perror("mkdtemp");
      std::abort();
    }
    return t;
  }();
  return dir;
}

// ---- host tier vs memcpy ----

// Page-aligned buffers (the baselines' memcpy then never suffers 4K aliasing
// between source and destination, which would flatter the tier).
struct Pages {
  uint8_t *p;
  explicit Pages(size_t n) : p(static_cast<uint8_t *>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {
    std::memset(p, 1, n);
  }
  ~Pages() { std::free(p); }
  Pages(const Pages &) = delete;
  Pages &operator=(const Pages &) = delete;
};
constexpr int kKeys = 16;  // the put and get cases cycle over 16 blocks: the same working set as their baselines

// Baseline of put: one source copied into 16 destinations in turn.
void BM_Memcpy(benchmark::State &state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto src = bytes(n);
  std::vector<std::unique_ptr<Pages>> dst;
  for (int i = 0; i < kKeys; ++i) dst.push_back(std::make_unique<Pages>(n));
  int i = 0;
  for (auto _ : state) {
    std::memcpy(dst[i++ % kKeys]->p, src.data(), n);
    benchmark::ClobberMemory();
  }
  set_bytes(state, n);
}
BENCHMARK(BM_Memcpy)->Arg(64 << 10)->Arg(1 << 20);

// Baseline of get: 16 sources in turn copied into one destination.
void BM_MemcpyFrom(benchmark::State &state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<std::unique_ptr<Pages>> src;
  for (int i = 0; i < kKeys; ++i) src.push_back(std::make_unique<Pages>(n));
  Pages dst(n);
  int i = 0;
  for (auto _ : state) {
    std::memcpy(dst.p, src[i++ % kKeys]->p, n);
    benchmark::ClobberMemory();
  }
  set_bytes(state, n);
}
BENCHMARK(BM_MemcpyFrom)->Arg(64 << 10)->Arg(1 << 20);

void BM_HostPut(benchmark::State &state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto src = bytes(n);
  auto t = kvc::tier::make_host_tier(64ull << 20);
  int i = 0;
  for (auto _ : state)
    if (!t->put(key(i++ % kKeys), kFp, src.data(), n)) state.SkipWithError("host put failed");
  set_bytes(state, n);
}
BENCHMARK(BM_HostPut)->Arg(64 << 10)->Arg(1 << 20);

void BM_HostGet(benchmark::State &state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto src = bytes(n);
  auto t = kvc::tier::make_host_tier(64ull << 20);
  for (int k = 0; k < kKeys; ++k) t->put(key(k), kFp, src.data(), n);
  std::vector<uint8_t> out(n);
  int i = 0;
  for (auto _ : state) {
    if (!t->get(key(i++ % kKeys), kFp, out)) state.SkipWithError("host get missed");
    benchmark::DoNotOptimize(out.data());
  }
  set_bytes(state, n);
}
BENCHMARK(BM_HostGet)->Arg(64 << 10)->Arg(1 << 20);

// ---- disk tier vs a plain file ----

void BM_FileWrite(benchmark::State &state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto src = bytes(n);
  const std::string path = temp_dir() + "/plain.bin";
  for (auto _ : state) {
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(src.data(), 1, n, f) != n) state.SkipWithError("fwrite failed");
    if (f) std::fclose(f);
  }
  std::remove(path.c_str());
  set_bytes(state, n);
}
BENCHMARK(BM_FileWrite)->Arg(64 << 10)->Arg(1 << 20)->UseRealTime();

void BM_FileRead(benchmark::State &state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto src = bytes(n);
  const std::string path = temp_dir() + "/plain.bin";
  FILE *w = std::fopen(path.c_str(), "wb");
  if (!w) return state.SkipWithError("cannot create the file");
  std::fwrite(src.data(), 1, n, w);
  std::fclose(w);
  std::vector<uint8_t> out(n);
  for (auto _ : state) {
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f || std::fread(out.data(), 1, n, f) != n) state.SkipWithError("fread failed");
    if (f) std::fclose(f);
    benchmark::DoNotOptimize(out.data());
  }
  std::remove(path.c_str());
  set_bytes(state, n);
}
BENCHMARK(BM_FileRead)->Arg(64 << 10)->Arg(1 << 20)->UseRealTime();

void BM_DiskPut(benchmark::State &state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto src = bytes(n);
  std::string err;
  auto t = kvc::tier::make_disk_tier(temp_dir() + "/disk", 1ull << 30, false, &err);
  if (!t) return state.SkipWithError(err.c_str());
  int i = 0;
  for (auto _ : state)
    if (!t->put(key(i++ % 16), kFp, src.data(), n)) state.SkipWithError("disk put failed");
  for (int k = 0; k < 16; ++k) t->erase(key(k));
  set_bytes(state, n);
}
BENCHMARK(BM_DiskPut)->Arg(64 << 10)->Arg(1 << 20)->UseRealTime();

void BM_DiskGet(benchmark::State &state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto src = bytes(n);
  std::string err;
  auto t = kvc::tier::make_disk_tier(temp_dir() + "/disk", 1ull << 30, false, &err);
  if (!t) return state.SkipWithError(err.c_str());
  t->put(key(1), kFp, src.data(), n);
  std::vector<uint8_t> out(n);
  for (auto _ : state) {
    if (!t->get(key(1), kFp, out)) state.SkipWithError("disk get missed");
    benchmark::DoNotOptimize(out.data());
  }
  t->erase(key(1));
  set_bytes(state, n);
}
BENCHMARK(BM_DiskGet)->Arg(64 << 10)->Arg(1 << 20)->UseRealTime();

// ---- Redis on loopback ----

// A redis-server of this program on a free loopback port (0: none), stopped at exit.
struct RedisServer {
  pid_t pid = 0;
  int port = 0;
  RedisServer() {
    int s = socket(AF_INET, SOCK_STREAM, 0);  // a free port: bind to 0, read it, close
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (s < 0 || bind(s, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 ||
        getsockname(s, reinterpret_cast<sockaddr *>(&a), &len) != 0) {
      if (s >= 0) close(s);
      return;
    }
    const int p = ntohs(a.sin_port);
    close(s);
    const std::string ps = std::to_string(p), dir = temp_dir(), log = dir + "/redis.log";
    const char *argv[] = {"redis-server", "--port",    ps.c_str(),     "--bind", "127.0.0.1",
                          "--save",       "",          "--appendonly", "no",     "--dir",
                          dir.c_str(),    "--logfile", log.c_str(),    nullptr};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    if (posix_spawnp(&pid, "redis-server", &fa, nullptr, const_cast<char **>(argv), environ) != 0)
      pid = 0;
    posix_spawn_file_actions_destroy(&fa);
    if (!pid) return;
    RedisConfigProbe probe(p);
    for (int i = 0; i < 100 && !probe.ok(); ++i) {
      int st;
      if (waitpid(pid, &st, WNOHANG) == pid) {  // exited: not installed, or the port was taken
        pid = 0;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    port = probe.ok() ? p : 0;
  }
  ~RedisServer() { stop(); }
  void stop() {
    if (pid) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
    pid = 0;
  }
  // Whether the server answers (a tier's put succeeds).
  struct RedisConfigProbe {
    int port;
    explicit RedisConfigProbe(int p) : port(p) {}
    bool ok() const {
      kvc::tier::RedisConfig c;
      c.nodes = {{"127.0.0.1", port}};
      c.key_prefix = "kvc-bench-probe:";
      std::string err;
      auto t = kvc::tier::make_redis_tier(c, &err);
      const uint8_t b = 0;
      return t && t->put(key(0), kFp, &b, 1) && t->erase(key(0));
    }
  };
};

RedisServer &redis_server() {
  static RedisServer s;
  return s;
}

std::unique_ptr<kvc::tier::Tier> redis_tier(benchmark::State &state) {
  const int port = redis_server().port;
  if (!port) {
    state.SkipWithError("no redis-server (not installed, or it did not start)");
    return nullptr;
  }
  kvc::tier::RedisConfig c;
  c.nodes = {{"127.0.0.1", port}};
  c.key_prefix = "kvc-bench:";
  std::string err;
  auto t = kvc::tier::make_redis_tier(c, &err);
  if (!t) state.SkipWithError(err.c_str());
  return t;
}

void BM_RedisPut(benchmark::State &state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto src = bytes(n);
  auto t = redis_tier(state);
  if (!t) return;
  int i = 0;
  for (auto _ : state)
    if (!t->put(key(i++ % 16), kFp, src.data(), n)) state.SkipWithError(t->last_error().c_str());
  set_bytes(state, n);
}
BENCHMARK(BM_RedisPut)->Arg(64 << 10)->UseRealTime();

void BM_RedisGet(benchmark::State &state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto src = bytes(n);
  auto t = redis_tier(state);
  if (!t) return;
  if (!t->put(key(1), kFp, src.data(), n)) return state.SkipWithError(t->last_error().c_str());
  std::vector<uint8_t> out(n);
  for (auto _ : state) {
    if (!t->get(key(1), kFp, out)) state.SkipWithError(t->last_error().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  set_bytes(state, n);
}
BENCHMARK(BM_RedisGet)->Arg(64 << 10)->UseRealTime();

}  // namespace

int main(int argc, char **argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  redis_server().stop();
  const std::string dir = temp_dir();
  std::system(("rm -rf '" + dir + "'").c_str());  // the disk tier's records, the server's log
  return 0;
}
