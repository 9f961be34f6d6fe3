package kvcache

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"unsafe"
)

// ctest abi_init_go: the binding initialises the C structs with
// kvc_<thing>_init_sized, never past the caller's struct (docs/abi-policy.md).
// A caller buffer of an older header's size, followed by guard bytes, is
// initialised through InitSized (the call the Default* functions make with
// the binding's own size): the guard bytes stay, struct_size is the caller's
// size; sizes inside a field are refused and write nothing.

const (
	initGuard = 64
	initG     = 0xa5
)

type initCase struct {
	s       CStruct
	name    string
	size03  uint64
	older   []uint64
	inside  uint64 // 0: none
	defOff  int    // a covered uint32 default (-1: none)
	defWant uint32
}

var initCases = []initCase{
	{StructPoolConfig, "kvc_pool_config", 136, []uint64{48, 72, 112, 136}, 76, 24, 16},
	{StructCodec, "kvc_codec", 56, []uint64{48, 52, 56}, 50, 16, 32},
	{StructPolicyConfig, "kvc_policy_config", 88, []uint64{88}, 0, 12, 4},
	{StructPrefixConfig, "kvc_prefix_config", 72, []uint64{72}, 0, 12, 1},
	{StructStats, "kvc_stats", 128, []uint64{48, 96, 128}, 52, -1, 0},
	{StructPrefixStats, "kvc_prefix_stats", 80, []uint64{80}, 0, -1, 0},
	{StructQuantSizes, "kvc_quant_sizes", 40, []uint64{40}, 0, -1, 0},
	{StructTierConfig, "kvc_tier_config", 56, []uint64{56}, 0, 40, 1000},
	{StructTierStats, "kvc_tier_stats", 352, []uint64{352}, 0, -1, 0},
}

// guarded is n guard bytes, 8-byte aligned (the backing array of a []uint64).
func guarded(n uint64) []byte {
	words := make([]uint64, (n+7)/8)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)[:n]
	for i := range b {
		b[i] = initG
	}
	return b
}

func TestInitSizedOlderCallerGuardBytes(t *testing.T) {
	if c := DefaultPoolConfig(); c.BlockSize != 16 {
		t.Fatalf("DefaultPoolConfig().BlockSize = %d", c.BlockSize)
	}
	for _, c := range initCases {
		for _, size := range c.older {
			b := guarded(size + initGuard)
			if err := InitSized(c.s, b, size); err != nil {
				t.Fatalf("%s %d: %v", c.name, size, err)
			}
			if got := binary.LittleEndian.Uint64(b); got != size {
				t.Fatalf("%s: struct_size %d after an init of %d bytes", c.name, got, size)
			}
			for i := size; i < size+initGuard; i++ {
				if b[i] != initG {
					t.Fatalf("%s: an init of %d bytes wrote byte %d", c.name, size, i)
				}
			}
			for i := uint64(8); i < size; i++ {
				if b[i] == initG {
					t.Fatalf("%s: byte %d of %d not written", c.name, i, size)
				}
			}
			if c.defOff >= 0 && uint64(c.defOff+4) <= size {
				if got := binary.LittleEndian.Uint32(b[c.defOff:]); got != c.defWant {
					t.Fatalf("%s: default at %d is %d, want %d", c.name, c.defOff, got, c.defWant)
				}
			}
		}
	}
}

func TestInitSizedRefusedSizesWriteNothing(t *testing.T) {
	for _, c := range initCases {
		sizes := []uint64{0, 8, c.older[0] - 8}
		if c.inside != 0 {
			sizes = append(sizes, c.inside)
		}
		for _, size := range sizes {
			b := guarded(c.size03 + initGuard)
			e := assertStatus(t, InitSized(c.s, b, size), ERR_STRUCT_SIZE)
			if c.inside != 0 && size == c.inside && !strings.Contains(e.Message, "inside field") {
				t.Fatalf("%s %d: %q", c.name, size, e.Message)
			}
			for i, x := range b {
				if x != initG {
					t.Fatalf("%s %d: a refused init wrote byte %d", c.name, size, i)
				}
			}
		}
		b := guarded(c.size03 + initGuard)
		assertStatus(t, InitSized(c.s, b[:c.size03-8], c.size03), ERR_BUFFER_TOO_SMALL)
		assertStatus(t, InitSized(c.s, b[1:], c.size03), ERR_INVALID_ARGUMENT)
		assertStatus(t, InitSized(c.s, nil, c.size03), ERR_NULL_POINTER)
	}
	assertStatus(t, InitSized(CStruct(99), guarded(64), 48), ERR_INVALID_ARGUMENT)
}

// The library's sizeof of the structs that grew after 0.3 (0.4: kvc_prefix_config's extra key
// names; kvc_policy_config's future_positions, default 512 at offset 88, head_budget 0 at 92 and
// head_floor 0.2 at 96, head_gates at 104, num_head_gates at 112, gate_threshold 0.5 at 116).
var grownSize = map[CStruct]uint64{StructPrefixConfig: 88, StructPolicyConfig: 120, StructCodec: 64}

func TestInitSizedNewerCallerTailZeroed(t *testing.T) {
	for _, c := range initCases {
		size := c.size03 + 40
		b := guarded(size + initGuard)
		if err := InitSized(c.s, b, size); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		known := c.size03
		if g, ok := grownSize[c.s]; ok {
			known = g
		}
		if c.s == StructPolicyConfig && binary.LittleEndian.Uint32(b[88:92]) != 512 {
			t.Fatalf("%s: future_positions = %d", c.name, binary.LittleEndian.Uint32(b[88:92]))
		}
		if c.s == StructPolicyConfig && math.Float64frombits(binary.LittleEndian.Uint64(b[96:104])) != 0.2 {
			t.Fatalf("%s: head_floor = %v", c.name, math.Float64frombits(binary.LittleEndian.Uint64(b[96:104])))
		}
		if c.s == StructPolicyConfig && math.Float32frombits(binary.LittleEndian.Uint32(b[116:120])) != 0.5 {
			t.Fatalf("%s: gate_threshold = %v", c.name, math.Float32frombits(binary.LittleEndian.Uint32(b[116:120])))
		}
		for i := known; i < size; i++ {
			if b[i] != 0 {
				t.Fatalf("%s: unknown tail byte %d is %#x", c.name, i, b[i])
			}
		}
		for i := size; i < size+initGuard; i++ {
			if b[i] != initG {
				t.Fatalf("%s: wrote byte %d past %d", c.name, i, size)
			}
		}
	}
}
