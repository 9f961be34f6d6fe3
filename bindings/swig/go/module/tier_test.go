package kvcache

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

const tierHeadDim = 8

// tierPool: 2 layers, 2 KV heads of 8 values, blocks of 16, f32 storage (loads
// compare exactly), 16 blocks; the prefix cache with a fixed seed.
func tierPool(t *testing.T) *Pool {
	t.Helper()
	cfg := DefaultPoolConfig()
	cfg.NumLayers, cfg.NumQHeads, cfg.NumKVHeads, cfg.HeadDim = layers, qHeads, kvHeads, tierHeadDim
	cfg.BlockSize, cfg.NumBlocks = blockSize, 16
	cfg.KDType, cfg.VDType = DTYPE_F32, DTYPE_F32
	p := newTestPool(t, cfg)
	var seed [32]byte
	for i := range seed {
		seed[i] = byte(7 + i)
	}
	pc := DefaultPrefixConfig()
	pc.Seed, pc.ModelID = &seed, "tier-model"
	must(t, p.EnablePrefixCache(&pc))
	return p
}

const tierRow = kvHeads * tierHeadDim

// tierWrite creates seq holding random K/V for prompt and registers it; returns K and V per layer.
func tierWrite(t *testing.T, p *Pool, seq uint64, prompt []int32, seed int64) (k, v [][]float32) {
	t.Helper()
	n := len(prompt)
	must(t, p.SeqCreate(seq))
	must(t, p.Reserve(seq, uint64(n)))
	for l := 0; l < layers; l++ {
		k = append(k, random(n*tierRow, seed+int64(l)))
		v = append(v, random(n*tierRow, seed+100+int64(l)))
		must1[uint64](t)(p.Append(seq, uint32(l), 0, k[l], v[l]))
	}
	if got := must1[uint64](t)(p.PrefixInsert(seq, prompt, "")); got != uint64(n/blockSize) {
		t.Fatalf("PrefixInsert registered %d blocks", got)
	}
	return k, v
}

// tierSqueeze fills every free and reclaimable block with other sequences
// (ids from first), so the pool reclaims its cached prefix blocks; returns the next id.
func tierSqueeze(t *testing.T, p *Pool, first uint64) uint64 {
	t.Helper()
	garbage := make([]float32, blockSize*tierRow)
	for i := range garbage {
		garbage[i] = -1
	}
	id := first
	for {
		s := must1[Stats](t)(p.Stats())
		if s.BlocksFree+s.BlocksCached < layers {
			return id
		}
		must(t, p.SeqCreate(id))
		must(t, p.Reserve(id, blockSize))
		for l := uint32(0); l < layers; l++ {
			must1[uint64](t)(p.Append(id, l, 0, garbage, garbage))
		}
		id++
	}
}

func tierFree(t *testing.T, p *Pool, first, end uint64) {
	t.Helper()
	for id := first; id < end; id++ {
		must(t, p.SeqFree(id))
	}
}

// tierHolds: the first n tokens of seq are exactly k and v.
func tierHolds(t *testing.T, p *Pool, seq uint64, k, v [][]float32, n int) {
	t.Helper()
	if got := must1[uint64](t)(p.SeqLength(seq)); got != uint64(n) {
		t.Fatalf("seq %d length %d, want %d", seq, got, n)
	}
	for l := 0; l < layers; l++ {
		ko, vo := make([]float32, n*tierRow), make([]float32, n*tierRow)
		must1[uint64](t)(p.Gather(seq, uint32(l), 0, ko, vo))
		if !reflect.DeepEqual(ko, k[l][:n*tierRow]) || !reflect.DeepEqual(vo, v[l][:n*tierRow]) {
			t.Fatalf("seq %d layer %d: K/V differ from what was written", seq, l)
		}
	}
}

func tierStatus(t *testing.T, err error, want Status) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Status != want {
		t.Fatalf("error %v, want status %v", err, want)
	}
}

func tierPrompt(n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((i*7919 + 11) % 32000)
	}
	return p
}

func TestTierDefaults(t *testing.T) {
	cfg, err := DefaultTierConfig(TIER_DISK)
	must(t, err)
	if want := (TierConfig{Kind: TIER_DISK, TimeoutMs: 1000}); cfg != want {
		t.Fatalf("DefaultTierConfig = %+v, want %+v", cfg, want)
	}
	_, err = DefaultTierConfig(TierKind(9))
	tierStatus(t, err, ERR_INVALID_ARGUMENT)
	if ERR_TIMEOUT.String() != "KVC_ERR_TIMEOUT" || ERR_PENDING.String() != "KVC_ERR_PENDING" {
		t.Fatal(ERR_TIMEOUT.String(), ERR_PENDING.String())
	}
}

func TestTierOffloadLoadPrefetchPin(t *testing.T) {
	dir := t.TempDir()
	prompt := tierPrompt(3*blockSize + 1) // 3 whole blocks usable
	p := tierPool(t)
	host, _ := DefaultTierConfig(TIER_HOST)
	host.CapacityBytes = 1 << 20
	disk, _ := DefaultTierConfig(TIER_DISK)
	disk.CapacityBytes, disk.Path = 1<<24, dir
	if i := must1[int](t)(p.AddTier(host)); i != 0 {
		t.Fatalf("host tier index %d", i)
	}
	if i := must1[int](t)(p.AddTier(disk)); i != 1 {
		t.Fatalf("disk tier index %d", i)
	}
	must(t, p.SetOffload(64, 10000))
	k, v := tierWrite(t, p, 1, prompt, 1234)

	// Offloaded while still in the pool: write-through to both tiers.
	if q := must1[uint64](t)(p.PrefixOffload(prompt, "")); q != 3 {
		t.Fatalf("PrefixOffload queued %d", q)
	}
	must(t, p.FlushTiers())
	for i, kind := range []TierKind{TIER_HOST, TIER_DISK} {
		s := must1[TierStats](t)(p.TierStats(i))
		want := TierStats{Kind: kind, Bytes: s.Bytes, Entries: 3, Demotions: 3}
		if s != want || s.Bytes == 0 {
			t.Fatalf("tier %d: %+v, want %+v", i, s, want)
		}
	}
	files, _ := os.ReadDir(dir)
	if len(files) != 3 {
		t.Fatalf("%d files in the disk tier, want 3", len(files))
	}

	// The pool's copy reclaimed.
	must(t, p.SeqFree(1))
	end := tierSqueeze(t, p, 100)
	must(t, p.FlushTiers())
	if s := must1[PrefixStats](t)(p.PrefixStats()); s.RegisteredBlocks != 0 {
		t.Fatalf("still registered: %+v", s)
	}
	tierFree(t, p, 100, end)

	r := must1[PrefixResult](t)(p.PrefixLookup(prompt, 0, ""))
	if r.HitTokens != 0 || r.TierTokens != 48 || r.Pin != 0 {
		t.Fatalf("lookup %+v", r)
	}
	if n := must1[uint64](t)(p.PrefixLoad(prompt, "")); n != 48 {
		t.Fatalf("PrefixLoad loaded %d", n)
	}
	if r := must1[PrefixResult](t)(p.PrefixAttach(2, prompt, 0, "")); r.HitTokens != 48 {
		t.Fatalf("attach %+v", r)
	}
	tierHolds(t, p, 2, k, v, 48)
	s0, s1 := must1[TierStats](t)(p.TierStats(0)), must1[TierStats](t)(p.TierStats(1))
	if s0.Hits != 3 || s0.Promotions != 3 || s0.Misses != 0 || s1.Hits != 0 || s1.Promotions != 0 {
		t.Fatalf("after load: host %+v, disk %+v", s0, s1)
	}

	// Again by prefetch + poll.
	must(t, p.SeqFree(2))
	end = tierSqueeze(t, p, 200)
	must(t, p.FlushTiers())
	tierFree(t, p, 200, end)
	ticket := must1[uint64](t)(p.PrefixPrefetch(prompt, ""))
	if ticket == 0 {
		t.Fatal("ticket 0")
	}
	deadline := time.Now().Add(10 * time.Second)
	var loaded uint64
	for {
		done, n, err := p.PrefixPoll(ticket)
		must(t, err)
		if done {
			loaded = n
			break
		}
		if n != 0 || time.Now().After(deadline) {
			t.Fatalf("pending: loaded %d", n)
		}
		time.Sleep(time.Millisecond)
	}
	if loaded != 48 {
		t.Fatalf("prefetch loaded %d", loaded)
	}
	_, _, err := p.PrefixPoll(ticket) // reported once
	tierStatus(t, err, ERR_INVALID_ARGUMENT)
	must1[PrefixResult](t)(p.PrefixAttach(3, prompt, 0, ""))
	tierHolds(t, p, 3, k, v, 48)
	if s := must1[TierStats](t)(p.TierStats(0)); s.Hits != 6 || s.Promotions != 6 {
		t.Fatalf("after prefetch: %+v", s)
	}

	// Pins, released once.
	must(t, p.SeqFree(3))
	end = tierSqueeze(t, p, 300)
	must(t, p.FlushTiers())
	r = must1[PrefixResult](t)(p.PrefixLookup(prompt, PREFIX_PIN, ""))
	if r.TierTokens != 48 || r.Pin == 0 {
		t.Fatalf("pinned lookup %+v", r)
	}
	if s := must1[TierStats](t)(p.TierStats(0)); s.Pinned != 3 {
		t.Fatalf("pinned %d", s.Pinned)
	}
	must(t, p.PrefixUnpin(r.Pin))
	if s := must1[TierStats](t)(p.TierStats(0)); s.Pinned != 0 {
		t.Fatalf("pinned after unpin %d", s.Pinned)
	}
	tierStatus(t, p.PrefixUnpin(r.Pin), ERR_INVALID_ARGUMENT)
	tierStatus(t, p.PrefixUnpin(0), ERR_INVALID_ARGUMENT)
	tierFree(t, p, 300, end)
	must(t, p.Close())

	// A new pool with the same seed and model finds the blocks on disk.
	q := tierPool(t)
	must1[int](t)(q.AddTier(disk))
	if r := must1[PrefixResult](t)(q.PrefixLookup(prompt, 0, "")); r.TierTokens != 48 {
		t.Fatalf("new pool lookup %+v", r)
	}
	if n := must1[uint64](t)(q.PrefixLoad(prompt, "")); n != 48 {
		t.Fatalf("new pool loaded %d", n)
	}
	must1[PrefixResult](t)(q.PrefixAttach(1, prompt, 0, ""))
	tierHolds(t, q, 1, k, v, 48)
	if s := must1[TierStats](t)(q.TierStats(0)); s.Hits != 3 || s.Promotions != 3 || s.Demotions != 0 || s.Entries != 3 {
		t.Fatalf("new pool disk tier %+v", s)
	}
}

// A disk record that never answers (a FIFO nobody writes): the prefetch
// times out (ERR_TIMEOUT from PrefixPoll); released, the record is refused
// and LastError says why.
func TestTierPrefetchTimeout(t *testing.T) {
	dir := t.TempDir()
	prompt := tierPrompt(2*blockSize + 1)
	disk, _ := DefaultTierConfig(TIER_DISK)
	disk.CapacityBytes, disk.Path = 1<<24, dir
	first := tierPool(t)
	must1[int](t)(first.AddTier(disk))
	tierWrite(t, first, 1, prompt, 5)
	if q := must1[uint64](t)(first.PrefixOffload(prompt, "")); q != 2 {
		t.Fatalf("queued %d", q)
	}
	must(t, first.FlushTiers())
	must(t, first.Close())
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("%d records, want 2", len(entries))
	}
	p := tierPool(t)
	must1[int](t)(p.AddTier(disk))
	must(t, p.SetOffload(16, 200))
	var fifos []string
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		must(t, os.Remove(path))
		must(t, syscall.Mkfifo(path, 0o644))
		fifos = append(fifos, path)
	}
	if r := must1[PrefixResult](t)(p.PrefixLookup(prompt, 0, "")); r.TierTokens != 32 {
		t.Fatalf("lookup %+v", r)
	}
	ticket := must1[uint64](t)(p.PrefixPrefetch(prompt, ""))
	released := 0
	release := func() {
		// The loader is blocked opening one FIFO: open it for writing and close it (EOF).
		for deadline := time.Now().Add(10 * time.Second); released == 0 && time.Now().Before(deadline); {
			for _, f := range fifos {
				if fd, err := syscall.Open(f, syscall.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					syscall.Close(fd)
					released++
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	defer release()
	time.Sleep(500 * time.Millisecond)
	_, _, err := p.PrefixPoll(ticket)
	tierStatus(t, err, ERR_TIMEOUT)
	release()
	if released != 1 {
		t.Fatalf("released %d FIFO readers, want 1", released)
	}
	var s TierStats
	for deadline := time.Now().Add(10 * time.Second); s.Errors == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		s = must1[TierStats](t)(p.TierStats(0))
	}
	if s.Errors != 1 || s.Hits != 0 || s.Promotions != 0 || !strings.Contains(s.LastError, "cannot be read") {
		t.Fatalf("after the late answer: %+v", s)
	}
	if st := must1[Stats](t)(p.Stats()); st.BlocksUsed != 0 {
		t.Fatalf("blocks still reserved: %+v", st)
	}
}

func TestTierBadInput(t *testing.T) {
	p := tierPool(t)
	host, _ := DefaultTierConfig(TIER_HOST)
	_, err := p.AddTier(host) // capacity 0
	tierStatus(t, err, ERR_INVALID_ARGUMENT)
	_, err = p.AddTier(TierConfig{Kind: TierKind(7), CapacityBytes: 1 << 20})
	tierStatus(t, err, ERR_INVALID_ARGUMENT)
	_, err = p.AddTier(TierConfig{Kind: TIER_DISK, CapacityBytes: 1 << 20}) // no path
	tierStatus(t, err, ERR_INVALID_ARGUMENT)
	_, err = p.AddTier(TierConfig{Kind: TIER_DISK, CapacityBytes: 1 << 20, Path: "a\x00b"})
	tierStatus(t, err, ERR_INVALID_ARGUMENT)
	tierStatus(t, p.SetOffload(4, 100), ERR_INVALID_ARGUMENT) // no tier yet
	_, err = p.TierStats(0)
	tierStatus(t, err, ERR_OUT_OF_RANGE)
	_, err = p.TierStats(-1)
	tierStatus(t, err, ERR_OUT_OF_RANGE)
	_, err = p.PrefixLoad([]int32{1, 2, 3, 4, 5}, "")
	tierStatus(t, err, ERR_INVALID_ARGUMENT)
	host.CapacityBytes = 1 << 20
	if i := must1[int](t)(p.AddTier(host)); i != 0 {
		t.Fatalf("index %d", i)
	}
	tierStatus(t, p.SetOffload(0, 100), ERR_INVALID_ARGUMENT)
	tierStatus(t, p.SetOffload(4, 0), ERR_INVALID_ARGUMENT)
	_, _, err = p.PrefixPoll(12345)
	tierStatus(t, err, ERR_INVALID_ARGUMENT)
	ticket := must1[uint64](t)(p.PrefixPrefetch([]int32{1, 2, 3, 4, 5}, "")) // nothing to load: done at once
	if done, n, err := p.PrefixPoll(ticket); !done || n != 0 || err != nil {
		t.Fatalf("PrefixPoll = %v %d %v", done, n, err)
	}
	must(t, p.Close())
	tierStatus(t, p.FlushTiers(), ERR_NULL_POINTER)
	var zero Pool
	_, err = zero.AddTier(host)
	tierStatus(t, err, ERR_NULL_POINTER)
}
