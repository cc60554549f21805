/*
 * test_causal_conv1d.c - lmk_causal_conv1d (lmk.h "causal_conv1d": the depthwise causal
 * convolution of the Gated DeltaNet layers, with its state pool) on every backend.
 *
 * 1. The reference itself (lmk_ref_causal_conv1d) on hand-computed calls: exact sums, SiLU, the
 *    state shift of a sequence shorter than W-1, a single rounding to bf16.
 * 2. Every case of the op's table (src/ops/causal_conv1d/case.c) on every device, and random
 *    cases: outputs within lmk.h's precision of the float64 reference, the state pool bit for bit,
 *    every other byte (guards, gaps, inputs) untouched; the descriptor's invalid calls rejected.
 * 3. Equivalences, bit for bit on the CPU (its arithmetic per element does not depend on where xx
 *    comes from) and on the other backends within two ulps for y, bit for bit for the state: a
 *    sequence split at every token across two calls (the state carried through the pool) and one
 *    token a call equal one call; a varlen batch equals its sequences run alone; in place equals
 *    out of place; a long sequence alone equals it followed by empty ones (on the CPU the call
 *    then counts as one of short sequences, which takes the other weight path). Every call's pool
 *    sits between two guard rows that must keep their bytes.
 * 4. Hostile cu_seqlens and state_slots (device data: non-monotone, past T, negative, INT_MIN,
 *    INT64_MIN, huge slots): the call returns, and writes no byte outside y and the state pool.
 * 5. Padding slots (negative, n_slots, huge): their sequences start from zeros and no row is
 *    stored for them; rows no sequence names keep their bits.
 * 6. Every validation rule of lmk.h, in its order, with its message, and nothing written.
 * 7. Determinism across thread counts (1, 2, 3) at each ISA level, on a varlen batch with
 *    duplicate slots and on a decode batch; the calling thread's stack a call uses, measured on a
 *    painted stack against lmk.h's bound (CPU).
 */
#include "common.h"
#include "ops/causal_conv1d/causal_conv1d.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

HARNESS_DEFINE;

#if defined(__SANITIZE_ADDRESS__)
#define CONV_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CONV_ASAN 1
#endif
#endif

/* ------------------------------------------------------------------------------------------------
 * 1. the reference on hand-computed calls
 * ---------------------------------------------------------------------------------------------- */

static void put_f32(float *p, size_t n, const double *v)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (float)v[i];
}

/* C = 1, W = 3, no activation, bias 0.5: y[t] = 0.5 + 0.25 xx[t] - xx[t+1] + 2 xx[t+2] with xx the
 * two state rows then x; a sequence of one token leaves the state shifted by one. */
static void test_reference_exact(void)
{
    float x[3], w[3], b = 0.5f, st[2], y[3];
    put_f32(x, 3, (const double[]){1.0, -2.0, 4.0});
    put_f32(w, 3, (const double[]){0.25, -1.0, 2.0});
    put_f32(st, 2, (const double[]){8.0, 16.0});
    const int64_t cu[3] = {0, 1, 3}, slots[2] = {0, 0};
    lmk_causal_conv1d_args a = {.x = x, .y = y, .dtype = LMK_F32, .T = 3, .C = 1, .W = 3, .x_tok = 1, .y_tok = 1,
                                .weight = w, .w_dtype = LMK_F32, .bias = &b, .bias_dtype = LMK_F32, .cu_seqlens = cu,
                                .cu_is64 = 1, .n_seq = 1, .state = st, .n_slots = 1, .st_slot = 2, .st_row = 1,
                                .st_ch = 1, .act = LMK_ACT_NONE};
    lmk_ref_causal_conv1d(&a); /* one sequence [0, 1): xx = 8, 16, 1 */
    CHECK(y[0] == 0.5f + 2.0f - 16.0f + 2.0f && st[0] == 16.0f && st[1] == 1.0f,
          "reference, one token: y %g state %g %g (want -11.5, 16, 1)", (double)y[0], (double)st[0], (double)st[1]);
    put_f32(st, 2, (const double[]){8.0, 16.0});
    a.n_seq = 2, a.slots = slots, a.slots_is64 = 1;
    lmk_ref_causal_conv1d(&a); /* two sequences naming row 0: both read 8, 16; the second stores */
    const double want1 = 0.5 + 0.25 * 8 - 16 + 2 * -2.0, want2 = 0.5 + 0.25 * 16 - (-2.0) + 2 * 4.0;
    CHECK(y[1] == (float)want1 && y[2] == (float)want2 && st[0] == -2.0f && st[1] == 4.0f,
          "reference, duplicate row: y %g %g (want %g %g), state %g %g (want -2 4)", (double)y[1], (double)y[2],
          want1, want2, (double)st[0], (double)st[1]);
}

/* SiLU, and the single rounding to bf16: x = 1 and bias 2^-8 + 2^-30 make 1 + 2^-8 + 2^-30, just
 * above the tie between the bf16 values 1 and 1 + 2^-7, so it rounds up; rounded to f32 first it
 * would become the tie itself and round to even (1). */
static void test_reference_rounding(void)
{
    float x[1] = {1.0f}, w[2] = {0.0f, 1.0f}, y[1];
    lmk_causal_conv1d_args a = {.x = x, .y = y, .dtype = LMK_F32, .T = 1, .C = 1, .W = 2, .x_tok = 1, .y_tok = 1,
                                .weight = w, .w_dtype = LMK_F32, .n_seq = 1, .act = LMK_ACT_SILU};
    lmk_ref_causal_conv1d(&a);
    const double silu1 = 1.0 / (1.0 + exp(-1.0));
    CHECK(y[0] == (float)silu1, "reference SiLU(1) = %.9g (want %.9g)", (double)y[0], silu1);
    const uint16_t xb[1] = {lmk_f32_to_bf16(1.0f)}, wb[2] = {0, lmk_f32_to_bf16(1.0f)};
    const float b = (float)(0x1p-8 + 0x1p-30);
    uint16_t yb[1];
    a = (lmk_causal_conv1d_args){.x = xb, .y = yb, .dtype = LMK_BF16, .T = 1, .C = 1, .W = 2, .x_tok = 1, .y_tok = 1,
                                 .weight = wb, .w_dtype = LMK_BF16, .bias = &b, .bias_dtype = LMK_F32, .n_seq = 1,
                                 .act = LMK_ACT_NONE};
    lmk_ref_causal_conv1d(&a);
    CHECK(lmk_bf16_to_f32(yb[0]) == 1.0f + 0x1p-7f, "reference bf16 rounding: %.9g (want %.9g, rounded once)",
          (double)lmk_bf16_to_f32(yb[0]), (double)(1.0f + 0x1p-7f));
}

/* ------------------------------------------------------------------------------------------------
 * 2. the table and random cases of the descriptor
 * ---------------------------------------------------------------------------------------------- */

static const tst_op *conv_op(void)
{
    return tst_op_find("causal_conv1d");
}

/* One case made on d: checked against the reference, then its invalid calls rejected. */
static void check_case(const tst_dev *d, const tst_case *c, bool rejects)
{
    const uint64_t seed = tst_case_seed();
    tst_result r;
    tst_case_check(c, d->stream, seed, &r, NULL);
    CHECK(r.ok, "[%s] %s seed 0x%016" PRIx64 ": %s", d->name, c->name, seed, r.msg);
    tst_inst *in = NULL;
    if (!rejects || !TST_REQUIRE(tst_inst_make(c, d->dev, seed, 0, NULL, &in) == LMK_OK, "[%s] %s: make: %s",
                                 d->name, c->name, lmk_last_error()))
        return;
    for (int k = 0; k < c->op->n_invalid; k++) {
        tst_result rr;
        CHECK(tst_inst_reject(in, d->stream, k, &rr), "[%s] %s invalid call %d: %s", d->name, c->name, k, rr.msg);
    }
    tst_inst_free(in);
}

static void test_table(const tst_dev *d)
{
    const tst_op *op = conv_op();
    if (!TST_REQUIRE(op, "causal_conv1d is not in the registry"))
        return;
    int n = 0;
    for (int i = 0; i < op->n_cases(); i++) {
        const tst_case c = tst_op_case(op, i);
        if (c.flags & TST_CASE_FULL)
            continue; /* lmk check runs them */
        check_case(d, &c, true);
        n++;
    }
    CHECK(n >= 20, "[%s] only %d table cases", d->name, n);
    tst_rng r = tst_rng_make(tst_case_seed());
    const int n_random = tst_quick() ? 40 : 200;
    for (int i = 0; i < n_random; i++) {
        const tst_case c = tst_op_random_case(op, &r);
        check_case(d, &c, i % 10 == 0);
    }
}

/* ------------------------------------------------------------------------------------------------
 * calls on dense host data
 * ---------------------------------------------------------------------------------------------- */

typedef struct spec {
    uint32_t T, C, W;
    lmk_activation act;
    lmk_dtype dt, wdt;
    bool bias;
    size_t n_slots; /* rows of the pool; 0: no state */
} spec;

/* Random inputs of a spec: x [T, C], weight [C, W], bias [C] (f32), pool [n_slots, W-1, C]. */
typedef struct host {
    spec s;
    size_t es, row_bytes, pool_bytes;
    unsigned char *x, *w, *b, *st;
} host;

static void host_free(host *h)
{
    free(h->x), free(h->w), free(h->b), free(h->st);
    memset(h, 0, sizeof *h);
}

static bool host_make(host *h, const spec *s, uint64_t seed)
{
    tst_rng r = tst_rng_make(seed);
    *h = (host){.s = *s, .es = lmk_dtype_size(s->dt)};
    h->row_bytes = (s->W - 1) * (size_t)s->C * h->es;
    h->pool_bytes = s->n_slots * h->row_bytes;
    h->x = malloc((size_t)s->T * s->C * h->es);
    h->w = malloc((size_t)s->C * s->W * lmk_dtype_size(s->wdt));
    h->b = malloc((size_t)s->C * 4);
    h->st = malloc(h->pool_bytes + 1);
    if (!TST_REQUIRE(h->x && h->w && h->b && h->st, "out of host memory")) {
        host_free(h);
        return false;
    }
    tst_fill_random(&r, s->dt, h->x, (size_t)s->T * s->C);
    tst_fill_random(&r, s->wdt, h->w, (size_t)s->C * s->W);
    tst_fill_random(&r, LMK_F32, h->b, s->C);
    tst_fill_random(&r, s->dt, h->st, s->n_slots * (s->W - 1) * s->C);
    return true;
}

/* The sequences of a call: n_cu 0 means cu_seqlens NULL (one sequence); slots NULL means none. */
typedef struct seqs {
    size_t n_cu;
    const int64_t *cu;
    const int64_t *slots;
    lmk_dtype idx;
} seqs;

static size_t n_seq_of(const seqs *q)
{
    return q->n_cu ? q->n_cu : 1;
}

/* A dense i32 or i64 buffer holding v[0..n). */
static lmk_buffer *index_buf(lmk_device *dev, lmk_dtype idx, const int64_t *v, size_t n)
{
    int32_t *v32 = malloc(n * sizeof *v32 + 1);
    if (!TST_REQUIRE(v32, "out of host memory"))
        return NULL;
    for (size_t i = 0; i < n; i++)
        v32[i] = (int32_t)v[i];
    lmk_buffer *b = tst_buf(dev, idx, &n, 1, n * lmk_dtype_size(idx), 0, idx == LMK_I64 ? (const void *)v : v32,
                            n * lmk_dtype_size(idx), -1);
    free(v32);
    return b;
}

#define GUARD_BYTE 0x5A

/* The device buffers of one call. The pool is a view of rows 1 .. n_slots of a parent with a row of
 * GUARD_BYTE on either side. */
typedef struct dev_bufs {
    lmk_buffer *x, *y, *w, *b, *cu, *slots, *parent, *st;
} dev_bufs;

static void bufs_free(dev_bufs *b)
{
    lmk_buffer_free(b->st);
    lmk_buffer *all[] = {b->x, b->y, b->w, b->b, b->cu, b->slots, b->parent};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        lmk_buffer_free(all[i]);
    memset(b, 0, sizeof *b);
}

static bool bufs_make(const tst_dev *d, const host *h, size_t t0, size_t T, const unsigned char *st_in, const seqs *q,
                      bool in_place, dev_bufs *b)
{
    const spec *s = &h->s;
    const size_t C = s->C, es = h->es, shape_x[2] = {T, C}, shape_w[2] = {C, s->W}, cc = C;
    memset(b, 0, sizeof *b);
    b->x = tst_buf(d->dev, s->dt, shape_x, 2, T * C * es, 0, h->x + t0 * C * es, T * C * es, -1);
    b->y = in_place ? NULL : tst_buf(d->dev, s->dt, shape_x, 2, T * C * es, 0, NULL, 0, TST_POISON);
    b->w = tst_buf(d->dev, s->wdt, shape_w, 2, C * s->W * lmk_dtype_size(s->wdt), 0, h->w, C * s->W * lmk_dtype_size(s->wdt), -1);
    b->b = s->bias ? tst_buf(d->dev, LMK_F32, &cc, 1, C * 4, 0, h->b, C * 4, -1) : NULL;
    b->cu = q->n_cu ? index_buf(d->dev, q->idx, q->cu, q->n_cu + 1) : NULL;
    b->slots = q->slots ? index_buf(d->dev, q->idx, q->slots, n_seq_of(q)) : NULL;
    bool ok = b->x && (in_place || b->y) && b->w && (!s->bias || b->b) && (!q->n_cu || b->cu) && (!q->slots || b->slots);
    if (ok && s->n_slots) {
        const size_t len = (s->n_slots + 2) * h->row_bytes;
        b->parent = tst_buf(d->dev, LMK_U8, NULL, 0, len, 0, NULL, 0, GUARD_BYTE);
        const size_t shape[3] = {s->n_slots, s->W - 1, C};
        ok = b->parent && lmk_buffer_write(b->parent, h->row_bytes, st_in, h->pool_bytes) == LMK_OK &&
             lmk_buffer_view(b->parent, h->row_bytes, s->dt, shape, 3, &b->st) == LMK_OK;
    }
    return TST_REQUIRE(ok, "[%s] buffers: %s", d->name, lmk_last_error());
}

/* Tokens [t0, t0 + T) of h's x as one call on d, with the pool st_in (n_slots rows; unused without a
 * state): y into y_out (T x C), the pool after the call into st_out. Fails (a counted failure) when
 * the call fails or writes beside the pool. */
static bool dev_call(const tst_dev *d, const host *h, size_t t0, size_t T, const unsigned char *st_in, const seqs *q,
                     bool in_place, unsigned char *y_out, unsigned char *st_out)
{
    const spec *s = &h->s;
    dev_bufs b;
    bool ok = bufs_make(d, h, t0, T, st_in, q, in_place, &b);
    if (ok) {
        const lmk_causal_conv1d_params p = {(uint32_t)T, s->C, s->W, s->act};
        lmk_status st = lmk_causal_conv1d(d->stream, b.x, b.w, b.b, b.cu, b.slots, b.st, in_place ? b.x : b.y, &p);
        if (st == LMK_OK)
            st = lmk_stream_sync(d->stream);
        if (st == LMK_OK)
            st = lmk_buffer_read(in_place ? b.x : b.y, 0, y_out, T * s->C * h->es);
        unsigned char *par = st == LMK_OK && b.parent ? tst_read_all(b.parent) : NULL;
        if (par) {
            memcpy(st_out, par + h->row_bytes, h->pool_bytes);
            const size_t end = (s->n_slots + 1) * h->row_bytes;
            ok = TST_REQUIRE(tst_find_not(par, 0, h->row_bytes, GUARD_BYTE) < 0 &&
                                 tst_find_not(par, end, end + h->row_bytes, GUARD_BYTE) < 0,
                             "[%s] a call wrote beside the state pool", d->name);
        }
        free(par);
        ok = TST_REQUIRE(st == LMK_OK, "[%s] call: %s: %s", d->name, lmk_status_name(st), lmk_last_error()) && ok;
    }
    bufs_free(&b);
    return ok;
}

/* Equal outputs: bit for bit on the CPU; elsewhere within two ulps of the dtype. */
static bool same_y(const tst_dev *d, lmk_dtype dt, const unsigned char *a, const unsigned char *b, size_t n,
                   size_t *at)
{
    for (size_t i = 0; i < n; i++) {
        const size_t es = lmk_dtype_size(dt);
        if (!memcmp(a + i * es, b + i * es, es))
            continue;
        const double u = lmk_float_load(dt, a, i), v = lmk_float_load(dt, b, i);
        if (d->backend == LMK_BACKEND_CPU || !(fabs(u - v) <= 2 * lmk_ulp(dt, fmax(fabs(u), fabs(v))))) {
            *at = i;
            return false;
        }
    }
    return true;
}

/* ------------------------------------------------------------------------------------------------
 * 3. equivalences
 * ---------------------------------------------------------------------------------------------- */

static char *spec_name(char *buf, size_t n, const spec *s)
{
    snprintf(buf, n, "C=%u W=%u T=%u %s w=%s%s%s rows=%zu", s->C, s->W, s->T, lmk_dtype_name(s->dt),
             lmk_dtype_name(s->wdt), s->act == LMK_ACT_SILU ? " silu" : "", s->bias ? " bias" : "", s->n_slots);
    return buf;
}

/* Results of runs that must agree: y (T x C) and the pool. */
typedef struct outs {
    unsigned char *y, *st;
} outs;

static bool outs_alloc(outs *o, const host *h)
{
    o->y = malloc((size_t)h->s.T * h->s.C * h->es + 1);
    o->st = malloc(h->pool_bytes + 1);
    return TST_REQUIRE(o->y && o->st, "out of host memory");
}

static void outs_free(outs *o)
{
    free(o->y), free(o->st);
    o->y = o->st = NULL;
}

/* CHECKs that b equals a (y as same_y, the pool bit for bit). */
static void check_same(const tst_dev *d, const host *h, const outs *a, const outs *b, const char *what)
{
    char name[128];
    size_t at = 0;
    const bool y_ok = same_y(d, h->s.dt, a->y, b->y, (size_t)h->s.T * h->s.C, &at);
    const long long st_at = tst_bits_diff(a->st, b->st, h->pool_bytes);
    CHECK(y_ok && st_at < 0, "[%s] %s %s: %s differs (y token %zu channel %zu; pool byte %lld)", d->name,
          spec_name(name, sizeof name, &h->s), what, y_ok ? "the pool" : "y", at / h->s.C, at % h->s.C, st_at);
}

/* A sequence of T tokens using row 1 of the pool: split at every token into two calls (the
 * second starting from the pool the first left) equals one call; so do T calls of one token. */
static void test_split(const tst_dev *d, const spec *s)
{
    host h;
    outs one = {0}, two = {0};
    if (!host_make(&h, s, tst_case_seed()) || !outs_alloc(&one, &h) || !outs_alloc(&two, &h))
        goto done;
    const int64_t row1[1] = {1};
    const seqs q = {.slots = row1, .idx = LMK_I32};
    const size_t C = s->C, es = h.es;
    unsigned char *mid = malloc(h.pool_bytes + 1);
    if (!TST_REQUIRE(mid, "out of host memory") || !dev_call(d, &h, 0, s->T, h.st, &q, true, one.y, one.st))
        goto done_mid;
    CHECK(memcmp(one.st, h.st, h.row_bytes) == 0 && memcmp(one.st + 2 * h.row_bytes, h.st + 2 * h.row_bytes,
                                                           h.pool_bytes - 2 * h.row_bytes) == 0 &&
              memcmp(one.st + h.row_bytes, h.st + h.row_bytes, h.row_bytes) != 0,
          "[%s] split: one call must update row 1 of the pool and only it", d->name);
    for (size_t k = 1; k < s->T; k++) {
        char what[48];
        snprintf(what, sizeof what, "split at token %zu", k);
        if (dev_call(d, &h, 0, k, h.st, &q, k % 2 == 0, two.y, mid) &&
            dev_call(d, &h, k, s->T - k, mid, &q, k % 2 == 1, two.y + k * C * es, two.st))
            check_same(d, &h, &one, &two, what);
    }
    memcpy(mid, h.st, h.pool_bytes);
    bool ok = true;
    for (size_t t = 0; t < s->T && ok; t++) {
        ok = dev_call(d, &h, t, 1, mid, &q, false, two.y + t * C * es, two.st);
        memcpy(mid, two.st, h.pool_bytes);
    }
    if (ok)
        check_same(d, &h, &one, &two, "one token a call");
done_mid:
    free(mid);
done:
    outs_free(&one), outs_free(&two), host_free(&h);
}

/* A varlen batch (an empty sequence, one of one token, ones shorter than W-1, long ones; distinct
 * rows in shuffled order) equals its sequences run alone, one call each; in place equals out of
 * place; and the same tokens with empty sequences added (which turns a call of long sequences
 * into one of short ones on the CPU: the other weight path) give the same results. */
static void test_varlen(const tst_dev *d, const spec *s, lmk_dtype idx)
{
    static const size_t len[6] = {9, 0, 1, 2, 40, 3}; /* T = 55 */
    const int64_t cu[7] = {0, 9, 9, 10, 12, 52, 55}, slots[6] = {4, 0, 2, 5, 1, 3};
    host h;
    outs batch = {0}, alone = {0}, other = {0};
    if (!host_make(&h, s, tst_case_seed()) || !outs_alloc(&batch, &h) || !outs_alloc(&alone, &h) ||
        !outs_alloc(&other, &h))
        goto done;
    const seqs q = {.n_cu = 6, .cu = cu, .slots = slots, .idx = idx};
    if (!dev_call(d, &h, 0, s->T, h.st, &q, false, batch.y, batch.st))
        goto done;
    memcpy(alone.st, h.st, h.pool_bytes);
    bool ok = true;
    for (size_t i = 0; i < 6 && ok; i++) {
        const seqs one = {.slots = &slots[i], .idx = idx};
        if (len[i])
            ok = dev_call(d, &h, (size_t)cu[i], len[i], alone.st, &one, i % 2 == 0, alone.y + cu[i] * s->C * h.es,
                          other.st);
        if (ok && len[i])
            memcpy(alone.st, other.st, h.pool_bytes);
    }
    if (ok)
        check_same(d, &h, &batch, &alone, "batch vs each sequence alone");
    if (dev_call(d, &h, 0, s->T, h.st, &q, true, other.y, other.st))
        check_same(d, &h, &batch, &other, "in place vs out of place");
    const int64_t cu2[4] = {0, 55, 55, 55}, slots2[3] = {3, 0, 4};
    const seqs whole = {.n_cu = 1, .cu = cu2, .slots = slots2, .idx = idx}, padded = {.n_cu = 3, .cu = cu2, .slots = slots2, .idx = idx};
    if (dev_call(d, &h, 0, s->T, h.st, &whole, true, batch.y, batch.st) &&
        dev_call(d, &h, 0, s->T, h.st, &padded, false, other.y, other.st))
        check_same(d, &h, &batch, &other, "one sequence vs the same with empty ones after it");
done:
    outs_free(&batch), outs_free(&alone), outs_free(&other), host_free(&h);
}

static void test_equivalences(const tst_dev *d)
{
    static const spec splits[] = {
        {13, 100, 4, LMK_ACT_SILU, LMK_BF16, LMK_BF16, false, 3},
        {11, 37, 2, LMK_ACT_SILU, LMK_F32, LMK_F32, true, 3},
        {12, 70, 8, LMK_ACT_NONE, LMK_F16, LMK_BF16, true, 3},
        {9, 64, 5, LMK_ACT_SILU, LMK_BF16, LMK_F32, false, 3},
    };
    for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++)
        test_split(d, &splits[i]);
    static const spec varlens[] = {
        {55, 300, 4, LMK_ACT_SILU, LMK_BF16, LMK_BF16, false, 6},
        {55, 77, 3, LMK_ACT_SILU, LMK_F32, LMK_BF16, true, 6},
        {55, 96, 7, LMK_ACT_SILU, LMK_F16, LMK_F16, true, 6},
    };
    for (size_t i = 0; i < sizeof varlens / sizeof varlens[0]; i++)
        test_varlen(d, &varlens[i], i % 2 ? LMK_I64 : LMK_I32);
}

/* ------------------------------------------------------------------------------------------------
 * 4. hostile cu_seqlens and state_slots
 * ---------------------------------------------------------------------------------------------- */

#define H_T 20
#define H_C 70
#define H_W 4
#define H_SEQ 4
#define H_SLOTS 5

/* One call on guarded testkit memory whose cu_seqlens and slots hold anything: it must return
 * LMK_OK (device data is not validated) and write no byte but y's and the pool's elements. */
static void hostile_run(const tst_dev *d, const int64_t *cu, const int64_t *slots, lmk_dtype idx, bool in_place,
                        const char *what)
{
    tst_mem m = {.dev = d->dev};
    tst_rng r = tst_rng_make(tst_case_seed());
    const lmk_dtype dt = LMK_BF16;
    const size_t es = 2, xs[3] = {H_T, 1, H_C}, ws[3] = {H_C, 1, H_W}, ps[3] = {H_SLOTS, H_W - 1, H_C};
    const size_t cs[3] = {1, 1, H_SEQ + 1}, ss[3] = {1, 1, H_SEQ}, is = lmk_dtype_size(idx);
    int rx, ry, rw, rc, rs, rp;
    lmk_buffer *x = NULL, *y = NULL, *w = NULL, *bc = NULL, *bs = NULL, *st = NULL;
    lmk_status s = LMK_OK;
    const size_t sizes[6] = {H_T * H_C * es, H_T * H_C * es, H_C * H_W * es, (H_SEQ + 1) * is, H_SEQ * is,
                             H_SLOTS * (H_W - 1) * H_C * es};
    int *reg[6] = {&rx, &ry, &rw, &rc, &rs, &rp};
    for (int i = 0; i < 6 && s == LMK_OK; i++)
        s = tst_mem_region(&m, sizes[i] + 2 * TST_GUARD, i != 1, reg[i]);
    if (s == LMK_OK)
        s = tst_mem_view(&m, rx, TST_GUARD, dt, xs, NULL, in_place, &x);
    if (s == LMK_OK)
        s = tst_mem_view(&m, ry, TST_GUARD, dt, xs, NULL, true, &y);
    if (s == LMK_OK)
        s = tst_mem_view(&m, rw, TST_GUARD, dt, ws, NULL, false, &w);
    if (s == LMK_OK)
        s = tst_mem_view(&m, rc, TST_GUARD, idx, cs, NULL, false, &bc);
    if (s == LMK_OK)
        s = tst_mem_view(&m, rs, TST_GUARD, idx, ss, NULL, false, &bs);
    if (s == LMK_OK)
        s = tst_mem_view(&m, rp, TST_GUARD, dt, ps, NULL, true, &st);
    if (!TST_REQUIRE(s == LMK_OK, "[%s] hostile %s: setup: %s", d->name, what, lmk_last_error()))
        goto done;
    tst_fill_random(&r, dt, tst_mem_host(&m, x), H_T * H_C);
    tst_fill_random(&r, dt, tst_mem_host(&m, w), H_C * H_W);
    tst_fill_random(&r, dt, tst_mem_host(&m, st), H_SLOTS * (H_W - 1) * H_C);
    for (size_t i = 0; i <= H_SEQ; i++) {
        const int32_t v32 = (int32_t)cu[i], u32 = i < H_SEQ ? (int32_t)slots[i] : 0;
        memcpy((unsigned char *)tst_mem_host(&m, bc) + i * is, idx == LMK_I64 ? (const void *)&cu[i] : &v32, is);
        if (i < H_SEQ)
            memcpy((unsigned char *)tst_mem_host(&m, bs) + i * is, idx == LMK_I64 ? (const void *)&slots[i] : &u32, is);
    }
    const lmk_causal_conv1d_params p = {H_T, H_C, H_W, LMK_ACT_SILU};
    s = tst_mem_upload(&m);
    if (s == LMK_OK)
        s = lmk_causal_conv1d(d->stream, x, w, NULL, bc, bs, st, in_place ? x : y, &p);
    if (s == LMK_OK)
        s = lmk_stream_sync(d->stream);
    char msg[512] = "";
    const bool kept = s == LMK_OK && tst_mem_untouched(&m, msg, sizeof msg);
    CHECK(kept, "[%s] hostile %s (%s, %s): %s %s %s", d->name, what, lmk_dtype_name(idx),
          in_place ? "in place" : "out of place", lmk_status_name(s), s == LMK_OK ? "" : lmk_last_error(), msg);
done:
    tst_mem_free(&m);
}

static void test_hostile(const tst_dev *d)
{
    const int64_t big = (int64_t)1 << 40;
    const int64_t cus[][H_SEQ + 1] = {
        {0, 25, 10, 30, 20},              /* past T, decreasing */
        {-5, 3, -100, 7, 20},             /* negative */
        {20, 10, 5, 0, 0},                /* decreasing from T */
        {INT64_MIN, INT64_MAX, 0, INT64_MAX, INT64_MIN},
        {0, 5, 5, 5, 1000000},
        {0, 5, 10, 15, 20},               /* valid, with the hostile slots */
    };
    const int64_t slotss[][H_SEQ] = {
        {INT64_MIN, -1, H_SLOTS, INT64_MAX},
        {0, 0, 0, 0},
        {4, big, -7, 2},
        {INT32_MIN, INT32_MAX, (int64_t)UINT32_MAX, H_SLOTS - 1},
    };
    for (size_t c = 0; c < sizeof cus / sizeof cus[0]; c++)
        for (size_t k = 0; k < sizeof slotss / sizeof slotss[0]; k++)
            for (int v = 0; v < 4; v++) {
                char what[64];
                snprintf(what, sizeof what, "cu_seqlens #%zu, slots #%zu", c, k);
                hostile_run(d, cus[c], slotss[k], v & 1 ? LMK_I64 : LMK_I32, v & 2, what);
            }
}

/* ------------------------------------------------------------------------------------------------
 * 5. padding slots
 * ---------------------------------------------------------------------------------------------- */

/* One token of each of 8 sequences, slots {2, -1, 5, 8 (= n_slots), 0, INT32_MIN, 7, huge}: rows 2,
 * 5, 0 and 7 become [old row 1, old row 2, x] of their sequence (bit copies), rows 1, 3, 4 and 6
 * keep their bits, and a padded sequence's y is the one of its token alone without a state. */
static void test_padding(const tst_dev *d)
{
    const spec s = {8, 96, 4, LMK_ACT_SILU, LMK_BF16, LMK_BF16, false, 8};
    const int64_t cu[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    const int64_t slots[8] = {2, -1, 5, 8, 0, INT32_MIN, 7, (int64_t)1 << 40};
    host h;
    outs o = {0}, alone = {0};
    if (!host_make(&h, &s, tst_case_seed()) || !outs_alloc(&o, &h) || !outs_alloc(&alone, &h))
        goto done;
    const seqs q = {.n_cu = 8, .cu = cu, .slots = slots, .idx = LMK_I64};
    if (!dev_call(d, &h, 0, s.T, h.st, &q, true, o.y, o.st))
        goto done;
    const size_t C = s.C, es = h.es, R = h.row_bytes, rs = C * es;
    bool rows_ok = true;
    for (size_t t = 0; t < 8; t++) {
        if (slots[t] < 0 || slots[t] >= 8)
            continue;
        const unsigned char *row = o.st + (size_t)slots[t] * R, *old = h.st + (size_t)slots[t] * R;
        rows_ok = rows_ok && !memcmp(row, old + rs, 2 * rs) && !memcmp(row + 2 * rs, h.x + t * rs, rs);
    }
    static const size_t kept[4] = {1, 3, 4, 6};
    for (size_t i = 0; i < 4; i++)
        rows_ok = rows_ok && !memcmp(o.st + kept[i] * R, h.st + kept[i] * R, R);
    CHECK(rows_ok, "[%s] padding slots: a pool row differs from [old rows 1-2, x] or was written for padding",
          d->name);
    host none = h;
    none.s.n_slots = 0, none.pool_bytes = 0;
    const seqs plain = {.idx = LMK_I32};
    static const size_t padded[4] = {1, 3, 5, 7};
    for (size_t i = 0; i < 4; i++) {
        size_t at = 0;
        if (dev_call(d, &none, padded[i], 1, NULL, &plain, false, alone.y, alone.st))
            CHECK(same_y(d, s.dt, alone.y, o.y + padded[i] * rs, C, &at),
                  "[%s] padding slot %" PRId64 ": y differs from a call without a state (channel %zu)", d->name,
                  slots[padded[i]], at);
    }
done:
    outs_free(&o), outs_free(&alone), host_free(&h);
}

/* ------------------------------------------------------------------------------------------------
 * 6. validation: every rule of lmk.h in its order
 * ---------------------------------------------------------------------------------------------- */

/* Byte offsets of the valid call's operands in one parent (so that overlaps can be made). */
enum { V_T = 6, V_C = 40, V_W = 4, O_X = 0, O_Y = 512, O_W = 1024, O_B = 1408, O_CU = 1600, O_SL = 1664,
       O_ST = 1728, V_PARENT = 4096 };

/* A call to make: the buffers (NULL where absent) and the parameters. */
typedef struct vcall {
    lmk_stream *s;
    lmk_buffer *x, *w, *b, *cu, *sl, *st, *y;
    lmk_causal_conv1d_params p;
    bool no_params;
} vcall;

/* Every buffer a rule may use, made once per device. */
typedef struct vset {
    lmk_buffer *parent, *x, *y, *w, *b, *cu, *sl, *st;
    lmk_buffer *x_2d41, *y_f16, *x_u16, *y_u16, *w_i32, *w_short, *w_strided, *b_u8, *b_long, *cu_f32, *cu_one,
        *cu_strided, *sl_u32, *sl_long, *st_2d, *st_w, *st_c, *st_f32, *st_self, *x_other, *st_other, *y_shift,
        *y_on_w, *y_self, *st_on_x, *st_on_y, *st_on_cu, *sep;
    lmk_device *other;
} vset;

static lmk_buffer *view_of(lmk_buffer *parent, size_t off, lmk_dtype dt, int nd, size_t n0, size_t n1, size_t n2,
                           const size_t *strides)
{
    const size_t shape[3] = {n0, n1, n2};
    lmk_buffer *v = NULL;
    const lmk_status st = strides ? lmk_buffer_view_strided(parent, off, dt, shape, strides, nd, &v)
                                  : lmk_buffer_view(parent, off, dt, shape, nd, &v);
    TST_REQUIRE(st == LMK_OK, "view at %zu: %s", off, lmk_last_error());
    return v;
}

static lmk_buffer *alloc_of(lmk_device *dev, lmk_dtype dt, int nd, size_t n0, size_t n1, size_t n2)
{
    const size_t shape[3] = {n0, n1, n2};
    lmk_buffer *b = NULL;
    TST_REQUIRE(lmk_buffer_alloc(dev, n0 * n1 * n2 * lmk_dtype_size(dt) + 64, dt, shape, nd, &b) == LMK_OK,
                "alloc: %s", lmk_last_error());
    return b;
}

static void vset_make(vset *v, const tst_dev *d)
{
    memset(v, 0, sizeof *v);
    lmk_device *dev = d->dev;
    v->parent = alloc_of(dev, LMK_U8, 1, V_PARENT, 1, 1);
    v->sep = alloc_of(dev, LMK_U8, 1, V_PARENT, 1, 1);
    if (!v->parent || !v->sep)
        return;
    const int32_t cu[3] = {0, 2, V_T}, sl[2] = {1, 0};
    lmk_buffer_write(v->parent, O_CU, cu, sizeof cu);
    lmk_buffer_write(v->parent, O_SL, sl, sizeof sl);
    v->x = view_of(v->parent, O_X, LMK_BF16, 2, V_T, V_C, 1, NULL);
    v->y = view_of(v->parent, O_Y, LMK_BF16, 2, V_T, V_C, 1, NULL);
    v->w = view_of(v->parent, O_W, LMK_BF16, 2, V_C, V_W, 1, NULL);
    v->b = view_of(v->parent, O_B, LMK_F32, 1, V_C, 1, 1, NULL);
    v->cu = view_of(v->parent, O_CU, LMK_I32, 1, 3, 1, 1, NULL);
    v->sl = view_of(v->parent, O_SL, LMK_I32, 1, 2, 1, 1, NULL);
    v->st = view_of(v->parent, O_ST, LMK_BF16, 3, 3, V_W - 1, V_C, NULL);
    const size_t s41[2] = {42, 1}, s_w[2] = {V_W + 1, 1}, s_cu[1] = {2}, s_self[3] = {0, V_C, 1};
    const size_t s_yself[2] = {10, 1};
    v->x_2d41 = view_of(v->sep, 0, LMK_BF16, 2, V_T, V_C + 1, 1, s41);
    v->y_f16 = alloc_of(dev, LMK_F16, 2, V_T, V_C, 1);
    v->x_u16 = alloc_of(dev, LMK_U16, 2, V_T, V_C, 1);
    v->y_u16 = alloc_of(dev, LMK_U16, 2, V_T, V_C, 1);
    v->w_i32 = alloc_of(dev, LMK_I32, 2, V_C, V_W, 1);
    v->w_short = alloc_of(dev, LMK_BF16, 2, V_C - 1, V_W, 1);
    v->w_strided = view_of(v->sep, 1024, LMK_BF16, 2, V_C, V_W, 1, s_w);
    v->b_u8 = alloc_of(dev, LMK_U8, 1, V_C, 1, 1);
    v->b_long = alloc_of(dev, LMK_F32, 1, V_C + 1, 1, 1);
    v->cu_f32 = alloc_of(dev, LMK_F32, 1, 3, 1, 1);
    v->cu_one = alloc_of(dev, LMK_I32, 1, 1, 1, 1);
    v->cu_strided = view_of(v->sep, 2048, LMK_I32, 1, 3, 1, 1, s_cu);
    v->sl_u32 = alloc_of(dev, LMK_U32, 1, 2, 1, 1);
    v->sl_long = alloc_of(dev, LMK_I32, 1, 3, 1, 1);
    v->st_2d = alloc_of(dev, LMK_BF16, 2, 3, (V_W - 1) * V_C, 1);
    v->st_w = alloc_of(dev, LMK_BF16, 3, 3, V_W, V_C);
    v->st_c = alloc_of(dev, LMK_BF16, 3, 3, V_W - 1, V_C + 1);
    v->st_f32 = alloc_of(dev, LMK_F32, 3, 3, V_W - 1, V_C);
    v->st_self = view_of(v->sep, 2560, LMK_BF16, 3, 3, V_W - 1, V_C, s_self);
    v->y_shift = view_of(v->parent, O_X + 2, LMK_BF16, 2, V_T, V_C, 1, NULL);
    v->y_on_w = view_of(v->parent, O_W, LMK_BF16, 2, V_T, V_C, 1, NULL);
    v->y_self = view_of(v->parent, O_Y, LMK_BF16, 2, V_T, V_C, 1, s_yself);
    v->st_on_x = view_of(v->parent, O_X, LMK_BF16, 3, 1, V_W - 1, V_C, NULL);
    v->st_on_y = view_of(v->parent, O_Y + 16, LMK_BF16, 3, 1, V_W - 1, V_C, NULL);
    v->st_on_cu = view_of(v->parent, O_CU, LMK_BF16, 3, 1, V_W - 1, V_C, NULL);
    if (TST_REQUIRE(lmk_device_open(d->backend, 0, &v->other) == LMK_OK, "a second device: %s", lmk_last_error())) {
        v->x_other = alloc_of(v->other, LMK_BF16, 2, V_T, V_C, 1);
        v->st_other = alloc_of(v->other, LMK_BF16, 3, 3, V_W - 1, V_C);
    }
}

static void vset_free(vset *v)
{
    lmk_buffer *views[] = {v->x, v->y, v->w, v->b, v->cu, v->sl, v->st, v->x_2d41, v->w_strided, v->cu_strided,
                           v->st_self, v->y_shift, v->y_on_w, v->y_self, v->st_on_x, v->st_on_y, v->st_on_cu};
    for (size_t i = 0; i < sizeof views / sizeof views[0]; i++)
        lmk_buffer_free(views[i]);
    lmk_buffer *own[] = {v->y_f16, v->x_u16, v->y_u16, v->w_i32, v->w_short, v->b_u8, v->b_long, v->cu_f32,
                         v->cu_one, v->sl_u32, v->sl_long, v->st_2d, v->st_w, v->st_c, v->st_f32, v->x_other,
                         v->st_other, v->parent, v->sep};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        lmk_buffer_free(own[i]);
    lmk_device_close(v->other);
}

enum { F_NONE, F_STREAM, F_PARAMS, F_X, F_W, F_B, F_CU, F_SL, F_ST, F_Y };
enum { P_NONE, P_SEQ, P_CH, P_WIDTH, P_ACT };

/* One broken call: up to two operands replaced (by a buffer of vset at offset `with`, or NULL
 * for -1) and one parameter changed. */
typedef struct rule {
    const char *what;
    int f1;
    ptrdiff_t w1;
    int f2;
    ptrdiff_t w2;
    int param;
    int value;
    const char *want;
} rule;

#define VS(field) (ptrdiff_t)offsetof(vset, field)

static const rule k_rules[] = {
    {"NULL stream", F_STREAM, -1, 0, 0, 0, 0, "causal_conv1d: stream must not be NULL"},
    {"NULL x", F_X, -1, 0, 0, 0, 0, "x must not be NULL"},
    {"NULL weight", F_W, -1, 0, 0, 0, 0, "weight must not be NULL"},
    {"NULL y", F_Y, -1, 0, 0, 0, 0, "y must not be NULL"},
    {"NULL params", F_PARAMS, -1, 0, 0, 0, 0, "params must not be NULL"},
    {"seq_len 0", 0, 0, 0, 0, P_SEQ, 0, "seq_len (0) and channels (40) must be > 0"},
    {"channels 0", 0, 0, 0, 0, P_CH, 0, "seq_len (6) and channels (0) must be > 0"},
    {"width 1", 0, 0, 0, 0, P_WIDTH, 1, "width (1) must be in 2..8"},
    {"width 9", 0, 0, 0, 0, P_WIDTH, 9, "width (9) must be in 2..8"},
    {"activation 2", 0, 0, 0, 0, P_ACT, 2, "unknown activation 2"},
    {"x of C*W elements", F_X, VS(w), 0, 0, 0, 0, "x element count 160 != 6 * 40 = 240"},
    {"x strided [6, 41]", F_X, VS(x_2d41), 0, 0, 0, 0, "x has shape [6, 41] and strides [42, 1]"},
    {"y of C*W elements", F_Y, VS(w), 0, 0, 0, 0, "y element count 160 != 6 * 40 = 240"},
    {"y f16", F_Y, VS(y_f16), 0, 0, 0, 0, "y dtype f16 differs from x's bf16"},
    {"x and y u16", F_X, VS(x_u16), F_Y, VS(y_u16), 0, 0, "x has unsupported dtype u16"},
    {"weight i32", F_W, VS(w_i32), 0, 0, 0, 0, "weight must be f32, bf16 or f16 (got i32)"},
    {"weight of 39 channels", F_W, VS(w_short), 0, 0, 0, 0,
     "weight must be dense with exactly channels * width (160) elements (got 156)"},
    {"weight strided", F_W, VS(w_strided), 0, 0, 0, 0, "weight must be dense with exactly channels * width (160) "
                                                        "elements (got 160, strided)"},
    {"bias u8", F_B, VS(b_u8), 0, 0, 0, 0, "bias must be f32, bf16 or f16 (got u8)"},
    {"bias of 41", F_B, VS(b_long), 0, 0, 0, 0, "bias must be dense with exactly channels (40) elements (got 41)"},
    {"cu_seqlens f32", F_CU, VS(cu_f32), 0, 0, 0, 0, "cu_seqlens must be i32 or i64 (got f32)"},
    {"cu_seqlens of 1", F_CU, VS(cu_one), 0, 0, 0, 0, "cu_seqlens must be dense with at least n_seq + 1 >= 2 (2) "
                                                      "entries (got 1)"},
    {"cu_seqlens strided", F_CU, VS(cu_strided), 0, 0, 0, 0, "(got 3, strided)"},
    {"state_slots without conv_state", F_ST, -1, 0, 0, 0, 0, "state_slots given without conv_state"},
    {"state_slots u32", F_SL, VS(sl_u32), 0, 0, 0, 0, "state_slots must be i32 or i64 (got u32)"},
    {"state_slots of 3 for 2 sequences", F_SL, VS(sl_long), 0, 0, 0, 0,
     "state_slots must be dense with exactly n_seq (2) entries (got 3)"},
    {"conv_state 2-D", F_ST, VS(st_2d), 0, 0, 0, 0, "conv_state has shape [3, 120]: it must be a 3-D pool [n_slots, 3, "
                                                    "40]"},
    {"conv_state [3, 4, 40]", F_ST, VS(st_w), 0, 0, 0, 0, "conv_state has shape [3, 4, 40]: it must be"},
    {"conv_state [3, 3, 41]", F_ST, VS(st_c), 0, 0, 0, 0, "conv_state has shape [3, 3, 41]: it must be"},
    {"conv_state f32", F_ST, VS(st_f32), 0, 0, 0, 0, "conv_state dtype f32 differs from x's bf16"},
    {"conv_state stride 0", F_ST, VS(st_self), 0, 0, 0, 0, "conv_state has overlapping elements"},
    {"x on another device", F_X, VS(x_other), 0, 0, 0, 0, "x is not on the stream's device"},
    {"conv_state on another device", F_ST, VS(st_other), 0, 0, 0, 0, "conv_state is not on the stream's device"},
    {"y one element past x", F_Y, VS(y_shift), 0, 0, 0, 0, "y overlaps x without being exactly it"},
    {"y over the weight", F_Y, VS(y_on_w), 0, 0, 0, 0, "y overlaps weight"},
    {"y token stride 10", F_Y, VS(y_self), 0, 0, 0, 0, "y has overlapping elements"},
    {"conv_state over x", F_ST, VS(st_on_x), 0, 0, 0, 0, "conv_state overlaps x"},
    {"conv_state over y", F_ST, VS(st_on_y), 0, 0, 0, 0, "conv_state overlaps y"},
    {"conv_state over cu_seqlens", F_ST, VS(st_on_cu), 0, 0, 0, 0, "conv_state overlaps cu_seqlens"},
};

static void replace(vcall *c, const vset *v, int f, ptrdiff_t with)
{
    lmk_buffer *b = with < 0 ? NULL : *(lmk_buffer *const *)(const void *)((const char *)v + with);
    lmk_buffer **slot[] = {NULL, NULL, NULL, &c->x, &c->w, &c->b, &c->cu, &c->sl, &c->st, &c->y};
    if (f == F_STREAM)
        c->s = NULL;
    else if (f == F_PARAMS)
        c->no_params = true;
    else if (f > F_PARAMS)
        *slot[f] = b;
}

static void apply(vcall *c, const vset *v, const rule *r)
{
    replace(c, v, r->f1, r->w1);
    replace(c, v, r->f2, r->w2);
    if (r->param == P_SEQ)
        c->p.seq_len = (uint32_t)r->value;
    else if (r->param == P_CH)
        c->p.channels = (uint32_t)r->value;
    else if (r->param == P_WIDTH)
        c->p.width = (uint32_t)r->value;
    else if (r->param == P_ACT)
        c->p.activation = (lmk_activation)r->value;
}

/* Rules a and b broken together (b may be NULL): INVALID_ARGUMENT with a's message, and no byte
 * of any operand written. */
static void check_rule(const tst_dev *d, const vset *v, const rule *a, const rule *b)
{
    vcall c = {d->stream, v->x, v->w, v->b, v->cu, v->sl, v->st, v->y, {V_T, V_C, V_W, LMK_ACT_SILU}, false};
    apply(&c, v, a);
    if (b)
        apply(&c, v, b);
    unsigned char *before[2] = {tst_read_all(v->parent), tst_read_all(v->sep)}, *after[2] = {NULL, NULL};
    lmk_clear_error();
    const lmk_status st = lmk_causal_conv1d(c.s, c.x, c.w, c.b, c.cu, c.sl, c.st, c.y, c.no_params ? NULL : &c.p);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", lmk_last_error());
    lmk_stream_sync(d->stream);
    after[0] = tst_read_all(v->parent), after[1] = tst_read_all(v->sep);
    const bool kept = before[0] && before[1] && after[0] && after[1] && !memcmp(before[0], after[0], V_PARENT) &&
                      !memcmp(before[1], after[1], V_PARENT);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && strstr(msg, a->want) && kept,
          "[%s] %s%s%s: %s \"%s\" (want INVALID_ARGUMENT with \"%s\"%s)", d->name, a->what, b ? " + " : "",
          b ? b->what : "", lmk_status_name(st), msg, a->want, kept ? "" : "; a byte was written");
    for (int i = 0; i < 2; i++)
        free(before[i]), free(after[i]);
}

static void test_validation(const tst_dev *d)
{
    vset v;
    vset_make(&v, d);
    if (!v.parent || !v.sep || !v.x_other)
        goto done;
    /* The valid call is valid: it runs and writes y and the pool. */
    const lmk_causal_conv1d_params p = {V_T, V_C, V_W, LMK_ACT_SILU};
    const lmk_status ok = lmk_causal_conv1d(d->stream, v.x, v.w, v.b, v.cu, v.sl, v.st, v.y, &p);
    CHECK(ok == LMK_OK && lmk_stream_sync(d->stream) == LMK_OK, "[%s] validation: the valid call: %s", d->name,
          lmk_last_error());
    const size_t n = sizeof k_rules / sizeof k_rules[0];
    for (size_t i = 0; i < n; i++)
        check_rule(d, &v, &k_rules[i], NULL);
    /* lmk.h's order: with two rules broken, the earlier one is reported. */
    for (size_t i = 0; i + 1 < n; i++)
        for (size_t k = i + 1; k < n; k += 7)
            if (k_rules[i].f1 != k_rules[k].f1 || k_rules[i].f1 == F_NONE)
                if (k_rules[i].param != k_rules[k].param || k_rules[i].param == P_NONE)
                    if (k_rules[i].f1 != k_rules[k].f2 && k_rules[i].f2 != k_rules[k].f1)
                        check_rule(d, &v, &k_rules[i], &k_rules[k]);
done:
    vset_free(&v);
}

/* ------------------------------------------------------------------------------------------------
 * 7. threads and stack (CPU)
 * ---------------------------------------------------------------------------------------------- */

/* A CPU device and stream with n threads at the ISA level of `like` (LMK_CPU_ISA as `isa`). */
static bool cpu_dev(tst_dev *t, int n, const char *isa)
{
    memset(t, 0, sizeof *t);
    if (isa)
        setenv("LMK_CPU_ISA", isa, 1);
    lmk_status st = lmk_device_open(LMK_BACKEND_CPU, 0, &t->dev);
    if (isa)
        unsetenv("LMK_CPU_ISA");
    if (st == LMK_OK)
        st = lmk_device_set_threads(t->dev, n);
    if (st == LMK_OK)
        st = lmk_stream_create(t->dev, &t->stream);
    snprintf(t->name, sizeof t->name, "cpu/%s/%dt", isa ? isa : "best", n);
    t->backend = LMK_BACKEND_CPU;
    return TST_REQUIRE(st == LMK_OK, "cpu device with %d threads: %s", n, lmk_last_error());
}

/* A large call (worker threads take part) gives the same bits on 1, 2 and 3 threads, at each
 * ISA level: a varlen batch with duplicate and padding slots, and a decode batch. */
static void test_threads(const char *isa)
{
    const spec specs[2] = {{300, 1000, 4, LMK_ACT_SILU, LMK_BF16, LMK_BF16, true, 9},
                           {256, 2056, 4, LMK_ACT_SILU, LMK_F32, LMK_BF16, false, 300}};
    int64_t cu[2][257], slots[2][256];
    const size_t n[2] = {8, 256};
    for (size_t i = 0; i <= 256; i++)
        cu[1][i] = (int64_t)i, cu[0][i] = i < 8 ? (int64_t)(i * i * 4) : 300;
    for (size_t i = 0; i < 256; i++)
        slots[0][i] = (int64_t)(i % 3 == 2 ? i - 1 : i), slots[1][i] = i % 5 == 4 ? -1 : (int64_t)(299 - i);
    for (int k = 0; k < 2; k++) {
        host h;
        outs o[3] = {{0}};
        if (!host_make(&h, &specs[k], tst_case_seed()))
            continue;
        const seqs q = {.n_cu = n[k], .cu = cu[k], .slots = slots[k], .idx = LMK_I32};
        bool ran = true;
        for (int t = 0; t < 3 && ran; t++) {
            tst_dev d;
            ran = cpu_dev(&d, t + 1, isa) && outs_alloc(&o[t], &h) &&
                  dev_call(&d, &h, 0, h.s.T, h.st, &q, t == 1, o[t].y, o[t].st);
            tst_devs_close(&d, 1);
        }
        for (int t = 1; t < 3 && ran; t++) {
            char what[64];
            snprintf(what, sizeof what, "%s: 1 thread vs %d", isa ? isa : "best level", t + 1);
            tst_dev d1 = {.backend = LMK_BACKEND_CPU};
            snprintf(d1.name, sizeof d1.name, "cpu threads");
            check_same(&d1, &h, &o[0], &o[t], what);
        }
        for (int t = 0; t < 3; t++)
            outs_free(&o[t]);
        host_free(&h);
    }
}

#define PAINTED (256 << 10)
#define PAINT 0xA5u

typedef struct stack_job {
    lmk_stream *s;
    dev_bufs b;
    lmk_causal_conv1d_params p;
    uintptr_t top;
    lmk_status st;
} stack_job;

static void *stack_thread(void *arg)
{
    stack_job *j = arg;
    volatile char mark = 0;
    j->top = (uintptr_t)&mark;
    j->st = lmk_causal_conv1d(j->s, j->b.x, j->b.w, j->b.b, j->b.cu, j->b.slots, j->b.st, j->b.x, &j->p);
    return NULL;
}

/* The stack one call takes on the calling thread (which runs a share of the work) on a painted
 * stack: spec k (a prompt, a decode batch) on t threads; after a call elsewhere when `warm` (the
 * dynamic loader's binding of the symbols a first call uses is then not counted). */
static size_t stack_of(int k, int t, bool warm)
{
    const spec specs[2] = {{512, 2048, 8, LMK_ACT_SILU, LMK_F32, LMK_F16, true, 1},
                           {128, 4096, 4, LMK_ACT_SILU, LMK_BF16, LMK_BF16, false, 200}};
    int64_t cu[129], slots[128];
    for (int i = 0; i < 128; i++)
        cu[i] = i, slots[i] = 199 - i;
    cu[128] = 128;
    host h;
    tst_dev d;
    size_t used = 0;
    if (!host_make(&h, &specs[k], tst_case_seed()))
        return 0;
    const seqs q = k ? (seqs){.n_cu = 128, .cu = cu, .slots = slots, .idx = LMK_I32} : (seqs){.idx = LMK_I32};
    stack_job j = {.p = {h.s.T, h.s.C, h.s.W, h.s.act}};
    unsigned char *stack = aligned_alloc(4096, PAINTED);
    if (cpu_dev(&d, t, NULL) && stack && bufs_make(&d, &h, 0, h.s.T, h.st, &q, true, &j.b)) {
        j.s = d.stream;
        if (warm)
            stack_thread(&j);
        memset(stack, (int)PAINT, PAINTED);
        pthread_attr_t attr;
        pthread_t th;
        pthread_attr_init(&attr);
        pthread_attr_setstack(&attr, stack, PAINTED);
        const bool ran = pthread_create(&th, &attr, stack_thread, &j) == 0 && pthread_join(th, NULL) == 0;
        pthread_attr_destroy(&attr);
        size_t lo = 0;
        while (lo < PAINTED && stack[lo] == PAINT)
            lo++;
        used = j.top > (uintptr_t)(stack + lo) ? (size_t)(j.top - (uintptr_t)(stack + lo)) : 0;
        CHECK(ran && j.st == LMK_OK && used > 0 && used <= 16 * 1024,
              "[%s] %s call%s: %s, %zu bytes of stack (lmk.h: 16 KiB)",
              d.name, k ? "decode" : "prompt", warm ? " (warm)" : "", lmk_status_name(j.st), used);
    }
    bufs_free(&j.b);
    free(stack);
    tst_devs_close(&d, 1);
    host_free(&h);
    return used;
}

/* Run first in the program, so that the first measurement includes the symbol binding. Not under
 * AddressSanitizer, whose fake stacks move locals off the thread's stack. */
static void test_stack(void)
{
#ifdef CONV_ASAN
    SKIP("stack: not measured under AddressSanitizer (locals live on its fake stacks)");
    return;
#endif
    size_t worst[2] = {0, 0};
    for (int warm = 0; warm < 2; warm++)
        for (int k = 0; k < 2; k++)
            for (int t = 1; t <= 2; t++) {
                const size_t used = stack_of(k, t, warm);
                worst[warm] = used > worst[warm] ? used : worst[warm];
            }
    printf("stack: a causal_conv1d call used at most %zu bytes of the calling thread's stack (%zu after a first "
           "call bound the symbols it uses)\n", worst[0], worst[1]);
}

/* ------------------------------------------------------------------------------------------------ */

int main(void)
{
    tst_program_seed();
    const double t0 = tst_now();
    test_stack();
    test_reference_exact();
    test_reference_rounding();
    tst_dev devs[TST_MAX_DEVS];
    const int n = tst_devs_open_isas(devs);
    for (int i = 0; i < n; i++) {
        const int failed = harness_failed;
        test_table(&devs[i]);
        test_equivalences(&devs[i]);
        test_hostile(&devs[i]);
        test_padding(&devs[i]);
        test_validation(&devs[i]);
        printf("[%s] %s: %s\n", devs[i].name, lmk_device_name(devs[i].dev),
               harness_failed == failed ? "all cases pass" : "FAILURES above");
    }
    tst_devs_close(devs, n);
    static const char *const isas[] = {NULL, "avx2", "scalar"};
    for (int i = 0; i < 3; i++)
        test_threads(isas[i]);
    printf("test_causal_conv1d: %.2f s\n", tst_now() - t0);
    return harness_summary();
}
