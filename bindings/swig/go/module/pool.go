package kvcache

import (
	"runtime"
	"sync/atomic"

	"libkvcache.org/kvcache/internal/native"
)

// Pool is a KV cache pool (kvc_pool): blocks of BlockSize tokens shared by
// sequences. Its methods may be called from several goroutines at once.
// Close it when done; one never closed is freed by a finalizer after a GC.
type Pool struct {
	h native.Pool
}

// NewPool creates a pool (kvc_pool_create).
func NewPool(cfg PoolConfig) (*Pool, error) {
	nc := cfg.native()
	defer native.DeletePoolConfig(nc)
	kc, vc := native.Codec(native.SwigcptrCodec(0)), native.Codec(native.SwigcptrCodec(0))
	if cfg.KCodec != nil {
		kc = cfg.KCodec.native()
		defer native.DeleteCodec(kc)
	}
	if cfg.VCodec != nil {
		vc = cfg.VCodec.native()
		defer native.DeleteCodec(vc)
	}
	var h native.Pool
	if err := call(func() { h = native.NewPool(nc, kc, vc) }); err != nil {
		return nil, err
	}
	p := &Pool{h: h}
	runtime.SetFinalizer(p, func(p *Pool) {
		native.DeletePool(p.h) // destroys the library pool unless closed, frees the handle
		if f := finalized.Load(); f != nil {
			(*f)()
		}
	})
	return p, nil
}

// Close destroys the pool once the calls other goroutines have in flight
// are done; later calls fail with ERR_NULL_POINTER. Closing again does nothing.
func (p *Pool) Close() error {
	defer keep(p)
	return call(func() { p.h.Close() })
}

// Closed reports whether Close was called.
func (p *Pool) Closed() bool {
	defer keep(p)
	return p.h.Closed()
}

// Config is the pool's configuration (without codecs).
func (p *Pool) Config() (cfg PoolConfig, err error) {
	defer keep(p)
	var n native.PoolConfig
	if err = call(func() { n = p.h.Config() }); err != nil {
		return cfg, err
	}
	defer native.DeletePoolConfig(n)
	return poolConfigFrom(n), nil
}

// Stats are the pool's counters.
func (p *Pool) Stats() (Stats, error) {
	defer keep(p)
	var n native.Stats
	if err := call(func() { n = p.h.Stats() }); err != nil {
		return Stats{}, err
	}
	return statsFrom(n), nil
}

// SeqCreate creates an empty sequence.
func (p *Pool) SeqCreate(seq uint64) error {
	defer keep(p)
	return call(func() { p.h.Seq_create(seq) })
}

// SeqFork creates child sharing every block of parent (copy-on-write).
func (p *Pool) SeqFork(parent, child uint64) error {
	defer keep(p)
	return call(func() { p.h.Seq_fork(parent, child) })
}

// SeqTruncate drops every token at position >= length.
func (p *Pool) SeqTruncate(seq, length uint64) error {
	defer keep(p)
	return call(func() { p.h.Seq_truncate(seq, length) })
}

// SeqFree frees a sequence.
func (p *Pool) SeqFree(seq uint64) error {
	defer keep(p)
	return call(func() { p.h.Seq_free(seq) })
}

// SeqLength is the next position to write.
func (p *Pool) SeqLength(seq uint64) (n uint64, err error) {
	defer keep(p)
	err = call(func() { n = p.h.Seq_length(seq) })
	return n, err
}

// LayerTokens is the number of tokens one layer holds (fewer than the length after eviction).
func (p *Pool) LayerTokens(seq uint64, layer uint32) (n uint64, err error) {
	defer keep(p)
	err = call(func() { n = p.h.Layer_tokens(seq, uint(layer)) })
	return n, err
}

// Reserve adds n positions to every layer (all or nothing).
func (p *Pool) Reserve(seq, n uint64) error {
	defer keep(p)
	return call(func() { p.h.Reserve(seq, n) })
}

// Append writes K and V of n tokens at positions [pos, pos+n) of a layer:
// k and v are [n][NumKVHeads][HeadDim] float32, n = len(k) / row. Returns n.
func (p *Pool) Append(seq uint64, layer uint32, pos uint64, k, v []float32) (uint64, error) {
	return p.append(seq, layer, pos, bytesOf(k), bytesOf(v), DTYPE_F32)
}

// Append16 is Append with f16 or bf16 data (dtype DTYPE_F16 or DTYPE_BF16).
func (p *Pool) Append16(seq uint64, layer uint32, pos uint64, k, v []Float16, dtype DType) (uint64, error) {
	return p.append(seq, layer, pos, bytesOf(k), bytesOf(v), dtype)
}

func (p *Pool) append(seq uint64, layer uint32, pos uint64, k, v []byte, dtype DType) (n uint64, err error) {
	defer keep(p)
	err = call(func() { n = p.h.Append(seq, uint(layer), pos, k, v, native.Kvc_dtype(dtype)) })
	return n, err
}

// Gather reads K and/or V of a layer's tokens [first, first+n) into kOut and
// vOut ([n][NumKVHeads][HeadDim] float32 each; either may be nil). Returns n.
func (p *Pool) Gather(seq uint64, layer uint32, first uint64, kOut, vOut []float32) (uint64, error) {
	return p.gather(seq, layer, first, bytesOf(kOut), bytesOf(vOut), DTYPE_F32)
}

// Gather16 is Gather into f16 or bf16 (dtype DTYPE_F16 or DTYPE_BF16).
func (p *Pool) Gather16(seq uint64, layer uint32, first uint64, kOut, vOut []Float16, dtype DType) (uint64, error) {
	return p.gather(seq, layer, first, bytesOf(kOut), bytesOf(vOut), dtype)
}

func (p *Pool) gather(seq uint64, layer uint32, first uint64, k, v []byte, dtype DType) (n uint64, err error) {
	defer keep(p)
	err = call(func() { n = p.h.Gather(seq, uint(layer), first, k, v, native.Kvc_dtype(dtype)) })
	return n, err
}

// Positions are the positions of a layer's tokens [first, first+n).
func (p *Pool) Positions(seq uint64, layer uint32, first, n uint64) ([]int32, error) {
	defer keep(p)
	var v native.Int32Vector
	if err := call(func() { v = p.h.Positions(seq, uint(layer), first, n) }); err != nil {
		return nil, err
	}
	return takeInts(v), nil
}

// BlockTable is the block ids of one layer of a sequence, in order.
func (p *Pool) BlockTable(seq uint64, layer uint32) ([]int32, error) {
	defer keep(p)
	var v native.Int32Vector
	if err := call(func() { v = p.h.Block_table(seq, uint(layer)) }); err != nil {
		return nil, err
	}
	return takeInts(v), nil
}

// SetPolicy sets the pool's default eviction policy (nil: none).
func (p *Pool) SetPolicy(policy *Policy) error {
	defer keep(p)
	defer keep(policy)
	return call(func() { p.h.Set_policy(policy.handle()) })
}

// SeqSetPolicy attaches a policy to one sequence (nil: the pool's default).
func (p *Pool) SeqSetPolicy(seq uint64, policy *Policy) error {
	defer keep(p)
	defer keep(policy)
	return call(func() { p.h.Seq_set_policy(seq, policy.handle()) })
}

// Evict applies policy (nil: the sequence's, else the pool's) and returns
// the tokens dropped, summed over the layers.
func (p *Pool) Evict(seq uint64, policy *Policy) (dropped uint64, err error) {
	defer keep(p)
	defer keep(policy)
	err = call(func() { dropped = p.h.Evict(seq, policy.handle()) })
	return dropped, err
}

// EnablePrefixCache turns the prefix cache on (cfg nil: the defaults).
func (p *Pool) EnablePrefixCache(cfg *PrefixConfig) error {
	defer keep(p)
	nc := native.PrefixConfig(native.SwigcptrPrefixConfig(0))
	model, tokenizer := "", ""
	if cfg != nil {
		nc = cfg.native()
		defer native.DeletePrefixConfig(nc)
		model, tokenizer = cfg.ModelID, cfg.TokenizerID
	}
	return call(func() { p.h.Enable_prefix_cache(nc, model, tokenizer) })
}

// PrefixLookup finds the cached leading tokens of a prompt. flags: 0 or
// PREFIX_PARTIAL; salt: the tenant's extra key ("" for none).
func (p *Pool) PrefixLookup(tokens []int32, flags uint32, salt string) (r PrefixResult, err error) {
	defer keep(p)
	var n native.PrefixResult
	if err = call(func() { n = p.h.Prefix_lookup(tokens, uint(flags), salt) }); err != nil {
		return r, err
	}
	return prefixResultFrom(n), nil
}

// PrefixAttach creates seq holding the cached prefix of the prompt.
func (p *Pool) PrefixAttach(seq uint64, tokens []int32, flags uint32, salt string) (r PrefixResult, err error) {
	defer keep(p)
	var n native.PrefixResult
	if err = call(func() { n = p.h.Prefix_attach(seq, tokens, uint(flags), salt) }); err != nil {
		return r, err
	}
	return prefixResultFrom(n), nil
}

// PrefixInsert registers the full blocks of a sequence's prompt; returns the blocks newly registered.
func (p *Pool) PrefixInsert(seq uint64, tokens []int32, salt string) (n uint64, err error) {
	defer keep(p)
	err = call(func() { n = p.h.Prefix_insert(seq, tokens, salt) })
	return n, err
}

// PrefixStats are the prefix cache's counters.
func (p *Pool) PrefixStats() (PrefixStats, error) {
	defer keep(p)
	var n native.PrefixStats
	if err := call(func() { n = p.h.Prefix_stats() }); err != nil {
		return PrefixStats{}, err
	}
	return prefixStatsFrom(n), nil
}

// finalized, when set (by tests), is called after a finalizer freed a pool.
var finalized atomic.Pointer[func()]

// Policy is an eviction policy (kvc_policy). Pools and sequences it is
// attached to keep their own reference: it may be closed after attaching.
type Policy struct {
	h native.Policy
}

// NewPolicy creates a policy (kvc_policy_create).
func NewPolicy(cfg PolicyConfig) (*Policy, error) {
	nc := cfg.native()
	defer native.DeletePolicyConfig(nc)
	var h native.Policy
	if err := call(func() { h = native.NewPolicy(nc) }); err != nil {
		return nil, err
	}
	pol := &Policy{h: h}
	runtime.SetFinalizer(pol, func(pol *Policy) { native.DeletePolicy(pol.h) })
	return pol, nil
}

// Close releases the policy; passing it afterwards fails with ERR_NULL_POINTER. Idempotent.
func (pol *Policy) Close() error {
	defer keep(pol)
	return call(func() { pol.h.Close() })
}

// Closed reports whether Close was called.
func (pol *Policy) Closed() bool {
	defer keep(pol)
	return pol.h.Closed()
}

// handle is the native argument: NULL for a nil *Policy.
func (pol *Policy) handle() native.Policy {
	if pol == nil {
		return native.SwigcptrPolicy(0)
	}
	return pol.h
}
