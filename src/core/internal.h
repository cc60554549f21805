/*
 * internal.h - what the pieces of lmk share behind the public header.
 *
 * The layering: src/ops/<op>/op.c validates a call once and turns handles into a plain argument
 * struct of raw pointers, sizes and element strides (declared in src/ops/<op>/<op>.h); a backend
 * receives only that struct, through the op's slot in its lmk_backend_ops table. The list of ops
 * (src/ops/ops.h) generates the slots, the backends' tables and the CUDA kernel preloads, so adding
 * an op adds one line there. The naive float64 references (src/ops/<op>/ref.c) take the same
 * structs over host memory, so tests and `lmk check` run the reference and any backend on exactly
 * the same arguments.
 */
#ifndef LMK_INTERNAL_H
#define LMK_INTERNAL_H

#include "lmk.h"
#include "ops/ops.h"

#include <stdarg.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define LMK_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define LMK_INTERNAL __attribute__((visibility("hidden")))
#else
#define LMK_PRINTF(a, b)
#define LMK_INTERNAL
#endif

/* ---- errors (src/core/status.c) ---- */

/* Formats the calling thread's message and returns `st`, so a failure path is one line:
 *     return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "<op>: <field> (%u) must be ...", value); */
lmk_status lmk_fail(lmk_status st, const char *fmt, ...) LMK_PRINTF(2, 3);

/* ---- host memory through the allocator hook (src/core/alloc.c) ---- */

void *lmk_host_alloc(size_t size, size_t alignment); /* NULL on failure, sets no message */
void *lmk_host_calloc(size_t size, size_t alignment);
void  lmk_host_free(void *p);

/* ---- element access and the precision contract (src/core/dtype.c) ---- */

/* Element i of an f32, bf16 or f16 array, widened exactly. */
double lmk_float_load(lmk_dtype t, const void *base, size_t i);
/* One unit in the last place of dtype t (f32, bf16, f16, f8e4m3) at magnitude |v|, subnormal
 * spacing included; the smallest spacing for 0 and non-finite v. */
double lmk_ulp(lmk_dtype t, double v);
/* The rope precision contract of lmk.h for an output whose float64 result is ref and whose
 * rotation is scaled by m (attn_factor, 1 without scaling): 1e-5 * max(1, m) absolute for f32 (for
 * |x| <= 2 and |angle| <= 2^20), one ulp plus 1e-6 absolute for bf16 and f16. */
double lmk_rope_tolerance(lmk_dtype t, double ref);

/* ---- backends ---- */

/* One op of one backend: arguments are validated, pointers are this device's memory. `args`
 * points at the op's own argument struct (lmk_<op>_args). */
typedef lmk_status (*lmk_op_fn)(lmk_stream *s, const void *args);

typedef struct lmk_backend_ops {
    /* devices this process can open (0 where there is no driver or GPU: not an error) */
    int (*device_count)(void);
    /* device */
    lmk_status (*device_open)(lmk_device *dev, int ordinal); /* fills dev->impl and dev->name */
    void (*device_close)(lmk_device *dev);
    /* dev->n_threads changed (lmk_device_set_threads): rewrites what shows it, such as the name;
     * NULL where nothing does */
    void (*device_threads_changed)(lmk_device *dev);
    /* this backend's run-time part of lmk_build_info ("simd=avx2") into buf of n bytes; NULL when
     * it has none (src/core/device.c) */
    void (*build_detail)(char *buf, size_t n);
    /* memory; alloc returns zero-filled memory */
    lmk_status (*mem_alloc)(lmk_device *dev, size_t n, void **out);
    void (*mem_free)(lmk_device *dev, void *p);
    lmk_status (*mem_write)(lmk_device *dev, void *dst, const void *src, size_t n);
    lmk_status (*mem_read)(lmk_device *dev, void *dst, const void *src, size_t n);
    /* streams: create fills s->impl */
    lmk_status (*stream_create)(lmk_stream *s);
    lmk_status (*stream_sync)(lmk_stream *s);
    void (*stream_destroy)(lmk_stream *s);
    /* ops, indexed by lmk_op_id; NULL where the backend lacks the op (the call then returns
     * LMK_ERR_UNSUPPORTED) */
    lmk_op_fn op[LMK_OP_COUNT];
} lmk_backend_ops;

/* The backends' tables, which only src/core/device.c reads: the rest of core reaches a backend
 * through a handle's dev->ops, never by name. */
extern const lmk_backend_ops lmk_cpu_backend;
#ifdef LMK_WITH_CUDA
extern const lmk_backend_ops lmk_cuda_backend;
#endif

/* Runs op `id` of the stream's backend on validated arguments (src/core/stream.c). `name` is the
 * public op name for the UNSUPPORTED message. */
lmk_status lmk_dispatch(lmk_stream *s, lmk_op_id id, const char *name, const void *args);

struct lmk_device {
    lmk_backend backend;
    const lmk_backend_ops *ops;
    int ordinal;
    int n_threads;        /* CPU: threads for streams created from now on; read and written with
                             relaxed __atomic builtins (lmk_device_set_threads may race a stream
                             creation) */
    char name[128];
    void *impl;           /* backend state */
};

struct lmk_buffer {
    lmk_device *dev;
    unsigned char *data;  /* first byte of this buffer (host or device address) */
    void *alloc;          /* what to hand back to mem_free, NULL when borrowed or a view */
    size_t byte_len;      /* dense: may exceed the shape's bytes (pooled); strided: the span */
    lmk_dtype dtype;
    int ndim;
    size_t shape[LMK_MAX_DIMS];
    size_t stride[LMK_MAX_DIMS]; /* in elements; row-major dense for alloc, wrap and view */
    size_t element_count;
    bool dense;           /* made by alloc, wrap or view: element i sits at data + i * size */
};

struct lmk_stream {
    lmk_device *dev;
    void *impl;
    bool borrowed;        /* CUDA: wraps a caller's cudaStream_t, never destroyed by lmk */
};

/* ---- small helpers for validation ---- */

/* *out = a * b; returns true when the product overflows size_t. */
static inline bool lmk_mul_overflows(size_t a, size_t b, size_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}

/* Whether byte ranges [a, a+an) and [b, b+bn) share a byte. Empty ranges overlap nothing. */
static inline bool lmk_ranges_overlap(const void *a, size_t an, const void *b, size_t bn)
{
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an && bn && x < y + bn && y < x + an;
}

/* ---- operands of ops (src/core/operand.c) ----
 *
 * An op operand of logical shape [n0, n1, n2] (tokens, heads, head elements) is either a dense
 * buffer of exactly n0*n1*n2 elements, whatever its declared shape, or a 3-D buffer of exactly
 * that shape whose last axis has stride 1 (lmk.h, "Operands"). Validation resolves it into an
 * lmk_tensor3; backends receive its pointer and element strides. */
typedef struct lmk_tensor3 {
    unsigned char *data;  /* element [0, 0, 0] */
    size_t n[3];          /* shape */
    size_t stride[3];     /* in elements; stride[2] == 1 */
    size_t es;            /* bytes per element */
} lmk_tensor3;

/* Resolves buffer b as the operand `name` of op `op` with shape [n0, n1, n2]. Fails with
 * INVALID_ARGUMENT naming the operand, its shape and strides. */
lmk_status lmk_operand3(const char *op, const char *name, const lmk_buffer *b, size_t n0, size_t n1, size_t n2,
                        lmk_tensor3 *out);
/* Writes the k sizes v as "a, b, c" into buf of n bytes (cut short when it does not fit): the
 * shapes and strides of operand messages. */
void lmk_format_dims(char *buf, size_t n, const size_t *v, int k);
/* A dense buffer's used elements as a [1, 1, element_count] tensor (positions, weights, ...). */
lmk_tensor3 lmk_operand_flat(const lmk_buffer *b);
/* Same address, shape and strides (strides of axes of length 1 ignored): an in-place pair. */
bool lmk_tensor3_same(const lmk_tensor3 *a, const lmk_tensor3 *b);
/* Whether two elements of t share a byte (stride 0 on a long axis, or a self-overlapping layout). */
bool lmk_tensor3_self_overlaps(const lmk_tensor3 *t);
/* Whether a and b may share a byte. Exact for the layouts engines use (token-major with one token
 * stride, each token's heads inside it: tensors side by side in one row, as q, k and v in a
 * packed QKV projection or q in a [q | gate] projection, or interleaved head by head, as
 * GPT-NeoX's [T, H, 3, D]), whatever the number of heads; for others it may answer true for
 * disjoint tensors (conservative), never false for overlapping ones. */
bool lmk_tensor3_overlap(const lmk_tensor3 *a, const lmk_tensor3 *b);
/* Checks the outputs of an op against every operand (lmk.h "Operands"): each output is distinct
 * in its own elements, and shares no byte with any other operand except that it may equal its own
 * input exactly (in place). own_input[i] is the index in `ops` of output i's input, or -1.
 * ops[0..n_ops) are all operands (outputs included, NULL data entries skipped); outputs are the
 * indices out_idx[0..n_out). Fails naming both operands. */
lmk_status lmk_check_overlaps(const char *op, const lmk_tensor3 *ops, const char *const *names, int n_ops,
                              const int *out_idx, const int *own_input, int n_out);

/* An operand of logical shape [n0, n1] (tokens, channels): a dense buffer of exactly n0*n1
 * elements, whatever its declared shape, or a 2-D buffer of exactly that shape whose last axis has
 * stride 1, with any token stride (lmk.h, "Gated DeltaNet"). Resolved as [n0, 1, n1]. */
lmk_status lmk_operand2(const char *op, const char *name, const lmk_buffer *b, size_t n0, size_t n1,
                        lmk_tensor3 *out);

/* A state pool: a buffer of exactly `ndim` axes whose shape is n[0..ndim) except the first axis
 * (the pool's rows, any count), with any strides whose elements are distinct (src/core/pool.c). */
#define LMK_POOL_MAX_DIMS 4
typedef struct lmk_pool {
    unsigned char *data;
    int ndim;
    size_t n[LMK_POOL_MAX_DIMS];      /* n[0]: rows of the pool */
    size_t stride[LMK_POOL_MAX_DIMS]; /* in elements */
    size_t es;
} lmk_pool;
/* Resolves b as the pool `name` of `ndim` axes with trailing shape n[1..ndim) (n[0] is read from
 * b). Fails with INVALID_ARGUMENT naming the operand, its shape and strides. */
lmk_status lmk_operand_pool(const char *op, const char *name, const lmk_buffer *b, int ndim, const size_t *n,
                            lmk_pool *out);
/* Whether the pool may share a byte with t (by extents: conservative). */
bool lmk_pool_overlaps(const lmk_pool *p, const lmk_tensor3 *t);

/* Thread count the CPU backend uses by default (LMK_NUM_THREADS, else online cores). */
int lmk_default_threads(void);

#ifdef __cplusplus
}
#endif
#endif /* LMK_INTERNAL_H */
