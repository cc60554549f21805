/*
 * bench.c - `lmk bench`: each op at real model shapes, timed against a copy ceiling of the same run.
 *
 * The cases are the ops' own benchmark cases (their descriptors, src/ops/<op>/case.c, through the
 * test kit's registry), each declaring the bytes it must move (inputs read once, outputs written
 * once, positions and the like), reported per second next to the bandwidth of a plain copy of as
 * many bytes, measured on the same device with the same threads: the fraction says how close the
 * op comes to the memory system's limit. docs/bench.md explains the columns.
 *
 * Cold memory: a case whose buffers would stay in the last-level cache between calls runs on
 * several copies of them, used in turn, so that every call reads from and writes to memory, as in
 * a real model step. Cases too small for that (decode, T = 1) run hot on one set and say so.
 * CPU times are the median over calls of clock time around one synchronous call; CUDA times come
 * from events (tools/bench_cuda.c), replayed from a CUDA graph to keep launch gaps out.
 *
 * What runs: by default the headline cases (k_headline below: a few real model shapes, seconds on
 * a 2-core CPU); --all, or any of --op, --dtype and --T, runs the ops' whole benchmark lists.
 */
#include "tool.h"

#ifdef LMK_WITH_CUDA
#include "bench_cuda.h"
#endif
/* The CUDA kernel variants tables (plain data; their force hooks exist in CUDA builds only). */
#include "../src/ops/attn_prologue/variants.h"
#include "../src/ops/rope/variants.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SETS 64
#define MAX_T_LIST 16
#define MAX_CASES 256
#define CPU_CACHE_BYTES ((size_t)32 << 20) /* the dev box's L3; sysconf's figure is wrong in VMs */
#define GPU_CACHE_BYTES ((size_t)64 << 20) /* above the 50 MB L2 of an H100/H200 */
#define CPU_MIN_SAMPLES 5
#define CPU_MIN_SAMPLE_S 20e-6
#define CPU_MAX_SAMPLES 2000
#define CPU_BUDGET_S 0.25 /* per measurement: enough calls for a stable median, 60 s for the run */
#define CPU_MAX_ROUND 3   /* functions timed in one round: the op, memcpy, the streaming copy */
#define CUDA_REPS 20

typedef struct bench_result {
    double bytes;      /* bytes the op must move per call */
    int n_sets;
    bool in_cache;
    double time_s, ceiling_bps, host_s; /* host_s: CUDA T = 1 only, else 0 */
    double memcpy_bps;                  /* CPU: plain memcpy alone, the weaker ceiling; else 0 */
    int samples;
} bench_result;

/* What one timed call needs: n_sets copies of a case (tst_inst), used in turn. */
typedef struct bench_run {
    lmk_stream *s;
    tst_inst *sets[MAX_SETS];
    int n_sets, next;
} bench_run;

/* ---- --variant: one row of an op's CUDA variants table (src/ops/<op>/variants.h) ----
 *
 * `lmk bench --variant NAME` forces every call of the row's op onto that row (its force hook), and
 * runs that op's cases (as --op would): a case the row cannot run is a skipped row, UNSUPPORTED. Two
 * runs on one GPU, each forcing one row, are the A/B that keeps a row or deletes it.
 * `--variant list` prints the rows. */
typedef struct bench_variant {
    const char *op, *name, *kernel, *args, *reason, *bench;
    int id;
    lmk_status (*force)(int variant); /* NULL: a build without CUDA */
} bench_variant;

#ifdef LMK_WITH_CUDA
#define BENCH_AP_FORCE lmk_cuda_attn_prologue_force
#define BENCH_ROPE_FORCE lmk_cuda_rope_force
#else
#define BENCH_AP_FORCE NULL
#define BENCH_ROPE_FORCE NULL
#endif

static const bench_variant k_variants[] = {
#define BENCH_AP_ROW(id, name, kernel, units, f8, mix, chunk, reason, bench)                                          \
    {"attn_prologue", name, #kernel, #units " f8=" #f8 " mix=" #mix " chunk=" #chunk, reason, bench, id,             \
     BENCH_AP_FORCE},
    LMK_AP_VARIANTS(BENCH_AP_ROW)
#undef BENCH_AP_ROW
#define BENCH_ROPE_ROW(id, name, kernel, copy, maps, reason, bench)                                                   \
    {"rope", name, #kernel, "copy=" #copy " maps=" #maps, reason, bench, id, BENCH_ROPE_FORCE},
    LMK_ROPE_VARIANTS(BENCH_ROPE_ROW)
#undef BENCH_ROPE_ROW
};
#define N_VARIANTS (int)(sizeof k_variants / sizeof k_variants[0])

static void print_variants(void)
{
    for (int i = 0; i < N_VARIANTS; i++) {
        const bench_variant *v = &k_variants[i];
        printf("%-14s %-30s %s %s\n    why: %s\n    kept by: %s\n", v->op, v->name, v->kernel, v->args, v->reason,
               v->bench);
    }
}

typedef struct bench_opts {
    lmk_backend backend;
    const tst_op *op; /* NULL: all */
    int dtype;        /* 0 f32, 1 bf16, 2 all */
    uint32_t T[MAX_T_LIST];
    int n_T;
    int threads;      /* 0: the device default */
    int iters;        /* 0: adaptive */
    bool json;
    bool all;         /* every case of the selected ops (--all, --op, --dtype or --T), else the headline */
    bool list;        /* print the cases, time nothing */
    bool list_variants;           /* --variant list */
    const bench_variant *variant; /* --variant NAME: the row every call of its op is forced onto; NULL: none */
} bench_opts;

/* ---- the headline: what `lmk bench` runs by default ----
 *
 * One row per case worth a first look: the prompt (T = 4106) and decode (T = 1) shapes of the
 * models the ops were made for, in bf16, as engines run them. Each entry picks one of its op's
 * benchmark cases (the descriptor's bench_cases at that T and dtype) by fragments of the case's
 * name, all of which must occur in exactly one case; `lmk bench --list` shows the picks, and a
 * fragment that stops matching after a rename fails it (tests/test_cli.c). A new op adds its lines
 * here. The label is the row's name in the table: with T and dtype it fits 120 columns. */
#define HEADLINE_FRAGMENTS 3
typedef struct headline {
    const char *op;
    uint32_t T;
    lmk_dtype dtype;
    const char *match[HEADLINE_FRAGMENTS]; /* unused ones NULL */
    const char *label;                     /* at most 44 characters: rows stay within 120 columns */
} headline;

static const headline k_headline[] = {
    {"rope", 4106, LMK_BF16, {"rope imrope", "q=q|gate"}, "rope q+k, Qwen3.5-27B q from q|gate"},
    {"rope", 1, LMK_BF16, {"rope imrope", "q=q|gate"}, "rope q+k, Qwen3.5-27B q from q|gate"},
    {"rope", 4106, LMK_BF16, {"rope neox", "qkv-in-place"}, "rope q+k in packed qkv, Llama-3.1-8B"},
    {"attn_prologue", 4106, LMK_BF16, {"q-in-place", "cache=bf16+v", "// Qwen3-8B"},
     "attn_prologue, Qwen3-8B qkv+norm+cache"},
    {"attn_prologue", 1, LMK_BF16, {"q-in-place", "cache=bf16+v", "// Qwen3-8B"},
     "attn_prologue, Qwen3-8B qkv+norm+cache"},
    {"attn_prologue", 4106, LMK_BF16, {"cache=bf16+v", "// Qwen3.5/3.6-27B"},
     "attn_prologue, Qwen3.5-27B q|gate+norm+cache"},
    {"repeat", 4106, LMK_BF16, {"repeat_heads block 8->32"}, "repeat_heads block 8->32, Llama-3.1-8B k"},
    {"repeat", 4106, LMK_BF16, {"repeat_heads tiled 16->48"}, "repeat_heads tiled 16->48, Qwen3.5-27B q"},
    {"causal_conv1d", 4106, LMK_BF16, {"C=10240 W=4 T=4106", "// Qwen3.5-27B prompt"},
     "causal_conv1d, Qwen3.5-27B GDN in place"},
    {"causal_conv1d", 1, LMK_BF16, {"seqs=decode/256 "}, "causal_conv1d decode x256, Qwen3.5-27B"},
    {"gated_delta_rule", 1, LMK_BF16, {"seqs=decode/64 "}, "gated_delta_rule decode x64, Qwen3.5-27B"},
};
#define N_HEADLINE (int)(sizeof k_headline / sizeof k_headline[0])

/* How many buffer sets to rotate through, from the bytes a set occupies: one when a set alone is
 * four times the cache, else enough to be four times the cache together (at twice, a third of a
 * set could still be in the cache when its turn came: seen on the 32 MB-L3 CPU with the 67 MB bf16
 * repeat, whose source stayed hot); one (hot, reported "in cache") when even MAX_SETS would not do. */
static int choose_sets(double footprint, size_t cache, bool *in_cache)
{
    *in_cache = false;
    if (footprint >= 4.0 * (double)cache)
        return 1;
    const double n = ceil(4.0 * (double)cache / footprint);
    if (n > MAX_SETS) {
        *in_cache = true;
        return 1;
    }
    return n < 2 ? 2 : (int)n;
}

/* One call of the case's op on the next set: what every timer calls. */
static lmk_status run_call(void *ctx)
{
    bench_run *r = ctx;
    const int i = r->next;
    r->next = (r->next + 1) % r->n_sets;
    return tst_inst_run(r->sets[i], r->s);
}

/* The bytes the case's buffers occupy on the device. */
static double footprint(const tst_inst *in)
{
    double b = 0;
    for (int i = 0; i < in->mem.n_r; i++)
        b += (double)in->mem.r[i].len;
    return b;
}

/* ---- CPU timing ---- */

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median seconds per call of each of the k functions fn[j](ctx[j]), timed in rounds that visit
 * every function in turn, so that a drift of the machine's speed hits them all alike. Each sample
 * times a batch of calls, as many as make it last CPU_MIN_SAMPLE_S (one call, for all but
 * decode-sized ops), so clock overhead stays out of sub-microsecond calls. Rounds: `iters`, or
 * with iters 0 as many as fit in k * CPU_BUDGET_S (at least CPU_MIN_SAMPLES). The first `warmup`
 * calls of each function are not timed. */
static lmk_status cpu_time_rounds(int k, lmk_status (*const fn[])(void *), void *const ctx[], int warmup,
                                  int iters, double median_s[], int *samples)
{
    const int max = iters ? iters : CPU_MAX_SAMPLES;
    double *t = malloc((size_t)k * (size_t)max * sizeof *t);
    if (!t)
        return tst_fail(LMK_ERR_OUT_OF_MEMORY, "lmk bench: out of host memory");
    lmk_status st = LMK_OK;
    int batch[CPU_MAX_ROUND];
    for (int j = 0; j < k; j++) {
        for (int i = 0; i < warmup && st == LMK_OK; i++)
            st = fn[j](ctx[j]);
        for (batch[j] = 1; st == LMK_OK && batch[j] < 1024; batch[j] *= 2) {
            const double t0 = tst_now();
            for (int i = 0; i < batch[j] && st == LMK_OK; i++)
                st = fn[j](ctx[j]);
            if (tst_now() - t0 >= CPU_MIN_SAMPLE_S)
                break;
        }
    }
    int n = 0;
    const double start = tst_now();
    while (st == LMK_OK && n < max) {
        if (!iters && n >= CPU_MIN_SAMPLES && tst_now() - start >= CPU_BUDGET_S * k)
            break;
        for (int j = 0; j < k && st == LMK_OK; j++) {
            const double t0 = tst_now();
            for (int i = 0; i < batch[j] && st == LMK_OK; i++)
                st = fn[j](ctx[j]);
            t[(size_t)j * (size_t)max + (size_t)n] = (tst_now() - t0) / batch[j];
        }
        n++;
    }
    for (int j = 0; j < k && st == LMK_OK; j++) {
        double *v = t + (size_t)j * (size_t)max;
        qsort(v, (size_t)n, sizeof *v, cmp_double);
        median_s[j] = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    }
    if (st == LMK_OK)
        *samples = n;
    free(t);
    return st;
}

/* The CPU copy ceiling: a copy split over the stream's thread count, with memcpy and, for buffers
 * out of cache, also with streaming (non-temporal) stores; the faster one counts. memcpy alone is
 * no ceiling there: its ordinary stores first read every destination line (a third more traffic),
 * which a kernel that streams its output does not, so the op would "beat" the copy.
 * Threads wait for work by spinning briefly, then sleeping: back-to-back copies never pay a
 * wake-up, while idle workers never take a core from the op being timed (or, on a busy machine,
 * from each other). A copy is split only into shares of at least COPY_MIN_SHARE bytes: splitting
 * a smaller one costs more than it saves, which is also why the library runs small ops on the
 * calling thread alone. */
#define COPY_MIN_SHARE ((size_t)64 << 10)
#define SPIN_ITERS 4000 /* pause instructions, tens of microseconds */

typedef struct copy_pool copy_pool;
typedef struct copy_worker {
    copy_pool *pool;
    pthread_t thread;
    int tid;
} copy_worker;

struct copy_pool {
    int n;                  /* threads, the caller included */
    int started;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    atomic_uint gen;        /* bumped once per copy */
    atomic_int pending;     /* workers still copying */
    atomic_int sleepers;    /* workers asleep on wake */
    atomic_bool caller_asleep;
    bool quit;              /* under mu */
    unsigned char *dst;
    const unsigned char *src;
    size_t len;
    int n_job;              /* threads taking part in this copy */
    bool stream;            /* streaming stores instead of memcpy */
    copy_worker workers[1024];
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* memcpy, or 64-byte steps of streaming stores (SSE2 is part of x86-64; wider vectors move no
 * more bytes when memory is the limit). */
static void copy_bytes(unsigned char *d, const unsigned char *s, size_t n, bool stream)
{
#if defined(__x86_64__)
    if (stream) {
        for (; n && ((uintptr_t)d & 15); n--)
            *d++ = *s++;
        for (; n >= 64; n -= 64, d += 64, s += 64) {
            const __m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
            const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
            const __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
            const __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
            _mm_stream_si128((__m128i *)(void *)d, a);
            _mm_stream_si128((__m128i *)(void *)(d + 16), b);
            _mm_stream_si128((__m128i *)(void *)(d + 32), c);
            _mm_stream_si128((__m128i *)(void *)(d + 48), e);
        }
        _mm_sfence();
    }
#else
    (void)stream;
#endif
    memcpy(d, s, n);
}

static void copy_share(copy_pool *p, int tid)
{
    if (tid >= p->n_job)
        return;
    const size_t per = (p->len / (size_t)p->n_job + 63) / 64 * 64;
    const size_t lo = per * (size_t)tid < p->len ? per * (size_t)tid : p->len;
    const size_t hi = tid + 1 == p->n_job || lo + per > p->len ? p->len : lo + per;
    if (hi > lo)
        copy_bytes(p->dst + lo, p->src + lo, hi - lo, p->stream);
}

/* The atomics are sequentially consistent: a sleeper announces itself before it rechecks gen,
 * and the caller bumps gen before it reads the sleepers, so one of the two always sees the other. */
static void *copy_worker_main(void *arg)
{
    copy_worker *w = arg;
    copy_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load(&p->gen);
        for (int i = 0; g == seen && i < SPIN_ITERS; i++) {
            cpu_relax();
            g = atomic_load(&p->gen);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (!p->quit && (g = atomic_load(&p->gen)) == seen)
                pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            const bool quit = p->quit;
            pthread_mutex_unlock(&p->mu);
            if (quit)
                return NULL;
        }
        seen = g;
        copy_share(p, w->tid);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_asleep)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void copy_pool_free(copy_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->started; i++)
        pthread_join(p->workers[i].thread, NULL);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static copy_pool *copy_pool_new(int n)
{
    copy_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n = n < 1 ? 1 : n > 1024 ? 1024 : n;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int i = 0; i < p->n - 1; i++) {
        p->workers[i] = (copy_worker){.pool = p, .tid = i + 1};
        if (pthread_create(&p->workers[i].thread, NULL, copy_worker_main, &p->workers[i]) != 0) {
            copy_pool_free(p);
            return NULL;
        }
        p->started++;
    }
    return p;
}

typedef struct copy_run {
    copy_pool *pool;
    unsigned char *src[MAX_SETS], *dst[MAX_SETS];
    size_t len;
    int n_sets, next;
    bool stream;
} copy_run;

static lmk_status copy_call(void *ctx)
{
    copy_run *c = ctx;
    copy_pool *p = c->pool;
    const size_t by_size = c->len / COPY_MIN_SHARE;
    p->n_job = by_size < 1 ? 1 : by_size < (size_t)p->n ? (int)by_size : p->n;
    p->dst = c->dst[c->next];
    p->src = c->src[c->next];
    p->len = c->len;
    p->stream = c->stream;
    c->next = (c->next + 1) % c->n_sets;
    if (p->n_job == 1) {
        copy_share(p, 0);
        return LMK_OK;
    }
    /* Every worker wakes (an idle one skips its share), so gen stays one count for all. */
    atomic_store(&p->pending, p->n - 1);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    copy_share(p, 0);
    for (int i = 0; atomic_load(&p->pending) > 0 && i < SPIN_ITERS; i++)
        cpu_relax();
    if (atomic_load(&p->pending) > 0) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_asleep, true);
        while (atomic_load(&p->pending) > 0)
            pthread_cond_wait(&p->done, &p->mu);
        atomic_store(&p->caller_asleep, false);
        pthread_mutex_unlock(&p->mu);
    }
    return LMK_OK;
}

/* The buffers of a copy of bytes/2 (read + write = bytes) over n_sets buffer pairs used in turn. */
static lmk_status copy_setup(copy_run *c, copy_pool *pool, double bytes, int n_sets)
{
    *c = (copy_run){.pool = pool, .len = ((size_t)(bytes / 2) + 63) / 64 * 64, .n_sets = n_sets};
    for (int i = 0; i < n_sets; i++) {
        c->src[i] = aligned_alloc(64, c->len);
        c->dst[i] = aligned_alloc(64, c->len);
        if (!c->src[i] || !c->dst[i])
            return tst_fail(LMK_ERR_OUT_OF_MEMORY, "copy ceiling: cannot allocate 2 x %zu bytes", c->len);
        memset(c->src[i], 0x5a, c->len); /* never-touched pages would all read the one zero page */
        memset(c->dst[i], 0xa5, c->len);
    }
    return LMK_OK;
}

static void copy_free(copy_run *c)
{
    for (int i = 0; i < c->n_sets; i++) {
        free(c->src[i]);
        free(c->dst[i]);
    }
}

/* ---- one case ---- */

typedef struct bench_env {
    lmk_device *dev;
    lmk_stream *s;
    bool cuda;
    copy_pool *pool;                 /* CPU only */
    int threads;                     /* CPU: the stream's thread count */
    uint64_t seed;
} bench_env;

/* Makes the case's buffer sets (the first tells how many it takes to leave the cache). */
static lmk_status make_sets(bench_env *e, const tst_case *c, bench_run *r, bench_result *res)
{
    lmk_status st = tst_inst_make(c, e->dev, e->seed++, TST_INST_FAST, NULL, &r->sets[0]);
    if (st != LMK_OK)
        return st;
    r->n_sets = 1;
    const int want = choose_sets(footprint(r->sets[0]), e->cuda ? GPU_CACHE_BYTES : CPU_CACHE_BYTES, &res->in_cache);
    for (; r->n_sets < want && st == LMK_OK; r->n_sets++)
        st = tst_inst_make(c, e->dev, e->seed++, TST_INST_FAST, NULL, &r->sets[r->n_sets]);
    if (st != LMK_OK)
        r->n_sets--; /* the failed one made nothing */
    res->n_sets = r->n_sets;
    return st;
}

/* The op and its ceiling copies (memcpy; out of cache also streaming stores, the faster counts),
 * timed in interleaved rounds: this VM's bandwidth drifts by a third from one second to the next,
 * and timing them one after the other made the fraction swing between 0.65 and 0.99 for the same
 * op. */
static lmk_status time_cpu(bench_env *e, const bench_opts *o, bench_run *r, bench_result *res)
{
    copy_run cm, cs;
    lmk_status st = copy_setup(&cm, e->pool, res->bytes, res->n_sets);
    cs = cm;
    cs.stream = true;
    lmk_status (*const fns[CPU_MAX_ROUND])(void *) = {run_call, copy_call, copy_call};
    void *const ctxs[CPU_MAX_ROUND] = {r, &cm, &cs};
    double med[CPU_MAX_ROUND];
    const int k = res->in_cache ? 2 : 3;
    if (st == LMK_OK)
        st = cpu_time_rounds(k, fns, ctxs, r->n_sets + 1, o->iters, med, &res->samples);
    if (st == LMK_OK)
        st = lmk_stream_sync(e->s);
    if (st == LMK_OK) {
        res->time_s = med[0];
        res->ceiling_bps = 2.0 * (double)cm.len / (k == 3 && med[2] < med[1] ? med[2] : med[1]);
        res->memcpy_bps = 2.0 * (double)cm.len / med[1];
    }
    copy_free(&cm);
    return st;
}

static lmk_status run_case(bench_env *e, const bench_opts *o, const tst_case *c, bench_result *res)
{
    memset(res, 0, sizeof *res);
    res->bytes = c->op->bytes(c);
    bench_run *r = calloc(1, sizeof *r);
    if (!r)
        return tst_fail(LMK_ERR_OUT_OF_MEMORY, "lmk bench: out of host memory");
    r->s = e->s;
    lmk_status st = make_sets(e, c, r, res);
    if (st == LMK_OK)
        st = lmk_stream_sync(e->s);
    if (st == LMK_OK && !e->cuda)
        st = time_cpu(e, o, r, res);
#ifdef LMK_WITH_CUDA
    if (st == LMK_OK && e->cuda) {
        /* Graph replay keeps host launch gaps out of every case; a decode-sized call is replayed 100
         * times per sample so that event resolution does not matter. */
        const int inner = c->T == 1 ? 100 : 10;
        res->samples = o->iters ? o->iters : CUDA_REPS;
        st = bench_cuda_time(e->s, 0, run_call, r, r->n_sets + 2, res->samples, inner, 1, &res->time_s);
        if (st == LMK_OK && c->T == 1)
            st = bench_cuda_host_cost(e->s, 0, run_call, r, 1000, &res->host_s);
        if (st == LMK_OK)
            st = bench_cuda_copy_ceiling(e->s, 0, (size_t)(res->bytes / 2), &res->ceiling_bps); /* copy size */
    }
#endif
    for (int i = 0; i < r->n_sets; i++)
        tst_inst_free(r->sets[i]);
    free(r);
    return st;
}

/* ---- the case list ---- */

/* The case of headline entry h, into *out; the number of the op's cases that match (1: found). */
static int headline_case(const headline *h, uint32_t t_max, tst_case *out)
{
    const tst_op *op = tst_op_find(h->op);
    tst_case *c = op ? calloc(MAX_CASES, sizeof *c) : NULL;
    if (!c)
        return 0;
    const int n = tst_op_bench_cases(op, h->T, h->dtype, h->T == t_max, c, MAX_CASES);
    int found = 0;
    for (int i = 0; i < n; i++) {
        bool all = true;
        for (int f = 0; f < HEADLINE_FRAGMENTS && all; f++)
            all = !h->match[f] || strstr(c[i].name, h->match[f]);
        if (all && found++ == 0)
            *out = c[i];
    }
    free(c);
    return found;
}

/* The headline cases (labels[i] names case i); an entry that matches no case or several is
 * reported and makes the run fail. Returns the count, or -1. */
static int make_headline(tst_case *cases, const char **labels)
{
    uint32_t t_max = 0;
    for (int i = 0; i < N_HEADLINE; i++)
        t_max = k_headline[i].T > t_max ? k_headline[i].T : t_max;
    int n = 0, bad = 0;
    for (int i = 0; i < N_HEADLINE; i++) {
        const headline *h = &k_headline[i];
        const int found = headline_case(h, t_max, &cases[n]);
        if (found != 1) {
            fprintf(stderr, "lmk: bench's headline entry \"%s\" (%s T=%u %s) matches %d of the op's bench cases, "
                    "not one: tools/bench.c's k_headline needs updating\n", h->label, h->op, h->T,
                    lmk_dtype_name(h->dtype), found);
            bad = 1;
            continue;
        }
        labels[n++] = h->label;
    }
    return bad ? -1 : n;
}

/* Every selected op's benchmark cases, per dtype and token count. */
static int make_cases(const bench_opts *o, tst_case *cases)
{
    static const lmk_dtype dts[] = {LMK_F32, LMK_BF16};
    int n = 0;
    uint32_t t_max = 0;
    for (int k = 0; k < o->n_T; k++)
        t_max = o->T[k] > t_max ? o->T[k] : t_max;
    for (int d = 0; d < 2; d++) {
        if (o->dtype != 2 && o->dtype != d)
            continue;
        for (int k = 0; k < o->n_T; k++)
            for (int i = 0; i < tst_op_count; i++)
                if (!o->op || o->op == tst_ops[i])
                    n += tst_op_bench_cases(tst_ops[i], o->T[k], dts[d], o->T[k] == t_max, cases + n, MAX_CASES - n);
    }
    return n;
}

/* ---- output ---- */

/* The case column: the full case name, or for a headline case its label with T and dtype. */
static void case_text(const tst_case *c, const char *label, char *buf, size_t len)
{
    if (label)
        snprintf(buf, len, "%s, T=%u %s", label, c->T, lmk_dtype_name(c->dtype));
    else
        snprintf(buf, len, "%s", c->name);
}

static void print_json_head(const bench_env *e, const tst_case *c, const char *label, bool first)
{
    printf("%s\n  {\"op\": ", first ? "" : ",");
    tool_json_string(stdout, c->op->name);
    printf(", \"case\": ");
    tool_json_string(stdout, c->name);
    if (label) {
        printf(", \"label\": ");
        tool_json_string(stdout, label);
    }
    printf(", \"backend\": \"%s\", \"dtype\": \"%s\", \"T\": %u", e->cuda ? "cuda" : "cpu",
           lmk_dtype_name(c->dtype), c->T);
}

/* A case the device cannot run (unsupported here, or out of memory): a row that says why. */
static void print_skip(const bench_env *e, const tst_case *c, const char *label, const char *why, bool json,
                       bool first)
{
    if (json) {
        print_json_head(e, c, label, first);
        printf(", \"skipped\": ");
        tool_json_string(stdout, why);
        putchar('}');
        return;
    }
    char text[TST_CASE_NAME + 64];
    case_text(c, label, text, sizeof text);
    printf("%-58s  %s\n    skipped: %s\n", "   skipped", text, why);
    fflush(stdout);
}

static void print_row(const bench_env *e, const tst_case *c, const char *label, const bench_result *r, bool json,
                      bool first)
{
    const double gbs = r->bytes / r->time_s / 1e9, ceil_gbs = r->ceiling_bps / 1e9;
    if (json) {
        print_json_head(e, c, label, first);
        printf(", \"time_us\": %.3f, \"bytes\": %.0f, "
               "\"gb_s\": %.2f, \"ceiling_gb_s\": %.2f, \"fraction\": %.3f, \"buffer_sets\": %d, "
               "\"in_cache\": %s, \"samples\": %d",
               r->time_s * 1e6, r->bytes, gbs, ceil_gbs, gbs / ceil_gbs, r->n_sets, r->in_cache ? "true" : "false",
               r->samples);
        if (r->host_s > 0)
            printf(", \"host_us\": %.3f", r->host_s * 1e6);
        if (e->threads > 0)
            printf(", \"threads\": %d", e->threads);
        if (r->memcpy_bps > 0)
            printf(", \"memcpy_gb_s\": %.3f, \"fraction_of_memcpy\": %.4f", r->memcpy_bps * 1e-9,
                   r->bytes / r->time_s / r->memcpy_bps);
        putchar('}');
        return;
    }
    char text[TST_CASE_NAME + 64];
    case_text(c, label, text, sizeof text);
    printf("%10.2f %8.1f %8.1f %8.2f", r->time_s * 1e6, gbs, ceil_gbs, gbs / ceil_gbs);
    if (e->cuda && r->host_s > 0)
        printf(" %9.2f", r->host_s * 1e6);
    else if (e->cuda)
        printf(" %9s", "");
    else
        printf(" %9.2f", r->bytes / r->time_s / r->memcpy_bps);
    printf(" %-8s  %s\n", r->in_cache ? "in cache" : "", text);
    fflush(stdout);
}

/* ---- the command ---- */

/* "1,4106,16384": 1 to MAX_T_LIST items, none empty, each an integer in [1, 2^20]. Parsed in
 * place (any length), so nothing is cut off. */
static int parse_T_list(const char *v, bench_opts *o)
{
    if (!*v)
        return tool_usage_error("--T needs at least one token count");
    o->n_T = 0;
    for (const char *item = v;;) {
        const char *comma = strchr(item, ',');
        const size_t len = comma ? (size_t)(comma - item) : strlen(item);
        if (len == 0)
            return tool_usage_error("bad value for --T: '%s' has an empty item (expected comma-separated integers "
                                    "such as 1,4106,16384)",
                                    v);
        if (o->n_T == MAX_T_LIST)
            return tool_usage_error("--T takes at most %d values ('%s' has more)", MAX_T_LIST, v);
        size_t skip = 0; /* leading zeros, so that any spelling of a number in range fits tok */
        while (skip + 1 < len && item[skip] == '0')
            skip++;
        char tok[32];
        uint64_t t;
        if (len - skip >= sizeof tok) /* longer than any integer in range: fail with the item as typed */
            return tool_usage_error("bad value for --T: '%.*s' (expected an integer in [1, %u])", (int)len, item,
                                    1u << 20);
        snprintf(tok, sizeof tok, "%.*s", (int)(len - skip), item + skip);
        if (tool_parse_u64("--T", tok, 1, 1u << 20, &t) < 0)
            return TOOL_EXIT_USAGE;
        o->T[o->n_T++] = (uint32_t)t;
        if (!comma)
            return 0;
        item = comma + 1;
    }
}

/* --variant NAME: the row (and its op, as --op), or "list". Parsed in place; --op may come before
 * or after, and must then name the row's op (parse_bench_opts). */
static int parse_variant(const char *v, bench_opts *o)
{
    if (strcmp(v, "list") == 0) {
        o->list_variants = true;
        return 0;
    }
    for (int i = 0; i < N_VARIANTS && !o->variant; i++)
        o->variant = strcmp(k_variants[i].name, v) == 0 ? &k_variants[i] : NULL;
    if (!o->variant)
        return tool_usage_error("unknown --variant '%s' (lmk bench --variant list prints the variants)", v);
    if (!o->variant->force)
        return tool_usage_error("--variant needs the CUDA backend; make CUDA=1 builds it");
    o->all = true;
    return 0;
}

static int parse_bench_opts(int argc, char **argv, bench_opts *o)
{
    static const char *const backends[] = {"cpu", "cuda"};
    static const char *const dtypes[] = {"f32", "bf16", "all"};
    *o = (bench_opts){.backend = LMK_BACKEND_AUTO, .dtype = 2, .T = {1, 4106, 16384}, .n_T = 3};
    for (int i = 2; i < argc; i++) {
        const char *v = NULL;
        uint64_t n;
        int r, c;
        if (tool_flag(argv, i, "--json")) {
            o->json = true;
        } else if (tool_flag(argv, i, "--all")) {
            o->all = true;
        } else if (tool_flag(argv, i, "--list")) {
            o->list = true;
        } else if ((r = tool_opt(argc, argv, &i, "--backend", &v)) != 0) {
            if (r < 0 || (c = tool_parse_choice("--backend", v, backends, 2)) < 0)
                return TOOL_EXIT_USAGE;
            o->backend = c == 0 ? LMK_BACKEND_CPU : LMK_BACKEND_CUDA;
        } else if ((r = tool_opt(argc, argv, &i, "--op", &v)) != 0) {
            if (r < 0 || tool_parse_op(v, &o->op) < 0)
                return TOOL_EXIT_USAGE;
            o->all = true;
        } else if ((r = tool_opt(argc, argv, &i, "--dtype", &v)) != 0) {
            if (r < 0 || (o->dtype = tool_parse_choice("--dtype", v, dtypes, 3)) < 0)
                return TOOL_EXIT_USAGE;
            o->all = true;
        } else if ((r = tool_opt(argc, argv, &i, "--T", &v)) != 0) {
            if (r < 0 || parse_T_list(v, o) != 0)
                return TOOL_EXIT_USAGE;
            o->all = true;
        } else if ((r = tool_opt(argc, argv, &i, "--threads", &v)) != 0) {
            if (r < 0 || tool_parse_u64("--threads", v, 1, 1024, &n) < 0)
                return TOOL_EXIT_USAGE;
            o->threads = (int)n;
        } else if ((r = tool_opt(argc, argv, &i, "--iters", &v)) != 0) {
            if (r < 0 || tool_parse_u64("--iters", v, 1, 100000, &n) < 0)
                return TOOL_EXIT_USAGE;
            o->iters = (int)n;
        } else if ((r = tool_opt(argc, argv, &i, "--variant", &v)) != 0) {
            if (r < 0 || parse_variant(v, o) != 0)
                return TOOL_EXIT_USAGE;
        } else {
            return tool_unknown_arg("bench", argv[i]);
        }
    }
    if (o->variant) { /* its op's cases, as --op */
        const tst_op *op = tst_op_find(o->variant->op);
        if (!op || (o->op && o->op != op))
            return tool_usage_error("--variant %s is a variant of %s, not of --op's op", o->variant->name,
                                    o->variant->op);
        o->op = op;
    }
    return 0;
}

/* Opens the device (with the thread count asked for) and a stream. */
static int open_env(const bench_opts *o, bench_env *e)
{
    lmk_status st = lmk_device_open(o->backend, 0, &e->dev);
    if (st != LMK_OK)
        return tool_lib_error(st, "cannot open the device");
    e->cuda = lmk_device_backend(e->dev) == LMK_BACKEND_CUDA;
    if (o->variant && !e->cuda)
        return tool_usage_error("--variant %s needs a CUDA device (--backend cuda)", o->variant->name);
    if (o->variant && (st = o->variant->force(o->variant->id)) != LMK_OK)
        return tool_lib_error(st, "cannot force the variant");
    if (o->threads && (st = lmk_device_set_threads(e->dev, o->threads)) != LMK_OK)
        return tool_lib_error(st, "cannot set the thread count");
    if ((st = lmk_stream_create(e->dev, &e->s)) != LMK_OK)
        return tool_lib_error(st, "cannot create a stream");
    e->threads = e->cuda ? 0 : lmk_device_threads(e->dev); /* what the stream's pool was made with */
    if (!e->cuda && !(e->pool = copy_pool_new(e->threads))) {
        fprintf(stderr, "lmk: cannot start %d threads for the copy ceiling\n", e->threads);
        return TOOL_EXIT_FAIL;
    }
    return 0;
}

/* Why the run is not on CUDA when the device was left to the tool; NULL when it is or was asked. */
static const char *no_cuda_reason(const bench_opts *o, const bench_env *e)
{
    if (e->cuda || o->backend != LMK_BACKEND_AUTO)
        return NULL;
#ifdef LMK_WITH_CUDA
    return "no GPU";
#else
    return "this build has no CUDA backend; make CUDA=1 builds it";
#endif
}

static void print_header(const bench_opts *o, const bench_env *e, int n_cases, int n_every)
{
    if (e->cuda)
        printf("# lmk bench on %s\n", lmk_device_name(e->dev));
    else
        printf("# lmk bench on %s, stream of %d thread%s\n", lmk_device_name(e->dev), e->threads,
               e->threads == 1 ? "" : "s");
    const char *no_cuda = no_cuda_reason(o, e);
    if (no_cuda)
        printf("# cuda: skipped: %s\n", no_cuda);
    if (o->variant)
        printf("# every %s call forced onto the variant %s (%s %s)\n", o->variant->op, o->variant->name,
               o->variant->kernel, o->variant->args);
    if (!o->all)
        printf("# %d headline cases (lmk bench --all: all %d cases, lmk bench --help: the options)\n", n_cases,
               n_every);
    if (e->cuda)
        printf("# GB/s: the bytes each op must move, per second; ceiling: GB/s of a device-to-device copy\n"
               "# of as many bytes; fraction: GB/s / ceiling; host us: enqueueing one call (docs/bench.md)\n");
    else
        printf("# GB/s: the bytes each op must move, per second; ceiling: GB/s of a copy of as many bytes on\n"
               "# as many threads (memcpy or streaming stores, the faster); fraction: GB/s / ceiling;\n"
               "# vs memcpy: GB/s / plain memcpy's (docs/bench.md)\n");
    printf("%10s %8s %8s %8s %9s %-8s  %s\n", "time us", "GB/s", "ceiling", "fraction",
           e->cuda ? "host us" : "vs memcpy", "note", "case");
}

int tool_bench(int argc, char **argv)
{
    bench_opts o;
    int rc = parse_bench_opts(argc, argv, &o);
    if (rc != 0 || o.list_variants) {
        if (rc == 0)
            print_variants();
        return rc;
    }
    tst_case *cases = calloc(MAX_CASES, sizeof *cases);
    const char **labels = calloc(MAX_CASES, sizeof *labels);
    if (!cases || !labels) {
        free(cases);
        free(labels);
        return tool_usage_error("out of host memory");
    }
    const int n_every = make_cases(&o, cases); /* the count --all would run */
    const int n_cases = o.all ? n_every : make_headline(cases, labels);
    if (n_cases < 0)
        rc = TOOL_EXIT_FAIL;
    if (o.list) {
        for (int i = 0; i < n_cases; i++) {
            if (labels[i])
                printf("%s, T=%u %s  =  ", labels[i], cases[i].T, lmk_dtype_name(cases[i].dtype));
            printf("%s\n", cases[i].name);
        }
        free(cases);
        free(labels);
        return rc;
    }

    bench_env e = {.seed = 0x1a2b3c4d5e6f7788ull};
    if (rc == 0)
        rc = open_env(&o, &e);
    if (rc == 0 && !o.json)
        print_header(&o, &e, n_cases, n_every);
    else if (rc == 0)
        putchar('[');
    const bool progress = isatty(STDERR_FILENO);
    const double t0 = tst_now();
    int n_skipped = 0;
    for (int i = 0; i < n_cases && rc == 0; i++) {
        if (progress)
            fprintf(stderr, "\r\033[K[%d/%d] %s", i + 1, n_cases, labels[i] ? labels[i] : cases[i].name);
        bench_result res;
        const lmk_status st = run_case(&e, &o, &cases[i], &res);
        if (progress)
            fprintf(stderr, "\r\033[K");
        /* A case this device cannot run, or that does not fit in its memory, is a limit of the
         * machine, not a fault: its row says so and the run goes on. */
        if (st == LMK_ERR_UNSUPPORTED || st == LMK_ERR_OUT_OF_MEMORY) {
            char why[300];
            snprintf(why, sizeof why, "%s: %s", lmk_status_name(st), lmk_last_error());
            print_skip(&e, &cases[i], labels[i], why, o.json, i == 0);
            n_skipped++;
        } else if (st != LMK_OK) {
            rc = tool_lib_error(st, cases[i].name);
        } else {
            print_row(&e, &cases[i], labels[i], &res, o.json, i == 0);
        }
    }
    if (o.json && rc == 0) {
        printf("\n]\n");
    } else if (rc == 0) {
        printf("# %d %scases in %.1f s", n_cases, o.all ? "" : "headline ", tst_now() - t0);
        if (n_skipped)
            printf(", %d skipped (above: why)", n_skipped);
        printf("\n");
    }

    copy_pool_free(e.pool);
    lmk_stream_destroy(e.s);
    lmk_device_close(e.dev);
    free(cases);
    free(labels);
    return rc;
}
