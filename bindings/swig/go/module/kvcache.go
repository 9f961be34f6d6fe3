// Package kvcache is the Go binding of libkvcache, a paged KV cache for
// transformer inference: pools of fixed-size blocks, sequences with
// copy-on-write forks, eviction policies (StreamingLLM, H2O, SnapKV...),
// a prefix cache and standalone quantizers.
//
// It wraps the SWIG binding generated from bindings/swig/kvcache_common.i
// (package internal/native, built with cgo against the library found through
// pkg-config). Every call that can fail returns an error, an *Error carrying
// the library's status and message, both captured inside the failing native
// call. Pools and policies hold library objects: Close them (a finalizer
// frees those never closed, after a GC).
package kvcache

import (
	"unsafe"

	"libkvcache.org/kvcache/internal/native"
)

// Error is a failed call: the status (one of the ERR_* constants) and the
// library's message. Use errors.As to get it, or errors.Is(err, ERR_...) to
// test the status.
type Error struct {
	Status  Status
	Message string
}

// Error returns "KVC_ERR_...: message".
func (e *Error) Error() string { return e.Status.String() + ": " + e.Message }

// Is reports whether target is the Status of e, for errors.Is(err, ERR_SEQ_NOT_FOUND).
func (e *Error) Is(target error) bool {
	s, ok := target.(Status)
	return ok && s == e.Status
}

// call runs one native call. A failed call panics from inside the native
// code with a *native.Failure (see kvcache_go.i); it becomes an *Error here.
// Any other panic goes on.
func call(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if fl, ok := r.(*native.Failure); ok {
				err = &Error{Status: Status(fl.Status), Message: fl.Message}
				return
			}
			panic(r)
		}
	}()
	f()
	return nil
}

// Version is the library's version, e.g. "0.4.0".
func Version() string { return native.Version() }

// DTypeSize is the size in bytes of one element of f32, f16 or bf16.
func DTypeSize(dtype DType) (size uint64, err error) {
	err = call(func() { size = uint64(native.Dtype_size(native.Kvc_dtype(dtype))) })
	return size, err
}

// Float16 is the element type of f16 and bf16 data: the 16-bit pattern.
type Float16 = uint16

// bytesOf views a slice as its bytes (no copy); empty: nil.
func bytesOf[T float32 | uint16](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}

// takeUints copies a native vector of uint64 and frees it.
func takeUints(v native.UInt64Vector) []uint64 {
	defer native.DeleteUInt64Vector(v)
	out := make([]uint64, v.Size())
	for i := range out {
		out[i] = uint64(v.Get(i))
	}
	return out
}

// takeInts copies a native vector of int32 and frees it.
func takeInts(v native.Int32Vector) []int32 {
	defer native.DeleteInt32Vector(v)
	out := make([]int32, v.Size())
	for i := range out {
		out[i] = int32(v.Get(i))
	}
	return out
}
