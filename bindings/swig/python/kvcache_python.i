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
%rename(_put) kvc_swig_store::put;
%rename(_get_into) kvc_swig_store::get_into;
%rename(_contains_many) kvc_swig_store::contains_many;
%rename(_remove) kvc_swig_store::remove;
%rename(_pin) kvc_swig_store::pin;
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

%{
#include <string>
#include <kvcache/kvcache.h>
#include "tools/cli/strategy.h"
static void kvc_swig_fail(kvc_status status, const std::string &message);

/* Element bytes of a q / out dtype (f32, f16, bf16), or 0 after recording the error. */
static size_t kvc_py_float_bytes(const char *what, int dtype) {
  if (dtype == KVC_DTYPE_F32) return 4;
  if (dtype == KVC_DTYPE_F16 || dtype == KVC_DTYPE_BF16) return 2;
  kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, std::string(what) + ": dtype " + std::to_string(dtype) +
                " is not f32, f16 or bf16");
  return 0;
}
/* Checks that a buffer holds exactly `want` bytes. */
static bool kvc_py_exact(const char *what, size_t have, size_t want, const std::string &shape) {
  if (have == want) return true;
  kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, std::string(what) + " holds " + std::to_string(have) + " bytes; " +
                shape + " needs " + std::to_string(want));
  return false;
}
%}

/* Attention and scores (Python only for now): buffers as above. */
%apply (const void *IN_BUF, size_t IN_BYTES) {
  (const void *seq_ids, size_t seq_ids_bytes), (const void *q, size_t q_bytes),
  (const void *scores, size_t scores_bytes), (const void *keep, size_t keep_bytes),
  (const void *head_keep, size_t head_keep_bytes),
  (const void *positions, size_t positions_bytes)
};
%apply (void *OUT_BUF, size_t OUT_BYTES) {
  (void *out, size_t out_bytes), (void *lse, size_t lse_bytes), (void *scores_out, size_t scores_out_bytes)
};
%rename(_attention_decode) kvc_swig_pool::attention_decode;
%rename(_attention_prefill) kvc_swig_pool::attention_prefill;
%rename(_observe_scores) kvc_swig_pool::observe_scores;
%rename(_observe_queries) kvc_swig_pool::observe_queries;
%rename(_scores) kvc_swig_pool::scores;
%rename(_keep) kvc_swig_pool::keep;
%rename(_keep_head) kvc_swig_pool::keep_head;
%rename(_with_head_gates) kvc_swig_policy::with_head_gates;
%rename(_set_key_smoothing) kvc_swig_pool::set_key_smoothing;
%rename(_set_codebook) kvc_swig_pool::set_codebook;
%rename(_codebook_gaussian) codebook_gaussian;

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


/* ---- attention, scores, strategies (Python overlay) ---- */

/* Members read as copies (a tuple of the layer ids, new Codec objects), so
 * `parse_strategy(...).layer_ids` outlives its temporary strategy (a
 * reference into it was a use-after-free; helper-30); layer_ids is read-only
 * (it must stay as long as the hidden codec tables). */
%naturalvar kvc_py_strategy::layer_ids;
%immutable kvc_py_strategy::layer_ids;
%ignore kvc_py_strategy::k_codec; /* read through the copying properties below */
%ignore kvc_py_strategy::v_codec;
%ignore kvc_py_strategy::layer_k;
%ignore kvc_py_strategy::layer_v;

%newobject pool_with_layer_codecs;
%inline %{
/** A parsed `kvcache eval` strategy (tools/cli/strategy.h, the same parser). */
struct kvc_py_strategy {
  std::string spec;            /* canonical spelling: policy first, then codec */
  std::string policy_name;     /* "" without a policy */
  int k_dtype = KVC_DTYPE_F16, v_dtype = KVC_DTYPE_F16;
  bool k_quantized = false, v_quantized = false;
  kvc_codec k_codec, v_codec;  /* meaningful when k_quantized / v_quantized */
  uint32_t residual_window = 0;
  double residual_fraction = 0.0;
  uint32_t residual_sinks = 0;
  int residual_dtype = KVC_DTYPE_F16; /* residual-int8: KVC_DTYPE_INT8 (kvc_pool_config.residual_dtype) */
  bool pre_rope_keys = false;
  double key_smooth = 0.0;     /* smooth=A: key smoothing from the model's key statistics; 0 none */
  double key_qsmooth = 0.0;    /* qsmooth=B: the smoothing divided by the queries' rms ^ B; 0 none */
  bool k_codebook = false, v_codebook = false; /* codebook: the built-in Gaussian levels (kvc_pool_set_codebook) */
  bool k_codebook_fit = false, v_codebook_fit = false; /* codebook=fit: levels fitted to the model (a codebook file) */
  uint32_t block_size = 16;
  int protocol = 0;            /* 0 none, 1 stream (cap per layer, auto-evict), 2 prefill-compress */
  int policy_kind = KVC_POLICY_NONE;
  double budget = 1.0;         /* fraction kept */
  uint32_t budget_tokens = 0;  /* stream: fixed cap per layer (0: budget x context) */
  uint32_t sinks = 4;
  double recent_fraction = 0.5;
  uint32_t obs_window = 16;
  uint32_t kernel = 7;
  int pooling = KVC_POOLING_MAX;
  int schedule = KVC_PYRAMID_PAPER;
  double prefill_fraction = 0.5;
  bool shift_positions = false;
  int observe = KVC_OBSERVE_NONE;
  uint32_t future_positions = 512; /* expected-attention */
  bool reconstruct = false;        /* kvzip: the context-reconstruction pass runs before the eviction */
  uint32_t recon_chunk = 128;      /* kvzip: context tokens per reconstruction pass */
  bool headwise = false;           /* a head-wise pool (KVC_POOL_HEADWISE): 'headwise' flag or adakv */
  int head_budget = KVC_HEAD_BUDGET_UNIFORM; /* adakv: KVC_HEAD_BUDGET_ADAKV */
  double head_floor = 0.2;         /* adakv: floor=F */
  double duo_stream_share = 0.5;   /* duo-attention: heads=F, the share of KV heads that stream */
  uint32_t duo_window = 64;        /* duo-attention: window=W, a streaming head's recent tokens */
  int duo_stream_head = -1;        /* duo-attention: stream-head=I (only head I streams), -1 none */
  /* Per-layer codecs (BASE@LAYERS=CODECS): layer layer_ids[i] stores K with layer_k[i] and V
   * with layer_v[i] (a float dtype with KVC_SCALE_NONE: plain storage); empty: none. */
  std::vector<unsigned long long> layer_ids;
  std::vector<kvc_codec> layer_k, layer_v;
};

/** Parses one strategy spec with `kvcache eval`'s parser; raises ERR_INVALID_ARGUMENT naming what is wrong. */
static kvc_py_strategy parse_strategy(const std::string &spec) {
  kvc_py_strategy r;
  kvc_codec_init(&r.k_codec);
  kvc_codec_init(&r.v_codec);
  try {
    const kvc_cli::Strategy s = kvc_cli::parse_strategy(spec);
    r.spec = s.spec;
    r.policy_name = s.has_policy ? s.policy.name : std::string();
    r.k_dtype = s.k_dtype;
    r.v_dtype = s.v_dtype;
    r.k_quantized = s.k_quantized;
    r.v_quantized = s.v_quantized;
    r.k_codec = s.k_codec;
    r.v_codec = s.v_codec;
    r.residual_window = s.residual_window;
    r.residual_fraction = s.residual_fraction;
    r.residual_sinks = s.residual_sinks;
    r.residual_dtype = s.residual_dtype;
    r.pre_rope_keys = s.pre_rope_keys;
    r.key_smooth = s.key_smooth;
    r.key_qsmooth = s.key_qsmooth;
    r.k_codebook = s.codebook[0];
    r.v_codebook = s.codebook[1];
    r.k_codebook_fit = s.codebook_fit[0];
    r.v_codebook_fit = s.codebook_fit[1];
    r.block_size = s.block_size;
    r.protocol = (int)s.protocol;
    r.policy_kind = s.policy_kind;
    r.budget = s.budget;
    r.budget_tokens = s.budget_tokens;
    r.sinks = s.sinks;
    r.recent_fraction = s.recent_fraction;
    r.obs_window = s.obs_window;
    r.kernel = s.kernel;
    r.pooling = s.pooling;
    r.schedule = s.schedule;
    r.prefill_fraction = s.prefill_fraction;
    r.shift_positions = s.shift_positions;
    r.observe = s.observe;
    r.future_positions = s.future_positions;
    r.reconstruct = s.reconstruct;
    r.recon_chunk = s.recon_chunk;
    r.headwise = s.headwise;
    r.head_budget = s.head_budget;
    r.head_floor = s.head_floor;
    r.duo_stream_share = s.duo_stream_share;
    r.duo_window = s.duo_window;
    r.duo_stream_head = s.duo_stream_head;
    for (const kvc_cli::Strategy::LayerPart &lp : s.layer_parts)
      for (uint32_t l : lp.layers) {
        r.layer_ids.push_back(l);
        r.layer_k.push_back(lp.k);
        r.layer_v.push_back(lp.v);
      }
  } catch (const std::exception &e) {
    kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, e.what());
  }
  return r;
}

/**
 * A pool (kvc_pool_create) of config with a strategy's codecs, per layer where it has
 * BASE@LAYERS=CODECS parts (kvc_pool_config.layer_k_codecs / layer_v_codecs): layer layer_ids[i]
 * stores K / V with the part's codecs, the others with the base's (plain: the config's dtypes).
 * Raises ERR_INVALID_ARGUMENT for a listed layer out of range; what the pool refuses, as
 * kvc_pool_create.
 */
static kvc_swig_pool *pool_with_layer_codecs(const kvc_pool_config *config,
                                             const kvc_py_strategy &st) {
  if (config == NULL) {
    kvc_swig_fail(KVC_ERR_NULL_POINTER, "config is null");
    return NULL;
  }
  kvc_pool_config c = *config;
  c.k_codec = st.k_quantized ? &st.k_codec : NULL;
  c.v_codec = st.v_quantized ? &st.v_codec : NULL;
  if (!st.layer_ids.empty() && (c.num_layers == 0 || c.num_layers > 4096)) {  // before any table
    kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "num_layers " + std::to_string(c.num_layers) +
                  ": must be 1..4096 (with per-layer codecs)");
    return NULL;
  }
  if (st.layer_k.size() != st.layer_ids.size() || st.layer_v.size() != st.layer_ids.size()) {
    kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "the strategy's layer tables differ in length");
    return NULL;
  }
  std::vector<const kvc_codec *> kt, vt;
  if (!st.layer_ids.empty()) {
    kt.assign(c.num_layers, c.k_codec);
    vt.assign(c.num_layers, c.v_codec);
  }
  for (size_t i = 0; i < st.layer_ids.size(); ++i) {
    if (st.layer_ids[i] >= c.num_layers) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "layer " + std::to_string(st.layer_ids[i]) +
                    ": the pool has " + std::to_string(c.num_layers) + " layers");
      return NULL;
    }
    kt[st.layer_ids[i]] = &st.layer_k[i];
    vt[st.layer_ids[i]] = &st.layer_v[i];
  }
  if (!st.layer_ids.empty()) {
    c.layer_k_codecs = kt.data();
    c.layer_v_codecs = vt.data();
  }
  kvc_pool *p = NULL;
  if (kvc_swig_check(kvc_pool_create(&c, &p))) return NULL;
  kvc_swig_pool *h = new kvc_swig_pool;
  h->p = p;
  return h;
}

/** The default strategies of `kvcache eval` (one spec each). */
static std::vector<std::string> default_strategies() { return kvc_cli::default_strategies(); }
%}

%extend kvc_py_strategy {
  /** Copies of the base codecs (the k_codec / v_codec properties). */
  kvc_codec _k_codec_copy() { return $self->k_codec; }
  kvc_codec _v_codec_copy() { return $self->v_codec; }
  %pythoncode %{
    k_codec = property(_k_codec_copy, doc="The key codec (a copy; meaningful when k_quantized).")
    v_codec = property(_v_codec_copy, doc="The value codec (a copy; meaningful when v_quantized).")
  %}
  /** The key codec of layer_ids[i] (a float dtype with SCALE_NONE: plain storage). */
  kvc_codec layer_k_codec(size_t i) {
    if (i >= $self->layer_k.size()) {
      kvc_swig_fail(KVC_ERR_OUT_OF_RANGE, "index " + std::to_string(i) + ": the strategy lists " +
                    std::to_string($self->layer_k.size()) + " layers");
      kvc_codec c;
      kvc_codec_init(&c);
      return c;
    }
    return $self->layer_k[i];
  }
  /** The value codec of layer_ids[i]. */
  kvc_codec layer_v_codec(size_t i) {
    if (i >= $self->layer_v.size()) {
      kvc_swig_fail(KVC_ERR_OUT_OF_RANGE, "index " + std::to_string(i) + ": the strategy lists " +
                    std::to_string($self->layer_v.size()) + " layers");
      kvc_codec c;
      kvc_codec_init(&c);
      return c;
    }
    return $self->layer_v[i];
  }
}

%extend kvc_swig_pool {
  /**
   * kvc_attention_decode over raw buffers: seq_ids `[n]` uint64, q `[n][num_q_heads][head_dim]`
   * of q_dtype, out the same shape of out_dtype, lse empty or `[n][num_q_heads]` f32.
   * Every size is checked before the library runs; nothing is written on failure.
   */
  void attention_decode(uint32_t layer, const void *seq_ids, size_t seq_ids_bytes, const void *q, size_t q_bytes,
                        void *out, size_t out_bytes, void *lse, size_t lse_bytes, int q_dtype = KVC_DTYPE_F32,
                        int out_dtype = KVC_DTYPE_F32, double scale = 0.0, int observe = KVC_OBSERVE_NONE,
                        uint32_t num_threads = 1, int query_quant = KVC_QUERY_EXACT) {
    KVC_POOL();
    kvc_pool_config c;
    kvc_pool_config_init_sized(&c, sizeof c);
    if (kvc_swig_check(kvc_pool_get_config(pool_, &c))) return;
    if (seq_ids == NULL || seq_ids_bytes == 0 || seq_ids_bytes % 8 != 0) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "seq_ids must hold one or more uint64 ids, got " +
                    std::to_string(seq_ids_bytes) + " bytes");
      return;
    }
    if (((uintptr_t)seq_ids) % 8 != 0) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "seq_ids is not 8-byte aligned");
      return;
    }
    const size_t n = seq_ids_bytes / 8;
    const size_t qe = kvc_py_float_bytes("q", q_dtype), oe = kvc_py_float_bytes("out", out_dtype);
    if (qe == 0 || oe == 0) return;
    const size_t elems = n * c.num_q_heads * c.head_dim;
    const std::string shape = "[" + std::to_string(n) + "][" + std::to_string(c.num_q_heads) + "][" +
                              std::to_string(c.head_dim) + "]";
    if (q == NULL || out == NULL) {
      kvc_swig_fail(KVC_ERR_NULL_POINTER, "q and out are required");
      return;
    }
    if (!kvc_py_exact("q", q_bytes, elems * qe, shape) || !kvc_py_exact("out", out_bytes, elems * oe, shape)) return;
    if (lse != NULL && !kvc_py_exact("lse", lse_bytes, n * c.num_q_heads * 4,
                                     "[" + std::to_string(n) + "][" + std::to_string(c.num_q_heads) + "] f32"))
      return;
    kvc_attention_params p;
    kvc_attention_params_init_sized(&p, sizeof p);
    p.num_q_heads = c.num_q_heads;
    p.scale = (float)scale;
    p.q_dtype = (kvc_dtype)q_dtype;
    p.out_dtype = (kvc_dtype)out_dtype;
    p.observe = (kvc_observe)observe;
    p.num_threads = num_threads;
    p.query_quant = (kvc_query_quant)query_quant;
    kvc_swig_check(kvc_attention_decode(pool_, layer, (const uint64_t *)seq_ids, n, q, out, (float *)lse, &p));
  }

  /**
   * kvc_attention_prefill: the layer's last n_q tokens attend causally; q `[n_q][num_q_heads][head_dim]`
   * (n_q from q's size), out the same shape, lse empty or `[n_q][num_q_heads]` f32.
   */
  void attention_prefill(uint32_t layer, uint64_t seq_id, const void *q, size_t q_bytes, void *out,
                         size_t out_bytes, void *lse, size_t lse_bytes, int q_dtype = KVC_DTYPE_F32,
                         int out_dtype = KVC_DTYPE_F32, double scale = 0.0, int observe = KVC_OBSERVE_NONE,
                         uint64_t observe_from = 0, uint32_t num_threads = 1) {
    KVC_POOL();
    kvc_pool_config c;
    kvc_pool_config_init_sized(&c, sizeof c);
    if (kvc_swig_check(kvc_pool_get_config(pool_, &c))) return;
    const size_t qe = kvc_py_float_bytes("q", q_dtype), oe = kvc_py_float_bytes("out", out_dtype);
    if (qe == 0 || oe == 0) return;
    if (q == NULL || out == NULL) {
      kvc_swig_fail(KVC_ERR_NULL_POINTER, "q and out are required");
      return;
    }
    const size_t row = (size_t)c.num_q_heads * c.head_dim;
    if (q_bytes == 0 || q_bytes % (row * qe) != 0) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "q holds " + std::to_string(q_bytes) + " bytes, not a whole number of [" +
                    std::to_string(c.num_q_heads) + "][" + std::to_string(c.head_dim) + "] query rows");
      return;
    }
    const uint64_t n_q = q_bytes / (row * qe);
    const std::string shape = "[" + std::to_string(n_q) + "][" + std::to_string(c.num_q_heads) + "][" +
                              std::to_string(c.head_dim) + "]";
    if (!kvc_py_exact("out", out_bytes, n_q * row * oe, shape)) return;
    if (lse != NULL && !kvc_py_exact("lse", lse_bytes, n_q * c.num_q_heads * 4,
                                     "[" + std::to_string(n_q) + "][" + std::to_string(c.num_q_heads) + "] f32"))
      return;
    kvc_attention_params p;
    kvc_attention_params_init_sized(&p, sizeof p);
    p.num_q_heads = c.num_q_heads;
    p.scale = (float)scale;
    p.q_dtype = (kvc_dtype)q_dtype;
    p.out_dtype = (kvc_dtype)out_dtype;
    p.observe = (kvc_observe)observe;
    p.observe_from = observe_from;
    p.num_threads = num_threads;
    kvc_swig_check(kvc_attention_prefill(pool_, layer, seq_id, q, n_q, out, (float *)lse, &p));
  }

  /** kvc_seq_observe_scores: scores `[n_tokens][num_kv_heads]` f32 (n_tokens = the layer's count). */
  void observe_scores(uint64_t seq_id, uint32_t layer, const void *scores, size_t scores_bytes, bool accumulate) {
    KVC_POOL();
    kvc_pool_config c;
    kvc_pool_config_init_sized(&c, sizeof c);
    if (kvc_swig_check(kvc_pool_get_config(pool_, &c))) return;
    const size_t row = (size_t)c.num_kv_heads * 4;
    if (scores == NULL || scores_bytes % row != 0) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "scores must be [n_tokens][" + std::to_string(c.num_kv_heads) +
                    "] f32, got " + std::to_string(scores_bytes) + " bytes");
      return;
    }
    kvc_swig_check(kvc_seq_observe_scores(pool_, seq_id, layer, (const float *)scores, scores_bytes / row,
                                          accumulate ? 1 : 0));
  }

  /** kvc_seq_observe_queries: q `[n][num_q_heads][head_dim]` f32, positions `[n]` int32. */
  void observe_queries(uint64_t seq_id, uint32_t layer, const void *q, size_t q_bytes, const void *positions,
                       size_t positions_bytes) {
    KVC_POOL();
    kvc_pool_config c;
    kvc_pool_config_init_sized(&c, sizeof c);
    if (kvc_swig_check(kvc_pool_get_config(pool_, &c))) return;
    const size_t row = (size_t)c.num_q_heads * c.head_dim * 4;
    if (q_bytes % row != 0 || positions_bytes != q_bytes / row * 4) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "q must be [n][" + std::to_string(c.num_q_heads) + "][" +
                    std::to_string(c.head_dim) + "] f32 and positions [n] int32, got " + std::to_string(q_bytes) +
                    " and " + std::to_string(positions_bytes) + " bytes");
      return;
    }
    kvc_swig_check(kvc_seq_observe_queries(pool_, seq_id, layer, q, KVC_DTYPE_F32, q_bytes / row, c.num_q_heads,
                                           (const int32_t *)positions));
  }

  /** kvc_seq_keep: keep `[n]` uint64 token indices (strictly increasing) of one layer; returns the tokens dropped. */
  uint64_t keep(uint64_t seq_id, uint32_t layer, const void *keep, size_t keep_bytes) {
    KVC_POOL(0);
    if (keep_bytes % 8 != 0 || (keep != NULL && ((uintptr_t)keep) % 8 != 0)) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "keep must be an aligned uint64 array, got " +
                    std::to_string(keep_bytes) + " bytes");
      return 0;
    }
    uint64_t dropped = 0;
    kvc_swig_check(kvc_seq_keep(pool_, seq_id, layer, keep_bytes ? (const uint64_t *)keep : NULL, keep_bytes / 8,
                                &dropped));
    return dropped;
  }

  /** kvc_seq_keep_head: keep `[n]` uint64 token indices of one KV head of a head-wise pool. */
  uint64_t keep_head(uint64_t seq_id, uint32_t layer, uint32_t head, const void *head_keep,
                     size_t head_keep_bytes) {
    KVC_POOL(0);
    if (head_keep_bytes % 8 != 0 || (head_keep != NULL && ((uintptr_t)head_keep) % 8 != 0)) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "keep must be an aligned uint64 array, got " +
                    std::to_string(head_keep_bytes) + " bytes");
      return 0;
    }
    uint64_t dropped = 0;
    kvc_swig_check(kvc_seq_keep_head(pool_, seq_id, layer, head,
                                     head_keep_bytes ? (const uint64_t *)head_keep : NULL,
                                     head_keep_bytes / 8, &dropped));
    return dropped;
  }

  /** kvc_seq_scores into scores_out `[n_tokens][num_kv_heads]` f32. */
  void scores(uint64_t seq_id, uint32_t layer, void *scores_out, size_t scores_out_bytes) {
    KVC_POOL();
    kvc_pool_config c;
    kvc_pool_config_init_sized(&c, sizeof c);
    if (kvc_swig_check(kvc_pool_get_config(pool_, &c))) return;
    const size_t row = (size_t)c.num_kv_heads * 4;
    if (scores_out == NULL || scores_out_bytes % row != 0) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "scores_out must be [n_tokens][" + std::to_string(c.num_kv_heads) +
                    "] f32, got " + std::to_string(scores_out_bytes) + " bytes");
      return;
    }
    kvc_swig_check(kvc_seq_scores(pool_, seq_id, layer, (float *)scores_out, scores_out_bytes / row));
  }
}

%extend kvc_py_strategy {
  %pythoncode %{
    def __repr__(self):
        return "Strategy(%r, policy=%r, k_dtype=%d, v_dtype=%d, protocol=%d, budget=%g)" % (
            self.spec, self.policy_name, self.k_dtype, self.v_dtype, self.protocol, self.budget)
  %}
}

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

    def attention_decode(self, layer, seq_ids, q, out=None, lse=None, scale=0.0, observe=0, num_threads=1,
                         out_dtype=None, query_quant=0):
        """Decode attention (kvc_attention_decode) for a batch: q [n, num_q_heads, head_dim]; returns out.
        query_quant: QUERY_EXACT (0, default), QUERY_INT8 (an int8 query against integer keys) or
        QUERY_INT8_VALUES (also int8 values summed in integers), within the bounds kvcache.h gives."""
        return _py_attention_decode(self, layer, seq_ids, q, out, lse, scale, observe, num_threads, out_dtype,
                                    query_quant)

    def attention_prefill(self, layer, seq_id, q, out=None, lse=None, scale=0.0, observe=0, observe_from=0,
                          out_dtype=None, num_threads=1):
        """Prefill attention (kvc_attention_prefill): q [n_q, num_q_heads, head_dim]; returns out."""
        return _py_attention_prefill(self, layer, seq_id, q, out, lse, scale, observe, observe_from, out_dtype,
                                     num_threads)

    def observe_scores(self, seq_id, layer, scores, accumulate=False):
        """Feed scores [n_tokens, num_kv_heads] f32 (kvc_seq_observe_scores)."""
        return _py_observe_scores(self, seq_id, layer, scores, accumulate)

    def observe_queries(self, seq_id, layer, q, positions):
        """Feed query rows q [n, num_q_heads, head_dim] (as the attention gets them, rotated at
        positions [n]) to the layer's query statistics, for expected-attention eviction
        (kvc_seq_observe_queries)."""
        return _py_observe_queries(self, seq_id, layer, q, positions)

    def keep(self, seq_id, layer, indices):
        """Keep exactly these token indices of one layer (kvc_seq_keep; strictly increasing); returns the tokens dropped."""
        import numpy as _np
        idx = _np.ascontiguousarray(_np.asarray(indices, dtype=_np.int64).reshape(-1))
        if idx.size and idx.min() < 0:
            raise ValueError("keep: negative token index %d" % idx.min())
        return self._keep(seq_id, layer, idx.view(_np.uint64) if idx.size else None)

    def keep_head(self, seq_id, layer, head, indices):
        """Keep exactly these token indices of one KV head of a head-wise pool (KVC_POOL_HEADWISE;
        kvc_seq_keep_head; strictly increasing); its emptied blocks are freed. Returns the tokens dropped."""
        import numpy as _np
        idx = _np.ascontiguousarray(_np.asarray(indices, dtype=_np.int64).reshape(-1))
        if idx.size and idx.min() < 0:
            raise ValueError("keep_head: negative token index %d" % idx.min())
        return self._keep_head(seq_id, layer, head, idx.view(_np.uint64) if idx.size else None)

    def scores(self, seq_id, layer):
        """The recorded scores of a layer, [n_tokens, num_kv_heads] f32 (kvc_seq_scores)."""
        return _py_scores(self, seq_id, layer)

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
    def export_llama(self, seq_id, k_type=LLAMA_F16, v_type=None, llama_seq_id=0, flags=0):
        """The sequence as a llama.cpp sequence state blob (kvc_seq_export_llama) as bytes, for
        llama_state_seq_set_data(); v_type defaults to k_type. import_llama() takes it back."""
        v_type = k_type if v_type is None else v_type
        buf = bytearray(self.export_llama_size(seq_id, llama_seq_id, k_type, v_type, flags))
        return bytes(buf[:self.export_llama_into(seq_id, llama_seq_id, k_type, v_type, flags, buf)])
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

/* Pool.set_key_smoothing: numbers converted to float32, like the gates below. */
%extend kvc_swig_pool {
  %pythoncode %{
    def set_key_smoothing(self, scale, offset=None):
        """Per-channel key smoothing (kvc_pool_set_key_smoothing, docs/codecs.md): keys are stored as codes of
        (k - offset) / scale per channel, read back as decoded * scale + offset. `scale` and `offset`:
        num_layers x num_kv_heads x head_dim numbers each (any shape, converted to float32; a torch tensor
        or numpy array too), or bytes of native float32 values; offset None means zeros; scale None removes
        the smoothing. Only on a pool with no sequence and no prefix cache. Raises KvcError
        (ERR_INVALID_ARGUMENT: a wrong count, a value out of range, a pool holding sequences; ERR_UNSUPPORTED:
        CUDA or head-wise pools) and TypeError for what is not numbers."""
        import numpy as _np

        def as_f32(x, what):
            if x is None:
                return b""
            if isinstance(x, (bytes, bytearray)):
                return x
            if hasattr(x, "detach"):  # a torch tensor
                x = x.detach().cpu().double().numpy()
            arr = _np.asarray(x)
            if arr.dtype.kind not in "biuf":
                raise TypeError("set_key_smoothing: %s must be numbers, got an array of %s" % (what, arr.dtype))
            return _np.ascontiguousarray(arr, dtype=_np.float32).reshape(-1)

        if scale is None and offset is not None:
            raise ValueError("set_key_smoothing: an offset needs a scale")
        return self._set_key_smoothing(as_f32(scale, "scale"), as_f32(offset, "offset"))
  %}
}

/* Pool.set_codebook and codebook_gaussian: numbers converted to float32, like
 * set_key_smoothing above. */
%extend kvc_swig_pool {
  %pythoncode %{
    def set_codebook(self, part, levels):
        """A codebook of the pool's keys (part 0) or values (part 1) (kvc_pool_set_codebook, docs/codecs.md):
        the part's int2/int3/int4 codes index non-uniform levels instead of the evenly spaced integers; each
        scale group stores its signed extreme e and a value x reads back as the level nearest to x / e, times
        e. `levels`: num_layers x 2^bits numbers, layer by layer (any shape, converted to float32; a torch
        tensor or numpy array too), each in [-1, 1] and strictly ascending within a layer, or bytes of native
        float32 values; None or empty removes the part's codebook (codebook_gaussian() gives levels for
        rotated values). Only on a pool with no sequence and no prefix cache. Raises KvcError
        (ERR_INVALID_ARGUMENT: part not 0 or 1, a codec that takes no codebook, a wrong count, a level out of
        range or order, a pool holding sequences; ERR_UNSUPPORTED: CUDA or head-wise pools) and TypeError
        for what is not numbers."""
        import numpy as _np
        if levels is None:
            buf = b""
        elif isinstance(levels, (bytes, bytearray)):
            buf = levels
        else:
            if hasattr(levels, "detach"):  # a torch tensor
                levels = levels.detach().cpu().double().numpy()
            arr = _np.asarray(levels)
            if arr.size and arr.dtype.kind not in "biuf":
                raise TypeError("set_codebook: levels must be numbers, got an array of %s" % arr.dtype)
            buf = _np.ascontiguousarray(arr, dtype=_np.float32).reshape(-1) if arr.size else b""
        return self._set_codebook(part, buf)
  %}
}

%pythoncode %{
def codebook_gaussian(bits, group_size):
    """The built-in codebook for rotated values (kvc_codebook_gaussian): the Lloyd-Max levels of groups of
    `group_size` Gaussian values normalized by their signed extreme (head_dim for per-token scales), a list
    of 2^bits ascending floats in [-1, 1] for bits 2, 3 or 4. Pool.set_codebook takes one such list per
    layer. Raises KvcError (ERR_INVALID_ARGUMENT: bits outside 2..4, group_size 0)."""
    import numpy as _np
    buf = _np.zeros(16, dtype=_np.float32)
    n = _codebook_gaussian(bits, group_size, buf)
    return [float(x) for x in buf[:n]]
%}

/* Policy.with_head_gates: numbers converted to float32 (a buffer of another
 * dtype is never read as raw float32 bytes). */
%extend kvc_swig_policy {
  %pythoncode %{
    @staticmethod
    def with_head_gates(config, gates):
        """A DuoAttention policy (config.kind POLICY_DUO_ATTENTION) with its per-(layer, KV head) gates in
        [0, 1], num_layers x num_kv_heads, layer by layer (kvc_policy_config.head_gates, copied): a
        sequence or array of numbers (converted to float32), or bytes of native float32 values. Raises
        KvcError (ERR_INVALID_ARGUMENT: no gates, a gate outside [0, 1] or NaN, more than 2^20;
        ERR_NULL_POINTER: no config) and TypeError / ValueError for what is not numbers."""
        import numpy as _np
        if isinstance(gates, (bytes, bytearray)):
            buf = gates
        else:
            if hasattr(gates, "detach"):  # a torch tensor
                gates = gates.detach().cpu().double().numpy()
            arr = _np.asarray(gates)
            if arr.dtype.kind not in "biuf":
                raise TypeError("with_head_gates: gates must be numbers, got an array of %s" % arr.dtype)
            buf = _np.ascontiguousarray(arr, dtype=_np.float32).reshape(-1)
        return Policy._with_head_gates(config, buf)
  %}
}

/* Store: keys as str (UTF-8) or bytes; values as bytes, numpy arrays or CPU
 * torch tensors of any dtype, read and written in place (__init__.py's
 * _py_store_* helpers). */
%extend kvc_swig_store {
  %pythoncode %{
    @classmethod
    def host(cls, capacity_bytes, scope=b""):
        """A store in this process's memory: `capacity_bytes` with LRU replacement."""
        return cls(TIER_HOST, capacity_bytes, "", "", 0, 1000, 0, _py_store_key(scope, "scope", True))

    @classmethod
    def disk(cls, path, capacity_bytes, scope=b"", fsync=False):
        """A store in a directory (shared by processes; survives them)."""
        return cls(TIER_DISK, capacity_bytes, str(path), "", TIER_FSYNC if fsync else 0, 1000, 0,
                   _py_store_key(scope, "scope", True))

    @classmethod
    def redis(cls, address, scope=b"", cluster=False, timeout_ms=1000, ttl_seconds=0):
        """A store on a Redis server ("host:port") or a Redis Cluster (seed nodes "h:p,h:p,...")."""
        return cls(TIER_REDIS, 0, "", address, TIER_REDIS_CLUSTER if cluster else 0, timeout_ms, ttl_seconds,
                   _py_store_key(scope, "scope", True))

    def put(self, key, value):
        """Store `value` (bytes, a numpy array or a CPU torch tensor, its raw bytes) under `key` (str or bytes)."""
        self._put(_py_store_key(key, "key"), _py_store_value(value, "value", False))

    def get_into(self, key, out):
        """Read the value of `key` into `out` (bytearray, numpy array or CPU torch tensor, written in place):
        the value's length, or -1 on a miss. A longer value than `out` is not read (its length is returned)."""
        return self._get_into(_py_store_key(key, "key"), _py_store_value(out, "out", True))

    def get(self, key, size_hint=65536):
        """The value of `key` as bytes, or None on a miss."""
        k = _py_store_key(key, "key")
        buf = bytearray(max(int(size_hint), 1))
        while True:
            n = self._get_into(k, buf)
            if n < 0:
                return None
            if n <= len(buf):
                return bytes(buf[:n])
            buf = bytearray(n)  # replaced by a longer value meanwhile: loop

    def contains(self, keys):
        """[bool] for each key (one round trip per Redis server)."""
        if isinstance(keys, (str, bytes, bytearray, memoryview)):
            raise TypeError("keys: expected a list of keys, got one %s (use `key in store`)" % type(keys).__name__)
        ks = [_py_store_key(k, "keys[%d]" % i) for i, k in enumerate(keys)]
        if not ks:
            return []
        return [bool(f) for f in self._contains_many(b"".join(ks), [len(k) for k in ks])]

    def __contains__(self, key):
        return self.contains([key])[0]

    def remove(self, key):
        """Remove the value of `key`: whether there was one."""
        return self._remove(_py_store_key(key, "key"))

    def pin(self, key):
        """Pin the value of `key` against LRU replacement (host and disk stores): whether it was there."""
        return self._pin(_py_store_key(key, "key"), True)

    def unpin(self, key):
        """Undo one pin(): whether the value was pinned."""
        return self._pin(_py_store_key(key, "key"), False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
  %}
}
