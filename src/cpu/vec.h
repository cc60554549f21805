/*
 * vec.h - the CPU vector layer of lmk_rope and lmk_attn_prologue: one set of small steps at each
 * vector width, AVX2 (8 f32 lanes: lmk_v8_*) and AVX-512 (16 lanes: lmk_v16_*), each compiled under
 * its level's target attribute. The steps have the same names, arguments and per-lane results at
 * both widths, so an op writes each of its loops once over a width (through cpu/vec_width.h, which
 * binds V(step) to one width's step) and instantiates it per level; only what an instruction set
 * does differently lives here, twice:
 *  - widening a row's f32, bf16 or f16 elements to f32 lanes (load), and narrowing f32 lanes back
 *    to f32, bf16 (cpu/bf16_simd.h's rounding, that of lmk_f32_to_bf16), f16 (F16C, nearest even)
 *    or f8 E4M3 (lmk_f8e4m3_from_f32_bits of core/f8.h, lane by lane), one vector (store) or two
 *    (store2: AVX2 narrows two bf16 vectors at a time, docs/cpu.md "bf16 narrowing and the
 *    even/odd order");
 *  - the even/odd order of bf16 blocks (cpu/bf16_simd.h's _eo functions under one name a width);
 *  - rope's rotation of a vector of pairs, split (a's against b's), adjacent in element order,
 *    or adjacent held as even and odd lanes: the same fused operations in the same order at both
 *    widths, so a lane's bits do not depend on the width;
 *  - horizontal sums, whose order of additions is the level's own (it fixes the bits of a sum of
 *    squares at that level; levels may differ in the last bit, lmk.h).
 * Plus one element at a time, for the portable paths and the vector loops' tails (lmk_cpu_bf16_of,
 * the rounding of lmk_f32_to_bf16 inline, in both ops; lmk_cpu_load_f32 and lmk_cpu_store_f32 in
 * rope's). Every vector step is inlined when optimizing and a function of its own at -O0
 * (LMK_CPU_STEP), so that a caller's frame does not hold every inlined step's vector temporaries
 * there (lmk.h's stack bound, tests/test_small_stack.c).
 */
#ifndef LMK_CPU_VEC_H
#define LMK_CPU_VEC_H

#include "cpu/bf16_simd.h"
#include "cpu/cpu.h"

/* ---- one element: the portable paths and the vector loops' tails ---- */

/* Element i of a row of dtype dt (f32, bf16 or f16) at p, widened exactly. */
LMK_INLINE float lmk_cpu_load_f32(lmk_dtype dt, const void *p, size_t i)
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

/* lmk_f32_to_bf16, inline (a call per element otherwise): nearest even, NaN kept quiet with its
 * sign. */
LMK_INLINE uint16_t lmk_cpu_bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* f stored as element i of a row of dtype dt (f32, bf16 or f16) at p, rounded as lmk_f32_to_bf16
 * and lmk_f32_to_f16 round. */
LMK_INLINE void lmk_cpu_store_f32(lmk_dtype dt, void *p, size_t i, float f)
{
    if (dt == LMK_F32) {
        memcpy((unsigned char *)p + 4 * i, &f, 4);
        return;
    }
    const uint16_t h = dt == LMK_F16 ? lmk_f32_to_f16(f) : lmk_cpu_bf16_of(f);
    memcpy((unsigned char *)p + 2 * i, &h, 2);
}

#if LMK_CPU_X86

/* ---- AVX-512: 16 lanes ---- */

#define lmk_v16_zero _mm512_setzero_ps
#define lmk_v16_set1 _mm512_set1_ps
#define lmk_v16_loadu _mm512_loadu_ps
#define lmk_v16_storeu _mm512_storeu_ps
#define lmk_v16_mul _mm512_mul_ps
#define lmk_v16_fmadd _mm512_fmadd_ps
#define lmk_v16_zero_d _mm512_setzero_pd
#define lmk_v16_fmadd_d _mm512_fmadd_pd
/* The even/odd order of 32 bf16 values (cpu/bf16_simd.h). */
#define lmk_v16_bf16_widen_eo lmk_cpu_bf16_widen_eo16
#define lmk_v16_store_bf16_eo lmk_cpu_store_bf16_eo16
#define lmk_v16_eo lmk_cpu_eo32
#define lmk_v16_store_eo_f32 lmk_cpu_store_eo16_f32

/* 16 elements of dtype dt (f32, bf16 or f16) at p, widened exactly. */
LMK_CPU_STEP LMK_TARGET_AVX512 __m512 lmk_v16_load(lmk_dtype dt, const unsigned char *p)
{
    if (dt == LMK_F32)
        return _mm512_loadu_ps(p);
    const __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)p);
    if (dt == LMK_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* The f8 E4M3 codes of 16 lanes, lane by lane lmk_f8e4m3_from_f32_bits (core/f8.h): normal values
 * by the same integer rounding on the bits ((r >> 20) - 960 is ((r >> 23) - 120) << 3 | (r >> 20)
 * & 7, and the min saturates everything from 464 up, infinity included); below 2^-6,
 * round-to-nearest-even of |x| * 2^9, exact since 2^9 is a power of two, which is the scalar
 * rounding of m >> shift (0 for f32 subnormals); NaN 0x7F. The sign is put back last. Three steps,
 * functions of their own at -O0: the code of |x| (bits u) as a normal value, saturated; */
LMK_CPU_STEP LMK_TARGET_AVX512 __m512i lmk_v16_f8_normal(__m512i u)
{
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 20), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7ffff)), lsb);
    return _mm512_min_epu32(_mm512_sub_epi32(_mm512_srli_epi32(r, 20), _mm512_set1_epi32(960)), _mm512_set1_epi32(0x7e));
}

/* then code with the lanes below 2^-6 (subnormal codes) and the NaN lanes replaced; */
LMK_CPU_STEP LMK_TARGET_AVX512 __m512i lmk_v16_f8_special(__m512i u, __m512i code)
{
    const __m512 tiny = _mm512_mul_ps(_mm512_castsi512_ps(u), _mm512_set1_ps(512.0f));
    const __m512i sub = _mm512_cvt_roundps_epi32(tiny, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    code = _mm512_mask_mov_epi32(code, _mm512_cmplt_epu32_mask(u, _mm512_set1_epi32(0x3c800000)), sub);
    return _mm512_mask_mov_epi32(code, _mm512_cmpgt_epu32_mask(u, _mm512_set1_epi32(0x7f800000)),
                                 _mm512_set1_epi32(0x7f));
}

/* then the signed codes, one byte each. */
LMK_CPU_STEP LMK_TARGET_AVX512 __m128i lmk_v16_f8(__m512 v)
{
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i u = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80));
    return _mm512_cvtepi32_epi8(_mm512_or_si512(lmk_v16_f8_special(u, lmk_v16_f8_normal(u)), sign));
}

/* 16 lanes narrowed to dtype dt at p (f8: the lanes already times the inverse scale), streaming
 * when nt (p is then aligned to the store's size). */
LMK_CPU_STEP LMK_TARGET_AVX512 void lmk_v16_store(lmk_dtype dt, int nt, unsigned char *p, __m512 v)
{
    if (dt == LMK_F32) {
        if (nt)
            _mm512_stream_ps((float *)(void *)p, v);
        else
            _mm512_storeu_ps(p, v);
    } else if (dt == LMK_F8E4M3) {
        const __m128i b = lmk_v16_f8(v);
        if (nt)
            _mm_stream_si128((__m128i *)(void *)p, b);
        else
            _mm_storeu_si128((__m128i *)(void *)p, b);
    } else {
        const __m256i h = dt == LMK_BF16 ? lmk_cpu_bf16_16(v) : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        if (nt)
            _mm256_stream_si256((__m256i *)(void *)p, h);
        else
            _mm256_storeu_si256((__m256i *)(void *)p, h);
    }
}

/* 32 lanes (a, then b) narrowed to dt at p: two stores (a mask makes the bf16 NaN fix-up free). */
LMK_CPU_STEP LMK_TARGET_AVX512 void lmk_v16_store2(lmk_dtype dt, int nt, unsigned char *p, __m512 a, __m512 b)
{
    lmk_v16_store(dt, nt, p, a);
    lmk_v16_store(dt, nt, p + 16 * (dt == LMK_F32 ? 4 : dt == LMK_F8E4M3 ? 1 : 2), b);
}

/* Split pairs: *ya = a*c - b*s and *yb = a*s + b*c from 16 pairs' a's and b's and cos/sin at c
 * and s (each product of b rounded, then fused). */
LMK_CPU_STEP LMK_TARGET_AVX512 void lmk_v16_rotate(__m512 a, __m512 b, const float *c, const float *s, __m512 *ya,
                                                   __m512 *yb)
{
    const __m512 cv = _mm512_loadu_ps(c), sv = _mm512_loadu_ps(s);
    *ya = _mm512_fmsub_ps(a, cv, _mm512_mul_ps(b, sv));
    *yb = _mm512_fmadd_ps(a, sv, _mm512_mul_ps(b, cv));
}

/* Adjacent pairs held as even (a) and odd (b) elements: a*c - b*s, and b*c + a*s with the product
 * of a rounded, as lmk_v16_rotate_adjacent's odd lanes. */
LMK_CPU_STEP LMK_TARGET_AVX512 void lmk_v16_rotate_eo(__m512 a, __m512 b, const float *c, const float *s, __m512 *ya,
                                                      __m512 *yb)
{
    const __m512 cv = _mm512_loadu_ps(c), sv = _mm512_loadu_ps(s);
    *ya = _mm512_fmsub_ps(a, cv, _mm512_mul_ps(b, sv));
    *yb = _mm512_fmadd_ps(b, cv, _mm512_mul_ps(a, sv));
}

/* 8 adjacent pairs in element order (x: 16 elements, cos/sin of the pairs at c and s): x * (c, c)
 * + swap(x) * (-s, s) per pair, cos/sin duplicated into lane pairs; the even lanes are exactly
 * lmk_v16_rotate's a*c - b*s. */
LMK_CPU_STEP LMK_TARGET_AVX512 __m512 lmk_v16_rotate_adjacent(__m512 x, const float *c, const float *s)
{
    const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i neg_even = _mm512_set1_epi64(0x80000000); /* sign bit of lanes 0, 2, 4, ... */
    const __m512 cv = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(c)));
    const __m512 sv = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(s)));
    const __m512 sa = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(sv), neg_even));
    return _mm512_fmadd_ps(x, cv, _mm512_mul_ps(_mm512_permute_ps(x, 0xB1), sa));
}

/* The lanes of s0 + s1 summed (the intrinsic's order of additions). */
LMK_CPU_STEP LMK_TARGET_AVX512 float lmk_v16_hsum2(__m512 s0, __m512 s1)
{
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

/* Lanes 0-7 and 8-15 of v widened to double. */
LMK_CPU_STEP LMK_TARGET_AVX512 __m512d lmk_v16_widen_lo_d(__m512 v)
{
    return _mm512_cvtps_pd(_mm512_castps512_ps256(v));
}

LMK_CPU_STEP LMK_TARGET_AVX512 __m512d lmk_v16_widen_hi_d(__m512 v)
{
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

LMK_CPU_STEP LMK_TARGET_AVX512 double lmk_v16_hsum2_d(__m512d s0, __m512d s1)
{
    return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

/* ---- AVX2: 8 lanes ---- */

#define lmk_v8_zero _mm256_setzero_ps
#define lmk_v8_set1 _mm256_set1_ps
#define lmk_v8_loadu _mm256_loadu_ps
#define lmk_v8_storeu _mm256_storeu_ps
#define lmk_v8_mul _mm256_mul_ps
#define lmk_v8_fmadd _mm256_fmadd_ps
#define lmk_v8_zero_d _mm256_setzero_pd
#define lmk_v8_fmadd_d _mm256_fmadd_pd
/* The even/odd order of 16 bf16 values (cpu/bf16_simd.h). */
#define lmk_v8_bf16_widen_eo lmk_cpu_bf16_widen_eo
#define lmk_v8_store_bf16_eo lmk_cpu_store_bf16_eo
#define lmk_v8_eo lmk_cpu_eo16
#define lmk_v8_store_eo_f32 lmk_cpu_store_eo_f32

LMK_CPU_STEP LMK_TARGET_AVX2 __m256 lmk_v8_load(lmk_dtype dt, const unsigned char *p)
{
    if (dt == LMK_F32)
        return _mm256_loadu_ps((const float *)(const void *)p);
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    if (dt == LMK_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* lmk_v16_f8's steps on 8 lanes: the code in the low byte of each 32-bit lane. */
LMK_CPU_STEP LMK_TARGET_AVX2 __m256i lmk_v8_f8(__m256 v)
{
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i u = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 20), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7ffff)), lsb);
    __m256i code = _mm256_min_epu32(_mm256_sub_epi32(_mm256_srli_epi32(r, 20), _mm256_set1_epi32(960)),
                                    _mm256_set1_epi32(0x7e));
    const __m256 tiny = _mm256_mul_ps(_mm256_castsi256_ps(u), _mm256_set1_ps(512.0f));
    const __m256i sub = _mm256_cvttps_epi32(_mm256_round_ps(tiny, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    /* u < 2^31: the signed compares are the unsigned ones */
    code = _mm256_blendv_epi8(code, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3c800000), u));
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7f), _mm256_cmpgt_epi32(u, _mm256_set1_epi32(0x7f800000)));
    return _mm256_or_si256(code, sign);
}

/* 16 f8 codes from two vectors of 8, in element order (codes <= 0xFF: the packs never saturate). */
LMK_CPU_STEP LMK_TARGET_AVX2 __m128i lmk_v8_f8x2(__m256 a, __m256 b)
{
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(lmk_v8_f8(a), lmk_v8_f8(b)), 0xD8); /* a0-7 | b0-7 */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi16(w, w), 0x08));
}

/* 8 lanes narrowed to dt at p, as lmk_v16_store (f8: 8 bytes). */
LMK_CPU_STEP LMK_TARGET_AVX2 void lmk_v8_store(lmk_dtype dt, int nt, unsigned char *p, __m256 v)
{
    if (dt == LMK_F32) {
        if (nt)
            _mm256_stream_ps((float *)(void *)p, v);
        else
            _mm256_storeu_ps((float *)(void *)p, v);
    } else if (dt == LMK_F8E4M3) {
        const __m256i c = lmk_v8_f8(v);
        const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
        const __m128i b = _mm_packus_epi16(w, w); /* codes 0-7 in the low 8 bytes */
        if (nt)
            _mm_stream_si64((long long *)(void *)p, _mm_cvtsi128_si64(b));
        else
            _mm_storel_epi64((__m128i *)(void *)p, b);
    } else {
        const __m128i h = dt == LMK_BF16 ? lmk_cpu_bf16_8(v) : _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        if (nt)
            _mm_stream_si128((__m128i *)(void *)p, h);
        else
            _mm_storeu_si128((__m128i *)(void *)p, h);
    }
}

/* 16 lanes (a, then b) narrowed to dt at p: bf16 and f8 as one 16- or 32-byte store (bf16 with
 * one NaN test for both vectors, lmk_cpu_bf16_8x2), f32 and f16 as two. */
LMK_CPU_STEP LMK_TARGET_AVX2 void lmk_v8_store2(lmk_dtype dt, int nt, unsigned char *p, __m256 a, __m256 b)
{
    if (dt == LMK_BF16) {
        lmk_cpu_store_bf16_8x2(p, a, b, nt);
    } else if (dt == LMK_F8E4M3) {
        const __m128i c = lmk_v8_f8x2(a, b);
        if (nt)
            _mm_stream_si128((__m128i *)(void *)p, c);
        else
            _mm_storeu_si128((__m128i *)(void *)p, c);
    } else {
        lmk_v8_store(dt, nt, p, a);
        lmk_v8_store(dt, nt, p + 8 * (dt == LMK_F32 ? 4 : 2), b);
    }
}

/* lmk_v16_rotate on 8 pairs. */
LMK_CPU_STEP LMK_TARGET_AVX2 void lmk_v8_rotate(__m256 a, __m256 b, const float *c, const float *s, __m256 *ya,
                                                __m256 *yb)
{
    const __m256 cv = _mm256_loadu_ps(c), sv = _mm256_loadu_ps(s);
    *ya = _mm256_fmsub_ps(a, cv, _mm256_mul_ps(b, sv));
    *yb = _mm256_fmadd_ps(a, sv, _mm256_mul_ps(b, cv));
}

/* lmk_v16_rotate_eo on 8 pairs. */
LMK_CPU_STEP LMK_TARGET_AVX2 void lmk_v8_rotate_eo(__m256 a, __m256 b, const float *c, const float *s, __m256 *ya,
                                                   __m256 *yb)
{
    const __m256 cv = _mm256_loadu_ps(c), sv = _mm256_loadu_ps(s);
    *ya = _mm256_fmsub_ps(a, cv, _mm256_mul_ps(b, sv));
    *yb = _mm256_fmadd_ps(b, cv, _mm256_mul_ps(a, sv));
}

/* lmk_v16_rotate_adjacent on 4 pairs (8 elements). */
LMK_CPU_STEP LMK_TARGET_AVX2 __m256 lmk_v8_rotate_adjacent(__m256 x, const float *c, const float *s)
{
    const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    const __m256 neg_even = _mm256_castsi256_ps(_mm256_set1_epi64x(0x80000000));
    const __m256 cv = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(c)), dup);
    const __m256 sv = _mm256_xor_ps(_mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(s)), dup), neg_even);
    return _mm256_fmadd_ps(x, cv, _mm256_mul_ps(_mm256_permute_ps(x, 0xB1), sv));
}

/* The lanes of s0 + s1 summed: halves, then pairs, then the last two. */
LMK_CPU_STEP LMK_TARGET_AVX2 float lmk_v8_hsum2(__m256 s0, __m256 s1)
{
    const __m256 s = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

LMK_CPU_STEP LMK_TARGET_AVX2 __m256d lmk_v8_widen_lo_d(__m256 v)
{
    return _mm256_cvtps_pd(_mm256_castps256_ps128(v));
}

LMK_CPU_STEP LMK_TARGET_AVX2 __m256d lmk_v8_widen_hi_d(__m256 v)
{
    return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
}

LMK_CPU_STEP LMK_TARGET_AVX2 double lmk_v8_hsum2_d(__m256d s0, __m256d s1)
{
    const __m256d s = _mm256_add_pd(s0, s1);
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

#endif /* LMK_CPU_X86 */

#endif /* LMK_CPU_VEC_H */
