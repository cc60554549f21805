/*
 * rope_multi.c - the CPU fast path of rope_multi (one tensor, or q and k sharing positions).
 *
 * Work is split by rows (token-major; within a token the q heads, then the k heads), so each
 * thread computes the cos/sin table of a token once and applies it to every head of both tensors.
 * The table is built in two steps:
 *  - per thread and chunk of pairs: inv_freq(p) = pow(base, -2p/R) in double and the pair's axis
 *    (the same expressions as the reference, so the angles are the reference's own);
 *  - per token: theta = pos * inv_freq in double, reduced by pi/2 in double (two-part Cody-Waite
 *    with FMA, exact to ~1e-21 for |theta| < 2^40) and evaluated with fdlibm's double polynomials
 *    in 8 or 4 lanes, then rounded to f32: the same f32 values as (float)cos/sin from libm on 8M
 *    angles up to 2^40. libm's double sin+cos cost 13 ns a pair on Zen4 (a double reduction
 *    followed by sincosf, 12 ns), a fifth of the memory time of a 24-head token; the vector version
 *    costs 0.8 ns. Angles beyond 2^40 (only reachable with freq_base < 1) use libm for the token.
 * Rows are then rotated in f32 with AVX-512 or AVX2 (chosen at device open), loading bf16/f16 by
 * widening and storing with round-to-nearest-even that gives the same bits as lmk_f32_to_bf16 /
 * lmk_f32_to_f16 (NaN included). Elements outside the rotated pairs are byte copies (nothing to do
 * in place). Large out-of-place outputs whose segments are all 64-byte aligned (every real model
 * shape) are written with streaming stores. The portable path is scalar C with libm angles.
 *
 * Stack use per thread is a fixed 25 KB table of PAIRS_PER_CHUNK pairs; rope_dim beyond that is
 * processed chunk by chunk, so no size ever reaches a VLA or the heap.
 */
#include "cpu/cpu.h"
#include "ops/rope/rope.h"
#include "ops/rope/rope_common.h"

#include <math.h>

#define PAIRS_PER_CHUNK 1024
/* Angles up to this use the vector reduction; beyond it libm (see above). */
#define THETA_VECTOR_MAX 0x1p40

typedef struct rope_job {
    lmk_cpu_isa isa;
    lmk_dtype dtype;
    size_t es;                  /* bytes per element */
    size_t head_dim, half;      /* elements; half = rope_dim / 2 pairs */
    size_t stride;              /* element distance from a pair's first element to its second */
    size_t seq, rows_per_token; /* rows: seq * (heads of q + heads of k) */
    double base, rope_dim;
    int mode;
    uint32_t sections[4];
    const int32_t *positions;
    int n_tensors;
    const unsigned char *in[2];
    unsigned char *out[2];
    size_t heads[2];
    int in_place[2];
    int stream[2];              /* streaming stores for this tensor's output */
} rope_job;

typedef struct rope_table {
    float cos[PAIRS_PER_CHUNK], sin[PAIRS_PER_CHUNK];
    double inv_freq[PAIRS_PER_CHUNK], theta[PAIRS_PER_CHUNK];
    unsigned char axis[PAIRS_PER_CHUNK];
    double max_inv_freq;
} rope_table;

/* A run of consecutive rows of one tensor (heads of one token, adjacent in memory) and what to do
 * to them. Offsets are in bytes. */
typedef struct rope_rows {
    const unsigned char *in;
    unsigned char *out;
    size_t n_rows, row_bytes;
    size_t b_bytes;      /* from a pair's first element to its second */
    size_t p0, n;        /* rotate pairs [p0, p0 + n) with cos/sin c[0..n), s[0..n) */
    const float *c, *s;
    int copy;            /* copy the two gaps [gap[g][0], gap[g][1]) of each row */
    int nt;              /* streaming stores (every segment is whole cache lines) */
    size_t gap[2][2];
    size_t ahead;        /* in place: prefetch the pairs of the row this far ahead (0: off) */
    size_t rows_left;    /* rows of the tensor from the run's first to the tensor's end */
} rope_rows;

/* ---- angles ---- */

#if LMK_CPU_X86
/* pi/2 as a double plus the double nearest the remainder; 2/pi; fdlibm's minimax polynomials of
 * sin and cos on [-pi/4, pi/4] (error < 2^-58). */
static const double k_pio2_hi = 1.57079632679489655800e+00, k_pio2_lo = 6.12323399573676603587e-17;
static const double k_2_pi = 6.36619772367581382433e-01, k_round = 0x1.8p52;
static const double k_s1 = -1.66666666666666324348e-01, k_s2 = 8.33333333332248946124e-03,
                    k_s3 = -1.98412698298579493134e-04, k_s4 = 2.75573137070700676789e-06,
                    k_s5 = -2.50507602534068634195e-08, k_s6 = 1.58969099521155010221e-10;
static const double k_c1 = 4.16666666666666019037e-02, k_c2 = -1.38888888888741095749e-03,
                    k_c3 = 2.48015872894767294178e-05, k_c4 = -2.75573143513906633035e-07,
                    k_c5 = 2.08757232129817482790e-09, k_c6 = -1.13596475577881948265e-11;

/* k = round(theta * 2/pi) by the 1.5*2^52 trick: its low mantissa bits are k mod 4 (the
 * quadrant); r = theta - k*pi/2 in [-pi/4, pi/4]; then sin/cos of theta are +-sin/cos of r. */
LMK_TARGET_AVX512 static void sincos_avx512(const double *theta, float *c, float *s, size_t n)
{
    const __m512d two_pi = _mm512_set1_pd(k_2_pi), round = _mm512_set1_pd(k_round);
    const __m512i one = _mm512_set1_epi64(1), two = _mm512_set1_epi64(2);
    for (size_t i = 0; i < n; i += 8) {
        const __m512d x = _mm512_loadu_pd(theta + i);
        const __m512d kr = _mm512_fmadd_pd(x, two_pi, round);
        const __m512d k = _mm512_sub_pd(kr, round);
        const __m512i q = _mm512_castpd_si512(kr);
        __m512d r = _mm512_fnmadd_pd(k, _mm512_set1_pd(k_pio2_hi), x);
        r = _mm512_fnmadd_pd(k, _mm512_set1_pd(k_pio2_lo), r);
        const __m512d z = _mm512_mul_pd(r, r);
        __m512d ps = _mm512_fmadd_pd(z, _mm512_set1_pd(k_s6), _mm512_set1_pd(k_s5));
        ps = _mm512_fmadd_pd(z, ps, _mm512_set1_pd(k_s4));
        ps = _mm512_fmadd_pd(z, ps, _mm512_set1_pd(k_s3));
        ps = _mm512_fmadd_pd(z, ps, _mm512_set1_pd(k_s2));
        ps = _mm512_fmadd_pd(z, ps, _mm512_set1_pd(k_s1));
        const __m512d sr = _mm512_fmadd_pd(_mm512_mul_pd(z, r), ps, r);
        __m512d pc = _mm512_fmadd_pd(z, _mm512_set1_pd(k_c6), _mm512_set1_pd(k_c5));
        pc = _mm512_fmadd_pd(z, pc, _mm512_set1_pd(k_c4));
        pc = _mm512_fmadd_pd(z, pc, _mm512_set1_pd(k_c3));
        pc = _mm512_fmadd_pd(z, pc, _mm512_set1_pd(k_c2));
        pc = _mm512_fmadd_pd(z, pc, _mm512_set1_pd(k_c1));
        const __m512d cr = _mm512_fmadd_pd(_mm512_mul_pd(z, z), pc, _mm512_fnmadd_pd(_mm512_set1_pd(0.5), z,
                                                                                    _mm512_set1_pd(1.0)));
        const __mmask8 odd = _mm512_test_epi64_mask(q, one);
        const __m512i sv = _mm512_castpd_si512(_mm512_mask_blend_pd(odd, sr, cr));
        const __m512i cv = _mm512_castpd_si512(_mm512_mask_blend_pd(odd, cr, sr));
        const __m512i sneg = _mm512_slli_epi64(_mm512_and_si512(q, two), 62);
        const __m512i cneg = _mm512_slli_epi64(_mm512_and_si512(_mm512_add_epi64(q, one), two), 62);
        _mm256_storeu_ps(s + i, _mm512_cvtpd_ps(_mm512_castsi512_pd(_mm512_xor_si512(sv, sneg))));
        _mm256_storeu_ps(c + i, _mm512_cvtpd_ps(_mm512_castsi512_pd(_mm512_xor_si512(cv, cneg))));
    }
}

LMK_TARGET_AVX2 static void sincos_avx2(const double *theta, float *c, float *s, size_t n)
{
    const __m256d two_pi = _mm256_set1_pd(k_2_pi), round = _mm256_set1_pd(k_round);
    const __m256i one = _mm256_set1_epi64x(1), two = _mm256_set1_epi64x(2);
    for (size_t i = 0; i < n; i += 4) {
        const __m256d x = _mm256_loadu_pd(theta + i);
        const __m256d kr = _mm256_fmadd_pd(x, two_pi, round);
        const __m256d k = _mm256_sub_pd(kr, round);
        const __m256i q = _mm256_castpd_si256(kr);
        __m256d r = _mm256_fnmadd_pd(k, _mm256_set1_pd(k_pio2_hi), x);
        r = _mm256_fnmadd_pd(k, _mm256_set1_pd(k_pio2_lo), r);
        const __m256d z = _mm256_mul_pd(r, r);
        __m256d ps = _mm256_fmadd_pd(z, _mm256_set1_pd(k_s6), _mm256_set1_pd(k_s5));
        ps = _mm256_fmadd_pd(z, ps, _mm256_set1_pd(k_s4));
        ps = _mm256_fmadd_pd(z, ps, _mm256_set1_pd(k_s3));
        ps = _mm256_fmadd_pd(z, ps, _mm256_set1_pd(k_s2));
        ps = _mm256_fmadd_pd(z, ps, _mm256_set1_pd(k_s1));
        const __m256d sr = _mm256_fmadd_pd(_mm256_mul_pd(z, r), ps, r);
        __m256d pc = _mm256_fmadd_pd(z, _mm256_set1_pd(k_c6), _mm256_set1_pd(k_c5));
        pc = _mm256_fmadd_pd(z, pc, _mm256_set1_pd(k_c4));
        pc = _mm256_fmadd_pd(z, pc, _mm256_set1_pd(k_c3));
        pc = _mm256_fmadd_pd(z, pc, _mm256_set1_pd(k_c2));
        pc = _mm256_fmadd_pd(z, pc, _mm256_set1_pd(k_c1));
        const __m256d cr = _mm256_fmadd_pd(_mm256_mul_pd(z, z), pc, _mm256_fnmadd_pd(_mm256_set1_pd(0.5), z,
                                                                                    _mm256_set1_pd(1.0)));
        /* blendv selects by the sign bit: move the quadrant's bit 0 there */
        const __m256d odd = _mm256_castsi256_pd(_mm256_slli_epi64(q, 63));
        const __m256i sv = _mm256_castpd_si256(_mm256_blendv_pd(sr, cr, odd));
        const __m256i cv = _mm256_castpd_si256(_mm256_blendv_pd(cr, sr, odd));
        const __m256i sneg = _mm256_slli_epi64(_mm256_and_si256(q, two), 62);
        const __m256i cneg = _mm256_slli_epi64(_mm256_and_si256(_mm256_add_epi64(q, one), two), 62);
        _mm_storeu_ps(s + i, _mm256_cvtpd_ps(_mm256_castsi256_pd(_mm256_xor_si256(sv, sneg))));
        _mm_storeu_ps(c + i, _mm256_cvtpd_ps(_mm256_castsi256_pd(_mm256_xor_si256(cv, cneg))));
    }
}
#endif

/* inv_freq and axis of pairs [p0, p0 + n): once per thread and chunk. */
static void fill_freqs(const rope_job *j, rope_table *tb, size_t p0, size_t n)
{
    tb->max_inv_freq = 0;
    for (size_t i = 0; i < n; i++) {
        const size_t p = p0 + i;
        tb->inv_freq[i] = pow(j->base, -2.0 * (double)p / j->rope_dim);
        uint32_t jx;
        tb->axis[i] = (unsigned char)lmk_rope_axis_j(j->mode, j->sections, (uint32_t)p, &jx);
        if (tb->inv_freq[i] > tb->max_inv_freq)
            tb->max_inv_freq = tb->inv_freq[i];
    }
    for (size_t i = n; i < (n + 7) / 8 * 8; i++) /* the vector tail reads whole groups of 8 */
        tb->inv_freq[i] = 0, tb->axis[i] = 0;
}

/* cos/sin of every pair of the chunk for one token. */
static void fill_angles(const rope_job *j, rope_table *tb, size_t n, size_t token)
{
    double pos[4], max_pos = 0;
    for (int a = 0; a < 4; a++) {
        pos[a] = (double)j->positions[(size_t)a * j->seq + token];
        if (fabs(pos[a]) > max_pos)
            max_pos = fabs(pos[a]);
    }
    const size_t n8 = (n + 7) / 8 * 8;
    for (size_t i = 0; i < n8; i++)
        tb->theta[i] = pos[tb->axis[i]] * tb->inv_freq[i];
#if LMK_CPU_X86
    if (max_pos * tb->max_inv_freq <= THETA_VECTOR_MAX) {
        if (j->isa == LMK_CPU_AVX512) {
            sincos_avx512(tb->theta, tb->cos, tb->sin, n8);
            return;
        }
        if (j->isa == LMK_CPU_AVX2) {
            sincos_avx2(tb->theta, tb->cos, tb->sin, n8);
            return;
        }
    }
#endif
    for (size_t i = 0; i < n; i++) {
        tb->cos[i] = (float)cos(tb->theta[i]);
        tb->sin[i] = (float)sin(tb->theta[i]);
    }
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

LMK_INLINE void rotate_scalar_dt(lmk_dtype dt, size_t es, const unsigned char *ia, const unsigned char *ib,
                                 unsigned char *oa, unsigned char *ob, const float *c, const float *s, size_t i0,
                                 size_t n)
{
    for (size_t i = i0; i < n; i++) {
        const float a = load_scalar(dt, ia + i * es), b = load_scalar(dt, ib + i * es);
        store_scalar(dt, oa + i * es, a * c[i] - b * s[i]);
        store_scalar(dt, ob + i * es, a * s[i] + b * c[i]);
    }
}

/* Rotates pairs [i0, n) of the chunk: a at ia[i], b at ib[i] (element indices), cos/sin c[i], s[i].
 * The portable path and the vector kernels' tails. One loop per dtype, so f32 vectorises. */
static void rotate_scalar(lmk_dtype dt, size_t es, const unsigned char *ia, const unsigned char *ib,
                          unsigned char *oa, unsigned char *ob, const float *c, const float *s, size_t i0, size_t n)
{
    if (dt == LMK_F32)
        rotate_scalar_dt(LMK_F32, 4, ia, ib, oa, ob, c, s, i0, n);
    else if (dt == LMK_BF16)
        rotate_scalar_dt(LMK_BF16, 2, ia, ib, oa, ob, c, s, i0, n);
    else
        rotate_scalar_dt(LMK_F16, 2, ia, ib, oa, ob, c, s, i0, n);
    (void)es;
}

/* Copies row k's elements that no pair touches: [half, stride) and [stride + half, head_dim) (the
 * first is empty in the Hugging Face pairing). */
static inline void copy_gaps(const rope_rows *r, size_t k, int nt)
{
    for (int g = 0; g < 2; g++) {
        const size_t a = k * r->row_bytes + r->gap[g][0], n = r->gap[g][1] - r->gap[g][0];
        if (nt)
            lmk_cpu_stream_copy(r->out + a, r->in + a, n);
        else if (n)
            memcpy(r->out + a, r->in + a, n);
    }
}

/* In place only the rotated lines of a row are touched (a quarter of a Qwen row), a strided
 * pattern the hardware prefetchers serve poorly: loads wait on memory a row at a time.
 * Prefetching the pairs of the row ~16 KB ahead, with write intent since they will be stored,
 * cut in-place Qwen Q times by 15-25% (paired cold runs, median ratio 0.74 f32, 0.85 bf16; 4 KB
 * and 64 KB ahead did about as well). Out of place the rows are read whole, the hardware streams
 * them, and prefetching changed nothing. */
static inline void prefetch_row(const rope_rows *r, size_t k, size_t es)
{
    if (!r->ahead || k + r->ahead >= r->rows_left)
        return;
    const unsigned char *a = r->out + (k + r->ahead) * r->row_bytes + r->p0 * es;
    for (size_t l = 0; l < r->n * es; l += 64) {
        __builtin_prefetch(a + l, 1, 3);
        __builtin_prefetch(a + r->b_bytes + l, 1, 3);
    }
}

/* ---- rows: AVX-512 and AVX2. dt and nt are constants in every instantiation below. ---- */

#if LMK_CPU_X86
LMK_INLINE LMK_TARGET_AVX512 __m512 load16(const unsigned char *p, lmk_dtype dt)
{
    if (dt == LMK_F32)
        return _mm512_loadu_ps(p);
    const __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)p);
    if (dt == LMK_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

LMK_INLINE LMK_TARGET_AVX512 void store16(unsigned char *p, __m512 v, lmk_dtype dt, int nt)
{
    if (dt == LMK_F32) {
        if (nt)
            _mm512_stream_ps((float *)(void *)p, v);
        else
            _mm512_storeu_ps(p, v);
        return;
    }
    __m256i h;
    if (dt == LMK_BF16) { /* lmk_f32_to_bf16: u + 0x7fff + lsb, NaN -> (u | quiet bit) >> 16 */
        const __m512i u = _mm512_castps_si512(v);
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
        r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), u, _mm512_set1_epi32(0x400000));
        h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
    } else {
        h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    if (nt)
        _mm256_stream_si256((__m256i *)(void *)p, h);
    else
        _mm256_storeu_si256((__m256i *)(void *)p, h);
}

LMK_INLINE LMK_TARGET_AVX512 void rows16(lmk_dtype dt, int nt, size_t es, const rope_rows *r)
{
    for (size_t k = 0; k < r->n_rows; k++) {
        prefetch_row(r, k, es);
        const unsigned char *ia = r->in + k * r->row_bytes + r->p0 * es, *ib = ia + r->b_bytes;
        unsigned char *oa = r->out + k * r->row_bytes + r->p0 * es, *ob = oa + r->b_bytes;
        size_t i = 0;
        for (; i + 16 <= r->n; i += 16) {
            const __m512 a = load16(ia + i * es, dt), b = load16(ib + i * es, dt);
            const __m512 c = _mm512_loadu_ps(r->c + i), s = _mm512_loadu_ps(r->s + i);
            store16(oa + i * es, _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, s)), dt, nt);
            store16(ob + i * es, _mm512_fmadd_ps(a, s, _mm512_mul_ps(b, c)), dt, nt);
        }
        if (i < r->n) /* never with nt: its segments are whole cache lines */
            rotate_scalar(dt, es, ia, ib, oa, ob, r->c, r->s, i, r->n);
        if (r->copy)
            copy_gaps(r, k, nt);
    }
}

LMK_TARGET_AVX512 static void rows_avx512(lmk_dtype dt, const rope_rows *r)
{
    if (dt == LMK_F32)
        r->nt ? rows16(LMK_F32, 1, 4, r) : rows16(LMK_F32, 0, 4, r);
    else if (dt == LMK_BF16)
        r->nt ? rows16(LMK_BF16, 1, 2, r) : rows16(LMK_BF16, 0, 2, r);
    else
        r->nt ? rows16(LMK_F16, 1, 2, r) : rows16(LMK_F16, 0, 2, r);
}

LMK_INLINE LMK_TARGET_AVX2 __m256 load8(const unsigned char *p, lmk_dtype dt)
{
    if (dt == LMK_F32)
        return _mm256_loadu_ps((const float *)(const void *)p);
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    if (dt == LMK_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

LMK_INLINE LMK_TARGET_AVX2 void store8(unsigned char *p, __m256 v, lmk_dtype dt, int nt)
{
    if (dt == LMK_F32) {
        if (nt)
            _mm256_stream_ps((float *)(void *)p, v);
        else
            _mm256_storeu_ps((float *)(void *)p, v);
        return;
    }
    __m128i h;
    if (dt == LMK_BF16) {
        const __m256i u = _mm256_castps_si256(v);
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
        const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
        r = _mm256_srli_epi32(r, 16);
        h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    } else {
        h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    if (nt)
        _mm_stream_si128((__m128i *)(void *)p, h);
    else
        _mm_storeu_si128((__m128i *)(void *)p, h);
}

LMK_INLINE LMK_TARGET_AVX2 void rows8(lmk_dtype dt, int nt, size_t es, const rope_rows *r)
{
    for (size_t k = 0; k < r->n_rows; k++) {
        prefetch_row(r, k, es);
        const unsigned char *ia = r->in + k * r->row_bytes + r->p0 * es, *ib = ia + r->b_bytes;
        unsigned char *oa = r->out + k * r->row_bytes + r->p0 * es, *ob = oa + r->b_bytes;
        size_t i = 0;
        for (; i + 8 <= r->n; i += 8) {
            const __m256 a = load8(ia + i * es, dt), b = load8(ib + i * es, dt);
            const __m256 c = _mm256_loadu_ps(r->c + i), s = _mm256_loadu_ps(r->s + i);
            store8(oa + i * es, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)), dt, nt);
            store8(ob + i * es, _mm256_fmadd_ps(a, s, _mm256_mul_ps(b, c)), dt, nt);
        }
        if (i < r->n)
            rotate_scalar(dt, es, ia, ib, oa, ob, r->c, r->s, i, r->n);
        if (r->copy)
            copy_gaps(r, k, nt);
    }
}

LMK_TARGET_AVX2 static void rows_avx2(lmk_dtype dt, const rope_rows *r)
{
    if (dt == LMK_F32)
        r->nt ? rows8(LMK_F32, 1, 4, r) : rows8(LMK_F32, 0, 4, r);
    else if (dt == LMK_BF16)
        r->nt ? rows8(LMK_BF16, 1, 2, r) : rows8(LMK_BF16, 0, 2, r);
    else
        r->nt ? rows8(LMK_F16, 1, 2, r) : rows8(LMK_F16, 0, 2, r);
}
#endif

/* ---- runs of rows ---- */

static void rows_scalar(lmk_dtype dt, const rope_rows *r)
{
    const size_t es = lmk_dtype_size(dt);
    for (size_t k = 0; k < r->n_rows; k++) {
        prefetch_row(r, k, es);
        const unsigned char *ia = r->in + k * r->row_bytes + r->p0 * es;
        unsigned char *oa = r->out + k * r->row_bytes + r->p0 * es;
        rotate_scalar(dt, es, ia, ia + r->b_bytes, oa, oa + r->b_bytes, r->c, r->s, 0, r->n);
        if (r->copy)
            copy_gaps(r, k, 0);
    }
}

/* Rotates pairs [p0, p0 + n) (n may be 0) of the rows [first, last) of one token, q heads first
 * then k heads, and copies their unrotated elements when `copy`. */
static void process_rows(const rope_job *j, const rope_table *tb, size_t token, size_t first, size_t last, size_t p0,
                         size_t n, int copy)
{
    size_t base = 0; /* first row of tensor ti within the token */
    for (int ti = 0; ti < j->n_tensors; base += j->heads[ti], ti++) {
        const size_t a = first > base ? first - base : 0, b = last - base < j->heads[ti] ? last - base : j->heads[ti];
        if (last <= base || a >= b)
            continue;
        const size_t rb = j->head_dim * j->es, off = (token * j->heads[ti] + a) * rb;
        const rope_rows r = {
            .in = j->in[ti] + off, .out = j->out[ti] + off, .n_rows = b - a,
            .row_bytes = rb, .b_bytes = j->stride * j->es,
            .p0 = p0, .n = n, .c = tb->cos, .s = tb->sin,
            .copy = copy && !j->in_place[ti], .nt = j->stream[ti],
            .gap = {{j->half * j->es, j->stride * j->es}, {(j->stride + j->half) * j->es, j->head_dim * j->es}},
            .ahead = j->in_place[ti] ? (16384 + rb - 1) / rb : 0,
            .rows_left = (j->seq - token) * j->heads[ti] - a,
        };
#if LMK_CPU_X86
        if (j->isa == LMK_CPU_AVX512) {
            rows_avx512(j->dtype, &r);
            continue;
        }
        if (j->isa == LMK_CPU_AVX2) {
            rows_avx2(j->dtype, &r);
            continue;
        }
#endif
        rows_scalar(j->dtype, &r);
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
    rope_table tb;
    const int one_chunk = j->half <= PAIRS_PER_CHUNK;
    /* One pass per chunk of pairs; with a single chunk the copies ride along while the rows are
     * in L1, otherwise a last pass (n = 0 pairs) copies. */
    for (size_t p0 = 0; p0 < j->half || !one_chunk; p0 += PAIRS_PER_CHUNK) {
        const size_t n = p0 >= j->half ? 0 : j->half - p0 < PAIRS_PER_CHUNK ? j->half - p0 : PAIRS_PER_CHUNK;
        if (n)
            fill_freqs(j, &tb, p0, n);
        for (size_t row = lo; row < hi;) {
            const size_t token = row / rpt, first = row % rpt;
            const size_t last = hi - row < rpt - first ? first + (hi - row) : rpt;
            if (n)
                fill_angles(j, &tb, n, token);
            process_rows(j, &tb, token, first, last, p0, n, one_chunk || !n);
            row += last - first;
        }
        if (!n)
            break;
    }
    if (j->stream[0] || j->stream[1])
        lmk_cpu_stream_fence();
}

/* Whether this path handles the call: the 0.1 function (MROPE/IMROPE, no scaling, 32-bit
 * positions) on dense tensors. */
static bool legacy_call(const lmk_rope_args *a)
{
    const lmk_rope_angle *g = &a->angle;
    bool ok = (g->mode == LMK_ROPE_MROPE || g->mode == LMK_ROPE_IMROPE) && !a->interleaved &&
              g->freq_scale == 1.0 && g->ext_factor == 0.0 && g->mscale == 1.0 && !g->freq_factors &&
              g->pos_dtype != LMK_I64;
    for (int i = 0; i < a->n_tensors; i++) {
        const lmk_rope_tensor *t = &a->t[i];
        ok = ok && t->in_head == a->head_dim && t->out_head == a->head_dim &&
             t->in_tok == (size_t)t->n_heads * a->head_dim && t->out_tok == t->in_tok;
    }
    return ok;
}

lmk_status lmk_cpu_rope(lmk_stream *s, const void *args)
{
    const lmk_rope_args *a = args;
    if (!legacy_call(a))
        return lmk_fail(LMK_ERR_UNSUPPORTED, "rope: this mode, scaling or layout is not yet on the CPU");
    rope_job j = {
        .isa = lmk_cpu_stream_isa(s),
        .dtype = a->dtype,
        .es = lmk_dtype_size(a->dtype),
        .head_dim = a->head_dim,
        .half = a->rope_dim / 2,
        .stride = a->pair_stride,
        .seq = a->seq_len,
        .base = a->angle.freq_base,
        .rope_dim = (double)a->rope_dim,
        .mode = a->angle.mode,
        .positions = a->angle.positions,
        .n_tensors = a->n_tensors,
    };
    memcpy(j.sections, a->angle.sections, sizeof j.sections);
    size_t bytes = 0;
    for (int ti = 0; ti < a->n_tensors; ti++) {
        j.in[ti] = a->t[ti].in;
        j.out[ti] = a->t[ti].out;
        j.heads[ti] = a->t[ti].n_heads;
        j.in_place[ti] = a->t[ti].in == a->t[ti].out;
        bytes += 2 * j.seq * j.heads[ti] * j.head_dim * j.es;
    }
    j.rows_per_token = j.heads[0] + j.heads[1];
    /* Streaming stores need every vector store 64-byte aligned: the output, rows, both rotated
     * segments and the copied gaps all start on a cache line (true for all real model shapes). */
    const int lines = (j.head_dim * j.es) % 64 == 0 && (j.half * j.es) % 64 == 0 && (j.stride * j.es) % 64 == 0;
    for (int ti = 0; ti < a->n_tensors; ti++)
        j.stream[ti] = j.isa != LMK_CPU_SCALAR && lines && !j.in_place[ti] && bytes >= 2 * LMK_CPU_STREAM_MIN_BYTES &&
                       (uintptr_t)j.out[ti] % 64 == 0;
    lmk_cpu_parallel(s, bytes, rope_task, &j);
    return LMK_OK;
}
