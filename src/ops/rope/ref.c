/*
 * ref.c - the naive reference of rope: the executable spec.
 *
 * Float64 throughout, one pair at a time, written from lmk.h's formulas on its own (it does not
 * use src/ops/rope_math.h, which the fast paths share, so a mistake there cannot hide in both): the
 * pair layout of each mode, the axis and exponent index from the sections, the YaRN ramp and its
 * correction range computed again from the resolved parameters, and the magnitude m. No table, no
 * vectors, no threads. Inputs are read through their strides; results are dense [T, heads, D].
 */
#include "core/internal.h"
#include "ops/rope/rope.h"

#include <math.h>
#include <string.h>

static const double k_pi = 3.14159265358979323846;

/* Element (token, head, i) of a tensor's input, widened. */
static double in_elem(lmk_dtype dt, const lmk_rope_tensor *t, size_t token, size_t head, size_t i)
{
    return lmk_float_load(dt, t->in, token * t->in_tok + head * t->in_head + i);
}

/* Axis (0..3) and exponent index j of pair p: lmk.h's section rules, spelled out per mode. */
static int axis_and_j(const lmk_rope_angle *g, uint32_t p, uint32_t *j)
{
    *j = p;
    if (g->mode == LMK_ROPE_NORMAL || g->mode == LMK_ROPE_NEOX)
        return 0;
    const uint64_t s[4] = {g->sections[0], g->sections[1], g->sections[2], g->sections[3]};
    const uint64_t sum = s[0] + s[1] + s[2] + s[3];
    const uint64_t sector = p % (sum ? sum : 1);
    if (g->mode == LMK_ROPE_IMROPE) {
        for (int axis = 0; axis < 3; axis++)
            if (sector % 3 == (uint64_t)axis && sector < 3 * s[axis])
                return axis;
        return 3;
    }
    uint64_t start = 0;
    for (int axis = 0; axis < 3; axis++) {
        if (sector < start + s[axis]) {
            if (g->mode == LMK_ROPE_VISION)
                *j = (uint32_t)(sector - start);
            return axis;
        }
        start += s[axis];
    }
    if (g->mode == LMK_ROPE_VISION)
        *j = (uint32_t)(sector - start);
    return 3;
}

static double position(const lmk_rope_angle *g, int axis, size_t token)
{
    const size_t i = (size_t)axis * g->pos_axis_stride + token;
    if (g->pos_dtype == LMK_I64) {
        int64_t v;
        memcpy(&v, (const char *)g->positions + 8 * i, 8);
        return (double)v;
    }
    int32_t v;
    memcpy(&v, (const char *)g->positions + 4 * i, 4);
    return (double)v;
}

/* theta and m of pair p at `token`, exactly as lmk.h writes them. */
static double angle(const lmk_rope_angle *g, uint32_t p, size_t token, double *m)
{
    uint32_t j;
    const int axis = axis_and_j(g, p, &j);
    const double ff = g->freq_factors ? (double)g->freq_factors[p] : 1.0;
    const double theta_e = position(g, axis, token) * pow(g->freq_base, -2.0 * (double)j / g->exp_n) / ff;
    const double theta_i = g->freq_scale * theta_e;
    if (g->ext_factor == 0.0) {
        *m = g->attn_factor;
        return theta_i;
    }
    const double n = g->exp_n;
    const double corr_fast = n * log((double)g->n_ctx_orig / (2.0 * k_pi * g->beta_fast)) / (2.0 * log(g->freq_base));
    const double corr_slow = n * log((double)g->n_ctx_orig / (2.0 * k_pi * g->beta_slow)) / (2.0 * log(g->freq_base));
    const double low = fmax(0.0, floor(corr_fast)), high = fmin(n - 1.0, ceil(corr_slow));
    const double y = ((double)p - low) / fmax(0.001, high - low);
    const double ramp = (1.0 - fmin(fmax(y, 0.0), 1.0)) * g->ext_factor;
    *m = g->attn_factor * (1.0 + 0.1 * log(1.0 / g->freq_scale));
    return theta_i * (1.0 - ramp) + theta_e * ramp;
}

void lmk_ref_rope_row(const lmk_rope_args *a, size_t token, const double *x, double *row)
{
    if (row != x)
        for (size_t i = 0; i < a->head_dim; i++)
            row[i] = x[i];
    for (uint32_t p = 0; p < a->rope_dim / 2; p++) {
        const size_t ia = a->interleaved ? 2 * (size_t)p : p;
        const size_t ib = a->interleaved ? ia + 1 : p + (size_t)a->pair_stride;
        double m;
        const double theta = angle(&a->angle, p, token, &m);
        const double c = cos(theta), s = sin(theta), xa = x[ia], xb = x[ib];
        row[ia] = (xa * c - xb * s) * m;
        row[ib] = (xa * s + xb * c) * m;
    }
}

static void rotate_row(const lmk_rope_args *a, const lmk_rope_tensor *t, size_t token, size_t head, double *row)
{
    /* The row's inputs, widened, are staged in the output row's storage, then rotated in place. */
    for (size_t i = 0; i < a->head_dim; i++)
        row[i] = in_elem(a->dtype, t, token, head, i);
    lmk_ref_rope_row(a, token, row, row);
}

void lmk_ref_rope_f64_tokens(const lmk_rope_args *a, size_t t0, size_t t1, double *const out64[2])
{
    for (int ti = 0; ti < a->n_tensors; ti++) {
        const lmk_rope_tensor *t = &a->t[ti];
        for (size_t token = t0; token < t1; token++)
            for (size_t h = 0; h < t->n_heads; h++)
                rotate_row(a, t, token, h, out64[ti] + ((token - t0) * t->n_heads + h) * a->head_dim);
    }
}

void lmk_ref_rope_f64(const lmk_rope_args *a, double *const out64[2])
{
    lmk_ref_rope_f64_tokens(a, 0, a->seq_len, out64);
}
