package kvcache

import (
	"reflect"
	"strings"
	"testing"

	"libkvcache.org/kvcache/internal/native"
)

// The Go constants equal the library's (read through the SWIG module).
func TestNativeConstants(t *testing.T) {
	pairs := []struct {
		name      string
		got, want int64
	}{
		{"OK", int64(OK), int64(native.OK)},
		{"ERR_INVALID_ARGUMENT", int64(ERR_INVALID_ARGUMENT), int64(native.ERR_INVALID_ARGUMENT)},
		{"ERR_NULL_POINTER", int64(ERR_NULL_POINTER), int64(native.ERR_NULL_POINTER)},
		{"ERR_STRUCT_SIZE", int64(ERR_STRUCT_SIZE), int64(native.ERR_STRUCT_SIZE)},
		{"ERR_UNSUPPORTED", int64(ERR_UNSUPPORTED), int64(native.ERR_UNSUPPORTED)},
		{"ERR_OVERFLOW", int64(ERR_OVERFLOW), int64(native.ERR_OVERFLOW)},
		{"ERR_OUT_OF_MEMORY", int64(ERR_OUT_OF_MEMORY), int64(native.ERR_OUT_OF_MEMORY)},
		{"ERR_POOL_EXHAUSTED", int64(ERR_POOL_EXHAUSTED), int64(native.ERR_POOL_EXHAUSTED)},
		{"ERR_SEQ_NOT_FOUND", int64(ERR_SEQ_NOT_FOUND), int64(native.ERR_SEQ_NOT_FOUND)},
		{"ERR_SEQ_EXISTS", int64(ERR_SEQ_EXISTS), int64(native.ERR_SEQ_EXISTS)},
		{"ERR_OUT_OF_RANGE", int64(ERR_OUT_OF_RANGE), int64(native.ERR_OUT_OF_RANGE)},
		{"ERR_NOT_RESERVED", int64(ERR_NOT_RESERVED), int64(native.ERR_NOT_RESERVED)},
		{"ERR_BUFFER_TOO_SMALL", int64(ERR_BUFFER_TOO_SMALL), int64(native.ERR_BUFFER_TOO_SMALL)},
		{"ERR_DEVICE_UNAVAILABLE", int64(ERR_DEVICE_UNAVAILABLE), int64(native.ERR_DEVICE_UNAVAILABLE)},
		{"ERR_VERSION", int64(ERR_VERSION), int64(native.ERR_VERSION)},
		{"ERR_INVALID_SCALE", int64(ERR_INVALID_SCALE), int64(native.ERR_INVALID_SCALE)},
		{"ERR_NON_FINITE", int64(ERR_NON_FINITE), int64(native.ERR_NON_FINITE)},
		{"ERR_INTERNAL", int64(ERR_INTERNAL), int64(native.ERR_INTERNAL)},
		{"ERR_INCOMPATIBLE", int64(ERR_INCOMPATIBLE), int64(native.ERR_INCOMPATIBLE)},
		{"ERR_CORRUPT", int64(ERR_CORRUPT), int64(native.ERR_CORRUPT)},
		{"ERR_IO", int64(ERR_IO), int64(native.ERR_IO)},
		{"ERR_PENDING", int64(ERR_PENDING), int64(native.ERR_PENDING)},
		{"ERR_TIMEOUT", int64(ERR_TIMEOUT), int64(native.ERR_TIMEOUT)},
		{"ERR_EXCEEDS_CAPACITY", int64(ERR_EXCEEDS_CAPACITY), int64(native.ERR_EXCEEDS_CAPACITY)},
		{"DTYPE_F32", int64(DTYPE_F32), int64(native.DTYPE_F32)},
		{"DTYPE_F16", int64(DTYPE_F16), int64(native.DTYPE_F16)},
		{"DTYPE_BF16", int64(DTYPE_BF16), int64(native.DTYPE_BF16)},
		{"DTYPE_FP8_E4M3", int64(DTYPE_FP8_E4M3), int64(native.DTYPE_FP8_E4M3)},
		{"DTYPE_FP8_E5M2", int64(DTYPE_FP8_E5M2), int64(native.DTYPE_FP8_E5M2)},
		{"DTYPE_INT8", int64(DTYPE_INT8), int64(native.DTYPE_INT8)},
		{"DTYPE_INT4", int64(DTYPE_INT4), int64(native.DTYPE_INT4)},
		{"DTYPE_INT2", int64(DTYPE_INT2), int64(native.DTYPE_INT2)},
		{"DTYPE_INT3", int64(DTYPE_INT3), int64(native.DTYPE_INT3)},
		{"DEVICE_CPU", int64(DEVICE_CPU), int64(native.DEVICE_CPU)},
		{"DEVICE_CUDA", int64(DEVICE_CUDA), int64(native.DEVICE_CUDA)},
		{"LAYOUT_NHD", int64(LAYOUT_NHD), int64(native.LAYOUT_NHD)},
		{"LAYOUT_HND", int64(LAYOUT_HND), int64(native.LAYOUT_HND)},
		{"SCALE_NONE", int64(SCALE_NONE), int64(native.SCALE_NONE)},
		{"SCALE_PER_TENSOR", int64(SCALE_PER_TENSOR), int64(native.SCALE_PER_TENSOR)},
		{"SCALE_PER_TOKEN", int64(SCALE_PER_TOKEN), int64(native.SCALE_PER_TOKEN)},
		{"SCALE_PER_GROUP", int64(SCALE_PER_GROUP), int64(native.SCALE_PER_GROUP)},
		{"SCALE_PER_CHANNEL", int64(SCALE_PER_CHANNEL), int64(native.SCALE_PER_CHANNEL)},
		{"ROTATION_NONE", int64(ROTATION_NONE), int64(native.ROTATION_NONE)},
		{"ROTATION_HADAMARD", int64(ROTATION_HADAMARD), int64(native.ROTATION_HADAMARD)},
		{"ROPE_NONE", int64(ROPE_NONE), int64(native.ROPE_NONE)},
		{"ROPE_INTERLEAVED", int64(ROPE_INTERLEAVED), int64(native.ROPE_INTERLEAVED)},
		{"ROPE_NEOX", int64(ROPE_NEOX), int64(native.ROPE_NEOX)},
		{"POLICY_NONE", int64(POLICY_NONE), int64(native.POLICY_NONE)},
		{"POLICY_STREAMING", int64(POLICY_STREAMING), int64(native.POLICY_STREAMING)},
		{"POLICY_H2O", int64(POLICY_H2O), int64(native.POLICY_H2O)},
		{"POLICY_SNAPKV", int64(POLICY_SNAPKV), int64(native.POLICY_SNAPKV)},
		{"POLICY_PYRAMIDKV", int64(POLICY_PYRAMIDKV), int64(native.POLICY_PYRAMIDKV)},
		{"POLICY_TOVA", int64(POLICY_TOVA), int64(native.POLICY_TOVA)},
		{"POLICY_PLUGIN", int64(POLICY_PLUGIN), int64(native.POLICY_PLUGIN)},
		{"POLICY_KNORM", int64(POLICY_KNORM), int64(native.POLICY_KNORM)},
		{"POLICY_EXPECTED_ATTENTION", int64(POLICY_EXPECTED_ATTENTION), int64(native.POLICY_EXPECTED_ATTENTION)},
		{"POLICY_KVZIP", int64(POLICY_KVZIP), int64(native.POLICY_KVZIP)},
		{"POLICY_DUO_ATTENTION", int64(POLICY_DUO_ATTENTION), int64(native.POLICY_DUO_ATTENTION)},
		{"POOLING_MAX", int64(POOLING_MAX), int64(native.POOLING_MAX)},
		{"POOLING_AVG", int64(POOLING_AVG), int64(native.POOLING_AVG)},
		{"PYRAMID_PAPER", int64(PYRAMID_PAPER), int64(native.PYRAMID_PAPER)},
		{"PYRAMID_LINEAR", int64(PYRAMID_LINEAR), int64(native.PYRAMID_LINEAR)},
		{"PREFIX_HASH_SHA256", int64(PREFIX_HASH_SHA256), int64(native.PREFIX_HASH_SHA256)},
		{"PREFIX_HASH_XXH3_128", int64(PREFIX_HASH_XXH3_128), int64(native.PREFIX_HASH_XXH3_128)},
		{"POOL_ZERO_ON_FREE", int64(POOL_ZERO_ON_FREE), int64(native.POOL_ZERO_ON_FREE)},
		{"POOL_PRE_ROPE_KEYS", int64(POOL_PRE_ROPE_KEYS), int64(native.POOL_PRE_ROPE_KEYS)},
		{"POOL_HEADWISE", int64(POOL_HEADWISE), int64(native.POOL_HEADWISE)},
		{"HEAD_BUDGET_UNIFORM", int64(HEAD_BUDGET_UNIFORM), int64(native.HEAD_BUDGET_UNIFORM)},
		{"HEAD_BUDGET_ADAKV", int64(HEAD_BUDGET_ADAKV), int64(native.HEAD_BUDGET_ADAKV)},
		{"PREFIX_PARTIAL", int64(PREFIX_PARTIAL), int64(native.PREFIX_PARTIAL)},
		{"PREFIX_PIN", int64(PREFIX_PIN), int64(native.PREFIX_PIN)},
		{"TIER_HOST", int64(TIER_HOST), int64(native.TIER_HOST)},
		{"TIER_DISK", int64(TIER_DISK), int64(native.TIER_DISK)},
		{"TIER_REDIS", int64(TIER_REDIS), int64(native.TIER_REDIS)},
		{"TIER_FSYNC", int64(TIER_FSYNC), int64(native.TIER_FSYNC)},
		{"TIER_REDIS_CLUSTER", int64(TIER_REDIS_CLUSTER), int64(native.TIER_REDIS_CLUSTER)},
	}
	for _, p := range pairs {
		if p.got != p.want {
			t.Errorf("%s = %d, the library's is %d", p.name, p.got, p.want)
		}
	}
}

// normalize: "num_kv_heads" and "NumKVHeads" both give "numkvheads".
func normalize(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }

// Every field SWIG wraps (a GetX method of the native interface) has a Go
// field of the same name, so a field added to the header is not dropped.
func TestNativeFieldsCovered(t *testing.T) {
	cases := []struct {
		native reflect.Type
		goType reflect.Type
		skip   []string // fields set another way or not exposed
	}{
		{reflect.TypeOf((*native.PoolConfig)(nil)).Elem(), reflect.TypeOf(PoolConfig{}), nil},
		// DuoAttention's gates: a C array kvc_policy_create copies; not exposed in Go yet.
		{reflect.TypeOf((*native.PolicyConfig)(nil)).Elem(), reflect.TypeOf(PolicyConfig{}), []string{"headgates", "numheadgates"}},
		{reflect.TypeOf((*native.PrefixConfig)(nil)).Elem(), reflect.TypeOf(PrefixConfig{}), []string{"seedset"}},
		{reflect.TypeOf((*native.Codec)(nil)).Elem(), reflect.TypeOf(Codec{}), nil},
		{reflect.TypeOf((*native.Stats)(nil)).Elem(), reflect.TypeOf(Stats{}), nil},
		{reflect.TypeOf((*native.PrefixResult)(nil)).Elem(), reflect.TypeOf(PrefixResult{}), nil},
		{reflect.TypeOf((*native.PrefixStats)(nil)).Elem(), reflect.TypeOf(PrefixStats{}), nil},
		{reflect.TypeOf((*native.QuantSizes)(nil)).Elem(), reflect.TypeOf(QuantSizes{}), nil},
		{reflect.TypeOf((*native.TierConfig)(nil)).Elem(), reflect.TypeOf(TierConfig{}), []string{"reserved"}},
		{reflect.TypeOf((*native.TierStats)(nil)).Elem(), reflect.TypeOf(TierStats{}), []string{"reserved"}},
	}
	for _, c := range cases {
		fields := map[string]bool{}
		for i := 0; i < c.goType.NumField(); i++ {
			fields[normalize(c.goType.Field(i).Name)] = true
		}
		for _, s := range c.skip {
			fields[s] = true
		}
		for i := 0; i < c.native.NumMethod(); i++ {
			m := c.native.Method(i).Name
			if !strings.HasPrefix(m, "Get") || m == "GetStruct_size" {
				continue
			}
			if name := normalize(strings.TrimPrefix(m, "Get")); !fields[name] {
				t.Errorf("%s: native field %s has no Go field", c.goType.Name(), name)
			}
		}
	}
}

// fillDistinct sets every field of a config struct to a distinct non-zero value.
func fillDistinct(v reflect.Value) {
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Uint32, reflect.Uint64:
			f.SetUint(uint64(3 + i))
		case reflect.Int32:
			f.SetInt(int64(1 + i%2))
		case reflect.Float64:
			f.SetFloat(0.25 * float64(i+1))
		case reflect.Bool:
			f.SetBool(true)
		}
	}
}

// Go -> native -> Go keeps every field (the hand-written copies are complete).
func TestNativeConfigRoundTrip(t *testing.T) {
	var pc PoolConfig
	fillDistinct(reflect.ValueOf(&pc).Elem())
	n := pc.native()
	back := poolConfigFrom(n)
	native.DeletePoolConfig(n)
	if !reflect.DeepEqual(pc, back) {
		t.Errorf("PoolConfig:\n %+v\n %+v", pc, back)
	}
	var pol PolicyConfig
	fillDistinct(reflect.ValueOf(&pol).Elem())
	np := pol.native()
	backPol := policyConfigFrom(np)
	native.DeletePolicyConfig(np)
	if !reflect.DeepEqual(pol, backPol) {
		t.Errorf("PolicyConfig:\n %+v\n %+v", pol, backPol)
	}
	var c Codec
	fillDistinct(reflect.ValueOf(&c).Elem())
	nc := c.native()
	backC := codecFrom(nc)
	native.DeleteCodec(nc)
	if !reflect.DeepEqual(c, backC) {
		t.Errorf("Codec:\n %+v\n %+v", c, backC)
	}
}
