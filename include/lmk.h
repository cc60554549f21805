/*
 * lmk.h - language-model kernels: the whole public API of lmk.
 *
 * lmk is a C11 library of compute kernels for large-language-model inference, with a CUDA backend
 * for NVIDIA GPUs and a CPU backend that runs everywhere. This header is the manual: every
 * declaration says its contract, its units, who owns what, what is thread-safe and every status it
 * can return.
 *
 * Conventions that hold everywhere:
 *  - Every call that can fail returns an lmk_status. On failure, lmk_last_error() returns a message
 *    for the calling thread that names the function or op and the value that broke the rule, e.g.
 *    "repeat_tiled: h (5) must be a multiple of hg (2)". The library never prints, exits or aborts.
 *  - A call that fails validation changes nothing: no buffer byte is written, no handle is created.
 *  - Destroy/free/close functions accept NULL and do nothing for it.
 *  - Tensors are row-major. Buffers made by alloc, wrap and view are dense; a strided view
 *    (lmk_buffer_view_strided) names a stride per axis. Shapes and strides are element counts,
 *    offsets and lengths are bytes. What an op accepts is under "Operands" below.
 *  - Ops take the stream first, then inputs, then outputs, then a parameter struct.
 *  - An op call validates, then only enqueues work: it performs no heap allocation, no
 *    host-device synchronisation and no host copy, so it is usable on a decode hot path and inside
 *    a captured CUDA graph.
 *  - Stack: an op call uses at most 16 KiB of the calling thread's stack, whatever the shapes and
 *    the optimisation level of the build, so ops may be called from threads with small stacks
 *    (32 KiB ones are tested). On the CPU the calling thread runs a share of the work; the tables
 *    of each share live in memory its stream allocated when it was created. The bound counts
 *    libm and libc, and the dynamic loader's binding of a symbol on its first call (measured with
 *    gcc and clang at every instruction-set level: optimised builds 2-6 KiB for every op and a
 *    rejected call, unoptimised (-O0) ones up to 14 KiB, clang with AVX-512). On CUDA the
 *    runtime's launch frames come on top.
 *  - Results are deterministic: on one device of one build, the same inputs give bit-identical
 *    outputs on every run, whatever the thread count (lmk_device_set_threads, LMK_NUM_THREADS) and
 *    whatever floating-point environment the calling thread has set: its rounding mode
 *    (fesetround) and, on x86, the MXCSR flush-to-zero and denormals-are-zero bits that
 *    -ffast-math programs set. A CPU op runs under round-to-nearest with FTZ/DAZ off and gives the
 *    caller its environment back (exception flags the op raised stay raised); CUDA kernels never
 *    see the host's environment (each instruction's rounding is fixed). Bits are not promised to
 *    match across backends or CPU instruction-set levels (the device name shows the level: the
 *    scalar and vector paths differ in the last bits): those agree within each op's precision.
 *  - Threads: any thread may call any function. Different threads may use different streams of one
 *    device at the same time. One stream must not be used by two threads at once.
 */
#ifndef LMK_H
#define LMK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define LMK_API
#elif defined(__GNUC__)
#define LMK_API __attribute__((visibility("default")))
#else
#define LMK_API
#endif

/* The version of lmk, kept here and nowhere else: CMake reads these three lines for the project's
 * version (the soname, lmk.pc, lmkConfigVersion.cmake), lmk_version() is made of them, and the
 * Python package reads them too. Change them with every release. */
#define LMK_VERSION_MAJOR 0
#define LMK_VERSION_MINOR 3
#define LMK_VERSION_PATCH 0

/* ------------------------------------------------------------------------------------------------
 * Status and messages
 * ---------------------------------------------------------------------------------------------- */

typedef enum lmk_status {
    LMK_OK = 0,
    LMK_ERR_INVALID_ARGUMENT = 1, /* shape, dtype, buffer or parameter breaks the op's contract */
    LMK_ERR_UNSUPPORTED = 2,      /* valid, but this build or device cannot do it (e.g. no CUDA) */
    LMK_ERR_OUT_OF_MEMORY = 3,
    LMK_ERR_DEVICE = 4,           /* driver or runtime failure, including asynchronous faults */
    LMK_ERR_NOT_FOUND = 5         /* no such device or kernel */
} lmk_status;

/* The enum's name, e.g. "LMK_ERR_INVALID_ARGUMENT"; "LMK_UNKNOWN_STATUS" for other values. */
LMK_API const char *lmk_status_name(lmk_status s);

/* The calling thread's last failure message; "" if none. The message stays until the next failing
 * call on this thread (successful calls do not clear it). The pointer is valid until then. */
LMK_API const char *lmk_last_error(void);

/* Clears this thread's message, so that lmk_last_error() returns "". */
LMK_API void lmk_clear_error(void);

/* "MAJOR.MINOR.PATCH" of the macros above, e.g. "0.3.0": the version of the library linked, which
 * may differ from the header a program was compiled with. */
LMK_API const char *lmk_version(void);

/* A one-line description of how this library was built, e.g. "cuda=yes (sm_90;PTX) simd=avx2". */
LMK_API const char *lmk_build_info(void);

/* ------------------------------------------------------------------------------------------------
 * Element types
 * ---------------------------------------------------------------------------------------------- */

typedef enum lmk_dtype {
    LMK_F32 = 0,
    LMK_F16 = 1,
    LMK_BF16 = 2,
    LMK_U8 = 3,
    LMK_U16 = 4,
    LMK_U32 = 5,
    LMK_I32 = 6,
    LMK_I64 = 7,
    LMK_F8E4M3 = 8 /* OCP FP8 E4M3FN: bias 7, max 448, no infinities, NaN 0x7F/0xFF */
} lmk_dtype;
#define LMK_DTYPE_COUNT 9

/* Bytes per element; 0 for a value that is not an lmk_dtype. */
LMK_API size_t lmk_dtype_size(lmk_dtype t);
/* "f32", "f16", "bf16", "u8", "u16", "u32", "i32", "i64", "f8e4m3"; "invalid" for other values. */
LMK_API const char *lmk_dtype_name(lmk_dtype t);

/* Exact conversions used by every backend. Widening is exact. Narrowing rounds to nearest, ties to
 * even; overflow gives infinity; a NaN stays a NaN (quiet, sign kept). */
LMK_API float    lmk_bf16_to_f32(uint16_t h);
LMK_API uint16_t lmk_f32_to_bf16(float f);
LMK_API float    lmk_f16_to_f32(uint16_t h);
LMK_API uint16_t lmk_f32_to_f16(float f);
/* OCP E4M3FN: widening is exact (0x7F/0xFF give NaN). Narrowing rounds to nearest, ties to even,
 * and saturates: every finite value beyond +-448 (infinity included) gives +-448; NaN gives 0x7F
 * with the sign kept (0xFF for a negative NaN). */
LMK_API float   lmk_f8e4m3_to_f32(uint8_t v);
LMK_API uint8_t lmk_f32_to_f8e4m3(float f);

/* ------------------------------------------------------------------------------------------------
 * Host memory allocator hook
 *
 * Every host allocation the library makes (handles, thread pools, messages never allocate) goes
 * through these functions. Install a hook to count, pool or fail allocations. Set it while no
 * other thread is inside the library and no handle is alive; NULL, or a struct with alloc and free
 * both NULL, restores malloc/free. alloc and free must both be set or both NULL: a hook with only
 * one of them is refused, the allocator in place stays, and lmk_last_error() says
 * "lmk_set_allocator: alloc and free must both be set or both NULL ...". alloc must return memory
 * aligned to `alignment` (a power of two: 16 for handles, 64 for CPU buffers and thread pools); a
 * pointer that is not is handed back to free and counts as a failure. A failing allocation makes the call
 * that needed it return LMK_ERR_OUT_OF_MEMORY (for a misaligned pointer the message says "the
 * allocator hook returned a pointer (...) not aligned to 64 bytes"), leak nothing and leave the
 * library usable. Device memory (CUDA) is not allocated through this hook.
 * ---------------------------------------------------------------------------------------------- */

typedef struct lmk_allocator {
    void *(*alloc)(size_t size, size_t alignment, void *user); /* NULL on failure */
    void (*free)(void *ptr, void *user);
    void *user;
} lmk_allocator;
LMK_API void lmk_set_allocator(const lmk_allocator *a);

/* ------------------------------------------------------------------------------------------------
 * Devices
 * ---------------------------------------------------------------------------------------------- */

typedef enum lmk_backend { LMK_BACKEND_AUTO = 0, LMK_BACKEND_CPU = 1, LMK_BACKEND_CUDA = 2 } lmk_backend;

typedef struct lmk_device lmk_device; /* opaque handles */
typedef struct lmk_buffer lmk_buffer;
typedef struct lmk_stream lmk_stream;

/* Opens device number `ordinal` of `backend`. AUTO opens CUDA device `ordinal` when this build has
 * CUDA and a GPU is usable, else the CPU. The CPU backend has one device, ordinal 0. On a GPU of
 * compute capability 9.0 or later (with code built for it), kernels launch with programmatic
 * dependent launch: an op's kernel may start while the previous kernel of the stream finishes, and
 * waits for it to complete before it touches memory, so results and ordering are unchanged; the
 * environment variable LMK_CUDA_PDL=0, read here, turns it off for the device. On the same GPUs
 * some prefill launches use the bulk copies of sm_90 (lmk_rope: docs/cuda.md, "rope: the four kernels"); LMK_CUDA_BULK=0,
 * also read here, gives those launches the kernels older GPUs run, with the same results, and
 * LMK_CUDA_TMAP=0 keeps only the bulk copies that need no tensor map (strided and in-place rope
 * prompts then take the other kernels), with the same results too.
 * Errors: INVALID_ARGUMENT (unknown backend, negative ordinal, out NULL); UNSUPPORTED (CUDA asked
 * for in a build without CUDA); NOT_FOUND (no such ordinal, or no usable GPU); DEVICE (the driver
 * failed); OUT_OF_MEMORY. */
LMK_API lmk_status lmk_device_open(lmk_backend backend, int ordinal, lmk_device **out);
/* Closes the device. Every buffer and stream made on it must be freed first. */
LMK_API void lmk_device_close(lmk_device *dev);
LMK_API lmk_backend lmk_device_backend(const lmk_device *dev);
/* "cpu (2 threads, avx2)" or "NVIDIA H200 (sm_90, 132 SMs)". Valid while the device is open. The
 * CPU name shows the thread count of lmk_device_set_threads: that call rewrites the text in place
 * (the pointer stays the same), so do not read the name on one thread while another calls
 * lmk_device_set_threads on the device. */
LMK_API const char *lmk_device_name(const lmk_device *dev);
/* Number of devices of a backend this process can open (CPU: 1; CUDA: 0 without GPU or support). */
LMK_API int lmk_device_count(lmk_backend backend);

/* CPU: worker threads used by streams created after this call (default: the LMK_NUM_THREADS
 * environment variable, else the number of online cores). n_threads <= 0 restores the default.
 * The device name changes at this call to show the new count (see lmk_device_name). CUDA devices
 * ignore it. Errors: INVALID_ARGUMENT (dev NULL, n_threads > 1024). */
LMK_API lmk_status lmk_device_set_threads(lmk_device *dev, int n_threads);
/* CPU: the worker-thread count a stream created now gets (the last lmk_device_set_threads, else
 * the default above); a stream keeps the count it was created with. 0 for CUDA devices and NULL. */
LMK_API int lmk_device_threads(const lmk_device *dev);

/* ------------------------------------------------------------------------------------------------
 * Buffers
 *
 * A buffer is memory on a device plus a dtype and a shape (at most LMK_MAX_DIMS dimensions). Its
 * element count is the product of the shape and its byte length may exceed element count times
 * element size (pooled memory); ops say which of the two they check. shape NULL with ndim 0 means
 * the 1-D shape [byte_len / dtype size]. CPU buffer memory is host memory; CUDA buffer memory is
 * device memory (cudaMalloc), read and written with lmk_buffer_read/lmk_buffer_write.
 * Errors common to all constructors: INVALID_ARGUMENT (NULL out or device, unknown dtype, ndim
 * outside [0, LMK_MAX_DIMS], a shape whose byte size overflows or exceeds byte_len; a shape with an
 * axis of 0 has 0 elements and 0 bytes, whatever its other axes). wrap and view
 * also reject memory not aligned to the element size (e.g. an f32 view at byte offset 2).
 * ---------------------------------------------------------------------------------------------- */

#define LMK_MAX_DIMS 8

/* Allocates byte_len bytes (zero-filled) on the device. byte_len may be 0. Errors as above, and
 * OUT_OF_MEMORY, DEVICE. */
LMK_API lmk_status lmk_buffer_alloc(lmk_device *dev, size_t byte_len, lmk_dtype dtype,
                                    const size_t *shape, int ndim, lmk_buffer **out);
/* Wraps memory the caller owns (host memory for the CPU, device memory for CUDA) without copying;
 * the memory must outlive the buffer and is never freed by lmk. ptr may be NULL only when
 * byte_len is 0. */
LMK_API lmk_status lmk_buffer_wrap(lmk_device *dev, void *ptr, size_t byte_len, lmk_dtype dtype,
                                   const size_t *shape, int ndim, lmk_buffer **out);
/* A buffer sharing parent's memory from byte_offset, holding exactly the shape's bytes (shape NULL,
 * ndim 0: the rest of the parent). It must be freed before its parent. Errors: INVALID_ARGUMENT
 * when the view does not fit inside the parent. */
LMK_API lmk_status lmk_buffer_view(const lmk_buffer *parent, size_t byte_offset, lmk_dtype dtype,
                                   const size_t *shape, int ndim, lmk_buffer **out);
LMK_API void lmk_buffer_free(lmk_buffer *buf);
/* Copies n bytes host->buffer (write) or buffer->host (read) at byte_offset. They order after all
 * work queued on the device's streams that touches the buffer only if the caller synced those
 * streams first. Errors: INVALID_ARGUMENT (NULL pointer with n > 0, range outside the buffer);
 * DEVICE. */
LMK_API lmk_status lmk_buffer_write(lmk_buffer *buf, size_t byte_offset, const void *src, size_t n);
LMK_API lmk_status lmk_buffer_read(const lmk_buffer *buf, size_t byte_offset, void *dst, size_t n);
LMK_API size_t    lmk_buffer_byte_len(const lmk_buffer *buf);        /* 0 for NULL */
LMK_API size_t    lmk_buffer_element_count(const lmk_buffer *buf);   /* product of shape; 0 for NULL */
LMK_API lmk_dtype lmk_buffer_dtype(const lmk_buffer *buf);
LMK_API int       lmk_buffer_ndim(const lmk_buffer *buf);
LMK_API size_t    lmk_buffer_dim(const lmk_buffer *buf, int axis);   /* 0 outside [0, ndim) */
LMK_API lmk_device *lmk_buffer_device(const lmk_buffer *buf);
/* The memory address of the buffer's first byte (host or device address by backend). */
LMK_API void     *lmk_buffer_data(const lmk_buffer *buf);

/* A strided view of parent's memory: element (i0, i1, ...) sits at byte
 *     byte_offset + (i0*strides[0] + i1*strides[1] + ...) * dtype size
 * of the parent. Strides are in elements and may be any value (0 and overlapping layouts too: each
 * op says what it accepts). The view must start at an offset aligned to the element size and its
 * furthest element must end inside the parent. Its element count is the product of the shape; its
 * byte length is the span up to the last byte of its furthest element (0 when an axis is 0: such a
 * view has no element and is contiguous, whatever its other axes and strides). E.g. q
 * of a Qwen3.5 [T, Hq, 2D] q|gate projection is shape {T, Hq, D}, strides {2*Hq*D, 2*D, 1} at 0.
 * It must be freed before its parent. Errors: INVALID_ARGUMENT (NULL parent, out, or shape or
 * strides with ndim > 0; ndim outside [1, LMK_MAX_DIMS]; unknown dtype; misaligned offset; a span
 * that overflows or leaves the parent); OUT_OF_MEMORY. */
LMK_API lmk_status lmk_buffer_view_strided(const lmk_buffer *parent, size_t byte_offset, lmk_dtype dtype,
                                           const size_t *shape, const size_t *strides, int ndim,
                                           lmk_buffer **out);
/* The stride of an axis in elements; 0 for NULL or an axis outside [0, ndim). */
LMK_API size_t lmk_buffer_stride(const lmk_buffer *buf, int axis);
/* 1 when the buffer is dense row-major (strides of axes of length 1 are ignored) or has no element,
 * else 0. */
LMK_API int    lmk_buffer_is_contiguous(const lmk_buffer *buf);

/* ------------------------------------------------------------------------------------------------
 * Streams
 *
 * A stream orders work on one device. Ops are queued on it and may run asynchronously;
 * lmk_stream_sync waits for all of it and reports asynchronous failures. On the CPU an op runs to
 * completion on the stream's own worker threads before the call returns, so sync only returns
 * LMK_OK; the ops' working memory (192 KiB per thread, most of it the chunked Gated DeltaNet
 * prefill's arrays, and 8 KiB shared) is the stream's, allocated when it is created. On CUDA an op only enqueues kernels; faults during them surface as
 * LMK_ERR_DEVICE at a later call or at lmk_stream_sync. Such a fault (e.g. an op on a buffer
 * wrapping freed device memory) is sticky: the device stays unusable in this process, every later
 * call on it returns LMK_ERR_DEVICE, and only freeing/closing its handles still works (lmk_cuda.h
 * has the detail).
 *
 * fork(): CPU handles made before a fork() keep working in the child (Python's multiprocessing
 * does this). A stream's worker threads do not exist there; the child's first op on the stream
 * that is large enough to use them starts new ones (or, if it cannot, that stream runs its ops on
 * the calling thread alone: same results, slower), and lmk_stream_destroy frees the stream
 * without waiting for the parent's threads. The child is recognised through pthread_atfork, so
 * this holds for fork() and what calls it, not for a raw clone system call. A handle that another
 * thread was creating, destroying or running an op on at the moment of the fork must not be used
 * in the child. CUDA handles cannot be used in a fork child (a CUDA restriction).
 * ---------------------------------------------------------------------------------------------- */

LMK_API lmk_status lmk_stream_create(lmk_device *dev, lmk_stream **out);
LMK_API lmk_status lmk_stream_sync(lmk_stream *s);
/* Waits for the stream's work, then frees it. */
LMK_API void       lmk_stream_destroy(lmk_stream *s);
LMK_API lmk_device *lmk_stream_device(const lmk_stream *s);

/* ------------------------------------------------------------------------------------------------
 * Operands (every op)
 *
 * An op operand of logical shape [T, H, D] (tokens, heads, elements of a head) is either
 *   (a) a dense buffer of exactly T*H*D elements, whatever its declared shape, or
 *   (b) a 3-D buffer of shape exactly [T, H, D] whose last axis has stride 1, with any token and
 *       head strides: q inside a [q | gate] projection, q, k or v inside a packed QKV projection,
 *       a KV cache viewed as [n_slots, H, D] rows.
 * Anything else is INVALID_ARGUMENT naming the operand, its shape and its strides. Positions,
 * freq_factors, slots and norm weights are dense buffers counted by elements.
 *
 * Overlap is judged on elements, not on extents. An output may be exactly its own input (same
 * address, shape and strides, strides of axes of length 1 ignored): in place. Otherwise an output
 * shares no byte with any other operand, and its own elements are distinct (no stride 0 on an axis
 * longer than 1, no self-overlapping layout). So q and k rotated in place inside one packed QKV
 * buffer are accepted (their extents interleave, their elements do not), while a real overlap is
 * rejected and changes nothing. The rule is exact, for any number of heads, for tensors side by side
 * in one row (packed QKV, q|gate, KV caches) and for tensors interleaved head by head (GPT-NeoX's
 * [T, H, 3, D] q, k and v; [rows, Hk, 2, D] caches of k and v). For other layouts lmk may reject
 * a layout it cannot prove disjoint.
 * ---------------------------------------------------------------------------------------------- */

/* ------------------------------------------------------------------------------------------------
 * repeat_tiled: tiled GQA head broadcast
 *
 *     src [seq, hg, k]  ->  dst [seq, h, k],   dst[t, i, j] = src[t, i % hg, j],   h % hg == 0
 *
 * Head i of the output reads head i % hg: the GGUF / llama.cpp ggml_repeat_4d order, not Hugging
 * Face's repeat_interleave (block) order i / (h / hg). A pure copy of any element size: the output
 * is bit-identical to the source. src and dst must be on the stream's device with equal dtypes.
 * A dense buffer must hold at least seq*hg*k (src) or seq*h*k (dst) elements (by byte length;
 * larger buffers are accepted, their first elements are used). A strided view (not dense) must be
 * a [seq, hg, k] / [seq, h, k] operand ("Operands" (b): that shape exactly, last stride 1), and
 * its strides are honoured: the bytes between its rows are not touched. src and dst must not
 * overlap (dense buffers: their used bytes; with a strided view, element by element).
 *
 * Errors (INVALID_ARGUMENT, checked in this order): NULL stream/buffer/params; any of seq, hg, h, k
 * is 0; h not a multiple of hg; seq*hg*k or seq*h*k overflows; dtype mismatch; src or dst too
 * small, or a strided view of another shape (src first); a buffer on another device; overlapping
 * src and dst, or a dst whose elements overlap each other. DEVICE: launch failure (CUDA).
 * ---------------------------------------------------------------------------------------------- */

typedef struct lmk_repeat_tiled_params {
    uint32_t seq, hg, h, k;
} lmk_repeat_tiled_params;

LMK_API lmk_status lmk_repeat_tiled(lmk_stream *s, const lmk_buffer *src, lmk_buffer *dst,
                                    const lmk_repeat_tiled_params *p);

/* ------------------------------------------------------------------------------------------------
 * rope_multi: multi-section rotary position embedding (Qwen2-VL MROPE, Qwen3-VL/3.5/3.6 IMROPE)
 *
 *     input, output [seq_len, n_heads, head_dim]  f32, bf16 or f16
 *     positions     i32 (u32 is read as i32), 4*seq_len entries, axis-major:
 *                   t = positions[i], h = positions[T+i], w = positions[2T+i], e = positions[3T+i]
 *
 * For each token i and rotated pair p in [0, rope_dim/2), with sect = s0+s1+s2+s3 (0 counts as 1)
 * and sector = p % sect, the pair's axis is:
 *
 *     MROPE  (8):  contiguous sections   sector < s0 -> t, < s0+s1 -> h, < s0+s1+s2 -> w, else e
 *                  e.g. [2,1,1,0]:       t t h w | t t h w | ...
 *     IMROPE (40): interleaved           sector%3==0 && sector<3*s0 -> t, ==1 && <3*s1 -> h,
 *                                        ==2 && <3*s2 -> w, else e
 *                  e.g. [11,11,10,0]:    t h w t h w ... t h w t h e e
 *
 *     theta = pos_axis(i) * freq_base^(-2p/rope_dim)     (p counts across sections)
 *     out_a = a*cos(theta) - b*sin(theta),   out_b = a*sin(theta) + b*cos(theta)
 *
 * The pair (a, b) is chosen by params.pairing:
 *     LMK_ROPE_PAIR_HALF_ROPE (0, default): (x[p], x[p + rope_dim/2]), Hugging Face rotate_half and
 *         ggml NeoX; elements [rope_dim, head_dim) are copied. Use this for published weights.
 *     LMK_ROPE_PAIR_HALF_HEAD (1): (x[p], x[p + head_dim/2]), the Metal seed's kernel; elements
 *         [rope_dim/2, head_dim/2) and [head_dim/2 + rope_dim/2, head_dim) are copied.
 * The two agree only when rope_dim == head_dim. Copied elements are bit-exact in every dtype.
 *
 * Precision: the angle is formed and reduced in float64, so f32 results stay within 1e-5 of a
 * float64 reference for |x| <= 2 at any |angle| up to 2^20 radians (with freq_base >= 1: any
 * |position| up to 2^20), and bf16/f16 results within one ulp of it plus 1e-6. Larger angles (only
 * with freq_base < 1) are computed from the same float64 angle but the contract does not cover
 * them: a float64 angle itself is then uncertain by more than 1e-5 radians.
 * bf16/f16 are widened exactly, computed in f32 and rounded to nearest-even on store.
 * input == output (same buffer memory, same offset) rotates in place; partial overlap is an error.
 * Sections are not validated: a sum smaller than rope_dim/2 wraps.
 *
 * Errors (INVALID_ARGUMENT, in this order): NULL stream/buffer/params; head_dim, rope_dim, n_heads,
 * seq_len not all > 0; head_dim or rope_dim odd; rope_dim > head_dim; freq_base not finite and
 * positive; input or output element count != seq_len*n_heads*head_dim; dtype mismatch; positions
 * length != 4*seq_len; positions dtype not i32/u32; input dtype not f32/bf16/f16; unknown mode;
 * unknown pairing; a buffer on another device; partial overlap of input and output, or overlap of
 * output and positions. DEVICE: launch failure (CUDA).
 * ---------------------------------------------------------------------------------------------- */

/* Rope modes (ggml's numbers). lmk_rope_multi takes MROPE and IMROPE; lmk_rope takes all five. */
typedef enum lmk_rope_mode {
    LMK_ROPE_NORMAL = 0,  /* GPT-J: pairs (x[2p], x[2p+1]) */
    LMK_ROPE_NEOX = 2,    /* Llama, Qwen, Mistral: rotate_half, pairs (x[p], x[p + rope_dim/2]) */
    LMK_ROPE_MROPE = 8,   /* Qwen2-VL text: contiguous sections */
    LMK_ROPE_VISION = 24, /* Qwen2-VL / 2.5-VL ViT: sections, exponent restarting per section */
    LMK_ROPE_IMROPE = 40  /* Qwen3-VL, Qwen3.5 / 3.6: interleaved sections */
} lmk_rope_mode;

typedef enum lmk_rope_pairing {
    LMK_ROPE_PAIR_HALF_ROPE = 0, /* (x[p], x[p + rope_dim/2]): Hugging Face, ggml */
    LMK_ROPE_PAIR_HALF_HEAD = 1  /* (x[p], x[p + head_dim/2]): the seed */
} lmk_rope_pairing;

typedef struct lmk_rope_multi_params {
    uint32_t head_dim, rope_dim, n_heads, seq_len;
    float freq_base;
    lmk_rope_mode mode;
    uint32_t sections[4];
    lmk_rope_pairing pairing;
} lmk_rope_multi_params;

LMK_API lmk_status lmk_rope_multi(lmk_stream *s, const lmk_buffer *input, lmk_buffer *output,
                                  const lmk_buffer *positions, const lmk_rope_multi_params *p);

/* Rotates the queries and the keys of one attention layer in a single launch: the same as
 * lmk_rope_multi(q_in -> q_out) with p->n_heads heads and lmk_rope_multi(k_in -> k_out) with
 * n_k_heads heads, sharing the positions and every other parameter, with angles computed once per
 * (token, pair). Each of q and k may be in place. Errors as lmk_rope_multi (messages start "rope_multi_qk:" and
 * say "q" or "k" where a rule concerns one tensor), and INVALID_ARGUMENT when n_k_heads is 0, q and k dtypes differ, or an output
 * shares memory with any other operand (an output may equal its own input exactly: in place). The
 * inputs may overlap each other, since they are only read. */
LMK_API lmk_status lmk_rope_multi_qk(lmk_stream *s, const lmk_buffer *q_in, lmk_buffer *q_out,
                                     const lmk_buffer *k_in, lmk_buffer *k_out,
                                     const lmk_buffer *positions, const lmk_rope_multi_params *p,
                                     uint32_t n_k_heads);

/* ------------------------------------------------------------------------------------------------
 * rope: every rotary position embedding, on one tensor or on q and k in one launch
 *
 *     q_in, q_out [T, n_heads, head_dim],  k_in, k_out [T, n_k_heads, head_dim]   f32, bf16, f16
 *     positions   i32, u32 (read as i32) or i64: T entries (NORMAL, NEOX), 4*T axis-major (MROPE,
 *                 IMROPE, VISION: t = positions[i], h = positions[T+i], w = [2T+i], e = [3T+i])
 *     freq_factors NULL, or f32 with at least n_pairs entries
 *
 * Every operand may be a strided view ("Operands" above): q from a [q | gate] projection, q and k
 * (in place) inside a packed QKV buffer. Rotated pairs p in [0, n_pairs), n_pairs = rope_dim/2:
 *
 *   mode         pair (a, b)                                          axis of pair p   j, n
 *   NORMAL  0    (x[2p], x[2p+1])                                     t                p, rope_dim
 *   NEOX    2    (x[p], x[p+rope_dim/2]); HALF_HEAD: (x[p], x[p+D/2])  t                p, rope_dim
 *   MROPE   8    as NEOX                                              as rope_multi    p, rope_dim
 *   IMROPE  40   as NEOX                                              as rope_multi    p, rope_dim
 *   VISION  24   (x[p], x[p+D/2]), rope_dim == head_dim               as MROPE         p - start of
 *                                                                                      its section, D/2
 *
 * (rope_multi above draws the MROPE and IMROPE section layouts; for VISION the pair's sector is
 * p % (s0+s1+s2+s3) and j restarts at 0 at each section: [20,20] on D = 80 gives t0..t19 h0..h19.)
 * The angle and scaling are ggml's rope_yarn:
 *
 *     theta_e = pos * freq_base^(-2j/n) / ff[p]        ff = freq_factors, or 1 when NULL
 *     theta_i = freq_scale * theta_e
 *     ext_factor == 0:  theta = theta_i,  m = attn_factor
 *     ext_factor != 0:  corr(b) = n * ln(n_ctx_orig / (2 pi b)) / (2 ln freq_base)
 *                       low  = max(0, floor(corr(beta_fast))),  high = min(n - 1, ceil(corr(beta_slow)))
 *                       ramp = (1 - clamp((p - low) / max(0.001, high - low), 0, 1)) * ext_factor
 *                       theta = theta_i * (1 - ramp) + theta_e * ramp
 *                       m = attn_factor * (1 + 0.1 * ln(1 / freq_scale))
 *     out_a = (a cos(theta) - b sin(theta)) * m,   out_b = (a sin(theta) + b cos(theta)) * m
 *
 * Zero fields mean the default: freq_scale 1, attn_factor 1, beta_fast 32, beta_slow 1. Elements
 * outside the rotated pairs are copied bit-exactly and never scaled. Hugging Face rope_type maps:
 * linear: freq_scale = 1/factor. yarn (truncate true): freq_scale = 1/factor, ext_factor = 1,
 * n_ctx_orig = original_max_position_embeddings. dynamic: pass the adjusted freq_base. llama3,
 * longrope and yarn with truncate false: freq_factors[p] = freq_base^(-2p/n) / inv_freq_HF[p] and
 * attn_factor = HF's attention_scaling.
 *
 * Precision: as rope_multi, with f32 results within 1e-5 * max(1, m) of the float64 result. q and
 * k share the positions and every parameter; cos/sin are computed once per (token, pair). Each
 * output may equal its input exactly (in place); k_in and k_out are both NULL (q only) or both
 * given. The call is deterministic: outputs depend on the inputs only, never on the caller's
 * floating-point environment (rounding mode), thread count or the device's scheduling.
 *
 * Errors (INVALID_ARGUMENT, in this order, each message naming the value and the rule):
 *   R1  NULL stream, q_in, q_out, positions or params ("rope: q_in must not be NULL"); k_in
 *       without k_out or k_out without k_in;
 *   R2  head_dim, rope_dim, n_heads, seq_len not all > 0; n_k_heads == 0 with k given;
 *   R3  head_dim or rope_dim odd;
 *   R4  rope_dim > head_dim;
 *   R5  freq_base not finite and positive;
 *   R6  mode not one of the five;
 *   R7  VISION with rope_dim != head_dim;
 *   R8  pairing not HALF_ROPE or HALF_HEAD, or NORMAL with HALF_HEAD;
 *   R9  a scaling field not finite; freq_scale, attn_factor, beta_fast or beta_slow negative;
 *       ext_factor != 0 with n_ctx_orig == 0;
 *   R10 q_in, q_out, k_in, k_out not [T, heads, head_dim] operands; their dtypes differ; dtype not
 *       f32, bf16 or f16;
 *   R11 positions not dense i32/u32/i64 of exactly T (NORMAL, NEOX) or 4*T entries;
 *   R12 freq_factors not dense f32 or with fewer than n_pairs entries;
 *   R13 a buffer on another device than the stream's;
 *   R14 overlaps ("Operands" above).
 * DEVICE: launch failure (CUDA).
 * ---------------------------------------------------------------------------------------------- */

typedef struct lmk_rope_params {
    uint32_t head_dim, rope_dim, n_heads, seq_len; /* n_heads: heads of q */
    float freq_base;
    lmk_rope_mode mode;
    uint32_t sections[4];                          /* MROPE, IMROPE, VISION */
    lmk_rope_pairing pairing;                      /* NEOX, MROPE, IMROPE */
    uint32_t n_k_heads;                            /* heads of k; ignored when k_in is NULL */
    float freq_scale;                              /* 0 = 1 */
    float ext_factor;                              /* 0 = no YaRN ramp */
    float attn_factor;                             /* 0 = 1 */
    float beta_fast, beta_slow;                    /* 0 = 32, 1 */
    uint32_t n_ctx_orig;                           /* needed when ext_factor != 0 */
} lmk_rope_params;

LMK_API lmk_status lmk_rope(lmk_stream *s, const lmk_buffer *q_in, const lmk_buffer *k_in,
                            const lmk_buffer *positions, const lmk_buffer *freq_factors, lmk_buffer *q_out,
                            lmk_buffer *k_out, const lmk_rope_params *p);

/* ------------------------------------------------------------------------------------------------
 * repeat_heads: the GQA head broadcast in both layouts
 *
 *     src [seq, hg, k]  ->  dst [seq, h, k],   dst[t, i, j] = src[t, g(i), j],   h % hg == 0
 *     LMK_REPEAT_TILED (0): g(i) = i % hg          GGUF / llama.cpp (ggml_repeat_4d), repeat_tiled
 *     LMK_REPEAT_BLOCK (1): g(i) = i / (h / hg)    Hugging Face repeat_interleave / repeat_kv
 *
 * A bit-exact copy of any element size; src and dst may be strided views ("Operands" above) and
 * must not overlap. A model loaded from GGUF uses TILED, the same model from safetensors BLOCK.
 *
 * Errors (INVALID_ARGUMENT, in this order): NULL stream/buffer/params; any of seq, hg, h, k is 0;
 * h not a multiple of hg; unknown layout; src not a [seq, hg, k] or dst not a [seq, h, k]
 * operand; dtype mismatch; a buffer on another device; overlapping src and dst, or a dst whose
 * elements overlap each other. DEVICE: launch failure (CUDA).
 * ---------------------------------------------------------------------------------------------- */

typedef enum lmk_repeat_layout { LMK_REPEAT_TILED = 0, LMK_REPEAT_BLOCK = 1 } lmk_repeat_layout;

typedef struct lmk_repeat_heads_params {
    uint32_t seq, hg, h, k;
    lmk_repeat_layout layout;
} lmk_repeat_heads_params;

LMK_API lmk_status lmk_repeat_heads(lmk_stream *s, const lmk_buffer *src, lmk_buffer *dst,
                                    const lmk_repeat_heads_params *p);

/* ------------------------------------------------------------------------------------------------
 * attn_prologue: per-head RMSNorm + rope of q and k, and the KV-cache write, in one pass
 *
 *     for each token i, head h of q:   q_out[i,h]  = rope(norm_q(q_in[i,h]))
 *     for each token i, head h of k:   kk          = rope(norm_k(k_in[i,h]))
 *                                      k_out[i,h]  = kk                     (when k_out is given)
 *                                      k_cache[slots[i], h] = kk            (when k_cache is given)
 *     v (when v_cache is given):       v_cache[slots[i], h] = v_in[i,h]
 *     norm(x) = x / sqrt(mean(x^2) + eps) * (w + weight_offset)   (mean over the head's D elements)
 *
 * What every full-attention layer of Qwen3 / Qwen3.5 / Llama-style models does between its
 * projections and attention. rope is lmk_rope with every mode and scaling (params->n_k_heads is k's
 * heads); q and k share positions and parameters. The norm covers the whole head: with a norm,
 * elements outside the rotated pairs are the normed values (raw bit copies only without a norm). A
 * NULL weight means no norm on that tensor. weight_offset is 0 for Qwen3, Llama and GGUF files
 * (llama.cpp adds the 1 to the stored weights) and 1 for Qwen3.5/3.6 and Qwen3-Next Hugging Face
 * weights (x * (1 + w)). Weights are f32, bf16 or f16 with exactly head_dim elements.
 *
 * Operands ("Operands" above): q_in, k_in, v_in may be strided views (q inside a [q | gate]
 * projection, q/k/v inside a packed QKV); q_out may equal q_in and k_out k_in (in place). Caches are
 * [n_slots, n_k_heads, D] and [n_slots, n_k_heads, Dv] (a vLLM / FlashInfer NHD paged cache seen as
 * rows: row = block * block_size + offset), dense or strided; n_slots and Dv come from the
 * operands' shapes (for dense buffers: element count / (n_k_heads * D), and v_in's count / (T *
 * n_k_heads)). slots (i32 or i64, T entries) give each token's cache row; a negative slot or one
 * >= n_slots writes nothing for that token (padding). Cache dtype is the input dtype, or
 * LMK_F8E4M3 with a per-tensor scale: stored = lmk_f32_to_f8e4m3(x * inv), inv = 1.0f / scale
 * (the nearest f32, whatever the caller's rounding mode) formed once per call, x * inv the f32
 * product, x the f32 result (never a bf16-rounded one): vLLM's and FlashInfer's rule. x * inv is at
 * most one f32 ulp from the correctly rounded x / scale before the f8 rounding (so a code may
 * differ by one from x / scale's where that ulp straddles an f8 rounding boundary). k_scale /
 * v_scale 0 mean 1 and are ignored for other cache dtypes.
 *
 * Precision: computed in f32 or better with no rounding between norm and rope; results are within
 * the rope contract of the float64 chain (f32: 1e-5 * max(1, |ref|); bf16/f16: one ulp plus 1e-6;
 * f8: one f8 ulp of the chain's value times inv) where the normed values stay within rope's domain
 * (|x| <= 2 times the weight factor |w + weight_offset|, which f32 represents without overflow).
 * v in an f8 cache, and k elements stored unchanged (no norm, outside the rotated pairs), are
 * exactly lmk_f32_to_f8e4m3(x * inv).
 * Slots should name distinct rows. Where several tokens of one call name the same row, the CPU
 * backend leaves in it the whole row of the last of them (the highest token index), whatever the
 * thread count; CUDA leaves its contents unspecified (it may mix elements of those tokens). Every
 * other output is deterministic either way. A cache of 0 rows is valid: every slot misses it.
 * v_in has q_in's dtype.
 * Hugging Face rounds the normed value to bf16 before its rope, so its bf16 output may differ from
 * lmk's by a few ulps.
 *
 * Errors (INVALID_ARGUMENT, in this order): NULL stream, io, params, q_in, k_in, positions or
 * q_out; lmk_rope's rules R2-R12 for q and k (k_out optional; v_in of another dtype than q_in);
 * eps not finite or <= 0; weight_offset not finite; neither k_out nor k_cache; a cache without slots; v_in without v_cache
 * or v_cache without v_in; a weight not dense f32/bf16/f16 of exactly head_dim; slots not dense
 * i32/i64 of exactly T; k_scale or v_scale not finite or negative, or nonzero outside
 * [2^-126, 2^126] (where 1 / scale is a normal f32); a cache dtype other than the input dtype or
 * f8e4m3; a cache or v_in of the wrong shape, or Dv above 2^32 - 1 (head_dim's
 * range); a buffer on another device; overlaps
 * (every output against every other operand). UNSUPPORTED (CUDA): head_dim or Dv above 4096, or
 * more head rows per token than the kernel's grid takes (65535 groups of rows). DEVICE: launch
 * failure (CUDA).
 * ---------------------------------------------------------------------------------------------- */

typedef struct lmk_rms_norm_params {
    float eps;           /* > 0 */
    float weight_offset; /* 0: x*w (Qwen3, Llama, GGUF); 1: x*(1+w) (Qwen3.5/3.6, Qwen3-Next HF weights) */
} lmk_rms_norm_params;

typedef struct lmk_attn_prologue_io {
    const lmk_buffer *q_in, *k_in;         /* [T, n_heads, D], [T, n_k_heads, D]; strided views allowed */
    const lmk_buffer *v_in;                /* [T, n_k_heads, Dv] or NULL; needs v_cache */
    const lmk_buffer *q_norm_w, *k_norm_w; /* [D] f32/bf16/f16, or NULL: no norm on that tensor */
    const lmk_buffer *positions;           /* as lmk_rope */
    const lmk_buffer *freq_factors;        /* or NULL */
    const lmk_buffer *slots;               /* [T] i32/i64 cache rows, or NULL (then no caches) */
    lmk_buffer *q_out;                     /* [T, n_heads, D]; may equal q_in */
    lmk_buffer *k_out;                     /* [T, n_k_heads, D] or NULL; may equal k_in */
    lmk_buffer *k_cache, *v_cache;         /* [n_slots, n_k_heads, D] / [n_slots, n_k_heads, Dv] or NULL */
    float k_scale, v_scale;                /* f8 caches: stored = x * (1.0f / scale); 0 = 1 */
} lmk_attn_prologue_io;

/* At least one of k_out and k_cache is given. */
LMK_API lmk_status lmk_attn_prologue(lmk_stream *s, const lmk_attn_prologue_io *io, const lmk_rope_params *rope,
                                     const lmk_rms_norm_params *norm);

/* ------------------------------------------------------------------------------------------------
 * Gated DeltaNet: the linear-attention layer of Qwen3.5/3.6 and Qwen3-Next
 *
 * Three layers in four of these hybrid models run, between the engine's matrix products:
 *
 *     qkv = in_proj_qkv(x)                        [T, 2*Hk*dk + Hv*dv]
 *     qkv = causal_conv1d(qkv, conv_state)        lmk_causal_conv1d, SiLU, in place
 *     q, k, v = views of qkv                      [T, Hk, dk], [T, Hk, dk], [T, Hv, dv] (no copy)
 *     o = gated_delta_rule(q, k, v, a, b, state)  lmk_gated_delta_rule, with the gated RMSNorm of z
 *     y = out_proj(o)
 *
 * Sequences (both ops). One call covers a batch of sequences packed along T: cu_seqlens holds
 * n_seq + 1 offsets 0 = c0 <= c1 <= ... <= c_n = T (NULL: one sequence of all T tokens), and
 * sequence s owns tokens [c_s, c_s+1) and the state row state_slots[s] of a state pool (NULL slots:
 * row s). A negative slot, or one >= the pool's rows, means: start from zeros and store nothing
 * (padding). cu_seqlens and state_slots are device data, which a call cannot validate without
 * synchronising: whatever they hold, the op never reads or writes outside its operands (an offset
 * is clamped into [0, T] and a decreasing one ends its sequence empty; such an array gives
 * unspecified values in the outputs, never an out-of-bounds access or a hang). Two sequences of one
 * call naming the same row: the row ends holding the state of the last of them (the one with the
 * highest index), computed from the row as it was before the call; the outputs of the others are
 * unspecified on CUDA (they may read the row while it is written). Empty sequences are allowed and
 * leave their row as it was.
 *
 * Operands (lmk.h "Operands"; [T, C] and [T, H] operands are dense buffers of exactly T*C elements,
 * or 2-D buffers of exactly that shape with last stride 1 and any token stride). The state pools
 * take any strides (their elements distinct): a 3-D or 4-D buffer of exactly the pool's shape.
 * ---------------------------------------------------------------------------------------------- */

/* ------------------------------------------------------------------------------------------------
 * causal_conv1d: the depthwise causal convolution, with its state
 *
 *     y[t, c] = act( bias[c] + sum_{j=0..W-1} weight[c, j] * xx[t - (W-1) + j, c] )
 *
 * per sequence, where xx is the sequence's inputs preceded by its W-1 state rows (zeros without a
 * state) and weight[c, W-1] multiplies the current token (Hugging Face's conv1d.weight[c, 0, :]).
 * act is SiLU, x * sigmoid(x), or none. After the call the state row holds the last W-1 rows of xx
 * (a sequence shorter than W-1 shifts the older rows along).
 *
 *     x, y         [T, C] f32 / bf16 / f16, one dtype; token stride free; y may equal x (in place:
 *                  every x row a sequence needs is read before its y row is written)
 *     weight       [C, W] dense f32 / bf16 / f16 (exactly C*W elements); bias [C] or NULL
 *     cu_seqlens   [n_seq + 1] dense i32 / i64, or NULL; state_slots [n_seq] dense i32 / i64, or NULL
 *     conv_state   [n_slots, W - 1, C] of x's dtype, any strides, read then updated; or NULL (zeros,
 *                  nothing stored). Hugging Face's [B, C, W-1] cache is the view of shape
 *                  [B, W-1, C] with strides (C*(W-1), 1, W-1).
 *
 * Precision: computed in f32 (the products and sums in f32, SiLU's exponential in f32) and rounded
 * once to y's dtype: within one ulp of y's dtype plus 1e-6 * (|bias| + sum |weight * xx|) of the
 * float64 result. Hugging Face runs the convolution in the weight's dtype, so its bf16 output may
 * differ from lmk's by a few ulps. The state is a bit copy of the inputs.
 *
 * Errors (INVALID_ARGUMENT, in this order, each message naming the value and the rule): NULL
 * stream, x, weight, y or params; seq_len or channels 0; width outside 2..8; unknown activation;
 * x or y not a [T, C] operand; y's dtype not x's; dtype not f32/bf16/f16; weight not dense
 * f32/bf16/f16 of exactly C*W elements; bias not dense f32/bf16/f16 of exactly C; cu_seqlens not
 * dense i32/i64 of at least 2 entries; state_slots without conv_state, or not dense i32/i64 of
 * exactly n_seq entries; conv_state not a 3-D [n_slots, W-1, C] buffer of x's dtype with distinct
 * elements; a buffer on another device; overlaps (y against every operand but x, which it may equal
 * exactly; conv_state against every operand). DEVICE: launch failure (CUDA).
 * ---------------------------------------------------------------------------------------------- */

typedef enum lmk_activation { LMK_ACT_NONE = 0, LMK_ACT_SILU = 1 } lmk_activation;

typedef struct lmk_causal_conv1d_params {
    uint32_t seq_len, channels, width; /* T, C, W (2..8) */
    lmk_activation activation;
} lmk_causal_conv1d_params;

LMK_API lmk_status lmk_causal_conv1d(lmk_stream *s, const lmk_buffer *x, const lmk_buffer *weight,
                                     const lmk_buffer *bias, const lmk_buffer *cu_seqlens,
                                     const lmk_buffer *state_slots, lmk_buffer *conv_state, lmk_buffer *y,
                                     const lmk_causal_conv1d_params *p);

/* ------------------------------------------------------------------------------------------------
 * gated_delta_rule: gates, L2 norm, the delta-rule recurrence and the gated output norm in one op
 *
 * For each sequence, token t in order, value head h, with k head kh = h % Hk (TILED, the GGUF
 * order) or kh = h / (Hv / Hk) (BLOCK, Hugging Face's repeat_interleave), read as an index:
 *
 *     g    = -exp(A_log[h]) * softplus(a[t,h] + dt_bias[h])     softplus(x) = ln(1 + e^x)
 *     beta = sigmoid(b[t,h])             (A_log and dt_bias NULL: a holds g and b holds beta)
 *     qn   = q[t,kh] / sqrt(sum(q[t,kh]^2) + 1e-6) * scale      scale 0 means 1/sqrt(dk)
 *     kn   = k[t,kh] / sqrt(sum(k[t,kh]^2) + 1e-6)              (LMK_GDN_NO_L2NORM: q*scale, k)
 *     S    = exp(g) * S                                          S: the [dk, dv] state, f32
 *     u    = beta * (v[t,h] - S^T kn)
 *     S    = S + kn u^T
 *     o    = S^T qn                                              [dv]
 *     out[t,h] = o * rsqrt(mean(o^2) + eps) * (norm_w + weight_offset) * silu(z[t,h])   (z given)
 *     out[t,h] = o                                                                     (no z)
 *
 * S starts from the sequence's state row (zeros without one) and is stored back at the sequence's
 * end: f32, or for a bf16 pool widened at the start and rounded once at the end (never per token).
 *
 *     q, k         [T, Hk, dk]; v [T, Hv, dv]; f32 / bf16 / f16, one dtype with out; strided views
 *                  (slices of the convolution's output) allowed
 *     a, b         [T, Hv] f32 / bf16 / f16 (each its own), token stride free
 *     A_log, dt_bias  [Hv] dense f32 / bf16 / f16, both or neither
 *     state        [n_slots, Hv, dk, dv] f32 or bf16, any strides: FLA's and Hugging Face's layout
 *                  (dv fastest) is dense; FlashInfer's and ggml's (dk fastest) is the view with the
 *                  last two strides swapped. In place; NULL: zeros, nothing stored.
 *     z, norm_w    z [T, Hv, dv] (f32 / bf16 / f16, strided allowed) and norm_w [dv] dense f32 / bf16 /
 *                  f16, both or neither
 *     out          [T, Hv, dv] of q's dtype, strided allowed; must not alias any other operand
 *
 * Zero fields of lmk_gdn_params are the models' defaults except n_* and *_dim: head_map TILED,
 * scale 1/sqrt(dk), q and k L2-normalised; norm.eps must be > 0 when z is given (Qwen3.5: 1e-6).
 *
 * Precision: every step in f32 or better, nothing rounded between the gates, the recurrence and
 * the output norm (Hugging Face rounds beta and the normed output to the input dtype, so its bf16
 * results may differ from lmk's by a few ulps). Against the float64 evaluation of the formulas
 * above: f32 inputs and state, every output row and the final state within 1e-4 relative
 * (norm-wise) for sequences up to 65,536 tokens; bf16 / f16 inputs, rows within 4e-3 relative
 * norm-wise, the output's own rounding included. A row whose terms cancel (||o|| far below
 * || |S|^T |qn| ||) is held to that bound plus 2^-23 * || |S|^T |qn| || (f32 cannot do better; after
 * the gated norm, each element's part of it scaled as the norm scales the element), and
 * a 16-bit output to it plus its dtype's subnormal spacing. Both backends run the token-by-token
 * form above or the chunked (WY) form of the same function: the CPU chunks sequences of 16 tokens or
 * more (no workspace needed), falling back to token steps for a chunk whose gates or k norms are out
 * of the chunked form's stable range; the CUDA backend chunks on tensor cores where a workspace is
 * given and the call qualifies (below). With an f32 pool, a sequence processed in one call, split at
 * any token across calls (its state carried through the pool) or one token a call gives the same results within that
 * precision (a bf16 pool is rounded at the end of every call, so a sequence split into pieces has its
 * state rounded once a piece: one token a call rounds it every token, which costs accuracy). A pool of 0 rows (every sequence padding) is valid.
 *
 * Workspace (prompts on CUDA). io->workspace NULL: the token-by-token form (correct at any length,
 * slow for long prompts). Given: a dense LMK_U8 buffer on the stream's device of at least the bytes
 * lmk_gated_delta_rule_workspace answers, sharing no byte with any operand; its contents need no
 * initialisation and are unspecified after the call. The call allocates nothing, reads no device
 * data on the host and can be captured into a CUDA graph either way. The CUDA backend runs the
 * chunked form (chunks of 64 tokens aligned to each sequence's start) where the workspace is given
 * and large enough, q/k/v are bf16 or f16, q and k are L2-normalised, k_dim = v_dim = 64 or 128 and
 * seq_len >= 64 * n_seq; every other call runs the token-by-token form. The workspace holds
 * seq_len / 64 + n_seq chunks of 64 * ((2 * k_dim + 4 * v_dim + 140) * n_v_heads + 4 * k_dim *
 * n_k_heads) bytes, and a few KB more (Qwen3.5-27B: 3.3 MB a chunk, 52 KB a token).
 *
 * Errors (INVALID_ARGUMENT, in this order, each message naming the value and the rule): NULL stream,
 * io, params, q, k, v, a, b or out; seq_len, n_k_heads, n_v_heads, k_dim or v_dim 0; k_dim or v_dim
 * above 256; n_v_heads not a multiple of n_k_heads; unknown head_map; unknown flags; scale not
 * finite; A_log without dt_bias or the reverse; z without norm_w or the reverse; norm.eps not finite
 * and > 0, or weight_offset not finite, when z is given; an operand of the wrong shape (q, k, v, z,
 * out as above; a, b [T, Hv]; A_log, dt_bias [Hv]; norm_w [dv]); dtypes (q, k, v, out one of f32 /
 * bf16 / f16; the others as above; state f32 or bf16); cu_seqlens not dense i32/i64 of at least 2
 * entries; state_slots without state, or not dense i32/i64 of exactly n_seq entries; state not a
 * 4-D [n_slots, Hv, dk, dv] buffer with distinct elements; a buffer on another device; overlaps
 * (out and state against every other operand); workspace (when given) not a dense LMK_U8 buffer, on
 * another device, smaller than lmk_gated_delta_rule_workspace's bytes, or sharing a byte with any
 * operand. UNSUPPORTED (CUDA): k_dim above 128 with a v_dim
 * whose state does not fit the shared memory a block may use (256 x 256 needs 133 KB: H100, H200 and
 * A100 have it). DEVICE: launch failure (CUDA).
 * ---------------------------------------------------------------------------------------------- */

#define LMK_GDN_NO_L2NORM 1u /* flags: q and k are used as given (default: L2-normalised) */

typedef struct lmk_gdn_io {
    const lmk_buffer *q, *k;           /* [T, Hk, dk]; strided views (slices of the conv output) */
    const lmk_buffer *v;               /* [T, Hv, dv] */
    const lmk_buffer *a, *b;           /* [T, Hv]: in_proj_a / in_proj_b outputs (or g and beta, below) */
    const lmk_buffer *A_log, *dt_bias; /* [Hv], or both NULL: a holds g (log decay) and b holds beta */
    const lmk_buffer *cu_seqlens;      /* [n_seq + 1] i32/i64, or NULL: one sequence of T tokens */
    const lmk_buffer *state_slots;     /* [n_seq] i32/i64, or NULL: sequence s uses row s */
    lmk_buffer *state;                 /* [n_slots, Hv, dk, dv] f32/bf16, any strides, in place; or NULL */
    const lmk_buffer *z, *norm_w;      /* fused gated RMSNorm: z [T, Hv, dv] and norm_w [dv], or both NULL */
    lmk_buffer *out;                   /* [T, Hv, dv], q's dtype */
    lmk_buffer *workspace;             /* scratch of the chunked form (lmk_gated_delta_rule_workspace), or NULL */
} lmk_gdn_io;

typedef struct lmk_gdn_params {
    uint32_t seq_len, n_k_heads, n_v_heads, k_dim, v_dim;
    lmk_repeat_layout head_map; /* TILED 0: k head h % Hk (GGUF); BLOCK 1: h / (Hv/Hk) (Hugging Face) */
    float scale;                /* q scale; 0 = 1/sqrt(k_dim) */
    uint32_t flags;             /* LMK_GDN_NO_L2NORM */
    lmk_rms_norm_params norm;   /* the gated norm's eps (> 0) and weight_offset, used when z is given */
} lmk_gdn_params;

LMK_API lmk_status lmk_gated_delta_rule(lmk_stream *s, const lmk_gdn_io *io, const lmk_gdn_params *p);

/* The bytes of workspace lmk_gated_delta_rule would use for this call on this stream (*bytes), after
 * validating the call exactly as lmk_gated_delta_rule does (the same errors, in the same order; the
 * workspace field itself is ignored). 0 where the call never uses one: the CPU backend, and shapes
 * the chunked kernels do not take. The number depends only on seq_len, n_seq (cu_seqlens' element
 * count), the head counts and dims and the dtypes, and never decreases as seq_len or n_seq grow: one
 * workspace sized for the largest call of a layer serves every smaller one. */
LMK_API lmk_status lmk_gated_delta_rule_workspace(lmk_stream *s, const lmk_gdn_io *io, const lmk_gdn_params *p,
                                                  size_t *bytes);

#ifdef __cplusplus
}
#endif
#endif /* LMK_H */
