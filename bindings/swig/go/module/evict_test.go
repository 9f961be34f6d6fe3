package kvcache

import (
	"math"
	"reflect"
	"testing"
)

const (
	evictN  = 40
	sink    = 4
	recent  = 16
	dropped = evictN - sink - recent // per layer
)

// perLayer is what Evict returns when every layer dropped n tokens.
func perLayer(n uint64) []uint64 {
	out := make([]uint64, layers)
	for i := range out {
		out[i] = n
	}
	return out
}

func streaming(t *testing.T) *Policy {
	cfg := DefaultPolicyConfig()
	cfg.Kind, cfg.SinkTokens, cfg.RecentTokens = POLICY_STREAMING, sink, recent
	pol, err := NewPolicy(cfg)
	must(t, err)
	t.Cleanup(func() { pol.Close() })
	return pol
}

func fill(t *testing.T, p *Pool, seq uint64) [][]float32 {
	must(t, p.SeqCreate(seq))
	must(t, p.Reserve(seq, evictN))
	k := make([][]float32, layers)
	for l := range k {
		k[l] = random(evictN*row, int64(100*seq)+int64(l))
		must1[uint64](t)(p.Append(seq, uint32(l), 0, k[l], random(evictN*row, int64(100*seq)+50+int64(l))))
	}
	return k
}

// StreamingLLM keeps the 4 sinks and the 16 newest tokens of each layer, with their positions.
func TestEvictStreaming(t *testing.T) {
	p := newTestPool(t, testConfig())
	pol := streaming(t)
	k := fill(t, p, 1)
	before := must1[Stats](t)(p.Stats()).BlocksUsed
	if got := must1[[]uint64](t)(p.Evict(1, pol)); !reflect.DeepEqual(got, perLayer(dropped)) {
		t.Fatalf("Evict dropped %v, want %v (per layer)", got, perLayer(dropped))
	}
	const kept = sink + recent
	want := make([]int32, 0, kept)
	for i := 0; i < sink; i++ {
		want = append(want, int32(i))
	}
	for i := 0; i < recent; i++ {
		want = append(want, int32(evictN-recent+i))
	}
	for l := uint32(0); l < layers; l++ {
		if n := must1[uint64](t)(p.LayerTokens(1, l)); n != kept {
			t.Fatalf("layer %d holds %d tokens", l, n)
		}
		if pos := must1[[]int32](t)(p.Positions(1, l, 0, kept)); !reflect.DeepEqual(pos, want) {
			t.Fatalf("layer %d positions %v, want %v", l, pos, want)
		}
		ko := make([]float32, kept*row)
		must1[uint64](t)(p.Gather(1, l, 0, ko, nil))
		for i, pos := range want {
			assertF16Close(t, "survivor", k[l][int(pos)*row:int(pos+1)*row], ko[i*row:(i+1)*row])
		}
	}
	if n := must1[uint64](t)(p.SeqLength(1)); n != evictN {
		t.Fatalf("length %d after eviction, want %d", n, evictN)
	}
	if used := must1[Stats](t)(p.Stats()).BlocksUsed; used != before-layers {
		t.Fatalf("blocks used %d -> %d", before, used)
	}
	if got := must1[[]uint64](t)(p.Evict(1, pol)); !reflect.DeepEqual(got, perLayer(0)) {
		t.Fatalf("second Evict dropped %v", got)
	}
}

// The sequence's own policy and the pool's default apply when Evict gets nil.
func TestEvictAttachedPolicies(t *testing.T) {
	p := newTestPool(t, testConfig())
	pol := streaming(t)
	for seq := uint64(1); seq <= 3; seq++ {
		fill(t, p, seq)
	}
	must(t, p.SeqSetPolicy(1, pol))
	if got := must1[[]uint64](t)(p.Evict(1, nil)); !reflect.DeepEqual(got, perLayer(dropped)) {
		t.Fatalf("Evict(1) = %v", got)
	}
	if got := must1[[]uint64](t)(p.Evict(2, nil)); !reflect.DeepEqual(got, perLayer(0)) {
		t.Fatalf("Evict(2) with no policy = %v", got)
	}
	must(t, p.SetPolicy(pol))
	must(t, pol.Close()) // the pool keeps its own reference
	if got := must1[[]uint64](t)(p.Evict(3, nil)); !reflect.DeepEqual(got, perLayer(dropped)) {
		t.Fatalf("Evict(3) = %v", got)
	}
}

// DuoAttention with per-head gates (PolicyConfig.HeadGates) in a head-wise pool:
// layer 0's heads all stream (sinks + recent), layer 1's head 0 keeps every token.
func TestEvictDuoAttentionGates(t *testing.T) {
	cfg := testConfig()
	cfg.Flags |= POOL_HEADWISE
	p := newTestPool(t, cfg)
	fill(t, p, 1)
	pc := DefaultPolicyConfig()
	pc.Kind = POLICY_DUO_ATTENTION
	pc.SinkTokens, pc.RecentTokens = sink, recent
	pc.HeadGates = []float32{0.1, 0.2, 0.9, 0.0} // [layer][head]
	pol, err := NewPolicy(pc)
	if err != nil {
		t.Fatalf("NewPolicy: %v", err)
	}
	before := must1[Stats](t)(p.Stats()).BlocksUsed
	must1[[]uint64](t)(p.Evict(1, pol))
	if n := must1[uint64](t)(p.LayerTokens(1, 0)); n != sink+recent {
		t.Fatalf("layer 0 (every head streaming) holds %d tokens, want %d", n, sink+recent)
	}
	if n := must1[uint64](t)(p.LayerTokens(1, 1)); n != evictN {
		t.Fatalf("layer 1 (a retrieval head) holds %d tokens, want %d", n, evictN)
	}
	// 40 tokens in 3 blocks per head; a streaming head keeps 20 in 2: three heads free one each.
	if used := must1[Stats](t)(p.Stats()).BlocksUsed; used != before-3 {
		t.Fatalf("blocks used %d -> %d, want 3 freed", before, used)
	}
	pc.HeadGates = []float32{0.1, 0.2, 0.9} // 3 gates for 2 layers x 2 heads
	wrong, err := NewPolicy(pc)
	if err != nil {
		t.Fatalf("NewPolicy: %v", err)
	}
	_, err = p.Evict(1, wrong)
	assertStatus(t, err, ERR_INVALID_ARGUMENT)
	pc.HeadGates = []float32{0.1, float32(math.NaN()), 0.9, 0.0}
	_, err = NewPolicy(pc)
	assertStatus(t, err, ERR_INVALID_ARGUMENT)
}
