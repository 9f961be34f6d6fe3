"""Helpers the engine contract tests share: a port nothing listens on, and the
tier_redis fixture's servers (KVC_REDIS_DIR/ports, written by
tests/tier/redis_fixture.sh when ctest runs its fixture)."""
import os
import socket

import pytest


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def redis_ports():
    """{"standalone": [port], "cluster": [p1, p2, p3]}; skips where the fixture found no redis-server."""
    d = os.environ.get("KVC_REDIS_DIR")
    if not d or not os.path.exists(os.path.join(d, "ports")):
        pytest.fail("KVC_REDIS_DIR has no ports file: run through ctest (its fixture starts the servers)")
    ports = {}
    for line in open(os.path.join(d, "ports")):
        what, *rest = line.split()
        if what == "skip":
            pytest.skip(line.strip())
        ports[what] = [int(p) for p in rest]
    return ports
