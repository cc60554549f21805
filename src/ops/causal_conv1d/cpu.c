/*
 * cpu.c - the CPU path of causal_conv1d (lmk.h, "causal_conv1d").
 *
 * Threads own channel ranges (multiples of GRAIN) across all sequences, so every element of x, y
 * and the state pool is touched by one thread only, and a thread runs the sequences of a channel
 * in call order: duplicate slots need no locking, and "the last sequence naming a row stores it,
 * every one reads the row as it was" holds exactly (src/ops/varlen.h). The split never changes a
 * result: each output element is a fixed formula of its inputs.
 *
 * A thread walks its channels in blocks and, per block, the sequences in order; a sequence's
 * block is computed from its last token back to its first. In that order y may be x (in place)
 * without a copy of the inputs: token t reads the rows t-(W-1)..t, all still inputs, since only
 * rows after t have been written. Per (sequence, block):
 *  1. the state row's W-1 rows of the block are copied (bits) to the stack (zeros without a row);
 *  2. when the sequence stores its row, the last W-1 rows of xx (state rows, then inputs) are
 *     written to it, before any input row is overwritten (rows from the old state come from the
 *     stack copy);
 *  3. the tokens, in tiles of TILE from the last: for each vector step of the block (32 channels
 *     at AVX-512, 16 at AVX2) one walk down the tile with the step's weights and bias and the
 *     window of its last W inputs in registers (one new xx row a token; the state copy supplies
 *     the rows before the sequence), prefetching the rows of the next walk.
 * Tiles keep the accesses near each other: a block's rows are cb channels a token stride apart
 * (pages apart in a prompt), and a walk down a whole column of them would take a TLB miss a row
 * and leave the hardware prefetchers nothing to follow; a tile's rows stay in the TLB and L1.
 *
 * Weights: short sequences (decode batches: fewer than TILE tokens a sequence on average) use the
 * block's weights and bias widened and transposed to [W][cb] f32 on the stack once per block and
 * group of SEQ_GROUP sequences (whose store flags the thread keeps in a bitset), and prefetch the
 * rows of the sequences ahead. Long ones take blocks of up to CB_MAX channels (the state copy's
 * size bounds them; 256 bf16 channels make 512-byte row segments) and gather each step's weights
 * per tile. Either way a lane gets the same f32 weight, so the bits do not depend on the path.
 *
 * Kernels: f32 arithmetic, bias + sum of weight * input in tap order (an FMA chain at the vector
 * levels, products and sums at the scalar level), SiLU as s / (1 + e^-s) with a true division,
 * rounded once to the dtype with lmk_f32_to_bf16's and lmk_f32_to_f16's rounding. bf16 steps are in
 * the even/odd order of cpu/bf16_simd.h (one load, no shuffle; weights and bias in that order).
 * e^-s is a polynomial after reduction by ln 2 (within about one f32 ulp; SiLU within three),
 * made of correctly rounded instructions only, so a level's bits do not depend on the CPU model.
 * Channels past the last whole step (C not a multiple of it) and the scalar level walk rows with
 * scalar arithmetic and libm's expf. Large outputs that are not x are written with streaming
 * stores where every step stores whole aligned cache lines.
 *
 * Stack: the block (the state copy and, for short sequences, the weights), the store bitset and
 * the kernels' spilled vectors: a few KB, inside lmk.h's bound (tests/test_causal_conv1d.c
 * measures a call).
 */
#include "cpu/bf16_simd.h"
#include "cpu/cpu.h"
#include "ops/causal_conv1d/causal_conv1d.h"
#include "ops/varlen.h"

#include <math.h>

/* Helpers of the kernels: inlined into each caller when optimizing (constant dtype and width fold
 * away); at -O0 functions of their own, so that the inlined copies' locals do not pile up in one
 * frame (lmk.h's stack bound holds for unoptimized builds too). */
#ifdef __OPTIMIZE__
#define CONV_STEP LMK_INLINE
#else
#define CONV_STEP static inline
#endif

#define MAX_W 8
#define GRAIN 256       /* channels of a thread share: a multiple of every block */
#define CB_MAX 256
#define S_BYTES 1536    /* long sequences: the state copy, (W-1) * cb * es */
#define S_SHORT 896     /* short ones: the state copy, (W-1) * cb * es for their cb (64, or 32 above width 4) */
#define W_FLOATS 256    /* short ones: the block's weights [W][cb] */
#define SEQ_GROUP 1024  /* sequences whose store flags a thread holds at once */
#define TILE 32         /* tokens of a walk; a walk prefetches the rows of the next */
#define SEQS_AHEAD 4    /* short sequences: rows prefetched this many sequences ahead */

/* One block of channels. Long sequences (conv_job.gather) need only the state copy; short ones
 * also hold the block's weights and bias, widened, in the kernel's lane order. */
typedef struct conv_block {
    union {
        _Alignas(64) unsigned char s_long[S_BYTES];
        struct {
            _Alignas(64) float w[W_FLOATS];
            _Alignas(64) float b[64];
            _Alignas(64) unsigned char s[S_SHORT];
        } d;
    } u;
    unsigned char *s;      /* the state row's W-1 rows of the block, [W-1][n] bits: u.s_long or u.d.s */
    size_t c0, n;          /* first channel, channels (<= cb) */
    size_t n_vec;          /* leading channels of whole vector steps */
} conv_block;

/* One sequence on one block: its first token's x and y rows at the block's first channel, the
 * token strides in bytes and its length. xx (its W-1 state rows, then its inputs) row v is k->s's
 * row v for v < W-1, else x row v - (W-1). */
typedef struct conv_seq {
    const unsigned char *x;
    unsigned char *y;
    size_t xs, ys, len;
} conv_seq;

typedef struct conv_job {
    const lmk_causal_conv1d_args *a;
    lmk_cpu_isa isa;
    size_t es, cb;
    size_t step;   /* channels of a vector step; 0 at the scalar level */
    bool eo;       /* bf16 at a vector level: a step's lanes in even/odd order */
    bool gather;   /* long sequences: a walk gathers its step's weights and bias from the operands;
                    * else they are the block's (vector levels; the scalar kernel reads the operands) */
    bool silu;
    bool pf_dst;   /* y is not x: prefetch its rows too */
    bool nt;       /* y is not x and large, and every vector step's store is whole aligned cache lines:
                    * streaming stores (no read of the lines it overwrites, no cache pollution) */
} conv_job;

typedef void (*conv_kernel)(const conv_job *j, const conv_block *k, const conv_seq *q);

/* xx row v of sequence q on block k, at the block's first channel. */
CONV_STEP const unsigned char *xx_row(const conv_block *k, const conv_seq *q, size_t W, size_t v, size_t es)
{
    return v < W - 1 ? k->s + v * k->n * es : q->x + (v - (W - 1)) * q->xs;
}

/* ---- the scalar kernel: the scalar level, and the channels past the last whole step ---- */

CONV_STEP float ld(lmk_dtype dt, const void *p, size_t i)
{
    if (dt == LMK_F32) {
        float f;
        memcpy(&f, (const unsigned char *)p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const unsigned char *)p + 2 * i, 2);
    return lmk_cpu_half_to_f32(dt, h);
}

CONV_STEP void st(lmk_dtype dt, unsigned char *p, size_t i, float v)
{
    if (dt == LMK_F32) {
        memcpy(p + 4 * i, &v, 4);
        return;
    }
    const uint16_t h = dt == LMK_BF16 ? lmk_f32_to_bf16(v) : lmk_f32_to_f16(v);
    memcpy(p + 2 * i, &h, 2);
}

/* Channels [c_from, k->n) of every token, from the last token back, a row at a time; weights and
 * bias read from the operands. */
CONV_STEP void rows_scalar_dt(lmk_dtype dt, const conv_job *j, const conv_block *k, const conv_seq *q, size_t c_from)
{
    const lmk_causal_conv1d_args *a = j->a;
    const size_t W = a->W, es = j->es;
    for (size_t t = q->len; t-- > 0;) {
        const unsigned char *r[MAX_W];
        for (size_t i = 0; i < W; i++) /* token t's window: xx rows t .. t + W-1 */
            r[i] = xx_row(k, q, W, t + i, es);
        unsigned char *y = q->y + t * q->ys;
        for (size_t c = c_from; c < k->n; c++) {
            const size_t ch = k->c0 + c;
            float acc = a->bias ? ld(a->bias_dtype, a->bias, ch) : 0.0f;
            for (size_t i = 0; i < W; i++)
                acc += ld(a->w_dtype, a->weight, ch * W + i) * ld(dt, r[i], c);
            st(dt, y, c, j->silu ? acc / (1.0f + expf(-acc)) : acc);
        }
    }
}

static void rows_scalar(const conv_job *j, const conv_block *k, const conv_seq *q, size_t c_from)
{
    if (j->a->dtype == LMK_F32)
        rows_scalar_dt(LMK_F32, j, k, q, c_from);
    else if (j->a->dtype == LMK_BF16)
        rows_scalar_dt(LMK_BF16, j, k, q, c_from);
    else
        rows_scalar_dt(LMK_F16, j, k, q, c_from);
}

static void kernel_scalar(const conv_job *j, const conv_block *k, const conv_seq *q)
{
    rows_scalar(j, k, q, 0);
}

#if LMK_CPU_X86
/* ---- e^-s and SiLU in vectors ----
 *
 * z = -s clamped to [EXP_LO, EXP_HI] (so 2^n is a normal f32: e^-s is then within a factor of
 * e^0.7 of its true value only where SiLU's result is below 1e-36 * |s| or is s itself), n =
 * z / ln 2 rounded to an integer (by adding and subtracting 1.5 * 2^23 in f32: nearest, ties to
 * even, in one FMA), r = z - n ln 2 in two steps (Cephes' split of ln 2), e^r by Cephes' expf
 * polynomial in Horner's form, times 2^n. A NaN s stays NaN through the division. */
#define EXP_LO -87.3f
#define EXP_HI 88.3f
#define LOG2E 1.44269504088896341f
#define ROUNDER 12582912.0f /* 1.5 * 2^23 */
#define LN2_HI 0.693359375f
#define LN2_LO -2.12194440e-4f
#define P0 1.9875691500e-4f
#define P1 1.3981999507e-3f
#define P2 8.3334519073e-3f
#define P3 4.1665795894e-2f
#define P4 1.6666665459e-1f
#define P5 5.0000001201e-1f

CONV_STEP LMK_TARGET_AVX512 __m512 silu16(__m512 s)
{
    const __m512 c = _mm512_min_ps(_mm512_max_ps(s, _mm512_set1_ps(-EXP_HI)), _mm512_set1_ps(-EXP_LO)); /* -z */
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(c, _mm512_set1_ps(-LOG2E), _mm512_set1_ps(ROUNDER)),
                                   _mm512_set1_ps(ROUNDER));
    __m512 r = _mm512_fnmsub_ps(n, _mm512_set1_ps(LN2_HI), c); /* z - n ln2_hi */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(P0), r, _mm512_set1_ps(P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f)); /* e^r */
    return _mm512_div_ps(s, _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_scalef_ps(p, n)));
}

/* silu16 with 8 lanes; 2^n from the rounded sum's bits (its low bits hold n + 2^22). */
CONV_STEP LMK_TARGET_AVX2 __m256 silu8(__m256 s)
{
    const __m256 c = _mm256_min_ps(_mm256_max_ps(s, _mm256_set1_ps(-EXP_HI)), _mm256_set1_ps(-EXP_LO)); /* -z */
    const __m256 t = _mm256_fmadd_ps(c, _mm256_set1_ps(-LOG2E), _mm256_set1_ps(ROUNDER));
    const __m256 n = _mm256_sub_ps(t, _mm256_set1_ps(ROUNDER));
    __m256 r = _mm256_fnmsub_ps(n, _mm256_set1_ps(LN2_HI), c); /* z - n ln2_hi */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(P0), r, _mm256_set1_ps(P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f)); /* e^r */
    const __m256i two_n = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(127 - 0x4B400000)), 23);
    return _mm256_div_ps(s, _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(p, _mm256_castsi256_ps(two_n))));
}

/* Prefetches the bytes [p, p + bytes). */
CONV_STEP void prefetch_bytes(const unsigned char *p, size_t bytes)
{
    for (size_t off = 0; off < bytes; off += 64)
        __builtin_prefetch(p + off, 0, 3);
}

/* The step of channels at c over tokens [t0, t1) of q, from t1 - 1 back (W a constant once
 * inlined), in registers: weights, bias, and the window of the last W inputs. It prefetches the
 * rows of the next walk (the next step of the tile, or the first step of the next tile: its
 * tokens are pf_shift before these, its channels at byte offset pf_off from the block's first),
 * a walk ahead: far enough to hide memory latency, near enough to stay in L1. The macro is the
 * body of both vector levels: V is the vector type, LANES its floats, LOAD/STORE a step of the
 * dtype, GATHER a step's weights and bias from the operands, VLOAD/FMADD/SILU the level's
 * intrinsics. */
#define WALK_BODY(V, LANES, LOAD, STORE, GATHER, VLOAD, FMADD, SILU)                                  \
    const size_t es = j->es, off = c * es, bytes = 2 * LANES * es;                                   \
    V wa[MAX_W], wb[MAX_W], xa[MAX_W], xb[MAX_W], ba, bb;                                            \
    if (j->gather) {                                                                                 \
        GATHER(j, k->c0 + c, W, wa, wb, &ba, &bb);                                                   \
    } else {                                                                                         \
        for (size_t i = 0; i < W; i++)                                                               \
            wa[i] = VLOAD(k->u.d.w + i * j->cb + c), wb[i] = VLOAD(k->u.d.w + i * j->cb + c + LANES);  \
        ba = VLOAD(k->u.d.b + c), bb = VLOAD(k->u.d.b + c + LANES);                                  \
    }                                                                                                \
    for (size_t i = 1; i < W; i++)                                                                   \
        LOAD(dt, xx_row(k, q, W, t1 - 1 + i, es) + off, &xa[i], &xb[i]);                             \
    for (size_t t = t1; t-- > t0;) { /* token t's window: xx rows t .. t + W-1 */                   \
        if (t >= pf_shift) { /* the next walk's x rows t0' - (W-1) .. t1' - 1, top down */           \
            prefetch_bytes(q->x + (t - pf_shift) * q->xs + pf_off, bytes);                           \
            if (j->pf_dst)                                                                           \
                prefetch_bytes(q->y + (t - pf_shift) * q->ys + pf_off, bytes);                       \
        }                                                                                            \
        for (size_t i = 1; t == t0 && i < W && t0 >= pf_shift + i; i++)                              \
            prefetch_bytes(q->x + (t0 - pf_shift - i) * q->xs + pf_off, bytes);                      \
        LOAD(dt, xx_row(k, q, W, t, es) + off, &xa[0], &xb[0]);                                      \
        V a = ba, b = bb;                                                                            \
        for (size_t i = 0; i < W; i++)                                                               \
            a = FMADD(wa[i], xa[i], a), b = FMADD(wb[i], xb[i], b);                                  \
        if (j->silu)                                                                                 \
            a = SILU(a), b = SILU(b);                                                                \
        STORE(dt, q->y + t * q->ys + off, a, b, j->nt);                                              \
        for (size_t i = W - 1; i > 0; i--)                                                           \
            xa[i] = xa[i - 1], xb[i] = xb[i - 1];                                                    \
    }

/* The walk for the call's width, a constant in each case. */
#define WALK_ARGS j, k, q, c, t0, t1, pf_shift, pf_off
#define WALK_CASES(fn)                    \
    switch (j->a->W) {                    \
    case 2: fn(dt, 2, WALK_ARGS); break;  \
    case 3: fn(dt, 3, WALK_ARGS); break;  \
    case 4: fn(dt, 4, WALK_ARGS); break;  \
    case 5: fn(dt, 5, WALK_ARGS); break;  \
    case 6: fn(dt, 6, WALK_ARGS); break;  \
    case 7: fn(dt, 7, WALK_ARGS); break;  \
    default: fn(dt, 8, WALK_ARGS); break; \
    }

/* ---- AVX-512: 32 channels a step, as vectors a and b (bf16: even and odd channels) ---- */

/* 32 consecutive elements of dtype dt at p, widened, in even/odd order when eo, else in order. */
CONV_STEP LMK_TARGET_AVX512 void load32_order(lmk_dtype dt, bool eo, const unsigned char *p, __m512 *a, __m512 *b)
{
    __m512 n0, n1;
    if (dt == LMK_BF16 && eo) {
        lmk_cpu_bf16_widen_eo16(p, a, b);
        return;
    }
    if (dt == LMK_F32) {
        n0 = _mm512_loadu_ps(p), n1 = _mm512_loadu_ps(p + 64);
    } else if (dt == LMK_F16) {
        n0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
        n1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p + 32)));
    } else {
        n0 = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)p)), 16));
        n1 = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p + 32))), 16));
    }
    if (!eo) {
        *a = n0, *b = n1;
        return;
    }
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    *a = _mm512_permutex2var_ps(n0, ie, n1);
    *b = _mm512_permutex2var_ps(n0, io, n1);
}

CONV_STEP LMK_TARGET_AVX512 void load32(lmk_dtype dt, const unsigned char *p, __m512 *a, __m512 *b)
{
    load32_order(dt, dt == LMK_BF16, p, a, b);
}

/* 32 results at p (streaming when nt: p is then 64-byte aligned). */
CONV_STEP LMK_TARGET_AVX512 void store32(lmk_dtype dt, unsigned char *p, __m512 a, __m512 b, bool nt)
{
    if (dt == LMK_F32 && nt) {
        _mm512_stream_ps((float *)(void *)p, a);
        _mm512_stream_ps((float *)(void *)(p + 64), b);
    } else if (dt == LMK_F32) {
        _mm512_storeu_ps(p, a);
        _mm512_storeu_ps(p + 64, b);
    } else if (dt == LMK_BF16) {
        lmk_cpu_store_bf16_eo16(p, a, b, nt);
    } else {
        const __m256i ha = _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i hb = _mm512_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        if (nt) {
            _mm512_stream_si512((void *)p, _mm512_inserti64x4(_mm512_castsi256_si512(ha), hb, 1));
        } else {
            _mm256_storeu_si256((__m256i *)(void *)p, ha);
            _mm256_storeu_si256((__m256i *)(void *)(p + 32), hb);
        }
    }
}

/* 16 weights of tap i, one per lane of `lane` (channels from base's): element lane * W + i of a
 * [channels, W] array. 16-bit elements are gathered as the 32-bit word that starts at them, except
 * for the last tap, which takes the word that ends at it: no word reaches past a channel's taps. */
CONV_STEP LMK_TARGET_AVX512 __m512 gather_tap16(lmk_dtype wdt, const void *base, __m512i lane, size_t W, size_t i)
{
    const __m512i row = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)W));
    if (wdt == LMK_F32)
        return _mm512_i32gather_ps(_mm512_add_epi32(row, _mm512_set1_epi32((int)i)), base, 4);
    const bool last = i + 1 == W;
    const __m512i g = _mm512_i32gather_epi32(_mm512_add_epi32(row, _mm512_set1_epi32((int)(last ? i - 1 : i))), base, 2);
    const __m512i h = last ? _mm512_srli_epi32(g, 16) : g; /* the element in the low half */
    if (wdt == LMK_F16)
        return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
}

/* The weights (wa, wb: W taps) and bias of the step of 32 channels from channel ch, in lane order. */
CONV_STEP LMK_TARGET_AVX512 void gather_step32(const conv_job *j, size_t ch, size_t W, __m512 *wa, __m512 *wb,
                                                __m512 *ba, __m512 *bb)
{
    const lmk_causal_conv1d_args *a = j->a;
    const __m512i la = j->eo ? _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
                             : _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i lb = _mm512_add_epi32(la, _mm512_set1_epi32(j->eo ? 1 : 16));
    const unsigned char *base = (const unsigned char *)a->weight + ch * W * lmk_dtype_size(a->w_dtype);
    for (size_t i = 0; i < W; i++) {
        wa[i] = gather_tap16(a->w_dtype, base, la, W, i);
        wb[i] = gather_tap16(a->w_dtype, base, lb, W, i);
    }
    *ba = *bb = _mm512_setzero_ps();
    if (a->bias)
        load32_order(a->bias_dtype, j->eo, (const unsigned char *)a->bias + ch * lmk_dtype_size(a->bias_dtype), ba,
                     bb);
}

CONV_STEP LMK_TARGET_AVX512 void walk512(lmk_dtype dt, size_t W, const conv_job *j, const conv_block *k,
                                          const conv_seq *q, size_t c, size_t t0, size_t t1, size_t pf_shift,
                                          size_t pf_off)
{
    WALK_BODY(__m512, 16, load32, store32, gather_step32, _mm512_load_ps, _mm512_fmadd_ps, silu16)
}

/* Every step of block k over sequence q, a tile of tokens at a time from the last. */
CONV_STEP LMK_TARGET_AVX512 void steps512(lmk_dtype dt, const conv_job *j, const conv_block *k,
                                           const conv_seq *q)
{
    for (size_t t1 = q->len, t0; t1 > 0; t1 = t0) {
        t0 = t1 > TILE ? t1 - TILE : 0;
        for (size_t c = 0; c < k->n_vec; c += 32) {
            const bool last = c + 32 >= k->n_vec;
            const size_t pf_shift = last ? TILE : 0, pf_off = last ? 0 : (c + 32) * j->es;
            WALK_CASES(walk512)
        }
    }
}

LMK_TARGET_AVX512 static void kernel_avx512(const conv_job *j, const conv_block *k, const conv_seq *q)
{
    if (j->a->dtype == LMK_F32)
        steps512(LMK_F32, j, k, q);
    else if (j->a->dtype == LMK_BF16)
        steps512(LMK_BF16, j, k, q);
    else
        steps512(LMK_F16, j, k, q);
    if (k->n_vec < k->n)
        rows_scalar(j, k, q, k->n_vec);
}

/* ---- AVX2: 16 channels a step, as vectors a and b (bf16: even and odd channels) ---- */

/* 8 bf16 or f16 values (the low halves of v's lanes) widened to f32. */
CONV_STEP LMK_TARGET_AVX2 __m256 widen_low8(lmk_dtype dt, __m256i v)
{
    if (dt == LMK_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    const __m256i m = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1)));
}

/* 16 consecutive elements of dtype dt at p, widened, in even/odd order when eo, else in order. */
CONV_STEP LMK_TARGET_AVX2 void load16_order(lmk_dtype dt, bool eo, const unsigned char *p, __m256 *a, __m256 *b)
{
    __m256 n0, n1;
    if (dt == LMK_BF16 && eo) {
        lmk_cpu_bf16_widen_eo(p, a, b);
        return;
    }
    if (dt == LMK_F32) {
        n0 = _mm256_loadu_ps((const float *)(const void *)p), n1 = _mm256_loadu_ps((const float *)(const void *)(p + 32));
    } else if (dt == LMK_F16) {
        n0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
        n1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 16)));
    } else {
        n0 = widen_low8(dt, _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)));
        n1 = widen_low8(dt, _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + 16))));
    }
    if (!eo) {
        *a = n0, *b = n1;
        return;
    }
    const __m256 e = _mm256_shuffle_ps(n0, n1, 0x88), o = _mm256_shuffle_ps(n0, n1, 0xDD); /* 0 2 8 10 | 4 6 12 14 */
    *a = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xD8));
    *b = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), 0xD8));
}

CONV_STEP LMK_TARGET_AVX2 void load16(lmk_dtype dt, const unsigned char *p, __m256 *a, __m256 *b)
{
    load16_order(dt, dt == LMK_BF16, p, a, b);
}

/* 16 results at p (streaming when nt, which only f32 steps, whole 64-byte lines, use). */
CONV_STEP LMK_TARGET_AVX2 void store16(lmk_dtype dt, unsigned char *p, __m256 a, __m256 b, bool nt)
{
    if (dt == LMK_F32 && nt) {
        _mm256_stream_ps((float *)(void *)p, a);
        _mm256_stream_ps((float *)(void *)(p + 32), b);
    } else if (dt == LMK_F32) {
        _mm256_storeu_ps((float *)(void *)p, a);
        _mm256_storeu_ps((float *)(void *)(p + 32), b);
    } else if (dt == LMK_BF16) {
        lmk_cpu_store_bf16_eo(p, a, b, 0);
    } else {
        _mm_storeu_si128((__m128i *)(void *)p, _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm_storeu_si128((__m128i *)(void *)(p + 16), _mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
}

/* gather_tap16 with 8 lanes. */
CONV_STEP LMK_TARGET_AVX2 __m256 gather_tap8(lmk_dtype wdt, const void *base, __m256i lane, size_t W, size_t i)
{
    const __m256i row = _mm256_mullo_epi32(lane, _mm256_set1_epi32((int)W));
    if (wdt == LMK_F32)
        return _mm256_i32gather_ps((const float *)base, _mm256_add_epi32(row, _mm256_set1_epi32((int)i)), 4);
    const bool last = i + 1 == W;
    const __m256i g =
        _mm256_i32gather_epi32((const int *)base, _mm256_add_epi32(row, _mm256_set1_epi32((int)(last ? i - 1 : i))), 2);
    return widen_low8(wdt, last ? _mm256_srli_epi32(g, 16) : g);
}

/* gather_step32 for a step of 16 channels. */
CONV_STEP LMK_TARGET_AVX2 void gather_step16(const conv_job *j, size_t ch, size_t W, __m256 *wa, __m256 *wb,
                                              __m256 *ba, __m256 *bb)
{
    const lmk_causal_conv1d_args *a = j->a;
    const __m256i la = j->eo ? _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14) : _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i lb = _mm256_add_epi32(la, _mm256_set1_epi32(j->eo ? 1 : 8));
    const unsigned char *base = (const unsigned char *)a->weight + ch * W * lmk_dtype_size(a->w_dtype);
    for (size_t i = 0; i < W; i++) {
        wa[i] = gather_tap8(a->w_dtype, base, la, W, i);
        wb[i] = gather_tap8(a->w_dtype, base, lb, W, i);
    }
    *ba = *bb = _mm256_setzero_ps();
    if (a->bias)
        load16_order(a->bias_dtype, j->eo, (const unsigned char *)a->bias + ch * lmk_dtype_size(a->bias_dtype), ba,
                     bb);
}

CONV_STEP LMK_TARGET_AVX2 void walk256(lmk_dtype dt, size_t W, const conv_job *j, const conv_block *k,
                                        const conv_seq *q, size_t c, size_t t0, size_t t1, size_t pf_shift,
                                        size_t pf_off)
{
    WALK_BODY(__m256, 8, load16, store16, gather_step16, _mm256_load_ps, _mm256_fmadd_ps, silu8)
}

/* Every step of block k over sequence q, a tile of tokens at a time from the last. */
CONV_STEP LMK_TARGET_AVX2 void steps256(lmk_dtype dt, const conv_job *j, const conv_block *k,
                                           const conv_seq *q)
{
    for (size_t t1 = q->len, t0; t1 > 0; t1 = t0) {
        t0 = t1 > TILE ? t1 - TILE : 0;
        for (size_t c = 0; c < k->n_vec; c += 16) {
            const bool last = c + 16 >= k->n_vec;
            const size_t pf_shift = last ? TILE : 0, pf_off = last ? 0 : (c + 16) * j->es;
            WALK_CASES(walk256)
        }
    }
}

LMK_TARGET_AVX2 static void kernel_avx2(const conv_job *j, const conv_block *k, const conv_seq *q)
{
    if (j->a->dtype == LMK_F32)
        steps256(LMK_F32, j, k, q);
    else if (j->a->dtype == LMK_BF16)
        steps256(LMK_BF16, j, k, q);
    else
        steps256(LMK_F16, j, k, q);
    if (k->n_vec < k->n)
        rows_scalar(j, k, q, k->n_vec);
}

#endif /* LMK_CPU_X86 */

/* ---- blocks, sequences, threads ---- */

/* The channel (from the block's first) held by lane position p of the kernel's order. */
static size_t lane_channel(const conv_job *j, const conv_block *k, size_t p)
{
    if (!j->eo || p >= k->n_vec)
        return p;
    const size_t base = p / j->step * j->step, q = p % j->step, half = j->step / 2;
    return base + (q < half ? 2 * q : 2 * (q - half) + 1);
}

/* Channels [c0, c0 + n); short sequences at a vector level: the weights [W][cb] and bias, widened,
 * in the kernel's lane order. */
static void block_load(const conv_job *j, size_t c0, size_t n, conv_block *k)
{
    const lmk_causal_conv1d_args *a = j->a;
    k->c0 = c0, k->n = n;
    k->n_vec = j->step ? n / j->step * j->step : 0;
    k->s = j->gather ? k->u.s_long : k->u.d.s;
    if (j->gather || !j->step)
        return;
    for (size_t p = 0; p < k->n_vec; p++) {
        const size_t c = c0 + lane_channel(j, k, p);
        for (size_t i = 0; i < a->W; i++)
            k->u.d.w[i * j->cb + p] = ld(a->w_dtype, a->weight, c * a->W + i);
        k->u.d.b[p] = a->bias ? ld(a->bias_dtype, a->bias, c) : 0.0f;
    }
}

/* Copies n elements of es bytes from src (element stride s_st) to dst (stride d_st). */
static void copy_elems(unsigned char *dst, size_t d_st, const unsigned char *src, size_t s_st, size_t n, size_t es)
{
    if (d_st == 1 && s_st == 1) {
        memcpy(dst, src, n * es);
        return;
    }
    for (size_t c = 0; c < n; c++)
        memcpy(dst + c * d_st * es, src + c * s_st * es, es);
}

/* The block's W-1 rows of state row `row` into k->s (zeros without a row). */
static void state_load(const conv_job *j, conv_block *k, int64_t row)
{
    const lmk_causal_conv1d_args *a = j->a;
    const size_t es = j->es, n = k->n;
    if (row < 0) {
        memset(k->s, 0, (a->W - 1) * n * es);
        return;
    }
    const unsigned char *base = (const unsigned char *)a->state + ((size_t)row * a->st_slot + k->c0 * a->st_ch) * es;
    for (size_t i = 0; i + 1 < a->W; i++)
        copy_elems(k->s + i * n * es, 1, base + i * a->st_row * es, a->st_ch, n, es);
}

/* The block's part of the new state row: the last W-1 rows of xx (the old rows in k->s, then the
 * len inputs from token lo), from x before any of its rows is overwritten. */
static void state_store(const conv_job *j, const conv_block *k, int64_t row, size_t lo, size_t len)
{
    const lmk_causal_conv1d_args *a = j->a;
    const size_t es = j->es, n = k->n, W = a->W;
    unsigned char *base = (unsigned char *)a->state + ((size_t)row * a->st_slot + k->c0 * a->st_ch) * es;
    for (size_t i = 0; i + 1 < W; i++) {
        const size_t v = len + i; /* its index in xx */
        const unsigned char *src = v >= W - 1 ? (const unsigned char *)a->x + ((lo + v - (W - 1)) * a->x_tok + k->c0) * es
                                              : k->s + v * n * es;
        copy_elems(base + i * a->st_row * es, a->st_ch, src, 1, n, es);
    }
}

/* Short sequences: the block's state rows and last input rows of sequence s, ahead of its turn. */
static void prefetch_seq(const conv_job *j, const conv_block *k, size_t s)
{
    const lmk_causal_conv1d_args *a = j->a;
    const size_t es = j->es, W = a->W;
    size_t lo, hi;
    lmk_seq_bounds(a->cu_seqlens, a->cu_is64, s, a->T, &lo, &hi);
    const int64_t row = lmk_seq_slot(a->slots, a->slots_is64, s, a->state ? a->n_slots : 0);
    const size_t span = ((k->n - 1) * a->st_ch + 1) * es; /* one state row of the block */
    for (size_t i = 0; row >= 0 && i + 1 < W && span <= 4096; i++) {
        const unsigned char *p = (const unsigned char *)a->state + ((size_t)row * a->st_slot + i * a->st_row + k->c0 * a->st_ch) * es;
        for (size_t off = 0; off < span; off += 64)
            __builtin_prefetch(p + off, 0, 3);
    }
    for (size_t t = hi > lo + W ? hi - W : lo; t < hi; t++)
        for (size_t off = 0; off < k->n * es; off += 64)
            __builtin_prefetch((const unsigned char *)a->x + (t * a->x_tok + k->c0) * es + off, 0, 3);
}

/* Sequence s on block k: its state row, then its tokens (the kernel walks them from the last). */
static void run_seq(const conv_job *j, conv_kernel kern, conv_block *k, size_t s, bool stores)
{
    const lmk_causal_conv1d_args *a = j->a;
    const size_t es = j->es;
    size_t lo, hi;
    lmk_seq_bounds(a->cu_seqlens, a->cu_is64, s, a->T, &lo, &hi);
    if (lo == hi)
        return; /* the row stays as it was */
    const int64_t row = lmk_seq_slot(a->slots, a->slots_is64, s, a->state ? a->n_slots : 0);
    state_load(j, k, row);
    if (row >= 0 && stores)
        state_store(j, k, row, lo, hi - lo);
    const conv_seq q = {.x = (const unsigned char *)a->x + (lo * a->x_tok + k->c0) * es,
                        .y = (unsigned char *)a->y + (lo * a->y_tok + k->c0) * es, .xs = a->x_tok * es,
                        .ys = a->y_tok * es, .len = hi - lo};
    kern(j, k, &q);
}

/* Bit s - s0 of flags: whether sequence s stores its row (lmk_seq_stores), for s in [s0, s1). */
static void store_flags(const lmk_causal_conv1d_args *a, size_t s0, size_t s1, uint64_t *flags)
{
    const size_t n_slots = a->state ? a->n_slots : 0;
    memset(flags, 0, SEQ_GROUP / 8);
    for (size_t s = s0; s < s1; s++) {
        const int64_t row = lmk_seq_slot(a->slots, a->slots_is64, s, n_slots);
        if (lmk_seq_stores(a->slots, a->slots_is64, s, a->n_seq, n_slots, row))
            flags[(s - s0) / 64] |= (uint64_t)1 << ((s - s0) % 64);
    }
}

static conv_kernel kernel_of(const conv_job *j)
{
#if LMK_CPU_X86
    if (j->isa == LMK_CPU_AVX512)
        return kernel_avx512;
    if (j->isa == LMK_CPU_AVX2)
        return kernel_avx2;
#endif
    (void)j;
    return kernel_scalar;
}

static void conv_task(void *ctx, int tid, int n_threads)
{
    const conv_job *j = ctx;
    const lmk_causal_conv1d_args *a = j->a;
    size_t lo, hi;
    lmk_cpu_share(a->C, tid, n_threads, GRAIN, &lo, &hi);
    if (lo >= hi)
        return;
    const conv_kernel kern = kernel_of(j);
    conv_block k;
    uint64_t flags[SEQ_GROUP / 64];
    for (size_t s0 = 0; s0 < a->n_seq; s0 += SEQ_GROUP) {
        const size_t s1 = a->n_seq - s0 < SEQ_GROUP ? a->n_seq : s0 + SEQ_GROUP;
        store_flags(a, s0, s1, flags);
        for (size_t c0 = lo; c0 < hi; c0 += j->cb) {
            block_load(j, c0, hi - c0 < j->cb ? hi - c0 : j->cb, &k);
            for (size_t s = s0; s < s1; s++) {
                if (!j->gather && s + SEQS_AHEAD < s1)
                    prefetch_seq(j, &k, s + SEQS_AHEAD);
                run_seq(j, kern, &k, s, flags[(s - s0) / 64] >> ((s - s0) % 64) & 1);
            }
        }
    }
    if (j->nt)
        lmk_cpu_stream_fence();
}

/* The block width: long sequences at a vector level the widest (<= CB_MAX) whose state copy fits
 * S_BYTES; otherwise 64 channels (32 above width 4), whose weights fit W_FLOATS and state copy
 * S_SHORT. */
static size_t block_channels(const conv_job *j)
{
    const size_t W = j->a->W;
    if (!j->gather)
        return W <= 4 ? 64 : 32;
    size_t cb = CB_MAX;
    while (cb > 32 && (W - 1) * cb * j->es > S_BYTES)
        cb /= 2;
    return cb;
}

_Static_assert(4 * 64 <= W_FLOATS && 8 * 32 <= W_FLOATS && 3 * 64 * 4 <= S_SHORT && 7 * 32 * 4 <= S_SHORT &&
                   7 * 32 * 4 <= S_BYTES,
               "the short sequences' blocks and the narrowest long ones fit their arrays");

lmk_status lmk_cpu_causal_conv1d(lmk_stream *s, const void *args)
{
    const lmk_causal_conv1d_args *a = args;
    conv_job j = {.a = a, .isa = lmk_cpu_stream_isa(s), .es = lmk_dtype_size(a->dtype),
                  .silu = a->act == LMK_ACT_SILU};
#if LMK_CPU_X86
    j.step = j.isa == LMK_CPU_AVX512 ? 32 : j.isa == LMK_CPU_AVX2 ? 16 : 0;
#endif
    j.eo = j.step && a->dtype == LMK_BF16;
    const size_t out_bytes = a->T * a->C * j.es, step_bytes = j.step * j.es;
    j.nt = !a->in_place && out_bytes >= LMK_CPU_STREAM_MIN_BYTES && step_bytes && step_bytes % 64 == 0 &&
           (uintptr_t)a->y % 64 == 0 && (a->T == 1 || a->y_tok * j.es % 64 == 0);
    j.pf_dst = !a->in_place && !j.nt;
    j.gather = j.step && a->T >= (size_t)TILE * a->n_seq;
    j.cb = block_channels(&j);
    const size_t state_bytes = 2 * a->n_seq * (a->W - 1) * a->C * j.es;
    lmk_cpu_parallel(s, 2 * out_bytes + (a->state ? state_bytes : 0), conv_task, &j);
    return LMK_OK;
}
