/*
 * test_stress.c - many threads, each with its own streams on shared devices, running random ops.
 *
 * LMK_STRESS_THREADS threads (default 8, on however few cores the machine has) share one device of
 * every backend available (the CPU always, CUDA when usable). Each thread makes two streams on
 * every device and, until the time runs out (LMK_STRESS_SECONDS, default 3 s, 1 s with
 * LMK_TEST_QUICK), runs random calls on a random stream: repeat_tiled of every dtype, rope_multi
 * out of place and in place, rope_multi_qk, at random valid shapes (one call in eight large enough
 * for the CPU worker pool to split it), each with freshly allocated buffers. Every result is
 * checked against the float64 reference (repeat bit for bit, rope within SPEC.md's tolerance, copied
 * elements bit-exact) and the guard bytes after every output must be intact. One call in ten is
 * invalid (h not a multiple of hg, odd head_dim, partial overlap, wrong positions length): it must
 * return LMK_ERR_INVALID_ARGUMENT with this thread's own message (the values in it are unique to
 * the thread, so a message clobbered by another thread is caught) and leave every byte as it was.
 *
 * One more thread keeps changing the CPU device's thread count (lmk_device_set_threads) while the
 * others create streams on it: under TSan this is the check for the data race of fuzz/FINDINGS.md
 * #1, now fixed (LMK_STRESS_SET_THREADS=0 turns it off).
 *
 * Worker threads never call CHECK (the harness counters are not atomic): they count their calls
 * and failures and the main thread checks the totals. Under `make test-tsan` this is the test
 * that makes ThreadSanitizer look at every shared path of the library.
 */
#include "common.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

HARNESS_DEFINE;

#define STREAMS_PER_DEV 2

typedef struct worker {
    int id;
    uint64_t seed;
    tst_dev *devs;
    int n_devs;
    double deadline;
    long calls, repeat, rope, in_place, qk, invalid, big, failures;
    char failure[512]; /* the first */
} worker;

static void fail(worker *w, const char *dev, const char *fmt, ...) LMK_PRINTF(3, 4);
static void fail(worker *w, const char *dev, const char *fmt, ...)
{
    if (w->failures++ == 0) {
        const int n = snprintf(w->failure, sizeof w->failure, "thread %d on %s: ", w->id, dev);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->failure + n, sizeof w->failure - (size_t)n, fmt, ap);
        va_end(ap);
    }
}

/* A buffer of `used` bytes plus TST_GUARD poisoned guard bytes; `init` (may be NULL: poison)
 * fills the used part. */
static lmk_buffer *make(lmk_device *dev, lmk_dtype t, size_t used, const void *init)
{
    lmk_buffer *b = NULL;
    const size_t shape[1] = {used / lmk_dtype_size(t)};
    if (lmk_buffer_alloc(dev, used + TST_GUARD, t, shape, 1, &b) != LMK_OK)
        return NULL;
    unsigned char *tmp = malloc(used + TST_GUARD);
    if (!tmp) {
        lmk_buffer_free(b);
        return NULL;
    }
    if (init)
        memcpy(tmp, init, used);
    else
        memset(tmp, TST_POISON, used);
    memset(tmp + used, TST_POISON, TST_GUARD);
    const lmk_status st = lmk_buffer_write(b, 0, tmp, used + TST_GUARD);
    free(tmp);
    if (st != LMK_OK) {
        lmk_buffer_free(b);
        return NULL;
    }
    return b;
}

static bool guard_ok(const unsigned char *all, size_t used)
{
    return tst_find_not(all, used, used + TST_GUARD, TST_POISON) < 0;
}

static void do_repeat(worker *w, tst_dev *d, lmk_stream *s, tst_rng *r)
{
    static const lmk_dtype dtypes[] = {LMK_F32, LMK_F16, LMK_BF16, LMK_U8, LMK_U16, LMK_U32, LMK_I32};
    static const uint32_t hgs[] = {1, 2, 4, 16}, ks[] = {1, 3, 8, 64, 128};
    const lmk_dtype t = dtypes[tst_rng_below(r, 7)];
    const size_t es = lmk_dtype_size(t);
    const bool big = tst_rng_below(r, 8) == 0;
    lmk_repeat_tiled_params p;
    p.hg = hgs[tst_rng_below(r, 4)];
    p.h = p.hg * (1 + tst_rng_below(r, 4));
    p.k = big ? 128 : ks[tst_rng_below(r, 5)];
    p.seq = big ? 16 + tst_rng_below(r, 32) : 1 + tst_rng_below(r, 16);
    const size_t src_bytes = (size_t)p.seq * p.hg * p.k * es, dst_bytes = (size_t)p.seq * p.h * p.k * es;
    unsigned char *src = malloc(src_bytes), *want = malloc(dst_bytes + TST_GUARD), *got = NULL;
    lmk_buffer *bs = NULL, *bd = NULL;
    if (!src || !want) {
        fail(w, d->name, "out of host memory");
        goto done;
    }
    tst_fill_bytes(r, src, src_bytes);
    bs = make(d->dev, t, src_bytes, src);
    bd = make(d->dev, t, dst_bytes, NULL);
    if (!bs || !bd) {
        fail(w, d->name, "repeat_tiled: buffers: %s", lmk_last_error());
        goto done;
    }
    lmk_status st = lmk_repeat_tiled(s, bs, bd, &p);
    if (st == LMK_OK)
        st = lmk_stream_sync(s);
    got = tst_read_all(bd);
    if (st != LMK_OK || !got) {
        fail(w, d->name, "repeat_tiled(seq %u, hg %u, h %u, k %u, %s): %s %s", p.seq, p.hg, p.h, p.k,
             lmk_dtype_name(t), lmk_status_name(st), lmk_last_error());
        goto done;
    }
    memset(want + dst_bytes, TST_POISON, TST_GUARD);
    const lmk_repeat_args a = tst_repeat_host_args(src, want, p.seq, p.hg, p.h, p.k, es);
    lmk_ref_repeat(&a);
    const long long diff = tst_bits_diff(want, got, dst_bytes + TST_GUARD);
    if (diff >= 0)
        fail(w, d->name, "repeat_tiled(seq %u, hg %u, h %u, k %u, %s): byte %lld differs from the reference%s", p.seq,
             p.hg, p.h, p.k, lmk_dtype_name(t), diff, (size_t)diff >= dst_bytes ? " (a guard byte)" : "");
    w->repeat++;
    w->big += big;
done:
    lmk_buffer_free(bs);
    lmk_buffer_free(bd);
    free(src);
    free(want);
    free(got);
}

/* kind 0: rope_multi out of place; 1: in place; 2: rope_multi_qk (q and k each maybe in place). */
static void do_rope(worker *w, tst_dev *d, lmk_stream *s, tst_rng *r, int kind)
{
    static const lmk_dtype dtypes[] = {LMK_F32, LMK_BF16, LMK_F16};
    static const float bases[] = {1e4f, 1e6f, 1e7f, 5e6f, 2.0f};
    static const uint32_t hds[] = {64, 128, 256};
    const lmk_dtype t = dtypes[tst_rng_below(r, 3)];
    const size_t es = lmk_dtype_size(t);
    const bool big = tst_rng_below(r, 8) == 0;
    lmk_rope_multi_params p = {0};
    uint32_t nk = 1 + tst_rng_below(r, 4);
    if (big) {
        p.head_dim = 256, p.rope_dim = 64, p.n_heads = 16, p.seq_len = 16 + tst_rng_below(r, 16);
        nk = 2;
    } else {
        p.head_dim = tst_rng_below(r, 2) ? hds[tst_rng_below(r, 3)] : 2 * (1 + tst_rng_below(r, 64));
        p.rope_dim = tst_rng_below(r, 3) == 0 ? p.head_dim : 2 * (1 + tst_rng_below(r, p.head_dim / 2));
        p.n_heads = 1 + tst_rng_below(r, 8);
        p.seq_len = 1 + tst_rng_below(r, 8);
    }
    p.freq_base = bases[tst_rng_below(r, 5)];
    p.mode = tst_rng_below(r, 2) ? LMK_ROPE_IMROPE : LMK_ROPE_MROPE;
    for (int i = 0; i < 4; i++)
        p.sections[i] = tst_rng_below(r, 24);
    p.pairing = tst_rng_below(r, 2) ? LMK_ROPE_PAIR_HALF_ROPE : LMK_ROPE_PAIR_HALF_HEAD;
    const bool qk = kind == 2;
    const bool q_in_place = kind == 1 || (qk && tst_rng_below(r, 2)), k_in_place = qk && tst_rng_below(r, 2);

    const size_t nq_bytes = (size_t)p.seq_len * p.n_heads * p.head_dim * es;
    const size_t nk_bytes = (size_t)p.seq_len * nk * p.head_dim * es;
    const size_t pos_bytes = 4 * (size_t)p.seq_len * sizeof(int32_t);
    void *q = malloc(nq_bytes), *k = malloc(nk_bytes);
    int32_t *pos = malloc(pos_bytes);
    void *got[2] = {NULL, NULL};
    lmk_buffer *bq = NULL, *bq_out = NULL, *bk = NULL, *bk_out = NULL, *bpos = NULL;
    if (!q || !k || !pos) {
        fail(w, d->name, "out of host memory");
        goto done;
    }
    tst_fill_float(r, t, q, nq_bytes / es, -2, 2);
    tst_fill_float(r, t, k, nk_bytes / es, -2, 2);
    if (tst_rng_below(r, 2))
        tst_positions_text(pos, p.seq_len, (int32_t)tst_rng_below(r, 1u << 20));
    else
        tst_positions_random(r, pos, p.seq_len, -(1 << 20), 1 << 20);
    bq = make(d->dev, t, nq_bytes, q);
    bq_out = q_in_place ? bq : make(d->dev, t, nq_bytes, NULL);
    bpos = make(d->dev, LMK_I32, pos_bytes, pos);
    if (qk) {
        bk = make(d->dev, t, nk_bytes, k);
        bk_out = k_in_place ? bk : make(d->dev, t, nk_bytes, NULL);
    }
    /* make() shapes are 1-D [used / es]; rope_multi checks element counts only. */
    if (!bq || !bq_out || !bpos || (qk && (!bk || !bk_out))) {
        fail(w, d->name, "rope_multi: buffers: %s", lmk_last_error());
        goto done;
    }
    lmk_status st = qk ? lmk_rope_multi_qk(s, bq, bq_out, bk, bk_out, bpos, &p, nk)
                       : lmk_rope_multi(s, bq, bq_out, bpos, &p);
    if (st == LMK_OK)
        st = lmk_stream_sync(s);
    char name[200];
    tst_rope_name(name, sizeof name, qk ? "rope_multi_qk" : "rope_multi", &p, t, q_in_place ? "in place" : NULL);
    got[0] = tst_read_all(bq_out);
    if (qk)
        got[1] = tst_read_all(bk_out);
    if (st != LMK_OK || !got[0] || (qk && !got[1])) {
        fail(w, d->name, "%s: %s %s", name, lmk_status_name(st), lmk_last_error());
        goto done;
    }
    const lmk_rope_args a = tst_rope_host_args(&p, nk, qk ? 2 : 1, t, q, k, pos);
    char msg[256];
    const void *g2[2] = {got[0], got[1]};
    if (!tst_rope_check(&a, g2, 1e-5, msg, sizeof msg))
        fail(w, d->name, "%s: %s", name, msg);
    else if (!guard_ok(got[0], nq_bytes) || (qk && !guard_ok(got[1], nk_bytes)))
        fail(w, d->name, "%s: a guard byte after the output changed", name);
    if (qk)
        w->qk++;
    else if (q_in_place)
        w->in_place++;
    else
        w->rope++;
    w->big += big;
done:
    lmk_buffer_free(bq);
    if (bq_out != bq)
        lmk_buffer_free(bq_out);
    lmk_buffer_free(bk);
    if (bk_out != bk)
        lmk_buffer_free(bk_out);
    lmk_buffer_free(bpos);
    free(q);
    free(k);
    free(pos);
    free(got[0]);
    free(got[1]);
}

/* An invalid call with values unique to this thread; it must fail cleanly and change nothing. */
static void do_invalid(worker *w, tst_dev *d, lmk_stream *s, tst_rng *r)
{
    const unsigned which = tst_rng_below(r, 4);
    const uint32_t u = 1000 + 2 * (uint32_t)w->id; /* even, unique per thread */
    unsigned char *before = NULL, *after = NULL;
    lmk_buffer *parent = NULL, *in = NULL, *out = NULL, *pos = NULL;
    const size_t bytes = 4096 * 4;
    lmk_status st = LMK_OK;
    char want[128] = "";
    before = malloc(bytes);
    if (!before) {
        fail(w, d->name, "out of host memory");
        return;
    }
    tst_fill_bytes(r, before, bytes);
    if (lmk_buffer_alloc(d->dev, bytes, LMK_F32, NULL, 0, &parent) != LMK_OK ||
        lmk_buffer_write(parent, 0, before, bytes) != LMK_OK) {
        fail(w, d->name, "invalid call setup: %s", lmk_last_error());
        goto done;
    }
    lmk_clear_error();
    if (which == 0) { /* repeat_tiled: h not a multiple of hg */
        const lmk_repeat_tiled_params p = {.seq = 1, .hg = u, .h = u + 1, .k = 1};
        const size_t s1[1] = {u}, s2[1] = {u + 1};
        if (lmk_buffer_view(parent, 0, LMK_F32, s1, 1, &in) == LMK_OK &&
            lmk_buffer_view(parent, 8192, LMK_F32, s2, 1, &out) == LMK_OK)
            st = lmk_repeat_tiled(s, in, out, &p);
        snprintf(want, sizeof want, "h (%u) must be a multiple of hg (%u)", u + 1, u);
    } else {
        lmk_rope_multi_params p = {.head_dim = 16, .rope_dim = 8, .n_heads = 2, .seq_len = 4, .freq_base = 1e4f,
                                   .mode = LMK_ROPE_IMROPE, .sections = {2, 1, 1, 0}};
        size_t n_elems = 4 * 2 * 16, n_pos = 16, out_off = 2048;
        if (which == 1) { /* odd head_dim, unique to the thread */
            p.head_dim = u + 1;
            p.rope_dim = 2;
            p.n_heads = 1;
            p.seq_len = 1;
            n_elems = p.head_dim;
            n_pos = 4;
            out_off = 8192;
            snprintf(want, sizeof want, "%u", u + 1);
        } else if (which == 2) { /* output overlaps the input partially */
            out_off = 4;
            snprintf(want, sizeof want, "overlap");
        } else { /* positions of the wrong length */
            p.seq_len = 4;
            n_pos = 15;
            snprintf(want, sizeof want, "%zu", n_pos);
        }
        const size_t s_in[1] = {n_elems}, s_pos[1] = {n_pos};
        if (lmk_buffer_view(parent, 0, LMK_F32, s_in, 1, &in) == LMK_OK &&
            lmk_buffer_view(parent, out_off, LMK_F32, s_in, 1, &out) == LMK_OK &&
            lmk_buffer_view(parent, 16384 - 64, LMK_I32, s_pos, 1, &pos) == LMK_OK)
            st = lmk_rope_multi(s, in, out, pos, &p);
        else
            st = LMK_ERR_DEVICE;
    }
    const char *op = which == 0 ? "repeat_tiled" : "rope_multi";
    if (st != LMK_ERR_INVALID_ARGUMENT)
        fail(w, d->name, "invalid %s (case %u) returned %s (%s)", op, which, lmk_status_name(st), lmk_last_error());
    else if (!tst_msg_has(op, want, (const char *)NULL))
        fail(w, d->name, "invalid %s (case %u): this thread's message \"%s\" lacks \"%s\"", op, which, lmk_last_error(),
             want);
    if (lmk_stream_sync(s) != LMK_OK)
        fail(w, d->name, "sync after an invalid call: %s", lmk_last_error());
    after = tst_read_all(parent);
    if (!after || memcmp(before, after, bytes) != 0)
        fail(w, d->name, "invalid %s (case %u) changed a byte", op, which);
    w->invalid++;
done:
    lmk_buffer_free(in);
    lmk_buffer_free(out);
    lmk_buffer_free(pos);
    lmk_buffer_free(parent);
    free(before);
    free(after);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    tst_rng r = tst_rng_make(w->seed);
    lmk_stream *streams[TST_MAX_DEVS][STREAMS_PER_DEV] = {{NULL}};
    for (int i = 0; i < w->n_devs; i++)
        for (int j = 0; j < STREAMS_PER_DEV; j++)
            if (lmk_stream_create(w->devs[i].dev, &streams[i][j]) != LMK_OK) {
                fail(w, w->devs[i].name, "lmk_stream_create: %s", lmk_last_error());
                goto done;
            }
    while (tst_now() < w->deadline) {
        const int di = (int)tst_rng_below(&r, (uint32_t)w->n_devs);
        tst_dev *d = &w->devs[di];
        lmk_stream *s = streams[di][tst_rng_below(&r, STREAMS_PER_DEV)];
        const unsigned op = tst_rng_below(&r, 10);
        if (op < 3)
            do_repeat(w, d, s, &r);
        else if (op < 6)
            do_rope(w, d, s, &r, 0);
        else if (op < 7)
            do_rope(w, d, s, &r, 1);
        else if (op < 9)
            do_rope(w, d, s, &r, 2);
        else
            do_invalid(w, d, s, &r);
        w->calls++;
    }
done:
    for (int i = 0; i < w->n_devs; i++)
        for (int j = 0; j < STREAMS_PER_DEV; j++)
            lmk_stream_destroy(streams[i][j]);
    return NULL;
}

typedef struct toggler {
    lmk_device *dev;
    double deadline;
    long calls;
} toggler;

static void *toggler_main(void *arg)
{
    toggler *t = arg;
    while (tst_now() < t->deadline) {
        lmk_device_set_threads(t->dev, 1 + (int)(t->calls++ % 3));
        sched_yield();
    }
    lmk_device_set_threads(t->dev, 2);
    return NULL;
}

static long env_long(const char *name, long def)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : def;
}

int main(void)
{
    const char *secs_env = getenv("LMK_STRESS_SECONDS");
    const double seconds = secs_env && *secs_env ? atof(secs_env) : tst_quick() ? 1.0 : 3.0;
    long n_threads = env_long("LMK_STRESS_THREADS", 8);
    if (n_threads < 1 || n_threads > 256)
        n_threads = 8;

    tst_dev devs[TST_MAX_DEVS];
    const int n_devs = tst_devs_open(devs);
    if (n_devs == 0)
        return harness_summary();
    char names[TST_MAX_DEVS * 40] = "";
    for (int i = 0; i < n_devs; i++) {
        if (devs[i].backend == LMK_BACKEND_CPU)
            lmk_device_set_threads(devs[i].dev, 2); /* every stream has a worker pool to share work with */
        if (i)
            strcat(names, ", ");
        strcat(names, devs[i].backend == LMK_BACKEND_CPU ? "cpu" : "cuda:0");
    }

    worker *ws = calloc((size_t)n_threads, sizeof *ws);
    pthread_t *th = calloc((size_t)n_threads, sizeof *th);
    if (!TST_REQUIRE(ws && th, "out of host memory"))
        return harness_summary();
    const double t0 = tst_now();
    int started = 0;
    for (long i = 0; i < n_threads; i++) {
        ws[i] = (worker){.id = (int)i, .seed = tst_case_seed(), .devs = devs, .n_devs = n_devs,
                         .deadline = t0 + seconds};
        if (pthread_create(&th[i], NULL, worker_main, &ws[i]) != 0) {
            TST_FAIL("pthread_create for thread %ld", i);
            break;
        }
        started++;
    }
    toggler tog = {.dev = devs[0].dev, .deadline = t0 + seconds};
    pthread_t tog_thread;
    const bool toggling = env_long("LMK_STRESS_SET_THREADS", 1) > 0 && devs[0].backend == LMK_BACKEND_CPU &&
                          pthread_create(&tog_thread, NULL, toggler_main, &tog) == 0;
    worker sum = {0};
    const char *first = NULL;
    long idle = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        sum.calls += ws[i].calls;
        sum.repeat += ws[i].repeat;
        sum.rope += ws[i].rope;
        sum.in_place += ws[i].in_place;
        sum.qk += ws[i].qk;
        sum.invalid += ws[i].invalid;
        sum.big += ws[i].big;
        sum.failures += ws[i].failures;
        idle += ws[i].calls == 0;
        if (ws[i].failures && !first)
            first = ws[i].failure;
    }
    if (toggling) {
        pthread_join(tog_thread, NULL);
        printf("stress: lmk_device_set_threads called %ld times meanwhile\n", tog.calls);
    }
    const double took = tst_now() - t0;
    printf("stress: %d threads x %d streams on each of [%s], %.1f s: %ld calls (repeat %ld, rope %ld, in place %ld, "
           "qk %ld, invalid %ld; %ld large), %ld failures\n",
           started, STREAMS_PER_DEV, names, took, sum.calls, sum.repeat, sum.rope, sum.in_place, sum.qk, sum.invalid,
           sum.big, sum.failures);
    CHECK(sum.failures == 0, "%ld of %ld calls failed; the first: %s", sum.failures, sum.calls, first ? first : "");
    CHECK(started == n_threads && idle == 0, "%ld of %d threads made no call", idle, started);
    free(ws);
    free(th);
    tst_devs_close(devs, n_devs);
    return harness_summary();
}
