/*
 * test_stress.c - many threads, each with its own streams on shared devices, running random cases
 * of every op for a time budget.
 *
 * Scope, next to test_threads.c: this test is load and randomness (random cases of every op,
 * invalid calls mixed in, two streams per thread, the device's thread count changing meanwhile,
 * for a time budget); test_threads is deterministic coverage of the threading contract (every
 * contract case from every thread, per-thread messages, devices opened and closed per thread).
 *
 * LMK_STRESS_THREADS threads (default 8, on however few cores the machine has) share one device of
 * every backend available (the CPU always, CUDA when usable). Each thread makes two streams on
 * every device and, until the time runs out (LMK_STRESS_SECONDS, default 3 s, 1 s with
 * LMK_TEST_QUICK), picks an op of the registry (tst_ops) and a random valid case of it (its
 * descriptor's random_case: every mode, layout and dtype it has, one case in eight large enough
 * for the CPU worker pool, for rope and attn_prologue a prompt long enough for CUDA's prefill
 * kernels), makes it on a random stream with fresh buffers, runs it and verifies
 * it against the float64 reference, and every byte around its outputs. One call in ten is one of
 * the calls the op must reject: it must return LMK_ERR_INVALID_ARGUMENT with a message naming the
 * op and change no byte.
 *
 * One more thread keeps changing the CPU device's thread count (lmk_device_set_threads) while the
 * others create streams on it: under TSan this is the check that keeps the data race of
 * fuzz/FINDINGS.md #1 fixed (LMK_STRESS_SET_THREADS=0 turns it off).
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
    long calls, per_op[16], invalid, unsupported, failures;
    char failure[768]; /* the first */
    double failed_at;  /* when (tst_now) */
} worker;

static void fail(worker *w, const char *dev, const char *fmt, ...) LMK_PRINTF(3, 4);
static void fail(worker *w, const char *dev, const char *fmt, ...)
{
    if (w->failures++ == 0) {
        w->failed_at = tst_now();
        const int n = snprintf(w->failure, sizeof w->failure, "thread %d on %s: ", w->id, dev);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->failure + n, sizeof w->failure - (size_t)n, fmt, ap);
        va_end(ap);
    }
}

/* One random case of op o on stream s: made, run and verified, or (invalid) one call it must
 * reject. */
static void one_call(worker *w, tst_dev *d, lmk_stream *s, tst_rng *r, int o, bool invalid)
{
    const tst_op *op = tst_ops[o];
    const tst_case c = tst_op_random_case(op, r);
    const uint64_t seed = tst_rng_u64(r);
    tst_inst *in = NULL;
    tst_result res;
    lmk_status st = tst_inst_make(&c, d->dev, seed, 0, NULL, &in);
    if (st != LMK_OK) {
        fail(w, d->name, "%s: setup: %s: %s", c.name, lmk_status_name(st), lmk_last_error());
        return;
    }
    if (invalid && op->n_invalid > 0) {
        const int k = (int)tst_rng_below(r, (uint32_t)op->n_invalid);
        if (!tst_inst_reject(in, s, k, &res))
            fail(w, d->name, "%s: %s", c.name, res.msg);
        w->invalid++;
    } else {
        st = tst_inst_run(in, s);
        if (st == LMK_OK)
            st = lmk_stream_sync(s);
        if (st == LMK_ERR_UNSUPPORTED)
            w->unsupported++;
        else if (st != LMK_OK)
            fail(w, d->name, "%s (seed 0x%016llx): %s: %s", c.name, (unsigned long long)seed, lmk_status_name(st),
                 lmk_last_error());
        else if (!tst_inst_verify(in, &res))
            fail(w, d->name, "%s (seed 0x%016llx): %s", c.name, (unsigned long long)seed, res.msg);
        w->per_op[o % 16]++;
    }
    tst_inst_free(in);
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
        one_call(w, d, s, &r, (int)tst_rng_below(&r, (uint32_t)tst_op_count), tst_rng_below(&r, 10) == 0);
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
    double first_at = 0;
    long idle = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        sum.calls += ws[i].calls;
        for (int o = 0; o < 16; o++)
            sum.per_op[o] += ws[i].per_op[o];
        sum.invalid += ws[i].invalid;
        sum.unsupported += ws[i].unsupported;
        sum.failures += ws[i].failures;
        idle += ws[i].calls == 0;
        if (ws[i].failures && (!first || ws[i].failed_at < first_at))
            first = ws[i].failure, first_at = ws[i].failed_at;
    }
    /* A CUDA fault is sticky: every thread fails after it, and the earliest failure is the one
     * nearest its cause. Each thread's first, with when it happened: */
    for (int i = 0; i < started; i++)
        if (ws[i].failures)
            printf("stress: at %.3f s, %s\n", ws[i].failed_at - t0, ws[i].failure);
    if (toggling) {
        pthread_join(tog_thread, NULL);
        printf("stress: lmk_device_set_threads called %ld times meanwhile\n", tog.calls);
    }
    char per_op[256] = "";
    for (int o = 0; o < tst_op_count && o < 16; o++)
        snprintf(per_op + strlen(per_op), sizeof per_op - strlen(per_op), "%s %s %ld", o ? "," : "", tst_ops[o]->name,
                 sum.per_op[o]);
    printf("stress: %d threads x %d streams on each of [%s], %.1f s: %ld calls (%s; invalid %ld), %ld failures\n",
           started, STREAMS_PER_DEV, names, tst_now() - t0, sum.calls, per_op, sum.invalid, sum.failures);
    CHECK(sum.failures == 0, "%ld of %ld calls failed; the earliest: %s", sum.failures, sum.calls, first ? first : "");
    CHECK(started == n_threads && idle == 0, "%ld of %d threads made no call", idle, started);
    if (sum.unsupported)
        SKIP("stress: %ld random cases not supported by a backend (LMK_ERR_UNSUPPORTED)", sum.unsupported);
    free(ws);
    free(th);
    tst_devs_close(devs, n_devs);
    return harness_summary();
}
