"""LMCache storage plugin over libkvcache's stores (docs/engines.md).

``KvcStorageBackend`` is an LMCache storage plugin (``StoragePluginInterface``,
LMCache's "storage_plugins"): the KV chunks LMCache stores go to a libkvcache
store (``kvcache.Store``): this process's memory, a disk directory
(crash-safe, checksummed records shared by processes) or a Redis server or
Redis Cluster (shared by machines). LMCache configuration (YAML)::

    chunk_size: 256
    local_cpu: true
    max_local_cpu_size: 5
    storage_plugins: ["kvcache"]
    extra_config:
      storage_plugin.kvcache.module_path: kvcache.lmcache
      storage_plugin.kvcache.class_name: KvcStorageBackend
      kvcache.tier: redis                 # disk (default), host or redis
      kvcache.address: "10.0.0.5:6379"    # Redis; seed nodes "h:p,h:p" with kvcache.cluster: true
      # kvcache.path, kvcache.capacity_bytes, kvcache.fsync (disk); kvcache.capacity_bytes (host);
      # kvcache.timeout_ms, kvcache.ttl_seconds (Redis); kvcache.scope (text added to the scope)

A value is one chunk: LMCache's remote metadata header (length, memory
format, shapes and dtypes, the same bytes its remote connectors write) then
the chunk's bytes. Keys are LMCache's ``CacheEngineKey`` strings (model,
world size, worker id, chunk hash, dtype). pin / unpin are the store's
(host and disk; LRU never evicts a pinned chunk; Redis has none and answers
True, as LMCache's remote backend does). Failures never raise into LMCache:
a tier that is down gives misses and failed puts, the reason in
``tier_stats()``.
"""

import concurrent.futures as _futures
import logging as _logging
import os as _os
import threading as _threading

import numpy as _np

from lmcache.v1.protocol import RemoteMetadata, get_remote_metadata_bytes, init_remote_metadata_info
from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface

from . import KvcError, Store

__all__ = ["KvcStorageBackend"]

_log = _logging.getLogger(__name__)
_DEFAULT_CAPACITY = 64 << 30


class KvcStorageBackend(StoragePluginInterface):
    """An LMCache storage plugin whose chunks live in a libkvcache store."""

    def __init__(self, dst_device="cpu", config=None, metadata=None, local_cpu_backend=None, loop=None):
        super().__init__(dst_device=dst_device, config=config, metadata=metadata,
                         local_cpu_backend=local_cpu_backend, loop=loop)
        extra = dict((config.extra_config if config is not None else None) or {})
        opt = lambda name, default=None: extra.get("kvcache." + name, default)  # noqa: E731
        tier = str(opt("tier", "disk"))
        scope = "lmcache/1" + ("|user=" + str(opt("scope")) if opt("scope") else "")
        if tier == "host":
            self._store = Store.host(int(opt("capacity_bytes", _DEFAULT_CAPACITY)), scope)
        elif tier == "disk":
            path = opt("path") or _os.path.join(_os.path.expanduser("~"), ".cache", "kvcache", "lmcache")
            self._store = Store.disk(path, int(opt("capacity_bytes", _DEFAULT_CAPACITY)), scope,
                                     fsync=bool(opt("fsync", False)))
        elif tier == "redis":
            if not opt("address"):
                raise ValueError("kvcache.lmcache: kvcache.tier redis needs kvcache.address")
            self._store = Store.redis(str(opt("address")), scope, cluster=bool(opt("cluster", False)),
                                      timeout_ms=int(opt("timeout_ms", 1000)),
                                      ttl_seconds=int(opt("ttl_seconds", 0)))
        else:
            raise ValueError("kvcache.lmcache: kvcache.tier %r: \"disk\", \"host\" or \"redis\"" % tier)
        self._tier = tier
        groups = metadata.get_num_groups() if metadata is not None and hasattr(metadata, "get_num_groups") else 1
        init_remote_metadata_info(groups)
        self._meta_bytes = get_remote_metadata_bytes()
        try:
            self._chunk_bytes = sum(int(_np.prod(sh)) * dt.itemsize
                                    for sh, dt in zip(metadata.get_shapes(), metadata.get_dtypes()))
        except Exception:  # no metadata: the store's default first read
            self._chunk_bytes = 65536
        self._lock = _threading.Lock()
        self._put_tasks = set()
        self._pool = _futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvc-lmcache-put")
        self._closed = False

    def __str__(self):
        return "KvcStorageBackend(%s)" % self._tier

    def tier_stats(self):
        """The store's counters (kvcache.TierStats)."""
        return self._store.stats()

    # ---------------------------------------------------------------- lookups
    @staticmethod
    def _key(key):
        return key.to_string()

    def contains(self, key, pin=False):
        try:
            hit = self._store.contains([self._key(key)])[0]
            if hit and pin:
                self.pin(key)
            return hit
        except (KvcError, ValueError, TypeError) as e:
            _log.warning("kvcache.lmcache: contains %s: %s", key, e)
            return False

    def batched_contains(self, keys, pin=False):
        """How many keys from the first are stored (one round trip per Redis server)."""
        try:
            found = self._store.contains([self._key(k) for k in keys])
        except (KvcError, ValueError, TypeError) as e:
            _log.warning("kvcache.lmcache: batched_contains: %s", e)
            return 0
        n = 0
        for hit in found:
            if not hit:
                break
            n += 1
        if pin:
            for k in keys[:n]:
                self.pin(k)
        return n

    def exists_in_put_tasks(self, key):
        with self._lock:
            return key in self._put_tasks

    # ------------------------------------------------------------------- puts
    def _put_one(self, key, obj, callback):
        try:
            data = obj.byte_array
            meta = RemoteMetadata(len(data), obj.get_shapes(), obj.get_dtypes(), obj.get_memory_format())
            value = bytearray(self._meta_bytes + len(data))
            head = meta.serialize()
            value[:len(head)] = head
            value[self._meta_bytes:] = data
            self._store.put(self._key(key), value)
        except Exception as e:  # a writer thread: logged, the chunk released, the callback still run
            _log.warning("kvcache.lmcache: put %s: %s", key, e)
        finally:
            obj.ref_count_down()
            with self._lock:
                self._put_tasks.discard(key)
        if callback is not None:
            try:
                callback(key)
            except Exception as e:  # LMCache's contract: callback errors are logged
                _log.warning("kvcache.lmcache: put callback of %s: %s", key, e)

    def batched_submit_put_task(self, keys, objs, transfer_spec=None, on_complete_callback=None):
        """Stores each chunk on a writer thread; the futures of the writes."""
        if self._closed or len(keys) != len(objs):
            return None
        futs = []
        for key, obj in zip(keys, objs):
            obj.ref_count_up()  # held until written, as LMCache's disk backend does
            with self._lock:
                self._put_tasks.add(key)
            futs.append(self._pool.submit(self._put_one, key, obj, on_complete_callback))
        return futs

    # ------------------------------------------------------------------- gets
    def get_blocking(self, key):
        """The chunk of `key` in a MemoryObj of LMCache's local CPU allocator, or None."""
        try:
            # A full chunk with its header in one read (the store reads a longer value twice).
            raw = self._store.get(self._key(key), size_hint=self._meta_bytes + self._chunk_bytes)
        except (KvcError, ValueError, TypeError) as e:
            _log.warning("kvcache.lmcache: get %s: %s", key, e)
            return None
        if raw is None or len(raw) < self._meta_bytes:
            return None
        try:
            meta = RemoteMetadata.deserialize(raw[:self._meta_bytes])
        except Exception as e:  # a value that is not a chunk of ours
            _log.warning("kvcache.lmcache: get %s: bad chunk header: %s", key, e)
            return None
        if meta.length != len(raw) - self._meta_bytes:
            _log.warning("kvcache.lmcache: get %s: %d data bytes, header says %d", key,
                         len(raw) - self._meta_bytes, meta.length)
            return None
        if self.local_cpu_backend is None:
            return None
        obj = self.local_cpu_backend.allocate(meta.shapes, meta.dtypes, meta.fmt)
        if obj is None:
            return None
        dst = memoryview(obj.byte_array).cast("B")
        if len(dst) != meta.length:
            obj.ref_count_down()
            return None
        dst[:] = memoryview(raw)[self._meta_bytes:]
        return obj

    # ------------------------------------------------------------------ admin
    def pin(self, key):
        if self._tier == "redis":
            return True  # Redis evicts by its own rules (LMCache's remote backend answers True too)
        try:
            return self._store.pin(self._key(key))
        except KvcError as e:
            _log.warning("kvcache.lmcache: pin %s: %s", key, e)
            return False

    def unpin(self, key):
        if self._tier == "redis":
            return True
        try:
            return self._store.unpin(self._key(key))
        except KvcError as e:
            _log.warning("kvcache.lmcache: unpin %s: %s", key, e)
            return False

    def remove(self, key, force=True):
        try:
            return self._store.remove(self._key(key))
        except KvcError as e:
            _log.warning("kvcache.lmcache: remove %s: %s", key, e)
            return False

    def get_allocator_backend(self):
        return self.local_cpu_backend

    def close(self):
        """Waits for the writes in flight, then closes the store."""
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True)
        self._store.close()
