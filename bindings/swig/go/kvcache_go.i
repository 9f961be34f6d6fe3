/*
 * Go overlay of bindings/swig/kvcache_common.i:
 *   swig -go -cgo -intgosize 64 -c++ kvcache_go.i
 * writes native.go + a C++ wrapper: the package
 * libkvcache.org/kvcache/internal/native, which the hand-written package
 * libkvcache.org/kvcache (module/ here) wraps into the public Go API.
 *
 * Errors: SWIG's Go functions have no error result, so a failed call panics
 * from inside the native call, with status and message read there:
 * %exception calls kvc_go_raise(), which calls back into the exported Go
 * function kvcacheGoRaise (below) with kvc_swig_err.status and the message;
 * it panics with a *native.Failure. The public package runs each native call
 * under a deferred recover() that turns a *Failure into an *kvcache.Error and
 * lets every other panic through. The panic unwinds the wrapper's C++ frame
 * without running destructors, so nothing that owns memory may be alive in
 * it at that point: string arguments live in thread-local buffers (typemap
 * below) and the vector results are emptied first (%exception of positions,
 * evict and block_table).
 *
 * Buffers: []byte (the public package passes []float32 / []uint16 as bytes,
 * no copy). An empty or nil slice arrives as (NULL, 0). Token ids: []int32.
 */
%module native

%insert(cgo_comment) %{
#cgo pkg-config: kvcache
#cgo CXXFLAGS: -std=c++17 -fno-strict-aliasing
%}

%exception {
  kvc_swig_err.status = KVC_OK;
  try {
    $action
  } catch (const std::exception &e) {
    kvc_swig_on_exception(e);
  }
  if (kvc_swig_err.status != KVC_OK) {
    kvc_go_raise();
  }
}
/* These return a std::vector: free its buffer before the panic skips its destructor. */
%exception kvc_swig_pool::positions {
  kvc_swig_err.status = KVC_OK;
  try {
    $action
  } catch (const std::exception &e) {
    kvc_swig_on_exception(e);
  }
  if (kvc_swig_err.status != KVC_OK) {
    std::vector<int32_t>().swap(result);
    kvc_go_raise();
  }
}
%exception kvc_swig_pool::evict {
  kvc_swig_err.status = KVC_OK;
  try {
    $action
  } catch (const std::exception &e) {
    kvc_swig_on_exception(e);
  }
  if (kvc_swig_err.status != KVC_OK) {
    std::vector<unsigned long long>().swap(result);
    kvc_go_raise();
  }
}
%exception kvc_swig_store::contains_many {
  kvc_swig_err.status = KVC_OK;
  try {
    $action
  } catch (const std::exception &e) {
    kvc_swig_on_exception(e);
  }
  if (kvc_swig_err.status != KVC_OK) {
    std::vector<int32_t>().swap(result);
    kvc_go_raise();
  }
}
%exception kvc_swig_pool::block_table {
  kvc_swig_err.status = KVC_OK;
  try {
    $action
  } catch (const std::exception &e) {
    kvc_swig_on_exception(e);
  }
  if (kvc_swig_err.status != KVC_OK) {
    std::vector<int32_t>().swap(result);
    kvc_go_raise();
  }
}

/* ---- bytes ---- */
%typemap(gotype) (const void *IN_BUF, size_t IN_BYTES), (void *OUT_BUF, size_t OUT_BYTES) "[]byte"
%typemap(in) (const void *IN_BUF, size_t IN_BYTES), (void *OUT_BUF, size_t OUT_BYTES) {
  if ($input.len > 0) {
    $1 = ($1_ltype)$input.array;
    $2 = ($2_ltype)$input.len;
  } else {
    $1 = NULL;
    $2 = 0;
  }
}

/* ---- token ids ---- */
%typemap(gotype) (const int32_t *TOKENS, size_t N_TOKENS) "[]int32"
%typemap(in) (const int32_t *TOKENS, size_t N_TOKENS) {
  if ($input.len > 0) {
    $1 = ($1_ltype)$input.array;
    $2 = (size_t)$input.len;
  } else {
    $1 = NULL;
    $2 = 0;
  }
}

/* Overload resolution (default arguments become overloads; SWIG's Go
 * dispatcher picks by argument count and Go type, these set the order). */
%typemap(typecheck, precedence=SWIG_TYPECHECK_POINTER) (const void *IN_BUF, size_t IN_BYTES),
    (void *OUT_BUF, size_t OUT_BYTES) ""
%typemap(typecheck, precedence=SWIG_TYPECHECK_INT32_ARRAY) (const int32_t *TOKENS, size_t N_TOKENS) ""

/* ---- strings: no std::string local the panic could leak ---- */
%include <std_string.i>  /* first, so the common file's %include of it adds nothing after this */
%typemap(in) const std::string & %{
  $1 = ($1_ltype)kvc_go_string($argnum, $input.p, $input.n);
%}
%typemap(freearg) const std::string & %{
  kvc_go_string_clear($argnum);
%}

/* The Go side of the error path (package native). */
%insert(go_wrapper) %{
// Failure is the panic value of a failed call: the library's (or the
// binding's) status and message, both read inside the failing native call.
// Package kvcache recovers it into an *kvcache.Error.
type Failure struct {
	Status  int
	Message string
}

func (f *Failure) Error() string { return fmt.Sprintf("kvcache status %d: %s", f.Status, f.Message) }

//export kvcacheGoRaise
func kvcacheGoRaise(status C.int, msg *C.char, n C.int) {
	panic(&Failure{Status: int(status), Message: C.GoStringN(msg, n)})
}
%}
%go_import("fmt")

%include "../kvcache_common.i"

%{
/* Exported by native.go (cgo //export): panics with a *native.Failure, so it
 * never returns to its caller. */
extern "C" [[noreturn]] void kvcacheGoRaise(int status, char *msg, int n);

/* Raises the Go panic for kvc_swig_err; does not return. Only trivially
 * destructible objects may be alive in the calling frames (see the top). */
[[noreturn]] static void kvc_go_raise(void) {
  int status = (int)kvc_swig_err.status;
  kvc_swig_err.status = KVC_OK;
  const std::string &m = kvc_swig_err.message;
  int n = m.size() > (size_t)0x7fffffff ? 0x7fffffff : (int)m.size();
  kvcacheGoRaise(status, (char *)m.data(), n);
}

/* String arguments: per-thread buffers by argument number, reused, so a
 * panic that skips the wrapper's destructors leaks nothing. */
static thread_local std::string kvc_go_strings[16];
static const std::string *kvc_go_string(int argnum, const char *p, intgo n) {
  std::string &s = kvc_go_strings[argnum & 15];
  s.assign(p != NULL ? p : "", p != NULL ? (size_t)n : 0);
  return &s;
}
static void kvc_go_string_clear(int argnum) {
  kvc_go_strings[argnum & 15].clear();
}
%}
