package kvcache_test

import (
	"errors"
	"fmt"
	"log"

	"libkvcache.org/kvcache"
)

// The usage example of README.md, line for line (ctest go_readme_sync checks
// it); go test runs it and compares its output.
func Example() {
	// [readme]
	cfg := kvcache.DefaultPoolConfig() // library defaults, then the model's shape
	cfg.NumLayers, cfg.NumQHeads, cfg.NumKVHeads, cfg.HeadDim = 2, 4, 2, 64
	cfg.BlockSize, cfg.NumBlocks = 16, 64
	cfg.KDType, cfg.VDType = kvcache.DTYPE_F16, kvcache.DTYPE_F16 // stored as f16

	pool, err := kvcache.NewPool(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	if err := pool.SeqCreate(1); err != nil {
		log.Fatal(err)
	}
	if err := pool.Reserve(1, 3); err != nil { // 3 token slots in every layer
		log.Fatal(err)
	}
	k := make([]float32, 3*2*64) // [tokens][kv heads][head_dim]
	v := make([]float32, 3*2*64)
	for i := range k {
		k[i], v[i] = float32(i)/1024, -float32(i)/1024 // exact in f16
	}
	n, err := pool.Append(1, 0, 0, k, v) // layer 0, positions 0..2
	if err != nil {
		log.Fatal(err)
	}
	if err := pool.SeqFork(1, 2); err != nil { // copy-on-write child
		log.Fatal(err)
	}
	kOut := make([]float32, len(k))
	if _, err := pool.Gather(2, 0, 0, kOut, nil); err != nil { // K only
		log.Fatal(err)
	}
	fmt.Println(n, kOut[128])

	_, err = pool.SeqLength(42)
	var e *kvcache.Error
	if errors.As(err, &e) {
		fmt.Println(e.Status, "-", e.Message)
	}
	fmt.Println(errors.Is(err, kvcache.ERR_SEQ_NOT_FOUND))
	// [/readme]

	// Output:
	// 3 0.125
	// KVC_ERR_SEQ_NOT_FOUND - sequence 42 does not exist
	// true
}
