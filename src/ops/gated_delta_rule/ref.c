/*
 * ref.c - the naive reference of gated_delta_rule: the executable spec.
 *
 * lmk.h's formulas written out in double, one (sequence, value head) at a time, token by token:
 *
 *     g    = -exp(A_log[h]) * softplus(a[t,h] + dt_bias[h]),  beta = sigmoid(b[t,h])   (or a, b as given)
 *     qn   = q / sqrt(sum q^2 + 1e-6) * scale,  kn = k / sqrt(sum k^2 + 1e-6)           (or q*scale, k)
 *     S    = exp(g) * S;  u = beta * (v - S^T kn);  S = S + kn u^T;  o = S^T qn
 *     out  = o * rsqrt(mean(o^2) + eps) * (norm_w + weight_offset) * silu(z)           (or o)
 *
 * The state is read from its pool row widened, carried in double through the whole sequence and
 * stored rounded once to the pool's dtype at the sequence's end, only by the sequence that
 * lmk_seq_stores names (the last of those naming the row); sequences run in order, so every one of
 * them reads the row as it was before the call. Sequences and rows come from src/ops/varlen.h,
 * as in every backend. Each output element is rounded once to out's dtype. No threads, no vectors.
 */
#include "ops/gated_delta_rule/gated_delta_rule.h"
#include "ops/varlen.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Stores v rounded to f32, then to t with the library's conversions (f32, bf16, f16). */
static void store(lmk_dtype t, void *base, size_t i, double v)
{
    const float f = (float)v;
    if (t == LMK_F32) {
        memcpy((char *)base + 4 * i, &f, 4);
        return;
    }
    const uint16_t h = t == LMK_BF16 ? lmk_f32_to_bf16(f) : lmk_f32_to_f16(f);
    memcpy((char *)base + 2 * i, &h, 2);
}

/* ln(1 + e^x) without overflow for large x and without losing small results for very negative x. */
static double softplus(double x)
{
    return x > 0.0 ? x + log1p(exp(-x)) : log1p(exp(x));
}

static double sigmoid(double x)
{
    if (x >= 0.0)
        return 1.0 / (1.0 + exp(-x));
    const double e = exp(x);
    return e / (1.0 + e);
}

/* Scratch of one (sequence, head): the state and the vectors of one token. */
typedef struct ref_work {
    double *S;       /* [dk, dv], row i holds S[i, :] */
    double *qn, *kn; /* [dk] */
    double *u, *o;   /* [dv] */
} ref_work;

/* The decay exp(g) and beta of token t, head h. */
static void gates(const lmk_gdn_args *a, size_t t, size_t h, double *decay, double *beta)
{
    const double x = lmk_float_load(a->a_dtype, a->a, t * a->a_tok + h);
    const double y = lmk_float_load(a->b_dtype, a->b, t * a->b_tok + h);
    if (!a->A_log) {
        *decay = exp(x);
        *beta = y;
        return;
    }
    const double A = exp(lmk_float_load(a->A_dtype, a->A_log, h));
    *decay = exp(-A * softplus(x + lmk_float_load(a->dt_dtype, a->dt_bias, h)));
    *beta = sigmoid(y);
}

/* Row `head` of token t of a [T, H, d] tensor, widened, L2-normalised when asked, times `mul`. */
static void load_row(const lmk_gdn_args *a, const void *base, size_t tok, size_t head, size_t t, size_t kh,
                     double mul, double *row)
{
    double ss = 0.0;
    for (size_t i = 0; i < a->dk; i++) {
        row[i] = lmk_float_load(a->dtype, base, t * tok + kh * head + i);
        ss += row[i] * row[i];
    }
    const double r = a->l2norm ? 1.0 / sqrt(ss + 1e-6) : 1.0;
    for (size_t i = 0; i < a->dk; i++)
        row[i] *= r * mul;
}

/* The output of token t, head h from o: gated RMSNorm when z is given, then rounded to out's dtype. */
static void store_out(const lmk_gdn_args *a, size_t t, size_t h, const double *o)
{
    const size_t dv = a->dv, at = t * a->o_tok + h * a->o_head;
    if (!a->z) {
        for (size_t j = 0; j < dv; j++)
            store(a->dtype, a->out, at + j, o[j]);
        return;
    }
    double ms = 0.0;
    for (size_t j = 0; j < dv; j++)
        ms += o[j] * o[j];
    const double r = 1.0 / sqrt(ms / (double)dv + (double)a->eps);
    for (size_t j = 0; j < dv; j++) {
        const double z = lmk_float_load(a->z_dtype, a->z, t * a->z_tok + h * a->z_head + j);
        const double w = lmk_float_load(a->nw_dtype, a->norm_w, j) + (double)a->weight_offset;
        store(a->dtype, a->out, at + j, o[j] * r * w * (z * sigmoid(z)));
    }
}

/* One token of the recurrence for head h, on the state in w->S. */
static void step(const lmk_gdn_args *a, size_t t, size_t h, ref_work *w)
{
    const size_t dk = a->dk, dv = a->dv, kh = lmk_gdn_k_head(a, h);
    double decay, beta;
    gates(a, t, h, &decay, &beta);
    load_row(a, a->q, a->q_tok, a->q_head, t, kh, (double)a->scale, w->qn);
    load_row(a, a->k, a->k_tok, a->k_head, t, kh, 1.0, w->kn);
    for (size_t e = 0; e < dk * dv; e++)
        w->S[e] *= decay;
    for (size_t j = 0; j < dv; j++)
        w->u[j] = 0.0;
    for (size_t i = 0; i < dk; i++) /* u = S^T kn, summed over i in order */
        for (size_t j = 0; j < dv; j++)
            w->u[j] += w->S[i * dv + j] * w->kn[i];
    for (size_t j = 0; j < dv; j++)
        w->u[j] = beta * (lmk_float_load(a->dtype, a->v, t * a->v_tok + h * a->v_head + j) - w->u[j]);
    for (size_t j = 0; j < dv; j++)
        w->o[j] = 0.0;
    for (size_t i = 0; i < dk; i++)
        for (size_t j = 0; j < dv; j++) {
            w->S[i * dv + j] += w->kn[i] * w->u[j];
            w->o[j] += w->S[i * dv + j] * w->qn[i];
        }
    store_out(a, t, h, w->o);
}

/* Element (i, j) of head h of pool row `row`: its index in the pool. */
static size_t state_at(const lmk_gdn_args *a, int64_t row, size_t h, size_t i, size_t j)
{
    return (size_t)row * a->s_slot + h * a->s_head + i * a->s_k + j * a->s_v;
}

/* Sequence s, head h: the state from its row (zeros without one), its tokens, the store. */
static void run_head(const lmk_gdn_args *a, size_t s, size_t h, ref_work *w)
{
    const size_t dk = a->dk, dv = a->dv;
    size_t lo, hi;
    lmk_seq_bounds(a->cu_seqlens, a->cu_is64, s, a->T, &lo, &hi);
    const int64_t row = a->state ? lmk_seq_slot(a->slots, a->slots_is64, s, a->n_slots) : -1;
    for (size_t i = 0; i < dk; i++)
        for (size_t j = 0; j < dv; j++)
            w->S[i * dv + j] = row >= 0 ? lmk_float_load(a->state_dtype, a->state, state_at(a, row, h, i, j)) : 0.0;
    for (size_t t = lo; t < hi; t++)
        step(a, t, h, w);
    if (!lmk_seq_stores(a->slots, a->slots_is64, s, a->n_seq, a->n_slots, row))
        return;
    for (size_t i = 0; i < dk; i++)
        for (size_t j = 0; j < dv; j++)
            store(a->state_dtype, a->state, state_at(a, row, h, i, j), w->S[i * dv + j]);
}

void lmk_ref_gated_delta_rule(const lmk_gdn_args *a)
{
    ref_work w = {.S = malloc(a->dk * a->dv * sizeof(double)), .qn = malloc(a->dk * sizeof(double)),
                  .kn = malloc(a->dk * sizeof(double)), .u = malloc(a->dv * sizeof(double)),
                  .o = malloc(a->dv * sizeof(double))};
    if (w.S && w.qn && w.kn && w.u && w.o) /* the reference runs in tests and tools only; they check their memory */
        for (size_t s = 0; s < a->n_seq; s++)
            for (size_t h = 0; h < a->Hv; h++)
                run_head(a, s, h, &w);
    free(w.S), free(w.qn), free(w.kn), free(w.u), free(w.o);
}
