"""Hugging Face transformers on libkvcache: a paged ``Cache`` and a paged
attention backend.

``PagedCache(model.config, strategy="int8:per-token")`` is a transformers
``Cache`` whose layers keep their K/V in one ``kvcache.Pool``: the strategy
is exactly ``kvcache eval``'s (docs/eval.md, parsed by the same code), so the
best row of an eval table is copied into a program as is. After
``import kvcache.hf``, ``attn_implementation="kvcache"`` runs
``kvc_attention_prefill`` / ``kvc_attention_decode`` over the pool's blocks
(quantized or not), so the K/V history is never materialised as dense
tensors; with sdpa or eager attention the cache returns dense K/V instead.

Works with ``model.generate`` (greedy, sampling, beam search) and plain
forward loops on transformers 5.2.x and 5.24; docs/hf.md maps every Cache
method to the library. ``KvcPress`` offers our eviction policies as a kvpress
press, and kvpress's own presses run on a PagedCache (the tokens they keep
are found by matching rows and the others dropped in the pool with
``kvc_seq_keep``).
"""

import threading
import weakref

import numpy as _np
import torch
import transformers
from transformers.cache_utils import Cache, CacheLayerMixin

from . import native as _native
from . import KvcError, builtin_head_gates, load_head_gates, parse_strategy
from ._hf_setup import (_PROTO_NONE, _PROTO_PREFILL, _PROTO_STREAM, _codebooks_of, _geometry, _key_smoothing_of,  # noqa: F401
                        _plain_rope_or_raise, _policy, _stream_cap, _text_config, streaming_heads)

__all__ = ["PagedCache", "PagedLayer", "KvcPress", "kvcache_attention", "kvcache_mask", "ATTN_IMPLEMENTATION",
           "load_head_gates", "streaming_heads"]

ATTN_IMPLEMENTATION = "kvcache"

# transformers >= 5.3 changed the Cache API: crop(tokens_to_remove),
# get_mask_sizes(query_length), get_max_length(), the `cache` keyword.
_NEW_CACHE_API = hasattr(Cache, "get_query_offset")

_TORCH_TO_KVC = {torch.float32: _native.DTYPE_F32, torch.float16: _native.DTYPE_F16, torch.bfloat16: _native.DTYPE_BF16}

class PagedLayer(CacheLayerMixin):
    """One layer of a PagedCache: a view of the pool's layer ``layer_idx``.

    ``keys`` / ``values`` read the layer's K/V as dense ``[batch, kv_heads,
    tokens, head_dim]`` tensors (gathered from the pool, for code that reads
    them, such as kvpress); assigning a subset of those rows (what a kvpress
    press does) keeps exactly those tokens in the pool (kvc_seq_keep) and
    frees the rest."""

    is_compileable = False
    is_sliding = False
    is_croppable = True
    supports_early_init = False

    def __init__(self, cache, layer_idx):
        # CacheLayerMixin.__init__ assigns keys / values: not called.
        self._cache_ref = weakref.ref(cache)
        self.layer_idx = layer_idx
        self._dense = None  # (version, keys, values) last read, for the kvpress bridge
        self._new_keys = None

    def __repr__(self):
        return "PagedLayer(%d)" % self.layer_idx

    @property
    def _cache(self):
        c = self._cache_ref()
        if c is None:
            raise RuntimeError("the PagedCache of this layer was deleted")
        return c

    @property
    def is_initialized(self):
        return self._cache._seqs is not None

    @is_initialized.setter
    def is_initialized(self, value):  # transformers' reset paths assign it
        pass

    @property
    def device(self):
        return torch.device("cpu")

    @property
    def dtype(self):
        return self._cache._dtype or torch.float32

    def lazy_initialization(self, key_states, value_states):
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        return self._cache._update(key_states, value_states, self.layer_idx)

    def get_seq_length(self):
        return self._cache._layer_length(self.layer_idx)

    def get_mask_sizes(self, query_length_or_cache_position):
        """(kv_length, kv_offset) of the mask of a pass of q positions: kv_length = the tokens held
        once the pass has appended (after the eviction due and the stream cap's automatic one), and
        kv_offset the tokens that eviction drops, so that key j sits at index j + kv_offset against
        queries at get_query_offset() + i: every held token before the pass is visible, and the
        pass's own positions causally. transformers < 5.3 passes the pass's cache_position and
        places queries at those text positions instead: kv_offset is then first position - held
        (never below 0: a cache_position short of the tokens held sizes the mask as DynamicCache does)."""
        q = query_length_or_cache_position
        if isinstance(q, torch.Tensor):
            first, q = (int(q[0]) if q.numel() else 0), int(q.shape[0])
        else:
            first, q = None, int(q)
        now, after = self._cache._held_before_pass(self.layer_idx, q)
        return after + q, max(0, (now if first is None else first) - after)

    def get_max_cache_shape(self):
        return -1

    def get_max_length(self):
        return -1

    def offload(self):
        pass

    def prefetch(self):
        pass

    def reset(self):
        self._dense = None

    # Batch-wide operations run once, on the cache (these are no-ops so that
    # transformers' per-layer loops do not repeat them).
    def reorder_cache(self, beam_idx):
        pass

    def crop(self, n):
        pass

    def batch_repeat_interleave(self, repeats):
        pass

    def batch_select_indices(self, indices):
        pass

    @property
    def keys(self):
        k, _ = self._read_dense()
        return k

    @keys.setter
    def keys(self, new):
        if new is None:
            return
        self._new_keys = new

    @property
    def values(self):
        _, v = self._read_dense()
        return v

    @values.setter
    def values(self, new):
        if new is None:
            return
        k = self._new_keys
        self._new_keys = None
        if k is None:
            raise ValueError("PagedLayer: assign keys before values (as kvpress does)")
        self._cache._assign_subset(self.layer_idx, k, new, self._dense)
        self._dense = None

    def _read_dense(self):
        cache = self._cache
        if cache._seqs is None:
            return None, None
        if self._dense is None or self._dense[0] != cache._version:
            k, v = cache._dense(self.layer_idx)
            self._dense = (cache._version, k, v)
        # A copy: a press that edits what it read in place (ThinK) then assigns rows that are not
        # the layer's, which the assignment refuses, instead of silently changing nothing.
        return self._dense[1].clone(), self._dense[2].clone()


class PagedCache(Cache):
    """A transformers Cache whose K/V live in one libkvcache pool.

    Args:
        config: the model's config (``model.config``; a Llama-architecture
            decoder: num_hidden_layers, num_attention_heads,
            num_key_value_heads, head_dim or hidden_size).
        strategy: a ``kvcache eval`` strategy (docs/eval.md): a codec
            (``f32``, ``f16``, ``bf16``, ``int8:per-token``, ``int4:group=32``,
            ``kivi2``, ``k-int4:...+v-int8:...``) and optionally a policy
            (``streaming``, ``window``, ``h2o``, ``tova``, ``snapkv``,
            ``pyramidkv``, ``knorm``, ``expected-attention``, ``kvzip``, ``duo-attention``; ``adakv+``
            or ``:headwise`` for head-wise pools). Policies that read attention
            or queries (h2o, tova, snapkv, expected-attention, pyramidkv, kvzip) need
            ``attn_implementation="kvcache"``; kvzip also needs reconstruct_context() after the
            prefill. StreamingLLM
            and window keep text positions here (``keep-positions``):
            transformers rotates queries at their text positions.
        block_size: tokens per block (default the strategy's, 16).
        num_blocks / pool_bytes: the pool's capacity; neither: the cache
            sizes its pool at the first forward pass and grows it (moving
            the sequences into a pool twice as large) when it fills.
        threads: threads of decode and prefill attention (default torch's).
        prefix_cache: share prompt prefixes across requests
            (``attach_prefix`` / ``register_prefix``; docs/prefix-cache.md).
        tiers: offload tiers below the prefix cache, a list of dicts
            ``{"kind": "host"|"disk"|"redis", "capacity_bytes": N, "path": ...,
            "address": ...}`` (docs/tiers.md); needs prefix_cache.
        context: the context length a ``budget=F`` of a streaming-protocol
            policy (streaming, window, h2o, tova) is a fraction of (eval's
            ctx); default the length of the first forward pass (the prompt).
        model_id: the prefix cache's model identity (default config.name_or_path).
        prefix_seed: 32 bytes seeding the prefix cache's block keys; pools
            (and processes) that share tier blocks need the same seed.
            Default: random per pool without tiers; with tiers, derived from
            model_id and the strategy (so a new process finds the blocks).
        head_gates: DuoAttention's per-head gates, taken only by
            ``duo-attention`` strategies: a gates file (load_head_gates()) or
            num_layers x num_kv_heads numbers in [0, 1], layer by layer;
            default: the gates the package ships for SmolLM2-135M and
            stories260K (builtin_head_gates(); bench/duo), a ValueError for
            other models. The strategy's ``heads=F`` streams the share F with
            the lowest gates (streaming_heads()).
        key_stats: per-channel key statistics for ``smooth`` strategies
            (key smoothing, docs/codecs.md): a file ``kvcache calibrate``
            wrote (load_key_stats()) or its dict; default: the statistics the
            package ships for SmolLM2-135M and stories260K
            (builtin_key_stats(); bench/calib), a ValueError for other
            models. Their channels are reordered to Hugging Face's RoPE
            pairs (i, i + head_dim / 2).
        codebooks: the levels of ``codebook=fit`` parts: a file
            ``kvcache calibrate --codebook STRATEGY -o FILE`` wrote, or
            load_codebooks()'s list; each such part takes the entry of the
            same part, bits, group and layers (docs/codecs.md "Codebooks").
            A ValueError without one, or when no part is ``codebook=fit``.

    Raises ValueError for a config it cannot hold, a malformed strategy
    (the parser's message) or bad options; kvcache.KvcError for the
    library's refusals (a pool too small for the prompt says how many
    blocks it needs)."""

    def __init__(self, config, strategy="f16", *, block_size=None, num_blocks=None, pool_bytes=None, threads=None,
                 prefix_cache=False, tiers=None, context=None, model_id=None, prefix_seed=None, head_gates=None,
                 key_stats=None, codebooks=None):
        self._layers_n, self._hq, self._hk, self._hd, self._theta = _geometry(config)
        try:
            self._st = parse_strategy(str(strategy))
        except KvcError as e:
            raise ValueError(e.message) from None
        st = self._st
        self.strategy = st.spec
        attn = getattr(config, "_attn_implementation", None)
        self._paged_attention = attn == ATTN_IMPLEMENTATION
        self._gates = None
        if st.policy_kind == _native.POLICY_DUO_ATTENTION:
            if head_gates is None:  # the gates shipped for the models kvcache eval knows
                c = _text_config(config)
                head_gates = builtin_head_gates(self._layers_n, self._hq, self._hk,
                                                getattr(c, "hidden_size", None))
                if head_gates is None:
                    raise ValueError("PagedCache: strategy '%s' needs DuoAttention's per-head gates for this "
                                     "model (built in for SmolLM2-135M and stories260K only): head_gates= a gates "
                                     "file (bench/duo/derive_gates.py derives one) or %d x %d numbers in [0, 1]"
                                     % (st.spec, self._layers_n, self._hk))
            if isinstance(head_gates, (str, bytes)) or hasattr(head_gates, "__fspath__"):
                gates = load_head_gates(head_gates)
            else:
                try:
                    if hasattr(head_gates, "detach"):  # a torch tensor (any dtype, grad or not)
                        head_gates = head_gates.detach().cpu().double().numpy()
                    gates = [float(g) for g in _np.asarray(head_gates, dtype=_np.float64).reshape(-1)]
                except (TypeError, ValueError, RuntimeError):
                    raise ValueError("PagedCache: head_gates must be a gates file or numbers, got %r"
                                     % (type(head_gates).__name__,)) from None
                if not all(0.0 <= g <= 1.0 for g in gates):
                    raise ValueError("PagedCache: head_gates must be in [0, 1] (NaN excluded)")
            if len(gates) != self._layers_n * self._hk:
                raise ValueError("PagedCache: %d head_gates for a model of %d layers x %d KV heads (%d)"
                                 % (len(gates), self._layers_n, self._hk, self._layers_n * self._hk))
            streaming_heads(gates, st.duo_stream_share, st.duo_stream_head)  # stream-head=I in range
            self._gates = gates
        elif head_gates is not None:
            raise ValueError("PagedCache: head_gates are DuoAttention's; strategy '%s' does not take them" % st.spec)
        self._smoothing = _key_smoothing_of(config, st, key_stats, self._layers_n, self._hq, self._hk, self._hd)
        self._codebooks = _codebooks_of(st, self._layers_n, self._hd, codebooks)
        if st.headwise and not self._paged_attention:
            raise ValueError("PagedCache: strategy '%s' keeps different tokens in each KV head (a head-wise "
                             "pool); load the model with attn_implementation=\"kvcache\" (after import "
                             "kvcache.hf), not %r" % (st.spec, attn))
        if (st.observe != _native.OBSERVE_NONE or st.reconstruct) and not self._paged_attention:
            raise ValueError("PagedCache: strategy '%s' reads attention scores or queries; load the model with "
                             "attn_implementation=\"kvcache\" (after import kvcache.hf), not %r" % (st.spec, attn))
        _plain_rope_or_raise(config, st, "PagedCache")
        if num_blocks is not None and pool_bytes is not None:
            raise ValueError("PagedCache: give num_blocks or pool_bytes, not both")
        for name, val in (("num_blocks", num_blocks), ("pool_bytes", pool_bytes), ("block_size", block_size),
                          ("context", context)):
            if val is not None and (not isinstance(val, int) or isinstance(val, bool) or val <= 0):
                raise ValueError("PagedCache: %s must be a positive int, got %r" % (name, val))
        if tiers and not prefix_cache:
            raise ValueError("PagedCache: tiers hold prefix-cache blocks: set prefix_cache=True")
        if block_size is not None and block_size != st.block_size and st.block_size != 16:
            raise ValueError("PagedCache: strategy '%s' needs block_size %d" % (st.spec, st.block_size))
        self._block_size = block_size or st.block_size
        self._num_blocks, self._pool_bytes = num_blocks, pool_bytes
        if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or
                                    not 1 <= threads <= 256):
            raise ValueError("PagedCache: threads must be an int in 1..256, got %r" % (threads,))
        self._threads = threads if threads else max(1, min(256, torch.get_num_threads()))
        self._prefix, self._tiers = bool(prefix_cache), list(tiers or [])
        self._context = context
        self._model_id = model_id or getattr(config, "name_or_path", None) or "hf-model"
        if prefix_seed is not None and (not isinstance(prefix_seed, (bytes, bytearray)) or len(prefix_seed) != 32):
            raise ValueError("PagedCache: prefix_seed must be 32 bytes")
        if prefix_seed is None and self._tiers:
            import hashlib

            prefix_seed = hashlib.sha256(("kvcache.hf|%s|%s" % (self._model_id, st.spec)).encode()).digest()
        self._prefix_seed = bytes(prefix_seed) if prefix_seed is not None else None
        self._pool = None
        self._policy = None
        self._cap = 0  # a stream policy's per-layer cap (tokens), once the policy exists
        self._seqs = None  # sequence id per batch row
        self._next_id = 1
        self._version = 0  # bumped by every change of the pool's contents
        self._dtype = None
        self._pos0 = None  # per row: the first position of the current forward pass
        self._forward_q = 0  # tokens per row of the current forward (0: between passes)
        self._prefilled = False
        self._evict_pending = False
        self._evicted = set()  # rows the due eviction has done (a later row may refuse)
        self._reconstructing = False  # kvzip: a reconstruction pass runs on forks (observe max, no eviction)
        self._hidden_rows = []  # the rows while a reconstruction pass runs on their forks
        self._lock = threading.RLock()
        layers = [PagedLayer(self, i) for i in range(self._layers_n)]
        super().__init__(layers=layers)
        if num_blocks is not None or pool_bytes is not None:
            self._make_pool(num_blocks, pool_bytes)

    # ---------------------------------------------------------------- pool
    def _pool_config(self, blocks, nbytes):
        st = self._st
        c = _native.PoolConfig()
        c.num_layers, c.num_q_heads, c.num_kv_heads, c.head_dim = self._layers_n, self._hq, self._hk, self._hd
        c.block_size = self._block_size
        c.k_dtype, c.v_dtype = st.k_dtype, st.v_dtype
        if blocks:
            c.num_blocks = int(blocks)
        else:
            c.capacity_bytes = int(nbytes)
        c.residual_window = st.residual_window
        c.residual_fraction = st.residual_fraction
        c.residual_sinks = st.residual_sinks
        c.residual_dtype = st.residual_dtype
        c.rope_style = _native.ROPE_NEOX  # Hugging Face Llama rotates halves
        c.rope_theta = self._theta
        if st.pre_rope_keys:
            c.flags = c.flags | _native.POOL_PRE_ROPE_KEYS
        if st.headwise:
            c.flags = c.flags | _native.POOL_HEADWISE
        return c

    def _make_pool(self, blocks, nbytes=None):
        st = self._st
        cfg = self._pool_config(blocks, nbytes)
        k = st.k_codec if st.k_quantized else None
        v = st.v_codec if st.v_quantized else None
        if len(st.layer_ids):  # per-layer codecs (BASE@LAYERS=CODECS)
            pool = _native.pool_with_layer_codecs(cfg, st)
        else:
            pool = _native.Pool(cfg, k, v)
        if self._smoothing is not None:
            pool.set_key_smoothing(*self._smoothing)
        for part, levels in self._codebooks:
            pool.set_codebook(part, levels)
        if self._prefix:
            pc = _native.PrefixConfig()
            if self._prefix_seed is not None:
                pc.set_seed(self._prefix_seed)
            pool.enable_prefix_cache(pc, str(self._model_id))
            kinds = {"host": _native.TIER_HOST, "disk": _native.TIER_DISK, "redis": _native.TIER_REDIS}
            for t in self._tiers:
                t = dict(t)
                kind = kinds.get(t.pop("kind", None))
                if kind is None:
                    raise ValueError("PagedCache: a tier's kind must be host, disk or redis")
                pool.add_tier(kind, int(t.pop("capacity_bytes", 1 << 30)), str(t.pop("path", "")),
                              str(t.pop("address", "")), int(t.pop("flags", 0)), int(t.pop("timeout_ms", 1000)),
                              int(t.pop("ttl_seconds", 0)))
                if t:
                    raise ValueError("PagedCache: unknown tier options %s" % sorted(t))
        self._pool = pool
        return pool

    def _blocks_for(self, rows, tokens):
        per_layer = -(-tokens // self._block_size)
        tables = self._layers_n * (self._hk if self._st.headwise else 1)  # head-wise: a table per KV head
        return rows * tables * per_layer

    def _ensure_pool(self, rows, tokens):
        if self._pool is None:
            self._make_pool(self._blocks_for(rows, max(tokens + 256, 512)))

    def _grow(self, need_blocks):
        """Moves every sequence into a pool at least twice as large (records:
        kvc_seq_save / kvc_seq_restore; forks are copied). Only for a cache
        that sizes its own pool."""
        if self._num_blocks is not None or self._pool_bytes is not None:
            return False
        old = self._pool
        total = old.stats().blocks_total
        records = [(sid, old.save(sid)) for sid in list(self._seqs) + self._hidden_rows]
        new = self._make_pool(max(2 * total, total + need_blocks))
        for sid, rec in records:
            new.restore(sid, rec)
            if self._policy is not None and self._st.protocol == _PROTO_STREAM and self._prefilled:
                new.seq_set_policy(sid, self._policy)
        old.close()
        self._version += 1
        return True

    @property
    def pool(self):
        """The kvcache.Pool (None before the first forward pass of a self-sized cache)."""
        return self._pool

    # ---------------------------------------------------------------- rows
    def _new_id(self):
        sid = self._next_id
        self._next_id += 1
        return sid

    def _start_rows(self, rows):
        self._seqs = []
        for _ in range(rows):
            sid = self._new_id()
            self._pool.seq_create(sid)
            self._seqs.append(sid)

    def _make_policy(self, first_len):
        if self._st.protocol == _PROTO_NONE:
            return None
        policy = _policy(self._st, self._context or first_len, auto_evict=True, gates=self._gates)
        if self._st.protocol == _PROTO_STREAM and self._st.policy_kind != _native.POLICY_DUO_ATTENTION:
            self._cap = max(1, _stream_cap(self._st, self._context or first_len))
        return policy

    def _begin_forward(self, counts, dtype):
        """Layer 0 of a forward pass: evict if a policy is due, reserve `counts[b]` positions per row."""
        rows = len(counts)
        if self._dtype is None:
            self._dtype = dtype
        fresh = self._seqs is None
        if fresh:
            policy = self._make_policy(max(counts))  # may refuse the strategy: before any row exists
            self._ensure_pool(rows, max(counts))
            self._start_rows(rows)
            self._policy = policy
        elif rows != len(self._seqs):
            raise ValueError("PagedCache: a forward pass of batch %d on a cache of batch %d (reset() first, or "
                             "use reorder_cache / batch_select_indices)" % (rows, len(self._seqs)))
        elif self._policy is None and self._st.protocol != _PROTO_NONE:  # rows made by attach_prefix
            self._policy = self._make_policy(max(counts) + self._pool.seq_length(self._seqs[0]))
        self._evict_due()
        pos0 = [self._pool.seq_length(sid) for sid in self._seqs]
        done = []
        try:
            for sid, n in zip(self._seqs, counts):
                self._reserve(sid, int(n))
                done.append(sid)
        except Exception:
            for sid, p in zip(done, pos0):  # nothing half-applied: undo the reservations made
                self._pool.seq_truncate(sid, p)
            raise
        self._pos0 = pos0
        self._forward_q = max(counts)
        self._forward_prefill = fresh or not self._prefilled
        self._version += 1

    def _evict_due(self):
        """The eviction due after a prefill (eval's protocol: the first step after it evicts); for a
        stream policy, the cap then holds on every reservation (auto_evict)."""
        if not self._evict_pending or self._seqs is None or self._policy is None:
            return
        for sid in self._seqs:  # a refusal (kvzip before its reconstruction) leaves it due
            if sid not in self._evicted:  # rows evicted before a later row's refusal: not twice
                self._pool.evict(sid, self._policy)
                self._evicted.add(sid)
        self._evict_pending = False
        self._evicted = set()
        if self._st.protocol == _PROTO_STREAM:
            for sid in self._seqs:
                self._pool.seq_set_policy(sid, self._policy)

    def _held_before_pass(self, layer, q):
        """(tokens the layer holds now, tokens it will hold when a pass of q positions has reserved
        them, before the new ones): a stream policy's reservation first evicts each row down to
        cap - q (auto_evict; src/core/evict.cpp), every layer alike."""
        with self._lock:
            self._evict_due()
            now = self._layer_length(layer)
            if not now or self._policy is None or self._st.protocol != _PROTO_STREAM or not self._cap:
                return now, now
            after = []
            for sid in self._seqs:
                n = self._pool.layer_tokens(sid, layer)
                after.append(min(n, max(self._cap - q, 1)) if n + q > self._cap else n)
            return now, max(after)

    def _reserve(self, sid, n):
        if n == 0:
            return
        while True:
            try:
                self._pool.reserve(sid, n)
                return
            except KvcError as e:
                if e.status not in (_native.ERR_POOL_EXHAUSTED, _native.ERR_EXCEEDS_CAPACITY):
                    raise
                need = self._blocks_for(1, n + self._block_size)
                if not self._grow(need):
                    st = self._pool.stats()
                    raise KvcError(e.status, "%s (the cache needs about %d more blocks for %d tokens; pool of "
                                   "%d blocks, %d free: raise num_blocks / pool_bytes)"
                                   % (e.message, need, n, st.blocks_total, st.blocks_free)) from None

    def _abort_forward(self):
        """A forward pass that raised: every row back to where the pass began (all layers), so a
        failed pass leaves nothing behind (kvc_seq_truncate)."""
        if self._pos0 is not None and self._seqs is not None and self._forward_q:
            for sid, p in zip(self._seqs, self._pos0):
                try:
                    self._pool.seq_truncate(sid, p)
                except KvcError:
                    pass
        self._forward_q = 0
        self._version += 1

    def _end_forward(self, layer):
        if layer != self._layers_n - 1:
            return
        if self._forward_prefill and self._st.protocol != _PROTO_NONE:
            self._evict_pending = True  # as eval: the first step after the prefill evicts
        self._prefilled = True
        self._forward_q = 0

    def _rows_kv(self, t, b, valid=None):
        """Row b of a [batch, heads, q, d] tensor as contiguous [n, heads, d]."""
        x = t[b] if valid is None else t[b][:, valid]
        return x.transpose(0, 1).contiguous()

    # ------------------------------------------------------------- updates
    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if not isinstance(layer_idx, int) or not 0 <= layer_idx < self._layers_n:
            raise ValueError("PagedCache: layer %r of a cache of %d layers (built for another model?)"
                             % (layer_idx, self._layers_n))
        return self.layers[layer_idx].update(key_states, value_states, *args, **kwargs)

    def _update(self, k, v, layer):
        if k.device.type != "cpu":
            raise ValueError("PagedCache: key_states are on %s; this cache holds CPU tensors" % k.device)
        if k.dtype not in _TORCH_TO_KVC:
            raise TypeError("PagedCache: key_states dtype %s is not float32, float16 or bfloat16" % k.dtype)
        b, hk, q, d = k.shape
        if hk != self._hk or d != self._hd or tuple(v.shape) != tuple(k.shape):
            raise ValueError("PagedCache: key/value states of shape %s / %s, expected [batch, %d, q, %d]"
                             % (tuple(k.shape), tuple(v.shape), self._hk, self._hd))
        with self._lock:
            if self._paged_attention:
                # kvcache attention appends (it knows the padding) and attends.
                if _PENDING.put(k, self, layer):
                    raise RuntimeError("PagedCache: built for attn_implementation=\"kvcache\" but the previous "
                                       "layer's K/V never reached the kvcache attention: the model runs another "
                                       "attention implementation; build the cache from that model's config")
                return k, v
            try:
                if layer == 0:
                    self._begin_forward([q] * b, k.dtype)
                for row, sid in enumerate(self._seqs):
                    self._pool.append(sid, layer, self._pos0[row], self._rows_kv(k, row), self._rows_kv(v, row))
                out = self._dense(layer, k.dtype)
                self._end_forward(layer)
            except BaseException:
                if layer != 0 or self._forward_q:
                    self._abort_forward()
                raise
            return out

    def _dense(self, layer, dtype=None):
        """The layer's K/V as [batch, kv_heads, n, head_dim] tensors (rows of fewer tokens left-padded with zeros)."""
        dtype = dtype or self._dtype or torch.float32
        lens = [self._pool.layer_tokens(sid, layer) for sid in self._seqs]
        n = max(lens) if lens else 0
        kk = torch.zeros((len(lens), n, self._hk, self._hd), dtype=dtype)
        vv = torch.zeros_like(kk)
        for row, (sid, m) in enumerate(zip(self._seqs, lens)):
            if m:
                self._pool.gather_into(sid, layer, 0, kk[row, n - m:], vv[row, n - m:])
        return kk.transpose(1, 2), vv.transpose(1, 2)

    # ------------------------------------------------------------ attention
    def _attend(self, layer, query, key, value, mask, scaling):
        b, hq, q, d = query.shape
        if hq != self._hq or d != self._hd:
            raise ValueError("kvcache attention: query of shape %s, expected [batch, %d, q, %d]"
                             % (tuple(query.shape), self._hq, self._hd))
        valid = None
        if mask is not None:
            valid = mask[:, -q:].to(torch.bool)
            if bool(valid.all()):
                valid = None
        counts = [q] * b if valid is None else [int(x) for x in valid.sum(dim=1).tolist()]
        st = self._st
        with self._lock:
            try:
                return self._attend_locked(layer, query, key, value, valid, counts, scaling, b, hq, q, d)
            except BaseException:
                if layer != 0 or self._forward_q:
                    self._abort_forward()
                raise

    def _attend_locked(self, layer, query, key, value, valid, counts, scaling, b, hq, q, d):
        st = self._st
        if layer == 0:
            self._begin_forward(counts, key.dtype)
        for row, sid in enumerate(self._seqs):
            vr = None if valid is None else valid[row]
            if counts[row]:
                self._pool.append(sid, layer, self._pos0[row], self._rows_kv(key, row, vr),
                                  self._rows_kv(value, row, vr))
        observe = _native.OBSERVE_NONE
        if self._reconstructing:
            observe = _native.OBSERVE_MAX
        elif st.protocol == _PROTO_STREAM:
            observe = st.observe
        elif st.protocol == _PROTO_PREFILL and self._forward_prefill:
            observe = st.observe
        scale = float(scaling) if scaling else 0.0
        if q == 1 and valid is None:
            qd = query[:, :, 0, :].contiguous()
            ids = _np.asarray(self._seqs, dtype=_np.uint64)
            out = self._pool.attention_decode(layer, ids, qd, scale=scale, observe=observe,
                                              num_threads=1 if observe else self._threads)
            result = out.view(b, 1, hq, d)
        else:
            result = torch.zeros((b, q, hq, d), dtype=query.dtype)
            for row, sid in enumerate(self._seqs):
                n = counts[row]
                if n == 0:
                    continue
                vr = None if valid is None else valid[row]
                qr = self._rows_kv(query, row, vr)
                frm = max(0, n - st.obs_window) if st.protocol == _PROTO_PREFILL and not self._reconstructing else 0
                o = self._pool.attention_prefill(layer, sid, qr, scale=scale, observe=observe, observe_from=frm,
                                                 num_threads=1 if observe else self._threads)
                if vr is None:
                    result[row] = o
                else:
                    result[row, vr] = o
        self._end_forward(layer)
        return result

    # ------------------------------------------------------------- kvzip
    def reconstruct_context(self, model, input_ids, tokenizer=None, *, repeat_ids=None, next_repeat_ids=None,
                            chunk=None):
        """KVzip's context reconstruction (arXiv 2505.23416) for a ``kvzip`` strategy: call it once after
        the prefill forward pass and before the next one. Each chunk of the context is fed again after a
        repeat instruction, on forks of the rows (their blocks shared copy-on-write), with the kvcache
        attention recording every cached token's largest attention (``OBSERVE_MAX``); the maxima of the
        prefill's tokens become the rows' scores, which the eviction at the next forward pass ranks
        (``POLICY_KVZIP``). The forks are freed; the rows' K/V are untouched. Cost: about a second
        prefill (each pass holds the prefill + one chunk + the instruction).

        Args:
            model: the model this cache belongs to (``attn_implementation="kvcache"``).
            input_ids: the prefill's tokens, ``[batch, P]`` (or ``[P]``), P the rows' length.
            tokenizer: encodes the instructions (kvpress's wording: "Repeat the previous context
                exactly." and, for later chunks, "Repeat the part of the previous context exactly,
                starting with" + the previous chunk's last 8 tokens); or give repeat_ids /
                next_repeat_ids (token lists).
            chunk: context tokens per pass (default the strategy's ``chunk``, 128).

        Raises ValueError when the strategy is not kvzip, the call is not between the prefill and the
        next pass, or input_ids do not match the rows; kvcache.KvcError for the library's refusals
        (a fixed-size pool too small for the forks). On failure the forks are freed and nothing of
        the rows changed."""
        from .hf_kvzip import reconstruct_context
        reconstruct_context(self, model, input_ids, tokenizer, repeat_ids, next_repeat_ids, chunk)

    # ----------------------------------------------------------- kvpress
    def _assign_subset(self, layer, new_k, new_v, dense):
        """A press assigned new_k / new_v [batch, kv_heads, m, head_dim]: find which of the layer's
        tokens they are (per row and head, by matching rows against the dense tensors read before)
        and keep those in the pool (one token set per layer: the m tokens most heads kept)."""
        if dense is None or dense[0] != self._version:
            raise ValueError("PagedLayer: keys / values assigned without reading them first (or after the "
                             "cache changed): only a subset of the rows read can be assigned")
        old_k, old_v = dense[1], dense[2]
        if new_k.dim() != 4 or new_k.shape[0] != old_k.shape[0] or new_k.shape[1] != self._hk or \
                new_k.shape[3] != self._hd or tuple(new_v.shape) != tuple(new_k.shape):
            raise ValueError("PagedLayer: assigned keys / values of shape %s / %s do not fit the layer's %s"
                             % (tuple(new_k.shape), tuple(new_v.shape), tuple(old_k.shape)))
        m = new_k.shape[2]
        n = old_k.shape[2]
        with self._lock:
            plans = []
            for row, sid in enumerate(self._seqs):
                held = self._pool.layer_tokens(sid, layer)
                pad = n - held  # rows of fewer tokens were left-padded
                votes = _np.zeros(n, _np.float64)
                for h in range(self._hk):
                    idx = _match_rows(old_k[row, h], new_k[row, h], old_v[row, h], new_v[row, h])
                    if idx is None:
                        raise NotImplementedError(
                            "PagedLayer: the assigned K/V of layer %d are not a subset of the layer's rows (a "
                            "press that merges or rewrites K/V); PagedCache supports presses that select "
                            "tokens" % layer)
                    votes[idx] += 1.0 + (m - _np.arange(m)) / (m + 1.0) / (self._hk + 1.0)
                votes[:pad] = -1.0
                take = min(m, held)
                keep = _np.sort(_np.argsort(-votes, kind="stable")[:take]) - pad
                plans.append((sid, keep))
            for sid, keep in plans:
                self._pool.keep(sid, layer, keep)
            self._version += 1

    # ------------------------------------------------------ Cache interface
    def _layer_length(self, layer):
        if self._seqs is None or self._pool is None:
            return 0
        return max(self._pool.layer_tokens(sid, layer) for sid in self._seqs) if self._seqs else 0

    def get_seq_length(self, layer_idx=0):
        return self._layer_length(layer_idx)

    def get_query_offset(self, layer_idx=0):
        with self._lock:
            self._evict_due()  # the mask is sized for what the pass attends, after the eviction due
            return self._layer_length(layer_idx)

    def get_mask_sizes(self, query_length_or_cache_position, layer_idx=0):
        return self.layers[layer_idx].get_mask_sizes(query_length_or_cache_position)

    def get_max_cache_shape(self, layer_idx=0):
        return -1

    def get_max_length(self, layer_idx=None):
        return -1

    @property
    def is_compileable(self):
        return False

    @property
    def is_initialized(self):
        return self._seqs is not None

    @property
    def batch_size(self):
        return len(self._seqs) if self._seqs else -1

    @property
    def max_batch_size(self):
        return self.batch_size

    def reset(self):
        """Frees every sequence (the pool, its prefix cache and tiers stay)."""
        with self._lock:
            if self._seqs is not None and self._pool is not None:
                for sid in self._seqs:
                    self._pool.seq_free(sid)
            self._seqs = None
            self._pos0 = None
            self._prefilled = False
            self._evict_pending = False
            self._policy = None
            self._version += 1
            for layer in self.layers:
                layer.reset()

    def _remap(self, sources):
        """New rows: row i a fork (copy-on-write) of old row sources[i]; old rows freed."""
        with self._lock:
            if self._seqs is None:
                return
            old = self._seqs
            for src in sources:
                if not 0 <= src < len(old):
                    raise ValueError("PagedCache: row index %d outside the batch of %d" % (src, len(old)))
            new = []
            try:
                for src in sources:
                    sid = self._new_id()
                    self._pool.seq_fork(old[int(src)], sid)
                    new.append(sid)
            except Exception:
                for sid in new:
                    self._pool.seq_free(sid)
                raise
            for sid in old:
                self._pool.seq_free(sid)
            self._seqs = new
            self._version += 1

    @staticmethod
    def _row_indices(idx, what):
        t = torch.as_tensor(idx)
        if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
            raise TypeError("PagedCache.%s: row indices must be integers, got %s" % (what, t.dtype))
        return [int(i) for i in t.reshape(-1).tolist()]

    def reorder_cache(self, beam_idx):
        """Beam search: row i becomes a fork of row beam_idx[i] (no K/V copy)."""
        self._remap(self._row_indices(beam_idx, "reorder_cache"))

    def batch_repeat_interleave(self, repeats):
        if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
            raise ValueError("PagedCache.batch_repeat_interleave: repeats must be an int >= 1, got %r" % (repeats,))
        if self._seqs is not None:
            self._remap([i for i in range(len(self._seqs)) for _ in range(repeats)])

    def batch_select_indices(self, indices):
        self._remap(self._row_indices(indices, "batch_select_indices"))

    def crop(self, n):
        """Speculative-decoding rollback: drop tokens from the end of every row (kvc_seq_truncate).
        transformers 5.3+: crop(-k) removes k tokens; 5.2: crop(n >= 0) keeps the first n, crop(-k) removes k."""
        if not isinstance(n, int) or isinstance(n, bool):
            raise TypeError("crop: an int number of tokens, got %r" % (n,))
        with self._lock:
            if self._seqs is None or (n == 0 and _NEW_CACHE_API):  # 5.3+: crop(0) removes nothing
                return
            if n > 0 and _NEW_CACHE_API:
                raise ValueError("crop(%d): pass a negative number of tokens to remove" % n)
            remove = -n if n < 0 else max(0, self.get_seq_length() - n)
            if remove == 0:
                return
            for sid in self._seqs:
                length = self._pool.seq_length(sid)
                self._pool.seq_truncate(sid, max(0, length - remove))
            self._version += 1

    def stats(self):
        """The pool's counters (kvc_stats field names) plus bits_per_element (bytes in use x 8 over
        the K and V elements held) and strategy."""
        out = {"strategy": self.strategy}
        if self._pool is None:
            return out
        s = self._pool.stats()
        for name in dir(type(s)):
            if not name.startswith("_") and name not in ("this", "thisown", "struct_size"):
                val = getattr(s, name)
                if isinstance(val, int):
                    out[name] = val
        elems = s.tokens_stored * 2 * self._hk * self._hd
        out["bits_per_element"] = (8.0 * s.bytes_in_use / elems) if elems else 0.0
        return out

    # -------------------------------------------------------- prefix cache
    def _tokens(self, input_ids):
        t = torch.as_tensor(input_ids)
        if t.dim() == 2:
            if t.shape[0] != 1:
                raise ValueError("prefix reuse runs one prompt at a time (batch 1), got batch %d" % t.shape[0])
            t = t[0]
        return _np.ascontiguousarray(t.to(torch.int64).numpy().astype(_np.int32))

    def attach_prefix(self, input_ids):
        """Before generate(): attach the cached prefix of the prompt (kvc_prefix_attach; with tiers, their
        blocks are loaded first). Returns the tokens attached (whole blocks, at most len - 1, so the model
        computes at least the last token); generate() then computes only the rest."""
        if not self._prefix:
            raise ValueError("attach_prefix needs PagedCache(..., prefix_cache=True)")
        toks = self._tokens(input_ids)
        with self._lock:
            if self._seqs is not None:
                raise ValueError("attach_prefix needs an empty cache (reset() first)")
            self._ensure_pool(1, len(toks))
            head = toks[:max(0, len(toks) - 1)]
            if self._tiers and len(head):
                self._pool.prefix_load(head)
            sid = self._new_id()
            res = self._pool.prefix_attach(sid, head)
            self._seqs = [sid]
            self._prefilled = False
            self._version += 1
            return int(res.hit_tokens)

    def register_prefix(self, input_ids):
        """After a prompt was computed: register its full blocks in the prefix cache (kvc_prefix_insert)
        and, with tiers, queue them for offload. Returns the blocks newly registered."""
        if not self._prefix:
            raise ValueError("register_prefix needs PagedCache(..., prefix_cache=True)")
        toks = self._tokens(input_ids)
        with self._lock:
            if not self._seqs or len(self._seqs) != 1:
                raise ValueError("register_prefix needs a cache holding one prompt")
            n = self._pool.prefix_insert(self._seqs[0], toks)
            if self._tiers:
                self._pool.prefix_offload(toks)
                self._pool.flush_tiers()
            return int(n)


# ------------------------------------------------------------------ attention
class _Pending:
    """key tensor id -> (cache, layer) between Cache.update and the attention call (per thread)."""

    def __init__(self):
        self._local = threading.local()

    def put(self, key, cache, layer):
        """Records the entry; returns True when an earlier entry of the same cache was never taken."""
        old = getattr(self._local, "entry", None)
        stale = old is not None and old[2]() is cache
        self._local.entry = (id(key), weakref.ref(key), weakref.ref(cache), layer)
        return stale

    def take(self, key):
        e = getattr(self._local, "entry", None)
        if e is None or e[0] != id(key) or e[1]() is not key:
            return None
        self._local.entry = None
        cache = e[2]()
        return None if cache is None else (cache, e[3])


_PENDING = _Pending()


def kvcache_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers attention function "kvcache": with a PagedCache, runs kvc_attention_prefill /
    kvc_attention_decode over the pool's blocks for layer module.layer_idx (the K/V history is never
    materialised); returns ([batch, q, heads, head_dim], None). Without a PagedCache (another cache, no
    cache) it computes the same attention densely with torch's sdpa."""
    entry = _PENDING.take(key)
    if entry is not None:
        cache, layer = entry
        return cache._attend(layer, query, key, value, attention_mask, scaling), None
    return _dense_attention(query, key, value, attention_mask, scaling), None


def _dense_attention(query, key, value, mask, scaling):
    b, hq, q, d = query.shape
    hk, n = key.shape[1], key.shape[2]
    if hk != hq:
        key = key.repeat_interleave(hq // hk, dim=1)
        value = value.repeat_interleave(hq // hk, dim=1)
    qpos = torch.arange(n - q, n).view(q, 1)
    allowed = (torch.arange(n).view(1, n) <= qpos).view(1, 1, q, n)
    if mask is not None:
        allowed = allowed & mask[:, -n:].to(torch.bool).view(b, 1, 1, n)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling)
    return out.transpose(1, 2).contiguous()


def kvcache_mask(batch_size, *args, attention_mask=None, **kwargs):
    """Mask function of "kvcache": the 2-D padding mask [batch, kv_length] (None when nothing is padded).
    Causality is the kernels' own (a query sees the tokens before it and itself)."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        return attention_mask
    m = attention_mask.to(torch.bool)
    return None if bool(m.all()) else m


def _register():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, kvcache_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, kvcache_mask)


_register()


# kvpress: KvcPress and the row matching of the bridge (kvcache/hf_press.py)
from .hf_press import KvcPress, _match_rows  # noqa: E402  (after the names it imports from here)
