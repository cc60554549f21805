/*
 * cpu.c - the CPU path of attn_prologue: RMSNorm, rope and the KV-cache write of each token in one
 * pass over its rows.
 *
 * Threads split the tokens. For a token, every head row of q and then of k is read once for its
 * sum of squares (accumulated in double) and once more, while still in L1, to be normed, rotated
 * and stored to each of its destinations: q_out; k_out and the k cache row of the token's slot
 * (quantised to f8 from the f32 result when the cache is f8); v is copied (or quantised) to its
 * cache row. All arithmetic after the loads is f32 with no rounding between norm and rope, as
 * lmk.h promises; the angle is formed in double from rope_common.h's rules (the ones lmk_rope's
 * paths use), and its cos/sin computed once per (token, pair) for all heads.
 *
 * Rows of up to FAST_DIM elements with rope_dim/2 <= CHUNK (every real model) take the row path at
 * the end of this file; others an element-wise path. Stack use is fixed: per-pair tables for CHUNK
 * pairs (larger rope_dim is processed chunk by chunk), norm factors for CHUNK rows at a time, and
 * on the row path one row and the two widened norm weights (about 9 KB in all, inside lmk.h's
 * 16 KiB bound).
 */
#include "cpu/cpu.h"
#include "ops/attn_prologue/attn_prologue.h"
#include "ops/rope/rope_common.h"

#include <math.h>

#define CHUNK 128

/* Where one head row goes: up to two destinations (q: q_out; k: k_out and its cache row). */
typedef struct row_dest {
    unsigned char *p;  /* element 0 of the row */
    lmk_dtype dt;
    float scale;       /* f8 caches: stored = lmk_f32_to_f8e4m3(x / scale), lmk.h's formula */
} row_dest;

typedef struct ap_row {
    const unsigned char *in; /* element 0 of the input row */
    const void *w;           /* norm weight or NULL */
    lmk_dtype w_dt;
    float r;                 /* 1 / sqrt(mean(x^2) + eps), or 1 without a norm */
    int n_dest;
    row_dest dest[2];
} ap_row;

/* Per-thread tables of one chunk of pairs. */
typedef struct ap_table {
    double freq[CHUNK];
    unsigned char axis[CHUNK];
    float c[CHUNK], s[CHUNK];
} ap_table;

LMK_INLINE float ld(lmk_dtype dt, const void *p, size_t i)
{
    if (dt == LMK_F32)
        return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    return dt == LMK_BF16 ? lmk_bf16_to_f32(h) : lmk_f16_to_f32(h);
}

LMK_INLINE void st(const row_dest *d, size_t i, float v)
{
    switch (d->dt) {
    case LMK_F32: ((float *)(void *)d->p)[i] = v; break;
    case LMK_BF16: ((uint16_t *)(void *)d->p)[i] = lmk_f32_to_bf16(v); break;
    case LMK_F16: ((uint16_t *)(void *)d->p)[i] = lmk_f32_to_f16(v); break;
    default: d->p[i] = lmk_f32_to_f8e4m3(v / d->scale); break;
    }
}

/* The element i of a row as the norm leaves it (the raw value without a norm). */
LMK_INLINE float normed(const lmk_attn_prologue_args *a, const ap_row *r, lmk_dtype dt, size_t i)
{
    const float x = ld(dt, r->in, i);
    return r->w ? x * r->r * (ld(r->w_dt, r->w, i) + (float)a->weight_offset) : x;
}

static float norm_factor(const lmk_attn_prologue_args *a, lmk_dtype dt, const unsigned char *in)
{
    double ss = 0;
    for (size_t i = 0; i < a->rope.head_dim; i++) {
        const double x = ld(dt, in, i);
        ss += x * x;
    }
    return (float)(1.0 / sqrt(ss / (double)a->rope.head_dim + a->eps));
}

/* freq and axis of pairs [p0, p0 + n). */
static void fill_freqs(const lmk_rope_angle *g, ap_table *tb, uint32_t p0, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t j;
        const uint32_t p = p0 + i;
        tb->axis[i] = (unsigned char)lmk_rope_axis_j((int)g->mode, g->sections, p, &j);
        const double ff = g->freq_factors ? (double)g->freq_factors[p] : 1.0;
        tb->freq[i] = lmk_rope_freq(g->freq_base, g->exp_n, g->freq_scale, g->ext_factor, g->ramp_low, g->ramp_high,
                                    p, j, ff);
    }
}

static void fill_angles(const lmk_rope_angle *g, ap_table *tb, uint32_t n, size_t token)
{
    for (uint32_t i = 0; i < n; i++) {
        const double pos = lmk_rope_pos(g->positions, (int)g->pos_dtype, (uint64_t)tb->axis[i] * g->pos_axis_stride + token);
        const double theta = pos * tb->freq[i];
        tb->c[i] = (float)cos(theta);
        tb->s[i] = (float)sin(theta);
    }
}

/* Rotates pairs [p0, p0 + n) of one row into its destinations. */
static void rotate(const lmk_attn_prologue_args *a, const ap_row *r, const ap_table *tb, uint32_t p0, uint32_t n)
{
    const lmk_dtype dt = a->rope.dtype;
    const float m = (float)a->rope.angle.mscale;
    for (uint32_t i = 0; i < n; i++) {
        const size_t p = p0 + i;
        const size_t ia = a->rope.interleaved ? 2 * p : p, ib = a->rope.interleaved ? ia + 1 : p + a->rope.pair_stride;
        const float xa = normed(a, r, dt, ia), xb = normed(a, r, dt, ib);
        const float ya = (xa * tb->c[i] - xb * tb->s[i]) * m, yb = (xa * tb->s[i] + xb * tb->c[i]) * m;
        for (int d = 0; d < r->n_dest; d++) {
            st(&r->dest[d], ia, ya);
            st(&r->dest[d], ib, yb);
        }
    }
}

/* The elements outside the rotated pairs: normed values, or bit copies without a norm. With a
 * norm each value is computed once and stored to every destination before the next is read, since
 * the first destination may be the input itself (in place). */
static void copy_rest(const lmk_attn_prologue_args *a, const ap_row *r, size_t lo, size_t hi)
{
    const lmk_dtype dt = a->rope.dtype;
    const size_t es = lmk_dtype_size(dt);
    if (r->w) {
        for (size_t i = lo; i < hi; i++) {
            const float v = normed(a, r, dt, i);
            for (int d = 0; d < r->n_dest; d++)
                st(&r->dest[d], i, v);
        }
        return;
    }
    for (int d = 0; d < r->n_dest; d++) {
        const row_dest *dst = &r->dest[d];
        if (dst->dt != dt) {
            for (size_t i = lo; i < hi; i++)
                st(dst, i, ld(dt, r->in, i));
        } else if (dst->p != r->in) { /* in place: already there */
            memcpy(dst->p + lo * es, r->in + lo * es, (hi - lo) * es);
        }
    }
}

static long long slot_of(const lmk_attn_prologue_args *a, size_t token)
{
    if (!a->slots)
        return -1;
    return a->slot_dtype == LMK_I64 ? (long long)((const int64_t *)a->slots)[token]
                                    : (long long)((const int32_t *)a->slots)[token];
}

/* Row h of the token's q rows (h < hq) then k rows: input, norm weight and destinations. */
static ap_row make_row(const lmk_attn_prologue_args *a, size_t token, size_t h, long long slot)
{
    const size_t es = lmk_dtype_size(a->rope.dtype), hq = a->rope.t[0].n_heads;
    const int k = h >= hq;
    const lmk_rope_tensor *t = &a->rope.t[k];
    const size_t head = k ? h - hq : h;
    ap_row r = {.in = (const unsigned char *)t->in + (token * t->in_tok + head * t->in_head) * es,
                .w = k ? a->k_norm_w : a->q_norm_w, .w_dt = k ? a->k_norm_dtype : a->q_norm_dtype, .r = 1.0f};
    if (t->out)
        r.dest[r.n_dest++] = (row_dest){(unsigned char *)t->out + (token * t->out_tok + head * t->out_head) * es,
                                        a->rope.dtype, 1.0f};
    if (k && a->k_cache.data && slot >= 0 && (unsigned long long)slot < a->k_slots) {
        const size_t ces = lmk_dtype_size(a->k_cache.dtype);
        r.dest[r.n_dest++] = (row_dest){(unsigned char *)a->k_cache.data +
                                            ((size_t)slot * a->k_cache.tok + head * a->k_cache.head) * ces,
                                        a->k_cache.dtype, a->k_scale};
    }
    return r;
}

static void store_v(const lmk_attn_prologue_args *a, size_t token, long long slot)
{
    if (!a->v_cache.data || slot < 0 || (unsigned long long)slot >= a->v_slots)
        return;
    const lmk_dtype dt = a->rope.dtype;
    const size_t es = lmk_dtype_size(dt), ces = lmk_dtype_size(a->v_cache.dtype), dv = a->v_dim;
    for (size_t h = 0; h < a->rope.t[1].n_heads; h++) {
        const unsigned char *src = (const unsigned char *)a->v_in.data + (token * a->v_in.tok + h * a->v_in.head) * es;
        const row_dest d = {(unsigned char *)a->v_cache.data + ((size_t)slot * a->v_cache.tok + h * a->v_cache.head) * ces,
                            a->v_cache.dtype, a->v_scale};
        if (d.dt == dt) {
            memcpy(d.p, src, dv * es);
            continue;
        }
        for (size_t i = 0; i < dv; i++)
            st(&d, i, ld(dt, src, i));
    }
}

/* One token: rows in groups of CHUNK (their norm factors), pairs in chunks of CHUNK (their angles). */
static void do_token(const lmk_attn_prologue_args *a, ap_table *tb, bool freqs_cached, size_t token)
{
    const uint32_t n_pairs = a->rope.angle.n_pairs;
    const size_t rows = (size_t)a->rope.t[0].n_heads + a->rope.t[1].n_heads;
    const long long slot = slot_of(a, token);
    float rf[CHUNK];
    for (size_t g0 = 0; g0 < rows; g0 += CHUNK) {
        const size_t g1 = rows - g0 < CHUNK ? rows : g0 + CHUNK;
        for (size_t h = g0; h < g1; h++) {
            const ap_row r = make_row(a, token, h, slot);
            rf[h - g0] = r.w ? norm_factor(a, a->rope.dtype, r.in) : 1.0f;
        }
        for (uint32_t p0 = 0; p0 < n_pairs; p0 += CHUNK) {
            const uint32_t n = n_pairs - p0 < CHUNK ? n_pairs - p0 : CHUNK;
            if (!freqs_cached)
                fill_freqs(&a->rope.angle, tb, p0, n);
            fill_angles(&a->rope.angle, tb, n, token);
            for (size_t h = g0; h < g1; h++) {
                ap_row r = make_row(a, token, h, slot);
                r.r = rf[h - g0];
                rotate(a, &r, tb, p0, n);
            }
        }
        for (size_t h = g0; h < g1; h++) {
            ap_row r = make_row(a, token, h, slot);
            r.r = rf[h - g0];
            if (a->rope.interleaved) {
                copy_rest(a, &r, a->rope.rope_dim, a->rope.head_dim);
            } else {
                copy_rest(a, &r, n_pairs, a->rope.pair_stride);
                copy_rest(a, &r, (size_t)a->rope.pair_stride + n_pairs, a->rope.head_dim);
            }
        }
    }
    store_v(a, token, slot);
}

/* ---- the row path: rows of up to FAST_DIM elements with one chunk of pairs (every real model) ----
 *
 * A row is widened into a float buffer once, normed and rotated there with plain loops the
 * compiler vectorises, and narrowed once per destination with inline conversions; the norm
 * weights are widened (plus the offset) once per thread. The element-wise path above remains for
 * head_dim > FAST_DIM or rope_dim/2 > CHUNK. */

#define FAST_DIM 512

typedef struct ap_weights {
    float q[FAST_DIM], k[FAST_DIM]; /* w + weight_offset */
} ap_weights;

static void widen_row(lmk_dtype dt, const unsigned char *in, float *x, size_t n)
{
    if (dt == LMK_F32) {
        memcpy(x, in, n * 4);
    } else if (dt == LMK_BF16) {
        const uint16_t *h = (const uint16_t *)(const void *)in;
        for (size_t i = 0; i < n; i++) {
            const uint32_t u = (uint32_t)h[i] << 16;
            memcpy(&x[i], &u, 4);
        }
    } else {
        const uint16_t *h = (const uint16_t *)(const void *)in;
        for (size_t i = 0; i < n; i++)
            x[i] = lmk_f16_to_f32(h[i]);
    }
}

/* lmk_f32_to_bf16, inline: nearest even, NaN kept quiet with its sign. */
LMK_INLINE uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Stores elements [lo, hi) of x to a destination row (x / scale, quantised, for f8). */
static void narrow_row(const row_dest *d, const float *x, size_t lo, size_t hi)
{
    switch (d->dt) {
    case LMK_F32:
        memcpy((float *)(void *)d->p + lo, x + lo, (hi - lo) * 4);
        break;
    case LMK_BF16: {
        uint16_t *o = (uint16_t *)(void *)d->p;
        for (size_t i = lo; i < hi; i++)
            o[i] = to_bf16(x[i]);
        break;
    }
    case LMK_F16: {
        uint16_t *o = (uint16_t *)(void *)d->p;
        for (size_t i = lo; i < hi; i++)
            o[i] = lmk_f32_to_f16(x[i]);
        break;
    }
    default:
        for (size_t i = lo; i < hi; i++)
            d->p[i] = lmk_f32_to_f8e4m3(x[i] / d->scale);
        break;
    }
}

/* The rotated elements of a row (a pair at a time): the element indices of pair p. */
LMK_INLINE void pair_of(const lmk_rope_args *r, size_t p, size_t *ia, size_t *ib)
{
    *ia = r->interleaved ? 2 * p : p;
    *ib = r->interleaved ? *ia + 1 : p + r->pair_stride;
}

/* One row through the whole chain into its destinations. */
static void do_row_fast(const lmk_attn_prologue_args *a, const ap_table *tb, const float *w, const ap_row *r)
{
    const lmk_rope_args *ra = &a->rope;
    const size_t d = ra->head_dim, n = ra->angle.n_pairs, es = lmk_dtype_size(ra->dtype);
    const float m = (float)ra->angle.mscale;
    float x[FAST_DIM];
    widen_row(ra->dtype, r->in, x, d);
    if (r->w) {
        double ss = 0;
        for (size_t i = 0; i < d; i++)
            ss += (double)x[i] * x[i];
        const float rr = (float)(1.0 / sqrt(ss / (double)d + a->eps));
        for (size_t i = 0; i < d; i++)
            x[i] = x[i] * rr * w[i];
    }
    for (size_t p = 0; p < n; p++) {
        size_t ia, ib;
        pair_of(ra, p, &ia, &ib);
        const float xa = x[ia], xb = x[ib];
        x[ia] = (xa * tb->c[p] - xb * tb->s[p]) * m;
        x[ib] = (xa * tb->s[p] + xb * tb->c[p]) * m;
    }
    /* Destinations last to first: the first may be the input itself (in place), whose bits the
     * others still need when there is no norm. */
    for (int k = r->n_dest - 1; k >= 0; k--) {
        const row_dest *dst = &r->dest[k];
        if (r->w || dst->dt != ra->dtype) {
            narrow_row(dst, x, 0, d);
            continue;
        }
        if (dst->p != r->in) /* no norm: the input's own bits outside the rotated pairs */
            memcpy(dst->p, r->in, d * es);
        for (size_t p = 0; p < n; p++) {
            size_t ia, ib;
            pair_of(ra, p, &ia, &ib);
            narrow_row(dst, x, ia, ia + 1);
            narrow_row(dst, x, ib, ib + 1);
        }
    }
}

static void widen_weights(const lmk_attn_prologue_args *a, ap_weights *w)
{
    const float off = (float)a->weight_offset;
    for (size_t i = 0; i < a->rope.head_dim; i++) {
        w->q[i] = a->q_norm_w ? ld(a->q_norm_dtype, a->q_norm_w, i) + off : 1.0f;
        w->k[i] = a->k_norm_w ? ld(a->k_norm_dtype, a->k_norm_w, i) + off : 1.0f;
    }
}

static void do_token_fast(const lmk_attn_prologue_args *a, ap_table *tb, const ap_weights *w, size_t token)
{
    const size_t hq = a->rope.t[0].n_heads, rows = hq + a->rope.t[1].n_heads;
    const long long slot = slot_of(a, token);
    fill_angles(&a->rope.angle, tb, a->rope.angle.n_pairs, token);
    for (size_t h = 0; h < rows; h++) {
        const ap_row r = make_row(a, token, h, slot);
        do_row_fast(a, tb, h < hq ? w->q : w->k, &r);
    }
    store_v(a, token, slot);
}

static void prologue_task(void *ctx, int tid, int n_threads)
{
    const lmk_attn_prologue_args *a = ctx;
    size_t lo, hi;
    lmk_cpu_share(a->rope.seq_len, tid, n_threads, 1, &lo, &hi);
    if (lo >= hi)
        return;
    ap_table tb;
    const bool one_chunk = a->rope.angle.n_pairs <= CHUNK;
    if (one_chunk)
        fill_freqs(&a->rope.angle, &tb, 0, a->rope.angle.n_pairs);
    if (one_chunk && a->rope.head_dim <= FAST_DIM) {
        ap_weights w;
        widen_weights(a, &w);
        for (size_t token = lo; token < hi; token++)
            do_token_fast(a, &tb, &w, token);
        return;
    }
    for (size_t token = lo; token < hi; token++)
        do_token(a, &tb, one_chunk, token);
}

lmk_status lmk_cpu_attn_prologue(lmk_stream *s, const void *args)
{
    const lmk_attn_prologue_args *a = args;
    const size_t es = lmk_dtype_size(a->rope.dtype);
    const size_t rows = (size_t)a->rope.t[0].n_heads + a->rope.t[1].n_heads;
    const size_t bytes = a->rope.seq_len * (2 * rows * a->rope.head_dim + 2 * a->rope.t[1].n_heads * (size_t)a->v_dim) * es;
    lmk_cpu_parallel(s, bytes, prologue_task, (void *)a);
    return LMK_OK;
}
