/*
 * ref.c - the naive reference of causal_conv1d: the executable spec (lmk.h, "causal_conv1d").
 *
 * One channel at a time, its sequences in order, its tokens in order, straight from the
 * definition: xx is the sequence's W-1 state rows (zeros without a row) followed by its inputs,
 *
 *     y[t, c] = act( bias[c] + sum_{j=0..W-1} weight[c, j] * xx[t - (W-1) + j, c] )
 *
 * in float64 (each product of two values of at most 24 significant bits is exact), rounded once to
 * y's dtype. A window of W elements (the last W-1 of xx and the current input, as their bits) is
 * all a channel carries from token to token: each input element is read into it before its output
 * element is written, so y == x (in place) gives the same result. After the sequence the window's
 * W-1 oldest entries are the last W-1 rows of xx, stored bit for bit into the sequence's state row
 * when lmk_seq_stores says the sequence stores it (the last of the call's sequences naming the
 * row; every one of them read the row before any store, since only that last one writes). Reading
 * cu_seqlens and the slots goes through src/ops/varlen.h, as every backend does. No threads, no
 * vectors.
 */
#include "core/internal.h"
#include "ops/causal_conv1d/causal_conv1d.h"
#include "ops/varlen.h"

#include <math.h>
#include <string.h>

#define MAX_W 8

/* v as an f32 rounded to odd: the nearest f32 when exact, else the one of the two neighbours of v
 * whose last significand bit is 1 (largest finite beyond the range). Rounding that to a format of
 * at least two bits fewer (bf16, f16) to nearest gives v rounded to nearest once. */
static float f32_round_odd(double v)
{
    float f = (float)v;
    if (isnan(v) || (double)f == v)
        return f;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (u & 1u)
        return f;
    return nextafterf(f, v > (double)f ? INFINITY : -INFINITY);
}

/* v rounded once to nearest (ties to even) into element i of an f32, bf16 or f16 array. */
static void store_rounded(lmk_dtype t, void *base, size_t i, double v)
{
    if (t == LMK_F32) {
        const float f = (float)v;
        memcpy((char *)base + 4 * i, &f, 4);
        return;
    }
    const float f = f32_round_odd(v);
    const uint16_t h = t == LMK_BF16 ? lmk_f32_to_bf16(f) : lmk_f32_to_f16(f);
    memcpy((char *)base + 2 * i, &h, 2);
}

static double activate(lmk_activation act, double s)
{
    return act == LMK_ACT_SILU ? s / (1.0 + exp(-s)) : s;
}

/* Channel c of sequence s: its outputs, and its state row when it stores one. */
static void ref_channel_seq(const lmk_causal_conv1d_args *a, size_t s, size_t c)
{
    const size_t W = a->W, es = lmk_dtype_size(a->dtype);
    size_t lo, hi;
    lmk_seq_bounds(a->cu_seqlens, a->cu_is64, s, a->T, &lo, &hi);
    const size_t n_slots = a->state ? a->n_slots : 0;
    const int64_t row = lmk_seq_slot(a->slots, a->slots_is64, s, n_slots);
    unsigned char win[MAX_W][4] = {{0}}; /* bits: win[0..W-2] the last W-1 rows of xx, win[W-1] the input */
    unsigned char *st = row >= 0 ? (unsigned char *)a->state + ((size_t)row * a->st_slot + c * a->st_ch) * es : NULL;
    for (size_t i = 0; st && i + 1 < W; i++)
        memcpy(win[i], st + i * a->st_row * es, es);
    double w[MAX_W];
    for (size_t j = 0; j < W; j++)
        w[j] = lmk_float_load(a->w_dtype, a->weight, c * W + j);
    const double b = a->bias ? lmk_float_load(a->bias_dtype, a->bias, c) : 0.0;
    const unsigned char *x = a->x;
    unsigned char *y = a->y;
    for (size_t t = lo; t < hi; t++) {
        memcpy(win[W - 1], x + (t * a->x_tok + c) * es, es);
        double acc = b;
        for (size_t j = 0; j < W; j++)
            acc += w[j] * lmk_float_load(a->dtype, win[j], 0);
        store_rounded(a->dtype, y + (t * a->y_tok + c) * es, 0, activate(a->act, acc));
        memmove(win[0], win[1], (W - 1) * sizeof win[0]);
    }
    if (st && lmk_seq_stores(a->slots, a->slots_is64, s, a->n_seq, n_slots, row))
        for (size_t i = 0; i + 1 < W; i++)
            memcpy(st + i * a->st_row * es, win[i], es);
}

void lmk_ref_causal_conv1d(const lmk_causal_conv1d_args *a)
{
    for (size_t c = 0; c < a->C; c++)
        for (size_t s = 0; s < a->n_seq; s++)
            ref_channel_seq(a, s, c);
}
