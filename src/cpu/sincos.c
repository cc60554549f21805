/*
 * sincos.c - m*cos and m*sin of a table of double angles, rounded to f32: the angle tables of
 * lmk_rope (src/ops/rope/cpu.c) and lmk_attn_prologue (src/ops/attn_prologue/cpu.c). One copy,
 * so both ops round every angle the same way at a given ISA level.
 *
 * The vector levels reduce theta by pi/2 in double (two-part Cody-Waite with FMA, exact to ~1e-21
 * for |theta| <= LMK_CPU_SINCOS_VECTOR_MAX = 2^40) and evaluate fdlibm's double polynomials in 8
 * (AVX-512) or 4 (AVX2) lanes, multiply by m (lmk.h's magnitude; skipped at m == 1) and round to
 * f32: the same f32 values as (float)cos/sin from libm on 8M angles up to 2^40, at a small
 * fraction of libm's cost (docs/cpu.md, "Angles: lmk_cpu_sincos").
 * The scalar level (and angles beyond the bound, which the callers send there) uses libm.
 */
#include "cpu/cpu.h"

#include <math.h>

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

/* The steps of a vector (reduce, the two polynomials, place) are inlined when optimizing. At -O0
 * every inlined intrinsic keeps its vector temporaries in stack slots of their own (8.3 KB for
 * sincos_avx512 in one piece, which put attn_prologue over lmk.h's 16 KiB bound in a gcc -O0
 * build), so there they stay functions, as cpu/vec.h's steps (LMK_CPU_STEP). Either way the operations, and so
 * the bits, are the same. */
#ifdef __OPTIMIZE__
#define POLY_KERNEL LMK_INLINE
#else
#define POLY_KERNEL static
#endif

/* sin(r) and cos(r) for r in [-pi/4, pi/4], z = r*r: fdlibm's kernels. */
POLY_KERNEL LMK_TARGET_AVX512 __m512d sin_poly8(__m512d r, __m512d z)
{
    __m512d ps = _mm512_fmadd_pd(z, _mm512_set1_pd(k_s6), _mm512_set1_pd(k_s5));
    ps = _mm512_fmadd_pd(z, ps, _mm512_set1_pd(k_s4));
    ps = _mm512_fmadd_pd(z, ps, _mm512_set1_pd(k_s3));
    ps = _mm512_fmadd_pd(z, ps, _mm512_set1_pd(k_s2));
    ps = _mm512_fmadd_pd(z, ps, _mm512_set1_pd(k_s1));
    return _mm512_fmadd_pd(_mm512_mul_pd(z, r), ps, r);
}

POLY_KERNEL LMK_TARGET_AVX512 __m512d cos_poly8(__m512d z)
{
    __m512d pc = _mm512_fmadd_pd(z, _mm512_set1_pd(k_c6), _mm512_set1_pd(k_c5));
    pc = _mm512_fmadd_pd(z, pc, _mm512_set1_pd(k_c4));
    pc = _mm512_fmadd_pd(z, pc, _mm512_set1_pd(k_c3));
    pc = _mm512_fmadd_pd(z, pc, _mm512_set1_pd(k_c2));
    pc = _mm512_fmadd_pd(z, pc, _mm512_set1_pd(k_c1));
    return _mm512_fmadd_pd(_mm512_mul_pd(z, z), pc, _mm512_fnmadd_pd(_mm512_set1_pd(0.5), z, _mm512_set1_pd(1.0)));
}

POLY_KERNEL LMK_TARGET_AVX2 __m256d sin_poly4(__m256d r, __m256d z)
{
    __m256d ps = _mm256_fmadd_pd(z, _mm256_set1_pd(k_s6), _mm256_set1_pd(k_s5));
    ps = _mm256_fmadd_pd(z, ps, _mm256_set1_pd(k_s4));
    ps = _mm256_fmadd_pd(z, ps, _mm256_set1_pd(k_s3));
    ps = _mm256_fmadd_pd(z, ps, _mm256_set1_pd(k_s2));
    ps = _mm256_fmadd_pd(z, ps, _mm256_set1_pd(k_s1));
    return _mm256_fmadd_pd(_mm256_mul_pd(z, r), ps, r);
}

POLY_KERNEL LMK_TARGET_AVX2 __m256d cos_poly4(__m256d z)
{
    __m256d pc = _mm256_fmadd_pd(z, _mm256_set1_pd(k_c6), _mm256_set1_pd(k_c5));
    pc = _mm256_fmadd_pd(z, pc, _mm256_set1_pd(k_c4));
    pc = _mm256_fmadd_pd(z, pc, _mm256_set1_pd(k_c3));
    pc = _mm256_fmadd_pd(z, pc, _mm256_set1_pd(k_c2));
    pc = _mm256_fmadd_pd(z, pc, _mm256_set1_pd(k_c1));
    return _mm256_fmadd_pd(_mm256_mul_pd(z, z), pc, _mm256_fnmadd_pd(_mm256_set1_pd(0.5), z, _mm256_set1_pd(1.0)));
}

/* k = round(theta * 2/pi) by the 1.5*2^52 trick: its low mantissa bits are k mod 4 (the
 * quadrant, *q); returns r = theta - k*pi/2 in [-pi/4, pi/4]. sin/cos of theta are then +-sin/cos
 * of r (place8/place4). */
POLY_KERNEL LMK_TARGET_AVX512 __m512d reduce8(__m512d x, __m512i *q)
{
    const __m512d round = _mm512_set1_pd(k_round);
    const __m512d kr = _mm512_fmadd_pd(x, _mm512_set1_pd(k_2_pi), round);
    const __m512d k = _mm512_sub_pd(kr, round);
    *q = _mm512_castpd_si512(kr);
    const __m512d r = _mm512_fnmadd_pd(k, _mm512_set1_pd(k_pio2_hi), x);
    return _mm512_fnmadd_pd(k, _mm512_set1_pd(k_pio2_lo), r);
}

/* s = m*sin, c = m*cos of theta from sin(r), cos(r) and the quadrant q, the product in double
 * (skipped unless scaled), rounded to f32. */
POLY_KERNEL LMK_TARGET_AVX512 void place8(__m512d sr, __m512d cr, __m512i q, int scaled, __m512d mv, float *c,
                                          float *s)
{
    const __m512i one = _mm512_set1_epi64(1), two = _mm512_set1_epi64(2);
    const __mmask8 odd = _mm512_test_epi64_mask(q, one);
    const __m512i sv = _mm512_castpd_si512(_mm512_mask_blend_pd(odd, sr, cr));
    const __m512i cv = _mm512_castpd_si512(_mm512_mask_blend_pd(odd, cr, sr));
    const __m512i sneg = _mm512_slli_epi64(_mm512_and_si512(q, two), 62);
    const __m512i cneg = _mm512_slli_epi64(_mm512_and_si512(_mm512_add_epi64(q, one), two), 62);
    __m512d sd = _mm512_castsi512_pd(_mm512_xor_si512(sv, sneg));
    __m512d cd = _mm512_castsi512_pd(_mm512_xor_si512(cv, cneg));
    if (scaled)
        sd = _mm512_mul_pd(sd, mv), cd = _mm512_mul_pd(cd, mv);
    _mm256_storeu_ps(s, _mm512_cvtpd_ps(sd));
    _mm256_storeu_ps(c, _mm512_cvtpd_ps(cd));
}

LMK_TARGET_AVX512 static void sincos_avx512(const double *theta, float *c, float *s, size_t n, double m)
{
    const __m512d mv = _mm512_set1_pd(m);
    const int scaled = m != 1.0;
    for (size_t i = 0; i < n; i += 8) {
        __m512i q;
        const __m512d r = reduce8(_mm512_loadu_pd(theta + i), &q);
        const __m512d z = _mm512_mul_pd(r, r);
        place8(sin_poly8(r, z), cos_poly8(z), q, scaled, mv, c + i, s + i);
    }
}

POLY_KERNEL LMK_TARGET_AVX2 __m256d reduce4(__m256d x, __m256i *q)
{
    const __m256d round = _mm256_set1_pd(k_round);
    const __m256d kr = _mm256_fmadd_pd(x, _mm256_set1_pd(k_2_pi), round);
    const __m256d k = _mm256_sub_pd(kr, round);
    *q = _mm256_castpd_si256(kr);
    const __m256d r = _mm256_fnmadd_pd(k, _mm256_set1_pd(k_pio2_hi), x);
    return _mm256_fnmadd_pd(k, _mm256_set1_pd(k_pio2_lo), r);
}

POLY_KERNEL LMK_TARGET_AVX2 void place4(__m256d sr, __m256d cr, __m256i q, int scaled, __m256d mv, float *c,
                                        float *s)
{
    const __m256i one = _mm256_set1_epi64x(1), two = _mm256_set1_epi64x(2);
    /* blendv selects by the sign bit: move the quadrant's bit 0 there */
    const __m256d odd = _mm256_castsi256_pd(_mm256_slli_epi64(q, 63));
    const __m256i sv = _mm256_castpd_si256(_mm256_blendv_pd(sr, cr, odd));
    const __m256i cv = _mm256_castpd_si256(_mm256_blendv_pd(cr, sr, odd));
    const __m256i sneg = _mm256_slli_epi64(_mm256_and_si256(q, two), 62);
    const __m256i cneg = _mm256_slli_epi64(_mm256_and_si256(_mm256_add_epi64(q, one), two), 62);
    __m256d sd = _mm256_castsi256_pd(_mm256_xor_si256(sv, sneg));
    __m256d cd = _mm256_castsi256_pd(_mm256_xor_si256(cv, cneg));
    if (scaled)
        sd = _mm256_mul_pd(sd, mv), cd = _mm256_mul_pd(cd, mv);
    _mm_storeu_ps(s, _mm256_cvtpd_ps(sd));
    _mm_storeu_ps(c, _mm256_cvtpd_ps(cd));
}

LMK_TARGET_AVX2 static void sincos_avx2(const double *theta, float *c, float *s, size_t n, double m)
{
    const __m256d mv = _mm256_set1_pd(m);
    const int scaled = m != 1.0;
    for (size_t i = 0; i < n; i += 4) {
        __m256i q;
        const __m256d r = reduce4(_mm256_loadu_pd(theta + i), &q);
        const __m256d z = _mm256_mul_pd(r, r);
        place4(sin_poly4(r, z), cos_poly4(z), q, scaled, mv, c + i, s + i);
    }
}
#endif

void lmk_cpu_sincos(lmk_cpu_isa isa, const double *theta, float *c, float *s, size_t n, double m)
{
#if LMK_CPU_X86
    if (isa == LMK_CPU_AVX512) {
        sincos_avx512(theta, c, s, n, m);
        return;
    }
    if (isa == LMK_CPU_AVX2) {
        sincos_avx2(theta, c, s, n, m);
        return;
    }
#endif
    (void)isa;
    for (size_t i = 0; i < n; i++) {
        double cv = cos(theta[i]), sv = sin(theta[i]);
        if (m != 1.0)
            cv *= m, sv *= m;
        c[i] = (float)cv;
        s[i] = (float)sv;
    }
}
