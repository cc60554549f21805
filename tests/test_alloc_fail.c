/*
 * test_alloc_fail.c - every host allocation of the library can fail, and each failure is clean.
 *
 * An lmk_allocator hook counts the library's host allocations and fails the N-th. A scenario that
 * touches every allocating path (open a device, make two streams with worker pools, alloc, wrap
 * and view buffers, run repeat_tiled, rope_multi and rope_multi_qk, free everything) runs for
 * N = 1, 2, ... until it completes without reaching allocation N. For each N:
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

enum { T = 32, HG = 4, H = 8, K = 64, HD = 256, RD = 64, NQ = 8, NK = 2 };
#define N_SRC ((size_t)T * HG * K)
#define N_DST ((size_t)T * H * K)
#define N_Q ((size_t)T * NQ * HD)
#define N_K ((size_t)T * NK * HD)

typedef struct host_data {
    float src[N_SRC];
    float q[N_Q], k[N_K];
    uint16_t kb[N_K]; /* bf16 */
    int32_t pos[4 * T];
} host_data;

static host_data *g_in;

typedef struct scenario {
    lmk_device *dev;
    lmk_stream *s[2];
    lmk_buffer *b[16];
    int nb;
    const char *failed_call;  /* the first call that did not return LMK_OK */
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

/* The next free handle slot of the scenario (freed in reverse order: views before parents). */
static lmk_buffer **slot(scenario *sc) { return &sc->b[sc->nb++]; }

static const lmk_rope_multi_params k_rope = {
    .head_dim = HD, .rope_dim = RD, .n_heads = NQ, .seq_len = T, .freq_base = 1e7f, .mode = LMK_ROPE_IMROPE,
    .sections = {11, 11, 10, 0}, .pairing = LMK_ROPE_PAIR_HALF_ROPE,
};

/* Checks the scenario's results against the references; returns false with a message. */
static bool verify(scenario *sc, lmk_buffer *dst, lmk_buffer *q_out, lmk_buffer *q_in_place, lmk_buffer *k_in_place,
                   lmk_buffer *kb, char *msg, size_t n)
{
    bool ok = false;
    float *want = malloc(N_DST * sizeof(float)), *got_dst = tst_read_all(dst);
    void *got_q = tst_read_all(q_out), *got_q2 = tst_read_all(q_in_place), *got_k = tst_read_all(k_in_place);
    void *got_kb = tst_read_all(kb);
    (void)sc;
    if (!want || !got_dst || !got_q || !got_q2 || !got_k || !got_kb) {
        snprintf(msg, n, "could not read the results back");
        goto done;
    }
    const lmk_repeat_args ra = tst_repeat_host_args(g_in->src, want, T, HG, H, K, 4);
    lmk_ref_repeat(&ra);
    if (tst_bits_diff(want, got_dst, N_DST * sizeof(float)) >= 0) {
        snprintf(msg, n, "repeat_tiled differs from the reference");
        goto done;
    }
    const lmk_rope_args a = tst_rope_host_args(&k_rope, NK, 2, LMK_F32, g_in->q, g_in->k, g_in->pos);
    const void *got1[2] = {got_q, got_k};
    if (!tst_rope_check(&a, got1, 1e-5, msg, n))
        goto done;
    const void *got2[2] = {got_q2, got_k};
    if (!tst_rope_check(&a, got2, 1e-5, msg, n))
        goto done;
    lmk_rope_multi_params kp = k_rope;
    kp.n_heads = NK;
    const lmk_rope_args b = tst_rope_host_args(&kp, 0, 1, LMK_BF16, g_in->kb, NULL, g_in->pos);
    const void *got3[2] = {got_kb, NULL};
    ok = tst_rope_check(&b, got3, 1e-5, msg, n);
done:
    free(want);
    free(got_dst);
    free(got_q);
    free(got_q2);
    free(got_k);
    free(got_kb);
    return ok;
}

/* The scenario on `backend`; returns its status (LMK_OK when every call succeeded and `check`
 * found the results right). */
static lmk_status run_scenario(lmk_backend backend, scenario *sc, bool check)
{
    memset(sc, 0, sizeof *sc);
    const size_t s_src[3] = {T, HG, K}, s_dst[3] = {T, H, K}, s_q[3] = {T, NQ, HD}, s_k[3] = {T, NK, HD};
    const size_t s_pos[1] = {4 * T};
    const size_t q_bytes = N_Q * 4, k_bytes = N_K * 4;
    lmk_buffer *src, *dst, *pos, *parent, *q_in, *q_out, *q2, *k_in, *kb;

    STEP(sc, lmk_device_open(backend, 0, &sc->dev));
    STEP(sc, lmk_device_set_threads(sc->dev, 2));
    STEP(sc, lmk_stream_create(sc->dev, &sc->s[0]));
    STEP(sc, lmk_stream_create(sc->dev, &sc->s[1]));

    /* repeat_tiled: src allocated with a shape, dst a pooled allocation 64 bytes larger. */
    STEP(sc, lmk_buffer_alloc(sc->dev, N_SRC * 4, LMK_F32, s_src, 3, slot(sc)));
    src = sc->b[sc->nb - 1];
    STEP(sc, lmk_buffer_write(src, 0, g_in->src, N_SRC * 4));
    STEP(sc, lmk_buffer_alloc(sc->dev, N_DST * 4 + 64, LMK_F32, s_dst, 3, slot(sc)));
    dst = sc->b[sc->nb - 1];
    STEP(sc, lmk_repeat_tiled(sc->s[0], src, dst, &(lmk_repeat_tiled_params){T, HG, H, K}));

    /* Positions: wrapped host memory on the CPU (CUDA cannot wrap host memory), else allocated. */
    if (backend == LMK_BACKEND_CPU) {
        STEP(sc, lmk_buffer_wrap(sc->dev, g_in->pos, sizeof g_in->pos, LMK_I32, s_pos, 1, slot(sc)));
    } else {
        STEP(sc, lmk_buffer_alloc(sc->dev, sizeof g_in->pos, LMK_I32, s_pos, 1, slot(sc)));
        STEP(sc, lmk_buffer_write(sc->b[sc->nb - 1], 0, g_in->pos, sizeof g_in->pos));
    }
    pos = sc->b[sc->nb - 1];

    /* q and k: views into one parent allocation. */
    STEP(sc, lmk_buffer_alloc(sc->dev, 3 * q_bytes + k_bytes + 256, LMK_U8, NULL, 0, slot(sc)));
    parent = sc->b[sc->nb - 1];
    STEP(sc, lmk_buffer_view(parent, 0, LMK_F32, s_q, 3, slot(sc)));
    q_in = sc->b[sc->nb - 1];
    STEP(sc, lmk_buffer_view(parent, q_bytes, LMK_F32, s_q, 3, slot(sc)));
    q_out = sc->b[sc->nb - 1];
    STEP(sc, lmk_buffer_view(parent, 2 * q_bytes + 128, LMK_F32, s_q, 3, slot(sc)));
    q2 = sc->b[sc->nb - 1];
    STEP(sc, lmk_buffer_view(parent, 3 * q_bytes + 256, LMK_F32, s_k, 3, slot(sc)));
    k_in = sc->b[sc->nb - 1];
    STEP(sc, lmk_buffer_write(q_in, 0, g_in->q, q_bytes));
    STEP(sc, lmk_buffer_write(q2, 0, g_in->q, q_bytes));
    STEP(sc, lmk_buffer_write(k_in, 0, g_in->k, k_bytes));
    STEP(sc, lmk_buffer_alloc(sc->dev, N_K * 2, LMK_BF16, s_k, 3, slot(sc)));
    kb = sc->b[sc->nb - 1];
    STEP(sc, lmk_buffer_write(kb, 0, g_in->kb, N_K * 2));

    /* rope_multi out of place on one stream, rope_multi_qk in place on the other, bf16 in place. */
    STEP(sc, lmk_rope_multi(sc->s[1], q_in, q_out, pos, &k_rope));
    STEP(sc, lmk_rope_multi_qk(sc->s[0], q2, q2, k_in, k_in, pos, &k_rope, NK));
    lmk_rope_multi_params pk = k_rope;
    pk.n_heads = NK;
    STEP(sc, lmk_rope_multi(sc->s[1], kb, kb, pos, &pk));
    STEP(sc, lmk_stream_sync(sc->s[0]));
    STEP(sc, lmk_stream_sync(sc->s[1]));

    if (check && !verify(sc, dst, q_out, q2, k_in, kb, sc->msg, sizeof sc->msg)) {
        sc->st = LMK_ERR_DEVICE;
        sc->failed_call = "verify";
    }

cleanup:
    for (int i = sc->nb - 1; i >= 0; i--)
        lmk_buffer_free(sc->b[i]);
    lmk_stream_destroy(sc->s[1]);
    lmk_stream_destroy(sc->s[0]);
    lmk_device_close(sc->dev);
    return sc->st;
}

/* Fails allocation N = 1, 2, ... on `backend` until the scenario no longer reaches N. */
static void test_backend(lmk_backend backend, const char *name, long *faults)
{
    scenario sc;
    long n = 1;
    for (;; n++) {
        hook_reset(n);
        const lmk_status st = run_scenario(backend, &sc, false);
        const long injected = hook_get(&g_hook.injected), live = hook_get(&g_hook.live);
        if (injected == 0) { /* the scenario made fewer than n allocations: done */
            CHECK(st == LMK_OK, "%s: scenario without an injected failure failed at %s: %s (%s)", name,
                  sc.failed_call, lmk_status_name(st), sc.msg);
            break;
        }
        *faults += injected;
        CHECK(st == LMK_ERR_OUT_OF_MEMORY && sc.msg[0] != '\0',
              "%s: allocation %ld failed: %s returned %s with message \"%s\" "
              "(want LMK_ERR_OUT_OF_MEMORY and a message)",
              name, n, sc.failed_call ? sc.failed_call : "(every call)", lmk_status_name(st), sc.msg);
        CHECK(live == 0, "%s: allocation %ld failed in %s: %ld allocations outstanding after cleanup", name, n,
              sc.failed_call ? sc.failed_call : "(no call)", live);
        const char *call = sc.failed_call ? sc.failed_call : "-";
        printf("  %s: allocation %2ld failed: %.*s -> %s \"%s\"\n", name, n, (int)strcspn(call, "("), call,
               lmk_status_name(st), sc.msg);

        /* The library still works. */
        hook_reset(0);
        const lmk_status st2 = run_scenario(backend, &sc, true);
        CHECK(st2 == LMK_OK && hook_get(&g_hook.live) == 0,
              "%s: after failing allocation %ld, a full scenario: %s at %s (%s), %ld outstanding", name, n,
              lmk_status_name(st2), sc.failed_call ? sc.failed_call : "-", sc.msg, hook_get(&g_hook.live));
        if (n > 10000) {
            TST_FAIL("%s: the scenario never stops allocating", name);
            break;
        }
    }
    printf("%s: the scenario makes %ld host allocations; each one failed in turn\n", name, n - 1);
}

int main(void)
{
    g_in = malloc(sizeof *g_in);
    if (!TST_REQUIRE(g_in != NULL, "out of host memory"))
        return harness_summary();
    tst_rng r = tst_rng_make(tst_case_seed());
    tst_fill_float(&r, LMK_F32, g_in->src, N_SRC, -2, 2);
    tst_fill_float(&r, LMK_F32, g_in->q, N_Q, -2, 2);
    tst_fill_float(&r, LMK_F32, g_in->k, N_K, -2, 2);
    tst_fill_float(&r, LMK_BF16, g_in->kb, N_K, -2, 2);
    tst_positions_random(&r, g_in->pos, T, 0, 262143);

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
    free(g_in);
    return harness_summary();
}
