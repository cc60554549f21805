/*
 * test_gated_delta_rule.c - lmk_gated_delta_rule (lmk.h "gated_delta_rule": gates, L2 norm, the
 * delta-rule recurrence over a state pool and the gated output norm) on every backend against the
 * float64 reference, and the traps other engines fell into. Every CPU instruction-set level runs
 * (tst_devs_open_isas), CUDA when a GPU is usable (else a visible SKIP).
 *
 *  - the case table of src/ops/gated_delta_rule/case.c (Qwen3.5-27B and Qwen3-Next decode batches
 *    and prompts, varlen batches, both head maps, every operand layout, edge head dims) and random
 *    cases, each against lmk_ref_gated_delta_rule with lmk.h's norm-wise precision, every byte
 *    around the outputs checked; the descriptor's invalid calls;
 *  - one call against the same tokens split at every token across two calls (the state carried
 *    through the pool) and one token a call, each against its float64 reference and, with an f32
 *    pool, against the one call (a bf16 pool rounds the state at every cut: another function);
 *    a varlen batch against each sequence alone;
 *  - SPEC section 12's traps, each as a deliberately wrong float64 variant of the formulas that the
 *    test's tolerance must reject on the same inputs while lmk passes: beta rounded to bf16 each
 *    step, the state rounded to bf16 or f16 each step, TILED and BLOCK swapped, a sequence end
 *    reading the decays of the tokens after it (a short final chunk), a padding slot -1 read as
 *    the pool's last row;
 *  - precision on a long sequence: f32, Hk = Hv = 1, dk = dv = 128, T = 65,536 (LMK_TEST_QUICK:
 *    8,192), every output row and the final state within 1e-4 of the float64 reference;
 *  - hostile cu_seqlens and state_slots (non-monotone, past T, negative, INT_MIN, INT64_MIN, huge
 *    rows): the call returns, and no byte outside out and the named pool rows changes; once with
 *    guard bytes around every operand (writes), once with none (reads, under AddressSanitizer);
 *  - duplicate slots: the row holds the last sequence's state computed from the row as it was;
 *  - every validation rule of lmk.h in its order (each rule also with a later clause broken), with
 *    its message and no byte written, and the calls lmk.h allows that look like errors;
 *  - the same bits from streams of 1, 2 and 3 threads;
 *  - the workspace (lmk.h "Workspace"), on every device: the query (0 on the CPU and for f32, the
 *    chunked layout's bytes on CUDA, never decreasing in T or n_seq, the call's validation with its
 *    messages), each rule on the workspace with nothing written, a workspace of exactly the bytes
 *    at an odd address giving the same bits;
 *  - the chunked form (CUDA): the case table's workspace rows at every size (Qwen3.5-27B and
 *    Qwen3-Next prompts of 64, 65, 127, 4096 and 4100 tokens, varlen batches, both head maps,
 *    strided views, z on and off, f32 and bf16 pools, dk = dv = 64, and the calls it leaves to the
 *    token kernel); chunked against the token kernel on the same inputs, both against the float64
 *    model, with empty, one-token, padding and twice-named sequences and 44 sequences (a head's
 *    rows in one block and in a cluster of two); two calls giving the same bits; one sequence of
 *    65,536 tokens (LMK_TEST_QUICK: 8,192); hostile cu_seqlens and slots, overlapping sequences
 *    past the workspace's chunk bound included.
 * Output rows are held to lmk.h's bound as case.c states it (the stored dtype's rounding counted
 * in, rows whose o cancels held to their terms' size / COND_MAX). The float64 model of the traps
 * is written here again from lmk.h's formulas, independently of lmk_ref_gated_delta_rule, and
 * checked against it.
 */
#include "common.h"
#include "ops/gated_delta_rule/gated_delta_rule.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

HARNESS_DEFINE;

/* A second CPU device: "a buffer on another device". */
static lmk_device *g_other;

/* ------------------------------------------------------------------------------------------------
 * problems on the host: inputs, their f32 images, the reference
 * ---------------------------------------------------------------------------------------------- */

typedef struct prob {
    uint32_t T, hk, hv, dk, dv, n_slots;
    lmk_dtype dtype, state_dtype;       /* q, k, v, z and out; the pool */
    lmk_repeat_layout map;
    uint32_t flags;
    bool z, raw, kfast;                 /* z and norm_w; A_log and dt_bias; the pool dk fastest */
    float scale;
    lmk_rms_norm_params norm;
    double alog_lo, alog_hi, dt_lo, dt_hi; /* raw gate parameters' ranges */
    void *q, *k, *v, *zz, *pool;        /* in their dtypes (the pool in its layout) */
    float *a, *b, *A_log, *dt_bias, *norm_w;
    float *q32, *k32, *v32, *z32, *pool32; /* widened, dense (pool32 dv fastest) */
} prob;

static double uni(tst_rng *r, double lo, double hi)
{
    return tst_rng_uniform(r, lo, hi);
}

/* n values in [lo, hi) stored in t at dst and widened into w. */
static void fill_pair(tst_rng *r, lmk_dtype t, void *dst, float *w, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++) {
        tst_store(t, dst, i, uni(r, lo, hi));
        w[i] = (float)tst_load(t, dst, i);
    }
}

/* Index of element (row, h, i, j) of the pool in its own layout. */
static size_t pool_at(const prob *p, size_t row, size_t h, size_t i, size_t j)
{
    const size_t head = ((size_t)row * p->hv + h) * p->dk * p->dv;
    return head + (p->kfast ? j * p->dk + i : i * p->dv + j);
}

static void prob_free(prob *p)
{
    void *all[] = {p->q, p->k, p->v, p->zz, p->pool, p->a, p->b, p->A_log, p->dt_bias, p->norm_w,
                   p->q32, p->k32, p->v32, p->z32, p->pool32};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

/* Fresh random inputs for p's shape: q, k, v, z in [-2, 2) (q, k scaled without the L2 norm), a,
 * b in [-2, 2), the gate parameters in their ranges, norm_w around 1, the pool scaled by
 * 1/sqrt(dk). */
static bool prob_make(prob *p, uint64_t seed)
{
    tst_rng r = tst_rng_make(seed);
    const size_t T = p->T, nq = T * p->hk * p->dk, nv = T * p->hv * p->dv, ng = T * p->hv;
    const size_t np = (size_t)p->n_slots * p->hv * p->dk * p->dv, es = lmk_dtype_size(p->dtype);
    p->q = malloc(nq * es), p->k = malloc(nq * es), p->v = malloc(nv * es), p->zz = malloc(nv * es);
    p->pool = malloc(np * lmk_dtype_size(p->state_dtype) + 1);
    p->a = malloc(ng * 4), p->b = malloc(ng * 4), p->A_log = malloc(p->hv * 4), p->dt_bias = malloc(p->hv * 4);
    p->norm_w = malloc(p->dv * 4);
    p->q32 = malloc(nq * 4), p->k32 = malloc(nq * 4), p->v32 = malloc(nv * 4), p->z32 = malloc(nv * 4);
    p->pool32 = malloc(np * 4 + 1);
    if (!p->q || !p->k || !p->v || !p->zz || !p->pool || !p->a || !p->b || !p->A_log || !p->dt_bias || !p->norm_w ||
        !p->q32 || !p->k32 || !p->v32 || !p->z32 || !p->pool32)
        return TST_REQUIRE(0, "out of host memory for a T=%u problem", p->T);
    const double qk = p->flags & LMK_GDN_NO_L2NORM ? 0.5 / sqrt((double)p->dk) : 2.0;
    fill_pair(&r, p->dtype, p->q, p->q32, nq, -qk, qk);
    fill_pair(&r, p->dtype, p->k, p->k32, nq, -qk, qk);
    fill_pair(&r, p->dtype, p->v, p->v32, nv, -2.0, 2.0);
    fill_pair(&r, p->dtype, p->zz, p->z32, nv, -2.0, 2.0);
    fill_pair(&r, LMK_F32, p->a, p->a, ng, -2.0, 2.0);
    fill_pair(&r, LMK_F32, p->b, p->b, ng, -2.0, 2.0);
    fill_pair(&r, LMK_F32, p->A_log, p->A_log, p->hv, p->alog_lo, p->alog_hi);
    fill_pair(&r, LMK_F32, p->dt_bias, p->dt_bias, p->hv, p->dt_lo, p->dt_hi);
    fill_pair(&r, LMK_F32, p->norm_w, p->norm_w, p->dv, 0.5 - p->norm.weight_offset, 1.5 - p->norm.weight_offset);
    const double ps = 2.0 / sqrt((double)p->dk);
    for (size_t row = 0; row < p->n_slots; row++)
        for (size_t h = 0; h < p->hv; h++)
            for (size_t i = 0; i < p->dk; i++)
                for (size_t j = 0; j < p->dv; j++) {
                    const size_t at = pool_at(p, row, h, i, j);
                    tst_store(p->state_dtype, p->pool, at, uni(&r, -ps, ps));
                    p->pool32[((row * p->hv + h) * p->dk + i) * p->dv + j] =
                        (float)tst_load(p->state_dtype, p->pool, at);
                }
    return true;
}

/* A problem's defaults: Qwen3.5's gates (A_log in [-2, 1), dt_bias in [-4, 0)), eps 1e-6. */
static prob prob_shape(uint32_t T, uint32_t hk, uint32_t hv, uint32_t dk, uint32_t dv, uint32_t n_slots,
                       lmk_dtype dtype, lmk_dtype state_dtype)
{
    return (prob){.T = T, .hk = hk, .hv = hv, .dk = dk, .dv = dv, .n_slots = n_slots, .dtype = dtype,
                  .state_dtype = state_dtype, .map = LMK_REPEAT_BLOCK, .z = true, .raw = true,
                  .norm = {.eps = 1e-6f}, .alog_lo = -2.0, .alog_hi = 1.0, .dt_lo = -4.0, .dt_hi = 0.0};
}

static float resolved_scale(const prob *p)
{
    return p->scale != 0.0f ? p->scale : 1.0f / sqrtf((float)p->dk);
}

/* lmk_ref_gated_delta_rule over the f32 images: tokens [0, T), sequences of cu (i32, NULL: one),
 * rows of slots (i32, NULL: row s) of pool32 (dense f32, read and updated), out32 [T, Hv, dv]. */
static void ref_run(const prob *p, const int32_t *cu, size_t n_seq, const int32_t *slots, float *pool32,
                    float *out32)
{
    const size_t hk = p->hk, hv = p->hv, dk = p->dk, dv = p->dv;
    const lmk_gdn_args a = {
        .q = p->q32, .k = p->k32, .v = p->v32, .out = out32, .dtype = LMK_F32, .T = p->T, .Hk = hk, .Hv = hv,
        .dk = dk, .dv = dv, .q_tok = hk * dk, .q_head = dk, .k_tok = hk * dk, .k_head = dk, .v_tok = hv * dv,
        .v_head = dv, .o_tok = hv * dv, .o_head = dv, .a = p->a, .b = p->b, .a_dtype = LMK_F32,
        .b_dtype = LMK_F32, .a_tok = hv, .b_tok = hv, .A_log = p->raw ? p->A_log : NULL,
        .dt_bias = p->raw ? p->dt_bias : NULL, .A_dtype = LMK_F32, .dt_dtype = LMK_F32,
        .z = p->z ? p->z32 : NULL, .z_dtype = LMK_F32, .z_tok = hv * dv, .z_head = dv,
        .norm_w = p->z ? p->norm_w : NULL, .nw_dtype = LMK_F32, .cu_seqlens = cu, .slots = slots,
        .n_seq = n_seq, .state = pool32, .state_dtype = LMK_F32, .n_slots = pool32 ? p->n_slots : 0,
        .s_slot = hv * dk * dv, .s_head = dk * dv, .s_k = dv, .s_v = 1, .head_map = p->map,
        .scale = resolved_scale(p), .l2norm = !(p->flags & LMK_GDN_NO_L2NORM), .eps = p->norm.eps,
        .weight_offset = p->norm.weight_offset};
    lmk_ref_gated_delta_rule(&a);
}

/* x rounded to bf16 or f16 through f32, as the library converts. */
static double round_to(lmk_dtype t, double x)
{
    const float f = (float)x;
    return t == LMK_BF16 ? lmk_bf16_to_f32(lmk_f32_to_bf16(f)) : lmk_f16_to_f32(lmk_f32_to_f16(f));
}

/* ------------------------------------------------------------------------------------------------
 * norm-wise comparisons (lmk.h's precision)
 * ---------------------------------------------------------------------------------------------- */

/* The contract's relative tolerance: 1e-4 for f32 q/k/v/out and an f32 state, else 4e-3. */
static double tol_of(const prob *p)
{
    return p->dtype == LMK_F32 && p->state_dtype == LMK_F32 ? 1e-4 : 4e-3;
}

/* Output rows whose o = S^T qn cancels by more than this are held to tol times their terms' size
 * ||m|| / COND_MAX (case.c, "the magnitude of each output row before cancellation"). */
#define COND_MAX 16.0

/* ||got - ref|| / (tol * max(||ref||, mag / COND_MAX) + the norm of half an ulp of t at each
 * element): at most 1 within lmk.h's bound (the stored dtype's own rounding counted in; mag 0 for
 * state rows). Infinity for a non-finite got. */
static double row_ratio(lmk_dtype t, const float *got, const float *ref, size_t n, double tol, double mag)
{
    double e2 = 0.0, r2 = 0.0, u2 = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double g = got[i], w = ref[i];
        if (!isfinite(g))
            return INFINITY;
        const double half = 0.5 * lmk_ulp(t, fmax(fabs(g), fabs(w)));
        e2 += (g - w) * (g - w), r2 += w * w, u2 += half * half;
    }
    return sqrt(e2) / (tol * fmax(fmax(sqrt(r2), 1e-30), mag / COND_MAX) + sqrt(u2));
}

/* The largest row_ratio over the out rows of tokens [t0, t1) (dense [T, Hv, dv] arrays; mag the
 * rows' ||m|| from model_run; NULL: the plain bound). */
static double out_ratio(const prob *p, const float *got, const float *ref, const float *mag, size_t t0, size_t t1,
                        double tol)
{
    double worst = 0.0;
    for (size_t t = t0; t < t1; t++)
        for (size_t h = 0; h < p->hv; h++) {
            const size_t at = (t * p->hv + h) * p->dv;
            worst = fmax(worst, row_ratio(p->dtype, got + at, ref + at, p->dv, tol, mag ? mag[t * p->hv + h] : 0.0));
        }
    return worst;
}

/* The largest row_ratio over the heads of pool row `row` (got dense as pool32, in the pool's
 * dtype; ref dense f32), each head's [dk, dv] state as one vector. */
static double pool_ratio(const prob *p, const float *got, const float *ref, size_t row, double tol)
{
    double worst = 0.0;
    const size_t n = (size_t)p->dk * p->dv;
    for (size_t h = 0; h < p->hv; h++) {
        const size_t at = (row * p->hv + h) * n;
        worst = fmax(worst, row_ratio(p->state_dtype, got + at, ref + at, n, tol, 0.0));
    }
    return worst;
}

/* ------------------------------------------------------------------------------------------------
 * problems on a device: every operand inside guard bytes, calls on token ranges
 * ---------------------------------------------------------------------------------------------- */

#define GUARD 256

enum { DQ, DK, DV, DA, DB, DALOG, DDT, DZ, DNW, DPOOL, DOUT, N_DBUF };

/* Each operand is a view at `guard` bytes into a u8 parent of guard + bytes + guard bytes, whose
 * image (poisoned guards, the operand's bytes; out poisoned) is what it holds before a call. With
 * guard 0 every operand ends where its allocation ends, so that AddressSanitizer sees a read past
 * it. */
typedef struct dprob {
    size_t guard;
    lmk_buffer *parent[N_DBUF];
    size_t bytes[N_DBUF];
    unsigned char *image[N_DBUF];
} dprob;

static void dprob_free(dprob *dp)
{
    for (int i = 0; i < N_DBUF; i++) {
        lmk_buffer_free(dp->parent[i]);
        free(dp->image[i]);
    }
    memset(dp, 0, sizeof *dp);
}

static bool dprob_make_guarded(tst_dev *d, const prob *p, dprob *dp, size_t guard)
{
    memset(dp, 0, sizeof *dp);
    dp->guard = guard;
    const size_t es = lmk_dtype_size(p->dtype), T = p->T;
    const size_t pool_bytes = (size_t)p->n_slots * p->hv * p->dk * p->dv * lmk_dtype_size(p->state_dtype);
    const void *src[N_DBUF] = {p->q, p->k, p->v, p->a, p->b, p->A_log, p->dt_bias, p->zz, p->norm_w, p->pool, NULL};
    const size_t bytes[N_DBUF] = {T * p->hk * p->dk * es, T * p->hk * p->dk * es, T * p->hv * p->dv * es,
                                  T * p->hv * 4, T * p->hv * 4, p->hv * 4, p->hv * 4, T * p->hv * p->dv * es,
                                  p->dv * 4, pool_bytes, T * p->hv * p->dv * es};
    for (int i = 0; i < N_DBUF; i++) {
        dp->bytes[i] = bytes[i];
        dp->image[i] = malloc(2 * guard + bytes[i] + 1);
        if (!TST_REQUIRE(dp->image[i], "out of host memory"))
            return false;
        memset(dp->image[i], TST_POISON, 2 * guard + bytes[i]);
        if (src[i])
            memcpy(dp->image[i] + guard, src[i], bytes[i]);
        const size_t len = 2 * guard + bytes[i];
        dp->parent[i] = tst_buf(d->dev, LMK_U8, NULL, 0, len, 0, dp->image[i], len, -1);
        if (!dp->parent[i])
            return false;
    }
    return true;
}

static bool dprob_make(tst_dev *d, const prob *p, dprob *dp)
{
    return dprob_make_guarded(d, p, dp, GUARD);
}

/* Every parent back to its image (inputs, the original pool, poisoned out). */
static bool dprob_reset(dprob *dp)
{
    for (int i = 0; i < N_DBUF; i++)
        if (lmk_buffer_write(dp->parent[i], 0, dp->image[i], 2 * dp->guard + dp->bytes[i]) != LMK_OK)
            return TST_REQUIRE(0, "reset: %s", lmk_last_error());
    return true;
}

/* One call: tokens [t0, t1) of the problem, sequences and rows from cu and slots (i32 or i64
 * host arrays; NULL: one sequence, row s), the pool unless no_state. */
typedef struct call_spec {
    uint32_t t0, t1;
    const void *cu, *slots;
    size_t n_cu, n_slots;
    lmk_dtype cu_dtype, slot_dtype;
    bool no_state;
    lmk_buffer *workspace; /* io->workspace */
    lmk_buffer *a_view;    /* replaces the a operand (NULL: a view of the problem's a) */
    size_t *query;         /* non-NULL: lmk_gated_delta_rule_workspace into *query instead of the call */
} call_spec;

/* A view of `dt` with `nd` axes at element `at` of operand i. */
static lmk_buffer *view_of(const dprob *dp, int i, size_t at, lmk_dtype dt, const size_t *shape, int nd)
{
    lmk_buffer *v = NULL;
    const lmk_status st = lmk_buffer_view(dp->parent[i], dp->guard + at * lmk_dtype_size(dt), dt, shape, nd, &v);
    return TST_REQUIRE(st == LMK_OK, "view: %s", lmk_last_error()) ? v : NULL;
}

static lmk_buffer *pool_view(const prob *p, const dprob *dp)
{
    const size_t n[4] = {p->n_slots, p->hv, p->dk, p->dv};
    const size_t s[4] = {(size_t)p->hv * p->dk * p->dv, (size_t)p->dk * p->dv, p->kfast ? 1 : p->dv,
                         p->kfast ? p->dk : 1};
    lmk_buffer *v = NULL;
    const lmk_status st = lmk_buffer_view_strided(dp->parent[DPOOL], dp->guard, p->state_dtype, n, s, 4, &v);
    return TST_REQUIRE(st == LMK_OK, "pool view: %s", lmk_last_error()) ? v : NULL;
}

static lmk_buffer *index_buf(tst_dev *d, const void *host, size_t n, lmk_dtype t)
{
    const size_t shape[1] = {n};
    return host ? tst_buf(d->dev, t, shape, 1, n * lmk_dtype_size(t), 0, host, n * lmk_dtype_size(t), -1) : NULL;
}

static lmk_status call_range(tst_dev *d, const prob *p, dprob *dp, const call_spec *c)
{
    const size_t n = c->t1 - c->t0, t0 = c->t0, hk = p->hk, hv = p->hv, dk = p->dk, dv = p->dv;
    const size_t sq[3] = {n, hk, dk}, sv[3] = {n, hv, dv}, sg[2] = {n, hv}, sh[1] = {hv}, sw[1] = {dv};
    lmk_buffer *b[N_DBUF] = {NULL};
    b[DQ] = view_of(dp, DQ, t0 * hk * dk, p->dtype, sq, 3);
    b[DK] = view_of(dp, DK, t0 * hk * dk, p->dtype, sq, 3);
    b[DV] = view_of(dp, DV, t0 * hv * dv, p->dtype, sv, 3);
    b[DA] = c->a_view ? NULL : view_of(dp, DA, t0 * hv, LMK_F32, sg, 2);
    b[DB] = view_of(dp, DB, t0 * hv, LMK_F32, sg, 2);
    b[DALOG] = p->raw ? view_of(dp, DALOG, 0, LMK_F32, sh, 1) : NULL;
    b[DDT] = p->raw ? view_of(dp, DDT, 0, LMK_F32, sh, 1) : NULL;
    b[DZ] = p->z ? view_of(dp, DZ, t0 * hv * dv, p->dtype, sv, 3) : NULL;
    b[DNW] = p->z ? view_of(dp, DNW, 0, LMK_F32, sw, 1) : NULL;
    b[DPOOL] = c->no_state ? NULL : pool_view(p, dp);
    b[DOUT] = view_of(dp, DOUT, t0 * hv * dv, p->dtype, sv, 3);
    lmk_buffer *cu = index_buf(d, c->cu, c->n_cu, c->cu_dtype ? c->cu_dtype : LMK_I32);
    lmk_buffer *slots = index_buf(d, c->slots, c->n_slots, c->slot_dtype ? c->slot_dtype : LMK_I32);
    const lmk_gdn_io io = {.q = b[DQ], .k = b[DK], .v = b[DV], .a = c->a_view ? c->a_view : b[DA], .b = b[DB],
                           .A_log = b[DALOG], .dt_bias = b[DDT], .cu_seqlens = cu, .state_slots = slots,
                           .state = b[DPOOL], .z = b[DZ], .norm_w = b[DNW], .out = b[DOUT],
                           .workspace = c->workspace};
    const lmk_gdn_params prm = {.seq_len = (uint32_t)n, .n_k_heads = p->hk, .n_v_heads = p->hv, .k_dim = p->dk,
                                .v_dim = p->dv, .head_map = p->map, .scale = p->scale, .flags = p->flags,
                                .norm = p->norm};
    lmk_status st = c->query ? lmk_gated_delta_rule_workspace(d->stream, &io, &prm, c->query)
                             : lmk_gated_delta_rule(d->stream, &io, &prm);
    if (st == LMK_OK && !c->query)
        st = lmk_stream_sync(d->stream);
    for (int i = 0; i < N_DBUF; i++)
        lmk_buffer_free(b[i]);
    lmk_buffer_free(cu);
    lmk_buffer_free(slots);
    return st;
}

/* Operand i read back whole (guards included); NULL after a failed check. */
static unsigned char *read_parent(const dprob *dp, int i)
{
    return tst_read_all(dp->parent[i]);
}

/* out read back and widened: dense [T, Hv, dv] f32. */
static float *read_out(const prob *p, const dprob *dp)
{
    unsigned char *raw = read_parent(dp, DOUT);
    const size_t n = (size_t)p->T * p->hv * p->dv;
    float *w = raw ? malloc(n * sizeof *w) : NULL;
    for (size_t i = 0; w && i < n; i++)
        w[i] = (float)tst_load(p->dtype, raw + dp->guard, i);
    free(raw);
    return w;
}

/* The pool read back and widened: dense [n_slots, Hv, dk, dv] f32, dv fastest. */
static float *read_pool(const prob *p, const dprob *dp)
{
    unsigned char *raw = read_parent(dp, DPOOL);
    const size_t n = (size_t)p->n_slots * p->hv * p->dk * p->dv;
    float *w = raw ? malloc(n * sizeof *w + 1) : NULL;
    for (size_t row = 0; w && row < p->n_slots; row++)
        for (size_t h = 0; h < p->hv; h++)
            for (size_t i = 0; i < p->dk; i++)
                for (size_t j = 0; j < p->dv; j++)
                    w[((row * p->hv + h) * p->dk + i) * p->dv + j] =
                        (float)tst_load(p->state_dtype, raw + dp->guard, pool_at(p, row, h, i, j));
    free(raw);
    return w;
}

/* Every byte outside out's elements and the pool rows marked in `may_change` holds its image. */
static bool untouched(const prob *p, const dprob *dp, const bool *may_change, char *msg, size_t n_msg)
{
    bool ok = true;
    const size_t es = lmk_dtype_size(p->state_dtype), row_elems = (size_t)p->hv * p->dk * p->dv;
    for (int i = 0; i < N_DBUF && ok; i++) {
        unsigned char *now = read_parent(dp, i);
        if (!now)
            return false;
        const size_t g = dp->guard;
        for (size_t at = 0; at < 2 * g + dp->bytes[i] && ok; at++) {
            const bool inside = at >= g && at < g + dp->bytes[i];
            if (inside && (i == DOUT || (i == DPOOL && may_change[(at - g) / es / row_elems])))
                continue;
            if (now[at] != dp->image[i][at]) {
                snprintf(msg, n_msg, "operand %d byte %zu changed (%s)", i, at, inside ? "inside" : "a guard");
                ok = false;
            }
        }
        free(now);
    }
    return ok;
}

/* ------------------------------------------------------------------------------------------------
 * the float64 model of lmk.h's formulas, and the wrong variants of SPEC section 12
 * ---------------------------------------------------------------------------------------------- */

enum {
    RIGHT,       /* lmk.h */
    BETA_BF16,   /* beta rounded to bf16 every token (vLLM #51779) */
    STATE_BF16,  /* the state rounded to bf16 after every token */
    STATE_F16,   /* the state rounded to f16 after every token (TensorRT-Model-Connect #725) */
    MAP_SWAPPED, /* the other head map (llama.cpp #19468, mlx-native) */
    TAIL_DECAY,  /* a sequence's end decays through the gates of the tokens after it, up to a chunk of
                    64 (cuLA #38: a short final chunk reading the wrong decay) */
    NEG_WRAP     /* slot -1 read as the pool's last row (Python indexing): unzeroed padding */
};

static double sigm(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

/* The decay exp(g) of token t, head h. */
static double model_decay(const prob *p, size_t t, size_t h)
{
    const double x = p->a[t * p->hv + h];
    if (!p->raw)
        return exp(x);
    const double y = x + p->dt_bias[h];
    const double sp = y > 30.0 ? y : log1p(exp(y));
    return exp(-exp((double)p->A_log[h]) * sp);
}

/* One token of head h on S: gates, normalised q and k, the delta rule, o, the output row. Returns
 * the row's ||m||, m_j = f_j * sum_i |S_ij qn_i| (f_j the output norm's factor, or 1). */
static double model_step(const prob *p, int variant, size_t t, size_t h, double *S, double *out)
{
    const size_t dk = p->dk, dv = p->dv;
    const bool block = (p->map == LMK_REPEAT_BLOCK) != (variant == MAP_SWAPPED);
    const size_t kh = block ? h / (p->hv / p->hk) : h % p->hk;
    const double bb = p->raw ? sigm(p->b[t * p->hv + h]) : p->b[t * p->hv + h];
    const double beta = variant == BETA_BF16 ? round_to(LMK_BF16, bb) : bb, decay = model_decay(p, t, h);
    double q[LMK_GDN_MAX_DIM], k[LMK_GDN_MAX_DIM], u[LMK_GDN_MAX_DIM], o[LMK_GDN_MAX_DIM], m[LMK_GDN_MAX_DIM];
    double qq = 0.0, kk = 0.0, mm = 0.0;
    for (size_t i = 0; i < dk; i++) {
        q[i] = p->q32[(t * p->hk + kh) * dk + i], k[i] = p->k32[(t * p->hk + kh) * dk + i];
        qq += q[i] * q[i], kk += k[i] * k[i];
    }
    const bool l2 = !(p->flags & LMK_GDN_NO_L2NORM);
    const double rq = (l2 ? 1.0 / sqrt(qq + 1e-6) : 1.0) * resolved_scale(p), rk = l2 ? 1.0 / sqrt(kk + 1e-6) : 1.0;
    for (size_t j = 0; j < dv; j++) {
        double sk = 0.0;
        for (size_t i = 0; i < dk; i++)
            sk += decay * S[i * dv + j] * k[i] * rk;
        u[j] = beta * (p->v32[(t * p->hv + h) * dv + j] - sk);
    }
    double ms = 0.0;
    for (size_t j = 0; j < dv; j++) {
        o[j] = m[j] = 0.0;
        for (size_t i = 0; i < dk; i++) {
            double s = decay * S[i * dv + j] + k[i] * rk * u[j];
            if (variant == STATE_BF16 || variant == STATE_F16)
                s = round_to(variant == STATE_BF16 ? LMK_BF16 : LMK_F16, s);
            S[i * dv + j] = s;
            o[j] += s * q[i] * rq, m[j] += fabs(s * q[i] * rq);
        }
        ms += o[j] * o[j];
    }
    const double r = 1.0 / sqrt(ms / (double)dv + (double)p->norm.eps);
    for (size_t j = 0; j < dv; j++) {
        const double z = p->z32[(t * p->hv + h) * dv + j];
        const double f = r * (p->norm_w[j] + (double)p->norm.weight_offset) * z * sigm(z);
        out[j] = p->z ? o[j] * f : o[j];
        mm += (p->z ? m[j] * fabs(f) : m[j]) * (p->z ? m[j] * fabs(f) : m[j]);
    }
    return sqrt(mm);
}

/* The model over a call: sequences of cu (i32, valid; NULL: one), rows of slots (NULL: row s) of
 * pool (dense f32 as pool32, read and updated; the last sequence naming a row stores it, every
 * one reads it as it was), out [T, Hv, dv], mag [T, Hv] each row's ||m||. */
static void model_run(const prob *p, int variant, const int32_t *cu, size_t n_seq, const int32_t *slots,
                      float *pool, float *out, float *mag)
{
    const size_t dk = p->dk, dv = p->dv, n = dk * dv;
    double *S = malloc(n * sizeof *S), row_out[LMK_GDN_MAX_DIM];
    float *before = malloc((size_t)p->n_slots * p->hv * n * sizeof *before + 1);
    if (!TST_REQUIRE(S && before, "out of host memory"))
        goto done;
    memcpy(before, pool, (size_t)p->n_slots * p->hv * n * sizeof *before);
    for (size_t s = 0; s < n_seq; s++) {
        const size_t lo = cu ? (size_t)cu[s] : 0, hi = cu ? (size_t)cu[s + 1] : p->T;
        int64_t row = slots ? slots[s] : (int64_t)s;
        if (variant == NEG_WRAP && row < 0)
            row += p->n_slots;
        const bool has = row >= 0 && row < (int64_t)p->n_slots;
        bool stores = has;
        for (size_t j = s + 1; j < n_seq && slots; j++)
            stores &= slots[j] != row;
        for (size_t h = 0; h < p->hv; h++) {
            for (size_t e = 0; e < n; e++)
                S[e] = has ? before[((size_t)row * p->hv + h) * n + e] : 0.0;
            for (size_t t = lo; t < hi; t++) {
                mag[t * p->hv + h] = (float)model_step(p, variant, t, h, S, row_out);
                for (size_t j = 0; j < dv; j++)
                    out[(t * p->hv + h) * dv + j] = (float)row_out[j];
            }
            for (size_t t = hi; variant == TAIL_DECAY && hi > lo && (t - lo) % 64; t++)
                for (size_t e = 0; e < n; e++)
                    S[e] *= model_decay(p, t < p->T ? t : p->T - 1, h);
            for (size_t e = 0; stores && e < n; e++)
                pool[((size_t)row * p->hv + h) * n + e] = (float)S[e];
        }
    }
done:
    free(S);
    free(before);
}

/* ------------------------------------------------------------------------------------------------
 * the case table, random cases and the descriptor's invalid calls
 * ---------------------------------------------------------------------------------------------- */

static void test_table(tst_dev *d)
{
    const tst_op *op = tst_op_find("gated_delta_rule");
    if (!TST_REQUIRE(op, "gated_delta_rule is not in the registry"))
        return;
    int n_table = 0, n_random = 0;
    tst_result res;
    for (int i = 0; i < op->n_cases(); i++) {
        const tst_case c = tst_op_case(op, i);
        if (c.flags & TST_CASE_FULL)
            continue;
        const uint64_t seed = tst_case_seed();
        CHECK(tst_case_check(&c, d->stream, seed, &res, NULL), "%s [%s] seed 0x%016" PRIx64 ": %s", c.name, d->name,
              seed, res.msg);
        n_table++;
    }
    const int count = tst_quick() ? 25 : 100;
    tst_rng r = tst_rng_make(tst_case_seed());
    for (int i = 0; i < count; i++, n_random++) {
        const tst_case c = tst_op_random_case(op, &r);
        const uint64_t seed = tst_rng_u64(&r);
        CHECK(tst_case_check(&c, d->stream, seed, &res, NULL), "%s [%s] seed 0x%016" PRIx64 ": %s", c.name, d->name,
              seed, res.msg);
    }
    tst_inst *in = NULL;
    const tst_case c0 = tst_op_case(op, 0);
    if (TST_REQUIRE(tst_inst_make(&c0, d->dev, 1, 0, NULL, &in) == LMK_OK, "make: %s", lmk_last_error()))
        for (int k = 0; k < op->n_invalid; k++)
            CHECK(tst_inst_reject(in, d->stream, k, &res), "%s [%s] invalid call %d: %s", c0.name, d->name, k, res.msg);
    tst_inst_free(in);
    printf("table [%s]: %d table cases, %d random cases, %d invalid calls\n", d->name, n_table, n_random,
           op->n_invalid);
}

/* The same bits from streams of 1, 2 and 3 threads (lmk.h: deterministic whatever the thread
 * count), on the table's cases of moderate size and a few random ones. */
static void test_thread_bits(lmk_device *cpu)
{
    const tst_op *op = tst_op_find("gated_delta_rule");
    tst_rng r = tst_rng_make(tst_case_seed());
    int n = 0;
    for (int i = 0; op && i < op->n_cases() + 4; i++) {
        const tst_case c = i < op->n_cases() ? tst_op_case(op, i) : tst_op_random_case(op, &r);
        if ((c.flags & TST_CASE_FULL) || op->bytes(&c) > 48e6)
            continue;
        tst_inst *in = NULL;
        const uint64_t seed = tst_case_seed();
        if (!TST_REQUIRE(tst_inst_make(&c, cpu, seed, 0, NULL, &in) == LMK_OK, "make: %s", lmk_last_error()))
            continue;
        unsigned char *first[TST_MAX_REGIONS] = {NULL};
        bool same = true;
        for (int nt = 1; nt <= 3 && same; nt++) {
            lmk_stream *s = NULL;
            lmk_status st = lmk_device_set_threads(cpu, nt);
            if (st == LMK_OK)
                st = lmk_stream_create(cpu, &s);
            if (st == LMK_OK)
                st = tst_inst_reset(in, seed);
            if (st == LMK_OK)
                st = tst_inst_run(in, s);
            if (st == LMK_OK)
                st = lmk_stream_sync(s);
            lmk_stream_destroy(s);
            same = TST_REQUIRE(st == LMK_OK, "%s, %d threads: %s", c.name, nt, lmk_last_error());
            for (int g = 0; g < in->mem.n_r && same; g++) {
                unsigned char *now = tst_mem_download(&in->mem, g);
                same = now && (nt == 1 || memcmp(now, first[g], in->mem.r[g].len) == 0);
                if (nt == 1)
                    first[g] = now;
                else
                    free(now);
            }
        }
        CHECK(same, "%s: streams of 1, 2 and 3 threads give different bits", c.name);
        for (int g = 0; g < TST_MAX_REGIONS; g++)
            free(first[g]);
        tst_inst_free(in);
        n++;
    }
    lmk_device_set_threads(cpu, 0);
    printf("threads: %d cases bit-identical on streams of 1, 2 and 3 threads\n", n);
}

/* ------------------------------------------------------------------------------------------------
 * one call = the same tokens split across calls = one token a call; varlen batch = each alone
 * ---------------------------------------------------------------------------------------------- */

/* What one form of a computation left: out and the pool, widened. */
typedef struct result {
    float *out, *pool;
    float *mag; /* model results: each out row's ||m|| */
} result;

static void result_free(result *r)
{
    free(r->out);
    free(r->pool);
    free(r->mag);
    r->out = r->pool = r->mag = NULL;
}

static bool result_read(const prob *p, const dprob *dp, result *r)
{
    r->out = read_out(p, dp);
    r->pool = read_pool(p, dp);
    return r->out && r->pool;
}

/* A call the model runs: a variant, sequences and rows. */
typedef struct trap {
    const char *what;
    int variant;
    const int32_t *cu, *slots;
    size_t n_seq;
} trap;

/* The model's result for a variant (variant < 0: only the pool's initial copy). */
static bool model_result(const prob *p, int variant, const trap *t, result *r)
{
    const size_t np = (size_t)p->n_slots * p->hv * p->dk * p->dv;
    r->out = malloc((size_t)p->T * p->hv * p->dv * sizeof *r->out);
    r->pool = malloc(np * sizeof *r->pool + 1);
    r->mag = calloc((size_t)p->T * p->hv, sizeof *r->mag);
    if (!TST_REQUIRE(r->out && r->pool && r->mag, "out of host memory"))
        return false;
    memcpy(r->pool, p->pool32, np * sizeof *r->pool);
    if (variant >= 0)
        model_run(p, variant, t->cu, t->n_seq, t->slots, r->pool, r->out, r->mag);
    return true;
}

/* The largest bound fraction of `got` against `want` over out rows [t0, t1) (rows' ||m|| in mag)
 * and pool row `row` (none when row < 0). */
static double result_ratio(const prob *p, const result *got, const result *want, const float *mag, size_t t0,
                           size_t t1, int64_t row)
{
    const double tol = tol_of(p);
    double worst = out_ratio(p, got->out, want->out, mag, t0, t1, tol);
    if (row >= 0)
        worst = fmax(worst, pool_ratio(p, got->pool, want->pool, (size_t)row, tol));
    return worst;
}

/* Calls on consecutive token ranges [cuts[i], cuts[i+1]) of one sequence in pool row 1. */
static bool run_pieces(tst_dev *d, const prob *p, dprob *dp, const uint32_t *cuts, int n_pieces, result *r)
{
    static const int32_t row1[1] = {1};
    if (!dprob_reset(dp))
        return false;
    for (int i = 0; i < n_pieces; i++) {
        const call_spec c = {.t0 = cuts[i], .t1 = cuts[i + 1], .slots = row1, .n_slots = 1};
        const lmk_status st = call_range(d, p, dp, &c);
        if (!TST_REQUIRE(st == LMK_OK, "[%s] tokens [%u, %u): %s", d->name, cuts[i], cuts[i + 1], lmk_last_error()))
            return false;
    }
    return result_read(p, dp, r);
}

/* The reference of the same pieces: each call reads the pool row widened and stores it rounded
 * once to the pool's dtype (lmk.h), so a bf16 pool is rounded at every cut. */
static bool ref_pieces(const prob *p, const uint32_t *cuts, int n_pieces, result *r)
{
    static const int32_t row1[1] = {1};
    const size_t np = (size_t)p->n_slots * p->hv * p->dk * p->dv;
    r->out = malloc((size_t)p->T * p->hv * p->dv * sizeof *r->out);
    r->pool = malloc(np * sizeof *r->pool);
    if (!TST_REQUIRE(r->out && r->pool, "out of host memory"))
        return false;
    memcpy(r->pool, p->pool32, np * sizeof *r->pool);
    for (int i = 0; i < n_pieces; i++) {
        const int32_t cu[2] = {(int32_t)cuts[i], (int32_t)cuts[i + 1]};
        ref_run(p, cu, 1, row1, r->pool, r->out);
        for (size_t e = 0; e < np && p->state_dtype != LMK_F32; e++)
            r->pool[e] = (float)round_to(p->state_dtype, r->pool[e]);
    }
    return true;
}

/* lmk on `pieces` against their reference, and, for an f32 pool, against one call (with a bf16
 * pool the pieces round the state at each cut: a different function). Returns the fraction of
 * the bound from one call; *r_ref gets the one from the pieces' reference. */
static double check_pieces(tst_dev *d, const prob *p, dprob *dp, const uint32_t *cuts, int n_pieces,
                           const result *one, const float *mag, double *r_ref, bool *bit_equal)
{
    result got = {0}, ref = {0};
    double r_one = INFINITY;
    *r_ref = INFINITY;
    if (run_pieces(d, p, dp, cuts, n_pieces, &got) && ref_pieces(p, cuts, n_pieces, &ref)) {
        *r_ref = result_ratio(p, &got, &ref, mag, 0, p->T, 1);
        r_one = result_ratio(p, &got, one, mag, 0, p->T, 1);
        *bit_equal = !memcmp(got.out, one->out, (size_t)p->T * p->hv * p->dv * sizeof(float));
    }
    result_free(&got), result_free(&ref);
    return r_one;
}

static void test_split(tst_dev *d, lmk_dtype dtype, lmk_dtype state_dtype, bool kfast)
{
    prob p = prob_shape(12, 2, 4, 32, 24, 3, dtype, state_dtype);
    p.kfast = kfast;
    dprob dp = {0};
    result one = {0}, model = {0};
    static const int32_t row1[1] = {1};
    const uint32_t T = p.T, whole[2] = {0, T};
    const bool f32_pool = state_dtype == LMK_F32;
    char what[96];
    snprintf(what, sizeof what, "%s inputs, %s state%s", lmk_dtype_name(dtype), lmk_dtype_name(state_dtype),
             kfast ? " dk fastest" : "");
    if (!prob_make(&p, tst_case_seed()) || !dprob_make(d, &p, &dp) || !run_pieces(d, &p, &dp, whole, 1, &one) ||
        !model_result(&p, RIGHT, &(trap){.slots = row1, .n_seq = 1}, &model))
        goto done;
    double r_ref, worst_one = 0.0, worst_ref = 0.0;
    bool same;
    int n_same = 0;
    check_pieces(d, &p, &dp, whole, 1, &one, model.mag, &r_ref, &same);
    CHECK(r_ref <= 1.0, "split [%s] %s: one call at %.3g of the bound from float64", d->name, what, r_ref);
    const double r_whole = r_ref;
    for (uint32_t m = 1; m < T; m++) {
        const uint32_t cuts[3] = {0, m, T};
        worst_one = fmax(worst_one, check_pieces(d, &p, &dp, cuts, 2, &one, model.mag, &r_ref, &same));
        worst_ref = fmax(worst_ref, r_ref);
        n_same += same;
    }
    CHECK(worst_ref <= 1.0 && (!f32_pool || worst_one <= 1.0),
          "split [%s] %s: split at some token %.3g of the bound from its float64 reference, %.3g from one call",
          d->name, what, worst_ref, worst_one);
    uint32_t cuts[64];
    for (uint32_t t = 0; t <= T && t < 64; t++)
        cuts[t] = t;
    const double tok_one = check_pieces(d, &p, &dp, cuts, (int)T, &one, model.mag, &r_ref, &same);
    CHECK(r_ref <= 1.0 && (!f32_pool || tok_one <= 1.0),
          "split [%s] %s: one token a call %.3g of the bound from its float64 reference, %.3g from one call", d->name,
          what, r_ref, tok_one);
    printf("split [%s] %s: one call %.3f of the bound from float64; split at each of %u tokens %.3f from one call "
           "(%d bit-identical), %.3f from float64; one token a call %.3f from one call, %.3f from float64\n",
           d->name, what, r_whole, T - 1, worst_one, n_same, worst_ref, tok_one, r_ref);
done:
    result_free(&one), result_free(&model);
    dprob_free(&dp);
    prob_free(&p);
}

/* A varlen batch (empty and one-token sequences, a padding slot, rows shuffled) against each
 * sequence alone on the original pool. */
static void test_varlen_alone(tst_dev *d)
{
    prob p = prob_shape(30, 2, 6, 16, 32, 8, LMK_F32, LMK_F32);
    static const int32_t cu[6] = {0, 7, 7, 8, 20, 30}, slots[5] = {5, 0, -1, 2, 7};
    dprob dp = {0};
    result batch = {0}, alone = {0}, model = {0};
    double worst = 0.0;
    if (!prob_make(&p, tst_case_seed()) || !dprob_make(d, &p, &dp) ||
        !model_result(&p, RIGHT, &(trap){.cu = cu, .slots = slots, .n_seq = 5}, &model))
        goto done;
    const call_spec all = {.t0 = 0, .t1 = p.T, .cu = cu, .n_cu = 6, .slots = slots, .n_slots = 5};
    if (!TST_REQUIRE(call_range(d, &p, &dp, &all) == LMK_OK, "[%s] batch: %s", d->name, lmk_last_error()) ||
        !result_read(&p, &dp, &batch))
        goto done;
    CHECK(!memcmp(batch.pool, p.pool32, (size_t)p.hv * p.dk * p.dv * sizeof(float)),
          "varlen [%s]: row 0, named by an empty sequence, changed", d->name);
    for (int s = 0; s < 5; s++) {
        if (cu[s + 1] == cu[s])
            continue;
        const call_spec one = {.t0 = (uint32_t)cu[s], .t1 = (uint32_t)cu[s + 1], .slots = &slots[s], .n_slots = 1};
        if (!dprob_reset(&dp) ||
            !TST_REQUIRE(call_range(d, &p, &dp, &one) == LMK_OK, "[%s] alone: %s", d->name, lmk_last_error()) ||
            !result_read(&p, &dp, &alone))
            goto done;
        worst = fmax(worst, result_ratio(&p, &batch, &alone, model.mag, (size_t)cu[s], (size_t)cu[s + 1], slots[s]));
        result_free(&alone);
    }
    CHECK(worst <= 1.0, "varlen [%s]: the batch is %.3g of the bound from each sequence alone", d->name, worst);
    printf("varlen [%s]: batch of 5 (lengths 7, 0, 1, 12, 10; a padding slot) against each alone: %.3f of the "
           "bound\n",
           d->name, worst);
done:
    result_free(&batch), result_free(&alone), result_free(&model);
    dprob_free(&dp);
    prob_free(&p);
}

/* ------------------------------------------------------------------------------------------------
 * SPEC section 12: the traps, each a wrong float64 variant the tolerance must reject
 * ---------------------------------------------------------------------------------------------- */

/* The largest bound fraction over every out row and every pool row of got against want (out rows'
 * ||m|| in mag, NULL: the plain bound). */
static double full_ratio(const prob *p, const result *got, const result *want, const float *mag)
{
    double worst = out_ratio(p, got->out, want->out, mag, 0, p->T, tol_of(p));
    for (size_t row = 0; row < p->n_slots; row++)
        worst = fmax(worst, pool_ratio(p, got->pool, want->pool, row, tol_of(p)));
    return worst;
}

/* lmk must be within the bound of the model's right answer, the wrong variant outside it; the
 * model itself must agree with lmk_ref_gated_delta_rule. */
static void run_trap(tst_dev *d, prob *p, const trap *t)
{
    dprob dp = {0};
    result got = {0}, right = {0}, wrong = {0}, ref = {0};
    if (!prob_make(p, tst_case_seed()) || !dprob_make(d, p, &dp) || !model_result(p, RIGHT, t, &right) ||
        !model_result(p, t->variant, t, &wrong) || !model_result(p, -1, t, &ref))
        goto done;
    ref_run(p, t->cu, t->n_seq, t->slots, ref.pool, ref.out);
    const call_spec c = {.t0 = 0, .t1 = p->T, .cu = t->cu, .n_cu = t->cu ? t->n_seq + 1 : 0, .slots = t->slots,
                         .n_slots = t->slots ? t->n_seq : 0};
    if (!TST_REQUIRE(call_range(d, p, &dp, &c) == LMK_OK, "trap %s [%s]: %s", t->what, d->name, lmk_last_error()) ||
        !result_read(p, &dp, &got))
        goto done;
    const double r_model = full_ratio(p, &right, &ref, NULL), r_lmk = full_ratio(p, &got, &right, right.mag);
    const double r_wrong = full_ratio(p, &wrong, &right, right.mag);
    CHECK(r_model <= 1e-2, "trap %s: the test's float64 model is %.3g of the bound from lmk_ref_gated_delta_rule",
          t->what, r_model);
    CHECK(r_lmk <= 1.0 && r_wrong > 1.0,
          "trap %s [%s]: lmk at %.3g of the bound (must be <= 1), the wrong variant at %.3g (must be > 1)", t->what,
          d->name, r_lmk, r_wrong);
    printf("trap [%s] %-58s lmk %.3f, wrong variant %8.1f of the bound (tol %.0e)\n", d->name, t->what, r_lmk,
           r_wrong, tol_of(p));
done:
    result_free(&got), result_free(&right), result_free(&wrong), result_free(&ref);
    dprob_free(&dp);
    prob_free(p);
}

static void test_traps(tst_dev *d)
{
    static const int32_t tail_cu[7] = {0, 65, 66, 129, 259, 259, 266}, tail_slots[6] = {0, 1, 2, 3, 4, 5};
    static const int32_t pad_cu[4] = {0, 6, 13, 20}, pad_slots[3] = {-1, 2, 4};
    prob p = prob_shape(64, 2, 4, 32, 32, 1, LMK_F32, LMK_F32);
    run_trap(d, &p, &(trap){"beta rounded to bf16 each token (f32)", BETA_BF16, NULL, NULL, 1});
    p = prob_shape(64, 2, 4, 32, 32, 1, LMK_F32, LMK_F32);
    run_trap(d, &p, &(trap){"state rounded to bf16 each token (f32)", STATE_BF16, NULL, NULL, 1});
    p = prob_shape(64, 2, 4, 32, 32, 1, LMK_F32, LMK_F32);
    run_trap(d, &p, &(trap){"state rounded to f16 each token (f32)", STATE_F16, NULL, NULL, 1});
    /* A bf16 model with a bf16 pool (tol 4e-3) and long memory: rounding the pool's dtype each
     * token instead of once at the end. */
    p = prob_shape(512, 1, 2, 64, 64, 1, LMK_BF16, LMK_BF16);
    p.alog_lo = -4.0, p.alog_hi = -3.0, p.dt_lo = -3.0, p.dt_hi = -2.0;
    run_trap(d, &p, &(trap){"bf16 state rounded each token (bf16, bf16 pool)", STATE_BF16, NULL, NULL, 1});
    p = prob_shape(16, 2, 6, 16, 16, 1, LMK_F32, LMK_F32);
    run_trap(d, &p, &(trap){"BLOCK read as TILED", MAP_SWAPPED, NULL, NULL, 1});
    p = prob_shape(16, 2, 6, 16, 16, 1, LMK_BF16, LMK_BF16);
    p.map = LMK_REPEAT_TILED;
    run_trap(d, &p, &(trap){"TILED read as BLOCK (bf16)", MAP_SWAPPED, NULL, NULL, 1});
    p = prob_shape(266, 2, 4, 16, 16, 6, LMK_F32, LMK_F32);
    run_trap(d, &p, &(trap){"short final chunks decay past the end (65,1,63,130,0,7)", TAIL_DECAY, tail_cu,
                            tail_slots, 6});
    p = prob_shape(20, 1, 2, 16, 16, 4, LMK_F32, LMK_F32);
    run_trap(d, &p, &(trap){"padding slot -1 read as the last row", NEG_WRAP, pad_cu, pad_slots, 3});
}

/* ------------------------------------------------------------------------------------------------
 * precision on a long sequence
 * ---------------------------------------------------------------------------------------------- */

/* f32, one head, dk = dv = 128, T = 65,536 tokens with long memory (decays in (0.93, 1)): every
 * output row and the final state within 1e-4 of the float64 reference (lmk.h). */
static void test_long(tst_dev *d)
{
    const uint32_t T = tst_quick() ? 8192 : 65536;
    prob p = prob_shape(T, 1, 1, 128, 128, 1, LMK_F32, LMK_F32);
    p.alog_lo = -4.0, p.alog_hi = -3.0, p.dt_lo = -2.0, p.dt_hi = -1.0;
    dprob dp = {0};
    result got = {0}, ref = {0}, model = {0};
    if (!prob_make(&p, tst_case_seed()) || !dprob_make(d, &p, &dp) ||
        !model_result(&p, RIGHT, &(trap){.n_seq = 1}, &model))
        goto done;
    const double t0 = tst_now();
    const call_spec c = {.t0 = 0, .t1 = T};
    if (!TST_REQUIRE(call_range(d, &p, &dp, &c) == LMK_OK, "long [%s]: %s", d->name, lmk_last_error()) ||
        !result_read(&p, &dp, &got))
        goto done;
    const double t1 = tst_now();
    ref.out = malloc((size_t)T * p.dv * sizeof *ref.out);
    ref.pool = malloc((size_t)p.dk * p.dv * sizeof *ref.pool);
    if (!TST_REQUIRE(ref.out && ref.pool, "out of host memory"))
        goto done;
    memcpy(ref.pool, p.pool32, (size_t)p.dk * p.dv * sizeof *ref.pool);
    ref_run(&p, NULL, 1, NULL, ref.pool, ref.out);
    const double t2 = tst_now();
    const double r_out = out_ratio(&p, got.out, ref.out, model.mag, 0, T, 1e-4);
    const double r_state = pool_ratio(&p, got.pool, ref.pool, 0, 1e-4);
    CHECK(r_out <= 1.0 && r_state <= 1.0, "long [%s] T=%u: out rows at %.3g, final state at %.3g of the 1e-4 bound",
          d->name, T, r_out, r_state);
    printf("long [%s] T=%u f32 hk=hv=1 dk=dv=128: worst out row %.3f, final state %.3f of the 1e-4 bound (op %.2f s, "
           "reference %.2f s)\n",
           d->name, T, r_out, r_state, t1 - t0, t2 - t1);
done:
    result_free(&got), result_free(&ref), result_free(&model);
    dprob_free(&dp);
    prob_free(&p);
}

/* ------------------------------------------------------------------------------------------------
 * hostile device data, duplicate slots
 * ---------------------------------------------------------------------------------------------- */

/* Whatever cu_seqlens and state_slots hold, the call returns and writes nothing outside out and
 * the pool rows an in-range slot names. */
static void hostile_call(tst_dev *d, const prob *p, dprob *dp, const call_spec *c, const char *what)
{
    bool may[16] = {false};
    for (size_t s = 0; s < c->n_slots; s++) {
        const int64_t v = c->slot_dtype == LMK_I64 ? ((const int64_t *)c->slots)[s] : ((const int32_t *)c->slots)[s];
        if (v >= 0 && v < (int64_t)p->n_slots)
            may[v] = true;
    }
    char msg[160] = "";
    const lmk_status st = dprob_reset(dp) ? call_range(d, p, dp, c) : LMK_ERR_DEVICE;
    CHECK(st == LMK_OK, "hostile %s [%s]: %s: %s", what, d->name, lmk_status_name(st), lmk_last_error());
    CHECK(st == LMK_OK && untouched(p, dp, may, msg, sizeof msg), "hostile %s [%s]: %s", what, d->name, msg);
}

/* Guarded operands show a write outside them; tight ones (no guards) a read past them, under
 * AddressSanitizer. */
static void test_hostile(tst_dev *d, size_t guard)
{
    prob p = prob_shape(20, 2, 4, 16, 16, 6, LMK_F32, LMK_BF16);
    dprob dp = {0};
    if (!prob_make(&p, tst_case_seed()) || !dprob_make_guarded(d, &p, &dp, guard))
        goto done;
    static const int32_t cu32[8] = {0, 5, 3, 100000, -7, INT32_MIN, 20, INT32_MAX};
    static const int32_t sl32[7] = {INT32_MIN, INT32_MAX, -1, 6, 5, 2, 2};
    static const int64_t cu64[6] = {INT64_MIN, 3, INT64_MAX, 2, -1, 20};
    static const int64_t sl64[5] = {INT64_MIN, INT64_MAX, (int64_t)1 << 40, -((int64_t)1 << 40), 3};
    static const int64_t cu_late[4] = {7, 10, 40, (int64_t)1 << 33}, sl_late[3] = {0, (int64_t)6 + (1u << 31), 1};
    const call_spec calls[] = {
        {.t0 = 0, .t1 = p.T, .cu = cu32, .n_cu = 8, .slots = sl32, .n_slots = 7},
        {.t0 = 0, .t1 = p.T, .cu = cu64, .n_cu = 6, .slots = sl64, .n_slots = 5, .cu_dtype = LMK_I64,
         .slot_dtype = LMK_I64},
        {.t0 = 0, .t1 = p.T, .cu = cu_late, .n_cu = 4, .slots = sl_late, .n_slots = 3, .cu_dtype = LMK_I64,
         .slot_dtype = LMK_I64},
        {.t0 = 0, .t1 = p.T, .cu = cu32, .n_cu = 8, .no_state = true},
    };
    static const char *const whats[] = {"i32 (non-monotone, past T, negative, INT32_MIN/MAX slots)",
                                        "i64 (INT64_MIN/MAX offsets and slots, huge rows)",
                                        "i64 (first offset past 0, last past T and 2^32)", "i32 without a state"};
    for (int i = 0; i < 4; i++)
        hostile_call(d, &p, &dp, &calls[i], whats[i]);
done:
    dprob_free(&dp);
    prob_free(&p);
}

/* Sequences naming one row: the row ends holding the last one's state computed from the row as it
 * was (an empty last one leaves it as it was). On the CPU every sequence reads the original row,
 * so all outputs are the reference's; on CUDA only those of the last of each row are specified. */
static void test_duplicates(tst_dev *d)
{
    prob p = prob_shape(20, 2, 4, 16, 16, 8, LMK_F32, LMK_F32);
    static const int32_t cu[7] = {0, 4, 9, 9, 15, 20, 20}, slots[6] = {2, 5, 2, 2, 5, 2};
    static const int32_t cu_last[2] = {15, 20}, slot5[1] = {5};
    dprob dp = {0};
    result got = {0}, ref = {0}, last = {0};
    if (!prob_make(&p, tst_case_seed()) || !dprob_make(d, &p, &dp) ||
        !model_result(&p, RIGHT, &(trap){.cu = cu, .slots = slots, .n_seq = 6}, &ref) ||
        !model_result(&p, RIGHT, &(trap){.cu = cu_last, .slots = slot5, .n_seq = 1}, &last))
        goto done;
    memcpy(ref.pool, p.pool32, (size_t)p.n_slots * p.hv * p.dk * p.dv * sizeof *ref.pool);
    ref_run(&p, cu, 6, slots, ref.pool, ref.out); /* lmk_ref's rows; the model's ||m|| stay */
    const call_spec c = {.t0 = 0, .t1 = p.T, .cu = cu, .n_cu = 7, .slots = slots, .n_slots = 6};
    if (!TST_REQUIRE(call_range(d, &p, &dp, &c) == LMK_OK, "duplicates [%s]: %s", d->name, lmk_last_error()) ||
        !result_read(&p, &dp, &got))
        goto done;
    const size_t row_elems = (size_t)p.hv * p.dk * p.dv;
    CHECK(!memcmp(got.pool + 2 * row_elems, p.pool32 + 2 * row_elems, row_elems * sizeof(float)),
          "duplicates [%s]: row 2, whose last sequence is empty, changed", d->name);
    const double r_row = pool_ratio(&p, got.pool, last.pool, 5, tol_of(&p));
    const bool cpu = lmk_device_backend(d->dev) == LMK_BACKEND_CPU;
    const double r_out = out_ratio(&p, got.out, ref.out, ref.mag, cpu ? 0 : 15, p.T, tol_of(&p));
    CHECK(r_row <= 1.0 && r_out <= 1.0,
          "duplicates [%s]: row 5 at %.3g of the bound from its last sequence alone, outputs at %.3g", d->name, r_row,
          r_out);
done:
    result_free(&got), result_free(&ref), result_free(&last);
    dprob_free(&dp);
    prob_free(&p);
}

/* ------------------------------------------------------------------------------------------------
 * the workspace and the chunked form (lmk.h, "Workspace"; CUDA's chunked kernels)
 * ---------------------------------------------------------------------------------------------- */

static bool is_cuda(const tst_dev *d)
{
    return lmk_device_backend(d->dev) == LMK_BACKEND_CUDA;
}

/* A u8 workspace of the bytes lmk_gated_delta_rule_workspace answers for call c (at least 1 byte). */
static lmk_buffer *workspace_for(tst_dev *d, const prob *p, dprob *dp, const call_spec *c, size_t *bytes)
{
    size_t need = 0;
    call_spec q = *c;
    q.query = &need, q.workspace = NULL;
    if (!TST_REQUIRE(call_range(d, p, dp, &q) == LMK_OK, "workspace query [%s]: %s", d->name, lmk_last_error()))
        return NULL;
    if (bytes)
        *bytes = need;
    const size_t n = need ? need : 1, shape[1] = {n};
    lmk_buffer *w = NULL;
    const lmk_status st = lmk_buffer_alloc(d->dev, n, LMK_U8, shape, 1, &w);
    return TST_REQUIRE(st == LMK_OK, "workspace of %zu bytes [%s]: %s", n, d->name, lmk_last_error()) ? w : NULL;
}

/* The case table's rows with a workspace, the large ones too (LMK_TEST_QUICK: up to 2,000 tokens),
 * on CUDA: the chunked kernels (and the calls they leave to the token kernel) against the float64
 * reference, every byte outside out, the stored pool rows and the workspace checked. */
static void test_chunk_cases(tst_dev *d)
{
    const tst_op *op = tst_op_find("gated_delta_rule");
    if (!is_cuda(d) || !TST_REQUIRE(op, "gated_delta_rule is not in the registry"))
        return;
    int n = 0;
    tst_result res;
    for (int i = 0; i < op->n_cases(); i++) {
        const tst_case c = tst_op_case(op, i);
        if (!strstr(c.name, " workspace ") || (tst_quick() && c.T > 2000))
            continue;
        const uint64_t seed = tst_case_seed();
        const double t0 = tst_now();
        const bool ok = tst_case_check(&c, d->stream, seed, &res, NULL);
        CHECK(ok, "chunked %s [%s] seed 0x%016" PRIx64 ": %s", c.name, d->name, seed, res.msg);
        printf("chunked [%s] %s: %s (%.1f s)\n", d->name, c.name, res.msg, tst_now() - t0);
        n++;
    }
    CHECK(n >= (tst_quick() ? 8 : 11), "chunked [%s]: only %d table cases with a workspace", d->name, n);
}

/* One comparison of the chunked form with the token kernel on the same inputs. */
typedef struct chunk_run {
    const char *what;
    uint32_t T, dk;
    lmk_repeat_layout map;
    lmk_dtype dtype, state_dtype;
    bool kfast;
    const int32_t *cu, *slots; /* NULL: one sequence, row 0 */
    size_t n_seq;
    uint32_t unspecified_t1;   /* tokens [0, this) belong to a sequence whose row a later one stores */
    int keep_row;              /* a row only an empty sequence names (its bytes stay), or -1 */
} chunk_run;

/* Both forms within lmk.h's bound of the float64 model and within twice of each other, the stored
 * rows within the bound, the chunked call twice giving the same bits, nothing written outside out,
 * the named rows and the workspace. */
static void chunk_vs_token(tst_dev *d, const chunk_run *r)
{
    prob p = prob_shape(r->T, 2, 6, r->dk, r->dk, 4, r->dtype, r->state_dtype);
    p.map = r->map, p.kfast = r->kfast;
    dprob dp = {0};
    result tok = {0}, ch = {0}, ch2 = {0}, model = {0};
    lmk_buffer *ws = NULL;
    call_spec c = {.t0 = 0, .t1 = r->T, .cu = r->cu, .n_cu = r->cu ? r->n_seq + 1 : 0, .slots = r->slots,
                   .n_slots = r->slots ? r->n_seq : 0};
    if (!prob_make(&p, tst_case_seed()) || !dprob_make(d, &p, &dp) ||
        !model_result(&p, RIGHT, &(trap){.cu = r->cu, .slots = r->slots, .n_seq = r->cu ? r->n_seq : 1}, &model) ||
        !(ws = workspace_for(d, &p, &dp, &c, NULL)))
        goto done;
    const double t0 = tst_now();
    if (!TST_REQUIRE(dprob_reset(&dp) && call_range(d, &p, &dp, &c) == LMK_OK, "%s token [%s]: %s", r->what, d->name,
                     lmk_last_error()) ||
        !result_read(&p, &dp, &tok))
        goto done;
    const double t1 = tst_now();
    c.workspace = ws;
    if (!TST_REQUIRE(dprob_reset(&dp) && call_range(d, &p, &dp, &c) == LMK_OK, "%s chunked [%s]: %s", r->what,
                     d->name, lmk_last_error()) ||
        !result_read(&p, &dp, &ch))
        goto done;
    const double t2 = tst_now();
    bool rows[4] = {true, true, true, true};
    char msg[160] = "";
    CHECK(untouched(&p, &dp, rows, msg, sizeof msg), "%s chunked [%s]: %s", r->what, d->name, msg);
    if (!TST_REQUIRE(dprob_reset(&dp) && call_range(d, &p, &dp, &c) == LMK_OK, "%s chunked again [%s]: %s", r->what,
                     d->name, lmk_last_error()) ||
        !result_read(&p, &dp, &ch2))
        goto done;
    const size_t n_out = (size_t)p.T * p.hv * p.dv, n_pool = (size_t)p.n_slots * p.hv * p.dk * p.dv;
    CHECK(!memcmp(ch.out, ch2.out, n_out * sizeof(float)) && !memcmp(ch.pool, ch2.pool, n_pool * sizeof(float)),
          "%s chunked [%s]: two calls on the same inputs gave different bits", r->what, d->name);
    const double tol = tol_of(&p);
    const size_t from = r->unspecified_t1;
    const double r_tok = out_ratio(&p, tok.out, model.out, model.mag, from, p.T, tol);
    const double r_ch = out_ratio(&p, ch.out, model.out, model.mag, from, p.T, tol);
    const double r_x = out_ratio(&p, ch.out, tok.out, model.mag, from, p.T, 2.0 * tol);
    double r_pool = 0.0;
    for (size_t row = 0; row < p.n_slots; row++)
        r_pool = fmax(r_pool, pool_ratio(&p, ch.pool, model.pool, row, tol));
    const size_t row_elems = (size_t)p.hv * p.dk * p.dv;
    CHECK(r->keep_row < 0 || !memcmp(ch.pool + r->keep_row * row_elems, p.pool32 + r->keep_row * row_elems,
                                     row_elems * sizeof(float)),
          "%s chunked [%s]: row %d, named only by an empty sequence, changed", r->what, d->name, r->keep_row);
    CHECK(r_tok <= 1.0 && r_ch <= 1.0 && r_x <= 1.0 && r_pool <= 1.0,
          "%s [%s]: out rows of the token kernel at %.3g and of the chunked form at %.3g of the bound, of each other "
          "at %.3g of twice the bound; stored rows at %.3g",
          r->what, d->name, r_tok, r_ch, r_x, r_pool);
    printf("chunked [%s] %s: out %.3f (token kernel %.3f), chunked vs token %.3f, rows %.3f of the bound; token "
           "%.3f s, chunked %.3f s (with sync and read-back)\n",
           d->name, r->what, r_ch, r_tok, r_x, r_pool, t1 - t0, t2 - t1);
done:
    lmk_buffer_free(ws);
    result_free(&tok), result_free(&ch), result_free(&ch2), result_free(&model);
    dprob_free(&dp);
    prob_free(&p);
}

/* On CUDA: a prompt, a varlen batch with every kind of sequence and slot, dk = dv = 64, and a batch of
 * many sequences (a head's rows in two blocks of a cluster or in one, as the planner chooses by the
 * items and the GPU's SMs: these shapes take both on a 132-SM GPU). */
static void test_chunk_vs_token(tst_dev *d)
{
    if (!is_cuda(d))
        return;
    /* six sequences: row 1 named twice (the first one's outputs unspecified on CUDA), an empty one
     * alone on row 2, a one-token padding sequence, short and long ones, a final chunk of 28 */
    static const int32_t cu[7] = {0, 700, 700, 1500, 1501, 2600, 4100}, slots[6] = {1, 2, 0, -1, 1, 3};
    const chunk_run runs[] = {
        {"prompt bf16 block f32-pool", 4100, 128, LMK_REPEAT_BLOCK, LMK_BF16, LMK_F32, false, NULL, NULL, 1, 0, -1},
        {"varlen f16 tiled bf16-pool-dk-fastest", 4100, 128, LMK_REPEAT_TILED, LMK_F16, LMK_BF16, true, cu, slots, 6,
         700, 2},
        {"prompt bf16 d=64", 1000, 64, LMK_REPEAT_BLOCK, LMK_BF16, LMK_F32, false, NULL, NULL, 1, 0, -1},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
        chunk_vs_token(d, &runs[i]);
    /* 44 sequences, empty ones, one-token ones, exact chunks and one past, most without a row (the
     * pool has 4): 264 items, the head's rows in one block even on a 132-SM GPU */
    static const uint32_t lens[7] = {0, 1, 150, 37, 64, 65, 3};
    int32_t many[45] = {0};
    for (int s = 0; s < 44; s++)
        many[s + 1] = many[s] + (int32_t)lens[s % 7];
    many[44] = 3000;
    const chunk_run batch = {"44 sequences bf16 tiled f32-pool", 3000, 128, LMK_REPEAT_TILED, LMK_BF16, LMK_F32,
                             false, many, NULL, 44, 0, -1};
    chunk_vs_token(d, &batch);
}

/* One sequence of 65,536 tokens (LMK_TEST_QUICK: 8,192) through the chunked kernels: bf16 q/k/v, f32
 * state, Hk = Hv = 1, dk = dv = 128, long memory (decays in (0.93, 1)): every output row and the
 * final state within lmk.h's 4e-3 of the float64 model. */
static void test_chunk_long(tst_dev *d)
{
    if (!is_cuda(d))
        return;
    const uint32_t T = tst_quick() ? 8192 : 65536;
    prob p = prob_shape(T, 1, 1, 128, 128, 1, LMK_BF16, LMK_F32);
    p.alog_lo = -4.0, p.alog_hi = -3.0, p.dt_lo = -2.0, p.dt_hi = -1.0;
    dprob dp = {0};
    result got = {0}, model = {0};
    lmk_buffer *ws = NULL;
    call_spec c = {.t0 = 0, .t1 = T};
    if (!prob_make(&p, tst_case_seed()) || !dprob_make(d, &p, &dp) ||
        !model_result(&p, RIGHT, &(trap){.n_seq = 1}, &model) || !(ws = workspace_for(d, &p, &dp, &c, NULL)))
        goto done;
    c.workspace = ws;
    if (!TST_REQUIRE(call_range(d, &p, &dp, &c) == LMK_OK, "chunked long [%s]: %s", d->name, lmk_last_error()) ||
        !result_read(&p, &dp, &got))
        goto done;
    const double r_out = out_ratio(&p, got.out, model.out, model.mag, 0, T, tol_of(&p));
    const double r_state = pool_ratio(&p, got.pool, model.pool, 0, tol_of(&p));
    CHECK(r_out <= 1.0 && r_state <= 1.0, "chunked long [%s] T=%u: out rows at %.3g, final state at %.3g of the bound",
          d->name, T, r_out, r_state);
    printf("chunked long [%s] T=%u bf16 hk=hv=1 dk=dv=128: worst out row %.3f, final state %.3f of the 4e-3 bound\n",
           d->name, T, r_out, r_state);
done:
    lmk_buffer_free(ws);
    result_free(&got), result_free(&model);
    dprob_free(&dp);
    prob_free(&p);
}

/* Hostile cu_seqlens and state_slots through the chunked kernels: sequences that overlap (each is
 * clamped alone, so together they hold more chunks than the workspace's bound T/64 + n_seq),
 * non-monotone and past-T offsets, wild slots: the call returns and writes nothing outside out and
 * the rows an in-range slot names. */
static void test_chunk_hostile(tst_dev *d)
{
    if (!is_cuda(d))
        return;
    prob p = prob_shape(640, 1, 2, 128, 128, 6, LMK_BF16, LMK_F32);
    dprob dp = {0};
    lmk_buffer *ws = NULL;
    static const int32_t cu_over[6] = {0, 640, 0, 640, 0, 640}, sl_over[5] = {0, 1, 2, 3, 4};
    static const int32_t cu_wild[6] = {0, 700, 130, -5, INT32_MAX, 640}, sl_wild[5] = {INT32_MIN, 5, -1, 6, 2};
    static const int64_t cu_big[3] = {-((int64_t)1 << 40), 333, (int64_t)1 << 40}, sl_big[2] = {(int64_t)1 << 33, 1};
    call_spec calls[] = {
        {.t0 = 0, .t1 = 640, .cu = cu_over, .n_cu = 6, .slots = sl_over, .n_slots = 5},
        {.t0 = 0, .t1 = 640, .cu = cu_wild, .n_cu = 6, .slots = sl_wild, .n_slots = 5},
        {.t0 = 0, .t1 = 640, .cu = cu_big, .n_cu = 3, .slots = sl_big, .n_slots = 2, .cu_dtype = LMK_I64,
         .slot_dtype = LMK_I64},
    };
    static const char *const whats[] = {"chunked, overlapping sequences past the chunk bound",
                                        "chunked, non-monotone and past-T offsets, wild slots",
                                        "chunked, i64 offsets and slots past 2^32"};
    /* the largest n_seq's workspace serves the others (the query never decreases with n_seq) */
    if (!prob_make(&p, tst_case_seed()) || !dprob_make(d, &p, &dp) ||
        !(ws = workspace_for(d, &p, &dp, &calls[0], NULL)))
        goto done;
    for (int i = 0; i < 3; i++) {
        calls[i].workspace = ws;
        hostile_call(d, &p, &dp, &calls[i], whats[i]);
    }
done:
    lmk_buffer_free(ws);
    dprob_free(&dp);
    prob_free(&p);
}

/* A call with workspace ws must fail with INVALID_ARGUMENT naming "workspace" and `want`, and write
 * nothing: every operand's bytes, out's included, as they were. */
static void expect_ws_reject(tst_dev *d, const prob *p, dprob *dp, call_spec c, lmk_buffer *ws, const char *want,
                             const char *what)
{
    c.workspace = ws;
    lmk_clear_error();
    const lmk_status st = dprob_reset(dp) ? call_range(d, p, dp, &c) : LMK_ERR_DEVICE;
    char msg[512], why[160] = "";
    snprintf(msg, sizeof msg, "%s", lmk_last_error());
    bool none[8] = {false};
    bool same = untouched(p, dp, none, why, sizeof why);
    unsigned char *o = read_parent(dp, DOUT);
    same = same && o && !memcmp(o, dp->image[DOUT], 2 * dp->guard + dp->bytes[DOUT]);
    free(o);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && strstr(msg, "workspace") && strstr(msg, want) && same,
          "workspace [%s] %s: want INVALID_ARGUMENT with \"%s\", got %s \"%s\"%s", d->name, what, want,
          lmk_status_name(st), msg, same ? "" : ", and a byte changed");
}

/* The query: 0 on the CPU and for f32 inputs; on CUDA the chunked layout's bytes, never decreasing
 * as T or n_seq grow. */
static void workspace_query(tst_dev *d, const prob *p, dprob *dp)
{
    static const uint32_t Ts[] = {1, 63, 64, 65, 127, 128, 200, 256};
    int32_t cu[9] = {0}; /* device data: the query reads only its length */
    size_t prev_n[8] = {0};
    bool mono = true, exact = true;
    for (size_t n_seq = 1; n_seq <= 8; n_seq++) {
        size_t prev_t = 0;
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
            size_t bytes = 7;
            const call_spec c = {.t0 = 0, .t1 = Ts[i], .cu = cu, .n_cu = n_seq + 1, .query = &bytes};
            if (!TST_REQUIRE(call_range(d, p, dp, &c) == LMK_OK, "query [%s]: %s", d->name, lmk_last_error()))
                return;
            const size_t want = is_cuda(d) ? lmk_gdn_chunk_plan(Ts[i], n_seq, p->hk, p->hv, p->dk, p->dv).total : 0;
            exact &= bytes == want && (want > 0) == is_cuda(d);
            mono &= bytes >= prev_t && bytes >= prev_n[i];
            prev_t = prev_n[i] = bytes;
        }
    }
    CHECK(exact && mono, "workspace query [%s]: %s", d->name,
          !exact ? "not the chunked layout's bytes (or not 0 on the CPU)" : "decreases as T or n_seq grows");
}

/* The workspace's rules on any device, in lmk.h's order, and the calls it allows. */
static void test_workspace_rules(tst_dev *d)
{
    prob p = prob_shape(256, 1, 2, 128, 128, 8, LMK_BF16, LMK_F32);
    prob pf = prob_shape(64, 1, 2, 128, 128, 1, LMK_F32, LMK_F32);
    dprob dp = {0}, dpf = {0};
    lmk_buffer *f32 = NULL, *strided = NULL, *other = NULL, *small = NULL, *big = NULL, *a_in = NULL, *fit = NULL;
    result plain = {0}, moved = {0};
    if (!prob_make(&p, tst_case_seed()) || !dprob_make(d, &p, &dp) || !prob_make(&pf, tst_case_seed()) ||
        !dprob_make(d, &pf, &dpf))
        goto done;
    workspace_query(d, &p, &dp);
    size_t need = 0, need_f32 = 7;
    const call_spec c = {.t0 = 0, .t1 = p.T};
    const call_spec cf = {.t0 = 0, .t1 = pf.T, .query = &need_f32};
    if (!TST_REQUIRE(call_range(d, &pf, &dpf, &cf) == LMK_OK, "query f32 [%s]: %s", d->name, lmk_last_error()))
        goto done;
    CHECK(need_f32 == 0, "workspace query [%s]: %zu bytes for f32 inputs (the token kernel's calls need none)",
          d->name, need_f32);
    if (!(small = workspace_for(d, &p, &dp, &c, &need)))
        goto done;
    const size_t n1 = need + 64, s1[1] = {n1}, s_str[1] = {n1}, st2[1] = {2}, s_u8[1] = {2 * n1};
    const size_t a_at = ((need + 3 + 255) & ~(size_t)255) + 256; /* a's view, past the odd-address workspace */
    const size_t big_n = a_at + (size_t)p.T * p.hv * 4, sbig[1] = {big_n};
    const size_t sa[2] = {p.T, p.hv}, sfit[1] = {need ? need : 1};
    lmk_buffer *u8 = NULL;
    if (!TST_REQUIRE(lmk_buffer_alloc(d->dev, n1 * 4, LMK_F32, s1, 1, &f32) == LMK_OK &&
                         lmk_buffer_alloc(d->dev, 2 * n1, LMK_U8, s_u8, 1, &u8) == LMK_OK &&
                         lmk_buffer_view_strided(u8, 0, LMK_U8, s_str, st2, 1, &strided) == LMK_OK &&
                         lmk_buffer_alloc(g_other, n1, LMK_U8, s_str, 1, &other) == LMK_OK &&
                         lmk_buffer_alloc(d->dev, big_n, LMK_U8, sbig, 1, &big) == LMK_OK &&
                         lmk_buffer_view(big, a_at, LMK_F32, sa, 2, &a_in) == LMK_OK &&
                         lmk_buffer_write(a_in, 0, p.a, (size_t)p.T * p.hv * 4) == LMK_OK &&
                         lmk_buffer_view(big, 3, LMK_U8, sfit, 1, &fit) == LMK_OK,
                     "workspace buffers [%s]: %s", d->name, lmk_last_error())) {
        lmk_buffer_free(strided), lmk_buffer_free(u8);
        strided = u8 = NULL;
        goto done;
    }
    expect_ws_reject(d, &p, &dp, c, f32, "dense u8", "an f32 buffer");
    expect_ws_reject(d, &p, &dp, c, strided, "dense u8", "a strided u8 view");
    expect_ws_reject(d, &p, &dp, c, other, "not on the stream's device", "on another device");
    if (need > 0) {
        lmk_buffer *short_ws = NULL;
        const size_t sshort[1] = {need - 1};
        if (TST_REQUIRE(lmk_buffer_view(small, 0, LMK_U8, sshort, 1, &short_ws) == LMK_OK, "view: %s",
                        lmk_last_error()))
            expect_ws_reject(d, &p, &dp, c, short_ws, "needs at least", "one byte short");
        lmk_buffer_free(short_ws);
    }
    call_spec ca = c;
    ca.a_view = a_in;
    expect_ws_reject(d, &p, &dp, ca, big, "overlaps a", "holding the a operand");
    expect_ws_reject(d, &p, &dp, c, dp.parent[DPOOL], "overlaps state", "holding the state pool");
    /* allowed: exactly the bytes asked for, at an odd address, next to a; the same bits as a
     * workspace of its own */
    ca.workspace = fit;
    call_spec cs = c;
    cs.workspace = small;
    CHECK(dprob_reset(&dp) && call_range(d, &p, &dp, &cs) == LMK_OK && result_read(&p, &dp, &plain) &&
              dprob_reset(&dp) && call_range(d, &p, &dp, &ca) == LMK_OK && result_read(&p, &dp, &moved) &&
              !memcmp(plain.out, moved.out, (size_t)p.T * p.hv * p.dv * sizeof(float)) &&
              !memcmp(plain.pool, moved.pool, (size_t)p.n_slots * p.hv * p.dk * p.dv * sizeof(float)),
          "workspace [%s]: a workspace of exactly %zu bytes at an odd address must be accepted and give the same "
          "bits (%s)",
          d->name, need, lmk_last_error());
    lmk_buffer_free(strided);
    lmk_buffer_free(u8);
    strided = NULL;
    printf("workspace [%s]: query %zu bytes (T=%u, one sequence), every rule checked\n", d->name, need, p.T);
done:
    lmk_buffer_free(fit), lmk_buffer_free(a_in), lmk_buffer_free(big), lmk_buffer_free(other);
    lmk_buffer_free(strided), lmk_buffer_free(f32), lmk_buffer_free(small);
    result_free(&plain), result_free(&moved);
    dprob_free(&dp), dprob_free(&dpf);
    prob_free(&p), prob_free(&pf);
}

/* ------------------------------------------------------------------------------------------------
 * validation: every rule of lmk.h, in its order, with its message, nothing written
 * ---------------------------------------------------------------------------------------------- */

/* The valid call's operands (f32, T 3, Hk 2, Hv 4, dk = dv = 8, two sequences, a pool of 3 rows)
 * and the wrong ones the rules swap in, all views of one poisoned CPU buffer (`mem`), but for the
 * two on another device. */
enum {
    B_Q, B_K, B_V, B_A, B_B, B_ALOG, B_DT, B_CU, B_SLOTS, B_STATE, B_Z, B_NW, B_OUT,
    X_Q_COUNT, X_K_STRIDED, X_V_COUNT, X_Z_COUNT, X_OUT_COUNT, X_A_STRIDED, X_B_COUNT, X_ALOG_COUNT, X_DT_STRIDED,
    X_NW_COUNT, X_K_F16, X_OUT_BF16, X_Q_I32, X_K_I32, X_V_I32, X_OUT_I32, X_A_I32, X_Z_F8, X_NW_I32, X_STATE_F16,
    X_CU_F32, X_CU_ONE, X_CU_STRIDED, X_SLOTS_COUNT, X_SLOTS_U32, X_STATE_3D, X_STATE_DIMS, X_STATE_OVERLAP,
    X_Q_OTHER, X_STATE_OTHER, X_OUT_OVER_Q, X_OUT_SELF, X_STATE_OVER_V, X_STATE_OVER_CU, X_OUT_OVER_STATE,
    X_STATE_EMPTY, N_VB
};

typedef struct vb_spec {
    int id;
    size_t at;             /* element offset in mem (of its own dtype) */
    lmk_dtype dt;
    int nd;
    size_t shape[4], stride[4]; /* stride[0] == 0: a dense view */
    bool other;            /* on the other device */
} vb_spec;

#define DENSE3(n0, n1, n2) 3, {n0, n1, n2}, {0}
#define DENSE1(n) 1, {n}, {0}
static const vb_spec k_vb[] = {
    {B_Q, 0, LMK_F32, DENSE3(3, 2, 8), false},           {B_K, 64, LMK_F32, DENSE3(3, 2, 8), false},
    {B_V, 128, LMK_F32, DENSE3(3, 4, 8), false},         {B_A, 256, LMK_F32, 2, {3, 4}, {0}, false},
    {B_B, 272, LMK_F32, 2, {3, 4}, {0}, false},          {B_ALOG, 288, LMK_F32, DENSE1(4), false},
    {B_DT, 296, LMK_F32, DENSE1(4), false},              {B_Z, 304, LMK_F32, DENSE3(3, 4, 8), false},
    {B_NW, 400, LMK_F32, DENSE1(8), false},              {B_OUT, 512, LMK_F32, DENSE3(3, 4, 8), false},
    {B_STATE, 1024, LMK_F32, 4, {3, 4, 8, 8}, {256, 64, 8, 1}, false},
    {B_CU, 2048, LMK_I32, DENSE1(3), false},             {B_SLOTS, 2056, LMK_I32, DENSE1(2), false},
    {X_Q_COUNT, 4096, LMK_F32, DENSE1(47), false},       {X_K_STRIDED, 4096, LMK_F32, 3, {3, 2, 8}, {32, 16, 2}, false},
    {X_V_COUNT, 4096, LMK_F32, DENSE1(95), false},       {X_Z_COUNT, 4096, LMK_F32, DENSE1(97), false},
    {X_OUT_COUNT, 4096, LMK_F32, DENSE1(95), false},     {X_A_STRIDED, 4096, LMK_F32, 2, {3, 4}, {8, 2}, false},
    {X_B_COUNT, 4096, LMK_F32, DENSE1(11), false},       {X_ALOG_COUNT, 4096, LMK_F32, DENSE1(5), false},
    {X_DT_STRIDED, 4096, LMK_F32, 1, {4}, {2}, false},   {X_NW_COUNT, 4096, LMK_F32, DENSE1(7), false},
    {X_K_F16, 8192, LMK_F16, DENSE3(3, 2, 8), false},    {X_OUT_BF16, 8192, LMK_BF16, DENSE3(3, 4, 8), false},
    {X_Q_I32, 4096, LMK_I32, DENSE3(3, 2, 8), false},    {X_K_I32, 4160, LMK_I32, DENSE3(3, 2, 8), false},
    {X_V_I32, 4224, LMK_I32, DENSE3(3, 4, 8), false},    {X_OUT_I32, 4352, LMK_I32, DENSE3(3, 4, 8), false},
    {X_A_I32, 4096, LMK_I32, 2, {3, 4}, {0}, false},     {X_Z_F8, 16384, LMK_F8E4M3, DENSE3(3, 4, 8), false},
    {X_NW_I32, 4096, LMK_I32, DENSE1(8), false},
    {X_STATE_F16, 8192, LMK_F16, 4, {3, 4, 8, 8}, {256, 64, 8, 1}, false},
    {X_CU_F32, 4096, LMK_F32, DENSE1(3), false},         {X_CU_ONE, 4096, LMK_I32, DENSE1(1), false},
    {X_CU_STRIDED, 4096, LMK_I32, 1, {3}, {2}, false},   {X_SLOTS_COUNT, 4096, LMK_I32, DENSE1(3), false},
    {X_SLOTS_U32, 4096, LMK_U32, DENSE1(2), false},      {X_STATE_3D, 4096, LMK_F32, DENSE3(3, 4, 64), false},
    {X_STATE_DIMS, 4096, LMK_F32, 4, {3, 4, 8, 7}, {224, 56, 7, 1}, false},
    {X_STATE_OVERLAP, 4096, LMK_F32, 4, {3, 4, 8, 8}, {256, 64, 8, 0}, false},
    {X_Q_OTHER, 0, LMK_F32, DENSE3(3, 2, 8), true},
    {X_STATE_OTHER, 0, LMK_F32, 4, {3, 4, 8, 8}, {256, 64, 8, 1}, true},
    {X_OUT_OVER_Q, 16, LMK_F32, DENSE3(3, 4, 8), false}, {X_OUT_SELF, 4096, LMK_F32, 3, {3, 4, 8}, {32, 0, 1}, false},
    {X_STATE_OVER_V, 128, LMK_F32, 4, {3, 4, 8, 8}, {256, 64, 8, 1}, false},
    {X_STATE_OVER_CU, 1300, LMK_F32, 4, {3, 4, 8, 8}, {256, 64, 8, 1}, false},
    {X_OUT_OVER_STATE, 1100, LMK_F32, DENSE3(3, 4, 8), false},
    {X_STATE_EMPTY, 1024, LMK_F32, 4, {0, 4, 8, 8}, {256, 64, 8, 1}, false},
};

#define MEM_BYTES (20u << 10)

typedef struct vset {
    lmk_device *dev;
    lmk_stream *s;
    lmk_buffer *mem, *other_mem;
    unsigned char *image;
    lmk_buffer *b[N_VB];
} vset;

static bool vset_make(vset *v, lmk_device *dev)
{
    memset(v, 0, sizeof *v);
    v->dev = dev;
    v->image = malloc(MEM_BYTES);
    if (!TST_REQUIRE(v->image, "out of host memory") ||
        !TST_REQUIRE(lmk_stream_create(dev, &v->s) == LMK_OK, "stream: %s", lmk_last_error()))
        return false;
    tst_rng r = tst_rng_make(tst_case_seed());
    memset(v->image, TST_POISON, MEM_BYTES);
    tst_fill_random(&r, LMK_F32, v->image, 1024 + 3 * 4 * 8 * 8);
    const int32_t cu[3] = {0, 1, 3}, slots[2] = {2, 0};
    memcpy(v->image + 2048 * 4, cu, sizeof cu);
    memcpy(v->image + 2056 * 4, slots, sizeof slots);
    memset(v->image + 512 * 4, TST_POISON, 96 * 4); /* out */
    v->mem = tst_buf(dev, LMK_U8, NULL, 0, MEM_BYTES, 0, v->image, MEM_BYTES, -1);
    v->other_mem = tst_buf(g_other, LMK_U8, NULL, 0, MEM_BYTES, 0, v->image, MEM_BYTES, -1);
    for (size_t i = 0; v->mem && v->other_mem && i < sizeof k_vb / sizeof k_vb[0]; i++) {
        const vb_spec *sp = &k_vb[i];
        const lmk_buffer *parent = sp->other ? v->other_mem : v->mem;
        const size_t off = sp->at * lmk_dtype_size(sp->dt);
        const lmk_status st = sp->stride[0] ? lmk_buffer_view_strided(parent, off, sp->dt, sp->shape, sp->stride,
                                                                      sp->nd, &v->b[sp->id])
                                            : lmk_buffer_view(parent, off, sp->dt, sp->shape, sp->nd, &v->b[sp->id]);
        if (!TST_REQUIRE(st == LMK_OK, "validation view %d: %s", sp->id, lmk_last_error()))
            return false;
    }
    return v->mem && v->other_mem;
}

static void vset_free(vset *v)
{
    for (int i = 0; i < N_VB; i++)
        lmk_buffer_free(v->b[i]);
    lmk_buffer_free(v->mem);
    lmk_buffer_free(v->other_mem);
    lmk_stream_destroy(v->s);
    free(v->image);
}

/* What a rule changes in the valid call: a field of io (to buffer `buf`, or NULL when buf < 0),
 * of the params (to `value`), or the stream, io or params themselves (NULL). */
enum {
    F_STREAM, F_IO, F_PARAMS, F_Q, F_K, F_V, F_A, F_B, F_ALOG, F_DT, F_CU, F_SLOTS, F_STATE, F_Z, F_NW, F_OUT,
    P_T, P_HK, P_HV, P_DK, P_DV, P_MAP, P_SCALE, P_FLAGS, P_EPS, P_WO
};

typedef struct change {
    int field, buf;
    double value;
} change;

typedef struct rule {
    int step;           /* lmk.h's clause, in order */
    const char *want;   /* a fragment of the message */
    change c[4];        /* field 0 ends the list (F_STREAM is only ever set alone, first) */
    int n;
    bool unpaired;      /* breaking the next clause too would undo this rule */
} rule;

#define R1(step, want, f, b) {step, want, {{f, b, 0}}, 1, false}
#define RV(step, want, f, v) {step, want, {{f, -1, v}}, 1, false}
static const rule k_rules[] = {
    R1(1, "stream must not be NULL", F_STREAM, -1), R1(1, "io must not be NULL", F_IO, -1),
    R1(1, "params must not be NULL", F_PARAMS, -1), R1(1, "io->q must not be NULL", F_Q, -1),
    R1(1, "io->k must not be NULL", F_K, -1), R1(1, "io->v must not be NULL", F_V, -1),
    R1(1, "io->a must not be NULL", F_A, -1), R1(1, "io->b must not be NULL", F_B, -1),
    R1(1, "io->out must not be NULL", F_OUT, -1),
    RV(2, "seq_len (0)", P_T, 0), RV(2, "n_k_heads (0)", P_HK, 0), RV(2, "n_v_heads (0)", P_HV, 0),
    RV(2, "k_dim (0)", P_DK, 0), RV(2, "v_dim (0)", P_DV, 0),
    RV(3, "k_dim (257) must be <= 256", P_DK, 257), RV(3, "v_dim (300) must be <= 256", P_DV, 300),
    RV(4, "n_v_heads (4) must be a multiple of n_k_heads (3)", P_HK, 3),
    RV(5, "unknown head_map 2", P_MAP, 2),
    RV(6, "unknown flags 0x6", P_FLAGS, 7),
    RV(7, "scale must be finite", P_SCALE, NAN), RV(7, "scale must be finite", P_SCALE, INFINITY),
    R1(8, "A_log without dt_bias", F_DT, -1), R1(8, "dt_bias without A_log", F_ALOG, -1),
    R1(9, "z without norm_w", F_NW, -1), R1(9, "norm_w without z", F_Z, -1),
    RV(10, "norm.eps must be finite and > 0", P_EPS, 0), RV(10, "norm.eps must be finite and > 0", P_EPS, -1),
    RV(10, "norm.eps must be finite and > 0", P_EPS, NAN), RV(10, "weight_offset must be finite", P_WO, INFINITY),
    R1(11, "q element count 47", F_Q, X_Q_COUNT),
    R1(11, "k has shape [3, 2, 8] and strides [32, 16, 2]", F_K, X_K_STRIDED),
    R1(11, "v element count 95", F_V, X_V_COUNT), R1(11, "z element count 97", F_Z, X_Z_COUNT),
    R1(11, "out element count 95", F_OUT, X_OUT_COUNT),
    R1(11, "a has shape [3, 4] and strides [8, 2]", F_A, X_A_STRIDED),
    R1(11, "b element count 11", F_B, X_B_COUNT),
    R1(11, "A_log must be dense with exactly n_v_heads (4)", F_ALOG, X_ALOG_COUNT),
    R1(11, "dt_bias must be dense with exactly n_v_heads (4) elements (got 4, strided)", F_DT, X_DT_STRIDED),
    R1(11, "norm_w must be dense with exactly v_dim (8)", F_NW, X_NW_COUNT),
    R1(12, "k dtype f16 differs from q's f32", F_K, X_K_F16), R1(12, "out dtype bf16 differs", F_OUT, X_OUT_BF16),
    {12, "q has unsupported dtype i32",
     {{F_Q, X_Q_I32, 0}, {F_K, X_K_I32, 0}, {F_V, X_V_I32, 0}, {F_OUT, X_OUT_I32, 0}}, 4, false},
    R1(12, "a has unsupported dtype i32", F_A, X_A_I32), R1(12, "z has unsupported dtype f8e4m3", F_Z, X_Z_F8),
    R1(12, "norm_w has unsupported dtype i32", F_NW, X_NW_I32),
    R1(12, "state has unsupported dtype f16", F_STATE, X_STATE_F16),
    R1(13, "cu_seqlens must be dense i32 or i64 with at least 2 entries (got f32", F_CU, X_CU_F32),
    R1(13, "at least 2 entries (got i32, 1 entries)", F_CU, X_CU_ONE),
    R1(13, "at least 2 entries (got i32, 3 entries, strided)", F_CU, X_CU_STRIDED),
    {14, "state_slots is given without a state", {{F_STATE, -1, 0}}, 1, true},
    R1(14, "exactly n_seq (2) entries (got i32, 3 entries)", F_SLOTS, X_SLOTS_COUNT),
    R1(14, "state_slots must be dense i32 or i64", F_SLOTS, X_SLOTS_U32),
    R1(15, "state has shape [3, 4, 64]: it must be a 4-D pool [n_slots, 4, 8, 8]", F_STATE, X_STATE_3D),
    R1(15, "state has shape [3, 4, 8, 7]", F_STATE, X_STATE_DIMS),
    R1(15, "state has overlapping elements", F_STATE, X_STATE_OVERLAP),
    R1(16, "q is not on the stream's device", F_Q, X_Q_OTHER),
    R1(16, "state is not on the stream's device", F_STATE, X_STATE_OTHER),
    R1(17, "out overlaps q", F_OUT, X_OUT_OVER_Q), R1(17, "out has overlapping elements", F_OUT, X_OUT_SELF),
    R1(17, "state overlaps v", F_STATE, X_STATE_OVER_V), R1(17, "state overlaps cu_seqlens", F_STATE, X_STATE_OVER_CU),
    R1(17, "state overlaps out", F_OUT, X_OUT_OVER_STATE),
};
#define N_RULES ((int)(sizeof k_rules / sizeof k_rules[0]))

/* The call being built: the valid one, then rules applied. */
typedef struct vcall {
    lmk_stream *s;
    lmk_gdn_io io;
    lmk_gdn_params p;
    bool null_io, null_params;
} vcall;

static vcall valid_call(const vset *v)
{
    const lmk_buffer *const *b = (const lmk_buffer *const *)v->b;
    return (vcall){.s = v->s,
                   .io = {.q = b[B_Q], .k = b[B_K], .v = b[B_V], .a = b[B_A], .b = b[B_B], .A_log = b[B_ALOG],
                          .dt_bias = b[B_DT], .cu_seqlens = b[B_CU], .state_slots = b[B_SLOTS],
                          .state = v->b[B_STATE], .z = b[B_Z], .norm_w = b[B_NW], .out = v->b[B_OUT]},
                   .p = {.seq_len = 3, .n_k_heads = 2, .n_v_heads = 4, .k_dim = 8, .v_dim = 8,
                         .head_map = LMK_REPEAT_BLOCK, .norm = {.eps = 1e-6f}}};
}

static void apply(vcall *c, const vset *v, const rule *r)
{
    for (int i = 0; i < r->n; i++) {
        const change *ch = &r->c[i];
        lmk_buffer *buf = ch->buf >= 0 ? v->b[ch->buf] : NULL;
        const lmk_buffer **io[] = {&c->io.q, &c->io.k, &c->io.v, &c->io.a, &c->io.b, &c->io.A_log, &c->io.dt_bias,
                                   &c->io.cu_seqlens, &c->io.state_slots, NULL, &c->io.z, &c->io.norm_w, NULL};
        uint32_t *u[] = {&c->p.seq_len, &c->p.n_k_heads, &c->p.n_v_heads, &c->p.k_dim, &c->p.v_dim};
        if (ch->field == F_STREAM)
            c->s = NULL;
        else if (ch->field == F_IO || ch->field == F_PARAMS)
            *(ch->field == F_IO ? &c->null_io : &c->null_params) = true;
        else if (ch->field == F_STATE)
            c->io.state = buf;
        else if (ch->field == F_OUT)
            c->io.out = buf;
        else if (ch->field <= F_NW)
            *io[ch->field - F_Q] = buf;
        else if (ch->field <= P_DV)
            *u[ch->field - P_T] = (uint32_t)ch->value;
        else if (ch->field == P_MAP)
            c->p.head_map = (lmk_repeat_layout)ch->value;
        else if (ch->field == P_FLAGS)
            c->p.flags = (uint32_t)ch->value;
        else
            *(ch->field == P_SCALE ? &c->p.scale : ch->field == P_EPS ? &c->p.norm.eps : &c->p.norm.weight_offset) =
                (float)ch->value;
    }
}

static lmk_status vcall_run(const vcall *c)
{
    return lmk_gated_delta_rule(c->s, c->null_io ? NULL : &c->io, c->null_params ? NULL : &c->p);
}

/* A rejected call: INVALID_ARGUMENT, the op's name and the fragment in the message, mem unchanged. */
static void expect_reject(vset *v, const vcall *c, const char *want, const char *how)
{
    lmk_clear_error();
    const lmk_status st = vcall_run(c);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", lmk_last_error());
    unsigned char *now = tst_read_all(v->mem);
    const long long diff = now ? tst_bits_diff(now, v->image, MEM_BYTES) : 0;
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && strstr(msg, "gated_delta_rule") && strstr(msg, want) && now && diff < 0,
          "validation (%s): want INVALID_ARGUMENT with \"%s\", got %s \"%s\"%s", how, want, lmk_status_name(st), msg,
          diff >= 0 ? " and a byte written" : "");
    free(now);
    /* the workspace query validates exactly as the call: the same status and message, nothing out */
    size_t bytes = 7;
    lmk_clear_error();
    const lmk_status sq =
        lmk_gated_delta_rule_workspace(c->s, c->null_io ? NULL : &c->io, c->null_params ? NULL : &c->p, &bytes);
    CHECK(sq == st && !strcmp(lmk_last_error(), msg) && bytes == 7,
          "validation (%s): the workspace query gave %s \"%s\" (bytes %zu), the call %s \"%s\"", how,
          lmk_status_name(sq), lmk_last_error(), bytes, lmk_status_name(st), msg);
}

/* The first rule of a later clause than rule i that changes none of the fields rule i changes. */
static int next_clause(int i)
{
    for (int j = i + 1; j < N_RULES; j++) {
        bool disjoint = k_rules[j].step != k_rules[i].step;
        for (int a = 0; a < k_rules[i].n && disjoint; a++)
            for (int b = 0; b < k_rules[j].n && disjoint; b++)
                disjoint = k_rules[i].c[a].field != k_rules[j].c[b].field;
        if (disjoint)
            return j;
    }
    return N_RULES;
}

/* A call lmk.h allows: LMK_OK, then mem back to its image. */
static void expect_ok(vset *v, const vcall *c, const char *what)
{
    const lmk_status st = vcall_run(c);
    CHECK(st == LMK_OK, "validation: %s must be accepted, got %s \"%s\"", what, lmk_status_name(st), lmk_last_error());
    (void)TST_REQUIRE(lmk_buffer_write(v->mem, 0, v->image, MEM_BYTES) == LMK_OK, "restore: %s", lmk_last_error());
}

static void test_validation(lmk_device *cpu)
{
    vset v;
    if (!vset_make(&v, cpu)) {
        vset_free(&v);
        return;
    }
    int pairs = 0;
    for (int i = 0; i < N_RULES; i++) {
        vcall c = valid_call(&v);
        apply(&c, &v, &k_rules[i]);
        char how[64];
        snprintf(how, sizeof how, "rule %d", i);
        expect_reject(&v, &c, k_rules[i].want, how);
        const int j = next_clause(i);
        if (j == N_RULES || k_rules[i].unpaired)
            continue;
        apply(&c, &v, &k_rules[j]); /* a later clause broken too: this rule's message still comes first */
        snprintf(how, sizeof how, "rule %d with rule %d", i, j);
        expect_reject(&v, &c, k_rules[i].want, how);
        pairs++;
    }
    vcall c = valid_call(&v);
    expect_ok(&v, &c, "the valid call");
    size_t bytes = 7;
    lmk_status sq = lmk_gated_delta_rule_workspace(c.s, &c.io, &c.p, &bytes);
    CHECK(sq == LMK_OK && bytes == 0, "validation: the workspace query on the CPU gave %s, %zu bytes (want 0)",
          lmk_status_name(sq), bytes);
    sq = lmk_gated_delta_rule_workspace(c.s, &c.io, &c.p, NULL);
    CHECK(sq == LMK_ERR_INVALID_ARGUMENT && strstr(lmk_last_error(), "bytes must not be NULL"),
          "validation: the workspace query with bytes NULL gave %s \"%s\"", lmk_status_name(sq), lmk_last_error());
    c.io.z = c.io.norm_w = NULL, c.p.norm.eps = 0.0f;
    expect_ok(&v, &c, "norm.eps 0 without z");
    c = valid_call(&v), c.p.scale = -0.25f, c.p.head_map = LMK_REPEAT_TILED, c.p.flags = LMK_GDN_NO_L2NORM;
    expect_ok(&v, &c, "a negative scale, tiled heads, no L2 norm");
    c = valid_call(&v), c.io.state = v.b[X_STATE_EMPTY];
    expect_ok(&v, &c, "a pool of 0 rows (every sequence padding)");
    c = valid_call(&v), c.io.state_slots = NULL;
    expect_ok(&v, &c, "a state without state_slots (row s)");
    c = valid_call(&v), c.io.state_slots = NULL, c.io.state = NULL, c.io.cu_seqlens = NULL;
    expect_ok(&v, &c, "no state, one sequence");
    c = valid_call(&v), c.io.A_log = c.io.dt_bias = NULL;
    expect_ok(&v, &c, "g and beta given (no A_log, dt_bias)");
    printf("validation: %d rules in lmk.h's order (%d also with the next clause broken), 7 valid calls\n", N_RULES,
           pairs);
    vset_free(&v);
}

/* ------------------------------------------------------------------------------------------------ */

int main(void)
{
    tst_dev devs[TST_MAX_DEVS];
    const int n = tst_devs_open_isas(devs);
    lmk_device *cpu = NULL;
    if (!TST_REQUIRE(lmk_device_open(LMK_BACKEND_CPU, 0, &g_other) == LMK_OK, "open: %s", lmk_last_error()) ||
        !TST_REQUIRE(lmk_device_open(LMK_BACKEND_CPU, 0, &cpu) == LMK_OK, "open: %s", lmk_last_error()))
        return harness_summary();
    test_validation(cpu);
    test_thread_bits(cpu);
    for (int i = 0; i < n; i++) {
        tst_dev *d = &devs[i];
        test_table(d);
        test_split(d, LMK_F32, LMK_F32, false);
        test_split(d, LMK_F32, LMK_F32, true);
        test_split(d, LMK_BF16, LMK_BF16, false);
        test_varlen_alone(d);
        test_duplicates(d);
        test_hostile(d, GUARD);
        test_hostile(d, 0);
        test_traps(d);
        test_workspace_rules(d);
        test_chunk_cases(d);
        test_chunk_vs_token(d);
        test_chunk_long(d);
        test_chunk_hostile(d);
        if (!d->isa_variant) /* the capped CPU levels run the same orders; the long run takes seconds */
            test_long(d);
    }
    tst_devs_close(devs, n);
    lmk_device_close(cpu);
    lmk_device_close(g_other);
    return harness_summary();
}
