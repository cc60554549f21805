/*
 * rope_common.h - the parts of rope's definition that every fast path shares: which position axis
 * a rotated pair reads, its exponent index, its angle factor, and how a position is read. The CPU
 * path and the CUDA kernels include this file (host and device code alike), so these rules live in
 * exactly one place; the float64 reference (ref.c) is written from lmk.h's formulas on its own, so
 * that a mistake here cannot hide in both.
 */
#ifndef LMK_ROPE_COMMON_H
#define LMK_ROPE_COMMON_H

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define LMK_HD __host__ __device__ __forceinline__
#else
#define LMK_HD static inline
#endif

/* The position axis (0 t, 1 h, 2 w, 3 e) of rotated pair p, and through *j its exponent index (p,
 * or for VISION its index within its section). Sums and 3*s are 64-bit, so huge sections never
 * wrap: a section larger than the pairs simply covers every pair. NORMAL (0) and NEOX (2) read
 * axis t; validation rejects unknown modes before this is reached. */
LMK_HD int lmk_rope_axis_j(int mode, const uint32_t sections[4], uint32_t p, uint32_t *j)
{
    *j = p;
    if (mode == 0 || mode == 2)
        return 0;
    const uint64_t s0 = sections[0], s1 = sections[1], s2 = sections[2], s3 = sections[3];
    uint64_t sect = s0 + s1 + s2 + s3;
    if (sect == 0)
        sect = 1;
    const uint64_t sector = (uint64_t)p % sect;
    if (mode == 40) { /* IMROPE: t h w t h w ... */
        const uint64_t r = sector % 3;
        if (r == 0 && sector < 3 * s0) return 0;
        if (r == 1 && sector < 3 * s1) return 1;
        if (r == 2 && sector < 3 * s2) return 2;
        return 3;
    }
    /* MROPE and VISION: contiguous sections; VISION restarts the exponent in each. */
    int axis;
    uint64_t start;
    if (sector < s0) axis = 0, start = 0;
    else if (sector < s0 + s1) axis = 1, start = s0;
    else if (sector < s0 + s1 + s2) axis = 2, start = s0 + s1;
    else axis = 3, start = s0 + s1 + s2;
    if (mode == 24)
        *j = (uint32_t)(sector - start);
    return axis;
}

/* The angle factor of pair p with exponent index j: theta = pos * freq. ff is freq_factors[p] (1
 * without). Float64, the order of operations of lmk.h's formula. */
LMK_HD double lmk_rope_freq(double freq_base, double exp_n, double freq_scale, double ext_factor,
                            double ramp_low, double ramp_high, uint32_t p, uint32_t j, double ff)
{
    const double e = pow(freq_base, -2.0 * (double)j / exp_n) / ff;
    if (ext_factor == 0.0)
        return e * freq_scale;
    const double span = ramp_high - ramp_low > 0.001 ? ramp_high - ramp_low : 0.001;
    double y = ((double)p - ramp_low) / span;
    y = y < 0.0 ? 0.0 : y > 1.0 ? 1.0 : y;
    const double ramp = (1.0 - y) * ext_factor;
    return e * freq_scale * (1.0 - ramp) + e * ramp;
}

/* Position i of a positions array of dtype code pos_dtype (LMK_I64 = 7 reads 64 bits; i32 and u32
 * read 32 bits as i32). */
LMK_HD double lmk_rope_pos(const void *positions, int pos_dtype, uint64_t i)
{
    return pos_dtype == 7 ? (double)((const int64_t *)positions)[i] : (double)((const int32_t *)positions)[i];
}

#endif /* LMK_ROPE_COMMON_H */
