"""What a ``kvcache.hf`` strategy takes from a Hugging Face model: its geometry and RoPE, the eviction
policy (with DuoAttention's gates) and the key smoothing (with the model's key statistics). Split out of
``kvcache.hf`` (hf.py), which imports every name here."""

import math

import numpy as _np

from . import native as _native
from . import builtin_key_stats, codebook_gaussian, key_smoothing, load_codebooks, load_key_stats

# eval's protocols (tools/cli/strategy.h: Strategy::Protocol).
_PROTO_NONE, _PROTO_STREAM, _PROTO_PREFILL = 0, 1, 2


def _text_config(config):
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if get is not None else config


def _geometry(config):
    """(layers, q_heads, kv_heads, head_dim, rope_theta) of a Llama-architecture config, or ValueError."""
    c = _text_config(config)
    missing = [a for a in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads")
               if getattr(c, a, None) is None]
    if missing:
        raise ValueError("PagedCache: the config (%s) has no %s; it holds Llama-architecture models "
                         "(num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim)"
                         % (type(c).__name__, ", ".join(missing)))
    layers, hq, hk = int(c.num_hidden_layers), int(c.num_attention_heads), int(c.num_key_value_heads)
    head_dim = getattr(c, "head_dim", None)
    if head_dim is None:
        hidden = getattr(c, "hidden_size", None)
        if hidden is None or hidden % hq:
            raise ValueError("PagedCache: the config has no head_dim and no hidden_size divisible by "
                             "num_attention_heads")
        head_dim = hidden // hq
    if hq % hk:
        raise ValueError("PagedCache: num_attention_heads %d is not a multiple of num_key_value_heads %d" % (hq, hk))
    types = getattr(c, "layer_types", None)
    if types and any(t != "full_attention" for t in types):
        raise ValueError("PagedCache: layer types %s: only full-attention layers are held (no sliding "
                         "window, chunked or linear-attention layers)" % sorted(set(types)))
    if getattr(c, "sliding_window", None) and getattr(c, "use_sliding_window", True):
        raise ValueError("PagedCache: sliding-window attention (sliding_window=%s) is not held" % c.sliding_window)
    theta = getattr(c, "rope_theta", None)
    rp = getattr(c, "rope_parameters", None)
    if theta is None and isinstance(rp, dict):
        theta = rp.get("rope_theta")
    return layers, hq, hk, int(head_dim), float(theta) if theta else 10000.0


def _plain_rope_or_raise(config, st, who):
    """expected-attention takes the queries back to their pre-RoPE frame with RoPE of the config's
    theta (kvc_seq_observe_queries): refuse configs whose RoPE is scaled (rope_type llama3, yarn,
    ...) or partial, where that un-rotation would be wrong."""
    if st.policy_kind != _native.POLICY_EXPECTED_ATTENTION:
        return
    c = _text_config(config)
    kinds = []
    for name in ("rope_scaling", "rope_parameters"):
        rp = getattr(c, name, None)
        if isinstance(rp, dict):
            kinds.append(rp.get("rope_type", rp.get("type", "default")))
    bad = [k for k in kinds if k not in (None, "default")]
    partial = getattr(c, "partial_rotary_factor", None)
    if bad or (partial is not None and float(partial) != 1.0):
        raise ValueError("%s: strategy '%s' un-rotates queries with plain RoPE (theta); this config's RoPE is %s: "
                         "not supported" % (who, st.spec, ("scaled (rope_type %s)" % bad[0]) if bad else
                                            "partial (partial_rotary_factor %s)" % partial))


def streaming_heads(gates, share, only=-1):
    """The binary gates of a ``duo-attention`` strategy (``kvcache eval``'s rule,
    tools/cli/duo_gates.cpp): the round(share x count) heads with the lowest gates (compared as
    float32; ties: the lower index) get 0 (they stream: sinks + recent window), the others 1 (the
    full cache); with ``only`` >= 0, head ``only`` (layer x num_kv_heads + head) alone streams.
    Raises ValueError for a gate outside [0, 1] (NaN included), a share outside [0, 1] or an
    ``only`` that is not -1 or a head index."""
    g32 = _np.asarray([float(g) for g in gates], dtype=_np.float32)
    if not bool(_np.all((g32 >= 0.0) & (g32 <= 1.0))):
        raise ValueError("streaming_heads: gates must be in [0, 1] (NaN excluded)")
    if isinstance(only, bool) or not isinstance(only, int) or only < -1:
        raise ValueError("streaming_heads: only must be -1 (none) or a head index, got %r" % (only,))
    share = float(share)
    if not 0.0 <= share <= 1.0:
        raise ValueError("streaming_heads: share must be in [0, 1], got %r" % (share,))
    out = [1.0] * len(g32)
    if only >= 0:
        if only >= len(g32):
            raise ValueError("duo-attention: stream-head=%d but the model has %d KV heads in all" % (only, len(g32)))
        out[only] = 0.0
        return out
    k = int(math.floor(share * len(g32) + 0.5))
    for i in sorted(range(len(g32)), key=lambda i: (g32[i], i))[:k]:
        out[i] = 0.0
    return out


def _stream_cap(st, ctx):
    """A stream policy's per-layer cap: budget_tokens, or ceil(budget x ctx) tokens."""
    return st.budget_tokens or int(math.ceil(st.budget * ctx - 1e-9))


def _policy(st, ctx, auto_evict, gates=None):
    """The kvcache.Policy of a parsed strategy (eval's protocols, tools/cli/eval_run.cpp): stream policies cap
    every layer at budget_tokens or ceil(budget x ctx) tokens; prefill policies drop 1 - budget of the
    prompt; duo-attention trims its streaming heads (``gates``: the model's per-head gates) at every
    reservation, without a layer cap. Positions are never shifted: transformers rotates queries at their
    text positions."""
    pc = _native.PolicyConfig()
    pc.kind = st.policy_kind
    pc.sink_tokens = st.sinks
    pc.recent_fraction = st.recent_fraction
    pc.window = st.obs_window
    pc.kernel_size = st.kernel
    pc.pooling = st.pooling
    pc.schedule = st.schedule
    pc.shift_positions = 0
    pc.future_positions = st.future_positions
    pc.head_budget = st.head_budget
    pc.head_floor = st.head_floor
    if st.policy_kind == _native.POLICY_DUO_ATTENTION:
        pc.recent_tokens = st.duo_window
        pc.auto_evict = 1 if auto_evict else 0
        binary = streaming_heads(gates, st.duo_stream_share, st.duo_stream_head)
        return _native.Policy.with_head_gates(pc, _np.asarray(binary, dtype=_np.float32).tobytes())
    if st.protocol == _PROTO_STREAM:
        cap = _stream_cap(st, ctx)
        if st.policy_kind == _native.POLICY_STREAMING and cap <= st.sinks:
            raise ValueError("strategy '%s': a cap of %d tokens at context %d leaves no room after %d sinks"
                             % (st.spec, cap, ctx, st.sinks))
        pc.budget_tokens = max(1, cap)
        pc.auto_evict = 1 if auto_evict else 0
    else:
        pc.compression_ratio = 1.0 - st.budget
    return _native.Policy(pc)


def _codebooks_of(st, layers, hd, codebooks=None):
    """[(part, levels)] of a strategy's ``codebook`` parts: the built-in Gaussian levels of each part's group size
    (per-token: head_dim), the same for every layer, as ``kvcache eval`` sets them; ``codebook=fit`` parts take
    theirs from `codebooks` (a file of ``kvcache calibrate --codebook`` or load_codebooks()'s list), the one entry
    of the same part, bits, group and layers, checked here (ValueError) as the pool would check it."""
    parts = []
    for part, flag, fit, codec in ((0, st.k_codebook, st.k_codebook_fit, st.k_codec),
                                   (1, st.v_codebook, st.v_codebook_fit, st.v_codec)):
        if flag:
            bits = {_native.DTYPE_INT4: 4, _native.DTYPE_INT3: 3, _native.DTYPE_INT2: 2}[codec.dtype]
            group = hd if codec.granularity == _native.SCALE_PER_TOKEN else codec.group_size
            parts.append((part, bits, group, fit))
    fitted = [p for p in parts if p[3]]
    if codebooks is not None and not fitted:
        raise ValueError("PagedCache: codebooks are for codebook=fit strategies; '%s' has none" % st.spec)
    if fitted and codebooks is None:
        raise ValueError("PagedCache: strategy '%s' has codebook=fit parts: codebooks= a file from `kvcache "
                         "calibrate --codebook '%s' -o FILE` (or load_codebooks()'s list)" % (st.spec, st.spec))
    if fitted:
        if isinstance(codebooks, (str, bytes)) or hasattr(codebooks, "__fspath__"):
            codebooks = load_codebooks(codebooks)
        try:
            codebooks = list(codebooks)
        except TypeError:
            raise ValueError("PagedCache: codebooks must be a codebook file or load_codebooks()'s list, got %r"
                             % (type(codebooks).__name__,)) from None
    # Per-layer codecs (BASE@LAYERS=CODECS): each listed layer's own bits and group.
    per_layer = {}
    for i, layer in enumerate(st.layer_ids):
        per_layer[int(layer)] = (st.layer_k_codec(i), st.layer_v_codec(i))
    out = []
    for part, bits, group, fit in parts:
        if not fit and per_layer:
            levels = []
            for layer in range(layers):
                lb, lg = bits, group
                if layer in per_layer:
                    codec = per_layer[layer][part]
                    lb = {_native.DTYPE_INT4: 4, _native.DTYPE_INT3: 3, _native.DTYPE_INT2: 2}.get(codec.dtype, 0)
                    lg = hd if codec.granularity == _native.SCALE_PER_TOKEN else codec.group_size
                if lb:  # an int8 / fp8 layer takes no levels (its uniform codes stay)
                    levels += list(codebook_gaussian(lb, lg))
            out.append((part, levels))
            continue
        if not fit:
            out.append((part, list(codebook_gaussian(bits, group)) * layers))
            continue
        name = "key" if part == 0 else "value"
        if part == 0 and group < hd:
            # `kvcache calibrate` fits keys in the runner's channel order (RoPE pairs (2i, 2i+1));
            # Hugging Face's pairs (i, i + head_dim / 2) put other channels in a group smaller than a head
            raise ValueError("PagedCache: fitted key levels need groups of a whole head here (per-token or a "
                             "multiple of head_dim %d): `kvcache calibrate` fits keys in the runner's channel "
                             "order, and Hugging Face's RoPE order groups other channels ('%s', group %d)"
                             % (hd, st.spec, group))
        match = [c for c in codebooks if isinstance(c, dict) and c.get("part") == part and c.get("bits") == bits
                 and c.get("group") == group and c.get("layers") == layers]
        if len(match) != 1:
            raise ValueError("PagedCache: codebooks hold %s %s part of %d bits, group %d and %d layers for '%s'"
                             % ("no" if not match else "more than one", name, bits, group, layers, st.spec))
        try:
            lv = _np.asarray(match[0].get("levels"), dtype=_np.float32)
        except (TypeError, ValueError):
            raise ValueError("PagedCache: the %s codebook's levels are not numbers" % name) from None
        if lv.shape != (layers, 1 << bits) or not _np.all(_np.isfinite(lv)) \
                or not (_np.all(lv >= -1.0) and _np.all(lv <= 1.0)) or _np.any(_np.diff(lv, axis=1) <= 0):
            raise ValueError("PagedCache: the %s codebook's levels must be [%d, %d] float32, finite, in [-1, 1], "
                             "each row strictly ascending (got shape %s)" % (name, layers, 1 << bits, lv.shape))
        out.append((part, [float(x) for x in lv.reshape(-1)]))
    return out


def _key_smoothing_of(config, st, key_stats, layers, hq, hk, hd):
    """(scale, offset) of a ``smooth`` strategy (Hugging Face's RoPE channel order), None without it."""
    if st.key_smooth <= 0:
        if key_stats is not None:
            raise ValueError("PagedCache: key_stats are for smooth strategies; '%s' does not smooth keys" % st.spec)
        return None
    if key_stats is None:
        key_stats = builtin_key_stats(layers, hq, hk, getattr(_text_config(config), "hidden_size", None))
        if key_stats is None:
            raise ValueError("PagedCache: strategy '%s' needs per-channel key statistics for this model (built in "
                             "for SmolLM2-135M and stories260K only): key_stats= a file from `kvcache calibrate`"
                             % st.spec)
    elif not isinstance(key_stats, dict):
        key_stats = load_key_stats(key_stats)
    if (key_stats.get("layers"), key_stats.get("kv_heads"), key_stats.get("head_dim")) != (layers, hk, hd):
        raise ValueError("PagedCache: key statistics of %s layers x %s KV heads x %s dims, the model has %d x %d x %d"
                         % (key_stats.get("layers"), key_stats.get("kv_heads"), key_stats.get("head_dim"),
                            layers, hk, hd))
    return key_smoothing(key_stats, st.key_smooth, rope="neox", beta=st.key_qsmooth)
