/*
 * common_cmp.c - how test results are compared with what they should be.
 *
 * repeat_tiled is a copy: compare bits. rope_multi is arithmetic: compare with the float64
 * reference under the precision contract of SPEC.md section 2 (f32 within 1e-5 absolute for
 * |x| <= 2; bf16/f16 within one ulp of the float64 result plus 1e-6), and compare every element
 * that is not in a rotated pair bit for bit with the input (NaN payloads included).
 */
#include "common.h"

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

void tst_cmp_f64(lmk_dtype dtype, const void *got, const double *want, size_t n, const bool *mask, size_t mask_n,
                 double f32_tol, tst_cmp *res)
{
    for (size_t i = 0; i < n; i++) {
        if (mask && !mask[i % mask_n])
            continue;
        const double g = tst_load(dtype, got, i), w = want[i];
        double tol, err;
        bool ok;
        if (isnan(w)) {
            ok = isnan(g);
            err = ok ? 0.0 : INFINITY;
            tol = 0.0;
        } else if (isinf(w)) {
            ok = g == w;
            err = ok ? 0.0 : INFINITY;
            tol = 0.0;
        } else {
            tol = dtype == LMK_F32 ? f32_tol : tst_ulp(dtype, w) + 1e-6;
            err = fabs(g - w);
            ok = err <= tol; /* false for a NaN got */
            if (isnan(err))
                err = INFINITY;
        }
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

bool tst_rope_check(const lmk_rope_args *a, const void *const got[2], double f32_tol, char *msg, size_t msg_len)
{
    const size_t hd = a->head_dim, es = lmk_dtype_size(a->dtype);
    const lmk_rope_multi_params p = {
        .head_dim = a->head_dim, .rope_dim = a->rope_dim, .n_heads = 1, .seq_len = a->seq_len,
        .freq_base = a->freq_base, .mode = a->mode, .pairing = a->pairing,
    };
    bool *mask = malloc(hd * sizeof *mask);
    if (!mask) {
        snprintf(msg, msg_len, "out of host memory");
        return false;
    }
    tst_rope_rotated_mask(&p, mask);
    bool ok = true;
    msg[0] = '\0';

    for (int ti = 0; ti < a->n_tensors && ok; ti++) {
        const size_t nh = a->t[ti].n_heads, row_elems = nh * hd;
        size_t chunk = ((size_t)1 << 20) / row_elems;
        if (chunk < 1)
            chunk = 1;
        if (chunk > a->seq_len)
            chunk = a->seq_len;
        double *want = malloc(chunk * row_elems * sizeof *want);
        int32_t *pos = malloc(4 * chunk * sizeof *pos);
        if (!want || !pos) {
            snprintf(msg, msg_len, "out of host memory");
            free(want);
            free(pos);
            ok = false;
            break;
        }
        tst_cmp rot = {0};
        size_t n_copy_bad = 0, first_copy_bad = 0;
        for (size_t t0 = 0; t0 < a->seq_len; t0 += chunk) {
            const size_t nt = a->seq_len - t0 < chunk ? a->seq_len - t0 : chunk;
            for (int axis = 0; axis < 4; axis++)
                memcpy(pos + (size_t)axis * nt, a->positions + (size_t)axis * a->seq_len + t0, nt * sizeof *pos);
            lmk_rope_args c = *a;
            c.seq_len = (uint32_t)nt;
            c.positions = pos;
            c.n_tensors = 1;
            c.t[0].in = (const char *)a->t[ti].in + t0 * row_elems * es;
            c.t[0].out = NULL;
            c.t[0].n_heads = (uint32_t)nh;
            c.t[1] = c.t[0];
            double *const outs[2] = {want, NULL};
            lmk_ref_rope_multi_f64(&c, outs);

            const char *g = (const char *)got[ti] + t0 * row_elems * es;
            const size_t before = rot.n_bad;
            tst_cmp_f64(a->dtype, g, want, nt * row_elems, mask, hd, f32_tol, &rot);
            if (rot.n_bad && !before)
                rot.first_bad += t0 * row_elems;
            const char *in = c.t[0].in;
            for (size_t i = 0; i < nt * row_elems; i++)
                if (!mask[i % hd] && memcmp(g + i * es, in + i * es, es) != 0) {
                    if (!n_copy_bad)
                        first_copy_bad = t0 * row_elems + i;
                    n_copy_bad++;
                }
        }
        if (rot.n_bad) {
            const size_t i = rot.first_bad;
            snprintf(msg, msg_len,
                     "tensor %d: %zu of %zu rotated elements off; first at token %zu head %zu elem %zu: got %.9g "
                     "want %.9g (err %.3g > tol %.3g); max err %.3g",
                     ti, rot.n_bad, rot.n_checked, i / row_elems, i % row_elems / hd, i % hd, rot.got, rot.want,
                     fabs(rot.got - rot.want), rot.tol, rot.max_err);
            ok = false;
        } else if (n_copy_bad) {
            const size_t i = first_copy_bad;
            uint32_t gb = 0, ib = 0;
            memcpy(&gb, (const char *)got[ti] + i * es, es);
            memcpy(&ib, (const char *)a->t[ti].in + i * es, es);
            snprintf(msg, msg_len,
                     "tensor %d: %zu copied (not rotated) elements differ from the input; first at token %zu head "
                     "%zu elem %zu: bits 0x%x != input 0x%x",
                     ti, n_copy_bad, i / row_elems, i % row_elems / hd, i % hd, (unsigned)gb, (unsigned)ib);
            ok = false;
        } else if (msg[0] == '\0') {
            snprintf(msg, msg_len, "max err %.3g", rot.max_err);
        }
        free(want);
        free(pos);
    }
    free(mask);
    return ok;
}
