package kvcache

import (
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

// int8 per token: quantize, dequantize, every value within half a step (scale / 2) of its input.
func TestCodecInt8PerToken(t *testing.T) {
	const rows, d = 32, headDim
	c := DefaultCodec()
	if c.DType != DTYPE_INT8 || c.Granularity != SCALE_PER_TOKEN || c.ScaleDType != DTYPE_F32 {
		t.Fatalf("defaults %+v", c)
	}
	s := must1[QuantSizes](t)(c.Sizes(rows, d))
	if s.CodesBytes != rows*d || s.ScalesBytes != rows*4 || s.ZerosBytes != 0 {
		t.Fatalf("sizes %+v", s)
	}
	src := random(rows*d, 500)
	codes, scales := make([]byte, s.CodesBytes), make([]byte, s.ScalesBytes)
	if n := must1[uint64](t)(c.Quantize(src, d, codes, scales, nil)); n != rows {
		t.Fatalf("Quantize = %d", n)
	}
	dst := make([]float32, rows*d)
	must(t, c.Dequantize(codes, scales, nil, rows, d, dst))
	for r := 0; r < rows; r++ {
		scale := math.Float32frombits(binary.LittleEndian.Uint32(scales[4*r:]))
		if !(scale > 0) {
			t.Fatalf("row %d scale %v", r, scale)
		}
		for j := 0; j < d; j++ {
			i := r*d + j
			if math.Abs(float64(dst[i]-src[i])) > float64(scale)/2*1.0001 {
				t.Fatalf("row %d col %d: %v -> %v, scale %v", r, j, src[i], dst[i], scale)
			}
			if q := math.Round(float64(src[i] / scale)); math.Abs(q-float64(int8(codes[i]))) > 1 {
				t.Fatalf("row %d col %d: code %d, x/scale %v", r, j, int8(codes[i]), src[i]/scale)
			}
		}
	}
}

// A second call path: a pool whose K and V codec is the same int8 codec stores
// its [token][kv head] rows of head_dim as the standalone quantizer does.
func TestCodecPoolMatchesStandalone(t *testing.T) {
	const n = 16
	c := DefaultCodec()
	cfg := testConfig()
	cfg.KCodec, cfg.VCodec = &c, &c
	p := newTestPool(t, cfg)
	k, v := random(n*row, 600), random(n*row, 601)
	must(t, p.SeqCreate(1))
	must(t, p.Reserve(1, n))
	must1[uint64](t)(p.Append(1, 0, 0, k, v))
	ko, vo := make([]float32, n*row), make([]float32, n*row)
	must1[uint64](t)(p.Gather(1, 0, 0, ko, vo))
	s := must1[QuantSizes](t)(c.Sizes(n*kvHeads, headDim))
	for _, pair := range [][2][]float32{{k, ko}, {v, vo}} {
		codes, scales := make([]byte, s.CodesBytes), make([]byte, s.ScalesBytes)
		must1[uint64](t)(c.Quantize(pair[0], headDim, codes, scales, nil))
		want := make([]float32, n*row)
		must(t, c.Dequantize(codes, scales, nil, n*kvHeads, headDim, want))
		if !reflect.DeepEqual(want, pair[1]) {
			t.Fatal("the pool's int8 K/V differ from the standalone quantizer's")
		}
	}
}

func TestCodecShortBuffers(t *testing.T) {
	c := DefaultCodec()
	_, err := c.Quantize(random(64, 1), 64, make([]byte, 63), make([]byte, 4), nil)
	var e *Error
	if !errors.As(err, &e) || e.Status != ERR_BUFFER_TOO_SMALL {
		t.Fatalf("err = %v", err)
	}
}

// Per-channel key smoothing (Pool.SetKeySmoothing): the pool's keys are the
// standalone quantizer's codes of (k - offset) / scale, decoded and
// un-smoothed; a pool holding a sequence refuses a new smoothing.
func TestCodecKeySmoothing(t *testing.T) {
	const n = 16
	c := DefaultCodec()
	cfg := testConfig()
	cfg.KCodec = &c
	p := newTestPool(t, cfg)
	scale, offset := make([]float32, layers*row), make([]float32, layers*row)
	for i := range scale {
		scale[i] = 0.5 + float32(i%7)
		offset[i] = float32(i%5) - 2
	}
	must(t, p.SetKeySmoothing(scale, offset))
	k, v := random(n*row, 610), random(n*row, 611)
	must(t, p.SeqCreate(1))
	must(t, p.Reserve(1, n))
	must1[uint64](t)(p.Append(1, 1, 0, k, v))
	ko := make([]float32, n*row)
	must1[uint64](t)(p.Gather(1, 1, 0, ko, nil))
	y := make([]float32, n*row)
	for i := range y {
		y[i] = (k[i] - offset[row+i%row]) / scale[row+i%row]
	}
	s := must1[QuantSizes](t)(c.Sizes(n*kvHeads, headDim))
	codes, scales := make([]byte, s.CodesBytes), make([]byte, s.ScalesBytes)
	must1[uint64](t)(c.Quantize(y, headDim, codes, scales, nil))
	dec := make([]float32, n*row)
	must(t, c.Dequantize(codes, scales, nil, n*kvHeads, headDim, dec))
	for i := range dec {
		want := dec[i]*scale[row+i%row] + offset[row+i%row]
		if d := float64(ko[i] - want); d > 1e-5 || d < -1e-5 {
			t.Fatalf("key %d: %v, want %v", i, ko[i], want)
		}
	}
	var e *Error
	if err := p.SetKeySmoothing(scale, nil); !errors.As(err, &e) || e.Status != ERR_INVALID_ARGUMENT {
		t.Fatalf("a pool with a sequence: %v", err)
	}
	if err := p.SetKeySmoothing(scale[:3], nil); !errors.As(err, &e) || e.Status != ERR_INVALID_ARGUMENT {
		t.Fatalf("a short scale: %v", err)
	}
}

// Codec outliers (Codec.Outliers): a spike per head no longer stretches the
// other values' step in a pool; the standalone quantizer refuses the codec.
func TestCodecOutliers(t *testing.T) {
	const n = 8
	k := random(n*row, 620)
	for i := 0; i < n*kvHeads; i++ {
		k[i*headDim+5] = 40
	}
	var errs [2]float64
	for j, outl := range []uint32{0, 2} {
		c := DefaultCodec()
		c.DType, c.Outliers = DTYPE_INT4, outl
		cfg := testConfig()
		cfg.KCodec = &c
		p := newTestPool(t, cfg)
		must(t, p.SeqCreate(1))
		must(t, p.Reserve(1, n))
		must1[uint64](t)(p.Append(1, 0, 0, k, k))
		ko := make([]float32, n*row)
		must1[uint64](t)(p.Gather(1, 0, 0, ko, nil))
		for i := range ko {
			if i%headDim != 5 {
				errs[j] = math.Max(errs[j], math.Abs(float64(ko[i]-k[i])))
			}
		}
	}
	if errs[1]*5 >= errs[0] {
		t.Fatalf("outliers did not shrink the other values' error: %v", errs)
	}
	c := DefaultCodec()
	c.DType, c.Outliers = DTYPE_INT4, 1
	_, err := c.Sizes(2, 64)
	var e *Error
	if !errors.As(err, &e) || e.Status != ERR_UNSUPPORTED {
		t.Fatalf("the standalone quantizer with outliers: %v", err)
	}
}

// codebookGroup is the codebook rule for one group of values: each value's
// code is the level nearest to x / e (e the group's signed extreme), and the
// scale keeps the group's L2 norm; decoded into out.
func codebookGroup(x []float32, lv []float32, out []float32) {
	var e, a float32
	for _, xi := range x {
		if float32(math.Abs(float64(xi))) > a {
			a, e = float32(math.Abs(float64(xi))), xi
		}
	}
	var inv float32
	if e != 0 {
		inv = 1 / e
	}
	code := make([]int, len(x))
	var xx, cc float64
	for j, xi := range x {
		y := xi * inv
		c := 0
		for i := 0; i+1 < len(lv); i++ {
			if y > (lv[i]+lv[i+1])*0.5 {
				c++
			}
		}
		code[j] = c
		xx += float64(xi) * float64(xi)
		cc += float64(lv[c]) * float64(lv[c])
	}
	var sc float32
	if cc > 0 {
		sc = float32(math.Sqrt(xx / cc))
	}
	if e < 0 {
		sc = -sc
	}
	for j := range x {
		out[j] = lv[code[j]] * sc
	}
}

// Codebooks (Pool.SetCodebook, CodebookGaussian): the built-in levels ascend
// in [-1, 1]; an int3 pool with them reads each head's group back as its
// levels times a scale that keeps the group's L2 norm (f32 scales); refusals
// are *Error values; nil removes a codebook.
func TestCodecCodebook(t *testing.T) {
	var e *Error
	for bits := uint32(2); bits <= 4; bits++ {
		g := must1[[]float32](t)(CodebookGaussian(bits, headDim))
		if len(g) != 1<<bits {
			t.Fatalf("bits %d: %d levels", bits, len(g))
		}
		for i, x := range g {
			if x < -1 || x > 1 || (i > 0 && !(x > g[i-1])) {
				t.Fatalf("bits %d: levels %v", bits, g)
			}
		}
		if g2 := must1[[]float32](t)(CodebookGaussian(bits, 88)); !reflect.DeepEqual(g, g2) {
			t.Fatalf("bits %d: group 88 gives %v, group 64 %v", bits, g2, g)
		}
	}
	for _, c := range [][2]uint64{{5, headDim}, {1, headDim}, {3, 0}, {1000, headDim}} {
		if _, err := CodebookGaussian(uint32(c[0]), c[1]); !errors.As(err, &e) || e.Status != ERR_INVALID_ARGUMENT {
			t.Fatalf("CodebookGaussian(%d, %d): %v", c[0], c[1], err)
		}
	}

	const n = 16
	lv := must1[[]float32](t)(CodebookGaussian(3, headDim))
	levels := append(append([]float32{}, lv...), lv...) // layers = 2
	c := DefaultCodec()
	c.DType = DTYPE_INT3
	cfg := testConfig()
	cfg.KCodec, cfg.VCodec = &c, &c
	p, plain := newTestPool(t, cfg), newTestPool(t, cfg)
	if err := p.SetCodebook(2, levels); !errors.As(err, &e) || e.Status != ERR_INVALID_ARGUMENT {
		t.Fatalf("part 2: %v", err)
	}
	if err := p.SetCodebook(1, levels[:len(levels)-1]); !errors.As(err, &e) || e.Status != ERR_INVALID_ARGUMENT {
		t.Fatalf("a short table: %v", err)
	}
	bad := append([]float32{}, levels...)
	bad[len(lv)+5] = bad[len(lv)+4]
	if err := p.SetCodebook(1, bad); !errors.As(err, &e) || !strings.Contains(e.Message, "layer 1, level 5") {
		t.Fatalf("levels out of order: %v", err)
	}
	must(t, p.SetCodebook(1, levels))
	must(t, p.SetCodebook(0, levels))
	must(t, p.SetCodebook(0, nil)) // removed: the keys' uniform codes again
	k, v := random(n*row, 630), random(n*row, 631)
	for _, q := range []*Pool{p, plain} {
		must(t, q.SeqCreate(1))
		must(t, q.Reserve(1, n))
		must1[uint64](t)(q.Append(1, 1, 0, k, v))
	}
	ko, vo, ku, vu := make([]float32, n*row), make([]float32, n*row), make([]float32, n*row), make([]float32, n*row)
	must1[uint64](t)(p.Gather(1, 1, 0, ko, vo))
	must1[uint64](t)(plain.Gather(1, 1, 0, ku, vu))
	if !reflect.DeepEqual(ko, ku) {
		t.Fatal("keys without a codebook differ from the plain pool's")
	}
	want := make([]float32, n*row)
	differs := false
	for i := 0; i < len(want); i += headDim {
		codebookGroup(v[i:i+headDim], lv, want[i:i+headDim])
		var a, b float64
		for j := i; j < i+headDim; j++ {
			if d := math.Abs(float64(vo[j] - want[j])); d > 1e-5*math.Abs(float64(want[j]))+1e-6 {
				t.Fatalf("value %d: %v, want %v", j, vo[j], want[j])
			}
			a += float64(v[j]) * float64(v[j])
			b += float64(vo[j]) * float64(vo[j])
			differs = differs || vo[j] != vu[j]
		}
		if math.Abs(math.Sqrt(a)-math.Sqrt(b)) > 1e-5*math.Sqrt(a) {
			t.Fatalf("group %d: norm %v, want %v", i/headDim, math.Sqrt(b), math.Sqrt(a))
		}
	}
	if !differs {
		t.Fatal("the codebook's values equal the uniform codes'")
	}
	if err := p.SetCodebook(1, nil); !errors.As(err, &e) || e.Status != ERR_INVALID_ARGUMENT ||
		!strings.Contains(e.Message, "sequences") {
		t.Fatalf("a pool with a sequence: %v", err)
	}
	asym := c
	asym.Asymmetric = true
	cfg.KCodec, cfg.VCodec = &asym, &asym
	if err := newTestPool(t, cfg).SetCodebook(0, levels); !errors.As(err, &e) || e.Status != ERR_INVALID_ARGUMENT {
		t.Fatalf("an asymmetric codec: %v", err)
	}
}

// Per-layer codecs (PoolConfig.LayerKCodecs / LayerVCodecs): int4 keys in
// layer 1, int8 elsewhere; each layer reads back as a pool of that layer's
// codecs alone (nil entries and a nil values table: the pool's codecs); a
// table of another length and a quantized layer in a plain pool are refused.
func TestCodecMixedLayers(t *testing.T) {
	const n = 16
	i8, i4 := DefaultCodec(), DefaultCodec()
	i4.DType = DTYPE_INT4
	cfg := testConfig()
	cfg.KCodec, cfg.VCodec = &i8, &i8
	uniform := newTestPool(t, cfg)
	cfg4 := cfg
	cfg4.KCodec = &i4
	int4k := newTestPool(t, cfg4)
	cfg.LayerKCodecs = []*Codec{nil, &i4}
	mixed := newTestPool(t, cfg)
	k, v := random(n*row, 650), random(n*row, 651)
	for _, p := range []*Pool{mixed, uniform, int4k} {
		must(t, p.SeqCreate(1))
		must(t, p.Reserve(1, n))
		for l := uint32(0); l < layers; l++ {
			must1[uint64](t)(p.Append(1, l, 0, k, v))
		}
	}
	for l := uint32(0); l < layers; l++ {
		km, vm, ku, vu := make([]float32, n*row), make([]float32, n*row), make([]float32, n*row), make([]float32, n*row)
		must1[uint64](t)(mixed.Gather(1, l, 0, km, vm))
		want := uniform
		if l == 1 {
			want = int4k
		}
		must1[uint64](t)(want.Gather(1, l, 0, ku, vu))
		if !reflect.DeepEqual(km, ku) || !reflect.DeepEqual(vm, vu) {
			t.Fatalf("layer %d differs from a pool of its own codecs", l)
		}
	}
	s8, s4, sm := must1[Stats](t)(uniform.Stats()), must1[Stats](t)(int4k.Stats()), must1[Stats](t)(mixed.Stats())
	if sm.BytesPerToken != (s8.BytesPerToken+s4.BytesPerToken)/2 || !(s4.BytesPerToken < s8.BytesPerToken) {
		t.Fatalf("bytes per token: mixed %d, int8 %d, int4 keys %d", sm.BytesPerToken, s8.BytesPerToken, s4.BytesPerToken)
	}
	var e *Error
	cfg.LayerKCodecs = []*Codec{&i4}
	if _, err := NewPool(cfg); !errors.As(err, &e) || e.Status != ERR_INVALID_ARGUMENT || !strings.Contains(e.Message, "1 codecs for 2 layers") {
		t.Fatalf("a short table: %v", err)
	}
	plain := testConfig()
	plain.LayerKCodecs = []*Codec{nil, &i8}
	if _, err := NewPool(plain); !errors.As(err, &e) || e.Status != ERR_UNSUPPORTED {
		t.Fatalf("a quantized layer in a plain pool: %v", err)
	}
}
