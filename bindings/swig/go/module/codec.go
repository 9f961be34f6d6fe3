package kvcache

import "libkvcache.org/kvcache/internal/native"

// Sizes are the buffer sizes Quantize needs for [n][d] values.
func (c Codec) Sizes(n, d uint64) (s QuantSizes, err error) {
	nc := c.native()
	defer native.DeleteCodec(nc)
	var r native.QuantSizes
	if err = call(func() { r = nc.Sizes(n, d) }); err != nil {
		return s, err
	}
	return quantSizesFrom(r), nil
}

// Quantize quantizes src ([n][d] float32, n = len(src) / d) into codes,
// scales and zeros of at least Sizes(n, d) bytes each (scales and zeros may
// be nil when the codec has none). Returns n.
func (c Codec) Quantize(src []float32, d uint64, codes, scales, zeros []byte) (uint64, error) {
	return c.quantize(bytesOf(src), DTYPE_F32, d, codes, scales, zeros)
}

// Quantize16 is Quantize of f16 or bf16 data: dtype must be DTYPE_F16 or
// DTYPE_BF16 (ERR_INVALID_ARGUMENT otherwise: the data is not reinterpreted).
func (c Codec) Quantize16(src []Float16, dtype DType, d uint64, codes, scales, zeros []byte) (uint64, error) {
	if err := check16("Quantize16", dtype); err != nil {
		return 0, err
	}
	return c.quantize(bytesOf(src), dtype, d, codes, scales, zeros)
}

func (c Codec) quantize(src []byte, dtype DType, d uint64, codes, scales, zeros []byte) (n uint64, err error) {
	nc := c.native()
	defer native.DeleteCodec(nc)
	err = call(func() { n = nc.Quantize(src, native.Kvc_dtype(dtype), d, codes, scales, zeros) })
	return n, err
}

// Dequantize writes the [n][d] values that Quantize encoded into dst (at least n*d).
func (c Codec) Dequantize(codes, scales, zeros []byte, n, d uint64, dst []float32) error {
	return c.dequantize(codes, scales, zeros, n, d, bytesOf(dst), DTYPE_F32)
}

// Dequantize16 is Dequantize into f16 or bf16: dtype must be DTYPE_F16 or
// DTYPE_BF16 (ERR_INVALID_ARGUMENT otherwise).
func (c Codec) Dequantize16(codes, scales, zeros []byte, n, d uint64, dst []Float16, dtype DType) error {
	if err := check16("Dequantize16", dtype); err != nil {
		return err
	}
	return c.dequantize(codes, scales, zeros, n, d, bytesOf(dst), dtype)
}

func (c Codec) dequantize(codes, scales, zeros []byte, n, d uint64, dst []byte, dtype DType) error {
	nc := c.native()
	defer native.DeleteCodec(nc)
	return call(func() { nc.Dequantize(codes, scales, zeros, n, d, dst, native.Kvc_dtype(dtype)) })
}

// CodebookGaussian is the built-in codebook for rotated values
// (kvc_codebook_gaussian): the Lloyd-Max levels of groups of groupSize
// Gaussian values normalized by their signed extreme (head_dim for per-token
// scales), 2^bits ascending values in [-1, 1] for bits 2, 3 or 4.
// Pool.SetCodebook takes one such slice per layer, concatenated.
func CodebookGaussian(bits uint32, groupSize uint64) ([]float32, error) {
	buf := make([]float32, 16)
	var n uint
	if err := call(func() { n = native.Codebook_gaussian(uint(bits), groupSize, bytesOf(buf)) }); err != nil {
		return nil, err
	}
	return buf[:n], nil
}
