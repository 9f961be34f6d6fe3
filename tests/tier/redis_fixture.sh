#!/usr/bin/env bash
# Redis servers for the tier_redis_* tests (a ctest fixture, tests/tier/CMakeLists.txt).
#   redis_fixture.sh start <dir>   one standalone server and a 3-node cluster on
#                                  free loopback ports; writes <dir>/ports:
#                                    standalone <port>
#                                    cluster <port1> <port2> <port3>
#                                  or "skip <reason>" when redis-server or
#                                  redis-cli is not installed (the tests then
#                                  exit 77: skipped).
#   redis_fixture.sh stop <dir>    stops every server started in <dir>.
#   redis_fixture.sh server <dir> <name> [args...]
#                                  starts one more server in <dir>/<name> on a
#                                  free port with the extra redis-server args
#                                  and prints its port (<dir>/<name>/start.sh
#                                  starts it again on the same port).
# Each server runs in <dir>/<name>/ (log, pid file, cluster config) and has a
# start.sh there that restarts it with the same port and config.
set -uo pipefail
verb=${1:-}
dir=${2:-}
if [ -z "$verb" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|stop <dir> | server <dir> <name> [args...]" >&2
  exit 2
fi

stop_all() {
  local f pid
  for f in "$dir"/*/redis.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null
      # Gone when it removed its pid file (an exited daemon may stay a zombie
      # where nothing reaps orphans) or no longer exists.
      for _ in $(seq 100); do
        { [ -f "$f" ] && kill -0 "$pid" 2>/dev/null; } || break
        sleep 0.05
      done
      [ -f "$f" ] && kill -9 "$pid" 2>/dev/null
    fi
    rm -f "$f"
  done
}

# Whether something listens on the loopback port.
in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# start_server NAME ARGS...: starts redis-server in $dir/NAME on a free port
# (and, for a cluster node, a free bus port: port + 10000); prints the port.
start_server() {
  local name=$1
  shift
  local d="$dir/$name" try port pid
  mkdir -p "$d"
  for try in $(seq 30); do
    port=$(( 20000 + (RANDOM * 32768 + RANDOM) % 25000 ))
    if in_use "$port" || in_use $((port + 10000)); then continue; fi
    # start.sh: the same server again (same port, folder and cluster config).
    {
      echo '#!/bin/sh'
      echo "cd \"$d\" || exit 1"
      printf 'redis-server --port %s --bind 127.0.0.1 --save "" --appendonly no --dir "%s" --pidfile "%s/redis.pid" --logfile "%s/redis.log" --daemonize yes' \
        "$port" "$d" "$d" "$d"
      [ $# -gt 0 ] && printf ' %q' "$@"
      echo
      # Ours answers (not another server on the port): its pid file exists and it runs.
      echo "for i in \$(seq 100); do [ \"\$(redis-cli -h 127.0.0.1 -p $port ping 2>/dev/null)\" = PONG ] && [ -f redis.pid ] && kill -0 \"\$(cat redis.pid)\" 2>/dev/null && exit 0; sleep 0.05; done"
      echo "exit 1"
    } > "$d/start.sh"
    chmod +x "$d/start.sh"
    rm -f "$d/redis.pid"
    if sh "$d/start.sh" </dev/null >/dev/null 2>&1; then
      echo "$port"
      return 0
    fi
    # Port taken meanwhile (another build's tests): stop whatever started, try another.
    pid=$(cat "$d/redis.pid" 2>/dev/null)
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  done
  echo "cannot start redis-server in $d (see $d/redis.log)" >&2
  return 1
}

case "$verb" in
  start)
    mkdir -p "$dir"
    stop_all  # servers left by an interrupted run
    rm -f "$dir/ports"
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
      echo "skip redis-server / redis-cli not installed" > "$dir/ports"
      echo "redis-server not installed: the tier_redis_* tests are skipped" >&2
      exit 0
    fi
    rm -rf "$dir"/standalone "$dir"/node*
    sp=$(start_server standalone) || exit 1
    cports=()
    for i in 1 2 3; do
      p=$(start_server "node$i" --cluster-enabled yes --cluster-config-file nodes.conf \
            --cluster-node-timeout 15000 --cluster-require-full-coverage no) || { stop_all; exit 1; }
      cports+=("$p")
    done
    if ! redis-cli --cluster create "127.0.0.1:${cports[0]}" "127.0.0.1:${cports[1]}" "127.0.0.1:${cports[2]}" \
         --cluster-replicas 0 --cluster-yes > "$dir/cluster-create.log" 2>&1; then
      echo "redis-cli --cluster create failed (see $dir/cluster-create.log)" >&2
      stop_all
      exit 1
    fi
    for p in "${cports[@]}"; do
      ok=0
      for _ in $(seq 200); do
        if redis-cli -h 127.0.0.1 -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then ok=1; break; fi
        sleep 0.05
      done
      if [ $ok -ne 1 ]; then
        echo "cluster node $p never reached cluster_state:ok" >&2
        stop_all
        exit 1
      fi
    done
    # Every node must know the whole slot map before the tests route by it.
    printf 'standalone %s\ncluster %s %s %s\n' "$sp" "${cports[@]}" > "$dir/ports.tmp"
    mv "$dir/ports.tmp" "$dir/ports"
    cat "$dir/ports"
    ;;
  stop)
    stop_all
    ;;
  server)
    name=${3:?name}
    shift 3
    command -v redis-server >/dev/null 2>&1 || exit 77
    mkdir -p "$dir"
    start_server "$name" "$@"
    ;;
  *)
    echo "unknown verb $verb" >&2
    exit 2
    ;;
esac
