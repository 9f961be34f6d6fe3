package kvcache

import (
	"runtime"

	"libkvcache.org/kvcache/internal/native"
)

// Store is kvc_store (docs/engines.md): one tier (host memory, a disk
// directory, a Redis server or Redis Cluster) opened by itself and addressed
// by byte-string keys under a scope, the way serving engines address their
// pages. Keys and scopes are 1 to STORE_KEY_MAX bytes. Its methods may be
// called from several goroutines at once. Close it when done; one never
// closed is closed by a finalizer after a GC. A nil or zero Store is no store:
// every method returns an *Error with ERR_NULL_POINTER.
type Store struct {
	s *storeState
}

type storeState struct {
	h native.Store
}

// OpenStore opens the tier cfg describes (kvc_store_open; DefaultTierConfig
// gives the defaults) under scope (nil: none).
func OpenStore(cfg TierConfig, scope []byte) (*Store, error) {
	var h native.Store
	if err := call(func() {
		h = native.NewStore(native.Kvc_tier_kind(cfg.Kind), cfg.CapacityBytes, cfg.Path, cfg.Address,
			uint(cfg.Flags), uint(cfg.TimeoutMs), cfg.TtlSeconds, scope)
	}); err != nil {
		return nil, err
	}
	s := &storeState{h: h}
	runtime.SetFinalizer(s, func(s *storeState) { native.DeleteStore(s.h) })
	return &Store{s: s}, nil
}

func (st *Store) do(f func(h native.Store)) error {
	if st == nil || st.s == nil {
		return &Error{Status: ERR_NULL_POINTER, Message: "the store is nil or zero (not made by OpenStore)"}
	}
	s := st.s
	defer runtime.KeepAlive(s)
	return call(func() { f(s.h) })
}

// Close closes the store after the calls in flight; later calls fail with
// ERR_NULL_POINTER. Closing again does nothing.
func (st *Store) Close() error {
	return st.do(func(h native.Store) { h.Close() })
}

// Put stores value under key, replacing any value it had (kvc_store_put).
func (st *Store) Put(key, value []byte) error {
	return st.do(func(h native.Store) { h.Put(key, value) })
}

// Get returns the value of key (kvc_store_get); found is false on a miss.
func (st *Store) Get(key []byte) (value []byte, found bool, err error) {
	buf := make([]byte, 4096)
	for {
		var n int64
		if err = st.do(func(h native.Store) { n = h.Get_into(key, buf) }); err != nil {
			return nil, false, err
		}
		if n < 0 {
			return nil, false, nil
		}
		if n <= int64(len(buf)) {
			return buf[:n], true, nil
		}
		buf = make([]byte, n) // longer than the buffer: read again at its size
	}
}

// Contains reports which keys the store holds (kvc_store_contains: one round
// trip per Redis server).
func (st *Store) Contains(keys [][]byte) ([]bool, error) {
	if len(keys) == 0 {
		return []bool{}, nil
	}
	var all []byte
	lens := native.NewUInt64Vector()
	defer native.DeleteUInt64Vector(lens)
	for _, k := range keys {
		all = append(all, k...)
		lens.Add(uint64(len(k)))
	}
	if len(all) == 0 {
		all = []byte{0} // every key empty: the library refuses them, with its message
	}
	var found []int32
	err := st.do(func(h native.Store) { found = takeInts(h.Contains_many(all, lens)) })
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(found))
	for i, f := range found {
		out[i] = f != 0
	}
	return out, nil
}

// Remove removes the value of key (kvc_store_remove): whether there was one.
func (st *Store) Remove(key []byte) (removed bool, err error) {
	err = st.do(func(h native.Store) { removed = h.Remove(key) })
	return removed, err
}

// Pin keeps the value of key from LRU replacement until Unpin (host and disk
// stores; kvc_store_pin): whether it was there. Redis stores have no pins.
func (st *Store) Pin(key []byte) (was bool, err error) {
	err = st.do(func(h native.Store) { was = h.Pin(key, true) })
	return was, err
}

// Unpin undoes one Pin: whether the value was pinned.
func (st *Store) Unpin(key []byte) (was bool, err error) {
	err = st.do(func(h native.Store) { was = h.Pin(key, false) })
	return was, err
}

// Stats are the counters of the store's tier (kvc_store_stats).
func (st *Store) Stats() (TierStats, error) {
	var n native.TierStats
	if err := st.do(func(h native.Store) { n = h.Stats() }); err != nil {
		return TierStats{}, err
	}
	return tierStatsFrom(n), nil
}

// ImportLlama creates sequence seq from a llama.cpp sequence state blob
// (llama_state_seq_get_data; kvc_seq_import_llama, docs/engines.md) and
// returns the tokens imported. flags: LLAMA_ATTN_ROT (the blob's quantized
// K / V are in llama.cpp's rotated space) or 0. On any error nothing is made.
func (p *Pool) ImportLlama(seq uint64, blob []byte, flags uint32) (tokens uint64, err error) {
	err = p.do(func(h native.Pool) { tokens = h.Import_llama(seq, blob, uint(flags)) })
	return tokens, err
}

// ExportLlama writes sequence seq as a llama.cpp sequence state blob of
// sequence llamaSeq (kvc_seq_export_llama) for llama_state_seq_set_data.
// kType / vType: LLAMA_F32, LLAMA_F16, LLAMA_Q8_0; flags: LLAMA_ATTN_ROT,
// LLAMA_V_TRANS.
func (p *Pool) ExportLlama(seq uint64, llamaSeq int32, kType, vType LlamaType, flags uint32) ([]byte, error) {
	var size uint64
	if err := p.do(func(h native.Pool) {
		size = h.Export_llama_size(seq, int(llamaSeq), int(kType), int(vType), uint(flags))
	}); err != nil {
		return nil, err
	}
	buf := make([]byte, size)
	var n uint64
	if err := p.do(func(h native.Pool) {
		n = h.Export_llama_into(seq, int(llamaSeq), int(kType), int(vType), uint(flags), buf)
	}); err != nil {
		return nil, err
	}
	return buf[:n], nil
}
