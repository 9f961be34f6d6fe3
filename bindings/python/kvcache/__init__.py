"""Python binding of libkvcache (paged, quantized, shareable KV cache).

The classes come from the SWIG interface bindings/swig/kvcache_common.i
(module ``kvcache.native``); this file adds what is Python-specific:

* ``KvcError``: every failed call raises it with the library's status and
  message (``err.status``, ``err.status_name``, ``err.message``);
* numpy in and out: ``Pool.append`` takes arrays ``[n, num_kv_heads, head_dim]``
  of float32 or float16 (or any object with ``__dlpack__``), passed without a
  copy when C-contiguous; ``Pool.gather`` returns new arrays; ``Codec.quantize``
  / ``Codec.dequantize`` work on ``[n, d]`` arrays;
* context managers: ``with Pool(cfg) as pool: ...`` closes the pool at the end
  (closing also happens when the object is collected).

Example::

    import numpy as np, kvcache
    cfg = kvcache.PoolConfig()
    cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = 2, 4, 2, 64
    cfg.num_blocks = 64
    with kvcache.Pool(cfg) as pool:
        pool.seq_create(1)
        pool.reserve(1, 20)
        k = np.ones((20, 2, 64), np.float32)
        pool.append(1, 0, 0, k, k)
        k2, v2 = pool.gather(1, 0)
"""

import operator as _operator
import os as _os
import re as _re
import struct as _struct

import numpy as _np

from ._version import __version__  # the library version this package was built with


def _ld_library_path():
    ld = _os.environ.get("LD_LIBRARY_PATH")
    return ", with LD_LIBRARY_PATH=%s" % ld if ld else ""


# The extension loads libkvcache from the package's folder (RUNPATH $ORIGIN),
# but a library on LD_LIBRARY_PATH comes first: one that lacks a function the
# extension needs fails here, one of another version below.
try:
    from . import native as _native
except ImportError as _e:
    if "libkvcache" not in str(_e) and "undefined symbol: kvc_" not in str(_e):
        raise
    raise ImportError("kvcache %s: its extension could not be loaded with the libkvcache found (%s)%s; "
                      "unset LD_LIBRARY_PATH or reinstall kvcache" % (__version__, _e, _ld_library_path())) from _e


def _loaded_library():
    """The path of the libkvcache the process has loaded (Linux), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(None, 5)[-1].strip()
                if _os.path.basename(path).startswith("libkvcache."):
                    return path
    except OSError:
        pass
    return None


if _native.version() != __version__:
    raise ImportError("kvcache %s was built with libkvcache %s, but the process loaded libkvcache %s (%s)%s; "
                      "unset LD_LIBRARY_PATH or reinstall kvcache"
                      % (__version__, __version__, _native.version(), _loaded_library() or "path unknown",
                         _ld_library_path()))

from .native import *  # noqa: F401,F403,E402  (classes, enum constants, version())


class KvcError(Exception):
    """A libkvcache call failed: ``status`` is the kvc_status value (e.g.
    ``kvcache.ERR_SEQ_NOT_FOUND``), ``message`` the library's explanation."""

    def __init__(self, status, message):
        super().__init__(status, message)
        self.status = int(status)
        self.message = message

    @property
    def status_name(self):
        return _native.status_name(self.status)

    def __str__(self):
        return "%s: %s" % (self.status_name, self.message)


_native._register_error(KvcError)
_native.KvcError = KvcError  # for the methods written in Python (kvcache_python.i)

_NP_TO_DTYPE = {
    _np.dtype(_np.float32): _native.DTYPE_F32,
    _np.dtype(_np.float16): _native.DTYPE_F16,
}
_DTYPE_TO_NP = {
    _native.DTYPE_F32: _np.float32,
    _native.DTYPE_F16: _np.float16,
    _native.DTYPE_BF16: _np.uint16,  # raw bfloat16 bits
}


# ---- DuoAttention's per-head gates (docs/eviction.md) ----
# An ASCII decimal number, as eval's parser reads gates (no hex, no underscores, no other digits).
_GATE_NUMBER = _re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")


def load_head_gates(path):
    """DuoAttention's per-head gates from a text file (``kvcache eval --head-gates``'s format,
    docs/eviction.md): ASCII decimal numbers in [0, 1] separated by whitespace, layer by layer
    (num_layers x num_kv_heads), ``#`` to the end of a line a comment. Returns a list of floats;
    raises ValueError naming the file (and the line and token) of what it cannot read."""
    try:
        with open(_os.fspath(path), "rb") as f:
            data = f.read()
    except (OSError, TypeError) as e:
        raise ValueError("head gates file %r: %s" % (path, e)) from None
    out = []
    for lineno, line in enumerate(data.split(b"\n"), 1):
        for tok in line.split(b"#", 1)[0].split():  # ASCII whitespace
            if not _GATE_NUMBER.match(tok.decode("latin-1")):
                raise ValueError("%s:%d: %r is not a number" % (path, lineno, tok.decode("latin-1")))
            g = float(tok)
            if not 0.0 <= g <= 1.0:
                raise ValueError("%s:%d: gate %s is not in [0, 1]" % (path, lineno, tok.decode()))
            out.append(g)
    if not out:
        raise ValueError("%s: no gates" % (path,))
    return out


# (num_layers, num_q_heads, num_kv_heads, hidden size) -> the gates file the package ships
# (bench/duo/gates-*.txt, derived by bench/duo/derive_gates.py; `kvcache eval` compiles the same in).
_BUILTIN_GATES = {(30, 9, 3, 576): "gates-smollm2.txt", (5, 8, 4, 64): "gates-stories260k.txt"}


def builtin_head_gates(num_layers, num_q_heads, num_kv_heads, hidden_size):
    """The DuoAttention gates shipped with the package for a model of this geometry: SmolLM2-135M
    (30 layers, 9 query / 3 KV heads, hidden 576) and stories260K (5, 8 / 4, 64), the gates
    ``kvcache eval`` uses for them; None for any other model."""
    name = _BUILTIN_GATES.get((num_layers, num_q_heads, num_kv_heads, hidden_size))
    if name is None:
        return None
    return load_head_gates(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "duo", name))


def _words_after_header(path, what, header):
    """[(where, words)] of a text file's lines after its header line (`header`, a list of words), '#'
    comments and blank lines left out; ValueError for a file that cannot be read, lacks the header or is
    empty, naming the file and the line."""
    try:
        with open(_os.fspath(path), "rb") as f:
            data = f.read()
    except (OSError, TypeError) as e:
        raise ValueError("%s %r: %s" % (what, path, e)) from None
    out, magic = [], False
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        w = raw.split(b"#", 1)[0].decode("latin-1").split()
        if not w:
            continue
        where = "%s:%d" % (path, lineno)
        if not magic:
            if w != header:
                raise ValueError("%s: expected the header '%s'" % (where, " ".join(header)))
            magic = True
        else:
            out.append((where, w))
    if not magic:
        raise ValueError("%s: empty: expected the header '%s'" % (path, " ".join(header)))
    return out


# ---- per-channel key statistics and key smoothing (docs/codecs.md "Key smoothing") ----
def load_key_stats(path):
    """Per-channel statistics of pre-RoPE keys from a file ``kvcache calibrate`` wrote (docs/codecs.md):
    a dict with ``layers``, ``kv_heads``, ``head_dim``, ``rope`` ("interleaved" or "neox": the channel order)
    and float32 arrays ``mean``, ``rms``, ``absmax`` of shape [layers, kv_heads * head_dim], and ``qrms`` (the
    queries' rms per key channel, for ``qsmooth``) of the same shape when the file has it (every layer or
    none), else None. Raises ValueError naming the file, the line and the problem."""
    st = {"rope": "interleaved"}
    arrays = {}
    for where, w in _words_after_header(path, "key statistics file", ["kvcache-key-stats", "1"]):
        if w[0] == "rope" and len(w) == 2 and w[1] in ("interleaved", "neox"):
            st["rope"] = w[1]
        elif w[0] == "tokens" and len(w) == 2 and w[1].isdigit():
            st["tokens"] = int(w[1])
        elif "layers" not in st:
            if len(w) != 6 or w[0::2] != ["layers", "kv_heads", "head_dim"] or not all(x.isdigit() for x in w[1::2]):
                raise ValueError("%s: expected 'layers L kv_heads H head_dim D'" % where)
            st["layers"], st["kv_heads"], st["head_dim"] = int(w[1]), int(w[3]), int(w[5])
            if not (1 <= st["layers"] <= 4096 and 1 <= st["kv_heads"] <= 65536 and 1 <= st["head_dim"] <= 1024) \
                    or st["layers"] * st["kv_heads"] * st["head_dim"] > (1 << 20):
                raise ValueError("%s: geometry out of range" % where)
            for name in ("mean", "rms", "absmax", "qrms"):
                arrays[name] = _np.full((st["layers"], st["kv_heads"] * st["head_dim"]), _np.nan, _np.float32)
        elif w[0] in arrays:
            row = st["kv_heads"] * st["head_dim"]
            if len(w) != row + 2 or not w[1].isdigit() or int(w[1]) >= st["layers"]:
                raise ValueError("%s: %s: expected a layer below %d and %d values" % (where, w[0], st["layers"], row))
            layer = int(w[1])
            if not _np.isnan(arrays[w[0]][layer]).all():
                raise ValueError("%s: %s of layer %d given twice" % (where, w[0], layer))
            try:
                vals = _np.array([float(x) for x in w[2:]], _np.float64)
            except ValueError:
                raise ValueError("%s: %s: a value is not a number" % (where, w[0])) from None
            if not _np.isfinite(vals).all() or (_np.abs(vals) > 1e30).any() or (w[0] != "mean" and (vals < 0).any()):
                raise ValueError("%s: %s: values must be finite within 1e30 (rms, absmax and qrms >= 0)" % (where, w[0]))
            arrays[w[0]][layer] = vals
        else:
            raise ValueError("%s: unknown line %r" % (where, " ".join(w[:2])))
    if "layers" not in st:
        raise ValueError("%s: no 'layers L kv_heads H head_dim D' line" % (path,))
    if _np.isnan(arrays["qrms"]).all():  # optional: every layer or none
        arrays["qrms"] = None
    for name, a in arrays.items():
        if a is None:
            continue
        missing = [i for i in range(st["layers"]) if _np.isnan(a[i]).any()]
        if missing:
            raise ValueError("%s: no %s line for layer %d" % (path, name, missing[0]))
    st.update(arrays)
    return st


def load_codebooks(path):
    """Codebooks from a file ``kvcache calibrate --codebook`` wrote (docs/codecs.md "Codebooks"): a list of
    dicts, one per part, with ``part`` (0 keys, 1 values), ``bits``, ``group`` (values per scale group),
    ``layers`` and ``levels``, a float32 array [layers, 2**bits] (each row strictly ascending in [-1, 1]), the
    levels Pool.set_codebook takes. Raises ValueError naming the file, the line and the problem."""
    parts = []

    def complete(p):
        return len(p["rows"]) == p["layers"]

    for where, w in _words_after_header(path, "codebook file", ["kvcache-codebook", "1"]):
        if w[0] == "part":
            if parts and not complete(parts[-1]):
                raise ValueError("%s: the previous part has fewer levels lines than its layers" % where)
            if len(w) != 8 or w[1] not in ("k", "v") or w[2::2] != ["bits", "group", "layers"] \
                    or not all(x.isascii() and x.isdigit() and len(x) <= 20 for x in w[3::2]):
                raise ValueError("%s: expected 'part k|v bits B group G layers L' (whole numbers)" % where)
            bits, group, layers = int(w[3]), int(w[5]), int(w[7])
            if bits not in (2, 3, 4) or not 1 <= group <= 1 << 32 or not 1 <= layers <= 4096:
                raise ValueError("%s: bits must be 2, 3 or 4, group in [1, 2^32], layers in [1, 4096]" % where)
            parts.append({"part": 1 if w[1] == "v" else 0, "bits": bits, "group": group, "layers": layers,
                          "rows": []})
        elif w[0] == "levels":
            if not parts:
                raise ValueError("%s: 'levels' before any 'part' line" % where)
            p = parts[-1]
            if len(w) != 2 + (1 << p["bits"]) or w[1] != str(len(p["rows"])) or complete(p):
                raise ValueError("%s: expected 'levels %d' and %d levels (layers in order)"
                                 % (where, len(p["rows"]), 1 << p["bits"]))
            try:
                row = _np.asarray([float(x) for x in w[2:]], dtype=_np.float32)
            except ValueError:
                raise ValueError("%s: a level is not a number" % where) from None
            # as float32 (what the pool takes), like `kvcache calibrate`'s reader
            if not (_np.all(row >= -1.0) and _np.all(row <= 1.0)) or _np.any(_np.diff(row) <= 0):
                raise ValueError("%s: levels must be in [-1, 1] and ascend strictly (as float32)" % where)
            p["rows"].append(row)
        else:
            raise ValueError("%s: unknown line %r" % (where, w[0]))
    if not parts or not complete(parts[-1]):
        raise ValueError("%s: no part, or the last part has fewer levels lines than its layers" % (path,))
    for p in parts:
        p["levels"] = _np.asarray(p.pop("rows"), dtype=_np.float32)
    return parts


# (num_layers, num_q_heads, num_kv_heads, hidden size) -> the statistics the package ships (bench/calib).
_BUILTIN_KEY_STATS = {(30, 9, 3, 576): "keys-smollm2.txt", (5, 8, 4, 64): "keys-stories260k.txt"}


def builtin_key_stats(num_layers, num_q_heads, num_kv_heads, hidden_size):
    """The key statistics shipped with the package for SmolLM2-135M or stories260K (the ones ``kvcache eval``'s
    ``smooth`` flag uses, in the runner's interleaved channel order); None for any other model."""
    name = _BUILTIN_KEY_STATS.get((num_layers, num_q_heads, num_kv_heads, hidden_size))
    if name is None:
        return None
    return load_key_stats(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "calib", name))


def key_smoothing(stats, alpha=1.0, rope="interleaved", beta=0.0):
    """(scale, offset) for Pool.set_key_smoothing from key statistics (load_key_stats()), as ``kvcache eval``'s
    ``smooth=A`` (and ``qsmooth=B``) makes them: scale = max(rms, 1e-3 x the layer's largest rms) ** alpha /
    max(qrms, 1e-3 x the layer's largest qrms) ** beta, offset = mean; both float32
    [layers * kv_heads * head_dim], with channels in the `rope` order the pool's keys use ("interleaved": pairs
    (2i, 2i+1), the runner's and llama.cpp's; "neox": pairs (i, i + head_dim / 2), Hugging Face's). beta > 0
    needs statistics with ``qrms`` (ValueError otherwise)."""
    if rope not in ("interleaved", "neox"):
        raise ValueError("key_smoothing: rope must be 'interleaved' or 'neox', got %r" % (rope,))
    if not 0.05 <= float(alpha) <= 1.0:
        raise ValueError("key_smoothing: alpha must be in [0.05, 1], got %r" % (alpha,))
    if float(beta) != 0.0 and not 0.05 <= float(beta) <= 1.0:
        raise ValueError("key_smoothing: beta must be 0 or in [0.05, 1], got %r" % (beta,))
    if float(beta) > 0.0 and stats.get("qrms") is None:
        raise ValueError("key_smoothing: beta > 0 needs the queries' rms (qrms lines): fit the statistics again "
                         "with `kvcache calibrate`")
    L, H, D = stats["layers"], stats["kv_heads"], stats["head_dim"]
    rms = stats["rms"].astype(_np.float64)
    top = rms.max(axis=1, keepdims=True)
    # A layer of constant keys (rms 0) keeps scale 1; no scale below the library's 1e-30.
    scale = _np.maximum(rms, 1e-3 * top) ** float(alpha)
    if float(beta) > 0.0:
        q = stats["qrms"].astype(_np.float64)
        qtop = q.max(axis=1, keepdims=True)
        # a layer whose queries are all 0 is not divided (no 0 ** beta in the divisor)
        scale = scale / _np.where(qtop > 0, _np.maximum(q, 1e-3 * qtop), 1.0) ** float(beta)
    scale = _np.where(top > 0, _np.minimum(_np.maximum(scale, 1e-30), 1e30), 1.0)
    offset = stats["mean"].astype(_np.float64)
    if rope != stats["rope"]:
        if D % 2:
            raise ValueError("key_smoothing: head_dim %d is odd: no RoPE pairs to reorder" % D)
        # interleaved (2i, 2i+1) <-> neox (i, i + D/2)
        order = _np.concatenate([_np.arange(0, D, 2), _np.arange(1, D, 2)])  # neox channel j <- interleaved order[j]
        def to(a):
            a = a.reshape(L, H, D)
            if rope == "neox":
                return a[:, :, order]
            out = _np.empty_like(a)
            out[:, :, order] = a
            return out
        scale, offset = to(scale), to(offset)
    return (_np.ascontiguousarray(scale, _np.float32).reshape(-1),
            _np.ascontiguousarray(offset, _np.float32).reshape(-1))


def _is_torch(x):
    """True for a torch.Tensor (without importing torch)."""
    t = type(x)
    return t.__module__.startswith("torch") and hasattr(x, "data_ptr") and hasattr(x, "is_contiguous")


_TORCH_DTYPES = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16"}


def _torch_view(t, name, writable=False):
    """A numpy view sharing a CPU torch tensor's memory, and its library dtype.

    Refuses (TypeError / ValueError naming the argument) what cannot be read
    in place: a device other than the CPU, a dtype other than float32 /
    float16 / bfloat16, a non-contiguous stride, a tensor that needs grad."""
    if t.device.type != "cpu":
        raise ValueError("%s: tensor is on %s; libkvcache's Python binding reads CPU tensors only" % (name, t.device))
    kind = _TORCH_DTYPES.get(str(t.dtype))
    if kind is None:
        raise TypeError("%s: tensor dtype %s is not float32, float16 or bfloat16" % (name, t.dtype))
    if not t.is_contiguous():
        raise ValueError("%s: tensor of shape %s has strides %s, not C-contiguous; call .contiguous() first"
                         % (name, tuple(t.shape), tuple(t.stride())))
    if t.requires_grad:
        t = t.detach()
    if kind == "bf16":
        import torch  # only reached with a torch tensor in hand
        arr = t.view(torch.int16).numpy()
        return arr, _native.DTYPE_BF16
    arr = t.numpy()
    return arr, (_native.DTYPE_F32 if kind == "f32" else _native.DTYPE_F16)


def _as_array(x, name):
    """A C-contiguous numpy view of x (numpy array, buffer or DLPack tensor);
    copies only when x is not contiguous."""
    if x is None:
        raise TypeError("%s: expected an array, got None" % name)
    if _is_torch(x):
        return _torch_view(x, name)[0]
    if isinstance(x, _np.ndarray):
        arr = x
    elif isinstance(x, (bytes, bytearray)):
        arr = _np.frombuffer(x, _np.uint8)  # raw bytes, read in place
    elif hasattr(x, "__dlpack__") and not isinstance(x, memoryview):
        arr = _np.from_dlpack(x)
    else:
        arr = _np.asarray(x)
    if arr.dtype.hasobject:
        raise TypeError("%s: an array of Python objects is not K/V data" % name)
    if not arr.flags.c_contiguous:
        arr = _np.ascontiguousarray(arr)
    return arr


_DTYPE_NAMES = {_native.DTYPE_F32: "f32", _native.DTYPE_F16: "f16", _native.DTYPE_BF16: "bf16"}

# Array element types each library dtype may be given as: the type itself,
# its raw bits (16-bit integers for f16 / bf16), or raw bytes (uint8).
_COMPATIBLE = {
    _native.DTYPE_F32: {"float32", "uint8"},
    _native.DTYPE_F16: {"float16", "uint16", "int16", "uint8"},
    _native.DTYPE_BF16: {"bfloat16", "uint16", "int16", "uint8"},
}


def _dtype_of(arr, dtype, name):
    """The library dtype of arr's elements; with an explicit dtype, checks
    that arr's element type can hold it (so sizes are never reinterpreted)."""
    if dtype is not None:
        dt = _operator.index(dtype)
        allowed = _COMPATIBLE.get(dt)
        if allowed is None:
            raise TypeError("%s: dtype must be DTYPE_F32, DTYPE_F16 or DTYPE_BF16, got %d" % (name, dt))
        if arr.dtype.name not in allowed:
            raise TypeError("%s: a %s array cannot hold %s data" % (name, arr.dtype, _DTYPE_NAMES[dt]))
        return dt
    if arr.dtype.name == "bfloat16":  # ml_dtypes / torch-exported bfloat16
        return _native.DTYPE_BF16
    try:
        return _NP_TO_DTYPE[arr.dtype]
    except KeyError:
        raise TypeError("%s: dtype %s is not float32 or float16; pass dtype= for raw float16 / bfloat16 bits "
                        "(uint16) or bytes (uint8)" % (name, arr.dtype)) from None


def _pool_append(self, seq_id, layer, pos, k, v, dtype=None):
    """Write K and V of n tokens at positions [pos, pos + n) of one layer.

    k, v: arrays ``[n, num_kv_heads, head_dim]`` (any shape with that many
    elements) of float32 or float16, or bfloat16 given as uint16 bits with
    ``dtype=kvcache.DTYPE_BF16``; numpy arrays or DLPack tensors on the CPU.
    Positions must be reserved (``reserve``). Returns n.
    Raises KvcError (ERR_NOT_RESERVED, ERR_SEQ_NOT_FOUND, ERR_OUT_OF_RANGE,
    ERR_INVALID_ARGUMENT for sizes that are not whole token rows, ...)."""
    if _is_torch(k) or _is_torch(v):
        cfg = self.config()
        row = (cfg.num_kv_heads, cfg.head_dim)
        for name, t in (("k", k), ("v", v)):
            if not _is_torch(t):
                raise TypeError("%s: k and v must both be torch tensors or both arrays" % name)
            shape = tuple(t.shape)
            if not ((len(shape) == 3 and shape[1:] == row) or (len(shape) == 2 and shape[1] == row[0] * row[1])):
                raise ValueError("%s: tensor shape %s is not [n, num_kv_heads=%d, head_dim=%d]" % ((name, shape) + row))
        if tuple(k.shape) != tuple(v.shape):
            raise ValueError("k and v shapes differ: %s and %s" % (tuple(k.shape), tuple(v.shape)))
        (k, dk), (v, dv) = _torch_view(k, "k"), _torch_view(v, "v")
        if dtype is not None and _operator.index(dtype) != dk:
            raise TypeError("dtype=%d does not match the tensors' %s" % (dtype, _DTYPE_NAMES[dk]))
    else:
        k = _as_array(k, "k")
        v = _as_array(v, "v")
        dk = _dtype_of(k, dtype, "k")
        dv = _dtype_of(v, dtype, "v")
    if dk != dv:
        raise TypeError("k and v have different dtypes (%s, %s)" % (k.dtype, v.dtype))
    return self._append(seq_id, layer, pos, k, v, dk)


def _pool_gather(self, seq_id, layer, first=0, n=None, dtype=_native.DTYPE_F32, k=True, v=True):
    """Read K and V of the layer's tokens [first, first + n) (n: to the end).

    Returns ``(k, v)``, new arrays ``[n, num_kv_heads, head_dim]`` of float32
    (dtype DTYPE_F32), float16 (DTYPE_F16) or uint16 bfloat16 bits (DTYPE_BF16);
    k or v is None when not asked for."""
    first = _operator.index(first)
    held = self.layer_tokens(seq_id, layer)
    n = held - first if n is None else _operator.index(n)
    if first < 0 or n < 0 or first > held or n > held - first:
        raise KvcError(ERR_OUT_OF_RANGE, "tokens [%d, %d + %d) are beyond the %d layer %d of sequence %d holds"  # noqa: F405
                       % (first, first, n, held, layer, seq_id))
    cfg = self.config()
    shape = (int(n), cfg.num_kv_heads, cfg.head_dim)
    npdt = _DTYPE_TO_NP.get(_operator.index(dtype))
    if npdt is None:
        raise TypeError("dtype must be DTYPE_F32, DTYPE_F16 or DTYPE_BF16")
    ko = _np.empty(shape, npdt) if k else None
    vo = _np.empty(shape, npdt) if v else None
    if n > 0:
        self._gather(seq_id, layer, first, ko, vo, _operator.index(dtype))
    return ko, vo


def _pool_gather_into(self, seq_id, layer, first, k_out, v_out, dtype=None):
    """Read into caller arrays (writable, C-contiguous; either may be None);
    n = the arrays' token rows. Returns n."""
    if k_out is None and v_out is None:
        raise TypeError("k_out and v_out are both None")
    if _is_torch(k_out) or _is_torch(v_out):
        cfg = self.config()
        views, dts = [], set()
        for name, t in (("k_out", k_out), ("v_out", v_out)):
            if t is None:
                views.append(None)
                continue
            if not _is_torch(t):
                raise TypeError("%s: k_out and v_out must both be torch tensors (or None)" % name)
            shape = tuple(t.shape)
            if not (len(shape) == 3 and shape[1:] == (cfg.num_kv_heads, cfg.head_dim)):
                raise ValueError("%s: tensor shape %s is not [n, num_kv_heads=%d, head_dim=%d]"
                                 % (name, shape, cfg.num_kv_heads, cfg.head_dim))
            arr, dt = _torch_view(t, name)
            views.append(arr)
            dts.add(dt)
        if len(dts) != 1:
            raise TypeError("k_out and v_out have different dtypes")
        dt = dts.pop()
        if dtype is not None and _operator.index(dtype) != dt:
            raise TypeError("dtype=%d does not match the tensors' %s" % (dtype, _DTYPE_NAMES[dt]))
        return self._gather(seq_id, layer, first, views[0], views[1], dt)
    dts = set()
    for name, out in (("k_out", k_out), ("v_out", v_out)):
        if out is not None:
            dts.add(_dtype_of(_np.asarray(out), dtype, name))
    if len(dts) != 1:
        raise TypeError("k_out and v_out have different element types")
    return self._gather(seq_id, layer, first, k_out, v_out, dts.pop())


def _codec_quantize(self, x, dtype=None):
    """Quantize ``x`` (``[n, d]`` float32 / float16) with this codec.

    Returns ``(codes, scales, zeros)`` as uint8 arrays (scales / zeros empty
    when the codec has none); byte layouts as docs/codecs.md describes."""
    arr = _as_array(x, "x")
    if arr.ndim != 2:
        raise ValueError("x must be 2-D [n, d], got shape %s" % (arr.shape,))
    dt = _dtype_of(arr, dtype, "x")
    n, d = arr.shape
    sizes = self.sizes(n, d)
    codes = _np.empty(sizes.codes_bytes, _np.uint8)
    scales = _np.empty(sizes.scales_bytes, _np.uint8)
    zeros = _np.empty(sizes.zeros_bytes, _np.uint8)
    self._quantize(arr, dt, d, codes, scales, zeros)
    return codes, scales, zeros


def _codec_dequantize(self, codes, scales, zeros, n, d, dtype=_native.DTYPE_F32):
    """Dequantize what quantize() returned back to an ``[n, d]`` array."""
    npdt = _DTYPE_TO_NP.get(_operator.index(dtype))
    if npdt is None:
        raise TypeError("dtype must be DTYPE_F32, DTYPE_F16 or DTYPE_BF16")
    sizes = self.sizes(n, d)  # checks n and d before anything is allocated
    del sizes
    out = _np.empty((_operator.index(n), _operator.index(d)), npdt)
    def buf(b):
        return None if b is None or len(b) == 0 else _as_array(b, "codes")
    self._dequantize(_as_array(codes, "codes"), buf(scales), buf(zeros), n, d, out, int(dtype))
    return out


def _float_operand(x, name):
    """(numpy view, library dtype) of a q / out operand: a CPU torch tensor or
    a numpy array of float32 / float16 (bfloat16: torch tensors only)."""
    if _is_torch(x):
        return _torch_view(x, name)
    if not isinstance(x, _np.ndarray):
        raise TypeError("%s: expected a torch tensor or a numpy array, got %s" % (name, type(x).__name__))
    if not x.flags.c_contiguous:
        raise ValueError("%s: array of shape %s is not C-contiguous" % (name, x.shape))
    dt = _NP_TO_DTYPE.get(x.dtype)
    if dt is None:
        raise TypeError("%s: dtype %s is not float32 or float16" % (name, x.dtype))
    return x, dt


def _check_shape(x, want, name):
    if tuple(x.shape) != tuple(want):
        raise ValueError("%s: shape %s, expected %s" % (name, tuple(x.shape), tuple(want)))


def _new_like(q, shape, dt):
    """A new output of q's kind (torch tensor or numpy array) of library dtype dt."""
    if _is_torch(q):
        import torch
        tdt = {_native.DTYPE_F32: torch.float32, _native.DTYPE_F16: torch.float16, _native.DTYPE_BF16: torch.bfloat16}[dt]
        return torch.empty(shape, dtype=tdt)
    return _np.empty(shape, _DTYPE_TO_NP[dt])


def _out_and_lse(q, qdt, shape, out, lse, out_dtype):
    """The attention output (a new one of q's kind unless given) and lse, checked against
    shape: (out, its numpy view, its library dtype, lse's numpy view or None)."""
    if out is None:
        odt = qdt if out_dtype is None else _operator.index(out_dtype)
        if odt not in _DTYPE_NAMES:
            raise TypeError("out_dtype must be DTYPE_F32, DTYPE_F16 or DTYPE_BF16, got %r" % (out_dtype,))
        out = _new_like(q, shape, odt)
    oa, odt = _float_operand(out, "out")
    _check_shape(out, shape, "out")
    la = None
    if lse is not None:
        la, ldt = _float_operand(lse, "lse")
        if ldt != _native.DTYPE_F32:
            raise TypeError("lse: must be float32")
        _check_shape(lse, shape[:2], "lse")
    return out, oa, odt, la


def _attention_decode(self, layer, seq_ids, q, out, lse, scale, observe, num_threads, out_dtype, query_quant=0):
    """Pool.attention_decode: see kvc_attention_decode (include/kvcache/kvcache.h).

    seq_ids: sequence ids [n] (ints, or an int/uint64 array); q: [n, num_q_heads,
    head_dim] float32 / float16 (bfloat16 as a torch tensor), CPU, contiguous;
    out: None (a new tensor / array of q's kind, q's dtype unless out_dtype)
    or a caller tensor of that shape; lse: None or [n, num_q_heads] float32.
    Returns out. Raises ValueError / TypeError (shape, dtype, device, stride)
    or KvcError (the library's checks) with nothing written."""
    ids = _np.ascontiguousarray(_np.asarray(seq_ids, dtype=_np.uint64).reshape(-1))
    cfg = self.config()
    shape = (ids.shape[0], cfg.num_q_heads, cfg.head_dim)
    qa, qdt = _float_operand(q, "q")
    _check_shape(q, shape, "q")
    out, oa, odt, la = _out_and_lse(q, qdt, shape, out, lse, out_dtype)
    self._attention_decode(layer, ids, qa, oa, la, qdt, odt, float(scale), int(observe), int(num_threads),
                           int(query_quant))
    return out


def _attention_prefill(self, layer, seq_id, q, out, lse, scale, observe, observe_from, out_dtype, num_threads=1):
    """Pool.attention_prefill: see kvc_attention_prefill. q: [n_q, num_q_heads,
    head_dim] (the layer's last n_q tokens attend causally); out / lse as
    attention_decode; num_threads: blocks of 32 query rows over that many
    threads (the same output as one; observing calls use one). Returns out."""
    cfg = self.config()
    qa, qdt = _float_operand(q, "q")
    if q.ndim != 3 or tuple(q.shape[1:]) != (cfg.num_q_heads, cfg.head_dim):
        raise ValueError("q: shape %s is not [n_q, num_q_heads=%d, head_dim=%d]"
                         % (tuple(q.shape), cfg.num_q_heads, cfg.head_dim))
    shape = tuple(q.shape)
    out, oa, odt, la = _out_and_lse(q, qdt, shape, out, lse, out_dtype)
    self._attention_prefill(layer, seq_id, qa, oa, la, qdt, odt, float(scale), int(observe), int(observe_from),
                            int(num_threads))
    return out


def _observe_scores(self, seq_id, layer, scores, accumulate):
    arr = _np.ascontiguousarray(scores.numpy() if _is_torch(scores) else _np.asarray(scores), dtype=_np.float32)
    cfg = self.config()
    if arr.ndim != 2 or arr.shape[1] != cfg.num_kv_heads:
        raise ValueError("scores: shape %s is not [n_tokens, num_kv_heads=%d]" % (arr.shape, cfg.num_kv_heads))
    self._observe_scores(seq_id, layer, arr, bool(accumulate))


def _observe_queries(self, seq_id, layer, q, positions):
    arr = _np.ascontiguousarray(q.detach().float().cpu().numpy() if _is_torch(q) else _np.asarray(q),
                                dtype=_np.float32)
    pos = _np.ascontiguousarray(positions.cpu().numpy() if _is_torch(positions) else _np.asarray(positions),
                                dtype=_np.int64)
    cfg = self.config()
    if arr.ndim != 3 or arr.shape[1:] != (cfg.num_q_heads, cfg.head_dim):
        raise ValueError("q: shape %s is not [n, num_q_heads=%d, head_dim=%d]" % (arr.shape, cfg.num_q_heads,
                                                                                  cfg.head_dim))
    if pos.shape != (arr.shape[0],):
        raise ValueError("positions: shape %s, expected [%d]" % (pos.shape, arr.shape[0]))
    if pos.size and (pos.min() < 0 or pos.max() > 2**31 - 1):
        raise ValueError("positions must be in 0..2^31-1")
    self._observe_queries(seq_id, layer, arr if arr.size else None, pos.astype(_np.int32) if pos.size else None)


def _scores(self, seq_id, layer):
    cfg = self.config()
    out = _np.empty((self.layer_tokens(seq_id, layer), cfg.num_kv_heads), _np.float32)
    if out.size:
        self._scores(seq_id, layer, out)
    return out


def _value_bytes(v, name):
    """An extra key's value as bytes: None is none (empty), str is UTF-8."""
    if v is None:
        return b""
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise TypeError("extra key %r: expected str or bytes, got %s" % (name, type(v).__name__))


def _extra_values(pool, salt, extras, values):
    """The extra keys of a prefix call, in the pool's declared order, as the
    binding passes them to the library (each a u32 little-endian size and
    its bytes). See Pool.prefix_lookup."""
    names = pool.extra_key_names()
    if not names:  # positional (the legacy form): the salt, if any
        if extras or values:
            given = sorted(set(extras or ()) | set(values))
            raise TypeError("extra keys by name (%s) need a pool that declares them "
                            "(enable_prefix_cache(extra_key_names=[...])); this one takes the salt only"
                            % ", ".join(map(str, given)))
        vals = [] if salt is None or len(salt) == 0 else [_value_bytes(salt, "salt")]
    else:
        given = {}
        if extras is not None:
            for k, v in dict(extras).items():
                if k not in names:
                    raise KeyError("extra key %r is not declared by this pool (it declares %s)"
                                   % (k, ", ".join(names)))
                given[k] = v
        for k, v in ([("salt", salt)] if salt is not None else []) + list(values.items()):
            if k not in names:
                raise TypeError("unexpected keyword argument %r: this pool declares the extra-key names %s"
                                % (k, ", ".join(names)))
            if k in given:
                raise TypeError("extra key %r given twice" % k)
            given[k] = v
        vals = [_value_bytes(given.get(n), n) for n in names]
    return b"".join(_struct.pack("<I", len(v)) + v for v in vals)


def _prefix_keys(pool, tokens, blob):
    """Pool.prefix_keys: one bytes key per full block of the prompt."""
    blocks = len(tokens) // pool.config().block_size
    buf = bytearray(max(blocks, 1) * 32)
    ks = pool._prefix_keys_values(tokens, blob, buf)
    return [bytes(buf[i * ks:(i + 1) * ks]) for i in range(blocks)]


def _store_key(key, name, empty_ok=False):
    """A Store key or scope as bytes: str is UTF-8."""
    if isinstance(key, str):
        b = key.encode("utf-8")
    elif isinstance(key, (bytes, bytearray, memoryview)):
        b = bytes(key)
    else:
        raise TypeError("%s: expected str or bytes, got %s" % (name, type(key).__name__))
    if not b and not empty_ok:
        raise ValueError("%s: a key has at least one byte" % name)
    return b


def _store_value(x, name, writable):
    """A Store value (or a get_into target) as a buffer of its raw bytes,
    in place: bytes / bytearray / memoryview, a C-contiguous numpy array, or a
    contiguous CPU torch tensor of any dtype."""
    if _is_torch(x):
        if x.device.type != "cpu":
            raise ValueError("%s: tensor is on %s; a Store reads and writes CPU memory" % (name, x.device))
        if not x.is_contiguous():
            raise ValueError("%s: tensor of shape %s is not contiguous" % (name, tuple(x.shape)))
        import torch  # only reached with a torch tensor in hand
        t = x.detach().reshape(-1)
        return t.view(torch.uint8).numpy() if t.dtype != torch.uint8 else t.numpy()
    if isinstance(x, _np.ndarray):
        if not x.flags.c_contiguous:
            if writable:
                raise ValueError("%s: array is not C-contiguous" % name)
            x = _np.ascontiguousarray(x)
        return x.reshape(-1).view(_np.uint8)
    if isinstance(x, (bytes, bytearray, memoryview)):
        return x
    raise TypeError("%s: expected bytes, a numpy array or a CPU torch tensor, got %s" % (name, type(x).__name__))


# The classes' numpy-aware methods forward to these (kvcache_python.i).
_native._py_pool_append = _pool_append
_native._py_pool_gather = _pool_gather
_native._py_pool_gather_into = _pool_gather_into
_native._py_codec_quantize = _codec_quantize
_native._py_codec_dequantize = _codec_dequantize
_native._py_extra_values = _extra_values
_native._py_prefix_keys = _prefix_keys
_native._py_attention_decode = _attention_decode
_native._py_attention_prefill = _attention_prefill
_native._py_observe_scores = _observe_scores
_native._py_observe_queries = _observe_queries
_native._py_scores = _scores
_native._py_store_key = _store_key
_native._py_store_value = _store_value
