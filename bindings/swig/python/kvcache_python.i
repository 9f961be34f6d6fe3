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
  $action
  if (kvc_swig_err.status != KVC_OK) {
    kvc_py_raise();
    SWIG_fail;
  }
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
  if (PyObject_CheckBuffer($input)) {
    if (PyObject_GetBuffer($input, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) SWIG_fail;
    have = 1;
    const char *f = view.format ? view.format : "B";
    size_t fl = strlen(f);
    if (view.itemsize != 4 || fl == 0 || (f[fl - 1] != 'i' && !(f[fl - 1] == 'l' && sizeof(long) == 4))) {
      PyErr_Format(PyExc_TypeError, "tokens: expected int32 token ids, got a buffer of format '%s'", f);
      SWIG_fail;
    }
    $1 = ($1_ltype)view.buf;
    $2 = (size_t)(view.len / 4);
  } else {
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

%include "../kvcache_common.i"

%{
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

%extend kvc_swig_pool {
  %pythoncode %{
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
