"""vLLM KV connector over libkvcache's stores and prefix keys (docs/engines.md).

``KvcConnector`` is a vLLM v1 KV connector (``KVConnectorBase_V1``): the
full blocks vLLM computes are saved to a libkvcache store (``kvcache.Store``:
this process's memory, a disk directory -- crash-safe, checksummed records
shared by processes; on /dev/shm it is shared memory -- or a Redis server or
Redis Cluster shared by machines), and a later request whose prompt starts with
stored blocks loads them into vLLM's paged KV cache instead of computing
them. Load it with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvcConnector",
        "kv_connector_module_path": "kvcache.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"kvc_tier": "redis", "kvc_address": "10.0.0.5:6379"}}'

Configuration (``kv_connector_extra_config``): ``kvc_tier`` ``"disk"``
(default), ``"host"`` or ``"redis"``; ``kvc_path`` (disk; default
~/.cache/kvcache/vllm, made if missing); ``kvc_capacity_bytes`` (host and
disk; default 64 GiB); ``kvc_fsync`` (disk); ``kvc_address`` (Redis
``host:port``, or seed nodes ``h:p,h:p`` with ``kvc_cluster``: true);
``kvc_timeout_ms``, ``kvc_ttl_seconds`` (Redis); ``kvc_scope`` (text added to
the scope, e.g. a deployment name); ``kvc_seed`` (64 hex digits: the
prefix-key seed; default zeros, so separate vLLM instances share keys).
Booleans are JSON's true / false (or the strings "true" / "false").

Keys: libkvcache's prefix keys (docs/prefix-cache.md; SHA-256 chained over the
blocks), not vLLM's block hashes, so any program following that document (a
router, another engine on the library) computes them from the tokens alone:
the key of each full block of ``block_size`` tokens, over the model name, the
tokens and the request's extra keys ``salt`` (``cache_salt``), ``adapter``
(the LoRA name and path) and ``media`` (the request's multimodal feature
identifiers, all of them for every block). Requests with prompt embeddings,
or whose extra keys the library refuses (over 1 MiB), are neither looked up
nor saved.

Values: one record per block and rank, every attention layer's bytes of that
block (``kv_caches[layer][block_id]``, the layer's ``[H, N, C]`` block view,
in the order of the KV cache group's layer names), whatever vLLM packs inside
a block. The scope names the model, its revision, quantization and dtype, the
rank (tensor and pipeline parallel), the KV cache layout, the block size, the
cache dtype and the per-layer page geometry, so a block is only ever read by an
engine that lays it out alike.

Scheduler side: ``get_num_new_matched_tokens`` asks every rank's store which
blocks it holds (one ``contains`` call per rank, pipelined on Redis) and
answers the leading run after vLLM's own hit (whole blocks; never the last
prompt token, which vLLM must compute); ``update_state_after_alloc`` plans
the load into the blocks vLLM allocated; ``build_connector_meta`` adds the
saves: every full block computed by the end of the step that the store does
not hold. A request holding a block that is being loaded in a step whose
output has not come back (its own load, or a load of blocks it shares) saves
nothing until that output says the load worked (``KvcWorkerMetadata``, sent
back by the workers): with async scheduling, pipeline parallelism or tensor
parallelism, nothing computed on a failed load is ever saved. A request that
finishes with such blocks unsaved keeps them (``request_finished`` answers
True) until the next step has saved them (``finished_sending``).
Worker side: loads are synchronous (``start_load_kv``, before the forward);
``save_kv_layer`` gathers the step's save blocks of each layer as the forward
passes it (a device-to-host copy per layer) and ``wait_for_save`` writes the
records before the step returns.

Failures: a store that is down or a record that vanished between lookup and
load (LRU replacement, another process removing it) is a miss: the scheduler
sees fewer hits, and a load that fails reports the request's blocks from the
first failed one on through ``get_block_ids_with_load_errors``, which vLLM
recomputes (``kv_load_failure_policy``: "recompute") or fails ("fail", vLLM's
default); the blocks are then saved again once recomputed. Nothing is
reserved by the connector beyond the steps above, so aborts leak nothing.

Not supported: the hybrid KV cache manager (vLLM turns it off for this
connector; models that need it, e.g. hybrid SSM models, do not start),
several KV cache groups, asynchronous loads, and the disaggregated prefill
roles' send/receive (kv_producer / kv_consumer store and load like kv_both
here). The host tier is this process's memory: the scheduler and the workers
share it only with vLLM's single-process executor (use a disk store on
/dev/shm otherwise).
"""

import logging as _logging
import os as _os
import threading as _threading
from dataclasses import dataclass, field

import torch as _torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                               KVConnectorRole, KVConnectorWorkerMetadata)

from . import DTYPE_F32, KvcError, Pool, PoolConfig, PrefixConfig, Store

__all__ = ["KvcConnector", "KvcConnectorMetadata", "KvcWorkerMetadata"]

_log = _logging.getLogger(__name__)
_DEFAULT_CAPACITY = 64 << 30
_EXTRA_KEYS = ["salt", "adapter", "media"]

# Host stores by (capacity, scope): the scheduler-side and worker-side
# connectors of one process must see the same memory.
_host_lock = _threading.Lock()
_host_stores = {}


@dataclass
class _Load:
    req_id: str
    keys: list  # bytes, one per block
    block_ids: list  # vLLM block ids, the same length


@dataclass
class _Save:
    req_id: str
    keys: list
    block_ids: list
    last: bool = False  # the request has finished: its blocks are freed once this is written


@dataclass
class KvcConnectorMetadata(KVConnectorMetadata):
    """What the workers do in one step: loads before the forward, saves after it."""
    step: int = 0
    loads: list = field(default_factory=list)
    saves: list = field(default_factory=list)


@dataclass
class KvcWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker -> scheduler: the steps whose metadata the workers ran (their load failures are
    vLLM's invalid_block_ids of the same output)."""
    steps: set = field(default_factory=set)

    def aggregate(self, other):
        return KvcWorkerMetadata(self.steps | getattr(other, "steps", set()))


def _opt(extra, name, default=None):
    v = extra.get("kvc_" + name)
    return default if v is None else v


def _flag(extra, name):
    """A boolean option: JSON true / false, or the strings "true" / "false" / "1" / "0"."""
    v = _opt(extra, name, False)
    if isinstance(v, str):
        if v.strip().lower() not in ("true", "false", "1", "0", "yes", "no", ""):
            raise ValueError("kvcache.vllm: kvc_%s %r: true or false" % (name, v))
        return v.strip().lower() in ("true", "1", "yes")
    return bool(v)


class _SharedHost:
    """A host Store shared by the connectors of one process (reference counted)."""

    def __init__(self, capacity, scope):
        self.key = (capacity, scope)
        with _host_lock:
            entry = _host_stores.get(self.key)
            if entry is None:
                entry = _host_stores[self.key] = [Store.host(capacity, scope), 0]
            entry[1] += 1
            self.store = entry[0]

    def close(self):
        with _host_lock:
            entry = _host_stores.get(self.key)
            if entry is not None:
                entry[1] -= 1
                if entry[1] == 0:
                    del _host_stores[self.key]
                    entry[0].close()


def _open_store(extra, scope):
    """(store, closer) for the configured tier."""
    tier = str(_opt(extra, "tier", "disk"))
    cap = int(_opt(extra, "capacity_bytes", _DEFAULT_CAPACITY))
    if tier == "host":
        h = _SharedHost(cap, scope)
        return h.store, h.close
    if tier == "disk":
        path = _opt(extra, "path") or _os.path.join(_os.path.expanduser("~"), ".cache", "kvcache", "vllm")
        _os.makedirs(path, exist_ok=True)
        s = Store.disk(path, cap, scope, fsync=_flag(extra, "fsync"))
        return s, s.close
    if tier == "redis":
        if not _opt(extra, "address"):
            raise ValueError("kvcache.vllm: kvc_tier \"redis\" needs kvc_address (\"host:port\" or seed nodes)")
        s = Store.redis(str(_opt(extra, "address")), scope, cluster=_flag(extra, "cluster"),
                        timeout_ms=int(_opt(extra, "timeout_ms", 1000)),
                        ttl_seconds=int(_opt(extra, "ttl_seconds", 0)))
        return s, s.close
    raise ValueError("kvcache.vllm: kvc_tier %r: \"disk\", \"host\" or \"redis\"" % tier)


def _parallel_rank():
    """(tp rank, pp rank) of this worker; (0, 0) where vLLM's groups are not set up."""
    try:
        from vllm.distributed import parallel_state as ps
        tp = ps.get_tensor_model_parallel_rank() if ps.model_parallel_is_initialized() else 0
        pp = ps.get_pp_group().rank_in_group if ps.model_parallel_is_initialized() else 0
        return int(tp), int(pp)
    except Exception:  # not initialized (a test, a single process)
        return 0, 0


class KvcConnector(KVConnectorBase_V1):
    """A vLLM v1 KV connector whose blocks live in a libkvcache store."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self._extra = extra
        tier = str(_opt(extra, "tier", "disk"))
        if tier not in ("disk", "host", "redis"):
            raise ValueError("kvcache.vllm: kvc_tier %r: \"disk\", \"host\" or \"redis\"" % tier)
        self._block_size = int(vllm_config.cache_config.block_size)
        groups = list(kv_cache_config.kv_cache_groups) if kv_cache_config is not None else []
        if len(groups) != 1:
            raise ValueError("kvcache.vllm: one KV cache group is supported, this model has %d "
                             "(the hybrid KV cache manager is not supported)" % len(groups))
        self._group = groups[0]
        self._layer_names = list(self._group.layer_names)
        pc = vllm_config.parallel_config
        self._tp_size = int(getattr(pc, "tensor_parallel_size", 1) or 1)
        self._pp_size = int(getattr(pc, "pipeline_parallel_size", 1) or 1)
        self._model = str(getattr(vllm_config.model_config, "model", "") or "")
        self._closers = []
        if role == KVConnectorRole.SCHEDULER:
            self._init_scheduler()
        else:
            self._init_worker()

    # ----------------------------------------------------------------- scope
    def _scope(self, tp_rank, pp_rank):
        """What a record's bytes depend on besides its tokens."""
        spec = self._group.kv_cache_spec
        layout = getattr(self._vllm_config.cache_config, "kv_cache_layout", None)
        mc = self._vllm_config.model_config
        parts = ["vllm-kv/1", "model=" + self._model,
                 "revision=%s" % (getattr(mc, "revision", None) or "-"),
                 "quantization=%s" % (getattr(mc, "quantization", None) or "-"),
                 "dtype=%s" % (getattr(mc, "dtype", None) or "-"),
                 "tp=%d/%d" % (tp_rank, self._tp_size), "pp=%d/%d" % (pp_rank, self._pp_size),
                 "layout=%s" % (getattr(layout, "name", layout) or "default"),
                 "block=%d" % self._block_size,
                 "spec=%s/%s/%s/%s" % (type(spec).__name__, getattr(spec, "num_kv_heads", "-"),
                                       getattr(spec, "head_size", "-"), getattr(spec, "dtype", "-")),
                 "page=%d" % int(getattr(spec, "page_size_bytes", 0))]
        if _opt(self._extra, "scope"):
            parts.append("user=" + str(_opt(self._extra, "scope")))
        return "|".join(parts)

    # ------------------------------------------------------ scheduler side
    def _init_scheduler(self):
        # A pool used only for its prefix keys (docs/prefix-cache.md): block_size
        # vLLM's, one layer of one head, one block of memory.
        cfg = PoolConfig()
        cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = 1, 1, 1, 8
        cfg.block_size, cfg.num_blocks = self._block_size, 1
        cfg.k_dtype = cfg.v_dtype = DTYPE_F32
        self._key_pool = Pool(cfg)
        pconf = PrefixConfig()
        seed = _opt(self._extra, "seed")
        try:
            seed_bytes = bytes.fromhex(seed) if seed else bytes(32)
        except (TypeError, ValueError):
            seed_bytes = b""
        if len(seed_bytes) != 32:
            raise ValueError("kvcache.vllm: kvc_seed %r: 64 hex digits (32 bytes)" % (seed,))
        pconf.set_seed(seed_bytes)
        self._key_pool.enable_prefix_cache(pconf, self._model or "vllm", extra_key_names=_EXTRA_KEYS)
        # Every rank stores its own shard: a block is a hit when every rank holds it.
        self._stores = []
        for pp in range(self._pp_size):
            for tp in range(self._tp_size):
                s, close = _open_store(self._extra, self._scope(tp, pp))
                self._stores.append(s)
                self._closers.append(close)
        self._reqs = {}  # req_id -> Request
        self._keys = {}  # req_id -> (n tokens hashed, keys)
        self._present = {}  # req_id -> set of block indices the stores hold
        self._lookup = {}  # req_id -> (first block after vLLM's own hit, hit blocks)
        self._saved = {}  # req_id -> blocks [0, n) saved or present
        self._pending_loads = []
        self._step = 0
        # Loads not yet confirmed by the workers' output, by step: step -> [(first block, _Load)].
        # A request any of whose blocks is being loaded there saves nothing until then (its
        # blocks may have been computed on a failed load: of its own, or of a request it shares
        # blocks with, on any rank).
        self._unconfirmed = {}
        self._finishing = {}  # req_id -> (Request, tokens computed): blocks held for last saves
        self._valid_upto = {}  # req_id -> first block a failed load invalidated

    def _request_keys(self, request, n_blocks):
        """The prefix keys of the request's first n_blocks full blocks."""
        have = self._keys.get(request.request_id)
        if have is not None and len(have) >= n_blocks:
            return have[:n_blocks]
        toks = list(request.all_token_ids[:n_blocks * self._block_size])
        lora = getattr(request, "lora_request", None)
        # Each part length-prefixed, so no two lists of names encode alike.
        enc = lambda parts: b"".join(len(p).to_bytes(4, "little") + p for p in parts)  # noqa: E731
        utf8 = lambda x: str(x).encode("utf-8", "surrogatepass")  # noqa: E731
        adapter = enc([utf8(getattr(lora, "lora_name", "") or ""), utf8(getattr(lora, "lora_path", "") or "")]) \
            if lora else b""
        media = enc([utf8(getattr(f, "identifier", "")) for f in (getattr(request, "mm_features", None) or ())])
        salt = getattr(request, "cache_salt", None)
        keys = self._key_pool.prefix_keys(toks, salt=utf8(salt) if salt else b"", adapter=adapter, media=media)
        self._keys[request.request_id] = keys
        return keys

    def _contains(self, keys):
        """[bool] per key: held by every rank's store (a store that fails answers misses)."""
        if not keys:
            return []
        out = [True] * len(keys)
        for s in self._stores:
            try:
                got = s.contains(keys)
            except (KvcError, OSError) as e:
                _log.warning("kvcache.vllm: contains failed (%s): counted as misses", e)
                return [False] * len(keys)
            out = [a and b for a, b in zip(out, got)]
        return out

    @staticmethod
    def _cacheable(request):
        return getattr(request, "prompt_embeds", None) is None

    def on_new_request(self, request):
        self._reqs[request.request_id] = request

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        rid = request.request_id
        self._reqs[rid] = request
        bs = self._block_size
        if not self._cacheable(request):
            self._lookup[rid] = (0, 0)
            return 0, False
        # Whole blocks only, and never the last token (vLLM computes at least one).
        n_blocks = max(int(request.num_tokens) - 1, 0) // bs
        start = int(num_computed_tokens) // bs
        try:
            keys = self._request_keys(request, n_blocks)
        except Exception as e:  # a salt or adapter the keys refuse: this request is not cached
            _log.warning("kvcache.vllm: request %s is not cached: %s", rid, e)
            self._reqs.pop(rid, None)
            self._lookup[rid] = (0, 0)
            return 0, False
        held = self._contains(keys)
        self._present[rid] = {i for i, h in enumerate(held) if h}
        hits = 0
        for i in range(start, n_blocks):
            if not held[i]:
                break
            hits += 1
        self._lookup[rid] = (start, hits)
        self._saved[rid] = 0
        return hits * bs, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens <= 0:
            return
        rid = request.request_id
        start, hits = self._lookup.get(rid, (0, 0))
        n = min(int(num_external_tokens) // self._block_size, hits)
        if n <= 0:
            return
        block_ids = list(blocks.get_block_ids()[0])
        keys = self._keys[rid]
        self._pending_loads.append(_Load(rid, list(keys[start:start + n]), block_ids[start:start + n]))

    def _block_ids(self, rid, fallback):
        km = self._kv_cache_manager
        if km is not None:
            try:
                return list(km.get_block_ids(rid)[0])
            except Exception:  # not allocated (any more)
                return []
        return list(fallback or [])

    def _loading_blocks(self):
        return set(b for loads in self._unconfirmed.values() for _, ld in loads for b in ld.block_ids)

    def _plan_saves(self, rid, computed_after, fallback_block_ids, loading, last=False):
        """The step's save of request rid: its full blocks computed by the end of the step that the
        store does not hold. None when there is none, or while a block of the request is being
        loaded in an unconfirmed step (planned later, from the same mark)."""
        request = self._reqs.get(rid)
        if request is None or not self._cacheable(request):
            return None
        full = min(int(computed_after), int(request.num_tokens)) // self._block_size
        if last and rid in self._valid_upto:
            full = min(full, self._valid_upto[rid])
        elif not last:
            self._valid_upto.pop(rid, None)  # vLLM recomputes what a failed load invalidated
        first = self._saved.get(rid, 0)
        if full <= first:
            return None
        block_ids = self._block_ids(rid, fallback_block_ids)
        full = min(full, len(block_ids))
        if loading and any(b in loading for b in block_ids[:full]):
            return None
        try:
            keys = self._request_keys(request, full)
        except Exception as e:
            _log.warning("kvcache.vllm: request %s is not saved: %s", rid, e)
            return None
        present = self._present.get(rid, set())
        todo = [i for i in range(first, full) if i not in present]
        self._saved[rid] = full
        if not todo:
            return None
        return _Save(rid, [keys[i] for i in todo], [block_ids[i] for i in todo])

    def build_connector_meta(self, scheduler_output):
        self._step += 1
        meta = KvcConnectorMetadata(step=self._step)
        meta.loads, self._pending_loads = self._pending_loads, []
        # Loads of steps the workers' output never confirmed (an older engine loop): given up on
        # after 64 steps, so no request waits for ever.
        for old in [st for st in self._unconfirmed if st < self._step - 64]:
            _log.warning("kvcache.vllm: step %d's loads were never confirmed", old)
            del self._unconfirmed[old]
        loading = self._loading_blocks() | set(b for ld in meta.loads for b in ld.block_ids)
        if meta.loads:
            self._unconfirmed[self._step] = [(self._lookup.get(ld.req_id, (0, 0))[0], ld) for ld in meta.loads]
        nst = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            sv = self._plan_saves(new.req_id, new.num_computed_tokens + nst.get(new.req_id, 0),
                                  new.block_ids[0] if new.block_ids else [], loading)
            if sv is not None:
                meta.saves.append(sv)
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            nb = cached.new_block_ids[i]
            sv = self._plan_saves(rid, cached.num_computed_tokens[i] + nst.get(rid, 0), nb[0] if nb else [],
                                  loading)
            if sv is not None:
                meta.saves.append(sv)
        # Finished requests whose blocks vLLM holds for their last saves (request_finished).
        for rid in list(self._finishing):
            request, computed = self._finishing[rid]
            if any(b in loading for b in self._block_ids(rid, [])):
                continue  # a load they may depend on is not confirmed yet
            sv = self._plan_saves(rid, computed, [], loading, last=True) or _Save(rid, [], [])
            sv.last = True
            meta.saves.append(sv)
            del self._finishing[rid]
            self._forget(rid)
        return meta

    def update_connector_output(self, connector_output):
        """The workers ran the steps their metadata names; the blocks of vLLM's invalid_block_ids
        failed to load. A request holding a failed block (its own load's, or one it shares) saves
        again from there once vLLM has recomputed it; a finished one saves only the blocks before."""
        wm = getattr(connector_output, "kv_connector_worker_meta", None)
        steps = wm.steps if isinstance(wm, KvcWorkerMetadata) else set()
        for st in steps:
            self._unconfirmed.pop(st, None)
        bad = set(getattr(connector_output, "invalid_block_ids", None) or ())
        if not bad:
            return
        for rid in set(self._reqs) | set(self._finishing):
            blocks = self._block_ids(rid, [])
            hit = [i for i, b in enumerate(blocks) if b in bad]
            if not hit:
                continue
            i0 = hit[0]
            if rid in self._present:
                self._present[rid] = {i for i in self._present[rid] if i < i0}
            self._saved[rid] = min(self._saved.get(rid, 0), i0)
            self._valid_upto[rid] = min(self._valid_upto.get(rid, i0), i0)

    def _forget(self, rid):
        for d in (self._reqs, self._keys, self._present, self._lookup, self._saved, self._valid_upto):
            d.pop(rid, None)

    def request_finished(self, request, block_ids):
        """True (vLLM keeps the blocks) while blocks computed by the request still await their save,
        deferred behind an unconfirmed load; the workers report it in finished_sending once written."""
        rid = request.request_id
        self._pending_loads = [ld for ld in self._pending_loads if ld.req_id != rid]
        computed = min(int(getattr(request, "num_computed_tokens", 0)), int(request.num_tokens))
        full = min(computed // self._block_size, self._valid_upto.get(rid, 1 << 62))
        present = self._present.get(rid, set())
        if rid in self._reqs and self._cacheable(request) and \
                any(i not in present for i in range(self._saved.get(rid, 0), full)):
            self._finishing[rid] = (request, computed)
            return True, None
        self._forget(rid)
        return False, None

    @property
    def requires_kv_delivery(self):
        return False  # a best-effort cache: a save that never happens is a later miss

    # -------------------------------------------------------- worker side
    def _init_worker(self):
        tp, pp = _parallel_rank()
        self._store, close = _open_store(self._extra, self._scope(tp, pp))
        self._closers.append(close)
        self._kv_caches = {}
        self._page_bytes = []  # per layer, in _layer_names order
        self._ratios = {}  # layer -> kernel blocks per scheduler block
        self._record_bytes = 0
        self._staged = {}  # layer -> [n saves, page bytes] uint8 on the CPU
        self._load_errors = set()
        self._failed_reqs = set()  # requests whose load failed in this step
        self._ran_steps = set()  # steps whose metadata was bound since the last worker metadata
        self._done_sending = set()  # finished requests whose last saves are written
        self.stats = {"blocks_loaded": 0, "blocks_saved": 0, "load_failures": 0, "save_failures": 0}

    def register_kv_caches(self, kv_caches):
        names = [n for n in self._layer_names if n in kv_caches]
        if not names:
            raise ValueError("kvcache.vllm: none of the KV cache group's layers was registered")
        page = int(getattr(self._group.kv_cache_spec, "page_size_bytes", 0) or 0)
        sizes, ratios = [], []
        for n in names:
            t = kv_caches[n]
            if not isinstance(t, _torch.Tensor) or t.dim() < 2:
                raise ValueError("kvcache.vllm: layer %s: expected a [blocks, ...] tensor" % n)
            kernel_page = t[0].numel() * t.element_size()
            # vLLM may split a scheduler block into kernel blocks (virtual block splitting):
            # block b is then rows [b * r, (b + 1) * r) of the layer.
            r = page // kernel_page if page and kernel_page and page % kernel_page == 0 else 1
            sizes.append(kernel_page * r)
            ratios.append(r)
        self._layer_names = names
        self._kv_caches = {n: kv_caches[n] for n in names}
        self._page_bytes = sizes
        self._ratios = dict(zip(names, ratios))
        self._record_bytes = sum(sizes)

    @staticmethod
    def _bytes_of(t):
        """A [n, bytes] uint8 view of a [n, ...] tensor (a contiguous copy where needed)."""
        return t.contiguous().reshape(t.shape[0], -1).view(_torch.uint8)

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._connector_metadata
        if not isinstance(meta, KvcConnectorMetadata) or not meta.loads or not self._kv_caches:
            return
        buf = _torch.empty(self._record_bytes, dtype=_torch.uint8)
        for ld in meta.loads:
            for j, (key, bid) in enumerate(zip(ld.keys, ld.block_ids)):
                try:
                    n = self._store.get_into(key, buf)
                except (KvcError, OSError) as e:
                    _log.warning("kvcache.vllm: load of %s failed (%s)", ld.req_id, e)
                    n = -1
                if n != self._record_bytes:
                    # This block and the request's later ones are vLLM's to recompute, and what
                    # this step's forward computes for the request (on a wrong context) is not saved.
                    self._load_errors.update(ld.block_ids[j:])
                    self._failed_reqs.add(ld.req_id)
                    self.stats["load_failures"] += 1
                    break
                off = 0
                for name, pb in zip(self._layer_names, self._page_bytes):
                    r = self._ratios[name]
                    dst = self._kv_caches[name][bid * r:(bid + 1) * r]
                    src = buf[off:off + pb].view(dst.dtype).view(dst.shape)
                    dst.copy_(src, non_blocking=False)
                    off += pb
                self.stats["blocks_loaded"] += 1

    def wait_for_layer_load(self, layer_name):
        return  # loads are synchronous (start_load_kv)

    def _gather(self, name, layer, saves):
        """[n save blocks, page bytes] uint8 on the CPU: the layer's save blocks."""
        r = self._ratios[name]
        ids = [b * r + i for sv in saves for b in sv.block_ids for i in range(r)]
        idx = _torch.tensor(ids, dtype=_torch.long, device=layer.device)
        rows = self._bytes_of(layer.index_select(0, idx)).to("cpu")
        return rows.reshape(len(ids) // r, -1)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        meta = self._connector_metadata
        if not isinstance(meta, KvcConnectorMetadata) or layer_name not in self._kv_caches or \
                not any(sv.block_ids for sv in meta.saves):
            return
        self._staged[layer_name] = self._gather(layer_name, kv_layer, meta.saves)

    def wait_for_save(self):
        meta = self._connector_metadata
        staged, self._staged = self._staged, {}
        failed, self._failed_reqs = self._failed_reqs, set()
        if not isinstance(meta, KvcConnectorMetadata) or not meta.saves:
            return
        if self._kv_caches and any(sv.keys for sv in meta.saves):
            # Saves are never planned in the step that loads a request's blocks (nor those of a
            # request sharing them); a failed load's request is skipped here all the same.
            cols = [staged[n] if n in staged else self._gather(n, self._kv_caches[n], meta.saves)
                    for n in self._layer_names]
            records = _torch.cat(cols, dim=1)  # [n saves, record bytes]
            row = 0
            for sv in meta.saves:
                for key in sv.keys:
                    if sv.req_id not in failed:
                        try:
                            self._store.put(key, records[row])
                            self.stats["blocks_saved"] += 1
                        except (KvcError, OSError) as e:  # a lost save is a later miss
                            _log.warning("kvcache.vllm: save of %s failed (%s)", sv.req_id, e)
                            self.stats["save_failures"] += 1
                    row += 1
        self._done_sending.update(sv.req_id for sv in meta.saves if sv.last)

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        if isinstance(connector_metadata, KvcConnectorMetadata) and self._role == KVConnectorRole.WORKER:
            self._ran_steps.add(connector_metadata.step)

    def build_connector_worker_meta(self):
        steps, self._ran_steps = self._ran_steps, set()
        return KvcWorkerMetadata(steps) if steps else None

    def get_finished(self, finished_req_ids):
        done, self._done_sending = self._done_sending, set()
        return (done or None), None

    def get_block_ids_with_load_errors(self):
        out, self._load_errors = self._load_errors, set()
        return out

    # ------------------------------------------------------------- common
    def tier_stats(self):
        """The store's counters (kvcache.TierStats) of this side (rank 0's on the scheduler)."""
        s = self._store if self._role == KVConnectorRole.WORKER else self._stores[0]
        return s.stats()

    def shutdown(self):
        closers, self._closers = self._closers, []
        for c in closers:
            try:
                c()
            except Exception:  # closing twice, a store already gone
                pass
