/*
 * test_threads.c - the threading contract of lmk.h: different threads may use different streams
 * of one device at the same time, and any thread may open and close its own devices.
 *
 *  1. Four threads share ONE device (per backend). Each creates its own stream and buffers and
 *     runs repeat_tiled, rope_multi and rope_multi_qk many times on fresh random inputs and shapes,
 *     verifying every result against the reference (bits for repeat, the precision contract for
 *     rope). Interleaved with them, deliberate failures with thread-specific values check that
 *     each thread reads back its own message.
 *  2. Four threads open, use and close their own devices at the same time, over and over.
 * Worker threads never touch the harness counters (they are not atomic): each records its counts
 * and first failure, and the main thread turns them into cases after joining.
 */
#include "common.h"

#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

HARNESS_DEFINE;

enum { N_THREADS = 4 };

typedef struct worker {
    lmk_device *dev;                 /* shared (part 1) or NULL (part 2: open your own) */
    lmk_backend backend;             /* part 2 */
    pthread_barrier_t *start;
    int id, iterations;
    uint64_t seed;
    int n_repeat, n_rope, n_qk, n_msg;
    int bad_repeat, bad_rope, bad_msg, bad_setup;
    char first[512];
} worker;

static void fail_once(worker *w, const char *fmt, ...) LMK_PRINTF(2, 3);
static void fail_once(worker *w, const char *fmt, ...)
{
    if (w->first[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->first, sizeof w->first, fmt, ap);
    va_end(ap);
}

/* A device buffer of n_bytes written from host (no harness calls: worker threads). */
static lmk_buffer *dev_buf(lmk_device *dev, lmk_dtype t, size_t n_bytes, const size_t *shape, int ndim,
                           const void *host)
{
    lmk_buffer *b = NULL;
    if (lmk_buffer_alloc(dev, n_bytes, t, shape, ndim, &b) != LMK_OK)
        return NULL;
    if (host && n_bytes && lmk_buffer_write(b, 0, host, n_bytes) != LMK_OK) {
        lmk_buffer_free(b);
        return NULL;
    }
    return b;
}

static const lmk_dtype k_all[] = {LMK_U8, LMK_U16, LMK_BF16, LMK_F16, LMK_F32, LMK_I32, LMK_U32};
static const lmk_dtype k_float[] = {LMK_F32, LMK_BF16, LMK_F16};

static void one_repeat(worker *w, lmk_device *dev, lmk_stream *s, tst_rng *r)
{
    static const uint32_t hgs[] = {1, 2, 4, 16}, ks[] = {1, 3, 64, 128};
    lmk_repeat_tiled_params q = {.seq = 1 + tst_rng_below(r, 48), .hg = hgs[tst_rng_below(r, 4)],
                                 .k = ks[tst_rng_below(r, 4)]};
    q.h = q.hg * (1 + tst_rng_below(r, 4));
    const lmk_dtype t = k_all[tst_rng_below(r, 7)];
    const size_t es = lmk_dtype_size(t), sn = (size_t)q.seq * q.hg * q.k * es, dn = (size_t)q.seq * q.h * q.k * es;
    unsigned char *src = malloc(sn), *want = malloc(dn + TST_GUARD), *got = malloc(dn + TST_GUARD);
    lmk_buffer *bs = NULL, *bd = NULL;
    w->n_repeat++;
    if (!src || !want || !got) {
        w->bad_setup++;
        goto done;
    }
    tst_fill_bytes(r, src, sn);
    tst_poison(want, dn + TST_GUARD, TST_POISON);
    bs = dev_buf(dev, t, sn, NULL, 0, src);
    bd = dev_buf(dev, t, dn + TST_GUARD, NULL, 0, want);
    if (!bs || !bd) {
        w->bad_setup++;
        fail_once(w, "thread %d: repeat buffers: %s", w->id, lmk_last_error());
        goto done;
    }
    lmk_status st = lmk_repeat_tiled(s, bs, bd, &q);
    if (st == LMK_OK)
        st = lmk_stream_sync(s);
    if (st == LMK_OK)
        st = lmk_buffer_read(bd, 0, got, dn + TST_GUARD);
    const lmk_repeat_args a = tst_repeat_host_args(src, want, q.seq, q.hg, q.h, q.k, es);
    lmk_ref_repeat(&a);
    if (st != LMK_OK || memcmp(got, want, dn + TST_GUARD) != 0) {
        w->bad_repeat++;
        char name[160];
        fail_once(w, "thread %d: %s: %s %s", w->id, tst_repeat_name(name, sizeof name, &q, t, NULL),
                  lmk_status_name(st), st == LMK_OK ? "output (or guard) differs from the reference" : lmk_last_error());
    }
done:
    lmk_buffer_free(bs);
    lmk_buffer_free(bd);
    free(src);
    free(want);
    free(got);
}

static void one_rope(worker *w, lmk_device *dev, lmk_stream *s, tst_rng *r)
{
    const tst_attn_shape *sh = &tst_attn_shapes[tst_rng_below(r, (uint32_t)tst_attn_shape_count)];
    const bool qk = tst_rng_below(r, 3) == 0, in_place = tst_rng_below(r, 2) == 0;
    lmk_rope_multi_params p = {.head_dim = sh->head_dim, .rope_dim = sh->rope_dim,
                               .n_heads = 1 + tst_rng_below(r, sh->n_q_heads), .seq_len = 1 + tst_rng_below(r, 12),
                               .freq_base = sh->freq_base, .mode = sh->mode,
                               .pairing = (lmk_rope_pairing)tst_rng_below(r, 2)};
    memcpy(p.sections, sh->sections, sizeof p.sections);
    const uint32_t nk = qk ? 1 + tst_rng_below(r, sh->n_k_heads) : 0;
    const uint32_t heads[2] = {p.n_heads, nk};
    const int n_t = qk ? 2 : 1;
    const lmk_dtype t = k_float[tst_rng_below(r, 3)];
    const size_t es = lmk_dtype_size(t);
    void *in[2] = {NULL, NULL}, *got[2] = {NULL, NULL};
    lmk_buffer *bi[2] = {NULL, NULL}, *bo[2] = {NULL, NULL}, *bp = NULL;
    int32_t *pos = malloc(16 * (size_t)p.seq_len);
    bool ok = pos != NULL;
    if (qk)
        w->n_qk++;
    else
        w->n_rope++;
    for (int i = 0; i < n_t && ok; i++) {
        const size_t n = (size_t)p.seq_len * heads[i] * p.head_dim;
        in[i] = malloc(n * es);
        got[i] = malloc(n * es);
        ok = in[i] && got[i];
        if (ok) {
            tst_fill_float(r, t, in[i], n, -2, 2);
            const size_t shape[3] = {p.seq_len, heads[i], p.head_dim};
            bi[i] = dev_buf(dev, t, n * es, shape, 3, in[i]);
            bo[i] = in_place ? bi[i] : dev_buf(dev, t, n * es, shape, 3, NULL);
            ok = bi[i] && bo[i];
        }
    }
    if (!ok) {
        w->bad_setup++;
        fail_once(w, "thread %d: rope setup: %s", w->id, lmk_last_error());
        goto done;
    }
    tst_positions_random(r, pos, p.seq_len, 0, 262143);
    const size_t pshape[1] = {4 * (size_t)p.seq_len};
    bp = dev_buf(dev, LMK_I32, 16 * (size_t)p.seq_len, pshape, 1, pos);
    if (!bp) {
        w->bad_setup++;
        goto done;
    }
    lmk_status st = qk ? lmk_rope_multi_qk(s, bi[0], bo[0], bi[1], bo[1], bp, &p, nk)
                       : lmk_rope_multi(s, bi[0], bo[0], bp, &p);
    if (st == LMK_OK)
        st = lmk_stream_sync(s);
    for (int i = 0; i < n_t && st == LMK_OK; i++)
        st = lmk_buffer_read(bo[i], 0, got[i], (size_t)p.seq_len * heads[i] * p.head_dim * es);
    char msg[512] = "";
    bool good = st == LMK_OK;
    if (good) {
        const lmk_rope_args a = tst_rope_host_args(&p, heads[n_t > 1 ? 1 : 0], n_t, t, in[0], in[n_t > 1 ? 1 : 0], pos);
        const void *const g[2] = {got[0], got[1]};
        good = tst_rope_check(&a, g, 1e-5, msg, sizeof msg);
    }
    if (!good) {
        w->bad_rope++;
        char name[200];
        fail_once(w, "thread %d: %s%s: %s %s %s", w->id,
                  tst_rope_name(name, sizeof name, qk ? "rope_multi_qk" : "rope_multi", &p, t, NULL),
                  in_place ? " inplace" : "", lmk_status_name(st), st == LMK_OK ? "" : lmk_last_error(), msg);
    }
done:
    for (int i = 0; i < 2; i++) {
        if (bo[i] != bi[i])
            lmk_buffer_free(bo[i]);
        lmk_buffer_free(bi[i]);
        free(in[i]);
        free(got[i]);
    }
    lmk_buffer_free(bp);
    free(pos);
}

/* A failure with values only this thread and iteration use; the message must be this one. */
static void one_message(worker *w, lmk_stream *s, int iter)
{
    const uint32_t h = 3u * (100000u + (uint32_t)w->id * 10000u + (uint32_t)iter) + 1u; /* not a multiple of 3 */
    const lmk_repeat_tiled_params p = {.seq = 1, .hg = 3, .h = h, .k = 1};
    char want[64];
    snprintf(want, sizeof want, "h (%u) must be a multiple of hg (3)", h);
    lmk_buffer *b = NULL;
    w->n_msg++;
    if (lmk_buffer_alloc(lmk_stream_device(s), 16, LMK_U8, NULL, 0, &b) != LMK_OK) {
        w->bad_setup++;
        return;
    }
    const lmk_status st = lmk_repeat_tiled(s, b, b, &p);
    /* Let the other threads run (and fail) before reading the message back. */
    sched_yield();
    if (st != LMK_ERR_INVALID_ARGUMENT || !strstr(lmk_last_error(), want)) {
        w->bad_msg++;
        fail_once(w, "thread %d: message \"%s\", want \"%s\" (%s)", w->id, lmk_last_error(), want,
                  lmk_status_name(st));
    }
    lmk_buffer_free(b);
}

static void *shared_device_main(void *arg)
{
    worker *w = arg;
    tst_rng r = tst_rng_make(w->seed);
    lmk_stream *s = NULL;
    if (lmk_stream_create(w->dev, &s) != LMK_OK) {
        w->bad_setup++;
        fail_once(w, "thread %d: stream: %s", w->id, lmk_last_error());
        pthread_barrier_wait(w->start);
        return NULL;
    }
    pthread_barrier_wait(w->start);
    for (int it = 0; it < w->iterations; it++) {
        one_repeat(w, w->dev, s, &r);
        one_rope(w, w->dev, s, &r);
        one_message(w, s, it);
    }
    lmk_stream_destroy(s);
    return NULL;
}

static void *own_device_main(void *arg)
{
    worker *w = arg;
    tst_rng r = tst_rng_make(w->seed);
    pthread_barrier_wait(w->start);
    for (int it = 0; it < w->iterations; it++) {
        lmk_device *dev = NULL;
        lmk_stream *s = NULL;
        if (lmk_device_open(w->backend, 0, &dev) != LMK_OK || lmk_stream_create(dev, &s) != LMK_OK) {
            w->bad_setup++;
            fail_once(w, "thread %d: open backend %d: %s", w->id, (int)w->backend, lmk_last_error());
            lmk_device_close(dev);
            continue;
        }
        if (it % 2 == 0)
            one_repeat(w, dev, s, &r);
        else
            one_rope(w, dev, s, &r);
        lmk_stream_destroy(s);
        lmk_device_close(dev);
    }
    return NULL;
}

static void report(const worker *w, int n, const char *what)
{
    for (int i = 0; i < n; i++) {
        const worker *x = &w[i];
        CHECK(x->bad_setup == 0 && x->bad_repeat == 0 && x->bad_rope == 0 && x->bad_msg == 0,
              "%s, thread %d (seed 0x%016" PRIx64 "): %d/%d repeat, %d/%d rope (+qk) wrong, %d/%d messages wrong, "
              "%d setup failures; first: %s",
              what, x->id, x->seed, x->bad_repeat, x->n_repeat, x->bad_rope, x->n_rope + x->n_qk, x->bad_msg, x->n_msg,
              x->bad_setup, x->first);
    }
    int calls = 0;
    for (int i = 0; i < n; i++)
        calls += w[i].n_repeat + w[i].n_rope + w[i].n_qk + w[i].n_msg;
    CHECK(calls > 0, "%s: no calls were made", what);
    printf("%s: %d threads, %d calls, all verified\n", what, n, calls);
}

static void run_shared(lmk_backend backend, const char *bname, int iterations)
{
    lmk_device *dev = NULL;
    if (!CHECK(lmk_device_open(backend, 0, &dev) == LMK_OK, "open %s: %s", bname, lmk_last_error()))
        return;
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, N_THREADS);
    worker w[N_THREADS];
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i] = (worker){.dev = dev, .start = &bar, .id = i, .iterations = iterations, .seed = tst_case_seed()};
        pthread_create(&th[i], NULL, shared_device_main, &w[i]);
    }
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    char what[96];
    snprintf(what, sizeof what, "[%s] one shared device, a stream per thread", bname);
    report(w, N_THREADS, what);
    lmk_device_close(dev);
}

static void run_own(int iterations)
{
    const int n_cuda = lmk_device_count(LMK_BACKEND_CUDA);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, N_THREADS);
    worker w[N_THREADS];
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        w[i] = (worker){.backend = (i % 2 && n_cuda > 0) ? LMK_BACKEND_CUDA : (i % 2 ? LMK_BACKEND_AUTO : LMK_BACKEND_CPU),
                        .start = &bar, .id = i, .iterations = iterations, .seed = tst_case_seed()};
        pthread_create(&th[i], NULL, own_device_main, &w[i]);
    }
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    report(w, N_THREADS, n_cuda > 0 ? "devices opened and closed per thread (cpu and cuda)"
                                    : "devices opened and closed per thread (cpu, auto)");
}

int main(void)
{
    tst_program_seed();
    const double t0 = tst_now();
    const int iterations = tst_quick() ? 25 : 150;
    run_shared(LMK_BACKEND_CPU, "cpu", iterations);
    if (lmk_device_count(LMK_BACKEND_CUDA) > 0)
        run_shared(LMK_BACKEND_CUDA, "cuda:0", iterations);
    else
        SKIP("cuda: lmk_device_count(LMK_BACKEND_CUDA) is 0 (no usable GPU); CUDA cases not run");
    run_own(tst_quick() ? 10 : 40);
    printf("test_threads: %.2f s\n", tst_now() - t0);
    return harness_summary();
}
