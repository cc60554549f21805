/*
 * test_gdn_chunked.c - the CPU's chunked form of lmk_gated_delta_rule (src/ops/gated_delta_rule/
 * cpu_chunk.c; docs/cpu.md "gated_delta_rule, chunked"), on every CPU instruction-set level
 * (tst_devs_open_isas; the CUDA side is tested in test_gated_delta_rule):
 *
 *  - real head dims (dk = dv = 128) at T = 64, 65, 127, 4096 and 4100 (whole chunks, a chunk and a
 *    token, a short final chunk, many chunks, many and a short one) and 15 (the token form), f32 and bf16 inputs, f32
 *    and bf16 pools in both layouts, both head maps, z on and off, q, k and v as strided views of a
 *    packed qkv row and z and out with padded token strides: every output row and the final state
 *    against the float64 reference (lmk_ref_gated_delta_rule) within lmk.h's norm-wise bound, and
 *    against the token-by-token form of the same call (LMK_GDN_CHUNK=0) within it too;
 *  - the chunked form did run: from the crossover (16 tokens) on its bits differ from the token
 *    form's, below it (T = 15) they are the same;
 *  - a varlen batch of long, short, one-token and empty sequences with a padding slot and two
 *    sequences naming one row (the last stores, both read the row as it was);
 *  - no L2 norm: moderate q and k run chunked and match the reference; large k (|k| up to 4, where
 *    the UT solve would blow up: every chunk's beta |k|^2 above 2) falls back to the token form,
 *    bit for bit;
 *  - the same bits from streams of 1 and 2 threads;
 *  - precision on a long sequence: f32, Hk = Hv = 1, dk = dv = 128, T = 65,536 (skipped under
 *    LMK_TEST_QUICK), every output row and the final state within 1e-4 of the reference.
 * Outputs are poisoned before each call and every byte of them is checked written.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "common.h"
#include "ops/gated_delta_rule/gated_delta_rule.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

HARNESS_DEFINE;

/* One problem: shapes, options, host inputs (in their dtypes and widened), the call's sequences. */
typedef struct prob {
    uint32_t T, hk, hv, dk, dv, n_slots;
    lmk_dtype dtype, state_dtype;
    lmk_repeat_layout map;
    bool z, kfast, no_l2, big_k;
    size_t qkv_tok, zo_tok;            /* token strides (elements) of the packed qkv row and of z/out */
    const int32_t *cu, *slots;         /* NULL: one sequence, row 0 */
    size_t n_seq;
    unsigned char *qkv, *zz, *pool;    /* in their dtypes and layouts */
    float *a, *b, *A_log, *dt_bias, *norm_w;
    float *q32, *k32, *v32, *z32, *pool32; /* widened, dense; pool32 [n_slots, hv, dk, dv] */
} prob;

typedef struct result {
    float *out;  /* [T, hv, dv] widened */
    float *pool; /* like pool32 */
    unsigned char *out_raw, *pool_raw;
} result;

static void result_free(result *r)
{
    free(r->out), free(r->pool), free(r->out_raw), free(r->pool_raw);
    memset(r, 0, sizeof *r);
}

static void prob_free(prob *p)
{
    void *all[] = {p->qkv, p->zz, p->pool, p->a, p->b, p->A_log, p->dt_bias, p->norm_w,
                   p->q32, p->k32, p->v32, p->z32, p->pool32};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

static size_t pool_at(const prob *p, size_t row, size_t h, size_t i, size_t j)
{
    return ((row * p->hv + h) * p->dk * p->dv) + (p->kfast ? j * p->dk + i : i * p->dv + j);
}

/* Random inputs: q, k, v, z in [-2, 2) (without the L2 norm q and k scaled to |k|^2 < 1, or k in
 * [-4, 4) when big_k), a and b in [-2, 2), Qwen3.5's gate parameter ranges, the pool in
 * +-2/sqrt(dk). */
static bool prob_make(prob *p, uint64_t seed)
{
    tst_rng r = tst_rng_make(seed);
    const size_t T = p->T, es = lmk_dtype_size(p->dtype), nqk = (size_t)p->hk * p->dk, nv = (size_t)p->hv * p->dv;
    const size_t np = (size_t)p->n_slots * p->hv * p->dk * p->dv;
    p->qkv_tok = 2 * nqk + nv + 8, p->zo_tok = nv + 16;
    p->qkv = malloc(T * p->qkv_tok * es), p->zz = malloc(T * p->zo_tok * es);
    p->pool = malloc(np * lmk_dtype_size(p->state_dtype) + 1), p->pool32 = malloc(np * 4 + 1);
    p->a = malloc(T * p->hv * 4), p->b = malloc(T * p->hv * 4), p->A_log = malloc(p->hv * 4);
    p->dt_bias = malloc(p->hv * 4), p->norm_w = malloc(p->dv * 4);
    p->q32 = malloc(T * nqk * 4), p->k32 = malloc(T * nqk * 4), p->v32 = malloc(T * nv * 4), p->z32 = malloc(T * nv * 4);
    if (!p->qkv || !p->zz || !p->pool || !p->pool32 || !p->a || !p->b || !p->A_log || !p->dt_bias || !p->norm_w ||
        !p->q32 || !p->k32 || !p->v32 || !p->z32)
        return TST_REQUIRE(0, "out of host memory for T=%u", p->T);
    const double qk = p->no_l2 ? 0.5 / sqrt((double)p->dk) : 2.0, kk = p->big_k ? 4.0 : qk;
    for (size_t t = 0; t < T; t++) {
        unsigned char *row = p->qkv + t * p->qkv_tok * es;
        for (size_t i = 0; i < nqk; i++) {
            tst_store(p->dtype, row, i, tst_rng_uniform(&r, -qk, qk));
            tst_store(p->dtype, row, nqk + i, tst_rng_uniform(&r, -kk, kk));
            p->q32[t * nqk + i] = (float)tst_load(p->dtype, row, i);
            p->k32[t * nqk + i] = (float)tst_load(p->dtype, row, nqk + i);
        }
        for (size_t i = 0; i < nv; i++) {
            tst_store(p->dtype, row, 2 * nqk + i, tst_rng_uniform(&r, -2, 2));
            p->v32[t * nv + i] = (float)tst_load(p->dtype, row, 2 * nqk + i);
            tst_store(p->dtype, p->zz, t * p->zo_tok + i, tst_rng_uniform(&r, -2, 2));
            p->z32[t * nv + i] = (float)tst_load(p->dtype, p->zz, t * p->zo_tok + i);
        }
    }
    for (size_t i = 0; i < T * p->hv; i++)
        p->a[i] = (float)tst_rng_uniform(&r, -2, 2), p->b[i] = (float)tst_rng_uniform(&r, -2, 2);
    for (size_t h = 0; h < p->hv; h++)
        p->A_log[h] = (float)tst_rng_uniform(&r, -2, 1), p->dt_bias[h] = (float)tst_rng_uniform(&r, -4, 0);
    for (size_t j = 0; j < p->dv; j++)
        p->norm_w[j] = (float)tst_rng_uniform(&r, 0.5, 1.5);
    const double ps = 2.0 / sqrt((double)p->dk);
    for (size_t row = 0; row < p->n_slots; row++)
        for (size_t h = 0; h < p->hv; h++)
            for (size_t i = 0; i < p->dk; i++)
                for (size_t j = 0; j < p->dv; j++) {
                    const size_t at = pool_at(p, row, h, i, j);
                    tst_store(p->state_dtype, p->pool, at, tst_rng_uniform(&r, -ps, ps));
                    p->pool32[((row * p->hv + h) * p->dk + i) * p->dv + j] = (float)tst_load(p->state_dtype, p->pool, at);
                }
    return true;
}

static lmk_buffer *host_buf(lmk_device *dev, const void *src, size_t bytes)
{
    return tst_buf(dev, LMK_U8, NULL, 0, bytes, 0, src, src ? bytes : 0, src ? -1 : (int)TST_POISON);
}

static lmk_buffer *view(const lmk_buffer *parent, size_t off, lmk_dtype dt, int nd, const size_t *n, const size_t *s)
{
    lmk_buffer *v = NULL;
    const lmk_status st = lmk_buffer_view_strided(parent, off, dt, n, s, nd, &v);
    return TST_REQUIRE(st == LMK_OK, "view: %s", lmk_last_error()) ? v : NULL;
}

/* The call on dev (threads: 0 keeps the device's), out and the pool read back. */
static bool run_lmk(const prob *p, lmk_device *dev, lmk_stream *s, result *res)
{
    memset(res, 0, sizeof *res);
    const size_t T = p->T, es = lmk_dtype_size(p->dtype), nqk = (size_t)p->hk * p->dk;
    const size_t pool_bytes = (size_t)p->n_slots * p->hv * p->dk * p->dv * lmk_dtype_size(p->state_dtype);
    lmk_buffer *qkv = host_buf(dev, p->qkv, T * p->qkv_tok * es), *zz = host_buf(dev, p->zz, T * p->zo_tok * es);
    lmk_buffer *out = host_buf(dev, NULL, T * p->zo_tok * es), *pool = host_buf(dev, p->pool, pool_bytes + 1);
    lmk_buffer *a = host_buf(dev, p->a, T * p->hv * 4), *b = host_buf(dev, p->b, T * p->hv * 4);
    lmk_buffer *al = host_buf(dev, p->A_log, p->hv * 4), *dt = host_buf(dev, p->dt_bias, p->hv * 4);
    lmk_buffer *nw = host_buf(dev, p->norm_w, p->dv * 4);
    const size_t nq[3] = {T, p->hk, p->dk}, sq[3] = {p->qkv_tok, p->dk, 1}, nv[3] = {T, p->hv, p->dv};
    const size_t sv[3] = {p->qkv_tok, p->dv, 1}, so[3] = {p->zo_tok, p->dv, 1}, ng[2] = {T, p->hv}, sg[2] = {p->hv, 1};
    const size_t nh[1] = {p->hv}, s1[1] = {1}, nd[1] = {p->dv};
    const size_t npool[4] = {p->n_slots, p->hv, p->dk, p->dv};
    const size_t spool[4] = {(size_t)p->hv * p->dk * p->dv, (size_t)p->dk * p->dv, p->kfast ? 1 : p->dv,
                             p->kfast ? p->dk : 1};
    lmk_buffer *vq = view(qkv, 0, p->dtype, 3, nq, sq), *vk = view(qkv, nqk * es, p->dtype, 3, nq, sq);
    lmk_buffer *vv = view(qkv, 2 * nqk * es, p->dtype, 3, nv, sv), *vz = view(zz, 0, p->dtype, 3, nv, so);
    lmk_buffer *vo = view(out, 0, p->dtype, 3, nv, so), *vp = view(pool, 0, p->state_dtype, 4, npool, spool);
    lmk_buffer *va = view(a, 0, LMK_F32, 2, ng, sg), *vb = view(b, 0, LMK_F32, 2, ng, sg);
    lmk_buffer *val = view(al, 0, LMK_F32, 1, nh, s1), *vdt = view(dt, 0, LMK_F32, 1, nh, s1);
    lmk_buffer *vnw = view(nw, 0, LMK_F32, 1, nd, s1);
    const size_t ncu[1] = {p->n_seq + 1}, nsl[1] = {p->n_seq};
    lmk_buffer *cu = p->cu ? tst_buf(dev, LMK_I32, ncu, 1, ncu[0] * 4, 0, p->cu, ncu[0] * 4, -1) : NULL;
    lmk_buffer *sl = p->slots ? tst_buf(dev, LMK_I32, nsl, 1, nsl[0] * 4, 0, p->slots, nsl[0] * 4, -1) : NULL;
    const lmk_gdn_io io = {.q = vq, .k = vk, .v = vv, .a = va, .b = vb, .A_log = val, .dt_bias = vdt,
                           .cu_seqlens = cu, .state_slots = sl, .state = vp, .z = p->z ? vz : NULL,
                           .norm_w = p->z ? vnw : NULL, .out = vo};
    const lmk_gdn_params prm = {.seq_len = T, .n_k_heads = p->hk, .n_v_heads = p->hv, .k_dim = p->dk, .v_dim = p->dv,
                                .head_map = p->map, .flags = p->no_l2 ? LMK_GDN_NO_L2NORM : 0,
                                .norm = {.eps = 1e-6f}};
    lmk_status st = lmk_gated_delta_rule(s, &io, &prm);
    if (st == LMK_OK)
        st = lmk_stream_sync(s);
    bool ok = TST_REQUIRE(st == LMK_OK, "lmk_gated_delta_rule: %s", lmk_last_error());
    if (ok) {
        res->out_raw = tst_read_all(out), res->pool_raw = tst_read_all(pool);
        const size_t n = T * p->hv * p->dv, np = (size_t)p->n_slots * p->hv * p->dk * p->dv;
        res->out = malloc(n * 4 + 1), res->pool = malloc(np * 4 + 1);
        ok = res->out_raw && res->pool_raw && TST_REQUIRE(res->out && res->pool, "out of host memory");
        for (size_t t = 0; ok && t < T; t++)
            for (size_t i = 0; i < (size_t)p->hv * p->dv; i++)
                res->out[t * p->hv * p->dv + i] = (float)tst_load(p->dtype, res->out_raw, t * p->zo_tok + i);
        for (size_t row = 0; ok && row < p->n_slots; row++)
            for (size_t h = 0; h < p->hv; h++)
                for (size_t i = 0; i < p->dk; i++)
                    for (size_t j = 0; j < p->dv; j++)
                        res->pool[((row * p->hv + h) * p->dk + i) * p->dv + j] =
                            (float)tst_load(p->state_dtype, res->pool_raw, pool_at(p, row, h, i, j));
    }
    lmk_buffer *all[] = {qkv, zz, out, pool, a, b, al, dt, nw, vq, vk, vv, vz, vo, vp, va, vb, val, vdt, vnw, cu, sl};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        lmk_buffer_free(all[i]);
    return ok;
}

/* The float64 reference over the f32 images (pool32 updated in a copy). */
static bool run_ref(const prob *p, result *res)
{
    memset(res, 0, sizeof *res);
    const size_t hk = p->hk, hv = p->hv, dk = p->dk, dv = p->dv, np = (size_t)p->n_slots * hv * dk * dv;
    res->out = malloc((size_t)p->T * hv * dv * 4 + 1), res->pool = malloc(np * 4 + 1);
    if (!TST_REQUIRE(res->out && res->pool, "out of host memory"))
        return false;
    memcpy(res->pool, p->pool32, np * 4);
    const lmk_gdn_args a = {
        .q = p->q32, .k = p->k32, .v = p->v32, .out = res->out, .dtype = LMK_F32, .T = p->T, .Hk = hk, .Hv = hv,
        .dk = dk, .dv = dv, .q_tok = hk * dk, .q_head = dk, .k_tok = hk * dk, .k_head = dk, .v_tok = hv * dv,
        .v_head = dv, .o_tok = hv * dv, .o_head = dv, .a = p->a, .b = p->b, .a_dtype = LMK_F32,
        .b_dtype = LMK_F32, .a_tok = hv, .b_tok = hv, .A_log = p->A_log, .dt_bias = p->dt_bias,
        .A_dtype = LMK_F32, .dt_dtype = LMK_F32, .z = p->z ? p->z32 : NULL, .z_dtype = LMK_F32, .z_tok = hv * dv,
        .z_head = dv, .norm_w = p->z ? p->norm_w : NULL, .nw_dtype = LMK_F32, .cu_seqlens = p->cu,
        .slots = p->slots, .n_seq = p->cu ? p->n_seq : 1, .state = res->pool, .state_dtype = LMK_F32,
        .n_slots = p->n_slots, .s_slot = hv * dk * dv, .s_head = dk * dv, .s_k = dv, .s_v = 1,
        .head_map = p->map, .scale = 1.0f / sqrtf((float)dk), .l2norm = !p->no_l2, .eps = 1e-6f};
    lmk_ref_gated_delta_rule(&a);
    return true;
}

/* ||got - want|| / (tol ||want|| + the norm of half an ulp of t at each element), infinity for a
 * non-finite got: at most 1 within lmk.h's bound. */
static double row_ratio(lmk_dtype t, const float *got, const float *want, size_t n, double tol)
{
    double e2 = 0, w2 = 0, u2 = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]))
            return INFINITY;
        const double half = 0.5 * tst_ulp(t, fmax(fabs(got[i]), fabs(want[i])));
        e2 += ((double)got[i] - want[i]) * ((double)got[i] - want[i]), w2 += (double)want[i] * want[i];
        u2 += half * half;
    }
    return sqrt(e2) / (tol * fmax(sqrt(w2), 1e-30) + sqrt(u2));
}

/* The worst row_ratio over every out row and every head's final state of the pool rows. */
static double worst(const prob *p, const result *got, const result *want, double tol, double *state_worst)
{
    double w = 0, ws = 0;
    for (size_t r = 0; r < (size_t)p->T * p->hv; r++)
        w = fmax(w, row_ratio(p->dtype, got->out + r * p->dv, want->out + r * p->dv, p->dv, tol));
    const size_t n = (size_t)p->dk * p->dv;
    for (size_t r = 0; r < (size_t)p->n_slots * p->hv; r++)
        ws = fmax(ws, row_ratio(p->state_dtype, got->pool + r * n, want->pool + r * n, n, tol));
    if (state_worst)
        *state_worst = ws;
    return fmax(w, ws);
}

/* Every out element written (the poison gone from each; the padding between rows untouched). */
static bool out_written(const prob *p, const result *r)
{
    const size_t es = lmk_dtype_size(p->dtype), row = (size_t)p->hv * p->dv * es;
    for (size_t t = 0; t < p->T; t++) {
        const unsigned char *at = r->out_raw + t * p->zo_tok * es;
        if (tst_count_unwritten(at, (size_t)p->hv * p->dv, es, TST_POISON) != 0 ||
            tst_find_not(at, row, p->zo_tok * es, TST_POISON) >= 0)
            return false;
    }
    return true;
}

static double tol_of(const prob *p)
{
    return p->dtype == LMK_F32 && p->state_dtype == LMK_F32 ? 1e-4 : 4e-3;
}

/* The call with LMK_GDN_CHUNK set to `chunk` ("0": the token form), on d. */
static bool run_mode(const prob *p, tst_dev *d, const char *chunk, result *r)
{
    setenv("LMK_GDN_CHUNK", chunk, 1);
    const bool ok = run_lmk(p, d->dev, d->stream, r);
    unsetenv("LMK_GDN_CHUNK");
    return ok;
}

/* p on d: chunked against the reference and against the token form; `differs`: whether their bits
 * must differ (the chunked form ran) or must not (below the crossover, or every chunk refused). */
static void check_prob(tst_dev *d, prob *p, const char *what, int differs)
{
    result ch, tk, ref;
    if (!prob_make(p, tst_case_seed()) || !run_mode(p, d, "1", &ch) || !run_mode(p, d, "0", &tk) || !run_ref(p, &ref))
        return;
    const double tol = tol_of(p);
    double st_ref, st_tok;
    const double vs_ref = worst(p, &ch, &ref, tol, &st_ref), vs_tok = worst(p, &ch, &tk, tol, &st_tok);
    const size_t nout = (size_t)p->T * p->zo_tok * lmk_dtype_size(p->dtype);
    const size_t npool = (size_t)p->n_slots * p->hv * p->dk * p->dv * lmk_dtype_size(p->state_dtype);
    const bool same = !memcmp(ch.out_raw, tk.out_raw, nout) && !memcmp(ch.pool_raw, tk.pool_raw, npool);
    CHECK(out_written(p, &ch), "%s [%s]: every out element written, nothing between rows", what, d->name);
    if (p->big_k) {
        CHECK(same, "%s [%s]: every chunk refused: the token form's bits", what, d->name);
    } else {
        CHECK(vs_ref <= 1.0, "%s [%s]: %.3f of the %g bound from float64 (state %.3f)", what, d->name, vs_ref, tol,
              st_ref);
        CHECK(vs_tok <= 1.0, "%s [%s]: %.3f of the bound from the token form (state %.3f)", what, d->name, vs_tok,
              st_tok);
        if (differs >= 0)
            CHECK(same == !differs, "%s [%s]: bits %s the token form's, as they must", what, d->name,
                  same ? "equal" : "differ from");
    }
    result_free(&ch), result_free(&tk), result_free(&ref);
    prob_free(p);
}

static prob shape(uint32_t T, uint32_t hk, uint32_t hv, lmk_dtype dtype, lmk_dtype state_dtype)
{
    return (prob){.T = T, .hk = hk, .hv = hv, .dk = 128, .dv = 128, .n_slots = 1, .dtype = dtype,
                  .state_dtype = state_dtype, .map = LMK_REPEAT_BLOCK, .z = true};
}

/* Lengths around the chunk size and long ones, every option in turn. */
static void test_lengths(tst_dev *d, bool scalar)
{
    static const uint32_t lens[] = {15, 64, 65, 127, 4100, 4096};
    const size_t n = scalar || tst_quick() ? 5 : 6;
    for (size_t i = 0; i < n; i++) {
        const bool odd = i & 1;
        prob p = shape(scalar && lens[i] > 1000 ? 1100 : lens[i], 2, 6, odd ? LMK_BF16 : LMK_F32,
                       i % 3 == 2 ? LMK_BF16 : LMK_F32);
        p.map = odd ? LMK_REPEAT_TILED : LMK_REPEAT_BLOCK, p.z = i != 2, p.kfast = i == 3 || i == 5;
        char what[96];
        snprintf(what, sizeof what, "T=%u %s inputs, %s pool%s, %s, z %s", p.T, odd ? "bf16" : "f32",
                 p.state_dtype == LMK_F32 ? "f32" : "bf16", p.kfast ? " dk fastest" : "", odd ? "tiled" : "block",
                 p.z ? "on" : "off");
        check_prob(d, &p, what, p.T >= 16);
    }
}

/* Long, short, one-token, empty and padding sequences; rows 0 and 2 each named twice. */
static void test_varlen(tst_dev *d)
{
    static const int32_t cu[] = {0, 200, 200, 263, 264, 300, 430, 500};
    static const int32_t slots[] = {2, 1, 0, -1, 2, 0, 3};
    prob p = shape(500, 2, 4, LMK_F32, LMK_F32);
    p.cu = cu, p.slots = slots, p.n_seq = 7, p.n_slots = 4;
    check_prob(d, &p, "varlen 200,0,63,1,36,130,70, padding slot, rows named twice", 1);
    p = shape(500, 2, 4, LMK_BF16, LMK_BF16);
    p.cu = cu, p.slots = slots, p.n_seq = 7, p.n_slots = 4, p.kfast = true, p.map = LMK_REPEAT_TILED;
    check_prob(d, &p, "varlen bf16, bf16 pool dk fastest", 1);
}

static void test_no_l2(tst_dev *d)
{
    prob p = shape(300, 1, 2, LMK_F32, LMK_F32);
    p.no_l2 = true;
    check_prob(d, &p, "no L2 norm, moderate q and k", 1);
    p = shape(130, 1, 2, LMK_F32, LMK_F32);
    p.no_l2 = true, p.big_k = true;
    check_prob(d, &p, "no L2 norm, |k| up to 4 (beta |k|^2 above 2)", 0);
}

/* The same bits from streams of 1 and 2 threads (the Qwen3.5 shape, chunked). */
static void test_threads(lmk_device *cpu)
{
    prob p = shape(tst_quick() ? 1024 : 4096, 16, 48, LMK_BF16, LMK_F32);
    lmk_stream *s1 = NULL, *s2 = NULL;
    result r1, r2;
    if (!prob_make(&p, tst_case_seed()))
        return;
    const bool made = lmk_device_set_threads(cpu, 1) == LMK_OK && lmk_stream_create(cpu, &s1) == LMK_OK &&
                      lmk_device_set_threads(cpu, 2) == LMK_OK && lmk_stream_create(cpu, &s2) == LMK_OK;
    if (TST_REQUIRE(made, "streams: %s", lmk_last_error()) && run_lmk(&p, cpu, s1, &r1)) {
        if (run_lmk(&p, cpu, s2, &r2)) {
            const size_t nout = (size_t)p.T * p.zo_tok * 2, npool = (size_t)p.hv * p.dk * p.dv * 4;
            CHECK(!memcmp(r1.out_raw, r2.out_raw, nout) && !memcmp(r1.pool_raw, r2.pool_raw, npool),
                  "Qwen3.5-27B T=%u bf16: the same bits from 1 and 2 threads", p.T);
            result_free(&r2);
        }
        result_free(&r1);
    }
    lmk_stream_destroy(s1), lmk_stream_destroy(s2);
    prob_free(&p);
}

/* f32, one head pair, T = 65,536: every row and the final state within 1e-4 of float64. */
static void test_long(tst_dev *d)
{
    if (tst_quick()) {
        SKIP("long: T=65,536 (LMK_TEST_QUICK)");
        return;
    }
    prob p = shape(65536, 1, 1, LMK_F32, LMK_F32);
    result ch, ref;
    if (!prob_make(&p, tst_case_seed()) || !run_mode(&p, d, "1", &ch) || !run_ref(&p, &ref))
        return;
    double st;
    const double w = worst(&p, &ch, &ref, 1e-4, &st);
    printf("long [%s] T=65,536 f32 dk=dv=128: worst out row or state %.3f of the 1e-4 bound (state %.3f)\n", d->name,
           w, st);
    CHECK(w <= 1.0, "long [%s] T=65,536 f32 dk=dv=128: worst row %.3f of the 1e-4 bound (state %.3f)", d->name, w, st);
    result_free(&ch), result_free(&ref);
    prob_free(&p);
}

int main(void)
{
    tst_dev devs[TST_MAX_DEVS];
    const int n = tst_devs_open_isas(devs);
    for (int i = 0; i < n; i++) {
        if (devs[i].backend != LMK_BACKEND_CPU)
            continue;
        const bool scalar = strstr(lmk_device_name(devs[i].dev), "scalar") != NULL;
        test_lengths(&devs[i], scalar);
        test_varlen(&devs[i]);
        test_no_l2(&devs[i]);
        if (!devs[i].isa_variant)
            test_long(&devs[i]);
    }
    if (n > 0 && devs[0].backend == LMK_BACKEND_CPU)
        test_threads(devs[0].dev);
    tst_devs_close(devs, n);
    return harness_summary();
}
