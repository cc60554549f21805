/*
 * testkit.h - the helpers that the tests, the `lmk` tool and the fuzzers share, and the ops' case
 * descriptors (src/ops/<op>/case.c), built together into the static library lmk_cases.
 *
 * One op, one place: each op describes its cases once, in src/ops/<op>/case.c, as a tst_op (its
 * real model shapes, how to lay out and fill its operands on a device, how to run it, how to
 * compare its outputs with the float64 reference, the bytes it must move, calls it must reject).
 * The registry tst_ops[] is generated from src/ops/ops.h's LMK_OPS list, and `lmk check`,
 * `lmk bench`, the contract tests (no allocation, allocation failure, threads, stress, CUDA graphs)
 * and the fuzz driver loop over it, so a new op needs no change to any of them.
 *
 * This header uses only the public API (lmk.h): the tool includes it and nothing internal. The
 * reference-side helpers that take the library's internal argument structs are in testkit_ref.h.
 *
 * Nothing here uses the test harness: every function reports through its return value (and
 * lmk_status with lmk_last_error(), or a message buffer), so worker threads may call anything.
 *
 * The layers, each calling only those before it, so that no two files of the kit need each other:
 * fail.c and rng.c; mem.c (a case's device memory); cmp.c (comparisons, reading views of mem.c);
 * inst.c (the life of a case) and shapes.c (model shapes, names); the ops' descriptors
 * (src/ops/<op>/case.c); registry.c (tst_ops[], the one file that refers to the descriptors).
 */
#ifndef LMK_TESTKIT_H
#define LMK_TESTKIT_H

#include "lmk.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define TST_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TST_PRINTF(a, b)
#endif

/* ------------------------------------------------------------------------------------------------
 * Failures (testkit/fail.c)
 * ---------------------------------------------------------------------------------------------- */

/* Records a failure of the kit or the tools, read back with lmk_last_error() like the library's
 * own, and returns st. */
lmk_status tst_fail(lmk_status st, const char *fmt, ...) TST_PRINTF(2, 3);

/* ------------------------------------------------------------------------------------------------
 * Random numbers and tensor values (testkit/rng.c)
 * ---------------------------------------------------------------------------------------------- */

typedef struct tst_rng {
    uint64_t s[4]; /* xoshiro256** state */
} tst_rng;

tst_rng  tst_rng_make(uint64_t seed);
uint64_t tst_rng_u64(tst_rng *r);
uint32_t tst_rng_u32(tst_rng *r);
uint32_t tst_rng_below(tst_rng *r, uint32_t n);             /* uniform in [0, n), n > 0 */
double   tst_rng_uniform(tst_rng *r, double lo, double hi); /* uniform in [lo, hi) */
/* A seed derived from `seed` and two indices (splitmix64 of the mix): every case of a run gets its
 * own data, and the run's seed reproduces any of them. */
uint64_t tst_seed_mix(uint64_t seed, uint64_t a, uint64_t b);

/* n elements of dtype (f32, bf16 or f16) uniform in [lo, hi), stored in dtype at dst. */
void tst_fill_float(tst_rng *r, lmk_dtype dtype, void *dst, size_t n, double lo, double hi);
/* n elements of dtype: floats uniform in [-2, 2) (the domain of the rope precision contract),
 * rounded to the dtype and never exactly zero (zeros would hide an element never written); every
 * other dtype random bits. */
void tst_fill_random(tst_rng *r, lmk_dtype dtype, void *dst, size_t n);
/* n random bytes. */
void tst_fill_bytes(tst_rng *r, void *dst, size_t n);
/* Element i of a f32/bf16/f16 array, widened exactly to double. */
double tst_load(lmk_dtype dtype, const void *base, size_t i);
/* Stores v (rounded through f32, then to dtype with the library's conversion) as element i. */
void tst_store(lmk_dtype dtype, void *base, size_t i, double v);
/* Seconds on a monotonic clock, from an arbitrary start. */
double tst_now(void);

/* ------------------------------------------------------------------------------------------------
 * Comparisons (testkit/cmp.c)
 * ---------------------------------------------------------------------------------------------- */

/* Offset of the first differing byte, or -1 when the n bytes are equal. */
long long tst_bits_diff(const void *a, const void *b, size_t n);

/* One ulp of x in dtype (f32, bf16 or f16), subnormal spacing included; written independently of
 * the library's lmk_ulp, which test_runtime compares with it. */
double tst_ulp(lmk_dtype dtype, double x);

typedef struct tst_cmp {
    size_t n_checked, n_bad;
    size_t first_bad;           /* element index of the first failure */
    double got, want, tol;      /* at the first failure */
    double max_err;             /* over all elements checked */
} tst_cmp;

/* Element i of got (dtype) against want[i] for i in [0, n) where mask is NULL or mask[i % mask_n]
 * is set: f32 within f32_tol absolute; bf16/f16 within one ulp of want plus 1e-6. A NaN want needs
 * a NaN got. Accumulates into *res (zero it first). */
void tst_cmp_f64(lmk_dtype dtype, const void *got, const double *want, size_t n, const bool *mask,
                 size_t mask_n, double f32_tol, tst_cmp *res);

/* ------------------------------------------------------------------------------------------------
 * Poison and guards (testkit/mem.c)
 *
 * Outputs are poisoned before a run (TST_POISON, a NaN in every float type) so an element never
 * written fails its comparison; every region of device memory a case uses has TST_GUARD bytes on
 * both sides of its tensors, and after a run every byte that is not an output element must hold
 * what it held before (ggml's test-backend-ops does the same with guard tensors).
 * ---------------------------------------------------------------------------------------------- */

/* Guard bytes around the tensors of a region; a multiple of 256, so tensors start where allocators
 * put them (cudaMalloc and PyTorch's allocator align to 256 bytes or more) and a timed case's rows
 * sit on cache lines as a real model's do: with 64, every 512-byte Qwen3.5 row straddles one more
 * 128-byte line than it needs, and the bench times the extra line rather than the kernel
 * (docs/decisions.md, "Bench and test kit"). Misaligned operands are cases of their own. */
#define TST_GUARD 256
#define TST_POISON 0xFFu        /* poison byte: NaN in f32, bf16 and f16; never a random input */

/* Fills n bytes with `byte`. */
void tst_poison(void *p, size_t n, unsigned byte);
/* Offset of the first byte in [from, to) that is not `byte`, or -1. */
long long tst_find_not(const void *p, size_t from, size_t to, unsigned byte);
/* Number of elements of size es among n whose every byte is `byte` (elements never written). */
size_t tst_count_unwritten(const void *p, size_t n, size_t es, unsigned byte);

/* ------------------------------------------------------------------------------------------------
 * Device memory of one case (testkit/mem.c)
 *
 * A case's operands are views into a few regions, each one u8 allocation on the device with a host
 * copy of what it holds before a run (inputs, poisoned outputs, the bytes between strided
 * tensors). A view is an op operand of logical shape [n0, n1, n2]: dense (lmk_buffer_view), or
 * strided (lmk_buffer_view_strided) such as q inside a [q | gate] projection or q and k inside a
 * packed QKV projection. After a run, tst_mem_untouched checks every byte that is not an output
 * element: guards, the gaps of strided layouts, inputs.
 * ---------------------------------------------------------------------------------------------- */

#define TST_MAX_REGIONS 16
#define TST_MAX_VIEWS 16

/* How regions are allocated: lmk_buffer_alloc by default; test_cuda_graph wraps caller memory. */
typedef struct tst_alloc_hook {
    lmk_status (*alloc)(lmk_device *dev, size_t len, lmk_buffer **out, void **own, void *user);
    void (*free)(void *own, void *user);
    void *user;
} tst_alloc_hook;

typedef struct tst_region {
    lmk_buffer *buf;            /* u8, len bytes */
    size_t len;
    unsigned char *host;        /* the bytes it holds before a run; NULL: every byte is TST_POISON */
    void *own;                  /* what the alloc hook made, else NULL */
} tst_region;

#define TST_VIEW_MAX_DIMS 4

typedef struct tst_view {
    lmk_buffer *buf;
    int region;
    size_t off;                 /* byte offset of element [0, 0, 0] in the region */
    lmk_dtype dtype;
    int nd;                     /* 3 (tst_mem_view), or what tst_mem_view_nd was given */
    size_t n[TST_VIEW_MAX_DIMS], stride[TST_VIEW_MAX_DIMS]; /* shape and element strides (tst_mem_view:
                                   stride[2] == 1) */
    bool output;                /* the op writes its elements */
} tst_view;

typedef struct tst_mem {
    lmk_device *dev;
    const tst_alloc_hook *hook; /* NULL: lmk_buffer_alloc */
    tst_region r[TST_MAX_REGIONS];
    int n_r;
    tst_view v[TST_MAX_VIEWS];
    int n_v;
} tst_mem;

/* A region of len bytes (poisoned); host_copy false: no host copy (an output-only region too large
 * to mirror). *idx is its index. */
lmk_status tst_mem_region(tst_mem *m, size_t len, bool host_copy, int *idx);
/* A [n0, n1, n2] view of dtype at byte `off` of region `region` with element strides `stride`
 * (NULL: dense). `output`: the op writes it. */
lmk_status tst_mem_view(tst_mem *m, int region, size_t off, lmk_dtype dtype, const size_t n[3],
                        const size_t *stride, bool output, lmk_buffer **out);
/* A view of nd (1..TST_VIEW_MAX_DIMS) axes with any element strides (their elements distinct), such
 * as a state pool in another engine's layout: lmk_buffer_view_strided of exactly that shape. */
lmk_status tst_mem_view_nd(tst_mem *m, int region, size_t off, lmk_dtype dtype, int nd, const size_t *n,
                           const size_t *stride, bool output, lmk_buffer **out);
/* Bytes from element 0 to the end of the furthest element of an nd-axis view (0 when empty). */
size_t tst_span_nd(int nd, const size_t *n, const size_t *stride, size_t es);
/* Calls fn(ctx, element offset, run length) for every run of consecutive elements of view v:
 * rows of its last axis when that has stride 1, single elements otherwise. */
void tst_view_runs(const tst_view *v, void (*fn)(void *ctx, size_t elem, size_t len), void *ctx);
/* Bytes from element [0,0,0] to the end of the last element of a [n0, n1, n2] view. */
size_t tst_span(const size_t n[3], const size_t *stride, size_t es);
/* The view record of a handle made by tst_mem_view, or NULL. */
const tst_view *tst_mem_find(const tst_mem *m, const lmk_buffer *view);
/* The host copy of view's element [0,0,0]; NULL without a host copy. */
void *tst_mem_host(const tst_mem *m, const lmk_buffer *view);
/* Writes every region's host copy (or poison) to the device. */
lmk_status tst_mem_upload(tst_mem *m);
/* Reads n bytes at `off` of region `region`. */
lmk_status tst_mem_read(const tst_mem *m, int region, size_t off, void *dst, size_t n);
/* The whole of region `region` read into a fresh host array (free with free()); NULL on failure
 * (lmk_last_error() says why). */
void *tst_mem_download(const tst_mem *m, int region);
/* Whether every byte that is not an output element still holds its host copy (or poison). On a
 * difference, or when reading fails, writes what happened to msg and returns false. */
bool tst_mem_untouched(const tst_mem *m, char *msg, size_t msg_len);
/* Frees the views and the regions. */
void tst_mem_free(tst_mem *m);

/* ------------------------------------------------------------------------------------------------
 * Case descriptors (testkit/registry.c, testkit/inst.c, src/ops/<op>/case.c)
 * ---------------------------------------------------------------------------------------------- */

enum {
    TST_CASE_FULL = 1u,     /* large: run by a full `lmk check`, left out by --quick and the tests */
    TST_CASE_CONTRACT = 2u, /* small and representative: the contract tests run every op on these */
};

#define TST_CASE_NAME 224
#define TST_CASE_PARAMS 224

struct tst_op;

/* One case of an op: a name printed the way ggml's test-backend-ops prints cases, parameters first
 * and the model after "//", e.g. "rope neox hd=128 rd=128 nh=32/8 T=4106 bf16 llama3-ff //
 * Llama-3.1-8B", and the op's own parameters (a struct of its case.c) in p. A plain value. */
typedef struct tst_case {
    const struct tst_op *op;
    char name[TST_CASE_NAME];
    unsigned flags;             /* TST_CASE_* */
    uint32_t T;                 /* tokens, and the element type of its tensors: for tables and filters */
    lmk_dtype dtype;
    union {
        max_align_t align;
        unsigned char bytes[TST_CASE_PARAMS];
    } p;
} tst_case;

/* A case made on a device: its memory and operands, ready to run. */
typedef struct tst_inst {
    tst_case c;
    tst_mem mem;
    lmk_buffer *arg[TST_MAX_VIEWS]; /* the op's operands in its own order, NULL where absent */
    unsigned flags;                 /* TST_INST_* */
    void *pool[LMK_DTYPE_COUNT];    /* TST_INST_FAST: random elements per dtype, tiled over inputs */
} tst_inst;

enum {
    /* Inputs tiled from a small random pool and host copies dropped after the upload: fast to make,
     * for timing only (no verify, no reset). */
    TST_INST_FAST = 1u,
};

/* What a verification found. */
typedef struct tst_result {
    bool ok;
    bool exact;                 /* the outputs were compared bit for bit */
    double max_err;             /* the largest error of a rounded element */
    double max_ratio;           /* and the largest fraction of its tolerance */
    char msg[512];              /* what failed, or e.g. "max err 3.1e-07 (0.21 of tol)" */
} tst_result;

/* An op's descriptor: everything the drivers need, no driver needs anything else. */
typedef struct tst_op {
    const char *name;           /* its name in src/ops/ops.h */
    int (*n_cases)(void);       /* its table of cases: real model shapes, edge shapes */
    void (*get_case)(int i, tst_case *c);
    /* A random valid case, small (every operand at most ~32 K elements), drawing every mode,
     * layout and dtype the op has: threads, stress and the fuzz driver run these. */
    void (*random_case)(tst_rng *r, tst_case *c);
    /* The benchmark's cases at T tokens in dtype (f32 or bf16); `longest`: T is the longest of the
     * run. Returns how many it wrote (at most max). */
    int (*bench_cases)(uint32_t T, lmk_dtype dtype, bool longest, tst_case *out, int max);
    /* The bytes the op must move: the least any implementation reads and writes. */
    double (*bytes)(const tst_case *c);
    /* Regions and views of the case in in->mem (in->arg[]), nothing filled yet. */
    lmk_status (*setup)(tst_inst *in);
    /* Inputs into the host copies (tst_inst_fill for tensors); outputs stay poisoned. */
    void (*fill)(tst_inst *in, tst_rng *r);
    /* Enqueues the op: no allocation, no sync. */
    lmk_status (*run)(const tst_inst *in, lmk_stream *s);
    /* After a run and a sync: the outputs against the float64 reference, from the host copies. */
    bool (*verify)(const tst_inst *in, tst_result *res);
    /* Calls the op must reject, made from the instance's own buffers (no allocation): call k in
     * [0, n_invalid) returns the op's status, *want a fragment its message must hold. */
    int n_invalid;
    lmk_status (*invalid)(const tst_inst *in, lmk_stream *s, int k, const char **want);
    int launches;               /* kernels one run enqueues on CUDA */
} tst_op;

/* The registry: every op of src/ops/ops.h, in its order. */
extern const tst_op *const tst_ops[];
extern const int tst_op_count;
/* The op named `name`, or NULL. */
const tst_op *tst_op_find(const char *name);
/* Case i of op's table; a random case; the benchmark's cases (each with op set). */
tst_case tst_op_case(const tst_op *op, int i);
tst_case tst_op_random_case(const tst_op *op, tst_rng *r);
int tst_op_bench_cases(const tst_op *op, uint32_t T, lmk_dtype dtype, bool longest, tst_case *out, int max);

/* Makes case c on dev: setup, fill from `seed`, upload. flags: TST_INST_*. hook may be NULL. On
 * failure everything made is freed and the status (with lmk_last_error()) returned. */
lmk_status tst_inst_make(const tst_case *c, lmk_device *dev, uint64_t seed, unsigned flags,
                         const tst_alloc_hook *hook, tst_inst **out);
/* Fresh inputs from `seed`, outputs poisoned again, uploaded (not for TST_INST_FAST). */
lmk_status tst_inst_reset(tst_inst *in, uint64_t seed);
/* The same in the host copies only: the caller uploads them (test_cuda_graph does it with
 * cudaMemcpyAsync, in its stream's order). */
void tst_inst_refill(tst_inst *in, uint64_t seed);
lmk_status tst_inst_run(const tst_inst *in, lmk_stream *s);
/* After a run and a sync: outputs against the reference, then every other byte untouched. */
bool tst_inst_verify(const tst_inst *in, tst_result *res);
/* Invalid call k: must return LMK_ERR_INVALID_ARGUMENT with a message that names the op and holds
 * the op's fragment, and change no byte of any region. */
bool tst_inst_reject(const tst_inst *in, lmk_stream *s, int k, tst_result *res);
void tst_inst_free(tst_inst *in);
/* The whole life of a case on one stream: make from seed, run, sync, verify, free. A failure to
 * make or run is a failed result whose message holds the status and lmk_last_error(); *status
 * (may be NULL) gets the first status that was not LMK_OK. */
bool tst_case_check(const tst_case *c, lmk_stream *s, uint64_t seed, tst_result *res, lmk_status *status);

/* For case.c files: fill the elements of operand `view` (a tst_mem_view of the instance) with
 * tst_fill_random values through its strides (TST_INST_FAST: tiled from the pool). */
void tst_inst_fill(tst_inst *in, const lmk_buffer *view, tst_rng *r);
/* Formats into c->name. */
void tst_case_name(tst_case *c, const char *fmt, ...) TST_PRINTF(2, 3);

/* ------------------------------------------------------------------------------------------------
 * Real model shapes and positions (testkit/shapes.c)
 * ---------------------------------------------------------------------------------------------- */

typedef struct tst_attn_shape {
    const char *model;          /* "qwen3.5-27B" */
    uint32_t n_q_heads, n_k_heads;
    uint32_t head_dim, rope_dim;
    float freq_base;
    lmk_rope_mode mode;
    uint32_t sections[4];
} tst_attn_shape;
extern const tst_attn_shape tst_attn_shapes[];
extern const int tst_attn_shape_count;

/* "rope_multi imrope hd=256 rd=64 nh=24 T=4106 f32 half_rope" plus " // comment" when comment is
 * not NULL or empty. Returns buf. */
char *tst_rope_name(char *buf, size_t n, const char *op, const lmk_rope_multi_params *p, lmk_dtype dtype,
                    const char *comment);
/* "1e7" rather than "1e+07": names read like the model configs. Returns buf. */
char *tst_format_base(char *buf, size_t n, double v);

/* Positions for seq_len tokens: text (all four axes = start + i) or distinct t/h/w/e axes drawn
 * from the rng in [lo, hi]. */
void tst_positions_text(int32_t *pos, uint32_t seq_len, int32_t start);
void tst_positions_random(tst_rng *r, int32_t *pos, uint32_t seq_len, int32_t lo, int32_t hi);

#endif /* LMK_TESTKIT_H */
