"""kvpress on libkvcache (part of kvcache.hf; docs/hf.md "kvpress"): the row matching that turns a
press's assigned K/V into the tokens kept (PagedCache's bridge, kvc_seq_keep), and KvcPress, our
eviction policies as a kvpress press."""

import numpy as _np
import torch

from . import native as _native
from . import KvcError, parse_strategy
from ._hf_setup import _PROTO_NONE, _geometry, _plain_rope_or_raise, _policy


def _row_keys(x):
    """One uint64 per row of a [n, d] float tensor (a hash of its bits)."""
    a = _np.ascontiguousarray(x.detach().contiguous().numpy()).view(_np.uint32).astype(_np.uint64)
    w = _np.random.default_rng(12345).integers(1, 2**63 - 1, size=a.shape[1], dtype=_np.uint64) | _np.uint64(1)
    with _np.errstate(over="ignore"):
        return (a * w).sum(axis=1, dtype=_np.uint64)


def _match_rows(old_k, new_k, old_v, new_v):
    """Indices i of old rows such that new_k[j] == old_k[i[j]] (and values equal), or None."""
    if new_k.shape[0] == 0:
        return _np.zeros(0, _np.int64)
    ok, nk = _row_keys(old_k), _row_keys(new_k)
    order = _np.argsort(ok, kind="stable")
    pos = _np.searchsorted(ok[order], nk)
    pos = _np.minimum(pos, len(order) - 1)
    idx = order[pos]
    t = torch.as_tensor(idx)
    if not (torch.equal(old_k[t], new_k) and torch.equal(old_v[t], new_v)):
        return None
    if len(_np.unique(idx)) != len(idx):
        return None
    return idx


class KvcPress:
    """One of our eviction policies as a kvpress press, so kvpress's pipeline compares it with its
    own presses on the same model: ``pipe(context, question=q, press=KvcPress("snapkv:budget=0.5"))``.

    After each attention layer's prefill (kvpress's forward hook, ``with press(model):``) the layer's
    K/V go into a scratch pool; policies that read attention get it from our kernels
    (``kvc_attention_prefill`` with observation: SnapKV / PyramidKV the last ``window`` queries, H2O
    every query, TOVA the last; expected-attention adds every query to its statistics, on a
    one-layer pool with RoPE NeoX at the config's theta); Knorm reads the keys; the policy evicts with ``budget`` as the fraction kept (kvpress's
    1 - compression_ratio), and the press returns the surviving rows, in order. On a DynamicCache
    they replace the layer's tensors; on a PagedCache they become a ``kvc_seq_keep`` (no copy).
    Llama-architecture attention modules (q_proj, RoPE from ``position_embeddings``)."""

    def __init__(self, strategy):
        self.strategy = str(strategy)
        try:
            st = parse_strategy(self.strategy)
        except KvcError as e:
            raise ValueError(e.message) from None
        if st.protocol == _PROTO_NONE:
            raise ValueError("KvcPress: strategy '%s' has no eviction policy" % st.spec)
        if st.headwise:
            raise ValueError("KvcPress: strategy '%s' keeps different tokens in each KV head; a press "
                             "compresses a layer's dense tensors (use PagedCache, which frees each head's "
                             "blocks)" % st.spec)
        if len(self.strategy.split("+")) > 1:  # one policy part; any other part is a codec
            raise ValueError("KvcPress: strategy '%s' names a codec; a press selects tokens only (give the "
                             "codec to the PagedCache)" % st.spec)
        if st.reconstruct:
            raise ValueError("KvcPress: strategy '%s' scores tokens by a context-reconstruction pass of the "
                             "whole model, which a per-layer press cannot run: use kvcache.hf.PagedCache "
                             "with it and call reconstruct_context() after the prefill" % st.spec)
        self._st = st
        self.compression_ratio = 1.0 - st.budget

    def __repr__(self):
        return "KvcPress(%r)" % self.strategy

    def post_init_from_model(self, model):
        pass


    def _queries(self, module, hidden_states, kwargs, rows):
        """Post-RoPE queries [b, heads, rows, head_dim] of the last `rows` positions."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b, n, _ = hidden_states.shape
        hd = module.head_dim
        q = module.q_proj(hidden_states[:, n - rows:]).view(b, rows, -1, hd).transpose(1, 2)
        cos, sin = kwargs["position_embeddings"]
        q, _ = apply_rotary_pos_emb(q, q, cos[:, n - rows:], sin[:, n - rows:])
        return q

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        st = self._st
        b, hk, n, d = keys.shape
        cfg = module.config
        layers, hq = int(cfg.num_hidden_layers), int(cfg.num_attention_heads)
        layer = int(module.layer_idx)
        if st.policy_kind == _native.POLICY_EXPECTED_ATTENTION:
            # Its statistics are per layer and nothing in it depends on the layer's index: a
            # one-layer pool (every layer of a full one would need its own queries observed).
            layers, layer = 1, 0
        c = _native.PoolConfig()
        c.num_layers, c.num_q_heads, c.num_kv_heads, c.head_dim = layers, hq, hk, d
        c.k_dtype = c.v_dtype = _native.DTYPE_F32
        if st.policy_kind == _native.POLICY_EXPECTED_ATTENTION:
            _plain_rope_or_raise(cfg, st, "KvcPress")
            c.rope_style = _native.ROPE_NEOX  # Hugging Face Llama rotates halves (queries un-rotated by it)
            c.rope_theta = float(_geometry(cfg)[4])
        c.block_size = 16
        c.num_blocks = b * layers * (-(-n // 16))
        pool = _native.Pool(c)
        policy = _policy(st, n, auto_evict=False)
        observe_rows = {_native.POLICY_SNAPKV: min(n, st.obs_window), _native.POLICY_PYRAMIDKV: min(n, st.obs_window),
                        _native.POLICY_H2O: n, _native.POLICY_TOVA: 1,
                        _native.POLICY_EXPECTED_ATTENTION: n}.get(st.policy_kind, 0)
        q = self._queries(module, hidden_states, kwargs, observe_rows) if observe_rows else None
        kept = []
        with torch.no_grad():
            for row in range(b):
                pool.seq_create(row)
                pool.reserve(row, n)
                k = keys[row].transpose(0, 1).to(torch.float32).contiguous()
                v = values[row].transpose(0, 1).to(torch.float32).contiguous()
                pool.append(row, layer, 0, k, v)
                if q is not None:
                    qr = q[row].transpose(0, 1).to(torch.float32).contiguous()
                    mode = {_native.POLICY_TOVA: _native.OBSERVE_REPLACE,
                            _native.POLICY_EXPECTED_ATTENTION: _native.OBSERVE_QUERIES}.get(st.policy_kind,
                                                                                           _native.OBSERVE_ACCUMULATE)
                    pool.attention_prefill(layer, row, qr, scale=float(getattr(module, "scaling", 0.0) or 0.0),
                                           observe=mode)
                pool.evict(row, policy)
                m = pool.layer_tokens(row, layer)
                kept.append(torch.as_tensor(_np.asarray(pool.positions(row, layer, 0, m), dtype=_np.int64)))
        m = min(len(x) for x in kept)
        idx = torch.stack([x[:m] for x in kept])  # same budget per row: same count
        gi = idx.view(b, 1, m, 1).expand(b, hk, m, d)
        return keys.gather(2, gi), values.gather(2, gi)

    def forward_hook(self, module, input, kwargs, output):
        cache = kwargs.get("past_key_values", kwargs.get("cache"))
        hidden_states = kwargs["hidden_states"]
        q_len = hidden_states.shape[1]
        pos = kwargs.get("cache_position")
        if pos is not None and int(pos[-1]) + 1 != q_len:
            return output  # not the prefill
        layer = cache.layers[module.layer_idx]
        keys, values = layer.keys, layer.values
        if keys is None or keys.shape[2] != q_len:
            return output
        layer.keys, layer.values = self.compress(module, hidden_states, keys, values, output[1], kwargs)
        return output

    def __call__(self, model):
        import contextlib

        press = self

        @contextlib.contextmanager
        def ctx():
            hooks = []
            base = model.model.language_model if hasattr(model.model, "language_model") else model.model
            try:
                for layer in base.layers:
                    hooks.append(layer.self_attn.register_forward_hook(press.forward_hook, with_kwargs=True))
                yield
            finally:
                for h in hooks:
                    h.remove()

        return ctx()
