/*
 * bf16_simd.h - lmk_f32_to_bf16 in vector registers, for the CPU paths of lmk_rope
 * (src/ops/rope/cpu.c) and lmk_attn_prologue (src/ops/attn_prologue/cpu.c): one copy of the
 * rounding, so both ops narrow a value to the same bits at every level.
 *
 * The rule is lmk_f32_to_bf16's (src/core/dtype.c): round to nearest even by adding 0x7fff plus
 * the kept part's lowest bit to the f32 bits and keeping the high half, which is right for every
 * number (subnormals, overflow to infinity and infinities included); a NaN instead keeps its sign
 * and its payload's high bits with the quiet bit set ((u | 0x400000) >> 16), since the addition
 * could carry its payload into infinity or across the sign. tests/test_bf16_simd.c checks every
 * level against lmk_f32_to_bf16 on every tie and NaN payload.
 *
 * AVX2 narrows two vectors at a time where a caller has 16 results (lmk_cpu_bf16_8x2): the NaN
 * fix-up (a compare, an OR and a blend a vector) then runs only when a lane of either vector is
 * NaN, behind one compare and a test, and the 16 values leave in one 32-byte store: the narrowing
 * was the largest piece of the AVX2 bf16 rotation loops (docs/cpu.md, "bf16 narrowing and the
 * even/odd order").
 *
 * The even/odd order (the _eo functions) goes further: a block of 16 (AVX2) or 32 (AVX-512) bf16
 * values is one load whose 32-bit lanes each hold two elements, so the widening is a shift and a
 * mask and the narrowing puts each lane's odd result over its even one, with no shuffle either
 * way; the caller keeps whatever meets the values lane by lane (weights, cos/sin) in the same
 * order (lmk_cpu_eo16, lmk_cpu_eo32). docs/cpu.md, "bf16 narrowing and the even/odd order".
 */
#ifndef LMK_CPU_BF16_SIMD_H
#define LMK_CPU_BF16_SIMD_H

#include "cpu/cpu.h"

#if LMK_CPU_X86
/* Inlined into each caller when optimizing; at -O0 a function of its own, so that callers'
 * inlined copies do not each keep its temporaries in stack slots (lmk.h's stack bound). */
#ifdef __OPTIMIZE__
#define LMK_CPU_STEP LMK_INLINE
#else
#define LMK_CPU_STEP static inline
#endif

/* The rounded bits of 16 lanes before the final shift, NaN lanes fixed (a mask does it). */
LMK_CPU_STEP LMK_TARGET_AVX512 __m512i lmk_cpu_bf16_round16(__m512 v)
{
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
    return _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), u, _mm512_set1_epi32(0x400000));
}

/* 16 lanes to 16 bf16 values. */
LMK_CPU_STEP LMK_TARGET_AVX512 __m256i lmk_cpu_bf16_16(__m512 v)
{
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(lmk_cpu_bf16_round16(v), 16));
}

/* The even/odd order of the AVX2 functions below on 32 elements: one 64-byte load, *e elements
 * 0, 2, .., 30, *o elements 1, 3, .., 31; no vpmovzxwd and, on the way back, no vpmovdw (both
 * shuffles). */
LMK_CPU_STEP LMK_TARGET_AVX512 void lmk_cpu_bf16_widen_eo16(const void *p, __m512 *e, __m512 *o)
{
    const __m512i u = _mm512_loadu_si512(p);
    *e = _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
    *o = _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xffff0000u)));
}

/* 32 values in even/odd order to 32 bf16 values in element order, stored at p as one 64-byte
 * store (streaming when nt: p is then 64-byte aligned). */
LMK_CPU_STEP LMK_TARGET_AVX512 void lmk_cpu_store_bf16_eo16(unsigned char *p, __m512 e, __m512 o, int nt)
{
    const __m512i h = _mm512_or_si512(_mm512_and_si512(lmk_cpu_bf16_round16(o), _mm512_set1_epi32((int)0xffff0000u)),
                                      _mm512_srli_epi32(lmk_cpu_bf16_round16(e), 16));
    if (nt)
        _mm512_stream_si512((void *)p, h);
    else
        _mm512_storeu_si512((void *)p, h);
}

/* 32 floats at t from element order to even/odd order, in place. */
LMK_CPU_STEP LMK_TARGET_AVX512 void lmk_cpu_eo32(float *t)
{
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512 v0 = _mm512_loadu_ps(t), v1 = _mm512_loadu_ps(t + 16);
    _mm512_storeu_ps(t, _mm512_permutex2var_ps(v0, ie, v1));
    _mm512_storeu_ps(t + 16, _mm512_permutex2var_ps(v0, io, v1));
}

/* e and o (even/odd order) as 32 floats in element order at x. */
LMK_CPU_STEP LMK_TARGET_AVX512 void lmk_cpu_store_eo16_f32(float *x, __m512 e, __m512 o)
{
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    _mm512_storeu_ps(x, _mm512_permutex2var_ps(e, lo, o));
    _mm512_storeu_ps(x + 16, _mm512_permutex2var_ps(e, hi, o));
}

/* The rounded bits before the final shift, NaN not yet fixed. */
LMK_CPU_STEP LMK_TARGET_AVX2 __m256i lmk_cpu_bf16_round8(__m256i u)
{
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
}

/* r where v is a number, (u | quiet bit) where it is NaN. */
LMK_CPU_STEP LMK_TARGET_AVX2 __m256i lmk_cpu_bf16_fix_nan8(__m256 v, __m256i r)
{
    const __m256i u = _mm256_castps_si256(v);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
}

/* 8 lanes to 8 bf16 values. */
LMK_CPU_STEP LMK_TARGET_AVX2 __m128i lmk_cpu_bf16_8(__m256 v)
{
    const __m256i r = _mm256_srli_epi32(lmk_cpu_bf16_fix_nan8(v, lmk_cpu_bf16_round8(_mm256_castps_si256(v))), 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* The rounded bits of two vectors, NaN lanes fixed, before the final shift: the fix-up only runs
 * when a lane of either is NaN. */
LMK_CPU_STEP LMK_TARGET_AVX2 void lmk_cpu_bf16_round8x2(__m256 a, __m256 b, __m256i *ra, __m256i *rb)
{
    *ra = lmk_cpu_bf16_round8(_mm256_castps_si256(a)), *rb = lmk_cpu_bf16_round8(_mm256_castps_si256(b));
    const __m256 any = _mm256_cmp_ps(a, b, _CMP_UNORD_Q); /* a lane of a or of b is NaN */
    if (!_mm256_testz_ps(any, any)) {
        *ra = lmk_cpu_bf16_fix_nan8(a, *ra);
        *rb = lmk_cpu_bf16_fix_nan8(b, *rb);
    }
}

/* 16 lanes (a, then b) to 16 bf16 values in that order. The pack never saturates: every lane is
 * at most 0xffff after the shift. */
LMK_CPU_STEP LMK_TARGET_AVX2 __m256i lmk_cpu_bf16_8x2(__m256 a, __m256 b)
{
    __m256i ra, rb;
    lmk_cpu_bf16_round8x2(a, b, &ra, &rb);
    const __m256i w = _mm256_packus_epi32(_mm256_srli_epi32(ra, 16), _mm256_srli_epi32(rb, 16)); /* a0-3 b0-3 a4-7 b4-7 */
    return _mm256_permute4x64_epi64(w, 0xD8);
}

/* 16 bf16 values as one 32-byte store at p, streaming when nt (p then 32-byte aligned: both ops
 * stream only rows whose segments start on cache lines). */
LMK_CPU_STEP LMK_TARGET_AVX2 void lmk_cpu_store_bf16_16(unsigned char *p, __m256i h, int nt)
{
    if (nt)
        _mm256_stream_si256((__m256i *)(void *)p, h);
    else
        _mm256_storeu_si256((__m256i *)(void *)p, h);
}

/* lmk_cpu_bf16_8x2(a, b) stored at p. */
LMK_CPU_STEP LMK_TARGET_AVX2 void lmk_cpu_store_bf16_8x2(unsigned char *p, __m256 a, __m256 b, int nt)
{
    lmk_cpu_store_bf16_16(p, lmk_cpu_bf16_8x2(a, b), nt);
}
/* Even/odd order: 16 bf16 values at p as one 32-byte load whose 32-bit lanes each hold an element
 * pair, widened without a shuffle: *e gets elements 0, 2, .., 14 (the low halves shifted up),
 * *o elements 1, 3, .., 15 (the high halves, masked). Whatever the values meet lane by lane (norm
 * weights, cos/sin) must be in the same order (lmk_cpu_eo16); lmk_cpu_bf16_eo is the way back.
 * vpmovzxwd and the pack's lane permute issue at most one a cycle on common x86 cores, shifts and
 * packs two, plain integer ops three or four, so the loops avoid the first two. */
LMK_CPU_STEP LMK_TARGET_AVX2 void lmk_cpu_bf16_widen_eo(const void *p, __m256 *e, __m256 *o)
{
    const __m256i u = _mm256_loadu_si256((const __m256i *)p);
    *e = _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
    *o = _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xffff0000u)));
}

/* 16 values in even/odd order (e: elements 0, 2, .., 14; o: 1, 3, .., 15) to 16 bf16 values in
 * element order: each 32-bit lane is o's rounded high half over e's, so no pack and no permute. */
LMK_CPU_STEP LMK_TARGET_AVX2 __m256i lmk_cpu_bf16_eo(__m256 e, __m256 o)
{
    __m256i re, ro;
    lmk_cpu_bf16_round8x2(e, o, &re, &ro);
    return _mm256_or_si256(_mm256_and_si256(ro, _mm256_set1_epi32((int)0xffff0000u)), _mm256_srli_epi32(re, 16));
}

/* lmk_cpu_bf16_eo(e, o) stored at p. */
LMK_CPU_STEP LMK_TARGET_AVX2 void lmk_cpu_store_bf16_eo(unsigned char *p, __m256 e, __m256 o, int nt)
{
    lmk_cpu_store_bf16_16(p, lmk_cpu_bf16_eo(e, o), nt);
}

/* 16 floats at t from element order to even/odd order, in place. */
LMK_CPU_STEP LMK_TARGET_AVX2 void lmk_cpu_eo16(float *t)
{
    const __m256 v0 = _mm256_loadu_ps(t), v1 = _mm256_loadu_ps(t + 8);
    const __m256 e = _mm256_shuffle_ps(v0, v1, 0x88), o = _mm256_shuffle_ps(v0, v1, 0xDD); /* 0 2 8 10 | 4 6 12 14 */
    _mm256_storeu_ps(t, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xD8)));
    _mm256_storeu_ps(t + 8, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), 0xD8)));
}

/* e and o (even/odd order) as 16 floats in element order at x. */
LMK_CPU_STEP LMK_TARGET_AVX2 void lmk_cpu_store_eo_f32(float *x, __m256 e, __m256 o)
{
    const __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o); /* 0-3 8-11 | 4-7 12-15 */
    _mm256_storeu_ps(x, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(x + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}
#endif /* LMK_CPU_X86 */

#endif /* LMK_CPU_BF16_SIMD_H */
