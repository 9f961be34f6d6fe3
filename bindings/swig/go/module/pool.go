package kvcache

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"

	"libkvcache.org/kvcache/internal/native"
)

// Pool is a KV cache pool (kvc_pool): blocks of BlockSize tokens shared by
// sequences. Its methods may be called from several goroutines at once.
// Close it when done; one never closed is freed by a finalizer after a GC.
//
// A Pool holds a pointer to its state, which carries the finalizer: a copy
// of a Pool value is the same pool (closing one closes both) and keeps it
// alive. A nil *Pool or a zero Pool (not made by NewPool) is no pool: every
// method returns an *Error with ERR_NULL_POINTER (Closed reports true).
type Pool struct {
	s *poolState
}

// poolState is what a Pool and its copies share; its finalizer frees the
// native handle once no Pool refers to it.
type poolState struct {
	h native.Pool
}

// errNoPool is returned by the methods of a nil or zero Pool.
func errNoPool() error {
	return &Error{Status: ERR_NULL_POINTER, Message: "the pool is nil or zero (not made by NewPool)"}
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
	if cfg.LayerKCodecs != nil || cfg.LayerVCodecs != nil {
		tables := [2]native.CodecVector{native.NewCodecVector(), native.NewCodecVector()}
		defer native.DeleteCodecVector(tables[0])
		defer native.DeleteCodecVector(tables[1])
		for kv, list := range [2][]*Codec{cfg.LayerKCodecs, cfg.LayerVCodecs} {
			for _, c := range list {
				if c == nil { // the pool's own codec, or its plain storage
					c = &Codec{DType: cfg.KDType, Granularity: SCALE_NONE}
					if kv == 1 {
						c.DType = cfg.VDType
					}
					if pool := [2]*Codec{cfg.KCodec, cfg.VCodec}[kv]; pool != nil {
						c = pool
					}
				}
				n := c.native()
				tables[kv].Add(n)
				native.DeleteCodec(n)
			}
		}
		if err := call(func() { h = native.PoolWith_layer_codecs(nc, kc, vc, tables[0], tables[1]) }); err != nil {
			return nil, err
		}
	} else if err := call(func() { h = native.NewPool(nc, kc, vc) }); err != nil {
		return nil, err
	}
	s := &poolState{h: h}
	runtime.SetFinalizer(s, func(s *poolState) {
		native.DeletePool(s.h) // destroys the library pool unless closed, frees the handle
		if f := finalized.Load(); f != nil {
			(*f)()
		}
	})
	return &Pool{s: s}, nil
}

// do runs f on the pool's handle as one native call (see call), keeping the
// state (and so the handle) alive until f has returned.
func (p *Pool) do(f func(h native.Pool)) error {
	if p == nil || p.s == nil {
		return errNoPool()
	}
	s := p.s
	defer runtime.KeepAlive(s)
	return call(func() { f(s.h) })
}

// Close destroys the pool once the calls other goroutines have in flight
// are done; later calls fail with ERR_NULL_POINTER. Closing again does nothing.
func (p *Pool) Close() error {
	return p.do(func(h native.Pool) { h.Close() })
}

// Closed reports whether Close was called (true for a nil or zero Pool).
func (p *Pool) Closed() bool {
	closed := true
	_ = p.do(func(h native.Pool) { closed = h.Closed() })
	return closed
}

// Config is the pool's configuration (without codecs).
func (p *Pool) Config() (cfg PoolConfig, err error) {
	var n native.PoolConfig
	if err = p.do(func(h native.Pool) { n = h.Config() }); err != nil {
		return cfg, err
	}
	defer native.DeletePoolConfig(n)
	return poolConfigFrom(n), nil
}

// Stats are the pool's counters.
func (p *Pool) Stats() (Stats, error) {
	var n native.Stats
	if err := p.do(func(h native.Pool) { n = h.Stats() }); err != nil {
		return Stats{}, err
	}
	return statsFrom(n), nil
}

// SeqCreate creates an empty sequence.
func (p *Pool) SeqCreate(seq uint64) error {
	return p.do(func(h native.Pool) { h.Seq_create(seq) })
}

// SeqFork creates child sharing every block of parent (copy-on-write).
func (p *Pool) SeqFork(parent, child uint64) error {
	return p.do(func(h native.Pool) { h.Seq_fork(parent, child) })
}

// SeqTruncate drops every token at position >= length.
func (p *Pool) SeqTruncate(seq, length uint64) error {
	return p.do(func(h native.Pool) { h.Seq_truncate(seq, length) })
}

// SeqFree frees a sequence.
func (p *Pool) SeqFree(seq uint64) error {
	return p.do(func(h native.Pool) { h.Seq_free(seq) })
}

// Save returns the sequence as a self-describing record (kvc_seq_save,
// docs/tiers.md): block bytes as stored, positions, scores and a fingerprint
// of the pool's configuration. Restore takes it back, in this pool or another
// of the same configuration.
func (p *Pool) Save(seq uint64) ([]byte, error) {
	for {
		var size uint64
		if err := p.do(func(h native.Pool) { size = h.Save_size(seq) }); err != nil {
			return nil, err
		}
		buf := make([]byte, size)
		var n uint64
		err := p.do(func(h native.Pool) { n = h.Save_into(seq, buf) })
		if errors.Is(err, ERR_BUFFER_TOO_SMALL) {
			continue // the sequence grew between the two calls
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// Restore creates sequence seq from a record of Save (kvc_seq_restore); on
// any error (ERR_CORRUPT, ERR_INCOMPATIBLE, ERR_POOL_EXHAUSTED,
// ERR_SEQ_EXISTS) nothing changes.
func (p *Pool) Restore(seq uint64, record []byte) error {
	return p.do(func(h native.Pool) { h.Restore(seq, record) })
}

// SaveFile writes the sequence's record to path atomically (kvc_seq_save_file).
func (p *Pool) SaveFile(seq uint64, path string) error {
	return p.do(func(h native.Pool) { h.Save_file(seq, path) })
}

// RestoreFile creates sequence seq from a file written by SaveFile.
func (p *Pool) RestoreFile(seq uint64, path string) error {
	return p.do(func(h native.Pool) { h.Restore_file(seq, path) })
}

// SeqLength is the next position to write.
func (p *Pool) SeqLength(seq uint64) (n uint64, err error) {
	err = p.do(func(h native.Pool) { n = h.Seq_length(seq) })
	return n, err
}

// LayerTokens is the number of tokens one layer holds (fewer than the length after eviction).
func (p *Pool) LayerTokens(seq uint64, layer uint32) (n uint64, err error) {
	err = p.do(func(h native.Pool) { n = h.Layer_tokens(seq, uint(layer)) })
	return n, err
}

// Reserve adds n positions to every layer (all or nothing).
func (p *Pool) Reserve(seq, n uint64) error {
	return p.do(func(h native.Pool) { h.Reserve(seq, n) })
}

// Append writes K and V of n tokens at positions [pos, pos+n) of a layer:
// k and v are [n][NumKVHeads][HeadDim] float32, n = len(k) / row. Returns n.
func (p *Pool) Append(seq uint64, layer uint32, pos uint64, k, v []float32) (uint64, error) {
	return p.append(seq, layer, pos, bytesOf(k), bytesOf(v), DTYPE_F32)
}

// Append16 is Append with f16 or bf16 data: dtype must be DTYPE_F16 or
// DTYPE_BF16 (ERR_INVALID_ARGUMENT otherwise: the data is not reinterpreted).
func (p *Pool) Append16(seq uint64, layer uint32, pos uint64, k, v []Float16, dtype DType) (uint64, error) {
	if err := check16("Append16", dtype); err != nil {
		return 0, err
	}
	return p.append(seq, layer, pos, bytesOf(k), bytesOf(v), dtype)
}

func (p *Pool) append(seq uint64, layer uint32, pos uint64, k, v []byte, dtype DType) (n uint64, err error) {
	err = p.do(func(h native.Pool) { n = h.Append(seq, uint(layer), pos, k, v, native.Kvc_dtype(dtype)) })
	return n, err
}

// Gather reads K and/or V of a layer's tokens [first, first+n) into kOut and
// vOut ([n][NumKVHeads][HeadDim] float32 each; either may be nil). Returns n.
func (p *Pool) Gather(seq uint64, layer uint32, first uint64, kOut, vOut []float32) (uint64, error) {
	return p.gather(seq, layer, first, bytesOf(kOut), bytesOf(vOut), DTYPE_F32)
}

// Gather16 is Gather into f16 or bf16: dtype must be DTYPE_F16 or
// DTYPE_BF16 (ERR_INVALID_ARGUMENT otherwise).
func (p *Pool) Gather16(seq uint64, layer uint32, first uint64, kOut, vOut []Float16, dtype DType) (uint64, error) {
	if err := check16("Gather16", dtype); err != nil {
		return 0, err
	}
	return p.gather(seq, layer, first, bytesOf(kOut), bytesOf(vOut), dtype)
}

func (p *Pool) gather(seq uint64, layer uint32, first uint64, k, v []byte, dtype DType) (n uint64, err error) {
	err = p.do(func(h native.Pool) { n = h.Gather(seq, uint(layer), first, k, v, native.Kvc_dtype(dtype)) })
	return n, err
}

// Positions are the positions of a layer's tokens [first, first+n).
func (p *Pool) Positions(seq uint64, layer uint32, first, n uint64) ([]int32, error) {
	var v native.Int32Vector
	if err := p.do(func(h native.Pool) { v = h.Positions(seq, uint(layer), first, n) }); err != nil {
		return nil, err
	}
	return takeInts(v), nil
}

// BlockTable is the block ids of one layer of a sequence, in order.
func (p *Pool) BlockTable(seq uint64, layer uint32) ([]int32, error) {
	var v native.Int32Vector
	if err := p.do(func(h native.Pool) { v = h.Block_table(seq, uint(layer)) }); err != nil {
		return nil, err
	}
	return takeInts(v), nil
}

// SetPolicy sets the pool's default eviction policy (nil: none). A zero
// Policy (not made by NewPolicy) is an error (ERR_NULL_POINTER), not none.
func (p *Pool) SetPolicy(policy *Policy) error {
	return p.withPolicy(policy, func(h native.Pool, ph native.Policy) { h.Set_policy(ph) })
}

// SetKeySmoothing sets per-channel key smoothing (kvc_pool_set_key_smoothing):
// keys are stored as codes of (k - offset) / scale per channel. scale and
// offset hold num_layers x num_kv_heads x head_dim values (offset nil: zeros;
// both nil: none). Only on a pool with no sequence and no prefix cache.
func (p *Pool) SetKeySmoothing(scale, offset []float32) error {
	return p.do(func(h native.Pool) { h.Set_key_smoothing(bytesOf(scale), bytesOf(offset)) })
}

// SetCodebook sets a codebook of the pool's keys (part 0) or values (part 1)
// (kvc_pool_set_codebook): the part's int2/int3/int4 codes index non-uniform
// levels instead of the evenly spaced integers. levels holds num_layers x
// 2^bits values, layer by layer, each in [-1, 1] and strictly ascending
// within a layer (CodebookGaussian gives levels for rotated values); nil or
// empty removes the part's codebook. Only on a pool with no sequence and no
// prefix cache.
func (p *Pool) SetCodebook(part uint32, levels []float32) error {
	return p.do(func(h native.Pool) { h.Set_codebook(uint(part), bytesOf(levels)) })
}

// SeqSetPolicy attaches a policy to one sequence (nil: the pool's default).
func (p *Pool) SeqSetPolicy(seq uint64, policy *Policy) error {
	return p.withPolicy(policy, func(h native.Pool, ph native.Policy) { h.Seq_set_policy(seq, ph) })
}

// Evict applies policy (nil: the sequence's, else the pool's) and returns
// the tokens each layer dropped, one entry per layer (as kvc_evict).
func (p *Pool) Evict(seq uint64, policy *Policy) ([]uint64, error) {
	var v native.UInt64Vector
	if err := p.withPolicy(policy, func(h native.Pool, ph native.Policy) { v = h.Evict(seq, ph) }); err != nil {
		return nil, err
	}
	return takeUints(v), nil
}

// withPolicy is do with a policy argument (nil: none; zero: an error),
// kept alive until f has returned.
func (p *Pool) withPolicy(policy *Policy, f func(h native.Pool, ph native.Policy)) error {
	if p == nil || p.s == nil {
		return errNoPool()
	}
	ph := native.Policy(native.SwigcptrPolicy(0))
	if policy != nil {
		if policy.s == nil {
			return errNoPolicy()
		}
		ph = policy.s.h
		defer runtime.KeepAlive(policy.s)
	}
	return p.do(func(h native.Pool) { f(h, ph) })
}

// EnablePrefixCache turns the prefix cache on (cfg nil: the defaults).
func (p *Pool) EnablePrefixCache(cfg *PrefixConfig) error {
	if p == nil || p.s == nil {
		return errNoPool()
	}
	nc := native.PrefixConfig(native.SwigcptrPrefixConfig(0))
	model, tokenizer := "", ""
	names := native.NewStringVector()
	defer native.DeleteStringVector(names)
	if cfg != nil {
		nc = cfg.native()
		defer native.DeletePrefixConfig(nc)
		model, tokenizer = cfg.ModelID, cfg.TokenizerID
		for _, n := range cfg.ExtraKeyNames {
			names.Add(n)
		}
	}
	return p.do(func(h native.Pool) { h.Enable_prefix_cache(nc, model, tokenizer, names) })
}

// PrefixLookup finds the cached leading tokens of a prompt. flags: 0 or
// PREFIX_PARTIAL; salt: the tenant's extra key ("" for none).
func (p *Pool) PrefixLookup(tokens []int32, flags uint32, salt string) (r PrefixResult, err error) {
	var n native.PrefixResult
	if err = p.do(func(h native.Pool) { n = h.Prefix_lookup(tokens, uint(flags), salt) }); err != nil {
		return r, err
	}
	return prefixResultFrom(n), nil
}

// PrefixAttach creates seq holding the cached prefix of the prompt.
func (p *Pool) PrefixAttach(seq uint64, tokens []int32, flags uint32, salt string) (r PrefixResult, err error) {
	var n native.PrefixResult
	if err = p.do(func(h native.Pool) { n = h.Prefix_attach(seq, tokens, uint(flags), salt) }); err != nil {
		return r, err
	}
	return prefixResultFrom(n), nil
}

// PrefixInsert registers the full blocks of a sequence's prompt; returns the blocks newly registered.
func (p *Pool) PrefixInsert(seq uint64, tokens []int32, salt string) (n uint64, err error) {
	err = p.do(func(h native.Pool) { n = h.Prefix_insert(seq, tokens, salt) })
	return n, err
}

// PrefixStats are the prefix cache's counters.
func (p *Pool) PrefixStats() (PrefixStats, error) {
	var n native.PrefixStats
	if err := p.do(func(h native.Pool) { n = h.Prefix_stats() }); err != nil {
		return PrefixStats{}, err
	}
	return prefixStatsFrom(n), nil
}

// finalized, when set (by tests), is called after a finalizer freed a pool.
var finalized atomic.Pointer[func()]

// Policy is an eviction policy (kvc_policy). Pools and sequences it is
// attached to keep their own reference: it may be closed after attaching.
// Like a Pool, it holds a pointer to its state (copies are the same policy);
// a zero Policy (not made by NewPolicy) is an error wherever it is passed or
// called (ERR_NULL_POINTER), never "no policy": that is a nil *Policy.
type Policy struct {
	s *policyState
}

type policyState struct {
	h native.Policy
}

func errNoPolicy() error {
	return &Error{Status: ERR_NULL_POINTER, Message: "the policy is zero (not made by NewPolicy)"}
}

// NewPolicy creates a policy (kvc_policy_create).
func NewPolicy(cfg PolicyConfig) (*Policy, error) {
	nc := cfg.native()
	defer native.DeletePolicyConfig(nc)
	var h native.Policy
	mk := func() { h = native.NewPolicy(nc) }
	if len(cfg.HeadGates) > 0 {
		mk = func() { h = native.PolicyWith_head_gates(nc, bytesOf(cfg.HeadGates)) }
	}
	if err := call(mk); err != nil {
		return nil, err
	}
	s := &policyState{h: h}
	runtime.SetFinalizer(s, func(s *policyState) { native.DeletePolicy(s.h) })
	return &Policy{s: s}, nil
}

func (pol *Policy) do(f func(h native.Policy)) error {
	if pol == nil {
		return &Error{Status: ERR_NULL_POINTER, Message: "the policy is nil"}
	}
	if pol.s == nil {
		return errNoPolicy()
	}
	s := pol.s
	defer runtime.KeepAlive(s)
	return call(func() { f(s.h) })
}

// Close releases the policy; passing it afterwards fails with ERR_NULL_POINTER. Idempotent.
func (pol *Policy) Close() error {
	return pol.do(func(h native.Policy) { h.Close() })
}

// Closed reports whether Close was called (true for a nil or zero Policy).
func (pol *Policy) Closed() bool {
	closed := true
	_ = pol.do(func(h native.Policy) { closed = h.Closed() })
	return closed
}

// check16 refuses a dtype that []Float16 data cannot hold.
func check16(what string, dtype DType) error {
	if dtype == DTYPE_F16 || dtype == DTYPE_BF16 {
		return nil
	}
	return &Error{Status: ERR_INVALID_ARGUMENT,
		Message: fmt.Sprintf("%s: []Float16 holds f16 or bf16 bit patterns, not dtype %d: pass DTYPE_F16 or DTYPE_BF16", what, int(dtype))}
}
