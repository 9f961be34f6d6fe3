package kvcache

import (
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"
)

// One pool created, written (so its block memory is touched) and closed.
func leakCycle(t *testing.T, cfg PoolConfig, r []float32, close bool) {
	p, err := NewPool(cfg)
	must(t, err)
	must(t, p.SeqCreate(1))
	must(t, p.Reserve(1, 1))
	must1[uint64](t)(p.Append(1, 0, 0, r, r))
	if close {
		must(t, p.Close())
	}
}

// settle runs the finalizers of what is unreachable, returns freed memory to
// the OS and reads VmRSS.
func settle() int64 {
	// One goroutine runs the finalizers, a queued batch at a time, newest
	// first: each round's GC queues a sentinel and the round waits for it.
	// Some objects are only queued by a later cycle, hence several rounds.
	for round := 0; round < 5; round++ {
		done := make(chan struct{})
		sentinel := new([64]byte)
		runtime.SetFinalizer(sentinel, func(*[64]byte) { close(done) })
		sentinel = nil
		runtime.GC()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
	}
	debug.FreeOSMemory()
	return vmRSSKiB()
}

// 10,000 pools created and closed leave VmRSS flat (8 MiB slack).
func TestLeakTenThousandPools(t *testing.T) {
	if vmRSSKiB() < 0 {
		t.Skip("no /proc/self/status")
	}
	cfg := testConfig()
	r := random(row, 1)
	for i := 0; i < 2000; i++ { // warm-up
		leakCycle(t, cfg, r, true)
	}
	before := settle()
	for i := 0; i < 10000; i++ {
		leakCycle(t, cfg, r, true)
	}
	after := settle()
	t.Logf("VmRSS before %d KiB, after %d KiB", before, after)
	if after-before >= 8*1024 {
		t.Fatalf("VmRSS grew by %d KiB", after-before)
	}
}

// Pools never closed are freed by their finalizers after a GC.
func TestLeakUnclosedPoolsAreFinalized(t *testing.T) {
	var n atomic.Int64
	count := func() { n.Add(1) }
	finalized.Store(&count)
	defer finalized.Store(nil)
	cfg := testConfig()
	r := random(row, 1)
	const pools = 1000
	for i := 0; i < pools; i++ {
		leakCycle(t, cfg, r, false)
	}
	for round := 0; round < 50 && n.Load() < pools; round++ {
		settle()
	}
	if got := n.Load(); got != pools {
		t.Fatalf("%d of %d unclosed pools finalized", got, pools)
	}
}
