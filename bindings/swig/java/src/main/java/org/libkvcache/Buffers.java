package org.libkvcache;

import java.nio.charset.StandardCharsets;

/**
 * Java-side checks of the binding's arguments, called by the generated proxy
 * classes (javacode and javain typemaps in kvcache_java.i) before their
 * native calls.
 *
 * <p>K/V data: the element type of an array must be the dtype it is passed
 * with, so data is never reinterpreted as another dtype: {@code float[]}
 * holds f32 ({@code DTYPE_F32} only), {@code short[]} holds f16 or bf16 bit
 * patterns ({@code DTYPE_F16} or {@code DTYPE_BF16} only; there is no
 * default for it). {@code byte[]} and direct {@code ByteBuffer}s are raw
 * bytes of whatever dtype is given (f32 when none is). Other types are left
 * to the native side, which refuses them with IllegalArgumentException.
 */
final class Buffers {
  /** The dtype argument of a method called without one (f32 by default). */
  static final int NO_DTYPE = Integer.MIN_VALUE;

  private Buffers() {}

  /**
   * Checks that {@code buf} (an argument named {@code what}) can hold data of
   * {@code dtype} ({@link #NO_DTYPE}: the default, f32).
   *
   * @throws IllegalArgumentException a float[] with another dtype than f32, a
   *     short[] with another dtype than f16 / bf16 or without one
   */
  static void checkData(String what, Object buf, int dtype) {
    if (buf instanceof float[]) {
      if (dtype != NO_DTYPE && dtype != Kvc.DTYPE_F32)
        throw new IllegalArgumentException(what + ": float[] holds f32 values, not " + dtypeName(dtype)
            + " (use short[] for f16 / bf16, or byte[] / a direct ByteBuffer of the dtype's bytes)");
    } else if (buf instanceof short[]) {
      if (dtype == NO_DTYPE)
        throw new IllegalArgumentException(what
            + ": short[] holds f16 or bf16 bit patterns: pass the dtype (Kvc.DTYPE_F16 or Kvc.DTYPE_BF16)");
      if (dtype != Kvc.DTYPE_F16 && dtype != Kvc.DTYPE_BF16)
        throw new IllegalArgumentException(what + ": short[] holds f16 or bf16 bit patterns, not "
            + dtypeName(dtype) + " (use float[] for f32, or byte[] / a direct ByteBuffer of the dtype's bytes)");
    }
  }

  /** "DTYPE_F16", or "dtype 42" for a value that is no dtype. */
  static String dtypeName(int dtype) {
    switch (dtype) {
      case Kvc.DTYPE_F32: return "DTYPE_F32";
      case Kvc.DTYPE_F16: return "DTYPE_F16";
      case Kvc.DTYPE_BF16: return "DTYPE_BF16";
      case Kvc.DTYPE_FP8_E4M3: return "DTYPE_FP8_E4M3";
      case Kvc.DTYPE_FP8_E5M2: return "DTYPE_FP8_E5M2";
      case Kvc.DTYPE_INT8: return "DTYPE_INT8";
      case Kvc.DTYPE_INT4: return "DTYPE_INT4";
      case Kvc.DTYPE_INT2: return "DTYPE_INT2";
      case Kvc.DTYPE_INT3: return "DTYPE_INT3";
      default: return "dtype " + dtype;
    }
  }

  /**
   * A String argument as its UTF-8 bytes, which the native side takes as
   * they are (NUL characters included): not JNI's modified UTF-8, which
   * writes U+0000 as C0 80 and characters outside the BMP as two 3-byte
   * surrogates, so the same text gives the same bytes (and prefix keys) as
   * from Go or Python. Unpaired surrogates become '?', as String.getBytes
   * does.
   *
   * @throws NullPointerException {@code s} is null
   */
  static byte[] utf8(String s, String what) {
    if (s == null) throw new NullPointerException(what + " is null");
    return s.getBytes(StandardCharsets.UTF_8);
  }
}
