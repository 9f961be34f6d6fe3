/*
 * Python overlay of bindings/swig/kvcache_common.i: builds the extension
 * module kvcache._native (SWIG proxy module kvcache.native). The package's
 * __init__.py adds the numpy / DLPack conveniences on top.
 *
 * Errors: a failed call raises kvcache.KvcError(status, message), both read
 * inside the failing native call. Buffers: any object with the buffer
 * protocol (numpy arrays, bytes, bytearray, memoryview), C-contiguous, passed
 * without a copy. The GIL is released while the library runs (-threads).
 */
%module(package="kvcache", moduleimport="from . import _native") native

%{
#define SWIG_FILE_WITH_INIT
%}

%exception {
  kvc_swig_err.status = KVC_OK;
  try {
    $action
  } catch (const std::exception &e) {
    kvc_swig_on_exception(e);
  }
  if (kvc_swig_err.status != KVC_OK) {
    kvc_py_raise();
    SWIG_fail;
  }
}

/* Default arguments as Python defaults (one wrapper, keyword arguments), and
 * no attributes that C does not have: `cfg.num_block = 5` is an error, not a
 * silently ignored setting. */
%feature("compactdefaultargs");
%feature("kwargs");
%pythonnondynamic;

/* Integers: anything with __index__ (numpy integer scalars too), range-checked. */
%typemap(in) uint64_t {
  PyObject *idx = PyNumber_Index($input);
  if (idx == NULL) SWIG_fail;
  unsigned long long v = PyLong_AsUnsignedLongLong(idx);
  Py_DECREF(idx);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Format(PyExc_OverflowError, "%s: %s", "$1_name", "must be an integer in [0, 2^64)");
    SWIG_fail;
  }
  $1 = (uint64_t)v;
}
%typemap(in) uint32_t {
  PyObject *idx = PyNumber_Index($input);
  if (idx == NULL) SWIG_fail;
  unsigned long long v = PyLong_AsUnsignedLongLong(idx);
  Py_DECREF(idx);
  if ((v == (unsigned long long)-1 && PyErr_Occurred()) || v > UINT32_MAX) {
    PyErr_Clear();
    PyErr_Format(PyExc_OverflowError, "%s: %s", "$1_name", "must be an integer in [0, 2^32)");
    SWIG_fail;
  }
  $1 = (uint32_t)v;
}
%typemap(typecheck, precedence=SWIG_TYPECHECK_UINT64) uint64_t, uint32_t {
  $1 = PyIndex_Check($input) ? 1 : 0;
}

/* ---- read-only bytes ---- */
%typemap(in) (const void *IN_BUF, size_t IN_BYTES) (Py_buffer view, int have = 0) {
  if ($input == Py_None) {
    $1 = NULL;
    $2 = 0;
  } else {
    if (PyObject_GetBuffer($input, &view, PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous buffer (numpy array, bytes, memoryview), got %s",
                   "$1_name", Py_TYPE($input)->tp_name);
      SWIG_fail;
    }
    have = 1;
    $1 = view.buf;
    $2 = (size_t)view.len;
  }
}
%typemap(freearg) (const void *IN_BUF, size_t IN_BYTES) {
  if (have$argnum) PyBuffer_Release(&view$argnum);
}

/* ---- writable bytes ---- */
%typemap(in) (void *OUT_BUF, size_t OUT_BYTES) (Py_buffer view, int have = 0) {
  if ($input == Py_None) {
    $1 = NULL;
    $2 = 0;
  } else {
    if (PyObject_GetBuffer($input, &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) {
      PyErr_Format(PyExc_TypeError, "%s: expected a writable C-contiguous buffer (numpy array, bytearray), got %s",
                   "$1_name", Py_TYPE($input)->tp_name);
      SWIG_fail;
    }
    have = 1;
    $1 = view.buf;
    $2 = (size_t)view.len;
  }
}
%typemap(freearg) (void *OUT_BUF, size_t OUT_BYTES) {
  if (have$argnum) PyBuffer_Release(&view$argnum);
}

/* ---- token ids: an int32 buffer (no copy) or any sequence of ints ---- */
%typemap(in) (const int32_t *TOKENS, size_t N_TOKENS) (Py_buffer view, int have = 0, std::vector<int32_t> tmp) {
  /* A C-contiguous native-order int32 buffer is read in place; anything else
   * iterable (a list, a strided int32 array) is converted element by element. */
  if (PyObject_CheckBuffer($input) && PyObject_GetBuffer($input, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
    have = 1;
    const char *f = view.format ? view.format : "B";
    size_t fl = strlen(f);
    bool native = fl == 1 || (fl == 2 && (f[0] == '@' || f[0] == '=' || (f[0] == '<' && SWIG_IsLittleEndian())));
    char c = fl ? f[fl - 1] : 0;
    if (view.itemsize != 4 || !native || (c != 'i' && !(c == 'l' && sizeof(long) == 4))) {
      PyErr_Format(PyExc_TypeError, "tokens: expected native-order int32 token ids, got a buffer of format '%s'", f);
      SWIG_fail;
    }
    $1 = ($1_ltype)view.buf;
    $2 = (size_t)(view.len / 4);
  } else {
    PyErr_Clear();
    if (PyObject_CheckBuffer($input)) {
      /* A strided buffer: only integer formats may be converted. */
      Py_buffer probe;
      if (PyObject_GetBuffer($input, &probe, PyBUF_FULL_RO) == 0) {
        const char *f = probe.format ? probe.format : "B";
        char c = f[strlen(f) - 1];
        bool ok = probe.itemsize == 4 && c == 'i' && f[0] != '>' && f[0] != '!';
        PyBuffer_Release(&probe);
        if (!ok) {
          PyErr_Format(PyExc_TypeError, "tokens: expected int32 token ids, got a buffer of format '%s'", f);
          SWIG_fail;
        }
      }
      PyErr_Clear();
    }
    PyObject *seq = PySequence_Fast($input, "tokens: expected a sequence of ints or an int32 array");
    if (seq == NULL) SWIG_fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    tmp.resize((size_t)n);
    for (Py_ssize_t i = 0; i < n; ++i) {
      long long x = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
      if (x == -1 && PyErr_Occurred()) {
        Py_DECREF(seq);
        SWIG_fail;
      }
      if (x < INT32_MIN || x > INT32_MAX) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_OverflowError, "tokens[%zd] = %lld does not fit in int32", i, x);
        SWIG_fail;
      }
      tmp[(size_t)i] = (int32_t)x;
    }
    Py_DECREF(seq);
    $1 = ($1_ltype)tmp.data();
    $2 = tmp.size();
  }
}
%typemap(freearg) (const int32_t *TOKENS, size_t N_TOKENS) {
  if (have$argnum) PyBuffer_Release(&view$argnum);
}

/* Overload resolution (default arguments become overloads). */
%typemap(typecheck, precedence=SWIG_TYPECHECK_POINTER) (const void *IN_BUF, size_t IN_BYTES),
    (void *OUT_BUF, size_t OUT_BYTES) {
  $1 = ($input == Py_None || PyObject_CheckBuffer($input)) ? 1 : 0;
}
%typemap(typecheck, precedence=SWIG_TYPECHECK_INT32_ARRAY) (const int32_t *TOKENS, size_t N_TOKENS) {
  $1 = (PyObject_CheckBuffer($input) || PySequence_Check($input)) ? 1 : 0;
}

/* Raw methods behind the numpy-aware ones of __init__.py. */
%rename(_append) kvc_swig_pool::append;
%rename(_gather) kvc_swig_pool::gather;
%rename(_quantize) kvc_codec::quantize;
%rename(_dequantize) kvc_codec::dequantize;
%rename(_evict) kvc_swig_pool::evict;
/* The prefix calls take extra keys by name (or the positional salt) in
 * Python (__init__.py) and reach the library through the _values methods. */
%rename(_prefix_lookup) kvc_swig_pool::prefix_lookup;
%rename(_prefix_attach) kvc_swig_pool::prefix_attach;
%rename(_prefix_insert) kvc_swig_pool::prefix_insert;
%rename(_prefix_offload) kvc_swig_pool::prefix_offload;
%rename(_prefix_load) kvc_swig_pool::prefix_load;
%rename(_prefix_prefetch) kvc_swig_pool::prefix_prefetch;
%rename(_prefix_lookup_values) kvc_swig_pool::prefix_lookup_values;
%rename(_prefix_attach_values) kvc_swig_pool::prefix_attach_values;
%rename(_prefix_insert_values) kvc_swig_pool::prefix_insert_values;
%rename(_prefix_keys_values) kvc_swig_pool::prefix_keys_values;
%rename(_prefix_offload_values) kvc_swig_pool::prefix_offload_values;
%rename(_prefix_load_values) kvc_swig_pool::prefix_load_values;
%rename(_prefix_prefetch_values) kvc_swig_pool::prefix_prefetch_values;

%include "../kvcache_common.i"

%{
static int SWIG_IsLittleEndian(void) {
  const uint16_t one = 1;
  return *(const uint8_t *)&one == 1;
}
static PyObject *kvc_py_error_type = NULL;

/* Raises kvcache.KvcError(status, message) from kvc_swig_err. */
static void kvc_py_raise(void) {
  PyObject *type = kvc_py_error_type != NULL ? kvc_py_error_type : PyExc_RuntimeError;
  PyObject *msg = PyUnicode_DecodeUTF8(kvc_swig_err.message.data(), (Py_ssize_t)kvc_swig_err.message.size(),
                                       "replace");
  PyObject *args = msg != NULL ? Py_BuildValue("(iN)", (int)kvc_swig_err.status, msg) : NULL;
  if (args != NULL) {
    PyErr_SetObject(type, args);
    Py_DECREF(args);
  }
  kvc_swig_err.status = KVC_OK;
}
%}

%inline %{
/* Called once by the package: the class failed calls raise. */
static void _register_error(PyObject *type) {
  Py_XINCREF(type);
  Py_XDECREF(kvc_py_error_type);
  kvc_py_error_type = type;
}
%}

/* The numpy-aware methods: thin forwarders to the package's functions
 * (bindings/python/kvcache/__init__.py installs _py_* in this module). */
%extend kvc_codec {
  %pythoncode %{
    def quantize(self, x, dtype=None):
        """Quantize an [n, d] array; returns (codes, scales, zeros) uint8 arrays."""
        return _py_codec_quantize(self, x, dtype)

    def dequantize(self, codes, scales, zeros, n, d, dtype=DTYPE_F32):
        """Dequantize what quantize() returned into a new [n, d] array."""
        return _py_codec_dequantize(self, codes, scales, zeros, n, d, dtype)
  %}
}
%extend kvc_swig_pool {
  %pythoncode %{
    def append(self, seq_id, layer, pos, k, v, dtype=None):
        """Write K and V ([n, num_kv_heads, head_dim] arrays) at positions [pos, pos + n); returns n."""
        return _py_pool_append(self, seq_id, layer, pos, k, v, dtype)

    def gather(self, seq_id, layer, first=0, n=None, dtype=DTYPE_F32, k=True, v=True):
        """Read the layer's tokens [first, first + n) into new arrays; returns (k, v)."""
        return _py_pool_gather(self, seq_id, layer, first, n, dtype, k, v)

    def gather_into(self, seq_id, layer, first, k_out, v_out, dtype=None):
        """Read into caller arrays (either may be None); returns n."""
        return _py_pool_gather_into(self, seq_id, layer, first, k_out, v_out, dtype)

    def evict(self, seq_id, policy=None):
        """Evict with policy (None: the sequence's or the pool's); returns the tokens each layer dropped, a list of num_layers ints."""
        return list(self._evict(seq_id, policy))

    def prefix_lookup(self, tokens, flags=0, salt=None, extras=None, **values):
        """Cached leading tokens of a prompt (a PrefixResult).

        Extra keys: on a pool that declares names
        (``enable_prefix_cache(extra_key_names=[...])``) by name, as keyword
        arguments (``salt="tenant-a", adapter="lora-7"``) or a dict
        (``extras={"media": h}``); str (UTF-8) or bytes; a name left out has
        no value. An unknown name raises TypeError (keyword) or KeyError
        (dict). On a pool without names, ``salt`` is the one positional extra
        key (empty or None: none)."""
        return self._prefix_lookup_values(tokens, flags, _py_extra_values(self, salt, extras, values))
    def prefix_attach(self, seq_id, tokens, flags=0, salt=None, extras=None, **values):
        """Create seq_id holding the cached prefix of the prompt (extra keys as prefix_lookup)."""
        return self._prefix_attach_values(seq_id, tokens, flags, _py_extra_values(self, salt, extras, values))
    def prefix_insert(self, seq_id, tokens, salt=None, extras=None, **values):
        """Register the full blocks of a sequence's prompt; returns the blocks newly registered (extra keys as prefix_lookup)."""
        return self._prefix_insert_values(seq_id, tokens, _py_extra_values(self, salt, extras, values))
    def prefix_keys(self, tokens, salt=None, extras=None, **values):
        """The chain keys of the prompt's full blocks (docs/prefix-cache.md): a list of bytes, one per block (extra keys as prefix_lookup)."""
        return _py_prefix_keys(self, tokens, _py_extra_values(self, salt, extras, values))
    def prefix_offload(self, tokens, salt=None, extras=None, **values):
        """Queue the prompt's registered blocks for writing to every tier; returns the blocks queued (extra keys as prefix_lookup)."""
        return self._prefix_offload_values(tokens, _py_extra_values(self, salt, extras, values))
    def prefix_load(self, tokens, salt=None, extras=None, **values):
        """Load the tier blocks after the pool's hit of a prompt and wait; returns the tokens loaded (extra keys as prefix_lookup)."""
        return self._prefix_load_values(tokens, _py_extra_values(self, salt, extras, values))
    def prefix_prefetch(self, tokens, salt=None, extras=None, **values):
        """Start loading as prefix_load() does, in the background; returns the ticket for prefix_poll()."""
        return self._prefix_prefetch_values(tokens, _py_extra_values(self, salt, extras, values))
    def save(self, seq_id):
        """The sequence's record (kvc_seq_save) as bytes; restore() takes it back."""
        while True:
            buf = bytearray(self.save_size(seq_id))
            try:
                return bytes(buf[:self.save_into(seq_id, buf)])
            except KvcError as e:  # the sequence grew meanwhile: size again
                if e.status != ERR_BUFFER_TOO_SMALL:
                    raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
  %}
}
%extend kvc_swig_policy {
  %pythoncode %{
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
  %}
}
