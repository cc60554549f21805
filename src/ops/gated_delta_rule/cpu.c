/*
 * cpu.c - the CPU path of gated_delta_rule: lmk.h's token-by-token form (gates, L2 norm, the
 * delta-rule recurrence and the gated output norm) for every layout, dtype and sequence map, and
 * the driver of the chunked form that long sequences run (below; its kernels: cpu_chunk.c).
 *
 * Threads. lmk_cpu_share splits the value heads; a thread runs its heads through every sequence
 * of the call, sequences in order. Each (sequence, head) pair is computed by one thread from the
 * inputs alone, so the bits do not depend on the thread count; and all sequences naming one state
 * row (of a head) are processed by one thread in order, so each reads the row as it was before
 * the call: only the last of them writes it (lmk_seq_stores), after the others have read it.
 * lmk_cpu_parallel is given the bytes the call moves, so small calls stay on the calling thread.
 *
 * The recurrence per token on a block of columns j of the [dk, dv] state S (columns are
 * independent but for the output norm, which needs the whole o row):
 *     kv = S^T kn                    for the block's first token (later ones: the previous pass)
 *     u  = beta * (v - decay * kv)   decay = exp(g), taken out of the sum
 *     one pass over the rows i:  S = decay * S + kn u^T;  o = S^T qn;  kv' = S^T kn'
 * with kn' the next token's kn: a token costs one pass, 4 FMA-unit ops per element (7 flops).
 * decay * S is rounded, then kn u^T added with one rounding (an FMA), as the formulas order it;
 * the state is f32 throughout and nothing is rounded between tokens. Sums over i run in at
 * least two chains (even and odd rows, the two vectors of a row, or lanes along dk) to cover the
 * FMA latency.
 *
 * Where the state lives:
 *  - a sequence of one token (decode): two passes over its row in memory order, which the hardware
 *    prefetchers follow (decode is memory-bound): kv = S0^T kn, then S1 = decay S0 + kn u^T with
 *    o, S1 written once, rounded to the pool's dtype, when the sequence stores. Any dtype and
 *    layout (vector paths for dv- and dk-contiguous rows); S0 is zero without a row. While a
 *    dv-contiguous row's second pass runs, the next head's row is prefetched into L2.
 *  - an f32 row that this sequence stores, dv or dk contiguous (prefill with the models' f32 pool,
 *    in Hugging Face's or ggml's layout): the row itself is the working state, updated in place.
 *    Chunks of up to `cap` tokens: their gates, qn and kn computed once per token into the work
 *    area; for each block of 16 columns the chunk's tokens run on the row's elements; the chunk's
 *    o rows, kept there in f32, are then normed and rounded once to out. A head's state (64 KB at
 *    dk = dv = 128) stays in L2. dv contiguous: a block is one 64-byte line of each row, and token
 *    t walks the rows backwards when t is even within its chunk, so each pass starts on the lines
 *    the previous one touched last: they are in L1, though the whole block is not (lines a row
 *    stride apart share few cache sets). dk contiguous: a block is 16 contiguous columns (8 KB at
 *    dk = 128, in L1), run two columns at a time, vectors along dk, with horizontal sums.
 *  - any other row (bf16 pool, no row, a row a later sequence stores, neither axis contiguous):
 *    the state cannot persist in the row between chunks and a whole f32 state (64 KB) is beyond
 *    the stack, so a tile [dk][W] of W = 8 columns on the stack holds one block. A sequence of at
 *    most `cap` tokens is one chunk (each block loaded, run, stored). Longer ones run block-major:
 *    a block is loaded once and meets all the sequence's tokens (gates and norms recomputed per
 *    block), then stored. Without z a block's o goes straight to out; with z and an f32 out, o is
 *    written unnormalised and the rows normed after the last block; with z and a 16-bit out, which
 *    cannot hold f32 o, the recurrence runs twice: the first sweep adds each token's sum of o^2
 *    into the first four bytes of its out row, the second writes the normed rows (blocks last to
 *    first, so the one holding those bytes is written last). One block (dv <= W) needs none of
 *    this. Re-reading q and k per block makes this order several times slower than in place; an
 *    f32 scratch of dk x dv per thread, owned by the stream, would let these run in place too.
 * The next chunk's q, k and (the touched columns of) v, z and out rows are prefetched: a head's
 * rows are a short run every token stride, which the hardware prefetchers do not follow.
 *
 * Gates per (token, head) in f32 with libm: g = -exp(A_log) * softplus(a + dt_bias), softplus(x)
 * = max(x, 0) + log1p(exp(-|x|)) (no overflow), decay = exp(g), beta = 1 / (1 + exp(-b)). q and k
 * rows are widened, their sums of squares taken in f32 lanes and scaled by scale / sqrt(sum +
 * 1e-6) formed in double. The output norm is o * r * (w + offset) * silu(z) in f32 with r = 1 /
 * sqrt(mean(o^2) + eps) formed in double, rounded once to out's dtype (bf16 as lmk_f32_to_bf16
 * through cpu/bf16_simd.h, f16 by F16C with the bits of lmk_f32_to_f16).
 *
 * Levels: AVX2 kernels (FMA, F16C) at the AVX2 and AVX-512 levels, where the in-place block of 16
 * dv-contiguous columns is one 512-bit vector a row (half the FMA-unit ops). The silu of the
 * output norm uses a vector exp (Cephes' polynomial, within 2 ulp of expf). The scalar level
 * (LMK_CPU_ISA=scalar, non-x86 builds) runs the same orders in plain C with libm and no FMA, as do
 * blocks of other widths (dv % 8 at the end; tiles narrower than 8 when dk is so large that 8
 * columns and a token's vectors would not fit the work area; neither axis contiguous).
 *
 * Sequences of at least CHUNK_MIN tokens run the chunked form instead (cpu_chunk.h, cpu_chunk.c;
 * docs/cpu.md "gated_delta_rule, chunked"): the same threads and order, the state in an f32 copy
 * in the scratch from the sequence's start to its end (widened, then rounded once when it stores),
 * chunks of CHUNK_TOKENS tokens whose gates, qn, kn and v rows this file prepares and whose o rows
 * it norms; a chunk whose gates could make the UT solve unstable runs token by token on the copy.
 * LMK_GDN_CHUNK=0 in the environment (read per call) keeps every sequence on the token form.
 *
 * Memory: one work area of WORK_FLOATS floats (7 KB) per share holds the tile and the chunk, in the
 * share's block of the stream's scratch (lmk_cpu_scratch), not on the calling thread's stack, and
 * the chunked form's arrays follow it there;
 * vector helpers are separate functions at -O0 (LMK_CPU_STEP), so no frame holds their temporaries
 * many times over.
 */
#include "cpu/bf16_simd.h"
#include "cpu/cpu.h"
#include "cpu/vec.h"
#include "ops/gated_delta_rule/cpu_chunk.h"
#include "ops/gated_delta_rule/gated_delta_rule.h"
#include "ops/varlen.h"

#include <math.h>
#include <stdlib.h>

enum {
    WORK_FLOATS = 1792, /* the tile and a chunk's qn, kn and o rows: 7 KB */
    BLOCK_COLS = 8,     /* columns of a tile */
    MAX_COLS = 16,      /* columns of a block in place */
    MAX_CHUNK = 32,     /* tokens of a chunk at most */
    CHUNK_TOKENS = 32,  /* tokens of a chunk of the chunked form, when its arrays fit */
    CHUNK_MIN = 16,     /* sequences of at least this many tokens run chunked (docs/cpu.md) */
    CHUNK_HEADS = 4     /* heads a sequence's chunks go through together, states in place */
};

/* What block-major does with a block's o rows (see the header): finish them (one block), write them
 * to out (no z), write them unnormalised (f32 out), add their sums of squares, or norm them. */
typedef enum o_mode { O_FULL, O_DIRECT, O_RAW, O_SUMSQ, O_NORMED } o_mode;

/* One (sequence, value head) pass: what it reads and where it works. */
typedef struct gdn_run {
    const lmk_gdn_args *a;
    lmk_cpu_isa isa;
    lmk_gdn_cpu_chunk *chunk;         /* a chunk's arrays, or NULL: every sequence runs token by token */
    int vec;                      /* AVX2 kernels (AVX2 and AVX-512 levels) */
    int avx512;                   /* the AVX-512 16-column kernel */
    size_t es, ses;               /* bytes per element of q/k/v/out and of the state */
    size_t h, kh;
    float neg_exp_A, dt_bias;     /* with A_log: -exp(A_log[h]) and dt_bias[h] */
    unsigned char *row;           /* element (0, 0) of the state of (sequence, h), or NULL: zeros */
    const unsigned char *next;    /* the state row the thread reads next (the next head's), or NULL */
    int stores;                   /* the row is written at the sequence's end */
    size_t lo, hi;                /* the sequence's tokens */
    size_t W, cap, ow;            /* block width; tokens a chunk holds; floats of a chunk o row */
    int o_abs;                    /* o rows are whole rows (dv), indexed by column; else a block's */
    float *tile, *qn, *kn, *o;    /* [dk][W], [cap][dk], [cap][dk], [cap][ow] in the work area */
    float *kv, *u;                /* [dv] each, for a single token (one_token) */
    size_t t0, n;                 /* the chunk: tokens [t0, t0 + n) */
    size_t pc0, pcw;              /* the columns of v, z and out the next chunk will touch */
    float decay[MAX_CHUNK], beta[MAX_CHUNK];
} gdn_run;

/* ---- scalar helpers ---- */

LMK_INLINE float ld(lmk_dtype dt, const void *base, size_t i)
{
    if (dt == LMK_F32)
        return ((const float *)base)[i];
    const uint16_t h = ((const uint16_t *)base)[i];
    return lmk_cpu_half_to_f32(dt, h);
}

LMK_INLINE void st(lmk_dtype dt, void *base, size_t i, float f)
{
    if (dt == LMK_F32)
        ((float *)base)[i] = f;
    else
        ((uint16_t *)base)[i] = dt == LMK_F16 ? lmk_f32_to_f16(f) : lmk_f32_to_bf16(f);
}

/* ln(1 + e^x) without overflow. */
static float softplusf(float x)
{
    return x > 0 ? x + log1pf(expf(-x)) : log1pf(expf(x));
}

static float siluf(float z)
{
    return z / (1.0f + expf(-z));
}

/* Token tok's decay = exp(g) and beta. */
static void gates_at(const gdn_run *r, size_t tok, float *decay, float *beta)
{
    const lmk_gdn_args *a = r->a;
    const float av = ld(a->a_dtype, a->a, tok * a->a_tok + r->h);
    const float bv = ld(a->b_dtype, a->b, tok * a->b_tok + r->h);
    if (a->A_log) {
        *decay = expf(r->neg_exp_A * softplusf(av + r->dt_bias));
        *beta = 1.0f / (1.0f + expf(-bv));
    } else {
        *decay = expf(av);
        *beta = bv;
    }
}

/* The chunk's token t. */
static void gates(gdn_run *r, size_t t)
{
    gates_at(r, r->t0 + t, &r->decay[t], &r->beta[t]);
}

/* The factor a q or k row is multiplied by: scale / sqrt(sum of squares + 1e-6), or scale. */
static float norm_factor(const lmk_gdn_args *a, float ss, float scale)
{
    return a->l2norm ? (float)((double)scale / sqrt((double)ss + 1e-6)) : scale;
}

LMK_INLINE const unsigned char *q_row(const gdn_run *r, size_t tok)
{
    return (const unsigned char *)r->a->q + (tok * r->a->q_tok + r->kh * r->a->q_head) * r->es;
}

LMK_INLINE const unsigned char *k_row(const gdn_run *r, size_t tok)
{
    return (const unsigned char *)r->a->k + (tok * r->a->k_tok + r->kh * r->a->k_head) * r->es;
}

LMK_INLINE const unsigned char *v_row(const gdn_run *r, size_t tok)
{
    return (const unsigned char *)r->a->v + (tok * r->a->v_tok + r->h * r->a->v_head) * r->es;
}

LMK_INLINE unsigned char *out_row(const gdn_run *r, size_t tok)
{
    return (unsigned char *)r->a->out + (tok * r->a->o_tok + r->h * r->a->o_head) * r->es;
}

LMK_INLINE const unsigned char *z_row(const gdn_run *r, size_t tok)
{
    const lmk_gdn_args *a = r->a;
    return (const unsigned char *)a->z + (tok * a->z_tok + r->h * a->z_head) * lmk_dtype_size(a->z_dtype);
}

/* x widened into dst times norm_factor (scalar level). */
static void norm_row_scalar(const gdn_run *r, const unsigned char *x, float *dst, float scale)
{
    const size_t n = r->a->dk;
    float ss = 0;
    for (size_t i = 0; i < n; i++) {
        dst[i] = ld(r->a->dtype, x, i);
        ss += dst[i] * dst[i];
    }
    const float f = norm_factor(r->a, ss, scale);
    for (size_t i = 0; i < n; i++)
        dst[i] *= f;
}

/* Sum of o^2 over n floats (scalar level). */
static float sumsq_scalar(const float *o, size_t n)
{
    float ss = 0;
    for (size_t j = 0; j < n; j++)
        ss += o[j] * o[j];
    return ss;
}

/* 1 / sqrt(mean(o^2) + eps) from the row's sum of squares. */
static float rms_factor(const lmk_gdn_args *a, float ss)
{
    return (float)(1.0 / sqrt((double)ss / (double)a->dv + (double)a->eps));
}

/* out[tok, h, c0 + j] for j < w from o[j]: normed with r when `norm` (z given), else o as is. */
static void emit_scalar(const gdn_run *r, const float *o, size_t tok, size_t c0, size_t w, float rr, int norm)
{
    const lmk_gdn_args *a = r->a;
    unsigned char *dst = out_row(r, tok);
    const unsigned char *z = norm ? z_row(r, tok) : NULL;
    for (size_t j = 0; j < w; j++) {
        float y = o[j];
        if (norm)
            y = y * rr * (ld(a->nw_dtype, a->norm_w, c0 + j) + a->weight_offset) * siluf(ld(a->z_dtype, z, c0 + j));
        st(a->dtype, dst, c0 + j, y);
    }
}

/* ---- the state tile ---- */

/* Element (i, j) of the state row is at row + (i * s_k + j * s_v) * ses. */
static void load_tile_scalar(const gdn_run *r, size_t c0, size_t w)
{
    const lmk_gdn_args *a = r->a;
    const size_t dk = a->dk, W = r->W;
    float *T = r->tile;
    if (!r->row) {
        for (size_t i = 0; i < dk; i++)
            memset(T + i * W, 0, w * sizeof(float));
        return;
    }
    if (a->s_k == 1) { /* dk fastest: read columns */
        for (size_t j = 0; j < w; j++)
            for (size_t i = 0; i < dk; i++)
                T[i * W + j] = ld(a->state_dtype, r->row, i + (c0 + j) * a->s_v);
        return;
    }
    for (size_t i = 0; i < dk; i++)
        for (size_t j = 0; j < w; j++)
            T[i * W + j] = ld(a->state_dtype, r->row, i * a->s_k + (c0 + j) * a->s_v);
}

static void store_tile_scalar(const gdn_run *r, size_t c0, size_t w)
{
    const lmk_gdn_args *a = r->a;
    const size_t dk = a->dk, W = r->W;
    const float *T = r->tile;
    if (a->s_k == 1) {
        for (size_t j = 0; j < w; j++)
            for (size_t i = 0; i < dk; i++)
                st(a->state_dtype, r->row, i + (c0 + j) * a->s_v, T[i * W + j]);
        return;
    }
    for (size_t i = 0; i < dk; i++)
        for (size_t j = 0; j < w; j++)
            st(a->state_dtype, r->row, i * a->s_k + (c0 + j) * a->s_v, T[i * W + j]);
}

/* ---- the recurrence, scalar ---- */

/* A block of w <= MAX_COLS columns of the state, element (i, j) at S[i * rs + j * cs], meets the
 * chunk's tokens: kv once (forward), then per token t a pass that updates S and forms o (and the
 * next token's kv), backwards for even t and forwards for odd t, so that each pass starts on the
 * rows the previous one touched last (in L1 even when the block is not). */

/* kv[j] = sum_i S[i][j] kn[i], element (i, j) at S[i * rs + j * cs]. */
static void kv_scalar(const float *S, size_t rs, size_t cs, size_t dk, size_t w, const float *kn, float *kv)
{
    for (size_t j = 0; j < w; j++)
        kv[j] = 0;
    for (size_t i = 0; i < dk; i++)
        for (size_t j = 0; j < w; j++)
            kv[j] += S[i * rs + j * cs] * kn[i];
}

/* One token: S = decay S + kn u^T, o = S^T qn, and kv = S^T kn2 when kn2 is given; rows in
 * reverse order when rev. */
static void step_scalar(float *restrict S, size_t rs, size_t cs, size_t dk, size_t w, int rev, float decay,
                        const float *u, const float *kn, const float *qn, const float *kn2, float *o, float *kv)
{
    for (size_t j = 0; j < w; j++) {
        o[j] = 0;
        if (kn2)
            kv[j] = 0;
    }
    for (size_t n = 0; n < dk; n++) {
        const size_t i = rev ? dk - 1 - n : n;
        for (size_t j = 0; j < w; j++) {
            float *s = S + i * rs + j * cs;
            *s = *s * decay + kn[i] * u[j];
            o[j] += *s * qn[i];
            if (kn2)
                kv[j] += *s * kn2[i];
        }
    }
}

/* Where the chunk's o row t gets the block's columns. */
LMK_INLINE float *o_at(const gdn_run *r, size_t t, size_t c0)
{
    return r->o + t * r->ow + (r->o_abs ? c0 : 0);
}

/* The chunk's tokens on the block of columns [c0, c0 + w) at S. */
static void block_scalar(const gdn_run *r, float *S, size_t rs, size_t cs, size_t c0, size_t w)
{
    const lmk_gdn_args *a = r->a;
    const size_t dk = a->dk;
    float kv[MAX_COLS], u[MAX_COLS];
    kv_scalar(S, rs, cs, dk, w, r->kn, kv);
    for (size_t t = 0; t < r->n; t++) {
        const unsigned char *v = v_row(r, r->t0 + t);
        for (size_t j = 0; j < w; j++)
            u[j] = r->beta[t] * (ld(a->dtype, v, c0 + j) - r->decay[t] * kv[j]);
        const float *kn = r->kn + t * dk;
        step_scalar(S, rs, cs, dk, w, !(t & 1), r->decay[t], u, kn, r->qn + t * dk, t + 1 < r->n ? kn + dk : NULL,
                    o_at(r, t, c0), kv);
    }
}

/* ---- a single token, row by row ---- */

/* A sequence of one token needs its state only for that token, so it runs in two passes over the
 * state row, in memory order (the hardware prefetchers follow it; decode is memory-bound):
 *     kv = S0^T kn;  u = beta (v - decay kv)
 *     S1 = decay S0 + kn u^T row by row, o += S1^T qn, S1 stored when the sequence stores
 * The second pass reads the row again (from L2) and writes it once, rounded to the pool's dtype.
 * kv, u and o live in the work area. Without a row, S0 is zero. The vector levels walk rows of
 * dv (dv contiguous) or columns of dk (dk contiguous, one_token_cols8); the scalar level takes any
 * strides. */
static void one_token_scalar(const gdn_run *r)
{
    const lmk_gdn_args *a = r->a;
    const size_t dk = a->dk, dv = a->dv;
    const float d = r->decay[0], *kn = r->kn, *qn = r->qn;
    float *kv = r->kv, *u = r->u, *o = r->o;
    for (size_t j = 0; j < dv; j++)
        kv[j] = 0, o[j] = 0;
    if (r->row)
        for (size_t i = 0; i < dk; i++)
            for (size_t j = 0; j < dv; j++)
                kv[j] += ld(a->state_dtype, r->row, i * a->s_k + j * a->s_v) * kn[i];
    const unsigned char *v = v_row(r, r->t0);
    for (size_t j = 0; j < dv; j++)
        u[j] = r->beta[0] * (ld(a->dtype, v, j) - d * kv[j]);
    for (size_t i = 0; i < dk; i++)
        for (size_t j = 0; j < dv; j++) {
            const size_t e = i * a->s_k + j * a->s_v;
            const float s = (r->row ? ld(a->state_dtype, r->row, e) * d : 0.0f) + kn[i] * u[j];
            o[j] += s * qn[i];
            if (r->stores)
                st(a->state_dtype, r->row, e, s);
        }
}

/* ---- AVX2 ---- */

#if LMK_CPU_X86
/* The lanes' sum in a fixed order. */
LMK_CPU_STEP LMK_TARGET_AVX2 float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Cephes' expf polynomial for e^f - 1 - f on [-ln2/2, ln2/2], highest coefficient first. */
static const float exp_poly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                  4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

/* e^x within 2 ulp for x in [-87.3, 88.3] (Cephes' expf); x is clamped into that range, NaN kept
 * (min and max return their second operand when either is NaN). The polynomial is a loop, which
 * the compiler unrolls, so an unoptimised build keeps one set of temporaries. */
LMK_CPU_STEP LMK_TARGET_AVX2 __m256 exp8(__m256 x)
{
    x = _mm256_max_ps(_mm256_set1_ps(-87.3f), _mm256_min_ps(_mm256_set1_ps(88.3f), x));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    f = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), f);
    __m256 p = _mm256_set1_ps(exp_poly[0]);
    for (int c = 1; c < 6; c++)
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(exp_poly[c]));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(f, f), f), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* x widened into dst times norm_factor. */
static LMK_TARGET_AVX2 void norm_row8(const gdn_run *r, const unsigned char *x, float *dst, float scale)
{
    const lmk_dtype dt = r->a->dtype;
    const size_t n = r->a->dk;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 v0 = lmk_v8_load(dt, x + i * r->es), v1 = lmk_v8_load(dt, x + (i + 8) * r->es);
        _mm256_storeu_ps(dst + i, v0);
        _mm256_storeu_ps(dst + i + 8, v1);
        acc0 = _mm256_fmadd_ps(v0, v0, acc0);
        acc1 = _mm256_fmadd_ps(v1, v1, acc1);
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 v = lmk_v8_load(dt, x + i * r->es);
        _mm256_storeu_ps(dst + i, v);
        acc0 = _mm256_fmadd_ps(v, v, acc0);
    }
    float ss = hsum8(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) {
        dst[i] = ld(dt, x, i);
        ss += dst[i] * dst[i];
    }
    const float f = norm_factor(r->a, ss, scale);
    const __m256 fv = _mm256_set1_ps(f);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_loadu_ps(dst + i), fv));
    for (; i < n; i++)
        dst[i] *= f;
}

static LMK_TARGET_AVX2 float sumsq8(const float *o, size_t n)
{
    __m256 acc = _mm256_setzero_ps();
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(o + j), _mm256_loadu_ps(o + j), acc);
    float ss = hsum8(acc);
    for (; j < n; j++)
        ss += o[j] * o[j];
    return ss;
}

/* emit_scalar, 8 columns at a time. */
static LMK_TARGET_AVX2 void emit8(const gdn_run *r, const float *o, size_t tok, size_t c0, size_t w, float rr,
                                  int norm)
{
    const lmk_gdn_args *a = r->a;
    unsigned char *dst = out_row(r, tok) + c0 * r->es;
    const size_t zes = lmk_dtype_size(a->z_dtype), wes = lmk_dtype_size(a->nw_dtype);
    const unsigned char *z = norm ? z_row(r, tok) + c0 * zes : NULL;
    const unsigned char *nw = norm ? (const unsigned char *)a->norm_w + c0 * wes : NULL;
    const __m256 rv = _mm256_set1_ps(rr), off = _mm256_set1_ps(a->weight_offset);
    size_t j = 0;
    for (; j + 8 <= w; j += 8) {
        __m256 y = _mm256_loadu_ps(o + j);
        if (norm) {
            const __m256 zv = lmk_v8_load(a->z_dtype, z + j * zes);
            const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), zv));
            const __m256 silu = _mm256_div_ps(zv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            const __m256 wv = _mm256_add_ps(lmk_v8_load(a->nw_dtype, nw + j * wes), off);
            y = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(y, rv), wv), silu);
        }
        lmk_v8_store(a->dtype, 0, dst + j * r->es, y);
    }
    if (j < w)
        emit_scalar(r, o + j, tok, c0 + j, w - j, rr, norm);
}

/* kv = S^T kn over a block of 8 * nv columns. */
LMK_CPU_STEP LMK_TARGET_AVX2 void kv_body(int nv, const float *S, size_t rs, size_t dk, const float *kn, float *kv)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    size_t i = 0;
    if (nv == 2) {
        for (; i < dk; i++) {
            const __m256 b = _mm256_broadcast_ss(kn + i);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(S + i * rs), b, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(S + i * rs + 8), b, a1);
        }
        _mm256_storeu_ps(kv, a0);
        _mm256_storeu_ps(kv + 8, a1);
        return;
    }
    for (; i + 2 <= dk; i += 2) { /* even and odd rows: two chains */
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(S + i * rs), _mm256_broadcast_ss(kn + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(S + (i + 1) * rs), _mm256_broadcast_ss(kn + i + 1), a1);
    }
    if (i < dk)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(S + i * rs), _mm256_broadcast_ss(kn + i), a0);
    _mm256_storeu_ps(kv, _mm256_add_ps(a0, a1));
}

/* One row of step_body for one vector: s = decay * s + kn_i u, o += s qn_i, k += s kn2_i. */
LMK_CPU_STEP LMK_TARGET_AVX2 void row8(float *p, __m256 d, __m256 u, const float *kn, const float *qn, const float *kn2,
                                     __m256 *o, __m256 *k)
{
    const __m256 s = _mm256_fmadd_ps(_mm256_broadcast_ss(kn), u, _mm256_mul_ps(_mm256_loadu_ps(p), d));
    _mm256_storeu_ps(p, s);
    *o = _mm256_fmadd_ps(s, _mm256_broadcast_ss(qn), *o);
    if (kn2)
        *k = _mm256_fmadd_ps(s, _mm256_broadcast_ss(kn2), *k);
}

/* step_scalar on a block of 8 * nv columns: nv = 2 gives two chains per sum (one a vector), nv = 1
 * alternates rows between two sets of sums. */
LMK_CPU_STEP LMK_TARGET_AVX2 void step_body(int nv, float *S, size_t rs, size_t dk, int rev, float decay, const float *u,
                                          const float *kn, const float *qn, const float *kn2, float *o, float *kv)
{
    const __m256 d = _mm256_set1_ps(decay), u0 = _mm256_loadu_ps(u), u1 = nv == 2 ? _mm256_loadu_ps(u + 8) : u0;
    __m256 o0 = _mm256_setzero_ps(), o1 = o0, k0 = o0, k1 = o0;
    const ptrdiff_t di = rev ? -1 : 1, dp = di * (ptrdiff_t)rs;
    ptrdiff_t i = rev ? (ptrdiff_t)dk - 1 : 0;
    float *p = S + i * (ptrdiff_t)rs;
    size_t n = 0;
    if (nv == 2) {
        for (; n < dk; n++, i += di, p += dp) {
            row8(p, d, u0, kn + i, qn + i, kn2 ? kn2 + i : NULL, &o0, &k0);
            row8(p + 8, d, u1, kn + i, qn + i, kn2 ? kn2 + i : NULL, &o1, &k1);
        }
        _mm256_storeu_ps(o, o0);
        _mm256_storeu_ps(o + 8, o1);
        if (kn2) {
            _mm256_storeu_ps(kv, k0);
            _mm256_storeu_ps(kv + 8, k1);
        }
        return;
    }
    for (; n + 2 <= dk; n += 2, i += 2 * di, p += 2 * dp) {
        row8(p, d, u0, kn + i, qn + i, kn2 ? kn2 + i : NULL, &o0, &k0);
        row8(p + dp, d, u0, kn + i + di, qn + i + di, kn2 ? kn2 + i + di : NULL, &o1, &k1);
    }
    if (n < dk)
        row8(p, d, u0, kn + i, qn + i, kn2 ? kn2 + i : NULL, &o0, &k0);
    _mm256_storeu_ps(o, _mm256_add_ps(o0, o1));
    if (kn2)
        _mm256_storeu_ps(kv, _mm256_add_ps(k0, k1));
}

static LMK_TARGET_AVX2 void step8(float *S, size_t rs, size_t dk, int rev, float decay, const float *u, const float *kn,
                                  const float *qn, const float *kn2, float *o, float *kv)
{
    if (kn2)
        step_body(1, S, rs, dk, rev, decay, u, kn, qn, kn2, o, kv);
    else
        step_body(1, S, rs, dk, rev, decay, u, kn, qn, NULL, o, kv);
}

static LMK_TARGET_AVX2 void step16(float *S, size_t rs, size_t dk, int rev, float decay, const float *u, const float *kn,
                                   const float *qn, const float *kn2, float *o, float *kv)
{
    if (kn2)
        step_body(2, S, rs, dk, rev, decay, u, kn, qn, kn2, o, kv);
    else
        step_body(2, S, rs, dk, rev, decay, u, kn, qn, NULL, o, kv);
}

static LMK_TARGET_AVX2 void kv8(const float *S, size_t rs, size_t dk, const float *kn, float *kv)
{
    kv_body(1, S, rs, dk, kn, kv);
}

static LMK_TARGET_AVX2 void kv16(const float *S, size_t rs, size_t dk, const float *kn, float *kv)
{
    kv_body(2, S, rs, dk, kn, kv);
}

/* AVX-512: a 16-column block is one vector a row (half the FMA-unit ops of two AVX2 vectors);
 * the sums over i run in two chains, even and odd rows. */
LMK_CPU_STEP LMK_TARGET_AVX512 void row16(float *p, __m512 d, __m512 u, const float *kn, const float *qn, const float *kn2,
                                          __m512 *o, __m512 *k)
{
    const __m512 s = _mm512_fmadd_ps(_mm512_set1_ps(*kn), u, _mm512_mul_ps(_mm512_loadu_ps(p), d));
    _mm512_storeu_ps(p, s);
    *o = _mm512_fmadd_ps(s, _mm512_set1_ps(*qn), *o);
    if (kn2)
        *k = _mm512_fmadd_ps(s, _mm512_set1_ps(*kn2), *k);
}

LMK_CPU_STEP LMK_TARGET_AVX512 void step16z_body(float *S, size_t rs, size_t dk, int rev, float decay, const float *u,
                                                 const float *kn, const float *qn, const float *kn2, float *o, float *kv)
{
    const __m512 d = _mm512_set1_ps(decay), uv = _mm512_loadu_ps(u);
    __m512 o0 = _mm512_setzero_ps(), o1 = o0, k0 = o0, k1 = o0;
    const ptrdiff_t di = rev ? -1 : 1, dp = di * (ptrdiff_t)rs;
    ptrdiff_t i = rev ? (ptrdiff_t)dk - 1 : 0;
    float *p = S + i * (ptrdiff_t)rs;
    size_t n = 0;
    for (; n + 2 <= dk; n += 2, i += 2 * di, p += 2 * dp) {
        row16(p, d, uv, kn + i, qn + i, kn2 ? kn2 + i : NULL, &o0, &k0);
        row16(p + dp, d, uv, kn + i + di, qn + i + di, kn2 ? kn2 + i + di : NULL, &o1, &k1);
    }
    if (n < dk)
        row16(p, d, uv, kn + i, qn + i, kn2 ? kn2 + i : NULL, &o0, &k0);
    _mm512_storeu_ps(o, _mm512_add_ps(o0, o1));
    if (kn2)
        _mm512_storeu_ps(kv, _mm512_add_ps(k0, k1));
}

static LMK_TARGET_AVX512 void step16z(float *S, size_t rs, size_t dk, int rev, float decay, const float *u,
                                      const float *kn, const float *qn, const float *kn2, float *o, float *kv)
{
    if (kn2)
        step16z_body(S, rs, dk, rev, decay, u, kn, qn, kn2, o, kv);
    else
        step16z_body(S, rs, dk, rev, decay, u, kn, qn, NULL, o, kv);
}

static LMK_TARGET_AVX512 void kv16z(const float *S, size_t rs, size_t dk, const float *kn, float *kv)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    size_t i = 0;
    for (; i + 2 <= dk; i += 2) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(S + i * rs), _mm512_set1_ps(kn[i]), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(S + (i + 1) * rs), _mm512_set1_ps(kn[i + 1]), a1);
    }
    if (i < dk)
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(S + i * rs), _mm512_set1_ps(kn[i]), a0);
    _mm512_storeu_ps(kv, _mm512_add_ps(a0, a1));
}

/* block_scalar on a block of 8 * nv columns. */
static LMK_TARGET_AVX2 void block_vec(const gdn_run *r, float *S, size_t rs, size_t c0, int nv)
{
    const lmk_gdn_args *a = r->a;
    const size_t dk = a->dk;
    float kv[16], u[16];
    if (nv == 2 && r->avx512)
        kv16z(S, rs, dk, r->kn, kv);
    else if (nv == 2)
        kv16(S, rs, dk, r->kn, kv);
    else
        kv8(S, rs, dk, r->kn, kv);
    for (size_t t = 0; t < r->n; t++) {
        const unsigned char *v = v_row(r, r->t0 + t) + c0 * r->es;
        const __m256 d = _mm256_set1_ps(r->decay[t]), b = _mm256_set1_ps(r->beta[t]);
        for (int c = 0; c < nv; c++)
            _mm256_storeu_ps(u + 8 * c, _mm256_mul_ps(b, _mm256_fnmadd_ps(d, _mm256_loadu_ps(kv + 8 * c),
                                                                           lmk_v8_load(a->dtype, v + 8 * c * r->es))));
        const float *kn = r->kn + t * dk, *kn2 = t + 1 < r->n ? kn + dk : NULL;
        if (nv == 2 && r->avx512)
            step16z(S, rs, dk, !(t & 1), r->decay[t], u, kn, r->qn + t * dk, kn2, o_at(r, t, c0), kv);
        else if (nv == 2)
            step16(S, rs, dk, !(t & 1), r->decay[t], u, kn, r->qn + t * dk, kn2, o_at(r, t, c0), kv);
        else
            step8(S, rs, dk, !(t & 1), r->decay[t], u, kn, r->qn + t * dk, kn2, o_at(r, t, c0), kv);
    }
}

/* dk contiguous (a column j is dk floats, cs apart): the sums over i of columns j and j + 1 in
 * 8 lanes each, then hsum8 (sums over the dk % 8 last rows added after). c1 may equal c0 (with
 * u1 = u0): every element is loaded before either result is stored, so both are the same. */
LMK_CPU_STEP LMK_TARGET_AVX2 void cols2(float *c0, float *c1, size_t dk, float decay, float u0, float u1, const float *kn,
                                        const float *qn, const float *kn2, float *o, float *kv)
{
    const size_t dk8 = dk / 8 * 8;
    const __m256 d = _mm256_set1_ps(decay), b0 = _mm256_set1_ps(u0), b1 = _mm256_set1_ps(u1);
    __m256 o0 = _mm256_setzero_ps(), o1 = o0, k0 = o0, k1 = o0;
    for (size_t i = 0; i < dk8; i += 8) {
        const __m256 kv8 = _mm256_loadu_ps(kn + i), q8 = _mm256_loadu_ps(qn + i);
        const __m256 s0 = _mm256_fmadd_ps(kv8, b0, _mm256_mul_ps(_mm256_loadu_ps(c0 + i), d));
        const __m256 s1 = _mm256_fmadd_ps(kv8, b1, _mm256_mul_ps(_mm256_loadu_ps(c1 + i), d));
        _mm256_storeu_ps(c0 + i, s0);
        _mm256_storeu_ps(c1 + i, s1);
        o0 = _mm256_fmadd_ps(s0, q8, o0);
        o1 = _mm256_fmadd_ps(s1, q8, o1);
        if (kn2) {
            const __m256 k8 = _mm256_loadu_ps(kn2 + i);
            k0 = _mm256_fmadd_ps(s0, k8, k0);
            k1 = _mm256_fmadd_ps(s1, k8, k1);
        }
    }
    o[0] = hsum8(o0), o[1] = hsum8(o1);
    if (kn2)
        kv[0] = hsum8(k0), kv[1] = hsum8(k1);
    for (size_t i = dk8; i < dk; i++) {
        const float s0 = c0[i] * decay + kn[i] * u0, s1 = c1[i] * decay + kn[i] * u1;
        c0[i] = s0, c1[i] = s1;
        o[0] += s0 * qn[i], o[1] += s1 * qn[i];
        if (kn2)
            kv[0] += s0 * kn2[i], kv[1] += s1 * kn2[i];
    }
}

/* sum_i c[i] kn[i] in 8 lanes, then hsum8, then the dk % 8 last rows. */
LMK_CPU_STEP LMK_TARGET_AVX2 float dot8(const float *c, const float *kn, size_t dk)
{
    const size_t dk8 = dk / 8 * 8;
    __m256 acc = _mm256_setzero_ps();
    for (size_t i = 0; i < dk8; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(c + i), _mm256_loadu_ps(kn + i), acc);
    float sum = hsum8(acc);
    for (size_t i = dk8; i < dk; i++)
        sum += c[i] * kn[i];
    return sum;
}

/* block_scalar for an f32 row with dk contiguous, in place: the block's w columns (cs floats apart)
 * two at a time, an odd last one paired with itself. */
static LMK_TARGET_AVX2 void block_cols(const gdn_run *r, float *S, size_t cs, size_t c0, size_t w)
{
    const lmk_gdn_args *a = r->a;
    const size_t dk = a->dk;
    float kv[MAX_COLS + 1], u[MAX_COLS], o[2];
    for (size_t j = 0; j < w; j++)
        kv[j] = dot8(S + j * cs, r->kn, dk);
    for (size_t t = 0; t < r->n; t++) {
        const unsigned char *v = v_row(r, r->t0 + t);
        for (size_t j = 0; j < w; j++)
            u[j] = r->beta[t] * (ld(a->dtype, v, c0 + j) - r->decay[t] * kv[j]);
        const float *kn = r->kn + t * dk, *kn2 = t + 1 < r->n ? kn + dk : NULL;
        float *out = o_at(r, t, c0);
        for (size_t j = 0; j < w; j += 2) {
            const size_t j1 = j + 1 < w ? j + 1 : j;
            cols2(S + j * cs, S + j1 * cs, dk, r->decay[t], u[j], u[j1], kn, r->qn + t * dk, kn2, o, kv + j);
            out[j] = o[0];
            out[j1] = o[1];
        }
    }
}

/* one_token_scalar, 8 columns at a time (dv % 8 scalar). */
static LMK_TARGET_AVX2 void one_token8(const gdn_run *r)
{
    const lmk_gdn_args *a = r->a;
    const size_t dk = a->dk, dv = a->dv, dv8 = dv / 8 * 8, ses = r->ses, rb = a->s_k * ses;
    const lmk_dtype sd = a->state_dtype;
    float *kv = r->kv, *u = r->u, *o = r->o;
    memset(kv, 0, dv * sizeof(float));
    memset(o, 0, dv * sizeof(float));
    for (size_t i = 0; r->row && i < dk; i++) {
        const unsigned char *p = r->row + i * rb;
        const __m256 b = _mm256_broadcast_ss(r->kn + i);
        for (size_t j = 0; j < dv8; j += 8)
            _mm256_storeu_ps(kv + j, _mm256_fmadd_ps(lmk_v8_load(sd, p + j * ses), b, _mm256_loadu_ps(kv + j)));
        for (size_t j = dv8; j < dv; j++)
            kv[j] += ld(sd, p, j) * r->kn[i];
    }
    const unsigned char *v = v_row(r, r->t0);
    for (size_t j = 0; j < dv; j++)
        u[j] = r->beta[0] * (ld(a->dtype, v, j) - r->decay[0] * kv[j]);
    const __m256 d = _mm256_set1_ps(r->decay[0]);
    for (size_t i = 0; i < dk; i++) {
        unsigned char *p = r->row ? r->row + i * rb : NULL;
        const __m256 bk = _mm256_broadcast_ss(r->kn + i), bq = _mm256_broadcast_ss(r->qn + i);
        if (r->next) /* the next row's pass 1 then reads L2 while this pass computes */
            for (size_t l = 0; l < dv * ses; l += 64)
                __builtin_prefetch(r->next + i * rb + l, 0, 2);
        for (size_t j = 0; j < dv8; j += 8) {
            const __m256 s0 = p ? _mm256_mul_ps(lmk_v8_load(sd, p + j * ses), d) : _mm256_setzero_ps();
            const __m256 s = _mm256_fmadd_ps(bk, _mm256_loadu_ps(u + j), s0);
            _mm256_storeu_ps(o + j, _mm256_fmadd_ps(s, bq, _mm256_loadu_ps(o + j)));
            if (r->stores)
                lmk_v8_store(sd, 0, p + j * ses, s);
        }
        for (size_t j = dv8; j < dv; j++) {
            const float s = (p ? ld(sd, p, j) * r->decay[0] : 0.0f) + r->kn[i] * u[j];
            o[j] += s * r->qn[i];
            if (r->stores)
                st(sd, p, j, s);
        }
    }
}

/* one_token_scalar on a row whose dk is contiguous: column j (dk elements) at a time, its sums
 * over i in 8 lanes then hsum8. */
static LMK_TARGET_AVX2 void one_token_cols8(const gdn_run *r)
{
    const lmk_gdn_args *a = r->a;
    const size_t dk = a->dk, dv = a->dv, dk8 = dk / 8 * 8, ses = r->ses;
    const lmk_dtype sd = a->state_dtype;
    const float *kn = r->kn, *qn = r->qn;
    for (size_t j = 0; j < dv; j++) {
        const unsigned char *p = r->row + j * a->s_v * ses;
        __m256 acc = _mm256_setzero_ps();
        for (size_t i = 0; i < dk8; i += 8)
            acc = _mm256_fmadd_ps(lmk_v8_load(sd, p + i * ses), _mm256_loadu_ps(kn + i), acc);
        float kv = hsum8(acc);
        for (size_t i = dk8; i < dk; i++)
            kv += ld(sd, p, i) * kn[i];
        r->u[j] = r->beta[0] * (ld(a->dtype, v_row(r, r->t0), j) - r->decay[0] * kv);
    }
    const __m256 d = _mm256_set1_ps(r->decay[0]);
    for (size_t j = 0; j < dv; j++) {
        unsigned char *p = r->row + j * a->s_v * ses;
        const __m256 bu = _mm256_broadcast_ss(r->u + j);
        __m256 acc = _mm256_setzero_ps();
        for (size_t i = 0; i < dk8; i += 8) {
            const __m256 s = _mm256_fmadd_ps(_mm256_loadu_ps(kn + i), bu, _mm256_mul_ps(lmk_v8_load(sd, p + i * ses), d));
            acc = _mm256_fmadd_ps(s, _mm256_loadu_ps(qn + i), acc);
            if (r->stores)
                lmk_v8_store(sd, 0, p + i * ses, s);
        }
        float o = hsum8(acc);
        for (size_t i = dk8; i < dk; i++) {
            const float s = ld(sd, p, i) * r->decay[0] + kn[i] * r->u[j];
            o += s * qn[i];
            if (r->stores)
                st(sd, p, i, s);
        }
        r->o[j] = o;
    }
}

/* The tile from an f32 or bf16 row with dv contiguous, 8 columns. */
static LMK_TARGET_AVX2 void load_tile8(const gdn_run *r, size_t c0)
{
    const lmk_gdn_args *a = r->a;
    for (size_t i = 0; i < a->dk; i++)
        _mm256_storeu_ps(r->tile + i * r->W, lmk_v8_load(a->state_dtype, r->row + (i * a->s_k + c0) * r->ses));
}

static LMK_TARGET_AVX2 void store_tile8(const gdn_run *r, size_t c0)
{
    const lmk_gdn_args *a = r->a;
    for (size_t i = 0; i < a->dk; i++)
        lmk_v8_store(a->state_dtype, 0, r->row + (i * a->s_k + c0) * r->ses, _mm256_loadu_ps(r->tile + i * r->W));
}
#endif /* LMK_CPU_X86 */

/* ---- dispatch between the levels ---- */

static void load_tile(const gdn_run *r, size_t c0, size_t w)
{
#if LMK_CPU_X86
    if (r->vec && w == 8 && r->row && r->a->s_v == 1) {
        load_tile8(r, c0);
        return;
    }
#endif
    load_tile_scalar(r, c0, w);
}

static void store_tile(const gdn_run *r, size_t c0, size_t w)
{
#if LMK_CPU_X86
    if (r->vec && w == 8 && r->a->s_v == 1) {
        store_tile8(r, c0);
        return;
    }
#endif
    store_tile_scalar(r, c0, w);
}

/* The chunk's tokens on the block of columns [c0, c0 + w) whose element (i, j) is at
 * S[i * rs + j * cs]: vector kernels for rows of 8 or 16 contiguous columns (cs 1) and for
 * contiguous columns (rs 1, f32 in place), the scalar one otherwise. */
static void run_block(const gdn_run *r, float *S, size_t rs, size_t cs, size_t c0, size_t w)
{
#if LMK_CPU_X86
    if (r->vec && cs == 1 && (w == 8 || w == 16)) {
        block_vec(r, S, rs, c0, (int)(w / 8));
        return;
    }
    if (r->vec && rs == 1 && cs != 1) {
        block_cols(r, S, cs, c0, w);
        return;
    }
#endif
    block_scalar(r, S, rs, cs, c0, w);
}

static void one_token(const gdn_run *r)
{
#if LMK_CPU_X86
    if (r->vec && (!r->row || r->a->s_v == 1)) {
        one_token8(r);
        return;
    }
    if (r->vec && r->a->s_k == 1) {
        one_token_cols8(r);
        return;
    }
#endif
    one_token_scalar(r);
}

static void norm_row(const gdn_run *r, const unsigned char *x, float *dst, float scale)
{
#if LMK_CPU_X86
    if (r->vec) {
        norm_row8(r, x, dst, scale);
        return;
    }
#endif
    norm_row_scalar(r, x, dst, scale);
}

static float sumsq(const gdn_run *r, const float *o, size_t n)
{
#if LMK_CPU_X86
    if (r->vec)
        return sumsq8(o, n);
#else
    (void)r;
#endif
    return sumsq_scalar(o, n);
}

static void emit(const gdn_run *r, const float *o, size_t tok, size_t c0, size_t w, float rr, int norm)
{
#if LMK_CPU_X86
    if (r->vec) {
        emit8(r, o, tok, c0, w, rr, norm);
        return;
    }
#endif
    emit_scalar(r, o, tok, c0, w, rr, norm);
}

/* ---- where the state lives (see the header) ---- */

/* The rows of the chunk after the current one (up to r->n tokens from t0 + r->n) into the cache
 * (of v, z and out the columns [pc0, pc0 + pcw) only): a head's rows are a short run every token
 * stride (kilobytes in a packed QKV buffer), which the hardware prefetchers do not follow across
 * pages, so each would otherwise be a memory round trip when its chunk comes. */
static void prefetch_next(const gdn_run *r)
{
    const lmk_gdn_args *a = r->a;
    const size_t t0 = r->t0 + r->n, t1 = r->hi - t0 < r->n ? r->hi : t0 + r->n, es = r->es;
    const size_t zes = a->z ? lmk_dtype_size(a->z_dtype) : 0;
    for (size_t t = t0; t < t1; t++) {
        for (size_t l = 0; l < a->dk * es; l += 64) {
            __builtin_prefetch(q_row(r, t) + l, 0, 3);
            __builtin_prefetch(k_row(r, t) + l, 0, 3);
        }
        for (size_t l = r->pc0 * es; l < (r->pc0 + r->pcw) * es; l += 64) {
            __builtin_prefetch(v_row(r, t) + l, 0, 3);
            __builtin_prefetch(out_row(r, t) + l, 1, 3);
        }
        for (size_t l = r->pc0 * zes; l < (r->pc0 + r->pcw) * zes; l += 64)
            __builtin_prefetch(z_row(r, t) + l, 0, 3);
    }
}

/* Gates, qn and kn of the chunk's n tokens from t0; the next chunk's rows prefetched. */
static void prep_chunk(gdn_run *r, size_t t0, size_t n)
{
    const size_t dk = r->a->dk;
    r->t0 = t0, r->n = n;
    prefetch_next(r);
    for (size_t t = 0; t < n; t++) {
        gates(r, t);
        norm_row(r, q_row(r, t0 + t), r->qn + t * dk, r->a->scale);
        norm_row(r, k_row(r, t0 + t), r->kn + t * dk, 1.0f);
    }
}

/* Out row tok from its whole o row (f32; may be the out row itself when out is f32). */
static void finish_row(const gdn_run *r, const float *o, size_t tok)
{
    const lmk_gdn_args *a = r->a;
    const float rr = a->z ? rms_factor(a, sumsq(r, o, a->dv)) : 1.0f;
    emit(r, o, tok, 0, a->dv, rr, a->z != NULL);
}

/* A short sequence (at most r->cap tokens) whose state cannot be updated in place: one chunk; each
 * block of W columns is loaded into the tile (zeros without a row), meets the chunk's tokens and is
 * stored back, rounded to the pool's dtype, when the sequence stores; then the o rows are finished. */
static void short_seq(gdn_run *r)
{
    const lmk_gdn_args *a = r->a;
    prep_chunk(r, r->lo, r->hi - r->lo);
    for (size_t c0 = 0; c0 < a->dv; c0 += r->W) {
        const size_t w = a->dv - c0 < r->W ? a->dv - c0 : r->W;
        load_tile(r, c0, w);
        run_block(r, r->tile, r->W, 1, c0, w);
        if (r->stores)
            store_tile(r, c0, w);
    }
    for (size_t t = 0; t < r->n; t++)
        finish_row(r, r->o + t * a->dv, r->lo + t);
}

/* The 4 bytes of out row tok that hold its running sum of o^2 in O_SUMSQ. */
LMK_INLINE unsigned char *sumsq_slot(const gdn_run *r, size_t tok)
{
    return out_row(r, tok);
}

/* Block-major: what happens to the chunk's o rows of the block [c0, c0 + w). */
static void block_out(const gdn_run *r, o_mode mode, size_t c0, size_t w, int first_block)
{
    for (size_t t = 0; t < r->n; t++) {
        const size_t tok = r->t0 + t;
        const float *o = r->o + t * r->ow;
        float ss;
        switch (mode) {
        case O_FULL: finish_row(r, o, tok); break;
        case O_DIRECT: emit(r, o, tok, c0, w, 1.0f, 0); break;
        case O_RAW: memcpy((float *)(void *)out_row(r, tok) + c0, o, w * sizeof(float)); break;
        case O_SUMSQ:
            ss = sumsq(r, o, w);
            if (!first_block) {
                float prev;
                memcpy(&prev, sumsq_slot(r, tok), 4);
                ss += prev;
            }
            memcpy(sumsq_slot(r, tok), &ss, 4);
            break;
        case O_NORMED:
            memcpy(&ss, sumsq_slot(r, tok), 4);
            emit(r, o, tok, c0, w, rms_factor(r->a, ss), 1);
            break;
        }
    }
}

/* One sweep of block-major: the blocks from the last to the first (so the block holding the
 * O_SUMSQ bytes is written last), each over all the sequence's tokens. */
static void block_sweep(gdn_run *r, o_mode mode, int write)
{
    const lmk_gdn_args *a = r->a;
    const size_t nb = (a->dv + r->W - 1) / r->W;
    for (size_t b = nb; b-- > 0;) {
        const size_t c0 = b * r->W, w = a->dv - c0 < r->W ? a->dv - c0 : r->W;
        r->pc0 = c0, r->pcw = w;
        load_tile(r, c0, w);
        for (size_t t0 = r->lo; t0 < r->hi; t0 += r->n) {
            prep_chunk(r, t0, r->hi - t0 < r->cap ? r->hi - t0 : r->cap);
            run_block(r, r->tile, r->W, 1, c0, w);
            block_out(r, mode, c0, w, b == nb - 1);
        }
        if (write)
            store_tile(r, c0, w);
    }
}

static void block_major(gdn_run *r)
{
    const lmk_gdn_args *a = r->a;
    if (a->dv <= r->W) {
        block_sweep(r, O_FULL, r->stores);
    } else if (!a->z) {
        block_sweep(r, O_DIRECT, r->stores);
    } else if (a->dtype == LMK_F32) {
        block_sweep(r, O_RAW, r->stores);
        for (size_t t = r->lo; t < r->hi; t++)
            finish_row(r, (const float *)(const void *)out_row(r, t), t);
    } else {
        block_sweep(r, O_SUMSQ, 0);
        block_sweep(r, O_NORMED, r->stores);
    }
}

/* Lays a tile of dk x W (none when W is 0), a chunk with o rows of ow floats (r->cap tokens) and,
 * for one_token, kv and u out in the work area. */
static void partition(gdn_run *r, float *work, size_t W, size_t ow, int one)
{
    const size_t dk = r->a->dk, dv = r->a->dv;
    size_t cap = (WORK_FLOATS - dk * W - (one ? 2 * dv : 0)) / (2 * dk + ow);
    if (cap > MAX_CHUNK)
        cap = MAX_CHUNK;
    r->W = W, r->ow = ow, r->cap = cap, r->o_abs = ow == dv;
    r->tile = work;
    r->qn = work + dk * W;
    r->kn = r->qn + cap * dk;
    r->o = r->kn + cap * dk;
    r->kv = one ? r->o + cap * ow : NULL;
    r->u = one ? r->kv + dv : NULL;
}

/* The tokens [lo, hi) on the f32 state whose element (i, j) is at S[i * rs + j * cs], updated in
 * place: chunks of r->cap tokens, and for each block of columns (16, then 8 when cs is 1, then the
 * rest) the chunk's tokens straight on S's elements. */
static void tokens_on(gdn_run *r, float *S, size_t rs, size_t cs, size_t lo, size_t hi)
{
    const lmk_gdn_args *a = r->a;
    for (size_t t0 = lo; t0 < hi; t0 += r->n) {
        prep_chunk(r, t0, hi - t0 < r->cap ? hi - t0 : r->cap);
        for (size_t c0 = 0, w; c0 < a->dv; c0 += w) {
            const size_t left = a->dv - c0;
            w = left >= MAX_COLS ? MAX_COLS : r->vec && cs == 1 && left >= 8 ? 8 : left;
            run_block(r, S + c0 * cs, rs, cs, c0, w);
        }
        for (size_t t = 0; t < r->n; t++)
            finish_row(r, r->o + t * a->dv, t0 + t);
    }
}

/* A state row that is f32 with dv or dk contiguous and stored by this sequence is updated in
 * place. */
static void in_place(gdn_run *r)
{
    const lmk_gdn_args *a = r->a;
    tokens_on(r, (float *)(void *)r->row, a->s_k, a->s_v, r->lo, r->hi);
}

/* ---- the chunked form (cpu_chunk.h) ---- */

/* The state row (zeros without one) as the chunk's dense f32 S of dkp x dvp, padding zero. */
static void load_state(const gdn_run *r, float *S, size_t dkp, size_t dvp)
{
    const lmk_gdn_args *a = r->a;
    memset(S, 0, dkp * dvp * sizeof(float));
    for (size_t i = 0; r->row && i < a->dk; i++) {
        float *d = S + i * dvp;
        if (a->state_dtype == LMK_F32 && a->s_v == 1)
            memcpy(d, r->row + i * a->s_k * r->ses, a->dv * sizeof(float));
        else
            for (size_t j = 0; j < a->dv; j++)
                d[j] = ld(a->state_dtype, r->row, i * a->s_k + j * a->s_v);
    }
}

/* S back into the state row, rounded once to the pool's dtype. */
static void store_state(const gdn_run *r, const float *S, size_t dvp)
{
    const lmk_gdn_args *a = r->a;
    for (size_t i = 0; i < a->dk; i++) {
        const float *d = S + i * dvp;
        if (a->state_dtype == LMK_F32 && a->s_v == 1)
            memcpy(r->row + i * a->s_k * r->ses, d, a->dv * sizeof(float));
        else
            for (size_t j = 0; j < a->dv; j++)
                st(a->state_dtype, r->row, i * a->s_k + j * a->s_v, d[j]);
    }
}

/* n floats of a row of the input dtype widened into dst, zeros up to `to`. */
static void widen_row(const gdn_run *r, const unsigned char *x, float *dst, size_t n, size_t to)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = ld(r->a->dtype, x, i);
    memset(dst + n, 0, (to - n) * sizeof(float));
}

/* The chunk's L tokens from t0 into c: gates, qn and kn rows, v rows. Returns whether the chunked form may run them: every decay in [0, 1] and every
 * beta |kn|^2 in [0, 2], so that each token's update I - beta kn kn^T does not expand the state
 * and (I + A)^{-1} stays as bounded as the token recurrence (without the L2 norm, or with g and
 * beta given, that need not hold: FLA #537). NaN fails the test too, so such a chunk runs token
 * by token and gives the token form's NaNs. */
static int chunk_prep(gdn_run *r, lmk_gdn_cpu_chunk *c, size_t t0, size_t L)
{
    const lmk_gdn_args *a = r->a;
    const size_t dk = a->dk;
    int ok = 1;
    for (size_t t = 0; t < L; t++) {
        const size_t tok = t0 + t;
        float *kn = c->kn + t * c->dkp, *qn = c->qn + t * c->dkp;
        gates_at(r, tok, &c->decay[t], &c->beta[t]);
        norm_row(r, q_row(r, tok), qn, a->scale);
        norm_row(r, k_row(r, tok), kn, 1.0f);
        memset(qn + dk, 0, (c->dkp - dk) * sizeof(float));
        memset(kn + dk, 0, (c->dkp - dk) * sizeof(float));
        widen_row(r, v_row(r, tok), c->vo + t * c->dvp, a->dv, c->dvp);
        const float bk = c->beta[t] * sumsq(r, kn, dk);
        ok &= c->decay[t] >= 0.0f && c->decay[t] <= 1.0f && bk >= 0.0f && bk <= 2.0f;
    }
    return ok;
}

/* The next chunk's rows, brought into the cache a few lines at a time while a chunk computes (its
 * kernels call pf_tick once per block of rows): a burst of thousands of prefetches at once waits on
 * the core's few line fill buffers about as long as the loads themselves would. A head's rows are
 * a short run every token stride (kilobytes in a packed QKV buffer), which the hardware prefetchers
 * do not follow. */
typedef struct pf_cursor {
    const gdn_run *r;
    size_t tok, end; /* the tokens left to fetch */
    int part;        /* of token tok: q, k, v, z, out */
    size_t off;      /* bytes of that row fetched */
    size_t per_tick; /* lines a tick fetches */
} pf_cursor;

enum { PF_PARTS = 5, PF_TICKS = 128 /* ticks a chunk gives at least (its kernels' blocks of rows) */ };

/* Part `part` of token tok's rows and its length in bytes (0: none). */
static const unsigned char *pf_row(const gdn_run *r, int part, size_t tok, size_t *bytes)
{
    const lmk_gdn_args *a = r->a;
    switch (part) {
    case 0: *bytes = a->dk * r->es; return q_row(r, tok);
    case 1: *bytes = a->dk * r->es; return k_row(r, tok);
    case 2: *bytes = a->dv * r->es; return v_row(r, tok);
    case 3: *bytes = a->z ? a->dv * lmk_dtype_size(a->z_dtype) : 0; return a->z ? z_row(r, tok) : NULL;
    default: *bytes = a->dv * r->es; return out_row(r, tok);
    }
}

static void pf_tick(void *ctx)
{
    pf_cursor *p = ctx;
    for (size_t n = p->per_tick; n > 0 && p->tok < p->end;) {
        size_t bytes;
        const unsigned char *row = pf_row(p->r, p->part, p->tok, &bytes);
        if (p->off < bytes) {
            if (p->part == PF_PARTS - 1)
                __builtin_prefetch(row + p->off, 1, 3);
            else
                __builtin_prefetch(row + p->off, 0, 3);
            p->off += 64, n--;
            continue;
        }
        p->off = 0;
        if (++p->part == PF_PARTS)
            p->part = 0, p->tok++;
    }
}

/* Points the cursor at the tokens [t0, t1), spread over PF_TICKS ticks. */
static void pf_start(pf_cursor *p, size_t t0, size_t t1)
{
    const lmk_gdn_args *a = p->r->a;
    const size_t zes = a->z ? lmk_dtype_size(a->z_dtype) : 0;
    const size_t lines = (t1 - t0) * ((2 * a->dk + 2 * a->dv) * p->r->es + a->dv * zes + 63 * PF_PARTS) / 64;
    p->tok = t0, p->end = t1, p->part = 0, p->off = 0, p->per_tick = lines / PF_TICKS + 1;
}

/* Tokens [t0, t0 + L) of the sequence (L = c->cap, or what is left) on r's head, its state at c->S
 * (the next chunk's rows prefetched through pf): a chunk that chunk_prep refuses runs token by
 * token on c->S (r's work area laid out for the token form). */
static void chunk_step(gdn_run *r, lmk_gdn_cpu_chunk *c, pf_cursor *pf, size_t t0)
{
    const size_t L = r->hi - t0 < c->cap ? r->hi - t0 : c->cap;
    const size_t next = t0 + L, next_end = r->hi - next < c->cap ? r->hi : next + c->cap;
    pf->r = r;
    pf_start(pf, next, next_end);
    if (chunk_prep(r, c, t0, L)) {
        lmk_gdn_cpu_chunk_run(r->isa, c, L);
        for (size_t t = 0; t < L; t++)
            finish_row(r, c->vo + t * c->dvp, t0 + t);
    } else {
        tokens_on(r, c->S, c->dvp, 1, t0, t0 + L);
    }
}

/* The sequence on r's head in chunks of c->cap tokens from its start, the state in c->S (the
 * share's scratch) from the row's load to its store. */
static void chunked(gdn_run *r, lmk_gdn_cpu_chunk *c)
{
    pf_cursor pf = {.r = r};
    c->tick = pf_tick, c->tick_ctx = &pf;
    load_state(r, c->S, c->dkp, c->dvp);
    for (size_t t0 = r->lo; t0 < r->hi; t0 += c->cap)
        chunk_step(r, c, &pf, t0);
    if (r->stores)
        store_state(r, c->S, c->dvp);
    c->tick = NULL;
}

/* Value head h of the current sequence, its state row `slot` (-1: none). */
static void head_setup(gdn_run *r, size_t h, int64_t slot)
{
    const lmk_gdn_args *a = r->a;
    r->h = h, r->kh = lmk_gdn_k_head(a, h);
    if (a->A_log) {
        r->neg_exp_A = -expf(ld(a->A_dtype, a->A_log, h));
        r->dt_bias = ld(a->dt_dtype, a->dt_bias, h);
    }
    r->row = slot < 0 ? NULL : (unsigned char *)a->state + ((size_t)slot * a->s_slot + h * a->s_head) * r->ses;
    r->pc0 = 0, r->pcw = a->dv;
}

/* Sequence [lo, hi) on value head h, its state row `slot` (-1: none). */
static void run_head(gdn_run *r, float *work, size_t h, int64_t slot)
{
    const lmk_gdn_args *a = r->a;
    head_setup(r, h, slot);
    if (r->chunk && r->hi - r->lo >= CHUNK_MIN) {
        partition(r, work, 0, a->dv, 0);
        chunked(r, r->chunk);
        return;
    }
    if (r->hi - r->lo == 1) {
        partition(r, work, 0, a->dv, 1);
        prep_chunk(r, r->lo, 1);
        one_token(r);
        finish_row(r, r->o, r->lo);
        return;
    }
    if (r->row && r->stores && a->state_dtype == LMK_F32 && (a->s_v == 1 || a->s_k == 1)) {
        partition(r, work, 0, a->dv, 0);
        in_place(r);
        return;
    }
    /* tiles of 8 columns unless a tile of 8 and one token's qn, kn and o row would not fit */
    const size_t dk = a->dk, fit = (WORK_FLOATS - 2 * dk - a->dv) / dk, W = fit < BLOCK_COLS ? fit : BLOCK_COLS;
    partition(r, work, W, a->dv, 0);
    if (a->dv > W && r->hi - r->lo <= r->cap) {
        short_seq(r);
    } else {
        partition(r, work, W, W, 0);
        block_major(r);
    }
}

typedef struct gdn_job {
    const lmk_gdn_args *a;
    lmk_stream *s; /* its pool's scratch holds each share's work area */
    lmk_cpu_isa isa;
    int vec, avx512;
    int chunk; /* long sequences may run chunked (LMK_GDN_CHUNK is not "0") */
} gdn_job;

/* A share's scratch: the token form's work area, then a chunk's arrays (cpu_chunk.h). */
_Static_assert(WORK_FLOATS * sizeof(float) <= LMK_CPU_SCRATCH, "the work area is a share's scratch");
#define CHUNK_AREA_FLOATS (LMK_CPU_SCRATCH / sizeof(float) - WORK_FLOATS)

/* The largest chunk (64, 32 or 16 tokens) whose arrays fit the share's scratch for these head
 * dims, laid out in c; 0 when none does (then every sequence runs token by token). */
static int chunk_fit(const lmk_gdn_args *a, float *area, lmk_gdn_cpu_chunk *c)
{
    for (size_t cap = CHUNK_TOKENS; cap >= 16; cap /= 2)
        if (lmk_gdn_cpu_chunk_init(c, area, CHUNK_AREA_FLOATS, a->dk, a->dv, cap))
            return 1;
    return 0;
}

static void gdn_task(void *ctx, int tid, int n_threads)
{
    const gdn_job *j = ctx;
    const lmk_gdn_args *a = j->a;
    size_t h0, h1;
    lmk_cpu_share(a->Hv, tid, n_threads, 1, &h0, &h1);
    if (h0 >= h1)
        return;
    float *const work = lmk_cpu_scratch(j->s, tid); /* 64-byte aligned, off the calling thread's stack */
    gdn_run r = {.a = a, .isa = j->isa, .vec = j->vec, .avx512 = j->avx512, .es = lmk_dtype_size(a->dtype)};
    lmk_gdn_cpu_chunk chunk;
    if (j->chunk && chunk_fit(a, work + WORK_FLOATS, &chunk))
        r.chunk = &chunk;
    r.ses = a->state ? lmk_dtype_size(a->state_dtype) : 0;
    for (size_t s = 0; s < a->n_seq; s++) {
        lmk_seq_bounds(a->cu_seqlens, a->cu_is64, s, a->T, &r.lo, &r.hi);
        if (r.lo == r.hi)
            continue;
        const int64_t slot = a->state ? lmk_seq_slot(a->slots, a->slots_is64, s, a->n_slots) : -1;
        r.stores = lmk_seq_stores(a->slots, a->slots_is64, s, a->n_seq, a->n_slots, slot);
        for (size_t h = h0; h < h1; h++) {
            const size_t next_at = ((size_t)slot * a->s_slot + (h + 1) * a->s_head) * r.ses;
            r.next = slot >= 0 && h + 1 < h1 && a->s_v == 1 ? (const unsigned char *)a->state + next_at : NULL;
            run_head(&r, work, h, slot);
        }
    }
}

lmk_status lmk_cpu_gated_delta_rule(lmk_stream *s, const void *args)
{
    const lmk_gdn_args *a = args;
    const lmk_cpu_isa isa = lmk_cpu_stream_isa(s);
    gdn_job j = {.a = a, .s = s, .isa = isa, .vec = LMK_CPU_X86 && isa >= LMK_CPU_AVX2,
                 .avx512 = LMK_CPU_X86 && isa >= LMK_CPU_AVX512};
    if (a->T >= CHUNK_MIN) { /* a sequence may be long enough: unless a test turned it off */
        const char *env = getenv("LMK_GDN_CHUNK");
        j.chunk = !(env && strcmp(env, "0") == 0);
    }
    /* the bytes the call moves: inputs and outputs, and each sequence's state read and written */
    size_t bytes = a->T * (2 * a->Hk * a->dk + 2 * a->Hv * a->dv) * lmk_dtype_size(a->dtype);
    if (a->state)
        bytes += 2 * a->n_seq * a->Hv * a->dk * a->dv * lmk_dtype_size(a->state_dtype);
    lmk_cpu_parallel(s, bytes, gdn_task, &j);
    return LMK_OK;
}
