package kvcache

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

// Named extra keys (docs/prefix-cache.md): the ...Named methods take the
// values as a map and the binding orders them by the pool's declared names.

// namedPool: tierPool's geometry and seed with the given extra-key names.
func namedPool(t *testing.T, names []string) *Pool {
	t.Helper()
	cfg := DefaultPoolConfig()
	cfg.NumLayers, cfg.NumQHeads, cfg.NumKVHeads, cfg.HeadDim = layers, qHeads, kvHeads, tierHeadDim
	cfg.BlockSize, cfg.NumBlocks = blockSize, 32
	cfg.KDType, cfg.VDType = DTYPE_F32, DTYPE_F32
	p := newTestPool(t, cfg)
	var seed [32]byte
	for i := range seed {
		seed[i] = byte(3 + i)
	}
	pc := DefaultPrefixConfig()
	pc.Seed, pc.ModelID, pc.ExtraKeyNames = &seed, "named-model", names
	must(t, p.EnablePrefixCache(&pc))
	return p
}

func kv(m ...string) map[string][]byte {
	out := map[string][]byte{}
	for i := 0; i+1 < len(m); i += 2 {
		out[m[i]] = []byte(m[i+1])
	}
	return out
}

// The spec's test vectors, through the binding.
func TestPrefixNamedKeysSpecVectors(t *testing.T) {
	cfg := DefaultPoolConfig()
	cfg.NumLayers, cfg.NumQHeads, cfg.NumKVHeads, cfg.HeadDim = 1, 2, 2, 4
	cfg.BlockSize, cfg.NumBlocks = 4, 16
	cfg.KDType, cfg.VDType = DTYPE_F32, DTYPE_F32
	p := newTestPool(t, cfg)
	var seed [32]byte
	pc := DefaultPrefixConfig()
	pc.Seed, pc.ModelID, pc.TokenizerID = &seed, "stories260K", "tok512"
	pc.ExtraKeyNames = []string{"salt", "adapter"}
	must(t, p.EnablePrefixCache(&pc))
	if n := must1[[]string](t)(p.ExtraKeyNames()); len(n) != 2 || n[0] != "salt" || n[1] != "adapter" {
		t.Fatalf("ExtraKeyNames = %q", n)
	}
	toks := []int32{10, 11, 12, 13, 14, 15, 16, 17}
	keys := must1[[][]byte](t)(p.PrefixKeysNamed(toks, kv("adapter", "lora-7", "salt", "abc")))
	want := []string{"4b39a455995209a14f0fc08fe5a3dded304a1a2290be2ab53f3c347aff3f6843",
		"7ec33c152d328c65c85f4917878cc9b696ea528441ffde46065b21b4a04e19cb"}
	if len(keys) != 2 || hex.EncodeToString(keys[0]) != want[0] || hex.EncodeToString(keys[1]) != want[1] {
		t.Fatalf("keys %x", keys)
	}
	adapter := must1[[][]byte](t)(p.PrefixKeysNamed(toks, kv("adapter", "abc")))
	if hex.EncodeToString(adapter[0]) != "a56f4e5afbc3ed88b60f0b1b9a5693035b86800e3f7268c7929332a5cc32effa" {
		t.Fatalf("adapter=abc: %x", adapter[0])
	}
	none := must1[[][]byte](t)(p.PrefixKeysNamed(toks, nil))
	if hex.EncodeToString(none[0]) != "fb6ca8a8e2808f267ed596bf3760298379fb27898f5afb246bdda2ac6aa2fa0a" {
		t.Fatalf("no values: %x", none[0])
	}
}

// Declaration order and names left empty do not change keys; salt=x and
// adapter=x never share one; lookups, attaches and inserts by name.
func TestPrefixNamedKeysByName(t *testing.T) {
	a := namedPool(t, []string{"salt", "adapter"})
	b := namedPool(t, []string{"adapter", "media", "salt"})
	legacy := namedPool(t, nil)
	toks := tierPrompt(3 * blockSize)
	ka := must1[[][]byte](t)(a.PrefixKeysNamed(toks, kv("salt", "tenant-1", "adapter", "lora-7")))
	kb := must1[[][]byte](t)(b.PrefixKeysNamed(toks, kv("adapter", "lora-7", "salt", "tenant-1", "media", "")))
	if len(ka) != 3 || !bytes.Equal(ka[0], kb[0]) || !bytes.Equal(ka[2], kb[2]) {
		t.Fatal("another declaration order changed the keys")
	}
	sx := must1[[][]byte](t)(a.PrefixKeysNamed(toks, kv("salt", "x")))
	ax := must1[[][]byte](t)(a.PrefixKeysNamed(toks, kv("adapter", "x")))
	lx := must1[[][]byte](t)(legacy.PrefixKeys(toks, "x"))
	if bytes.Equal(sx[0], ax[0]) || bytes.Equal(sx[0], lx[0]) || bytes.Equal(ax[0], lx[0]) {
		t.Fatal("salt=x, adapter=x and the positional x share a key")
	}
	if ln, an := must1[[][]byte](t)(legacy.PrefixKeys(toks, "")), must1[[][]byte](t)(a.PrefixKeysNamed(toks, nil)); !bytes.Equal(ln[1], an[1]) {
		t.Fatal("no values differ from no extra keys")
	}

	prompt := tierPrompt(3*blockSize + 1)
	must(t, a.SeqCreate(1))
	must(t, a.Reserve(1, uint64(len(prompt))))
	for l := uint32(0); l < layers; l++ {
		x := random(len(prompt)*tierRow, int64(l))
		must1[uint64](t)(a.Append(1, l, 0, x, x))
	}
	if n := must1[uint64](t)(a.PrefixInsertNamed(1, prompt, kv("salt", "x"))); n != 3 {
		t.Fatalf("PrefixInsertNamed registered %d", n)
	}
	if r := must1[PrefixResult](t)(a.PrefixLookupNamed(prompt, 0, kv("salt", "x"))); r.HitTokens != 48 {
		t.Fatalf("salt=x: %+v", r)
	}
	if r := must1[PrefixResult](t)(a.PrefixLookupNamed(prompt, PREFIX_PARTIAL, kv("adapter", "x"))); r.HitTokens != 0 || r.PartialTokens != 0 {
		t.Fatalf("adapter=x: %+v", r)
	}
	if r := must1[PrefixResult](t)(a.PrefixAttachNamed(2, prompt, 0, kv("adapter", "x"))); r.HitTokens != 0 {
		t.Fatalf("attach adapter=x: %+v", r)
	}
	if r := must1[PrefixResult](t)(a.PrefixAttachNamed(3, prompt, 0, kv("salt", "x", "adapter", ""))); r.HitTokens != 48 {
		t.Fatalf("attach salt=x: %+v", r)
	}
}

// An undeclared name, or names on a positional pool, is an ERR_INVALID_ARGUMENT
// error before anything reaches the library.
func TestPrefixNamedKeysUnknownName(t *testing.T) {
	a := namedPool(t, []string{"salt", "adapter"})
	legacy := namedPool(t, nil)
	toks := tierPrompt(20)
	_, err := a.PrefixLookupNamed(toks, 0, kv("salt", "x", "tenant", "y"))
	var e *Error
	if !errors.As(err, &e) || e.Status != ERR_INVALID_ARGUMENT || !strings.Contains(e.Message, "tenant is not declared") {
		t.Fatalf("unknown name: %v", err)
	}
	if _, err := legacy.PrefixKeysNamed(toks, kv("salt", "x")); !errors.Is(err, ERR_INVALID_ARGUMENT) {
		t.Fatalf("names on a positional pool: %v", err)
	}
	if s := must1[PrefixStats](t)(a.PrefixStats()); s.QueriedTokens != 0 {
		t.Fatalf("a refused call reached the library: %+v", s)
	}
	// Bad declarations are refused and leave the prefix cache off.
	p := newTestPool(t, testConfig())
	pc := DefaultPrefixConfig()
	for _, names := range [][]string{{"salt", "salt"}, {"salt", ""}, {strings.Repeat("n", 65)}} {
		pc.ExtraKeyNames = names
		if err := p.EnablePrefixCache(&pc); !errors.Is(err, ERR_INVALID_ARGUMENT) {
			t.Fatalf("names %q: %v", names, err)
		}
	}
	if _, err := p.PrefixStats(); !errors.Is(err, ERR_INVALID_ARGUMENT) {
		t.Fatalf("the prefix cache is on after refused declarations: %v", err)
	}
}

// A disk tier serves blocks written under named values to a pool that
// declares the names in another order; other assignments miss.
func TestTierNamedKeysDisk(t *testing.T) {
	dir := t.TempDir()
	prompt := tierPrompt(3*blockSize + 1)
	disk, _ := DefaultTierConfig(TIER_DISK)
	disk.CapacityBytes, disk.Path = 1<<24, dir
	w := namedPool(t, []string{"salt", "adapter"})
	must1[int](t)(w.AddTier(disk))
	must(t, w.SeqCreate(1))
	must(t, w.Reserve(1, uint64(len(prompt))))
	k := make([][]float32, layers)
	for l := range k {
		k[l] = random(len(prompt)*tierRow, int64(40+l))
		must1[uint64](t)(w.Append(1, uint32(l), 0, k[l], k[l]))
	}
	values := kv("salt", "tenant-1", "adapter", "lora-7")
	must1[uint64](t)(w.PrefixInsertNamed(1, prompt, values))
	if q := must1[uint64](t)(w.PrefixOffloadNamed(prompt, values)); q != 3 {
		t.Fatalf("offloaded %d", q)
	}
	must(t, w.FlushTiers())
	r := namedPool(t, []string{"media", "adapter", "salt"})
	must1[int](t)(r.AddTier(disk))
	if got := must1[PrefixResult](t)(r.PrefixLookupNamed(prompt, 0, kv("salt", "lora-7", "adapter", "tenant-1"))); got.TierTokens != 0 {
		t.Fatalf("swapped values found: %+v", got)
	}
	if got := must1[PrefixResult](t)(r.PrefixLookupNamed(prompt, 0, kv("salt", "tenant-1"))); got.TierTokens != 0 {
		t.Fatalf("salt only found: %+v", got)
	}
	if got := must1[PrefixResult](t)(r.PrefixLookupNamed(prompt, 0, values)); got.TierTokens != 48 {
		t.Fatalf("lookup: %+v", got)
	}
	ticket := must1[uint64](t)(r.PrefixPrefetchNamed(prompt, values))
	for {
		done, loaded, err := r.PrefixPoll(ticket)
		must(t, err)
		if done {
			if loaded != 48 {
				t.Fatalf("loaded %d", loaded)
			}
			break
		}
	}
	if n := must1[uint64](t)(r.PrefixLoadNamed(prompt, values)); n != 0 {
		t.Fatalf("loaded again: %d", n)
	}
	must1[PrefixResult](t)(r.PrefixAttachNamed(2, prompt, 0, values))
	tierHolds(t, r, 2, k, k, 48)
}
