package kvcache

import "libkvcache.org/kvcache/internal/native"

// The configuration structs mirror the C structs (kvcache.h documents each
// field). Start from the Default* functions: they hold the library's
// defaults, which the zero values are not.

// PoolConfig is kvc_pool_config.
type PoolConfig struct {
	NumLayers         uint32 // transformer layers, 1..4096
	NumQHeads         uint32 // query heads, a multiple of NumKVHeads
	NumKVHeads        uint32 // KV heads
	HeadDim           uint32 // elements per head, 1..1024
	BlockSize         uint32 // tokens per block (default 16)
	Flags             uint32 // POOL_ZERO_ON_FREE, POOL_PRE_ROPE_KEYS
	NumBlocks         uint64 // capacity in blocks, all layers together (0: CapacityBytes)
	CapacityBytes     uint64 // capacity as a byte budget when NumBlocks is 0
	KDType            DType  // storage of keys (default f16)
	VDType            DType  // storage of values (default f16)
	Layout            Layout
	Device            Device
	DeviceIndex       int32
	ResidualWindow    uint32
	ResidualDType     DType
	ResidualFraction  float64
	NumResidualBlocks uint64
	RopeStyle         RopeStyle
	RopeDims          uint32
	RopeTheta         float64
	ResidualSinks     uint32 // first tokens of each layer kept in ResidualDType once encoded (attention sinks)
	// KCodec and VCodec quantize K and V (nil: plain KDType / VDType storage).
	KCodec, VCodec *Codec
	// LayerKCodecs and LayerVCodecs give each layer its own codecs (mixed
	// precision, kvc_pool_config.layer_k_codecs / layer_v_codecs): nil or
	// empty (every layer KCodec / VCodec), or NumLayers entries, entry i
	// layer i's (a nil entry: KCodec / VCodec; a float DType with
	// SCALE_NONE: plain storage of that dtype); another length is
	// ERR_INVALID_ARGUMENT. In this version every layer quantizes a part or
	// none does, with the same rotation; per-channel scales, head-wise and
	// CUDA pools are refused (docs/codecs.md "Mixed precision per layer").
	LayerKCodecs, LayerVCodecs []*Codec
}

// DefaultPoolConfig is kvc_pool_config_init's defaults; the model's shape
// (NumLayers, NumQHeads, NumKVHeads, HeadDim) and a capacity remain to set.
func DefaultPoolConfig() PoolConfig {
	n := native.NewPoolConfig()
	defer native.DeletePoolConfig(n)
	return poolConfigFrom(n)
}

func poolConfigFrom(n native.PoolConfig) PoolConfig {
	return PoolConfig{
		NumLayers:         uint32(n.GetNum_layers()),
		NumQHeads:         uint32(n.GetNum_q_heads()),
		NumKVHeads:        uint32(n.GetNum_kv_heads()),
		HeadDim:           uint32(n.GetHead_dim()),
		BlockSize:         uint32(n.GetBlock_size()),
		Flags:             uint32(n.GetFlags()),
		NumBlocks:         n.GetNum_blocks(),
		CapacityBytes:     n.GetCapacity_bytes(),
		KDType:            DType(n.GetK_dtype()),
		VDType:            DType(n.GetV_dtype()),
		Layout:            Layout(n.GetLayout()),
		Device:            Device(n.GetDevice()),
		DeviceIndex:       int32(n.GetDevice_index()),
		ResidualWindow:    uint32(n.GetResidual_window()),
		ResidualDType:     DType(n.GetResidual_dtype()),
		ResidualFraction:  n.GetResidual_fraction(),
		NumResidualBlocks: n.GetNum_residual_blocks(),
		RopeStyle:         RopeStyle(n.GetRope_style()),
		RopeDims:          uint32(n.GetRope_dims()),
		RopeTheta:         n.GetRope_theta(),
		ResidualSinks:     uint32(n.GetResidual_sinks()),
	}
}

// native returns a native copy (the codecs aside); the caller deletes it.
func (c *PoolConfig) native() native.PoolConfig {
	n := native.NewPoolConfig()
	n.SetNum_layers(uint(c.NumLayers))
	n.SetNum_q_heads(uint(c.NumQHeads))
	n.SetNum_kv_heads(uint(c.NumKVHeads))
	n.SetHead_dim(uint(c.HeadDim))
	n.SetBlock_size(uint(c.BlockSize))
	n.SetFlags(uint(c.Flags))
	n.SetNum_blocks(c.NumBlocks)
	n.SetCapacity_bytes(c.CapacityBytes)
	n.SetK_dtype(native.Kvc_dtype(c.KDType))
	n.SetV_dtype(native.Kvc_dtype(c.VDType))
	n.SetLayout(native.Kvc_layout(c.Layout))
	n.SetDevice(native.Kvc_device(c.Device))
	n.SetDevice_index(int(c.DeviceIndex))
	n.SetResidual_window(uint(c.ResidualWindow))
	n.SetResidual_dtype(native.Kvc_dtype(c.ResidualDType))
	n.SetResidual_fraction(c.ResidualFraction)
	n.SetNum_residual_blocks(c.NumResidualBlocks)
	n.SetRope_style(native.Kvc_rope_style(c.RopeStyle))
	n.SetRope_dims(uint(c.RopeDims))
	n.SetRope_theta(c.RopeTheta)
	n.SetResidual_sinks(uint(c.ResidualSinks))
	return n
}

// PolicyConfig is kvc_policy_config.
type PolicyConfig struct {
	Kind             PolicyKind
	SinkTokens       uint32  // streaming: attention sinks (default 4)
	BudgetTokens     uint64  // per-layer cap in tokens (0: none)
	CompressionRatio float64 // fraction dropped per Evict, in [0, 1)
	RecentTokens     uint32  // streaming: window when no budget is set
	Window           uint32  // SnapKV / PyramidKV observation window
	RecentFraction   float64 // H2O: share of the budget kept as the recent window
	KernelSize       uint32  // SnapKV / PyramidKV pooling kernel
	Pooling          Pooling
	Schedule         PyramidSchedule
	Beta             float64
	ShiftPositions   bool       // re-rotate keys to positions 0.. after eviction (needs the pool's RoPE)
	AutoEvict        bool       // Reserve first evicts layers over BudgetTokens
	FuturePositions  uint32     // ExpectedAttention: next positions the query rotation is averaged over (default 512)
	HeadBudget       HeadBudget // head-wise pools: a layer's budget split over its KV heads (AdaKV)
	HeadFloor        float64    // HEAD_BUDGET_ADAKV: share of a head's own budget it keeps (default 0.2)
	GateThreshold    float32    // POLICY_DUO_ATTENTION: a head whose gate is below it streams (default 0.5)
	// POLICY_DUO_ATTENTION: the per-head gates in [0, 1], num_layers x num_kv_heads,
	// layer by layer (kvc_policy_config.head_gates; copied by NewPolicy).
	HeadGates []float32
}

// DefaultPolicyConfig is kvc_policy_config_init's defaults (kind none).
func DefaultPolicyConfig() PolicyConfig {
	n := native.NewPolicyConfig()
	defer native.DeletePolicyConfig(n)
	return policyConfigFrom(n)
}

func policyConfigFrom(n native.PolicyConfig) PolicyConfig {
	return PolicyConfig{
		Kind:             PolicyKind(n.GetKind()),
		SinkTokens:       uint32(n.GetSink_tokens()),
		BudgetTokens:     n.GetBudget_tokens(),
		CompressionRatio: n.GetCompression_ratio(),
		RecentTokens:     uint32(n.GetRecent_tokens()),
		Window:           uint32(n.GetWindow()),
		RecentFraction:   n.GetRecent_fraction(),
		KernelSize:       uint32(n.GetKernel_size()),
		Pooling:          Pooling(n.GetPooling()),
		Schedule:         PyramidSchedule(n.GetSchedule()),
		Beta:             n.GetBeta(),
		ShiftPositions:   n.GetShift_positions() != 0,
		AutoEvict:        n.GetAuto_evict() != 0,
		FuturePositions:  uint32(n.GetFuture_positions()),
		HeadBudget:       HeadBudget(n.GetHead_budget()),
		HeadFloor:        n.GetHead_floor(),
		GateThreshold:    n.GetGate_threshold(),
	}
}

func (c *PolicyConfig) native() native.PolicyConfig {
	n := native.NewPolicyConfig()
	n.SetKind(native.Kvc_policy_kind(c.Kind))
	n.SetSink_tokens(uint(c.SinkTokens))
	n.SetBudget_tokens(c.BudgetTokens)
	n.SetCompression_ratio(c.CompressionRatio)
	n.SetRecent_tokens(uint(c.RecentTokens))
	n.SetWindow(uint(c.Window))
	n.SetRecent_fraction(c.RecentFraction)
	n.SetKernel_size(uint(c.KernelSize))
	n.SetPooling(native.Kvc_pooling(c.Pooling))
	n.SetSchedule(native.Kvc_pyramid_schedule(c.Schedule))
	n.SetBeta(c.Beta)
	n.SetShift_positions(boolU(c.ShiftPositions))
	n.SetAuto_evict(boolU(c.AutoEvict))
	n.SetFuture_positions(uint(c.FuturePositions))
	n.SetHead_budget(native.Kvc_head_budget(c.HeadBudget))
	n.SetHead_floor(c.HeadFloor)
	n.SetGate_threshold(c.GateThreshold)
	return n
}

// PrefixConfig is kvc_prefix_config.
type PrefixConfig struct {
	Hash         PrefixHash
	VerifyTokens bool      // compare token ids on every hit (default true)
	Seed         *[32]byte // nil (default): a random root seed per pool
	ModelID      string    // mixed into the root key
	TokenizerID  string    // mixed into the root key
	// ExtraKeyNames are the names of the extra keys ("salt", "adapter",
	// "media"...; docs/prefix-cache.md): the ...Named methods then take the
	// values by name. nil: positional extra keys (the salt string).
	ExtraKeyNames []string
}

// DefaultPrefixConfig is kvc_prefix_config_init's defaults.
func DefaultPrefixConfig() PrefixConfig {
	n := native.NewPrefixConfig()
	defer native.DeletePrefixConfig(n)
	return PrefixConfig{
		Hash:         PrefixHash(n.GetHash()),
		VerifyTokens: n.GetVerify_tokens() != 0,
	}
}

func (c *PrefixConfig) native() native.PrefixConfig {
	n := native.NewPrefixConfig()
	n.SetHash(native.Kvc_prefix_hash(c.Hash))
	n.SetVerify_tokens(boolU(c.VerifyTokens))
	if c.Seed != nil {
		n.Set_seed(c.Seed[:]) // copies the 32 bytes, sets seed_set
	}
	return n
}

// Codec is kvc_codec, a quantizer: of a pool's K or V (PoolConfig.KCodec,
// VCodec) or standalone (Quantize, Dequantize).
type Codec struct {
	DType         DType // storage dtype (default int8)
	Granularity   Granularity
	GroupSize     uint32
	Asymmetric    bool // zero points (integer dtypes)
	ScaleDType    DType
	Rotation      Rotation
	RotationBlock uint32
	StaticScale   bool    // use Scale as a calibrated per-tensor scale
	Scale         float64 // with StaticScale
	FullRange     bool    // symmetric integer codes use all 2^bits values (llama.cpp q4_0's rule)
	Outliers      uint32  // values per scale group kept apart as (index, int8 code) pairs (pools only)
}

// DefaultCodec is kvc_codec_init's defaults: int8, one f32 scale per token.
func DefaultCodec() Codec {
	n := native.NewCodec()
	defer native.DeleteCodec(n)
	return codecFrom(n)
}

func codecFrom(n native.Codec) Codec {
	return Codec{
		DType:         DType(n.GetDtype()),
		Granularity:   Granularity(n.GetGranularity()),
		GroupSize:     uint32(n.GetGroup_size()),
		Asymmetric:    n.GetAsymmetric() != 0,
		ScaleDType:    DType(n.GetScale_dtype()),
		Rotation:      Rotation(n.GetRotation()),
		RotationBlock: uint32(n.GetRotation_block()),
		StaticScale:   n.GetStatic_scale() != 0,
		Scale:         n.GetScale(),
		FullRange:     n.GetFull_range() != 0,
		Outliers:      uint32(n.GetOutliers()),
	}
}

func (c *Codec) native() native.Codec {
	n := native.NewCodec()
	n.SetDtype(native.Kvc_dtype(c.DType))
	n.SetGranularity(native.Kvc_granularity(c.Granularity))
	n.SetGroup_size(uint(c.GroupSize))
	n.SetAsymmetric(boolU(c.Asymmetric))
	n.SetScale_dtype(native.Kvc_dtype(c.ScaleDType))
	n.SetRotation(native.Kvc_rotation(c.Rotation))
	n.SetRotation_block(uint(c.RotationBlock))
	n.SetStatic_scale(boolU(c.StaticScale))
	n.SetScale(c.Scale)
	n.SetFull_range(boolU(c.FullRange))
	n.SetOutliers(uint(c.Outliers))
	return n
}

// Stats is kvc_stats (Pool.Stats).
type Stats struct {
	BlocksTotal, BlocksFree, BlocksCached, BlocksUsed, BlocksShared      uint64
	BytesPerBlock, BytesPerToken, BytesTotal, BytesInUse, PeakBytesInUse uint64
	NumSequences                                                         uint64
	ResidualBlocksTotal, ResidualBlocksUsed, ResidualBytesPerBlock       uint64
	TokensStored                                                         uint64
}

func statsFrom(n native.Stats) Stats {
	defer native.DeleteStats(n)
	return Stats{
		BlocksTotal: n.GetBlocks_total(), BlocksFree: n.GetBlocks_free(), BlocksCached: n.GetBlocks_cached(),
		BlocksUsed: n.GetBlocks_used(), BlocksShared: n.GetBlocks_shared(),
		BytesPerBlock: n.GetBytes_per_block(), BytesPerToken: n.GetBytes_per_token(),
		BytesTotal: n.GetBytes_total(), BytesInUse: n.GetBytes_in_use(), PeakBytesInUse: n.GetPeak_bytes_in_use(),
		NumSequences:        n.GetNum_sequences(),
		ResidualBlocksTotal: n.GetResidual_blocks_total(), ResidualBlocksUsed: n.GetResidual_blocks_used(),
		ResidualBytesPerBlock: n.GetResidual_bytes_per_block(),
		TokensStored:          n.GetTokens_stored(),
	}
}

// PrefixResult is kvc_prefix_result (PrefixLookup, PrefixAttach).
type PrefixResult struct {
	HitTokens     uint64 // leading tokens reusable as whole cached blocks (a multiple of the block size)
	HitBlocks     uint64
	PartialTokens uint64 // with PREFIX_PARTIAL
	TierTokens    uint64 // lookups of a pool with offload tiers: whole-block tokens after HitTokens the tiers hold
	Pin           uint64 // with PREFIX_PIN: the pin handle (0: nothing pinned)
}

func prefixResultFrom(n native.PrefixResult) PrefixResult {
	defer native.DeletePrefixResult(n)
	return PrefixResult{HitTokens: n.GetHit_tokens(), HitBlocks: n.GetHit_blocks(), PartialTokens: n.GetPartial_tokens(),
		TierTokens: n.GetTier_tokens(), Pin: n.GetPin()}
}

// PrefixStats is kvc_prefix_stats.
type PrefixStats struct {
	QueriedTokens, HitTokens, PartialTokens               uint64
	RegisteredBlocks, ReclaimableBlocks, ReferencedBlocks uint64
	StoredTotal, RemovedTotal, ReclaimedTotal             uint64
}

func prefixStatsFrom(n native.PrefixStats) PrefixStats {
	defer native.DeletePrefixStats(n)
	return PrefixStats{
		QueriedTokens: n.GetQueried_tokens(), HitTokens: n.GetHit_tokens(), PartialTokens: n.GetPartial_tokens(),
		RegisteredBlocks: n.GetRegistered_blocks(), ReclaimableBlocks: n.GetReclaimable_blocks(),
		ReferencedBlocks: n.GetReferenced_blocks(),
		StoredTotal:      n.GetStored_total(), RemovedTotal: n.GetRemoved_total(), ReclaimedTotal: n.GetReclaimed_total(),
	}
}

// QuantSizes is kvc_quant_sizes: the buffers Codec.Quantize needs.
type QuantSizes struct {
	CodesBytes, ScalesBytes, ZerosBytes, NumScales uint64
}

func quantSizesFrom(n native.QuantSizes) QuantSizes {
	defer native.DeleteQuantSizes(n)
	return QuantSizes{CodesBytes: n.GetCodes_bytes(), ScalesBytes: n.GetScales_bytes(),
		ZerosBytes: n.GetZeros_bytes(), NumScales: n.GetNum_scales()}
}

func boolU(b bool) uint {
	if b {
		return 1
	}
	return 0
}
