/*
 * ref.c - the naive reference of attn_prologue: the executable spec.
 *
 * The float64 chain of lmk.h, one head row at a time: widen, RMSNorm over the whole head
 * (x / sqrt(mean(x^2) + eps) * (w + weight_offset)), rope through rope's own float64 reference
 * (lmk_ref_rope_row), then store: q_out and k_out rounded to their dtype from the float64 value,
 * cache rows through slots (nothing for a slot outside [0, rows)), f8 caches as lmk_f32_to_f8e4m3
 * of x * inv rounded to f32 (inv: the call's f32 inverse scale, lmk.h's rule), saturated to +-448.
 * A value of the input dtype (v, and k elements stored unchanged) times inv is exact in double, so
 * its f32 rounding is the backends' f32 product and the codes are theirs bit for bit; for the
 * float64 chain of q and k, x * inv is the value the backends' f32 results approximate, within one
 * f8 ulp. Without a norm, elements outside the rotated pairs stored in the input dtype are the
 * input's bits (NaN payloads included). v goes to its cache unchanged (a bit copy when the cache
 * has v's dtype, else quantised). No threads, no vectors.
 */
#include "core/internal.h"
#include "ops/attn_prologue/attn_prologue.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double load(lmk_dtype t, const void *base, size_t i)
{
    return lmk_float_load(t, base, i);
}

static void store(lmk_dtype t, void *base, size_t i, double v)
{
    const float f = (float)v;
    switch (t) {
    case LMK_F32:
        memcpy((char *)base + 4 * i, &f, 4);
        break;
    case LMK_BF16: {
        const uint16_t h = lmk_f32_to_bf16(f);
        memcpy((char *)base + 2 * i, &h, 2);
        break;
    }
    case LMK_F16: {
        const uint16_t h = lmk_f32_to_f16(f);
        memcpy((char *)base + 2 * i, &h, 2);
        break;
    }
    default: /* LMK_F8E4M3 */
        ((uint8_t *)base)[i] = lmk_f32_to_f8e4m3(f);
        break;
    }
}

/* One head row of q (which 0) or k (1): norm then rope, into row (head_dim doubles). */
static void chain_row(const lmk_attn_prologue_args *a, int which, size_t token, size_t head, double *row)
{
    const lmk_rope_tensor *t = &a->rope.t[which];
    const size_t d = a->rope.head_dim;
    const void *w = which ? a->k_norm_w : a->q_norm_w;
    const lmk_dtype wt = which ? a->k_norm_dtype : a->q_norm_dtype;
    for (size_t i = 0; i < d; i++)
        row[i] = load(a->rope.dtype, t->in, token * t->in_tok + head * t->in_head + i);
    if (w) {
        double ss = 0;
        for (size_t i = 0; i < d; i++)
            ss += row[i] * row[i];
        const double r = 1.0 / sqrt(ss / (double)d + a->eps);
        for (size_t i = 0; i < d; i++)
            row[i] = row[i] * r * (load(wt, w, i) + a->weight_offset);
    }
    lmk_ref_rope_row(&a->rope, token, row, row);
}

void lmk_ref_attn_prologue_token(const lmk_attn_prologue_args *a, size_t token, double *q_row64, double *k_row64)
{
    const size_t d = a->rope.head_dim;
    for (size_t h = 0; h < a->rope.t[0].n_heads; h++)
        chain_row(a, 0, token, h, q_row64 + h * d);
    for (size_t h = 0; h < a->rope.t[1].n_heads; h++)
        chain_row(a, 1, token, h, k_row64 + h * d);
}

static long long slot_of(const lmk_attn_prologue_args *a, size_t token)
{
    if (a->slot_dtype == LMK_I64) {
        int64_t v;
        memcpy(&v, (const char *)a->slots + 8 * token, 8);
        return v;
    }
    int32_t v;
    memcpy(&v, (const char *)a->slots + 4 * token, 4);
    return v;
}

/* Stores head row `row64` (dim values) into a [rows, heads, dim] tensor at (r, head); an f8
 * destination gets the values times inv (the call's f32 inverse scale). */
static void store_row(const lmk_rows *dst, size_t r, size_t head, const double *row64, size_t dim, float inv)
{
    for (size_t i = 0; i < dim; i++)
        store(dst->dtype, dst->data, r * dst->tok + head * dst->head + i,
              dst->dtype == LMK_F8E4M3 ? row64[i] * (double)inv : row64[i]);
}

/* v of one token into its cache row: a bit copy in v's dtype, or quantised to f8. */
static void store_v(const lmk_attn_prologue_args *a, size_t token, size_t r)
{
    const size_t dv = a->v_dim, es = lmk_dtype_size(a->rope.dtype);
    for (size_t h = 0; h < a->rope.t[1].n_heads; h++)
        for (size_t i = 0; i < dv; i++) {
            const size_t from = token * a->v_in.tok + h * a->v_in.head + i;
            const size_t to = r * a->v_cache.tok + h * a->v_cache.head + i;
            if (a->v_cache.dtype == LMK_F8E4M3)
                store(LMK_F8E4M3, a->v_cache.data, to,
                      load(a->rope.dtype, a->v_in.data, from) * (double)a->v_inv_scale);
            else
                memcpy((char *)a->v_cache.data + to * es, (const char *)a->v_in.data + from * es, es);
        }
}

/* Whether element i of a row is in a rotated pair (lmk.h's pair table). */
static bool in_pair(const lmk_rope_args *r, size_t i)
{
    const size_t half = r->rope_dim / 2;
    return r->interleaved ? i < r->rope_dim : i < half || (i >= r->pair_stride && i < r->pair_stride + half);
}

/* The input bits of one token's rows of q (which 0) or k (1), gathered before any store (in place,
 * the stores overwrite them). */
static void gather_bits(const lmk_attn_prologue_args *a, int which, size_t token, unsigned char *bits)
{
    const lmk_rope_tensor *t = &a->rope.t[which];
    const size_t d = a->rope.head_dim, es = lmk_dtype_size(a->rope.dtype);
    for (size_t h = 0; h < t->n_heads; h++)
        memcpy(bits + h * d * es, (const char *)t->in + (token * t->in_tok + h * t->in_head) * es, d * es);
}

/* Stores a row, then, without a norm (bits given) and in the input dtype, puts the input's bits
 * back on the elements outside the rotated pairs: lmk.h makes them raw bit copies, and a trip
 * through double would quiet a signalling NaN. */
static void store_copy_row(const lmk_attn_prologue_args *a, const lmk_rows *dst, size_t r, size_t head,
                           const double *row64, float inv, const unsigned char *bits)
{
    const size_t d = a->rope.head_dim, es = lmk_dtype_size(a->rope.dtype);
    store_row(dst, r, head, row64, d, inv);
    if (!bits || dst->dtype != a->rope.dtype)
        return;
    for (size_t i = 0; i < d; i++)
        if (!in_pair(&a->rope, i))
            memcpy((char *)dst->data + (r * dst->tok + head * dst->head + i) * es, bits + (head * d + i) * es, es);
}

void lmk_ref_attn_prologue(const lmk_attn_prologue_args *a)
{
    const size_t d = a->rope.head_dim, hq = a->rope.t[0].n_heads, hk = a->rope.t[1].n_heads;
    const size_t es = lmk_dtype_size(a->rope.dtype);
    double *q = malloc(hq * d * sizeof *q), *k = malloc(hk * d * sizeof *k);
    unsigned char *qb = malloc(hq * d * es), *kb = malloc(hk * d * es);
    if (!q || !k || !qb || !kb) { /* the reference runs in tests and tools only; they check their own memory */
        free(q), free(k), free(qb), free(kb);
        return;
    }
    const unsigned char *qbits = a->q_norm_w ? NULL : qb, *kbits = a->k_norm_w ? NULL : kb;
    for (size_t token = 0; token < a->rope.seq_len; token++) {
        gather_bits(a, 0, token, qb);
        gather_bits(a, 1, token, kb);
        lmk_ref_attn_prologue_token(a, token, q, k);
        const lmk_rows qo = {a->rope.t[0].out, a->rope.t[0].out_tok, a->rope.t[0].out_head, a->rope.dtype};
        for (size_t h = 0; h < hq; h++)
            store_copy_row(a, &qo, token, h, q + h * d, 1.0f, qbits);
        if (a->rope.t[1].out) {
            const lmk_rows ko = {a->rope.t[1].out, a->rope.t[1].out_tok, a->rope.t[1].out_head, a->rope.dtype};
            for (size_t h = 0; h < hk; h++)
                store_copy_row(a, &ko, token, h, k + h * d, 1.0f, kbits);
        }
        if (!a->slots)
            continue;
        const long long slot = slot_of(a, token);
        if (a->k_cache.data && slot >= 0 && (unsigned long long)slot < a->k_slots)
            for (size_t h = 0; h < hk; h++)
                store_copy_row(a, &a->k_cache, (size_t)slot, h, k + h * d, a->k_inv_scale, kbits);
        if (a->v_cache.data && slot >= 0 && (unsigned long long)slot < a->v_slots)
            store_v(a, token, (size_t)slot);
    }
    free(q), free(k), free(qb), free(kb);
}
