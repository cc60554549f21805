/*
 * cpu_chunk.c - the chunked form of gated_delta_rule on the CPU (cpu_chunk.h states the math; the
 * driver is cpu.c): a chunk's tile products in f32 at each instruction-set level.
 *
 * A prompt's token-by-token recurrence reads and writes the whole [dk, dv] state once a token, 4
 * FMA-unit ops an element, as a chain of dependent passes; the chunked form spends about as many
 * multiply-adds but as register-blocked matrix products (Kn S, Qn S, Kn Kn^T, Qn Kn^T, Kn^T U) in
 * which each loaded element meets many others, plus two triangular row sweeps (the forward
 * substitution and Mqk U). Every product is one kernel, mm: C = init + A B, A read by broadcasts,
 * B and C by vectors along their rows, MR rows by NV vectors of accumulators, the B panel (K x NV
 * vectors) reused from L1 by every block of rows. Sums over k run in k order in one chain per
 * accumulator, so a level gives the same bits for any thread count.
 *
 * Levels: one macro (CHUNK_LEVEL) writes the kernels over a vector type of W floats and its
 * load/store/broadcast/FMA primitives: AVX-512 (W 16, 8 x 2 vectors: 16 accumulators), AVX2 (W 8,
 * 4 x 2) and scalar (W 1, plain C without FMA, as the token form's scalar level). The driver of a
 * chunk (lmk_gdn_cpu_chunk_run) is written once and calls the level's kernels through a table.
 *
 * Padding. Head rows are rounded up to 16 (dk) and 32 (dv) floats, the chunk's rows to MR_PAD, its
 * columns (tokens) to 32, with zeros where a product reads them, so no kernel has a remainder: a
 * short final chunk is computed on zero rows whose results are never used, and no padding token's
 * decay enters anything (S' uses the last real token's products).
 */
#include "ops/gated_delta_rule/cpu_chunk.h"

enum {
    MR_PAD = 8,   /* chunk rows computed in blocks of this many (every level's MR divides it) */
    COL_PAD = 32, /* dv and the token columns rounded up to this (every level's mm panel divides it) */
    K_PAD = 16    /* dk rounded up to this */
};

LMK_INLINE size_t round_up(size_t n, size_t m)
{
    return (n + m - 1) / m * m;
}

/* C = init + A B over M x N (M a multiple of the level's MR, N of its panel): A[m][k] at
 * A[m * lda + k], B[k][n] at B[k * ldb + n], C[m][n] at C[m * ldc + n]; init is
 * scale[m * scale_step] * C, or 0 without scale. lower: blocks whose first column is past their
 * last row are skipped (only the lower triangle is wanted). */
typedef struct mm_args {
    size_t M, N, K;
    const float *A;
    size_t lda;
    const float *B;
    size_t ldb;
    float *C;
    size_t ldc;
    const float *scale;
    size_t scale_step;
    int lower;
    void (*tick)(void *ctx); /* once per block of rows, or NULL */
    void *tick_ctx;
} mm_args;

/* A level's kernels (CHUNK_LEVEL) and the panel width of its mm in floats. */
typedef struct chunk_ops {
    void (*mm)(const mm_args *g);
    void (*comb)(float *dst, float s, const float *c, const float *X, size_t ldx, size_t n, size_t N);
    void (*resid)(float *x, const float *v, float e, float beta, size_t N);
    void (*scale)(float *x, float s, size_t N);
    void (*decay_row)(float *drow, size_t i, float decay, float beta, float *kk, float *qk);
    size_t panel;
} chunk_ops;

/* The kernels of one level P: vector type P##_v of W floats, primitives P##_ld, _st, _set (a
 * broadcast), _fma (a * b + c), _mul; mm blocks of MR rows x NV vectors; comb panels of PV vectors
 * (TV for the last 32 floats of a row when PV * W does not divide it).
 *
 *  mm         see mm_args.
 *  comb       dst = s * dst + sum_{j < n} c[j] X[j] over N floats (X rows ldx apart): the forward
 *             substitution (c = -A row, s = 1: rows j < i are final) and O (c = Mqk row, s = eg_i).
 *  resid      x = beta * (v - e * x): the right-hand side diag(beta) (V - diag(eg) Kn S).
 *  scale      x = s * x.
 *  decay_row  row i of D from row i - 1 in drow (zeros past i - 1), then -A and Mqk of row i in
 *             place of Kn Kn^T and Qn Kn^T, over the vectors holding columns 0..i (their other
 *             columns are never read). */
#define CHUNK_LEVEL(P, TGT, W, MR, NV, PV, TV)                                                                      \
    static TGT void P##_mm(const mm_args *g)                                                                        \
    {                                                                                                               \
        for (size_t n0 = 0; n0 < g->N; n0 += (W) * (NV))                                                            \
            for (size_t m0 = 0; m0 < g->M; m0 += (MR)) {                                                            \
                if (g->lower && n0 >= m0 + (MR))                                                                    \
                    continue;                                                                                       \
                if (g->tick)                                                                                        \
                    g->tick(g->tick_ctx);                                                                           \
                P##_v acc[MR][NV];                                                                                  \
                float *cm = g->C + m0 * g->ldc + n0;                                                                \
                _Pragma("GCC unroll 16") for (int r = 0; r < (MR); r++)                                             \
                    _Pragma("GCC unroll 16") for (int v = 0; v < (NV); v++) acc[r][v] =                             \
                    g->scale ? P##_mul(P##_set(g->scale[(m0 + r) * g->scale_step]), P##_ld(cm + r * g->ldc + v * (W))) \
                             : P##_set(0.0f);                                                                       \
                const float *am = g->A + m0 * g->lda, *b = g->B + n0;                                               \
                for (size_t k = 0; k < g->K; k++, b += g->ldb) {                                                    \
                    P##_v bv[NV];                                                                                   \
                    _Pragma("GCC unroll 16") for (int v = 0; v < (NV); v++) bv[v] = P##_ld(b + v * (W));            \
                    _Pragma("GCC unroll 16") for (int r = 0; r < (MR); r++)                                         \
                    {                                                                                               \
                        const P##_v av = P##_set(am[r * g->lda + k]);                                       \
                        _Pragma("GCC unroll 16") for (int v = 0; v < (NV); v++) acc[r][v] =                         \
                            P##_fma(av, bv[v], acc[r][v]);                                                          \
                    }                                                                                               \
                }                                                                                                   \
                _Pragma("GCC unroll 16") for (int r = 0; r < (MR); r++)                                             \
                    _Pragma("GCC unroll 16") for (int v = 0; v < (NV); v++) P##_st(cm + r * g->ldc + v * (W),       \
                                                                                   acc[r][v]);                      \
            }                                                                                                       \
    }                                                                                                               \
                                                                                                                    \
    LMK_INLINE TGT void P##_comb_panel(float *dst, P##_v s, const float *c, const float *X, size_t ldx, size_t n,  \
                                       int nv)                                                                      \
    {                                                                                                               \
        P##_v acc[PV];                                                                                              \
        _Pragma("GCC unroll 16") for (int v = 0; v < nv; v++) acc[v] = P##_mul(s, P##_ld(dst + v * (W)));          \
        for (size_t j = 0; j < n; j++) {                                                                            \
            const P##_v cj = P##_set(c[j]);                                                                         \
            _Pragma("GCC unroll 16") for (int v = 0; v < nv; v++) acc[v] =                                          \
                P##_fma(cj, P##_ld(X + j * ldx + v * (W)), acc[v]);                                                 \
        }                                                                                                           \
        _Pragma("GCC unroll 16") for (int v = 0; v < nv; v++) P##_st(dst + v * (W), acc[v]);                       \
    }                                                                                                               \
                                                                                                                    \
    static TGT void P##_comb(float *dst, float s, const float *c, const float *X, size_t ldx, size_t n, size_t N)  \
    {                                                                                                               \
        const P##_v sv = P##_set(s);                                                                                \
        size_t n0 = 0;                                                                                              \
        for (; n0 + (PV) * (W) <= N; n0 += (PV) * (W))                                                              \
            P##_comb_panel(dst + n0, sv, c, X + n0, ldx, n, PV);                                                    \
        for (; n0 < N; n0 += (TV) * (W))                                                                            \
            P##_comb_panel(dst + n0, sv, c, X + n0, ldx, n, TV);                                                    \
    }                                                                                                               \
                                                                                                                    \
    static TGT void P##_resid(float *x, const float *v, float e, float beta, size_t N)                               \
    {                                                                                                               \
        const P##_v ev = P##_set(-e), bv = P##_set(beta);                                                           \
        for (size_t n = 0; n < N; n += (W))                                                                         \
            P##_st(x + n, P##_mul(bv, P##_fma(ev, P##_ld(x + n), P##_ld(v + n))));                                  \
    }                                                                                                               \
                                                                                                                    \
    static TGT void P##_scale(float *x, float s, size_t N)                                                          \
    {                                                                                                               \
        const P##_v sv = P##_set(s);                                                                                \
        for (size_t n = 0; n < N; n += (W))                                                                         \
            P##_st(x + n, P##_mul(sv, P##_ld(x + n)));                                                              \
    }                                                                                                               \
                                                                                                                    \
    static TGT void P##_decay_row(float *drow, size_t i, float decay, float beta, float *kk, float *qk)             \
    {                                                                                                               \
        const size_t n = round_up(i + 1, (W));                                                                      \
        const P##_v dv = P##_set(decay), nb = P##_set(-beta);                                                       \
        for (size_t j = 0; j < n; j += (W))                                                                         \
            P##_st(drow + j, P##_mul(dv, P##_ld(drow + j)));                                                        \
        drow[i] = 1.0f;                                                                                             \
        for (size_t j = 0; j < n; j += (W)) {                                                                       \
            const P##_v d = P##_ld(drow + j);                                                                       \
            P##_st(kk + j, P##_mul(nb, P##_mul(d, P##_ld(kk + j))));                                                \
            P##_st(qk + j, P##_mul(d, P##_ld(qk + j)));                                                             \
        }                                                                                                           \
    }                                                                                                               \
                                                                                                                    \
    static const chunk_ops P##_ops = {P##_mm, P##_comb, P##_resid, P##_scale, P##_decay_row, (W) * (NV)};

/* ---- scalar: plain C, no FMA (the baseline ISA has none) ---- */

typedef float sc_v;
LMK_INLINE sc_v sc_ld(const float *p)
{
    return *p;
}
LMK_INLINE void sc_st(float *p, sc_v v)
{
    *p = v;
}
LMK_INLINE sc_v sc_set(float x)
{
    return x;
}
LMK_INLINE sc_v sc_fma(sc_v a, sc_v b, sc_v c)
{
    return a * b + c;
}
LMK_INLINE sc_v sc_mul(sc_v a, sc_v b)
{
    return a * b;
}

CHUNK_LEVEL(sc, , 1, 8, 4, 8, 8)

#if LMK_CPU_X86
/* ---- AVX2: 16 ymm registers, so blocks of 4 rows x 2 vectors ---- */

typedef __m256 v8_v;
LMK_INLINE LMK_TARGET_AVX2 v8_v v8_ld(const float *p)
{
    return _mm256_loadu_ps(p);
}
LMK_INLINE LMK_TARGET_AVX2 void v8_st(float *p, v8_v v)
{
    _mm256_storeu_ps(p, v);
}
LMK_INLINE LMK_TARGET_AVX2 v8_v v8_set(float x)
{
    return _mm256_set1_ps(x);
}
LMK_INLINE LMK_TARGET_AVX2 v8_v v8_fma(v8_v a, v8_v b, v8_v c)
{
    return _mm256_fmadd_ps(a, b, c);
}
LMK_INLINE LMK_TARGET_AVX2 v8_v v8_mul(v8_v a, v8_v b)
{
    return _mm256_mul_ps(a, b);
}

CHUNK_LEVEL(v8, LMK_TARGET_AVX2, 8, 4, 2, 8, 4)

/* ---- AVX-512: 32 zmm registers, blocks of 8 rows x 2 vectors ---- */

typedef __m512 v16_v;
LMK_INLINE LMK_TARGET_AVX512 v16_v v16_ld(const float *p)
{
    return _mm512_loadu_ps(p);
}
LMK_INLINE LMK_TARGET_AVX512 void v16_st(float *p, v16_v v)
{
    _mm512_storeu_ps(p, v);
}
LMK_INLINE LMK_TARGET_AVX512 v16_v v16_set(float x)
{
    return _mm512_set1_ps(x);
}
LMK_INLINE LMK_TARGET_AVX512 v16_v v16_fma(v16_v a, v16_v b, v16_v c)
{
    return _mm512_fmadd_ps(a, b, c);
}
LMK_INLINE LMK_TARGET_AVX512 v16_v v16_mul(v16_v a, v16_v b)
{
    return _mm512_mul_ps(a, b);
}

CHUNK_LEVEL(v16, LMK_TARGET_AVX512, 16, 8, 2, 8, 2)
#endif

int lmk_gdn_cpu_chunk_init(lmk_gdn_cpu_chunk *c, float *work, size_t floats, size_t dk, size_t dv, size_t cap)
{
    const size_t dkp = round_up(dk, K_PAD), dvp = round_up(dv, COL_PAD), cp = round_up(cap, COL_PAD);
    const size_t need = dkp * dvp + 2 * cap * dkp + 2 * cap * dvp + dkp * cp + 2 * cap * cp + 4 * cp;
    if (need > floats)
        return 0;
    *c = (lmk_gdn_cpu_chunk){.dk = dk, .dv = dv, .dkp = dkp, .dvp = dvp, .cap = cap, .cp = cp};
    float *p = work;
    c->S = p, p += dkp * dvp;
    c->kn = p, p += cap * dkp;
    c->qn = p, p += cap * dkp;
    c->vo = p, p += cap * dvp;
    c->x = p, p += cap * dvp;
    c->kt = p, p += dkp * cp;
    c->kk = p, p += cap * cp;
    c->qk = p, p += cap * cp;
    c->drow = p, p += cp;
    c->eg = p, p += cp;
    c->decay = p, p += cp;
    c->beta = p;
    return 1;
}

static const chunk_ops *ops_for(lmk_cpu_isa isa)
{
#if LMK_CPU_X86
    if (isa >= LMK_CPU_AVX512)
        return &v16_ops;
    if (isa >= LMK_CPU_AVX2)
        return &v8_ops;
#else
    (void)isa;
#endif
    return &sc_ops;
}

/* Zero rows [L, Lp) of kn, qn and vo (they enter the products of padded row blocks), and kt as Kn
 * transposed with zero columns from L on. */
static void pad_and_transpose(lmk_gdn_cpu_chunk *c, size_t L, size_t Lp)
{
    for (size_t t = L; t < Lp; t++) {
        memset(c->kn + t * c->dkp, 0, c->dkp * sizeof(float));
        memset(c->qn + t * c->dkp, 0, c->dkp * sizeof(float));
        memset(c->vo + t * c->dvp, 0, c->dvp * sizeof(float));
    }
    for (size_t i = 0; i < c->dkp; i++) {
        float *row = c->kt + i * c->cp;
        for (size_t t = 0; t < L; t++)
            row[t] = c->kn[t * c->dkp + i];
        memset(row + L, 0, (c->cp - L) * sizeof(float));
    }
}

/* out (M x N, ld ldo) = init + A (lda) B (ldb) with the level's kernel. */
static void product(const lmk_gdn_cpu_chunk *c, const chunk_ops *o, size_t M, size_t N, size_t K, const float *A,
                    size_t lda, const float *B, size_t ldb, float *out, size_t ldo, const float *scale,
                    size_t scale_step, int lower)
{
    const mm_args g = {.M = M, .N = N, .K = K, .A = A, .lda = lda, .B = B, .ldb = ldb, .C = out, .ldc = ldo,
                       .scale = scale, .scale_step = scale_step, .lower = lower, .tick = c->tick,
                       .tick_ctx = c->tick_ctx};
    o->mm(&g);
}

void lmk_gdn_cpu_chunk_run(lmk_cpu_isa isa, lmk_gdn_cpu_chunk *c, size_t L)
{
    const chunk_ops *o = ops_for(isa);
    const size_t Lp = round_up(L, MR_PAD), dkp = c->dkp, dvp = c->dvp, cp = c->cp;
    pad_and_transpose(c, L, Lp);
    float e = 1.0f;
    for (size_t i = 0; i < L; i++)
        c->eg[i] = e *= c->decay[i];
    /* the right-hand side: beta (v - eg Kn S), then Qn S over the v rows it has consumed */
    product(c, o, Lp, dvp, c->dk, c->kn, dkp, c->S, dvp, c->x, dvp, NULL, 0, 0);
    for (size_t i = 0; i < L; i++)
        o->resid(c->x + i * dvp, c->vo + i * dvp, c->eg[i], c->beta[i], dvp);
    product(c, o, Lp, dvp, c->dk, c->qn, dkp, c->S, dvp, c->vo, dvp, NULL, 0, 0);
    /* Kn Kn^T and Qn Kn^T (lower triangles), then -A and Mqk with the decays */
    const size_t nt = round_up(Lp, o->panel);
    product(c, o, Lp, nt, c->dk, c->kn, dkp, c->kt, cp, c->kk, cp, NULL, 0, 1);
    product(c, o, Lp, nt, c->dk, c->qn, dkp, c->kt, cp, c->qk, cp, NULL, 0, 1);
    memset(c->drow, 0, cp * sizeof(float));
    for (size_t i = 0; i < L; i++)
        o->decay_row(c->drow, i, c->decay[i], c->beta[i], c->kk + i * cp, c->qk + i * cp);
    /* U = (I + A)^{-1} x by forward substitution (row i reads the final rows j < i), then O */
    for (size_t i = 1; i < L; i++)
        o->comb(c->x + i * dvp, 1.0f, c->kk + i * cp, c->x, dvp, i, dvp);
    for (size_t i = 0; i < L; i++)
        o->comb(c->vo + i * dvp, c->eg[i], c->qk + i * cp, c->x, dvp, i + 1, dvp);
    /* S' = eg_{L-1} S + Kn^T diag(D_{L-1, j}) U: drow now holds row L - 1 of D */
    for (size_t j = 0; j < L; j++)
        o->scale(c->x + j * dvp, c->drow[j], dvp);
    product(c, o, dkp, dvp, L, c->kt, cp, c->x, dvp, c->S, dvp, c->eg + L - 1, 0, 0);
}
