"""SGLang HiCache storage over libkvcache's stores (docs/engines.md).

``KvcHiCacheStorage`` is a ``HiCacheStorage`` backend (SGLang's L3 tier of the
hierarchical cache): the pages SGLang backs up from its host KV pool go to a
libkvcache store (``kvcache.Store``): this process's memory, a disk directory
(crash-safe records, checksummed, shared by processes) or a Redis server or
Redis Cluster (shared by machines). Load it with SGLang's dynamic backend::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvcache",
            "module_path": "kvcache.sglang", "class_name": "KvcHiCacheStorage",
            "interface_v1": 1, "kvc_tier": "redis", "kvc_address": "10.0.0.5:6379"}'

Configuration (``extra_config``): ``kvc_tier`` ``"disk"`` (default), ``"host"``
or ``"redis"``; ``kvc_path`` (disk; default SGLang's file backend directory,
``$SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR`` or /tmp/hicache);
``kvc_capacity_bytes`` (host and disk; default 64 GiB); ``kvc_fsync`` (disk);
``kvc_address`` (Redis ``host:port``, or seed nodes ``h:p,h:p`` with
``kvc_cluster``: true); ``kvc_timeout_ms``, ``kvc_ttl_seconds`` (Redis);
``kvc_scope`` (text added to the scope). ``interface_v1``: 1 selects the
zero-copy pair (``batch_get_v1`` / ``batch_set_v1``: pages read and written
at the host pool's own addresses, ``get_page_buffer_meta``). With SGLang's
``--enable-storage-metrics``, ``get_stats()`` reports pages and GB/s per
batch read and written (``StorageMetrics``).

What a value is: one page of SGLang's host pool, its bytes in the pool's
layout (every layer's K and V of ``page_size`` tokens). The store's scope
names the model, the rank's shard (tensor / pipeline / context parallel, as
SGLang's file backend does) and, once SGLang registers its host pool, the
pool's layout, dtype, page size and geometry: a page is never read by a pool
that lays it out otherwise. Keys are SGLang's page hashes.

Every method returns SGLang's answer on failure (None, False, a shorter hit):
a tier that is down degrades to misses, never an exception in SGLang's I/O
threads; the reason is in ``tier_stats()``.
"""

import ctypes as _ctypes
import logging as _logging
import os as _os
import threading as _threading
import time as _time

import numpy as _np
import torch as _torch
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, HiCacheStorageConfig, PoolHitPolicy, PoolName,
                                                  PoolTransferResult)

from . import KvcError, Store

__all__ = ["KvcHiCacheStorage"]

_log = _logging.getLogger(__name__)
_DEFAULT_CAPACITY = 64 << 30


def _bytes_at(ptr, n):
    """A writable numpy uint8 view of n bytes at address ptr (no copy)."""
    return _np.ctypeslib.as_array((_ctypes.c_uint8 * n).from_address(ptr))


class KvcHiCacheStorage(HiCacheStorage):
    """A HiCacheStorage whose pages live in a libkvcache store."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs=None):
        extra = dict(storage_config.extra_config or {})
        self._extra = extra
        self._config = storage_config
        tier = str(extra.get("kvc_tier", "disk"))
        if tier not in ("disk", "host", "redis"):
            raise ValueError("kvcache.sglang: kvc_tier %r: \"disk\", \"host\" or \"redis\"" % tier)
        self._tier = tier
        self._base_scope = self._shard_scope(storage_config, extra)
        self.mem_pool_host = None
        self.registered_pools = {}
        self._store = self._open(self._base_scope)
        # Per batch (pages, GB/s) since the last get_stats(), when SGLang asks for storage metrics.
        self._metrics = bool(getattr(storage_config, "enable_storage_metrics", False))
        self._io_lock = _threading.Lock()
        self._io = {"prefetch": [], "backup": []}

    # ------------------------------------------------------------------ set-up
    @staticmethod
    def _shard_scope(cfg, extra):
        """What a page's bytes depend on besides its tokens: the model and this rank's shard. MLA KV
        is the same on every tensor-parallel rank (one copy), as SGLang's file backend keys it."""
        model = (cfg.model_name or "").replace("/", "-")
        parts = ["sglang-hicache/1", "model=" + model]
        if not cfg.is_mla_model:
            parts.append("tp=%d/%d" % (cfg.tp_rank, cfg.tp_size))
        if cfg.pp_size > 1:
            parts.append("pp=%d/%d" % (cfg.pp_rank, cfg.pp_size))
        if cfg.attn_cp_size > 1:
            parts.append("cp=%d/%d" % (cfg.attn_cp_rank, cfg.attn_cp_size))
        if cfg.dcp_size > 1:
            parts.append("dcp=%d/%d/page%s" % (cfg.dcp_rank, cfg.dcp_size, cfg.logical_page_size))
        if extra.get("kvc_scope"):
            parts.append("user=" + str(extra["kvc_scope"]))
        return "|".join(parts)

    def _open(self, scope):
        e = self._extra
        if self._tier == "host":
            return Store.host(int(e.get("kvc_capacity_bytes", _DEFAULT_CAPACITY)), scope)
        if self._tier == "disk":
            path = (e.get("kvc_path") or _os.environ.get("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR")
                    or e.get("file_storage_path") or "/tmp/hicache")
            return Store.disk(path, int(e.get("kvc_capacity_bytes", _DEFAULT_CAPACITY)), scope,
                              fsync=bool(e.get("kvc_fsync", False)))
        if not e.get("kvc_address"):
            raise ValueError("kvcache.sglang: kvc_tier \"redis\" needs kvc_address (\"host:port\" or seed nodes)")
        return Store.redis(str(e["kvc_address"]), scope, cluster=bool(e.get("kvc_cluster", False)),
                           timeout_ms=int(e.get("kvc_timeout_ms", 1000)),
                           ttl_seconds=int(e.get("kvc_ttl_seconds", 0)))

    @staticmethod
    def _pool_scope(pool):
        """The host pool's page format: layout, dtype, page size and geometry."""
        geo = [getattr(pool, a, None) for a in ("layer_num", "head_num", "head_dim", "v_head_dim",
                                                 "kv_lora_rank", "qk_rope_head_dim")]
        return "|pool=%s/%s/page%s/%s" % (getattr(pool, "layout", "?"), getattr(pool, "dtype", "?"),
                                           getattr(pool, "page_size", "?"),
                                           ",".join("-" if g is None else str(g) for g in geo))

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        old, self._store = self._store, self._open(self._base_scope + self._pool_scope(mem_pool_host))
        old.close()

    def close(self):
        self._store.close()

    _MAX_SAMPLES = 4096  # per kind between two get_stats() calls

    def _record(self, kind, pages, nbytes, seconds):
        if not self._metrics or pages <= 0:
            return
        with self._io_lock:
            rows = self._io[kind]
            if len(rows) < self._MAX_SAMPLES:
                rows.append((pages, nbytes / max(seconds, 1e-9) / 1e9))

    def get_stats(self):
        """SGLang's StorageMetrics of the batches since the last call (with enable_storage_metrics):
        pages and GB/s per batch read (prefetch) and written (backup); None otherwise."""
        if not self._metrics:
            return None
        from sglang.srt.observability.metrics_collector import StorageMetrics
        with self._io_lock:
            io, self._io = self._io, {"prefetch": [], "backup": []}
        m = StorageMetrics()
        m.prefetch_pgs.extend(p for p, _ in io["prefetch"])
        m.prefetch_bandwidth.extend(b for _, b in io["prefetch"])
        m.backup_pgs.extend(p for p, _ in io["backup"])
        m.backup_bandwidth.extend(b for _, b in io["backup"])
        return m

    def tier_stats(self):
        """The store's counters (kvcache.TierStats: hits, misses, bytes, errors, last_error...)."""
        return self._store.stats()

    # ------------------------------------------------------------ the v0 pair
    def _key(self, key, pool_name=None):
        if pool_name is None or pool_name in ("__default__", PoolName.KV):
            return key
        return "%s.%s" % (key, pool_name.value if isinstance(pool_name, PoolName) else pool_name)

    def get(self, key, target_location=None, target_sizes=None):
        """The page of `key`: read into target_location (a CPU tensor of the page's size) when given,
        else a new uint8 tensor; None on a miss or a page of another size."""
        try:
            if target_location is not None:
                n = self._store.get_into(key, target_location)
                want = target_location.numel() * target_location.element_size()
                return target_location if n == want else None
            pool = self.mem_pool_host
            hint = pool.get_dummy_flat_data_page().nbytes if pool is not None else 65536
            data = self._store.get(key, size_hint=hint)
            return None if data is None else _torch.frombuffer(bytearray(data), dtype=_torch.uint8)
        except (KvcError, ValueError, TypeError) as e:
            _log.warning("kvcache.sglang: get %s: %s", key, e)
            return None

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        locs = target_locations if target_locations is not None else [None] * len(keys)
        t0 = _time.perf_counter()
        out = [self.get(k, t) for k, t in zip(keys, locs)]
        got = [o for o in out if o is not None]
        self._record("prefetch", len(got), sum(o.numel() * o.element_size() for o in got),
                     _time.perf_counter() - t0)
        return out

    def set(self, key, value=None, target_location=None, target_sizes=None):
        """Store one page (a CPU tensor); True when it is stored (or already was)."""
        if not isinstance(value, _torch.Tensor):
            _log.warning("kvcache.sglang: set %s: the value is a %s, not a tensor", key, type(value).__name__)
            return False
        try:
            if key in self._store:
                return True  # a page's bytes follow from its hash: already there
            self._store.put(key, value.contiguous())
            return True
        except (KvcError, ValueError, TypeError) as e:
            _log.warning("kvcache.sglang: set %s: %s", key, e)
            return False

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        if values is None or len(values) != len(keys) or not all(isinstance(v, _torch.Tensor) for v in values):
            _log.warning("kvcache.sglang: batch_set: %d keys need as many tensors", len(keys))
            return False
        t0 = _time.perf_counter()
        have = self._contains(keys)
        ok = True
        pages = nbytes = 0
        for k, v, h in zip(keys, values, have):
            if h:
                continue
            try:
                self._store.put(k, v.contiguous())
                pages += 1
                nbytes += v.numel() * v.element_size()
            except (KvcError, ValueError, TypeError) as e:
                _log.warning("kvcache.sglang: set %s: %s", k, e)
                ok = False
        self._record("backup", pages, nbytes, _time.perf_counter() - t0)
        return ok

    def _contains(self, keys):
        try:
            return self._store.contains(list(keys))
        except (KvcError, ValueError, TypeError) as e:
            _log.warning("kvcache.sglang: exists: %s", e)
            return [False] * len(keys)

    def exists(self, key):
        return self._contains([key])[0]

    def batch_exists(self, keys, extra_info=None):
        """How many keys from the first are stored (one round trip per Redis server)."""
        n = 0
        for hit in self._contains(keys):
            if not hit:
                break
            n += 1
        return n

    # ---------------------------------------------------- the zero-copy v1 pair
    def _page_parts(self, keys, host_indices):
        """[[numpy view of each part of page i]] at the host pool's addresses."""
        pool = self.mem_pool_host
        if pool is None:
            raise ValueError("no host pool registered (register_mem_pool_host)")
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        if not keys or len(ptrs) % len(keys) or len(ptrs) != len(sizes):
            raise ValueError("the host pool gave %d buffers for %d pages" % (len(ptrs), len(keys)))
        per = len(ptrs) // len(keys)
        return [[_bytes_at(int(ptrs[i * per + j]), int(sizes[i * per + j])) for j in range(per)]
                for i in range(len(keys))]

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Read pages into the host pool at host_indices (page_size indices per key): [bool] per key."""
        if not keys:
            return []
        try:
            pages = self._page_parts(keys, host_indices)
        except (ValueError, AssertionError) as e:
            _log.warning("kvcache.sglang: batch_get_v1: %s", e)
            return [False] * len(keys)
        out = []
        scratch = bytearray(sum(p.size for p in pages[0]))
        view = _np.frombuffer(scratch, _np.uint8)
        t0 = _time.perf_counter()
        for key, parts in zip(keys, pages):
            try:
                n = self._store.get_into(key, scratch)
            except KvcError as e:
                _log.warning("kvcache.sglang: get %s: %s", key, e)
                n = -1
            if n != len(scratch):  # a miss, or a page of another size: not loaded
                out.append(False)
                continue
            off = 0
            for p in parts:
                p[:] = view[off:off + p.size]
                off += p.size
            out.append(True)
        self._record("prefetch", sum(out), sum(out) * len(scratch), _time.perf_counter() - t0)
        return out

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Write the host pool's pages at host_indices under keys: [bool] per key."""
        if not keys:
            return []
        try:
            pages = self._page_parts(keys, host_indices)
        except (ValueError, AssertionError) as e:
            _log.warning("kvcache.sglang: batch_set_v1: %s", e)
            return [False] * len(keys)
        t0 = _time.perf_counter()
        have = self._contains(keys)
        out = []
        written = 0
        for key, parts, h in zip(keys, pages, have):
            if h:
                out.append(True)
                continue
            try:
                self._store.put(key, parts[0] if len(parts) == 1 else _np.concatenate(parts))
                out.append(True)
                written += 1
            except KvcError as e:
                _log.warning("kvcache.sglang: set %s: %s", key, e)
                out.append(False)
        self._record("backup", written, written * sum(p.size for p in pages[0]), _time.perf_counter() - t0)
        return out

    # ------------------------------------------------- the v2 calls (hybrid pools)
    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """The KV prefix stored, cut where a registered side pool (Mamba, SWA, DSA...) misses a page
        its hit policy needs (all pages, or the trailing ones)."""
        names = [None] + [t.name for t in (pool_transfers or [])]
        asked = [self._key(k, n) for n in names for k in keys]
        found = dict(zip(asked, self._contains(asked))) if asked else {}
        kv = 0
        while kv < len(keys) and found[self._key(keys[kv])]:
            kv += 1
        hits = {PoolName.KV: kv} if kv else {}
        restorable = set(range(1, kv + 1))
        for t in pool_transfers or []:
            if not restorable:
                break
            has = [found[self._key(k, t.name)] for k in keys[:kv]]
            if t.hit_policy == PoolHitPolicy.ALL_PAGES:
                bound = next((i for i, h in enumerate(has) if not h), kv)
                ok = set(range(1, bound + 1))
            elif t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                tail = max(1, len(t.keys) if t.keys else 1)
                ok = {p for p in range(1, kv + 1) if all(has[max(0, p - tail):p])}
                bound = max(ok, default=0)
            else:
                raise ValueError("kvcache.sglang: hit policy %s is not supported" % t.hit_policy)
            if bound:
                hits[t.name] = bound
            restorable &= ok
        final = max(restorable, default=0)
        return PoolTransferResult(final, hits, sorted(restorable))

    def _io_v2(self, transfers, write):
        results = {}
        for t in transfers:
            keys = t.keys or []
            pool = self.registered_pools.get(t.name) if hasattr(self, "registered_pools") else None
            page = (getattr(pool, "page_size", 1) or 1) if pool is not None else 1
            idx = t.host_indices
            if pool is None or idx is None or idx.numel() != len(keys) * page:
                _log.warning("kvcache.sglang: %s of pool %s: %s", "set" if write else "get", t.name,
                             "not registered" if pool is None else "indices do not match the keys")
                results[t.name] = [False] * len(keys)
                continue
            done = []
            for i, key in enumerate(keys):
                at = int(idx[i * page])
                k = self._key(key, t.name)
                if write:
                    done.append(self.set(k, pool.get_data_page(at, flat=True)))
                else:
                    data = self.get(k, pool.get_dummy_flat_data_page())
                    if data is not None:
                        pool.set_from_flat_data_page(at, data)
                    done.append(data is not None)
            results[t.name] = done
        return results

    def batch_get_v2(self, transfers, extra_info=None):
        return self._io_v2(transfers, write=False)

    def batch_set_v2(self, transfers, extra_info=None):
        return self._io_v2(transfers, write=True)

    # ------------------------------------------------------------------ admin
    def clear(self):
        """Empty a host store. Disk and Redis stores are shared with other processes and engines and
        keep their pages (remove them with the tier's own tools); False for those."""
        if self._tier != "host":
            _log.info("kvcache.sglang: clear(): a %s store is shared; its pages stay", self._tier)
            return False
        scope = self._base_scope + (self._pool_scope(self.mem_pool_host) if self.mem_pool_host else "")
        old, self._store = self._store, self._open(scope)
        old.close()
        return True
