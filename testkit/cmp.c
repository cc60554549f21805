/*
 * cmp.c - how results are compared with what they should be: the one copy of the comparisons that
 * the tests, the tool and the fuzzers use.
 *
 * Copies (whole outputs, and the elements a rope leaves alone) are compared bit for bit. Rotated rope
 * elements are compared with the float64 reference under lmk.h's precision contract (f32 within
 * 1e-5 * max(1, m) for |x| <= 2; bf16/f16 within one ulp of the float64 result plus 1e-6).
 */
#include "testkit_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

long long tst_bits_diff(const void *a, const void *b, size_t n)
{
    if (memcmp(a, b, n) == 0)
        return -1;
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i])
            return (long long)i;
    return -1;
}

double tst_ulp(lmk_dtype dtype, double x)
{
    /* p: significand bits including the implicit one; q: the subnormal spacing. */
    const int p = dtype == LMK_BF16 ? 8 : dtype == LMK_F16 ? 11 : 24;
    const double q = dtype == LMK_BF16 ? 0x1p-133 : dtype == LMK_F16 ? 0x1p-24 : 0x1p-149;
    const double ax = fabs(x);
    if (ax == 0.0 || !isfinite(ax))
        return q;
    int e;
    frexp(ax, &e); /* ax = m * 2^e, m in [0.5, 1): the binade [2^(e-1), 2^e) has spacing 2^(e-p) */
    const double u = ldexp(1.0, e - p);
    return u > q ? u : q;
}

/* One element: got against want within tol (NaN and infinity must match exactly). *err gets the
 * error (infinity for a mismatch of specials or a NaN got). */
static bool close_enough(double got, double want, double tol, double *err)
{
    if (isnan(want)) {
        *err = isnan(got) ? 0.0 : INFINITY;
        return isnan(got);
    }
    if (isinf(want)) {
        *err = got == want ? 0.0 : INFINITY;
        return got == want;
    }
    *err = fabs(got - want);
    if (isnan(*err))
        *err = INFINITY;
    return *err <= tol;
}

void tst_cmp_f64(lmk_dtype dtype, const void *got, const double *want, size_t n, const bool *mask, size_t mask_n,
                 double f32_tol, tst_cmp *res)
{
    for (size_t i = 0; i < n; i++) {
        if (mask && !mask[i % mask_n])
            continue;
        const double g = tst_load(dtype, got, i), w = want[i];
        const double tol = isfinite(w) ? (dtype == LMK_F32 ? f32_tol : tst_ulp(dtype, w) + 1e-6) : 0.0;
        double err;
        const bool ok = close_enough(g, w, tol, &err);
        res->n_checked++;
        if (err > res->max_err)
            res->max_err = err;
        if (!ok) {
            if (res->n_bad == 0) {
                res->first_bad = i;
                res->got = g;
                res->want = w;
                res->tol = tol;
            }
            res->n_bad++;
        }
    }
}

void tst_rope_rotated_mask(const lmk_rope_multi_params *p, bool *mask)
{
    const uint32_t half = p->rope_dim / 2;
    const uint32_t stride = p->pairing == LMK_ROPE_PAIR_HALF_HEAD ? p->head_dim / 2 : half;
    for (uint32_t j = 0; j < p->head_dim; j++)
        mask[j] = false;
    for (uint32_t j = 0; j < half; j++) {
        mask[j] = true;
        mask[j + stride] = true;
    }
}

/* Which elements of a row the launch `a` rotates. */
static void args_rotated_mask(const lmk_rope_args *a, bool *mask)
{
    for (uint32_t j = 0; j < a->head_dim; j++)
        mask[j] = false;
    for (uint32_t p = 0; p < a->rope_dim / 2; p++) {
        const size_t ia = a->interleaved ? 2 * (size_t)p : p;
        mask[ia] = true;
        mask[a->interleaved ? ia + 1 : p + a->pair_stride] = true;
    }
}

/* The comparison of one rope launch: tolerances and what is compared. */
typedef struct rope_cmp {
    double f32_tol;     /* absolute, already scaled by max(1, m) */
    bool rotated;       /* compare rotated elements (else only the copies) */
    double max_err, max_ratio;
} rope_cmp;

/* Copied elements of a dense row of chunk row r against the input; counts the first mismatch. */
typedef struct copy_bad {
    size_t n, first;
    uint64_t got, in;
} copy_bad;

static void check_copies(const unsigned char *row, const unsigned char *in, const bool *mask, size_t hd, size_t es,
                         size_t base, copy_bad *cb)
{
    for (size_t i = 0; i < hd; i++)
        if (!mask[i] && memcmp(row + i * es, in + i * es, es) != 0) {
            if (!cb->n) {
                cb->first = base + i;
                memcpy(&cb->got, row + i * es, es);
                memcpy(&cb->in, in + i * es, es);
            }
            cb->n++;
        }
}

/* Rotated elements of nt dense rows against the float64 results; tracks error and its ratio to the
 * tolerance. */
static void check_rotated(const lmk_rope_args *a, const unsigned char *dense, const double *want, size_t n,
                          const bool *mask, rope_cmp *rc, tst_cmp *rot)
{
    const size_t before = rot->n_bad;
    tst_cmp_f64(a->dtype, dense, want, n, mask, a->head_dim, rc->f32_tol, rot);
    if (rot->n_bad != before || !isfinite(rot->max_err))
        return;
    for (size_t i = 0; i < n; i++)
        if (mask[i % a->head_dim] && isfinite(want[i])) {
            const double tol = a->dtype == LMK_F32 ? rc->f32_tol : tst_ulp(a->dtype, want[i]) + 1e-6;
            const double ratio = fabs(tst_load(a->dtype, dense, i) - want[i]) / tol;
            if (ratio > rc->max_ratio)
                rc->max_ratio = ratio;
        }
}

/* One tensor of a launch: got (laid out with the output strides) against the reference, in chunks
 * of tokens so that prompt-length shapes need no huge float64 buffers. */
static bool check_tensor(const lmk_rope_args *a, int ti, const void *got, const bool *mask, rope_cmp *rc,
                         char *msg, size_t msg_len)
{
    const lmk_rope_tensor *t = &a->t[ti];
    const size_t hd = a->head_dim, es = lmk_dtype_size(a->dtype), nh = t->n_heads, row_elems = nh * hd;
    size_t chunk = ((size_t)1 << 20) / row_elems;
    chunk = chunk < 1 ? 1 : chunk > a->seq_len ? a->seq_len : chunk;
    double *want = malloc(chunk * row_elems * sizeof *want);
    unsigned char *dense = malloc(chunk * row_elems * es);
    if (!want || !dense) {
        snprintf(msg, msg_len, "out of host memory");
        free(want);
        free(dense);
        return false;
    }
    tst_cmp rot = {0};
    copy_bad cb = {0};
    for (size_t t0 = 0; t0 < a->seq_len; t0 += chunk) {
        const size_t nt = a->seq_len - t0 < chunk ? a->seq_len - t0 : chunk;
        double *const outs[2] = {want, NULL};
        lmk_rope_args one = *a; /* tensor ti alone */
        one.t[0] = a->t[ti];
        one.n_tensors = 1;
        if (rc->rotated)
            lmk_ref_rope_f64_tokens(&one, t0, t0 + nt, outs);
        /* Gather got into dense rows; compare the copied elements with the input. */
        for (size_t k = 0; k < nt; k++)
            for (size_t h = 0; h < nh; h++) {
                const size_t r = k * nh + h, tok = t0 + k;
                memcpy(dense + r * hd * es, (const char *)got + (tok * t->out_tok + h * t->out_head) * es, hd * es);
                const unsigned char *in = (const unsigned char *)t->in + (tok * t->in_tok + h * t->in_head) * es;
                check_copies(dense + r * hd * es, in, mask, hd, es, (t0 * nh + r) * hd, &cb);
            }
        const size_t before = rot.n_bad;
        if (rc->rotated)
            check_rotated(a, dense, want, nt * row_elems, mask, rc, &rot);
        if (rot.n_bad && !before)
            rot.first_bad += t0 * row_elems;
    }
    free(want);
    free(dense);
    if (rot.max_err > rc->max_err)
        rc->max_err = rot.max_err;
    if (rot.n_bad) {
        const size_t i = rot.first_bad;
        snprintf(msg, msg_len,
                 "tensor %d: %zu of %zu rotated elements off; first at token %zu head %zu elem %zu: got %.9g "
                 "want %.9g (err %.3g > tol %.3g); max err %.3g",
                 ti, rot.n_bad, rot.n_checked, i / row_elems, i % row_elems / hd, i % hd, rot.got, rot.want,
                 fabs(rot.got - rot.want), rot.tol, rot.max_err);
        return false;
    }
    if (cb.n) {
        const size_t i = cb.first;
        snprintf(msg, msg_len,
                 "tensor %d: %zu copied (not rotated) elements differ from the input; first at token %zu head "
                 "%zu elem %zu: bits 0x%llx != input 0x%llx",
                 ti, cb.n, i / row_elems, i % row_elems / hd, i % hd, (unsigned long long)cb.got,
                 (unsigned long long)cb.in);
        return false;
    }
    return true;
}

static bool rope_compare(const lmk_rope_args *a, const void *const got[2], rope_cmp *rc, char *msg, size_t msg_len)
{
    bool *mask = malloc(a->head_dim * sizeof *mask);
    if (!mask) {
        snprintf(msg, msg_len, "out of host memory");
        return false;
    }
    args_rotated_mask(a, mask);
    bool ok = true;
    msg[0] = '\0';
    for (int ti = 0; ti < a->n_tensors && ok; ti++)
        ok = check_tensor(a, ti, got[ti], mask, rc, msg, msg_len);
    free(mask);
    return ok;
}

static double mscale_floor(const lmk_rope_args *a)
{
    return fabs(a->angle.mscale) > 1.0 ? fabs(a->angle.mscale) : 1.0;
}

bool tst_rope_check(const lmk_rope_args *a, const void *const got[2], double f32_tol, char *msg, size_t msg_len)
{
    rope_cmp rc = {.f32_tol = f32_tol * mscale_floor(a), .rotated = true};
    const bool ok = rope_compare(a, got, &rc, msg, msg_len);
    if (ok)
        snprintf(msg, msg_len, "max err %.3g", rc.max_err);
    return ok;
}

bool tst_rope_verify(const lmk_rope_args *a, const void *const got[2], bool check_rotated, tst_result *res)
{
    /* lmk_rope_tolerance: 1e-5 for f32 (scaled by max(1, m) here), one ulp + 1e-6 for bf16/f16. */
    rope_cmp rc = {.f32_tol = lmk_rope_tolerance(LMK_F32, 0.0) * mscale_floor(a), .rotated = check_rotated};
    res->exact = false;
    res->ok = rope_compare(a, got, &rc, res->msg, sizeof res->msg);
    res->max_err = rc.max_err;
    res->max_ratio = rc.max_ratio;
    if (res->ok && check_rotated)
        snprintf(res->msg, sizeof res->msg, "max err %.2g (%.2f of tol %s), copies bit-exact", rc.max_err,
                 rc.max_ratio, a->dtype == LMK_F32 ? "1e-5" : "1 ulp+1e-6");
    else if (res->ok)
        snprintf(res->msg, sizeof res->msg, "copies bit-exact (rotated elements outside the contract's domain)");
    return res->ok;
}

lmk_tensor3 tst_dense3(const void *data, size_t n0, size_t n1, size_t n2, size_t es)
{
    return (lmk_tensor3){.data = (unsigned char *)(uintptr_t)data, .n = {n0, n1, n2}, .stride = {n1 * n2, n2, 1}, .es = es};
}

lmk_tensor3 tst_view_host3(const tst_mem *m, const lmk_buffer *view)
{
    const tst_view *v = tst_mem_find(m, view);
    if (!v)
        return (lmk_tensor3){0};
    return (lmk_tensor3){.data = tst_mem_host(m, view), .n = {v->n[0], v->n[1], v->n[2]},
                         .stride = {v->stride[0], v->stride[1], v->stride[2]}, .es = lmk_dtype_size(v->dtype)};
}

lmk_rope_args tst_rope_host_args(const lmk_rope_multi_params *p, uint32_t n_k_heads, int n_t, lmk_dtype dtype,
                                 const void *q, const void *k, const int32_t *pos)
{
    lmk_rope_params rp = {.head_dim = p->head_dim, .rope_dim = p->rope_dim, .n_heads = p->n_heads,
                          .seq_len = p->seq_len, .freq_base = p->freq_base, .mode = p->mode, .pairing = p->pairing,
                          .n_k_heads = n_k_heads};
    memcpy(rp.sections, p->sections, sizeof rp.sections);
    const size_t es = lmk_dtype_size(dtype);
    lmk_tensor3 t[4];
    t[0] = t[1] = tst_dense3(q, p->seq_len, p->n_heads, p->head_dim, es);
    t[2] = t[3] = tst_dense3(n_t > 1 ? k : q, p->seq_len, n_t > 1 ? n_k_heads : p->n_heads, p->head_dim, es);
    return lmk_rope_args_for(&rp, dtype, t, n_t > 1, pos, LMK_I32, NULL);
}
