package kvcache

import (
	"encoding/binary"
	"errors"
	"math"
	"reflect"
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
