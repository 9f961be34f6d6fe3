package kvcache

import "testing"

// TestUnwrittenReadZeros: slots a sequence reserved but did not write read
// as zeros, never as the bytes a freed sequence left in the block.
func TestUnwrittenReadZeros(t *testing.T) {
	cfg := testConfig()
	cfg.KDType, cfg.VDType = DTYPE_F32, DTYPE_F32
	p := newTestPool(t, cfg)
	all := uint64(numBlocks / layers * blockSize)
	must(t, p.SeqCreate(9))
	must(t, p.Reserve(9, all))
	old := make([]float32, int(all)*row)
	for i := range old {
		old[i] = 7.5
	}
	for l := uint32(0); l < layers; l++ {
		must1[uint64](t)(p.Append(9, l, 0, old, old))
	}
	must(t, p.SeqFree(9))
	must(t, p.SeqCreate(1))
	must(t, p.Reserve(1, 3))
	mine := make([]float32, row)
	for i := range mine {
		mine[i] = 2
	}
	must1[uint64](t)(p.Append(1, 0, 1, mine, mine))
	k, v := make([]float32, 3*row), make([]float32, 3*row)
	must1[uint64](t)(p.Gather(1, 0, 0, k, v))
	for i := range k {
		want := float32(0)
		if i/row == 1 {
			want = 2
		}
		if k[i] != want || v[i] != want {
			t.Fatalf("element %d: k %v v %v, want %v", i, k[i], v[i], want)
		}
	}
}
