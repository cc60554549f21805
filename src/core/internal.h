/*
 * internal.h - what the pieces of lmk share behind the public header.
 *
 * The layering is: src/ops/<op>.c validates a call once and turns handles into a plain argument
 * struct of raw pointers and sizes (lmk_repeat_args, lmk_rope_args below); a backend (src/cpu,
 * src/cuda) receives only such structs through its lmk_backend_ops table. The naive float64
 * references (src/ops/<op>_ref.c) take the same structs over host memory, so tests and `lmk check`
 * can run the reference and any backend on exactly the same arguments.
 */
#ifndef LMK_INTERNAL_H
#define LMK_INTERNAL_H

#include "lmk.h"

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
 *     return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "repeat_tiled: h (%u) ...", h); */
lmk_status lmk_fail(lmk_status st, const char *fmt, ...) LMK_PRINTF(2, 3);

/* ---- host memory through the allocator hook (src/core/alloc.c) ---- */

void *lmk_host_alloc(size_t size, size_t alignment); /* NULL on failure, sets no message */
void *lmk_host_calloc(size_t size, size_t alignment);
void  lmk_host_free(void *p);

/* ---- op arguments: what validation hands to a backend ---- */

typedef struct lmk_repeat_args {
    const void *src;
    void *dst;
    size_t seq, hg, h, k;   /* element counts */
    size_t elem_size;       /* bytes per element, 1..8 */
} lmk_repeat_args;

/* One tensor that a rope launch rotates. in == out means in place. */
typedef struct lmk_rope_tensor {
    const void *in;
    void *out;
    uint32_t n_heads;
} lmk_rope_tensor;

typedef struct lmk_rope_args {
    lmk_dtype dtype;                /* LMK_F32, LMK_BF16 or LMK_F16 */
    uint32_t head_dim, rope_dim, seq_len;
    float freq_base;
    lmk_rope_mode mode;
    uint32_t sections[4];
    lmk_rope_pairing pairing;
    const int32_t *positions;       /* 4*seq_len, axis-major (u32 reinterpreted) */
    int n_tensors;                  /* 1 (lmk_rope_multi) or 2 (q and k of lmk_rope_multi_qk) */
    lmk_rope_tensor t[2];
} lmk_rope_args;

/* ---- element access and the precision contract (src/core/dtype.c) ---- */

/* Element i of an f32, bf16 or f16 array, widened exactly. */
double lmk_float_load(lmk_dtype t, const void *base, size_t i);
/* One unit in the last place of dtype t (f32, bf16, f16) at magnitude |v|, subnormal spacing
 * included; the smallest spacing for 0 and non-finite v. */
double lmk_ulp(lmk_dtype t, double v);
/* SPEC.md's rope precision contract for an output whose float64 result is ref: 1e-5 absolute for
 * f32 (for |x| <= 2 and |position| <= 2^20), one ulp plus 1e-6 absolute for bf16 and f16. */
double lmk_rope_tolerance(lmk_dtype t, double ref);

/* ---- naive float64 references over host memory: the executable spec (src/ops/<op>_ref.c) ---- */

void lmk_ref_repeat_tiled(const lmk_repeat_args *a);
void lmk_ref_rope_multi(const lmk_rope_args *a);
/* The exact float64 results of every element of each tensor (out64[i] holds tensor i's
 * seq_len*n_heads*head_dim values; copied elements are the widened inputs). Writes no output. */
void lmk_ref_rope_multi_f64(const lmk_rope_args *a, double *const out64[2]);

/* ---- backends ---- */

typedef struct lmk_backend_ops {
    const char *name;                                        /* "cpu", "cuda" */
    /* device */
    lmk_status (*device_open)(lmk_device *dev, int ordinal); /* fills dev->impl and dev->name */
    void (*device_close)(lmk_device *dev);
    /* memory; alloc returns zero-filled memory */
    lmk_status (*mem_alloc)(lmk_device *dev, size_t n, void **out);
    void (*mem_free)(lmk_device *dev, void *p);
    lmk_status (*mem_write)(lmk_device *dev, void *dst, const void *src, size_t n);
    lmk_status (*mem_read)(lmk_device *dev, void *dst, const void *src, size_t n);
    /* streams: create fills s->impl */
    lmk_status (*stream_create)(lmk_stream *s);
    lmk_status (*stream_sync)(lmk_stream *s);
    void (*stream_destroy)(lmk_stream *s);
    /* ops: arguments are validated; pointers are this device's memory */
    lmk_status (*repeat_tiled)(lmk_stream *s, const lmk_repeat_args *a);
    lmk_status (*rope_multi)(lmk_stream *s, const lmk_rope_args *a);
} lmk_backend_ops;

extern const lmk_backend_ops lmk_cpu_backend;
#ifdef LMK_WITH_CUDA
extern const lmk_backend_ops lmk_cuda_backend;
int lmk_cuda_device_count(void);
#endif

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
    size_t byte_len;
    lmk_dtype dtype;
    int ndim;
    size_t shape[LMK_MAX_DIMS];
    size_t element_count;
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

/* Thread count the CPU backend uses by default (LMK_NUM_THREADS, else online cores). */
int lmk_default_threads(void);

#ifdef __cplusplus
}
#endif
#endif /* LMK_INTERNAL_H */
