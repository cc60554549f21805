/*
 * f8.h - the f32 -> FP8 E4M3FN rounding of lmk.h (nearest-even, saturating to +-448, NaN -> 0x7F
 * with the sign kept), on the f32 bits, for host and device code alike: lmk_f32_to_f8e4m3 and the
 * CUDA cache writes use this one function, so CPU and GPU store the same codes.
 */
#ifndef LMK_F8_H
#define LMK_F8_H

#include <stdint.h>

#if defined(__CUDACC__)
#define LMK_F8_HD __host__ __device__ __forceinline__
#else
#define LMK_F8_HD static inline
#endif

/* Integer rounding on the f32 bits (never through the caller's rounding mode). Normal E4M3 values
 * keep 3 of the 23 mantissa bits: add half an f8 ulp minus one, plus the kept lsb (ties to even),
 * and let a carry run into the exponent. Below 2^-6 the f8 spacing is 2^-9: round |x| * 2^9 to an
 * integer from the full significand. Everything that rounds past 448 saturates. */
LMK_F8_HD uint8_t lmk_f8e4m3_from_f32_bits(uint32_t bits)
{
    const uint32_t u = bits & 0x7fffffffu;
    const uint8_t sign = (uint8_t)((bits >> 24) & 0x80u);
    if (u > 0x7f800000u)
        return (uint8_t)(sign | 0x7fu);
    if (u >= 0x43e80000u) /* >= 464: rounds past 448 (infinity included) */
        return (uint8_t)(sign | 0x7eu);
    const uint32_t e = u >> 23;
    if (e >= 121) { /* |x| >= 2^-6: normal in E4M3 */
        const uint32_t r = u + 0x7ffffu + ((u >> 20) & 1u);
        const uint32_t code = (((r >> 23) - 120u) << 3) | ((r >> 20) & 7u);
        return (uint8_t)(sign | (code > 0x7eu ? 0x7eu : code));
    }
    if (e == 0) /* f32 subnormals are far below half the smallest E4M3 step */
        return sign;
    const uint32_t m = (u & 0x7fffffu) | 0x800000u, shift = 141u - e; /* |x| * 2^9 = m * 2^-shift */
    if (shift > 25)
        return sign;
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return (uint8_t)(sign | q);
}

#endif /* LMK_F8_H */
