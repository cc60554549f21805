/*
 * rope_math.h - the parts of rope's definition that every fast path shares: which position axis a
 * rotated pair reads, its exponent index, its angle factor, and how a position is read. lmk_rope's
 * and lmk_attn_prologue's CPU paths and CUDA kernels include this file (host and device code
 * alike), so these rules live in exactly one place, outside either op; the float64 reference
 * (src/ops/rope/ref.c) is written from lmk.h's formulas on its own, so that a mistake here cannot
 * hide in both.
 */
#ifndef LMK_ROPE_MATH_H
#define LMK_ROPE_MATH_H

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define LMK_HD __host__ __device__ __forceinline__
#else
#define LMK_HD static inline
#endif

/* The rule of which position axis (0 t, 1 h, 2 w, 3 e) a rotated pair reads, with its sums taken
 * once per configuration (lmk_rope_axes_of), so that a kernel asking for many pairs pays only
 * compares per pair (lmk_rope_axis_at). lmk_rope_axis_j is the two together. */
typedef struct lmk_rope_axes {
    uint64_t sect;   /* s0 + s1 + s2 + s3, or 1 when that is 0 */
    uint64_t lim[3]; /* IMROPE: 3 s0, 3 s1, 3 s2; MROPE and VISION: s0, s0 + s1, s0 + s1 + s2 */
    int mode;
} lmk_rope_axes;

/* Sums and 3*s are 64-bit, so huge sections never wrap: a section larger than the pairs simply
 * covers every pair. */
LMK_HD lmk_rope_axes lmk_rope_axes_of(int mode, const uint32_t sections[4])
{
    const uint64_t s0 = sections[0], s1 = sections[1], s2 = sections[2], s3 = sections[3];
    const uint64_t sect = s0 + s1 + s2 + s3;
    lmk_rope_axes ax;
    ax.mode = mode;
    ax.sect = sect == 0 ? 1 : sect;
    if (mode == 40) {
        ax.lim[0] = 3 * s0, ax.lim[1] = 3 * s1, ax.lim[2] = 3 * s2;
    } else {
        ax.lim[0] = s0, ax.lim[1] = s0 + s1, ax.lim[2] = s0 + s1 + s2;
    }
    return ax;
}

/* The position axis of rotated pair p, and through *j its exponent index (p, or for VISION its
 * index within its section). NORMAL (0) and NEOX (2) read axis t; validation rejects unknown modes
 * before this is reached. Every division is 32-bit: p % sect is taken only when p >= sect, and then
 * sect <= p < 2^32 (64-bit remainders are ~100-cycle subroutines on a GPU); the compares stay 64-bit,
 * so the result is that of the 64-bit rule for every p and all sections. The bounds are picked by
 * selects, not by an index: an indexed read of a kernel parameter struct puts it in local memory. */
LMK_HD int lmk_rope_axis_at(const lmk_rope_axes *ax, uint32_t p, uint32_t *j)
{
    *j = p;
    if (ax->mode == 0 || ax->mode == 2)
        return 0;
    const uint32_t sector = p < ax->sect ? p : p % (uint32_t)ax->sect;
    if (ax->mode == 40) { /* IMROPE: t h w t h w ... */
        const uint32_t r = sector % 3u;
        const uint64_t lim = r == 0 ? ax->lim[0] : r == 1 ? ax->lim[1] : ax->lim[2];
        return sector < lim ? (int)r : 3;
    }
    /* MROPE and VISION: contiguous sections; VISION restarts the exponent in each. */
    const int axis = sector < ax->lim[0] ? 0 : sector < ax->lim[1] ? 1 : sector < ax->lim[2] ? 2 : 3;
    if (ax->mode == 24) { /* start <= sector < 2^32 */
        const uint64_t start = axis == 0 ? 0 : axis == 1 ? ax->lim[0] : axis == 2 ? ax->lim[1] : ax->lim[2];
        *j = sector - (uint32_t)start;
    }
    return axis;
}

/* lmk_rope_axis_at for one pair of a mode and its sections (the CPU paths and the prologue). */
LMK_HD int lmk_rope_axis_j(int mode, const uint32_t sections[4], uint32_t p, uint32_t *j)
{
    const lmk_rope_axes ax = lmk_rope_axes_of(mode, sections);
    return lmk_rope_axis_at(&ax, p, j);
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

#endif /* LMK_ROPE_MATH_H */
