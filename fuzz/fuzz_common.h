/*
 * fuzz_common.h - what the lmk fuzzers share.
 *
 * Each fuzzer turns the fuzzer's bytes into one or a few library calls and checks the library's
 * contract on them (lmk.h): no crash; an invalid call returns LMK_ERR_INVALID_ARGUMENT
 * with a message naming the op and changes no byte of any buffer; a valid call matches the
 * float64 reference. To check "no byte changed" and "nothing written outside the output", every
 * buffer a fuzzer makes lives in a few root memory regions (a host arena, or one lmk allocation)
 * that are snapshotted whole before the call and compared whole after it.
 *
 * A violated check aborts through __builtin_trap(), which libFuzzer reports as a crash with the
 * input that caused it. Header-only (static functions), so each fuzzer is a single C file. Random
 * numbers (but fz_rand's splitmix64 stream for bulk values), the rope comparison and the ops' case
 * descriptors come from the test kit (testkit/testkit.h), which the tests and the `lmk` tool use
 * too.
 */
#ifndef LMK_FUZZ_COMMON_H
#define LMK_FUZZ_COMMON_H

#include "lmk.h"
#include "testkit_ref.h"

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A broken contract: print what and where, then abort so the fuzzer keeps the input. */
#define FZ_CHECK(cond, ...)                                                                                  \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "\nFUZZ CHECK FAILED %s:%d: %s\n  ", __FILE__, __LINE__, #cond);                 \
            fprintf(stderr, __VA_ARGS__);                                                                    \
            fprintf(stderr, "\n  lmk_last_error: \"%s\"\n", lmk_last_error());                              \
            fflush(stderr);                                                                                  \
            __builtin_trap();                                                                                \
        }                                                                                                    \
    } while (0)

#define FZ_UNUSED(x) (void)(x)

/* ------------------------------------------------------------------------------------------------
 * Reading parameters from the fuzzer's bytes. Past the end every read returns 0, so every input is
 * a complete, deterministic call. Bulk data (tensor values) comes from the test kit's generator
 * (tst_rng) seeded from the input instead, so inputs stay short and mutations stay meaningful.
 * ---------------------------------------------------------------------------------------------- */

typedef struct fz_in {
    const uint8_t *p;
    size_t n;
} fz_in;

static inline uint8_t fz_u8(fz_in *in)
{
    if (in->n == 0)
        return 0;
    in->n--;
    return *in->p++;
}

static inline uint16_t fz_u16(fz_in *in)
{
    const uint16_t lo = fz_u8(in);
    return (uint16_t)(lo | (uint16_t)fz_u8(in) << 8);
}

static inline uint32_t fz_u32(fz_in *in)
{
    const uint32_t lo = fz_u16(in);
    return lo | (uint32_t)fz_u16(in) << 16;
}

static inline uint64_t fz_u64(fz_in *in)
{
    const uint64_t lo = fz_u32(in);
    return lo | (uint64_t)fz_u32(in) << 32;
}

static inline bool fz_bool(fz_in *in) { return fz_u8(in) & 1; }

/* A value in [0, n) from one byte (n <= 256). */
static inline unsigned fz_pick(fz_in *in, unsigned n) { return n ? fz_u8(in) % n : 0; }

static inline float fz_f32_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t fz_bits_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Uniform in [-r, r). */
static inline float fz_rand_sym(tst_rng *s, float r)
{
    return (float)tst_rng_uniform(s, -(double)r, (double)r);
}

/* A "dimension" as a fuzzer wants it: 0, small, odd, a power of two, huge, or any u32. */
static inline uint32_t fz_dim(fz_in *in)
{
    static const uint32_t huge[] = {UINT32_MAX, UINT32_MAX - 1, 0x80000000u, 0x7fffffffu, 0x10001u,
                                    65536u,     1u << 20,       1u << 24,    3u << 30,    0x55555556u};
    switch (fz_pick(in, 10)) {
    case 0:
    case 1:
    case 2:
    case 3:
        return 1 + fz_pick(in, 8);
    case 4:
        return 0;
    case 5:
        return 1 + fz_pick(in, 64);
    case 6:
        return 1u << fz_pick(in, 9);
    case 7:
        return huge[fz_pick(in, sizeof huge / sizeof huge[0])];
    case 8:
        return 2 * (1 + fz_pick(in, 128));
    default:
        return fz_u32(in);
    }
}

/* ------------------------------------------------------------------------------------------------
 * Tallies: what the inputs exercised (valid calls, invalid ones, precision-checked ones, ...),
 * printed to stderr when the fuzzer exits, so a run says how much of each it did.
 * ---------------------------------------------------------------------------------------------- */

#define FZ_MAX_STATS 12

static const char *fz_stat_names[FZ_MAX_STATS];
static long fz_stat_counts[FZ_MAX_STATS];

/* Counts one `name` (a string literal). */
static inline void fz_stat(const char *name)
{
    for (int i = 0; i < FZ_MAX_STATS; i++) {
        if (!fz_stat_names[i])
            fz_stat_names[i] = name;
        if (fz_stat_names[i] == name || strcmp(fz_stat_names[i], name) == 0) {
            fz_stat_counts[i]++;
            return;
        }
    }
}

static void fz_stats_print(void)
{
    fprintf(stderr, "lmk fuzz tally:");
    for (int i = 0; i < FZ_MAX_STATS && fz_stat_names[i]; i++)
        fprintf(stderr, "%s %ld %s", i ? "," : "", fz_stat_counts[i], fz_stat_names[i]);
    fprintf(stderr, "\n");
}

static inline void fz_stats_at_exit(void)
{
    static int registered;
    if (!registered++)
        atexit(fz_stats_print);
}

/* ------------------------------------------------------------------------------------------------
 * The allocator hook: counts every host allocation of the library, refuses absurd sizes (so a
 * fuzzed byte_len of 2^60 exercises OUT_OF_MEMORY instead of the fuzzer's own malloc limit), and
 * lets a harness assert that an op call allocates nothing (lmk.h: "performs no heap allocation").
 * ---------------------------------------------------------------------------------------------- */

#define FZ_ALLOC_CAP ((size_t)256 << 20) /* above a 1024-thread CPU stream's scratch (lmk.h "Streams") */

static atomic_long fz_n_allocs, fz_n_live;

static void *fz_alloc(size_t size, size_t alignment, void *user)
{
    FZ_UNUSED(user);
    FZ_CHECK(alignment && (alignment & (alignment - 1)) == 0, "allocator hook: alignment %zu is not a power of two",
             alignment);
    if (size > FZ_ALLOC_CAP)
        return NULL;
    if (alignment < sizeof(void *))
        alignment = sizeof(void *);
    void *p = NULL;
    if (posix_memalign(&p, alignment, size ? size : 1) != 0)
        return NULL;
    atomic_fetch_add(&fz_n_allocs, 1);
    atomic_fetch_add(&fz_n_live, 1);
    return p;
}

static void fz_free(void *p, void *user)
{
    FZ_UNUSED(user);
    FZ_CHECK(p != NULL, "allocator hook: free(NULL) reached the hook");
    atomic_fetch_sub(&fz_n_live, 1);
    free(p);
}

static inline void fz_install_allocator(void)
{
    fz_stats_at_exit();
    static const lmk_allocator a = {fz_alloc, fz_free, NULL};
    lmk_set_allocator(&a);
}

/* Opens three CPU devices capped at the scalar and AVX2 levels and at the best level (LMK_CPU_ISA,
 * restored afterwards), each with streams of 1, 2 and 3 threads, so one fuzzer input reaches every
 * CPU path and uneven work splits. */
static inline void fz_open_cpu_levels(lmk_device *devs[3], lmk_stream *streams[3][3])
{
    static const char *const isa[3] = {"scalar", "avx2", NULL};
    const char *saved = getenv("LMK_CPU_ISA");
    for (int d = 0; d < 3; d++) {
        if (isa[d])
            setenv("LMK_CPU_ISA", isa[d], 1);
        else if (saved)
            setenv("LMK_CPU_ISA", saved, 1);
        else
            unsetenv("LMK_CPU_ISA");
        FZ_CHECK(lmk_device_open(LMK_BACKEND_CPU, 0, &devs[d]) == LMK_OK, "cannot open the CPU device");
        for (int i = 0; i < 3; i++) {
            FZ_CHECK(lmk_device_set_threads(devs[d], i + 1) == LMK_OK, "lmk_device_set_threads");
            FZ_CHECK(lmk_stream_create(devs[d], &streams[d][i]) == LMK_OK, "lmk_stream_create");
        }
    }
}

/* ------------------------------------------------------------------------------------------------
 * Root memory regions and their snapshots.
 * ---------------------------------------------------------------------------------------------- */

#define FZ_MAX_REGIONS 16

typedef struct fz_region {
    unsigned char *base;
    size_t len;
    unsigned char *snap; /* the bytes before the call */
} fz_region;

typedef struct fz_world {
    fz_region r[FZ_MAX_REGIONS];
    int n;
} fz_world;

static inline void fz_world_add(fz_world *w, void *base, size_t len)
{
    if (!base || w->n == FZ_MAX_REGIONS)
        return;
    for (int i = 0; i < w->n; i++)
        if (w->r[i].base == base)
            return;
    w->r[w->n++] = (fz_region){.base = base, .len = len, .snap = NULL};
}

static inline void fz_world_snapshot(fz_world *w)
{
    for (int i = 0; i < w->n; i++) {
        free(w->r[i].snap);
        w->r[i].snap = malloc(w->r[i].len ? w->r[i].len : 1);
        FZ_CHECK(w->r[i].snap != NULL, "harness: out of memory");
        memcpy(w->r[i].snap, w->r[i].base, w->r[i].len);
    }
}

static inline void fz_world_restore(fz_world *w)
{
    for (int i = 0; i < w->n; i++)
        memcpy(w->r[i].base, w->r[i].snap, w->r[i].len);
}

static inline void fz_world_release(fz_world *w)
{
    for (int i = 0; i < w->n; i++)
        free(w->r[i].snap);
    w->n = 0;
}

/* The region holding byte p, or NULL. */
static inline fz_region *fz_world_find(fz_world *w, const void *p)
{
    const uintptr_t x = (uintptr_t)p;
    for (int i = 0; i < w->n; i++)
        if (x >= (uintptr_t)w->r[i].base && x < (uintptr_t)w->r[i].base + w->r[i].len)
            return &w->r[i];
    return NULL;
}

/* The snapshot's copy of address p (p must lie in a region; NULL otherwise). */
static inline const void *fz_world_before(fz_world *w, const void *p)
{
    const fz_region *r = fz_world_find(w, p);
    return r ? r->snap + ((const unsigned char *)p - r->base) : NULL;
}

/* Whether byte address p lies in [lo, lo + n). */
static inline bool fz_in_range(const void *p, const void *lo, size_t n)
{
    return (uintptr_t)p >= (uintptr_t)lo && (uintptr_t)p < (uintptr_t)lo + n;
}

/* Checks every byte of every region equals its snapshot, except bytes inside the `n_skip`
 * ranges [skip[i], skip[i] + skip_len[i]). Returns the first differing address, or NULL. */
static inline const void *fz_world_changed(const fz_world *w, const void *const *skip, const size_t *skip_len,
                                           int n_skip)
{
    for (int i = 0; i < w->n; i++) {
        const fz_region *r = &w->r[i];
        if (n_skip == 0) {
            if (memcmp(r->base, r->snap, r->len) == 0)
                continue;
        }
        for (size_t j = 0; j < r->len; j++) {
            if (r->base[j] == r->snap[j])
                continue;
            bool skipped = false;
            for (int k = 0; k < n_skip && !skipped; k++)
                skipped = fz_in_range(r->base + j, skip[k], skip_len[k]);
            if (!skipped)
                return r->base + j;
        }
    }
    return NULL;
}

/* Whether the message of the last failure names `op` (and is not empty). */
static inline bool fz_message_names(const char *op)
{
    const char *m = lmk_last_error();
    return m && m[0] && strstr(m, op) != NULL;
}


/* ------------------------------------------------------------------------------------------------
 * The buffers of one op call. Every fuzzer input opens nothing: two CPU devices (the second one is
 * "another device", whose buffers an op must refuse), a stream and a host arena live for the whole
 * run. Buffers of a call are made in the ways a caller can make them (alloc, wrap, view of a shared
 * parent so that two operands can overlap, view of an allocation, NULL) and freed after it.
 * ---------------------------------------------------------------------------------------------- */

#define FZ_ARENA_BYTES ((size_t)64 << 10)
#define FZ_BUF_CAP ((size_t)16 << 10) /* largest buffer a call makes, in bytes */
#define FZ_MAX_BUFS 24

typedef struct fz_env {
    lmk_device *dev, *other;  /* two CPU devices */
    lmk_stream *stream;       /* on dev */
    unsigned char *arena;     /* FZ_ARENA_BYTES of host memory, 64-byte aligned */
    lmk_buffer *parent;       /* u8 wrap of the whole arena */
} fz_env;

typedef struct fz_call {
    fz_world world;
    lmk_buffer *bufs[FZ_MAX_BUFS]; /* made by this call, freed in reverse order */
    int n_bufs;
    tst_rng rng;
    bool sane; /* this input means a valid call: make no operand wrong on purpose */
} fz_call;

static inline fz_env *fz_env_get(void)
{
    static fz_env e;
    if (e.dev)
        return &e;
    fz_install_allocator();
    FZ_CHECK(lmk_device_open(LMK_BACKEND_CPU, 0, &e.dev) == LMK_OK, "cannot open the CPU device");
    FZ_CHECK(lmk_device_open(LMK_BACKEND_CPU, 0, &e.other) == LMK_OK, "cannot open a second CPU device");
    /* Two workers: the fuzzer must reach the threaded split of the CPU path, even on one core. */
    FZ_CHECK(lmk_device_set_threads(e.dev, 2) == LMK_OK, "lmk_device_set_threads");
    FZ_CHECK(lmk_stream_create(e.dev, &e.stream) == LMK_OK, "cannot create a stream");
    FZ_CHECK(posix_memalign((void **)&e.arena, 64, FZ_ARENA_BYTES) == 0, "harness: no arena");
    memset(e.arena, 0xa5, FZ_ARENA_BYTES);
    FZ_CHECK(lmk_buffer_wrap(e.dev, e.arena, FZ_ARENA_BYTES, LMK_U8, NULL, 0, &e.parent) == LMK_OK,
             "cannot wrap the arena");
    return &e;
}

static inline void fz_call_keep(fz_call *c, lmk_buffer *b)
{
    FZ_CHECK(c->n_bufs < FZ_MAX_BUFS, "harness: too many buffers");
    c->bufs[c->n_bufs++] = b;
}

/* Frees the call's buffers (views first) and its snapshots; checks nothing leaked. */
static inline void fz_call_end(fz_call *c, long live_before)
{
    for (int i = c->n_bufs - 1; i >= 0; i--)
        lmk_buffer_free(c->bufs[i]);
    c->n_bufs = 0;
    fz_world_release(&c->world);
    FZ_CHECK(atomic_load(&fz_n_live) == live_before, "leak: %ld host allocations outstanding, %ld before the call",
             atomic_load(&fz_n_live), live_before);
}

/* A shape of `elems` elements in one of several forms; returns ndim (0: shape NULL, meaning
 * "byte_len / dtype size elements"). */
static inline int fz_shape(fz_in *in, size_t elems, size_t shape[LMK_MAX_DIMS])
{
    switch (fz_pick(in, 6)) {
    case 0:
        return 0;
    case 1:
    case 2:
        shape[0] = elems;
        return 1;
    case 3: {
        const size_t a = 1 + fz_pick(in, 8);
        if (elems % a == 0) {
            shape[0] = a;
            shape[1] = elems / a;
            return 2;
        }
        shape[0] = elems;
        shape[1] = 1;
        return 2;
    }
    case 4:
        shape[0] = 1;
        shape[1] = elems;
        shape[2] = 1;
        return 3;
    default: {
        const int nd = 1 + (int)fz_pick(in, LMK_MAX_DIMS);
        for (int i = 0; i < nd; i++)
            shape[i] = 1;
        shape[fz_pick(in, (unsigned)nd)] = elems;
        return nd;
    }
    }
}

/* Makes a buffer of dtype t meant to hold `elems` elements (unless c->sane, sometimes one more or
 * less, so the op sees wrong element counts and sizes; or NULL, or on another device). Operands
 * that are views of the shared parent may overlap, sane or not. Creation itself must succeed:
 * every choice here is a valid creation. */
static inline lmk_buffer *fz_make_buffer(fz_env *e, fz_call *c, fz_in *in, lmk_dtype t, size_t elems)
{
    const size_t es = lmk_dtype_size(t);
    const unsigned how = fz_pick(in, 16) % (c->sane ? 14 : 16);
    if (how == 15)
        return NULL;
    switch (c->sane ? 0 : fz_pick(in, 10)) { /* wrong counts */
    case 7:
        elems += 1;
        break;
    case 8:
        elems = elems ? elems - 1 : 0;
        break;
    case 9:
        elems = fz_pick(in, 64);
        break;
    default:
        break;
    }
    if (elems > FZ_BUF_CAP / es)
        elems = fz_pick(in, 64);
    size_t shape[LMK_MAX_DIMS];
    const int ndim = fz_shape(in, elems, shape);
    /* Pooled memory: byte_len may exceed the shape. With ndim 0 the extra changes the count. */
    size_t extra = 0;
    switch (c->sane && ndim == 0 ? 7 : fz_pick(in, 8)) {
    case 0:
        extra = es * (1 + fz_pick(in, 4));
        break;
    case 1:
        extra = 1 + fz_pick(in, 7);
        break;
    default:
        break;
    }
    const size_t byte_len = elems * es + extra;
    lmk_buffer *b = NULL;
    lmk_status st;
    if (how <= 5 || how == 14) { /* alloc, on the stream's device or (14) another device */
        st = lmk_buffer_alloc(how == 14 ? e->other : e->dev, byte_len, t, ndim ? shape : NULL, ndim, &b);
        FZ_CHECK(st == LMK_OK, "lmk_buffer_alloc(%zu bytes, %s, ndim %d) failed: %s", byte_len, lmk_dtype_name(t), ndim,
                 lmk_status_name(st));
        fz_world_add(&c->world, lmk_buffer_data(b), byte_len);
    } else if (how <= 8) { /* wrap part of the arena */
        size_t off = fz_u16(in) % (FZ_ARENA_BYTES - byte_len + 1);
        off -= off % es;
        st = lmk_buffer_wrap(e->dev, e->arena + off, byte_len, t, ndim ? shape : NULL, ndim, &b);
        FZ_CHECK(st == LMK_OK, "lmk_buffer_wrap(+%zu, %zu bytes, %s) failed: %s", off, byte_len, lmk_dtype_name(t),
                 lmk_status_name(st));
        fz_world_add(&c->world, e->arena, FZ_ARENA_BYTES);
    } else if (how <= 12) { /* a view of the shared parent: operands may overlap */
        size_t off = fz_u16(in) % (FZ_ARENA_BYTES - byte_len + 1);
        off -= off % es;
        if (fz_pick(in, 4) == 0)
            off &= ~(size_t)1023; /* often the same offset as another operand: in place */
        st = lmk_buffer_view(e->parent, off, t, ndim ? shape : NULL, ndim, &b);
        if (st == LMK_OK && ndim == 0 && lmk_buffer_byte_len(b) > byte_len) {
            /* ndim 0 views take the rest of the parent; keep the element count as chosen */
            lmk_buffer_free(b);
            shape[0] = byte_len / es;
            st = lmk_buffer_view(e->parent, off, t, shape, 1, &b);
        }
        FZ_CHECK(st == LMK_OK, "lmk_buffer_view(arena+%zu, %s) failed: %s", off, lmk_dtype_name(t),
                 lmk_status_name(st));
        fz_world_add(&c->world, e->arena, FZ_ARENA_BYTES);
    } else { /* a view at an offset inside an allocation of its own */
        const size_t pre = es * fz_pick(in, 9);
        lmk_buffer *parent = NULL;
        st = lmk_buffer_alloc(e->dev, pre + byte_len + fz_pick(in, 16), LMK_U8, NULL, 0, &parent);
        FZ_CHECK(st == LMK_OK, "lmk_buffer_alloc (parent) failed: %s", lmk_status_name(st));
        fz_call_keep(c, parent);
        fz_world_add(&c->world, lmk_buffer_data(parent), lmk_buffer_byte_len(parent));
        if (ndim == 0) {
            shape[0] = byte_len / es;
            st = lmk_buffer_view(parent, pre, t, shape, 1, &b);
        } else {
            st = lmk_buffer_view(parent, pre, t, shape, ndim, &b);
        }
        FZ_CHECK(st == LMK_OK, "lmk_buffer_view(alloc+%zu, %s) failed: %s", pre, lmk_dtype_name(t),
                 lmk_status_name(st));
    }
    fz_call_keep(c, b);
    return b;
}

/* Fills every root region with bytes from the call's PRNG (what an op must not touch). */
static inline void fz_fill_regions(fz_call *c)
{
    for (int i = 0; i < c->world.n; i++)
        for (size_t j = 0; j < c->world.r[i].len; j++)
            c->world.r[i].base[j] = (unsigned char)tst_rng_u64(&c->rng);
}

/* Whether the first `an` bytes of buffer a and the first `bn` of b share a byte. */
static inline bool fz_overlap(const lmk_buffer *a, size_t an, const lmk_buffer *b, size_t bn)
{
    const uintptr_t x = (uintptr_t)lmk_buffer_data(a), y = (uintptr_t)lmk_buffer_data(b);
    return an && bn && x < y + bn && y < x + an;
}

/* Bytes of a buffer's shape: what an op that checks element counts touches. */
static inline size_t fz_used(const lmk_buffer *b)
{
    return lmk_buffer_element_count(b) * lmk_dtype_size(lmk_buffer_dtype(b));
}

/* ------------------------------------------------------------------------------------------------
 * Bulk values from splitmix64, the bytes one call is read from, and one CPU device a level.
 * ---------------------------------------------------------------------------------------------- */

/* splitmix64: bulk values and the stream that extends short inputs. */
static inline uint64_t fz_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline double fz_uniform(uint64_t *s, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(fz_rand(s) >> 11) / 9007199254740992.0);
}

/* The `len` bytes a call is read from (into buf): the input, then bytes drawn from a generator
 * seeded with a hash of the input (an input is rarely long enough for the many choices of one
 * call, and reads past the end would all give 0, the same poor call). Every input is still one
 * deterministic call. */
static inline fz_in fz_extend(const uint8_t *data, size_t size, uint8_t *buf, size_t len)
{
    const size_t n = size < len ? size : len;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < size; i++)
        h = (h ^ data[i]) * 0x100000001b3ull;
    if (n)
        memcpy(buf, data, n);
    for (size_t i = n; i < len; i++)
        buf[i] = (uint8_t)fz_rand(&h);
    return (fz_in){buf, len};
}

/* One device an instruction-set level, each with streams of 1, 2 and 3 threads. */
typedef struct fz_level {
    fz_env env;          /* its device, arena and arena parent; env.stream has 2 threads */
    lmk_stream *alt[2];  /* 1 and 3 threads: the determinism rerun */
} fz_level;

static inline void fz_level_streams(fz_level *l)
{
    lmk_device *d = l->env.dev;
    FZ_CHECK(lmk_device_set_threads(d, 1) == LMK_OK && lmk_stream_create(d, &l->alt[0]) == LMK_OK, "1-thread stream");
    FZ_CHECK(lmk_device_set_threads(d, 3) == LMK_OK && lmk_stream_create(d, &l->alt[1]) == LMK_OK, "3-thread stream");
    FZ_CHECK(lmk_device_set_threads(d, 2) == LMK_OK, "lmk_device_set_threads");
}

/* Level 0: LMK_CPU_ISA=scalar; 1: avx2; 2: the environment's (fz_env_get's device). */
static inline fz_level *fz_level_get(unsigned i)
{
    static fz_level lv[3];
    static bool ready;
    if (!ready) {
        fz_env *base = fz_env_get();
        const char *env = getenv("LMK_CPU_ISA");
        char saved[64] = "";
        if (env)
            snprintf(saved, sizeof saved, "%s", env);
        static const char *const isa[2] = {"scalar", "avx2"};
        for (int l = 0; l < 2; l++) {
            fz_env *e = &lv[l].env;
            setenv("LMK_CPU_ISA", isa[l], 1);
            FZ_CHECK(lmk_device_open(LMK_BACKEND_CPU, 0, &e->dev) == LMK_OK, "cannot open the %s device", isa[l]);
            e->other = base->other;
            FZ_CHECK(lmk_device_set_threads(e->dev, 2) == LMK_OK && lmk_stream_create(e->dev, &e->stream) == LMK_OK,
                     "cannot create a stream");
            FZ_CHECK(posix_memalign((void **)&e->arena, 64, FZ_ARENA_BYTES) == 0, "harness: no arena");
            FZ_CHECK(lmk_buffer_wrap(e->dev, e->arena, FZ_ARENA_BYTES, LMK_U8, NULL, 0, &e->parent) == LMK_OK,
                     "cannot wrap the arena");
        }
        if (env)
            setenv("LMK_CPU_ISA", saved, 1);
        else
            unsetenv("LMK_CPU_ISA");
        lv[2].env = *base;
        for (int l = 0; l < 3; l++)
            fz_level_streams(&lv[l]);
        ready = true;
    }
    return &lv[i % 3];
}

/* ------------------------------------------------------------------------------------------------
 * Element values: writing floats and indices into buffers of any ndim and strides.
 * ---------------------------------------------------------------------------------------------- */

/* Calls fn on the byte address of every element of b (any ndim, any strides). */
static inline void fz_for_each(const lmk_buffer *b, void (*fn)(unsigned char *p, lmk_dtype t, void *ctx), void *ctx)
{
    const int nd = lmk_buffer_ndim(b);
    const lmk_dtype t = lmk_buffer_dtype(b);
    const size_t n = lmk_buffer_element_count(b), es = lmk_dtype_size(t);
    unsigned char *base = lmk_buffer_data(b);
    for (size_t k = 0; k < n; k++) {
        size_t rest = k, off = 0;
        for (int a = nd - 1; a >= 0; a--) {
            off += rest % lmk_buffer_dim(b, a) * lmk_buffer_stride(b, a);
            rest /= lmk_buffer_dim(b, a);
        }
        fn(base + off * es, t, ctx);
    }
}

/* Stores v, rounded to a float dtype t, at p (other dtypes: nothing). */
static inline void fz_put_float(unsigned char *p, lmk_dtype t, double v)
{
    const float f = (float)v;
    if (t == LMK_F32) {
        memcpy(p, &f, 4);
    } else if (t == LMK_BF16 || t == LMK_F16) {
        const uint16_t h = t == LMK_BF16 ? lmk_f32_to_bf16(f) : lmk_f32_to_f16(f);
        memcpy(p, &h, 2);
    }
}

typedef struct fz_fill_ctx {
    uint64_t *r;
    unsigned cls; /* 0: uniform in [lo, hi); 1: specials among them; 2: raw bits; 3: large */
    double lo, hi;
} fz_fill_ctx;

/* A fz_for_each callback: one element drawn as its fz_fill_ctx says. */
static inline void fz_fill_one(unsigned char *p, lmk_dtype t, void *vctx)
{
    fz_fill_ctx *x = vctx;
    static const float specials[] = {NAN, INFINITY, -INFINITY, -0.0f, 1e-40f, 3e38f, 65504.0f, 1e5f};
    const uint64_t bits = fz_rand(x->r);
    if (x->cls == 2)
        memcpy(p, &bits, lmk_dtype_size(t) < 8 ? lmk_dtype_size(t) : 8);
    else if (x->cls == 1 && (bits & 15) == 0)
        fz_put_float(p, t, specials[(bits >> 4) % 8]);
    else
        fz_put_float(p, t, x->cls == 3 ? fz_uniform(x->r, -1e4, 1e4) : fz_uniform(x->r, x->lo, x->hi));
}

/* Every element of b (NULL: none) uniform in [lo, hi), or now and then (often unless sane) with
 * specials, raw bits or large values. */
static inline void fz_fill_values(fz_in *in, bool sane, const lmk_buffer *b, uint64_t *r, double lo, double hi)
{
    if (!b)
        return;
    fz_fill_ctx x = {r, 0, lo, hi};
    if (fz_pick(in, sane ? 16 : 4) == 0)
        x.cls = 1 + fz_pick(in, 3);
    fz_for_each(b, fz_fill_one, &x);
}

/* Stores v as element i of a dense i32 or i64 buffer (other dtypes: nothing). */
static inline void fz_put_index(const lmk_buffer *b, size_t i, int64_t v)
{
    unsigned char *p = lmk_buffer_data(b);
    if (lmk_buffer_dtype(b) == LMK_I64) {
        memcpy(p + 8 * i, &v, 8);
    } else if (lmk_buffer_dtype(b) == LMK_I32) {
        const int32_t w = (int32_t)v;
        memcpy(p + 4 * i, &w, 4);
    }
}

static inline void fz_sort_i64(int64_t *v, size_t n)
{
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && v[j] < v[j - 1]; j--) {
            const int64_t x = v[j];
            v[j] = v[j - 1], v[j - 1] = x;
        }
}

static inline bool fz_is_float(lmk_dtype t)
{
    return t == LMK_F32 || t == LMK_BF16 || t == LMK_F16;
}

/* ------------------------------------------------------------------------------------------------
 * Operands and their element bytes, for the oracles of ops with strided operands (lmk.h,
 * "Operands"): which buffers are operands of a shape, and whether operands share a byte. Overlap
 * is judged on the bytes the elements occupy (a mark per byte of every region), not on extents.
 * ---------------------------------------------------------------------------------------------- */

/* lmk.h's operand rule: a 3-D buffer of shape [n0, n1, n2] with last stride 1 (any stride when
 * n2 is 1), or a dense buffer of exactly n0*n1*n2 elements. */
static inline bool fz_operand3(const lmk_buffer *b, size_t n0, size_t n1, size_t n2, lmk_tensor3 *t)
{
    size_t count;
    if (__builtin_mul_overflow(n0 * n1, n2, &count) || (n1 && n0 * n1 / n1 != n0))
        return false;
    *t = (lmk_tensor3){.data = lmk_buffer_data(b), .n = {n0, n1, n2}, .es = lmk_dtype_size(lmk_buffer_dtype(b))};
    if (lmk_buffer_ndim(b) == 3 && lmk_buffer_dim(b, 0) == n0 && lmk_buffer_dim(b, 1) == n1 &&
        lmk_buffer_dim(b, 2) == n2 && (lmk_buffer_stride(b, 2) == 1 || n2 == 1)) {
        t->stride[0] = lmk_buffer_stride(b, 0), t->stride[1] = lmk_buffer_stride(b, 1), t->stride[2] = 1;
        return true;
    }
    if (lmk_buffer_is_contiguous(b) && lmk_buffer_element_count(b) == count) {
        t->stride[0] = n1 * n2, t->stride[1] = n2, t->stride[2] = 1;
        return true;
    }
    return false;
}

/* A [n0, n1] operand: a dense buffer of exactly n0*n1 elements, or a 2-D buffer of exactly that
 * shape with last stride 1 and any token stride; resolved as [n0, 1, n1]. */
static inline bool fz_operand2(const lmk_buffer *b, size_t n0, size_t n1, lmk_tensor3 *t)
{
    size_t count;
    if (__builtin_mul_overflow(n0, n1, &count))
        return false;
    *t = (lmk_tensor3){.data = lmk_buffer_data(b), .n = {n0, 1, n1}, .stride = {n1, n1, 1},
                       .es = lmk_dtype_size(lmk_buffer_dtype(b))};
    if (lmk_buffer_ndim(b) == 2 && lmk_buffer_dim(b, 0) == n0 && lmk_buffer_dim(b, 1) == n1 &&
        (lmk_buffer_stride(b, 1) == 1 || n1 == 1)) {
        t->stride[0] = lmk_buffer_stride(b, 0);
        return true;
    }
    return lmk_buffer_is_contiguous(b) && lmk_buffer_element_count(b) == count;
}

/* A dense buffer's elements as a [1, 1, n] operand (positions, weights, ...). */
static inline lmk_tensor3 fz_flat3(const lmk_buffer *b)
{
    const size_t n = lmk_buffer_element_count(b);
    return (lmk_tensor3){.data = lmk_buffer_data(b), .n = {1, 1, n}, .stride = {n, n, 1},
                         .es = lmk_dtype_size(lmk_buffer_dtype(b))};
}

/* Same address, shape and strides (strides of axes of length 1 ignored): an in-place pair. */
static inline bool fz_same3(const lmk_tensor3 *a, const lmk_tensor3 *b)
{
    if (a->data != b->data || a->es != b->es)
        return false;
    for (int i = 0; i < 3; i++)
        if (a->n[i] != b->n[i] || (a->n[i] > 1 && a->stride[i] != b->stride[i]))
            return false;
    return true;
}

/* Whether the extents (first to last byte) of two operands meet. */
static inline bool fz_spans_meet(const lmk_tensor3 *a, const lmk_tensor3 *b)
{
    const size_t sa = tst_span(a->n, a->stride, a->es), sb = tst_span(b->n, b->stride, b->es);
    return (uintptr_t)a->data < (uintptr_t)b->data + sb && (uintptr_t)b->data < (uintptr_t)a->data + sa;
}

/* Whether a layout is nested (its strides, sorted, each step past everything inside them): the
 * layouts whose distinct elements lmk can prove distinct. */
static inline bool fz_nested(const size_t *n_in, const size_t *s_in, int nd)
{
    size_t n[4], s[4], reach = 1;
    int k = 0;
    for (int i = 0; i < nd; i++)
        if (n_in[i] > 1)
            n[k] = n_in[i], s[k] = s_in[i], k++;
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
            size_t x = s[j]; s[j] = s[j - 1]; s[j - 1] = x;
            x = n[j]; n[j] = n[j - 1]; n[j - 1] = x;
        }
    for (int i = 0; i < k; i++) {
        if (s[i] < reach)
            return false;
        reach += (n[i] - 1) * s[i];
    }
    return true;
}

/* Tensors side by side in one row: token-major with one token stride, each token's elements
 * inside it. lmk.h's overlap rule is exact for them: disjoint elements must be accepted. */
static inline bool fz_side_by_side(const lmk_tensor3 *a, const lmk_tensor3 *b)
{
    if (a->n[0] < 2 || b->n[0] < 2 || a->stride[0] * a->es != b->stride[0] * b->es)
        return false;
    const size_t period = a->stride[0] * a->es;
    const size_t fa = ((a->n[1] - 1) * a->stride[1] + a->n[2]) * a->es;
    const size_t fb = ((b->n[1] - 1) * b->stride[1] + b->n[2]) * b->es;
    return fa <= period && fb <= period && (a->n[1] < 2 || a->stride[1] >= a->n[2]) &&
           (b->n[1] < 2 || b->stride[1] >= b->n[2]);
}

/* Marks, for every byte of every region of a world, which operands' elements hold it (bit i:
 * operand i, up to 8), and which operands hold a byte twice (self-overlapping elements). */
typedef struct fz_marks {
    uint8_t *m[FZ_MAX_REGIONS];
    bool self_overlap[8];
} fz_marks;

static inline void fz_marks_init(fz_marks *mk, const fz_world *w)
{
    memset(mk, 0, sizeof *mk);
    for (int r = 0; r < w->n; r++) {
        mk->m[r] = calloc(w->r[r].len + 1, 1);
        FZ_CHECK(mk->m[r] != NULL, "harness: out of memory");
    }
}

static inline void fz_marks_free(fz_marks *mk)
{
    for (int r = 0; r < FZ_MAX_REGIONS; r++)
        free(mk->m[r]);
}

static inline void fz_mark(fz_world *w, fz_marks *mk, const lmk_tensor3 *t, int bit)
{
    const size_t row = t->n[2] * t->es;
    for (size_t a = 0; a < t->n[0]; a++)
        for (size_t h = 0; h < t->n[1]; h++) {
            const unsigned char *lo = t->data + (a * t->stride[0] + h * t->stride[1]) * t->es;
            const fz_region *r = fz_world_find(w, lo);
            FZ_CHECK(r != NULL, "harness: operand %d outside every region", bit);
            uint8_t *m = mk->m[r - w->r] + (lo - r->base);
            for (size_t i = 0; i < row; i++) {
                if (m[i] & (1u << bit))
                    mk->self_overlap[bit] = true;
                m[i] |= (uint8_t)(1u << bit);
            }
        }
}

/* Whether operands a and b hold a common byte. */
static inline bool fz_marks_share(const fz_world *w, const fz_marks *mk, int a, int b)
{
    for (int r = 0; r < w->n; r++)
        for (size_t i = 0; i < w->r[r].len; i++)
            if ((mk->m[r][i] >> a & 1) && (mk->m[r][i] >> b & 1))
                return true;
    return false;
}

/* The first byte that changed and holds no element of the operands in `out_bits`, or NULL. */
static inline const void *fz_changed_outside(const fz_world *w, const fz_marks *mk, unsigned out_bits)
{
    for (int r = 0; r < w->n; r++)
        for (size_t b = 0; b < w->r[r].len; b++)
            if (w->r[r].base[b] != w->r[r].snap[b] && !(mk->m[r][b] & out_bits))
                return w->r[r].base + b;
    return NULL;
}

#endif /* LMK_FUZZ_COMMON_H */
