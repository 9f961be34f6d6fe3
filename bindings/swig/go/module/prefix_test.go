package kvcache

import (
	"errors"
	"testing"
)

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
	// Only written blocks register.
	if _, err := p.PrefixInsert(1, prompt, ""); !errors.Is(err, ERR_INVALID_ARGUMENT) {
		t.Fatalf("insert of unwritten blocks: %v", err)
	}
	for l := uint32(0); l < layers; l++ {
		must1[uint64](t)(p.Append(1, l, 0, random(33*row, int64(l)), random(33*row, int64(10+l))))
	}
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

// Strings reach the library as their bytes: a NUL in the model or tokenizer
// id is refused (C strings), a salt with a NUL or an emoji hits only itself.
func TestPrefixStringBytes(t *testing.T) {
	p := newTestPool(t, testConfig())
	pc := DefaultPrefixConfig()
	pc.ModelID = "m\x00x"
	assertStatus(t, p.EnablePrefixCache(&pc), ERR_INVALID_ARGUMENT)
	pc.ModelID, pc.TokenizerID = "m", "\x00"
	assertStatus(t, p.EnablePrefixCache(&pc), ERR_INVALID_ARGUMENT)
	pc.ModelID, pc.TokenizerID = "model\U0001F600", "tok"
	must(t, p.EnablePrefixCache(&pc))
	const n = 40
	prompt := tokens(n, 4)
	salts := []string{"a\x00b", "x\U0001F600"}
	for i, salt := range salts {
		seq := uint64(1 + i)
		must(t, p.SeqCreate(seq))
		must(t, p.Reserve(seq, n))
		for l := uint32(0); l < layers; l++ {
			must1[uint64](t)(p.Append(seq, l, 0, random(n*row, int64(l)), random(n*row, int64(10+l))))
		}
		if got := must1[uint64](t)(p.PrefixInsert(seq, prompt, salt)); got != 2 {
			t.Fatalf("salt %q: registered %d", salt, got)
		}
	}
	for _, c := range []struct {
		salt string
		hit  uint64
	}{
		{"a\x00b", 32}, {"x\U0001F600", 32}, {"a", 0}, {"ab", 0}, {"a\x00", 0}, {"a\x00c", 0},
		{"x", 0}, {"x\xf0\x9f\x98", 0}, {"x\U0001F601", 0}, {"", 0},
	} {
		if r := must1[PrefixResult](t)(p.PrefixLookup(prompt, 0, c.salt)); r.HitTokens != c.hit {
			t.Errorf("salt %q: %d hit tokens, want %d", c.salt, r.HitTokens, c.hit)
		}
	}
}
