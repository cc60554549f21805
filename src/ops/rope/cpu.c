/*
 * cpu.c - the CPU fast path of rope: every mode, scaling, position type and strided layout of
 * lmk.h's lmk_rope, on one tensor or on q and k sharing positions.
 *
 * Work is split by rows (token-major; within a token the q heads, then the k heads), so each
 * thread computes the cos/sin table of a token once and applies it to every head of both tensors.
 * The table is built in two steps:
 *  - per thread and chunk of pairs: the angle factor freq(p) and the pair's position axis, from
 *    rope_common.h's lmk_rope_axis_j and lmk_rope_freq (the rules of every mode and of the YaRN
 *    ramp and freq_factors live there once);
 *  - per token: theta = pos * freq in double, then m*cos and m*sin rounded to f32 by
 *    lmk_cpu_sincos (src/cpu/sincos.c, shared with lmk_attn_prologue): a double reduction by pi/2
 *    and fdlibm's double polynomials in 8 or 4 lanes, the same f32 values as (float)cos/sin from
 *    libm on 8M angles up to 2^40, at a small fraction of libm's cost, which would otherwise be a
 *    large share of the memory time of a 24-head token (docs/cpu.md, "Angles: lmk_cpu_sincos").
 *    Angles beyond LMK_CPU_SINCOS_VECTOR_MAX = 2^40 (i64 positions,
 *    freq_base < 1) use libm for the token.
 * Rows are then rotated in f32 with AVX-512 or AVX2 (chosen at device open), loading bf16/f16 by
 * widening and storing with round-to-nearest-even that gives the same bits as lmk_f32_to_bf16
 * (cpu/bf16_simd.h, shared with lmk_attn_prologue) / lmk_f32_to_f16 (NaN included). Split pairs
 * (x[p], x[p + pair_stride]) rotate a vector of a's against a vector of b's; NORMAL's adjacent
 * pairs (x[2p], x[2p+1]) rotate one vector of both, with cos/sin duplicated into lane pairs and
 * the pair swapped in-lane. The bf16 steps take 16 (AVX2) or 32 (AVX-512) values at a time in
 * even/odd order (one load, no shuffle; adjacent pairs are then the even and odd elements
 * themselves; split8). A row is contiguous
 * whatever the token and head strides, so strided operands (q in [q | gate], q and k in place in
 * a packed QKV buffer) take the same kernels. Elements outside the rotated pairs are byte copies
 * (nothing to do in place). Large out-of-place outputs whose every vector store and copied segment
 * starts on a cache line (every real model shape, dense or with line-multiple strides) are written
 * with streaming stores. The portable path is scalar C with libm angles.
 *
 * Memory: the table holds PAIRS_PER_CHUNK = 128 pairs (3.2 KB), which covers rope_dim <= 256 (every
 * real model) in one pass; larger rope_dim is processed chunk by chunk. Each share's table is its
 * block of the stream's scratch (lmk_cpu_scratch), not the stack of the calling thread (share 0
 * runs there), which holds frames alone and stays within lmk.h's bound at every optimisation
 * level (at -O0 the kernels' steps are functions of their own, PAIRS_KERNEL); no size ever reaches
 * a VLA or the heap. tests/test_small_stack.c measures it.
 */
#include "cpu/bf16_simd.h"
#include "cpu/cpu.h"
#include "ops/rope/rope.h"
#include "ops/rope/rope_common.h"
#include "ops/rope/rope_cpu.h"

#include <math.h>

#define PAIRS_PER_CHUNK 128

/* One tensor of a launch, strides in bytes. */
typedef struct rope_tensor_job {
    const unsigned char *in;
    unsigned char *out;
    size_t heads;
    size_t in_tok, in_head, out_tok, out_head;
    int in_place;
    int stream;                  /* streaming stores for this tensor's output */
    size_t ahead_tok, ahead_head; /* in place: the prefetch distance (~16 KB of rows) */
} rope_tensor_job;

typedef struct rope_job {
    lmk_stream *s;              /* its pool's scratch holds each share's table */
    lmk_cpu_isa isa;
    lmk_dtype dtype;
    size_t es;                  /* bytes per element */
    size_t head_dim, half;      /* elements; half = rope_dim / 2 pairs */
    size_t stride;              /* element distance from a pair's first element to its second */
    int interleaved;            /* NORMAL: pair p is (2p, 2p+1) */
    size_t seq, rows_per_token; /* rows: seq * (heads of q + heads of k) */
    const lmk_rope_angle *angle;
    int n_tensors;
    rope_tensor_job t[2];
} rope_job;

/* A share's table, in its block of the stream's scratch (lmk_cpu_scratch), not on the stack of
 * the calling thread, which runs share 0 (lmk.h's stack bound). */
typedef struct rope_table {
    float cos[PAIRS_PER_CHUNK], sin[PAIRS_PER_CHUNK];
    double freq[PAIRS_PER_CHUNK], theta[PAIRS_PER_CHUNK];
    unsigned char axis[PAIRS_PER_CHUNK];
    double max_freq; /* max |freq| of the chunk */
} rope_table;
_Static_assert(sizeof(rope_table) <= LMK_CPU_SCRATCH, "a share's table fits its scratch");

/* In place: the row to prefetch next (the run's k-th row prefetches the tensor's row ~16 KB later
 * in (token, head) order), walked by pointer steps. */
typedef struct rope_prefetch {
    const unsigned char *p;       /* the rotated pairs of the next row to prefetch */
    size_t left;                  /* rows of the tensor from that one to its end (0: none) */
    size_t head, heads;           /* its head, and the tensor's heads */
    ptrdiff_t head_step, tok_step; /* bytes to the next row within a token, and from a token's last row */
    size_t len, b_bytes;          /* bytes of the a segment; its b segment b_bytes on (NORMAL: 0) */
} rope_prefetch;

/* A run of consecutive heads of one token of one tensor and what to do to them. Offsets in bytes. */
typedef struct rope_rows {
    const unsigned char *in;
    unsigned char *out;
    size_t n_rows, in_rb, out_rb; /* rows, and bytes from a row to the next (head strides) */
    size_t a0, b_bytes; /* the chunk's first a element; from a pair's a to its b */
    size_t n;           /* rotate the chunk's n pairs with cos/sin c[0..n), s[0..n) */
    const float *c, *s;
    int copy;           /* copy the two gaps [gap[g][0], gap[g][1]) of each row */
    int nt;             /* streaming stores (every segment is whole cache lines) */
    size_t gap[2][2];
    int prefetch;
    rope_prefetch pf;
} rope_rows;
/* ---- angles ---- */


/* freq and axis of pairs [p0, p0 + n): once per thread and chunk. `plain` (no scaling, no
 * freq_factors: every lmk_rope_multi call) passes lmk_rope_freq those values as constants, which
 * fold away: a decode call, single-threaded and short, pays that loop on its critical path. */
LMK_INLINE double freqs_as(const lmk_rope_angle *g, size_t p0, size_t n, unsigned char *restrict axis,
                           double *restrict freq, int plain)
{
    double max_freq = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t p = (uint32_t)(p0 + i);
        uint32_t e;
        axis[i] = (unsigned char)lmk_rope_axis_j((int)g->mode, g->sections, p, &e);
        freq[i] = plain ? lmk_rope_freq(g->freq_base, g->exp_n, 1.0, 0.0, 0.0, 0.0, p, e, 1.0)
                        : lmk_rope_freq(g->freq_base, g->exp_n, g->freq_scale, g->ext_factor, g->ramp_low,
                                        g->ramp_high, p, e, g->freq_factors ? (double)g->freq_factors[p] : 1.0);
        /* an infinite freq makes the bound test of lmk_rope_cpu_angles inf or NaN: libm */
        if (fabs(freq[i]) > max_freq)
            max_freq = fabs(freq[i]);
    }
    for (size_t i = n; i < (n + 7) / 8 * 8; i++) /* the vector tail reads whole groups of 8 */
        freq[i] = 0, axis[i] = 0;
    return max_freq;
}

/* lmk_rope_cpu_freqs, inlined into rope's own chunk loop. */
LMK_INLINE double freqs(const lmk_rope_angle *g, size_t p0, size_t n, unsigned char *restrict axis,
                        double *restrict freq)
{
    if (!g->freq_factors && g->freq_scale == 1.0 && g->ext_factor == 0.0)
        return freqs_as(g, p0, n, axis, freq, 1);
    return freqs_as(g, p0, n, axis, freq, 0);
}

double lmk_rope_cpu_freqs(const lmk_rope_angle *g, size_t p0, size_t n, unsigned char *restrict axis,
                          double *restrict freq)
{
    return freqs(g, p0, n, axis, freq);
}

/* lmk_rope_cpu_angles, inlined into rope's own token loop (a call per token and chunk showed in
 * a decode call's time). */
LMK_INLINE void angles(lmk_cpu_isa isa, const lmk_rope_angle *g, size_t token, const unsigned char *restrict axis,
                       const double *restrict freq, double max_freq, size_t n, double *restrict theta,
                       float *restrict c, float *restrict s)
{
    double pos[4], max_pos = 0;
    for (int a = 0; a < 4; a++) { /* pos_axis_stride 0 (NORMAL, NEOX): every axis is the token's one */
        pos[a] = lmk_rope_pos(g->positions, (int)g->pos_dtype, (uint64_t)a * g->pos_axis_stride + token);
        if (fabs(pos[a]) > max_pos)
            max_pos = fabs(pos[a]);
    }
    if (!theta) { /* libm, theta by theta: lmk_cpu_sincos's scalar level, element for element */
        for (size_t i = 0; i < n; i++) {
            const double t = pos[axis[i]] * freq[i];
            lmk_cpu_sincos(LMK_CPU_SCALAR, &t, c + i, s + i, 1, g->mscale);
        }
        return;
    }
    const size_t n8 = (n + 7) / 8 * 8;
    for (size_t i = 0; i < n8; i++)
        theta[i] = pos[axis[i]] * freq[i];
    /* |theta| <= max_pos * max_freq; NaN or inf there (an infinite freq) fails the test */
    if (!(max_pos * max_freq <= LMK_CPU_SINCOS_VECTOR_MAX))
        isa = LMK_CPU_SCALAR;
    lmk_cpu_sincos(isa, theta, c, s, isa == LMK_CPU_SCALAR ? n : n8, g->mscale);
}

void lmk_rope_cpu_angles(lmk_cpu_isa isa, const lmk_rope_angle *g, size_t token, const unsigned char *restrict axis,
                         const double *restrict freq, double max_freq, size_t n, double *restrict theta,
                         float *restrict c, float *restrict s)
{
    angles(isa, g, token, axis, freq, max_freq, n, theta, c, s);
}

/* ---- rows: scalar ---- */

LMK_INLINE float load_scalar(lmk_dtype dt, const unsigned char *p)
{
    if (dt == LMK_F32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    if (dt == LMK_F16)
        return lmk_f16_to_f32(h);
    const uint32_t u = (uint32_t)h << 16; /* bf16 inline: lmk_bf16_to_f32 is a call per element */
    float f;
    memcpy(&f, &u, 4);
    return f;
}

LMK_INLINE void store_scalar(lmk_dtype dt, unsigned char *p, float f)
{
    if (dt == LMK_F32) {
        memcpy(p, &f, 4);
        return;
    }
    uint16_t h;
    if (dt == LMK_F16) {
        h = lmk_f32_to_f16(f);
    } else { /* lmk_f32_to_bf16, inline */
        uint32_t u;
        memcpy(&u, &f, 4);
        h = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    memcpy(p, &h, 2);
}

/* Pair i's a at ia + i*step, its b at ib + i*step (step: es split, 2*es interleaved). */
LMK_INLINE void rotate_scalar_dt(lmk_dtype dt, size_t step, const unsigned char *ia, const unsigned char *ib,
                                 unsigned char *oa, unsigned char *ob, const float *c, const float *s, size_t i0,
                                 size_t n)
{
    for (size_t i = i0; i < n; i++) {
        const float a = load_scalar(dt, ia + i * step), b = load_scalar(dt, ib + i * step);
        store_scalar(dt, oa + i * step, a * c[i] - b * s[i]);
        store_scalar(dt, ob + i * step, a * s[i] + b * c[i]);
    }
}

/* Rotates pairs [i0, n) of the chunk of one row: the portable path and the vector kernels' tails.
 * One loop per dtype and layout with a constant step, so f32 split pairs vectorise. */
static void rotate_scalar(lmk_dtype dt, int il, const unsigned char *ia, const unsigned char *ib, unsigned char *oa,
                          unsigned char *ob, const float *c, const float *s, size_t i0, size_t n)
{
    if (dt == LMK_F32)
        il ? rotate_scalar_dt(LMK_F32, 8, ia, ib, oa, ob, c, s, i0, n)
           : rotate_scalar_dt(LMK_F32, 4, ia, ib, oa, ob, c, s, i0, n);
    else if (dt == LMK_BF16)
        il ? rotate_scalar_dt(LMK_BF16, 4, ia, ib, oa, ob, c, s, i0, n)
           : rotate_scalar_dt(LMK_BF16, 2, ia, ib, oa, ob, c, s, i0, n);
    else
        il ? rotate_scalar_dt(LMK_F16, 4, ia, ib, oa, ob, c, s, i0, n)
           : rotate_scalar_dt(LMK_F16, 2, ia, ib, oa, ob, c, s, i0, n);
}

/* Copies row k's elements that no pair touches (split: [half, stride) and [stride + half,
 * head_dim), the first empty in the Hugging Face pairing; interleaved: [rope_dim, head_dim)). */
static inline void copy_gaps(const rope_rows *r, size_t k, int nt)
{
    for (int g = 0; g < 2; g++) {
        const size_t n = r->gap[g][1] - r->gap[g][0];
        unsigned char *o = r->out + k * r->out_rb + r->gap[g][0];
        const unsigned char *i = r->in + k * r->in_rb + r->gap[g][0];
        if (nt)
            lmk_cpu_stream_copy(o, i, n);
        else if (n)
            memcpy(o, i, n);
    }
}

/* In place only the rotated lines of a row are touched (a quarter of a Qwen row), a strided
 * pattern the hardware prefetchers serve poorly: loads wait on memory a row at a time.
 * Prefetching the pairs of the row ~16 KB ahead, with write intent since they will be stored,
 * keeps those loads off the critical path (the distance is not critical: docs/decisions.md,
 * "Prefetch only where the hardware prefetchers fall short"). Out of place the rows are read
 * whole, the hardware streams them, and prefetching buys nothing. The target walks the tensor's rows in (token, head)
 * order through the strides, so it never leaves the tensor. */
static inline void prefetch_row(rope_prefetch *f)
{
    if (!f->left)
        return;
    for (size_t l = 0; l < f->len; l += 64) {
        __builtin_prefetch(f->p + l, 1, 3);
        __builtin_prefetch(f->p + f->b_bytes + l, 1, 3); /* NORMAL: the same line again */
    }
    if (--f->left)
        f->p += ++f->head == f->heads ? (f->head = 0, f->tok_step) : f->head_step;
}

/* ---- rows: AVX-512 and AVX2. dt, nt and il are constants in every instantiation below. ---- */

#if LMK_CPU_X86
/* The pair loops are inlined into each instantiation when optimizing. At -O0 nothing is folded:
 * each inlined copy would keep every dtype branch's vector temporaries in its own stack slots (60
 * KB for the six copies of a layout), so they stay functions there and the stack bound holds. */
#ifdef __OPTIMIZE__
#define PAIRS_KERNEL LMK_INLINE
#else
#define PAIRS_KERNEL static
#endif

PAIRS_KERNEL LMK_TARGET_AVX512 __m512 load16(const unsigned char *p, lmk_dtype dt)
{
    if (dt == LMK_F32)
        return _mm512_loadu_ps(p);
    const __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)p);
    if (dt == LMK_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

PAIRS_KERNEL LMK_TARGET_AVX512 void store16(unsigned char *p, __m512 v, lmk_dtype dt, int nt)
{
    if (dt == LMK_F32) {
        if (nt)
            _mm512_stream_ps((float *)(void *)p, v);
        else
            _mm512_storeu_ps(p, v);
        return;
    }
    const __m256i h = dt == LMK_BF16 ? lmk_cpu_bf16_16(v) : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (nt)
        _mm256_stream_si256((__m256i *)(void *)p, h);
    else
        _mm256_storeu_si256((__m256i *)(void *)p, h);
}

/* Split pairs: *ya = a*c - b*s and *yb = a*s + b*c from 16 pairs' a's and b's and cos/sin at c
 * and s (each product of b rounded, then fused). The rotations below are steps of their own so
 * that at -O0 a kernel's frame does not hold every step's vector temporaries (lmk.h's stack
 * bound); when optimizing they are inlined (PAIRS_KERNEL). Same operations, same bits. */
PAIRS_KERNEL LMK_TARGET_AVX512 void rotate16(__m512 a, __m512 b, const float *c, const float *s, __m512 *ya, __m512 *yb)
{
    const __m512 cv = _mm512_loadu_ps(c), sv = _mm512_loadu_ps(s);
    *ya = _mm512_fmsub_ps(a, cv, _mm512_mul_ps(b, sv));
    *yb = _mm512_fmadd_ps(a, sv, _mm512_mul_ps(b, cv));
}

/* Adjacent pairs held as even (a) and odd (b) elements: a*c - b*s, and b*c + a*s with the product
 * of a rounded, as rotate_adjacent16's odd lanes. */
PAIRS_KERNEL LMK_TARGET_AVX512 void rotate16_adj(__m512 a, __m512 b, const float *c, const float *s, __m512 *ya,
                                               __m512 *yb)
{
    const __m512 cv = _mm512_loadu_ps(c), sv = _mm512_loadu_ps(s);
    *ya = _mm512_fmsub_ps(a, cv, _mm512_mul_ps(b, sv));
    *yb = _mm512_fmadd_ps(b, cv, _mm512_mul_ps(a, sv));
}

/* 8 adjacent pairs in element order (x: 16 elements): out = x * (c, c) + swap(x) * (-s, s) per
 * pair, with cos/sin duplicated into lane pairs; the even lanes are exactly rotate16's a*c - b*s. */
PAIRS_KERNEL LMK_TARGET_AVX512 __m512 rotate_adjacent16(__m512 x, const float *cs, const float *sn)
{
    const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i neg_even = _mm512_set1_epi64(0x80000000); /* sign bit of lanes 0, 2, 4, ... */
    const __m512 c = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(cs)));
    const __m512 s = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(sn)));
    const __m512 sa = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(s), neg_even));
    return _mm512_fmadd_ps(x, c, _mm512_mul_ps(_mm512_permute_ps(x, 0xB1), sa));
}

/* Split pairs, 16 at a time: a vector of a's against a vector of b's. Returns the pairs done. */
PAIRS_KERNEL LMK_TARGET_AVX512 size_t split16(lmk_dtype dt, int nt, size_t es, const unsigned char *ia,
                                            const unsigned char *ib, unsigned char *oa, unsigned char *ob,
                                            const float *cs, const float *sn, size_t n)
{
    size_t i = 0;
    __m512 ae, ao, be, bo, yae, yao, ybe, ybo;
    for (; dt == LMK_BF16 && i + 32 <= n; i += 32) { /* split8's even/odd steps on 32 pairs */
        lmk_cpu_bf16_widen_eo16(ia + 2 * i, &ae, &ao);
        lmk_cpu_bf16_widen_eo16(ib + 2 * i, &be, &bo);
        rotate16(ae, be, cs + i, sn + i, &yae, &ybe);
        rotate16(ao, bo, cs + i + 16, sn + i + 16, &yao, &ybo);
        lmk_cpu_store_bf16_eo16(oa + 2 * i, yae, yao, nt);
        lmk_cpu_store_bf16_eo16(ob + 2 * i, ybe, ybo, nt);
    }
    for (; i + 16 <= n; i += 16) {
        rotate16(load16(ia + i * es, dt), load16(ib + i * es, dt), cs + i, sn + i, &yae, &ybe);
        store16(oa + i * es, yae, dt, nt);
        store16(ob + i * es, ybe, dt, nt);
    }
    return i;
}

/* Adjacent pairs, 8 (16 elements) at a time (rotate_adjacent16); bf16 16 pairs a step in even/odd
 * order. */
PAIRS_KERNEL LMK_TARGET_AVX512 size_t adjacent16(lmk_dtype dt, int nt, size_t es, const unsigned char *ia,
                                               unsigned char *oa, const float *cs, const float *sn, size_t n)
{
    size_t i = 0;
    __m512 a, b, ya, yb;
    for (; dt == LMK_BF16 && i + 16 <= n; i += 16) { /* elements 2i .. 2i + 32: a the even ones, b the odd */
        lmk_cpu_bf16_widen_eo16(ia + 4 * i, &a, &b);
        rotate16_adj(a, b, cs + i, sn + i, &ya, &yb);
        lmk_cpu_store_bf16_eo16(oa + 4 * i, ya, yb, nt);
    }
    for (; i + 8 <= n; i += 8)
        store16(oa + 2 * i * es, rotate_adjacent16(load16(ia + 2 * i * es, dt), cs + i, sn + i), dt, nt);
    return i;
}

LMK_INLINE LMK_TARGET_AVX512 void rows16(lmk_dtype dt, int nt, int il, size_t es, const rope_rows *r)
{
    rope_prefetch pf = r->pf;
    for (size_t k = 0; k < r->n_rows; k++) {
        if (r->prefetch)
            prefetch_row(&pf);
        const unsigned char *ia = r->in + k * r->in_rb + r->a0, *ib = ia + r->b_bytes;
        unsigned char *oa = r->out + k * r->out_rb + r->a0, *ob = oa + r->b_bytes;
        const size_t i = il ? adjacent16(dt, nt, es, ia, oa, r->c, r->s, r->n)
                            : split16(dt, nt, es, ia, ib, oa, ob, r->c, r->s, r->n);
        if (i < r->n) /* never with nt: its segments are whole cache lines */
            rotate_scalar(dt, il, ia, ib, oa, ob, r->c, r->s, i, r->n);
        if (r->copy)
            copy_gaps(r, k, nt);
    }
}

LMK_TARGET_AVX512 static void rows_avx512_split(lmk_dtype dt, const rope_rows *r)
{
    if (dt == LMK_F32)
        r->nt ? rows16(LMK_F32, 1, 0, 4, r) : rows16(LMK_F32, 0, 0, 4, r);
    else if (dt == LMK_BF16)
        r->nt ? rows16(LMK_BF16, 1, 0, 2, r) : rows16(LMK_BF16, 0, 0, 2, r);
    else
        r->nt ? rows16(LMK_F16, 1, 0, 2, r) : rows16(LMK_F16, 0, 0, 2, r);
}

LMK_TARGET_AVX512 static void rows_avx512_adjacent(lmk_dtype dt, const rope_rows *r)
{
    if (dt == LMK_F32)
        r->nt ? rows16(LMK_F32, 1, 1, 4, r) : rows16(LMK_F32, 0, 1, 4, r);
    else if (dt == LMK_BF16)
        r->nt ? rows16(LMK_BF16, 1, 1, 2, r) : rows16(LMK_BF16, 0, 1, 2, r);
    else
        r->nt ? rows16(LMK_F16, 1, 1, 2, r) : rows16(LMK_F16, 0, 1, 2, r);
}

PAIRS_KERNEL LMK_TARGET_AVX2 __m256 load8(const unsigned char *p, lmk_dtype dt)
{
    if (dt == LMK_F32)
        return _mm256_loadu_ps((const float *)(const void *)p);
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    if (dt == LMK_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

PAIRS_KERNEL LMK_TARGET_AVX2 void store8(unsigned char *p, __m256 v, lmk_dtype dt, int nt)
{
    if (dt == LMK_F32) {
        if (nt)
            _mm256_stream_ps((float *)(void *)p, v);
        else
            _mm256_storeu_ps((float *)(void *)p, v);
        return;
    }
    const __m128i h = dt == LMK_BF16 ? lmk_cpu_bf16_8(v) : _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (nt)
        _mm_stream_si128((__m128i *)(void *)p, h);
    else
        _mm_storeu_si128((__m128i *)(void *)p, h);
}

/* The rotated a's and b's of split pairs [i, i + 8): a*c - b*s and a*s + b*c. */
typedef struct rot8 {
    __m256 a, b;
} rot8;

PAIRS_KERNEL LMK_TARGET_AVX2 rot8 split_step8(lmk_dtype dt, size_t es, const unsigned char *ia, const unsigned char *ib,
                                             const float *cs, const float *sn, size_t i)
{
    const __m256 a = load8(ia + i * es, dt), b = load8(ib + i * es, dt);
    const __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(sn + i);
    return (rot8){_mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)), _mm256_fmadd_ps(a, s, _mm256_mul_ps(b, c))};
}

/* Adjacent pairs [i, i + 4) (elements 2i .. 2i + 8): x * (c, c) + swap(x) * (-s, s) per pair,
 * cos/sin duplicated into lane pairs; the even lanes are exactly split_step8's a*c - b*s. */
PAIRS_KERNEL LMK_TARGET_AVX2 __m256 adjacent_step8(lmk_dtype dt, size_t es, const unsigned char *ia, const float *cs,
                                                  const float *sn, size_t i)
{
    const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    const __m256 neg_even = _mm256_castsi256_ps(_mm256_set1_epi64x(0x80000000));
    const __m256 x = load8(ia + 2 * i * es, dt);
    const __m256 c = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cs + i)), dup);
    const __m256 s = _mm256_xor_ps(_mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sn + i)), dup), neg_even);
    return _mm256_fmadd_ps(x, c, _mm256_mul_ps(_mm256_permute_ps(x, 0xB1), s));
}

/* bf16 goes 16 pairs (split) or 8 (adjacent, 16 elements) a step in even/odd order
 * (cpu/bf16_simd.h): each 16 values are one 32-byte load, widened to their even and odd elements
 * without a shuffle, and leave as one 32-byte store (a streamed segment starts on a cache line, so
 * those stores are aligned). Split pairs meet cos/sin lane by lane, so rope_task puts each whole
 * 16 of the token's table in that order (eo_table); adjacent pairs are the even and odd elements
 * themselves and read the table as it is. Each value meets the same operands in the same order
 * as in split_step8 / adjacent_step8: the same bits. The 8-lane steps take the rest (the table's
 * tail stays in pair order) and the other dtypes. */
PAIRS_KERNEL LMK_TARGET_AVX2 size_t split8(lmk_dtype dt, int nt, size_t es, const unsigned char *ia,
                                         const unsigned char *ib, unsigned char *oa, unsigned char *ob,
                                         const float *cs, const float *sn, size_t n)
{
    size_t i = 0;
    for (; dt == LMK_BF16 && i + 16 <= n; i += 16) {
        __m256 ae, ao, be, bo;
        lmk_cpu_bf16_widen_eo(ia + 2 * i, &ae, &ao);
        lmk_cpu_bf16_widen_eo(ib + 2 * i, &be, &bo);
        const __m256 ce = _mm256_loadu_ps(cs + i), co = _mm256_loadu_ps(cs + i + 8);
        const __m256 se = _mm256_loadu_ps(sn + i), so = _mm256_loadu_ps(sn + i + 8);
        lmk_cpu_store_bf16_eo(oa + 2 * i, _mm256_fmsub_ps(ae, ce, _mm256_mul_ps(be, se)),
                              _mm256_fmsub_ps(ao, co, _mm256_mul_ps(bo, so)), nt);
        lmk_cpu_store_bf16_eo(ob + 2 * i, _mm256_fmadd_ps(ae, se, _mm256_mul_ps(be, ce)),
                              _mm256_fmadd_ps(ao, so, _mm256_mul_ps(bo, co)), nt);
    }
    for (; i + 8 <= n; i += 8) {
        const rot8 r0 = split_step8(dt, es, ia, ib, cs, sn, i);
        store8(oa + i * es, r0.a, dt, nt);
        store8(ob + i * es, r0.b, dt, nt);
    }
    return i;
}

PAIRS_KERNEL LMK_TARGET_AVX2 size_t adjacent8(lmk_dtype dt, int nt, size_t es, const unsigned char *ia,
                                            unsigned char *oa, const float *cs, const float *sn, size_t n)
{
    size_t i = 0;
    for (; dt == LMK_BF16 && i + 8 <= n; i += 8) { /* elements 2i .. 2i + 16: a the even ones, b the odd */
        __m256 a, b;
        lmk_cpu_bf16_widen_eo(ia + 4 * i, &a, &b);
        const __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(sn + i);
        lmk_cpu_store_bf16_eo(oa + 4 * i, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)), _mm256_fmadd_ps(b, c, _mm256_mul_ps(a, s)),
                              nt);
    }
    for (; i + 4 <= n; i += 4)
        store8(oa + 2 * i * es, adjacent_step8(dt, es, ia, cs, sn, i), dt, nt);
    return i;
}

LMK_INLINE LMK_TARGET_AVX2 void rows8(lmk_dtype dt, int nt, int il, size_t es, const rope_rows *r)
{
    rope_prefetch pf = r->pf;
    for (size_t k = 0; k < r->n_rows; k++) {
        if (r->prefetch)
            prefetch_row(&pf);
        const unsigned char *ia = r->in + k * r->in_rb + r->a0, *ib = ia + r->b_bytes;
        unsigned char *oa = r->out + k * r->out_rb + r->a0, *ob = oa + r->b_bytes;
        const size_t i = il ? adjacent8(dt, nt, es, ia, oa, r->c, r->s, r->n)
                            : split8(dt, nt, es, ia, ib, oa, ob, r->c, r->s, r->n);
        if (i < r->n)
            rotate_scalar(dt, il, ia, ib, oa, ob, r->c, r->s, i, r->n);
        if (r->copy)
            copy_gaps(r, k, nt);
    }
}

LMK_TARGET_AVX2 static void rows_avx2_split(lmk_dtype dt, const rope_rows *r)
{
    if (dt == LMK_F32)
        r->nt ? rows8(LMK_F32, 1, 0, 4, r) : rows8(LMK_F32, 0, 0, 4, r);
    else if (dt == LMK_BF16)
        r->nt ? rows8(LMK_BF16, 1, 0, 2, r) : rows8(LMK_BF16, 0, 0, 2, r);
    else
        r->nt ? rows8(LMK_F16, 1, 0, 2, r) : rows8(LMK_F16, 0, 0, 2, r);
}

/* The whole 16s of a token's split-pair table into even/odd order (split8's bf16 steps). */
LMK_TARGET_AVX2 static void eo_table(float *cs, float *sn, size_t n)
{
    for (size_t i = 0; i + 16 <= n; i += 16) {
        lmk_cpu_eo16(cs + i);
        lmk_cpu_eo16(sn + i);
    }
}

/* The same for split16's 32-pair steps. */
LMK_TARGET_AVX512 static void eo_table16(float *cs, float *sn, size_t n)
{
    for (size_t i = 0; i + 32 <= n; i += 32) {
        lmk_cpu_eo32(cs + i);
        lmk_cpu_eo32(sn + i);
    }
}

LMK_TARGET_AVX2 static void rows_avx2_adjacent(lmk_dtype dt, const rope_rows *r)
{
    if (dt == LMK_F32)
        r->nt ? rows8(LMK_F32, 1, 1, 4, r) : rows8(LMK_F32, 0, 1, 4, r);
    else if (dt == LMK_BF16)
        r->nt ? rows8(LMK_BF16, 1, 1, 2, r) : rows8(LMK_BF16, 0, 1, 2, r);
    else
        r->nt ? rows8(LMK_F16, 1, 1, 2, r) : rows8(LMK_F16, 0, 1, 2, r);
}
#endif

/* ---- runs of rows ---- */

static void rows_scalar(lmk_dtype dt, int il, const rope_rows *r)
{
    rope_prefetch pf = r->pf;
    for (size_t k = 0; k < r->n_rows; k++) {
        if (r->prefetch)
            prefetch_row(&pf);
        const unsigned char *ia = r->in + k * r->in_rb + r->a0;
        unsigned char *oa = r->out + k * r->out_rb + r->a0;
        rotate_scalar(dt, il, ia, ia + r->b_bytes, oa, oa + r->b_bytes, r->c, r->s, 0, r->n);
        if (r->copy)
            copy_gaps(r, k, 0);
    }
}

/* In place: where the prefetch of the run starting at (token, head) begins. */
static rope_prefetch make_prefetch(const rope_job *j, const rope_tensor_job *t, size_t token, size_t head, size_t a0,
                                   size_t n)
{
    const size_t h = head + t->ahead_head, wrap = h >= t->heads, ph = wrap ? h - t->heads : h;
    const size_t pt = token + t->ahead_tok + wrap, left = pt < j->seq ? (j->seq - pt) * t->heads - ph : 0;
    return (rope_prefetch){
        .p = left ? t->out + pt * t->out_tok + ph * t->out_head + a0 : NULL, .left = left,
        .head = ph, .heads = t->heads, .head_step = (ptrdiff_t)t->out_head,
        .tok_step = (ptrdiff_t)t->out_tok - (ptrdiff_t)((t->heads - 1) * t->out_head),
        .len = (j->interleaved ? 2 * n : n) * j->es, .b_bytes = j->interleaved ? 0 : j->stride * j->es,
    };
}

/* The run of heads [head, head + n_rows) of one token of tensor t, for pairs [p0, p0 + n). */
static void make_rows(rope_rows *r, const rope_job *j, const rope_tensor_job *t, const rope_table *tb, size_t token,
                      size_t head, size_t n_rows, size_t p0, size_t n, int copy)
{
    const size_t es = j->es, hd = j->head_dim * es, a0 = (j->interleaved ? 2 * p0 : p0) * es;
    const size_t b_bytes = j->stride * es, rot_end = 2 * j->half * es; /* interleaved: the rotated run */
    *r = (rope_rows){
        .in = t->in + token * t->in_tok + head * t->in_head,
        .out = t->out + token * t->out_tok + head * t->out_head,
        .n_rows = n_rows, .in_rb = t->in_head, .out_rb = t->out_head,
        .a0 = a0, .b_bytes = b_bytes, .n = n, .c = tb->cos, .s = tb->sin,
        .copy = copy && !t->in_place, .nt = t->stream, .prefetch = t->in_place,
    };
    if (j->interleaved) {
        r->gap[0][0] = r->gap[0][1] = rot_end;
        r->gap[1][0] = rot_end, r->gap[1][1] = hd;
    } else {
        r->gap[0][0] = j->half * es, r->gap[0][1] = b_bytes;
        r->gap[1][0] = b_bytes + j->half * es, r->gap[1][1] = hd;
    }
    if (t->in_place)
        r->pf = make_prefetch(j, t, token, head, a0, n);
}

/* Rotates pairs [p0, p0 + n) (n may be 0) of the rows [first, last) of one token, q heads first
 * then k heads, and copies their unrotated elements when `copy`. */
static void process_rows(const rope_job *j, const rope_table *tb, size_t token, size_t first, size_t last, size_t p0,
                         size_t n, int copy)
{
    size_t base = 0; /* first row of tensor ti within the token */
    for (int ti = 0; ti < j->n_tensors; base += j->t[ti].heads, ti++) {
        const rope_tensor_job *t = &j->t[ti];
        const size_t a = first > base ? first - base : 0, b = last - base < t->heads ? last - base : t->heads;
        if (last <= base || a >= b)
            continue;
        rope_rows r;
        make_rows(&r, j, t, tb, token, a, b - a, p0, n, copy);
#if LMK_CPU_X86
        if (j->isa == LMK_CPU_AVX512) {
            j->interleaved ? rows_avx512_adjacent(j->dtype, &r) : rows_avx512_split(j->dtype, &r);
            continue;
        }
        if (j->isa == LMK_CPU_AVX2) {
            j->interleaved ? rows_avx2_adjacent(j->dtype, &r) : rows_avx2_split(j->dtype, &r);
            continue;
        }
#endif
        rows_scalar(j->dtype, j->interleaved, &r);
    }
}

static void rope_task(void *ctx, int tid, int n_threads)
{
    const rope_job *j = ctx;
    const size_t rpt = j->rows_per_token;
    size_t lo, hi;
    lmk_cpu_share(j->seq * rpt, tid, n_threads, 1, &lo, &hi);
    if (lo >= hi)
        return;
    rope_table *const tb = lmk_cpu_scratch(j->s, tid);
    const int one_chunk = j->half <= PAIRS_PER_CHUNK;
    /* One pass per chunk of pairs; with a single chunk the copies ride along while the rows are
     * in L1, otherwise a last pass (n = 0 pairs) copies. */
    for (size_t p0 = 0; p0 < j->half || !one_chunk; p0 += PAIRS_PER_CHUNK) {
        const size_t n = p0 >= j->half ? 0 : j->half - p0 < PAIRS_PER_CHUNK ? j->half - p0 : PAIRS_PER_CHUNK;
        if (n)
            tb->max_freq = freqs(j->angle, p0, n, tb->axis, tb->freq);
        for (size_t row = lo; row < hi;) {
            const size_t token = row / rpt, first = row % rpt;
            const size_t last = hi - row < rpt - first ? first + (hi - row) : rpt;
            if (n)
                angles(j->isa, j->angle, token, tb->axis, tb->freq, tb->max_freq, n, tb->theta, tb->cos, tb->sin);
#if LMK_CPU_X86
            if (n && j->isa == LMK_CPU_AVX2 && j->dtype == LMK_BF16 && !j->interleaved)
                eo_table(tb->cos, tb->sin, n);
            if (n && j->isa == LMK_CPU_AVX512 && j->dtype == LMK_BF16 && !j->interleaved)
                eo_table16(tb->cos, tb->sin, n);
#endif
            process_rows(j, tb, token, first, last, p0, n, one_chunk || !n);
            row += last - first;
        }
        if (!n)
            break;
    }
    if (j->t[0].stream || j->t[1].stream)
        lmk_cpu_stream_fence();
}

/* Streaming stores need every vector store 64-byte aligned: the output, its token and head
 * strides (of axes longer than 1), both rotated segments (or NORMAL's rotated run) and the copied
 * gaps all start on a cache line and are whole lines long (true for all real model shapes). */
static int can_stream(const rope_job *j, const rope_tensor_job *t, size_t bytes)
{
    const size_t es = j->es;
    const int segs = j->interleaved ? (2 * j->half * es) % 64 == 0
                                    : (j->half * es) % 64 == 0 && (j->stride * es) % 64 == 0;
    const int lines = segs && (j->head_dim * es) % 64 == 0 && (uintptr_t)t->out % 64 == 0 &&
                      (j->seq == 1 || t->out_tok % 64 == 0) && (t->heads == 1 || t->out_head % 64 == 0);
    return j->isa != LMK_CPU_SCALAR && lines && !t->in_place && bytes >= 2 * LMK_CPU_STREAM_MIN_BYTES;
}

lmk_status lmk_cpu_rope(lmk_stream *s, const void *args)
{
    const lmk_rope_args *a = args;
    rope_job j = {
        .s = s,
        .isa = lmk_cpu_stream_isa(s),
        .dtype = a->dtype,
        .es = lmk_dtype_size(a->dtype),
        .head_dim = a->head_dim,
        .half = a->rope_dim / 2,
        .stride = a->pair_stride,
        .interleaved = a->interleaved,
        .seq = a->seq_len,
        .angle = &a->angle,
        .n_tensors = a->n_tensors,
    };
    size_t bytes = 0;
    for (int ti = 0; ti < a->n_tensors; ti++) {
        const lmk_rope_tensor *t = &a->t[ti];
        j.t[ti] = (rope_tensor_job){
            .in = t->in, .out = t->out, .heads = t->n_heads,
            .in_tok = t->in_tok * j.es, .in_head = t->in_head * j.es,
            .out_tok = t->out_tok * j.es, .out_head = t->out_head * j.es,
            .in_place = t->in == t->out,
        };
        const size_t ahead = (16384 + j.head_dim * j.es - 1) / (j.head_dim * j.es); /* rows */
        j.t[ti].ahead_tok = ahead / t->n_heads, j.t[ti].ahead_head = ahead % t->n_heads;
        bytes += 2 * j.seq * t->n_heads * j.head_dim * j.es;
    }
    j.rows_per_token = j.t[0].heads + j.t[1].heads;
    for (int ti = 0; ti < a->n_tensors; ti++)
        j.t[ti].stream = can_stream(&j, &j.t[ti], bytes);
    lmk_cpu_parallel(s, bytes, rope_task, &j);
    return LMK_OK;
}
