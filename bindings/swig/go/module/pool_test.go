package kvcache

import (
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestPoolVersionAndSizes(t *testing.T) {
	if v := Version(); !strings.HasPrefix(v, "0.") {
		t.Fatalf("Version() = %q", v)
	}
	if s := ERR_POOL_EXHAUSTED.String(); s != "KVC_ERR_POOL_EXHAUSTED" {
		t.Fatalf("status name %q", s)
	}
	if n := must1[uint64](t)(DTypeSize(DTYPE_BF16)); n != 2 {
		t.Fatalf("DTypeSize(bf16) = %d", n)
	}
}

func TestPoolConfigRoundTrip(t *testing.T) {
	p := newTestPool(t, testConfig())
	cfg := must1[PoolConfig](t)(p.Config())
	if cfg.NumLayers != layers || cfg.NumKVHeads != kvHeads || cfg.HeadDim != headDim || cfg.KDType != DTYPE_F16 {
		t.Fatalf("Config() = %+v", cfg)
	}
	st := must1[Stats](t)(p.Stats())
	if st.BlocksTotal != numBlocks || st.BlocksFree != numBlocks {
		t.Fatalf("Stats() = %+v", st)
	}
}

// Append to two layers, fork, write into the child (copy-on-write), read both back.
func TestPoolAppendForkGather(t *testing.T) {
	const n = 40
	p := newTestPool(t, testConfig())
	must(t, p.SeqCreate(1))
	must(t, p.Reserve(1, n))
	k := make([][]float32, layers)
	v := make([][]float32, layers)
	for l := 0; l < layers; l++ {
		k[l], v[l] = random(n*row, int64(10+l)), random(n*row, int64(20+l))
		if got := must1[uint64](t)(p.Append(1, uint32(l), 0, k[l], v[l])); got != n {
			t.Fatalf("Append = %d", got)
		}
	}
	if got := must1[uint64](t)(p.SeqLength(1)); got != n {
		t.Fatalf("SeqLength = %d", got)
	}
	must(t, p.SeqFork(1, 2))
	if st := must1[Stats](t)(p.Stats()); st.BlocksShared == 0 || st.NumSequences != 2 {
		t.Fatalf("after fork: %+v", st)
	}
	// The child rewrites its last token of layer 1; the parent keeps its own.
	k2, v2 := random(row, 30), random(row, 31)
	must1[uint64](t)(p.Append(2, 1, n-1, k2, v2))

	for _, seq := range []uint64{1, 2} {
		for l := 0; l < layers; l++ {
			ko, vo := make([]float32, n*row), make([]float32, n*row)
			if got := must1[uint64](t)(p.Gather(seq, uint32(l), 0, ko, vo)); got != n {
				t.Fatalf("Gather = %d", got)
			}
			wantK, wantV := k[l], v[l]
			if seq == 2 && l == 1 {
				wantK = append(append([]float32{}, k[l][:(n-1)*row]...), k2...)
				wantV = append(append([]float32{}, v[l][:(n-1)*row]...), v2...)
			}
			assertF16Close(t, "K", wantK, ko)
			assertF16Close(t, "V", wantV, vo)
		}
	}
	pos := must1[[]int32](t)(p.Positions(1, 0, 0, n))
	for i, x := range pos {
		if x != int32(i) {
			t.Fatalf("positions %v", pos)
		}
	}
	if bt := must1[[]int32](t)(p.BlockTable(2, 0)); len(bt) != (n+blockSize-1)/blockSize {
		t.Fatalf("block table %v", bt)
	}
}

// f16 data in and out ([]uint16 bit patterns), and K only / V only.
func TestPoolHalfData(t *testing.T) {
	const n = 20
	p := newTestPool(t, testConfig())
	must(t, p.SeqCreate(7))
	must(t, p.Reserve(7, n))
	k, v := random(n*row, 40), random(n*row, 41)
	must1[uint64](t)(p.Append(7, 0, 0, k, v))
	vh := make([]Float16, n*row)
	if got := must1[uint64](t)(p.Gather16(7, 0, 0, nil, vh, DTYPE_F16)); got != n {
		t.Fatalf("Gather16 = %d", got)
	}
	vf := make([]float32, len(vh))
	for i, h := range vh {
		vf[i] = halfToFloat(h)
	}
	assertF16Close(t, "V as f16", v, vf)

	must(t, p.SeqCreate(8))
	must(t, p.Reserve(8, n))
	must1[uint64](t)(p.Append16(8, 1, 0, vh, vh, DTYPE_F16))
	back := make([]Float16, n*row)
	must1[uint64](t)(p.Gather16(8, 1, 0, back, nil, DTYPE_F16))
	if !reflect.DeepEqual(vh, back) {
		t.Fatal("f16 bits differ after a round trip")
	}
}

func TestPoolTruncateAndFree(t *testing.T) {
	p := newTestPool(t, testConfig())
	must(t, p.SeqCreate(3))
	must(t, p.Reserve(3, 33))
	if st := must1[Stats](t)(p.Stats()); st.BlocksUsed != 3*layers {
		t.Fatalf("%+v", st)
	}
	must(t, p.SeqTruncate(3, 16))
	if n := must1[uint64](t)(p.SeqLength(3)); n != 16 {
		t.Fatalf("length %d", n)
	}
	must(t, p.SeqFree(3))
	if st := must1[Stats](t)(p.Stats()); st.NumSequences != 0 || st.BlocksFree != numBlocks {
		t.Fatalf("%+v", st)
	}
}

// copiedPool returns a copy of a new pool's value (seq 1 holding data), the
// original *Pool unreachable once it returns.
func copiedPool(t *testing.T, data []float32) Pool {
	p, err := NewPool(testConfig())
	must(t, err)
	must(t, p.SeqCreate(1))
	must(t, p.Reserve(1, 1))
	must1[uint64](t)(p.Append(1, 0, 0, data, data))
	return *p
}

// A copy of a Pool value is the same pool and keeps it alive: collecting the
// original must not free the handle the copy uses (it did: the finalizer was
// on the original *Pool).
func TestPoolCopyOutlivesOriginal(t *testing.T) {
	data := random(row, 77)
	q := copiedPool(t, data)
	cfg := DefaultPolicyConfig()
	cfg.Kind, cfg.RecentTokens = POLICY_STREAMING, 8
	pol, err := NewPolicy(cfg)
	must(t, err)
	polCopy := *pol
	pol = nil
	settle() // runs the finalizers of everything unreachable
	settle()
	if q.Closed() {
		t.Fatal("the copy is closed")
	}
	if n := must1[uint64](t)(q.SeqLength(1)); n != 1 {
		t.Fatalf("SeqLength = %d", n)
	}
	out := make([]float32, row)
	must1[uint64](t)(q.Gather(1, 0, 0, out, nil))
	assertF16Close(t, "K of the copy", data, out)
	must(t, q.SetPolicy(&polCopy))
	must(t, polCopy.Close())
	// Copies share the state: closing one closes the other.
	q2 := q
	must(t, q.Close())
	if !q2.Closed() {
		t.Fatal("a copy of a closed pool is open")
	}
	_, err = q2.SeqLength(1)
	assertStatus(t, err, ERR_NULL_POINTER)
}

func TestPoolSaveRestore(t *testing.T) {
	a := newTestPool(t, testConfig())
	b := newTestPool(t, testConfig())
	const n = 21
	must(t, a.SeqCreate(1))
	must(t, a.Reserve(1, n))
	for layer := uint32(0); layer < layers; layer++ {
		k, v := random(n*row, int64(layer)), random(n*row, int64(layer)+7)
		if _, err := a.Append(1, layer, 0, k, v); err != nil {
			t.Fatal(err)
		}
	}
	rec, err := a.Save(1)
	if err != nil {
		t.Fatal(err)
	}
	if string(rec[:4]) != "KVCS" {
		t.Fatalf("record starts with %q", rec[:4])
	}
	must(t, b.Restore(3, rec))
	path := filepath.Join(t.TempDir(), "seq.kvcs")
	must(t, a.SaveFile(1, path))
	must(t, b.RestoreFile(4, path))
	for _, seq := range []uint64{3, 4} {
		for layer := uint32(0); layer < layers; layer++ {
			wk, wv := make([]float32, n*row), make([]float32, n*row)
			gk, gv := make([]float32, n*row), make([]float32, n*row)
			if _, err := a.Gather(1, layer, 0, wk, wv); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Gather(seq, layer, 0, gk, gv); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(wk, gk) || !reflect.DeepEqual(wv, gv) {
				t.Fatalf("sequence %d layer %d differs after restore", seq, layer)
			}
		}
	}
	bad := append([]byte(nil), rec...)
	bad[len(bad)/2] ^= 1
	if err := b.Restore(5, bad); !errors.Is(err, ERR_CORRUPT) {
		t.Fatalf("damaged record: %v", err)
	}
	if err := b.RestoreFile(5, filepath.Join(t.TempDir(), "missing")); !errors.Is(err, ERR_IO) {
		t.Fatalf("missing file: %v", err)
	}
}
