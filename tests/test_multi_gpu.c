/*
 * test_multi_gpu.c - lmk on several CUDA devices at once.
 *
 * One thread per CUDA ordinal opens its own device and stream and runs rope (Qwen3.5-27B q+k, bf16,
 * q read from a [q | gate] projection), repeat_heads (block layout) and attn_prologue (into a bf16
 * cache through slots) many times, all threads at the same time, on the same host inputs. Each
 * thread checks its rope output against the float64 reference; then the threads' outputs must be
 * bit-identical across devices (determinism does not depend on which GPU ran the op). Needs two
 * GPUs: with fewer it prints a visible SKIP (the CI machine has none; the H200 x2 machine runs it).
 */
#include "common.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

HARNESS_DEFINE;

enum { T = 257, HQ = 24, HK = 4, D = 256, R = 64, ITERS = 50, MAX_GPUS = 8 };

typedef struct gpu_job {
    int ordinal;
    const uint16_t *qg, *k, *v; /* host inputs: [T, HQ, 2D], [T, HK, D], [T, HK, D] bf16 */
    const int32_t *pos;         /* 4T */
    const int32_t *slots;       /* T */
    uint16_t *q_out, *k_out, *rep, *kc; /* results read back */
    char err[256];
} gpu_job;

static const lmk_rope_params k_rope = {.head_dim = D, .rope_dim = R, .n_heads = HQ, .seq_len = T,
                                       .freq_base = 1e7f, .mode = LMK_ROPE_IMROPE, .sections = {11, 11, 10, 0},
                                       .n_k_heads = HK};

#define QG_N ((size_t)T * HQ * 2 * D)
#define K_N ((size_t)T * HK * D)
#define Q_N ((size_t)T * HQ * D)
#define SLOTS_N (2 * T)

static lmk_status make(lmk_device *dev, lmk_dtype dt, size_t n, const void *init, lmk_buffer **out)
{
    lmk_status st = lmk_buffer_alloc(dev, n * lmk_dtype_size(dt), dt, NULL, 0, out);
    if (st == LMK_OK && init)
        st = lmk_buffer_write(*out, 0, init, n * lmk_dtype_size(dt));
    return st;
}

/* The whole job of one GPU; returns 0, or 1 with job->err set. */
static int run_gpu(gpu_job *j)
{
    lmk_device *dev = NULL;
    lmk_stream *s = NULL;
    lmk_buffer *b[12] = {0};
    enum { QG, K, V, POS, SLOTS, KOUT, REP, KC, VC, QV, WQ, WK };
    lmk_status st = lmk_device_open(LMK_BACKEND_CUDA, j->ordinal, &dev);
    if (st == LMK_OK)
        st = lmk_stream_create(dev, &s);
    if (st == LMK_OK)
        st = make(dev, LMK_BF16, QG_N, j->qg, &b[QG]);
    if (st == LMK_OK)
        st = make(dev, LMK_BF16, K_N, j->k, &b[K]);
    if (st == LMK_OK)
        st = make(dev, LMK_BF16, K_N, j->v, &b[V]);
    if (st == LMK_OK)
        st = make(dev, LMK_I32, 4 * T, j->pos, &b[POS]);
    if (st == LMK_OK)
        st = make(dev, LMK_I32, T, j->slots, &b[SLOTS]);
    if (st == LMK_OK)
        st = make(dev, LMK_BF16, K_N, NULL, &b[KOUT]);
    if (st == LMK_OK)
        st = make(dev, LMK_BF16, (size_t)T * HQ * D, NULL, &b[REP]);
    if (st == LMK_OK)
        st = make(dev, LMK_BF16, (size_t)SLOTS_N * HK * D, NULL, &b[KC]);
    if (st == LMK_OK)
        st = make(dev, LMK_BF16, (size_t)SLOTS_N * HK * D, NULL, &b[VC]);
    const size_t shape[3] = {T, HQ, D}, strides[3] = {(size_t)HQ * 2 * D, 2 * D, 1};
    if (st == LMK_OK)
        st = lmk_buffer_view_strided(b[QG], 0, LMK_BF16, shape, strides, 3, &b[QV]);
    float w[D];
    for (int i = 0; i < D; i++)
        w[i] = 0.01f * (float)(i % 7);
    if (st == LMK_OK)
        st = make(dev, LMK_F32, D, w, &b[WQ]);
    if (st == LMK_OK)
        st = make(dev, LMK_F32, D, w, &b[WK]);
    lmk_buffer *q_out = NULL;
    if (st == LMK_OK)
        st = make(dev, LMK_BF16, Q_N, NULL, &q_out);
    const lmk_repeat_heads_params rp = {.seq = T, .hg = HK, .h = HQ, .k = D, .layout = LMK_REPEAT_BLOCK};
    const lmk_rms_norm_params np = {.eps = 1e-6f, .weight_offset = 1.0f};
    for (int it = 0; it < ITERS && st == LMK_OK; it++) {
        st = lmk_rope(s, b[QV], b[K], b[POS], NULL, q_out, b[KOUT], &k_rope);
        if (st == LMK_OK)
            st = lmk_repeat_heads(s, b[K], b[REP], &rp);
        const lmk_attn_prologue_io io = {.q_in = b[QV], .k_in = b[K], .v_in = b[V], .q_norm_w = b[WQ],
                                         .k_norm_w = b[WK], .positions = b[POS], .slots = b[SLOTS],
                                         .q_out = q_out, .k_cache = b[KC], .v_cache = b[VC]};
        if (st == LMK_OK && it == ITERS - 1) /* last: rope's result is what is read below */
            break;
        if (st == LMK_OK)
            st = lmk_attn_prologue(s, &io, &k_rope, &np);
    }
    if (st == LMK_OK)
        st = lmk_stream_sync(s);
    if (st == LMK_OK)
        st = lmk_buffer_read(q_out, 0, j->q_out, Q_N * 2);
    if (st == LMK_OK)
        st = lmk_buffer_read(b[KOUT], 0, j->k_out, K_N * 2);
    if (st == LMK_OK)
        st = lmk_buffer_read(b[REP], 0, j->rep, (size_t)T * HQ * D * 2);
    if (st == LMK_OK)
        st = lmk_buffer_read(b[KC], 0, j->kc, (size_t)SLOTS_N * HK * D * 2);
    if (st != LMK_OK)
        snprintf(j->err, sizeof j->err, "cuda:%d: %s: %s", j->ordinal, lmk_status_name(st), lmk_last_error());
    lmk_buffer_free(q_out);
    for (int i = 11; i >= 0; i--)
        lmk_buffer_free(b[i]);
    lmk_stream_destroy(s);
    lmk_device_close(dev);
    return st != LMK_OK;
}

static void *thread_main(void *arg)
{
    run_gpu(arg);
    return NULL;
}

int main(void)
{
    const int n = lmk_device_count(LMK_BACKEND_CUDA);
    if (n < 2) {
        SKIP("multi-gpu: %d CUDA device%s (needs 2): nothing run", n, n == 1 ? "" : "s");
        return harness_summary();
    }
    const int g = n < MAX_GPUS ? n : MAX_GPUS;
    tst_rng r = tst_rng_make(tst_case_seed());
    uint16_t *qg = malloc(QG_N * 2), *k = malloc(K_N * 2), *v = malloc(K_N * 2);
    int32_t pos[4 * T], slots[T];
    tst_fill_float(&r, LMK_BF16, qg, QG_N, -2, 2);
    tst_fill_float(&r, LMK_BF16, k, K_N, -2, 2);
    tst_fill_float(&r, LMK_BF16, v, K_N, -2, 2);
    tst_positions_random(&r, pos, T, 0, 100000);
    for (int i = 0; i < T; i++)
        slots[i] = (i * 7) % SLOTS_N;
    gpu_job jobs[MAX_GPUS];
    pthread_t th[MAX_GPUS];
    for (int i = 0; i < g; i++) {
        jobs[i] = (gpu_job){.ordinal = i, .qg = qg, .k = k, .v = v, .pos = pos, .slots = slots,
                            .q_out = malloc(Q_N * 2), .k_out = malloc(K_N * 2), .rep = malloc((size_t)T * HQ * D * 2),
                            .kc = malloc((size_t)SLOTS_N * HK * D * 2)};
        CHECK(pthread_create(&th[i], NULL, thread_main, &jobs[i]) == 0, "start the thread of cuda:%d", i);
    }
    for (int i = 0; i < g; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < g; i++)
        CHECK(jobs[i].err[0] == '\0', "cuda:%d ran %d rope + repeat_heads + attn_prologue rounds: %s", i, ITERS,
              jobs[i].err[0] ? jobs[i].err : "ok");

    /* cuda:0's rope against the reference, then every device against cuda:0 bit for bit. */
    lmk_tensor3 t[4];
    t[0] = (lmk_tensor3){.data = (unsigned char *)qg, .n = {T, HQ, D}, .stride = {(size_t)HQ * 2 * D, 2 * D, 1}, .es = 2};
    t[1] = t[0];
    t[2] = t[3] = tst_dense3(k, T, HK, D, 2);
    lmk_rope_args a = lmk_rope_args_for(&k_rope, LMK_BF16, t, true, pos, LMK_I32, NULL);
    a.t[0].out_tok = (size_t)HQ * D, a.t[0].out_head = D; /* q_out is dense */
    char msg[512];
    const void *got[2] = {jobs[0].q_out, jobs[0].k_out};
    snprintf(msg, sizeof msg, "cuda:0 failed before its output could be read");
    CHECK(!jobs[0].err[0] && tst_rope_check(&a, got, 1e-5, msg, sizeof msg), "cuda:0 rope vs the float64 reference: %s",
          msg);
    for (int i = 1; i < g; i++) {
        CHECK(memcmp(jobs[i].q_out, jobs[0].q_out, Q_N * 2) == 0 && memcmp(jobs[i].k_out, jobs[0].k_out, K_N * 2) == 0,
              "rope on cuda:%d is bit-identical to cuda:0", i);
        CHECK(memcmp(jobs[i].rep, jobs[0].rep, (size_t)T * HQ * D * 2) == 0,
              "repeat_heads on cuda:%d is bit-identical to cuda:0", i);
        CHECK(memcmp(jobs[i].kc, jobs[0].kc, (size_t)SLOTS_N * HK * D * 2) == 0,
              "attn_prologue's k cache on cuda:%d is bit-identical to cuda:0", i);
    }
    for (int i = 0; i < g; i++) {
        free(jobs[i].q_out);
        free(jobs[i].k_out);
        free(jobs[i].rep);
        free(jobs[i].kc);
    }
    free(qg);
    free(k);
    free(v);
    return harness_summary();
}
