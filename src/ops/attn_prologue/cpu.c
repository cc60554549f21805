/*
 * cpu.c - the CPU path of attn_prologue: RMSNorm, rope and the KV-cache write of each token in one
 * pass over its rows.
 *
 * Threads split the tokens (those that may share a cache row with another go by their slot
 * instead: "duplicate slots" below). For a token, every head row of q and then of k is normed,
 * rotated and stored to each of its destinations: q_out; k_out and the k cache row of the token's
 * slot (quantised to f8 from the f32 result when the cache is f8); v is copied (or quantised) to
 * its cache row. Arithmetic after the loads is f32 with no rounding between norm and rope, as lmk.h
 * promises; the angle is formed in double from src/ops/rope_math.h's rules (the ones lmk_rope's
 * paths use) and m*cos / m*sin computed once per (token, pair) for all heads, rounded to f32 from
 * double.
 *
 * Rows of up to FAST_DIM elements with rope_dim/2 <= CHUNK (every real model) take the row path.
 * Rows go in groups of ROW_GROUP heads: the group's sums of squares first (so that the norm
 * factors' divides and square roots do not wait on each other), then each row, still in L1, is
 * widened, scaled by r * (w + offset) and rotated in one pass: straight into its destination when
 * it has one in the input dtype (q_out; k with only k_out or only a same-dtype cache), else into
 * an f32 buffer narrowed once per destination (k with k_out and a cache of the input dtype is built
 * into one and its bits copied to the other). The steps are written once over a vector width
 * (cpu_vec.h, on cpu/vec.h's steps, which lmk_rope's kernels use too) and instantiated for AVX2
 * and AVX-512, chosen at device open like lmk_rope's (lmk_cpu_stream_isa), with scalar ones for
 * the scalar level and LMK_CPU_PORTABLE builds. Split pairs (NEOX, MROPE, IMROPE, VISION: x[p],
 * x[p + pair_stride]) rotate a vector of a's against a vector of b's; NORMAL's adjacent pairs
 * rotate one vector of both with cos/sin duplicated into lane pairs and the pair swapped in-lane;
 * bf16 rows go two vectors' worth of elements (16 on AVX2, 32 on AVX-512) a step in even/odd order
 * instead where their pair runs and gaps are whole steps (build_eo: one load, no shuffle, norm
 * weights and split pairs' cos/sin kept in that order). A row group's sums of squares and norm
 * factors are formed four rows at a time (their chains are latency). The vector narrowing gives
 * the bits of lmk_f32_to_bf16 / lmk_f32_to_f16 (NaN included) and of lmk_f8e4m3_from_f32_bits
 * (core/f8.h) on x * inv, the f32 product with the call's inverse scale (lmk.h's f8 rule: one
 * multiply, whatever the scale). Outputs of a large call whose rows are whole, aligned cache lines
 * are written with streaming stores, and the next token's rows are prefetched while a token is
 * computed. Rows larger than FAST_DIM or with more pairs than CHUNK take an element-wise path
 * (docs/cpu.md, "attn_prologue").
 *
 * Angles: lmk_rope's own tables (src/cpu/rope_angles.h: the factors, and lmk_cpu_sincos's vector
 * polynomials while every |theta| <= LMK_CPU_SINCOS_VECTOR_MAX), so at a given level both ops give
 * a (token, pair) the same m*cos and m*sin. On the row path the token's thetas go into the row
 * buffer (free between tokens, so no stack grows); the element-wise path (no buffer), the scalar
 * level and angles beyond the bound use libm, whose cos/sin would be about a third of a token's
 * time (docs/cpu.md, "Angles: lmk_cpu_sincos").
 *
 * Memory is fixed: per-pair tables for CHUNK pairs (larger rope_dim is processed chunk by chunk)
 * and on the row path one row and a buffer of the widened norm weights (q's and k's together, or
 * refilled per token when they do not fit), 6.4 KB a share in its block of the stream's scratch
 * (ap_scratch), so that the stack of the calling thread, which runs share 0, holds only frames and
 * norm factors for CHUNK rows: lmk.h's 16 KiB bound with a margin (tests/test_small_stack.c:
 * 3-5 KB at -O2 with gcc and clang; at -O0, where every vector temporary of a function has a stack
 * slot of its own, 8 KB with gcc and 14 KB with clang on AVX-512, the vector steps being functions
 * of their own there, LMK_CPU_STEP).
 */
#include "cpu/cpu.h"
#include "cpu/rope_angles.h"
#include "cpu/vec.h"
#include "ops/attn_prologue/attn_prologue.h"

#include <math.h>

#define CHUNK 128
#define FAST_DIM 512

/* Where one head row goes: up to two destinations (q: q_out; k: k_out and its cache row). */
typedef struct row_dest {
    unsigned char *p;  /* element 0 of the row */
    lmk_dtype dt;
    float inv;         /* f8 caches: stored = lmk_f32_to_f8e4m3(x * inv), lmk.h's rule (1 elsewhere, unused) */
    int nt;            /* streaming stores (the row is whole cache lines, 64-byte aligned) */
} row_dest;

/* A head row on the element-wise path: input, norm and destinations. */
typedef struct ap_row {
    const unsigned char *in; /* element 0 of the input row */
    const void *w;           /* norm weight or NULL */
    lmk_dtype w_dt;
    float r;                 /* 1 / sqrt(mean(x^2) + eps), or 1 without a norm */
    int n_dest;
    row_dest dest[2];
} ap_row;

/* Per-thread tables of one chunk of pairs: c = m*cos, s = m*sin. CHUNK is a multiple of 8, so c
 * and s hold lmk_cpu_sincos's padded vector tail. */
typedef struct ap_table {
    _Alignas(64) float c[CHUNK];
    _Alignas(64) float s[CHUNK];
    double freq[CHUNK];
    unsigned char axis[CHUNK];
    double max_freq; /* max |freq| of the chunk */
} ap_table;

/* The row path's buffer: an f32 row while the token's rows are built, the token's angles (double)
 * while its table is filled. A union, so the two views of the memory are ordered by the compiler
 * (the angles are written through it), and the angles need no stack of their own. */
typedef union ap_buf {
    _Alignas(64) float x[FAST_DIM];
    double theta[FAST_DIM / 2];
} ap_buf;
_Static_assert(CHUNK % 8 == 0 && FAST_DIM / 2 >= CHUNK, "theta holds a chunk padded to a multiple of 8");

/* A launch: the arguments, the ISA level, and which destination tensors may stream. */
typedef struct ap_job {
    const lmk_attn_prologue_args *a;
    lmk_stream *s;                /* its pool's scratch holds each share's tables (ap_scratch) */
    lmk_cpu_isa isa;
    size_t es, k_ces;             /* bytes per element of q/k/v and of the k cache */
    bool direct_ok;               /* a vector level and pairs and gaps of whole vectors: builds
                                   * may store straight to a row's only destination (TO_DEST) */
    bool eo;                      /* bf16, direct_ok, every pair run and gap whole blocks of 16
                                   * (AVX2) or 32 (AVX-512): rows, norm weights and split pairs'
                                   * cos/sin in even/odd order (build_eo) */
    int nt_q, nt_k, nt_kc, nt_vc; /* q_out, k_out, k cache, v cache */
    const uint64_t *twice;        /* duplicate slots: buckets named by two or more tokens (dup_scan),
                                   * NULL when every cached slot's bucket has one token */
    uint64_t bucket_mask;         /* buckets - 1 */
} ap_job;

/* A share's tables and buffers, in its block of the stream's scratch (lmk_cpu_scratch), not on
 * the stack of the calling thread, which runs share 0 (lmk.h's stack bound). */
typedef struct ap_scratch {
    ap_table tb;
    _Alignas(64) float w[FAST_DIM]; /* a norm weight (plus offset) */
    ap_buf b;                        /* a row, or the token's angles */
} ap_scratch;
_Static_assert(sizeof(ap_scratch) <= LMK_CPU_SCRATCH, "a share's tables fit its scratch");

LMK_INLINE float ld(lmk_dtype dt, const void *p, size_t i)
{
    if (dt == LMK_F32)
        return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    if (dt == LMK_BF16) { /* lmk_bf16_to_f32, inline */
        const uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return lmk_f16_to_f32(h);
}

LMK_INLINE void st(const row_dest *d, size_t i, float v)
{
    switch (d->dt) {
    case LMK_F32: ((float *)(void *)d->p)[i] = v; break;
    case LMK_BF16: ((uint16_t *)(void *)d->p)[i] = lmk_cpu_bf16_of(v); break;
    case LMK_F16: ((uint16_t *)(void *)d->p)[i] = lmk_f32_to_f16(v); break;
    default: d->p[i] = lmk_f32_to_f8e4m3(v * d->inv); break;
    }
}

/* ---- per-pair tables ---- */

/* freq and axis of pairs [p0, p0 + n), and their max |freq|: lmk_rope's rule (cpu/rope_angles.h). */
static void fill_freqs(const lmk_rope_angle *g, ap_table *tb, uint32_t p0, uint32_t n)
{
    tb->max_freq = lmk_rope_cpu_freqs(g, p0, n, tb->axis, tb->freq);
}

/* m*cos and m*sin of each pair for one token: lmk_rope's tables (cpu/rope_angles.h), with the row
 * buffer b as their scratch on the row path; without one (the element-wise path), libm. */
LMK_INLINE void fill_angles(lmk_cpu_isa isa, const lmk_rope_angle *g, ap_table *tb, uint32_t n, size_t token,
                            ap_buf *b)
{
    lmk_rope_cpu_angles(isa, g, token, tb->axis, tb->freq, tb->max_freq, n, b ? b->theta : NULL, tb->c, tb->s);
}

/* ---- rows and destinations ---- */

static long long slot_of(const lmk_attn_prologue_args *a, size_t token)
{
    if (!a->slots)
        return -1;
    return a->slot_dtype == LMK_I64 ? (long long)((const int64_t *)a->slots)[token]
                                    : (long long)((const int32_t *)a->slots)[token];
}

/* Streaming stores for a destination row: its tensor qualifies (ap_job) and the row starts on a
 * cache line. */
LMK_INLINE int nt_at(int tensor_nt, const void *p)
{
    return tensor_nt && ((uintptr_t)p & 63) == 0;
}

/* Row h of the token's q rows (h < hq) then k rows: input, norm weight and destinations. */
static inline ap_row make_row(const ap_job *jb, size_t token, size_t h, long long slot)
{
    const lmk_attn_prologue_args *a = jb->a;
    const size_t es = lmk_dtype_size(a->rope.dtype), hq = a->rope.t[0].n_heads;
    const int k = h >= hq;
    const lmk_rope_tensor *t = &a->rope.t[k];
    const size_t head = k ? h - hq : h;
    ap_row r = {.in = (const unsigned char *)t->in + (token * t->in_tok + head * t->in_head) * es,
                .w = k ? a->k_norm_w : a->q_norm_w, .w_dt = k ? a->k_norm_dtype : a->q_norm_dtype, .r = 1.0f};
    if (t->out) {
        unsigned char *p = (unsigned char *)t->out + (token * t->out_tok + head * t->out_head) * es;
        r.dest[r.n_dest++] = (row_dest){p, a->rope.dtype, 1.0f, nt_at(k ? jb->nt_k : jb->nt_q, p)};
    }
    if (k && a->k_cache.data && slot >= 0 && (unsigned long long)slot < a->k_slots) {
        const size_t ces = lmk_dtype_size(a->k_cache.dtype);
        unsigned char *p = (unsigned char *)a->k_cache.data + ((size_t)slot * a->k_cache.tok + head * a->k_cache.head) * ces;
        r.dest[r.n_dest++] = (row_dest){p, a->k_cache.dtype, a->k_inv_scale, nt_at(jb->nt_kc, p)};
    }
    return r;
}

/* v head h of a token (*src) and its cache row at slot (v_slot_ok). */
static inline row_dest v_row(const ap_job *jb, size_t token, size_t h, long long slot, const unsigned char **src)
{
    const lmk_attn_prologue_args *a = jb->a;
    const size_t es = lmk_dtype_size(a->rope.dtype), ces = lmk_dtype_size(a->v_cache.dtype);
    *src = (const unsigned char *)a->v_in.data + (token * a->v_in.tok + h * a->v_in.head) * es;
    unsigned char *p = (unsigned char *)a->v_cache.data + ((size_t)slot * a->v_cache.tok + h * a->v_cache.head) * ces;
    return (row_dest){p, a->v_cache.dtype, a->v_inv_scale, nt_at(jb->nt_vc, p)};
}

static inline int v_slot_ok(const lmk_attn_prologue_args *a, long long slot)
{
    return a->v_cache.data && slot >= 0 && (unsigned long long)slot < a->v_slots;
}

/* ---- duplicate slots ----
 *
 * lmk.h: a cache row named by several tokens of one call holds the whole row of the last of them.
 * Tokens are processed in order within a share, so the last one's row stays when all tokens of a
 * slot are in one share; across shares, two threads would write the row at once (and the earlier
 * token could finish last). So before the shares start, the calling thread hashes every cached
 * slot into buckets (dup_scan: two bitmaps in the stream's shared scratch, O(T)); a token whose
 * bucket no other token hashes to has a slot of its own and is computed by the share its index
 * falls in, as always. The others (a duplicate slot, or a collision of two) are computed by the
 * share that owns their bucket (bucket % shares), in token order, after its own tokens: tokens of
 * one slot share a bucket, so one thread writes that row, the last token last. There are 32
 * buckets a token (at most 2^15); a slot's bucket is its low bits with the high ones folded in, so
 * slots below 2^15 go to slot mod buckets: the consecutive slots of a prompt never share one, nor
 * the rows of a cache with no more rows than buckets, and random rows of a larger cache rarely. */
#define DUP_MAX_BUCKETS ((size_t)1 << 15)
_Static_assert(2 * DUP_MAX_BUCKETS / 8 <= LMK_CPU_SHARED_SCRATCH, "the two bitmaps fit the shared scratch");

/* Whether the token's slot names a row of a cache of the call. */
static inline int slot_cached(const lmk_attn_prologue_args *a, long long slot)
{
    return slot >= 0 && ((a->k_cache.data && (unsigned long long)slot < a->k_slots) || v_slot_ok(a, slot));
}

static inline uint64_t slot_bucket(long long slot, uint64_t mask)
{
    const uint64_t u = (uint64_t)slot;
    return (u ^ u >> 15 ^ u >> 30 ^ u >> 45) & mask;
}

/* Marks the buckets of two or more cached slots in jb->twice (NULL when there is none). */
static void dup_scan(ap_job *jb, uint64_t *bits)
{
    const lmk_attn_prologue_args *a = jb->a;
    const size_t T = a->rope.seq_len;
    size_t n = 64;
    while (n < DUP_MAX_BUCKETS && n < 32 * T)
        n *= 2;
    uint64_t *once = bits, *twice = bits + n / 64;
    memset(bits, 0, 2 * n / 8);
    bool any = false;
    for (size_t t = 0; t < T; t++) {
        const long long slot = slot_of(a, t);
        if (!slot_cached(a, slot))
            continue;
        const uint64_t b = slot_bucket(slot, n - 1), bit = (uint64_t)1 << (b & 63);
        if (once[b >> 6] & bit)
            twice[b >> 6] |= bit, any = true;
        once[b >> 6] |= bit;
    }
    jb->twice = any ? twice : NULL;
    jb->bucket_mask = n - 1;
}

/* Which tokens a share computes: pass 0, those of its range [lo, hi) whose bucket is their own;
 * pass 1, every token of a shared bucket the share owns. */
typedef struct ap_pick {
    int pass, tid, nth;
} ap_pick;

static inline bool token_picked(const ap_job *jb, const ap_pick *pk, size_t token)
{
    const long long slot = slot_of(jb->a, token);
    if (!slot_cached(jb->a, slot))
        return pk->pass == 0;
    const uint64_t b = slot_bucket(slot, jb->bucket_mask);
    const bool shared = jb->twice[b >> 6] >> (b & 63) & 1;
    return pk->pass == 0 ? !shared : shared && b % (uint64_t)pk->nth == (uint64_t)pk->tid;
}

/* ---- the element-wise path: head_dim > FAST_DIM or rope_dim/2 > CHUNK ---- */

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

/* Rotates pairs [p0, p0 + n) of one row into its destinations. */
static void rotate(const lmk_attn_prologue_args *a, const ap_row *r, const ap_table *tb, uint32_t p0, uint32_t n)
{
    const lmk_dtype dt = a->rope.dtype;
    for (uint32_t i = 0; i < n; i++) {
        const size_t p = p0 + i;
        const size_t ia = a->rope.interleaved ? 2 * p : p, ib = a->rope.interleaved ? ia + 1 : p + a->rope.pair_stride;
        const float xa = normed(a, r, dt, ia), xb = normed(a, r, dt, ib);
        const float ya = xa * tb->c[i] - xb * tb->s[i], yb = xa * tb->s[i] + xb * tb->c[i];
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

static void store_v_scalar(const ap_job *jb, size_t token, long long slot)
{
    const lmk_attn_prologue_args *a = jb->a;
    if (!v_slot_ok(a, slot))
        return;
    const lmk_dtype dt = a->rope.dtype;
    const size_t dv = a->v_dim;
    for (size_t h = 0; h < a->rope.t[1].n_heads; h++) {
        const unsigned char *src;
        const row_dest d = v_row(jb, token, h, slot, &src);
        if (d.dt == dt) {
            memcpy(d.p, src, dv * lmk_dtype_size(dt));
            continue;
        }
        for (size_t i = 0; i < dv; i++)
            st(&d, i, ld(dt, src, i));
    }
}

/* One token: rows in groups of CHUNK (their norm factors), pairs in chunks of CHUNK (their angles). */
static void do_token(const ap_job *jb, ap_table *tb, bool freqs_cached, size_t token)
{
    const lmk_attn_prologue_args *a = jb->a;
    const uint32_t n_pairs = a->rope.angle.n_pairs;
    const size_t rows = (size_t)a->rope.t[0].n_heads + a->rope.t[1].n_heads;
    const long long slot = slot_of(a, token);
    float rf[CHUNK];
    for (size_t g0 = 0; g0 < rows; g0 += CHUNK) {
        const size_t g1 = rows - g0 < CHUNK ? rows : g0 + CHUNK;
        for (size_t h = g0; h < g1; h++) {
            const ap_row r = make_row(jb, token, h, slot);
            rf[h - g0] = r.w ? norm_factor(a, a->rope.dtype, r.in) : 1.0f;
        }
        for (uint32_t p0 = 0; p0 < n_pairs; p0 += CHUNK) {
            const uint32_t n = n_pairs - p0 < CHUNK ? n_pairs - p0 : CHUNK;
            if (!freqs_cached)
                fill_freqs(&a->rope.angle, tb, p0, n);
            fill_angles(LMK_CPU_SCALAR, &a->rope.angle, tb, n, token, NULL); /* libm: no buffer here */
            for (size_t h = g0; h < g1; h++) {
                ap_row r = make_row(jb, token, h, slot);
                r.r = rf[h - g0];
                rotate(a, &r, tb, p0, n);
            }
        }
        for (size_t h = g0; h < g1; h++) {
            ap_row r = make_row(jb, token, h, slot);
            r.r = rf[h - g0];
            if (a->rope.interleaved) {
                copy_rest(a, &r, a->rope.rope_dim, a->rope.head_dim);
            } else {
                copy_rest(a, &r, n_pairs, a->rope.pair_stride);
                copy_rest(a, &r, (size_t)a->rope.pair_stride + n_pairs, a->rope.head_dim);
            }
        }
    }
    store_v_scalar(jb, token, slot);
}

/* ---- the row path: steps ----
 *
 * Each ISA level provides the same steps (the scalar ones here, the two vector levels' from one
 * body, cpu_vec.h): the sum of squares of an input row; build, which reads the row once, scales it
 * by r * (w + offset) and rotates its pairs, storing the results either into an f32 row buffer x
 * or, when the row has one destination in the input dtype and no element must stay a bit copy,
 * narrowed straight into that destination (TO_DEST); narrow, which stores a range of x to a
 * destination; and widen (v to an f8 cache). Without a norm r and the weights are 1, so x * r * w
 * is x exactly. The per-element formulas are the same at every level; the sum of squares (double
 * on the scalar level, f32 partial sums on the vector ones) and the FMA contraction of the
 * rotation differ, within lmk.h's contract. */

static double sumsq_scalar(lmk_dtype dt, const unsigned char *in, size_t i0, size_t n)
{
    double ss = 0;
    for (size_t i = i0; i < n; i++) {
        const double v = ld(dt, in, i);
        ss += v * v;
    }
    return ss;
}

static void widen_scalar(lmk_dtype dt, const unsigned char *in, float *x, size_t i0, size_t n)
{
    for (size_t i = i0; i < n; i++)
        x[i] = ld(dt, in, i);
}

/* Pairs [p0, n): a at x[p], b at x[p + stride] (split) or x[2p], x[2p+1] (il). */
static void pairs_scalar(lmk_dtype dt, const unsigned char *in, float *x, const float *w, float r, const ap_table *tb,
                         size_t p0, size_t n, size_t stride, int il)
{
    for (size_t p = p0; p < n; p++) {
        const size_t ia = il ? 2 * p : p, ib = il ? ia + 1 : p + stride;
        const float xa = ld(dt, in, ia) * r * w[ia], xb = ld(dt, in, ib) * r * w[ib];
        x[ia] = xa * tb->c[p] - xb * tb->s[p];
        x[ib] = xa * tb->s[p] + xb * tb->c[p];
    }
}

/* Elements [lo, hi) outside the pairs: scaled only. */
static void gap_scalar(lmk_dtype dt, const unsigned char *in, float *x, const float *w, float r, size_t lo, size_t hi)
{
    for (size_t i = lo; i < hi; i++)
        x[i] = ld(dt, in, i) * r * w[i];
}

/* The elements outside the pairs of lmk.h's table: [n, stride) and [stride + n, head_dim) split,
 * [2n, head_dim) adjacent. */
LMK_INLINE void gaps_of(const lmk_rope_args *ra, size_t g[2][2])
{
    const size_t n = ra->angle.n_pairs, st = ra->pair_stride, d = ra->head_dim;
    if (ra->interleaved)
        g[0][0] = g[0][1] = 0, g[1][0] = 2 * n, g[1][1] = d;
    else
        g[0][0] = n, g[0][1] = st, g[1][0] = st + n, g[1][1] = d;
}

static void build_scalar(lmk_dtype dt, const lmk_rope_args *ra, const unsigned char *in, float *x, const float *w,
                         float r, const ap_table *tb)
{
    size_t g[2][2];
    gaps_of(ra, g);
    pairs_scalar(dt, in, x, w, r, tb, 0, ra->angle.n_pairs, ra->pair_stride, ra->interleaved);
    gap_scalar(dt, in, x, w, r, g[0][0], g[0][1]);
    gap_scalar(dt, in, x, w, r, g[1][0], g[1][1]);
}

/* Stores elements [lo, hi) of x to a destination row (x * inv, quantised, for f8). */
static void narrow_scalar(const row_dest *d, const float *x, size_t lo, size_t hi)
{
    switch (d->dt) {
    case LMK_F32:
        memcpy((float *)(void *)d->p + lo, x + lo, (hi - lo) * 4);
        break;
    case LMK_BF16: {
        uint16_t *o = (uint16_t *)(void *)d->p;
        for (size_t i = lo; i < hi; i++)
            o[i] = lmk_cpu_bf16_of(x[i]);
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
            d->p[i] = lmk_f32_to_f8e4m3(x[i] * d->inv);
        break;
    }
}

/* Where a build puts its results: the f32 row buffer, or narrowed straight into the row's only
 * destination (plain or streaming stores) when nothing else needs the row (direct_ok). */
enum { TO_X = 0, TO_DEST = 1, TO_DEST_NT = 2 };

#if LMK_CPU_X86
/* An f32 sum of squares is as good as the double one unless a square or a partial sum overflowed
 * (inf, or NaN from an inf input: the double sum is then inf or NaN as well, so nothing is lost
 * by recomputing) or the sum is below 2^-80, where squares under f32's normal range (< 2^-126,
 * at most FAST_DIM of them) could matter; all-zero rows land here too. */
LMK_INLINE bool sum_ok(double ss)
{
    return ss >= 0x1p-80 && ss < HUGE_VAL;
}

/* rf[i] = (float)(1 / sqrt(ss[i] / d + eps)), i < n, four at a time: IEEE divides and square roots
 * are correctly rounded in vector lanes as in scalar ones, so the bits of the scalar loop; a row
 * group's chains (two divides and a square root in double, ~45 cycles each) then share vector
 * units instead of queueing on the scalar divider. */
LMK_TARGET_AVX2 static void norm_factors8(const double *ss, size_t n, size_t d, double eps, float *rf)
{
    const __m256d dv = _mm256_set1_pd((double)d), ev = _mm256_set1_pd(eps), one = _mm256_set1_pd(1.0);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m256d t = _mm256_add_pd(_mm256_div_pd(_mm256_loadu_pd(ss + i), dv), ev);
        _mm_storeu_ps(rf + i, _mm256_cvtpd_ps(_mm256_div_pd(one, _mm256_sqrt_pd(t))));
    }
    for (; i < n; i++)
        rf[i] = (float)(1.0 / sqrt(ss[i] / (double)d + eps));
}

#define LMK_VEC_W 8
#include "ops/attn_prologue/cpu_vec.h"
#define LMK_VEC_W 16
#include "ops/attn_prologue/cpu_vec.h"
#endif

/* ---- the row path: each step at a level (a constant in every caller below) ---- */

/* The norm factors of n rows from their sums of squares: norm_factors8 on both vector levels. */
LMK_INLINE void norm_factors_at(lmk_cpu_isa isa, const double *ss, size_t n, size_t d, double eps, float *rf)
{
#if LMK_CPU_X86
    if (isa != LMK_CPU_SCALAR) {
        norm_factors8(ss, n, d, eps, rf);
        return;
    }
#endif
    (void)isa;
    for (size_t i = 0; i < n; i++)
        rf[i] = (float)(1.0 / sqrt(ss[i] / (double)d + eps));
}

/* The sums of squares of nr rows of n elements, row r at in + r * stride bytes. */
LMK_INLINE void sumsq_at(lmk_cpu_isa isa, lmk_dtype dt, const unsigned char *in, size_t stride, size_t nr, size_t n,
                         double *ss)
{
#if LMK_CPU_X86
    if (isa == LMK_CPU_AVX512) {
        sumsq_rows_v16(dt, in, stride, nr, n, ss);
        return;
    }
    if (isa == LMK_CPU_AVX2) {
        sumsq_rows_v8(dt, in, stride, nr, n, ss);
        return;
    }
#endif
    (void)isa;
    for (size_t r = 0; r < nr; r++)
        ss[r] = sumsq_scalar(dt, in + r * stride, 0, n);
}

/* eo: the call's bf16 rows are built in even/odd order (ap_job.eo). */
LMK_INLINE void build_at(lmk_cpu_isa isa, int to, bool eo, const lmk_rope_args *ra, const unsigned char *in, void *out,
                         const float *w, float r, const ap_table *tb)
{
#if LMK_CPU_X86
    if (isa == LMK_CPU_AVX512) {
        build_v16(ra->dtype, to, eo, ra, in, out, w, r, tb);
        return;
    }
    if (isa == LMK_CPU_AVX2) {
        build_v8(ra->dtype, to, eo, ra, in, out, w, r, tb);
        return;
    }
#endif
    (void)isa, (void)to, (void)eo; /* the scalar level always builds into x */
    build_scalar(ra->dtype, ra, in, (float *)out, w, r, tb);
}

LMK_INLINE void widen_at(lmk_cpu_isa isa, lmk_dtype dt, const unsigned char *in, float *x, size_t n)
{
#if LMK_CPU_X86
    if (isa == LMK_CPU_AVX512) {
        widen_v16(dt, in, x, n);
        return;
    }
    if (isa == LMK_CPU_AVX2) {
        widen_v8(dt, in, x, n);
        return;
    }
#endif
    (void)isa;
    widen_scalar(dt, in, x, 0, n);
}

LMK_INLINE void narrow_at(lmk_cpu_isa isa, const row_dest *d, const float *x, size_t lo, size_t hi)
{
#if LMK_CPU_X86
    if (isa == LMK_CPU_AVX512) {
        narrow_v16(d, x, lo, hi);
        return;
    }
    if (isa == LMK_CPU_AVX2) {
        narrow_v8(d, x, lo, hi);
        return;
    }
#endif
    (void)isa;
    narrow_scalar(d, x, lo, hi);
}

/* ---- the row path: rows, v and tokens ---- */

/* One row through the chain into its destinations, at least one (do_rows skips the rows that have
 * none). r: its norm factor, 1 without a norm, whose weights are then 1 too. Straight into a
 * destination when it can (TO_DEST), else through x, narrowed into each. Destinations go last to
 * first: the first may be the input itself (in place), whose bits the others still need without a
 * norm. */
LMK_INLINE void do_row(lmk_cpu_isa isa, bool direct_ok, bool eo, const lmk_rope_args *ra, const ap_table *tb,
                       const float *w, float r, bool norm, const unsigned char *in, const row_dest *dest, int n_dest, float *x)
{
    const size_t d = ra->head_dim, n = ra->angle.n_pairs, es = ra->dtype == LMK_F32 ? 4 : 2;
    const int whole_rope = ra->rope_dim == ra->head_dim; /* no element outside the pairs */
    /* Where the build goes: its only destination when it can (TO_DEST); for k to k_out and a cache
     * of the same dtype (the same bits twice), the one not streamed (its lines stay in L1), whose
     * bits are then copied into the other, which may be the input (in place: the build has read the
     * whole row by then); else x. One call site, so that gcc keeps build_v16 / build_v8 inlined. */
    int to = TO_X;
    unsigned char *out = (unsigned char *)x;
    const row_dest *copy_to = NULL;
    if (direct_ok && dest[0].dt == ra->dtype && (norm || whole_rope)) {
        if (n_dest == 1) {
            to = dest[0].nt ? TO_DEST_NT : TO_DEST;
            out = dest[0].p;
        } else if (dest[1].dt == ra->dtype && (!dest[0].nt || !dest[1].nt)) {
            const int b = dest[0].nt; /* build into the one not streamed */
            to = TO_DEST;
            out = dest[b].p;
            copy_to = &dest[1 - b];
        }
    }
    build_at(isa, to, eo, ra, in, out, w, r, tb);
    if (to != TO_X) {
        if (copy_to && copy_to->nt)
            lmk_cpu_stream_copy(copy_to->p, out, d * es);
        else if (copy_to)
            memcpy(copy_to->p, out, d * es);
        return;
    }
    for (int k = n_dest - 1; k >= 0; k--) {
        const row_dest *dst = &dest[k];
        if (norm || dst->dt != ra->dtype || whole_rope) {
            narrow_at(isa, dst, x, 0, d);
            continue;
        }
        /* no norm: the input's own bits outside the rotated pairs, then the pairs (plain stores) */
        row_dest plain = *dst;
        plain.nt = 0;
        if (dst->p != in)
            memcpy(dst->p, in, d * es);
        if (ra->interleaved) {
            narrow_at(isa, &plain, x, 0, 2 * n);
        } else {
            narrow_at(isa, &plain, x, 0, n);
            narrow_at(isa, &plain, x, ra->pair_stride, ra->pair_stride + n);
        }
    }
}

/* The same row of the next token, so that its lines arrive while this token is computed. Into L2
 * (prefetcht1), not L1: with Qwen3.5's rows (q out of q|gate; q_out, k_out and both caches
 * streamed) L1 prefetches cost more than they hide (docs/decisions.md). A token's rows stay in L2
 * until the next token reads them (about 16 KB for Qwen3.5, in an L2 of MBs). Prefetches never
 * fault, and the callers stop at the thread's last token. */
LMK_INLINE void prefetch_next_row(const unsigned char *p, size_t bytes)
{
    for (size_t l = 0; l < bytes; l += 64)
        __builtin_prefetch(p + l, 0, 2);
}

/* The token's v rows to their cache rows: byte copies (streaming when the row qualifies), or
 * quantised to f8 through x in pieces of FAST_DIM. */
LMK_INLINE void do_v(lmk_cpu_isa isa, const ap_job *jb, size_t token, long long slot, float *x, bool ahead)
{
    const lmk_attn_prologue_args *a = jb->a;
    const lmk_dtype dt = a->rope.dtype;
    const size_t dv = a->v_dim, es = lmk_dtype_size(dt);
    for (size_t h = 0; h < a->rope.t[1].n_heads; h++) {
        const unsigned char *src;
        row_dest d = v_row(jb, token, h, slot, &src);
        if (ahead)
            prefetch_next_row(src + a->v_in.tok * es, dv * es);
        if (d.dt == dt) {
            if (d.nt)
                lmk_cpu_stream_copy(d.p, src, dv * es);
            else
                memcpy(d.p, src, dv * es);
            continue;
        }
        for (size_t i0 = 0; i0 < dv; i0 += FAST_DIM) {
            const size_t n = dv - i0 < FAST_DIM ? dv - i0 : FAST_DIM;
            widen_at(isa, dt, src + i0 * es, x, n);
            narrow_at(isa, &d, x, 0, n);
            d.p += n; /* f8: a byte an element */
        }
    }
}

#define ROW_GROUP 8

LMK_INLINE void set_dest(row_dest *d, unsigned char *p, lmk_dtype dt, float inv, int tensor_nt)
{
    /* field by field: a struct copy here is read back as one vector before the stores retire */
    d->p = p, d->dt = dt, d->inv = inv, d->nt = nt_at(tensor_nt, p);
}

/* Heads [h0, h1) (at most ROW_GROUP) of one tensor of a token (q: 0, k: 1): the sums of squares
 * first, so that the norm factors (a divide, a square root and a divide in double: ~45 cycles of
 * latency each) are independent of each other, then each row through the chain while it is still
 * in L1. ahead: prefetch the next token's rows (prefetch_next_row). */
LMK_INLINE void do_rows(lmk_cpu_isa isa, const ap_job *jb, const ap_table *tb, const float *w, size_t token,
                        long long slot, int k, size_t h0, size_t h1, float *x, bool ahead)
{
    const lmk_attn_prologue_args *a = jb->a;
    const lmk_rope_args *ra = &a->rope;
    const lmk_rope_tensor *t = &ra->t[k];
    const size_t es = jb->es, d = ra->head_dim;
    const bool norm = (k ? a->k_norm_w : a->q_norm_w) != NULL;
    const unsigned char *in = (const unsigned char *)t->in + (token * t->in_tok + h0 * t->in_head) * es;
    unsigned char *out = t->out ? (unsigned char *)t->out + (token * t->out_tok + h0 * t->out_head) * es : NULL;
    const bool cache = k && a->k_cache.data && slot >= 0 && (unsigned long long)slot < a->k_slots;
    const size_t ces = jb->k_ces;
    unsigned char *crow = cache ? (unsigned char *)a->k_cache.data + ((size_t)slot * a->k_cache.tok + h0 * a->k_cache.head) * ces
                                : NULL;
    if (!out && !cache) /* k of a padding token without k_out: nowhere to go, nothing to compute */
        return;
    float rf[ROW_GROUP];
    if (norm) {
        double ss[ROW_GROUP];
        sumsq_at(isa, ra->dtype, in, t->in_head * es, h1 - h0, d, ss);
        norm_factors_at(isa, ss, h1 - h0, d, a->eps, rf);
    }
    for (size_t i = 0; i < h1 - h0; i++) {
        row_dest dest[2];
        int n_dest = 0;
        if (out)
            set_dest(&dest[n_dest++], out + i * t->out_head * es, ra->dtype, 1.0f, k ? jb->nt_k : jb->nt_q);
        if (cache)
            set_dest(&dest[n_dest++], crow + i * a->k_cache.head * ces, a->k_cache.dtype, a->k_inv_scale, jb->nt_kc);
        if (ahead)
            prefetch_next_row(in + (i * t->in_head + t->in_tok) * es, d * es);
        do_row(isa, jb->direct_ok, jb->eo, ra, tb, w, norm ? rf[i] : 1.0f, norm, in + i * t->in_head * es, dest, n_dest, x);
    }
}

/* n floats (a multiple of the level's block where jb->eo) into even/odd order when the call's rows
 * are built in it. */
LMK_INLINE void to_eo_at(lmk_cpu_isa isa, const ap_job *jb, float *t, size_t n)
{
#if LMK_CPU_X86
    if (isa == LMK_CPU_AVX512 && jb->eo)
        eo_order_v16(t, n);
    if (isa == LMK_CPU_AVX2 && jb->eo)
        eo_order_v8(t, n);
#endif
    (void)isa, (void)jb, (void)t, (void)n;
}

/* The norm weight of q (k = 0) or k, plus the offset, into w (1 without a norm). do_tokens widens
 * both once per share when they fit w together (head_dim <= FAST_DIM / 2: every real model), else
 * again for each token (q and k alternate), which keeps a second FAST_DIM buffer off the stack. */
LMK_INLINE void load_weights(lmk_cpu_isa isa, const ap_job *jb, int k, float *w)
{
    const lmk_attn_prologue_args *a = jb->a;
    const void *src = k ? a->k_norm_w : a->q_norm_w;
    const size_t d = a->rope.head_dim;
    if (!src) {
        for (size_t i = 0; i < d; i++)
            w[i] = 1.0f;
        return;
    }
    widen_at(isa, k ? a->k_norm_dtype : a->q_norm_dtype, src, w, d);
    const float off = (float)a->weight_offset;
    for (size_t i = 0; i < d; i++) /* even + 0: -0 + 0 is +0, as in the reference's w + offset */
        w[i] += off;
    to_eo_at(isa, jb, w, d);
}

LMK_INLINE void do_tokens(lmk_cpu_isa isa, const ap_job *jb, const ap_pick *pk, ap_table *tb, float *w, ap_buf *b,
                          size_t lo, size_t hi)
{
    const lmk_attn_prologue_args *a = jb->a;
    const size_t d = a->rope.head_dim;
    const bool both = 2 * d <= FAST_DIM; /* q's and k's weights fit w together: widened once */
    float *x = b->x;
    if (both) {
        load_weights(isa, jb, 0, w);
        load_weights(isa, jb, 1, w + d);
    }
    for (size_t token = lo; token < hi; token++) {
        if (jb->twice && !token_picked(jb, pk, token))
            continue;
        const long long slot = slot_of(a, token);
        fill_angles(isa, &a->rope.angle, tb, a->rope.angle.n_pairs, token, b);
        if (!a->rope.interleaved) { /* split pairs meet cos/sin lane by lane: their order too */
            to_eo_at(isa, jb, tb->c, a->rope.angle.n_pairs);
            to_eo_at(isa, jb, tb->s, a->rope.angle.n_pairs);
        }
        for (int k = 0; k < 2; k++) {
            if (!both)
                load_weights(isa, jb, k, w);
            const float *wk = both && k ? w + d : w;
            for (size_t h0 = 0; h0 < a->rope.t[k].n_heads; h0 += ROW_GROUP) {
                const size_t h1 = a->rope.t[k].n_heads - h0 < ROW_GROUP ? a->rope.t[k].n_heads : h0 + ROW_GROUP;
                do_rows(isa, jb, tb, wk, token, slot, k, h0, h1, x, token + 1 < hi);
            }
        }
        if (v_slot_ok(a, slot))
            do_v(isa, jb, token, slot, x, token + 1 < hi);
    }
}

/* Each level's token loop, the level a constant so that every step call is direct. */
static void tokens_scalar(const ap_job *jb, const ap_pick *pk, ap_scratch *sc, size_t lo, size_t hi)
{
    do_tokens(LMK_CPU_SCALAR, jb, pk, &sc->tb, sc->w, &sc->b, lo, hi);
}

#if LMK_CPU_X86
LMK_TARGET_AVX512 static void tokens_avx512(const ap_job *jb, const ap_pick *pk, ap_scratch *sc, size_t lo, size_t hi)
{
    do_tokens(LMK_CPU_AVX512, jb, pk, &sc->tb, sc->w, &sc->b, lo, hi);
}

LMK_TARGET_AVX2 static void tokens_avx2(const ap_job *jb, const ap_pick *pk, ap_scratch *sc, size_t lo, size_t hi)
{
    do_tokens(LMK_CPU_AVX2, jb, pk, &sc->tb, sc->w, &sc->b, lo, hi);
}
#endif

/* ---- launch ---- */

/* Tokens [lo, hi) on the picked ones (every one without duplicate slots). */
static void run_tokens(const ap_job *jb, const ap_pick *pk, ap_scratch *sc, size_t lo, size_t hi)
{
    const lmk_attn_prologue_args *a = jb->a;
    if (a->rope.angle.n_pairs > CHUNK || a->rope.head_dim > FAST_DIM) {
        for (size_t token = lo; token < hi; token++)
            if (!jb->twice || token_picked(jb, pk, token))
                do_token(jb, &sc->tb, a->rope.angle.n_pairs <= CHUNK, token);
        return;
    }
#if LMK_CPU_X86
    if (jb->isa == LMK_CPU_AVX512)
        tokens_avx512(jb, pk, sc, lo, hi);
    else if (jb->isa == LMK_CPU_AVX2)
        tokens_avx2(jb, pk, sc, lo, hi);
    else
#endif
        tokens_scalar(jb, pk, sc, lo, hi);
}

static void prologue_task(void *ctx, int tid, int n_threads)
{
    const ap_job *jb = ctx;
    const lmk_attn_prologue_args *a = jb->a;
    size_t lo, hi;
    lmk_cpu_share(a->rope.seq_len, tid, n_threads, 1, &lo, &hi);
    if (lo >= hi && !jb->twice)
        return;
    ap_scratch *sc = lmk_cpu_scratch(jb->s, tid);
    if (a->rope.angle.n_pairs <= CHUNK)
        fill_freqs(&a->rope.angle, &sc->tb, 0, a->rope.angle.n_pairs);
    const ap_pick own = {0, tid, n_threads}, shared = {1, tid, n_threads};
    run_tokens(jb, &own, sc, lo, hi);
    if (jb->twice)
        run_tokens(jb, &shared, sc, 0, a->rope.seq_len);
    if (jb->nt_q || jb->nt_k || jb->nt_kc || jb->nt_vc)
        lmk_cpu_stream_fence();
}

/* Streaming stores for a destination tensor: a vector level, a large op, an output that is not
 * its own input (in place the lines are already cached), and rows of whole cache lines; each row
 * must also start on a line (nt_at). */
static int tensor_nt(const ap_job *jb, size_t out_bytes, bool present, bool in_place, size_t row_bytes)
{
    return jb->isa != LMK_CPU_SCALAR && present && !in_place && out_bytes >= LMK_CPU_STREAM_MIN_BYTES &&
           row_bytes % 64 == 0;
}

lmk_status lmk_cpu_attn_prologue(lmk_stream *s, const void *args)
{
    const lmk_attn_prologue_args *a = args;
    const size_t es = lmk_dtype_size(a->rope.dtype), T = a->rope.seq_len, d = a->rope.head_dim;
    const size_t hq = a->rope.t[0].n_heads, hk = a->rope.t[1].n_heads, dv = a->v_dim;
    const size_t kces = a->k_cache.data ? lmk_dtype_size(a->k_cache.dtype) : 0;
    const size_t vces = a->v_cache.data ? lmk_dtype_size(a->v_cache.dtype) : 0;
    const size_t out_bytes = T * (hq * d * es + (a->rope.t[1].out ? hk * d * es : 0) + hk * d * kces + hk * dv * vces);
    ap_job jb = {.a = a, .s = s, .isa = lmk_cpu_stream_isa(s), .es = es, .k_ces = kces};
    if (a->rope.angle.n_pairs <= CHUNK && d <= FAST_DIM) { /* the row path */
        const size_t n = a->rope.angle.n_pairs, st = a->rope.pair_stride;
        jb.direct_ok = jb.isa != LMK_CPU_SCALAR && d % 16 == 0 &&
                       (a->rope.interleaved ? n % 8 == 0 : n % 16 == 0 && st % 16 == 0);
        const size_t blk = jb.isa == LMK_CPU_AVX512 ? 32 : 16; /* elements of an even/odd block */
        jb.eo = jb.direct_ok && a->rope.dtype == LMK_BF16 && d % blk == 0 &&
                (a->rope.interleaved ? 2 * n % blk == 0 : n % blk == 0 && st % blk == 0);
        jb.nt_q = tensor_nt(&jb, out_bytes, true, a->rope.t[0].out == a->rope.t[0].in, d * es);
        jb.nt_k = tensor_nt(&jb, out_bytes, a->rope.t[1].out != NULL, a->rope.t[1].out == a->rope.t[1].in, d * es);
        jb.nt_kc = tensor_nt(&jb, out_bytes, a->k_cache.data != NULL, false, d * kces);
        jb.nt_vc = tensor_nt(&jb, out_bytes, a->v_cache.data != NULL, false, dv * vces);
    }
    const size_t bytes = T * (2 * (hq + hk) * d + 2 * hk * dv) * es;
    /* One share processes its tokens in order: duplicate slots need the scan only across shares. */
    if (T > 1 && (a->k_cache.data || a->v_cache.data) && lmk_cpu_parallel_threads(s, bytes) > 1)
        dup_scan(&jb, lmk_cpu_shared_scratch(s));
    lmk_cpu_parallel(s, bytes, prologue_task, &jb);
    return LMK_OK;
}
