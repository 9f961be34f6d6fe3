package kvcache

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// assertStatus: err is an *Error with this status and a non-empty message.
func assertStatus(t *testing.T, err error, status Status) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v (%T), want an *Error with %v", err, err, status)
	}
	if e.Status != status || e.Message == "" {
		t.Fatalf("err = %+v, want status %v and a message", e, status)
	}
	if !errors.Is(err, status) {
		t.Fatalf("errors.Is(%v, %v) is false", err, status)
	}
	if !strings.HasPrefix(err.Error(), status.String()+": ") {
		t.Fatalf("Error() = %q", err.Error())
	}
	return e
}

func TestErrorsBadDimensions(t *testing.T) {
	cfg := testConfig()
	cfg.NumKVHeads = 3 // 4 query heads are not a multiple of 3
	p, err := NewPool(cfg)
	if p != nil {
		t.Fatal("NewPool returned a pool")
	}
	assertStatus(t, err, ERR_INVALID_ARGUMENT)
	cfg = testConfig()
	cfg.HeadDim = 0
	_, err = NewPool(cfg)
	assertStatus(t, err, ERR_INVALID_ARGUMENT)
}

func TestErrorsUnknownSequence(t *testing.T) {
	p := newTestPool(t, testConfig())
	_, err := p.SeqLength(99)
	e := assertStatus(t, err, ERR_SEQ_NOT_FOUND)
	if !strings.Contains(e.Message, "99") {
		t.Fatalf("message %q does not name the sequence", e.Message)
	}
	assertStatus(t, p.SeqFork(99, 100), ERR_SEQ_NOT_FOUND)
	must(t, p.SeqCreate(1))
	assertStatus(t, p.SeqCreate(1), ERR_SEQ_EXISTS)
	if errors.Is(p.SeqCreate(1), ERR_SEQ_NOT_FOUND) {
		t.Fatal("errors.Is matched another status")
	}
}

func TestErrorsExhaustedPool(t *testing.T) {
	p := newTestPool(t, testConfig())
	must(t, p.SeqCreate(1))
	// 64 blocks of 16 tokens over 2 layers hold 512 tokens of one sequence:
	// 513 never fit.
	assertStatus(t, p.Reserve(1, 513), ERR_EXCEEDS_CAPACITY)
	if n := must1[uint64](t)(p.SeqLength(1)); n != 0 {
		t.Fatalf("length %d after a failed reserve", n)
	}
	// Room another sequence holds: not now.
	must(t, p.SeqCreate(2))
	must(t, p.Reserve(2, 16))
	assertStatus(t, p.Reserve(1, 512), ERR_POOL_EXHAUSTED)
	must(t, p.SeqFree(2))
	must(t, p.Reserve(1, 512))
}

func TestErrorsBadBuffers(t *testing.T) {
	p := newTestPool(t, testConfig())
	must(t, p.SeqCreate(1))
	must(t, p.Reserve(1, 2))
	r := random(row, 1)
	_, err := p.Append(1, 0, 0, make([]float32, row+1), make([]float32, row+1))
	assertStatus(t, err, ERR_INVALID_ARGUMENT) // not whole rows: the binding's check
	_, err = p.Append(1, 0, 0, r, make([]float32, 2*row))
	assertStatus(t, err, ERR_INVALID_ARGUMENT) // K and V differ
	_, err = p.Append(1, 0, 2, r, r)
	assertStatus(t, err, ERR_NOT_RESERVED)
	_, err = p.Append(1, 0, 0, nil, nil)
	assertStatus(t, err, ERR_INVALID_ARGUMENT) // no data
	_, err = p.Gather(1, 0, 0, nil, []float32{})
	assertStatus(t, err, ERR_NULL_POINTER) // empty = nil: no output
	_, err = p.Positions(1, 5, 0, 1)
	assertStatus(t, err, ERR_OUT_OF_RANGE) // layer 5
	_, err = p.BlockTable(42, 0)
	assertStatus(t, err, ERR_SEQ_NOT_FOUND)
	must1[uint64](t)(p.Append(1, 0, 0, r, r)) // the pool still works
}

func TestErrorsCloseTwiceAndUseAfterClose(t *testing.T) {
	p, err := NewPool(testConfig())
	must(t, err)
	must(t, p.SeqCreate(1))
	if p.Closed() {
		t.Fatal("Closed() before Close")
	}
	must(t, p.Close())
	must(t, p.Close()) // harmless
	if !p.Closed() {
		t.Fatal("Closed() after Close is false")
	}
	_, err = p.SeqLength(1)
	if e := assertStatus(t, err, ERR_NULL_POINTER); !strings.Contains(e.Message, "closed") {
		t.Fatalf("message %q", e.Message)
	}
	_, err = p.Stats()
	assertStatus(t, err, ERR_NULL_POINTER)
	_, err = p.Append(1, 0, 0, make([]float32, row), make([]float32, row))
	assertStatus(t, err, ERR_NULL_POINTER)

	cfg := DefaultPolicyConfig()
	cfg.Kind, cfg.RecentTokens = POLICY_STREAMING, 8
	pol, err := NewPolicy(cfg)
	must(t, err)
	must(t, pol.Close())
	must(t, pol.Close())
	if !pol.Closed() {
		t.Fatal("policy Closed() is false")
	}
	other := newTestPool(t, testConfig())
	must(t, other.SeqCreate(1))
	assertStatus(t, other.SetPolicy(pol), ERR_NULL_POINTER)
	_, err = other.Evict(1, pol)
	assertStatus(t, err, ERR_NULL_POINTER)
}

// Goroutines move between OS threads between calls: every failure must still
// carry its own call's message (status and message are read in the same
// native call). Each goroutine asks for its own unknown sequence id.
func TestErrorsConcurrentMessages(t *testing.T) {
	p := newTestPool(t, testConfig())
	must(t, p.SeqCreate(1))
	const workers, iters = 8, 2000
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			seq := uint64(1000 + w)
			for i := 0; i < iters; i++ {
				_, err := p.SeqLength(seq)
				var e *Error
				if !errors.As(err, &e) || e.Status != ERR_SEQ_NOT_FOUND ||
					!strings.Contains(e.Message, fmt.Sprint(seq)) {
					errs <- fmt.Errorf("worker %d: %v", w, err)
					return
				}
				if _, err := p.SeqLength(1); err != nil { // a success in between
					errs <- err
					return
				}
				runtime.Gosched()
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// Panics that are not library failures go through (here: SWIG's own).
func TestErrorsOtherPanicsPropagate(t *testing.T) {
	defer func() {
		if r := recover(); r == nil {
			t.Fatal("no panic")
		}
	}()
	_ = call(func() { panic("not a kvcache failure") })
}

// A nil *Pool or a zero Pool (not made by NewPool) returns ERR_NULL_POINTER
// from every method instead of panicking; so does a nil or zero *Policy.
func TestErrorsNilAndZeroPool(t *testing.T) {
	pc := DefaultPrefixConfig()
	for _, p := range []*Pool{nil, {}} {
		calls := map[string]func() error{
			"Close":       p.Close,
			"Config":      func() error { _, err := p.Config(); return err },
			"Stats":       func() error { _, err := p.Stats(); return err },
			"SeqCreate":   func() error { return p.SeqCreate(1) },
			"SeqFork":     func() error { return p.SeqFork(1, 2) },
			"SeqTruncate": func() error { return p.SeqTruncate(1, 0) },
			"SeqFree":     func() error { return p.SeqFree(1) },
			"SeqLength":   func() error { _, err := p.SeqLength(1); return err },
			"LayerTokens": func() error { _, err := p.LayerTokens(1, 0); return err },
			"Reserve":     func() error { return p.Reserve(1, 1) },
			"Append":      func() error { _, err := p.Append(1, 0, 0, make([]float32, row), make([]float32, row)); return err },
			"Append16": func() error {
				_, err := p.Append16(1, 0, 0, make([]Float16, row), make([]Float16, row), DTYPE_F16)
				return err
			},
			"Gather": func() error { _, err := p.Gather(1, 0, 0, make([]float32, row), nil); return err },
			"Gather16": func() error {
				_, err := p.Gather16(1, 0, 0, make([]Float16, row), nil, DTYPE_F16)
				return err
			},
			"Positions":         func() error { _, err := p.Positions(1, 0, 0, 1); return err },
			"BlockTable":        func() error { _, err := p.BlockTable(1, 0); return err },
			"SetPolicy":         func() error { return p.SetPolicy(nil) },
			"SeqSetPolicy":      func() error { return p.SeqSetPolicy(1, nil) },
			"Evict":             func() error { _, err := p.Evict(1, nil); return err },
			"EnablePrefixCache": func() error { return p.EnablePrefixCache(&pc) },
			"PrefixLookup":      func() error { _, err := p.PrefixLookup([]int32{1}, 0, ""); return err },
			"PrefixAttach":      func() error { _, err := p.PrefixAttach(1, []int32{1}, 0, ""); return err },
			"PrefixInsert":      func() error { _, err := p.PrefixInsert(1, []int32{1}, ""); return err },
			"PrefixStats":       func() error { _, err := p.PrefixStats(); return err },
		}
		for name, f := range calls {
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Errorf("%s on %#v panicked: %v", name, p, r)
					}
				}()
				assertStatus(t, f(), ERR_NULL_POINTER)
			}()
		}
		if !p.Closed() {
			t.Errorf("Closed() of %#v is false", p)
		}
	}
	for _, pol := range []*Policy{nil, {}} {
		assertStatus(t, pol.Close(), ERR_NULL_POINTER)
		if !pol.Closed() {
			t.Errorf("Closed() of %#v is false", pol)
		}
	}
}

// A zero Policy passed to a pool is an error, not "no policy" (which would
// detach the pool's policy): only a nil *Policy means none.
func TestErrorsZeroPolicyArgument(t *testing.T) {
	p := newTestPool(t, testConfig())
	cfg := DefaultPolicyConfig()
	cfg.Kind, cfg.SinkTokens, cfg.RecentTokens = POLICY_STREAMING, 4, 16
	pol, err := NewPolicy(cfg)
	must(t, err)
	defer pol.Close()
	must(t, p.SeqCreate(1))
	must(t, p.Reserve(1, 40))
	for l := uint32(0); l < layers; l++ {
		must1[uint64](t)(p.Append(1, l, 0, random(40*row, int64(l)), random(40*row, int64(9+l))))
	}
	must(t, p.SetPolicy(pol))
	zero := &Policy{}
	assertStatus(t, p.SetPolicy(zero), ERR_NULL_POINTER)
	assertStatus(t, p.SeqSetPolicy(1, zero), ERR_NULL_POINTER)
	_, err = p.Evict(1, zero)
	assertStatus(t, err, ERR_NULL_POINTER)
	// The pool's policy is still the streaming one.
	if got := must1[[]uint64](t)(p.Evict(1, nil)); !reflect.DeepEqual(got, perLayer(40-4-16)) {
		t.Fatalf("Evict dropped %v", got)
	}
}

// []Float16 data only with DTYPE_F16 or DTYPE_BF16: no reinterpretation as f32 (or as codes).
func TestErrorsFloat16NeedsHalfDtype(t *testing.T) {
	p := newTestPool(t, testConfig())
	must(t, p.SeqCreate(1))
	must(t, p.Reserve(1, 2))
	data := random(2*row, 5)
	must1[uint64](t)(p.Append(1, 0, 0, data, data))
	h := make([]Float16, 2*row) // zeros: as f32, one token of zeros
	for _, dt := range []DType{DTYPE_F32, DTYPE_INT8, DTYPE_FP8_E4M3, DType(99)} {
		_, err := p.Append16(1, 0, 0, h, h, dt)
		if e := assertStatus(t, err, ERR_INVALID_ARGUMENT); !strings.Contains(e.Message, "Append16") {
			t.Fatalf("message %q", e.Message)
		}
		_, err = p.Gather16(1, 0, 0, h, nil, dt)
		assertStatus(t, err, ERR_INVALID_ARGUMENT)
	}
	out := make([]float32, 2*row)
	must1[uint64](t)(p.Gather(1, 0, 0, out, nil))
	assertF16Close(t, "K after refused Append16 calls", data, out)
	must1[uint64](t)(p.Append16(1, 0, 0, h, h, DTYPE_BF16))

	c := DefaultCodec()
	s := must1[QuantSizes](t)(c.Sizes(1, headDim))
	codes, scales := make([]byte, s.CodesBytes), make([]byte, s.ScalesBytes)
	_, err := c.Quantize16(make([]Float16, headDim), DTYPE_F32, headDim, codes, scales, nil)
	assertStatus(t, err, ERR_INVALID_ARGUMENT)
	must1[uint64](t)(c.Quantize16(make([]Float16, headDim), DTYPE_F16, headDim, codes, scales, nil))
	assertStatus(t, c.Dequantize16(codes, scales, nil, 1, headDim, make([]Float16, headDim), DTYPE_F32),
		ERR_INVALID_ARGUMENT)
	must(t, c.Dequantize16(codes, scales, nil, 1, headDim, make([]Float16, headDim), DTYPE_BF16))
}
