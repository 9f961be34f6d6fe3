#include "tier/factory.h"

#include "common/error.h"

namespace kvc::tier {

std::vector<std::pair<std::string, int>> parse_nodes(const std::string &a) {
  std::vector<std::pair<std::string, int>> out;
  size_t start = 0;
  while (start <= a.size()) {
    size_t end = a.find(',', start);
    if (end == std::string::npos) end = a.size();
    std::string node = a.substr(start, end - start);
    const size_t colon = node.rfind(':');
    if (node.empty() || colon == std::string::npos || colon == 0 || colon + 1 == node.size())
      fail(Errc::InvalidArgument, "address \"" + a + "\": expected host:port[,host:port...]");
    std::string host = node.substr(0, colon);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']')
      host = host.substr(1, host.size() - 2);
    const std::string port = node.substr(colon + 1);
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(port) < 1 || std::stoi(port) > 65535)
      fail(Errc::InvalidArgument,
           "address \"" + a + "\": port \"" + port + "\" is not in 1..65535");
    out.emplace_back(host, std::stoi(port));
    if (out.size() > 64) fail(Errc::InvalidArgument, "address lists more than 64 nodes");
    start = end + 1;
  }
  return out;
}

std::function<std::unique_ptr<Tier>()> tier_maker(const Spec &s) {
  switch (s.kind) {
    case Kind::Host:
    case Kind::Disk: {
      if (s.capacity_bytes == 0)
        fail(Errc::InvalidArgument, "capacity_bytes is 0 (a host or disk tier needs a capacity)");
      const uint64_t cap = s.capacity_bytes;
      if (s.kind == Kind::Host) return [cap] { return make_host_tier(cap); };
      if (s.path.empty()) fail(Errc::InvalidArgument, "a disk tier needs a path (a directory)");
      return [path = s.path, cap, sync = s.fsync, nb = s.nonblocking_open] {
        std::string err;
        auto t = make_disk_tier(path, cap, sync, &err, nb);
        if (!t) fail(Errc::Io, err);
        return t;
      };
    }
    case Kind::Redis: {
      if (s.address.empty())
        fail(Errc::InvalidArgument, "a Redis tier needs an address (host:port)");
      if (s.timeout_ms == 0) fail(Errc::InvalidArgument, "timeout_ms is 0");
      RedisConfig rc;
      rc.nodes = parse_nodes(s.address);
      rc.cluster = s.cluster;
      if (!rc.cluster && rc.nodes.size() != 1)
        fail(Errc::InvalidArgument,
             "a single Redis server has one address (several: KVC_TIER_REDIS_CLUSTER)");
      rc.timeout_ms = s.timeout_ms;
      rc.ttl_seconds = s.ttl_seconds;
      return [rc] {
        std::string err;
        auto t = make_redis_tier(rc, &err);
        if (!t) fail(Errc::Unsupported, err);
        return t;
      };
    }
  }
  fail(Errc::InvalidArgument, "kind " + std::to_string(static_cast<int32_t>(s.kind)) + ": unknown");
}

}  // namespace kvc::tier
