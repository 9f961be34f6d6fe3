/*
 * libkvcache - the key/value cache of transformer inference, behind a C ABI.
 * SPDX-License-Identifier: Apache-2.0
 */
/**
 * @file kvcache.h
 * @brief The public C API of libkvcache (the only header users need).
 *
 * Read this file top to bottom like a manual.
 *
 * ## Concepts
 * - **Pool** (`kvc_pool`): one allocation of KV memory, made once at
 *   kvc_pool_create(), cut into fixed-size **blocks** (pages). A pool has one
 *   **geometry** (num_layers, num_q_heads, num_kv_heads, head_dim) and one
 *   storage dtype for K and one for V.
 * - **Block**: `block_size` consecutive token slots of one sequence in one
 *   layer, for all KV heads. Block ids are global to the pool: any block can
 *   serve any layer, so layers of one sequence may hold different numbers of
 *   tokens (per-layer eviction budgets). A block is *free* (in the free list),
 *   *cached* (reference count 0 but still findable for prefix reuse, reclaimed
 *   in LRU order) or *used* (reference count >= 1).
 * - **Sequence**: identified by the caller's 64-bit id. Its **length** is the
 *   next position to write; each layer has a **block table** (ordered block
 *   ids) that holds the layer's cached tokens. Without eviction every layer
 *   caches exactly `length` tokens, at positions 0..length-1.
 * - **Slot**: the physical address of one token in one layer:
 *   `block_id * block_size + offset`. The **slot mapping** of new tokens is
 *   what kvc_seq_reserve() returns.
 * - **Fork** (copy-on-write): a child shares all of its parent's blocks by
 *   reference count; the first write into a shared block copies it first.
 *
 * ## One decode step
 * 1. kvc_seq_reserve() makes room for the new tokens in every layer
 *    (all or nothing) and returns their slots.
 * 2. For each layer, kvc_append() writes the new K and V rows (converted to
 *    the storage dtype); the engine's attention reads the layer back with
 *    kvc_gather() or directly through kvc_export_page_table() and
 *    kvc_pool_get_layout().
 *
 * ## Errors
 * Every function that can fail returns a ::kvc_status; ::KVC_OK is 0.
 * kvc_last_error_message() explains the last failure of the calling thread.
 * A call that fails changes nothing: no output parameter is written (unless
 * its documentation says so, e.g. a required buffer size) and the pool is
 * left as it was. No C++ exception, abort or assert crosses this API.
 *
 * ## Structs that grow (see docs/abi-policy.md)
 * Every config and result struct starts with `size_t struct_size`, which the
 * caller sets to its `sizeof`. Fields are only ever appended. The library
 * reads only the fields the caller's size covers (missing fields take their
 * defaults) and writes only those. A larger struct from a newer header is
 * accepted when every byte the library does not know is zero, and refused
 * with ::KVC_ERR_UNSUPPORTED otherwise. A size smaller than the first
 * release's struct, one that ends inside a field, or one above
 * ::KVC_STRUCT_SIZE_MAX is refused with ::KVC_ERR_STRUCT_SIZE.
 *
 * Initialise every struct with its `kvc_<thing>_init(&s)` macro: it calls
 * `kvc_<thing>_init_sized(&s, sizeof s)`, which fills the defaults of
 * exactly the bytes of the caller's struct, so a program built against an
 * older (smaller) header never has memory past its struct written by a newer
 * library, and a program built against a newer (larger) header gets its
 * fields unknown to the library zeroed. New fields are designed so that zero
 * means their default (off): a struct whose unknown tail is zero means the
 * same to every library version. The functions of the same names as the
 * macros (the 0.3 ABI, still in the ::kvc_api table) fill the struct's 0.3
 * size, forever.
 *
 * ## Threads
 * All functions are thread-safe. Per pool, structural calls (sequence
 * create / fork / truncate / free, reserve, stats) are serialized by one
 * pool lock, held for O(blocks touched). kvc_append() and kvc_gather() on
 * different sequences, or on different layers of one sequence, run in
 * parallel (a shared lock); an append that must copy a shared block, or that
 * ages residual tokens (see kvc_append()), takes the pool lock exclusively for
 * that part. Two calls writing the same positions of the same
 * sequence and layer at once give unspecified data (never a crash). Memory
 * reached through kvc_pool_get_layout() is not synchronized by the library.
 *
 * ## Units and shapes
 * Sizes are in bytes or tokens as named. K/V rows are
 * `[n_tokens][num_kv_heads][head_dim]`, row-major, element type given by a
 * ::kvc_dtype argument.
 */
#ifndef KVCACHE_KVCACHE_H
#define KVCACHE_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

/** @brief Marks an exported symbol (the library is built with hidden visibility). */
/* clang-format off */
#if defined(_WIN32)
#  if defined(KVC_BUILDING_LIBRARY)
#    define KVC_API __declspec(dllexport)
#  else
#    define KVC_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) && (__GNUC__ >= 4)
#  define KVC_API __attribute__((visibility("default")))
#else
#  define KVC_API
#endif
/* clang-format on */

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                  */
/* ------------------------------------------------------------------------ */

/** @brief Major version: changes only with an incompatible ABI (then the SONAME changes too). */
#define KVC_VERSION_MAJOR 0
/** @brief Minor version: grows when functions or struct fields are added. */
#define KVC_VERSION_MINOR 4
/** @brief Patch version: fixes only. */
#define KVC_VERSION_PATCH 0
/** @brief The version as one number: major * 10000 + minor * 100 + patch. */
#define KVC_VERSION_NUMBER (KVC_VERSION_MAJOR * 10000 + KVC_VERSION_MINOR * 100 + KVC_VERSION_PATCH)
/** @brief The newest version of the ::kvc_api function table this header describes. */
#define KVC_API_VERSION 11

/**
 * @brief Version of the library actually loaded (KVC_VERSION_NUMBER at its build).
 * @return major * 10000 + minor * 100 + patch. Never fails.
 * @since 0.1
 */
KVC_API uint32_t kvc_version(void);

/**
 * @brief Version of the loaded library as a static string, e.g. "0.1.0".
 * @return A NUL-terminated string owned by the library. Never fails.
 * @since 0.1
 */
KVC_API const char *kvc_version_string(void);

/**
 * @brief The largest struct_size any function of this API accepts (64 KiB):
 * a larger one is refused with ::KVC_ERR_STRUCT_SIZE (a garbage size, never
 * a struct of a newer header).
 * @since 0.4
 */
#define KVC_STRUCT_SIZE_MAX 65536u

/* ------------------------------------------------------------------------ */
/* Status codes                                                             */
/* ------------------------------------------------------------------------ */

/**
 * @brief Result of every call that can fail. Values are fixed forever and
 * never reused.
 * @since 0.1
 */
typedef enum kvc_status {
  KVC_OK = 0,                   /**< Success. */
  KVC_ERR_INVALID_ARGUMENT = 1, /**< An argument has a value outside its documented range. */
  KVC_ERR_NULL_POINTER = 2,     /**< A required pointer argument is NULL. */
  /**
   * A struct's struct_size is smaller than the oldest supported one, ends inside a field
   * (since 0.4) or is above ::KVC_STRUCT_SIZE_MAX (since 0.4).
   */
  KVC_ERR_STRUCT_SIZE = 3,
  /**
   * Valid request this build or version does not support (dtype, device, non-zero unknown
   * struct fields).
   */
  KVC_ERR_UNSUPPORTED = 4,
  /** Sizes whose product or sum overflows 64 bits (or the address space). */
  KVC_ERR_OVERFLOW = 5,
  KVC_ERR_OUT_OF_MEMORY = 6, /**< The host allocator failed. */
  /** Not enough free (or reclaimable) blocks in the pool; nothing changed. */
  KVC_ERR_POOL_EXHAUSTED = 7,
  KVC_ERR_SEQ_NOT_FOUND = 8, /**< No live sequence has this id (never created, or freed). */
  KVC_ERR_SEQ_EXISTS = 9,    /**< A sequence with this id already exists. */
  /** A position, token index or layer is outside what the sequence holds. */
  KVC_ERR_OUT_OF_RANGE = 10,
  KVC_ERR_NOT_RESERVED = 11, /**< A write outside the sequence's reserved slots. */
  /** A caller buffer is too small; the required size is reported. */
  KVC_ERR_BUFFER_TOO_SMALL = 12,
  KVC_ERR_DEVICE_UNAVAILABLE = 13, /**< The requested device does not exist or has no driver. */
  KVC_ERR_VERSION = 14,            /**< An API or ABI version the library does not provide. */
  /** A quantization scale is zero, negative, NaN, Inf or out of range. */
  KVC_ERR_INVALID_SCALE = 15,
  KVC_ERR_NON_FINITE = 16, /**< Input data contains NaN or Inf where it is not allowed. */
  /** A bug in the library (an unexpected C++ exception); please report it. */
  KVC_ERR_INTERNAL = 17,
  /**
   * Saved data (a sequence record) comes from a pool of another configuration or a format this
   * library does not read.
   * @since 0.3
   */
  KVC_ERR_INCOMPATIBLE = 18,
  /**
   * Saved data fails its checksum or structure checks (damaged, truncated or not a record).
   * @since 0.3
   */
  KVC_ERR_CORRUPT = 19,
  /** A file could not be read or written (the message has the system's reason). @since 0.3 */
  KVC_ERR_IO = 20,
  /** An asynchronous operation (kvc_prefix_poll()) has not finished yet; poll again. @since 0.3 */
  KVC_ERR_PENDING = 21,
  /**
   * An offload tier did not answer within the load timeout; the blocks reserved for it went back to
   * the pool.
   * @since 0.3
   */
  KVC_ERR_TIMEOUT = 22,
  /**
   * The request cannot fit even in an empty pool (more blocks than the pool has, or would hold with
   * its eviction budget): retrying never helps, unlike ::KVC_ERR_POOL_EXHAUSTED ("not now"). The
   * message gives the blocks needed and the pool's total.
   * @since 0.4
   */
  KVC_ERR_EXCEEDS_CAPACITY = 23,
  KVC_STATUS_FORCE_32BIT = 0x7fffffff, /**< Forces a 32-bit enum; never returned. */
  /**
   * Forces a signed enum, as every other enum of this header (bindings see int32); never returned.
   * @since 0.4
   */
  KVC_STATUS_FORCE_SIGNED = INT32_MIN
} kvc_status;

/**
 * @brief Name of a status code, e.g. "KVC_ERR_POOL_EXHAUSTED".
 * @param status any value; unknown values give "KVC_ERR_UNKNOWN".
 * @return A static NUL-terminated string. Never fails.
 * @since 0.1
 */
KVC_API const char *kvc_status_string(kvc_status status);

/**
 * @brief Explanation of the last failed call made by the calling thread,
 * e.g. "head_dim 0: must be 1..1024".
 * @return A NUL-terminated string owned by the library, valid until the
 * calling thread's next call into the library; "" when no call has failed
 * yet. Successful calls do not clear it. Never fails.
 * @since 0.1
 */
KVC_API const char *kvc_last_error_message(void);

/* ------------------------------------------------------------------------ */
/* Opaque handles                                                           */
/* ------------------------------------------------------------------------ */

/**
 * @brief A KV-cache pool. Create with kvc_pool_create(), destroy with kvc_pool_destroy().
 * @since 0.1
 */
typedef struct kvc_pool kvc_pool;

/** @brief A loaded scorer plugin (kvc_plugin_load()). @since 0.3 */
typedef struct kvc_plugin kvc_plugin;
/** @brief An eviction policy (kvc_policy_create()). @since 0.3 */
typedef struct kvc_policy kvc_policy;

/* ------------------------------------------------------------------------ */
/* Enumerations every area uses (an area's own are in its section)          */
/* ------------------------------------------------------------------------ */

/**
 * @brief Element types: input/output dtypes of K/V rows, and storage dtypes of a pool.
 *
 * f32: IEEE binary32. f16: IEEE binary16. bf16: the top 16 bits of binary32
 * (rounded to nearest even on conversion). Conversions to narrower types
 * round to nearest even; values beyond f16's range become +-Inf. K/V input
 * and output (kvc_append(), kvc_gather(), kvc_convert()) take f32, f16 or
 * bf16; the fp8 and integer dtypes are storage formats described by a
 * ::kvc_codec (byte layouts in docs/codecs.md).
 * @since 0.1
 */
typedef enum kvc_dtype {
  KVC_DTYPE_F32 = 0,  /**< 32-bit float, 4 bytes. */
  KVC_DTYPE_F16 = 1,  /**< IEEE half, 2 bytes. */
  KVC_DTYPE_BF16 = 2, /**< bfloat16, 2 bytes. */
  /** OCP fp8 E4M3 "FN" (max 448, no Inf), 1 byte; storage only, with a scale. @since 0.2 */
  KVC_DTYPE_FP8_E4M3 = 3,
  /** OCP fp8 E5M2 (max 57344), 1 byte; storage only, with a scale. @since 0.2 */
  KVC_DTYPE_FP8_E5M2 = 4,
  KVC_DTYPE_INT8 = 5, /**< 8-bit integer codes with scales; storage only. @since 0.2 */
  /** 4-bit integer codes, two per byte, with scales; storage only. @since 0.2 */
  KVC_DTYPE_INT4 = 6,
  /** 2-bit integer codes, four per byte, with scales; storage only. @since 0.2 */
  KVC_DTYPE_INT2 = 7,
  /**
   * 3-bit integer codes, eight in three bytes (a little-endian bit string), with scales; storage
   * only; CPU pools only (a CUDA pool gives ::KVC_ERR_UNSUPPORTED). A pool needs head_dim a
   * multiple of 8. Source: KVQuant (arXiv 2401.18079) measures 3-bit KV caches (with per-channel
   * keys) close to f16.
   * @since 0.3
   */
  KVC_DTYPE_INT3 = 8,
  KVC_DTYPE_FORCE_32BIT = 0x7fffffff, /**< Forces a 32-bit enum. */
  /**
   * Makes every int32 value a value of the type in C++, so a bad value from a caller is reported,
   * not undefined behaviour; never valid.
   */
  KVC_DTYPE_FORCE_SIGNED = -0x7fffffff - 1
} kvc_dtype;

/**
 * @brief Where a pool's blocks live.
 * @since 0.1
 */
typedef enum kvc_device {
  KVC_DEVICE_CPU = 0, /**< Host memory (the reference backend). */
  /**
   * An NVIDIA GPU (docs/cuda.md); ::KVC_ERR_DEVICE_UNAVAILABLE in builds without CUDA, on machines
   * without a driver or device, or for a device_index that does not exist.
   */
  KVC_DEVICE_CUDA = 1,
  KVC_DEVICE_FORCE_32BIT = 0x7fffffff, /**< Forces a 32-bit enum. */
  /**
   * Makes every int32 value a value of the type in C++, so a bad value from a caller is reported,
   * not undefined behaviour; never valid.
   */
  KVC_DEVICE_FORCE_SIGNED = -0x7fffffff - 1
} kvc_device;

/**
 * @brief Order of tokens and heads inside one block, as FlashInfer names it.
 *
 * With ::KVC_LAYOUT_NHD, K of one block is `[block_size][num_kv_heads][head_dim]`;
 * with ::KVC_LAYOUT_HND it is `[num_kv_heads][block_size][head_dim]`. V is laid
 * out the same way after K. Exact offsets and strides: kvc_pool_get_layout().
 * @since 0.1
 */
typedef enum kvc_layout {
  KVC_LAYOUT_NHD = 0, /**< tokens, then heads, then head_dim (vLLM / FlashInfer "NHD"). */
  KVC_LAYOUT_HND = 1, /**< heads, then tokens, then head_dim (FlashInfer "HND"). */
  KVC_LAYOUT_FORCE_32BIT = 0x7fffffff, /**< Forces a 32-bit enum. */
  /**
   * Makes every int32 value a value of the type in C++, so a bad value from a caller is reported,
   * not undefined behaviour; never valid.
   */
  KVC_LAYOUT_FORCE_SIGNED = -0x7fffffff - 1
} kvc_layout;

/* ------------------------------------------------------------------------ */
/* Codecs: how K and V are stored                                           */
/* ------------------------------------------------------------------------ */

/**
 * @brief Which values share one scale (and zero point) of a quantized codec.
 *
 * For an array `[n][d]` (kvc_quantize()) or, in a pool, a token's row
 * `[num_kv_heads * head_dim]`:
 * - ::KVC_SCALE_PER_TENSOR: one scale for everything (a static, calibrated
 *   `scale`, or dynamic: the array's absmax; in a pool, fixed per layer by the
 *   layer's first write, as vLLM computes k_scale / v_scale on the first
 *   forward pass);
 * - ::KVC_SCALE_PER_TOKEN: one scale per row of `d`; in a pool one per
 *   (token, KV head), i.e. per head_dim values (vLLM / TensorRT-LLM);
 * - ::KVC_SCALE_PER_GROUP: one per `group_size` consecutive values of a row
 *   (llama.cpp's q8_0 / q4_0 use 32); in a pool groups run over the token's
 *   whole `[num_kv_heads * head_dim]` row, so they may be smaller than
 *   head_dim or span heads; a last partial group's range covers only its
 *   real values;
 * - ::KVC_SCALE_PER_CHANNEL: one per column, over groups of `group_size`
 *   rows (KIVI's keys, arXiv 2402.02750); in a pool, tokens wait in the
 *   residual until a group of group_size (which divides block_size) is
 *   complete, then are encoded together.
 * @since 0.2
 */
typedef enum kvc_granularity {
  KVC_SCALE_NONE = 0,        /**< No scales: f32, f16, bf16 storage. */
  KVC_SCALE_PER_TENSOR = 1,  /**< One scale per tensor (per layer, for K or V, in a pool). */
  KVC_SCALE_PER_TOKEN = 2,   /**< One scale per row (per token and KV head in a pool). */
  KVC_SCALE_PER_GROUP = 3,   /**< One scale per group of group_size values of a row. */
  KVC_SCALE_PER_CHANNEL = 4, /**< One scale per column over group_size rows. */
  KVC_GRANULARITY_FORCE_32BIT = 0x7fffffff, /**< Forces a 32-bit enum. */
  /**
   * Makes every int32 value a value of the type in C++, so a bad value from a caller is reported,
   * not undefined behaviour; never valid.
   */
  KVC_GRANULARITY_FORCE_SIGNED = -0x7fffffff - 1
} kvc_granularity;

/**
 * @brief An orthogonal rotation applied before quantizing (and undone after
 * dequantizing). The normalized Walsh-Hadamard transform spreads outlier
 * channels over the whole block, which keeps 4- and 2-bit codes accurate
 * (QuaRot arXiv 2404.00456, TurboQuant arXiv 2504.19874). Scores are
 * unchanged when the query is rotated the same way.
 * @since 0.2
 */
typedef enum kvc_rotation {
  KVC_ROTATION_NONE = 0, /**< No rotation. */
  /** Block-diagonal normalized Hadamard (blocks of rotation_block values). */
  KVC_ROTATION_HADAMARD = 1,
  KVC_ROTATION_FORCE_32BIT = 0x7fffffff, /**< Forces a 32-bit enum. */
  /**
   * Makes every int32 value a value of the type in C++, so a bad value from a caller is reported,
   * not undefined behaviour; never valid.
   */
  KVC_ROTATION_FORCE_SIGNED = -0x7fffffff - 1
} kvc_rotation;

/**
 * @brief A codec: how K or V values are stored. Fill with kvc_codec_init().
 *
 * Integer codes: symmetric `q = round(x / scale)` in [-qmax, qmax] with
 * scale = absmax / qmax (qmax 127, 7, 3, 1 for int8, int4, int3, int2); asymmetric
 * `q = round((x - zero) / scale)` in [0, 2^bits - 1] with zero = min and
 * scale = (max - min) / (2^bits - 1) (KIVI). Integer codes cover at most
 * [-1e38, 1e38]: values beyond saturate.
 * fp8: `code = fp8(x / scale)`
 * with scale = absmax / fp8_max, saturating (never Inf or NaN). Rounding is
 * to nearest even; an all-zero group is exact; with f16 scales a scale is
 * at most 65504, so values beyond 65504 x qmax saturate, and a zero point is
 * at least -65504, so asymmetric groups reaching below -65504 saturate there;
 * otherwise stored scales are rounded up (zero points down) to scale_dtype so
 * no value is clipped. Error bound: half a step (asymmetric: plus the rounding
 * of x - zero, about one ulp of |zero|). A rotated codec refuses values whose
 * magnitude reaches FLT_MAX / rotation_block (the transform would overflow).
 * NaN or Inf input is refused (::KVC_ERR_NON_FINITE) and nothing is written.
 *
 * Full range (`full_range` = 1, llama.cpp's q4_0 rule, symmetric integer
 * codes only): `q = round(x / scale)` in [-2^(bits-1), 2^(bits-1) - 1]
 * (int8 [-128, 127], int4 [-8, 7], int3 [-4, 3], int2 [-2, 1]) with scale = -m / 2^(bits-1),
 * where m is the group's value of largest magnitude (the positive one on a
 * tie): m itself maps to -2^(bits-1), and the scale is negative when m is
 * positive. All 2^bits codes are used (one more level than [-qmax, qmax]: a
 * step of |m| / 8 instead of |m| / 7 at int4, which lowers the squared error
 * by about a quarter). Error bound: half a step, except for values of the
 * sign opposite to m beyond (2^(bits-1) - 1) steps, which clamp: within one
 * step. The magnitude of the scale is rounded up to scale_dtype as above.
 * @since 0.2 (full_range 0.3)
 */
typedef struct kvc_codec {
  size_t struct_size; /**< sizeof(kvc_codec) of the caller. */
  kvc_dtype dtype;    /**< Storage dtype; default ::KVC_DTYPE_INT8. */
  /** Default ::KVC_SCALE_PER_TOKEN; ::KVC_SCALE_NONE for float dtypes. */
  kvc_granularity granularity;
  /** Values (per-group) or rows (per-channel) per scale, 1..65536; default 32. */
  uint32_t group_size;
  uint32_t asymmetric; /**< 1: zero points (integer dtypes only); default 0. */
  /** ::KVC_DTYPE_F32 (default) or ::KVC_DTYPE_F16 for scales and zero points. */
  kvc_dtype scale_dtype;
  kvc_rotation rotation; /**< Default ::KVC_ROTATION_NONE. */
  /** Power of two dividing the row (pool: head_dim); 0 = the largest such, at most 1024. */
  uint32_t rotation_block;
  /** 1: use `scale` as a static (calibrated) per-tensor scale; 0 (default): dynamic scales. */
  uint32_t static_scale;
  /**
   * With static_scale: the scale (vLLM's k_scale / v_scale), in [1e-30, 1e30]; 0, negative, NaN,
   * Inf or out of range gives ::KVC_ERR_INVALID_SCALE. Ignored otherwise.
   */
  double scale;
  /**
   * 1: symmetric integer codes use all 2^bits values, llama.cpp q4_0's rule (see above);
   * 0 (default): [-qmax, qmax]. Dynamic symmetric integer codecs only, else
   * ::KVC_ERR_INVALID_ARGUMENT; CPU pools only (a CUDA pool gives ::KVC_ERR_UNSUPPORTED).
   * @since 0.3
   */
  uint32_t full_range;
  /**
   * Padding made explicit (the 0.3 struct's tail), so that the fields after it are never read
   * from a shorter struct's padding; never read, any value (a struct_size of 53..55 now ends
   * inside it and is refused: no compiler makes a kvc_codec of those sizes). @since 0.4
   */
  uint32_t reserved0;
  /**
   * Outliers per scale group (dense-and-sparse codes, after KVQuant arXiv 2401.18079 section
   * 3.4): the `outliers` values of largest magnitude of each group (a token's KV head with
   * per-token scales, a group of group_size values with per-group ones) are stored apart as
   * (index, int8 code) pairs, code = round(x / scale) in [-128, 127], and the group's scale is
   * computed from its other values (but never below the largest outlier's magnitude / 127), so
   * a few values far out no longer stretch every other value's step. 0 (default) .. 16 and at
   * most a quarter of the group; symmetric integer codecs (int8, int4, int3, int2, full range or
   * not) with dynamic per-token or per-group scales, groups of at most 256 values that divide the
   * row; ::KVC_ERR_INVALID_ARGUMENT otherwise. Pools only: kvc_quantize() and friends give
   * ::KVC_ERR_UNSUPPORTED, and so do CUDA pools. Storage: 2 bytes per outlier (docs/codecs.md).
   * @since 0.4
   */
  uint32_t outliers;
} kvc_codec;

/**
 * @brief Fill a codec with defaults: int8, per token, symmetric, f32 scales,
 * group_size 32, no rotation, dynamic scales.
 * The function of this name is the 0.3 entry point (for binaries built
 * against 0.3 headers and the ::kvc_api table): it fills the struct's 0.3
 * size (56 bytes on x86-64), forever; source code calling
 * kvc_codec_init() gets the macro of that name, which passes the caller's
 * sizeof to kvc_codec_init_sized().
 * @param codec the struct to fill (not NULL).
 * @return ::KVC_OK or ::KVC_ERR_NULL_POINTER.
 * @since 0.2
 */
KVC_API kvc_status kvc_codec_init(kvc_codec *codec);

/**
 * @brief Fill the first `struct_size` bytes of a codec as kvc_codec_init()
 * does, with struct_size set to `struct_size`: the caller's struct, of its
 * header's size. Never writes past `struct_size` bytes; the bytes past this
 * library's sizeof(kvc_codec) (fields of a newer header) are zeroed.
 * @param codec the caller's struct (not NULL), `struct_size` bytes.
 * @param struct_size the caller's sizeof(kvc_codec): at least 48 (through scale, the 0.2 struct),
 * not ending inside a field, at most ::KVC_STRUCT_SIZE_MAX.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE (a size
 * refused as above; the message names the field it cuts). Nothing is
 * written on failure.
 * @since 0.4
 */
KVC_API kvc_status kvc_codec_init_sized(kvc_codec *codec, size_t struct_size);

/**
 * @brief kvc_codec_init() in source code: kvc_codec_init_sized() with
 * the caller's sizeof, so it fills exactly the caller's struct.
 * @param codec a `kvc_codec *` (evaluated once; a literal NULL has no
 * struct type in C++ (GNU C takes sizeof(void) as 1 and the call then returns
 * ::KVC_ERR_NULL_POINTER): call kvc_<thing>_init_sized() for that).
 * @since 0.4 (a function before, which remains exported for 0.3 binaries)
 */
#define kvc_codec_init(codec) kvc_codec_init_sized((codec), sizeof *(codec))

/* ------------------------------------------------------------------------ */
/* Pool configuration and lifecycle                                         */
/* ------------------------------------------------------------------------ */

/** @brief Pool flag: fill a block with zero bytes whenever it becomes free, so
 * one tenant's K/V never lingers in memory handed to another, also for
 * engines that read the blocks directly (kvc_pool_get_layout()). Without it
 * the library's own readers still never return another sequence's bytes
 * (kvc_gather(), attention and records return zeros for slots no append
 * wrote, since 0.4); only the raw block memory keeps them. @since 0.1 */
#define KVC_POOL_ZERO_ON_FREE 0x1u

/** @brief Pool flag: quantize keys in their pre-RoPE space (KVQuant, arXiv
 * 2401.18079, section 3.2). The engine still appends keys after RoPE and
 * reads them back after RoPE; the pool undoes the rotation of each key at
 * its position before encoding it and applies it again after decoding
 * (kvc_gather(), attention), so per-channel scales see channel statistics
 * that do not turn with the position. A token's RoPE position is the one
 * kvc_seq_rope_positions() reports (its position in the sequence until an
 * eviction with ::kvc_policy_config.shift_positions, which then re-encodes
 * nothing: the keys are read at their new positions). Needs the pool's
 * rope_style (and rope_dims, rope_theta, as the engine applies them) and a
 * quantized k_codec, else ::KVC_ERR_INVALID_ARGUMENT; CPU pools only (a
 * CUDA pool gives ::KVC_ERR_UNSUPPORTED). Prefix-cache keys, offloaded
 * blocks and kvc_seq_save() records of such a pool carry the flag and the
 * RoPE settings, so they match only pools with the same ones. Values and
 * float keys are unaffected. A
 * static key scale (::kvc_codec.static_scale) applies to the pre-RoPE keys,
 * whose values reach up to sqrt(2) times those after RoPE: calibrate it
 * before RoPE (a k_scale measured after RoPE can clip).
 * @since 0.3 */
#define KVC_POOL_PRE_ROPE_KEYS 0x2u

/** @brief Pool flag: head-wise storage. Each (layer, KV head) has its own
 * block table, token count, positions and recorded scores, and a block
 * holds `block_size` tokens of one KV head (kvc_pool_get_layout() reports
 * num_kv_heads 1), so an eviction that keeps different tokens in different
 * heads (::KVC_HEAD_BUDGET_ADAKV, kvc_seq_keep_head()) frees each head's
 * own blocks: a head that keeps 20% of the tokens holds 20% of the blocks.
 * Token-wise pools (the default) keep one table per layer, the same tokens
 * in every head.
 *
 * What works as in a token-wise pool: reserve, kvc_append() (rows
 * `[n][num_kv_heads][head_dim]` as always; each head writes at its own
 * index), decode and prefill attention (each KV head over its own tokens
 * with its group of query heads, any codec), eviction (every policy, per
 * head; ::kvc_policy_config.head_budget shares a layer's budget across its
 * heads), fork and copy-on-write, kvc_seq_save() / kvc_seq_restore() (the
 * record carries the flag: it restores only into a head-wise pool of the
 * same geometry), the prefix cache and offload tiers (keys carry the flag
 * too). Per-layer reads (kvc_gather(), kvc_seq_scores(),
 * kvc_seq_observe_scores(), kvc_seq_rope_positions(), kvc_seq_keep()) apply
 * while the layer's heads hold the same tokens and give
 * ::KVC_ERR_UNSUPPORTED after a head-wise eviction; read one head with
 * kvc_gather_head(), kvc_seq_head_tokens(), kvc_seq_head_block_table(),
 * kvc_export_head_page_table(). kvc_seq_block_table() and
 * kvc_export_page_table() give ::KVC_ERR_UNSUPPORTED (a layer has no one
 * table). kvc_seq_layer_tokens() gives the most any head of the layer holds;
 * slot mappings of kvc_seq_reserve() are `[num_layers][num_kv_heads][n_new]`;
 * ::kvc_stats.tokens_stored counts (token, KV head) pairs.
 *
 * Refused at create with ::KVC_ERR_UNSUPPORTED: CUDA pools, per-tensor
 * scales, per-group scales whose group does not divide head_dim, the HND
 * layout; with ::KVC_ERR_INVALID_ARGUMENT: more than 2^20 (layer, head)
 * tables. llama.cpp state import / export and policies with shift_positions
 * (heads would have different in-cache positions) give ::KVC_ERR_UNSUPPORTED.
 * Attention takes the pool lock once per KV head: a call racing an eviction
 * of the same sequence may see some heads before it and some after (as two
 * calls would); a failing call can leave scores observed by earlier heads.
 * A pool of one KV head with the flag is head-wise (its per-head calls work,
 * its per-layer tables are refused).
 * Layout in docs/eviction.md ("Head-wise pools"). @since 0.4 */
#define KVC_POOL_HEADWISE 0x4u

/**
 * @brief The rotary position embedding (RoPE) the engine applies to keys
 * before kvc_append(). The pool needs it only to re-rotate keys whose
 * positions shift (eviction with ::kvc_policy_config.shift_positions,
 * StreamingLLM's positions within the cache).
 * @since 0.3
 */
typedef enum kvc_rope_style {
  KVC_ROPE_NONE = 0, /**< Unknown or none: positions never shift (default). */
  /** Pairs (2i, 2i+1) rotate by pos x theta^(-2i/dims): Meta LLaMA, llama2.c, GPT-J. */
  KVC_ROPE_INTERLEAVED = 1,
  /** Pairs (i, i + dims/2) ("rotate half"): GPT-NeoX, Hugging Face LLaMA, llama.cpp NEOX. */
  KVC_ROPE_NEOX = 2,
  KVC_ROPE_FORCE_32BIT = 0x7fffffff, /**< Forces a 32-bit enum; not a value. */
  /** Forces a signed enum (any int32 can be passed and is checked); not a value. */
  KVC_ROPE_FORCE_SIGNED = INT32_MIN
} kvc_rope_style;

/**
 * @brief Configuration of a pool. Fill with kvc_pool_config_init(), then set
 * the geometry and capacity.
 *
 * Capacity: `num_blocks` if non-zero; otherwise as many blocks as fit in
 * `capacity_bytes` (at least one must fit). Exactly one of them must be set.
 * @since 0.1
 */
typedef struct kvc_pool_config {
  size_t struct_size;    /**< sizeof(kvc_pool_config) of the caller. */
  uint32_t num_layers;   /**< Transformer layers, 1..4096. */
  uint32_t num_q_heads;  /**< Query heads, 1..65536, a multiple of num_kv_heads. */
  uint32_t num_kv_heads; /**< KV heads, 1..65536 (GQA: fewer than num_q_heads). */
  uint32_t head_dim;     /**< Elements per head, 1..1024. */
  uint32_t block_size;   /**< Tokens per block, 1..4096; default 16. */
  uint32_t flags;        /**< Bitwise OR of KVC_POOL_* flags; default 0. */
  uint64_t num_blocks;   /**< Capacity in blocks (all layers together), 0 = use capacity_bytes. */
  /** Capacity as a byte budget for block memory, used when num_blocks is 0. */
  uint64_t capacity_bytes;
  kvc_dtype k_dtype; /**< Storage dtype of keys; default ::KVC_DTYPE_F16. */
  kvc_dtype v_dtype; /**< Storage dtype of values; default ::KVC_DTYPE_F16. */
  kvc_layout layout; /**< Order inside a block; default ::KVC_LAYOUT_NHD. */
  /**
   * Where blocks live; default ::KVC_DEVICE_CPU. ::KVC_DEVICE_CUDA: one device allocation, the same
   * layout; data arguments may then be device memory (docs/cuda.md lists what is CPU-only).
   */
  kvc_device device;
  int32_t device_index; /**< Device ordinal for ::KVC_DEVICE_CUDA; 0 for the CPU. */
  /**
   * NULL (default): keys stored as k_dtype; else their codec (copied at create; dtype
   * overrides k_dtype).
   * @since 0.2
   */
  const kvc_codec *k_codec;
  /** NULL (default): values stored as v_dtype; else their codec. @since 0.2 */
  const kvc_codec *v_codec;
  /**
   * Residual window R (KIVI): the newest R tokens of each layer stay in residual_dtype and are
   * encoded with the codecs as they age; 0 (default) = none. Needs a quantized K or V codec.
   * @since 0.2
   */
  uint32_t residual_window;
  /**
   * Storage of residual tokens (the window, hybrid and staged tokens, and attention-sink copies):
   * ::KVC_DTYPE_F16 (default), ::KVC_DTYPE_BF16, ::KVC_DTYPE_F32, or ::KVC_DTYPE_INT8 (@since 0.4):
   * int8 rows with one f16 scale per token and KV head, the codes kvc_quantize() gives for an
   * int8 per-token codec with f16 scales (symmetric, scale = largest |x| / 127, round to nearest
   * even), 8.25 bits per element at head_dim 64: a window costs about half of f16's (the
   * low-bit rows of docs/eval.md, "Int8 windows"). Int8 rows take finite values only: an append
   * with NaN or Inf returns ::KVC_ERR_NON_FINITE and writes nothing, for a part stored plainly
   * once encoded too. Unused (any valid value accepted) when the pool has no residual: no
   * window, hybrid fraction, per-channel codec or sinks. Anything else:
   * ::KVC_ERR_INVALID_ARGUMENT at create.
   * @since 0.2
   */
  kvc_dtype residual_dtype;
  /**
   * Hybrid precision: keep the newest floor(fraction x length) tokens in residual_dtype (when above
   * residual_window), in [0, 1); 0 (default) = off.
   * @since 0.2
   */
  double residual_fraction;
  /**
   * Capacity of the residual arena in blocks of block_size tokens (K and V of all KV heads,
   * residual_dtype); 0 (default) = num_blocks when a residual is used. This arena is in addition to
   * capacity_bytes, which sizes the codec blocks; kvc_stats.bytes_total reports both.
   * @since 0.2
   */
  uint64_t num_residual_blocks;
  /** RoPE the engine applied to keys; default ::KVC_ROPE_NONE. @since 0.3 */
  kvc_rope_style rope_style;
  /** Rotated dimensions per head (even, <= head_dim); 0 (default) = head_dim. @since 0.3 */
  uint32_t rope_dims;
  double rope_theta; /**< RoPE base; default 10000. @since 0.3 */
  /**
   * Attention sinks kept at high precision: the first N tokens of each layer keep a residual_dtype
   * copy after they are encoded (KVQuant, arXiv 2401.18079, keeps the first token in fp16;
   * IntactKV, arXiv 2403.01241, keeps such pivot tokens lossless); kvc_gather() and attention read
   * that copy. 0 (default) = none; at most block_size. Needs a quantized K or V codec; without a
   * residual window, hybrid fraction or per-channel codec it makes the residual arena itself (each
   * token is staged there and encoded by the append that writes it). The copies take
   * ceil(num_layers / floor(block_size / N)) residual blocks per sequence, reserved with its first
   * token and counted by kvc_pool_stats(). Scales shared with other tokens leave the sinks out: a
   * per-channel group's range is its other rows' (the sink rows are clamped into it before
   * encoding), a per-tensor scale comes from the other rows of the layer's first write; readers of
   * the raw block tables see those codes, not the copies.
   * @since 0.3
   */
  uint32_t residual_sinks;
  /**
   * Mixed precision per layer: NULL (default), or an array of num_layers pointers, entry i layer
   * i's key codec (a NULL entry: k_codec, or k_dtype storage without one). With either table set,
   * each layer stores its K and V with its own codecs: blocks of each distinct (K, V) pair form a
   * block format of their own (at most 16), with its own byte size, and num_blocks is divided
   * among the formats in proportion to their layers (each format floor(num_blocks x its layers /
   * num_layers) blocks, the rest one each to the largest remainders; every format needs at least
   * one: num_blocks >= num_layers always suffices). With capacity_bytes, num_blocks is the largest
   * count whose split fits the budget. So bits go where a sensitivity scan says they matter:
   * KVTuner (arXiv 2502.04420) finds per-layer K/V precision pairs nearly lossless at about 3.25
   * bits; KVQuant (arXiv 2401.18079) and KIVI keep more bits in sensitive layers. In this version
   * every layer quantizes a part or none does, with the same Hadamard rotation; per-channel scales,
   * head-wise pools and CUDA pools are refused (::KVC_ERR_UNSUPPORTED), and kvc_pool_get_layout()
   * and kvc_pool_copy_blocks() refuse a pool with more than one format (::kvc_stats.bytes_per_block
   * is then the mean block over the layers). Entries are read at create only. docs/codecs.md "Mixed
   * precision".
   * @since 0.4
   */
  const kvc_codec *const *layer_k_codecs;
  /** Per-layer value codecs, as layer_k_codecs (a NULL entry: v_codec). @since 0.4 */
  const kvc_codec *const *layer_v_codecs;
} kvc_pool_config;

/**
 * @brief Fill a config with defaults: struct_size (the 0.3 size, below),
 * block_size 16, f16 K and V, NHD, CPU, rope_theta 10000, residual_dtype
 * f16, everything else 0.
 * The function of this name is the 0.3 entry point (for binaries built
 * against 0.3 headers and the ::kvc_api table): it fills the struct's 0.3
 * size (136 bytes on x86-64), forever; source code calling
 * kvc_pool_config_init() gets the macro of that name, which passes the caller's
 * sizeof to kvc_pool_config_init_sized().
 * @param config the struct to fill (not NULL).
 * @return ::KVC_OK, or ::KVC_ERR_NULL_POINTER.
 * @since 0.1
 */
KVC_API kvc_status kvc_pool_config_init(kvc_pool_config *config);

/**
 * @brief Fill the first `struct_size` bytes of a pool config as kvc_pool_config_init()
 * does, with struct_size set to `struct_size`: the caller's struct, of its
 * header's size. Never writes past `struct_size` bytes; the bytes past this
 * library's sizeof(kvc_pool_config) (fields of a newer header) are zeroed.
 * @param config the caller's struct (not NULL), `struct_size` bytes.
 * @param struct_size the caller's sizeof(kvc_pool_config): at least 48 (through capacity_bytes),
 * not ending inside a field, at most ::KVC_STRUCT_SIZE_MAX.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE (a size
 * refused as above; the message names the field it cuts). Nothing is
 * written on failure.
 * @since 0.4
 */
KVC_API kvc_status kvc_pool_config_init_sized(kvc_pool_config *config, size_t struct_size);

/**
 * @brief kvc_pool_config_init() in source code: kvc_pool_config_init_sized() with
 * the caller's sizeof, so it fills exactly the caller's struct.
 * @param config a `kvc_pool_config *` (evaluated once; a literal NULL has no
 * struct type in C++ (GNU C takes sizeof(void) as 1 and the call then returns
 * ::KVC_ERR_NULL_POINTER): call kvc_<thing>_init_sized() for that).
 * @since 0.4 (a function before, which remains exported for 0.3 binaries)
 */
#define kvc_pool_config_init(config) kvc_pool_config_init_sized((config), sizeof *(config))

/**
 * @brief Create a pool: validates the config, allocates all block memory at
 * once (zeroed) and every bookkeeping array.
 * @param config the configuration (read only up to config->struct_size).
 * @param out receives the new pool; untouched on failure.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE;
 * ::KVC_ERR_INVALID_ARGUMENT (a dimension out of range, num_q_heads not a
 * multiple of num_kv_heads, no capacity or both kinds given, unknown flags,
 * dtype or layout, residual_sinks above block_size or without a quantized
 * codec, an int3 codec with head_dim not a multiple of 8,
 * ::KVC_POOL_PRE_ROPE_KEYS without rope_style or a quantized k_codec);
 * ::KVC_ERR_UNSUPPORTED (non-zero fields unknown to this
 * version; on ::KVC_DEVICE_CUDA a residual window, attention sinks, hybrid precision,
 * per-channel scales, full-range or int3 codecs, pre-RoPE keys, or a head_dim
 * the kernels do not take: docs/cuda.md);
 * ::KVC_ERR_OVERFLOW (sizes overflow); ::KVC_ERR_DEVICE_UNAVAILABLE (no CUDA
 * backend, driver or device); ::KVC_ERR_OUT_OF_MEMORY (host or device
 * memory).
 * @since 0.1
 */
KVC_API kvc_status kvc_pool_create(const kvc_pool_config *config, kvc_pool **out);

/**
 * @brief Destroy a pool and every sequence in it. No other thread may use the
 * pool during or after this call.
 * @param pool the pool, or NULL (a no-op).
 * @since 0.1
 */
KVC_API void kvc_pool_destroy(kvc_pool *pool);

/* ------------------------------------------------------------------------ */
/* Statistics and memory layout                                             */
/* ------------------------------------------------------------------------ */

/**
 * @brief Counters of a pool, filled by kvc_pool_stats(). Init with kvc_stats_init().
 *
 * Every block is in exactly one state: blocks_total = blocks_free +
 * blocks_cached + blocks_used. blocks_shared counts used blocks whose
 * reference count is at least 2.
 * @since 0.1
 */
typedef struct kvc_stats {
  size_t struct_size;     /**< sizeof(kvc_stats) of the caller. */
  uint64_t blocks_total;  /**< Blocks in the pool. */
  uint64_t blocks_free;   /**< Blocks in the free list. */
  uint64_t blocks_cached; /**< Blocks with reference count 0 kept for prefix reuse. */
  uint64_t blocks_used;   /**< Blocks with reference count >= 1. */
  uint64_t blocks_shared; /**< Used blocks with reference count >= 2. */
  /**
   * Bytes of one block (K and V, one layer, all KV heads); with per-layer codecs
   * (kvc_pool_config::layer_k_codecs) the mean over the layers, rounded down.
   */
  uint64_t bytes_per_block;
  /** Bytes one token takes in all layers (K and V), metadata included. */
  uint64_t bytes_per_token;
  uint64_t bytes_total;       /**< Bytes of block memory allocated at create. */
  uint64_t bytes_in_use;      /**< Bytes of used + cached blocks. */
  uint64_t peak_bytes_in_use; /**< Largest bytes_in_use since create or kvc_pool_reset_peak(). */
  uint64_t num_sequences;     /**< Live sequences. */
  /** Blocks of the residual arena (0 without a residual window). @since 0.2 */
  uint64_t residual_blocks_total;
  uint64_t residual_blocks_used;     /**< Residual blocks in use. @since 0.2 */
  uint64_t residual_bytes_per_block; /**< Bytes of one residual block. @since 0.2 */
  /**
   * Tokens held, summed over sequences and layers (bits per
   * element = bytes_in_use * 8 / (tokens_stored * 2 * num_kv_heads * head_dim)).
   * A head-wise pool (::KVC_POOL_HEADWISE) counts (token, KV head) pairs
   * (bits per element = bytes_in_use * 8 / (tokens_stored * 2 * head_dim)).
   * @since 0.2
   */
  uint64_t tokens_stored;
} kvc_stats;

/** @brief Fill stats with struct_size (the 0.3 size, below) and zeros.
 * The function of this name is the 0.3 entry point (for binaries built
 * against 0.3 headers and the ::kvc_api table): it fills the struct's 0.3
 * size (128 bytes on x86-64), forever; source code calling
 * kvc_stats_init() gets the macro of that name, which passes the caller's
 * sizeof to kvc_stats_init_sized().
 * @param stats the struct to fill (not NULL).
 * @return ::KVC_OK or ::KVC_ERR_NULL_POINTER. @since 0.1 */
KVC_API kvc_status kvc_stats_init(kvc_stats *stats);

/**
 * @brief Fill the first `struct_size` bytes of a stats struct as kvc_stats_init()
 * does, with struct_size set to `struct_size`: the caller's struct, of its
 * header's size. Never writes past `struct_size` bytes; the bytes past this
 * library's sizeof(kvc_stats) (fields of a newer header) are zeroed.
 * @param stats the caller's struct (not NULL), `struct_size` bytes.
 * @param struct_size the caller's sizeof(kvc_stats): at least 48 (through blocks_shared),
 * not ending inside a field, at most ::KVC_STRUCT_SIZE_MAX.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE (a size
 * refused as above; the message names the field it cuts). Nothing is
 * written on failure.
 * @since 0.4
 */
KVC_API kvc_status kvc_stats_init_sized(kvc_stats *stats, size_t struct_size);

/**
 * @brief kvc_stats_init() in source code: kvc_stats_init_sized() with
 * the caller's sizeof, so it fills exactly the caller's struct.
 * @param stats a `kvc_stats *` (evaluated once; a literal NULL has no
 * struct type in C++ (GNU C takes sizeof(void) as 1 and the call then returns
 * ::KVC_ERR_NULL_POINTER): call kvc_<thing>_init_sized() for that).
 * @since 0.4 (a function before, which remains exported for 0.3 binaries)
 */
#define kvc_stats_init(stats) kvc_stats_init_sized((stats), sizeof *(stats))

/**
 * @brief Read the pool's counters (a consistent snapshot).
 * @param pool the pool (not NULL).
 * @param stats filled up to stats->struct_size.
 * @return ::KVC_OK, ::KVC_ERR_NULL_POINTER, ::KVC_ERR_STRUCT_SIZE.
 * @since 0.1
 */
KVC_API kvc_status kvc_pool_stats(kvc_pool *pool, kvc_stats *stats);

/**
 * @brief Set peak_bytes_in_use to the current bytes_in_use.
 * @param pool the pool (not NULL).
 * @return ::KVC_OK or ::KVC_ERR_NULL_POINTER. @since 0.1
 */
KVC_API kvc_status kvc_pool_reset_peak(kvc_pool *pool);

/**
 * @brief Where and how block memory is laid out, for engines that run their
 * own kernels over it (FlashInfer, vLLM-style paged attention) without a copy.
 *
 * Block `b` starts at `(char *)base + b * block_stride`. Inside it, the K row
 * of token slot `t` (0..block_size-1) and KV head `h` starts at
 * `k_offset + t * k_token_stride + h * k_head_stride` bytes and holds head_dim
 * elements of k_dtype, contiguous; V likewise with the v_* fields. With
 * ::KVC_LAYOUT_NHD and equal K/V dtypes this is FlashInfer's paged cache
 * `[num_blocks][2][block_size][num_kv_heads][head_dim]`; with HND,
 * `[num_blocks][2][num_kv_heads][block_size][head_dim]`.
 *
 * Quantized parts (docs/codecs.md): codes `[block_size][num_kv_heads][head_dim *
 * bits / 8]` at k_offset, then the scales `[block_size][k_scales_per_token]` at
 * k_scale_offset and, for asymmetric codecs, the zero points at k_zero_offset;
 * for a codec with outliers (::kvc_codec.outliers, symmetric: no zero points)
 * the outlier pairs `[block_size][k_scales_per_token][outliers][2]` (uint8
 * index, int8 code) are at k_zero_offset instead; k_bytes covers them all.
 * Per-channel scales (group of G tokens) are
 * `[block_size / G][num_kv_heads * head_dim]` instead. Per-tensor scales live
 * outside the blocks (kvc_pool_tensor_scales()). With a residual window, a
 * layer's newest tokens live in residual blocks (residual_base) until they
 * are encoded; block tables and page tables list the codec blocks only, and
 * kvc_gather() reads both.
 * @since 0.1
 */
typedef struct kvc_pool_layout {
  size_t struct_size; /**< sizeof(kvc_pool_layout) of the caller. */
  /** First byte of block 0 (host pointer for the CPU, device pointer for CUDA). */
  void *base;
  uint64_t num_blocks;     /**< Blocks in the pool. */
  uint64_t block_stride;   /**< Bytes from one block to the next. */
  uint32_t block_size;     /**< Token slots per block. */
  uint32_t num_kv_heads;   /**< KV heads. */
  uint32_t head_dim;       /**< Elements per head. */
  kvc_layout layout;       /**< NHD or HND. */
  kvc_dtype k_dtype;       /**< Storage dtype of K. */
  kvc_dtype v_dtype;       /**< Storage dtype of V. */
  uint64_t k_offset;       /**< Byte offset of K inside a block. */
  uint64_t k_token_stride; /**< Bytes between consecutive token slots of K. */
  uint64_t k_head_stride;  /**< Bytes between consecutive KV heads of K. */
  uint64_t k_bytes;        /**< Bytes of K in one block. */
  uint64_t v_offset;       /**< Byte offset of V inside a block. */
  uint64_t v_token_stride; /**< Bytes between consecutive token slots of V. */
  uint64_t v_head_stride;  /**< Bytes between consecutive KV heads of V. */
  uint64_t v_bytes;        /**< Bytes of V in one block. */
  kvc_device device;       /**< Where base points. */
  int32_t device_index;    /**< Device ordinal. */
  /**
   * Bytes of K codes (or plain values) in a block; k_bytes minus scales, zero points and
   * outlier pairs.
   * @since 0.2
   */
  uint64_t k_codes_bytes;
  /**
   * Byte offset of K's scales in a block: `[block_size][k_scales_per_token]` of k_scale_dtype.
   * @since 0.2
   */
  uint64_t k_scale_offset;
  /**
   * Byte offset of K's zero points (asymmetric codecs), same shape as the scales; of its outlier
   * pairs with ::kvc_codec.outliers (0.4). @since 0.2
   */
  uint64_t k_zero_offset;
  /** Scale entries per token slot of K (0: none or per-tensor). @since 0.2 */
  uint32_t k_scales_per_token;
  kvc_dtype k_scale_dtype;     /**< Dtype of K's scales and zero points (f32 or f16). @since 0.2 */
  uint64_t v_codes_bytes;      /**< As k_codes_bytes, for V. @since 0.2 */
  uint64_t v_scale_offset;     /**< As k_scale_offset, for V. @since 0.2 */
  uint64_t v_zero_offset;      /**< As k_zero_offset, for V. @since 0.2 */
  uint32_t v_scales_per_token; /**< As k_scales_per_token, for V. @since 0.2 */
  kvc_dtype v_scale_dtype;     /**< As k_scale_dtype, for V. @since 0.2 */
  /** K's scale granularity (::KVC_SCALE_NONE for float storage). @since 0.2 */
  kvc_granularity k_granularity;
  /** K's group size (per group: values; per channel: tokens). @since 0.2 */
  uint32_t k_group_size;
  kvc_granularity v_granularity; /**< V's scale granularity. @since 0.2 */
  uint32_t v_group_size;         /**< V's group size. @since 0.2 */
  /**
   * First byte of residual block 0 (NULL without a residual window). Residual block r holds K then
   * V, each `[block_size][num_kv_heads][head_dim]` of residual_dtype (::KVC_DTYPE_INT8: those
   * codes, then `[block_size][num_kv_heads]` f16 scales, in each part), at
   * `residual_base + r * residual_block_stride`.
   * @since 0.2
   */
  void *residual_base;
  uint64_t residual_num_blocks;   /**< Blocks of the residual arena. @since 0.2 */
  uint64_t residual_block_stride; /**< Bytes from one residual block to the next. @since 0.2 */
  kvc_dtype residual_dtype;       /**< Element type of residual blocks. @since 0.2 */
  uint32_t reserved0;             /**< Zero. @since 0.2 */
} kvc_pool_layout;

/** @brief Fill a layout struct with struct_size (the 0.3 size, below) and zeros.
 * The function of this name is the 0.3 entry point (for binaries built
 * against 0.3 headers and the ::kvc_api table): it fills the struct's 0.3
 * size (240 bytes on x86-64), forever; source code calling
 * kvc_pool_layout_init() gets the macro of that name, which passes the caller's
 * sizeof to kvc_pool_layout_init_sized().
 * @param layout the struct to fill (not NULL).
 * @return ::KVC_OK or ::KVC_ERR_NULL_POINTER. @since 0.1 */
KVC_API kvc_status kvc_pool_layout_init(kvc_pool_layout *layout);

/**
 * @brief Fill the first `struct_size` bytes of a layout struct as kvc_pool_layout_init()
 * does, with struct_size set to `struct_size`: the caller's struct, of its
 * header's size. Never writes past `struct_size` bytes; the bytes past this
 * library's sizeof(kvc_pool_layout) (fields of a newer header) are zeroed.
 * @param layout the caller's struct (not NULL), `struct_size` bytes.
 * @param struct_size the caller's sizeof(kvc_pool_layout): at least 120 (through v_bytes),
 * not ending inside a field, at most ::KVC_STRUCT_SIZE_MAX.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE (a size
 * refused as above; the message names the field it cuts). Nothing is
 * written on failure.
 * @since 0.4
 */
KVC_API kvc_status kvc_pool_layout_init_sized(kvc_pool_layout *layout, size_t struct_size);

/**
 * @brief kvc_pool_layout_init() in source code: kvc_pool_layout_init_sized() with
 * the caller's sizeof, so it fills exactly the caller's struct.
 * @param layout a `kvc_pool_layout *` (evaluated once; a literal NULL has no
 * struct type in C++ (GNU C takes sizeof(void) as 1 and the call then returns
 * ::KVC_ERR_NULL_POINTER): call kvc_<thing>_init_sized() for that).
 * @since 0.4 (a function before, which remains exported for 0.3 binaries)
 */
#define kvc_pool_layout_init(layout) kvc_pool_layout_init_sized((layout), sizeof *(layout))

/**
 * @brief Describe the pool's block memory (see ::kvc_pool_layout). The base
 * pointer stays valid until kvc_pool_destroy(). The raw memory is not
 * filtered: a slot that was reserved but not written yet holds whatever
 * bytes were there before (another sequence's, unless the pool was made
 * with ::KVC_POOL_ZERO_ON_FREE); engine kernels reading it directly must
 * read only the slots they wrote. Bytes an engine writes into this memory
 * itself are not known to the library as written: its readers (kvc_gather(),
 * attention, records, kvc_pool_copy_blocks() to the host) return zeros for
 * those slots and kvc_prefix_insert() refuses their blocks; write K/V with
 * kvc_append() or kvc_pool_copy_blocks() from the host.
 * @param pool the pool (not NULL).
 * @param layout filled up to layout->struct_size (set it with kvc_pool_layout_init()).
 * @return ::KVC_OK, ::KVC_ERR_NULL_POINTER, ::KVC_ERR_STRUCT_SIZE.
 * @since 0.1
 */
KVC_API kvc_status kvc_pool_get_layout(kvc_pool *pool, kvc_pool_layout *layout);

/**
 * @brief Read back the pool's effective configuration (defaults resolved,
 * num_blocks computed from capacity_bytes when that was given). The codec
 * pointers (and the per-layer codec tables) come back NULL and k_dtype / v_dtype name the plain
 * storage; the
 * storage of quantized parts is described by kvc_pool_get_layout().
 * @param pool the pool (not NULL).
 * @param config filled up to config->struct_size (set struct_size first).
 * @return ::KVC_OK, ::KVC_ERR_NULL_POINTER, ::KVC_ERR_STRUCT_SIZE.
 * @since 0.1
 */
KVC_API kvc_status kvc_pool_get_config(kvc_pool *pool, kvc_pool_config *config);

/**
 * @brief Size one sequence without a pool: the bytes a sequence of n_tokens
 * tokens holds in a pool of `config`, and the most it holds on its way there,
 * as kvc_pool_stats().bytes_in_use would count them for that sequence alone.
 *
 * The sequence grows one token at a time (kvc_seq_reserve() of one token,
 * then kvc_append() of it to every layer) and is never evicted. Per layer it
 * holds the codec blocks of its encoded tokens and the residual blocks of
 * the tokens still staged (a residual window, a hybrid share, a per-channel
 * group waiting to be complete: they move to codec blocks as they age, so
 * the bytes can fall as the sequence grows, and `peak_bytes` is the most),
 * plus its attention-sink blocks. The numbers come from the pool's own block
 * format and staging rules (the sizing of `kvcache recommend`).
 * @param config a configuration kvc_pool_create() would accept (not NULL);
 *        num_blocks, capacity_bytes and num_residual_blocks are ignored.
 * @param n_tokens the sequence's length in tokens (0 gives 0 bytes).
 * @param bytes receives the bytes held at n_tokens (may be NULL); sizes
 *        beyond 2^64 - 1 read as UINT64_MAX.
 * @param peak_bytes receives the most bytes held at any length up to
 *        n_tokens (may be NULL).
 * @return ::KVC_OK, ::KVC_ERR_NULL_POINTER (config), ::KVC_ERR_STRUCT_SIZE,
 *         and what kvc_pool_create() returns for a configuration it refuses
 *         (::KVC_ERR_INVALID_ARGUMENT, ::KVC_ERR_UNSUPPORTED,
 *         ::KVC_ERR_INVALID_SCALE, ::KVC_ERR_OVERFLOW,
 *         ::KVC_ERR_DEVICE_UNAVAILABLE for a CUDA configuration in a build
 *         without CUDA); never ::KVC_ERR_OUT_OF_MEMORY for the pool's size
 *         (nothing is allocated: a host may size a pool it could not hold).
 * @since 0.4 (table version 5)
 */
KVC_API kvc_status kvc_pool_seq_bytes(const kvc_pool_config *config, uint64_t n_tokens,
                                      uint64_t *bytes, uint64_t *peak_bytes);

/* ------------------------------------------------------------------------ */
/* Device streams and block copies                                          */
/* ------------------------------------------------------------------------ */

/**
 * @brief Queue the pool's device work on an engine's CUDA stream.
 *
 * Pools on ::KVC_DEVICE_CUDA queue every kernel and copy (kvc_append(),
 * kvc_gather(), kvc_attention_decode(), kvc_attention_prefill(), copy-on-write,
 * eviction compaction, kvc_pool_copy_blocks()) on this stream, in call order.
 * Until it is set, a pool uses a non-blocking stream of its own. Calls whose
 * pointers are all device memory return as soon as their work is queued;
 * calls given host memory (pageable or pinned) wait for their work. Pass the
 * stream as `cudaStream_t` cast to `void *`; NULL selects the legacy default
 * stream. The stream must stay valid while the pool uses it.
 * @param pool the pool (not NULL).
 * @param stream a CUDA stream of the pool's device, or NULL.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER (pool); ::KVC_ERR_INVALID_ARGUMENT
 * (a non-NULL stream for a CPU pool, whose work runs on the calling thread).
 * @since 0.3
 */
KVC_API kvc_status kvc_pool_set_stream(kvc_pool *pool, void *stream);

/**
 * @brief Wait for the pool's queued device work and report device-side errors.
 *
 * Kernels cannot report a bad value when they run without stopping the
 * engine, so a CUDA pool records them in a device-side error flag: an
 * kvc_append() whose K or V holds NaN or Inf (for quantized parts) writes
 * nothing, sets the flag and returns ::KVC_OK at once. The next kvc_pool_sync()
 * waits for the stream, returns ::KVC_ERR_NON_FINITE with a message naming how
 * many appends were refused, and clears the flag. CPU pools check on the
 * calling thread and have nothing to wait for.
 * @param pool the pool (not NULL).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_NON_FINITE (appends
 * refused since the last sync, none of their values written);
 * ::KVC_ERR_INTERNAL (the CUDA runtime reported an error; the message names it).
 * @since 0.3
 */
KVC_API kvc_status kvc_pool_sync(kvc_pool *pool);

/** @brief Direction of kvc_pool_copy_blocks(). @since 0.3 */
typedef enum kvc_copy_direction {
  KVC_COPY_TO_HOST = 0,                             /**< Blocks to a host buffer (swap out). */
  KVC_COPY_FROM_HOST = 1,                           /**< A host buffer into blocks (swap in). */
  KVC_COPY_DIRECTION_FORCE_32BIT = 0x7fffffff,      /**< Forces a 32-bit enum; not a value. */
  KVC_COPY_DIRECTION_FORCE_SIGNED = -0x7fffffff - 1 /**< Forces a signed enum; not a value. */
} kvc_copy_direction;

/**
 * @brief Copy whole blocks between the pool and a host buffer (swap out and
 * in, as vLLM's swap_blocks).
 *
 * Block `blocks[i]` occupies bytes `[i * bytes_per_block, (i + 1) *
 * bytes_per_block)` of `host` (kvc_stats::bytes_per_block), codes, scales and
 * zero points exactly as the pool stores them. The pool's block tables are
 * not changed: the engine decides which blocks it swaps (block ids from
 * kvc_seq_block_table()). On a CUDA pool the copies are queued on the pool's
 * stream and the call returns at once when `host` is page-locked memory
 * (cudaHostAlloc / cudaHostRegister); with pageable memory it waits. Blocks
 * written from the host must be held by a sequence; they leave the prefix
 * index (their content changed), and every sequence sharing one (forks,
 * attached prefixes) sees the new content: no copy-on-write. A copy from the
 * host counts as writing every slot of the block (since 0.4); a copy to the
 * host carries zeros in the slots no one wrote since the block was taken, so
 * a swap out and back in never turns an earlier owner's bytes into this
 * sequence's (CPU pools zero them in the host buffer, CUDA pools zero a block
 * on the device when it is taken and reserved slots at reserve). `host` must not
 * overlap the pool's memory.
 * @param pool the pool (not NULL).
 * @param blocks `[n_blocks]` block ids, each 0..num_blocks-1.
 * @param n_blocks number of blocks (0 does nothing).
 * @param host `[n_blocks * bytes_per_block]` bytes.
 * @param direction ::KVC_COPY_TO_HOST or ::KVC_COPY_FROM_HOST.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_OUT_OF_RANGE (a block
 * id; nothing copied); ::KVC_ERR_INVALID_ARGUMENT (direction, or a block
 * written from the host that no sequence holds; nothing copied);
 * ::KVC_ERR_OVERFLOW (more than 2^40 bytes); ::KVC_ERR_INTERNAL (the CUDA
 * runtime failed); ::KVC_ERR_UNSUPPORTED (a pool with per-layer codecs: its
 * blocks differ in size; nothing copied).
 * @since 0.3
 */
KVC_API kvc_status kvc_pool_copy_blocks(kvc_pool *pool, const int32_t *blocks, size_t n_blocks,
                                        void *host, kvc_copy_direction direction);

/* ------------------------------------------------------------------------ */
/* Sequences                                                                */
/* ------------------------------------------------------------------------ */

/**
 * @brief Create an empty sequence (length 0, no blocks).
 * @param pool the pool (not NULL).
 * @param seq_id any 64-bit value chosen by the caller, unique among live sequences.
 * @return ::KVC_OK, ::KVC_ERR_NULL_POINTER, ::KVC_ERR_SEQ_EXISTS, ::KVC_ERR_OUT_OF_MEMORY.
 * @since 0.1
 */
KVC_API kvc_status kvc_seq_create(kvc_pool *pool, uint64_t seq_id);

/**
 * @brief Fork: create `child_id` sharing every block of `parent_id` (copy-on-write).
 *
 * The child has the parent's length and, per layer, the same block table;
 * each shared block's reference count goes up by one. No K/V bytes are
 * copied. The first write by either sequence into a shared block copies that
 * block first (kvc_seq_reserve() and kvc_append() do it), so each sees only
 * its own writes. O(blocks of the parent). Pools with attention sinks
 * (kvc_pool_config.residual_sinks) copy the parent's sink blocks: the child
 * gets its own.
 * @param pool the pool (not NULL).
 * @param parent_id a live sequence.
 * @param child_id an id no live sequence has.
 * @return ::KVC_OK, ::KVC_ERR_NULL_POINTER, ::KVC_ERR_SEQ_NOT_FOUND (parent),
 * ::KVC_ERR_SEQ_EXISTS (child), ::KVC_ERR_POOL_EXHAUSTED (no free residual
 * blocks for the sink copies; no child), ::KVC_ERR_OUT_OF_MEMORY.
 * @since 0.1
 */
KVC_API kvc_status kvc_seq_fork(kvc_pool *pool, uint64_t parent_id, uint64_t child_id);

/**
 * @brief Drop every token at position >= `new_length` (llama.cpp's seq_rm
 * with an open end); blocks left empty are released. Later writes at those
 * positions replace them. Truncating to the current length or more is a no-op.
 * Cutting a per-channel group of encoded tokens moves the group's remaining
 * tokens back to the residual (dequantized), which needs a free residual block.
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param new_length the sequence's new length in tokens.
 * @return ::KVC_OK, ::KVC_ERR_NULL_POINTER, ::KVC_ERR_SEQ_NOT_FOUND,
 * ::KVC_ERR_POOL_EXHAUSTED (no residual block to re-stage a cut per-channel group;
 * nothing changed).
 * @since 0.1
 */
KVC_API kvc_status kvc_seq_truncate(kvc_pool *pool, uint64_t seq_id, uint64_t new_length);

/**
 * @brief Free a sequence: release its blocks (shared ones stay with their
 * other owners) and forget its id.
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @return ::KVC_OK, ::KVC_ERR_NULL_POINTER, ::KVC_ERR_SEQ_NOT_FOUND (also for a
 * second free of the same id).
 * @since 0.1
 */
KVC_API kvc_status kvc_seq_free(kvc_pool *pool, uint64_t seq_id);

/**
 * @brief Length of a sequence: the next position to write (reserved
 * positions included).
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param length receives the length in tokens.
 * @return ::KVC_OK, ::KVC_ERR_NULL_POINTER, ::KVC_ERR_SEQ_NOT_FOUND.
 * @since 0.1
 */
KVC_API kvc_status kvc_seq_length(kvc_pool *pool, uint64_t seq_id, uint64_t *length);

/**
 * @brief Number of tokens a layer of a sequence holds (reserved slots
 * included). Equals the length until eviction drops tokens from the layer.
 * In a head-wise pool (::KVC_POOL_HEADWISE): the most any KV head of the
 * layer holds (kvc_seq_head_tokens() gives each head's).
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param layer 0..num_layers-1.
 * @param n_tokens receives the count.
 * @return ::KVC_OK, ::KVC_ERR_NULL_POINTER, ::KVC_ERR_SEQ_NOT_FOUND,
 * ::KVC_ERR_OUT_OF_RANGE (layer >= num_layers).
 * @since 0.1
 */
KVC_API kvc_status kvc_seq_layer_tokens(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                        uint64_t *n_tokens);

/**
 * @brief Reserve slots for `n_new` tokens at positions [length, length + n_new)
 * in every layer, all or nothing, and extend the length by n_new.
 *
 * Allocates blocks as needed and first copies a shared, partly filled last
 * block (copy-on-write). Does not write K/V; kvc_append() does.
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param n_new tokens to add, >= 1.
 * @param slot_mapping NULL, or receives `[num_layers][n_new]` int64 slots
 * (`block_id * block_size + offset`) of the new positions (a head-wise pool,
 * ::KVC_POOL_HEADWISE: `[num_layers][num_kv_heads][n_new]`, one per head's table); in a pool with a
 * residual arena (a residual window, hybrid precision, a per-channel codec or
 * residual_sinks) the new positions are in residual blocks and the slots
 * index the residual arena. With a residual window, reserving also encodes the oldest
 * residual tokens beyond the window (positions before this call, already
 * written) into codec blocks and frees the residual blocks they leave.
 * The new slots count as unwritten until kvc_append() writes them: readers
 * (kvc_gather(), attention, records) return zeros for them, and
 * kvc_prefix_insert() does not register their blocks.
 *
 * Admission (since 0.4): ::KVC_ERR_EXCEEDS_CAPACITY when the request can
 * never fit: the sequence alone would hold more blocks than the pool has
 * (its blocks shared with other sequences counted once, cached blocks as
 * room, since an empty pool would have them; residual and attention-sink
 * blocks against the residual arena's total), so re-queuing it never
 * helps; the message gives the blocks needed and the total. With an
 * auto-evicting policy the count is of what the sequence holds after that
 * eviction. ::KVC_ERR_POOL_EXHAUSTED only when it would fit once other
 * sequences free blocks ("not now"; the message gives needed and available).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_SEQ_NOT_FOUND;
 * ::KVC_ERR_INVALID_ARGUMENT (n_new 0); ::KVC_ERR_OVERFLOW (length would
 * exceed 2^31 - 1); ::KVC_ERR_EXCEEDS_CAPACITY (never fits, above; nothing
 * reserved); ::KVC_ERR_POOL_EXHAUSTED (not enough free blocks for all
 * layers, or residual blocks for the residual and, at a sequence's first
 * reserve, its attention-sink copies; nothing reserved). Nothing reserved
 * means no other change either, but for an attached auto-evicting policy's
 * eviction, which is made first and stays (the tokens it dropped were
 * over the policy's cap for this reservation);
 * ::KVC_ERR_OUT_OF_MEMORY; with an attached
 * auto-evicting policy (::kvc_policy_config.auto_evict), also the statuses of
 * kvc_evict() (e.g. ::KVC_ERR_NON_FINITE from a plugin's scores).
 * @since 0.1
 */
KVC_API kvc_status kvc_seq_reserve(kvc_pool *pool, uint64_t seq_id, uint64_t n_new,
                                   int64_t *slot_mapping);

/* ------------------------------------------------------------------------ */
/* Writing and reading K/V                                                  */
/* ------------------------------------------------------------------------ */

/**
 * @brief Write K and V rows of `n_tokens` tokens at positions
 * [pos, pos + n_tokens) into one layer, converting from `src_dtype` to the
 * storage dtypes.
 *
 * The positions must be reserved (below the length) and still held by the
 * layer as the contiguous tail written since the layer's last eviction;
 * writing a position again replaces it. A block shared with another sequence
 * is copied first (copy-on-write), so other sequences never see the write.
 * With a residual window (or per-channel keys), a write that ends at the
 * layer's newest reserved position also encodes the layer's residual tokens
 * that left the window, as kvc_seq_reserve() would (positions before the last
 * reserve are taken as written; that reserve's own positions only when this
 * write covers them all), so a per-channel group leaves its staging in the
 * append that completes it; without free blocks they wait for the next reserve.
 * No heap allocation (except, then, growing the layer's block table).
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param layer 0..num_layers-1.
 * @param pos position of the first token written.
 * @param n_tokens tokens to write, >= 1.
 * @param k `[n_tokens][num_kv_heads][head_dim]` of src_dtype, row-major.
 * @param v same shape and dtype as k.
 * @param src_dtype element type of k and v (f32, f16 or bf16).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_SEQ_NOT_FOUND;
 * ::KVC_ERR_OUT_OF_RANGE (layer); ::KVC_ERR_INVALID_ARGUMENT (n_tokens 0,
 * unknown src_dtype); ::KVC_ERR_NOT_RESERVED (a position at or beyond the
 * length, or no longer held by the layer); ::KVC_ERR_POOL_EXHAUSTED (no free
 * block for a copy-on-write; nothing written); ::KVC_ERR_NON_FINITE (NaN or
 * Inf in k or v for fp8 / integer storage, or values too large for its
 * rotation; nothing written); ::KVC_ERR_OVERFLOW (n_tokens too large).
 * CUDA pools: k and v may be device or host memory (host memory makes the
 * call wait for its work); NaN / Inf is found on the device, so the call
 * returns ::KVC_OK, writes nothing, and kvc_pool_sync() reports
 * ::KVC_ERR_NON_FINITE (see there); ::KVC_ERR_INTERNAL when the CUDA runtime
 * fails.
 * @since 0.1
 */
KVC_API kvc_status kvc_append(kvc_pool *pool, uint64_t seq_id, uint32_t layer, uint64_t pos,
                              uint64_t n_tokens, const void *k, const void *v, kvc_dtype src_dtype);

/**
 * @brief Gather one layer's K and/or V for the tokens with indices
 * [first, first + n_tokens) of that layer (index = order in the layer's block
 * table; equal to the position until eviction), converted to `dst_dtype`.
 * A token whose slot was reserved but not written by kvc_append() (or
 * restored, loaded or copied in from the host) reads as zeros, never as
 * bytes another sequence left there (since 0.4; CPU pools check the
 * written-slot bits, CUDA pools zero the reserved slots on the device).
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param layer 0..num_layers-1.
 * @param first index of the first token read.
 * @param n_tokens tokens to read (0 is valid).
 * @param k_out NULL or `[n_tokens][num_kv_heads][head_dim]` of dst_dtype.
 * @param v_out NULL or the same shape for V.
 * @param dst_dtype element type written to k_out and v_out (f32, f16 or bf16).
 * @param positions_out NULL or `[n_tokens]` int32: the position of each token.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER (all three outputs NULL);
 * ::KVC_ERR_SEQ_NOT_FOUND; ::KVC_ERR_OUT_OF_RANGE (layer, or the range
 * beyond the layer's tokens); ::KVC_ERR_INVALID_ARGUMENT (dst_dtype).
 * n_tokens 0 is valid and writes nothing. CUDA pools: k_out and v_out may
 * be device or host memory (host memory makes the call wait); positions_out
 * is host memory; ::KVC_ERR_INTERNAL when the CUDA runtime fails.
 * @since 0.1
 */
KVC_API kvc_status kvc_gather(kvc_pool *pool, uint64_t seq_id, uint32_t layer, uint64_t first,
                              uint64_t n_tokens, void *k_out, void *v_out, kvc_dtype dst_dtype,
                              int32_t *positions_out);

/**
 * @brief Copy the block table of one layer of a sequence.
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param layer 0..num_layers-1.
 * @param block_ids NULL (to query the count) or receives up to `capacity` int32 block ids,
 * in order.
 * @param capacity entries block_ids can hold.
 * @param n_blocks receives the number of blocks the table holds (also
 * on ::KVC_ERR_BUFFER_TOO_SMALL).
 * @return ::KVC_OK, ::KVC_ERR_NULL_POINTER (n_blocks), ::KVC_ERR_SEQ_NOT_FOUND,
 * ::KVC_ERR_OUT_OF_RANGE (layer), ::KVC_ERR_BUFFER_TOO_SMALL.
 * @since 0.1
 */
KVC_API kvc_status kvc_seq_block_table(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                       int32_t *block_ids, size_t capacity, size_t *n_blocks);

/**
 * @brief Export the block tables of a batch of sequences for one layer as
 * FlashInfer's paged-KV page table (CSR form).
 *
 * For sequence i, its pages are `indices[indptr[i] .. indptr[i+1])` and
 * `last_page_len[i]` tokens of its last page are valid (1..block_size; 0 for
 * an empty sequence, which has no pages). Counts include reserved slots,
 * which hold stale bytes until written (see kvc_pool_get_layout()).
 * @param pool the pool (not NULL).
 * @param layer 0..num_layers-1.
 * @param seq_ids `[n_seqs]` sequence ids (repeats allowed).
 * @param n_seqs 0..2^31-1.
 * @param indptr receives `[n_seqs + 1]` int32, indptr[0] = 0.
 * @param indices receives the block ids, int32, at most `indices_capacity`.
 * @param indices_capacity entries indices can hold.
 * @param last_page_len receives `[n_seqs]` int32.
 * @param n_indices receives the total number of block ids (also on ::KVC_ERR_BUFFER_TOO_SMALL).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_SEQ_NOT_FOUND;
 * ::KVC_ERR_OUT_OF_RANGE (layer); ::KVC_ERR_BUFFER_TOO_SMALL (only n_indices written);
 * ::KVC_ERR_OVERFLOW (more than 2^31-1 indices).
 * @since 0.1
 */
KVC_API kvc_status kvc_export_page_table(kvc_pool *pool, uint32_t layer, const uint64_t *seq_ids,
                                         size_t n_seqs, int32_t *indptr, int32_t *indices,
                                         size_t indices_capacity, int32_t *last_page_len,
                                         size_t *n_indices);

/**
 * @brief Number of tokens one KV head of a layer holds. In a head-wise pool
 * (::KVC_POOL_HEADWISE) heads hold different counts after a head-wise
 * eviction; in a token-wise pool every head holds the layer's tokens.
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param layer 0..num_layers-1.
 * @param head 0..num_kv_heads-1.
 * @param n_tokens receives the count.
 * @return ::KVC_OK, ::KVC_ERR_NULL_POINTER, ::KVC_ERR_SEQ_NOT_FOUND,
 * ::KVC_ERR_OUT_OF_RANGE (layer, head).
 * @since 0.4
 */
KVC_API kvc_status kvc_seq_head_tokens(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                       uint32_t head, uint64_t *n_tokens);

/**
 * @brief Copy out tokens [first, first + n) of one KV head of a layer, as
 * kvc_gather() does for a whole layer (any codec decoded, unwritten slots as
 * zeros). Token i is the head's i-th held token (kvc_seq_head_tokens()).
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param layer 0..num_layers-1.
 * @param head 0..num_kv_heads-1.
 * @param first first token index.
 * @param n tokens to copy (0 is allowed).
 * @param k_out NULL or receives `[n][head_dim]` keys of dtype `dst`.
 * @param v_out NULL or receives `[n][head_dim]` values of dtype `dst`.
 * @param dst ::KVC_DTYPE_F32, ::KVC_DTYPE_F16 or ::KVC_DTYPE_BF16.
 * @param positions_out NULL or receives `[n]` int32 text positions.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_SEQ_NOT_FOUND;
 * ::KVC_ERR_OUT_OF_RANGE (layer, head, or the range past the head's tokens);
 * ::KVC_ERR_INVALID_ARGUMENT (dst).
 * @since 0.4
 */
KVC_API kvc_status kvc_gather_head(kvc_pool *pool, uint64_t seq_id, uint32_t layer, uint32_t head,
                                   uint64_t first, uint64_t n, void *k_out, void *v_out,
                                   kvc_dtype dst, int32_t *positions_out);

/**
 * @brief Copy the block table of one KV head of a layer: in a head-wise pool
 * (::KVC_POOL_HEADWISE) the head's own blocks (each holds `block_size`
 * tokens of that head only); in a token-wise pool the layer's table, whose
 * blocks hold every head.
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param layer 0..num_layers-1.
 * @param head 0..num_kv_heads-1.
 * @param block_ids NULL (to query the count) or receives up to `capacity` int32 block ids.
 * @param capacity entries block_ids can hold.
 * @param n_blocks receives the number of blocks (also on ::KVC_ERR_BUFFER_TOO_SMALL).
 * @return ::KVC_OK, ::KVC_ERR_NULL_POINTER (n_blocks), ::KVC_ERR_SEQ_NOT_FOUND,
 * ::KVC_ERR_OUT_OF_RANGE (layer, head), ::KVC_ERR_BUFFER_TOO_SMALL.
 * @since 0.4
 */
KVC_API kvc_status kvc_seq_head_block_table(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                            uint32_t head, int32_t *block_ids, size_t capacity,
                                            size_t *n_blocks);

/**
 * @brief kvc_export_page_table() for a head-wise pool (::KVC_POOL_HEADWISE):
 * one row per (sequence, KV head), row `i x num_kv_heads + h` for head h of
 * sequence i, so a paged kernel (FlashInfer's, with a batch of
 * n_seqs x num_kv_heads single-head requests) reads each head's own pages.
 * @param pool the pool (not NULL).
 * @param layer 0..num_layers-1.
 * @param seq_ids `[n_seqs]` sequence ids (repeats allowed).
 * @param n_seqs with num_kv_heads, at most 2^31-1 rows.
 * @param indptr receives `[n_seqs x num_kv_heads + 1]` int32, indptr[0] = 0.
 * @param indices receives the block ids, int32, at most `indices_capacity`.
 * @param indices_capacity entries indices can hold.
 * @param last_page_len receives `[n_seqs x num_kv_heads]` int32 (0 for an empty head).
 * @param n_indices receives the total number of block ids (also on ::KVC_ERR_BUFFER_TOO_SMALL).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_SEQ_NOT_FOUND;
 * ::KVC_ERR_OUT_OF_RANGE (layer); ::KVC_ERR_BUFFER_TOO_SMALL (only n_indices
 * written); ::KVC_ERR_OVERFLOW (more than 2^31-1 rows or indices);
 * ::KVC_ERR_UNSUPPORTED (a token-wise pool: use kvc_export_page_table()).
 * @since 0.4
 */
KVC_API kvc_status kvc_export_head_page_table(kvc_pool *pool, uint32_t layer,
                                              const uint64_t *seq_ids, size_t n_seqs,
                                              int32_t *indptr, int32_t *indices,
                                              size_t indices_capacity, int32_t *last_page_len,
                                              size_t *n_indices);

/* ------------------------------------------------------------------------ */
/* Element conversion                                                       */
/* ------------------------------------------------------------------------ */

/**
 * @brief Convert `n` elements between f32, f16 and bf16 (round to nearest even).
 * @param src `[n]` of src_dtype.
 * @param src_dtype element type of src.
 * @param dst `[n]` of dst_dtype; may not overlap src.
 * @param dst_dtype element type of dst.
 * @param n number of elements.
 * @return ::KVC_OK, ::KVC_ERR_NULL_POINTER (n > 0 and a NULL buffer),
 * ::KVC_ERR_INVALID_ARGUMENT (dtype).
 * @since 0.1
 */
KVC_API kvc_status kvc_convert(const void *src, kvc_dtype src_dtype, void *dst, kvc_dtype dst_dtype,
                               size_t n);

/**
 * @brief Bytes of one element of a dtype (4 for f32, 2 for f16 and bf16).
 * @param dtype the element type.
 * @param bytes receives the size.
 * @return ::KVC_OK, ::KVC_ERR_NULL_POINTER, ::KVC_ERR_INVALID_ARGUMENT.
 * @since 0.1
 */
KVC_API kvc_status kvc_dtype_size(kvc_dtype dtype, size_t *bytes);

/* ------------------------------------------------------------------------ */
/* Codecs: per-tensor scales and the standalone quantizer                   */
/* ------------------------------------------------------------------------ */

/**
 * @brief The per-tensor scales of one layer of a pool whose K and/or V codec
 * is ::KVC_SCALE_PER_TENSOR (0 for a part that has none or is not calibrated
 * yet: dynamic scales are fixed by the layer's first kvc_append(); a
 * full-range codec's is negative when that write's extreme value is positive).
 * @param pool the pool (not NULL).
 * @param layer 0..num_layers-1.
 * @param k_scale NULL or receives K's scale.
 * @param v_scale NULL or receives V's scale.
 * @return ::KVC_OK, ::KVC_ERR_NULL_POINTER (pool), ::KVC_ERR_OUT_OF_RANGE (layer).
 * @since 0.2
 */
KVC_API kvc_status kvc_pool_tensor_scales(kvc_pool *pool, uint32_t layer, float *k_scale,
                                          float *v_scale);

/**
 * @brief Per-channel key smoothing: keys are stored as the K codec's codes of
 * `(k[c] - offset[c]) / scale[c]` for each channel c of a token's row
 * `[num_kv_heads * head_dim]`, and read back (kvc_gather(), attention,
 * records restored into a pool with the same smoothing) as
 * `decoded[c] * scale[c] + offset[c]`.
 *
 * Keys have a few channels of much larger magnitude than the rest (and
 * channels with a mean far from zero), so one scale per token must cover the
 * outlier channels and the others get few levels. Dividing each channel by its
 * calibrated magnitude flattens them (SmoothAttention, QServe arXiv
 * 2405.04532), and subtracting its calibrated mean removes the offsets that
 * KVQuant (arXiv 2401.18079) calibrates per channel, so per-token (or
 * per-group) key codes get close to per-channel accuracy with no staging of
 * tokens (per-channel codecs stage up to group_size - 1 tokens in
 * residual_dtype). `kvcache calibrate` fits the arrays from a model run
 * (docs/codecs.md gives the file format). With ::KVC_POOL_PRE_ROPE_KEYS the
 * smoothing applies to the keys before RoPE (where channel statistics do not
 * turn with the position); with a Hadamard rotation the smoothed row is
 * rotated. Per-tensor dynamic key scales are calibrated again by the first
 * smoothed write. A smoothed value whose magnitude reaches
 * FLT_MAX / (2 x max(1, rotation_block)) saturates there, and a read-back
 * value beyond FLT_MAX saturates to it. Prefix-cache keys, offloaded blocks
 * and kvc_seq_save() records carry a digest of the arrays, so they match only
 * pools with the same ones. Readers of the raw blocks (kvc_pool_get_layout(),
 * page tables) see the smoothed codes.
 *
 * @param pool the pool (not NULL): a CPU pool, token-wise, whose k_codec is
 * quantized, holding no sequence and without a prefix cache (set smoothing
 * right after kvc_pool_create()).
 * @param scale `[num_layers][num_kv_heads][head_dim]` f32, each finite in
 * [1e-30, 1e30]; NULL with count 0 removes the smoothing.
 * @param offset NULL (zeros) or the same shape, each finite in [-1e30, 1e30].
 * @param count entries of scale: num_layers x num_kv_heads x head_dim (0 with scale NULL).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER (pool; scale with count above 0);
 * ::KVC_ERR_INVALID_ARGUMENT (float keys, a count other than the pool's, a
 * scale or offset out of range (the message names layer and channel), a pool
 * holding sequences or with its prefix cache enabled);
 * ::KVC_ERR_UNSUPPORTED (a CUDA pool, a head-wise pool);
 * ::KVC_ERR_OUT_OF_MEMORY. A refused call changes nothing.
 * @since 0.4
 */
KVC_API kvc_status kvc_pool_set_key_smoothing(kvc_pool *pool, const float *scale,
                                              const float *offset, size_t count);

/**
 * @brief Sets a codebook of the pool's keys or values: non-uniform levels
 * that their codes index instead of the evenly spaced integers.
 *
 * The part's codec must be a symmetric int4, int3 or int2 codec with
 * per-token or per-group scales (::KVC_SCALE_PER_TOKEN, ::KVC_SCALE_PER_GROUP), neither
 * asymmetric nor full_range nor with outliers. With a codebook, for each
 * scale group with signed extreme e (the value of largest magnitude, the
 * first of equal ones, its sign kept) a value x gets the b-bit code of the
 * level of its layer nearest to x / e (computed as x * (1 / e), as
 * (2^64 x) * (1 / (2^64 e)) when e is so small 1 / e overflows; the lower
 * level on a tie); the group stores the scale s = sign(e) x |x| /
 * |levels[codes]| (L2 norms of the group: the decoded group keeps its norm;
 * saturated to +-65504 with f16 scales, +-FLT_MAX with f32), and reads back
 * (kvc_gather(), attention, records, tiers) as `levels[layer][code] * s`.
 * Values of a Hadamard rotation (rotation_block)
 * are rotated before and after, as with uniform codes. Bits per value are
 * those of the codec (the levels are stored once per pool, not per block).
 *
 * Levels fitted to the distribution of the normalized values lose less than
 * the uniform grid: KVQuant (arXiv 2401.18079) fits non-uniform levels per
 * layer offline, TurboQuant (arXiv 2504.19874) uses the Lloyd-Max levels of
 * the near-Gaussian values a rotation makes; kvc_codebook_gaussian() gives
 * those. Prefix-cache keys, offloaded blocks and kvc_seq_save() records carry
 * a digest of the levels, so they match only pools with the same codebooks.
 * Readers of the raw blocks (kvc_pool_get_layout(), page tables) see the
 * codes and scales above (docs/codecs.md, "Codebooks").
 *
 * @param pool the pool (not NULL): a CPU pool, token-wise, holding no sequence
 * and without a prefix cache (set codebooks right after kvc_pool_create()).
 * @param part 0: keys (k_codec), 1: values (v_codec).
 * @param levels `[num_layers][2^bits]` f32 (bits of the part's codec), each
 * finite in [-1, 1], strictly ascending within a layer; NULL with count 0
 * removes the part's codebook. A pool with per-layer codecs
 * (kvc_pool_config::layer_k_codecs): each layer's 2^bits levels in turn, bits
 * of that layer's codec; a layer whose codec is int8 or fp8 takes no levels
 * (0 entries: its uniform codes stay, so sensitive layers can keep 8 bits
 * beside codebook layers), every other layer's codec must take a codebook,
 * and at least one layer must.
 * @param count entries of levels: num_layers x 2^bits, or the sum over the layers of 2^bits
 * (int8 and fp8 layers: 0) (0 with levels NULL).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER (pool; levels with count above 0);
 * ::KVC_ERR_INVALID_ARGUMENT (part not 0 or 1, a codec that does not take
 * a codebook, per-layer codecs where every layer is int8 or fp8, per-group scales whose group_size
 * does not divide a token's num_kv_heads x head_dim values, a count other than the pool's, a level
 * out of range or out of order (the message names layer and level), a pool holding sequences or
 * with its prefix cache enabled); ::KVC_ERR_UNSUPPORTED (a CUDA pool, a head-wise pool);
 * ::KVC_ERR_OUT_OF_MEMORY. A refused call changes nothing.
 * @since 0.4
 */
KVC_API kvc_status kvc_pool_set_codebook(kvc_pool *pool, uint32_t part, const float *levels,
                                         size_t count);

/**
 * @brief The built-in codebook for rotated values: the Lloyd-Max levels of
 * groups of `group_size` independent Gaussian values normalized by their
 * signed extreme (the table of the nearest power of two in [8, 1024]),
 * written by bench/calib/lloyd_max.py (TurboQuant arXiv 2504.19874 applies
 * Lloyd-Max levels to the near-Gaussian coordinates of a rotation).
 *
 * @param bits 2, 3 or 4.
 * @param group_size values per scale group (head_dim for per-token scales),
 * 1 or more.
 * @param levels receives 2^bits ascending f32 levels in [-1, 1] (not NULL).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER (levels); ::KVC_ERR_INVALID_ARGUMENT
 * (bits outside 2..4, group_size 0).
 * @since 0.4
 */
KVC_API kvc_status kvc_codebook_gaussian(uint32_t bits, uint64_t group_size, float *levels);

/**
 * @brief Buffer sizes kvc_quantize() needs for an array `[n][d]`. Init with kvc_quant_sizes_init().
 * @since 0.2
 */
typedef struct kvc_quant_sizes {
  size_t struct_size;    /**< sizeof(kvc_quant_sizes) of the caller. */
  uint64_t codes_bytes;  /**< n rows of ceil(d * bits / 8) bytes. */
  uint64_t scales_bytes; /**< num_scales entries of scale_dtype (0 for float dtypes). */
  uint64_t zeros_bytes;  /**< Same as scales_bytes for asymmetric codecs, else 0. */
  /** 1 (per tensor), n (per token), n * ceil(d / G) (per group), ceil(n / G) * d (per channel). */
  uint64_t num_scales;
} kvc_quant_sizes;

/** @brief Fill sizes with struct_size (the 0.3 size, below) and zeros.
 * The function of this name is the 0.3 entry point (for binaries built
 * against 0.3 headers and the ::kvc_api table): it fills the struct's 0.3
 * size (40 bytes on x86-64), forever; source code calling
 * kvc_quant_sizes_init() gets the macro of that name, which passes the caller's
 * sizeof to kvc_quant_sizes_init_sized().
 * @param sizes the struct to fill (not NULL).
 * @return ::KVC_OK or ::KVC_ERR_NULL_POINTER. @since 0.2 */
KVC_API kvc_status kvc_quant_sizes_init(kvc_quant_sizes *sizes);

/**
 * @brief Fill the first `struct_size` bytes of a sizes struct as kvc_quant_sizes_init()
 * does, with struct_size set to `struct_size`: the caller's struct, of its
 * header's size. Never writes past `struct_size` bytes; the bytes past this
 * library's sizeof(kvc_quant_sizes) (fields of a newer header) are zeroed.
 * @param sizes the caller's struct (not NULL), `struct_size` bytes.
 * @param struct_size the caller's sizeof(kvc_quant_sizes): at least 40 (the whole 0.2 struct),
 * not ending inside a field, at most ::KVC_STRUCT_SIZE_MAX.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE (a size
 * refused as above; the message names the field it cuts). Nothing is
 * written on failure.
 * @since 0.4
 */
KVC_API kvc_status kvc_quant_sizes_init_sized(kvc_quant_sizes *sizes, size_t struct_size);

/**
 * @brief kvc_quant_sizes_init() in source code: kvc_quant_sizes_init_sized() with
 * the caller's sizeof, so it fills exactly the caller's struct.
 * @param sizes a `kvc_quant_sizes *` (evaluated once; a literal NULL has no
 * struct type in C++ (GNU C takes sizeof(void) as 1 and the call then returns
 * ::KVC_ERR_NULL_POINTER): call kvc_<thing>_init_sized() for that).
 * @since 0.4 (a function before, which remains exported for 0.3 binaries)
 */
#define kvc_quant_sizes_init(sizes) kvc_quant_sizes_init_sized((sizes), sizeof *(sizes))

/**
 * @brief Sizes of the buffers kvc_quantize() writes for `[n][d]`.
 * @param codec the codec (not NULL).
 * @param n rows (tokens), 0..2^40.
 * @param d values per row, 1..2^24.
 * @param sizes filled up to sizes->struct_size.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE;
 * ::KVC_ERR_INVALID_ARGUMENT (dtype, granularity, group size, rotation block
 * not dividing d, n or d out of range); ::KVC_ERR_INVALID_SCALE.
 * @since 0.2
 */
KVC_API kvc_status kvc_quantize_sizes(const kvc_codec *codec, uint64_t n, uint64_t d,
                                      kvc_quant_sizes *sizes);

/**
 * @brief Quantize an array `[n][d]` with a codec (the pool's quantizer,
 * standalone). Byte layouts: docs/codecs.md (little-endian scales; int4:
 * element 2i in the low nibble of byte i; int2: element 4i+j in bits 2j..2j+1;
 * int3: element j in bits 3j..3j+2 of the row's bytes read as one
 * little-endian bit string, 8 elements in 3 bytes, a row padded to whole
 * bytes; symmetric int4 / int3 / int2 codes stored as q + 8 / q + 4 / q + 2).
 * @param codec the codec (not NULL).
 * @param src `[n][d]` of src_dtype (f32, f16 or bf16), row-major.
 * @param src_dtype element type of src.
 * @param n rows (as for kvc_quantize_sizes()).
 * @param d values per row.
 * @param codes receives codes_bytes bytes.
 * @param scales receives scales_bytes bytes (NULL allowed when 0).
 * @param zeros receives zeros_bytes bytes (NULL allowed when 0).
 * @return ::KVC_OK; the statuses of kvc_quantize_sizes();
 * ::KVC_ERR_NON_FINITE (NaN or Inf in src: nothing written);
 * ::KVC_ERR_OUT_OF_MEMORY.
 * @since 0.2
 */
KVC_API kvc_status kvc_quantize(const kvc_codec *codec, const void *src, kvc_dtype src_dtype,
                                uint64_t n, uint64_t d, void *codes, void *scales, void *zeros);

/**
 * @brief Dequantize what kvc_quantize() wrote back to `[n][d]` of dst_dtype
 * (undoing the rotation, if any).
 * @param codec the codec used to quantize (not NULL).
 * @param codes the codes kvc_quantize() wrote.
 * @param scales its scales (NULL allowed when there are none).
 * @param zeros its zero points (NULL allowed when there are none).
 * @param n rows.
 * @param d values per row.
 * @param dst receives `[n][d]` of dst_dtype.
 * @param dst_dtype f32, f16 or bf16.
 * @return ::KVC_OK; the statuses of kvc_quantize_sizes(); ::KVC_ERR_OUT_OF_MEMORY.
 * @since 0.2
 */
KVC_API kvc_status kvc_dequantize(const kvc_codec *codec, const void *codes, const void *scales,
                                  const void *zeros, uint64_t n, uint64_t d, void *dst,
                                  kvc_dtype dst_dtype);

/* ------------------------------------------------------------------------ */
/* Attention over the cache                                                 */
/* ------------------------------------------------------------------------ */

/**
 * @brief What an attention call records of each cached token's attention
 * probability, for the eviction policies (kept per sequence, layer, token
 * and KV head; summed over the query heads of each KV head).
 * @since 0.3
 */
typedef enum kvc_observe {
  KVC_OBSERVE_NONE = 0,       /**< Record nothing (default). */
  KVC_OBSERVE_ACCUMULATE = 1, /**< Add to the running total (H2O's accumulated attention). */
  KVC_OBSERVE_REPLACE = 2,    /**< Replace it with this call's (TOVA: the latest query only). */
  /**
   * Add the observed query rows to the sequence's query statistics instead (per layer and query
   * head: their count, mean and covariance, taken back to the pre-RoPE frame when the pool has
   * rope_style), for ::KVC_POLICY_EXPECTED_ATTENTION; no score is recorded. Prefill observes
   * rows observe_from.. at their positions, decode each sequence's query at its newest token's.
   * CPU pools (a CUDA pool refuses it: use kvc_seq_observe_queries() with host copies).
   * @since 0.4
   */
  KVC_OBSERVE_QUERIES = 3,
  /**
   * Raise each recorded score to this call's probability where that is larger: after any number
   * of calls a token's score is the largest attention probability any observed query row and any
   * query head of its KV head gave it (KVzip's max-pooling, for ::KVC_POLICY_KVZIP: observe the
   * context-reconstruction pass). CPU pools.
   * @since 0.4
   */
  KVC_OBSERVE_MAX = 4,
  KVC_OBSERVE_FORCE_32BIT = 0x7fffffff, /**< Forces a 32-bit enum; not a value. */
  KVC_OBSERVE_FORCE_SIGNED = INT32_MIN  /**< Forces a signed enum; not a value. */
} kvc_observe;

/**
 * @brief How decode attention forms the query . key products over integer-coded keys.
 * @since 0.4
 */
typedef enum kvc_query_quant {
  /** The query in f32 against the keys' codes (default; the same results on every CPU path). */
  KVC_QUERY_EXACT = 0,
  /**
   * Each query head (after RoPE and the scale) quantized to int8 codes with one f32 scale,
   * max |q| / 127, and dotted with int8 / uint8 / int4 key codes in integers (AVX-512 VNNI
   * `vpdpbusd`, 32 products an instruction); the values and the softmax stay f32. The approach
   * of llama.cpp's CPU attention, which converts the query to the key type's dot-product type.
   * A score q.k moves by at most (max |q| / 254) x sum |k| (the query's rounding; the keys are
   * as before); an observe mode records the probabilities of these scores. Where the CPU also has
   * AMX-INT8 (Intel Sapphire Rapids and later) and Linux grants the process the tile state (asked
   * once, by the first decode that could use it: `arch_prctl(ARCH_REQ_XCOMP_PERM)`, after which the
   * kernel refuses a `sigaltstack` too small for the larger signal frame; the environment variable
   * `KVCACHE_NO_AMX`, set and not "0", keeps the library from asking), int8 and uint8 keys are
   * scored 16 tokens at a time on the AMX tiles (`TDPBSSD` / `TDPBUSD`): the same integer sums, so
   * the same results. The decode releases the calling thread's tiles when it has used them.
   * Used by CPU decode (one query row per sequence)
   * where the CPU has AVX-512 VNNI and VL, the layer's keys are int8, uint8 or int4 codes with
   * per-token scales and head_dim is a multiple of 32, over the blocks the decode reads in place:
   * such keys without a rotation, and values stored plainly (f16 / bf16 / f32) or as int8 / uint8
   * / int4 / fp8 codes with per-token, per-group (within each head) or per-channel scales,
   * Hadamard-rotated or not; no codebook, outliers, pre-RoPE keys or key smoothing; outside the
   * attention sinks' copies and unwritten slots. Everything else (f16 / bf16 / f32 / fp8 keys,
   * keys with per-group or per-channel scales or a rotation, other blocks, prefill, CUDA pools,
   * older CPUs) computes as ::KVC_QUERY_EXACT.
   */
  KVC_QUERY_INT8 = 1,
  /**
   * The keys as ::KVC_QUERY_INT8; and where the values are symmetric int8 or int4 codes with
   * per-token scales and no rotation (full range or not; whatever the keys), their weighted sum in
   * integers too:
   * for each run of consecutive tokens the decode takes together (at most 8 blocks) and each query
   * head, the weights w = p x s (p = e^(score - running max), s = the token's value scale, negative
   * for a full-range code's positive extreme) are rounded to integers w' = round(w / u), u = their
   * largest magnitude / 32767, and the codes are summed as u x sum(w' x code) with AVX-512 VNNI
   * `vpdpwssd` (two tokens and eight dimensions an instruction; 32-bit sums flushed every 256
   * tokens for int8 codes, every 4,096 for int4). Each weight moves by at most u / 2 (2^-16 of its
   * run's largest), so an output element moves by at most C x (the sum over runs of n x u) /
   * sum(p) beyond the f32 sum of the same weights, C = half the largest code magnitude (64 for
   * int8, 4 for int4), n the run's tokens, with the weights and p taken relative to the row's final
   * maximum score (at most C x tokens x the largest |w| / 32767 / sum(p)). A run whose largest |w|
   * is below 2^-100 (not 0) is summed in f32. The f32 exponentials and the softmax's sum are
   * unchanged. Other values are summed as with ::KVC_QUERY_EXACT; where the mode does not apply at
   * all (no AVX-512 VNNI, head_dim not a multiple of 32, prefill, CUDA pools), everything is
   * ::KVC_QUERY_EXACT. @since 0.4
   */
  KVC_QUERY_INT8_VALUES = 2,
  KVC_QUERY_FORCE_32BIT = 0x7fffffff, /**< Forces a 32-bit enum; not a value. */
  KVC_QUERY_FORCE_SIGNED = INT32_MIN  /**< Forces a signed enum; not a value. */
} kvc_query_quant;

/**
 * @brief Parameters of kvc_attention_decode() and kvc_attention_prefill().
 * Init with kvc_attention_params_init().
 * @since 0.3
 */
typedef struct kvc_attention_params {
  size_t struct_size; /**< sizeof(kvc_attention_params) of the caller. */
  /**
   * Query heads; must equal the pool's num_q_heads (query head h uses KV head
   * h / (num_q_heads / num_kv_heads)).
   */
  uint32_t num_q_heads;
  float scale;         /**< Multiplies q.k; 0 (default) = 1 / sqrt(head_dim). */
  kvc_dtype q_dtype;   /**< Element type of q: f32 (default), f16 or bf16. */
  kvc_dtype out_dtype; /**< Element type of out: f32 (default), f16 or bf16. */
  kvc_observe observe; /**< Record attention for eviction policies; default none. */
  /**
   * Threads for this call, the caller's included: 0 or 1 (default) = the calling thread only;
   * 2..256 spread a decode batch over threads by sequence and, for batches smaller than the thread
   * count, by token ranges of at least 256 tokens merged by log-sum-exp (FlashDecoding); a prefill
   * chunk by blocks of 32 query rows (the same output bytes as one thread; since 0.4). Observing
   * calls use the calling thread.
   */
  uint32_t num_threads;
  /**
   * Prefill: first query row whose attention is recorded (SnapKV's observation window = the last
   * rows); default 0.
   */
  uint64_t observe_from;
  /**
   * Decode: ::KVC_QUERY_EXACT (default), ::KVC_QUERY_INT8 (an int8 query against integer keys,
   * faster, within the bound its doc gives) or ::KVC_QUERY_INT8_VALUES (also int8 values summed
   * in integers, within its bound). @since 0.4
   */
  kvc_query_quant query_quant;
} kvc_attention_params;

/**
 * @brief Fill attention params with defaults: f32 q and out, scale 0
 * (1/sqrt(head_dim)), no observation; num_q_heads 0 (must be set).
 * The function of this name is the 0.3 entry point (for binaries built
 * against 0.3 headers and the ::kvc_api table): it fills the struct's 0.3
 * size (40 bytes on x86-64), forever; source code calling
 * kvc_attention_params_init() gets the macro of that name, which passes the caller's
 * sizeof to kvc_attention_params_init_sized().
 * @param params the struct to fill (not NULL).
 * @return ::KVC_OK, or ::KVC_ERR_NULL_POINTER.
 * @since 0.3
 */
KVC_API kvc_status kvc_attention_params_init(kvc_attention_params *params);

/**
 * @brief Fill the first `struct_size` bytes of attention params as kvc_attention_params_init()
 * does, with struct_size set to `struct_size`: the caller's struct, of its
 * header's size. Never writes past `struct_size` bytes; the bytes past this
 * library's sizeof(kvc_attention_params) (fields of a newer header) are zeroed.
 * @param params the caller's struct (not NULL), `struct_size` bytes.
 * @param struct_size the caller's sizeof(kvc_attention_params): at least 40 (the whole 0.3 struct),
 * not ending inside a field, at most ::KVC_STRUCT_SIZE_MAX.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE (a size
 * refused as above; the message names the field it cuts). Nothing is
 * written on failure.
 * @since 0.4
 */
KVC_API kvc_status kvc_attention_params_init_sized(kvc_attention_params *params,
                                                   size_t struct_size);

/**
 * @brief kvc_attention_params_init() in source code: kvc_attention_params_init_sized() with
 * the caller's sizeof, so it fills exactly the caller's struct.
 * @param params a `kvc_attention_params *` (evaluated once; a literal NULL has no
 * struct type in C++ (GNU C takes sizeof(void) as 1 and the call then returns
 * ::KVC_ERR_NULL_POINTER): call kvc_<thing>_init_sized() for that).
 * @since 0.4 (a function before, which remains exported for 0.3 binaries)
 */
#define kvc_attention_params_init(params) \
  kvc_attention_params_init_sized((params), sizeof *(params))

/**
 * @brief Decode attention: one query token per sequence against every token
 * the layer holds for that sequence, for a batch of sequences.
 *
 * out = softmax(scale x q K^T) V per query head, computed over the pool's
 * blocks block by block with an online softmax (running max and sum, as
 * FlashAttention; no score matrix), dequantizing any codec on the fly and
 * reading residual (high-precision) tokens from their own blocks. Grouped
 * queries: query head h reads KV head h / (num_q_heads / num_kv_heads). A
 * sequence holding no token gives zeros and a log-sum-exp of -inf (never
 * NaN). The query's own K/V must be appended first if it should attend to
 * itself (as vLLM and FlashInfer do). A token whose slot was reserved but
 * not written counts as a zero key and value row (as kvc_gather() reads it).
 * @param pool the pool (not NULL).
 * @param layer 0..num_layers-1.
 * @param seq_ids `[n_seqs]` live sequences (a sequence may appear more than once).
 * @param n_seqs batch size, >= 1.
 * @param q `[n_seqs][num_q_heads][head_dim]` of params->q_dtype, after RoPE.
 * @param out `[n_seqs][num_q_heads][head_dim]` of params->out_dtype.
 * @param lse NULL or `[n_seqs][num_q_heads]` f32: natural log of the sum of
 * exp(scale x q.k) over the tokens (for merging partial results).
 * @param params the parameters (not NULL).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE;
 * ::KVC_ERR_SEQ_NOT_FOUND; ::KVC_ERR_OUT_OF_RANGE (layer);
 * ::KVC_ERR_INVALID_ARGUMENT (n_seqs 0, num_q_heads not the pool's, bad
 * scale, dtype, observe mode or query_quant); ::KVC_ERR_NON_FINITE (NaN or Inf in q, or
 * q x scale beyond f32; nothing written); ::KVC_ERR_OVERFLOW;
 * ::KVC_ERR_OUT_OF_MEMORY. On failure out and lse are not written and no
 * score is recorded. A score q.k beyond f32 (finite inputs can overflow) is
 * clamped to +-FLT_MAX, so the output stays defined. Threads: calls run
 * concurrently with each other and with kvc_seq_scores(); two calls recording
 * the same sequence and layer at once give unspecified scores, and attention
 * over a layer while kvc_append() writes the same sequence and layer reads
 * old or new values (never a crash). CUDA pools: q, out and lse may be device
 * or host memory (host memory makes the call wait); q is not checked for
 * NaN / Inf on the device (a NaN query gives NaN in its rows); observation
 * gives ::KVC_ERR_UNSUPPORTED; num_threads is ignored.
 * @since 0.3
 */
KVC_API kvc_status kvc_attention_decode(kvc_pool *pool, uint32_t layer, const uint64_t *seq_ids,
                                        size_t n_seqs, const void *q, void *out, float *lse,
                                        const kvc_attention_params *params);

/**
 * @brief Prefill attention: the last `n_q` tokens the layer holds (a chunk
 * whose K/V were just appended) attend causally to every token before them
 * and to themselves: query i is the layer's token n - n_q + i and sees tokens
 * [0, n - n_q + i].
 * @param pool the pool (not NULL).
 * @param layer 0..num_layers-1.
 * @param seq_id a live sequence.
 * @param q `[n_q][num_q_heads][head_dim]` of params->q_dtype.
 * @param n_q query rows, 1..the layer's token count.
 * @param out `[n_q][num_q_heads][head_dim]` of params->out_dtype.
 * @param lse NULL or `[n_q][num_q_heads]` f32.
 * @param params the parameters (not NULL); observe_from selects the rows
 * whose attention is recorded.
 * @return as kvc_attention_decode(), plus ::KVC_ERR_OUT_OF_RANGE when n_q
 * exceeds the layer's tokens and ::KVC_ERR_INVALID_ARGUMENT when n_q is 0.
 * @since 0.3
 */
KVC_API kvc_status kvc_attention_prefill(kvc_pool *pool, uint32_t layer, uint64_t seq_id,
                                         const void *q, uint64_t n_q, void *out, float *lse,
                                         const kvc_attention_params *params);

/**
 * @brief Feed attention scores computed by the engine's own kernels (the
 * alternative to observing through kvc_attention_*).
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param layer 0..num_layers-1.
 * @param scores `[n_tokens][num_kv_heads]` f32, finite and >= 0.
 * @param n_tokens must equal the layer's token count.
 * @param accumulate non-zero: add to the recorded scores; 0: replace them.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_SEQ_NOT_FOUND;
 * ::KVC_ERR_OUT_OF_RANGE (layer); ::KVC_ERR_INVALID_ARGUMENT (n_tokens);
 * ::KVC_ERR_NON_FINITE (a negative, NaN or Inf score; nothing changed).
 * @since 0.3
 */
KVC_API kvc_status kvc_seq_observe_scores(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                          const float *scores, uint64_t n_tokens, int accumulate);

/**
 * @brief Feed query rows computed by the engine's own attention to a layer's
 * query statistics (the alternative to ::KVC_OBSERVE_QUERIES), for
 * ::KVC_POLICY_EXPECTED_ATTENTION. Rows are taken back to the pre-RoPE frame
 * at their positions when the pool has rope_style (as keys are given: rotated
 * at `positions`), then added to the running count, sum and sum of outer
 * products per query head (f64).
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param layer 0..num_layers-1.
 * @param q `[n][num_q_heads][head_dim]` in q_dtype, host memory (not NULL when n > 0).
 * @param q_dtype ::KVC_DTYPE_F32, ::KVC_DTYPE_F16 or ::KVC_DTYPE_BF16.
 * @param n query rows (0: nothing to do), at most 2^31.
 * @param num_q_heads must equal the pool's num_q_heads.
 * @param positions `[n]` RoPE positions of the rows, >= 0 (not NULL when n > 0).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_SEQ_NOT_FOUND;
 * ::KVC_ERR_OUT_OF_RANGE (layer); ::KVC_ERR_INVALID_ARGUMENT (num_q_heads,
 * q_dtype, a negative position); ::KVC_ERR_OVERFLOW (n); ::KVC_ERR_NON_FINITE
 * (NaN or Inf in q); ::KVC_ERR_OUT_OF_MEMORY. Nothing changes on failure.
 * @since 0.4
 */
KVC_API kvc_status kvc_seq_observe_queries(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                           const void *q, kvc_dtype q_dtype, uint64_t n,
                                           uint32_t num_q_heads, const int32_t *positions);

/**
 * @brief Read the recorded attention scores of a layer (zeros when nothing
 * was recorded).
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param layer 0..num_layers-1.
 * @param out `[n_tokens][num_kv_heads]` f32.
 * @param n_tokens must equal the layer's token count.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_SEQ_NOT_FOUND;
 * ::KVC_ERR_OUT_OF_RANGE (layer); ::KVC_ERR_BUFFER_TOO_SMALL (n_tokens is not
 * the layer's count; nothing written).
 * @since 0.3
 */
KVC_API kvc_status kvc_seq_scores(kvc_pool *pool, uint64_t seq_id, uint32_t layer, float *out,
                                  uint64_t n_tokens);

/**
 * @brief The RoPE positions at which the engine must rotate the keys (and
 * queries) of tokens at positions [pos, pos + n) of a layer: the positions
 * themselves, or, once an eviction with shift_positions has re-rotated the
 * layer (StreamingLLM), their indices within the cache.
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param layer 0..num_layers-1.
 * @param n number of positions.
 * @param pos first position; [pos, pos + n) must be reserved and be the
 * layer's tail (written since its last eviction).
 * @param out `[n]` int32.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_SEQ_NOT_FOUND;
 * ::KVC_ERR_OUT_OF_RANGE.
 * @since 0.3
 */
KVC_API kvc_status kvc_seq_rope_positions(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                          uint64_t pos, uint64_t n, int32_t *out);

/* ------------------------------------------------------------------------ */
/* Eviction policies and scorer plugins                                     */
/* ------------------------------------------------------------------------ */

/**
 * @brief Eviction policy families.
 * @since 0.3
 */
typedef enum kvc_policy_kind {
  KVC_POLICY_NONE = 0, /**< Keep every token. */
  /**
   * StreamingLLM (Xiao et al., arXiv 2309.17453): the first sink_tokens (attention sinks) + the
   * newest tokens. sink_tokens 0 = a sliding window.
   */
  KVC_POLICY_STREAMING = 1,
  /**
   * H2O (Zhang et al., arXiv 2306.14048): the newest floor(recent_fraction x budget) tokens + the
   * heavy hitters (highest accumulated attention) among the rest. Needs observed
   * scores (KVC_OBSERVE_ACCUMULATE).
   */
  KVC_POLICY_H2O = 2,
  /**
   * SnapKV (Li et al., arXiv 2404.14469): after prefill, the last `window` tokens + the prefix
   * tokens with the highest window attention, pooled along the tokens (kernel_size, pooling). Per
   * layer (summed over KV heads).
   */
  KVC_POLICY_SNAPKV = 3,
  /**
   * PyramidKV (Cai et al., arXiv 2406.02069): SnapKV's selection under per-layer budgets that fall
   * from the first layer to the last (schedule, beta).
   */
  KVC_POLICY_PYRAMIDKV = 4,
  /**
   * TOVA (Oren et al., arXiv 2401.06104): the tokens with the highest attention from the latest
   * query (KVC_OBSERVE_REPLACE), summed over heads.
   */
  KVC_POLICY_TOVA = 5,
  /** Scores from a loaded plugin (kvcache_plugin.h) + the newest recent_tokens. */
  KVC_POLICY_PLUGIN = 6,
  /**
   * Key norm (Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache
   * Compression", arXiv 2406.11430; kvpress's KnormPress): the tokens whose keys have the
   * smallest L2 norm, averaged over the KV heads, + the newest recent_tokens. Reads the layer's
   * keys (dequantized to f32) at eviction; needs no observed scores, so it runs beside any
   * attention implementation. A RoPE rotation keeps a key's norm: pre-RoPE and rotated keys
   * rank alike.
   * @since 0.4
   */
  KVC_POLICY_KNORM = 7,
  /**
   * ExpectedAttention (Devoto et al., "Expected Attention: KV Cache Compression by Estimating
   * Attention from Future Queries Distribution", arXiv 2510.00636; kvpress's
   * ExpectedAttentionPress): each layer's future queries are modelled per query head as a
   * Gaussian with the mean mu and covariance S of the queries the sequence observed
   * (::KVC_OBSERVE_QUERIES or kvc_seq_observe_queries()), turned by the mean RoPE rotation R
   * over the next future_positions positions (from the sequence's length on): mu' = R mu,
   * S' = R S R^T. A key k is expected to get exp(mu'.k / sqrt(d) + k^T S' k / (2d)), the mean of
   * exp(q.k / sqrt(d)) under that Gaussian; normalized over the scored tokens (a softmax per query
   * head), averaged over the query heads of each KV head, times the value's L2 norm, summed over
   * KV heads. The first sink_tokens and the newest recent_tokens are kept; the rest are ranked.
   * The approximation: queries are taken as Gaussian and the rotation as its average; the
   * statistics are all queries observed (kvpress: the prompt's, without its sinks). Eviction of a
   * layer with no observed query fails (::KVC_ERR_INVALID_ARGUMENT). Statistics are not saved
   * in records (kvc_seq_save); kvc_seq_truncate() keeps them; a fork copies them. Memory:
   * q_heads x head_dim x (head_dim + 1) f64 per layer of an observing sequence (a Llama-3-8B
   * shape: 128 MiB), not counted in kvc_pool_seq_bytes(). Cost: O(rows x q_heads x head_dim^2)
   * per observation (summed outside the pool's lock) and O(tokens x q_heads x head_dim^2) per
   * layer and eviction (under it).
   * @since 0.4
   */
  KVC_POLICY_EXPECTED_ATTENTION = 8,
  /**
   * KVzip (Kim et al., "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction",
   * arXiv 2505.23416; kvpress's KVzipPress): a token's importance is the largest attention it
   * receives while the model reconstructs the context from the cache. The engine runs that pass
   * (a fork of the sequence fed a repeat prompt and the context again, observed with
   * ::KVC_OBSERVE_MAX, or its own kernels' maxima given with kvc_seq_observe_scores()); the
   * policy keeps the first sink_tokens (attention sinks), the newest recent_tokens and, between
   * them, the tokens with the highest score summed over the KV heads (a token-wise pool keeps a
   * token for all heads; KVzip itself ranks each head's tokens apart). Under compression_ratio
   * (budget_tokens 0) the layers share their budgets as kvpress's KVzipPress does by default:
   * the same total, floor(n x (1 - ratio)) per layer summed, is kept by one score threshold over
   * every layer's ranked tokens, so layers whose tokens score higher keep more (at least 1 and at
   * most all per layer); with budget_tokens set, budgets are not shared. Measured on SmolLM2-135M
   * (docs/eval.md): shared budgets cut the mean KL at 50 % kept from 1.5e-2 to 2.6e-3.
   * Eviction of a sequence with no observed score fails (::KVC_ERR_INVALID_ARGUMENT). A fork
   * copies its parent's scores: when the parent recorded any, zero the fork's first
   * (kvc_seq_observe_scores with zeros, accumulate 0), or the maxima include them.
   * Query-agnostic: the kept set serves any later question. Cost: the engine's reconstruction
   * pass, about the prefill's again; the eviction sorts every layer's tokens at once.
   * @since 0.4
   */
  KVC_POLICY_KVZIP = 9,
  /**
   * DuoAttention (Xiao et al., "DuoAttention: Efficient Long-Context LLM
   * Inference with Retrieval and Streaming Heads", arXiv 2410.10819): each
   * KV head is a retrieval head (keeps every token) or a streaming head
   * (keeps the first sink_tokens and the newest recent_tokens), by the
   * per-head gates the caller gives (::kvc_policy_config.head_gates: head
   * (l, h) streams when its gate is below gate_threshold). Needs a head-wise
   * pool (::KVC_POOL_HEADWISE; ::KVC_ERR_UNSUPPORTED otherwise) whose layers
   * x KV heads equal num_head_gates (::KVC_ERR_INVALID_ARGUMENT otherwise),
   * and recent_tokens > 0. budget_tokens and compression_ratio are not used:
   * with auto_evict a reserve trims the streaming heads that would pass
   * sink_tokens + recent_tokens. @since 0.4
   */
  KVC_POLICY_DUO_ATTENTION = 10,
  KVC_POLICY_FORCE_32BIT = 0x7fffffff, /**< Forces a 32-bit enum; not a value. */
  KVC_POLICY_FORCE_SIGNED = INT32_MIN  /**< Forces a signed enum; not a value. */
} kvc_policy_kind;

/** @brief Pooling of SnapKV scores along the tokens. @since 0.3 */
typedef enum kvc_pooling {
  KVC_POOLING_MAX = 0,                  /**< Max over the kernel (default). */
  KVC_POOLING_AVG = 1,                  /**< Mean over the kernel. */
  KVC_POOLING_FORCE_32BIT = 0x7fffffff, /**< Forces a 32-bit enum; not a value. */
  KVC_POOLING_FORCE_SIGNED = INT32_MIN  /**< Forces a signed enum; not a value. */
} kvc_pooling;

/** @brief PyramidKV per-layer budget schedules. @since 0.3 */
typedef enum kvc_pyramid_schedule {
  /** The paper's: linear from 2B - B/beta (first layer) to B/beta (last); the total stays L x B. */
  KVC_PYRAMID_PAPER = 0,
  KVC_PYRAMID_LINEAR = 1,               /**< Linear from 1.0 x B (first layer) to 0.2 x B (last). */
  KVC_PYRAMID_FORCE_32BIT = 0x7fffffff, /**< Forces a 32-bit enum; not a value. */
  KVC_PYRAMID_FORCE_SIGNED = INT32_MIN  /**< Forces a signed enum; not a value. */
} kvc_pyramid_schedule;

/**
 * @brief How a head-wise pool (::KVC_POOL_HEADWISE) splits a layer's budget
 * over its KV heads. @since 0.4
 */
typedef enum kvc_head_budget {
  /** Each KV head keeps its own budget B (the layer's, as for a token-wise pool). */
  KVC_HEAD_BUDGET_UNIFORM = 0,
  /**
   * AdaKV (Feng et al., "Ada-KV: Optimizing KV Cache Eviction by Adaptive
   * Budget Allocation for Efficient LLM Inference", arXiv 2407.11550; kvpress
   * AdaKVPress), over any policy's scores: the heads share H x B. Each head
   * keeps what its policy keeps by rule (sinks, windows) and its best
   * floor(head_floor x its own candidate budget) tokens (at least one when the
   * rule keeps none); the rest of the shared budget goes to the best-scoring
   * remaining tokens of all the layer's heads (a head holding fewer tokens
   * than B leaves the rest to the others). With auto_evict the cap is the
   * layer's: its heads share num_kv_heads x budget_tokens, and a reserve
   * evicts when the layer's total would pass it (one head may then hold more
   * than budget_tokens). Needs a head-wise pool (::KVC_ERR_UNSUPPORTED
   * otherwise, when attached or evicting) and a policy that scores tokens
   * (StreamingLLM and DuoAttention: ::KVC_ERR_INVALID_ARGUMENT at create).
   * Under KVzip's budgets shared across layers (a compression_ratio) the
   * floor is taken from each head's own budget inside the shared threshold.
   */
  KVC_HEAD_BUDGET_ADAKV = 1,
  KVC_HEAD_BUDGET_FORCE_32BIT = 0x7fffffff, /**< Forces a 32-bit enum; not a value. */
  /** Forces a signed enum (any int32 can be passed and is checked); not a value. */
  KVC_HEAD_BUDGET_FORCE_SIGNED = INT32_MIN
} kvc_head_budget;

/**
 * @brief Configuration of an eviction policy. Init with
 * kvc_policy_config_init().
 *
 * Budget of a layer holding n tokens (B): min(n, budget_tokens if set,
 * max(1, floor(n x (1 - compression_ratio))) if set) and at least 1
 * (compression_ratio is the fraction dropped, kvpress's convention; 0.7 =
 * keep 30%). Streaming without either uses sink_tokens + recent_tokens.
 * PyramidKV then gives each layer its share of B: B is the layers' average
 * (the first layers hold more, up to 2B; the sum stays at most L x B; every
 * layer keeps at least 1).
 * @since 0.3
 */
typedef struct kvc_policy_config {
  size_t struct_size;   /**< sizeof(kvc_policy_config) of the caller. */
  kvc_policy_kind kind; /**< The family; default ::KVC_POLICY_NONE. */
  uint32_t sink_tokens; /**< Streaming, expected attention, kvzip: attention sinks S (default 4). */
  uint64_t budget_tokens; /**< Per-layer cap in tokens; 0 (default) = none. */
  /** Fraction dropped at each kvc_evict(), in [0, 1); 0 (default) = none. */
  double compression_ratio;
  /**
   * Streaming: window W when no budget is set; plugin, knorm, expected attention, kvzip:
   * protected newest tokens. Default 0.
   */
  uint32_t recent_tokens;
  /** SnapKV / PyramidKV: observation window (newest tokens, always kept); default 32. */
  uint32_t window;
  /**
   * H2O: share of the budget kept as the recent window, in [0, 1]; default 0.5 (the paper's
   * equal split).
   */
  double recent_fraction;
  uint32_t kernel_size;          /**< SnapKV / PyramidKV: odd pooling kernel, 1..1025; default 7. */
  kvc_pooling pooling;           /**< SnapKV / PyramidKV pooling; default max. */
  kvc_pyramid_schedule schedule; /**< PyramidKV schedule; default the paper's. */
  /** PyramidKV (paper schedule): last layer's budget is B / beta; default 20. */
  double beta;
  /**
   * Non-zero: after eviction, keys are re-rotated so token i of the cache has RoPE position i
   * (StreamingLLM); needs the pool's rope_style. Default 0 (keys keep their positions).
   */
  uint32_t shift_positions;
  /**
   * Non-zero: kvc_seq_reserve() first evicts every layer that would exceed budget_tokens (needs
   * budget_tokens, except ::KVC_POLICY_DUO_ATTENTION). That eviction stays even if the
   * reservation then fails. Default 0.
   */
  uint32_t auto_evict;
  /** ::KVC_POLICY_PLUGIN: the scorer (must outlive nothing: the policy keeps it loaded). */
  const kvc_plugin *plugin;
  /**
   * ::KVC_POLICY_EXPECTED_ATTENTION: how many next positions the query rotation is averaged
   * over, 1..1048576; default 512 (kvpress's). @since 0.4
   */
  uint32_t future_positions;
  /** Head-wise pools: how a layer's budget is split over its KV heads; default uniform. @since 0.4
   */
  kvc_head_budget head_budget;
  /**
   * ::KVC_HEAD_BUDGET_ADAKV: the share of a head's own candidate budget it keeps whatever the
   * other heads score, in [0, 1]; default 0.2 (AdaKV's safeguard, kvpress's alpha_safeguard).
   * @since 0.4
   */
  double head_floor;
  /**
   * ::KVC_POLICY_DUO_ATTENTION: `[num_layers][num_kv_heads]` gates in [0, 1] (copied by
   * kvc_policy_create(); NULL with num_head_gates 0 otherwise). @since 0.4
   */
  const float *head_gates;
  uint32_t num_head_gates; /**< Entries of head_gates. @since 0.4 */
  /** ::KVC_POLICY_DUO_ATTENTION: a head whose gate is below it streams; default 0.5. @since 0.4 */
  float gate_threshold;
} kvc_policy_config;

/**
 * @brief Fill a policy config with defaults (see the field comments).
 * The function of this name is the 0.3 entry point (for binaries built
 * against 0.3 headers and the ::kvc_api table): it fills the struct's 0.3
 * size (88 bytes on x86-64), forever; source code calling
 * kvc_policy_config_init() gets the macro of that name, which passes the caller's
 * sizeof to kvc_policy_config_init_sized().
 * @param config the struct to fill (not NULL).
 * @return ::KVC_OK, or ::KVC_ERR_NULL_POINTER.
 * @since 0.3
 */
KVC_API kvc_status kvc_policy_config_init(kvc_policy_config *config);

/**
 * @brief Fill the first `struct_size` bytes of a policy config as kvc_policy_config_init()
 * does, with struct_size set to `struct_size`: the caller's struct, of its
 * header's size. Never writes past `struct_size` bytes; the bytes past this
 * library's sizeof(kvc_policy_config) (fields of a newer header) are zeroed.
 * @param config the caller's struct (not NULL), `struct_size` bytes.
 * @param struct_size the caller's sizeof(kvc_policy_config): at least 88 (the whole 0.3 struct),
 * not ending inside a field, at most ::KVC_STRUCT_SIZE_MAX.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE (a size
 * refused as above; the message names the field it cuts). Nothing is
 * written on failure.
 * @since 0.4
 */
KVC_API kvc_status kvc_policy_config_init_sized(kvc_policy_config *config, size_t struct_size);

/**
 * @brief kvc_policy_config_init() in source code: kvc_policy_config_init_sized() with
 * the caller's sizeof, so it fills exactly the caller's struct.
 * @param config a `kvc_policy_config *` (evaluated once; a literal NULL has no
 * struct type in C++ (GNU C takes sizeof(void) as 1 and the call then returns
 * ::KVC_ERR_NULL_POINTER): call kvc_<thing>_init_sized() for that).
 * @since 0.4 (a function before, which remains exported for 0.3 binaries)
 */
#define kvc_policy_config_init(config) kvc_policy_config_init_sized((config), sizeof *(config))

/**
 * @brief Create a policy from a config (copied).
 * @param config the configuration (read up to config->struct_size).
 * @param out receives the policy; untouched on failure.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE;
 * ::KVC_ERR_UNSUPPORTED; ::KVC_ERR_INVALID_ARGUMENT (unknown kind, pooling
 * or schedule; compression_ratio outside [0, 1) (1 would drop everything:
 * refused), recent_fraction outside [0, 1], even or zero kernel_size, beta
 * outside [1, 1e6], a plugin missing or set on another kind, streaming without
 * a window, auto_evict without budget_tokens; head_budget unknown, head_floor
 * outside [0, 1], AdaKV over StreamingLLM or DuoAttention; DuoAttention without
 * head_gates, a gate or gate_threshold outside [0, 1], recent_tokens 0, more than
 * 2^20 gates, gates set on another kind; ::KVC_ERR_NULL_POINTER: num_head_gates
 * without head_gates); ::KVC_ERR_OUT_OF_MEMORY.
 * @since 0.3
 */
KVC_API kvc_status kvc_policy_create(const kvc_policy_config *config, kvc_policy **out);

/**
 * @brief Release the caller's reference; sequences and pools it is attached
 * to keep their own. NULL is a no-op.
 * @param policy the policy or NULL.
 * @since 0.3
 */
KVC_API void kvc_policy_destroy(kvc_policy *policy);

/**
 * @brief Attach a policy to a sequence (NULL detaches it: the pool's default
 * applies). Policies that need attention scores start recording them here.
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param policy the policy (the sequence keeps a reference), or NULL.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER (pool); ::KVC_ERR_SEQ_NOT_FOUND;
 * ::KVC_ERR_INVALID_ARGUMENT (shift_positions without the pool's RoPE);
 * ::KVC_ERR_UNSUPPORTED (shift_positions with per-tensor key scales, which
 * rotated keys can exceed, unless the keys are pre-RoPE
 * (::KVC_POOL_PRE_ROPE_KEYS); auto_evict in a pool with a residual window).
 * @since 0.3
 */
KVC_API kvc_status kvc_seq_set_policy(kvc_pool *pool, uint64_t seq_id, const kvc_policy *policy);

/**
 * @brief Set the pool's default policy, for sequences without their own
 * (NULL: none).
 * @param pool the pool (not NULL).
 * @param policy the policy (the pool keeps a reference), or NULL.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_INVALID_ARGUMENT
 * (shift_positions without the pool's RoPE); ::KVC_ERR_UNSUPPORTED (as for
 * kvc_seq_set_policy()).
 * @since 0.3
 */
KVC_API kvc_status kvc_pool_set_policy(kvc_pool *pool, const kvc_policy *policy);

/**
 * @brief Evict: each layer keeps its budget of tokens chosen by the policy.
 *
 * Survivors keep their order and are compacted into the fewest blocks; the
 * emptied blocks are freed (kvc_pool_stats() shows it); blocks shared with
 * other sequences (forks) are copied before they are written, so those
 * sequences are unchanged. Survivors keep their positions (kvc_gather()
 * reports them) unless the policy shifts positions, which re-rotates the keys
 * (dequantized, rotated, re-encoded for fp8/integer codecs: within the
 * codec's error). Recorded scores follow their tokens. All or nothing.
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param policy the policy to apply, or NULL: the sequence's, else the pool's
 * default, else nothing is evicted.
 * @param dropped NULL or `[num_layers]`: tokens each layer dropped.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_SEQ_NOT_FOUND;
 * ::KVC_ERR_POOL_EXHAUSTED (no free block for a copy-on-write; nothing
 * changed); ::KVC_ERR_UNSUPPORTED (pools with a residual window, hybrid
 * precision or attention sinks; shifting positions of keys with per-tensor scales,
 * unless they are pre-RoPE);
 * ::KVC_ERR_INVALID_ARGUMENT (shift without RoPE; a plugin that failed);
 * ::KVC_ERR_NON_FINITE (a plugin's score).
 * @since 0.3
 */
KVC_API kvc_status kvc_evict(kvc_pool *pool, uint64_t seq_id, const kvc_policy *policy,
                             uint64_t *dropped);

/**
 * @brief Keep exactly the listed tokens of one layer and drop the others: an
 * eviction whose survivors the caller chose (kvpress's presses, an engine's
 * own scorer), applied as kvc_evict() applies a policy's choice.
 *
 * Survivors keep their order and positions and are compacted into the
 * fewest blocks; the emptied blocks are freed; blocks shared with other
 * sequences (forks, the prefix cache) are copied before they are written.
 * Other layers are unchanged. Recorded scores follow their tokens.
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param layer 0..num_layers-1.
 * @param keep `[n_keep]` indices into the layer's tokens (0 = its oldest
 * held token, as kvc_gather() numbers them), strictly increasing, each below
 * the layer's token count; NULL only when n_keep is 0 (drop every token).
 * @param n_keep survivors, at most the layer's token count (equal: nothing changes).
 * @param dropped NULL or `[1]`: the tokens dropped (a head-wise pool: (token, KV head)
 * pairs, every head kept alike).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_SEQ_NOT_FOUND;
 * ::KVC_ERR_OUT_OF_RANGE (layer; an index not below the token count);
 * ::KVC_ERR_INVALID_ARGUMENT (indices not strictly increasing; n_keep above
 * the token count); ::KVC_ERR_POOL_EXHAUSTED (no free block for a
 * copy-on-write); ::KVC_ERR_UNSUPPORTED (pools with a residual window,
 * hybrid precision or attention sinks). Nothing changes on failure.
 * @since 0.4
 */
KVC_API kvc_status kvc_seq_keep(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                const uint64_t *keep, uint64_t n_keep, uint64_t *dropped);

/**
 * @brief kvc_seq_keep() for one KV head of a head-wise pool
 * (::KVC_POOL_HEADWISE): keep exactly the listed tokens of that head; the
 * other heads and layers are unchanged; the head's emptied blocks are freed.
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param layer 0..num_layers-1.
 * @param head 0..num_kv_heads-1.
 * @param keep `[n_keep]` indices into the head's tokens (as kvc_gather_head()
 * numbers them), strictly increasing; NULL only when n_keep is 0.
 * @param n_keep survivors, at most the head's token count.
 * @param dropped NULL or `[1]`: the tokens dropped.
 * @return as kvc_seq_keep(); also ::KVC_ERR_OUT_OF_RANGE (head) and
 * ::KVC_ERR_UNSUPPORTED (a token-wise pool, whose heads share their tokens).
 * Nothing changes on failure.
 * @since 0.4
 */
KVC_API kvc_status kvc_seq_keep_head(kvc_pool *pool, uint64_t seq_id, uint32_t layer, uint32_t head,
                                     const uint64_t *keep, uint64_t n_keep, uint64_t *dropped);

/**
 * @brief Load a scorer plugin (a shared object implementing
 * kvcache_plugin.h) with dlopen().
 * @param path file path (as dlopen() takes it).
 * @param out receives the plugin; untouched on failure.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_INVALID_ARGUMENT (the
 * file cannot be loaded, has no kvc_plugin_get symbol, or its table lacks a
 * name or a score function); ::KVC_ERR_VERSION (it does not provide
 * the plugin ABI version of kvcache_plugin.h); ::KVC_ERR_STRUCT_SIZE (its table is too small).
 * @since 0.3
 */
KVC_API kvc_status kvc_plugin_load(const char *path, kvc_plugin **out);

/**
 * @brief Release the caller's reference (policies using the plugin keep it
 * loaded). NULL is a no-op.
 * @param plugin the plugin or NULL.
 * @since 0.3
 */
KVC_API void kvc_plugin_unload(kvc_plugin *plugin);

/**
 * @brief Name the plugin gave itself.
 * @param plugin a loaded plugin, or NULL.
 * @return a string owned by the plugin, or NULL for a NULL plugin.
 * @since 0.3
 */
KVC_API const char *kvc_plugin_name(const kvc_plugin *plugin);

/* ------------------------------------------------------------------------ */
/* Prefix cache                                                             */
/* ------------------------------------------------------------------------ */

/**
 * @brief Hash of the prefix cache's block keys (docs/prefix-cache.md).
 * @since 0.3
 */
typedef enum kvc_prefix_hash {
  /** SHA-256 (OpenSSL), 32-byte keys: for tenants that do not trust each other (default). */
  KVC_PREFIX_HASH_SHA256 = 0,
  /** XXH3-128 (xxHash), 16-byte keys: fast, not collision resistant against an adversary. */
  KVC_PREFIX_HASH_XXH3_128 = 1,
  KVC_PREFIX_HASH_FORCE_32BIT = 0x7fffffff, /**< Forces a 32-bit enum; not a value. */
  KVC_PREFIX_HASH_FORCE_SIGNED = INT32_MIN  /**< Forces a signed enum; not a value. */
} kvc_prefix_hash;

/**
 * @brief Prefix cache settings (kvc_pool_enable_prefix_cache()). Init with
 * kvc_prefix_config_init().
 * @since 0.3
 */
typedef struct kvc_prefix_config {
  size_t struct_size;   /**< sizeof(kvc_prefix_config) of the caller. */
  kvc_prefix_hash hash; /**< Key hash; default SHA-256. */
  /**
   * Non-zero (default): every hit compares the cached block's token ids with the query's, so even a
   * forced hash collision never returns foreign KV.
   */
  uint32_t verify_tokens;
  /**
   * 0 (default): the chain's root is seeded with 32 random bytes (keys differ per pool); non-zero:
   * with `seed` (keys survive restarts and match other pools with the same seed).
   */
  uint32_t seed_set;
  uint8_t seed[32];     /**< The root seed when seed_set. */
  const char *model_id; /**< Caller's model identity mixed into the root (NULL = ""). Copied. */
  /** Caller's tokenizer identity mixed into the root (NULL = ""). Copied. */
  const char *tokenizer_id;
  /**
   * Names of the extra keys (`[n_extra_key_names]` NUL-terminated strings,
   * e.g. "salt", "adapter", "media"; NULL when n_extra_key_names is 0).
   * Copied at kvc_pool_enable_prefix_cache(). Each name is non-empty, at most
   * ::KVC_PREFIX_MAX_EXTRA_KEY_NAME_BYTES bytes and unique. With names, every
   * call taking extra keys passes exactly one value per name, in this order
   * (size 0: none), and the block keys mix the names with the values (the
   * named encoding of docs/prefix-cache.md): salt "x" and adapter "x" never
   * share a key, while the declaration order and names left empty do not
   * change a key. Without names (default) extra keys are positional, as in
   * 0.3 (the legacy form: keys, tier records and their contents unchanged).
   * @since 0.4
   */
  const char *const *extra_key_names;
  /**
   * Number of extra_key_names, at most ::KVC_PREFIX_MAX_EXTRA_KEY_NAMES
   * (0, the default: positional extra keys).
   * @since 0.4
   */
  uint32_t n_extra_key_names;
} kvc_prefix_config;

/** @brief Most extra-key names a prefix configuration declares
 * (kvc_prefix_config::n_extra_key_names). @since 0.4 */
#define KVC_PREFIX_MAX_EXTRA_KEY_NAMES 64
/** @brief Most bytes of one extra-key name, without its NUL (kvc_prefix_config::extra_key_names).
 * @since 0.4 */
#define KVC_PREFIX_MAX_EXTRA_KEY_NAME_BYTES 64

/**
 * @brief One extra key mixed into every block key (tenant salt, adapter id,
 * multimodal hash...). A pool with declared names
 * (kvc_prefix_config::extra_key_names) takes one per name, in declaration
 * order (size 0: no value for that name); a pool without names takes any
 * number, positionally (the legacy form).
 * @since 0.3
 */
typedef struct kvc_prefix_extra {
  const void *data; /**< Bytes (may be NULL when size is 0). */
  size_t size;      /**< Byte count, at most 1 MiB. */
} kvc_prefix_extra;

/** @brief Result of kvc_prefix_lookup() / kvc_prefix_attach(). @since 0.3 */
typedef struct kvc_prefix_result {
  size_t struct_size; /**< sizeof(kvc_prefix_result) of the caller. */
  /**
   * Leading tokens reusable as whole cached blocks (a multiple of block_size, at most
   * n_tokens - 1).
   */
  uint64_t hit_tokens;
  uint64_t hit_blocks; /**< hit_tokens / block_size. */
  /**
   * With ::KVC_PREFIX_PARTIAL: tokens after hit_tokens that match a cached block's start (copied
   * into a fresh block by kvc_prefix_attach()); 0 otherwise.
   */
  uint64_t partial_tokens;
  /**
   * kvc_prefix_lookup() of a pool with offload tiers: whole-block tokens after hit_tokens that the
   * tiers hold (kvc_prefix_load() brings them into the pool); 0 otherwise.
   * @since 0.3
   */
  uint64_t tier_tokens;
  /**
   * With ::KVC_PREFIX_PIN: the pin handle for kvc_prefix_unpin() (0: nothing was pinned).
   * @since 0.3
   */
  uint64_t pin;
} kvc_prefix_result;

/**
 * @brief Flag of kvc_prefix_lookup() / kvc_prefix_attach(): also reuse a partly matching next block
 * (SGLang-style, token-granular).
 * @since 0.3
 */
#define KVC_PREFIX_PARTIAL 0x1u
/**
 * @brief Flag of kvc_prefix_lookup(): pin the tier blocks counted in tier_tokens (host and disk
 * tiers) so LRU replacement keeps them until kvc_prefix_unpin().
 * @since 0.3
 */
#define KVC_PREFIX_PIN 0x2u

/** @brief Prefix index events for an external router. @since 0.3 */
typedef enum kvc_prefix_event_kind {
  KVC_PREFIX_STORED = 0,  /**< A block was registered under `key`. */
  KVC_PREFIX_REMOVED = 1, /**< A block left the index (reclaimed, rewritten or its parent left). */
  KVC_PREFIX_EVENT_FORCE_32BIT = 0x7fffffff, /**< Forces a 32-bit enum; not a value. */
  /** Forces a signed enum, as every other enum of this header; not a value. @since 0.4 */
  KVC_PREFIX_EVENT_FORCE_SIGNED = INT32_MIN
} kvc_prefix_event_kind;

/** @brief One prefix index event. @since 0.3 */
typedef struct kvc_prefix_event {
  size_t struct_size;         /**< sizeof(kvc_prefix_event) of the library. */
  kvc_prefix_event_kind kind; /**< Stored or removed. */
  /** Bytes of key and parent_key (32 for SHA-256, 16 for XXH3-128). */
  uint32_t key_size;
  const uint8_t *key;        /**< The block's key (valid during the callback only). */
  const uint8_t *parent_key; /**< Its parent's key (the root for the first block). */
  uint64_t depth;            /**< 1 for a prompt's first block, 2 for the second... */
} kvc_prefix_event;

/**
 * @brief Receives prefix index events. Called synchronously, from the thread
 * whose call changed the index, while the pool is locked: it must not call
 * into the pool.
 * @since 0.3
 */
typedef void (*kvc_prefix_event_fn)(void *user, const kvc_prefix_event *event);

/** @brief Prefix cache counters (kvc_prefix_get_stats()). @since 0.3 */
typedef struct kvc_prefix_stats {
  size_t struct_size;         /**< sizeof(kvc_prefix_stats) of the caller. */
  uint64_t queried_tokens;    /**< Tokens passed to lookup and attach. */
  uint64_t hit_tokens;        /**< Whole-block tokens they found. */
  uint64_t partial_tokens;    /**< Token-granular matches they found. */
  uint64_t registered_blocks; /**< Blocks (each spanning all layers) in the index now. */
  /** Of those, held by no sequence (cached; reclaimed in LRU order when room is needed). */
  uint64_t reclaimable_blocks;
  /** Of those, held by a sequence (registered = reclaimable + referenced). */
  uint64_t referenced_blocks;
  uint64_t stored_total;    /**< Blocks ever registered. */
  uint64_t removed_total;   /**< Blocks ever removed from the index. */
  uint64_t reclaimed_total; /**< Of those, reclaimed for reuse. */
} kvc_prefix_stats;

/**
 * @brief Fill a prefix config with defaults: SHA-256, token verification on,
 * a random seed, empty model and tokenizer ids.
 * The function of this name is the 0.3 entry point (for binaries built
 * against 0.3 headers and the ::kvc_api table): it fills the struct's 0.3
 * size (72 bytes on x86-64), forever; source code calling
 * kvc_prefix_config_init() gets the macro of that name, which passes the caller's
 * sizeof to kvc_prefix_config_init_sized().
 * @param config the struct to fill (not NULL).
 * @return ::KVC_OK, or ::KVC_ERR_NULL_POINTER.
 * @since 0.3
 */
KVC_API kvc_status kvc_prefix_config_init(kvc_prefix_config *config);

/**
 * @brief Fill the first `struct_size` bytes of a prefix config as kvc_prefix_config_init()
 * does, with struct_size set to `struct_size`: the caller's struct, of its
 * header's size. Never writes past `struct_size` bytes; the bytes past this
 * library's sizeof(kvc_prefix_config) (fields of a newer header) are zeroed.
 * @param config the caller's struct (not NULL), `struct_size` bytes.
 * @param struct_size the caller's sizeof(kvc_prefix_config): at least 72 (the whole 0.3 struct),
 * not ending inside a field, at most ::KVC_STRUCT_SIZE_MAX.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE (a size
 * refused as above; the message names the field it cuts). Nothing is
 * written on failure.
 * @since 0.4
 */
KVC_API kvc_status kvc_prefix_config_init_sized(kvc_prefix_config *config, size_t struct_size);

/**
 * @brief kvc_prefix_config_init() in source code: kvc_prefix_config_init_sized() with
 * the caller's sizeof, so it fills exactly the caller's struct.
 * @param config a `kvc_prefix_config *` (evaluated once; a literal NULL has no
 * struct type in C++ (GNU C takes sizeof(void) as 1 and the call then returns
 * ::KVC_ERR_NULL_POINTER): call kvc_<thing>_init_sized() for that).
 * @since 0.4 (a function before, which remains exported for 0.3 binaries)
 */
#define kvc_prefix_config_init(config) kvc_prefix_config_init_sized((config), sizeof *(config))

/**
 * @brief Turn on the prefix cache of a pool (once). Full blocks registered with
 * kvc_prefix_insert() stay findable after their sequences are freed (cached,
 * reference count 0) until the pool needs the room: reclaimed least recently
 * released first, a chain from its end (children before parents).
 *
 * Block identity (docs/prefix-cache.md): a block's key chains its parent's
 * key, its block_size token ids and the extra keys; the root mixes the seed,
 * the pool's geometry and storage (a fingerprint) and the model and tokenizer
 * ids. Like vLLM's chained block hashes, with SHA-256 by default and optional
 * token verification. With declared extra-key names
 * (kvc_prefix_config::extra_key_names, 0.4) the names enter the keys with
 * their values.
 * @param pool the pool (not NULL).
 * @param config the settings (not NULL).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER (also extra_key_names NULL with
 * n_extra_key_names above 0, or one of its names NULL); ::KVC_ERR_STRUCT_SIZE;
 * ::KVC_ERR_UNSUPPORTED (a pool with a residual window, hybrid precision,
 * a per-channel codec or attention sinks; unknown non-zero fields); ::KVC_ERR_INVALID_ARGUMENT
 * (already enabled, unknown hash; more than ::KVC_PREFIX_MAX_EXTRA_KEY_NAMES extra-key names, an
 * empty name, one longer than ::KVC_PREFIX_MAX_EXTRA_KEY_NAME_BYTES bytes, a name declared twice).
 * A refused call leaves the prefix cache off.
 * @since 0.3
 */
KVC_API kvc_status kvc_pool_enable_prefix_cache(kvc_pool *pool, const kvc_prefix_config *config);

/**
 * @brief How many leading tokens of a prompt are cached, without changing
 * anything (reference counts, LRU order).
 * @param pool the pool (not NULL; prefix cache enabled).
 * @param tokens `[n_tokens]` token ids.
 * @param n_tokens prompt length; at most n_tokens - 1 tokens are reported
 * reusable (the last token is always computed).
 * @param extras `[n_extras]` extra keys (NULL when n_extras is 0), at most 64.
 * A pool with declared extra-key names (kvc_prefix_config::extra_key_names)
 * takes one value per name, in declaration order (size 0: none).
 * @param n_extras number of extra keys: with declared names, exactly their
 * number (any other count is ::KVC_ERR_INVALID_ARGUMENT, with a message
 * giving the names); without, at most 64.
 * With offload tiers (kvc_pool_add_tier()) the lookup goes on past the
 * pool's hit through the tiers, in order, block by block (no pool lock is
 * held meanwhile), and reports the whole blocks they hold in tier_tokens.
 * @param flags 0, or ::KVC_PREFIX_PARTIAL and / or ::KVC_PREFIX_PIN.
 * @param result receives the counts.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE;
 * ::KVC_ERR_INVALID_ARGUMENT (prefix cache off, unknown flags, too many or
 * too large extras, an n_extras other than the declared names' count);
 * ::KVC_ERR_OVERFLOW (n_tokens above 2^31). A refused call changes nothing.
 * @since 0.3
 */
KVC_API kvc_status kvc_prefix_lookup(kvc_pool *pool, const int32_t *tokens, uint64_t n_tokens,
                                     const kvc_prefix_extra *extras, uint32_t n_extras,
                                     uint32_t flags, kvc_prefix_result *result);

/**
 * @brief Create sequence `seq_id` holding the cached prefix of a prompt: the
 * matching blocks are attached (reference counts up; cached blocks revived)
 * and, with ::KVC_PREFIX_PARTIAL, the matching rows of a partly matching next
 * block are copied into a fresh block. The sequence's length is
 * hit_tokens + partial_tokens; the engine reserves and computes the rest.
 * @param pool the pool (not NULL; prefix cache enabled).
 * @param seq_id a new sequence id.
 * @param tokens `[n_tokens]` token ids of the whole prompt.
 * @param n_tokens prompt length.
 * @param extras extra keys, as for kvc_prefix_lookup().
 * @param n_extras number of extra keys.
 * @param flags 0 or ::KVC_PREFIX_PARTIAL (skipped when no block is free for the copies).
 * @param result NULL or receives the counts.
 * @return as kvc_prefix_lookup(), plus ::KVC_ERR_SEQ_EXISTS and
 * ::KVC_ERR_OUT_OF_MEMORY; on failure no sequence is created.
 * @since 0.3
 */
KVC_API kvc_status kvc_prefix_attach(kvc_pool *pool, uint64_t seq_id, const int32_t *tokens,
                                     uint64_t n_tokens, const kvc_prefix_extra *extras,
                                     uint32_t n_extras, uint32_t flags, kvc_prefix_result *result);

/**
 * @brief Register the full blocks of a sequence's prompt (written by the
 * engine) under their keys, so later prompts find them.
 *
 * Registers blocks [0, floor(n_tokens / block_size)) that every layer holds
 * unevicted; blocks already registered are skipped. Since 0.4 every slot of
 * those blocks must have been written (kvc_append(), a restore, a tier load
 * or kvc_pool_copy_blocks() from the host): a block with a reserved slot no
 * one wrote refuses the call with ::KVC_ERR_INVALID_ARGUMENT (the message
 * names the first such position) and nothing is registered, so no prompt
 * ever finds bytes no append wrote. A registered block leaves
 * the index (::KVC_PREFIX_REMOVED) before its content could change: before an
 * in-place kvc_append() into it, before eviction rewrites it, when a
 * truncation cuts into it while one sequence alone holds it, and when
 * kvc_seq_reserve() hands out free slots of it; shared blocks are copied on
 * write instead and stay registered.
 * @param pool the pool (not NULL; prefix cache enabled).
 * @param seq_id a live sequence whose first n_tokens positions hold `tokens`.
 * @param tokens `[n_tokens]` token ids.
 * @param n_tokens at most the sequence's length.
 * @param extras extra keys, as for kvc_prefix_lookup().
 * @param n_extras number of extra keys.
 * @param n_registered NULL or receives the number of blocks newly registered.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_SEQ_NOT_FOUND;
 * ::KVC_ERR_OUT_OF_RANGE (n_tokens above the length); ::KVC_ERR_INVALID_ARGUMENT
 * (prefix cache off; extra keys refused as by kvc_prefix_lookup(), e.g. a
 * count other than the declared names'); a refused call registers nothing.
 * @since 0.3
 */
KVC_API kvc_status kvc_prefix_insert(kvc_pool *pool, uint64_t seq_id, const int32_t *tokens,
                                     uint64_t n_tokens, const kvc_prefix_extra *extras,
                                     uint32_t n_extras, uint64_t *n_registered);

/**
 * @brief The chain keys of the full blocks of a prompt, as this pool computes
 * them (for routers and other programs following docs/prefix-cache.md).
 * @param pool the pool (not NULL; prefix cache enabled).
 * @param tokens `[n_tokens]` token ids.
 * @param n_tokens prompt length; keys of floor(n_tokens / block_size) blocks.
 * @param extras extra keys, as for kvc_prefix_lookup().
 * @param n_extras number of extra keys.
 * @param keys_out `[blocks][key_size]` bytes.
 * @param capacity bytes of keys_out.
 * @param key_size receives the key size (also on ::KVC_ERR_BUFFER_TOO_SMALL).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_BUFFER_TOO_SMALL;
 * ::KVC_ERR_INVALID_ARGUMENT (prefix cache off; extra keys refused as by
 * kvc_prefix_lookup()); ::KVC_ERR_OVERFLOW.
 * @since 0.3
 */
KVC_API kvc_status kvc_prefix_keys(kvc_pool *pool, const int32_t *tokens, uint64_t n_tokens,
                                   const kvc_prefix_extra *extras, uint32_t n_extras,
                                   uint8_t *keys_out, size_t capacity, size_t *key_size);

/**
 * @brief Zero a stats struct and set its struct_size.
 * The function of this name is the 0.3 entry point (for binaries built
 * against 0.3 headers and the ::kvc_api table): it fills the struct's 0.3
 * size (80 bytes on x86-64), forever; source code calling
 * kvc_prefix_stats_init() gets the macro of that name, which passes the caller's
 * sizeof to kvc_prefix_stats_init_sized().
 * @param stats the struct (not NULL).
 * @return ::KVC_OK, or ::KVC_ERR_NULL_POINTER.
 * @since 0.3
 */
KVC_API kvc_status kvc_prefix_stats_init(kvc_prefix_stats *stats);

/**
 * @brief Fill the first `struct_size` bytes of a prefix stats struct as kvc_prefix_stats_init()
 * does, with struct_size set to `struct_size`: the caller's struct, of its
 * header's size. Never writes past `struct_size` bytes; the bytes past this
 * library's sizeof(kvc_prefix_stats) (fields of a newer header) are zeroed.
 * @param stats the caller's struct (not NULL), `struct_size` bytes.
 * @param struct_size the caller's sizeof(kvc_prefix_stats): at least 80 (the whole 0.3 struct),
 * not ending inside a field, at most ::KVC_STRUCT_SIZE_MAX.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE (a size
 * refused as above; the message names the field it cuts). Nothing is
 * written on failure.
 * @since 0.4
 */
KVC_API kvc_status kvc_prefix_stats_init_sized(kvc_prefix_stats *stats, size_t struct_size);

/**
 * @brief kvc_prefix_stats_init() in source code: kvc_prefix_stats_init_sized() with
 * the caller's sizeof, so it fills exactly the caller's struct.
 * @param stats a `kvc_prefix_stats *` (evaluated once; a literal NULL has no
 * struct type in C++ (GNU C takes sizeof(void) as 1 and the call then returns
 * ::KVC_ERR_NULL_POINTER): call kvc_<thing>_init_sized() for that).
 * @since 0.4 (a function before, which remains exported for 0.3 binaries)
 */
#define kvc_prefix_stats_init(stats) kvc_prefix_stats_init_sized((stats), sizeof *(stats))

/**
 * @brief Read the prefix cache counters.
 * @param pool the pool (not NULL; prefix cache enabled).
 * @param stats receives the counters (struct_size set).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE;
 * ::KVC_ERR_INVALID_ARGUMENT (prefix cache off).
 * @since 0.3
 */
KVC_API kvc_status kvc_prefix_get_stats(kvc_pool *pool, kvc_prefix_stats *stats);

/**
 * @brief Set (or clear, with NULL) the callback receiving prefix index events.
 * @param pool the pool (not NULL; prefix cache enabled).
 * @param fn the callback or NULL.
 * @param user passed to fn.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_INVALID_ARGUMENT.
 * @since 0.3
 */
KVC_API kvc_status kvc_prefix_set_callback(kvc_pool *pool, kvc_prefix_event_fn fn, void *user);

/* ------------------------------------------------------------------------ */
/* Offload tiers                                                            */
/* ------------------------------------------------------------------------ */

/**
 * @brief Kind of an offload tier (docs/tiers.md).
 * @since 0.3
 */
typedef enum kvc_tier_kind {
  KVC_TIER_HOST = 0, /**< Host memory with a byte capacity and LRU replacement. */
  /**
   * A directory of one file per block (checksum, fingerprint, atomic rename), byte capacity, LRU;
   * survives restarts.
   */
  KVC_TIER_DISK = 1,
  /** A Redis server or Redis Cluster (hiredis), shared by processes and machines. */
  KVC_TIER_REDIS = 2,
  KVC_TIER_KIND_FORCE_32BIT = 0x7fffffff, /**< Forces a 32-bit enum; not a value. */
  KVC_TIER_KIND_FORCE_SIGNED = INT32_MIN  /**< Forces a signed enum; not a value. */
} kvc_tier_kind;

/**
 * @brief Tier flag: a disk tier flushes every record to stable storage (fsync) before it
 * is visible, and its directory after the rename that makes it visible (since 0.4).
 * @since 0.3
 */
#define KVC_TIER_FSYNC 0x1u
/**
 * @brief Tier flag: `address` lists seed nodes of a Redis Cluster (slot map, MOVED /
 * ASK redirects).
 * @since 0.3
 */
#define KVC_TIER_REDIS_CLUSTER 0x2u

/**
 * @brief Settings of one offload tier (kvc_pool_add_tier()). Init with
 * kvc_tier_config_init().
 * @since 0.3
 */
typedef struct kvc_tier_config {
  size_t struct_size; /**< sizeof(kvc_tier_config) of the caller. */
  kvc_tier_kind kind; /**< Host, disk or Redis. */
  uint32_t flags;     /**< ::KVC_TIER_FSYNC (disk), ::KVC_TIER_REDIS_CLUSTER (Redis), or 0. */
  /**
   * Host and disk: the most bytes the tier holds (records with their headers), > 0. Ignored for
   * Redis (the server's maxmemory rules).
   */
  uint64_t capacity_bytes;
  /** Disk: the directory (created if missing; records of earlier processes are found). Copied. */
  const char *path;
  /** Redis: "host:port", or for a cluster "host:port,host:port,..." seed nodes. Copied. */
  const char *address;
  /** Redis: connect and command timeout in milliseconds (default 1000). */
  uint32_t timeout_ms;
  uint32_t reserved;    /**< Zero. */
  uint64_t ttl_seconds; /**< Redis: records expire after this many seconds (0: never). */
} kvc_tier_config;

/**
 * @brief Counters of one tier (kvc_pool_tier_stats()).
 * @since 0.3
 */
typedef struct kvc_tier_stats {
  size_t struct_size; /**< sizeof(kvc_tier_stats) of the caller. */
  kvc_tier_kind kind; /**< The tier's kind. */
  uint32_t reserved;  /**< Zero. */
  /** Bytes held now (Redis: written minus deleted by this process, an estimate). */
  uint64_t bytes;
  uint64_t entries; /**< Blocks held now (Redis: estimate, as bytes). */
  uint64_t hits;    /**< Reads that returned a block. */
  /** Reads that found nothing usable (absent, another fingerprint, damaged, tier down). */
  uint64_t misses;
  uint64_t demotions;  /**< Blocks written to this tier by the offload writer. */
  uint64_t promotions; /**< Blocks loaded from this tier into the pool. */
  /**
   * Demotions dropped because the writer's queue was full (the pool's count, the same in
   * every tier).
   */
  uint64_t drops;
  uint64_t evictions; /**< Blocks this tier removed for room (LRU). */
  /** Failed writes and reads, refused (damaged) records, connection failures. */
  uint64_t errors;
  uint64_t pinned; /**< Blocks pinned now through kvc_prefix_lookup() with ::KVC_PREFIX_PIN. */
  /** The reason of the tier's last error, "" if none (NUL-terminated, truncated). */
  char last_error[256];
} kvc_tier_stats;

/**
 * @brief Fill a tier config with defaults for `kind`: no flags, capacity 0
 * (must be set for host and disk), no path or address, timeout 1000 ms, no TTL.
 * The function of this name is the 0.3 entry point (for binaries built
 * against 0.3 headers and the ::kvc_api table): it fills the struct's 0.3
 * size (56 bytes on x86-64), forever; source code calling
 * kvc_tier_config_init() gets the macro of that name, which passes the caller's
 * sizeof to kvc_tier_config_init_sized().
 * @param config the struct to fill (not NULL).
 * @param kind the tier's kind.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_INVALID_ARGUMENT (unknown kind).
 * @since 0.3
 */
KVC_API kvc_status kvc_tier_config_init(kvc_tier_config *config, kvc_tier_kind kind);

/**
 * @brief Fill the first `struct_size` bytes of a tier config as kvc_tier_config_init()
 * does, with struct_size set to `struct_size`: the caller's struct, of its
 * header's size. Never writes past `struct_size` bytes; the bytes past this
 * library's sizeof(kvc_tier_config) (fields of a newer header) are zeroed.
 * @param config the caller's struct (not NULL), `struct_size` bytes.
 * @param kind the tier's kind (as for kvc_tier_config_init()).
 * @param struct_size the caller's sizeof(kvc_tier_config): at least 56 (the whole 0.3 struct),
 * not ending inside a field, at most ::KVC_STRUCT_SIZE_MAX.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE (a size
 * refused as above; the message names the field it cuts);
 * ::KVC_ERR_INVALID_ARGUMENT (unknown kind). Nothing is written on failure.
 * @since 0.4
 */
KVC_API kvc_status kvc_tier_config_init_sized(kvc_tier_config *config, kvc_tier_kind kind,
                                              size_t struct_size);

/**
 * @brief kvc_tier_config_init() in source code: kvc_tier_config_init_sized() with
 * the caller's sizeof, so it fills exactly the caller's struct.
 * @param config a `kvc_tier_config *` (evaluated once; a literal NULL has no
 * struct type in C++ (GNU C takes sizeof(void) as 1 and the call then returns
 * ::KVC_ERR_NULL_POINTER): call kvc_<thing>_init_sized() for that).
 * @param kind the tier's kind (as for kvc_tier_config_init()).
 * @since 0.4 (a function before, which remains exported for 0.3 binaries)
 */
#define kvc_tier_config_init(config, kind) \
  kvc_tier_config_init_sized((config), (kind), sizeof *(config))

/**
 * @brief Add an offload tier below the pool (after the ones already added).
 *
 * Tiers hold prefix-cache blocks (docs/tiers.md), under their chain keys:
 * a key mixes the prefix seed, the pool's fingerprint (geometry, codecs),
 * the model and tokenizer ids and the extra keys (tenant salt, adapter), so
 * pools of other models or tenants never see each other's blocks; pools in
 * other processes share blocks only with the same seed
 * (kvc_prefix_config::seed_set). Each record also carries the fingerprint
 * and is refused by a pool with another.
 *
 * Demotion: when the pool reclaims a cached prefix block (LRU), its bytes
 * (all layers) are copied at once and queued for a background writer that
 * stores them in every tier (write-through, as LMCache stores each chunk in
 * every backend); a full queue drops the block and counts it, never blocks.
 * kvc_prefix_offload() queues a prompt's blocks while they are still in the
 * pool. Promotion: kvc_prefix_lookup() reports tier_tokens;
 * kvc_prefix_load() / kvc_prefix_prefetch() load them back.
 *
 * A tier that fails (disk full, permission denied, Redis down) turns into
 * misses and counted errors (kvc_pool_tier_stats()); the pool keeps working.
 * kvc_pool_destroy() writes the blocks still queued unless a tier fails
 * meanwhile (then the rest is dropped and counted: it waits for at most one
 * timeout per tier); kvc_pool_flush_tiers() first keeps them all.
 * @param pool the pool (not NULL; prefix cache enabled).
 * @param config the tier (not NULL).
 * @param tier_index NULL or receives the tier's index (0 for the first).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE;
 * ::KVC_ERR_INVALID_ARGUMENT (prefix cache off, unknown kind or flags, capacity
 * 0, no path or address, a malformed address, more than 8 tiers: checked
 * before the tier is opened, so a refused call leaves a disk directory as it was);
 * ::KVC_ERR_UNSUPPORTED (Redis in a build without hiredis; non-zero reserved);
 * ::KVC_ERR_IO (the disk directory cannot be created or read).
 * @since 0.3
 */
KVC_API kvc_status kvc_pool_add_tier(kvc_pool *pool, const kvc_tier_config *config,
                                     uint32_t *tier_index);

/**
 * @brief Set the offload queue and load timeout (defaults: 256 blocks, 10000 ms).
 * @param pool the pool (not NULL; with at least one tier).
 * @param queue_blocks demotions that may wait for the writer, in [1, 2^20];
 * one more is dropped (counted in kvc_tier_stats::drops).
 * @param load_timeout_ms how long a load's reserved blocks wait for the
 * tiers, in [1, 3600000] ms; then they go back to the pool and a late answer
 * is dropped.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_INVALID_ARGUMENT (a
 * value out of range, no tier).
 * @since 0.3
 */
KVC_API kvc_status kvc_pool_set_offload(kvc_pool *pool, uint32_t queue_blocks,
                                        uint32_t load_timeout_ms);

/**
 * @brief Zero a tier stats struct and set its struct_size.
 * The function of this name is the 0.3 entry point (for binaries built
 * against 0.3 headers and the ::kvc_api table): it fills the struct's 0.3
 * size (352 bytes on x86-64), forever; source code calling
 * kvc_tier_stats_init() gets the macro of that name, which passes the caller's
 * sizeof to kvc_tier_stats_init_sized().
 * @param stats the struct (not NULL).
 * @return ::KVC_OK, or ::KVC_ERR_NULL_POINTER.
 * @since 0.3
 */
KVC_API kvc_status kvc_tier_stats_init(kvc_tier_stats *stats);

/**
 * @brief Fill the first `struct_size` bytes of a tier stats struct as kvc_tier_stats_init()
 * does, with struct_size set to `struct_size`: the caller's struct, of its
 * header's size. Never writes past `struct_size` bytes; the bytes past this
 * library's sizeof(kvc_tier_stats) (fields of a newer header) are zeroed.
 * @param stats the caller's struct (not NULL), `struct_size` bytes.
 * @param struct_size the caller's sizeof(kvc_tier_stats): at least 352 (the whole 0.3 struct),
 * not ending inside a field, at most ::KVC_STRUCT_SIZE_MAX.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE (a size
 * refused as above; the message names the field it cuts). Nothing is
 * written on failure.
 * @since 0.4
 */
KVC_API kvc_status kvc_tier_stats_init_sized(kvc_tier_stats *stats, size_t struct_size);

/**
 * @brief kvc_tier_stats_init() in source code: kvc_tier_stats_init_sized() with
 * the caller's sizeof, so it fills exactly the caller's struct.
 * @param stats a `kvc_tier_stats *` (evaluated once; a literal NULL has no
 * struct type in C++ (GNU C takes sizeof(void) as 1 and the call then returns
 * ::KVC_ERR_NULL_POINTER): call kvc_<thing>_init_sized() for that).
 * @since 0.4 (a function before, which remains exported for 0.3 binaries)
 */
#define kvc_tier_stats_init(stats) kvc_tier_stats_init_sized((stats), sizeof *(stats))

/**
 * @brief Read the counters of one tier.
 * @param pool the pool (not NULL).
 * @param tier_index 0 for the first tier added.
 * @param stats receives the counters (struct_size set).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE;
 * ::KVC_ERR_OUT_OF_RANGE (no such tier).
 * @since 0.3
 */
KVC_API kvc_status kvc_pool_tier_stats(kvc_pool *pool, uint32_t tier_index, kvc_tier_stats *stats);

/**
 * @brief Queue the prompt's blocks that are registered in the pool for writing
 * to every tier now (write-through, before the pool reclaims them; e.g. so
 * that a later process finds them on disk or in Redis).
 * @param pool the pool (not NULL; prefix cache enabled; with tiers).
 * @param tokens `[n_tokens]` token ids.
 * @param n_tokens prompt length; every whole block registered in the pool is queued.
 * @param extras extra keys, as for kvc_prefix_lookup().
 * @param n_extras number of extra keys.
 * @param n_queued NULL or receives the blocks queued (the others were dropped: queue full).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_INVALID_ARGUMENT (no
 * prefix cache or tier; extra keys refused as by kvc_prefix_lookup());
 * ::KVC_ERR_OVERFLOW.
 * @since 0.3
 */
KVC_API kvc_status kvc_prefix_offload(kvc_pool *pool, const int32_t *tokens, uint64_t n_tokens,
                                      const kvc_prefix_extra *extras, uint32_t n_extras,
                                      uint64_t *n_queued);

/**
 * @brief Wait until the offload writer has written every queued block.
 * @param pool the pool (not NULL).
 * @return ::KVC_OK or ::KVC_ERR_NULL_POINTER (a pool without tiers returns at once).
 * @since 0.3
 */
KVC_API kvc_status kvc_pool_flush_tiers(kvc_pool *pool);

/**
 * @brief Load the tier blocks that follow the pool's hit of a prompt into the
 * pool, and wait: afterwards kvc_prefix_attach() finds them.
 *
 * The blocks are reserved in the pool first (as many as are free or
 * reclaimable, the prompt's own cached chain excepted), read from the first
 * tier that has each (no pool lock is held), checked (fingerprint, tier
 * checksum, the block's token ids, extra keys and chain position) and
 * registered as cached prefix blocks. The chain stops at the first block no
 * tier returns whole.
 * @param pool the pool (not NULL; prefix cache enabled; with tiers).
 * @param tokens `[n_tokens]` token ids of the prompt.
 * @param n_tokens prompt length (as for kvc_prefix_lookup(), the last token is never loaded).
 * @param extras extra keys, as for kvc_prefix_lookup().
 * @param n_extras number of extra keys.
 * @param loaded_tokens NULL or receives the tokens loaded (whole blocks).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_INVALID_ARGUMENT (no
 * prefix cache or tier; extra keys refused as by kvc_prefix_lookup(): nothing
 * is reserved); ::KVC_ERR_OVERFLOW; ::KVC_ERR_TIMEOUT (the tiers did not answer within the
 * load timeout: nothing loaded, the reserved blocks are back in the pool).
 * @since 0.3
 */
KVC_API kvc_status kvc_prefix_load(kvc_pool *pool, const int32_t *tokens, uint64_t n_tokens,
                                   const kvc_prefix_extra *extras, uint32_t n_extras,
                                   uint64_t *loaded_tokens);

/**
 * @brief Start loading, as kvc_prefix_load(), and return at once with a
 * ticket for kvc_prefix_poll() (the reads run on the offload loader thread).
 * @param pool the pool (not NULL; prefix cache enabled; with tiers).
 * @param tokens `[n_tokens]` token ids (copied).
 * @param n_tokens prompt length.
 * @param extras extra keys (copied).
 * @param n_extras number of extra keys.
 * @param ticket receives the ticket (not NULL).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_INVALID_ARGUMENT (as for
 * kvc_prefix_load(): no ticket is made); ::KVC_ERR_OVERFLOW.
 * @since 0.3
 */
KVC_API kvc_status kvc_prefix_prefetch(kvc_pool *pool, const int32_t *tokens, uint64_t n_tokens,
                                       const kvc_prefix_extra *extras, uint32_t n_extras,
                                       uint64_t *ticket);

/**
 * @brief Poll a prefetch. Once it returns ::KVC_OK or ::KVC_ERR_TIMEOUT the
 * ticket is forgotten.
 * @param pool the pool (not NULL).
 * @param ticket from kvc_prefix_prefetch().
 * @param loaded_tokens NULL or receives the tokens loaded (0 unless ::KVC_OK).
 * @return ::KVC_OK (done); ::KVC_ERR_PENDING (still reading; poll again);
 * ::KVC_ERR_TIMEOUT (see kvc_prefix_load()); ::KVC_ERR_NULL_POINTER;
 * ::KVC_ERR_INVALID_ARGUMENT (a ticket this pool's kvc_prefix_prefetch() did
 * not give, or already reported; tickets are unique in the process).
 * @since 0.3
 */
KVC_API kvc_status kvc_prefix_poll(kvc_pool *pool, uint64_t ticket, uint64_t *loaded_tokens);

/**
 * @brief Release the pins of a kvc_prefix_lookup() with ::KVC_PREFIX_PIN.
 * @param pool the pool (not NULL).
 * @param pin the handle from kvc_prefix_result::pin.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_INVALID_ARGUMENT (not a
 * pin this pool holds: unknown, 0, or already unpinned; nothing changes).
 * @since 0.3
 */
KVC_API kvc_status kvc_prefix_unpin(kvc_pool *pool, uint64_t pin);

/* ------------------------------------------------------------------------ */
/* Stores: one tier by itself, addressed by an engine's own keys            */
/* ------------------------------------------------------------------------ */

/**
 * @brief A store: one offload tier (host memory, a disk directory, Redis or
 * Redis Cluster, as kvc_pool_add_tier() describes them) opened by itself and
 * addressed by the caller's keys, byte strings such as an engine's page
 * hashes, instead of a pool's prefix keys. The engine adapters (the Python
 * package's kvcache.sglang, kvcache.lmcache and kvcache.vllm, docs/engines.md)
 * keep their pages in stores. Same roles elsewhere: SGLang's HiCacheStorage,
 * LMCache's storage backends, vLLM's KV connectors' external stores.
 *
 * Each value is stored as one record of the tier: the tier key is the
 * XXH3-128 digest of (scope, key); the record holds the value, an XXH3-64
 * checksum and the scope and key bytes themselves, which a read compares, so
 * two keys never share a value even if their digests collide, and a damaged
 * record is removed, never returned. A put replaces the value whole: a
 * reader sees the old value, the new one or none (other processes too, on a
 * shared directory or Redis server).
 *
 * Thread-safe: every function may be called from any thread at once, but
 * kvc_store_close() only when no other call uses the store.
 * @since 0.4 (table version 7)
 */
typedef struct kvc_store kvc_store;

/** @brief The longest key and the longest scope, in bytes. @since 0.4 */
#define KVC_STORE_KEY_MAX 4096

/**
 * @brief Open a store over one tier.
 * @param config the tier: kvc_tier_config_init() then the fields of its kind,
 * checked as kvc_pool_add_tier() checks them (host and disk need
 * capacity_bytes; disk a path; Redis an address).
 * @param scope bytes that every key of this store is read and written under
 * (the model, its KV layout and dtype, the tensor-parallel rank...): stores
 * opened with another scope never see these values, even in one directory or
 * on one Redis server. NULL with scope_bytes 0 for none; at most
 * ::KVC_STORE_KEY_MAX bytes. A disk directory's capacity is shared: each
 * store or pool tier opened on it counts every record there, whatever its
 * scope, and evicts the least recently used of them for room (give stores of
 * one directory the same capacity, or each its own directory).
 * @param scope_bytes the length of scope.
 * @param[out] out the new store (NULL on failure).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER (config or out; scope NULL with
 * scope_bytes > 0); ::KVC_ERR_STRUCT_SIZE; ::KVC_ERR_INVALID_ARGUMENT (a
 * field of config as kvc_pool_add_tier(), a scope over ::KVC_STORE_KEY_MAX
 * bytes); ::KVC_ERR_UNSUPPORTED (Redis in a build without hiredis, reserved
 * not 0); ::KVC_ERR_IO (a disk directory that cannot be created or read);
 * ::KVC_ERR_OUT_OF_MEMORY. A Redis server that is down is not an error here:
 * reads miss and writes fail with ::KVC_ERR_IO until it answers.
 * @since 0.4
 */
KVC_API kvc_status kvc_store_open(const kvc_tier_config *config, const void *scope,
                                  size_t scope_bytes, kvc_store **out);

/**
 * @brief Close a store: its host tier's values are freed; disk and Redis
 * values stay for the next process.
 * @param store the store (NULL is ignored).
 * @since 0.4
 */
KVC_API void kvc_store_close(kvc_store *store);

/**
 * @brief Store `value` under `key`, replacing an older value; a host or disk
 * tier evicts its least recently used values for room (never pinned ones).
 * @param store the store.
 * @param key the key, 1 to ::KVC_STORE_KEY_MAX bytes.
 * @param key_bytes the length of key.
 * @param value the bytes to store (NULL only with value_bytes 0).
 * @param value_bytes the length of value.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_INVALID_ARGUMENT (an
 * empty key or one over ::KVC_STORE_KEY_MAX bytes);
 * ::KVC_ERR_EXCEEDS_CAPACITY (the record, value with key, scope and header,
 * is larger than the host or disk tier's capacity, or than a Redis value:
 * 512 MiB); ::KVC_ERR_IO (the tier
 * could not store it: its room is held by pinned values, a disk or
 * connection error; the reason is in kvc_last_error_message() and the stats'
 * last_error). On any error nothing changed, an older value stays, but for a
 * Redis command that timed out: whether it landed is then unknown.
 * @since 0.4
 */
KVC_API kvc_status kvc_store_put(kvc_store *store, const void *key, size_t key_bytes,
                                 const void *value, size_t value_bytes);

/**
 * @brief Read the value of `key` into the caller's buffer.
 * @param store the store.
 * @param key the key, 1 to ::KVC_STORE_KEY_MAX bytes.
 * @param key_bytes the length of key.
 * @param buf where the value goes (NULL only with buf_bytes 0).
 * @param buf_bytes the size of buf.
 * @param[out] value_bytes the value's length (0 on a miss); may be NULL.
 * @param[out] found 1 when the store holds the key, 0 on a miss (absent,
 * evicted, another scope, a damaged record, which is removed, or a tier that
 * does not answer, counted as an error in the stats). Not NULL.
 * @return ::KVC_OK (hit or miss); ::KVC_ERR_NULL_POINTER;
 * ::KVC_ERR_INVALID_ARGUMENT (the key's length); ::KVC_ERR_BUFFER_TOO_SMALL
 * (a hit whose value is longer than buf_bytes: *found is 1, *value_bytes
 * says how long, buf is untouched).
 * @since 0.4
 */
KVC_API kvc_status kvc_store_get(kvc_store *store, const void *key, size_t key_bytes, void *buf,
                                 size_t buf_bytes, size_t *value_bytes, int32_t *found);

/**
 * @brief Which of n keys the store holds, in one round trip per Redis server
 * (pipelined EXISTS; host and disk tiers look in their index).
 * @param store the store.
 * @param keys n pointers to keys, each 1 to ::KVC_STORE_KEY_MAX bytes.
 * @param key_bytes n lengths.
 * @param n how many keys (0: nothing to do).
 * @param[out] found n bytes: 1 where the store holds keys[i], else 0.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER (keys, key_bytes or found with
 * n > 0, or a NULL key); ::KVC_ERR_INVALID_ARGUMENT (a key's length; found is
 * then untouched). A tier that does not answer gives zeros and a counted error.
 * @since 0.4
 */
KVC_API kvc_status kvc_store_contains(kvc_store *store, const void *const *keys,
                                      const size_t *key_bytes, size_t n, uint8_t *found);

/**
 * @brief Remove the value of `key` (and its pins).
 * @param store the store.
 * @param key the key, 1 to ::KVC_STORE_KEY_MAX bytes.
 * @param key_bytes the length of key.
 * @param[out] removed 1 when a value was removed, 0 when there was none or a
 * Redis server did not answer (an error counted in the stats); may be NULL.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_INVALID_ARGUMENT (the
 * key's length).
 * @since 0.4
 */
KVC_API kvc_status kvc_store_remove(kvc_store *store, const void *key, size_t key_bytes,
                                    int32_t *removed);

/**
 * @brief Pin (`pin` 1) or unpin (`pin` 0) the value of `key` in a host or
 * disk store: LRU replacement never evicts a pinned value (a put that would
 * need its room fails instead). Pins count: each pin needs one unpin.
 * @param store the store.
 * @param key the key, 1 to ::KVC_STORE_KEY_MAX bytes.
 * @param key_bytes the length of key.
 * @param pin 1 to pin, 0 to unpin.
 * @param[out] done 1 when the value was pinned (unpinned), 0 when the key is
 * absent (or, unpinning, not pinned; on disk, a record another process wrote
 * counts as absent until this store has read it); may be NULL.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_INVALID_ARGUMENT (the
 * key's length, pin not 0 or 1); ::KVC_ERR_UNSUPPORTED (a Redis store: Redis
 * evicts by its own maxmemory rules).
 * @since 0.4
 */
KVC_API kvc_status kvc_store_pin(kvc_store *store, const void *key, size_t key_bytes, int32_t pin,
                                 int32_t *done);

/**
 * @brief Counters of the store's tier, as kvc_pool_tier_stats() gives a
 * pool's: bytes and entries held, hits and misses of kvc_store_get(),
 * evictions, errors, pinned values and the last error. `demotions` counts
 * the values stored by kvc_store_put(), `promotions` the hits; `drops` is 0.
 * @param store the store.
 * @param[out] stats the counters (kvc_tier_stats_init() first).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_STRUCT_SIZE.
 * @since 0.4
 */
KVC_API kvc_status kvc_store_stats(kvc_store *store, kvc_tier_stats *stats);

/* ------------------------------------------------------------------------ */
/* Records: saving and restoring sequences                                  */
/* ------------------------------------------------------------------------ */

/**
 * @brief Save one sequence as a self-describing record (llama.cpp's state
 * save, vLLM / LMCache's store by request): its length, per-layer block
 * tables, positions (after eviction), observed attention scores and the
 * bytes of its blocks exactly as the pool stores them (codes, scales and
 * zero points: a restore re-quantizes nothing). The record carries a
 * fingerprint of the pool's geometry, dtypes, codecs (granularity, group
 * size, scale dtype, rotation, static scales), block size, layout, residual
 * window, attention sinks and RoPE settings, and an XXH3-64 checksum. Format: docs/tiers.md.
 * Size: about the sequence's blocks (blocks x kvc_stats.bytes_per_block
 * over all layers) plus 100 bytes per layer. The sequence is unchanged.
 *
 * The record is the sequence at one instant (since 0.4): appends to this
 * sequence from other threads wait while it is written (other sequences go
 * on), so it never mixes rows from before and after an append. It is
 * written straight into `buffer` (no second copy of the sequence). Slots of
 * its blocks the sequence does not hold (the end of a last block) are zero
 * in the record. Positions reserved but not written yet are saved as such
 * (zero bytes and a list of unwritten ranges, record format 2): after a
 * restore they read as zeros, can be appended, and keep their blocks out
 * of the prefix cache until written.
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param buffer NULL (to query the size) or receives the record.
 * @param capacity bytes buffer can hold.
 * @param size receives the record's size in bytes (also on ::KVC_ERR_BUFFER_TOO_SMALL).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER (pool or size); ::KVC_ERR_SEQ_NOT_FOUND;
 * ::KVC_ERR_BUFFER_TOO_SMALL (buffer NULL or capacity below the size: only
 * size written); ::KVC_ERR_OUT_OF_MEMORY; ::KVC_ERR_INTERNAL (CUDA runtime).
 * CUDA pools: the blocks are copied to the host before the call returns.
 * @since 0.3
 */
KVC_API kvc_status kvc_seq_save(kvc_pool *pool, uint64_t seq_id, void *buffer, size_t capacity,
                                size_t *size);

/**
 * @brief Create sequence `seq_id` from a record of kvc_seq_save(), in this
 * pool or another whose fingerprint is equal (another process, a CUDA pool
 * from a CPU pool's record and back). All checks run before the pool
 * changes: on failure nothing is created and no block is taken. Per-tensor
 * scales: a layer that has none yet takes the record's; one that has
 * another is ::KVC_ERR_INCOMPATIBLE (its codes would decode wrongly).
 * @param pool the pool (not NULL).
 * @param seq_id an id no live sequence has.
 * @param data the record.
 * @param size its size in bytes.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_SEQ_EXISTS;
 * ::KVC_ERR_CORRUPT (wrong size, checksum or structure: not a record of this
 * library, truncated or damaged); ::KVC_ERR_INCOMPATIBLE (another
 * configuration: the message names the fields that differ; another record
 * format; a different per-tensor scale); ::KVC_ERR_EXCEEDS_CAPACITY (the
 * record needs more blocks or residual blocks than the pool has in all);
 * ::KVC_ERR_POOL_EXHAUSTED (not enough free blocks now); ::KVC_ERR_OUT_OF_MEMORY;
 * ::KVC_ERR_INTERNAL (CUDA runtime).
 * @since 0.3
 */
KVC_API kvc_status kvc_seq_restore(kvc_pool *pool, uint64_t seq_id, const void *data, size_t size);

/**
 * @brief kvc_seq_save() into a file, atomically: the record is written to a
 * temporary file in the same folder, flushed to disk (fsync) and renamed
 * over `path`, so a reader sees the old file or the whole new one, never a
 * part (a crash mid-write leaves at most the temporary file behind). The
 * record is streamed to the file (no copy of the whole record in memory)
 * while appends to the sequence wait, as for kvc_seq_save().
 * @param pool the pool (not NULL).
 * @param seq_id a live sequence.
 * @param path the file to create or replace.
 * @return as kvc_seq_save(), plus ::KVC_ERR_IO (the system's reason: no
 * such folder, permission denied, disk full...; `path` is then unchanged).
 * @since 0.3
 */
KVC_API kvc_status kvc_seq_save_file(kvc_pool *pool, uint64_t seq_id, const char *path);

/**
 * @brief kvc_seq_restore() from a file written by kvc_seq_save_file() (or
 * any file holding exactly one record).
 * @param pool the pool (not NULL).
 * @param seq_id an id no live sequence has.
 * @param path the file.
 * @return as kvc_seq_restore(), plus ::KVC_ERR_IO (cannot open or read).
 * @since 0.3
 */
KVC_API kvc_status kvc_seq_restore_file(kvc_pool *pool, uint64_t seq_id, const char *path);

/* ------------------------------------------------------------------------ */
/* llama.cpp sequence state                                                 */
/* ------------------------------------------------------------------------ */

/**
 * @brief ggml tensor types of K and V in a llama.cpp sequence state blob
 * (their ggml_type values). @since 0.4 (table version 8)
 */
typedef enum kvc_llama_type {
  KVC_LLAMA_F32 = 0,  /**< GGML_TYPE_F32: 4 bytes a value. */
  KVC_LLAMA_F16 = 1,  /**< GGML_TYPE_F16: 2 bytes a value. */
  KVC_LLAMA_Q8_0 = 8, /**< GGML_TYPE_Q8_0: blocks of 32 values, an f16 scale d and 32 int8 q (x = d
                         q), 34 bytes. */
  KVC_LLAMA_TYPE_FORCE_32BIT = 0x7fffffff, /**< Forces a 32-bit enum; not a value. */
  KVC_LLAMA_TYPE_FORCE_SIGNED = INT32_MIN  /**< Forces a signed enum; not a value. */
} kvc_llama_type;

/**
 * @brief Flag of kvc_seq_import_llama() / kvc_seq_export_llama(): the blob's
 * quantized K / V are in llama.cpp's rotated space. Since llama.cpp PR 21038
 * (March 2026; llama-cpp-python 0.3.36), a context whose K (V) cache type is
 * quantized and whose head size is a multiple of 64 multiplies K (V), after
 * RoPE, by a normalized Walsh-Hadamard matrix (Sylvester order) before it
 * stores them: K in blocks of the largest power of two dividing the head size,
 * V in blocks of 64 (LLAMA_ATTN_ROT_DISABLE=1 turns it off). With this flag an
 * import undoes that rotation for exactly those tensors, so the pool holds the
 * model's own K / V, and an export applies it. Without it values are taken and
 * written as they are. @since 0.4
 */
#define KVC_LLAMA_ATTN_ROT 0x1u
/**
 * @brief Flag of kvc_seq_export_llama(): write V transposed, as llama.cpp
 * contexts without flash attention store it (f32 and f16 V only). Imports
 * read both forms. @since 0.4
 */
#define KVC_LLAMA_V_TRANS 0x2u

/**
 * @brief Create sequence `seq_id` from a llama.cpp per-sequence state blob
 * (`llama_state_seq_get_data()` of a context whose memory is a plain
 * llama_kv_cache), converting K and V to the pool's storage.
 *
 * The blob (llama.cpp of llama-cpp-python 0.3.36; docs/engines.md gives the
 * layout): u32 magic 0xaf143cd8, i32 seq_id, u32 n_stream; per stream u32
 * cell_count, then when cell_count > 0
 * the cells (i32 pos, u32 n_seq_id, n_seq_id x i32 seq_id), u32 v_trans,
 * u32 n_layer, per layer K (i32 type, u64 row bytes, cell_count rows), then per
 * layer V (the same; transposed: i32 type, u32 value bytes, u32 row values,
 * then per value index the cell_count values). The magic is the format's
 * only version mark: another is refused; so is any blob whose every field and
 * size is not consistent with that layout and this pool.
 *
 * Exactly one stream may hold cells, each cell one sequence; the positions
 * must be 0..cell_count-1 in some order (the tokens are imported in position
 * order; K is taken as llama.cpp stores it, after RoPE). Row values must be
 * num_kv_heads x head_dim of the pool, n_layer its num_layers. K / V types:
 * f32, f16, q8_0 (any other ggml type is ::KVC_ERR_UNSUPPORTED). Blobs of
 * models whose cells carry M-RoPE or token extensions are not of this layout
 * and are refused by the size checks.
 * @param pool the pool (not NULL; CPU).
 * @param seq_id a sequence id not in use.
 * @param blob the blob (not NULL unless size is 0).
 * @param size bytes of blob.
 * @param flags 0 or ::KVC_LLAMA_ATTN_ROT.
 * @param n_tokens NULL or receives the tokens imported.
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_SEQ_EXISTS;
 * ::KVC_ERR_VERSION (another magic); ::KVC_ERR_CORRUPT (truncated, trailing bytes, fields out of
 * range, several sequences in a cell, positions that are not 0..n-1); ::KVC_ERR_INCOMPATIBLE
 * (layers, row size, or a V element size that differ from the pool's);
 * ::KVC_ERR_UNSUPPORTED (another ggml type, several streams holding cells, a
 * CUDA pools); ::KVC_ERR_INVALID_ARGUMENT (unknown flags);
 * ::KVC_ERR_POOL_EXHAUSTED, ::KVC_ERR_EXCEEDS_CAPACITY (as kvc_seq_reserve()
 * gives them: the tokens are reserved and written in chunks of block_size, as
 * an engine's appends would); ::KVC_ERR_NON_FINITE (values a quantized pool
 * cannot store). Nothing is created unless the call returns ::KVC_OK.
 * @since 0.4 (table version 8)
 */
KVC_API kvc_status kvc_seq_import_llama(kvc_pool *pool, uint64_t seq_id, const void *blob,
                                        size_t size, uint32_t flags, uint64_t *n_tokens);

/**
 * @brief Write sequence `seq_id` as a llama.cpp per-sequence state blob that
 * `llama_state_seq_set_data()` restores (the layout of
 * kvc_seq_import_llama()): sequence id `llama_seq_id`, one stream, one cell
 * per token in the layer's order with the token's position (kvc_gather()
 * positions_out), each cell of sequence `llama_seq_id`; K and V of k_type / v_type. A blob imported
 * with the same flags into an f32 pool (an f16 pool for f16 blobs) exports back byte-identical.
 * @param pool the pool (not NULL; CPU).
 * @param seq_id a live sequence; every layer must hold the same tokens at the
 * same positions (no per-layer eviction).
 * @param llama_seq_id the sequence id written into every cell (>= 0).
 * @param k_type type of K: ::KVC_LLAMA_F32, ::KVC_LLAMA_F16 or ::KVC_LLAMA_Q8_0.
 * @param v_type type of V, as k_type (f32 or f16 with ::KVC_LLAMA_V_TRANS).
 * @param flags 0, ::KVC_LLAMA_ATTN_ROT, ::KVC_LLAMA_V_TRANS.
 * @param buf NULL (with capacity 0) or the output.
 * @param capacity bytes of buf.
 * @param size receives the blob's size (also on ::KVC_ERR_BUFFER_TOO_SMALL).
 * @return ::KVC_OK; ::KVC_ERR_NULL_POINTER; ::KVC_ERR_SEQ_NOT_FOUND;
 * ::KVC_ERR_BUFFER_TOO_SMALL (nothing written); ::KVC_ERR_INVALID_ARGUMENT
 * (types, flags, llama_seq_id < 0, q8_0 V with ::KVC_LLAMA_V_TRANS, a row of
 * num_kv_heads x head_dim not a multiple of 32 for q8_0);
 * ::KVC_ERR_UNSUPPORTED (layers holding different tokens, a CUDA pool);
 * ::KVC_ERR_NON_FINITE (a value the type cannot hold: NaN or Inf for q8_0, a
 * magnitude beyond f16's 65504 for f16 or beyond 65504 x 127 for q8_0; buf's
 * contents are then unspecified); ::KVC_ERR_OVERFLOW. Positions reserved but
 * never written export as zeros (as kvc_gather() reads them). The blob is read
 * layer by layer: export a sequence no other thread writes meanwhile (appends
 * to it during the call give an unspecified blob or ::KVC_ERR_OUT_OF_RANGE).
 * @since 0.4 (table version 8)
 */
KVC_API kvc_status kvc_seq_export_llama(kvc_pool *pool, uint64_t seq_id, int32_t llama_seq_id,
                                        kvc_llama_type k_type, kvc_llama_type v_type,
                                        uint32_t flags, void *buf, size_t capacity, size_t *size);

/* ------------------------------------------------------------------------ */
/* Loading with dlopen: the versioned function table                        */
/* ------------------------------------------------------------------------ */

/**
 * @brief Table of every API function, for hosts that load the library with
 * dlopen(). Functions are only appended; a table of version N starts with the
 * fields of every version below N, in the same order. The `*_init` members
 * are the 0.3 functions (they fill a struct's 0.3 size); version 4 appends
 * the `*_init_sized` ones, which a host should use (with its sizeof).
 * @since 0.1
 */
typedef struct kvc_api {
  size_t struct_size;   /**< sizeof the table the library filled (grows with versions). */
  uint32_t api_version; /**< The version of this table (KVC_API_VERSION of the library). */
  uint32_t reserved;    /**< Zero. */
  /* --- version 1 --- */
  uint32_t (*version)(void);                                       /**< kvc_version() */
  const char *(*version_string)(void);                             /**< kvc_version_string() */
  const char *(*status_string)(kvc_status);                        /**< kvc_status_string() */
  const char *(*last_error_message)(void);                         /**< kvc_last_error_message() */
  kvc_status (*pool_config_init)(kvc_pool_config *);               /**< kvc_pool_config_init() */
  kvc_status (*pool_create)(const kvc_pool_config *, kvc_pool **); /**< kvc_pool_create() */
  void (*pool_destroy)(kvc_pool *);                                /**< kvc_pool_destroy() */
  kvc_status (*stats_init)(kvc_stats *);                           /**< kvc_stats_init() */
  kvc_status (*pool_stats)(kvc_pool *, kvc_stats *);               /**< kvc_pool_stats() */
  kvc_status (*pool_reset_peak)(kvc_pool *);                       /**< kvc_pool_reset_peak() */
  kvc_status (*pool_layout_init)(kvc_pool_layout *);               /**< kvc_pool_layout_init() */
  kvc_status (*pool_get_layout)(kvc_pool *, kvc_pool_layout *);    /**< kvc_pool_get_layout() */
  kvc_status (*pool_get_config)(kvc_pool *, kvc_pool_config *);    /**< kvc_pool_get_config() */
  kvc_status (*seq_create)(kvc_pool *, uint64_t);                  /**< kvc_seq_create() */
  kvc_status (*seq_fork)(kvc_pool *, uint64_t, uint64_t);          /**< kvc_seq_fork() */
  kvc_status (*seq_truncate)(kvc_pool *, uint64_t, uint64_t);      /**< kvc_seq_truncate() */
  kvc_status (*seq_free)(kvc_pool *, uint64_t);                    /**< kvc_seq_free() */
  kvc_status (*seq_length)(kvc_pool *, uint64_t, uint64_t *);      /**< kvc_seq_length() */
  /** kvc_seq_layer_tokens() */
  kvc_status (*seq_layer_tokens)(kvc_pool *, uint64_t, uint32_t, uint64_t *);
  kvc_status (*seq_reserve)(kvc_pool *, uint64_t, uint64_t, int64_t *); /**< kvc_seq_reserve() */
  kvc_status (*append)(kvc_pool *, uint64_t, uint32_t, uint64_t, uint64_t, const void *,
                       const void *, kvc_dtype); /**< kvc_append() */
  kvc_status (*gather)(kvc_pool *, uint64_t, uint32_t, uint64_t, uint64_t, void *, void *,
                       kvc_dtype, int32_t *); /**< kvc_gather() */
  kvc_status (*seq_block_table)(kvc_pool *, uint64_t, uint32_t, int32_t *, size_t,
                                size_t *); /**< kvc_seq_block_table() */
  /** kvc_export_page_table() */
  kvc_status (*export_page_table)(kvc_pool *, uint32_t, const uint64_t *, size_t, int32_t *,
                                  int32_t *, size_t, int32_t *, size_t *);
  kvc_status (*convert)(const void *, kvc_dtype, void *, kvc_dtype, size_t); /**< kvc_convert() */
  kvc_status (*dtype_size)(kvc_dtype, size_t *); /**< kvc_dtype_size() */
  /* --- version 2 (0.2) --- */
  kvc_status (*codec_init)(kvc_codec *); /**< kvc_codec_init() */
  /** kvc_pool_tensor_scales() */
  kvc_status (*pool_tensor_scales)(kvc_pool *, uint32_t, float *, float *);
  kvc_status (*quant_sizes_init)(kvc_quant_sizes *); /**< kvc_quant_sizes_init() */
  /** kvc_quantize_sizes() */
  kvc_status (*quantize_sizes)(const kvc_codec *, uint64_t, uint64_t, kvc_quant_sizes *);
  kvc_status (*quantize)(const kvc_codec *, const void *, kvc_dtype, uint64_t, uint64_t, void *,
                         void *, void *); /**< kvc_quantize() */
  kvc_status (*dequantize)(const kvc_codec *, const void *, const void *, const void *, uint64_t,
                           uint64_t, void *, kvc_dtype); /**< kvc_dequantize() */
  /* --- version 3 (0.3) --- */
  kvc_status (*attention_params_init)(kvc_attention_params *); /**< kvc_attention_params_init() */
  /** kvc_attention_decode() */
  kvc_status (*attention_decode)(kvc_pool *, uint32_t, const uint64_t *, size_t, const void *,
                                 void *, float *, const kvc_attention_params *);
  /** kvc_attention_prefill() */
  kvc_status (*attention_prefill)(kvc_pool *, uint32_t, uint64_t, const void *, uint64_t, void *,
                                  float *, const kvc_attention_params *);
  /** kvc_seq_observe_scores() */
  kvc_status (*seq_observe_scores)(kvc_pool *, uint64_t, uint32_t, const float *, uint64_t, int);
  /** kvc_seq_scores() */
  kvc_status (*seq_scores)(kvc_pool *, uint64_t, uint32_t, float *, uint64_t);
  /** kvc_seq_rope_positions() */
  kvc_status (*seq_rope_positions)(kvc_pool *, uint64_t, uint32_t, uint64_t, uint64_t, int32_t *);
  kvc_status (*policy_config_init)(kvc_policy_config *); /**< kvc_policy_config_init() */
  kvc_status (*policy_create)(const kvc_policy_config *, kvc_policy **); /**< kvc_policy_create() */
  void (*policy_destroy)(kvc_policy *); /**< kvc_policy_destroy() */
  /** kvc_seq_set_policy() */
  kvc_status (*seq_set_policy)(kvc_pool *, uint64_t, const kvc_policy *);
  kvc_status (*pool_set_policy)(kvc_pool *, const kvc_policy *); /**< kvc_pool_set_policy() */
  kvc_status (*evict)(kvc_pool *, uint64_t, const kvc_policy *, uint64_t *); /**< kvc_evict() */
  kvc_status (*plugin_load)(const char *, kvc_plugin **); /**< kvc_plugin_load() */
  void (*plugin_unload)(kvc_plugin *);                    /**< kvc_plugin_unload() */
  const char *(*plugin_name)(const kvc_plugin *);         /**< kvc_plugin_name() */
  kvc_status (*prefix_config_init)(kvc_prefix_config *);  /**< kvc_prefix_config_init() */
  /** kvc_pool_enable_prefix_cache() */
  kvc_status (*pool_enable_prefix_cache)(kvc_pool *, const kvc_prefix_config *);
  kvc_status (*prefix_lookup)(kvc_pool *, const int32_t *, uint64_t, const kvc_prefix_extra *,
                              uint32_t, uint32_t, kvc_prefix_result *); /**< kvc_prefix_lookup() */
  /** kvc_prefix_attach() */
  kvc_status (*prefix_attach)(kvc_pool *, uint64_t, const int32_t *, uint64_t,
                              const kvc_prefix_extra *, uint32_t, uint32_t, kvc_prefix_result *);
  /** kvc_prefix_insert() */
  kvc_status (*prefix_insert)(kvc_pool *, uint64_t, const int32_t *, uint64_t,
                              const kvc_prefix_extra *, uint32_t, uint64_t *);
  kvc_status (*prefix_keys)(kvc_pool *, const int32_t *, uint64_t, const kvc_prefix_extra *,
                            uint32_t, uint8_t *, size_t, size_t *); /**< kvc_prefix_keys() */
  kvc_status (*prefix_stats_init)(kvc_prefix_stats *);              /**< kvc_prefix_stats_init() */
  kvc_status (*prefix_get_stats)(kvc_pool *, kvc_prefix_stats *);   /**< kvc_prefix_get_stats() */
  /** kvc_prefix_set_callback() */
  kvc_status (*prefix_set_callback)(kvc_pool *, kvc_prefix_event_fn, void *);
  kvc_status (*pool_set_stream)(kvc_pool *, void *); /**< kvc_pool_set_stream() */
  kvc_status (*pool_sync)(kvc_pool *);               /**< kvc_pool_sync() */
  /** kvc_pool_copy_blocks() */
  kvc_status (*pool_copy_blocks)(kvc_pool *, const int32_t *, size_t, void *, kvc_copy_direction);
  kvc_status (*seq_save)(kvc_pool *, uint64_t, void *, size_t, size_t *); /**< kvc_seq_save() */
  kvc_status (*seq_restore)(kvc_pool *, uint64_t, const void *, size_t);  /**< kvc_seq_restore() */
  kvc_status (*seq_save_file)(kvc_pool *, uint64_t, const char *);    /**< kvc_seq_save_file() */
  kvc_status (*seq_restore_file)(kvc_pool *, uint64_t, const char *); /**< kvc_seq_restore_file() */
  kvc_status (*tier_config_init)(kvc_tier_config *, kvc_tier_kind);   /**< kvc_tier_config_init() */
  /** kvc_pool_add_tier() */
  kvc_status (*pool_add_tier)(kvc_pool *, const kvc_tier_config *, uint32_t *);
  kvc_status (*pool_set_offload)(kvc_pool *, uint32_t, uint32_t); /**< kvc_pool_set_offload() */
  kvc_status (*tier_stats_init)(kvc_tier_stats *);                /**< kvc_tier_stats_init() */
  /** kvc_pool_tier_stats() */
  kvc_status (*pool_tier_stats)(kvc_pool *, uint32_t, kvc_tier_stats *);
  kvc_status (*prefix_offload)(kvc_pool *, const int32_t *, uint64_t, const kvc_prefix_extra *,
                               uint32_t, uint64_t *); /**< kvc_prefix_offload() */
  kvc_status (*pool_flush_tiers)(kvc_pool *);         /**< kvc_pool_flush_tiers() */
  kvc_status (*prefix_load)(kvc_pool *, const int32_t *, uint64_t, const kvc_prefix_extra *,
                            uint32_t, uint64_t *); /**< kvc_prefix_load() */
  kvc_status (*prefix_prefetch)(kvc_pool *, const int32_t *, uint64_t, const kvc_prefix_extra *,
                                uint32_t, uint64_t *);         /**< kvc_prefix_prefetch() */
  kvc_status (*prefix_poll)(kvc_pool *, uint64_t, uint64_t *); /**< kvc_prefix_poll() */
  kvc_status (*prefix_unpin)(kvc_pool *, uint64_t);            /**< kvc_prefix_unpin() */
  /* --- version 4 (0.4) --- */
  /** kvc_pool_config_init_sized() */
  kvc_status (*pool_config_init_sized)(kvc_pool_config *, size_t);
  kvc_status (*stats_init_sized)(kvc_stats *, size_t); /**< kvc_stats_init_sized() */
  /** kvc_pool_layout_init_sized() */
  kvc_status (*pool_layout_init_sized)(kvc_pool_layout *, size_t);
  kvc_status (*codec_init_sized)(kvc_codec *, size_t); /**< kvc_codec_init_sized() */
  /** kvc_quant_sizes_init_sized() */
  kvc_status (*quant_sizes_init_sized)(kvc_quant_sizes *, size_t);
  /** kvc_attention_params_init_sized() */
  kvc_status (*attention_params_init_sized)(kvc_attention_params *, size_t);
  /** kvc_policy_config_init_sized() */
  kvc_status (*policy_config_init_sized)(kvc_policy_config *, size_t);
  /** kvc_prefix_config_init_sized() */
  kvc_status (*prefix_config_init_sized)(kvc_prefix_config *, size_t);
  /** kvc_prefix_stats_init_sized() */
  kvc_status (*prefix_stats_init_sized)(kvc_prefix_stats *, size_t);
  /** kvc_tier_config_init_sized() */
  kvc_status (*tier_config_init_sized)(kvc_tier_config *, kvc_tier_kind, size_t);
  kvc_status (*tier_stats_init_sized)(kvc_tier_stats *, size_t); /**< kvc_tier_stats_init_sized() */
  /** kvc_seq_keep() */
  kvc_status (*seq_keep)(kvc_pool *, uint64_t, uint32_t, const uint64_t *, uint64_t, uint64_t *);
  /* --- version 5 (0.4) --- */
  /** kvc_pool_seq_bytes() */
  kvc_status (*pool_seq_bytes)(const kvc_pool_config *, uint64_t, uint64_t *, uint64_t *);
  /* --- version 6 (0.4) --- */
  /** kvc_seq_observe_queries() */
  kvc_status (*seq_observe_queries)(kvc_pool *, uint64_t, uint32_t, const void *, kvc_dtype,
                                    uint64_t, uint32_t, const int32_t *);
  /* --- version 7 (0.4) --- */
  /** kvc_store_open() */
  kvc_status (*store_open)(const kvc_tier_config *, const void *, size_t, kvc_store **);
  void (*store_close)(kvc_store *); /**< kvc_store_close() */
  /** kvc_store_put() */
  kvc_status (*store_put)(kvc_store *, const void *, size_t, const void *, size_t);
  /** kvc_store_get() */
  kvc_status (*store_get)(kvc_store *, const void *, size_t, void *, size_t, size_t *, int32_t *);
  /** kvc_store_contains() */
  kvc_status (*store_contains)(kvc_store *, const void *const *, const size_t *, size_t, uint8_t *);
  /** kvc_store_remove() */
  kvc_status (*store_remove)(kvc_store *, const void *, size_t, int32_t *);
  /** kvc_store_pin() */
  kvc_status (*store_pin)(kvc_store *, const void *, size_t, int32_t, int32_t *);
  kvc_status (*store_stats)(kvc_store *, kvc_tier_stats *); /**< kvc_store_stats() */
  /* --- version 8 (0.4) --- */
  /** kvc_seq_import_llama() */
  kvc_status (*seq_import_llama)(kvc_pool *, uint64_t, const void *, size_t, uint32_t, uint64_t *);
  /** kvc_seq_export_llama() */
  kvc_status (*seq_export_llama)(kvc_pool *, uint64_t, int32_t, kvc_llama_type, kvc_llama_type,
                                 uint32_t, void *, size_t, size_t *);
  /* --- version 9 (0.4) --- */
  /** kvc_seq_head_tokens() */
  kvc_status (*seq_head_tokens)(kvc_pool *, uint64_t, uint32_t, uint32_t, uint64_t *);
  /** kvc_gather_head() */
  kvc_status (*gather_head)(kvc_pool *, uint64_t, uint32_t, uint32_t, uint64_t, uint64_t, void *,
                            void *, kvc_dtype, int32_t *);
  /** kvc_seq_head_block_table() */
  kvc_status (*seq_head_block_table)(kvc_pool *, uint64_t, uint32_t, uint32_t, int32_t *, size_t,
                                     size_t *);
  /** kvc_export_head_page_table() */
  kvc_status (*export_head_page_table)(kvc_pool *, uint32_t, const uint64_t *, size_t, int32_t *,
                                       int32_t *, size_t, int32_t *, size_t *);
  /** kvc_seq_keep_head() */
  kvc_status (*seq_keep_head)(kvc_pool *, uint64_t, uint32_t, uint32_t, const uint64_t *, uint64_t,
                              uint64_t *);
  /* --- version 10 (0.4) --- */
  /** kvc_pool_set_key_smoothing() */
  kvc_status (*pool_set_key_smoothing)(kvc_pool *, const float *, const float *, size_t);
  /* --- version 11 (0.4) --- */
  /** kvc_pool_set_codebook() */
  kvc_status (*pool_set_codebook)(kvc_pool *, uint32_t, const float *, size_t);
  /** kvc_codebook_gaussian() */
  kvc_status (*codebook_gaussian)(uint32_t, uint64_t, float *);
} kvc_api;

/**
 * @brief The function table for a requested version (the only symbol a
 * dlopen() host needs to look up).
 * @param api_version 1..KVC_API_VERSION of the library.
 * @return A static table whose first fields are those of `api_version` (the
 * same table serves every version: newer fields follow the older ones), or
 * NULL when the library is older than asked (or api_version is 0). The
 * thread's last error message says why.
 * @since 0.1
 */
KVC_API const kvc_api *kvc_get_api(uint32_t api_version);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVCACHE_KVCACHE_H */
