/*
 * cpu_vec.h - the row path's steps of lmk_attn_prologue at one vector width (cpu/vec.h, bound by
 * cpu/vec_width.h): src/ops/attn_prologue/cpu.c includes this file once with LMK_VEC_W 8 (AVX2)
 * and once with 16 (AVX-512), so each step is written once and both levels run the same operations
 * on each element that a vector step takes. Between levels the sums of squares differ (their
 * lanes, the order of the horizontal sum), and which elements the scalar tails take (lmk.h allows
 * levels to differ in the last bit).
 *
 * The steps (cpu.c's "the row path: steps" says what each does): the sums of squares of a group of
 * rows, build (a row read once, scaled by r * (w + offset) and rotated, into x or narrowed
 * straight into its destination), widen and narrow. dt, to and nt are constants in every
 * instantiation (the dispatchers build, widen, narrow and sumsq_rows make them so).
 */
#include "cpu/vec_width.h"

/* The sum of squares in f32, 2 VW lanes of partial sums: each sums head_dim / (2 VW) squares (4 on
 * a 128-element row at AVX-512), so the relative error stays near f32's rounding unit, far inside
 * lmk.h's contract. */
LMK_CPU_STEP V_TARGET double VN(sumsq_f32)(lmk_dtype dt, const unsigned char *in, size_t n)
{
    const size_t es = dt == LMK_F32 ? 4 : 2;
    VF s0 = V(zero)(), s1 = V(zero)();
    size_t i = 0;
    for (; i + 2 * VW <= n; i += 2 * VW) {
        const VF v0 = V(load)(dt, in + i * es), v1 = V(load)(dt, in + (i + VW) * es);
        s0 = V(fmadd)(v0, v0, s0);
        s1 = V(fmadd)(v1, v1, s1);
    }
    if (i + VW <= n) {
        const VF v = V(load)(dt, in + i * es);
        s0 = V(fmadd)(v, v, s0);
        i += VW;
    }
    return (double)V(hsum2)(s0, s1) + sumsq_scalar(dt, in, i, n);
}

/* sumsq_f32 of four rows at once (row r at in + r * stride bytes), each row's partial sums and
 * their reduction in sumsq_f32's order, so the same bits; the four rows' FMA chains are in flight
 * together (one row's few dependent FMAs and its reduction are mostly latency). */
LMK_CPU_STEP V_TARGET void VN(sumsq_x4_f32)(lmk_dtype dt, const unsigned char *in, size_t stride, size_t n, double *ss)
{
    const size_t es = dt == LMK_F32 ? 4 : 2;
    VF s0[4], s1[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
        s0[r] = s1[r] = V(zero)();
    size_t i = 0;
    for (; i + 2 * VW <= n; i += 2 * VW) {
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const VF v0 = V(load)(dt, in + r * stride + i * es), v1 = V(load)(dt, in + r * stride + (i + VW) * es);
            s0[r] = V(fmadd)(v0, v0, s0[r]);
            s1[r] = V(fmadd)(v1, v1, s1[r]);
        }
    }
    if (i + VW <= n) {
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const VF v = V(load)(dt, in + r * stride + i * es);
            s0[r] = V(fmadd)(v, v, s0[r]);
        }
        i += VW;
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
        ss[r] = (double)V(hsum2)(s0[r], s1[r]) + sumsq_scalar(dt, in + r * stride, i, n);
}

/* The same in double, for rows whose f32 sum overflowed or is so small that squares below f32's
 * normal range may have been lost (sum_ok). */
LMK_CPU_STEP V_TARGET double VN(sumsq_f64)(lmk_dtype dt, const unsigned char *in, size_t n)
{
    const size_t es = dt == LMK_F32 ? 4 : 2;
    VD s0 = V(zero_d)(), s1 = V(zero_d)();
    size_t i = 0;
    for (; i + VW <= n; i += VW) {
        const VF v = V(load)(dt, in + i * es);
        const VD lo = V(widen_lo_d)(v), hi = V(widen_hi_d)(v);
        s0 = V(fmadd_d)(lo, lo, s0);
        s1 = V(fmadd_d)(hi, hi, s1);
    }
    return V(hsum2_d)(s0, s1) + sumsq_scalar(dt, in, i, n);
}

/* The sums of squares of nr rows (row r at in + r * stride bytes): four at a time, the rest one by
 * one, each recomputed in double where sum_ok rejects its f32 sum. */
V_TARGET static void VN(sumsq_rows)(lmk_dtype dt, const unsigned char *in, size_t stride, size_t nr, size_t n,
                                    double *ss)
{
    size_t r = 0;
    for (; r + 4 <= nr; r += 4) {
        if (dt == LMK_F32)
            VN(sumsq_x4_f32)(LMK_F32, in + r * stride, stride, n, ss + r);
        else if (dt == LMK_BF16)
            VN(sumsq_x4_f32)(LMK_BF16, in + r * stride, stride, n, ss + r);
        else
            VN(sumsq_x4_f32)(LMK_F16, in + r * stride, stride, n, ss + r);
    }
    for (; r < nr; r++)
        ss[r] = dt == LMK_F32    ? VN(sumsq_f32)(LMK_F32, in + r * stride, n)
                : dt == LMK_BF16 ? VN(sumsq_f32)(LMK_BF16, in + r * stride, n)
                                 : VN(sumsq_f32)(LMK_F16, in + r * stride, n);
    for (r = 0; r < nr; r++)
        if (!sum_ok(ss[r]))
            ss[r] = dt == LMK_F32    ? VN(sumsq_f64)(LMK_F32, in + r * stride, n)
                    : dt == LMK_BF16 ? VN(sumsq_f64)(LMK_BF16, in + r * stride, n)
                                     : VN(sumsq_f64)(LMK_F16, in + r * stride, n);
}

/* Elements [i, i + VW) of a build's output. */
LMK_CPU_STEP V_TARGET void VN(put)(int to, lmk_dtype dt, void *out, size_t i, VF v)
{
    if (to == TO_X)
        V(storeu)((float *)out + i, v);
    else
        V(store)(dt, to == TO_DEST_NT, (unsigned char *)out + i * (dt == LMK_F32 ? 4 : 2), v);
}

/* Elements [i, i + 2 VW) of a build's output (a, then b). */
LMK_CPU_STEP V_TARGET void VN(put2)(int to, lmk_dtype dt, void *out, size_t i, VF a, VF b)
{
    if (to == TO_X) {
        V(storeu)((float *)out + i, a);
        V(storeu)((float *)out + i + VW, b);
    } else {
        V(store2)(dt, to == TO_DEST_NT, (unsigned char *)out + i * (dt == LMK_F32 ? 4 : 2), a, b);
    }
}

/* VW input elements from i, times r * w. */
LMK_CPU_STEP V_TARGET VF VN(scaled)(lmk_dtype dt, const unsigned char *in, size_t i, VF rv, const float *w)
{
    return V(mul)(V(mul)(V(load)(dt, in + i * (dt == LMK_F32 ? 4 : 2)), rv), V(loadu)(w + i));
}

/* Builds that store bf16 go two vectors a step, so that each narrowing takes both
 * (V(store2); a direct build's pairs and gaps are whole steps: direct_ok). f32 and f16 keep steps
 * of one vector: their stores gain nothing from pairing. */
#define PAIRED(dt, to) ((dt) == LMK_BF16 && (to) != TO_X)

LMK_CPU_STEP V_TARGET void VN(gap)(lmk_dtype dt, int to, const unsigned char *in, void *out, const float *w, float r,
                                   size_t lo, size_t hi)
{
    const VF rv = V(set1)(r);
    size_t i = lo;
    if (PAIRED(dt, to))
        for (; i + 2 * VW <= hi; i += 2 * VW)
            VN(put2)(to, dt, out, i, VN(scaled)(dt, in, i, rv, w), VN(scaled)(dt, in, i + VW, rv, w));
    for (; i + VW <= hi; i += VW) /* and the scalar tail: only with to == TO_X (direct_ok) */
        VN(put)(to, dt, out, i, VN(scaled)(dt, in, i, rv, w));
    if (i < hi)
        gap_scalar(dt, in, (float *)out, w, r, i, hi);
}

/* Adjacent pairs [p, p + VW / 2) (elements 2p .. 2p + VW), scaled and rotated. */
LMK_CPU_STEP V_TARGET VF VN(adjacent_step)(lmk_dtype dt, const unsigned char *in, size_t p, VF rv, const float *w,
                                           const ap_table *tb)
{
    return V(rotate_adjacent)(VN(scaled)(dt, in, 2 * p, rv, w), tb->c + p, tb->s + p);
}

/* Split pairs [p, p + VW) (a at p, b at p + st), scaled and rotated. */
LMK_CPU_STEP V_TARGET void VN(split_step)(lmk_dtype dt, const unsigned char *in, size_t p, size_t st, VF rv,
                                          const float *w, const ap_table *tb, VF *ya, VF *yb)
{
    V(rotate)(VN(scaled)(dt, in, p, rv, w), VN(scaled)(dt, in, p + st, rv, w), tb->c + p, tb->s + p, ya, yb);
}

/* Split pairs VW at a time, a vector of a's against a vector of b's (stride >= n: the two never
 * overlap); adjacent pairs VW / 2 at a time (V(rotate_adjacent)); two steps at once where PAIRED. */
LMK_CPU_STEP V_TARGET void VN(build_dt)(lmk_dtype dt, int to, const lmk_rope_args *ra, const unsigned char *in,
                                        void *out, const float *w, float r, const ap_table *tb)
{
    const size_t n = ra->angle.n_pairs, st = ra->pair_stride;
    const VF rv = V(set1)(r);
    size_t p = 0, g[2][2];
    VF ya, yb, ya1, yb1;
    if (ra->interleaved) {
        for (; PAIRED(dt, to) && p + VW <= n; p += VW)
            VN(put2)(to, dt, out, 2 * p, VN(adjacent_step)(dt, in, p, rv, w, tb),
                     VN(adjacent_step)(dt, in, p + VW / 2, rv, w, tb));
        for (; p + VW / 2 <= n; p += VW / 2) /* bf16 stores: the tail of TO_X only */
            VN(put)(to, dt, out, 2 * p, VN(adjacent_step)(dt, in, p, rv, w, tb));
    } else {
        for (; PAIRED(dt, to) && p + 2 * VW <= n; p += 2 * VW) {
            VN(split_step)(dt, in, p, st, rv, w, tb, &ya, &yb);
            VN(split_step)(dt, in, p + VW, st, rv, w, tb, &ya1, &yb1);
            VN(put2)(to, dt, out, p, ya, ya1);
            VN(put2)(to, dt, out, p + st, yb, yb1);
        }
        for (; p + VW <= n; p += VW) { /* bf16 stores: the tail of TO_X only */
            VN(split_step)(dt, in, p, st, rv, w, tb, &ya, &yb);
            VN(put)(to, dt, out, p, ya);
            VN(put)(to, dt, out, p + st, yb);
        }
    }
    if (p < n) /* only with to == TO_X (direct_ok); the tail is a call: skip it when empty */
        pairs_scalar(dt, in, (float *)out, w, r, tb, p, n, st, ra->interleaved);
    gaps_of(ra, g);
    VN(gap)(dt, to, in, out, w, r, g[0][0], g[0][1]);
    VN(gap)(dt, to, in, out, w, r, g[1][0], g[1][1]);
}

#undef PAIRED

/* bf16 rows in even/odd order (ap_job.eo: every pair run and gap whole blocks of 2 VW): each block
 * of the row is one load widened to its even and odd elements (V(bf16_widen_eo)), the weights and,
 * for split pairs, cos/sin are held in that order (do_tokens puts them so), and the results leave
 * narrowed in element order (V(store_bf16_eo)) or, into x, interleaved back. Each element meets
 * the same operands in the same order as in build_dt, so the bits are the same. Adjacent pairs
 * are the even and odd elements themselves, with cos/sin in pair order. */
LMK_CPU_STEP V_TARGET void VN(scaled_eo)(const unsigned char *in, size_t i, VF rv, const float *w, VF *e, VF *o)
{
    V(bf16_widen_eo)(in + 2 * i, e, o);
    *e = V(mul)(V(mul)(*e, rv), V(loadu)(w + i));
    *o = V(mul)(V(mul)(*o, rv), V(loadu)(w + i + VW));
}

LMK_CPU_STEP V_TARGET void VN(put_eo)(int to, void *out, size_t i, VF e, VF o)
{
    if (to == TO_X)
        V(store_eo_f32)((float *)out + i, e, o);
    else
        V(store_bf16_eo)((unsigned char *)out + 2 * i, e, o, to == TO_DEST_NT);
}

LMK_CPU_STEP V_TARGET void VN(build_eo)(int to, const lmk_rope_args *ra, const unsigned char *in, void *out,
                                        const float *w, float r, const ap_table *tb)
{
    const size_t n = ra->angle.n_pairs, st = ra->pair_stride;
    const VF rv = V(set1)(r);
    VF ae, ao, be, bo, yae, yao, ybe, ybo;
    size_t g[2][2];
    if (ra->interleaved) {
        for (size_t p = 0; p < n; p += VW) { /* elements 2p .. 2p + 2 VW: a the even ones, b the odd */
            VN(scaled_eo)(in, 2 * p, rv, w, &ae, &be);
            V(rotate_eo)(ae, be, tb->c + p, tb->s + p, &yae, &ybe);
            VN(put_eo)(to, out, 2 * p, yae, ybe);
        }
    } else {
        for (size_t p = 0; p < n; p += 2 * VW) {
            VN(scaled_eo)(in, p, rv, w, &ae, &ao);
            VN(scaled_eo)(in, p + st, rv, w, &be, &bo);
            V(rotate)(ae, be, tb->c + p, tb->s + p, &yae, &ybe);
            V(rotate)(ao, bo, tb->c + p + VW, tb->s + p + VW, &yao, &ybo);
            VN(put_eo)(to, out, p, yae, yao);
            VN(put_eo)(to, out, p + st, ybe, ybo);
        }
    }
    gaps_of(ra, g);
    for (int k = 0; k < 2; k++)
        for (size_t i = g[k][0]; i < g[k][1]; i += 2 * VW) {
            VN(scaled_eo)(in, i, rv, w, &ae, &ao);
            VN(put_eo)(to, out, i, ae, ao);
        }
}

/* n floats (a multiple of 2 VW) from element order to even/odd order, a block at a time. */
V_TARGET static void VN(eo_order)(float *t, size_t n)
{
    for (size_t i = 0; i < n; i += 2 * VW)
        V(eo)(t + i);
}

V_TARGET static void VN(build)(lmk_dtype dt, int to, bool eo, const lmk_rope_args *ra, const unsigned char *in,
                               void *out, const float *w, float r, const ap_table *tb)
{
    if (dt == LMK_BF16 && eo) {
        to == TO_X ? VN(build_eo)(TO_X, ra, in, out, w, r, tb)
        : to == TO_DEST ? VN(build_eo)(TO_DEST, ra, in, out, w, r, tb)
                        : VN(build_eo)(TO_DEST_NT, ra, in, out, w, r, tb);
        return;
    }
    if (to == TO_X)
        dt == LMK_F32    ? VN(build_dt)(LMK_F32, TO_X, ra, in, out, w, r, tb)
        : dt == LMK_BF16 ? VN(build_dt)(LMK_BF16, TO_X, ra, in, out, w, r, tb)
                         : VN(build_dt)(LMK_F16, TO_X, ra, in, out, w, r, tb);
    else if (to == TO_DEST)
        dt == LMK_F32    ? VN(build_dt)(LMK_F32, TO_DEST, ra, in, out, w, r, tb)
        : dt == LMK_BF16 ? VN(build_dt)(LMK_BF16, TO_DEST, ra, in, out, w, r, tb)
                         : VN(build_dt)(LMK_F16, TO_DEST, ra, in, out, w, r, tb);
    else
        dt == LMK_F32    ? VN(build_dt)(LMK_F32, TO_DEST_NT, ra, in, out, w, r, tb)
        : dt == LMK_BF16 ? VN(build_dt)(LMK_BF16, TO_DEST_NT, ra, in, out, w, r, tb)
                         : VN(build_dt)(LMK_F16, TO_DEST_NT, ra, in, out, w, r, tb);
}

LMK_CPU_STEP V_TARGET void VN(widen_dt)(lmk_dtype dt, const unsigned char *in, float *x, size_t n)
{
    const size_t es = dt == LMK_F32 ? 4 : 2;
    size_t i = 0;
    for (; i + VW <= n; i += VW)
        V(storeu)(x + i, V(load)(dt, in + i * es));
    widen_scalar(dt, in, x, i, n);
}

V_TARGET static void VN(widen)(lmk_dtype dt, const unsigned char *in, float *x, size_t n)
{
    if (dt == LMK_F32)
        VN(widen_dt)(LMK_F32, in, x, n);
    else if (dt == LMK_BF16)
        VN(widen_dt)(LMK_BF16, in, x, n);
    else
        VN(widen_dt)(LMK_F16, in, x, n);
}

/* VW elements of x at x as narrow_dt stores them: times inv for f8. A step of its own, so that at
 * -O0 its temporaries are not in the frame that the stores below are called from. */
LMK_CPU_STEP V_TARGET VF VN(narrow_in)(lmk_dtype odt, const float *x, float inv)
{
    return odt == LMK_F8E4M3 ? V(mul)(V(loadu)(x), V(set1)(inv)) : V(loadu)(x);
}

/* Elements [lo, hi) of x into d (dtype odt), two vectors a step, then one. With nt the range is
 * whole aligned lines, so the scalar tail never streams. */
LMK_CPU_STEP V_TARGET void VN(narrow_dt)(lmk_dtype odt, int nt, const row_dest *d, const float *x, size_t lo,
                                         size_t hi)
{
    const size_t oes = odt == LMK_F32 ? 4 : odt == LMK_F8E4M3 ? 1 : 2;
    size_t i = lo;
    for (; i + 2 * VW <= hi; i += 2 * VW)
        V(store2)(odt, nt, d->p + i * oes, VN(narrow_in)(odt, x + i, d->inv), VN(narrow_in)(odt, x + i + VW, d->inv));
    for (; i + VW <= hi; i += VW)
        V(store)(odt, nt, d->p + i * oes, VN(narrow_in)(odt, x + i, d->inv));
    if (i < hi)
        narrow_scalar(d, x, i, hi);
}

V_TARGET static void VN(narrow)(const row_dest *d, const float *x, size_t lo, size_t hi)
{
    switch (d->dt) {
    case LMK_F32:
        d->nt ? VN(narrow_dt)(LMK_F32, 1, d, x, lo, hi) : VN(narrow_dt)(LMK_F32, 0, d, x, lo, hi);
        break;
    case LMK_BF16:
        d->nt ? VN(narrow_dt)(LMK_BF16, 1, d, x, lo, hi) : VN(narrow_dt)(LMK_BF16, 0, d, x, lo, hi);
        break;
    case LMK_F16:
        d->nt ? VN(narrow_dt)(LMK_F16, 1, d, x, lo, hi) : VN(narrow_dt)(LMK_F16, 0, d, x, lo, hi);
        break;
    default:
        d->nt ? VN(narrow_dt)(LMK_F8E4M3, 1, d, x, lo, hi) : VN(narrow_dt)(LMK_F8E4M3, 0, d, x, lo, hi);
        break;
    }
}

#undef LMK_VEC_W
#include "cpu/vec_width.h"
