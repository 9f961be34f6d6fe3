package kvcache

import "libkvcache.org/kvcache/internal/native"

// Status is a libkvcache status code (kvc_status). It is an error too, so
// errors.Is(err, ERR_POOL_EXHAUSTED) tests a failure's status.
type Status int32

// String is the status's name, e.g. "KVC_ERR_POOL_EXHAUSTED".
func (s Status) String() string { return native.Status_name(int(s)) }

// Error is the status's name.
func (s Status) Error() string { return s.String() }

// Status codes (kvc_status without the KVC_ prefix).
const (
	OK                     Status = 0
	ERR_INVALID_ARGUMENT   Status = 1
	ERR_NULL_POINTER       Status = 2
	ERR_STRUCT_SIZE        Status = 3
	ERR_UNSUPPORTED        Status = 4
	ERR_OVERFLOW           Status = 5
	ERR_OUT_OF_MEMORY      Status = 6
	ERR_POOL_EXHAUSTED     Status = 7
	ERR_SEQ_NOT_FOUND      Status = 8
	ERR_SEQ_EXISTS         Status = 9
	ERR_OUT_OF_RANGE       Status = 10
	ERR_NOT_RESERVED       Status = 11
	ERR_BUFFER_TOO_SMALL   Status = 12
	ERR_DEVICE_UNAVAILABLE Status = 13
	ERR_VERSION            Status = 14
	ERR_INVALID_SCALE      Status = 15
	ERR_NON_FINITE         Status = 16
	ERR_INTERNAL           Status = 17
	ERR_INCOMPATIBLE       Status = 18
	ERR_CORRUPT            Status = 19
	ERR_IO                 Status = 20
	ERR_PENDING            Status = 21
	ERR_TIMEOUT            Status = 22
	// ERR_EXCEEDS_CAPACITY: the request never fits, even in an empty pool
	// (ERR_POOL_EXHAUSTED: not now).
	ERR_EXCEEDS_CAPACITY Status = 23
)

// DType is an element type (kvc_dtype).
type DType int32

const (
	DTYPE_F32      DType = 0
	DTYPE_F16      DType = 1
	DTYPE_BF16     DType = 2
	DTYPE_FP8_E4M3 DType = 3
	DTYPE_FP8_E5M2 DType = 4
	DTYPE_INT8     DType = 5
	DTYPE_INT4     DType = 6
	DTYPE_INT2     DType = 7
	DTYPE_INT3     DType = 8
)

// Device is where a pool's blocks live (kvc_device).
type Device int32

const (
	DEVICE_CPU  Device = 0
	DEVICE_CUDA Device = 1
)

// Layout is the order inside a block (kvc_layout).
type Layout int32

const (
	LAYOUT_NHD Layout = 0
	LAYOUT_HND Layout = 1
)

// Granularity is what one quantization scale covers (kvc_granularity).
type Granularity int32

const (
	SCALE_NONE        Granularity = 0
	SCALE_PER_TENSOR  Granularity = 1
	SCALE_PER_TOKEN   Granularity = 2
	SCALE_PER_GROUP   Granularity = 3
	SCALE_PER_CHANNEL Granularity = 4
)

// Rotation is a codec's rotation before quantizing (kvc_rotation).
type Rotation int32

const (
	ROTATION_NONE     Rotation = 0
	ROTATION_HADAMARD Rotation = 1
)

// RopeStyle is the RoPE the engine applied to keys (kvc_rope_style).
type RopeStyle int32

const (
	ROPE_NONE        RopeStyle = 0
	ROPE_INTERLEAVED RopeStyle = 1
	ROPE_NEOX        RopeStyle = 2
)

// PolicyKind is an eviction policy family (kvc_policy_kind).
type PolicyKind int32

const (
	POLICY_NONE               PolicyKind = 0
	POLICY_STREAMING          PolicyKind = 1
	POLICY_H2O                PolicyKind = 2
	POLICY_SNAPKV             PolicyKind = 3
	POLICY_PYRAMIDKV          PolicyKind = 4
	POLICY_TOVA               PolicyKind = 5
	POLICY_PLUGIN             PolicyKind = 6
	POLICY_KNORM              PolicyKind = 7
	POLICY_EXPECTED_ATTENTION PolicyKind = 8
	POLICY_KVZIP              PolicyKind = 9
	POLICY_DUO_ATTENTION      PolicyKind = 10
)

// HeadBudget is how a head-wise pool splits a layer's budget over its KV heads (kvc_head_budget).
type HeadBudget int32

const (
	HEAD_BUDGET_UNIFORM HeadBudget = 0
	HEAD_BUDGET_ADAKV   HeadBudget = 1
)

// Pooling is SnapKV's pooling along the tokens (kvc_pooling).
type Pooling int32

const (
	POOLING_MAX Pooling = 0
	POOLING_AVG Pooling = 1
)

// PyramidSchedule is PyramidKV's per-layer budget schedule (kvc_pyramid_schedule).
type PyramidSchedule int32

const (
	PYRAMID_PAPER  PyramidSchedule = 0
	PYRAMID_LINEAR PyramidSchedule = 1
)

// PrefixHash is the prefix cache's key hash (kvc_prefix_hash).
type PrefixHash int32

const (
	PREFIX_HASH_SHA256   PrefixHash = 0
	PREFIX_HASH_XXH3_128 PrefixHash = 1
)

// TierKind is the kind of an offload tier (kvc_tier_kind).
type TierKind int32

const (
	TIER_HOST  TierKind = 0
	TIER_DISK  TierKind = 1
	TIER_REDIS TierKind = 2
)

// Flags.
const (
	// POOL_ZERO_ON_FREE (PoolConfig.Flags): zero blocks when they are freed.
	POOL_ZERO_ON_FREE uint32 = 0x1
	// POOL_PRE_ROPE_KEYS (PoolConfig.Flags): quantize keys before RoPE (needs the RoPE settings and a key codec).
	POOL_PRE_ROPE_KEYS uint32 = 0x2
	// POOL_HEADWISE (PoolConfig.Flags): a block table per (layer, KV head), so head-wise eviction frees memory.
	POOL_HEADWISE uint32 = 0x4
	// PREFIX_PARTIAL (PrefixLookup / PrefixAttach flags): also reuse a partly matching next block.
	PREFIX_PARTIAL uint32 = 0x1
	// PREFIX_PIN (PrefixLookup flags): pin the tier blocks counted in TierTokens until PrefixUnpin.
	PREFIX_PIN uint32 = 0x2
	// TIER_FSYNC (TierConfig.Flags, disk): fsync every record before it is visible.
	TIER_FSYNC uint32 = 0x1
	// TIER_REDIS_CLUSTER (TierConfig.Flags, Redis): Address lists seed nodes of a Redis Cluster.
	TIER_REDIS_CLUSTER uint32 = 0x2
	// LLAMA_ATTN_ROT (ImportLlama / ExportLlama flags): quantized K / V in llama.cpp's Hadamard-rotated space.
	LLAMA_ATTN_ROT uint32 = 0x1
	// LLAMA_V_TRANS (ExportLlama flags): V transposed, as llama.cpp without flash attention stores it.
	LLAMA_V_TRANS uint32 = 0x2
)

// STORE_KEY_MAX is the longest Store key or scope in bytes (KVC_STORE_KEY_MAX).
const STORE_KEY_MAX = 4096

// LlamaType is a ggml type of K / V in a llama.cpp sequence state blob (kvc_llama_type).
type LlamaType int32

const (
	LLAMA_F32  LlamaType = 0
	LLAMA_F16  LlamaType = 1
	LLAMA_Q8_0 LlamaType = 8
)
