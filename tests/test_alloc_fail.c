/*
 * test_alloc_fail.c - every host allocation of the library can fail, and each failure is clean.
 *
 * An lmk_allocator hook counts the library's host allocations and fails the N-th. A scenario that
 * touches every allocating path (open a device, make two streams with worker pools, make every
 * op's contract cases of the registry tst_ops: allocations, dense and strided views; run them on
 * both streams, free everything) runs for N = 1, 2, ... until it completes without reaching
 * allocation N. For each N:
 *   - the call that needed allocation N returned LMK_ERR_OUT_OF_MEMORY with a message (a failure
 *     that the library swallowed, or reported as another status, is a failure of this test);
 *   - after the scenario's cleanup no allocation is outstanding (the hook tracks every pointer, so
 *     a leak, a double free or a free of a pointer the hook never returned is caught);
 *   - the library still works: the whole scenario then succeeds, with results equal to the
 *     float64 references, and again leaves nothing allocated.
 * It runs on every backend this machine has (CUDA device memory does not go through the hook, but
 * its handles do). Under test-sanitize, LSan also sees anything that bypassed the hook.
 */
#include "common.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

HARNESS_DEFINE;

/* ---- the hook ---- */

#define MAX_LIVE 1024

static struct {
    pthread_mutex_t lock;
    long calls;      /* allocations asked for since the last reset */
    long fail_at;    /* the allocation to fail (1-based); 0: none */
    long injected;   /* failures injected since the last reset */
    long live;       /* allocations not yet freed */
    long bad_free;   /* frees of pointers the hook did not hand out (or freed twice) */
    long bad_align;  /* alignments that are not a power of two */
    void *ptrs[MAX_LIVE];
} g_hook = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void *hook_alloc(size_t size, size_t alignment, void *user)
{
    (void)user;
    pthread_mutex_lock(&g_hook.lock);
    const bool fail = ++g_hook.calls == g_hook.fail_at;
    g_hook.injected += fail;
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
        g_hook.bad_align++;
    pthread_mutex_unlock(&g_hook.lock);
    if (fail)
        return NULL;
    void *p = NULL;
    if (posix_memalign(&p, alignment < sizeof(void *) ? sizeof(void *) : alignment, size ? size : 1) != 0)
        return NULL;
    pthread_mutex_lock(&g_hook.lock);
    int slot = -1;
    for (int i = 0; i < MAX_LIVE && slot < 0; i++)
        if (!g_hook.ptrs[i])
            slot = i;
    if (slot >= 0)
        g_hook.ptrs[slot] = p;
    g_hook.live++;
    pthread_mutex_unlock(&g_hook.lock);
    return p;
}

static void hook_free(void *p, void *user)
{
    (void)user;
    pthread_mutex_lock(&g_hook.lock);
    int slot = -1;
    for (int i = 0; i < MAX_LIVE && slot < 0; i++)
        if (g_hook.ptrs[i] == p)
            slot = i;
    if (slot >= 0) {
        g_hook.ptrs[slot] = NULL;
        g_hook.live--;
    } else {
        g_hook.bad_free++;
    }
    pthread_mutex_unlock(&g_hook.lock);
    if (slot >= 0)
        free(p); /* a pointer we never handed out is not ours to free */
}

static void hook_reset(long fail_at)
{
    pthread_mutex_lock(&g_hook.lock);
    g_hook.calls = 0;
    g_hook.fail_at = fail_at;
    g_hook.injected = 0;
    pthread_mutex_unlock(&g_hook.lock);
}

static long hook_get(const long *field)
{
    pthread_mutex_lock(&g_hook.lock);
    const long v = *field;
    pthread_mutex_unlock(&g_hook.lock);
    return v;
}

/* ---- the scenario ---- */

#define MAX_CASES 64

/* The cases the scenario runs on a backend: every contract case of every op (tst_ops) that the
 * backend supports. */
static tst_case g_cases[MAX_CASES];
static int g_n_cases;

typedef struct scenario {
    lmk_device *dev;
    lmk_stream *s[2];
    tst_inst *in[MAX_CASES];
    const char *failed_call;  /* the first call that did not return LMK_OK */
    char failed_case[TST_CASE_NAME];
    lmk_status st;
    char msg[512];            /* its message */
} scenario;

/* Runs `call`; on failure records it and jumps to the cleanup. */
#define STEP(sc, call)                                                                                       \
    do {                                                                                                     \
        const lmk_status st_ = (call);                                                                       \
        if (st_ != LMK_OK) {                                                                                 \
            (sc)->st = st_;                                                                                  \
            (sc)->failed_call = #call;                                                                       \
            snprintf((sc)->msg, sizeof (sc)->msg, "%s", lmk_last_error());                                   \
            goto cleanup;                                                                                    \
        }                                                                                                    \
    } while (0)

/* The scenario on `backend`: open a device with 2 threads, two streams, make every case (its
 * buffers and views), run them alternately on the two streams, sync, free everything. Returns its
 * status (LMK_OK when every call succeeded and, with `check`, every result matched the reference). */
static lmk_status run_scenario(lmk_backend backend, scenario *sc, bool check, uint64_t seed)
{
    memset(sc, 0, sizeof *sc);
    STEP(sc, lmk_device_open(backend, 0, &sc->dev));
    STEP(sc, lmk_device_set_threads(sc->dev, 2));
    STEP(sc, lmk_stream_create(sc->dev, &sc->s[0]));
    STEP(sc, lmk_stream_create(sc->dev, &sc->s[1]));
    for (int i = 0; i < g_n_cases; i++) {
        snprintf(sc->failed_case, sizeof sc->failed_case, "%s", g_cases[i].name);
        STEP(sc, tst_inst_make(&g_cases[i], sc->dev, tst_seed_mix(seed, (uint64_t)i, 0), 0, NULL, &sc->in[i]));
        STEP(sc, tst_inst_run(sc->in[i], sc->s[i % 2]));
    }
    sc->failed_case[0] = '\0';
    STEP(sc, lmk_stream_sync(sc->s[0]));
    STEP(sc, lmk_stream_sync(sc->s[1]));
    for (int i = 0; check && i < g_n_cases; i++) {
        tst_result res;
        if (!tst_inst_verify(sc->in[i], &res)) {
            sc->st = LMK_ERR_DEVICE;
            sc->failed_call = "verify";
            snprintf(sc->failed_case, sizeof sc->failed_case, "%s", g_cases[i].name);
            snprintf(sc->msg, sizeof sc->msg, "%s", res.msg);
            break;
        }
    }

cleanup:
    for (int i = g_n_cases - 1; i >= 0; i--)
        tst_inst_free(sc->in[i]);
    lmk_stream_destroy(sc->s[1]);
    lmk_stream_destroy(sc->s[0]);
    lmk_device_close(sc->dev);
    return sc->st;
}

/* The contract cases of every op that `backend` runs (one visible SKIP for those it does not);
 * with LMK_TEST_QUICK (the sanitizer run) the first of each op only, which still reaches every
 * op's allocating paths. */
static bool pick_cases(lmk_backend backend, const char *name)
{
    g_n_cases = 0;
    lmk_device *dev = NULL;
    lmk_stream *s = NULL;
    if (!TST_REQUIRE(lmk_device_open(backend, 0, &dev) == LMK_OK && lmk_stream_create(dev, &s) == LMK_OK,
                     "%s: open: %s", name, lmk_last_error())) {
        lmk_device_close(dev);
        return false;
    }
    int unsupported = 0;
    for (int o = 0; o < tst_op_count; o++)
        for (int i = 0; i < tst_ops[o]->n_cases() && g_n_cases < MAX_CASES; i++) {
            const tst_case c = tst_op_case(tst_ops[o], i);
            if (!(c.flags & TST_CASE_CONTRACT) || (tst_quick() && g_n_cases && g_cases[g_n_cases - 1].op == c.op))
                continue;
            tst_result res;
            lmk_status st;
            if (tst_case_check(&c, s, 1, &res, &st) || st != LMK_ERR_UNSUPPORTED)
                g_cases[g_n_cases++] = c;
            else
                unsupported++;
        }
    if (unsupported)
        SKIP("%s: %d contract cases are not supported on this backend (LMK_ERR_UNSUPPORTED); the scenario runs "
             "the other %d", name, unsupported, g_n_cases);
    lmk_stream_destroy(s);
    lmk_device_close(dev);
    return true;
}

/* Fails allocation N = 1, 2, ... on `backend` until the scenario no longer reaches N. After each
 * failure the scenario runs again in full; its results are verified against the references after
 * the first failure and every 16th (verifying after each one costs minutes under the sanitizers
 * and finds nothing the runs in between would not: each run makes every buffer afresh). */
static void test_backend(lmk_backend backend, const char *name, long *faults)
{
    if (!pick_cases(backend, name))
        return;
    scenario sc;
    const uint64_t seed = tst_case_seed();
    long n = 1;
    for (;; n++) {
        hook_reset(n);
        const lmk_status st = run_scenario(backend, &sc, false, seed);
        const long injected = hook_get(&g_hook.injected), live = hook_get(&g_hook.live);
        const char *call = sc.failed_call ? sc.failed_call : "(no call)";
        if (injected == 0) { /* the scenario made fewer than n allocations: done */
            CHECK(st == LMK_OK, "%s: scenario without an injected failure failed at %s [%s]: %s (%s)", name, call,
                  sc.failed_case, lmk_status_name(st), sc.msg);
            break;
        }
        *faults += injected;
        CHECK(st == LMK_ERR_OUT_OF_MEMORY && sc.msg[0] != '\0',
              "%s: allocation %ld failed: %s [%s] returned %s with message \"%s\" "
              "(want LMK_ERR_OUT_OF_MEMORY and a message)",
              name, n, call, sc.failed_case, lmk_status_name(st), sc.msg);
        CHECK(live == 0, "%s: allocation %ld failed in %s: %ld allocations outstanding after cleanup", name, n, call,
              live);
        if (n <= 8 || n % 16 == 0)
            printf("  %s: allocation %3ld failed: %.*s -> %s \"%s\"\n", name, n, (int)strcspn(call, "("), call,
                   lmk_status_name(st), sc.msg);

        /* The library still works. */
        hook_reset(0);
        const lmk_status st2 = run_scenario(backend, &sc, n == 1 || n % 16 == 0, seed);
        CHECK(st2 == LMK_OK && hook_get(&g_hook.live) == 0,
              "%s: after failing allocation %ld, a full scenario: %s at %s [%s] (%s), %ld outstanding", name, n,
              lmk_status_name(st2), sc.failed_call ? sc.failed_call : "-", sc.failed_case, sc.msg,
              hook_get(&g_hook.live));
        if (n > 10000) {
            TST_FAIL("%s: the scenario never stops allocating", name);
            break;
        }
    }
    /* And verified once more at the end, after every failure. */
    hook_reset(0);
    const lmk_status st = run_scenario(backend, &sc, true, seed);
    CHECK(st == LMK_OK, "%s: the final verified scenario: %s at %s [%s] (%s)", name, lmk_status_name(st),
          sc.failed_call ? sc.failed_call : "-", sc.failed_case, sc.msg);
    printf("%s: the scenario (%d contract cases of %d ops) makes %ld host allocations; each one failed in turn\n",
           name, g_n_cases, tst_op_count, n - 1);
}

int main(void)
{
    tst_program_seed();
    static const lmk_allocator hook = {hook_alloc, hook_free, NULL};
    lmk_set_allocator(&hook);
    long faults = 0;
    test_backend(LMK_BACKEND_CPU, "cpu", &faults);
    if (lmk_device_count(LMK_BACKEND_CUDA) > 0)
        test_backend(LMK_BACKEND_CUDA, "cuda", &faults);
    else
        SKIP("cuda: no usable GPU (or no CUDA in this build); allocation failures injected on the CPU only");
    lmk_set_allocator(NULL);

    CHECK(hook_get(&g_hook.bad_free) == 0, "%ld frees of pointers the hook never handed out",
          hook_get(&g_hook.bad_free));
    CHECK(hook_get(&g_hook.bad_align) == 0, "%ld allocations with an alignment that is not a power of two",
          hook_get(&g_hook.bad_align));
    CHECK(faults > 0, "no allocation failure was injected");
    printf("alloc_fail: %ld faults injected\n", faults);
    return harness_summary();
}
