package kvcache

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

func hostStore(t *testing.T, capacity uint64, scope string) *Store {
	t.Helper()
	cfg := must1[TierConfig](t)(DefaultTierConfig(TIER_HOST))
	cfg.CapacityBytes = capacity
	s := must1[*Store](t)(OpenStore(cfg, []byte(scope)))
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStoreRoundTrip(t *testing.T) {
	s := hostStore(t, 1<<20, "go-test")
	big := bytes.Repeat([]byte{1, 2, 3, 4, 5}, 3000) // longer than Get's first buffer
	must(t, s.Put([]byte("page-1"), []byte("hello")))
	must(t, s.Put([]byte("page-2"), big))
	v, found, err := s.Get([]byte("page-1"))
	must(t, err)
	if !found || string(v) != "hello" {
		t.Fatalf("Get page-1 = %q, %v", v, found)
	}
	v, found, err = s.Get([]byte("page-2"))
	must(t, err)
	if !found || !bytes.Equal(v, big) {
		t.Fatalf("Get page-2: %d bytes, found %v; want %d", len(v), found, len(big))
	}
	if _, found, err = s.Get([]byte("absent")); err != nil || found {
		t.Fatalf("Get absent: found %v, err %v", found, err)
	}
	got := must1[[]bool](t)(s.Contains([][]byte{[]byte("page-2"), []byte("x"), []byte("page-1")}))
	if len(got) != 3 || !got[0] || got[1] || !got[2] {
		t.Fatalf("Contains = %v", got)
	}
	if was := must1[bool](t)(s.Pin([]byte("page-1"))); !was {
		t.Fatal("Pin of a stored key: false")
	}
	if was := must1[bool](t)(s.Unpin([]byte("page-1"))); !was {
		t.Fatal("Unpin of a pinned key: false")
	}
	if removed := must1[bool](t)(s.Remove([]byte("page-1"))); !removed {
		t.Fatal("Remove: false")
	}
	if removed := must1[bool](t)(s.Remove([]byte("page-1"))); removed {
		t.Fatal("Remove twice: true")
	}
	st := must1[TierStats](t)(s.Stats())
	if st.Kind != TIER_HOST || st.Entries != 1 || st.Hits < 2 || st.Misses < 1 {
		t.Fatalf("Stats = %+v", st)
	}
}

func TestStoreScopesAndDisk(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	cfg := must1[TierConfig](t)(DefaultTierConfig(TIER_DISK))
	cfg.CapacityBytes, cfg.Path = 1<<20, dir
	a := must1[*Store](t)(OpenStore(cfg, []byte("model-a")))
	must(t, a.Put([]byte("k"), []byte("from a")))
	must(t, a.Close())
	b := must1[*Store](t)(OpenStore(cfg, []byte("model-b")))
	defer b.Close()
	if _, found, err := b.Get([]byte("k")); err != nil || found {
		t.Fatalf("another scope read the value: found %v, err %v", found, err)
	}
	again := must1[*Store](t)(OpenStore(cfg, []byte("model-a")))
	defer again.Close()
	v, found, err := again.Get([]byte("k"))
	if err != nil || !found || string(v) != "from a" {
		t.Fatalf("reopened store: %q, %v, %v", v, found, err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
}

func TestStoreErrors(t *testing.T) {
	s := hostStore(t, 1<<16, "")
	var e *Error
	// An empty key: a nil slice reaches the library as NULL.
	if err := s.Put(nil, []byte("v")); !errors.As(err, &e) || e.Status != ERR_NULL_POINTER {
		t.Fatalf("empty key: %v", err)
	}
	if err := s.Put(make([]byte, STORE_KEY_MAX+1), []byte("v")); !errors.Is(err, ERR_INVALID_ARGUMENT) {
		t.Fatalf("key too long: %v", err)
	}
	if err := s.Put([]byte("k"), make([]byte, 1<<17)); err == nil {
		t.Fatal("a value larger than the store: no error")
	}
	if _, err := s.Contains([][]byte{[]byte("a"), nil}); !errors.Is(err, ERR_INVALID_ARGUMENT) {
		t.Fatalf("Contains with an empty key: %v", err)
	}
	cfg := must1[TierConfig](t)(DefaultTierConfig(TIER_HOST))
	if _, err := OpenStore(cfg, nil); !errors.Is(err, ERR_INVALID_ARGUMENT) {
		t.Fatalf("a host store of capacity 0: %v", err)
	}
	var zero Store
	if err := zero.Put([]byte("k"), nil); !errors.Is(err, ERR_NULL_POINTER) {
		t.Fatalf("zero Store: %v", err)
	}
	must(t, s.Close())
	must(t, s.Close())
	if _, _, err := s.Get([]byte("k")); !errors.Is(err, ERR_NULL_POINTER) {
		t.Fatalf("closed Store: %v", err)
	}
	runtime.GC()
}

// TestStoreLlamaState: a llama.cpp sequence state blob (tests/fixtures/smollm2) imported and
// exported byte-identically; a damaged one refused with nothing made.
func TestStoreLlamaState(t *testing.T) {
	src := os.Getenv("KVC_SOURCE_DIR") // set by ctest
	if src == "" {
		t.Skip("KVC_SOURCE_DIR (the repository) is not set")
	}
	blob, err := os.ReadFile(filepath.Join(src, "tests", "fixtures", "smollm2", "llama-state-f16.bin"))
	must(t, err)
	cfg := DefaultPoolConfig()
	cfg.NumLayers, cfg.NumQHeads, cfg.NumKVHeads, cfg.HeadDim = 30, 9, 3, 64
	cfg.BlockSize, cfg.NumBlocks = 16, 64
	cfg.KDType, cfg.VDType = DTYPE_F16, DTYPE_F16
	p := newTestPool(t, cfg)
	if n := must1[uint64](t)(p.ImportLlama(1, blob, 0)); n != 8 {
		t.Fatalf("ImportLlama: %d tokens", n)
	}
	out := must1[[]byte](t)(p.ExportLlama(1, 0, LLAMA_F16, LLAMA_F16, 0))
	if !bytes.Equal(out, blob) {
		t.Fatal("the export differs from llama.cpp's blob")
	}
	if _, err := p.ImportLlama(2, blob[:len(blob)-1], 0); !errors.Is(err, ERR_CORRUPT) {
		t.Fatalf("truncated blob: %v", err)
	}
	if _, err := p.SeqLength(2); !errors.Is(err, ERR_SEQ_NOT_FOUND) {
		t.Fatalf("a refused import left sequence 2: %v", err)
	}
	if _, err := p.ExportLlama(1, -1, LLAMA_F16, LLAMA_F16, 0); !errors.Is(err, ERR_INVALID_ARGUMENT) {
		t.Fatalf("negative llama sequence id: %v", err)
	}
}
