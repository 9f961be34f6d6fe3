package kvcache

import "libkvcache.org/kvcache/internal/native"

// TierConfig is kvc_tier_config: one offload tier below a pool with the
// prefix cache (docs/tiers.md). Start from DefaultTierConfig.
type TierConfig struct {
	Kind          TierKind
	Flags         uint32 // TIER_FSYNC (disk), TIER_REDIS_CLUSTER (Redis) or 0
	CapacityBytes uint64 // host and disk: the most bytes the tier holds, > 0
	Path          string // disk: the directory (created if missing)
	Address       string // Redis: "host:port", or seed nodes "host:port,host:port,..."
	TimeoutMs     uint32 // Redis: connect and command timeout (default 1000)
	TtlSeconds    uint64 // Redis: records expire after this many seconds (0: never)
}

// DefaultTierConfig is kvc_tier_config_init's defaults for kind (capacity 0,
// which host and disk tiers must set). An unknown kind is ERR_INVALID_ARGUMENT.
func DefaultTierConfig(kind TierKind) (cfg TierConfig, err error) {
	var n native.TierConfig
	if err = call(func() { n = native.NewTierConfig__SWIG_0(native.Kvc_tier_kind(kind)) }); err != nil {
		return cfg, err
	}
	defer native.DeleteTierConfig(n)
	return TierConfig{
		Kind:          TierKind(n.GetKind()),
		Flags:         uint32(n.GetFlags()),
		CapacityBytes: n.GetCapacity_bytes(),
		TimeoutMs:     uint32(n.GetTimeout_ms()),
		TtlSeconds:    n.GetTtl_seconds(),
	}, nil
}

// TierStats is kvc_tier_stats, the counters of one tier (Pool.TierStats).
type TierStats struct {
	Kind       TierKind
	Bytes      uint64 // held now (Redis: an estimate)
	Entries    uint64 // blocks held now
	Hits       uint64 // reads that returned a block
	Misses     uint64 // reads that found nothing usable
	Demotions  uint64 // blocks written by the offload writer
	Promotions uint64 // blocks loaded from this tier into the pool
	Drops      uint64 // demotions dropped: the writer's queue was full
	Evictions  uint64 // blocks removed for room (LRU)
	Errors     uint64 // failed writes and reads, refused records, connection failures
	Pinned     uint64 // blocks pinned now (PrefixLookup with PREFIX_PIN)
	LastError  string // the reason of the last error, "" if none
}

func tierStatsFrom(n native.TierStats) TierStats {
	defer native.DeleteTierStats(n)
	return TierStats{
		Kind: TierKind(n.GetKind()), Bytes: n.GetBytes(), Entries: n.GetEntries(), Hits: n.GetHits(),
		Misses: n.GetMisses(), Demotions: n.GetDemotions(), Promotions: n.GetPromotions(), Drops: n.GetDrops(),
		Evictions: n.GetEvictions(), Errors: n.GetErrors(), Pinned: n.GetPinned(), LastError: n.GetLast_error(),
	}
}

// AddTier adds an offload tier below the pool (kvc_pool_add_tier, after the
// ones already added) and returns its index (0 for the first).
func (p *Pool) AddTier(cfg TierConfig) (index int, err error) {
	err = p.do(func(h native.Pool) {
		index = int(h.Add_tier(native.Kvc_tier_kind(cfg.Kind), cfg.CapacityBytes, cfg.Path, cfg.Address,
			uint(cfg.Flags), uint(cfg.TimeoutMs), cfg.TtlSeconds))
	})
	return index, err
}

// SetOffload sets the offload writer's queue (blocks) and the load timeout
// in milliseconds (kvc_pool_set_offload; defaults 256 and 10000).
func (p *Pool) SetOffload(queueBlocks, loadTimeoutMs uint32) error {
	return p.do(func(h native.Pool) { h.Set_offload(uint(queueBlocks), uint(loadTimeoutMs)) })
}

// TierStats are the counters of tier index (ERR_OUT_OF_RANGE: no such tier).
func (p *Pool) TierStats(index int) (TierStats, error) {
	if index < 0 || int64(index) > 0xFFFFFFFF {
		return TierStats{}, &Error{Status: ERR_OUT_OF_RANGE, Message: "tier index out of range"}
	}
	var n native.TierStats
	if err := p.do(func(h native.Pool) { n = h.Tier_stats(uint(index)) }); err != nil {
		return TierStats{}, err
	}
	return tierStatsFrom(n), nil
}

// PrefixOffload queues the prompt's blocks registered in the pool for
// writing to every tier; returns the blocks queued (the others: queue full).
func (p *Pool) PrefixOffload(tokens []int32, salt string) (queued uint64, err error) {
	err = p.do(func(h native.Pool) { queued = h.Prefix_offload(tokens, salt) })
	return queued, err
}

// FlushTiers waits until the offload writer has written every queued block.
func (p *Pool) FlushTiers() error {
	return p.do(func(h native.Pool) { h.Flush_tiers() })
}

// PrefixLoad loads the tier blocks that follow the pool's hit of a prompt
// into the pool and waits; returns the tokens loaded. ERR_TIMEOUT: the tiers
// did not answer within the load timeout (nothing loaded).
func (p *Pool) PrefixLoad(tokens []int32, salt string) (loaded uint64, err error) {
	err = p.do(func(h native.Pool) { loaded = h.Prefix_load(tokens, salt) })
	return loaded, err
}

// PrefixPrefetch starts loading as PrefixLoad does and returns at once with
// a ticket for PrefixPoll.
func (p *Pool) PrefixPrefetch(tokens []int32, salt string) (ticket uint64, err error) {
	err = p.do(func(h native.Pool) { ticket = h.Prefix_prefetch(tokens, salt) })
	return ticket, err
}

// PrefixPoll reports a prefetch: done with the tokens loaded (the ticket is
// then forgotten), or not done yet (done false, err nil: poll again). A load
// that timed out is an *Error with ERR_TIMEOUT; an unknown or already
// reported ticket ERR_INVALID_ARGUMENT.
func (p *Pool) PrefixPoll(ticket uint64) (done bool, loaded uint64, err error) {
	var n native.PrefixPoll
	if err = p.do(func(h native.Pool) { n = h.Prefix_poll(ticket) }); err != nil {
		return false, 0, err
	}
	defer native.DeletePrefixPoll(n)
	return n.GetDone(), n.GetLoaded_tokens(), nil
}

// PrefixUnpin releases the pins of a PrefixLookup with PREFIX_PIN (its
// result's Pin); an unknown or already released pin is ERR_INVALID_ARGUMENT.
func (p *Pool) PrefixUnpin(pin uint64) error {
	return p.do(func(h native.Pool) { h.Prefix_unpin(pin) })
}
