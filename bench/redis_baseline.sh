#!/usr/bin/env bash
# redis-benchmark's GET of a 64 KiB value on loopback, against a redis-server
# this script starts on a free port (and stops): the figure to compare with
# bench_tier's BM_RedisGet/65536 (one client, one connection, no pipelining).
# Usage: bench/redis_baseline.sh [requests (2000)] [value bytes (65536)]
set -euo pipefail
n=${1:-2000}
size=${2:-65536}
for tool in redis-server redis-cli redis-benchmark; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$tool not installed (scripts/setup.sh installs it)" >&2; exit 77; }
done
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvc_redis_baseline_XXXXXX")
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT
in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=
for _ in $(seq 30); do
  p=$(( 20000 + (RANDOM * 32768 + RANDOM) % 25000 ))
  in_use "$p" && continue
  redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
    --logfile "$dir/redis.log" </dev/null >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    if [ "$(redis-cli -h 127.0.0.1 -p "$p" ping 2>/dev/null)" = PONG ]; then port=$p; break 2; fi
    sleep 0.05
  done
  wait "$pid" 2>/dev/null || true  # it exited (port taken): another one
  pid=
done
[ -n "$port" ] || { echo "cannot start redis-server" >&2; exit 1; }
# GET reads the key SET writes (key:__rand_int__): without it every GET is a nil reply.
redis-benchmark -h 127.0.0.1 -p "$port" -t set -d "$size" -n 100 -q >/dev/null
[ "$(redis-cli -h 127.0.0.1 -p "$port" strlen key:__rand_int__)" = "$size" ] || { echo "SET did not store the value" >&2; exit 1; }
echo "redis-server on 127.0.0.1:$port; redis-benchmark GET, $size-byte values, $n requests:"
echo "  one client:"
redis-benchmark -h 127.0.0.1 -p "$port" -t get -d "$size" -n "$n" -c 1 -q
echo "  50 clients (redis-benchmark's default):"
redis-benchmark -h 127.0.0.1 -p "$port" -t get -d "$size" -n "$n" -q
