package kvcache

import "libkvcache.org/kvcache/internal/native"

// CStruct names a C struct of kvcache.h that follows the struct_size rule
// (docs/abi-policy.md), for InitSized.
type CStruct int

// The C structs InitSized initialises.
const (
	StructPoolConfig   CStruct = iota // kvc_pool_config
	StructCodec                       // kvc_codec
	StructPolicyConfig                // kvc_policy_config
	StructPrefixConfig                // kvc_prefix_config
	StructStats                       // kvc_stats
	StructPrefixStats                 // kvc_prefix_stats
	StructQuantSizes                  // kvc_quant_sizes
	StructTierConfig                  // kvc_tier_config (of a host tier)
	StructTierStats                   // kvc_tier_stats
)

// InitSized fills the first structSize bytes of buf as the C struct s of a
// caller whose header has that size (an older or a newer one):
// kvc_<thing>_init_sized, the call the Default* functions make with this
// binding's own size. The library's defaults, struct_size = structSize, the
// bytes past the library's own struct zeroed; nothing is written past
// structSize, nor at all on an error. Errors: ERR_BUFFER_TOO_SMALL (buf
// shorter than structSize), ERR_INVALID_ARGUMENT (buf not 8-byte aligned, an
// unknown s), ERR_STRUCT_SIZE (a size below the struct's oldest, ending
// inside a field, or above KVC_STRUCT_SIZE_MAX).
func InitSized(s CStruct, buf []byte, structSize uint64) error {
	var f func([]byte, int64)
	switch s {
	case StructPoolConfig:
		f = native.PoolConfigInit_sized
	case StructCodec:
		f = native.CodecInit_sized
	case StructPolicyConfig:
		f = native.PolicyConfigInit_sized
	case StructPrefixConfig:
		f = native.PrefixConfigInit_sized
	case StructStats:
		f = native.StatsInit_sized
	case StructPrefixStats:
		f = native.PrefixStatsInit_sized
	case StructQuantSizes:
		f = native.QuantSizesInit_sized
	case StructTierConfig:
		f = func(b []byte, n int64) { native.TierConfigInit_sized(b, n, native.TIER_HOST) }
	case StructTierStats:
		f = native.TierStatsInit_sized
	default:
		return &Error{Status: ERR_INVALID_ARGUMENT, Message: "unknown CStruct"}
	}
	// (int64 keeps the bits: size_t in C.)
	return call(func() { f(buf, int64(structSize)) })
}
