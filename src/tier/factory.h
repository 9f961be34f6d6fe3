// Opening a tier from its description (the tier kinds of kvc_tier_config):
// the checks that need no I/O first, then a maker the pool calls once it can
// take the tier.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tier/tier.h"

namespace kvc::tier {

// Values equal the public kvc_tier_kind values.
enum class Kind : int32_t { Host = 0, Disk = 1, Redis = 2 };

struct Spec {
  Kind kind = Kind::Host;
  uint64_t capacity_bytes = 0;    // host, disk
  std::string path;               // disk: the directory
  bool fsync = false;             // disk: flush every record before it is visible
  bool nonblocking_open = false;  // disk: records opened with O_NONBLOCK (stores)
  std::string address;            // Redis: "host:port", or cluster seeds "host:port,host:port,..."
  bool cluster = false;           // Redis: a Redis Cluster
  uint32_t timeout_ms = 1000;     // Redis: connect and command timeout
  uint64_t ttl_seconds = 0;       // Redis: 0: records never expire
};

// Checks `s` (throws Error(InvalidArgument) naming the first problem) and
// returns what opens the tier: make_host_tier, make_disk_tier (throws
// Error(Io) when the directory cannot be used) or make_redis_tier (throws
// Error(Unsupported) in a build without hiredis).
std::function<std::unique_ptr<Tier>()> tier_maker(const Spec &s);

// "host:port[,host:port...]" (IPv6 hosts in brackets: "[::1]:6379"), at most
// 64 nodes; throws Error(InvalidArgument).
std::vector<std::pair<std::string, int>> parse_nodes(const std::string &address);

}  // namespace kvc::tier
