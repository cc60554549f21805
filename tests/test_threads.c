/*
 * test_threads.c - the threading contract of lmk.h, case by case: different threads may use
 * different streams of one device at the same time, each thread reads its own error message, and
 * any thread may open and close its own devices.
 *
 * Scope, next to test_stress.c: this test is deterministic coverage of the contract (every op's
 * contract cases from every thread, a fixed number of rounds, each result verified); test_stress
 * is load (random cases of every op and invalid calls for a time budget, two streams per thread,
 * a thread changing the device's thread count meanwhile). Both run under `make test-tsan`.
 *
 *  1. Four threads share ONE device (per backend). Each creates its own stream and runs every
 *     contract case of every op of the registry (tst_ops) in turn, each time on fresh random
 *     inputs, verified against the float64 reference (and every byte around the outputs). Between
 *     cases each thread makes a call fail with a value only it uses
 *     (lmk_device_set_threads(dev, 1025 + thread and round)) and must read back its own message.
 *  2. Four threads open, use (one contract case each round) and close their own devices at the
 *     same time, over and over.
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

enum { N_THREADS = 4, MAX_CASES = 64 };

/* Every op's contract cases, and for each whether the backend under test supports it. */
static tst_case g_cases[MAX_CASES];
static int g_n_cases;

typedef struct worker {
    lmk_device *dev;                 /* shared (part 1) or NULL (part 2: open your own) */
    lmk_backend backend;             /* part 2 */
    pthread_barrier_t *start;
    int id, rounds;
    uint64_t seed;
    int n_cases, n_msg, n_unsupported;
    int bad_case, bad_msg, bad_setup;
    char first[768];
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

/* Case i on stream s; a backend without the case (LMK_ERR_UNSUPPORTED) is counted, not failed. */
static void one_case(worker *w, lmk_stream *s, int i, uint64_t seed)
{
    tst_result res;
    lmk_status st;
    w->n_cases++;
    if (tst_case_check(&g_cases[i], s, seed, &res, &st))
        return;
    if (st == LMK_ERR_UNSUPPORTED) {
        w->n_unsupported++;
        return;
    }
    w->bad_case++;
    fail_once(w, "thread %d: %s (seed 0x%016" PRIx64 "): %s", w->id, g_cases[i].name, seed, res.msg);
}

/* A failure with a value only this thread and round use; the message must be this one. */
static void one_message(worker *w, lmk_device *dev, int round)
{
    const int n = 1025 + w->id * 100000 + round;
    char want[64];
    snprintf(want, sizeof want, "n_threads (%d) must be <= 1024", n);
    w->n_msg++;
    const lmk_status st = lmk_device_set_threads(dev, n);
    sched_yield(); /* let the other threads run (and fail) before reading the message back */
    if (st != LMK_ERR_INVALID_ARGUMENT || !strstr(lmk_last_error(), want)) {
        w->bad_msg++;
        fail_once(w, "thread %d: message \"%s\", want \"%s\" (%s)", w->id, lmk_last_error(), want,
                  lmk_status_name(st));
    }
}

static void *shared_device_main(void *arg)
{
    worker *w = arg;
    lmk_stream *s = NULL;
    if (lmk_stream_create(w->dev, &s) != LMK_OK) {
        w->bad_setup++;
        fail_once(w, "thread %d: stream: %s", w->id, lmk_last_error());
        pthread_barrier_wait(w->start);
        return NULL;
    }
    pthread_barrier_wait(w->start);
    for (int round = 0; round < w->rounds; round++)
        for (int i = 0; i < g_n_cases; i++) {
            one_case(w, s, (i + w->id) % g_n_cases, tst_seed_mix(w->seed, (uint64_t)round, (uint64_t)i));
            one_message(w, w->dev, round * g_n_cases + i);
        }
    lmk_stream_destroy(s);
    return NULL;
}

static void *own_device_main(void *arg)
{
    worker *w = arg;
    pthread_barrier_wait(w->start);
    for (int round = 0; round < w->rounds; round++) {
        lmk_device *dev = NULL;
        lmk_stream *s = NULL;
        if (lmk_device_open(w->backend, 0, &dev) != LMK_OK || lmk_stream_create(dev, &s) != LMK_OK) {
            w->bad_setup++;
            fail_once(w, "thread %d: open backend %d: %s", w->id, (int)w->backend, lmk_last_error());
            lmk_device_close(dev);
            continue;
        }
        one_case(w, s, (round + w->id) % g_n_cases, tst_seed_mix(w->seed, (uint64_t)round, 0));
        lmk_stream_destroy(s);
        lmk_device_close(dev);
    }
    return NULL;
}

static void report(const worker *w, int n, const char *what)
{
    int calls = 0, unsupported = 0;
    for (int i = 0; i < n; i++) {
        const worker *x = &w[i];
        CHECK(x->bad_setup == 0 && x->bad_case == 0 && x->bad_msg == 0,
              "%s, thread %d: %d/%d cases wrong, %d/%d messages wrong, %d setup failures; first: %s", what, x->id,
              x->bad_case, x->n_cases, x->bad_msg, x->n_msg, x->bad_setup, x->first);
        calls += x->n_cases + x->n_msg;
        unsupported += x->n_unsupported;
    }
    CHECK(calls > 0, "%s: no calls were made", what);
    if (unsupported)
        SKIP("%s: %d case runs not supported on this backend (LMK_ERR_UNSUPPORTED)", what, unsupported);
    printf("%s: %d threads, %d calls, all verified\n", what, n, calls);
}

static void run_shared(lmk_backend backend, const char *bname, int rounds)
{
    lmk_device *dev = NULL;
    if (!CHECK(lmk_device_open(backend, 0, &dev) == LMK_OK, "open %s: %s", bname, lmk_last_error()))
        return;
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, N_THREADS);
    worker w[N_THREADS];
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        w[i] = (worker){.dev = dev, .start = &bar, .id = i, .rounds = rounds, .seed = tst_case_seed()};
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

static void run_own(int rounds)
{
    const int n_cuda = lmk_device_count(LMK_BACKEND_CUDA);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, N_THREADS);
    worker w[N_THREADS];
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        w[i] = (worker){.backend = (i % 2 && n_cuda > 0) ? LMK_BACKEND_CUDA : (i % 2 ? LMK_BACKEND_AUTO : LMK_BACKEND_CPU),
                        .start = &bar, .id = i, .rounds = rounds, .seed = tst_case_seed()};
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
    for (int o = 0; o < tst_op_count; o++)
        for (int i = 0; i < tst_ops[o]->n_cases() && g_n_cases < MAX_CASES; i++) {
            const tst_case c = tst_op_case(tst_ops[o], i);
            if (c.flags & TST_CASE_CONTRACT)
                g_cases[g_n_cases++] = c;
        }
    if (!CHECK(g_n_cases > 0, "no contract case in the registry"))
        return harness_summary();
    const int rounds = tst_quick() ? 1 : 2;
    run_shared(LMK_BACKEND_CPU, "cpu", rounds);
    if (lmk_device_count(LMK_BACKEND_CUDA) > 0)
        run_shared(LMK_BACKEND_CUDA, "cuda:0", rounds);
    else
        SKIP("cuda: lmk_device_count(LMK_BACKEND_CUDA) is 0 (no usable GPU); CUDA cases not run");
    run_own(tst_quick() ? g_n_cases : 2 * g_n_cases);
    printf("test_threads: %d contract cases of %d ops, %.2f s\n", g_n_cases, tst_op_count, tst_now() - t0);
    return harness_summary();
}
