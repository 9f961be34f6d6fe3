package kvcache

import (
	"encoding/binary"
	"sort"
	"strings"

	"libkvcache.org/kvcache/internal/native"
)

// Named extra keys (docs/prefix-cache.md). A pool whose PrefixConfig
// declares ExtraKeyNames takes the values of its extra keys by name: the
// ...Named methods below take a map from name to value (a name left out, or
// an empty value, has none) and pass the values in the pool's declared
// order. A name the pool does not declare is an *Error with
// ERR_INVALID_ARGUMENT. Pools without names keep the positional form: the
// methods taking a salt string.

// ExtraKeyNames are the extra-key names the pool's prefix cache declares, in
// declaration order (nil: positional extra keys, or no prefix cache).
func (p *Pool) ExtraKeyNames() (names []string, err error) {
	err = p.do(func(h native.Pool) {
		v := h.Extra_key_names()
		defer native.DeleteStringVector(v)
		for i := 0; i < int(v.Size()); i++ {
			names = append(names, v.Get(i))
		}
	})
	return names, err
}

// extraValues encodes the values of a call as the native methods take them:
// one per declared name, in order, each a little-endian uint32 size and its
// bytes.
func (p *Pool) extraValues(extras map[string][]byte) ([]byte, error) {
	names, err := p.ExtraKeyNames()
	if err != nil {
		return nil, err
	}
	if len(names) == 0 && len(extras) > 0 {
		return nil, &Error{Status: ERR_INVALID_ARGUMENT, Message: "extra keys by name need a pool that declares them " +
			"(PrefixConfig.ExtraKeyNames); this one takes a salt (the positional methods)"}
	}
	declared := make(map[string]bool, len(names))
	for _, n := range names {
		declared[n] = true
	}
	var unknown []string
	for k := range extras {
		if !declared[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, &Error{Status: ERR_INVALID_ARGUMENT, Message: "extra key " + strings.Join(unknown, ", ") +
			" is not declared by this pool (it declares " + strings.Join(names, ", ") + ")"}
	}
	var b []byte
	for _, n := range names {
		v := extras[n]
		b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	return b, nil
}

// saltValues is the positional form's one extra key (none when salt is "").
func saltValues(salt string) []byte {
	if salt == "" {
		return nil
	}
	return append(binary.LittleEndian.AppendUint32(nil, uint32(len(salt))), salt...)
}

// PrefixLookupNamed is PrefixLookup with the extra keys by name.
func (p *Pool) PrefixLookupNamed(tokens []int32, flags uint32, extras map[string][]byte) (r PrefixResult, err error) {
	v, err := p.extraValues(extras)
	if err != nil {
		return r, err
	}
	var n native.PrefixResult
	if err = p.do(func(h native.Pool) { n = h.Prefix_lookup_values(tokens, uint(flags), v) }); err != nil {
		return r, err
	}
	return prefixResultFrom(n), nil
}

// PrefixAttachNamed is PrefixAttach with the extra keys by name.
func (p *Pool) PrefixAttachNamed(seq uint64, tokens []int32, flags uint32, extras map[string][]byte) (r PrefixResult, err error) {
	v, err := p.extraValues(extras)
	if err != nil {
		return r, err
	}
	var n native.PrefixResult
	if err = p.do(func(h native.Pool) { n = h.Prefix_attach_values(seq, tokens, uint(flags), v) }); err != nil {
		return r, err
	}
	return prefixResultFrom(n), nil
}

// PrefixInsertNamed is PrefixInsert with the extra keys by name.
func (p *Pool) PrefixInsertNamed(seq uint64, tokens []int32, extras map[string][]byte) (n uint64, err error) {
	v, err := p.extraValues(extras)
	if err != nil {
		return 0, err
	}
	err = p.do(func(h native.Pool) { n = h.Prefix_insert_values(seq, tokens, v) })
	return n, err
}

// PrefixKeys are the chain keys of the prompt's full blocks
// (docs/prefix-cache.md), one per block (32 bytes for SHA-256, 16 for
// XXH3-128), with the positional salt ("" for none).
func (p *Pool) PrefixKeys(tokens []int32, salt string) ([][]byte, error) {
	return p.prefixKeys(tokens, saltValues(salt))
}

// PrefixKeysNamed is PrefixKeys with the extra keys by name.
func (p *Pool) PrefixKeysNamed(tokens []int32, extras map[string][]byte) ([][]byte, error) {
	v, err := p.extraValues(extras)
	if err != nil {
		return nil, err
	}
	return p.prefixKeys(tokens, v)
}

func (p *Pool) prefixKeys(tokens []int32, v []byte) ([][]byte, error) {
	cfg, err := p.Config()
	if err != nil {
		return nil, err
	}
	blocks := len(tokens) / int(cfg.BlockSize)
	buf := make([]byte, (blocks+1)*32)
	var ks uint64
	if err := p.do(func(h native.Pool) { ks = h.Prefix_keys_values(tokens, v, buf) }); err != nil {
		return nil, err
	}
	keys := make([][]byte, blocks)
	for i := range keys {
		keys[i] = buf[uint64(i)*ks : uint64(i+1)*ks : uint64(i+1)*ks]
	}
	return keys, nil
}

// PrefixOffloadNamed is PrefixOffload with the extra keys by name.
func (p *Pool) PrefixOffloadNamed(tokens []int32, extras map[string][]byte) (queued uint64, err error) {
	v, err := p.extraValues(extras)
	if err != nil {
		return 0, err
	}
	err = p.do(func(h native.Pool) { queued = h.Prefix_offload_values(tokens, v) })
	return queued, err
}

// PrefixLoadNamed is PrefixLoad with the extra keys by name.
func (p *Pool) PrefixLoadNamed(tokens []int32, extras map[string][]byte) (loaded uint64, err error) {
	v, err := p.extraValues(extras)
	if err != nil {
		return 0, err
	}
	err = p.do(func(h native.Pool) { loaded = h.Prefix_load_values(tokens, v) })
	return loaded, err
}

// PrefixPrefetchNamed is PrefixPrefetch with the extra keys by name.
func (p *Pool) PrefixPrefetchNamed(tokens []int32, extras map[string][]byte) (ticket uint64, err error) {
	v, err := p.extraValues(extras)
	if err != nil {
		return 0, err
	}
	err = p.do(func(h native.Pool) { ticket = h.Prefix_prefetch_values(tokens, v) })
	return ticket, err
}
