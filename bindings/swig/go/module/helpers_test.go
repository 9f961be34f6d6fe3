package kvcache

import (
	"bufio"
	"math"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"testing"
)

const (
	layers    = 2
	qHeads    = 4
	kvHeads   = 2
	headDim   = 64
	blockSize = 16
	numBlocks = 64
	row       = kvHeads * headDim // elements of one token's K (or V) row
)

// testConfig: 2 layers, 4 query heads, 2 KV heads, head_dim 64, blocks of 16, f16 storage, 64 blocks.
func testConfig() PoolConfig {
	cfg := DefaultPoolConfig()
	cfg.NumLayers, cfg.NumQHeads, cfg.NumKVHeads, cfg.HeadDim = layers, qHeads, kvHeads, headDim
	cfg.BlockSize, cfg.NumBlocks = blockSize, numBlocks
	cfg.KDType, cfg.VDType = DTYPE_F16, DTYPE_F16
	return cfg
}

func newTestPool(t testing.TB, cfg PoolConfig) *Pool {
	t.Helper()
	p, err := NewPool(cfg)
	if err != nil {
		t.Fatalf("NewPool: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// random: n values uniform in [-1, 1), the same for the same seed.
func random(n int, seed int64) []float32 {
	r := rand.New(rand.NewSource(seed))
	out := make([]float32, n)
	for i := range out {
		out[i] = r.Float32()*2 - 1
	}
	return out
}

func tokens(n, seed int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32((i*7919 + seed*104729) % 32000)
	}
	return t
}

// assertF16Close: got equals want within f16 rounding (relative 1e-3).
func assertF16Close(t testing.TB, what string, want, got []float32) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if d := math.Abs(float64(want[i] - got[i])); d > 1e-3*math.Abs(float64(want[i]))+1e-7 {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func must1[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// halfToFloat: IEEE half bits to float32.
func halfToFloat(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch exp {
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case 0:
		f := float32(mant) * float32(math.Ldexp(1, -24))
		if sign != 0 {
			return -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp-15+127)<<23 | mant<<13)
}

// vmRSSKiB: VmRSS of this process (Linux), -1 elsewhere.
func vmRSSKiB() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if line := s.Text(); strings.HasPrefix(line, "VmRSS:") {
			n, err := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}
