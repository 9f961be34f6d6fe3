package kvcache

import "testing"

func TestPrefixInsertLookupAttach(t *testing.T) {
	const n = 40
	prompt := tokens(n, 1)
	p := newTestPool(t, testConfig())
	pc := DefaultPrefixConfig()
	pc.ModelID, pc.TokenizerID = "test-model", "test-tokenizer"
	must(t, p.EnablePrefixCache(&pc))
	must(t, p.SeqCreate(1))
	must(t, p.Reserve(1, n))
	k := make([][]float32, layers)
	for l := range k {
		k[l] = random(n*row, int64(200+l))
		must1[uint64](t)(p.Append(1, uint32(l), 0, k[l], random(n*row, int64(300+l))))
	}
	if got := must1[uint64](t)(p.PrefixInsert(1, prompt, "")); got != n/blockSize {
		t.Fatalf("PrefixInsert registered %d blocks", got)
	}
	r := must1[PrefixResult](t)(p.PrefixLookup(prompt, 0, ""))
	if r.HitTokens%blockSize != 0 || r.HitTokens != 32 || r.HitBlocks != 2 {
		t.Fatalf("PrefixLookup = %+v", r)
	}
	if r := must1[PrefixResult](t)(p.PrefixLookup(prompt, 0, "tenant-b")); r.HitTokens != 0 {
		t.Fatalf("another salt hits: %+v", r)
	}
	if r := must1[PrefixResult](t)(p.PrefixLookup(tokens(n, 2), 0, "")); r.HitTokens != 0 {
		t.Fatalf("another prompt hits: %+v", r)
	}
	// Freed, the blocks stay cached; attach revives them into a new sequence.
	must(t, p.SeqFree(1))
	if s := must1[PrefixStats](t)(p.PrefixStats()); s.ReclaimableBlocks != 2 {
		t.Fatalf("%+v", s)
	}
	if a := must1[PrefixResult](t)(p.PrefixAttach(5, prompt, 0, "")); a.HitTokens != 32 {
		t.Fatalf("PrefixAttach = %+v", a)
	}
	if got := must1[uint64](t)(p.SeqLength(5)); got != 32 {
		t.Fatalf("attached length %d", got)
	}
	ko := make([]float32, 32*row)
	must1[uint64](t)(p.Gather(5, 1, 0, ko, nil))
	assertF16Close(t, "attached K", k[1][:32*row], ko)
	if s := must1[PrefixStats](t)(p.PrefixStats()); s.RegisteredBlocks != 2 || s.HitTokens < 64 {
		t.Fatalf("%+v", s)
	}
}

func TestPrefixSeedAndPartial(t *testing.T) {
	prompt := tokens(33, 3)
	var seed [32]byte
	for i := range seed {
		seed[i] = byte(i * 5)
	}
	pc := DefaultPrefixConfig()
	pc.Seed = &seed
	p := newTestPool(t, testConfig())
	must(t, p.EnablePrefixCache(&pc))
	must(t, p.SeqCreate(1))
	must(t, p.Reserve(1, 33))
	if got := must1[uint64](t)(p.PrefixInsert(1, prompt, "")); got != 2 {
		t.Fatalf("registered %d", got)
	}
	if r := must1[PrefixResult](t)(p.PrefixLookup(prompt, PREFIX_PARTIAL, "")); r.HitTokens != 32 {
		t.Fatalf("%+v", r)
	}
	// Enabling twice is an error.
	if err := p.EnablePrefixCache(nil); err == nil {
		t.Fatal("second EnablePrefixCache succeeded")
	}
}
